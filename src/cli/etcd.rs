//! `hcp-dr etcd status|recover|restore`: a hosted cluster's etcd members.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};

use crate::duration;
use super::{Exit, Output};
use crate::ops::etcd::{RecoverOptions, RecoverResult, StatusOptions, recover, status};
use crate::ops::etcd_restore::{EtcdRestoreOptions, EtcdRestoreResult, etcd_restore};
use crate::store::S3Options;
use crate::stages::context::{EtcdAccess, TlsOverride};
use crate::stages::etcd_ops::health::{ClusterHealth, MemberHealth};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One row per etcd member: pod, restarts, reachability, health, leader,
    /// raft term and index, revision, database size, alarms. Exit 1 when the
    /// cluster is degraded, 0 when it is healthy.
    #[command(after_help = "Example:\n  hcp-dr etcd status --hosted-cluster demo -n clusters")]
    Status(StatusArgs),
    /// Replace one failing member (its pod and volume claim together); it
    /// rejoins empty and catches up from the others. Refused when that would
    /// lose quorum, when several members fail, or for a SingleReplica cluster.
    #[command(after_help = "Example:\n  hcp-dr etcd recover --hosted-cluster demo -n clusters --member etcd-1")]
    Recover(RecoverArgs),
    /// Put the cluster's etcd back to a snapshot or backup, in place (the
    /// on-premise full restore): writers and etcd stopped, every member's
    /// volume restored with a revision above the one reached, etcd and the
    /// writers back, the pause lifted.
    #[command(after_help = "Example:\n  hcp-dr etcd restore --hosted-cluster demo -n clusters --from s3://bucket/prefix --backup-id latest --dry-run")]
    Restore(RestoreArgs),
}

/// How to reach the management cluster and the etcd members.
#[derive(Debug, ClapArgs)]
pub struct Connection {
    /// Management cluster kubeconfig (default: $KUBECONFIG, which may list
    /// several files, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// How to reach etcd members.
    #[arg(long, value_enum, default_value_t = EtcdAccess::Auto)]
    pub etcd_access: EtcdAccess,
    /// etcd CA file (PEM), instead of the HCP namespace's.
    #[arg(long)]
    pub etcd_ca: Option<PathBuf>,
    /// etcd client certificate file (PEM).
    #[arg(long)]
    pub etcd_cert: Option<PathBuf>,
    /// etcd client key file (PEM).
    #[arg(long)]
    pub etcd_key: Option<PathBuf>,
}

impl Connection {
    pub fn tls(&self) -> Result<TlsOverride, String> {
        let read = |what: &str, path: &Option<PathBuf>| {
            path.as_ref()
                .map(|p| {
                    std::fs::read_to_string(p).map_err(|e| format!("--{what} {}: {e}", p.display()))
                })
                .transpose()
        };
        let tls = TlsOverride {
            ca_pem: read("etcd-ca", &self.etcd_ca)?,
            cert_pem: read("etcd-cert", &self.etcd_cert)?,
            key_pem: read("etcd-key", &self.etcd_key)?,
        };
        if tls.cert_pem.is_some() != tls.key_pem.is_some() {
            return Err("--etcd-cert and --etcd-key go together".into());
        }
        Ok(tls)
    }
}

#[derive(Debug, ClapArgs)]
pub struct StatusArgs {
    /// The HostedCluster.
    #[arg(long)]
    pub hosted_cluster: String,
    /// Its namespace.
    #[arg(short = 'n', long, default_value = "clusters")]
    pub namespace: String,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, ClapArgs)]
pub struct RecoverArgs {
    /// The HostedCluster.
    #[arg(long, required_unless_present_any = ["resume", "abort"], conflicts_with_all = ["resume", "abort"])]
    pub hosted_cluster: Option<String>,
    /// Its namespace.
    #[arg(short = 'n', long, default_value = "clusters")]
    pub namespace: String,
    /// Recover this member (e.g. etcd-1) instead of the one that fails; it
    /// may be healthy (its data is rebuilt from the others).
    #[arg(long, conflicts_with_all = ["resume", "abort"])]
    pub member: Option<String>,
    /// How long to wait for the member to rejoin and catch up (default 10m;
    /// with --resume, a new bound for the wait) [range: 30s to 1d].
    #[arg(long, value_parser = duration::MEMBER_WAIT)]
    pub wait_timeout: Option<Duration>,
    #[command(flatten)]
    pub connection: Connection,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
}

pub async fn exec(command: Command, output: Output) -> Exit {
    match command {
        Command::Status(args) => exec_status(args, output).await,
        Command::Recover(args) => exec_recover(args, output).await,
        Command::Restore(args) => exec_restore(args, output).await,
    }
}

async fn exec_status(args: StatusArgs, output: Output) -> Exit {
    let options = match args.connection.tls() {
        Ok(tls) => StatusOptions {
            kubeconfig: args.connection.kubeconfig,
            context: args.connection.context,
            hosted_cluster: args.hosted_cluster,
            namespace: args.namespace,
            etcd_access: args.connection.etcd_access,
            tls,
        },
        Err(message) => {
            eprintln!("error: {message}");
            return Exit::Usage;
        }
    };
    match status(&options).await {
        Ok(health) => {
            super::report::print(output, &health, || render_status(&health, &options));
            if health.healthy {
                Exit::Success
            } else {
                Exit::Failed
            }
        }
        Err(err) => super::report::error_exit(&err),
    }
}

async fn exec_recover(args: RecoverArgs, output: Output) -> Exit {
    let tls = match args.connection.tls() {
        Ok(tls) => tls,
        Err(message) => {
            eprintln!("error: {message}");
            return Exit::Usage;
        }
    };
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    let aborting = args.run.aborting();
    let options = RecoverOptions {
        kubeconfig: args.connection.kubeconfig,
        context: args.connection.context,
        hosted_cluster: args.hosted_cluster,
        namespace: args.namespace,
        member: args.member,
        etcd_access: args.connection.etcd_access,
        tls,
        wait_timeout: args.wait_timeout,
        run: args.run,
        observer: super::report::progress(output),
    };
    match recover(options, &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render_recover(&result));
            super::report::exit_for_run(&result.run.outcome, aborting)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

/// `1.5 MiB` (etcd reports sizes as i64; they are never negative).
#[derive(Debug, ClapArgs)]
pub struct RestoreArgs {
    /// The HostedCluster whose etcd is restored.
    #[arg(long, required_unless_present_any = ["resume", "abort"], conflicts_with_all = ["resume", "abort"])]
    pub hosted_cluster: Option<String>,
    /// Its namespace.
    #[arg(short = 'n', long, default_value = "clusters")]
    pub namespace: String,
    /// A backup (`STORE/NS/CLUSTER/ID` or `.../latest`, or STORE with
    /// --backup-id) or a snapshot (a file, or an s3:// object).
    #[arg(long, required_unless_present_any = ["resume", "abort"], conflicts_with_all = ["resume", "abort"])]
    pub from: Option<String>,
    /// The backup id in the --from store (or `latest`).
    #[arg(long)]
    pub backup_id: Option<String>,
    /// For a snapshot in a file or local store: an S3 store a temporary copy
    /// is presigned from (deleted once the members are restored).
    #[arg(long)]
    pub stage_snapshot_to: Option<String>,
    /// How long the presigned snapshot URL is valid (default 1h, 15m for the
    /// decrypted copy of an encrypted backup) [range: 5m to 7d].
    #[arg(long, value_parser = duration::PRESIGN_TTL)]
    pub presign_ttl: Option<Duration>,
    /// The age identity file (as age-keygen writes it) for an encrypted backup.
    #[arg(long)]
    pub identity: Option<PathBuf>,
    /// Raise the restored revision by this much (default: measured from the
    /// members, plus a margin; 1000000000 when they cannot be read). etcd
    /// revisions are int64 [range: 1 to 1000000000000].
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=1_000_000_000_000))]
    pub bump_revision: Option<u64>,
    /// Image of the restore pods (default: the etcd StatefulSet's).
    #[arg(long)]
    pub image: Option<String>,
    /// How long the cluster stays paused at most (a deadline, never "true")
    /// [range: 1m to 7d].
    #[arg(long, default_value = "2h", value_parser = duration::PAUSE_TTL)]
    pub pause_ttl: Duration,
    /// Bound on each wait (pods gone, a member restored, etcd healthy); default
    /// 15m [range: 30s to 1d].
    #[arg(long, value_parser = duration::MEMBER_WAIT)]
    pub wait_timeout: Option<Duration>,
    /// S3 endpoint for S3-compatible services (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    pub connection: Connection,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
}

async fn exec_restore(args: RestoreArgs, output: Output) -> Exit {
    let tls = match args.connection.tls() {
        Ok(tls) => tls,
        Err(message) => {
            eprintln!("error: {message}");
            return Exit::Usage;
        }
    };
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    let aborting = args.run.aborting();
    let options = EtcdRestoreOptions {
        kubeconfig: args.connection.kubeconfig,
        context: args.connection.context,
        hosted_cluster: args.hosted_cluster,
        namespace: args.namespace,
        from: args.from,
        backup_id: args.backup_id,
        s3: S3Options {
            endpoint: args.s3_endpoint,
            ca_bundle: args.ca_bundle,
            ..S3Options::default()
        },
        stage_snapshot_to: args.stage_snapshot_to,
        presign_ttl: args.presign_ttl,
        identity: args.identity,
        bump_revision: args.bump_revision,
        image: args.image,
        pause_ttl: args.pause_ttl,
        etcd_access: args.connection.etcd_access,
        tls,
        wait_timeout: args.wait_timeout,
        run: args.run,
        observer: super::report::progress(output),
    };
    match etcd_restore(options, &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render_restore(&result));
            super::report::exit_for_run(&result.run.outcome, aborting)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

pub fn render_restore(result: &EtcdRestoreResult) -> String {
    let mut out = super::report::headline("etcd restore", &result.run, "hcp-dr etcd restore");
    out.push('\n');
    out.push_str(&format!("hosted cluster: {}\n", result.hosted_cluster));
    out.push_str(&super::report::stage_lines(&result.run));
    if let Some(snapshot) = &result.snapshot {
        out.push_str(&format!(
            "snapshot: {snapshot} (revision {}, SHA-256 {})\n",
            result.snapshot_revision.map_or("-".into(), |r| r.to_string()),
            result.snapshot_sha256.as_deref().unwrap_or("-")
        ));
    }
    if let Some(bump) = result.bump_revision {
        out.push_str(&format!(
            "revision: cluster had reached {}; restored with --bump-revision {bump} --mark-compacted\n",
            result.revision_before.map_or("an unknown revision".into(), |r| r.to_string())
        ));
    }
    if let Some(after) = &result.revisions_after {
        let members: Vec<String> = after.iter().map(|(m, r)| format!("{m} at {r}")).collect();
        out.push_str(&format!("members healthy: {}\n", members.join(", ")));
    }
    if let Some(seconds) = result.api_downtime_seconds {
        out.push_str(&format!("API down {seconds:.1}s\n"));
    }
    if let Some(journal) = &result.run.journal {
        out.push_str(&format!("journal: {journal}\n"));
    }
    for warning in &result.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

fn bytes(n: i64) -> String {
    super::report::human_bytes(n.max(0) as u64)
}

fn cells(m: &MemberHealth) -> Vec<String> {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let yes = |b: bool| if b { "yes" } else { "NO" }.to_string();
    vec![
        m.name.clone(),
        opt(m.pod.clone()),
        opt(match (&m.phase, &m.state) {
            (Some(phase), Some(state)) if phase != state => Some(format!("{phase}/{state}")),
            (phase, state) => phase.clone().or(state.clone()),
        }),
        opt(m.restarts.map(|r| r.to_string())),
        opt(m.endpoint.clone()),
        yes(m.reachable),
        yes(m.healthy),
        if m.leader { "*".into() } else { String::new() },
        opt(m.raft_term.map(|t| t.to_string())),
        opt(m.raft_index.map(|i| i.to_string())),
        opt(m.revision.map(|r| r.to_string())),
        opt(m.db_size.map(bytes)),
        opt(m.db_size_in_use.map(bytes)),
        if m.alarms.is_empty() {
            "-".into()
        } else {
            m.alarms.join(",")
        },
        opt(m.last_error.clone()),
    ]
}

/// The text report of `etcd status`: a headline, a row per member, the problems.
pub fn render_status(health: &ClusterHealth, options: &StatusOptions) -> String {
    let mut out = format!(
        "etcd of HostedCluster {} ({}, {}: {} member(s) expected): {}\n",
        health.hosted_cluster,
        health.hcp_namespace,
        health.availability_policy,
        health.expected_members,
        if health.healthy {
            "HEALTHY"
        } else if !health.split.is_empty() {
            "SPLIT"
        } else {
            "DEGRADED"
        }
    );
    let mut rows = vec![
        [
            "MEMBER",
            "POD",
            "PHASE",
            "RESTARTS",
            "ENDPOINT",
            "REACHABLE",
            "HEALTHY",
            "LEADER",
            "TERM",
            "INDEX",
            "REVISION",
            "DB SIZE",
            "IN USE",
            "ALARMS",
            "LAST ERROR",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>(),
    ];
    rows.extend(health.members.iter().map(cells));
    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c + 1 == columns {
                    cell.clone()
                } else {
                    format!("{cell:<w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "members reached by {}\n",
        match health.access {
            EtcdAccess::PortForward => "port-forward through the API server",
            _ => "pod IP",
        }
    ));
    out.push_str("the cluster each member says it is in:\n");
    for m in health.members.iter().filter(|m| m.cluster_id.is_some()) {
        out.push_str(&format!(
            "  {}: cluster {}, members {}\n",
            m.name,
            m.cluster_id.as_deref().unwrap_or("-"),
            m.member_list
                .as_ref()
                .map(|list| list
                    .iter()
                    .map(|l| format!("{}={}", if l.name.is_empty() { "(unstarted)" } else { l.name.as_str() }, l.peer_urls.join(",")))
                    .collect::<Vec<_>>()
                    .join(" "))
                .unwrap_or_else(|| "(not read)".into())
        ));
    }
    if !health.healthy {
        out.push_str("problems:\n");
        for problem in &health.problems {
            out.push_str(&format!("  - {problem}\n"));
        }
        if health.split.is_empty() {
            out.push_str(&format!(
                "one failing member: hcp-dr etcd recover --hosted-cluster {} -n {}; several, or no quorum: restore etcd from a backup (hcp-dr etcd restore)\n",
                options.hosted_cluster, options.namespace
            ));
        } else {
            out.push_str(&format!(
                "the members are NOT ONE CLUSTER: each serves its own copy of the data behind the etcd-client Service. Stop writes to it, then put one cluster back from a backup: hcp-dr etcd restore --hosted-cluster {} -n {} --from BACKUP (it restores every member with the same --initial-cluster); `etcd recover` cannot join separate clusters\n",
                options.hosted_cluster, options.namespace
            ));
        }
    }
    out
}

/// The text report of `etcd recover`.
pub fn render_recover(result: &RecoverResult) -> String {
    let mut out = super::report::headline("etcd recover", &result.run, "hcp-dr etcd recover");
    out.push('\n');
    out.push_str(&format!("hosted cluster: {}\n", result.hosted_cluster));
    out.push_str(&super::report::stage_lines(&result.run));
    let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    if let Some(member) = &result.member {
        out.push_str(&format!("member: {member}: {}\n", or_dash(&result.reason)));
        out.push_str(&format!(
            "pod {member}: uid {} -> {}\n",
            or_dash(&result.old_pod_uid),
            or_dash(&result.new_pod_uid)
        ));
        out.push_str(&format!(
            "volume claim {}: uid {} -> {}\n",
            or_dash(&result.pvc),
            or_dash(&result.old_pvc_uid),
            or_dash(&result.new_pvc_uid)
        ));
    }
    if let Some(before) = result.revision_before {
        out.push_str(&format!(
            "revision: cluster at {before} before; member at {} after rejoining\n",
            result
                .revision_after
                .map_or("-".to_string(), |r| r.to_string())
        ));
    }
    if let Some(seconds) = result.seconds {
        out.push_str(&format!(
            "rejoined {seconds:.1}s after its pod and volume were deleted\n"
        ));
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
    fn sizes_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(8 * 1024 * 1024 * 1024), "8.0 GiB");
    }
}
