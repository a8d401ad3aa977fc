//! `detach-hosts`: on the Agent platform, the source's BareMetalHosts of
//! the cluster are detached (`baremetalhost.metal3.io/detached`) before the
//! destination creates its own copies of them, so that only one metal3
//! manages each host at any time: the source's stops acting on them (no
//! power change, and deleting them later does not deprovision them), the
//! destination's adopts them from the status the backup kept. Journaled
//! before each change; `--abort` attaches them again (only those this run
//! detached, and only while they are the same objects). Nothing to do on
//! another platform.
//!
//! The source's inventory itself goes in `teardown`, after the destination
//! was verified (see [`remove_inventory`]).

use async_trait::async_trait;
use kube::api::{Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::MigrateContext;
use crate::hosted::SECRET;
use crate::hosted::agent::{AGENT, AgentInventory, BARE_METAL_HOST, DETACHED, INFRA_ENV, INFRAENV_LABEL, NMSTATE_CONFIG};
use crate::kube::{api, get_json, is_not_found, list_json, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::export::{Export, Exported};
use crate::teardown::{Record, TornDown, annotate_if_uid, delete_and_wait};

pub struct DetachHosts;

/// One BareMetalHost this run detached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetachedHost {
    pub name: String,
    pub uid: String,
}

/// What `detach-hosts` did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Detached {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub hosts: Vec<DetachedHost>,
}

impl StageId for DetachHosts {
    const NAME: &'static str = "detach-hosts";
    type Output = Detached;
}

#[async_trait]
impl Stage<MigrateContext> for DetachHosts {
    fn summary(&self) -> &'static str {
        "Agent platform: detach the cluster's BareMetalHosts on the source, so its metal3 lets go of them before the destination adopts them"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, _ctx: &MigrateContext, _step: &Step<'_>) -> Vec<String> {
        vec!["source: on the Agent platform, annotate the cluster's BareMetalHosts baremetalhost.metal3.io/detached (its metal3 stops managing them; nothing is powered off or deprovisioned)".into()]
    }
    async fn run(&self, ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let exported: Exported = step.needs::<Export>()?;
        let mut out: Detached = step.earlier_progress().unwrap_or_default();
        let Some(inventory) = exported.agent_inventory else { return Ok(out) };
        out.namespace = Some(inventory.namespace.clone());
        let hosts = api(&ctx.source.client, &BARE_METAL_HOST, &inventory.namespace);
        for name in inventory.hosts.iter().filter_map(|h| h.bare_metal_host.as_deref()) {
            let what = format!("BareMetalHost {}/{name}", inventory.namespace);
            let Some(live) = get_json(&hosts, name, &what).await? else {
                return Err(crate::stages::StageError::Precondition(format!("{what} was backed up but is gone from the source: find out who deleted it before going on")).into());
            };
            let uid = live["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            let host = DetachedHost { name: name.to_string(), uid: uid.clone() };
            if !out.hosts.contains(&host) {
                out.hosts.push(host);
                step.record(serde_json::to_value(&out)?)?;
            }
            annotate_if_uid(&hosts, name, &uid, DETACHED, &what).await?;
            tracing::info!(host = %what, "detached on the source");
        }
        Ok(out)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut MigrateContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(detached) = input.record::<Detached>()? else { return Ok(()) };
        let Some(ns) = detached.namespace else { return Ok(()) };
        let hosts = api(&ctx.source.client, &BARE_METAL_HOST, &ns);
        for host in &detached.hosts {
            let patch = json!({"metadata": {"uid": host.uid, "annotations": {DETACHED: null}}});
            match hosts.patch(&host.name, &PatchParams::default(), &Patch::Merge(patch)).await {
                Ok(_) => {}
                // gone, or another object of that name: not the one this run detached
                Err(err) if is_not_found(&err) || crate::kube::is_conflict(&err) || crate::kube::is_invalid(&err) => {}
                Err(err) => return Err(request(format!("attaching BareMetalHost {ns}/{}", host.name))(err).into()),
            }
        }
        Ok(())
    }
}

/// Delete, on the source, the Agent inventory a migration moved: the
/// cluster's Agents and BareMetalHosts (detached: metal3 lets go of them
/// without deprovisioning), their BMC Secrets, and each InfraEnv with its
/// NMStateConfigs and pull secret once no other Agent comes from it.
/// Idempotent: what is gone is skipped.
const WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One detached BareMetalHost of the inventory and its BMC Secret. A host
/// that is not detached is refused: the source's metal3 would deprovision
/// it, and the destination runs it now.
async fn remove_host(
    client: &kube::Client,
    ns: &str,
    bmh: &str,
    inventory: &AgentInventory,
    out: &mut TornDown,
    gone: &mut (dyn FnMut(String, &mut TornDown) -> Result<(), crate::teardown::Failure> + Send),
) -> Result<(), crate::teardown::Failure> {
    let hosts = api(client, &BARE_METAL_HOST, ns);
    let what = format!("BareMetalHost {ns}/{bmh}");
    if let Some(live) = get_json(&hosts, bmh, &what).await? {
        if live["metadata"]["annotations"].get(DETACHED).is_none() {
            return Err(format!("{what} is not detached on the source: deleting it would make the source's metal3 deprovision the host the destination now runs; annotate it {DETACHED} and resume").into());
        }
        let credentials = live.pointer("/spec/bmc/credentialsName").and_then(serde_json::Value::as_str).map(str::to_string);
        delete_and_wait(&hosts, bmh, &what, WAIT).await?;
        if let Some(credentials) = credentials.filter(|c| inventory.secrets.contains(c)) {
            let secret = format!("Secret {ns}/{credentials}");
            delete_and_wait(&api(client, &SECRET, ns), &credentials, &secret, WAIT).await?;
            gone(secret, out)?;
        }
    }
    gone(what, out)
}

pub async fn remove_inventory(client: &kube::Client, inventory: &AgentInventory, out: &mut TornDown, record: Record<'_>) -> Result<(), crate::teardown::Failure> {
    let ns = &inventory.namespace;
    let mut gone = |what: String, out: &mut TornDown| out.record_deleted(what, record);
    let agents = api(client, &AGENT, ns);
    let secrets = api(client, &SECRET, ns);
    for host in &inventory.hosts {
        // the host first, then its Agent (nothing makes a new Agent for a host that is gone)
        if let Some(bmh) = &host.bare_metal_host {
            remove_host(client, ns, bmh, inventory, out, &mut gone).await?;
        }
        let what = format!("Agent {ns}/{}", host.agent);
        delete_and_wait(&agents, &host.agent, &what, WAIT).await?;
        gone(what, out)?;
    }
    for infra_env in &inventory.infra_envs {
        let selector = format!("{INFRAENV_LABEL}={infra_env}");
        let still = list_json(&agents, &kube::api::ListParams::default().labels(&selector), &format!("Agents of InfraEnv {ns}/{infra_env}")).await?;
        if !still.is_empty() {
            tracing::info!(infra_env = %infra_env, agents = still.len(), "InfraEnv kept on the source: other Agents come from it");
            continue;
        }
        let what = format!("InfraEnv {ns}/{infra_env}");
        let pull = get_json(&api(client, &INFRA_ENV, ns), infra_env, &what).await?.and_then(|i| i.pointer("/spec/pullSecretRef/name").and_then(serde_json::Value::as_str).map(str::to_string));
        delete_and_wait(&api(client, &INFRA_ENV, ns), infra_env, &what, WAIT).await?;
        gone(what, out)?;
        for config in &inventory.nmstate_configs {
            let what = format!("NMStateConfig {ns}/{config}");
            delete_and_wait(&api(client, &NMSTATE_CONFIG, ns), config, &what, WAIT).await?;
            gone(what, out)?;
        }
        if let Some(pull) = pull.filter(|p| inventory.secrets.contains(p)) {
            let what = format!("Secret {ns}/{pull}");
            delete_and_wait(&secrets, &pull, &what, WAIT).await?;
            gone(what, out)?;
        }
    }
    Ok(())
}
