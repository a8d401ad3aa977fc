//! The stages operations are made of, one file each. Backup's are listed in
//! `playbooks/backup.yaml`; [`backup_catalog`] is what that playbook may name.

pub mod cluster_destroy;
pub mod context;
pub mod deadline_pause;
pub mod drill;
pub mod etcd_access;
pub mod etcd_members;
pub mod etcd_ops;
pub mod etcd_restore;
pub mod etcd_snapshot;
pub mod export;
pub mod fence;
pub mod lock;
pub mod migrate;
pub mod package;
pub mod params;
pub mod pause;
pub mod preflight;
pub mod reconcile;
pub mod restore;
pub mod resume;
pub mod scale_down;

use crate::pipeline::{Catalog, StageRules};
use context::BackupContext;

/// Why a stage refused to go on (the adapters' errors pass through as they are).
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A precondition does not hold; the message says what and how to fix it.
    #[error("{0}")]
    Precondition(String),
    /// Another run holds the hosted cluster.
    #[error("{0}")]
    Locked(String),
    /// A stage needed something an earlier stage should have produced.
    #[error("internal: {0} (an earlier stage did not run; resume with the same playbook)")]
    Missing(&'static str),
    /// The journaled output of a stage cannot be read back.
    #[error("journaled output of `{stage}`: {message}")]
    Output { stage: &'static str, message: String },
}

/// Every backup stage, by name.
pub fn backup_catalog() -> Catalog<BackupContext> {
    Catalog::default()
        .with(lock::Lock)
        .with(preflight::Preflight)
        .with(pause::Pause)
        .with(scale_down::ScaleDown)
        .with(etcd_snapshot::EtcdSnapshot)
        .with(etcd_snapshot::SnapshotFinish)
        .with(resume::Resume)
        .with(export::Export)
        .with(package::Package)
        .with(lock::Unlock)
}

/// The stage names a backup playbook may use, and which need which before them.
pub const BACKUP_RULES: StageRules<'static> = StageRules {
    operation: "backup",
    known: &[
        "lock",
        "preflight",
        "pause",
        "scale-down",
        "etcd-snapshot",
        "resume",
        "export",
        "snapshot-finish",
        "package",
        "unlock",
    ],
    requires_before: &[
        ("pause", "preflight"),
        ("scale-down", "pause"),
        ("scale-down", "preflight"),
        ("etcd-snapshot", "preflight"),
        ("resume", "scale-down"),
        ("export", "preflight"),
        ("snapshot-finish", "etcd-snapshot"),
        ("package", "snapshot-finish"),
        ("package", "export"),
        ("unlock", "lock"),
    ],
};

/// Parse a stage's journaled output back.
pub fn from_output<T: serde::de::DeserializeOwned>(stage: &'static str, output: &serde_json::Value) -> Result<T, StageError> {
    serde_json::from_value(output.clone()).map_err(|e| StageError::Output {
        stage,
        message: e.to_string(),
    })
}

/// What an undo works from: the stage's output, or, when it stopped part-way,
/// its last progress record. `None` when it changed nothing yet.
pub fn undo_record<T: serde::de::DeserializeOwned>(
    stage: &'static str,
    input: &crate::pipeline::UndoInput<'_>,
) -> Result<Option<T>, StageError> {
    input.output.or(input.progress).map(|value| from_output(stage, value)).transpose()
}

/// The progress an earlier, interrupted attempt of `stage` journaled: a rerun
/// must keep what was there before the first attempt changed anything.
pub fn earlier_progress<T: serde::de::DeserializeOwned>(step: &crate::pipeline::Step<'_>, stage: &str) -> Option<T> {
    step.history()
        .and_then(|history| history.stage(stage).progress)
        .and_then(|progress| serde_json::from_value(progress).ok())
}
