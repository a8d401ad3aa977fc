//! The open segment of a chain and its durable writes. Revisions are added
//! as the watch hands them on; the segment is cut when it is
//! `segment_interval` old or `segment_size` big, and only when it holds
//! something. A cut is one `Store::put` of the whole encoded segment
//! (local: `.partial`, fsync, rename; S3: a completed PUT): the segment is
//! durable, under its final name, before the next one is started.
//!
//! With a spool (`super::spool`), a segment the store refuses (or does not
//! take within 30 s) is kept on local disk instead, and so is every
//! segment after it until the spooled ones are uploaded, oldest first
//! ([`ChainWriter::upload`]): the store never holds segment N+1 without N.
//! Only the store makes a segment durable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::codec;
use super::format::{ChainLayout, RevisionRecord, SegmentBuilder, SegmentName};
use super::spool::{ChainSpool, SpoolSettings, Spooled};
use super::{StreamError, store_error};
use crate::archive::encryption::Recipients;
use crate::store::Store;

/// When a segment is cut.
#[derive(Debug, Clone, Copy)]
pub struct Cut {
    pub interval: Duration,
    /// Raw bytes (before compression).
    pub size: u64,
}

/// How many times a segment write is tried before the stream gives up
/// (and exits: restarted, it resumes from the last durable revision).
const ATTEMPTS: u32 = 4;

/// What a chain writer wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Written {
    pub segments: u64,
    pub revisions: u64,
    pub events: u64,
    /// Bytes stored (compressed, encrypted).
    pub stored_bytes: u64,
    /// Bytes of the segments before compression.
    pub raw_bytes: u64,
    /// The first revision this writer stored.
    pub first_revision: Option<i64>,
}

/// What [`ChainWriter::flush`] did with the open segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flushed {
    /// Nothing was open.
    Nothing,
    /// Durable in the store.
    Stored(SegmentName),
    /// Kept in the spool, after the segments spooled before it: the store
    /// refused it (`error`), or segments before it still wait (`None`).
    Spooled { name: SegmentName, error: Option<String> },
    /// The store refused it and the spool has no room: it is dropped (its
    /// revisions are nowhere) and the chain cannot go on.
    Full { name: SegmentName, error: String },
}

/// A spooled segment on its way to the store (run beside the watch, so the
/// watch is consumed while the store is slow).
pub struct Upload {
    store: Arc<dyn Store>,
    key: String,
    segment: Spooled,
}

impl Upload {
    pub fn segment(&self) -> &Spooled {
        &self.segment
    }

    /// Put the spooled file; the segment once the store holds it.
    pub async fn run(self) -> Result<Spooled, String> {
        let bytes = tokio::fs::read(&self.segment.path).await.map_err(|e| format!("reading {}: {e}", self.segment.path.display()))?;
        put_checked(self.store.as_ref(), &self.key, &bytes, &self.segment.name.sha256).await?;
        Ok(self.segment)
    }
}

/// A segment `put` that does not answer in this long counts as failed
/// (an 8 MiB segment needs 270 KB/s; with the 20 s a stop gives the spool,
/// a stop stays within the StatefulSet's 60 s grace period).
const PUT_TIMEOUT: Duration = Duration::from_secs(30);

/// Put `bytes` at `key` and check the store holds them; the error as a sentence.
pub(crate) async fn put_checked(store: &dyn Store, key: &str, bytes: &[u8], sha256: &str) -> Result<(), String> {
    match tokio::time::timeout(PUT_TIMEOUT, store.put(key, Box::new(bytes))).await {
        Err(_) => Err(format!("the store did not answer within {}s", PUT_TIMEOUT.as_secs())),
        Ok(Err(err)) => Err(err.to_string()),
        Ok(Ok(put)) if put.sha256 == sha256 => Ok(()),
        Ok(Ok(put)) => {
            let _ = store.delete(key).await;
            Err(format!("the store holds SHA-256 {} after writing {sha256}", put.sha256))
        }
    }
}

/// Writes the segments of one chain.
pub struct ChainWriter {
    store: Arc<dyn Store>,
    layout: ChainLayout,
    level: i32,
    recipients: Option<Recipients>,
    cut: Cut,
    open: SegmentBuilder,
    opened: Option<Instant>,
    last_durable: i64,
    /// The last revision sealed (durable, or spooled, or dropped with a full spool).
    last_sealed: i64,
    written: Written,
    /// Without one, a failed write is tried [`ATTEMPTS`] times and fails.
    spool: Option<ChainSpool>,
}

impl ChainWriter {
    /// A writer for `layout` whose segments follow `last_durable`.
    pub fn new(store: Arc<dyn Store>, layout: ChainLayout, level: i32, recipients: Option<Recipients>, cut: Cut, last_durable: i64) -> ChainWriter {
        ChainWriter { store, layout, level, recipients, cut, open: SegmentBuilder::default(), opened: None, last_durable, last_sealed: last_durable, written: Written::default(), spool: None }
    }

    /// Keep segments the store refuses in `spool` instead of failing.
    pub fn with_spool(mut self, spool: SpoolSettings) -> ChainWriter {
        self.spool = Some(ChainSpool::new(spool, &self.layout));
        self
    }

    /// Add the next revision to the open segment.
    pub fn push(&mut self, record: &RevisionRecord) -> Result<(), StreamError> {
        let expected = self.last_pushed() + 1;
        if record.revision != expected {
            return Err(StreamError::Format(super::FormatError {
                what: format!("chain {}", self.layout.chain_id),
                reason: format!("revision {} handed to the writer where {expected} was due", record.revision),
            }));
        }
        self.open.push(record)?;
        self.opened.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Whether the open segment is big enough to be cut now.
    pub fn full(&self) -> bool {
        self.open.raw_size() as u64 >= self.cut.size
    }

    /// When the open segment is due, if it holds anything.
    pub fn due(&self) -> Option<Instant> {
        self.opened.map(|at| at + self.cut.interval)
    }

    /// The last revision stored durably.
    pub fn last_durable(&self) -> i64 {
        self.last_durable
    }

    /// The last revision handed to the writer (durable or not).
    pub fn last_pushed(&self) -> i64 {
        self.open.span().map_or(self.last_sealed, |(_, last)| last)
    }

    pub fn written(&self) -> &Written {
        &self.written
    }

    pub fn layout(&self) -> &ChainLayout {
        &self.layout
    }

    /// The chain's spooled segments, when it has a spool.
    pub fn spool(&self) -> Option<&ChainSpool> {
        self.spool.as_ref()
    }

    /// Segments wait in the spool.
    pub fn spooling(&self) -> bool {
        self.spool.as_ref().is_some_and(|s| !s.is_empty())
    }

    /// The oldest spooled segment, to upload.
    pub fn upload(&self) -> Option<Upload> {
        let segment = self.spool.as_ref()?.head()?.clone();
        Some(Upload { store: self.store.clone(), key: self.layout.segment(&segment.name), segment })
    }

    /// The oldest spooled segment is in the store (`upload` ran): it is
    /// durable, and forgotten by the spool.
    pub fn uploaded(&mut self, segment: &Spooled) -> Result<(), StreamError> {
        let spool = self.spool.as_mut().filter(|s| s.head().is_some_and(|h| h.name == segment.name));
        let Some(spool) = spool else {
            return Err(StreamError::Io { what: format!("chain {}", self.layout.chain_id), source: std::io::Error::other(format!("segment {} uploaded out of order", segment.name.span())) });
        };
        let removed = spool.remove_head().map_err(|e| StreamError::Io { what: format!("chain {} spool", self.layout.chain_id), source: std::io::Error::other(e.to_string()) });
        self.durable(segment);
        removed.map(|_| ())
    }

    /// Segments an earlier run spooled for this chain, continuing it.
    pub fn adopt(&mut self, segment: Spooled) {
        self.last_sealed = segment.name.last;
        if let Some(spool) = self.spool.as_mut() {
            spool.adopt(segment);
        }
    }

    fn durable(&mut self, segment: &Spooled) {
        self.written.segments += 1;
        self.written.revisions += segment.revisions;
        self.written.events += segment.events;
        self.written.stored_bytes += segment.stored_bytes;
        self.written.raw_bytes += segment.raw_bytes;
        self.written.first_revision.get_or_insert(segment.name.first);
        self.last_durable = segment.name.last;
    }

    /// Seal the open segment, if it holds anything, and write it durably:
    /// to the store, or (with a spool) after the segments that wait there
    /// when the store refuses it or they wait. Without a spool a failed
    /// write is tried again (at most [`ATTEMPTS`] times, backing off) and
    /// the segment stays open until it is written.
    pub async fn flush(&mut self) -> Result<Flushed, StreamError> {
        let (Some((first, last)), Some(raw)) = (self.open.span(), self.open.finish(&self.layout.chain_id)) else {
            return Ok(Flushed::Nothing);
        };
        let what = format!("chain {} segment {first}..{last}", self.layout.chain_id);
        let (stored, digest) = codec::seal(&raw, self.level, self.recipients.as_ref(), &what).await?;
        let name = SegmentName { first, last, sha256: digest.sha256.clone() };
        let key = self.layout.segment(&name);
        let segment = Spooled { name: name.clone(), stored_bytes: digest.size, raw_bytes: raw.len() as u64, revisions: self.open.revisions(), events: self.open.events(), path: Default::default() };
        if self.spool.is_some() {
            let error = match self.spooling() {
                true => None,
                false => match put_checked(self.store.as_ref(), &key, &stored, &digest.sha256).await {
                    Ok(()) => {
                        self.sealed(last);
                        self.durable(&segment);
                        return Ok(Flushed::Stored(name));
                    }
                    Err(err) => Some(err),
                },
            };
            self.sealed(last);
            let spool = self.spool.as_mut().expect("a spool");
            return match spool.add(segment, stored).await {
                Ok(()) => Ok(Flushed::Spooled { name, error }),
                Err(err) => Ok(Flushed::Full { name, error: format!("{}{}", error.map(|e| format!("{e}; ")).unwrap_or_default(), err) }),
            };
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.store.put(&key, Box::new(stored.as_slice())).await {
                Ok(put) if put.sha256 == digest.sha256 => break,
                Ok(put) => {
                    let _ = self.store.delete(&key).await;
                    return Err(StreamError::Io {
                        what: format!("{}{key}", super::catalog::url_slash(self.store.as_ref())),
                        source: std::io::Error::other(format!("the store holds SHA-256 {} after writing {}", put.sha256, digest.sha256)),
                    });
                }
                Err(err) if attempt >= ATTEMPTS => return Err(store_error(format!("writing {what} ({attempt} attempts)"))(err)),
                Err(err) => {
                    tracing::warn!("writing {what} failed (attempt {attempt} of {ATTEMPTS}): {err}");
                    tokio::time::sleep(crate::duration::backoff(Duration::from_secs(1), Duration::from_secs(8), attempt)).await;
                }
            }
        }
        self.sealed(last);
        self.durable(&segment);
        Ok(Flushed::Stored(name))
    }

    /// The open segment is sealed through `last`; a new one starts.
    fn sealed(&mut self, last: i64) {
        self.last_sealed = last;
        self.open = SegmentBuilder::default();
        self.opened = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::format::{Bytes, Event, Segment};

    fn record(revision: i64, value: &str) -> RevisionRecord {
        let event = Event::Put { key: Bytes(b"/k".to_vec()), value: Bytes(value.into()), create_revision: 1, mod_revision: revision, version: 1, lease: 0 };
        RevisionRecord { revision, received: chrono::Utc::now(), events: vec![event], leases: Vec::new() }
    }

    #[tokio::test]
    async fn segments_are_cut_only_with_events_and_named_by_what_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(crate::store::LocalStore::new(dir.path()));
        let layout = ChainLayout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        let cut = Cut { interval: Duration::from_secs(10), size: 200 };
        let mut writer = ChainWriter::new(store.clone(), layout.clone(), 1, None, cut, 40);
        assert_eq!(writer.flush().await.unwrap(), Flushed::Nothing, "nothing to write");
        assert!(writer.due().is_none());
        assert!(writer.push(&record(42, "x")).unwrap_err().to_string().contains("revision 42 handed to the writer where 41 was due"));
        writer.push(&record(41, "a")).unwrap();
        assert!(writer.due().is_some() && !writer.full());
        writer.push(&record(42, &"b".repeat(300))).unwrap();
        assert!(writer.full());
        assert_eq!(writer.last_durable(), 40);
        let Flushed::Stored(name) = writer.flush().await.unwrap() else { panic!("not stored") };
        assert_eq!((name.first, name.last, writer.last_durable(), writer.last_pushed()), (41, 42, 42, 42));
        let stored = std::fs::read(dir.path().join(layout.segment(&name))).unwrap();
        assert_eq!(crate::store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&stored)), name.sha256);
        let coding = crate::stream::format::Coding { compression: "zstd".into(), level: 1, recipients: Vec::new() };
        let raw = codec::open(&stored, &coding, None, "seg").await.unwrap();
        let segment = Segment::parse(&raw, "seg").unwrap();
        assert_eq!(segment.records.iter().map(|r| r.revision).collect::<Vec<_>>(), [41, 42]);
        assert_eq!(writer.written().segments, 1);
        assert_eq!(writer.written().first_revision, Some(41));
        writer.push(&record(43, "c")).unwrap();
        assert!(matches!(writer.flush().await.unwrap(), Flushed::Stored(n) if n.first == 43));
    }

    #[tokio::test]
    async fn segments_the_store_refuses_wait_in_the_spool_and_upload_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        // the store's root is a file: every put fails until it is a directory
        let root = dir.path().join("store");
        std::fs::write(&root, b"not a directory").unwrap();
        let store: Arc<dyn Store> = Arc::new(crate::store::LocalStore::new(&root));
        let layout = ChainLayout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        let cut = Cut { interval: Duration::from_secs(10), size: 1 << 20 };
        let spool = SpoolSettings::new(dir.path().join("spool"), 1 << 20);
        let mut writer = ChainWriter::new(store.clone(), layout.clone(), 1, None, cut, 40).with_spool(spool.clone());
        writer.push(&record(41, "a")).unwrap();
        let Flushed::Spooled { name, error: Some(error) } = writer.flush().await.unwrap() else { panic!("not spooled") };
        assert_eq!((name.first, writer.last_durable(), writer.last_pushed()), (41, 40, 41));
        assert!(!error.is_empty());
        // the store is back, but 42 must not reach it before 41
        std::fs::remove_file(&root).unwrap();
        std::fs::create_dir(&root).unwrap();
        writer.push(&record(42, "b")).unwrap();
        assert!(matches!(writer.flush().await.unwrap(), Flushed::Spooled { ref name, error: None } if name.first == 42));
        assert!(store.list("clusters/").await.unwrap().is_empty(), "a segment reached the store before the ones spooled before it");
        for expected in [41, 42] {
            let upload = writer.upload().expect("a spooled segment");
            assert_eq!(upload.segment().name.first, expected);
            let segment = upload.run().await.unwrap();
            writer.uploaded(&segment).unwrap();
            assert_eq!(writer.last_durable(), expected);
        }
        assert!(!writer.spooling() && spool.used() == 0);
        assert_eq!((writer.written().segments, writer.written().first_revision), (2, Some(41)));
        writer.push(&record(43, "c")).unwrap();
        assert!(matches!(writer.flush().await.unwrap(), Flushed::Stored(n) if n.first == 43));
        assert_eq!(store.list("clusters/").await.unwrap().len(), 3);

        // no room: the segment is dropped, nothing kept past the bound
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::write(&root, b"down again").unwrap();
        let tiny = SpoolSettings::new(dir.path().join("tiny"), 10);
        let mut writer = ChainWriter::new(store, layout, 1, None, cut, 43).with_spool(tiny.clone());
        writer.push(&record(44, "d")).unwrap();
        let Flushed::Full { name, error } = writer.flush().await.unwrap() else { panic!("not full") };
        assert!(name.first == 44 && error.contains("has no room"), "{error}");
        assert!(!writer.spooling() && tiny.used() == 0 && writer.last_durable() == 43);
    }
}
