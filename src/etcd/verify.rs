//! Offline verification of an etcd v3 snapshot, without etcd: the answer to
//! "can this file be restored, and what is in it?".
//!
//! A snapshot (`etcdctl snapshot save`, or etcd's Maintenance/Snapshot
//! stream as `hcp-dr backup` stores it) is a bbolt database followed by 32
//! bytes: the SHA-256 of everything before them. Verifying one:
//!
//! 1. finds a valid bbolt meta page ([`Verdict::NotASnapshot`] otherwise);
//! 2. checks the file holds the pages the meta counts plus the hash
//!    ([`Verdict::Truncated`] otherwise);
//! 3. hashes the file in one streaming pass and compares with the trailing
//!    SHA-256 ([`Verdict::HashMismatch`]);
//! 4. walks every bucket page by page (see [`super::bbolt`]), checking the
//!    structure ([`Verdict::Corrupt`] when the hash matched but the database
//!    inside is damaged) and summarizing etcd's content.
//!
//! The summary reports `revision`, `etcdctl_total_keys` and `hash` computed
//! exactly as etcd 3.4's `snapshot.Status` (what `etcdctl snapshot status`
//! prints): the revision is the main revision of the last key of the `key`
//! bucket, the total counts every entry of every bucket (each revision of
//! each key, plus etcd's own bookkeeping), and the hash is a CRC-32C over each
//! bucket's name followed by its keys and values, buckets and keys in order.
//! It adds what etcdctl does not say: how many keys are live at the latest
//! revision, per resource prefix (`/kubernetes.io/secrets/`).
//!
//! Memory stays small for multi-GiB files: pages are read one at a time and
//! live keys are tracked by a 16-byte digest each.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::bbolt::{self, BoltError, Db, Meta, Visitor};
use crate::archive::encryption::{self, EncryptionError, Identities};
use crate::store::{self, S3Options, Store, StoreError, StoreUrl, hex};

/// Bytes of etcd's trailing SHA-256.
pub const HASH_LEN: u64 = 32;
/// At most this many warnings are listed; the rest are counted.
const MAX_WARNINGS: usize = 10;

/// Why a snapshot could not be checked at all (a verdict is given otherwise).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The snapshot file could not be opened.
    #[error("cannot open snapshot {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The path is a directory or a device, not a snapshot file.
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    /// Reading the snapshot failed part-way.
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The argument is neither a file path nor a URL naming one object.
    #[error("`{given}`: {reason}")]
    Source { given: String, reason: String },
    /// The store URL is malformed or the store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The object could not be fetched from the store.
    #[error("fetching {url}: {source}")]
    Fetch {
        url: String,
        #[source]
        source: StoreError,
    },
    /// The object could not be copied to a scratch file to be checked.
    #[error("copying {url} to the scratch file {}: {source} (set TMPDIR to a directory with room for the snapshot)", path.display())]
    Scratch {
        url: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The scratch directory has not room enough for the copy.
    #[error(transparent)]
    NoSpace(#[from] crate::space::NoSpace),
    /// The snapshot is encrypted (`hcp-dr backup --encrypt-to`) and cannot
    /// be read without the right identity.
    #[error(transparent)]
    Encrypted(#[from] EncryptionError),
}

/// What a snapshot is, in one word (and the details to act on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Verdict {
    /// The trailing SHA-256 matches and the database reads cleanly.
    Ok,
    /// The trailing SHA-256 does not match the bytes before it: the file was
    /// damaged after etcd wrote it.
    HashMismatch { expected: String, actual: String },
    /// The file is shorter than its meta page says (pages times page size,
    /// plus the 32-byte hash): a copy or upload was cut short.
    Truncated {
        expected_size: u64,
        actual_size: u64,
    },
    /// No bbolt database with etcd's trailing hash.
    NotASnapshot { reason: String },
    /// The hash matches, but the database inside is damaged: etcd sent a
    /// damaged database.
    Corrupt { reason: String },
}

impl Verdict {
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Ok)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Ok => write!(f, "OK"),
            Verdict::HashMismatch { expected, actual } => write!(
                f,
                "HASH MISMATCH: the trailing SHA-256 is {expected} but the content hashes to {actual}"
            ),
            Verdict::Truncated {
                expected_size,
                actual_size,
            } => write!(
                f,
                "TRUNCATED: {actual_size} bytes, but the database and its hash take {expected_size} ({} missing)",
                expected_size - actual_size
            ),
            Verdict::NotASnapshot { reason } => write!(f, "NOT A SNAPSHOT: {reason}"),
            Verdict::Corrupt { reason } => write!(
                f,
                "CORRUPT: the hash matches but the database inside is damaged: {reason}"
            ),
        }
    }
}

/// What a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotSummary {
    /// As `etcdctl snapshot status`: the main revision of the last key in `key`.
    pub revision: i64,
    /// As `etcdctl snapshot status` "total keys": entries in all buckets.
    pub etcdctl_total_keys: u64,
    /// As `etcdctl snapshot status` "hash": CRC-32C over bucket names, keys and values.
    pub hash: u32,
    /// Database bytes (pages in use times page size): etcdctl's "total size".
    pub db_size: u64,
    pub page_size: u32,
    /// bbolt transaction id of the meta page used.
    pub txid: u64,
    /// Entries in `key`: every stored revision of every key, deletions included.
    pub revisions: u64,
    /// Deletions among them (tombstones).
    pub tombstones: u64,
    /// Distinct keys whose latest revision is not a deletion: what a range
    /// over all keys returns at `revision`.
    pub live_keys: u64,
    /// Live keys per resource prefix (the first two path segments,
    /// `/kubernetes.io/secrets/`).
    pub live_keys_by_prefix: BTreeMap<String, u64>,
    /// Entries per bucket.
    pub buckets: BTreeMap<String, u64>,
    /// `meta/consistent_index`: the raft index the database includes.
    pub consistent_index: Option<u64>,
    /// `meta/finishedCompactRev`: revisions before it were compacted away.
    pub compact_revision: Option<i64>,
    /// `meta/scheduledCompactRev`.
    pub scheduled_compact_revision: Option<i64>,
    /// Pages of the B+trees and the freelist.
    pub pages: bbolt::WalkStats,
    /// Oddities that do not make the snapshot unusable.
    pub warnings: Vec<String>,
}

impl SnapshotSummary {
    /// The revision etcd serves once started on this database: the last
    /// key's, or the compacted revision when a compaction removed every
    /// later entry (deletions compacted away, a restore with
    /// `--bump-revision --mark-compacted`). etcd's mvcc restore takes the
    /// same maximum; `etcdctl snapshot status` shows the last key's only.
    pub fn store_revision(&self) -> i64 {
        self.revision.max(self.compact_revision.unwrap_or(0))
    }
}

/// The result of verifying one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The file or object checked.
    pub source: String,
    pub verdict: Verdict,
    pub file_size: u64,
    /// The content, when the database could be read (for a hash mismatch it
    /// is what the damaged file says, not to be trusted).
    pub summary: Option<SnapshotSummary>,
    /// Why the database could not be read, when it could not.
    pub structure_error: Option<String>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.verdict.is_ok()
    }
}

/// Verify the snapshot file at `path`. An age-encrypted one is refused
/// ([`VerifyError::Encrypted`]): see [`verify_file_with`].
pub fn verify_file(path: &Path) -> Result<Report, VerifyError> {
    verify_file_with(path, &Decryption::default())
}

/// How to read snapshots that may be age-encrypted (`hcp-dr backup
/// --encrypt-to`): the identities to try, and the recipients the backup's
/// manifest names (for messages).
#[derive(Debug, Clone, Copy, Default)]
pub struct Decryption<'a> {
    pub identities: Option<&'a Identities>,
    pub recipients: &'a [String],
}

/// Verify the snapshot file at `path`, decrypting it with `decryption`
/// when it is age-encrypted. The plaintext is never written anywhere: the
/// database is read at random through age's seekable reader over the
/// encrypted file. A zstd-compressed snapshot (an hcp-dr backup's, format
/// version 3), encrypted or not, is decompressed into a private scratch
/// file first (bbolt's pages are read at random).
pub fn verify_file_with(path: &Path, decryption: &Decryption<'_>) -> Result<Report, VerifyError> {
    let open = |source| VerifyError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(open)?;
    let metadata = file.metadata().map_err(open)?;
    if !metadata.is_file() {
        return Err(VerifyError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let source = path.display().to_string();
    let mut head = [0u8; 32];
    let n = read_head(&mut file, &mut head).map_err(open)?;
    if crate::archive::compression::is_zstd(&head[..n]) {
        return check_decompressed(file, &source);
    }
    if !encryption::is_age(&head[..n]) {
        // a second handle hashes the file beside the page walk: two cores, one pass each
        let second = File::open(path).ok();
        return check(file, metadata.len(), &source, second);
    }
    let Some(identities) = decryption.identities else {
        return Err(EncryptionError::IdentityNeeded {
            what: format!("snapshot {source}"),
            recipients: decryption.recipients.to_vec(),
        }
        .into());
    };
    if !decryption.recipients.is_empty() {
        identities.check(&format!("snapshot {source}"), decryption.recipients)?;
    }
    let mut reader = encryption::decrypting_file(file, identities, &format!("snapshot {source}"), decryption.recipients)?;
    let read_error = |err| VerifyError::Read {
        what: source.clone(),
        source: err,
    };
    let mut head = [0u8; 4];
    let n = reader.read(&mut head).map_err(read_error)?;
    reader.seek(SeekFrom::Start(0)).map_err(read_error)?;
    if crate::archive::compression::is_zstd(&head[..n]) {
        return check_decompressed(reader, &source);
    }
    let len = reader.seek(SeekFrom::End(0)).map_err(read_error)?;
    reader.seek(SeekFrom::Start(0)).map_err(read_error)?;
    check(reader, len, &source, None)
}

/// Decompress a zstd snapshot into a private scratch file (removed when
/// done) and verify that.
fn check_decompressed(compressed: impl Read, source: &str) -> Result<Report, VerifyError> {
    let scratch_error = |e: std::io::Error| VerifyError::Scratch {
        url: source.to_string(),
        path: std::env::temp_dir(),
        source: e,
    };
    let mut scratch = tempfile::Builder::new().prefix("hcp-dr-verify-").suffix(".db").tempfile().map_err(scratch_error)?;
    let read_error = |e: std::io::Error| VerifyError::Read {
        what: format!("{source} (zstd)"),
        source: e,
    };
    let mut decoder = zstd::stream::read::Decoder::new(compressed).map_err(read_error)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = decoder.read(&mut buf).map_err(read_error)?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(scratch.as_file_mut(), &buf[..n]).map_err(scratch_error)?;
    }
    let mut file = scratch.reopen().map_err(scratch_error)?;
    let len = file.seek(SeekFrom::End(0)).map_err(scratch_error)?;
    file.seek(SeekFrom::Start(0)).map_err(scratch_error)?;
    check(file, len, source, scratch.reopen().ok())
}

/// Read up to `buf.len()` bytes from the start, then go back to the start.
fn read_head(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(&mut buf[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(filled)
}

/// Verify a snapshot of `len` bytes read from `reader`.
pub fn verify_reader<R: Read + Seek>(reader: R, len: u64) -> Result<Report, VerifyError> {
    check(reader, len, "(reader)", None)
}

/// Fetch `key` from `store` into a private scratch file (under `TMPDIR`),
/// verify it and remove it.
pub async fn verify_store_object(store: &dyn Store, key: &str) -> Result<Report, VerifyError> {
    verify_store_object_with(store, key, &Decryption::default()).await
}

/// As [`verify_store_object`], decrypting with `decryption` when the object
/// is age-encrypted: the scratch file holds the object as stored (the
/// ciphertext), never the plaintext.
pub async fn verify_store_object_with(store: &dyn Store, key: &str, decryption: &Decryption<'_>) -> Result<Report, VerifyError> {
    let url = format!("{}/{key}", store.url().trim_end_matches('/'));
    let mut body = store.get(key).await.map_err(|source| VerifyError::Fetch {
        url: url.clone(),
        source,
    })?;
    let scratch = Scratch::new();
    let scratch_error = |source| VerifyError::Scratch {
        url: url.clone(),
        path: scratch.0.clone(),
        source,
    };
    let file = scratch.create().map_err(scratch_error)?;
    let mut file = tokio::fs::File::from_std(file);
    let copied = async {
        tokio::io::copy(&mut body, &mut file).await?;
        tokio::io::AsyncWriteExt::flush(&mut file).await
    };
    if let Err(err) = copied.await {
        let written = std::fs::metadata(&scratch.0).map_or(0, |m| m.len());
        return Err(match crate::space::scratch_filled_up(&err, &scratch.0, &url, written) {
            Some(full) => VerifyError::NoSpace(full),
            None => scratch_error(err),
        });
    }
    drop(file);
    let path = scratch.0.clone();
    let identities = decryption.identities.cloned();
    let recipients = decryption.recipients.to_vec();
    let mut report = tokio::task::spawn_blocking(move || {
        verify_file_with(
            &path,
            &Decryption {
                identities: identities.as_ref(),
                recipients: &recipients,
            },
        )
    })
    .await
        .map_err(|err| VerifyError::Read {
            what: url.clone(),
            source: std::io::Error::other(err),
        })??;
    report.source = url;
    Ok(report)
}

/// Read the plaintext snapshot copy at `path` offline (off the async
/// threads: a multi-GiB walk).
pub async fn verify_copy(path: &Path) -> Result<Report, VerifyError> {
    let path = path.to_path_buf();
    let what = path.display().to_string();
    tokio::task::spawn_blocking(move || verify_file(&path))
        .await
        .map_err(|err| VerifyError::Read { what, source: std::io::Error::other(err) })?
}

/// What `hcp-dr snapshot verify` was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotSource {
    /// A file (a plain path or `file:///path`).
    File(PathBuf),
    /// One object: the store holding it and its key there.
    Object { store_url: String, key: String },
}

impl SnapshotSource {
    /// A path, `file:///path`, or `s3://bucket/prefix/.../name.db`.
    pub fn parse(given: &str) -> Result<SnapshotSource, VerifyError> {
        let bad = |reason: &str| VerifyError::Source {
            given: given.to_string(),
            reason: reason.to_string(),
        };
        if given.trim().is_empty() {
            return Err(bad(
                "empty: give a snapshot file or a URL such as s3://bucket/prefix/etcd/etcd-0.db",
            ));
        }
        if !given.contains("://") {
            return Ok(SnapshotSource::File(PathBuf::from(given)));
        }
        match StoreUrl::parse(given)? {
            StoreUrl::Local(path) => Ok(SnapshotSource::File(path)),
            StoreUrl::S3 { bucket, prefix } => {
                if given.ends_with('/') || prefix.is_empty() {
                    return Err(bad(
                        "this names a bucket or folder, not an object: name the snapshot, e.g. s3://bucket/prefix/etcd/etcd-0.db",
                    ));
                }
                let (folder, key) = prefix.rsplit_once('/').unwrap_or(("", &prefix));
                let store_url = if folder.is_empty() {
                    format!("s3://{bucket}")
                } else {
                    format!("s3://{bucket}/{folder}")
                };
                Ok(SnapshotSource::Object {
                    store_url,
                    key: key.to_string(),
                })
            }
        }
    }
}

/// Verify what `given` names (see [`SnapshotSource::parse`]); `s3` holds the
/// S3 settings for `s3://` URLs.
pub async fn verify_source(given: &str, s3: S3Options) -> Result<Report, VerifyError> {
    verify_source_with(given, s3, None).await
}

/// As [`verify_source`], decrypting an age-encrypted snapshot with
/// `identities`. When the snapshot sits in a backup folder
/// (`<backup>/etcd/<member>.db`), the backup's manifest is read for the
/// recipients it was encrypted to, so a missing or wrong identity is
/// reported with them.
pub async fn verify_source_with(given: &str, s3: S3Options, identities: Option<&Identities>) -> Result<Report, VerifyError> {
    match SnapshotSource::parse(given)? {
        SnapshotSource::File(path) => {
            let what = path.display().to_string();
            let recipients = path
                .parent()
                .filter(|p| p.file_name().is_some_and(|n| n == "etcd"))
                .and_then(Path::parent)
                .and_then(|backup| std::fs::read(backup.join(crate::archive::MANIFEST)).ok())
                .and_then(|bytes| crate::archive::Manifest::parse(&bytes).ok())
                .map(|m| m.recipients().to_vec())
                .unwrap_or_default();
            let identities = identities.cloned();
            tokio::task::spawn_blocking(move || {
                verify_file_with(
                    &path,
                    &Decryption {
                        identities: identities.as_ref(),
                        recipients: &recipients,
                    },
                )
            })
            .await
            .map_err(|err| VerifyError::Read {
                what,
                source: std::io::Error::other(err),
            })?
        }
        SnapshotSource::Object { store_url, key } => {
            let recipients = match store_url.strip_suffix("/etcd") {
                Some(backup) => match store::open(backup, s3.clone()).await {
                    Ok(store) => crate::archive::check::read_manifest_at(store.as_ref(), crate::archive::MANIFEST)
                        .await
                        .map(|m| m.recipients().to_vec())
                        .unwrap_or_default(),
                    Err(_) => Vec::new(),
                },
                None => Vec::new(),
            };
            let store = store::open(&store_url, s3).await?;
            verify_store_object_with(
                store.as_ref(),
                &key,
                &Decryption {
                    identities,
                    recipients: &recipients,
                },
            )
            .await
        }
    }
}

/// Refuse before copying `size` bytes of `what` into a scratch file when
/// `TMPDIR` has not room for them.
pub fn ensure_scratch_room(size: u64, what: &str) -> Result<(), VerifyError> {
    crate::space::ensure_scratch(size, what).map_err(VerifyError::NoSpace)
}

/// A scratch file removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!(
            "hcp-dr-verify-{}-{nanos}-{}.db",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        Scratch(std::env::temp_dir().join(name))
    }

    /// Create it new, readable by the owner only (snapshots hold secrets).
    fn create(&self) -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.0)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `second`: another handle to the same bytes (its own offset), which
/// hashes them on a thread of its own while `reader` walks the pages.
fn check<R: Read + Seek>(mut reader: R, len: u64, source: &str, second: Option<File>) -> Result<Report, VerifyError> {
    let read_error = |err: std::io::Error| VerifyError::Read {
        what: source.to_string(),
        source: err,
    };
    let report = |verdict, summary, structure_error| Report {
        source: source.to_string(),
        verdict,
        file_size: len,
        summary,
        structure_error,
    };
    let meta = match bbolt::read_meta(&mut reader, len) {
        Ok(meta) => meta,
        Err(BoltError::Io { source, .. }) => return Err(read_error(source)),
        Err(err) => {
            return Ok(report(
                Verdict::NotASnapshot {
                    reason: err.to_string(),
                },
                None,
                None,
            ));
        }
    };
    let db_size = meta.db_size();
    let walk = |reader: &mut R, data_len: u64| {
        let mut content = Content::default();
        match Db::open(reader, data_len).and_then(|mut db| db.walk(&mut content)) {
            Ok(pages) => Ok((Some(content.finish(&meta, pages).map_err(|e| VerifyError::Scratch { url: source.to_string(), path: std::env::temp_dir(), source: e })?), None)),
            Err(BoltError::Io { source, .. }) => Err(read_error(source)),
            Err(err) => Ok((None, Some(err.to_string()))),
        }
    };
    // A whole number of pages, at least those in use: bbolt's own data file,
    // which has no trailing hash (and may hold more pages than the meta uses).
    if len >= db_size && (len - db_size).is_multiple_of(u64::from(meta.page_size)) {
        let (summary, structure_error) = walk(&mut reader, len)?;
        let verdict = Verdict::NotASnapshot {
            reason: "a bbolt database without etcd's trailing SHA-256 (its size is a whole number of pages): \
                     a member's data file (member/snap/db), not a snapshot"
                .into(),
        };
        return Ok(report(verdict, summary, structure_error));
    }
    let expected_size = db_size.saturating_add(HASH_LEN);
    if len < expected_size {
        let verdict = Verdict::Truncated {
            expected_size,
            actual_size: len,
        };
        return Ok(report(verdict, None, None));
    }
    let hashing = second.map(|mut file| std::thread::spawn(move || trailing_hash(&mut file, len)));
    let ((expected, actual), (mut summary, structure_error)) = match hashing {
        Some(thread) => {
            let walked = walk(&mut reader, len - HASH_LEN)?;
            let hashed = thread.join().map_err(|_| read_error(std::io::Error::other("the hashing thread panicked")))?.map_err(read_error)?;
            (hashed, walked)
        }
        None => {
            let hashed = trailing_hash(&mut reader, len).map_err(read_error)?;
            (hashed, walk(&mut reader, len - HASH_LEN)?)
        }
    };
    let verdict = match (expected == actual, &structure_error) {
        (true, None) => Verdict::Ok,
        (true, Some(reason)) => Verdict::Corrupt {
            reason: reason.clone(),
        },
        (false, _) => Verdict::HashMismatch {
            expected: hex(&expected),
            actual: hex(&actual),
        },
    };
    let extra = len - expected_size;
    if let Some(summary) = summary.as_mut().filter(|_| extra > 0 && verdict.is_ok()) {
        summary.warnings.push(format!(
            "{extra} bytes lie between the database's last page and the trailing hash"
        ));
    }
    Ok(report(verdict, summary, structure_error))
}

/// Hash the first `len - 32` bytes in one pass; return (trailing hash, computed hash).
fn trailing_hash<R: Read + Seek>(
    reader: &mut R,
    len: u64,
) -> std::io::Result<([u8; 32], [u8; 32])> {
    reader.seek(SeekFrom::Start(0))?;
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len - HASH_LEN;
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let n = reader.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the file ended {left} bytes early: it changed while being read"),
            ));
        }
        sha.update(&buf[..n]);
        left -= n as u64;
    }
    let mut trailing = [0u8; 32];
    reader.read_exact(&mut trailing)?;
    Ok((trailing, sha.finalize().into()))
}

/// CRC-32C (Castagnoli), as Go's `crc32.MakeTable(crc32.Castagnoli)`:
/// the `crc32c` crate (SSE4.2 / ARMv8 CRC instructions when the CPU has
/// them, a software fallback otherwise).
#[derive(Debug, Clone, Copy, Default)]
pub struct Crc32c(u32);

impl Crc32c {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, bytes);
    }

    pub fn finish(&self) -> u32 {
        self.0
    }
}

/// The resource prefix of a key: its first two path segments with their
/// slashes (`/kubernetes.io/secrets/`), or up to its last `/` when shorter.
pub fn resource_prefix(key: &[u8]) -> String {
    let start = usize::from(key.first() == Some(&b'/'));
    let end = key
        .iter()
        .enumerate()
        .skip(start)
        .filter(|(_, b)| **b == b'/')
        .nth(1)
        .or_else(|| key.iter().enumerate().rev().find(|(_, b)| **b == b'/'))
        .map(|(i, _)| i + 1)
        .unwrap_or(0);
    String::from_utf8_lossy(&key[..end]).into_owned()
}

/// Field 1 (the key) of an `mvccpb.KeyValue`.
fn key_value_key(message: &[u8]) -> Option<&[u8]> {
    fn varint(buf: &[u8], at: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = *buf.get(*at)?;
            *at += 1;
            value |= u64::from(byte & 0x7f).checked_shl(shift)?;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let mut at = 0;
    while at < message.len() {
        let tag = varint(message, &mut at)?;
        match tag & 7 {
            0 => {
                varint(message, &mut at)?;
            }
            1 => at = at.checked_add(8)?,
            2 => {
                let size = usize::try_from(varint(message, &mut at)?).ok()?;
                let end = at.checked_add(size)?;
                let bytes = message.get(at..end)?;
                if tag >> 3 == 1 {
                    return Some(bytes);
                }
                at = end;
            }
            5 => at = at.checked_add(4)?,
            _ => return None,
        }
    }
    None
}

fn main_revision(bytes: &[u8]) -> Option<i64> {
    let main: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(main) as i64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Bucket {
    #[default]
    Other,
    Key,
    Meta,
}

/// Collects the summary while the database is walked.
#[derive(Default)]
struct Content {
    crc: Crc32c,
    total: u64,
    bucket: Bucket,
    bucket_name: String,
    buckets: BTreeMap<String, u64>,
    revision: i64,
    revisions: u64,
    tombstones: u64,
    /// Every key's latest state (by the first 8 bytes of its SHA-256:
    /// a collision, which would miscount one key, stays below one in a
    /// million at the 8 million keys of a full 8 GiB database), in bounded
    /// memory.
    latest: super::latest_keys::LatestKeys,
    prefixes: Vec<String>,
    prefix_ids: HashMap<String, u32>,
    consistent_index: Option<u64>,
    compact_revision: Option<i64>,
    scheduled_compact_revision: Option<i64>,
    warnings: Vec<String>,
    more_warnings: u64,
}

impl Content {
    fn warn(&mut self, warning: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(warning);
        } else {
            self.more_warnings += 1;
        }
    }

    fn revision_entry(&mut self, key: &[u8], value: &[u8]) {
        self.revisions += 1;
        let tombstone = match key.len() {
            17 if key[8] == b'_' => false,
            18 if key[8] == b'_' && key[17] == b't' => true,
            _ => {
                self.warn(format!(
                    "`key` holds an entry whose key is not a revision: {}",
                    hex(key)
                ));
                return;
            }
        };
        let Some(user_key) = key_value_key(value) else {
            self.warn(format!(
                "revision {} holds a value that is not a KeyValue",
                hex(key)
            ));
            return;
        };
        self.tombstones += u64::from(tombstone);
        let prefix = resource_prefix(user_key);
        let next = self.prefixes.len() as u32;
        let id = *self.prefix_ids.entry(prefix.clone()).or_insert(next);
        if id == next {
            self.prefixes.push(prefix);
        }
        let digest: [u8; 32] = Sha256::digest(user_key).into();
        let mut short = [0u8; 8];
        short.copy_from_slice(&digest[..8]);
        self.latest.push(u64::from_le_bytes(short), id, !tombstone);
    }

    fn meta_entry(&mut self, key: &[u8], value: &[u8]) {
        let be64 = |v: &[u8]| v.try_into().ok().map(u64::from_be_bytes);
        match key {
            b"consistent_index" => self.consistent_index = be64(value),
            b"finishedCompactRev" => self.compact_revision = main_revision(value),
            b"scheduledCompactRev" => self.scheduled_compact_revision = main_revision(value),
            _ => {}
        }
    }

    /// The summary; an error when the live keys could not be counted (a
    /// scratch file of the count could not be written or read back).
    fn finish(mut self, meta: &Meta, pages: bbolt::WalkStats) -> std::io::Result<SnapshotSummary> {
        let mut by_id: BTreeMap<u32, u64> = BTreeMap::new();
        let mut live = 0;
        std::mem::take(&mut self.latest).finish(|id, alive| {
            if alive {
                live += 1;
                *by_id.entry(id).or_insert(0) += 1;
            }
        })?;
        let mut by_prefix = BTreeMap::new();
        for (id, count) in by_id {
            *by_prefix.entry(self.prefixes.get(id as usize).cloned().unwrap_or_default()).or_insert(0) += count;
        }
        if self.more_warnings > 0 {
            self.warnings
                .push(format!("... and {} more warnings", self.more_warnings));
        }
        Ok(SnapshotSummary {
            revision: self.revision,
            etcdctl_total_keys: self.total,
            hash: self.crc.finish(),
            db_size: meta.db_size(),
            page_size: meta.page_size,
            txid: meta.txid,
            revisions: self.revisions,
            tombstones: self.tombstones,
            live_keys: live,
            live_keys_by_prefix: by_prefix,
            buckets: self.buckets,
            consistent_index: self.consistent_index,
            compact_revision: self.compact_revision,
            scheduled_compact_revision: self.scheduled_compact_revision,
            pages,
            warnings: self.warnings,
        })
    }
}

impl Visitor for Content {
    fn bucket(&mut self, name: &[u8]) {
        self.crc.update(name);
        self.bucket = match name {
            b"key" => Bucket::Key,
            b"meta" => Bucket::Meta,
            _ => Bucket::Other,
        };
        self.bucket_name = String::from_utf8_lossy(name).into_owned();
        self.buckets.insert(self.bucket_name.clone(), 0);
    }

    fn entry(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.crc.update(key);
        self.crc.update(value.unwrap_or_default());
        self.total += 1;
        if let Some(count) = self.buckets.get_mut(&self.bucket_name) {
            *count += 1;
        }
        match (self.bucket, value) {
            (Bucket::Key, _) => {
                // etcdctl takes every key's main revision; the last is the highest.
                if let Some(revision) = main_revision(key) {
                    self.revision = revision;
                }
                match value {
                    Some(value) => self.revision_entry(key, value),
                    None => self.warn("`key` holds a nested bucket".into()),
                }
            }
            (Bucket::Meta, Some(value)) => self.meta_entry(key, value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::super::bbolt::testdb::{self, PAGE};
    use super::*;

    fn snapshot(db: &[u8]) -> Vec<u8> {
        let mut out = db.to_vec();
        out.extend_from_slice(&Sha256::digest(db));
        out
    }

    fn verify(bytes: &[u8]) -> Report {
        verify_reader(Cursor::new(bytes), bytes.len() as u64).unwrap()
    }

    #[test]
    fn crc32c_vectors() {
        let mut crc = Crc32c::default();
        crc.update(b"123456789");
        assert_eq!(crc.finish(), 0xE306_9283);
        let mut split = Crc32c::default();
        split.update(b"1234");
        split.update(b"");
        split.update(b"56789");
        assert_eq!(split.finish(), 0xE306_9283);
        assert_eq!(Crc32c::default().finish(), 0);
    }

    #[test]
    fn prefixes() {
        for (key, prefix) in [
            ("/kubernetes.io/secrets/ns/name", "/kubernetes.io/secrets/"),
            ("/registry/configmaps/ns/cm", "/registry/configmaps/"),
            (
                "/kubernetes.io/namespaces/default",
                "/kubernetes.io/namespaces/",
            ),
            ("/kubernetes.io/big", "/kubernetes.io/"),
            ("compact_rev_key", ""),
            ("a/b/c/d", "a/b/"),
            ("/", "/"),
        ] {
            assert_eq!(resource_prefix(key.as_bytes()), prefix, "{key}");
        }
    }

    #[test]
    fn key_value_keys() {
        assert_eq!(
            key_value_key(&testdb::key_value(b"/a/b", 300, b"v")),
            Some(&b"/a/b"[..])
        );
        // field 1 after other fields
        assert_eq!(
            key_value_key(&[0x10, 0x05, 0x0a, 0x01, b'k']),
            Some(&b"k"[..])
        );
        for bad in [
            &[][..],
            &[0x0a],
            &[0x0a, 0x05, b'k'],
            &[0x10],
            &[0x0b],
            &[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
        ] {
            assert_eq!(key_value_key(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn summarizes_a_hand_built_snapshot() {
        let db = testdb::etcd_like();
        let report = verify(&snapshot(&db));
        assert_eq!(report.verdict, Verdict::Ok, "{report:?}");
        let summary = report.summary.unwrap();
        assert_eq!(summary.revision, 7);
        assert_eq!(
            summary.etcdctl_total_keys, 8,
            "six revisions and two meta keys"
        );
        assert_eq!(summary.revisions, 6);
        assert_eq!(summary.tombstones, 1);
        // /a/x/1 deleted, /a/x/2 overwritten, /a/x/3 and /b/y/1 untouched
        assert_eq!(summary.live_keys, 3);
        assert_eq!(
            summary.live_keys_by_prefix,
            BTreeMap::from([("/a/x/".into(), 2), ("/b/y/".into(), 1)])
        );
        assert_eq!(
            summary.buckets,
            BTreeMap::from([("key".into(), 6), ("meta".into(), 2)])
        );
        assert_eq!(summary.consistent_index, Some(42));
        assert_eq!(summary.compact_revision, Some(3));
        assert_eq!(summary.store_revision(), 7, "the last key is above the compaction");
        // every entry above the compaction compacted away (a restore with
        // --bump-revision --mark-compacted): etcd serves the compacted revision
        let bumped = SnapshotSummary { compact_revision: Some(1007), ..summary.clone() };
        assert_eq!((bumped.revision, bumped.store_revision()), (7, 1007));
        assert_eq!(summary.db_size, 7 * PAGE as u64);
        assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    }

    #[test]
    fn verdicts() {
        let db = testdb::etcd_like();
        let good = snapshot(&db);

        let mut flipped = good.clone();
        flipped[3 * PAGE + 100] ^= 0x01;
        match verify(&flipped).verdict {
            Verdict::HashMismatch { expected, actual } => {
                assert_eq!(expected, hex(&good[good.len() - 32..]));
                assert_eq!(actual, hex(&Sha256::digest(&flipped[..flipped.len() - 32])));
            }
            other => panic!("{other:?}"),
        }

        for cut in [
            good.len() - 1,
            good.len() - 31,
            5 * PAGE + 17,
            PAGE + 3,
            200,
        ] {
            let report = verify(&good[..cut]);
            assert_eq!(
                report.verdict,
                Verdict::Truncated {
                    expected_size: good.len() as u64,
                    actual_size: cut as u64
                },
                "cut at {cut}"
            );
        }

        // a raw database file, no hash, exactly the pages in use or more
        let mut raw = db.clone();
        for _ in 0..2 {
            let report = verify(&raw);
            assert!(
                matches!(&report.verdict, Verdict::NotASnapshot { reason } if reason.contains("member/snap/db")),
                "{report:?}"
            );
            assert_eq!(report.summary.map(|s| s.live_keys), Some(3));
            raw.extend(vec![0u8; 2 * PAGE]);
        }

        for junk in [
            vec![],
            vec![0u8; 10],
            vec![0x42u8; 10_000],
            b"SQLite format 3\0".repeat(512),
        ] {
            let report = verify(&junk);
            assert!(
                matches!(report.verdict, Verdict::NotASnapshot { .. }),
                "{report:?}"
            );
            assert!(report.summary.is_none());
        }

        // a damaged tree under a matching hash: etcd sent a broken database
        let mut broken = db.clone();
        broken[3 * PAGE..4 * PAGE].copy_from_slice(&testdb::branch(3, &[(b"a", 3)]));
        let report = verify(&snapshot(&broken));
        assert!(
            matches!(&report.verdict, Verdict::Corrupt { reason } if reason.contains("reached twice")),
            "{report:?}"
        );
    }

    #[test]
    fn odd_entries_are_warnings() {
        let good_kv = testdb::key_value(b"/a/b/c", 2, b"v");
        let entries: [(u32, &[u8], &[u8]); 3] = [
            (0, &testdb::revision_key(2, 0, false), &good_kv),
            (0, &testdb::revision_key(3, 0, false), b"\x0b"),
            (0, b"short", b""),
        ];
        let root = testdb::leaf(
            2,
            &[(
                bbolt::BUCKET_LEAF_FLAG,
                b"key",
                &testdb::inline_bucket(&entries),
            )],
            PAGE,
        );
        let mut db = testdb::meta_page(0, 2, 3, 2, bbolt::NO_FREELIST);
        db.extend(testdb::meta_page(1, 2, 3, 1, bbolt::NO_FREELIST));
        db.extend(root);
        let report = verify(&snapshot(&db));
        assert_eq!(report.verdict, Verdict::Ok);
        let summary = report.summary.unwrap();
        assert_eq!(summary.live_keys, 1);
        assert_eq!(summary.revision, 3);
        assert_eq!(summary.warnings.len(), 2, "{:?}", summary.warnings);
    }

    #[test]
    fn no_mutation_of_a_snapshot_panics() {
        let good = snapshot(&testdb::etcd_like());
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut damaged, mut refused) = (0, 0);
        for _ in 0..3000 {
            let mut bytes = good.clone();
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
            let len = if next() % 8 == 0 {
                (next() % bytes.len() as u64) as usize
            } else {
                bytes.len()
            };
            if bytes[at] != good[at] || len < bytes.len() {
                damaged += 1;
                refused += usize::from(!verify(&bytes[..len]).is_ok());
            }
        }
        assert!(damaged > 2500, "{damaged}");
        assert_eq!(refused, damaged, "every damaged copy is refused");
    }

    #[test]
    fn sources() {
        assert_eq!(
            SnapshotSource::parse("backup/etcd-0.db").unwrap(),
            SnapshotSource::File("backup/etcd-0.db".into())
        );
        assert_eq!(
            SnapshotSource::parse("file:///b/etcd-0.db").unwrap(),
            SnapshotSource::File("/b/etcd-0.db".into())
        );
        assert_eq!(
            SnapshotSource::parse("s3://bucket/p/q/etcd/etcd-0.db").unwrap(),
            SnapshotSource::Object {
                store_url: "s3://bucket/p/q/etcd".into(),
                key: "etcd-0.db".into()
            }
        );
        assert_eq!(
            SnapshotSource::parse("s3://bucket/etcd-0.db").unwrap(),
            SnapshotSource::Object {
                store_url: "s3://bucket".into(),
                key: "etcd-0.db".into()
            }
        );
        for (bad, why) in [
            ("", "empty"),
            ("s3://bucket", "not an object"),
            ("s3://bucket/dir/", "not an object"),
            ("gs://b/x.db", "unsupported scheme"),
        ] {
            let err = SnapshotSource::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn missing_files_and_directories_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            verify_file(&dir.path().join("none.db")),
            Err(VerifyError::Open { .. })
        ));
        assert!(matches!(
            verify_file(dir.path()),
            Err(VerifyError::NotAFile { .. })
        ));
    }

    #[tokio::test]
    async fn store_objects_are_fetched_checked_and_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::LocalStore::new(dir.path().join("store"));
        let bytes = snapshot(&testdb::etcd_like());
        store
            .put("b/etcd/etcd-0.db", Box::new(&bytes[..]))
            .await
            .unwrap();
        let scratch_before = scratch_files();
        let report = verify_store_object(&store, "b/etcd/etcd-0.db")
            .await
            .unwrap();
        assert_eq!(report.verdict, Verdict::Ok);
        assert!(
            report.source.ends_with("/store/b/etcd/etcd-0.db"),
            "{}",
            report.source
        );
        assert_eq!(report.summary.unwrap().revision, 7);
        assert_eq!(
            scratch_files(),
            scratch_before,
            "the scratch copy is removed"
        );
        let err = verify_store_object(&store, "b/etcd/missing.db")
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                VerifyError::Fetch {
                    source: StoreError::NotFound { .. },
                    ..
                }
            ),
            "{err}"
        );
    }

    fn scratch_files() -> usize {
        let prefix = format!("hcp-dr-verify-{}-", std::process::id());
        std::fs::read_dir(std::env::temp_dir())
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .count()
            })
            .unwrap_or(0)
    }
}
