//! The storage a KubeVirt management cluster gives its guest clusters: one
//! CSI driver ([`SANDBOX_CSI_DRIVER`]) with its default StorageClass
//! ([`SANDBOX_STORAGE_CLASS`]) and VolumeSnapshotClass
//! ([`SANDBOX_SNAPSHOT_CLASS`]), and the CSI snapshot controller with that
//! driver's snapshotter sidecar, as external-snapshotter runs them.
//!
//! A VolumeSnapshot of a claim in its namespace (`spec.source.
//! persistentVolumeClaimName`) gets its class (the named one, or the
//! driver's default, written into `spec.volumeSnapshotClassName`), the
//! finalizers `volumesnapshot-as-source-protection` and
//! `volumesnapshot-bound-protection`, a cluster-scoped VolumeSnapshotContent
//! `snapcontent-<uid>` (with the finalizer
//! `volumesnapshotcontent-bound-protection`), and is cut: the claim's data
//! directory is copied (files, directories, symlinks, modes, mtimes) to
//! `state_dir/snapshots/<content>/` ([`snapshot_dir`]) while the claim holds
//! `pvc-as-source-protection`. The cut shows in two steps, as with a real
//! driver: `creationTime` and `restoreSize` first, `readyToUse: true` on the
//! next pass. A class that does not exist, no default class, or a class of
//! another driver is reported in `status.error` and nothing else is done
//! (retried every pass, as the real controller does).
//!
//! Deleting the snapshot waits while a claim being provisioned from it is
//! not bound; then, with `deletionPolicy: Delete`, the content and its data
//! go, with `Retain` both stay; the finalizers are removed last.
//!
//! Sandbox differences: no PersistentVolume objects exist (a claim's
//! `spec.volumeName` is its volume handle); the snapshot's size is the
//! claim's capacity, as CSI drivers report it; pre-provisioned snapshots
//! (`spec.source.volumeSnapshotContentName`), group snapshots and snapshot
//! secrets are not simulated; file ownership is not copied.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{Value, json};

use super::objects::{
    PVC, STORAGE_CLASS, VOLUME_SNAPSHOT, VOLUME_SNAPSHOT_CLASS, VOLUME_SNAPSHOT_CONTENT,
    is_deleting, name_of, ns_of, str_at, uid_of,
};
use super::workloads::{add_finalizer, existing_pv_dir, patch_status_if_changed, remove_finalizers};
use super::{Ctx, OperatorError, io_err, log_failure};

/// The default StorageClass of every sandbox management cluster.
pub const SANDBOX_STORAGE_CLASS: &str = "sandbox-csi";
/// The CSI driver (provisioner and snapshotter) behind it.
pub const SANDBOX_CSI_DRIVER: &str = "csi.sandbox.hcp-dr.io";
/// The default VolumeSnapshotClass of [`SANDBOX_CSI_DRIVER`].
pub const SANDBOX_SNAPSHOT_CLASS: &str = "sandbox-csi-snapshots";
/// The annotation marking the default StorageClass.
pub const DEFAULT_STORAGE_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// The annotation marking a driver's default VolumeSnapshotClass.
pub const DEFAULT_SNAPSHOT_CLASS_ANNOTATION: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// On a VolumeSnapshot while a claim may be provisioned from it.
pub const SNAPSHOT_AS_SOURCE_PROTECTION: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// On a VolumeSnapshot bound to its content.
pub const SNAPSHOT_BOUND_PROTECTION: &str = "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
/// On a claim while a snapshot of it is being cut.
pub const PVC_AS_SOURCE_PROTECTION: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";
/// On a VolumeSnapshotContent bound to its snapshot.
pub const CONTENT_BOUND_PROTECTION: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// The API group of the snapshot kinds.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

/// The StorageClass and VolumeSnapshotClass a sandbox management cluster
/// has (what installing the CSI driver gives a real one).
pub fn storage_objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": SANDBOX_STORAGE_CLASS, "annotations": {DEFAULT_STORAGE_CLASS_ANNOTATION: "true"}},
            "provisioner": SANDBOX_CSI_DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": true}),
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": SANDBOX_SNAPSHOT_CLASS, "annotations": {DEFAULT_SNAPSHOT_CLASS_ANNOTATION: "true"}},
            "driver": SANDBOX_CSI_DRIVER, "deletionPolicy": "Delete"}),
    ]
}

/// Where the data of VolumeSnapshotContent `content` is kept.
pub fn snapshot_dir(state_dir: &Path, content: &str) -> PathBuf {
    state_dir.join("snapshots").join(content)
}

/// Everything one pass reads.
struct World {
    snapshots: Vec<Value>,
    classes: Vec<Value>,
    storage_classes: Vec<Value>,
    contents: Vec<Value>,
    pvcs: Vec<Value>,
}

fn find<'a>(list: &'a [Value], ns: &str, name: &str) -> Option<&'a Value> {
    list.iter().find(|o| ns_of(o) == ns && name_of(o) == name)
}

fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|f| f.as_str() == Some(finalizer)))
}

/// One pass of the snapshot controller and the driver's snapshotter.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let snapshots = ctx.kube.list_if_served(&VOLUME_SNAPSHOT, None).await?;
    let contents = ctx.kube.list_if_served(&VOLUME_SNAPSHOT_CONTENT, None).await?;
    let pvcs = ctx.kube.list(&PVC, None, None).await?;
    if snapshots.is_empty() && contents.is_empty() && !pvcs.iter().any(|p| has_finalizer(p, PVC_AS_SOURCE_PROTECTION)) {
        return Ok(());
    }
    let world = World {
        snapshots,
        classes: ctx.kube.list_if_served(&VOLUME_SNAPSHOT_CLASS, None).await?,
        storage_classes: ctx.kube.list_if_served(&STORAGE_CLASS, None).await?,
        contents,
        pvcs,
    };
    for vs in &world.snapshots {
        let done = if is_deleting(vs) { delete_snapshot(&ctx, vs, &world).await } else { sync_snapshot(&ctx, vs, &world).await };
        if let Err(e) = done {
            log_failure("snapshot-controller", &format!("{}/{}", ns_of(vs), name_of(vs)), &e);
        }
    }
    for content in &world.contents {
        if let Err(e) = sync_orphan(&ctx, content, &world).await {
            log_failure("snapshot-controller", name_of(content), &e);
        }
    }
    release_sources(&ctx, &world).await;
    Ok(())
}

/// The provisioner of a claim's volume: the one that bound it (its
/// `volume.kubernetes.io/storage-provisioner` annotation), else its class's.
pub(crate) fn provisioner_of<'a>(pvc: &'a Value, storage_classes: &'a [Value]) -> Option<&'a str> {
    str_at(pvc, "/metadata/annotations/volume.kubernetes.io~1storage-provisioner").or_else(|| {
        let class = str_at(pvc, "/spec/storageClassName")?;
        storage_classes.iter().find(|c| name_of(c) == class).and_then(|c| str_at(c, "/provisioner"))
    })
}

/// The VolumeSnapshot a claim is to be provisioned from, if any
/// (`spec.dataSourceRef`, else `spec.dataSource`).
pub(crate) fn snapshot_source(pvc: &Value) -> Option<&str> {
    ["/spec/dataSourceRef", "/spec/dataSource"].iter().find_map(|p| {
        let r = pvc.pointer(p).filter(|r| r.is_object())?;
        (str_at(r, "/apiGroup") == Some(SNAPSHOT_GROUP) && str_at(r, "/kind") == Some("VolumeSnapshot"))
            .then(|| str_at(r, "/name"))
            .flatten()
    })
}

fn is_bound(pvc: &Value) -> bool {
    str_at(pvc, "/status/phase") == Some("Bound")
}

/// `status.error` set (once per message), `readyToUse: false`; nothing else.
async fn set_error(ctx: &Ctx, vs: &Value, message: String) -> Result<(), OperatorError> {
    if str_at(vs, "/status/error/message") == Some(message.as_str()) {
        return Ok(());
    }
    tracing::info!(namespace = ns_of(vs), snapshot = name_of(vs), "{message}");
    let _ = ctx.kube.event(&VOLUME_SNAPSHOT, vs, true, "SnapshotCreationFailed", &message, "snapshot-controller").await;
    ctx.kube
        .merge_status(&VOLUME_SNAPSHOT, Some(ns_of(vs)), name_of(vs),
            &json!({"status": {"error": {"message": message, "time": super::objects::now()}, "readyToUse": false}}))
        .await
        .map(|_| ())
}

async fn sync_snapshot(ctx: &Ctx, vs: &Value, world: &World) -> Result<(), OperatorError> {
    let (ns, name) = (ns_of(vs), name_of(vs));
    let Some(pvc_name) = str_at(vs, "/spec/source/persistentVolumeClaimName") else {
        return Ok(()); // a pre-provisioned snapshot: not simulated
    };
    let content_name = format!("snapcontent-{}", uid_of(vs));
    if let Some(content) = world.contents.iter().find(|c| name_of(c) == content_name) {
        return advance(ctx, vs, content, world).await;
    }
    let Some(pvc) = find(&world.pvcs, ns, pvc_name) else {
        return set_error(ctx, vs, format!(
            "Failed to create snapshot content with error failed to get input parameters to create snapshot {name}: \"persistentvolumeclaim \\\"{pvc_name}\\\" not found\""
        ))
        .await;
    };
    if is_deleting(pvc) {
        return set_error(ctx, vs, format!("the PVC {pvc_name} is being deleted, will not attempt to take a snapshot")).await;
    }
    let volume = str_at(pvc, "/spec/volumeName").filter(|v| !v.is_empty());
    let Some(volume) = volume.filter(|_| is_bound(pvc)) else {
        return set_error(ctx, vs, format!("the PVC {pvc_name} is not yet bound to a PV, will not attempt to take a snapshot")).await;
    };
    let provisioner = provisioner_of(pvc, &world.storage_classes).unwrap_or_default();
    if provisioner != SANDBOX_CSI_DRIVER && provisioner != super::workloads::LOCAL_PROVISIONER {
        return Ok(()); // a volume of a provisioner the sandbox does not play (an external cluster's own)
    }
    let mut vs = vs.clone();
    let class = match str_at(&vs, "/spec/volumeSnapshotClassName") {
        Some(class_name) => match world.classes.iter().find(|c| name_of(c) == class_name) {
            Some(c) => c,
            None => {
                return set_error(ctx, &vs, format!(
                    "Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io \"{class_name}\" not found"
                ))
                .await;
            }
        },
        None => {
            let defaults: Vec<&Value> = world
                .classes
                .iter()
                .filter(|c| {
                    str_at(c, "/driver") == Some(provisioner)
                        && str_at(c, &format!("/metadata/annotations/{}", DEFAULT_SNAPSHOT_CLASS_ANNOTATION.replace('/', "~1")))
                            == Some("true")
                })
                .collect();
            let [class] = defaults.as_slice() else {
                let why = match defaults.len() {
                    0 => "cannot find default snapshot class".to_string(),
                    n => format!("{n} default snapshot classes were found"),
                };
                return set_error(ctx, &vs, format!("Failed to set default snapshot class with error {why}")).await;
            };
            let class: &Value = class;
            // as the controller does: the snapshot names the class it got
            vs = ctx
                .kube
                .merge(&VOLUME_SNAPSHOT, Some(ns), name,
                    &json!({"metadata": {"resourceVersion": vs.pointer("/metadata/resourceVersion")},
                            "spec": {"volumeSnapshotClassName": name_of(class)}}))
                .await?;
            class
        }
    };
    let driver = str_at(class, "/driver").unwrap_or_default();
    if driver != provisioner {
        return set_error(ctx, &vs, format!(
            "Failed to create snapshot: VolumeSnapshotClass {} is for driver {driver}, but the volume of PersistentVolumeClaim {pvc_name} was provisioned by {provisioner}",
            name_of(class)
        ))
        .await;
    }
    if driver != SANDBOX_CSI_DRIVER {
        return Ok(()); // another driver's snapshotter would cut it
    }
    let mut with_finalizers = vs.clone();
    for f in [SNAPSHOT_AS_SOURCE_PROTECTION, SNAPSHOT_BOUND_PROTECTION] {
        add_finalizer(ctx, &VOLUME_SNAPSHOT, &with_finalizers, f).await?;
        with_finalizers = ctx.kube.get(&VOLUME_SNAPSHOT, Some(ns), name).await?.unwrap_or(with_finalizers);
    }
    let content = json!({
        "metadata": {"name": content_name, "finalizers": [CONTENT_BOUND_PROTECTION]},
        "spec": {
            "deletionPolicy": str_at(class, "/deletionPolicy").unwrap_or("Delete"),
            "driver": driver,
            "source": {"volumeHandle": volume},
            "volumeSnapshotClassName": name_of(class),
            "volumeSnapshotRef": {"apiVersion": VOLUME_SNAPSHOT.api_version(), "kind": "VolumeSnapshot",
                "namespace": ns, "name": name, "uid": uid_of(&vs),
                "resourceVersion": with_finalizers.pointer("/metadata/resourceVersion")},
        },
    });
    let content = ctx.kube.create(&VOLUME_SNAPSHOT_CONTENT, None, content).await?;
    add_finalizer(ctx, &PVC, pvc, PVC_AS_SOURCE_PROTECTION).await?;
    ctx.kube
        .merge_status(&VOLUME_SNAPSHOT, Some(ns), name,
            &json!({"status": {"boundVolumeSnapshotContentName": content_name, "readyToUse": false, "error": null}}))
        .await?;
    tracing::info!(namespace = ns, snapshot = name, pvc = pvc_name, content = %content_name, "cutting a snapshot");
    cut(ctx, &vs, &content, pvc).await
}

/// The driver's CreateSnapshot: copy the claim's data, then report the
/// content's handle, time and size, and the snapshot's (not ready yet).
async fn cut(ctx: &Ctx, vs: &Value, content: &Value, pvc: &Value) -> Result<(), OperatorError> {
    let src = existing_pv_dir(&ctx.cfg.state_dir, pvc).ok_or_else(|| OperatorError::Waiting(format!(
        "the data of PersistentVolumeClaim {}/{}",
        ns_of(pvc),
        name_of(pvc)
    )))?;
    let dst = snapshot_dir(&ctx.cfg.state_dir, name_of(content));
    let (from, to) = (src.clone(), dst.clone());
    tokio::task::spawn_blocking(move || replace_with_copy(&from, &to))
        .await
        .map_err(|e| OperatorError::Invalid { what: format!("copy task: {e}") })??;
    let size = claim_bytes(pvc);
    let taken = chrono::Utc::now();
    let nanos = taken.timestamp_nanos_opt().unwrap_or_default();
    ctx.kube
        .merge_status(&VOLUME_SNAPSHOT_CONTENT, None, name_of(content),
            &json!({"status": {"snapshotHandle": name_of(content), "creationTime": nanos, "readyToUse": false, "restoreSize": size}}))
        .await?;
    ctx.kube
        .merge_status(&VOLUME_SNAPSHOT, Some(ns_of(vs)), name_of(vs),
            &json!({"status": {"boundVolumeSnapshotContentName": name_of(content), "readyToUse": false,
                "creationTime": taken.format("%Y-%m-%dT%H:%M:%SZ").to_string(), "restoreSize": format_bytes(size), "error": null}}))
        .await?;
    Ok(())
}

/// A snapshot with a content: cut it if not yet, then mark both ready, then
/// keep the snapshot's status in line with the content's.
async fn advance(ctx: &Ctx, vs: &Value, content: &Value, world: &World) -> Result<(), OperatorError> {
    if content.pointer("/status/creationTime").is_none() {
        let Some(pvc) = str_at(vs, "/spec/source/persistentVolumeClaimName").and_then(|p| find(&world.pvcs, ns_of(vs), p)) else {
            return set_error(ctx, vs, "Failed to cut the snapshot: its PersistentVolumeClaim is gone".to_string()).await;
        };
        return cut(ctx, vs, content, pvc).await;
    }
    if content.pointer("/status/readyToUse") != Some(&json!(true)) {
        ctx.kube
            .merge_status(&VOLUME_SNAPSHOT_CONTENT, None, name_of(content), &json!({"status": {"readyToUse": true}}))
            .await?;
        tracing::info!(namespace = ns_of(vs), snapshot = name_of(vs), content = name_of(content), "snapshot ready to use");
    }
    let nanos = content.pointer("/status/creationTime").and_then(Value::as_i64).unwrap_or_default();
    let taken = chrono::DateTime::from_timestamp_nanos(nanos);
    let size = content.pointer("/status/restoreSize").and_then(Value::as_u64).unwrap_or_default();
    let status = json!({"boundVolumeSnapshotContentName": name_of(content), "readyToUse": true,
        "creationTime": taken.format("%Y-%m-%dT%H:%M:%SZ").to_string(), "restoreSize": format_bytes(size as u128)});
    if vs.pointer("/status/error").is_some_and(|e| !e.is_null()) {
        ctx.kube
            .merge_status(&VOLUME_SNAPSHOT, Some(ns_of(vs)), name_of(vs), &json!({"status": {"error": null}}))
            .await?;
    }
    patch_status_if_changed(ctx, &VOLUME_SNAPSHOT, vs, status).await
}

/// A deleted snapshot: once no claim is being provisioned from it, its
/// content (and data, with `deletionPolicy: Delete`) goes, then its
/// finalizers.
async fn delete_snapshot(ctx: &Ctx, vs: &Value, world: &World) -> Result<(), OperatorError> {
    if ![SNAPSHOT_AS_SOURCE_PROTECTION, SNAPSHOT_BOUND_PROTECTION].iter().any(|f| has_finalizer(vs, f)) {
        return Ok(());
    }
    let (ns, name) = (ns_of(vs), name_of(vs));
    let restoring = world
        .pvcs
        .iter()
        .any(|p| ns_of(p) == ns && snapshot_source(p) == Some(name) && !is_bound(p) && !is_deleting(p));
    if restoring {
        return Ok(());
    }
    let content_name = str_at(vs, "/status/boundVolumeSnapshotContentName")
        .map(str::to_string)
        .unwrap_or_else(|| format!("snapcontent-{}", uid_of(vs)));
    if let Some(content) = world.contents.iter().find(|c| name_of(c) == content_name) {
        release_content(ctx, content).await?;
    }
    let current = ctx.kube.get(&VOLUME_SNAPSHOT, Some(ns), name).await?;
    if let Some(current) = current {
        remove_finalizers(ctx, &VOLUME_SNAPSHOT, &current, &[SNAPSHOT_AS_SOURCE_PROTECTION, SNAPSHOT_BOUND_PROTECTION]).await?;
        tracing::info!(namespace = ns, snapshot = name, content = %content_name, "snapshot deleted");
    }
    Ok(())
}

/// A content whose snapshot is gone: deleted with its data (`Delete`) or
/// kept (`Retain`), and no longer bound.
async fn release_content(ctx: &Ctx, content: &Value) -> Result<(), OperatorError> {
    let delete = str_at(content, "/spec/deletionPolicy") == Some("Delete");
    if delete {
        if !is_deleting(content) {
            ctx.kube.delete(&VOLUME_SNAPSHOT_CONTENT, None, name_of(content)).await?;
        }
        let dir = snapshot_dir(&ctx.cfg.state_dir, name_of(content));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io_err("removing", &dir))?;
        }
    }
    if let Some(current) = ctx.kube.get(&VOLUME_SNAPSHOT_CONTENT, None, name_of(content)).await? {
        remove_finalizers(ctx, &VOLUME_SNAPSHOT_CONTENT, &current, &[CONTENT_BOUND_PROTECTION]).await?;
    }
    Ok(())
}

/// A content of this driver whose snapshot no longer exists (deleted while
/// no controller ran, or its finalizers removed by hand).
async fn sync_orphan(ctx: &Ctx, content: &Value, world: &World) -> Result<(), OperatorError> {
    if str_at(content, "/spec/driver") != Some(SANDBOX_CSI_DRIVER) || !has_finalizer(content, CONTENT_BOUND_PROTECTION) {
        return Ok(());
    }
    let uid = str_at(content, "/spec/volumeSnapshotRef/uid").unwrap_or_default();
    if world.snapshots.iter().any(|vs| uid_of(vs) == uid) {
        return Ok(());
    }
    // listed before the contents: a snapshot made since is not orphaned
    let (ns, name) = (
        str_at(content, "/spec/volumeSnapshotRef/namespace").unwrap_or_default(),
        str_at(content, "/spec/volumeSnapshotRef/name").unwrap_or_default(),
    );
    if ctx.kube.get(&VOLUME_SNAPSHOT, Some(ns), name).await?.is_some_and(|vs| uid_of(&vs) == uid) {
        return Ok(());
    }
    release_content(ctx, content).await
}

/// Claims no snapshot is being cut from lose `pvc-as-source-protection`.
async fn release_sources(ctx: &Ctx, world: &World) {
    let cutting: HashSet<(&str, &str)> = world
        .snapshots
        .iter()
        .filter(|vs| {
            vs.pointer("/status/readyToUse") != Some(&json!(true))
                && world.contents.iter().any(|c| str_at(c, "/spec/volumeSnapshotRef/uid") == Some(uid_of(vs)))
        })
        .filter_map(|vs| Some((ns_of(vs), str_at(vs, "/spec/source/persistentVolumeClaimName")?)))
        .collect();
    for pvc in world.pvcs.iter().filter(|p| has_finalizer(p, PVC_AS_SOURCE_PROTECTION)) {
        if cutting.contains(&(ns_of(pvc), name_of(pvc))) {
            continue;
        }
        if let Err(e) = remove_finalizers(ctx, &PVC, pvc, &[PVC_AS_SOURCE_PROTECTION]).await {
            log_failure("snapshot-controller", &format!("{}/{}", ns_of(pvc), name_of(pvc)), &e);
        }
    }
}

/// The data a claim to be provisioned from snapshot `name` (in `ns`) starts
/// with, or why it cannot be provisioned yet (the external-provisioner's
/// `ProvisioningFailed` message): the snapshot must be bound to a content of
/// `provisioner`'s driver and ready, and no larger than `requested` bytes.
pub(crate) async fn restore_source(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    provisioner: &str,
    requested: Option<u128>,
) -> Result<Result<PathBuf, String>, OperatorError> {
    let Some(vs) = ctx.kube.get(&VOLUME_SNAPSHOT, Some(ns), name).await.or_else(|e| match super::objects::status_code(&e) {
        Some(404) => Ok(None),
        _ => Err(e),
    })?
    else {
        return Ok(Err(format!(
            "error getting handle for DataSource Type VolumeSnapshot by Name {name}: error getting snapshot {name} from api server: volumesnapshots.snapshot.storage.k8s.io \"{name}\" not found"
        )));
    };
    if is_deleting(&vs) {
        return Ok(Err(format!("error getting handle for DataSource Type VolumeSnapshot by Name {name}: snapshot {name} is currently being deleted")));
    }
    let Some(content_name) = str_at(&vs, "/status/boundVolumeSnapshotContentName") else {
        return Ok(Err(format!("error getting handle for DataSource Type VolumeSnapshot by Name {name}: snapshot {name} not bound")));
    };
    if vs.pointer("/status/readyToUse") != Some(&json!(true)) {
        return Ok(Err(format!("error getting handle for DataSource Type VolumeSnapshot by Name {name}: snapshot {name} is not Ready")));
    }
    let Some(content) = ctx.kube.get(&VOLUME_SNAPSHOT_CONTENT, None, content_name).await? else {
        return Ok(Err(format!(
            "error getting handle for DataSource Type VolumeSnapshot by Name {name}: error getting snapshot content {content_name} from api server: volumesnapshotcontents.snapshot.storage.k8s.io \"{content_name}\" not found"
        )));
    };
    let driver = str_at(&content, "/spec/driver").unwrap_or_default();
    if driver != provisioner {
        return Ok(Err(format!(
            "error getting handle for DataSource Type VolumeSnapshot by Name {name}: driver name {driver} defined in snapshot content {content_name} does not match driver name {provisioner} defined in storage class"
        )));
    }
    let size = content.pointer("/status/restoreSize").and_then(Value::as_u64).map(u128::from);
    if let (Some(size), Some(requested)) = (size, requested)
        && requested < size
    {
        return Ok(Err(format!("requested volume size {requested} is less than the size {size} for the source snapshot {name}")));
    }
    Ok(Ok(snapshot_dir(&ctx.cfg.state_dir, content_name)))
}

/// A claim's size in bytes: its capacity once bound, else its request.
pub(crate) fn claim_bytes(pvc: &Value) -> u128 {
    str_at(pvc, "/status/capacity/storage")
        .or_else(|| str_at(pvc, "/spec/resources/requests/storage"))
        .and_then(parse_quantity)
        .unwrap_or_default()
}

/// A Kubernetes quantity in bytes (`8Gi`, `500M`, `1.5Gi`, `1e9`, `1024`).
pub fn parse_quantity(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    let bytes = (number * factor).ceil();
    (bytes >= 0.0).then_some(bytes as u128)
}

/// Bytes as a canonical binary quantity (`10Gi`; `1500` when no power of
/// 1024 divides it), as a snapshot's `restoreSize` is printed.
pub fn format_bytes(bytes: u128) -> String {
    const SUFFIXES: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    if bytes == 0 {
        return "0".into();
    }
    for (i, suffix) in SUFFIXES.iter().enumerate() {
        let unit = 1u128 << (10 * (6 - i));
        if bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// Make `dst` a copy of `src` (replacing what was there), through a
/// scratch directory beside it so a half-made copy is never `dst`.
pub(crate) fn replace_with_copy(src: &Path, dst: &Path) -> Result<(), OperatorError> {
    // hidden beside `dst` (claim and content names never start with a dot)
    let file_name = dst.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let scratch = dst.with_file_name(format!(".{file_name}.copying"));
    for d in [&scratch, &dst.to_path_buf()] {
        if d.exists() {
            std::fs::remove_dir_all(d).map_err(io_err("removing", d))?;
        }
    }
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
    }
    copy_tree(src, &scratch).map_err(io_err("copying into", &scratch))?;
    std::fs::rename(&scratch, dst).map_err(io_err("moving the copy to", dst))
}

/// Copy directory `src` to `dst` (which must not exist): regular files,
/// directories and symlinks (as links), with their modes and mtimes.
/// Other file types (sockets, fifos, devices) are skipped.
pub fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    std::fs::create_dir(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let kind = entry.file_type()?;
        let m = std::fs::symlink_metadata(&from)?;
        if kind.is_dir() {
            copy_tree(&from, &to)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            set_times(&to, &m, true)?;
        } else if kind.is_file() {
            std::fs::copy(&from, &to)?;
            std::fs::set_permissions(&to, m.permissions())?;
            set_times(&to, &m, false)?;
        }
    }
    std::fs::set_permissions(dst, meta.permissions())?;
    set_times(dst, &meta, false)
}

/// Give `path` the access and modification times of `like` (of the link
/// itself with `nofollow`).
fn set_times(path: &Path, like: &std::fs::Metadata, nofollow: bool) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let spec = |t: std::io::Result<SystemTime>| {
        let d = t.ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).unwrap_or_default();
        libc::timespec {
            tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(i32::try_from(d.subsec_nanos()).unwrap_or(0)),
        }
    };
    let times = [spec(like.accessed()), spec(like.modified())];
    let flags = if nofollow { libc::AT_SYMLINK_NOFOLLOW } else { 0 };
    // SAFETY: `c_path` is a NUL-terminated path that outlives the call and
    // `times` points to the two timespecs utimensat(2) reads; no memory is
    // written.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), times.as_ptr(), flags) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn quantities_parse_and_print() {
        assert_eq!(parse_quantity("8Gi"), Some(8 << 30));
        assert_eq!(parse_quantity("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_quantity("500M"), Some(500_000_000));
        assert_eq!(parse_quantity("1e3"), Some(1000));
        assert_eq!(parse_quantity("12"), Some(12));
        assert_eq!(parse_quantity("8Gb"), None);
        assert_eq!(format_bytes(10 << 30), "10Gi");
        assert_eq!(format_bytes(1536), "1536");
        assert_eq!(format_bytes(3 << 29), "1536Mi");
        assert_eq!(format_bytes(0), "0");
    }

    #[test]
    fn trees_are_copied_with_links_modes_and_times() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("sub/deeper")).expect("dirs");
        std::fs::write(src.join("sub/deeper/file"), b"data").expect("file");
        std::fs::write(src.join("secret"), b"s").expect("file");
        std::fs::set_permissions(src.join("secret"), std::fs::Permissions::from_mode(0o600)).expect("mode");
        std::os::unix::fs::symlink("sub/deeper/file", src.join("link")).expect("link");
        std::fs::set_permissions(src.join("sub"), std::fs::Permissions::from_mode(0o750)).expect("mode");
        let old = std::fs::Metadata::modified(&std::fs::metadata(src.join("secret")).expect("meta")).expect("mtime")
            - std::time::Duration::from_secs(86_400);
        let f = std::fs::File::options().write(true).open(src.join("secret")).expect("open");
        f.set_modified(old).expect("set mtime");
        drop(f);
        let dst = tmp.path().join("dst");
        replace_with_copy(&src, &dst).expect("copy");
        assert_eq!(std::fs::read(dst.join("sub/deeper/file")).expect("read"), b"data");
        assert_eq!(std::fs::read_link(dst.join("link")).expect("link"), Path::new("sub/deeper/file"));
        let meta = |p: &Path| std::fs::symlink_metadata(p).expect("meta");
        assert_eq!(meta(&dst.join("secret")).mode() & 0o777, 0o600);
        assert_eq!(meta(&dst.join("sub")).mode() & 0o777, 0o750);
        assert_eq!(meta(&dst.join("secret")).modified().expect("mtime"), old);
        assert_eq!(meta(&dst.join("sub")).mtime(), meta(&src.join("sub")).mtime());
        assert_eq!(meta(&dst.join("link")).mtime(), meta(&src.join("link")).mtime());
        // a second copy replaces the first
        std::fs::remove_file(src.join("secret")).expect("rm");
        replace_with_copy(&src, &dst).expect("copy again");
        assert!(!dst.join("secret").exists());
    }

    #[test]
    fn claims_name_snapshot_sources() {
        let pvc = json!({"spec": {"dataSource": {"apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": "s1"}}});
        assert_eq!(snapshot_source(&pvc), Some("s1"));
        let clone = json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "p"}}});
        assert_eq!(snapshot_source(&clone), None);
    }
}
