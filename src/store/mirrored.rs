//! A primary store and its copies written in one pass (`backup --copy-to`):
//! every `put` streams the body once, to all of them at the same time
//! (etcd's snapshot is read once, whatever the number of copies). Reads,
//! listings and presigned URLs are the primary's.
//!
//! A copy that fails stops being written to: with `optional` the backup
//! goes on in the others (the failure is kept for the report), without it
//! the `put` fails. A manifest is written to a copy only when the copy
//! holds every artifact it lists with the recorded size, so a copy that
//! missed something (it failed, or a resumed run reached it late) is never
//! listed complete.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

use super::{Body, ObjectInfo, PutReport, Store, StoreError, Stored};
use crate::archive::{MANIFEST, Manifest};

const CHUNK: usize = 1 << 20;

/// One copy store, once it failed why, and whether its manifest was written.
struct Copy {
    store: Box<dyn Store>,
    failed: Mutex<Option<String>>,
    completed: AtomicBool,
}

/// What became of a copy, for the backup's report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CopyState {
    pub store: String,
    /// Written whole, manifest included.
    pub complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub struct Mirrored {
    primary: std::sync::Arc<dyn Store>,
    copies: Vec<Copy>,
    optional: bool,
}

impl Mirrored {
    pub fn new(primary: std::sync::Arc<dyn Store>, copies: Vec<Box<dyn Store>>, optional: bool) -> Mirrored {
        Mirrored {
            primary,
            copies: copies.into_iter().map(|store| Copy { store, failed: Mutex::new(None), completed: AtomicBool::new(false) }).collect(),
            optional,
        }
    }

    /// Each copy: complete, or why not.
    pub fn states(&self) -> Vec<CopyState> {
        self.copies
            .iter()
            .map(|c| {
                let error = c.failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
                CopyState { store: c.store.url(), complete: c.completed.load(Ordering::SeqCst) && error.is_none(), error }
            })
            .collect()
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.copies.len()).filter(|i| self.copies[*i].failed.lock().unwrap_or_else(|e| e.into_inner()).is_none()).collect()
    }

    /// A copy failed: remember why; without `optional` it is the put's error.
    fn copy_failed(&self, i: usize, key: &str, why: String) -> Result<(), StoreError> {
        let store = self.copies[i].store.url();
        tracing::warn!(copy = %store, key, "the copy failed: {why}");
        *self.copies[i].failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
        if self.optional {
            Ok(())
        } else {
            Err(StoreError::Copy { store, key: key.to_string(), message: why })
        }
    }

    /// Before a manifest goes to the copies: those missing an artifact it
    /// lists (or holding one of another size) are failed, not completed.
    async fn check_copies_hold(&self, key: &str, manifest: &[u8]) -> Result<(), StoreError> {
        let dir = key.strip_suffix(MANIFEST).unwrap_or(key);
        let manifest = match Manifest::parse(manifest) {
            Ok(manifest) => manifest,
            Err(err) => {
                // what a copy holds cannot be checked: it is not completed
                for i in self.alive() {
                    self.copy_failed(i, key, format!("the manifest does not parse ({err}), so what the copy holds cannot be checked"))?;
                }
                return Ok(());
            }
        };
        for i in self.alive() {
            let listed = match self.copies[i].store.list(dir).await {
                Ok(listed) => listed,
                Err(err) => {
                    self.copy_failed(i, key, err.to_string())?;
                    continue;
                }
            };
            let missing: Vec<&str> = manifest
                .artifacts
                .iter()
                .filter(|a| !listed.iter().any(|o| o.key == format!("{dir}{}", a.name) && o.size == a.size))
                .map(|a| a.name.as_str())
                .collect();
            if !missing.is_empty() {
                self.copy_failed(i, key, format!("it lacks {} (a resumed backup does not rewrite what an earlier run stored): the copy is left incomplete; `hcp-dr backups copy` completes it", missing.join(", ")))?;
            }
        }
        Ok(())
    }

    /// Stream `body` to the primary (through `primary`) and every live copy
    /// at once.
    async fn tee<T, F, Fut>(&self, key: &str, mut body: Body<'_>, primary: F) -> Result<T, StoreError>
    where
        F: FnOnce(Body<'static>) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        use tokio::io::AsyncReadExt;
        let alive = self.alive();
        let mut senders = Vec::new();
        let (primary_tx, primary_rx) = mpsc::channel::<Result<Bytes, String>>(2);
        senders.push(Some(primary_tx));
        let mut copy_puts = Vec::new();
        for &i in &alive {
            let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(2);
            senders.push(Some(tx));
            let store = &self.copies[i].store;
            copy_puts.push(async move { (i, store.put(key, Box::new(ChannelReader::new(rx))).await) });
        }
        let pump = async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = match body.read(&mut buf).await {
                    Ok(n) => n,
                    Err(err) => {
                        for tx in senders.iter().flatten() {
                            let _ = tx.send(Err(err.to_string())).await;
                        }
                        return;
                    }
                };
                if n == 0 {
                    return;
                }
                let chunk = Bytes::copy_from_slice(&buf[..n]);
                let mut any = false;
                for slot in senders.iter_mut() {
                    if let Some(tx) = slot {
                        // a put that stopped reading (it failed) is dropped
                        if tx.send(Ok(chunk.clone())).await.is_err() {
                            *slot = None;
                        } else {
                            any = true;
                        }
                    }
                }
                if !any {
                    return;
                }
            }
        };
        let (_, primary_result, copies) = tokio::join!(pump, primary(Box::new(ChannelReader::new(primary_rx))), futures::future::join_all(copy_puts));
        let result = primary_result?;
        for (i, copied) in copies {
            if let Err(err) = copied {
                self.copy_failed(i, key, err.to_string())?;
            }
        }
        Ok(result)
    }
}

/// An `AsyncRead` over chunks sent through a channel; a sent error is a
/// read error (the body failed), a closed channel the end.
struct ChannelReader {
    rx: mpsc::Receiver<Result<Bytes, String>>,
    pending: Bytes,
}

impl ChannelReader {
    fn new(rx: mpsc::Receiver<Result<Bytes, String>>) -> ChannelReader {
        ChannelReader { rx, pending: Bytes::new() }
    }
}

impl AsyncRead for ChannelReader {
    fn poll_read(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &mut ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        while self.pending.is_empty() {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) => self.pending = chunk,
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(std::io::Error::other(err))),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = self.pending.len().min(buf.remaining());
        let chunk = self.pending.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

#[async_trait]
impl Store for Mirrored {
    fn url(&self) -> String {
        self.primary.url()
    }

    async fn put(&self, key: &str, body: Body<'_>) -> Result<PutReport, StoreError> {
        if key.rsplit('/').next() == Some(MANIFEST) {
            // small: read whole, checked against each copy, then written
            let mut bytes = Vec::new();
            let mut body = body;
            tokio::io::AsyncReadExt::read_to_end(&mut body, &mut bytes)
                .await
                .map_err(|source| StoreError::Body { key: key.to_string(), source })?;
            self.check_copies_hold(key, &bytes).await?;
            let alive = self.alive();
            let report = self.tee(key, Box::new(&bytes[..]), |b| self.primary.put(key, b)).await?;
            let still = self.alive();
            for i in alive.into_iter().filter(|i| still.contains(i)) {
                self.copies[i].completed.store(true, Ordering::SeqCst);
            }
            return Ok(report);
        }
        self.tee(key, body, |b| self.primary.put(key, b)).await
    }

    async fn put_verbatim(&self, key: &str, body: Body<'_>) -> Result<Stored, StoreError> {
        self.tee(key, body, |b| self.primary.put_verbatim(key, b)).await
    }

    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
        self.primary.get(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.primary.list(prefix).await
    }

    /// From every store: what an undone backup wrote goes from the copies too.
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.primary.delete(key).await?;
        for (i, copy) in self.copies.iter().enumerate() {
            if let Err(err) = copy.store.delete(key).await {
                let failed_before = copy.failed.lock().unwrap_or_else(|e| e.into_inner()).is_some();
                if !failed_before {
                    self.copy_failed(i, key, err.to_string())?;
                }
            }
        }
        Ok(())
    }

    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, StoreError> {
        self.primary.presign_get(key, ttl).await
    }

    fn local_dir(&self) -> Option<&std::path::Path> {
        self.primary.local_dir()
    }
    fn s3(&self) -> Option<&super::S3Store> {
        self.primary.s3()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;
    use tokio::io::AsyncReadExt;

    /// A store whose puts fail after `after` bytes.
    struct Refusing {
        inner: LocalStore,
        after: usize,
    }

    #[async_trait]
    impl Store for Refusing {
        fn url(&self) -> String {
            "refusing://".into()
        }
        async fn put(&self, key: &str, mut body: Body<'_>) -> Result<PutReport, StoreError> {
            let mut bytes = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = body.read(&mut buf).await.map_err(|source| StoreError::Body { key: key.into(), source })?;
                if n == 0 {
                    break;
                }
                bytes.extend_from_slice(&buf[..n]);
                if bytes.len() > self.after {
                    return Err(StoreError::S3 { operation: "PutObject", bucket: "b".into(), key: key.into(), message: "AccessDenied".into() });
                }
            }
            self.inner.put(key, Box::new(&bytes[..])).await
        }
        async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
            self.inner.get(key).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
            self.inner.list(prefix).await
        }
        async fn delete(&self, key: &str) -> Result<(), StoreError> {
            self.inner.delete(key).await
        }
        async fn presign_get(&self, _: &str, _: Duration) -> Result<Option<String>, StoreError> {
            Ok(None)
        }
    }

    fn manifest_listing(artifacts: &[(&str, u64)]) -> Vec<u8> {
        let mut m = crate::archive::tests::manifest();
        m.etcd.truncate(1);
        m.etcd[0].size = artifacts[0].1;
        m.artifacts = artifacts.iter().map(|(n, s)| crate::archive::Artifact { name: n.to_string(), size: *s, sha256: "00".repeat(32) }).collect();
        serde_json::to_vec(&m).unwrap()
    }

    #[tokio::test]
    async fn one_pass_to_every_store_and_a_failed_copy_is_never_completed() {
        let dir = tempfile::tempdir().unwrap();
        let primary: std::sync::Arc<dyn Store> = std::sync::Arc::new(LocalStore::new(dir.path().join("a")));
        let good = LocalStore::new(dir.path().join("b"));
        let bad = Refusing { inner: LocalStore::new(dir.path().join("c")), after: 3 * CHUNK };
        let big = vec![7u8; 5 * CHUNK + 3];

        // optional: the refusing copy fails, the others go on
        let mirrored = Mirrored::new(primary.clone(), vec![Box::new(good.clone()), Box::new(bad)], true);
        let report = mirrored.put("x/1/etcd/etcd-0.db", Box::new(&big[..])).await.unwrap();
        assert_eq!(report.size, big.len() as u64);
        mirrored.put("x/1/objects.tar.gz", Box::new(&b"small"[..])).await.unwrap();
        mirrored.put("x/1/SHA256SUMS", Box::new(&b"sums"[..])).await.unwrap();
        let manifest = manifest_listing(&[("etcd/etcd-0.db", big.len() as u64), ("objects.tar.gz", 5), ("SHA256SUMS", 4)]);
        mirrored.put("x/1/manifest.json", Box::new(&manifest[..])).await.unwrap();
        let mut back = Vec::new();
        good.get("x/1/etcd/etcd-0.db").await.unwrap().read_to_end(&mut back).await.unwrap();
        assert_eq!(back, big, "the copy holds the same bytes");
        assert!(good.get("x/1/manifest.json").await.is_ok());
        assert!(matches!(LocalStore::new(dir.path().join("c")).get("x/1/manifest.json").await, Err(StoreError::NotFound { .. })), "the failed copy has no manifest");
        let states = mirrored.states();
        assert!(states[0].complete && states[0].error.is_none(), "{states:?}");
        assert!(!states[1].complete && states[1].error.as_deref().unwrap().contains("AccessDenied"), "{states:?}");

        // not optional: the put fails, naming the copy
        let bad = Refusing { inner: LocalStore::new(dir.path().join("d")), after: 10 };
        let mirrored = Mirrored::new(primary.clone(), vec![Box::new(bad)], false);
        let err = mirrored.put("y/1/etcd/etcd-0.db", Box::new(&big[..])).await.unwrap_err().to_string();
        assert!(err.contains("refusing://") && err.contains("AccessDenied"), "{err}");

        // a copy that lacks an artifact (a resumed run) gets no manifest
        let late = LocalStore::new(dir.path().join("e"));
        let mirrored = Mirrored::new(primary, vec![Box::new(late.clone())], true);
        mirrored.put("z/1/manifest.json", Box::new(&manifest[..])).await.unwrap();
        assert!(late.get("z/1/manifest.json").await.is_err());
        assert!(mirrored.states()[0].error.as_deref().unwrap().contains("lacks etcd/etcd-0.db, objects.tar.gz, SHA256SUMS"), "{:?}", mirrored.states());
    }
}
