//! The names a hosted cluster's services are reached under, and which of
//! them hcp-dr's DNS steps manage.
//!
//! HyperShift publishes each service (`spec.services[]`) by its strategy:
//! a Route (with a hostname: external-dns publishes it; without: the
//! management cluster's ingress domain names it), a Service of type
//! LoadBalancer (with a hostname: the external-dns hostname annotation), or
//! a NodePort (an address and port, no DNS). external-dns reads Routes and
//! annotated Services and publishes the names inside its domain filter.
//!
//! hcp-dr manages a name when a Route53 zone was given and the name is
//! inside the zone: those are the names whose records it waits for, deletes
//! (`--dns-direct`, `--take-over-dns`) and checks. Every other name is left
//! alone and reported with the reason: outside the zone (the management
//! cluster's ingress domain, another zone), no zone given, or no DNS name
//! at all (NodePort, a load balancer without a hostname).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::HostedCluster;
use crate::dns::normalize_name;

/// The annotation external-dns reads hostnames from (comma-separated).
pub const HOSTNAME_ANNOTATION: &str = "external-dns.alpha.kubernetes.io/hostname";

/// One name (or address) a service is reached under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedName {
    /// The hostname (normalised) or, without one, the address.
    pub name: String,
    /// What publishes it: `Route oauth`, `Service kube-apiserver
    /// (LoadBalancer)`, `HostedCluster APIServer (NodePort)`.
    pub via: String,
    /// Whether hcp-dr's DNS steps manage its records.
    pub managed: bool,
    /// Why it is managed or left alone.
    pub why: String,
}

impl std::fmt::Display for PublishedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = if self.managed { "managed" } else { "left alone" };
        write!(f, "{} ({}): {role}: {}", self.name, self.via, self.why)
    }
}

/// Whether `name` lies inside DNS domain `domain`.
pub fn in_domain(name: &str, domain: &str) -> bool {
    let (name, domain) = (normalize_name(name), normalize_name(domain));
    name == domain || name.ends_with(&format!(".{domain}"))
}

/// The hostnames an external-dns hostname annotation's value names
/// (comma-separated), normalised.
pub fn hostnames_in(value: &str) -> Vec<String> {
    value.split(',').map(normalize_name).filter(|h| !h.is_empty()).collect()
}

/// The hostnames in an external-dns hostname annotation of `object`.
pub fn annotated_hostnames(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(HOSTNAME_ANNOTATION))
        .and_then(Value::as_str)
        .map(hostnames_in)
        .unwrap_or_default()
}

fn name_of(object: &Value) -> &str {
    object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
}

/// Every name `hc` is reached under, from its `spec.services` and the
/// Routes and Services of its HCP namespace, with hcp-dr's role for each
/// given the zone's domain (`None`: no zone given). Sorted by name; a name
/// found twice is listed once, by its first source (Route, Service, spec).
pub fn published_names(hc: &HostedCluster, routes: &[Value], services: &[Value], zone: Option<(&str, &str)>) -> Vec<PublishedName> {
    let hostname = |name: String, via: String| {
        let (managed, why) = match zone {
            None => (false, "no Route53 zone was given (--route53-zone): hcp-dr neither reads nor waits for its records".to_string()),
            Some((id, domain)) if in_domain(&name, domain) => (true, format!("in zone {id} ({domain})")),
            Some((id, domain)) => (
                false,
                format!("not in zone {id} ({domain}): hcp-dr neither waits for nor deletes its records; if it is the management cluster's ingress domain, the name changes with the management cluster and clients must follow"),
            ),
        };
        PublishedName { name, via, managed, why }
    };
    let mut out: Vec<PublishedName> = Vec::new();
    let mut push = |entry: PublishedName| {
        if !out.iter().any(|e| e.name == entry.name) {
            out.push(entry);
        }
    };
    for route in routes {
        if let Some(host) = route.pointer("/spec/host").and_then(Value::as_str).filter(|h| !h.is_empty()) {
            push(hostname(normalize_name(host), format!("Route {}", name_of(route))));
        }
    }
    for service in services {
        let kind = service.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP");
        for host in annotated_hostnames(service) {
            push(hostname(host, format!("Service {} ({kind})", name_of(service))));
        }
    }
    for entry in hc.0.pointer("/spec/services").and_then(Value::as_array).into_iter().flatten() {
        let service = entry["service"].as_str().unwrap_or("?");
        let strategy = &entry["servicePublishingStrategy"];
        let kind = strategy["type"].as_str().unwrap_or("?");
        let via = format!("HostedCluster {service} ({kind})");
        let given = |path: &str| strategy.pointer(path).and_then(Value::as_str).filter(|h| !h.is_empty());
        match kind {
            "Route" => {
                if let Some(host) = given("/route/hostname") {
                    push(hostname(normalize_name(host), via));
                }
            }
            "LoadBalancer" => match given("/loadBalancer/hostname") {
                Some(host) => push(hostname(normalize_name(host), via)),
                None => push(PublishedName {
                    name: format!("{service} load balancer"),
                    via,
                    managed: false,
                    why: "no hostname: clients use the load balancer's own address, which changes with the management cluster".into(),
                }),
            },
            "NodePort" => {
                let address = given("/nodePort/address").unwrap_or("?");
                let port = strategy.pointer("/nodePort/port").and_then(Value::as_i64).map(|p| format!(":{p}")).unwrap_or_default();
                push(PublishedName {
                    name: format!("{address}{port}"),
                    via,
                    managed: false,
                    why: "a NodePort address, not a DNS name: it must reach the destination's nodes (a VIP or load balancer in front of both), hcp-dr does not move it".into(),
                });
            }
            _ => {}
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The managed names of a list: what the DNS steps read, wait for, delete.
pub fn managed(names: &[PublishedName]) -> Vec<String> {
    names.iter().filter(|n| n.managed).map(|n| n.name.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fixture() -> (HostedCluster, Vec<Value>, Vec<Value>) {
        let hc = HostedCluster(json!({"metadata": {"name": "demo", "namespace": "clusters"}, "spec": {"services": [
            {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer", "loadBalancer": {"hostname": "api.demo.example.com"}}},
            {"service": "OAuthServer", "servicePublishingStrategy": {"type": "Route", "route": {"hostname": "OAuth.demo.example.com."}}},
            {"service": "Konnectivity", "servicePublishingStrategy": {"type": "Route"}},
            {"service": "Ignition", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.5", "port": 30080}}},
            {"service": "OVNSbDb", "servicePublishingStrategy": {"type": "LoadBalancer"}},
        ]}}));
        let routes = vec![
            json!({"metadata": {"name": "oauth", "annotations": {HOSTNAME_ANNOTATION: "oauth.demo.example.com"}}, "spec": {"host": "oauth.demo.example.com"}}),
            json!({"metadata": {"name": "konnectivity-server"}, "spec": {"host": "konnectivity-server-clusters-demo.apps.mgmt-a.example.net"}}),
        ];
        let services = vec![
            json!({"metadata": {"name": "kube-apiserver", "annotations": {HOSTNAME_ANNOTATION: "api.demo.example.com"}}, "spec": {"type": "LoadBalancer"}}),
            json!({"metadata": {"name": "etcd-client"}, "spec": {"type": "ClusterIP"}}),
        ];
        (hc, routes, services)
    }

    #[test]
    fn each_strategy_gets_its_role_and_reason() {
        let (hc, routes, services) = fixture();
        let names = published_names(&hc, &routes, &services, Some(("Z1", "example.com")));
        let rows: Vec<(&str, &str, bool)> = names.iter().map(|n| (n.name.as_str(), n.via.as_str(), n.managed)).collect();
        assert_eq!(
            rows,
            vec![
                ("10.0.0.5:30080", "HostedCluster Ignition (NodePort)", false),
                ("OVNSbDb load balancer", "HostedCluster OVNSbDb (LoadBalancer)", false),
                ("api.demo.example.com", "Service kube-apiserver (LoadBalancer)", true),
                ("konnectivity-server-clusters-demo.apps.mgmt-a.example.net", "Route konnectivity-server", false),
                ("oauth.demo.example.com", "Route oauth", true),
            ]
        );
        assert_eq!(managed(&names), vec!["api.demo.example.com", "oauth.demo.example.com"]);
        let konnectivity = &names[3];
        assert!(konnectivity.why.contains("not in zone Z1 (example.com)"), "{konnectivity}");
        assert!(names[0].why.contains("NodePort"), "{}", names[0]);
    }

    #[test]
    fn without_a_zone_nothing_is_managed_and_the_spec_alone_still_names_the_hosts() {
        let (hc, _, _) = fixture();
        let names = published_names(&hc, &[], &[], None);
        assert!(managed(&names).is_empty());
        let api = names.iter().find(|n| n.name == "api.demo.example.com").unwrap();
        assert_eq!(api.via, "HostedCluster APIServer (LoadBalancer)");
        assert!(api.why.contains("--route53-zone"));
    }

    #[test]
    fn domains_and_annotations() {
        assert!(in_domain("API.Example.com.", "example.com"));
        assert!(in_domain("example.com", "example.com."));
        assert!(!in_domain("badexample.com", "example.com"));
        let service = json!({"metadata": {"annotations": {HOSTNAME_ANNOTATION: "a.example.com, B.example.com."}}});
        assert_eq!(annotated_hostnames(&service), vec!["a.example.com", "b.example.com"]);
        assert!(annotated_hostnames(&json!({"metadata": {}})).is_empty());
    }
}
