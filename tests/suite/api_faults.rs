//! A flapping management API server: 10 % of hcp-dr's requests to both
//! management clusters are answered 429, 500 or 503, have their connection
//! reset, or are delayed (the emulator's fault injection, decided before a
//! request is processed). Backup (of mgmt-a), cluster destroy (of that
//! copy), restore (onto mgmt-b) and migrate (back to mgmt-a) complete; every stage of each run ran once (no stage was re-run, so no
//! retry changed a result); the cluster ends Available on the destination.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use hcp_dr_e2e::apiserver::faults::{ApiFaults, FaultKind};
use hcp_dr_e2e::sandbox::{BUCKET, api_for};
use serde_json::{Value, json};
use support::*;

fn flapping(seed: u64) -> ApiFaults {
    ApiFaults {
        share: 0.1,
        kinds: FaultKind::ALL.to_vec(),
        // hcp-dr's own requests: the simulated operator and kubelet are the
        // test bed, not what is under test
        user_agent: Some("hcp-dr/".into()),
        delay_ms: 500,
        seed: Some(seed),
        // and, as on many real management clusters, aggregated APIs that
        // are registered but down: hcp-dr never uses them, so they must not
        // fail its discovery
        unavailable_api_services: vec!["metrics.k8s.io/v1beta1".into(), "packages.operators.coreos.com/v1".into()],
    }
}

/// How many times each stage of the run in `journal` started.
fn starts(journal: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(journal).expect("journal").lines() {
        let Ok(record) = serde_json::from_str::<Value>(line) else { continue };
        if record["event"] == "started" {
            *out.entry(record["stage"].as_str().unwrap_or_default().to_string()).or_default() += 1;
        }
    }
    out
}

/// The HostedCluster's conditions and the HCP namespace's pods on both
/// management clusters, for a failure message.
async fn diagnose(env: &Env) -> String {
    let mut out = String::new();
    for cluster in &env.sandbox.clusters {
        let Ok(client) = cluster.api.client().await else { continue };
        let hcs = api_for(&client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
        let conditions = match hcs.get("demo").await {
            Ok(hc) => serde_json::to_value(hc).unwrap()["status"]["conditions"].to_string(),
            Err(e) => e.to_string(),
        };
        out.push_str(&format!("{}: demo conditions {conditions}\n", cluster.name));
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, &env.hcp_ns());
        for pod in pods.list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
            let status = pod.status.unwrap_or_default();
            out.push_str(&format!("  pod {} {:?} ip {:?}\n", pod.metadata.name.unwrap_or_default(), status.phase, status.pod_ip));
        }
    }
    out
}

/// Run hcp-dr to success and check that no stage of its journal ran twice.
async fn run_once(env: &Env, what: &str, args: &[&str]) -> Value {
    let out = env.hcp_dr(args, &[]);
    if !out.status.success() {
        panic!("{what} under faults: {}\n\n{}", text(&out), diagnose(env).await);
    }
    let report = json_report(&out);
    let journal = report["journal"].as_str().unwrap_or_else(|| panic!("{what}: no journal in {report:#}"));
    let starts = starts(Path::new(journal));
    assert!(!starts.is_empty(), "{what}: no stage started");
    let twice: Vec<_> = starts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "{what}: stages started more than once: {twice:?}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_restore_destroy_and_migrate_complete_under_ten_percent_api_faults() {
    let env = env("SingleReplica").await;
    let (a, b) = (env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string(), env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string());
    let endpoint = env.sandbox.s3.https_url().to_string();
    env.sandbox.set_api_faults("mgmt-a", Some(&flapping(7))).expect("faults on mgmt-a");
    env.sandbox.set_api_faults("mgmt-b", Some(&flapping(11))).expect("faults on mgmt-b");

    // backup of A
    let mut args = vec!["backup".to_string(), "--hosted-cluster".into(), "demo".into(), "-o".into(), "json".into()];
    args.extend(env.s3_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let backup = run_once(&env, "backup", &args).await;
    let url = backup["backup"].as_str().expect("backup URL").to_string();
    env.assert_in_service("after the backup under faults").await;

    // destroy A's copy (the sandbox serves a hosted cluster at one address:
    // one copy at a time), then restore onto B
    run_once(&env, "cluster destroy", &["cluster", "destroy", "demo", "--kubeconfig", &a, "-o", "json"]).await;
    run_once(&env, "restore", &["restore", "--from", &url, "--s3-endpoint", &endpoint, "--kubeconfig", &b, "--wait", "5m", "-o", "json"]).await;

    // migrate it back from B to A
    let via = format!("s3://{BUCKET}/migrations");
    let zone = env.sandbox.zone_id.clone();
    let route53 = env.sandbox.route53.url().to_string();
    let migrate = run_once(
        &env,
        "migrate",
        &["migrate", "--hosted-cluster", "demo", "--from-kubeconfig", &b, "--to-kubeconfig", &a, "--via", &via, "--s3-endpoint", &endpoint, "--wait", "5m", "--dns-wait", "2m", "--route53-zone", &zone, "--route53-endpoint", &route53, "-o", "json"],
    )
    .await;
    assert_eq!(migrate["outcome"], "succeeded", "{migrate:#}");

    let injected: Vec<Value> = ["mgmt-a", "mgmt-b"].iter().flat_map(|c| env.sandbox.api_faults_injected(c)).collect();
    env.sandbox.set_api_faults("mgmt-a", None).unwrap();
    env.sandbox.set_api_faults("mgmt-b", None).unwrap();
    let asked_down: Vec<&Value> = injected
        .iter()
        .filter(|f| f["path"].as_str().is_some_and(|p| p.starts_with("/apis/metrics.k8s.io/") || p.starts_with("/apis/packages.operators.coreos.com/")))
        .collect();
    assert!(asked_down.is_empty(), "hcp-dr's discovery asked the aggregated APIs that are down, which it never uses: {asked_down:?}");
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for fault in &injected {
        assert!(fault["user_agent"].as_str().is_some_and(|ua| ua.starts_with("hcp-dr/")), "{fault}");
        *by_kind.entry(fault["kind"].as_str().unwrap_or_default().to_string()).or_default() += 1;
    }
    println!("faults injected and survived: {} ({by_kind:?})", injected.len());
    assert!(injected.len() >= 10, "too few faults to prove anything: {by_kind:?}");
    for kind in ["too-many-requests", "internal-error", "unavailable", "reset"] {
        assert!(by_kind.contains_key(kind), "no `{kind}` fault was injected: {by_kind:?}");
    }
}
