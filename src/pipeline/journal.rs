//! The journal: an append-only, fsynced JSON-lines log of what a pipeline run
//! did, stage by stage. It is the only state a crashed run leaves behind, and
//! `--resume` rebuilds the run from it.
//!
//! Each stage moves through a small state machine (as in steno's sagas):
//!
//! ```text
//! NotStarted -> Started -> Succeeded -> UndoStarted -> Undone
//!                  |                        |
//!                  +-> Failed -> UndoStarted +-> UndoFailed -> UndoStarted (retry)
//! ```
//!
//! `Progress` records may be appended while a stage is `Started`: a stage that
//! changes a cluster writes what it is about to change (for example the
//! previous `pausedUntil` values) before changing it, so that a crash in the
//! middle of the stage can still be undone. Illegal transitions are rejected
//! both when writing and when replaying.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Errors of reading or writing a journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The journal file could not be created, opened, written or synced.
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line of the journal is not a journal record.
    #[error("journal {path}, line {line}: not a journal record: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// The journal does not start with a header record.
    #[error("journal {path} has no header: it was not written by hcp-dr or is empty")]
    NoHeader { path: PathBuf },
    /// Another process has the journal open: a run, or a resume or abort of it.
    #[error(
        "journal {path} is in use by another hcp-dr process (the run itself, or a --resume or --abort of it): \
         wait for that process to end, or stop it with Ctrl-C, then run the command again"
    )]
    Busy { path: PathBuf },
    /// A record would move a stage through an illegal transition.
    #[error("journal: stage `{stage}` cannot go from {from:?} to {to:?}")]
    IllegalTransition {
        stage: String,
        from: StageState,
        to: StageState,
    },
}

/// The first record of every journal: what was run, with which inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The operation (`backup`, `restore`, `migrate`, ...).
    pub operation: String,
    /// The playbook's name and its stage names, as run.
    pub playbook: String,
    pub stages: Vec<String>,
    /// The operation's inputs, enough to rebuild its context on `--resume`
    /// (never secrets).
    pub inputs: Value,
    /// hcp-dr version that wrote the journal.
    pub tool_version: String,
    /// The management clusters this run changes, as it reached them: an undo
    /// or a resume refuses any other cluster. Empty in journals written
    /// before hcp-dr recorded them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterBinding>,
    /// Unique per run: objects the run creates carry it (annotation
    /// [`RUN_ANNOTATION`]) so an undo can tell them from same-named objects
    /// someone else made.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run_id: String,
}

/// The annotation naming the run (journal `run_id`) that created an object.
pub use crate::hosted::RUN_ANNOTATION;

/// One management cluster a run changes: how it was reached (never
/// credentials) and what identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterBinding {
    /// What the cluster is to the operation: `management`, `source`,
    /// `destination`, `staging`.
    pub role: String,
    /// The API server URL the client used.
    pub server: String,
    /// The UID of the cluster's `kube-system` namespace: stable for the
    /// life of a cluster, different for every cluster. `None` when the
    /// caller may not read it (then the server URL is compared).
    #[serde(default)]
    pub kube_system_uid: Option<String>,
    /// The kubeconfig file(s) used (absolute; `None`: in-cluster config).
    #[serde(default)]
    pub kubeconfig: Option<String>,
    /// The kubeconfig context used (resolved when it was the current one).
    #[serde(default)]
    pub context: Option<String>,
}

impl ClusterBinding {
    /// The cluster's identity without how it was reached.
    pub fn management_cluster(&self) -> crate::archive::ManagementCluster {
        crate::archive::ManagementCluster {
            server: self.server.trim_end_matches('/').to_string(),
            kube_system_uid: self.kube_system_uid.clone(),
        }
    }

    /// Whether `other` (what a client reaches now) is the cluster this run
    /// changed: same kube-system UID when both are known, else same server.
    pub fn same_cluster(&self, other: &ClusterBinding) -> bool {
        self.management_cluster().same_cluster(&other.management_cluster())
    }

    /// `https://host:6443 (kube-system 1234-...)`.
    pub fn describe(&self) -> String {
        self.management_cluster().describe()
    }
}

/// What happened to a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run began (always the first record).
    Begin { header: Header },
    Started { stage: String },
    /// Data a stage records before changing something, for undo after a crash.
    Progress { stage: String, data: Value },
    Succeeded { stage: String, output: Value },
    Failed { stage: String, error: String },
    UndoStarted { stage: String },
    Undone { stage: String },
    UndoFailed { stage: String, error: String },
    /// The stage failed and the playbook stops on failure: nothing is undone
    /// until `--abort`; `--resume` runs the stage again.
    Halted { stage: String, error: String },
    /// The run ended; `outcome` is `succeeded`, `undone` or `aborted`.
    End { outcome: String },
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub event: Event,
}

/// Where a stage stands, derived from the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageState {
    NotStarted,
    Started,
    Succeeded,
    Failed,
    UndoStarted,
    Undone,
    UndoFailed,
    /// Failed under a stop-on-failure playbook: kept as it is, to be retried
    /// by `--resume` or undone by `--abort`.
    Halted,
}

impl StageState {
    /// Whether `to` may follow `self`.
    pub fn can_go_to(self, to: StageState) -> bool {
        use StageState::*;
        matches!(
            (self, to),
            (NotStarted, Started)
                | (Started, Succeeded)
                | (Started, Failed)
                // a crash left it started; resume reruns it
                | (Started, Started)
                | (Succeeded, UndoStarted)
                | (Failed, UndoStarted)
                | (Started, UndoStarted)
                | (UndoStarted, Undone)
                | (UndoStarted, UndoFailed)
                | (UndoStarted, UndoStarted)
                | (UndoFailed, UndoStarted)
                | (Started, Halted)
                | (Halted, Started)
                | (Halted, UndoStarted)
        )
    }
}

/// Everything known about one stage after replaying the journal.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRecord {
    pub state: StageState,
    pub output: Option<Value>,
    /// The last `Progress` data, if any.
    pub progress: Option<Value>,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl Default for StageRecord {
    fn default() -> Self {
        StageRecord {
            state: StageState::NotStarted,
            output: None,
            progress: None,
            error: None,
            started_at: None,
            finished_at: None,
        }
    }
}

/// The state of a run, rebuilt from its records.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalState {
    pub header: Header,
    pub stages: BTreeMap<String, StageRecord>,
    /// Set when an `End` record was written.
    pub outcome: Option<String>,
    /// Whether any stage failed or was undone: the run is on its way back.
    pub rolling_back: bool,
}

impl JournalState {
    fn new(header: Header) -> Self {
        JournalState {
            header,
            stages: BTreeMap::new(),
            outcome: None,
            rolling_back: false,
        }
    }

    /// The record of `stage` (NotStarted when absent).
    pub fn stage(&self, stage: &str) -> StageRecord {
        self.stages.get(stage).cloned().unwrap_or_default()
    }

    /// Apply one record, rejecting illegal transitions.
    pub fn apply(&mut self, record: &Record) -> Result<(), JournalError> {
        let (stage, to) = match &record.event {
            Event::Begin { .. } => return Ok(()),
            Event::End { outcome } => {
                self.outcome = Some(outcome.clone());
                return Ok(());
            }
            Event::Progress { stage, data } => {
                let entry = self.stages.entry(stage.clone()).or_default();
                if entry.state != StageState::Started {
                    return Err(JournalError::IllegalTransition {
                        stage: stage.clone(),
                        from: entry.state,
                        to: StageState::Started,
                    });
                }
                entry.progress = Some(data.clone());
                return Ok(());
            }
            Event::Started { stage } => (stage, StageState::Started),
            Event::Succeeded { stage, .. } => (stage, StageState::Succeeded),
            Event::Failed { stage, .. } => (stage, StageState::Failed),
            Event::UndoStarted { stage } => (stage, StageState::UndoStarted),
            Event::Undone { stage } => (stage, StageState::Undone),
            Event::UndoFailed { stage, .. } => (stage, StageState::UndoFailed),
            Event::Halted { stage, .. } => (stage, StageState::Halted),
        };
        let entry = self.stages.entry(stage.clone()).or_default();
        if !entry.state.can_go_to(to) {
            return Err(JournalError::IllegalTransition {
                stage: stage.clone(),
                from: entry.state,
                to,
            });
        }
        entry.state = to;
        match &record.event {
            Event::Started { .. } => {
                entry.started_at = Some(record.at);
                entry.finished_at = None;
                entry.error = None;
            }
            Event::Succeeded { output, .. } => {
                entry.output = Some(output.clone());
                entry.finished_at = Some(record.at);
            }
            Event::Failed { error, .. } | Event::UndoFailed { error, .. } => {
                entry.error = Some(error.clone());
                entry.finished_at = Some(record.at);
                self.rolling_back = true;
            }
            Event::Halted { error, .. } => {
                entry.error = Some(error.clone());
                entry.finished_at = Some(record.at);
            }
            Event::UndoStarted { .. } | Event::Undone { .. } => self.rolling_back = true,
            _ => {}
        }
        Ok(())
    }
}

/// Take the journal's advisory lock for as long as `file` is open; the
/// kernel releases it when the process dies, so a killed run never leaves
/// its journal locked.
fn lock(file: &File, path: &Path) -> Result<(), JournalError> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => Err(JournalError::Busy { path: path.to_path_buf() }),
        Err(std::fs::TryLockError::Error(source)) => Err(JournalError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// An open journal file, appended to and fsynced record by record.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    state: JournalState,
}

impl Journal {
    /// Create a new journal (refusing to overwrite an existing file) and write its header.
    pub fn create(path: &Path, header: Header) -> Result<Journal, JournalError> {
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut options = OpenOptions::new();
        options.create_new(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let file = options.open(path).map_err(io)?;
        lock(&file, path)?;
        let mut journal = Journal {
            path: path.to_path_buf(),
            file,
            state: JournalState::new(header.clone()),
        };
        journal.append(Event::Begin { header })?;
        Ok(journal)
    }

    /// Open an existing journal for `--resume`: replay every record, then append.
    /// Refused while another process holds it (two aborts at once would each
    /// undo what the other is undoing).
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|source| JournalError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        lock(&file, path)?;
        let state = Self::read(path)?;
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            state,
        })
    }

    /// Read and replay a journal without opening it for writing. A torn last
    /// line (the process died mid-write) is ignored; any other bad line is an error.
    pub fn read(path: &Path) -> Result<JournalState, JournalError> {
        let io = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let lines: Vec<String> = BufReader::new(file)
            .lines()
            .collect::<Result<_, _>>()
            .map_err(io)?;
        let mut state: Option<JournalState> = None;
        let last = lines.len();
        for (index, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record: Record = match serde_json::from_str(line) {
                Ok(record) => record,
                Err(_) if index + 1 == last && !line.ends_with('}') => break,
                Err(source) => {
                    return Err(JournalError::Parse {
                        path: path.to_path_buf(),
                        line: index + 1,
                        source,
                    });
                }
            };
            match (&mut state, &record.event) {
                (None, Event::Begin { header }) => state = Some(JournalState::new(header.clone())),
                (None, _) => {
                    return Err(JournalError::NoHeader {
                        path: path.to_path_buf(),
                    });
                }
                (Some(state), _) => state.apply(&record)?,
            }
        }
        state.ok_or_else(|| JournalError::NoHeader {
            path: path.to_path_buf(),
        })
    }

    /// Validate, write and fsync one record.
    pub fn append(&mut self, event: Event) -> Result<(), JournalError> {
        let record = Record {
            at: Utc::now(),
            event,
        };
        self.state.apply(&record)?;
        let mut line = serde_json::to_string(&record).map_err(|source| JournalError::Parse {
            path: self.path.clone(),
            line: 0,
            source,
        })?;
        line.push('\n');
        let io = |source| JournalError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.write_all(line.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)
    }

    pub fn state(&self) -> &JournalState {
        &self.state
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn header() -> Header {
        Header {
            operation: "backup".into(),
            playbook: "backup".into(),
            stages: vec!["pause".into(), "scale-down".into()],
            inputs: json!({"hosted_cluster": "demo"}),
            tool_version: "test".into(),
            clusters: Vec::new(),
            run_id: "r1".into(),
        }
    }

    #[test]
    fn records_round_trip_and_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.journal");
        let mut journal = Journal::create(&path, header()).unwrap();
        journal.append(Event::Started { stage: "pause".into() }).unwrap();
        journal
            .append(Event::Progress {
                stage: "pause".into(),
                data: json!({"previous": null}),
            })
            .unwrap();
        journal
            .append(Event::Succeeded {
                stage: "pause".into(),
                output: json!({"until": "2026-01-01T00:00:00Z"}),
            })
            .unwrap();
        journal.append(Event::Started { stage: "scale-down".into() }).unwrap();
        // not reopened while it is open (a second --abort of a running one)
        assert!(matches!(Journal::open(&path), Err(JournalError::Busy { .. })));
        drop(journal);

        let state = Journal::read(&path).unwrap();
        assert_eq!(state.header, header());
        assert_eq!(state.stage("pause").state, StageState::Succeeded);
        assert_eq!(state.stage("pause").progress, Some(json!({"previous": null})));
        assert_eq!(state.stage("pause").output, Some(json!({"until": "2026-01-01T00:00:00Z"})));
        assert_eq!(state.stage("scale-down").state, StageState::Started);
        assert_eq!(state.stage("export").state, StageState::NotStarted);
        assert!(!state.rolling_back);

        // reopening appends after the existing records
        let mut journal = Journal::open(&path).unwrap();
        journal
            .append(Event::Failed {
                stage: "scale-down".into(),
                error: "timeout".into(),
            })
            .unwrap();
        let state = Journal::read(&path).unwrap();
        assert_eq!(state.stage("scale-down").state, StageState::Failed);
        assert_eq!(state.stage("scale-down").error.as_deref(), Some("timeout"));
        assert!(state.rolling_back);
    }

    #[test]
    fn illegal_transitions_are_rejected_when_writing() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::create(&dir.path().join("j"), header()).unwrap();
        let err = journal
            .append(Event::Succeeded {
                stage: "pause".into(),
                output: Value::Null,
            })
            .unwrap_err();
        assert!(matches!(
            err,
            JournalError::IllegalTransition {
                from: StageState::NotStarted,
                to: StageState::Succeeded,
                ..
            }
        ));
        let err = journal
            .append(Event::Undone { stage: "pause".into() })
            .unwrap_err();
        assert!(matches!(err, JournalError::IllegalTransition { .. }));
        journal.append(Event::Started { stage: "pause".into() }).unwrap();
        journal
            .append(Event::Succeeded {
                stage: "pause".into(),
                output: Value::Null,
            })
            .unwrap();
        // a succeeded stage cannot succeed again or go back to started
        assert!(journal.append(Event::Started { stage: "pause".into() }).is_err());
    }

    #[test]
    fn illegal_transitions_are_rejected_when_replaying() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        Journal::create(&path, header()).unwrap();
        let bad = Record {
            at: Utc::now(),
            event: Event::Undone { stage: "pause".into() },
        };
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(file, "{}", serde_json::to_string(&bad).unwrap()).unwrap();
        assert!(matches!(
            Journal::read(&path),
            Err(JournalError::IllegalTransition { .. })
        ));
    }

    #[test]
    fn a_torn_last_line_is_ignored_but_garbage_elsewhere_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = Journal::create(&path, header()).unwrap();
        journal.append(Event::Started { stage: "pause".into() }).unwrap();
        drop(journal);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        write!(file, "{{\"at\":\"2026-").unwrap();
        drop(file);
        assert_eq!(
            Journal::read(&path).unwrap().stage("pause").state,
            StageState::Started
        );

        let other = dir.path().join("k");
        std::fs::write(&other, "not json\n{}\n").unwrap();
        assert!(matches!(
            Journal::read(&other),
            Err(JournalError::Parse { line: 1, .. })
        ));
        std::fs::write(&other, "").unwrap();
        assert!(matches!(Journal::read(&other), Err(JournalError::NoHeader { .. })));
    }

    #[test]
    fn create_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        Journal::create(&path, header()).unwrap();
        assert!(matches!(
            Journal::create(&path, header()),
            Err(JournalError::Io { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn journal_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        Journal::create(&path, header()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
