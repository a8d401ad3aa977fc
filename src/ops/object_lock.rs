//! S3 Object Lock in operations: the up-front check that every store a
//! `backup --lock-for` or `backups copy --lock-for` writes to is an S3
//! bucket with Object Lock; what their reports say of the lock afterwards;
//! and the lock `backups list` and `describe` show. All of it read back
//! from S3 (the objects' retention is the truth; the manifest does not
//! record it).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OpsError;
use crate::archive::Layout;
use crate::store::object_lock::{BucketLock, FolderHold, LockMode, ObjectHold, ObjectLock, how_to_enable};
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

/// Whether the backups of a store can be held by S3 Object Lock, for
/// `backups list` and `describe`: asked once per store
/// (GetObjectLockConfiguration), so a store without it costs nothing more.
pub enum StoreLocking<'a> {
    /// A local store, or a bucket without Object Lock: nothing is held.
    Off,
    /// A bucket with Object Lock: each manifest's retention says.
    On(&'a S3Store),
    /// The bucket's configuration could not be read (its lock is unknown):
    /// why, with what the credentials need.
    Unknown(String),
}

/// Whether `store`'s backups can be locked. Never an error: a store whose
/// configuration is refused (credentials without
/// `s3:GetBucketObjectLockConfiguration`) still lists, its lock unknown.
pub async fn locking_of(store: &dyn Store) -> StoreLocking<'_> {
    let Some(s3) = store.s3() else { return StoreLocking::Off };
    match s3.bucket_lock().await {
        Ok(BucketLock::Enabled { .. }) => StoreLocking::On(s3),
        Ok(BucketLock::Disabled { .. }) => StoreLocking::Off,
        Err(err) => StoreLocking::Unknown(format!(
            "whether the bucket {} has S3 Object Lock could not be read ({err}); to see which backups are held, the credentials need s3:GetBucketObjectLockConfiguration on it",
            s3.bucket()
        )),
    }
}

/// What S3 Object Lock does to one backup now, read from its manifest (the
/// last object written, so the one held longest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LockState {
    /// S3 refuses to delete it: until `retain_until` (in `mode`), and for
    /// as long as a legal hold is on.
    Held {
        #[serde(skip_serializing_if = "Option::is_none")]
        mode: Option<LockMode>,
        #[serde(skip_serializing_if = "Option::is_none")]
        retain_until: Option<DateTime<Utc>>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        legal_hold: bool,
    },
    /// Nothing holds it: its retention ended (`ended`), or it never had one
    /// (written without `--lock-for`).
    NotHeld {
        #[serde(skip_serializing_if = "Option::is_none")]
        ended: Option<DateTime<Utc>>,
    },
    /// Not known: why.
    Unknown { why: String },
}

impl LockState {
    /// What `hold` (the manifest's) does at `now`.
    pub fn of(hold: &ObjectHold, now: DateTime<Utc>) -> LockState {
        let running = hold.retain_until.filter(|until| *until > now);
        if hold.holds_at(now) {
            LockState::Held { mode: running.and(hold.mode), retain_until: running, legal_hold: hold.legal_hold }
        } else {
            LockState::NotHeld { ended: hold.retain_until }
        }
    }

    /// The lock of the backup `layout` in a bucket with Object Lock: one
    /// HeadObject of its manifest.
    pub async fn read(s3: &S3Store, layout: &Layout, now: DateTime<Utc>) -> LockState {
        match s3.retention(&layout.manifest()).await {
            Ok(Some(hold)) => LockState::of(&hold, now),
            Ok(None) => LockState::Unknown { why: format!("{}/{} is gone", s3.url(), layout.manifest()) },
            Err(err) => LockState::Unknown { why: err.to_string() },
        }
    }

    /// "COMPLIANCE until 2026-12-01T10:00:00Z", "legal hold", "ended
    /// 2026-...", "none", "unknown": a cell of `backups list`.
    pub fn short(&self) -> String {
        match self {
            LockState::Held { mode, retain_until, legal_hold } => {
                let mut parts = Vec::new();
                if let Some(until) = retain_until {
                    parts.push(format!("{} until {}", mode.map(LockMode::s3_name).unwrap_or("retention"), secs(*until)));
                }
                if *legal_hold {
                    parts.push("legal hold".to_string());
                }
                parts.join(" + ")
            }
            LockState::NotHeld { ended: Some(ended) } => format!("ended {}", secs(*ended)),
            LockState::NotHeld { ended: None } => "none".to_string(),
            LockState::Unknown { .. } => "unknown".to_string(),
        }
    }

    /// One sentence, for `backups describe`.
    pub fn describe(&self) -> String {
        match self {
            LockState::Held { legal_hold: true, retain_until: None, .. } => {
                "held by an S3 legal hold: nobody can delete it until someone with s3:PutObjectLegalHold removes the hold".to_string()
            }
            LockState::Held { .. } => format!("held by S3 Object Lock, {}: nobody can delete it before", self.short()),
            LockState::NotHeld { ended: Some(ended) } => {
                format!("not held: its S3 Object Lock retention ended {}; `backups prune` may delete it", secs(*ended))
            }
            LockState::NotHeld { ended: None } => "not held: written without a retention (the bucket has S3 Object Lock; `backup --lock-for` or `backups copy --lock-for` locks)".to_string(),
            LockState::Unknown { why } => format!("UNKNOWN: {why}"),
        }
    }
}

fn secs(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::object_lock::tests::{at, hold};

    #[test]
    fn a_manifests_hold_as_list_and_describe_say_it() {
        let now = at("2026-11-29T10:00:00Z");
        let held = LockState::of(&hold(Some("2026-12-01T10:00:00Z"), false), now);
        assert_eq!(held, LockState::Held { mode: Some(LockMode::Compliance), retain_until: Some(at("2026-12-01T10:00:00Z")), legal_hold: false });
        assert_eq!(held.short(), "COMPLIANCE until 2026-12-01T10:00:00Z");
        assert_eq!(
            serde_json::to_value(&held).unwrap(),
            serde_json::json!({"state": "held", "mode": "compliance", "retain_until": "2026-12-01T10:00:00Z"})
        );
        let ended = LockState::of(&hold(Some("2026-11-28T10:00:00Z"), false), now);
        assert_eq!(ended, LockState::NotHeld { ended: Some(at("2026-11-28T10:00:00Z")) });
        assert!(ended.describe().contains("ended 2026-11-28T10:00:00Z"), "{}", ended.describe());
        // a legal hold past its retention: held, with no date
        let legal = LockState::of(&hold(Some("2026-11-28T10:00:00Z"), true), now);
        assert_eq!(legal, LockState::Held { mode: None, retain_until: None, legal_hold: true });
        assert_eq!(legal.short(), "legal hold");
        let none = LockState::of(&ObjectHold { mode: None, ..hold(None, false) }, now);
        assert_eq!((none.short().as_str(), serde_json::to_value(&none).unwrap()), ("none", serde_json::json!({"state": "not_held"})));
        // a bucket whose configuration is refused: listed all the same, its lock unknown
        let unknown = LockState::Unknown { why: "AccessDenied".into() };
        assert_eq!((unknown.short().as_str(), unknown.describe().as_str()), ("unknown", "UNKNOWN: AccessDenied"));
        assert_eq!(serde_json::to_value(&unknown).unwrap(), serde_json::json!({"state": "unknown", "why": "AccessDenied"}));
    }
}
