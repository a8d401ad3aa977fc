//! A SingleReplica HostedCluster (platform None) on the simulated operator:
//! Available, a real TLS etcd member, a working hosted API whose data lands in
//! that member, nodes and OVN pods; then a second cluster restored from a
//! snapshot of the first through `restoreSnapshotURL`.

use crate::operator_support;

use operator_support::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_replica_cluster_becomes_available_and_restores_from_a_snapshot() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    mgmt.create_hosted_cluster("alpha", "SingleReplica", 2, None)
        .await;
    let hc = mgmt.wait_condition("alpha", "Available", "True").await;
    assert_eq!(
        hc.pointer("/status/kubeconfig/name")
            .and_then(Value::as_str),
        Some("alpha-admin-kubeconfig")
    );
    assert_eq!(
        hc.pointer("/status/version/history/0/state")
            .and_then(Value::as_str),
        Some("Completed")
    );
    assert!(
        hc.pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|x| x == "hypershift.openshift.io/finalizer"))
    );

    let hcp_ns = "clusters-alpha";
    let sts = mgmt
        .get(
            &mgmt.api("apps", "v1", "StatefulSet", "statefulsets", Some(hcp_ns)),
            "etcd",
        )
        .await
        .expect("etcd sts");
    assert_eq!(
        sts.pointer("/spec/replicas").and_then(Value::as_u64),
        Some(1)
    );
    let hcp = mgmt
        .get(
            &mgmt.api(
                "hypershift.openshift.io",
                "v1beta1",
                "HostedControlPlane",
                "hostedcontrolplanes",
                Some(hcp_ns),
            ),
            "alpha",
        )
        .await
        .expect("HostedControlPlane");
    assert_eq!(
        hcp.pointer("/spec/releaseImage").and_then(Value::as_str),
        Some(RELEASE)
    );
    assert_eq!(
        hcp.pointer("/spec/controllerAvailabilityPolicy")
            .and_then(Value::as_str),
        Some("SingleReplica")
    );
    for s in [
        "pull-secret",
        "alpha-etcd-encryption-key",
        "etcd-server-tls",
        "etcd-peer-tls",
        "etcd-client-tls",
        "admin-kubeconfig",
    ] {
        assert!(
            mgmt.get(&mgmt.api("", "v1", "Secret", "secrets", Some(hcp_ns)), s)
                .await
                .is_some(),
            "Secret {s} in {hcp_ns}"
        );
    }
    let pvc = mgmt
        .get(
            &mgmt.api(
                "",
                "v1",
                "PersistentVolumeClaim",
                "persistentvolumeclaims",
                Some(hcp_ns),
            ),
            "data-etcd-0",
        )
        .await;
    assert_eq!(
        pvc.as_ref()
            .and_then(|p| p.pointer("/status/phase"))
            .and_then(Value::as_str),
        Some("Bound")
    );

    // The member is a real etcd answering over TLS for its DNS name, not its IP.
    let pod = mgmt.pod(hcp_ns, "etcd-0").await.expect("etcd-0");
    let ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .expect("pod IP")
        .to_string();
    let url = format!("https://{ip}:2379");
    let tls = mgmt
        .etcd_tls(hcp_ns, &format!("etcd-0.etcd-discovery.{hcp_ns}.svc"))
        .await;
    let mut etcd = hcp_dr_e2e::procs::etcd::connect_client(std::slice::from_ref(&url), Some(&tls))
        .await
        .expect("etcd connects");
    let status = etcd.status().await.expect("member status over TLS");
    assert_ne!(status.leader(), 0, "member has a leader");
    let by_ip = mgmt.etcd_tls(hcp_ns, &ip).await;
    let rejected = async {
        let mut c =
            hcp_dr_e2e::procs::etcd::connect_client(std::slice::from_ref(&url), Some(&by_ip))
                .await
                .map_err(|e| e.to_string())?;
        c.status().await.map(|_| ()).map_err(|e| e.to_string())
    }
    .await;
    assert!(
        rejected.is_err(),
        "the server certificate must not be valid for the pod IP"
    );

    // The hosted API serves through the admin kubeconfig; its data is in the member.
    let hosted = mgmt.hosted_client("alpha").await;
    wait_for("hosted API accepts a ConfigMap", || async {
        put_configmap(&hosted, "probe", "hello").await.ok()
    })
    .await;
    let keys = etcd_keys(&url, &tls, "/kubernetes.io/configmaps/default/")
        .await
        .expect("read member keys");
    assert!(
        keys.iter()
            .any(|k| k == "/kubernetes.io/configmaps/default/probe"),
        "keys: {keys:?}"
    );

    // Nodes per NodePool replica, Ready, with one OVN pod each; the pool is Ready.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(hosted.clone());
    wait_for("2 hosted nodes", || async {
        let list = nodes.list(&Default::default()).await.ok()?;
        (list.items.len() == 2).then_some(())
    })
    .await;
    let ovn: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(hosted.clone(), "openshift-ovn-kubernetes");
    let pods = wait_for("2 ovnkube-node pods", || async {
        let list = ovn.list(&Default::default()).await.ok()?;
        (list.items.len() == 2).then_some(list.items)
    })
    .await;
    assert!(pods.iter().all(|p| {
        p.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("ovnkube-node-"))
    }));
    // A deleted OVN pod is recreated (as its DaemonSet would).
    let victim = pods[0].metadata.name.clone().expect("name");
    ovn.delete(&victim, &Default::default())
        .await
        .expect("delete ovnkube pod");
    wait_for("ovnkube-node pod recreated", || async {
        let list = ovn.list(&Default::default()).await.ok()?;
        let names: Vec<String> = list
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (names.len() == 2 && !names.contains(&victim)).then_some(())
    })
    .await;
    let np_api = mgmt.api(
        "hypershift.openshift.io",
        "v1beta1",
        "NodePool",
        "nodepools",
        Some(HC_NS),
    );
    wait_for("NodePool Ready", || async {
        let np = mgmt.get(&np_api, "alpha-workers").await?;
        (has_condition(&np, "Ready", "True")
            && np.pointer("/status/replicas").and_then(Value::as_u64) == Some(2))
        .then_some(())
    })
    .await;

    // Snapshot the member and restore it into a fresh HighlyAvailable cluster.
    let mut snapshot = Vec::new();
    let mut stream = etcd.snapshot().await.expect("snapshot stream");
    while let Some(chunk) = stream.message().await.expect("snapshot chunk") {
        snapshot.extend_from_slice(chunk.blob());
    }
    assert!(!snapshot.is_empty());
    let (snapshot_url, server) = serve_snapshot(&mgmt.ca, snapshot).await;
    mgmt.create_hosted_cluster("restored", "HighlyAvailable", 0, Some(&snapshot_url))
        .await;
    mgmt.wait_condition("restored", "Available", "True").await;
    let restored = mgmt.hosted_client("restored").await;
    let value = wait_for("restored cluster serves the ConfigMap", || async {
        get_configmap(&restored, "probe").await.ok().flatten()
    })
    .await;
    assert_eq!(value, "hello");
    let r_ns = "clusters-restored";
    for i in 0..3 {
        let pod = mgmt
            .pod(r_ns, &format!("etcd-{i}"))
            .await
            .expect("restored member pod");
        let ip = pod
            .pointer("/status/podIP")
            .and_then(Value::as_str)
            .expect("pod IP");
        let tls = mgmt
            .etcd_tls(r_ns, &format!("etcd-{i}.etcd-discovery.{r_ns}.svc"))
            .await;
        let keys = etcd_keys(
            &format!("https://{ip}:2379"),
            &tls,
            "/kubernetes.io/configmaps/default/",
        )
        .await
        .expect("member keys");
        assert!(
            keys.iter().any(|k| k.ends_with("/probe")),
            "member etcd-{i} restored the key: {keys:?}"
        );
    }
    server.abort();
    mgmt.stop().await;
}
