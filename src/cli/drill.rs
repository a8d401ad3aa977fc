//! `hcp-dr drill`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;

use crate::duration;
use super::{Exit, Output};
use crate::ops::drill::{DEFAULT_SUFFIX, DrillCluster, DrillOptions, DrillResult, drill, report};
use crate::ops::restore::Decrypt;
use crate::pipeline::RunOutcome;
use crate::stages::context::EtcdAccess;
use crate::store::S3Options;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The backup: its URL (`s3://bucket/prefix/<ns>/<cluster>/<backup-id>`,
    /// a directory, or `.../latest`), or a store URL with --backup-id.
    /// [default: $HCP_DR_STORE; not used with --abort]
    #[arg(long)]
    pub from: Option<String>,
    /// The backup id in the store (or `latest`), with --hosted-cluster and -n.
    #[arg(long)]
    pub backup_id: Option<String>,
    /// The backed-up HostedCluster (the drill's is named NAME<suffix>).
    #[arg(long)]
    pub hosted_cluster: Option<String>,
    /// Its namespace (default: clusters).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The STAGING management cluster's kubeconfig (required: never guessed).
    #[arg(long, required_unless_present = "abort")]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// Added to the cluster's name and namespace for the drill cluster.
    #[arg(long, default_value = DEFAULT_SUFFIX, allow_hyphen_values = true)]
    pub name_suffix: String,
    /// Leave the drill cluster in place afterwards (also when the drill fails).
    #[arg(long, conflicts_with_all = ["abort"])]
    pub keep: bool,
    /// Write the report to FILE.md and FILE.json (a .md or .json extension is dropped first).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// For a backup in a local directory: an S3 store (s3://bucket/prefix)
    /// a temporary copy of the snapshot is uploaded to for etcd to download.
    #[arg(long)]
    pub stage_snapshot_to: Option<String>,
    /// How long the presigned snapshot URL is valid (default 1h, 15m for the
    /// decrypted copy of an encrypted backup's snapshot) [range: 5m to 7d].
    #[arg(long, value_parser = duration::PRESIGN_TTL)]
    pub presign_ttl: Option<Duration>,
    /// age identity file holding the private key of one of an encrypted
    /// backup's recipients (as for `hcp-dr restore`).
    #[arg(long, env = "HCP_DR_IDENTITY")]
    pub identity: Option<PathBuf>,
    /// How long to wait for the drill cluster to be Available with its nodes
    /// Ready [range: 10s to 1d].
    #[arg(long = "wait", default_value = "30m", value_parser = duration::AVAILABLE_WAIT)]
    pub wait_timeout: Duration,
    /// How to reach the drill cluster's etcd members for the checks.
    #[arg(long, value_enum, default_value_t = EtcdAccess::Auto)]
    pub etcd_access: EtcdAccess,
    /// S3 endpoint for S3-compatible services (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    pub seed: super::SeedArgs,
    #[command(flatten)]
    pub at: super::AtArgs,
    #[command(flatten)]
    pub metrics: super::MetricsArgs,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
}

fn options(args: Args, output: Output) -> Result<DrillOptions, String> {
    let pushgateway = args.metrics.pushgateway(args.ca_bundle.clone())?;
    Ok(DrillOptions {
        metrics_file: args.metrics.metrics_file,
        pushgateway,
        kubeconfig: args.kubeconfig,
        context: args.context,
        from: super::store_or_env(args.from, args.run.aborting()),
        backup_id: args.backup_id,
        hosted_cluster: args.hosted_cluster,
        namespace: args.namespace,
        s3: S3Options {
            endpoint: args.s3_endpoint,
            ca_bundle: args.ca_bundle,
            ..S3Options::default()
        },
        stage_snapshot_to: args.stage_snapshot_to,
        presign_ttl: args.presign_ttl.unwrap_or(Duration::from_secs(3600)),
        at: args.at.point(args.identity.as_deref()),
        decrypt: Decrypt {
            identity: args.identity,
            presign_ttl_given: args.presign_ttl.is_some(),
        },
        wait_timeout: args.wait_timeout,
        etcd_access: args.etcd_access,
        name_suffix: args.name_suffix,
        keep: args.keep,
        report: args.report,
        etcd_seed: args.seed.inputs(),
        run: args.run,
        observer: super::report::progress(output),
    })
}

/// 0 passed (or planned, or aborted); 1 a check or stage failed; 3 the
/// undo failed and something is left on the staging cluster.
fn exit(result: &DrillResult) -> Exit {
    match &result.run.outcome {
        RunOutcome::UndoFailed { .. } => Exit::NeedsAttention,
        _ if result.drill_cluster == DrillCluster::LeftAfterFailedUndo => Exit::NeedsAttention,
        RunOutcome::Aborted | RunOutcome::Planned => Exit::Success,
        _ if result.passed => Exit::Success,
        _ => Exit::Failed,
    }
}

pub async fn exec(args: Args, output: Output) -> Exit {
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    let options = match options(args, output) {
        Ok(o) => o,
        Err(e) => return super::report::error_exit(&crate::ops::OpsError::Input(e)),
    };
    match drill(options, &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render(&result));
            exit(&result)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

/// The text report.
pub fn render(result: &DrillResult) -> String {
    let mut out = report::headline(result);
    out.push('\n');
    out.push_str(&format!("backup: {}\n{} -> {}\n", result.backup, result.source, result.drill));
    if let Some(point) = &result.point_in_time {
        out.push_str(&format!("{}\n", point.describe()));
    }
    out.push_str(&super::report::stage_lines(&result.run));
    for check in &result.checks {
        out.push_str(&format!("  [{}] {}: {}\n", if check.passed { "pass" } else { "FAIL" }, check.name, check.detail));
    }
    let measured = |v: Option<f64>| v.map(report::human_seconds).unwrap_or_else(|| "not measured".into());
    out.push_str(&format!("RTO {} (drill start to Available), RPO {} (backup age)\n", measured(result.rto_seconds), measured(result.rpo_seconds)));
    out.push_str(&format!("drill cluster: {}\n", result.drill_cluster.describe()));
    if let Some(remove) = &result.remove_with {
        out.push_str(&format!("remove it with: `{remove}`\n"));
    }
    if let Some(journal) = &result.run.journal {
        out.push_str(&format!("journal: {journal}\n"));
    }
    if !result.report_files.is_empty() {
        out.push_str(&format!("report: {}\n", result.report_files.join(", ")));
    }
    if let Some(key) = &result.recorded {
        out.push_str(&format!("result recorded: {key}\n"));
    }
    for warning in &result.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}
