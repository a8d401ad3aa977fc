//! `hcp-dr stream`: continuous backup of hosted clusters' etcd into a
//! store (`stream::run`, one per cluster, at once), and what reads it
//! back: `stream list` (the chains and the revisions they restore),
//! `stream verify` (every segment's hash, the revisions contiguous from
//! the base) and `stream replay` (a snapshot at a revision or a time).
//!
//! Unlike the journaled operations, the stream changes nothing on any
//! cluster: it reads etcd (a watch, snapshots) and writes only to the
//! store, whose contents are its record; a killed stream is started
//! again, and resumes after the last durable revision.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use kube::Client;
use serde::Serialize;
use tokio::task::JoinSet;

use super::OpsError;
use super::backup::check_name;
use super::shard::Shard;
use crate::archive::encryption::{Identities, Recipients};
use crate::hosted::HostedCluster;
use crate::pipeline::Interrupt;
use crate::stages::context::{EtcdAccess, MemberTarget, TlsOverride};
use crate::stages::etcd_access;
use crate::stages::etcd_ops::health::{self, EtcdCluster};
use crate::store::{self, S3Options, Store};
use crate::stream::catalog::{self, Window};
use crate::stream::replay::{ReplayReport, Target};
use crate::stream::lease::{self, LeaseConfig};
use crate::stream::metrics::{self, Registry};
use crate::stream::run::{ClusterReport, StreamSettings};
use crate::stream::spool::SpoolSettings;
use crate::stream::source::{MemberSource, Reached, preference};
use crate::stream::verify::ChainVerdict;
use crate::stream::watch::WatchSettings;
use crate::stream::writer::Cut;
use crate::stream::{StreamError, objects, run};


/// How the management cluster and the etcd members are reached.
#[derive(Debug, Clone)]
pub struct Reach {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub etcd_access: EtcdAccess,
    pub tls: TlsOverride,
}

/// Which clusters a stream writes.
#[derive(Debug, Clone)]
pub enum Selection {
    /// These, `(namespace, name)`, found before anything starts.
    Named(Vec<(String, String)>),
    /// Every HostedCluster (matching `selector`) whose UID falls in
    /// `shard`, listed again every `relist_every`: a new one starts
    /// streaming, a deleted one (or one no longer selected) stops, its
    /// open segment written.
    All { selector: Option<String>, shard: Option<Shard>, relist_every: Duration },
}

/// The per-cluster Lease (`--lease-namespace`).
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// Where the Leases are (the stream's own namespace in a pod).
    pub namespace: String,
    pub duration: Duration,
    /// This host's name (a pod's name); the holder identity adds a random suffix.
    pub hostname: String,
}

/// Everything `hcp-dr stream` was asked.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    pub reach: Reach,
    pub selection: Selection,
    pub store: String,
    pub s3: S3Options,
    pub segment_interval: Duration,
    /// Raw bytes.
    pub segment_size: u64,
    pub base_interval: Duration,
    /// Stop after this long (drills, tests); `None`: until a signal.
    pub run_for: Option<Duration>,
    pub encrypt_to: Vec<String>,
    /// How often to ask the watched member for progress, and how long
    /// without an answer makes it failed.
    pub watch: WatchSettings,
    /// One writer per cluster; required with [`Selection::All`].
    pub lease: Option<LeaseOptions>,
    /// Serve `/metrics` and `/healthz` on this `HOST:PORT`.
    pub metrics_addr: Option<String>,
    /// Read each cluster's management-cluster objects this often and store
    /// a set when they changed (`stream::objects`); `None`: not recorded.
    pub objects_interval: Option<Duration>,
    /// `--base-from-backup`.
    pub base_from_backup: bool,
    /// Where segments the store does not take wait (`stream::spool`), and
    /// how many bytes may wait, every cluster together.
    pub spool_dir: std::path::PathBuf,
    pub spool_size: u64,
}

/// What `hcp-dr stream` did, once stopped.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    pub store: String,
    pub started: DateTime<Utc>,
    pub finished: DateTime<Utc>,
    /// `SIGTERM`, `SIGINT`, `--for 30s`, or `error`.
    pub stopped_by: String,
    /// `i/K` with `--shard` or `--shard-from-hostname`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Who this process was to the Leases.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_holder: Option<String>,
    /// One per run of a cluster's stream (a cluster whose Lease was lost
    /// and taken again has two).
    pub clusters: Vec<ClusterReport>,
    /// Clusters this process owned but did not stream when it stopped, and why
    /// (their Lease held by another stream).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_streamed: Vec<NotStreamed>,
}

/// A cluster not streamed by this process.
#[derive(Debug, Clone, Serialize)]
pub struct NotStreamed {
    pub hosted_cluster: String,
    pub reason: String,
}

impl StreamReport {
    /// Every cluster's stream stopped as asked, nothing failed.
    pub fn ok(&self) -> bool {
        self.clusters.iter().all(|c| c.error.is_none())
    }
}

pub(crate) fn stream_error(err: StreamError) -> OpsError {
    if err.is_input() { OpsError::Input(err.to_string()) } else { OpsError::Stream(err) }
}

fn check_cluster(namespace: &str, name: &str) -> Result<(), OpsError> {
    check_name("hosted cluster", name)?;
    check_name("namespace", namespace)
}

/// The shard of a StatefulSet pod: the ordinal its name ends in
/// (`hcp-dr-stream-3` is 3), of `count`.
pub fn shard_from_hostname(hostname: &str, count: usize) -> Result<Shard, OpsError> {
    let how = "run it as a pod of the StatefulSet `hcp-dr schedule render --continuous` renders (its pods are named NAME-ORDINAL), set HOSTNAME to such a name, or give --shard INDEX/COUNT instead";
    if count == 0 || count > super::shard::MAX_SHARDS {
        return Err(OpsError::Input(format!("--shard-from-hostname {count}: the count of replicas must be 1 to {}", super::shard::MAX_SHARDS)));
    }
    let ordinal = hostname.rsplit_once('-').map(|(_, n)| n).filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let Some(ordinal) = ordinal else {
        return Err(OpsError::Input(format!("--shard-from-hostname {count}: the host name `{hostname}` does not end in -ORDINAL (e.g. hcp-dr-stream-3): {how}")));
    };
    let index: usize = ordinal.parse().map_err(|_| OpsError::Input(format!("--shard-from-hostname {count}: `{ordinal}` in `{hostname}` is no ordinal: {how}")))?;
    if index >= count {
        return Err(OpsError::Input(format!(
            "--shard-from-hostname {count}: the host name `{hostname}` has ordinal {index}, not below {count}: give the StatefulSet's replica count (its spec.replicas), or --shard INDEX/COUNT"
        )));
    }
    Ok(Shard { index, count })
}

/// What the loops of one stream share.
struct Shared {
    client: Client,
    store: Arc<dyn Store>,
    settings: StreamSettings,
    reach: Reach,
    lease: Option<LeaseConfig>,
    registry: Arc<Registry>,
    /// How long to wait before asking for a busy Lease again.
    retry: Duration,
    objects_interval: Option<Duration>,
    spool: SpoolSettings,
}

/// How a cluster's loop ended.
struct SlotEnd {
    key: (String, String),
    reports: Vec<ClusterReport>,
    /// Its Lease was another's when it stopped, never taken since.
    busy: Option<String>,
}

/// A cluster's loop, as the stream tracks it.
struct Slot {
    uid: String,
    stop: tokio::sync::watch::Sender<bool>,
    /// Told to stop (deleted, no longer this shard's); still writing its open segment.
    ending: bool,
}

/// Stream every cluster selected until SIGTERM/SIGINT (`interrupt`) or
/// `--for`: then each writes its open segment durably and the report says
/// what was written.
pub async fn stream(options: StreamOptions, interrupt: &mut Interrupt) -> Result<StreamReport, OpsError> {
    match &options.selection {
        Selection::Named(clusters) if clusters.is_empty() => {
            return Err(OpsError::Input("--hosted-cluster is required (NAMESPACE/NAME, repeatable), or --all".into()));
        }
        Selection::Named(clusters) => {
            for (namespace, name) in clusters {
                check_cluster(namespace, name)?;
            }
        }
        Selection::All { relist_every, .. } => {
            if options.lease.is_none() {
                return Err(OpsError::Input(
                    "--all needs --lease-namespace NAMESPACE: with every cluster found for itself, each stream takes a cluster's Lease there before writing it (give the namespace the stream runs in; its Role must allow leases get/create/update there)".into(),
                ));
            }
            if relist_every.is_zero() {
                return Err(OpsError::Input("--relist-every must be at least 1s".into()));
            }
        }
    }
    if let Some(lease) = &options.lease {
        check_name("lease namespace", &lease.namespace)?;
        if lease.duration < Duration::from_secs(2) {
            return Err(OpsError::Input(format!("--lease-duration {}: at least 2s (it is renewed every third of it)", crate::duration::show(lease.duration))));
        }
    }
    let recipients = Recipients::parse(&options.encrypt_to).map_err(|e| OpsError::Input(e.to_string()))?;
    if let store::StoreUrl::Local(path) = store::StoreUrl::parse(&options.store)? {
        store::LocalStore::new(path)
            .check_writable(false)
            .await
            .map_err(|err| OpsError::Input(format!("--to {}: the stream cannot be written there ({err}); give a directory hcp-dr can create and write", options.store)))?;
    }
    let spool = SpoolSettings::new(options.spool_dir.clone(), options.spool_size);
    spool.check().map_err(|err| {
        OpsError::Input(format!("--spool-dir {}: segments cannot be spooled there ({err}); give a local directory hcp-dr can create and write", options.spool_dir.display()))
    })?;
    let listener = match &options.metrics_addr {
        Some(addr) => Some(metrics::bind(addr).await.map_err(OpsError::Input)?),
        None => None,
    };
    let client = crate::kube::client(options.reach.kubeconfig.as_deref(), options.reach.context.as_deref()).await?;
    let store: Arc<dyn Store> = store::open(&options.store, options.s3.clone()).await?.into();
    let settings = StreamSettings {
        cut: Cut { interval: options.segment_interval, size: options.segment_size },
        base_interval: options.base_interval,
        level: crate::archive::compression::DEFAULT_LEVEL,
        recipients,
        watch: options.watch,
        base_from_backup: options.base_from_backup,
    };
    let lease = options.lease.as_ref().map(|l| LeaseConfig { client: client.clone(), namespace: l.namespace.clone(), holder: lease::holder_identity(&l.hostname), duration: l.duration });
    let registry = Arc::new(Registry::default());
    let shared = Arc::new(Shared {
        client: client.clone(),
        store: store.clone(),
        settings,
        reach: options.reach.clone(),
        retry: lease.as_ref().map_or(Duration::from_secs(10), |l| (l.duration / 3).max(Duration::from_secs(1))),
        lease,
        registry: registry.clone(),
        objects_interval: options.objects_interval,
        spool,
    });
    let mut slots: std::collections::BTreeMap<(String, String), Slot> = Default::default();
    let mut loops: JoinSet<SlotEnd> = JoinSet::new();
    let (shard, relist_every, selector) = match &options.selection {
        Selection::Named(clusters) => {
            // every cluster found and its TLS readable before anything starts
            let mut found = Vec::new();
            for (namespace, name) in clusters {
                let hc = health::hosted_cluster(&client, namespace, name).await.map_err(health_error)?;
                health::tls(&client, &hc.hcp_namespace(), &options.reach.tls).await.map_err(health_error)?;
                found.push(hc);
            }
            for hc in found {
                spawn_slot(&shared, &mut slots, &mut loops, hc);
            }
            (None, None, None)
        }
        Selection::All { selector, shard, relist_every } => {
            // the first listing must work: a missing right is said at once
            let listed = list_owned(&client, selector.as_deref(), *shard).await?;
            tracing::info!("{} HostedCluster(s) to stream{}", listed.len(), shard.map(|s| format!(" (shard {s})")).unwrap_or_default());
            for hc in listed {
                spawn_slot(&shared, &mut slots, &mut loops, hc);
            }
            registry.beat();
            *registry.heartbeat_every.lock().expect("metrics lock") = Some(*relist_every);
            (*shard, Some(*relist_every), selector.clone())
        }
    };
    let server = listener.map(|listener| {
        tracing::info!("serving /metrics and /healthz on {}", listener.local_addr().map(|a| a.to_string()).unwrap_or_default());
        tokio::spawn(metrics::serve(listener, registry.clone()))
    });
    let started = Utc::now();
    let deadline = options.run_for.map(|d| tokio::time::Instant::now() + d);
    let mut relist = relist_every.map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
    let mut stopped_by: Option<String> = None;
    let mut clusters = Vec::new();
    let mut not_streamed = Vec::new();
    let mut failed: std::collections::BTreeSet<(String, String)> = Default::default();
    let fleet = relist.is_some();
    loop {
        if loops.is_empty() && (stopped_by.is_some() || !fleet) {
            break;
        }
        tokio::select! {
            Some(joined) = loops.join_next(), if !loops.is_empty() => {
                let end = match joined {
                    Ok(end) => end,
                    Err(err) => {
                        registry.fail(format!("a cluster's loop ended abnormally: {err}"));
                        continue;
                    }
                };
                slots.remove(&end.key);
                let label = format!("{}/{}", end.key.0, end.key.1);
                if let Some(error) = end.reports.iter().find_map(|r| r.error.clone()) {
                    registry.fail(format!("{label}: the stream failed: {error}"));
                    failed.insert(end.key.clone());
                }
                if let Some(reason) = end.busy {
                    not_streamed.push(NotStreamed { hosted_cluster: label, reason });
                }
                clusters.extend(end.reports);
            }
            _ = tick(&mut relist), if relist.is_some() && stopped_by.is_none() => {
                registry.beat();
                match tokio::time::timeout(relist_every.unwrap_or_default().max(Duration::from_secs(5)), list_owned(&client, selector.as_deref(), shard)).await {
                    Ok(Ok(listed)) => {
                        let owned: std::collections::BTreeMap<(String, String), String> = listed.iter().map(|hc| ((hc.namespace().to_string(), hc.name().to_string()), hc.uid().to_string())).collect();
                        for (key, slot) in slots.iter_mut() {
                            if !slot.ending && owned.get(key) != Some(&slot.uid) {
                                tracing::info!("{}/{}: no longer a HostedCluster this stream owns (deleted, re-created, or not selected): writing its open segment and stopping", key.0, key.1);
                                slot.ending = true;
                                let _ = slot.stop.send(true);
                                registry.forget(&key.0, &key.1);
                            }
                        }
                        for hc in listed {
                            let key = (hc.namespace().to_string(), hc.name().to_string());
                            if !slots.contains_key(&key) && !failed.contains(&key) {
                                tracing::info!("{}/{}: a new HostedCluster to stream", key.0, key.1);
                                spawn_slot(&shared, &mut slots, &mut loops, hc);
                            }
                        }
                    }
                    Ok(Err(err)) => tracing::warn!("listing the HostedClusters again failed: {err} (the clusters already found go on)"),
                    Err(_) => tracing::warn!("listing the HostedClusters again took too long (the clusters already found go on)"),
                }
            }
            signal = interrupt.wait(), if stopped_by.is_none() => {
                tracing::info!("{signal}: writing the open segments, then stopping");
                stopped_by = Some(signal.to_string());
                slots.values().for_each(|s| { let _ = s.stop.send(true); });
            }
            _ = sleep_until(deadline), if stopped_by.is_none() && deadline.is_some() => {
                let ran = crate::duration::show(options.run_for.unwrap_or_default());
                tracing::info!("--for {ran} is over: writing the open segments, then stopping");
                stopped_by = Some(format!("--for {ran}"));
                slots.values().for_each(|s| { let _ = s.stop.send(true); });
            }
        }
    }
    if let Some(server) = server {
        server.abort();
    }
    Ok(StreamReport {
        store: store.url(),
        started,
        finished: Utc::now(),
        stopped_by: stopped_by.unwrap_or_else(|| "error".into()),
        shard: shard.map(|s| s.to_string()),
        lease_holder: shared.lease.as_ref().map(|l| l.holder.clone()),
        clusters,
        not_streamed,
    })
}

async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The HostedClusters matching `selector` whose UID falls in `shard`.
async fn list_owned(client: &Client, selector: Option<&str>, shard: Option<Shard>) -> Result<Vec<HostedCluster>, OpsError> {
    let mut params = kube::api::ListParams::default();
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let api = super::backup::hosted_clusters_api(client, None);
    let listed = crate::kube::list_json(&api, &params, "HostedClusters").await?;
    let mut owned: Vec<HostedCluster> = listed.into_iter().map(HostedCluster).filter(|hc| shard.is_none_or(|s| s.owns(hc.uid()))).collect();
    owned.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
    Ok(owned)
}

fn spawn_slot(shared: &Arc<Shared>, slots: &mut std::collections::BTreeMap<(String, String), Slot>, loops: &mut JoinSet<SlotEnd>, hc: HostedCluster) {
    let key = (hc.namespace().to_string(), hc.name().to_string());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    slots.insert(key, Slot { uid: hc.uid().to_string(), stop, ending: false });
    loops.spawn(cluster_loop(shared.clone(), hc, stop_rx));
}

/// One cluster: take its Lease (waiting while another stream holds it),
/// stream it until told to stop or the Lease is lost, then release the
/// Lease; a lost Lease is waited for again.
async fn cluster_loop(shared: Arc<Shared>, hc: HostedCluster, mut stop: tokio::sync::watch::Receiver<bool>) -> SlotEnd {
    let key = (hc.namespace().to_string(), hc.name().to_string());
    let label = format!("{}/{}", key.0, key.1);
    let metrics = shared.registry.cluster(&key.0, &key.1);
    let mut end = SlotEnd { key: key.clone(), reports: Vec::new(), busy: None };
    let mut said: Option<String> = None;
    let wait = |stop: &mut tokio::sync::watch::Receiver<bool>, d: Duration| {
        let mut stop = stop.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    };
    loop {
        if *stop.borrow() {
            break;
        }
        let held = match &shared.lease {
            None => None,
            Some(lease) => match lease.acquire(&key.0, &key.1).await {
                Ok(lease::Acquire::Acquired(held)) => {
                    tracing::info!("{label}: took {} as {}", held.label(), held.holder());
                    end.busy = None;
                    said = None;
                    Some(*held)
                }
                Ok(lease::Acquire::Busy(other)) => {
                    let message = format!("Lease {}/{} {other}: not streaming {label} while another stream writes it", lease.namespace, lease::lease_name(&key.0, &key.1));
                    if said.as_deref() != Some(other.holder.as_str()) {
                        tracing::info!("{message}; asking again every {}", crate::duration::show(shared.retry));
                        said = Some(other.holder.clone());
                    }
                    end.busy = Some(message);
                    wait(&mut stop, shared.retry).await;
                    continue;
                }
                Err(err) => {
                    tracing::warn!("{label}: {err}; trying again in {}", crate::duration::show(shared.retry));
                    end.busy = Some(err.to_string());
                    wait(&mut stop, shared.retry).await;
                    continue;
                }
            },
        };
        metrics.lease_held.store(held.is_some(), std::sync::atomic::Ordering::Relaxed);
        let source = HostedMembers { client: shared.client.clone(), hosted_cluster: hc.clone(), access: shared.reach.etcd_access, tls: shared.reach.tls.clone() };
        let cluster = run::Cluster { namespace: key.0.clone(), hosted_cluster: key.1.clone(), store: shared.store.clone(), source: Arc::new(source) };
        let (lost_tx, lost_rx) = tokio::sync::watch::channel(None);
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let keeper = held.map(|held| tokio::spawn(lease::keep(held, lost_tx, done_rx)));
        let hooks = run::Hooks { stop: stop.clone(), lost: lost_rx, metrics: Some(metrics.clone()), spool: Some(shared.spool.clone()) };
        // the objects beside the chains, as long as the chains are written
        let (objects_stop, objects_stop_rx) = tokio::sync::watch::channel(false);
        let recorder = shared.objects_interval.map(|interval| {
            let recorder = objects::Recorder {
                client: shared.client.clone(),
                store: shared.store.clone(),
                namespace: key.0.clone(),
                hosted_cluster: key.1.clone(),
                interval,
                recipients: shared.settings.recipients.clone(),
                include_free_agents: false,
            };
            tokio::spawn(recorder.run(objects_stop_rx))
        });
        let mut report = run::run_with(cluster, shared.settings.clone(), hooks).await;
        let _ = objects_stop.send(true);
        if let Some(recorder) = recorder {
            report.objects = recorder.await.ok();
        }
        let _ = done_tx.send(true);
        if let Some(keeper) = keeper
            && let Ok(Some(held)) = keeper.await
        {
            held.release().await;
        }
        metrics.lease_held.store(false, std::sync::atomic::Ordering::Relaxed);
        let (lost, failed) = (report.lease_lost.is_some(), report.error.is_some());
        end.reports.push(report);
        if failed || !lost {
            break;
        }
        // lost: another stream has it, or will once it expires
        wait(&mut stop, shared.retry).await;
    }
    end
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn health_error(err: health::HealthError) -> OpsError {
    match err {
        health::HealthError::Kube(err) => OpsError::Kube(err),
        other => OpsError::Input(other.to_string()),
    }
}

/// A hosted cluster's etcd members, found as `hcp-dr etcd status` finds
/// them (pods, client TLS from the HCP namespace, pod IP or port-forward)
/// each time the stream needs one: a member replaced meanwhile (new pod
/// IP, rotated certificates) is found again.
struct HostedMembers {
    client: Client,
    hosted_cluster: HostedCluster,
    access: EtcdAccess,
    tls: TlsOverride,
}

#[async_trait]
impl MemberSource for HostedMembers {
    async fn reach(&self, avoid: &[String]) -> Result<Reached, String> {
        let hcp_ns = self.hosted_cluster.hcp_namespace();
        let tls = health::tls(&self.client, &hcp_ns, &self.tls).await.map_err(|e| e.to_string())?;
        let cluster = EtcdCluster { client: &self.client, hosted_cluster: &self.hosted_cluster, access: self.access, tls: &tls };
        let health = health::probe(&cluster).await.map_err(|e| e.to_string())?;
        let rows: Vec<(String, bool, bool)> = health.members.iter().filter(|m| m.endpoint.is_some()).map(|m| (m.name.clone(), m.ok(), m.leader)).collect();
        let mut errors: Vec<String> = health.members.iter().filter_map(|m| m.problem().map(|p| format!("{}: {p}", m.name))).collect();
        for name in preference(&rows, avoid) {
            let Some(ip) = health.member(&name).and_then(|m| m.endpoint.as_deref()).and_then(health::endpoint_host) else { continue };
            let target = MemberTarget { pod: name.clone(), pod_ip: ip, revision: 0 };
            match etcd_access::connect_member(&self.client, &hcp_ns, health.access, &tls, &target).await {
                Ok((member, forward)) => {
                    let guard = forward.map(|f| Box::new(f) as Box<dyn std::any::Any + Send + Sync>);
                    return Ok(Reached { member, guard });
                }
                Err(err) => errors.push(format!("{name}: {}", crate::pipeline::stage::error_chain(err.as_ref()))),
            }
        }
        Err(format!("no healthy etcd member of {}/{} to use ({})", self.hosted_cluster.namespace(), self.hosted_cluster.name(), if errors.is_empty() { "no member found".into() } else { errors.join("; ") }))
    }
}

/// Which stream to read: a cluster's, in a store.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    pub namespace: String,
    pub hosted_cluster: String,
    pub store: String,
    pub s3: S3Options,
    /// age identity file for an encrypted stream.
    pub identity: Option<PathBuf>,
}

async fn open_for_reading(options: &ReadOptions) -> Result<(Arc<dyn Store>, Option<Identities>), OpsError> {
    check_cluster(&options.namespace, &options.hosted_cluster)?;
    let identities = options.identity.as_deref().map(Identities::from_file).transpose().map_err(|e| OpsError::Input(e.to_string()))?;
    if let store::StoreUrl::Local(path) = store::StoreUrl::parse(&options.store)?
        && !path.is_dir()
    {
        return Err(OpsError::Input(format!("--from {}: no such directory", options.store)));
    }
    let store: Arc<dyn Store> = store::open(&options.store, options.s3.clone()).await?.into();
    Ok((store, identities))
}

/// One chain, as `stream list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ChainSummary {
    pub chain_id: String,
    /// The revisions it restores (its base through its last segment
    /// reached without a gap); `None` when its descriptor is unreadable.
    pub window: Option<Window>,
    pub base_member: Option<String>,
    pub base_stored_bytes: Option<u64>,
    pub segments: usize,
    /// The last revision its segments name (past `window` when there is a gap).
    pub last_revision: Option<i64>,
    pub encrypted: bool,
    /// Why it followed the chain before it.
    pub previous: Option<crate::stream::format::Previous>,
    pub problem: Option<String>,
}

/// What `stream list` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ListReport {
    pub hosted_cluster: String,
    pub store: String,
    pub chains: Vec<ChainSummary>,
    /// Chain folders whose chain never started (a base without descriptor).
    pub incomplete: Vec<String>,
}

/// The chains of a cluster's stream and the revisions each restores.
pub async fn list(options: &ReadOptions) -> Result<ListReport, OpsError> {
    let (store, _) = open_for_reading(options).await?;
    let (chains, incomplete) = catalog::chains(store.as_ref(), &options.namespace, &options.hosted_cluster).await.map_err(stream_error)?;
    let windows = catalog::windows(&chains);
    let summaries = chains
        .iter()
        .map(|chain| {
            let descriptor = chain.descriptor.as_ref().ok();
            ChainSummary {
                chain_id: chain.layout.chain_id.clone(),
                window: windows.iter().find(|w| w.chain_id == chain.layout.chain_id).cloned(),
                base_member: descriptor.map(|d| d.base.member.clone()),
                base_stored_bytes: descriptor.map(|d| d.base.size),
                segments: chain.segments.len(),
                last_revision: chain.last_segment().map(|s| s.last),
                encrypted: descriptor.is_some_and(|d| d.encrypted()),
                previous: descriptor.and_then(|d| d.previous.clone()),
                problem: chain.descriptor.as_ref().err().cloned().or_else(|| chain.span().and_then(|s| s.problem)),
            }
        })
        .collect();
    Ok(ListReport { hosted_cluster: format!("{}/{}", options.namespace, options.hosted_cluster), store: store.url(), chains: summaries, incomplete })
}

/// What `stream verify` found.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub hosted_cluster: String,
    pub store: String,
    pub chains: Vec<ChainVerdict>,
    pub ok: bool,
}

/// Check every chain of a cluster's stream (or the one `chain` names).
pub async fn verify(options: &ReadOptions, chain: Option<&str>) -> Result<VerifyReport, OpsError> {
    let (store, identities) = open_for_reading(options).await?;
    let hosted_cluster = format!("{}/{}", options.namespace, options.hosted_cluster);
    let remedy = "no chain to verify (is `hcp-dr stream` writing to another store?)";
    let (chains, _) = catalog::chains(store.as_ref(), &options.namespace, &options.hosted_cluster).await.map_err(stream_error)?;
    let verdicts = verify_chains(store.as_ref(), &chains, &options.namespace, &options.hosted_cluster, chain, identities.as_ref(), remedy).await?;
    let ok = verdicts.iter().all(|v| v.ok);
    Ok(VerifyReport { hosted_cluster, store: store.url(), chains: verdicts, ok })
}

/// The chains of `namespace/hosted_cluster` in `store` (`chains`, as
/// listed by [`catalog::chains`]) that `chain` selects (all of them when
/// `None`), each verified (`stream verify`, `backups verify` of a stream).
/// Bad input when none is selected: an unknown chain id is named with the
/// chains there are; a cluster without any chain gets `remedy`.
pub(crate) async fn verify_chains(
    store: &dyn Store,
    chains: &[catalog::ChainListing],
    namespace: &str,
    hosted_cluster: &str,
    chain: Option<&str>,
    identities: Option<&Identities>,
    remedy: &str,
) -> Result<Vec<crate::stream::verify::ChainVerdict>, OpsError> {
    let picked: Vec<_> = chains.iter().filter(|c| chain.is_none_or(|id| c.layout.chain_id == id)).collect();
    if picked.is_empty() {
        let known: Vec<&str> = chains.iter().map(|c| c.layout.chain_id.as_str()).collect();
        return Err(OpsError::Input(match chain {
            Some(id) => format!(
                "no stream chain {id} of {namespace}/{hosted_cluster} in {} (chains: {}): `hcp-dr stream list` and `hcp-dr backups list` show them",
                store.url(),
                if known.is_empty() { "none".into() } else { known.join(", ") }
            ),
            None => format!("{namespace}/{hosted_cluster} has no stream chain in {}: {remedy}", store.url()),
        }));
    }
    let mut verdicts = Vec::new();
    for listing in picked {
        verdicts.push(crate::stream::verify::verify_chain(store, listing, identities).await.map_err(stream_error)?);
    }
    Ok(verdicts)
}

/// Check that a cluster's stream restores `target` (`backups verify
/// --at`): replayed into a scratch etcd and snapshotted as `replay` does,
/// the snapshot checked offline and then deleted.
pub async fn verify_point(options: &ReadOptions, target: Target) -> Result<ReplayReport, OpsError> {
    let scratch = tempfile::Builder::new()
        .prefix("hcp-dr-verify-point-")
        .tempdir()
        .map_err(|e| OpsError::Input(format!("a scratch folder for the replay (TMPDIR): {e}")))?;
    let mut report = replay(options, target, &scratch.path().join("point.db")).await?;
    report.out = "(checked, not kept)".into();
    Ok(report)
}

/// Replay a cluster's stream to `target` into the snapshot file `out`.
pub async fn replay(options: &ReadOptions, target: Target, out: &std::path::Path) -> Result<ReplayReport, OpsError> {
    if let Target::Revision(r) = target
        && r < 1
    {
        return Err(OpsError::Input(format!("--at-revision {r}: etcd revisions start at 1")));
    }
    let (store, identities) = open_for_reading(options).await?;
    let tools = crate::etcd::scratch::ScratchTools::find_for("a replay runs one").map_err(OpsError::Input)?;
    crate::stream::replay::replay(store.as_ref(), &options.namespace, &options.hosted_cluster, target, out, identities.as_ref(), &tools).await.map_err(stream_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statefulset_pod_takes_its_shard_from_its_name_and_bad_names_say_how() {
        assert_eq!(shard_from_hostname("hcp-dr-stream-3", 4).unwrap(), Shard { index: 3, count: 4 });
        assert_eq!(shard_from_hostname("hcp-dr-stream-0", 1).unwrap(), Shard { index: 0, count: 1 });
        for (hostname, count, says) in [
            ("laptop", 2, "does not end in -ORDINAL"),
            ("hcp-dr-stream-", 2, "does not end in -ORDINAL"),
            ("hcp-dr-stream-x1", 2, "does not end in -ORDINAL"),
            ("hcp-dr-stream-2", 2, "ordinal 2, not below 2"),
            ("hcp-dr-stream-0", 0, "1 to 256"),
            ("hcp-dr-stream-99999999999999999999999", 2, "is no ordinal"),
        ] {
            let err = shard_from_hostname(hostname, count).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            let text = err.to_string();
            assert!(text.contains(says) && text.contains("--shard"), "{hostname}: {text}");
        }
    }
}
