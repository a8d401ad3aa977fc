//! S3 Object Lock for backups (`backup --lock-for`, `backups copy
//! --lock-for`): what a lock asks of S3, what S3 says a bucket and an
//! object hold, and the pure decisions on them (is a folder still held,
//! and until when; what an object a copy finds already there should
//! hold). The requests themselves are the S3 store's ([`super::S3Store`]).
//!
//! Only the backup's own objects are written with a retention (snapshots,
//! objects archive, volumes, `SHA256SUMS`, `manifest.json`): the store
//! fence and the result records beside the backups, and the staging of a
//! restore, are written without one, so hcp-dr can go on overwriting and
//! deleting them in a bucket whose backups nobody can delete.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// S3's two retention modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    /// Nobody can delete or shorten it before it ends, not even the
    /// account's root user.
    #[default]
    Compliance,
    /// Principals with `s3:BypassGovernanceRetention` can delete it early
    /// (hcp-dr never does).
    Governance,
}

impl LockMode {
    /// As S3 spells it (`COMPLIANCE`, `GOVERNANCE`).
    pub fn s3_name(self) -> &'static str {
        match self {
            LockMode::Compliance => "COMPLIANCE",
            LockMode::Governance => "GOVERNANCE",
        }
    }

    pub(crate) fn to_sdk(self) -> aws_sdk_s3::types::ObjectLockMode {
        match self {
            LockMode::Compliance => aws_sdk_s3::types::ObjectLockMode::Compliance,
            LockMode::Governance => aws_sdk_s3::types::ObjectLockMode::Governance,
        }
    }

    /// S3's name of a mode, as HeadObject or a bucket's default retention gives it.
    pub fn from_s3(name: &str) -> Option<LockMode> {
        match name.to_ascii_uppercase().as_str() {
            "COMPLIANCE" => Some(LockMode::Compliance),
            "GOVERNANCE" => Some(LockMode::Governance),
            _ => None,
        }
    }
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.s3_name())
    }
}

/// The lock a backup asks for: each of its objects is retained for
/// `retain_for` from when it is written, in `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectLock {
    pub mode: LockMode,
    #[serde(with = "seconds")]
    pub retain_for: Duration,
}

impl ObjectLock {
    /// The retain-until date of an object written at `now`, in whole
    /// seconds (S3 keeps no finer), rounded up so it never falls short.
    pub fn until(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let until = now + crate::duration::to_chrono(self.retain_for);
        let whole = until.timestamp() + i64::from(until.timestamp_subsec_nanos() > 0);
        DateTime::from_timestamp(whole, 0).unwrap_or(until)
    }

    /// The retention to give an object `backups copy` found already at
    /// the destination with the right bytes, if any: `(mode, until)`.
    ///
    /// As if this lock had written it, it is held `retain_for` from when it
    /// was written there (`written`), in its own mode (S3 never turns
    /// COMPLIANCE into GOVERNANCE, nor GOVERNANCE into COMPLIANCE without
    /// `s3:BypassGovernanceRetention`). One that holds no retention at all
    /// (copied without `--lock-for`) is locked from `now`, once: the next
    /// run finds it held. A retention that ends then or later is left as it
    /// is, and so is one whose due date has passed: running the copy again
    /// and again never pushes a backup's lock further, or `backups prune`
    /// could never remove it.
    pub fn for_present(&self, hold: &ObjectHold, written: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<(LockMode, DateTime<Utc>)> {
        match (hold.mode, hold.retain_until) {
            (Some(mode), Some(until)) => {
                let due = self.until(written?);
                (due > until && due > now).then_some((mode, due))
            }
            _ => Some((self.mode, self.until(now))),
        }
    }
}

mod seconds {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        <u64 as serde::Deserialize>::deserialize(d).map(Duration::from_secs)
    }
}

/// Whether a bucket has Object Lock, as GetObjectLockConfiguration says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketLock {
    /// Enabled (the bucket is versioned), with its default retention if it
    /// has one (`COMPLIANCE 30 days`): that one applies to every object
    /// written without a retention of its own, the store fence included.
    Enabled { default_retention: Option<String> },
    /// Not enabled, or a service without Object Lock: why.
    Disabled { why: String },
}

/// What holds one object version: a retention that has not ended, a legal
/// hold, or an event hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectHold {
    pub key: String,
    pub version_id: Option<String>,
    pub mode: Option<LockMode>,
    pub retain_until: Option<DateTime<Utc>>,
    /// A legal hold (or an event hold) is on: no date ends it, only its removal.
    pub legal_hold: bool,
}

impl ObjectHold {
    /// Whether S3 refuses to delete this version at `now`.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        self.legal_hold || self.retain_until.is_some_and(|until| until > now)
    }
}

/// What still holds a set of object versions (a backup's folder) at `now`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FolderHold {
    /// The retention that ends last, and its mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
    /// Versions under a legal (or event) hold: kept until it is removed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub legal_hold: bool,
    /// How many versions are held.
    pub versions: usize,
}

impl FolderHold {
    /// The holds of `versions` that still hold at `now`; `None` when none does.
    pub fn of(versions: &[ObjectHold], now: DateTime<Utc>) -> Option<FolderHold> {
        let held: Vec<&ObjectHold> = versions.iter().filter(|v| v.holds_at(now)).collect();
        if held.is_empty() {
            return None;
        }
        let last = held.iter().filter(|v| v.retain_until.is_some_and(|u| u > now)).max_by_key(|v| v.retain_until);
        Some(FolderHold {
            until: last.and_then(|v| v.retain_until),
            mode: last.and_then(|v| v.mode),
            legal_hold: held.iter().any(|v| v.legal_hold),
            versions: held.len(),
        })
    }

    /// "under S3 Object Lock (COMPLIANCE) until 2026-12-01T10:00:00Z", for
    /// a reason or a warning.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(until) = self.until {
            parts.push(format!(
                "under S3 Object Lock ({}) until {}",
                self.mode.map(LockMode::s3_name).unwrap_or("retention"),
                until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
        }
        if self.legal_hold {
            parts.push("under an S3 legal hold (kept until someone with s3:PutObjectLegalHold removes it)".to_string());
        }
        parts.join(" and ")
    }
}

/// How to enable Object Lock on `bucket`, for the refusal of `--lock-for`.
pub fn how_to_enable(bucket: &str) -> String {
    format!(
        "enable it on a new bucket with `aws s3api create-bucket --bucket NAME --object-lock-enabled-for-bucket`, \
         or on this one (versioning first) with `aws s3api put-bucket-versioning --bucket {bucket} --versioning-configuration Status=Enabled` \
         then `aws s3api put-object-lock-configuration --bucket {bucket} --object-lock-configuration ObjectLockEnabled=Enabled`"
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An RFC 3339 time.
    pub(crate) fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// A COMPLIANCE retention until `until` (none: no retention), and a legal hold or not.
    pub(crate) fn hold(until: Option<&str>, legal: bool) -> ObjectHold {
        ObjectHold { key: "k".into(), version_id: None, mode: Some(LockMode::Compliance), retain_until: until.map(at), legal_hold: legal }
    }

    #[test]
    fn until_is_whole_seconds_rounded_up() {
        let lock = ObjectLock { mode: LockMode::Compliance, retain_for: Duration::from_secs(30) };
        assert_eq!(lock.until(at("2026-11-29T10:00:00Z")), at("2026-11-29T10:00:30Z"));
        assert_eq!(lock.until(at("2026-11-29T10:00:00.001Z")), at("2026-11-29T10:00:31Z"));
    }

    #[test]
    fn a_folder_is_held_until_its_last_retention_or_while_a_legal_hold_is_on() {
        let now = at("2026-11-29T10:00:00Z");
        assert_eq!(FolderHold::of(&[hold(Some("2026-11-29T09:00:00Z"), false), hold(None, false)], now), None, "expired retention and none");
        let held = FolderHold::of(&[hold(Some("2026-11-29T11:00:00Z"), false), hold(Some("2026-11-29T12:00:00Z"), false), hold(Some("2026-11-29T09:00:00Z"), false)], now).unwrap();
        assert_eq!((held.until, held.versions, held.legal_hold), (Some(at("2026-11-29T12:00:00Z")), 2, false));
        assert_eq!(held.describe(), "under S3 Object Lock (COMPLIANCE) until 2026-11-29T12:00:00Z");
        let legal = FolderHold::of(&[hold(Some("2026-11-29T09:00:00Z"), true)], now).unwrap();
        assert_eq!((legal.until, legal.legal_hold), (None, true));
        assert!(legal.describe().contains("legal hold"), "{}", legal.describe());
    }

    #[test]
    fn an_object_found_at_a_copys_destination_is_held_from_when_it_was_written_there_and_never_pushed_further() {
        let lock = ObjectLock { mode: LockMode::Compliance, retain_for: Duration::from_secs(3600) };
        let now = at("2026-11-29T10:00:00Z");
        let written = Some(at("2026-11-29T09:30:00Z"));
        // none at all: locked from now
        assert_eq!(lock.for_present(&hold(None, false), written, now), Some((LockMode::Compliance, at("2026-11-29T11:00:00Z"))));
        // as long as asked from when it was written, or longer: left
        assert_eq!(lock.for_present(&hold(Some("2026-11-29T10:30:00Z"), false), written, now), None);
        assert_eq!(lock.for_present(&hold(Some("2026-12-29T10:30:00Z"), false), written, now), None);
        // shorter (an earlier run's shorter --lock-for): lengthened to an hour from when it was written
        assert_eq!(lock.for_present(&hold(Some("2026-11-29T10:05:00Z"), false), written, now), Some((LockMode::Compliance, at("2026-11-29T10:30:00Z"))));
        // in its own mode: a GOVERNANCE retention stays GOVERNANCE
        let governed = ObjectHold { mode: Some(LockMode::Governance), ..hold(Some("2026-11-29T10:05:00Z"), false) };
        assert_eq!(lock.for_present(&governed, written, now), Some((LockMode::Governance, at("2026-11-29T10:30:00Z"))));
        // its due date passed: nothing to do, however often the copy runs
        assert_eq!(lock.for_present(&hold(Some("2026-11-29T08:00:00Z"), false), Some(at("2026-11-29T07:00:00Z")), now), None);
        // when it was written is unknown: a retention it holds is left
        assert_eq!(lock.for_present(&hold(Some("2026-11-29T09:00:00Z"), false), None, now), None);
    }

    #[test]
    fn modes_as_s3_spells_them() {
        assert_eq!(LockMode::from_s3("GOVERNANCE"), Some(LockMode::Governance));
        assert_eq!(LockMode::from_s3("compliance"), Some(LockMode::Compliance));
        assert_eq!(LockMode::from_s3("other"), None);
        let lock: ObjectLock = serde_json::from_str(r#"{"mode":"governance","retain_for":86400}"#).unwrap();
        assert_eq!(lock, ObjectLock { mode: LockMode::Governance, retain_for: Duration::from_secs(86400) });
    }
}
