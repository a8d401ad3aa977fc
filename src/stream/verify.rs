//! Checking a chain: its base against the descriptor, every segment's
//! stored bytes against the SHA-256 in its name, each segment's content
//! (its zstd frame checksum, its header, its records) when it can be
//! decoded, and that the revisions run from the base without a gap. The
//! verdict names the first segment that is missing, damaged or altered,
//! and the revision the chain restores up to.

use serde::Serialize;

use super::catalog::{ChainListing, span, url_slash};
use super::format::{ChainDescriptor, Segment, SegmentName};
use super::{StreamError, base, codec};
use crate::archive::encryption::Identities;
use crate::store::{Hasher, Store};

/// What a chain check found.
#[derive(Debug, Clone, Serialize)]
pub struct ChainVerdict {
    pub chain_id: String,
    pub base_revision: Option<i64>,
    /// Every revision from the base through this one restores (`None`:
    /// not even the base does).
    pub good_through: Option<i64>,
    /// The last revision the segments' names reach.
    pub last_revision: Option<i64>,
    pub segments: usize,
    /// Whether the segments' content was decoded and checked, not only
    /// their hashes (an encrypted chain needs --identity for that).
    pub content_checked: bool,
    /// The first problem in revision order, naming the object.
    pub first_problem: Option<String>,
    pub problems: Vec<String>,
    pub ok: bool,
}

/// Check `chain` in `store` (`identities` decrypt an encrypted one).
pub async fn verify_chain(store: &dyn Store, chain: &ChainListing, identities: Option<&Identities>) -> Result<ChainVerdict, StreamError> {
    let mut verdict = ChainVerdict {
        chain_id: chain.layout.chain_id.clone(),
        base_revision: None,
        good_through: None,
        last_revision: chain.last_segment().map(|s| s.last),
        segments: chain.segments.len(),
        content_checked: false,
        first_problem: None,
        problems: Vec::new(),
        ok: false,
    };
    let descriptor = match &chain.descriptor {
        Ok(descriptor) => descriptor,
        Err(err) => {
            verdict.first_problem = Some(format!("descriptor {}: {err}", chain.layout.descriptor()));
            verdict.problems.push(format!("descriptor {}: {err}", chain.layout.descriptor()));
            return Ok(verdict);
        }
    };
    verdict.base_revision = Some(descriptor.base.revision);
    verdict.content_checked = !descriptor.encrypted() || identities.is_some();
    let base_key = chain.layout.artifact(&descriptor.base.artifact);
    let base_problem = match base::read(store, &chain.layout, descriptor, identities, &mut tokio::io::sink()).await {
        Ok(read) => read.mismatch(&descriptor.base, &base_key),
        Err(StreamError::Store { source, .. }) if matches!(*source, crate::store::StoreError::NotFound { .. }) => Some(format!("base {base_key}: missing")),
        Err(err @ StreamError::Encryption(_)) => return Err(err),
        Err(err) => Some(format!("base {base_key}: {err}")),
    };
    let mut bad: Vec<(i64, String)> = Vec::new();
    for name in &chain.segments {
        if let Some(problem) = check_segment(store, chain, descriptor, name, identities).await? {
            bad.push((name.first, problem));
        }
    }
    let run = span(descriptor.base.revision, &chain.segments);
    // the good run: from the base, through the segments in order, up to
    // the first one missing or bad
    let mut good_through = base_problem.is_none().then_some(descriptor.base.revision);
    if good_through.is_some() {
        for name in chain.segments.iter().take(run.segments) {
            if bad.iter().any(|(first, _)| *first == name.first) {
                break;
            }
            good_through = Some(name.last);
        }
    }
    verdict.good_through = good_through;
    let mut ordered: Vec<(i64, String)> = Vec::new();
    if let Some(problem) = base_problem {
        ordered.push((descriptor.base.revision, problem));
    }
    if let Some(problem) = run.problem {
        ordered.push((run.through + 1, problem));
    }
    ordered.extend(bad);
    ordered.extend(chain.strays.iter().map(|key| (i64::MAX, format!("{key}: not a segment name; remove it or move it out of the chain"))));
    ordered.sort_by_key(|(at, _)| *at);
    verdict.first_problem = ordered.first().map(|(_, p)| p.clone());
    verdict.problems = ordered.into_iter().map(|(_, p)| p).collect();
    verdict.ok = verdict.problems.is_empty();
    Ok(verdict)
}

/// What is wrong with one segment, if anything. A missing identity is an
/// error (the caller asked for a check it cannot do).
async fn check_segment(store: &dyn Store, chain: &ChainListing, descriptor: &ChainDescriptor, name: &SegmentName, identities: Option<&Identities>) -> Result<Option<String>, StreamError> {
    let key = chain.layout.segment(name);
    let stored = match crate::store::get_bytes(store, &key).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(Some(format!("segment {key}: listed but gone"))),
        Err(err) => return Err(super::store_error(format!("reading {}{key}", url_slash(store)))(err)),
    };
    match read_segment(&stored, chain, descriptor, name, identities).await {
        Ok(_) => Ok(None),
        Err(err @ StreamError::Encryption(_)) => Err(err),
        // the error names the segment's key
        Err(err) => Ok(Some(format!("segment {err}"))),
    }
}

/// The content of a segment whose stored bytes are `stored`, checked
/// against its name and chain: its hash, and when it can be decoded, its
/// frame, header and records (`None` when it cannot be decoded).
pub async fn read_segment(stored: &[u8], chain: &ChainListing, descriptor: &ChainDescriptor, name: &SegmentName, identities: Option<&Identities>) -> Result<Option<Segment>, StreamError> {
    let key = chain.layout.segment(name);
    let mut hasher = Hasher::default();
    hasher.update(stored);
    let digest = hasher.finish();
    if digest.sha256 != name.sha256 {
        return Err(StreamError::Format(super::FormatError {
            what: key,
            reason: format!("its SHA-256 is {}, its name says {}: damaged or altered after it was written", digest.sha256, name.sha256),
        }));
    }
    if descriptor.encrypted() && identities.is_none() {
        return Ok(None);
    }
    let raw = codec::open(stored, &descriptor.coding, identities, &key).await?;
    let segment = Segment::parse(&raw, &key)?;
    let header = &segment.header;
    let mismatch = if header.chain_id != descriptor.chain_id {
        Some(format!("it belongs to chain {}, not {}", header.chain_id, descriptor.chain_id))
    } else if (header.first_revision, header.last_revision) != (name.first, name.last) {
        Some(format!("it holds revisions {}..{}, its name says {}", header.first_revision, header.last_revision, name.span()))
    } else {
        None
    };
    match mismatch {
        Some(reason) => Err(StreamError::Format(super::FormatError { what: key, reason })),
        None => Ok(Some(segment)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::catalog::chains;
    use crate::stream::format::*;
    use crate::stream::writer::{ChainWriter, Cut};
    use std::sync::Arc;

    async fn chain_with_segments(dir: &std::path::Path) -> (Arc<dyn Store>, ChainLayout) {
        let store: Arc<dyn Store> = Arc::new(crate::store::LocalStore::new(dir));
        let layout = ChainLayout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        let base = b"not really a snapshot".to_vec();
        let stored = store.put(&layout.artifact("base/etcd-0.db"), {
            let (stored, _) = codec::seal(&base, 1, None, "base").await.unwrap();
            Box::new(std::io::Cursor::new(stored))
        })
        .await
        .unwrap();
        let mut raw = Hasher::default();
        raw.update(&base);
        let descriptor = for_test(&layout, 10, stored, raw.finish());
        store.put(&layout.descriptor(), Box::new(std::io::Cursor::new(serde_json::to_vec(&descriptor).unwrap()))).await.unwrap();
        let mut writer = ChainWriter::new(store.clone(), layout.clone(), 1, None, Cut { interval: std::time::Duration::from_secs(1), size: 1 << 20 }, 10);
        for revision in 11..=16 {
            let event = Event::Put { key: Bytes(b"/k".to_vec()), value: Bytes(vec![revision as u8]), create_revision: 11, mod_revision: revision, version: revision - 10, lease: 0 };
            writer.push(&RevisionRecord { revision, received: chrono::Utc::now(), events: vec![event], leases: Vec::new() }).unwrap();
            if revision % 2 == 0 {
                writer.flush().await.unwrap();
            }
        }
        (store, layout)
    }

    async fn verdict(store: &dyn Store) -> ChainVerdict {
        let (listed, _) = chains(store, "clusters", "demo").await.unwrap();
        verify_chain(store, &listed[0], None).await.unwrap()
    }

    #[tokio::test]
    async fn a_whole_chain_verifies_and_a_tampered_segment_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = chain_with_segments(dir.path()).await;
        let good = verdict(store.as_ref()).await;
        assert!(good.ok && good.content_checked, "{good:?}");
        assert_eq!((good.base_revision, good.good_through, good.segments), (Some(10), Some(16), 3));

        let (listed, _) = chains(store.as_ref(), "clusters", "demo").await.unwrap();
        let middle = layout.segment(&listed[0].segments[1]);
        let path = dir.path().join(&middle);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let bad = verdict(store.as_ref()).await;
        assert!(!bad.ok);
        assert_eq!(bad.good_through, Some(12), "{bad:?}");
        let first = bad.first_problem.unwrap();
        assert!(first.contains(&middle) && first.contains("damaged or altered"), "{first}");

        std::fs::remove_file(&path).unwrap();
        let gap = verdict(store.as_ref()).await;
        assert_eq!(gap.good_through, Some(12));
        assert!(gap.first_problem.unwrap().contains("revisions 13..14 are missing"), "{:?}", gap.problems);
    }

    #[tokio::test]
    async fn a_damaged_base_is_named_and_restores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = chain_with_segments(dir.path()).await;
        std::fs::write(dir.path().join(layout.artifact("base/etcd-0.db")), b"other").unwrap();
        let bad = verdict(store.as_ref()).await;
        assert_eq!(bad.good_through, None);
        assert!(bad.first_problem.unwrap().contains("base clusters/demo/stream/20261121T180000Z-0a1b2c/base/etcd-0.db"), "{:?}", bad.problems);
    }
}
