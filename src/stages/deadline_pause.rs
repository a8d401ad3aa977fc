//! `pause` for the operations that hold a cluster still while they work on
//! it (`cluster destroy`, `fence`): `spec.pausedUntil` on the HostedCluster
//! and its NodePools set to a deadline, the previous values journaled first
//! and put back by undo. A pause already in place that lasts longer (a
//! fence's far deadline, or `true`) is kept, never shortened: destroying a
//! fenced copy must not let it start again when a short deadline passes.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::hosted::{HOSTED_CLUSTER, NODE_POOL, longest_pause};
use crate::kube::{api, get_json, list_json, set_paused_until};
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::StageError;

/// What a context gives the stage: the cluster and how long to pause it.
pub trait PauseScope: Send + Sync {
    fn client(&self) -> &kube::Client;
    /// `(namespace, name)` of the HostedCluster.
    fn cluster(&self) -> (&str, &str);
    /// The pause lasts this long from now (unless a longer one is in place).
    fn pause_seconds(&self) -> u64;
}

/// What `pause` changed: `(kind, name, previous pausedUntil)`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    pub until: String,
    pub previous: Vec<(String, String, Option<String>)>,
    /// `kind/name` -> the UID paused: the undo leaves an object recreated
    /// since alone (absent in journals of older hcp-dr).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub uids: std::collections::BTreeMap<String, String>,
}

pub struct DeadlinePause;

impl StageId for DeadlinePause {
    const NAME: &'static str = "pause";
    type Output = Paused;
}

#[async_trait]
impl<C: PauseScope + 'static> Stage<C> for DeadlinePause {
    fn summary(&self) -> &'static str {
        "pause the HostedCluster and its NodePools until a deadline (a longer pause in place is kept), so the operator recreates nothing meanwhile"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &C, _step: &Step<'_>) -> Vec<String> {
        let (ns, name) = ctx.cluster();
        vec![format!(
            "set spec.pausedUntil on HostedCluster {ns}/{name} and its NodePools to now + {}s (a longer pause in place is kept)",
            ctx.pause_seconds()
        )]
    }
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let (ns, name) = (ctx.cluster().0.to_string(), ctx.cluster().1.to_string());
        let client = ctx.client().clone();
        let label = format!("HostedCluster {ns}/{name}");
        let hc = get_json(&api(&client, &HOSTED_CLUSTER, &ns), &name, &label)
            .await?
            .ok_or_else(|| StageError::Precondition(format!("{label} not found")))?;
        let mut record = Paused {
            until: (chrono::Utc::now() + chrono::Duration::seconds(ctx.pause_seconds() as i64))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            previous: vec![("HostedCluster".into(), name.clone(), hc["spec"]["pausedUntil"].as_str().map(str::to_string))],
            uids: hc["metadata"]["uid"].as_str().map(|uid| (format!("HostedCluster/{name}"), uid.to_string())).into_iter().collect(),
        };
        for np in list_json(&api(&client, &NODE_POOL, &ns), &Default::default(), "NodePools").await? {
            if np["spec"]["clusterName"].as_str() == Some(name.as_str()) {
                let np_name = np["metadata"]["name"].as_str().unwrap_or_default().to_string();
                if let Some(uid) = np["metadata"]["uid"].as_str() {
                    record.uids.insert(format!("NodePool/{np_name}"), uid.to_string());
                }
                record.previous.push(("NodePool".into(), np_name, np["spec"]["pausedUntil"].as_str().map(str::to_string)));
            }
        }
        if let Some(first) = step.earlier_progress::<Paused>() {
            record.previous = first.previous;
            record.uids = first.uids;
        }
        step.record(serde_json::to_value(&record)?)?;
        for (kind, object, previous) in &record.previous {
            let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
            let value = longest_pause(previous.as_deref(), &record.until);
            set_paused_until(&client, gvk, &ns, object, Some(&value)).await?;
        }
        Ok(record)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut C, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = input.record::<Paused>()? else { return Ok(()) };
        let ns = ctx.cluster().0.to_string();
        let client = ctx.client().clone();
        for (kind, object, previous) in &record.previous {
            let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
            let Some(live) = get_json(&api(&client, gvk, &ns), object, &format!("{kind} {ns}/{object}")).await? else { continue };
            if crate::stages::pause::recreated_since(&record.uids, kind, object, &live) {
                tracing::warn!("{kind} {ns}/{object} is not the object this run paused (it was recreated since); leaving it");
                continue;
            }
            set_paused_until(&client, gvk, &ns, object, previous.as_deref()).await?;
        }
        Ok(())
    }
}
