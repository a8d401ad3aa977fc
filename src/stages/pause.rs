//! `pause`: set `spec.pausedUntil` on the HostedCluster and each of its
//! NodePools to an RFC 3339 deadline (now + pause TTL), never to "true": a
//! crashed run then cannot leave the cluster paused for ever. The previous
//! values are journaled before anything changes, and put back by `resume`
//! or by undo.

use async_trait::async_trait;
use futures::StreamExt;
use chrono::{SecondsFormat, Utc};
use serde_json::{Value, json};

use super::context::{BackupContext, OperatorStandIn, PauseRecord};
use super::StageError;
use crate::hosted::{CAPI_CLUSTER, HOSTED_CLUSTER, HOSTED_CONTROL_PLANE, NODE_POOL};
use crate::kube::{api, get_json, merge_patch, set_paused_until};
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};

pub struct Pause;

/// Wait until the operator has seen the pause: the HostedControlPlane carries
/// it and the HostedCluster reports `ReconciliationActive=False` (when the
/// operator sets that condition). Scaling down before then races with a
/// reconcile already under way, which would scale the writers back up.
/// `false` when the operator did not within `--operator-ack-timeout`.
async fn wait_acknowledged(ctx: &BackupContext, until: &str) -> Result<bool, StageFailure> {
    let ns = &ctx.inputs.namespace;
    let name = &ctx.inputs.hosted_cluster;
    let hcp_ns = ctx.hcp_namespace();
    let what = format!("the operator to acknowledge the pause of {} (HostedControlPlane {hcp_ns}/{name} pausedUntil={until})", ctx.hc_label());
    // looked at again when either object changes (the operator writes the
    // HostedCluster's condition and the HostedControlPlane's pausedUntil),
    // not every tick: the wait costs the same however slow the operator is
    let hcp_api = api(&ctx.client, &HOSTED_CONTROL_PLANE, &hcp_ns);
    let hc_api = api(&ctx.client, &HOSTED_CLUSTER, ns);
    let changes = futures::stream::select(
        crate::kube::changes(&hcp_api, &crate::kube::Watched::named(name)),
        crate::kube::changes(&hc_api, &crate::kube::Watched::named(name)),
    )
    .boxed();
    let waited = crate::kube::wait_on(changes, &what, ctx.inputs.operator_ack_timeout(), std::time::Duration::from_millis(250), || async {
        let hcp = get_json(&hcp_api, name, "HostedControlPlane").await?;
        let hc = get_json(&hc_api, name, "HostedCluster").await?;
        let hcp_paused = hcp.as_ref().is_some_and(|h| h["spec"]["pausedUntil"].as_str() == Some(until));
        let condition = hc.as_ref().and_then(|h| crate::hosted::condition(h, "ReconciliationActive").map(str::to_string));
        let acknowledged = hcp_paused && condition.as_deref() != Some("True");
        Ok(acknowledged.then_some(()))
    })
    .await;
    match waited {
        Ok(()) => Ok(true),
        Err(crate::kube::KubeError::Timeout { .. }) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// What the operator would have paused and what it holds now: the
/// HostedControlPlane (`spec.pausedUntil`) and the Cluster API Cluster
/// named by the HostedCluster's infraID (`spec.paused`).
async fn stand_in_targets(ctx: &BackupContext) -> Result<OperatorStandIn, StageFailure> {
    let (ns, name) = (&ctx.inputs.namespace, &ctx.inputs.hosted_cluster);
    let hcp_ns = ctx.hcp_namespace();
    let mut out = OperatorStandIn { waited_seconds: ctx.inputs.operator_ack_timeout().as_secs(), ..Default::default() };
    if let Some(hcp) = get_json(&api(&ctx.client, &HOSTED_CONTROL_PLANE, &hcp_ns), name, "HostedControlPlane").await? {
        out.hosted_control_plane = Some((name.clone(), hcp["spec"]["pausedUntil"].as_str().map(str::to_string)));
    }
    let hc = get_json(&api(&ctx.client, &HOSTED_CLUSTER, ns), name, "HostedCluster").await?;
    if let Some(infra_id) = hc.as_ref().and_then(|h| h["spec"]["infraID"].as_str())
        && let Some(cluster) = get_json(&api(&ctx.client, &CAPI_CLUSTER, &hcp_ns), infra_id, "Cluster").await?
    {
        out.capi_cluster = Some((infra_id.to_string(), cluster["spec"]["paused"].as_bool()));
    }
    Ok(out)
}

/// Pause what the operator would have: the HostedControlPlane until `until`,
/// the CAPI Cluster with `spec.paused: true`.
async fn stand_in(ctx: &BackupContext, stand_in: &OperatorStandIn, until: &str) -> Result<(), StageFailure> {
    let hcp_ns = ctx.hcp_namespace();
    if let Some((name, _)) = &stand_in.hosted_control_plane {
        set_paused_until(&ctx.client, &HOSTED_CONTROL_PLANE, &hcp_ns, name, Some(until)).await?;
    }
    if let Some((name, _)) = &stand_in.capi_cluster {
        merge_patch(&api(&ctx.client, &CAPI_CLUSTER, &hcp_ns), name, &json!({"spec": {"paused": true}}), &format!("pausing Cluster {hcp_ns}/{name}")).await?;
    }
    Ok(())
}

/// Put back what [`stand_in`] changed, where nobody changed it since.
async fn put_back_stand_in(ctx: &BackupContext, stand_in: &OperatorStandIn, until: &str) -> Result<(), StageFailure> {
    let hcp_ns = ctx.hcp_namespace();
    if let Some((name, previous)) = &stand_in.hosted_control_plane
        && let Some(hcp) = get_json(&api(&ctx.client, &HOSTED_CONTROL_PLANE, &hcp_ns), name, "HostedControlPlane").await?
        && hcp["spec"]["pausedUntil"].as_str() == Some(until)
    {
        set_paused_until(&ctx.client, &HOSTED_CONTROL_PLANE, &hcp_ns, name, previous.as_deref()).await?;
    }
    if let Some((name, previous)) = &stand_in.capi_cluster
        && let Some(cluster) = get_json(&api(&ctx.client, &CAPI_CLUSTER, &hcp_ns), name, "Cluster").await?
        && cluster["spec"]["paused"].as_bool() == Some(true)
        && *previous != Some(true)
    {
        merge_patch(&api(&ctx.client, &CAPI_CLUSTER, &hcp_ns), name, &json!({"spec": {"paused": previous}}), &format!("unpausing Cluster {hcp_ns}/{name}")).await?;
    }
    Ok(())
}

fn targets(ctx: &BackupContext) -> Vec<(String, String)> {
    std::iter::once(("HostedCluster".to_string(), ctx.inputs.hosted_cluster.clone()))
        .chain(ctx.node_pools.iter().map(|np| ("NodePool".to_string(), np.clone())))
        .collect()
}

/// Whether the live `kind`/`name` is another object than the one a run
/// paused: `uids` (`kind/name` -> UID, as pause records journal them) names
/// another UID. An undo leaves such an object alone.
pub fn recreated_since(uids: &std::collections::BTreeMap<String, String>, kind: &str, name: &str, live: &Value) -> bool {
    uids.get(&format!("{kind}/{name}"))
        .is_some_and(|uid| live["metadata"]["uid"].as_str() != Some(uid.as_str()))
}

/// Put every object back to its recorded value.
pub async fn put_back(ctx: &BackupContext, record: &PauseRecord) -> Result<(), StageFailure> {
    for (kind, name, previous) in &record.previous {
        let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
        let live = get_json(&api(&ctx.client, gvk, &ctx.inputs.namespace), name, &format!("{kind} {name}")).await?;
        let Some(live) = live else {
            tracing::warn!("{kind} {}/{name} is gone; nothing to unpause", ctx.inputs.namespace);
            continue;
        };
        if recreated_since(&record.uids, kind, name, &live) {
            tracing::warn!("{kind} {}/{name} is not the object this run paused (it was recreated since); leaving it", ctx.inputs.namespace);
            continue;
        }
        // Someone else changed the pause since: leave their value alone.
        let current = live["spec"]["pausedUntil"].as_str();
        if current != Some(record.until.as_str()) && current != previous.as_deref() {
            tracing::warn!(
                "{kind} {}/{name} has pausedUntil={current:?}, set by someone else since; leaving it",
                ctx.inputs.namespace
            );
            continue;
        }
        set_paused_until(&ctx.client, gvk, &ctx.inputs.namespace, name, previous.as_deref()).await?;
    }
    if let Some(stand_in) = &record.operator_stand_in {
        put_back_stand_in(ctx, stand_in, &record.until).await?;
    }
    Ok(())
}

impl StageId for Pause {
    const NAME: &'static str = "pause";
    type Output = PauseRecord;
}

#[async_trait]
impl Stage<BackupContext> for Pause {
    fn summary(&self) -> &'static str {
        "pause reconciliation of the HostedCluster and its NodePools until a deadline (never \"true\")"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, _step: &Step<'_>) -> Vec<String> {
        targets(ctx)
            .into_iter()
            .map(|(kind, name)| {
                format!(
                    "set spec.pausedUntil on {kind} {}/{name} to now + {}s",
                    ctx.inputs.namespace, ctx.inputs.pause_ttl_seconds
                )
            })
            .collect()
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let until = (Utc::now() + chrono::Duration::seconds(ctx.inputs.pause_ttl_seconds as i64))
            .to_rfc3339_opts(SecondsFormat::Secs, true);
        let mut record = PauseRecord {
            until: until.clone(),
            previous: Vec::new(),
            uids: Default::default(),
            operator_stand_in: None,
        };
        for (kind, name) in targets(ctx) {
            let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
            let live = get_json(&api(&ctx.client, gvk, &ctx.inputs.namespace), &name, &format!("{kind} {name}"))
                .await?
                .ok_or_else(|| StageError::Precondition(format!("{kind} {}/{name} disappeared", ctx.inputs.namespace)))?;
            if let Some(uid) = live["metadata"]["uid"].as_str() {
                record.uids.insert(format!("{kind}/{name}"), uid.to_string());
            }
            record.previous.push((kind, name, live["spec"]["pausedUntil"].as_str().map(str::to_string)));
        }
        // A rerun after a crash part-way must keep the values from before the first try.
        if let Some(first) = step.earlier_progress::<PauseRecord>() {
            record.previous = first.previous;
            record.uids = first.uids;
            record.operator_stand_in = first.operator_stand_in;
        }
        // Journal what will change before changing it.
        step.record(serde_json::to_value(&record)?)?;
        for (kind, name, _) in &record.previous {
            let gvk = if kind == "HostedCluster" { &HOSTED_CLUSTER } else { &NODE_POOL };
            set_paused_until(&ctx.client, gvk, &ctx.inputs.namespace, name, Some(&until)).await?;
        }
        if !wait_acknowledged(ctx, &until).await? {
            // The operator is down or stuck: do what it would have done,
            // journaled first, so the scale-down is not undone behind us.
            let targets = match record.operator_stand_in.take() {
                Some(first) => first,
                None => stand_in_targets(ctx).await?,
            };
            record.operator_stand_in = Some(targets.clone());
            step.record(serde_json::to_value(&record)?)?;
            stand_in(ctx, &targets, &until).await?;
            let line = targets.describe(&ctx.hcp_namespace());
            tracing::warn!("{line}");
            ctx.warnings.push(line);
        }
        Ok(record)
    }
    fn restore(&self, ctx: &mut BackupContext, record: PauseRecord) -> Result<(), StageFailure> {
        if let Some(stand_in) = &record.operator_stand_in {
            ctx.warnings.push(stand_in.describe(&ctx.hcp_namespace()));
        }
        Ok(())
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut BackupContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        match input.record::<PauseRecord>()? {
            Some(record) => put_back(ctx, &record).await,
            None => Ok(()),
        }
    }
}
