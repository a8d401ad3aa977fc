//! The "kubelet" for etcd pods: every pod of the `etcd` StatefulSet of a
//! hosted control plane runs its init containers, then a REAL etcd process.
//!
//! Per pod, a supervisor task does what the kubelet does:
//! 1. Mounts: the TLS files, the claim's directory (`/var/lib`), the peers'
//!    addresses; until they exist the pod stays initializing.
//! 2. The init containers, in the order of the pod's spec, each until it
//!    succeeds (a failure is restarted after a back-off, CrashLoopBackOff in
//!    `initContainerStatuses` with the last termination's exit code and
//!    message), reported in `initContainerStatuses`:
//!    - `reset-member`, as its script: nothing when
//!      `/var/lib/data/member/snap/db` exists; else, when the cluster answers
//!      through the *ready* members (the `etcd-client` Service only routes to
//!      ready pods) and lists a member of this pod's name, that member is
//!      removed and this pod added again, and etcd starts with
//!      `initial-cluster-state=existing`. The data directory is never deleted.
//!    - `etcd-init` (only when the pod has it: the StatefulSet template
//!      carries it while the HCP restores, see [`super::etcd_init`]): the
//!      shipped or fixed script's steps, from the `RESTORE_URL_ETCD` of its
//!      own env.
//!    - anything else (`ensure-dns`) completes at once.
//! 3. etcd runs on `https://<podIP>:2379` (clients) and `:2380` (peers) with
//!    the server certificate of Secret `etcd-server-tls` (no IP SANs, as real),
//!    client certificate auth against ConfigMap `etcd-ca`, data in the PVC's
//!    directory (`<pv>/data`, the real `/var/lib/data`), its initial cluster
//!    the StatefulSet's members (ignored by etcd when the data directory
//!    already holds a member: what a restore put there wins).
//! 4. The pod is Ready once the member answers a status request over TLS
//!    (with a leader) and stays Ready until that check has failed for the
//!    etcd container's readiness probe threshold (`failureThreshold x
//!    periodSeconds`, 75 s in HyperShift's StatefulSet), as a kubelet
//!    probes; a process that exits is restarted with backoff (CrashLoopBackOff and the
//!    restart count are visible in `containerStatuses`); a deleted pod's
//!    process is killed.
//!
//! Sandbox differences: members address each other by pod IP (real ones use
//! `<pod>.etcd-discovery.<ns>.svc`), so the kubelet issues each member a peer
//! certificate from the `etcd-signer` CA that adds the pod IP and 127.0.0.1 to
//! the DNS names of `etcd-peer-tls`; members do not listen on localhost (they
//! share one machine); the `etcd-metrics` and `healthz` containers are only
//! reported, not run; `reset-member` also adds this pod to a cluster that
//! lists neither it nor enough members (a removal whose reply was lost), where
//! the real script would leave it to crash-loop.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::objects::{
    self, CONFIGMAP, POD, PVC, SECRET, STATEFULSET, is_deleting, name_of,
    ns_of, str_at, uid_of,
};
use super::workloads::{POD_IP_ANNOTATION, existing_pv_dir, is_etcd_pod};
use super::{Ctx, OperatorError, io_err};
use crate::pki::{Ca, CertPair, CertSpec};
use crate::procs::etcd::{ClientTls, ClusterState, EtcdMemberConfig, EtcdProcess, EtcdTls};

/// A file in the state directory that makes the next `reset-member` of a
/// pod with no data find no cluster ([`crate::sandbox::Sandbox::fail_next_reset_member`]).
pub const RESET_UNREACHABLE_MARKER: &str = "reset-member-unreachable";

/// etcd client port (as in HyperShift).
pub const CLIENT_PORT: u16 = 2379;
/// etcd peer port.
pub const PEER_PORT: u16 = 2380;
/// `ETCD_QUOTA_BACKEND_BYTES` of hosted etcd (8 GiB).
pub const QUOTA_BACKEND_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// A running supervisor of one etcd pod.
pub struct MemberHandle {
    task: JoinHandle<()>,
}

/// Whether the pod with this uid has a supervisor (its process may run).
pub(crate) fn is_supervised(ctx: &Ctx, uid: &str) -> bool {
    ctx.members
        .lock()
        .map(|m| m.contains_key(uid))
        .unwrap_or(false)
}

/// One pass: start supervisors for new etcd pods, stop those of deleted pods.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let pods = ctx.pods_here(ctx.kube.list(&POD, None, None).await?);
    let etcd_pods: Vec<&Value> = pods.iter().filter(|p| is_etcd_pod(p)).collect();
    let live: std::collections::HashMap<&str, &Value> = etcd_pods
        .iter()
        .filter(|p| !is_deleting(p) && str_at(p, "/status/podIP").is_some())
        .map(|p| (uid_of(p), *p))
        .collect();
    let mut stopped = Vec::new();
    {
        let mut members = ctx
            .members
            .lock()
            .map_err(|_| OperatorError::Waiting("member table poisoned".into()))?;
        let gone: Vec<String> = members
            .keys()
            .filter(|uid| !live.contains_key(uid.as_str()))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(h) = members.remove(&uid) {
                h.task.abort();
                stopped.push(h.task);
            }
        }
        for (uid, pod) in &live {
            if members.contains_key(*uid) {
                continue;
            }
            let Some(ip) = str_at(pod, "/status/podIP").and_then(|s| s.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let member = Member {
                ctx: ctx.clone(),
                ns: ns_of(pod).to_string(),
                pod: name_of(pod).to_string(),
                ip,
                dir: ctx
                    .cfg
                    .state_dir
                    .join("pods")
                    .join(ns_of(pod))
                    .join(format!("{}-{}", name_of(pod), uid)),
                containers: pod
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .map(|cs| {
                        cs.iter()
                            .filter_map(|c| {
                                c.get("name").and_then(Value::as_str).map(str::to_string)
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                uid: uid.to_string(),
                init_statuses: Vec::new(),
                init_containers: pod
                    .pointer("/spec/initContainers")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                unready_after: unready_after(pod),
            };
            tracing::info!(namespace = %member.ns, pod = %member.pod, %ip, "starting etcd member supervisor");
            members.insert(
                uid.to_string(),
                MemberHandle {
                    task: tokio::spawn(member.supervise()),
                },
            );
        }
    }
    for t in stopped {
        // Wait until the process is killed (the task dropped it).
        let _ = t.await;
    }
    // Pods being deleted whose process is now stopped: confirm the deletion.
    for pod in etcd_pods.iter().filter(|p| is_deleting(p)) {
        if !is_supervised(&ctx, uid_of(pod)) {
            super::workloads::delete_now(&ctx, &POD, ns_of(pod), name_of(pod)).await?;
        }
    }
    Ok(())
}

/// Kill every member process.
pub(crate) async fn stop_all(ctx: &Ctx) {
    let handles: Vec<MemberHandle> = match ctx.members.lock() {
        Ok(mut m) => m.drain().map(|(_, h)| h).collect(),
        Err(_) => Vec::new(),
    };
    for h in &handles {
        h.task.abort();
    }
    for h in handles {
        let _ = h.task.await;
    }
}

/// Decode `data[key]` of a Secret or `data[key]` of a ConfigMap.
pub(crate) fn secret_data(secret: &Value, key: &str) -> Option<String> {
    let b64 = secret.get("data")?.get(key)?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

pub(crate) fn configmap_data(cm: &Value, key: &str) -> Option<String> {
    cm.get("data")?.get(key)?.as_str().map(str::to_string)
}

/// A cert/key pair from a Secret.
pub(crate) async fn secret_pair(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    crt: &str,
    key: &str,
) -> Result<CertPair, OperatorError> {
    let secret = ctx
        .kube
        .get(&SECRET, Some(ns), name)
        .await?
        .ok_or_else(|| OperatorError::Waiting(format!("Secret {ns}/{name}")))?;
    match (secret_data(&secret, crt), secret_data(&secret, key)) {
        (Some(cert_pem), Some(key_pem)) => Ok(CertPair { cert_pem, key_pem }),
        _ => Err(OperatorError::Invalid {
            what: format!("Secret {ns}/{name}: missing {crt} or {key}"),
        }),
    }
}

/// The CA bundle of ConfigMap `etcd-ca`.
pub(crate) async fn etcd_ca_pem(ctx: &Ctx, ns: &str) -> Result<String, OperatorError> {
    let cm = ctx
        .kube
        .get(&CONFIGMAP, Some(ns), "etcd-ca")
        .await?
        .ok_or_else(|| OperatorError::Waiting(format!("ConfigMap {ns}/etcd-ca")))?;
    configmap_data(&cm, "ca.crt").ok_or_else(|| OperatorError::Invalid {
        what: format!("ConfigMap {ns}/etcd-ca has no ca.crt"),
    })
}

/// Client TLS for the members of `ns` (Secret `etcd-client-tls`, ConfigMap
/// `etcd-ca`), verifying the server as `server_name`.
pub(crate) async fn client_tls(
    ctx: &Ctx,
    ns: &str,
    server_name: String,
) -> Result<ClientTls, OperatorError> {
    let ca_pem = etcd_ca_pem(ctx, ns).await?;
    let pair = secret_pair(
        ctx,
        ns,
        "etcd-client-tls",
        "etcd-client.crt",
        "etcd-client.key",
    )
    .await?;
    Ok(ClientTls {
        ca_pem,
        cert_pem: pair.cert_pem,
        key_pem: pair.key_pem,
        server_name,
    })
}

/// The etcd signer CA of an HCP namespace (Secret `etcd-signer`).
pub(crate) async fn load_signer(ctx: &Ctx, ns: &str) -> Result<Ca, OperatorError> {
    let pair = secret_pair(ctx, ns, "etcd-signer", "tls.crt", "tls.key").await?;
    ca_from_pair(&ctx.cfg.state_dir, ns, &pair)
}

/// Load a CA from PEMs (via `Ca::load` on a private directory).
pub(crate) fn ca_from_pair(
    state_dir: &Path,
    ns: &str,
    pair: &CertPair,
) -> Result<Ca, OperatorError> {
    let dir = state_dir.join("signers").join(ns);
    std::fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    write_private(&dir.join("ca.crt"), &pair.cert_pem)?;
    write_private(&dir.join("ca.key"), &pair.key_pem)?;
    Ok(Ca::load(&dir)?)
}

fn write_private(path: &Path, text: &str) -> Result<(), OperatorError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).map_err(io_err("writing", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err("chmod", path))
}

/// The member names of `ETCD_INITIAL_CLUSTER` in the StatefulSet's `etcd`
/// container (falling back to `etcd-0..replicas`).
pub(crate) fn initial_cluster_names(sts: &Value) -> Vec<String> {
    let containers = sts
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array);
    let env_value = containers
        .into_iter()
        .flatten()
        .filter(|c| c.get("name").and_then(Value::as_str) == Some("etcd"))
        .find_map(|c| {
            c.get("env")?.as_array()?.iter().find_map(|e| {
                (e.get("name").and_then(Value::as_str) == Some("ETCD_INITIAL_CLUSTER"))
                    .then(|| e.get("value").and_then(Value::as_str))
                    .flatten()
            })
        });
    match env_value {
        Some(v) => v
            .split(',')
            .filter_map(|m| m.split_once('=').map(|(n, _)| n.trim().to_string()))
            .filter(|n| !n.is_empty())
            .collect(),
        None => {
            let n = sts
                .pointer("/spec/replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            (0..n).map(|i| format!("{}-{i}", name_of(sts))).collect()
        }
    }
}

/// An entry of `initContainerStatuses`.
fn init_status(container: &Value, state: Value, ready: bool, restarts: u32, last: Option<Value>) -> Value {
    let mut s = json!({"name": str_at(container, "/name").unwrap_or_default(), "image": str_at(container, "/image").unwrap_or_default(),
        "imageID": "", "ready": ready, "started": state.get("running").is_some(), "restartCount": restarts, "state": state});
    if let Some(last) = last {
        s["lastState"] = last;
    }
    s
}

fn backoff(attempt: u32) -> Duration {
    // The kubelet's 10s..5min, scaled down for the sandbox.
    Duration::from_millis((500u64 << attempt.min(6)).min(20_000))
}

/// What `reset-member` found.
enum Reset {
    /// The member has data: nothing to do.
    HasData,
    /// No ready member answered: first start (or a restore).
    NoCluster,
    /// The cluster answered and has no member of this name: start as new.
    NotMember,
    /// The old member was replaced; join with this initial cluster.
    Rejoined(Vec<(String, String)>),
}

struct Member {
    ctx: Arc<Ctx>,
    ns: String,
    pod: String,
    uid: String,
    ip: IpAddr,
    dir: PathBuf,
    containers: Vec<String>,
    /// The pod's init containers, in the order they run.
    init_containers: Vec<Value>,
    /// Their `initContainerStatuses`, as last reported.
    init_statuses: Vec<Value>,
    /// How long the readiness check must fail, without a success, before a
    /// Ready member is reported not ready ([`unready_after`]).
    unready_after: Duration,
}

/// How long a running etcd container's readiness probe fails before the
/// kubelet marks it not ready: `failureThreshold x periodSeconds` of the
/// etcd container's `readinessProbe` (HyperShift's: 15 x 5 s), Kubernetes'
/// defaults (3 x 10 s) without one. A leader election or a slow answer
/// does not take a member out of the `etcd-client` Service, as on a real
/// cluster; a container that exits is not ready at once.
fn unready_after(pod: &Value) -> Duration {
    let probe = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| str_at(c, "/name") == Some("etcd")))
        .and_then(|c| c.get("readinessProbe"));
    let field = |name: &str, default: u64| probe.and_then(|p| p.get(name)).and_then(Value::as_u64).unwrap_or(default);
    Duration::from_secs(field("failureThreshold", 3) * field("periodSeconds", 10))
}

/// What the pod's volumes and certificates are, once they can be mounted.
struct Mounted {
    /// The claim's directory (`/var/lib`).
    pv: PathBuf,
    /// The initial cluster of the etcd container (peer URLs as pod IPs).
    initial: Vec<(String, String)>,
    tls: EtcdTls,
}

/// How an init container run ended, for the pod's status.
enum InitEnd {
    Completed,
    /// A non-zero exit code and the termination message.
    Failed(i32, String),
}

impl Member {
    fn own_peer_url(&self) -> String {
        format!("https://{}:{PEER_PORT}", self.ip)
    }

    async fn supervise(mut self) {
        let mut attempt = 0u32;
        let mut last_error = String::new();
        self.init_statuses = self.init_containers.iter().map(|c| init_status(c, json!({"waiting": {"reason": "PodInitializing"}}), false, 0, None)).collect();
        let mounted = loop {
            match self.mount().await {
                Ok(m) => break m,
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(namespace = %self.ns, pod = %self.pod, "etcd pod: {text}");
                        last_error = text.clone();
                    }
                    self.report(
                        json!({"waiting": {"reason": "PodInitializing", "message": text}}),
                        None,
                        false,
                        0,
                        false,
                    )
                    .await;
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        };
        let cfg = self.run_init_containers(mounted).await;
        let mut restarts = 0u32;
        let mut last_state: Option<Value> = None;
        loop {
            let started_at = objects::now();
            match EtcdProcess::start(cfg.clone()) {
                Ok(mut proc) => {
                    let running = json!({"running": {"startedAt": started_at}});
                    let mut reported: Option<bool> = None;
                    let mut failing_since: Option<std::time::Instant> = None;
                    while proc.is_running() {
                        let answered = self.healthy().await;
                        failing_since = if answered { None } else { failing_since.or(Some(std::time::Instant::now())) };
                        // Ready from the first success; not ready again only
                        // once the probe has failed for its whole threshold.
                        let healthy = answered
                            || (reported == Some(true)
                                && failing_since.is_some_and(|t| t.elapsed() < self.unready_after));
                        if reported != Some(healthy) {
                            self.report(
                                running.clone(),
                                last_state.clone(),
                                healthy,
                                restarts,
                                true,
                            )
                            .await;
                            reported = Some(healthy);
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    tracing::warn!(namespace = %self.ns, pod = %self.pod, "etcd exited; last log lines:\n{}", proc.log_tail(15));
                }
                Err(e) => {
                    tracing::warn!(namespace = %self.ns, pod = %self.pod, "starting etcd: {e}")
                }
            }
            restarts = restarts.saturating_add(1);
            last_state = Some(
                json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": started_at,
                "finishedAt": objects::now()}}),
            );
            let message = format!(
                "back-off restarting failed container etcd in pod {}_{}",
                self.pod, self.ns
            );
            self.report(
                json!({"waiting": {"reason": "CrashLoopBackOff", "message": message}}),
                last_state.clone(),
                false,
                restarts,
                true,
            )
            .await;
            tokio::time::sleep(backoff(restarts)).await;
        }
    }

    /// Patch the pod status: the etcd container's state, readiness, restarts.
    async fn report(
        &self,
        state: Value,
        last_state: Option<Value>,
        ready: bool,
        restarts: u32,
        initialized: bool,
    ) {
        let now = objects::now();
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                if c == "etcd" {
                    let mut s = json!({"name": c, "image": "etcd", "imageID": "", "ready": ready,
                        "started": state.get("running").is_some(), "restartCount": restarts, "state": state});
                    if let Some(l) = &last_state {
                        s["lastState"] = l.clone();
                    }
                    s
                } else {
                    json!({"name": c, "image": c, "imageID": "", "ready": initialized, "started": initialized, "restartCount": 0,
                        "state": if initialized { json!({"running": {"startedAt": now}}) } else { json!({"waiting": {"reason": "PodInitializing"}}) }})
                }
            })
            .collect();
        let cond = |t: &str, s: bool| json!({"type": t, "status": if s { "True" } else { "False" }, "lastTransitionTime": now});
        let mut init_cond = cond("Initialized", initialized);
        if !initialized {
            let pending: Vec<&str> = self
                .init_statuses
                .iter()
                .filter(|s| s.get("ready").and_then(Value::as_bool) != Some(true))
                .filter_map(|s| str_at(s, "/name"))
                .collect();
            init_cond["reason"] = json!("ContainersNotInitialized");
            init_cond["message"] = json!(format!("containers with incomplete status: [{}]", pending.join(" ")));
        }
        let status = json!({
            "phase": if initialized { "Running" } else { "Pending" },
            "podIP": self.ip.to_string(), "podIPs": [{"ip": self.ip.to_string()}],
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "conditions": [cond("PodScheduled", true), init_cond, cond("ContainersReady", ready), cond("Ready", ready)],
            "initContainerStatuses": self.init_statuses,
            "containerStatuses": statuses,
        });
        if let Err(e) = self
            .ctx
            .kube
            .merge_status(&POD, Some(&self.ns), &self.pod, &json!({"status": status}))
            .await
        {
            tracing::debug!(namespace = %self.ns, pod = %self.pod, "pod status: {e}");
        }
    }

    /// The member answers a status request over TLS (as the readiness probe).
    async fn healthy(&self) -> bool {
        let Ok(tls) = client_tls(
            &self.ctx,
            &self.ns,
            format!("{}.etcd-discovery.{}.svc", self.pod, self.ns),
        )
        .await
        else {
            return false;
        };
        let url = format!("https://{}:{CLIENT_PORT}", self.ip);
        let check = async {
            let mut client = crate::procs::etcd::connect_client(&[url], Some(&tls))
                .await
                .ok()?;
            let status = client.status().await.ok()?;
            (status.leader() != 0 && status.errors().is_empty()).then_some(())?;
            client.get("health", None).await.ok()
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(3), check).await,
            Ok(Some(_))
        )
    }

    /// What the pod needs before its first container runs: its TLS files
    /// (the peer certificate the sandbox issues for the pod IP), its claim's
    /// directory and the addresses of its peers. Errors: not yet (the pod
    /// stays initializing, retried).
    async fn mount(&self) -> Result<Mounted, OperatorError> {
        let ctx = &self.ctx;
        let ns = self.ns.as_str();
        let tls_dir = self.dir.join("tls");
        std::fs::create_dir_all(&tls_dir).map_err(io_err("creating", &tls_dir))?;
        let ca_pem = etcd_ca_pem(ctx, ns).await?;
        let server = secret_pair(ctx, ns, "etcd-server-tls", "server.crt", "server.key").await?;
        let signer = load_signer(ctx, ns).await?;
        let peer = signer.issue(&CertSpec {
            common_name: format!("{}.etcd-discovery.{ns}.svc", self.pod),
            organization: None,
            dns_names: vec![
                format!("*.etcd-discovery.{ns}.svc"),
                format!("*.etcd-discovery.{ns}.svc.cluster.local"),
                format!("{}.etcd-discovery.{ns}.svc", self.pod),
            ],
            ips: vec![self.ip, IpAddr::from([127, 0, 0, 1])],
            server: true,
            client: true,
        })?;
        let ca_file = tls_dir.join("ca.crt");
        write_private(&ca_file, &ca_pem)?;
        let (server_cert_file, server_key_file) = server.write_files(&tls_dir, "server")?;
        let (peer_cert_file, peer_key_file) = peer.write_files(&tls_dir, "peer")?;

        let pvc_name = format!("data-{}", self.pod);
        let pvc = ctx
            .kube
            .get(&PVC, Some(ns), &pvc_name)
            .await?
            .ok_or_else(|| OperatorError::Waiting(format!("PVC {ns}/{pvc_name}")))?;
        if is_deleting(&pvc) {
            return Err(OperatorError::Waiting(format!(
                "PVC {ns}/{pvc_name} is being deleted"
            )));
        }
        let pv = existing_pv_dir(&ctx.cfg.state_dir, &pvc)
            .ok_or_else(|| OperatorError::Waiting(format!("volume of PVC {ns}/{pvc_name}")))?;

        let sts = ctx
            .kube
            .get(&STATEFULSET, Some(ns), "etcd")
            .await?
            .ok_or_else(|| OperatorError::Waiting(format!("StatefulSet {ns}/etcd")))?;
        let mut initial = Vec::new();
        for name in initial_cluster_names(&sts) {
            let ip = if name == self.pod {
                self.ip.to_string()
            } else {
                let claim = ctx
                    .kube
                    .get(&PVC, Some(ns), &format!("data-{name}"))
                    .await?;
                claim
                    .as_ref()
                    .and_then(|c| {
                        str_at(
                            c,
                            &format!(
                                "/metadata/annotations/{}",
                                POD_IP_ANNOTATION.replace('/', "~1")
                            ),
                        )
                    })
                    .map(str::to_string)
                    .ok_or_else(|| OperatorError::Waiting(format!("address of peer {name}")))?
            };
            initial.push((name, format!("https://{ip}:{PEER_PORT}")));
        }
        Ok(Mounted {
            pv,
            initial,
            tls: EtcdTls {
                ca_file,
                server_cert_file,
                server_key_file,
                peer_cert_file,
                peer_key_file,
                client_cert_auth: true,
            },
        })
    }

    /// Run the pod's init containers in the order of its spec, each until
    /// it succeeds (a failed one is restarted after a back-off, as the
    /// kubelet does), reporting `initContainerStatuses`; then the etcd
    /// container's configuration. `reset-member` and `etcd-init` do what
    /// their scripts do; others (`ensure-dns`) complete at once.
    async fn run_init_containers(&mut self, mounted: Mounted) -> EtcdMemberConfig {
        let data_dir = mounted.pv.join("data");
        // /etc/etcd/clusterstate/state, as the etcd container reads it
        let mut state = ClusterState::New;
        let mut initial = mounted.initial.clone();
        for i in 0..self.init_containers.len() {
            let container = self.init_containers[i].clone();
            let name = str_at(&container, "/name").unwrap_or_default().to_string();
            let mut restarts = 0u32;
            let mut last: Option<Value> = None;
            loop {
                let started = objects::now();
                self.init_statuses[i] = init_status(&container, json!({"running": {"startedAt": started}}), false, restarts, last.clone());
                self.report(json!({"waiting": {"reason": "PodInitializing"}}), None, false, 0, false).await;
                let end = match name.as_str() {
                    "reset-member" => match self.reset_member(mounted.initial.len(), &data_dir).await {
                        Ok(Reset::Rejoined(cluster)) => {
                            state = ClusterState::Existing;
                            initial = cluster;
                            InitEnd::Completed
                        }
                        Ok(Reset::NotMember | Reset::NoCluster | Reset::HasData) => {
                            state = ClusterState::New;
                            initial = mounted.initial.clone();
                            InitEnd::Completed
                        }
                        Err(e) => InitEnd::Failed(1, e.to_string()),
                    },
                    super::etcd_init::CONTAINER => {
                        let tmp = self.dir.join("etcd-init-tmp");
                        let pod = super::etcd_init::Pod { ns: &self.ns, name: &self.pod, uid: &self.uid, var_lib: &mounted.pv, tmp: &tmp };
                        match super::etcd_init::run(&self.ctx, &pod, &container).await {
                            Ok(super::etcd_init::Exit::Completed(_)) => InitEnd::Completed,
                            Ok(super::etcd_init::Exit::Failed { code, message }) => InitEnd::Failed(code, message),
                            // what the sandbox needs besides the script (a peer's
                            // address): not the container's failure, retried
                            Err(OperatorError::Waiting(what)) => {
                                tracing::info!(namespace = %self.ns, pod = %self.pod, "etcd-init waits: {what}");
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                continue;
                            }
                            Err(e) => InitEnd::Failed(1, e.to_string()),
                        }
                    }
                    _ => InitEnd::Completed,
                };
                let finished = objects::now();
                match end {
                    InitEnd::Completed => {
                        let done = json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": finished}});
                        self.init_statuses[i] = init_status(&container, done, true, restarts, last.clone());
                        break;
                    }
                    InitEnd::Failed(code, message) => {
                        tracing::warn!(namespace = %self.ns, pod = %self.pod, container = %name, code, "init container failed: {}", message.lines().next().unwrap_or_default());
                        let terminated = json!({"terminated": {"exitCode": code, "reason": "Error", "message": message,
                            "startedAt": started, "finishedAt": finished}});
                        restarts = restarts.saturating_add(1);
                        let wait = backoff(restarts);
                        let waiting = json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!(
                            "back-off {}s restarting failed container={name} pod={}_{}({})", wait.as_secs().max(1), self.pod, self.ns, self.uid)}});
                        last = Some(terminated.clone());
                        self.init_statuses[i] = init_status(&container, waiting, false, restarts, Some(terminated));
                        self.report(json!({"waiting": {"reason": "PodInitializing"}}), None, false, 0, false).await;
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
        let log_dir = self.ctx.cfg.state_dir.join("logs").join(&self.ns);
        EtcdMemberConfig {
            name: self.pod.clone(),
            data_dir,
            log_dir,
            client_ip: self.ip,
            client_port: CLIENT_PORT,
            peer_port: PEER_PORT,
            initial_cluster: initial,
            initial_cluster_state: state,
            tls: Some(mounted.tls),
            quota_backend_bytes: Some(QUOTA_BACKEND_BYTES),
        }
    }

    /// The `reset-member` init container: nothing when the member has data
    /// (`/var/lib/data/member/snap/db`); else, when the cluster answers
    /// through the ready members only (what the `etcd-client` Service routes
    /// to) and lists a member of this pod's name, that member is removed and
    /// this pod added again (state `existing`). The data directory is never
    /// deleted.
    async fn reset_member(&self, expected: usize, data_dir: &Path) -> Result<Reset, OperatorError> {
        if data_dir.join("member").join("snap").join("db").exists() {
            return Ok(Reset::HasData);
        }
        let marker = self.ctx.cfg.state_dir.join(RESET_UNREACHABLE_MARKER);
        if std::fs::remove_file(&marker).is_ok() {
            tracing::warn!(namespace = %self.ns, pod = %self.pod, "reset-member: Cannot list members in cluster, so likely not up yet (fault file {RESET_UNREACHABLE_MARKER})");
            return Ok(Reset::NoCluster);
        }
        let ctx = &self.ctx;
        let ns = self.ns.as_str();
        let pods = ctx.kube.list(&POD, Some(ns), Some("app=etcd")).await?;
        let endpoints: Vec<String> = pods
            .iter()
            .filter(|p| {
                is_etcd_pod(p)
                    && name_of(p) != self.pod
                    && objects::condition_true(p.pointer("/status/conditions"), "Ready")
            })
            .filter_map(|p| {
                str_at(p, "/status/podIP").map(|ip| format!("https://{ip}:{CLIENT_PORT}"))
            })
            .collect();
        if endpoints.is_empty() {
            return Ok(Reset::NoCluster);
        }
        let tls = client_tls(ctx, ns, format!("etcd-client.{ns}.svc")).await?;
        let etcd_err = |action: &str| {
            let action = action.to_string();
            move |source| OperatorError::Etcd {
                action,
                source: Box::new(source),
            }
        };
        let mut client = match crate::procs::etcd::connect_client(&endpoints, Some(&tls)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(namespace = ns, pod = %self.pod, "cannot reach the cluster, likely not up yet: {e}");
                return Ok(Reset::NoCluster);
            }
        };
        let list = match client.member_list().await {
            Ok(l) => l,
            Err(e) => {
                tracing::info!(namespace = ns, pod = %self.pod, "cannot list members, likely not up yet: {e}");
                return Ok(Reset::NoCluster);
            }
        };
        let own = self.own_peer_url();
        let members = match list
            .members()
            .iter()
            .find(|m| m.name() == self.pod || m.peer_urls().contains(&own))
        {
            // Added by an earlier attempt of this pod (not started yet): keep it.
            Some(m) if m.name().is_empty() && m.peer_urls().contains(&own) => {
                list.members().to_vec()
            }
            Some(old) => {
                tracing::info!(namespace = ns, pod = %self.pod, id = old.id(), "a member with this name exists: removing it and adding this pod as a new member");
                client
                    .member_remove(old.id())
                    .await
                    .map_err(etcd_err("member remove"))?;
                client
                    .member_add([own.clone()], None)
                    .await
                    .map_err(etcd_err("member add"))?
                    .member_list()
                    .to_vec()
            }
            // A removal whose reply was lost leaves the cluster short of this
            // member (the real script would crash-loop here): add it, when
            // etcd's strict reconfiguration check lets it (the members there
            // are a quorum of the grown cluster; a one-member cluster of a
            // split-brain restore is not short of a member, it is alone).
            None if list.members().len() < expected && list.members().len() > list.members().len().div_ceil(2) => {
                tracing::info!(namespace = ns, pod = %self.pod, "cluster is short of this member: adding it");
                client
                    .member_add([own.clone()], None)
                    .await
                    .map_err(etcd_err("member add"))?
                    .member_list()
                    .to_vec()
            }
            None => return Ok(Reset::NotMember),
        };
        let mut cluster = Vec::new();
        for m in &members {
            let name = if m.peer_urls().contains(&own) {
                self.pod.clone()
            } else {
                m.name().to_string()
            };
            if let Some(url) = m.peer_urls().first() {
                if name.is_empty() {
                    continue;
                }
                cluster.push((name, url.clone()));
            }
        }
        Ok(Reset::Rejoined(cluster))
    }
}

/// A URL without its query string (presigned URLs carry credentials there).
pub(crate) fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?<redacted>"),
        None => url.to_string(),
    }
}

/// Why a GET failed, in curl's words: its exit code and message (never the
/// URL's query, which may hold a signature).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FetchError {
    /// curl's exit code (1 unsupported protocol, 3 malformed URL, 7 cannot
    /// connect, 23 write error, 35 TLS handshake, 56 receive failure, 60
    /// certificate not trusted).
    pub code: i32,
    /// curl's message (`curl: (7) Failed to connect to ...`).
    pub message: String,
}

impl FetchError {
    fn new(code: i32, message: impl std::fmt::Display) -> FetchError {
        FetchError { code, message: format!("curl: ({code}) {message}") }
    }
}

/// `curl -o dest url`: GET an http(s) URL (https trusting only
/// `roots_pem`), streaming the body to `dest` whatever the status, which is
/// returned (as curl without `--fail`, an error document is saved too).
pub(crate) async fn fetch(url: &str, roots_pem: &str, dest: &Path) -> Result<hyper::StatusCode, FetchError> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
    if scheme != "https" && scheme != "http" {
        let shown = if scheme.is_empty() { redact(url) } else { scheme };
        return Err(FetchError::new(1, format!("Protocol \"{shown}\" not supported or disabled in libcurl")));
    }
    let uri: hyper::Uri = url.parse().map_err(|_| FetchError::new(3, "URL using bad/illegal format or missing URL"))?;
    let host = uri
        .host()
        .ok_or_else(|| FetchError::new(3, "URL using bad/illegal format or missing URL"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_else(|| host.clone());
    let path = uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| FetchError::new(7, format!("Failed to connect to {host} port {port}: {e}")))?;
    if scheme == "http" {
        return get_over(tcp, authority, path, dest).await;
    }
    let config = crate::pki::client_tls_config(roots_pem, None).map_err(|e| FetchError::new(35, format!("TLS setup: {e}")))?;
    let mut config = (*config).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let server_name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|_| FetchError::new(3, "URL using bad/illegal format or missing URL"))?;
    let tls = connector.connect(server_name, tcp).await.map_err(|e| {
        let text = e.to_string();
        if text.contains("certificate") || text.contains("UnknownIssuer") {
            FetchError::new(60, format!("SSL certificate problem: {text}"))
        } else {
            FetchError::new(35, format!("TLS connect error: {text}"))
        }
    })?;
    get_over(tls, authority, path, dest).await
}

/// The GET of [`fetch`] on a connected stream.
async fn get_over<IO>(io: IO, authority: String, path: String, dest: &Path) -> Result<hyper::StatusCode, FetchError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body_util::BodyExt as _;
    use tokio::io::AsyncWriteExt as _;
    let recv = |e: &dyn std::fmt::Display| FetchError::new(56, format!("Failure when receiving data from the peer: {e}"));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| recv(&e))?;
    let conn_task = tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "curl/8.5.0")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|_| FetchError::new(3, "URL using bad/illegal format or missing URL"))?;
    let result = async {
        let resp = sender.send_request(req).await.map_err(|e| recv(&e))?;
        let status = resp.status();
        let mut body = resp.into_body();
        let write = |e: std::io::Error| FetchError::new(23, format!("Failure writing output to destination: {e}"));
        let mut file = tokio::fs::File::create(dest).await.map_err(write)?;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| recv(&e))?;
            if let Some(data) = frame.data_ref() {
                file.write_all(data).await.map_err(write)?;
            }
        }
        file.flush().await.map_err(write)?;
        Ok(status)
    }
    .await;
    conn_task.abort();
    result
}

/// `curl --fail -o dest url` over https, trusting only `roots_pem`: an
/// error status is a failure (with the start of the error document).
pub(crate) async fn download(url: &str, roots_pem: &str, dest: &Path) -> Result<(), OperatorError> {
    let fail = |reason: String| OperatorError::Snapshot { url: redact(url), reason };
    if !url.starts_with("https://") {
        return Err(fail("only https:// URLs are supported in the sandbox (s3:// needs AWS credentials in the pod); use a presigned URL".into()));
    }
    let status = fetch(url, roots_pem, dest).await.map_err(|e| fail(e.message))?;
    if !status.is_success() {
        let text: String = std::fs::read(dest)
            .map(|b| String::from_utf8_lossy(&b).chars().take(300).collect())
            .unwrap_or_default();
        let _ = std::fs::remove_file(dest);
        return Err(fail(format!("HTTP {status}: {text}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_cluster_names_come_from_the_env() {
        let sts = json!({"metadata": {"name": "etcd"}, "spec": {"replicas": 3, "template": {"spec": {"containers": [
            {"name": "etcd", "env": [{"name": "ETCD_INITIAL_CLUSTER",
              "value": "etcd-0=https://etcd-0.etcd-discovery.ns.svc:2380,etcd-1=https://etcd-1.etcd-discovery.ns.svc:2380"}]}]}}}});
        assert_eq!(initial_cluster_names(&sts), vec!["etcd-0", "etcd-1"]);
        let bare = json!({"metadata": {"name": "etcd"}, "spec": {"replicas": 3}});
        assert_eq!(
            initial_cluster_names(&bare),
            vec!["etcd-0", "etcd-1", "etcd-2"]
        );
    }

    #[test]
    fn presigned_queries_are_redacted() {
        assert_eq!(
            redact("https://h/b/k?X-Amz-Signature=abc"),
            "https://h/b/k?<redacted>"
        );
        assert_eq!(redact("https://h/b/k"), "https://h/b/k");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(1) > backoff(0));
        assert_eq!(backoff(30), backoff(40));
        assert!(backoff(40) <= Duration::from_secs(20));
    }
}
