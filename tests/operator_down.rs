//! The HyperShift operator is down, as during a management cluster
//! incident: backup does not wait the whole wait timeout for it to
//! acknowledge the pause. After `--operator-ack-timeout` hcp-dr pauses the
//! HostedControlPlane and the Cluster API Cluster itself, as the operator
//! would, journaled first; the report says so; the backup completes and
//! everything goes back as it was, by the run's own resume or by its undo.

mod support;

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
