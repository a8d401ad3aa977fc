//! Service publishing strategies through a migration (issue 12, item 5): a
//! HostedCluster written by hand with its API server behind a LoadBalancer
//! with a hostname (common in production), OAuth on a Route with a
//! hostname, Konnectivity on a Route without one (named in the management
//! cluster's ingress domain) and Ignition on a NodePort. external-dns
//! publishes the API from the Service and OAuth from the Route; `migrate
//! --route53-zone` withdraws both on the source (the Service keeps its load
//! balancer and loses only its hostname annotation), `--abort` puts them
//! back, and a full migration hands both names to the destination's
//! external-dns, with every other name reported as left alone and why.

use crate::support;

use std::time::Duration;

use hcp_dr_e2e::sandbox::{BASE_DOMAIN, HostedClusterSpec, UpOptions};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use serde_json::json;
use support::*;

const ANNOTATION: &str = "external-dns.alpha.kubernetes.io/hostname";

fn spec() -> HostedClusterSpec {
    let mut spec = HostedClusterSpec::demo();
    spec.availability = "SingleReplica".into();
    spec.services = Some(json!([
        {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer", "loadBalancer": {"hostname": format!("api.demo.{BASE_DOMAIN}")}}},
        {"service": "OAuthServer", "servicePublishingStrategy": {"type": "Route", "route": {"hostname": format!("oauth.demo.{BASE_DOMAIN}")}}},
        {"service": "Konnectivity", "servicePublishingStrategy": {"type": "Route"}},
        {"service": "Ignition", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.5"}}},
    ]));
    spec
}

/// Every record set of the sandbox's zone: `(name, type, values)`.
async fn zone_records(env: &Env) -> Vec<(String, String, Vec<String>)> {
    let out = env.sandbox.route53.client().list_resource_record_sets().hosted_zone_id(&env.sandbox.zone_id).send().await.expect("list records");
    out.resource_record_sets()
        .iter()
        .map(|r| {
            let values = r.resource_records().iter().map(|v| v.value().to_string()).collect();
            (r.name().trim_end_matches('.').to_string(), r.r#type().as_str().to_string(), values)
        })
        .collect()
}

async fn api_service(mgmt: &kube::Client, hcp_ns: &str) -> Service {
    Api::<Service>::namespaced(mgmt.clone(), hcp_ns).get("kube-apiserver").await.expect("Service kube-apiserver")
}

fn annotation(service: &Service) -> Option<String> {
    service.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION)).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_publishing_strategy_moves_with_the_cluster() {
    let env = env_of(spec(), &UpOptions::default()).await;
    let api = format!("api.demo.{BASE_DOMAIN}");
    let oauth = format!("oauth.demo.{BASE_DOMAIN}");
    let hcp_ns = env.hcp_ns();
    let extra = [("HCP_DR_TEST_FAIL_AFTER", "dns-withdraw")];
    require_test_hooks(&extra);

    // As HyperShift publishes them: the API server's Service is a load
    // balancer with the hostname annotation, Konnectivity's Route is named
    // in mgmt-a's ingress domain, Ignition is a NodePort.
    let service = api_service(&env.mgmt, &hcp_ns).await;
    let spec_of = service.spec.clone().unwrap();
    assert_eq!(spec_of.type_.as_deref(), Some("LoadBalancer"));
    assert!(spec_of.ports.unwrap()[0].node_port.is_some_and(|p| (30000..=32767).contains(&p)), "the server allocates a node port");
    assert_eq!(annotation(&service).as_deref(), Some(api.as_str()));
    let lb_ip = service.status.and_then(|s| s.load_balancer).and_then(|l| l.ingress).and_then(|i| i[0].ip.clone()).expect("a load balancer address");
    let ignition = Api::<Service>::namespaced(env.mgmt.clone(), &hcp_ns).get("ignition-server").await.expect("Service ignition-server");
    assert_eq!(ignition.spec.unwrap().type_.as_deref(), Some("NodePort"));
    let routes = hcp_dr_e2e::sandbox::api_for(&env.mgmt, &json!({"apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"namespace": hcp_ns}}));
    let konnectivity = serde_json::to_value(routes.get("konnectivity-server").await.expect("Route konnectivity-server")).unwrap();
    assert_eq!(konnectivity["spec"]["host"], json!(format!("konnectivity-server-{hcp_ns}.apps.mgmt-a.mgmt.test")));
    assert!(konnectivity["metadata"]["annotations"].get(ANNOTATION).is_none());

    wait_owners(&env, &api, &["mgmt-a"], Duration::from_secs(60), "published by mgmt-a").await;
    wait_owners(&env, &oauth, &["mgmt-a"], Duration::from_secs(60), "published by mgmt-a").await;
    let records = zone_records(&env).await;
    assert!(records.contains(&(api.clone(), "A".into(), vec![lb_ip.clone()])), "the API's A record is the load balancer's address: {records:?}");
    assert!(
        records.iter().any(|(n, k, v)| n == &api && k == "TXT" && v.iter().any(|t| t.contains(&format!("external-dns/resource=service/{hcp_ns}/kube-apiserver")))),
        "the API's owner record names the Service: {records:?}"
    );
    assert!(!records.iter().any(|(n, _, _)| n.contains("konnectivity") || n.contains("ignition")), "names outside the zone or without a hostname are not published: {records:?}");

    // A migration stopped after dns-withdraw: both names withdrawn, the
    // Service kept with its load balancer, only its annotation gone.
    let journal = env.dir.path().join("stopped.jsonl");
    let args = migrate_args(&env, &journal, &["-o", "json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &extra);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(owners_of(&env, &api).await, Vec::<String>::new(), "the API's records were not withdrawn");
    assert_eq!(owners_of(&env, &oauth).await, Vec::<String>::new(), "OAuth's records were not withdrawn");
    let service = api_service(&env.mgmt, &hcp_ns).await;
    assert_eq!(annotation(&service), None);
    assert_eq!(service.spec.unwrap().type_.as_deref(), Some("LoadBalancer"), "the Service must keep its load balancer");

    // --abort puts the annotation and the Routes back; mgmt-a's
    // external-dns publishes both names again.
    let out = env.hcp_dr(&["migrate", "--abort", journal.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(annotation(&api_service(&env.mgmt, &hcp_ns).await).as_deref(), Some(api.as_str()));
    wait_owners(&env, &api, &["mgmt-a"], Duration::from_secs(60), "after --abort").await;
    wait_owners(&env, &oauth, &["mgmt-a"], Duration::from_secs(60), "after --abort").await;
    hcp_dr_e2e::sandbox::wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(120)).await.expect("the source serves again");

    // The whole migration: the destination's external-dns takes both names.
    let journal = env.dir.path().join("migrate.jsonl");
    let args = migrate_args(&env, &journal, &["-o", "json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let names: Vec<(String, String, bool)> = report["dns_names"]
        .as_array()
        .expect("dns_names")
        .iter()
        .map(|n| (n["name"].as_str().unwrap().to_string(), n["via"].as_str().unwrap().to_string(), n["managed"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("10.0.0.5".to_string(), "HostedCluster Ignition (NodePort)".to_string(), false),
            (api.clone(), "Service kube-apiserver (LoadBalancer)".to_string(), true),
            (format!("konnectivity-server-{hcp_ns}.apps.mgmt-a.mgmt.test"), "Route konnectivity-server".to_string(), false),
            (oauth.clone(), "Route oauth".to_string(), true),
        ],
        "{report:#}"
    );
    let why = |name: &str| report["dns_names"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["why"].as_str().unwrap().to_string();
    assert!(why(&format!("konnectivity-server-{hcp_ns}.apps.mgmt-a.mgmt.test")).contains("not in zone"), "{report:#}");
    assert!(why("10.0.0.5").contains("NodePort"), "{report:#}");
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    wait_owners(&env, &api, &["mgmt-b"], Duration::from_secs(60), "after the migration").await;
    wait_owners(&env, &oauth, &["mgmt-b"], Duration::from_secs(60), "after the migration").await;
    assert_eq!(annotation(&api_service(&b, &hcp_ns).await).as_deref(), Some(api.as_str()));
    assert!(hc_on(&env.mgmt).await.is_none(), "the source was not torn down");

}
