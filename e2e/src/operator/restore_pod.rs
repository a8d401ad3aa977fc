//! The "kubelet" for hcp-dr's etcd restore pods (`hcp-dr etcd restore`, and
//! the seeding of a HighlyAvailable restore's etcd volumes before its
//! HostedCluster exists).
//!
//! The sandbox cannot run container images, so it runs the pods it knows by
//! doing what their containers do. A restore pod carries the annotation
//! `hcp-dr.openshift.io/restore-script: v1` and runs, in the etcd image, a
//! script whose contract is its `RESTORE_*` environment: download
//! `RESTORE_SNAPSHOT_URL` (https only), check `RESTORE_SNAPSHOT_SHA256`, run
//! `etcdutl snapshot restore` with `--name RESTORE_NAME --initial-cluster
//! RESTORE_INITIAL_CLUSTER --initial-cluster-token ... --initial-advertise-peer-urls
//! RESTORE_PEER_URL --bump-revision RESTORE_BUMP_REVISION --mark-compacted`
//! into a scratch directory on the mounted volume, then replace
//! `RESTORE_DATA_DIR` with it. This module does exactly that with the host's
//! etcd tools, on the volume's directory, and reports the pod `Succeeded`, or
//! `Failed` with the reason as the container's termination message.
//!
//! Before it runs, a pod is scheduled as the scheduler would (in the
//! emulated mode; where the cluster's own scheduler runs it has done so):
//! while one of its claims is missing, or not bound (a claim of a
//! `WaitForFirstConsumer` class binds once a pod that fits the node uses it),
//! or its node selection does not fit the virtual node
//! ([`super::scheduling`]), it stays `Pending` with `PodScheduled=False`,
//! reason `Unschedulable` and the scheduler's message.
//!
//! Sandbox differences:
//! - Peer URLs are translated from `<member>.etcd-discovery.<ns>.svc` to the
//!   pod IPs the sandbox's members use (recorded on their claims; a claim
//!   not bound yet, made by hcp-dr before the StatefulSet, gets its address
//!   now and keeps it), as the etcd kubelet does. etcdutl's own check that
//!   `--initial-cluster` holds `<name>=<peer url>` is made on the URLs as
//!   given.
//! - Debian's etcd 3.4 has no `etcdutl` and its `etcdctl snapshot restore`
//!   no `--bump-revision`/`--mark-compacted`: they are emulated
//!   ([`super::bump`], at most [`MAX_EMULATED_BUMP`] revisions), once per
//!   snapshot and bump for all the members of a restore.
//! - Inter-pod anti-affinity is not evaluated (one virtual node).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::etcd_member::{PEER_PORT, download, redact, secret_data};
use super::objects::{PVC, POD, SECRET, STORAGE_CLASS, is_deleting, name_of, ns_of, str_at, uid_of};
use super::workloads::{existing_pv_dir, is_etcd_pod, patch_status_if_changed, pod_claims};
use super::{Ctx, OperatorError, io_err, log_failure};
pub use super::bump::MAX_EMULATED_BUMP;

/// The annotation naming the script version the pod runs.
pub const SCRIPT_ANNOTATION: &str = "hcp-dr.openshift.io/restore-script";

/// Whether this pod is an hcp-dr restore pod.
pub fn is_restore_pod(pod: &Value) -> bool {
    pod.pointer(&format!("/metadata/annotations/{}", SCRIPT_ANNOTATION.replace('/', "~1")))
        .is_some()
}

/// Running restores by pod uid.
pub type Running = std::sync::Mutex<HashMap<String, JoinHandle<()>>>;

/// One pass: schedule and start new restore pods, forget deleted ones,
/// and drop the bumped snapshots no pod needs any more.
pub(crate) async fn sync(ctx: &Arc<Ctx>, pods: &[Value], pvcs: &[Value]) {
    collect_bumps(ctx, pods);
    let live: HashMap<&str, &Value> = pods
        .iter()
        .filter(|p| is_restore_pod(p) && !is_deleting(p))
        .map(|p| (uid_of(p), p))
        .collect();
    let waiting: Vec<&Value> = {
        let Ok(mut running) = ctx.restores.lock() else { return };
        running.retain(|uid, task| {
            let keep = live.contains_key(uid.as_str());
            if !keep {
                task.abort();
            }
            keep
        });
        live.iter()
            .filter(|(uid, pod)| !running.contains_key(**uid) && str_at(pod, "/status/phase").is_none_or(|p| p == "Pending"))
            .map(|(_, pod)| *pod)
            .collect()
    };
    for pod in waiting {
        let verdict = if ctx.cluster_controllers() { Ok(Placement::Fits) } else { schedule(ctx, pod, pvcs).await };
        match verdict {
            Ok(Placement::Fits) => {
                let (ctx2, pod2) = (ctx.clone(), pod.clone());
                if let Ok(mut running) = ctx.restores.lock() {
                    running.insert(uid_of(pod).to_string(), tokio::spawn(async move { run(ctx2, pod2).await }));
                }
            }
            Ok(Placement::Binding) => {}
            Ok(Placement::Unschedulable(message)) => {
                let prev = pod.pointer("/status/conditions");
                let status = json!({"phase": "Pending",
                    "conditions": [super::objects::condition(prev, "PodScheduled", false, "Unschedulable", &message)]});
                if let Err(e) = patch_status_if_changed(ctx, &POD, pod, status).await {
                    log_failure("restore-pod-kubelet", &format!("{}/{}", ns_of(pod), name_of(pod)), &e);
                }
            }
            Err(e) => log_failure("restore-pod-kubelet", &format!("{}/{}", ns_of(pod), name_of(pod)), &e),
        }
    }
}

/// Where the scheduler would put a pod.
enum Placement {
    /// On the virtual node: it runs.
    Fits,
    /// On the virtual node, once its `WaitForFirstConsumer` claims are bound.
    Binding,
    /// Nowhere: the scheduler's message.
    Unschedulable(String),
}

/// The scheduler's verdict on `pod` in the emulated mode: its claims (all
/// there, bound or binding for it), then its node selection against the
/// virtual node ([`super::scheduling::fits`]).
async fn schedule(ctx: &Ctx, pod: &Value, pvcs: &[Value]) -> Result<Placement, OperatorError> {
    let ns = ns_of(pod);
    let mut binding = false;
    for claim in pod_claims(pod) {
        let Some(pvc) = pvcs.iter().find(|c| ns_of(c) == ns && name_of(c) == claim) else {
            return Ok(Placement::Unschedulable(format!("0/1 nodes are available: persistentvolumeclaim \"{claim}\" not found.")));
        };
        if is_deleting(pvc) {
            return Ok(Placement::Unschedulable(format!("0/1 nodes are available: persistentvolumeclaim \"{claim}\" is being deleted.")));
        }
        let bound = str_at(pvc, "/status/phase") == Some("Bound") && existing_pv_dir(&ctx.cfg.state_dir, pvc).is_some();
        if bound {
            continue;
        }
        let class = match str_at(pvc, "/spec/storageClassName").filter(|c| !c.is_empty()) {
            Some(name) => ctx.kube.get(&STORAGE_CLASS, None, name).await?,
            None => None,
        };
        if class.as_ref().and_then(|c| str_at(c, "/volumeBindingMode")) == Some("WaitForFirstConsumer") {
            binding = true;
        } else {
            return Ok(Placement::Unschedulable(super::scheduling::UNBOUND_CLAIMS.to_string()));
        }
    }
    let node = super::scheduling::virtual_node(ctx);
    if let Err(message) = super::scheduling::fits(pod.get("spec").unwrap_or(&Value::Null), &node) {
        return Ok(Placement::Unschedulable(message));
    }
    Ok(if binding { Placement::Binding } else { Placement::Fits })
}

/// `(sha256, bump)` of a restore pod from its plain env values.
fn bump_key(pod: &Value) -> Option<super::bump::BumpKey> {
    let env = pod.pointer("/spec/containers/0/env").and_then(Value::as_array)?;
    let value = |name: &str| env.iter().find(|e| str_at(e, "/name") == Some(name)).and_then(|e| str_at(e, "/value"));
    Some((value("RESTORE_SNAPSHOT_SHA256")?.to_string(), value("RESTORE_BUMP_REVISION")?.parse().ok()?))
}

/// Drop the bumped snapshots that neither a restore pod still to run or
/// running, nor an etcd pod whose fixed `etcd-init` has not completed, may
/// need ([`super::bump::BumpCache::collect`]).
fn collect_bumps(ctx: &Ctx, pods: &[Value]) {
    let mut wanted = std::collections::HashSet::new();
    let mut unsure = false;
    for pod in pods.iter().filter(|p| !is_deleting(p)) {
        let finished = matches!(str_at(pod, "/status/phase"), Some("Succeeded" | "Failed"));
        if is_restore_pod(pod) && !finished {
            match bump_key(pod) {
                Some(key) => {
                    wanted.insert(key);
                }
                None => unsure = true,
            }
        }
        if is_etcd_pod(pod) {
            let fixed_init = pod
                .pointer("/spec/initContainers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| str_at(c, "/name") == Some(super::etcd_init::CONTAINER) && super::etcd_init::mode_of(c) == Some(super::EtcdInit::Fixed));
            let done = pod
                .pointer("/status/initContainerStatuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|s| str_at(s, "/name") == Some(super::etcd_init::CONTAINER) && s.get("ready") == Some(&json!(true)));
            unsure |= fixed_init && !done;
        }
    }
    ctx.bumps.collect(&wanted, unsure);
}

async fn set_status(ctx: &Ctx, pod: &Value, phase: &str, terminated: Option<(i32, &str, String)>) {
    let now = super::objects::now();
    let state = match &terminated {
        None => json!({"running": {"startedAt": now}}),
        Some((code, reason, message)) => json!({"terminated": {"exitCode": code, "reason": reason, "message": message,
            "startedAt": pod.pointer("/status/startTime").cloned().unwrap_or(json!(now)), "finishedAt": now}}),
    };
    let prev = pod.pointer("/status/conditions");
    let running = terminated.is_none();
    let status = json!({"status": {
        "phase": phase,
        "startTime": pod.pointer("/status/startTime").cloned().unwrap_or(json!(now)),
        "hostIP": "127.0.0.1",
        "conditions": [
            super::objects::condition(prev, "PodScheduled", true, "", ""),
            super::objects::condition(prev, "Initialized", true, "", ""),
            super::objects::condition(prev, "ContainersReady", running, if running { "" } else { "PodCompleted" }, ""),
            super::objects::condition(prev, "Ready", running, if running { "" } else { "PodCompleted" }, ""),
        ],
        "containerStatuses": [{"name": "restore", "image": str_at(pod, "/spec/containers/0/image").unwrap_or_default(),
            "imageID": "", "ready": terminated.is_none(), "started": terminated.is_none(), "restartCount": 0, "state": state}],
    }});
    if let Err(e) = ctx.kube.merge_status(&POD, Some(ns_of(pod)), name_of(pod), &status).await {
        tracing::warn!(pod = %name_of(pod), "reporting the restore pod's status: {e}");
    }
}

async fn run(ctx: Arc<Ctx>, pod: Value) {
    set_status(&ctx, &pod, "Running", None).await;
    match restore(&ctx, &pod).await {
        Ok(name) => set_status(&ctx, &pod, "Succeeded", Some((0, "Completed", format!("restored {name}\n")))).await,
        Err(e) => {
            tracing::warn!(pod = %name_of(&pod), "restore pod failed: {e}");
            set_status(&ctx, &pod, "Failed", Some((1, "Error", e.to_string()))).await
        }
    }
}

fn invalid(what: impl Into<String>) -> OperatorError {
    OperatorError::Invalid { what: what.into() }
}

/// The container's environment, secret references resolved.
async fn environment(ctx: &Ctx, pod: &Value) -> Result<HashMap<String, String>, OperatorError> {
    let ns = ns_of(pod);
    let mut env = HashMap::new();
    for e in pod.pointer("/spec/containers/0/env").and_then(Value::as_array).into_iter().flatten() {
        let name = str_at(e, "/name").unwrap_or_default().to_string();
        if let Some(v) = str_at(e, "/value") {
            env.insert(name, v.to_string());
        } else if let (Some(secret), Some(key)) =
            (str_at(e, "/valueFrom/secretKeyRef/name"), str_at(e, "/valueFrom/secretKeyRef/key"))
        {
            let found = ctx
                .kube
                .get(&SECRET, Some(ns), secret)
                .await?
                .ok_or_else(|| invalid(format!("secret {ns}/{secret} of env {name} (CreateContainerConfigError)")))?;
            let value = secret_data(&found, key)
                .ok_or_else(|| invalid(format!("key {key} of secret {ns}/{secret} (CreateContainerConfigError)")))?;
            env.insert(name, value);
        }
    }
    Ok(env)
}

/// The host directory the container sees at `path` (through its volume mounts).
async fn host_path(ctx: &Ctx, pod: &Value, path: &str) -> Result<PathBuf, OperatorError> {
    let ns = ns_of(pod);
    let mounts = pod.pointer("/spec/containers/0/volumeMounts").and_then(Value::as_array).cloned().unwrap_or_default();
    let (volume, mount) = mounts
        .iter()
        .filter_map(|m| Some((str_at(m, "/name")?, str_at(m, "/mountPath")?.trim_end_matches('/'))))
        .find(|(_, m)| path == *m || path.starts_with(&format!("{m}/")))
        .ok_or_else(|| invalid(format!("no volume is mounted at {path}")))?;
    let claim = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| str_at(v, "/name") == Some(volume)))
        .and_then(|v| str_at(v, "/persistentVolumeClaim/claimName"))
        .ok_or_else(|| invalid(format!("volume {volume} is not a persistentVolumeClaim")))?;
    let pvc = ctx
        .kube
        .get(&PVC, Some(ns), claim)
        .await?
        .ok_or_else(|| invalid(format!("PersistentVolumeClaim {ns}/{claim} not found")))?;
    let dir = existing_pv_dir(&ctx.cfg.state_dir, &pvc).ok_or_else(|| invalid(format!("PersistentVolumeClaim {ns}/{claim} is not bound")))?;
    let rest = path[mount.len()..].trim_start_matches('/');
    Ok(if rest.is_empty() { dir } else { dir.join(rest) })
}

/// The sandbox address of member `name`'s peer URL ([`super::workloads::member_ip`]),
/// waiting a while for its claim to be created (hcp-dr creates the claims
/// of a restore together with, or just before, its pods).
async fn peer_ip(ctx: &Ctx, ns: &str, name: &str) -> Result<IpAddr, OperatorError> {
    for _ in 0..240 {
        if let Some(ip) = super::workloads::member_ip(ctx, ns, name).await? {
            return Ok(ip);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    Err(invalid(format!("the address of member {name} (no PersistentVolumeClaim {ns}/data-{name})")))
}

fn need<'a>(env: &'a HashMap<String, String>, name: &str) -> Result<&'a str, OperatorError> {
    env.get(name).map(String::as_str).filter(|v| !v.is_empty()).ok_or_else(|| invalid(format!("env {name} is not set")))
}

async fn restore(ctx: &Ctx, pod: &Value) -> Result<String, OperatorError> {
    let ns = ns_of(pod);
    let version = str_at(pod, &format!("/metadata/annotations/{}", SCRIPT_ANNOTATION.replace('/', "~1"))).unwrap_or_default();
    if version != "v1" {
        return Err(invalid(format!("restore script {version}: the sandbox runs v1 only")));
    }
    let env = environment(ctx, pod).await?;
    let (url, sha, name) = (need(&env, "RESTORE_SNAPSHOT_URL")?, need(&env, "RESTORE_SNAPSHOT_SHA256")?, need(&env, "RESTORE_NAME")?);
    let (cluster, token, peer) = (
        need(&env, "RESTORE_INITIAL_CLUSTER")?,
        need(&env, "RESTORE_INITIAL_CLUSTER_TOKEN")?,
        need(&env, "RESTORE_PEER_URL")?,
    );
    let bump: u64 = need(&env, "RESTORE_BUMP_REVISION")?
        .parse()
        .map_err(|_| invalid("RESTORE_BUMP_REVISION is not a number"))?;
    let data_dir = host_path(ctx, pod, need(&env, "RESTORE_DATA_DIR")?).await?;
    // etcdutl's own checks on its flags.
    let pairs: Vec<(String, String)> = cluster
        .split(',')
        .map(|p| p.split_once('=').map(|(n, u)| (n.to_string(), u.to_string())))
        .collect::<Option<_>>()
        .ok_or_else(|| invalid(format!("--initial-cluster {cluster}: not name=url pairs")))?;
    if !pairs.iter().any(|(n, u)| n == name && u == peer) {
        return Err(invalid(format!(
            "--initial-cluster has no {name}={peer}: etcdutl refuses a member whose advertised peer URL is not in the initial cluster"
        )));
    }
    if !(2..=MAX_EMULATED_BUMP).contains(&bump) {
        return Err(invalid(format!(
            "--bump-revision {bump}: the sandbox emulates the bump with writes and does 2 to {MAX_EMULATED_BUMP}; pass another --bump-revision"
        )));
    }
    let mut ip_cluster = Vec::new();
    for (member, _) in &pairs {
        ip_cluster.push((member.clone(), format!("https://{}:{PEER_PORT}", peer_ip(ctx, ns, member).await?)));
    }
    let own = format!("https://{}:{PEER_PORT}", peer_ip(ctx, ns, name).await?);

    let work = data_dir.parent().unwrap_or(&data_dir).join("hcp-dr-restore");
    reset_dir(&work)?;
    let snapshot = work.join("snapshot.db");
    let mut roots = ctx.cfg.ca.cert_pem().to_string();
    if let Some(extra) = &ctx.cfg.snapshot_ca_pem {
        roots.push('\n');
        roots.push_str(extra);
    }
    tracing::info!(namespace = ns, member = name, url = %redact(url), bump, "restore pod: restoring the snapshot");
    download(url, &roots, &snapshot).await?;
    let got = super::etcd_init::sha256_file(&snapshot)?;
    if got != sha {
        return Err(invalid(format!("the downloaded snapshot has SHA-256 {got}, not {sha}")));
    }
    let user = ctx.bumps.enter(uid_of(pod));
    let bumped = ctx.bumps.bumped(&user, &snapshot, sha, bump, &work).await?;
    let member = crate::procs::etcd::RestoreMember { name: name.to_string(), initial_cluster: ip_cluster, token: token.to_string(), peer_url: own };
    let (snap, dir) = (bumped, work.join("data"));
    tokio::task::spawn_blocking(move || crate::procs::etcd::snapshot_restore(&snap, &dir, Some(&member)))
        .await
        .map_err(|e| invalid(format!("restore task: {e}")))??;
    drop(user);
    if data_dir.exists() {
        std::fs::remove_dir_all(&data_dir).map_err(io_err("removing", &data_dir))?;
    }
    std::fs::rename(work.join("data"), &data_dir).map_err(io_err("moving the restored data to", &data_dir))?;
    std::fs::remove_dir_all(&work).map_err(io_err("removing", &work))?;
    Ok(name.to_string())
}

fn reset_dir(dir: &Path) -> Result<(), OperatorError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io_err("removing", dir))?;
    }
    std::fs::create_dir_all(dir).map_err(io_err("creating", dir))
}
