//! A simulated external-dns (TXT registry, Route and Service sources, the
//! zone's domain as domain filter): for every Route labelled
//! `hypershift.openshift.io/hosted-control-plane`, an A record `spec.host` →
//! the hosted API address, and for every Service of type LoadBalancer with
//! the `external-dns.alpha.kubernetes.io/hostname` annotation, an A record
//! per hostname → its load balancer's IP; each with an owner TXT record
//! `"heritage=external-dns,external-dns/owner=<mgmt cluster>,external-dns/resource=route/<ns>/<name>"`
//! (`service/...` for a Service),
//! UPSERTed into the Route53 zone; records this owner created whose Route is
//! gone are deleted. Records owned by another owner are left alone (as the real
//! TXT registry does): a migrated cluster's name is only taken over once the
//! source cluster's external-dns has withdrawn it.

use std::collections::HashMap;

use aws_sdk_route53::Client;
use aws_sdk_route53::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_route53::types::{
    Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType,
};
use serde_json::Value;

use super::hypershift::{CLUSTER_ANNOTATION, HCP_LABEL};
use super::objects::{self, HOSTED_CONTROL_PLANE, ROUTE, SERVICE, name_of, ns_of, str_at};
use super::publishing::HOSTNAME_ANNOTATION;
use super::{Ctx, OperatorError, Route53Config};

/// TTL of the records written.
pub const TTL: i64 = 30;

/// The external-dns controller of one management cluster.
pub struct ExternalDns {
    client: Client,
    zone_id: String,
    /// The domain filter: only names inside it are published.
    domain: String,
}

fn r53_err(action: &str) -> impl FnOnce(String) -> OperatorError + '_ {
    move |message| OperatorError::Route53 {
        action: action.to_string(),
        message,
    }
}

/// The owner TXT value of a Route's record (quoted, as stored in Route53).
pub fn owner_txt(owner: &str, route_ns: &str, route_name: &str) -> String {
    owner_txt_of(owner, "route", route_ns, route_name)
}

/// The owner TXT value of the record of a `kind` (`route`, `service`) object.
pub fn owner_txt_of(owner: &str, kind: &str, ns: &str, name: &str) -> String {
    format!(
        "\"heritage=external-dns,external-dns/owner={owner},external-dns/resource={kind}/{ns}/{name}\""
    )
}

/// The owner named in an external-dns TXT value, if it is one.
pub fn txt_owner(value: &str) -> Option<String> {
    let v = value.trim_matches('"');
    if !v.starts_with("heritage=external-dns") {
        return None;
    }
    v.split(',')
        .find_map(|kv| kv.strip_prefix("external-dns/owner=").map(str::to_string))
}

fn record(
    name: &str,
    rr_type: RrType,
    values: &[String],
    ttl: Option<i64>,
) -> Result<ResourceRecordSet, OperatorError> {
    let mut b = ResourceRecordSet::builder()
        .name(name)
        .r#type(rr_type)
        .set_ttl(Some(ttl.unwrap_or(TTL)));
    for v in values {
        b = b.resource_records(
            ResourceRecord::builder()
                .value(v)
                .build()
                .map_err(|e| r53_err("building record")(e.to_string()))?,
        );
    }
    b.build()
        .map_err(|e| r53_err("building record set")(e.to_string()))
}

fn change(action: ChangeAction, rrs: ResourceRecordSet) -> Result<Change, OperatorError> {
    Change::builder()
        .action(action)
        .resource_record_set(rrs)
        .build()
        .map_err(|e| r53_err("building change")(e.to_string()))
}

/// A record set as listed: values and TTL.
#[derive(Debug, Clone)]
struct Listed {
    values: Vec<String>,
    ttl: Option<i64>,
}

impl ExternalDns {
    /// A client for the zone (dummy credentials; moto does not check them).
    pub fn new(cfg: &Route53Config) -> ExternalDns {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let conf = aws_sdk_route53::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(cfg.region.clone()))
            .endpoint_url(&cfg.endpoint_url)
            .credentials_provider(Credentials::new(
                "sandbox",
                "sandbox",
                None,
                None,
                "hcp-dr-sandbox",
            ))
            .http_client(http)
            .build();
        ExternalDns {
            client: Client::from_conf(conf),
            zone_id: cfg.zone_id.clone(),
            domain: cfg.domain.clone(),
        }
    }

    async fn list(&self) -> Result<HashMap<(String, String), Listed>, OperatorError> {
        let mut out = HashMap::new();
        let mut start: Option<(String, RrType)> = None;
        loop {
            let mut req = self
                .client
                .list_resource_record_sets()
                .hosted_zone_id(&self.zone_id);
            if let Some((name, t)) = start.take() {
                req = req.start_record_name(name).start_record_type(t);
            }
            let page = req
                .send()
                .await
                .map_err(|e| r53_err("ListResourceRecordSets")(format!("{e:?}")))?;
            for rrs in page.resource_record_sets() {
                let name = rrs.name().trim_end_matches('.').to_string();
                let values = rrs
                    .resource_records()
                    .iter()
                    .map(|r| r.value().to_string())
                    .collect();
                out.insert(
                    (name, rrs.r#type().as_str().to_string()),
                    Listed {
                        values,
                        ttl: rrs.ttl(),
                    },
                );
            }
            match (
                page.is_truncated(),
                page.next_record_name(),
                page.next_record_type(),
            ) {
                (true, Some(n), Some(t)) => start = Some((n.to_string(), t.clone())),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Whether external-dns may publish `host`: its domain filter is the
    /// zone's domain.
    fn in_domain(host: &str, domain: &str) -> bool {
        let domain = domain.trim_end_matches('.');
        host == domain || host.ends_with(&format!(".{domain}"))
    }

    /// The records wanted: host → (A value, TXT value). Sources: Routes of
    /// HCP namespaces (their `spec.host`, the address of the hosted API
    /// behind the router) and Services of type LoadBalancer with the
    /// hostname annotation (their load balancer's IP), each only inside
    /// the zone's domain.
    async fn desired(&self, ctx: &Ctx, domain: &str) -> Result<HashMap<String, (String, String)>, OperatorError> {
        let routes = match ctx.kube.list(&ROUTE, None, Some(HCP_LABEL)).await {
            Ok(r) => r,
            Err(e) if objects::status_code(&e) == Some(404) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut want = HashMap::new();
        let mut clusters: HashMap<String, Option<String>> = HashMap::new();
        for route in &routes {
            let Some(host) = str_at(route, "/spec/host").filter(|h| !h.is_empty()) else {
                continue;
            };
            let host = host.trim_end_matches('.').to_string();
            if !Self::in_domain(&host, domain) {
                continue;
            }
            let ns = ns_of(route).to_string();
            if !clusters.contains_key(&ns) {
                let hcps = ctx
                    .kube
                    .list(&HOSTED_CONTROL_PLANE, Some(&ns), None)
                    .await?;
                let cluster = hcps.iter().find_map(|h| {
                    h.pointer("/metadata/annotations")
                        .and_then(|a| a.get(CLUSTER_ANNOTATION))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
                clusters.insert(ns.clone(), cluster);
            }
            let Some(Some(cluster)) = clusters.get(&ns) else {
                continue;
            };
            let Some((hc_ns, hc_name)) = cluster.split_once('/') else {
                continue;
            };
            let (ip, _) =
                super::hosted_api::hosted_api_address(&ctx.cfg.sandbox_id, &ctx.cfg.cluster_name, hc_ns, hc_name);
            want.insert(
                host,
                (
                    ip.to_string(),
                    owner_txt(&ctx.cfg.cluster_name, &ns, name_of(route)),
                ),
            );
        }
        for service in ctx.kube.list(&SERVICE, None, None).await? {
            let Some(hostnames) = service
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(HOSTNAME_ANNOTATION))
                .and_then(Value::as_str)
            else {
                continue;
            };
            if str_at(&service, "/spec/type") != Some("LoadBalancer") {
                continue;
            }
            let Some(ip) = str_at(&service, "/status/loadBalancer/ingress/0/ip") else {
                continue;
            };
            for host in hostnames.split(',').map(|h| h.trim().trim_end_matches('.')).filter(|h| !h.is_empty()) {
                if Self::in_domain(host, domain) {
                    let txt = owner_txt_of(&ctx.cfg.cluster_name, "service", ns_of(&service), name_of(&service));
                    want.insert(host.to_string(), (ip.to_string(), txt));
                }
            }
        }
        Ok(want)
    }

    /// One reconcile pass.
    pub(crate) async fn sync(&self, ctx: &Ctx) -> Result<(), OperatorError> {
        let me = ctx.cfg.cluster_name.as_str();
        let want = self.desired(ctx, &self.domain).await?;
        let have = self.list().await?;
        let mut changes = Vec::new();
        for (host, (ip, txt)) in &want {
            let existing_txt = have.get(&(host.clone(), "TXT".into()));
            let owner = existing_txt.and_then(|t| t.values.iter().find_map(|v| txt_owner(v)));
            if let Some(o) = &owner
                && o != me
            {
                tracing::debug!(host, owner = %o, "record owned by another external-dns: not taking over");
                continue;
            }
            if have.get(&(host.clone(), "A".into())).map(|a| &a.values) != Some(&vec![ip.clone()]) {
                changes.push(change(
                    ChangeAction::Upsert,
                    record(host, RrType::A, std::slice::from_ref(ip), None)?,
                )?);
            }
            if existing_txt.map(|t| &t.values) != Some(&vec![txt.clone()]) {
                changes.push(change(
                    ChangeAction::Upsert,
                    record(host, RrType::Txt, std::slice::from_ref(txt), None)?,
                )?);
            }
        }
        for ((name, kind), listed) in &have {
            if kind != "TXT" || want.contains_key(name) {
                continue;
            }
            if !listed
                .values
                .iter()
                .any(|v| txt_owner(v).as_deref() == Some(me))
            {
                continue;
            }
            tracing::info!(host = %name, "source gone: withdrawing its records");
            if let Some(a) = have.get(&(name.clone(), "A".into())) {
                changes.push(change(
                    ChangeAction::Delete,
                    record(name, RrType::A, &a.values, a.ttl)?,
                )?);
            }
            changes.push(change(
                ChangeAction::Delete,
                record(name, RrType::Txt, &listed.values, listed.ttl)?,
            )?);
        }
        if changes.is_empty() {
            return Ok(());
        }
        let batch = ChangeBatch::builder()
            .set_changes(Some(changes))
            .build()
            .map_err(|e| r53_err("building change batch")(e.to_string()))?;
        self.client
            .change_resource_record_sets()
            .hosted_zone_id(&self.zone_id)
            .change_batch(batch)
            .send()
            .await
            .map_err(|e| r53_err("ChangeResourceRecordSets")(format!("{e:?}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_txt_round_trips() {
        let v = owner_txt("mgmt-a", "clusters-hc1", "kube-apiserver");
        assert_eq!(
            v,
            "\"heritage=external-dns,external-dns/owner=mgmt-a,external-dns/resource=route/clusters-hc1/kube-apiserver\""
        );
        assert_eq!(txt_owner(&v).as_deref(), Some("mgmt-a"));
        assert_eq!(txt_owner("\"v=spf1 -all\""), None);
    }
}
