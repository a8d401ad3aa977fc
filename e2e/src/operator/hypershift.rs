//! The HostedCluster / NodePool reconciler (the HyperShift operator plus the
//! parts of the control-plane operator the sandbox needs).
//!
//! For each HostedCluster not paused: the finalizer, the HCP namespace
//! `<ns>-<name>`, copies of the pull secret / encryption key / SSH key, the
//! HostedControlPlane (spec mirrored from the HC), the etcd PKI (CA in Secret
//! `etcd-signer`, ConfigMap `etcd-ca`, Secrets `etcd-server-tls`,
//! `etcd-peer-tls`, `etcd-client-tls`), Services `etcd-discovery`,
//! `etcd-client`, the `etcd` StatefulSet and the control
//! plane Deployments (replicas reset to the desired count on every pass, as
//! the control-plane operator does), the published services' Routes and
//! Services (`publishing`), the CAPI `Cluster` and the
//! platform cluster, and per NodePool the CAPI machine objects. Conditions
//! report what is observed: `EtcdAvailable` from ready etcd members (quorum),
//! `KubeAPIServerAvailable` from the hosted API server actually serving.
//!
//! On AWS, the service-account signing key and the OIDC issuer documents
//! ([`super::oidc`]).
//!
//! Paused (`spec.pausedUntil` "true"/"True" or a future RFC3339 time): nothing
//! is reconciled except the `ReconciliationActive=False` condition
//! (reason `ReconciliationPaused`), re-checked on every pass so a deadline
//! lifts the pause by itself.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::etcd_member::{ca_from_pair, load_signer};
use super::objects::{
    self, AGENT_MACHINE, CAPI_CLUSTER, CONFIGMAP, DEPLOYMENT, HOSTED_CLUSTER, HOSTED_CONTROL_PLANE,
    MACHINE, MACHINE_DEPLOYMENT, MACHINE_SET, NAMESPACE, NODE_POOL, POD, Res, SECRET, SERVICE, SERVICE_ACCOUNT,
    STATEFULSET, is_deleting, name_of, ns_of, owner_ref, platform_kinds, str_at,
};
use super::workloads::{add_finalizer, patch_status_if_changed, remove_finalizer, remove_finalizers};
use super::{Ctx, EtcdInit, OperatorError, log_failure};
use crate::pki::{Ca, CertPair, CertSpec};

/// The finalizer HyperShift puts on HostedClusters, NodePools and HCPs.
pub const FINALIZER: &str = "hypershift.openshift.io/finalizer";
/// Annotation on the HCP naming its HostedCluster (`<ns>/<name>`).
pub const CLUSTER_ANNOTATION: &str = "hypershift.openshift.io/cluster";
/// Label on HCP-namespace objects naming the HCP namespace.
pub const HCP_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";
/// Label on CAPI machine objects naming their NodePool.
pub const NODEPOOL_LABEL: &str = "hypershift.openshift.io/nodePool";

/// Whether reconciliation is paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pause {
    /// Not paused (absent, "false", a past time, or anything else).
    No,
    /// `"true"`: until the field is removed.
    Forever,
    /// Until this time.
    Until(DateTime<Utc>),
}

/// Interpret `spec.pausedUntil` at `now`, as HyperShift does.
pub fn pause_state(value: Option<&str>, now: DateTime<Utc>) -> Pause {
    match value {
        None => Pause::No,
        Some("true") | Some("True") => Pause::Forever,
        Some(v) => match DateTime::parse_from_rfc3339(v) {
            Ok(t) if t.with_timezone(&Utc) > now => Pause::Until(t.with_timezone(&Utc)),
            _ => Pause::No,
        },
    }
}

/// The HCP namespace of a HostedCluster.
pub fn hcp_namespace(hc_ns: &str, hc_name: &str) -> String {
    format!("{hc_ns}-{hc_name}")
}

/// `ReconciliationActive` message for a pause.
fn pause_message(p: &Pause, raw: &str) -> String {
    match p {
        Pause::No => "Reconciliation active on resource".into(),
        _ => format!("Reconciliation paused until: {raw}"),
    }
}

/// The release version in a release image tag (`...:4.16.10-x86_64` → `4.16.10`).
pub fn release_version(image: &str) -> String {
    let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
    if tag.contains('/') || tag.is_empty() {
        return "0.0.0".into();
    }
    tag.split('-').next().unwrap_or(tag).to_string()
}

/// The availability policy of an HC (CRD default HighlyAvailable).
pub fn is_highly_available(hc: &Value) -> bool {
    str_at(hc, "/spec/controllerAvailabilityPolicy").unwrap_or("HighlyAvailable")
        == "HighlyAvailable"
}

/// The MachineSet name of a NodePool (stable across management clusters).
pub fn machine_set_name(nodepool: &str, infra_id: &str) -> String {
    format!(
        "{nodepool}-{}",
        objects::short_hash(&[nodepool, infra_id], 5)
    )
}

/// Machine (and Node) names of a NodePool with `replicas` replicas.
pub fn machine_names(nodepool: &str, infra_id: &str, replicas: usize) -> Vec<String> {
    let ms = machine_set_name(nodepool, infra_id);
    (0..replicas)
        .map(|i| format!("{ms}-{}", objects::short_hash(&[&ms, &i.to_string()], 5)))
        .collect()
}

/// `spec.replicas` of a NodePool (autoscaling: its minimum).
pub fn nodepool_replicas(np: &Value) -> usize {
    np.pointer("/spec/replicas")
        .or_else(|| np.pointer("/spec/autoScaling/min"))
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize
}

/// One pass over every HostedCluster.
/// While this file exists in the operator's state directory, the HyperShift
/// reconciler does nothing (the operator is "down", as during a management
/// cluster incident); the kubelet, the controller-manager and external-dns
/// go on. `touch` it to stop the operator, remove it to start it again.
pub const DOWN_MARKER: &str = "hypershift-operator-down";

pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    if ctx.cfg.state_dir.join(DOWN_MARKER).exists() {
        return Ok(());
    }
    let hcs = ctx.kube.list(&HOSTED_CLUSTER, None, None).await?;
    let nps = ctx.kube.list(&NODE_POOL, None, None).await?;
    for hc in &hcs {
        if let Err(e) = reconcile(&ctx, hc, &nps).await {
            log_failure(
                "hostedcluster",
                &format!("{}/{}", ns_of(hc), name_of(hc)),
                &e,
            );
        }
    }
    Ok(())
}

/// The NodePools of `hc` among `nps`.
pub(crate) fn nodepools_of<'a>(hc: &Value, nps: &'a [Value]) -> Vec<&'a Value> {
    nps.iter()
        .filter(|np| ns_of(np) == ns_of(hc) && str_at(np, "/spec/clusterName") == Some(name_of(hc)))
        .collect()
}

/// Replace or add one condition in a list.
fn upsert_condition(conds: Option<&Value>, new: Value) -> Value {
    let mut list: Vec<Value> = conds.and_then(Value::as_array).cloned().unwrap_or_default();
    let t = new.get("type").cloned();
    list.retain(|c| c.get("type") != t.as_ref());
    list.push(new);
    Value::Array(list)
}

/// A paused object reconciles nothing but its `ReconciliationActive=False` condition.
async fn mark_paused(ctx: &Ctx, res: &Res, obj: &Value, pause: &Pause, raw: &str) -> Result<(), OperatorError> {
    let conds = obj.pointer("/status/conditions");
    let c = objects::condition(
        conds,
        "ReconciliationActive",
        false,
        "ReconciliationPaused",
        &pause_message(pause, raw),
    );
    patch_status_if_changed(ctx, res, obj, json!({"conditions": upsert_condition(conds, c)})).await
}

async fn reconcile(ctx: &Ctx, hc: &Value, nps: &[Value]) -> Result<(), OperatorError> {
    let raw = str_at(hc, "/spec/pausedUntil").unwrap_or("");
    let pause = pause_state(str_at(hc, "/spec/pausedUntil"), Utc::now());
    if pause != Pause::No {
        propagate_pause(ctx, hc, raw).await?;
        return mark_paused(ctx, &HOSTED_CLUSTER, hc, &pause, raw).await;
    }
    if is_deleting(hc) {
        return teardown(ctx, hc, nps).await;
    }
    add_finalizer(ctx, &HOSTED_CLUSTER, hc, FINALIZER).await?;
    let ns = ns_of(hc);
    let name = name_of(hc);
    let infra_id = match str_at(hc, "/spec/infraID").filter(|s| !s.is_empty()) {
        Some(id) => id.to_string(),
        None => {
            let id = format!(
                "{name}-{}",
                objects::short_hash(&[ns, name, objects::uid_of(hc)], 5)
            );
            ctx.kube
                .merge(
                    &HOSTED_CLUSTER,
                    Some(ns),
                    name,
                    &json!({"spec": {"infraID": id}}),
                )
                .await?;
            id
        }
    };
    let hcp_ns = hcp_namespace(ns, name);
    ctx.kube
        .create_if_absent(
            &NAMESPACE,
            None,
            json!({"metadata": {"name": hcp_ns, "labels": {
            HCP_LABEL: "true", "hypershift.openshift.io/cluster": name}}}),
        )
        .await?;
    copy_secrets(ctx, hc, &hcp_ns).await?;
    if super::oidc::is_aws(hc) {
        super::oidc::ensure_signing_key(ctx, &hcp_ns).await?;
    }
    let hcp = ensure_hcp(ctx, hc, &hcp_ns, &infra_id).await?;
    if super::oidc::is_aws(hc) {
        super::oidc::publish_documents(ctx, hc, &infra_id, &hcp_ns).await?;
    }
    ensure_etcd_pki(ctx, &hcp_ns, &hcp).await?;
    ensure_services(ctx, &hcp_ns, &hcp).await?;
    let ha = is_highly_available(hc);
    if ctx.cluster_controllers() && !super::kubelet::selects_sandbox_node(hc.pointer("/spec/nodeSelector")) {
        log_failure("hypershift", &format!("{}/{}", ns_of(hc), name_of(hc)), &OperatorError::Invalid {
            what: format!("placement: spec.nodeSelector does not select the sandbox's Node ({}=true): this control plane's pods go to the cluster's own nodes, where no etcd runs; give the HostedCluster the sandbox's nodeSelector and toleration (docs/sandbox.md)",
                super::kubelet::NODE_LABEL),
        });
    }
    ensure_etcd_statefulset(ctx, hc, &hcp_ns, &hcp, ha).await?;
    ensure_deployments(ctx, hc, &hcp_ns, &hcp, ha).await?;
    super::publishing::ensure_published(ctx, hc, &hcp_ns, &hcp).await?;
    ensure_capi_cluster(ctx, hc, &hcp_ns, &infra_id).await?;
    for np in nodepools_of(hc, nps) {
        if let Err(e) = reconcile_nodepool(ctx, hc, np, &hcp_ns, &infra_id).await {
            log_failure("nodepool", &format!("{}/{}", ns_of(np), name_of(np)), &e);
        }
    }
    update_status(ctx, hc, &hcp, &hcp_ns).await
}

/// Like HyperShift, a paused HostedCluster pauses its HostedControlPlane
/// (`spec.pausedUntil`) and CAPI Cluster (`spec.paused`) before stopping.
async fn propagate_pause(ctx: &Ctx, hc: &Value, raw: &str) -> Result<(), OperatorError> {
    let hcp_ns = hcp_namespace(ns_of(hc), name_of(hc));
    if let Some(hcp) = ctx
        .kube
        .get(&HOSTED_CONTROL_PLANE, Some(&hcp_ns), name_of(hc))
        .await?
        && str_at(&hcp, "/spec/pausedUntil") != Some(raw)
    {
        ctx.kube
            .merge(
                &HOSTED_CONTROL_PLANE,
                Some(&hcp_ns),
                name_of(hc),
                &json!({"spec": {"pausedUntil": raw}}),
            )
            .await?;
    }
    if let Some(infra_id) = str_at(hc, "/spec/infraID")
        && let Some(cluster) = ctx.kube.get(&CAPI_CLUSTER, Some(&hcp_ns), infra_id).await?
        && cluster.pointer("/spec/paused").and_then(Value::as_bool) != Some(true)
    {
        ctx.kube
            .merge(
                &CAPI_CLUSTER,
                Some(&hcp_ns),
                infra_id,
                &json!({"spec": {"paused": true}}),
            )
            .await?;
    }
    Ok(())
}

async fn copy_secret(
    ctx: &Ctx,
    from_ns: &str,
    from: &str,
    to_ns: &str,
    to: &str,
) -> Result<(), OperatorError> {
    let src = ctx
        .kube
        .get(&SECRET, Some(from_ns), from)
        .await?
        .ok_or_else(|| OperatorError::Waiting(format!("Secret {from_ns}/{from}")))?;
    let data = src.get("data").cloned().unwrap_or(json!({}));
    match ctx.kube.get(&SECRET, Some(to_ns), to).await? {
        None => {
            let secret = json!({"metadata": {"name": to, "namespace": to_ns},
                "type": src.get("type").cloned().unwrap_or(json!("Opaque")), "data": data});
            ctx.kube.create(&SECRET, Some(to_ns), secret).await?;
        }
        Some(dst) if dst.get("data") != Some(&data) => {
            ctx.kube
                .merge(&SECRET, Some(to_ns), to, &json!({"data": data}))
                .await?;
        }
        Some(_) => {}
    }
    Ok(())
}

async fn copy_secrets(ctx: &Ctx, hc: &Value, hcp_ns: &str) -> Result<(), OperatorError> {
    let ns = ns_of(hc);
    if let Some(ps) = str_at(hc, "/spec/pullSecret/name").filter(|s| !s.is_empty()) {
        copy_secret(ctx, ns, ps, hcp_ns, "pull-secret").await?;
    }
    if let Some(key) =
        str_at(hc, "/spec/secretEncryption/aescbc/activeKey/name").filter(|s| !s.is_empty())
    {
        copy_secret(ctx, ns, key, hcp_ns, key).await?;
    }
    if let Some(key) = str_at(hc, "/spec/sshKey/name").filter(|s| !s.is_empty()) {
        copy_secret(ctx, ns, key, hcp_ns, key).await?;
    }
    Ok(())
}

/// The HostedControlPlane spec mirrored from the HostedCluster.
pub fn hcp_spec(hc: &Value, infra_id: &str) -> Value {
    let spec = hc.get("spec").cloned().unwrap_or(json!({}));
    let get = |k: &str| spec.get(k).cloned();
    let mut out = json!({
        "releaseImage": str_at(hc, "/spec/release/image").unwrap_or(""),
        "pullSecret": {"name": "pull-secret"},
        "sshKey": {"name": str_at(hc, "/spec/sshKey/name").unwrap_or("")},
        "issuerURL": str_at(hc, "/spec/issuerURL").unwrap_or("https://kubernetes.default.svc"),
        "infraID": infra_id,
        "networking": get("networking").unwrap_or(json!({})),
        "services": get("services").unwrap_or(json!([])),
        "dns": get("dns").unwrap_or(json!({"baseDomain": ""})),
        "etcd": get("etcd").unwrap_or(json!({"managementType": "Managed"})),
        "platform": get("platform").unwrap_or(json!({"type": "None"})),
        "controllerAvailabilityPolicy": str_at(hc, "/spec/controllerAvailabilityPolicy").unwrap_or("HighlyAvailable"),
        "infrastructureAvailabilityPolicy": str_at(hc, "/spec/infrastructureAvailabilityPolicy").unwrap_or("SingleReplica"),
    });
    for k in [
        "clusterID",
        "secretEncryption",
        "pausedUntil",
        "fips",
        "olmCatalogPlacement",
        "configuration",
        "capabilities",
    ] {
        if let Some(v) = get(k) {
            out[k] = v;
        }
    }
    out
}

async fn ensure_hcp(
    ctx: &Ctx,
    hc: &Value,
    hcp_ns: &str,
    infra_id: &str,
) -> Result<Value, OperatorError> {
    let name = name_of(hc);
    let desired = hcp_spec(hc, infra_id);
    let cluster = format!("{}/{}", ns_of(hc), name);
    match ctx
        .kube
        .get(&HOSTED_CONTROL_PLANE, Some(hcp_ns), name)
        .await?
    {
        None => {
            let hcp = json!({"metadata": {"name": name, "namespace": hcp_ns,
                    "annotations": {CLUSTER_ANNOTATION: cluster}, "finalizers": [FINALIZER]},
                "spec": desired});
            ctx.kube
                .create(&HOSTED_CONTROL_PLANE, Some(hcp_ns), hcp)
                .await
        }
        Some(existing) => {
            let mut patch = serde_json::Map::new();
            let current = existing.get("spec").cloned().unwrap_or(json!({}));
            if let Some(want) = desired.as_object() {
                for (k, v) in want {
                    if current.get(k) != Some(v) {
                        patch.insert(k.clone(), v.clone());
                    }
                }
            }
            // A pause mirrored earlier and since lifted on the HC.
            if current.get("pausedUntil").is_some() && desired.get("pausedUntil").is_none() {
                patch.insert("pausedUntil".into(), Value::Null);
            }
            if patch.is_empty() {
                return Ok(existing);
            }
            ctx.kube
                .merge(
                    &HOSTED_CONTROL_PLANE,
                    Some(hcp_ns),
                    name,
                    &json!({"spec": patch}),
                )
                .await
        }
    }
}

fn tls_secret(name: &str, ns: &str, owner: &Value, entries: &[(&str, &str)], type_: &str) -> Value {
    use base64::Engine as _;
    let data: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                json!(base64::engine::general_purpose::STANDARD.encode(v)),
            )
        })
        .collect();
    json!({"metadata": {"name": name, "namespace": ns, "ownerReferences": [owner_ref(&HOSTED_CONTROL_PLANE, owner)]},
        "type": type_, "data": data})
}

/// The etcd PKI of an HCP namespace: created once, kept afterwards (restored
/// namespaces bring theirs along).
async fn ensure_etcd_pki(ctx: &Ctx, ns: &str, hcp: &Value) -> Result<(), OperatorError> {
    let signer: Ca = match ctx.kube.get(&SECRET, Some(ns), "etcd-signer").await? {
        Some(_) => load_signer(ctx, ns).await?,
        None => {
            let ca = Ca::new("etcd-signer")?;
            let pair = CertPair {
                cert_pem: ca.cert_pem().to_string(),
                key_pem: ca.key_pem().to_string(),
            };
            let secret = tls_secret(
                "etcd-signer",
                ns,
                hcp,
                &[("tls.crt", &pair.cert_pem), ("tls.key", &pair.key_pem)],
                "kubernetes.io/tls",
            );
            ctx.kube.create(&SECRET, Some(ns), secret).await?;
            ca_from_pair(&ctx.cfg.state_dir, ns, &pair)?
        }
    };
    ctx.kube
        .create_if_absent(&CONFIGMAP, Some(ns), json!({"metadata": {"name": "etcd-ca", "namespace": ns,
            "ownerReferences": [owner_ref(&HOSTED_CONTROL_PLANE, hcp)]}, "data": {"ca.crt": signer.cert_pem()}}))
        .await?;
    let loopback = vec![std::net::IpAddr::from([127, 0, 0, 1])];
    let certs: [(&str, &str, &str, CertSpec); 3] = [
        (
            "etcd-server-tls",
            "server.crt",
            "server.key",
            CertSpec {
                common_name: "etcd-server".into(),
                organization: None,
                dns_names: vec![
                    format!("*.etcd-discovery.{ns}.svc"),
                    format!("*.etcd-discovery.{ns}.svc.cluster.local"),
                    format!("etcd-client.{ns}.svc"),
                    format!("etcd-client.{ns}.svc.cluster.local"),
                    "etcd-client".into(),
                    "localhost".into(),
                ],
                ips: loopback.clone(),
                server: true,
                client: true,
            },
        ),
        (
            "etcd-peer-tls",
            "peer.crt",
            "peer.key",
            CertSpec {
                common_name: "etcd-discovery".into(),
                organization: None,
                dns_names: vec![
                    format!("*.etcd-discovery.{ns}.svc"),
                    format!("*.etcd-discovery.{ns}.svc.cluster.local"),
                ],
                ips: loopback,
                server: true,
                client: true,
            },
        ),
        (
            "etcd-client-tls",
            "etcd-client.crt",
            "etcd-client.key",
            CertSpec {
                common_name: "etcd-client".into(),
                organization: Some("kubernetes".into()),
                dns_names: vec![],
                ips: vec![],
                server: false,
                client: true,
            },
        ),
    ];
    for (name, crt, key, spec) in certs {
        if ctx.kube.get(&SECRET, Some(ns), name).await?.is_some() {
            continue;
        }
        let pair = signer.issue(&spec)?;
        let secret = tls_secret(
            name,
            ns,
            hcp,
            &[(crt, &pair.cert_pem), (key, &pair.key_pem)],
            "Opaque",
        );
        ctx.kube.create_if_absent(&SECRET, Some(ns), secret).await?;
    }
    Ok(())
}

async fn ensure_services(ctx: &Ctx, ns: &str, hcp: &Value) -> Result<(), OperatorError> {
    let owner = json!([owner_ref(&HOSTED_CONTROL_PLANE, hcp)]);
    let services = [
        json!({"metadata": {"name": "etcd-discovery", "namespace": ns, "ownerReferences": owner},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": {"app": "etcd"}, "type": "ClusterIP",
                "ports": [{"name": "peer", "port": 2380, "protocol": "TCP", "targetPort": "peer"},
                          {"name": "etcd-client", "port": 2379, "protocol": "TCP", "targetPort": "client"}]}}),
        json!({"metadata": {"name": "etcd-client", "namespace": ns, "labels": {"app": "etcd"}, "ownerReferences": owner},
            "spec": {"selector": {"app": "etcd"}, "type": "ClusterIP",
                "ports": [{"name": "etcd-client", "port": 2379, "protocol": "TCP", "targetPort": "client"},
                          {"name": "metrics", "port": 2381, "protocol": "TCP", "targetPort": "metrics"}]}}),
    ];
    for svc in services {
        ctx.kube.create_if_absent(&SERVICE, Some(ns), svc).await?;
    }
    // the etcd pods' service account: a real API server refuses a pod
    // whose serviceAccountName does not exist
    let account = json!({"metadata": {"name": "etcd", "namespace": ns, "ownerReferences": owner}});
    ctx.kube.create_if_absent(&SERVICE_ACCOUNT, Some(ns), account).await?;
    Ok(())
}

/// Where a HostedCluster's control-plane pods go, as HyperShift renders it:
/// `spec.nodeSelector` as the pods' nodeSelector and `spec.tolerations`
/// after the control-plane tolerations, on `obj`'s pod template (set when
/// the object is created).
pub fn place(obj: &mut Value, hc: &Value) {
    let Some(spec) = obj.pointer_mut("/spec/template/spec") else {
        return;
    };
    if let Some(selector) = hc.pointer("/spec/nodeSelector").filter(|s| s.as_object().is_some_and(|m| !m.is_empty())) {
        spec["nodeSelector"] = selector.clone();
    }
    if let Some(extra) = hc.pointer("/spec/tolerations").and_then(Value::as_array) {
        let mut all = spec.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
        all.extend(extra.iter().cloned());
        spec["tolerations"] = json!(all);
    }
}

/// The etcd claims' StorageClass: the HostedCluster's
/// `spec.etcd.managed.storage.persistentVolume.storageClassName`, else the
/// cluster's default, except where the sandbox provisions for a real
/// controller-manager ([`super::Controllers::Cluster`]): its own
/// `sandbox-local`, never the cluster's default class.
fn etcd_storage_class(ctx: &Ctx, hc: &Value) -> Option<String> {
    str_at(hc, "/spec/etcd/managed/storage/persistentVolume/storageClassName")
        .map(str::to_string)
        .or_else(|| ctx.cluster_controllers().then(|| super::workloads::LOCAL_CLASS.to_string()))
}

fn control_plane_labels(component: &str, ns: &str) -> Value {
    json!({"app": component, "hypershift.openshift.io/control-plane-component": component, HCP_LABEL: ns})
}

fn pod_template_common(ns: &str) -> Value {
    json!({
        "priorityClassName": "hypershift-api-critical",
        "automountServiceAccountToken": false,
        "tolerations": [
            {"effect": "NoSchedule", "key": "hypershift.openshift.io/control-plane", "operator": "Equal", "value": "true"},
            {"effect": "NoSchedule", "key": "hypershift.openshift.io/cluster", "operator": "Equal", "value": ns}],
    })
}

/// The etcd StatefulSet (shape of the control-plane operator's).
pub fn etcd_statefulset(ns: &str, hcp: &Value, replicas: usize, release_image: &str) -> Value {
    let labels = json!({"app": "etcd", "hypershift.openshift.io/control-plane-component": "etcd", HCP_LABEL: ns,
        "hypershift.openshift.io/need-management-kas-access": "true"});
    let initial_cluster = (0..replicas)
        .map(|i| format!("etcd-{i}=https://etcd-{i}.etcd-discovery.{ns}.svc:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let env = json!([
        {"name": "POD_IP", "valueFrom": field("status.podIP")},
        {"name": "NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "HOSTNAME", "valueFrom": field("metadata.name")},
        {"name": "ETCD_NAME", "value": "$(HOSTNAME)"},
        {"name": "ETCD_QUOTA_BACKEND_BYTES", "value": super::etcd_member::QUOTA_BACKEND_BYTES.to_string()},
        {"name": "ETCD_DATA_DIR", "value": "/var/lib/data"},
        {"name": "ETCD_INITIAL_ADVERTISE_PEER_URLS", "value": "https://$(HOSTNAME).etcd-discovery.$(NAMESPACE).svc:2380"},
        {"name": "ETCD_LISTEN_PEER_URLS", "value": "https://$(POD_IP):2380"},
        {"name": "ETCD_LISTEN_CLIENT_URLS", "value": "https://$(POD_IP):2379,https://localhost:2379"},
        {"name": "ETCD_ADVERTISE_CLIENT_URLS", "value": "https://$(HOSTNAME).etcd-discovery.$(NAMESPACE).svc:2379"},
        {"name": "ETCD_PEER_CLIENT_CERT_AUTH", "value": "true"},
        {"name": "ETCD_PEER_CERT_FILE", "value": "/etc/etcd/tls/peer/peer.crt"},
        {"name": "ETCD_PEER_KEY_FILE", "value": "/etc/etcd/tls/peer/peer.key"},
        {"name": "ETCD_PEER_TRUSTED_CA_FILE", "value": "/etc/etcd/tls/etcd-ca/ca.crt"},
        {"name": "ETCD_CLIENT_CERT_AUTH", "value": "true"},
        {"name": "ETCD_CERT_FILE", "value": "/etc/etcd/tls/server/server.crt"},
        {"name": "ETCD_KEY_FILE", "value": "/etc/etcd/tls/server/server.key"},
        {"name": "ETCD_TRUSTED_CA_FILE", "value": "/etc/etcd/tls/etcd-ca/ca.crt"},
        {"name": "ETCD_INITIAL_CLUSTER", "value": initial_cluster},
        {"name": "ETCD_TLS_MIN_VERSION", "value": "TLS1.2"},
    ]);
    let mount = |path: &str, name: &str| json!({"mountPath": path, "name": name});
    let reset_script = "#!/bin/bash\nset -eu\n# When this member's data directory is empty and the cluster answers,\n# remove a member of this name and add this pod again (state: existing).\nexport ETCDCTL_API=3 ETCDCTL_CACERT=/etc/etcd/tls/etcd-ca/ca.crt ETCDCTL_CERT=/etc/etcd/tls/server/server.crt ETCDCTL_KEY=/etc/etcd/tls/server/server.key ETCDCTL_ENDPOINTS=https://etcd-client:2379\necho new > /etc/etcd/clusterstate/state\nif [[ ! -f /var/lib/data/member/snap/db ]] && etcdctl member list; then\n  MEMBER_ID=$(etcdctl member list -w simple | grep \"${HOSTNAME}\" | awk -F, '{ print $1 }')\n  if [[ -n \"${MEMBER_ID}\" ]]; then\n    etcdctl member remove \"${MEMBER_ID}\"\n    etcdctl member add ${HOSTNAME} --peer-urls https://${HOSTNAME}.etcd-discovery.${NAMESPACE}.svc:2380\n    echo existing > /etc/etcd/clusterstate/state\n  fi\nfi\n";
    let mut spec = pod_template_common(ns);
    spec["priorityClassName"] = json!("hypershift-etcd");
    spec["automountServiceAccountToken"] = json!(true);
    spec["serviceAccountName"] = json!("etcd");
    spec["restartPolicy"] = json!("Always");
    spec["initContainers"] = json!([
        {"name": "ensure-dns", "image": "controlplane-operator", "command": ["/bin/bash"],
         "args": ["-c", "exec control-plane-operator resolve-dns --self-register ${HOSTNAME}.etcd-discovery.${NAMESPACE}.svc"]},
        {"name": "reset-member", "image": "etcd", "command": ["/bin/bash"], "args": ["-c", reset_script],
         "env": [{"name": "NAMESPACE", "valueFrom": field("metadata.namespace")}],
         "volumeMounts": [mount("/var/lib", "data"), mount("/etc/etcd/tls/server", "server-tls"),
            mount("/etc/etcd/tls/etcd-ca", "etcd-ca"), mount("/etc/etcd/clusterstate", "cluster-state")]},
    ]);
    spec["containers"] = json!([
        {"name": "etcd", "image": "etcd", "command": ["/bin/sh", "-c",
            "ETCD_INITIAL_CLUSTER_STATE=$(cat /etc/etcd/clusterstate/state) /usr/bin/etcd"],
         "env": env,
         "ports": [{"containerPort": 2379, "name": "client", "protocol": "TCP"}, {"containerPort": 2380, "name": "peer", "protocol": "TCP"}],
         "readinessProbe": {"httpGet": {"path": "readyz", "port": 9980, "scheme": "HTTPS"}, "periodSeconds": 5, "failureThreshold": 15},
         "volumeMounts": [mount("/var/lib", "data"), mount("/etc/etcd/tls/peer", "peer-tls"), mount("/etc/etcd/tls/server", "server-tls"),
            mount("/etc/etcd/tls/client", "client-tls"), mount("/etc/etcd/tls/etcd-ca", "etcd-ca"),
            mount("/etc/etcd/clusterstate", "cluster-state"), mount("/tmp", "tmp-dir")]},
        {"name": "etcd-metrics", "image": "etcd", "command": ["etcd"], "args": ["grpc-proxy", "start", "--endpoints=https://localhost:2382"],
         "ports": [{"containerPort": 2381, "name": "metrics", "protocol": "TCP"}]},
        {"name": "healthz", "image": "cluster-etcd-operator", "command": ["cluster-etcd-operator"],
         "args": ["readyz", "--target=https://localhost:2379", "--listen-port=9980"],
         "ports": [{"containerPort": 9980, "name": "healthz", "protocol": "TCP"}]},
    ]);
    spec["volumes"] = json!([
        {"name": "peer-tls", "secret": {"defaultMode": 416, "secretName": "etcd-peer-tls"}},
        {"name": "server-tls", "secret": {"defaultMode": 416, "secretName": "etcd-server-tls"}},
        {"name": "client-tls", "secret": {"defaultMode": 416, "secretName": "etcd-client-tls"}},
        {"name": "etcd-ca", "configMap": {"defaultMode": 420, "name": "etcd-ca"}},
        {"name": "etcd-metrics-ca", "configMap": {"defaultMode": 420, "name": "etcd-metrics-ca"}},
        {"name": "cluster-state", "emptyDir": {}},
        {"name": "tmp-dir", "emptyDir": {}},
    ]);
    json!({
        "metadata": {"name": "etcd", "namespace": ns, "labels": {"hypershift.openshift.io/managed-by": "control-plane-operator"},
            "ownerReferences": [owner_ref(&HOSTED_CONTROL_PLANE, hcp)]},
        "spec": {
            "replicas": replicas,
            "serviceName": "etcd-discovery",
            "podManagementPolicy": "Parallel",
            "revisionHistoryLimit": 10,
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "selector": {"matchLabels": {"app": "etcd"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes": "cluster-state,tmp-dir",
                    "hypershift.openshift.io/release-image": release_image}},
                "spec": spec,
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "8Gi"}}, "volumeMode": "Filesystem"}}],
        },
    })
}

/// A control-plane Deployment: name, labels, selector, containers and ports
/// as the control-plane operator renders them (volumes and probes trimmed).
pub fn control_plane_deployment(
    ns: &str,
    hcp: &Value,
    component: &str,
    replicas: usize,
    release_image: &str,
) -> Value {
    let mut labels = control_plane_labels(component, ns);
    let containers = match component {
        "kube-apiserver" => {
            labels["hypershift.openshift.io/request-serving-component"] = json!("true");
            json!([
                {"name": "kube-apiserver", "image": "hyperkube", "ports": [{"containerPort": 6443, "name": "client", "protocol": "TCP"}]},
                {"name": "konnectivity-server", "image": "apiserver-network-proxy"},
                {"name": "audit-logs", "image": "cli"},
            ])
        }
        "openshift-apiserver" => json!([
            {"name": "openshift-apiserver", "image": "openshift-apiserver", "ports": [{"containerPort": 8443, "name": "https", "protocol": "TCP"}]},
            {"name": "audit-logs", "image": "cli"},
            {"name": "kas-readiness-check", "image": "cli"},
            {"name": "konnectivity-proxy-https", "image": "controlplane-operator"},
        ]),
        "openshift-oauth-apiserver" => json!([
            {"name": "openshift-oauth-apiserver", "image": "oauth-apiserver"},
            {"name": "audit-logs", "image": "cli"},
            {"name": "kas-readiness-check", "image": "cli"},
            {"name": "konnectivity-proxy-socks5", "image": "controlplane-operator"},
        ]),
        other => json!([{"name": other, "image": other}]),
    };
    let mut spec = pod_template_common(ns);
    spec["containers"] = containers;
    json!({
        "metadata": {"name": component, "namespace": ns, "labels": {"hypershift.openshift.io/managed-by": "control-plane-operator"},
            "ownerReferences": [owner_ref(&HOSTED_CONTROL_PLANE, hcp)]},
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": {"app": component}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels, "annotations": {"hypershift.openshift.io/release-image": release_image}}, "spec": spec},
        },
    })
}

/// Control-plane Deployments and their replicas (HA, single).
pub const DEPLOYMENTS: &[(&str, usize, usize)] = &[
    ("kube-apiserver", 3, 1),
    ("openshift-apiserver", 3, 1),
    ("openshift-oauth-apiserver", 3, 1),
    ("control-plane-operator", 1, 1),
    ("kube-controller-manager", 2, 1),
    ("cluster-version-operator", 1, 1),
];

/// Create `obj` if absent, else reset `spec.replicas` to `replicas`.
async fn ensure_scaled(
    ctx: &Ctx,
    res: &Res,
    ns: &str,
    obj: Value,
    replicas: usize,
) -> Result<(), OperatorError> {
    let name = name_of(&obj).to_string();
    match ctx.kube.get(res, Some(ns), &name).await? {
        None => {
            ctx.kube.create(res, Some(ns), obj).await?;
        }
        Some(existing) => {
            if existing.pointer("/spec/replicas").and_then(Value::as_u64) != Some(replicas as u64) {
                tracing::info!(namespace = ns, name = %name, replicas, "resetting replicas");
                ctx.kube
                    .merge(
                        res,
                        Some(ns),
                        &name,
                        &json!({"spec": {"replicas": replicas}}),
                    )
                    .await?;
            }
        }
    }
    Ok(())
}

/// The init containers of the etcd template for `hcp` (the template
/// `sts` renders, plus `etcd-init` while the HCP restores a snapshot, placed
/// as `mode` places it: [`super::etcd_init`]).
pub fn etcd_init_containers(sts: &Value, hcp: &Value, ns: &str, mode: EtcdInit) -> Vec<Value> {
    let base = sts.pointer("/spec/template/spec/initContainers").and_then(Value::as_array).cloned().unwrap_or_default();
    let initial_cluster = sts
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| str_at(c, "/name") == Some("etcd"))
        .flat_map(|c| c.get("env").and_then(Value::as_array).into_iter().flatten())
        .find(|e| str_at(e, "/name") == Some("ETCD_INITIAL_CLUSTER"))
        .and_then(|e| str_at(e, "/value"))
        .unwrap_or_default();
    let etcd_init = super::etcd_init::wanted_url(hcp).map(|url| super::etcd_init::init_container(mode, url, ns, initial_cluster));
    super::etcd_init::init_containers(mode, &base, etcd_init)
}

/// The etcd StatefulSet: created once (claim template with the HC's storage
/// class and size), then its replicas reset and its init containers kept
/// as [`etcd_init_containers`] says (`etcd-init` comes and goes with the
/// restore; the sandbox's StatefulSet controller does not roll the pods).
async fn ensure_etcd_statefulset(
    ctx: &Ctx,
    hc: &Value,
    ns: &str,
    hcp: &Value,
    ha: bool,
) -> Result<(), OperatorError> {
    let replicas = if ha { 3 } else { 1 };
    let image = str_at(hc, "/spec/release/image").unwrap_or("");
    let mut sts = etcd_statefulset(ns, hcp, replicas, image);
    place(&mut sts, hc);
    if let Some(class) = etcd_storage_class(ctx, hc) {
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] = json!(class);
    }
    if let Some(size) = hc.pointer("/spec/etcd/managed/storage/persistentVolume/size").filter(|v| !v.is_null()) {
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"] = json!({"requests": {"storage": size}});
    }
    let init = etcd_init_containers(&sts, hcp, ns, ctx.cfg.etcd_init);
    let restoring = init.iter().any(|c| str_at(c, "/name") == Some(super::etcd_init::CONTAINER));
    sts["spec"]["template"]["spec"]["initContainers"] = json!(init);
    let Some(existing) = ctx.kube.get(&STATEFULSET, Some(ns), "etcd").await? else {
        if restoring {
            let url = super::etcd_init::wanted_url(hcp).map(super::etcd_member::redact).unwrap_or_default();
            tracing::info!(namespace = ns, url = %url, etcd_init = ctx.cfg.etcd_init.as_str(), "etcd StatefulSet with etcd-init: restoring a snapshot");
        }
        ctx.kube.create(&STATEFULSET, Some(ns), sts).await?;
        return Ok(());
    };
    let have = existing.pointer("/spec/template/spec/initContainers").cloned().unwrap_or(json!([]));
    if !super::workloads::status_subset(&json!(init), &have) {
        tracing::info!(namespace = ns, etcd_init = restoring, "etcd StatefulSet: updating its init containers");
        ctx.kube
            .merge(&STATEFULSET, Some(ns), "etcd", &json!({"spec": {"template": {"spec": {"initContainers": init}}}}))
            .await?;
    }
    ensure_scaled(ctx, &STATEFULSET, ns, sts, replicas).await
}

async fn ensure_deployments(
    ctx: &Ctx,
    hc: &Value,
    ns: &str,
    hcp: &Value,
    ha: bool,
) -> Result<(), OperatorError> {
    let image = str_at(hc, "/spec/release/image").unwrap_or("");
    for (component, ha_replicas, single) in DEPLOYMENTS {
        let replicas = if ha { *ha_replicas } else { *single };
        let mut deployment = control_plane_deployment(ns, hcp, component, replicas, image);
        place(&mut deployment, hc);
        ensure_scaled(
            ctx,
            &DEPLOYMENT,
            ns,
            deployment,
            replicas,
        )
        .await?;
    }
    Ok(())
}

fn endpoint(ctx: &Ctx, hc: &Value) -> Value {
    let (ip, port) =
        super::hosted_api::hosted_api_address(&ctx.cfg.sandbox_id, &ctx.cfg.cluster_name, ns_of(hc), name_of(hc));
    json!({"host": ip.to_string(), "port": port})
}

async fn ensure_capi_cluster(
    ctx: &Ctx,
    hc: &Value,
    ns: &str,
    infra_id: &str,
) -> Result<(), OperatorError> {
    let platform = str_at(hc, "/spec/platform/type").unwrap_or("None");
    let name = name_of(hc);
    let ep = endpoint(ctx, hc);
    let mut spec = json!({
        "controlPlaneEndpoint": ep,
        "controlPlaneRef": {"apiVersion": HOSTED_CONTROL_PLANE.api_version(), "kind": "HostedControlPlane", "name": name, "namespace": ns},
    });
    if let Some((cluster_kind, _, _)) = platform_kinds(platform) {
        let mut infra_spec = json!({"controlPlaneEndpoint": ep});
        if platform == "AWS"
            && let Some(region) = str_at(hc, "/spec/platform/aws/region")
        {
            infra_spec["region"] = json!(region);
        }
        let infra = json!({"metadata": {"name": name, "namespace": ns, "annotations": {CLUSTER_ANNOTATION: format!("{}/{}", ns_of(hc), name)}},
            "spec": infra_spec});
        if ctx
            .kube
            .create_if_absent(&cluster_kind, Some(ns), infra)
            .await?
        {
            let _ = ctx
                .kube
                .merge_status(
                    &cluster_kind,
                    Some(ns),
                    name,
                    &json!({"status": {"ready": true}}),
                )
                .await;
        }
        spec["infrastructureRef"] = json!({"apiVersion": cluster_kind.api_version(), "kind": cluster_kind.kind, "name": name, "namespace": ns});
    }
    if let Some(existing) = ctx.kube.get(&CAPI_CLUSTER, Some(ns), infra_id).await? {
        if existing.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
            ctx.kube
                .merge(
                    &CAPI_CLUSTER,
                    Some(ns),
                    infra_id,
                    &json!({"spec": {"paused": false}}),
                )
                .await?;
        }
        return Ok(());
    }
    let cluster = json!({"metadata": {"name": infra_id, "namespace": ns}, "spec": spec});
    if ctx
        .kube
        .create_if_absent(&CAPI_CLUSTER, Some(ns), cluster)
        .await?
    {
        ctx.kube
            .merge_status(
                &CAPI_CLUSTER,
                Some(ns),
                infra_id,
                &json!({"status": {"phase": "Provisioned",
                "controlPlaneReady": true, "infrastructureReady": true}}),
            )
            .await?;
    }
    Ok(())
}

async fn reconcile_nodepool(
    ctx: &Ctx,
    hc: &Value,
    np: &Value,
    hcp_ns: &str,
    infra_id: &str,
) -> Result<(), OperatorError> {
    let conds = np.pointer("/status/conditions");
    let raw = str_at(np, "/spec/pausedUntil").unwrap_or("");
    let pause = pause_state(str_at(np, "/spec/pausedUntil"), Utc::now());
    if pause != Pause::No {
        return mark_paused(ctx, &NODE_POOL, np, &pause, raw).await;
    }
    if is_deleting(np) {
        delete_nodepool_machines(ctx, np, hcp_ns).await?;
        return remove_finalizer(ctx, &NODE_POOL, np, FINALIZER).await;
    }
    add_finalizer(ctx, &NODE_POOL, np, FINALIZER).await?;
    let np_name = name_of(np);
    let replicas = nodepool_replicas(np);
    let platform = str_at(hc, "/spec/platform/type").unwrap_or("None");
    let image = str_at(np, "/spec/release/image")
        .or_else(|| str_at(hc, "/spec/release/image"))
        .unwrap_or("");
    if let Some((_, template_kind, machine_kind)) = platform_kinds(platform) {
        ensure_machines(
            ctx,
            np,
            hcp_ns,
            infra_id,
            replicas,
            platform,
            template_kind,
            machine_kind,
        )
        .await?;
    }
    let key = super::hosted_api::key(ns_of(hc), name_of(hc));
    let ready_nodes = super::hosted_api::ready_nodes(ctx, &key, np_name);
    let ready = ready_nodes >= replicas && (replicas == 0 || ctx.hosted_api_up(&key));
    let status = json!({
        "replicas": ready_nodes.min(replicas),
        "version": release_version(image),
        "conditions": [
            objects::condition(conds, "ReconciliationActive", true, "ReconciliationActive", "Reconciliation active on resource"),
            objects::condition(conds, "Ready", ready, if ready { "AsExpected" } else { "WaitingForNodes" },
                &format!("{ready_nodes} of {replicas} nodes ready")),
            objects::condition(conds, "AllMachinesReady", true, "AsExpected", "All is well"),
            objects::condition(conds, "AllNodesHealthy", ready, if ready { "AsExpected" } else { "WaitingForNodes" }, ""),
        ],
    });
    patch_status_if_changed(ctx, &NODE_POOL, np, objects::observed(status, np)).await
}

fn machine_labels(np: &str, ms: &str, infra_id: &str) -> Value {
    json!({NODEPOOL_LABEL: np, "cluster.x-k8s.io/cluster-name": infra_id, "cluster.x-k8s.io/set-name": ms})
}

fn platform_machine_spec(platform: &str, np: &Value, ns: &str, infra_id: &str) -> Value {
    match platform {
        "AWS" => {
            json!({"instanceType": str_at(np, "/spec/platform/aws/instanceType").unwrap_or("m5.large")})
        }
        "KubeVirt" => {
            let kv = &np["spec"]["platform"]["kubevirt"];
            let image = str_at(np, "/spec/release/image").unwrap_or("quay.io/openshift-release-dev/ocp-release:latest");
            let template = super::kubevirt::virtual_machine_template(
                ns,
                infra_id,
                image,
                kv["compute"]["cores"].as_u64().unwrap_or(2),
                kv["compute"]["memory"].as_str().unwrap_or("8Gi"),
                kv["rootVolume"]["persistent"]["size"].as_str().unwrap_or("32Gi"),
                super::snapshots::SANDBOX_STORAGE_CLASS,
            );
            json!({"virtualMachineTemplate": template})
        }
        _ => json!({}),
    }
}

#[allow(clippy::too_many_arguments)]
async fn ensure_machines(
    ctx: &Ctx,
    np: &Value,
    ns: &str,
    infra_id: &str,
    replicas: usize,
    platform: &str,
    template_kind: Res,
    machine_kind: Res,
) -> Result<(), OperatorError> {
    let np_name = name_of(np);
    let ms = machine_set_name(np_name, infra_id);
    let labels = machine_labels(np_name, &ms, infra_id);
    let machine_spec = platform_machine_spec(platform, np, ns, infra_id);
    let template = json!({"metadata": {"name": ms, "namespace": ns, "labels": {NODEPOOL_LABEL: np_name}},
        "spec": {"template": {"spec": machine_spec}}});
    ctx.kube
        .create_if_absent(&template_kind, Some(ns), template)
        .await?;
    let version = release_version(str_at(np, "/spec/release/image").unwrap_or(""));
    let selector = json!({"matchLabels": {NODEPOOL_LABEL: np_name, "cluster.x-k8s.io/cluster-name": infra_id}});
    let machine_template = |labels: &Value| {
        json!({"metadata": {"labels": labels},
            "spec": {"clusterName": infra_id, "version": format!("v{version}"),
                "bootstrap": {"dataSecretName": format!("user-data-{ms}")},
                "infrastructureRef": {"apiVersion": template_kind.api_version(), "kind": template_kind.kind, "name": ms, "namespace": ns}}})
    };
    let md = json!({"metadata": {"name": np_name, "namespace": ns, "labels": {NODEPOOL_LABEL: np_name},
            "annotations": {"hypershift.openshift.io/nodePool": format!("{}/{}", ns_of(np), np_name)}},
        "spec": {"clusterName": infra_id, "replicas": replicas, "selector": selector, "template": machine_template(&labels)}});
    ensure_scaled(ctx, &MACHINE_DEPLOYMENT, ns, md, replicas).await?;
    let ms_obj = json!({"metadata": {"name": ms, "namespace": ns, "labels": {NODEPOOL_LABEL: np_name}},
        "spec": {"clusterName": infra_id, "replicas": replicas, "selector": selector, "template": machine_template(&labels)}});
    ensure_scaled(ctx, &MACHINE_SET, ns, ms_obj, replicas).await?;
    let wanted = machine_names(np_name, infra_id, replicas);
    for name in &wanted {
        let pm = json!({"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": machine_spec});
        ctx.kube
            .create_if_absent(&machine_kind, Some(ns), pm)
            .await?;
        let machine = json!({"metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"clusterName": infra_id, "version": format!("v{version}"),
                "bootstrap": {"dataSecretName": format!("user-data-{ms}")},
                "infrastructureRef": {"apiVersion": machine_kind.api_version(), "kind": machine_kind.kind, "name": name, "namespace": ns}}});
        if ctx
            .kube
            .create_if_absent(&MACHINE, Some(ns), machine)
            .await?
        {
            ctx.kube
                .merge_status(&MACHINE, Some(ns), name, &json!({"status": {"phase": "Running", "bootstrapReady": true,
                    "infrastructureReady": true, "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": name}}}))
                .await?;
        }
    }
    // Scale down: machines of this pool beyond the replicas.
    for m in ctx.kube.list(&MACHINE, Some(ns), None).await? {
        if str_at(
            &m,
            &format!("/metadata/labels/{}", NODEPOOL_LABEL.replace('/', "~1")),
        ) == Some(np_name)
            && !wanted.iter().any(|w| w == name_of(&m))
        {
            // the provider unbinds an AgentMachine's Agent before it goes
            super::agent::release_agent_of(ctx, &machine_kind, ns, name_of(&m)).await?;
            if ctx.kube.delete(&MACHINE, Some(ns), name_of(&m)).await? {
                super::cloud::terminate(ctx, infra_id, name_of(&m))?;
            }
            ctx.kube
                .delete(&machine_kind, Some(ns), name_of(&m))
                .await?;
        }
    }
    let set_status = json!({"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
        "fullyLabeledReplicas": replicas, "selector": objects::selector_string(&selector)});
    if let Some(obj) = ctx.kube.get(&MACHINE_SET, Some(ns), &ms).await? {
        patch_status_if_changed(ctx, &MACHINE_SET, &obj, set_status).await?;
    }
    let md_status = json!({"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
        "updatedReplicas": replicas, "unavailableReplicas": 0, "phase": "Running", "selector": objects::selector_string(&selector)});
    if let Some(obj) = ctx.kube.get(&MACHINE_DEPLOYMENT, Some(ns), np_name).await? {
        patch_status_if_changed(ctx, &MACHINE_DEPLOYMENT, &obj, md_status).await?;
    }
    Ok(())
}

async fn delete_nodepool_machines(
    ctx: &Ctx,
    np: &Value,
    hcp_ns: &str,
) -> Result<(), OperatorError> {
    let np_name = name_of(np);
    let label = NODEPOOL_LABEL.replace('/', "~1");
    let mut kinds = vec![MACHINE_DEPLOYMENT, MACHINE_SET, MACHINE];
    for p in ["AWS", "Agent", "KubeVirt"] {
        if let Some((_, t, m)) = platform_kinds(p) {
            kinds.extend([t, m]);
        }
    }
    for res in kinds {
        let items = match ctx.kube.list(&res, Some(hcp_ns), None).await {
            Ok(items) => items,
            Err(e) if objects::status_code(&e) == Some(404) => continue,
            Err(e) => return Err(e),
        };
        for item in items
            .iter()
            .filter(|i| str_at(i, &format!("/metadata/labels/{label}")) == Some(np_name))
        {
            if res.group == AGENT_MACHINE.group && res.kind == AGENT_MACHINE.kind {
                super::agent::release_agent(ctx, item).await?;
            }
            let deleted = ctx.kube.delete(&res, Some(hcp_ns), name_of(item)).await?;
            if deleted && res.kind == MACHINE.kind && res.group == MACHINE.group {
                let infra_id = str_at(item, "/spec/clusterName").unwrap_or_default();
                super::cloud::terminate(ctx, infra_id, name_of(item))?;
            }
        }
    }
    Ok(())
}

/// HC deletion: NodePools, the HCP, the HCP namespace, the OIDC documents,
/// then the finalizers.
async fn teardown(ctx: &Ctx, hc: &Value, nps: &[Value]) -> Result<(), OperatorError> {
    let ns = ns_of(hc);
    let name = name_of(hc);
    let hcp_ns = hcp_namespace(ns, name);
    let pools = nodepools_of(hc, nps);
    for np in &pools {
        if is_deleting(np) {
            delete_nodepool_machines(ctx, np, &hcp_ns).await?;
            remove_finalizer(ctx, &NODE_POOL, np, FINALIZER).await?;
        } else {
            ctx.kube.delete(&NODE_POOL, Some(ns), name_of(np)).await?;
        }
    }
    if let Some(hcp) = ctx
        .kube
        .get(&HOSTED_CONTROL_PLANE, Some(&hcp_ns), name)
        .await?
    {
        if !is_deleting(&hcp) {
            ctx.kube
                .delete(&HOSTED_CONTROL_PLANE, Some(&hcp_ns), name)
                .await?;
        }
        remove_finalizer(ctx, &HOSTED_CONTROL_PLANE, &hcp, FINALIZER).await?;
    }
    let ns_obj = ctx.kube.get(&NAMESPACE, None, &hcp_ns).await?;
    // CAPI deprovisions every worker still there before its namespace goes
    if ns_obj.is_some() {
        for m in ctx.kube.list(&MACHINE, Some(&hcp_ns), None).await? {
            if ctx.kube.delete(&MACHINE, Some(&hcp_ns), name_of(&m)).await? {
                let infra_id = str_at(&m, "/spec/clusterName").unwrap_or_default();
                super::cloud::terminate(ctx, infra_id, name_of(&m))?;
            }
        }
        super::agent::release_agents_in(ctx, &hcp_ns).await?;
    }
    if let Some(n) = &ns_obj
        && !is_deleting(n)
    {
        ctx.kube.delete(&NAMESPACE, None, &hcp_ns).await?;
    }
    ctx.kube
        .delete(&SECRET, Some(ns), &format!("{name}-admin-kubeconfig"))
        .await?;
    if ns_obj.is_none() && pools.is_empty() {
        tracing::info!(
            namespace = ns,
            name,
            "hosted cluster torn down: removing finalizer"
        );
        super::oidc::withdraw_documents(ctx, hc).await?;
        remove_finalizers(ctx, &HOSTED_CLUSTER, hc, &[super::oidc::OIDC_FINALIZER, FINALIZER]).await?;
    }
    Ok(())
}

async fn update_status(
    ctx: &Ctx,
    hc: &Value,
    hcp: &Value,
    hcp_ns: &str,
) -> Result<(), OperatorError> {
    let ns = ns_of(hc);
    let name = name_of(hc);
    let conds = hc.pointer("/status/conditions");
    let sts = ctx.kube.get(&STATEFULSET, Some(hcp_ns), "etcd").await?;
    let members = sts
        .as_ref()
        .and_then(|s| s.pointer("/spec/replicas"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let ready = sts
        .as_ref()
        .and_then(|s| s.pointer("/status/readyReplicas"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let etcd_ok = members > 0 && ready * 2 > members;
    let key = super::hosted_api::key(ns, name);
    let kas_ok = ctx.hosted_api_up(&key);
    let available = etcd_ok && kas_ok;
    let image = str_at(hc, "/spec/release/image").unwrap_or("");
    let version = release_version(image);
    let now = objects::now();
    let prior = hc
        .pointer("/status/version/history/0")
        .filter(|h| str_at(h, "/image") == Some(image));
    let started = prior
        .and_then(|h| h.get("startedTime"))
        .cloned()
        .unwrap_or_else(|| json!(now));
    let completion = match prior
        .and_then(|h| h.get("completionTime"))
        .filter(|v| !v.is_null())
    {
        Some(t) => t.clone(),
        None if available => json!(now),
        None => Value::Null,
    };
    let state = if completion.is_null() {
        "Partial"
    } else {
        "Completed"
    };
    let ep = endpoint(ctx, hc);
    let status = json!({
        "conditions": [
            objects::condition(conds, "ReconciliationActive", true, "ReconciliationActive", "Reconciliation active on resource"),
            objects::condition(conds, "EtcdAvailable", etcd_ok, if etcd_ok { "QuorumAvailable" } else { "EtcdQuorumUnavailable" },
                &format!("{ready} of {members} etcd members ready")),
            objects::condition(conds, "KubeAPIServerAvailable", kas_ok, if kas_ok { "AsExpected" } else { "NotAvailable" },
                if kas_ok { "Kube APIServer deployment is available" } else { "Kube APIServer is not serving" }),
            objects::condition(conds, "Available", available, if available { "AsExpected" } else { "WaitingForAvailable" },
                if available { "The hosted control plane is available" } else { "Waiting for etcd and kube-apiserver" }),
            objects::condition(conds, "Degraded", false, "AsExpected", ""),
        ],
        "kubeconfig": {"name": format!("{name}-admin-kubeconfig")},
        "controlPlaneEndpoint": ep,
    });
    // `completionTime` is required and nullable: a merge patch's null would
    // delete it, so the version is written by a PUT of the status. It is
    // written before the conditions, so whoever sees Available=True also
    // sees the version it completed (HyperShift writes both in one update)
    let version_status = json!({
        "desired": {"image": image, "version": version},
        "history": [{"state": state, "image": image, "version": version, "startedTime": started,
            "completionTime": completion, "verified": false}],
        "observedGeneration": hc.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
        "availableUpdates": [],
    });
    let current = hc.pointer("/status/version").cloned().unwrap_or(Value::Null);
    if !super::workloads::status_subset(&version_status, &current) || current.pointer("/history/0/completionTime").is_none() {
        // as read just now, so nothing else of the status is lost
        let Some(mut fresh) = ctx.kube.get(&HOSTED_CLUSTER, Some(ns_of(hc)), name_of(hc)).await? else {
            return Ok(());
        };
        fresh["status"]["version"] = version_status;
        ctx.kube.replace_status(&HOSTED_CLUSTER, &fresh).await?;
    }
    patch_status_if_changed(ctx, &HOSTED_CLUSTER, hc, objects::observed(status, hc)).await?;
    let restored = etcd_restored_condition(ctx, hcp, sts.as_ref(), hcp_ns).await?;
    let mut hcp_conditions = vec![
        objects::condition(hcp.pointer("/status/conditions"), "EtcdAvailable", etcd_ok, if etcd_ok { "QuorumAvailable" } else { "EtcdQuorumUnavailable" }, ""),
        objects::condition(hcp.pointer("/status/conditions"), "KubeAPIServerAvailable", kas_ok, if kas_ok { "AsExpected" } else { "NotAvailable" }, ""),
        objects::condition(hcp.pointer("/status/conditions"), "Available", available, if available { "AsExpected" } else { "WaitingForAvailable" }, ""),
    ];
    hcp_conditions.extend(restored);
    let hcp_status = json!({
        "initialized": etcd_ok,
        "ready": available,
        "releaseImage": image,
        "version": version,
        "kubeConfig": {"name": "admin-kubeconfig", "key": "kubeconfig"},
        "controlPlaneEndpoint": ep,
        "conditions": hcp_conditions,
    });
    patch_status_if_changed(ctx, &HOSTED_CONTROL_PLANE, hcp, hcp_status).await
}

/// The HCP's `EtcdSnapshotRestored`, as the control-plane operator keeps
/// it: the one it has (set once), else, for an HCP restoring a snapshot,
/// the one [`super::etcd_init::restored_condition`] decides now (if any).
async fn etcd_restored_condition(ctx: &Ctx, hcp: &Value, sts: Option<&Value>, hcp_ns: &str) -> Result<Option<Value>, OperatorError> {
    let conds = hcp.pointer("/status/conditions");
    let existing = conds
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| str_at(c, "/type") == Some(super::etcd_init::RESTORED_CONDITION)));
    if let Some(c) = existing {
        return Ok(Some(c.clone()));
    }
    let Some(sts) = sts.filter(|_| super::etcd_init::computes_condition(hcp)) else {
        return Ok(None);
    };
    let pods = ctx.kube.list(&POD, Some(hcp_ns), Some("app=etcd")).await?;
    Ok(super::etcd_init::restored_condition(sts, &pods).map(|(status, reason)| {
        tracing::info!(namespace = hcp_ns, status, reason = %reason, "EtcdSnapshotRestored");
        let mut c = objects::condition(None, super::etcd_init::RESTORED_CONDITION, status, &reason, "");
        c["observedGeneration"] = hcp.pointer("/metadata/generation").cloned().unwrap_or(json!(1));
        c
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_until_follows_hypershift() {
        let now = Utc::now();
        assert_eq!(pause_state(None, now), Pause::No);
        assert_eq!(pause_state(Some("true"), now), Pause::Forever);
        assert_eq!(pause_state(Some("True"), now), Pause::Forever);
        assert_eq!(pause_state(Some("false"), now), Pause::No);
        assert_eq!(pause_state(Some("garbage"), now), Pause::No);
        assert_eq!(pause_state(Some("2000-01-01T00:00:00Z"), now), Pause::No);
        assert!(matches!(
            pause_state(Some("2999-01-01T00:00:00Z"), now),
            Pause::Until(_)
        ));
    }

    #[test]
    fn release_versions_and_names() {
        assert_eq!(
            release_version("quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64"),
            "4.16.10"
        );
        assert_eq!(release_version("registry:5000/img"), "0.0.0");
        assert_eq!(hcp_namespace("clusters", "hc1"), "clusters-hc1");
        let names = machine_names("np", "infra", 3);
        assert_eq!(names.len(), 3);
        assert!(
            names
                .iter()
                .all(|n| n.starts_with(&machine_set_name("np", "infra")))
        );
        assert_eq!(names, machine_names("np", "infra", 3));
    }

    #[test]
    fn etcd_init_joins_the_template_while_the_snapshot_is_not_restored() {
        let ns = "clusters-hc1";
        let sts = etcd_statefulset(ns, &json!({"metadata": {"name": "hc1", "uid": "u"}}), 3, "img");
        let mut hcp = json!({"metadata": {"name": "hc1"}, "spec": {"etcd": {"managementType": "Managed",
            "managed": {"storage": {"type": "PersistentVolume", "restoreSnapshotURL": ["https://s3/b/snap?X-Amz-Signature=x"]}}}}});
        let names = |cs: &[Value]| cs.iter().filter_map(|c| c["name"].as_str().map(str::to_string)).collect::<Vec<_>>();
        let shipped = etcd_init_containers(&sts, &hcp, ns, EtcdInit::Shipped);
        assert_eq!(names(&shipped), ["ensure-dns", "reset-member", "etcd-init"]);
        assert_eq!(shipped[2]["env"], json!([{"name": "RESTORE_URL_ETCD", "value": "https://s3/b/snap?X-Amz-Signature=x"}]));
        assert_eq!(shipped[2]["command"][2], super::super::etcd_init::SHIPPED_SCRIPT);
        let fixed = etcd_init_containers(&sts, &hcp, ns, EtcdInit::Fixed);
        assert_eq!(names(&fixed), ["ensure-dns", "etcd-init", "reset-member"]);
        let env = |name: &str| fixed[1]["env"].as_array().and_then(|e| e.iter().find(|v| v["name"] == name)).cloned().unwrap_or_default();
        assert_eq!(env("HCP_NAMESPACE")["value"], ns);
        assert_eq!(
            env("ETCD_INITIAL_CLUSTER")["value"],
            "etcd-0=https://etcd-0.etcd-discovery.clusters-hc1.svc:2380,etcd-1=https://etcd-1.etcd-discovery.clusters-hc1.svc:2380,etcd-2=https://etcd-2.etcd-discovery.clusters-hc1.svc:2380"
        );
        assert_eq!(env("HOSTNAME")["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
        hcp["status"] = json!({"conditions": [{"type": "EtcdSnapshotRestored", "status": "True", "reason": "AsExpected"}]});
        for mode in [EtcdInit::Shipped, EtcdInit::Fixed] {
            assert_eq!(names(&etcd_init_containers(&sts, &hcp, ns, mode)), ["ensure-dns", "reset-member"], "restored: gone");
        }
        let fresh = json!({"spec": {"etcd": {"managementType": "Managed", "managed": {"storage": {"type": "PersistentVolume"}}}}});
        assert_eq!(names(&etcd_init_containers(&sts, &fresh, ns, EtcdInit::Shipped)), ["ensure-dns", "reset-member"]);
    }

    #[test]
    fn etcd_statefulset_matches_the_reference_shape() {
        let hcp = json!({"metadata": {"name": "hc1", "uid": "u"}});
        let sts = etcd_statefulset("clusters-hc1", &hcp, 3, "img:4.16.10");
        assert_eq!(sts["spec"]["serviceName"], "etcd-discovery");
        assert_eq!(sts["spec"]["selector"]["matchLabels"]["app"], "etcd");
        assert_eq!(
            sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"],
            "Retain"
        );
        assert_eq!(
            sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
            "data"
        );
        assert_eq!(
            super::super::etcd_member::initial_cluster_names(&sts),
            vec!["etcd-0", "etcd-1", "etcd-2"]
        );
        let d = control_plane_deployment("ns", &hcp, "kube-apiserver", 3, "img");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
            6443
        );
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"]["hypershift.openshift.io/request-serving-component"],
            "true"
        );
    }
}
