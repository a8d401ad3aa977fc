//! The open segment of a chain and its durable writes. Revisions are added
//! as the watch hands them on; the segment is cut when it is
//! `segment_interval` old or `segment_size` big, and only when it holds
//! something. A cut is one `Store::put` of the whole encoded segment
//! (local: `.partial`, fsync, rename; S3: a completed PUT): the segment is
//! durable, under its final name, before the next one is started.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::codec;
use super::format::{ChainLayout, RevisionRecord, SegmentBuilder, SegmentName};
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
    written: Written,
}

impl ChainWriter {
    /// A writer for `layout` whose segments follow `last_durable`.
    pub fn new(store: Arc<dyn Store>, layout: ChainLayout, level: i32, recipients: Option<Recipients>, cut: Cut, last_durable: i64) -> ChainWriter {
        ChainWriter { store, layout, level, recipients, cut, open: SegmentBuilder::default(), opened: None, last_durable, written: Written::default() }
    }

    /// Add the next revision to the open segment.
    pub fn push(&mut self, record: &RevisionRecord) -> Result<(), StreamError> {
        let expected = self.open.span().map_or(self.last_durable, |(_, last)| last) + 1;
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
        self.open.span().map_or(self.last_durable, |(_, last)| last)
    }

    pub fn written(&self) -> &Written {
        &self.written
    }

    pub fn layout(&self) -> &ChainLayout {
        &self.layout
    }

    /// Write the open segment durably, if it holds anything; its name.
    /// A failed write is tried again (at most [`ATTEMPTS`] times, backing
    /// off); the segment stays open until it is written.
    pub async fn flush(&mut self) -> Result<Option<SegmentName>, StreamError> {
        let (Some((first, last)), Some(raw)) = (self.open.span(), self.open.finish(&self.layout.chain_id)) else {
            return Ok(None);
        };
        let what = format!("chain {} segment {first}..{last}", self.layout.chain_id);
        let (stored, digest) = codec::seal(&raw, self.level, self.recipients.as_ref(), &what).await?;
        let name = SegmentName { first, last, sha256: digest.sha256.clone() };
        let key = self.layout.segment(&name);
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
        self.written.segments += 1;
        self.written.revisions += self.open.revisions();
        self.written.events += self.open.events();
        self.written.stored_bytes += digest.size;
        self.written.raw_bytes += raw.len() as u64;
        self.written.first_revision.get_or_insert(first);
        self.last_durable = last;
        self.open = SegmentBuilder::default();
        self.opened = None;
        Ok(Some(name))
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
        assert_eq!(writer.flush().await.unwrap(), None, "nothing to write");
        assert!(writer.due().is_none());
        assert!(writer.push(&record(42, "x")).unwrap_err().to_string().contains("revision 42 handed to the writer where 41 was due"));
        writer.push(&record(41, "a")).unwrap();
        assert!(writer.due().is_some() && !writer.full());
        writer.push(&record(42, &"b".repeat(300))).unwrap();
        assert!(writer.full());
        assert_eq!(writer.last_durable(), 40);
        let name = writer.flush().await.unwrap().unwrap();
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
        assert_eq!(writer.flush().await.unwrap().unwrap().first, 43);
    }
}
