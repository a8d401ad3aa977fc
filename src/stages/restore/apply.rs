//! `apply`: replay the backup's objects on the destination in the order of
//! [`super::order::ORDER`], after the replay sanitizers (server metadata,
//! owner references and the backup's pause dropped; everything else kept).
//! The HostedControlPlane and the HostedCluster are created with
//! `spec.etcd.managed.storage.restoreSnapshotURL` set to the one presigned
//! URL: the field is immutable, so it is set in the create, never patched.
//!
//! Idempotent: an object that already exists and holds everything the
//! backup has is left alone; one that differs is reported (or replaced with
//! `--overwrite`). Every create is journaled first, so `--abort` deletes
//! exactly what this restore created, newest first.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::preflight::{Findings, describe, gvk_of};
use super::snapshot_url::ensure_url;
use super::verify::ensure_loaded;
use super::{RestoreContext, order};
use crate::archive::{LINEAGE, sanitize};
use crate::kube::{KubeError, api_for, is_not_found, request};
use crate::pipeline::journal::RUN_ANNOTATION;
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::StageError;
use crate::hosted::agent::{BARE_METAL_HOST, DETACHED};
use crate::hosted::{HOSTED_CLUSTER, NODE_POOL, exported_group};
use crate::teardown::{
    Owned, Removal, TornDown, annotate_if_uid, clear_control_plane_namespace, created_by_run, delete_if_uid, delete_namespace, ownership, pause_if_uid,
    remove_finalizers_if_uid, scale_to_zero,
};

pub struct Apply;

/// The annotation naming the backup a restored object came from.
pub const RESTORED_FROM: &str = "hcp-dr.openshift.io/restored-from";

/// One object this restore created: which, and (once created) the UID and
/// resourceVersion the server gave it, so an undo deletes that object and
/// never a same-named one made since. Equality is by identity (kind,
/// namespace, name), not by UID.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjRef {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

impl PartialEq for ObjRef {
    fn eq(&self, other: &Self) -> bool {
        (&self.api_version, &self.kind, &self.namespace, &self.name) == (&other.api_version, &other.kind, &other.namespace, &other.name)
    }
}

impl ObjRef {
    fn of(obj: &Value) -> ObjRef {
        ObjRef {
            api_version: obj["apiVersion"].as_str().unwrap_or_default().to_string(),
            kind: obj["kind"].as_str().unwrap_or_default().to_string(),
            namespace: obj["metadata"]["namespace"].as_str().map(str::to_string),
            name: obj["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            uid: obj["metadata"]["uid"].as_str().map(str::to_string),
            resource_version: obj["metadata"]["resourceVersion"].as_str().map(str::to_string),
        }
    }

    /// The same reference with the server's UID and resourceVersion of `live`.
    fn created_as(mut self, live: &Value) -> ObjRef {
        let stamped = ObjRef::of(live);
        self.uid = stamped.uid;
        self.resource_version = stamped.resource_version;
        self
    }
    /// The API group (`""`: core).
    fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map(|(group, _)| group).unwrap_or("")
    }
    fn label(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace.as_deref().unwrap_or(""), self.name)
    }
    /// A HostedCluster or NodePool: what a pause stops HyperShift and CAPI
    /// acting on.
    fn is_paused_kind(&self) -> bool {
        self.group() == HOSTED_CLUSTER.group && (self.kind == HOSTED_CLUSTER.kind || self.kind == NODE_POOL.kind)
    }
}

/// What `apply` did so far (journaled before each change).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    /// The run that created these (journal `run_id`): every object created
    /// carries it in the [`RUN_ANNOTATION`] annotation, which is how an undo
    /// recognises the `pending` object whose UID it never learnt.
    #[serde(default)]
    pub run_id: String,
    pub namespaces: Vec<String>,
    /// The UIDs of the namespaces this run created.
    #[serde(default)]
    pub namespace_uids: std::collections::BTreeMap<String, String>,
    pub deleted_leftovers: Vec<String>,
    pub created: Vec<ObjRef>,
    /// Being created when the record was written (may or may not exist).
    #[serde(default)]
    pub pending: Option<ObjRef>,
    /// Existing objects left alone (identical) or replaced (--overwrite).
    #[serde(default)]
    pub identical: usize,
    #[serde(default)]
    pub replaced: Vec<String>,
}

const URL_POINTER: &str = "/spec/etcd/managed/storage/restoreSnapshotURL";

/// The first path at which `have` lacks or differs from something in `want`
/// (`None`: `have` holds all of `want`; server-added fields are fine).
pub fn first_difference(want: &Value, have: &Value, path: &str) -> Option<String> {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w.iter().find_map(|(k, v)| {
            let here = format!("{path}/{k}");
            match h.get(k) {
                Some(hv) => first_difference(v, hv, &here),
                None if v.is_null() => None,
                None => Some(here),
            }
        }),
        _ if want == have => None,
        _ => Some(path.to_string()),
    }
}

/// Compare a backup object with the destination's, ignoring server metadata
/// and (HostedCluster, HostedControlPlane) the snapshot URL, which differs
/// per presign.
pub fn differs(want: &Value, have: &Value) -> Option<String> {
    let mut want = want.clone();
    let mut have = have.clone();
    for v in [&mut want, &mut have] {
        sanitize::apply(sanitize::REPLAY, v);
        if let Some(storage) = v.pointer_mut("/spec/etcd/managed/storage").and_then(Value::as_object_mut) {
            storage.remove("restoreSnapshotURL");
        }
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("finalizers");
            if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                a.remove(RESTORED_FROM);
                a.remove(RUN_ANNOTATION);
                a.remove(LINEAGE);
                // metal3 takes it off once it restored the status
                a.remove(crate::hosted::agent::STATUS_ANNOTATION);
            }
        }
        if let Some(map) = v.as_object_mut() {
            map.remove("status");
        }
    }
    first_difference(&want, &have, "")
}

/// The objects to create, in order, sanitized, the URL and provenance set:
/// the HostedCluster also carries its lineage (the original cluster's UID,
/// `source_uid` unless the backup's object already names an older one), so
/// backups of the original stay usable for `etcd restore` of this copy.
pub fn prepared(objects: &[Value], url: &str, from: &str, source_uid: &str) -> Vec<Value> {
    let mut out: Vec<Value> = objects.to_vec();
    order::sort(&mut out);
    for obj in &mut out {
        sanitize::apply(sanitize::REPLAY, obj);
        if obj["apiVersion"].as_str().is_some_and(|v| v.starts_with("hypershift.openshift.io/"))
            && matches!(obj["kind"].as_str(), Some("HostedCluster" | "HostedControlPlane"))
        {
            if let Some(spec) = obj.pointer_mut("/spec/etcd/managed/storage") {
                spec["restoreSnapshotURL"] = json!([url]);
            }
            obj["metadata"]["annotations"][RESTORED_FROM] = json!(from);
            if obj["kind"] == "HostedCluster" && !source_uid.is_empty() && obj["metadata"]["annotations"].get(LINEAGE).is_none() {
                obj["metadata"]["annotations"][LINEAGE] = json!(source_uid);
            }
        }
    }
    out
}

/// The status a backup kept (an Agent's: the host's discovered inventory
/// and conditions), written through the status subresource: a create
/// ignores it, and without it the agent service would rediscover the host.
async fn write_status(api: &Api<DynamicObject>, r: &ObjRef, obj: &Value) -> Result<(), KubeError> {
    let Some(status) = obj.get("status").filter(|s| s.as_object().is_some_and(|m| !m.is_empty())) else {
        return Ok(());
    };
    api.patch_status(&r.name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .map_err(request(format!("writing the status of {}", r.label())))?;
    Ok(())
}

/// An AgentMachine's Agent gets the label naming the AgentMachine's new UID
/// ([`crate::hosted::agent::relabel_agent`]).
async fn relabel_agent(ctx: &RestoreContext, created: &Value, backed_up: &Value) -> Result<(), KubeError> {
    if crate::hosted::agent::is_agent_machine(backed_up)
        && let Some(agent) = crate::hosted::agent::relabel_agent(&ctx.client, created, backed_up).await?
    {
        tracing::info!(agent = %agent, machine = %created["metadata"]["name"].as_str().unwrap_or_default(), "the Agent names the restored AgentMachine");
    }
    Ok(())
}

fn api_of(ctx: &RestoreContext, discovery: &Discovery, r: &ObjRef) -> Result<Api<DynamicObject>, StageError> {
    let obj = json!({"apiVersion": r.api_version, "kind": r.kind});
    let (resource, caps) = discovery
        .resolve_gvk(&gvk_of(&obj))
        .ok_or_else(|| StageError::Precondition(format!("the destination does not serve {}", r.kind)))?;
    Ok(match (&r.namespace, caps.scope) {
        (Some(ns), kube::discovery::Scope::Namespaced) => api_for(&ctx.client, &resource, ns),
        _ => Api::all_with(ctx.client.clone(), &resource),
    })
}

async fn get_value(api: &Api<DynamicObject>, name: &str, what: &str) -> Result<Option<Value>, KubeError> {
    match api.get_opt(name).await.map_err(request(format!("reading {what}")))? {
        Some(obj) => Ok(Some(serde_json::to_value(obj).map_err(|e| KubeError::Invalid(e.to_string()))?)),
        None => Ok(None),
    }
}

async fn run(ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Applied, StageFailure> {
    ensure_loaded(ctx).await?;
    let findings: Findings = ctx.findings.clone().unwrap_or_default();
    let mut applied: Applied = step.earlier_progress().unwrap_or_default();
    if applied.run_id.is_empty() {
        applied.run_id = step.history().map(|h| h.header.run_id.clone()).unwrap_or_default();
    }
    let run_id = applied.run_id.clone();
    let (ns, hcp_ns) = (ctx.inputs.namespace.clone(), ctx.inputs.hcp_namespace());

    // Leftover etcd volumes (only with --clean-leftovers; preflight refused
    // otherwise), unless `etcd-seed` replaced them with its own claims.
    let seeded = step.output_of::<super::etcd_seed::EtcdSeed>()?.is_some_and(|s| s.mode == super::etcd_seed::SeedMode::Volumes);
    if ctx.inputs.clean_leftovers && !seeded {
        let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &hcp_ns);
        for name in &findings.leftover_pvcs {
            if !applied.deleted_leftovers.contains(name) {
                applied.deleted_leftovers.push(name.clone());
                step.record(serde_json::to_value(&applied)?)?;
            }
            match pvcs.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(err) if is_not_found(&err) => {}
                Err(err) => return Err(request(format!("deleting leftover PVC {hcp_ns}/{name}"))(err).into()),
            }
            tracing::warn!(pvc = %name, namespace = %hcp_ns, "deleted a leftover etcd PVC (--clean-leftovers)");
        }
        crate::kube::wait_watching(&pvcs, crate::kube::Watched::default(), "leftover etcd PVCs to be gone", Duration::from_secs(120), Duration::from_millis(500), || async {
            for name in &findings.leftover_pvcs {
                if pvcs.get_opt(name).await.map_err(request(format!("reading PVC {hcp_ns}/{name}")))?.is_some() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })
        .await?;
    }

    // Namespaces: the cluster's, its control plane's, and any other its objects live in (an Agent inventory's).
    let mut wanted = vec![ns.clone(), hcp_ns.clone()];
    wanted.extend(super::preflight::other_namespaces(ctx.objects.as_deref().unwrap_or_default(), &ns, &hcp_ns));
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    for name in &wanted {
        if namespaces.get_opt(name).await.map_err(request(format!("reading Namespace {name}")))?.is_none() {
            if !applied.namespaces.contains(name) {
                applied.namespaces.push(name.clone());
                step.record(serde_json::to_value(&applied)?)?;
            }
            let body: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(json!({"metadata": {"name": name, "annotations": {RUN_ANNOTATION: run_id}}}))?;
            match namespaces.create(&PostParams::default(), &body).await {
                Ok(created) => {
                    if let Some(uid) = created.metadata.uid {
                        applied.namespace_uids.insert(name.clone(), uid);
                        step.record(serde_json::to_value(&applied)?)?;
                    }
                }
                Err(err) if crate::kube::is_conflict(&err) => {}
                Err(err) => return Err(request(format!("creating Namespace {name}"))(err).into()),
            }
        }
    }

    // Objects, in order.
    ensure_url(ctx, step).await?;
    let url = ctx.snapshot_url.clone().ok_or(StageError::Missing("the snapshot URL"))?;
    let from = format!("{}/{}", ctx.store.url(), ctx.inputs.layout().dir());
    let source_uid = super::verify::manifest(ctx, step).await?.cluster.uid;
    let objects = prepared(ctx.objects.as_deref().unwrap_or_default(), &url, &from, &source_uid);
    let groups: std::collections::BTreeSet<String> = objects.iter().map(|o| ObjRef::of(o).group().to_string()).collect();
    let discovery = crate::kube::discover(&ctx.client, |g| groups.contains(g), "discovering the destination's API groups").await?;
    let mut conflicts = Vec::new();
    for mut obj in objects {
        let r = ObjRef::of(&obj);
        let api = api_of(ctx, &discovery, &r)?;
        let existing = get_value(&api, &r.name, &describe(&obj)).await?;
        match existing {
            None => {
                applied.pending = Some(r.clone());
                step.record(serde_json::to_value(&applied)?)?;
                obj["metadata"]["annotations"][RUN_ANNOTATION] = json!(run_id);
                let body: DynamicObject = serde_json::from_value(obj.clone())?;
                let created = api
                    .create(&PostParams::default(), &body)
                    .await
                    .map_err(request(format!("creating {}", r.label())))?;
                write_status(&api, &r, &obj).await?;
                let created = serde_json::to_value(created)?;
                relabel_agent(ctx, &created, &obj).await?;
                applied.created.push(r.created_as(&created));
                applied.pending = None;
                step.record(serde_json::to_value(&applied)?)?;
            }
            Some(have) => {
                // what this run created, controllers may since have changed
                if applied.created.contains(&r) {
                    continue;
                }
                // created by the interrupted attempt: ours, whatever changed since
                let ours = applied.pending.as_ref() == Some(&r)
                    && created_by_run(have.pointer("/metadata/annotations").and_then(|a| a.get(RUN_ANNOTATION)).and_then(Value::as_str), &run_id);
                if applied.pending.as_ref() == Some(&r) && !ours {
                    // the interrupted create never happened: this one is someone else's
                    applied.pending = None;
                }
                match differs(&obj, &have) {
                    _ if ours => {
                        write_status(&api, &r, &obj).await?;
                        relabel_agent(ctx, &have, &obj).await?;
                        applied.created.push(r.created_as(&have));
                        applied.pending = None;
                        step.record(serde_json::to_value(&applied)?)?;
                    }
                    None => applied.identical += 1,
                    Some(path) if ctx.inputs.overwrite => {
                        // keep the destination's snapshot URL: it is immutable
                        if let Some(existing_url) = have.pointer(URL_POINTER) {
                            if let Some(storage) = obj.pointer_mut("/spec/etcd/managed/storage") {
                                storage["restoreSnapshotURL"] = existing_url.clone();
                            }
                        }
                        obj["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"].clone();
                        let body: DynamicObject = serde_json::from_value(obj.clone())?;
                        api.replace(&r.name, &PostParams::default(), &body)
                            .await
                            .map_err(request(format!("replacing {}", r.label())))?;
                        applied.replaced.push(format!("{} (differed at {path})", r.label()));
                        step.record(serde_json::to_value(&applied)?)?;
                    }
                    Some(path) => conflicts.push(format!("{} exists and differs from the backup at {path}", r.label())),
                }
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(StageError::Precondition(format!(
            "{} object(s) on the destination differ from the backup and were left alone:\n  - {}\nresolve them by hand, or resume with --overwrite to replace them with the backup's",
            conflicts.len(),
            conflicts.join("\n  - ")
        ))
        .into());
    }
    Ok(applied)
}

impl StageId for Apply {
    const NAME: &'static str = "apply";
    type Output = Applied;
}

#[async_trait]
impl Stage<RestoreContext> for Apply {
    fn summary(&self) -> &'static str {
        "create the namespaces, then secrets, HostedControlPlane, CAPI and platform objects, HostedCluster (with restoreSnapshotURL) and NodePools, in that order"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RestoreContext, _step: &Step<'_>) -> Vec<String> {
        let mut lines = Vec::new();
        if ctx.inputs.clean_leftovers {
            lines.push(format!("delete leftover data-etcd-* PVCs in {} (found by preflight)", ctx.inputs.hcp_namespace()));
        }
        lines.push(format!("create namespaces {} and {} if absent", ctx.inputs.namespace, ctx.inputs.hcp_namespace()));
        match ctx.objects.as_deref() {
            Some(objects) => {
                for obj in &prepared(objects, "<presigned URL>", "", "") {
                    lines.push(format!("create {}", describe(obj)));
                }
            }
            // the backup is written by this run (migrate): name the classes
            None => {
                for class in super::order::ORDER {
                    lines.push(format!("create the backup's {} ({})", class.name, class.reason));
                }
                lines.push(format!("{} is created with restoreSnapshotURL set to the presigned URL", ctx.inputs.hc_label()));
            }
        }
        lines
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let applied = run(ctx, step).await?;
        Ok(applied)
    }
    fn undoable(&self) -> bool {
        true
    }
    /// Deletes what this run created, newest first, without letting any
    /// controller clean up behind it: the replayed HostedCluster and
    /// NodePools stand for the cluster's real machines and cloud resources
    /// (the source's, still in use or needed by the next attempt), and
    /// deleting them unpaused would start HyperShift's and CAPI's clean-up
    /// of those. So the HostedCluster and NodePools it created are paused
    /// first and its control-plane namespace is scaled to zero (the CAPI
    /// manager with it); then the objects lose their finalizers (no
    /// controller is going to act on them) and are deleted, and the
    /// namespaces it created go once emptied.
    async fn undo(&self, ctx: &mut RestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(applied) = input.record::<Applied>()? else { return Ok(()) };
        let mut refs = applied.created.clone();
        refs.extend(applied.pending.clone());
        let groups: std::collections::BTreeSet<String> = refs.iter().map(|r| r.group().to_string()).collect();
        let discovery = crate::kube::discover(&ctx.client, |g| groups.contains(g), "discovering the destination's API groups").await?;
        let timeout = ctx.inputs.wait_timeout().min(Duration::from_secs(300));
        // whose each object is (the pending one has no UID yet: ours only if it carries this run's id)
        let mut owned = Vec::new();
        for r in &refs {
            let api = api_of(ctx, &discovery, r)?;
            owned.push(ownership(&api, &r.name, r.uid.as_deref(), &applied.run_id, &r.label()).await?);
        }
        // 1. no controller acts on what is deleted: clusters paused, hosts detached (metal3 deprovisions a deleted host otherwise)
        let mut paused = Vec::new();
        for (r, own) in refs.iter().zip(&owned) {
            let Owned::Ours(uid) = own else { continue };
            let held = if r.is_paused_kind() {
                pause_if_uid(&api_of(ctx, &discovery, r)?, &r.name, uid, &r.label()).await?
            } else if r.group() == BARE_METAL_HOST.group && r.kind == BARE_METAL_HOST.kind {
                annotate_if_uid(&api_of(ctx, &discovery, r)?, &r.name, uid, DETACHED, &r.label()).await?
            } else {
                false
            };
            if held {
                paused.push(r.label());
            }
        }
        // the control plane (and the CAPI manager) of the HostedCluster this run created
        let hcp_ns = ctx.inputs.hcp_namespace();
        let stilled = refs.iter().zip(&owned).any(|(r, own)| r.kind == HOSTED_CLUSTER.kind && r.group() == HOSTED_CLUSTER.group && !matches!(own, Owned::NotOurs(_)));
        let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
        let mut torn = TornDown::default();
        let mut quiet = |_: &TornDown| Ok(());
        if stilled && namespaces.get_opt(&hcp_ns).await.map_err(request(format!("reading Namespace {hcp_ns}")))?.is_some() {
            scale_to_zero(&ctx.client, &hcp_ns, &mut torn, &mut quiet).await?;
        }
        // 2. newest first: NodePools, HostedCluster, ..., secrets
        let mut unheld = Vec::new();
        // namespaces holding an object this run did not create are kept
        let mut foreign: Vec<String> = Vec::new();
        for (r, own) in refs.iter().zip(&owned).rev() {
            let uid = match own {
                Owned::Ours(uid) => uid,
                Owned::Gone => continue,
                Owned::NotOurs(uid) => {
                    left_alone(ctx, &r.label(), uid);
                    foreign.extend(r.namespace.clone());
                    continue;
                }
            };
            let api = api_of(ctx, &discovery, r)?;
            // no HostedCluster of this run, so no operator to clear what the
            // replay carried: an object nobody wrote to since its create
            // (same resourceVersion) loses its finalizers at once instead of
            // being waited for until the timeout
            let unreconciled = !stilled && untouched(&api, r).await?;
            if (stilled && exported_group(r.group())) || paused.contains(&r.label()) || unreconciled {
                // (a detached host's finalizer is metal3's: it lets go of it without deprovisioning)
                for finalizer in remove_finalizers_if_uid(&api, &r.name, uid, &r.label()).await? {
                    unheld.push(format!("{}: {finalizer}", r.label()));
                }
            }
            if let Removal::NotOurs { uid } = delete_if_uid(&api, &r.name, Some(uid), &r.label(), timeout).await? {
                left_alone(ctx, &r.label(), &uid);
                foreign.extend(r.namespace.clone());
            }
        }
        // 3. the namespaces this run created, emptied by their controllers
        for name in applied.namespaces.iter().rev() {
            let what = format!("Namespace {name}");
            if foreign.contains(name) {
                let warning = format!("{what} was created by this run but is kept: it holds an object this run did not create (see above)");
                tracing::warn!("{warning}");
                ctx.warnings.push(warning);
                continue;
            }
            let recorded = applied.namespace_uids.get(name).map(String::as_str);
            let uid = match ownership(&namespaces, name, recorded, &applied.run_id, &what).await? {
                Owned::Ours(uid) => uid,
                Owned::Gone => continue,
                Owned::NotOurs(uid) => {
                    left_alone(ctx, &what, &uid);
                    continue;
                }
            };
            if stilled && *name == hcp_ns {
                // what CAPI made from the replayed objects (MachineSets, Machines) holds it otherwise
                clear_control_plane_namespace(&ctx.client, name, &mut torn, &mut quiet).await?;
            }
            if let Removal::NotOurs { uid } = delete_namespace(&ctx.client, name, Some(&uid), Duration::from_secs(300)).await? {
                left_alone(ctx, &what, &uid);
            }
        }
        unheld.extend(torn.finalizers_removed);
        if !paused.is_empty() || !unheld.is_empty() {
            let note = format!(
                "the undo paused (clusters) or detached (hosts) {} before deleting, so no controller cleaned up or deprovisioned the machines, hosts or cloud resources they stand for{}",
                if paused.is_empty() { "nothing (already paused or gone)".to_string() } else { paused.join(", ") },
                if unheld.is_empty() { String::new() } else { format!("; finalizers it removed (their controllers were paused or scaled to zero, or never acted on the object): {}", unheld.join("; ")) }
            );
            tracing::info!("{note}");
            ctx.warnings.push(note);
        }
        Ok(())
    }
}

/// Whether the object `r` names is as this run created it: its
/// resourceVersion is still the one the create returned (no controller,
/// nor anyone, has written to it since).
async fn untouched(api: &Api<DynamicObject>, r: &ObjRef) -> Result<bool, KubeError> {
    let Some(recorded) = r.resource_version.as_deref() else { return Ok(false) };
    let live = get_value(api, &r.name, &r.label()).await?;
    Ok(live.as_ref().and_then(|o| o.pointer("/metadata/resourceVersion")).and_then(Value::as_str) == Some(recorded))
}

/// An undo found a same-named object it did not create: say so, touch nothing.
fn left_alone(ctx: &mut RestoreContext, what: &str, uid: &str) {
    let warning = format!("{what} was left alone: it is not the object this run created (its UID is {uid}), so the undo did not delete it");
    tracing::warn!("{warning}");
    ctx.warnings.push(warning);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_ignore_server_fields_and_the_url() {
        let want = json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
            "metadata": {"name": "demo", "namespace": "clusters", "labels": {"a": "b"}},
            "spec": {"etcd": {"managed": {"storage": {"restoreSnapshotURL": ["https://x?sig=1"]}}}, "release": {"image": "i"}}});
        let mut have = want.clone();
        have["metadata"]["uid"] = json!("u");
        have["metadata"]["resourceVersion"] = json!("9");
        have["metadata"]["annotations"] = json!({RESTORED_FROM: "s3://b/x"});
        have["spec"]["etcd"]["managed"]["storage"]["restoreSnapshotURL"] = json!(["https://x?sig=2"]);
        have["spec"]["defaulted"] = json!(true);
        have["status"] = json!({"conditions": []});
        assert_eq!(differs(&want, &have), None);
        have["spec"]["release"]["image"] = json!("other");
        assert_eq!(differs(&want, &have).as_deref(), Some("/spec/release/image"));
        have["metadata"]["labels"] = json!({});
        assert_eq!(differs(&want, &have).as_deref(), Some("/metadata/labels/a"));
    }

    #[test]
    fn prepared_objects_carry_the_url_and_lose_the_pause() {
        let objects = vec![
            json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                "metadata": {"name": "demo", "namespace": "clusters", "ownerReferences": [{"uid": "x"}]},
                "spec": {"pausedUntil": "2026-01-01T00:00:00Z", "etcd": {"managementType": "Managed", "managed": {"storage": {"type": "PersistentVolume"}}}}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-pull-secret", "namespace": "clusters"}}),
        ];
        let out = prepared(&objects, "https://s3/x?sig", "s3://b/clusters/demo/id", "uid-of-the-original");
        assert_eq!(out[0]["kind"], "Secret");
        let hc = &out[1];
        assert_eq!(hc.pointer(URL_POINTER), Some(&json!(["https://s3/x?sig"])));
        assert!(hc["spec"].get("pausedUntil").is_none());
        assert!(hc["metadata"].get("ownerReferences").is_none());
        assert_eq!(hc["metadata"]["annotations"][RESTORED_FROM], "s3://b/clusters/demo/id");
        assert_eq!(hc["metadata"]["annotations"][LINEAGE], "uid-of-the-original");
        // a copy of a copy keeps the original's lineage
        let mut again = objects.clone();
        again[0]["metadata"]["annotations"] = json!({LINEAGE: "older"});
        let out = prepared(&again, "u", "f", "uid-of-the-copy");
        assert_eq!(out[1]["metadata"]["annotations"][LINEAGE], "older");
        assert_eq!(hc["spec"]["etcd"]["managed"]["storage"]["type"], "PersistentVolume");
    }
}
