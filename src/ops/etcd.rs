//! `hcp-dr etcd ...`: a hosted cluster's etcd. `status` reads every member
//! (read-only, no journal); `recover` replaces one failing member through
//! the etcd-recover playbook, journaled and resumable.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::OpsError;
use super::backup::{check_name, holder};
use crate::pipeline::runner::Observer;
use crate::pipeline::{Interrupt, OnFailure, RunReport};
use crate::stages::context::{EtcdAccess, TlsOverride};
use crate::stages::etcd_ops::health::{self, ClusterHealth, EtcdCluster, HealthError};
use crate::stages::etcd_ops::{RecoverContext, RecoverInputs, recover_catalog};

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
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
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

/// Run (or resume, abort, dry-run) the recovery of one etcd member.
pub async fn recover(
    options: RecoverOptions,
    interrupt: &mut Interrupt,
) -> Result<RecoverResult, OpsError> {
    let operation = operation();
    let playbook = operation.load_playbook(&options.run)?;
    let journal_given = options.run.journal_given().map(Path::to_path_buf);
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
    let journaled = super::Journaled::new(&inputs, vec![target.binding], &[&inputs.namespace, &inputs.hosted_cluster]);
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;

    let assess = run.output_of::<crate::stages::etcd_ops::assess::Assess>()?;
    let replace = run.output_of::<crate::stages::etcd_ops::replace::Replace>()?;
    let rejoin = run.output_of::<crate::stages::etcd_ops::rejoin::Rejoin>()?;
    Ok(RecoverResult {
        hosted_cluster: format!("{}/{}", inputs.namespace, inputs.hosted_cluster),
        member: assess.as_ref().map(|a| a.member.clone()),
        reason: assess.as_ref().map(|a| a.reason.clone()),
        old_pod_uid: replace.as_ref().map(|r| r.pod_uid.clone()).or(assess.as_ref().map(|a| a.pod_uid.clone())),
        new_pod_uid: rejoin.as_ref().map(|r| r.pod_uid.clone()),
        pvc: assess.as_ref().map(|a| a.pvc.clone()),
        old_pvc_uid: replace.as_ref().map(|r| r.pvc_uid.clone()).or(assess.as_ref().map(|a| a.pvc_uid.clone())),
        new_pvc_uid: rejoin.as_ref().map(|r| r.pvc_uid.clone()),
        revision_before: assess.as_ref().and_then(|a| a.cluster_revision),
        revision_after: rejoin.as_ref().map(|r| r.revision),
        seconds: rejoin.as_ref().map(|r| r.seconds),
        warnings: ctx.warnings.clone(),
        run,
    })
}

/// The etcd-recover operation: a failure stops it; one that stops before
/// the member is replaced is undone at once.
pub fn operation() -> super::Operation<RecoverContext> {
    super::Operation {
        command: "hcp-dr etcd recover",
        playbook: RECOVER,
        catalog: recover_catalog(),
        on_failure: OnFailure::Stop,
        resume: Some("goes on"),
        abort: Some("releases its Lease"),
        no_abort_after: None,
        // before the member is replaced, a stop is undone at once
        undo_stops_before: Some(<crate::stages::etcd_ops::replace::Replace as crate::pipeline::StageId>::NAME),
    }
}

