//! `teardown`: the source goes, only after the destination was verified
//! (the playbook rules put it after `wait`). Everything in the HCP namespace
//! is scaled to zero (the etcd StatefulSet's PVC retention is reported:
//! with `Delete` its volumes go with it), then finalizers are removed and
//! NodePools, Machines, MachineSets, MachineDeployments, the Cluster, the
//! platform objects, the HostedControlPlane, the HCP namespace and the
//! HostedCluster are deleted, in that order. Not undoable: `--abort` is
//! refused once it started; `--resume` finishes it.
//!
//! hcp-dr removes the finalizers itself (listed in the output, journaled
//! first) and never waits for the HyperShift operator: the source is paused,
//! so its operator acts on nothing, and during a management cluster incident
//! it may be down altogether (`--operator-ack-timeout`). Nor should it act:
//! its cleanup on deletion is for a cluster that goes away, and this one
//! goes on running on the destination (the product's migration procedure
//! removes the same finalizers). Only the namespace's own finalizer, which
//! the cluster's namespace controller handles, is left to it.
//!
//! The deletion itself is [`crate::teardown::destroy`], which `cluster
//! destroy`, a drill's teardown and reconcile's undo run too.

use async_trait::async_trait;

use super::MigrateContext;
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::teardown::{TornDown, destroy};

pub struct Teardown;

async fn run(ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<TornDown, StageFailure> {
    let (ns, name) = (ctx.inputs.source.namespace.clone(), ctx.inputs.source.hosted_cluster.clone());
    let mut out: TornDown = step.earlier_progress().unwrap_or_default();
    let inventory = step.output_of::<crate::stages::export::Export>()?.and_then(|e| e.agent_inventory);
    let mut record = |t: &TornDown| -> Result<(), StageFailure> { Ok(step.record(serde_json::to_value(t)?)?) };
    destroy(&ctx.source.client, &ns, &name, &mut out, &mut record).await?;
    // the Agent inventory it moved (its hosts detached by `detach-hosts`)
    if let Some(inventory) = inventory {
        super::hosts::remove_inventory(&ctx.source.client, &inventory, &mut out, &mut record).await?;
    }
    Ok(out)
}

impl StageId for Teardown {
    const NAME: &'static str = "teardown";
    type Output = TornDown;
}

#[async_trait]
impl Stage<MigrateContext> for Teardown {
    fn summary(&self) -> &'static str {
        "on the source: scale the HCP namespace to zero, then remove finalizers and delete NodePools, CAPI and platform objects, HostedControlPlane, the HCP namespace and the HostedCluster"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &MigrateContext, _step: &Step<'_>) -> Vec<String> {
        let hcp_ns = ctx.source.hcp_namespace();
        vec![
            format!("source: scale every Deployment and StatefulSet in {hcp_ns} to 0"),
            format!(
                "source: remove finalizers and delete the NodePools, Machines, MachineSets, MachineDeployments, Cluster, platform objects and HostedControlPlane, Namespace {hcp_ns}, HostedCluster {}/{}",
                ctx.inputs.source.namespace, ctx.inputs.source.hosted_cluster
            ),
        ]
    }
    async fn run(&self, ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        Ok(run(ctx, step).await?)
    }
}
