//! `wait`: the restore is done when the HostedCluster is Available, every
//! NodePool's nodes are Ready in the hosted cluster, and the etcd members
//! are ONE cluster holding the restored data: every member answers with the
//! same cluster ID and the same member list of exactly the expected members
//! at their own peer URLs, one leader, revisions at or above the restored
//! one and within a small window, and a key written through one member is
//! read back through each of the others (`etcd_ops::one_cluster`). Members
//! that answer but are not one cluster (what HyperShift's etcd-init makes of
//! a HighlyAvailable restore through restoreSnapshotURL) fail the stage.
//! Then a staged snapshot copy is deleted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RestoreContext;
use super::etcd_seed::{EtcdSeed, SeedMode, Seeded};
use super::preflight::hosted_cluster;
use super::snapshot_url::UrlRecord;
use super::verify::ensure_loaded;
use crate::hosted::{self, HOSTED_CLUSTER, HostedCluster};
use crate::kube::{KubeError, Watched, api, get_json, request, wait_for, wait_watching};
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, read_params};
use crate::stages::params::AvailableWait;
use crate::stages::context::TlsOverride;
use crate::stages::etcd_ops::{health, one_cluster};
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
    /// How the members were proven one cluster (absent in older journals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<OneCluster>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn etcd_is_settled_once_rolled_out_and_etcd_init_is_gone() {
        let sts = |init: bool, current: &str, ready: i64| {
            let inits = if init { json!([{"name": "reset-member"}, {"name": "etcd-init"}]) } else { json!([{"name": "reset-member"}]) };
            json!({"metadata": {"generation": 2}, "spec": {"replicas": 3, "template": {"spec": {"initContainers": inits}}},
                "status": {"observedGeneration": 2, "currentRevision": current, "updateRevision": "etcd-b", "readyReplicas": ready, "updatedReplicas": 1}})
        };
        assert!(etcd_rolled_out(&sts(false, "etcd-b", 3), true).is_ok());
        // the restore not yet marked done: etcd-init may stay
        assert!(etcd_rolled_out(&sts(true, "etcd-b", 3), false).is_ok());
        assert!(etcd_rolled_out(&sts(true, "etcd-b", 3), true).unwrap_err().contains("etcd-init"));
        assert!(etcd_rolled_out(&sts(false, "etcd-a", 3), true).unwrap_err().contains("replaced"));
        assert!(etcd_rolled_out(&sts(false, "etcd-b", 2), true).unwrap_err().contains("2 of 3"));
        let mut unseen = sts(false, "etcd-b", 3);
        unseen["status"]["observedGeneration"] = json!(1);
        assert!(etcd_rolled_out(&unseen, true).unwrap_err().contains("generation 2"));
    }
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

async fn run(ctx: &mut RestoreContext, timeout: Duration, manifest: &crate::archive::Manifest, seeded: Option<&Seeded>) -> Result<Healthy, StageFailure> {
    ensure_loaded(ctx).await?;
    let started = Instant::now();
    let (ns, name) = (ctx.inputs.namespace.clone(), ctx.inputs.hosted_cluster.clone());
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

    // Every member holds the backup's data, and they are one cluster.
    let backup_revision = manifest
        .best_snapshot()
        .map(|s| s.revision)
        .ok_or_else(|| StageError::Precondition("the backup's manifest lists no etcd snapshot".into()))?;
    let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(60));
    let etcd = prove_one_cluster(ctx, seeded, backup_revision, left).await?;
    let revisions = etcd.revisions.clone();

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
        etcd: Some(etcd),
    })
}

/// Whether the etcd StatefulSet `sts` has rolled out (pure): its
/// controller saw the last change, every replica is of the current
/// revision and ready, and (`restored`: the HostedControlPlane's
/// EtcdSnapshotRestored is True) the template no longer runs `etcd-init`,
/// which the control-plane operator takes out once the restore is done,
/// replacing the members one by one. `Err` says what it waits for.
pub fn etcd_rolled_out(sts: &Value, restored: bool) -> Result<(), String> {
    let replicas = sts.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let generation = sts.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
    let status = &sts["status"];
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    if observed < generation {
        return Err(format!("the StatefulSet controller to see generation {generation} (observed {observed})"));
    }
    if restored && sts.pointer("/spec/template/spec/initContainers").and_then(Value::as_array).is_some_and(|cs| cs.iter().any(|c| c["name"] == "etcd-init")) {
        return Err("the control-plane operator to take etcd-init out of the StatefulSet (EtcdSnapshotRestored is True)".into());
    }
    let (current, update) = (status["currentRevision"].as_str(), status["updateRevision"].as_str());
    if current.is_some() && update.is_some() && current != update {
        return Err(format!("the members to be replaced with revision {} ({} of {replicas} updated)", update.unwrap_or("?"), status["updatedReplicas"].as_i64().unwrap_or(0)));
    }
    let ready = status["readyReplicas"].as_i64().unwrap_or(0);
    if ready < replicas {
        return Err(format!("{ready} of {replicas} members ready"));
    }
    Ok(())
}

/// Wait (at most `timeout`) until the restored etcd StatefulSet has rolled
/// out ([`etcd_rolled_out`]): after a restore HyperShift changes its
/// template, and a proof made while the members are replaced would see
/// one without a pod. Not settling in time is said, not failed: the proof
/// that follows waits for the members itself.
pub async fn wait_etcd_rolled_out(client: &kube::Client, hcp_ns: &str, hcp_name: &str, timeout: Duration) -> Result<(), KubeError> {
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), hcp_ns);
    let hcps = api(client, &crate::hosted::HOSTED_CONTROL_PLANE, hcp_ns);
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let sts = sets
            .get_opt(hosted::ETCD_STATEFULSET)
            .await
            .map_err(request(format!("reading StatefulSet {hcp_ns}/etcd")))?
            .map(|s| serde_json::to_value(s).unwrap_or_default());
        let hcp = get_json(&hcps, hcp_name, &format!("HostedControlPlane {hcp_ns}/{hcp_name}")).await?;
        let restored = hcp.as_ref().and_then(|h| hosted::current_condition(h, "EtcdSnapshotRestored")) == Some("True");
        let waiting = match &sts {
            None => "the etcd StatefulSet".to_string(),
            Some(sts) => match etcd_rolled_out(sts, restored) {
                Ok(()) => return Ok(()),
                Err(why) => why,
            },
        };
        if started.elapsed() >= timeout {
            tracing::warn!(namespace = %hcp_ns, "etcd has not settled within {}s (waiting for {waiting}): checking it as it is", timeout.as_secs());
            return Ok(());
        }
        if waiting != last {
            tracing::info!(namespace = %hcp_ns, "waiting for {waiting}");
            last = waiting;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The proof that the restored members are one cluster (journaled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OneCluster {
    pub cluster_id: String,
    pub leader: String,
    /// The members every member lists.
    pub members: Vec<String>,
    /// Per member.
    pub revisions: BTreeMap<String, i64>,
    /// Every member is at or above this: the backup's revision plus the
    /// seeding's bump (the backup's own with the URL path).
    pub min_revision: i64,
    /// A key written through this member was read back through the others.
    pub probe_written_through: String,
    pub probe_read_back: Vec<String>,
}

/// Wait until the restored members are ONE cluster at or above the
/// restored revision (`one_cluster`), and fail when they answer but are
/// not: split clusters do not heal by themselves.
async fn prove_one_cluster(ctx: &RestoreContext, seeded: Option<&Seeded>, backup_revision: i64, timeout: Duration) -> Result<OneCluster, StageFailure> {
    let hc = hosted_cluster(ctx.objects.as_deref().unwrap_or_default())?;
    let hcp_ns = ctx.inputs.hcp_namespace();
    let tls = etcd_access::discover_tls(&ctx.client, &hcp_ns, &TlsOverride::default()).await?;
    let cluster = health::EtcdCluster { client: &ctx.client, hosted_cluster: &hc, access: ctx.inputs.etcd_access, tls: &tls };
    let expected: Vec<String> = (0..hc.expected_etcd_members()).map(|i| format!("{}-{i}", hosted::ETCD_STATEFULSET)).collect();
    let seeded_volumes = seeded.filter(|s| s.mode == SeedMode::Volumes && s.expected_min_revision > 0);
    let min_revision = seeded_volumes.map(|s| s.expected_min_revision).unwrap_or(backup_revision);
    wait_etcd_rolled_out(&ctx.client, &hcp_ns, &ctx.inputs.hosted_cluster, timeout.min(Duration::from_secs(180))).await?;
    let started = Instant::now();
    let (mut strikes, mut last) = (0, String::new());
    loop {
        let found = health::probe(&cluster).await.map_err(|e| StageError::Precondition(e.to_string()))?;
        let verdict = one_cluster::check(&expected, &hcp_ns, &found.members);
        let mut definitive = verdict.split.clone();
        let mut waiting = verdict.waiting.clone();
        for m in found.members.iter().filter(|m| expected.contains(&m.name)) {
            if let Some(revision) = m.revision.filter(|r| *r < min_revision) {
                definitive.push(format!(
                    "{} is at revision {revision}, below the {min_revision} the restore gives every member ({}): it does not hold the restored data (a leftover volume, or the download failed: kubectl -n {hcp_ns} logs {} -c etcd-init)",
                    m.name,
                    if seeded_volumes.is_some() { "the backup's revision plus the seeding's bump" } else { "the backup's revision" },
                    m.name
                ));
            }
        }
        if definitive.is_empty() && waiting.is_empty() {
            let members: Vec<&health::MemberHealth> = expected.iter().filter_map(|n| found.member(n)).collect();
            let probe = one_cluster::write_probe(&cluster, found.access, &members).await.map_err(StageError::Precondition)?;
            match one_cluster::probe_split(&probe) {
                Some(split) => definitive.push(split),
                None if !probe.unreadable.is_empty() => waiting.push(format!("the probe key could not be read back: {}", probe.unreadable.join("; "))),
                None => {
                    let leader = found.members.iter().find(|m| m.leader).map(|m| m.name.clone()).unwrap_or_default();
                    let first = members.first().copied();
                    tracing::info!(cluster_id = %first.and_then(|m| m.cluster_id.clone()).unwrap_or_default(), leader = %leader, "etcd is one cluster of {}: a key written through {} was read through {}", expected.join(", "), probe.written_through, probe.read_back.join(", "));
                    return Ok(OneCluster {
                        cluster_id: first.and_then(|m| m.cluster_id.clone()).unwrap_or_default(),
                        leader,
                        members: first.and_then(|m| m.members.clone()).unwrap_or_default(),
                        revisions: members.iter().filter_map(|m| m.revision.map(|r| (m.name.clone(), r))).collect(),
                        min_revision,
                        probe_written_through: probe.written_through,
                        probe_read_back: probe.read_back,
                    });
                }
            }
        }
        // a split is stable: seen three times running, it is the answer
        strikes = if definitive.is_empty() { 0 } else { strikes + 1 };
        if strikes >= 3 {
            let why = if seeded_volumes.is_some() {
                "hcp-dr seeded every member's volume, yet they are not one cluster: did something else fill or replace the volumes?".to_string()
            } else {
                one_cluster::split_advice(&found)
            };
            return Err(StageError::Precondition(format!(
                "etcd in {hcp_ns} is not one cluster of {}:\n  - {}\n{why}. Remove this restore with --abort (it deletes what it created) and restore again with --etcd-seed volumes (the default for HighlyAvailable), which seeds the members itself; see `hcp-dr etcd status --hosted-cluster {} -n {}`",
                expected.join(", "),
                definitive.join("\n  - "),
                ctx.inputs.hosted_cluster,
                ctx.inputs.namespace
            ))
            .into());
        }
        let now: Vec<String> = definitive.iter().chain(&waiting).cloned().collect();
        if started.elapsed() >= timeout {
            return Err(KubeError::Timeout { what: format!("the etcd members in {hcp_ns} to be one cluster at revision {min_revision} or above ({})", now.join("; ")), seconds: timeout.as_secs() }.into());
        }
        let said = now.join("; ");
        if said != last {
            tracing::info!(namespace = %hcp_ns, "etcd not yet one cluster: {said}");
            last = said;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
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
        let seeded = step.output_of::<EtcdSeed>()?;
        Ok(run(ctx, timeout, &manifest, seeded.as_ref()).await?)
    }
}
