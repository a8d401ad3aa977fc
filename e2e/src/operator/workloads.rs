//! The parts of kube-controller-manager and the kubelet the sandbox needs:
//! Deployments and StatefulSets become Pods and PVCs, pods "run" (status
//! Running/Ready with a loopback pod IP), PVCs get a data directory, the
//! garbage collector deletes objects whose controller is gone, the
//! PVC-protection controller holds PVCs used by pods. (Garbage collection by
//! ownerReferences and namespace termination run inside the API emulator.)
//!
//! Claims are provisioned by the provisioner of their StorageClass when it is
//! one of the sandbox's (the CSI driver of [`super::snapshots`], or the local
//! one), from a VolumeSnapshot or a claim when `spec.dataSource(Ref)` names
//! one (the new directory starts as a copy of its data).
//!
//! Where the cluster's own kube-controller-manager runs
//! ([`super::Controllers::Cluster`]) only the kubelet and provisioner parts
//! run here: the pods on the sandbox's Node ([`super::kubelet`]) and the
//! claims of the sandbox's classes, provisioned as PersistentVolume objects
//! pre-bound to the claim, which the cluster's binder binds; Deployments,
//! StatefulSets, garbage collection and PVC protection are the cluster's.
//!
//! Differences from a real cluster: Deployments own their pods directly (no
//! ReplicaSets); there is no scheduler or node (pods get `spec.nodeName` of a
//! virtual node); rolling updates are not simulated (a template change does not
//! replace pods); no PersistentVolume objects are made (a claim's
//! `spec.volumeName` names a volume that exists only as its directory); a
//! claim without a class (`""` included) is bound to a local volume, where a
//! real cluster without a default class would leave it Pending.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::objects::{
    self, DEPLOYMENT, POD, PV, PVC, Res, STATEFULSET, STORAGE_CLASS, controller_of, is_deleting, name_of,
    ns_of, owner_ref, str_at, uid_of,
};
use super::snapshots::SANDBOX_CSI_DRIVER;
use super::{Ctx, OperatorError, io_err, log_failure};

/// Annotation on a StatefulSet PVC holding the pod IP of its ordinal: the
/// sandbox's stand-in for the stable DNS name `<pod>.<service>.<ns>.svc`.
pub const POD_IP_ANNOTATION: &str = "sandbox.hcp-dr.io/pod-ip";
/// The finalizer real clusters put on PVCs in use.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The provisioner of claims without a StorageClass (and of the class name
/// `sandbox-local` a StatefulSet's claims get): a local volume, no snapshots.
pub const LOCAL_PROVISIONER: &str = "sandbox.hcp-dr.io/local";
/// The class name of the StatefulSet claims the sandbox binds at creation.
pub const LOCAL_CLASS: &str = "sandbox-local";

/// Whether a pod's containers are run by the etcd "kubelet" (a real etcd
/// process) rather than marked running here.
pub fn is_etcd_pod(pod: &Value) -> bool {
    matches!(controller_of(pod), Some(("StatefulSet", "etcd", _)))
        && str_at(
            pod,
            "/metadata/labels/hypershift.openshift.io~1control-plane-component",
        ) == Some("etcd")
}

/// The data directory of a PVC (`state_dir/pv/<ns>/<pvc>`).
pub fn pv_path(state_dir: &Path, ns: &str, pvc: &str) -> PathBuf {
    state_dir.join("pv").join(ns).join(pvc)
}

/// The file naming the claim uid a data directory was provisioned for:
/// beside it (`pv/<ns>/.<pvc>.uid`; claim names never start with a dot), so
/// a volume holds only what its users wrote (a data mover archives all of it).
fn owner_marker(state_dir: &Path, ns: &str, pvc: &str) -> PathBuf {
    state_dir.join("pv").join(ns).join(format!(".{pvc}.uid"))
}

/// The data directory of `pvc`, created (empty) on first use. A directory
/// left by an earlier PVC of the same name (another uid) is wiped first: a
/// new claim is a new, empty volume.
pub fn ensure_pv_dir(state_dir: &Path, pvc: &Value) -> Result<PathBuf, OperatorError> {
    provision_pv_dir(state_dir, pvc, None)
}

/// [`ensure_pv_dir`], a new directory starting as a copy of `from` (the
/// data of the snapshot or claim it is provisioned from). The owner marker
/// is written last: a copy cut short is redone.
pub(crate) fn provision_pv_dir(state_dir: &Path, pvc: &Value, from: Option<&Path>) -> Result<PathBuf, OperatorError> {
    let (ns, name, uid) = (ns_of(pvc), name_of(pvc), uid_of(pvc));
    let dir = pv_path(state_dir, ns, name);
    let marker = owner_marker(state_dir, ns, name);
    if std::fs::read_to_string(&marker).is_ok_and(|owner| owner.trim() == uid) && dir.is_dir() {
        return Ok(dir);
    }
    match from {
        Some(src) => super::snapshots::replace_with_copy(src, &dir)?,
        None => {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(io_err("removing", &dir))?;
            }
            std::fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        }
    }
    std::fs::write(&marker, uid).map_err(io_err("writing", &marker))?;
    Ok(dir)
}

/// The existing data directory of `pvc`, if it was provisioned for this uid.
pub fn existing_pv_dir(state_dir: &Path, pvc: &Value) -> Option<PathBuf> {
    let dir = pv_path(state_dir, ns_of(pvc), name_of(pvc));
    let owner = std::fs::read_to_string(owner_marker(state_dir, ns_of(pvc), name_of(pvc))).ok()?;
    (owner.trim() == uid_of(pvc) && dir.is_dir()).then_some(dir)
}

/// Everything listed once per pass.
struct World {
    pods: Vec<Value>,
    pvcs: Vec<Value>,
}

/// One pass of every workload controller.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let deployments = ctx.kube.list(&DEPLOYMENT, None, None).await?;
    let statefulsets = ctx.kube.list(&STATEFULSET, None, None).await?;
    let world = World {
        pods: ctx.kube.list(&POD, None, None).await?,
        pvcs: ctx.kube.list(&PVC, None, None).await?,
    };
    release_storage(&ctx, &world).await;
    bind_claims(&ctx, &world, &statefulsets).await;
    let here: Vec<Value> = world.pods.iter().filter(|p| ctx.runs_here(p)).cloned().collect();
    super::restore_pod::sync(&ctx, &here, &world.pvcs).await;
    if ctx.cluster_controllers() {
        // the cluster's controllers made the pods; this is their kubelet
        // (a pod admitted in this pass runs in the next, with its address)
        super::kubelet::admit(&ctx, &here, &world.pvcs).await;
    } else {
        for d in &deployments {
            if let Err(e) = sync_deployment(&ctx, d, &world).await {
                log_failure("deployment", &format!("{}/{}", ns_of(d), name_of(d)), &e);
            }
        }
        for s in &statefulsets {
            if let Err(e) = sync_statefulset(&ctx, s, &world).await {
                log_failure("statefulset", &format!("{}/{}", ns_of(s), name_of(s)), &e);
            }
        }
    }
    let started = |p: &&Value| !ctx.cluster_controllers() || str_at(p, "/status/podIP").is_some();
    for pod in here.iter().filter(started) {
        if let Err(e) = run_plain_pod(&ctx, pod).await {
            log_failure("kubelet", &format!("{}/{}", ns_of(pod), name_of(pod)), &e);
        }
    }
    Ok(())
}

/// Completes pod deletions (the kubelet's part), releases the protection
/// finalizer of deleted PVCs no pod uses, and removes the data directories of
/// PVCs that are gone. (Garbage collection by owner and namespace termination
/// are done by the API server emulator's own controllers.)
async fn release_storage(ctx: &Ctx, world: &World) {
    // Pods being deleted gracefully: the containers are stopped (the etcd
    // kubelet kills its processes when the pod is marked), so confirm.
    for pod in world.pods.iter().filter(|p| is_deleting(p) && ctx.runs_here(p)) {
        if is_etcd_pod(pod) && super::etcd_member::is_supervised(ctx, uid_of(pod)) {
            continue;
        }
        if let Err(e) = delete_now(ctx, &POD, ns_of(pod), name_of(pod)).await {
            log_failure("kubelet", name_of(pod), &e);
        }
    }
    // PVC protection (the cluster's own controller does it when it runs):
    // release deleted claims once no pod mounts them.
    for pvc in world.pvcs.iter().filter(|p| is_deleting(p) && !ctx.cluster_controllers()) {
        let in_use = world
            .pods
            .iter()
            .any(|p| ns_of(p) == ns_of(pvc) && pod_claims(p).iter().any(|c| c == name_of(pvc)));
        if !in_use && let Err(e) = remove_finalizer(ctx, &PVC, pvc, PVC_PROTECTION).await {
            log_failure("pvc-protection", name_of(pvc), &e);
        }
    }
    if ctx.cluster_controllers() {
        delete_released_volumes(ctx, &world.pvcs).await;
    }
    // Data of PVCs that no longer exist.
    let pv_root = ctx.cfg.state_dir.join("pv");
    let live: HashSet<(String, String)> = world
        .pvcs
        .iter()
        .map(|p| (ns_of(p).to_string(), name_of(p).to_string()))
        .collect();
    if let Ok(namespaces) = std::fs::read_dir(&pv_root) {
        for ns_entry in namespaces.flatten() {
            let ns = ns_entry.file_name().to_string_lossy().to_string();
            let Ok(dirs) = std::fs::read_dir(ns_entry.path()) else {
                continue;
            };
            for d in dirs.flatten() {
                let name = d.file_name().to_string_lossy().to_string();
                // `.<pvc>.uid` markers and `.<pvc>.copying` scratch copies
                if let Some(hidden) = name.strip_prefix('.') {
                    let pvc = hidden.trim_end_matches(".uid").trim_end_matches(".copying");
                    if !live.contains(&(ns.clone(), pvc.to_string())) {
                        let path = d.path();
                        let gone = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                        if let Err(e) = gone {
                            tracing::warn!(path = %path.display(), "removing: {e}");
                        }
                    }
                    continue;
                }
                if !live.contains(&(ns.clone(), name.clone())) {
                    tracing::info!(namespace = %ns, pvc = %name, "PVC gone: deleting its volume data");
                    if let Err(e) = std::fs::remove_dir_all(d.path()) {
                        tracing::warn!(path = %d.path().display(), "removing volume data: {e}");
                    }
                }
            }
        }
    }
}

/// The provisioners and the PV controller for claims made outside a
/// StatefulSet (a StatefulSet's own are bound as it creates them): each is
/// bound to a new volume of its class's provisioner (the local one for a
/// claim without a class), with the pod address the sandbox gives the pod of
/// a StatefulSet claim. A claim of a class that does not exist, or that waits
/// for its first consumer, or whose data source is not ready stays Pending
/// with an Event saying why, as with real provisioners; a claim of another
/// provisioner's class is left to it.
async fn bind_claims(ctx: &Ctx, world: &World, statefulsets: &[Value]) {
    let unbound: Vec<&Value> = world
        .pvcs
        .iter()
        .filter(|p| !is_deleting(p) && str_at(p, "/spec/volumeName").is_none_or(str::is_empty))
        .collect();
    if unbound.is_empty() {
        return;
    }
    let classes = match ctx.kube.list_if_served(&STORAGE_CLASS, None).await {
        Ok(c) => c,
        Err(e) => return log_failure("pv-controller", "storageclasses", &e),
    };
    for pvc in unbound {
        // The StatefulSet whose pods would mount it: `<template>-<set>-<ordinal>`.
        let spec = statefulsets.iter().find_map(|s| {
            s.pointer("/spec/volumeClaimTemplates").and_then(Value::as_array)?.iter().find_map(|c| {
                let rest = name_of(pvc).strip_prefix(&format!("{}-", name_of(c)))?;
                (ns_of(s) == ns_of(pvc) && ordinal(name_of(s), rest).is_some()).then(|| s.pointer("/spec/template/spec").cloned())?
            })
        });
        let bound = async {
            let Some(provisioner) = claim_provisioner(ctx, pvc, &classes, world).await? else {
                return Ok(());
            };
            let source = match claim_source(ctx, pvc, provisioner, world).await? {
                Ok(source) => source,
                Err(Some(message)) => {
                    ctx.kube.event(&PVC, pvc, true, "ProvisioningFailed", &message, provisioner).await?;
                    return Ok(());
                }
                Err(None) => return Ok(()),
            };
            let recorded = str_at(pvc, &format!("/metadata/annotations/{}", POD_IP_ANNOTATION.replace('/', "~1")));
            let ip = match (recorded, &spec) {
                (Some(ip), _) => ip.to_string(),
                (None, Some(spec)) => alloc_pod_ip(spec)?.to_string(),
                // no StatefulSet yet: an etcd volume seeded before it
                (None, None) => alloc_etcd_pod_ip()?.to_string(),
            };
            // the volume (and its data) first: a Bound claim has its directory
            let (state_dir, claim) = (ctx.cfg.state_dir.clone(), pvc.clone());
            let dir = tokio::task::spawn_blocking(move || provision_pv_dir(&state_dir, &claim, source.as_deref()))
                .await
                .map_err(|e| OperatorError::Invalid { what: format!("provisioning task: {e}") })??;
            if ctx.cluster_controllers() {
                // an external provisioner's part: the volume, pre-bound to
                // the claim; the cluster's binder binds the claim to it
                let patch = json!({"metadata": {"annotations": {POD_IP_ANNOTATION: ip.clone()}}});
                ctx.kube.merge(&PVC, Some(ns_of(pvc)), name_of(pvc), &patch).await?;
                ctx.kube.create_if_absent(&PV, None, persistent_volume(ctx, pvc, provisioner, &dir)).await?;
                tracing::info!(namespace = ns_of(pvc), pvc = name_of(pvc), pod_ip = %ip, provisioner, "provisioned a volume for claim");
                return Ok(());
            }
            let patch = json!({
                "metadata": {"annotations": {POD_IP_ANNOTATION: ip.clone(), "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.kubernetes.io/storage-provisioner": provisioner},
                    "resourceVersion": pvc.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)},
                "spec": {"volumeName": format!("pvc-{}", uid_of(pvc))},
            });
            let updated = ctx.kube.merge(&PVC, Some(ns_of(pvc)), name_of(pvc), &patch).await?;
            add_finalizer(ctx, &PVC, &updated, PVC_PROTECTION).await?;
            let capacity = pvc.pointer("/spec/resources/requests/storage").cloned().unwrap_or(json!("1Gi"));
            let access = pvc.pointer("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"]));
            ctx.kube
                .merge_status(&PVC, Some(ns_of(pvc)), name_of(pvc),
                    &json!({"status": {"phase": "Bound", "accessModes": access, "capacity": {"storage": capacity}}}))
                .await?;
            tracing::info!(namespace = ns_of(pvc), pvc = name_of(pvc), pod_ip = %ip, provisioner, "bound claim");
            Ok::<(), OperatorError>(())
        };
        if let Err(e) = bound.await {
            log_failure("pv-controller", &format!("{}/{}", ns_of(pvc), name_of(pvc)), &e);
        }
    }
}

/// The PersistentVolume a provisioner makes for `pvc`: named as the
/// external provisioners name theirs, pre-bound by `claimRef` (uid
/// included), its data the sandbox directory `dir` (a `hostPath`: no
/// attach-detach, and no real kubelet ever mounts it).
fn persistent_volume(ctx: &Ctx, pvc: &Value, provisioner: &str, dir: &Path) -> Value {
    let capacity = pvc.pointer("/spec/resources/requests/storage").cloned().unwrap_or(json!("1Gi"));
    let access = pvc.pointer("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"]));
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": format!("pvc-{}", uid_of(pvc)),
            "labels": {"sandbox.hcp-dr.io/cluster": ctx.cfg.cluster_name},
            "annotations": {PROVISIONED_BY: provisioner}},
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": access,
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": str_at(pvc, "/spec/storageClassName").unwrap_or_default(),
            "volumeMode": str_at(pvc, "/spec/volumeMode").unwrap_or("Filesystem"),
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns_of(pvc),
                "name": name_of(pvc), "uid": uid_of(pvc)},
            "hostPath": {"path": dir.to_string_lossy(), "type": "Directory"},
        },
    })
}

/// The annotation naming the provisioner of a PersistentVolume.
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// The volumes this sandbox provisioned whose claim is gone (Released, or
/// pre-bound to a claim uid that no longer exists): deleted, as an
/// external provisioner does under the `Delete` reclaim policy.
async fn delete_released_volumes(ctx: &Ctx, pvcs: &[Value]) {
    let volumes = match ctx.kube.list(&PV, None, Some(&format!("sandbox.hcp-dr.io/cluster={}", ctx.cfg.cluster_name))).await {
        Ok(v) => v,
        Err(e) => return log_failure("provisioner", "persistentvolumes", &e),
    };
    for pv in volumes.iter().filter(|v| !is_deleting(v)) {
        let ours = matches!(
            str_at(pv, &format!("/metadata/annotations/{}", PROVISIONED_BY.replace('/', "~1"))),
            Some(p) if p == LOCAL_PROVISIONER || p == SANDBOX_CSI_DRIVER
        );
        let claim_uid = str_at(pv, "/spec/claimRef/uid").unwrap_or_default();
        let released = str_at(pv, "/status/phase") == Some("Released") || !pvcs.iter().any(|c| uid_of(c) == claim_uid);
        if ours && released {
            tracing::info!(volume = name_of(pv), "claim gone: deleting its volume");
            if let Err(e) = ctx.kube.delete(&PV, None, name_of(pv)).await {
                log_failure("provisioner", name_of(pv), &e);
            }
        }
    }
}

/// The sandbox provisioner that provisions `pvc`, or None (with an Event
/// when that is a failure): its class's provisioner when it is one of the
/// sandbox's, the local one for a claim without a class.
async fn claim_provisioner<'a>(
    ctx: &Ctx,
    pvc: &Value,
    classes: &'a [Value],
    world: &World,
) -> Result<Option<&'a str>, OperatorError> {
    let class_name = match str_at(pvc, "/spec/storageClassName") {
        // on a real cluster a claim without a class is the binder's (static
        // volumes), not the sandbox's
        None | Some("") if ctx.cluster_controllers() => return Ok(None),
        None | Some("") | Some(LOCAL_CLASS) => return Ok(Some(LOCAL_PROVISIONER)),
        Some(name) => name,
    };
    let Some(class) = classes.iter().find(|c| name_of(c) == class_name) else {
        let message = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
        ctx.kube.event(&PVC, pvc, true, "ProvisioningFailed", &message, "persistentvolume-controller").await?;
        return Ok(None);
    };
    let provisioner = str_at(class, "/provisioner").unwrap_or_default();
    if provisioner != SANDBOX_CSI_DRIVER && provisioner != LOCAL_PROVISIONER {
        return Ok(None);
    }
    // a consumer is a pod the scheduler can place (or placed): one whose
    // node selection fits no node never triggers the binding
    let node = super::scheduling::virtual_node(ctx);
    let consumed = world.pods.iter().any(|p| {
        ns_of(p) == ns_of(pvc)
            && !is_deleting(p)
            && pod_claims(p).iter().any(|c| c == name_of(pvc))
            && (ctx.cluster_controllers()
                || str_at(p, "/spec/nodeName").is_some_and(|n| !n.is_empty())
                || super::scheduling::fits(p.get("spec").unwrap_or(&Value::Null), &node).is_ok())
    });
    if str_at(class, "/volumeBindingMode") == Some("WaitForFirstConsumer") && !consumed {
        ctx.kube
            .event(&PVC, pvc, false, "WaitForFirstConsumer", "waiting for first consumer to be created before binding",
                "persistentvolume-controller")
            .await?;
        return Ok(None);
    }
    Ok(Some(provisioner))
}

/// What a new volume for `pvc` starts with: `Ok(None)` empty, `Ok(Some(dir))`
/// a copy of `dir` (a snapshot's data or the cloned claim's), `Err(Some(why))`
/// not yet (the provisioner's `ProvisioningFailed` message), `Err(None)` a
/// data source the sandbox's provisioners leave to a volume populator.
async fn claim_source(
    ctx: &Ctx,
    pvc: &Value,
    provisioner: &str,
    world: &World,
) -> Result<Result<Option<PathBuf>, Option<String>>, OperatorError> {
    let requested = str_at(pvc, "/spec/resources/requests/storage").and_then(super::snapshots::parse_quantity);
    if let Some(snapshot) = super::snapshots::snapshot_source(pvc) {
        let found = super::snapshots::restore_source(ctx, ns_of(pvc), snapshot, provisioner, requested).await?;
        return Ok(found.map(Some).map_err(Some));
    }
    let source = pvc.pointer("/spec/dataSourceRef").or_else(|| pvc.pointer("/spec/dataSource")).filter(|s| s.is_object());
    let Some(source) = source else {
        return Ok(Ok(None));
    };
    if str_at(source, "/apiGroup").is_some_and(|g| !g.is_empty()) || str_at(source, "/kind") != Some("PersistentVolumeClaim") {
        return Ok(Err(None));
    }
    // a clone: the source claim, bound, of the same class
    let name = str_at(source, "/name").unwrap_or_default();
    let Some(from) = world.pvcs.iter().find(|p| ns_of(p) == ns_of(pvc) && name_of(p) == name) else {
        return Ok(Err(Some(format!("error getting handle for DataSource Type PersistentVolumeClaim by Name {name}: error getting PVC {name} from api server: persistentvolumeclaims \"{name}\" not found"))));
    };
    if str_at(from, "/spec/storageClassName") != str_at(pvc, "/spec/storageClassName") {
        return Ok(Err(Some(format!("the source PVC and destination PVCs must be in the same storage class for cloning.  Source is in {}, but new PVC is in {}",
            str_at(from, "/spec/storageClassName").unwrap_or_default(), str_at(pvc, "/spec/storageClassName").unwrap_or_default()))));
    }
    let Some(dir) = existing_pv_dir(&ctx.cfg.state_dir, from).filter(|_| str_at(from, "/status/phase") == Some("Bound")) else {
        return Ok(Err(Some(format!("error getting handle for DataSource Type PersistentVolumeClaim by Name {name}: the PVC {name} is not yet bound"))));
    };
    let size = super::snapshots::claim_bytes(from);
    if requested.is_some_and(|r| r < size) {
        return Ok(Err(Some(format!("error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {} but source is {size}",
            requested.unwrap_or_default()))));
    }
    Ok(Ok(Some(dir)))
}

/// DELETE with `gracePeriodSeconds: 0` (what the kubelet does once containers stopped).
pub(crate) async fn delete_now(
    ctx: &Ctx,
    res: &Res,
    ns: &str,
    name: &str,
) -> Result<bool, OperatorError> {
    ctx.kube.delete_with_grace(res, Some(ns), name, 0).await
}

/// Remove `finalizer` from `obj` (merge patch of the whole list, guarded by resourceVersion).
pub(crate) async fn remove_finalizer(
    ctx: &Ctx,
    res: &Res,
    obj: &Value,
    finalizer: &str,
) -> Result<(), OperatorError> {
    remove_finalizers(ctx, res, obj, &[finalizer]).await
}

/// Remove each of `finalizers` from `obj` in one patch (as [`remove_finalizer`]).
pub(crate) async fn remove_finalizers(
    ctx: &Ctx,
    res: &Res,
    obj: &Value,
    finalizers: &[&str],
) -> Result<(), OperatorError> {
    let Some(list) = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
    else {
        return Ok(());
    };
    let gone = |f: &Value| f.as_str().is_some_and(|f| finalizers.contains(&f));
    if !list.iter().any(gone) {
        return Ok(());
    }
    let kept: Vec<&Value> = list.iter().filter(|f| !gone(f)).collect();
    let patch = json!({"metadata": {"finalizers": kept,
        "resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)}});
    let ns = ns_of(obj);
    ctx.kube
        .merge(res, (!ns.is_empty()).then_some(ns), name_of(obj), &patch)
        .await
        .map(|_| ())
}

/// Add `finalizer` to `obj` if missing.
pub(crate) async fn add_finalizer(
    ctx: &Ctx,
    res: &Res,
    obj: &Value,
    finalizer: &str,
) -> Result<(), OperatorError> {
    let mut list: Vec<Value> = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if list.iter().any(|f| f.as_str() == Some(finalizer)) {
        return Ok(());
    }
    list.push(json!(finalizer));
    let patch = json!({"metadata": {"finalizers": list,
        "resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)}});
    let ns = ns_of(obj);
    ctx.kube
        .merge(res, (!ns.is_empty()).then_some(ns), name_of(obj), &patch)
        .await
        .map(|_| ())
}

/// PVC names a pod mounts.
pub(crate) fn pod_claims(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(|vols| {
            vols.iter()
                .filter_map(|v| str_at(v, "/persistentVolumeClaim/claimName").map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Container ports of a pod spec (to pick a pod IP where they are free).
fn container_ports(spec: &Value) -> Vec<u16> {
    let mut ports = Vec::new();
    for c in spec
        .get("containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for p in c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(n) = p
                .get("containerPort")
                .and_then(Value::as_u64)
                .and_then(|n| u16::try_from(n).ok())
            {
                ports.push(n);
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

pub(crate) fn alloc_pod_ip(spec: &Value) -> Result<IpAddr, OperatorError> {
    Ok(crate::procs::alloc_loopback_ip(&container_ports(spec))?)
}

/// The ports of an etcd pod (client, peer, metrics, healthz): where a claim
/// bound before its StatefulSet exists (hcp-dr seeds the etcd volumes of a
/// restore before the HostedCluster) gets its pod IP.
pub(crate) const ETCD_POD_PORTS: [u16; 4] = [2379, 2380, 2381, 9980];

/// A pod IP where an etcd member can listen ([`ETCD_POD_PORTS`] free).
pub(crate) fn alloc_etcd_pod_ip() -> Result<IpAddr, OperatorError> {
    Ok(crate::procs::alloc_loopback_ip(&ETCD_POD_PORTS)?)
}

/// The pod IP of the StatefulSet pod `member` in `ns`: the address recorded
/// on its claim `data-<member>` (the sandbox's stand-in for the name
/// `<member>.etcd-discovery.<ns>.svc`). A claim that has none yet (not bound,
/// or made outside a StatefulSet) gets one now, which the provisioner and
/// the StatefulSet keep for the pod. `None`: there is no such claim.
pub(crate) async fn member_ip(ctx: &Ctx, ns: &str, member: &str) -> Result<Option<IpAddr>, OperatorError> {
    let claim = format!("data-{member}");
    let pointer = format!("/metadata/annotations/{}", POD_IP_ANNOTATION.replace('/', "~1"));
    for _ in 0..5 {
        let Some(pvc) = ctx.kube.get(&PVC, Some(ns), &claim).await? else {
            return Ok(None);
        };
        if let Some(ip) = str_at(&pvc, &pointer).and_then(|ip| ip.parse().ok()) {
            return Ok(Some(ip));
        }
        if is_deleting(&pvc) {
            return Ok(None);
        }
        let ip = alloc_etcd_pod_ip()?;
        let patch = json!({"metadata": {"annotations": {POD_IP_ANNOTATION: ip.to_string()},
            "resourceVersion": pvc.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)}});
        match ctx.kube.merge(&PVC, Some(ns), &claim, &patch).await {
            Ok(_) => {
                tracing::info!(namespace = ns, pvc = %claim, pod_ip = %ip, "recorded the pod IP of a claim not bound yet");
                return Ok(Some(ip));
            }
            // changed meanwhile (bound, or annotated by another): read again
            Err(e) if objects::status_code(&e) == Some(409) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(OperatorError::Waiting(format!("the pod IP of PersistentVolumeClaim {ns}/{claim} (it keeps changing)")))
}

fn is_ready(pod: &Value) -> bool {
    objects::condition_true(pod.pointer("/status/conditions"), "Ready") && !is_deleting(pod)
}

fn replicas_of(obj: &Value) -> u64 {
    obj.pointer("/spec/replicas")
        .and_then(Value::as_u64)
        .unwrap_or(1)
}

fn random_suffix(len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(len)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// The status a running pod reports (all containers started and ready).
pub(crate) fn running_status(pod: &Value, ip: &str, ready: bool) -> Value {
    let now = objects::now();
    let start = pod
        .pointer("/status/startTime")
        .cloned()
        .unwrap_or_else(|| json!(now));
    let prev = pod.pointer("/status/conditions");
    let containers: Vec<Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c.get("name").cloned().unwrap_or(json!("")), "image": c.get("image").cloned().unwrap_or(json!("")),
                   "imageID": "", "ready": ready, "started": true, "restartCount": 0,
                   "state": {"running": {"startedAt": start.clone()}}})
        })
        .collect();
    json!({
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "startTime": start,
        "conditions": [
            objects::condition(prev, "PodScheduled", true, "", ""),
            objects::condition(prev, "Initialized", true, "", ""),
            objects::condition(prev, "ContainersReady", ready, "", ""),
            objects::condition(prev, "Ready", ready, "", ""),
        ],
        "containerStatuses": containers,
    })
}

/// The "kubelet" for ordinary pods: a pod without a phase starts running at
/// once on a fresh loopback IP.
async fn run_plain_pod(ctx: &Ctx, pod: &Value) -> Result<(), OperatorError> {
    if is_etcd_pod(pod)
        || super::restore_pod::is_restore_pod(pod)
        || super::volume_mover::is_mover_pod(pod)
        || is_deleting(pod)
        || str_at(pod, "/status/phase").is_some_and(|p| p != "Pending")
    {
        return Ok(());
    }
    let ip = match str_at(pod, "/status/podIP") {
        Some(ip) => ip.to_string(),
        None => alloc_pod_ip(pod.get("spec").unwrap_or(&Value::Null))?.to_string(),
    };
    let status = running_status(pod, &ip, true);
    ctx.kube
        .merge_status(
            &POD,
            Some(ns_of(pod)),
            name_of(pod),
            &json!({"status": status}),
        )
        .await?;
    Ok(())
}

/// How many Nodes the sandbox registers on a cluster with its own
/// controllers: a HighlyAvailable control plane spreads its etcd members
/// (and hcp-dr the pods that seed their volumes) one per node and zone.
pub const SANDBOX_NODES: usize = 3;

/// The sandbox's Nodes on a cluster with its own controllers, with their
/// zones (`<cluster>-control-plane-N` in `<cluster>-zone-a/b/c`); in the
/// emulated mode the one virtual node.
pub(crate) fn sandbox_nodes(ctx: &Ctx) -> Vec<(String, String)> {
    let count = if ctx.cluster_controllers() { SANDBOX_NODES } else { 1 };
    (0..count)
        .map(|i| (format!("{}-control-plane-{i}", ctx.cfg.cluster_name), format!("{}-zone-{}", ctx.cfg.cluster_name, (b'a' + i as u8) as char)))
        .collect()
}

pub(crate) fn virtual_node(ctx: &Ctx) -> String {
    format!("{}-control-plane-0", ctx.cfg.cluster_name)
}

fn template_labels(obj: &Value) -> serde_json::Map<String, Value> {
    obj.pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

async fn sync_deployment(ctx: &Ctx, d: &Value, world: &World) -> Result<(), OperatorError> {
    if is_deleting(d) {
        return Ok(());
    }
    let ns = ns_of(d);
    let name = name_of(d);
    let want = replicas_of(d) as usize;
    let mut owned: Vec<&Value> = world
        .pods
        .iter()
        .filter(|p| {
            ns_of(p) == ns
                && controller_of(p).is_some_and(|(_, _, uid)| uid == uid_of(d))
                && !is_deleting(p)
        })
        .collect();
    owned.sort_by(|a, b| {
        str_at(a, "/metadata/creationTimestamp")
            .cmp(&str_at(b, "/metadata/creationTimestamp"))
            .then(name_of(a).cmp(name_of(b)))
    });
    let template_hash = objects::short_hash(
        &[&d.pointer("/spec/template")
            .map(Value::to_string)
            .unwrap_or_default()],
        10,
    );
    if owned.len() < want {
        for _ in owned.len()..want {
            let mut labels = template_labels(d);
            labels.insert("pod-template-hash".into(), json!(template_hash));
            let mut spec = d
                .pointer("/spec/template/spec")
                .cloned()
                .unwrap_or_else(|| json!({}));
            spec["nodeName"] = json!(virtual_node(ctx));
            let pod = json!({
                "metadata": {
                    "name": format!("{name}-{template_hash}-{}", random_suffix(5)),
                    "namespace": ns,
                    "labels": labels,
                    "annotations": d.pointer("/spec/template/metadata/annotations").cloned().unwrap_or(json!({})),
                    "ownerReferences": [owner_ref(&DEPLOYMENT, d)],
                },
                "spec": spec,
            });
            ctx.kube.create(&POD, Some(ns), pod).await?;
        }
    } else if owned.len() > want {
        // Newest first, like the ReplicaSet controller's ranking.
        for pod in owned.iter().rev().take(owned.len() - want) {
            ctx.kube.delete(&POD, Some(ns), name_of(pod)).await?;
        }
        owned.truncate(want);
    }
    let ready = owned.iter().filter(|p| is_ready(p)).count();
    let prev = d.pointer("/status/conditions");
    let available = ready >= want;
    let status = json!({
        "observedGeneration": d.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
        "replicas": owned.len(),
        "updatedReplicas": owned.len(),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": owned.len().saturating_sub(ready),
        "conditions": [
            objects::condition(prev, "Available", available,
                if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                if available { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }),
            objects::condition(prev, "Progressing", true, "NewReplicaSetAvailable",
                &format!("ReplicaSet \"{name}-{template_hash}\" has successfully progressed.")),
        ],
    });
    patch_status_if_changed(ctx, &DEPLOYMENT, d, status).await
}

/// Patch `status` unless every field already has that value (ignoring
/// condition timestamps), so idle controllers do not churn resourceVersions.
pub(crate) async fn patch_status_if_changed(
    ctx: &Ctx,
    res: &Res,
    obj: &Value,
    status: Value,
) -> Result<(), OperatorError> {
    let current = obj.get("status").cloned().unwrap_or(json!({}));
    if status_subset(&status, &current) {
        return Ok(());
    }
    let ns = ns_of(obj);
    ctx.kube
        .merge_status(
            res,
            (!ns.is_empty()).then_some(ns),
            name_of(obj),
            &json!({"status": status}),
        )
        .await?;
    Ok(())
}

/// Whether every field of `want` equals the one in `have` (conditions compared
/// without `lastTransitionTime`).
pub(crate) fn status_subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w.iter().all(|(k, v)| {
            if k == "lastTransitionTime" || k == "lastUpdateTime" || k == "lastHeartbeatTime" {
                return true;
            }
            match h.get(k) {
                Some(hv) => status_subset(v, hv),
                None => v.is_null(),
            }
        }),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| status_subset(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => want == have,
    }
}

fn ordinal(sts: &str, pod_or_suffix: &str) -> Option<usize> {
    pod_or_suffix
        .strip_prefix(sts)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

async fn sync_statefulset(ctx: &Ctx, s: &Value, world: &World) -> Result<(), OperatorError> {
    let ns = ns_of(s);
    let name = name_of(s);
    if is_deleting(s) {
        return Ok(());
    }
    let want = replicas_of(s) as usize;
    let claims: Vec<Value> = s
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let when_scaled =
        str_at(s, "/spec/persistentVolumeClaimRetentionPolicy/whenScaled").unwrap_or("Retain");
    let when_deleted =
        str_at(s, "/spec/persistentVolumeClaimRetentionPolicy/whenDeleted").unwrap_or("Retain");
    let spec_template = s
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let pods: HashMap<&str, &Value> = world
        .pods
        .iter()
        .filter(|p| ns_of(p) == ns && controller_of(p).is_some_and(|(_, _, uid)| uid == uid_of(s)))
        .map(|p| (name_of(p), p))
        .collect();
    let pvcs: HashMap<&str, &Value> = world
        .pvcs
        .iter()
        .filter(|p| ns_of(p) == ns)
        .map(|p| (name_of(p), p))
        .collect();
    let revision = format!(
        "{name}-{}",
        objects::short_hash(
            &[&s.pointer("/spec/template")
                .map(Value::to_string)
                .unwrap_or_default()],
            10
        )
    );

    for i in 0..want {
        let pod_name = format!("{name}-{i}");
        // Claims first: the pod mounts them and takes its IP from the first.
        let mut pod_ip: Option<String> = None;
        let mut claims_ready = true;
        for (k, c) in claims.iter().enumerate() {
            let claim = format!("{}-{pod_name}", name_of(c));
            match pvcs.get(claim.as_str()) {
                Some(pvc) if is_deleting(pvc) => claims_ready = false,
                Some(pvc) => {
                    if k == 0 {
                        pod_ip = str_at(
                            pvc,
                            &format!(
                                "/metadata/annotations/{}",
                                POD_IP_ANNOTATION.replace('/', "~1")
                            ),
                        )
                        .map(str::to_string);
                        if pod_ip.is_none() && !pods.contains_key(pod_name.as_str()) {
                            // a claim made before the set (not bound yet):
                            // its address first, which its binding keeps
                            let ip = alloc_pod_ip(&spec_template)?.to_string();
                            let patch = json!({"metadata": {"annotations": {POD_IP_ANNOTATION: ip.clone()},
                                "resourceVersion": pvc.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)}});
                            ctx.kube.merge(&PVC, Some(ns), &claim, &patch).await?;
                            pod_ip = Some(ip);
                        }
                    }
                    if existing_pv_dir(&ctx.cfg.state_dir, pvc).is_none() && str_at(pvc, "/spec/volumeName").is_some_and(|v| !v.is_empty()) {
                        ensure_pv_dir(&ctx.cfg.state_dir, pvc)?;
                    }
                }
                None => {
                    let ip = alloc_pod_ip(&spec_template)?.to_string();
                    if k == 0 {
                        pod_ip = Some(ip.clone());
                    }
                    create_claim(ctx, s, c, &claim, &ip, when_deleted).await?;
                }
            }
        }
        if !claims_ready {
            continue;
        }
        match pods.get(pod_name.as_str()) {
            Some(_) => {}
            None => {
                let mut labels = template_labels(s);
                labels.insert("statefulset.kubernetes.io/pod-name".into(), json!(pod_name));
                labels.insert("apps.kubernetes.io/pod-index".into(), json!(i.to_string()));
                labels.insert("controller-revision-hash".into(), json!(revision));
                let mut spec = spec_template.clone();
                spec["hostname"] = json!(pod_name);
                if let Some(svc) = str_at(s, "/spec/serviceName") {
                    spec["subdomain"] = json!(svc);
                }
                spec["nodeName"] = json!(virtual_node(ctx));
                let mut volumes = spec
                    .get("volumes")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for c in &claims {
                    volumes.push(json!({"name": name_of(c),
                        "persistentVolumeClaim": {"claimName": format!("{}-{pod_name}", name_of(c))}}));
                }
                spec["volumes"] = json!(volumes);
                let pod = json!({
                    "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                        "annotations": s.pointer("/spec/template/metadata/annotations").cloned().unwrap_or(json!({})),
                        "ownerReferences": [owner_ref(&STATEFULSET, s)]},
                    "spec": spec,
                });
                let created = ctx.kube.create(&POD, Some(ns), pod).await?;
                let ip = match pod_ip {
                    Some(ip) => ip,
                    None => alloc_pod_ip(&spec_template)?.to_string(),
                };
                // The pod exists and has its address; its containers start
                // next (here for ordinary pods, in the etcd kubelet for etcd).
                let status = json!({"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                    "hostIPs": [{"ip": "127.0.0.1"}],
                    "conditions": [objects::condition(None, "PodScheduled", true, "", "")]});
                ctx.kube
                    .merge_status(
                        &POD,
                        Some(ns),
                        name_of(&created),
                        &json!({"status": status}),
                    )
                    .await?;
            }
        }
    }
    // Scale down: pods beyond the replicas go, then (whenScaled: Delete) their claims.
    for (pod_name, pod) in &pods {
        if ordinal(name, pod_name).is_some_and(|o| o >= want) && !is_deleting(pod) {
            ctx.kube.delete(&POD, Some(ns), pod_name).await?;
        }
    }
    if when_scaled == "Delete" {
        for c in &claims {
            let prefix = format!("{}-", name_of(c));
            for (pvc_name, pvc) in &pvcs {
                let Some(rest) = pvc_name.strip_prefix(prefix.as_str()) else {
                    continue;
                };
                let Some(o) = ordinal(name, rest) else {
                    continue;
                };
                if o >= want && !is_deleting(pvc) && !pods.contains_key(rest) {
                    tracing::info!(namespace = ns, pvc = %pvc_name, "whenScaled: Delete: deleting claim of a removed replica");
                    ctx.kube.delete(&PVC, Some(ns), pvc_name).await?;
                }
            }
        }
    }
    let live: Vec<&&Value> = pods.values().filter(|p| !is_deleting(p)).collect();
    let ready = live.iter().filter(|p| is_ready(p)).count();
    let status = json!({
        "observedGeneration": s.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
        "replicas": live.len(),
        "readyReplicas": ready,
        "currentReplicas": live.len(),
        "updatedReplicas": live.len(),
        "availableReplicas": ready,
        "currentRevision": revision,
        "updateRevision": revision,
        "collisionCount": 0,
    });
    patch_status_if_changed(ctx, &STATEFULSET, s, status).await
}

async fn create_claim(
    ctx: &Ctx,
    sts: &Value,
    template: &Value,
    claim: &str,
    pod_ip: &str,
    when_deleted: &str,
) -> Result<(), OperatorError> {
    let ns = ns_of(sts);
    let labels: BTreeMap<String, Value> = sts
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    spec["storageClassName"] = json!("sandbox-local");
    spec["volumeMode"] = json!(str_at(&spec, "/volumeMode").unwrap_or("Filesystem"));
    // Bound at creation to a volume named like the provisioner's.
    spec["volumeName"] = json!(format!("pvc-{}", uuid::Uuid::new_v4()));
    let owners = if when_deleted == "Delete" {
        json!([owner_ref(&STATEFULSET, sts)])
    } else {
        json!([])
    };
    let pvc = json!({
        "metadata": {"name": claim, "namespace": ns, "labels": labels,
            "annotations": {POD_IP_ANNOTATION: pod_ip, "pv.kubernetes.io/bind-completed": "yes",
                "volume.kubernetes.io/storage-provisioner": "sandbox.hcp-dr.io/local"},
            "finalizers": [PVC_PROTECTION],
            "ownerReferences": owners},
        "spec": spec,
    });
    let created = ctx.kube.create(&PVC, Some(ns), pvc).await?;
    let capacity = template
        .pointer("/spec/resources/requests/storage")
        .cloned()
        .unwrap_or(json!("1Gi"));
    let access = template
        .pointer("/spec/accessModes")
        .cloned()
        .unwrap_or(json!(["ReadWriteOnce"]));
    ctx.kube
        .merge_status(
            &PVC,
            Some(ns),
            claim,
            &json!({"status": {"phase": "Bound", "accessModes": access,
            "capacity": {"storage": capacity}}}),
        )
        .await?;
    ensure_pv_dir(&ctx.cfg.state_dir, &created)?;
    tracing::info!(namespace = ns, pvc = claim, pod_ip, "provisioned claim");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_parse_only_for_the_set() {
        assert_eq!(ordinal("etcd", "etcd-2"), Some(2));
        assert_eq!(ordinal("etcd", "etcd-metrics-0"), None);
        assert_eq!(ordinal("etcd", "other-1"), None);
    }

    #[test]
    fn status_subset_ignores_transition_times() {
        let want = json!({"replicas": 1, "conditions": [{"type": "A", "status": "True", "lastTransitionTime": "x"}]});
        let have = json!({"replicas": 1, "extra": 2, "conditions": [{"type": "A", "status": "True", "lastTransitionTime": "y"}]});
        assert!(status_subset(&want, &have));
        assert!(!status_subset(&json!({"replicas": 2}), &have));
    }

    #[test]
    fn pv_dir_is_wiped_for_a_new_claim_uid() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pvc = json!({"metadata": {"name": "data-etcd-0", "namespace": "ns", "uid": "u1"}});
        let dir = ensure_pv_dir(tmp.path(), &pvc).expect("dir");
        std::fs::write(dir.join("db"), "x").expect("write");
        assert!(
            ensure_pv_dir(tmp.path(), &pvc)
                .expect("dir")
                .join("db")
                .exists()
        );
        assert!(existing_pv_dir(tmp.path(), &pvc).is_some());
        let newer = json!({"metadata": {"name": "data-etcd-0", "namespace": "ns", "uid": "u2"}});
        assert!(existing_pv_dir(tmp.path(), &newer).is_none());
        let dir = ensure_pv_dir(tmp.path(), &newer).expect("dir");
        assert!(!dir.join("db").exists());
    }

    #[test]
    fn etcd_pods_are_recognised_by_owner_and_label() {
        let pod = json!({"metadata": {"labels": {"hypershift.openshift.io/control-plane-component": "etcd"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "etcd", "uid": "1", "controller": true}]}});
        assert!(is_etcd_pod(&pod));
        let other = json!({"metadata": {"labels": {"app": "etcd"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "etcd", "uid": "1", "controller": true}]}});
        assert!(!is_etcd_pod(&other));
        assert_eq!(
            container_ports(
                &json!({"containers": [{"ports": [{"containerPort": 2380}, {"containerPort": 2379}]}]})
            ),
            vec![2379, 2380]
        );
    }
}
