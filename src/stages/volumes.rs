//! A KubeVirt cluster's guest volumes in a backup (see
//! [`crate::hosted::kubevirt`]):
//! - `volume-snapshot`, while the API servers are down: one CSI
//!   VolumeSnapshot of each guest volume, waited for until the snapshot is
//!   cut (`status.creationTime`), so the volumes are consistent with etcd;
//! - `volume-copy`, after the API is back: each snapshot, once ready, is
//!   restored into a scratch PVC that a data-mover Job mounts; hcp-dr pulls
//!   the volume's tar from the mover (pod IP or port-forward, as for etcd)
//!   into the store (`volumes/<pvc>.tar`, encrypted with the rest), checks
//!   the mover's SHA-256 against its own, and removes the Job, the scratch
//!   PVC, its token Secret and, once every volume is copied, the snapshots.
//!
//! Everything created carries the label `hcp-dr.openshift.io/backup-id`, so
//! an undo (or a resumed run) finds what an interrupted one left.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::context::{BackupContext, EtcdAccess};
use super::preflight::Preflight;
use super::StageError;
use crate::archive::Artifact;
use crate::hosted::kubevirt::{GuestVolume, VOLUME_SNAPSHOT};
use crate::kube::{KubeError, api, get_json, is_not_found, request, wait_for};
use crate::kube::portforward::LocalForward;
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::volume::client::MoverClient;
use crate::volume::{MOUNT_PATH, MOVER_ANNOTATION, MOVER_PORT, MOVER_PROTOCOL, TOKEN_ENV};

/// The label on everything a backup's volume stages create.
pub const BACKUP_ID_LABEL: &str = "hcp-dr.openshift.io/backup-id";
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "hcp-dr");
/// How often the waits look again (watch-free: snapshots are CRDs).
const EVERY: Duration = Duration::from_millis(500);

/// The name of a guest volume's artifact in the backup folder.
pub fn artifact_name(volume: &str) -> String {
    format!("volumes/{volume}.tar")
}

/// The backup id as a label value and name part (lowercase).
fn id_label(ctx: &BackupContext) -> String {
    ctx.inputs.backup_id.to_ascii_lowercase()
}

/// The name of what a backup creates for its `index`th volume.
fn object_name(ctx: &BackupContext, index: usize) -> String {
    format!("hcp-dr-{}-v{index}", id_label(ctx))
}

fn labels(ctx: &BackupContext) -> Value {
    json!({MANAGED_BY.0: MANAGED_BY.1, BACKUP_ID_LABEL: id_label(ctx)})
}

/// One snapshot `volume-snapshot` took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taken {
    pub volume: String,
    pub snapshot: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshotted {
    pub namespace: String,
    pub snapshots: Vec<Taken>,
}

/// The guest volumes preflight found (none: not KubeVirt, or skipped).
fn guest_volumes(step: &Step<'_>) -> Result<Vec<GuestVolume>, StageFailure> {
    Ok(step.needs::<Preflight>()?.guest_volumes.map(|g| g.volumes).unwrap_or_default())
}

async fn delete_snapshots(ctx: &BackupContext, taken: &Snapshotted) -> Result<(), StageFailure> {
    let snapshots = api(&ctx.client, &VOLUME_SNAPSHOT, &taken.namespace);
    for t in &taken.snapshots {
        match snapshots.delete(&t.snapshot, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(err) if is_not_found(&err) => {}
            Err(err) => return Err(KubeError::Request { action: format!("deleting VolumeSnapshot {}/{}", taken.namespace, t.snapshot), source: err }.into()),
        }
    }
    Ok(())
}

/// `Some(true)` once `field` of the snapshot's status is set (ready or
/// cut), `Err` on a snapshot error.
async fn snapshot_state(ctx: &BackupContext, ns: &str, name: &str, field: &str) -> Result<Option<Value>, KubeError> {
    let what = format!("VolumeSnapshot {ns}/{name}");
    let Some(snap) = get_json(&api(&ctx.client, &VOLUME_SNAPSHOT, ns), name, &what).await? else {
        return Err(KubeError::Invalid(format!("{what} disappeared (deleted by something else?)")));
    };
    if let Some(message) = snap["status"]["error"]["message"].as_str() {
        return Err(KubeError::Invalid(format!("the CSI snapshot of {what} failed: {message}")));
    }
    let set = match field {
        "readyToUse" => snap["status"]["readyToUse"].as_bool() == Some(true),
        other => !snap["status"][other].is_null(),
    };
    Ok(set.then_some(snap))
}

pub struct VolumeSnapshot;

impl StageId for VolumeSnapshot {
    const NAME: &'static str = "volume-snapshot";
    type Output = Snapshotted;
}

#[async_trait]
impl Stage<BackupContext> for VolumeSnapshot {
    fn summary(&self) -> &'static str {
        "take a CSI VolumeSnapshot of each KubeVirt guest volume while the API is down, and wait until each is cut"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, step: &Step<'_>) -> Vec<String> {
        match guest_volumes(step) {
            Ok(volumes) if !volumes.is_empty() => volumes
                .iter()
                .map(|v| format!("snapshot PVC {}/{} with VolumeSnapshotClass {} and wait until it is cut (up to {})", v.namespace, v.name, v.snapshot_class, crate::duration::show(ctx.inputs.wait_timeout())))
                .collect(),
            _ => vec!["nothing: no guest volume to copy".into()],
        }
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let volumes = guest_volumes(step)?;
        let ns = ctx.hcp_namespace();
        let taken = Snapshotted {
            namespace: ns.clone(),
            snapshots: volumes.iter().enumerate().map(|(i, v)| Taken { volume: v.name.clone(), snapshot: object_name(ctx, i) }).collect(),
        };
        if taken.snapshots.is_empty() {
            return Ok(taken);
        }
        // journaled before anything exists, so an undo finds every snapshot
        step.record(serde_json::to_value(&taken)?)?;
        let snapshots = api(&ctx.client, &VOLUME_SNAPSHOT, &ns);
        for (t, v) in taken.snapshots.iter().zip(&volumes) {
            let body = json!({
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshot",
                "metadata": {"name": t.snapshot, "namespace": ns, "labels": labels(ctx), "annotations": {"hcp-dr.openshift.io/volume": v.name}},
                "spec": {"volumeSnapshotClassName": v.snapshot_class, "source": {"persistentVolumeClaimName": v.name}},
            });
            let obj: kube::api::DynamicObject = serde_json::from_value(body)?;
            match snapshots.create(&PostParams::default(), &obj).await {
                Ok(_) => {}
                // a resumed run: the snapshot of the run before is the one journaled
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(err) => return Err(KubeError::Request { action: format!("creating VolumeSnapshot {ns}/{}", t.snapshot), source: err }.into()),
            }
        }
        for t in &taken.snapshots {
            let what = format!("VolumeSnapshot {ns}/{} of guest volume {} to be cut", t.snapshot, t.volume);
            wait_for(&what, ctx.inputs.wait_timeout(), EVERY, || snapshot_state(ctx, &ns, &t.snapshot, "creationTime")).await?;
        }
        Ok(taken)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut BackupContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        match input.record::<Snapshotted>()? {
            Some(taken) => delete_snapshots(ctx, &taken).await,
            None => Ok(()),
        }
    }
}

/// One guest volume in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Copied {
    pub volume: String,
    /// What is stored (ciphertext when encrypted).
    pub artifact: Artifact,
    /// For an encrypted backup: the tar's size and SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plaintext: Option<Artifact>,
    /// Files, directories and links in the tar.
    pub files: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VolumesCopied {
    pub volumes: Vec<Copied>,
}

pub struct VolumeCopy;

impl StageId for VolumeCopy {
    const NAME: &'static str = "volume-copy";
    type Output = VolumesCopied;
}

/// The data-mover image: `--mover-image`, else hcp-dr's own of this version.
pub fn default_mover_image(given: Option<&str>) -> String {
    given.map(str::to_string).unwrap_or_else(|| format!("quay.io/hcp-dr/hcp-dr:v{}", env!("CARGO_PKG_VERSION")))
}

fn mover_image(ctx: &BackupContext) -> String {
    default_mover_image(ctx.inputs.platform.mover_image.as_deref())
}

/// A random bearer token for one mover (never journaled or printed).
fn new_token() -> Result<String, std::io::Error> {
    use std::io::Read;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(crate::store::hex(&bytes))
}

/// The Job running a mover on `claim`, mounted at [`MOUNT_PATH`], placed
/// like the control plane (`placement`: the HostedCluster's nodeSelector
/// and tolerations, [`crate::hosted::HostedCluster::control_plane_placement`]):
/// where the cluster keeps nodes for control planes, its claims are
/// reachable from there, and a node the control plane may not use may not
/// be one hcp-dr should use either.
/// The token is in the pod's environment, not a Secret: creating Secrets in
/// every control-plane namespace would let a backup's service account mint
/// service-account tokens there. It is single-use, lives as long as the Job,
/// and is seen only by who may read the Jobs and pods of that namespace.
pub fn mover_job(name: &str, namespace: &str, claim: &str, image: &str, token: &str, labels: &Value, placement: &Value, deadline: Duration) -> Value {
    let mut job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline.as_secs().max(60),
            "template": {
                "metadata": {"labels": labels, "annotations": {MOVER_ANNOTATION: MOVER_PROTOCOL}},
                "spec": {
                    "restartPolicy": "Never",
                    // it never calls the API: no token mounted into a root container
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "mover",
                        "image": image,
                        "command": ["hcp-dr", "volume-mover", "--dir", MOUNT_PATH, "--port", MOVER_PORT.to_string()],
                        "env": [{"name": TOKEN_ENV, "value": token}],
                        "ports": [{"name": "mover", "containerPort": MOVER_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": MOVER_PORT}, "periodSeconds": 2},
                        // reads and writes every file of the volume, whoever owns it
                        "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false},
                        "volumeMounts": [{"name": "volume", "mountPath": MOUNT_PATH}],
                    }],
                    "volumes": [{"name": "volume", "persistentVolumeClaim": {"claimName": claim}}],
                },
            },
        },
    });
    for (field, value) in placement.as_object().into_iter().flatten() {
        job["spec"]["template"]["spec"][field] = value.clone();
    }
    job
}

/// Create `obj` (a built-in kind) unless an object of that name exists
/// (an interrupted run's, used as it is); one being deleted (a failed try's,
/// held by a finalizer) is waited out first, up to `timeout`, and replaced.
pub async fn create<K>(api: &Api<K>, obj: Value, what: &str, timeout: Duration) -> Result<(), KubeError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Serialize + std::fmt::Debug + Send + 'static,
{
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    crate::teardown::await_deletion(api, &name, what, timeout).await?;
    let typed: K = serde_json::from_value(obj).map_err(|e| KubeError::Invalid(format!("{what}: {e}")))?;
    match api.create(&PostParams::default(), &typed).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(KubeError::Request { action: format!("creating {what}"), source: err }),
    }
}

/// The running mover pod of Job `job`: its pod IP once it is Ready; `Err`
/// when it failed (with its termination message).
pub async fn mover_pod(client: &kube::Client, ns: &str, job: &str) -> Result<Option<(String, String)>, KubeError> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let Some(found) = jobs.get_opt(job).await.map_err(request(format!("reading Job {ns}/{job}")))? else {
        return Err(KubeError::Invalid(format!("the data mover Job {ns}/{job} was deleted by something else")));
    };
    let failed = found.status.and_then(|s| s.conditions).unwrap_or_default().into_iter().find(|c| c.type_ == "Failed" && c.status == "True");
    if let Some(failed) = failed {
        return Err(KubeError::Invalid(format!(
            "the data mover Job {ns}/{job} failed ({}: {})",
            failed.reason.unwrap_or_default(),
            failed.message.unwrap_or_default()
        )));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .map_err(request(format!("listing the pods of Job {ns}/{job}")))?;
    for pod in list.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(status) = pod.status else { continue };
        if status.phase.as_deref() == Some("Failed") {
            let message = status
                .container_statuses
                .iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
                .next()
                .unwrap_or_else(|| "no termination message".into());
            return Err(KubeError::Invalid(format!("the data mover pod {ns}/{name} failed: {}", message.trim())));
        }
        let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
        if let (true, Some(ip)) = (ready, status.pod_ip.filter(|ip| !ip.is_empty())) {
            return Ok(Some((name, ip)));
        }
    }
    Ok(None)
}

/// How to reach a mover pod: its IP, or a port-forward (kept alive by the
/// returned forward) under the same `--etcd-access` rule as etcd members.
pub async fn reach_mover(client: &kube::Client, ns: &str, pod: &str, pod_ip: &str, access: EtcdAccess) -> Result<(std::net::SocketAddr, Option<LocalForward>), StageFailure> {
    let direct: std::net::SocketAddr = format!("{pod_ip}:{MOVER_PORT}")
        .parse()
        .or_else(|_| format!("[{pod_ip}]:{MOVER_PORT}").parse())
        .map_err(|e| KubeError::Invalid(format!("pod {ns}/{pod} has an unusable IP `{pod_ip}`: {e}")))?;
    let use_pod_ip = match access {
        EtcdAccess::PodIp => true,
        EtcdAccess::PortForward => false,
        EtcdAccess::Auto => matches!(tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(direct)).await, Ok(Ok(_))),
    };
    if use_pod_ip {
        return Ok((direct, None));
    }
    let forward = LocalForward::start(client, ns, pod, MOVER_PORT).await?;
    Ok((forward.local_addr(), Some(forward)))
}

/// `err`, and what the mover's Job or pod says of the failure when it
/// says something within a few seconds (a pod that died mid-stream).
pub async fn with_mover_state(client: &kube::Client, ns: &str, job: &str, err: StageFailure) -> StageFailure {
    let said = wait_for("the data mover to report", Duration::from_secs(5), EVERY, || async {
        match mover_pod(client, ns, job).await {
            Err(state) => Ok(Some(state.to_string())),
            Ok(_) => Ok(None),
        }
    })
    .await;
    match said {
        Ok(state) => StageError::Precondition(format!("{}; {state}", crate::pipeline::stage::error_chain(err.as_ref()))).into(),
        Err(_) => err,
    }
}

/// Delete a Job (and its pods) and a PVC of one mover; absent is fine.
pub async fn remove_mover(client: &kube::Client, ns: &str, name: &str, claim: Option<&str>) -> Result<(), KubeError> {
    let background = DeleteParams { propagation_policy: Some(kube::api::PropagationPolicy::Background), ..Default::default() };
    let gone = |r: Result<(), kube::Error>, what: String| match r {
        Ok(()) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(KubeError::Request { action: format!("deleting {what}"), source: err }),
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    gone(jobs.delete(name, &background).await.map(|_| ()), format!("Job {ns}/{name}"))?;
    if let Some(claim) = claim {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        gone(pvcs.delete(claim, &DeleteParams::default()).await.map(|_| ()), format!("PersistentVolumeClaim {ns}/{claim}"))?;
    }
    Ok(())
}

/// Start a mover Job on `claim` and wait until it serves: its client (and
/// the forward that reaches it, if any).
pub async fn start_mover(
    client: &kube::Client,
    ns: &str,
    name: &str,
    claim: &str,
    image: &str,
    labels: &Value,
    placement: &Value,
    access: EtcdAccess,
    timeout: Duration,
) -> Result<(MoverClient, Option<LocalForward>), StageFailure> {
    let token = new_token().map_err(|e| KubeError::Invalid(format!("reading /dev/urandom for a mover token: {e}")))?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    // a Job left by an interrupted run has another token: it goes first
    remove_mover(client, ns, name, None).await?;
    let job: Job = serde_json::from_value(mover_job(name, ns, claim, image, &token, labels, placement, Duration::from_secs(24 * 3600)))
        .map_err(|e| KubeError::Invalid(format!("Job {ns}/{name}: {e}")))?;
    let what = format!("the Job {ns}/{name} an interrupted run left to be deleted");
    wait_for(&what, timeout, EVERY, || async {
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => Ok(Some(())),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(err) => Err(KubeError::Request { action: format!("creating Job {ns}/{name}"), source: err }),
        }
    })
    .await?;
    let what = format!("the data mover of Job {ns}/{name} (image {image}) to be ready");
    let (pod, ip) = wait_for(&what, timeout, EVERY, || mover_pod(client, ns, name)).await?;
    let (addr, forward) = reach_mover(client, ns, &pod, &ip, access).await?;
    let mover = MoverClient::new(addr, token);
    let reached = format!("the data mover pod {ns}/{pod} at {addr} to answer");
    wait_for(&reached, timeout, EVERY, || async { Ok(mover.ready().await.then_some(())) }).await?;
    Ok((mover, forward))
}

impl VolumeCopy {
    async fn copy_one(&self, ctx: &BackupContext, index: usize, volume: &GuestVolume, taken: &Taken, ns: &str) -> Result<Copied, StageFailure> {
        let name = object_name(ctx, index);
        let what = format!("VolumeSnapshot {ns}/{} of guest volume {} to be ready", taken.snapshot, volume.name);
        let snap = wait_for(&what, ctx.inputs.wait_timeout(), EVERY, || snapshot_state(ctx, ns, &taken.snapshot, "readyToUse")).await?;
        // the scratch claim must hold the snapshot: at least its restoreSize
        let size = snap["status"]["restoreSize"].as_str().map(str::to_string).filter(|_| volume.size.is_empty()).unwrap_or_else(|| volume.size.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        let claim = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns, "labels": labels(ctx)},
            "spec": {
                "storageClassName": volume.storage_class,
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": size}},
                "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": taken.snapshot},
            },
        });
        create(&pvcs, claim, &format!("PersistentVolumeClaim {ns}/{name}"), ctx.inputs.wait_timeout()).await?;
        let hc = crate::stages::etcd_ops::health::hosted_cluster(&ctx.client, &ctx.inputs.namespace, &ctx.inputs.hosted_cluster).await?;
        let placement = hc.control_plane_placement();
        let (mover, _forward) = start_mover(&ctx.client, ns, &name, &name, &mover_image(ctx), &labels(ctx), &placement, ctx.inputs.etcd_access, ctx.inputs.wait_timeout()).await?;
        let key = ctx.inputs.layout().artifact(&artifact_name(&volume.name));
        let body = mover.archive().await?;
        let put = match ctx.artifact_store().put(&key, body).await {
            Ok(put) => put,
            Err(err) => return Err(with_mover_state(&ctx.client, ns, &name, err.into()).await),
        };
        let sent = mover.digest().await?;
        let plaintext = match &ctx.sealing {
            Some(sealing) => Some(sealing.plaintext(&key).ok_or(StageError::Missing("the plaintext digest of a guest volume"))?),
            None => None,
        };
        let received = plaintext.as_ref().map(|p| (p.size, p.sha256.clone())).unwrap_or((put.size, put.sha256.clone()));
        if (sent.bytes, sent.sha256.as_str()) != (received.0, received.1.as_str()) {
            return Err(StageError::Precondition(format!(
                "guest volume {ns}/{}: the mover sent {} bytes with SHA-256 {}, but {} bytes with SHA-256 {} reached the store: the copy is corrupt",
                volume.name, sent.bytes, sent.sha256, received.0, received.1
            ))
            .into());
        }
        if let Err(err) = mover.exit().await {
            tracing::warn!("{err}; its Job is deleted anyway");
        }
        remove_mover(&ctx.client, ns, &name, Some(&name)).await?;
        let artifact = |size, sha256| Artifact { name: artifact_name(&volume.name), size, sha256 };
        Ok(Copied {
            volume: volume.name.clone(),
            artifact: artifact(put.size, put.sha256),
            plaintext: plaintext.map(|p| artifact(p.size, p.sha256)),
            files: sent.files,
        })
    }
}

#[async_trait]
impl Stage<BackupContext> for VolumeCopy {
    fn summary(&self) -> &'static str {
        "copy each guest volume's snapshot into the store through a data-mover Job (volumes/<pvc>.tar), then delete the snapshots"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, step: &Step<'_>) -> Vec<String> {
        match guest_volumes(step) {
            Ok(volumes) if !volumes.is_empty() => volumes
                .iter()
                .map(|v| {
                    format!(
                        "restore the snapshot of {}/{} into a scratch PVC, run a data-mover Job ({}) on it and stream it to {}/{}",
                        v.namespace,
                        v.name,
                        mover_image(ctx),
                        ctx.store.url(),
                        ctx.inputs.layout().artifact(&artifact_name(&v.name))
                    )
                })
                .collect(),
            _ => vec!["nothing: no guest volume to copy".into()],
        }
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let volumes = guest_volumes(step)?;
        let taken = step.needs::<VolumeSnapshot>()?;
        let ns = taken.namespace.clone();
        let mut copied = VolumesCopied::default();
        for (index, (volume, t)) in volumes.iter().zip(&taken.snapshots).enumerate() {
            match self.copy_one(ctx, index, volume, t, &ns).await {
                Ok(c) => {
                    copied.volumes.push(c);
                    step.record(serde_json::to_value(&copied)?)?;
                }
                Err(err) => {
                    // the mover's objects go now; the journal's undo removes the rest
                    let name = object_name(ctx, index);
                    if let Err(cleanup) = remove_mover(&ctx.client, &ns, &name, Some(&name)).await {
                        tracing::warn!("{cleanup}");
                    }
                    return Err(err);
                }
            }
        }
        delete_snapshots(ctx, &taken).await?;
        Ok(copied)
    }
    fn undoable(&self) -> bool {
        true
    }
    /// The store's volume artifacts and every mover object of this backup.
    async fn undo(&self, ctx: &mut BackupContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let taken: Option<Snapshotted> = input.output_of::<VolumeSnapshot>()?;
        let Some(taken) = taken else { return Ok(()) };
        for t in &taken.snapshots {
            ctx.store.delete(&ctx.inputs.layout().artifact(&artifact_name(&t.volume))).await?;
        }
        for index in 0..taken.snapshots.len() {
            let name = object_name(ctx, index);
            remove_mover(&ctx.client, &taken.namespace, &name, Some(&name)).await?;
        }
        Ok(())
    }
}
