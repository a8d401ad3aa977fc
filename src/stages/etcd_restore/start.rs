//! `start-etcd`: scale the etcd StatefulSet back to its replicas and wait,
//! bounded by `--wait-timeout`, until every member is healthy (answers, no
//! alarm, a leader, a linearizable read) at a revision at least the
//! snapshot's plus the bump, which is above the revision measured before the
//! restore. A rerun (`--resume`) scales again and waits again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::EtcdRestoreContext;
use super::assess::probe;
use super::stop::scale_etcd;
use crate::pipeline::stage::error_chain;
use crate::pipeline::{Stage, StageFailure, Step};
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

#[async_trait]
impl Stage<EtcdRestoreContext> for StartEtcd {
    fn name(&self) -> &'static str {
        "start-etcd"
    }
    fn summary(&self) -> &'static str {
        "scale etcd back and wait until every member is healthy at a revision above the one before the restore"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &EtcdRestoreContext, _params: &Value) -> Vec<String> {
        let replicas = ctx.plan.as_ref().map(|p| p.replicas.to_string()).unwrap_or_else(|| "its replicas".into());
        vec![format!(
            "scale StatefulSet {}/etcd back to {replicas} and wait until every member is healthy above the snapshot's revision plus the bump",
            ctx.hcp_namespace()
        )]
    }
    async fn run(&self, ctx: &mut EtcdRestoreContext, _step: &mut Step<'_>) -> Result<Value, StageFailure> {
        let plan = ctx.plan.clone().ok_or(StageError::Missing("the restore plan (assess)"))?;
        let stopped = ctx.stopped.clone().ok_or(StageError::Missing("the revision bump (stop-etcd)"))?;
        let started = Instant::now();
        scale_etcd(ctx, stopped.replicas).await?;
        let timeout = ctx.cluster.inputs.wait_timeout();
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
            for member in &plan.members {
                match found.members.iter().find(|m| m.name == member.name) {
                    Some(m) if m.ok() => match m.revision {
                        Some(rev) if rev >= stopped.expected_min_revision => {
                            revisions.insert(member.name.clone(), rev);
                        }
                        rev => waiting.push(format!("{} at revision {rev:?}, below {}", member.name, stopped.expected_min_revision)),
                    },
                    Some(m) => waiting.push(format!(
                        "{} not healthy yet ({})",
                        member.name,
                        m.last_error.clone().or(m.state.clone()).unwrap_or_else(|| "no answer".into())
                    )),
                    None => waiting.push(format!("{} has no pod yet", member.name)),
                }
            }
            if waiting.is_empty() && found.healthy {
                let done = Started {
                    revisions,
                    leader: found.leader.clone(),
                    revision_before: stopped.revision_before,
                    expected_min_revision: stopped.expected_min_revision,
                    seconds: started.elapsed().as_secs_f64(),
                };
                return Ok(serde_json::to_value(done)?);
            }
            last = if waiting.is_empty() { found.problems.join("; ") } else { waiting.join("; ") };
        }
        Err(StageError::Precondition(format!(
            "etcd of {} did not come back healthy within {}s: {last}; look at the etcd pods (hcp-dr etcd status), then resume to wait again",
            ctx.hc_label(),
            timeout.as_secs()
        ))
        .into())
    }
}
