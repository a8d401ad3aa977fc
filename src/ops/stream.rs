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

use super::OpsError;
use super::backup::check_name;
use crate::archive::encryption::{Identities, Recipients};
use crate::hosted::HostedCluster;
use crate::pipeline::Interrupt;
use crate::stages::context::{EtcdAccess, MemberTarget, TlsOverride};
use crate::stages::etcd_access;
use crate::stages::etcd_ops::health::{self, EtcdCluster};
use crate::store::{self, S3Options, Store};
use crate::stream::catalog::{self, Window};
use crate::stream::replay::{ReplayReport, Target};
use crate::stream::run::{ClusterReport, StreamSettings};
use crate::stream::source::{MemberSource, Reached, preference};
use crate::stream::verify::ChainVerdict;
use crate::stream::watch::WatchSettings;
use crate::stream::writer::Cut;
use crate::stream::{StreamError, run};

/// How the management cluster and the etcd members are reached.
#[derive(Debug, Clone)]
pub struct Reach {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub etcd_access: EtcdAccess,
    pub tls: TlsOverride,
}

/// Everything `hcp-dr stream` was asked.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    pub reach: Reach,
    /// `(namespace, name)` of every HostedCluster to stream.
    pub clusters: Vec<(String, String)>,
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
}

/// What `hcp-dr stream` did, once stopped.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    pub store: String,
    pub started: DateTime<Utc>,
    pub finished: DateTime<Utc>,
    /// `SIGTERM`, `SIGINT`, `--for 30s`, or `error`.
    pub stopped_by: String,
    pub clusters: Vec<ClusterReport>,
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

/// Stream every cluster asked until SIGTERM/SIGINT (`interrupt`) or
/// `--for`: then each writes its open segment durably and the report says
/// what was written.
pub async fn stream(options: StreamOptions, interrupt: &mut Interrupt) -> Result<StreamReport, OpsError> {
    if options.clusters.is_empty() {
        return Err(OpsError::Input("--hosted-cluster is required (NAMESPACE/NAME, repeatable)".into()));
    }
    for (namespace, name) in &options.clusters {
        check_cluster(namespace, name)?;
    }
    let recipients = Recipients::parse(&options.encrypt_to).map_err(|e| OpsError::Input(e.to_string()))?;
    if let store::StoreUrl::Local(path) = store::StoreUrl::parse(&options.store)? {
        store::LocalStore::new(path)
            .check_writable(false)
            .await
            .map_err(|err| OpsError::Input(format!("--to {}: the stream cannot be written there ({err}); give a directory hcp-dr can create and write", options.store)))?;
    }
    let client = crate::kube::client(options.reach.kubeconfig.as_deref(), options.reach.context.as_deref()).await?;
    let store: Arc<dyn Store> = store::open(&options.store, options.s3.clone()).await?.into();
    // every cluster found and its TLS readable before anything starts
    let mut sources = Vec::new();
    for (namespace, name) in &options.clusters {
        let hc = health::hosted_cluster(&client, namespace, name).await.map_err(health_error)?;
        health::tls(&client, &hc.hcp_namespace(), &options.reach.tls).await.map_err(health_error)?;
        sources.push(HostedMembers { client: client.clone(), hosted_cluster: hc, access: options.reach.etcd_access, tls: options.reach.tls.clone() });
    }
    let settings = StreamSettings {
        cut: Cut { interval: options.segment_interval, size: options.segment_size },
        base_interval: options.base_interval,
        level: crate::archive::compression::DEFAULT_LEVEL,
        recipients,
        watch: options.watch,
    };
    let started = Utc::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let runs = futures::future::join_all(options.clusters.iter().zip(sources).map(|((namespace, name), source)| {
        let cluster = run::Cluster { namespace: namespace.clone(), hosted_cluster: name.clone(), store: store.clone(), source: Arc::new(source) };
        run::run(cluster, settings.clone(), stop_rx.clone())
    }));
    tokio::pin!(runs);
    let deadline = options.run_for.map(|d| tokio::time::Instant::now() + d);
    let mut stopped_by: Option<String> = None;
    let clusters = loop {
        tokio::select! {
            reports = &mut runs => break reports,
            signal = interrupt.wait(), if stopped_by.is_none() => {
                tracing::info!("{signal}: writing the open segments, then stopping");
                stopped_by = Some(signal.to_string());
                let _ = stop_tx.send(true);
            }
            _ = sleep_until(deadline), if stopped_by.is_none() && deadline.is_some() => {
                let ran = crate::duration::show(options.run_for.unwrap_or_default());
                tracing::info!("--for {ran} is over: writing the open segments, then stopping");
                stopped_by = Some(format!("--for {ran}"));
                let _ = stop_tx.send(true);
            }
        }
    };
    Ok(StreamReport { store: store.url(), started, finished: Utc::now(), stopped_by: stopped_by.unwrap_or_else(|| "error".into()), clusters })
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
    let verdicts = verify_chains(store.as_ref(), &options.namespace, &options.hosted_cluster, chain, identities.as_ref(), remedy).await?;
    let ok = verdicts.iter().all(|v| v.ok);
    Ok(VerifyReport { hosted_cluster, store: store.url(), chains: verdicts, ok })
}

/// The chains of `namespace/hosted_cluster` in `store` that `chain`
/// selects (all of them when `None`), each verified (`stream verify`,
/// `backups verify` of a stream). Bad input when none is selected: an
/// unknown chain id is named with the chains there are; a cluster without
/// any chain gets `remedy`.
pub(crate) async fn verify_chains(
    store: &dyn Store,
    namespace: &str,
    hosted_cluster: &str,
    chain: Option<&str>,
    identities: Option<&Identities>,
    remedy: &str,
) -> Result<Vec<crate::stream::verify::ChainVerdict>, OpsError> {
    let (chains, _) = catalog::chains(store, namespace, hosted_cluster).await.map_err(stream_error)?;
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

/// Replay a cluster's stream to `target` into the snapshot file `out`.
pub async fn replay(options: &ReadOptions, target: Target, out: &std::path::Path) -> Result<ReplayReport, OpsError> {
    if let Target::Revision(r) = target
        && r < 1
    {
        return Err(OpsError::Input(format!("--at-revision {r}: etcd revisions start at 1")));
    }
    let (store, identities) = open_for_reading(options).await?;
    let tools = crate::etcd::scratch::ScratchTools::find().map_err(|e| OpsError::Input(e.replace("the deep check did not run", "a replay runs one")))?;
    crate::stream::replay::replay(store.as_ref(), &options.namespace, &options.hosted_cluster, target, out, identities.as_ref(), &tools).await.map_err(stream_error)
}
