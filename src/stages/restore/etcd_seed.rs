//! `etcd-seed`: for a HighlyAvailable cluster, hcp-dr puts the restored etcd
//! data into the members' volumes itself, before the HostedCluster exists,
//! instead of leaving it to HyperShift's `etcd-init`.
//!
//! Why: `etcd-init` (openshift/hypershift
//! `control-plane-operator/controllers/hostedcontrolplane/v2/etcd/etcd-init.sh`,
//! the same logic in every release before PR 9048) restores
//! `restoreSnapshotURL` on each member with `etcdutl snapshot restore` and no
//! `--name`, `--initial-cluster`, token or revision bump. Each member then
//! holds a one-member cluster of its own (`default` at
//! `http://localhost:2380`) and etcd ignores `ETCD_INITIAL_CLUSTER` once its
//! data directory exists: three clusters behind one Service (OCPBUGS-99534).
//! A SingleReplica cluster restores correctly that way, so it keeps the URL
//! path (`--etcd-seed url`), as does a destination whose HyperShift has the
//! fix (`--etcd-init-fixed`).
//!
//! What it does (each step journaled before it is made):
//! - the control-plane namespace, when absent (on a management cluster
//!   without SecurityContextConstraints with the UID HyperShift would give
//!   its pods, `hypershift.openshift.io/default-security-context-uid`,
//!   allocated as the HyperShift operator allocates it);
//! - a claim per member, named as the StatefulSet's claim template names
//!   them (`data-etcd-N`), with the size and StorageClass of the backed-up
//!   `spec.etcd.managed.storage` (the destination's default class when it
//!   names none), labelled as the StatefulSet labels its claims;
//! - one pod per member, all at once, placed where the members will run
//!   (the HostedCluster's nodeSelector and tolerations, the StatefulSet's
//!   required anti-affinity: one per node and per zone) so that a
//!   WaitForFirstConsumer volume binds where its member can run, running as
//!   the members will. Each is the `etcd restore` pod (one implementation,
//!   `etcd_restore::members::restore_pod`): it downloads the snapshot from
//!   the presigned URL (handed over in a Secret), checks its SHA-256 and runs
//!   `etcdutl snapshot restore --name etcd-N --initial-cluster <the
//!   StatefulSet's> --initial-cluster-token --initial-advertise-peer-urls
//!   --bump-revision --mark-compacted`;
//! - the pods and the Secret are removed once every member is seeded.
//!
//! Then `etcd-init` finds data and steps aside on every release, and
//! `reset-member` sees a member with data. `wait` proves the result is one
//! cluster. Undo (`--abort`) deletes the pods, the Secret, the claims and
//! the namespace this stage created; a rerun (`--resume`) keeps the claims
//! it made and seeds the members not yet seeded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::RestoreContext;
use super::preflight::hosted_cluster;
use super::snapshot_url::ensure_url;
use super::verify::{ensure_loaded, manifest, verified_manifest};
use crate::archive::Manifest;
use crate::hosted::{HostedCluster, RUN_ANNOTATION};
use crate::kube::{KubeError, request};
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::StageError;
use crate::stages::etcd_restore::assess::{PlannedMember, RestorePlan};
use crate::stages::etcd_restore::members::{self, POD_LABEL};
use crate::stages::etcd_restore::BUMP_MARGIN;
use crate::stages::params::SeedParams;

pub struct EtcdSeed;

/// How the restored members get their data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SeedMode {
    /// hcp-dr restores every member's volume before the HostedCluster exists.
    Volumes,
    /// HyperShift's `etcd-init` restores `restoreSnapshotURL` into each member.
    Url,
}

/// `--etcd-seed`, `--etcd-init-fixed`, `--bump-revision`, `--etcd-image`
/// (journaled; nothing secret).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdSeedInputs {
    /// `None`: volumes for HighlyAvailable, url for SingleReplica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SeedMode>,
    /// The destination's HyperShift restores the URL with the members'
    /// names and initial cluster (openshift/hypershift PR 9048).
    #[serde(default)]
    pub init_fixed: bool,
    /// The revision bump of the seeded members (`None`: chosen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bump_revision: Option<u64>,
    /// The seeding pods' image (`None`: the backup's etcd image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The source wrote nothing after the backup (a migration: its writers
    /// are stopped from the snapshot on), so a small bump is enough.
    #[serde(default)]
    pub source_stopped: bool,
}

/// The write rate hcp-dr assumes a source may have kept up after its
/// backup when nothing says otherwise: about five times what a busy hosted
/// cluster of a few hundred nodes sustains. A bump too large costs nothing;
/// one too small lets a watcher miss events.
pub const WRITE_RATE_BOUND: u64 = 1000;

/// The annotation naming the backup a seeded claim was filled from.
pub const SEEDED_FROM: &str = "hcp-dr.openshift.io/etcd-seeded-from";
/// Where the HyperShift operator keeps a control-plane namespace's pod UID
/// on a management cluster without SecurityContextConstraints.
pub const UID_ANNOTATION: &str = "hypershift.openshift.io/default-security-context-uid";
/// The UIDs the HyperShift operator allocates from (its
/// `DefaultSecurityContextUID` and range).
pub const FIRST_UID: i64 = 1001;
pub const UID_COUNT: i64 = 10_000;
/// Set by OpenShift on every namespace: the range SCC admission picks pod UIDs from.
pub const SCC_UID_RANGE: &str = "openshift.io/sa.scc.uid-range";
/// The label HyperShift puts on control-plane namespaces.
pub const HCP_NAMESPACE_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";

/// The mode for a backup of a cluster with `availability`, and why (pure).
pub fn resolve_mode(inputs: &EtcdSeedInputs, availability: &str) -> Result<(SeedMode, String), String> {
    let ha = availability == "HighlyAvailable";
    match (inputs.mode, ha) {
        (Some(SeedMode::Url), true) if !inputs.init_fixed => Err(format!(
            "--etcd-seed url on a HighlyAvailable backup: HyperShift's etcd-init (control-plane-operator/controllers/hostedcontrolplane/v2/etcd/etcd-init.sh) restores restoreSnapshotURL into every member without --name or --initial-cluster, so the three members come up as three separate clusters (split brain, OCPBUGS-99534). Drop --etcd-seed (hcp-dr seeds the members' volumes itself), or add --etcd-init-fixed if the destination's HyperShift has openshift/hypershift PR 9048; nothing was changed"
        )),
        (Some(SeedMode::Url), true) => Ok((SeedMode::Url, "--etcd-seed url --etcd-init-fixed: the destination's etcd-init restores the members with their names and initial cluster".into())),
        (Some(SeedMode::Url), false) => Ok((SeedMode::Url, "--etcd-seed url".into())),
        (Some(SeedMode::Volumes), _) => Ok((SeedMode::Volumes, "--etcd-seed volumes".into())),
        (None, true) => Ok((SeedMode::Volumes, "HighlyAvailable: HyperShift's etcd-init would restore each member as a cluster of its own".into())),
        (None, false) => Ok((SeedMode::Url, format!("{availability}: one member, which etcd-init restores correctly from restoreSnapshotURL"))),
    }
}

/// The revision bump of the seeded members, and why (pure). The restored
/// cluster must start above every revision a client of the source saw:
/// the backup's revision plus what the source may have written since.
pub fn choose_bump(inputs: &EtcdSeedInputs, backup_revision: i64, backup_age_seconds: i64) -> (u64, String) {
    if let Some(given) = inputs.bump_revision {
        return (given, format!("--bump-revision {given}"));
    }
    if inputs.source_stopped {
        return (
            BUMP_MARGIN,
            format!("the source's writers have been stopped since the backup (revision {backup_revision}): a margin of {BUMP_MARGIN}"),
        );
    }
    let age = backup_age_seconds.max(0) as u64;
    let bump = age.saturating_mul(WRITE_RATE_BOUND).max(BUMP_MARGIN);
    (
        bump,
        format!(
            "the backup (revision {backup_revision}) is {age}s old and the source may have written up to {WRITE_RATE_BOUND} revisions a second since; pass --bump-revision to choose"
        ),
    )
}

/// As whom the seeding pods run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodIdentity {
    /// OpenShift: SecurityContextConstraints give every pod of the namespace
    /// the first UID of its range, the etcd pods included.
    Scc,
    /// Elsewhere: the UID (and fsGroup) HyperShift gives the etcd pods.
    Uid(i64),
}

impl PodIdentity {
    fn security_context(&self) -> Value {
        match self {
            PodIdentity::Scc => json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}),
            PodIdentity::Uid(uid) => json!({"runAsUser": uid, "fsGroup": uid, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}),
        }
    }
    fn describe(&self) -> String {
        match self {
            PodIdentity::Scc => "the UID SecurityContextConstraints give the namespace's pods".into(),
            PodIdentity::Uid(uid) => format!("UID and fsGroup {uid}"),
        }
    }
}

/// The lowest UID of HyperShift's range no other control-plane namespace
/// uses (pure).
pub fn allocate_uid(used: &[i64]) -> Option<i64> {
    (FIRST_UID..FIRST_UID + UID_COUNT).find(|uid| !used.contains(uid))
}

/// The size and class of the members' volumes: the backed-up
/// `spec.etcd.managed.storage.persistentVolume` (HyperShift's 8Gi default).
pub fn storage_of(hc: &HostedCluster) -> (String, Option<String>) {
    let pv = &hc.0["spec"]["etcd"]["managed"]["storage"]["persistentVolume"];
    let size = pv["size"].as_str().unwrap_or("8Gi").to_string();
    let class = pv["storageClassName"].as_str().filter(|c| !c.is_empty()).map(str::to_string);
    (size, class)
}

/// Where and as whom the seeding pods run (pure): where the etcd pods
/// will, as HyperShift places them.
pub fn scheduling(hc: &HostedCluster, hcp_ns: &str, identity: &PodIdentity) -> Value {
    let mut tolerations = vec![
        json!({"key": "hypershift.openshift.io/control-plane", "operator": "Equal", "value": "true", "effect": "NoSchedule"}),
        json!({"key": "hypershift.openshift.io/cluster", "operator": "Equal", "value": hcp_ns, "effect": "NoSchedule"}),
    ];
    let placement = hc.control_plane_placement();
    if let Some(extra) = placement["tolerations"].as_array() {
        tolerations.extend(extra.iter().cloned());
    }
    let selector = json!({"matchLabels": {POD_LABEL.0: POD_LABEL.1}});
    let per_host = json!({"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"});
    let per_zone = json!({"labelSelector": selector, "topologyKey": "topology.kubernetes.io/zone"});
    // as HyperShift's setMultizoneSpread: on KubeVirt and OpenStack the zone
    // spread is only preferred
    let zone_preferred = matches!(hc.platform(), "KubeVirt" | "OpenStack");
    let anti = if zone_preferred {
        json!({"requiredDuringSchedulingIgnoredDuringExecution": [per_host],
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": per_zone}]})
    } else {
        json!({"requiredDuringSchedulingIgnoredDuringExecution": [per_zone, per_host]})
    };
    let prefer = |weight: u32, key: &str, value: &str| json!({"weight": weight, "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}});
    let mut out = json!({
        "tolerations": tolerations,
        "affinity": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                prefer(50, "hypershift.openshift.io/control-plane", "true"),
                prefer(100, "hypershift.openshift.io/cluster", hcp_ns),
            ]},
            "podAntiAffinity": anti,
        },
        "securityContext": identity.security_context(),
    });
    if let Some(selector) = placement.get("nodeSelector") {
        out["nodeSelector"] = selector.clone();
    }
    out
}

/// The members of a cluster restored with `replicas` members, as
/// HyperShift's StatefulSet defines them (pure).
pub fn seed_plan(hc: &HostedCluster, hcp_ns: &str, image: &str, identity: &PodIdentity) -> RestorePlan {
    let replicas = hc.expected_etcd_members();
    let members: Vec<PlannedMember> = (0..replicas)
        .map(|i| {
            let name = format!("etcd-{i}");
            PlannedMember {
                peer_url: crate::stages::etcd_ops::one_cluster::expected_peer_url(&name, hcp_ns),
                pvc: format!("data-{name}"),
                name,
                pvc_uid: None,
            }
        })
        .collect();
    let initial_cluster = members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect::<Vec<_>>().join(",");
    let (size, class) = storage_of(hc);
    let mut claim_spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, "volumeMode": "Filesystem"});
    if let Some(class) = class {
        claim_spec["storageClassName"] = json!(class);
    }
    RestorePlan {
        node_pools: Vec::new(),
        replicas: replicas as i32,
        members,
        initial_cluster,
        // HyperShift's StatefulSet sets none: etcd's default
        initial_cluster_token: "etcd-cluster".into(),
        data_dir: "/var/lib/data".into(),
        image: image.to_string(),
        mount_path: "/var/lib".into(),
        claim_template: json!({"metadata": {"name": "data"}, "spec": claim_spec}),
        selector_labels: json!({"app": "etcd"}),
        scheduling: scheduling(hc, hcp_ns, identity),
        revision_seen: None,
        all_answered: false,
    }
}

/// The SHA-256 of what the presigned URL serves: the best snapshot (its
/// plaintext, for an encrypted backup, whose staged copy is decrypted).
fn served_sha256(manifest: &Manifest) -> Result<String, StageError> {
    let best = manifest.best_snapshot().ok_or(StageError::Missing("a member snapshot"))?;
    Ok(manifest.plaintext(&best.artifact).map(|p| p.sha256.clone()).unwrap_or_else(|| best.sha256.clone()))
}

/// What `etcd-seed` did (journaled before each change, and as its output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Seeded {
    pub mode: SeedMode,
    /// Why this mode.
    pub why: String,
    #[serde(default)]
    pub namespace: String,
    /// The UID of the namespace when this stage created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_namespace: Option<String>,
    /// The run that created the claims (its annotation marks them).
    #[serde(default)]
    pub run_id: String,
    /// The members, in order.
    #[serde(default)]
    pub member_names: Vec<String>,
    /// Claims created: name to UID.
    #[serde(default)]
    pub claims: BTreeMap<String, String>,
    /// A claim being created when the record was written (UID unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_claim: Option<String>,
    /// Members seeded, with the seconds their pod took.
    #[serde(default)]
    pub members: BTreeMap<String, f64>,
    #[serde(default)]
    pub size: String,
    /// `None`: the destination's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    #[serde(default)]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<PodIdentity>,
    #[serde(default)]
    pub backup_revision: i64,
    #[serde(default)]
    pub bump: u64,
    #[serde(default)]
    pub bump_reason: String,
    /// The backup's revision plus the bump: every member starts at or above it.
    #[serde(default)]
    pub expected_min_revision: i64,
}

impl Seeded {
    fn new(mode: SeedMode, why: String, namespace: String) -> Seeded {
        Seeded {
            mode,
            why,
            namespace,
            created_namespace: None,
            run_id: String::new(),
            member_names: Vec::new(),
            claims: BTreeMap::new(),
            pending_claim: None,
            members: BTreeMap::new(),
            size: String::new(),
            storage_class: None,
            image: String::new(),
            identity: None,
            backup_revision: 0,
            bump: 0,
            bump_reason: String::new(),
            expected_min_revision: 0,
        }
    }
}

/// The image the seeding pods run: `--etcd-image`, else the etcd image the
/// backup recorded.
fn image(ctx: &RestoreContext, manifest: &Manifest) -> Result<String, StageError> {
    ctx.inputs
        .etcd_seed
        .image
        .clone()
        .or_else(|| manifest.cluster.etcd_image.clone())
        .ok_or_else(|| {
            StageError::Precondition(format!(
                "the backup does not record the etcd image (it was taken by an hcp-dr older than this one), which the pods that seed the members' volumes run: pass --etcd-image IMAGE, the etcd image of release {} (oc adm release info --image-for=etcd {}), and --resume",
                manifest.cluster.release_image, manifest.cluster.release_image
            ))
        })
}

/// Whether the management cluster has SecurityContextConstraints (OpenShift).
async fn has_scc(client: &kube::Client) -> Result<bool, KubeError> {
    let groups = client
        .list_api_groups()
        .await
        .map_err(request("listing the destination's API groups"))?;
    Ok(groups.groups.iter().any(|g| g.name == "security.openshift.io"))
}

/// The UIDs the control-plane namespaces of this management cluster use.
async fn used_uids(client: &kube::Client) -> Result<Vec<i64>, KubeError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let list = namespaces.list(&ListParams::default()).await.map_err(request("listing namespaces"))?;
    Ok(list
        .items
        .iter()
        .filter_map(|ns| ns.metadata.annotations.as_ref()?.get(UID_ANNOTATION)?.parse().ok())
        .collect())
}

/// The namespace, created when absent (journaled), and the identity the
/// seeding pods take in it.
async fn namespace_and_identity(ctx: &RestoreContext, done: &mut Seeded, step: &mut Step<'_>) -> Result<PodIdentity, StageFailure> {
    let ns = done.namespace.clone();
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let scc = has_scc(&ctx.client).await?;
    let existing = namespaces.get_opt(&ns).await.map_err(request(format!("reading Namespace {ns}")))?;
    let recorded_uid = existing
        .as_ref()
        .and_then(|n| n.metadata.annotations.as_ref())
        .and_then(|a| a.get(UID_ANNOTATION))
        .and_then(|u| u.parse::<i64>().ok());
    let uid = match (scc, recorded_uid) {
        (true, _) => None,
        (false, Some(uid)) => Some(uid),
        (false, None) => Some(allocate_uid(&used_uids(&ctx.client).await?).ok_or_else(|| {
            StageError::Precondition(format!(
                "every UID HyperShift allocates ({FIRST_UID} to {}) is taken by a control-plane namespace: free one (the annotation {UID_ANNOTATION}) first",
                FIRST_UID + UID_COUNT - 1
            ))
        })?),
    };
    match existing {
        None => {
            let mut annotations = json!({RUN_ANNOTATION: done.run_id});
            if let Some(uid) = uid {
                annotations[UID_ANNOTATION] = json!(uid.to_string());
            }
            let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns, "annotations": annotations, "labels": {HCP_NAMESPACE_LABEL: "true"}}}))?;
            let created = namespaces.create(&PostParams::default(), &body).await.map_err(request(format!("creating Namespace {ns}")))?;
            done.created_namespace = created.metadata.uid;
            step.record(serde_json::to_value(&*done)?)?;
        }
        Some(_) if uid.is_some() && recorded_uid.is_none() => {
            let patch = json!({"metadata": {"annotations": {UID_ANNOTATION: uid.map(|u| u.to_string())}}});
            namespaces
                .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(request(format!("annotating Namespace {ns} with {UID_ANNOTATION}")))?;
        }
        Some(_) => {}
    }
    if scc {
        // SCC admission needs the namespace's UID range, which OpenShift
        // sets right after the namespace is made
        let what = format!("Namespace {ns} to get its {SCC_UID_RANGE} annotation (from OpenShift's cluster-policy-controller)");
        let ranged = crate::kube::wait_for(&what, Duration::from_secs(60), Duration::from_millis(500), || async {
            let live = namespaces.get_opt(&ns).await.map_err(request(format!("reading Namespace {ns}")))?;
            Ok(live.and_then(|n| n.metadata.annotations).filter(|a| a.contains_key(SCC_UID_RANGE)).map(|_| ()))
        })
        .await;
        if let Err(err) = ranged {
            tracing::warn!("{err}: creating the seeding pods anyway");
        }
    }
    Ok(match uid {
        Some(uid) => PodIdentity::Uid(uid),
        None => PodIdentity::Scc,
    })
}

/// What keeps the members' volumes from being seeded on this destination,
/// for `preflight` (nothing is changed before it is fixed): the refused
/// mode, the StorageClass the backup names missing, no image to seed with.
/// No default class when the backup names none is a warning (returned
/// second): the claims then bind only to PersistentVolumes made by hand.
pub async fn preflight_problems(ctx: &RestoreContext, manifest: &Manifest, hc: &HostedCluster) -> Result<(Vec<String>, Vec<String>), KubeError> {
    let (mode, _) = match resolve_mode(&ctx.inputs.etcd_seed, hc.availability_policy()) {
        Ok(found) => found,
        Err(err) => return Ok((vec![err], Vec::new())),
    };
    if mode == SeedMode::Url {
        return Ok((Vec::new(), Vec::new()));
    }
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    if let Err(err) = image(ctx, manifest) {
        problems.push(err.to_string());
    }
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let (_, class) = storage_of(hc);
    match class {
        Some(class) => {
            if classes.get_opt(&class).await.map_err(request(format!("reading StorageClass {class}")))?.is_none() {
                problems.push(format!(
                    "StorageClass {class} does not exist here, and the backup's HostedCluster keeps etcd in it (spec.etcd.managed.storage.persistentVolume.storageClassName), so the members' volumes cannot be made: create it (or a class of that name for the same kind of storage), or restore onto a management cluster that has it"
                ));
            }
        }
        None => {
            let list = classes.list(&ListParams::default()).await.map_err(request("listing StorageClasses"))?;
            let default = list.items.iter().any(|c| {
                c.metadata.annotations.as_ref().and_then(|a| a.get("storageclass.kubernetes.io/is-default-class")).is_some_and(|v| v == "true")
            });
            if !default {
                warnings.push(format!(
                    "the backup's HostedCluster names no StorageClass for etcd and this management cluster has no default class: the members' claims (data-etcd-N in {}) bind only to PersistentVolumes made by hand, and etcd-seed stops if none binds them (mark a class default: kubectl annotate storageclass NAME storageclass.kubernetes.io/is-default-class=true)",
                    ctx.inputs.hcp_namespace()
                ));
            }
        }
    }
    Ok((problems, warnings))
}

/// Create the claim of `member` unless this run did (journaled first).
async fn ensure_claim(ctx: &RestoreContext, plan: &RestorePlan, member: &PlannedMember, done: &mut Seeded, step: &mut Step<'_>) -> Result<(), StageFailure> {
    let ns = done.namespace.clone();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let what = format!("PersistentVolumeClaim {ns}/{}", member.pvc);
    let live = api.get_opt(&member.pvc).await.map_err(request(format!("reading {what}")))?;
    if let Some(live) = &live {
        let uid = live.metadata.uid.clone().unwrap_or_default();
        let ours = done.claims.get(&member.pvc) == Some(&uid)
            || (done.pending_claim.as_deref() == Some(member.pvc.as_str())
                && crate::teardown::created_by_run(live.metadata.annotations.as_ref().and_then(|a| a.get(RUN_ANNOTATION)).map(String::as_str), &done.run_id));
        if ours && live.metadata.deletion_timestamp.is_none() {
            done.claims.insert(member.pvc.clone(), uid);
            done.pending_claim = None;
            step.record(serde_json::to_value(&*done)?)?;
            return Ok(());
        }
        let leftover = ctx.findings.as_ref().is_some_and(|f| f.leftover_pvcs.contains(&member.pvc));
        if live.metadata.deletion_timestamp.is_none() {
            if !(leftover && ctx.inputs.clean_leftovers) {
                return Err(StageError::Precondition(format!(
                    "{what} exists and this restore did not create it: etcd would start from its data and skip the restore. Delete it (kubectl -n {ns} delete pvc {}) and --resume, or --abort",
                    member.pvc
                ))
                .into());
            }
            // --clean-leftovers: preflight found it there before anything was made
            tracing::warn!(pvc = %member.pvc, namespace = %ns, "deleting a leftover etcd PVC (--clean-leftovers)");
            crate::teardown::delete_if_uid(&api, &member.pvc, live.metadata.uid.as_deref(), &what, ctx.inputs.wait_timeout()).await?;
        }
        crate::teardown::await_deletion(&api, &member.pvc, &what, ctx.inputs.wait_timeout()).await?;
    }
    let mut claim = members::fresh_claim(plan, member, &ns);
    claim["metadata"]["annotations"] = json!({RUN_ANNOTATION: done.run_id, SEEDED_FROM: format!("{}/{}", ctx.store.url(), ctx.inputs.layout().dir())});
    let claim: PersistentVolumeClaim = serde_json::from_value(claim)?;
    done.pending_claim = Some(member.pvc.clone());
    step.record(serde_json::to_value(&*done)?)?;
    let created = api.create(&PostParams::default(), &claim).await.map_err(request(format!("creating {what}")))?;
    done.claims.insert(member.pvc.clone(), created.metadata.uid.unwrap_or_default());
    done.pending_claim = None;
    step.record(serde_json::to_value(&*done)?)?;
    Ok(())
}

/// A pod's `PodScheduled=False` reason `Unschedulable` message, if it has one.
fn unschedulable(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .map(|c| c.message.clone().unwrap_or_else(|| "no node fits it".into()))
}

/// The latest warning events of a claim (their messages), newest last.
async fn claim_events(client: &kube::Client, ns: &str, claim: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let Ok(list) = events.list(&ListParams::default().fields(&format!("involvedObject.name={claim}"))).await else { return Vec::new() };
    let mut found: Vec<(String, String)> = list
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("PersistentVolumeClaim"))
        .map(|e| {
            let when = e.last_timestamp.map(|t| t.0.to_string()).or(e.event_time.map(|t| t.0.to_string())).unwrap_or_default();
            (when, format!("{}: {}", e.reason.unwrap_or_default(), e.message.unwrap_or_default().trim()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, m)| m).rev().take(3).collect()
}

/// Whether `class` (None: the default) binds its claims only once a pod uses them.
async fn waits_for_consumer(client: &kube::Client, class: Option<&str>) -> Result<bool, KubeError> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let list = classes.list(&ListParams::default()).await.map_err(request("listing StorageClasses"))?;
    let chosen = list.items.iter().find(|c| match class {
        Some(name) => c.metadata.name.as_deref() == Some(name),
        None => c.metadata.annotations.as_ref().and_then(|a| a.get("storageclass.kubernetes.io/is-default-class")).is_some_and(|v| v == "true"),
    });
    Ok(chosen.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer"))
}

/// Wait until every member's pod has seeded its volume; the seconds each took.
async fn wait_seeded(ctx: &RestoreContext, plan: &RestorePlan, done: &mut Seeded, step: &mut Step<'_>, started: &BTreeMap<String, Instant>) -> Result<(), StageFailure> {
    let params = step.read_params::<SeedParams>()?;
    let (unschedulable_for, unbound_for) = (params.unschedulable_for().map_err(StageError::Precondition)?, params.unbound_for().map_err(StageError::Precondition)?);
    let ns = done.namespace.clone();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let wffc = waits_for_consumer(&ctx.client, done.storage_class.as_deref()).await?;
    let timeout = ctx.inputs.wait_timeout();
    let begun = Instant::now();
    let mut last_said = Instant::now();
    let mut unschedulable_since: BTreeMap<String, Instant> = BTreeMap::new();
    let mut unbound_since: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let mut waiting = Vec::new();
        for member in &plan.members {
            if done.members.contains_key(&member.name) {
                continue;
            }
            let name = members::pod_name(&member.name);
            let pod = pods.get_opt(&name).await.map_err(request(format!("reading Pod {ns}/{name}")))?;
            let Some(pod) = pod else {
                return Err(StageError::Precondition(format!("the seeding pod {ns}/{name} is gone (deleted by someone?): --resume creates it again")).into());
            };
            match members::pod_outcome(&pod, &ns) {
                Some(Ok(())) => {
                    let seconds = started.get(&member.name).map(|t| t.elapsed().as_secs_f64()).unwrap_or_default();
                    tracing::info!(member = %member.name, seconds, "member volume seeded");
                    done.members.insert(member.name.clone(), seconds);
                    step.record(serde_json::to_value(&*done)?)?;
                    continue;
                }
                Some(Err(message)) => {
                    return Err(StageError::Precondition(format!("seeding {}'s volume: {message}; fix the cause and --resume (the members already seeded are kept)", member.name)).into());
                }
                None => {}
            }
            let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| !n.is_empty());
            // a pod held for its unbound claim is the claim's wait, timed below
            match unschedulable(&pod).filter(|m| !m.contains("unbound immediate PersistentVolumeClaims")) {
                Some(message) => {
                    let since = *unschedulable_since.entry(member.name.clone()).or_insert_with(Instant::now);
                    if since.elapsed() >= unschedulable_for {
                        let placement = hosted_cluster(ctx.objects.as_deref().unwrap_or_default())?.control_plane_placement();
                        return Err(StageError::Precondition(format!(
                            "the seeding pod {ns}/{name} cannot be scheduled ({}s): {message}. It must run where etcd member {} will: on a node that takes the HostedCluster's placement ({}) and the control-plane tolerations, one member per node and per zone (HyperShift's required anti-affinity for HighlyAvailable). Give the management cluster such nodes (or change the HostedCluster's spec.nodeSelector/tolerations), then --resume; or --abort",
                            since.elapsed().as_secs(),
                            member.name,
                            if placement.as_object().is_some_and(|m| m.is_empty()) { "no nodeSelector or tolerations of its own".to_string() } else { placement.to_string() }
                        ))
                        .into());
                    }
                    waiting.push(format!("{name} unschedulable: {message}"));
                }
                None => {
                    unschedulable_since.remove(&member.name);
                }
            }
            let claim = pvcs.get_opt(&member.pvc).await.map_err(request(format!("reading PersistentVolumeClaim {ns}/{}", member.pvc)))?;
            let phase = claim.as_ref().and_then(|c| c.status.as_ref()).and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into());
            // a WaitForFirstConsumer claim binds once its pod is scheduled
            if phase != "Bound" && (!wffc || scheduled) {
                let since = *unbound_since.entry(member.pvc.clone()).or_insert_with(Instant::now);
                let class = claim.as_ref().and_then(|c| c.spec.as_ref()).and_then(|s| s.storage_class_name.clone()).unwrap_or_else(|| "(none: no default StorageClass)".into());
                if since.elapsed() >= unbound_for {
                    let events = claim_events(&ctx.client, &ns, &member.pvc).await;
                    return Err(StageError::Precondition(format!(
                        "PersistentVolumeClaim {ns}/{} (StorageClass {class}) is still {phase} after {}s{}: its provisioner made no volume. Check the class's provisioner (kubectl get storageclass {class}; kubectl -n {ns} describe pvc {}), then --resume; or --abort",
                        member.pvc,
                        since.elapsed().as_secs(),
                        if events.is_empty() { String::new() } else { format!(" ({})", events.join("; ")) },
                        member.pvc
                    ))
                    .into());
                }
                waiting.push(format!("PersistentVolumeClaim {} (class {class}) {phase}", member.pvc));
            } else {
                unbound_since.remove(&member.pvc);
                if !scheduled || phase != "Bound" {
                    waiting.push(format!("{name} to be scheduled"));
                } else {
                    waiting.push(format!("{name} to restore the snapshot"));
                }
            }
        }
        if plan.members.iter().all(|m| done.members.contains_key(&m.name)) {
            return Ok(());
        }
        if begun.elapsed() >= timeout {
            return Err(KubeError::Timeout { what: format!("the members' volumes to be seeded ({})", waiting.join("; ")), seconds: timeout.as_secs() }.into());
        }
        if last_said.elapsed() >= Duration::from_secs(30) {
            tracing::info!(elapsed = begun.elapsed().as_secs(), "seeding the etcd volumes: waiting for {}", waiting.join("; "));
            last_said = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Remove the seeding pods and the URL Secret (after success or failure).
async fn remove_pods(client: &kube::Client, ns: &str, names: &[String], timeout: Duration) -> Result<(), StageFailure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for member in names {
        let name = members::pod_name(member);
        crate::teardown::delete_and_wait(&pods, &name, &format!("seeding pod {ns}/{name}"), timeout).await?;
    }
    members::remove_url_secret(client, ns, timeout).await
}

async fn seed(ctx: &mut RestoreContext, step: &mut Step<'_>, manifest: &Manifest, done: &mut Seeded) -> Result<(), StageFailure> {
    let hc = hosted_cluster(ctx.objects.as_deref().unwrap_or_default())?;
    let identity = namespace_and_identity(ctx, done, step).await?;
    done.identity = Some(identity.clone());
    let plan = seed_plan(&hc, &done.namespace, &done.image, &identity);
    done.member_names = plan.members.iter().map(|m| m.name.clone()).collect();
    step.record(serde_json::to_value(&*done)?)?;
    for member in &plan.members {
        ensure_claim(ctx, &plan, member, done, step).await?;
    }
    ensure_url(ctx, step).await?;
    let url = ctx.snapshot_url.clone().ok_or(StageError::Missing("the snapshot URL"))?;
    let ns = done.namespace.clone();
    let timeout = ctx.inputs.wait_timeout();
    members::write_url_secret(&ctx.client, &ns, &url, timeout).await?;
    let sha = served_sha256(manifest)?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut started = BTreeMap::new();
    // all at once: the scheduler places them together, one per node and zone
    for member in plan.members.iter().filter(|m| !done.members.contains_key(&m.name)) {
        let pod: Pod = serde_json::from_value(members::restore_pod(&plan, member, &ns, &sha, done.bump, timeout))?;
        let name = members::pod_name(&member.name);
        let what = format!("seeding pod {ns}/{name}");
        crate::teardown::delete_and_wait(&pods, &name, &what, timeout).await?;
        pods.create(&PostParams::default(), &pod).await.map_err(request(format!("creating {what}")))?;
        started.insert(member.name.clone(), Instant::now());
    }
    wait_seeded(ctx, &plan, done, step, &started).await
}

impl StageId for EtcdSeed {
    const NAME: &'static str = "etcd-seed";
    type Output = Seeded;
}

#[async_trait]
impl Stage<RestoreContext> for EtcdSeed {
    fn summary(&self) -> &'static str {
        "HighlyAvailable: restore the snapshot into every member's volume (named members, the StatefulSet's initial cluster, a revision bump) before the HostedCluster exists, as HyperShift's etcd-init would split it into separate clusters"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn params(&self) -> Params {
        Params::of::<SeedParams>()
    }
    fn plan(&self, ctx: &RestoreContext, step: &Step<'_>) -> Vec<String> {
        let Some(manifest) = verified_manifest(step) else {
            return vec![format!(
                "seed the etcd members' volumes of the backup this run writes when it is HighlyAvailable ({})",
                ctx.inputs.etcd_seed.mode.map(|m| format!("--etcd-seed {m:?}").to_lowercase()).unwrap_or_else(|| "volumes for HighlyAvailable, the URL for SingleReplica".into())
            )];
        };
        let (mode, why) = match resolve_mode(&ctx.inputs.etcd_seed, &manifest.cluster.availability_policy) {
            Ok(found) => found,
            Err(err) => return vec![format!("(refused: {err})")],
        };
        if mode == SeedMode::Url {
            return vec![format!("nothing: etcd-init restores restoreSnapshotURL ({why})")];
        }
        let Some(objects) = ctx.objects.as_deref() else { return vec!["(cannot plan: the backup's objects are not loaded)".into()] };
        let Ok(hc) = hosted_cluster(objects) else { return vec!["(cannot plan: the backup holds no HostedCluster)".into()] };
        let ns = ctx.inputs.hcp_namespace();
        let image = image(ctx, &manifest).unwrap_or_else(|err| format!("(refused: {err})"));
        let plan = seed_plan(&hc, &ns, &image, &PodIdentity::Scc);
        let (size, class) = storage_of(&hc);
        let age = manifest.timings.started.map(|t| (chrono::Utc::now() - t).num_seconds()).unwrap_or_default();
        let revision = manifest.best_snapshot().map(|s| s.revision).unwrap_or_default();
        let (bump, bump_reason) = choose_bump(&ctx.inputs.etcd_seed, revision, age);
        let mut lines = vec![format!("why: {why}"), format!("create Namespace {ns} when absent")];
        for member in &plan.members {
            lines.push(format!(
                "create PersistentVolumeClaim {ns}/{} ({size}, StorageClass {})",
                member.pvc,
                class.as_deref().unwrap_or("the destination's default")
            ));
        }
        for member in &plan.members {
            lines.push(format!(
                "run pod {} ({image}) on {}, all at once, one per node and zone: etcdutl snapshot restore --name {} --initial-cluster {} --initial-advertise-peer-urls {} --bump-revision {bump} --mark-compacted",
                members::pod_name(&member.name),
                member.pvc,
                member.name,
                plan.initial_cluster,
                member.peer_url
            ));
        }
        lines.push(format!("bump: {bump_reason}"));
        lines
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        ensure_loaded(ctx).await?;
        let manifest = manifest(ctx, step).await?;
        let hc = hosted_cluster(ctx.objects.as_deref().unwrap_or_default())?;
        let (mode, why) = resolve_mode(&ctx.inputs.etcd_seed, hc.availability_policy()).map_err(StageError::Precondition)?;
        let mut done = step.earlier_progress::<Seeded>().unwrap_or_else(|| Seeded::new(mode, why.clone(), ctx.inputs.hcp_namespace()));
        if mode == SeedMode::Url {
            tracing::info!("etcd is restored by HyperShift's etcd-init from restoreSnapshotURL: {why}");
            return Ok(done);
        }
        if done.run_id.is_empty() {
            done.run_id = step.history().map(|h| h.header.run_id.clone()).unwrap_or_default();
        }
        let best = manifest.best_snapshot().ok_or(StageError::Missing("a member snapshot"))?;
        if done.bump == 0 {
            // chosen once: a resumed run seeds the rest with the same bump
            let age = manifest.timings.started.map(|t| (chrono::Utc::now() - t).num_seconds()).unwrap_or_default();
            let (bump, reason) = choose_bump(&ctx.inputs.etcd_seed, best.revision, age);
            done.bump = bump;
            done.bump_reason = reason;
            done.backup_revision = best.revision;
            done.expected_min_revision = best.revision.saturating_add(bump as i64);
            let (size, class) = storage_of(&hc);
            done.size = size;
            done.storage_class = class;
            done.image = image(ctx, &manifest)?;
        }
        let result = seed(ctx, step, &manifest, &mut done).await;
        let cleaned = remove_pods(&ctx.client, &done.namespace, &done.member_names, ctx.inputs.wait_timeout()).await;
        result?;
        cleaned?;
        tracing::info!(
            members = done.members.len(),
            bump = done.bump,
            identity = %done.identity.as_ref().map(PodIdentity::describe).unwrap_or_default(),
            "etcd volumes seeded: every member starts at revision {} or above",
            done.expected_min_revision
        );
        Ok(done)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut RestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(done) = input.record::<Seeded>()? else { return Ok(()) };
        if done.mode == SeedMode::Url || done.namespace.is_empty() {
            return Ok(());
        }
        let (ns, timeout) = (done.namespace.clone(), ctx.inputs.wait_timeout());
        remove_pods(&ctx.client, &ns, &done.member_names, timeout).await?;
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        let mut claims: Vec<(String, Option<String>)> = done.claims.iter().map(|(n, u)| (n.clone(), Some(u.clone()))).collect();
        if let Some(pending) = &done.pending_claim {
            claims.push((pending.clone(), None));
        }
        for (claim, uid) in claims {
            let what = format!("PersistentVolumeClaim {ns}/{claim}");
            match crate::teardown::delete_created(&pvcs, &claim, uid.as_deref(), &done.run_id, &what, timeout).await? {
                crate::teardown::Removal::NotOurs { uid } => ctx.warnings.push(format!("{what} was left alone: it is not the claim this restore created (UID {uid})")),
                _ => tracing::info!(claim = %claim, "deleted the seeded claim"),
            }
        }
        if let Some(uid) = &done.created_namespace {
            crate::teardown::delete_namespace(&ctx.client, &ns, Some(uid), timeout).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hc(policy: &str, platform: &str) -> HostedCluster {
        HostedCluster(json!({
            "metadata": {"name": "demo", "namespace": "clusters"},
            "spec": {"controllerAvailabilityPolicy": policy, "platform": {"type": platform},
                "etcd": {"managementType": "Managed", "managed": {"storage": {"type": "PersistentVolume", "persistentVolume": {"size": "16Gi", "storageClassName": "gp3-csi"}}}},
                "nodeSelector": {"role": "control-plane"},
                "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}
        }))
    }

    #[test]
    fn highly_available_seeds_volumes_and_refuses_the_url_unless_fixed() {
        let auto = EtcdSeedInputs::default();
        assert_eq!(resolve_mode(&auto, "HighlyAvailable").unwrap().0, SeedMode::Volumes);
        assert_eq!(resolve_mode(&auto, "SingleReplica").unwrap().0, SeedMode::Url);
        let url = EtcdSeedInputs { mode: Some(SeedMode::Url), ..Default::default() };
        let err = resolve_mode(&url, "HighlyAvailable").unwrap_err();
        assert!(err.contains("--etcd-init-fixed") && err.contains("etcd-init.sh") && err.contains("nothing was changed"), "{err}");
        let fixed = EtcdSeedInputs { mode: Some(SeedMode::Url), init_fixed: true, ..Default::default() };
        assert_eq!(resolve_mode(&fixed, "HighlyAvailable").unwrap().0, SeedMode::Url);
        assert_eq!(resolve_mode(&url, "SingleReplica").unwrap().0, SeedMode::Url);
        let volumes = EtcdSeedInputs { mode: Some(SeedMode::Volumes), ..Default::default() };
        assert_eq!(resolve_mode(&volumes, "SingleReplica").unwrap().0, SeedMode::Volumes);
    }

    #[test]
    fn the_bump_covers_what_the_source_may_have_written() {
        let auto = EtcdSeedInputs::default();
        assert_eq!(choose_bump(&auto, 500, 3600).0, 3600 * WRITE_RATE_BOUND);
        assert_eq!(choose_bump(&auto, 500, 0).0, BUMP_MARGIN);
        assert_eq!(choose_bump(&auto, 500, -5).0, BUMP_MARGIN);
        let stopped = EtcdSeedInputs { source_stopped: true, ..Default::default() };
        assert_eq!(choose_bump(&stopped, 500, 3600).0, BUMP_MARGIN);
        let given = EtcdSeedInputs { bump_revision: Some(77), source_stopped: true, ..Default::default() };
        assert_eq!(choose_bump(&given, 500, 3600), (77, "--bump-revision 77".to_string()));
        assert!(choose_bump(&auto, 500, 60).1.contains("60s old"));
    }

    #[test]
    fn uids_are_allocated_as_hypershift_does() {
        assert_eq!(allocate_uid(&[]), Some(FIRST_UID));
        assert_eq!(allocate_uid(&[1001, 1002, 1004]), Some(1003));
        let all: Vec<i64> = (FIRST_UID..FIRST_UID + UID_COUNT).collect();
        assert_eq!(allocate_uid(&all), None);
    }

    #[test]
    fn the_plan_is_the_statefulsets_members_volumes_and_placement() {
        let plan = seed_plan(&hc("HighlyAvailable", "AWS"), "clusters-demo", "quay.io/etcd:v3.5", &PodIdentity::Uid(1003));
        let names: Vec<(&str, &str)> = plan.members.iter().map(|m| (m.name.as_str(), m.pvc.as_str())).collect();
        assert_eq!(names, vec![("etcd-0", "data-etcd-0"), ("etcd-1", "data-etcd-1"), ("etcd-2", "data-etcd-2")]);
        assert_eq!(
            plan.initial_cluster,
            "etcd-0=https://etcd-0.etcd-discovery.clusters-demo.svc:2380,etcd-1=https://etcd-1.etcd-discovery.clusters-demo.svc:2380,etcd-2=https://etcd-2.etcd-discovery.clusters-demo.svc:2380"
        );
        assert_eq!(plan.claim_template["spec"]["resources"]["requests"]["storage"], "16Gi");
        assert_eq!(plan.claim_template["spec"]["storageClassName"], "gp3-csi");
        let claim = members::fresh_claim(&plan, &plan.members[1], "clusters-demo");
        assert_eq!(claim["metadata"]["labels"]["app"], "etcd");
        let _: PersistentVolumeClaim = serde_json::from_value(claim).unwrap();

        let pod = members::restore_pod(&plan, &plan.members[2], "clusters-demo", "abc", 3600, Duration::from_secs(600));
        let spec = &pod["spec"];
        assert_eq!(spec["nodeSelector"]["role"], "control-plane");
        let tolerations = spec["tolerations"].as_array().unwrap();
        assert!(tolerations.iter().any(|t| t["key"] == "hypershift.openshift.io/cluster" && t["value"] == "clusters-demo"));
        assert!(tolerations.iter().any(|t| t["key"] == "dedicated"));
        let required = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].as_array().unwrap();
        let keys: Vec<&str> = required.iter().map(|t| t["topologyKey"].as_str().unwrap()).collect();
        assert_eq!(keys, vec!["topology.kubernetes.io/zone", "kubernetes.io/hostname"]);
        assert_eq!(required[0]["labelSelector"]["matchLabels"][POD_LABEL.0], POD_LABEL.1);
        assert_eq!(pod["metadata"]["labels"][POD_LABEL.0], POD_LABEL.1, "the anti-affinity selects the seeding pods themselves");
        assert_eq!(spec["securityContext"]["runAsUser"], 1003);
        assert_eq!(spec["securityContext"]["fsGroup"], 1003);
        assert_eq!(spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"], false);
        let env = spec["containers"][0]["env"].as_array().unwrap();
        let value = |n: &str| env.iter().find(|e| e["name"] == n).and_then(|e| e["value"].as_str()).unwrap_or_default().to_string();
        assert_eq!(value("RESTORE_NAME"), "etcd-2");
        assert_eq!(value("RESTORE_PEER_URL"), "https://etcd-2.etcd-discovery.clusters-demo.svc:2380");
        assert_eq!(value("RESTORE_INITIAL_CLUSTER_TOKEN"), "etcd-cluster");
        assert_eq!(value("RESTORE_BUMP_REVISION"), "3600");
        let _: Pod = serde_json::from_value(pod).unwrap();
    }

    #[test]
    fn kubevirt_only_prefers_the_zone_spread_and_scc_sets_no_uid() {
        let plan = seed_plan(&hc("HighlyAvailable", "KubeVirt"), "clusters-demo", "etcd", &PodIdentity::Scc);
        let anti = &plan.scheduling["affinity"]["podAntiAffinity"];
        assert_eq!(anti["requiredDuringSchedulingIgnoredDuringExecution"].as_array().unwrap().len(), 1);
        assert_eq!(anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"], "topology.kubernetes.io/zone");
        assert!(plan.scheduling["securityContext"].get("runAsUser").is_none());
        assert_eq!(plan.scheduling["securityContext"]["runAsNonRoot"], true);
    }

    #[test]
    fn default_storage_is_hypershifts() {
        let bare = HostedCluster(json!({"spec": {}}));
        assert_eq!(storage_of(&bare), ("8Gi".to_string(), None));
        let single = seed_plan(&HostedCluster(json!({"metadata": {"name": "x", "namespace": "c"}, "spec": {"controllerAvailabilityPolicy": "SingleReplica"}})), "c-x", "etcd", &PodIdentity::Scc);
        assert_eq!(single.members.len(), 1);
        assert!(single.claim_template["spec"].get("storageClassName").is_none());
    }
}
