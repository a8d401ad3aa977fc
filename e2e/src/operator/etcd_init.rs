//! HyperShift's `etcd-init` init container: how the control-plane operator
//! renders it into the etcd StatefulSet, what it does in each etcd pod, and
//! the `EtcdSnapshotRestored` condition that takes it away again.
//!
//! **The template** (`control-plane-operator/controllers/hostedcontrolplane/
//! v2/etcd/statefulset.go`): while the HostedControlPlane has
//! `spec.etcd.managed.storage.restoreSnapshotURL` and its condition
//! `EtcdSnapshotRestored` is not True, the pod template gets an init
//! container `etcd-init` (image `etcd`, `/bin/sh -ce <script>`, env
//! `RESTORE_URL_ETCD` = the first URL, the volume `data` at `/var/lib`).
//! [`EtcdInit::Shipped`]: HyperShift's script as shipped
//! ([`SHIPPED_SCRIPT`], `etcd-init.sh` of openshift/hypershift), appended
//! after `reset-member`. [`EtcdInit::Fixed`]: the script of
//! openshift/hypershift PR 9048 ([`FIXED_SCRIPT`]), inserted before
//! `reset-member`, with the env `HOSTNAME` (the pod's name), `HCP_NAMESPACE`
//! and `ETCD_INITIAL_CLUSTER` ([`init_container`], [`init_containers`]).
//!
//! **The condition** (`hostedcontrolplane_controller.go`,
//! `etcdRestoredCondition`): set once, while absent, for an HCP with a
//! restore URL: True (`AsExpected`) when the StatefulSet's `readyReplicas`
//! equals its replicas and as many etcd pods report their `etcd-init` init
//! container ready; False with the terminated reason when one reports a
//! last termination with a non-zero exit code (which, behind the same
//! readiness gate, a pod with a failing `etcd-init` never reaches); else not
//! set yet ([`restored_condition`]).
//!
//! **In the pod** ([`run`], called by the etcd kubelet in the order of the
//! pod's init containers), exactly the script's steps: `mkdir -p
//! /var/lib/data`; skip (exit 0) when it is not empty; `curl -o /tmp/snapshot
//! $RESTORE_URL_ETCD` (no `--fail`: an error document is saved too; curl's
//! own failures exit with its code); exit 1 printing the body when it starts
//! with `<?xml` (S3's error documents: an expired presigned URL, a missing
//! key); `rm -rf /var/lib/restore`; `snapshot restore /tmp/snapshot
//! --data-dir=/var/lib/restore` (shipped: nothing else, so every member
//! holds a one-member cluster named `default` at `http://localhost:2380`;
//! fixed: `--name $HOSTNAME --initial-cluster $ETCD_INITIAL_CLUSTER
//! --initial-cluster-token $HCP_NAMESPACE --initial-advertise-peer-urls
//! https://$HOSTNAME.etcd-discovery.$HCP_NAMESPACE.svc:2380 --bump-revision
//! 1000000000 --mark-compacted`); `rm -rf /var/lib/data; mv /var/lib/restore
//! /var/lib/data`. `/var/lib` is the claim's directory.
//!
//! Sandbox differences: `RESTORE_URL_ETCD` must be http(s) (curl's `s3://`
//! failure is reproduced: exit 1); fixed mode's peer URLs are translated to
//! the members' pod IPs (from their claims, as everywhere in the sandbox),
//! and its `--bump-revision 1000000000` is emulated as a bump of
//! [`FIXED_BUMP`] revisions (with `--mark-compacted`), since the bump is made
//! with writes ([`super::bump`]).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::objects::str_at;
use super::{Ctx, EtcdInit, OperatorError};
use crate::procs::etcd::RestoreMember;

/// The init container's name.
pub const CONTAINER: &str = "etcd-init";
/// The HostedControlPlane condition that ends the restore.
pub const RESTORED_CONDITION: &str = "EtcdSnapshotRestored";
/// HyperShift's `etcd-init.sh` as shipped (openshift/hypershift main).
pub const SHIPPED_SCRIPT: &str = include_str!("etcd-init-shipped.sh");
/// `etcd-init.sh` of openshift/hypershift PR 9048 (OCPBUGS-99534).
pub const FIXED_SCRIPT: &str = include_str!("etcd-init-fixed.sh");
/// The `--bump-revision` of [`FIXED_SCRIPT`].
pub const FIXED_SCRIPT_BUMP: u64 = 1_000_000_000;
/// The bump the sandbox makes for it: the emulation writes one revision at a
/// time, so 10^9 cannot be done; 10,000 still moves every revision a client
/// saw before the backup out of reach, and marks them compacted.
pub const FIXED_BUMP: u64 = 10_000;
/// Bytes of the output kept as a failed container's message (the kubelet's
/// `FallbackToLogsOnError` limit).
const MESSAGE_BYTES: usize = 2048;

/// The script `mode` renders.
pub fn script(mode: EtcdInit) -> &'static str {
    match mode {
        EtcdInit::Shipped => SHIPPED_SCRIPT,
        EtcdInit::Fixed => FIXED_SCRIPT,
    }
}

/// Which script an `etcd-init` container runs, by its text.
pub fn mode_of(container: &Value) -> Option<EtcdInit> {
    let text = container.pointer("/command/2").and_then(Value::as_str)?;
    [EtcdInit::Shipped, EtcdInit::Fixed].into_iter().find(|m| script(*m).trim() == text.trim())
}

/// The `etcd-init` container the control-plane operator builds
/// (`buildEtcdInitContainer`): `url` the HCP's first restoreSnapshotURL,
/// `ns` the HCP namespace, `initial_cluster` the etcd container's
/// `ETCD_INITIAL_CLUSTER`.
pub fn init_container(mode: EtcdInit, url: &str, ns: &str, initial_cluster: &str) -> Value {
    let env = match mode {
        EtcdInit::Shipped => json!([{"name": "RESTORE_URL_ETCD", "value": url}]),
        EtcdInit::Fixed => json!([
            {"name": "HOSTNAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "RESTORE_URL_ETCD", "value": url},
            {"name": "HCP_NAMESPACE", "value": ns},
            {"name": "ETCD_INITIAL_CLUSTER", "value": initial_cluster},
        ]),
    };
    json!({
        "name": CONTAINER,
        "image": "etcd",
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-ce", script(mode)],
        "env": env,
        "resources": {},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib"}],
    })
}

/// `etcd_init` placed among the other init containers `base` as `mode`
/// places it: shipped appends it (after `reset-member`), fixed inserts it
/// before `reset-member` (at the end without one); `None`: `base` as is.
pub fn init_containers(mode: EtcdInit, base: &[Value], etcd_init: Option<Value>) -> Vec<Value> {
    let mut out = base.to_vec();
    if let Some(c) = etcd_init {
        let at = match mode {
            EtcdInit::Shipped => out.len(),
            EtcdInit::Fixed => out.iter().position(|c| str_at(c, "/name") == Some("reset-member")).unwrap_or(out.len()),
        };
        out.insert(at, c);
    }
    out
}

/// The restore URL the template's `etcd-init` restores, while it has one:
/// the HCP's first `spec.etcd.managed.storage.restoreSnapshotURL` while its
/// `EtcdSnapshotRestored` condition is not True.
pub fn wanted_url(hcp: &Value) -> Option<&str> {
    let url = hcp.pointer("/spec/etcd/managed/storage/restoreSnapshotURL/0").and_then(Value::as_str)?;
    (!super::objects::condition_true(hcp.pointer("/status/conditions"), RESTORED_CONDITION)).then_some(url)
}

/// Whether the control-plane operator computes the condition now: the HCP
/// restores (managed etcd with a URL) and has no `EtcdSnapshotRestored` yet.
pub fn computes_condition(hcp: &Value) -> bool {
    let managed = str_at(hcp, "/spec/etcd/managementType").is_none_or(|t| t == "Managed");
    let has_url = hcp
        .pointer("/spec/etcd/managed/storage/restoreSnapshotURL")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let present = hcp
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| str_at(c, "/type") == Some(RESTORED_CONDITION)));
    managed && has_url && !present
}

/// `etcdRestoredCondition`: from the etcd StatefulSet and the pods labelled
/// `app=etcd` of its namespace, `Some((status, reason))` once decided.
pub fn restored_condition(sts: &Value, pods: &[Value]) -> Option<(bool, String)> {
    let replicas = sts.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let ready = sts.pointer("/status/readyReplicas").and_then(Value::as_i64).unwrap_or(0);
    if ready != replicas {
        return None;
    }
    let mut initialized = 0i64;
    for pod in pods {
        for s in pod.pointer("/status/initContainerStatuses").and_then(Value::as_array).into_iter().flatten() {
            if str_at(s, "/name") != Some(CONTAINER) {
                continue;
            }
            if s.get("ready").and_then(Value::as_bool) == Some(true) {
                initialized += 1;
            } else if let Some(t) = s.pointer("/lastState/terminated")
                && t.get("exitCode").and_then(Value::as_i64).unwrap_or(0) != 0
            {
                return Some((false, str_at(t, "/reason").unwrap_or_default().to_string()));
            }
        }
    }
    (initialized == replicas).then(|| (true, "AsExpected".to_string()))
}

/// How a run of the container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Exit 0, with what it printed last.
    Completed(String),
    /// A non-zero exit code, with the container's termination message.
    Failed { code: i32, message: String },
}

/// Where an `etcd-init` runs: its pod and the directories its mounts are.
pub(crate) struct Pod<'a> {
    /// The pod's namespace and name.
    pub ns: &'a str,
    pub name: &'a str,
    /// The pod's uid (a user of the bump cache).
    pub uid: &'a str,
    /// `/var/lib`: the claim's directory.
    pub var_lib: &'a Path,
    /// The container's own `/tmp`.
    pub tmp: &'a Path,
}

fn failed(code: i32, message: impl Into<String>) -> Exit {
    let mut message = message.into();
    if message.len() > MESSAGE_BYTES {
        let mut cut = message.len() - MESSAGE_BYTES;
        while !message.is_char_boundary(cut) {
            cut += 1;
        }
        message = message[cut..].to_string();
    }
    Exit::Failed { code, message }
}

/// The value of env `name` of `container` in pod `pod` (values and the
/// pod's `metadata.name`/`metadata.namespace` field references).
fn env_of(container: &Value, pod: &Pod<'_>, name: &str) -> Option<String> {
    let e = container.get("env")?.as_array()?.iter().find(|e| str_at(e, "/name") == Some(name))?;
    if let Some(v) = str_at(e, "/value") {
        return Some(v.to_string());
    }
    match str_at(e, "/valueFrom/fieldRef/fieldPath")? {
        "metadata.name" => Some(pod.name.to_string()),
        "metadata.namespace" => Some(pod.ns.to_string()),
        _ => None,
    }
}

/// Run `container` (an `etcd-init`) of `pod` once, doing what its script
/// does (see the module docs).
pub(crate) async fn run(ctx: &Ctx, pod: &Pod<'_>, container: &Value) -> Result<Exit, OperatorError> {
    let Some(mode) = mode_of(container) else {
        return Ok(failed(126, "the sandbox runs HyperShift's etcd-init scripts only (as shipped, or as PR 9048 fixes it): this one is neither"));
    };
    let data = pod.var_lib.join("data");
    std::fs::create_dir_all(&data).map_err(super::io_err("creating", &data))?;
    let empty = std::fs::read_dir(&data).map_err(super::io_err("reading", &data))?.next().is_none();
    if !empty {
        tracing::info!(namespace = pod.ns, pod = pod.name, "etcd-init: /var/lib/data not empty, not restoring snapshot");
        return Ok(Exit::Completed("/var/lib/data not empty, not restoring snapshot\n".into()));
    }
    let url = env_of(container, pod, "RESTORE_URL_ETCD").unwrap_or_default();
    std::fs::create_dir_all(pod.tmp).map_err(super::io_err("creating", pod.tmp))?;
    let snapshot = pod.tmp.join("snapshot");
    let mut roots = ctx.cfg.ca.cert_pem().to_string();
    if let Some(extra) = &ctx.cfg.snapshot_ca_pem {
        roots.push('\n');
        roots.push_str(extra);
    }
    tracing::info!(namespace = pod.ns, pod = pod.name, url = %super::etcd_member::redact(&url), mode = mode.as_str(), "etcd-init: downloading the snapshot");
    if let Err(e) = super::etcd_member::fetch(&url, &roots, &snapshot).await {
        return Ok(failed(e.code, e.message));
    }
    let head = {
        use std::io::Read as _;
        let mut buf = [0u8; 5];
        let n = std::fs::File::open(&snapshot).and_then(|mut f| f.read(&mut buf)).map_err(super::io_err("reading", &snapshot))?;
        buf[..n].to_vec()
    };
    if head == b"<?xml" {
        let body = std::fs::read(&snapshot).map_err(super::io_err("reading", &snapshot))?;
        return Ok(failed(1, String::from_utf8_lossy(&body).to_string()));
    }
    let restore = pod.var_lib.join("restore");
    if restore.exists() {
        std::fs::remove_dir_all(&restore).map_err(super::io_err("removing", &restore))?;
    }
    let failure = match mode {
        EtcdInit::Shipped => restore_blocking(snapshot.clone(), restore.clone(), None).await?.map(|output| failed(1, output)),
        EtcdInit::Fixed => fixed_restore(ctx, pod, container, &snapshot, &restore).await?,
    };
    if let Some(exit) = failure {
        return Ok(exit);
    }
    std::fs::remove_dir_all(&data).map_err(super::io_err("removing", &data))?;
    std::fs::rename(&restore, &data).map_err(super::io_err("moving the restored data to", &data))?;
    let _ = std::fs::remove_file(&snapshot);
    tracing::info!(namespace = pod.ns, pod = pod.name, mode = mode.as_str(), "etcd-init: snapshot restored");
    Ok(Exit::Completed(format!("restored the snapshot into /var/lib/data ({mode} etcd-init)\n")))
}

/// `snapshot restore` in a blocking task; `Some(output)` when the tool fails.
async fn restore_blocking(snapshot: PathBuf, dir: PathBuf, member: Option<RestoreMember>) -> Result<Option<String>, OperatorError> {
    let done = tokio::task::spawn_blocking(move || crate::procs::etcd::snapshot_restore(&snapshot, &dir, member.as_ref()))
        .await
        .map_err(|e| OperatorError::Waiting(format!("restore task: {e}")))?;
    match done {
        Ok(()) => Ok(None),
        Err(crate::procs::ProcError::CommandFailed { output, .. }) => Ok(Some(output)),
        Err(other) => Err(other.into()),
    }
}

/// The fixed script's restore: the member flags (peer URLs as pod IPs) and
/// the emulated bump. `Some(exit)`: the container fails so.
async fn fixed_restore(ctx: &Ctx, pod: &Pod<'_>, container: &Value, snapshot: &Path, restore: &Path) -> Result<Option<Exit>, OperatorError> {
    let hostname = env_of(container, pod, "HOSTNAME").unwrap_or_else(|| pod.name.to_string());
    let hcp_ns = env_of(container, pod, "HCP_NAMESPACE").unwrap_or_default();
    let cluster = env_of(container, pod, "ETCD_INITIAL_CLUSTER").unwrap_or_default();
    let peer_url = format!("https://{hostname}.etcd-discovery.{hcp_ns}.svc:2380");
    let Some(pairs) = cluster
        .split(',')
        .map(|p| p.split_once('=').map(|(n, u)| (n.to_string(), u.to_string())))
        .collect::<Option<Vec<_>>>()
    else {
        return Ok(Some(failed(1, format!("Error: --initial-cluster {cluster:?} is not a list of name=URL"))));
    };
    // etcdctl's own check of its flags, on the URLs as given
    if !pairs.iter().any(|(n, u)| *n == hostname && *u == peer_url) {
        return Ok(Some(failed(1, format!("Error: --initial-cluster {cluster} has no {hostname}={peer_url} (--name, --initial-advertise-peer-urls)"))));
    }
    let mut by_ip = Vec::new();
    for (member, _) in &pairs {
        let ip = super::workloads::member_ip(ctx, pod.ns, member)
            .await?
            .ok_or_else(|| OperatorError::Waiting(format!("the address of member {member} (no PersistentVolumeClaim {}/data-{member})", pod.ns)))?;
        by_ip.push((member.clone(), format!("https://{ip}:{}", super::etcd_member::PEER_PORT)));
    }
    let own = by_ip.iter().find(|(n, _)| *n == hostname).map(|(_, u)| u.clone()).unwrap_or_default();
    let sha = {
        let path = snapshot.to_path_buf();
        tokio::task::spawn_blocking(move || sha256_file(&path))
            .await
            .map_err(|e| OperatorError::Waiting(format!("hashing task: {e}")))??
    };
    let user = ctx.bumps.enter(pod.uid);
    let bumped = ctx.bumps.bumped(&user, snapshot, &sha, FIXED_BUMP, pod.tmp).await?;
    let member = RestoreMember { name: hostname, initial_cluster: by_ip, token: hcp_ns, peer_url: own };
    let output = restore_blocking(bumped, restore.to_path_buf(), Some(member)).await?;
    drop(user);
    Ok(output.map(|o| failed(1, o)))
}

/// The SHA-256 of a file, in hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String, OperatorError> {
    let mut file = std::fs::File::open(path).map_err(super::io_err("opening", path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(super::io_err("reading", path))?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Vec<Value> {
        vec![json!({"name": "ensure-dns"}), json!({"name": "reset-member"})]
    }

    fn names(cs: &[Value]) -> Vec<&str> {
        cs.iter().filter_map(|c| str_at(c, "/name")).collect()
    }

    #[test]
    fn the_scripts_are_hypershifts() {
        for s in [SHIPPED_SCRIPT, FIXED_SCRIPT] {
            assert!(s.starts_with("# If /var/lib/data is not empty we exit early"));
            assert!(s.contains("curl -o /tmp/snapshot \"${RESTORE_URL}\""));
            assert!(s.contains("head -c 5 /tmp/snapshot | grep -q '<?xml' && cat /tmp/snapshot && exit 1"));
            assert!(s.trim_end().ends_with("mv /var/lib/restore /var/lib/data"));
        }
        assert!(SHIPPED_SCRIPT.contains("etcdutl snapshot restore /tmp/snapshot --data-dir=/var/lib/restore\n"));
        assert!(!SHIPPED_SCRIPT.contains("--name"));
        for flag in ["--name \"${HOSTNAME}\"", "--initial-cluster \"${ETCD_INITIAL_CLUSTER}\"", "--initial-cluster-token \"${HCP_NAMESPACE}\"",
            "--initial-advertise-peer-urls \"${PEER_URL}\"", &format!("--bump-revision {FIXED_SCRIPT_BUMP} --mark-compacted")]
        {
            assert!(FIXED_SCRIPT.contains(flag), "{flag}");
        }
    }

    #[test]
    fn the_container_is_rendered_per_mode() {
        let shipped = init_container(EtcdInit::Shipped, "https://s3/b/k?X-Amz-Signature=s", "ns", "etcd-0=https://etcd-0.etcd-discovery.ns.svc:2380");
        assert_eq!(shipped["name"], CONTAINER);
        assert_eq!(shipped["image"], "etcd");
        assert_eq!(shipped["command"][0], "/bin/sh");
        assert_eq!(shipped["command"][1], "-ce");
        assert_eq!(shipped["command"][2], SHIPPED_SCRIPT);
        assert_eq!(shipped["env"], json!([{"name": "RESTORE_URL_ETCD", "value": "https://s3/b/k?X-Amz-Signature=s"}]));
        assert_eq!(shipped["volumeMounts"], json!([{"name": "data", "mountPath": "/var/lib"}]));
        assert_eq!(mode_of(&shipped), Some(EtcdInit::Shipped));
        let fixed = init_container(EtcdInit::Fixed, "https://u", "ns", "etcd-0=https://etcd-0.etcd-discovery.ns.svc:2380");
        assert_eq!(fixed["command"][2], FIXED_SCRIPT);
        let env: Vec<&str> = fixed["env"].as_array().expect("env").iter().filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(env, ["HOSTNAME", "RESTORE_URL_ETCD", "HCP_NAMESPACE", "ETCD_INITIAL_CLUSTER"]);
        assert_eq!(fixed["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
        assert_eq!(fixed["env"][3]["value"], "etcd-0=https://etcd-0.etcd-discovery.ns.svc:2380");
        assert_eq!(mode_of(&fixed), Some(EtcdInit::Fixed));
        assert_eq!(mode_of(&json!({"command": ["/bin/sh", "-ce", "echo hi"]})), None);
    }

    #[test]
    fn shipped_runs_after_reset_member_fixed_before() {
        let c = || Some(json!({"name": CONTAINER}));
        assert_eq!(names(&init_containers(EtcdInit::Shipped, &base(), c())), ["ensure-dns", "reset-member", "etcd-init"]);
        assert_eq!(names(&init_containers(EtcdInit::Fixed, &base(), c())), ["ensure-dns", "etcd-init", "reset-member"]);
        assert_eq!(names(&init_containers(EtcdInit::Fixed, &base()[..1], c())), ["ensure-dns", "etcd-init"]);
        assert_eq!(names(&init_containers(EtcdInit::Fixed, &base(), None)), ["ensure-dns", "reset-member"]);
    }

    #[test]
    fn etcd_init_is_wanted_until_the_snapshot_is_restored() {
        let mut hcp = json!({"spec": {"etcd": {"managementType": "Managed", "managed": {"storage": {"restoreSnapshotURL": ["https://u"]}}}}});
        assert_eq!(wanted_url(&hcp), Some("https://u"));
        assert!(computes_condition(&hcp));
        hcp["status"] = json!({"conditions": [{"type": RESTORED_CONDITION, "status": "False", "reason": "Error"}]});
        assert_eq!(wanted_url(&hcp), Some("https://u"), "False keeps it");
        assert!(!computes_condition(&hcp), "set once");
        hcp["status"]["conditions"][0]["status"] = json!("True");
        assert_eq!(wanted_url(&hcp), None);
        let plain = json!({"spec": {"etcd": {"managementType": "Managed", "managed": {"storage": {}}}}});
        assert_eq!(wanted_url(&plain), None);
        assert!(!computes_condition(&plain));
    }

    #[test]
    fn the_condition_is_computed_as_the_control_plane_operator_does() {
        let sts = |ready: i64| json!({"spec": {"replicas": 3}, "status": {"readyReplicas": ready}});
        let done = json!({"name": CONTAINER, "ready": true, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
        let pod = |statuses: Vec<Value>| json!({"status": {"initContainerStatuses": statuses}});
        let reset = json!({"name": "reset-member", "ready": true});
        let three = vec![pod(vec![reset.clone(), done.clone()]), pod(vec![done.clone()]), pod(vec![done.clone()])];
        assert_eq!(restored_condition(&sts(3), &three), Some((true, "AsExpected".into())));
        assert_eq!(restored_condition(&sts(2), &three), None, "not every replica ready");
        assert_eq!(restored_condition(&sts(3), &three[..2]), None, "a pod without etcd-init");
        let failing = json!({"name": CONTAINER, "ready": false, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "<?xml ..."}}});
        let mixed = vec![pod(vec![done.clone()]), pod(vec![failing.clone()]), pod(vec![done.clone()])];
        assert_eq!(restored_condition(&sts(3), &mixed), Some((false, "Error".into())));
        assert_eq!(restored_condition(&sts(2), &mixed), None, "behind the readiness gate");
        let single = json!({"spec": {"replicas": 1}, "status": {"readyReplicas": 1}});
        assert_eq!(restored_condition(&single, &[pod(vec![done])]), Some((true, "AsExpected".into())));
    }
}
