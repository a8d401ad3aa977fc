//! How the control-plane operator publishes a hosted cluster's services on
//! the management cluster, per `spec.services[].servicePublishingStrategy`:
//!
//! - `Route` with a hostname: a Route with that `spec.host` and the
//!   external-dns hostname annotation (external-dns publishes it);
//! - `Route` without one: a Route named in the management cluster's ingress
//!   domain (`<route>-<hcp ns>.apps.<mgmt>.mgmt.test`, outside any hosted
//!   cluster's zone): nobody publishes it in DNS, and it changes with the
//!   management cluster;
//! - `LoadBalancer`: the service's Service is of type LoadBalancer, with the
//!   external-dns hostname annotation when a hostname is given; the
//!   sandbox's cloud gives it an address (`status.loadBalancer.ingress`);
//! - `NodePort`: a Service of type NodePort; clients use
//!   `nodePort.address` and the allocated port, no DNS.
//!
//! An APIServer not listed is published as a Route with the hostname
//! `api.<name>.<baseDomain>`.

use serde_json::{Value, json};

use super::hypershift::HCP_LABEL;
use super::objects::{HOSTED_CONTROL_PLANE, ROUTE, SERVICE, name_of, owner_ref, str_at};
use super::{Ctx, OperatorError};

/// The annotation external-dns reads a hostname from.
pub const HOSTNAME_ANNOTATION: &str = "external-dns.alpha.kubernetes.io/hostname";

/// The ingress domain of management cluster `cluster`: where Routes without
/// a hostname are named.
pub fn ingress_domain(cluster: &str) -> String {
    format!("apps.{cluster}.mgmt.test")
}

/// One published service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// A Route `route` to Service `service`, named `host`; `external_dns`:
    /// it carries the hostname annotation (a hostname was given).
    Route { route: &'static str, service: &'static str, host: String, external_dns: bool },
    /// Service `service` of type LoadBalancer, annotated with `hostname`.
    LoadBalancer { service: &'static str, hostname: Option<String> },
    /// Service `service` of type NodePort, reached at `address`.
    NodePort { service: &'static str, address: String, port: Option<i64> },
}

/// The Route and Service names HyperShift gives a service type.
fn names(service: &str) -> Option<(&'static str, &'static str)> {
    Some(match service {
        "APIServer" => ("kube-apiserver", "kube-apiserver"),
        "OAuthServer" => ("oauth", "oauth-openshift"),
        "Konnectivity" => ("konnectivity-server", "konnectivity-server"),
        "Ignition" => ("ignition-server", "ignition-server"),
        _ => return None,
    })
}

/// The API hostname of a HostedCluster without an APIServer entry.
fn default_api_host(hc: &Value) -> String {
    format!(
        "api.{}.{}",
        name_of(hc),
        str_at(hc, "/spec/dns/baseDomain").filter(|d| !d.is_empty()).unwrap_or("sandbox.hcp-dr.local")
    )
}

/// What `hc` publishes on management cluster `cluster`, in `spec.services`
/// order (the APIServer first when it is not listed).
pub fn publishing(hc: &Value, cluster: &str, hcp_ns: &str) -> Vec<Publish> {
    let services = hc.pointer("/spec/services").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::new();
    if !services.iter().any(|s| str_at(s, "/service") == Some("APIServer")) {
        out.push(Publish::Route { route: "kube-apiserver", service: "kube-apiserver", host: default_api_host(hc), external_dns: true });
    }
    for entry in &services {
        let Some((route, service)) = str_at(entry, "/service").and_then(names) else { continue };
        let strategy = &entry["servicePublishingStrategy"];
        let given = |path: &str| str_at(strategy, path).filter(|h| !h.is_empty()).map(str::to_string);
        out.push(match str_at(strategy, "/type") {
            Some("Route") => match given("/route/hostname") {
                Some(host) => Publish::Route { route, service, host, external_dns: true },
                None => Publish::Route { route, service, host: format!("{route}-{hcp_ns}.{}", ingress_domain(cluster)), external_dns: false },
            },
            Some("LoadBalancer") => Publish::LoadBalancer { service, hostname: given("/loadBalancer/hostname") },
            Some("NodePort") => Publish::NodePort {
                service,
                address: given("/nodePort/address").unwrap_or_default(),
                port: strategy.pointer("/nodePort/port").and_then(Value::as_i64),
            },
            // None, S3 (Ignition on AWS): nothing in the HCP namespace to publish
            _ => continue,
        });
    }
    out
}

fn port(service: &str) -> Value {
    if service == "kube-apiserver" {
        json!({"name": "client", "port": 6443, "protocol": "TCP", "targetPort": "client"})
    } else {
        json!({"name": "https", "port": 443, "protocol": "TCP", "targetPort": "https"})
    }
}

/// The Service a publishing needs: `None` for a Route, whose Service is a
/// ClusterIP one (only the API server's is simulated).
fn service_object(publish: &Publish, ns: &str, owner: &Value) -> Option<Value> {
    let (name, kind, annotations, node_port) = match publish {
        Publish::Route { .. } => return None,
        Publish::LoadBalancer { service, hostname } => {
            (*service, "LoadBalancer", hostname.as_ref().map(|h| json!({HOSTNAME_ANNOTATION: h})), None)
        }
        Publish::NodePort { service, port, .. } => (*service, "NodePort", None, *port),
    };
    let mut port = port(name);
    if let Some(p) = node_port {
        port["nodePort"] = json!(p);
    }
    let mut metadata = json!({"name": name, "namespace": ns, "labels": {"app": name, HCP_LABEL: ns}, "ownerReferences": [owner]});
    if let Some(annotations) = annotations {
        metadata["annotations"] = annotations;
    }
    Some(json!({"metadata": metadata, "spec": {"type": kind, "selector": {"app": name}, "ports": [port]}}))
}

fn route_object(publish: &Publish, ns: &str, owner: &Value) -> Option<Value> {
    let Publish::Route { route, service, host, external_dns } = publish else { return None };
    let mut metadata = json!({"name": route, "namespace": ns, "labels": {HCP_LABEL: ns}, "ownerReferences": [owner]});
    if *external_dns {
        metadata["annotations"] = json!({HOSTNAME_ANNOTATION: host});
    }
    Some(json!({
        "metadata": metadata,
        "spec": {"host": host, "to": {"kind": "Service", "name": service, "weight": 100},
            "port": {"targetPort": if *route == "kube-apiserver" { "client" } else { "https" }},
            "tls": {"termination": "passthrough", "insecureEdgeTerminationPolicy": "None"},
            "wildcardPolicy": "None"},
    }))
}

/// Create the Routes and Services `hc` publishes in `ns` (the API server's
/// Service is always there: ClusterIP behind a Route), and, as the cloud's
/// load-balancer controller would, give each LoadBalancer Service without an
/// address the hosted API's address through the status subresource.
pub(crate) async fn ensure_published(ctx: &Ctx, hc: &Value, ns: &str, hcp: &Value) -> Result<(), OperatorError> {
    let owner = owner_ref(&HOSTED_CONTROL_PLANE, hcp);
    let published = publishing(hc, &ctx.cfg.cluster_name, ns);
    let api_has_service = published.iter().any(|p| matches!(p, Publish::LoadBalancer { service: "kube-apiserver", .. } | Publish::NodePort { service: "kube-apiserver", .. }));
    if !api_has_service {
        let api = json!({"metadata": {"name": "kube-apiserver", "namespace": ns, "labels": {"app": "kube-apiserver", HCP_LABEL: ns}, "ownerReferences": [owner.clone()]},
            "spec": {"selector": {"app": "kube-apiserver"}, "type": "ClusterIP", "ports": [port("kube-apiserver")]}});
        ctx.kube.create_if_absent(&SERVICE, Some(ns), api).await?;
    }
    for publish in &published {
        if let Some(route) = route_object(publish, ns, &owner) {
            ctx.kube.create_if_absent(&ROUTE, Some(ns), route).await?;
        }
        let Some(service) = service_object(publish, ns, &owner) else { continue };
        ctx.kube.create_if_absent(&SERVICE, Some(ns), service).await?;
        if let Publish::LoadBalancer { service, .. } = publish {
            let current = ctx.kube.get(&SERVICE, Some(ns), service).await?;
            let has_address = current
                .as_ref()
                .and_then(|s| s.pointer("/status/loadBalancer/ingress"))
                .and_then(Value::as_array)
                .is_some_and(|i| !i.is_empty());
            if current.is_some() && !has_address {
                let (ip, _) = super::hosted_api::hosted_api_address(&ctx.cfg.sandbox_id, &ctx.cfg.cluster_name, super::objects::ns_of(hc), name_of(hc));
                ctx.kube
                    .merge_status(&SERVICE, Some(ns), service, &json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}}}))
                    .await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hc(services: Value) -> Value {
        json!({"metadata": {"name": "demo", "namespace": "clusters"}, "spec": {"dns": {"baseDomain": "example.com"}, "services": services}})
    }

    #[test]
    fn every_strategy_is_published_as_hypershift_does() {
        let hc = hc(json!([
            {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer", "loadBalancer": {"hostname": "api.demo.example.com"}}},
            {"service": "OAuthServer", "servicePublishingStrategy": {"type": "Route", "route": {"hostname": "oauth.demo.example.com"}}},
            {"service": "Konnectivity", "servicePublishingStrategy": {"type": "Route"}},
            {"service": "Ignition", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.5", "port": 30080}}},
            {"service": "OVNSbDb", "servicePublishingStrategy": {"type": "Route"}},
        ]));
        assert_eq!(
            publishing(&hc, "mgmt-a", "clusters-demo"),
            vec![
                Publish::LoadBalancer { service: "kube-apiserver", hostname: Some("api.demo.example.com".into()) },
                Publish::Route { route: "oauth", service: "oauth-openshift", host: "oauth.demo.example.com".into(), external_dns: true },
                Publish::Route {
                    route: "konnectivity-server",
                    service: "konnectivity-server",
                    host: "konnectivity-server-clusters-demo.apps.mgmt-a.mgmt.test".into(),
                    external_dns: false
                },
                Publish::NodePort { service: "ignition-server", address: "10.0.0.5".into(), port: Some(30080) },
            ]
        );
        let owner = json!({});
        let lb = service_object(&publishing(&hc, "mgmt-a", "ns")[0], "ns", &owner).unwrap();
        assert_eq!(lb["spec"]["type"], "LoadBalancer");
        assert_eq!(lb["metadata"]["annotations"][HOSTNAME_ANNOTATION], "api.demo.example.com");
        let np = service_object(&publishing(&hc, "mgmt-a", "ns")[3], "ns", &owner).unwrap();
        assert_eq!(np["spec"]["ports"][0]["nodePort"], 30080);
        assert!(np["metadata"].get("annotations").is_none());
        let unnamed = route_object(&publishing(&hc, "mgmt-a", "ns")[2], "ns", &owner).unwrap();
        assert!(unnamed["metadata"].get("annotations").is_none(), "a Route without a hostname is not for external-dns");
    }

    #[test]
    fn an_unlisted_api_server_gets_a_route_with_the_default_hostname() {
        let published = publishing(&hc(json!([])), "mgmt-a", "clusters-demo");
        assert_eq!(
            published,
            vec![Publish::Route { route: "kube-apiserver", service: "kube-apiserver", host: "api.demo.example.com".into(), external_dns: true }]
        );
    }
}
