//! The "kubelet" for hcp-dr's etcd restore pods (`hcp-dr etcd restore`).
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
//! Sandbox differences:
//! - Peer URLs are translated from `<member>.etcd-discovery.<ns>.svc` to the
//!   pod IPs the sandbox's members use (from their claims), as the etcd
//!   kubelet does. etcdutl's own check that `--initial-cluster` holds
//!   `<name>=<peer url>` is made on the URLs as given.
//! - Debian's etcd 3.4 has no `etcdutl` and its `etcdctl snapshot restore`
//!   no `--bump-revision`/`--mark-compacted`: they are emulated. The snapshot
//!   is restored into a scratch single-member etcd, its revision raised by
//!   the bump with writes to one key then deleted (at most 200,000), the
//!   history compacted at the new revision (what `--mark-compacted` records),
//!   and that member's snapshot restored into the volume. Same revision,
//!   same keys, same compacted revision as etcdutl's result.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::etcd_member::{PEER_PORT, download, redact, secret_data};
use super::objects::{PVC, POD, SECRET, is_deleting, name_of, ns_of, str_at, uid_of};
use super::workloads::{POD_IP_ANNOTATION, existing_pv_dir};
use super::{Ctx, OperatorError, io_err};
use crate::procs::etcd::{INITIAL_CLUSTER_TOKEN, restore_scratch};

/// The annotation naming the script version the pod runs.
pub const SCRIPT_ANNOTATION: &str = "hcp-dr.openshift.io/restore-script";
/// The most revisions the emulated `--bump-revision` writes.
pub const MAX_EMULATED_BUMP: u64 = 200_000;

/// Whether this pod is an hcp-dr restore pod.
pub fn is_restore_pod(pod: &Value) -> bool {
    pod.pointer(&format!("/metadata/annotations/{}", SCRIPT_ANNOTATION.replace('/', "~1")))
        .is_some()
}

/// Running restores by pod uid.
pub type Running = std::sync::Mutex<HashMap<String, JoinHandle<()>>>;

/// One pass: start new restore pods, forget deleted ones.
pub(crate) async fn sync(ctx: &Arc<Ctx>, pods: &[Value]) {
    let live: HashMap<&str, &Value> = pods
        .iter()
        .filter(|p| is_restore_pod(p) && !is_deleting(p))
        .map(|p| (uid_of(p), p))
        .collect();
    let Ok(mut running) = ctx.restores.lock() else { return };
    running.retain(|uid, task| {
        let keep = live.contains_key(uid.as_str());
        if !keep {
            task.abort();
        }
        keep
    });
    for (uid, pod) in live {
        if running.contains_key(uid) || str_at(pod, "/status/phase").is_some_and(|p| p != "Pending") {
            continue;
        }
        let (ctx2, pod) = (ctx.clone(), pod.clone());
        running.insert(uid.to_string(), tokio::spawn(async move { run(ctx2, pod).await }));
    }
}

async fn set_status(ctx: &Ctx, pod: &Value, phase: &str, terminated: Option<(i32, &str, String)>) {
    let now = super::objects::now();
    let state = match &terminated {
        None => json!({"running": {"startedAt": now}}),
        Some((code, reason, message)) => json!({"terminated": {"exitCode": code, "reason": reason, "message": message,
            "startedAt": pod.pointer("/status/startTime").cloned().unwrap_or(json!(now)), "finishedAt": now}}),
    };
    let status = json!({"status": {
        "phase": phase,
        "startTime": pod.pointer("/status/startTime").cloned().unwrap_or(json!(now)),
        "hostIP": "127.0.0.1",
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

/// The sandbox address of member `name`'s peer URL (from its claim), waiting
/// a while for a claim just created to be bound.
async fn peer_ip(ctx: &Ctx, ns: &str, name: &str) -> Result<IpAddr, OperatorError> {
    for _ in 0..120 {
        match claim_ip(ctx, ns, name).await {
            Ok(ip) => return Ok(ip),
            Err(OperatorError::Invalid { .. }) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            Err(other) => return Err(other),
        }
    }
    claim_ip(ctx, ns, name).await
}

async fn claim_ip(ctx: &Ctx, ns: &str, name: &str) -> Result<IpAddr, OperatorError> {
    let claim = format!("data-{name}");
    ctx.kube
        .get(&PVC, Some(ns), &claim)
        .await?
        .as_ref()
        .and_then(|c| str_at(c, &format!("/metadata/annotations/{}", POD_IP_ANNOTATION.replace('/', "~1"))))
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| invalid(format!("the address of member {name} (PersistentVolumeClaim {ns}/{claim} has no pod IP)")))
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
    if token != INITIAL_CLUSTER_TOKEN {
        return Err(invalid(format!("--initial-cluster-token {token}: the sandbox's members use {INITIAL_CLUSTER_TOKEN}")));
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
    let got = sha256_file(&snapshot)?;
    if got != sha {
        return Err(invalid(format!("the downloaded snapshot has SHA-256 {got}, not {sha}")));
    }
    let bumped = bump_revision(&snapshot, &work, bump).await?;
    let (snap, dir, member, cluster, peer) = (bumped, work.join("data"), name.to_string(), ip_cluster, own);
    tokio::task::spawn_blocking(move || crate::procs::etcd::etcdctl_snapshot_restore(&snap, &dir, &member, &cluster, &peer))
        .await
        .map_err(|e| invalid(format!("restore task: {e}")))??;
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

fn sha256_file(path: &Path) -> Result<String, OperatorError> {
    let mut file = std::fs::File::open(path).map_err(io_err("opening", path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io_err("reading", path))?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// `--bump-revision N --mark-compacted`, emulated (see the module docs):
/// the path of a snapshot at the snapshot's revision plus `bump`, compacted there.
async fn bump_revision(snapshot: &Path, work: &Path, bump: u64) -> Result<PathBuf, OperatorError> {
    let scratch = work.join("bump");
    let mut member = restore_scratch(snapshot, &scratch).await?;
    let result = async {
        let etcd = |action: &str| {
            let action = action.to_string();
            move |source| OperatorError::Etcd { action, source: Box::new(source) }
        };
        let mut client = etcd_client::Client::connect([member.client_url()], None).await.map_err(etcd("connect"))?;
        const KEY: &str = "\0hcp-dr-sandbox/bump-revision";
        for _ in 1..bump {
            client.put(KEY, "", None).await.map_err(etcd("put"))?;
        }
        let deleted = client.delete(KEY, None).await.map_err(etcd("delete"))?;
        let revision = deleted.header().map(|h| h.revision()).unwrap_or_default();
        client
            .compact(revision, Some(etcd_client::CompactionOptions::new().with_physical()))
            .await
            .map_err(etcd("compact"))?;
        let out = work.join("bumped.db");
        let mut stream = client.snapshot().await.map_err(etcd("snapshot"))?;
        let mut file = std::fs::File::create(&out).map_err(io_err("creating", &out))?;
        while let Some(chunk) = stream.message().await.map_err(etcd("snapshot"))? {
            std::io::Write::write_all(&mut file, chunk.blob()).map_err(io_err("writing", &out))?;
        }
        file.sync_all().map_err(io_err("syncing", &out))?;
        Ok(out)
    }
    .await;
    member.kill();
    result
}
