//! A chain's base: a snapshot of one member taken while everything runs
//! (etcd serves it from one read transaction, so nothing is paused or
//! scaled). Because writes go on, the revision it holds is read from the
//! snapshot itself: it is streamed (etcd's trailing hash checked) into a
//! private scratch file, checked page by page with the offline verifier,
//! which gives its revision, and then stored zstd-compressed (and
//! age-encrypted with `--encrypt-to`) as backups store their snapshots.

use std::sync::Arc;

use chrono::Utc;

use super::StreamError;
use super::format::{Base, BaseKind, ChainLayout};
use super::source::MemberSource;
use crate::archive::compression::CompressingStore;
use crate::archive::encryption::Recipients;
use crate::archive::sealed::SealingStore;
use crate::store::{LocalStore, Store};

/// The scratch file's name in its private folder.
const SCRATCH: &str = "base.db";

/// Take a base for the chain at `layout` from a member `source` offers and
/// store it there; what the descriptor records of it.
pub async fn take(source: &dyn MemberSource, store: Arc<dyn Store>, layout: &ChainLayout, level: i32, recipients: Option<&Recipients>) -> Result<Base, StreamError> {
    let reached = source.reach(&[]).await.map_err(StreamError::Members)?;
    let member = &reached.member;
    let taken = Utc::now();
    let started = member.open_snapshot().await?;
    crate::space::ensure_scratch(started.size(), &format!("etcd member {}'s snapshot", member.name)).map_err(|e| StreamError::Base(e.to_string()))?;
    let scratch = tempfile::Builder::new()
        .prefix("hcp-dr-stream-base-")
        .tempdir()
        .map_err(|source| StreamError::Io { what: "a scratch folder for the base (TMPDIR)".into(), source })?;
    let raw = started.finish(&LocalStore::new(scratch.path()), SCRATCH, &crate::meter::Meter::new()).await?;
    let path = scratch.path().join(SCRATCH);
    let report = crate::etcd::verify::verify_copy(&path).await.map_err(|e| StreamError::Base(e.to_string()))?;
    let revision = match (&report.verdict, &report.summary) {
        // an etcd nothing was ever written to is at revision 1 with no key
        (verdict, Some(summary)) if verdict.is_ok() => summary.store_revision().max(1),
        (verdict, _) => return Err(StreamError::Base(format!("the snapshot of {} does not verify: {verdict}", member.name))),
    };
    let artifact = ChainLayout::base_name(&member.name);
    let key = layout.artifact(&artifact);
    let under: Arc<dyn Store> = match recipients {
        Some(recipients) => Arc::new(SealingStore::new(store.clone(), recipients.clone())),
        None => store.clone(),
    };
    let compressing = CompressingStore::new(under, level);
    let file = tokio::fs::File::open(&path).await.map_err(|source| StreamError::Io { what: path.display().to_string(), source })?;
    let stored = compressing.put(&key, Box::new(file)).await.map_err(super::store_error(format!("storing the base {key}")))?;
    let decoded = compressing.raw(&key);
    if decoded.as_ref().map(|d| (d.size, d.sha256.as_str())) != Some((raw.size, raw.sha256.as_str())) {
        let _ = store.delete(&key).await;
        return Err(StreamError::Base(format!("the snapshot changed between its check and its upload ({key}): local disk trouble? nothing was kept")));
    }
    Ok(Base {
        how: BaseKind::Snapshot,
        member: member.name.clone(),
        revision,
        taken,
        artifact,
        size: stored.size,
        sha256: stored.sha256,
        raw: crate::store::PutReport { size: raw.size, sha256: raw.sha256 },
        backup_id: None,
    })
}

/// A base from the cluster's newest complete regular backup, when it can
/// serve (`--base-from-backup`); `Ok(None)` with the reason when it cannot,
/// and a snapshot is taken instead. It serves when it was taken within
/// `max_age`, its snapshots are compressed (format version 3) and encrypted
/// to exactly the chain's recipients (or neither: the bytes are copied as
/// they are stored, never decrypted), and etcd still holds the history
/// after its revision (the watch starts right after it). Its best snapshot
/// is copied into the chain's folder, checked against the manifest's size
/// and SHA-256: etcd is not asked for a snapshot at all.
pub async fn from_backup(
    source: &dyn MemberSource,
    store: Arc<dyn Store>,
    layout: &ChainLayout,
    recipients: Option<&Recipients>,
    max_age: std::time::Duration,
) -> Result<Result<Base, String>, StreamError> {
    use crate::archive::Layout;
    let (namespace, hosted_cluster) = (&layout.namespace, &layout.hosted_cluster);
    let found = crate::archive::check::newest_regular(store.as_ref(), namespace, hosted_cluster, |_, manifest| manifest.is_some())
        .await
        .map_err(super::store_error(format!("listing the backups of {namespace}/{hosted_cluster}")))?;
    let newest = found.and_then(|(id, manifest)| Some((Layout::new(namespace, hosted_cluster, &id), manifest?)));
    let Some((backup, manifest)) = newest else { return Ok(Err("no complete regular backup in the store".into())) };
    let id = &manifest.backup_id;
    let Some(taken) = manifest.timings.started else { return Ok(Err(format!("backup {id} does not record when it was taken"))) };
    if Utc::now() - taken > chrono::Duration::from_std(max_age).unwrap_or(chrono::TimeDelta::MAX) {
        return Ok(Err(format!("the newest backup, {id}, is older than --base-interval")));
    }
    let Some(best) = manifest.best_snapshot() else { return Ok(Err(format!("backup {id} lists no snapshot"))) };
    let Some(raw) = manifest.raw(&best.artifact) else { return Ok(Err(format!("backup {id} is not compressed (a chain's base is zstd)"))) };
    let mut theirs: Vec<String> = manifest.recipients().to_vec();
    let mut ours: Vec<String> = recipients.map(Recipients::names).unwrap_or_default();
    theirs.sort();
    ours.sort();
    if theirs != ours {
        return Ok(Err(format!("backup {id} is encrypted to other recipients than the stream (its bytes are copied, never decrypted)")));
    }
    // etcd must still hold what came after it: a read at its revision
    // fails once etcd has compacted past it
    let reached = source.reach(&[]).await.map_err(StreamError::Members)?;
    let mut client = reached.member.connect().await?;
    let options = etcd_client::GetOptions::new().with_revision(best.revision).with_limit(1).with_keys_only();
    if let Err(err) = client.get("/", Some(options)).await {
        return Ok(Err(format!("etcd no longer holds the history after backup {id}'s revision {} ({err})", best.revision)));
    }
    let artifact = ChainLayout::base_name(&best.member);
    let key = layout.artifact(&artifact);
    let body = store.get(&backup.artifact(&best.artifact)).await.map_err(super::store_error(format!("reading backup {id}'s snapshot")))?;
    let stored = store.put(&key, body).await.map_err(super::store_error(format!("storing the base {key}")))?;
    if (stored.size, stored.sha256.as_str()) != (best.size, best.sha256.as_str()) {
        let _ = store.delete(&key).await;
        return Err(StreamError::Base(format!("backup {id}'s snapshot {} does not match its manifest: `hcp-dr backups verify` shows what is damaged; nothing was kept", best.artifact)));
    }
    Ok(Ok(Base {
        how: BaseKind::Backup,
        member: best.member.clone(),
        revision: best.revision,
        taken,
        artifact,
        size: stored.size,
        sha256: stored.sha256,
        raw: crate::store::PutReport { size: raw.size, sha256: raw.sha256.clone() },
        backup_id: Some(id.clone()),
    }))
}

/// What reading a chain's base found: the stored bytes' digest, and the
/// decoded snapshot's when it could be decoded (an encrypted base needs
/// the identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseRead {
    pub stored: crate::store::PutReport,
    pub raw: Option<crate::store::PutReport>,
}

impl BaseRead {
    /// What does not match the descriptor, if anything.
    pub fn mismatch(&self, base: &Base, key: &str) -> Option<String> {
        if (self.stored.size, self.stored.sha256.as_str()) != (base.size, base.sha256.as_str()) {
            return Some(format!(
                "base {key}: {} bytes with SHA-256 {} stored, the descriptor records {} bytes with SHA-256 {}: damaged or altered after it was written",
                self.stored.size, self.stored.sha256, base.size, base.sha256
            ));
        }
        match &self.raw {
            Some(raw) if (raw.size, raw.sha256.as_str()) != (base.raw.size, base.raw.sha256.as_str()) => Some(format!(
                "base {key}: decodes to {} bytes with SHA-256 {}, the descriptor records {} bytes with SHA-256 {}",
                raw.size, raw.sha256, base.raw.size, base.raw.sha256
            )),
            _ => None,
        }
    }
}

/// The buffers of [`read`]'s copy.
const COPY_BUFFER: usize = 4 << 20;

/// Read the base of the chain `descriptor` describes, hashing what is
/// stored and, when it can be decoded (not encrypted, or `identities`
/// given), decoding it into `sink` (a scratch file, or nowhere) while
/// hashing the snapshot. Decompression is bounded by the raw size the
/// descriptor records.
pub async fn read(
    store: &dyn Store,
    layout: &ChainLayout,
    descriptor: &super::format::ChainDescriptor,
    identities: Option<&crate::archive::encryption::Identities>,
    sink: &mut (dyn tokio::io::AsyncWrite + Unpin + Send),
) -> Result<BaseRead, StreamError> {
    use crate::archive::encryption::HashingReader;
    let key = layout.artifact(&descriptor.base.artifact);
    let what = format!("{}{key}", super::catalog::url_slash(store));
    let body = store.get(&key).await.map_err(super::store_error(format!("reading the base {what}")))?;
    let (hashing, stored) = HashingReader::new(body);
    let io = |source| StreamError::Io { what: what.clone(), source };
    let decodable = !descriptor.encrypted() || identities.is_some();
    let raw = if decodable {
        let recipients = descriptor.encrypted().then_some(descriptor.coding.recipients.as_slice());
        let decoded = crate::archive::compression::decode(Box::new(hashing), &what, recipients, identities, Some(descriptor.base.raw.size)).await?;
        let (decoded, raw) = HashingReader::new(decoded);
        // large buffers both ways: a file sink writes through tokio's
        // blocking pool, one hop per write (8 KiB writes made reading a
        // 1 GiB base take 2.7 times `zstd -d`)
        let mut decoded = tokio::io::BufReader::with_capacity(COPY_BUFFER, decoded);
        let mut sink = tokio::io::BufWriter::with_capacity(COPY_BUFFER, sink);
        tokio::io::copy_buf(&mut decoded, &mut sink).await.map_err(io)?;
        tokio::io::AsyncWriteExt::flush(&mut sink).await.map_err(io)?;
        Some(raw)
    } else {
        let mut hashing = hashing;
        tokio::io::copy(&mut hashing, &mut tokio::io::sink()).await.map_err(io)?;
        None
    };
    let take = |hasher: std::sync::Arc<std::sync::Mutex<crate::store::Hasher>>| hasher.lock().map(|mut h| std::mem::take(&mut *h).finish()).map_err(|_| StreamError::Base("a hash was poisoned".into()));
    Ok(BaseRead { stored: take(stored)?, raw: raw.map(take).transpose()? })
}
