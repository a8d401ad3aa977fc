//! Object storage in etcd, laid out as a real kube-apiserver lays it out:
//! `<prefix>/<resource>/[<namespace>/]<name>`, values are JSON, the
//! resourceVersion of an object is its key's `mod_revision` (set on read, not
//! stored) and a list's resourceVersion is the etcd header revision.

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use serde_json::Value;

use super::resources::ResourceType;

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// etcd did not answer in time.
    #[error("etcd request timed out: {0}")]
    Timeout(#[source] etcd_client::Error),
    /// The etcd request failed.
    #[error("etcd request failed: {0}")]
    Etcd(#[source] etcd_client::Error),
    /// A stored value is not a JSON object.
    #[error("stored value at {key} is not valid JSON: {source}")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// The requested revision has been compacted away.
    #[error("required revision {0} has been compacted")]
    Compacted(i64),
}

/// An object read from etcd.
#[derive(Debug, Clone)]
pub struct Stored {
    pub key: String,
    /// The object, with `metadata.resourceVersion` set to `mod_revision`.
    pub obj: Value,
    pub mod_revision: i64,
}

/// One page of a range read.
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Stored>,
    /// The revision the page was read at.
    pub revision: i64,
    /// More keys follow the last returned one.
    pub more: bool,
}

/// The etcd-backed store.
#[derive(Clone)]
pub struct Store {
    client: Client,
    watch_client: Client,
    prefix: String,
}

/// The key just after every key starting with `prefix`.
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl From<etcd_client::Error> for StoreError {
    fn from(e: etcd_client::Error) -> StoreError {
        let text = e.to_string().to_lowercase();
        if text.contains("timeout expired")
            || text.contains("deadline")
            || text.contains("timed out")
        {
            StoreError::Timeout(e)
        } else {
            StoreError::Etcd(e)
        }
    }
}

fn is_compacted(e: &etcd_client::Error) -> bool {
    e.to_string()
        .contains("required revision has been compacted")
}

/// Set `metadata.resourceVersion` on an object.
pub fn set_rv(obj: &mut Value, rev: i64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rev.to_string()));
    }
}

/// Serialize for storage (without `metadata.resourceVersion`).
pub fn encode(obj: &Value) -> Vec<u8> {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    serde_json::to_vec(&o).unwrap_or_default()
}

pub fn decode(key: &str, value: &[u8], mod_revision: i64) -> Result<Stored, StoreError> {
    let mut obj: Value = serde_json::from_slice(value).map_err(|source| StoreError::Decode {
        key: key.to_string(),
        source,
    })?;
    set_rv(&mut obj, mod_revision);
    Ok(Stored {
        key: key.to_string(),
        obj,
        mod_revision,
    })
}

impl Store {
    pub fn new(client: Client, watch_client: Client, prefix: &str) -> Store {
        Store {
            client,
            watch_client,
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    /// The client for watches (no request timeout).
    pub fn watch_client(&self) -> Client {
        self.watch_client.clone()
    }

    /// `<prefix>/<resource>/` or `<prefix>/<resource>/<ns>/`.
    pub fn collection_prefix(&self, rt: &ResourceType, ns: Option<&str>) -> String {
        match ns {
            Some(ns) if rt.namespaced => format!("{}/{}/{}/", self.prefix, rt.storage_prefix(), ns),
            _ => format!("{}/{}/", self.prefix, rt.storage_prefix()),
        }
    }

    pub fn key(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> String {
        format!("{}{}", self.collection_prefix(rt, ns), name)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let mut kv = self.client.kv_client();
        let resp = kv.get(key, None).await?;
        match resp.kvs().first() {
            Some(kv) => Ok(Some(decode(key, kv.value(), kv.mod_revision())?)),
            None => Ok(None),
        }
    }

    /// The current etcd revision.
    pub async fn revision(&self) -> Result<i64, StoreError> {
        let mut kv = self.client.kv_client();
        let resp = kv
            .get("\0", Some(GetOptions::new().with_count_only()))
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Keys in `[start, prefix_end(prefix))` at `revision` (0: latest), at most `limit` (0: all).
    pub async fn range(
        &self,
        prefix: &str,
        start: Option<&str>,
        limit: i64,
        revision: i64,
    ) -> Result<Page, StoreError> {
        let mut kv = self.client.kv_client();
        let begin = start.unwrap_or(prefix).to_string();
        let mut opts = GetOptions::new().with_range(prefix_end(prefix));
        if limit > 0 {
            opts = opts.with_limit(limit);
        }
        if revision > 0 {
            opts = opts.with_revision(revision);
        }
        let resp = match kv.get(begin, Some(opts)).await {
            Ok(r) => r,
            Err(e) if is_compacted(&e) => return Err(StoreError::Compacted(revision)),
            Err(e) => return Err(e.into()),
        };
        let mut items = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).to_string();
            items.push(decode(&key, kv.value(), kv.mod_revision())?);
        }
        Ok(Page {
            items,
            revision: resp.header().map(|h| h.revision()).unwrap_or(0),
            more: resp.more(),
        })
    }

    /// Everything under `prefix`, at the latest revision.
    pub async fn list_all(&self, prefix: &str) -> Result<Page, StoreError> {
        self.range(prefix, None, 0, 0).await
    }

    /// Create `key` if absent. `Ok(None)` when it already exists.
    pub async fn create(&self, key: &str, obj: &Value) -> Result<Option<i64>, StoreError> {
        let mut kv = self.client.kv_client();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, encode(obj), None)]);
        let resp = kv.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        Ok(Some(resp.header().map(|h| h.revision()).unwrap_or(0)))
    }

    /// Replace `key` if its mod_revision is still `expected`. `Ok(None)` on a conflict.
    pub async fn update(
        &self,
        key: &str,
        obj: &Value,
        expected: i64,
    ) -> Result<Option<i64>, StoreError> {
        let mut kv = self.client.kv_client();
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
            .and_then([TxnOp::put(key, encode(obj), None)]);
        let resp = kv.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        Ok(Some(resp.header().map(|h| h.revision()).unwrap_or(0)))
    }

    /// Delete `key` if its mod_revision is still `expected`. `Ok(None)` on a conflict.
    pub async fn delete(&self, key: &str, expected: i64) -> Result<Option<i64>, StoreError> {
        let mut kv = self.client.kv_client();
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
            .and_then([TxnOp::delete(key, None)]);
        let resp = kv.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let deleted = resp
            .op_responses()
            .iter()
            .any(|r| matches!(r, TxnOpResponse::Delete(d) if d.deleted() > 0));
        if !deleted {
            return Ok(None);
        }
        Ok(Some(resp.header().map(|h| h.revision()).unwrap_or(0)))
    }
}
