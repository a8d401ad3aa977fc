//! Command-line definitions: one file per command, each with its clap
//! arguments and an `exec` that builds the operation's options and calls
//! `ops`. Settings resolve as flag > environment > default.

/// The store a command uses when its flag is not given: `$HCP_DR_STORE`
/// (as the sandbox's env file and the CronJob set it). Never for `--resume`
/// or `--abort`, which take the store from the journal: an environment
/// default must not conflict with a printed next step.
pub fn store_or_env(given: Option<String>, from_journal: bool) -> Option<String> {
    given.or_else(|| if from_journal { None } else { std::env::var("HCP_DR_STORE").ok().filter(|s| !s.is_empty()) })
}

pub mod backup;
pub mod backups;
pub mod cluster;
pub mod completion;
pub mod drill;
pub mod etcd;
pub mod fence;
pub mod man;
pub mod migrate;
pub mod playbook;
pub mod posture;
pub mod progress;
pub mod report;
pub mod restore;
pub mod schedule;
pub mod snapshot;
pub mod stream;
pub mod volume_mover;

use clap::{Parser, Subcommand, ValueEnum};

/// `--keep-last`, `--keep-daily`, `--keep-weekly`: retention counts.
/// A Kubernetes object name (DNS-1123 subdomain), checked before anything
/// is contacted.
pub fn k8s_name(text: &str) -> Result<String, String> {
    crate::ops::backup::check_name("name", text).map(|()| text.to_string()).map_err(|e| e.to_string())
}

/// A container image reference (`--mover-image`): `registry/repository[:tag][@digest]`.
pub fn image_ref(text: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/:@+".contains(c);
    let repository = text.split('@').next().unwrap_or_default();
    let path = match repository.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') => path,
        _ => repository,
    };
    let path = path.split_once('/').map_or(path, |(_, rest)| rest);
    if text.is_empty() || !text.chars().all(allowed) || text.starts_with(['-', '/', ':', '@']) || path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(format!("`{text}` is not a container image reference: write registry/repository[:tag][@sha256:digest], repository in lowercase (e.g. quay.io/hcp-dr/hcp-dr:v1.2.0)"));
    }
    Ok(text.to_string())
}

/// Where a run's Prometheus metrics go (backup, drill).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MetricsArgs {
    /// Keep Prometheus metrics (backup: last success, duration, downtime,
    /// bytes, failures; drill: last result, RTO, RPO) in this file, for the
    /// node exporter's textfile collector.
    #[arg(long, env = "HCP_DR_METRICS_FILE")]
    pub metrics_file: Option<std::path::PathBuf>,
    /// Also push those metrics to this Prometheus Pushgateway (http:// or
    /// https://; --ca-bundle is trusted too). A failed push is a warning.
    #[arg(long, env = "HCP_DR_PUSHGATEWAY")]
    pub pushgateway: Option<String>,
    /// The Pushgateway `job` label.
    #[arg(long, default_value = "hcp-dr", requires = "pushgateway")]
    pub pushgateway_job: String,
    /// An extra Pushgateway grouping label, NAME=VALUE (repeatable).
    #[arg(long, value_name = "NAME=VALUE", requires = "pushgateway")]
    pub pushgateway_label: Vec<String>,
}

impl MetricsArgs {
    /// The Pushgateway, when one is given; a bad URL or label is bad input.
    pub fn pushgateway(&self, ca_bundle: Option<std::path::PathBuf>) -> Result<Option<crate::ops::signals::Pushgateway>, String> {
        self.pushgateway
            .as_deref()
            .map(|url| crate::ops::signals::Pushgateway::new(url, &self.pushgateway_job, &self.pushgateway_label, ca_bundle))
            .transpose()
    }
}

/// How a restored cluster's etcd members get the backup's data (restore,
/// migrate, drill).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SeedArgs {
    /// How the restored etcd members get the backup's data: `volumes`
    /// (hcp-dr restores every member's volume, with the members' names and
    /// initial cluster, before the HostedCluster exists) or `url`
    /// (HyperShift's etcd-init restores restoreSnapshotURL into each
    /// member) [default: volumes for HighlyAvailable, url for SingleReplica].
    /// `url` on a HighlyAvailable cluster splits it into separate clusters
    /// unless the destination's HyperShift has the fix (--etcd-init-fixed).
    #[arg(long, value_enum, value_name = "MODE")]
    pub etcd_seed: Option<crate::stages::restore::etcd_seed::SeedMode>,
    /// The destination's HyperShift has openshift/hypershift PR 9048 (its
    /// etcd-init restores with the members' names and initial cluster):
    /// allows --etcd-seed url for a HighlyAvailable cluster.
    #[arg(long)]
    pub etcd_init_fixed: bool,
    /// How far above the backup's revision the seeded members start
    /// [default: 1000 revisions a second of the backup's age, at least 1000;
    /// 1000 for a migration, whose source is stopped from the backup on]
    /// [range: 1 to 1000000000000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    pub bump_revision: Option<u64>,
    /// The image of the pods that seed the members' volumes (it runs
    /// etcdutl, curl and sha256sum) [default: the etcd image the backup
    /// recorded from the source's etcd StatefulSet].
    #[arg(long, value_name = "IMAGE", value_parser = image_ref)]
    pub etcd_image: Option<String>,
}

impl SeedArgs {
    pub fn inputs(&self) -> crate::stages::restore::etcd_seed::EtcdSeedInputs {
        crate::stages::restore::etcd_seed::EtcdSeedInputs {
            mode: self.etcd_seed,
            init_fixed: self.etcd_init_fixed,
            bump_revision: self.bump_revision,
            image: self.etcd_image.clone(),
            source_stopped: false,
        }
    }
}

/// `--at` / `--at-revision` (restore, drill): a point of the cluster's
/// stream instead of a backup.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AtArgs {
    /// Restore the cluster as it was at TIME (RFC 3339, e.g.
    /// 2026-11-21T18:04:05Z) from its stream (`hcp-dr stream`): etcd holds
    /// the last revision the stream had received by then, the objects come
    /// from the newest backup taken at or before it. --from is the store.
    #[arg(long, value_name = "TIME", value_parser = stream::rfc3339, conflicts_with_all = ["backup_id", "at_revision", "resume", "abort"])]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// As --at, to exactly this etcd revision of the stream [range: 1 to
    /// 1000000000000000000].
    #[arg(long, value_name = "REVISION", value_parser = clap::value_parser!(i64).range(1..=1_000_000_000_000_000_000), conflicts_with_all = ["backup_id", "resume", "abort"])]
    pub at_revision: Option<i64>,
}

impl AtArgs {
    /// The point asked, read with `identity` when the stream is encrypted.
    pub fn point(&self, identity: Option<&std::path::Path>) -> Option<crate::ops::point_in_time::AtPoint> {
        use crate::stream::replay::Target;
        let target = match (self.at, self.at_revision) {
            (Some(at), _) => Target::Time(at),
            (None, Some(revision)) => Target::Revision(revision),
            (None, None) => return None,
        };
        Some(crate::ops::point_in_time::AtPoint { target, identity: identity.map(std::path::Path::to_path_buf) })
    }
}

/// How a restore's etcd got its data, for the reports.
pub fn etcd_seed_line(seeded: &crate::stages::restore::etcd_seed::Seeded) -> String {
    use crate::stages::restore::etcd_seed::SeedMode;
    match seeded.mode {
        SeedMode::Url => format!("etcd: restored by HyperShift's etcd-init from restoreSnapshotURL ({})\n", seeded.why),
        SeedMode::Volumes => format!(
            "etcd: hcp-dr seeded the members' volumes ({}) with the backup at revision {} bumped by {} to {} or above ({}); why: {}\n",
            seeded.members.keys().cloned().collect::<Vec<_>>().join(", "),
            seeded.backup_revision,
            seeded.bump,
            seeded.expected_min_revision,
            seeded.bump_reason,
            seeded.why
        ),
    }
}

/// The proof that the restored etcd is one cluster, for the reports.
pub fn one_cluster_line(etcd: &crate::stages::restore::wait::OneCluster) -> String {
    format!(
        "etcd is ONE cluster {} of {} (leader {}), every member at revision {} or above; a key written through {} was read back through {}\n",
        etcd.cluster_id,
        etcd.members.join(", "),
        etcd.leader,
        etcd.min_revision,
        etcd.probe_written_through,
        if etcd.probe_read_back.is_empty() { "no other member (one member)".to_string() } else { etcd.probe_read_back.join(", ") }
    )
}

/// `--replicas` of a NodePool (an int32 in the CRD; no NodePool is larger).
pub fn node_pool_replicas() -> clap::builder::RangedI64ValueParser<i64> {
    clap::builder::RangedI64ValueParser::new().range(0..=500)
}

pub fn keep_count() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=10_000)
}

/// The exit codes, as `--help` prints them and the README's table lists them.
pub const EXIT_CODES: &str = "Exit codes:
  0  done (or planned, with --dry-run; or an --abort that left nothing of its run)
  1  failed, and everything the run changed was undone (or it changed nothing)
  2  bad input: nothing was contacted, changed or journaled; the message names the flag or file
  3  needs attention: the run stopped with changes in place (an undo failed, or an operation that
     stops rather than undoes: restore, migrate, fence, cluster destroy); read the report, then
     --resume (or --abort) the journal it names";

#[derive(Debug, Parser)]
#[command(name = "hcp-dr", version, about = "Back up, restore, migrate and repair OpenShift hosted control planes", after_help = EXIT_CODES)]
pub struct Cli {
    /// Output format of the final report: text for people, or the same
    /// structured report as JSON or YAML (`html`: `hcp-dr report` only).
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Log format on stderr: `text` (human-readable), `json` (one object a
    /// line), or `auto`: text on a terminal, JSON otherwise. The report goes
    /// to stdout, never mixed with the logs.
    #[arg(long, global = true, value_enum, env = "HCP_DR_LOG_FORMAT", default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
    /// No colour in help, errors, logs or progress (as NO_COLOR=1 does).
    #[arg(long, global = true)]
    pub no_color: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Whether colour may be used: not with `--no-color`, nor with `NO_COLOR`
/// set to anything but the empty string (<https://no-color.org>; clap's own
/// help and errors read it the same way).
pub fn color_allowed(no_color_flag: bool) -> bool {
    !no_color_flag && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Auto,
    Text,
    Json,
}

impl LogFormat {
    /// Whether logs are JSON: asked for, or `auto` with stderr not a terminal.
    pub fn json(self) -> bool {
        match self {
            LogFormat::Json => true,
            LogFormat::Text => false,
            LogFormat::Auto => !std::io::IsTerminal::is_terminal(&std::io::stderr()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
    Yaml,
    /// One self-contained page: `hcp-dr report` only.
    Html,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Back up one hosted cluster (etcd snapshots and objects) to a store.
    #[command(after_help = "Example:\n  hcp-dr backup --hosted-cluster demo -n clusters --to s3://bucket/prefix")]
    Backup(backup::Args),
    /// List, describe, verify and prune the backups in a store.
    #[command(subcommand)]
    Backups(backups::Command),
    /// Restore one backup onto a management cluster (etcd from its snapshot).
    #[command(after_help = "Example:\n  hcp-dr restore --from s3://bucket/prefix/clusters/demo/latest --kubeconfig dest.kubeconfig --dry-run")]
    Restore(restore::Args),
    /// Move one hosted cluster to another management cluster.
    #[command(after_help = "Example:\n  hcp-dr migrate --hosted-cluster demo -n clusters --from-kubeconfig a.kubeconfig --to-kubeconfig b.kubeconfig --via s3://bucket/prefix --route53-zone Z123")]
    Migrate(migrate::Args),
    /// Prove a backup restores: restore it under a new name on a staging cluster, check it, remove it.
    #[command(after_help = "Example:\n  hcp-dr drill --from s3://bucket/prefix/clusters/demo/latest --kubeconfig staging.kubeconfig --report drill-report")]
    Drill(drill::Args),
    /// Inspect playbooks.
    #[command(subcommand)]
    Playbook(playbook::Command),
    /// Create hosted clusters.
    #[command(subcommand)]
    Cluster(cluster::Command),
    /// Run backups unattended: render the CronJob and its RBAC.
    #[command(subcommand)]
    Schedule(schedule::Command),
    /// Check etcd snapshots offline (no etcd needed).
    #[command(subcommand)]
    Snapshot(snapshot::Command),
    /// Inspect and repair a hosted cluster's etcd members.
    #[command(subcommand)]
    Etcd(etcd::Command),
    /// Continuous backup of hosted clusters' etcd (every revision, in
    /// segments of seconds, no downtime) until SIGTERM; `stream list`,
    /// `verify` and `replay` read it back (a snapshot at any revision).
    #[command(after_help = "Example:\n  hcp-dr stream --hosted-cluster clusters/demo --to s3://bucket/prefix\n  hcp-dr stream replay --hosted-cluster clusters/demo --from s3://bucket/prefix --at-revision 123456 --out demo.db")]
    Stream(stream::Args),
    /// Stop and mark the stale copy of a hosted cluster on a management
    /// cluster that came back after the cluster was restored elsewhere
    /// (--release lets it run again).
    #[command(after_help = "Example:\n  hcp-dr fence --hosted-cluster demo -n clusters --kubeconfig returned.kubeconfig --store s3://bucket/prefix")]
    Fence(fence::Args),
    /// The fleet's DR posture, worst first: backups' ages, verifies, drills
    /// (RTO, RPO), and with --kubeconfig every HostedCluster no backup covers.
    #[command(after_help = "Example:\n  hcp-dr report --store s3://bucket/prefix --kubeconfig mgmt.kubeconfig -o html --output-file posture.html")]
    Report(posture::Args),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    #[command(after_help = "Example:\n  hcp-dr completion bash > ~/.local/share/bash-completion/completions/hcp-dr")]
    Completion(completion::Args),
    /// Print the manual page, or write one page per command to a directory.
    #[command(after_help = "Example:\n  hcp-dr man --dir /usr/local/share/man/man1")]
    Man(man::Args),
    /// The data mover hcp-dr runs in a pod next to a guest volume (not for people).
    #[command(hide = true, after_help = "Example (in a pod, with $HCP_DR_MOVER_TOKEN from a Secret):\n  hcp-dr volume-mover --dir /volume --port 8080")]
    VolumeMover(volume_mover::Args),
}

/// How a command ended, mapped to the process exit code by `main`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done (or planned, with --dry-run).
    Success = 0,
    /// Failed; everything that was changed was undone.
    Failed = 1,
    /// Bad input; nothing was changed.
    Usage = 2,
    /// Failed and an undo failed too: the cluster needs attention (see the report and resume the journal).
    NeedsAttention = 3,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_are_checked() {
        for ok in ["quay.io/hcp-dr/hcp-dr:v1.2.0", "hcp-dr", "localhost:5000/hcp-dr", "registry.example.com:5000/a/b@sha256:0123abcd", "Registry.Example.com/a/b:V1"] {
            assert_eq!(image_ref(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in ["", "quay.io/HCP/x", "a b", "-x", "quay.io/x;rm", "HcpDr"] {
            assert!(image_ref(bad).is_err(), "{bad}");
        }
    }

    /// Every `(subcommand path, argument)` of the CLI.
    fn every_argument() -> Vec<(String, clap::Command, clap::Arg)> {
        fn walk(path: String, cmd: &clap::Command, out: &mut Vec<(String, clap::Command, clap::Arg)>) {
            for arg in cmd.get_arguments() {
                out.push((path.clone(), cmd.clone(), arg.clone()));
            }
            for sub in cmd.get_subcommands() {
                walk(format!("{path} {}", sub.get_name()), sub, out);
            }
        }
        let mut out = Vec::new();
        walk("hcp-dr".into(), &<Cli as clap::CommandFactory>::command(), &mut out);
        out
    }

    /// The `[range: A to B]` an argument's help states.
    fn stated_range(arg: &clap::Arg) -> Option<(String, String)> {
        let help = arg.get_long_help().or(arg.get_help())?.to_string();
        let (_, rest) = help.split_once("[range: ")?;
        let (range, _) = rest.split_once(']')?;
        let (low, high) = range.split_once(" to ")?;
        Some((low.to_string(), high.to_string()))
    }

    /// Every duration and count flag states its accepted range in `--help`,
    /// and the range stated is the one its parser enforces: both ends are
    /// accepted, one step beyond either is refused.
    #[test]
    fn every_duration_and_count_flag_states_the_range_it_enforces() {
        use std::any::TypeId;
        let bounded = [TypeId::of::<std::time::Duration>(), TypeId::of::<usize>(), TypeId::of::<i64>(), TypeId::of::<u64>(), TypeId::of::<u32>()];
        let mut checked = 0;
        for (path, _, arg) in every_argument() {
            let parser = arg.get_value_parser();
            if !bounded.iter().any(|t| parser.type_id() == *t) {
                continue;
            }
            let name = format!("{path} --{}", arg.get_long().unwrap_or(arg.get_id().as_str()));
            let Some((low, high)) = stated_range(&arg) else {
                panic!("{name} states no `[range: A to B]` in its help");
            };
            // the flag's own parser, alone in a command of its own
            let parse = |text: &str| {
                clap::Command::new("t")
                    .arg(clap::Arg::new("x").long("x").value_parser(parser.clone()))
                    .try_get_matches_from(["t", "--x", text])
                    .is_ok()
            };
            assert!(parse(&low) && parse(&high), "{name}: the stated ends {low} and {high} are not both accepted");
            let step_beyond = |text: &str, up: bool| -> String {
                match humantime::parse_duration(text) {
                    Ok(d) if parser.type_id() == TypeId::of::<std::time::Duration>() => {
                        let secs = d.as_secs();
                        format!("{}s", if up { secs + 1 } else { secs.saturating_sub(1) })
                    }
                    _ => {
                        let n: i64 = text.parse().unwrap_or_else(|_| panic!("{name}: `{text}` is no number"));
                        (if up { n + 1 } else { n - 1 }).to_string()
                    }
                }
            };
            assert!(!parse(&step_beyond(&high, true)), "{name}: accepts more than the stated {high}");
            assert!(!parse(&step_beyond(&low, false)), "{name}: accepts less than the stated {low}");
            checked += 1;
        }
        assert!(checked >= 25, "only {checked} bounded flags found: did the walk break?");
    }

    #[test]
    fn the_exit_code_table_names_every_exit_and_the_readme_repeats_it() {
        for exit in [Exit::Success, Exit::Failed, Exit::Usage, Exit::NeedsAttention] {
            assert!(EXIT_CODES.contains(&format!("\n  {}  ", exit as u8)), "{exit:?} is missing from the table");
        }
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        for line in EXIT_CODES.lines().skip(1).filter(|l| !l.starts_with("     ")) {
            let (code, _) = line.trim().split_once("  ").unwrap();
            assert!(readme.contains(&format!("| {code} |")), "README's exit-code table lacks {code}");
        }
        let help = <Cli as clap::CommandFactory>::command().render_long_help().to_string();
        assert!(help.contains("Exit codes:") && help.contains("3  needs attention"), "{help}");
    }
}

/// Run the parsed command.
pub async fn run(cli: Cli) -> Exit {
    if cli.output == Output::Html && !matches!(cli.command, Command::Report(_)) {
        eprintln!("error: -o html is for `hcp-dr report` only; use -o text, json or yaml");
        return Exit::Usage;
    }
    match cli.command {
        Command::Backup(args) => backup::exec(args, cli.output).await,
        Command::Backups(cmd) => backups::exec(cmd, cli.output).await,
        Command::Restore(args) => restore::exec(args, cli.output).await,
        Command::Migrate(args) => migrate::exec(args, cli.output).await,
        Command::Drill(args) => drill::exec(args, cli.output).await,
        Command::Playbook(cmd) => playbook::exec(cmd, cli.output),
        Command::Snapshot(cmd) => snapshot::exec(cmd, cli.output).await,
        Command::Schedule(cmd) => schedule::exec(cmd, cli.output),
        Command::Cluster(cmd) => cluster::exec(cmd, cli.output).await,
        Command::Etcd(cmd) => etcd::exec(cmd, cli.output).await,
        Command::Stream(args) => stream::exec(args, cli.output).await,
        Command::Fence(args) => fence::exec(args, cli.output).await,
        Command::Report(args) => posture::exec(args, cli.output).await,
        Command::Completion(args) => completion::exec(args),
        Command::Man(args) => man::exec(args),
        Command::VolumeMover(args) => volume_mover::exec(args).await,
    }
}
