//! One cluster's stream over time: which chain it writes, and when it
//! starts another. Each chain runs as a task of its own (its watch, a
//! bounded queue, its writer); a base runs as another task while the
//! current chain goes on.
//!
//! - On start: the newest chain is resumed after its last durable
//!   revision when it runs from its base without a gap, is encrypted as
//!   asked and its base is younger than `--base-interval`; otherwise a new
//!   base is taken and a new chain starts.
//! - Every `--base-interval`: a new base is taken while the current chain
//!   goes on; once it is stored, the new chain starts after the base's
//!   revision and the current one stops once it has written through that
//!   revision, so the two overlap and every revision stays restorable.
//! - When the watch cannot go on (etcd compacted the revision it needs,
//!   as after a long outage; a missing revision): the chain ends at its
//!   last durable revision, the break is reported with the revisions no
//!   chain holds, and a new base is taken at once.
//! - When the store does not take a segment (with a spool, `Hooks::spool`):
//!   the chain keeps consuming its watch and sealing segments into the
//!   local spool, retries the store with backoff and uploads them oldest
//!   first when it answers. When the spool is full the chain stops taking
//!   revisions, uploads what it spooled once the store answers and ends as
//!   a break (the new base follows, as after a compaction). Segments an
//!   earlier run left in the spool are uploaded before the run starts,
//!   where they continue their chain; the others are dropped and reported.
//! - On stop (SIGTERM, SIGINT, `--for`): every chain writes its open
//!   segment durably (uploading its spool for at most 20 s: what stays is
//!   reported as not durable, and the run fails) and ends; a base being
//!   taken is abandoned and what it stored removed.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::Utc;
use serde::Serialize;
use tokio::sync::{mpsc, watch as signal};
use tokio::task::JoinSet;

use super::catalog::{self, url_slash};
use super::metrics::ClusterMetrics;
use super::format::{CHAIN_FORMAT, ChainDescriptor, ChainLayout, Coding, FORMAT_VERSION, Previous};
use super::source::MemberSource;
use super::watch::{self, WatchItem, WatchSettings};
use super::spool::{SpoolSettings, Spooled};
use super::writer::{ChainWriter, Cut, Flushed, Written};
use super::{StreamError, base, store_error};
use crate::archive::encryption::Recipients;
use crate::store::Store;

/// How the stream writes.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    pub cut: Cut,
    pub base_interval: Duration,
    /// zstd level of segments and bases.
    pub level: i32,
    pub recipients: Option<Recipients>,
    pub watch: WatchSettings,
    /// Start a new chain from the cluster's newest regular backup when it
    /// can serve (`base::from_backup`), a snapshot otherwise.
    pub base_from_backup: bool,
}

/// The cluster streamed, where to, and where its members are found.
pub struct Cluster {
    pub namespace: String,
    pub hosted_cluster: String,
    pub store: Arc<dyn Store>,
    pub source: Arc<dyn MemberSource>,
}

/// Revisions the watch may hand on before the writer takes them.
const QUEUE: usize = 256;
/// Warnings kept per chain (a member down for hours says so once a try).
const MAX_WARNINGS: usize = 20;
/// Waits before a failed base is tried again.
const BASE_RETRY: Duration = Duration::from_secs(10);

/// What one cluster's stream did.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// `namespace/name`.
    pub hosted_cluster: String,
    pub store: String,
    pub chains: Vec<ChainReport>,
    /// Where a chain ended because it could not go on.
    pub breaks: Vec<Break>,
    /// The members the watch used, and why it moved.
    pub moves: Vec<Move>,
    pub warnings: Vec<String>,
    /// Why the stream stopped on its own (it exits 1).
    pub error: Option<String>,
    /// The newest chain's last durable revision.
    pub last_durable_revision: Option<i64>,
    /// The cluster's Lease was lost (another stream holds it, or it could
    /// not be renewed): writing stopped at once, the open segment unwritten.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_lost: Option<String>,
    /// The management-cluster objects recorded beside the chains
    /// (`super::objects`), when they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<super::objects::ObjectsReport>,
}

/// What the stream around a run does to it beyond stopping it: abandon it
/// at once (its Lease was lost: not one more segment), and count what it
/// writes.
pub struct Hooks {
    /// `true`: write the open segments and end.
    pub stop: signal::Receiver<bool>,
    /// `Some(reason)`: end now without writing anything more.
    pub lost: signal::Receiver<Option<String>>,
    pub metrics: Option<Arc<ClusterMetrics>>,
    /// Keep the segments the store refuses here, within its bound, and
    /// upload them when it answers again; `None`: a segment the store
    /// refuses 4 times fails the run.
    pub spool: Option<SpoolSettings>,
}

/// What every chain task of a run shares beyond the cluster and settings.
#[derive(Clone)]
struct Aids {
    metrics: Option<Arc<ClusterMetrics>>,
    spool: Option<SpoolSettings>,
}

/// One chain as this run wrote it.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    pub chain_id: String,
    pub start: ChainStart,
    pub base_revision: i64,
    pub base_member: String,
    pub written: Written,
    pub last_durable_revision: i64,
    /// How it ended: `stopped`, `handed over to <chain>`, `broken: ...`, `failed: ...`.
    pub ended: String,
}

/// How a chain started in this run.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "how", rename_all = "kebab-case")]
pub enum ChainStart {
    /// From a base this run took.
    NewBase { stored_bytes: u64, raw_bytes: u64, seconds: f64 },
    /// Going on after the last durable revision an earlier run wrote.
    Resumed { after: i64 },
}

/// A chain that could not go on.
#[derive(Debug, Clone, Serialize)]
pub struct Break {
    pub chain_id: String,
    pub last_revision: i64,
    pub reason: String,
    /// The chain that follows, and its base revision: the revisions
    /// between are in no chain.
    pub next_chain: Option<String>,
    pub next_base_revision: Option<i64>,
}

impl Break {
    /// The revisions no chain holds, once the next chain started.
    pub fn lost(&self) -> Option<(i64, i64)> {
        self.next_base_revision.filter(|b| *b > self.last_revision + 1).map(|b| (self.last_revision + 1, b - 1))
    }
}

/// The watch moved to `to`.
#[derive(Debug, Clone, Serialize)]
pub struct Move {
    pub chain_id: String,
    pub from: Option<String>,
    pub to: String,
    pub at_revision: i64,
    pub reason: Option<String>,
}

/// When a chain's task stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopAt {
    Running,
    Now,
    /// Once it has written through this revision (a new chain's base).
    Through(i64),
}

enum Ended {
    Stopped,
    HandedOver,
    Broken(String),
    Failed(String),
}

struct ChainOutcome {
    report: ChainReport,
    moves: Vec<Move>,
    warnings: Vec<String>,
    ended: Ended,
    /// The break was counted in the metrics when it happened (a full spool).
    break_counted: bool,
}

/// A chain task's inputs.
struct ChainTask {
    cluster: Arc<Cluster>,
    settings: Arc<StreamSettings>,
    descriptor: ChainDescriptor,
    start: ChainStart,
    /// The first revision to write.
    from: i64,
    stop: signal::Receiver<StopAt>,
    durable: Arc<AtomicI64>,
    aids: Aids,
}

/// The chain being written, as the cluster's loop tracks it.
struct Current {
    chain_id: String,
    stop: signal::Sender<StopAt>,
    durable: Arc<AtomicI64>,
}

/// A base being taken for the chain at its layout: the chain's
/// descriptor once written, and how long it took.
type PendingBase = (ChainLayout, tokio::task::JoinHandle<Result<(ChainDescriptor, f64), StreamError>>);

/// How the run starts.
enum Start {
    Resume { descriptor: Box<ChainDescriptor>, through: i64 },
    New { previous: Option<Previous>, warning: Option<String> },
}

/// Stream `cluster` until `stop` turns true (or its sender goes away).
pub async fn run(cluster: Cluster, settings: StreamSettings, stop: signal::Receiver<bool>) -> ClusterReport {
    let (_never, lost) = signal::channel(None);
    run_with(cluster, settings, Hooks { stop, lost, metrics: None, spool: None }).await
}

/// [`run`], which `hooks.lost` can also end at once.
pub async fn run_with(cluster: Cluster, settings: StreamSettings, hooks: Hooks) -> ClusterReport {
    let Hooks { mut stop, mut lost, metrics, spool } = hooks;
    let aids = Aids { metrics: metrics.clone(), spool };
    let mut lost_open = true;
    if let Some(m) = &metrics {
        m.start_run();
    }
    let cluster = Arc::new(cluster);
    let settings = Arc::new(settings);
    let mut report = ClusterReport {
        hosted_cluster: format!("{}/{}", cluster.namespace, cluster.hosted_cluster),
        store: cluster.store.url(),
        chains: Vec::new(),
        breaks: Vec::new(),
        moves: Vec::new(),
        warnings: Vec::new(),
        error: None,
        last_durable_revision: None,
        lease_lost: None,
        objects: None,
    };
    let mut tasks: JoinSet<ChainOutcome> = JoinSet::new();
    let mut retiring: Vec<(String, signal::Sender<StopAt>)> = Vec::new();
    let mut current: Option<Current> = None;
    let mut pending: Option<PendingBase> = None;
    let mut base_due: Option<tokio::time::Instant> = None;
    let mut next_previous: Option<Previous> = None;
    let mut base_failures = 0u32;
    let mut stopping = *stop.borrow();

    if let Some(spool) = &aids.spool {
        upload_left(&cluster, spool, &mut report).await;
    }
    match decide(&cluster, &settings).await {
        Err(err) => {
            report.error = Some(err.to_string());
            return report;
        }
        Ok(Start::Resume { descriptor, through }) => {
            tracing::info!("{}: resuming chain {} after revision {through}, its last durable one", report.hosted_cluster, descriptor.chain_id);
            let remaining = settings.base_interval.saturating_sub((Utc::now() - descriptor.base.taken).to_std().unwrap_or_default());
            base_due = Some(tokio::time::Instant::now() + remaining);
            current = Some(spawn_chain(&mut tasks, &cluster, &settings, *descriptor, ChainStart::Resumed { after: through }, through + 1, &aids));
        }
        Ok(Start::New { previous, warning }) => {
            if let Some(warning) = warning {
                tracing::warn!("{}: {warning}", report.hosted_cluster);
                report.warnings.push(warning);
            }
            if !stopping {
                pending = Some(spawn_base(&cluster, &settings, previous.clone()));
            }
            next_previous = previous;
        }
    }

    loop {
        if stopping && tasks.is_empty() && pending.is_none() {
            break;
        }
        let have_pending = pending.is_some();
        let base_wanted = base_due.filter(|_| !have_pending && !stopping);
        tokio::select! {
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                let outcome = match joined {
                    Ok(outcome) => outcome,
                    Err(err) => {
                        report.error.get_or_insert(format!("a chain's task ended abnormally: {err}"));
                        stop_everything(&mut stopping, &mut current, &mut retiring, &mut pending, &cluster).await;
                        continue;
                    }
                };
                let chain_id = outcome.report.chain_id.clone();
                let last = outcome.report.last_durable_revision;
                report.moves.extend(outcome.moves);
                report.warnings.extend(outcome.warnings);
                report.chains.push(outcome.report);
                retiring.retain(|(id, _)| *id != chain_id);
                let is_current = current.as_ref().is_some_and(|c| c.chain_id == chain_id);
                if is_current {
                    current = None;
                }
                match outcome.ended {
                    Ended::Stopped | Ended::HandedOver => {}
                    Ended::Broken(reason) => {
                        if let Some(m) = metrics.as_ref().filter(|_| !outcome.break_counted) {
                            m.breaks.fetch_add(1, Ordering::Relaxed);
                        }
                        tracing::warn!("{}: chain {chain_id} ends at revision {last}: {reason}; taking a new base", report.hosted_cluster);
                        report.breaks.push(Break { chain_id: chain_id.clone(), last_revision: last, reason: reason.clone(), next_chain: None, next_base_revision: None });
                        if is_current {
                            next_previous = Some(Previous { chain_id, last_revision: last, reason });
                            base_due = None;
                            if !stopping && pending.is_none() {
                                pending = Some(spawn_base(&cluster, &settings, next_previous.clone()));
                            }
                        }
                    }
                    Ended::Failed(err) => {
                        report.error.get_or_insert(format!("chain {chain_id}: {err}"));
                        stop_everything(&mut stopping, &mut current, &mut retiring, &mut pending, &cluster).await;
                    }
                }
            }
            joined = join_pending(&mut pending), if have_pending => {
                let layout = pending.take().map(|(layout, _)| layout);
                match joined {
                    Ok((descriptor, seconds)) if !stopping => {
                        base_failures = 0;
                        let base = &descriptor.base;
                        tracing::info!("{}: chain {} started at base revision {} (snapshot of {}, {} stored)", report.hosted_cluster, descriptor.chain_id, base.revision, base.member, crate::space::bytes(base.size));
                        if let Some(open) = report.breaks.iter_mut().rev().find(|b| b.next_chain.is_none()) {
                            open.next_chain = Some(descriptor.chain_id.clone());
                            open.next_base_revision = Some(base.revision);
                            if let Some((from, to)) = open.lost() {
                                let lost = format!("revisions {from}..{to} of {} are in no chain: chain {} ends at {}, chain {} starts at base revision {} ({})", report.hosted_cluster, open.chain_id, open.last_revision, descriptor.chain_id, base.revision, open.reason);
                                tracing::warn!("{lost}");
                                report.warnings.push(lost);
                            }
                        }
                        if let Some(old) = current.take() {
                            // the old chain goes on until it holds the new base's revision
                            let _ = old.stop.send(StopAt::Through(base.revision));
                            retiring.push((old.chain_id, old.stop));
                        }
                        let start = ChainStart::NewBase { stored_bytes: base.size, raw_bytes: base.raw.size, seconds };
                        let from = base.revision + 1;
                        base_due = Some(tokio::time::Instant::now() + settings.base_interval);
                        next_previous = None;
                        if let Some(m) = &metrics {
                            // the base holds everything etcd had when it was taken
                            m.durable_as_of(base.taken);
                        }
                        current = Some(spawn_chain(&mut tasks, &cluster, &settings, descriptor, start, from, &aids));
                    }
                    Ok((descriptor, _)) => {
                        // stopping: a chain with a base and no segment is a chain all the same
                        report.warnings.push(format!("chain {} was started (base revision {}) as the stream stopped: it holds its base only", descriptor.chain_id, descriptor.base.revision));
                    }
                    Err(err) => {
                        base_failures += 1;
                        let message = format!("taking a new base failed: {err}");
                        tracing::warn!("{}: {message}", report.hosted_cluster);
                        report.warnings.push(message);
                        if let Some(layout) = layout {
                            remove_chain(cluster.store.as_ref(), &layout).await;
                        }
                        let wait = if current.is_some() { settings.base_interval.min(Duration::from_secs(300)) } else { crate::duration::backoff(BASE_RETRY, Duration::from_secs(300), base_failures) };
                        base_due = Some(tokio::time::Instant::now() + wait);
                    }
                }
            }
            _ = sleep_until(base_wanted), if base_wanted.is_some() => {
                base_due = None;
                let previous = match current.as_ref() {
                    Some(current) => Some(Previous {
                        chain_id: current.chain_id.clone(),
                        last_revision: current.durable.load(Ordering::Relaxed),
                        reason: format!("base-interval: a new base every {}; chain {} goes on until it holds this base's revision", crate::duration::show(settings.base_interval), current.chain_id),
                    }),
                    // a base tried again after a break
                    None => next_previous.clone(),
                };
                pending = Some(spawn_base(&cluster, &settings, previous));
            }
            changed = stop.changed(), if !stopping => {
                if changed.is_err() || *stop.borrow() {
                    stop_everything(&mut stopping, &mut current, &mut retiring, &mut pending, &cluster).await;
                }
            }
            changed = lost.changed(), if lost_open => {
                let reason = if changed.is_err() { None } else { lost.borrow().clone() };
                lost_open = changed.is_ok();
                if let Some(reason) = reason {
                    // not one more write: every task dropped where it is
                    // (a segment being written is abandoned mid-request)
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    if let Some((_, handle)) = pending.take() {
                        handle.abort();
                        let _ = handle.await;
                    }
                    let through = current.as_ref().map(|c| c.durable.load(Ordering::Relaxed));
                    let message = format!(
                        "{reason}: stopped writing {} at once{}; what was not yet written is left to the stream that holds the Lease",
                        report.hosted_cluster,
                        through.map(|r| format!(" (chain {} durable through revision {r})", current.as_ref().map(|c| c.chain_id.as_str()).unwrap_or("?"))).unwrap_or_default()
                    );
                    tracing::warn!("{message}");
                    report.lease_lost = Some(message);
                    if report.chains.is_empty() {
                        report.last_durable_revision = through;
                    }
                    break;
                }
            }
        }
    }
    if let Some(m) = &metrics {
        m.streaming.store(false, Ordering::Relaxed);
    }
    if report.lease_lost.is_some() && report.chains.is_empty() {
        return report;
    }
    report.last_durable_revision = report.chains.iter().max_by_key(|c| (c.base_revision, c.chain_id.clone())).map(|c| c.last_durable_revision);
    report
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn join_pending(pending: &mut Option<PendingBase>) -> Result<(ChainDescriptor, f64), StreamError> {
    match pending {
        Some((_, handle)) => match handle.await {
            Ok(result) => result,
            Err(err) => Err(StreamError::Base(format!("the task taking it ended abnormally: {err}"))),
        },
        None => std::future::pending().await,
    }
}

/// Tell every chain to write what it holds and end; abandon a base.
async fn stop_everything(
    stopping: &mut bool,
    current: &mut Option<Current>,
    retiring: &mut [(String, signal::Sender<StopAt>)],
    pending: &mut Option<PendingBase>,
    cluster: &Cluster,
) {
    *stopping = true;
    if let Some(current) = current.as_ref() {
        let _ = current.stop.send(StopAt::Now);
    }
    for (_, stop) in retiring.iter() {
        let _ = stop.send(StopAt::Now);
    }
    if let Some((layout, handle)) = pending.take() {
        handle.abort();
        let _ = handle.await;
        remove_chain(cluster.store.as_ref(), &layout).await;
    }
}

/// Remove what an abandoned chain start stored (best effort).
async fn remove_chain(store: &dyn Store, layout: &ChainLayout) {
    if let Ok(objects) = store.list(&format!("{}/", layout.dir())).await {
        for object in objects {
            let _ = store.delete(&object.key).await;
        }
    }
}

/// Upload the segments an earlier run left in the spool, each where it
/// continues its chain's last durable revision; drop (and report) those
/// that cannot continue it any more (the chain is gone, or a gap), and
/// those the store holds already. Runs before [`decide`], so a resumed
/// chain goes on after them. A segment the store still refuses stays for
/// the next run (a resumed chain writes its revisions again meanwhile).
async fn upload_left(cluster: &Cluster, spool: &SpoolSettings, report: &mut ClusterReport) {
    let found = match spool.found(&cluster.namespace, &cluster.hosted_cluster) {
        Ok(found) if found.is_empty() => return,
        Ok(found) => found,
        Err(err) => {
            report.warnings.push(format!("the spool of {} could not be read: {err}", report.hosted_cluster));
            return;
        }
    };
    let chains = match catalog::chains(cluster.store.as_ref(), &cluster.namespace, &cluster.hosted_cluster).await {
        Ok((chains, _)) => chains,
        Err(err) => {
            report.warnings.push(format!("segments left in the spool of {} are not uploaded yet: the store's chains could not be listed ({err})", report.hosted_cluster));
            return;
        }
    };
    for super::spool::Left { chain_id, segments } in found {
        let layout = ChainLayout::new(&cluster.namespace, &cluster.hosted_cluster, &chain_id);
        let Some(listing) = chains.iter().find(|c| c.layout.chain_id == chain_id) else {
            // a chain of another store (a spool directory shared by two
            // streams), or one pruned since: left alone
            let message = format!("chain {chain_id}: segments in the spool ({}) belong to no chain of this store: left there", spool.chain_dir(&layout).display());
            tracing::warn!("{}: {message}", report.hosted_cluster);
            report.warnings.push(message);
            continue;
        };
        let mut through = listing.span().filter(|span| span.problem.is_none()).map(|span| span.through);
        // the revisions of each segment uploaded, and of each dropped
        let mut uploaded: Vec<(i64, i64)> = Vec::new();
        let mut lost: Vec<(i64, i64)> = Vec::new();
        let mut stopped = None;
        for (name, path) in segments {
            if stopped.is_some() {
                break;
            }
            match through {
                Some(t) if name.last <= t => {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                Some(t) if name.first == t + 1 => {}
                _ => {
                    lost.push((name.first, name.last));
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
            }
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(err) => {
                    stopped = Some(format!("reading {}: {err}", path.display()));
                    continue;
                }
            };
            if crate::store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes)) != name.sha256 {
                lost.push((name.first, name.last));
                let _ = std::fs::remove_file(&path);
                through = None;
                continue;
            }
            match super::writer::put_checked(cluster.store.as_ref(), &layout.segment(&name), &bytes, &name.sha256).await {
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                    uploaded.push((name.first, name.last));
                    through = Some(name.last);
                }
                Err(err) => stopped = Some(err),
            }
        }
        let _ = std::fs::remove_dir(spool.chain_dir(&layout));
        if let (Some(first), Some(last)) = (uploaded.first(), uploaded.last()) {
            let message = format!("chain {chain_id}: {} segments an earlier run left in the spool uploaded first (revisions {}..{})", uploaded.len(), first.0, last.1);
            tracing::info!("{}: {message}", report.hosted_cluster);
            report.warnings.push(message);
        }
        if let (Some(first), Some(last)) = (lost.first(), lost.last()) {
            let message = format!(
                "chain {chain_id}: {} segments an earlier run left in the spool (revisions {}..{}) do not continue the chain as the store holds it (they are damaged or after a gap): dropped, those revisions are lost",
                lost.len(),
                first.0,
                last.1
            );
            tracing::warn!("{}: {message}", report.hosted_cluster);
            report.warnings.push(message);
        }
        if let Some(err) = stopped {
            let message = format!("chain {chain_id}: segments left in the spool in {} are not uploaded yet ({err}): the next run tries again", spool.chain_dir(&layout).display());
            tracing::warn!("{}: {message}", report.hosted_cluster);
            report.warnings.push(message);
        }
    }
}

/// Where to start: the newest chain if it can go on, else a new one.
async fn decide(cluster: &Cluster, settings: &StreamSettings) -> Result<Start, StreamError> {
    let (chains, _) = catalog::chains(cluster.store.as_ref(), &cluster.namespace, &cluster.hosted_cluster).await?;
    let Some(newest) = chains.last() else {
        return Ok(Start::New { previous: None, warning: None });
    };
    let id = &newest.layout.chain_id;
    let descriptor = match &newest.descriptor {
        Ok(descriptor) => descriptor.clone(),
        Err(err) => return Ok(Start::New { previous: None, warning: Some(format!("chain {id} cannot be resumed ({err}); a new chain starts")) }),
    };
    let span = catalog::span(descriptor.base.revision, &newest.segments);
    let new = |reason: String, warn: bool| {
        let warning = warn.then(|| format!("chain {id} is not resumed: {reason}; a new chain starts from a new base"));
        Start::New { previous: Some(Previous { chain_id: id.clone(), last_revision: span.through, reason }), warning }
    };
    if let Some(problem) = &span.problem {
        return Ok(new(format!("it runs without a gap only through revision {}: {problem}", span.through), true));
    }
    let mut wanted: Vec<String> = settings.recipients.as_ref().map(Recipients::names).unwrap_or_default();
    let mut has = descriptor.coding.recipients.clone();
    wanted.sort();
    has.sort();
    if wanted != has {
        return Ok(new("it is encrypted to other recipients than --encrypt-to names".into(), true));
    }
    let age = (Utc::now() - descriptor.base.taken).to_std().unwrap_or_default();
    if age >= settings.base_interval {
        return Ok(new(format!("base-interval: its base is {} old (a new base every {})", crate::duration::show(age), crate::duration::show(settings.base_interval)), false));
    }
    Ok(Start::Resume { through: span.through, descriptor: Box::new(descriptor) })
}

/// Take a base for a new chain and write its descriptor, in a task.
fn spawn_base(cluster: &Arc<Cluster>, settings: &Arc<StreamSettings>, previous: Option<Previous>) -> PendingBase {
    let started = Utc::now();
    let layout = ChainLayout::new(&cluster.namespace, &cluster.hosted_cluster, &crate::archive::new_backup_id(started));
    let (cluster, settings, task_layout) = (cluster.clone(), settings.clone(), layout.clone());
    tracing::info!("{}/{}: taking a base for chain {} (nothing is paused)", cluster.namespace, cluster.hosted_cluster, layout.chain_id);
    let handle = tokio::spawn(async move {
        let clock = std::time::Instant::now();
        let label = format!("{}/{}", cluster.namespace, cluster.hosted_cluster);
        let from_backup = match settings.base_from_backup {
            true => match base::from_backup(cluster.source.as_ref(), cluster.store.clone(), &task_layout, settings.recipients.as_ref(), settings.base_interval).await? {
                Ok(base) => {
                    tracing::info!("{label}: chain {} starts from backup {} (revision {}): no snapshot asked of etcd", task_layout.chain_id, base.backup_id.as_deref().unwrap_or("?"), base.revision);
                    Some(base)
                }
                Err(why) => {
                    tracing::info!("{label}: a snapshot for chain {}, not a backup: {why}", task_layout.chain_id);
                    None
                }
            },
            false => None,
        };
        let base = match from_backup {
            Some(base) => base,
            None => base::take(cluster.source.as_ref(), cluster.store.clone(), &task_layout, settings.level, settings.recipients.as_ref()).await?,
        };
        let descriptor = ChainDescriptor {
            format: CHAIN_FORMAT.into(),
            format_version: FORMAT_VERSION,
            chain_id: task_layout.chain_id.clone(),
            namespace: cluster.namespace.clone(),
            hosted_cluster: cluster.hosted_cluster.clone(),
            started,
            base,
            coding: Coding {
                compression: crate::archive::compression::ALGORITHM.into(),
                level: settings.level,
                recipients: settings.recipients.as_ref().map(Recipients::names).unwrap_or_default(),
            },
            previous,
            tool_version: env!("CARGO_PKG_VERSION").into(),
        };
        let bytes = serde_json::to_vec_pretty(&descriptor).map_err(|e| StreamError::Base(format!("writing the descriptor: {e}")))?;
        let key = task_layout.descriptor();
        cluster
            .store
            .put(&key, Box::new(bytes.as_slice()))
            .await
            .map_err(store_error(format!("writing {}{key}", url_slash(cluster.store.as_ref()))))?;
        Ok((descriptor, clock.elapsed().as_secs_f64()))
    });
    (layout, handle)
}

fn spawn_chain(tasks: &mut JoinSet<ChainOutcome>, cluster: &Arc<Cluster>, settings: &Arc<StreamSettings>, descriptor: ChainDescriptor, start: ChainStart, from: i64, aids: &Aids) -> Current {
    let (stop_tx, stop_rx) = signal::channel(StopAt::Running);
    let durable = Arc::new(AtomicI64::new(from - 1));
    let chain_id = descriptor.chain_id.clone();
    tasks.spawn(chain_task(ChainTask { cluster: cluster.clone(), settings: settings.clone(), descriptor, start, from, stop: stop_rx, durable: durable.clone(), aids: aids.clone() }));
    Current { chain_id, stop: stop_tx, durable }
}

/// Write one chain from `task.from` on until told to stop or it cannot go on.
async fn chain_task(mut task: ChainTask) -> ChainOutcome {
    let layout = ChainLayout::new(&task.descriptor.namespace, &task.descriptor.hosted_cluster, &task.descriptor.chain_id);
    let name = format!("{}/{} chain {}", layout.namespace, layout.hosted_cluster, layout.chain_id);
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let watcher = watch::spawn(task.cluster.source.clone(), task.from, task.settings.watch, tx);
    let settings = &task.settings;
    let mut writer = ChainWriter::new(task.cluster.store.clone(), layout.clone(), settings.level, settings.recipients.clone(), settings.cut, task.from - 1);
    if let Some(spool) = &task.aids.spool {
        writer = writer.with_spool(spool.clone());
    }
    let mut moves = Vec::new();
    let mut warnings = Vec::new();
    let mut troubles = 0usize;
    let mut stop_at = *task.stop.borrow();
    let mut out = Output::new(name.clone(), task.durable.clone(), task.aids.metrics.clone());
    let mut caught_up = false;
    let ended = loop {
        if stop_at == StopAt::Now {
            break out.finish(&mut writer, Ended::Stopped).await;
        }
        if let StopAt::Through(through) = stop_at
            && writer.last_pushed() >= through
        {
            break out.finish(&mut writer, Ended::HandedOver).await;
        }
        if out.full.is_some() {
            // nothing more is taken from the watch: the chain ends once its spool is uploaded
            watcher.abort();
            if !writer.spooling() && out.upload.is_none() {
                break out.finish(&mut writer, Ended::Stopped).await;
            }
        }
        let due = writer.due().filter(|_| out.full.is_none()).map(tokio::time::Instant::from_std);
        let retry = out.retry_at.filter(|_| out.upload.is_none() && writer.spooling());
        let report_at = out.report_at.filter(|_| writer.spooling());
        tokio::select! {
            changed = task.stop.changed() => {
                stop_at = if changed.is_err() { StopAt::Now } else { *task.stop.borrow() };
            }
            item = rx.recv(), if out.full.is_none() => match item {
                Some(WatchItem::Revision(record)) => {
                    if let Err(err) = writer.push(&record) {
                        break out.finish(&mut writer, Ended::Failed(err.to_string())).await;
                    }
                    if writer.full()
                        && let Err(err) = out.write(&mut writer).await
                    {
                        break Ended::Failed(err);
                    }
                }
                Some(WatchItem::Moved { from, to, at, reason }) => {
                    match (&from, &reason) {
                        (Some(from), Some(reason)) => tracing::warn!("{name}: watching {to} from revision {at} instead of {from}: {reason}"),
                        _ => tracing::info!("{name}: watching {to} from revision {at}"),
                    }
                    moves.push(Move { chain_id: layout.chain_id.clone(), from, to, at_revision: at, reason });
                }
                Some(WatchItem::Trouble(message)) => {
                    troubles += 1;
                    tracing::warn!("{name}: {message}");
                    if warnings.len() < MAX_WARNINGS {
                        warnings.push(format!("{name}: {message}"));
                    }
                }
                Some(WatchItem::Compacted { next, compact_revision, member }) => {
                    let reason = format!("compacted: etcd ({member}) compacted its history to revision {compact_revision} before the stream had revision {next} (the stream was down or behind for too long)");
                    break out.finish(&mut writer, Ended::Broken(reason)).await;
                }
                Some(WatchItem::Current { at }) => {
                    out.lag.current(&writer, at);
                    // the revisions made while no stream ran (a resume
                    // after a crash or a restart) are older than any
                    // interval: durable as soon as the watch has caught up
                    // with them (etcd answers a progress request only
                    // then), not an interval after they arrived
                    if !caught_up {
                        caught_up = true;
                        if matches!(task.start, ChainStart::Resumed { .. })
                            && writer.due().is_some()
                            && let Err(err) = out.write(&mut writer).await
                        {
                            break Ended::Failed(err);
                        }
                    }
                }
                Some(WatchItem::Gap { expected, got, member }) => {
                    let reason = format!("gap: {member} sent revision {got} where {expected} was due");
                    break out.finish(&mut writer, Ended::Broken(reason)).await;
                }
                None => break out.finish(&mut writer, Ended::Failed("the watch ended without saying why".into())).await,
            },
            _ = sleep_until(due), if due.is_some() => {
                if let Err(err) = out.write(&mut writer).await {
                    break Ended::Failed(err);
                }
            }
            _ = sleep_until(retry), if retry.is_some() => {
                out.retry_at = None;
                out.upload = writer.upload().map(|upload| tokio::spawn(upload.run()));
            }
            done = join_upload(&mut out.upload), if out.upload.is_some() => {
                out.upload = None;
                if let Err(err) = out.uploaded(&mut writer, done) {
                    break Ended::Failed(err);
                }
            }
            _ = sleep_until(report_at), if report_at.is_some() => out.still_spooling(&writer),
        }
    };
    watcher.abort();
    if let Some(upload) = out.upload.take() {
        upload.abort();
    }
    if troubles > warnings.len() {
        warnings.push(format!("{name}: {} more warnings like these", troubles - warnings.len()));
    }
    let ended_text = match &ended {
        Ended::Stopped => "stopped".to_string(),
        Ended::HandedOver => "handed over to the next chain (it holds the next chain's base revision)".to_string(),
        Ended::Broken(reason) => format!("broken: {reason}"),
        Ended::Failed(err) => format!("failed: {err}"),
    };
    ChainOutcome {
        report: ChainReport {
            chain_id: layout.chain_id.clone(),
            start: task.start,
            base_revision: task.descriptor.base.revision,
            base_member: task.descriptor.base.member.clone(),
            written: writer.written().clone(),
            last_durable_revision: writer.last_durable(),
            ended: ended_text,
        },
        moves,
        warnings,
        ended,
        break_counted: out.full.is_some(),
    }
}

async fn join_upload(upload: &mut Option<tokio::task::JoinHandle<Result<Spooled, String>>>) -> Result<Spooled, String> {
    match upload {
        Some(handle) => handle.await.unwrap_or_else(|err| Err(format!("the upload task ended abnormally: {err}"))),
        None => std::future::pending().await,
    }
}

/// How often a spooling chain says how much waits.
const SPOOL_REPORT: Duration = Duration::from_secs(30);

/// Where a chain's writes go once made: the durable revision the cluster's
/// loop reads, the metrics, the log, and the state of its spool.
struct Output {
    name: String,
    durable: Arc<AtomicI64>,
    lag: Lag,
    /// Spooled bytes this chain added to the cluster's gauge.
    gauge: u64,
    /// Since when the store refuses, and what it said last.
    refused: Option<(std::time::Instant, String)>,
    failures: u32,
    /// Segments uploaded from the spool since it started.
    caught_up: u64,
    retry_at: Option<tokio::time::Instant>,
    report_at: Option<tokio::time::Instant>,
    upload: Option<tokio::task::JoinHandle<Result<Spooled, String>>>,
    /// The spool was full: the chain breaks (this reason) once its spool is uploaded.
    full: Option<String>,
}

impl Output {
    fn new(name: String, durable: Arc<AtomicI64>, metrics: Option<Arc<ClusterMetrics>>) -> Output {
        Output { name, durable, lag: Lag { metrics, confirmed: None }, gauge: 0, refused: None, failures: 0, caught_up: 0, retry_at: None, report_at: None, upload: None, full: None }
    }

    /// Seal and write the open segment (to the store or the spool); the
    /// error as the report says it.
    async fn write(&mut self, writer: &mut ChainWriter) -> Result<(), String> {
        let name = self.name.clone();
        let stored_before = writer.written().stored_bytes;
        let flushed = writer.flush().await;
        self.sync_gauge(writer);
        match flushed {
            Ok(Flushed::Nothing) => Ok(()),
            Ok(Flushed::Stored(segment)) => {
                self.durable.store(writer.last_durable(), Ordering::Relaxed);
                self.lag.written(writer.written().stored_bytes.saturating_sub(stored_before), writer.last_durable());
                tracing::info!("{name}: segment {} written ({} revisions through {} durable)", segment.span(), segment.last - segment.first + 1, segment.last);
                Ok(())
            }
            Ok(Flushed::Spooled { name: segment, error: Some(error) }) if self.refused.is_none() => {
                let spool = writer.spool().expect("a spool");
                tracing::warn!(
                    "{name}: the store did not take segment {} ({error}): SPOOLING segments to {} (at most {} for the whole stream) and trying the store again with backoff; revisions after {} are not durable until it answers",
                    segment.span(),
                    spool.dir().display(),
                    crate::space::bytes(spool.settings().limit),
                    writer.last_durable()
                );
                self.spooling_starts(error);
                Ok(())
            }
            Ok(Flushed::Spooled { name: segment, .. }) => {
                tracing::debug!("{name}: segment {} spooled", segment.span());
                Ok(())
            }
            Ok(Flushed::Full { name: segment, error }) => {
                if self.refused.is_none() {
                    self.spooling_starts(error.clone());
                }
                let unreachable = self.refused.as_ref().map(|(since, _)| crate::duration::show(Duration::from_secs(since.elapsed().as_secs()))).unwrap_or_default();
                let spool = writer.spool().expect("a spool");
                let waiting = match spool.span() {
                    Some((first, last)) => format!("; the {} segments spooled before it (revisions {first}..{last}) are uploaded when the store answers, and the chain ends there", spool.len()),
                    None => String::new(),
                };
                let reason = format!(
                    "store unreachable: the store was unreachable for {unreachable}; the spool ({} bytes) is full: segment {} was not kept ({error}), its revisions and those after it are in no chain until a new base{waiting}",
                    spool.settings().limit,
                    segment.span()
                );
                if let Some(m) = &self.lag.metrics {
                    // the break is said now; the chain ends once its spool is uploaded
                    m.breaks.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!("{name}: {reason}");
                self.full = Some(reason);
                Ok(())
            }
            Err(err) => Err(format!("{err}; the last durable revision is {} (a restarted stream resumes after it)", writer.last_durable())),
        }
    }

    fn spooling_starts(&mut self, error: String) {
        self.refused = Some((std::time::Instant::now(), error));
        self.failures = 0;
        self.caught_up = 0;
        let now = tokio::time::Instant::now();
        self.retry_at = Some(now + Duration::from_secs(1));
        self.report_at = Some(now + SPOOL_REPORT);
    }

    /// An upload of the oldest spooled segment ended.
    fn uploaded(&mut self, writer: &mut ChainWriter, done: Result<Spooled, String>) -> Result<(), String> {
        let now = tokio::time::Instant::now();
        match done {
            Ok(segment) => {
                writer.uploaded(&segment).map_err(|e| e.to_string())?;
                self.sync_gauge(writer);
                self.durable.store(writer.last_durable(), Ordering::Relaxed);
                self.lag.written(segment.stored_bytes, writer.last_durable());
                self.failures = 0;
                self.caught_up += 1;
                if writer.spooling() {
                    self.retry_at = Some(now);
                } else {
                    let after = self.refused.take().map(|(since, _)| crate::duration::show(Duration::from_secs(since.elapsed().as_secs()))).unwrap_or_default();
                    tracing::info!(
                        "{}: CAUGHT UP: the store answers again after {after}; {} spooled segments uploaded in order, durable through revision {}",
                        self.name,
                        self.caught_up,
                        writer.last_durable()
                    );
                    self.retry_at = None;
                    self.report_at = None;
                }
            }
            Err(err) => {
                self.failures += 1;
                tracing::debug!("{}: the store still refuses (try {}): {err}", self.name, self.failures);
                if let Some((_, last)) = self.refused.as_mut() {
                    *last = err;
                }
                self.retry_at = Some(now + crate::duration::backoff(Duration::from_secs(1), Duration::from_secs(30), self.failures));
            }
        }
        Ok(())
    }

    fn still_spooling(&mut self, writer: &ChainWriter) {
        self.report_at = Some(tokio::time::Instant::now() + SPOOL_REPORT);
        let Some(spool) = writer.spool() else { return };
        let (first, last) = spool.span().unwrap_or_default();
        let (since, error) = self.refused.clone().map(|(since, e)| (crate::duration::show(Duration::from_secs(since.elapsed().as_secs())), e)).unwrap_or_default();
        tracing::warn!(
            "{}: still spooling: {} in {} segments (revisions {first}..{last}; {} of {} used by the whole stream), the store unreachable for {since}: {error}",
            self.name,
            crate::space::bytes(spool.bytes()),
            spool.len(),
            crate::space::bytes(spool.settings().used()),
            crate::space::bytes(spool.settings().limit)
        );
    }

    fn sync_gauge(&mut self, writer: &ChainWriter) {
        let now = writer.spool().map_or(0, |s| s.bytes());
        if let Some(m) = &self.lag.metrics {
            if now >= self.gauge {
                m.spooled_bytes.fetch_add(now - self.gauge, Ordering::Relaxed);
            } else {
                m.spooled_bytes.fetch_sub(self.gauge - now, Ordering::Relaxed);
            }
        }
        self.gauge = now;
    }

    /// Write what is open, upload what is spooled (for the spool's
    /// `stop_drain`, 20 s by default, at most), then end as `ended`: failed when a write fails or a stop
    /// leaves revisions not durable; broken when the spool was full or a
    /// hand-over leaves revisions in the spool.
    async fn finish(&mut self, writer: &mut ChainWriter, ended: Ended) -> Ended {
        let ended = match (self.full.clone(), ended) {
            (Some(reason), Ended::Stopped | Ended::HandedOver) => Ended::Broken(reason),
            (_, ended) => ended,
        };
        if self.full.is_none()
            && let Err(err) = self.write(writer).await
        {
            return Ended::Failed(err);
        }
        let drain = writer.spool().map_or(Duration::ZERO, |s| s.settings().stop_drain);
        let deadline = tokio::time::Instant::now() + drain;
        while writer.spooling() && tokio::time::Instant::now() < deadline {
            let handle = match self.upload.take() {
                Some(handle) => handle,
                None => {
                    tokio::time::sleep_until(self.retry_at.unwrap_or(deadline).min(deadline)).await;
                    self.retry_at = Some(deadline);
                    match writer.upload() {
                        Some(upload) => tokio::spawn(upload.run()),
                        None => break,
                    }
                }
            };
            let abort = handle.abort_handle();
            let done = match tokio::time::timeout_at(deadline, handle).await {
                Ok(done) => done.unwrap_or_else(|err| Err(format!("the upload task ended abnormally: {err}"))),
                Err(_) => {
                    abort.abort();
                    break;
                }
            };
            if let Err(err) = self.uploaded(writer, done) {
                return Ended::Failed(err);
            }
        }
        let Some(spool) = writer.spool().filter(|s| !s.is_empty()) else {
            return ended;
        };
        let (first, last) = spool.span().unwrap_or_default();
        let left = format!(
            "the store did not take the spool within {}: revisions {first}..{last} are not durable ({} segments, {}); they stay in {} and a restarted stream uploads them first when they continue the chain",
            crate::duration::show(drain),
            spool.len(),
            crate::space::bytes(spool.bytes()),
            spool.dir().display()
        );
        tracing::warn!("{}: {left}", self.name);
        match ended {
            Ended::Stopped => Ended::Failed(left),
            Ended::HandedOver => Ended::Broken(format!("hand-over: {left}")),
            Ended::Broken(reason) if self.full.is_some() => Ended::Failed(format!("{reason}; {left}")),
            Ended::Broken(reason) => Ended::Broken(format!("{reason}; {left}")),
            Ended::Failed(err) => Ended::Failed(format!("{err}; {left}")),
        }
    }
}

impl Drop for Output {
    /// The chain's spooled bytes leave the cluster's gauge with it (an
    /// aborted task too); what stays on disk is the next run's.
    fn drop(&mut self) {
        if let Some(m) = &self.lag.metrics {
            m.spooled_bytes.fetch_sub(self.gauge.min(m.spooled_bytes.load(Ordering::Relaxed)), Ordering::Relaxed);
        }
    }
}

/// The lag metric of a chain: the newest instant the watched member
/// confirmed the stream had everything (through a revision), waiting for
/// that revision to be durable.
struct Lag {
    metrics: Option<Arc<ClusterMetrics>>,
    confirmed: Option<(chrono::DateTime<Utc>, i64)>,
}

impl Lag {
    /// Etcd had nothing past what was handed on at `at`.
    fn current(&mut self, writer: &ChainWriter, at: chrono::DateTime<Utc>) {
        let Some(m) = &self.metrics else { return };
        if writer.last_pushed() == writer.last_durable() {
            m.durable_as_of(at);
        } else {
            self.confirmed = Some((at, writer.last_pushed()));
        }
    }

    /// A segment of `stored_bytes` is durable: the chain is, through `durable`.
    fn written(&mut self, stored_bytes: u64, durable: i64) {
        let Some(m) = &self.metrics else { return };
        m.segment_written(stored_bytes);
        if let Some((at, through)) = self.confirmed
            && through <= durable
        {
            self.confirmed = None;
            m.durable_as_of(at);
        }
    }
}
