//! `fence`: once the restored cluster serves, the store's fence record
//! names the destination management cluster as the one that runs it
//! ([`crate::archive::fence`]). From then on a backup of that cluster taken
//! on any other management cluster (the lost one, come back with its old
//! copy) is refused, so `latest` never moves to stale data.
//!
//! The record it replaces is journaled first; `--abort` puts it back (or
//! deletes the new one when there was none), unless someone rewrote the
//! fence since. A fence the store cannot write fails the stage: the cluster
//! is restored but NOT fenced, and the report says so.

use async_trait::async_trait;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RestoreContext;
use super::verify::manifest;
use crate::archive::fence::{self, FenceError};
use crate::archive;
use crate::hosted::HOSTED_CLUSTER;
use crate::kube::{api, get_json};
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::StageError;

/// The stage; `by` is the operation recorded in the fence.
pub struct WriteFence {
    pub by: &'static str,
}

/// What the stage journals before writing, and returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fenced {
    /// The fence replaced (`None`: there was none, or it was unreadable).
    pub previous: Option<fence::Fence>,
    /// The fence written.
    pub fence: fence::Fence,
}

async fn run(stage: &WriteFence, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Fenced, StageFailure> {
    let manifest = manifest(ctx, step).await?;
    let runs_on = ctx.management.clone().ok_or(StageError::Missing("the destination management cluster's identity"))?;
    let (ns, name) = (ctx.inputs.namespace.clone(), ctx.inputs.hosted_cluster.clone());
    let label = ctx.inputs.hc_label();
    let hc = get_json(&api(&ctx.client, &HOSTED_CLUSTER, &ns), &name, &label).await?;
    let uid = hc.as_ref().and_then(|h| h.pointer("/metadata/uid")).and_then(Value::as_str).map(str::to_string);
    let key = fence::key(&ns, &name);
    let (here, url) = (runs_on.describe(), ctx.store.url());
    let not_fenced = |err: &dyn std::fmt::Display| {
        StageError::Precondition(format!(
            "{label} is restored and serving on {here}, but it is NOT fenced: the store fence {url}/{key} could not be {err}. Until it is written, a backup taken where the old copy runs would be accepted and could become `latest`. Fix the store access and resume this restore (--resume with its journal)"
        ))
    };
    let previous = match fence::read(ctx.store.as_ref(), &ns, &name).await {
        Ok(previous) => previous,
        Err(FenceError::Unreadable { message, .. }) => {
            ctx.warnings.push(format!("the store fence {key} was unreadable ({message}); it is replaced"));
            None
        }
        Err(FenceError::Store(err)) => return Err(not_fenced(&format_args!("read: {err}")).into()),
    };
    if let Some(p) = previous.as_ref().filter(|p| !p.allows(&runs_on)) {
        ctx.warnings.push(format!(
            "the store fence said {}: this restore moves the cluster here; fence the copy there (hcp-dr fence) before its management cluster comes back",
            p.describe()
        ));
    }
    let record = Fenced {
        previous,
        fence: fence::Fence {
            format_version: fence::FENCE_VERSION,
            namespace: ns,
            hosted_cluster: name,
            runs_on,
            hosted_cluster_uid: uid,
            backup_id: ctx.inputs.backup_id.clone(),
            backup_taken_on: manifest.origin.as_ref().map(|o| o.management_cluster.clone()),
            by: stage.by.to_string(),
            at: Utc::now(),
            tool_version: env!("CARGO_PKG_VERSION").into(),
        },
    };
    step.record(serde_json::to_value(&record)?)?;
    fence::write(ctx.store.as_ref(), &record.fence)
        .await
        .map_err(|err| not_fenced(&format_args!("written: {err}")))?;
    tracing::info!(fence = %record.fence.describe(), "store fence written");
    Ok(record)
}

impl StageId for WriteFence {
    const NAME: &'static str = "fence";
    type Output = Fenced;
}

#[async_trait]
impl Stage<RestoreContext> for WriteFence {
    fn summary(&self) -> &'static str {
        "write the store fence: the cluster runs on the destination now, and backups taken anywhere else are refused"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RestoreContext, _step: &Step<'_>) -> Vec<String> {
        let on = ctx.management.as_ref().map(archive::ManagementCluster::describe).unwrap_or_else(|| "the destination".into());
        vec![format!(
            "write {}/{}: {}/{} runs on {on}; backups of it taken on any other management cluster are refused",
            ctx.store.url(),
            fence::key(&ctx.inputs.namespace, &ctx.inputs.hosted_cluster),
            ctx.inputs.namespace,
            ctx.inputs.hosted_cluster
        )]
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        Ok(run(self, ctx, step).await?)
    }
    fn undoable(&self) -> bool {
        true
    }
    /// Put the previous fence back, only while the store still holds the
    /// one this run wrote.
    async fn undo(&self, ctx: &mut RestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = input.record::<Fenced>()? else { return Ok(()) };
        let (ns, name) = (&record.fence.namespace, &record.fence.hosted_cluster);
        match fence::read(ctx.store.as_ref(), ns, name).await {
            Ok(Some(current)) if current == record.fence => {}
            Ok(None) if record.previous.is_none() => return Ok(()),
            Ok(current) => {
                ctx.warnings.push(format!(
                    "the store fence {} was not put back: it changed since this run wrote it (now: {})",
                    fence::key(ns, name),
                    current.map(|f| f.describe()).unwrap_or_else(|| "none".into())
                ));
                return Ok(());
            }
            Err(err) => return Err(StageError::Precondition(format!("reading the store fence to put it back: {err}")).into()),
        }
        match &record.previous {
            Some(previous) => fence::write(ctx.store.as_ref(), previous).await?,
            None => ctx.store.delete(&fence::key(ns, name)).await?,
        }
        Ok(())
    }
}
