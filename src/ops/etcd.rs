//! `hcp-dr etcd ...`: a hosted cluster's etcd. `status` reads every member
//! (read-only, no journal); `recover` replaces one failing member through
//! the etcd-recover playbook, journaled and resumable.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::OpsError;
use super::backup::{check_name, holder};
use crate::pipeline::runner::Observer;
use crate::pipeline::{
    Interrupt, Journal, Mode, OnFailure, RunOutcome, RunReport, Runner, StageStatus, builtin,
};
use crate::stages::context::{EtcdAccess, TlsOverride};
use crate::stages::etcd_ops::health::{self, ClusterHealth, EtcdCluster, HealthError};
use crate::stages::etcd_ops::{RECOVER_RULES, RecoverContext, RecoverInputs, recover_catalog};

/// The operation's name in playbooks and journals.
pub const RECOVER: &str = "etcd-recover";

/// Which hosted cluster's etcd, and how to reach it.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub hosted_cluster: String,
    pub namespace: String,
    pub etcd_access: EtcdAccess,
    pub tls: TlsOverride,
}

fn read_error(err: HealthError) -> OpsError {
    match err {
        HealthError::Kube(err) => OpsError::Kube(err),
        other => OpsError::Input(other.to_string()),
    }
}

/// Read every member of the cluster's etcd; changes nothing.
pub async fn status(options: &StatusOptions) -> Result<ClusterHealth, OpsError> {
    check_name("hosted cluster", &options.hosted_cluster)?;
    check_name("namespace", &options.namespace)?;
    let client =
        crate::kube::client(options.kubeconfig.as_deref(), options.context.as_deref()).await?;
    let hc = health::hosted_cluster(&client, &options.namespace, &options.hosted_cluster)
        .await
        .map_err(read_error)?;
    let tls = health::tls(&client, &hc.hcp_namespace(), &options.tls)
        .await
        .map_err(read_error)?;
    health::probe(&EtcdCluster {
        client: &client,
        hosted_cluster: &hc,
        access: options.etcd_access,
        tls: &tls,
    })
    .await
    .map_err(read_error)
}

/// Everything `hcp-dr etcd recover` was asked.
#[derive(Clone)]
pub struct RecoverOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub hosted_cluster: Option<String>,
    pub namespace: String,
    /// Recover this member (`etcd-N`) instead of the failing one.
    pub member: Option<String>,
    pub etcd_access: EtcdAccess,
    pub tls: TlsOverride,
    /// Bound on the rejoin wait (default 10m; on resume, replaces the journaled one).
    pub wait_timeout: Option<Duration>,
    pub playbook: Option<PathBuf>,
    pub journal: Option<PathBuf>,
    pub journal_dir: PathBuf,
    pub dry_run: bool,
    pub resume: Option<PathBuf>,
    pub abort: Option<PathBuf>,
    pub observer: Option<std::sync::Arc<dyn Observer>>,
}

/// What a recovery reports: what was done to which member.
#[derive(Debug, Clone, Serialize)]
pub struct RecoverResult {
    #[serde(flatten)]
    pub run: RunReport,
    pub hosted_cluster: String,
    pub member: Option<String>,
    pub reason: Option<String>,
    pub old_pod_uid: Option<String>,
    pub new_pod_uid: Option<String>,
    pub pvc: Option<String>,
    pub old_pvc_uid: Option<String>,
    pub new_pvc_uid: Option<String>,
    /// The cluster's (leader's) revision before, and the member's once rejoined.
    pub revision_before: Option<i64>,
    pub revision_after: Option<i64>,
    /// From the deletion of the pod and volume to the member caught up.
    pub seconds: Option<f64>,
    pub warnings: Vec<String>,
}

fn resolve_inputs(options: &RecoverOptions) -> Result<RecoverInputs, OpsError> {
    let hosted_cluster = options.hosted_cluster.clone().ok_or_else(|| {
        OpsError::Input("--hosted-cluster is required (or --resume/--abort JOURNAL)".into())
    })?;
    check_name("hosted cluster", &hosted_cluster)?;
    check_name("namespace", &options.namespace)?;
    if let Some(member) = &options.member {
        check_name("--member", member)?;
    }
    Ok(RecoverInputs {
        hosted_cluster,
        namespace: options.namespace.clone(),
        member: options.member.clone(),
        etcd_access: options.etcd_access,
        wait_timeout_seconds: options.wait_timeout.unwrap_or(DEFAULT_WAIT).as_secs(),
        holder: holder(),
    })
}

/// How long `rejoin` waits unless told.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(600);

/// Whether the run has journaled a first change in `stage` (the point of no
/// return). A stop before that changed nothing that cannot be put back:
/// undo it at once (a plain failure) instead of leaving the run open.
pub(crate) fn changed_the_cluster(journal: &Path, stage: &str) -> Result<bool, OpsError> {
    Ok(Journal::read(journal)?.stage(stage).progress.is_some())
}

/// The stopped run's report with the undo's statuses, as a plain failure.
pub(crate) fn undone(stopped: RunReport, undo: RunReport, stage: String, error: String) -> RunReport {
    let stages = stopped
        .stages
        .into_iter()
        .zip(undo.stages)
        .map(|(first, later)| match later.status {
            StageStatus::Undone | StageStatus::UndoFailed { .. } => crate::pipeline::StageReport {
                status: later.status,
                ..first
            },
            _ => first,
        })
        .collect();
    let outcome = match undo.outcome {
        RunOutcome::UndoFailed { undo_errors, .. } => RunOutcome::UndoFailed {
            stage,
            error,
            undo_errors,
        },
        _ => RunOutcome::RolledBack { stage, error },
    };
    RunReport {
        outcome,
        stages,
        ..stopped
    }
}

/// Run (or resume, abort, dry-run) the recovery of one etcd member.
pub async fn recover(
    options: RecoverOptions,
    interrupt: &mut Interrupt,
) -> Result<RecoverResult, OpsError> {
    let playbook = builtin::load(RECOVER, options.playbook.as_deref())?;
    playbook.check(&RECOVER_RULES)?;
    let journal_given = options.resume.clone().or(options.abort.clone());
    let mut inputs = match &journal_given {
        Some(journal) => super::journal_inputs::<RecoverInputs>(journal, RECOVER)?.0,
        None => resolve_inputs(&options)?,
    };
    // A longer wait may be given when resuming after a timeout.
    if let Some(wait) = options.wait_timeout {
        inputs.wait_timeout_seconds = wait.as_secs();
    }
    if inputs.wait_timeout_seconds < 30 {
        return Err(OpsError::Input(format!(
            "--wait-timeout {}s is too short: a member needs time to start and catch up; use at least 30s (default 10m)",
            inputs.wait_timeout_seconds
        )));
    }
    let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), journal_given.as_deref()).await?;
    let client = target.client;
    let mut ctx = RecoverContext::new(client, inputs.clone(), options.tls.clone());
    let catalog = recover_catalog();
    let runner = Runner {
        operation: RECOVER,
        playbook: &playbook,
        catalog: &catalog,
        observer: options.observer.as_deref(),
        on_failure: OnFailure::Stop,
    };
    let journal_path = super::journal_path(
        journal_given.as_deref(),
        options.journal.as_deref(),
        &options.journal_dir,
        RECOVER,
        &inputs.namespace,
        &inputs.hosted_cluster,
        &super::stamp(),
    );
    let mode = super::run_mode(
        options.dry_run,
        options.abort.is_some(),
        options.resume.is_some(),
        &journal_path,
        &inputs,
        vec![target.binding],
        super::NextSteps { command: "hcp-dr etcd recover", resume: Some("goes on"), abort: Some("releases its Lease") },
    )?;
    let mut run = runner.run(&mut ctx, mode, interrupt).await?;
    if let RunOutcome::Stopped { stage, error } = run.outcome.clone()
        && !changed_the_cluster(&journal_path, "replace")?
    {
        let undo = runner
            .run(
                &mut ctx,
                Mode::Abort {
                    journal: &journal_path,
                },
                interrupt,
            )
            .await?;
        run = undone(run, undo, stage, error);
    }

    let assess = run.output("assess");
    let replace = run.output("replace");
    let rejoin = run.output("rejoin");
    let text = |value: Option<&serde_json::Value>, key: &str| {
        value.and_then(|v| v[key].as_str()).map(str::to_string)
    };
    Ok(RecoverResult {
        hosted_cluster: format!("{}/{}", inputs.namespace, inputs.hosted_cluster),
        member: text(assess, "member"),
        reason: text(assess, "reason"),
        old_pod_uid: text(replace, "pod_uid").or(text(assess, "pod_uid")),
        new_pod_uid: text(rejoin, "pod_uid"),
        pvc: text(assess, "pvc"),
        old_pvc_uid: text(replace, "pvc_uid").or(text(assess, "pvc_uid")),
        new_pvc_uid: text(rejoin, "pvc_uid"),
        revision_before: assess.and_then(|a| a["cluster_revision"].as_i64()),
        revision_after: rejoin.and_then(|r| r["revision"].as_i64()),
        seconds: rejoin.and_then(|r| r["seconds"].as_f64()),
        warnings: ctx.warnings.clone(),
        run,
    })
}

/// For `playbook show etcd-recover`.
pub fn describe_playbook(file: Option<&Path>) -> Result<Vec<(String, String, bool)>, OpsError> {
    super::describe(RECOVER, file, &RECOVER_RULES, &recover_catalog())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::StageReport;

    fn report(outcome: RunOutcome, statuses: Vec<StageStatus>) -> RunReport {
        RunReport {
            operation: RECOVER.into(),
            outcome,
            stages: ["lock", "assess", "replace"]
                .iter()
                .zip(statuses)
                .map(|(name, status)| StageReport {
                    name: name.to_string(),
                    status,
                    duration: Duration::from_secs(1),
                    output: None,
                })
                .collect(),
            journal: Some("j".into()),
        }
    }

    #[test]
    fn an_early_stop_becomes_a_plain_failure_with_the_lock_undone() {
        let stopped = report(
            RunOutcome::Stopped {
                stage: "assess".into(),
                error: "refused".into(),
            },
            vec![
                StageStatus::Succeeded,
                StageStatus::Failed {
                    error: "refused".into(),
                },
                StageStatus::Skipped,
            ],
        );
        let undo = report(
            RunOutcome::RolledBack {
                stage: "(abort)".into(),
                error: "aborted".into(),
            },
            vec![
                StageStatus::Undone,
                StageStatus::Skipped,
                StageStatus::Skipped,
            ],
        );
        let merged = undone(stopped, undo, "assess".into(), "refused".into());
        assert_eq!(
            merged.outcome,
            RunOutcome::RolledBack {
                stage: "assess".into(),
                error: "refused".into()
            }
        );
        let statuses: Vec<_> = merged.stages.iter().map(|s| s.status.clone()).collect();
        assert_eq!(
            statuses,
            vec![
                StageStatus::Undone,
                StageStatus::Failed {
                    error: "refused".into()
                },
                StageStatus::Skipped
            ]
        );
        assert_eq!(merged.stages[1].duration, Duration::from_secs(1));
    }
}
