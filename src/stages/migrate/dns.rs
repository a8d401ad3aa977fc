//! `dns-withdraw`: the source's records must be gone before the destination
//! publishes the same names (external-dns's TXT registry never takes over
//! another owner's record). The Routes of the HCP namespace are deleted on
//! the source (the control-plane operator is scaled down and the cluster
//! paused, so nothing recreates them) and external-dns withdraws the
//! records; with `--dns-direct` the records owned by the source are deleted
//! from the zone directly. Then a bounded wait until the zone holds none.
//!
//! `--abort` needs no undo here: once the pause is lifted and the
//! control-plane operator is back, the Routes are recreated and external-dns
//! publishes them again.

use std::time::Duration;

use async_trait::async_trait;
use kube::api::{Api, DeleteParams, DynamicObject};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::MigrateContext;
use crate::kube::{is_not_found, request, route_hosts};
use crate::pipeline::{Stage, StageFailure, Step};
use crate::stages::StageError;

pub struct DnsWithdraw;

/// What was withdrawn (journaled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Withdrawn {
    pub routes: Vec<String>,
    pub route_hosts: Vec<String>,
    pub deleted_records: Vec<String>,
    pub waited_seconds: f64,
}

async fn run(ctx: &mut MigrateContext) -> Result<Withdrawn, StageFailure> {
    let hcp_ns = ctx.source.hcp_namespace();
    let routes: Api<DynamicObject> = Api::namespaced_with(ctx.source.client.clone(), &hcp_ns, &crate::hosted::ROUTE.api_resource());
    let mut out = Withdrawn::default();
    for (name, host) in route_hosts(&ctx.source.client, &hcp_ns).await? {
        if !host.is_empty() {
            out.route_hosts.push(host);
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
    zone.wait_gone(&hosts, Duration::from_secs(ctx.inputs.dns_wait_seconds), Duration::from_secs(1))
        .await
        .map_err(|e| StageError::Precondition(e.to_string()))?;
    out.waited_seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

#[async_trait]
impl Stage<MigrateContext> for DnsWithdraw {
    fn name(&self) -> &'static str {
        "dns-withdraw"
    }
    fn summary(&self) -> &'static str {
        "delete the source's Routes so external-dns withdraws its records (or, with --dns-direct, delete them), and wait until the zone holds none"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &MigrateContext, _params: &Value) -> Vec<String> {
        let mut lines = vec![format!("delete the Routes in {} on the source", ctx.source.hcp_namespace())];
        if ctx.inputs.dns_direct {
            lines.push(format!("delete the records of {} from the zone directly", ctx.hosts.join(", ")));
        }
        lines.push(format!(
            "wait up to {}s until the zone holds no record for {}",
            ctx.inputs.dns_wait_seconds,
            ctx.hosts.join(", ")
        ));
        lines
    }
    async fn run(&self, ctx: &mut MigrateContext, _step: &mut Step<'_>) -> Result<Value, StageFailure> {
        Ok(serde_json::to_value(run(ctx).await?)?)
    }
}
