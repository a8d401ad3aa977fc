//! `hcp-dr fence`: stop and mark the stale copy of a hosted cluster on a
//! management cluster that came back after the cluster was restored
//! elsewhere; `hcp-dr fence --release`: let it run again once it is the copy
//! to keep. Both journaled and resumable (playbooks `fence`, `fence-release`).
//!
//! Everything is checked before a journal is written: the cluster exists;
//! where the live copy runs comes from the store fence (or `--runs-on`) and
//! is not this management cluster (fencing the live copy is refused, exit
//! 2); a release is refused while the store fence names another management
//! cluster, unless `--claim-store` says this copy wins.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::OpsError;
use crate::archive::ManagementCluster;
use crate::archive::fence::{self as store_fence, FenceError};
use crate::hosted::{HOSTED_CLUSTER, HostedCluster};
use crate::kube::{api, get_json};
use crate::pipeline::{OnFailure, RunReport};
use crate::stages::fence::{
    FENCE_PAUSE_SECONDS, FenceContext, FenceInputs, RemovedRoutes, Stopped, fence_catalog, release_catalog,
};
use crate::store::{self, S3Options};

pub const FENCE: &str = "fence";
pub const RELEASE: &str = "fence-release";

/// What `fence` was asked.
#[derive(Clone, Default)]
pub struct FenceOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: String,
    pub hosted_cluster: Option<String>,
    /// The store whose fence says where the cluster runs.
    pub store: Option<String>,
    pub s3: S3Options,
    /// Where the live copy runs, when the store cannot say (API server URL).
    pub runs_on: Option<String>,
    pub release: bool,
    pub claim_store: bool,
    pub wait: Duration,
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
    pub observer: Option<std::sync::Arc<dyn crate::pipeline::runner::Observer>>,
}

/// What a fence or a release reports.
#[derive(Debug, Clone, Serialize)]
pub struct FenceResult {
    #[serde(flatten)]
    pub run: RunReport,
    pub hosted_cluster: String,
    pub release: bool,
    /// The management cluster this run changed.
    pub here: ManagementCluster,
    /// Where the live copy runs (for a release: here).
    pub runs_on: ManagementCluster,
    /// Workloads scaled to 0 (`Kind name`).
    pub scaled_to_zero: Vec<String>,
    /// Routes deleted.
    pub routes_removed: Vec<String>,
    pub warnings: Vec<String>,
}

/// `fence` or `fence --release`, fresh or from a journal.
pub async fn fence(options: FenceOptions, interrupt: &mut crate::pipeline::Interrupt) -> Result<FenceResult, OpsError> {
    let journal_given = options.run.journal_given().map(std::path::Path::to_path_buf);
    let name = match &journal_given {
        Some(journal) => {
            let state = crate::pipeline::Journal::read(journal)?;
            match state.header.operation.as_str() {
                FENCE => FENCE,
                RELEASE => RELEASE,
                other => {
                    return Err(OpsError::Input(format!(
                        "{} is a `{other}` journal, not a fence's; use `hcp-dr {other}` with it",
                        journal.display()
                    )));
                }
            }
        }
        None if options.release => RELEASE,
        None => FENCE,
    };
    let operation = if name == FENCE { fence_operation() } else { release_operation() };
    let playbook = operation.load_playbook(&options.run)?;
    let operation_name = name;

    let mut warnings = Vec::new();
    let (inputs, target, store) = match &journal_given {
        Some(journal) => {
            let inputs: FenceInputs = super::journal_inputs(journal, operation_name)?.0;
            let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), Some(journal)).await?;
            let store = match (&inputs.store, inputs.claim_store) {
                (Some(url), true) => Some(store::open(url, options.s3.clone()).await?),
                _ => None,
            };
            (inputs, target, store)
        }
        None => fresh(&options, operation_name, &mut warnings).await?,
    };
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let here = ManagementCluster { server: target.binding.server.trim_end_matches('/').to_string(), kube_system_uid: target.binding.kube_system_uid.clone() };
    let mut ctx = FenceContext { client: target.client, inputs: inputs.clone(), store };
    let journaled = super::Journaled::new(&inputs, vec![target.binding], &[&inputs.namespace, &inputs.hosted_cluster]);
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;
    let stopped: Stopped = run.output_of::<crate::stages::fence::ScaleToZero>()?.unwrap_or_default();
    let removed: RemovedRoutes = run.output_of::<crate::stages::fence::RemoveRoutes>()?.unwrap_or_default();
    Ok(FenceResult {
        hosted_cluster: format!("{}/{}", inputs.namespace, inputs.hosted_cluster),
        release: operation_name == RELEASE,
        here,
        runs_on: inputs.runs_on.clone(),
        scaled_to_zero: stopped.previous.iter().map(|(kind, name, _)| format!("{kind} {name}")).collect(),
        routes_removed: removed.names(),
        warnings,
        run,
    })
}

/// The checks of a fresh run, before anything is journaled or changed.
async fn fresh(
    options: &FenceOptions,
    operation: &str,
    warnings: &mut Vec<String>,
) -> Result<(FenceInputs, super::target::Target, Option<Box<dyn store::Store>>), OpsError> {
    let name = options
        .hosted_cluster
        .clone()
        .ok_or_else(|| OpsError::Input("--hosted-cluster is required (or --resume/--abort JOURNAL)".into()))?;
    let ns = options.namespace.clone();
    super::backup::check_name("hosted cluster", &name)?;
    super::backup::check_name("namespace", &ns)?;
    let release = operation == RELEASE;
    if options.claim_store && options.store.is_none() {
        return Err(OpsError::Input("--claim-store rewrites the store fence: give the store with --store URL (or HCP_DR_STORE)".into()));
    }
    if let Some(url) = &options.runs_on {
        if release {
            return Err(OpsError::Input("--runs-on is for fencing; a release makes this management cluster the one that runs the cluster".into()));
        }
        if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() < 10 {
            return Err(OpsError::Input(format!(
                "--runs-on `{url}`: give the API server URL of the management cluster that runs the cluster now, e.g. https://api.mgmt-b.example.com:6443"
            )));
        }
    }
    if !release && options.store.is_none() && options.runs_on.is_none() {
        return Err(OpsError::Input(
            "say where the cluster runs now: --store URL (or HCP_DR_STORE; its fence, written by the restore, names the management cluster), or --runs-on API-SERVER-URL".into(),
        ));
    }
    let store = match &options.store {
        Some(url) => Some(store::open(url, options.s3.clone()).await?),
        None => None,
    };
    let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), None).await?;
    let here = ManagementCluster { server: target.binding.server.trim_end_matches('/').to_string(), kube_system_uid: target.binding.kube_system_uid.clone() };
    let label = format!("HostedCluster {ns}/{name}");
    let hc = get_json(&api(&target.client, &HOSTED_CLUSTER, &ns), &name, &label).await?.ok_or_else(|| {
        OpsError::Input(format!(
            "{label} not found on {}: nothing to {}; check the name, -n and --kubeconfig (the management cluster holding the copy)",
            here.describe(),
            if release { "release" } else { "fence" }
        ))
    })?;
    let fenced = HostedCluster(hc).fenced().map(str::to_string);

    let store_fence = match &store {
        Some(store) => match store_fence::read(store.as_ref(), &ns, &name).await {
            Ok(fence) => fence,
            Err(err @ FenceError::Unreadable { .. }) => return Err(OpsError::Input(err.to_string())),
            Err(FenceError::Store(err)) if !release && options.runs_on.is_some() => {
                warnings.push(format!("the store fence could not be read ({err}); fencing with --runs-on {} unchecked", options.runs_on.as_deref().unwrap_or_default()));
                None
            }
            Err(FenceError::Store(err)) => return Err(err.into()),
        },
        None => None,
    };

    let runs_on = if release {
        if fenced.is_none() {
            return Err(OpsError::Input(format!("{label} is not fenced on {}: nothing to release", here.describe())));
        }
        match &store_fence {
            Some(fence) if !fence.allows(&here) && !options.claim_store => {
                return Err(OpsError::Input(format!(
                    "refusing to release {label} on {}: the store fence says the cluster runs elsewhere ({}). Releasing would run two copies of one cluster. If this copy is the one to keep: stop the other (`hcp-dr fence` or `hcp-dr cluster destroy` there) and rerun with --claim-store, which rewrites the store fence to name this management cluster",
                    here.describe(),
                    fence.describe()
                )));
            }
            None if store.is_none() => warnings.push(format!(
                "no --store: the store fence of {ns}/{name} was not checked; make sure no other copy of the cluster runs, and that backups will be taken here"
            )),
            _ => {}
        }
        here.clone()
    } else {
        if let Some(fence) = &store_fence
            && fence.allows(&here)
        {
            return Err(OpsError::Input(format!(
                "refusing to fence {label} on {}: the store fence says the cluster runs HERE ({}). This is the live copy; fencing it would stop the cluster. Fence the stale copy on the other management cluster (with its kubeconfig)",
                here.describe(),
                fence.describe()
            )));
        }
        let runs_on = match (&store_fence, &options.runs_on) {
            (Some(fence), Some(flag)) if fence.runs_on.server.trim_end_matches('/') != flag.trim_end_matches('/') => {
                return Err(OpsError::Input(format!(
                    "--runs-on {flag} disagrees with the store fence ({}): drop --runs-on, or find out which management cluster runs the cluster",
                    fence.describe()
                )));
            }
            (Some(fence), _) => fence.runs_on.clone(),
            (None, Some(flag)) => {
                if let Some(store) = &store {
                    warnings.push(format!("the store {} holds no fence of {ns}/{name}; fencing with --runs-on {flag}", store.url()));
                }
                ManagementCluster { server: flag.trim_end_matches('/').to_string(), kube_system_uid: None }
            }
            (None, None) => {
                return Err(OpsError::Input(format!(
                    "the store {} holds no fence of {ns}/{name} (no restore or migrate wrote one): say where the cluster runs now with --runs-on API-SERVER-URL",
                    options.store.as_deref().unwrap_or_default()
                )));
            }
        };
        if runs_on.same_cluster(&here) {
            return Err(OpsError::Input(format!(
                "--runs-on names this management cluster ({}): fence the copy on the other one",
                here.describe()
            )));
        }
        if let Some(already) = &fenced {
            warnings.push(format!("{label} was already fenced (runs on {already}); fencing again keeps what the first fence recorded"));
        }
        runs_on
    };
    let inputs = FenceInputs {
        namespace: ns,
        hosted_cluster: name,
        runs_on,
        here,
        pause_seconds: FENCE_PAUSE_SECONDS,
        wait_seconds: options.wait.as_secs(),
        store: options.store.clone(),
        claim_store: options.claim_store,
    };
    Ok((inputs, target, if options.claim_store { store } else { None }))
}

/// The fence operation: a failure stops it, for `--resume` or `--abort`.
pub fn fence_operation() -> super::Operation<FenceContext> {
    super::Operation {
        command: "hcp-dr fence",
        playbook: FENCE,
        catalog: fence_catalog(),
        on_failure: OnFailure::Stop,
        resume: Some("finishes the fence"),
        abort: Some("undoes it (the stale copy starts again)"),
        no_abort_after: None,
        undo_stops_before: None,
    }
}

/// `fence --release`: a failure stops it, for `--resume` or `--abort`.
pub fn release_operation() -> super::Operation<FenceContext> {
    super::Operation {
        command: "hcp-dr fence",
        playbook: RELEASE,
        catalog: release_catalog(),
        on_failure: OnFailure::Stop,
        resume: Some("finishes the release"),
        abort: Some("puts the store fence back (the copy stays released)"),
        no_abort_after: None,
        undo_stops_before: None,
    }
}

