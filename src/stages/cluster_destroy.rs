//! `hcp-dr cluster destroy` (`playbooks/cluster-destroy.yaml`): `pause` sets a
//! deadline pause on the HostedCluster and its NodePools (journaled first, so
//! the operator recreates nothing while it is deleted, and `--abort` before
//! the teardown puts the old values back); `teardown` runs the ordered,
//! finalizer-clearing deletion of `crate::teardown` (the one migrate's
//! source teardown, a drill and reconcile's undo run too), journaling
//! what it deleted as it goes. A stopped teardown is resumed: what is gone
//! stays gone and the rest is deleted.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::pipeline::{Catalog, Stage, StageFailure, StageRules, Step};
use crate::stages::deadline_pause::{DeadlinePause, PauseScope};
use crate::stages::earlier_progress;
use crate::teardown::{self, TornDown};

/// The inputs of a destroy (journaled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DestroyInputs {
    pub namespace: String,
    pub hosted_cluster: String,
    pub pause_seconds: u64,
    /// Where the cluster runs when this is a copy `hcp-dr fence` stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
}

pub struct DestroyContext {
    pub client: kube::Client,
    pub inputs: DestroyInputs,
}

impl PauseScope for DestroyContext {
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
    Catalog::default().with(DeadlinePause).with(Teardown)
}

/// The teardown only ever runs on a paused cluster.
pub const DESTROY_RULES: StageRules<'static> = StageRules {
    operation: "cluster-destroy",
    known: &["pause", "teardown"],
    requires_before: &[("teardown", "pause")],
};
