//! The controller-manager part on its own: Deployments and StatefulSets in an
//! ordinary namespace become pods and bound claims with data directories;
//! `whenScaled: Delete` removes the claim and its data on scale-down; scaling
//! a Deployment to zero deletes its pods.

use crate::operator_support;

use operator_support::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployments_and_statefulsets_become_pods_and_claims() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    let ns = "apps";
    mgmt.create(
        &mgmt.api("", "v1", "Namespace", "namespaces", None),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    let deployments = mgmt.api("apps", "v1", "Deployment", "deployments", Some(ns));
    let sets = mgmt.api("apps", "v1", "StatefulSet", "statefulsets", Some(ns));
    let pods = mgmt.api("", "v1", "Pod", "pods", Some(ns));
    let pvcs = mgmt.api(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        Some(ns),
    );
    let template = |app: &str| json!({"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": app, "image": app}]}});
    mgmt.create(&deployments, json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template("web")}})).await;
    mgmt.create(&sets, json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": template("db"),
            "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}]}})).await;

    let by_app = |app: &'static str| {
        let pods = pods.clone();
        async move {
            let list = pods.list(&Default::default()).await.ok()?;
            let items: Vec<Value> = list
                .items
                .into_iter()
                .map(|p| serde_json::to_value(p).expect("json"))
                .filter(|p| p.pointer("/metadata/labels/app").and_then(Value::as_str) == Some(app))
                .collect();
            Some(items)
        }
    };
    wait_for("web Deployment available with 2 running pods", || async {
        let d = mgmt.get(&deployments, "web").await?;
        let running = by_app("web")
            .await?
            .iter()
            .filter(|p| p.pointer("/status/phase") == Some(&json!("Running")))
            .count();
        (running == 2
            && d.pointer("/status/availableReplicas") == Some(&json!(2))
            && has_condition(&d, "Available", "True"))
        .then_some(())
    })
    .await;
    let web = by_app("web").await.expect("pods");
    assert!(
        web.iter()
            .all(|p| p.pointer("/metadata/ownerReferences/0/kind") == Some(&json!("Deployment")))
    );
    assert!(web.iter().all(|p| {
        p.pointer("/status/podIP")
            .and_then(Value::as_str)
            .is_some_and(|ip| ip.starts_with("127."))
    }));

    wait_for("db StatefulSet with 2 ready replicas", || async {
        let s = mgmt.get(&sets, "db").await?;
        (s.pointer("/status/readyReplicas") == Some(&json!(2))).then_some(())
    })
    .await;
    let pv_root = mgmt.dir.path().join("operator/pv").join(ns);
    for claim in ["data-db-0", "data-db-1"] {
        let pvc = mgmt.get(&pvcs, claim).await.expect("claim");
        assert_eq!(pvc.pointer("/status/phase"), Some(&json!("Bound")));
        assert!(pv_root.join(claim).is_dir(), "volume directory of {claim}");
    }
    assert!(mgmt.get(&pods, "db-0").await.is_some() && mgmt.get(&pods, "db-1").await.is_some());

    // StatefulSet scale-down with whenScaled: Delete drops db-1's claim and data.
    mgmt.merge(&sets, "db", json!({"spec": {"replicas": 1}}))
        .await;
    wait_for("db-1 and its claim gone", || async {
        let gone =
            mgmt.get(&pods, "db-1").await.is_none() && mgmt.get(&pvcs, "data-db-1").await.is_none();
        (gone && !pv_root.join("data-db-1").exists()).then_some(())
    })
    .await;
    assert!(
        mgmt.get(&pvcs, "data-db-0").await.is_some(),
        "the remaining replica keeps its claim"
    );

    // Deployment scaled to zero: pods deleted, status follows.
    mgmt.merge(&deployments, "web", json!({"spec": {"replicas": 0}}))
        .await;
    wait_for("web pods gone", || async {
        let d = mgmt.get(&deployments, "web").await?;
        (by_app("web").await?.is_empty() && d.pointer("/status/replicas") == Some(&json!(0)))
            .then_some(())
    })
    .await;
    mgmt.stop().await;
}
