//! Agent platform: the CAPI Cluster, AgentCluster and per-NodePool
//! MachineDeployment / MachineSet / Machines / AgentMachineTemplate /
//! AgentMachines, all accepted by the real CRD schemas; scaling the NodePool
//! scales machines and hosted nodes; deleting the HostedCluster tears it down
//! and terminates the instance of each Machine (`DIR/cloud/terminated`).

use crate::operator_support;

use operator_support::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_cluster_gets_capi_objects_scales_and_tears_down() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    mgmt.create_hosted_cluster_on(
        "delta",
        "SingleReplica",
        2,
        None,
        json!({"type": "Agent", "agent": {"agentNamespace": "agents"}}),
        json!({"type": "Agent", "agent": {}}),
    )
    .await;
    let hc = mgmt.wait_condition("delta", "Available", "True").await;
    let infra_id = hc
        .pointer("/spec/infraID")
        .and_then(Value::as_str)
        .expect("infraID defaulted")
        .to_string();
    let ns = Some("clusters-delta");
    let capi = |kind: &str, plural: &str| mgmt.api("cluster.x-k8s.io", "v1beta1", kind, plural, ns);
    let agent = |kind: &str, plural: &str| {
        mgmt.api(
            "capi-provider.agent-install.openshift.io",
            "v1beta1",
            kind,
            plural,
            ns,
        )
    };
    let cluster = mgmt
        .get(&capi("Cluster", "clusters"), &infra_id)
        .await
        .expect("CAPI Cluster named after the infraID");
    assert_eq!(
        cluster
            .pointer("/spec/infrastructureRef/kind")
            .and_then(Value::as_str),
        Some("AgentCluster")
    );
    assert!(
        mgmt.get(&agent("AgentCluster", "agentclusters"), "delta")
            .await
            .is_some()
    );
    let md = mgmt
        .get(
            &capi("MachineDeployment", "machinedeployments"),
            "delta-workers",
        )
        .await
        .expect("MachineDeployment");
    assert_eq!(
        md.pointer("/spec/replicas").and_then(Value::as_u64),
        Some(2)
    );
    let count =
        |kind: &'static str, plural: &'static str, group: &'static str, version: &'static str| {
            let api = mgmt.api(group, version, kind, plural, ns);
            async move {
                api.list(&Default::default())
                    .await
                    .map(|l| l.items.len())
                    .unwrap_or(usize::MAX)
            }
        };
    assert_eq!(
        count("MachineSet", "machinesets", "cluster.x-k8s.io", "v1beta1").await,
        1
    );
    assert_eq!(
        count(
            "AgentMachineTemplate",
            "agentmachinetemplates",
            "capi-provider.agent-install.openshift.io",
            "v1beta1"
        )
        .await,
        1
    );
    wait_for("2 Machines and AgentMachines", || async {
        let m = count("Machine", "machines", "cluster.x-k8s.io", "v1beta1").await;
        let a = count(
            "AgentMachine",
            "agentmachines",
            "capi-provider.agent-install.openshift.io",
            "v1beta1",
        )
        .await;
        (m == 2 && a == 2).then_some(())
    })
    .await;

    // Scale the pool (through the scale subresource's field) to 3.
    let np_api = mgmt.api(
        "hypershift.openshift.io",
        "v1beta1",
        "NodePool",
        "nodepools",
        Some(HC_NS),
    );
    mgmt.merge(&np_api, "delta-workers", json!({"spec": {"replicas": 3}}))
        .await;
    wait_for("3 Machines", || async {
        (count("Machine", "machines", "cluster.x-k8s.io", "v1beta1").await == 3).then_some(())
    })
    .await;
    let hosted = mgmt.hosted_client("delta").await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(hosted.clone());
    wait_for("3 hosted nodes named after the machines", || async {
        let list = nodes.list(&Default::default()).await.ok()?;
        (list.items.len() == 3).then_some(())
    })
    .await;
    wait_for("NodePool reports 3 ready replicas", || async {
        let np = mgmt.get(&np_api, "delta-workers").await?;
        (np.pointer("/status/replicas").and_then(Value::as_u64) == Some(3)
            && has_condition(&np, "Ready", "True"))
        .then_some(())
    })
    .await;

    // Deleting the HostedCluster (not paused) removes pools, the HCP namespace and the finalizer.
    mgmt.hc_api()
        .delete("delta", &Default::default())
        .await
        .expect("delete HC");
    wait_for("HostedCluster gone", || async {
        mgmt.get(&mgmt.hc_api(), "delta")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        mgmt.get(&np_api, "delta-workers").await.is_none(),
        "NodePool deleted"
    );
    let namespaces = mgmt.api("", "v1", "Namespace", "namespaces", None);
    wait_for("HCP namespace gone", || async {
        mgmt.get(&namespaces, "clusters-delta")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    // CAPI terminated the instance of each of the 3 Machines, once
    let terminated = hcp_dr_e2e::operator::cloud::terminated(&mgmt.dir.path().join("cloud"));
    assert_eq!(terminated.len(), 3, "{terminated:?}");
    for line in &terminated {
        assert!(
            line.starts_with(&format!("{infra_id}/")) && line.ends_with(" by mgmt-a"),
            "{line}"
        );
    }
    mgmt.stop().await;
}
