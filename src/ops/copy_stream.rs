//! `backups copy` of stream chains and object sets (`hcp-dr stream`),
//! beside the backups: an off-site copy of the points a restore can reach,
//! not only of the backups.
//!
//! A chain is copied in the order a reader at the destination needs it:
//! its base (checked against the size and SHA-256 its `chain.json`
//! records), then its segments in revision order (each checked against the
//! SHA-256 its name carries), then `chain.json` last, so the destination
//! never lists a chain whose base is not there, and its window only ever
//! reaches as far as the segments copied without a gap. What is already
//! at the destination is rehashed there and kept when it matches, so a run
//! cut short goes on where it stopped, and a chain the stream still writes
//! gets its new segments at the next run. Object sets (their SHA-256 is of
//! the plaintext archive) are copied once; one already there is kept when
//! its size matches, and an unencrypted one is rehashed.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OpsError;
use crate::store::{Store, StoreError};
use crate::stream::catalog::{self, ChainListing};
use crate::stream::format::ChainLayout;

/// What a copy run did with one chain.
#[derive(Debug, Clone, Serialize)]
pub struct CopiedChain {
    /// `namespace/name`.
    pub hosted_cluster: String,
    pub chain_id: String,
    /// `copied`, `already there`, `completed` (a copy cut short or a chain
    /// that grew since), or `failed`.
    pub result: super::copy::CopyResult,
    pub segments: usize,
    pub segments_copied: usize,
    pub bytes_copied: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a copy run did with one cluster's object sets.
#[derive(Debug, Clone, Serialize)]
pub struct CopiedSets {
    pub hosted_cluster: String,
    pub sets: usize,
    pub copied: usize,
    pub bytes_copied: u64,
    /// Sets that could not be copied (damaged at the source), and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
}

/// A chain that cannot be copied (damaged at the source), or a store that
/// does not answer (which fails the whole run).
enum ChainError {
    Store(StoreError),
    Chain(String),
}

impl From<StoreError> for ChainError {
    fn from(err: StoreError) -> ChainError {
        ChainError::Store(err)
    }
}

/// The clusters of `from` with a `stream/` folder (those `cluster` selects).
pub async fn streamed(from: &dyn Store, cluster: Option<(&str, &str)>) -> Result<Vec<(String, String)>, OpsError> {
    Ok(super::backups::catalogue(from, cluster).await?.streamed)
}

/// Copy every chain of `namespace/hosted_cluster` last written since
/// `since` (all without), then its object sets read since then.
pub async fn copy_cluster(
    from: &dyn Store,
    to: &dyn Store,
    namespace: &str,
    hosted_cluster: &str,
    since: Option<DateTime<Utc>>,
) -> Result<(Vec<CopiedChain>, CopiedSets), OpsError> {
    let (chains, _) = catalog::chains(from, namespace, hosted_cluster).await.map_err(super::stream::stream_error)?;
    let mut out = Vec::new();
    for chain in &chains {
        if since.is_some_and(|since| chain.last_written().is_some_and(|t| t < since)) {
            continue;
        }
        let copied = match copy_chain(from, to, chain).await {
            Ok(copied) => copied,
            Err(ChainError::Store(err)) => return Err(err.into()),
            Err(ChainError::Chain(why)) => CopiedChain {
                hosted_cluster: format!("{namespace}/{hosted_cluster}"),
                chain_id: chain.layout.chain_id.clone(),
                result: super::copy::CopyResult::Failed,
                segments: chain.segments.len(),
                segments_copied: 0,
                bytes_copied: 0,
                error: Some(why),
            },
        };
        out.push(copied);
    }
    let sets = copy_sets(from, to, namespace, hosted_cluster, since).await?;
    Ok((out, sets))
}

/// Copy `key` unless the destination holds it hashing to `sha256` (and
/// of `size` bytes, when recorded); the bytes copied (0: kept). Bytes that
/// do not hash as recorded are removed again and fail the chain.
async fn copy_checked(from: &dyn Store, to: &dyn Store, key: &str, size: Option<u64>, sha256: &str, present: bool) -> Result<u64, ChainError> {
    use crate::archive::check::{CheckError, hash_stored};
    if present {
        match hash_stored(to, key).await {
            Ok(there) if there.sha256 == sha256 && size.is_none_or(|s| s == there.size) => return Ok(0),
            Ok(_) | Err(CheckError::Store(StoreError::NotFound { .. })) => {}
            Err(CheckError::Store(err)) => return Err(ChainError::Store(err)),
            Err(other) => return Err(ChainError::Chain(other.to_string())),
        }
    }
    let body = from.get(key).await?;
    let put = to.put(key, body).await?;
    if put.sha256 != sha256 || size.is_some_and(|s| s != put.size) {
        let _ = to.delete(key).await;
        return Err(ChainError::Chain(format!(
            "{}/{key}: {} bytes with SHA-256 {}, not the {sha256} recorded: damaged or altered at the source; `hcp-dr stream verify` there shows how far the chain restores",
            from.url(),
            put.size,
            put.sha256
        )));
    }
    Ok(put.size)
}

async fn copy_chain(from: &dyn Store, to: &dyn Store, chain: &ChainListing) -> Result<CopiedChain, ChainError> {
    let layout: &ChainLayout = &chain.layout;
    let descriptor = chain.descriptor.as_ref().map_err(|why| ChainError::Chain(format!("{}: {why}", layout.descriptor())))?;
    let existing: std::collections::BTreeSet<String> = to.list(&format!("{}/", layout.dir())).await?.into_iter().map(|o| o.key).collect();
    let mut done = CopiedChain {
        hosted_cluster: format!("{}/{}", layout.namespace, layout.hosted_cluster),
        chain_id: layout.chain_id.clone(),
        result: super::copy::CopyResult::Copied,
        segments: chain.segments.len(),
        segments_copied: 0,
        bytes_copied: 0,
        error: None,
    };
    let base = layout.artifact(&descriptor.base.artifact);
    let mut kept = 0usize;
    match copy_checked(from, to, &base, Some(descriptor.base.size), &descriptor.base.sha256, existing.contains(&base)).await? {
        0 => kept += 1,
        bytes => done.bytes_copied += bytes,
    }
    for name in &chain.segments {
        let key = layout.segment(name);
        match copy_checked(from, to, &key, None, &name.sha256, existing.contains(&key)).await? {
            0 => kept += 1,
            bytes => {
                done.bytes_copied += bytes;
                done.segments_copied += 1;
            }
        }
    }
    let descriptor_key = layout.descriptor();
    let bytes = crate::store::get_bytes(from, &descriptor_key).await?.ok_or_else(|| ChainError::Chain(format!("{descriptor_key} is gone at the source")))?;
    let same = existing.contains(&descriptor_key) && crate::store::get_bytes(to, &descriptor_key).await?.as_deref() == Some(&bytes[..]);
    if !same {
        to.put(&descriptor_key, Box::new(&bytes[..])).await?;
        done.bytes_copied += bytes.len() as u64;
    }
    done.result = match (same, kept) {
        (true, kept) if kept == chain.segments.len() + 1 => super::copy::CopyResult::AlreadyThere,
        (_, 0) => super::copy::CopyResult::Copied,
        _ => super::copy::CopyResult::Completed,
    };
    Ok(done)
}

async fn copy_sets(from: &dyn Store, to: &dyn Store, namespace: &str, hosted_cluster: &str, since: Option<DateTime<Utc>>) -> Result<CopiedSets, OpsError> {
    use crate::stream::objects;
    let sets = objects::list(from, namespace, hosted_cluster).await.map_err(super::stream::stream_error)?;
    let prefix = objects::prefix(namespace, hosted_cluster);
    let there: std::collections::BTreeMap<String, u64> = to.list(&prefix).await?.into_iter().map(|o| (o.key, o.size)).collect();
    let source: std::collections::BTreeMap<String, u64> = from.list(&prefix).await?.into_iter().map(|o| (o.key, o.size)).collect();
    let mut done = CopiedSets { hosted_cluster: format!("{namespace}/{hosted_cluster}"), sets: 0, copied: 0, bytes_copied: 0, failed: Vec::new() };
    // the newest set before `since` too: a point at `since` needs it
    let first_needed = since.and_then(|since| objects::at(&sets, since).map(|s| s.taken));
    for set in sets.iter().filter(|s| since.is_none_or(|since| s.taken >= since || Some(s.taken) == first_needed)) {
        done.sets += 1;
        let key = format!("{prefix}{}", set.file_name());
        let size = source.get(&key).copied();
        if there.get(&key).is_some_and(|s| Some(*s) == size) {
            if set.encrypted {
                continue;
            }
            if let Ok(held) = crate::archive::check::hash_stored(to, &key).await
                && held.sha256 == set.sha256
            {
                continue;
            }
        }
        let body = from.get(&key).await?;
        let put = to.put(&key, body).await?;
        if (!set.encrypted && put.sha256 != set.sha256) || size.is_some_and(|s| s != put.size) {
            let _ = to.delete(&key).await;
            done.failed.push(format!(
                "{}/{key}: {} bytes with SHA-256 {}, not what its name and listing record: damaged or altered at the source",
                from.url(),
                put.size,
                put.sha256
            ));
            continue;
        }
        done.copied += 1;
        done.bytes_copied += put.size;
    }
    Ok(done)
}
