//! `volume-restore`: a KubeVirt cluster's guest volumes back from the store,
//! before `apply` creates the HostedCluster and its NodePools. For each
//! volume of the manifest: the PVC again under its name (the guest's
//! PersistentVolume names it through kubevirt-csi), class, size, access
//! modes and labels; a data-mover Job on it that hcp-dr streams the
//! volume's tar into (decrypted on the way for an encrypted backup), whose
//! SHA-256 must be the manifest's; then its DataVolume, annotated
//! `cdi.kubevirt.io/storage.prePopulated` so CDI adopts the filled claim
//! instead of importing into it, and made the claim's owner as CDI would.
//! A root disk (`--include-root-disks`) then gets its VirtualMachine back,
//! made the DataVolume's owner: KubeVirt does not adopt a DataVolume it
//! did not create (kubevirt VEP 379), and the KubeVirt CAPI provider finds
//! the machine's VM by name and keeps it.
//!
//! The stage creates the control-plane namespace when it is absent (apply
//! then finds it there). Its undo deletes what it created, by UID.

use std::collections::BTreeSet;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::RestoreContext;
use super::verify::{manifest, verified_manifest};
use crate::archive::{GuestVolumeRecord, Manifest};
use crate::hosted::kubevirt::{DATA_VOLUME, PRE_POPULATED, VIRTUAL_MACHINE};
use crate::kube::{KubeError, api, is_not_found, list_if_served, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::StageError;
use crate::stages::volumes::{BACKUP_ID_LABEL, default_mover_image, remove_mover, start_mover};

/// The StorageClasses the backup's guest volumes need that the destination
/// lacks, as preflight problems.
pub async fn missing_classes(client: &kube::Client, guest: Option<&crate::archive::GuestVolumes>) -> Result<Vec<String>, StageFailure> {
    let Some(guest) = guest else { return Ok(Vec::new()) };
    let classes: Api<StorageClass> = Api::all(client.clone());
    let needed: BTreeSet<&str> = guest.volumes.iter().map(|v| v.volume.storage_class.as_str()).collect();
    let mut problems = Vec::new();
    for class in needed {
        if classes.get_opt(class).await.map_err(request(format!("reading StorageClass {class}")))?.is_none() {
            let volumes: Vec<&str> = guest.volumes.iter().filter(|v| v.volume.storage_class == class).map(|v| v.volume.name.as_str()).collect();
            problems.push(format!(
                "StorageClass {class} does not exist here, and the guest volumes {} are re-created in it: create it (a class of the same CSI driver or one with the same name), or restore onto a management cluster that has it",
                volumes.join(", ")
            ));
        }
    }
    // root disks come back with their VirtualMachines: KubeVirt must be here
    let machines: BTreeSet<&str> = guest.volumes.iter().filter_map(|v| v.volume.virtual_machine.as_ref()).filter_map(|vm| vm["metadata"]["name"].as_str()).collect();
    if !machines.is_empty() {
        let vms = api(client, &VIRTUAL_MACHINE, "default");
        let params = kube::api::ListParams::default().limit(1);
        if list_if_served(&vms, &params, "VirtualMachines").await?.is_none() {
            problems.push(format!(
                "the backup holds the root disks of the VirtualMachines {}, but this management cluster serves no kubevirt.io/v1 VirtualMachines: install KubeVirt (OpenShift Virtualization) first, or restore onto a management cluster that has it",
                machines.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    Ok(problems)
}

/// What `volume-restore` created (journaled as it goes).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VolumesRestored {
    pub namespace: String,
    /// The UID of the namespace when this stage created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_namespace: Option<String>,
    /// PVC name → its UID.
    pub claims: Vec<(String, String)>,
    /// DataVolumes created.
    pub data_volumes: Vec<String>,
    /// VirtualMachines created (root disks' owners): name → UID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub virtual_machines: Vec<(String, String)>,
    /// Per volume: its name and the entries written.
    pub restored: Vec<(String, u64)>,
}

pub struct VolumeRestore;

impl StageId for VolumeRestore {
    const NAME: &'static str = "volume-restore";
    type Output = VolumesRestored;
}

/// The volumes to re-create: the manifest's, or those a drill renamed.
fn volumes(ctx: &RestoreContext, manifest: &Manifest) -> Vec<GuestVolumeRecord> {
    match &ctx.guest_volumes {
        Some(renamed) => renamed.clone(),
        None => manifest.guest_volumes.as_ref().map(|g| g.volumes.clone()).unwrap_or_default(),
    }
}

fn mover_name(ctx: &RestoreContext, index: usize) -> String {
    format!("hcp-dr-restore-{}-v{index}", ctx.inputs.backup_id.to_ascii_lowercase())
}

fn labels(ctx: &RestoreContext) -> Value {
    json!({"app.kubernetes.io/managed-by": "hcp-dr", BACKUP_ID_LABEL: ctx.inputs.backup_id.to_ascii_lowercase()})
}

impl VolumeRestore {
    /// A root disk's VirtualMachine, created once (after its disk, so
    /// KubeVirt finds the disk rather than importing a new one); its name
    /// and UID.
    async fn virtual_machine(&self, ctx: &RestoreContext, vm: &Value, ns: &str, done: &mut VolumesRestored, step: &mut Step<'_>) -> Result<(String, String), StageFailure> {
        let name = vm["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let vms = api(&ctx.client, &VIRTUAL_MACHINE, ns);
        if let Some((_, uid)) = done.virtual_machines.iter().find(|(n, _)| *n == name) {
            return Ok((name, uid.clone()));
        }
        let mut vm = vm.clone();
        vm["metadata"]["namespace"] = json!(ns);
        let obj: kube::api::DynamicObject = serde_json::from_value(vm)?;
        let created = match vms.create(&PostParams::default(), &obj).await {
            Ok(created) => created,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Err(StageError::Precondition(format!(
                    "VirtualMachine {ns}/{name} already exists and this restore did not create it: the root disk restored for it would be attached to another machine. Delete it (or restore onto another management cluster), then --resume"
                ))
                .into());
            }
            Err(err) => return Err(request(format!("creating VirtualMachine {ns}/{name}"))(err).into()),
        };
        let uid = created.metadata.uid.unwrap_or_default();
        done.virtual_machines.push((name.clone(), uid.clone()));
        step.record(serde_json::to_value(&*done)?)?;
        Ok((name, uid))
    }

    async fn restore_one(&self, ctx: &RestoreContext, manifest: &Manifest, index: usize, v: &GuestVolumeRecord, ns: &str, done: &mut VolumesRestored, step: &mut Step<'_>) -> Result<(), StageFailure> {
        let claim_name = v.volume.name.clone();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        if !done.claims.iter().any(|(n, _)| n == &claim_name) {
            let claim = json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim_name, "namespace": ns, "labels": v.volume.labels},
                "spec": {
                    "storageClassName": v.volume.storage_class,
                    "accessModes": v.volume.access_modes,
                    "volumeMode": v.volume.volume_mode,
                    "resources": {"requests": {"storage": v.volume.size}},
                },
            });
            let typed: PersistentVolumeClaim = serde_json::from_value(claim)?;
            // the claim a failed try deleted may still be going
            let what = format!("PersistentVolumeClaim {ns}/{claim_name}");
            crate::teardown::await_deletion(&pvcs, &claim_name, &what, ctx.inputs.wait_timeout()).await?;
            let created = pvcs.create(&PostParams::default(), &typed).await.map_err(request(format!("creating PersistentVolumeClaim {ns}/{claim_name}")))?;
            done.claims.push((claim_name.clone(), created.metadata.uid.unwrap_or_default()));
            step.record(serde_json::to_value(&*done)?)?;
        }
        let name = mover_name(ctx, index);
        // placed as the restored control plane will be
        let placement = match ctx.objects.as_deref() {
            Some(objects) => super::preflight::hosted_cluster(objects)?.control_plane_placement(),
            None => serde_json::json!({}),
        };
        let (mover, _forward) = start_mover(&ctx.client, ns, &name, &claim_name, &default_mover_image(ctx.inputs.mover_image.as_deref()), &labels(ctx), &placement, ctx.inputs.etcd_access, ctx.inputs.wait_timeout()).await?;
        let key = ctx.inputs.layout().artifact(&v.artifact);
        let body = ctx.store.get(&key).await?;
        let (body, want_size, want_sha) = super::verify::plaintext_of(ctx, manifest, &v.artifact, &key, body).await?;
        let got = mover.put_archive(body).await?;
        if (got.bytes, got.sha256.as_str()) != (want_size, want_sha.as_str()) {
            return Err(StageError::Precondition(format!(
                "guest volume {ns}/{claim_name}: the mover read {} bytes with SHA-256 {}, not the manifest's {want_size} bytes with {want_sha}: the backup's copy is corrupt or changed",
                got.bytes, got.sha256
            ))
            .into());
        }
        if let Err(err) = mover.exit().await {
            tracing::warn!("{err}; its Job is deleted anyway");
        }
        remove_mover(&ctx.client, ns, &name, None).await?;
        if let Some(dv) = &v.volume.data_volume {
            let mut dv = dv.clone();
            dv["metadata"]["namespace"] = json!(ns);
            dv["metadata"]["annotations"][PRE_POPULATED] = json!(claim_name);
            let dvs = api(&ctx.client, &DATA_VOLUME, ns);
            let obj: kube::api::DynamicObject = serde_json::from_value(dv)?;
            let dv_name = obj.metadata.name.clone().unwrap_or_default();
            let created = match dvs.create(&PostParams::default(), &obj).await {
                Ok(created) => created,
                Err(kube::Error::Api(status)) if status.code == 409 => dvs.get(&dv_name).await.map_err(request(format!("reading DataVolume {ns}/{dv_name}")))?,
                Err(err) => return Err(request(format!("creating DataVolume {ns}/{dv_name}"))(err).into()),
            };
            if !done.data_volumes.contains(&dv_name) {
                done.data_volumes.push(dv_name.clone());
            }
            // the claim belongs to its DataVolume, as CDI makes it
            let owner = json!({"metadata": {"ownerReferences": [{
                "apiVersion": DATA_VOLUME.api_resource().api_version, "kind": DATA_VOLUME.kind, "name": dv_name,
                "uid": created.metadata.uid, "controller": true, "blockOwnerDeletion": true,
            }]}});
            pvcs.patch(&claim_name, &PatchParams::default(), &Patch::Merge(&owner)).await.map_err(request(format!("making DataVolume {dv_name} the owner of PVC {ns}/{claim_name}")))?;
            if let Some(vm) = &v.volume.virtual_machine {
                let (vm_name, vm_uid) = self.virtual_machine(ctx, vm, ns, done, step).await?;
                let owner = json!({"metadata": {"ownerReferences": [{
                    "apiVersion": VIRTUAL_MACHINE.api_resource().api_version, "kind": VIRTUAL_MACHINE.kind, "name": vm_name,
                    "uid": vm_uid, "controller": true, "blockOwnerDeletion": true,
                }]}});
                dvs.patch(&dv_name, &PatchParams::default(), &Patch::Merge(&owner))
                    .await
                    .map_err(request(format!("making VirtualMachine {vm_name} the owner of DataVolume {ns}/{dv_name}")))?;
            }
        }
        done.restored.push((claim_name, got.files));
        step.record(serde_json::to_value(&*done)?)?;
        Ok(())
    }
}

#[async_trait]
impl Stage<RestoreContext> for VolumeRestore {
    fn summary(&self) -> &'static str {
        "re-create each KubeVirt guest volume (PVC and DataVolume, same names) and write its data back through a data-mover Job, before the NodePools"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RestoreContext, step: &Step<'_>) -> Vec<String> {
        let Some(manifest) = verified_manifest(step) else {
            return vec!["re-create the guest volumes the backup holds (KubeVirt), if any".into()];
        };
        let vols = volumes(ctx, &manifest);
        if vols.is_empty() {
            return vec!["nothing: the backup holds no guest volume".into()];
        }
        vols.iter()
            .map(|v| {
                let vm = v.volume.virtual_machine.as_ref().and_then(|vm| vm["metadata"]["name"].as_str());
                let owner = vm.map(|vm| format!(", then VirtualMachine {vm} as its owner (a root disk)")).unwrap_or_default();
                format!("create PVC {}/{} ({} {}, class {}) and write {} into it through a data-mover Job{owner}", ctx.inputs.hcp_namespace(), v.volume.name, v.volume.size, v.volume.volume_mode, v.volume.storage_class, v.artifact)
            })
            .collect()
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let manifest = manifest(ctx, step).await?;
        let vols = volumes(ctx, &manifest);
        let ns = ctx.inputs.hcp_namespace();
        let mut done: VolumesRestored = step.earlier_progress().unwrap_or_else(|| VolumesRestored { namespace: ns.clone(), ..Default::default() });
        if vols.is_empty() {
            return Ok(done);
        }
        let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
        if namespaces.get_opt(&ns).await.map_err(request(format!("reading Namespace {ns}")))?.is_none() {
            let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
            let created = namespaces.create(&PostParams::default(), &body).await.map_err(request(format!("creating Namespace {ns}")))?;
            done.created_namespace = created.metadata.uid;
            step.record(serde_json::to_value(&done)?)?;
        }
        for (index, v) in vols.iter().enumerate() {
            if done.restored.iter().any(|(n, _)| n == &v.volume.name) {
                continue;
            }
            if let Err(err) = self.restore_one(ctx, &manifest, index, v, &ns, &mut done, step).await {
                let name = mover_name(ctx, index);
                if let Err(cleanup) = remove_mover(&ctx.client, &ns, &name, None).await {
                    tracing::warn!("{cleanup}");
                }
                // a half-written claim cannot be resumed into: the next try starts on a fresh one
                if let Some(pos) = done.claims.iter().position(|(n, _)| n == &v.volume.name) {
                    let (claim, uid) = done.claims.remove(pos);
                    delete_claim(&ctx.client, &ns, &claim, &uid).await?;
                    step.record(serde_json::to_value(&done)?)?;
                }
                return Err(err);
            }
        }
        Ok(done)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut RestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(done) = input.record::<VolumesRestored>()? else { return Ok(()) };
        let ns = &done.namespace;
        let vms = api(&ctx.client, &VIRTUAL_MACHINE, ns);
        for (vm, uid) in &done.virtual_machines {
            let what = format!("VirtualMachine {ns}/{vm}");
            crate::teardown::delete_if_uid(&vms, vm, Some(uid), &what, ctx.inputs.wait_timeout()).await?;
        }
        let dvs = api(&ctx.client, &DATA_VOLUME, ns);
        for dv in &done.data_volumes {
            match dvs.delete(dv, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(err) if is_not_found(&err) => {}
                Err(err) => return Err(request(format!("deleting DataVolume {ns}/{dv}"))(err).into()),
            }
        }
        for (claim, uid) in &done.claims {
            delete_claim(&ctx.client, ns, claim, uid).await?;
        }
        for index in 0..done.claims.len().max(done.restored.len()) {
            remove_mover(&ctx.client, ns, &mover_name(ctx, index), None).await?;
        }
        if let Some(uid) = &done.created_namespace {
            let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
            let params = DeleteParams { preconditions: Some(kube::api::Preconditions { uid: Some(uid.clone()), resource_version: None }), ..Default::default() };
            match namespaces.delete(ns, &params).await {
                Ok(_) => {}
                Err(err) if is_not_found(&err) || crate::kube::is_conflict(&err) => {}
                Err(err) => return Err(request(format!("deleting Namespace {ns}"))(err).into()),
            }
        }
        Ok(())
    }
}

/// Delete the claim this run created (by UID: never a same-named one made since).
async fn delete_claim(client: &kube::Client, ns: &str, claim: &str, uid: &str) -> Result<(), KubeError> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams { preconditions: Some(kube::api::Preconditions { uid: Some(uid.to_string()), resource_version: None }), ..Default::default() };
    match pvcs.delete(claim, &params).await {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) || crate::kube::is_conflict(&err) => Ok(()),
        Err(err) => Err(request(format!("deleting PersistentVolumeClaim {ns}/{claim}"))(err)),
    }
}
