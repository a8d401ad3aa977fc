//! The sandbox as a kubelet on a cluster that runs its own
//! kube-controller-manager and scheduler ([`Controllers::Cluster`]).
//!
//! There the cluster's Deployment, ReplicaSet, StatefulSet and Job
//! controllers make the pods, its scheduler binds them, its garbage
//! collector and namespace controller delete, and its PVC-protection and
//! PV binder controllers hold and bind claims. The sandbox only does what
//! the nodes and the storage of a real management cluster would:
//!
//! - it registers three Nodes `<cluster>-control-plane-0..2` (the first is
//!   the name the emulated mode gives its virtual node), one per zone
//!   (`topology.kubernetes.io/zone: <cluster>-zone-a/b/c`: a
//!   HighlyAvailable control plane's etcd members, and the pods hcp-dr
//!   seeds their volumes with, go one per node and per zone), labelled
//!   [`NODE_LABEL`] and tainted [`NODE_TAINT`] so that only pods placed
//!   there on purpose land on them, and renews their Leases in
//!   `kube-node-lease` as a kubelet does, so the node-lifecycle controller
//!   neither taints them nor evicts their pods;
//! - it admits the pods scheduled to them ([`admit`]): a loopback pod IP
//!   (for a StatefulSet pod, the one its claim was provisioned with) and
//!   `PodScheduled`, written through the status subresource; the etcd,
//!   restore, volume-mover and plain-pod kubelets then run them as in the
//!   emulated mode, and confirm their deletion once stopped;
//! - it provisions the claims of its StorageClasses as PersistentVolume
//!   objects pre-bound to the claim, which the cluster's binder binds
//!   ([`super::workloads`]), and deletes the volumes the binder released.
//!
//! Pods reach the sandbox's node only with [`placement`]: the demo
//! HostedCluster carries it as `spec.nodeSelector` and `spec.tolerations`,
//! which HyperShift (and the simulated operator) propagates to every
//! control-plane pod, and hcp-dr to its data movers. A HostedCluster
//! without it has its control plane scheduled to the cluster's real nodes,
//! where no etcd runs: the simulated operator warns about each one.
//!
//! No kubelet API is served (the node's kubelet port is 0), so the API
//! server cannot port-forward to these pods: `--etcd-access port-forward`
//! does not work in this mode; pod IPs are loopback addresses, reachable
//! from this machine only.
//!
//! [`Controllers::Cluster`]: super::Controllers::Cluster

use std::time::Duration;

use serde_json::{Value, json};

use super::objects::{self, NODE, POD, Res, is_deleting, name_of, ns_of, str_at};
use super::workloads::{POD_IP_ANNOTATION, alloc_pod_ip, pod_claims, sandbox_nodes};
use super::{Ctx, OperatorError, log_failure};

/// The label of the sandbox's Node, and the key of its taint.
pub const NODE_LABEL: &str = "sandbox.hcp-dr.io/kubelet";
/// The taint that keeps the cluster's other pods off the sandbox's Node.
pub const NODE_TAINT: &str = "sandbox.hcp-dr.io/kubelet=true:NoSchedule";
/// How often the Lease is renewed (a kubelet's default is 10 s of a 40 s lease).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// The Lease duration the node-lifecycle controller is told.
const LEASE_SECONDS: u64 = 40;
/// Where node Leases live.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

const LEASE: Res = Res::new("coordination.k8s.io", "v1", "Lease", "leases");

/// The `spec.nodeSelector` and `spec.tolerations` that put a hosted
/// control plane (and hcp-dr's data movers) on the sandbox's Node.
pub fn placement() -> (Value, Value) {
    (
        json!({NODE_LABEL: "true"}),
        json!([{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]),
    )
}

/// [`placement`] as `hcp-dr cluster create` flags, with the etcd volumes
/// in the sandbox's own StorageClass (an existing cluster's default class,
/// if it has one, is not one the sandbox provisions).
pub fn placement_args() -> Vec<String> {
    vec![
        "--node-selector".into(),
        format!("{NODE_LABEL}=true"),
        "--toleration".into(),
        format!("key={NODE_LABEL},operator=Exists,effect=NoSchedule"),
        "--etcd-storage-class".into(),
        super::workloads::LOCAL_CLASS.into(),
    ]
}

/// Whether `selector` (a pod's or HostedCluster's nodeSelector) sends pods
/// to the sandbox's Node.
pub fn selects_sandbox_node(selector: Option<&Value>) -> bool {
    selector.and_then(|s| s.get(NODE_LABEL)).and_then(Value::as_str) == Some("true")
}

/// A kubelet's MicroTime (`2006-01-02T15:04:05.000000Z`).
fn micro_now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn node_status(ctx: &Ctx, name: &str) -> Value {
    let now = objects::now();
    let resources = json!({"cpu": "64", "memory": "256Gi", "pods": "500", "ephemeral-storage": "1Ti"});
    let condition = |type_: &str, ok: bool, reason: &str, message: &str| {
        json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "capacity": resources, "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", false, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", false, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", false, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", true, "KubeletReady", "the hcp-dr sandbox runs the pods of this node"),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        // no kubelet API: the API server cannot exec or port-forward here
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": ctx.cfg.sandbox_id, "kernelVersion": "",
            "osImage": "hcp-dr sandbox", "containerRuntimeVersion": "hcp-dr-sandbox://0",
            "kubeletVersion": format!("v0.0.0-hcp-dr-sandbox-{}", env!("CARGO_PKG_VERSION")), "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": "amd64"},
    })
}

/// The Node (without `kubernetes.io/os`: the cluster's DaemonSets, which
/// tolerate every taint, mostly select on it and stay off).
fn node_object(ctx: &Ctx, name: &str, zone: &str) -> Value {
    let (key, rest) = NODE_TAINT.split_once('=').unwrap_or((NODE_TAINT, ""));
    let (value, effect) = rest.split_once(':').unwrap_or((rest, "NoSchedule"));
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {NODE_LABEL: "true", "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": zone, "sandbox.hcp-dr.io/cluster": ctx.cfg.cluster_name}},
        "spec": {"taints": [{"key": key, "value": value, "effect": effect}]},
        "status": node_status(ctx, name),
    })
}

/// Register the Nodes (or take over those an earlier run of this sandbox
/// left) and their Leases.
pub(crate) async fn register(ctx: &Ctx) -> Result<(), OperatorError> {
    for (name, zone) in sandbox_nodes(ctx) {
        if let Some(existing) = ctx.kube.get(&NODE, None, &name).await? {
            let ours = str_at(&existing, &format!("/metadata/labels/{}", NODE_LABEL.replace('/', "~1"))) == Some("true");
            if !ours {
                return Err(OperatorError::Invalid {
                    what: format!("Node {name} exists and is not the sandbox's (no label {NODE_LABEL}): remove it or use another cluster"),
                });
            }
        } else {
            ctx.kube.create(&NODE, None, node_object(ctx, &name, &zone)).await?;
            tracing::info!(cluster = %ctx.cfg.cluster_name, node = %name, zone = %zone, "registered a sandbox Node");
        }
        heartbeat_once(ctx, &name).await?;
    }
    Ok(())
}

async fn heartbeat_once(ctx: &Ctx, name: &str) -> Result<(), OperatorError> {
    ctx.kube.merge_status(&NODE, None, name, &json!({"status": node_status(ctx, name)})).await?;
    let now = micro_now();
    let patch = json!({"spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now}});
    match ctx.kube.get(&LEASE, Some(NODE_LEASE_NAMESPACE), name).await? {
        Some(_) => {
            ctx.kube.merge(&LEASE, Some(NODE_LEASE_NAMESPACE), name, &patch).await?;
        }
        None => {
            let node = ctx.kube.get(&NODE, None, name).await?.unwrap_or(Value::Null);
            let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": objects::uid_of(&node)}]},
                "spec": patch["spec"].clone()});
            lease["spec"]["acquireTime"] = json!(now);
            ctx.kube.create_if_absent(&LEASE, Some(NODE_LEASE_NAMESPACE), lease).await?;
        }
    }
    Ok(())
}

/// One heartbeat: the Leases renewed and the Nodes' conditions refreshed
/// (re-registered if someone deleted one).
pub(crate) async fn heartbeat(ctx: std::sync::Arc<Ctx>) -> Result<(), OperatorError> {
    for (name, _) in sandbox_nodes(&ctx) {
        if ctx.kube.get(&NODE, None, &name).await?.is_none() {
            return register(&ctx).await;
        }
        heartbeat_once(&ctx, &name).await?;
    }
    Ok(())
}

/// Delete the Nodes (the operator stops): the cluster's pod garbage
/// collector then deletes what was still bound to them, and their Leases
/// go with them (owned by the Nodes). `Nodes a, b, c` once removed.
pub(crate) async fn deregister(ctx: &Ctx) -> Option<String> {
    let mut removed = Vec::new();
    for (name, _) in sandbox_nodes(ctx) {
        match ctx.kube.delete(&NODE, None, &name).await {
            Ok(_) => {
                tracing::info!(cluster = %ctx.cfg.cluster_name, node = %name, "removed a sandbox Node");
                removed.push(name);
            }
            Err(e) => log_failure("kubelet", &name, &e),
        }
    }
    (!removed.is_empty()).then(|| format!("Node{} {}", if removed.len() == 1 { "" } else { "s" }, removed.join(", ")))
}

/// Give each pod scheduled to the sandbox's Node that has no address yet
/// its pod IP (a StatefulSet pod the one recorded on its first claim, as
/// the stand-in for its stable DNS name) and `PodScheduled`, as a kubelet's
/// first status update does; the pod's own kubelet (etcd, plain) starts it
/// next. Restore and volume-mover pods are admitted by their kubelets.
pub(crate) async fn admit(ctx: &Ctx, pods: &[Value], pvcs: &[Value]) {
    for pod in pods {
        if is_deleting(pod)
            || str_at(pod, "/status/podIP").is_some()
            || str_at(pod, "/status/phase").is_some_and(|p| p != "Pending")
            || super::restore_pod::is_restore_pod(pod)
            || super::volume_mover::is_mover_pod(pod)
            || !ctx.runs_here(pod)
        {
            continue;
        }
        let annotation = format!("/metadata/annotations/{}", POD_IP_ANNOTATION.replace('/', "~1"));
        let recorded = pod_claims(pod).iter().find_map(|claim| {
            let pvc = pvcs.iter().find(|c| ns_of(c) == ns_of(pod) && name_of(c) == claim)?;
            str_at(pvc, &annotation).map(str::to_string)
        });
        let admitted = async {
            let ip = match recorded {
                Some(ip) => ip,
                None => alloc_pod_ip(pod.get("spec").unwrap_or(&Value::Null))?.to_string(),
            };
            let status = json!({"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}], "startTime": objects::now(),
                "conditions": [objects::condition(pod.pointer("/status/conditions"), "PodScheduled", true, "", "")]});
            ctx.kube.merge_status(&POD, Some(ns_of(pod)), name_of(pod), &json!({"status": status})).await?;
            Ok::<(), OperatorError>(())
        };
        if let Err(e) = admitted.await {
            log_failure("kubelet", &format!("{}/{}", ns_of(pod), name_of(pod)), &e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placement_selects_the_node_and_tolerates_its_taint() {
        let (selector, tolerations) = placement();
        assert!(selects_sandbox_node(Some(&selector)));
        assert!(!selects_sandbox_node(Some(&json!({"kubernetes.io/os": "linux"}))));
        assert!(!selects_sandbox_node(None));
        let (key, _) = NODE_TAINT.split_once('=').expect("key=value:effect");
        assert_eq!(tolerations[0]["key"], key);
        assert_eq!(tolerations[0]["effect"], "NoSchedule");
        // the same placement as cluster create flags
        assert_eq!(placement_args(), [
            "--node-selector", "sandbox.hcp-dr.io/kubelet=true",
            "--toleration", "key=sandbox.hcp-dr.io/kubelet,operator=Exists,effect=NoSchedule",
            "--etcd-storage-class", "sandbox-local",
        ]);
    }

    #[test]
    fn micro_time_has_six_fraction_digits() {
        let t = micro_now();
        let frac = t.split('.').nth(1).expect("fraction");
        assert_eq!(frac.len(), 7, "{t}");
        assert!(t.ends_with('Z'));
    }
}
