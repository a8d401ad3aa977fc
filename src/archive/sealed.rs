//! A store that encrypts what is put into it: the backup writes its
//! encrypted artifacts (snapshots, objects archive) through it, so they are
//! encrypted while they stream and no plaintext reaches the store, its
//! `.partial` files or an S3 part. Everything else (reads, listings,
//! deletes) goes to the store underneath unchanged; the manifest and
//! `SHA256SUMS` are written to that store directly.
//!
//! It lives beside the encryption it applies (a `Store` built from
//! `archive::encryption`), so `store` needs nothing from `archive`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::encryption::{EncryptingReader, Recipients};
use crate::store::{Body, ObjectInfo, PutReport, Store, StoreError};

pub struct SealingStore {
    inner: Arc<dyn Store>,
    recipients: Recipients,
    /// Plaintext size and SHA-256 of every object put, by key.
    plaintext: Mutex<BTreeMap<String, PutReport>>,
}

impl SealingStore {
    pub fn new(inner: Arc<dyn Store>, recipients: Recipients) -> SealingStore {
        SealingStore {
            inner,
            recipients,
            plaintext: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn recipients(&self) -> &Recipients {
        &self.recipients
    }

    /// The plaintext digest of what was put at `key` (`put` returns the
    /// ciphertext's, as for any store: what is stored).
    pub fn plaintext(&self, key: &str) -> Option<PutReport> {
        self.plaintext.lock().ok().and_then(|p| p.get(key).cloned())
    }
}

#[async_trait]
impl Store for SealingStore {
    fn url(&self) -> String {
        self.inner.url()
    }

    async fn put(&self, key: &str, body: Body<'_>) -> Result<PutReport, StoreError> {
        let (reader, digest) = EncryptingReader::new(body, &self.recipients, key).map_err(|e| StoreError::Body {
            key: key.to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let stored = self.inner.put(key, Box::new(reader)).await?;
        let plain = digest.get().ok_or_else(|| StoreError::Body {
            key: key.to_string(),
            source: std::io::Error::other("the store stopped reading before the end of the data"),
        })?;
        if let Ok(mut map) = self.plaintext.lock() {
            map.insert(key.to_string(), plain);
        }
        Ok(stored)
    }

    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
        self.inner.get(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        if let Ok(mut map) = self.plaintext.lock() {
            map.remove(key);
        }
        self.inner.delete(key).await
    }

    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, StoreError> {
        self.inner.presign_get(key, ttl).await
    }

    fn local_dir(&self) -> Option<&std::path::Path> {
        self.inner.local_dir()
    }

    fn s3(&self) -> Option<&crate::store::S3Store> {
        self.inner.s3()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::encryption::{Identities, decrypting_reader, is_age};
    use crate::store::LocalStore;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn puts_are_encrypted_and_both_digests_kept() {
        let identity = age::x25519::Identity::generate();
        let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
        let recipients = Recipients::parse(&[identity.to_public().to_string()]).unwrap().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
        let sealed = SealingStore::new(local.clone(), recipients.clone());
        let plain = b"apiVersion: v1\nkind: Secret\ndata: {token: c2VjcmV0LXZhbHVl}\n".repeat(5000);
        let stored = sealed.put("b/objects.tar.gz", Box::new(&plain[..])).await.unwrap();
        let on_disk = std::fs::read(dir.path().join("b/objects.tar.gz")).unwrap();
        assert!(is_age(&on_disk));
        assert_eq!(stored.size, on_disk.len() as u64);
        assert!(!on_disk.windows(24).any(|w| w == b"c2VjcmV0LXZhbHVl}\napiVe"), "plaintext stored");
        let plain_digest = sealed.plaintext("b/objects.tar.gz").unwrap();
        assert_eq!(plain_digest.size, plain.len() as u64);
        assert_ne!(plain_digest.sha256, stored.sha256);

        let ids = Identities::parse(std::path::Path::new("k"), &secret).unwrap();
        let body = local.get("b/objects.tar.gz").await.unwrap();
        let mut back = Vec::new();
        decrypting_reader(body, &ids, "objects", &recipients.names())
            .await
            .unwrap()
            .read_to_end(&mut back)
            .await
            .unwrap();
        assert_eq!(back, plain);
        sealed.delete("b/objects.tar.gz").await.unwrap();
        assert!(sealed.plaintext("b/objects.tar.gz").is_none());
        assert!(!dir.path().join("b/objects.tar.gz").exists());
    }
}
