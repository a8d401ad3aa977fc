//! The KubeVirt platform's guest data on the management cluster.
//!
//! A KubeVirt hosted cluster's persistent volumes live on the management
//! cluster: when the guest asks for a volume, kubevirt-csi's controller (run
//! by HyperShift in the control-plane namespace) creates a DataVolume, and
//! CDI its PVC, in the infra namespace (the control-plane namespace unless
//! the cluster uses external infrastructure), both labelled
//! `hypershift.openshift.io/infra-id: <infraID>` (HyperShift's
//! `infraClusterLabels`). The guest's PersistentVolume names the DataVolume
//! as its volume handle, so a restore must bring it back under the same
//! name. The workers' root disks are DataVolumes too, owned by their
//! VirtualMachines: those are re-created from the NodePool's image and not
//! copied, unless asked (`--include-root-disks`): then each is copied like a
//! guest volume, with its VirtualMachine, which a restore re-creates and
//! makes the disk's owner (KubeVirt does not adopt a DataVolume it did not
//! create once `DataVolumeOwnershipProtection` is on, kubevirt VEP 379).
//!
//! Read-only here: [`guest_volumes`] finds what a backup copies and the
//! VolumeSnapshotClass each is snapshotted with, refusing what cannot be
//! copied before anything is paused.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Gvk;
use crate::kube::{KubeError, api, get_json, list_if_served, request};

/// The label kubevirt-csi puts on what it creates for a hosted cluster.
pub const INFRA_ID_LABEL: &str = "hypershift.openshift.io/infra-id";
pub const DATA_VOLUME: Gvk = Gvk { group: "cdi.kubevirt.io", version: "v1beta1", kind: "DataVolume", plural: "datavolumes" };
pub const VIRTUAL_MACHINE: Gvk = Gvk { group: "kubevirt.io", version: "v1", kind: "VirtualMachine", plural: "virtualmachines" };
pub const VOLUME_SNAPSHOT: Gvk =
    Gvk { group: "snapshot.storage.k8s.io", version: "v1", kind: "VolumeSnapshot", plural: "volumesnapshots" };
pub const VOLUME_SNAPSHOT_CLASS: Gvk =
    Gvk { group: "snapshot.storage.k8s.io", version: "v1", kind: "VolumeSnapshotClass", plural: "volumesnapshotclasses" };
/// The annotation marking a driver's default VolumeSnapshotClass.
pub const DEFAULT_SNAPSHOT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// CDI adopts a PVC that already holds the data of a DataVolume created
/// with this annotation (naming the DataVolume), instead of importing.
pub const PRE_POPULATED: &str = "cdi.kubevirt.io/storage.prePopulated";

/// One guest volume a backup copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestVolume {
    /// The PVC (and its DataVolume, when there is one) in the infra namespace.
    pub name: String,
    pub namespace: String,
    pub storage_class: String,
    /// The StorageClass's provisioner (the CSI driver).
    pub driver: String,
    /// `spec.resources.requests.storage`.
    pub size: String,
    pub access_modes: Vec<String>,
    pub volume_mode: String,
    pub labels: BTreeMap<String, String>,
    /// The DataVolume that owns the PVC (kubevirt-csi's volume handle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<Value>,
    /// A root disk's VirtualMachine (`--include-root-disks`), as a restore
    /// re-creates it: the disk's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine: Option<Value>,
    /// The VolumeSnapshotClass the snapshot is taken with.
    pub snapshot_class: String,
}

/// What [`guest_volumes`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestData {
    pub volumes: Vec<GuestVolume>,
    /// Root-disk PVCs left out (re-created from the NodePool's image);
    /// empty with `--include-root-disks`, which copies them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub root_disks: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The backup cannot copy the volumes; nothing may be paused.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Kube(#[from] KubeError),
}

fn owner_kind<'a>(obj: &'a Value) -> Option<(&'a str, &'a str)> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"].as_bool() == Some(true))
        .map(|o| (o["kind"].as_str().unwrap_or_default(), o["name"].as_str().unwrap_or_default()))
}

/// The guest volumes of a KubeVirt cluster (`hc`) and their snapshot
/// classes (`snapshot_class`: `--volume-snapshot-class`, else each driver's
/// default), the workers' root disks with them when `root_disks`. `None`
/// for another platform.
pub async fn guest_volumes(
    client: &kube::Client,
    hc: &Value,
    hcp_ns: &str,
    snapshot_class: Option<&str>,
    root_disks: bool,
) -> Result<Option<GuestData>, GuestError> {
    if hc["spec"]["platform"]["type"].as_str() != Some("KubeVirt") {
        return Ok(None);
    }
    let hc_label = format!(
        "HostedCluster {}/{}",
        hc["metadata"]["namespace"].as_str().unwrap_or_default(),
        hc["metadata"]["name"].as_str().unwrap_or_default()
    );
    if hc["spec"]["platform"]["kubevirt"]["credentials"].is_object() {
        return Err(GuestError::Refused(format!(
            "{hc_label} runs its workers on external infrastructure (spec.platform.kubevirt.credentials): its guest volumes live on that cluster, which hcp-dr does not reach; back them up there, or pass --skip-guest-volumes to back up the control plane alone"
        )));
    }
    let Some(infra_id) = hc["spec"]["infraID"].as_str() else {
        return Err(GuestError::Refused(format!("{hc_label} has no spec.infraID: its guest volumes cannot be told apart")));
    };
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), hcp_ns);
    let selector = format!("{INFRA_ID_LABEL}={infra_id}");
    let mut claims = pvcs
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(request(format!("listing PersistentVolumeClaims {selector} in {hcp_ns}")))?
        .items;
    // the workers' root disks, labelled or not: their VirtualMachines'
    // dataVolumeTemplates (every VM of the control-plane namespace is a
    // machine of this cluster)
    let vms = api(client, &VIRTUAL_MACHINE, hcp_ns);
    let machines = list_if_served(&vms, &ListParams::default(), &format!("VirtualMachines in {hcp_ns}")).await?.unwrap_or_default();
    for vm in &machines {
        for template in vm["spec"]["dataVolumeTemplates"].as_array().into_iter().flatten() {
            let Some(disk) = template["metadata"]["name"].as_str() else { continue };
            if claims.iter().any(|c| c.metadata.name.as_deref() == Some(disk)) {
                continue;
            }
            if let Some(claim) = pvcs.get_opt(disk).await.map_err(request(format!("reading PersistentVolumeClaim {hcp_ns}/{disk}")))? {
                claims.push(claim);
            }
        }
    }
    claims.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let data_volumes = api(client, &DATA_VOLUME, hcp_ns);
    let mut found = GuestData::default();
    let mut classes: BTreeMap<String, (String, String)> = BTreeMap::new();
    for claim in claims {
        let value = serde_json::to_value(&claim).map_err(|e| KubeError::Invalid(e.to_string()))?;
        let name = claim.metadata.name.clone().unwrap_or_default();
        // a root disk: the PVC or its DataVolume belongs to a VirtualMachine
        let mut data_volume = None;
        let mut machine = None;
        match owner_kind(&value) {
            Some(("VirtualMachine", vm)) => machine = Some(vm.to_string()),
            Some(("DataVolume", dv_name)) => {
                let dv = get_json(&data_volumes, dv_name, &format!("DataVolume {hcp_ns}/{dv_name}")).await?;
                if let Some(("VirtualMachine", vm)) = dv.as_ref().and_then(owner_kind) {
                    machine = Some(vm.to_string());
                }
                data_volume = dv;
            }
            _ => {}
        }
        let virtual_machine = match machine {
            None => None,
            Some(_) if !root_disks => {
                found.root_disks.push(name);
                continue;
            }
            Some(vm) => {
                let Some(obj) = machines.iter().find(|m| m["metadata"]["name"] == vm.as_str()).cloned() else {
                    return Err(GuestError::Refused(format!(
                        "root disk {hcp_ns}/{name} belongs to VirtualMachine {vm}, which is gone: wait for the NodePool to settle, or back up without --include-root-disks"
                    )));
                };
                Some(clean_virtual_machine(obj))
            }
        };
        let spec = claim.spec.clone().unwrap_or_default();
        let volume_mode = spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into());
        if volume_mode == "Block" {
            return Err(GuestError::Refused(format!(
                "guest volume {hcp_ns}/{name} is a Block volume: hcp-dr's data mover copies Filesystem volumes only; pass --skip-guest-volumes to back up the control plane without the guest's data"
            )));
        }
        let Some(storage_class) = spec.storage_class_name.clone().filter(|s| !s.is_empty()) else {
            return Err(GuestError::Refused(format!(
                "guest volume {hcp_ns}/{name} names no StorageClass: it cannot be snapshotted through CSI"
            )));
        };
        let (driver, snapshot_class) = match classes.get(&storage_class) {
            Some(known) => known.clone(),
            None => {
                let resolved = resolve_class(client, &storage_class, snapshot_class, &format!("guest volume {hcp_ns}/{name}")).await?;
                classes.insert(storage_class.clone(), resolved.clone());
                resolved
            }
        };
        let size = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_default();
        found.volumes.push(GuestVolume {
            name,
            namespace: hcp_ns.to_string(),
            storage_class,
            driver,
            size,
            access_modes: spec.access_modes.clone().unwrap_or_default(),
            volume_mode,
            labels: claim.metadata.labels.clone().unwrap_or_default(),
            data_volume: data_volume.map(clean_data_volume),
            virtual_machine,
            snapshot_class,
        });
    }
    Ok(Some(found))
}

/// A DataVolume as a restore re-creates it: spec and labels, nothing the
/// server or CDI wrote.
fn clean_data_volume(dv: Value) -> Value {
    let mut meta = serde_json::Map::new();
    for key in ["name", "namespace", "labels", "annotations"] {
        if !dv["metadata"][key].is_null() {
            meta.insert(key.into(), dv["metadata"][key].clone());
        }
    }
    serde_json::json!({"apiVersion": DATA_VOLUME.api_resource().api_version, "kind": DATA_VOLUME.kind, "metadata": meta, "spec": dv["spec"]})
}

/// A root disk's VirtualMachine as a restore re-creates it: spec, labels
/// and annotations; not its owner (the source's KubevirtMachine, whose UID
/// the destination's does not share) nor anything KubeVirt wrote.
fn clean_virtual_machine(vm: Value) -> Value {
    let mut meta = serde_json::Map::new();
    for key in ["name", "namespace", "labels"] {
        if !vm["metadata"][key].is_null() {
            meta.insert(key.into(), vm["metadata"][key].clone());
        }
    }
    if let Some(annotations) = vm["metadata"]["annotations"].as_object() {
        let kept: serde_json::Map<String, Value> =
            annotations.iter().filter(|(k, _)| !k.starts_with("kubevirt.io/")).map(|(k, v)| (k.clone(), v.clone())).collect();
        if !kept.is_empty() {
            meta.insert("annotations".into(), Value::Object(kept));
        }
    }
    serde_json::json!({"apiVersion": VIRTUAL_MACHINE.api_resource().api_version, "kind": VIRTUAL_MACHINE.kind, "metadata": meta, "spec": vm["spec"]})
}

/// The CSI driver of `storage_class` and the VolumeSnapshotClass for it:
/// `wanted` (which must exist and be for that driver), else the driver's
/// one default class.
async fn resolve_class(
    client: &kube::Client,
    storage_class: &str,
    wanted: Option<&str>,
    what: &str,
) -> Result<(String, String), GuestError> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let Some(sc) = classes.get_opt(storage_class).await.map_err(request(format!("reading StorageClass {storage_class}")))? else {
        return Err(GuestError::Refused(format!(
            "{what} uses StorageClass {storage_class}, which does not exist on this management cluster: it cannot be snapshotted"
        )));
    };
    let driver = sc.provisioner.clone();
    let snapshot_classes = kube::Api::<kube::api::DynamicObject>::all_with(client.clone(), &VOLUME_SNAPSHOT_CLASS.api_resource());
    let Some(known) = list_if_served(&snapshot_classes, &ListParams::default(), "VolumeSnapshotClasses").await? else {
        return Err(GuestError::Refused(format!(
            "this management cluster serves no VolumeSnapshotClasses (snapshot.storage.k8s.io/v1): install the CSI snapshot controller and a VolumeSnapshotClass for {driver}; {what} cannot be snapshotted"
        )));
    };
    let name_of = |c: &Value| c["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if let Some(wanted) = wanted {
        let Some(class) = known.iter().find(|c| name_of(c) == wanted) else {
            return Err(GuestError::Refused(format!(
                "--volume-snapshot-class {wanted} does not exist (kubectl get volumesnapshotclasses lists {})",
                list(known.iter().map(name_of))
            )));
        };
        let class_driver = class["driver"].as_str().unwrap_or_default();
        if class_driver != driver {
            return Err(GuestError::Refused(format!(
                "--volume-snapshot-class {wanted} is for the driver {class_driver}, but {what} is provisioned by {driver} (StorageClass {storage_class}): choose a class of {driver}"
            )));
        }
        return Ok((driver, wanted.to_string()));
    }
    let for_driver: Vec<&Value> = known.iter().filter(|c| c["driver"].as_str() == Some(driver.as_str())).collect();
    let defaults: Vec<&&Value> = for_driver
        .iter()
        .filter(|c| c["metadata"]["annotations"][DEFAULT_SNAPSHOT_CLASS].as_str() == Some("true"))
        .collect();
    match (defaults.as_slice(), for_driver.as_slice()) {
        ([one], _) => Ok((driver, name_of(one))),
        ([], []) => Err(GuestError::Refused(format!(
            "{what} is provisioned by {driver} (StorageClass {storage_class}), which has no VolumeSnapshotClass: the driver cannot snapshot it here; add a VolumeSnapshotClass for {driver}, or pass --skip-guest-volumes"
        ))),
        ([], some) => Err(GuestError::Refused(format!(
            "{driver} has no default VolumeSnapshotClass ({} exist, none annotated {DEFAULT_SNAPSHOT_CLASS}=true): pass --volume-snapshot-class",
            list(some.iter().map(|c| name_of(c)))
        ))),
        (many, _) => Err(GuestError::Refused(format!(
            "{driver} has {} default VolumeSnapshotClasses ({}): pass --volume-snapshot-class to choose",
            many.len(),
            list(many.iter().map(|c| name_of(c)))
        ))),
    }
}

fn list(names: impl Iterator<Item = String>) -> String {
    let names: Vec<String> = names.collect();
    if names.is_empty() { "none".into() } else { names.join(", ") }
}
