//! `hcp-dr backup`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;

use super::{Exit, Output};
use crate::duration;
use crate::ops::backup::{BackupOptions, BackupResult, FleetResult, FleetSelection, backup, backup_all};
use crate::stages::context::{EtcdAccess, TlsOverride};
use crate::store::{S3Options, ServerSideEncryption};

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The HostedCluster to back up.
    #[arg(long, required_unless_present_any = ["resume", "abort", "all"], conflicts_with_all = ["resume", "abort"])]
    pub hosted_cluster: Option<String>,
    /// Its namespace (with --all: only this namespace; default every namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Back up every HostedCluster (of -n, else of every namespace) matching -l.
    #[arg(long, conflicts_with_all = ["hosted_cluster", "resume", "abort", "journal"])]
    pub all: bool,
    /// With --all: a label selector on the HostedClusters.
    #[arg(short = 'l', long, requires = "all")]
    pub selector: Option<String>,
    /// With --all: how many backups run at once [range: 1 to 64].
    #[arg(long, default_value_t = 2, requires = "all", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub concurrency: usize,
    /// With --all: back up only part INDEX of COUNT parts of the matching clusters (by their UID's hash; INDEX from 0), as each pod of an Indexed Job does (schedule render --shards).
    #[arg(long, value_name = "INDEX/COUNT", requires = "all", value_parser = parse_shard)]
    pub shard: Option<crate::ops::shard::Shard>,
    /// Management cluster kubeconfig (default: $KUBECONFIG, which may list
    /// several files, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// Where to write the backup: a directory, file:///path or s3://bucket/prefix
    /// [default: $HCP_DR_STORE; not used with --resume/--abort].
    #[arg(long, conflicts_with_all = ["resume", "abort"])]
    pub to: Option<String>,
    /// How long the pause lasts at most if hcp-dr dies [range: 1m to 7d].
    #[arg(long, default_value = "30m", value_parser = duration::PAUSE_TTL)]
    pub pause_ttl: Duration,
    /// How to reach etcd members.
    #[arg(long, value_enum, default_value_t = EtcdAccess::Auto)]
    pub etcd_access: EtcdAccess,
    /// Upper bound for each wait (pods gone, pods back) [range: 10s to 6h].
    #[arg(long, default_value = "5m", value_parser = duration::WAIT)]
    pub wait_timeout: Duration,
    /// How long the HyperShift operator has to acknowledge the pause. When it
    /// does not (it is down), hcp-dr pauses the HostedControlPlane and the
    /// Cluster API Cluster itself, as the operator would, and puts them back
    /// afterwards [range: 1s to 1h].
    #[arg(long, default_value = "60s", value_parser = duration::OPERATOR_ACK)]
    pub operator_ack_timeout: Duration,
    /// When etcd has no quorum (a majority of members down), snapshot the
    /// readable member with the highest revision instead of refusing; the
    /// manifest and `backups list` mark the backup as taken without quorum
    /// (it may lack the last acknowledged writes). With quorum, members that
    /// are down or lagging are skipped and recorded either way.
    #[arg(long)]
    pub allow_no_quorum: bool,
    #[command(flatten)]
    pub platform: crate::stages::context::PlatformSettings,
    /// etcd CA file (PEM), instead of the HCP namespace's.
    #[arg(long)]
    pub etcd_ca: Option<PathBuf>,
    /// etcd client certificate file (PEM).
    #[arg(long)]
    pub etcd_cert: Option<PathBuf>,
    /// etcd client key file (PEM).
    #[arg(long)]
    pub etcd_key: Option<PathBuf>,
    /// S3 endpoint for S3-compatible services (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    /// Server-side encryption: none, s3 (SSE-S3) or kms:KEY-ID (SSE-KMS).
    #[arg(long, default_value = "none")]
    pub sse: String,
    /// Also write every artifact to this store (repeatable, or
    /// comma-separated in HCP_DR_COPY_TO), in the same pass: an off-site
    /// copy. Each copy gets its manifest last, and only when it holds
    /// everything. A copy that fails fails the backup (unless
    /// --copy-optional).
    #[arg(long, value_name = "STORE", env = "HCP_DR_COPY_TO", value_delimiter = ',')]
    pub copy_to: Vec<String>,
    /// A --copy-to store that fails is a warning (and the report's
    /// `copies` says which): the backup is complete in --to.
    #[arg(long, requires = "copy_to")]
    pub copy_optional: bool,
    /// Lock every object of the backup with S3 Object Lock for this long
    /// from when it is written: nobody can delete or overwrite it before
    /// (`backups prune` skips it until then). --to (and every --copy-to)
    /// must be an S3 bucket with Object Lock enabled [range: 1s to 36500d].
    #[arg(long, value_name = "DURATION", env = "HCP_DR_LOCK_FOR", value_parser = duration::LOCK_FOR, conflicts_with_all = ["resume", "abort"])]
    pub lock_for: Option<Duration>,
    /// With --lock-for: compliance (nobody, not even the account's root,
    /// can delete it early) or governance (principals with
    /// s3:BypassGovernanceRetention can).
    #[arg(long, value_enum, default_value_t, env = "HCP_DR_LOCK_MODE", requires = "lock_for")]
    pub lock_mode: crate::store::object_lock::LockMode,
    #[command(flatten)]
    pub metrics: super::MetricsArgs,
    /// Encrypt the etcd snapshots and the objects archive client-side to
    /// this age public key (age1…; repeatable, or comma-separated in
    /// HCP_DR_ENCRYPT_TO). Restoring then needs --identity. A resumed run
    /// encrypts to the recipients its journal recorded.
    #[arg(long, value_name = "RECIPIENT", env = "HCP_DR_ENCRYPT_TO", value_delimiter = ',')]
    pub encrypt_to: Vec<String>,
    /// How the etcd snapshots are stored: zstd (level 1, the default),
    /// zstd:LEVEL (1-19) or none (as etcd streams them, format version 1).
    /// Compressed on another thread while they stream, before they are
    /// encrypted. The objects archive is gzip either way. A resumed run
    /// compresses as its journal recorded.
    #[arg(long, value_name = "zstd|zstd:LEVEL|none", default_value = "zstd", env = "HCP_DR_COMPRESSION", value_parser = crate::archive::compression::Compression::parse)]
    pub compression: crate::archive::compression::Compression,
    /// The Route53 hosted zone of the cluster's hostnames (Z123...): the
    /// manifest records their records and external-dns owner, which a
    /// restore with --take-over-dns needs when this management cluster is
    /// lost. Read only; a zone that cannot be read is a warning.
    #[arg(long, env = "HCP_DR_ROUTE53_ZONE")]
    pub route53_zone: Option<String>,
    /// Route53 endpoint override (default: the SDK's).
    #[arg(long, env = "HCP_DR_ROUTE53_ENDPOINT")]
    pub route53_endpoint: Option<String>,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
}

fn read_pem(what: &str, path: &Option<PathBuf>) -> Result<Option<String>, String> {
    path.as_ref()
        .map(|p| std::fs::read_to_string(p).map_err(|e| format!("--{what} {}: {e}", p.display())))
        .transpose()
}

fn sse(value: &str) -> Result<ServerSideEncryption, String> {
    match value {
        "none" => Ok(ServerSideEncryption::None),
        "s3" => Ok(ServerSideEncryption::S3),
        other => match other.strip_prefix("kms:") {
            Some(key) if !key.is_empty() => Ok(ServerSideEncryption::Kms { key_id: key.to_string() }),
            _ => Err(format!("--sse `{other}`: use none, s3 or kms:KEY-ID")),
        },
    }
}

fn options(args: Args, output: Output) -> Result<BackupOptions, String> {
    let tls = TlsOverride {
        ca_pem: read_pem("etcd-ca", &args.etcd_ca)?,
        cert_pem: read_pem("etcd-cert", &args.etcd_cert)?,
        key_pem: read_pem("etcd-key", &args.etcd_key)?,
    };
    if tls.cert_pem.is_some() != tls.key_pem.is_some() {
        return Err("--etcd-cert and --etcd-key go together".into());
    }
    let pushgateway = args.metrics.pushgateway(args.ca_bundle.clone())?;
    Ok(BackupOptions {
        kubeconfig: args.kubeconfig,
        context: args.context,
        hosted_cluster: args.hosted_cluster.clone().unwrap_or_default(),
        namespace: args.namespace.clone().unwrap_or_else(|| "clusters".into()),
        store: match super::store_or_env(args.to.clone(), args.run.journal_given().is_some()) {
            Some(store) => store,
            None if args.run.journal_given().is_some() => String::new(),
            None => return Err("--to is required: where to write the backup (a directory, file:///path or s3://bucket/prefix), or set HCP_DR_STORE".into()),
        },
        s3: S3Options {
            endpoint: args.s3_endpoint,
            ca_bundle: args.ca_bundle,
            sse: sse(&args.sse)?,
            ..S3Options::default()
        },
        pause_ttl: args.pause_ttl,
        etcd_access: args.etcd_access,
        wait_timeout: args.wait_timeout,
        extra_scale_down: Vec::new(),
        tls,
        run: args.run,
        observer: super::report::progress(output),
        metrics_file: args.metrics.metrics_file,
        pushgateway,
        encrypt_to: args.encrypt_to,
        fleet: None,
        route53_zone: args.route53_zone,
        route53_endpoint: args.route53_endpoint,
        operator_ack_timeout: Some(args.operator_ack_timeout),
        allow_no_quorum: args.allow_no_quorum,
        platform: args.platform,
        copy_to: args.copy_to,
        copy_optional: args.copy_optional,
        object_lock: args.lock_for.map(|retain_for| crate::store::object_lock::ObjectLock { mode: args.lock_mode, retain_for }),
        compression: args.compression,
    })
}

pub async fn exec(args: Args, output: Output) -> Exit {
    let fleet = args.all.then(|| FleetSelection {
        namespace: args.namespace.clone(),
        selector: args.selector.clone(),
        concurrency: args.concurrency,
        shard: args.shard,
    });
    let options = match options(args, output) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("error: {message}");
            return Exit::Usage;
        }
    };
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    if let Some(fleet) = fleet {
        return match backup_all(options, fleet, &mut interrupt).await {
            Ok(result) => {
                super::report::print(output, &result, || render_fleet(&result));
                if result.failed == 0 { Exit::Success } else { Exit::Failed }
            }
            Err(err) => super::report::error_exit(&err),
        };
    }
    match backup(options, &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render(&result));
            super::report::exit_for(&result.run.outcome)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

/// The fleet summary: one line per cluster, then each failure's report.
pub fn render_fleet(result: &FleetResult) -> String {
    let planned = |c: &crate::ops::backup::FleetMember| c.result.as_ref().is_some_and(|r| r.run.outcome == crate::pipeline::RunOutcome::Planned);
    let mut out = if !result.clusters.is_empty() && result.clusters.iter().all(planned) {
        format!("fleet backup plan (dry run: nothing was changed): {} cluster(s)\n", result.clusters.len())
    } else {
        format!("fleet backup: {} succeeded, {} failed\n", result.succeeded, result.failed)
    };
    if let (Some(shard), Some(others)) = (&result.shard, result.other_shards) {
        out.push_str(&format!("shard {shard}: {} matching cluster(s) here, {others} in the other shards\n", result.clusters.len()));
    }
    for c in &result.clusters {
        let line = match (&c.result, &c.error) {
            (Some(_), _) if planned(c) => format!("plan    {}  (dry run: would back it up; see `hcp-dr backup --hosted-cluster NAME --dry-run` for its stages)", c.hosted_cluster),
            (Some(r), _) if c.succeeded => format!(
                "ok      {}  {}  (API down {:.1}s)",
                c.hosted_cluster,
                r.backup.as_deref().unwrap_or("-"),
                r.api_downtime_seconds.unwrap_or_default()
            ),
            (Some(r), _) => format!("FAILED  {}  {}", c.hosted_cluster, super::report::headline("backup", &r.run, "hcp-dr backup").lines().next().unwrap_or_default()),
            (None, Some(e)) => format!("FAILED  {}  {e}", c.hosted_cluster),
            (None, None) => format!("FAILED  {}", c.hosted_cluster),
        };
        out.push_str(&line);
        out.push('\n');
    }
    for c in result.clusters.iter().filter(|c| !c.succeeded) {
        if let Some(r) = &c.result {
            out.push_str(&format!("\n--- {}\n{}", c.hosted_cluster, render(r)));
        }
    }
    out
}

/// The text report.
pub fn render(result: &BackupResult) -> String {
    let mut out = String::new();
    out.push_str(&super::report::headline("backup", &result.run, "hcp-dr backup"));
    out.push('\n');
    out.push_str(&super::report::stage_lines(&result.run));
    if let Some(backup) = &result.backup {
        out.push_str(&format!("backup: {backup}\n"));
    }
    if let Some(revision) = result.etcd_revision {
        out.push_str(&format!("etcd revision: {revision}\n"));
    }
    if let Some(downtime) = result.api_downtime_seconds {
        out.push_str(&format!("API downtime: {downtime:.1}s\n"));
    }
    if let Some(lock) = &result.object_lock {
        out.push_str(&format!("locked: S3 Object Lock {} until {}\n", lock.mode, lock.retain_until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
    }
    if let Some(journal) = &result.run.journal {
        out.push_str(&format!("journal: {journal}\n"));
    }
    for warning in &result.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_values() {
        assert_eq!(sse("kms:alias/x").unwrap(), ServerSideEncryption::Kms { key_id: "alias/x".into() });
        assert!(sse("kms:").is_err());
        assert!(sse("aes").is_err());
    }
}

pub fn parse_shard(text: &str) -> Result<crate::ops::shard::Shard, String> {
    crate::ops::shard::Shard::parse(text).map_err(|e| e.to_string())
}
