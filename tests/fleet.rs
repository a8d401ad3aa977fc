//! `hcp-dr backup --all`: every matching hosted cluster, each with its own
//! lock, pause and undo; one broken cluster fails alone.

mod support;

use std::time::{Duration, Instant};

use hcp_dr_e2e::sandbox::{HostedClusterSpec, api_for, create_all, wait_available};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch};
use serde_json::{Value, json};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fleet_backup_reports_the_broken_cluster_and_backs_up_the_others() {
    let env = env("SingleReplica").await;
    for name in ["alpha", "beta"] {
        let mut spec = HostedClusterSpec::demo();
        spec.name = name.into();
        spec.availability = "SingleReplica".into();
        spec.node_pool_replicas = 1;
        // the namespace exists already
        let objects: Vec<Value> = spec.objects().into_iter().filter(|o| o["kind"] != "Namespace").collect();
        create_all(&env.mgmt, &objects).await.expect("create");
        wait_available(&env.mgmt, "clusters", name, Duration::from_secs(180)).await.expect("Available");
    }
    // break beta: paused by its owner (the operator leaves it alone) and its etcd client TLS gone
    let hcs = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    hcs.patch("beta", &Default::default(), &Patch::Merge(json!({"spec": {"pausedUntil": "true"}}))).await.unwrap();
    let start = Instant::now();
    loop {
        let hc = serde_json::to_value(hcs.get("beta").await.unwrap()).unwrap();
        if hc["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "ReconciliationActive" && c["status"] == "False")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the operator never acknowledged the pause");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Api::<Secret>::namespaced(env.mgmt.clone(), "clusters-beta").delete("etcd-client-tls", &Default::default()).await.unwrap();

    let store = env.local_store();
    let out = env.hcp_dr(&["backup", "--all", "-n", "clusters", "--concurrency", "2", "--to", store.to_str().unwrap(), "-o", "json"], &[]);
    assert_eq!(out.status.code(), Some(1), "one failed: {}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["succeeded"], 2, "{report:#}");
    assert_eq!(report["failed"], 1, "{report:#}");
    let by_name = |n: &str| report["clusters"].as_array().unwrap().iter().find(|c| c["hosted_cluster"] == n).cloned().unwrap();
    for ok in ["clusters/alpha", "clusters/demo"] {
        let c = by_name(ok);
        assert_eq!(c["succeeded"], true, "{c:#}");
        let folder = c["result"]["backup"].as_str().unwrap().strip_prefix("file://").unwrap().to_string();
        assert!(std::path::Path::new(&folder).join("manifest.json").exists(), "{ok}: no manifest in {folder}");
    }
    let beta = by_name("clusters/beta");
    assert_eq!(beta["succeeded"], false);
    assert!(beta.to_string().contains("no etcd client TLS material"), "{beta:#}");
    // beta's own pause is untouched; the others are back in service
    let hc = serde_json::to_value(hcs.get("beta").await.unwrap()).unwrap();
    assert_eq!(hc["spec"]["pausedUntil"], "true");
    env.assert_in_service("after the fleet backup").await;
    for name in ["alpha", "demo"] {
        let hc = serde_json::to_value(hcs.get(name).await.unwrap()).unwrap();
        assert!(hc["spec"]["pausedUntil"].is_null(), "{name} still paused");
    }

    // a selector that matches nothing is bad input
    let out = env.hcp_dr(&["backup", "--all", "-l", "team=nobody", "--to", store.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no HostedCluster matches"), "{}", text(&out));
}
