//! `dns-withdraw`: the source's records must be gone before the destination
//! publishes the same names (external-dns's TXT registry never takes over
//! another owner's record). The Routes of the HCP namespace are deleted on
//! the source (the control-plane operator is scaled down and the cluster
//! paused, so nothing recreates them) and external-dns withdraws the
//! records; with `--dns-direct` the records owned by the source are deleted
//! from the zone directly. Then a bounded wait until the zone holds none.
//!
//! The Routes are journaled before they are deleted, and `--abort` creates
//! again those still missing: their controller would once the pause is
//! lifted and the control-plane operator is back, but a source whose
//! HyperShift operator is down (the case `--operator-ack-timeout` is for)
//! must not come back unreachable. external-dns then publishes them again.

use std::time::Duration;

use async_trait::async_trait;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::MigrateContext;
use crate::kube::{is_conflict, is_not_found, request};
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, UndoInput, read_params};
use crate::stages::params::DnsParams;
use crate::stages::StageError;

pub struct DnsWithdraw;

/// What was withdrawn (journaled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Withdrawn {
    pub routes: Vec<String>,
    pub route_hosts: Vec<String>,
    pub deleted_records: Vec<String>,
    pub waited_seconds: f64,
    /// The Routes as they were (server-set metadata stripped), journaled
    /// before they were deleted: `--abort` creates again those missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_routes: Vec<Value>,
}

/// A Route as it can be created again: what the server set is dropped; the
/// owner reference to the HostedControlPlane, still there, is kept.
fn recreatable(route: &DynamicObject) -> Result<Value, StageFailure> {
    let mut value = serde_json::to_value(route)?;
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta.remove(field);
        }
    }
    if let Some(obj) = value.as_object_mut() {
        obj.remove("status");
        // list items do not always carry their type
        let route = &crate::hosted::ROUTE;
        obj.insert("apiVersion".into(), Value::String(format!("{}/{}", route.group, route.version)));
        obj.insert("kind".into(), Value::String(route.kind.into()));
    }
    Ok(value)
}

fn routes_api(ctx: &MigrateContext) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.source.client.clone(), &ctx.source.hcp_namespace(), &crate::hosted::ROUTE.api_resource())
}

async fn run(ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Withdrawn, StageFailure> {
    let wait = step.read_params::<DnsParams>()?.wait()?.unwrap_or(Duration::from_secs(ctx.inputs.dns_wait_seconds));
    let hcp_ns = ctx.source.hcp_namespace();
    let routes = routes_api(ctx);
    let mut out = Withdrawn::default();
    let listed = match routes.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(err) if is_not_found(&err) => Vec::new(),
        Err(err) => return Err(request(format!("listing Routes in {hcp_ns}"))(err).into()),
    };
    // An attempt killed part-way deleted some: keep what it journaled of them.
    let earlier: Withdrawn = step.earlier_progress().unwrap_or_default();
    out.deleted_routes = earlier.deleted_routes;
    for route in &listed {
        let name = route.metadata.name.clone().unwrap_or_default();
        out.deleted_routes.retain(|r| r["metadata"]["name"].as_str() != Some(name.as_str()));
        out.deleted_routes.push(recreatable(route)?);
    }
    // Journal them before any is deleted.
    step.record(serde_json::to_value(&out)?)?;
    for route in &listed {
        let name = route.metadata.name.clone().unwrap_or_default();
        let host = route.data.pointer("/spec/host").and_then(Value::as_str).unwrap_or_default();
        if !host.is_empty() {
            out.route_hosts.push(host.to_string());
        }
        match routes.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(err) if is_not_found(&err) => {}
            Err(err) => return Err(request(format!("deleting Route {hcp_ns}/{name}"))(err).into()),
        }
        out.routes.push(name);
    }
    let mut hosts = ctx.hosts.clone();
    hosts.extend(out.route_hosts.iter().cloned());
    // and those of Routes an attempt killed part-way already deleted
    hosts.extend(out.deleted_routes.iter().filter_map(|r| r.pointer("/spec/host").and_then(Value::as_str)).filter(|h| !h.is_empty()).map(str::to_string));
    hosts.sort();
    hosts.dedup();
    let Some(zone) = ctx.dns.as_ref() else {
        return Ok(out);
    };
    if ctx.inputs.dns_direct {
        let present = zone.cluster_records(&hosts).await?;
        let owners: std::collections::BTreeSet<String> = present.iter().filter_map(|r| r.owner.clone()).collect();
        if owners.len() > 1 {
            return Err(StageError::Precondition(format!(
                "the records of {} have several external-dns owners ({}): hcp-dr will not guess which is the source's; delete the source's by hand or drop --dns-direct to wait for external-dns",
                hosts.join(", "),
                owners.iter().cloned().collect::<Vec<_>>().join(", ")
            ))
            .into());
        }
        for owner in owners {
            let deleted = zone.delete_owned(&hosts, &owner).await?;
            out.deleted_records.extend(deleted.iter().map(|r| r.to_string()));
        }
    }
    let started = std::time::Instant::now();
    zone.wait_gone(&hosts, wait, Duration::from_secs(1))
        .await
        .map_err(|e| StageError::Precondition(e.to_string()))?;
    out.waited_seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

impl StageId for DnsWithdraw {
    const NAME: &'static str = "dns-withdraw";
    type Output = Withdrawn;
}

#[async_trait]
impl Stage<MigrateContext> for DnsWithdraw {
    fn summary(&self) -> &'static str {
        "delete the source's Routes so external-dns withdraws its records (or, with --dns-direct, delete them), and wait until the zone holds none"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn params(&self) -> Params {
        Params::of::<DnsParams>()
    }
    fn plan(&self, ctx: &MigrateContext, step: &Step<'_>) -> Vec<String> {
        let wait = read_params::<DnsParams>(step.params()).ok().and_then(|p| p.wait().ok().flatten()).unwrap_or(Duration::from_secs(ctx.inputs.dns_wait_seconds));
        let mut lines = vec![format!("delete the Routes in {} on the source", ctx.source.hcp_namespace())];
        if ctx.inputs.dns_direct {
            lines.push(format!("delete the records of {} from the zone directly", ctx.hosts.join(", ")));
        }
        lines.push(format!(
            "wait up to {}s until the zone holds no record for {}",
            wait.as_secs(),
            ctx.hosts.join(", ")
        ));
        lines
    }
    async fn run(&self, ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        Ok(run(ctx, step).await?)
    }
    fn undoable(&self) -> bool {
        true
    }
    /// Create again the journaled Routes that are still missing (an existing
    /// one, recreated by its controller since, is left alone).
    async fn undo(&self, ctx: &mut MigrateContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(withdrawn) = input.record::<Withdrawn>()? else { return Ok(()) };
        let routes = routes_api(ctx);
        let hcp_ns = ctx.source.hcp_namespace();
        for route in &withdrawn.deleted_routes {
            let name = route["metadata"]["name"].as_str().unwrap_or_default();
            let what = format!("Route {hcp_ns}/{name}");
            if routes.get_opt(name).await.map_err(request(format!("reading {what}")))?.is_some() {
                continue;
            }
            let object: DynamicObject = serde_json::from_value(route.clone())?;
            match routes.create(&PostParams::default(), &object).await {
                Ok(_) => tracing::info!("{what} created again"),
                Err(err) if is_conflict(&err) => {}
                Err(err) => return Err(request(format!("creating {what} again"))(err).into()),
            }
        }
        Ok(())
    }
}
