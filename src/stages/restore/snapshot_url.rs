//! `snapshot-url`: the one URL every etcd member of the restored cluster
//! downloads the snapshot from (`restoreSnapshotURL`). For a backup in S3,
//! a presigned GET of the best member snapshot. For a local backup, the
//! snapshot is first copied to the `--stage-snapshot-to` S3 store (checked
//! against the manifest on the way) and that copy is presigned; `wait`
//! deletes the copy once etcd has restored it, and `--abort` does too.
//!
//! An encrypted or compressed backup's snapshot is always staged: etcd's
//! download can neither decrypt nor decompress, so a decoded copy is
//! uploaded to the staging store (the backup's own S3 store unless
//! `--stage-snapshot-to` names another), presigned for a short time, and
//! deleted like any staged copy.
//!
//! What is uploaded is the copy `verify` made while it checked the snapshot
//! (under TMPDIR, private, removed once staged): the snapshot is downloaded
//! and decoded once per restore. A resumed run, which has no such copy,
//! streams it from the store, decoding on the way. Either way the staged
//! bytes are hashed as they go and must match the manifest.
//!
//! The URL is never journaled or printed: it grants read access to the
//! snapshot until it expires. A resumed run presigns again.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::RestoreContext;
use super::verify::{manifest, verified_manifest};
use crate::archive::Manifest;
use crate::archive::Layout;
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};
use crate::stages::StageError;

pub struct SnapshotUrl;

/// Where the URL points (journaled; no signature).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UrlRecord {
    /// The store and key presigned.
    pub store: String,
    pub key: String,
    /// Set when the key is a temporary copy in the staging store.
    pub staged: bool,
    /// The staged copy was uploaded from the copy `verify` checked, not
    /// read from the store again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_checked_copy: bool,
    pub expires: chrono::DateTime<chrono::Utc>,
}

/// The staging key of a backup's snapshot copy.
pub fn staged_key(layout: &Layout, member: &str) -> String {
    format!("hcp-dr-staging/{}/{}", layout.dir(), Layout::snapshot_name(member))
}

/// The key to presign and whether it is staged.
fn source_key(ctx: &RestoreContext, manifest: &Manifest) -> Result<(String, String, bool), StageFailure> {
    let best = manifest.best_snapshot().ok_or(StageError::Missing("a member snapshot"))?;
    let layout = ctx.inputs.layout();
    Ok(match &ctx.staging {
        Some(staging) => (staging.url(), staged_key(&layout, &best.member), true),
        // etcd cannot decrypt: an encrypted snapshot is never presigned as it is
        None if manifest.encrypted() => {
            return Err(StageError::Precondition(
                "the backup is encrypted and etcd's download cannot decrypt it: a decrypted copy must be staged in S3 (--stage-snapshot-to s3://BUCKET/PREFIX; for a backup in S3 that is its own store by default)".into(),
            )
            .into());
        }
        // nor decompress
        None if manifest.raw(&best.artifact).is_some() => {
            return Err(StageError::Precondition(
                "the backup's snapshots are compressed (zstd) and etcd's download reads raw snapshots only: a decompressed copy must be staged in S3 (--stage-snapshot-to s3://BUCKET/PREFIX; for a backup in S3 that is its own store by default)".into(),
            )
            .into());
        }
        None => (ctx.store.url(), layout.artifact(&best.artifact), false),
    })
}

/// Whether the staged copy is decoded (decrypted, decompressed) from what is stored.
fn decoding(manifest: &Manifest) -> bool {
    manifest.best_snapshot().is_some_and(|best| manifest.plaintext(&best.artifact).is_some())
}

/// Presign the snapshot (again, on a resumed run) into `ctx.snapshot_url`.
pub async fn ensure_url(ctx: &mut RestoreContext, step: &Step<'_>) -> Result<(), StageFailure> {
    if ctx.snapshot_url.is_some() {
        return Ok(());
    }
    let manifest = manifest(ctx, step).await?;
    let (url, key, staged) = source_key(ctx, &manifest)?;
    let store = if staged { ctx.staging.as_deref() } else { Some(ctx.store.as_ref()) };
    let store = store.ok_or(StageError::Missing("the staging store"))?;
    let presigned = store.presign_get(&key, ctx.inputs.presign_ttl()).await?.ok_or_else(|| {
        StageError::Precondition(format!("the store {url} cannot presign URLs; use an S3 store (--stage-snapshot-to)"))
    })?;
    ctx.snapshot_url = Some(presigned);
    Ok(())
}

impl StageId for SnapshotUrl {
    const NAME: &'static str = "snapshot-url";
    type Output = UrlRecord;
}

#[async_trait]
impl Stage<RestoreContext> for SnapshotUrl {
    fn summary(&self) -> &'static str {
        "presign a GET URL of the best member snapshot (a local backup's snapshot is first copied to the staging S3 store)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RestoreContext, step: &Step<'_>) -> Vec<String> {
        let Some(manifest) = verified_manifest(step) else {
            // migrate: the backup is written by this very run
            return vec![format!(
                "presign a GET URL ({}s) of the best member snapshot of the backup this run writes{}",
                ctx.inputs.presign_ttl_seconds,
                if ctx.staging.is_some() { ", first copied to the staging S3 store" } else { "" }
            )];
        };
        match source_key(ctx, &manifest) {
            Ok((url, key, true)) if decoding(&manifest) => vec![
                format!(
                    "{} the snapshot into a temporary copy at {url}/{key} (deleted once etcd has restored it, or by --abort)",
                    match (manifest.encrypted(), manifest.compression.is_some()) {
                        (true, true) => "decrypt (--identity) and decompress",
                        (true, false) => "decrypt (--identity)",
                        _ => "decompress",
                    }
                ),
                format!("presign it for {}s", ctx.inputs.presign_ttl_seconds),
            ],
            Ok((url, key, true)) => vec![
                format!("copy the snapshot to {url}/{key} (deleted once etcd has restored it)"),
                format!("presign it for {}s", ctx.inputs.presign_ttl_seconds),
            ],
            Ok((url, key, false)) => vec![format!("presign {url}/{key} for {}s", ctx.inputs.presign_ttl_seconds)],
            Err(err) => vec![format!("(cannot plan: {err})")],
        }
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let manifest = manifest(ctx, step).await?;
        let (url, key, staged) = source_key(ctx, &manifest)?;
        let best = manifest.best_snapshot().ok_or(StageError::Missing("a member snapshot"))?;
        // the copy verify checked, when this run made one (not on a resumed
        // run): no second download and decoding
        let checked = match staged {
            true => ctx.checked_copy.take().filter(|copy| copy.member == best.member),
            false => None,
        };
        let record = UrlRecord {
            store: url.clone(),
            key: key.clone(),
            staged,
            from_checked_copy: checked.is_some(),
            expires: chrono::Utc::now() + chrono::Duration::seconds(ctx.inputs.presign_ttl_seconds as i64),
        };
        if staged {
            step.record(serde_json::to_value(&record)?)?;
            let source = ctx.inputs.layout().artifact(&best.artifact);
            let meter = crate::pipeline::Meter::new();
            step.show(&meter);
            // the manifest's digest of what the copy must hold: the raw
            // snapshot, for one decrypted or decompressed on the way
            let (body, want_size, want_sha) = match &checked {
                Some(copy) => {
                    let (size, sha256) = super::verify::wanted(&manifest, &best.artifact)?;
                    meter.expect(size);
                    let file = tokio::fs::File::open(&copy.path).await.map_err(|e| {
                        StageError::Precondition(format!("the checked copy of {source} at {}: {e}", copy.path.display()))
                    })?;
                    tracing::info!(member = %best.member, "staging the snapshot from the copy verify checked");
                    let body: crate::store::Body<'static> = Box::new(meter.reader(tokio::io::BufReader::with_capacity(4 << 20, file)));
                    (body, size, sha256)
                }
                None => {
                    meter.expect(best.size);
                    let body: crate::store::Body<'static> = Box::new(meter.reader(ctx.store.get(&source).await?));
                    super::verify::plaintext_of(ctx, &manifest, &best.artifact, &source, body).await?
                }
            };
            let staging = ctx.staging.as_ref().ok_or(StageError::Missing("the staging store"))?;
            let put = match staging.put(&key, body).await {
                Ok(put) => put,
                Err(err) => {
                    // a decoding that failed part-way leaves no partial copy
                    let _ = staging.delete(&key).await;
                    return Err(err.into());
                }
            };
            if put.sha256 != want_sha || put.size != want_size {
                staging.delete(&key).await?;
                return Err(StageError::Precondition(format!(
                    "the snapshot copied to {url}/{key} is {} bytes with SHA-256 {}, not the manifest's {} bytes with {}: {}; run the restore again",
                    put.size,
                    put.sha256,
                    want_size,
                    want_sha,
                    match checked {
                        Some(_) => "the copy verify checked changed under TMPDIR before it was staged",
                        None => "the backup changed while it was read",
                    }
                ))
                .into());
            }
            drop(checked);
        }
        ctx.snapshot_url = None;
        ensure_url(ctx, step).await?;
        if staged && manifest.encrypted() {
            tracing::warn!(store = %url, key = %key, ttl_seconds = ctx.inputs.presign_ttl_seconds,
                "a decrypted copy of the snapshot is staged for etcd's download; it is deleted once etcd has restored it (or by --abort)");
        }
        tracing::info!(store = %url, key = %key, staged, "snapshot URL presigned (not shown: it grants read access)");
        ctx.url_record = Some(record.clone());
        Ok(record)
    }
    fn restore(&self, ctx: &mut RestoreContext, output: Self::Output) -> Result<(), StageFailure> {
        ctx.url_record = Some(output);
        Ok(())
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut RestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = input.record::<UrlRecord>()? else { return Ok(()) };
        if let (true, Some(staging)) = (record.staged, &ctx.staging) {
            staging.delete(&record.key).await?;
        }
        Ok(())
    }
}
