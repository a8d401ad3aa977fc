//! `hcp-dr migrate`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;

use crate::duration;
use super::{Exit, Output};
use crate::ops::migrate::{MigrateOptions, MigrateResult, migrate};
use crate::stages::context::{EtcdAccess, TlsOverride};
use crate::store::S3Options;

#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The HostedCluster to move.
    #[arg(long, required_unless_present_any = ["resume", "abort"], conflicts_with_all = ["resume", "abort"])]
    pub hosted_cluster: Option<String>,
    /// Its namespace (kept on the destination).
    #[arg(short = 'n', long, default_value = "clusters")]
    pub namespace: String,
    /// Source management cluster kubeconfig.
    #[arg(long)]
    pub from_kubeconfig: Option<PathBuf>,
    /// Source kubeconfig context.
    #[arg(long)]
    pub from_context: Option<String>,
    /// Destination management cluster kubeconfig.
    #[arg(long)]
    pub to_kubeconfig: Option<PathBuf>,
    /// Destination kubeconfig context.
    #[arg(long)]
    pub to_context: Option<String>,
    /// The store the backup travels through (s3://bucket/prefix)
    /// [default: $HCP_DR_STORE; not used with --resume/--abort].
    #[arg(long, conflicts_with_all = ["resume", "abort"])]
    pub via: Option<String>,
    /// With a local --via: an S3 store for a temporary copy of the snapshot.
    #[arg(long)]
    pub stage_snapshot_to: Option<String>,
    /// The Route53 hosted zone of the cluster's hostnames (Z123...).
    #[arg(long, env = "HCP_DR_ROUTE53_ZONE")]
    pub route53_zone: Option<String>,
    /// Route53 endpoint override (default: the SDK's).
    #[arg(long, env = "HCP_DR_ROUTE53_ENDPOINT")]
    pub route53_endpoint: Option<String>,
    /// Delete the source's records (owner TXT) directly instead of waiting for external-dns.
    #[arg(long)]
    pub dns_direct: bool,
    /// How long to wait for the source's records to be gone [range: 10s to 1d].
    #[arg(long, default_value = "10m", value_parser = duration::DNS_WAIT)]
    pub dns_wait: Duration,
    /// How long the source stays paused at most if hcp-dr dies [range: 1m to 7d].
    #[arg(long, default_value = "2h", value_parser = duration::PAUSE_TTL)]
    pub pause_ttl: Duration,
    /// Upper bound of the source's waits (pods gone) [range: 10s to 6h].
    #[arg(long, default_value = "5m", value_parser = duration::WAIT)]
    pub wait_timeout: Duration,
    /// How long the source's HyperShift operator has to acknowledge the
    /// pause; when it is down, hcp-dr pauses the HostedControlPlane and the
    /// Cluster API Cluster itself [range: 1s to 1h].
    #[arg(long, default_value = "60s", value_parser = duration::OPERATOR_ACK)]
    pub operator_ack_timeout: Duration,
    /// When the source's etcd has no quorum, move what its readable member
    /// with the highest revision holds instead of refusing (it may lack the
    /// last acknowledged writes; the backup is marked so).
    #[arg(long)]
    pub allow_no_quorum: bool,
    #[command(flatten)]
    pub platform: crate::stages::context::PlatformSettings,
    /// Upper bound of the wait for the destination to be Available with its
    /// nodes Ready [range: 10s to 1d].
    #[arg(long = "wait", default_value = "30m", value_parser = duration::AVAILABLE_WAIT)]
    pub restore_wait: Duration,
    /// How long the presigned snapshot URL is valid [range: 5m to 7d].
    #[arg(long, default_value = "1h", value_parser = duration::PRESIGN_TTL)]
    pub presign_ttl: Duration,
    /// How to reach etcd members.
    #[arg(long, value_enum, default_value_t = EtcdAccess::Auto)]
    pub etcd_access: EtcdAccess,
    /// S3 endpoint for S3-compatible services.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 and Route53 endpoints.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    pub seed: super::SeedArgs,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
    /// Move the cluster as it was at TIME (RFC 3339) of its stream (`hcp-dr
    /// stream` writing to --via), e.g. when it was corrupted after TIME: the
    /// source is stopped and backed up as in every migration (the writes
    /// after TIME stay in that backup), then the stream is replayed to TIME
    /// and the destination restores that point.
    #[arg(long, value_name = "TIME", value_parser = super::stream::rfc3339, conflicts_with_all = ["at_revision", "resume", "abort"])]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// As --at, to exactly this etcd revision of the stream [range: 1 to
    /// 1000000000000000000].
    #[arg(long, value_name = "REVISION", value_parser = clap::value_parser!(i64).range(1..=1_000_000_000_000_000_000), conflicts_with_all = ["resume", "abort"])]
    pub at_revision: Option<i64>,
    /// The age identity file that opens an encrypted stream (with --at).
    #[arg(long, value_name = "FILE")]
    pub identity: Option<PathBuf>,
}

fn options(args: Args, output: Output) -> MigrateOptions {
    MigrateOptions {
        hosted_cluster: args.hosted_cluster,
        namespace: args.namespace,
        from_kubeconfig: args.from_kubeconfig,
        from_context: args.from_context,
        to_kubeconfig: args.to_kubeconfig,
        to_context: args.to_context,
        via: super::store_or_env(args.via, args.run.journal_given().is_some()),
        s3: S3Options {
            endpoint: args.s3_endpoint,
            ca_bundle: args.ca_bundle,
            ..S3Options::default()
        },
        stage_snapshot_to: args.stage_snapshot_to,
        route53_zone: args.route53_zone,
        route53_endpoint: args.route53_endpoint,
        operator_ack_timeout: Some(args.operator_ack_timeout),
        allow_no_quorum: args.allow_no_quorum,
        platform: args.platform,
        dns_direct: args.dns_direct,
        dns_wait: args.dns_wait,
        pause_ttl: args.pause_ttl,
        wait_timeout: args.wait_timeout,
        restore_wait: args.restore_wait,
        presign_ttl: args.presign_ttl,
        etcd_access: args.etcd_access,
        tls: TlsOverride::default(),
        etcd_seed: args.seed.inputs(),
        at: super::AtArgs { at: args.at, at_revision: args.at_revision }.point(args.identity.as_deref()),
        run: args.run,
        observer: super::report::progress(output),
    }
}

pub async fn exec(args: Args, output: Output) -> Exit {
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    if args.identity.is_some() && args.at.is_none() && args.at_revision.is_none() {
        eprintln!("error: --identity opens an encrypted stream for --at/--at-revision: a migration's own backup is not encrypted; drop --identity or add --at");
        return Exit::Usage;
    }
    let aborting = args.run.aborting();
    match migrate(options(args, output), &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render(&result));
            super::report::exit_for_run(&result.run.outcome, aborting)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

/// The text report.
pub fn render(result: &MigrateResult) -> String {
    let mut out = super::report::headline("migrate", &result.run, "hcp-dr migrate");
    out.push('\n');
    out.push_str(&format!("hosted cluster: {}\nbackup: {}\n", result.hosted_cluster, result.backup));
    out.push_str(&super::report::stage_lines(&result.run));
    if let Ok(Some(seeded)) = result.run.output_of::<crate::stages::restore::etcd_seed::EtcdSeed>() {
        out.push_str(&super::etcd_seed_line(&seeded));
    }
    if let Some(etcd) = result.run.output_of::<crate::stages::restore::wait::Wait>().ok().flatten().and_then(|h| h.etcd) {
        out.push_str(&super::one_cluster_line(&etcd));
    }
    if let Some(point) = &result.point_in_time {
        out.push_str(&format!("{}\n", point.describe()));
        out.push_str("the writes after the point are in the source's own backup above, not restored\n");
    }
    if let Some(rto) = result.rto_seconds {
        out.push_str(&format!("RTO (API down on the source until Available on the destination): {rto:.1}s\n"));
    }
    if let Some(journal) = &result.run.journal {
        out.push_str(&format!("journal: {journal}\n"));
    }
    if !result.dns_names.is_empty() {
        out.push_str("DNS names:\n");
        for name in &result.dns_names {
            out.push_str(&format!("  {name}\n"));
        }
    }
    if let Some(key) = &result.recorded {
        out.push_str(&format!("result recorded: {key}\n"));
    }
    for warning in &result.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosted::publishing::PublishedName;
    use crate::pipeline::runner::{RunOutcome, RunReport};

    #[test]
    fn the_report_lists_each_name_with_its_role_and_reason() {
        let name = |name: &str, via: &str, managed: bool, why: &str| PublishedName { name: name.into(), via: via.into(), managed, why: why.into() };
        let result = MigrateResult {
            run: RunReport { operation: "migrate".into(), outcome: RunOutcome::Succeeded, stages: Vec::new(), journal: None },
            hosted_cluster: "clusters/demo".into(),
            backup: "s3://b/x".into(),
            rto_seconds: None,
            stage_seconds: Default::default(),
            dns_names: vec![
                name("api.demo.example.com", "Service kube-apiserver (LoadBalancer)", true, "in zone Z1 (example.com)"),
                name("10.0.0.5", "HostedCluster Ignition (NodePort)", false, "a NodePort address"),
            ],
            warnings: Vec::new(),
            point_in_time: None,
            recorded: None,
        };
        let text = render(&result);
        assert!(text.contains("DNS names:\n  api.demo.example.com (Service kube-apiserver (LoadBalancer)): managed: in zone Z1 (example.com)\n"), "{text}");
        assert!(text.contains("  10.0.0.5 (HostedCluster Ignition (NodePort)): left alone: a NodePort address\n"), "{text}");
    }
}
