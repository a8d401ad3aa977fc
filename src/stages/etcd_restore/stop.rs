//! `stop-etcd`: with the writers stopped, read the revision the members
//! reached (it no longer moves) and decide the `--bump-revision`: the
//! restored cluster must start above every revision a client may have seen,
//! or watchers would see time go backwards. Then scale the etcd StatefulSet
//! to zero and wait until its pods are gone. Undo scales it back.
//!
//! The revision is measured when a quorum of members answers (any committed
//! revision is on a quorum, so the highest they report covers it); the bump
//! is then the distance from the snapshot plus a margin. Without a quorum it
//! cannot be measured and etcd's recovery guide's 1,000,000,000 is used,
//! unless `--bump-revision` says otherwise.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};

use super::assess::{Assess, revisions};
use super::fetch::FetchSnapshot;
use super::{BUMP_MARGIN, BUMP_UNMEASURED, EtcdRestoreContext};
use crate::hosted;
use crate::kube::{KubeError, Watched, request, wait_watching};
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::etcd_ops::assess::quorum;
use crate::stages::StageError;

pub struct StopEtcd;

/// What `stop-etcd` measured and did (journaled before scaling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stopped {
    /// The StatefulSet's replicas before (scaled back to this).
    pub replicas: i32,
    /// The highest revision the members reported with the writers stopped.
    pub revision_before: Option<i64>,
    /// Whether a quorum answered (the revision is then known).
    pub measured: bool,
    pub bump: u64,
    /// The snapshot's revision plus the bump: every member must start at or above it.
    pub expected_min_revision: i64,
    /// The StatefulSet's UID: the undo scales back only that object (absent
    /// in journals of older hcp-dr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// The bump for a snapshot at `snapshot_revision` (pure, for tests).
pub fn choose_bump(snapshot_revision: i64, revision_before: Option<i64>, measured: bool, given: Option<u64>) -> Result<u64, String> {
    let needed = match (measured, revision_before) {
        (true, Some(before)) => Some((before - snapshot_revision).max(0) as u64 + 1),
        _ => None,
    };
    match (given, needed) {
        (Some(given), Some(needed)) if given < needed => Err(format!(
            "--bump-revision {given} is too small: the cluster reached revision {}, the snapshot is at {snapshot_revision}, so the bump must be at least {needed} or watchers would see revisions go backwards",
            revision_before.unwrap_or_default()
        )),
        (Some(given), _) => Ok(given),
        (None, Some(needed)) => Ok(needed - 1 + BUMP_MARGIN),
        (None, None) => Ok(BUMP_UNMEASURED),
    }
}

/// Scale the etcd StatefulSet through its scale subresource.
pub async fn scale_etcd(ctx: &EtcdRestoreContext, replicas: i32) -> Result<(), KubeError> {
    scale_etcd_if(ctx, replicas, None).await.map(|_| ())
}

/// Scale the etcd StatefulSet only if it is still the object with `uid`
/// (a precondition the server checks on the scale subresource). False: it
/// was replaced by another of that name, which is left alone.
pub async fn scale_etcd_if(ctx: &EtcdRestoreContext, replicas: i32, uid: Option<&str>) -> Result<bool, KubeError> {
    let ns = ctx.hcp_namespace();
    let api: Api<StatefulSet> = Api::namespaced(ctx.cluster.client.clone(), &ns);
    crate::kube::scale_if(&api, hosted::ETCD_STATEFULSET, replicas, uid, &format!("StatefulSet {ns}/etcd")).await
}

async fn statefulset_uid(ctx: &EtcdRestoreContext) -> Result<Option<String>, KubeError> {
    let ns = ctx.hcp_namespace();
    let api: Api<StatefulSet> = Api::namespaced(ctx.cluster.client.clone(), &ns);
    let sts = api
        .get(hosted::ETCD_STATEFULSET)
        .await
        .map_err(request(format!("reading StatefulSet {ns}/etcd")))?;
    Ok(sts.metadata.uid)
}

async fn wait_no_etcd_pods(ctx: &EtcdRestoreContext) -> Result<(), KubeError> {
    let ns = ctx.hcp_namespace();
    let pods: Api<Pod> = Api::namespaced(ctx.cluster.client.clone(), &ns);
    let what = format!("the etcd pods in {ns} to terminate");
    wait_watching(&pods, Watched::labelled(hosted::ETCD_POD_SELECTOR), &what, ctx.cluster.inputs.wait_timeout(), Duration::from_millis(250), || async {
        let left = pods
            .list(&ListParams::default().labels(hosted::ETCD_POD_SELECTOR))
            .await
            .map_err(request(format!("listing etcd pods in {ns}")))?;
        Ok(left.items.is_empty().then_some(()))
    })
    .await
}

impl StageId for StopEtcd {
    const NAME: &'static str = "stop-etcd";
    type Output = Stopped;
}

#[async_trait]
impl Stage<EtcdRestoreContext> for StopEtcd {
    fn summary(&self) -> &'static str {
        "read the revision the members reached, choose the revision bump, scale etcd to zero and wait until its pods are gone"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &EtcdRestoreContext, step: &Step<'_>) -> Vec<String> {
        let ns = ctx.hcp_namespace();
        let mut lines = vec![format!(
            "read every member's revision (the writers are stopped) and bump the restored revision above it{}",
            ctx.inputs.bump_revision.map(|b| format!(" (--bump-revision {b})")).unwrap_or_default()
        )];
        if let Some(plan) = step.output_of::<Assess>().ok().flatten() {
            lines.push(format!("scale StatefulSet {ns}/etcd from {} to 0 and wait until its pods are gone", plan.replicas));
        }
        lines
    }
    async fn run(&self, ctx: &mut EtcdRestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let plan = step.needs::<Assess>()?;
        let snapshot = step.needs::<FetchSnapshot>()?;
        let stopped = match step.earlier_progress::<Stopped>() {
            // A rerun after a crash: etcd may be down already; keep the first measurement.
            Some(first) => first,
            None => {
                let seen = revisions(ctx).await?;
                let answered: Vec<i64> = plan.members.iter().filter_map(|m| seen.get(&m.name).copied().flatten()).collect();
                let measured = answered.len() >= quorum(plan.members.len());
                let revision_before = answered.iter().max().copied();
                let bump = choose_bump(snapshot.revision, revision_before, measured, ctx.inputs.bump_revision).map_err(StageError::Precondition)?;
                if !measured && ctx.inputs.bump_revision.is_none() {
                    ctx.warn(format!(
                        "only {} of {} members answered, so the revision the cluster reached is unknown: bumping by {bump} (pass --bump-revision to choose)",
                        answered.len(),
                        plan.members.len()
                    ));
                }
                Stopped {
                    replicas: plan.replicas,
                    revision_before,
                    measured,
                    bump,
                    expected_min_revision: snapshot.revision + bump as i64,
                    uid: statefulset_uid(ctx).await?,
                }
            }
        };
        step.record(serde_json::to_value(&stopped)?)?;
        scale_etcd(ctx, 0).await?;
        wait_no_etcd_pods(ctx).await?;
        Ok(stopped)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut EtcdRestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        match input.record::<Stopped>()? {
            Some(stopped) => {
                if !scale_etcd_if(ctx, stopped.replicas, stopped.uid.as_deref()).await? {
                    ctx.warn(format!(
                        "StatefulSet {}/etcd was left alone: it is not the one this run scaled down (UID {}), so the undo did not scale it",
                        ctx.hcp_namespace(),
                        stopped.uid.as_deref().unwrap_or("-")
                    ));
                    return Ok(());
                }
                // the old members are the cluster again: back in service
                // only once they answer, before the writers return
                if let Some(plan) = input.output_of::<Assess>()? {
                    super::start::wait_healthy(ctx, &plan, None).await?;
                }
                Ok(())
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measured_bump_covers_the_distance_and_a_margin() {
        assert_eq!(choose_bump(100, Some(250), true, None).unwrap(), 150 + BUMP_MARGIN);
        assert_eq!(choose_bump(100, Some(90), true, None).unwrap(), BUMP_MARGIN);
    }

    #[test]
    fn an_unmeasured_bump_is_large_unless_given() {
        assert_eq!(choose_bump(100, Some(250), false, None).unwrap(), BUMP_UNMEASURED);
        assert_eq!(choose_bump(100, None, false, Some(5000)).unwrap(), 5000);
    }

    #[test]
    fn a_given_bump_below_the_distance_is_refused() {
        let err = choose_bump(100, Some(250), true, Some(100)).unwrap_err();
        assert!(err.contains("at least 151"), "{err}");
        assert_eq!(choose_bump(100, Some(250), true, Some(151)).unwrap(), 151);
    }
}
