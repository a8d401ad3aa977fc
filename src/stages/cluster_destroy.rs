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

use crate::pipeline::{Catalog, Stage, StageId, StageFailure, Step};
use crate::stages::deadline_pause::{DeadlinePause, PauseScope};
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

impl StageId for Teardown {
    const NAME: &'static str = "teardown";
    type Output = TornDown;
}

#[async_trait]
impl Stage<DestroyContext> for Teardown {
    fn summary(&self) -> &'static str {
        "scale the HCP namespace to zero, then remove finalizers and delete NodePools, Machines, MachineSets, the Cluster, platform objects, the HostedControlPlane, the HCP namespace and the HostedCluster, in order (not undoable)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &DestroyContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "delete HostedCluster {}/{} and everything it owns, in order, finalizers cleared",
            ctx.inputs.namespace, ctx.inputs.hosted_cluster
        )]
    }
    async fn run(&self, ctx: &mut DestroyContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let mut out: TornDown = step.earlier_progress().unwrap_or_default();
        step.record(serde_json::to_value(&out)?)?;
        let mut record = |t: &TornDown| -> Result<(), StageFailure> {
            step.record(serde_json::to_value(t)?)?;
            Ok(())
        };
        teardown::destroy(&ctx.client, &ctx.inputs.namespace, &ctx.inputs.hosted_cluster, &mut out, &mut record).await?;
        Ok(out)
    }
}

/// Every cluster-destroy stage, by name.
pub fn destroy_catalog() -> Catalog<DestroyContext> {
    Catalog::new("cluster-destroy").with(DeadlinePause).with(Teardown).after(&[DeadlinePause::NAME])
}

