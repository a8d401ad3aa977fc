//! `hcp-dr backups list|describe|verify|prune`: the backup catalogue of a
//! store, read from the store itself (there is no other record). A backup
//! is complete when its manifest (written last) is there and parses;
//! anything else is shown as incomplete, never as good.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OpsError;
use super::object_lock::{self, LockState, StoreLocking};
use crate::archive::check::{CheckError, Inspect, check_backup_inspecting, read_manifest};
use crate::archive::encryption::Identities;
use crate::archive::results::{self, Kind, ResultRecord};
use crate::archive::retention::{self, Candidate, Decision, Policy};
use crate::archive::fence::{self, Fence, FenceError};
use crate::archive::{Layout, MANIFEST, Manifest, parse_backup_id};
use crate::store::object_lock::{BucketLock, FolderHold};
use crate::store::{S3Store, Store};
use crate::stream::verify::ChainVerdict;

/// One backup folder in a store.
#[derive(Debug, Clone, Serialize)]
pub struct BackupEntry {
    pub namespace: String,
    pub hosted_cluster: String,
    pub backup_id: String,
    pub url: String,
    pub taken: DateTime<Utc>,
    pub age_seconds: i64,
    pub complete: bool,
    /// Why it is not complete (no manifest, or one that does not parse).
    pub problem: Option<String>,
    pub size_bytes: u64,
    pub objects: usize,
    pub etcd_revision: Option<i64>,
    pub duration_seconds: Option<f64>,
    pub api_downtime_seconds: Option<f64>,
    /// The backed-up HostedCluster's UID.
    pub cluster_uid: Option<String>,
    /// Its lineage root: the UID of the cluster it was first created as
    /// (restore and migrate carry it over). Backups of one lineage share
    /// the etcd encryption key and restore each other's etcd.
    pub lineage: Option<String>,
    /// The store fence of the cluster, when it has one: the management
    /// cluster it runs on now (backups taken anywhere else are refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    /// Why the fence could not be read (backups of the cluster are refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence_error: Option<String>,
    /// A backup of a degraded etcd: members skipped, or taken without quorum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// Taken with `--allow-no-quorum`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_quorum: bool,
    /// Listed across several stores: every store holding it complete (a
    /// restore takes any of them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stores: Vec<String>,
    /// Made from the cluster's stream by a point-in-time restore: the
    /// point it holds and the backup its objects come from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<crate::archive::PointInTime>,
}

/// The fence of a cluster as shown: the record, or why it is unreadable.
pub async fn fence_of(store: &dyn Store, namespace: &str, hosted_cluster: &str) -> Result<Option<Fence>, OpsError> {
    match fence::read(store, namespace, hosted_cluster).await {
        Ok(f) => Ok(f),
        Err(FenceError::Store(e)) => Err(OpsError::Store(e)),
        Err(e @ FenceError::Unreadable { .. }) => Err(OpsError::Input(e.to_string())),
    }
}

/// Every backup under the store (or one cluster's), newest first.
pub async fn list(store: &dyn Store, cluster: Option<(&str, &str)>) -> Result<Vec<BackupEntry>, OpsError> {
    Ok(catalogue(store, cluster).await?.backups)
}

/// What one listing of a store shows: its backups, newest first, and the
/// clusters with a `stream/` folder (`hcp-dr stream` chains), sorted.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    pub backups: Vec<BackupEntry>,
    pub streamed: Vec<(String, String)>,
}

/// [`list`], noting from the same listing which clusters have stream
/// chains (so a store without any costs no further request).
pub async fn catalogue(store: &dyn Store, cluster: Option<(&str, &str)>) -> Result<Catalogue, OpsError> {
    let prefix = cluster.map(|(ns, hc)| Layout::cluster_prefix(ns, hc)).unwrap_or_default();
    let now = Utc::now();
    let mut folders: BTreeMap<(String, String, String), (u64, usize, bool)> = BTreeMap::new();
    let mut streamed = std::collections::BTreeSet::new();
    for object in store.list(&prefix).await? {
        let mut parts = object.key.splitn(4, '/');
        let (Some(ns), Some(hc), Some(id), Some(rest)) = (parts.next(), parts.next(), parts.next(), parts.next()) else { continue };
        if id == crate::stream::format::STREAM_FOLDER {
            streamed.insert((ns.to_string(), hc.to_string()));
            continue;
        }
        if parse_backup_id(id).is_err() {
            continue;
        }
        let entry = folders.entry((ns.to_string(), hc.to_string(), id.to_string())).or_default();
        entry.0 += object.size;
        entry.1 += 1;
        entry.2 |= rest == MANIFEST;
    }
    let mut fences: BTreeMap<(String, String), (Option<Fence>, Option<String>)> = BTreeMap::new();
    for (ns, hc, _) in folders.keys() {
        if let std::collections::btree_map::Entry::Vacant(slot) = fences.entry((ns.clone(), hc.clone())) {
            let found = match fence::read(store, ns, hc).await {
                Ok(f) => (f, None),
                Err(e @ FenceError::Unreadable { .. }) => (None, Some(e.to_string())),
                Err(FenceError::Store(e)) => return Err(e.into()),
            };
            slot.insert(found);
        }
    }
    let mut out = Vec::new();
    for ((ns, hc, id), (size, objects, has_manifest)) in folders {
        let (fence, fence_error) = fences.get(&(ns.clone(), hc.clone())).cloned().unwrap_or_default();
        let layout = Layout::new(&ns, &hc, &id);
        let taken = parse_backup_id(&id).unwrap_or(now);
        let (manifest, problem) = if has_manifest {
            match read_manifest(store, &layout).await {
                Ok(m) => (Some(m), None),
                Err(err) => (None, Some(err.to_string())),
            }
        } else {
            (None, Some("no manifest.json: never finished, or still being written".to_string()))
        };
        out.push(BackupEntry {
            url: format!("{}/{}", store.url(), layout.dir()),
            namespace: ns,
            hosted_cluster: hc,
            backup_id: id,
            taken,
            age_seconds: (now - taken).num_seconds(),
            complete: manifest.is_some(),
            problem,
            size_bytes: size,
            objects,
            etcd_revision: manifest.as_ref().and_then(|m| m.best_snapshot()).map(|s| s.revision),
            duration_seconds: manifest.as_ref().and_then(|m| match (m.timings.started, m.timings.finished) {
                (Some(s), Some(f)) => Some((f - s).num_milliseconds() as f64 / 1000.0),
                _ => None,
            }),
            api_downtime_seconds: manifest.as_ref().and_then(|m| m.timings.api_downtime_seconds),
            cluster_uid: manifest.as_ref().map(|m| m.cluster.uid.clone()),
            lineage: manifest.as_ref().map(|m| m.cluster.lineage_root().to_string()),
            fence,
            fence_error,
            degraded: manifest.as_ref().and_then(|m| m.etcd_health.describe(m.etcd.len())),
            no_quorum: manifest.as_ref().is_some_and(|m| m.etcd_health.no_quorum),
            point_in_time: manifest.as_ref().and_then(|m| m.point_in_time.clone()),
            stores: Vec::new(),
        });
    }
    out.sort_by(|a, b| b.taken.cmp(&a.taken).then(b.backup_id.cmp(&a.backup_id)));
    Ok(Catalogue { backups: out, streamed: streamed.into_iter().collect() })
}

/// The backups of several stores (a primary and its copies), newest first:
/// one entry per backup, from the first store that holds it complete (else
/// the first that holds it at all), with `stores` naming every store that
/// holds it complete.
pub async fn list_across(stores: &[Box<dyn Store>], cluster: Option<(&str, &str)>) -> Result<Vec<BackupEntry>, OpsError> {
    let mut each = Vec::new();
    for store in stores {
        each.push((store.url(), list(store.as_ref(), cluster).await?));
    }
    Ok(merge(each))
}

/// The backups listed in each store (by its URL), merged as
/// [`list_across`] says.
pub fn merge(each: Vec<(String, Vec<BackupEntry>)>) -> Vec<BackupEntry> {
    let mut merged: BTreeMap<(String, String, String), BackupEntry> = BTreeMap::new();
    for (url, entries) in each {
        for entry in entries {
            let key = (entry.namespace.clone(), entry.hosted_cluster.clone(), entry.backup_id.clone());
            let url = url.clone();
            match merged.get_mut(&key) {
                Some(seen) => {
                    if entry.complete {
                        if !seen.complete {
                            let stores = std::mem::take(&mut seen.stores);
                            *seen = entry;
                            seen.stores = stores;
                        }
                        seen.stores.push(url);
                    }
                }
                None => {
                    let mut entry = entry;
                    if entry.complete {
                        entry.stores.push(url);
                    }
                    merged.insert(key, entry);
                }
            }
        }
    }
    let mut out: Vec<BackupEntry> = merged.into_values().collect();
    out.sort_by(|a, b| b.taken.cmp(&a.taken).then(b.backup_id.cmp(&a.backup_id)));
    out
}

/// What a cluster's `hcp-dr stream` chains in one store can restore: each
/// chain's window (any revision in it, hence any second between its
/// times), and the gaps between windows, which nothing restores to the
/// revision (only to the backups taken in them).
#[derive(Debug, Clone, Serialize)]
pub struct StreamWindows {
    pub namespace: String,
    pub hosted_cluster: String,
    pub store: String,
    /// Oldest first.
    pub chains: Vec<ChainWindow>,
    pub gaps: Vec<StreamGap>,
    /// Chain folders without a descriptor: a base whose chain never started
    /// (or is being taken now); they restore nothing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<String>,
}

/// One chain's restorable window.
#[derive(Debug, Clone, Serialize)]
pub struct ChainWindow {
    pub chain_id: String,
    /// Its base revision (`None`: the descriptor is unreadable, and the
    /// chain restores nothing).
    pub from_revision: Option<i64>,
    /// The last revision reached from the base without a gap, by the
    /// segments' names (`hcp-dr backups verify --streams` reads them).
    pub through_revision: Option<i64>,
    /// When its base was taken.
    pub from: Option<DateTime<Utc>>,
    /// When the last segment of that run was written (its last revision
    /// came before); the base's time when no segment follows it.
    pub through: Option<DateTime<Utc>>,
    pub segments: usize,
    /// Why the window stops short of the chain's last segment, or why the
    /// chain restores nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// Revisions and time between two windows that no chain holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamGap {
    pub after_chain: String,
    pub before_chain: String,
    /// The first and last revision missing (`None` when the next chain's
    /// base follows the window at once but time passed without a write).
    pub revisions: Option<(i64, i64)>,
    pub from: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

/// The windows of `chains` (oldest first) and the gaps between them.
pub fn windows_of(chains: &[crate::stream::catalog::ChainListing]) -> (Vec<ChainWindow>, Vec<StreamGap>) {
    let windows: Vec<ChainWindow> = chains
        .iter()
        .map(|chain| {
            let descriptor = chain.descriptor.as_ref().ok();
            let span = chain.span();
            ChainWindow {
                chain_id: chain.layout.chain_id.clone(),
                from_revision: span.as_ref().map(|s| s.base),
                through_revision: span.as_ref().map(|s| s.through),
                from: descriptor.map(|d| d.base.taken),
                through: chain.run_ends(),
                segments: span.as_ref().map(|s| s.segments).unwrap_or_default(),
                problem: chain.descriptor.as_ref().err().map(|e| format!("restores nothing: {e}")).or_else(|| span.and_then(|s| s.problem)),
            }
        })
        .collect();
    let readable: Vec<&ChainWindow> = windows.iter().filter(|w| w.from_revision.is_some()).collect();
    let gaps = readable
        .windows(2)
        .filter_map(|pair| {
            let (before, after) = (pair[0], pair[1]);
            let (Some(through), Some(next)) = (before.through_revision, after.from_revision) else { return None };
            // the next base restores its own revision: what lies between is lost
            let revisions = (next > through + 1).then_some((through + 1, next - 1));
            revisions.map(|revisions| StreamGap {
                after_chain: before.chain_id.clone(),
                before_chain: after.chain_id.clone(),
                revisions: Some(revisions),
                from: before.through,
                until: after.from,
            })
        })
        .collect();
    (windows, gaps)
}

/// The stream windows of each of `clusters` in `store`: one listing of
/// each cluster's `stream/` folder and a read of each chain's descriptor;
/// no segment is read. Clusters whose folder holds no chain are left out.
pub async fn stream_windows(store: &dyn Store, clusters: &[(String, String)]) -> Result<Vec<StreamWindows>, OpsError> {
    let mut out = Vec::new();
    for (ns, hc) in clusters {
        let (chains, incomplete) = crate::stream::catalog::chains(store, ns, hc).await.map_err(super::stream::stream_error)?;
        if chains.is_empty() && incomplete.is_empty() {
            continue;
        }
        let (chains, gaps) = windows_of(&chains);
        out.push(StreamWindows { namespace: ns.clone(), hosted_cluster: hc.clone(), store: store.url(), chains, gaps, incomplete });
    }
    Ok(out)
}


/// A backup as `backups list` shows it: its entry, and what S3 Object Lock
/// does to it in each store that holds it complete in a bucket with Object
/// Lock (none for a local store or a bucket without).
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    #[serde(flatten)]
    pub entry: BackupEntry,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub object_lock: Vec<StoreLock>,
    /// On each cluster's newest backup only: what its stream chains can
    /// restore, per store that holds them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stream: Vec<StreamWindows>,
}

/// The lock of a backup in one store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreLock {
    pub store: String,
    #[serde(flatten)]
    pub lock: LockState,
}

/// How many manifests' locks are read at once.
const LOCK_READS: usize = 8;

/// The listed backups with their locks: each store asked once whether its
/// bucket has Object Lock, then, where it has, one HeadObject per complete
/// backup's manifest (a bucket without costs one request, a local store
/// none). A store whose answer is refused still lists: its backups' lock
/// is unknown, and a warning says why.
pub async fn with_locks(stores: &[Box<dyn Store>], entries: Vec<BackupEntry>) -> (Vec<Listed>, Vec<String>) {
    use futures::StreamExt;
    let mut listed: Vec<Listed> = entries.into_iter().map(|entry| Listed { entry, object_lock: Vec::new(), stream: Vec::new() }).collect();
    let mut warnings = Vec::new();
    let now = Utc::now();
    for store in stores {
        let url = store.url();
        // one store: every complete backup is in it; several: `stores` says
        let held: Vec<usize> = (0..listed.len())
            .filter(|&i| listed[i].entry.complete && (stores.len() == 1 || listed[i].entry.stores.contains(&url)))
            .collect();
        let states: Vec<LockState> = match object_lock::locking_of(store.as_ref()).await {
            StoreLocking::Off => continue,
            StoreLocking::Unknown(why) => {
                warnings.push(format!("{url}: the S3 Object Lock of its backups is unknown: {why}"));
                held.iter().map(|_| LockState::Unknown { why: why.clone() }).collect()
            }
            StoreLocking::On(s3) => {
                let reads = held.iter().map(|&i| {
                    let e = &listed[i].entry;
                    let layout = Layout::new(&e.namespace, &e.hosted_cluster, &e.backup_id);
                    async move { LockState::read(s3, &layout, now).await }
                });
                futures::stream::iter(reads).buffered(LOCK_READS).collect().await
            }
        };
        for (i, lock) in held.into_iter().zip(states) {
            listed[i].object_lock.push(StoreLock { store: url.clone(), lock });
        }
    }
    (listed, warnings)
}

/// Put each cluster's stream windows on its newest listed backup; the
/// windows of clusters with no backup listed are given back.
pub fn attach_streams(listed: &mut [Listed], windows: Vec<StreamWindows>) -> Vec<StreamWindows> {
    let mut unattached = Vec::new();
    for w in windows {
        // the list is newest first
        match listed.iter_mut().find(|l| l.entry.namespace == w.namespace && l.entry.hosted_cluster == w.hosted_cluster) {
            Some(newest) => newest.stream.push(w),
            None => unattached.push(w),
        }
    }
    unattached
}

/// What S3 Object Lock does to one backup: `None` in a local store or a
/// bucket without Object Lock.
pub async fn lock_of(store: &dyn Store, layout: &Layout) -> Option<LockState> {
    match object_lock::locking_of(store).await {
        StoreLocking::Off => None,
        StoreLocking::Unknown(why) => Some(LockState::Unknown { why }),
        StoreLocking::On(s3) => Some(LockState::read(s3, layout, Utc::now()).await),
    }
}

/// The manifest of one backup.
pub async fn describe(store: &dyn Store, layout: &Layout) -> Result<Manifest, OpsError> {
    read_manifest(store, layout).await.map_err(check_error)
}

fn check_error(err: CheckError) -> OpsError {
    match err {
        CheckError::Store(e) => OpsError::Store(e),
        other => OpsError::Input(other.to_string()),
    }
}

/// What `verify` found for one snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotCheck {
    pub member: String,
    pub verdict: String,
    pub revision: Option<i64>,
    pub live_keys: Option<u64>,
    /// `--deep`: keys counted in a scratch etcd restored from the snapshot.
    pub restored_keys: Option<u64>,
}

/// The result of `backups verify`.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub backup: String,
    pub ok: bool,
    pub problems: Vec<String>,
    pub artifacts_checked: usize,
    pub bytes_checked: u64,
    /// What was read from the store (each artifact once; the manifest twice).
    pub bytes_read: u64,
    pub objects: usize,
    pub snapshots: Vec<SnapshotCheck>,
    /// Why the deep check did not run, when asked and impossible.
    pub deep_skipped: Option<String>,
    /// The recipients of an encrypted backup (empty: not encrypted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub encrypted_to: Vec<String>,
    /// Whether the plaintext was checked (decrypted with --identity; always
    /// for a backup that is not encrypted). Without it only the stored
    /// bytes are: sizes, SHA-256s and SHA256SUMS.
    pub plaintext_checked: bool,
    /// The result record written beside the backup (`results/`), for
    /// `hcp-dr report`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// `--streams`: the verdict on each stream chain of the cluster.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<ChainVerdict>,
}

/// Check every `hcp-dr stream` chain of `namespace/hosted_cluster` in
/// `store` (or the one `chain` names): each base against its descriptor,
/// every segment's bytes against the SHA-256 in its name (and its content
/// when it can be decoded: `identities` for an encrypted chain), and the
/// revisions contiguous from the base. No chain at all is bad input.
pub async fn verify_streams(
    store: &dyn Store,
    namespace: &str,
    hosted_cluster: &str,
    chain: Option<&str>,
    identities: Option<&Identities>,
) -> Result<Vec<ChainVerdict>, OpsError> {
    Ok(verify_stream(store, namespace, hosted_cluster, chain, identities, false).await?.0)
}

/// `backups verify <stream>`: [`verify_streams`] and, `deep`, every chain
/// that hands over to a next one replayed to that one's base revision and
/// compared with it, key by key (`chain`: only the handover from that
/// chain is replayed), from one listing of the chains.
pub async fn verify_stream(
    store: &dyn Store,
    namespace: &str,
    hosted_cluster: &str,
    chain: Option<&str>,
    identities: Option<&Identities>,
    deep: bool,
) -> Result<(Vec<ChainVerdict>, Vec<crate::stream::deep::Handover>), OpsError> {
    let (chains, _) = crate::stream::catalog::chains(store, namespace, hosted_cluster).await.map_err(super::stream::stream_error)?;
    let verdicts = super::stream::verify_chains(store, &chains, namespace, hosted_cluster, chain, identities, "point at the store `hcp-dr stream` writes to (or drop --streams)").await?;
    if !deep {
        return Ok((verdicts, Vec::new()));
    }
    let tools = crate::etcd::scratch::ScratchTools::find_for("--deep replays each chain against the next base").map_err(OpsError::Input)?;
    let handovers = crate::stream::deep::compare_handovers(store, &chains, chain, identities, &tools).await.map_err(super::stream::stream_error)?;
    Ok((verdicts, handovers))
}

/// A failed chain verdict as one problem line: the first problem (naming
/// the object) and the revision the chain is good through.
pub fn chain_problem(verdict: &ChainVerdict) -> Option<String> {
    if verdict.ok {
        return None;
    }
    let good = match (verdict.base_revision, verdict.good_through) {
        (Some(base), Some(through)) => format!("it restores revisions {base}..{through} only"),
        _ => "it restores nothing (not even its base)".to_string(),
    };
    Some(format!(
        "stream chain {}: {}; {good}",
        verdict.chain_id,
        verdict.first_problem.as_deref().unwrap_or("a problem")
    ))
}

/// Download and check every artifact against the manifest, then every
/// snapshot offline (and, `deep`, restored into a scratch etcd).
pub async fn verify(store: &dyn Store, layout: &Layout, deep: bool) -> Result<VerifyReport, OpsError> {
    verify_with(store, layout, deep, None).await
}

/// As [`verify`], for a backup that may be encrypted: without `identities`
/// only what is stored (the ciphertext) is checked, and the report says so;
/// with them every encrypted artifact is decrypted while it streams and its
/// plaintext checked too. A wrong identity is bad input.
pub async fn verify_with(store: &dyn Store, layout: &Layout, deep: bool, identities: Option<&Identities>) -> Result<VerifyReport, OpsError> {
    let started = Utc::now();
    let meter = crate::pipeline::Meter::new();
    let metered = crate::store::metered::MeteredStore::new(store, &meter);
    let mut report = verify_metered(&metered, layout, deep, identities).await?;
    report.bytes_read = meter.bytes();
    let depth = match (&report.deep_skipped, deep, report.plaintext_checked) {
        (None, true, _) => "deep: restored into a scratch etcd",
        (_, _, true) => "hashes and snapshots read offline",
        (_, _, false) => "stored bytes only: encrypted, no --identity",
    };
    let summary = match report.ok {
        true => format!("verify passed ({depth})"),
        false => format!("verify FAILED: {}", report.problems.first().map(String::as_str).unwrap_or("a problem")),
    };
    let mut record = ResultRecord::new(Kind::Verify, &layout.namespace, &layout.hosted_cluster, &layout.backup_id, started, report.ok, summary);
    record.failures = report.problems.clone();
    report.recorded = results::write_noting(store, &record, &mut report.warnings).await;
    Ok(report)
}

async fn verify_metered(store: &dyn Store, layout: &Layout, deep: bool, identities: Option<&Identities>) -> Result<VerifyReport, OpsError> {
    let mut report = VerifyReport {
        backup: format!("{}/{}", store.url(), layout.dir()),
        ok: false,
        problems: Vec::new(),
        artifacts_checked: 0,
        bytes_checked: 0,
        bytes_read: 0,
        objects: 0,
        snapshots: Vec::new(),
        deep_skipped: None,
        encrypted_to: Vec::new(),
        plaintext_checked: false,
        recorded: None,
        warnings: Vec::new(),
        streams: Vec::new(),
    };
    let scratch = if deep {
        match crate::etcd::scratch::ScratchTools::find_for("the deep check did not run") {
            Ok(tools) => Some(tools),
            Err(why) => {
                report.deep_skipped = Some(why);
                None
            }
        }
    } else {
        None
    };
    // each snapshot is read offline (and restored into a scratch etcd) from
    // the copy made while it was hashed: downloaded once (TMPDIR's room for
    // the largest is checked before anything is read)
    let mut offline = Offline { scratch: scratch.as_ref(), read: BTreeMap::new() };
    let manifest = match check_backup_inspecting(store, layout, identities, &mut offline).await {
        Ok(checked) => {
            report.artifacts_checked = checked.report.artifacts_checked;
            report.bytes_checked = checked.report.bytes_checked;
            report.objects = checked.report.objects;
            report.encrypted_to = checked.report.encrypted_to.clone();
            report.plaintext_checked = checked.report.plaintext_checked;
            checked.manifest
        }
        Err(CheckError::Store(err)) => return Err(OpsError::Store(err)),
        Err(CheckError::NoSpace(full)) => return Err(OpsError::Store(full.into())),
        Err(CheckError::Encryption(err)) => return Err(OpsError::Input(err.to_string())),
        Err(err) => {
            report.problems.push(err.to_string());
            return Ok(report);
        }
    };
    if !report.plaintext_checked {
        // the snapshots are ciphertext: nothing more can be read without a key
        if deep {
            report.deep_skipped = Some("the backup is encrypted: pass --identity to restore its snapshots into a scratch etcd".into());
        }
        report.ok = report.problems.is_empty();
        return Ok(report);
    }
    for member in &manifest.etcd {
        let key = layout.artifact(&member.artifact);
        // every snapshot of a readable backup was read during the check
        let (offline_report, restored) = offline
            .read
            .remove(&member.member)
            .ok_or_else(|| OpsError::Input(format!("{key}: the snapshot was not read offline during the check")))?;
        let summary = offline_report.summary.as_ref();
        let mut check = SnapshotCheck {
            member: member.member.clone(),
            verdict: offline_report.verdict.to_string(),
            revision: summary.map(|s| s.store_revision()),
            live_keys: summary.map(|s| s.live_keys),
            restored_keys: None,
        };
        if !offline_report.is_ok() {
            report.problems.push(format!("{key}: {}", offline_report.verdict));
        } else if check.revision != Some(member.revision) {
            report.problems.push(format!(
                "{key}: the snapshot is at revision {:?}, the manifest records {}",
                check.revision, member.revision
            ));
        }
        if let Some(restored) = restored {
            let restored = restored.map_err(OpsError::Input)?;
            if Some(restored) != check.live_keys {
                report.problems.push(format!(
                    "{key}: a scratch etcd restored from it holds {restored} keys, the offline reading found {:?}",
                    check.live_keys
                ));
            }
            check.restored_keys = Some(restored);
        }
        report.snapshots.push(check);
    }
    report.ok = report.problems.is_empty();
    Ok(report)
}

/// Reads each member snapshot offline from the copy the check made, and
/// with `scratch` (`--deep`) restores it into a scratch etcd: what each
/// gave, by member.
struct Offline<'a> {
    scratch: Option<&'a crate::etcd::scratch::ScratchTools>,
    read: BTreeMap<String, (crate::etcd::verify::Report, Option<Result<u64, String>>)>,
}

#[async_trait::async_trait]
impl Inspect for Offline<'_> {
    fn wants(&self, _manifest: &crate::archive::Manifest, _member: &crate::archive::MemberSnapshot) -> bool {
        true
    }
    async fn inspect(&mut self, member: &crate::archive::MemberSnapshot, copy: &std::path::Path) -> Result<(), CheckError> {
        let report = crate::etcd::verify::verify_copy(copy).await.map_err(|e| CheckError::Offline(e.to_string()))?;
        let restored = match (self.scratch, report.is_ok()) {
            (Some(tools), true) => Some(tools.count_keys_of(copy).await),
            _ => None,
        };
        self.read.insert(member.member.clone(), (report, restored));
        Ok(())
    }
}

/// What prune decided for one backup.
#[derive(Debug, Clone, Serialize)]
pub struct PruneEntry {
    pub cluster: String,
    pub backup_id: String,
    pub complete: bool,
    pub keep: bool,
    pub reasons: Vec<String>,
    pub size_bytes: u64,
    /// Whether its bytes were deleted (false in a dry run).
    pub deleted: bool,
    /// Kept although the policy removes it: S3 Object Lock holds some of
    /// its objects (until when, or a legal hold).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked: Option<FolderHold>,
    /// A stream chain (`backup_id` is its chain id), not a backup.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stream_chain: bool,
    /// A stream's object set (`backup_id` is its file name under
    /// `stream/objects/`), not a backup.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub object_set: bool,
}

/// Apply `policy` to every cluster's backups in the store (or one cluster's).
pub async fn prune(
    store: &dyn Store,
    cluster: Option<(&str, &str)>,
    shard: Option<super::shard::Shard>,
    policy: &Policy,
    dry_run: bool,
) -> Result<Vec<PruneEntry>, OpsError> {
    if policy.is_empty() && policy.keep_stream.is_none() {
        return Err(OpsError::Input(
            "no retention rule given: pass at least one of --keep-last N, --keep-daily N, --keep-weekly N, --max-age AGE, --keep-stream AGE".into(),
        ));
    }
    let Catalogue { backups: entries, streamed } = catalogue(store, cluster).await?;
    // each cluster's oldest complete backup kept: what its chains are kept for
    let mut oldest_kept: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let locking = object_lock_of(store).await?;
    let mut by_cluster: BTreeMap<String, Vec<&BackupEntry>> = BTreeMap::new();
    for e in &entries {
        by_cluster.entry(format!("{}/{}", e.namespace, e.hosted_cluster)).or_default().push(e);
    }
    let now = Utc::now();
    let mut out = Vec::new();
    for (name, backups) in by_cluster {
        if shard.is_some_and(|shard| !shard.owns(&name)) {
            continue;
        }
        let candidates: Vec<Candidate> = backups
            .iter()
            .map(|b| Candidate {
                id: b.backup_id.clone(),
                taken: b.taken,
                complete: b.complete,
                derived: b.point_in_time.is_some(),
            })
            .collect();
        for Decision { id, mut keep, mut reasons } in retention::decide(&candidates, policy, now) {
            let Some(entry) = backups.iter().find(|b| b.backup_id == id) else { continue };
            let layout = Layout::new(&entry.namespace, &entry.hosted_cluster, &id);
            let mut deleted = false;
            let mut locked = None;
            if !keep && let Some(s3) = locking {
                // S3 refuses to delete a version under retention: never tried
                locked = FolderHold::of(&s3.holds(&format!("{}/", layout.dir())).await?, Utc::now());
                if let Some(hold) = &locked {
                    keep = true;
                    reasons.push(format!("{}: S3 refuses to delete it before, a prune after that removes it", hold.describe()));
                }
            }
            if !keep && !dry_run {
                match locking {
                    Some(s3) => delete_versions(s3, &layout).await?,
                    None => delete_backup(store, &layout).await?,
                }
                deleted = true;
            }
            if keep && entry.complete {
                let oldest = oldest_kept.entry(name.clone()).or_insert(entry.taken);
                *oldest = (*oldest).min(entry.taken);
            }
            out.push(PruneEntry {
                stream_chain: false,
                object_set: false,
                locked,
                cluster: name.clone(),
                backup_id: id,
                complete: entry.complete,
                keep,
                reasons,
                size_bytes: entry.size_bytes,
                deleted,
            });
        }
    }
    for (ns, hc) in &streamed {
        let name = format!("{ns}/{hc}");
        if shard.is_some_and(|shard| !shard.owns(&name)) {
            continue;
        }
        let cutoff = match policy.keep_stream {
            Some(age) => Some((now - age, format!("--keep-stream {}", age.to_std().map(crate::duration::show).unwrap_or_default()))),
            None => oldest_kept.get(&name).map(|t| (*t, format!("the oldest kept backup ({})", t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))),
        };
        let chains = Chains { store, locking, namespace: ns, hosted_cluster: hc, dry_run };
        out.extend(chains.prune(cutoff.as_ref().map(|(t, what)| (*t, what.as_str()))).await?);
    }
    if let Some(s3) = locking {
        out.extend(prune_hidden(s3, &entries, cluster, shard, policy, dry_run).await?);
    }
    Ok(out)
}

/// One cluster's stream chains, as prune sees them.
struct Chains<'a> {
    store: &'a dyn Store,
    locking: Option<&'a S3Store>,
    namespace: &'a str,
    hosted_cluster: &'a str,
    dry_run: bool,
}

impl Chains<'_> {
    /// Remove the chains [`retention::decide_chains`] lets go, each whole,
    /// unless S3 Object Lock still holds some of its objects.
    async fn prune(&self, cutoff: Option<(DateTime<Utc>, &str)>) -> Result<Vec<PruneEntry>, OpsError> {
        let (chains, _) = crate::stream::catalog::chains(self.store, self.namespace, self.hosted_cluster).await.map_err(super::stream::stream_error)?;
        let candidates: Vec<retention::ChainCandidate> = chains
            .iter()
            .map(|c| retention::ChainCandidate { id: c.layout.chain_id.clone(), last_written: c.last_written(), unreadable: c.descriptor.as_ref().err().cloned() })
            .collect();
        let mut out = Vec::new();
        for (chain, Decision { id, mut keep, mut reasons }) in chains.iter().zip(retention::decide_chains(&candidates, cutoff)) {
            let folder = format!("{}/", chain.layout.dir());
            let (locked, size_bytes) = self.weigh(&folder, &mut keep, &mut reasons).await?;
            let deleted = !keep && !self.dry_run;
            if deleted {
                self.delete(&chain.layout).await?;
            }
            out.push(PruneEntry {
                cluster: format!("{}/{}", self.namespace, self.hosted_cluster),
                backup_id: id,
                complete: chain.descriptor.is_ok(),
                keep,
                reasons,
                size_bytes,
                deleted,
                locked,
                stream_chain: true,
                object_set: false,
            });
        }
        // the object sets a restore into a kept chain can need
        let kept_from = chains
            .iter()
            .zip(&out)
            .filter(|(_, entry)| entry.keep)
            .filter_map(|(chain, _)| chain.descriptor.as_ref().ok().map(|d| d.base.taken))
            .min();
        out.extend(self.prune_objects(kept_from).await?);
        Ok(out)
    }

    /// Remove the object sets no kept chain can use: those older than the
    /// newest one read before `kept_from` (the earliest base of a kept
    /// chain). Without a kept chain nothing is removed.
    async fn prune_objects(&self, kept_from: Option<DateTime<Utc>>) -> Result<Vec<PruneEntry>, OpsError> {
        let Some(kept_from) = kept_from else { return Ok(Vec::new()) };
        let sets = crate::stream::objects::list(self.store, self.namespace, self.hosted_cluster).await.map_err(super::stream::stream_error)?;
        let needed_before = crate::stream::objects::at(&sets, kept_from).map(|s| s.taken);
        let prefix = crate::stream::objects::prefix(self.namespace, self.hosted_cluster);
        let since = kept_from.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut out = Vec::new();
        for set in &sets {
            let (mut keep, reason) = if set.taken >= kept_from {
                (true, format!("read after the oldest kept chain's base ({since})"))
            } else if Some(set.taken) == needed_before {
                (true, format!("the objects as they were at the oldest kept chain's base ({since})"))
            } else {
                (false, format!("superseded before the oldest kept chain's base ({since})"))
            };
            let mut reasons = vec![reason];
            let key = format!("{prefix}{}", set.file_name());
            let (locked, size_bytes) = self.weigh(&key, &mut keep, &mut reasons).await?;
            let deleted = !keep && !self.dry_run;
            if deleted {
                match self.locking {
                    Some(s3) => {
                        s3.delete_versions(&key, &key).await?;
                    }
                    None => self.store.delete(&key).await?,
                }
            }
            out.push(PruneEntry {
                cluster: format!("{}/{}", self.namespace, self.hosted_cluster),
                backup_id: set.file_name(),
                complete: true,
                keep,
                reasons,
                size_bytes,
                deleted,
                locked,
                stream_chain: false,
                object_set: true,
            });
        }
        Ok(out)
    }

    /// For what the policy lets go (`keep` false) under `prefix`: whether
    /// S3 Object Lock still holds some of it (then it is kept, and
    /// `reasons` say until when: S3 would refuse the deletion, so it is
    /// never tried), and the bytes a deletion frees.
    async fn weigh(&self, prefix: &str, keep: &mut bool, reasons: &mut Vec<String>) -> Result<(Option<FolderHold>, u64), OpsError> {
        let mut locked = None;
        if !*keep && let Some(s3) = self.locking {
            locked = FolderHold::of(&s3.holds(prefix).await?, Utc::now());
            if let Some(hold) = &locked {
                *keep = true;
                reasons.push(format!("{}: S3 refuses to delete it before, a prune after that removes it", hold.describe()));
            }
        }
        let size_bytes = match *keep {
            true => 0,
            false => self.store.list(prefix).await?.iter().map(|o| o.size).sum(),
        };
        Ok((locked, size_bytes))
    }

    /// Delete a chain: its descriptor first (the chain stops being listed,
    /// so nothing reads it half deleted), then its segments, then its base.
    async fn delete(&self, layout: &crate::stream::format::ChainLayout) -> Result<(), OpsError> {
        let dir = layout.dir();
        match self.locking {
            Some(s3) => {
                // every version (a DELETE without one only hides them):
                // the descriptor's, then the segments', then the rest
                s3.delete_versions(&layout.descriptor(), &layout.descriptor()).await?;
                s3.delete_versions(&layout.segments_prefix(), &layout.descriptor()).await?;
                delete_folder_versions(s3, &dir, &layout.descriptor()).await?
            }
            None => delete_folder(self.store, &dir, &[layout.descriptor()], &[layout.segments_prefix()]).await?,
        }
        tracing::info!(chain = %layout.dir(), store = %self.store.url(), "stream chain deleted");
        Ok(())
    }
}

/// In a bucket with Object Lock (versioned): the backup folders whose every
/// object was deleted without its versions (by hand, or by a tool that
/// only added delete markers), which no listing shows but which take
/// space. An incomplete one (no manifest among its versions) is deleted,
/// version by version, once nothing holds it and it is older than
/// `incomplete_after` (a folder being written has current objects anyway).
/// A complete one is never deleted here: hiding backups behind delete
/// markers is what an attacker with only `s3:DeleteObject` can do, and
/// prune finishing the deletion once the retention ends would complete
/// the attack; it is kept and reported, with how to bring it back.
async fn prune_hidden(
    s3: &S3Store,
    visible: &[BackupEntry],
    cluster: Option<(&str, &str)>,
    shard: Option<super::shard::Shard>,
    policy: &Policy,
    dry_run: bool,
) -> Result<Vec<PruneEntry>, OpsError> {
    let prefix = cluster.map(|(ns, hc)| Layout::cluster_prefix(ns, hc)).unwrap_or_default();
    // (namespace, cluster, id, taken) -> whether a manifest is among its versions
    let mut hidden = std::collections::BTreeMap::new();
    for key in s3.hidden_keys(&prefix).await? {
        let mut parts = key.splitn(4, '/');
        let (Some(ns), Some(hc), Some(id), Some(file)) = (parts.next(), parts.next(), parts.next(), parts.next()) else { continue };
        let Ok(taken) = parse_backup_id(id) else { continue };
        if visible.iter().any(|e| e.namespace == ns && e.hosted_cluster == hc && e.backup_id == id) {
            continue;
        }
        *hidden.entry((ns.to_string(), hc.to_string(), id.to_string(), taken)).or_insert(false) |= file == crate::archive::MANIFEST;
    }
    let now = Utc::now();
    let mut out = Vec::new();
    for ((ns, hc, id, taken), complete) in hidden {
        let name = format!("{ns}/{hc}");
        if shard.is_some_and(|shard| !shard.owns(&name)) || (!complete && now - taken <= policy.incomplete_after) {
            continue;
        }
        let layout = Layout::new(&ns, &hc, &id);
        let locked = FolderHold::of(&s3.holds(&format!("{}/", layout.dir())).await?, now);
        let mut reasons = vec![match complete {
            false => "hidden: deleted without its object versions (only delete markers are current), which still take space".to_string(),
            true => format!(
                "hidden: a COMPLETE backup deleted without its object versions (only delete markers are current); prune never finishes that deletion (it is what an attacker who may only delete objects can do); if nobody meant to, bring it back by deleting its delete markers (aws s3api list-object-versions --prefix {}/, then aws s3api delete-object --version-id MARKER for each), else delete its versions by hand",
                layout.dir()
            ),
        }];
        if let Some(hold) = &locked {
            reasons.push(format!("{}: S3 refuses to delete it before", hold.describe()));
        }
        let keep = complete || locked.is_some();
        if !keep && !dry_run {
            delete_versions(s3, &layout).await?;
        }
        out.push(PruneEntry { cluster: name, backup_id: id, complete, keep, reasons, size_bytes: 0, deleted: !keep && !dry_run, locked, stream_chain: false, object_set: false });
    }
    Ok(out)
}

/// The S3 store of `store` when its bucket has Object Lock (and so is
/// versioned); `None` for a bucket without, or a local store.
async fn object_lock_of(store: &dyn Store) -> Result<Option<&S3Store>, OpsError> {
    let Some(s3) = store.s3() else { return Ok(None) };
    match s3.bucket_lock().await {
        Ok(BucketLock::Enabled { .. }) => Ok(Some(s3)),
        Ok(BucketLock::Disabled { .. }) => Ok(None),
        Err(err) => Err(OpsError::Input(format!(
            "{}: could not read whether the bucket has S3 Object Lock ({err}); prune must know, to skip the backups still under retention and to delete the others version by version: check the bucket and the credentials, which need s3:GetBucketObjectLockConfiguration on it",
            store.url()
        ))),
    }
}

/// Delete every version of every object of a backup in a bucket with
/// Object Lock (a DELETE without a version would only hide them behind
/// delete markers, and free nothing): the manifest's first, so a backup
/// cut short here shows as incomplete, never as good.
async fn delete_versions(s3: &S3Store, layout: &Layout) -> Result<(), OpsError> {
    delete_folder_versions(s3, &layout.dir(), &layout.manifest()).await?;
    tracing::info!(backup = %layout.dir(), store = %s3.url(), "deleted, every version");
    Ok(())
}

/// Delete every version of every object under the folder `dir`, those of
/// `first` before the others; an error when any is left.
async fn delete_folder_versions(s3: &S3Store, dir: &str, first: &str) -> Result<(), OpsError> {
    let folder = format!("{dir}/");
    let deleted = s3.delete_versions(&folder, first).await?;
    let left = s3.count_versions(&folder).await?;
    if left > 0 {
        return Err(OpsError::Input(format!(
            "{}/{dir}: {left} object version(s) remain after deleting them; check the store's permissions (s3:DeleteObjectVersion)",
            s3.url()
        )));
    }
    tracing::debug!(folder = %dir, versions = deleted, "every version deleted");
    Ok(())
}

/// Delete every object under the folder `dir`: the keys `first`, then
/// what is under each of `then` in turn, then the rest; an error when any
/// is left.
async fn delete_folder(store: &dyn Store, dir: &str, first: &[String], then: &[String]) -> Result<(), OpsError> {
    let folder = format!("{dir}/");
    for key in first {
        store.delete(key).await?;
    }
    for prefix in then.iter().chain([&folder]) {
        for object in store.list(prefix).await? {
            store.delete(&object.key).await?;
        }
    }
    let left = store.list(&folder).await?;
    if !left.is_empty() {
        return Err(OpsError::Input(format!(
            "{}/{dir}: {} object(s) remain after deleting them; check the store's permissions",
            store.url(),
            left.len()
        )));
    }
    Ok(())
}

/// Delete every object of a backup: the manifest first, so a backup cut
/// short here shows as incomplete, never as good.
pub async fn delete_backup(store: &dyn Store, layout: &Layout) -> Result<(), OpsError> {
    delete_folder(store, &layout.dir(), &[layout.manifest()], &[]).await?;
    tracing::info!(backup = %layout.dir(), store = %store.url(), "deleted");
    Ok(())
}

