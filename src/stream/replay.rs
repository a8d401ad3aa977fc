//! Replaying a chain into a snapshot: every revision after the chain's
//! base up to the one asked for, in revision order, each original
//! revision kept as ONE revision, so what one write transaction changed
//! together stays together and every key gets back its create and mod
//! revisions and its version. Anything that does not follow exactly stops
//! the replay, naming the revision (the trap etcd-backup-restore fell
//! into: a delta replay whose revisions drifted from the original's).
//!
//! Two ways, the same result:
//!
//! - **Directly into the base's database** (the default, `etcd::bolt`):
//!   the base's bbolt file gets the revisions as etcd itself would have
//!   written them (the `key` bucket's entries, leases still used at the
//!   end in the `lease` bucket with the TTL the stream recorded), with no
//!   etcd running. Hundreds of thousands of revisions a second.
//! - **Through a scratch etcd** (`HCP_DR_REPLAY_THROUGH_ETCD=1`, or
//!   [`ScratchTools`] asking for it): the base restored into a scratch etcd
//!   (`etcd::scratch`), each revision applied as one transaction, after
//!   which the scratch etcd must be at exactly that revision. Several
//!   revisions are in flight at once, each guarded so it can only apply
//!   right after the one before ([`Pipeline`]). Keys written with a lease
//!   are written with it: the lease is granted with the recorded TTL and
//!   kept alive while the replay runs; leases no key uses at the end are
//!   revoked. About a thousand revisions a second, bound by etcd's CPU:
//!   the cross-check of the direct way (the tests compare both with the
//!   source) and the way out should the direct one ever refuse a base.
//!
//! Either way the result is checked offline (etcd's trailing hash, the
//! database readable, at exactly the revision) before it is handed over.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use etcd_client::{Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};
use serde::Serialize;

use super::catalog::{self, ChainListing, url_slash};
use super::format::{ChainDescriptor, Event, RevisionRecord, Segment, SegmentName};
use super::{StreamError, base, verify};
use crate::archive::encryption::Identities;
use crate::etcd::scratch::ScratchTools;
use crate::store::{LocalStore, Store};

/// What to replay to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum Target {
    /// Exactly this revision.
    Revision(i64),
    /// The last revision the stream had received at this time.
    Time(DateTime<Utc>),
    /// The newest revision any chain holds durably.
    Latest,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Revision(r) => write!(f, "revision {r}"),
            Target::Time(t) => write!(f, "time {}", t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            Target::Latest => write!(f, "the latest durable revision"),
        }
    }
}

/// The TTL a lease is granted with when the stream could not read its own
/// (it was gone when asked: its keys' deletions follow shortly).
pub const UNKNOWN_TTL: i64 = 60;

/// What the scratch etcd must allow: one original revision can hold more
/// events than etcd's default 128 operations a transaction (a lease's
/// revocation deletes every key it holds at one revision; a range delete
/// is one operation but an event per key), and as much as the hosted
/// etcd's 8 GiB quota.
const SCRATCH_FLAGS: [&str; 6] = ["--max-txn-ops", "1000000", "--max-request-bytes", "67108864", "--quota-backend-bytes", "8589934592"];

/// What a replay did.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// `namespace/name`.
    pub hosted_cluster: String,
    /// What was asked (`revision 1234`, `time 2026-...`).
    pub asked: String,
    pub chain_id: String,
    pub base_revision: i64,
    pub base_member: String,
    /// The revision the snapshot holds.
    pub revision: i64,
    /// When the stream received that revision (the base's time when it is
    /// the base's own).
    pub received: DateTime<Utc>,
    pub segments_read: usize,
    pub revisions_applied: u64,
    pub events_applied: u64,
    /// Revisions sent to the scratch etcd a second time: several are in
    /// flight at once, and one that got there before the revision it
    /// follows was refused by its guard, changing nothing.
    pub revisions_resent: u64,
    /// How the revisions were applied: written directly into the base's
    /// bbolt database (`etcd::bolt`), or, with
    /// `HCP_DR_REPLAY_THROUGH_ETCD=1`, through a scratch etcd and where it
    /// kept its data (in memory, `/dev/shm`, when it had room, else TMPDIR).
    pub scratch: String,
    pub leases_granted: u64,
    /// Leases granted with a default TTL: the stream could not read theirs.
    pub leases_without_ttl: u64,
    /// Leases granted here that no key used at the end, revoked (through
    /// a scratch etcd; written directly, such a lease is never written).
    pub leases_revoked: u64,
    /// The snapshot file, its size and SHA-256.
    pub out: String,
    pub size: u64,
    pub sha256: String,
    pub seconds: f64,
    pub phases: Phases,
}

/// Where a replay's time went.
#[derive(Debug, Clone, Serialize)]
pub struct Phases {
    /// The base read from the store, decompressed (and decrypted), checked
    /// against its recorded digests, written to scratch.
    pub base_seconds: f64,
    /// The segments read and applied, the result's trailing hash (through
    /// a scratch etcd: its start, the transactions, the snapshot).
    pub apply_seconds: f64,
    /// The result checked offline (written directly; through a scratch
    /// etcd the snapshot's check is in `apply_seconds`).
    pub check_seconds: f64,
}

/// Replay the stream of `namespace/hosted_cluster` in `store` to `target`
/// and write the snapshot to `out` (which must not exist). A target no
/// chain covers is refused (`StreamError::Input`) listing the windows
/// that can be restored.
pub async fn replay(
    store: &dyn Store,
    namespace: &str,
    hosted_cluster: &str,
    target: Target,
    out: &Path,
    identities: Option<&Identities>,
    tools: &ScratchTools,
) -> Result<ReplayReport, StreamError> {
    if out.exists() {
        return Err(StreamError::Input(format!("--out {}: the file exists; give a new path (hcp-dr never overwrites a snapshot)", out.display())));
    }
    let (chains, _) = catalog::chains(store, namespace, hosted_cluster).await?;
    let (chain, descriptor) = choose(store, &chains, target, identities).await.map_err(|reason| {
        StreamError::Input(format!(
            "{target} cannot be restored from the stream of {namespace}/{hosted_cluster} in {}: {reason}; the windows that can:\n{}",
            store.url(),
            catalog::describe_windows(&catalog::windows(&chains))
        ))
    })?;
    replay_chain(store, &chain, &descriptor, target, out, identities, tools).await
}

/// Replay `chain` (whose descriptor is `descriptor`) to `target`, which
/// it must hold, into `out`: [`replay`] once the chain is chosen, and
/// `backups verify --deep`, which replays a chain to the next one's base.
pub async fn replay_chain(
    store: &dyn Store,
    chain: &ChainListing,
    descriptor: &ChainDescriptor,
    target: Target,
    out: &Path,
    identities: Option<&Identities>,
    tools: &ScratchTools,
) -> Result<ReplayReport, StreamError> {
    let clock = Instant::now();
    let (namespace, hosted_cluster) = (&chain.layout.namespace, &chain.layout.hosted_cluster);
    if descriptor.encrypted() && identities.is_none() {
        return Err(crate::archive::encryption::EncryptionError::IdentityNeeded { what: format!("chain {}", descriptor.chain_id), recipients: descriptor.coding.recipients.clone() }.into());
    }
    let through = chain.span().map_or(descriptor.base.revision, |s| s.through);
    let scratch = tempfile::Builder::new()
        .prefix("hcp-dr-replay-")
        .tempdir()
        .map_err(|source| StreamError::Io { what: "a scratch folder for the replay (TMPDIR)".into(), source })?;
    crate::space::ensure_scratch(descriptor.base.raw.size.saturating_mul(3), &format!("chain {}'s base and its replay", descriptor.chain_id))
        .map_err(|e| StreamError::Scratch(e.to_string()))?;
    let phase = Instant::now();
    let base_file = scratch.path().join("base.db");
    let mut file = tokio::fs::File::create(&base_file).await.map_err(|source| StreamError::Io { what: base_file.display().to_string(), source })?;
    let read = base::read(store, &chain.layout, descriptor, identities, &mut file).await?;
    drop(file);
    if let Some(mismatch) = read.mismatch(&descriptor.base, &chain.layout.artifact(&descriptor.base.artifact)) {
        return Err(StreamError::Base(format!("{mismatch}; `hcp-dr stream verify` shows what else is damaged")));
    }
    let base_seconds = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    let mut check_seconds = 0.0;
    // through a scratch etcd: the slower path, kept as the cross-check of
    // the direct one (the tests compare both with the source) and as the
    // way out should the direct writer ever refuse a base
    let (applied, (size, sha256), where_) = if tools.replay_through_etcd {
        let in_memory = memory_scratch(descriptor.base.raw.size);
        let data = in_memory.as_ref().map_or_else(|| scratch.path().join("etcd"), |dir| dir.path().join("etcd"));
        let mut etcd = tools.start_restored(&base_file, &data, &SCRATCH_FLAGS).await.map_err(StreamError::Scratch)?;
        let replayed = apply(store, chain, descriptor, target, through, identities, &etcd.client_url).await;
        let result = match replayed {
            Ok(applied) => snapshot(&etcd.client_url, out, applied.revision).await.map(|written| (applied, written)),
            Err(err) => Err(err),
        };
        etcd.stop().await;
        let (applied, written) = result?;
        (applied, written, format!("a scratch etcd in {}", data.parent().unwrap_or(&data).display()))
    } else {
        let (applied, written) = append(store, chain, descriptor, target, through, identities, &base_file).await?;
        move_file(&base_file, out)?;
        let check = Instant::now();
        check_written(out, applied.revision).await?;
        check_seconds = check.elapsed().as_secs_f64();
        (applied, written, "written directly into the base's database".to_string())
    };
    Ok(ReplayReport {
        hosted_cluster: format!("{namespace}/{hosted_cluster}"),
        asked: target.to_string(),
        chain_id: descriptor.chain_id.clone(),
        base_revision: descriptor.base.revision,
        base_member: descriptor.base.member.clone(),
        revision: applied.revision,
        received: applied.received.unwrap_or(descriptor.base.taken),
        segments_read: applied.segments,
        revisions_applied: applied.revisions,
        events_applied: applied.events,
        revisions_resent: applied.resent,
        scratch: where_,
        leases_granted: applied.leases.granted,
        leases_without_ttl: applied.leases.without_ttl,
        leases_revoked: applied.leases.revoked,
        out: out.display().to_string(),
        size,
        sha256,
        seconds: clock.elapsed().as_secs_f64(),
        phases: Phases { base_seconds, apply_seconds: phase.elapsed().as_secs_f64() - check_seconds, check_seconds },
    })
}

/// Where memory-backed scratch space is (tmpfs on Linux).
const MEMORY_SCRATCH: &str = "/dev/shm";

/// A private folder in memory for the scratch etcd's data when
/// `/dev/shm` is a tmpfs with room for it: the base restored and what the
/// replay adds (estimated as three times the base, plus 256 MiB) using at
/// most half of what is free there. The scratch etcd syncs its log after
/// every batch of transactions; in memory that costs nothing, and the
/// result is snapshotted and checked before it leaves. `None`: TMPDIR.
fn memory_scratch(base_size: u64) -> Option<tempfile::TempDir> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let stat = rustix::fs::statfs(MEMORY_SCRATCH).ok()?;
    if stat.f_type as u64 != TMPFS_MAGIC {
        return None;
    }
    let needed = base_size.saturating_mul(3).saturating_add(256 << 20);
    let free = crate::space::free(Path::new(MEMORY_SCRATCH)).ok()?;
    if needed > free / 2 {
        return None;
    }
    tempfile::Builder::new().prefix("hcp-dr-replay-").tempdir_in(MEMORY_SCRATCH).ok()
}

/// The chain to replay for `target`: for a revision, the one with the
/// newest base among those whose window holds it; for a time, the one with
/// the newest base taken at or before it whose segments reach it; for the
/// latest, the one reaching furthest.
async fn choose(store: &dyn Store, chains: &[ChainListing], target: Target, identities: Option<&Identities>) -> Result<(ChainListing, ChainDescriptor), String> {
    let readable = chains.iter().filter_map(|c| Some((c, c.descriptor.as_ref().ok()?, c.span()?)));
    match target {
        Target::Latest => readable
            .max_by_key(|(c, d, span)| (span.through, d.base.revision, c.layout.chain_id.clone()))
            .map(|(c, d, _)| (c.clone(), d.clone()))
            .ok_or_else(|| "no chain".to_string()),
        Target::Revision(revision) => readable
            .filter(|(_, _, span)| span.base <= revision && revision <= span.through)
            .max_by_key(|(c, d, _)| (d.base.revision, c.layout.chain_id.clone()))
            .map(|(c, d, _)| (c.clone(), d.clone()))
            .ok_or_else(|| "no chain holds it (a base at or before it and segments reaching it without a gap)".to_string()),
        Target::Time(at) => {
            let mut candidates: Vec<_> = readable.filter(|(_, d, _)| d.base.taken <= at).collect();
            candidates.sort_by_key(|(c, d, _)| std::cmp::Reverse((d.base.taken, c.layout.chain_id.clone())));
            let mut newest_record = None;
            for (chain, descriptor, span) in candidates {
                let reaches = match chain.segments.iter().take(span.segments).next_back() {
                    Some(last) => last_received(store, chain, descriptor, last, identities).await.map_err(|e| e.to_string())?,
                    None => descriptor.base.taken,
                };
                if at <= reaches {
                    return Ok((chain.clone(), descriptor.clone()));
                }
                newest_record = newest_record.max(Some(reaches));
            }
            Err(match newest_record {
                Some(last) => format!(
                    "the stream's newest record was received at {} (it stopped, or nothing was written since: a time after it cannot be proven)",
                    last.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                ),
                None => "no chain's base was taken at or before it".into(),
            })
        }
    }
}

/// When the stream received the last revision of segment `name`.
async fn last_received(store: &dyn Store, chain: &ChainListing, descriptor: &ChainDescriptor, name: &SegmentName, identities: Option<&Identities>) -> Result<DateTime<Utc>, StreamError> {
    let segment = fetch(store, chain, descriptor, name, identities).await?;
    Ok(segment.header.last_received)
}

/// A segment read, checked against its name and decoded.
async fn fetch(store: &dyn Store, chain: &ChainListing, descriptor: &ChainDescriptor, name: &SegmentName, identities: Option<&Identities>) -> Result<Segment, StreamError> {
    let key = chain.layout.segment(name);
    let stored = crate::store::get_bytes(store, &key)
        .await
        .map_err(super::store_error(format!("reading {}{key}", url_slash(store))))?
        .ok_or_else(|| StreamError::Input(format!("segment {key} is listed but gone: `hcp-dr stream verify` shows up to which revision the chain restores")))?;
    // a damaged segment stops the replay where the chain stops restoring
    let read = verify::read_segment(&stored, chain, descriptor, name, identities).await.map_err(|err| match err {
        StreamError::Format(bad) => StreamError::Replay {
            chain: descriptor.chain_id.clone(),
            revision: name.first - 1,
            reason: format!(
                "{bad}; the chain restores through revision {} only: ask for that revision or an earlier one (`hcp-dr stream verify` names what else is damaged)",
                name.first - 1
            ),
        },
        other => other,
    })?;
    match read {
        Some(segment) => Ok(segment),
        None => Err(StreamError::Input(format!("chain {} is encrypted: pass --identity FILE", descriptor.chain_id))),
    }
}

/// Whether `record` is at or before `target`.
fn wanted(target: Target, record: &RevisionRecord) -> bool {
    match target {
        Target::Revision(r) => record.revision <= r,
        Target::Time(t) => record.received <= t,
        Target::Latest => true,
    }
}

/// Records travelling to the thread that appends them.
const APPEND_QUEUE: usize = 4096;

/// Apply the chain's revisions after its base up to `target` (at most
/// `through`) directly to the base's database `base` (`etcd::bolt`):
/// segments are fetched and decoded here, while a thread of its own
/// appends, so reading the store and writing the file overlap. Every
/// revision must follow the one before exactly (the appender refuses
/// anything else, naming the revision).
/// Returns what was applied, and the file's size and SHA-256.
async fn append(store: &dyn Store, chain: &ChainListing, descriptor: &ChainDescriptor, target: Target, through: i64, identities: Option<&Identities>, base: &Path) -> Result<(Applied, (u64, String)), StreamError> {
    // its bytes were just checked against the chain's recorded digest
    let mut appender = crate::etcd::bolt::Appender::open_checked_elsewhere(base).map_err(|e| StreamError::Base(e.to_string()))?;
    if appender.revision() != descriptor.base.revision {
        return Err(StreamError::Base(format!("the base holds revision {}, not the {} chain {} records", appender.revision(), descriptor.base.revision, descriptor.chain_id)));
    }
    let chain_id = descriptor.chain_id.clone();
    let (records, received) = std::sync::mpsc::sync_channel::<RevisionRecord>(APPEND_QUEUE);
    let writer = std::thread::spawn(move || -> Result<(crate::etcd::bolt::Finished, Option<DateTime<Utc>>, u64, u64), StreamError> {
        let (mut last, mut revisions, mut events) = (None, 0u64, 0u64);
        for record in received {
            appender.push(&record).map_err(|e| match e {
                crate::etcd::bolt::AppendError::Record { revision, reason, .. } => StreamError::Replay {
                    chain: chain_id.clone(),
                    revision,
                    reason: format!("{reason}: the chain does not replay onto its base (a write is missing from the chain, or the base is not the state before it); nothing after revision {} can be restored from this chain", revision - 1),
                },
                other => StreamError::Scratch(other.to_string()),
            })?;
            revisions += 1;
            events += record.events.len() as u64;
            last = Some(record.received);
        }
        let finished = appender.finish().map_err(|e| StreamError::Scratch(e.to_string()))?;
        Ok((finished, last, revisions, events))
    });
    let mut segments = 0;
    let sent: Result<(), StreamError> = async {
        'segments: for name in chain.segments.iter().filter(|s| s.last <= through) {
            if let Target::Revision(r) = target
                && name.first > r
            {
                break;
            }
            let segment = fetch(store, chain, descriptor, name, identities).await?;
            segments += 1;
            for record in segment.records {
                if !wanted(target, &record) {
                    break 'segments;
                }
                if records.send(record).is_err() {
                    // the writer stopped: its error says why
                    break 'segments;
                }
            }
        }
        Ok(())
    }
    .await;
    drop(records);
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| StreamError::Scratch(format!("the appending thread: {e}")))?
        .map_err(|_| StreamError::Scratch("the appending thread panicked".into()))?;
    // a fetch that failed after the writer had everything it was sent: the fetch's error
    sent?;
    let (finished, received, revisions, events) = written?;
    if let Target::Revision(r) = target
        && finished.revision != r
    {
        return Err(StreamError::Replay { chain: descriptor.chain_id.clone(), revision: finished.revision, reason: format!("the chain's segments end before revision {r}") });
    }
    let applied = Applied {
        revision: finished.revision,
        received,
        segments,
        revisions,
        events,
        resent: 0,
        leases: LeaseCounts { granted: finished.leases_added, without_ttl: finished.leases_without_ttl, revoked: 0 },
    };
    Ok((applied, (finished.size, finished.sha256)))
}

/// Move `from` to `to` (copied then removed across file systems).
fn move_file(from: &Path, to: &Path) -> Result<(), StreamError> {
    let io = |source| StreamError::Io { what: format!("moving the replayed snapshot to {}", to.display()), source };
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(err) if err.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error()) => {
            std::fs::copy(from, to).map_err(io)?;
            std::fs::remove_file(from).map_err(io)
        }
        Err(err) => Err(io(err)),
    }
}

/// What the replay applied.
struct Applied {
    revision: i64,
    received: Option<DateTime<Utc>>,
    segments: usize,
    revisions: u64,
    events: u64,
    resent: u64,
    leases: LeaseCounts,
}

#[derive(Default)]
struct LeaseCounts {
    granted: u64,
    without_ttl: u64,
    revoked: u64,
}

fn scratch_error(what: &'static str) -> impl Fn(etcd_client::Error) -> StreamError {
    move |err| StreamError::Scratch(format!("{what}: {err}"))
}

/// Apply the chain's revisions after its base up to `target` (at most
/// `through`, where its segments stop) to the scratch etcd at `url`.
async fn apply(store: &dyn Store, chain: &ChainListing, descriptor: &ChainDescriptor, target: Target, through: i64, identities: Option<&Identities>, url: &str) -> Result<Applied, StreamError> {
    let mut client = Client::connect([url], None).await.map_err(scratch_error("connecting"))?;
    let at = client.status().await.map_err(scratch_error("status"))?.header().map(|h| h.revision()).unwrap_or_default();
    if at != descriptor.base.revision {
        return Err(StreamError::Scratch(format!("the base restored to revision {at}, not the {} chain {} records", descriptor.base.revision, descriptor.chain_id)));
    }
    let mut leases = Leases::adopt(&mut client).await?;
    let mut applied = Applied { revision: at, received: None, segments: 0, revisions: 0, events: 0, resent: 0, leases: LeaseCounts::default() };
    let mut pipeline = Pipeline::new(client.clone(), &descriptor.chain_id, at);
    'segments: for name in chain.segments.iter().filter(|s| s.last <= through) {
        if let Target::Revision(r) = target
            && name.first > r
        {
            break;
        }
        let segment = fetch(store, chain, descriptor, name, identities).await?;
        applied.segments += 1;
        for record in segment.records {
            if !wanted(target, &record) {
                break 'segments;
            }
            leases.check()?;
            leases.grant_for(&mut client, &record, &descriptor.chain_id, &mut applied.leases).await?;
            pipeline.push(record).await?;
        }
    }
    pipeline.finish().await?;
    applied.revision = pipeline.at;
    applied.received = pipeline.received;
    applied.revisions = pipeline.revisions;
    applied.events = pipeline.events;
    applied.resent = pipeline.resent;
    drop(pipeline);
    if let Target::Revision(r) = target
        && applied.revision != r
    {
        return Err(StreamError::Replay { chain: descriptor.chain_id.clone(), revision: applied.revision, reason: format!("the chain's segments end before revision {r}") });
    }
    leases.check()?;
    applied.leases.revoked = leases.revoke_unused(&mut client).await?;
    drop(leases);
    let at = client.status().await.map_err(scratch_error("status"))?.header().map(|h| h.revision()).unwrap_or_default();
    if at != applied.revision {
        return Err(StreamError::Replay { chain: descriptor.chain_id.clone(), revision: applied.revision, reason: format!("the scratch etcd ended at revision {at}") });
    }
    Ok(applied)
}

/// How many original revisions may be in flight on the scratch etcd at
/// once, at most. Waiting for each transaction before sending the next
/// costs a round trip and a WAL fsync per revision; with several in
/// flight, raft commits them together with one. But etcd serves each
/// request on a goroutine of its own, and two sent together reach raft in
/// either order: with 2 to 64 sent at once and nothing between them, 50
/// to 75% overtook their predecessor and had to be sent again (slower
/// than one at a time). So the window starts at one, grows by one after
/// as many revisions applied in a row as it holds, up to 2 (4 sent
/// again 20% of revisions; 2, 3-4%), and halves when a revision overtook
/// its predecessor; and sends are spaced by [`SEND_GAP`]. On a 2-core
/// machine etcd's CPU per transaction, not its fsync, bounds a replay:
/// see docs/performance.md.
const WINDOW: usize = 2;
const FIRST_WINDOW: usize = 1;

/// The least time between two sends: enough for etcd to have taken the
/// first into raft before the second arrives (measured: 200 us brought
/// the revisions sent again from 48% to 1-4% with two in flight), far
/// less than a round trip.
const SEND_GAP: Duration = Duration::from_micros(200);

type Answer = Result<etcd_client::TxnResponse, etcd_client::Error>;

/// A transaction to send, how long to hold it first (test hook), and
/// where its answer goes.
type Request = (Txn, Duration, tokio::sync::oneshot::Sender<Answer>);

/// Sends transactions to the scratch etcd in the order given, without
/// waiting for one answer before sending the next (all on one task, so
/// they leave in that order); each answer goes back on its own channel.
fn sender(client: Client) -> (tokio::sync::mpsc::UnboundedSender<Request>, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    let (to_send, mut requests) = tokio::sync::mpsc::unbounded_channel::<Request>();
    let task = tokio::spawn(async move {
        let mut in_flight = futures::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                biased;
                request = requests.recv() => match request {
                    Some((txn, delay, answer)) => {
                        let mut client = client.clone();
                        let mut request = Box::pin(async move {
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            let _ = answer.send(client.txn(txn).await);
                        });
                        if futures::poll!(&mut request).is_pending() {
                            in_flight.push(request);
                        }
                        // finer than tokio's timer (1 ms); a thread of the blocking pool sleeps
                        let _ = tokio::task::spawn_blocking(|| std::thread::sleep(SEND_GAP)).await;
                    }
                    None => break,
                },
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            }
        }
        while in_flight.next().await.is_some() {}
    });
    (to_send, task)
}

/// One original revision sent to the scratch etcd, its answer to come.
struct Sent {
    record: RevisionRecord,
    /// The first key it puts (the next revision's guard), if any.
    puts: Option<Vec<u8>>,
    answer: tokio::sync::oneshot::Receiver<Answer>,
}

/// What became of a revision sent.
enum Outcome {
    Applied,
    /// Its guard did not hold: it reached the scratch etcd before its
    /// predecessor was applied, and changed nothing.
    TooEarly(Sent),
}

/// The original revisions on their way into the scratch etcd, several in
/// flight at once, each applied as one transaction at exactly its own
/// revision and never twice.
///
/// A revision whose predecessor put a key K is sent guarded by
/// `mod_revision(K) == predecessor`: K was last written at the
/// predecessor's revision, which holds only while the scratch etcd is at
/// that revision (the replay writes nothing else, each revision is sent
/// once a pass, and a later revision needs this one applied first). A
/// revision whose predecessor only deleted keys has no such guard: it is
/// sent alone, once everything before it is applied. Answers are taken in
/// the order sent: a guard that did not hold (a revision that overtook its
/// predecessor on the way) stops sending; everything still in flight is
/// awaited, the scratch etcd's revision read, and the pass starts again
/// from the first revision not applied. Every revision applied must leave
/// the scratch etcd at exactly that revision.
struct Pipeline {
    client: Client,
    to_send: tokio::sync::mpsc::UnboundedSender<Request>,
    sender: tokio::task::JoinHandle<()>,
    /// How many may be in flight now (see [`WINDOW`]), and the revisions
    /// applied in a row at that size.
    window: usize,
    in_a_row: usize,
    chain: String,
    /// Pushed, not yet sent (or to be sent again), in order.
    waiting: VecDeque<(RevisionRecord, bool)>,
    in_flight: VecDeque<Sent>,
    /// The newest revision sent and the first key it put (`None`: it only
    /// deleted, or is the base).
    sent_last: (i64, Option<Vec<u8>>),
    /// The same for the newest revision applied.
    applied_last: (i64, Option<Vec<u8>>),
    /// The revision the scratch etcd is at: every revision up to it applied.
    at: i64,
    received: Option<DateTime<Utc>>,
    revisions: u64,
    events: u64,
    /// Revisions sent again after overtaking their predecessor.
    resent: u64,
    /// Test hook: delay first sends so that revisions overtake each other.
    overtake: u64,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.sender.abort();
    }
}

impl Pipeline {
    fn new(client: Client, chain: &str, at: i64) -> Pipeline {
        let (to_send, sender) = sender(client.clone());
        Pipeline {
            client,
            to_send,
            sender,
            window: FIRST_WINDOW,
            in_a_row: 0,
            chain: chain.to_string(),
            waiting: VecDeque::new(),
            in_flight: VecDeque::new(),
            sent_last: (at, None),
            applied_last: (at, None),
            at,
            received: None,
            revisions: 0,
            events: 0,
            resent: 0,
            overtake: test_hooks::replay_overtake(),
        }
    }

    fn failed(&self, revision: i64) -> impl Fn(String) -> StreamError + '_ {
        move |reason| StreamError::Replay { chain: self.chain.clone(), revision, reason }
    }

    /// Take the next revision (it must follow the one pushed before);
    /// returns once there is room for another.
    async fn push(&mut self, record: RevisionRecord) -> Result<(), StreamError> {
        self.waiting.push_back((record, false));
        self.pump(false).await
    }

    /// Apply everything pushed; returns once it is applied.
    async fn finish(&mut self) -> Result<(), StreamError> {
        self.pump(true).await
    }

    async fn pump(&mut self, all: bool) -> Result<(), StreamError> {
        loop {
            while let Some((record, _)) = self.waiting.front() {
                let guard = match &self.sent_last {
                    (revision, Some(key)) if *revision == record.revision - 1 => Some(key.clone()),
                    _ => None,
                };
                if self.in_flight.len() >= self.window || (guard.is_none() && !self.in_flight.is_empty()) {
                    break;
                }
                let Some((record, again)) = self.waiting.pop_front() else { break };
                self.send(record, guard, again);
            }
            let room = self.waiting.is_empty() && self.in_flight.len() < self.window;
            if self.in_flight.is_empty() || (room && !all) {
                return Ok(());
            }
            if let Outcome::TooEarly(sent) = self.settle_front().await? {
                self.start_again(sent).await?;
            }
        }
    }

    fn send(&mut self, record: RevisionRecord, guard: Option<Vec<u8>>, again: bool) {
        let ops: Vec<TxnOp> = record
            .events
            .iter()
            .map(|event| match event {
                Event::Put { key, value, lease, .. } => TxnOp::put(key.0.clone(), value.0.clone(), (*lease != 0).then(|| PutOptions::new().with_lease(*lease))),
                Event::Delete { key } => TxnOp::delete(key.0.clone(), None),
            })
            .collect();
        let predecessor = record.revision - 1;
        let txn = match guard {
            Some(key) => Txn::new().when([Compare::mod_revision(key, CompareOp::Equal, predecessor)]).and_then(ops),
            None => Txn::new().and_then(ops),
        };
        let puts = record.events.iter().find_map(|e| matches!(e, Event::Put { .. }).then(|| e.key().to_vec()));
        self.sent_last = (record.revision, puts.clone());
        let delay = match (self.overtake, again) {
            (0, _) | (_, true) => Duration::ZERO,
            (n, false) => Duration::from_millis(5 * (n - 1 - record.revision.rem_euclid(n as i64) as u64)),
        };
        let (answered, answer) = tokio::sync::oneshot::channel();
        // the task ends only when the pipeline is dropped
        let _ = self.to_send.send((txn, delay, answered));
        self.in_flight.push_back(Sent { record, puts, answer });
    }

    /// Await the oldest revision in flight.
    async fn settle_front(&mut self) -> Result<Outcome, StreamError> {
        let Some(mut sent) = self.in_flight.pop_front() else { return Ok(Outcome::Applied) };
        let revision = sent.record.revision;
        let events = sent.record.events.len();
        let answer = (&mut sent.answer).await.map_err(|e| self.failed(revision)(format!("its transaction was lost: {e}")))?;
        let response = answer.map_err(|e| self.failed(revision)(format!("the transaction of its {events} events was refused: {e}")))?;
        let at = response.header().map(|h| h.revision()).unwrap_or_default();
        if !response.succeeded() {
            return Ok(Outcome::TooEarly(sent));
        }
        if at != revision || self.at != revision - 1 {
            return Err(self.failed(revision)(format!(
                "after applying it the scratch etcd is at revision {at}, not {revision}: the chain does not replay onto its base (a write is missing from the chain, or the base is not the state before it); nothing after revision {} can be restored from this chain",
                revision - 1
            )));
        }
        self.at = revision;
        self.received = Some(sent.record.received);
        self.revisions += 1;
        self.events += events as u64;
        self.applied_last = (revision, sent.puts);
        self.in_a_row += 1;
        if self.in_a_row >= self.window {
            self.window = (self.window + 1).min(WINDOW);
            self.in_a_row = 0;
        }
        Ok(Outcome::Applied)
    }

    /// `first` arrived before its predecessor was applied: await what is
    /// still in flight (none of it can apply: each needs `first` applied),
    /// check where the scratch etcd is, and queue everything not applied
    /// to be sent again, in order.
    async fn start_again(&mut self, first: Sent) -> Result<(), StreamError> {
        let mut again = vec![first.record];
        while !self.in_flight.is_empty() {
            match self.settle_front().await? {
                Outcome::TooEarly(sent) => again.push(sent.record),
                Outcome::Applied => {
                    return Err(self.failed(self.at)("it was applied although the revision before it was not: the scratch etcd is not what the replay wrote".into()));
                }
            }
        }
        let at = self.client.status().await.map_err(scratch_error("status"))?.header().map(|h| h.revision()).unwrap_or_default();
        if at != self.at {
            return Err(self.failed(self.at + 1)(format!("after a revision overtook its predecessor the scratch etcd is at revision {at}, not {}: something else wrote to it", self.at)));
        }
        self.resent += again.len() as u64;
        self.window = (self.window / 2).max(1);
        self.in_a_row = 0;
        for record in again.into_iter().rev() {
            self.waiting.push_front((record, true));
        }
        self.sent_last = self.applied_last.clone();
        Ok(())
    }
}

/// Hooks for the replay's tests, compiled in only with the cargo feature
/// `test-hooks` (as `pipeline::runner`'s): they only make the replay take
/// its slower path, never change what it writes.
#[cfg(feature = "test-hooks")]
mod test_hooks {
    /// `HCP_DR_TEST_REPLAY_OVERTAKE=<n>`: in every run of n revisions, the
    /// first send of each is delayed so that later ones reach the scratch
    /// etcd first (their guards fail and they are sent again).
    pub fn replay_overtake() -> u64 {
        std::env::var("HCP_DR_TEST_REPLAY_OVERTAKE").ok().and_then(|n| n.parse().ok()).filter(|n| *n > 1).unwrap_or(0)
    }
}

#[cfg(not(feature = "test-hooks"))]
mod test_hooks {
    pub fn replay_overtake() -> u64 {
        0
    }
}

/// The leases of the scratch etcd (id and TTL), kept alive by a task of
/// its own while the replay runs, whatever each step costs (a slow
/// segment fetch must not let a lease expire and delete its keys at a
/// revision of its own).
struct Leases {
    ttls: Arc<Mutex<HashMap<i64, i64>>>,
    /// Granted by the replay (not from the base).
    here: Vec<i64>,
    /// Why the keeper stopped, when it did.
    failure: Arc<Mutex<Option<String>>>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// How often the keeper looks for leases due.
const KEEPER_TICK: Duration = Duration::from_millis(500);

impl Leases {
    /// The leases the base holds, with their TTLs; their clock started
    /// when the scratch etcd did (it refreshes every lease as it starts).
    async fn adopt(client: &mut Client) -> Result<Leases, StreamError> {
        let started = Instant::now();
        let listed = client.leases().await.map_err(scratch_error("listing the base's leases"))?;
        let mut ttls = HashMap::new();
        for lease in listed.leases() {
            let ttl = client.lease_time_to_live(lease.id(), None).await.map_err(scratch_error("reading a lease's TTL"))?.granted_ttl();
            ttls.insert(lease.id(), ttl);
        }
        let ttls = Arc::new(Mutex::new(ttls));
        let failure = Arc::new(Mutex::new(None));
        let keeper = tokio::spawn(keep_alive(client.clone(), ttls.clone(), failure.clone(), started));
        Ok(Leases { ttls, here: Vec::new(), failure, keeper })
    }

    fn known(&self, id: i64) -> bool {
        self.ttls.lock().is_ok_and(|t| t.contains_key(&id))
    }

    /// Fails when the keeper could not keep a lease alive.
    fn check(&self) -> Result<(), StreamError> {
        match self.failure.lock().ok().and_then(|f| f.clone()) {
            Some(failure) => Err(StreamError::Scratch(failure)),
            None => Ok(()),
        }
    }

    /// Grant the leases `record`'s puts use that the scratch etcd lacks.
    async fn grant_for(&mut self, client: &mut Client, record: &RevisionRecord, chain: &str, counts: &mut LeaseCounts) -> Result<(), StreamError> {
        for event in &record.events {
            let Event::Put { lease, .. } = event else { continue };
            if *lease == 0 || self.known(*lease) {
                continue;
            }
            let recorded = record.leases.iter().find(|l| l.id == *lease).and_then(|l| l.ttl);
            let ttl = recorded.unwrap_or(UNKNOWN_TTL);
            client
                .lease_grant(ttl, Some(etcd_client::LeaseGrantOptions::new().with_id(*lease)))
                .await
                .map_err(|e| StreamError::Replay { chain: chain.to_string(), revision: record.revision, reason: format!("granting lease {lease:x} (TTL {ttl}s): {e}") })?;
            counts.granted += 1;
            counts.without_ttl += u64::from(recorded.is_none());
            if let Ok(mut ttls) = self.ttls.lock() {
                ttls.insert(*lease, ttl);
            }
            self.here.push(*lease);
        }
        Ok(())
    }

    /// Revoke the leases granted here that hold no key at the end (the
    /// source revoked them: their keys' deletions were replayed). A
    /// lease with no key deletes nothing: no revision is made.
    async fn revoke_unused(&mut self, client: &mut Client) -> Result<u64, StreamError> {
        let mut revoked = 0;
        for id in &self.here {
            let alive = client.lease_time_to_live(*id, Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys())).await.map_err(scratch_error("reading a lease's keys"))?;
            if alive.ttl() >= 0 && alive.keys().is_empty() {
                client.lease_revoke(*id).await.map_err(scratch_error("revoking an unused lease"))?;
                revoked += 1;
            }
        }
        Ok(revoked)
    }
}

/// Refresh every lease of `ttls` a third of its TTL after its last
/// refresh (a lease first seen counts from then; those of the base from
/// `started`), until aborted or a refresh fails (said in `failure`).
async fn keep_alive(client: Client, ttls: Arc<Mutex<HashMap<i64, i64>>>, failure: Arc<Mutex<Option<String>>>, started: Instant) {
    let mut kept: HashMap<i64, (Instant, Option<(LeaseKeeper, LeaseKeepAliveStream)>)> = HashMap::new();
    let mut first = true;
    loop {
        tokio::time::sleep(KEEPER_TICK).await;
        let due: Vec<(i64, i64)> = match ttls.lock() {
            Ok(ttls) => ttls.iter().map(|(id, ttl)| (*id, *ttl)).collect(),
            Err(_) => return,
        };
        for (id, ttl) in due {
            let since = if first { started } else { Instant::now() };
            let (refreshed, stream) = kept.entry(id).or_insert((since, None));
            if refreshed.elapsed() < Duration::from_secs((ttl.max(3) / 3) as u64) {
                continue;
            }
            let refresh = async {
                if stream.is_none() {
                    *stream = Some(client.clone().lease_keep_alive(id).await?);
                }
                let Some((keeper, answers)) = stream.as_mut() else { return Ok(None) };
                keeper.keep_alive().await?;
                answers.message().await
            };
            match tokio::time::timeout(Duration::from_secs(5), refresh).await {
                Ok(Ok(Some(_))) => *refreshed = Instant::now(),
                other => {
                    let why = match other {
                        Ok(Err(err)) => err.to_string(),
                        Ok(Ok(None)) => "the keep-alive stream ended".into(),
                        _ => "no answer within 5s".into(),
                    };
                    if let Ok(mut failure) = failure.lock() {
                        *failure = Some(format!("keeping lease {id:x} alive: {why}"));
                    }
                    return;
                }
            }
        }
        first = false;
    }
}

/// Snapshot the scratch etcd into `out` (etcd's trailing hash checked,
/// then the file verified offline: it must hold `revision`); its size and
/// SHA-256.
async fn snapshot(url: &str, out: &Path, revision: i64) -> Result<(u64, String), StreamError> {
    let (dir, file) = match (out.parent(), out.file_name()) {
        (Some(dir), Some(file)) => (if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir.to_path_buf() }, file.to_string_lossy().to_string()),
        _ => return Err(StreamError::Input(format!("--out {}: not a file path", out.display()))),
    };
    let member = crate::etcd::Member { name: "scratch".into(), url: url.to_string(), tls: None };
    let written = member.snapshot_to(&LocalStore::new(&dir), &file).await?;
    check_written(out, revision).await?;
    Ok((written.size, written.sha256))
}

/// Check the snapshot written at `out` offline (etcd's trailing hash, the
/// database readable, at exactly `revision`), removing it when it does not
/// check.
async fn check_written(out: &Path, revision: i64) -> Result<(), StreamError> {
    let report = crate::etcd::verify::verify_copy(out).await.map_err(|e| StreamError::Scratch(format!("checking {}: {e}", out.display())))?;
    let holds = report.summary.as_ref().map(|s| s.store_revision());
    if !report.is_ok() || holds != Some(revision) {
        let _ = std::fs::remove_file(out);
        return Err(StreamError::Scratch(format!(
            "the snapshot written does not check: {} at revision {} (expected {revision}); it was removed",
            report.verdict,
            holds.map_or("(unreadable)".into(), |r| r.to_string())
        )));
    }
    Ok(())
}
