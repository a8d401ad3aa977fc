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
    })
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
        let (mut decoded, raw) = HashingReader::new(decoded);
        tokio::io::copy(&mut decoded, sink).await.map_err(io)?;
        tokio::io::AsyncWriteExt::flush(sink).await.map_err(io)?;
        Some(raw)
    } else {
        let mut hashing = hashing;
        tokio::io::copy(&mut hashing, &mut tokio::io::sink()).await.map_err(io)?;
        None
    };
    let take = |hasher: std::sync::Arc<std::sync::Mutex<crate::store::Hasher>>| hasher.lock().map(|mut h| std::mem::take(&mut *h).finish()).map_err(|_| StreamError::Base("a hash was poisoned".into()));
    Ok(BaseRead { stored: take(stored)?, raw: raw.map(take).transpose()? })
}
