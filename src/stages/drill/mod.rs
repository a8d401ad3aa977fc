//! The drill stages (`playbooks/drill.yaml`): prove a backup restores by
//! restoring it under a new name on a staging management cluster, checking
//! the result against the backup, and tearing it down.
//!
//! The restore stages run unchanged through [`OnDestination`] on the
//! staging half of a [`DrillContext`]; the drill adds `rewrite` (the objects
//! made into a new cluster, before anything is checked or created), `checks`
//! (what the restored cluster holds, compared with the backup) and
//! `teardown` (the drill cluster removed, unless `--keep`).
//!
//! A drill undoes on failure (`OnFailure::Undo`): whatever it created is
//! deleted when a stage fails; with `--keep` it stops instead and leaves
//! everything for inspection. A failed *check* is not a failed stage: the
//! drill goes on to teardown and the report names the check.

pub mod checks;
pub mod rewrite;
pub mod teardown;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::migrate::{HasDestination, OnDestination};
use super::restore::{RestoreContext, RestoreInputs};
use crate::pipeline::{Catalog, StageId};
use rewrite::{DrillIdentity, RewriteReport};

/// The inputs of a drill (journaled on start; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrillInputs {
    /// The restore: the backup (`backup_of`) and the drill cluster's names
    /// (`namespace`, `hosted_cluster`) on the staging cluster.
    pub restore: RestoreInputs,
    pub identity: DrillIdentity,
    /// Leave the drill cluster in place (also when the drill fails).
    pub keep: bool,
    /// When the drill started: RTO runs from here, RPO is measured here.
    pub started: DateTime<Utc>,
    #[serde(default)]
    pub kubeconfig: Option<std::path::PathBuf>,
    #[serde(default)]
    pub context: Option<String>,
}

/// The context of one drill: a restore context on the staging cluster and
/// what the drill's own stages found.
pub struct DrillContext {
    pub restore: RestoreContext,
    pub inputs: DrillInputs,
    /// What `rewrite` renamed, dropped and kept.
    pub rewrite: Option<RewriteReport>,
    /// What `checks` found.
    pub checks: Vec<checks::CheckResult>,
}

impl DrillContext {
    pub fn new(restore: RestoreContext, inputs: DrillInputs) -> Self {
        DrillContext {
            restore,
            inputs,
            rewrite: None,
            checks: Vec::new(),
        }
    }
}

impl HasDestination for DrillContext {
    fn destination(&self) -> &RestoreContext {
        &self.restore
    }
    fn destination_mut(&mut self) -> &mut RestoreContext {
        &mut self.restore
    }
    fn destination_prefix(&self) -> &'static str {
        "staging: "
    }
}

/// Every drill stage, and what must come before what (the playbook rules).
/// `rewrite` comes before anything looks at or creates the drill cluster's
/// objects, so no playbook can replay the backup under the source's own
/// names.
pub fn drill_catalog() -> Catalog<DrillContext> {
    use super::restore::{apply::Apply, preflight::Preflight, snapshot_url::SnapshotUrl, verify::Verify, volumes::VolumeRestore, wait::Wait};
    use {checks::Checks, rewrite::Rewrite, teardown::Teardown};
    Catalog::new("drill")
        .with(OnDestination::new(Verify, false))
        .with(Rewrite)
        .after(&[Verify::NAME])
        .with(OnDestination::new(Preflight, false))
        .after(&[Rewrite::NAME])
        .with(OnDestination::new(SnapshotUrl, false))
        .after(&[Rewrite::NAME])
        .with(OnDestination::new(VolumeRestore, false))
        .after(&[Rewrite::NAME, Preflight::NAME])
        .with(OnDestination::new(super::restore::etcd_seed::EtcdSeed, false))
        .after(&[Rewrite::NAME, Preflight::NAME, SnapshotUrl::NAME])
        .with(OnDestination::new(Apply, false))
        .after(&[Preflight::NAME, SnapshotUrl::NAME, super::restore::etcd_seed::EtcdSeed::NAME])
        .with(OnDestination::new(Wait, false))
        .after(&[Apply::NAME])
        .with(Checks)
        .after(&[Wait::NAME])
        .with(Teardown)
        .after(&[Apply::NAME, Checks::NAME])
}

