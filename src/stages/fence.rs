//! `hcp-dr fence` (`playbooks/fence.yaml`) stops the stale copy of a hosted
//! cluster on a management cluster that came back after the cluster was
//! restored elsewhere, and `hcp-dr fence --release`
//! (`playbooks/fence-release.yaml`) lets it run again once the operator has
//! decided that this copy is the one to keep.
//!
//! Fence, in order, each stage journaling what it changes first:
//! - `mark`: the HostedCluster gets the annotation [`FENCED`] (where the
//!   cluster runs now: backup, `cluster resume` and etcd repairs refuse it)
//!   and [`FENCE_STATE`], what was there before (pauses, replicas), so a
//!   release from any machine, without this journal, puts it back;
//! - `pause`: the HostedCluster and its NodePools paused until a far
//!   deadline (the operator reconciles nothing of this copy);
//! - `scale-to-zero`: every Deployment and StatefulSet of the HCP namespace
//!   (etcd, the API servers, the control-plane operator, the Cluster API
//!   manager and provider) scaled to 0, waiting until their pods are gone;
//! - `remove-routes`: the HCP namespace's Routes deleted, so this
//!   management cluster's external-dns has nothing to publish and withdraws
//!   only records it still owns.
//!
//! A fence that stops half-way is resumed (`--resume`), never undone by
//! itself: undoing it would start the stale copy again.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::archive::ManagementCluster;
use crate::archive::fence::{self as store_fence, Fence};
use crate::hosted::{FENCED, HOSTED_CLUSTER, HostedCluster, NODE_POOL, ROUTE};
use crate::kube::{api, get_json, is_not_found, list_json, merge_patch, request, set_paused_until};
use crate::pipeline::{Catalog, Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::deadline_pause::{DeadlinePause, PauseScope};
use crate::stages::StageError;
use crate::store::Store;

/// The annotation holding what the fence changed (JSON [`FenceState`]).
pub const FENCE_STATE: &str = "hcp-dr.openshift.io/fence-state";
/// How long a fence's pause lasts: far enough never to end by itself.
pub const FENCE_PAUSE_SECONDS: u64 = 10 * 366 * 24 * 3600;

/// The inputs of a fence or a release (journaled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FenceInputs {
    pub namespace: String,
    pub hosted_cluster: String,
    /// Where the live copy runs (fence), or this cluster (release).
    pub runs_on: ManagementCluster,
    /// The management cluster this run changes.
    pub here: ManagementCluster,
    pub pause_seconds: u64,
    pub wait_seconds: u64,
    /// The store whose fence was checked (and, with `claim_store`, rewritten).
    #[serde(default)]
    pub store: Option<String>,
    /// Release: rewrite the store fence to name this cluster.
    #[serde(default)]
    pub claim_store: bool,
}

pub struct FenceContext {
    pub client: kube::Client,
    pub inputs: FenceInputs,
    /// The store, for `claim-store`.
    pub store: Option<Box<dyn Store>>,
}

impl FenceContext {
    fn label(&self) -> String {
        format!("HostedCluster {}/{}", self.inputs.namespace, self.inputs.hosted_cluster)
    }
    fn hcp_namespace(&self) -> String {
        crate::hosted::hcp_namespace(&self.inputs.namespace, &self.inputs.hosted_cluster)
    }
    async fn hosted_cluster(&self) -> Result<Value, StageFailure> {
        let label = self.label();
        Ok(get_json(&api(&self.client, &HOSTED_CLUSTER, &self.inputs.namespace), &self.inputs.hosted_cluster, &label)
            .await?
            .ok_or_else(|| StageError::Precondition(format!("{label} not found")))?)
    }
}

impl PauseScope for FenceContext {
    fn client(&self) -> &kube::Client {
        &self.client
    }
    fn cluster(&self) -> (&str, &str) {
        (&self.inputs.namespace, &self.inputs.hosted_cluster)
    }
    fn pause_seconds(&self) -> u64 {
        self.inputs.pause_seconds
    }
}

/// What a fence changed, kept on the HostedCluster itself ([`FENCE_STATE`]):
/// what a release puts back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FenceState {
    pub runs_on: ManagementCluster,
    pub at: DateTime<Utc>,
    /// `(kind, name, pausedUntil before the fence)` of the HostedCluster and its NodePools.
    pub paused: Vec<(String, String, Option<String>)>,
    /// `(kind, name, replicas before the fence)` of the HCP namespace's workloads.
    pub replicas: Vec<(String, String, i32)>,
}

impl FenceState {
    /// The state a HostedCluster carries, if any (an unreadable one is an error:
    /// a release must not guess what to put back).
    pub fn of(hc: &Value) -> Result<Option<FenceState>, String> {
        match hc.pointer("/metadata/annotations").and_then(|a| a.get(FENCE_STATE)).and_then(Value::as_str) {
            Some(text) => serde_json::from_str(text).map(Some).map_err(|e| format!("annotation {FENCE_STATE} is unreadable ({e})")),
            None => Ok(None),
        }
    }
}

/// The replicas of every Deployment and StatefulSet of `ns`: `(kind, name, replicas)`.
async fn workloads(client: &kube::Client, ns: &str) -> Result<Vec<(String, String, i32)>, crate::kube::KubeError> {
    let mut out = Vec::new();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    for set in sets.list(&ListParams::default()).await.map_err(request(format!("listing StatefulSets in {ns}")))?.items {
        let replicas = set.spec.replicas.unwrap_or(1);
        out.push(("StatefulSet".to_string(), set.metadata.name.unwrap_or_default(), replicas));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for d in deployments.list(&ListParams::default()).await.map_err(request(format!("listing Deployments in {ns}")))?.items {
        let replicas = d.spec.replicas.unwrap_or(1);
        out.push(("Deployment".to_string(), d.metadata.name.unwrap_or_default(), replicas));
    }
    Ok(out)
}

/// Set the replicas of one workload; a workload gone since is skipped.
async fn scale(client: &kube::Client, ns: &str, kind: &str, name: &str, replicas: i32) -> Result<(), crate::kube::KubeError> {
    let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    let what = format!("scaling {kind} {ns}/{name} to {replicas}");
    let result = if kind == "StatefulSet" {
        Api::<StatefulSet>::namespaced(client.clone(), ns).patch(name, &PatchParams::default(), &patch).await.map(|_| ())
    } else {
        Api::<Deployment>::namespaced(client.clone(), ns).patch(name, &PatchParams::default(), &patch).await.map(|_| ())
    };
    match result {
        Ok(()) => Ok(()),
        Err(err) if is_not_found(&err) => {
            tracing::warn!("{kind} {ns}/{name} is gone; not scaling it");
            Ok(())
        }
        Err(err) => Err(request(what)(err)),
    }
}

/// `first` (what an earlier attempt or fence recorded, which stays what is
/// put back), then what `now` has that `first` does not, by `key`.
fn first_then_new<T, K: PartialEq>(first: Vec<T>, now: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let seen: Vec<K> = first.iter().map(&key).collect();
    let new: Vec<T> = now.into_iter().filter(|item| !seen.contains(&key(item))).collect();
    first.into_iter().chain(new).collect()
}

/// `(kind, name)` of a `(kind, name, value)` record.
fn kind_name<V>(item: &(String, String, V)) -> (String, String) {
    (item.0.clone(), item.1.clone())
}

/// What `mark` changed: the annotations before it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Marked {
    pub fenced_before: Option<String>,
    pub state_before: Option<String>,
    pub state: Option<FenceState>,
}

pub struct Mark;

impl StageId for Mark {
    const NAME: &'static str = "mark";
    type Output = Marked;
}

#[async_trait]
impl Stage<FenceContext> for Mark {
    fn summary(&self) -> &'static str {
        "annotate the HostedCluster with where the cluster runs now and with what the fence changes (pauses, replicas), so backup and resume refuse it and a release can put it back"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &FenceContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!("annotate {} with {FENCED}={} and {FENCE_STATE}", ctx.label(), ctx.inputs.runs_on.server)]
    }
    async fn run(&self, ctx: &mut FenceContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let hc = ctx.hosted_cluster().await?;
        let annotation = |key: &str| hc.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str).map(str::to_string);
        let mut record = Marked { fenced_before: annotation(FENCED), state_before: annotation(FENCE_STATE), state: None };
        if let Some(first) = step.earlier_progress::<Marked>() {
            record.fenced_before = first.fenced_before;
            record.state_before = first.state_before;
        }
        // Fenced again: what was there before the first fence stays the
        // thing to put back; workloads new since are added as they are.
        let earlier = FenceState::of(&hc).map_err(|e| StageError::Precondition(format!("{}: {e}; remove it by hand", ctx.label())))?;
        let (ns, name) = (ctx.inputs.namespace.clone(), ctx.inputs.hosted_cluster.clone());
        let mut paused: Vec<(String, String, Option<String>)> = vec![("HostedCluster".to_string(), name.clone(), hc["spec"]["pausedUntil"].as_str().map(str::to_string))];
        for np in list_json(&api(&ctx.client, &NODE_POOL, &ns), &ListParams::default(), "NodePools").await? {
            if np["spec"]["clusterName"].as_str() == Some(name.as_str()) {
                let np_name = np["metadata"]["name"].as_str().unwrap_or_default().to_string();
                paused.push(("NodePool".into(), np_name, np["spec"]["pausedUntil"].as_str().map(str::to_string)));
            }
        }
        let mut replicas = workloads(&ctx.client, &ctx.hcp_namespace()).await?;
        let mut at = Utc::now();
        if let Some(earlier) = earlier {
            at = earlier.at;
            paused = first_then_new(earlier.paused, paused, kind_name);
            replicas = first_then_new(earlier.replicas, replicas, kind_name);
        }
        let state = FenceState { runs_on: ctx.inputs.runs_on.clone(), at, paused, replicas };
        record.state = Some(state.clone());
        step.record(serde_json::to_value(&record)?)?;
        let text = serde_json::to_string(&state)?;
        merge_patch(
            &api(&ctx.client, &HOSTED_CLUSTER, &ns),
            &name,
            &json!({"metadata": {"annotations": {FENCED: ctx.inputs.runs_on.server, FENCE_STATE: text}}}),
            &format!("annotating {} as fenced", ctx.label()),
        )
        .await?;
        Ok(record)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut FenceContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = input.record::<Marked>()? else { return Ok(()) };
        let hcs = api(&ctx.client, &HOSTED_CLUSTER, &ctx.inputs.namespace);
        if get_json(&hcs, &ctx.inputs.hosted_cluster, &ctx.label()).await?.is_none() {
            return Ok(());
        }
        merge_patch(
            &hcs,
            &ctx.inputs.hosted_cluster,
            &json!({"metadata": {"annotations": {FENCED: record.fenced_before, FENCE_STATE: record.state_before}}}),
            &format!("putting back the annotations of {}", ctx.label()),
        )
        .await?;
        Ok(())
    }
}

/// What `scale-to-zero` changed: `(kind, name, replicas before)`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stopped {
    pub previous: Vec<(String, String, i32)>,
}

pub struct ScaleToZero;

/// The pods of `ns` that still run for a Deployment or StatefulSet (not a Job's).
async fn running_pods(client: &kube::Client, ns: &str) -> Result<Vec<String>, crate::kube::KubeError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let listed = pods.list(&ListParams::default()).await.map_err(request(format!("listing Pods in {ns}")))?.items;
    Ok(listed
        .into_iter()
        .filter(|p| {
            let owners = p.metadata.owner_references.as_deref().unwrap_or_default();
            owners.iter().any(|o| matches!(o.kind.as_str(), "StatefulSet" | "ReplicaSet" | "Deployment"))
        })
        .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")))
        .filter_map(|p| p.metadata.name)
        .collect())
}

impl StageId for ScaleToZero {
    const NAME: &'static str = "scale-to-zero";
    type Output = Stopped;
}

#[async_trait]
impl Stage<FenceContext> for ScaleToZero {
    fn summary(&self) -> &'static str {
        "scale every Deployment and StatefulSet of the HCP namespace to 0 (etcd, API servers, control-plane operator, Cluster API manager and provider) and wait until their pods are gone"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &FenceContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "scale every Deployment and StatefulSet in {} to 0 and wait up to {}s for their pods to go",
            ctx.hcp_namespace(),
            ctx.inputs.wait_seconds
        )]
    }
    async fn run(&self, ctx: &mut FenceContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let ns = ctx.hcp_namespace();
        let mut record = Stopped { previous: workloads(&ctx.client, &ns).await? };
        if let Some(first) = step.earlier_progress::<Stopped>() {
            record.previous = first_then_new(first.previous, record.previous, kind_name);
        }
        step.record(serde_json::to_value(&record)?)?;
        for (kind, name, _) in &record.previous {
            scale(&ctx.client, &ns, kind, name, 0).await?;
        }
        let what = format!("the pods of {ns} to go (etcd members and API servers of this copy)");
        let client = ctx.client.clone();
        let left = std::sync::Mutex::new(Vec::new());
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
        let waited = crate::kube::wait_watching(&pods, crate::kube::Watched::default(), &what, std::time::Duration::from_secs(ctx.inputs.wait_seconds), std::time::Duration::from_millis(500), || async {
            // A reconcile that began before the pause took effect (or an
            // operator that does not honour it) can scale a workload back
            // up: it is scaled to 0 again until nothing runs.
            for (kind, name, replicas) in workloads(&client, &ns).await? {
                if replicas > 0 {
                    tracing::warn!("{kind} {ns}/{name} was scaled back to {replicas} after the fence scaled it to 0; scaling it to 0 again");
                    scale(&client, &ns, &kind, &name, 0).await?;
                }
            }
            let running = running_pods(&client, &ns).await?;
            let done = running.is_empty();
            *left.lock().unwrap_or_else(|e| e.into_inner()) = running;
            Ok(done.then_some(()))
        })
        .await;
        if let Err(err) = waited {
            let left = left.lock().unwrap_or_else(|e| e.into_inner()).join(", ");
            return Err(StageError::Precondition(format!(
                "{err}; still running: {left}. The workloads are at 0: look at why these pods stay (kubectl -n {ns} describe pods), then `--resume` the fence"
            ))
            .into());
        }
        Ok(record)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut FenceContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = input.record::<Stopped>()? else { return Ok(()) };
        let ns = ctx.hcp_namespace();
        for (kind, name, replicas) in &record.previous {
            scale(&ctx.client, &ns, kind, name, *replicas).await?;
        }
        Ok(())
    }
}

/// What `remove-routes` deleted: each Route as it was (metadata trimmed).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RemovedRoutes {
    pub routes: Vec<Value>,
}

impl RemovedRoutes {
    pub fn names(&self) -> Vec<String> {
        self.routes.iter().filter_map(|r| r["metadata"]["name"].as_str().map(str::to_string)).collect()
    }
}

pub struct RemoveRoutes;

/// A Route as it can be created again: kind, name, labels, annotations, spec.
fn recreatable(route: &Value) -> Value {
    // apiVersion from the type, not the listed item: items of a list of a
    // built-in type (OpenShift serves Routes itself) carry no apiVersion
    json!({
        "apiVersion": ROUTE.api_resource().api_version,
        "kind": "Route",
        "metadata": {
            "name": route["metadata"]["name"],
            "namespace": route["metadata"]["namespace"],
            "labels": route["metadata"]["labels"],
            "annotations": route["metadata"]["annotations"],
        },
        "spec": route["spec"],
    })
}

impl StageId for RemoveRoutes {
    const NAME: &'static str = "remove-routes";
    type Output = RemovedRoutes;
}

#[async_trait]
impl Stage<FenceContext> for RemoveRoutes {
    fn summary(&self) -> &'static str {
        "delete the HCP namespace's Routes, so this management cluster's external-dns has nothing of the cluster to publish"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &FenceContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!("delete every Route in {} (journaled, recreated by --abort)", ctx.hcp_namespace())]
    }
    async fn run(&self, ctx: &mut FenceContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let ns = ctx.hcp_namespace();
        let routes = api(&ctx.client, &ROUTE, &ns);
        let listed = match routes.list(&ListParams::default()).await {
            Ok(list) => list.items.into_iter().map(|r| serde_json::to_value(r).unwrap_or_default()).collect(),
            // no Route API (not OpenShift): nothing to remove
            Err(err) if is_not_found(&err) => Vec::new(),
            Err(err) => return Err(request(format!("listing Routes in {ns}"))(err).into()),
        };
        let mut record = RemovedRoutes { routes: listed.iter().map(recreatable).collect() };
        if let Some(first) = step.earlier_progress::<RemovedRoutes>() {
            record.routes = first_then_new(first.routes, record.routes, |r| r["metadata"]["name"].as_str().map(str::to_string));
        }
        step.record(serde_json::to_value(&record)?)?;
        for name in record.names() {
            match routes.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(route = %format!("{ns}/{name}"), "Route deleted"),
                Err(err) if is_not_found(&err) => {}
                Err(err) => return Err(request(format!("deleting Route {ns}/{name}"))(err).into()),
            }
        }
        Ok(record)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut FenceContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = input.record::<RemovedRoutes>()? else { return Ok(()) };
        let ns = ctx.hcp_namespace();
        let routes = api(&ctx.client, &ROUTE, &ns);
        for route in &record.routes {
            let name = route["metadata"]["name"].as_str().unwrap_or_default();
            if get_json(&routes, name, &format!("Route {ns}/{name}")).await?.is_some() {
                continue;
            }
            let body = serde_json::from_value(route.clone())?;
            routes.create(&PostParams::default(), &body).await.map_err(request(format!("recreating Route {ns}/{name}")))?;
        }
        Ok(())
    }
}

/// What `claim-store` replaced: the store fence before it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Claimed {
    pub previous: Option<Fence>,
    pub written: Option<Fence>,
}

pub struct ClaimStore;

impl StageId for ClaimStore {
    const NAME: &'static str = "claim-store";
    type Output = Claimed;
}

#[async_trait]
impl Stage<FenceContext> for ClaimStore {
    fn summary(&self) -> &'static str {
        "with --claim-store: rewrite the store fence to name this management cluster (the copy kept), so its backups are accepted again"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &FenceContext, _step: &Step<'_>) -> Vec<String> {
        if ctx.inputs.claim_store {
            vec![format!("write the store fence of {} naming {}", ctx.label(), ctx.inputs.here.describe())]
        } else {
            vec!["nothing (no --claim-store)".into()]
        }
    }
    async fn run(&self, ctx: &mut FenceContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        if !ctx.inputs.claim_store {
            return Ok(Claimed::default());
        }
        let store = ctx.store.as_deref().ok_or(StageError::Missing("the store (--claim-store needs --store)"))?;
        let (ns, name) = (&ctx.inputs.namespace, &ctx.inputs.hosted_cluster);
        let mut previous = store_fence::read(store, ns, name).await.map_err(|e| StageError::Precondition(e.to_string()))?;
        if let Some(first) = step.earlier_progress::<Claimed>() {
            previous = first.previous;
        }
        let hc = ctx.hosted_cluster().await?;
        let written = Fence {
            format_version: store_fence::FENCE_VERSION,
            namespace: ns.clone(),
            hosted_cluster: name.clone(),
            runs_on: ctx.inputs.here.clone(),
            hosted_cluster_uid: hc["metadata"]["uid"].as_str().map(str::to_string),
            backup_id: previous.as_ref().map(|f| f.backup_id.clone()).unwrap_or_default(),
            backup_taken_on: previous.as_ref().and_then(|f| f.backup_taken_on.clone()),
            by: "fence --release --claim-store".into(),
            at: Utc::now(),
            tool_version: env!("CARGO_PKG_VERSION").into(),
        };
        let record = Claimed { previous, written: Some(written.clone()) };
        step.record(serde_json::to_value(&record)?)?;
        store_fence::write(store, &written).await.map_err(|e| StageError::Precondition(format!("writing the store fence: {e}")))?;
        Ok(record)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut FenceContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = input.record::<Claimed>()? else { return Ok(()) };
        let (Some(previous), Some(store)) = (record.previous, ctx.store.as_deref()) else { return Ok(()) };
        // only the fence this run wrote is replaced
        let now = store_fence::read(store, &ctx.inputs.namespace, &ctx.inputs.hosted_cluster).await.map_err(|e| StageError::Precondition(e.to_string()))?;
        if now.is_some() && now != record.written {
            tracing::warn!("the store fence was rewritten since this run; leaving it");
            return Ok(());
        }
        store_fence::write(store, &previous).await.map_err(|e| StageError::Precondition(format!("putting the store fence back: {e}")))?;
        Ok(())
    }
}

/// What `unfence` did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Unfenced {
    /// `kind name -> replicas` scaled back.
    pub scaled: Vec<(String, String, i32)>,
    /// `kind name -> pausedUntil` put back.
    pub unpaused: Vec<(String, String, Option<String>)>,
    /// The copy was not fenced (nothing to do).
    #[serde(default)]
    pub was_not_fenced: bool,
}

pub struct Unfence;

impl StageId for Unfence {
    const NAME: &'static str = "unfence";
    type Output = Unfenced;
}

#[async_trait]
impl Stage<FenceContext> for Unfence {
    fn summary(&self) -> &'static str {
        "scale the HCP namespace's workloads back to what the fence recorded, put the pauses back, then remove the fence annotations (not undoable: fence again)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &FenceContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "scale {} back to the replicas in {FENCE_STATE}, put back the pauses of {} and its NodePools, remove {FENCED} and {FENCE_STATE}",
            ctx.hcp_namespace(),
            ctx.label()
        )]
    }
    async fn run(&self, ctx: &mut FenceContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let hc = ctx.hosted_cluster().await?;
        if HostedCluster(hc.clone()).fenced().is_none() {
            return Ok(Unfenced { was_not_fenced: true, ..Default::default() });
        }
        let state = FenceState::of(&hc).map_err(|e| StageError::Precondition(format!("{}: {e}", ctx.label())))?;
        let (ns, hcp_ns) = (ctx.inputs.namespace.clone(), ctx.hcp_namespace());
        let mut out = Unfenced::default();
        match &state {
            Some(state) => {
                for (kind, name, replicas) in &state.replicas {
                    scale(&ctx.client, &hcp_ns, kind, name, *replicas).await?;
                    out.scaled.push((kind.clone(), name.clone(), *replicas));
                    step.record(serde_json::to_value(&out)?)?;
                }
                for (kind, name, previous) in &state.paused {
                    let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
                    if get_json(&api(&ctx.client, gvk, &ns), name, &format!("{kind} {ns}/{name}")).await?.is_none() {
                        continue;
                    }
                    set_paused_until(&ctx.client, gvk, &ns, name, previous.as_deref()).await?;
                    out.unpaused.push((kind.clone(), name.clone(), previous.clone()));
                    step.record(serde_json::to_value(&out)?)?;
                }
            }
            None => {
                // marked by hand or by an interrupted fence before its state:
                // lift the pause and let the operator scale the copy
                tracing::warn!("{} carries no {FENCE_STATE}: lifting its pause; the operator scales its control plane back", ctx.label());
                set_paused_until(&ctx.client, &HOSTED_CLUSTER, &ns, &ctx.inputs.hosted_cluster, None).await?;
                out.unpaused.push(("HostedCluster".into(), ctx.inputs.hosted_cluster.clone(), None));
            }
        }
        merge_patch(
            &api(&ctx.client, &HOSTED_CLUSTER, &ns),
            &ctx.inputs.hosted_cluster,
            &json!({"metadata": {"annotations": {FENCED: null, FENCE_STATE: null}}}),
            &format!("removing the fence annotations of {}", ctx.label()),
        )
        .await?;
        Ok(out)
    }
}

/// Every fence stage, by name.
pub fn fence_catalog() -> Catalog<FenceContext> {
    Catalog::new("fence")
        .with(Mark)
        .with(DeadlinePause)
        .after(&[Mark::NAME])
        .with(ScaleToZero)
        .after(&[DeadlinePause::NAME])
        .with(RemoveRoutes)
        .after(&[ScaleToZero::NAME])
}

/// Every release stage, by name.
pub fn release_catalog() -> Catalog<FenceContext> {
    Catalog::new("fence-release").with(ClaimStore).with(Unfence).after(&[ClaimStore::NAME])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_state_round_trips_and_an_unreadable_one_is_an_error() {
        let state = FenceState {
            runs_on: ManagementCluster { server: "https://b:6443".into(), kube_system_uid: Some("uid-b".into()) },
            at: "2026-11-24T10:00:00Z".parse().unwrap(),
            paused: vec![("HostedCluster".into(), "demo".into(), None)],
            replicas: vec![("StatefulSet".into(), "etcd".into(), 3)],
        };
        let hc = json!({"metadata": {"annotations": {FENCE_STATE: serde_json::to_string(&state).unwrap()}}});
        assert_eq!(FenceState::of(&hc).unwrap(), Some(state));
        assert_eq!(FenceState::of(&json!({"metadata": {}})).unwrap(), None);
        let bad = json!({"metadata": {"annotations": {FENCE_STATE: "{not json"}}});
        assert!(FenceState::of(&bad).unwrap_err().contains(FENCE_STATE));
    }

    #[test]
    fn routes_are_kept_as_they_can_be_created_again() {
        let live = json!({
            "apiVersion": "route.openshift.io/v1", "kind": "Route",
            "metadata": {"name": "oauth", "namespace": "clusters-demo", "uid": "u", "resourceVersion": "7", "labels": {"a": "b"}},
            "spec": {"host": "oauth.demo.example.com", "to": {"kind": "Service", "name": "oauth-openshift"}},
            "status": {"ingress": []},
        });
        let kept = recreatable(&live);
        assert_eq!(kept["metadata"]["name"], "oauth");
        assert!(kept["metadata"].get("uid").is_none() && kept["metadata"].get("resourceVersion").is_none());
        assert!(kept.get("status").is_none());
        assert_eq!(kept["spec"], live["spec"]);
        let mut bare = live.clone();
        bare.as_object_mut().unwrap().remove("apiVersion");
        assert_eq!(recreatable(&bare)["apiVersion"], "route.openshift.io/v1", "a list item without apiVersion still recreates");
    }

    #[test]
    fn what_was_recorded_first_stays_and_only_new_items_are_added() {
        let first = vec![("Deployment".to_string(), "a".to_string(), 3), ("StatefulSet".to_string(), "etcd".to_string(), 3)];
        let now = vec![("Deployment".to_string(), "a".to_string(), 0), ("Deployment".to_string(), "b".to_string(), 2)];
        assert_eq!(
            first_then_new(first, now, kind_name),
            vec![("Deployment".to_string(), "a".to_string(), 3), ("StatefulSet".to_string(), "etcd".to_string(), 3), ("Deployment".to_string(), "b".to_string(), 2)]
        );
    }
}
