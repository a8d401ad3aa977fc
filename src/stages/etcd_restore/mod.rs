//! The full etcd restore of a hosted cluster (`playbooks/etcd-restore.yaml`):
//! the on-premise procedure, where the cluster stays on its management
//! cluster and only its etcd goes back to a snapshot.
//!
//! `fetch-snapshot` reads and verifies the snapshot offline (a snapshot that
//! fails verification is refused before anything changes); `assess` reads
//! the etcd StatefulSet (members, peer URLs, image, volumes, PVC retention);
//! `pause` and `scale-down` are the backup's own stages; `stop-etcd` measures
//! the revision the cluster reached and scales etcd to zero; `restore-members`
//! replaces the other members' volume claims with fresh ones and restores the
//! snapshot into every member's volume through a short-lived pod running the
//! etcd image (`etcdutl snapshot restore` with the StatefulSet's
//! `--initial-cluster`, each member's `--name` and
//! `--initial-advertise-peer-urls`, `--bump-revision`, `--mark-compacted`);
//! `start-etcd` scales etcd back and waits until every member is healthy at
//! a revision above the one measured before; `resume` (the backup's) brings
//! the writers back and lifts the pause.
//!
//! Why every member is restored, not member 0 alone: a member 0 restored with
//! the cluster's three-member `--initial-cluster` has no quorum on its own,
//! and HyperShift's `reset-member` init container can only re-add an empty
//! member through a cluster that has one (it removes and re-adds the member
//! by name); an empty member that starts as `new` instead shares the raft log
//! of the restored one but not its data. Restoring the same snapshot into
//! each member with the same `--initial-cluster` is etcd's documented
//! multi-member restore, and what HyperShift's own `etcd-init` does for
//! `restoreSnapshotURL`.
//!
//! Stops on failure: before `restore-members` changed anything the run is
//! undone at once (etcd and the writers scaled back, the pause lifted); from
//! there the old data is gone and `--resume` goes on.

pub mod assess;
pub mod fetch;
pub mod members;
pub mod start;
pub mod stop;

use serde::{Deserialize, Serialize};

use super::context::{BackupContext, BackupInputs};
use super::migrate::{HasSource, OnSource};
use crate::pipeline::{Catalog, StageId};
use crate::store::Store;

/// Where the snapshot comes from (journaled; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotRef {
    /// The store holding it (a directory or `s3://bucket/prefix`).
    pub store: String,
    /// Its key in that store.
    pub key: String,
    /// Set when it is a member snapshot of an hcp-dr backup.
    pub backup: Option<BackupRef>,
}

/// The backup a snapshot belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupRef {
    pub namespace: String,
    pub hosted_cluster: String,
    /// A backup id, or `latest` until `fetch-snapshot` resolved it.
    pub backup_id: String,
}

/// The inputs of an etcd restore (journaled on start; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EtcdRestoreInputs {
    /// The cluster, as the backup stages reused here see it.
    pub cluster: BackupInputs,
    pub snapshot: SnapshotRef,
    /// An S3 store the snapshot is copied to when its own store cannot
    /// presign a URL (a local file or directory).
    pub stage_snapshot_to: Option<String>,
    /// `--bump-revision`; None: measured (see `stop-etcd`).
    pub bump_revision: Option<u64>,
    pub presign_ttl_seconds: u64,
    /// The restore pods' image; None: the etcd StatefulSet's.
    pub image: Option<String>,
    /// The age identity file for an encrypted backup (the path only).
    #[serde(default)]
    pub identity: Option<std::path::PathBuf>,
}

/// The context of one etcd restore.
pub struct EtcdRestoreContext {
    /// The backup stages' view of the cluster (pause, scale-down, resume, lock).
    pub cluster: BackupContext,
    pub inputs: EtcdRestoreInputs,
    /// `--stage-snapshot-to`, opened.
    pub staging: Option<Box<dyn Store>>,
    /// A local copy of the snapshot `fetch-snapshot` verified, for staging
    /// (this run only; removed on drop).
    pub local_copy: Option<tempfile::TempPath>,
    /// The presigned URL the restore pods download from (never journaled).
    pub url: Option<String>,
    /// The keys of `inputs.identity`, loaded once (never journaled).
    pub identities: Option<crate::archive::encryption::Identities>,
}

impl EtcdRestoreContext {
    /// The store holding the snapshot (the one the backup stages were given).
    pub fn snapshot_store(&self) -> &dyn Store {
        self.cluster.store.as_ref()
    }
    pub fn hcp_namespace(&self) -> String {
        self.cluster.hcp_namespace()
    }
    pub fn hc_label(&self) -> String {
        self.cluster.hc_label()
    }
    pub fn warn(&mut self, warning: String) {
        tracing::warn!("{warning}");
        self.cluster.warnings.push(warning);
    }
}

impl HasSource for EtcdRestoreContext {
    fn source(&self) -> &BackupContext {
        &self.cluster
    }
    fn source_mut(&mut self) -> &mut BackupContext {
        &mut self.cluster
    }
    fn plan_prefix(&self) -> &'static str {
        ""
    }
}

/// Every etcd-restore stage, by name.
pub fn etcd_restore_catalog() -> Catalog<EtcdRestoreContext> {
    use super::lock::{Lock, Unlock};
    use super::{pause::Pause, resume::Resume, scale_down::ScaleDown};
    use {assess::Assess, fetch::FetchSnapshot, members::RestoreMembers, start::StartEtcd, stop::StopEtcd};
    Catalog::new("etcd-restore")
        .with(OnSource::new(Lock, true))
        .with(FetchSnapshot)
        .after(&[Lock::NAME])
        .with(Assess)
        .after(&[Lock::NAME])
        .with(OnSource::new(Pause, true))
        .after(&[Assess::NAME])
        .with(OnSource::new(ScaleDown, true))
        .after(&[Pause::NAME])
        .with(StopEtcd)
        .after(&[ScaleDown::NAME, FetchSnapshot::NAME, Assess::NAME])
        .with(RestoreMembers)
        .after(&[StopEtcd::NAME, Assess::NAME, FetchSnapshot::NAME])
        .with(StartEtcd)
        .after(&[RestoreMembers::NAME, Assess::NAME, StopEtcd::NAME])
        .with(OnSource::new(Resume, false))
        .after(&[StartEtcd::NAME, ScaleDown::NAME, Pause::NAME])
        .with(OnSource::new(Unlock, true))
        .after(&[Lock::NAME])
}

/// The margin added to a measured bump: revisions the measurement may have
/// missed (a write racing the scale-down of the last writer).
pub const BUMP_MARGIN: u64 = 1000;
/// The bump when the revision cannot be measured (no member answers), as
/// etcd's own recovery guide suggests.
pub const BUMP_UNMEASURED: u64 = 1_000_000_000;
