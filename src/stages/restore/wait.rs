//! `wait`: the restore is done when the HostedCluster is Available, every
//! NodePool's nodes are Ready in the hosted cluster, and every etcd member
//! reports a revision no lower than the backup's (the data is the backup's,
//! not an empty etcd). Then a staged snapshot copy is deleted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RestoreContext;
use super::preflight::hosted_cluster;
use super::snapshot_url::UrlRecord;
use super::verify::ensure_loaded;
use crate::hosted::{self, HOSTED_CLUSTER, HostedCluster};
use crate::kube::{KubeError, Watched, api, get_json, request, wait_for, wait_watching};
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, read_params};
use crate::stages::params::AvailableWait;
use crate::stages::context::{MemberTarget, TlsOverride};
use crate::stages::{StageError, etcd_access};

pub struct Wait;

/// What the restored cluster showed (journaled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Healthy {
    pub available_after_seconds: f64,
    pub backup_revision: i64,
    /// Per member.
    pub revisions: BTreeMap<String, i64>,
    pub nodes_ready: BTreeMap<String, usize>,
}

const POLL: Duration = Duration::from_secs(1);

/// A client for the hosted cluster, from the kubeconfig Secret the
/// HostedCluster's status names.
pub async fn hosted_client(client: &kube::Client, hc: &HostedCluster) -> Result<Option<kube::Client>, KubeError> {
    let Some(secret_name) = hc.0.pointer("/status/kubeconfig/name").and_then(Value::as_str) else { return Ok(None) };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), hc.namespace());
    let Some(secret) = secrets.get_opt(secret_name).await.map_err(request(format!("reading Secret {}/{secret_name}", hc.namespace())))? else {
        return Ok(None);
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get("kubeconfig")) else { return Ok(None) };
    let text = String::from_utf8_lossy(&bytes.0).to_string();
    let invalid = |e: String| KubeError::Config {
        path: format!("Secret {}/{secret_name}", hc.namespace()),
        message: e,
    };
    let file = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| invalid(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    kube::Client::try_from(config).map(Some).map_err(|e| invalid(e.to_string()))
}

/// Ready nodes of NodePool `pool` in the hosted cluster (by HyperShift's node label).
pub async fn ready_nodes(client: &kube::Client, pool: &str) -> Result<usize, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default().labels(&format!("hypershift.openshift.io/nodePool={pool}"))).await?;
    Ok(list
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count())
}

async fn run(ctx: &mut RestoreContext, timeout: Duration, manifest: &crate::archive::Manifest) -> Result<Healthy, StageFailure> {
    ensure_loaded(ctx).await?;
    let started = Instant::now();
    let (ns, name, hcp_ns) = (ctx.inputs.namespace.clone(), ctx.inputs.hosted_cluster.clone(), ctx.inputs.hcp_namespace());
    let hc_api = api(&ctx.client, &HOSTED_CLUSTER, &ns);
    let label = ctx.inputs.hc_label();
    // progress: say what the cluster reports whenever it changes
    let last = std::sync::Mutex::new(String::new());
    wait_watching(&hc_api, Watched::named(&name), &format!("{label} to become Available"), timeout, POLL, || async {
        let hc = get_json(&hc_api, &name, &label).await?.map(HostedCluster);
        let now = match &hc {
            None => "not found".to_string(),
            Some(hc) => ["Available", "EtcdAvailable", "KubeAPIServerAvailable"]
                .iter()
                .map(|c| format!("{c}={}", hc.condition(c).unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(" "),
        };
        if let Ok(mut last) = last.lock() {
            if *last != now {
                tracing::info!(cluster = %label, elapsed = started.elapsed().as_secs(), "{now}");
                *last = now;
            }
        }
        Ok(hc.filter(|hc| hc.condition("Available") == Some("True")))
    })
    .await?;
    let available_after_seconds = started.elapsed().as_secs_f64();
    tracing::info!(cluster = %label, seconds = available_after_seconds, "available");

    // Nodes of every NodePool, through the hosted API.
    let mut nodes_ready = BTreeMap::new();
    let pools: Vec<(String, usize)> = ctx
        .objects
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|o| o["kind"] == "NodePool" && o["spec"]["clusterName"] == name.as_str())
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                o["spec"]["replicas"].as_u64().unwrap_or(0) as usize,
            )
        })
        .collect();
    if pools.iter().any(|(_, n)| *n > 0) {
        let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(30));
        let hosted = wait_for("the hosted cluster's admin kubeconfig", left, POLL, || async {
            let hc = get_json(&hc_api, &name, &label).await?.map(HostedCluster);
            match hc {
                Some(hc) => hosted_client(&ctx.client, &hc).await,
                None => Ok(None),
            }
        })
        .await?;
        for (pool, want) in &pools {
            let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(30));
            let got = wait_for(&format!("{want} Ready node(s) of NodePool {ns}/{pool} in the hosted cluster"), left, POLL, || async {
                Ok(ready_nodes(&hosted, pool).await.ok().filter(|n| n >= want))
            })
            .await?;
            nodes_ready.insert(pool.clone(), got);
        }
    }

    // Every member holds the backup's data.
    let backup_revision = manifest
        .best_snapshot()
        .map(|s| s.revision)
        .ok_or_else(|| StageError::Precondition("the backup's manifest lists no etcd snapshot".into()))?;
    let tls = etcd_access::discover_tls(&ctx.client, &hcp_ns, &TlsOverride::default()).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let pods = pods
        .list(&ListParams::default().labels(hosted::ETCD_POD_SELECTOR))
        .await
        .map_err(request(format!("listing etcd pods in {hcp_ns}")))?;
    let expected = hosted_cluster(ctx.objects.as_deref().unwrap_or_default())?.expected_etcd_members();
    let mut revisions = BTreeMap::new();
    for pod in &pods.items {
        let target = MemberTarget {
            pod: pod.metadata.name.clone().unwrap_or_default(),
            pod_ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
            revision: 0,
        };
        let (member, _forward) = etcd_access::connect_member(&ctx.client, &hcp_ns, ctx.inputs.etcd_access, &tls, &target).await?;
        let mut client = member.connect().await?;
        let status = member.status(&mut client).await?;
        if status.revision < backup_revision {
            return Err(StageError::Precondition(format!(
                "etcd member {hcp_ns}/{} is at revision {}, below the backup's {backup_revision}: it did not restore the snapshot (a leftover volume, or the download failed: kubectl -n {hcp_ns} logs {} -c etcd-init)",
                target.pod, status.revision, target.pod
            ))
            .into());
        }
        revisions.insert(target.pod, status.revision);
    }
    if revisions.len() != expected {
        return Err(StageError::Precondition(format!(
            "{} etcd member(s) answer in {hcp_ns}, {expected} expected; check kubectl -n {hcp_ns} get pods -l app=etcd",
            revisions.len()
        ))
        .into());
    }

    // The staged copy is no longer needed.
    let staged: Option<UrlRecord> = ctx.url_record.clone();
    if let (Some(record), Some(staging)) = (staged.filter(|r| r.staged), &ctx.staging) {
        staging.delete(&record.key).await?;
        tracing::info!(key = %record.key, "deleted the staged snapshot copy");
    }
    Ok(Healthy {
        available_after_seconds,
        backup_revision,
        revisions,
        nodes_ready,
    })
}

impl StageId for Wait {
    const NAME: &'static str = "wait";
    type Output = Healthy;
}

#[async_trait]
impl Stage<RestoreContext> for Wait {
    fn summary(&self) -> &'static str {
        "wait for the HostedCluster to be Available and its nodes Ready; check every etcd member is at or above the backup's revision"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RestoreContext, step: &Step<'_>) -> Vec<String> {
        let timeout = read_params::<AvailableWait>(step.params()).ok().and_then(|p| p.timeout().ok().flatten()).unwrap_or(ctx.inputs.wait_timeout());
        vec![format!(
            "wait up to {}s for {} to be Available, its NodePools' nodes Ready and etcd at the backup's revision or above",
            timeout.as_secs(),
            ctx.inputs.hc_label()
        )]
    }
    fn params(&self) -> Params {
        Params::of::<AvailableWait>()
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let timeout = step.read_params::<AvailableWait>()?.timeout()?.unwrap_or(ctx.inputs.wait_timeout());
        let manifest = super::verify::manifest(ctx, step).await?;
        Ok(run(ctx, timeout, &manifest).await?)
    }
}
