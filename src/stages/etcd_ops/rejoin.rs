//! `rejoin`: wait, bounded by `--wait-timeout`, until the StatefulSet has
//! recreated the member with a new pod on a new volume claim, the member is
//! healthy and has caught up with the leader's revision, and the whole
//! cluster is healthy again. A rerun (`--resume`) simply waits again.
//!
//! Caught up: the member's revision is at least the leader's, as read in the
//! same round or the round before (under writes the leader moves on while
//! the member is asked, so "equal right now" may never be seen).
//!
//! Stranded: HyperShift's `reset-member` init container removes the old
//! member and adds the new one only when `etcdctl member list` through the
//! `etcd-client` Service answers; when it does not (no ready endpoint, a
//! leader election, DNS), it says "Cannot list members in cluster, so likely
//! not up yet" and etcd starts as a new cluster that never joins (seen beside
//! a real kube-controller-manager, whose StatefulSet controller recreates the
//! pod within a second, during the election that removing the leader
//! starts). The sign: the new pod's etcd container runs while the healthy
//! members still list the old member id, which `reset-member` would have
//! removed before it. Seen for [`STRANDED_GRACE`], the new claim and pod are
//! deleted again (by uid, the others keeping quorum) so `reset-member` runs
//! once more, at most [`MAX_RESETS`] times; then the recovery fails saying so.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use serde::{Deserialize, Serialize};

use super::RecoverContext;
use super::assess::{Assess, quorum_without};
use super::replace::{Replace, Replaced, delete_claim_and_pod};
use crate::kube::request;
use crate::pipeline::stage::error_chain;
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, read_params};
use crate::stages::params::MemberWait;
use crate::stages::StageError;

pub struct Rejoin;

/// The member back in the cluster (journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejoined {
    pub member: String,
    pub pod_uid: String,
    pub pvc_uid: String,
    pub member_id: Option<String>,
    /// The member's revision once caught up, and the leader's it was compared with.
    pub revision: i64,
    pub leader_revision: i64,
    pub leader: Option<String>,
    /// From the deletion of its pod and volume to healthy and caught up.
    pub seconds: f64,
    /// Every member's revision at the end.
    pub revisions: BTreeMap<String, i64>,
    /// Each time the recreated member started as a cluster of its own and
    /// its claim and pod were deleted again (see the module docs).
    #[serde(default)]
    pub resets: Vec<String>,
}

const POLL: Duration = Duration::from_secs(2);
/// How long a recreated member must look stranded before it is replaced again.
const STRANDED_GRACE: Duration = Duration::from_secs(6);
/// How many times a stranded member is replaced again before giving up.
const MAX_RESETS: usize = 3;

/// One look: done, or what is still missing (and the leader's revision seen).
enum Seen {
    Back(Rejoined),
    Waiting {
        state: String,
        leader_revision: Option<i64>,
    },
    /// The recreated pod (these uids) runs etcd, but the healthy members
    /// still list the old member: `reset-member` did not replace it.
    Stranded {
        pod_uid: String,
        pvc_uid: String,
        state: String,
    },
}

async fn look(
    ctx: &mut RecoverContext,
    replaced: &Replaced,
    old_member_id: Option<&str>,
    previous_leader_revision: Option<i64>,
) -> Result<Seen, StageFailure> {
    let waiting = |state: String, leader_revision: Option<i64>| {
        Ok(Seen::Waiting {
            state,
            leader_revision,
        })
    };
    let hcp_ns = ctx.inputs.hcp_namespace();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let claim = pvcs.get_opt(&replaced.pvc).await.map_err(request(format!(
        "reading PersistentVolumeClaim {hcp_ns}/{}",
        replaced.pvc
    )))?;
    let pvc_uid = match claim.and_then(|c| c.metadata.uid) {
        None => {
            return waiting(
                format!("volume claim {} not recreated yet", replaced.pvc),
                None,
            );
        }
        Some(uid) if uid == replaced.pvc_uid => {
            return waiting(
                format!(
                    "the old volume claim {} is still being deleted",
                    replaced.pvc
                ),
                None,
            );
        }
        Some(uid) => uid,
    };
    let health = ctx.probe().await?;
    let leader_revision = health.revision;
    let Some(member) = health.member(&replaced.member) else {
        return waiting(
            format!("pod {} not recreated yet", replaced.member),
            leader_revision,
        );
    };
    let pod_uid = member.pod_uid.clone().unwrap_or_default();
    if pod_uid == replaced.pod_uid {
        return waiting(
            format!("the old pod {} is still being deleted", replaced.member),
            leader_revision,
        );
    }
    if !member.ok() {
        let old_still_listed = old_member_id.is_some_and(|old| {
            health
                .members
                .iter()
                .filter(|m| m.name != replaced.member && m.ok())
                .filter_map(|m| m.member_list.as_ref())
                .any(|list| list.iter().any(|l| format!("{:x}", l.id) == old))
        });
        if old_still_listed && member.state.as_deref() == Some("Running") {
            return Ok(Seen::Stranded {
                pod_uid,
                pvc_uid,
                state: format!(
                    "{} runs on its new volume but the healthy members still list its old member id {}: its reset-member could not reach the cluster and it started as a cluster of its own ({})",
                    replaced.member,
                    old_member_id.unwrap_or_default(),
                    member.problem().unwrap_or_default()
                ),
            });
        }
        let pod = format!(
            "pod {}, {}",
            member
                .state
                .as_deref()
                .or(member.phase.as_deref())
                .unwrap_or("unknown"),
            if member.ready == Some(true) {
                "ready"
            } else {
                "not ready"
            }
        );
        return waiting(
            format!(
                "{} {} ({pod})",
                replaced.member,
                member.problem().unwrap_or_default()
            ),
            leader_revision,
        );
    }
    if member.ready != Some(true) {
        return waiting(
            format!("{} answers but its pod is not Ready yet", replaced.member),
            leader_revision,
        );
    }
    let (Some(revision), Some(leader)) = (member.revision, leader_revision) else {
        return waiting("no leader revision yet".into(), leader_revision);
    };
    let target = previous_leader_revision.map_or(leader, |previous| previous.min(leader));
    if revision < target {
        return waiting(
            format!(
                "{} is catching up: revision {revision}, leader at {leader}",
                replaced.member
            ),
            leader_revision,
        );
    }
    if !health.healthy {
        return waiting(
            format!(
                "the cluster is not healthy yet: {}",
                health.problems.join("; ")
            ),
            leader_revision,
        );
    }
    Ok(Seen::Back(Rejoined {
        member: replaced.member.clone(),
        pod_uid,
        pvc_uid,
        member_id: member.member_id.clone(),
        revision,
        leader_revision: leader,
        leader: health.leader.clone(),
        seconds: (Utc::now() - replaced.deleted_at).num_milliseconds() as f64 / 1000.0,
        revisions: health
            .members
            .iter()
            .filter_map(|m| m.revision.map(|r| (m.name.clone(), r)))
            .collect(),
        resets: Vec::new(),
    }))
}

/// Delete a stranded member's new claim and pod (by uid, after checking the
/// others keep quorum), so the StatefulSet recreates them and `reset-member`
/// runs again.
async fn replace_again(ctx: &mut RecoverContext, member: &str, pvc: &str, pod_uid: &str, pvc_uid: &str) -> Result<(), StageFailure> {
    let health = ctx.probe().await?;
    quorum_without(&health, member)?;
    delete_claim_and_pod(ctx, member, pvc, pod_uid, pvc_uid).await?;
    Ok(())
}

async fn run(ctx: &mut RecoverContext, mut replaced: Replaced, old_member_id: Option<String>, timeout: Duration) -> Result<Rejoined, StageFailure> {
    let started = Instant::now();
    let mut previous_leader_revision = None;
    let mut last = String::new();
    let mut stranded_since: Option<Instant> = None;
    let mut resets: Vec<String> = Vec::new();
    loop {
        // A failed look (the API server or a member briefly away) is one
        // more reason to wait, not the end of the recovery.
        let seen = look(ctx, &replaced, old_member_id.as_deref(), previous_leader_revision).await;
        if !matches!(seen, Ok(Seen::Stranded { .. })) {
            stranded_since = None;
        }
        let state = match seen {
            Ok(Seen::Back(mut rejoined)) => {
                tracing::info!(member = %rejoined.member, seconds = rejoined.seconds, revision = rejoined.revision, "rejoined");
                rejoined.resets = resets;
                return Ok(rejoined);
            }
            Ok(Seen::Stranded { pod_uid, pvc_uid, state }) => {
                let since = *stranded_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= STRANDED_GRACE {
                    if resets.len() >= MAX_RESETS {
                        return Err(StageError::Precondition(format!(
                            "{state}; its claim and pod were deleted again {MAX_RESETS} times and it never joined: check that the etcd-client Service of {} has the healthy members as endpoints and that {}.etcd-discovery resolves, then run hcp-dr etcd recover --member {} again",
                            ctx.inputs.hcp_namespace(),
                            replaced.member,
                            replaced.member
                        ))
                        .into());
                    }
                    tracing::warn!(member = %replaced.member, attempt = resets.len() + 1, "{state}: deleting its new claim and pod again so reset-member runs once more");
                    replace_again(ctx, &replaced.member, &replaced.pvc, &pod_uid, &pvc_uid).await?;
                    let reset = format!("{state}; deleted claim {} (uid {pvc_uid}) and pod (uid {pod_uid}) again", replaced.pvc);
                    ctx.warnings.push(reset.clone());
                    resets.push(reset);
                    replaced.pod_uid = pod_uid;
                    replaced.pvc_uid = pvc_uid;
                    stranded_since = None;
                }
                state
            }
            Ok(Seen::Waiting {
                state,
                leader_revision,
            }) => {
                previous_leader_revision = leader_revision.or(previous_leader_revision);
                state
            }
            Err(err) => error_chain(err.as_ref()),
        };
        if state != last {
            tracing::info!(member = %replaced.member, elapsed = started.elapsed().as_secs(), "{state}");
            last = state;
        }
        if started.elapsed() >= timeout {
            return Err(StageError::Precondition(format!(
                "etcd member {} did not rejoin within {}s; last seen: {last}",
                replaced.member,
                timeout.as_secs()
            ))
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
}

impl StageId for Rejoin {
    const NAME: &'static str = "rejoin";
    type Output = Rejoined;
}

#[async_trait]
impl Stage<RecoverContext> for Rejoin {
    fn summary(&self) -> &'static str {
        "wait until the member is back with a new pod and volume, healthy and at the leader's revision (--wait-timeout)"
    }
    fn mutates(&self) -> bool {
        // It only waits, but on what `replace` did: a dry-run has nothing to wait for.
        true
    }
    fn params(&self) -> Params {
        Params::of::<MemberWait>()
    }
    fn plan(&self, ctx: &RecoverContext, step: &Step<'_>) -> Vec<String> {
        let timeout = read_params::<MemberWait>(step.params()).ok().and_then(|p| p.timeout().ok().flatten()).unwrap_or(ctx.inputs.wait_timeout());
        let assessment = step.output_of::<Assess>().ok().flatten();
        let member = assessment.as_ref().map_or("the member", |a| a.member.as_str());
        let revision = assessment
            .as_ref()
            .and_then(|a| a.cluster_revision)
            .map_or(String::new(), |r| format!(" (now {r})"));
        vec![format!(
            "wait up to {}s for {member} to come back on a new volume, healthy and at the leader's revision{revision}",
            timeout.as_secs()
        )]
    }
    async fn run(
        &self,
        ctx: &mut RecoverContext,
        step: &mut Step<'_>,
    ) -> Result<Self::Output, StageFailure> {
        let timeout = step.read_params::<MemberWait>()?.timeout()?.unwrap_or(ctx.inputs.wait_timeout());
        let replaced = step.needs::<Replace>()?;
        let old_member_id = step.output_of::<Assess>().ok().flatten().and_then(|a| a.member_id);
        Ok(run(ctx, replaced, old_member_id, timeout).await?)
    }
}
