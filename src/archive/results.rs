//! Results: what drills, verifies, restores and migrations found, kept in
//! the store beside the backups they were about, so the history of "could
//! we restore it, and how long did it take" exists without any cluster.
//!
//! ```text
//! <namespace>/<hosted-cluster>/results/<YYYYMMDDTHHMMSSZ>-<kind>-<xxxxxx>.json
//! ```
//!
//! One small JSON record per run, named by when it finished, so a listing
//! sorts by time. Nothing secret: names, times, verdicts, counts. `backups
//! list` and `prune` never see them (the folder is not a backup id); `hcp-dr
//! report` reads them. A record that does not parse is skipped with a
//! warning naming it, never taken for a result.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::pipeline::RunOutcome;
use crate::store::{Store, StoreError};

/// The folder, inside a cluster's folder, that holds its results.
pub const RESULTS: &str = "results";
/// The record format this code writes and reads.
pub const RESULT_VERSION: u32 = 1;
/// A record larger than this is not one hcp-dr wrote.
const MAX_RECORD_BYTES: usize = 256 * 1024;

/// What ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `hcp-dr drill`: restored under another name, checked, removed.
    Drill,
    /// `hcp-dr backups verify`.
    Verify,
    /// `hcp-dr restore`.
    Restore,
    /// `hcp-dr migrate`.
    Migrate,
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Drill => "drill",
            Kind::Verify => "verify",
            Kind::Restore => "restore",
            Kind::Migrate => "migrate",
        }
    }
}

/// One result record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    pub format_version: u32,
    pub kind: Kind,
    /// The backed-up cluster the run was about.
    pub namespace: String,
    pub hosted_cluster: String,
    /// The backup it read.
    pub backup_id: String,
    pub started: DateTime<Utc>,
    pub finished: DateTime<Utc>,
    /// The run did what it was for: the drill passed, the backup verified,
    /// the restore or migration finished with the cluster Available.
    pub passed: bool,
    /// One line: the verdict, or what failed.
    pub summary: String,
    /// Start of the run to the restored cluster Available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rto_seconds: Option<f64>,
    /// The backup's age when the run started: the writes a restore from it
    /// loses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpo_seconds: Option<f64>,
    /// Where it ran: the drill cluster, the destination management cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// What failed, by name (checks, problems, the failed stage).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    pub tool_version: String,
}

impl ResultRecord {
    /// A record of `kind` about one backup, finished now.
    pub fn new(kind: Kind, namespace: &str, hosted_cluster: &str, backup_id: &str, started: DateTime<Utc>, passed: bool, summary: String) -> ResultRecord {
        ResultRecord {
            format_version: RESULT_VERSION,
            kind,
            namespace: namespace.to_string(),
            hosted_cluster: hosted_cluster.to_string(),
            backup_id: backup_id.to_string(),
            started,
            finished: Utc::now(),
            passed,
            summary: summary.lines().next().unwrap_or_default().to_string(),
            rto_seconds: None,
            rpo_seconds: None,
            target: None,
            failures: Vec::new(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The record's key in the store.
    pub fn key(&self, suffix: &str) -> String {
        format!(
            "{}/{}/{RESULTS}/{}-{}-{suffix}.json",
            self.namespace,
            self.hosted_cluster,
            self.finished.format("%Y%m%dT%H%M%SZ"),
            self.kind.as_str()
        )
    }

    /// Parse a stored record: the version first, then the shape.
    pub fn parse(bytes: &[u8]) -> Result<ResultRecord, String> {
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let version: Version = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if version.format_version != RESULT_VERSION {
            return Err(format!("format version {} (this hcp-dr reads version {RESULT_VERSION})", version.format_version));
        }
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// One line on how a run ended: `restore succeeded`, `restore FAILED at
/// \`wait\`: ...`.
pub fn outcome_summary(operation: &str, outcome: &RunOutcome) -> String {
    match outcome {
        RunOutcome::Succeeded => format!("{operation} succeeded"),
        RunOutcome::Planned => format!("{operation} planned (dry run)"),
        RunOutcome::Aborted => format!("{operation} aborted"),
        RunOutcome::RolledBack { stage, error } | RunOutcome::Failed { stage, error } => format!("{operation} FAILED at `{stage}`: {error}"),
        RunOutcome::Stopped { stage, error } => format!("{operation} STOPPED at `{stage}`: {error}"),
        RunOutcome::UndoFailed { stage, error, .. } => format!("{operation} FAILED at `{stage}` and its undo failed: {error}"),
    }
}

/// Whether `key` is where a result record lives (`<ns>/<hc>/results/<file>.json`).
pub fn is_result_key(key: &str) -> bool {
    let parts: Vec<&str> = key.split('/').collect();
    parts.len() == 4 && parts[2] == RESULTS && parts[3].ends_with(".json")
}

/// Write `record` beside the backups of its cluster; returns its key.
pub async fn write(store: &dyn Store, record: &ResultRecord) -> Result<String, StoreError> {
    let key = record.key(&super::uuid_suffix());
    let mut body = serde_json::to_vec_pretty(record).unwrap_or_default();
    body.push(b'\n');
    store.put(&key, Box::new(&body[..])).await?;
    Ok(key)
}

/// Write `record`, and say where (or why not) as a line for the run's
/// report: a result that could not be stored never fails the run it
/// describes.
pub async fn write_noting(store: &dyn Store, record: &ResultRecord, warnings: &mut Vec<String>) -> Option<String> {
    match write(store, record).await {
        Ok(key) => Some(format!("{}/{key}", store.url())),
        Err(err) => {
            warnings.push(format!("the {} result was not stored in {}: {err}", record.kind.as_str(), store.url()));
            None
        }
    }
}

/// The results stored, oldest first, of every cluster or of one; records
/// that cannot be read are skipped, each with a warning naming it.
pub async fn read_all(store: &dyn Store, cluster: Option<(&str, &str)>) -> Result<(Vec<ResultRecord>, Vec<String>), StoreError> {
    let prefix = cluster.map(|(ns, hc)| format!("{ns}/{hc}/{RESULTS}/")).unwrap_or_default();
    let mut records = Vec::new();
    let mut warnings = Vec::new();
    for object in store.list(&prefix).await? {
        if !is_result_key(&object.key) {
            continue;
        }
        let skip = |why: String| format!("skipped {}/{}: not a result record hcp-dr reads ({why})", store.url(), object.key);
        if object.size as usize > MAX_RECORD_BYTES {
            warnings.push(skip(format!("{} bytes, more than a record ever holds", object.size)));
            continue;
        }
        let read = match crate::store::get_bytes(store, &object.key).await {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => continue,
            // a record that breaks off is skipped, as a truncated one is
            Err(err @ StoreError::Body { .. }) => Err(err.to_string()),
            Err(err) => return Err(err),
        };
        match read.and_then(|bytes| ResultRecord::parse(&bytes)) {
            Ok(record) => {
                let (ns, hc) = object.key.split_once('/').and_then(|(ns, rest)| Some((ns, rest.split_once('/')?.0))).unwrap_or_default();
                if record.namespace != ns || record.hosted_cluster != hc {
                    warnings.push(skip(format!("it names {}/{}, not the cluster whose folder holds it", record.namespace, record.hosted_cluster)));
                    continue;
                }
                records.push(record);
            }
            Err(why) => warnings.push(skip(why)),
        }
    }
    records.sort_by(|a, b| a.finished.cmp(&b.finished));
    Ok((records, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;

    #[tokio::test]
    async fn records_round_trip_and_bad_ones_are_skipped_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().to_path_buf());
        let started = Utc::now() - chrono::Duration::seconds(90);
        let mut drill = ResultRecord::new(Kind::Drill, "clusters", "demo", "20261129T080000Z-0a1b2c", started, true, "drill PASSED\nmore".into());
        drill.rto_seconds = Some(61.5);
        drill.rpo_seconds = Some(3600.0);
        let key = write(&store, &drill).await.unwrap();
        assert!(is_result_key(&key), "{key}");
        assert!(key.starts_with("clusters/demo/results/") && key.contains("-drill-"), "{key}");
        let verify = ResultRecord::new(Kind::Verify, "clusters", "other", "20261129T080000Z-0a1b2c", started, false, "verify FAILED".into());
        write(&store, &verify).await.unwrap();

        // a foreign file, a truncated record, one filed under another cluster
        let results = dir.path().join("clusters/demo/results");
        std::fs::write(results.join("notes.json"), b"{\"hello\": 1}").unwrap();
        let text = std::fs::read_to_string(dir.path().join(&key)).unwrap();
        std::fs::write(results.join("20261129T090000Z-drill-ffffff.json"), &text[..text.len() / 2]).unwrap();
        std::fs::create_dir_all(dir.path().join("clusters/x/results")).unwrap();
        std::fs::write(dir.path().join("clusters/x/results/moved.json"), &text).unwrap();
        std::fs::write(results.join("README.txt"), b"not a record").unwrap();

        let (records, warnings) = read_all(&store, None).await.unwrap();
        assert_eq!(records.len(), 2, "{records:?}");
        assert_eq!(records.iter().find(|r| r.kind == Kind::Drill).unwrap(), &drill);
        assert_eq!(drill.summary, "drill PASSED");
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        for name in ["notes.json", "20261129T090000Z-drill-ffffff.json", "clusters/x/results/moved.json"] {
            assert!(warnings.iter().any(|w| w.contains(name)), "{name}: {warnings:?}");
        }
        let (one, _) = read_all(&store, Some(("clusters", "other"))).await.unwrap();
        assert_eq!(one, vec![verify]);
    }
}
