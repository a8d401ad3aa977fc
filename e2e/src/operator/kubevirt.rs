//! The KubeVirt workers of a hosted cluster on the management cluster: the
//! parts of the KubeVirt CAPI provider (CAPK), KubeVirt's VM controller
//! and CDI that a worker's root disk goes through.
//!
//! - **CAPK**: each KubevirtMachine (not paused with
//!   `cluster.x-k8s.io/paused`) gets a VirtualMachine of the same name in
//!   its namespace, from its `spec.virtualMachineTemplate`, each
//!   `dataVolumeTemplates` entry renamed `<vm>-<name>` (and the volume that
//!   names it), as CAPK prefixes them. A VirtualMachine that is already
//!   there under that name is the machine's: it is kept, not re-created
//!   (what a restore relies on).
//! - **VM controller**: each DataVolume template of a VirtualMachine is
//!   created (owned by the VM, labelled `kubevirt.io/created-by`) when
//!   absent. A DataVolume of that name the VM does not own is not adopted
//!   (KubeVirt's `DataVolumeOwnershipProtection`, VEP 379): the VM waits,
//!   with a `DataVolumeNameCollision` failure logged, until someone makes
//!   it the owner. The VM's `status` says `Running` once its disks are.
//! - **CDI**, for DataVolumes owned by a VirtualMachine: the claim of the
//!   same name is created (owned by the DataVolume, labelled as CDI does)
//!   and, once bound, "imported": its directory gets `disk.img` naming the
//!   source image; the DataVolume goes `ImportScheduled` then `Succeeded`.
//!   A DataVolume annotated `cdi.kubevirt.io/storage.prePopulated` whose
//!   claim exists is `Succeeded` at once, its data untouched.
//!
//! Sandbox differences: CAPK deletes a machine's VM from the
//! KubevirtMachine's finalizer; here the VM carries an ownerReference to
//! the KubevirtMachine (added to a VM found already there) and the
//! garbage collector deletes it. No VirtualMachineInstance or launcher pod
//! runs. kubevirt-csi's guest volumes (DataVolumes no VM owns) are made by
//! [`crate::sandbox::guest_volume_on`], not here.

use std::sync::Arc;

use serde_json::{Value, json};

use super::objects::{PVC, Res, controller_of, is_deleting, name_of, ns_of, str_at, uid_of};
use super::workloads::{existing_pv_dir, patch_status_if_changed};
use super::{Ctx, OperatorError, io_err, log_failure};

pub(crate) const VIRTUAL_MACHINE: Res = Res::new("kubevirt.io", "v1", "VirtualMachine", "virtualmachines");
pub(crate) const DATA_VOLUME: Res = Res::new("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes");
pub(crate) const KUBEVIRT_MACHINE: Res =
    Res::new("infrastructure.cluster.x-k8s.io", "v1alpha1", "KubevirtMachine", "kubevirtmachines");
/// CDI keeps a claim annotated so (naming the DataVolume) as it is.
pub const PRE_POPULATED: &str = "cdi.kubevirt.io/storage.prePopulated";
/// The file an import writes into a root disk's directory.
pub const DISK_IMAGE: &str = "disk.img";
const CAPI_PAUSED: &str = "cluster.x-k8s.io/paused";

/// The `spec.virtualMachineTemplate` HyperShift renders into a KubeVirt
/// NodePool's machines: one root disk `rhcos` of `size` from `image`.
pub fn virtual_machine_template(ns: &str, infra_id: &str, image: &str, cores: u64, memory: &str, size: &str, storage_class: &str) -> Value {
    json!({
        "metadata": {"namespace": ns, "labels": {"hypershift.openshift.io/infra-id": infra_id}},
        "spec": {
            "runStrategy": "Always",
            "dataVolumeTemplates": [{
                "metadata": {"name": "rhcos"},
                "spec": {
                    "source": {"registry": {"url": format!("docker://{image}")}},
                    "storage": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem", "storageClassName": storage_class,
                                "resources": {"requests": {"storage": size}}},
                },
            }],
            "template": {
                "metadata": {"labels": {"hypershift.openshift.io/infra-id": infra_id}},
                "spec": {
                    "domain": {
                        "cpu": {"cores": cores},
                        "memory": {"guest": memory},
                        "devices": {"disks": [{"name": "rhcos", "disk": {"bus": "virtio"}}]},
                    },
                    "volumes": [{"name": "rhcos", "dataVolume": {"name": "rhcos"}}],
                },
            },
        },
    })
}

/// One pass of the three controllers.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let machines = ctx.kube.list_if_served(&KUBEVIRT_MACHINE, None).await?;
    let vms = ctx.kube.list_if_served(&VIRTUAL_MACHINE, None).await?;
    for machine in machines.iter().filter(|m| !is_deleting(m)) {
        if let Err(err) = capk(&ctx, machine, &vms).await {
            log_failure("capk", &format!("{}/{}", ns_of(machine), name_of(machine)), &err);
        }
    }
    if machines.is_empty() && vms.is_empty() {
        return Ok(()); // no KubeVirt worker on this cluster
    }
    let dvs = ctx.kube.list_if_served(&DATA_VOLUME, None).await?;
    for vm in vms.iter().filter(|v| !is_deleting(v)) {
        if let Err(err) = vm_controller(&ctx, vm, &dvs).await {
            log_failure("virt-controller", &format!("{}/{}", ns_of(vm), name_of(vm)), &err);
        }
    }
    for dv in dvs.iter().filter(|d| !is_deleting(d)) {
        if controller_of(dv).is_none_or(|(kind, _, _)| kind != VIRTUAL_MACHINE.kind) {
            continue;
        }
        if let Err(err) = cdi(&ctx, dv).await {
            log_failure("cdi", &format!("{}/{}", ns_of(dv), name_of(dv)), &err);
        }
    }
    Ok(())
}

/// The VirtualMachine CAPK makes of `machine`: its template, the
/// DataVolume templates (and the volumes naming them) prefixed with the
/// VM's name.
fn machine_vm(machine: &Value) -> Option<Value> {
    let template = machine.pointer("/spec/virtualMachineTemplate")?;
    let name = name_of(machine);
    let mut spec = template["spec"].clone();
    let renamed: Vec<(String, String)> = spec["dataVolumeTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["metadata"]["name"].as_str())
        .map(|dv| (dv.to_string(), format!("{name}-{dv}")))
        .collect();
    for t in spec["dataVolumeTemplates"].as_array_mut().into_iter().flatten() {
        if let Some((_, new)) = renamed.iter().find(|(old, _)| t["metadata"]["name"] == *old.as_str()) {
            t["metadata"]["name"] = json!(new);
        }
    }
    for v in spec.pointer_mut("/template/spec/volumes").and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some((_, new)) = renamed.iter().find(|(old, _)| v["dataVolume"]["name"] == *old.as_str()) {
            v["dataVolume"]["name"] = json!(new);
        }
    }
    let mut labels = labels_of(template);
    labels["kubevirt.io/vm"] = json!(name);
    Some(json!({"metadata": {"name": name, "namespace": ns_of(machine), "labels": labels,
        "ownerReferences": [machine_owner(machine)]}, "spec": spec}))
}

/// A copy of `obj`'s labels, an empty map when it has none.
fn labels_of(obj: &Value) -> Value {
    match &obj["metadata"]["labels"] {
        Value::Object(labels) => Value::Object(labels.clone()),
        _ => json!({}),
    }
}

/// A (non-controller) ownerReference to the KubevirtMachine.
fn machine_owner(machine: &Value) -> Value {
    json!({"apiVersion": KUBEVIRT_MACHINE.api_version(), "kind": KUBEVIRT_MACHINE.kind, "name": name_of(machine), "uid": uid_of(machine)})
}

async fn capk(ctx: &Ctx, machine: &Value, vms: &[Value]) -> Result<(), OperatorError> {
    if machine.pointer(&format!("/metadata/annotations/{}", CAPI_PAUSED.replace('/', "~1"))).is_some() {
        return Ok(());
    }
    let (ns, name) = (ns_of(machine), name_of(machine));
    match vms.iter().find(|vm| ns_of(vm) == ns && name_of(vm) == name) {
        None => {
            let Some(vm) = machine_vm(machine) else { return Ok(()) };
            ctx.kube.create_if_absent(&VIRTUAL_MACHINE, Some(ns), vm).await?;
        }
        Some(vm) => {
            let owners = vm.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
            if !owners.iter().any(|o| o["uid"].as_str() == Some(uid_of(machine))) {
                let mut owners = owners;
                owners.push(machine_owner(machine));
                ctx.kube.merge(&VIRTUAL_MACHINE, Some(ns), name, &json!({"metadata": {"ownerReferences": owners}})).await?;
            }
        }
    }
    Ok(())
}

async fn vm_controller(ctx: &Ctx, vm: &Value, dvs: &[Value]) -> Result<(), OperatorError> {
    let ns = ns_of(vm);
    let mut ready = true;
    for template in vm.pointer("/spec/dataVolumeTemplates").and_then(Value::as_array).into_iter().flatten() {
        let Some(dv_name) = str_at(template, "/metadata/name") else { continue };
        match dvs.iter().find(|d| ns_of(d) == ns && name_of(d) == dv_name) {
            None => {
                let mut labels = labels_of(template);
                labels["kubevirt.io/created-by"] = json!(uid_of(vm));
                let dv = json!({"metadata": {"name": dv_name, "namespace": ns, "labels": labels,
                        "ownerReferences": [super::objects::owner_ref(&VIRTUAL_MACHINE, vm)]},
                    "spec": template["spec"]});
                ctx.kube.create_if_absent(&DATA_VOLUME, Some(ns), dv).await?;
                ready = false;
            }
            Some(dv) => {
                if controller_of(dv).map(|(_, _, uid)| uid) != Some(uid_of(vm)) {
                    return Err(OperatorError::Invalid {
                        what: format!(
                            "DataVolumeNameCollision: DataVolume {ns}/{dv_name} exists and VirtualMachine {} does not own it: not adopted, the VM waits",
                            name_of(vm)
                        ),
                    });
                }
                ready &= str_at(dv, "/status/phase") == Some("Succeeded");
            }
        }
    }
    let status = if ready {
        json!({"printableStatus": "Running", "ready": true, "created": true})
    } else {
        json!({"printableStatus": "Provisioning", "ready": false})
    };
    patch_vm_status(ctx, vm, status).await
}

/// The VM's status: through the subresource where its CRD has one (KubeVirt's
/// own does), else on the object (the CRD copy in ../shared has none).
async fn patch_vm_status(ctx: &Ctx, vm: &Value, status: Value) -> Result<(), OperatorError> {
    if super::workloads::status_subset(&status, vm.get("status").unwrap_or(&json!({}))) {
        return Ok(());
    }
    match patch_status_if_changed(ctx, &VIRTUAL_MACHINE, vm, status.clone()).await {
        Err(e) if super::objects::status_code(&e) == Some(404) => {
            ctx.kube.merge(&VIRTUAL_MACHINE, Some(ns_of(vm)), name_of(vm), &json!({"status": status})).await.map(|_| ())
        }
        other => other,
    }
}

async fn cdi(ctx: &Ctx, dv: &Value) -> Result<(), OperatorError> {
    let (ns, name) = (ns_of(dv), name_of(dv));
    let claim = ctx.kube.get(&PVC, Some(ns), name).await?;
    let pre_populated = dv.pointer(&format!("/metadata/annotations/{}", PRE_POPULATED.replace('/', "~1"))).is_some();
    let Some(claim) = claim else {
        if pre_populated {
            return Ok(()); // its claim is being restored by someone else
        }
        let storage = &dv["spec"]["storage"];
        let mut labels = labels_of(dv);
        labels["app"] = json!("containerized-data-importer");
        labels["app.kubernetes.io/component"] = json!("storage");
        labels["app.kubernetes.io/managed-by"] = json!("cdi-controller");
        let source = str_at(dv, "/spec/source/registry/url").unwrap_or("blank");
        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                "annotations": {"cdi.kubevirt.io/storage.contentType": "kubevirt", "cdi.kubevirt.io/storage.import.endpoint": source},
                "ownerReferences": [super::objects::owner_ref(&DATA_VOLUME, dv)]},
            "spec": {"accessModes": storage["accessModes"], "volumeMode": storage["volumeMode"],
                "storageClassName": storage["storageClassName"], "resources": storage["resources"]}});
        ctx.kube.create_if_absent(&PVC, Some(ns), pvc).await?;
        return patch_status_if_changed(ctx, &DATA_VOLUME, dv, json!({"phase": "ImportScheduled", "progress": "N/A"})).await;
    };
    if str_at(dv, "/status/phase") == Some("Succeeded") {
        return Ok(());
    }
    if !pre_populated {
        if str_at(&claim, "/status/phase") != Some("Bound") {
            return Ok(());
        }
        let Some(dir) = existing_pv_dir(&ctx.cfg.state_dir, &claim) else { return Ok(()) };
        let image = dir.join(DISK_IMAGE);
        let source = str_at(dv, "/spec/source/registry/url").unwrap_or("blank");
        std::fs::write(&image, format!("imported from {source}\n")).map_err(io_err("writing", &image))?;
    }
    patch_status_if_changed(ctx, &DATA_VOLUME, dv, json!({"phase": "Succeeded", "progress": "100.0%"})).await
}
