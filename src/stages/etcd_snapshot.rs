//! `etcd-snapshot`: every member in parallel over gRPC, each streamed
//! straight into the store with its SHA-256 computed on the way and etcd's
//! trailing hash checked. With the writers stopped the members must agree on
//! one revision; if they do not, the backup fails.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::context::BackupContext;
use super::preflight::connect_member;
use super::{StageError, from_output};
use crate::archive::Layout;
use crate::etcd::SnapshotReport;
use crate::pipeline::{Stage, StageFailure, Step, UndoInput};

pub struct EtcdSnapshot;

/// Wait (bounded) until every member reports the same revision.
async fn converge(ctx: &BackupContext) -> Result<i64, StageFailure> {
    let mut last = Vec::new();
    for _ in 0..40 {
        last.clear();
        for target in &ctx.members {
            let (member, _forward) = connect_member(ctx, target).await?;
            let mut client = member.connect().await?;
            last.push((target.pod.clone(), member.status(&mut client).await?.revision));
        }
        if last.windows(2).all(|w| w[0].1 == w[1].1) {
            return Ok(last.first().map(|m| m.1).unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(StageError::Precondition(format!(
        "etcd members disagree on the revision with the writers stopped ({}): something still writes to etcd",
        last.iter().map(|(m, r)| format!("{m}: {r}")).collect::<Vec<_>>().join(", ")
    ))
    .into())
}

#[async_trait]
impl Stage<BackupContext> for EtcdSnapshot {
    fn name(&self) -> &'static str {
        "etcd-snapshot"
    }
    fn summary(&self) -> &'static str {
        "snapshot every etcd member in parallel, streamed to the store with SHA-256 and etcd's own hash checked"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, _params: &Value) -> Vec<String> {
        let layout = ctx.inputs.layout();
        ctx.members
            .iter()
            .map(|m| {
                format!(
                    "stream a snapshot of {} ({}) to {}/{}",
                    m.pod,
                    m.pod_ip,
                    ctx.store.url(),
                    layout.artifact(&Layout::snapshot_name(&m.pod))
                )
            })
            .collect()
    }
    async fn run(&self, ctx: &mut BackupContext, _step: &mut Step<'_>) -> Result<Value, StageFailure> {
        if ctx.members.is_empty() {
            return Err(StageError::Missing("etcd members").into());
        }
        let revision = converge(ctx).await?;
        let layout = ctx.inputs.layout();
        let ctx_ref: &BackupContext = ctx;
        let layout_ref = &layout;
        let jobs = ctx_ref.members.iter().map(|target| async move {
            let (member, _forward) = connect_member(ctx_ref, target).await?;
            let key = layout_ref.artifact(&Layout::snapshot_name(&target.pod));
            let report = member.snapshot_to(ctx_ref.store.as_ref(), &key).await?;
            Ok::<SnapshotReport, StageFailure>(report)
        });
        let results = futures::future::join_all(jobs).await;
        let mut reports = Vec::new();
        let mut errors = Vec::new();
        for result in results {
            match result {
                Ok(report) => reports.push(report),
                Err(err) => errors.push(crate::pipeline::stage::error_chain(err.as_ref())),
            }
        }
        if !errors.is_empty() {
            for report in &reports {
                let _ = ctx.store.delete(&layout.artifact(&Layout::snapshot_name(&report.member))).await;
            }
            return Err(StageError::Precondition(format!("etcd snapshot failed: {}", errors.join("; "))).into());
        }
        if let Some(other) = reports.iter().find(|r| r.revision != revision) {
            return Err(StageError::Precondition(format!(
                "member {} was snapshotted at revision {} but the members agreed on {revision}: a writer is running",
                other.member, other.revision
            ))
            .into());
        }
        reports.sort_by(|a, b| a.member.cmp(&b.member));
        ctx.snapshots = reports.clone();
        Ok(json!({"revision": revision, "snapshots": reports}))
    }
    fn restore(&self, ctx: &mut BackupContext, output: &Value) -> Result<(), StageFailure> {
        ctx.snapshots = from_output("etcd-snapshot", &output["snapshots"])?;
        Ok(())
    }
    fn undoable(&self) -> bool {
        true
    }
    /// A failed backup leaves no snapshot bytes behind.
    async fn undo(&self, ctx: &mut BackupContext, _input: UndoInput<'_>) -> Result<(), StageFailure> {
        let layout = ctx.inputs.layout();
        for target in &ctx.members {
            ctx.store.delete(&layout.artifact(&Layout::snapshot_name(&target.pod))).await?;
        }
        Ok(())
    }
}
