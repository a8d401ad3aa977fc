//! `dns-withdraw`: the source's records must be gone before the destination
//! publishes the same names (external-dns's TXT registry never takes over
//! another owner's record). external-dns publishes Routes and Services with
//! the hostname annotation (a LoadBalancer with a hostname). On the source
//! (the control-plane operator is scaled down and the cluster paused, so
//! nothing recreates them) the Routes of the HCP namespace are deleted and
//! the Services lose the hostname annotation (they keep their load
//! balancer), and external-dns withdraws the records; with `--dns-direct`
//! the records owned by the source are deleted from the zone directly. Then
//! a bounded wait until the zone holds none of the names in it. Names
//! outside the zone (a Route without a hostname, named in the management
//! cluster's ingress domain) are left alone; `destination-check` reported
//! each with its reason.
//!
//! The Routes and annotations are journaled before they are changed, and
//! `--abort` creates again the Routes still missing and puts the
//! annotations back: their controller would once the pause is lifted and
//! the control-plane operator is back, but a source whose HyperShift
//! operator is down (the case `--operator-ack-timeout` is for) must not come
//! back unreachable. external-dns then publishes them again.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::MigrateContext;
use crate::hosted::publishing::{HOSTNAME_ANNOTATION, PublishedName, hostnames_in, in_domain};
use crate::kube::{is_conflict, is_not_found, request};
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, UndoInput, read_params};
use crate::stages::params::DnsParams;
use crate::stages::StageError;

pub struct DnsWithdraw;

/// What was withdrawn (journaled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Withdrawn {
    pub routes: Vec<String>,
    /// The names waited for (and, with `--dns-direct`, deleted): the
    /// managed ones, and those of the changed Routes and Services in the zone.
    #[serde(alias = "route_hosts")]
    pub hosts: Vec<String>,
    pub deleted_records: Vec<String>,
    pub waited_seconds: f64,
    /// The Routes as they were (server-set metadata stripped), journaled
    /// before they were deleted: `--abort` creates again those missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_routes: Vec<Value>,
    /// Services whose external-dns hostname annotation was removed, with
    /// its value, journaled before: `--abort` puts it back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unannotated: Vec<(String, String)>,
    /// Every name the cluster is reached under, managed or left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<PublishedName>,
}

/// A Route as it can be created again: what the server set is dropped; the
/// owner reference to the HostedControlPlane, still there, is kept.
fn recreatable(route: &Value) -> Value {
    let mut value = route.clone();
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
    value
}

fn routes_api(ctx: &MigrateContext) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.source.client.clone(), &ctx.source.hcp_namespace(), &crate::hosted::ROUTE.api_resource())
}

fn services_api(ctx: &MigrateContext) -> Api<Service> {
    Api::namespaced(ctx.source.client.clone(), &ctx.source.hcp_namespace())
}

async fn run(ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Withdrawn, StageFailure> {
    let wait = step.read_params::<DnsParams>()?.wait()?.unwrap_or(Duration::from_secs(ctx.inputs.dns_wait_seconds));
    let hcp_ns = ctx.source.hcp_namespace();
    let routes = routes_api(ctx);
    let services = services_api(ctx);
    let mut out = Withdrawn { names: ctx.published.clone(), ..Withdrawn::default() };
    let (listed, listed_services) = crate::kube::publishing_objects(&ctx.source.client, &hcp_ns).await?;
    // An attempt killed part-way changed some: keep what it journaled of them.
    let earlier: Withdrawn = step.earlier_progress().unwrap_or_default();
    out.deleted_routes = earlier.deleted_routes;
    out.unannotated = earlier.unannotated;
    for route in &listed {
        let name = route["metadata"]["name"].as_str().unwrap_or_default();
        out.deleted_routes.retain(|r| r["metadata"]["name"].as_str() != Some(name));
        out.deleted_routes.push(recreatable(route));
    }
    for service in &listed_services {
        let Some(value) = service.pointer("/metadata/annotations").and_then(|a| a.get(HOSTNAME_ANNOTATION)).and_then(Value::as_str) else {
            continue;
        };
        let name = service["metadata"]["name"].as_str().unwrap_or_default().to_string();
        out.unannotated.retain(|(n, _)| n != &name);
        out.unannotated.push((name, value.to_string()));
    }
    // Journal them before any is changed.
    step.record(serde_json::to_value(&out)?)?;
    for route in &listed {
        let name = route["metadata"]["name"].as_str().unwrap_or_default().to_string();
        match routes.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(err) if is_not_found(&err) => {}
            Err(err) => return Err(request(format!("deleting Route {hcp_ns}/{name}"))(err).into()),
        }
        out.routes.push(name);
    }
    // A Service keeps its load balancer: only the hostname annotation goes,
    // so external-dns withdraws the name and `--abort` only puts it back.
    for (name, _) in &out.unannotated {
        let patch = json!({"metadata": {"annotations": {HOSTNAME_ANNOTATION: null}}});
        match services.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(err) if is_not_found(&err) => {}
            Err(err) => return Err(request(format!("removing the external-dns hostname annotation of Service {hcp_ns}/{name}"))(err).into()),
        }
    }
    let Some(zone) = ctx.dns.as_ref() else {
        return Ok(out);
    };
    // The managed names, and those of the Routes and Services just changed
    // (and of those an attempt killed part-way already changed) that lie in
    // the zone; the others are left alone (reported by destination-check).
    let mut hosts = ctx.hosts.clone();
    hosts.extend(out.deleted_routes.iter().filter_map(|r| r.pointer("/spec/host").and_then(Value::as_str)).map(str::to_string));
    hosts.extend(out.unannotated.iter().flat_map(|(_, v)| hostnames_in(v)));
    let hosts: Vec<String> = crate::dns::normalize_names(hosts).into_iter().filter(|h| !h.is_empty() && in_domain(h, zone.domain())).collect();
    out.hosts = hosts.clone();
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
        "delete the source's Routes and remove its Services' external-dns hostname annotation so external-dns withdraws its records (or, with --dns-direct, delete them), and wait until the zone holds none"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn params(&self) -> Params {
        Params::of::<DnsParams>()
    }
    fn plan(&self, ctx: &MigrateContext, step: &Step<'_>) -> Vec<String> {
        let wait = read_params::<DnsParams>(step.params()).ok().and_then(|p| p.wait().ok().flatten()).unwrap_or(Duration::from_secs(ctx.inputs.dns_wait_seconds));
        let mut lines = vec![format!(
            "delete the Routes in {ns} on the source and remove the external-dns hostname annotation of its Services",
            ns = ctx.source.hcp_namespace()
        )];
        if ctx.inputs.dns_direct {
            lines.push(format!("delete the records of {} from the zone directly", ctx.hosts.join(", ")));
        }
        lines.push(format!(
            "wait up to {}s until the zone holds no record for {}",
            wait.as_secs(),
            ctx.hosts.join(", ")
        ));
        lines.extend(ctx.published.iter().filter(|n| !n.managed).map(|n| format!("leave alone {} ({}): {}", n.name, n.via, n.why)));
        lines
    }
    async fn run(&self, ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        Ok(run(ctx, step).await?)
    }
    fn undoable(&self) -> bool {
        true
    }
    /// Create again the journaled Routes that are still missing (an existing
    /// one, recreated by its controller since, is left alone), and put the
    /// hostname annotation back on the Services that lack it.
    async fn undo(&self, ctx: &mut MigrateContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(withdrawn) = input.record::<Withdrawn>()? else { return Ok(()) };
        let routes = routes_api(ctx);
        let services = services_api(ctx);
        let hcp_ns = ctx.source.hcp_namespace();
        for (name, value) in &withdrawn.unannotated {
            let what = format!("Service {hcp_ns}/{name}");
            let Some(service) = services.get_opt(name).await.map_err(request(format!("reading {what}")))? else {
                tracing::warn!("{what} is gone: its external-dns hostname annotation ({value}) was not put back");
                continue;
            };
            if service.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(HOSTNAME_ANNOTATION)) {
                continue;
            }
            let patch = json!({"metadata": {"annotations": {HOSTNAME_ANNOTATION: value}}});
            services
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(request(format!("putting the external-dns hostname annotation back on {what}")))?;
            tracing::info!("{what}: external-dns hostname annotation put back");
        }
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
