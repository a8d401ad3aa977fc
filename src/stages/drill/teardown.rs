//! `teardown`: the drill cluster goes, whatever the checks said, unless
//! `--keep`. The cluster itself is removed as `hcp-dr cluster destroy` does
//! it (paused, then the ordered deletion of `crate::teardown` that migrate's
//! teardown shares: [`destroy_paused`]); then
//! what lives beside it in its namespace: the Secrets this drill created
//! and the credentials HyperShift wrote for it; then the namespaces the
//! drill created. Not undoable. The report says whether the cluster was
//! kept or removed.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DrillContext;
use crate::hosted::{HOSTED_CLUSTER, HostedCluster};
use crate::kube::{api, get_json};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::restore::apply::Applied;
use crate::teardown::{Removal, delete_if_uid, destroy_paused, wait_gone};

pub struct Teardown;

/// What teardown did (journaled).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Removed {
    /// `--keep`: nothing was deleted.
    pub kept: bool,
    /// Everything deleted, in order.
    pub deleted: Vec<String>,
    /// Same-named objects the drill did not create, left in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_alone: Vec<String>,
    /// How to remove a kept drill cluster by hand.
    #[serde(default)]
    pub remove_with: Option<String>,
}

const WAIT: Duration = Duration::from_secs(300);

/// The commands that remove a kept drill cluster and what the drill created beside it.
pub fn remove_command(ctx: &DrillContext, applied: &Applied) -> String {
    let drill = &ctx.inputs.identity.drill;
    let destroy = format!("hcp-dr cluster destroy {} -n {} --kubeconfig STAGING", drill.name, drill.namespace);
    if applied.namespaces.contains(&drill.namespace) {
        return format!("{destroy} && kubectl --kubeconfig STAGING delete namespace {}", drill.namespace);
    }
    let secrets: Vec<&str> = applied
        .created
        .iter()
        .filter(|r| r.kind == "Secret" && r.namespace.as_deref() == Some(drill.namespace.as_str()))
        .map(|r| r.name.as_str())
        .collect();
    format!(
        "{destroy} && kubectl --kubeconfig STAGING -n {} delete secret {} {}-admin-kubeconfig --ignore-not-found",
        drill.namespace,
        secrets.join(" "),
        drill.name
    )
}

/// What `apply` created (from the journal).
fn applied(step: &Step<'_>) -> Result<Applied, StageFailure> {
    Ok(step.output_of::<crate::stages::restore::apply::Apply>()?.unwrap_or_default())
}

/// Note what a conditional deletion did.
fn removed(out: &mut Removed, removal: Removal, what: String) {
    match removal {
        Removal::NotOurs { uid } => {
            tracing::warn!("{what} was left alone: not the object the drill created (UID {uid})");
            out.left_alone.push(format!("{what} (UID {uid})"));
        }
        Removal::Deleted | Removal::Absent => out.deleted.push(what),
    }
}

async fn run(ctx: &mut DrillContext, step: &mut Step<'_>) -> Result<Removed, StageFailure> {
    let client = ctx.restore.client.clone();
    let drill = ctx.inputs.identity.drill.clone();
    let (ns, name) = (drill.namespace.as_str(), drill.name.as_str());
    let applied = applied(step)?;
    let mut out = Removed::default();

    // The credentials HyperShift wrote for the drill live in its namespace.
    let label = format!("HostedCluster {ns}/{name}");
    let hc = get_json(&api(&client, &HOSTED_CLUSTER, ns), name, &label).await?.map(HostedCluster);
    let secrets: Vec<String> = hc
        .iter()
        .flat_map(|hc| [hc.0.pointer("/status/kubeconfig/name"), hc.0.pointer("/status/kubeadminPassword/name")])
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    if hc.is_some() {
        let torn = destroy_paused(&client, ns, name).await?;
        out.deleted.extend(torn.deleted);
        step.record(serde_json::to_value(&out)?)?;
    }

    // What the drill created beside the cluster, newest first: only the
    // objects it created (by UID), never same-named ones made since.
    let mut owned: Vec<(String, Option<String>)> = secrets.into_iter().map(|s| (s, None)).collect();
    owned.extend(
        applied
            .created
            .iter()
            .rev()
            .filter(|r| r.kind == "Secret" && r.namespace.as_deref() == Some(ns))
            .map(|r| (r.name.clone(), r.uid.clone())),
    );
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), ns);
    for (secret, uid) in owned {
        let what = format!("Secret {ns}/{secret}");
        removed(&mut out, delete_if_uid(&secret_api, &secret, uid.as_deref(), &what, WAIT).await?, what);
        step.record(serde_json::to_value(&out)?)?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for created in applied.namespaces.iter().rev() {
        let what = format!("Namespace {created}");
        let uid = applied.namespace_uids.get(created).map(String::as_str);
        removed(&mut out, crate::teardown::delete_namespace(&client, created, uid, WAIT).await?, what);
        step.record(serde_json::to_value(&out)?)?;
    }
    // Gone, as far as the staging cluster can tell.
    wait_gone(&api(&client, &HOSTED_CLUSTER, ns), name, &label, WAIT).await?;
    wait_gone(&namespaces, &drill.hcp_namespace(), &format!("Namespace {}", drill.hcp_namespace()), WAIT).await?;
    Ok(out)
}

impl StageId for Teardown {
    const NAME: &'static str = "teardown";
    type Output = Removed;
}

#[async_trait]
impl Stage<DrillContext> for Teardown {
    fn summary(&self) -> &'static str {
        "remove the drill cluster (as `hcp-dr cluster destroy`), the secrets and namespaces the drill created; nothing with --keep"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &DrillContext, _step: &Step<'_>) -> Vec<String> {
        let drill = &ctx.inputs.identity.drill;
        if ctx.inputs.keep {
            return vec![format!("keep {} (--keep); the report says how to remove it", drill.path())];
        }
        vec![format!(
            "destroy HostedCluster {} and its control plane {}, then the secrets and namespaces the drill created",
            drill.path(),
            drill.hcp_namespace()
        )]
    }
    async fn run(&self, ctx: &mut DrillContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        if ctx.inputs.keep {
            tracing::info!(cluster = %ctx.inputs.identity.drill.path(), "kept (--keep)");
            let kept = Removed { kept: true, deleted: Vec::new(), left_alone: Vec::new(), remove_with: Some(remove_command(ctx, &applied(step)?)) };
            return Ok(kept);
        }
        Ok(run(ctx, step).await?)
    }
}
