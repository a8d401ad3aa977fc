//! Where backups live: a small trait with a local-directory store (the
//! default) and an S3 store. Store URLs are a path, `file:///path`, or
//! `s3://bucket/prefix`.
//!
//! Every `put` streams: the body is read in bounded chunks, hashed with
//! SHA-256 on the way, and never held whole in memory.

pub mod local;
pub mod metered;
pub mod mirrored;
pub mod object_lock;
pub mod s3;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use tokio::io::AsyncRead;

pub use local::LocalStore;
pub use s3::{S3Options, S3Store, ServerSideEncryption};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store URL is not one hcp-dr understands.
    #[error("store URL `{url}`: {reason} (use a directory path, file:///path or s3://bucket/prefix)")]
    BadUrl { url: String, reason: String },
    /// An object key that would escape the store or is empty.
    #[error("object key `{key}` is not valid: {reason}")]
    BadKey { key: String, reason: String },
    /// Reading or writing a local file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading the body to upload failed.
    #[error("reading the data for {key}: {source}")]
    Body {
        key: String,
        #[source]
        source: std::io::Error,
    },
    /// The object does not exist.
    #[error("{url}: object `{key}` not found")]
    NotFound { url: String, key: String },
    /// An S3 request failed (after retries).
    #[error("S3 {operation} {bucket}/{key}: {message}")]
    S3 {
        operation: &'static str,
        bucket: String,
        key: String,
        message: String,
    },
    /// A local store's disk has not room enough.
    #[error(transparent)]
    NoSpace(#[from] crate::space::NoSpace),
    /// A copy store (`--copy-to`) failed, and the copy is not optional.
    #[error("copy to {store}: {key}: {message} (the backup fails with it; --copy-optional lets it go on without the copy)")]
    Copy { store: String, key: String, message: String },
    /// The CA bundle given for the S3 endpoint could not be read.
    #[error("CA bundle {path}: {source}")]
    CaBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    Local(PathBuf),
    S3 { bucket: String, prefix: String },
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        let bad = |reason: &str| StoreError::BadUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        if url.trim().is_empty() {
            return Err(bad("it is empty"));
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket name after s3://"));
            }
            let valid = bucket.len() >= 3
                && bucket.len() <= 63
                && bucket
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
            if !valid {
                return Err(bad("bucket names are 3-63 lowercase letters, digits, '-' or '.'"));
            }
            return Ok(StoreUrl::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
            });
        }
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(bad("file:// URLs take an absolute path (file:///var/backups)"));
            }
            return Ok(StoreUrl::Local(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return Err(bad(&format!("unsupported scheme `{scheme}`")));
        }
        Ok(StoreUrl::Local(PathBuf::from(url)))
    }
}

impl StoreUrl {
    /// Whether two URLs name the same store (local paths resolved).
    pub fn same_store(&self, other: &StoreUrl) -> bool {
        match (self, other) {
            (StoreUrl::Local(a), StoreUrl::Local(b)) => {
                let canonical = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| std::path::absolute(p).unwrap_or(p.to_path_buf()));
                canonical(a) == canonical(b)
            }
            (StoreUrl::S3 { bucket: a, prefix: pa }, StoreUrl::S3 { bucket: b, prefix: pb }) => a == b && pa == pb,
            _ => false,
        }
    }
}

/// The whole of a small object (a manifest, a record, a document), `None`
/// when it is not there.
pub async fn get_bytes(store: &dyn Store, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    use tokio::io::AsyncReadExt;
    let mut body = match store.get(key).await {
        Ok(body) => body,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut bytes = Vec::new();
    body.read_to_end(&mut bytes).await.map_err(|source| StoreError::Body { key: key.to_string(), source })?;
    Ok(Some(bytes))
}

/// One stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Key relative to the store's root (or prefix).
    pub key: String,
    pub size: u64,
    pub modified: Option<DateTime<Utc>>,
}

/// What a `put` wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PutReport {
    pub size: u64,
    /// Lowercase hex SHA-256 of the bytes written.
    pub sha256: String,
}

/// A body to upload: any async reader.
pub type Body<'a> = Box<dyn AsyncRead + Send + Unpin + 'a>;

/// The operations every store offers.
#[async_trait]
pub trait Store: Send + Sync {
    /// The store's URL, for messages and manifests.
    fn url(&self) -> String;
    /// Write `key` from `body`, streaming; the object appears whole or not at all.
    async fn put(&self, key: &str, body: Body<'_>) -> Result<PutReport, StoreError>;
    /// As [`Store::put`], for a caller that hashes the body itself as it
    /// streams it (a snapshot: one SHA-256 pass serves etcd's trailing hash
    /// and the manifest). A store that stores the body's bytes as they are
    /// may skip its own pass and say so ([`Stored::Verbatim`]); the default
    /// hashes as `put` does.
    async fn put_verbatim(&self, key: &str, body: Body<'_>) -> Result<Stored, StoreError> {
        self.put(key, body).await.map(Stored::Hashed)
    }
    /// Read `key` as a stream.
    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError>;
    /// Objects under `prefix` (relative keys), sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError>;
    /// Delete `key`; deleting a missing key is not an error.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// A URL anyone can GET for `ttl` (S3 presigned URL); `None` for stores
    /// that cannot make one (local directories).
    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, StoreError>;
    /// The directory a local store writes into (whose disk can fill up);
    /// `None` for remote stores.
    fn local_dir(&self) -> Option<&std::path::Path> {
        None
    }
    /// The S3 store underneath, for what only S3 has (Object Lock, object
    /// versions); `None` for other stores.
    fn s3(&self) -> Option<&S3Store> {
        None
    }
}

/// What [`Store::put_verbatim`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// The body's bytes as they were, `size` of them, not hashed by the
    /// store: their SHA-256 is the one the caller computed while it
    /// streamed them.
    Verbatim { size: u64 },
    /// What the store stored, hashed by it (it may differ from the body:
    /// an encrypting store stores ciphertext).
    Hashed(PutReport),
}

/// Open the store a URL names. `s3` carries the S3 settings (endpoint, CA
/// bundle, encryption) resolved by the caller.
pub async fn open(url: &str, s3: S3Options) -> Result<Box<dyn Store>, StoreError> {
    match StoreUrl::parse(url)? {
        StoreUrl::Local(path) => Ok(Box::new(LocalStore::new(path))),
        StoreUrl::S3 { bucket, prefix } => Ok(Box::new(S3Store::connect(bucket, prefix, s3).await?)),
    }
}

/// Reject keys that are empty, absolute, or climb out of the store.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let bad = |reason: &str| StoreError::BadKey {
        key: key.to_string(),
        reason: reason.to_string(),
    };
    if key.is_empty() {
        return Err(bad("it is empty"));
    }
    if key.starts_with('/') {
        return Err(bad("it is absolute"));
    }
    if key.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
        return Err(bad("it has an empty, `.` or `..` segment"));
    }
    Ok(())
}

/// SHA-256 as lowercase hex.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes and counts what passes through it.
#[derive(Default)]
pub struct Hasher {
    sha: Sha256,
    size: u64,
}

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.size += bytes.len() as u64;
    }

    /// Bytes hashed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn finish(self) -> PutReport {
        PutReport {
            size: self.size,
            sha256: hex(&self.sha.finalize()),
        }
    }
}

/// Read until `buf` is full or the reader ends; returns how many bytes were read.
pub async fn read_full(reader: &mut (dyn AsyncRead + Send + Unpin + '_), buf: &mut [u8]) -> std::io::Result<usize> {
    use tokio::io::AsyncReadExt;
    let mut filled = 0;
    while filled < buf.len() {
        let n = reader.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(StoreUrl::parse("/var/b").unwrap(), StoreUrl::Local("/var/b".into()));
        assert_eq!(StoreUrl::parse("rel/dir").unwrap(), StoreUrl::Local("rel/dir".into()));
        assert_eq!(StoreUrl::parse("file:///var/b").unwrap(), StoreUrl::Local("/var/b".into()));
        assert_eq!(
            StoreUrl::parse("s3://my-bucket/a/b/").unwrap(),
            StoreUrl::S3 { bucket: "my-bucket".into(), prefix: "a/b".into() }
        );
        assert_eq!(
            StoreUrl::parse("s3://my-bucket").unwrap(),
            StoreUrl::S3 { bucket: "my-bucket".into(), prefix: String::new() }
        );
        for (bad, why) in [
            ("", "empty"),
            ("s3://", "no bucket"),
            ("s3://My_Bucket/x", "bucket names"),
            ("gs://b/x", "unsupported scheme `gs`"),
            ("file://relative", "absolute path"),
        ] {
            let err = StoreUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
            assert!(err.contains("s3://bucket/prefix"), "{err}");
        }
    }

    #[test]
    fn keys_cannot_escape() {
        check_key("backups/demo/manifest.json").unwrap();
        for bad in ["", "/etc/passwd", "a/../../b", "a//b", "./a"] {
            assert!(check_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hasher_matches_sha256() {
        let mut h = Hasher::default();
        h.update(b"ab");
        h.update(b"c");
        let report = h.finish();
        assert_eq!(report.size, 3);
        assert_eq!(report.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
