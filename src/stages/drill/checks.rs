//! `checks`: what the restored drill cluster holds, compared with the
//! backup. Each check is a named result with a detail; a failed check does
//! not stop the drill (teardown still runs), it fails it in the report.
//!
//! - **etcd members**: as many member pods as the cluster's availability policy asks.
//! - **etcd one cluster**: the members answer as one cluster (same cluster
//!   and member list, one leader) and a key written through one is read
//!   back through the others (`etcd_ops::one_cluster`).
//! - **etcd revision `<member>`**: the member's revision is at least the
//!   manifest's plus the seeding's bump (it restored the snapshot, not an
//!   empty database).
//! - **etcd keys `<member>`**: per resource prefix (`/kubernetes.io/secrets/`),
//!   the keys of the member created at or before the backup's revision (the
//!   ones the snapshot brought; etcd keeps a key's create revision through a
//!   restore) are exactly as many as the snapshot holds live (read offline by
//!   `verify`). Read on each member itself (serializable). Prefixes a running
//!   cluster changes by itself ([`CHURNED`]) are reported, not compared.
//! - **hosted API samples**: ConfigMaps, Secrets and Namespaces from the
//!   backup (keys unchanged since its revision, spread over each prefix) read
//!   through the drill cluster's own API server: each is served at the
//!   resourceVersion etcd holds for it. Secrets read this way prove the
//!   encryption key came along. Their data is never printed.
//! - **nodes Ready `<pool>`**: each NodePool has its replicas Ready in the hosted cluster.
//! - **DNS isolation**: the drill's HostedCluster publishes none of the source's hostnames.
//! - **guest volume `<pvc>`** (KubeVirt): re-created Bound in the drill's
//!   control-plane namespace, owned by its DataVolume, with every entry the
//!   backup took (`volume-restore` checked the SHA-256 as it wrote them).

use std::collections::BTreeMap;

use async_trait::async_trait;
use etcd_client::GetOptions;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};

use super::DrillContext;
use crate::hosted::{self, HOSTED_CLUSTER, HostedCluster};
use crate::kube::{api, get_json, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step, stage::error_chain};
use crate::stages::context::{MemberTarget, TlsOverride};
use crate::stages::etcd_ops::{health, one_cluster};
use crate::stages::restore::volumes::VolumeRestore;
use crate::stages::restore::wait::{hosted_client, ready_nodes};
use crate::stages::{StageError, etcd_access};

pub struct Checks;

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl CheckResult {
    fn pass(name: impl Into<String>, detail: impl Into<String>) -> Self {
        CheckResult { name: name.into(), passed: true, detail: detail.into() }
    }
    fn fail(name: impl Into<String>, detail: impl Into<String>) -> Self {
        CheckResult { name: name.into(), passed: false, detail: detail.into() }
    }
}

/// A resource prefix a running cluster changes by itself, and why.
pub struct Churn {
    pub prefix: &'static str,
    pub reason: &'static str,
}

/// Prefixes whose keys from the backup a restored cluster deletes on its
/// own: reported, not compared.
pub const CHURNED: &[Churn] = &[
    Churn { prefix: "/kubernetes.io/events/", reason: "events expire (1 h by default)" },
    Churn { prefix: "/kubernetes.io/events.k8s.io/", reason: "events expire" },
    Churn { prefix: "/kubernetes.io/minions/", reason: "a drill cluster gets new machines: the source's Nodes are replaced" },
    Churn { prefix: "/kubernetes.io/nodes/", reason: "the same Nodes, under the plural some API servers store them as" },
    Churn { prefix: "/kubernetes.io/pods/", reason: "pods of the replaced Nodes are deleted and scheduled again" },
    Churn { prefix: "/kubernetes.io/leases/", reason: "node leases go with their Nodes" },
    Churn { prefix: "/kubernetes.io/csinodes/", reason: "go with their Nodes" },
    Churn { prefix: "/kubernetes.io/masterleases/", reason: "API server endpoint leases expire" },
    Churn { prefix: "/kubernetes.io/certificatesigningrequests/", reason: "approved requests are cleaned up" },
];

/// Prefixes objects are sampled from, read back through the hosted API.
const SAMPLED: [&str; 3] = ["/kubernetes.io/configmaps/", "/kubernetes.io/secrets/", "/kubernetes.io/namespaces/"];
/// Objects sampled per prefix.
const PER_PREFIX: usize = 4;
/// Keys per range request when counting.
const PAGE: i64 = 1000;

/// What one member holds.
#[derive(Debug, Default)]
pub struct Census {
    /// Keys created at or before the backup's revision, per resource prefix.
    pub from_backup: BTreeMap<String, u64>,
    /// Keys of [`SAMPLED`] prefixes untouched since the backup: (key, mod revision).
    pub unchanged: BTreeMap<String, Vec<(String, i64)>>,
    /// Every key now.
    pub total: u64,
}

impl Census {
    /// Count one key.
    pub fn add(&mut self, key: &[u8], create_revision: i64, mod_revision: i64, backup_revision: i64) {
        self.total += 1;
        if create_revision > backup_revision {
            return;
        }
        let prefix = crate::etcd::verify::resource_prefix(key);
        *self.from_backup.entry(prefix.clone()).or_default() += 1;
        if mod_revision <= backup_revision && SAMPLED.contains(&prefix.as_str()) {
            self.unchanged
                .entry(prefix)
                .or_default()
                .push((String::from_utf8_lossy(key).into_owned(), mod_revision));
        }
    }

    /// Up to [`PER_PREFIX`] keys of each sampled prefix, spread over it.
    pub fn samples(&self) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for keys in self.unchanged.values() {
            let step = keys.len().div_ceil(PER_PREFIX).max(1);
            out.extend(keys.iter().step_by(step).take(PER_PREFIX).cloned());
        }
        out
    }
}

/// Compare one member's keys from the backup with the snapshot's live keys.
pub fn compare_counts(member: &str, snapshot: &BTreeMap<String, u64>, census: &Census) -> CheckResult {
    let name = format!("etcd keys {member}");
    let churned = |p: &str| CHURNED.iter().any(|c| c.prefix == p);
    let mut prefixes: Vec<&String> = snapshot.keys().chain(census.from_backup.keys()).collect();
    prefixes.sort();
    prefixes.dedup();
    let (mut compared, mut keys, mut wrong, mut skipped) = (0, 0, Vec::new(), Vec::new());
    for prefix in prefixes {
        let want = snapshot.get(prefix).copied().unwrap_or(0);
        let have = census.from_backup.get(prefix).copied().unwrap_or(0);
        if churned(prefix) {
            skipped.push(format!("{prefix} {have}/{want}"));
        } else if want == have {
            compared += 1;
            keys += want;
        } else {
            wrong.push(format!("{prefix} has {have} of the backup's keys, the snapshot {want}"));
        }
    }
    let not_compared = if skipped.is_empty() {
        String::new()
    } else {
        format!("; not compared (a running cluster changes them): {}", skipped.join(", "))
    };
    if wrong.is_empty() {
        CheckResult::pass(name, format!("{keys} keys in {compared} resource prefixes, as in the snapshot{not_compared}"))
    } else {
        CheckResult::fail(name, format!("{}{not_compared}", wrong.join("; ")))
    }
}

/// Every key of a member (keys only, paged, read from the member itself),
/// counted against the backup's revision.
async fn census(client: &mut etcd_client::Client, backup_revision: i64) -> Result<Census, etcd_client::Error> {
    let mut out = Census::default();
    let (mut from, mut revision) = (vec![0u8], 0);
    loop {
        let mut options = GetOptions::new().with_from_key().with_keys_only().with_serializable().with_limit(PAGE);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let response = client.get(from.clone(), Some(options)).await?;
        if revision == 0 {
            revision = response.header().map(|h| h.revision()).unwrap_or_default();
        }
        for kv in response.kvs() {
            out.add(kv.key(), kv.create_revision(), kv.mod_revision(), backup_revision);
        }
        match response.kvs().last() {
            Some(last) if response.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(out),
        }
    }
}

/// Read one sampled key through the hosted API: its resourceVersion, or
/// None when the API server does not serve it.
async fn read_through_api(hosted: &kube::Client, key: &str) -> Result<Option<String>, String> {
    let rest = key.strip_prefix("/kubernetes.io/").ok_or_else(|| format!("{key} is not an API server key"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    let failed = |e: kube::Error| format!("reading {key} through the hosted API: {e}");
    let rv = match parts.as_slice() {
        ["configmaps", ns, name] => Api::<ConfigMap>::namespaced(hosted.clone(), ns).get_opt(name).await.map_err(failed)?.map(|o| o.metadata),
        ["secrets", ns, name] => Api::<Secret>::namespaced(hosted.clone(), ns).get_opt(name).await.map_err(failed)?.map(|o| o.metadata),
        ["namespaces", name] => Api::<Namespace>::all(hosted.clone()).get_opt(name).await.map_err(failed)?.map(|o| o.metadata),
        _ => return Err(format!("{key}: no reader for this key")),
    };
    Ok(rv.map(|m| m.resource_version.unwrap_or_default()))
}

/// Wait (at most 90 s) until the hosted API server answers a read; the
/// checks that follow say what fails if it never does.
async fn answers(hosted: &kube::Client) {
    let namespaces: Api<Namespace> = Api::all(hosted.clone());
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(90) {
        if namespaces.list(&ListParams::default().limit(1)).await.is_ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The hosted-API check: every sample served at the revision etcd holds.
async fn samples_check(hosted: &kube::Client, samples: &[(String, i64)]) -> CheckResult {
    const NAME: &str = "hosted API samples";
    if samples.is_empty() {
        return CheckResult::fail(NAME, "no ConfigMap, Secret or Namespace from the backup was left unchanged to sample");
    }
    let mut problems = Vec::new();
    for (key, revision) in samples {
        match read_through_api(hosted, key).await {
            Ok(Some(rv)) if rv == revision.to_string() => {}
            Ok(Some(rv)) => problems.push(format!("{key} is served at resourceVersion {rv}, etcd holds revision {revision}")),
            Ok(None) => problems.push(format!("{key} is in etcd but the hosted API does not serve it")),
            Err(e) => problems.push(e),
        }
    }
    let names: Vec<&str> = samples.iter().map(|(k, _)| k.trim_start_matches("/kubernetes.io/")).collect();
    if problems.is_empty() {
        CheckResult::pass(NAME, format!("{} objects from the backup served as etcd holds them: {}", samples.len(), names.join(", ")))
    } else {
        CheckResult::fail(NAME, problems.join("; "))
    }
}

/// The etcd members of the drill's control plane, as restore's wait finds them.
async fn members(client: &kube::Client, hcp_ns: &str) -> Result<Vec<MemberTarget>, StageFailure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), hcp_ns);
    let listed = pods
        .list(&ListParams::default().labels(hosted::ETCD_POD_SELECTOR))
        .await
        .map_err(request(format!("listing etcd pods in {hcp_ns}")))?;
    let mut targets: Vec<MemberTarget> = listed
        .items
        .into_iter()
        .map(|pod| MemberTarget {
            pod: pod.metadata.name.unwrap_or_default(),
            pod_ip: pod.status.and_then(|s| s.pod_ip).unwrap_or_default(),
            revision: 0,
        })
        .collect();
    targets.sort_by(|a, b| a.pod.cmp(&b.pod));
    Ok(targets)
}

/// The etcd checks of every member; returns the samples of the first one read.
async fn etcd_checks(ctx: &DrillContext, step: &Step<'_>, snapshot: Option<&BTreeMap<String, u64>>, out: &mut Vec<CheckResult>) -> Result<Vec<(String, i64)>, StageFailure> {
    let restore = &ctx.restore;
    let hcp_ns = restore.inputs.hcp_namespace();
    let backup_revision = crate::stages::restore::verify::manifest(restore, step)
        .await?
        .etcd
        .iter()
        .map(|s| s.revision)
        .max()
        .ok_or_else(|| StageError::Precondition("the backup's manifest lists no etcd snapshot".into()))?;
    let expected = crate::stages::restore::preflight::hosted_cluster(restore.objects.as_deref().unwrap_or_default())?.expected_etcd_members();
    let targets = members(&restore.client, &hcp_ns).await?;
    let names: Vec<&str> = targets.iter().map(|t| t.pod.as_str()).collect();
    out.push(if targets.len() == expected {
        CheckResult::pass("etcd members", format!("{} of {expected} member pods run: {}", targets.len(), names.join(", ")))
    } else {
        CheckResult::fail("etcd members", format!("{} etcd pod(s) in {hcp_ns} ({}), the cluster's policy asks for {expected}", targets.len(), names.join(", ")))
    });
    let tls = match etcd_access::discover_tls(&restore.client, &hcp_ns, &TlsOverride::default()).await {
        Ok(tls) => tls,
        Err(err) => {
            out.push(CheckResult::fail("etcd access", error_chain(err.as_ref())));
            return Ok(Vec::new());
        }
    };
    let hc = crate::stages::restore::preflight::hosted_cluster(restore.objects.as_deref().unwrap_or_default())?;
    out.push(one_cluster_check(restore, &hc, &tls).await);
    // seeded members start above the backup's revision by the seeding's bump
    let seeded = step.output_of::<crate::stages::restore::etcd_seed::EtcdSeed>()?.filter(|s| s.expected_min_revision > 0);
    let min_revision = seeded.as_ref().map(|s| s.expected_min_revision).unwrap_or(backup_revision);
    let floor = match &seeded {
        Some(s) => format!("the backup's {backup_revision} plus the seeding's bump of {}", s.bump),
        None => format!("the backup's {backup_revision}"),
    };
    let mut samples = None;
    for target in &targets {
        let member = &target.pod;
        let read = async {
            let (etcd, _forward) = etcd_access::connect_member(&restore.client, &hcp_ns, restore.inputs.etcd_access, &tls, target).await?;
            let mut client = etcd.connect().await?;
            let status = etcd.status(&mut client).await?;
            let counted = census(&mut client, backup_revision).await?;
            Ok::<_, StageFailure>((status.revision, counted))
        };
        match read.await {
            Err(err) => out.push(CheckResult::fail(format!("etcd revision {member}"), format!("cannot read the member: {}", error_chain(err.as_ref())))),
            Ok((revision, counted)) => {
                out.push(if revision >= min_revision {
                    CheckResult::pass(format!("etcd revision {member}"), format!("revision {revision}, at or above {floor}"))
                } else {
                    CheckResult::fail(format!("etcd revision {member}"), format!("revision {revision} is below {floor}: the member did not restore the snapshot"))
                });
                out.push(match snapshot {
                    Some(snapshot) => compare_counts(member, snapshot, &counted),
                    None => CheckResult::fail(format!("etcd keys {member}"), "verify recorded no per-prefix key counts of the snapshot"),
                });
                samples.get_or_insert_with(|| counted.samples());
            }
        }
    }
    Ok(samples.unwrap_or_default())
}

/// The members are one cluster (`one_cluster`): the same cluster and member
/// list everywhere, one leader, and a key written through one member read
/// back through the others.
async fn one_cluster_check(restore: &crate::stages::restore::RestoreContext, hc: &HostedCluster, tls: &crate::stages::context::EtcdTlsMaterial) -> CheckResult {
    const NAME: &str = "etcd one cluster";
    let hcp_ns = restore.inputs.hcp_namespace();
    let cluster = health::EtcdCluster { client: &restore.client, hosted_cluster: hc, access: restore.inputs.etcd_access, tls };
    let expected: Vec<String> = (0..hc.expected_etcd_members()).map(|i| format!("{}-{i}", hosted::ETCD_STATEFULSET)).collect();
    // a member being replaced is waited for a while; a split is not
    let started = std::time::Instant::now();
    let found = loop {
        let found = match health::probe(&cluster).await {
            Ok(found) => found,
            Err(err) => return CheckResult::fail(NAME, format!("cannot read the members: {err}")),
        };
        let verdict = one_cluster::check(&expected, &hcp_ns, &found.members);
        if verdict.is_one_cluster() {
            break found;
        }
        if !verdict.split.is_empty() || started.elapsed() >= std::time::Duration::from_secs(90) {
            return CheckResult::fail(NAME, verdict.problems().join("; "));
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    };
    let members: Vec<&health::MemberHealth> = expected.iter().filter_map(|n| found.member(n)).collect();
    match one_cluster::write_probe(&cluster, found.access, &members).await {
        Err(err) => CheckResult::fail(NAME, err),
        Ok(probe) => match one_cluster::probe_split(&probe) {
            Some(split) => CheckResult::fail(NAME, split),
            None if !probe.unreadable.is_empty() => CheckResult::fail(NAME, format!("the probe key could not be read back: {}", probe.unreadable.join("; "))),
            None => CheckResult::pass(
                NAME,
                format!(
                    "cluster {}: every member lists {}; leader {}; a key written through {} was read back through {}",
                    members.first().and_then(|m| m.cluster_id.as_deref()).unwrap_or("?"),
                    expected.join(", "),
                    found.leader.as_deref().unwrap_or("?"),
                    probe.written_through,
                    if probe.read_back.is_empty() { "no other member (one member)".to_string() } else { probe.read_back.join(", ") }
                ),
            ),
        },
    }
}

/// Ready nodes of each NodePool of the drill cluster.
async fn node_checks(ctx: &DrillContext, hosted: &kube::Client, out: &mut Vec<CheckResult>) {
    let name = &ctx.inputs.identity.drill.name;
    let pools = ctx.restore.objects.as_deref().unwrap_or_default().iter().filter(|o| o["kind"] == "NodePool" && o["spec"]["clusterName"] == name.as_str());
    for pool in pools {
        let pool_name = pool["metadata"]["name"].as_str().unwrap_or_default();
        let want = pool["spec"]["replicas"].as_u64().or_else(|| pool["spec"]["autoScaling"]["min"].as_u64()).unwrap_or(0) as usize;
        let check = format!("nodes Ready {pool_name}");
        out.push(match ready_nodes(hosted, pool_name).await {
            Ok(ready) if ready >= want => CheckResult::pass(check, format!("{ready} Ready, {want} asked for")),
            Ok(ready) => CheckResult::fail(check, format!("{ready} Ready, {want} asked for")),
            Err(err) => CheckResult::fail(check, format!("listing nodes in the hosted cluster: {err}")),
        });
    }
}

/// The drill's HostedCluster publishes none of the source's hostnames.
fn dns_check(hc: &HostedCluster, ctx: &DrillContext) -> CheckResult {
    const NAME: &str = "DNS isolation";
    let source: Vec<&str> = ctx.rewrite.iter().flat_map(|r| r.hostnames.iter().map(|h| h.from.as_str())).collect();
    let published: Vec<String> = hc.0["spec"]["services"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| ["route", "loadBalancer"].map(|k| s["servicePublishingStrategy"][k]["hostname"].as_str().map(str::to_string)))
        .flatten()
        .collect();
    let taken: Vec<&String> = published.iter().filter(|h| source.contains(&h.as_str())).collect();
    if !taken.is_empty() {
        return CheckResult::fail(NAME, format!("the drill cluster publishes the source's hostnames {taken:?}"));
    }
    let listed = if published.is_empty() { "no hostname".to_string() } else { published.join(", ") };
    CheckResult::pass(NAME, format!("publishes {listed}; none of the source's {} hostname(s)", source.len()))
}

/// Each guest volume of the backup (KubeVirt) re-created in the drill's
/// control-plane namespace: its claim Bound, owned by its DataVolume when
/// the backup had one, holding as many entries as the backup took
/// (`volume-restore` checked the SHA-256 of what it wrote).
async fn volume_checks(ctx: &DrillContext, step: &Step<'_>, out: &mut Vec<CheckResult>) -> Result<(), StageFailure> {
    let Some(volumes) = ctx.restore.guest_volumes.as_ref().filter(|v| !v.is_empty()) else { return Ok(()) };
    let Some(restored) = step.output_of::<VolumeRestore>()? else {
        out.push(CheckResult::fail(
            "guest volumes",
            format!("the backup holds {} guest volume(s) and this drill's playbook has no `volume-restore` stage: their data was not proven to restore", volumes.len()),
        ));
        return Ok(());
    };
    let ns = ctx.inputs.identity.drill.hcp_namespace();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.restore.client.clone(), &ns);
    for v in volumes {
        let (claim, check) = (&v.volume.name, format!("guest volume {}", v.volume.name));
        let Some(files) = restored.restored.iter().find(|(n, _)| n == claim).map(|(_, f)| *f) else {
            out.push(CheckResult::fail(check, "`volume-restore` did not write it"));
            continue;
        };
        let Some(pvc) = pvcs.get_opt(claim).await.map_err(request(format!("reading PersistentVolumeClaim {ns}/{claim}")))? else {
            out.push(CheckResult::fail(check, format!("PersistentVolumeClaim {ns}/{claim} is gone")));
            continue;
        };
        let phase = pvc.status.and_then(|s| s.phase).unwrap_or_default();
        let owner = v.volume.data_volume.as_ref().and_then(|dv| dv["metadata"]["name"].as_str());
        let owned = owner.is_none_or(|dv| {
            pvc.metadata.owner_references.iter().flatten().any(|o| o.kind == crate::hosted::kubevirt::DATA_VOLUME.kind && o.name == dv)
        });
        out.push(if phase != "Bound" {
            CheckResult::fail(check, format!("PersistentVolumeClaim {ns}/{claim} is {phase:?}, not Bound"))
        } else if !owned {
            CheckResult::fail(check, format!("PersistentVolumeClaim {ns}/{claim} is not owned by its DataVolume {}", owner.unwrap_or_default()))
        } else if files != v.files {
            CheckResult::fail(check, format!("{files} entries written, the backup took {}", v.files))
        } else {
            let dv = owner.map(|dv| format!(", owned by DataVolume {dv}")).unwrap_or_default();
            CheckResult::pass(check, format!("Bound in {ns}{dv}; {files} entries as backed up, SHA-256 checked on write"))
        });
    }
    Ok(())
}

async fn run(ctx: &DrillContext, step: &Step<'_>) -> Result<Vec<CheckResult>, StageFailure> {
    let mut out = Vec::new();
    let snapshot: Option<BTreeMap<String, u64>> =
        step.output_of::<crate::stages::restore::verify::Verify>()?.and_then(|verified| verified.snapshot.keys_by_prefix);
    // HyperShift replaces the members once the restore is done (etcd-init
    // leaves the StatefulSet): the members are read once that is over
    let restore = &ctx.restore;
    crate::stages::restore::wait::wait_etcd_rolled_out(&restore.client, &restore.inputs.hcp_namespace(), &restore.inputs.hosted_cluster, restore.inputs.wait_timeout().min(std::time::Duration::from_secs(180))).await?;
    let samples = etcd_checks(ctx, step, snapshot.as_ref(), &mut out).await?;

    let (ns, name) = (&ctx.inputs.identity.drill.namespace, &ctx.inputs.identity.drill.name);
    let label = format!("HostedCluster {ns}/{name}");
    let hc = get_json(&api(&ctx.restore.client, &HOSTED_CLUSTER, ns), name, &label)
        .await?
        .map(HostedCluster)
        .ok_or_else(|| StageError::Precondition(format!("{label} is gone from the staging cluster")))?;
    match hosted_client(&ctx.restore.client, &hc).await {
        Ok(Some(hosted)) => {
            // its API server may be reconnecting after etcd's members were replaced
            answers(&hosted).await;
            out.push(samples_check(&hosted, &samples).await);
            node_checks(ctx, &hosted, &mut out).await;
        }
        Ok(None) => out.push(CheckResult::fail("hosted API samples", format!("{label} names no admin kubeconfig yet"))),
        Err(err) => out.push(CheckResult::fail("hosted API samples", format!("the drill's admin kubeconfig: {err}"))),
    }
    out.push(dns_check(&hc, ctx));
    volume_checks(ctx, step, &mut out).await?;
    Ok(out)
}

impl StageId for Checks {
    const NAME: &'static str = "checks";
    type Output = Vec<CheckResult>;
}

#[async_trait]
impl Stage<DrillContext> for Checks {
    fn summary(&self) -> &'static str {
        "compare the restored cluster with the backup: etcd revision and keys per prefix on every member, sample objects through the hosted API, NodePool nodes Ready, no source hostname, guest volumes re-created"
    }
    /// Only reads, but what it reads is created by this run: planned in a dry-run.
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &DrillContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "check {}: etcd revision and keys per prefix on every member against the backup, sample objects through its API, NodePool nodes Ready, none of the source's hostnames, guest volumes (KubeVirt) re-created with their data",
            ctx.inputs.identity.drill.path()
        )]
    }
    async fn run(&self, ctx: &mut DrillContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let results = run(ctx, step).await?;
        for check in results.iter().filter(|c| !c.passed) {
            tracing::warn!(check = %check.name, "check failed: {}", check.detail);
        }
        ctx.checks = results.clone();
        Ok(results)
    }
    fn restore(&self, ctx: &mut DrillContext, output: Self::Output) -> Result<(), StageFailure> {
        ctx.checks = output;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(keys: &[(&str, i64, i64)], backup: i64) -> Census {
        let mut c = Census::default();
        for (k, created, modified) in keys {
            c.add(k.as_bytes(), *created, *modified, backup);
        }
        c
    }

    #[test]
    fn keys_from_the_backup_are_counted_per_prefix_and_churn_is_reported_only() {
        let c = census(
            &[
                ("/kubernetes.io/configmaps/a/x", 3, 3),
                ("/kubernetes.io/configmaps/a/y", 4, 12), // changed since: counted, not sampled
                ("/kubernetes.io/configmaps/a/z", 11, 11), // created after the backup
                ("/kubernetes.io/pods/a/p", 12, 12),
                ("/kubernetes.io/secrets/a/s", 5, 5),
            ],
            10,
        );
        assert_eq!(c.total, 5);
        assert_eq!(c.from_backup["/kubernetes.io/configmaps/"], 2);
        assert_eq!(c.samples(), vec![("/kubernetes.io/configmaps/a/x".to_string(), 3), ("/kubernetes.io/secrets/a/s".to_string(), 5)]);
        let snapshot: BTreeMap<String, u64> = [("/kubernetes.io/configmaps/", 2), ("/kubernetes.io/secrets/", 1), ("/kubernetes.io/pods/", 4)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let ok = compare_counts("etcd-0", &snapshot, &c);
        assert!(ok.passed, "{ok:?}");
        assert!(ok.detail.contains("3 keys in 2 resource prefixes"), "{}", ok.detail);
        assert!(ok.detail.contains("/kubernetes.io/pods/ 0/4"), "{}", ok.detail);
        // a key of the backup missing on the member fails, naming the prefix
        let mut missing = snapshot.clone();
        missing.insert("/kubernetes.io/secrets/".into(), 2);
        let failed = compare_counts("etcd-1", &missing, &c);
        assert!(!failed.passed);
        assert_eq!(failed.name, "etcd keys etcd-1");
        assert!(failed.detail.contains("/kubernetes.io/secrets/ has 1 of the backup's keys, the snapshot 2"), "{}", failed.detail);
        // a prefix the snapshot does not have at all fails too
        let extra = census(&[("/kubernetes.io/configmaps/a/x", 3, 3), ("/kubernetes.io/roles/a/r", 2, 2)], 10);
        let only_cm: BTreeMap<String, u64> = [("/kubernetes.io/configmaps/".to_string(), 1)].into_iter().collect();
        assert!(!compare_counts("etcd-0", &only_cm, &extra).passed);
    }

    #[test]
    fn samples_spread_over_a_prefix() {
        let keys: Vec<(String, i64, i64)> = (0..10).map(|i| (format!("/kubernetes.io/secrets/w/s-{i}"), 2, 2)).collect();
        let borrowed: Vec<(&str, i64, i64)> = keys.iter().map(|(k, a, b)| (k.as_str(), *a, *b)).collect();
        let samples = census(&borrowed, 5).samples();
        let names: Vec<&str> = samples.iter().map(|(k, _)| k.rsplit('/').next().unwrap()).collect();
        assert_eq!(names, ["s-0", "s-3", "s-6", "s-9"]);
    }
}
