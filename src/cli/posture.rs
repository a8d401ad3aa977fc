//! `hcp-dr report`: the fleet's DR posture as text, JSON or one HTML page.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;

use super::{Exit, Output};
use crate::duration;
use crate::ops::OpsError;
use crate::ops::posture::{self, PostureOptions, Thresholds};
use crate::store::S3Options;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The store: a directory, file:///path or s3://bucket/prefix. Repeat
    /// it for the store's copies: a newest backup missing from one is amber.
    #[arg(long, env = "HCP_DR_STORE", required = true)]
    pub store: Vec<String>,
    /// A management cluster whose HostedClusters must all be covered: each
    /// one without a backup is a red row. Unreachable: the report is from
    /// the store alone, and says so.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long, requires = "kubeconfig")]
    pub context: Option<String>,
    /// The backup schedule (cron, as the CronJob's): one interval is its
    /// longest gap between two runs.
    #[arg(long, default_value = "0 */6 * * *")]
    pub schedule: String,
    /// Red when the newest good backup is older than this many intervals
    /// (as the HcpDrBackupStale alert of `schedule render --monitoring`);
    /// amber after one and a half [range: 1 to 100].
    #[arg(long, default_value_t = 2.0)]
    pub stale_after: f64,
    /// Amber when a cluster's last drill is older than this (or it never
    /// had one) [range: 1h to 366d].
    #[arg(long, default_value = "30d", value_parser = duration::DRILL_EVERY)]
    pub drill_every: Duration,
    /// Amber when the last drill took longer than this from its start to
    /// the restored cluster Available [range: 10s to 7d].
    #[arg(long, value_parser = duration::RTO_TARGET)]
    pub rto_target: Option<Duration>,
    /// Write the report to this file instead of stdout (the HTML page is
    /// one self-contained file).
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// S3 endpoint for S3-compatible services.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
}

pub async fn exec(args: Args, output: Output) -> Exit {
    if let Some(dir) = args.output_file.as_deref().map(|f| f.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."))) {
        if !dir.is_dir() {
            let file = args.output_file.as_deref().unwrap_or(dir).display();
            return super::report::error_exit(&OpsError::Input(format!("--output-file {file}: the directory {} does not exist", dir.display())));
        }
    }
    let options = PostureOptions {
        stores: args.store,
        s3: S3Options { endpoint: args.s3_endpoint, ca_bundle: args.ca_bundle, ..S3Options::default() },
        kubeconfig: args.kubeconfig,
        context: args.context,
        thresholds: Thresholds {
            schedule: args.schedule,
            stale_after: args.stale_after,
            drill_every: args.drill_every,
            rto_target: args.rto_target,
        },
    };
    let report = match posture::report(&options).await {
        Ok(r) => r,
        Err(e) => return super::report::error_exit(&e),
    };
    for w in &report.warnings {
        tracing::warn!("{w}");
    }
    if let Some(err) = &report.management_cluster_error {
        tracing::warn!("{err}");
    }
    let body = match output {
        Output::Html => posture::html::page(&report),
        Output::Json => serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        Output::Yaml => super::report::yaml(&report),
        Output::Text => posture::text(&report),
    };
    match &args.output_file {
        None => print!("{body}"),
        Some(file) => {
            if let Err(e) = std::fs::write(file, body) {
                return super::report::error_exit(&OpsError::Input(format!("--output-file {}: {e}", file.display())));
            }
            eprintln!("report written to {} ({} red, {} amber, {} green)", file.display(), report.red, report.amber, report.green);
        }
    }
    Exit::Success
}
