//! The Agent platform's controllers: an inventory of bare-metal hosts
//! ([`hcp_dr_e2e::sandbox::agent_inventory`]) becomes provisioned
//! BareMetalHosts and approved Agents; an Agent-platform HostedCluster's
//! AgentMachines get Agents bound to the cluster; a host created with
//! metal3's status annotation gets that status back; scaling the NodePool
//! down unbinds an Agent; an AgentMachine without status (as a restored one
//! is) gets back the Agent bound to the cluster, not a free one; deleting a
//! detached host deprovisions nothing, deleting a managed one deprovisions
//! it. Everything passes the real CRD schemas when they are present.

use crate::operator_support;

use std::collections::BTreeSet;

use hcp_dr_e2e::operator::agent::{
    BMH_FINALIZER, BMH_LABEL, DETACHED_ANNOTATION, INFRAENV_LABEL, STATUS_ANNOTATION, agent_name,
};
use hcp_dr_e2e::sandbox::{agent_inventory, create_all, deprovisioned_hosts, inventory_mac};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use operator_support::*;
use serde_json::{Value, json};

const HOSTS_NS: &str = "hardware";
const INFRAENV: &str = "rack-a";
const HCP_NS: &str = "clusters-echo";

async fn items(api: &Api<DynamicObject>) -> Option<Vec<Value>> {
    let list = api.list(&Default::default()).await.ok()?;
    Some(
        list.items
            .into_iter()
            .map(|o| serde_json::to_value(o).expect("json"))
            .collect(),
    )
}

fn str_at<'a>(obj: &'a Value, ptr: &str) -> Option<&'a str> {
    obj.pointer(ptr).and_then(Value::as_str)
}

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["labels"][key].as_str()
}

/// The names of the Agents bound to the hosted cluster `echo`.
fn bound_to_echo(agents: &[Value]) -> BTreeSet<String> {
    agents
        .iter()
        .filter(|a| {
            str_at(a, "/spec/clusterDeploymentName/name") == Some("echo")
                && str_at(a, "/spec/clusterDeploymentName/namespace") == Some(HCP_NS)
        })
        .map(|a| str_at(a, "/metadata/name").unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_become_agents_bound_to_the_cluster_and_are_deprovisioned_only_when_managed() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    create_all(&mgmt.client, &agent_inventory(HOSTS_NS, INFRAENV, 3))
        .await
        .expect("the inventory is accepted");
    let bmhs = mgmt.api(
        "metal3.io",
        "v1alpha1",
        "BareMetalHost",
        "baremetalhosts",
        Some(HOSTS_NS),
    );
    let agents = mgmt.api(
        "agent-install.openshift.io",
        "v1beta1",
        "Agent",
        "agents",
        Some(HOSTS_NS),
    );
    let macs: Vec<String> = (0..3)
        .map(|i| inventory_mac(HOSTS_NS, INFRAENV, i))
        .collect();
    assert_eq!(
        macs.iter().collect::<BTreeSet<_>>().len(),
        3,
        "distinct MACs"
    );

    // metal3: each host inspected and provisioned (the discovery ISO), powered on
    let hosts = wait_for("3 BareMetalHosts provisioned", || async {
        let hosts = items(&bmhs).await?;
        (hosts.len() == 3
            && hosts.iter().all(|h| {
                str_at(h, "/status/provisioning/state") == Some("provisioned")
                    && h["metadata"]["finalizers"]
                        .as_array()
                        .is_some_and(|f| f.iter().any(|f| f == BMH_FINALIZER))
            }))
        .then_some(hosts)
    })
    .await;
    for h in &hosts {
        assert_eq!(h["status"]["operationalStatus"], "OK", "{h}");
        assert_eq!(h["status"]["poweredOn"], true, "{h}");
        assert_eq!(h["status"]["hardwareProfile"], "unknown", "{h}");
        assert!(
            str_at(h, "/status/provisioning/ID").is_some_and(|id| !id.is_empty()),
            "{h}"
        );
    }

    // assisted-service and BMAC: one approved Agent per host, named from its MAC
    let found = wait_for("3 Agents with their inventory", || async {
        let found = items(&agents).await?;
        (found.len() == 3 && found.iter().all(|a| has_condition(a, "Validated", "True")))
            .then_some(found)
    })
    .await;
    for h in &hosts {
        let host = str_at(h, "/metadata/name").expect("name");
        let mac = str_at(h, "/spec/bootMACAddress").expect("boot MAC");
        let agent = found
            .iter()
            .find(|a| label(a, BMH_LABEL) == Some(host))
            .unwrap_or_else(|| panic!("an Agent labelled {BMH_LABEL}: {host}"));
        assert_eq!(
            str_at(agent, "/metadata/name"),
            Some(agent_name(mac).as_str())
        );
        assert_eq!(label(agent, INFRAENV_LABEL), Some(INFRAENV));
        assert_eq!(agent["spec"]["approved"], true);
        assert_eq!(agent["spec"]["hostname"], host);
        assert_eq!(
            agent["status"]["inventory"]["interfaces"][0]["macAddress"],
            mac
        );
        assert!(agent["spec"]["clusterDeploymentName"].is_null(), "{agent}");
    }

    // the CAPI provider binds two of them to the cluster's two AgentMachines
    mgmt.create_hosted_cluster_on(
        "echo",
        "SingleReplica",
        2,
        None,
        json!({"type": "Agent", "agent": {"agentNamespace": HOSTS_NS}}),
        json!({"type": "Agent", "agent": {}}),
    )
    .await;
    let machines = mgmt.api(
        "capi-provider.agent-install.openshift.io",
        "v1beta1",
        "AgentMachine",
        "agentmachines",
        Some(HCP_NS),
    );
    let bound = wait_for("2 AgentMachines using 2 Agents bound to echo", || async {
        let used: BTreeSet<String> = items(&machines)
            .await?
            .iter()
            .filter_map(|m| str_at(m, "/status/agentRef/name").map(str::to_string))
            .collect();
        let bound = bound_to_echo(&items(&agents).await?);
        (used.len() == 2 && used == bound).then_some(bound)
    })
    .await;
    for a in items(&agents).await.expect("agents") {
        let name = str_at(&a, "/metadata/name").unwrap_or_default();
        if bound.contains(name) {
            assert_eq!(a["spec"]["role"], "worker", "{a}");
        }
    }
    for m in items(&machines).await.expect("machines") {
        assert_eq!(m["status"]["agentRef"]["namespace"], HOSTS_NS, "{m}");
    }

    // metal3 restores a moved host's status from its annotation, then drops it
    let saved = json!({
        "operationalStatus": "OK", "errorMessage": "", "errorCount": 0, "provisioningFailCount": 0,
        "poweredOn": true, "hardwareProfile": "moved",
        "provisioning": {"state": "provisioned", "ID": "3a7c2e0e-moved-from-another-hub"},
        "lastUpdated": "2025-01-01T00:00:00Z",
    });
    mgmt.create(
        &bmhs,
        json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": "moved", "namespace": HOSTS_NS,
                         "annotations": {STATUS_ANNOTATION: saved.to_string()}},
            "spec": {"online": true, "bootMACAddress": "52:54:00:00:00:99",
                     "bmc": {"address": "redfish-virtualmedia+https://192.0.2.99/redfish/v1/Systems/1",
                             "credentialsName": format!("{INFRAENV}-host-0-bmc-secret")}},
        }),
    )
    .await;
    let moved = wait_for(
        "the moved host's status restored and its annotation removed",
        || async {
            let h = mgmt.get(&bmhs, "moved").await?;
            (str_at(&h, "/status/provisioning/ID") == Some("3a7c2e0e-moved-from-another-hub")
                && h["metadata"]["annotations"][STATUS_ANNOTATION].is_null())
            .then_some(h)
        },
    )
    .await;
    assert_eq!(moved["status"]["hardwareProfile"], "moved", "{moved}");
    assert_eq!(
        moved["status"]["lastUpdated"], "2025-01-01T00:00:00Z",
        "{moved}"
    );

    // scaling the pool to 1 deletes an AgentMachine and unbinds its Agent
    let nodepools = mgmt.api(
        "hypershift.openshift.io",
        "v1beta1",
        "NodePool",
        "nodepools",
        Some(HC_NS),
    );
    mgmt.merge(&nodepools, "echo-workers", json!({"spec": {"replicas": 1}}))
        .await;
    let still = wait_for("1 AgentMachine and 1 Agent bound to echo", || async {
        let left = items(&machines).await?;
        let bound = bound_to_echo(&items(&agents).await?);
        (left.len() == 1 && bound.len() == 1).then_some((left, bound))
    })
    .await;
    assert_eq!(
        str_at(&still.0[0], "/status/agentRef/name"),
        still.1.iter().next().map(String::as_str),
        "the AgentMachine left uses the Agent left bound"
    );
    assert_eq!(items(&agents).await.expect("agents").len(), 3);

    // an AgentMachine without status (as restored) gets back the Agent bound
    // to the cluster, not a free one
    let machine = str_at(&still.0[0], "/metadata/name")
        .expect("name")
        .to_string();
    let cleared = machines
        .patch_status(
            &machine,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"agentRef": null, "addresses": null}})),
        )
        .await
        .expect("clear the AgentMachine's status");
    assert!(
        cleared.data.pointer("/status/agentRef").is_none(),
        "{:?}",
        cleared.data
    );
    let readopted = wait_for("the AgentMachine uses an Agent again", || async {
        let m = mgmt.get(&machines, &machine).await?;
        str_at(&m, "/status/agentRef/name").map(str::to_string)
    })
    .await;
    assert_eq!(still.1.iter().next(), Some(&readopted));
    assert_eq!(
        bound_to_echo(&items(&agents).await.expect("agents")),
        still.1
    );

    // deleting a detached host: metal3 leaves the machine alone
    let host = |i: usize| format!("{INFRAENV}-host-{i}");
    mgmt.merge(
        &bmhs,
        &host(1),
        json!({"metadata": {"annotations": {DETACHED_ANNOTATION: "hcp-dr"}}}),
    )
    .await;
    bmhs.delete(&host(1), &Default::default())
        .await
        .expect("delete the detached host");
    wait_for("the detached host gone", || async {
        mgmt.get(&bmhs, &host(1)).await.is_none().then_some(())
    })
    .await;
    assert_eq!(
        deprovisioned_hosts(mgmt.dir.path()),
        Vec::<String>::new(),
        "a detached host is not deprovisioned"
    );

    // deleting a managed host: metal3 powers it off and wipes it
    bmhs.delete(&host(2), &Default::default())
        .await
        .expect("delete the managed host");
    wait_for("the managed host gone", || async {
        mgmt.get(&bmhs, &host(2)).await.is_none().then_some(())
    })
    .await;
    assert_eq!(
        deprovisioned_hosts(mgmt.dir.path()),
        vec![format!("{} by mgmt-a", macs[2])]
    );
    mgmt.stop().await;
}
