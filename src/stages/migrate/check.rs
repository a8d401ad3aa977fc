//! `destination-check` (read-only), before the source is paused: the move
//! can only succeed if the API server's hostname is stable across
//! management clusters (published through a Route or LoadBalancer with a
//! fixed hostname, which external-dns points at whichever cluster serves
//! it), the destination serves the HyperShift CRDs and has no cluster of
//! that name nor leftovers of one, and the DNS zone answers.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};

use super::MigrateContext;
use crate::hosted::publishing::{PublishedName, in_domain, managed, published_names};
use crate::hosted::{HOSTED_CLUSTER, HostedCluster};
use crate::kube::{api, get_json, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;

pub struct DestinationCheck;

/// What the check found (journaled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checked {
    pub api_hostname: String,
    /// The hostnames hcp-dr's DNS steps manage (inside the zone).
    pub hosts: Vec<String>,
    /// Every name the cluster is reached under, managed or left alone, and why.
    #[serde(default)]
    pub names: Vec<PublishedName>,
}

async fn check(ctx: &mut MigrateContext) -> Result<Checked, StageFailure> {
    let (ns, name) = (ctx.inputs.source.namespace.clone(), ctx.inputs.source.hosted_cluster.clone());
    let label = format!("HostedCluster {ns}/{name}");
    let hc = get_json(&api(&ctx.source.client, &HOSTED_CLUSTER, &ns), &name, &label)
        .await?
        .map(HostedCluster)
        .ok_or_else(|| StageError::Precondition(format!("{label} not found on the source")))?;
    let mut problems = Vec::new();
    let (api_host, hosts) = hc.published_hosts();
    if api_host.is_none() {
        problems.push(format!(
            "{label} does not publish its API server under a fixed hostname (spec.services APIServer: a Route with route.hostname, or a LoadBalancer with loadBalancer.hostname): its address would change with the management cluster and every node and kubeconfig would lose it. Publish it under a hostname (external-dns) first; migrate refuses otherwise"
        ));
    }
    if !hosts.is_empty() && ctx.dns.is_none() {
        problems.push(format!(
            "{label} publishes {} through DNS: pass --route53-zone ZONE-ID so migrate can check the source's records are withdrawn before the destination publishes them",
            hosts.join(", ")
        ));
    }
    let (routes, services) = crate::kube::publishing_objects(&ctx.source.client, &ctx.source.hcp_namespace()).await?;
    let names = published_names(&hc, &routes, &services, ctx.dns.as_ref().map(|z| (z.zone_id(), z.domain())));
    if let (Some(zone), Some(api_host)) = (&ctx.dns, &api_host)
        && !in_domain(api_host, zone.domain())
    {
        problems.push(format!(
            "the API hostname {api_host} is not in Route53 zone {} ({}): give the zone external-dns publishes it in (--route53-zone)",
            zone.zone_id(),
            zone.domain()
        ));
    }
    let hosts = managed(&names);

    // The destination.
    let dest = ctx.destination.client.clone();
    let discovery = crate::kube::discover(&dest, |g| g == HOSTED_CLUSTER.group, "discovering the destination's API groups").await?;
    let gvk = kube::core::GroupVersionKind::gvk(HOSTED_CLUSTER.group, HOSTED_CLUSTER.version, HOSTED_CLUSTER.kind);
    if discovery.resolve_gvk(&gvk).is_none() {
        problems.push("the destination does not serve HostedCluster: install the HyperShift operator there first".into());
    } else if get_json(&api(&dest, &HOSTED_CLUSTER, &ns), &name, &label).await?.is_some() {
        problems.push(format!("{label} already exists on the destination: migrate never overwrites a cluster"));
    }
    let hcp_ns = ctx.source.hcp_namespace();
    let namespaces: Api<Namespace> = Api::all(dest.clone());
    let hc_namespace = namespaces.get_opt(&ns).await.map_err(request(format!("reading Namespace {ns} on the destination")))?;
    let hcp_namespace = namespaces.get_opt(&hcp_ns).await.map_err(request(format!("reading Namespace {hcp_ns} on the destination")))?;
    for (name, live) in [(&ns, &hc_namespace), (&hcp_ns, &hcp_namespace)] {
        problems.extend(crate::kube::terminating_namespace(name, live.as_ref()));
    }
    if hcp_namespace.is_some() {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(dest.clone(), &hcp_ns);
        let pods: Api<Pod> = Api::namespaced(dest.clone(), &hcp_ns);
        let pvcs = pvcs.list(&ListParams::default()).await.map_err(request(format!("listing PVCs in {hcp_ns}")))?.items;
        let pods = pods.list(&ListParams::default()).await.map_err(request(format!("listing Pods in {hcp_ns}")))?.items;
        if !pvcs.is_empty() || !pods.is_empty() {
            problems.push(format!(
                "the HCP namespace {hcp_ns} on the destination is not empty ({} PVC(s), {} pod(s)): leftovers of an earlier attempt would defeat the etcd restore; delete the namespace first",
                pvcs.len(),
                pods.len()
            ));
        }
    }
    if let Some(zone) = &ctx.dns {
        zone.records(&hosts)
            .await
            .map_err(|e| StageError::Precondition(format!("the DNS zone cannot be read: {e}")))?;
    }
    if !problems.is_empty() {
        return Err(StageError::Precondition(format!(
            "the migration cannot start; nothing was changed:\n  - {}",
            problems.join("\n  - ")
        ))
        .into());
    }
    Ok(Checked {
        api_hostname: api_host.unwrap_or_default(),
        hosts,
        names,
    })
}

impl StageId for DestinationCheck {
    const NAME: &'static str = "destination-check";
    type Output = Checked;
}

#[async_trait]
impl Stage<MigrateContext> for DestinationCheck {
    fn summary(&self) -> &'static str {
        "check the API hostname is stable across clusters, the destination is ready (CRDs, name unused, no leftovers) and the DNS zone answers"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, _ctx: &MigrateContext, _step: &Step<'_>) -> Vec<String> {
        vec!["read-only checks".into()]
    }
    async fn run(&self, ctx: &mut MigrateContext, _step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let checked = check(ctx).await?;
        ctx.hosts = checked.hosts.clone();
        ctx.published = checked.names.clone();
        Ok(checked)
    }
    fn restore(&self, ctx: &mut MigrateContext, output: Self::Output) -> Result<(), StageFailure> {
        let checked: Checked = output;
        ctx.hosts = checked.hosts;
        ctx.published = checked.names;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn api_hostname_must_be_fixed() {
        let hc = HostedCluster(json!({"spec": {"services": [
            {"service": "APIServer", "servicePublishingStrategy": {"type": "Route", "route": {"hostname": "api.demo.example.com"}}},
            {"service": "OAuthServer", "servicePublishingStrategy": {"type": "Route", "route": {"hostname": "oauth.demo.example.com"}}},
            {"service": "Ignition", "servicePublishingStrategy": {"type": "Route"}}
        ]}}));
        let (api, hosts) = hc.published_hosts();
        assert_eq!(api.as_deref(), Some("api.demo.example.com"));
        assert_eq!(hosts, vec!["api.demo.example.com", "oauth.demo.example.com"]);
        let hc = HostedCluster(json!({"spec": {"services": [
            {"service": "APIServer", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.1"}}}
        ]}}));
        assert_eq!(hc.published_hosts().0, None);
        let hc = HostedCluster(json!({"spec": {"services": [
            {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer", "loadBalancer": {"hostname": "api.x.example.com"}}}
        ]}}));
        assert_eq!(hc.published_hosts().0.as_deref(), Some("api.x.example.com"));
    }
}
