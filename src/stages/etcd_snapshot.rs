//! `etcd-snapshot`: with the writers stopped, every member's snapshot is
//! started in parallel over gRPC. etcd serves a snapshot from one read
//! transaction opened when the request arrives, so once every stream has
//! delivered its first bytes at the revision the members agree on, the
//! content is fixed and the writers may come back (`resume`): the API
//! downtime no longer grows with the database. The streams go on in the
//! background, into the store with SHA-256 and etcd's trailing hash
//! checked, and `snapshot-finish` collects them.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::context::{BackupContext, MemberTarget, PendingSnapshot};
use super::etcd_members;
use super::preflight::{connect_member, member_status};
use super::StageError;
use crate::archive::{Layout, SkippedMember};
use crate::etcd::SnapshotReport;
use super::params::SnapshotParams;
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, UndoInput, read_params};

pub struct EtcdSnapshot;
pub struct SnapshotFinish;

/// Wait (bounded) until every member reports the same revision. When some
/// never catch up (or stop answering) but a quorum agrees at the top, the
/// others are skipped: returns the revision and the members skipped.
async fn converge(ctx: &BackupContext) -> Result<(i64, Vec<SkippedMember>), StageFailure> {
    let expected = ctx.members.len() + ctx.etcd_health.skipped.len();
    let mut last = Vec::new();
    let mut silent = Vec::new();
    for _ in 0..40 {
        last.clear();
        silent.clear();
        for target in &ctx.members {
            match member_status(ctx, target).await {
                Ok(status) => last.push((target.pod.clone(), status.revision)),
                Err(reason) => silent.push(SkippedMember {
                    member: target.pod.clone(),
                    reason: format!("stopped answering after preflight: {reason}"),
                }),
            }
        }
        if silent.is_empty() && !last.is_empty() && last.windows(2).all(|w| w[0].1 == w[1].1) {
            return Ok((last[0].1, Vec::new()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (revision, lagging) = etcd_members::agree(expected, &last, ctx.etcd_health.no_quorum).map_err(StageError::Precondition)?;
    Ok((revision, silent.into_iter().chain(lagging).collect()))
}

/// Drop members the snapshot skipped from the backup, recording why.
fn skip(ctx: &mut BackupContext, skipped: Vec<SkippedMember>) {
    for s in skipped {
        tracing::warn!(member = %s.member, reason = %s.reason, "etcd member skipped");
        ctx.members.retain(|m| m.pod != s.member);
        if !ctx.etcd_health.skipped.iter().any(|k| k.member == s.member) {
            ctx.warnings.push(s.warning());
            ctx.etcd_health.skipped.push(s);
        }
    }
    ctx.etcd_health.skipped.sort_by(|a, b| a.member.cmp(&b.member));
}

/// Before the writers come back: if the streams `etcd-snapshot` started were
/// lost with an earlier process (a crash, then `--resume`), start them again
/// now, while the writers are still stopped.
pub(crate) async fn ensure_started(ctx: &mut BackupContext, step: &Step<'_>) -> Result<(), StageFailure> {
    let snapshotted = step.succeeded::<EtcdSnapshot>();
    if snapshotted && ctx.pending.is_empty() && !step.succeeded::<SnapshotFinish>() {
        tracing::warn!("the snapshot streams of an earlier run were lost; taking them again before the writers come back");
        start_all(ctx, concurrency_of(step)?).await?;
    }
    Ok(())
}

/// The `concurrency` the run's `etcd-snapshot` was given (taken again with
/// the same limit).
fn concurrency_of(step: &Step<'_>) -> Result<Option<usize>, StageFailure> {
    Ok(step.output_of::<EtcdSnapshot>()?.and_then(|started| started.concurrency))
}

/// Stop the background streams and delete what they wrote.
async fn discard(ctx: &mut BackupContext) -> Result<(), StageFailure> {
    for pending in ctx.pending.drain(..) {
        pending.task.abort();
        let _ = pending.task.await;
    }
    let layout = ctx.inputs.layout();
    for target in &ctx.members {
        ctx.store
            .delete(&layout.artifact(&Layout::snapshot_name(&target.pod)))
            .await?;
    }
    Ok(())
}

/// Start every member's snapshot (writers stopped) and leave the streams
/// finishing in the background in `ctx.pending`; returns the revision and,
/// with a `concurrency` below the members, the groups started one after
/// the other (each once the one before is stored).
pub(crate) async fn start_all(ctx: &mut BackupContext, concurrency: Option<usize>) -> Result<(i64, Vec<Vec<String>>), StageFailure> {
    if ctx.members.is_empty() {
        return Err(StageError::Precondition("preflight found no etcd member to snapshot".into()).into());
    }
    // a rerun (resume) starts over
    discard(ctx).await?;
    let (revision, skipped) = converge(ctx).await?;
    skip(ctx, skipped);
    let limit = concurrency.unwrap_or(usize::MAX).max(1);
    let members = ctx.members.clone();
    let mut groups = Vec::new();
    // A stream holds a permit until it is stored: a group starts when the
    // one before gave them back. The writers are still down, so every
    // group's content is at the agreed revision.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(limit.min(members.len())));
    for group in members.chunks(limit) {
        let mut permits = Vec::new();
        for _ in group {
            permits.push(gate.clone().acquire_owned().await.map_err(|e| StageError::Precondition(e.to_string()))?);
        }
        start_group(ctx, group, revision, permits).await?;
        groups.push(group.iter().map(|m| m.pod.clone()).collect());
    }
    Ok((revision, if members.len() > limit { groups } else { Vec::new() }))
}

/// Start `group`'s snapshots at once, each stream finishing in the
/// background with its permit.
async fn start_group(ctx: &mut BackupContext, group: &[MemberTarget], revision: i64, permits: Vec<tokio::sync::OwnedSemaphorePermit>) -> Result<(), StageFailure> {
    let ctx_ref: &BackupContext = ctx;
    let starts = group.iter().map(|target| async move {
        let (member, forward) = connect_member(ctx_ref, target).await?;
        let started = member.start_snapshot().await?;
        Ok::<_, StageFailure>((target.pod.clone(), started, forward))
    });
    let mut started = Vec::new();
    let mut errors = Vec::new();
    for result in futures::future::join_all(starts).await {
        match result {
            Ok(s) => started.push(s),
            Err(err) => errors.push(crate::pipeline::stage::error_chain(err.as_ref())),
        }
    }
    if !errors.is_empty() {
        return Err(StageError::Precondition(format!(
            "etcd snapshot failed: {}",
            errors.join("; ")
        ))
        .into());
    }
    if let Some((pod, s, _)) = started.iter().find(|(_, s, _)| s.revision() != revision) {
        return Err(StageError::Precondition(format!(
                "member {pod} was snapshotted at revision {} but the members agreed on {revision}: a writer is running",
                s.revision()
            ))
            .into());
    }
    let layout = ctx.inputs.layout();
    for ((pod, snapshot, forward), permit) in started.into_iter().zip(permits) {
        let key = layout.artifact(&Layout::snapshot_name(&pod));
        // compressed and encrypted on the way as the backup is (`--compression`, `--encrypt-to`)
        let store = ctx.snapshot_store();
        let task_key = key.clone();
        let meter = ctx.streamed.clone();
        let task = tokio::spawn(async move {
            // a port-forward lives as long as its stream, the permit too
            let _forward = forward;
            let _permit = permit;
            snapshot.finish(store.as_ref(), &task_key, &meter).await
        });
        ctx.pending.push(PendingSnapshot {
            member: pod,
            key,
            task,
        });
    }
    Ok(())
}

/// What `etcd-snapshot` started: the agreed revision and the members whose
/// streams hold it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Started {
    pub revision: i64,
    pub started: Vec<String>,
    /// The playbook's `concurrency`, when given (a stream lost with the
    /// process is taken again with the same limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// With fewer than the members at once: the groups, in the order they
    /// streamed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<Vec<String>>,
    /// On resume the members an earlier run skipped stay skipped (older
    /// journals have none).
    #[serde(default)]
    pub skipped: Vec<SkippedMember>,
}

/// What `snapshot-finish` stored: one report per member, and for an
/// encrypted backup each snapshot's plaintext size and SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshots {
    pub revision: Option<i64>,
    pub snapshots: Vec<SnapshotReport>,
    #[serde(default)]
    pub skipped: Vec<SkippedMember>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plaintext: Option<Vec<crate::archive::Artifact>>,
    /// For a compressed backup: each snapshot's raw size and SHA-256, as
    /// etcd streamed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Vec<crate::archive::Artifact>>,
}

/// For a compressed backup: each snapshot's raw size and SHA-256 (the
/// reports hold what is stored).
fn raw_digests(reports: &[SnapshotReport]) -> Result<Vec<crate::archive::Artifact>, StageFailure> {
    reports
        .iter()
        .map(|r| {
            let raw = r.raw.as_ref().ok_or(StageError::Missing("the raw digest of a compressed snapshot"))?;
            Ok(crate::archive::Artifact { name: Layout::snapshot_name(&r.member), size: raw.size, sha256: raw.sha256.clone() })
        })
        .collect()
}

/// For an encrypted backup: each snapshot's plaintext size and SHA-256 (the
/// reports hold the stored ciphertext's).
fn plaintext_digests(ctx: &BackupContext, reports: &[SnapshotReport]) -> Result<Vec<crate::archive::Artifact>, StageFailure> {
    let Some(sealing) = &ctx.sealing else { return Ok(Vec::new()) };
    let layout = ctx.inputs.layout();
    reports
        .iter()
        .map(|r| {
            let name = Layout::snapshot_name(&r.member);
            let plain = sealing
                .plaintext(&layout.artifact(&name))
                .ok_or(StageError::Missing("the plaintext digest of an encrypted snapshot"))?;
            Ok(crate::archive::Artifact {
                name,
                size: plain.size,
                sha256: plain.sha256,
            })
        })
        .collect()
}

impl StageId for EtcdSnapshot {
    const NAME: &'static str = "etcd-snapshot";
    type Output = Started;
}

#[async_trait]
impl Stage<BackupContext> for EtcdSnapshot {
    fn summary(&self) -> &'static str {
        "start every etcd member's snapshot in parallel (or `concurrency` at a time); once each stream holds the agreed revision the content is fixed and the rest streams to the store in the background"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, step: &Step<'_>) -> Vec<String> {
        let layout = ctx.inputs.layout();
        let concurrency = read_params::<SnapshotParams>(step.params()).ok().and_then(|p| p.concurrency);
        let grouped = concurrency.filter(|n| *n < ctx.members.len()).map(|n| {
            format!("{n} member(s) at a time, each group once the one before is stored: the writers stay down until the last group has started")
        });
        grouped
            .into_iter()
            .chain(ctx.members.iter()
            .map(|m| {
                let encrypted = match ctx.inputs.encrypt_to.is_empty() {
                    true => String::new(),
                    false => format!(", encrypted (age) to {}", ctx.inputs.encrypt_to.join(", ")),
                };
                format!(
                    "stream a snapshot of {} ({}) to {}/{}{encrypted}",
                    m.pod,
                    m.pod_ip,
                    ctx.store.url(),
                    layout.artifact(&Layout::snapshot_name(&m.pod))
                )
            }))
            .collect()
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Started, StageFailure> {
        let concurrency = step.read_params::<SnapshotParams>()?.concurrency;
        ctx.streamed = crate::pipeline::Meter::new();
        step.show(&ctx.streamed);
        let (revision, groups) = start_all(ctx, concurrency).await?;
        let started = ctx.pending.iter().map(|p| p.member.clone()).collect();
        Ok(Started { revision, started, concurrency, groups, skipped: ctx.etcd_health.skipped.clone() })
    }
    fn params(&self) -> Params {
        Params::of::<SnapshotParams>()
    }
    fn restore(&self, ctx: &mut BackupContext, output: Started) -> Result<(), StageFailure> {
        skip(ctx, output.skipped);
        Ok(())
    }
    fn undoable(&self) -> bool {
        true
    }
    /// A failed backup leaves no snapshot bytes behind.
    async fn undo(
        &self,
        ctx: &mut BackupContext,
        _input: UndoInput<'_>,
    ) -> Result<(), StageFailure> {
        discard(ctx).await
    }
}

impl StageId for SnapshotFinish {
    const NAME: &'static str = "snapshot-finish";
    type Output = Snapshots;
}

#[async_trait]
impl Stage<BackupContext> for SnapshotFinish {
    fn summary(&self) -> &'static str {
        "wait for the snapshot streams started by etcd-snapshot to be stored, each with its SHA-256 and etcd's trailing hash checked"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, _ctx: &BackupContext, _step: &Step<'_>) -> Vec<String> {
        vec!["wait for every snapshot stream to be stored and checked".into()]
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Snapshots, StageFailure> {
        let mut revision = step.output_of::<EtcdSnapshot>()?.map(|started| started.revision);
        if ctx.pending.is_empty() {
            // The process that started the streams is gone (a crash, then
            // --resume). With the writers still stopped (no `resume` ran:
            // migrate, or a crash before it) they are simply taken again.
            if step.succeeded::<super::resume::Resume>() {
                return Err(StageError::Precondition(
                    "the snapshot streams were lost with the process that started them, after the writers were resumed; they cannot be taken again at the same revision: take a new backup".into(),
                )
                .into());
            }
            ctx.streamed = crate::pipeline::Meter::new();
            revision = Some(start_all(ctx, concurrency_of(step)?).await?.0);
        }
        step.show(&ctx.streamed);
        let mut reports: Vec<SnapshotReport> = Vec::new();
        let mut errors = Vec::new();
        for pending in ctx.pending.drain(..) {
            match pending.task.await {
                Ok(Ok(report)) => reports.push(report),
                Ok(Err(err)) => errors.push(crate::pipeline::stage::error_chain(&err)),
                Err(err) => errors.push(format!(
                    "{}: the snapshot task ended: {err}",
                    pending.member
                )),
            }
        }
        if !errors.is_empty() {
            return Err(StageError::Precondition(format!(
                "etcd snapshot failed: {}",
                errors.join("; ")
            ))
            .into());
        }
        if let Some(other) = reports.iter().find(|r| Some(r.revision) != revision) {
            return Err(StageError::Precondition(format!(
                "member {} was snapshotted at revision {} but the members agreed on {revision:?}",
                other.member, other.revision
            ))
            .into());
        }
        reports.sort_by(|a, b| a.member.cmp(&b.member));
        let plaintext = plaintext_digests(ctx, &reports)?;
        let raw = match ctx.compressing {
            Some(_) => Some(raw_digests(&reports)?),
            None => None,
        };
        Ok(Snapshots {
            revision,
            snapshots: reports,
            skipped: ctx.etcd_health.skipped.clone(),
            plaintext: ctx.sealing.is_some().then_some(plaintext),
            raw,
        })
    }
    fn restore(&self, ctx: &mut BackupContext, output: Snapshots) -> Result<(), StageFailure> {
        skip(ctx, output.skipped);
        Ok(())
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(
        &self,
        ctx: &mut BackupContext,
        _input: UndoInput<'_>,
    ) -> Result<(), StageFailure> {
        discard(ctx).await
    }
}
