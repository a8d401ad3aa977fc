//! The migrate stages (`playbooks/migrate.yaml`): the backup stages on the
//! source (without `resume`: the source stays paused and scaled down, the
//! control-plane-operator too), DNS withdrawal, the restore stages on the
//! destination, and only then the source's teardown.
//!
//! Backup and restore stages are reused as they are through [`OnSource`] and
//! [`OnDestination`], which hand them their half of a [`MigrateContext`].
//! Migrate stops on failure (`OnFailure::Stop`): `--resume` goes on,
//! `--abort` brings the source back, which is refused once teardown began.

pub mod check;
pub mod dns;
pub mod hosts;
pub mod ovn;
pub mod point;
pub mod teardown;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::context::{BackupContext, BackupInputs};
use super::restore::{RestoreContext, RestoreInputs};
use crate::dns::DnsZone;
use crate::pipeline::{Catalog, DynStage, StageId, StageFailure, Step, UndoInput};

/// The inputs of a migration (journaled on start; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigrateInputs {
    pub source: BackupInputs,
    pub destination: RestoreInputs,
    #[serde(default)]
    pub from_kubeconfig: Option<std::path::PathBuf>,
    #[serde(default)]
    pub from_context: Option<String>,
    #[serde(default)]
    pub to_kubeconfig: Option<std::path::PathBuf>,
    #[serde(default)]
    pub to_context: Option<String>,
    /// The Route53 zone the cluster's records live in.
    #[serde(default)]
    pub route53_zone: Option<String>,
    #[serde(default)]
    pub route53_endpoint: Option<String>,
    /// Delete the source owner's records directly instead of waiting for
    /// external-dns to withdraw them.
    pub dns_direct: bool,
    pub dns_wait_seconds: u64,
    /// `--at`/`--at-revision`: the destination restores the cluster as it
    /// was at this point of its stream (`point-in-time`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<crate::ops::point_in_time::AtPoint>,
}

/// The context of one migration: a backup context on the source, a restore
/// context on the destination, and the DNS zone.
pub struct MigrateContext {
    pub source: BackupContext,
    pub destination: RestoreContext,
    pub dns: Option<Box<dyn DnsZone>>,
    pub inputs: MigrateInputs,
    /// Hostnames the cluster publishes that hcp-dr's DNS steps manage
    /// (found by `destination-check`).
    pub hosts: Vec<String>,
    /// Every name the cluster is reached under, managed or left alone.
    pub published: Vec<crate::hosted::publishing::PublishedName>,
}

/// A context that carries a backup context for the backup stages it reuses
/// (the source of a migration; the cluster of an etcd restore).
pub trait HasSource: Send + Sync {
    fn source(&self) -> &BackupContext;
    fn source_mut(&mut self) -> &mut BackupContext;
    /// Put before each line a reused stage plans ("source: " in a migration).
    fn plan_prefix(&self) -> &'static str {
        "source: "
    }
}

impl HasSource for MigrateContext {
    fn source(&self) -> &BackupContext {
        &self.source
    }
    fn source_mut(&mut self) -> &mut BackupContext {
        &mut self.source
    }
}

/// A context that carries a restore context for the restore stages it
/// reuses (the destination of a migration; the staging cluster of a drill).
pub trait HasDestination: Send + Sync {
    fn destination(&self) -> &RestoreContext;
    fn destination_mut(&mut self) -> &mut RestoreContext;
    /// Put before each line a reused stage plans ("destination: " in a migration).
    fn destination_prefix(&self) -> &'static str {
        "destination: "
    }
}

impl HasDestination for MigrateContext {
    fn destination(&self) -> &RestoreContext {
        &self.destination
    }
    fn destination_mut(&mut self) -> &mut RestoreContext {
        &mut self.destination
    }
}

/// A backup stage run on the source, under its own name.
pub struct OnSource<S> {
    inner: S,
    /// Whether `--abort` undoes it (the backup's artifacts are kept).
    undo: bool,
}

impl<S: StageId> OnSource<S> {
    /// `inner` on the source; `--abort` undoes it when `undo`.
    pub fn new(inner: S, undo: bool) -> Self {
        OnSource { inner, undo }
    }
}

/// A restore stage run on the destination, under its own name or another.
pub struct OnDestination<S> {
    name: &'static str,
    inner: S,
    /// Planned rather than run in a dry-run although it only reads: what it
    /// reads (the backup) is written by this run, so it does not exist yet.
    reads_this_run: bool,
}

impl<S: StageId> OnDestination<S> {
    /// `inner` on the destination, under its own name.
    pub fn new(inner: S, reads_this_run: bool) -> Self {
        OnDestination { name: S::NAME, inner, reads_this_run }
    }

    /// Under another name (a migration's `destination-preflight`, beside
    /// the source's `preflight`).
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }
}

#[async_trait]
impl<S: DynStage<BackupContext>, C: HasSource> DynStage<C> for OnSource<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn stage_type(&self) -> Option<std::any::TypeId> {
        self.inner.stage_type()
    }
    fn summary(&self) -> &'static str {
        self.inner.summary()
    }
    fn mutates(&self) -> bool {
        self.inner.mutates()
    }
    fn plan(&self, ctx: &C, step: &Step<'_>) -> Vec<String> {
        self.inner.plan(ctx.source(), step).into_iter().map(|l| format!("{}{l}", ctx.plan_prefix())).collect()
    }
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Value, StageFailure> {
        self.inner.run(ctx.source_mut(), step).await
    }
    fn restore(&self, ctx: &mut C, output: &Value) -> Result<(), StageFailure> {
        self.inner.restore(ctx.source_mut(), output)
    }
    fn params(&self) -> crate::pipeline::Params {
        self.inner.params()
    }
    fn undoable(&self) -> bool {
        self.undo && self.inner.undoable()
    }
    async fn undo(&self, ctx: &mut C, input: UndoInput<'_>) -> Result<(), StageFailure> {
        self.inner.undo(ctx.source_mut(), input).await
    }
}

#[async_trait]
impl<S: DynStage<RestoreContext>, C: HasDestination> DynStage<C> for OnDestination<S> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn stage_type(&self) -> Option<std::any::TypeId> {
        self.inner.stage_type()
    }
    fn summary(&self) -> &'static str {
        self.inner.summary()
    }
    fn mutates(&self) -> bool {
        self.inner.mutates() || self.reads_this_run
    }
    fn plan(&self, ctx: &C, step: &Step<'_>) -> Vec<String> {
        let prefix = ctx.destination_prefix();
        self.inner.plan(ctx.destination(), step).into_iter().map(|l| format!("{prefix}{l}")).collect()
    }
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Value, StageFailure> {
        self.inner.run(ctx.destination_mut(), step).await
    }
    fn restore(&self, ctx: &mut C, output: &Value) -> Result<(), StageFailure> {
        self.inner.restore(ctx.destination_mut(), output)
    }
    fn params(&self) -> crate::pipeline::Params {
        self.inner.params()
    }
    fn undoable(&self) -> bool {
        self.inner.undoable()
    }
    async fn undo(&self, ctx: &mut C, input: UndoInput<'_>) -> Result<(), StageFailure> {
        self.inner.undo(ctx.destination_mut(), input).await
    }
}

/// The destination's preflight in a migration, beside the source's `preflight`.
pub const DESTINATION_PREFLIGHT: &str = "destination-preflight";

/// Every migrate stage, and what must come before what (the playbook
/// rules). The last rules are the point of the operation: the source is
/// torn down only after the destination was verified healthy.
pub fn migrate_catalog() -> Catalog<MigrateContext> {
    use super::etcd_snapshot::{EtcdSnapshot, SnapshotFinish};
    use super::lock::{Lock, Unlock};
    use super::restore::{apply::Apply, fence::WriteFence, oidc::OidcIssuer, snapshot_url::SnapshotUrl, verify::Verify, wait::Wait};
    use super::{export::Export, package::Package, pause::Pause, preflight::Preflight, scale_down::ScaleDown};
    use super::volumes::{VolumeCopy, VolumeSnapshot};
    use {check::DestinationCheck, dns::DnsWithdraw, hosts::DetachHosts, ovn::OvnRestart, teardown::Teardown};
    Catalog::new("migrate")
        .with(OnSource::new(Lock, true))
        .with(OnSource::new(Preflight, true))
        .with(DestinationCheck)
        .after(&[Preflight::NAME])
        .with(OnSource::new(Pause, true))
        .after(&[Preflight::NAME, DestinationCheck::NAME])
        .with(OnSource::new(ScaleDown, true))
        .after(&[Pause::NAME])
        .with(OnSource::new(EtcdSnapshot, false))
        .after(&[ScaleDown::NAME])
        .with(OnSource::new(VolumeSnapshot, true))
        .after(&[ScaleDown::NAME, Preflight::NAME])
        .with(OnSource::new(VolumeCopy, true))
        .after(&[VolumeSnapshot::NAME, Preflight::NAME])
        .with(OnSource::new(Export, false))
        .after(&[Preflight::NAME])
        .with(OnSource::new(SnapshotFinish, false))
        .after(&[EtcdSnapshot::NAME])
        .with(OnSource::new(Package, false))
        .after(&[SnapshotFinish::NAME, Export::NAME, Preflight::NAME])
        .with(point::PointInTime)
        .after(&[Package::NAME])
        .with(DnsWithdraw)
        .after(&[Package::NAME, DestinationCheck::NAME])
        .with(DetachHosts)
        .after(&[Export::NAME])
        .with(OnDestination::new(Verify, true))
        .after(&[Package::NAME])
        .with(OnDestination::new(super::restore::preflight::Preflight, true).named(DESTINATION_PREFLIGHT))
        .after(&[Verify::NAME])
        .with(OnDestination::new(SnapshotUrl, true))
        .after(&[Verify::NAME])
        .with(OnDestination::new(super::restore::volumes::VolumeRestore, true))
        .after(&[DESTINATION_PREFLIGHT])
        .with(OnDestination::new(super::restore::etcd_seed::EtcdSeed, true))
        .after(&[DESTINATION_PREFLIGHT, SnapshotUrl::NAME])
        .with(OnDestination::new(Apply, true))
        .after(&[DnsWithdraw::NAME, DetachHosts::NAME, DESTINATION_PREFLIGHT, SnapshotUrl::NAME, super::restore::etcd_seed::EtcdSeed::NAME])
        .with(OnDestination::new(Wait, true))
        .after(&[Apply::NAME])
        .with(OnDestination::new(WriteFence { by: "migrate" }, true))
        .after(&[Wait::NAME])
        .with(OnDestination::new(OidcIssuer, true))
        .after(&[Wait::NAME])
        .with(Teardown)
        .after(&[Wait::NAME])
        .with(OvnRestart)
        .after(&[Wait::NAME])
        .with(OnSource::new(Unlock, true))
        .after(&[Lock::NAME])
}

