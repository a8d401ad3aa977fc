//! `teardown`: the source goes, only after the destination was verified
//! (the playbook rules put it after `wait`). Everything in the HCP namespace
//! is scaled to zero (the etcd StatefulSet's PVC retention is reported:
//! with `Delete` its volumes go with it), then finalizers are removed and
//! NodePools, Machines, MachineSets, MachineDeployments, the Cluster, the
//! platform objects, the HostedControlPlane, the HCP namespace and the
//! HostedCluster are deleted, in that order. Not undoable: `--abort` is
//! refused once it started; `--resume` finishes it.
//!
//! hcp-dr removes the finalizers itself (listed in the output, journaled
//! first) and never waits for the HyperShift operator: the source is paused,
//! so its operator acts on nothing, and during a management cluster incident
//! it may be down altogether (`--operator-ack-timeout`). Nor should it act:
//! its cleanup on deletion is for a cluster that goes away, and this one
//! goes on running on the destination (the product's migration procedure
//! removes the same finalizers). Only the namespace's own finalizer, which
//! the cluster's namespace controller handles, is left to it.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{Discovery, Scope, verbs};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::MigrateContext;
use crate::hosted::{HOSTED_CLUSTER, HOSTED_CONTROL_PLANE, NODE_POOL};
use crate::kube::{api, api_for, get_json, list_json, request};
use crate::pipeline::{Stage, StageFailure, Step};
use crate::stages::export::exported_group;
use crate::teardown::{delete_and_wait, remove_finalizers};

pub struct Teardown;

/// What teardown did (journaled as it goes).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TornDown {
    pub scaled_to_zero: Vec<String>,
    pub etcd_pvc_retention: Option<String>,
    pub deleted: Vec<String>,
    /// The Secrets the HostedCluster used (read before it was deleted, so
    /// a resumed teardown still knows them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The finalizers hcp-dr removed itself, `<object>: <finalizer>, ...`
    /// (journaled before they were): the source is paused, and its operator
    /// perhaps down, so no controller is going to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers_removed: Vec<String>,
}

const WAIT: Duration = Duration::from_secs(120);

/// Rank of a CAPI or platform kind in the deletion order.
fn deletion_rank(group: &str, kind: &str) -> usize {
    match (group, kind) {
        ("cluster.x-k8s.io", "Machine") => 0,
        ("cluster.x-k8s.io", "MachineSet") => 1,
        ("cluster.x-k8s.io", "MachineDeployment") => 2,
        ("cluster.x-k8s.io", "Cluster") => 3,
        (_, k) if k.ends_with("Machine") => 4,
        (_, k) if k.ends_with("Template") => 5,
        _ => 6,
    }
}

async fn scale_to_zero(client: &kube::Client, ns: &str, out: &mut TornDown, record: Record<'_>) -> Result<(), StageFailure> {
    let ns = ns.to_string();
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    for set in sts.list(&ListParams::default()).await.map_err(request(format!("listing StatefulSets in {ns}")))?.items {
        let name = set.metadata.name.clone().unwrap_or_default();
        if name == crate::hosted::ETCD_STATEFULSET {
            out.etcd_pvc_retention = set
                .spec
                .persistent_volume_claim_retention_policy
                .as_ref()
                .and_then(|p| p.when_scaled.clone())
                .or(Some("Retain".into()));
        }
        sts.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}})))
            .await
            .map_err(request(format!("scaling StatefulSet {ns}/{name} to 0")))?;
        out.scaled_to_zero.push(format!("StatefulSet {name}"));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    for d in deployments.list(&ListParams::default()).await.map_err(request(format!("listing Deployments in {ns}")))?.items {
        let name = d.metadata.name.clone().unwrap_or_default();
        deployments
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}})))
            .await
            .map_err(request(format!("scaling Deployment {ns}/{name} to 0")))?;
        out.scaled_to_zero.push(format!("Deployment {name}"));
    }
    record(out)
}

/// Journals what was done so far (or nothing, outside a pipeline).
pub type Record<'a> = &'a mut (dyn FnMut(&TornDown) -> Result<(), StageFailure> + Send);

async fn gone(api: &Api<DynamicObject>, name: &str, what: &str, out: &mut TornDown, record: Record<'_>) -> Result<(), StageFailure> {
    if let Some(obj) = get_json(api, name, what).await? {
        let finalizers: Vec<&str> = obj["metadata"]["finalizers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let line = format!("{what}: {}", finalizers.join(", "));
        if !finalizers.is_empty() && !out.finalizers_removed.contains(&line) {
            out.finalizers_removed.push(line);
            record(out)?;
        }
    }
    remove_finalizers(api, name, what).await?;
    delete_and_wait(api, name, what, WAIT).await?;
    out.deleted.push(what.to_string());
    record(out)
}

async fn run(ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<TornDown, StageFailure> {
    let (ns, name) = (ctx.inputs.source.namespace.clone(), ctx.inputs.source.hosted_cluster.clone());
    let mut out: TornDown = crate::stages::earlier_progress(step, "teardown").unwrap_or_default();
    let mut record = |t: &TornDown| -> Result<(), StageFailure> { Ok(step.record(serde_json::to_value(t)?)?) };
    destroy(&ctx.source.client, &ns, &name, &mut out, &mut record).await?;
    Ok(out)
}

/// Scale the HCP namespace to zero, then remove finalizers and delete, in
/// order, NodePools, CAPI and platform objects, HostedControlPlane, the HCP
/// namespace and the HostedCluster. Idempotent: what is gone is skipped.
/// Migrate's teardown and `hcp-dr cluster destroy` share it.
pub async fn destroy(client: &kube::Client, ns: &str, name: &str, out: &mut TornDown, record: Record<'_>) -> Result<(), StageFailure> {
    let (ns, name) = (ns.to_string(), name.to_string());
    let hcp_ns = crate::hosted::hcp_namespace(&ns, &name);
    let client = client.clone();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let hcp_ns_exists = namespaces.get_opt(&hcp_ns).await.map_err(request(format!("reading Namespace {hcp_ns}")))?.is_some();
    if hcp_ns_exists {
        scale_to_zero(&client, &hcp_ns, out, record).await?;
    }

    // NodePools of this cluster.
    let pools = api(&client, &NODE_POOL, &ns);
    for np in list_json(&pools, &ListParams::default(), "NodePools").await? {
        if np["spec"]["clusterName"].as_str() == Some(name.as_str()) {
            let np_name = np["metadata"]["name"].as_str().unwrap_or_default().to_string();
            gone(&pools, &np_name, &format!("NodePool {ns}/{np_name}"), out, record).await?;
        }
    }

    // CAPI and platform objects, machines first.
    if hcp_ns_exists {
        let discovery = Discovery::new(client.clone()).run().await.map_err(request("discovering the source's API groups"))?;
        let mut objects = Vec::new();
        for group in discovery.groups() {
            if !exported_group(group.name()) || group.name() == HOSTED_CLUSTER.group {
                continue;
            }
            for (resource, caps) in group.recommended_resources() {
                if caps.scope != Scope::Namespaced || !caps.supports_operation(verbs::LIST) {
                    continue;
                }
                let api = api_for(&client, &resource, &hcp_ns);
                for obj in list_json(&api, &ListParams::default(), &format!("{} in {hcp_ns}", resource.plural)).await? {
                    let obj_name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
                    objects.push((deletion_rank(&resource.group, &resource.kind), resource.clone(), obj_name));
                }
            }
        }
        objects.sort_by(|a, b| (a.0, &a.1.kind, &a.2).cmp(&(b.0, &b.1.kind, &b.2)));
        for (_, resource, obj_name) in objects {
            let api = api_for(&client, &resource, &hcp_ns);
            gone(&api, &obj_name, &format!("{} {hcp_ns}/{obj_name}", resource.kind), out, record).await?;
        }
        let hcps = api(&client, &HOSTED_CONTROL_PLANE, &hcp_ns);
        for hcp in list_json(&hcps, &ListParams::default(), "HostedControlPlanes").await? {
            let hcp_name = hcp["metadata"]["name"].as_str().unwrap_or_default().to_string();
            gone(&hcps, &hcp_name, &format!("HostedControlPlane {hcp_ns}/{hcp_name}"), out, record).await?;
        }
        delete_and_wait(&namespaces, &hcp_ns, &format!("Namespace {hcp_ns}"), Duration::from_secs(300)).await?;
        out.deleted.push(format!("Namespace {hcp_ns}"));
        record(out)?;
    }

    let hcs = api(&client, &HOSTED_CLUSTER, &ns);
    if let Some(hc) = get_json(&hcs, &name, &format!("HostedCluster {ns}/{name}")).await? {
        out.secrets = secrets_of(&hc);
        record(out)?;
    }
    let used = out.secrets.clone();
    gone(&hcs, &name, &format!("HostedCluster {ns}/{name}"), out, record).await?;

    // The Secrets in the HostedCluster's namespace that it used and no other
    // HostedCluster there uses: left behind, they would make moving the
    // cluster back here fail (the restore refuses existing, different objects).
    let others: Vec<String> = list_json(&hcs, &ListParams::default(), &format!("HostedClusters in {ns}"))
        .await?
        .iter()
        .filter(|hc| hc["metadata"]["name"].as_str() != Some(name.as_str()))
        .flat_map(secrets_of)
        .collect();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    for secret in used.iter().filter(|s| !others.contains(s)) {
        let what = format!("Secret {ns}/{secret}");
        delete_and_wait(&secrets, secret, &what, WAIT).await?;
        out.deleted.push(what);
        record(out)?;
    }
    Ok(())
}

/// The Secrets in its own namespace a HostedCluster names: pull secret, ssh
/// key, etcd encryption keys, and the kubeconfig and kubeadmin password
/// HyperShift wrote for it.
pub fn secrets_of(hc: &Value) -> Vec<String> {
    [
        "/spec/pullSecret/name",
        "/spec/sshKey/name",
        "/spec/secretEncryption/aescbc/activeKey/name",
        "/spec/secretEncryption/aescbc/backupKey/name",
        "/status/kubeconfig/name",
        "/status/kubeadminPassword/name",
    ]
    .iter()
    .filter_map(|p| hc.pointer(p).and_then(Value::as_str))
    .filter(|s| !s.is_empty())
    .map(str::to_string)
    .collect()
}

#[async_trait]
impl Stage<MigrateContext> for Teardown {
    fn name(&self) -> &'static str {
        "teardown"
    }
    fn summary(&self) -> &'static str {
        "on the source: scale the HCP namespace to zero, then remove finalizers and delete NodePools, CAPI and platform objects, HostedControlPlane, the HCP namespace and the HostedCluster"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &MigrateContext, _params: &Value) -> Vec<String> {
        let hcp_ns = ctx.source.hcp_namespace();
        vec![
            format!("source: scale every Deployment and StatefulSet in {hcp_ns} to 0"),
            format!(
                "source: remove finalizers and delete the NodePools, Machines, MachineSets, MachineDeployments, Cluster, platform objects and HostedControlPlane, Namespace {hcp_ns}, HostedCluster {}/{}",
                ctx.inputs.source.namespace, ctx.inputs.source.hosted_cluster
            ),
        ]
    }
    async fn run(&self, ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Value, StageFailure> {
        Ok(serde_json::to_value(run(ctx, step).await?)?)
    }
}
