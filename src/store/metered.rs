//! A store seen through a [`Meter`]: every byte read from it or written to
//! it is counted, for the progress display of a stage that reads a whole
//! backup through functions that only take a store (restore's verify).

use std::time::Duration;

use async_trait::async_trait;

use super::{Body, ObjectInfo, PutReport, Store, StoreError};
use crate::meter::Meter;

pub struct MeteredStore<'a> {
    inner: &'a dyn Store,
    meter: Meter,
}

impl<'a> MeteredStore<'a> {
    pub fn new(inner: &'a dyn Store, meter: &Meter) -> Self {
        MeteredStore { inner, meter: meter.clone() }
    }
}

#[async_trait]
impl Store for MeteredStore<'_> {
    fn url(&self) -> String {
        self.inner.url()
    }
    async fn put(&self, key: &str, body: Body<'_>) -> Result<PutReport, StoreError> {
        self.inner.put(key, Box::new(self.meter.reader(body))).await
    }
    async fn put_verbatim(&self, key: &str, body: Body<'_>) -> Result<super::Stored, StoreError> {
        self.inner.put_verbatim(key, Box::new(self.meter.reader(body))).await
    }
    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
        Ok(Box::new(self.meter.reader(self.inner.get(key).await?)))
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, StoreError> {
        self.inner.presign_get(key, ttl).await
    }
    fn local_dir(&self) -> Option<&std::path::Path> {
        self.inner.local_dir()
    }
    fn s3(&self) -> Option<&super::S3Store> {
        self.inner.s3()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::local::LocalStore;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn what_is_written_and_read_through_it_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStore::new(dir.path().to_path_buf());
        let meter = Meter::new();
        let store = MeteredStore::new(&local, &meter);
        store.put("a/b", Box::new(&[1u8; 5000][..])).await.unwrap();
        assert_eq!(meter.bytes(), 5000);
        let mut back = Vec::new();
        store.get("a/b").await.unwrap().read_to_end(&mut back).await.unwrap();
        assert_eq!((back.len(), meter.bytes()), (5000, 10_000));
        assert_eq!(store.list("a").await.unwrap().len(), 1, "listing reads through");
    }
}
