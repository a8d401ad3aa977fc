//! `backups verify --deep` of a stream: replay and reality compared. Where
//! a chain hands over to the next (the next chain's base was taken while
//! the previous chain still ran, so the previous chain holds the base's
//! revision), the previous chain is replayed to exactly that revision and
//! the result is compared, key by key, with the next chain's base, an etcd
//! snapshot taken from the live cluster: every key, its value, its create
//! and mod revisions, its version and its lease must be the same. A
//! difference means the replay does not reproduce what etcd held: the
//! chain cannot be trusted for a point-in-time restore.

use std::path::Path;

use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use serde::Serialize;

use super::catalog::ChainListing;
use super::replay::{Target, replay_chain};
use super::{StreamError, base};
use crate::archive::encryption::Identities;
use crate::etcd::scratch::ScratchTools;
use crate::store::Store;

/// Keys read from each scratch etcd per request.
const PAGE: i64 = 1000;
/// Differences named in a verdict (the count is always whole).
const SHOWN: usize = 10;

/// One handover compared.
#[derive(Debug, Clone, Serialize)]
pub struct Handover {
    pub chain_id: String,
    pub next_chain_id: String,
    /// The next chain's base revision, replayed to on this chain.
    pub revision: i64,
    pub keys_compared: u64,
    pub differences: u64,
    /// The first few, each naming the key and what differs.
    pub shown: Vec<String>,
    pub ok: bool,
}

/// Compare every handover between `chains` (oldest first) whose earlier
/// chain holds the later chain's base revision (`chain`: only the one from
/// that chain; no other is replayed). Chains that do not overlap (a break)
/// have nothing to compare and are passed by.
pub async fn compare_handovers(store: &dyn Store, chains: &[ChainListing], chain: Option<&str>, identities: Option<&Identities>, tools: &ScratchTools) -> Result<Vec<Handover>, StreamError> {
    let mut out = Vec::new();
    for pair in chains.windows(2) {
        let (earlier, later) = (&pair[0], &pair[1]);
        let (Ok(first), Ok(next)) = (&earlier.descriptor, &later.descriptor) else { continue };
        if chain.is_some_and(|id| first.chain_id != id) {
            continue;
        }
        let Some(span) = earlier.span() else { continue };
        let revision = next.base.revision;
        if !(span.base <= revision && revision <= span.through) {
            continue;
        }
        let scratch = tempfile::Builder::new()
            .prefix("hcp-dr-deep-")
            .tempdir()
            .map_err(|source| StreamError::Io { what: "a scratch folder for the comparison (TMPDIR)".into(), source })?;
        let replayed = scratch.path().join("replayed.db");
        replay_chain(store, earlier, first, Target::Revision(revision), &replayed, identities, tools).await?;
        let base_file = scratch.path().join("base.db");
        let mut file = tokio::fs::File::create(&base_file).await.map_err(|source| StreamError::Io { what: base_file.display().to_string(), source })?;
        let read = base::read(store, &later.layout, next, identities, &mut file).await?;
        drop(file);
        if let Some(mismatch) = read.mismatch(&next.base, &later.layout.artifact(&next.base.artifact)) {
            return Err(StreamError::Base(mismatch));
        }
        let mut handover = Handover {
            chain_id: first.chain_id.clone(),
            next_chain_id: next.chain_id.clone(),
            revision,
            keys_compared: 0,
            differences: 0,
            shown: Vec::new(),
            ok: false,
        };
        compare(tools, &replayed, &base_file, scratch.path(), &mut handover).await?;
        handover.ok = handover.differences == 0;
        out.push(handover);
    }
    Ok(out)
}

/// A key as compared: value, create and mod revisions, version, lease.
type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

async fn page(client: &mut Client, from: &[u8]) -> Result<Vec<Kv>, StreamError> {
    let options = GetOptions::new().with_from_key().with_limit(PAGE).with_sort(SortTarget::Key, SortOrder::Ascend);
    let response = client.get(from, Some(options)).await.map_err(|e| StreamError::Scratch(format!("reading keys: {e}")))?;
    Ok(response.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease())).collect())
}

/// Walk both snapshots' keyspaces in key order, counting and naming differences.
async fn compare(tools: &ScratchTools, replayed: &Path, base: &Path, dir: &Path, handover: &mut Handover) -> Result<(), StreamError> {
    let mut left = tools.start_restored(replayed, &dir.join("left"), &[]).await.map_err(StreamError::Scratch)?;
    let mut right = match tools.start_restored(base, &dir.join("right"), &[]).await {
        Ok(etcd) => etcd,
        Err(err) => {
            left.stop().await;
            return Err(StreamError::Scratch(err));
        }
    };
    let result = walk(&left.client_url, &right.client_url, handover).await;
    left.stop().await;
    right.stop().await;
    result
}

async fn walk(left_url: &str, right_url: &str, handover: &mut Handover) -> Result<(), StreamError> {
    let connect = |url: String| async move { Client::connect([url], None).await.map_err(|e| StreamError::Scratch(format!("connecting: {e}"))) };
    let (mut left, mut right) = (connect(left_url.to_string()).await?, connect(right_url.to_string()).await?);
    let (mut l, mut r) = (page(&mut left, &[0]).await?, page(&mut right, &[0]).await?);
    let (mut li, mut ri) = (0usize, 0usize);
    let differ = |handover: &mut Handover, what: String| {
        handover.differences += 1;
        if handover.shown.len() < SHOWN {
            handover.shown.push(what);
        }
    };
    loop {
        // refill a side whose page is used up, after its last key
        if li == l.len() && l.len() as i64 == PAGE {
            let mut after = l[li - 1].0.clone();
            after.push(0);
            l = page(&mut left, &after).await?;
            li = 0;
        }
        if ri == r.len() && r.len() as i64 == PAGE {
            let mut after = r[ri - 1].0.clone();
            after.push(0);
            r = page(&mut right, &after).await?;
            ri = 0;
        }
        match (l.get(li), r.get(ri)) {
            (None, None) => break,
            (Some(kv), None) => {
                differ(handover, format!("{}: only in the replay", String::from_utf8_lossy(&kv.0)));
                li += 1;
            }
            (None, Some(kv)) => {
                differ(handover, format!("{}: only in the next base", String::from_utf8_lossy(&kv.0)));
                ri += 1;
            }
            (Some(a), Some(b)) => match a.0.cmp(&b.0) {
                std::cmp::Ordering::Less => {
                    differ(handover, format!("{}: only in the replay", String::from_utf8_lossy(&a.0)));
                    li += 1;
                }
                std::cmp::Ordering::Greater => {
                    differ(handover, format!("{}: only in the next base", String::from_utf8_lossy(&b.0)));
                    ri += 1;
                }
                std::cmp::Ordering::Equal => {
                    handover.keys_compared += 1;
                    if a != b {
                        let what = if a.1 != b.1 {
                            "value".to_string()
                        } else {
                            format!("(create, mod, version, lease) replay {:?}, base {:?}", (a.2, a.3, a.4, a.5), (b.2, b.3, b.4, b.5))
                        };
                        differ(handover, format!("{}: {what} differs", String::from_utf8_lossy(&a.0)));
                    }
                    li += 1;
                    ri += 1;
                }
            },
        }
    }
    Ok(())
}
