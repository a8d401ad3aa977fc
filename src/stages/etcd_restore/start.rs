//! `start-etcd`: scale the etcd StatefulSet back to its replicas and wait,
//! bounded by `--wait-timeout`, until every member is healthy (answers, no
//! alarm, a leader, a linearizable read) at a revision at least the
//! snapshot's plus the bump, which is above the revision measured before the
//! restore. A rerun (`--resume`) scales again and waits again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::EtcdRestoreContext;
use super::assess::{Assess, RestorePlan, probe};
use super::stop::{StopEtcd, scale_etcd};
use crate::pipeline::stage::error_chain;
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;

pub struct StartEtcd;

/// The restored cluster (journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Started {
    /// Every member's revision once healthy.
    pub revisions: BTreeMap<String, i64>,
    pub leader: Option<String>,
    /// The revision before the restore, and the least each member had to reach.
    pub revision_before: Option<i64>,
    pub expected_min_revision: i64,
    /// From scaling etcd back to every member healthy.
    pub seconds: f64,
}

const POLL: Duration = Duration::from_secs(2);

/// Wait, bounded by `--wait-timeout`, until every member answers healthy
/// (at `min_revision` or above when given); returns each member's revision
/// and the leader.
pub async fn wait_healthy(ctx: &mut EtcdRestoreContext, plan: &RestorePlan, min_revision: Option<i64>) -> Result<(BTreeMap<String, i64>, Option<String>), StageError> {
    let members: Vec<String> = plan.members.iter().map(|m| m.name.clone()).collect();
    let timeout = ctx.cluster.inputs.wait_timeout();
    let started = Instant::now();
    let mut last = String::from("not looked yet");
    while started.elapsed() < timeout {
        tokio::time::sleep(POLL).await;
        let found = match probe(ctx).await {
            Ok(found) => found,
            Err(err) => {
                last = error_chain(err.as_ref());
                continue;
            }
        };
        let mut revisions = BTreeMap::new();
        let mut waiting = Vec::new();
        for name in &members {
            match found.members.iter().find(|m| &m.name == name) {
                Some(m) if m.ok() => match (m.revision, min_revision) {
                    (Some(rev), Some(min)) if rev < min => waiting.push(format!("{name} at revision {rev}, below {min}")),
                    (None, Some(min)) => waiting.push(format!("{name} at revision None, below {min}")),
                    (rev, _) => {
                        revisions.insert(name.clone(), rev.unwrap_or_default());
                    }
                },
                Some(m) => waiting.push(format!(
                    "{name} not healthy yet ({})",
                    m.last_error.clone().or(m.state.clone()).unwrap_or_else(|| "no answer".into())
                )),
                None => waiting.push(format!("{name} has no pod yet")),
            }
        }
        if waiting.is_empty() && found.healthy {
            return Ok((revisions, found.leader.clone()));
        }
        last = if waiting.is_empty() { found.problems.join("; ") } else { waiting.join("; ") };
    }
    Err(StageError::Precondition(format!(
        "etcd of {} did not come back healthy within {}s: {last}; look at the etcd pods (hcp-dr etcd status), then resume to wait again",
        ctx.hc_label(),
        timeout.as_secs()
    )))
}

impl StageId for StartEtcd {
    const NAME: &'static str = "start-etcd";
    type Output = Started;
}

#[async_trait]
impl Stage<EtcdRestoreContext> for StartEtcd {
    fn summary(&self) -> &'static str {
        "scale etcd back and wait until every member is healthy at a revision above the one before the restore"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &EtcdRestoreContext, step: &Step<'_>) -> Vec<String> {
        let replicas = step.output_of::<Assess>().ok().flatten().map(|p| p.replicas.to_string()).unwrap_or_else(|| "its replicas".into());
        vec![format!(
            "scale StatefulSet {}/etcd back to {replicas} and wait until every member is healthy above the snapshot's revision plus the bump",
            ctx.hcp_namespace()
        )]
    }
    async fn run(&self, ctx: &mut EtcdRestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let plan = step.needs::<Assess>()?;
        let stopped = step.needs::<StopEtcd>()?;
        let started = Instant::now();
        scale_etcd(ctx, stopped.replicas).await?;
        let (revisions, leader) = wait_healthy(ctx, &plan, Some(stopped.expected_min_revision)).await?;
        let done = Started {
            revisions,
            leader,
            revision_before: stopped.revision_before,
            expected_min_revision: stopped.expected_min_revision,
            seconds: started.elapsed().as_secs_f64(),
        };
        Ok(done)
    }
}
