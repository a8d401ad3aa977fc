//! The Agent (bare metal) platform's inventory of a hosted cluster: what a
//! restored control plane needs besides etcd and the HyperShift objects to
//! get its workers back. It lives in the HostedCluster's
//! `spec.platform.agent.agentNamespace`, outside the control-plane
//! namespace:
//! - the Agents bound to the cluster (`spec.clusterDeploymentName.namespace`
//!   is its control-plane namespace), with their approval, role, hostname
//!   and status (the host's inventory, as discovered); with
//!   `--include-free-agents`, also the free Agents (bound to no cluster) of
//!   the InfraEnvs those came from, so a NodePool can grow on the
//!   destination;
//! - the BareMetalHosts those Agents run on (the Agent's
//!   `agent-install.openshift.io/bmh` label), with their BMC credential
//!   Secrets and their status (provisioning state, power), so metal3 on
//!   another management cluster adopts the provisioned host instead of
//!   inspecting or deprovisioning it;
//! - the InfraEnvs the Agents came from (their
//!   `infraenvs.agent-install.openshift.io` label), the NMStateConfigs each
//!   selects and the pull secret each names.
//!
//! Read-only here; the backup stages call [`read`] and the restore replays
//! what it exported.

use std::collections::BTreeSet;

use kube::api::ListParams;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Gvk, SECRET};
use crate::kube::{KubeError, api, get_json, list_if_served, list_json};

pub const AGENT: Gvk = Gvk {
    group: "agent-install.openshift.io",
    version: "v1beta1",
    kind: "Agent",
    plural: "agents",
};
pub const INFRA_ENV: Gvk = Gvk {
    group: "agent-install.openshift.io",
    version: "v1beta1",
    kind: "InfraEnv",
    plural: "infraenvs",
};
pub const NMSTATE_CONFIG: Gvk = Gvk {
    group: "agent-install.openshift.io",
    version: "v1beta1",
    kind: "NMStateConfig",
    plural: "nmstateconfigs",
};
pub const BARE_METAL_HOST: Gvk = Gvk {
    group: "metal3.io",
    version: "v1alpha1",
    kind: "BareMetalHost",
    plural: "baremetalhosts",
};
const AGENT_MACHINE_GROUP: &str = "capi-provider.agent-install.openshift.io";
pub const AGENT_MACHINE: Gvk = Gvk { group: AGENT_MACHINE_GROUP, version: "v1beta1", kind: "AgentMachine", plural: "agentmachines" };
/// The label the CAPI agent provider puts on the Agent an AgentMachine
/// took: the AgentMachine's UID. An Agent with it is never taken by another
/// AgentMachine; an AgentMachine without `status.agentRef` looks for the
/// Agent labelled with its own UID.
pub const AGENT_MACHINE_REF: &str = "agentMachineRef";
/// The annotation naming that AgentMachine's namespace.
pub const AGENT_MACHINE_REF_NAMESPACE: &str = "agentMachineRefNamespace";

/// The label naming the InfraEnv a BareMetalHost or an Agent belongs to.
pub const INFRAENV_LABEL: &str = "infraenvs.agent-install.openshift.io";
/// The label naming the BareMetalHost an Agent runs on.
pub const BMH_LABEL: &str = "agent-install.openshift.io/bmh";
/// metal3 leaves a detached host alone: no power change, and deleting the
/// BareMetalHost does not deprovision it.
pub const DETACHED: &str = "baremetalhost.metal3.io/detached";
/// A BareMetalHost created with this annotation (its status as JSON) gets
/// that status back from metal3, which then removes the annotation: how a
/// provisioned host moves between management clusters untouched.
pub const STATUS_ANNOTATION: &str = "baremetalhost.metal3.io/status";

/// Whether `obj` is part of an Agent inventory (Agent, InfraEnv,
/// NMStateConfig, BareMetalHost).
pub fn is_inventory(obj: &Value) -> bool {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    api_version.starts_with("agent-install.openshift.io/") || (api_version.starts_with("metal3.io/") && obj["kind"] == BARE_METAL_HOST.kind)
}

/// Whether `obj` is an Agent or a BareMetalHost, whose status is the host's
/// record (what was discovered and provisioned), or an AgentMachine, whose
/// status (`agentRef`) is its binding to its host: kept in the backup.
/// Without it a restored AgentMachine looks for an Agent labelled with its
/// new UID, finds none, and the provider takes a free host instead.
pub fn keeps_status(obj: &Value) -> bool {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    (api_version.starts_with("agent-install.openshift.io/") && obj["kind"] == AGENT.kind)
        || (api_version.starts_with("metal3.io/") && obj["kind"] == BARE_METAL_HOST.kind)
        || is_agent_machine(obj)
}

pub fn is_agent_machine(obj: &Value) -> bool {
    obj["apiVersion"].as_str().unwrap_or_default().starts_with("capi-provider.agent-install.openshift.io/") && obj["kind"] == AGENT_MACHINE.kind
}

/// After a restore created `machine` (an AgentMachine, as the server
/// returned it: its new UID) from `backed_up` (with the status the backup
/// kept): label the Agent it uses with the new UID, as the provider labels
/// the Agent it takes. The Agent still carries the old AgentMachine's UID,
/// which names nothing here. An Agent that is missing or bound to another
/// cluster is left alone (the restore's checks refused those); returns the
/// Agent relabelled.
pub async fn relabel_agent(client: &kube::Client, machine: &Value, backed_up: &Value) -> Result<Option<String>, KubeError> {
    let (Some(uid), Some(name)) = (machine.pointer("/metadata/uid").and_then(Value::as_str), backed_up.pointer("/status/agentRef/name").and_then(Value::as_str)) else {
        return Ok(None);
    };
    let machine_ns = machine["metadata"]["namespace"].as_str().unwrap_or_default();
    let ns = backed_up.pointer("/status/agentRef/namespace").and_then(Value::as_str).unwrap_or(machine_ns);
    let agents = api(client, &AGENT, ns);
    let what = format!("Agent {ns}/{name}");
    let Some(agent) = get_json(&agents, name, &what).await? else { return Ok(None) };
    if bound_to(&agent) != Some(machine_ns) {
        return Ok(None);
    }
    if agent["metadata"]["labels"][AGENT_MACHINE_REF] == uid && agent["metadata"]["annotations"][AGENT_MACHINE_REF_NAMESPACE] == machine_ns {
        return Ok(Some(what));
    }
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": agent["metadata"]["resourceVersion"],
        "labels": {AGENT_MACHINE_REF: uid},
        "annotations": {AGENT_MACHINE_REF_NAMESPACE: machine_ns},
    }});
    crate::kube::merge_patch(&agents, name, &patch, &what).await?;
    Ok(Some(what))
}

/// The `spec.platform.agent.agentNamespace` of an Agent-platform HostedCluster.
pub fn agent_namespace(hc: &Value) -> Option<&str> {
    (hc.pointer("/spec/platform/type").and_then(Value::as_str) == Some("Agent"))
        .then(|| hc.pointer("/spec/platform/agent/agentNamespace").and_then(Value::as_str))
        .flatten()
        .filter(|ns| !ns.is_empty())
}

/// The control-plane namespace an Agent is bound to (None: free).
pub fn bound_to(agent: &Value) -> Option<&str> {
    agent.pointer("/spec/clusterDeploymentName/namespace").and_then(Value::as_str).filter(|ns| !ns.is_empty())
}

/// One host of the inventory, as `backups describe` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// The Agent's name (the host's UUID).
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    pub approved: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bare_metal_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_mac: Option<String>,
    /// Bound to no cluster: a free host of the cluster's InfraEnv, taken
    /// with `--include-free-agents`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free: bool,
}

/// What a backup took of a cluster's Agent inventory (in its manifest).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInventory {
    pub namespace: String,
    pub hosts: Vec<Host>,
    pub infra_envs: Vec<String>,
    pub nmstate_configs: Vec<String>,
    /// The Secrets taken with them: BMC credentials, the InfraEnvs' pull secrets.
    pub secrets: Vec<String>,
}

impl AgentInventory {
    /// `2 host(s) bound to the cluster (and 1 free), InfraEnv x, 3 NMStateConfig(s), 4 Secret(s), in namespace NS`.
    pub fn summary(&self) -> String {
        let free = self.hosts.iter().filter(|h| h.free).count();
        format!(
            "{} host(s) bound to the cluster{}, InfraEnv {}, {} NMStateConfig(s), {} Secret(s), in namespace {}",
            self.hosts.len() - free,
            if free > 0 { format!(" (and {free} free)") } else { String::new() },
            if self.infra_envs.is_empty() { "(none)".to_string() } else { self.infra_envs.join(", ") },
            self.nmstate_configs.len(),
            self.secrets.len(),
            self.namespace
        )
    }
}

/// Why the inventory cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// Bad input: says what is wrong and how to fix it.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// The checks of [`read`] alone, without reading the hosts' objects (the
/// backup's preflight; the export reads them when the cluster is paused):
/// the names of the Agents bound to the cluster, None for another platform.
pub async fn check(client: &kube::Client, hc: &Value, hcp_ns: &str) -> Result<Option<Vec<String>>, InventoryError> {
    Ok(bound_agents(client, hc, hcp_ns).await?.map(|(_, agents)| agents.iter().map(|a| a["metadata"]["name"].as_str().unwrap_or_default().to_string()).collect()))
}

/// The agent namespace of `hc` and every Agent in it, after the refusals
/// of [`read`]; None for another platform.
async fn agents_of<'a>(client: &kube::Client, hc: &'a Value, hcp_ns: &str) -> Result<Option<(&'a str, Vec<Value>)>, InventoryError> {
    let Some(ns) = agent_namespace(hc) else { return Ok(None) };
    let label = format!("HostedCluster {}/{}", hc["metadata"]["namespace"].as_str().unwrap_or_default(), hc["metadata"]["name"].as_str().unwrap_or_default());
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    if namespaces.get_opt(ns).await.map_err(crate::kube::request(format!("reading Namespace {ns}")))?.is_none() {
        return Err(InventoryError::Refused(format!(
            "{label} is on the Agent platform with spec.platform.agent.agentNamespace `{ns}`, but that namespace does not exist on this management cluster: its hosts (Agents, BareMetalHosts, InfraEnv) would be missing from the backup. Fix the HostedCluster's agentNamespace, or recreate the inventory there"
        )));
    }
    let Some(agents) = list_if_served(&api(client, &AGENT, ns), &ListParams::default(), &format!("Agents in {ns}")).await? else {
        return Err(InventoryError::Refused(format!(
            "{label} is on the Agent platform, but this management cluster does not serve agent-install.openshift.io Agents (is the Infrastructure Operator / multicluster engine installed?)"
        )));
    };
    check_machines(client, hcp_ns, ns, &agents, &label).await?;
    Ok(Some((ns, agents)))
}

/// The agent namespace of `hc` and the Agents bound to the cluster, after
/// the refusals of [`read`]; None for another platform.
async fn bound_agents<'a>(client: &kube::Client, hc: &'a Value, hcp_ns: &str) -> Result<Option<(&'a str, Vec<Value>)>, InventoryError> {
    Ok(agents_of(client, hc, hcp_ns).await?.map(|(ns, agents)| (ns, agents.into_iter().filter(|a| bound_to(a) == Some(hcp_ns)).collect())))
}

/// The Agents of `hcp_ns`'s cluster and, with `include_free`, the free
/// Agents (bound to no cluster) of the InfraEnvs those came from.
fn taken(agents: Vec<Value>, hcp_ns: &str, include_free: bool) -> Vec<(Value, bool)> {
    let infra_envs: BTreeSet<String> = agents
        .iter()
        .filter(|a| bound_to(a) == Some(hcp_ns))
        .filter_map(|a| a["metadata"]["labels"][INFRAENV_LABEL].as_str().map(str::to_string))
        .collect();
    agents
        .into_iter()
        .filter_map(|a| match bound_to(&a) {
            Some(ns) if ns == hcp_ns => Some((a, false)),
            None if include_free && a["metadata"]["labels"][INFRAENV_LABEL].as_str().is_some_and(|ie| infra_envs.contains(ie)) => Some((a, true)),
            _ => None,
        })
        .collect()
}

/// The inventory of `hc` (an Agent-platform HostedCluster; None for any
/// other platform) and its objects, as read from the management cluster;
/// with `include_free`, also the free Agents of its InfraEnvs and their
/// BareMetalHosts (`--include-free-agents`). Refused: an agentNamespace
/// that does not exist, an AgentMachine of the cluster using an Agent that
/// is missing or bound to another cluster.
pub async fn read(client: &kube::Client, hc: &Value, hcp_ns: &str, include_free: bool) -> Result<Option<(AgentInventory, Vec<Value>)>, InventoryError> {
    let Some((ns, agents)) = agents_of(client, hc, hcp_ns).await? else { return Ok(None) };

    let mut objects: Vec<Value> = Vec::new();
    let mut inventory = AgentInventory { namespace: ns.to_string(), ..AgentInventory::default() };
    let mut infra_envs = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    for (agent, free) in taken(agents, hcp_ns, include_free) {
        let labels = &agent["metadata"]["labels"];
        let name = agent["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let bmh_name = labels[BMH_LABEL].as_str().map(str::to_string);
        let mut host = Host {
            agent: name,
            hostname: agent.pointer("/spec/hostname").and_then(Value::as_str).or_else(|| agent.pointer("/status/inventory/hostname").and_then(Value::as_str)).map(str::to_string),
            role: agent.pointer("/spec/role").and_then(Value::as_str).filter(|r| !r.is_empty()).map(str::to_string),
            approved: agent.pointer("/spec/approved").and_then(Value::as_bool).unwrap_or(false),
            bare_metal_host: bmh_name.clone(),
            boot_mac: None,
            free,
        };
        if let Some(infra_env) = labels[INFRAENV_LABEL].as_str() {
            infra_envs.insert(infra_env.to_string());
        }
        if let Some(bmh_name) = &bmh_name
            && let Some(bmh) = get_json(&api(client, &BARE_METAL_HOST, ns), bmh_name, &format!("BareMetalHost {ns}/{bmh_name}")).await?
        {
            host.boot_mac = bmh.pointer("/spec/bootMACAddress").and_then(Value::as_str).map(str::to_string);
            if let Some(credentials) = bmh.pointer("/spec/bmc/credentialsName").and_then(Value::as_str) {
                secrets.insert(credentials.to_string());
            }
            objects.push(typed(bmh, &BARE_METAL_HOST));
        }
        objects.push(typed(agent.clone(), &AGENT));
        inventory.hosts.push(host);
    }
    for name in &infra_envs {
        let Some(infra_env) = get_json(&api(client, &INFRA_ENV, ns), name, &format!("InfraEnv {ns}/{name}")).await? else {
            continue;
        };
        if let Some(pull) = infra_env.pointer("/spec/pullSecretRef/name").and_then(Value::as_str) {
            secrets.insert(pull.to_string());
        }
        if let Some(selector) = infra_env.pointer("/spec/nmStateConfigLabelSelector/matchLabels").and_then(Value::as_object).filter(|m| !m.is_empty()) {
            let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
            let params = ListParams::default().labels(&selector.join(","));
            for config in list_json(&api(client, &NMSTATE_CONFIG, ns), &params, &format!("NMStateConfigs in {ns}")).await? {
                inventory.nmstate_configs.push(config["metadata"]["name"].as_str().unwrap_or_default().to_string());
                objects.push(typed(config, &NMSTATE_CONFIG));
            }
        }
        inventory.infra_envs.push(name.clone());
        objects.push(typed(infra_env, &INFRA_ENV));
    }
    for name in &secrets {
        if let Some(secret) = get_json(&api(client, &SECRET, ns), name, &format!("Secret {ns}/{name}")).await? {
            inventory.secrets.push(name.clone());
            objects.push(typed(secret, &SECRET));
        }
    }
    Ok(Some((inventory, objects)))
}

/// `obj` with its apiVersion and kind (list items may lack them).
fn typed(mut obj: Value, gvk: &Gvk) -> Value {
    obj["apiVersion"] = Value::String(gvk.api_resource().api_version);
    obj["kind"] = Value::String(gvk.kind.to_string());
    obj
}

/// Every AgentMachine of the cluster must use an Agent of the agent
/// namespace that is bound to it: anything else is an inventory the backup
/// cannot take whole.
async fn check_machines(client: &kube::Client, hcp_ns: &str, ns: &str, agents: &[Value], label: &str) -> Result<(), InventoryError> {
    let Some(listed) = list_if_served(&api(client, &AGENT_MACHINE, hcp_ns), &ListParams::default(), &format!("AgentMachines in {hcp_ns}")).await? else {
        return Ok(());
    };
    for machine in listed {
        let Some(agent_name) = machine.pointer("/status/agentRef/name").and_then(Value::as_str) else { continue };
        let agent_ns = machine.pointer("/status/agentRef/namespace").and_then(Value::as_str).unwrap_or(ns);
        let machine_name = machine["metadata"]["name"].as_str().unwrap_or_default();
        if agent_ns != ns {
            return Err(InventoryError::Refused(format!(
                "AgentMachine {hcp_ns}/{machine_name} of {label} uses Agent {agent_ns}/{agent_name}, outside the cluster's agentNamespace `{ns}`: the backup takes the inventory of that namespace only. Move the host's Agent into `{ns}` or fix spec.platform.agent.agentNamespace"
            )));
        }
        match agents.iter().find(|a| a["metadata"]["name"] == agent_name) {
            None => {
                return Err(InventoryError::Refused(format!(
                    "AgentMachine {hcp_ns}/{machine_name} of {label} uses Agent {ns}/{agent_name}, which does not exist: the host is gone from the inventory. Check `kubectl -n {ns} get agents`"
                )));
            }
            Some(agent) if bound_to(agent) != Some(hcp_ns) => {
                let other = agent.pointer("/spec/clusterDeploymentName").map(|c| format!("{}/{}", c["namespace"].as_str().unwrap_or("?"), c["name"].as_str().unwrap_or("?")));
                return Err(InventoryError::Refused(format!(
                    "AgentMachine {hcp_ns}/{machine_name} of {label} uses Agent {ns}/{agent_name}, which is bound to {} instead: the same host cannot be backed up for two clusters. Find out which cluster the host serves (`kubectl -n {ns} get agent {agent_name} -o yaml`) and fix its spec.clusterDeploymentName",
                    other.unwrap_or_else(|| "no cluster".into())
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The host identities of `objects` (an inventory) that the destination
/// already has under another object: the same Agent (by name: the host's
/// UUID) or a BareMetalHost with the same boot MAC or BMC address. Each
/// finding says which objects clash.
pub async fn clashes(client: &kube::Client, objects: &[Value]) -> Result<Vec<String>, KubeError> {
    let mut found = Vec::new();
    let all = |gvk: &Gvk| kube::Api::<kube::api::DynamicObject>::all_with(client.clone(), &gvk.api_resource());
    let live_hosts = list_if_served(&all(&BARE_METAL_HOST), &ListParams::default(), "BareMetalHosts").await?.unwrap_or_default();
    let live_agents = list_if_served(&all(&AGENT), &ListParams::default(), "Agents").await?.unwrap_or_default();
    let path = |o: &Value| format!("{}/{}", o["metadata"]["namespace"].as_str().unwrap_or_default(), o["metadata"]["name"].as_str().unwrap_or_default());
    for obj in objects {
        if obj["kind"] == BARE_METAL_HOST.kind && is_inventory(obj) {
            for (field, pointer) in [("boot MAC address", "/spec/bootMACAddress"), ("BMC address", "/spec/bmc/address")] {
                let Some(value) = obj.pointer(pointer).and_then(Value::as_str).filter(|v| !v.is_empty()) else { continue };
                for live in &live_hosts {
                    if live.pointer(pointer).and_then(Value::as_str).is_some_and(|l| l.eq_ignore_ascii_case(value)) {
                        found.push(format!("BareMetalHost {} of the backup has the {field} {value} of BareMetalHost {} on the destination", path(obj), path(live)));
                    }
                }
            }
        }
        if obj["kind"] == AGENT.kind && is_inventory(obj) {
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            for live in live_agents.iter().filter(|l| l["metadata"]["name"] == name) {
                found.push(format!("Agent {} of the backup is the same host as Agent {} on the destination", path(obj), path(live)));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_an_agent_platform_has_an_agent_namespace() {
        let agent = json!({"spec": {"platform": {"type": "Agent", "agent": {"agentNamespace": "hosts"}}}});
        assert_eq!(agent_namespace(&agent), Some("hosts"));
        assert_eq!(agent_namespace(&json!({"spec": {"platform": {"type": "None"}}})), None);
        assert_eq!(agent_namespace(&json!({"spec": {"platform": {"type": "Agent", "agent": {"agentNamespace": ""}}}})), None);
    }

    #[test]
    fn agents_and_hosts_keep_their_status() {
        assert!(keeps_status(&json!({"apiVersion": "agent-install.openshift.io/v1beta1", "kind": "Agent"})));
        assert!(keeps_status(&json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost"})));
        assert!(!keeps_status(&json!({"apiVersion": "agent-install.openshift.io/v1beta1", "kind": "InfraEnv"})));
        assert!(!keeps_status(&json!({"apiVersion": "v1", "kind": "Secret"})));
        assert!(keeps_status(&json!({"apiVersion": "capi-provider.agent-install.openshift.io/v1beta1", "kind": "AgentMachine"})));
        assert!(!keeps_status(&json!({"apiVersion": "capi-provider.agent-install.openshift.io/v1beta1", "kind": "AgentCluster"})));
        assert!(is_inventory(&json!({"apiVersion": "agent-install.openshift.io/v1beta1", "kind": "NMStateConfig"})));
        assert!(!is_inventory(&json!({"apiVersion": "capi-provider.agent-install.openshift.io/v1beta1", "kind": "AgentMachine"})));
    }

    #[test]
    fn free_agents_are_taken_only_when_asked_and_only_from_the_clusters_infra_envs() {
        let agent = |name: &str, infra_env: &str, bound: Option<&str>| {
            let mut a = json!({"metadata": {"name": name, "labels": {INFRAENV_LABEL: infra_env}}, "spec": {}});
            if let Some(ns) = bound {
                a["spec"]["clusterDeploymentName"] = json!({"name": "demo", "namespace": ns});
            }
            a
        };
        let agents = vec![
            agent("ours", "hosts", Some("clusters-demo")),
            agent("free", "hosts", None),
            agent("theirs", "hosts", Some("clusters-other")),
            agent("free-elsewhere", "other-hosts", None),
        ];
        let names = |taken: Vec<(Value, bool)>| taken.iter().map(|(a, free)| (a["metadata"]["name"].as_str().unwrap().to_string(), *free)).collect::<Vec<_>>();
        assert_eq!(names(taken(agents.clone(), "clusters-demo", false)), [("ours".to_string(), false)]);
        assert_eq!(names(taken(agents, "clusters-demo", true)), [("ours".to_string(), false), ("free".to_string(), true)]);
    }
}
