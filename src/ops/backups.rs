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
    let prefix = cluster.map(|(ns, hc)| Layout::cluster_prefix(ns, hc)).unwrap_or_default();
    let now = Utc::now();
    let mut folders: BTreeMap<(String, String, String), (u64, usize, bool)> = BTreeMap::new();
    for object in store.list(&prefix).await? {
        let mut parts = object.key.splitn(4, '/');
        let (Some(ns), Some(hc), Some(id), Some(rest)) = (parts.next(), parts.next(), parts.next(), parts.next()) else { continue };
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
            stores: Vec::new(),
        });
    }
    out.sort_by(|a, b| b.taken.cmp(&a.taken).then(b.backup_id.cmp(&a.backup_id)));
    Ok(out)
}

/// The backups of several stores (a primary and its copies), newest first:
/// one entry per backup, from the first store that holds it complete (else
/// the first that holds it at all), with `stores` naming every store that
/// holds it complete.
pub async fn list_across(stores: &[Box<dyn Store>], cluster: Option<(&str, &str)>) -> Result<Vec<BackupEntry>, OpsError> {
    let mut merged: BTreeMap<(String, String, String), BackupEntry> = BTreeMap::new();
    for store in stores {
        for entry in list(store.as_ref(), cluster).await? {
            let key = (entry.namespace.clone(), entry.hosted_cluster.clone(), entry.backup_id.clone());
            let url = store.url();
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
    let mut listed: Vec<Listed> = entries.into_iter().map(|entry| Listed { entry, object_lock: Vec::new() }).collect();
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
    };
    let scratch = if deep {
        match crate::etcd::scratch::ScratchTools::find() {
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
}

/// Apply `policy` to every cluster's backups in the store (or one cluster's).
pub async fn prune(
    store: &dyn Store,
    cluster: Option<(&str, &str)>,
    shard: Option<super::shard::Shard>,
    policy: &Policy,
    dry_run: bool,
) -> Result<Vec<PruneEntry>, OpsError> {
    if policy.is_empty() {
        return Err(OpsError::Input(
            "no retention rule given: pass at least one of --keep-last N, --keep-daily N, --keep-weekly N, --max-age AGE".into(),
        ));
    }
    let entries = list(store, cluster).await?;
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
            out.push(PruneEntry {
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
    if let Some(s3) = locking {
        out.extend(prune_hidden(s3, &entries, cluster, shard, policy, dry_run).await?);
    }
    Ok(out)
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
        out.push(PruneEntry { cluster: name, backup_id: id, complete, keep, reasons, size_bytes: 0, deleted: !keep && !dry_run, locked });
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
    let folder = format!("{}/", layout.dir());
    let deleted = s3.delete_versions(&folder, &layout.manifest()).await?;
    let left = s3.count_versions(&folder).await?;
    if left > 0 {
        return Err(OpsError::Input(format!(
            "{}/{}: {left} object version(s) remain after deleting them; check the store's permissions (s3:DeleteObjectVersion)",
            s3.url(),
            layout.dir()
        )));
    }
    tracing::info!(backup = %layout.dir(), store = %s3.url(), versions = deleted, "deleted, every version");
    Ok(())
}

/// Delete every object of a backup: the manifest first, so a backup cut
/// short here shows as incomplete, never as good.
pub async fn delete_backup(store: &dyn Store, layout: &Layout) -> Result<(), OpsError> {
    store.delete(&layout.manifest()).await?;
    for object in store.list(&format!("{}/", layout.dir())).await? {
        store.delete(&object.key).await?;
    }
    let left = store.list(&format!("{}/", layout.dir())).await?;
    if !left.is_empty() {
        return Err(OpsError::Input(format!(
            "{}/{}: {} object(s) remain after deleting them; check the store's permissions",
            store.url(),
            layout.dir(),
            left.len()
        )));
    }
    tracing::info!(backup = %layout.dir(), store = %store.url(), "deleted");
    Ok(())
}

