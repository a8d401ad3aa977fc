//! `hcp-dr backups copy --from STORE --to STORE`: copy complete backups
//! (and their clusters' result records) to another store, for an off-site
//! copy that survives the loss of the first store's region.
//!
//! Idempotent and resumable: an artifact already at the destination is
//! kept when its bytes there hash to what the manifest records, so a copy
//! cut short goes on where it stopped and a second run copies nothing. Every
//! artifact's hash is checked on the way (the source's bytes against the
//! manifest) and the manifest is written last, so the destination never
//! lists a copy as complete before all of it is there. The store fence
//! (`fence.json`) is not copied: it belongs to the store it is in.
//!
//! With `--lock-for` every object of a backup it copies is written with
//! that S3 Object Lock retention (the destination checked first to be a
//! bucket with Object Lock, as for `backup --lock-for`); the result records
//! are not locked. An object already there keeps its retention, lengthened
//! to `--lock-for` from when it was written there when it is shorter, or
//! set from now when it has none ([`ObjectLock::for_present`]): a copy run
//! again and again never pushes a lock further. The report gives each
//! backup's lock as S3 holds it on the manifest.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OpsError;
use super::backups::{self, BackupEntry};
use super::object_lock::LockReport;
use crate::archive::results::is_result_key;
use crate::archive::{Layout, Manifest};
use crate::archive::check::CheckError;
use crate::store::object_lock::{LockMode, ObjectLock};
use crate::store::{self, S3Options, Store, StoreError, StoreUrl};

/// What `backups copy` was asked.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub from: String,
    pub to: String,
    pub s3: S3Options,
    /// Only this cluster's backups (namespace, name).
    pub cluster: Option<(String, String)>,
    /// Only backups taken within this long.
    pub since: Option<std::time::Duration>,
    /// `--lock-for`/`--lock-mode`: the retention every copied object of a
    /// backup gets at the destination.
    pub lock: Option<ObjectLock>,
}

/// What a copy run did with one backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyResult {
    Copied,
    #[serde(rename = "already there")]
    AlreadyThere,
    /// A copy cut short, finished.
    Completed,
    Failed,
}

impl CopyResult {
    pub fn as_str(&self) -> &'static str {
        match self {
            CopyResult::Copied => "copied",
            CopyResult::AlreadyThere => "already there",
            CopyResult::Completed => "completed",
            CopyResult::Failed => "failed",
        }
    }
}

/// What became of one backup.
#[derive(Debug, Clone, Serialize)]
pub struct CopiedBackup {
    pub backup: String,
    pub taken: DateTime<Utc>,
    pub result: CopyResult,
    pub artifacts: usize,
    /// Artifacts that were at the destination already, their hashes checked.
    pub kept: usize,
    pub bytes_copied: u64,
    /// With `--lock-for`: objects that were there already and were given
    /// the retention (they had none, or a shorter one).
    #[serde(skip_serializing_if = "is_zero")]
    pub retention_set: usize,
    /// With `--lock-for`: the lock of the copy, as S3 holds it on its
    /// manifest at the destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<LockReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// What `backups copy` did.
#[derive(Debug, Clone, Serialize)]
pub struct CopyReport {
    pub from: String,
    pub to: String,
    pub backups: Vec<CopiedBackup>,
    pub copied: usize,
    pub already_there: usize,
    pub failed: usize,
    pub bytes_copied: u64,
    /// Result records copied (the drills', verifies', restores').
    pub results_copied: usize,
    /// Incomplete backups left behind (no manifest: never finished).
    pub skipped_incomplete: Vec<String>,
    /// The stream chains of the clusters copied (`hcp-dr stream`), and
    /// their object sets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chains: Vec<super::copy_stream::CopiedChain>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub object_sets: Vec<super::copy_stream::CopiedSets>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Copy the complete backups `options` selects, oldest first.
pub async fn copy(options: &CopyOptions) -> Result<CopyReport, OpsError> {
    let (from_url, to_url) = (StoreUrl::parse(&options.from)?, StoreUrl::parse(&options.to)?);
    if from_url.same_store(&to_url) {
        return Err(OpsError::Input(format!("--from and --to are the same store ({}): a copy goes to another one", options.to)));
    }
    if let Some((ns, hc)) = &options.cluster {
        super::backup::check_name("hosted cluster", hc)?;
        super::backup::check_name("namespace", ns)?;
    }
    // before anything is read or written: --to must be a bucket with Object Lock
    let warnings = super::object_lock::check_stores(options.lock, &options.to, &[], &options.s3).await?;
    let from = store::open(&options.from, options.s3.clone()).await?;
    // the backups' own objects through a store that locks them; the
    // result records beside them through one that does not
    let to = store::open(&options.to, S3Options { object_lock: options.lock, ..options.s3.clone() }).await?;
    let to_unlocked = match options.lock {
        Some(_) => Some(store::open(&options.to, options.s3.clone()).await?),
        None => None,
    };
    let cluster = options.cluster.as_ref().map(|(ns, hc)| (ns.as_str(), hc.as_str()));
    let now = Utc::now();
    let mut entries: Vec<BackupEntry> = backups::list(from.as_ref(), cluster).await?;
    if let Some(since) = options.since {
        let oldest = now - crate::duration::to_chrono(since);
        entries.retain(|e| e.taken >= oldest);
    }
    entries.reverse();
    let mut report = CopyReport {
        from: from.url(),
        to: to.url(),
        backups: Vec::new(),
        copied: 0,
        already_there: 0,
        failed: 0,
        bytes_copied: 0,
        results_copied: 0,
        skipped_incomplete: Vec::new(),
        chains: Vec::new(),
        object_sets: Vec::new(),
        warnings,
    };
    let mut clusters = std::collections::BTreeSet::new();
    for entry in &entries {
        if !entry.complete {
            report.skipped_incomplete.push(entry.url.clone());
            continue;
        }
        let layout = Layout::new(&entry.namespace, &entry.hosted_cluster, &entry.backup_id);
        clusters.insert((entry.namespace.clone(), entry.hosted_cluster.clone()));
        let run = Run { from: from.as_ref(), to: to.as_ref(), lock: options.lock };
        let copied = match copy_one(&run, &layout, entry.taken, &mut report.warnings).await {
            Ok(mut done) => {
                if options.lock.is_some() {
                    done.object_lock = super::object_lock::after_run(to.as_ref(), &layout, true, &mut report.warnings).await;
                }
                done
            }
            // a store that cannot be reached fails the whole copy: the next
            // backup would fail the same way
            Err(CopyError::Store(err)) => return Err(err.into()),
            Err(CopyError::Backup(why)) => {
                if options.lock.is_some() {
                    super::object_lock::after_failed_copy(to.as_ref(), &layout, &mut report.warnings).await;
                }
                CopiedBackup {
                    backup: format!("{}/{}", from.url(), layout.dir()),
                    taken: entry.taken,
                    result: CopyResult::Failed,
                    artifacts: 0,
                    kept: 0,
                    bytes_copied: 0,
                    retention_set: 0,
                    object_lock: None,
                    error: Some(why),
                }
            }
        };
        match copied.result {
            CopyResult::Failed => report.failed += 1,
            CopyResult::AlreadyThere => report.already_there += 1,
            CopyResult::Copied | CopyResult::Completed => report.copied += 1,
        }
        report.bytes_copied += copied.bytes_copied;
        report.backups.push(copied);
    }
    let results_to = to_unlocked.as_deref().unwrap_or(to.as_ref());
    for (ns, hc) in &clusters {
        report.results_copied += copy_results(from.as_ref(), results_to, ns, hc).await?;
    }
    // the stream chains and object sets, written with the backups' lock
    let since = options.since.map(|since| now - crate::duration::to_chrono(since));
    for (ns, hc) in super::copy_stream::streamed(from.as_ref(), cluster).await? {
        let (chains, sets) = super::copy_stream::copy_cluster(from.as_ref(), to.as_ref(), &ns, &hc, since).await?;
        report.failed += chains.iter().filter(|c| c.result == CopyResult::Failed).count() + sets.failed.len();
        report.bytes_copied += chains.iter().map(|c| c.bytes_copied).sum::<u64>() + sets.bytes_copied;
        report.chains.extend(chains);
        report.object_sets.push(sets);
    }
    Ok(report)
}

enum CopyError {
    /// A store did not answer.
    Store(StoreError),
    /// This backup cannot be copied (damaged at the source).
    Backup(String),
}

impl From<StoreError> for CopyError {
    fn from(err: StoreError) -> CopyError {
        CopyError::Store(err)
    }
}

/// The manifest, or any small object, that listing showed is there.
async fn read_all(store: &dyn Store, key: &str) -> Result<Vec<u8>, StoreError> {
    store::get_bytes(store, key).await?.ok_or_else(|| StoreError::NotFound { url: store.url(), key: key.to_string() })
}

/// Whether `key` is at the destination with the bytes the manifest records
/// (rehashed from there); gone since the listing counts as not there.
async fn holds(to: &dyn Store, key: &str, artifact: &crate::archive::Artifact) -> Result<bool, CopyError> {
    match crate::archive::check::hash_stored(to, key).await {
        Ok(there) => Ok(there.size == artifact.size && there.sha256 == artifact.sha256),
        Err(CheckError::Store(StoreError::NotFound { .. })) => Ok(false),
        Err(CheckError::Store(err)) => Err(CopyError::Store(err)),
        Err(other) => Err(CopyError::Backup(other.to_string())),
    }
}

/// What each backup of a run is copied between, and with.
struct Run<'a> {
    from: &'a dyn Store,
    /// Writes with `lock`'s retention when there is one.
    to: &'a dyn Store,
    lock: Option<ObjectLock>,
}

/// Copy one backup: each artifact the manifest lists (kept when the
/// destination already holds it with the recorded hash, and with a lock
/// given the retention it lacks), then the manifest.
async fn copy_one(run: &Run<'_>, layout: &Layout, taken: DateTime<Utc>, warnings: &mut Vec<String>) -> Result<CopiedBackup, CopyError> {
    let (from, to) = (run.from, run.to);
    let manifest_bytes = read_all(from, &layout.manifest()).await?;
    let manifest = Manifest::parse(&manifest_bytes).map_err(|e| CopyError::Backup(format!("{}/{}: {e}", from.url(), layout.manifest())))?;
    let existing = to.list(&format!("{}/", layout.dir())).await?;
    let there = |key: &str| existing.iter().find(|o| o.key == key);
    let manifest_there = there(&layout.manifest()).is_some();
    let mut done = CopiedBackup {
        backup: format!("{}/{}", to.url(), layout.dir()),
        taken,
        result: CopyResult::Copied,
        artifacts: manifest.artifacts.len(),
        kept: 0,
        bytes_copied: 0,
        retention_set: 0,
        object_lock: None,
        error: None,
    };
    let mut present = PresentLocks::default();
    for artifact in &manifest.artifacts {
        let key = layout.artifact(&artifact.name);
        if let Some(object) = there(&key).filter(|o| o.size == artifact.size)
            && holds(to, &key, artifact).await?
        {
            done.kept += 1;
            present.hold(run, &key, object.modified).await?;
            continue;
        }
        let body = from.get(&key).await?;
        let put = to.put(&key, body).await?;
        if put.size != artifact.size || put.sha256 != artifact.sha256 {
            // what the source holds is not what its manifest recorded: the
            // copy would be as damaged; remove what was written (a locking
            // store keeps it, and the report says so)
            let _ = to.delete(&key).await;
            return Err(CopyError::Backup(format!(
                "{}/{key}: {} bytes with SHA-256 {}, the manifest records {} bytes with {}: the backup is damaged at the source; nothing of it is listed as complete at the destination",
                from.url(),
                put.size,
                put.sha256,
                artifact.size,
                artifact.sha256
            )));
        }
        done.bytes_copied += put.size;
    }
    let same_manifest = manifest_there && read_all(to, &layout.manifest()).await? == manifest_bytes;
    if same_manifest {
        present.hold(run, &layout.manifest(), there(&layout.manifest()).and_then(|o| o.modified)).await?;
    } else {
        to.put(&layout.manifest(), Box::new(&manifest_bytes[..])).await?;
        done.bytes_copied += manifest_bytes.len() as u64;
    }
    done.retention_set = present.set;
    if present.governance > 0 {
        warnings.push(format!(
            "{}: {} object(s) there already are held in GOVERNANCE mode, not the COMPLIANCE asked: S3 lets only a principal with s3:BypassGovernanceRetention change the mode, so they stay GOVERNANCE (lengthened where they were shorter)",
            done.backup, present.governance
        ));
    }
    done.result = match (same_manifest, done.kept) {
        (true, kept) if kept == done.artifacts => CopyResult::AlreadyThere,
        (_, 0) => CopyResult::Copied,
        _ => CopyResult::Completed,
    };
    Ok(done)
}

/// With a lock: what was done to the retention of the objects of one
/// backup that were at the destination already.
#[derive(Default)]
struct PresentLocks {
    /// Given a retention, or a longer one.
    set: usize,
    /// Held in GOVERNANCE mode where COMPLIANCE was asked.
    governance: usize,
}

impl PresentLocks {
    /// Give `key`, found at the destination with the right bytes and
    /// written there at `written`, the retention it lacks
    /// ([`ObjectLock::for_present`]). Nothing without a lock.
    async fn hold(&mut self, run: &Run<'_>, key: &str, written: Option<DateTime<Utc>>) -> Result<(), CopyError> {
        let (Some(lock), Some(s3)) = (run.lock, run.to.s3()) else { return Ok(()) };
        // gone since its bytes were checked: the manifest's lock, read back, tells
        let Some(hold) = s3.retention(key).await? else { return Ok(()) };
        if lock.mode == LockMode::Compliance && hold.mode == Some(LockMode::Governance) {
            self.governance += 1;
        }
        if let Some((mode, until)) = lock.for_present(&hold, written, Utc::now()) {
            s3.set_retention(key, hold.version_id, mode, until).await?;
            self.set += 1;
        }
        Ok(())
    }
}

/// Copy a cluster's result records the destination lacks; how many.
async fn copy_results(from: &dyn Store, to: &dyn Store, ns: &str, hc: &str) -> Result<usize, StoreError> {
    let prefix = format!("{ns}/{hc}/{}/", crate::archive::results::RESULTS);
    let there: std::collections::BTreeSet<String> = to.list(&prefix).await?.into_iter().map(|o| o.key).collect();
    let mut copied = 0;
    for object in from.list(&prefix).await? {
        if is_result_key(&object.key) && !there.contains(&object.key) {
            let bytes = read_all(from, &object.key).await?;
            to.put(&object.key, Box::new(&bytes[..])).await?;
            copied += 1;
        }
    }
    Ok(copied)
}

/// The text report.
pub fn render(report: &CopyReport) -> String {
    let mut out = format!(
        "{} -> {}: {} copied, {} already there, {} failed ({})\n",
        report.from,
        report.to,
        report.copied,
        report.already_there,
        report.failed,
        crate::cli::report::human_bytes(report.bytes_copied)
    );
    for b in &report.backups {
        out.push_str(&format!("  {:<13} {}", b.result.as_str(), b.backup));
        if b.kept > 0 && b.result != CopyResult::AlreadyThere {
            out.push_str(&format!(" ({} of {} artifacts were there already)", b.kept, b.artifacts));
        }
        if let Some(lock) = &b.object_lock {
            out.push_str(&format!("\n                locked: S3 Object Lock {} until {}", lock.mode, lock.retain_until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
            if b.retention_set > 0 {
                out.push_str(&format!(" ({} object(s) there already given the retention)", b.retention_set));
            }
        }
        if let Some(e) = &b.error {
            out.push_str(&format!("\n                {e}"));
        }
        out.push('\n');
    }
    if report.results_copied > 0 {
        out.push_str(&format!("  {} result record(s) copied\n", report.results_copied));
    }
    for c in &report.chains {
        out.push_str(&format!("  {:<13} stream chain {}/{}", c.result.as_str(), c.hosted_cluster, c.chain_id));
        if c.segments_copied > 0 || c.result == CopyResult::Copied {
            out.push_str(&format!(" ({} of {} segments copied)", c.segments_copied, c.segments));
        }
        if let Some(e) = &c.error {
            out.push_str(&format!("\n                {e}"));
        }
        out.push('\n');
    }
    for sets in report.object_sets.iter().filter(|s| s.sets > 0) {
        out.push_str(&format!("  {} of {} object set(s) of {} copied\n", sets.copied, sets.sets, sets.hosted_cluster));
        for f in &sets.failed {
            out.push_str(&format!("  FAILED object set {f}\n"));
        }
    }
    for url in &report.skipped_incomplete {
        out.push_str(&format!("  skipped (incomplete: no manifest) {url}\n"));
    }
    for w in &report.warnings {
        out.push_str(&format!("  warning: {w}\n"));
    }
    out
}
