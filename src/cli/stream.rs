//! `hcp-dr stream`: continuous backup of hosted clusters' etcd (runs until
//! SIGTERM/SIGINT or `--for`), and `stream list|verify|replay` to read
//! what it wrote.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};

use super::backups::StoreArgs;
use super::etcd::Connection;
use super::report::human_bytes;
use super::{Exit, Output};
use crate::duration::DurationIn;
use crate::ops::shard::Shard;
use crate::ops::stream::{LeaseOptions, ListReport, ReadOptions, Reach, Selection, StreamOptions, StreamReport, VerifyReport};
use crate::store::S3Options;
use crate::stream::replay::{ReplayReport, Target};
use crate::stream::run::{ChainStart, ClusterReport};

/// `--segment-interval`: the most a crash can lose, in time.
const OBJECTS_INTERVAL: DurationIn = DurationIn { min: Duration::from_secs(1), max: Duration::from_secs(3600), why_max: "a restore to a time gets objects at most this old" };
const SEGMENT_INTERVAL: DurationIn = DurationIn { min: Duration::from_secs(1), max: Duration::from_secs(600), why_max: "a crash loses at most one interval of writes" };
/// `--base-interval`: how often a new base starts a new chain.
const BASE_INTERVAL: DurationIn = DurationIn { min: Duration::from_secs(60), max: Duration::from_secs(7 * 86_400), why_max: "a replay of a week of writes takes too long" };
/// `--for`: a bounded run.
const RUN_FOR: DurationIn = DurationIn { min: Duration::from_secs(1), max: Duration::from_secs(366 * 86_400), why_max: "without --for the stream runs until stopped" };
/// `--relist-every`: how soon a new or deleted cluster is seen.
const RELIST_EVERY: DurationIn = DurationIn { min: Duration::from_secs(1), max: Duration::from_secs(3600), why_max: "a new cluster would go unstreamed for longer" };
/// `--lease-duration`: how long a dead stream's clusters wait for another.
const LEASE_DURATION: DurationIn = DurationIn { min: Duration::from_secs(2), max: Duration::from_secs(600), why_max: "a dead stream's clusters would wait that long for another" };

#[derive(Debug, ClapArgs)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The chains of a cluster's stream in a store and the revisions each restores.
    #[command(after_help = "Example:\n  hcp-dr stream list --hosted-cluster clusters/demo --from s3://bucket/prefix")]
    List(ReadArgs),
    /// Check a cluster's stream: every segment's SHA-256 and content, and
    /// the revisions contiguous from each chain's base. Names the first
    /// missing or damaged segment and the revision each chain restores up
    /// to. Exit 1 when anything is wrong.
    #[command(after_help = "Example:\n  hcp-dr stream verify --hosted-cluster clusters/demo --from s3://bucket/prefix")]
    Verify(VerifyArgs),
    /// Write an etcd snapshot of a cluster at a revision or a time: the
    /// chain's base restored into a scratch etcd (etcd and etcdctl on PATH),
    /// its revisions replayed one transaction each, the result checked.
    /// Exit 2 when no chain holds what is asked (the windows that can are listed).
    #[command(after_help = "Example:\n  hcp-dr stream replay --hosted-cluster clusters/demo --from s3://bucket/prefix --at 2026-11-21T18:04:05Z --out demo-1804.db")]
    Replay(ReplayArgs),
}

/// A `--segment-size`: bytes of revisions before compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSize(pub u64);

/// `512KiB`, `8MiB`, `64MiB` (or bytes), from 64KiB to 256MiB.
fn segment_size(text: &str) -> Result<SegmentSize, String> {
    let bad = || format!("`{text}` is not a size from 64KiB to 256MiB: write e.g. 512KiB, 8MiB or 64MiB");
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        _ => return Err(bad()),
    };
    let bytes = number.checked_mul(unit).ok_or_else(bad)?;
    if !((64 << 10)..=(256 << 20)).contains(&bytes) {
        return Err(bad());
    }
    Ok(SegmentSize(bytes))
}

/// A `--spool-size`: bytes of segments that may wait for the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpoolSize(pub u64);

/// `0`, `64MiB`, `256MiB`, `4GiB` (or bytes), up to 1TiB; 0: never spool
/// (a segment the store refuses breaks its chain at once).
fn spool_size(text: &str) -> Result<SpoolSize, String> {
    let bad = || format!("`{text}` is not a size from 0 to 1TiB: write e.g. 64MiB, 256MiB or 4GiB (0: never spool)");
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = number.checked_mul(unit).ok_or_else(bad)?;
    if bytes > 1 << 40 {
        return Err(bad());
    }
    Ok(SpoolSize(bytes))
}

/// `--at`: an RFC 3339 time.
pub(super) fn rfc3339(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("`{text}` is not an RFC 3339 time ({e}): write e.g. 2026-11-21T18:04:05Z or 2026-11-21T19:04:05+01:00"))
}

/// `--shard i/K`.
fn shard(text: &str) -> Result<Shard, String> {
    Shard::parse(text).map_err(|e| e.to_string())
}

/// This host's name: $HOSTNAME (a pod's name), else the kernel's.
fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| "unknown-host".into())
}

/// `NAMESPACE/NAME`, or `NAME` in `--namespace`.
fn cluster_ref(text: &str, namespace: &str) -> (String, String) {
    match text.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => (namespace.to_string(), text.to_string()),
    }
}

#[derive(Debug, ClapArgs)]
pub struct RunArgs {
    /// The HostedCluster to stream, NAMESPACE/NAME (or NAME in --namespace);
    /// repeat it for several, each streamed at once.
    #[arg(long, value_name = "NAMESPACE/NAME", required_unless_present = "all", conflicts_with = "all")]
    pub hosted_cluster: Vec<String>,
    /// Every HostedCluster of the management cluster (in every namespace),
    /// listed again every --relist-every: a new one starts streaming, a
    /// deleted one stops (its open segment written). Needs
    /// --lease-namespace.
    #[arg(long)]
    pub all: bool,
    /// With --all: only the HostedClusters matching this label selector.
    #[arg(short = 'l', long, requires = "all")]
    pub selector: Option<String>,
    /// With --all: only the clusters whose UID hashes to part INDEX of
    /// COUNT, as `backup --all --shard` splits them.
    #[arg(long, value_name = "INDEX/COUNT", requires = "all", value_parser = shard)]
    pub shard: Option<Shard>,
    /// With --all: the part is the ordinal this host's name ends in
    /// (a StatefulSet pod `hcp-dr-stream-3` is part 3), of COUNT (the
    /// StatefulSet's replicas); the name is $HOSTNAME, else the kernel's
    /// [range: 1 to 256].
    #[arg(long, value_name = "COUNT", requires = "all", conflicts_with = "shard", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=crate::ops::shard::MAX_SHARDS as u64))]
    pub shard_from_hostname: Option<usize>,
    /// With --all: list the HostedClusters again this often [range: 1s to 1h].
    #[arg(long, default_value = "30s", value_parser = RELIST_EVERY, env = "HCP_DR_RELIST_EVERY")]
    pub relist_every: Duration,
    /// Take a coordination.k8s.io Lease per cluster in this namespace
    /// (`hcp-dr-stream.<ns>.<name>`) before writing it, so two streams never
    /// write one cluster: a cluster whose Lease another stream holds is
    /// not streamed until that Lease expires. Required with --all.
    #[arg(long, value_name = "NAMESPACE", env = "HCP_DR_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long a Lease lasts without renewal (renewed every third of it;
    /// not renewed for two thirds, the stream stops writing the cluster at
    /// once) [range: 2s to 10m].
    #[arg(long, default_value = "30s", value_parser = LEASE_DURATION, env = "HCP_DR_LEASE_DURATION")]
    pub lease_duration: Duration,
    /// Serve /metrics (Prometheus text format: per-cluster lag, segments,
    /// bytes, chain breaks, Lease held) and /healthz on HOST:PORT, e.g.
    /// 0.0.0.0:9102 (the StatefulSet sets it through the environment); port 0
    /// takes a free one, logged.
    #[arg(long, value_name = "HOST:PORT", env = "HCP_DR_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// The namespace of a --hosted-cluster given without one.
    #[arg(short = 'n', long, default_value = "clusters")]
    pub namespace: String,
    /// Where to write: a directory, file:///path or s3://bucket/prefix
    /// (chains go beside the cluster's backups, in `<ns>/<name>/stream/`)
    /// [default: $HCP_DR_STORE].
    #[arg(long)]
    pub to: Option<String>,
    /// A segment is written at the latest this long after its first
    /// revision (only when there is one): the most writes a crash loses
    /// [range: 1s to 10m].
    #[arg(long, default_value = "10s", value_parser = SEGMENT_INTERVAL)]
    pub segment_interval: Duration,
    /// A segment is also written once its revisions take this many bytes
    /// before compression [range: 64KiB to 256MiB].
    #[arg(long, default_value = "8MiB", value_parser = segment_size)]
    pub segment_size: SegmentSize,
    /// A new base (snapshot of one member, nothing paused) starts a new
    /// chain this often; a replay applies at most this much
    /// [range: 1m to 7d].
    #[arg(long, default_value = "6h", value_parser = BASE_INTERVAL)]
    pub base_interval: Duration,
    /// Read each cluster's management-cluster objects (HostedCluster,
    /// NodePools, their secrets, the HyperShift, Cluster API and platform
    /// objects: what a backup exports) this often, and store a set when
    /// they changed: a restore to a time gets them as they were then, at
    /// most this late. A change of the HostedCluster's, one of its
    /// NodePools' or the HostedControlPlane's spec, or of a Secret named
    /// after the cluster, is watched and read within seconds [range: 1s to
    /// 1h].
    #[arg(long, default_value = "30s", value_parser = OBJECTS_INTERVAL, env = "HCP_DR_OBJECTS_INTERVAL")]
    pub objects_interval: Duration,
    /// Do not record the management-cluster objects (a restore to a time
    /// then takes them from the newest backup before it).
    #[arg(long)]
    pub no_objects: bool,
    /// Start a new chain from the cluster's newest regular backup instead of
    /// a new snapshot when it can serve: taken within --base-interval,
    /// compressed, encrypted to exactly --encrypt-to (or neither), and its
    /// revision still in etcd's history. Its snapshot is copied in the
    /// store; etcd is not asked for one.
    #[arg(long, env = "HCP_DR_BASE_FROM_BACKUP")]
    pub base_from_backup: bool,
    /// Stop after this long, as SIGTERM does (drills, tests); without it
    /// the stream runs until SIGTERM or SIGINT [range: 1s to 366d].
    #[arg(long = "for", value_name = "DURATION", value_parser = RUN_FOR)]
    pub run_for: Option<Duration>,
    /// Encrypt the bases and segments to this age public key (repeatable, or
    /// comma-separated), as `backup --encrypt-to` does; reading them back
    /// needs --identity.
    #[arg(long, value_name = "RECIPIENT", env = "HCP_DR_ENCRYPT_TO", value_delimiter = ',')]
    pub encrypt_to: Vec<String>,
    /// While the store does not take segments, keep them in this local
    /// directory (files 0600: unencrypted segments hold the cluster's
    /// secrets) and upload them in order when it answers again; a restarted
    /// stream uploads what it finds there first [default: $TMPDIR/hcp-dr-spool].
    #[arg(long, value_name = "DIR", env = "HCP_DR_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// At most this many bytes of segments wait in --spool-dir (every
    /// cluster together); a segment that would pass it breaks its chain
    /// (a new base once the store answers) [range: 0 to 1TiB; 0: never spool].
    #[arg(long, default_value = "256MiB", value_parser = spool_size, env = "HCP_DR_SPOOL_SIZE")]
    pub spool_size: SpoolSize,
    #[command(flatten)]
    pub s3: StoreArgs,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, ClapArgs)]
pub struct ReadArgs {
    /// The HostedCluster whose stream is read, NAMESPACE/NAME (or NAME in --namespace).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub hosted_cluster: String,
    /// The namespace of a --hosted-cluster given without one.
    #[arg(short = 'n', long, default_value = "clusters")]
    pub namespace: String,
    /// The store the stream was written to [default: $HCP_DR_STORE].
    #[arg(long)]
    pub from: Option<String>,
    /// age identity file for an encrypted stream (`stream --encrypt-to`).
    #[arg(long, env = "HCP_DR_IDENTITY")]
    pub identity: Option<PathBuf>,
    #[command(flatten)]
    pub s3: StoreArgs,
}

#[derive(Debug, ClapArgs)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub read: ReadArgs,
    /// Only this chain (its id, as `stream list` shows it).
    #[arg(long)]
    pub chain: Option<String>,
}

#[derive(Debug, ClapArgs)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["at_revision", "at", "latest"]))]
pub struct ReplayArgs {
    #[command(flatten)]
    pub read: ReadArgs,
    /// The etcd revision the snapshot holds [range: 1 to 1000000000000000000].
    #[arg(long, value_name = "REVISION", value_parser = clap::value_parser!(i64).range(1..=1_000_000_000_000_000_000))]
    pub at_revision: Option<i64>,
    /// The time (RFC 3339, e.g. 2026-11-21T18:04:05Z): the snapshot holds
    /// the last revision the stream had received by then.
    #[arg(long, value_name = "TIME", value_parser = rfc3339)]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
    /// The newest revision the stream holds durably (the last segment
    /// written).
    #[arg(long)]
    pub latest: bool,
    /// The snapshot file to write (0600; it must not exist).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

fn s3_options(args: &StoreArgs) -> S3Options {
    S3Options { endpoint: args.s3_endpoint.clone(), ca_bundle: args.ca_bundle.clone(), ..S3Options::default() }
}

fn usage(message: &str) -> Exit {
    eprintln!("error: {message}");
    Exit::Usage
}

pub async fn exec(args: Args, output: Output) -> Exit {
    match args.command {
        None => exec_stream(args.run, output).await,
        Some(Command::List(args)) => exec_read(args, output, |o| async move { crate::ops::stream::list(&o).await }, |r: &ListReport| (render_list(r), Exit::Success)).await,
        Some(Command::Verify(args)) => {
            let chain = args.chain;
            exec_read(args.read, output, |o| async move { crate::ops::stream::verify(&o, chain.as_deref()).await }, |r: &VerifyReport| (render_verify(r), if r.ok { Exit::Success } else { Exit::Failed })).await
        }
        Some(Command::Replay(args)) => {
            let target = match (args.at_revision, args.at, args.latest) {
                (Some(revision), _, _) => Target::Revision(revision),
                (None, Some(at), _) => Target::Time(at),
                (None, None, true) => Target::Latest,
                (None, None, false) => return usage("--at-revision, --at or --latest is required"),
            };
            let out = args.out;
            exec_read(args.read, output, |o| async move { crate::ops::stream::replay(&o, target, &out).await }, |r: &ReplayReport| (render_replay(r), Exit::Success)).await
        }
    }
}

/// Resolve a reading command's options, run it, print its report.
async fn exec_read<R, F, Fut>(args: ReadArgs, output: Output, run: F, render: impl FnOnce(&R) -> (String, Exit)) -> Exit
where
    R: serde::Serialize,
    F: FnOnce(ReadOptions) -> Fut,
    Fut: std::future::Future<Output = Result<R, crate::ops::OpsError>>,
{
    let Some(store) = super::store_or_env(args.from, false) else {
        return usage("--from is required: the store the stream was written to (a directory, file:///path or s3://bucket/prefix), or set HCP_DR_STORE");
    };
    let (namespace, hosted_cluster) = cluster_ref(&args.hosted_cluster, &args.namespace);
    let options = ReadOptions { namespace, hosted_cluster, store, s3: s3_options(&args.s3), identity: args.identity };
    match run(options).await {
        Ok(report) => {
            let (text, exit) = render(&report);
            super::report::print(output, &report, || text);
            exit
        }
        Err(err) => super::report::error_exit(&err),
    }
}

async fn exec_stream(args: RunArgs, output: Output) -> Exit {
    let tls = match args.connection.tls() {
        Ok(tls) => tls,
        Err(message) => return usage(&message),
    };
    let Some(store) = super::store_or_env(args.to, false) else {
        return usage("--to is required: where to write the stream (a directory, file:///path or s3://bucket/prefix), or set HCP_DR_STORE");
    };
    let hostname = hostname();
    let selection = if args.all {
        let shard = match (args.shard, args.shard_from_hostname) {
            (Some(shard), _) => Some(shard),
            (None, Some(count)) => match crate::ops::stream::shard_from_hostname(&hostname, count) {
                Ok(shard) => Some(shard),
                Err(err) => return super::report::error_exit(&err),
            },
            (None, None) => None,
        };
        Selection::All { selector: args.selector, shard, relist_every: args.relist_every }
    } else {
        Selection::Named(args.hosted_cluster.iter().map(|c| cluster_ref(c, &args.namespace)).collect())
    };
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    let options = StreamOptions {
        reach: Reach { kubeconfig: args.connection.kubeconfig, context: args.connection.context, etcd_access: args.connection.etcd_access, tls },
        selection,
        lease: args.lease_namespace.map(|namespace| LeaseOptions { namespace, duration: args.lease_duration, hostname: hostname.clone() }),
        metrics_addr: args.metrics_addr,
        store,
        s3: s3_options(&args.s3),
        segment_interval: args.segment_interval,
        segment_size: args.segment_size.0,
        base_interval: args.base_interval,
        run_for: args.run_for,
        encrypt_to: args.encrypt_to,
        watch: Default::default(),
        objects_interval: (!args.no_objects).then_some(args.objects_interval),
        base_from_backup: args.base_from_backup,
        spool_dir: args.spool_dir.unwrap_or_else(|| std::env::temp_dir().join("hcp-dr-spool")),
        spool_size: args.spool_size.0,
    };
    match crate::ops::stream::stream(options, &mut interrupt).await {
        Ok(report) => {
            super::report::print(output, &report, || render_stream(&report));
            if report.ok() { Exit::Success } else { Exit::Failed }
        }
        Err(err) => super::report::error_exit(&err),
    }
}

/// The text report of a stopped stream.
pub fn render_stream(report: &StreamReport) -> String {
    let mut out = match report.ok() {
        true => format!("stream to {} stopped ({}): every open segment was written\n", report.store, report.stopped_by),
        false => format!("stream to {} FAILED ({}): see the errors below; started again, it resumes after each chain's last durable revision\n", report.store, report.stopped_by),
    };
    if let Some(shard) = &report.shard {
        out.push_str(&format!("shard {shard}\n"));
    }
    if let Some(holder) = &report.lease_holder {
        out.push_str(&format!("Lease holder {holder}\n"));
    }
    for cluster in &report.clusters {
        out.push_str(&render_cluster(cluster));
    }
    for waiting in &report.not_streamed {
        out.push_str(&format!("{}: not streamed: {}\n", waiting.hosted_cluster, waiting.reason));
    }
    out
}

fn render_cluster(cluster: &ClusterReport) -> String {
    let last = cluster.last_durable_revision.map_or("none".to_string(), |r| r.to_string());
    let mut out = format!("{}: last durable revision {last}\n", cluster.hosted_cluster);
    for chain in &cluster.chains {
        let start = match &chain.start {
            ChainStart::NewBase { stored_bytes, raw_bytes, seconds } => format!(
                "new base at revision {} (snapshot of {}, {} stored, {} raw, {seconds:.1}s, nothing paused)",
                chain.base_revision,
                chain.base_member,
                human_bytes(*stored_bytes),
                human_bytes(*raw_bytes)
            ),
            ChainStart::Resumed { after } => format!("resumed after revision {after} (base revision {}, from {})", chain.base_revision, chain.base_member),
        };
        out.push_str(&format!("  chain {}: {start}\n", chain.chain_id));
        let written = &chain.written;
        let revisions = match written.first_revision {
            Some(first) => format!("revisions {first}..{} ({} revisions, {} events)", chain.last_durable_revision, written.revisions, written.events),
            None => "no revision (nothing was written to etcd meanwhile)".into(),
        };
        out.push_str(&format!("    {} segments, {revisions}, {} stored; {}\n", written.segments, human_bytes(written.stored_bytes), chain.ended));
    }
    for moved in &cluster.moves {
        match (&moved.from, &moved.reason) {
            (Some(from), reason) => out.push_str(&format!(
                "  watch moved from {from} to {} at revision {} (chain {}){}\n",
                moved.to,
                moved.at_revision,
                moved.chain_id,
                reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
            )),
            (None, _) => out.push_str(&format!("  watched {} from revision {} (chain {})\n", moved.to, moved.at_revision, moved.chain_id)),
        }
    }
    for broken in &cluster.breaks {
        let next = match (&broken.next_chain, broken.lost()) {
            (Some(next), Some((from, to))) => format!("; chain {next} follows: revisions {from}..{to} are in no chain"),
            (Some(next), None) => format!("; chain {next} follows with no revision lost"),
            (None, _) => "; no chain follows yet".into(),
        };
        out.push_str(&format!("  BREAK: chain {} ends at revision {}: {}{next}\n", broken.chain_id, broken.last_revision, broken.reason));
    }
    for warning in &cluster.warnings {
        out.push_str(&format!("  warning: {warning}\n"));
    }
    if let Some(lost) = &cluster.lease_lost {
        out.push_str(&format!("  LEASE LOST: {lost}\n"));
    }
    if let Some(error) = &cluster.error {
        out.push_str(&format!("  ERROR: {error}\n"));
    }
    out
}

fn render_list(report: &ListReport) -> String {
    let mut out = format!("stream of {} in {}\n", report.hosted_cluster, report.store);
    if report.chains.is_empty() {
        out.push_str("  no chain: start `hcp-dr stream` for the cluster, with --to this store\n");
    }
    for chain in &report.chains {
        let window = chain.window.as_ref().map_or("restores nothing".to_string(), |w| format!("restores revisions {}..{} (base taken {})", w.from, w.through, w.base_taken.format("%Y-%m-%dT%H:%M:%SZ")));
        out.push_str(&format!(
            "  chain {}  {window}; {} segments; base from {}, {}{}\n",
            chain.chain_id,
            chain.segments,
            chain.base_member.as_deref().unwrap_or("?"),
            chain.base_stored_bytes.map(human_bytes).unwrap_or_else(|| "?".into()),
            if chain.encrypted { "; encrypted" } else { "" }
        ));
        if let Some(previous) = &chain.previous {
            out.push_str(&format!("    follows chain {} (through revision {}): {}\n", previous.chain_id, previous.last_revision, previous.reason));
        }
        if let Some(problem) = &chain.problem {
            out.push_str(&format!("    PROBLEM: {problem} (`hcp-dr stream verify` checks every segment)\n"));
        }
    }
    for folder in &report.incomplete {
        out.push_str(&format!("  incomplete: {folder} (a base whose chain never started; it can be deleted)\n"));
    }
    out
}

fn render_verify(report: &VerifyReport) -> String {
    let mut out = format!("stream of {} in {}: {}\n", report.hosted_cluster, report.store, if report.ok { "OK" } else { "PROBLEMS" });
    for chain in &report.chains {
        let restores = match (chain.base_revision, chain.good_through) {
            (Some(base), Some(through)) => format!("restores revisions {base}..{through}"),
            _ => "restores nothing".into(),
        };
        let checked = if chain.content_checked { "hashes and content checked" } else { "hashes checked; the content is encrypted (--identity checks it too)" };
        let verdict = if chain.ok { "OK" } else { "PROBLEMS" };
        out.push_str(&format!("  chain {}: {verdict}: {restores}; {} segments, {checked}\n", chain.chain_id, chain.segments));
        if let Some(first) = &chain.first_problem {
            out.push_str(&format!("    first problem: {first}\n"));
        }
        for problem in chain.problems.iter().skip(1) {
            out.push_str(&format!("    - {problem}\n"));
        }
    }
    out
}

fn render_replay(report: &ReplayReport) -> String {
    format!(
        "snapshot of {} at revision {} (asked: {}; received by the stream {}) written to {}\n  {} bytes, SHA-256 {}\n  chain {}: base revision {} (from {}), {} revisions applied ({} events, {} segments), one transaction each, every revision checked\n  leases: {} granted ({} without a recorded TTL, granted {}s), {} unused revoked\n  took {:.1}s; restore it with `hcp-dr etcd restore --from {}` or `etcdctl snapshot restore`\n",
        report.hosted_cluster,
        report.revision,
        report.asked,
        report.received.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        report.out,
        report.size,
        report.sha256,
        report.chain_id,
        report.base_revision,
        report.base_member,
        report.revisions_applied,
        report.events_applied,
        report.segments_read,
        report.leases_granted,
        report.leases_without_ttl,
        crate::stream::replay::UNKNOWN_TTL,
        report.leases_revoked,
        report.seconds,
        crate::ops::shell_word(&report.out),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_sizes_parse_in_range() {
        assert_eq!(segment_size("8MiB"), Ok(SegmentSize(8 << 20)));
        assert_eq!(segment_size("64KiB"), Ok(SegmentSize(64 << 10)));
        assert_eq!(segment_size("256MiB"), Ok(SegmentSize(256 << 20)));
        assert_eq!(segment_size("1048576"), Ok(SegmentSize(1 << 20)));
        for bad in ["", "8", "63KiB", "257MiB", "8mb", "-1MiB", "99999999999999999999MiB", "1.5MiB"] {
            assert!(segment_size(bad).unwrap_err().contains("64KiB to 256MiB"), "{bad}");
        }
    }

    #[test]
    fn spool_sizes_parse_in_range() {
        assert_eq!(spool_size("256MiB"), Ok(SpoolSize(256 << 20)));
        assert_eq!(spool_size("0"), Ok(SpoolSize(0)));
        assert_eq!(spool_size("4GiB"), Ok(SpoolSize(4 << 30)));
        assert_eq!(spool_size("1TiB"), Ok(SpoolSize(1 << 40)));
        for bad in ["", "2TiB", "8mb", "-1MiB", "99999999999999999999MiB", "1.5GiB"] {
            assert!(spool_size(bad).unwrap_err().contains("0 to 1TiB"), "{bad}");
        }
    }

    #[test]
    fn times_are_rfc3339_with_a_zone() {
        assert_eq!(rfc3339("2026-11-21T19:04:05+01:00").unwrap().to_rfc3339(), "2026-11-21T18:04:05+00:00");
        for bad in ["yesterday", "2026-11-21 18:04", "2026-11-21T18:04:05", ""] {
            assert!(rfc3339(bad).unwrap_err().contains("RFC 3339"), "{bad}");
        }
    }

    #[test]
    fn clusters_are_named_with_or_without_their_namespace() {
        assert_eq!(cluster_ref("ops/demo", "clusters"), ("ops".to_string(), "demo".to_string()));
        assert_eq!(cluster_ref("demo", "clusters"), ("clusters".to_string(), "demo".to_string()));
    }
}
