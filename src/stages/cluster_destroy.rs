//! `hcp-dr cluster destroy` (`playbooks/cluster-destroy.yaml`): `pause` sets a
//! deadline pause on the HostedCluster and its NodePools (journaled first, so
//! the operator recreates nothing while it is deleted, and `--abort` before
//! the teardown puts the old values back); `teardown` runs the ordered,
//! finalizer-clearing deletion migrate's source teardown runs, journaling
//! what it deleted as it goes. A stopped teardown is resumed: what is gone
//! stays gone and the rest is deleted.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::hosted::{HOSTED_CLUSTER, NODE_POOL};
use crate::kube::{api, get_json, list_json, set_paused_until};
use crate::pipeline::{Catalog, Stage, StageFailure, StageRules, Step, UndoInput};
use crate::stages::migrate::teardown::{self, TornDown};
use crate::stages::{StageError, earlier_progress, undo_record};

/// The inputs of a destroy (journaled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DestroyInputs {
    pub namespace: String,
    pub hosted_cluster: String,
    pub pause_seconds: u64,
}

pub struct DestroyContext {
    pub client: kube::Client,
    pub inputs: DestroyInputs,
}

/// What `pause` changed: `(kind, name, previous pausedUntil)`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    pub until: String,
    pub previous: Vec<(String, String, Option<String>)>,
    /// `kind/name` -> the UID paused: the undo leaves an object recreated
    /// since alone (absent in journals of older hcp-dr).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub uids: std::collections::BTreeMap<String, String>,
}

pub struct Pause;

#[async_trait]
impl Stage<DestroyContext> for Pause {
    fn name(&self) -> &'static str {
        "pause"
    }
    fn summary(&self) -> &'static str {
        "pause the HostedCluster and its NodePools until a deadline, so nothing is recreated while it is deleted"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &DestroyContext, _params: &Value) -> Vec<String> {
        vec![format!(
            "set spec.pausedUntil on HostedCluster {}/{} and its NodePools to now + {}s",
            ctx.inputs.namespace, ctx.inputs.hosted_cluster, ctx.inputs.pause_seconds
        )]
    }
    async fn run(&self, ctx: &mut DestroyContext, step: &mut Step<'_>) -> Result<Value, StageFailure> {
        let (ns, name) = (ctx.inputs.namespace.clone(), ctx.inputs.hosted_cluster.clone());
        let label = format!("HostedCluster {ns}/{name}");
        let hc = get_json(&api(&ctx.client, &HOSTED_CLUSTER, &ns), &name, &label)
            .await?
            .ok_or_else(|| StageError::Precondition(format!("{label} not found: nothing to destroy")))?;
        let mut record = Paused {
            until: (chrono::Utc::now() + chrono::Duration::seconds(ctx.inputs.pause_seconds as i64))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            previous: vec![("HostedCluster".into(), name.clone(), hc["spec"]["pausedUntil"].as_str().map(str::to_string))],
            uids: hc["metadata"]["uid"].as_str().map(|uid| (format!("HostedCluster/{name}"), uid.to_string())).into_iter().collect(),
        };
        for np in list_json(&api(&ctx.client, &NODE_POOL, &ns), &Default::default(), "NodePools").await? {
            if np["spec"]["clusterName"].as_str() == Some(name.as_str()) {
                let np_name = np["metadata"]["name"].as_str().unwrap_or_default().to_string();
                if let Some(uid) = np["metadata"]["uid"].as_str() {
                    record.uids.insert(format!("NodePool/{np_name}"), uid.to_string());
                }
                record.previous.push(("NodePool".into(), np_name, np["spec"]["pausedUntil"].as_str().map(str::to_string)));
            }
        }
        if let Some(first) = earlier_progress::<Paused>(step, "pause") {
            record.previous = first.previous;
            record.uids = first.uids;
        }
        step.record(serde_json::to_value(&record)?)?;
        for (kind, object, _) in &record.previous {
            let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
            set_paused_until(&ctx.client, gvk, &ns, object, Some(&record.until)).await?;
        }
        Ok(serde_json::to_value(record)?)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut DestroyContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = undo_record::<Paused>("pause", &input)? else { return Ok(()) };
        let ns = ctx.inputs.namespace.clone();
        for (kind, object, previous) in &record.previous {
            let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
            let Some(live) = get_json(&api(&ctx.client, gvk, &ns), object, &format!("{kind} {ns}/{object}")).await? else { continue };
            if crate::stages::pause::recreated_since(&record.uids, kind, object, &live) {
                tracing::warn!("{kind} {ns}/{object} is not the object this run paused (it was recreated since); leaving it");
                continue;
            }
            set_paused_until(&ctx.client, gvk, &ns, object, previous.as_deref()).await?;
        }
        Ok(())
    }
}

pub struct Teardown;

#[async_trait]
impl Stage<DestroyContext> for Teardown {
    fn name(&self) -> &'static str {
        "teardown"
    }
    fn summary(&self) -> &'static str {
        "scale the HCP namespace to zero, then remove finalizers and delete NodePools, Machines, MachineSets, the Cluster, platform objects, the HostedControlPlane, the HCP namespace and the HostedCluster, in order (not undoable)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &DestroyContext, _params: &Value) -> Vec<String> {
        vec![format!(
            "delete HostedCluster {}/{} and everything it owns, in order, finalizers cleared",
            ctx.inputs.namespace, ctx.inputs.hosted_cluster
        )]
    }
    async fn run(&self, ctx: &mut DestroyContext, step: &mut Step<'_>) -> Result<Value, StageFailure> {
        let mut out: TornDown = earlier_progress(step, "teardown").unwrap_or_default();
        step.record(serde_json::to_value(&out)?)?;
        let mut record = |t: &TornDown| -> Result<(), StageFailure> {
            step.record(serde_json::to_value(t)?)?;
            Ok(())
        };
        teardown::destroy(&ctx.client, &ctx.inputs.namespace, &ctx.inputs.hosted_cluster, &mut out, &mut record).await?;
        Ok(serde_json::to_value(out)?)
    }
}

/// Every cluster-destroy stage, by name.
pub fn destroy_catalog() -> Catalog<DestroyContext> {
    Catalog::default().with(Pause).with(Teardown)
}

/// The teardown only ever runs on a paused cluster.
pub const DESTROY_RULES: StageRules<'static> = StageRules {
    operation: "cluster-destroy",
    known: &["pause", "teardown"],
    requires_before: &[("teardown", "pause")],
};
