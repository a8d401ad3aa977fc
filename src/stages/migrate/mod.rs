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
pub mod ovn;
pub mod teardown;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::context::{BackupContext, BackupInputs};
use super::restore::{RestoreContext, RestoreInputs};
use crate::dns::DnsZone;
use crate::pipeline::{Catalog, Stage, StageFailure, StageRules, Step, UndoInput};

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
}

/// The context of one migration: a backup context on the source, a restore
/// context on the destination, and the DNS zone.
pub struct MigrateContext {
    pub source: BackupContext,
    pub destination: RestoreContext,
    pub dns: Option<Box<dyn DnsZone>>,
    pub inputs: MigrateInputs,
    /// Hostnames the cluster publishes (found by `destination-check`).
    pub hosts: Vec<String>,
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

/// A backup stage run on the source, under its own name or another.
pub struct OnSource<S> {
    pub name: &'static str,
    pub inner: S,
    /// Whether `--abort` undoes it (the backup's artifacts are kept).
    pub undo: bool,
}

/// A restore stage run on the destination.
pub struct OnDestination<S> {
    pub name: &'static str,
    pub inner: S,
    /// Planned rather than run in a dry-run although it only reads: what it
    /// reads (the backup) is written by this run, so it does not exist yet.
    pub reads_this_run: bool,
}

#[async_trait]
impl<S: Stage<BackupContext>, C: HasSource> Stage<C> for OnSource<S> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn summary(&self) -> &'static str {
        self.inner.summary()
    }
    fn mutates(&self) -> bool {
        self.inner.mutates()
    }
    fn plan(&self, ctx: &C, params: &Value) -> Vec<String> {
        self.inner.plan(ctx.source(), params).into_iter().map(|l| format!("{}{l}", ctx.plan_prefix())).collect()
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
impl<S: Stage<RestoreContext>, C: HasDestination> Stage<C> for OnDestination<S> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn summary(&self) -> &'static str {
        self.inner.summary()
    }
    fn mutates(&self) -> bool {
        self.inner.mutates() || self.reads_this_run
    }
    fn plan(&self, ctx: &C, params: &Value) -> Vec<String> {
        let prefix = ctx.destination_prefix();
        self.inner.plan(ctx.destination(), params).into_iter().map(|l| format!("{prefix}{l}")).collect()
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

/// Every migrate stage, by name.
pub fn migrate_catalog() -> Catalog<MigrateContext> {
    use super::{etcd_snapshot, export, lock, package, pause, preflight, restore, scale_down};
    Catalog::default()
        .with(OnSource { name: "lock", inner: lock::Lock, undo: true })
        .with(OnSource { name: "preflight", inner: preflight::Preflight, undo: true })
        .with(check::DestinationCheck)
        .with(OnSource { name: "pause", inner: pause::Pause, undo: true })
        .with(OnSource { name: "scale-down", inner: scale_down::ScaleDown, undo: true })
        .with(OnSource { name: "etcd-snapshot", inner: etcd_snapshot::EtcdSnapshot, undo: false })
        .with(OnSource { name: "export", inner: export::Export, undo: false })
        .with(OnSource { name: "snapshot-finish", inner: etcd_snapshot::SnapshotFinish, undo: false })
        .with(OnSource { name: "package", inner: package::Package, undo: false })
        .with(dns::DnsWithdraw)
        .with(OnDestination { name: "verify", inner: restore::verify::Verify, reads_this_run: true })
        .with(OnDestination { name: "destination-preflight", inner: restore::preflight::Preflight, reads_this_run: true })
        .with(OnDestination { name: "snapshot-url", inner: restore::snapshot_url::SnapshotUrl, reads_this_run: true })
        .with(OnDestination { name: "apply", inner: restore::apply::Apply, reads_this_run: true })
        .with(OnDestination { name: "wait", inner: restore::wait::Wait, reads_this_run: true })
        .with(OnDestination { name: "fence", inner: restore::fence::WriteFence { by: "migrate" }, reads_this_run: true })
        .with(teardown::Teardown)
        .with(ovn::OvnRestart)
        .with(OnSource { name: "unlock", inner: lock::Unlock, undo: true })
}

/// The stage names a migrate playbook may use, and what must come before what.
/// The last rules are the point of the operation: the source is torn down
/// only after the destination was verified healthy.
pub const MIGRATE_RULES: StageRules<'static> = StageRules {
    operation: "migrate",
    known: &[
        "lock",
        "preflight",
        "destination-check",
        "pause",
        "scale-down",
        "etcd-snapshot",
        "export",
        "snapshot-finish",
        "package",
        "dns-withdraw",
        "verify",
        "destination-preflight",
        "snapshot-url",
        "apply",
        "wait",
        "fence",
        "teardown",
        "ovn-restart",
        "unlock",
    ],
    requires_before: &[
        ("destination-check", "preflight"),
        ("pause", "preflight"),
        ("pause", "destination-check"),
        ("scale-down", "pause"),
        ("etcd-snapshot", "scale-down"),
        ("export", "preflight"),
        ("snapshot-finish", "etcd-snapshot"),
        ("package", "snapshot-finish"),
        ("package", "export"),
        ("dns-withdraw", "package"),
        ("dns-withdraw", "destination-check"),
        ("verify", "package"),
        ("destination-preflight", "verify"),
        ("snapshot-url", "verify"),
        ("apply", "dns-withdraw"),
        ("apply", "destination-preflight"),
        ("apply", "snapshot-url"),
        ("wait", "apply"),
        ("fence", "wait"),
        ("teardown", "wait"),
        ("ovn-restart", "wait"),
        ("unlock", "lock"),
    ],
};
