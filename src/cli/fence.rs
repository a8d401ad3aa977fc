//! `hcp-dr fence` and `hcp-dr fence --release`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;

use crate::duration;
use super::{Exit, Output};
use crate::ops::fence::{FenceOptions, FenceResult, fence};
use crate::store::S3Options;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The HostedCluster whose copy on this management cluster is stale.
    #[arg(long, required_unless_present_any = ["resume", "abort"], conflicts_with_all = ["resume", "abort"])]
    pub hosted_cluster: Option<String>,
    /// Its namespace.
    #[arg(short = 'n', long, default_value = "clusters")]
    pub namespace: String,
    /// The management cluster holding the copy (the one that came back).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// The backup store: its fence (written by the restore elsewhere) says
    /// where the cluster runs now [default: $HCP_DR_STORE].
    #[arg(long)]
    pub store: Option<String>,
    /// Where the cluster runs now (API server URL), when the store cannot
    /// say (no fence, or the store is unreachable).
    #[arg(long, value_name = "API-SERVER-URL", conflicts_with = "release")]
    pub runs_on: Option<String>,
    /// Lift the fence: this copy is the one to keep (the other is stopped).
    #[arg(long, conflicts_with = "abort")]
    pub release: bool,
    /// With --release: rewrite the store fence to name this management
    /// cluster, when it names another one.
    #[arg(long, requires = "release")]
    pub claim_store: bool,
    /// How long to wait for the copy's pods to go [range: 10s to 6h].
    #[arg(long, default_value = "5m", value_parser = duration::WAIT)]
    pub wait_timeout: Duration,
    /// S3 endpoint for S3-compatible services.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
}

pub async fn exec(args: Args, output: Output) -> Exit {
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    let aborting = args.run.aborting();
    let from_journal = args.run.journal_given().is_some();
    let options = FenceOptions {
        kubeconfig: args.kubeconfig,
        context: args.context,
        namespace: args.namespace,
        hosted_cluster: args.hosted_cluster,
        store: super::store_or_env(args.store, from_journal),
        s3: S3Options { endpoint: args.s3_endpoint, ca_bundle: args.ca_bundle, ..S3Options::default() },
        runs_on: args.runs_on,
        release: args.release,
        claim_store: args.claim_store,
        wait: args.wait_timeout,
        run: args.run,
        observer: super::report::progress(output),
    };
    match fence(options, &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render(&result));
            super::report::exit_for_run(&result.run.outcome, aborting)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

pub fn render(result: &FenceResult) -> String {
    use crate::pipeline::RunOutcome;
    let what = if result.release { "fence --release" } else { "fence" };
    let mut out = super::report::headline(what, &result.run, "hcp-dr fence");
    out.push('\n');
    out.push_str(&super::report::stage_lines(&result.run));
    let (ns, name) = result.hosted_cluster.split_once('/').unwrap_or(("", &result.hosted_cluster));
    match (&result.run.outcome, result.release) {
        (RunOutcome::Succeeded, false) => {
            out.push_str(&format!(
                "HostedCluster {} is fenced on {}: the cluster runs on {}.\n",
                result.hosted_cluster,
                result.here.describe(),
                result.runs_on.describe()
            ));
            if !result.scaled_to_zero.is_empty() {
                out.push_str(&format!("scaled to 0 (no pod of this copy runs): {}\n", result.scaled_to_zero.join(", ")));
            }
            if !result.routes_removed.is_empty() {
                out.push_str(&format!("Routes removed (this cluster's external-dns publishes none of them): {}\n", result.routes_removed.join(", ")));
            }
            out.push_str(&format!(
                "backup, `cluster resume` and etcd repairs refuse this copy. Once you have decided: `hcp-dr cluster destroy {name} -n {ns}` removes it from this management cluster only (cloud resources and workers are the live copy's: see docs/runbooks/disaster.md), or `hcp-dr fence --release --hosted-cluster {name} -n {ns}` lets it run again if it is the copy to keep\n"
            ));
        }
        (RunOutcome::Succeeded, true) => {
            out.push_str(&format!(
                "HostedCluster {} is released on {}: its control plane is scaled back and its pause lifted; the operator recreates its Routes. Watch `kubectl get hostedcluster -n {ns} {name}` until Available\n",
                result.hosted_cluster,
                result.here.describe()
            ));
        }
        _ => {}
    }
    if let Some(journal) = &result.run.journal {
        out.push_str(&format!("journal: {journal}\n"));
    }
    for warning in &result.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}
