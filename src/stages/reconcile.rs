//! `hcp-dr cluster reconcile -f DESIRED.yaml` (`playbooks/cluster-reconcile.yaml`):
//! converge a hosted cluster to a desired HostedCluster, its NodePools and the
//! Secrets they reference. `diff` compares what the file says with what the
//! management cluster has (only the fields the file sets: server defaults and
//! status are not drift); `apply` creates what is missing and merge-patches
//! what differs, journaling the live values first so `--abort` can put them
//! back; `wait` waits until the HostedCluster is Available and every NodePool
//! Ready. A second run finds no drift and changes nothing.
//!
//! Secret values never reach the journal or the report: their drift is named
//! by key only, and their previous values are not kept (undo leaves a patched
//! Secret as it is, and says so).

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::hosted::{Gvk, HOSTED_CLUSTER, HostedCluster, NODE_POOL};
use crate::kube::{api, get_json, merge_patch, request};
use crate::pipeline::journal::RUN_ANNOTATION;
use crate::pipeline::{Catalog, Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::StageError;
use crate::teardown::{Owned, Removal, delete_created, ownership};

/// The Secret kind, for [`api`].
pub const SECRET: Gvk = Gvk { group: "", version: "v1", kind: "Secret", plural: "secrets" };

/// The inputs of a reconcile (journaled; the file's objects are not: it may
/// hold secrets, so its SHA-256 is kept and checked on resume).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReconcileInputs {
    pub file: std::path::PathBuf,
    pub file_sha256: String,
    pub namespace: String,
    pub hosted_cluster: String,
    pub wait_timeout_seconds: u64,
    pub wait: bool,
}

/// One field that differs, as a JSON pointer (`/spec/replicas`); `live` and
/// `desired` are null for Secret data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    pub path: String,
    pub live: Value,
    pub desired: Value,
}

/// What reconcile does to one object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Create,
    Patch,
    Unchanged,
}

/// One desired object compared with the live one (journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectDiff {
    pub kind: String,
    pub name: String,
    pub action: Action,
    pub drift: Vec<Drift>,
}

pub struct ReconcileContext {
    pub client: Client,
    pub inputs: ReconcileInputs,
    /// The file's objects, in apply order (never journaled).
    pub desired: Vec<Value>,
    pub diff: Option<Vec<ObjectDiff>>,
    pub warnings: Vec<String>,
}

fn gvk_of(kind: &str) -> &'static Gvk {
    match kind {
        "HostedCluster" => &HOSTED_CLUSTER,
        "NodePool" => &NODE_POOL,
        _ => &SECRET,
    }
}

fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// The parts of an object reconcile owns: spec (data and type for a
/// Secret, `stringData` folded into `data`), labels and annotations.
pub fn owned(obj: &Value) -> Value {
    let mut out = Map::new();
    let mut meta = Map::new();
    for key in ["labels", "annotations"] {
        if obj["metadata"][key].is_object() {
            meta.insert(key.to_string(), obj["metadata"][key].clone());
        }
    }
    if !meta.is_empty() {
        out.insert("metadata".into(), Value::Object(meta));
    }
    if obj["kind"] == "Secret" {
        let mut data = obj["data"].as_object().cloned().unwrap_or_default();
        for (k, v) in obj["stringData"].as_object().into_iter().flatten() {
            let text = v.as_str().unwrap_or_default();
            data.insert(k.clone(), json!(base64::engine::general_purpose::STANDARD.encode(text)));
        }
        if !data.is_empty() {
            out.insert("data".into(), Value::Object(data));
        }
        if obj["type"].is_string() {
            out.insert("type".into(), obj["type"].clone());
        }
    } else if obj["spec"].is_object() {
        out.insert("spec".into(), obj["spec"].clone());
    }
    Value::Object(out)
}

/// Where `desired` (only the fields it sets) differs from `live`.
pub fn drift(desired: &Value, live: &Value, path: &str, out: &mut Vec<Drift>) {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => {
            for (k, v) in d {
                let here = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                drift(v, l.get(k).unwrap_or(&Value::Null), &here, out);
            }
        }
        (d, l) if d == l => {}
        (d, l) => out.push(Drift { path: path.to_string(), live: l.clone(), desired: d.clone() }),
    }
}

/// A merge patch setting the fields at `paths` (JSON pointers) to their
/// values in `source` (null where `source` has none, which removes them).
pub fn patch_for(paths: &[String], source: &Value) -> Value {
    let mut patch = json!({});
    for path in paths {
        let parts: Vec<String> = path.split('/').skip(1).map(|p| p.replace("~1", "/").replace("~0", "~")).collect();
        if parts.is_empty() {
            continue;
        }
        let value = source.pointer(path).cloned().unwrap_or(Value::Null);
        let mut at = &mut patch;
        for p in &parts[..parts.len() - 1] {
            at = at.as_object_mut().expect("patch objects").entry(p.clone()).or_insert_with(|| json!({}));
        }
        at.as_object_mut().expect("patch objects").insert(parts[parts.len() - 1].clone(), value);
    }
    patch
}

/// Compare every desired object with the live one.
pub async fn compare(client: &Client, ns: &str, desired: &[Value]) -> Result<Vec<ObjectDiff>, StageFailure> {
    let mut out = Vec::new();
    for obj in desired {
        let kind = obj["kind"].as_str().unwrap_or_default().to_string();
        let name = name_of(obj).to_string();
        let live = get_json(&api(client, gvk_of(&kind), ns), &name, &format!("{kind} {ns}/{name}")).await?;
        let diff = match live {
            None => ObjectDiff { kind, name, action: Action::Create, drift: Vec::new() },
            Some(live) => {
                let mut found = Vec::new();
                drift(&owned(obj), &owned(&live), "", &mut found);
                if kind == "Secret" {
                    for d in &mut found {
                        d.live = Value::Null;
                        d.desired = Value::Null;
                    }
                }
                let action = if found.is_empty() { Action::Unchanged } else { Action::Patch };
                ObjectDiff { kind, name, action, drift: found }
            }
        };
        out.push(diff);
    }
    Ok(out)
}

pub struct Diff;

impl StageId for Diff {
    const NAME: &'static str = "diff";
    type Output = Vec<ObjectDiff>;
}

#[async_trait]
impl Stage<ReconcileContext> for Diff {
    fn summary(&self) -> &'static str {
        "compare the desired objects with the live ones (only the fields the file sets): missing, drifted, unchanged"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, _ctx: &ReconcileContext, _step: &Step<'_>) -> Vec<String> {
        Vec::new()
    }
    async fn run(&self, ctx: &mut ReconcileContext, _step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let diff = compare(&ctx.client, &ctx.inputs.namespace, &ctx.desired).await?;
        for d in &diff {
            for drift in &d.drift {
                tracing::info!(object = %format!("{} {}", d.kind, d.name), path = %drift.path, "drift");
            }
        }
        ctx.diff = Some(diff.clone());
        Ok(diff)
    }
    fn restore(&self, ctx: &mut ReconcileContext, output: Self::Output) -> Result<(), StageFailure> {
        ctx.diff = Some(output);
        Ok(())
    }
}

/// What `apply` changed (journaled before each change).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub created_namespace: bool,
    /// `(kind, name)` created.
    pub created: Vec<(String, String)>,
    /// `(kind, name, merge patch that puts the live values back)`; Secrets
    /// carry none (their values are not journaled). The patch names the
    /// object's UID, so it cannot apply to a same-named replacement.
    pub patched: Vec<(String, String, Option<Value>)>,
    /// The run that created them (journal `run_id`, also in each created
    /// object's [`RUN_ANNOTATION`]).
    #[serde(default)]
    pub run_id: String,
    /// `Kind/name` (and `Namespace/<ns>`) of each created object to the UID
    /// the server gave it: an undo deletes only those.
    #[serde(default)]
    pub uids: std::collections::BTreeMap<String, String>,
}

pub struct Apply;

impl StageId for Apply {
    const NAME: &'static str = "apply";
    type Output = Applied;
}

#[async_trait]
impl Stage<ReconcileContext> for Apply {
    fn summary(&self) -> &'static str {
        "create the missing objects and merge-patch the drifted fields (live values journaled first)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &ReconcileContext, _step: &Step<'_>) -> Vec<String> {
        let ns = &ctx.inputs.namespace;
        let Some(diff) = &ctx.diff else { return vec!["(cannot plan: diff did not run)".into()] };
        let mut lines = Vec::new();
        for d in diff {
            match d.action {
                Action::Create => lines.push(format!("create {} {ns}/{}", d.kind, d.name)),
                Action::Unchanged => lines.push(format!("{} {ns}/{} is as desired", d.kind, d.name)),
                Action::Patch => {
                    for drift in &d.drift {
                        if d.kind == "Secret" {
                            lines.push(format!("patch {} {ns}/{}: {} (value not shown)", d.kind, d.name, drift.path));
                        } else {
                            lines.push(format!("patch {} {ns}/{}: {}: {} -> {}", d.kind, d.name, drift.path, drift.live, drift.desired));
                        }
                    }
                }
            }
        }
        lines
    }
    async fn run(&self, ctx: &mut ReconcileContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let ns = ctx.inputs.namespace.clone();
        // Compared again: a resumed run must not patch from a stale diff.
        let diff = compare(&ctx.client, &ns, &ctx.desired).await?;
        let mut applied = step.earlier_progress::<Applied>().unwrap_or_default();
        if applied.run_id.is_empty() {
            applied.run_id = step.history().map(|h| h.header.run_id.clone()).unwrap_or_default();
        }
        let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
        if diff.iter().any(|d| d.action == Action::Create)
            && namespaces.get_opt(&ns).await.map_err(request(format!("reading Namespace {ns}")))?.is_none()
        {
            applied.created_namespace = true;
            step.record(serde_json::to_value(&applied)?)?;
            let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns, "annotations": {RUN_ANNOTATION: applied.run_id}}}))?;
            let created = namespaces.create(&PostParams::default(), &body).await.map_err(request(format!("creating Namespace {ns}")))?;
            if let Some(uid) = created.metadata.uid {
                applied.uids.insert(format!("Namespace/{ns}"), uid);
                step.record(serde_json::to_value(&applied)?)?;
            }
        }
        for (obj, d) in ctx.desired.iter().zip(&diff) {
            let what = format!("{} {ns}/{}", d.kind, d.name);
            let target = api(&ctx.client, gvk_of(&d.kind), &ns);
            match d.action {
                Action::Unchanged => {}
                Action::Create => {
                    applied.created.push((d.kind.clone(), d.name.clone()));
                    step.record(serde_json::to_value(&applied)?)?;
                    let mut body = obj.clone();
                    body["metadata"]["namespace"] = json!(ns);
                    body["metadata"]["annotations"][RUN_ANNOTATION] = json!(applied.run_id);
                    let body: DynamicObject = serde_json::from_value(body)?;
                    let created = target.create(&PostParams::default(), &body).await.map_err(|e| immutable_hint(request(format!("creating {what}"))(e)))?;
                    if let Some(uid) = created.metadata.uid {
                        applied.uids.insert(format!("{}/{}", d.kind, d.name), uid);
                        step.record(serde_json::to_value(&applied)?)?;
                    }
                }
                Action::Patch => {
                    let paths: Vec<String> = d.drift.iter().map(|x| x.path.clone()).collect();
                    let back = if d.kind == "Secret" {
                        None
                    } else {
                        let live = get_json(&target, &d.name, &what).await?.unwrap_or(Value::Null);
                        let mut back = patch_for(&paths, &owned(&live));
                        // the undo patches this object only (uid is immutable)
                        if let Some(uid) = live.pointer("/metadata/uid") {
                            back["metadata"]["uid"] = uid.clone();
                        }
                        Some(back)
                    };
                    applied.patched.push((d.kind.clone(), d.name.clone(), back));
                    step.record(serde_json::to_value(&applied)?)?;
                    let forward = patch_for(&paths, &owned(obj));
                    merge_patch(&target, &d.name, &forward, &what).await.map_err(immutable_hint)?;
                }
            }
        }
        Ok(applied)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut ReconcileContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(applied) = input.record::<Applied>()? else { return Ok(()) };
        let ns = ctx.inputs.namespace.clone();
        for (kind, name, back) in applied.patched.iter().rev() {
            let what = format!("{kind} {ns}/{name}");
            match back {
                Some(patch) => merge_patch(&api(&ctx.client, gvk_of(kind), &ns), name, patch, &what).await?,
                None => ctx.warnings.push(format!("{what} was patched and is left as patched: Secret values are not journaled")),
            }
        }
        for (kind, name) in applied.created.iter().rev() {
            let what = format!("{kind} {ns}/{name}");
            let target = api(&ctx.client, gvk_of(kind), &ns);
            let recorded = applied.uids.get(&format!("{kind}/{name}")).map(String::as_str);
            let not_ours = if kind == "HostedCluster" {
                // An ordered deletion, as `cluster destroy` does, of this very cluster.
                match ownership(&target, name, recorded, &applied.run_id, &what).await? {
                    Owned::Gone => None,
                    Owned::NotOurs(uid) => Some(uid),
                    Owned::Ours(_) => {
                        let mut out = Default::default();
                        let mut record = |_: &crate::teardown::TornDown| Ok(());
                        crate::teardown::destroy(&ctx.client, &ns, name, &mut out, &mut record).await?;
                        None
                    }
                }
            } else {
                match delete_created(&target, name, recorded, &applied.run_id, &what, Duration::from_secs(300)).await? {
                    Removal::NotOurs { uid } => Some(uid),
                    Removal::Deleted | Removal::Absent => None,
                }
            };
            if let Some(uid) = not_ours {
                let warning = format!("{what} was left alone: it is not the object this run created (UID {uid})");
                tracing::warn!("{warning}");
                ctx.warnings.push(warning);
            }
        }
        Ok(())
    }
}

/// A 422 on an immutable field, said in words.
fn immutable_hint(err: crate::kube::KubeError) -> crate::kube::KubeError {
    let text = err.to_string();
    if text.contains("immutable") {
        crate::kube::KubeError::Invalid(format!(
            "{text}: the desired file changes a field the API server does not allow to change on a live cluster; keep the live value in the file, or recreate the cluster (hcp-dr cluster destroy, then reconcile)"
        ))
    } else {
        err
    }
}

pub struct Wait;

/// Whether `wait` waited, and for how long.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Waited {
    pub waited: bool,
    /// The cluster was paused until then: the operator applies the changes later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

impl StageId for Wait {
    const NAME: &'static str = "wait";
    type Output = Waited;
}

#[async_trait]
impl Stage<ReconcileContext> for Wait {
    fn summary(&self) -> &'static str {
        "wait until the HostedCluster is Available and every desired NodePool Ready (skipped while the cluster is paused)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &ReconcileContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "wait up to {}s until HostedCluster {}/{} is Available and its NodePools Ready",
            ctx.inputs.wait_timeout_seconds, ctx.inputs.namespace, ctx.inputs.hosted_cluster
        )]
    }
    async fn run(&self, ctx: &mut ReconcileContext, _step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let (ns, name) = (ctx.inputs.namespace.clone(), ctx.inputs.hosted_cluster.clone());
        if !ctx.inputs.wait {
            return Ok(Waited::default());
        }
        let label = format!("HostedCluster {ns}/{name}");
        let hc = get_json(&api(&ctx.client, &HOSTED_CLUSTER, &ns), &name, &label)
            .await?
            .ok_or_else(|| StageError::Precondition(format!("{label} is gone")))?;
        if let Some(until) = HostedCluster(hc).paused_until()
            && crate::hosted::pauses(Some(until), chrono::Utc::now())
        {
            ctx.warnings.push(format!(
                "{label} is paused (pausedUntil={until}): the operator applies the changes when the pause ends; not waiting (hcp-dr cluster resume {name})"
            ));
            return Ok(Waited { paused_until: Some(until.to_string()), ..Waited::default() });
        }
        let pools: Vec<String> = ctx.desired.iter().filter(|o| o["kind"] == "NodePool").map(|o| name_of(o).to_string()).collect();
        let started = std::time::Instant::now();
        let client = ctx.client.clone();
        // woken by the HostedCluster's changes; the NodePools are looked at then and every few seconds
        crate::kube::wait_watching(
            &api(&ctx.client, &HOSTED_CLUSTER, &ns),
            crate::kube::Watched::named(&name),
            &format!("{label} to be Available and NodePools {} Ready", pools.join(", ")),
            Duration::from_secs(ctx.inputs.wait_timeout_seconds),
            Duration::from_secs(1),
            || async {
                let hc = get_json(&api(&client, &HOSTED_CLUSTER, &ns), &name, &label).await?;
                // conditions about the spec before the change do not count
                if !hc.is_some_and(|h| crate::hosted::current_condition(&h, "Available") == Some("True")) {
                    return Ok(None);
                }
                for pool in &pools {
                    let np = get_json(&api(&client, &NODE_POOL, &ns), pool, &format!("NodePool {ns}/{pool}")).await?;
                    if !np.is_some_and(|n| crate::hosted::current_condition(&n, "Ready") == Some("True")) {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await?;
        Ok(Waited { waited: true, seconds: Some(started.elapsed().as_secs_f64()), paused_until: None })
    }
}

/// Every cluster-reconcile stage, by name.
pub fn reconcile_catalog() -> Catalog<ReconcileContext> {
    Catalog::new("cluster-reconcile").with(Diff).with(Apply).after(&[Diff::NAME]).with(Wait).after(&[Apply::NAME])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_fields_the_file_sets_are_compared() {
        let desired = json!({"kind": "NodePool", "metadata": {"name": "np", "labels": {"team": "a"}}, "spec": {"replicas": 3, "clusterName": "demo"}});
        let live = json!({"kind": "NodePool", "metadata": {"name": "np", "labels": {"team": "a", "added": "by-server"}, "uid": "x"},
            "spec": {"replicas": 2, "clusterName": "demo", "management": {"upgradeType": "Replace"}}, "status": {"replicas": 2}});
        let mut found = Vec::new();
        drift(&owned(&desired), &owned(&live), "", &mut found);
        assert_eq!(found, vec![Drift { path: "/spec/replicas".into(), live: json!(2), desired: json!(3) }]);
    }

    #[test]
    fn patches_set_drifted_paths_and_remove_absent_ones() {
        let source = owned(&json!({"kind": "HostedCluster", "metadata": {"labels": {"example.com/team": "b"}}, "spec": {"release": {"image": "img:2"}}}));
        let patch = patch_for(&["/spec/release/image".into(), "/metadata/labels/example.com~1team".into(), "/spec/pausedUntil".into()], &source);
        assert_eq!(patch, json!({"spec": {"release": {"image": "img:2"}, "pausedUntil": null}, "metadata": {"labels": {"example.com/team": "b"}}}));
    }

    #[test]
    fn secret_string_data_is_compared_as_data() {
        let desired = json!({"kind": "Secret", "metadata": {"name": "ps"}, "stringData": {".dockerconfigjson": "{}"}, "type": "kubernetes.io/dockerconfigjson"});
        let live = json!({"kind": "Secret", "metadata": {"name": "ps"}, "data": {".dockerconfigjson": "e30="}, "type": "kubernetes.io/dockerconfigjson"});
        let mut found = Vec::new();
        drift(&owned(&desired), &owned(&live), "", &mut found);
        assert!(found.is_empty(), "{found:?}");
    }
}
