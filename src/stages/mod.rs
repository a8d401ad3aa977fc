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
pub mod volumes;

use crate::pipeline::{Catalog, StageId};
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
}

/// Every backup stage, and what must come before what (the playbook rules).
pub fn backup_catalog() -> Catalog<BackupContext> {
    use etcd_snapshot::{EtcdSnapshot, SnapshotFinish};
    use lock::{Lock, Unlock};
    use volumes::{VolumeCopy, VolumeSnapshot};
    use {export::Export, package::Package, pause::Pause, preflight::Preflight, resume::Resume, scale_down::ScaleDown};
    Catalog::new("backup")
        .with(Lock)
        .with(Preflight)
        .with(Pause)
        .after(&[Preflight::NAME])
        .with(ScaleDown)
        .after(&[Pause::NAME, Preflight::NAME])
        .with(EtcdSnapshot)
        .after(&[Preflight::NAME])
        .with(VolumeSnapshot)
        .after(&[ScaleDown::NAME, Preflight::NAME])
        .with(Resume)
        .after(&[ScaleDown::NAME, Pause::NAME])
        .with(Export)
        .after(&[Preflight::NAME])
        .with(SnapshotFinish)
        .after(&[EtcdSnapshot::NAME])
        .with(VolumeCopy)
        .after(&[VolumeSnapshot::NAME, Preflight::NAME])
        .with(Package)
        .after(&[SnapshotFinish::NAME, Export::NAME, Preflight::NAME])
        .with(Unlock)
        .after(&[Lock::NAME])
}
