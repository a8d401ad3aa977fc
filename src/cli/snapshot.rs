//! `hcp-dr snapshot verify FILE|STORE-URL`: check an etcd snapshot offline.
//!
//! Exit codes: 0 the snapshot is good; 1 it is not (the verdict says why);
//! 2 it could not be checked (missing file, bad URL, unreachable store).

use std::path::PathBuf;

use clap::{Args as ClapArgs, Subcommand};

use super::{Exit, Output};
use crate::archive::encryption::Identities;
use crate::etcd::verify::{Report, Verdict, VerifyError, verify_source_with};
use crate::store::S3Options;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check an etcd snapshot without etcd: its trailing SHA-256, its bbolt
    /// structure, and what it holds (revision, keys per resource).
    #[command(after_help = "Example:\n  hcp-dr snapshot verify s3://bucket/prefix/clusters/demo/latest/etcd/etcd-0.db")]
    Verify(VerifyArgs),
}

#[derive(Debug, ClapArgs)]
pub struct VerifyArgs {
    /// The snapshot: a file, file:///path, or an object such as
    /// s3://bucket/prefix/clusters/demo/BACKUP-ID/etcd/etcd-0.db (`latest`
    /// in place of BACKUP-ID names the newest complete backup).
    #[arg(value_name = "FILE|STORE-URL")]
    pub snapshot: String,
    /// S3 endpoint for S3-compatible services (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// Extra CA bundle (PEM) to trust for the S3 endpoint.
    #[arg(long, env = "HCP_DR_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    /// age identity file (as age-keygen writes it) to decrypt a snapshot of
    /// an encrypted backup (hcp-dr backup --encrypt-to). The plaintext is
    /// never written to disk.
    #[arg(long, env = "HCP_DR_IDENTITY")]
    pub identity: Option<PathBuf>,
}

pub async fn exec(command: Command, output: Output) -> Exit {
    let Command::Verify(args) = command;
    let s3 = S3Options {
        endpoint: args.s3_endpoint,
        ca_bundle: args.ca_bundle,
        ..S3Options::default()
    };
    let identities = match args.identity.as_deref().map(Identities::from_file).transpose() {
        Ok(ids) => ids,
        Err(err) => {
            eprintln!("error: {err}");
            return Exit::Usage;
        }
    };
    let snapshot = match resolve_latest(&args.snapshot, &s3).await {
        Ok(snapshot) => snapshot,
        Err(err) => {
            eprintln!("error: {err}");
            return Exit::Usage;
        }
    };
    match verify_source_with(&snapshot, s3, identities.as_ref()).await {
        Ok(report) => {
            super::report::print(output, &report, || render(&report));
            if report.is_ok() {
                Exit::Success
            } else {
                Exit::Failed
            }
        }
        Err(err) => {
            eprintln!("error: {err}");
            eprintln!("{}", hint(&err));
            Exit::Usage
        }
    }
}

/// `<store>/<ns>/<cluster>/latest/etcd/<file>` with `latest` replaced by the
/// newest complete backup's id (as restore and `backups verify` read it);
/// anything else unchanged.
async fn resolve_latest(given: &str, s3: &S3Options) -> Result<String, crate::ops::OpsError> {
    let Some((backup, file)) = given.rsplit_once("/etcd/") else {
        return Ok(given.to_string());
    };
    if !crate::ops::restore::split_backup_url(backup).is_some_and(|(_, _, _, id)| id == "latest") {
        return Ok(given.to_string());
    }
    let (store, layout) = super::backups::open_backup(backup, s3.clone()).await?;
    Ok(format!("{}/{}/etcd/{file}", store.url(), layout.dir()))
}

/// How to fix an input that could not be checked.
fn hint(err: &VerifyError) -> &'static str {
    match err {
        VerifyError::Open { .. } | VerifyError::NotAFile { .. } | VerifyError::Source { .. } => {
            "hint: give a file written by `etcdctl snapshot save` or a backup's etcd/etcd-N.db, \
             as a path, file:///path or s3://bucket/prefix/.../etcd/etcd-0.db"
        }
        VerifyError::Store(_) | VerifyError::Fetch { .. } => {
            "hint: check the URL (`hcp-dr` backups keep snapshots at <store>/<namespace>/<name>/<backup-id>/etcd/etcd-N.db), \
             the S3 credentials (AWS_* environment or profile), --s3-endpoint and --ca-bundle"
        }
        VerifyError::Encrypted(_) => {
            "hint: the backup was taken with --encrypt-to; pass --identity KEY-FILE holding the private key of one of its recipients \
             (hcp-dr backups describe BACKUP-URL lists them)"
        }
        VerifyError::NoSpace(_) => "hint: the snapshot is copied to TMPDIR to be read; point TMPDIR at a disk with room for it",
        VerifyError::Read { .. } | VerifyError::Scratch { .. } => {
            "hint: the snapshot could not be read to the end; check the disk and TMPDIR's free space, then retry"
        }
    }
}

/// The text report.
pub fn render(report: &Report) -> String {
    let mut out = format!("snapshot {}: {}\n", report.source, report.verdict);
    let advice = match &report.verdict {
        Verdict::Ok => "the trailing SHA-256 matches and every page of the database was read",
        Verdict::HashMismatch { .. } => {
            "the file was damaged after etcd wrote it: do not restore from it; use another copy or backup"
        }
        Verdict::Truncated { .. } => {
            "the copy or upload was cut short: fetch it again or use another backup"
        }
        Verdict::NotASnapshot { .. } => {
            "check that the right file was given; take snapshots with `hcp-dr backup` or `etcdctl snapshot save`"
        }
        Verdict::Corrupt { .. } => {
            "etcd sent a damaged database: do not restore from it; use another member's snapshot or backup"
        }
    };
    out.push_str(&format!("  {advice}\n"));
    out.push_str(&format!("  file size     {} bytes\n", report.file_size));
    if let Some(error) = &report.structure_error {
        out.push_str(&format!("  structure     {error}\n"));
    }
    let Some(summary) = &report.summary else {
        return out;
    };
    match &report.verdict {
        Verdict::HashMismatch { .. } => {
            out.push_str("  (read from a damaged file: not to be trusted)\n")
        }
        Verdict::NotASnapshot { .. } => out.push_str("  (no hash to check this content against)\n"),
        _ => {}
    }
    out.push_str(&format!(
        "  db size       {} bytes ({} pages of {})\n",
        summary.db_size,
        summary.db_size / u64::from(summary.page_size.max(1)),
        summary.page_size
    ));
    out.push_str(&format!("  revision      {}\n", summary.revision));
    if let Some(compacted) = summary.compact_revision {
        out.push_str(&format!("  compacted at  {compacted}\n"));
    }
    if let Some(index) = summary.consistent_index {
        out.push_str(&format!("  raft index    {index}\n"));
    }
    out.push_str(&format!(
        "  keys          {} live; {} revisions stored ({} deletions); {} entries in all buckets (etcdctl's total keys)\n",
        summary.live_keys, summary.revisions, summary.tombstones, summary.etcdctl_total_keys
    ));
    out.push_str(&format!(
        "  hash          {:08x} (as `etcdctl snapshot status`)\n",
        summary.hash
    ));
    if !summary.live_keys_by_prefix.is_empty() {
        out.push_str("  live keys by prefix:\n");
        let width = summary
            .live_keys_by_prefix
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .max(8);
        for (prefix, count) in &summary.live_keys_by_prefix {
            let prefix = if prefix.is_empty() {
                "(no prefix)"
            } else {
                prefix
            };
            out.push_str(&format!("    {prefix:<width$}  {count:>8}\n"));
        }
    }
    for warning in &summary.warnings {
        out.push_str(&format!("  warning: {warning}\n"));
    }
    out
}
