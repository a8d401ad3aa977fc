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
pub mod drill;
pub mod etcd;
pub mod fence;
pub mod migrate;
pub mod playbook;
pub mod progress;
pub mod report;
pub mod restore;
pub mod schedule;
pub mod snapshot;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "hcp-dr", version, about = "Back up, restore, migrate and repair OpenShift hosted control planes")]
pub struct Cli {
    /// Output format of the final report.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Log format on stderr: `text` (human-readable), `json` (one object a
    /// line), or `auto`: text on a terminal, JSON otherwise. The report goes
    /// to stdout, never mixed with the logs.
    #[arg(long, global = true, value_enum, env = "HCP_DR_LOG_FORMAT", default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
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
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Back up one hosted cluster (etcd snapshots and objects) to a store.
    Backup(backup::Args),
    /// List, describe, verify and prune the backups in a store.
    #[command(subcommand)]
    Backups(backups::Command),
    /// Restore one backup onto a management cluster (etcd from its snapshot).
    Restore(restore::Args),
    /// Move one hosted cluster to another management cluster.
    Migrate(migrate::Args),
    /// Prove a backup restores: restore it under a new name on a staging cluster, check it, remove it.
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
    /// Stop and mark the stale copy of a hosted cluster on a management
    /// cluster that came back after the cluster was restored elsewhere
    /// (--release lets it run again).
    Fence(fence::Args),
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

/// Run the parsed command.
pub async fn run(cli: Cli) -> Exit {
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
        Command::Fence(args) => fence::exec(args, cli.output).await,
    }
}
