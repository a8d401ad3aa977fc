//! `hcp-dr schedule render`.

use clap::Subcommand;

use super::{Exit, Output};
use crate::duration;
use crate::ops::schedule::{ScheduleOptions, render, render_yaml};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the Namespace, ServiceAccount, least-privilege RBAC and CronJob
    /// that run backups unattended (apply with `kubectl apply -f -`).
    #[command(after_help = "Example:\n  hcp-dr schedule render --schedule \"0 */6 * * *\" --to s3://bucket/prefix --keep-daily 7 | kubectl apply -f -")]
    Render {
        /// Cron schedule, e.g. "0 */6 * * *".
        #[arg(long)]
        schedule: String,
        /// The store backups go to.
        #[arg(long)]
        to: String,
        /// Namespace for the CronJob and its ServiceAccount.
        #[arg(long, default_value = "hcp-dr")]
        namespace: String,
        /// The hcp-dr image (built from the Containerfile).
        #[arg(long, default_value = concat!("quay.io/hcp-dr/hcp-dr:", env!("CARGO_PKG_VERSION")), value_parser = super::image_ref)]
        image: String,
        /// Back up only this HostedCluster (default: every one, --all).
        #[arg(long)]
        hosted_cluster: Option<String>,
        /// Its namespace.
        #[arg(short = 'n', long = "cluster-namespace", default_value = "clusters")]
        cluster_namespace: String,
        /// With every cluster: a label selector on the HostedClusters.
        #[arg(short = 'l', long, conflicts_with = "hosted_cluster")]
        selector: Option<String>,
        /// S3 endpoint for S3-compatible services.
        #[arg(long)]
        s3_endpoint: Option<String>,
        /// Secret (in --namespace) holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
        #[arg(long)]
        credentials_secret: Option<String>,
        /// After each successful backup, prune keeping the N newest [range: 1 to 10000].
        #[arg(long, value_parser = super::keep_count())]
        keep_last: Option<usize>,
        /// And the newest of each of the last N days [range: 1 to 10000].
        #[arg(long, value_parser = super::keep_count())]
        keep_daily: Option<usize>,
        /// And the newest of each of the last N weeks [range: 1 to 10000].
        #[arg(long, value_parser = super::keep_count())]
        keep_weekly: Option<usize>,
        /// And remove backups older than this (e.g. 30d) [range: 1h to 36500d].
        #[arg(long, value_parser = duration::RETENTION_AGE)]
        max_age: Option<std::time::Duration>,
        /// The Route53 hosted zone of the clusters' hostnames: each backup
        /// records their records and external-dns owner, which a restore
        /// with --take-over-dns needs when this management cluster is lost.
        #[arg(long)]
        route53_zone: Option<String>,
        /// Spread the fleet over K pods: an Indexed Job (completionMode Indexed, parallelism K) whose pod i backs up (and prunes) the clusters of `--shard i/K`; a failing shard does not stop the others; 1 is one pod [range: 1 to 64].
        #[arg(long, default_value_t = 1, conflicts_with = "hosted_cluster", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
        shards: usize,
        /// Passed to each backup: push its metrics to this Pushgateway
        /// (http(s)://host:port), where Prometheus scrapes them.
        #[arg(long, value_name = "URL")]
        pushgateway: Option<String>,
        /// Passed to each backup: also write every artifact to this store
        /// (repeatable), an off-site copy in the same pass.
        #[arg(long, value_name = "STORE")]
        copy_to: Vec<String>,
        /// Passed to each backup: a failing copy is a warning.
        #[arg(long, requires = "copy_to")]
        copy_optional: bool,
        /// Passed to each backup: lock its objects with S3 Object Lock for
        /// this long (--to must be a bucket with Object Lock enabled)
        /// [range: 1s to 36500d].
        #[arg(long, value_name = "DURATION", value_parser = duration::LOCK_FOR)]
        lock_for: Option<std::time::Duration>,
        /// Passed to each backup with --lock-for: compliance or governance.
        #[arg(long, value_enum, default_value_t, requires = "lock_for")]
        lock_mode: crate::store::object_lock::LockMode,
        /// Also render a PrometheusRule (alerts: a backup failing, stale, a
        /// cluster never backed up or unprotected, no reports at all, a
        /// drill failed or overdue, the store unreachable) and a Grafana
        /// dashboard ConfigMap (label grafana_dashboard: "1"). Needs
        /// --pushgateway (the alerts read what each backup pushes) and
        /// --runbook-base.
        #[arg(long, requires_all = ["pushgateway", "runbook_base"])]
        monitoring: bool,
        /// With --monitoring: a backup is stale after N times the longest gap
        /// between two runs of --schedule [range: 1 to 100].
        #[arg(long, default_value_t = 2.0, requires = "monitoring")]
        stale_after: f64,
        /// With --monitoring: alert when a cluster has had no passed drill
        /// (`hcp-dr drill --pushgateway`) for this long [range: 1h to 366d].
        #[arg(long, default_value = "30d", value_parser = duration::DRILL_EVERY, requires = "monitoring")]
        drill_every: std::time::Duration,
        /// With --monitoring: the URL where this project's docs/runbooks are
        /// published (e.g. your Git host's copy of the repository); each
        /// alert links its section of backup.md there.
        #[arg(long, value_name = "URL", requires = "monitoring")]
        runbook_base: Option<String>,
        /// Passed to each backup (the data movers default to --image).
        #[command(flatten)]
        platform: crate::stages::context::PlatformSettings,
        /// Also render the continuous backup: a StatefulSet `hcp-dr-stream`
        /// of --shards pods, pod i streaming the clusters of shard i (each
        /// holding their Leases in --namespace), serving /metrics and
        /// /healthz on port 9102, with its own read-only ServiceAccount and
        /// RBAC (and, with --monitoring, alerts on its lag and chain breaks).
        #[arg(long)]
        continuous: bool,
    },
}

pub fn exec(command: Command, output: Output) -> Exit {
    let Command::Render {
        schedule,
        to,
        namespace,
        image,
        hosted_cluster,
        cluster_namespace,
        selector,
        s3_endpoint,
        credentials_secret,
        keep_last,
        keep_daily,
        keep_weekly,
        max_age,
        route53_zone,
        shards,
        pushgateway,
        copy_to,
        copy_optional,
        lock_for,
        lock_mode,
        monitoring,
        stale_after,
        drill_every,
        runbook_base,
        platform,
        continuous,
    } = command;
    let options = ScheduleOptions {
        schedule,
        store: to,
        namespace,
        image,
        hosted_cluster: hosted_cluster.map(|hc| (cluster_namespace, hc)),
        selector,
        s3_endpoint,
        credentials_secret,
        keep_last,
        keep_daily,
        keep_weekly,
        max_age: max_age.map(duration::show),
        route53_zone,
        shards,
        platform,
        pushgateway,
        copy_to,
        copy_optional,
        object_lock: lock_for.map(|retain_for| crate::store::object_lock::ObjectLock { mode: lock_mode, retain_for }),
        continuous,
        monitoring: monitoring.then(|| crate::ops::monitoring::Monitoring { stale_after, drill_every, runbook_base: runbook_base.unwrap_or_default() }),
    };
    let rendered = match output {
        Output::Json => render(&options).map(|objects| serde_json::to_string_pretty(&objects).unwrap_or_default() + "\n"),
        // the JSON list as YAML; text is the same objects as YAML documents, for kubectl apply
        Output::Yaml => render(&options).map(|objects| super::report::yaml(&objects)),
        Output::Text | Output::Html => render_yaml(&options),
    };
    match rendered {
        Ok(text) => {
            print!("{text}");
            Exit::Success
        }
        Err(err) => super::report::error_exit(&err),
    }
}
