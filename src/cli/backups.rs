//! `hcp-dr backups list|describe|verify|copy|prune`.

use std::path::PathBuf;

use clap::{Args as ClapArgs, Subcommand};

use super::{Exit, Output};
use crate::archive::Layout;
use crate::archive::retention::Policy;
use crate::duration;
use crate::ops::OpsError;
use crate::ops::backups::{self, BackupEntry, Listed, PruneEntry, StoreLock, StreamWindows, VerifyReport};
use crate::ops::object_lock::LockState;
use crate::ops::restore::{latest_backup, split_backup_url};
use crate::store::object_lock::{LockMode, ObjectLock};
use crate::store::{self, S3Options, Store};

#[derive(Debug, ClapArgs)]
pub struct StoreArgs {
    /// S3 endpoint for S3-compatible services.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
}

impl StoreArgs {
    fn s3(&self) -> S3Options {
        S3Options {
            endpoint: self.s3_endpoint.clone(),
            ca_bundle: self.ca_bundle.clone(),
            ..S3Options::default()
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Backups in a store, newest first (incomplete ones marked, never shown as good).
    #[command(after_help = "Example:\n  hcp-dr backups list --store s3://bucket/prefix --hosted-cluster demo -n clusters")]
    List {
        /// The store: a directory, file:///path or s3://bucket/prefix.
        /// Repeat it for a store and its copies: each backup is listed once,
        /// with the stores that hold it complete.
        #[arg(long, env = "HCP_DR_STORE", required = true)]
        store: Vec<String>,
        /// Only this hosted cluster's backups.
        #[arg(long)]
        hosted_cluster: Option<String>,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters")]
        namespace: String,
        #[command(flatten)]
        s3: StoreArgs,
    },
    /// One backup's manifest, readable.
    #[command(after_help = "Example:\n  hcp-dr backups describe s3://bucket/prefix/clusters/demo/latest")]
    Describe {
        /// The backup's URL (`<store>/<ns>/<cluster>/<backup-id>` or `.../latest`).
        backup: String,
        #[command(flatten)]
        s3: StoreArgs,
    },
    /// Download and check every artifact of a backup and its snapshots
    /// offline; with --streams, or a stream URL, the cluster's stream chains
    /// too (every segment's hash, revisions contiguous from the base).
    #[command(after_help = "Example:\n  hcp-dr backups verify --deep s3://bucket/prefix/clusters/demo/latest\n  hcp-dr backups verify --streams s3://bucket/prefix/clusters/demo/latest\n  hcp-dr backups verify s3://bucket/prefix/clusters/demo/stream\n  hcp-dr backups verify s3://bucket/prefix/clusters/demo/stream/20261121T180000Z-0a1b2c\n  hcp-dr backups verify s3://bucket/prefix/clusters/demo/stream --at 2026-11-21T18:04:05Z")]
    Verify {
        /// The backup's URL (`<store>/<ns>/<cluster>/<backup-id>` or
        /// `.../latest`), or the cluster's stream (`<store>/<ns>/<cluster>/stream`,
        /// every chain) or one chain (`.../stream/<chain-id>`): then only
        /// the chains are checked.
        backup: String,
        /// Also check every stream chain of the backup's cluster (each
        /// segment downloaded and hashed); fails when the cluster has none.
        #[arg(long)]
        streams: bool,
        /// Also restore each snapshot into a scratch etcd and count its keys.
        #[arg(long)]
        deep: bool,
        /// Check that the cluster's stream restores this time (RFC 3339):
        /// its chain replayed to the point into a scratch etcd (as `restore
        /// --at` does) and the snapshot checked offline, then thrown away.
        /// Only the point is checked, not the backup.
        #[arg(long, value_name = "TIME", value_parser = super::stream::rfc3339, conflicts_with_all = ["at_revision", "deep", "streams"])]
        at: Option<chrono::DateTime<chrono::Utc>>,
        /// As --at, for exactly this etcd revision of the stream [range: 1
        /// to 1000000000000000000].
        #[arg(long, value_name = "REVISION", value_parser = clap::value_parser!(i64).range(1..=1_000_000_000_000_000_000), conflicts_with_all = ["deep", "streams"])]
        at_revision: Option<i64>,
        /// age identity file to decrypt an encrypted backup and check its
        /// plaintext too (without it, only the stored bytes are checked).
        #[arg(long, env = "HCP_DR_IDENTITY")]
        identity: Option<PathBuf>,
        #[command(flatten)]
        s3: StoreArgs,
    },
    /// Copy complete backups (and their result records) to another store:
    /// idempotent and resumable, every hash checked, manifest last;
    /// --lock-for locks each copy with S3 Object Lock.
    #[command(after_help = "Example:\n  hcp-dr backups copy --from s3://bucket/prefix --to s3://other-region-bucket/prefix --since 7d --lock-for 30d")]
    Copy {
        /// The store to copy from.
        #[arg(long, env = "HCP_DR_STORE")]
        from: String,
        /// The store to copy to (another one).
        #[arg(long)]
        to: String,
        /// Only this hosted cluster's backups.
        #[arg(long)]
        hosted_cluster: Option<String>,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters")]
        namespace: String,
        /// Only backups taken within this long (e.g. 7d) [range: 1h to 36500d].
        #[arg(long, value_parser = duration::RETENTION_AGE)]
        since: Option<std::time::Duration>,
        /// Lock every object of each backup copied with S3 Object Lock for
        /// this long from when it is written at --to (objects there already
        /// are held as long from when they were written, never pushed
        /// further); the result records are not locked. --to must be an S3
        /// bucket with Object Lock enabled [range: 1s to 36500d].
        #[arg(long, value_name = "DURATION", value_parser = duration::LOCK_FOR)]
        lock_for: Option<std::time::Duration>,
        /// With --lock-for: compliance (nobody, not even the account's root,
        /// can delete it early) or governance (principals with
        /// s3:BypassGovernanceRetention can).
        #[arg(long, value_enum, default_value_t, requires = "lock_for")]
        lock_mode: LockMode,
        #[command(flatten)]
        s3: StoreArgs,
    },
    /// Delete backups a retention policy does not keep (their bytes, all of them).
    #[command(after_help = "Example:\n  hcp-dr backups prune --store s3://bucket/prefix --keep-daily 7 --keep-weekly 4 --dry-run")]
    Prune {
        /// The store: a directory, file:///path or s3://bucket/prefix.
        #[arg(long, env = "HCP_DR_STORE")]
        store: String,
        /// Only this hosted cluster's backups.
        #[arg(long)]
        hosted_cluster: Option<String>,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters")]
        namespace: String,
        /// Keep the N newest complete backups [range: 1 to 10000].
        #[arg(long, value_parser = super::keep_count())]
        keep_last: Option<usize>,
        /// Keep the newest complete backup of each of the last N days [range: 1 to 10000].
        #[arg(long, value_parser = super::keep_count())]
        keep_daily: Option<usize>,
        /// Keep the newest complete backup of each of the last N weeks [range: 1 to 10000].
        #[arg(long, value_parser = super::keep_count())]
        keep_weekly: Option<usize>,
        /// Remove complete backups older than this (e.g. 30d), unless it is a
        /// cluster's newest [range: 1h to 36500d].
        #[arg(long, value_parser = duration::RETENTION_AGE)]
        max_age: Option<std::time::Duration>,
        /// Remove incomplete backups (no manifest) older than this: a backup
        /// still running must not look abandoned [range: 1h to 36500d].
        #[arg(long, default_value = "24h", value_parser = duration::INCOMPLETE_AFTER)]
        incomplete_after: std::time::Duration,
        /// Remove a cluster's ended stream chains (a newer chain follows)
        /// last written longer ago than this (e.g. 14d), each whole; without
        /// it, those last written before the cluster's oldest kept complete
        /// backup. The newest chain is never removed [range: 1h to 36500d].
        #[arg(long, value_name = "AGE", value_parser = duration::RETENTION_AGE)]
        keep_stream: Option<std::time::Duration>,
        /// List what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Prune only part INDEX of COUNT parts of the store's clusters (by the hash of NAMESPACE/NAME; INDEX from 0): each pod of a sharded schedule prunes its part, so no folder is pruned twice.
        #[arg(long, value_name = "INDEX/COUNT", conflicts_with = "hosted_cluster", value_parser = super::backup::parse_shard)]
        shard: Option<crate::ops::shard::Shard>,
        #[command(flatten)]
        s3: StoreArgs,
    },
}

fn fail(err: OpsError) -> Exit {
    super::report::error_exit(&err)
}

/// `<store>/<ns>/<cluster>/<id|latest>` into the store and the backup.
pub(crate) async fn open_backup(url: &str, s3: S3Options) -> Result<(Box<dyn Store>, Layout), OpsError> {
    let (root, ns, hc, id) = split_backup_url(url).ok_or_else(|| {
        OpsError::Input(format!("`{url}` does not end in <namespace>/<cluster>/<backup-id> (or .../latest): give one backup's URL (hcp-dr backups list)"))
    })?;
    let store = store::open(&root, s3).await?;
    let id = if id == "latest" { latest_backup(store.as_ref(), &ns, &hc).await? } else { id };
    Ok((store, Layout::new(&ns, &hc, &id)))
}

fn age(seconds: i64) -> String {
    match seconds {
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86400 => format!("{}h", s / 3600),
        s => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

fn render_list(listed: &[Listed], stores: &[String], unattached: &[StreamWindows]) -> String {
    let several = stores.len() > 1;
    // a LOCK column where a store has S3 Object Lock
    let locks = listed.iter().any(|l| !l.object_lock.is_empty());
    let mut out = format!(
        "{:<24} {:<24} {:>7}  {:<10} {:>10} {:>9} {:>9} {:>9}  {:<8}{}{}\n",
        "CLUSTER", "BACKUP", "AGE", "STATUS", "SIZE", "REVISION", "DURATION", "DOWNTIME", "LINEAGE",
        if several { "  STORES" } else { "" },
        if locks { "  LOCK" } else { "" }
    );
    let entries: Vec<&BackupEntry> = listed.iter().map(|l| &l.entry).collect();
    for l in listed {
        let e = &l.entry;
        let opt = |v: Option<f64>| v.map(|s| format!("{s:.1}s")).unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<24} {:<24} {:>7}  {:<10} {:>10} {:>9} {:>9} {:>9}  {:<8}\n",
            format!("{}/{}", e.namespace, e.hosted_cluster),
            e.backup_id,
            age(e.age_seconds),
            match (e.complete, e.no_quorum, e.degraded.is_some()) {
                (false, _, _) => "INCOMPLETE",
                (true, true, _) => "NO-QUORUM",
                (true, false, true) => "degraded",
                (true, false, false) => "complete",
            },
            size(e.size_bytes),
            e.etcd_revision.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
            opt(e.duration_seconds),
            opt(e.api_downtime_seconds),
            e.lineage.as_deref().map(|l| l.chars().take(8).collect::<String>()).unwrap_or_else(|| "-".into()),
        ));
        if several {
            out.pop();
            let held: Vec<String> = stores.iter().enumerate().filter(|(_, s)| e.stores.contains(s)).map(|(i, _)| (i + 1).to_string()).collect();
            let held = if held.is_empty() { "-".to_string() } else { held.join(",") };
            // padded only when the LOCK column follows
            out.push_str(&format!("  {held:<width$}\n", width = if locks { 6 } else { 0 }));
        }
        if locks {
            out.pop();
            out.push_str(&format!("  {}\n", lock_cell(&l.object_lock, stores)));
        }
    }
    if several {
        for (i, s) in stores.iter().enumerate() {
            out.push_str(&format!("store {}: {s}\n", i + 1));
        }
    }
    if entries.is_empty() {
        out.push_str("(no backups)\n");
    }
    let mut shown = std::collections::BTreeSet::new();
    for e in &entries {
        if !shown.insert((&e.namespace, &e.hosted_cluster)) {
            continue;
        }
        if let Some(f) = &e.fence {
            out.push_str(&fence_line(f));
        }
        if let Some(err) = &e.fence_error {
            out.push_str(&format!("fence: UNREADABLE: {err}; backups of {}/{} are refused\n", e.namespace, e.hosted_cluster));
        }
    }
    for e in entries.iter().filter(|e| e.degraded.is_some()) {
        out.push_str(&format!("{}: etcd {}\n", e.backup_id, e.degraded.as_deref().unwrap_or_default()));
    }
    for e in &entries {
        if let Some(p) = &e.point_in_time {
            out.push_str(&format!(
                "{}: point in time, made by a restore of {}: etcd at revision {} of chain {}, objects from backup {}\n",
                e.backup_id, p.asked, p.revision, p.chain_id, p.objects_from
            ));
        }
    }
    for w in listed.iter().flat_map(|l| &l.stream).chain(unattached) {
        out.push_str(&render_windows(w));
    }
    out
}

fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)).unwrap_or_else(|| "?".into())
}

/// A cluster's stream windows, oldest first, with the gaps between them.
fn render_windows(w: &StreamWindows) -> String {
    let mut out = format!("stream of {}/{} in {}: any revision in a window restores (hcp-dr stream replay)\n", w.namespace, w.hosted_cluster, w.store);
    for (i, c) in w.chains.iter().enumerate() {
        if let Some(gap) = w.gaps.iter().find(|g| g.before_chain == c.chain_id && i > 0) {
            let revisions = gap.revisions.map(|(a, b)| format!("revisions {a}..{b}")).unwrap_or_default();
            out.push_str(&format!("  GAP    {revisions}, {} .. {}: no chain holds them\n", when(gap.from), when(gap.until)));
        }
        match (c.from_revision, c.through_revision) {
            (Some(from), Some(through)) => out.push_str(&format!(
                "  window revisions {from}..{through}, {} .. {} (chain {}, {} segment(s)){}\n",
                when(c.from),
                when(c.through),
                c.chain_id,
                c.segments,
                c.problem.as_ref().map(|p| format!("; stops short: {p}")).unwrap_or_default()
            )),
            _ => out.push_str(&format!("  chain {}: {}\n", c.chain_id, c.problem.as_deref().unwrap_or("restores nothing"))),
        }
    }
    for dir in &w.incomplete {
        out.push_str(&format!("  {dir}: a base without chain.json (being taken, or the stream stopped while taking it): restores nothing\n"));
    }
    out
}

/// The LOCK cell: each store's lock of the backup (prefixed by the store's
/// number when several are listed), or `-`.
fn lock_cell(locks: &[StoreLock], stores: &[String]) -> String {
    if locks.is_empty() {
        return "-".into();
    }
    let number = |url: &str| stores.iter().position(|s| s == url).map(|i| i + 1);
    locks
        .iter()
        .map(|l| match number(&l.store) {
            Some(n) if stores.len() > 1 => format!("{n}: {}", l.lock.short()),
            _ => l.lock.short(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn fence_line(fence: &crate::archive::fence::Fence) -> String {
    format!("fence: {}; backups taken anywhere else are refused\n", fence.describe())
}

/// `backups describe`: the manifest and the cluster's store fence.
#[derive(serde::Serialize)]
struct Described<'a> {
    #[serde(flatten)]
    manifest: &'a crate::archive::Manifest,
    #[serde(skip_serializing_if = "Option::is_none")]
    fence: Option<&'a crate::archive::fence::Fence>,
    /// What S3 Object Lock does to it (a bucket with Object Lock only).
    #[serde(skip_serializing_if = "Option::is_none")]
    object_lock: Option<LockState>,
}

fn render_origin(origin: &crate::archive::Origin) -> String {
    let mut out = format!("taken on management cluster {}\n", origin.management_cluster.describe());
    if !origin.hostnames.is_empty() {
        out.push_str(&format!("published hostnames: {}\n", origin.hostnames.join(", ")));
    }
    match &origin.dns {
        Some(dns) => {
            out.push_str(&format!(
                "DNS (zone {}): external-dns owner {}\n",
                dns.zone_id,
                dns.owner.as_deref().unwrap_or("(no single owner)")
            ));
            for r in dns.records.iter().filter(|r| r.kind != "TXT") {
                let target = r.alias.clone().unwrap_or_else(|| r.values.join(" "));
                out.push_str(&format!("  {} {} {} [owner {}]\n", r.name, r.kind, target, r.owner.as_deref().unwrap_or("none")));
            }
        }
        None => out.push_str("DNS records: not recorded (back up with --route53-zone to record them and their external-dns owner)\n"),
    }
    out
}

fn render_manifest(m: &crate::archive::Manifest) -> String {
    let mut out = format!(
        "backup {} of {}/{} (format {}, hcp-dr {})\n",
        m.backup_id, m.cluster.namespace, m.cluster.name, m.format_version, m.tool_version
    );
    out.push_str(&format!(
        "cluster: uid {}, platform {}, {}, release {}\n  HCP namespace {}; etcd encryption key Secret {}\n",
        m.cluster.uid,
        m.cluster.platform,
        m.cluster.availability_policy,
        m.cluster.release_image,
        m.cluster.hcp_namespace,
        m.cluster.encryption_key_secret.as_deref().unwrap_or("(none)")
    ));
    if m.cluster.lineage_root() != m.cluster.uid {
        out.push_str(&format!(
            "  lineage {}: restored or migrated from that cluster; backups of either UID share the etcd encryption key\n",
            m.cluster.lineage_root()
        ));
    }
    if let (Some(s), Some(f)) = (m.timings.started, m.timings.finished) {
        out.push_str(&format!("taken {s} .. {f}"));
        if let Some(d) = m.timings.api_downtime_seconds {
            out.push_str(&format!(", API down {d:.1}s"));
        }
        out.push('\n');
    }
    let best = m.best_snapshot().map(|s| s.member.clone());
    out.push_str("etcd snapshots:\n");
    for s in &m.etcd {
        out.push_str(&format!(
            "  {:<8} revision {:<8} {:>10}  sha256 {}{}\n",
            s.member,
            s.revision,
            size(s.size),
            s.sha256,
            if best.as_deref() == Some(s.member.as_str()) { "  (used by restore)" } else { "" }
        ));
    }
    for s in &m.etcd_health.skipped {
        out.push_str(&format!("  {:<8} SKIPPED: {}\n", s.member, s.reason));
    }
    if m.etcd_health.no_quorum {
        out.push_str("  taken WITHOUT QUORUM (--allow-no-quorum): the member may lack the last writes the lost majority acknowledged\n");
    }
    out.push_str("objects:\n");
    for (kind, n) in &m.object_counts {
        out.push_str(&format!("  {kind:<28} {n}\n"));
    }
    if let Some(inventory) = &m.agent_inventory {
        out.push_str(&format!("agent inventory: {}\n", inventory.summary()));
        for host in &inventory.hosts {
            out.push_str(&format!(
                "  Agent {:<38} {} {:<8} {}  BareMetalHost {} ({}){}\n",
                host.agent,
                host.hostname.as_deref().unwrap_or("-"),
                host.role.as_deref().unwrap_or("-"),
                if host.approved { "approved" } else { "NOT approved" },
                host.bare_metal_host.as_deref().unwrap_or("-"),
                host.boot_mac.as_deref().unwrap_or("no boot MAC"),
                if host.free { "  free" } else { "" }
            ));
        }
    }
    if let Some(guest) = &m.guest_volumes {
        out.push_str(&format!("guest volumes: {} copied (KubeVirt)\n", guest.volumes.len()));
        for v in &guest.volumes {
            let stored = m.artifact(&v.artifact).map(|a| size(a.size)).unwrap_or_else(|| "missing".into());
            let root_disk = v.volume.virtual_machine.as_ref().and_then(|vm| vm["metadata"]["name"].as_str());
            out.push_str(&format!(
                "  {:<40} {} {:<8} class {:<16} {} entries, {} ({}){}\n",
                format!("{}/{}", v.volume.namespace, v.volume.name),
                v.volume.volume_mode,
                v.volume.size,
                v.volume.storage_class,
                v.files,
                stored,
                v.artifact,
                root_disk.map(|vm| format!(", root disk of VirtualMachine {vm}")).unwrap_or_default()
            ));
        }
        if !guest.root_disks.is_empty() {
            out.push_str(&format!("  root disks not copied (re-created from the NodePool's image): {}\n", guest.root_disks.join(", ")));
        }
    }
    if let Some(c) = &m.compression {
        out.push_str(&format!("compressed: {} level {} (the etcd snapshots)\n", c.algorithm, c.level));
        for a in &c.artifacts {
            let stored = m.artifact(&a.name).map(|s| s.size).unwrap_or_default();
            let ratio = if stored > 0 { format!("{:.1}x", a.size as f64 / stored as f64) } else { "-".into() };
            out.push_str(&format!("  {:<20} raw {:>10}  stored {:>10}  {ratio:>6}  raw sha256 {}\n", a.name, size(a.size), size(stored), a.sha256));
        }
    }
    if let Some(e) = &m.encryption {
        out.push_str(&format!("encrypted: {} for {}\n", e.scheme, e.recipients.join(", ")));
        for a in &e.artifacts {
            out.push_str(&format!("  {:<20} plaintext {:>10}  sha256 {}\n", a.name, size(a.size), a.sha256));
        }
    }
    match &m.origin {
        Some(origin) => out.push_str(&render_origin(origin)),
        None => out.push_str("origin: not recorded (a backup by an older hcp-dr)\n"),
    }
    out
}

fn render_verify(r: &VerifyReport) -> String {
    let mut out = format!("{}: {}\n", r.backup, if r.ok { "OK" } else { "FAILED" });
    if r.plaintext_checked {
        out.push_str(&format!(
            "  {} artifacts ({}) match the manifest; {} objects parse\n",
            r.artifacts_checked,
            size(r.bytes_checked),
            r.objects
        ));
    } else {
        out.push_str(&format!("  {} artifacts ({}) match the manifest\n", r.artifacts_checked, size(r.bytes_checked)));
    }
    if !r.encrypted_to.is_empty() {
        if r.plaintext_checked {
            out.push_str(&format!("  encrypted (age) to {}: decrypted with --identity, the plaintext matches the manifest\n", r.encrypted_to.join(", ")));
        } else {
            out.push_str(&format!(
                "  encrypted (age) to {}: the stored (encrypted) bytes were checked; checking the plaintext (objects, snapshots read offline, --deep) needs --identity KEY-FILE\n",
                r.encrypted_to.join(", ")
            ));
        }
    }
    for s in &r.snapshots {
        out.push_str(&format!(
            "  {:<8} {}  revision {}  keys {}{}\n",
            s.member,
            s.verdict,
            s.revision.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
            s.live_keys.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
            s.restored_keys.map(|k| format!("  (scratch etcd: {k} keys)")).unwrap_or_default()
        ));
    }
    if let Some(why) = &r.deep_skipped {
        out.push_str(&format!("  deep check skipped: {why}\n"));
    }
    out.push_str(&render_chains(&r.streams));
    for p in &r.problems {
        out.push_str(&format!("  problem: {p}\n"));
    }
    if let Some(key) = &r.recorded {
        out.push_str(&format!("  result recorded: {key}\n"));
    }
    for w in &r.warnings {
        out.push_str(&format!("  warning: {w}\n"));
    }
    out
}

/// `backups verify` of a stream URL: its chains' verdicts.
#[derive(serde::Serialize)]
struct StreamsVerified {
    stream: String,
    ok: bool,
    problems: Vec<String>,
    chains: Vec<crate::stream::verify::ChainVerdict>,
    /// With --deep: each chain replayed to the next one's base, compared.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    handovers: Vec<crate::stream::deep::Handover>,
}

/// `<store>/<ns>/<cluster>/stream` (every chain) or `.../stream/<chain-id>`
/// (one) into the store, the cluster and the chain; `None` for any other URL.
fn split_stream_url(url: &str) -> Option<(String, String, String, Option<String>)> {
    use crate::stream::format::STREAM_FOLDER;
    let trimmed = url.trim_end_matches('/');
    let (rest, chain) = match trimmed.rsplit_once('/') {
        Some((rest, last)) if last == STREAM_FOLDER => (rest, None),
        Some((rest, last)) if crate::archive::parse_backup_id(last).is_ok() => {
            let (rest, folder) = rest.rsplit_once('/')?;
            if folder != STREAM_FOLDER {
                return None;
            }
            (rest, Some(last.to_string()))
        }
        _ => return None,
    };
    let mut parts = rest.rsplitn(3, '/');
    let (hc, ns, root) = (parts.next()?, parts.next()?, parts.next()?);
    if root.is_empty() || root.ends_with(':') || root.ends_with(":/") {
        return None;
    }
    Some((root.to_string(), ns.to_string(), hc.to_string(), chain))
}

/// One line per chain verdict.
fn render_chains(chains: &[crate::stream::verify::ChainVerdict]) -> String {
    let mut out = String::new();
    for c in chains {
        let run = match (c.base_revision, c.good_through) {
            (Some(base), Some(through)) => format!("revisions {base}..{through} restore"),
            _ => "restores nothing".to_string(),
        };
        out.push_str(&format!(
            "  stream chain {}: {}  {run}; {} segment(s), {}\n",
            c.chain_id,
            if c.ok { "OK" } else { "FAILED" },
            c.segments,
            if c.content_checked { "hashes and content checked" } else { "stored bytes only: encrypted, no --identity" }
        ));
    }
    out
}

fn render_prune(entries: &[PruneEntry], dry_run: bool) -> String {
    let mut out = String::new();
    let (mut removed, mut bytes) = (0, 0);
    for e in entries {
        let action = match (e.keep, dry_run) {
            (true, _) => "keep",
            (false, true) => "WOULD DELETE",
            (false, false) => "DELETED",
        };
        if !e.keep {
            removed += 1;
            bytes += e.size_bytes;
        }
        let id = match (e.stream_chain, e.object_set) {
            (true, _) => format!("stream/{}", e.backup_id),
            (_, true) => format!("stream/{}/{}", crate::stream::objects::FOLDER, e.backup_id),
            _ => e.backup_id.clone(),
        };
        out.push_str(&format!("{:<24} {:<24} {:<12} {}\n", e.cluster, id, action, e.reasons.join("; ")));
    }
    let chains = entries.iter().filter(|e| e.stream_chain).count();
    let sets = entries.iter().filter(|e| e.object_set).count();
    out.push_str(&format!(
        "{} backup(s){}{}, {} {} ({})\n",
        entries.len() - chains - sets,
        if chains > 0 { format!(" and {chains} stream chain(s)") } else { String::new() },
        if sets > 0 { format!(" and {sets} object set(s)") } else { String::new() },
        removed,
        if dry_run { "would be deleted" } else { "deleted" },
        size(bytes)
    ));
    let locked: Vec<&PruneEntry> = entries.iter().filter(|e| e.locked.is_some()).collect();
    if !locked.is_empty() {
        let next = locked.iter().filter_map(|e| e.locked.as_ref().and_then(|l| l.until)).min();
        out.push_str(&format!(
            "{} backup(s) or chain(s) the policy removes are kept under S3 Object Lock{}\n",
            locked.len(),
            next.map(|t| format!(" (the first retention ends {})", t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))).unwrap_or_default()
        ));
    }
    out
}

use super::report::{human_bytes as size, print};

pub async fn exec(command: Command, output: Output) -> Exit {
    match command {
        Command::List { store, hosted_cluster, namespace, s3 } => {
            let mut stores = Vec::new();
            for url in &store {
                match store::open(url, s3.s3()).await {
                    Ok(s) => stores.push(s),
                    Err(e) => return fail(e.into()),
                }
            }
            let cluster = hosted_cluster.as_deref().map(|hc| (namespace.as_str(), hc));
            let (mut each, mut windows) = (Vec::new(), Vec::new());
            for one in &stores {
                let catalogue = match backups::catalogue(one.as_ref(), cluster).await {
                    Ok(c) => c,
                    Err(e) => return fail(e),
                };
                match backups::stream_windows(one.as_ref(), &catalogue.streamed).await {
                    Ok(w) => windows.extend(w),
                    Err(e) => return fail(e),
                }
                each.push((one.url(), catalogue.backups));
            }
            let entries = match each.len() {
                1 => each.pop().map(|(_, entries)| entries).unwrap_or_default(),
                _ => backups::merge(each),
            };
            let (mut listed, warnings) = backups::with_locks(&stores, entries).await;
            for w in &warnings {
                tracing::warn!("{w}");
            }
            let unattached = backups::attach_streams(&mut listed, windows);
            for w in &unattached {
                tracing::warn!(
                    "{}/{} has stream chains in {} but no backup: they are shown in the text output; `hcp-dr stream list -o json` lists them",
                    w.namespace,
                    w.hosted_cluster,
                    w.store
                );
            }
            let urls: Vec<String> = stores.iter().map(|s| s.url()).collect();
            print(output, &listed, || render_list(&listed, &urls, &unattached));
            Exit::Success
        }
        Command::Describe { backup, s3 } => {
            let (store, layout) = match open_backup(&backup, s3.s3()).await {
                Ok(v) => v,
                Err(e) => return fail(e),
            };
            let manifest = match backups::describe(store.as_ref(), &layout).await {
                Ok(manifest) => manifest,
                Err(e) => return fail(e),
            };
            let fence = match backups::fence_of(store.as_ref(), &layout.namespace, &layout.hosted_cluster).await {
                Ok(f) => f,
                Err(e) => return fail(e),
            };
            let object_lock = backups::lock_of(store.as_ref(), &layout).await;
            let described = Described { manifest: &manifest, fence: fence.as_ref(), object_lock };
            print(output, &described, || {
                let mut text = render_manifest(&manifest);
                if let Some(lock) = &described.object_lock {
                    text.push_str(&format!("object lock: {}\n", lock.describe()));
                }
                if let Some(f) = &fence {
                    text.push_str(&fence_line(f));
                }
                text
            });
            Exit::Success
        }
        Command::Verify { backup, streams, deep, identity, s3, at, at_revision } => {
            let target = match (at, at_revision) {
                (Some(t), _) => Some(crate::stream::replay::Target::Time(t)),
                (None, Some(r)) => Some(crate::stream::replay::Target::Revision(r)),
                (None, None) => None,
            };
            if let Some(target) = target {
                let Some((root, ns, hc)) = split_stream_url(&backup).map(|(r, n, h, _)| (r, n, h)).or_else(|| crate::ops::restore::split_backup_url(&backup).map(|(r, n, h, _)| (r, n, h))) else {
                    return fail(OpsError::Input(format!("--at: `{backup}` names neither a backup nor a stream: give <store>/<ns>/<cluster>/stream (or a backup of the cluster)")));
                };
                let read = crate::ops::stream::ReadOptions { namespace: ns, hosted_cluster: hc, store: root, s3: s3.s3(), identity };
                return match crate::ops::stream::verify_point(&read, target).await {
                    Ok(report) => {
                        print(output, &report, || {
                            format!(
                                "{}/{}: {} restores: revision {} received {} (chain {}, {} revisions replayed onto its base, the result checked offline)\n",
                                read.namespace,
                                read.hosted_cluster,
                                report.asked,
                                report.revision,
                                report.received.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                                report.chain_id,
                                report.revisions_applied
                            )
                        });
                        Exit::Success
                    }
                    Err(e) => fail(e),
                };
            }
            let identities = match identity.as_deref().map(crate::archive::encryption::Identities::from_file).transpose() {
                Ok(ids) => ids,
                Err(e) => return fail(OpsError::Input(e.to_string())),
            };
            if let Some((root, ns, hc, chain)) = split_stream_url(&backup) {
                let store = match store::open(&root, s3.s3()).await {
                    Ok(s) => s,
                    Err(e) => return fail(e.into()),
                };
                return match backups::verify_stream(store.as_ref(), &ns, &hc, chain.as_deref(), identities.as_ref(), deep).await {
                    Ok((chains, handovers)) => {
                        let mut problems: Vec<String> = chains.iter().filter_map(backups::chain_problem).collect();
                        problems.extend(handovers.iter().filter(|h| !h.ok).map(|h| {
                            format!("chain {} replayed to revision {} differs from chain {}'s base in {} key(s): {}", h.chain_id, h.revision, h.next_chain_id, h.differences, h.shown.join("; "))
                        }));
                        let ok = chains.iter().all(|c| c.ok) && handovers.iter().all(|h| h.ok);
                        let report = StreamsVerified { problems, ok, stream: backup, chains, handovers };
                        print(output, &report, || {
                            let mut out = format!("{}: {}\n", report.stream, if report.ok { "OK" } else { "FAILED" });
                            out.push_str(&render_chains(&report.chains));
                            for h in &report.handovers {
                                out.push_str(&format!(
                                    "  chain {} replayed to revision {} against chain {}'s base: {} key(s) compared, {}\n",
                                    h.chain_id,
                                    h.revision,
                                    h.next_chain_id,
                                    h.keys_compared,
                                    if h.ok { "identical".to_string() } else { format!("{} DIFFERENT", h.differences) }
                                ));
                            }
                            if deep && report.handovers.is_empty() {
                                out.push_str("  --deep: no chain hands over to a next one here (nothing to replay against)\n");
                            }
                            for p in &report.problems {
                                out.push_str(&format!("  problem: {p}\n"));
                            }
                            out
                        });
                        if report.ok { Exit::Success } else { Exit::Failed }
                    }
                    Err(e) => fail(e),
                };
            }
            let (store, layout) = match open_backup(&backup, s3.s3()).await {
                Ok(v) => v,
                Err(e) => return fail(e),
            };
            // no chain is bad input: found before any artifact is downloaded
            let chains = match streams {
                true => match backups::verify_streams(store.as_ref(), &layout.namespace, &layout.hosted_cluster, None, identities.as_ref()).await {
                    Ok(chains) => chains,
                    Err(e) => return fail(e),
                },
                false => Vec::new(),
            };
            match backups::verify_with(store.as_ref(), &layout, deep, identities.as_ref()).await {
                Ok(mut report) => {
                    report.problems.extend(chains.iter().filter_map(backups::chain_problem));
                    report.ok &= chains.iter().all(|c| c.ok);
                    report.streams = chains;
                    print(output, &report, || render_verify(&report));
                    if report.ok { Exit::Success } else { Exit::Failed }
                }
                Err(e) => fail(e),
            }
        }
        Command::Copy { from, to, hosted_cluster, namespace, since, lock_for, lock_mode, s3 } => {
            let options = crate::ops::copy::CopyOptions {
                from,
                to,
                s3: s3.s3(),
                cluster: hosted_cluster.map(|hc| (namespace, hc)),
                since,
                lock: lock_for.map(|retain_for| ObjectLock { mode: lock_mode, retain_for }),
            };
            match crate::ops::copy::copy(&options).await {
                Ok(report) => {
                    print(output, &report, || crate::ops::copy::render(&report));
                    if report.failed == 0 { Exit::Success } else { Exit::Failed }
                }
                Err(e) => fail(e),
            }
        }
        Command::Prune {
            store,
            hosted_cluster,
            namespace,
            keep_last,
            keep_daily,
            keep_weekly,
            max_age,
            incomplete_after,
            keep_stream,
            dry_run,
            shard,
            s3,
        } => {
            let store = match store::open(&store, s3.s3()).await {
                Ok(s) => s,
                Err(e) => return fail(e.into()),
            };
            let policy = Policy {
                keep_last,
                keep_daily,
                keep_weekly,
                max_age: max_age.map(duration::to_chrono),
                incomplete_after: duration::to_chrono(incomplete_after),
                keep_stream: keep_stream.map(duration::to_chrono),
            };
            let cluster = hosted_cluster.as_deref().map(|hc| (namespace.as_str(), hc));
            match backups::prune(store.as_ref(), cluster, shard, &policy, dry_run).await {
                Ok(entries) => {
                    print(output, &entries, || render_prune(&entries, dry_run));
                    Exit::Success
                }
                Err(e) => fail(e),
            }
        }
    }
}
