//! The Agent (bare metal) platform on the sandbox: a cluster made by
//! `hcp-dr cluster create --platform agent` on hosts of an inventory
//! (InfraEnv, BareMetalHosts with BMC Secrets, NMStateConfigs; the
//! sandbox's assisted-service makes the Agents and its CAPI provider binds
//! them). Its backup takes the inventory and `backups describe` shows it
//! (the InfraEnv's free host only with `--include-free-agents`); a
//! drill leaves it alone; a restore onto a cluster that already has the
//! hosts is refused; a migration with the free host moves it to mgmt-b (the source's hosts
//! detached first, so no host is ever deprovisioned) and removes it from
//! mgmt-a; with mgmt-b then lost, a restore brings it back onto mgmt-a.

use crate::support;

use std::time::Duration;

use hcp_dr_e2e::drill::hosted_client;
use hcp_dr_e2e::sandbox::{HostedClusterSpec, Sandbox, api_for, create_all, wait_available};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use support::*;

const HOSTS_NS: &str = "hosts";
const INFRA_ENV: &str = "demo-hosts";

fn kind(api_version: &str, kind: &str, ns: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"namespace": ns}})
}

async fn list(client: &kube::Client, api_version: &str, kind_name: &str) -> Vec<Value> {
    let api: Api<DynamicObject> = api_for(client, &kind(api_version, kind_name, HOSTS_NS));
    match api.list(&ListParams::default()).await {
        Ok(list) => list.items.into_iter().map(|o| serde_json::to_value(o).unwrap()).collect(),
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(err) => panic!("listing {kind_name}: {err}"),
    }
}

async fn agents(client: &kube::Client) -> Vec<Value> {
    list(client, "agent-install.openshift.io/v1beta1", "Agent").await
}

async fn hosts(client: &kube::Client) -> Vec<Value> {
    list(client, "metal3.io/v1alpha1", "BareMetalHost").await
}

fn bound(agents: &[Value]) -> Vec<&Value> {
    agents.iter().filter(|a| a.pointer("/spec/clusterDeploymentName/namespace").and_then(Value::as_str) == Some("clusters-demo")).collect()
}

async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..360 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The cluster's hosts serve it on `mgmt` (`name`): the Agents `bound` are
/// bound, approved workers with their discovered inventory; each
/// AgentMachine names its host, whose label names the AgentMachine's UID;
/// the BareMetalHosts are provisioned (adopted, not inspected again), not
/// detached, with their BMC Secrets.
async fn assert_hosts_serve(mgmt: &kube::Client, name: &str, bound_before: &[String]) {
    let moved = agents(mgmt).await;
    let bound_after: Vec<String> = bound(&moved).iter().map(|a| a["metadata"]["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(bound_after, bound_before, "the same hosts serve the cluster on {name}");
    for agent in bound(&moved) {
        assert_eq!(agent["spec"]["approved"], true, "{agent:#}");
        assert_eq!(agent["spec"]["role"], "worker", "{agent:#}");
        assert!(agent.pointer("/status/inventory/interfaces").is_some(), "the Agent's discovered inventory did not come back: {agent:#}");
    }
    let machines: Api<DynamicObject> = api_for(mgmt, &kind("capi-provider.agent-install.openshift.io/v1beta1", "AgentMachine", "clusters-demo"));
    let machines: Vec<Value> = machines.list(&ListParams::default()).await.expect("AgentMachines").items.into_iter().map(|o| serde_json::to_value(o).unwrap()).collect();
    assert_eq!(machines.len(), bound_before.len(), "{machines:#?}");
    for machine in &machines {
        let agent_name = machine.pointer("/status/agentRef/name").and_then(Value::as_str).unwrap_or_else(|| panic!("an AgentMachine without its host on {name}: {machine:#}"));
        let agent = moved.iter().find(|a| a["metadata"]["name"] == agent_name).expect("its Agent");
        assert_eq!(agent["metadata"]["labels"][hcp_dr::hosted::agent::AGENT_MACHINE_REF], machine["metadata"]["uid"], "{agent:#}");
    }
    let bmh_names: Vec<&str> = bound(&moved).iter().filter_map(|a| a["metadata"]["labels"][hcp_dr::hosted::agent::BMH_LABEL].as_str()).collect();
    let serving: Vec<Value> = hosts(mgmt).await.into_iter().filter(|h| bmh_names.contains(&h["metadata"]["name"].as_str().unwrap_or_default())).collect();
    assert_eq!(serving.len(), bound_before.len(), "{serving:#?}");
    for host in &serving {
        assert_eq!(host.pointer("/status/provisioning/state").and_then(Value::as_str), Some("provisioned"), "metal3 on {name} did not adopt the host: {host:#}");
        let annotations = &host["metadata"]["annotations"];
        assert!(annotations.get(hcp_dr::hosted::agent::DETACHED).is_none(), "the host is detached on {name}: {host:#}");
        let credentials = host.pointer("/spec/bmc/credentialsName").and_then(Value::as_str).expect("BMC credentials");
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(mgmt.clone(), HOSTS_NS);
        assert!(secrets.get_opt(credentials).await.unwrap().is_some(), "the BMC Secret {credentials} did not come with its host");
    }
}

/// The inventory checks a backup's preflight runs before anything is
/// paused, against mgmt-a's real objects: an agentNamespace that does not
/// exist, and a machine of the cluster whose Agent is gone or is bound to
/// another cluster (`taken`: an Agent of demo), each refused naming what is
/// wrong and where to look. The machines are a stand-in cluster's
/// (`clusters-ghost`), which no controller reconciles.
async fn refusals(mgmt: &kube::Client, taken: &str) {
    use hcp_dr::hosted::agent::{InventoryError, check};
    let refused = |result: Result<Option<Vec<String>>, InventoryError>| match result {
        Err(InventoryError::Refused(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    let mut ghost = hc_on(mgmt).await.expect("demo");
    ghost["metadata"]["name"] = json!("ghost");
    ghost["spec"]["platform"]["agent"]["agentNamespace"] = json!("no-such-hosts");
    let why = refused(check(mgmt, &ghost, "clusters-ghost").await);
    assert!(why.contains("agentNamespace `no-such-hosts`, but that namespace does not exist"), "{why}");

    ghost["spec"]["platform"]["agent"]["agentNamespace"] = json!(HOSTS_NS);
    let namespaces = api_for(mgmt, &json!({"apiVersion": "v1", "kind": "Namespace"}));
    namespaces.create(&Default::default(), &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "clusters-ghost"}})).unwrap()).await.expect("namespace");
    let machines = api_for(mgmt, &kind("capi-provider.agent-install.openshift.io/v1beta1", "AgentMachine", "clusters-ghost"));
    let machine = json!({"apiVersion": "capi-provider.agent-install.openshift.io/v1beta1", "kind": "AgentMachine", "metadata": {"name": "ghost-0", "namespace": "clusters-ghost"}, "spec": {}});
    machines.create(&Default::default(), &serde_json::from_value(machine).unwrap()).await.expect("AgentMachine");
    for (agent, expected) in [(taken, format!("uses Agent {HOSTS_NS}/{taken}, which is bound to clusters")), ("no-such-host", format!("uses Agent {HOSTS_NS}/no-such-host, which does not exist"))] {
        let status = json!({"status": {"agentRef": {"name": agent, "namespace": HOSTS_NS}}});
        machines.patch_status("ghost-0", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status)).await.expect("agentRef");
        let why = refused(check(mgmt, &ghost, "clusters-ghost").await);
        assert!(why.contains(&expected), "{why}");
    }
    namespaces.delete("clusters-ghost", &Default::default()).await.expect("delete the stand-in namespace");
}

/// A sandbox whose mgmt-a has an inventory of 3 hosts and `demo` made by
/// `hcp-dr cluster create --platform agent` on 2 of them.
async fn agent_env() -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let sandbox = Sandbox::up(&dir.path().join("sandbox")).await.expect("sandbox up");
    let mgmt = sandbox.clusters[0].api.client().await.expect("client");
    let spec = HostedClusterSpec { availability: "SingleReplica".into(), ..HostedClusterSpec::demo() };
    let mut env = Env { hosted: mgmt.clone(), dir, sandbox, spec, mgmt, replicas: Vec::new() };

    let pull = env.dir.path().join("pull-secret.json");
    std::fs::write(&pull, r#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#).unwrap();
    let create = |agent_ns: &str| {
        env.hcp_dr(
            &[
                "cluster", "create", "--name", "demo", "--platform", "agent", "--agent-namespace", agent_ns, "--availability", "SingleReplica",
                "--node-pool-replicas", "2", "--release-image", &env.spec.release_image, "--pull-secret", pull.to_str().unwrap(), "--base-domain",
                hcp_dr_e2e::sandbox::BASE_DOMAIN, "--wait", "5m",
            ],
            &[],
        )
    };
    // bad input: the hosts' namespace must exist; nothing is created
    let out = create("no-such-hosts");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`no-such-hosts` does not exist"), "{}", text(&out));

    create_all(&env.mgmt, &hcp_dr_e2e::sandbox::agent_inventory(HOSTS_NS, INFRA_ENV, 3)).await.expect("inventory");
    let out = create(HOSTS_NS);
    assert!(out.status.success(), "{}", text(&out));
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available");
    let mgmt = env.mgmt.clone();
    wait_for("2 Agents bound to demo", || async { bound(&agents(&mgmt).await).len() == 2 }).await;
    env.hosted = hosted_client(&env.mgmt, "clusters", "demo").await.expect("hosted client");
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_inventory_is_backed_up_drilled_refused_migrated_and_restored_with_the_source_lost() {
    let mut env = agent_env().await;
    let a = env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string();
    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    let endpoint = env.sandbox.s3.https_url().to_string();
    let hc = api_for(&env.mgmt, &kind("hypershift.openshift.io/v1beta1", "HostedCluster", "clusters")).get("demo").await.expect("demo");
    let infra_id = serde_json::to_value(hc).unwrap()["spec"]["infraID"].as_str().expect("infraID").to_string();
    let before = agents(&env.mgmt).await;
    let bound_before: Vec<String> = bound(&before).iter().map(|a| a["metadata"]["name"].as_str().unwrap().to_string()).collect();

    refusals(&env.mgmt, &bound_before[0]).await;

    // backup: the inventory is in the backup and its manifest
    let (folder, _) = backup_to_s3(&env);
    let out = env.hcp_dr(&["backups", "describe", &folder, "--s3-endpoint", &endpoint], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let described = String::from_utf8_lossy(&out.stdout);
    assert!(described.contains(&format!("agent inventory: 2 host(s) bound to the cluster, InfraEnv {INFRA_ENV}")), "{described}");
    for agent in &bound_before {
        assert!(described.contains(agent.as_str()), "{agent} missing:\n{described}");
    }
    let out = env.hcp_dr(&["backups", "describe", &folder, "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    let manifest = json_report(&out);
    let counts = &manifest["object_counts"];
    assert_eq!((counts["Agent"].as_u64(), counts["BareMetalHost"].as_u64(), counts["InfraEnv"].as_u64()), (Some(2), Some(2), Some(1)), "{manifest:#}");
    assert_eq!(counts["NMStateConfig"].as_u64(), Some(3), "the InfraEnv selects all 3 hosts' configs: {manifest:#}");

    // a drill on mgmt-b leaves the inventory where it is and says so
    let staging = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let out = env.hcp_dr(&["drill", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &staging, "--wait", "5m", "-o", "json"], &[]);
    let drill = json_report(&out);
    let dropped = drill.to_string();
    assert!(dropped.contains("agent-inventory"), "the drill report does not say the inventory was left alone: {drill:#}");
    assert!(agents(&b).await.is_empty() && hosts(&b).await.is_empty(), "the drill created hosts on mgmt-b");
    assert_eq!(bound(&agents(&env.mgmt).await).len(), 2, "the drill touched the source's Agents");

    // a restore onto a cluster that has the same hosts is refused, naming them; nothing is created
    let out = env.hcp_dr(&["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", env.sandbox.clusters[0].kubeconfig.to_str().unwrap()], &[]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("boot MAC address") && said.contains("one host cannot be managed from two places"), "{said}");

    // the InfraEnv's free host is taken only when asked
    let free: Vec<String> = before.iter().filter(|a| a["spec"]["clusterDeploymentName"].is_null()).map(|a| a["metadata"]["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(free.len(), 1, "{before:#?}");
    assert!(!described.contains(&free[0]), "a backup without --include-free-agents took the free host: {described}");
    let mut args = vec!["backup", "--hosted-cluster", "demo", "--include-free-agents", "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let with_free = json_report(&out)["backup"].as_str().expect("backup URL").to_string();
    let out = env.hcp_dr(&["backups", "describe", &with_free, "--s3-endpoint", &endpoint], &[]);
    let described = String::from_utf8_lossy(&out.stdout);
    assert!(described.contains("2 host(s) bound to the cluster (and 1 free)"), "{described}");
    assert!(described.lines().any(|l| l.contains(&free[0]) && l.trim_end().ends_with("free")), "{described}");

    // migrate, free host included: the inventory moves to mgmt-b, the
    // source's goes, no host is deprovisioned
    let mut args = migrate_json_args(&env);
    args.push("--include-free-agents".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let detached = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "detach-hosts").expect("detach-hosts ran")["output"]["hosts"].as_array().map_or(0, Vec::len);
    assert_eq!(detached, 3, "the cluster's two hosts and the free one: {report:#}");

    wait_available(&b, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available on mgmt-b");
    assert_hosts_serve(&b, "mgmt-b", &bound_before).await;
    let moved: Vec<String> = agents(&b).await.iter().map(|a| a["metadata"]["name"].as_str().unwrap().to_string()).collect();
    assert!(moved.contains(&free[0]), "the free Agent is not on mgmt-b: {moved:?}");
    assert_eq!(hosts(&b).await.len(), 3, "the three BareMetalHosts on mgmt-b");
    // mgmt-a keeps no host: the free one moved with the cluster
    let left = hosts(&env.mgmt).await;
    assert!(left.is_empty(), "{left:#?}");
    assert!(agents(&env.mgmt).await.is_empty(), "Agents are left on mgmt-a");
    let deprovisioned = hcp_dr_e2e::sandbox::deprovisioned_hosts(&env.sandbox.dir);
    assert!(deprovisioned.is_empty(), "a metal3 deprovisioned hosts: {deprovisioned:?}");
    // (the drill's own workers, under its own infra ID, come and go with it)
    let terminated: Vec<String> = hcp_dr_e2e::sandbox::terminated_instances(&env.sandbox.dir).into_iter().filter(|t| t.starts_with(&format!("{infra_id}/"))).collect();
    assert!(terminated.is_empty(), "CAPI terminated the cluster's workers: {terminated:?}");

    // mgmt-b is lost with the cluster on it: a restore of the migration's
    // backup onto mgmt-a brings the same hosts back there, each AgentMachine
    // with its host, and nothing is deprovisioned or terminated
    let backup = report["backup"].as_str().expect("the migration's backup").to_string();
    env.sandbox.lose("mgmt-b").await.expect("lose mgmt-b");
    let out = env.hcp_dr(&["restore", "--from", &backup, "--s3-endpoint", &endpoint, "--kubeconfig", &a, "--wait", "5m", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available on mgmt-a");
    assert_hosts_serve(&env.mgmt, "mgmt-a", &bound_before).await;
    assert_eq!(hosts(&env.mgmt).await.len(), 3, "mgmt-a has the cluster's two hosts and the free one again");
    let deprovisioned = hcp_dr_e2e::sandbox::deprovisioned_hosts(&env.sandbox.dir);
    assert!(deprovisioned.is_empty(), "a metal3 deprovisioned hosts: {deprovisioned:?}");
    let terminated: Vec<String> = hcp_dr_e2e::sandbox::terminated_instances(&env.sandbox.dir).into_iter().filter(|t| t.starts_with(&format!("{infra_id}/"))).collect();
    assert!(terminated.is_empty(), "CAPI terminated the cluster's workers: {terminated:?}");
}
