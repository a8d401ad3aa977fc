//! `hcp-dr restore`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;

use crate::duration;
use super::{Exit, Output};
use crate::ops::restore::{Decrypt, RestoreOptions, RestoreResult, restore_with};
use crate::stages::context::EtcdAccess;
use crate::stages::restore::DnsInputs;
use crate::store::S3Options;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The backup: its URL (`s3://bucket/prefix/<ns>/<cluster>/<backup-id>`,
    /// a directory, or `.../latest`), or a store URL with --backup-id
    /// [default: $HCP_DR_STORE; not used with --resume/--abort].
    #[arg(long, conflicts_with_all = ["resume", "abort"])]
    pub from: Option<String>,
    /// The backup id in the store (or `latest`), with --hosted-cluster and -n.
    #[arg(long)]
    pub backup_id: Option<String>,
    /// The backed-up HostedCluster (restored under the same name).
    #[arg(long)]
    pub hosted_cluster: Option<String>,
    /// Its namespace (default: clusters).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Destination management cluster kubeconfig (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// For a backup in a local directory: an S3 store (s3://bucket/prefix)
    /// a temporary copy of the snapshot is uploaded to, so etcd can download
    /// it from a presigned URL; deleted once etcd has restored it.
    #[arg(long)]
    pub stage_snapshot_to: Option<String>,
    /// How long the presigned snapshot URL is valid (default 1h, 15m for the
    /// decrypted copy of an encrypted backup's snapshot) [range: 5m to 7d].
    #[arg(long, value_parser = duration::PRESIGN_TTL)]
    pub presign_ttl: Option<Duration>,
    /// age identity file (as age-keygen writes it) holding the private key
    /// of one of an encrypted backup's recipients. The snapshot etcd
    /// downloads is staged decrypted (--stage-snapshot-to, default the
    /// backup's own S3 store) and deleted once etcd has restored it.
    #[arg(long, env = "HCP_DR_IDENTITY")]
    pub identity: Option<PathBuf>,
    /// How long to wait for the restored cluster to be Available with its
    /// nodes Ready [range: 10s to 1d].
    #[arg(long = "wait", default_value = "30m", value_parser = duration::AVAILABLE_WAIT)]
    pub wait_timeout: Duration,
    /// Delete leftover data-etcd-* PVCs in the HCP namespace instead of refusing.
    #[arg(long)]
    pub clean_leftovers: bool,
    /// Replace existing objects that differ from the backup instead of refusing.
    #[arg(long)]
    pub overwrite: bool,
    /// How to reach the restored etcd members for the revision check.
    #[arg(long, value_enum, default_value_t = EtcdAccess::Auto)]
    pub etcd_access: EtcdAccess,
    /// KubeVirt: the image of the data-mover Jobs that write the guest
    /// volumes back (it runs `hcp-dr volume-mover`) [default:
    /// quay.io/hcp-dr/hcp-dr:v<this version>].
    #[arg(long, env = "HCP_DR_MOVER_IMAGE", value_parser = super::image_ref)]
    pub mover_image: Option<String>,
    /// S3 endpoint for S3-compatible services (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    /// The Route53 hosted zone of the cluster's hostnames (Z123...): the
    /// report says which records still point at the old management
    /// cluster; needed by --take-over-dns.
    #[arg(long, env = "HCP_DR_ROUTE53_ZONE")]
    pub route53_zone: Option<String>,
    /// Route53 endpoint override (default: the SDK's).
    #[arg(long, env = "HCP_DR_ROUTE53_ENDPOINT")]
    pub route53_endpoint: Option<String>,
    /// The backup's management cluster is lost: once the restored cluster
    /// is Available, delete the records of its hostnames that the lost
    /// cluster's external-dns owns (owner-checked, all or nothing) and wait
    /// until the destination's external-dns has published its own. Never
    /// with a healthy source (use migrate).
    #[arg(long)]
    pub take_over_dns: bool,
    /// The lost cluster's external-dns owner id (--txt-owner-id), when the
    /// backup did not record it or recorded another [default: the backup's].
    #[arg(long, value_name = "OWNER")]
    pub dns_owner: Option<String>,
    /// How long to wait for the destination's external-dns to publish the
    /// hostnames [range: 10s to 1d].
    #[arg(long, default_value = "10m", value_parser = duration::DNS_WAIT)]
    pub dns_wait: Duration,
    /// Only take the DNS records over (with --take-over-dns), for a
    /// cluster this backup was already restored from by a restore that
    /// ran without --take-over-dns.
    #[arg(long, requires = "take_over_dns")]
    pub dns_only: bool,
    #[command(flatten)]
    pub seed: super::SeedArgs,
    #[command(flatten)]
    pub at: super::AtArgs,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
}

fn options(args: Args, output: Output) -> RestoreOptions {
    RestoreOptions {
        kubeconfig: args.kubeconfig,
        context: args.context,
        from: super::store_or_env(args.from, args.run.journal_given().is_some()),
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
        wait_timeout: args.wait_timeout,
        clean_leftovers: args.clean_leftovers,
        overwrite: args.overwrite,
        etcd_access: args.etcd_access,
        mover_image: args.mover_image,
        etcd_seed: args.seed.inputs(),
        run: args.run,
        observer: super::report::progress(output),
        dns: (args.route53_zone.is_some() || args.take_over_dns || args.dns_owner.is_some()).then(|| DnsInputs {
            zone_id: args.route53_zone.clone().unwrap_or_default(),
            endpoint: args.route53_endpoint.clone(),
            take_over: args.take_over_dns,
            owner: args.dns_owner.clone(),
            wait_seconds: args.dns_wait.as_secs(),
        }),
        dns_only: args.dns_only,
        at: args.at.point(args.identity.as_deref()),
    }
}

pub async fn exec(args: Args, output: Output) -> Exit {
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    let aborting = args.run.aborting();
    let decrypt = Decrypt {
        identity: args.identity.clone(),
        presign_ttl_given: args.presign_ttl.is_some(),
    };
    match restore_with(options(args, output), decrypt, &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render(&result));
            super::report::exit_for_run(&result.run.outcome, aborting)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

/// What the report says of the cluster's DNS records.
fn dns_lines(result: &RestoreResult) -> String {
    let Some(taken) = &result.dns_takeover else {
        return String::new();
    };
    let mut out = String::new();
    let owner = taken.old_owner.as_deref().unwrap_or("unknown");
    if taken.skipped.is_none() {
        out.push_str(&format!("DNS taken over from external-dns owner {owner} (waited {:.1}s):\n", taken.waited_seconds));
        for host in &taken.hosts {
            out.push_str(&format!(
                "  {}: {} -> {} (owner {})\n",
                host.host,
                if host.old_targets.is_empty() { "(no record)".to_string() } else { host.old_targets.join(" ") },
                host.new_targets.join(" "),
                host.new_owner.as_deref().unwrap_or("several")
            ));
        }
    } else if !taken.still_old.is_empty() {
        out.push_str(&format!("DNS: these records still point at the old management cluster (external-dns owner {owner}):\n"));
        for r in &taken.still_old {
            out.push_str(&format!("  {r}\n"));
        }
    } else if taken.zone_id.is_none() && !taken.hostnames.is_empty() {
        out.push_str(&format!(
            "DNS: not checked (no --route53-zone); the records of {} may still point at the old management cluster\n",
            taken.hostnames.join(", ")
        ));
    }
    if !taken.outside_zone.is_empty() {
        out.push_str(&format!(
            "DNS: left alone, not in zone {}: {} (hcp-dr neither checks nor takes over names outside the zone; a name in the old management cluster's ingress domain changes with the management cluster)\n",
            taken.zone_id.as_deref().unwrap_or("?"),
            taken.outside_zone.join(", ")
        ));
    }
    if let Some(command) = &result.take_over_dns_command {
        out.push_str(&format!("once the old management cluster is down for good, take them over: {command}\n"));
    }
    out
}

/// The text report.
pub fn render(result: &RestoreResult) -> String {
    let mut out = super::report::headline("restore", &result.run, "hcp-dr restore");
    out.push('\n');
    out.push_str(&format!("backup: {}\nhosted cluster: {}\n", result.backup, result.hosted_cluster));
    out.push_str(&super::report::stage_lines(&result.run));
    if let Some(seeded) = &result.seeded {
        out.push_str(&super::etcd_seed_line(seeded));
    }
    if let Some(healthy) = &result.healthy {
        out.push_str(&format!(
            "Available after {:.1}s; etcd revisions {} (backup {})\n",
            healthy.available_after_seconds,
            serde_json::json!(healthy.revisions),
            healthy.backup_revision
        ));
        if let Some(etcd) = &healthy.etcd {
            out.push_str(&super::one_cluster_line(etcd));
        }
    }
    if let Some(point) = &result.point_in_time {
        out.push_str(&format!("{}\n", point.describe()));
    }
    if let (Some(taken), Some(age), Some(point)) = (result.backup_taken, result.backup_age_seconds, &result.point_in_time)
        && matches!(result.run.outcome, crate::pipeline::RunOutcome::Succeeded)
    {
        out.push_str(&format!(
            "RPO: restored to revision {}, received {} ({} before this restore); the {} later revision(s) the stream holds are not restored\n",
            point.point.revision,
            taken.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            crate::ops::drill::report::human_seconds(age as f64),
            point.point.later_revisions
        ));
    } else if let (Some(taken), Some(age)) = (result.backup_taken, result.backup_age_seconds)
        && matches!(result.run.outcome, crate::pipeline::RunOutcome::Succeeded)
    {
        out.push_str(&format!(
            "RPO: the backup was taken {} ({} before this restore): writes to the hosted cluster after it are lost\n",
            taken.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            crate::ops::drill::report::human_seconds(age as f64)
        ));
    }
    if let Some(fence) = &result.fence {
        out.push_str(&format!("fenced in the store: {}; backups of any other copy are refused\n", fence.describe()));
    }
    if let Some(report) = result.oidc.as_ref().filter(|r| !r.summary().1) {
        out.push_str(&format!("{}\n", report.summary().0));
    }
    out.push_str(&dns_lines(result));
    if let Some(journal) = &result.run.journal {
        out.push_str(&format!("journal: {journal}\n"));
    }
    if let Some(key) = &result.recorded {
        out.push_str(&format!("result recorded: {key}\n"));
    }
    for warning in &result.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}
