//! `fetch-snapshot`: copy the snapshot to a local scratch file, hash it and
//! verify it offline (etcd's trailing SHA-256 and the bbolt structure, the
//! code `hcp-dr snapshot verify` runs). A snapshot that fails is refused
//! before anything changes. When it is a member snapshot of an hcp-dr
//! backup, its size and SHA-256 must be the manifest's, and the backup must
//! be of this very HostedCluster (same uid): etcd's data is encrypted with
//! the cluster's own key, so another cluster's snapshot would be unreadable.
//! Read-only: it runs in a dry-run too.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::EtcdRestoreContext;
use crate::archive::Layout;
use crate::archive::check::read_manifest;
use crate::hosted::HOSTED_CLUSTER;
use crate::kube::{api, get_json};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;

pub struct FetchSnapshot;

/// The snapshot, verified (journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckedSnapshot {
    /// `<store>/<key>`.
    pub source: String,
    pub key: String,
    /// The backup and member it belongs to, when from a backup.
    pub backup_id: Option<String>,
    pub member: Option<String>,
    pub size: u64,
    pub sha256: String,
    /// What it holds, read offline.
    pub revision: i64,
    pub live_keys: u64,
    pub live_keys_by_prefix: BTreeMap<String, u64>,
    /// The stored snapshot is age-encrypted: `size` and `sha256` are the
    /// plaintext's, and the restore pods get a decrypted copy, never the key.
    #[serde(default)]
    pub decrypted: bool,
    /// The stored snapshot is zstd-compressed: `size` and `sha256` are the
    /// raw snapshot's, and the restore pods get a decompressed copy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub decompressed: bool,
}

impl CheckedSnapshot {
    /// Whether what is stored is not the raw snapshot (encrypted or compressed).
    pub fn decoded(&self) -> bool {
        self.decrypted || self.decompressed
    }
}

/// What the stored object must be, and for an encrypted or compressed one
/// what it decodes to.
struct Expected {
    size: u64,
    sha256: String,
    member: String,
    /// `(size, SHA-256)` of the decoded snapshot, and how to decode it.
    plain: Option<(u64, String, Decoding)>,
}

/// How a stored snapshot is decoded into the raw one.
#[derive(Debug, Clone, Default)]
struct Decoding {
    /// The recipients, when encrypted.
    recipients: Option<Vec<String>>,
    /// The raw size, when compressed.
    raw_size: Option<u64>,
}

/// The key to fetch and, for a backup, the size and SHA-256 it must have.
async fn locate(ctx: &mut EtcdRestoreContext) -> Result<(String, Option<Expected>), StageFailure> {
    let Some(backup) = ctx.inputs.snapshot.backup.clone() else {
        ctx.warn(format!(
            "{} is a bare snapshot, not an hcp-dr backup: nothing says which cluster it is of; make sure it is {}'s (its data is encrypted with that cluster's key)",
            ctx.inputs.snapshot.key,
            ctx.hc_label()
        ));
        return Ok((ctx.inputs.snapshot.key.clone(), None));
    };
    let layout = Layout::new(&backup.namespace, &backup.hosted_cluster, &backup.backup_id);
    let manifest = read_manifest(ctx.snapshot_store(), &layout).await?;
    if let Some(encryption) = &manifest.encryption {
        let what = format!("backup {}", layout.dir());
        match &ctx.identities {
            Some(identities) => identities.check(&what, &encryption.recipients)?,
            None => {
                return Err(crate::archive::encryption::EncryptionError::IdentityNeeded {
                    what,
                    recipients: encryption.recipients.clone(),
                }
                .into());
            }
        }
    }
    let (ns, name) = (&ctx.cluster.inputs.namespace, &ctx.cluster.inputs.hosted_cluster);
    if manifest.cluster.namespace != *ns || manifest.cluster.name != *name {
        return Err(StageError::Precondition(format!(
            "backup {} is of HostedCluster {}/{}, not {}: etcd restore puts a cluster's own snapshot back; to bring another cluster's backup up, use hcp-dr restore or hcp-dr drill",
            layout.dir(),
            manifest.cluster.namespace,
            manifest.cluster.name,
            ctx.hc_label()
        ))
        .into());
    }
    let live = get_json(&api(&ctx.cluster.client, &HOSTED_CLUSTER, ns), name, &ctx.hc_label()).await?;
    let live_uid = live.as_ref().and_then(|hc| hc["metadata"]["uid"].as_str()).unwrap_or_default();
    // Same lineage: this cluster, or one restored or migrated from the same
    // original (same etcd data and encryption key, under another UID).
    let live_root = live.as_ref().and_then(crate::archive::lineage_of).unwrap_or_default();
    if !manifest.cluster.uid.is_empty() && live_uid != manifest.cluster.uid && live_root != manifest.cluster.lineage_root() {
        return Err(StageError::Precondition(format!(
            "backup {} is of another {} (uid {}, lineage {}); the live one has uid {live_uid} and lineage {live_root}: it was created anew since, with its own etcd encryption key, so this snapshot's secrets would not decrypt; take a fresh backup of the live cluster, or rebuild the cluster from this backup with hcp-dr restore",
            layout.dir(),
            ctx.hc_label(),
            manifest.cluster.uid,
            manifest.cluster.lineage_root()
        ))
        .into());
    }
    let best = manifest
        .best_snapshot()
        .ok_or_else(|| StageError::Precondition(format!("backup {} has no etcd snapshot", layout.dir())))?
        .clone();
    // Manifest::check made sure an encrypted or compressed snapshot has its digest
    let plain = manifest.plaintext(&best.artifact).map(|plain| {
        let decoding = Decoding {
            recipients: manifest.encryption.as_ref().map(|e| e.recipients.clone()),
            raw_size: manifest.raw(&best.artifact).map(|raw| raw.size),
        };
        (plain.size, plain.sha256.clone(), decoding)
    });
    Ok((
        layout.artifact(&best.artifact),
        Some(Expected { size: best.size, sha256: best.sha256, member: best.member, plain }),
    ))
}

/// Decode the stored snapshot at `stored` (decrypt the age file, then
/// decompress the zstd stream, as `decoding` says) into a new scratch file
/// (0600, removed on drop), hashing the raw snapshot: `(path, size, SHA-256)`.
async fn decode(ctx: &EtcdRestoreContext, stored: &std::path::Path, what: &str, decoding: &Decoding) -> Result<(tempfile::TempPath, u64, String), StageFailure> {
    let file = tokio::fs::File::open(stored)
        .await
        .map_err(|e| StageError::Precondition(format!("reading {}: {e}", stored.display())))?;
    if decoding.recipients.is_some() && ctx.identities.is_none() {
        return Err(StageError::Missing("the identities (--identity)").into());
    }
    let mut body = crate::archive::compression::decode(Box::new(file), what, decoding.recipients.as_deref(), ctx.identities.as_ref(), decoding.raw_size).await?;
    copy_hashing(&mut body, what).await
}

/// Copy `key` into a scratch file, hashing on the way.
async fn download(ctx: &EtcdRestoreContext, key: &str, meter: &crate::pipeline::Meter) -> Result<(tempfile::TempPath, u64, String), StageFailure> {
    let url = format!("{}/{key}", ctx.snapshot_store().url().trim_end_matches('/'));
    let mut body = meter.reader(ctx.snapshot_store().get(key).await?);
    copy_hashing(&mut body, &url).await
}

/// Refuse before copying when `TMPDIR` has less than `needed` free.
fn scratch_room(needed: u64, what: &str) -> Result<(), StageFailure> {
    crate::etcd::verify::ensure_scratch_room(needed, what)
        .map_err(|err| StageError::Precondition(format!("{err}; nothing was changed")).into())
}

/// Copy `body` into a private scratch file (under `TMPDIR`), hashing it.
async fn copy_hashing(body: &mut (impl tokio::io::AsyncRead + Unpin), what: &str) -> Result<(tempfile::TempPath, u64, String), StageFailure> {
    let scratch = tempfile::Builder::new()
        .prefix("hcp-dr-etcd-restore-")
        .suffix(".db")
        .tempfile()
        .map_err(|e| StageError::Precondition(format!("creating a scratch file for {what} (set TMPDIR to a directory with room for the snapshot): {e}")))?;
    let (file, path) = scratch.into_parts();
    let mut file = tokio::fs::File::from_std(file);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = body
            .read(&mut buf)
            .await
            .map_err(|e| StageError::Precondition(format!("reading {what}: {e}")))?;
        if n == 0 {
            break;
        }
        let written = size;
        let failed = |e: std::io::Error| match crate::space::scratch_filled_up(&e, &path, what, written) {
            Some(full) => StageError::Precondition(format!("{full}; nothing was changed")),
            None => StageError::Precondition(format!("writing {}: {e}", path.display())),
        };
        file.write_all(&buf[..n]).await.map_err(failed)?;
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    file.flush()
        .await
        .map_err(|e| StageError::Precondition(format!("writing {}: {e}", path.display())))?;
    Ok((path, size, crate::store::hex(&hasher.finalize())))
}

/// The snapshot's plaintext in a local scratch file, fetched (and decrypted)
/// again: for a resumed run that must stage it.
pub(super) async fn local_plaintext(ctx: &EtcdRestoreContext, snapshot: &CheckedSnapshot) -> Result<tempfile::TempPath, StageFailure> {
    let decoding = Decoding {
        recipients: snapshot.decrypted.then(Vec::new),
        raw_size: snapshot.decompressed.then_some(snapshot.size),
    };
    let decoded = snapshot.decrypted || snapshot.decompressed;
    scratch_room(if decoded { 2 * snapshot.size } else { snapshot.size }, &snapshot.source)?;
    let (path, size, sha256) = download(ctx, &snapshot.key, &crate::pipeline::Meter::new()).await?;
    let (path, size, sha256) = if decoded {
        decode(ctx, &path, &snapshot.source, &decoding).await?
    } else {
        (path, size, sha256)
    };
    if size != snapshot.size || sha256 != snapshot.sha256 {
        return Err(StageError::Precondition(format!(
            "{} changed since it was verified ({size} bytes, SHA-256 {sha256}; verified {} bytes, {}): run the restore again",
            snapshot.source, snapshot.size, snapshot.sha256
        ))
        .into());
    }
    Ok(path)
}

impl StageId for FetchSnapshot {
    const NAME: &'static str = "fetch-snapshot";
    type Output = CheckedSnapshot;
}

#[async_trait]
impl Stage<EtcdRestoreContext> for FetchSnapshot {
    fn summary(&self) -> &'static str {
        "copy the snapshot locally and verify it offline (hash, structure, the backup's manifest and cluster); refuse one that fails"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, _ctx: &EtcdRestoreContext, _step: &Step<'_>) -> Vec<String> {
        Vec::new()
    }
    async fn run(&self, ctx: &mut EtcdRestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let (key, expected) = locate(ctx).await?;
        let meter = crate::pipeline::Meter::new();
        if let Some(expected) = &expected {
            meter.expect(expected.size);
        }
        step.show(&meter);
        let source = format!("{}/{key}", ctx.snapshot_store().url().trim_end_matches('/'));
        if let Some(expected) = &expected {
            // the stored object, and for an encrypted or compressed one what it decodes to beside it
            let needed = expected.size + expected.plain.as_ref().map_or(0, |p| p.0);
            scratch_room(needed, &source)?;
        }
        let (path, size, sha256) = download(ctx, &key, &meter).await?;
        if let Some(Expected { size: want_size, sha256: want_sha, .. }) = &expected
            && (size != *want_size || sha256 != *want_sha)
        {
            return Err(StageError::Precondition(format!(
                "{source} is {size} bytes with SHA-256 {sha256}, but the backup's manifest says {want_size} bytes with {want_sha}: the snapshot was damaged or replaced; nothing was changed (check the backup: hcp-dr backups verify)"
            ))
            .into());
        }
        // An encrypted or compressed snapshot: decode it and check the raw one too.
        let (path, size, sha256, decoding) = match expected.as_ref().and_then(|e| e.plain.clone()) {
            None => (path, size, sha256, Decoding::default()),
            Some((want_size, want_sha, decoding)) => {
                let (plain, size, sha256) = decode(ctx, &path, &source, &decoding).await?;
                if size != want_size || sha256 != want_sha {
                    return Err(StageError::Precondition(format!(
                        "{source} decodes to {size} bytes with SHA-256 {sha256}, but the manifest says {want_size} bytes with {want_sha}: the backup was damaged or tampered with; nothing was changed"
                    ))
                    .into());
                }
                (plain, size, sha256, decoding)
            }
        };
        let file = path.to_path_buf();
        let report = tokio::task::spawn_blocking(move || crate::etcd::verify::verify_file(&file))
            .await
            .map_err(|e| StageError::Precondition(format!("verifying {source}: {e}")))??;
        let summary = match (&report.verdict, report.summary) {
            (verdict, Some(summary)) if verdict.is_ok() => summary,
            (verdict, _) => {
                return Err(StageError::Precondition(format!(
                    "{source} fails verification: {verdict}; nothing was changed (hcp-dr snapshot verify shows the details)"
                ))
                .into());
            }
        };
        let checked = CheckedSnapshot {
            source,
            key,
            backup_id: ctx.inputs.snapshot.backup.as_ref().map(|b| b.backup_id.clone()),
            member: expected.map(|e| e.member),
            size,
            sha256,
            revision: summary.store_revision(),
            live_keys: summary.live_keys,
            live_keys_by_prefix: summary.live_keys_by_prefix,
            decrypted: decoding.recipients.is_some(),
            decompressed: decoding.raw_size.is_some(),
        };
        tracing::info!(source = %checked.source, revision = checked.revision, keys = checked.live_keys, "snapshot verified");
        ctx.local_copy = Some(path);
        Ok(checked)
    }
}
