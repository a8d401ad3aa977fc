//! `hcp-dr drill`: prove a backup restores. The backup is restored under a
//! new name (and namespace, clusterID, infraID and hostnames) on a staging
//! management cluster through the drill playbook, checked against the
//! backup, and removed again unless `--keep`. RTO is the time from the
//! drill's start to the restored cluster being Available; RPO is the
//! backup's age when the drill started. The report (`--report FILE`) is
//! written after the run, whatever its outcome.

pub mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OpsError;
use super::restore::{Decrypt, RestoreOptions, prepare_decryption, resolve_inputs};
use crate::archive::parse_backup_id;
use crate::archive::results::{self, Kind, ResultRecord};
use crate::pipeline::{Interrupt, OnFailure, RunOutcome, RunReport, StageStatus};
use crate::stages::context::EtcdAccess;
use crate::stages::drill::checks::CheckResult;
use crate::stages::drill::rewrite::{ClusterRef, DrillIdentity, RewriteReport};
use crate::stages::drill::{DrillContext, DrillInputs, drill_catalog};
use crate::stages::restore::{BackupOf, RestoreContext};
use crate::store::{self, S3Options};

/// The suffix the drill's names get when none is given.
pub const DEFAULT_SUFFIX: &str = "-drill";

/// Everything `hcp-dr drill` was asked.
#[derive(Clone)]
pub struct DrillOptions {
    /// The staging management cluster (required: a drill never guesses it).
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// A backup's URL, or a store URL with `backup_id`.
    pub from: Option<String>,
    pub backup_id: Option<String>,
    pub hosted_cluster: Option<String>,
    pub namespace: Option<String>,
    pub s3: S3Options,
    pub stage_snapshot_to: Option<String>,
    pub presign_ttl: Duration,
    /// An encrypted backup's identity file, and whether `presign_ttl` was given.
    pub decrypt: Decrypt,
    pub wait_timeout: Duration,
    pub etcd_access: EtcdAccess,
    /// Added to the cluster's name and namespace.
    pub name_suffix: String,
    /// Leave the drill cluster in place (also when the drill fails).
    pub keep: bool,
    /// Write the report to `<report>.md` and `<report>.json`.
    pub report: Option<PathBuf>,
    /// `--etcd-seed`, `--etcd-init-fixed`, `--bump-revision`, `--etcd-image`.
    pub etcd_seed: crate::stages::restore::etcd_seed::EtcdSeedInputs,
    /// Playbook, journal, abort (of a drill that stopped with `--keep` or
    /// was killed), dry-run; a drill is not resumed.
    pub run: super::RunFlags,
    pub observer: Option<Arc<dyn crate::pipeline::runner::Observer>>,
    /// Where the drill's result series go (textfile, Pushgateway).
    pub metrics_file: Option<PathBuf>,
    pub pushgateway: Option<super::signals::Pushgateway>,
    /// `--at` / `--at-revision`: drill a point of the cluster's stream.
    pub at: Option<super::point_in_time::AtPoint>,
}

/// What became of the drill cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DrillCluster {
    /// Nothing was created on the staging cluster (refused before `apply`, or a dry run).
    NeverCreated,
    /// Created, checked and removed by `teardown`.
    Removed,
    /// Created and removed again when a stage failed.
    RemovedAfterFailure,
    /// Removed by `--abort` (a kept, stopped or killed drill).
    RemovedByAbort,
    /// Left in place (`--keep`).
    Kept,
    /// A stage failed and removing what it created failed too: see the run's undo errors.
    LeftAfterFailedUndo,
}

impl DrillCluster {
    pub fn describe(&self) -> &'static str {
        match self {
            DrillCluster::NeverCreated => "never created: the staging cluster was not changed",
            DrillCluster::Removed => "removed after the checks",
            DrillCluster::RemovedAfterFailure => "removed again after the failure",
            DrillCluster::RemovedByAbort => "removed by --abort",
            DrillCluster::Kept => "kept (--keep)",
            DrillCluster::LeftAfterFailedUndo => "LEFT IN PLACE: removing it failed (see the undo errors)",
        }
    }
}

/// What a drill reports.
#[derive(Debug, Clone, Serialize)]
pub struct DrillResult {
    #[serde(flatten)]
    pub run: RunReport,
    /// The stages succeeded and every check passed.
    pub passed: bool,
    pub backup: String,
    /// `namespace/name` of the backed-up cluster and of the drill's.
    pub source: String,
    pub drill: String,
    /// The backed-up HostedCluster's UID and lineage root (the UID of the
    /// cluster it descends from through restores and migrations), from the
    /// backup's manifest: the drill proves backups of that lineage.
    pub source_uid: Option<String>,
    pub lineage: Option<String>,
    /// Drill start to the drill cluster Available.
    pub rto_seconds: Option<f64>,
    /// The backup's age when the drill started.
    pub rpo_seconds: Option<f64>,
    pub backup_taken: Option<DateTime<Utc>>,
    pub started: DateTime<Utc>,
    pub checks: Vec<CheckResult>,
    /// Names, identity and hostnames, old and new; what was dropped and kept.
    pub rewrite: Option<RewriteReport>,
    pub drill_cluster: DrillCluster,
    /// How to remove a kept drill cluster.
    pub remove_with: Option<String>,
    /// This run was `--abort`: it removed what an earlier drill left.
    pub aborted: bool,
    /// The point of the stream drilled (`--at`, `--at-revision`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<super::point_in_time::Materialized>,
    /// `<report>.md` and `<report>.json`, once written.
    pub report_files: Vec<String>,
    /// The result record written beside the backup (`results/`), for
    /// `hcp-dr report`.
    pub recorded: Option<String>,
    pub warnings: Vec<String>,
}

impl DrillResult {
    /// The checks that failed.
    pub fn failed_checks(&self) -> Vec<&CheckResult> {
        self.checks.iter().filter(|c| !c.passed).collect()
    }
}

fn restore_options(options: &DrillOptions) -> RestoreOptions {
    RestoreOptions {
        kubeconfig: options.kubeconfig.clone(),
        context: options.context.clone(),
        from: options.from.clone(),
        backup_id: options.backup_id.clone(),
        hosted_cluster: options.hosted_cluster.clone(),
        namespace: options.namespace.clone(),
        s3: options.s3.clone(),
        stage_snapshot_to: options.stage_snapshot_to.clone(),
        presign_ttl: options.presign_ttl,
        wait_timeout: options.wait_timeout,
        clean_leftovers: false,
        overwrite: false,
        etcd_access: options.etcd_access,
        mover_image: None,
        etcd_seed: options.etcd_seed.clone(),
        run: super::RunFlags {
            dry_run: options.run.dry_run,
            ..super::RunFlags::default()
        },
        observer: None,
        // a drill never touches the source's DNS records
        dns: None,
        dns_only: false,
        at: options.at.clone(),
    }
}

/// The report's base path: `FILE`, `FILE.md` or `FILE.json` all mean `FILE`.
pub fn report_base(path: &Path) -> PathBuf {
    match path.extension().and_then(|e| e.to_str()) {
        Some("md" | "json") => path.with_extension(""),
        _ => path.to_path_buf(),
    }
}

async fn new_inputs(options: &DrillOptions) -> Result<DrillInputs, OpsError> {
    if options.kubeconfig.is_none() {
        return Err(OpsError::Input(
            "--kubeconfig is required: the staging management cluster the drill restores onto (a drill never falls back to $KUBECONFIG)".into(),
        ));
    }
    if let Some(report) = &options.report {
        let base = report_base(report);
        let dir = base.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !dir.is_dir() {
            return Err(OpsError::Input(format!(
                "--report {}: the directory {} does not exist; create it or name a file in an existing one",
                report.display(),
                dir.display()
            )));
        }
    }
    let mut restore = resolve_inputs(&restore_options(options), &options.s3).await?;
    let source = ClusterRef::new(&restore.namespace, &restore.hosted_cluster);
    let random = crate::hosted::render::random_key().map_err(OpsError::Input)?;
    let identity = DrillIdentity::new(source.clone(), &options.name_suffix, &random).map_err(OpsError::Input)?;
    restore.backup_of = Some(BackupOf {
        namespace: source.namespace,
        hosted_cluster: source.name,
    });
    restore.namespace = identity.drill.namespace.clone();
    restore.hosted_cluster = identity.drill.name.clone();
    Ok(DrillInputs {
        restore,
        identity,
        keep: options.keep,
        started: Utc::now(),
        kubeconfig: options.kubeconfig.clone(),
        context: options.context.clone(),
    })
}

/// What became of the drill cluster, from how the run ended.
fn fate(run: &RunReport, keep: bool) -> DrillCluster {
    let apply_ran = run
        .stages
        .iter()
        .any(|s| s.name == <crate::stages::restore::apply::Apply as crate::pipeline::StageId>::NAME && !matches!(s.status, StageStatus::Skipped | StageStatus::Planned { .. }));
    match &run.outcome {
        // what `etcd-seed` made before `apply` may be what is left
        RunOutcome::UndoFailed { .. } => DrillCluster::LeftAfterFailedUndo,
        _ if !apply_ran => DrillCluster::NeverCreated,
        RunOutcome::RolledBack { .. } => DrillCluster::RemovedAfterFailure,
        RunOutcome::Aborted => DrillCluster::RemovedByAbort,
        RunOutcome::Failed { .. } => DrillCluster::NeverCreated,
        _ if keep => DrillCluster::Kept,
        RunOutcome::Succeeded => DrillCluster::Removed,
        // stopped without --keep: only an interrupted abort gets here
        _ => DrillCluster::LeftAfterFailedUndo,
    }
}

/// Drill start to Available: the stages before `wait`, then as long as
/// `wait` took to see the cluster Available; in whole milliseconds, as the
/// RPO is. The sum of nanosecond durations ends in float noise
/// (2.6507814610000002): 17 significant digits, which serde_json (without
/// its `float_roundtrip` feature) reads back one bit off, so a JSON reader
/// saw another number than the metrics file's. A millisecond value prints
/// short and reads back exactly everywhere.
pub fn rto_seconds(run: &RunReport) -> Option<f64> {
    let wait = run.stages.iter().position(|s| s.name == <crate::stages::restore::wait::Wait as crate::pipeline::StageId>::NAME)?;
    let available = run.output_of::<crate::stages::restore::wait::Wait>().ok()??.available_after_seconds;
    let seconds = run.stages[..wait].iter().map(|s| s.duration.as_secs_f64()).sum::<f64>() + available;
    Some((seconds * 1000.0).round() / 1000.0)
}

/// Run (or abort, or dry-run) a drill, then write its report.
pub async fn drill(options: DrillOptions, interrupt: &mut Interrupt) -> Result<DrillResult, OpsError> {
    let operation = operation();
    let playbook = operation.load_playbook(&options.run)?;
    // an abort of a drill that passed and was kept (--keep) removes it all the same
    let (mut inputs, kept) = match &options.run.abort {
        Some(journal) => {
            let (inputs, state) = super::journal_inputs::<DrillInputs>(journal, "drill")?;
            let kept = inputs.keep && state.outcome.as_deref() == Some("succeeded");
            (inputs, kept)
        }
        None => (new_inputs(&options).await?, false),
    };
    let mut s3 = options.s3.clone();
    s3.endpoint = s3.endpoint.or_else(|| inputs.restore.s3_endpoint.clone());
    s3.ca_bundle = s3.ca_bundle.or_else(|| inputs.restore.ca_bundle.clone());
    let store = store::open(&inputs.restore.store, s3.clone()).await?;
    if options.run.abort.is_none() {
        super::restore::check_seed(&inputs.restore, store.as_ref()).await?;
    }
    // an encrypted backup is read as restore reads it; --abort needs no key
    let (keys, warnings) = match options.run.abort {
        Some(_) => (None, Vec::new()),
        None => prepare_decryption(&mut inputs.restore, store.as_ref(), &options.decrypt, true).await?,
    };
    let staging = match &inputs.restore.stage_snapshot_to {
        Some(url) => Some(store::open(url, s3).await?),
        None => None,
    };
    let target = super::reach_for("staging", options.kubeconfig.as_deref(), options.context.as_deref(), options.run.abort.as_deref()).await?;
    let staging_cluster = target.binding.management_cluster().server;
    let restore = RestoreContext::new(target.client, store, staging, inputs.restore.clone());
    let mut ctx = DrillContext::new(restore, inputs.clone());
    ctx.restore.keys = keys;
    ctx.restore.warnings.extend(warnings);
    let source = inputs.identity.source.clone();
    // with --keep a failure stops, leaving the drill cluster for a look
    let operation = super::Operation {
        on_failure: if inputs.keep { OnFailure::Stop } else { OnFailure::Undo },
        ..operation
    };
    let journaled = super::Journaled::new(&inputs, vec![target.binding], &[&source.namespace, &source.name, &inputs.restore.backup_id]).abort_finished(kept);
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;

    let manifest = run.output_of::<crate::stages::restore::verify::Verify>()?.and_then(|verified| verified.manifest);
    let taken = manifest
        .as_ref()
        .and_then(|m| m.timings.started)
        .or_else(|| parse_backup_id(&inputs.restore.backup_id).ok());
    let checks_ran = run.stage_of::<crate::stages::drill::checks::Checks>().is_some_and(|s| s.status == StageStatus::Succeeded);
    let mut result = DrillResult {
        passed: run.outcome == RunOutcome::Succeeded && checks_ran && ctx.checks.iter().all(|c| c.passed),
        backup: format!("{}/{}", ctx.restore.store.url(), inputs.restore.layout().dir()),
        source: source.path(),
        source_uid: manifest.as_ref().map(|m| m.cluster.uid.clone()),
        lineage: manifest.as_ref().map(|m| m.cluster.lineage_root().to_string()),
        drill: inputs.identity.drill.path(),
        rto_seconds: rto_seconds(&run),
        rpo_seconds: taken.map(|t| (inputs.started - t).num_milliseconds() as f64 / 1000.0),
        backup_taken: taken,
        started: inputs.started,
        checks: ctx.checks.clone(),
        rewrite: ctx.rewrite.clone(),
        drill_cluster: fate(&run, inputs.keep),
        remove_with: None,
        aborted: options.run.aborting(),
        point_in_time: inputs.restore.point_in_time.clone(),
        report_files: Vec::new(),
        recorded: None,
        warnings: ctx.restore.warnings.clone(),
        run,
    };
    if result.drill_cluster == DrillCluster::Kept {
        // the abort deletes by UID what this drill created, on the cluster
        // its journal names: no kubeconfig to fill in
        result.remove_with = match &result.run.journal {
            Some(journal) => Some(format!("hcp-dr drill --abort {}", super::shell_word(journal))),
            None => result.run.output_of::<crate::stages::drill::teardown::Teardown>()?.and_then(|t| t.remove_with),
        };
    }
    if !options.run.dry_run && !options.run.aborting() {
        let record = record_of(&result, &inputs, &staging_cluster);
        result.recorded = results::write_noting(ctx.restore.store.as_ref(), &record, &mut result.warnings).await;
        let warnings = signal(&options, &inputs.identity.source, &result).await;
        result.warnings.extend(warnings);
    }
    if let (Some(path), false, None) = (&options.report, options.run.dry_run, &options.run.abort) {
        match report::write(&report_base(path), &result) {
            Ok(files) => result.report_files = files,
            Err(err) => result.warnings.push(format!("the report could not be written to {}: {err}", path.display())),
        }
    }
    Ok(result)
}

/// The drill's series to `--metrics-file` and `--pushgateway` (best
/// effort: what fails is a warning).
async fn signal(options: &DrillOptions, source: &ClusterRef, result: &DrillResult) -> Vec<String> {
    let outcome = super::signals::DrillOutcome { passed: result.passed, rto_seconds: result.rto_seconds, rpo_seconds: result.rpo_seconds };
    let now = Utc::now();
    let mut warnings = Vec::new();
    if let Some(path) = &options.metrics_file
        && let Err(e) = super::signals::drill_metrics_file(path, &source.namespace, &source.name, &outcome, now)
    {
        warnings.push(format!("could not write the drill's metrics: {e}"));
    }
    if let Some(gateway) = &options.pushgateway {
        match super::signals::push_drill(gateway, &source.namespace, &source.name, &outcome, now).await {
            Ok(notes) => warnings.extend(notes),
            Err(e) => warnings.push(format!("could not push the drill's metrics to the Pushgateway: {e}")),
        }
    }
    warnings
}

/// The record of a drill for the store: verdict, RTO, RPO, what failed.
fn record_of(result: &DrillResult, inputs: &DrillInputs, staging_cluster: &str) -> ResultRecord {
    let source = &inputs.identity.source;
    let mut record = ResultRecord::new(Kind::Drill, &source.namespace, &source.name, &inputs.restore.backup_id, inputs.started, result.passed, report::headline(result));
    record.rto_seconds = result.rto_seconds;
    record.rpo_seconds = result.rpo_seconds;
    record.target = Some(format!("{} on {staging_cluster}", result.drill));
    record.failures = result.failed_checks().iter().map(|c| format!("check {}", c.name)).collect();
    if let Some(stage) = result.run.outcome.failed_stage() {
        record.failures.push(format!("stage {stage}"));
    }
    record
}

/// The drill operation: a failure undoes everything (unless `--keep`); a
/// drill is aborted, never resumed.
pub fn operation() -> super::Operation<DrillContext> {
    super::Operation {
        command: "hcp-dr drill",
        playbook: "drill",
        catalog: drill_catalog(),
        on_failure: OnFailure::Undo,
        resume: None,
        abort: Some("removes the drill cluster and what it created"),
        no_abort_after: None,
        undo_stops_before: None,
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::StageReport;
    use serde_json::json;

    fn stage(name: &str, seconds: f64, status: StageStatus, output: Option<serde_json::Value>) -> StageReport {
        StageReport { name: name.into(), status, duration: Duration::from_secs_f64(seconds), output }
    }

    #[test]
    fn rto_runs_from_the_start_to_available_and_the_fate_follows_the_outcome() {
        let mut run = RunReport {
            operation: "drill".into(),
            outcome: RunOutcome::Succeeded,
            stages: vec![
                stage("verify", 2.0, StageStatus::Succeeded, None),
                stage("rewrite", 0.5, StageStatus::Succeeded, None),
                stage("apply", 1.5, StageStatus::Succeeded, None),
                stage("wait", 30.0, StageStatus::Succeeded, Some(json!({"available_after_seconds": 20.0, "backup_revision": 7, "revisions": {}, "nodes_ready": {}}))),
                stage("teardown", 9.0, StageStatus::Succeeded, None),
            ],
            journal: None,
        };
        assert_eq!(rto_seconds(&run), Some(24.0));
        assert_eq!(fate(&run, false), DrillCluster::Removed);
        assert_eq!(fate(&run, true), DrillCluster::Kept);
        run.outcome = RunOutcome::RolledBack { stage: "wait".into(), error: "timed out".into() };
        assert_eq!(fate(&run, false), DrillCluster::RemovedAfterFailure);
        run.stages[2].status = StageStatus::Skipped;
        run.outcome = RunOutcome::RolledBack { stage: "verify".into(), error: "tampered".into() };
        assert_eq!(fate(&run, false), DrillCluster::NeverCreated);
        assert_eq!(report_base(Path::new("/tmp/r.md")), PathBuf::from("/tmp/r"));
        assert_eq!(report_base(Path::new("/tmp/r.json")), PathBuf::from("/tmp/r"));
        assert_eq!(report_base(Path::new("/tmp/drill-1")), PathBuf::from("/tmp/drill-1"));
    }

    #[test]
    fn the_rto_is_whole_milliseconds_so_a_json_reader_gets_the_metrics_files_number() {
        let run = RunReport {
            operation: "drill".into(),
            outcome: RunOutcome::Succeeded,
            stages: vec![
                stage("verify", 1.234567891, StageStatus::Succeeded, None),
                stage("wait", 30.0, StageStatus::Succeeded, Some(json!({"available_after_seconds": 1.41621357, "backup_revision": 7, "revisions": {}, "nodes_ready": {}}))),
            ],
            journal: None,
        };
        let rto = rto_seconds(&run).unwrap();
        assert_eq!(rto.to_string(), "2.651");
        // the metrics file prints it with `{}`, `-o json` with serde_json
        let read_back: f64 = serde_json::from_str(&serde_json::to_string(&rto).unwrap()).unwrap();
        assert_eq!(read_back, rto.to_string().parse::<f64>().unwrap());
    }
}
