//! `snapshot-url`: the one URL every etcd member of the restored cluster
//! downloads the snapshot from (`restoreSnapshotURL`). For a backup in S3,
//! a presigned GET of the best member snapshot. For a local backup, the
//! snapshot is first copied to the `--stage-snapshot-to` S3 store (checked
//! against the manifest on the way) and that copy is presigned; `wait`
//! deletes the copy once etcd has restored it, and `--abort` does too.
//!
//! The URL is never journaled or printed: it grants read access to the
//! snapshot until it expires. A resumed run presigns again.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RestoreContext;
use super::verify::ensure_loaded;
use crate::archive::Layout;
use crate::pipeline::{Stage, StageFailure, Step, UndoInput};
use crate::stages::{StageError, undo_record};

pub struct SnapshotUrl;

/// Where the URL points (journaled; no signature).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UrlRecord {
    /// The store and key presigned.
    pub store: String,
    pub key: String,
    /// Set when the key is a temporary copy in the staging store.
    pub staged: bool,
    pub expires: chrono::DateTime<chrono::Utc>,
}

/// The staging key of a backup's snapshot copy.
pub fn staged_key(layout: &Layout, member: &str) -> String {
    format!("hcp-dr-staging/{}/{}", layout.dir(), Layout::snapshot_name(member))
}

/// The key to presign and whether it is staged.
fn source_key(ctx: &RestoreContext) -> Result<(String, String, bool), StageFailure> {
    let manifest = ctx.manifest.as_ref().ok_or(StageError::Missing("the manifest (verify)"))?;
    let best = manifest.best_snapshot().ok_or(StageError::Missing("a member snapshot"))?;
    let layout = ctx.inputs.layout();
    Ok(match &ctx.staging {
        Some(staging) => (staging.url(), staged_key(&layout, &best.member), true),
        None => (ctx.store.url(), layout.artifact(&best.artifact), false),
    })
}

/// Presign the snapshot (again, on a resumed run) into `ctx.snapshot_url`.
pub async fn ensure_url(ctx: &mut RestoreContext) -> Result<(), StageFailure> {
    if ctx.snapshot_url.is_some() {
        return Ok(());
    }
    ensure_loaded(ctx).await?;
    let (url, key, staged) = source_key(ctx)?;
    let store = if staged { ctx.staging.as_deref() } else { Some(ctx.store.as_ref()) };
    let store = store.ok_or(StageError::Missing("the staging store"))?;
    let presigned = store.presign_get(&key, ctx.inputs.presign_ttl()).await?.ok_or_else(|| {
        StageError::Precondition(format!("the store {url} cannot presign URLs; use an S3 store (--stage-snapshot-to)"))
    })?;
    ctx.snapshot_url = Some(presigned);
    Ok(())
}

#[async_trait]
impl Stage<RestoreContext> for SnapshotUrl {
    fn name(&self) -> &'static str {
        "snapshot-url"
    }
    fn summary(&self) -> &'static str {
        "presign a GET URL of the best member snapshot (a local backup's snapshot is first copied to the staging S3 store)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RestoreContext, _params: &Value) -> Vec<String> {
        match source_key(ctx) {
            Ok((url, key, true)) => vec![
                format!("copy the snapshot to {url}/{key} (deleted once etcd has restored it)"),
                format!("presign it for {}s", ctx.inputs.presign_ttl_seconds),
            ],
            Ok((url, key, false)) => vec![format!("presign {url}/{key} for {}s", ctx.inputs.presign_ttl_seconds)],
            Err(err) => vec![format!("(cannot plan: {err})")],
        }
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Value, StageFailure> {
        ensure_loaded(ctx).await?;
        let (url, key, staged) = source_key(ctx)?;
        let record = UrlRecord {
            store: url.clone(),
            key: key.clone(),
            staged,
            expires: chrono::Utc::now() + chrono::Duration::seconds(ctx.inputs.presign_ttl_seconds as i64),
        };
        if staged {
            let manifest = ctx.manifest.as_ref().ok_or(StageError::Missing("the manifest"))?;
            let best = manifest.best_snapshot().ok_or(StageError::Missing("a member snapshot"))?.clone();
            step.record(serde_json::to_value(&record)?)?;
            let body = ctx.store.get(&ctx.inputs.layout().artifact(&best.artifact)).await?;
            let staging = ctx.staging.as_ref().ok_or(StageError::Missing("the staging store"))?;
            let put = staging.put(&key, body).await?;
            if put.sha256 != best.sha256 || put.size != best.size {
                staging.delete(&key).await?;
                return Err(StageError::Precondition(format!(
                    "the snapshot copied to {url}/{key} is {} bytes with SHA-256 {}, not the manifest's {} bytes with {}: the backup changed while it was read; run the restore again",
                    put.size, put.sha256, best.size, best.sha256
                ))
                .into());
            }
        }
        ctx.snapshot_url = None;
        ensure_url(ctx).await?;
        tracing::info!(store = %url, key = %key, staged, "snapshot URL presigned (not shown: it grants read access)");
        ctx.url_record = Some(record.clone());
        Ok(serde_json::to_value(record)?)
    }
    fn restore(&self, ctx: &mut RestoreContext, output: &Value) -> Result<(), StageFailure> {
        ctx.url_record = Some(crate::stages::from_output("snapshot-url", output)?);
        Ok(())
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut RestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let Some(record) = undo_record::<UrlRecord>("snapshot-url", &input)? else { return Ok(()) };
        if let (true, Some(staging)) = (record.staged, &ctx.staging) {
            staging.delete(&record.key).await?;
        }
        Ok(())
    }
}
