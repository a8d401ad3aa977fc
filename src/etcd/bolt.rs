//! Appending revisions to an etcd v3.4 snapshot file directly, with no etcd
//! running: a point-in-time restore writes the stream's revisions into the
//! base snapshot's bbolt file instead of replaying them through a scratch
//! etcd's gRPC API (one transaction a revision, about 1,000 revisions a
//! second, bound by etcd's CPU).
//!
//! What etcd 3.4 (`mvcc/kvstore_txn.go`) writes for one revision `R`:
//!
//! ```text
//! bucket "key":   R(8, big-endian) '_' sub(8, big-endian)        -> mvccpb.KeyValue of a put
//!                 R(8, big-endian) '_' sub(8, big-endian) 't'    -> mvccpb.KeyValue{key} (a delete)
//! bucket "lease": lease ID (8, big-endian)                        -> leasepb.Lease{ID, TTL}
//! ```
//!
//! `sub` counts the changes of the revision from 0, in order. Revisions
//! only grow, so every entry appended sorts after every entry there is:
//! the key bucket's leaves stay where they are (a 1 GiB base is not
//! rewritten), only its branch pages are read, and new leaves are written
//! after the old high-water mark as they fill (memory holds one leaf and
//! the first key and page of each leaf, not the revisions). At
//! [`Appender::finish`] a fresh branch level (or levels) is built over all
//! leaves, the lease bucket is rewritten when leases were added, the root
//! bucket's page is rewritten with the new bucket headers (every other
//! bucket copied verbatim), and a new meta page with the next transaction
//! id goes into the slot bbolt would use (`txid % 2`).
//!
//! The meta names no freelist (`pgidNoFreelist`): bbolt 1.3.6 (what etcd
//! 3.4.23 vendors) then rebuilds the freelist by scanning what is reachable
//! (`DB.loadFreelist`, also on a read-only open through `Tx.Check`), so the
//! pages the old tree used, now unreachable, are free without being listed.
//! Nothing in the `meta` bucket changes: `consistent_index` is rewritten by
//! `etcdctl snapshot restore` (its `mvcc` store's `Commit` saves the new
//! index) and the compaction marks stay true.
//!
//! The file is changed in place: on an error, or when the [`Appender`] is
//! dropped without [`Appender::finish`], it is no longer a valid snapshot
//! (its trailing hash is overwritten). Work on a copy.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::bbolt::{self, BRANCH_PAGE, BUCKET_LEAF_FLAG, LEAF_PAGE, MAGIC, META_PAGE, NO_FREELIST, VERSION};
use crate::stream::format::{Event, RevisionRecord};

/// The TTL (seconds) of a lease granted during the replay whose TTL the
/// stream could not read: the API replay's default too.
pub const UNKNOWN_TTL: i64 = crate::stream::replay::UNKNOWN_TTL;

const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BUCKET_HEADER: usize = 16;
const SHA256_LEN: u64 = 32;
/// Deepest B+tree followed; real ones are a handful of levels deep.
const MAX_DEPTH: usize = 32;
/// Largest page span (a node and its overflow pages) read from the base.
const MAX_SPAN: u64 = 256 << 20;
/// What the file is written and hashed in.
const IO_CHUNK: usize = 1 << 20;

const KEY_BUCKET: &[u8] = b"key";
const LEASE_BUCKET: &[u8] = b"lease";
const META_BUCKET: &[u8] = b"meta";
const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";

/// One element of a leaf page: (flags, key, value).
type Entry = (u32, Vec<u8>, Vec<u8>);

/// (first key, page) of each node of one tree level.
type Level = Vec<(Vec<u8>, u64)>;

/// Why a snapshot could not be appended to.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// Reading or writing the file failed.
    #[error("{}: {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The file is not an etcd snapshot this can append to.
    #[error("{}: not an etcd v3 snapshot that can be appended to: {reason}", path.display())]
    Format { path: PathBuf, reason: String },
    /// A revision does not fit (out of order, or inconsistent in itself).
    #[error("{}: cannot append revision {revision}: {reason}", path.display())]
    Record { path: PathBuf, revision: i64, reason: String },
}

/// What [`Appender::finish`] produced.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finished {
    /// The revision the snapshot now holds.
    pub revision: i64,
    /// Bytes of the file (the database and its trailing SHA-256).
    pub size: u64,
    /// Lowercase hex SHA-256 of the whole file.
    pub sha256: String,
    /// Leases added to the lease bucket (granted during the replay and
    /// still holding a key at the end).
    pub leases_added: u64,
    /// Of those, the ones given [`UNKNOWN_TTL`] because the stream had no TTL.
    pub leases_without_ttl: u64,
}

/// An etcd snapshot open for appending revisions in place.
pub struct Appender {
    path: PathBuf,
    file: File,
    out: PageWriter,
    page_size: usize,
    /// The base's meta: its flags, txid and root bucket's sequence carry over.
    meta_flags: u32,
    txid: u64,
    root_sequence: u64,
    /// Every entry of the root bucket (flags, name, bucket value), in order.
    root_entries: Vec<Entry>,
    key_sequence: u64,
    /// (first key, page) of every leaf of the key bucket, in order.
    leaves: Level,
    leaf: LeafBuilder,
    revision: i64,
    /// The lease bucket's entries in the base.
    base_leases: Vec<(Vec<u8>, Vec<u8>)>,
    base_lease_ids: HashSet<i64>,
    /// TTL recorded for each lease first seen during the replay.
    lease_ttls: HashMap<i64, Option<i64>>,
    /// Keys written during the replay with a lease the base lacks, and that lease.
    leased_keys: HashMap<Vec<u8>, i64>,
}

impl Appender {
    /// Open the snapshot at `path` (a bbolt file as `etcdctl snapshot save`
    /// or the Maintenance/Snapshot RPC writes it: the database, then the
    /// SHA-256 of the database when the size is 32 more than a multiple of
    /// 512) for appending revisions. Checks that hash when there is one,
    /// and reads the revision the snapshot holds and its leases.
    pub fn open(path: &Path) -> Result<Appender, AppendError> {
        Appender::open_with(path, true)
    }

    /// [`Appender::open`] without hashing the database against its trailing
    /// SHA-256: for a file whose bytes the caller has just checked against
    /// a digest recorded when it was taken (a chain's base, read from the
    /// store), where hashing it again costs a pass over the whole file for
    /// nothing.
    pub fn open_checked_elsewhere(path: &Path) -> Result<Appender, AppendError> {
        Appender::open_with(path, false)
    }

    fn open_with(path: &Path, hash: bool) -> Result<Appender, AppendError> {
        let io = |action| move |source| AppendError::Io { path: path.to_path_buf(), action, source };
        let bad = |reason: String| AppendError::Format { path: path.to_path_buf(), reason };
        let file = File::options().read(true).write(true).open(path).map_err(io("opening"))?;
        let len = file.metadata().map_err(io("reading its size"))?.len();
        let db_len = if len % 512 == SHA256_LEN {
            let db_len = len - SHA256_LEN;
            let mut expected = [0u8; SHA256_LEN as usize];
            file.read_exact_at(&mut expected, db_len).map_err(io("reading the trailing hash"))?;
            let actual = if hash { sha256_of(&file, db_len, None).map_err(io("hashing the database"))? } else { expected.into() };
            if actual.as_slice() != expected {
                return Err(bad(format!(
                    "the trailing SHA-256 {} does not match the database before it ({}): the snapshot is damaged",
                    crate::store::hex(&expected),
                    crate::store::hex(&actual)
                )));
            }
            db_len
        } else {
            len
        };
        let mut reader = ReadAt(&file, 0);
        let meta = bbolt::read_meta(&mut reader, db_len).map_err(|e| bad(e.to_string()))?;
        if meta.db_size() > db_len || meta.pgid < 3 {
            return Err(bad(format!(
                "the meta says {} pages of {} bytes but the database has {db_len} bytes",
                meta.pgid, meta.page_size
            )));
        }
        let page_size = meta.page_size as usize;
        let mut sequence = [0u8; 8];
        file.read_exact_at(&mut sequence, meta.page * u64::from(meta.page_size) + PAGE_HEADER as u64 + 24)
            .map_err(io("reading the meta page"))?;
        let tree = Tree { file: &file, path, page_size, pgid: meta.pgid };

        let root_entries = tree.entries(meta.root, 0)?;
        let bucket = |name: &[u8]| {
            root_entries
                .iter()
                .find(|(_, k, _)| k == name)
                .map(|(flags, _, value)| (*flags, value.as_slice()))
        };
        for (flags, name, _) in &root_entries {
            if flags & BUCKET_LEAF_FLAG == 0 {
                return Err(bad(format!("the root bucket holds `{}`, which is not a bucket", String::from_utf8_lossy(name))));
            }
        }
        let Some((_, key_value)) = bucket(KEY_BUCKET) else {
            return Err(bad("it has no \"key\" bucket (etcd's keys and their history)".into()));
        };
        let (key_root, key_sequence) = bucket_header(key_value).ok_or_else(|| bad("the \"key\" bucket's header is cut short".into()))?;

        let mut leaf = LeafBuilder::default();
        let (leaves, last_key) = if key_root == 0 {
            // inline: its entries become the start of the new leaves
            let entries = inline_entries(&key_value[BUCKET_HEADER..]).map_err(|r| bad(format!("the \"key\" bucket: {r}")))?;
            let last = entries.last().map(|(_, k, _)| k.clone());
            for (flags, key, value) in &entries {
                if flags & BUCKET_LEAF_FLAG != 0 {
                    return Err(bad("the \"key\" bucket holds a nested bucket".into()));
                }
                leaf.push(0, key, value);
            }
            (Vec::new(), last)
        } else {
            tree.leaves(key_root)?
        };
        let mut revision = match &last_key {
            Some(key) if key.len() >= 17 && key[8] == b'_' => main_revision(key),
            Some(key) => return Err(bad(format!("the \"key\" bucket's last key {key:02x?} is not a revision"))),
            None => 1,
        };
        if let Some((_, meta_bucket)) = bucket(META_BUCKET) {
            let entries = tree.bucket_entries(meta_bucket).map_err(|e| with_bucket(e, "meta"))?;
            if let Some((_, _, value)) = entries.iter().find(|(_, k, _)| k == FINISHED_COMPACT)
                && value.len() >= 8
            {
                // a compaction can remove every entry after it (deletions):
                // etcd's own restore then starts from the compacted revision
                revision = revision.max(main_revision(value));
            }
        }

        let mut base_leases = Vec::new();
        let mut base_lease_ids = HashSet::new();
        if let Some((_, lease_bucket)) = bucket(LEASE_BUCKET) {
            for (flags, key, value) in tree.bucket_entries(lease_bucket).map_err(|e| with_bucket(e, "lease"))? {
                let id: [u8; 8] = key.as_slice().try_into().map_err(|_| bad(format!("the \"lease\" bucket holds a key of {} bytes, not a lease ID", key.len())))?;
                if flags & BUCKET_LEAF_FLAG != 0 {
                    return Err(bad("the \"lease\" bucket holds a nested bucket".into()));
                }
                base_lease_ids.insert(i64::from_be_bytes(id));
                base_leases.push((key, value));
            }
        }

        // new pages go after the old high-water mark, over the trailing hash
        let mut writer = file.try_clone().map_err(io("opening for writing"))?;
        writer.seek(SeekFrom::Start(meta.db_size())).map_err(io("seeking to the end of the database"))?;
        let out = PageWriter { out: BufWriter::with_capacity(IO_CHUNK, writer), next: meta.pgid, page_size };
        Ok(Appender {
            path: path.to_path_buf(),
            file,
            out,
            page_size,
            meta_flags: meta.flags,
            txid: meta.txid,
            root_sequence: u64::from_le_bytes(sequence),
            root_entries,
            key_sequence,
            leaves,
            leaf,
            revision,
            base_leases,
            base_lease_ids,
            lease_ttls: HashMap::new(),
            leased_keys: HashMap::new(),
        })
    }

    /// The revision the snapshot holds with what was pushed so far.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Append one revision: `record.revision` must be exactly
    /// [`Appender::revision`] + 1, its events are the changes of that
    /// revision in order (the watch's order, etcd's sub-revisions), and its
    /// leases those first seen at it, with their TTLs.
    pub fn push(&mut self, record: &RevisionRecord) -> Result<(), AppendError> {
        let revision = record.revision;
        let refuse = |reason: String| AppendError::Record { path: self.path.clone(), revision, reason };
        if revision != self.revision + 1 {
            return Err(refuse(format!("the snapshot is at revision {}: the next one must be {}", self.revision, self.revision + 1)));
        }
        if record.events.is_empty() {
            return Err(refuse("it has no events (every etcd revision changes at least one key)".into()));
        }
        for event in &record.events {
            if let Event::Put { key, mod_revision, .. } = event
                && *mod_revision != revision
            {
                return Err(refuse(format!("its put of {:?} says mod revision {mod_revision}", String::from_utf8_lossy(&key.0))));
            }
        }
        for grant in &record.leases {
            let known = self.lease_ttls.entry(grant.id).or_insert(grant.ttl);
            if known.is_none() {
                *known = grant.ttl;
            }
        }
        for (sub, event) in record.events.iter().enumerate() {
            let tombstone = matches!(event, Event::Delete { .. });
            let key = revision_key(revision, sub as i64, tombstone);
            let value = match event {
                Event::Put { key, value, create_revision, mod_revision, version, lease } => {
                    if *lease != 0 && !self.base_lease_ids.contains(lease) {
                        self.leased_keys.insert(key.0.clone(), *lease);
                    } else if !self.leased_keys.is_empty() {
                        self.leased_keys.remove(&key.0);
                    }
                    key_value(&key.0, *create_revision, *mod_revision, *version, &value.0, *lease)
                }
                Event::Delete { key } => {
                    if !self.leased_keys.is_empty() {
                        self.leased_keys.remove(&key.0);
                    }
                    key_value(&key.0, 0, 0, 0, &[], 0)
                }
            };
            if self.leaf.would_overflow(self.page_size, key.len() + value.len()) {
                let first = self.leaf.first_key();
                let page = self.out.write(self.leaf.encode(self.page_size)).map_err(self.io("writing a leaf page"))?;
                self.leaves.push((first, page));
                self.leaf.clear();
            }
            self.leaf.push(0, &key, &value);
        }
        self.revision = revision;
        Ok(())
    }

    fn io(&self, action: &'static str) -> impl FnOnce(std::io::Error) -> AppendError + '_ {
        move |source| AppendError::Io { path: self.path.clone(), action, source }
    }

    /// Write the rest (the last leaf, the key bucket's branches, the lease
    /// and root buckets, the meta page), cut the file to the database and
    /// append its SHA-256.
    pub fn finish(mut self) -> Result<Finished, AppendError> {
        let page_size = self.page_size;
        // the key bucket
        if !self.leaf.is_empty() {
            let first = self.leaf.first_key();
            let page = self.out.write(self.leaf.encode(page_size)).map_err(self.io("writing a leaf page"))?;
            self.leaves.push((first, page));
            self.leaf.clear();
        }
        let key_bucket = if self.leaves.is_empty() {
            inline_bucket(self.key_sequence, &[])
        } else {
            let leaves = std::mem::take(&mut self.leaves);
            let root = self.out.branches(leaves).map_err(self.io("writing a branch page"))?;
            bucket_value(root, self.key_sequence)
        };

        // the lease bucket: the base's, and the new leases a key still uses
        let mut used: Vec<i64> = self.leased_keys.values().copied().collect();
        used.sort_unstable();
        used.dedup();
        let mut leases_without_ttl = 0;
        let lease_bucket = if used.is_empty() {
            None
        } else {
            let mut entries: Vec<Entry> = self.base_leases.iter().map(|(k, v)| (0, k.clone(), v.clone())).collect();
            for id in &used {
                let ttl = self.lease_ttls.get(id).copied().flatten();
                leases_without_ttl += u64::from(ttl.is_none());
                entries.push((0, id.to_be_bytes().to_vec(), lease(*id, ttl.unwrap_or(UNKNOWN_TTL))));
            }
            entries.sort_by(|a, b| a.1.cmp(&b.1));
            let sequence = self.root_entries.iter().find(|(_, k, _)| k == LEASE_BUCKET).and_then(|(_, _, v)| bucket_header(v)).map_or(0, |(_, s)| s);
            Some(self.out.bucket(sequence, &entries).map_err(self.io("writing the lease bucket"))?)
        };

        // the root bucket, every other bucket verbatim
        let mut root_entries = std::mem::take(&mut self.root_entries);
        for (_, name, value) in &mut root_entries {
            if name == KEY_BUCKET {
                *value = key_bucket.clone();
            } else if name == LEASE_BUCKET
                && let Some(lease_bucket) = &lease_bucket
            {
                *value = lease_bucket.clone();
            }
        }
        if lease_bucket.is_some() && !root_entries.iter().any(|(_, k, _)| k == LEASE_BUCKET) {
            let at = root_entries.partition_point(|(_, k, _)| k.as_slice() < LEASE_BUCKET);
            root_entries.insert(at, (BUCKET_LEAF_FLAG, LEASE_BUCKET.to_vec(), lease_bucket.clone().unwrap_or_default()));
        }
        let root = self.out.tree(&root_entries).map_err(self.io("writing the root bucket"))?;
        let pgid = self.out.next;
        self.out.out.flush().map_err(self.io("writing the new pages"))?;

        // the new meta, in the slot bbolt's next commit would use
        let txid = self.txid + 1;
        let mut page = vec![0u8; page_size];
        let slot = txid % 2;
        page[0..8].copy_from_slice(&slot.to_le_bytes());
        page[8..10].copy_from_slice(&META_PAGE.to_le_bytes());
        let meta = &mut page[PAGE_HEADER..PAGE_HEADER + 64];
        meta[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        meta[4..8].copy_from_slice(&VERSION.to_le_bytes());
        meta[8..12].copy_from_slice(&(page_size as u32).to_le_bytes());
        meta[12..16].copy_from_slice(&self.meta_flags.to_le_bytes());
        meta[16..24].copy_from_slice(&root.to_le_bytes());
        meta[24..32].copy_from_slice(&self.root_sequence.to_le_bytes());
        meta[32..40].copy_from_slice(&NO_FREELIST.to_le_bytes());
        meta[40..48].copy_from_slice(&pgid.to_le_bytes());
        meta[48..56].copy_from_slice(&txid.to_le_bytes());
        let checksum = bbolt::fnv64a(&meta[..56]);
        meta[56..64].copy_from_slice(&checksum.to_le_bytes());
        // the pages the meta points at are on disk before it is
        self.file.sync_data().map_err(self.io("syncing the new pages"))?;
        self.file.write_all_at(&page, slot * page_size as u64).map_err(self.io("writing the meta page"))?;

        let db_len = pgid * page_size as u64;
        self.file.set_len(db_len).map_err(self.io("cutting the file to the database"))?;
        let mut whole = Sha256::new();
        let digest = sha256_of(&self.file, db_len, Some(&mut whole)).map_err(self.io("hashing the database"))?;
        whole.update(digest);
        self.file.write_all_at(&digest, db_len).map_err(self.io("appending the SHA-256"))?;
        self.file.sync_all().map_err(self.io("syncing"))?;
        Ok(Finished {
            revision: self.revision,
            size: db_len + SHA256_LEN,
            sha256: crate::store::hex(&whole.finalize()),
            leases_added: used.len() as u64,
            leases_without_ttl,
        })
    }
}

fn with_bucket(error: AppendError, bucket: &str) -> AppendError {
    match error {
        AppendError::Format { path, reason } => AppendError::Format { path, reason: format!("the \"{bucket}\" bucket: {reason}") },
        other => other,
    }
}

/// SHA-256 of the first `len` bytes of `file`, fed to `also` as well.
fn sha256_of(file: &File, len: u64, mut also: Option<&mut Sha256>) -> std::io::Result<[u8; 32]> {
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; IO_CHUNK];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(IO_CHUNK as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        sha.update(&buf[..n]);
        if let Some(also) = also.as_deref_mut() {
            also.update(&buf[..n]);
        }
        at += n as u64;
    }
    Ok(sha.finalize().into())
}

/// `Read + Seek` over a file through positioned reads, for [`bbolt::read_meta`].
struct ReadAt<'a>(&'a File, u64);

impl std::io::Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read_at(buf, self.1)?;
        self.1 += n as u64;
        Ok(n)
    }
}

impl Seek for ReadAt<'_> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.1 = match pos {
            SeekFrom::Start(at) => at,
            SeekFrom::Current(d) => self.1.checked_add_signed(d).ok_or_else(|| std::io::Error::other("seek before the start"))?,
            SeekFrom::End(_) => return Err(std::io::Error::other("seeking from the end is not supported")),
        };
        Ok(self.1)
    }
}

/// The main revision of a key-bucket key (or of a `meta` revision value).
fn main_revision(key: &[u8]) -> i64 {
    let mut main = [0u8; 8];
    main.copy_from_slice(&key[..8]);
    i64::from_be_bytes(main)
}

/// The key of change `sub` of revision `main` in the key bucket (etcd's
/// `revToBytes`, with `appendMarkTombstone` for a delete).
pub fn revision_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut key = Vec::with_capacity(18);
    key.extend_from_slice(&main.to_be_bytes());
    key.push(b'_');
    key.extend_from_slice(&sub.to_be_bytes());
    if tombstone {
        key.push(b't');
    }
    key
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn int_field(out: &mut Vec<u8>, tag: u8, n: i64) {
    if n != 0 {
        out.push(tag);
        varint(out, n as u64);
    }
}

fn bytes_field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    if !bytes.is_empty() {
        out.push(tag);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
}

/// `mvccpb.KeyValue` as etcd 3.4's gogoproto `Marshal` writes it: fields in
/// number order, zero ones left out, negative integers as 10-byte varints.
pub fn key_value(key: &[u8], create_revision: i64, mod_revision: i64, version: i64, value: &[u8], lease: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + value.len() + 40);
    bytes_field(&mut out, 0x0a, key);
    int_field(&mut out, 0x10, create_revision);
    int_field(&mut out, 0x18, mod_revision);
    int_field(&mut out, 0x20, version);
    bytes_field(&mut out, 0x2a, value);
    int_field(&mut out, 0x30, lease);
    out
}

/// `leasepb.Lease` as a grant persists it (`RemainingTTL` is 0 until a
/// checkpoint, so left out).
pub fn lease(id: i64, ttl: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(22);
    int_field(&mut out, 0x08, id);
    int_field(&mut out, 0x10, ttl);
    out
}

/// (root page, sequence) of a bucket value.
fn bucket_header(value: &[u8]) -> Option<(u64, u64)> {
    let root = u64::from_le_bytes(value.get(0..8)?.try_into().ok()?);
    let sequence = u64::from_le_bytes(value.get(8..16)?.try_into().ok()?);
    Some((root, sequence))
}

fn bucket_value(root: u64, sequence: u64) -> Vec<u8> {
    let mut value = root.to_le_bytes().to_vec();
    value.extend_from_slice(&sequence.to_le_bytes());
    value
}

/// A bucket value holding its only leaf inline, as bbolt writes a small
/// bucket (`Bucket.write`: the page header's id stays 0).
fn inline_bucket(sequence: u64, entries: &[Entry]) -> Vec<u8> {
    let mut leaf = LeafBuilder::default();
    for (flags, key, value) in entries {
        leaf.push(*flags, key, value);
    }
    let mut value = bucket_value(0, sequence);
    value.extend_from_slice(&leaf.encode(0));
    value
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at.checked_add(4)?)?.try_into().ok().map(u32::from_le_bytes)
}

fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    buf.get(at..at.checked_add(8)?)?.try_into().ok().map(u64::from_le_bytes)
}

/// (flags, count, overflow) of a page.
fn page_header(page: &[u8]) -> (u16, u16, u32) {
    let flags = u16::from_le_bytes([page[8], page[9]]);
    let count = u16::from_le_bytes([page[10], page[11]]);
    (flags, count, u32_at(page, 12).unwrap_or_default())
}

/// The elements of a leaf page (or an inline bucket's page).
fn leaf_elements(page: &[u8], count: u16) -> Result<Vec<Entry>, String> {
    (0..usize::from(count))
        .map(|i| {
            let at = PAGE_HEADER + i * ELEMENT;
            let (Some(flags), Some(pos), Some(ksize), Some(vsize)) = (u32_at(page, at), u32_at(page, at + 4), u32_at(page, at + 8), u32_at(page, at + 12)) else {
                return Err(format!("leaf element {i} lies past the page end"));
            };
            let start = at + pos as usize;
            let (key_end, end) = (start + ksize as usize, start + ksize as usize + vsize as usize);
            if end > page.len() {
                return Err(format!("leaf element {i} ends at byte {end}, past the page's {} bytes", page.len()));
            }
            Ok((flags, page[start..key_end].to_vec(), page[key_end..end].to_vec()))
        })
        .collect()
}

/// The children (key, page) of a branch page.
fn branch_elements(page: &[u8], count: u16) -> Result<Level, String> {
    (0..usize::from(count))
        .map(|i| {
            let at = PAGE_HEADER + i * ELEMENT;
            let (Some(pos), Some(ksize), Some(child)) = (u32_at(page, at), u32_at(page, at + 4), u64_at(page, at + 8)) else {
                return Err(format!("branch element {i} lies past the page end"));
            };
            let start = at + pos as usize;
            let end = start + ksize as usize;
            if end > page.len() {
                return Err(format!("branch element {i} ends at byte {end}, past the page's {} bytes", page.len()));
            }
            Ok((page[start..end].to_vec(), child))
        })
        .collect()
}

fn inline_entries(page: &[u8]) -> Result<Vec<Entry>, String> {
    if page.len() < PAGE_HEADER {
        return Err(format!("an inline bucket of {} bytes has no page header", page.len()));
    }
    let (flags, count, _) = page_header(page);
    if flags != LEAF_PAGE {
        return Err(format!("an inline bucket's page has flags {flags:#06x}, not a leaf's"));
    }
    leaf_elements(page, count)
}

/// The base's B+trees, read page by page.
struct Tree<'a> {
    file: &'a File,
    path: &'a Path,
    page_size: usize,
    /// The base's high-water mark.
    pgid: u64,
}

impl Tree<'_> {
    fn bad(&self, page: u64, reason: impl std::fmt::Display) -> AppendError {
        AppendError::Format { path: self.path.to_path_buf(), reason: format!("page {page}: {reason}") }
    }

    /// Page `id` with its overflow pages: (flags, count, bytes).
    fn page(&self, id: u64) -> Result<(u16, u16, Vec<u8>), AppendError> {
        if id < 2 || id >= self.pgid {
            return Err(self.bad(id, format!("referenced, but pages in use are 2..{}", self.pgid)));
        }
        let at = id * self.page_size as u64;
        let mut page = vec![0u8; self.page_size];
        let io = |source| AppendError::Io { path: self.path.to_path_buf(), action: "reading a page", source };
        self.file.read_exact_at(&mut page, at).map_err(io)?;
        let (flags, count, overflow) = page_header(&page);
        if overflow > 0 {
            let span = (u64::from(overflow) + 1) * self.page_size as u64;
            if id + u64::from(overflow) >= self.pgid || span > MAX_SPAN {
                return Err(self.bad(id, format!("its {overflow} overflow pages lie past the pages in use")));
            }
            page.resize(span as usize, 0);
            self.file.read_exact_at(&mut page[self.page_size..], at + self.page_size as u64).map_err(io)?;
        }
        Ok((flags, count, page))
    }

    /// Every entry of the tree at page `root`, in order.
    fn entries(&self, root: u64, depth: usize) -> Result<Vec<Entry>, AppendError> {
        if depth > MAX_DEPTH {
            return Err(self.bad(root, "the tree is deeper than any bbolt tree"));
        }
        let (flags, count, page) = self.page(root)?;
        match flags {
            LEAF_PAGE => leaf_elements(&page, count).map_err(|r| self.bad(root, r)),
            BRANCH_PAGE => {
                let mut out = Vec::new();
                for (_, child) in branch_elements(&page, count).map_err(|r| self.bad(root, r))? {
                    out.extend(self.entries(child, depth + 1)?);
                }
                Ok(out)
            }
            other => Err(self.bad(root, format!("flags {other:#06x}: not a branch or leaf page"))),
        }
    }

    /// Every entry of a bucket, inline or not, from its value in its parent.
    fn bucket_entries(&self, value: &[u8]) -> Result<Vec<Entry>, AppendError> {
        let bad = |reason: String| AppendError::Format { path: self.path.to_path_buf(), reason };
        match bucket_header(value) {
            None => Err(bad("its header is cut short".into())),
            Some((0, _)) => inline_entries(&value[BUCKET_HEADER..]).map_err(bad),
            Some((root, _)) => self.entries(root, 0),
        }
    }

    /// (first key, page) of every leaf of the tree at `root`, reading only
    /// its branch pages (bbolt's trees are balanced: every leaf is as deep
    /// as the first), and the last key of the last leaf.
    fn leaves(&self, root: u64) -> Result<(Level, Option<Vec<u8>>), AppendError> {
        let mut level = vec![(Vec::new(), root)];
        for _ in 0..MAX_DEPTH {
            let (flags, _, _) = self.page(level[0].1)?;
            if flags == LEAF_PAGE {
                let last = level.last().map_or(root, |(_, id)| *id);
                let (flags, count, page) = self.page(last)?;
                if flags != LEAF_PAGE {
                    return Err(self.bad(last, "a branch page where a leaf was due (an unbalanced tree)"));
                }
                let elements = leaf_elements(&page, count).map_err(|r| self.bad(last, r))?;
                if level.len() == 1 {
                    // the root is the only leaf: its key is its first one
                    match elements.first() {
                        Some((_, key, _)) => level[0].0 = key.clone(),
                        None => return Ok((Vec::new(), None)),
                    }
                }
                if elements.is_empty() {
                    return Err(self.bad(last, "an empty leaf in a tree of several pages"));
                }
                return Ok((level, elements.last().map(|(_, k, _)| k.clone())));
            }
            let mut children = Vec::with_capacity(level.len() * 64);
            for (_, id) in &level {
                let (flags, count, page) = self.page(*id)?;
                if flags != BRANCH_PAGE {
                    return Err(self.bad(*id, format!("flags {flags:#06x} where a branch page was due")));
                }
                let elements = branch_elements(&page, count).map_err(|r| self.bad(*id, r))?;
                if elements.is_empty() {
                    return Err(self.bad(*id, "an empty branch page"));
                }
                children.extend(elements);
            }
            level = children;
        }
        Err(self.bad(root, "the tree is deeper than any bbolt tree"))
    }
}

/// One leaf page being filled: its elements and their keys and values.
#[derive(Default)]
struct LeafBuilder {
    /// (flags, key size, value size) of each element.
    elements: Vec<(u32, u32, u32)>,
    data: Vec<u8>,
}

impl LeafBuilder {
    fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    fn clear(&mut self) {
        self.elements.clear();
        self.data.clear();
    }

    fn size(&self) -> usize {
        PAGE_HEADER + self.elements.len() * ELEMENT + self.data.len()
    }

    /// Whether an entry of `bytes` (key and value) no longer fits: the page
    /// is written first. An entry alone on its page may overflow it.
    fn would_overflow(&self, page_size: usize, bytes: usize) -> bool {
        !self.is_empty() && (self.size() + ELEMENT + bytes > page_size || self.elements.len() >= 0xFFFE)
    }

    fn push(&mut self, flags: u32, key: &[u8], value: &[u8]) {
        self.elements.push((flags, key.len() as u32, value.len() as u32));
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
    }

    fn first_key(&self) -> Vec<u8> {
        let ksize = self.elements.first().map_or(0, |e| e.1 as usize);
        self.data[..ksize].to_vec()
    }

    /// The page's bytes (id 0, to be set), in whole pages of `page_size`
    /// (0: exactly as long as its content, for an inline bucket).
    fn encode(&self, page_size: usize) -> Vec<u8> {
        let size = self.size();
        let span = if page_size == 0 { size } else { size.div_ceil(page_size) * page_size };
        let mut page = vec![0u8; span];
        page[8..10].copy_from_slice(&LEAF_PAGE.to_le_bytes());
        page[10..12].copy_from_slice(&(self.elements.len() as u16).to_le_bytes());
        let mut data = PAGE_HEADER + self.elements.len() * ELEMENT;
        page[data..data + self.data.len()].copy_from_slice(&self.data);
        for (i, (flags, ksize, vsize)) in self.elements.iter().enumerate() {
            let at = PAGE_HEADER + i * ELEMENT;
            page[at..at + 4].copy_from_slice(&flags.to_le_bytes());
            page[at + 4..at + 8].copy_from_slice(&((data - at) as u32).to_le_bytes());
            page[at + 8..at + 12].copy_from_slice(&ksize.to_le_bytes());
            page[at + 12..at + 16].copy_from_slice(&vsize.to_le_bytes());
            data += (*ksize + *vsize) as usize;
        }
        page
    }
}

/// Pages written one after the other from the old high-water mark.
struct PageWriter {
    out: BufWriter<File>,
    /// The next page id (the new high-water mark once all is written).
    next: u64,
    page_size: usize,
}

impl PageWriter {
    /// Write `page` (whole pages) as the next page id, setting its id and
    /// overflow; returns the id.
    fn write(&mut self, mut page: Vec<u8>) -> std::io::Result<u64> {
        let id = self.next;
        let span = (page.len() / self.page_size) as u64;
        page[0..8].copy_from_slice(&id.to_le_bytes());
        page[12..16].copy_from_slice(&((span - 1) as u32).to_le_bytes());
        self.out.write_all(&page)?;
        self.next += span;
        Ok(id)
    }

    /// Branch levels over `children` (first key, page) until one page is
    /// the root; returns it (the only child when there is one).
    fn branches(&mut self, mut level: Level) -> std::io::Result<u64> {
        while level.len() > 1 {
            let mut next = Vec::with_capacity(level.len() / 100 + 1);
            let mut start = 0;
            while start < level.len() {
                // at least two children a page, so every level shrinks
                let mut end = start;
                let mut size = PAGE_HEADER;
                while end < level.len() && (end - start < 2 || size + ELEMENT + level[end].0.len() <= self.page_size) {
                    size += ELEMENT + level[end].0.len();
                    end += 1;
                }
                let id = self.write(branch_page(&level[start..end], self.page_size))?;
                next.push((level[start].0.clone(), id));
                start = end;
            }
            level = next;
        }
        Ok(level[0].1)
    }

    /// A whole tree over `entries` (sorted); returns its root page.
    fn tree(&mut self, entries: &[Entry]) -> std::io::Result<u64> {
        let mut leaf = LeafBuilder::default();
        let mut leaves = Vec::new();
        for (flags, key, value) in entries {
            if leaf.would_overflow(self.page_size, key.len() + value.len()) {
                leaves.push((leaf.first_key(), self.write(leaf.encode(self.page_size))?));
                leaf.clear();
            }
            leaf.push(*flags, key, value);
        }
        leaves.push((leaf.first_key(), self.write(leaf.encode(self.page_size))?));
        self.branches(leaves)
    }

    /// A bucket value holding `entries`: inline when bbolt would keep it
    /// inline (a quarter page at most, no nested bucket), else a tree.
    fn bucket(&mut self, sequence: u64, entries: &[Entry]) -> std::io::Result<Vec<u8>> {
        let size = PAGE_HEADER + entries.iter().map(|(_, k, v)| ELEMENT + k.len() + v.len()).sum::<usize>();
        let nested = entries.iter().any(|(flags, _, _)| flags & BUCKET_LEAF_FLAG != 0);
        if size <= self.page_size / 4 && !nested {
            return Ok(inline_bucket(sequence, entries));
        }
        Ok(bucket_value(self.tree(entries)?, sequence))
    }
}

/// A branch page over `children` (first key, page), in whole pages.
fn branch_page(children: &[(Vec<u8>, u64)], page_size: usize) -> Vec<u8> {
    let size = PAGE_HEADER + children.iter().map(|(k, _)| ELEMENT + k.len()).sum::<usize>();
    let mut page = vec![0u8; size.div_ceil(page_size) * page_size];
    page[8..10].copy_from_slice(&BRANCH_PAGE.to_le_bytes());
    page[10..12].copy_from_slice(&(children.len() as u16).to_le_bytes());
    let mut data = PAGE_HEADER + children.len() * ELEMENT;
    for (i, (key, child)) in children.iter().enumerate() {
        let at = PAGE_HEADER + i * ELEMENT;
        page[at..at + 4].copy_from_slice(&((data - at) as u32).to_le_bytes());
        page[at + 4..at + 8].copy_from_slice(&(key.len() as u32).to_le_bytes());
        page[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
        page[data..data + key.len()].copy_from_slice(key);
        data += key.len();
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::bbolt::testdb;
    use crate::stream::format::{Bytes, LeaseGrant};

    #[test]
    fn revision_keys_are_etcds_layout() {
        assert_eq!(revision_key(0x0102, 3, false), vec![0, 0, 0, 0, 0, 0, 1, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 3]);
        let tomb = revision_key(7, 0, true);
        assert_eq!(tomb.len(), 18);
        assert_eq!(tomb[17], b't');
        assert_eq!(tomb, testdb::revision_key(7, 0, true));
        // keys sort by revision, then sub revision
        assert!(revision_key(9, 300, false) < revision_key(10, 0, false));
        assert!(revision_key(10, 1, true) < revision_key(10, 2, false));
    }

    #[test]
    fn key_values_encode_as_gogoproto_does() {
        // computed by hand from the proto3 wire format: tags 0x0a, 0x10,
        // 0x18, 0x20, 0x2a, 0x30; 300 = ac 02
        assert_eq!(
            key_value(b"/a", 300, 301, 2, b"xy", 0x1234),
            vec![0x0a, 2, b'/', b'a', 0x10, 0xac, 0x02, 0x18, 0xad, 0x02, 0x20, 2, 0x2a, 2, b'x', b'y', 0x30, 0xb4, 0x24]
        );
        // zero and empty fields are left out (a tombstone holds the key only)
        assert_eq!(key_value(b"k", 0, 0, 0, b"", 0), vec![0x0a, 1, b'k']);
        // what the reader's test helper (hand-checked against etcd) writes
        assert_eq!(key_value(b"/a/x/1", 5, 5, 5, b"v", 0), testdb::key_value(b"/a/x/1", 5, b"v"));
        // negative numbers are ten-byte varints
        assert_eq!(key_value(b"", 0, 0, 0, b"", -1), vec![0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        // a value longer than 127 bytes has a two-byte length
        let long = key_value(b"k", 1, 1, 1, &[7u8; 200], 0);
        assert_eq!(&long[9..12], &[0x2a, 0xc8, 0x01]);
        assert_eq!(lease(0x694d_7b4c_1e2a_0f03, 600), {
            let mut v = vec![0x08];
            varint(&mut v, 0x694d_7b4c_1e2a_0f03);
            v.extend_from_slice(&[0x10, 0xd8, 0x04]);
            v
        });
    }

    fn put(key: &str, value: &[u8], create: i64, revision: i64, version: i64, lease: i64) -> Event {
        Event::Put { key: Bytes(key.into()), value: Bytes(value.to_vec()), create_revision: create, mod_revision: revision, version, lease }
    }

    fn record(revision: i64, events: Vec<Event>) -> RevisionRecord {
        RevisionRecord { revision, received: chrono::Utc::now(), events, leases: Vec::new() }
    }

    /// The base `testdb::etcd_like` (revision 7), with the SHA-256 etcd appends.
    fn base_file(dir: &Path) -> PathBuf {
        let mut db = testdb::etcd_like();
        let sha = Sha256::digest(&db);
        db.extend_from_slice(&sha);
        let path = dir.join("base.db");
        std::fs::write(&path, db).unwrap();
        path
    }

    /// Every (bucket, key, value) of a bbolt file, through the reader.
    /// (bucket, key, value) of each entry.
    type Dumped = Vec<(Vec<u8>, Vec<u8>, Option<Vec<u8>>)>;

    fn dump(path: &Path) -> Dumped {
        struct Dump(Dumped, Vec<u8>);
        impl bbolt::Visitor for Dump {
            fn bucket(&mut self, name: &[u8]) {
                self.1 = name.to_vec();
            }
            fn entry(&mut self, key: &[u8], value: Option<&[u8]>) {
                self.0.push((self.1.clone(), key.to_vec(), value.map(<[u8]>::to_vec)));
            }
        }
        let bytes = std::fs::read(path).unwrap();
        let len = bytes.len() as u64 - 32;
        assert_eq!(Sha256::digest(&bytes[..len as usize]).as_slice(), &bytes[len as usize..], "trailing hash");
        let mut db = bbolt::Db::open(std::io::Cursor::new(bytes), len).unwrap();
        let mut out = Dump(Vec::new(), Vec::new());
        db.walk(&mut out).unwrap();
        out.0
    }

    #[test]
    fn appends_to_a_hand_built_snapshot_readable_by_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = base_file(dir.path());
        let before = dump(&path);
        let mut appender = Appender::open(&path).unwrap();
        assert_eq!(appender.revision(), 7);
        let err = appender.push(&record(9, vec![put("/x", b"1", 9, 9, 1, 0)])).unwrap_err();
        assert!(err.to_string().contains("the next one must be 8"), "{err}");
        let err = appender.push(&record(8, vec![put("/x", b"1", 8, 7, 1, 0)])).unwrap_err();
        assert!(err.to_string().contains("revision 8") && err.to_string().contains("mod revision 7"), "{err}");
        let mut expected_new = Vec::new();
        for r in 8..=2000i64 {
            let value = vec![(r % 251) as u8; (r as usize * 13) % 700];
            let mut events = vec![put(&format!("/k/{r}"), &value, r, r, 1, 0)];
            if r % 10 == 0 {
                events.push(Event::Delete { key: Bytes(format!("/k/{}", r - 1).into_bytes()) });
            }
            if r == 1000 {
                events.push(put("/big", &vec![1u8; 20_000], r, r, 1, 0));
            }
            let mut rec = record(r, events.clone());
            if r == 1500 {
                rec.events = vec![put("/leased", b"l", r, r, 1, 0x55)];
                rec.leases = vec![LeaseGrant { id: 0x55, ttl: Some(900) }];
                events = rec.events.clone();
            }
            for (sub, e) in events.iter().enumerate() {
                let (key, value) = match e {
                    Event::Put { key, value, create_revision, mod_revision, version, lease } => {
                        (revision_key(r, sub as i64, false), key_value(&key.0, *create_revision, *mod_revision, *version, &value.0, *lease))
                    }
                    Event::Delete { key } => (revision_key(r, sub as i64, true), key_value(&key.0, 0, 0, 0, &[], 0)),
                };
                expected_new.push((b"key".to_vec(), key, Some(value)));
            }
            appender.push(&rec).unwrap();
        }
        let finished = appender.finish().unwrap();
        assert_eq!(finished.revision, 2000);
        assert_eq!((finished.leases_added, finished.leases_without_ttl), (1, 0));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(finished.size, bytes.len() as u64);
        assert_eq!(finished.sha256, crate::store::hex(&Sha256::digest(&bytes)));
        let after = dump(&path);
        // the old key entries, then the new ones, every other bucket as it was, plus the lease
        let mut expected: Vec<_> = before.iter().filter(|(b, _, _)| b.as_slice() == b"key").cloned().collect();
        expected.extend(expected_new);
        let keys: Vec<_> = after.iter().filter(|(b, _, _)| b.as_slice() == b"key").cloned().collect();
        assert_eq!(keys.len(), expected.len());
        assert!(keys == expected, "the key bucket differs");
        let others: Vec<_> = after.iter().filter(|(b, _, _)| b.as_slice() != b"key" && b.as_slice() != b"lease").cloned().collect();
        let others_before: Vec<_> = before.iter().filter(|(b, _, _)| b.as_slice() != b"key" && b.as_slice() != b"lease").cloned().collect();
        assert_eq!(others, others_before);
        let leases: Vec<_> = after.iter().filter(|(b, _, _)| b.as_slice() == b"lease").cloned().collect();
        assert_eq!(leases, vec![(b"lease".to_vec(), 0x55i64.to_be_bytes().to_vec(), Some(lease(0x55, 900)))]);

        // appending again continues from there
        let mut again = Appender::open(&path).unwrap();
        assert_eq!(again.revision(), 2000);
        again.push(&record(2001, vec![Event::Delete { key: Bytes(b"/leased".to_vec()) }])).unwrap();
        assert_eq!(again.finish().unwrap().leases_added, 0);
        assert_eq!(dump(&path).iter().filter(|(b, _, _)| b.as_slice() == b"key").count(), expected.len() + 1);
    }

    #[test]
    fn a_database_without_its_hash_is_appended_to_and_gets_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bare.db");
        std::fs::write(&path, testdb::etcd_like()).unwrap();
        let mut appender = Appender::open(&path).unwrap();
        let err = appender.push(&record(8, Vec::new())).unwrap_err().to_string();
        assert!(err.contains("revision 8") && err.contains("no events"), "{err}");
        // a refused record changes nothing: the same revision goes in after it
        appender.push(&record(8, vec![put("/n", b"v", 8, 8, 1, 0)])).unwrap();
        let finished = appender.finish().unwrap();
        assert_eq!(finished.size % 512, 32);
        assert_eq!(dump(&path).iter().filter(|(b, k, _)| b.as_slice() == b"key" && k[..8] == 8i64.to_be_bytes()).count(), 1);
    }

    #[test]
    fn a_damaged_snapshot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = base_file(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[5000] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = Appender::open(&path).err().unwrap().to_string();
        assert!(err.contains("trailing SHA-256") && err.contains("base.db"), "{err}");
        std::fs::write(&path, vec![0u8; 8192 + 32]).unwrap();
        let err = Appender::open(&path).err().unwrap().to_string();
        assert!(err.contains("not an etcd v3 snapshot"), "{err}");
    }
}
