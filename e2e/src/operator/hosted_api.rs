//! The hosted cluster's own API server.
//!
//! While the `kube-apiserver` Deployment of an HCP namespace has running pods
//! AND its etcd has quorum (ready members), an API server emulator runs on the
//! members (`https://<podIP>:2379`, key prefix `/kubernetes.io`, client TLS
//! from `etcd-client-tls`/`etcd-ca`, server name `etcd-client.<ns>.svc`). It is
//! stopped when kube-apiserver is scaled to zero or etcd loses quorum: the API
//! downtime of a backup is real and observable. A running server keeps its
//! endpoint list while those members exist and is restarted (a short outage)
//! when one of them is replaced by a pod with a new address.
//!
//! Its address is derived from the sandbox id, the management cluster's name
//! and the HostedCluster's namespace/name (a 127.251-254.x.y address, port
//! 6443): each management cluster has its own, as each real one has its own
//! load balancers, so a stale copy on mgmt-a and the restored copy on mgmt-b
//! serve at once (the split brain `hcp-dr fence` ends), and external-dns
//! moves the API hostname's record from one address to the other on a DNS
//! take-over. The admin token is derived from the sandbox id and
//! namespace/name only: a restored cluster keeps its credentials, as the
//! restored PKI keeps a real admin kubeconfig valid. The kubeconfig is
//! written to Secret `<name>-admin-kubeconfig` (HC namespace) and
//! `admin-kubeconfig` (HCP namespace).
//!
//! Inside the hosted cluster it keeps one Ready Node per NodePool replica and
//! one `ovnkube-node-*` pod per node in `openshift-ovn-kubernetes` (recreated
//! when deleted).
//!
//! Sandbox differences: the kubeconfig names the IP address, not
//! `api.<name>.<domain>` (no DNS resolution on loopback); nodes have no
//! kubelet behind them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};

use super::etcd_member::client_tls;
use super::hypershift::{self, hcp_namespace, machine_names, nodepool_replicas};
use super::objects::{
    self, HOSTED_CLUSTER, HOSTED_CONTROL_PLANE, Kube, NAMESPACE, NODE, NODE_POOL, POD, SECRET,
    STATEFULSET, is_deleting, name_of, ns_of, owner_ref, str_at,
};
use super::workloads::{is_etcd_pod, running_status};
use super::{Ctx, OperatorError, log_failure};
use crate::apiserver::{ApiServer, ApiServerConfig, EtcdClientTls, TokenUser};

/// Port of every hosted API server.
pub const HOSTED_API_PORT: u16 = 6443;
/// Namespace of the OVN node pods in hosted clusters.
pub const OVN_NAMESPACE: &str = "openshift-ovn-kubernetes";

/// A running hosted API server.
pub struct HostedApi {
    server: ApiServer,
    client: Kube,
    endpoints: Vec<String>,
}

/// What other controllers may read about a hosted API.
#[derive(Debug, Clone, Default)]
pub struct HostedStatus {
    /// The server is serving.
    pub up: bool,
    /// Ready nodes per NodePool name.
    pub ready_nodes: HashMap<String, usize>,
}

/// Map key of a HostedCluster.
pub fn key(hc_ns: &str, hc_name: &str) -> String {
    format!("{hc_ns}/{hc_name}")
}

fn digest(parts: &[&str]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

/// The stable address of a hosted API server on management cluster `mgmt`:
/// 127.(251..=254).x.(1..=254):6443.
pub fn hosted_api_address(sandbox_id: &str, mgmt: &str, hc_ns: &str, hc_name: &str) -> (IpAddr, u16) {
    let d = digest(&[sandbox_id, mgmt, hc_ns, hc_name, "address"]);
    let ip = Ipv4Addr::new(127, 251 + d[0] % 4, d[1], 1 + d[2] % 254);
    (IpAddr::V4(ip), HOSTED_API_PORT)
}

/// The stable admin bearer token of a hosted API server.
pub fn admin_token(sandbox_id: &str, hc_ns: &str, hc_name: &str) -> String {
    digest(&[sandbox_id, hc_ns, hc_name, "admin-token"])
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Ready nodes of `nodepool` in the hosted cluster `key`.
pub(crate) fn ready_nodes(ctx: &Ctx, key: &str, nodepool: &str) -> usize {
    ctx.hosted_up
        .lock()
        .ok()
        .and_then(|m| {
            m.get(key)
                .and_then(|s| s.ready_nodes.get(nodepool).copied())
        })
        .unwrap_or(0)
}

fn set_status(ctx: &Ctx, key: &str, status: Option<HostedStatus>) {
    if let Ok(mut m) = ctx.hosted_up.lock() {
        match status {
            Some(s) => {
                m.insert(key.to_string(), s);
            }
            None => {
                m.remove(key);
            }
        }
    }
}

/// What the HCP namespace offers a hosted API server right now.
struct Backend {
    /// kube-apiserver pods run and etcd has quorum.
    serving: bool,
    /// Client URLs of the ready etcd members.
    ready: Vec<String>,
    /// Client URLs of every etcd member pod that exists.
    existing: Vec<String>,
}

async fn observe_backend(ctx: &Ctx, hcp_ns: &str) -> Result<Backend, OperatorError> {
    let pods = ctx.kube.list(&POD, Some(hcp_ns), None).await?;
    let kas_running = pods.iter().any(|p| {
        str_at(p, "/metadata/labels/app") == Some("kube-apiserver")
            && str_at(p, "/status/phase") == Some("Running")
            && !is_deleting(p)
    });
    let members = match ctx.kube.get(&STATEFULSET, Some(hcp_ns), "etcd").await? {
        Some(sts) => sts
            .pointer("/spec/replicas")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize,
        None => 0,
    };
    let url = |p: &&Value| {
        str_at(p, "/status/podIP")
            .map(|ip| format!("https://{ip}:{}", super::etcd_member::CLIENT_PORT))
    };
    let etcd: Vec<&Value> = pods
        .iter()
        .filter(|p| is_etcd_pod(p) && !is_deleting(p))
        .collect();
    let mut ready: Vec<String> = etcd
        .iter()
        .filter(|p| objects::condition_true(p.pointer("/status/conditions"), "Ready"))
        .filter_map(url)
        .collect();
    ready.sort();
    let mut existing: Vec<String> = etcd.iter().filter_map(url).collect();
    existing.sort();
    let serving = kas_running && members > 0 && ready.len() * 2 > members;
    Ok(Backend {
        serving,
        ready,
        existing,
    })
}

/// One pass over every HostedCluster.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let hcs = ctx.kube.list(&HOSTED_CLUSTER, None, None).await?;
    let nps = ctx.kube.list(&NODE_POOL, None, None).await?;
    let mut hosted = ctx.hosted.lock().await;
    // HostedClusters that are gone.
    let known: Vec<String> = hcs.iter().map(|h| key(ns_of(h), name_of(h))).collect();
    let gone: Vec<String> = hosted
        .keys()
        .filter(|k| !known.contains(k))
        .cloned()
        .collect();
    for k in gone {
        if let Some(h) = hosted.remove(&k) {
            stop(&ctx, &k, h, "its HostedCluster is gone").await;
        }
    }
    for hc in &hcs {
        let k = key(ns_of(hc), name_of(hc));
        let hcp_ns = hcp_namespace(ns_of(hc), name_of(hc));
        let backend = match observe_backend(&ctx, &hcp_ns).await {
            Ok(b) => b,
            Err(e) => {
                log_failure("hosted-api", &k, &e);
                continue;
            }
        };
        // A running server keeps its etcd endpoints while they exist (a
        // restart is an outage); it is stopped when kube-apiserver is gone or
        // quorum is lost, and restarted when one of its members was replaced.
        let stop_reason = match hosted.get(&k) {
            Some(_) if !backend.serving => Some("kube-apiserver is down or etcd has no quorum"),
            Some(h) if h.endpoints.iter().any(|e| !backend.existing.contains(e)) => {
                Some("an etcd member was replaced")
            }
            _ => None,
        };
        if let Some(reason) = stop_reason
            && let Some(h) = hosted.remove(&k)
        {
            stop(&ctx, &k, h, reason).await;
        }
        if backend.serving && !hosted.contains_key(&k) {
            start_logged(&ctx, hc, &hcp_ns, backend.ready, &mut hosted).await;
        }
        if let Some(h) = hosted.get(&k) {
            match sync_hosted_objects(hc, &nps, h).await {
                Ok(ready) => set_status(
                    &ctx,
                    &k,
                    Some(HostedStatus {
                        up: true,
                        ready_nodes: ready,
                    }),
                ),
                Err(e) => log_failure("hosted-api", &k, &e),
            }
        }
    }
    Ok(())
}

async fn start_logged(
    ctx: &Ctx,
    hc: &Value,
    hcp_ns: &str,
    endpoints: Vec<String>,
    hosted: &mut HashMap<String, HostedApi>,
) {
    let k = key(ns_of(hc), name_of(hc));
    match start(ctx, hc, hcp_ns, endpoints).await {
        Ok(h) => {
            tracing::info!(cluster = %k, url = h.server.url(), "hosted API server started");
            set_status(
                ctx,
                &k,
                Some(HostedStatus {
                    up: true,
                    ready_nodes: HashMap::new(),
                }),
            );
            hosted.insert(k, h);
        }
        Err(e) => log_failure("hosted-api", &k, &e),
    }
}

async fn start(
    ctx: &Ctx,
    hc: &Value,
    hcp_ns: &str,
    endpoints: Vec<String>,
) -> Result<HostedApi, OperatorError> {
    let (ns, name) = (ns_of(hc), name_of(hc));
    let (ip, port) = hosted_api_address(&ctx.cfg.sandbox_id, &ctx.cfg.cluster_name, ns, name);
    let tls = client_tls(ctx, hcp_ns, format!("etcd-client.{hcp_ns}.svc")).await?;
    let server = ApiServer::start(ApiServerConfig {
        cluster_name: name.to_string(),
        bind_ip: ip,
        port,
        etcd_endpoints: endpoints.clone(),
        etcd_tls: Some(EtcdClientTls {
            ca_pem: tls.ca_pem,
            cert_pem: tls.cert_pem,
            key_pem: tls.key_pem,
            server_name: tls.server_name,
        }),
        key_prefix: "/kubernetes.io".into(),
        crd_dirs: Vec::new(),
        ca: ctx.cfg.ca.clone(),
        tokens: vec![TokenUser {
            token: admin_token(&ctx.cfg.sandbox_id, ns, name),
            user: "system:admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }],
        faults_file: None,
        audit_log: None,
    })
    .await?;
    let client = Kube::new(server.client().await?);
    let hosted = HostedApi {
        server,
        client,
        endpoints,
    };
    write_kubeconfigs(ctx, hc, hcp_ns, &hosted.server.kubeconfig("admin")).await?;
    Ok(hosted)
}

async fn stop(ctx: &Ctx, key: &str, h: HostedApi, reason: &str) {
    tracing::info!(cluster = key, reason, "stopping hosted API server");
    set_status(ctx, key, None);
    h.server.shutdown().await;
}

/// Stop every hosted API server.
pub(crate) async fn stop_all(ctx: &Ctx) {
    let mut hosted = ctx.hosted.lock().await;
    let all: Vec<(String, HostedApi)> = hosted.drain().collect();
    for (k, h) in all {
        stop(ctx, &k, h, "operator shutdown").await;
    }
}

async fn upsert_secret(ctx: &Ctx, secret: Value) -> Result<(), OperatorError> {
    let ns = ns_of(&secret).to_string();
    let name = name_of(&secret).to_string();
    match ctx.kube.get(&SECRET, Some(&ns), &name).await? {
        None => {
            ctx.kube.create(&SECRET, Some(&ns), secret).await?;
        }
        Some(existing) if existing.get("data") != secret.get("data") => {
            ctx.kube
                .merge(
                    &SECRET,
                    Some(&ns),
                    &name,
                    &json!({"data": secret.get("data")}),
                )
                .await?;
        }
        Some(_) => {}
    }
    Ok(())
}

async fn write_kubeconfigs(
    ctx: &Ctx,
    hc: &Value,
    hcp_ns: &str,
    kubeconfig: &str,
) -> Result<(), OperatorError> {
    let data = json!({"kubeconfig": base64::engine::general_purpose::STANDARD.encode(kubeconfig)});
    let (ns, name) = (ns_of(hc), name_of(hc));
    upsert_secret(
        ctx,
        json!({"metadata": {"name": format!("{name}-admin-kubeconfig"), "namespace": ns,
        "labels": {"hypershift.openshift.io/kubeconfig": "external"},
        "ownerReferences": [owner_ref(&HOSTED_CLUSTER, hc)]}, "type": "Opaque", "data": data}),
    )
    .await?;
    let hcp = ctx
        .kube
        .get(&HOSTED_CONTROL_PLANE, Some(hcp_ns), name)
        .await?;
    let owners = hcp
        .map(|h| json!([owner_ref(&HOSTED_CONTROL_PLANE, &h)]))
        .unwrap_or(json!([]));
    upsert_secret(
        ctx,
        json!({"metadata": {"name": "admin-kubeconfig", "namespace": hcp_ns,
        "labels": {"hypershift.openshift.io/kubeconfig": "external"}, "ownerReferences": owners},
        "type": "Opaque", "data": data}),
    )
    .await
}

/// Nodes per NodePool replica and one OVN pod per node; returns ready nodes per pool.
async fn sync_hosted_objects(
    hc: &Value,
    nps: &[Value],
    h: &HostedApi,
) -> Result<HashMap<String, usize>, OperatorError> {
    let hk = &h.client;
    let infra_id = str_at(hc, "/spec/infraID").unwrap_or(name_of(hc));
    let version = hypershift::release_version(str_at(hc, "/spec/release/image").unwrap_or(""));
    let mut wanted: HashMap<String, String> = HashMap::new(); // node -> pool
    for np in nps
        .iter()
        .filter(|np| ns_of(np) == ns_of(hc) && str_at(np, "/spec/clusterName") == Some(name_of(hc)))
    {
        for n in machine_names(name_of(np), infra_id, nodepool_replicas(np)) {
            wanted.insert(n, name_of(np).to_string());
        }
    }
    let label = hypershift::NODEPOOL_LABEL;
    let nodes = hk.list(&NODE, None, None).await?;
    let mut ready: HashMap<String, usize> = HashMap::new();
    for (node, pool) in &wanted {
        let existing = nodes.iter().find(|n| name_of(n) == node);
        if existing.is_none() {
            hk.create(&NODE, None, json!({"metadata": {"name": node, "labels": {
                    label: pool, "kubernetes.io/hostname": node, "node-role.kubernetes.io/worker": "",
                    "kubernetes.io/os": "linux"}},
                "spec": {"providerID": format!("sandbox://{node}")}}))
            .await?;
        }
        let status_ok = existing
            .is_some_and(|n| objects::condition_true(n.pointer("/status/conditions"), "Ready"));
        if !status_ok {
            let now = objects::now();
            hk.merge_status(&NODE, None, node, &json!({"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "nodeInfo": {"kubeletVersion": format!("v{version}"), "operatingSystem": "linux", "architecture": "amd64",
                    "containerRuntimeVersion": "cri-o://sandbox", "kernelVersion": "", "kubeProxyVersion": "", "osImage": "sandbox",
                    "machineID": "", "systemUUID": "", "bootID": ""},
                "addresses": [{"type": "Hostname", "address": node}]}}))
            .await?;
        }
        *ready.entry(pool.clone()).or_default() += 1;
    }
    let label_ptr = format!("/metadata/labels/{}", label.replace('/', "~1"));
    for n in &nodes {
        if str_at(n, &label_ptr).is_some() && !wanted.contains_key(name_of(n)) {
            hk.delete(&NODE, None, name_of(n)).await?;
        }
    }
    // OVN node pods (a DaemonSet in a real cluster).
    hk.create_if_absent(
        &NAMESPACE,
        None,
        json!({"metadata": {"name": OVN_NAMESPACE}}),
    )
    .await?;
    let pods = hk.list(&POD, Some(OVN_NAMESPACE), None).await?;
    for node in wanted.keys() {
        let has = pods
            .iter()
            .any(|p| str_at(p, "/spec/nodeName") == Some(node.as_str()) && !is_deleting(p));
        if has {
            continue;
        }
        let pod = json!({"metadata": {"name": format!("ovnkube-node-{}", random_suffix()), "namespace": OVN_NAMESPACE,
                "labels": {"app": "ovnkube-node", "component": "network"}},
            "spec": {"nodeName": node, "containers": [
                {"name": "ovnkube-controller", "image": "ovn-kubernetes"}, {"name": "ovn-controller", "image": "ovn-kubernetes"}]}});
        let created = hk.create(&POD, Some(OVN_NAMESPACE), pod).await?;
        let status = running_status(&created, "10.128.0.2", true);
        hk.merge_status(
            &POD,
            Some(OVN_NAMESPACE),
            name_of(&created),
            &json!({"status": status}),
        )
        .await?;
    }
    for p in &pods {
        if str_at(p, "/metadata/labels/app") == Some("ovnkube-node")
            && !str_at(p, "/spec/nodeName").is_some_and(|n| wanted.contains_key(n))
            && !is_deleting(p)
        {
            hk.delete(&POD, Some(OVN_NAMESPACE), name_of(p)).await?;
        }
    }
    Ok(ready)
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_and_token_are_stable_per_sandbox_and_cluster() {
        let a = hosted_api_address("sb1", "mgmt-a", "clusters", "hc1");
        assert_eq!(a, hosted_api_address("sb1", "mgmt-a", "clusters", "hc1"));
        assert_ne!(a, hosted_api_address("sb2", "mgmt-a", "clusters", "hc1"));
        // each management cluster has its own load balancer address
        assert_ne!(a, hosted_api_address("sb1", "mgmt-b", "clusters", "hc1"));
        let IpAddr::V4(v4) = a.0 else {
            panic!("expected IPv4")
        };
        assert_eq!(v4.octets()[0], 127);
        assert!(v4.octets()[1] >= 251);
        assert_eq!(a.1, 6443);
        assert_eq!(
            admin_token("sb1", "clusters", "hc1"),
            admin_token("sb1", "clusters", "hc1")
        );
        assert_ne!(
            admin_token("sb1", "clusters", "hc1"),
            admin_token("sb1", "clusters", "hc2")
        );
    }
}
