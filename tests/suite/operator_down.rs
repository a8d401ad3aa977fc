//! The HyperShift operator is down, as during a management cluster
//! incident: backup does not wait the whole wait timeout for it to
//! acknowledge the pause. After `--operator-ack-timeout` hcp-dr pauses the
//! HostedControlPlane and the Cluster API Cluster itself, as the operator
//! would, journaled first; the report says so; the backup completes and
//! everything goes back as it was, by the run's own resume or by its undo.
//! Migrate with the source's operator down: an `--abort` before teardown
//! puts the stand-in back and returns the source to service; a whole run
//! moves the cluster and tears the source down without that operator.

use crate::support;

use hcp_dr_e2e::sandbox::api_for;
use serde_json::{Value, json};
use support::*;

/// `(HostedControlPlane spec.pausedUntil, Cluster spec.paused)` of demo.
async fn stand_in_fields(env: &Env) -> (Value, Value) {
    let ns = env.hcp_ns();
    let hcps = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane", "metadata": {"namespace": ns}}));
    let hcp = serde_json::to_value(hcps.get("demo").await.expect("HostedControlPlane")).unwrap();
    let clusters = api_for(&env.mgmt, &json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "metadata": {"namespace": ns}}));
    let listed = clusters.list(&Default::default()).await.expect("Clusters").items;
    assert_eq!(listed.len(), 1, "one CAPI Cluster in {ns}");
    let cluster = serde_json::to_value(&listed[0]).unwrap();
    (hcp["spec"]["pausedUntil"].clone(), cluster["spec"]["paused"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_stands_in_for_an_operator_that_is_down_and_puts_everything_back() {
    let env = env("SingleReplica").await;
    let before = stand_in_fields(&env).await;
    env.sandbox.set_hypershift_down("mgmt-a", true).expect("operator down");
    let store = env.local_store();
    let store = store.to_str().unwrap();

    // A failure after the scale-down: the undo puts the stand-in back too.
    let out = env.hcp_dr(
        &["backup", "--hosted-cluster", "demo", "--to", store, "--operator-ack-timeout", "2s", "-o", "json"],
        &[("HCP_DR_TEST_FAIL_AFTER", "scale-down")],
    );
    assert_eq!(out.status.code(), Some(1), "failed and undone: {}", text(&out));
    let report = json_report(&out);
    let pause = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "pause").expect("pause stage");
    let stand_in = &pause["output"]["operator_stand_in"];
    assert_eq!(stand_in["waited_seconds"], 2, "{pause}");
    assert_eq!(stand_in["hosted_control_plane"][0], "demo", "{pause}");
    assert!(stand_in["capi_cluster"][0].is_string(), "{pause}");
    assert_eq!(stand_in_fields(&env).await, before, "the undo put the HostedControlPlane and the Cluster back");
    env.assert_in_service("after the undo").await;

    // A whole backup with the operator down.
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store, "--operator-ack-timeout", "2s"], &[]);
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("the HyperShift operator did not acknowledge the pause within 2s")
            && text.contains("HostedControlPlane clusters-demo/demo (spec.pausedUntil)")
            && text.contains("(spec.paused)"),
        "the report says what hcp-dr paused itself: {text}"
    );
    assert_eq!(stand_in_fields(&env).await, before, "put back by the backup's resume");
    env.assert_in_service("after the backup").await;

    // Bounds are checked before anything runs.
    for bad in ["0s", "2h", "soon"] {
        let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store, "--operator-ack-timeout", bad], &[]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", support::text(&out));
        assert!(support::text(&out).contains("--operator-ack-timeout"), "{bad}: {}", support::text(&out));
        let migrate = ["migrate", "--hosted-cluster", "demo", "--to-kubeconfig", "b.kubeconfig", "--via", store, "--operator-ack-timeout", bad];
        let out = env.hcp_dr(&migrate, &[]);
        assert_eq!(out.status.code(), Some(2), "migrate {bad}: {}", support::text(&out));
        assert!(support::text(&out).contains("--operator-ack-timeout"), "migrate {bad}: {}", support::text(&out));
    }
    env.sandbox.set_hypershift_down("mgmt-a", false).expect("operator back");
}

/// The source's HyperShift operator is down for a whole migration: the
/// pause is stood in for (and undone by an `--abort`); the move completes,
/// the destination holds everything, and the source is torn down although
/// the operator that holds the finalizers of its HostedCluster, NodePools
/// and HostedControlPlane never acts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_moves_a_cluster_whose_source_operator_is_down() {
    let env = env("SingleReplica").await;
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let hcp_ns = env.hcp_ns();
    let before = stand_in_fields(&env).await;
    let (revision_before, keys_before) = etcd_keys(&env.mgmt, &hcp_ns).await;
    let host = format!("api.demo.{}", hcp_dr_e2e::sandbox::BASE_DOMAIN);
    wait_owners(&env, &host, &["mgmt-a"], std::time::Duration::from_secs(60), "the API name").await;
    env.sandbox.set_hypershift_down("mgmt-a", true).expect("operator down");

    // Stopped once the destination is Available, then aborted: the source
    // serves again, the stand-in pause undone, its records published again.
    let journal = env.dir.path().join("abort.jsonl");
    let args = migrate_args(&env, &journal, &["--operator-ack-timeout", "2s", "-o", "json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[("HCP_DR_TEST_FAIL_AFTER", "wait")]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report = json_report(&out);
    let pause = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "pause").expect("pause stage");
    let stand_in = &pause["output"]["operator_stand_in"];
    assert_eq!(stand_in["waited_seconds"], 2, "{pause}");
    assert_eq!(stand_in["hosted_control_plane"][0], "demo", "{pause}");
    assert!(stand_in["capi_cluster"][0].is_string(), "{pause}");
    assert!(report["warnings"].as_array().unwrap().iter().any(|w| w.as_str().is_some_and(|w| w.contains("did not acknowledge the pause within 2s"))), "{report:#}");
    assert_ne!(stand_in_fields(&env).await, before, "the stand-in pause is in place");
    assert!(hc_on(&b).await.is_some(), "the destination was not restored before the stop");
    let out = env.hcp_dr(&["migrate", "--abort", journal.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(hc_on(&b).await.is_none(), "--abort left the copy on mgmt-b");
    assert_eq!(stand_in_fields(&env).await, before, "--abort put the HostedControlPlane and the Cluster back");
    env.assert_in_service("after --abort").await;
    wait_owners(&env, &host, &["mgmt-a"], std::time::Duration::from_secs(60), "the API name").await;

    // The whole move, the operator still down.
    let journal = env.dir.path().join("migrate.jsonl");
    let args = migrate_args(&env, &journal, &["--operator-ack-timeout", "2s"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("the HyperShift operator did not acknowledge the pause within 2s")
            && report.contains(&format!("HostedControlPlane {hcp_ns}/demo (spec.pausedUntil)"))
            && report.contains("(spec.paused)"),
        "the report says what hcp-dr paused itself: {report}"
    );
    assert_moved(&b, &hcp_ns, revision_before, &keys_before, 1).await;
    wait_owners(&env, &host, &["mgmt-b"], std::time::Duration::from_secs(60), "the API name").await;
    // the source is gone from mgmt-a, its operator never having acted
    assert!(env.sandbox.dir.join("mgmt-a/state").join(hcp_dr_e2e::operator::hypershift::DOWN_MARKER).exists(), "the operator stayed down");
    assert!(hc_on(&env.mgmt).await.is_none(), "the source HostedCluster is still on mgmt-a");
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(env.mgmt.clone());
    assert!(namespaces.get_opt(&hcp_ns).await.unwrap().is_none(), "Namespace {hcp_ns} is still on mgmt-a");
    let pools = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool", "metadata": {"namespace": "clusters"}}));
    assert!(pools.list(&Default::default()).await.unwrap().items.is_empty(), "NodePools left on mgmt-a");
    // hcp-dr removed the finalizers the absent operator holds, and says so
    let teardown = std::fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["event"] == "succeeded" && r["stage"] == "teardown")
        .expect("teardown succeeded in the journal");
    let removed: Vec<&str> = teardown["output"]["finalizers_removed"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for what in ["HostedCluster clusters/demo", "NodePool clusters/", &format!("HostedControlPlane {hcp_ns}/demo")] {
        assert!(removed.iter().any(|r| r.starts_with(what) && r.contains("hypershift.openshift.io/finalizer")), "{what}: {teardown:#}");
    }
    env.sandbox.set_hypershift_down("mgmt-a", false).expect("operator back");
}
