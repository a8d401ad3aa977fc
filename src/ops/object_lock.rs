//! S3 Object Lock in operations: the up-front check that every store a
//! `backup --lock-for` or `backups copy --lock-for` writes to is an S3
//! bucket with Object Lock, and what their reports say of the lock
//! afterwards, read back from S3 (the objects' retention is the truth; the
//! manifest does not record it).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OpsError;
use crate::archive::Layout;
use crate::store::object_lock::{BucketLock, FolderHold, LockMode, ObjectLock, how_to_enable};
use crate::store::{self, S3Options, S3Store, Store, StoreUrl};

/// The lock of a completed backup, as S3 reports it on its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockReport {
    pub mode: LockMode,
    /// When the manifest's retention ends: each object is held for
    /// `--lock-for` from when it was written, and the manifest is written
    /// last, so this is when the last of them may be deleted.
    pub retain_until: DateTime<Utc>,
}

/// Before anything is contacted, locked or written: with `--lock-for`,
/// `--to` and every `--copy-to` (of a backup; `--to` of `backups copy`)
/// must be an S3 bucket with Object Lock enabled (bad input otherwise,
/// naming the flag and how to enable it).
/// Warnings for what the run should say (a bucket default retention).
pub async fn check_stores(lock: Option<ObjectLock>, to: &str, copy_to: &[String], s3: &S3Options) -> Result<Vec<String>, OpsError> {
    let Some(lock) = lock else { return Ok(Vec::new()) };
    let mut warnings = Vec::new();
    // every store an S3 one before any bucket is asked
    let mut buckets = Vec::new();
    for (flag, url) in std::iter::once(("--to", to)).chain(copy_to.iter().map(|c| ("--copy-to", c.as_str()))) {
        match StoreUrl::parse(url)? {
            StoreUrl::S3 { bucket, .. } => buckets.push((flag, url, bucket)),
            StoreUrl::Local(_) => {
                return Err(OpsError::Input(format!(
                    "--lock-for: {flag} {url} is a local directory; S3 Object Lock needs an S3 store (s3://bucket/prefix) whose bucket has Object Lock enabled. Drop --lock-for, or write to such a bucket"
                )));
            }
        }
    }
    for (flag, url, bucket) in buckets {
        let mut plain = s3.clone();
        plain.object_lock = None;
        let opened = store::open(url, plain).await?;
        let Some(s3_store) = opened.s3() else { continue };
        match s3_store.bucket_lock().await {
            Ok(BucketLock::Enabled { default_retention }) => {
                if let Some(default) = default_retention {
                    warnings.push(format!(
                        "the bucket {bucket} ({flag}) has a default retention ({default}): it also locks what hcp-dr writes without --lock-for (the store fence, result records, a restore's staged snapshot); hcp-dr still replaces and deletes those through new versions and delete markers, but their old versions stay, billed, until it ends. --lock-for alone locks only the backups"
                    ));
                }
            }
            Ok(BucketLock::Disabled { why }) => {
                return Err(OpsError::Input(format!(
                    "--lock-for {}: the bucket {bucket} of {flag} {url} does not have S3 Object Lock enabled ({why}), so its objects cannot be locked: {}. Or drop --lock-for",
                    crate::duration::show(lock.retain_for),
                    how_to_enable(&bucket)
                )));
            }
            Err(err) => {
                return Err(OpsError::Input(format!(
                    "--lock-for: could not read the Object Lock configuration of the bucket {bucket} of {flag} {url} ({err}); it is checked before anything is locked or written: check the bucket's name and the credentials, which need s3:GetBucketObjectLockConfiguration on it"
                )));
            }
        }
    }
    Ok(warnings)
}

/// After a run with a lock: for a completed backup the retention S3 holds
/// on its manifest (a warning when it holds none); for a failed one, what
/// the lock kept of it (S3 refused to delete it, and hcp-dr hides nothing
/// behind delete markers), as a warning.
pub async fn after_run(store: &dyn Store, layout: &Layout, completed: bool, warnings: &mut Vec<String>) -> Option<LockReport> {
    let s3 = store.s3()?;
    let where_ = format!("{}/{}", store.url(), layout.dir());
    if completed {
        return match s3.retention(&layout.manifest()).await {
            Ok(Some(hold)) => match (hold.mode, hold.retain_until) {
                (Some(mode), Some(retain_until)) => Some(LockReport { mode, retain_until }),
                _ => {
                    warnings.push(format!("--lock-for: S3 reports no retention on {where_}/manifest.json: the backup is NOT locked (does the service honour Object Lock?)"));
                    None
                }
            },
            Ok(None) => None,
            Err(err) => {
                warnings.push(format!("--lock-for: the retention of {where_}/manifest.json could not be read back: {err}"));
                None
            }
        };
    }
    let stayed = stayed(store, s3, layout, warnings).await?;
    let listed_as = if stayed.manifest {
        "its manifest stayed with them, so `backups list` shows it as a complete backup (it is whole: the run failed after writing it); `backups prune` treats it as any other"
    } else {
        "`backups list` shows them as an incomplete backup, which `backups prune` removes once the retention has ended and it is older than --incomplete-after"
    };
    warnings.push(format!(
        "{} object(s) of the failed backup stay in {where_}{}: S3 refuses to delete them before, so the undo kept them (nothing is hidden behind delete markers); {listed_as}",
        stayed.objects,
        stayed.held()
    ));
    None
}

/// After `backups copy --lock-for` failed to copy a backup (damaged at the
/// source): what it had written of it stays at the destination under its
/// retention, as a warning. Its manifest is never among them.
pub async fn after_failed_copy(store: &dyn Store, layout: &Layout, warnings: &mut Vec<String>) {
    let Some(s3) = store.s3() else { return };
    if let Some(stayed) = stayed(store, s3, layout, warnings).await {
        warnings.push(format!(
            "{} object(s) of the failed copy stay in {}/{}{}: S3 refuses to delete them before; `backups list` shows them there as an incomplete backup, which `backups prune` removes once the retention has ended and it is older than --incomplete-after",
            stayed.objects,
            store.url(),
            layout.dir(),
            stayed.held()
        ));
    }
}

/// What a failed run left of a backup folder in a bucket with Object Lock.
struct Stayed {
    objects: usize,
    hold: Option<FolderHold>,
    /// Its manifest is among them.
    manifest: bool,
}

impl Stayed {
    /// ", under S3 Object Lock (COMPLIANCE) until ...", or nothing.
    fn held(&self) -> String {
        self.hold.as_ref().map(|h| format!(", {}", h.describe())).unwrap_or_default()
    }
}

/// What is left in `layout`'s folder, and what holds it; `None` when
/// nothing is (a warning when it could not be listed).
async fn stayed(store: &dyn Store, s3: &S3Store, layout: &Layout, warnings: &mut Vec<String>) -> Option<Stayed> {
    let where_ = format!("{}/{}", store.url(), layout.dir());
    let left = match store.list(&format!("{}/", layout.dir())).await {
        Ok(left) if !left.is_empty() => left,
        Ok(_) => return None,
        Err(err) => {
            warnings.push(format!("--lock-for: what the failed run left in {where_} could not be listed: {err}"));
            return None;
        }
    };
    let hold = match s3.holds(&format!("{}/", layout.dir())).await {
        Ok(holds) => FolderHold::of(&holds, Utc::now()),
        Err(err) => {
            warnings.push(format!("--lock-for: the retention of what the failed run left in {where_} could not be read: {err}"));
            None
        }
    };
    Some(Stayed { objects: left.len(), manifest: left.iter().any(|o| o.key == layout.manifest()), hold })
}
