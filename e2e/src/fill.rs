//! A Kubernetes-shaped fill for benchmarks and tests: what a hosted
//! cluster's etcd holds, written through its API (not bytes put into etcd):
//! per "app", a ConfigMap of configuration text, a TLS Secret and a
//! service-account token Secret (random key material, base64 as the API
//! stores it), a Pod with its spec, status and managed fields, three Events,
//! and a Lease renewed twice (its history stays in etcd until compaction,
//! as a real cluster's renewals do).
//!
//! Sandbox difference: the emulated API server stores objects as JSON; a
//! real kube-apiserver stores built-in types as protobuf, which is smaller
//! and compresses somewhat less. The secrets' key material is random either
//! way and does not compress at all.

use base64::Engine as _;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::sandbox::SandboxError;

/// The renewTime of each app's Lease after its two renewals.
const LEASE_RENEWALS: [&str; 2] = ["2026-11-29T10:00:20.000000Z", "2026-11-29T10:00:30.000000Z"];

/// What a fill wrote.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filled {
    pub apps: usize,
    pub objects: usize,
    /// JSON bytes sent (creates and updates).
    pub bytes: u64,
}

/// A deterministic generator of random-looking bytes (xorshift64*), so two
/// runs fill the same.
struct Noise(u64);

impl Noise {
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect()
    }
    fn hex(&mut self, n: usize) -> String {
        self.bytes(n).iter().map(|b| format!("{b:02x}")).collect::<String>()[..n].to_string()
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A PEM block of `der` bytes of key material.
fn pem(label: &str, der: &[u8]) -> String {
    let body = b64(der);
    let lines: Vec<&str> = body.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap_or_default()).collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

fn managed_fields(manager: &str, fields: Value) -> Value {
    json!([{"manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-11-29T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields}])
}

/// The objects of app `i` in `ns` (the Lease last: it is then renewed).
fn app(ns: &str, i: usize, noise: &mut Noise) -> Vec<(ApiResource, Value)> {
    let name = format!("app-{i:05}");
    let labels = json!({"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop", "app.kubernetes.io/version": format!("1.{}.{}", i % 7, i % 31), "pod-template-hash": noise.hex(10)});
    let config: String = (0..24)
        .map(|k| format!("  setting_{k}: {}\n  endpoint_{k}: https://svc-{}.{ns}.svc.cluster.local:{}/v1/{k}\n", (i * 31 + k) % 997, (i + k) % 50, 8000 + k))
        .collect();
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{name}-config"), "namespace": ns, "labels": labels,
            "managedFields": managed_fields("kubectl-client-side-apply", json!({"f:data": {".": {}, "f:application.yaml": {}}}))},
        "data": {"application.yaml": format!("server:\n  port: 8080\n  name: {name}\nfeatures:\n{config}"), "log-level": "info"}});
    let tls = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": format!("{name}-tls"), "namespace": ns, "labels": labels,
            "annotations": {"service.beta.openshift.io/originating-service-name": name, "service.alpha.openshift.io/expiry": "2028-11-29T10:00:00Z"}},
        "data": {"tls.crt": b64(pem("CERTIFICATE", &noise.bytes(900)).as_bytes()), "tls.key": b64(pem("RSA PRIVATE KEY", &noise.bytes(1190)).as_bytes())}});
    let jwt = format!(
        "{}.{}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","kid":"k"}"#),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(r#"{{"iss":"https://kubernetes.default.svc","sub":"system:serviceaccount:{ns}:{name}","aud":["https://kubernetes.default.svc"],"exp":1796000000}}"#)),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(noise.bytes(256))
    );
    let token = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": format!("{name}-token"), "namespace": ns, "annotations": {"kubernetes.io/service-account.name": name}},
        "data": {"token": b64(jwt.as_bytes()), "namespace": b64(ns.as_bytes()), "ca.crt": b64(pem("CERTIFICATE", &noise.bytes(800)).as_bytes())}});
    let pod_name = format!("{name}-{}-{}", noise.hex(10), noise.hex(5));
    let env: Vec<Value> = (0..12).map(|k| json!({"name": format!("APP_SETTING_{k}"), "value": format!("value-{}", (i + k) % 13)})).collect();
    let conditions: Vec<Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|c| json!({"type": c, "status": "True", "lastTransitionTime": "2026-11-29T10:00:09Z"}))
        .collect();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels, "generateName": format!("{name}-"),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"), "uid": format!("{}-{}-{}", noise.hex(8), noise.hex(4), noise.hex(12)), "controller": true, "blockOwnerDeletion": true}],
            "managedFields": managed_fields("kube-controller-manager", json!({"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app.kubernetes.io/name": {}}, "f:ownerReferences": {}}, "f:spec": {"f:containers": {}}}))},
        "spec": {"containers": [{"name": "app", "image": format!("quay.io/shop/{name}@sha256:{}", noise.hex(64)),
                "ports": [{"containerPort": 8080, "protocol": "TCP"}], "env": env,
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}, {"name": "tls", "mountPath": "/etc/tls", "readOnly": true}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                "livenessProbe": {"httpGet": {"path": "/livez", "port": 8080}, "periodSeconds": 20},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
            "volumes": [{"name": "config", "configMap": {"name": format!("{name}-config")}}, {"name": "tls", "secret": {"secretName": format!("{name}-tls")}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst", "serviceAccountName": name,
            "nodeName": format!("demo-workers-{}", i % 2), "schedulerName": "default-scheduler", "priority": 0,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": "Running", "hostIP": format!("10.0.{}.{}", i % 2, 10), "podIP": format!("10.128.{}.{}", (i / 250) % 250, i % 250),
            "startTime": "2026-11-29T10:00:05Z", "qosClass": "Burstable",
            "conditions": conditions,
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "started": true, "image": format!("quay.io/shop/{name}"), "imageID": format!("quay.io/shop/{name}@sha256:{}", noise.hex(64)), "containerID": format!("cri-o://{}", noise.hex(64)), "state": {"running": {"startedAt": "2026-11-29T10:00:08Z"}}}]}});
    let events: Vec<Value> = [("Scheduled", "default-scheduler", format!("Successfully assigned {ns}/{pod_name} to demo-workers-{}", i % 2)),
        ("Pulled", "kubelet", format!("Container image \"quay.io/shop/{name}\" already present on machine")),
        ("Started", "kubelet", "Started container app".to_string())]
        .into_iter()
        .map(|(reason, component, message)| json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{pod_name}.{}", noise.hex(16)), "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod_name, "apiVersion": "v1", "fieldPath": "spec.containers{app}"},
            "reason": reason, "message": message, "source": {"component": component}, "type": "Normal", "count": 1,
            "firstTimestamp": "2026-11-29T10:00:06Z", "lastTimestamp": "2026-11-29T10:00:06Z", "reportingComponent": component}))
        .collect();
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"holderIdentity": format!("{pod_name}_{}", noise.hex(36)), "leaseDurationSeconds": 15, "acquireTime": "2026-11-29T10:00:10.000000Z", "renewTime": "2026-11-29T10:00:10.000000Z", "leaseTransitions": 0}});
    let core = |kind: &str, plural: &str| ApiResource { group: String::new(), version: "v1".into(), api_version: "v1".into(), kind: kind.into(), plural: plural.into() };
    let mut out = vec![(core("ConfigMap", "configmaps"), configmap), (core("Secret", "secrets"), tls), (core("Secret", "secrets"), token), (core("Pod", "pods"), pod)];
    out.extend(events.into_iter().map(|e| (core("Event", "events"), e)));
    out.push((
        ApiResource { group: "coordination.k8s.io".into(), version: "v1".into(), api_version: "coordination.k8s.io/v1".into(), kind: "Lease".into(), plural: "leases".into() },
        lease,
    ));
    out
}

/// Write apps into namespace `ns` of the hosted cluster until about
/// `target_bytes` of JSON have been sent, `concurrency` apps at a time.
pub async fn kubernetes_objects(hosted: &kube::Client, ns: &str, target_bytes: u64, concurrency: usize) -> Result<Filled, SandboxError> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(hosted.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).map_err(|e| SandboxError::Check(e.to_string()))?;
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(SandboxError::Check(format!("creating namespace {ns}: {e}"))),
    }
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let mut total = Filled::default();
    let mut batch = Vec::new();
    let mut i = 0;
    while total.bytes < target_bytes {
        batch.push(app(ns, i, &mut noise));
        i += 1;
        if batch.len() < concurrency * 4 && total.bytes + (batch.len() as u64) * 16_000 < target_bytes {
            continue;
        }
        let written: Vec<Result<(usize, u64), SandboxError>> = futures::stream::iter(batch.drain(..))
            .map(|objects| write_app(hosted.clone(), ns.to_string(), objects))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        for w in written {
            let (objects, bytes) = w?;
            total.apps += 1;
            total.objects += objects;
            total.bytes += bytes;
        }
    }
    Ok(total)
}

async fn write_app(hosted: kube::Client, ns: String, objects: Vec<(ApiResource, Value)>) -> Result<(usize, u64), SandboxError> {
    let mut bytes = 0u64;
    let mut count = 0;
    for (resource, object) in objects {
        let api: Api<DynamicObject> = Api::namespaced_with(hosted.clone(), &ns, &resource);
        let body: DynamicObject = serde_json::from_value(object.clone()).map_err(|e| SandboxError::Check(e.to_string()))?;
        bytes += serde_json::to_vec(&object).map(|v| v.len() as u64).unwrap_or_default();
        let created = api
            .create(&PostParams::default(), &body)
            .await
            .map_err(|e| SandboxError::Check(format!("creating {} {}: {e}", resource.kind, object["metadata"]["name"])))?;
        count += 1;
        if resource.kind == "Lease" {
            // renewed twice: two more revisions in etcd's history
            let mut lease = created;
            for renewal in LEASE_RENEWALS {
                lease.data["spec"]["renewTime"] = json!(renewal);
                bytes += serde_json::to_vec(&lease.data).map(|v| v.len() as u64).unwrap_or_default();
                let name = lease.metadata.name.clone().unwrap_or_default();
                lease = api
                    .replace(&name, &PostParams::default(), &lease)
                    .await
                    .map_err(|e| SandboxError::Check(format!("renewing Lease {name}: {e}")))?;
            }
        }
    }
    Ok((count, bytes))
}

/// The etcd key the hosted API server stores `object` (of `resource`) under.
fn etcd_key(resource: &ApiResource, object: &Value) -> String {
    let plural = if resource.group.is_empty() { resource.plural.clone() } else { format!("{}.{}", resource.group, resource.plural) };
    format!(
        "/kubernetes.io/{plural}/{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// The same apps, written straight into etcd as the hosted API server
/// stores them (JSON under `/kubernetes.io/RESOURCE/NS/NAME`, with a uid,
/// a creation time and the Lease's two renewals as further revisions),
/// until the member's database reaches `target_db_bytes`: the only way to
/// reach etcd's quota (8 GiB) in minutes rather than hours, for the scale
/// benchmarks. `in_flight` transactions of 32 puts at a time; `first_app`
/// numbers the apps, so a fill can be continued. Returns the fill and the
/// database size reached.
pub async fn kubernetes_objects_in_etcd(
    etcd: &etcd_client::Client,
    ns: &str,
    first_app: usize,
    target_db_bytes: u64,
    in_flight: usize,
) -> Result<(Filled, u64), SandboxError> {
    use etcd_client::{Txn, TxnOp};
    let fail = |what: &str, e: etcd_client::Error| SandboxError::Check(format!("{what}: {e}"));
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15 ^ first_app as u64);
    let mut total = Filled::default();
    let mut status = etcd.clone();
    let mut db = status.status().await.map_err(|e| fail("etcd status", e))?.db_size() as u64;
    let mut i = first_app;
    while db < target_db_bytes {
        // a round: in_flight transactions at once, then the database size
        let (mut txns, mut renewed) = (Vec::new(), Vec::new());
        for _ in 0..in_flight {
            let mut ops = Vec::new();
            while ops.len() < 32 {
                for (resource, mut object) in app(ns, i, &mut noise) {
                    object["metadata"]["uid"] = json!(format!("{}-{}-{}-{}", noise.hex(8), noise.hex(4), noise.hex(4), noise.hex(12)));
                    object["metadata"]["creationTimestamp"] = json!("2026-11-29T10:00:05Z");
                    let key = etcd_key(&resource, &object);
                    let renewals: &[&str] = if resource.kind == "Lease" { &LEASE_RENEWALS } else { &[] };
                    let value = serde_json::to_vec(&object).map_err(|e| SandboxError::Check(e.to_string()))?;
                    total.bytes += value.len() as u64;
                    total.objects += 1;
                    ops.push(TxnOp::put(key.clone(), value, None));
                    for renewal in renewals {
                        // a later revision of the same key: one transaction each
                        object["spec"]["renewTime"] = json!(renewal);
                        let value = serde_json::to_vec(&object).map_err(|e| SandboxError::Check(e.to_string()))?;
                        total.bytes += value.len() as u64;
                        renewed.push(vec![TxnOp::put(key.clone(), value, None)]);
                    }
                }
                total.apps += 1;
                i += 1;
            }
            txns.push(ops);
        }
        // the creates, then the renewals (each a later revision of its Lease)
        for wave in [txns, renewed] {
            let results: Vec<Result<(), SandboxError>> = futures::stream::iter(wave)
                .map(|ops| {
                    let mut client = etcd.clone();
                    async move { client.txn(Txn::new().and_then(ops)).await.map(|_| ()).map_err(|e| fail("etcd txn", e)) }
                })
                .buffer_unordered(in_flight)
                .collect()
                .await;
            results.into_iter().collect::<Result<Vec<()>, _>>()?;
        }
        db = status.status().await.map_err(|e| fail("etcd status", e))?.db_size() as u64;
    }
    Ok((total, db))
}
