//! A HighlyAvailable HostedCluster: three real etcd members; pausing keeps
//! kube-apiserver scaled to zero (the hosted API goes down) until the pause is
//! lifted; a member whose pod and PVC are deleted rejoins with all keys.

use crate::operator_support;

use std::time::Duration;

use operator_support::*;
use serde_json::{Value, json};

async fn hosted_api_serves(client: &kube::Client) -> bool {
    get_configmap(client, "before-pause").await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn highly_available_cluster_pauses_and_recovers_a_member() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    mgmt.create_hosted_cluster("beta", "HighlyAvailable", 1, None)
        .await;
    mgmt.wait_condition("beta", "Available", "True").await;
    let hcp_ns = "clusters-beta";
    let pods_api = mgmt.api("", "v1", "Pod", "pods", Some(hcp_ns));
    let mut ips = Vec::new();
    for i in 0..3 {
        // Available needs only quorum: the third member may still be starting
        let pod = wait_for(&format!("etcd-{i} ready"), || async {
            let pod = mgmt.get(&pods_api, &format!("etcd-{i}")).await?;
            has_condition(&pod, "Ready", "True").then_some(pod)
        })
        .await;
        ips.push(
            pod.pointer("/status/podIP")
                .and_then(Value::as_str)
                .expect("pod IP")
                .to_string(),
        );
    }
    let deployments = mgmt.api("apps", "v1", "Deployment", "deployments", Some(hcp_ns));
    let kas = mgmt
        .get(&deployments, "kube-apiserver")
        .await
        .expect("kube-apiserver");
    assert_eq!(
        kas.pointer("/spec/replicas").and_then(Value::as_u64),
        Some(3)
    );

    let hosted = mgmt.hosted_client("beta").await;
    wait_for("hosted API accepts a ConfigMap", || async {
        put_configmap(&hosted, "before-pause", "1").await.ok()
    })
    .await;

    // Paused: scaling kube-apiserver to zero sticks and the hosted API goes down.
    mgmt.merge(
        &mgmt.hc_api(),
        "beta",
        json!({"spec": {"pausedUntil": "true"}}),
    )
    .await;
    let hc = mgmt
        .wait_condition("beta", "ReconciliationActive", "False")
        .await;
    let paused = hc["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "ReconciliationActive"))
        .cloned();
    assert_eq!(
        paused.as_ref().map(|c| c["reason"].clone()),
        Some(json!("ReconciliationPaused"))
    );
    let hcp_api = mgmt.api(
        "hypershift.openshift.io",
        "v1beta1",
        "HostedControlPlane",
        "hostedcontrolplanes",
        Some(hcp_ns),
    );
    let hcp = mgmt.get(&hcp_api, "beta").await.expect("hcp");
    assert_eq!(
        hcp.pointer("/spec/pausedUntil").and_then(Value::as_str),
        Some("true")
    );
    mgmt.merge(
        &deployments,
        "kube-apiserver",
        json!({"spec": {"replicas": 0}}),
    )
    .await;
    wait_for("kube-apiserver pods gone", || async {
        let pods = pods_api.list(&Default::default()).await.ok()?;
        let left = pods
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .is_some_and(|a| a == "kube-apiserver")
            })
            .count();
        (left == 0).then_some(())
    })
    .await;
    wait_for("hosted API down", || async {
        (!hosted_api_serves(&hosted).await).then_some(())
    })
    .await;
    // (A paused HostedCluster's conditions are not refreshed, as in HyperShift.)
    // Several reconcile periods later the scale-down still holds (the paused
    // operator does not reset replicas).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kas = mgmt
        .get(&deployments, "kube-apiserver")
        .await
        .expect("kube-apiserver");
    assert_eq!(
        kas.pointer("/spec/replicas").and_then(Value::as_u64),
        Some(0),
        "paused: replicas stay at 0"
    );
    assert!(
        !hosted_api_serves(&hosted).await,
        "hosted API stays down while kube-apiserver is at 0"
    );

    // Unpaused: the operator restores replicas and the API comes back with its data.
    mgmt.merge(
        &mgmt.hc_api(),
        "beta",
        json!({"spec": {"pausedUntil": null}}),
    )
    .await;
    mgmt.wait_condition("beta", "ReconciliationActive", "True")
        .await;
    wait_for("kube-apiserver back to 3", || async {
        let d = mgmt.get(&deployments, "kube-apiserver").await?;
        (d.pointer("/status/readyReplicas").and_then(Value::as_u64) == Some(3)).then_some(())
    })
    .await;
    wait_for("hosted API back", || async {
        hosted_api_serves(&hosted).await.then_some(())
    })
    .await;
    mgmt.wait_condition("beta", "Available", "True").await;
    for i in 0..20 {
        wait_for("hosted API write", || async {
            put_configmap(&hosted, &format!("cm-{i}"), "x").await.ok()
        })
        .await;
    }

    // Member recovery: delete data-etcd-1 and pod etcd-1; a new member joins with all keys.
    let pvcs = mgmt.api(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        Some(hcp_ns),
    );
    let old_pvc_uid = mgmt.get(&pvcs, "data-etcd-1").await.expect("pvc")["metadata"]["uid"].clone();
    let old_pod_uid = mgmt.get(&pods_api, "etcd-1").await.expect("pod")["metadata"]["uid"].clone();
    pvcs.delete("data-etcd-1", &Default::default())
        .await
        .expect("delete pvc");
    pods_api
        .delete("etcd-1", &Default::default())
        .await
        .expect("delete pod");
    let pod = wait_for("etcd-1 recreated and ready", || async {
        let pod = mgmt.get(&pods_api, "etcd-1").await?;
        (pod["metadata"]["uid"] != old_pod_uid && has_condition(&pod, "Ready", "True"))
            .then_some(pod)
    })
    .await;
    let pvc = mgmt.get(&pvcs, "data-etcd-1").await.expect("new pvc");
    assert_ne!(
        pvc["metadata"]["uid"], old_pvc_uid,
        "a new claim (empty volume)"
    );
    let ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .expect("pod IP");
    let tls = mgmt
        .etcd_tls(hcp_ns, &format!("etcd-1.etcd-discovery.{hcp_ns}.svc"))
        .await;
    let url = format!("https://{ip}:2379");
    let keys = wait_for("rejoined member has every key", || async {
        let keys = etcd_keys(&url, &tls, "/kubernetes.io/configmaps/default/")
            .await
            .ok()?;
        (keys.iter().filter(|k| k.contains("/cm-")).count() == 20).then_some(keys)
    })
    .await;
    assert!(keys.iter().any(|k| k.ends_with("/before-pause")));
    let client =
        hcp_dr_e2e::procs::etcd::connect_client(std::slice::from_ref(&url), Some(&tls))
            .await
            .expect("connect");
    // the replacement was removed and re-added: three members, all started
    // (a member's name is published through raft just after it starts)
    wait_for("three started members", || {
        let mut client = client.clone();
        async move {
            let list = client.member_list().await.ok()?;
            let m = list.members();
            (m.len() == 3 && m.iter().all(|m| !m.name().is_empty())).then_some(())
        }
    })
    .await;
    mgmt.wait_condition("beta", "Available", "True").await;
    mgmt.stop().await;
}
