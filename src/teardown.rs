//! Deleting what hcp-dr created or moved away: one object at a time, waiting
//! until it is really gone, and clearing finalizers only when their
//! controller is not going to (it was scaled away, or the object is ours).
//!
//! The ordered deletion of a whole hosted cluster ([`destroy`]: the HCP
//! namespace scaled to zero, then NodePools, CAPI and platform objects, the
//! HostedControlPlane, the HCP namespace, the HostedCluster and the Secrets
//! only it used) lives here too, once: migrate's `teardown` stage, `cluster
//! destroy`'s, a drill's `teardown` ([`destroy_paused`]) and reconcile's undo
//! of a HostedCluster it created all call it. This module sits below the
//! stages and the operations: it uses `crate::kube` and `crate::hosted` only.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::discovery::{Scope, verbs};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::hosted::{HOSTED_CLUSTER, HOSTED_CONTROL_PLANE, NODE_POOL, RUN_ANNOTATION, exported_group};
use crate::kube::{KubeError, api, api_for, get_json, is_conflict, is_invalid, is_not_found, list_json, request};

/// Why an ordered deletion stopped: a request to the cluster, or the
/// caller's [`Record`] (its journal). The same boxed error a stage returns.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// What a conditional deletion found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// It was there and is gone now.
    Deleted,
    /// It was already gone.
    Absent,
    /// An object of that name exists with another UID: not the one the run
    /// created, so it was left alone.
    NotOurs { uid: String },
}

/// Delete `name` and wait until it is gone. Finalizers still holding it after
/// `timeout` are removed (their controller is not coming back for it), then
/// it is waited for once more; an object still there is an error.
pub async fn delete_and_wait<K>(api: &Api<K>, name: &str, what: &str, timeout: Duration) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    delete_if_uid(api, name, None, what, timeout).await.map(|_| ())
}

/// [`delete_and_wait`] conditional on the object's UID: every request
/// (the delete, and the finalizer removal) carries `uid` as a precondition,
/// so only the object a run created can be removed, never a same-named one
/// made since by someone else (`NotOurs`). `uid` None: whatever is there.
pub async fn delete_if_uid<K>(api: &Api<K>, name: &str, uid: Option<&str>, what: &str, timeout: Duration) -> Result<Removal, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    match api.delete(name, &delete_params(uid)).await {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => return Ok(Removal::Absent),
        // 409: another object holds the name, or ours is already being
        // deleted (a terminating namespace answers a second delete so)
        Err(err) if uid.is_some() && is_conflict(&err) => match not_ours(api, name, what).await? {
            Removal::NotOurs { uid: live } if Some(live.as_str()) == uid => {}
            other => return Ok(other),
        },
        Err(err) => return Err(request(format!("deleting {what}"))(err)),
    }
    if wait_gone_or_replaced(api, name, uid, what, timeout).await? {
        return Ok(Removal::Deleted);
    }
    tracing::warn!(object = %what, "still present after {}s: removing its finalizers", timeout.as_secs());
    let patch = match uid {
        // a patch that names the UID fails on any other object (uid is immutable)
        Some(uid) => json!({"metadata": {"uid": uid, "finalizers": null}}),
        None => json!({"metadata": {"finalizers": null}}),
    };
    match api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => return Ok(Removal::Deleted),
        Err(err) if uid.is_some() && (is_conflict(&err) || is_invalid(&err)) => return Ok(Removal::Deleted),
        Err(err) => return Err(request(format!("removing the finalizers of {what}"))(err)),
    }
    if wait_gone_or_replaced(api, name, uid, what, Duration::from_secs(60)).await? {
        Ok(Removal::Deleted)
    } else {
        Err(KubeError::Timeout {
            what: format!("{what} to be deleted"),
            seconds: 60,
        })
    }
}

/// A background delete, conditional on `uid` when given.
fn delete_params(uid: Option<&str>) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: uid.map(|uid| Preconditions { uid: Some(uid.to_string()), resource_version: None }),
        ..DeleteParams::default()
    }
}

/// Delete Namespace `name` (only the one with `uid`, when given) and wait
/// until the namespace controller has emptied and removed it. Its finalizer
/// is `spec.finalizers: [kubernetes]`, which no patch of the object can
/// lift, so none is attempted: a namespace still Terminating after
/// `timeout` is an error that says what holds it (its
/// `NamespaceContentRemaining` and `NamespaceFinalizersRemaining`
/// conditions). A second delete of a Terminating namespace is answered 409:
/// that is the deletion already under way, and it is waited for.
pub async fn delete_namespace(client: &kube::Client, name: &str, uid: Option<&str>, timeout: Duration) -> Result<Removal, KubeError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let what = format!("Namespace {name}");
    match api.delete(name, &delete_params(uid)).await {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => return Ok(Removal::Absent),
        Err(err) if is_conflict(&err) => match api.get_opt(name).await.map_err(request(format!("reading {what}")))? {
            None => return Ok(Removal::Absent),
            Some(live) if uid.is_some() && live.metadata.uid.as_deref() != uid => {
                return Ok(Removal::NotOurs { uid: live.metadata.uid.unwrap_or_default() });
            }
            Some(live) if live.metadata.deletion_timestamp.is_some() => {}
            Some(_) => return Err(request(format!("deleting {what}"))(err)),
        },
        Err(err) => return Err(request(format!("deleting {what}"))(err)),
    }
    if wait_gone_or_replaced(&api, name, uid, &what, timeout).await? {
        return Ok(Removal::Deleted);
    }
    let held = match api.get_opt(name).await.map_err(request(format!("reading {what}")))? {
        None => return Ok(Removal::Deleted),
        Some(ns) => terminating_because(&ns),
    };
    Err(KubeError::Timeout {
        what: format!(
            "{what} to be deleted: it is still Terminating{held}. The namespace controller removes it once its content is gone; see what is left with `kubectl api-resources --verbs=list --namespaced -o name | xargs -n1 kubectl get -n {name} --ignore-not-found`, then resume"
        ),
        seconds: timeout.as_secs(),
    })
}

/// What a Terminating namespace's conditions say holds it (empty when they
/// say nothing): `: <message>; <message>`.
fn terminating_because(ns: &Namespace) -> String {
    let messages: Vec<String> = ns
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.status == "True" && matches!(c.type_.as_str(), "NamespaceContentRemaining" | "NamespaceFinalizersRemaining" | "NamespaceDeletionContentFailure" | "NamespaceDeletionDiscoveryFailure"))
        .filter_map(|c| c.message.clone())
        .collect();
    if messages.is_empty() { String::new() } else { format!(": {}", messages.join("; ")) }
}

/// Whether an object was created by the run `run_id`: its
/// [`RUN_ANNOTATION`] says so. A journal of an older hcp-dr has no run id,
/// and the name is all it had.
pub fn created_by_run(annotation: Option<&str>, run_id: &str) -> bool {
    run_id.is_empty() || annotation == Some(run_id)
}

/// Whose the object at `name` is, for an undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// The run's own object, with its UID.
    Ours(String),
    /// Nothing is there.
    Gone,
    /// Another object of that name (its UID).
    NotOurs(String),
}

/// Whether the object at `name` is the one a run created: the UID the run
/// journaled when it has one, else (a create interrupted before its UID was
/// journaled) the run's annotation on the live object.
pub async fn ownership<K>(api: &Api<K>, name: &str, recorded: Option<&str>, run_id: &str, what: &str) -> Result<Owned, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let Some(live) = api.get_opt(name).await.map_err(request(format!("reading {what}")))? else {
        return Ok(Owned::Gone);
    };
    let meta = live.meta();
    let uid = meta.uid.clone().unwrap_or_default();
    let ours = match recorded {
        Some(recorded) => recorded == uid,
        None => created_by_run(meta.annotations.as_ref().and_then(|a| a.get(RUN_ANNOTATION)).map(String::as_str), run_id),
    };
    Ok(if ours { Owned::Ours(uid) } else { Owned::NotOurs(uid) })
}

/// Delete what a run created under `name` ([`ownership`]), conditional on its
/// UID ([`delete_if_uid`]); anything else there is left alone (`NotOurs`).
pub async fn delete_created<K>(api: &Api<K>, name: &str, recorded: Option<&str>, run_id: &str, what: &str, timeout: Duration) -> Result<Removal, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let uid = match recorded {
        // the precondition decides: no read needed
        Some(uid) => uid.to_string(),
        None => match ownership(api, name, None, run_id, what).await? {
            Owned::Ours(uid) => uid,
            Owned::Gone => return Ok(Removal::Absent),
            Owned::NotOurs(uid) => return Ok(Removal::NotOurs { uid }),
        },
    };
    delete_if_uid(api, name, Some(&uid), what, timeout).await
}

/// The object at `name` is not the one a run created: say which it is.
async fn not_ours<K>(api: &Api<K>, name: &str, what: &str) -> Result<Removal, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    match api.get_opt(name).await.map_err(request(format!("reading {what}")))? {
        Some(obj) => Ok(Removal::NotOurs {
            uid: obj.meta().uid.clone().unwrap_or_default(),
        }),
        None => Ok(Removal::Absent),
    }
}

/// Wait until the object with `uid` (any, when None) no longer exists under
/// `name`; true when gone, false after `timeout`.
/// How often a wait for a deletion says what it waits for.
const SAY_EVERY: Duration = Duration::from_secs(30);

/// What a deletion still waits for, and how to go on now (pure): `what`
/// is `Kind namespace/name` (or `Kind name`).
pub fn still_held(what: &str, meta: &kube::api::ObjectMeta, waited: Duration, timeout: Duration) -> String {
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let (kind, rest) = what.split_once(' ').unwrap_or((what, ""));
    let (ns, name) = rest.rsplit_once('/').map(|(n, m)| (n, m)).unwrap_or(("", rest));
    let namespace = if ns.is_empty() { String::new() } else { format!(" -n {ns}") };
    if finalizers.is_empty() {
        return format!("{what} is still being deleted ({}s of {}s): its controller or garbage collector has not finished; see kubectl{namespace} describe {kind} {name}", waited.as_secs(), timeout.as_secs());
    }
    format!(
        "{what} is still held by finalizer(s) {} (waited {}s of at most {}s for their controller). If no controller will remove them, go on now: kubectl{namespace} patch {kind} {name} --type merge -p '{{\"metadata\":{{\"finalizers\":null}}}}'",
        finalizers.join(", "),
        waited.as_secs(),
        timeout.as_secs()
    )
}

async fn wait_gone_or_replaced<K>(api: &Api<K>, name: &str, uid: Option<&str>, what: &str, timeout: Duration) -> Result<bool, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let started = std::time::Instant::now();
    let said = std::sync::Mutex::new(started);
    let waited = crate::kube::wait_watching(api, crate::kube::Watched::named(name), &format!("{what} to be deleted"), timeout, Duration::from_millis(500), || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(Some(())),
            Ok(Some(obj)) if uid.is_some() && obj.meta().uid.as_deref() != uid => Ok(Some(())),
            Ok(Some(obj)) => {
                // whatever has to wait says what for, every 30 s
                if let Ok(mut last) = said.lock()
                    && last.elapsed() >= SAY_EVERY
                {
                    tracing::warn!("{}", still_held(what, obj.meta(), started.elapsed(), timeout));
                    *last = std::time::Instant::now();
                }
                Ok(None)
            }
            Err(err) => Err(request(format!("reading {what}"))(err)),
        }
    })
    .await;
    match waited {
        Ok(()) => Ok(true),
        Err(KubeError::Timeout { .. }) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Wait until `name`, if it is being deleted, is gone: a claim an
/// interrupted run deleted may be held a while by its pod's protection, and
/// a create of the same name would meet it (409) and use it. An object not
/// being deleted, or none, is left as it is.
pub async fn await_deletion<K>(api: &Api<K>, name: &str, what: &str, timeout: Duration) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let Some(obj) = api.get_opt(name).await.map_err(request(format!("reading {what}")))? else { return Ok(()) };
    if obj.meta().deletion_timestamp.is_none() {
        return Ok(());
    }
    tracing::info!(object = %what, "still being deleted (an interrupted run's): waiting for it before making a new one");
    let uid = obj.meta().uid.clone();
    if wait_gone_or_replaced(api, name, uid.as_deref(), what, timeout).await? {
        Ok(())
    } else {
        Err(KubeError::Timeout { what: format!("{what}, left by an interrupted run, to be deleted"), seconds: timeout.as_secs() })
    }
}

/// Clear `metadata.finalizers` (a missing object is fine).
pub async fn remove_finalizers<K>(api: &Api<K>, name: &str, what: &str) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(request(format!("removing the finalizers of {what}"))(err)),
    }
}

/// Pause the HostedCluster or NodePool with `uid` at `name` for good
/// (`spec.pausedUntil: "true"`), so neither HyperShift nor CAPI acts on its
/// deletion: an undo removes the object, never the machines and cloud
/// resources it stands for. The patch names the UID, so it fails on any
/// other object of that name (false: gone, or not that object).
pub async fn pause_if_uid(api: &Api<DynamicObject>, name: &str, uid: &str, what: &str) -> Result<bool, KubeError> {
    let patch = json!({"metadata": {"uid": uid}, "spec": {"pausedUntil": "true"}});
    match api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
        Ok(_) => Ok(true),
        Err(err) if is_not_found(&err) || is_conflict(&err) || is_invalid(&err) => Ok(false),
        Err(err) => Err(request(format!("pausing {what}"))(err)),
    }
}

/// Set annotation `key` (empty value) on the object with `uid` at `name`:
/// a BareMetalHost's `baremetalhost.metal3.io/detached`, so metal3 neither
/// powers it nor deprovisions it when it is deleted. False: gone, or not
/// that object.
pub async fn annotate_if_uid(api: &Api<DynamicObject>, name: &str, uid: &str, key: &str, what: &str) -> Result<bool, KubeError> {
    let patch = json!({"metadata": {"uid": uid, "annotations": {key: ""}}});
    match api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
        Ok(_) => Ok(true),
        Err(err) if is_not_found(&err) || is_conflict(&err) || is_invalid(&err) => Ok(false),
        Err(err) => Err(request(format!("annotating {what} {key}"))(err)),
    }
}

/// Clear the finalizers of the object with `uid` at `name`, whose
/// controller was paused or scaled away; returns those it held (none when
/// the object is gone or another one holds the name).
pub async fn remove_finalizers_if_uid(api: &Api<DynamicObject>, name: &str, uid: &str, what: &str) -> Result<Vec<String>, KubeError> {
    let Some(live) = get_json(api, name, what).await? else { return Ok(Vec::new()) };
    if live["metadata"]["uid"].as_str() != Some(uid) {
        return Ok(Vec::new());
    }
    let held: Vec<String> = live["metadata"]["finalizers"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
    if held.is_empty() {
        return Ok(held);
    }
    let patch = json!({"metadata": {"uid": uid, "finalizers": null}});
    match api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
        Ok(_) => Ok(held),
        Err(err) if is_not_found(&err) || is_conflict(&err) || is_invalid(&err) => Ok(Vec::new()),
        Err(err) => Err(request(format!("removing the finalizers of {what}"))(err)),
    }
}

/// Wait until `name` no longer exists.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, what: &str, timeout: Duration) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    crate::kube::wait_watching(api, crate::kube::Watched::named(name), &format!("{what} to be deleted"), timeout, Duration::from_millis(500), || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(Some(())),
            Ok(Some(_)) => Ok(None),
            Err(err) => Err(request(format!("reading {what}"))(err)),
        }
    })
    .await
}

#[cfg(test)]
mod wait_tests {
    use super::*;

    #[test]
    fn a_held_deletion_says_what_holds_it_and_how_to_go_on() {
        let meta = kube::api::ObjectMeta { finalizers: Some(vec!["hypershift.openshift.io/finalizer".into()]), ..Default::default() };
        let said = still_held("HostedControlPlane clusters-demo/demo", &meta, Duration::from_secs(30), Duration::from_secs(300));
        assert!(said.contains("finalizer(s) hypershift.openshift.io/finalizer (waited 30s of at most 300s"), "{said}");
        assert!(said.contains("kubectl -n clusters-demo patch HostedControlPlane demo --type merge -p '{\"metadata\":{\"finalizers\":null}}'"), "{said}");
        let said = still_held("Namespace clusters-demo", &kube::api::ObjectMeta::default(), Duration::from_secs(60), Duration::from_secs(300));
        assert!(said.contains("kubectl describe Namespace clusters-demo"), "{said}");
    }
}

// ---------------------------------------------------------------------------
// The ordered deletion of a hosted cluster.

/// What teardown did (journaled as it goes).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TornDown {
    pub scaled_to_zero: Vec<String>,
    pub etcd_pvc_retention: Option<String>,
    pub deleted: Vec<String>,
    /// The Secrets the HostedCluster used (read before it was deleted, so
    /// a resumed teardown still knows them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The finalizers hcp-dr removed itself, `<object>: <finalizer>, ...`
    /// (journaled before they were): the source is paused, and its operator
    /// perhaps down, so no controller is going to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers_removed: Vec<String>,
}

impl TornDown {
    /// Notes `what` as deleted (once, however often a resumed teardown
    /// gets there) and journals it.
    pub fn record_deleted(&mut self, what: String, record: Record<'_>) -> Result<(), Failure> {
        if !self.deleted.contains(&what) {
            self.deleted.push(what);
        }
        record(self)
    }
}

const WAIT: Duration = Duration::from_secs(120);

/// Rank of a CAPI or platform kind in the deletion order.
fn deletion_rank(group: &str, kind: &str) -> usize {
    match (group, kind) {
        ("cluster.x-k8s.io", "Machine") => 0,
        ("cluster.x-k8s.io", "MachineSet") => 1,
        ("cluster.x-k8s.io", "MachineDeployment") => 2,
        ("cluster.x-k8s.io", "Cluster") => 3,
        (_, k) if k.ends_with("Machine") => 4,
        (_, k) if k.ends_with("Template") => 5,
        _ => 6,
    }
}

/// Scale every StatefulSet and Deployment of namespace `ns` to zero (the
/// control plane and, with it, the CAPI manager).
pub async fn scale_to_zero(client: &kube::Client, ns: &str, out: &mut TornDown, record: Record<'_>) -> Result<(), Failure> {
    let ns = ns.to_string();
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    for set in sts.list(&ListParams::default()).await.map_err(request(format!("listing StatefulSets in {ns}")))?.items {
        let name = set.metadata.name.clone().unwrap_or_default();
        if name == crate::hosted::ETCD_STATEFULSET {
            out.etcd_pvc_retention = set
                .spec
                .persistent_volume_claim_retention_policy
                .as_ref()
                .and_then(|p| p.when_scaled.clone())
                .or(Some("Retain".into()));
        }
        sts.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}})))
            .await
            .map_err(request(format!("scaling StatefulSet {ns}/{name} to 0")))?;
        out.scaled_to_zero.push(format!("StatefulSet {name}"));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    for d in deployments.list(&ListParams::default()).await.map_err(request(format!("listing Deployments in {ns}")))?.items {
        let name = d.metadata.name.clone().unwrap_or_default();
        deployments
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}})))
            .await
            .map_err(request(format!("scaling Deployment {ns}/{name} to 0")))?;
        out.scaled_to_zero.push(format!("Deployment {name}"));
    }
    record(out)
}

/// Journals what was done so far (or nothing, outside a pipeline).
pub type Record<'a> = &'a mut (dyn FnMut(&TornDown) -> Result<(), Failure> + Send);

async fn gone(api: &Api<DynamicObject>, name: &str, what: &str, out: &mut TornDown, record: Record<'_>) -> Result<(), Failure> {
    if let Some(obj) = get_json(api, name, what).await? {
        let finalizers: Vec<&str> = obj["metadata"]["finalizers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let line = format!("{what}: {}", finalizers.join(", "));
        if !finalizers.is_empty() && !out.finalizers_removed.contains(&line) {
            out.finalizers_removed.push(line);
            record(out)?;
        }
    }
    remove_finalizers(api, name, what).await?;
    delete_and_wait(api, name, what, WAIT).await?;
    out.record_deleted(what.to_string(), record)
}

/// Scale the HCP namespace to zero, then remove finalizers and delete, in
/// order, NodePools, CAPI and platform objects, HostedControlPlane, the HCP
/// namespace and the HostedCluster. Idempotent: what is gone is skipped.
/// Migrate's teardown, `hcp-dr cluster destroy`, a drill's teardown
/// (through [`destroy_paused`]) and reconcile's undo all run this.
pub async fn destroy(client: &kube::Client, ns: &str, name: &str, out: &mut TornDown, record: Record<'_>) -> Result<(), Failure> {
    let (ns, name) = (ns.to_string(), name.to_string());
    let hcp_ns = crate::hosted::hcp_namespace(&ns, &name);
    let client = client.clone();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let hcp_ns_exists = namespaces.get_opt(&hcp_ns).await.map_err(request(format!("reading Namespace {hcp_ns}")))?.is_some();
    if hcp_ns_exists {
        scale_to_zero(&client, &hcp_ns, out, record).await?;
    }

    // NodePools of this cluster.
    let pools = api(&client, &NODE_POOL, &ns);
    for np in list_json(&pools, &ListParams::default(), "NodePools").await? {
        if np["spec"]["clusterName"].as_str() == Some(name.as_str()) {
            let np_name = np["metadata"]["name"].as_str().unwrap_or_default().to_string();
            gone(&pools, &np_name, &format!("NodePool {ns}/{np_name}"), out, record).await?;
        }
    }

    if hcp_ns_exists {
        clear_control_plane_namespace(&client, &hcp_ns, out, record).await?;
        delete_namespace(&client, &hcp_ns, None, Duration::from_secs(300)).await?;
        out.record_deleted(format!("Namespace {hcp_ns}"), record)?;
    }

    let hcs = api(&client, &HOSTED_CLUSTER, &ns);
    if let Some(hc) = get_json(&hcs, &name, &format!("HostedCluster {ns}/{name}")).await? {
        out.secrets = secrets_of(&hc);
        record(out)?;
    }
    let used = out.secrets.clone();
    gone(&hcs, &name, &format!("HostedCluster {ns}/{name}"), out, record).await?;

    // The Secrets in the HostedCluster's namespace that it used and no other
    // HostedCluster there uses: left behind, they would make moving the
    // cluster back here fail (the restore refuses existing, different objects).
    let others: Vec<String> = list_json(&hcs, &ListParams::default(), &format!("HostedClusters in {ns}"))
        .await?
        .iter()
        .filter(|hc| hc["metadata"]["name"].as_str() != Some(name.as_str()))
        .flat_map(secrets_of)
        .collect();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    for secret in used.iter().filter(|s| !others.contains(s)) {
        let what = format!("Secret {ns}/{secret}");
        delete_and_wait(&secrets, secret, &what, WAIT).await?;
        out.record_deleted(what, record)?;
    }
    Ok(())
}

/// Remove, with their finalizers, the CAPI and platform objects (machines
/// first) and the HostedControlPlane in a control-plane namespace whose
/// controllers were paused or scaled to zero: nothing else will, and the
/// namespace cannot go while they hold it. Idempotent.
pub async fn clear_control_plane_namespace(client: &kube::Client, hcp_ns: &str, out: &mut TornDown, record: Record<'_>) -> Result<(), Failure> {
    let discovery = crate::kube::discover(client, |g| exported_group(g) && g != HOSTED_CLUSTER.group, "discovering the management cluster's API groups").await?;
    let mut objects = Vec::new();
    for group in discovery.groups() {
        if !exported_group(group.name()) || group.name() == HOSTED_CLUSTER.group {
            continue;
        }
        for (resource, caps) in group.recommended_resources() {
            if caps.scope != Scope::Namespaced || !caps.supports_operation(verbs::LIST) {
                continue;
            }
            let api = api_for(client, &resource, hcp_ns);
            for obj in list_json(&api, &ListParams::default(), &format!("{} in {hcp_ns}", resource.plural)).await? {
                let obj_name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
                objects.push((deletion_rank(&resource.group, &resource.kind), resource.clone(), obj_name));
            }
        }
    }
    objects.sort_by(|a, b| (a.0, &a.1.kind, &a.2).cmp(&(b.0, &b.1.kind, &b.2)));
    for (_, resource, obj_name) in objects {
        let api = api_for(client, &resource, hcp_ns);
        gone(&api, &obj_name, &format!("{} {hcp_ns}/{obj_name}", resource.kind), out, record).await?;
    }
    let hcps = api(client, &HOSTED_CONTROL_PLANE, hcp_ns);
    for hcp in list_json(&hcps, &ListParams::default(), "HostedControlPlanes").await? {
        let hcp_name = hcp["metadata"]["name"].as_str().unwrap_or_default().to_string();
        gone(&hcps, &hcp_name, &format!("HostedControlPlane {hcp_ns}/{hcp_name}"), out, record).await?;
    }
    Ok(())
}

/// The Secrets in its own namespace a HostedCluster names: pull secret, ssh
/// key, etcd encryption keys, and the kubeconfig and kubeadmin password
/// HyperShift wrote for it.
pub fn secrets_of(hc: &Value) -> Vec<String> {
    [
        "/spec/pullSecret/name",
        "/spec/sshKey/name",
        "/spec/secretEncryption/aescbc/activeKey/name",
        "/spec/secretEncryption/aescbc/backupKey/name",
        "/status/kubeconfig/name",
        "/status/kubeadminPassword/name",
    ]
    .iter()
    .filter_map(|p| hc.pointer(p).and_then(Value::as_str))
    .filter(|s| !s.is_empty())
    .map(str::to_string)
    .collect()
}

/// `hcp-dr cluster destroy` outside a pipeline (a drill's teardown): the
/// cluster and its NodePools paused for an hour first (a longer pause in
/// place is kept), so the operator recreates nothing meanwhile, then
/// [`destroy`]. A cluster that is not there is an error.
pub async fn destroy_paused(client: &kube::Client, ns: &str, name: &str) -> Result<TornDown, Failure> {
    let label = format!("HostedCluster {ns}/{name}");
    let Some(hc) = get_json(&api(client, &HOSTED_CLUSTER, ns), name, &label).await? else {
        return Err(format!("{label} not found: nothing to destroy").into());
    };
    // paused first, so the operator does not recreate what is being deleted
    let until = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let value = |existing: &Value| Some(crate::hosted::longest_pause(existing["spec"]["pausedUntil"].as_str(), &until));
    crate::kube::set_cluster_paused_until(client, ns, name, &hc, value).await?;
    let mut out = TornDown::default();
    let mut record = |t: &TornDown| {
        tracing::info!(deleted = t.deleted.len(), "destroying");
        Ok(())
    };
    destroy(client, ns, name, &mut out, &mut record).await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminating_namespace_says_what_holds_it() {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "clusters-demo"}, "status": {"phase": "Terminating", "conditions": [
            {"type": "NamespaceDeletionDiscoveryFailure", "status": "False", "reason": "ResourcesDiscovered", "message": "All resources successfully discovered"},
            {"type": "NamespaceContentRemaining", "status": "True", "reason": "SomeResourcesRemain", "message": "Some resources are remaining: persistentvolumeclaims. has 1 resource instances"},
            {"type": "NamespaceFinalizersRemaining", "status": "True", "reason": "SomeFinalizersRemain", "message": "Some content in the namespace has finalizers remaining: kubernetes.io/pvc-protection in 1 resource instances"}]}}))
        .unwrap();
        assert_eq!(
            terminating_because(&ns),
            ": Some resources are remaining: persistentvolumeclaims. has 1 resource instances; Some content in the namespace has finalizers remaining: kubernetes.io/pvc-protection in 1 resource instances"
        );
        let plain: Namespace = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(terminating_because(&plain), "");
    }
}
