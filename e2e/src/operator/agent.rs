//! The Agent (bare metal) platform's own controllers, as far as DR needs
//! them: metal3's BareMetalHost controller, assisted-service with its
//! BareMetalAgentController (BMAC), and the Cluster API agent provider.
//! Each does nothing, quietly, where its CRDs are not served (a 404 on list:
//! the platform is absent).
//!
//! - metal3: a BareMetalHost with the annotation
//!   `baremetalhost.metal3.io/paused` is left alone. Any other gets the
//!   finalizer `baremetalhost.metal3.io`. A host with an empty status and the
//!   annotation `baremetalhost.metal3.io/status` gets that status back through
//!   the status subresource (no re-inspection: how hosts move between
//!   management clusters), and the annotation is removed once a status is
//!   there. A host with an empty status and no such annotation that metal3
//!   manages (not `baremetalhost.metal3.io/detached`) gets the status of a
//!   host inspected and booted into the discovery ISO (provisioned, powered
//!   as `spec.online`); a managed host's power follows `spec.online`. A
//!   detached host's status is left as it is. Deleting a managed host
//!   deprovisions it (powered off and wiped): `<bootMACAddress> by
//!   <management cluster>` is appended to `DIR/cloud/deprovisioned`
//!   ([`super::cloud`]) and the finalizer removed; a detached one just loses
//!   its finalizer.
//! - assisted-service and BMAC: for each managed, provisioned
//!   BareMetalHost labelled `infraenvs.agent-install.openshift.io: <name>`
//!   with that InfraEnv in its namespace, there is one Agent in that
//!   namespace labelled `agent-install.openshift.io/bmh: <host>`: an existing
//!   one (restored by hcp-dr, say) is kept, else one is created, named by a
//!   UUID derived from the host's boot MAC (the same host gets the same name
//!   on every management cluster), approved (BMAC approves the Agents of its
//!   hosts), with the host's inventory and ready conditions as status. An
//!   Agent with a status keeps it.
//! - The CAPI agent provider, as the real one (openshift/
//!   cluster-api-provider-agent) does: for each AgentMachine of a NodePool
//!   of an Agent-platform HostedCluster, neither paused nor being deleted,
//!   without `status.agentRef`: the Agent of the HostedCluster's
//!   `spec.platform.agent.agentNamespace` labelled `agentMachineRef: <the
//!   AgentMachine's UID>` (one it took before it could write its status),
//!   else an approved, unbound Agent without that label matching the
//!   NodePool's `agentLabelSelector`. An Agent bound to the cluster whose
//!   label names another AgentMachine (one restored with a new UID) is NOT
//!   taken back: a restore must bring the AgentMachines' status back. The
//!   Agent is labelled, annotated `agentMachineRefNamespace`, bound
//!   (`spec.clusterDeploymentName: {name: <hc>, namespace: <hcp
//!   namespace>}`, `spec.role: worker`) and named in the AgentMachine's
//!   `status.agentRef`. When the HyperShift reconciler deletes an
//!   AgentMachine (a NodePool scaled down or deleted, a HostedCluster deleted,
//!   never while paused), its Agent is unbound and unlabelled first.
//!
//! Not simulated: BMAC setting the host's image and detaching it once its
//! Agent is installed, the Agents' installation progress and `Bound`/`Installed` conditions, metal3's
//! HardwareData objects.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::Utc;
use serde_json::{Map, Value, json};

use super::hypershift::{NODEPOOL_LABEL, Pause, hcp_namespace, nodepools_of, pause_state};
use super::objects::{
    self, AGENT, AGENT_MACHINE, BARE_METAL_HOST, HOSTED_CLUSTER, INFRA_ENV, NODE_POOL, Res,
    is_deleting, name_of, ns_of, str_at, uid_of,
};
use super::workloads::{add_finalizer, remove_finalizer};
use super::{Ctx, OperatorError, log_failure};

/// Label on a BareMetalHost (and on its Agent) naming the InfraEnv.
pub const INFRAENV_LABEL: &str = "infraenvs.agent-install.openshift.io";
/// Label on an Agent naming its BareMetalHost.
pub const BMH_LABEL: &str = "agent-install.openshift.io/bmh";
/// Annotation by which metal3 stops managing a host: no power change, and
/// deleting the BareMetalHost does not deprovision it.
pub const DETACHED_ANNOTATION: &str = "baremetalhost.metal3.io/detached";
/// Annotation by which metal3 stops reconciling a host altogether.
pub const PAUSED_ANNOTATION: &str = "baremetalhost.metal3.io/paused";
/// Annotation holding a BareMetalHost's status as JSON, restored by metal3
/// into an empty status.
pub const STATUS_ANNOTATION: &str = "baremetalhost.metal3.io/status";
/// metal3's finalizer on BareMetalHosts.
pub const BMH_FINALIZER: &str = "baremetalhost.metal3.io";

/// One pass of the three controllers.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let hosts = hosts(&ctx).await;
    let machines = capi_provider(&ctx).await;
    hosts.and(machines)
}

/// metal3, then assisted-service and BMAC, over the BareMetalHosts.
async fn hosts(ctx: &Ctx) -> Result<(), OperatorError> {
    let Some(hosts) = list_served(ctx, &BARE_METAL_HOST, None).await? else {
        return Ok(());
    };
    if hosts.is_empty() {
        return Ok(());
    }
    metal3(ctx, &hosts).await;
    assisted(ctx, &hosts).await
}

/// LIST; `None` when the kind is not served (404: the platform is absent).
async fn list_served(
    ctx: &Ctx,
    res: &Res,
    ns: Option<&str>,
) -> Result<Option<Vec<Value>>, OperatorError> {
    match ctx.kube.list(res, ns, None).await {
        Ok(items) => Ok(Some(items)),
        Err(e) if objects::status_code(&e) == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

fn meta_entry<'a>(obj: &'a Value, map: &str, key: &str) -> Option<&'a str> {
    obj.pointer(&format!("/metadata/{map}"))
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
}

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta_entry(obj, "labels", key)
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta_entry(obj, "annotations", key)
}

fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|f| f.as_str() == Some(finalizer)))
}

/// Whether an object has no status, or an empty one.
fn status_is_empty(obj: &Value) -> bool {
    obj.get("status")
        .is_none_or(|s| s.is_null() || s.as_object().is_some_and(Map::is_empty))
}

fn key(obj: &Value) -> String {
    format!("{}/{}", ns_of(obj), name_of(obj))
}

/// A UUID derived from `parts` (a SHA-256 shaped as a version 8 UUID).
fn derived_uuid(parts: &[&str]) -> String {
    let hex = objects::short_hash(parts, 32);
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// The name of the Agent of the host booting from `boot_mac`: the same on
/// every management cluster, as a real host's system UUID is.
pub fn agent_name(boot_mac: &str) -> String {
    derived_uuid(&["agent", &boot_mac.to_ascii_lowercase()])
}

/// The serial number of the host booting from `boot_mac`.
fn serial_number(boot_mac: &str) -> String {
    format!(
        "SBX{}",
        objects::short_hash(&["serial", &boot_mac.to_ascii_lowercase()], 10).to_uppercase()
    )
}

fn boot_mac(bmh: &Value) -> &str {
    str_at(bmh, "/spec/bootMACAddress").unwrap_or_default()
}

// ---- metal3 ----------------------------------------------------------------

async fn metal3(ctx: &Ctx, hosts: &[Value]) {
    for bmh in hosts {
        if let Err(e) = reconcile_host(ctx, bmh).await {
            log_failure("metal3", &key(bmh), &e);
        }
    }
}

/// The status of a host metal3 has registered, inspected and booted into
/// the discovery ISO (what BMAC asks of it).
pub fn provisioned_status(bmh: &Value) -> Value {
    let mac = boot_mac(bmh);
    let name = name_of(bmh);
    json!({
        "operationalStatus": "OK",
        "errorMessage": "",
        "errorCount": 0,
        "provisioningFailCount": 0,
        "poweredOn": bmh.pointer("/spec/online").and_then(Value::as_bool).unwrap_or(false),
        "provisioning": {
            "state": "provisioned",
            "ID": derived_uuid(&["ironic-node", &mac.to_ascii_lowercase()]),
            "bootMode": str_at(bmh, "/spec/bootMode").unwrap_or("UEFI"),
        },
        "hardwareProfile": "unknown",
        "hardware": {
            "hostname": name,
            "nics": [{"name": "eth0", "mac": mac, "ip": "", "pxe": true, "speedGbps": 10}],
            "systemVendor": {"manufacturer": "hcp-dr sandbox", "productName": "simulated bare metal",
                             "serialNumber": serial_number(mac)},
            "cpu": {"arch": "x86_64", "model": "simulated", "count": 16, "clockMegahertz": 2400.0},
            "ramMebibytes": 65536,
        },
        "goodCredentials": {
            "credentials": {"name": str_at(bmh, "/spec/bmc/credentialsName").unwrap_or_default(),
                            "namespace": ns_of(bmh)},
            "credentialsVersion": "1",
        },
        "lastUpdated": objects::now(),
    })
}

async fn reconcile_host(ctx: &Ctx, bmh: &Value) -> Result<(), OperatorError> {
    if annotation(bmh, PAUSED_ANNOTATION).is_some() {
        return Ok(());
    }
    let detached = annotation(bmh, DETACHED_ANNOTATION).is_some();
    if is_deleting(bmh) {
        if !has_finalizer(bmh, BMH_FINALIZER) {
            return Ok(());
        }
        // the finalizer goes first (with the resourceVersion seen), so a
        // retried pass never records a host twice
        remove_finalizer(ctx, &BARE_METAL_HOST, bmh, BMH_FINALIZER).await?;
        if !detached {
            super::cloud::deprovision(ctx, boot_mac(bmh))?;
        }
        return Ok(());
    }
    add_finalizer(ctx, &BARE_METAL_HOST, bmh, BMH_FINALIZER).await?;
    let saved = annotation(bmh, STATUS_ANNOTATION);
    let status = match (status_is_empty(bmh), saved) {
        (true, Some(saved)) => {
            tracing::info!(cluster = %ctx.cfg.cluster_name, host = %key(bmh), "restoring the status from its annotation");
            Some(saved_status(bmh, saved)?)
        }
        (true, None) if !detached => Some(provisioned_status(bmh)),
        (false, _) if !detached => {
            // a managed host's power follows spec.online
            let online = bmh.pointer("/spec/online").and_then(Value::as_bool);
            (online.is_some()
                && bmh.pointer("/status/poweredOn").and_then(Value::as_bool) != online)
                .then(|| json!({"poweredOn": online, "lastUpdated": objects::now()}))
        }
        _ => None,
    };
    let ns = Some(ns_of(bmh));
    if let Some(status) = status {
        ctx.kube
            .merge_status(
                &BARE_METAL_HOST,
                ns,
                name_of(bmh),
                &json!({"status": status}),
            )
            .await?;
    }
    // a status is there now: the saved one would only go stale
    if saved.is_some() {
        ctx.kube
            .merge(
                &BARE_METAL_HOST,
                ns,
                name_of(bmh),
                &json!({"metadata": {"annotations": {STATUS_ANNOTATION: null}}}),
            )
            .await?;
    }
    Ok(())
}

/// The status saved in the annotation `baremetalhost.metal3.io/status`,
/// with `lastUpdated` set when it has none (as metal3 does).
fn saved_status(bmh: &Value, saved: &str) -> Result<Value, OperatorError> {
    let mut status: Value = serde_json::from_str(saved).map_err(|e| OperatorError::Invalid {
        what: format!(
            "annotation {STATUS_ANNOTATION} of BareMetalHost {}: {e}",
            key(bmh)
        ),
    })?;
    if !status.is_object() {
        return Err(OperatorError::Invalid {
            what: format!(
                "annotation {STATUS_ANNOTATION} of BareMetalHost {}: not an object",
                key(bmh)
            ),
        });
    }
    if status.get("lastUpdated").is_none_or(Value::is_null) {
        status["lastUpdated"] = json!(objects::now());
    }
    Ok(status)
}

// ---- assisted-service and BMAC ---------------------------------------------

/// The status assisted-service gives the Agent of `bmh` once the host has
/// booted the discovery ISO and passed its validations.
pub fn agent_status(bmh: &Value, previous: Option<&Value>) -> Value {
    let mac = boot_mac(bmh);
    let conds = previous.and_then(|s| s.get("conditions"));
    let cond = |type_: &str, reason: &str, message: &str| {
        objects::condition(conds, type_, true, reason, message)
    };
    json!({
        "inventory": {
            "hostname": name_of(bmh),
            "interfaces": [{
                "name": "eth0",
                "macAddress": mac,
                "flags": ["up", "broadcast", "multicast"],
                "hasCarrier": true,
                "ipV4Addresses": [],
                "ipV6Addresses": [],
                "mtu": 1500,
                "speedMbps": 10000,
            }],
            "systemVendor": {
                "manufacturer": "hcp-dr sandbox",
                "productName": "simulated bare metal",
                "serialNumber": serial_number(mac),
                "virtual": false,
            },
            "cpu": {"architecture": "x86_64", "count": 16, "clockMegahertz": 2400},
            "memory": {"physicalBytes": 68_719_476_736_u64, "usableBytes": 67_108_864_000_u64},
        },
        "conditions": [
            cond("SpecSynced", "SyncOK", "The Spec has been successfully applied"),
            cond("Connected", "AgentIsConnected", "The agent's connection to the installation service is unimpaired"),
            cond("RequirementsMet", "AgentIsReady", "The agent is ready to begin the installation"),
            cond("Validated", "ValidationsPassing", "The agent's validations are passing"),
        ],
    })
}

/// `hosts` as listed before metal3's pass: a host it provisioned in this
/// pass gets its Agent on the next.
async fn assisted(ctx: &Ctx, hosts: &[Value]) -> Result<(), OperatorError> {
    let Some(infraenvs) = list_served(ctx, &INFRA_ENV, None).await? else {
        return Ok(());
    };
    let Some(agents) = list_served(ctx, &AGENT, None).await? else {
        return Ok(());
    };
    for bmh in hosts {
        let Some(infraenv) = label(bmh, INFRAENV_LABEL) else {
            continue;
        };
        let managed = annotation(bmh, PAUSED_ANNOTATION).is_none()
            && annotation(bmh, DETACHED_ANNOTATION).is_none()
            && !is_deleting(bmh);
        let booted = str_at(bmh, "/status/provisioning/state") == Some("provisioned");
        let known = infraenvs
            .iter()
            .any(|i| ns_of(i) == ns_of(bmh) && name_of(i) == infraenv);
        if !(managed && booted && known) {
            continue;
        }
        let existing = agents
            .iter()
            .find(|a| ns_of(a) == ns_of(bmh) && label(a, BMH_LABEL) == Some(name_of(bmh)));
        if let Err(e) = ensure_agent(ctx, bmh, infraenv, existing).await {
            log_failure("assisted-service", &key(bmh), &e);
        }
    }
    Ok(())
}

async fn ensure_agent(
    ctx: &Ctx,
    bmh: &Value,
    infraenv: &str,
    existing: Option<&Value>,
) -> Result<(), OperatorError> {
    let ns = ns_of(bmh);
    let agent = match existing {
        Some(agent) if !status_is_empty(agent) => return Ok(()),
        Some(agent) => agent.clone(),
        None => {
            let name = agent_name(boot_mac(bmh));
            let agent = json!({
                "metadata": {"name": name, "namespace": ns,
                             "labels": {INFRAENV_LABEL: infraenv, BMH_LABEL: name_of(bmh)}},
                "spec": {"approved": true, "role": "", "hostname": name_of(bmh)},
            });
            tracing::info!(cluster = %ctx.cfg.cluster_name, host = %key(bmh), agent = %name, "the host registered: creating its Agent");
            ctx.kube.create(&AGENT, Some(ns), agent).await?
        }
    };
    let status = agent_status(bmh, agent.get("status"));
    ctx.kube
        .merge_status(
            &AGENT,
            Some(ns),
            name_of(&agent),
            &json!({"status": status}),
        )
        .await
        .map(|_| ())
}

// ---- the CAPI agent provider -----------------------------------------------

fn paused(obj: &Value) -> bool {
    pause_state(str_at(obj, "/spec/pausedUntil"), Utc::now()) != Pause::No
}

/// Whether `agent` carries every label of the `matchLabels` of `selector`.
fn selected(agent: &Value, selector: Option<&Value>) -> bool {
    selector
        .and_then(|s| s.get("matchLabels"))
        .and_then(Value::as_object)
        .is_none_or(|m| m.iter().all(|(k, v)| label(agent, k) == v.as_str()))
}

/// Whether `agent` is bound to the cluster whose HCP namespace is `hcp_ns`.
fn bound_to(agent: &Value, hc_name: &str, hcp_ns: &str) -> bool {
    str_at(agent, "/spec/clusterDeploymentName/namespace") == Some(hcp_ns)
        && str_at(agent, "/spec/clusterDeploymentName/name") == Some(hc_name)
}

fn unbound(agent: &Value) -> bool {
    str_at(agent, "/spec/clusterDeploymentName/name").is_none_or(str::is_empty)
}

/// `(namespace, name)` of the Agent an AgentMachine uses.
fn agent_ref(machine: &Value) -> Option<(String, String)> {
    let ns = str_at(machine, "/status/agentRef/namespace")?;
    let name = str_at(machine, "/status/agentRef/name")?;
    (!name.is_empty()).then(|| (ns.to_string(), name.to_string()))
}

/// The label the provider puts on the Agent an AgentMachine took (its UID).
pub const AGENT_MACHINE_REF: &str = "agentMachineRef";
/// The annotation naming that AgentMachine's namespace.
pub const AGENT_MACHINE_REF_NAMESPACE: &str = "agentMachineRefNamespace";

/// The Agent for the AgentMachine whose UID is `machine_uid` among
/// `agents`, as the real provider's `findAgent` picks it: the one labelled
/// with that UID, else an approved, unbound one without the label (and not
/// `taken` in this pass), matching `selector`.
pub fn pick_agent<'a>(
    agents: &'a [Value],
    taken: &HashSet<(String, String)>,
    machine_uid: &str,
    selector: Option<&Value>,
) -> Option<&'a Value> {
    let live: Vec<&Value> = agents.iter().filter(|a| !is_deleting(a)).collect();
    if let Some(labelled) = live
        .iter()
        .find(|a| !machine_uid.is_empty() && label(a, AGENT_MACHINE_REF) == Some(machine_uid))
    {
        return Some(labelled);
    }
    live.into_iter().find(|a| {
        label(a, AGENT_MACHINE_REF).is_none()
            && selected(a, selector)
            && unbound(a)
            && a.pointer("/spec/approved").and_then(Value::as_bool) == Some(true)
            && !taken.contains(&(ns_of(a).to_string(), name_of(a).to_string()))
    })
}

async fn capi_provider(ctx: &Ctx) -> Result<(), OperatorError> {
    let Some(hcs) = list_served(ctx, &HOSTED_CLUSTER, None).await? else {
        return Ok(());
    };
    let agent_hcs: Vec<&Value> = hcs
        .iter()
        .filter(|hc| str_at(hc, "/spec/platform/type") == Some("Agent"))
        .filter(|hc| !paused(hc) && !is_deleting(hc))
        .collect();
    if agent_hcs.is_empty() {
        return Ok(());
    }
    let nps = ctx.kube.list(&NODE_POOL, None, None).await?;
    for hc in agent_hcs {
        if let Err(e) = bind_machines(ctx, hc, &nps).await {
            log_failure("capi-provider-agent", &key(hc), &e);
        }
    }
    Ok(())
}

async fn bind_machines(ctx: &Ctx, hc: &Value, nps: &[Value]) -> Result<(), OperatorError> {
    let hc_name = name_of(hc);
    let hcp_ns = hcp_namespace(ns_of(hc), hc_name);
    let Some(agent_ns) =
        str_at(hc, "/spec/platform/agent/agentNamespace").filter(|s| !s.is_empty())
    else {
        return Err(OperatorError::Invalid {
            what: "HostedCluster without spec.platform.agent.agentNamespace".into(),
        });
    };
    let Some(machines) = list_served(ctx, &AGENT_MACHINE, Some(&hcp_ns)).await? else {
        return Ok(());
    };
    let Some(agents) = list_served(ctx, &AGENT, Some(agent_ns)).await? else {
        return Ok(());
    };
    let mut taken: HashSet<(String, String)> = machines.iter().filter_map(agent_ref).collect();
    for np in nodepools_of(hc, nps) {
        if paused(np) || is_deleting(np) {
            continue;
        }
        let selector = np.pointer("/spec/platform/agent/agentLabelSelector");
        let waiting = machines.iter().filter(|m| {
            label(m, NODEPOOL_LABEL) == Some(name_of(np))
                && !is_deleting(m)
                && agent_ref(m).is_none()
        });
        for machine in waiting {
            let Some(agent) = pick_agent(&agents, &taken, uid_of(machine), selector) else {
                log_failure(
                    "capi-provider-agent",
                    &key(machine),
                    &OperatorError::Waiting(format!(
                        "no free approved Agent in namespace {agent_ns} for AgentMachine {}",
                        key(machine)
                    )),
                );
                continue;
            };
            bind(ctx, hc_name, &hcp_ns, agent, machine).await?;
            taken.insert((ns_of(agent).to_string(), name_of(agent).to_string()));
        }
    }
    Ok(())
}

async fn bind(
    ctx: &Ctx,
    hc_name: &str,
    hcp_ns: &str,
    agent: &Value,
    machine: &Value,
) -> Result<(), OperatorError> {
    let uid = uid_of(machine);
    if !bound_to(agent, hc_name, hcp_ns)
        || str_at(agent, "/spec/role") != Some("worker")
        || label(agent, AGENT_MACHINE_REF) != Some(uid)
    {
        // conditional on what was seen: an Agent taken meanwhile is a conflict
        let patch = json!({
            "metadata": {
                "resourceVersion": agent.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null),
                "labels": {AGENT_MACHINE_REF: uid},
                "annotations": {AGENT_MACHINE_REF_NAMESPACE: ns_of(machine)},
            },
            "spec": {"clusterDeploymentName": {"name": hc_name, "namespace": hcp_ns}, "role": "worker"},
        });
        ctx.kube
            .merge(&AGENT, Some(ns_of(agent)), name_of(agent), &patch)
            .await?;
    }
    tracing::info!(cluster = %ctx.cfg.cluster_name, machine = %key(machine), agent = %key(agent), "AgentMachine uses Agent");
    let hostname = str_at(agent, "/spec/hostname")
        .filter(|h| !h.is_empty())
        .or_else(|| str_at(agent, "/status/inventory/hostname"))
        .unwrap_or(name_of(agent));
    ctx.kube
        .merge_status(
            &AGENT_MACHINE,
            Some(ns_of(machine)),
            name_of(machine),
            &json!({"status": {
                "agentRef": {"namespace": ns_of(agent), "name": name_of(agent)},
                "addresses": [{"type": "InternalDNS", "address": hostname}],
            }}),
        )
        .await
        .map(|_| ())
}

/// Unbind the Agent an AgentMachine uses (`spec.clusterDeploymentName`
/// removed), as the provider does when the AgentMachine is deleted; an Agent
/// bound elsewhere meanwhile, or gone, is left alone.
pub(crate) async fn release_agent(ctx: &Ctx, machine: &Value) -> Result<(), OperatorError> {
    let Some((ns, name)) = agent_ref(machine) else {
        return Ok(());
    };
    let Some(agent) = ctx.kube.get(&AGENT, Some(&ns), &name).await? else {
        return Ok(());
    };
    if str_at(&agent, "/spec/clusterDeploymentName/namespace") != Some(ns_of(machine)) {
        return Ok(());
    }
    tracing::info!(cluster = %ctx.cfg.cluster_name, machine = %key(machine), agent = %key(&agent), "AgentMachine deleted: unbinding its Agent");
    ctx.kube
        .merge(
            &AGENT,
            Some(&ns),
            &name,
            &json!({
                "metadata": {"labels": {AGENT_MACHINE_REF: null}, "annotations": {AGENT_MACHINE_REF_NAMESPACE: null}},
                "spec": {"clusterDeploymentName": null},
            }),
        )
        .await
        .map(|_| ())
}

/// [`release_agent`] for the platform machine `name` of kind `res` in `ns`,
/// when it is an AgentMachine.
pub(crate) async fn release_agent_of(
    ctx: &Ctx,
    res: &Res,
    ns: &str,
    name: &str,
) -> Result<(), OperatorError> {
    if res.group != AGENT_MACHINE.group || res.kind != AGENT_MACHINE.kind {
        return Ok(());
    }
    match ctx.kube.get(res, Some(ns), name).await? {
        Some(machine) => release_agent(ctx, &machine).await,
        None => Ok(()),
    }
}

/// [`release_agent`] for every AgentMachine in `hcp_ns` (a HostedCluster's
/// teardown, before its namespace goes).
pub(crate) async fn release_agents_in(ctx: &Ctx, hcp_ns: &str) -> Result<(), OperatorError> {
    for machine in list_served(ctx, &AGENT_MACHINE, Some(hcp_ns))
        .await?
        .unwrap_or_default()
    {
        release_agent(ctx, &machine).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, labels: Value, spec: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "hosts", "labels": labels}, "spec": spec})
    }

    #[test]
    fn agent_names_are_uuids_stable_per_mac() {
        let a = agent_name("52:54:00:AA:BB:01");
        assert_eq!(a, agent_name("52:54:00:aa:bb:01"));
        assert_ne!(a, agent_name("52:54:00:aa:bb:02"));
        let parsed = uuid::Uuid::parse_str(&a).expect("a UUID");
        assert_eq!(parsed.hyphenated().to_string(), a);
    }

    #[test]
    fn the_agent_labelled_for_the_machine_comes_first_then_a_free_unlabelled_one() {
        let agents = vec![
            agent("a", json!({}), json!({"approved": true, "role": ""})),
            // bound to the cluster for an AgentMachine of another UID (restored without status): never taken back
            agent(
                "b",
                json!({AGENT_MACHINE_REF: "old-uid"}),
                json!({"approved": true, "role": "worker",
                "clusterDeploymentName": {"name": "hc", "namespace": "clusters-hc"}}),
            ),
            agent("c", json!({}), json!({"approved": false, "role": ""})),
            agent(
                "d",
                json!({}),
                json!({"approved": true, "role": "worker",
                "clusterDeploymentName": {"name": "other", "namespace": "clusters-other"}}),
            ),
            agent("e", json!({AGENT_MACHINE_REF: "m-1"}), json!({"approved": true, "role": "worker",
                "clusterDeploymentName": {"name": "hc", "namespace": "clusters-hc"}})),
        ];
        let mut taken = HashSet::new();
        assert_eq!(pick_agent(&agents, &taken, "m-1", None).map(name_of), Some("e"));
        assert_eq!(pick_agent(&agents, &taken, "m-2", None).map(name_of), Some("a"));
        taken.insert(("hosts".to_string(), "a".to_string()));
        // b names another AgentMachine, c is not approved, d is bound to another cluster
        assert!(pick_agent(&agents, &taken, "m-2", None).is_none());
    }

    #[test]
    fn the_label_selector_is_honoured() {
        let agents = vec![
            agent(
                "a",
                json!({"size": "small"}),
                json!({"approved": true, "role": ""}),
            ),
            agent(
                "b",
                json!({"size": "large"}),
                json!({"approved": true, "role": ""}),
            ),
        ];
        let selector = json!({"matchLabels": {"size": "large"}});
        let taken = HashSet::new();
        let picked = pick_agent(&agents, &taken, "m-1", Some(&selector));
        assert_eq!(picked.map(name_of), Some("b"));
    }

    #[test]
    fn empty_statuses_are_recognised() {
        assert!(status_is_empty(&json!({"metadata": {}})));
        assert!(status_is_empty(&json!({"status": {}})));
        assert!(status_is_empty(&json!({"status": null})));
        assert!(!status_is_empty(&json!({"status": {"poweredOn": true}})));
    }
}
