//! `assess` (read-only): read every member's health and decide which member
//! to recover: the one failing member, or the one named with `--member`.
//! Refused, with a typed [`Refusal`] that says what to do instead, when the
//! cluster has one member (its volume is all the data there is), when more
//! than one member fails or the others would not keep a quorum (restore
//! from a backup), when a NOSPACE alarm is raised (replacing a member frees
//! nothing), and when nothing fails and no member was named.

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use serde::{Deserialize, Serialize};

use super::RecoverContext;
use super::health::{ClusterHealth, MemberHealth};
use crate::hosted;
use crate::kube::{KubeError, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;

pub struct Assess;

/// What `assess` decided (journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assessment {
    /// The member (and pod) to recover, e.g. `etcd-1`.
    pub member: String,
    /// Why: what is wrong with it, or that it was named.
    pub reason: String,
    /// The uids of its pod and volume claim now: `replace` deletes exactly
    /// these, `rejoin` waits for others.
    pub pod_uid: String,
    pub pvc: String,
    pub pvc_uid: String,
    pub member_id: Option<String>,
    pub was_leader: bool,
    /// The cluster's (leader's) revision and the member's own, before.
    pub cluster_revision: Option<i64>,
    pub member_revision: Option<i64>,
    /// The cluster's size and the members that keep its quorum meanwhile.
    pub members: usize,
    pub healthy_others: Vec<String>,
}

/// What to do with a cluster: recover one member, or refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Recover { member: String, reason: String },
    Refuse(Refusal),
}

/// Why recovering a member by replacing it is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// One member: its volume is all the data the cluster has.
    #[error(
        "HostedCluster {hosted_cluster} is SingleReplica: its only etcd member holds all the data, and recovering it deletes its volume, which loses everything; restore etcd from a backup instead (hcp-dr etcd restore)"
    )]
    SingleReplica { hosted_cluster: String },
    /// Nothing fails and no member was named.
    #[error("{}", nothing_to_recover(.hosted_cluster, .problems))]
    NothingToRecover {
        hosted_cluster: String,
        problems: Vec<String>,
    },
    /// `--member` names no etcd pod.
    #[error("--member {member} is not an etcd pod of {hcp_namespace} (pods: {})", .pods.join(", "))]
    UnknownMember {
        member: String,
        hcp_namespace: String,
        pods: Vec<String>,
    },
    /// The failing member is in the member list, but no pod runs it.
    #[error(
        "etcd member {member} ({member_id}) is in the member list of {hcp_namespace} but no pod runs it: replacing a pod cannot help; remove it from the cluster (etcdctl member remove {member_id}) and check the etcd StatefulSet's replicas"
    )]
    NoPod {
        member: String,
        member_id: String,
        hcp_namespace: String,
    },
    /// More than one member fails.
    #[error(
        "{} of the {members} etcd members of HostedCluster {hosted_cluster} are failing ({}): members can only be recovered one at a time while the others keep a quorum of {quorum}, and replacing several would lose data; restore etcd from a backup instead (hcp-dr etcd restore)",
        .failing.len(), .failing.join("; ")
    )]
    SeveralFailing {
        hosted_cluster: String,
        failing: Vec<String>,
        members: usize,
        quorum: usize,
    },
    /// Without this member the others would not keep a quorum.
    #[error("{}", quorum_would_be_lost(.member, *.healthy, *.members, *.quorum, .failing))]
    QuorumWouldBeLost {
        member: String,
        healthy: usize,
        members: usize,
        quorum: usize,
        failing: Vec<String>,
    },
    /// The database reached its quota.
    #[error(
        "etcd raised NOSPACE on {}: the database reached its quota, and replacing a member does not free space; compact and defragment, then disarm the alarm (etcdctl compact, etcdctl defrag, etcdctl alarm disarm)",
        .members.join(", ")
    )]
    NoSpace { members: Vec<String> },
}

fn nothing_to_recover(hosted_cluster: &str, problems: &[String]) -> String {
    if problems.is_empty() {
        format!(
            "every etcd member of HostedCluster {hosted_cluster} is healthy: nothing to recover; to rebuild a healthy member's data from the others anyway, name it with --member etcd-N"
        )
    } else {
        format!(
            "no etcd member of HostedCluster {hosted_cluster} fails by itself, but the cluster is degraded ({}): replacing a member does not fix that; see hcp-dr etcd status",
            problems.join("; ")
        )
    }
}

fn quorum_would_be_lost(
    member: &str,
    healthy: usize,
    members: usize,
    quorum: usize,
    failing: &[String],
) -> String {
    let next = if failing.is_empty() {
        "wait until every other member is healthy (hcp-dr etcd status)".to_string()
    } else {
        format!("recover the failing member first ({})", failing.join("; "))
    };
    format!(
        "recovering {member} would leave {healthy} healthy member(s) of {members}, below the quorum of {quorum}: the cluster would stop serving; {next}"
    )
}

/// The smallest majority of `members`.
pub fn quorum(members: usize) -> usize {
    members / 2 + 1
}

/// The cluster's size: what its policy expects, or more if more exist.
pub fn cluster_size(health: &ClusterHealth) -> usize {
    health
        .expected_members
        .max(health.members.len())
        .max(health.listed_members.unwrap_or(0))
}

/// `etcd-1 (unreachable: ...; pod CrashLoopBackOff, 4 restart(s))`, with
/// the error cut short (`hcp-dr etcd status` shows it whole).
pub fn describe(member: &MemberHealth) -> String {
    const LONGEST: usize = 100;
    let mut problem = member.problem().unwrap_or_else(|| "healthy".into());
    if let Some((cut, _)) = problem.char_indices().nth(LONGEST) {
        problem.truncate(cut);
        problem.push_str("...");
    }
    match (&member.state, member.restarts) {
        (Some(state), Some(restarts)) => format!(
            "{} ({problem}; pod {state}, {restarts} restart(s))",
            member.name
        ),
        _ => format!("{} ({problem})", member.name),
    }
}

/// The healthy members other than `member`, when they keep a quorum.
pub fn quorum_without(health: &ClusterHealth, member: &str) -> Result<Vec<String>, Refusal> {
    let members = cluster_size(health);
    let needed = quorum(members);
    let healthy: Vec<String> = health
        .members
        .iter()
        .filter(|m| m.ok() && m.name != member)
        .map(|m| m.name.clone())
        .collect();
    if healthy.len() >= needed {
        return Ok(healthy);
    }
    Err(Refusal::QuorumWouldBeLost {
        member: member.to_string(),
        healthy: healthy.len(),
        members,
        quorum: needed,
        failing: health
            .members
            .iter()
            .filter(|m| !m.ok() && m.name != member)
            .map(describe)
            .collect(),
    })
}

/// Decide from the members' health which member to recover. Pure: the
/// whole policy is here.
pub fn decide(health: &ClusterHealth, requested: Option<&str>) -> Verdict {
    let refuse = Verdict::Refuse;
    if health.expected_members < 2 {
        return refuse(Refusal::SingleReplica {
            hosted_cluster: health.hosted_cluster.clone(),
        });
    }
    let nospace: Vec<String> = health
        .members
        .iter()
        .filter(|m| m.alarms.iter().any(|a| a == "NOSPACE"))
        .map(|m| m.name.clone())
        .collect();
    if !nospace.is_empty() {
        return refuse(Refusal::NoSpace { members: nospace });
    }
    let failing: Vec<&MemberHealth> = health.members.iter().filter(|m| !m.ok()).collect();
    if failing.len() > 1 {
        let members = cluster_size(health);
        return refuse(Refusal::SeveralFailing {
            hosted_cluster: health.hosted_cluster.clone(),
            failing: failing.iter().map(|m| describe(m)).collect(),
            members,
            quorum: quorum(members),
        });
    }
    let target = match requested {
        Some(name) => match health
            .members
            .iter()
            .find(|m| m.pod.as_deref() == Some(name))
        {
            Some(member) => member,
            None => {
                return refuse(Refusal::UnknownMember {
                    member: name.to_string(),
                    hcp_namespace: health.hcp_namespace.clone(),
                    pods: health
                        .members
                        .iter()
                        .filter_map(|m| m.pod.clone())
                        .collect(),
                });
            }
        },
        None => match failing.first() {
            Some(member) => member,
            None => {
                return refuse(Refusal::NothingToRecover {
                    hosted_cluster: health.hosted_cluster.clone(),
                    problems: health.problems.clone(),
                });
            }
        },
    };
    if target.pod.is_none() {
        return refuse(Refusal::NoPod {
            member: target.name.clone(),
            member_id: target.member_id.clone().unwrap_or_default(),
            hcp_namespace: health.hcp_namespace.clone(),
        });
    }
    if let Err(refusal) = quorum_without(health, &target.name) {
        return refuse(refusal);
    }
    let reason = match (requested.is_some(), target.ok()) {
        (true, true) => {
            "named with --member (healthy: its data is rebuilt from the other members)".to_string()
        }
        (true, false) => format!("named with --member: {}", describe(target)),
        (false, _) => describe(target),
    };
    Verdict::Recover {
        member: target.name.clone(),
        reason,
    }
}

/// The volume claims of a StatefulSet's pod: `<template>-<pod>` per claim template.
async fn claim_names(ctx: &RecoverContext, pod: &str) -> Result<Vec<String>, StageFailure> {
    let hcp_ns = ctx.inputs.hcp_namespace();
    let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let set = sets
        .get_opt(hosted::ETCD_STATEFULSET)
        .await
        .map_err(request(format!(
            "reading StatefulSet {hcp_ns}/{}",
            hosted::ETCD_STATEFULSET
        )))?
        .ok_or_else(|| KubeError::NotFound {
            what: format!("StatefulSet {hcp_ns}/{}", hosted::ETCD_STATEFULSET),
            hint: ": nothing would recreate the member's pod; is the control plane fully created?"
                .into(),
        })?;
    Ok(set
        .spec
        .volume_claim_templates
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t.metadata.name.as_ref().map(|n| format!("{n}-{pod}")))
        .collect())
}

async fn run(ctx: &mut RecoverContext) -> Result<Assessment, StageFailure> {
    let health = ctx.probe().await?;
    if let Some(hc) = &ctx.hosted_cluster {
        hc.refuse_if_fenced("recover an etcd member of it").map_err(StageError::Precondition)?;
    }
    let (member, reason) = match decide(&health, ctx.inputs.member.as_deref()) {
        Verdict::Recover { member, reason } => (member, reason),
        Verdict::Refuse(refusal) => return Err(refusal.into()),
    };
    let row = health
        .member(&member)
        .ok_or(StageError::Missing("the chosen member's row"))?;
    let hcp_ns = health.hcp_namespace.clone();
    let claims = claim_names(ctx, &member).await?;
    let pvc = match claims.as_slice() {
        [one] => one.clone(),
        other => {
            return Err(StageError::Precondition(format!(
                "the etcd StatefulSet in {hcp_ns} has {} volume claim template(s), one expected (data): hcp-dr does not know which volume holds the member's data",
                other.len()
            ))
            .into());
        }
    };
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let claim = pvcs
        .get_opt(&pvc)
        .await
        .map_err(request(format!("reading PersistentVolumeClaim {hcp_ns}/{pvc}")))?
        .ok_or_else(|| {
            StageError::Precondition(format!(
                "etcd member {member} has no volume claim {hcp_ns}/{pvc}: the StatefulSet should recreate it with the pod; check kubectl -n {hcp_ns} get pvc,pods"
            ))
        })?;
    Ok(Assessment {
        member: member.clone(),
        reason,
        pod_uid: row.pod_uid.clone().unwrap_or_default(),
        pvc,
        pvc_uid: claim.metadata.uid.unwrap_or_default(),
        member_id: row.member_id.clone(),
        was_leader: row.leader,
        cluster_revision: health.revision,
        member_revision: row.revision,
        members: cluster_size(&health),
        healthy_others: quorum_without(&health, &member).unwrap_or_default(),
    })
}

impl StageId for Assess {
    const NAME: &'static str = "assess";
    type Output = Assessment;
}

#[async_trait]
impl Stage<RecoverContext> for Assess {
    fn summary(&self) -> &'static str {
        "read every member's health; pick the one failing member (or --member); refuse when quorum would be lost, several members fail or the cluster has one"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, _ctx: &RecoverContext, _step: &Step<'_>) -> Vec<String> {
        vec!["read-only checks".into()]
    }
    async fn run(
        &self,
        ctx: &mut RecoverContext,
        _step: &mut Step<'_>,
    ) -> Result<Self::Output, StageFailure> {
        let assessment = run(ctx).await?;
        tracing::info!(member = %assessment.member, reason = %assessment.reason, "recovering");
        Ok(assessment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::context::EtcdAccess;
    use crate::stages::etcd_ops::health::tests::{down, row};

    fn cluster(members: Vec<MemberHealth>, expected: usize) -> ClusterHealth {
        let problems = crate::stages::etcd_ops::health::problems(
            expected,
            "HighlyAvailable",
            &members,
            Some(members.len()),
        );
        ClusterHealth {
            hosted_cluster: "clusters/demo".into(),
            hcp_namespace: "clusters-demo".into(),
            availability_policy: if expected == 1 {
                "SingleReplica"
            } else {
                "HighlyAvailable"
            }
            .into(),
            expected_members: expected,
            access: EtcdAccess::PodIp,
            listed_members: Some(members.len()),
            leader: members.iter().find(|m| m.leader).map(|m| m.name.clone()),
            revision: Some(50),
            healthy: problems.is_empty(),
            problems,
            split: Vec::new(),
            members,
        }
    }

    fn refusal(verdict: Verdict) -> Refusal {
        match verdict {
            Verdict::Refuse(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_one_failing_member_is_recovered() {
        let health = cluster(
            vec![row("etcd-0", true), down("etcd-1"), row("etcd-2", false)],
            3,
        );
        match decide(&health, None) {
            Verdict::Recover { member, reason } => {
                assert_eq!(member, "etcd-1");
                assert_eq!(
                    reason,
                    "etcd-1 (unreachable: connection refused; pod CrashLoopBackOff, 4 restart(s))"
                );
            }
            other => panic!("{other:?}"),
        }
        // naming it gives the same member
        assert!(
            matches!(decide(&health, Some("etcd-1")), Verdict::Recover { member, .. } if member == "etcd-1")
        );
        assert_eq!(
            quorum_without(&health, "etcd-1").unwrap(),
            vec!["etcd-0", "etcd-2"]
        );
    }

    #[test]
    fn a_named_healthy_member_is_recovered_when_the_others_keep_quorum() {
        let health = cluster(
            vec![
                row("etcd-0", true),
                row("etcd-1", false),
                row("etcd-2", false),
            ],
            3,
        );
        assert!(
            matches!(decide(&health, Some("etcd-0")), Verdict::Recover { member, .. } if member == "etcd-0")
        );
        let r = refusal(decide(&health, None));
        assert!(matches!(r, Refusal::NothingToRecover { ref problems, .. } if problems.is_empty()));
        assert!(r.to_string().contains("--member etcd-N"), "{r}");
        let r = refusal(decide(&health, Some("etcd-9")));
        assert_eq!(
            r.to_string(),
            "--member etcd-9 is not an etcd pod of clusters-demo (pods: etcd-0, etcd-1, etcd-2)"
        );
    }

    #[test]
    fn several_failing_members_point_to_restore() {
        let health = cluster(
            vec![row("etcd-0", false), down("etcd-1"), down("etcd-2")],
            3,
        );
        for requested in [None, Some("etcd-1"), Some("etcd-0")] {
            let r = refusal(decide(&health, requested));
            assert!(
                matches!(
                    r,
                    Refusal::SeveralFailing {
                        quorum: 2,
                        members: 3,
                        ..
                    }
                ),
                "{r:?}"
            );
            assert!(r.to_string().contains("hcp-dr etcd restore"), "{r}");
            assert!(r.to_string().starts_with("2 of the 3 etcd members"), "{r}");
        }
    }

    #[test]
    fn naming_a_healthy_member_while_another_fails_would_lose_quorum() {
        let health = cluster(
            vec![row("etcd-0", true), down("etcd-1"), row("etcd-2", false)],
            3,
        );
        let r = refusal(decide(&health, Some("etcd-2")));
        assert!(
            matches!(
                r,
                Refusal::QuorumWouldBeLost {
                    healthy: 1,
                    members: 3,
                    quorum: 2,
                    ..
                }
            ),
            "{r:?}"
        );
        assert!(
            r.to_string()
                .contains("recover the failing member first (etcd-1 (unreachable"),
            "{r}"
        );
    }

    #[test]
    fn a_missing_pod_counts_against_quorum() {
        // three expected, one pod gone entirely, one failing
        let health = cluster(vec![row("etcd-0", true), down("etcd-1")], 3);
        let r = refusal(decide(&health, None));
        assert!(
            matches!(
                r,
                Refusal::QuorumWouldBeLost {
                    healthy: 1,
                    members: 3,
                    ..
                }
            ),
            "{r:?}"
        );
    }

    #[test]
    fn single_replica_nospace_and_podless_members_are_refused() {
        let health = cluster(vec![down("etcd-0")], 1);
        let r = refusal(decide(&health, Some("etcd-0")));
        assert!(matches!(r, Refusal::SingleReplica { .. }));
        assert!(
            r.to_string().contains("loses everything")
                && r.to_string().contains("hcp-dr etcd restore"),
            "{r}"
        );

        let mut full = row("etcd-1", false);
        full.alarms = vec!["NOSPACE".into()];
        let health = cluster(vec![row("etcd-0", true), full, row("etcd-2", false)], 3);
        assert!(
            matches!(refusal(decide(&health, None)), Refusal::NoSpace { members } if members == vec!["etcd-1"])
        );

        let mut stray = down("etcd-3");
        stray.pod = None;
        stray.member_id = Some("abc".into());
        let health = cluster(
            vec![
                row("etcd-0", true),
                row("etcd-1", false),
                row("etcd-2", false),
                stray,
            ],
            3,
        );
        let r = refusal(decide(&health, None));
        assert!(
            matches!(r, Refusal::NoPod { ref member_id, .. } if member_id == "abc"),
            "{r:?}"
        );
    }

    #[test]
    fn long_errors_are_cut_short_in_messages() {
        let mut member = down("etcd-1");
        member.last_error = Some("é".repeat(300));
        let text = describe(&member);
        assert!(text.starts_with("etcd-1 (unreachable: éé"), "{text}");
        assert!(
            text.ends_with("...; pod CrashLoopBackOff, 4 restart(s))"),
            "{text}"
        );
        assert_eq!(
            text.chars().filter(|c| *c == 'é').count(),
            100 - "unreachable: ".len()
        );
    }

    #[test]
    fn a_corrupt_member_is_failing_even_when_it_answers() {
        let mut corrupt = row("etcd-2", false);
        corrupt.alarms = vec!["CORRUPT".into()];
        let health = cluster(vec![row("etcd-0", true), row("etcd-1", false), corrupt], 3);
        match decide(&health, None) {
            Verdict::Recover { member, reason } => {
                assert_eq!(member, "etcd-2");
                assert!(reason.contains("alarm CORRUPT"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
