//! The stream's stored format, defined here and nowhere else: where a
//! chain lives in a store, its descriptor, and its segments of events
//! (docs/backup-format.md, "Stream chains").
//!
//! ```text
//! <namespace>/<hosted-cluster>/stream/<chain-id>/
//!     base/<member>.db          the base: an etcd snapshot, zstd (age-encrypted with --encrypt-to)
//!     chain.json                the descriptor, written once the base is durable
//!     segments/<first>-<last>-<sha256>.seg
//! ```
//!
//! `chain-id` has the backup id's form (`YYYYMMDDTHHMMSSZ-xxxxxx`, the
//! chain's start), so chains sort by time and `backups list` never takes
//! the `stream` folder for a backup. A segment's name holds its first and
//! last revision (20 digits, so a listing sorts by revision) and the
//! SHA-256 of its stored bytes: a verifier needs the listing and the
//! objects, nothing else, and a segment is durable in one write.
//!
//! A segment's content (before zstd, and age when the chain is encrypted)
//! is JSON lines: a header, then one record per etcd revision with its
//! events and the wall time the stream received it.

use std::fmt;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::store::PutReport;

/// The descriptor's `format`.
pub const CHAIN_FORMAT: &str = "hcp-dr-stream-chain";
/// A segment header's `format`.
pub const SEGMENT_FORMAT: &str = "hcp-dr-stream-segment";
/// The version of both this code writes; readers accept exactly it.
pub const FORMAT_VERSION: u32 = 1;
/// The folder of a cluster's chains, beside its backups.
pub const STREAM_FOLDER: &str = "stream";
/// The descriptor's file name in a chain's folder.
pub const DESCRIPTOR: &str = "chain.json";
/// The segments' folder in a chain's folder.
pub const SEGMENTS: &str = "segments";
/// A segment's file name ends so.
pub const SEGMENT_SUFFIX: &str = ".seg";
/// Digits of a revision in a segment's name: every i64 fits.
const REVISION_DIGITS: usize = 20;
/// The most a segment may decode to: a bound for a damaged or hostile
/// frame (the writer cuts segments at 256 MiB at most, plus one revision).
pub const MAX_SEGMENT_RAW: u64 = 1 << 30;

/// Why stored stream data was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct FormatError {
    /// The object (key) or part refused.
    pub what: String,
    pub reason: String,
}

fn refuse(what: &str, reason: impl Into<String>) -> FormatError {
    FormatError { what: what.to_string(), reason: reason.into() }
}

/// Where each part of one chain lives in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainLayout {
    pub namespace: String,
    pub hosted_cluster: String,
    pub chain_id: String,
}

impl ChainLayout {
    pub fn new(namespace: &str, hosted_cluster: &str, chain_id: &str) -> ChainLayout {
        ChainLayout { namespace: namespace.to_string(), hosted_cluster: hosted_cluster.to_string(), chain_id: chain_id.to_string() }
    }

    /// The folder of every chain of one hosted cluster.
    pub fn stream_prefix(namespace: &str, hosted_cluster: &str) -> String {
        format!("{}{STREAM_FOLDER}/", crate::archive::Layout::cluster_prefix(namespace, hosted_cluster))
    }

    pub fn dir(&self) -> String {
        format!("{}{}", Self::stream_prefix(&self.namespace, &self.hosted_cluster), self.chain_id)
    }

    pub fn descriptor(&self) -> String {
        format!("{}/{DESCRIPTOR}", self.dir())
    }

    /// The base artifact's name, relative to the chain's folder.
    pub fn base_name(member: &str) -> String {
        format!("base/{member}.db")
    }

    /// The key of an artifact named relative to the chain's folder.
    pub fn artifact(&self, name: &str) -> String {
        format!("{}/{name}", self.dir())
    }

    pub fn segments_prefix(&self) -> String {
        format!("{}/{SEGMENTS}/", self.dir())
    }

    pub fn segment(&self, name: &SegmentName) -> String {
        format!("{}{}", self.segments_prefix(), name.file_name())
    }

    /// The chain whose descriptor is at `key` (`<ns>/<hc>/stream/<id>/chain.json`).
    pub fn from_descriptor_key(key: &str) -> Option<ChainLayout> {
        let mut parts = key.split('/');
        let (ns, hc, folder, id, file) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let ok = parts.next().is_none() && folder == STREAM_FOLDER && file == DESCRIPTOR && crate::archive::parse_backup_id(id).is_ok();
        ok.then(|| ChainLayout::new(ns, hc, id))
    }
}

/// A segment's file name: `<first>-<last>-<sha256>.seg`, revisions in 20
/// digits, the SHA-256 of the bytes stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentName {
    pub first: i64,
    pub last: i64,
    /// Lowercase hex SHA-256 of the stored object.
    pub sha256: String,
}

impl SegmentName {
    pub fn file_name(&self) -> String {
        format!("{:0w$}-{:0w$}-{}{SEGMENT_SUFFIX}", self.first, self.last, self.sha256, w = REVISION_DIGITS)
    }

    /// Parse a file name (not a whole key); the error says what is wrong.
    pub fn parse(file: &str) -> Result<SegmentName, FormatError> {
        let bad = |reason: &str| refuse(file, format!("not a segment name ({reason}); segments are named <first revision>-<last revision>-<sha256>{SEGMENT_SUFFIX}"));
        let stem = file.strip_suffix(SEGMENT_SUFFIX).ok_or_else(|| bad("no .seg suffix"))?;
        let mut parts = stem.split('-');
        let (Some(first), Some(last), Some(sha256), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad("not three parts"));
        };
        let revision = |text: &str| -> Result<i64, FormatError> {
            if text.len() != REVISION_DIGITS || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("a revision is not 20 digits"));
            }
            text.parse::<i64>().map_err(|_| bad("a revision is out of range"))
        };
        let (first, last) = (revision(first)?, revision(last)?);
        if first < 1 || last < first {
            return Err(bad("its revisions are not 1 <= first <= last"));
        }
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(bad("the SHA-256 is not 64 lowercase hex digits"));
        }
        Ok(SegmentName { first, last, sha256: sha256.to_string() })
    }

    /// `first..last`, as messages show a segment's revisions.
    pub fn span(&self) -> String {
        format!("{}..{}", self.first, self.last)
    }
}

/// How a chain's base was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BaseKind {
    /// An etcd snapshot of one member, taken by the stream without pausing
    /// or scaling anything (etcd serves it from one read transaction).
    Snapshot,
    /// The best snapshot of the cluster's newest regular backup
    /// (`--base-from-backup`), copied as it was stored: no load on etcd.
    Backup,
}

/// The etcd snapshot a chain starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Base {
    pub how: BaseKind,
    /// The member it was taken from (its pod).
    pub member: String,
    /// The revision it holds (read from the snapshot itself).
    pub revision: i64,
    /// When etcd was asked for it.
    pub taken: DateTime<Utc>,
    /// The artifact, relative to the chain's folder (`base/etcd-0.db`).
    pub artifact: String,
    /// Size and SHA-256 of what is stored (zstd, then age when encrypted).
    pub size: u64,
    pub sha256: String,
    /// Size and SHA-256 of the snapshot as etcd streamed it (its trailing
    /// hash included): what a reader gets after decoding.
    pub raw: PutReport,
    /// The regular backup it was copied from (`how: backup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
}

/// How segments (and the base) are encoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coding {
    /// `zstd`.
    pub compression: String,
    pub level: i32,
    /// The age recipients when the chain is encrypted (`--encrypt-to`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recipients: Vec<String>,
}

/// Why a chain replaced the one before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previous {
    pub chain_id: String,
    /// The last revision that chain holds durably.
    pub last_revision: i64,
    /// `compacted: ...`, `gap: ...`, `base-interval`, `not resumable: ...`.
    pub reason: String,
}

/// `chain.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainDescriptor {
    pub format: String,
    pub format_version: u32,
    pub chain_id: String,
    pub namespace: String,
    pub hosted_cluster: String,
    pub started: DateTime<Utc>,
    pub base: Base,
    pub coding: Coding,
    /// The chain this one follows, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
    pub tool_version: String,
}

impl ChainDescriptor {
    /// Parse and check a descriptor read from `layout`'s folder.
    pub fn parse(bytes: &[u8], layout: &ChainLayout) -> Result<ChainDescriptor, FormatError> {
        let what = layout.descriptor();
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| refuse(&what, format!("not JSON: {e}")))?;
        if value.get("format").and_then(serde_json::Value::as_str) != Some(CHAIN_FORMAT) {
            return Err(refuse(&what, format!("not a chain descriptor (no \"format\": \"{CHAIN_FORMAT}\")")));
        }
        let version = value.get("format_version").and_then(serde_json::Value::as_u64);
        if version != Some(u64::from(FORMAT_VERSION)) {
            return Err(refuse(&what, format!("format version {} is not supported (this hcp-dr reads version {FORMAT_VERSION}); use the hcp-dr release that wrote it", version.map_or("(none)".into(), |v| v.to_string()))));
        }
        let descriptor: ChainDescriptor = serde_json::from_value(value).map_err(|e| refuse(&what, format!("not a chain descriptor: {e}")))?;
        let expected = (layout.namespace.as_str(), layout.hosted_cluster.as_str(), layout.chain_id.as_str());
        if (descriptor.namespace.as_str(), descriptor.hosted_cluster.as_str(), descriptor.chain_id.as_str()) != expected {
            return Err(refuse(&what, format!("it names chain {}/{}/{} but lies in the folder of {}/{}/{}", descriptor.namespace, descriptor.hosted_cluster, descriptor.chain_id, expected.0, expected.1, expected.2)));
        }
        if descriptor.base.revision < 1 {
            return Err(refuse(&what, format!("base revision {} is not a revision", descriptor.base.revision)));
        }
        let artifact = &descriptor.base.artifact;
        if !artifact.starts_with("base/") || crate::store::check_key(artifact).is_err() {
            return Err(refuse(&what, format!("base artifact `{artifact}` is not a file under base/")));
        }
        if descriptor.coding.compression != crate::archive::compression::ALGORITHM {
            return Err(refuse(&what, format!("compression `{}` is not supported (zstd is)", descriptor.coding.compression)));
        }
        Ok(descriptor)
    }

    pub fn encrypted(&self) -> bool {
        !self.coding.recipients.is_empty()
    }
}

/// Bytes as base64 in JSON (etcd keys and values are bytes: Kubernetes
/// stores most objects as protobuf).
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD.decode(text.as_bytes()).map(Bytes).map_err(serde::de::Error::custom)
    }
}

/// One change of one key, as etcd's watch reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Event {
    Put {
        key: Bytes,
        value: Bytes,
        create_revision: i64,
        mod_revision: i64,
        version: i64,
        /// The lease the key is attached to (0: none).
        #[serde(default, skip_serializing_if = "is_zero")]
        lease: i64,
    },
    Delete {
        key: Bytes,
    },
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl Event {
    pub fn key(&self) -> &[u8] {
        match self {
            Event::Put { key, .. } | Event::Delete { key } => &key.0,
        }
    }
}

/// A lease first seen at a revision, with the TTL it was granted: replay
/// grants it again with that TTL, so keys written with it (Events) still
/// expire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub id: i64,
    /// Seconds; `None` when etcd no longer knew the lease when asked (it
    /// expired or was revoked at once: its keys' deletions follow).
    pub ttl: Option<i64>,
}

/// Everything one etcd revision (one write transaction) changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionRecord {
    pub revision: i64,
    /// When the stream received it (after a catch-up, later than the
    /// write: a point-in-time restore by time then picks an earlier
    /// revision, never a later one).
    pub received: DateTime<Utc>,
    pub events: Vec<Event>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<LeaseGrant>,
}

/// A segment's first line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentHeader {
    pub format: String,
    pub format_version: u32,
    pub chain_id: String,
    pub first_revision: i64,
    pub last_revision: i64,
    pub revisions: u64,
    pub events: u64,
    pub first_received: DateTime<Utc>,
    pub last_received: DateTime<Utc>,
}

/// The records of one segment as they are gathered, each serialized once
/// when it is added: its raw size is known at every step (the writer cuts
/// on it).
#[derive(Debug, Default)]
pub struct SegmentBuilder {
    lines: Vec<u8>,
    first: Option<(i64, DateTime<Utc>)>,
    last: Option<(i64, DateTime<Utc>)>,
    revisions: u64,
    events: u64,
}

impl SegmentBuilder {
    /// Add the next revision; it must follow the last one added.
    pub fn push(&mut self, record: &RevisionRecord) -> Result<(), FormatError> {
        if let Some((last, _)) = self.last
            && record.revision != last + 1
        {
            return Err(refuse("the segment being written", format!("revision {} does not follow {last}", record.revision)));
        }
        let line = serde_json::to_vec(record).map_err(|e| refuse("the segment being written", e.to_string()))?;
        self.lines.extend_from_slice(&line);
        self.lines.push(b'\n');
        self.first.get_or_insert((record.revision, record.received));
        self.last = Some((record.revision, record.received));
        self.revisions += 1;
        self.events += record.events.len() as u64;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.revisions == 0
    }

    /// Bytes of the records so far (the raw segment less its header).
    pub fn raw_size(&self) -> usize {
        self.lines.len()
    }

    /// `(first, last)` revision, when not empty.
    pub fn span(&self) -> Option<(i64, i64)> {
        Some((self.first?.0, self.last?.0))
    }

    pub fn revisions(&self) -> u64 {
        self.revisions
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    /// The raw segment (header and records); `None` when empty.
    pub fn finish(&self, chain_id: &str) -> Option<Vec<u8>> {
        let ((first, first_received), (last, last_received)) = (self.first?, self.last?);
        let header = SegmentHeader {
            format: SEGMENT_FORMAT.into(),
            format_version: FORMAT_VERSION,
            chain_id: chain_id.to_string(),
            first_revision: first,
            last_revision: last,
            revisions: self.revisions,
            events: self.events,
            first_received,
            last_received,
        };
        let mut out = serde_json::to_vec(&header).ok()?;
        out.push(b'\n');
        out.extend_from_slice(&self.lines);
        Some(out)
    }
}

/// A decoded segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub header: SegmentHeader,
    pub records: Vec<RevisionRecord>,
}

impl Segment {
    /// Parse a raw segment (`what` names it in errors) and check it holds
    /// what its header says: revisions `first..=last`, each once, in
    /// order, each with events whose puts carry that revision.
    pub fn parse(raw: &[u8], what: &str) -> Result<Segment, FormatError> {
        let mut lines = raw.split(|b| *b == b'\n').filter(|l| !l.is_empty());
        let head = lines.next().ok_or_else(|| refuse(what, "empty segment"))?;
        let value: serde_json::Value = serde_json::from_slice(head).map_err(|e| refuse(what, format!("header is not JSON: {e}")))?;
        if value.get("format").and_then(serde_json::Value::as_str) != Some(SEGMENT_FORMAT) {
            return Err(refuse(what, format!("not a stream segment (no \"format\": \"{SEGMENT_FORMAT}\")")));
        }
        let version = value.get("format_version").and_then(serde_json::Value::as_u64);
        if version != Some(u64::from(FORMAT_VERSION)) {
            return Err(refuse(what, format!("segment format version {} is not supported (this hcp-dr reads version {FORMAT_VERSION})", version.map_or("(none)".into(), |v| v.to_string()))));
        }
        let header: SegmentHeader = serde_json::from_value(value).map_err(|e| refuse(what, format!("header: {e}")))?;
        let mut records = Vec::new();
        let mut events = 0u64;
        for (n, line) in lines.enumerate() {
            let record: RevisionRecord = serde_json::from_slice(line).map_err(|e| refuse(what, format!("record {}: {e}", n + 1)))?;
            let expected = header.first_revision.checked_add(n as i64).ok_or_else(|| refuse(what, "revision overflow"))?;
            if record.revision != expected {
                return Err(refuse(what, format!("record {} is revision {} where {expected} was due: revisions are missing or out of order", n + 1, record.revision)));
            }
            if record.events.is_empty() {
                return Err(refuse(what, format!("revision {} has no event", record.revision)));
            }
            if let Some(bad) = record.events.iter().find_map(|e| match e {
                Event::Put { mod_revision, .. } if *mod_revision != record.revision => Some(*mod_revision),
                _ => None,
            }) {
                return Err(refuse(what, format!("revision {} holds a put of revision {bad}", record.revision)));
            }
            events += record.events.len() as u64;
            records.push(record);
        }
        let last = records.last().map(|r| r.revision);
        if last != Some(header.last_revision) || records.len() as u64 != header.revisions || events != header.events {
            return Err(refuse(
                what,
                format!(
                    "holds {} revisions ({} events) up to {}, but its header says {} ({} events) {}..{}: it is truncated or was altered",
                    records.len(),
                    events,
                    last.map_or("(none)".into(), |l| l.to_string()),
                    header.revisions,
                    header.events,
                    header.first_revision,
                    header.last_revision
                ),
            ));
        }
        Ok(Segment { header, records })
    }
}

/// A descriptor of an unencrypted chain at `layout` whose base from
/// `etcd-0` at `revision` is stored as `stored` and decodes to `raw`.
#[cfg(test)]
pub(crate) fn for_test(layout: &ChainLayout, revision: i64, stored: PutReport, raw: PutReport) -> ChainDescriptor {
    ChainDescriptor {
        format: CHAIN_FORMAT.into(),
        format_version: FORMAT_VERSION,
        chain_id: layout.chain_id.clone(),
        namespace: layout.namespace.clone(),
        hosted_cluster: layout.hosted_cluster.clone(),
        started: Utc::now(),
        base: Base { how: BaseKind::Snapshot, member: "etcd-0".into(), revision, taken: Utc::now(), artifact: "base/etcd-0.db".into(), size: stored.size, sha256: stored.sha256, raw, backup_id: None },
        coding: Coding { compression: "zstd".into(), level: 1, recipients: Vec::new() },
        previous: None,
        tool_version: "0".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, revision: i64, lease: i64) -> Event {
        Event::Put { key: Bytes(key.into()), value: Bytes(value.into()), create_revision: revision, mod_revision: revision, version: 1, lease }
    }

    fn record(revision: i64, events: Vec<Event>) -> RevisionRecord {
        RevisionRecord { revision, received: Utc::now(), events, leases: Vec::new() }
    }

    #[test]
    fn names_sort_by_revision_and_round_trip() {
        let sha = "ab".repeat(32);
        let a = SegmentName { first: 9, last: 10, sha256: sha.clone() };
        let b = SegmentName { first: 11, last: 1200, sha256: sha.clone() };
        assert!(a.file_name() < b.file_name(), "{} {}", a.file_name(), b.file_name());
        assert_eq!(a.file_name(), format!("00000000000000000009-00000000000000000010-{sha}.seg"));
        assert_eq!(SegmentName::parse(&b.file_name()).unwrap(), b);
        for bad in [
            "x.seg",
            "00000000000000000009-00000000000000000010.seg",
            &format!("9-10-{sha}.seg"),
            &format!("00000000000000000011-00000000000000000010-{sha}.seg"),
            &format!("00000000000000000000-00000000000000000010-{sha}.seg"),
            &format!("00000000000000000009-00000000000000000010-{}.seg", "AB".repeat(32)),
            &format!("00000000000000000009-00000000000000000010-{sha}.seg.partial"),
            &format!("99999999999999999999-99999999999999999999-{sha}.seg"),
        ] {
            let err = SegmentName::parse(bad).unwrap_err();
            assert!(err.to_string().contains("not a segment name"), "{bad}: {err}");
        }
    }

    #[test]
    fn layouts_sit_beside_the_backups_and_parse_back() {
        let layout = ChainLayout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        assert_eq!(layout.descriptor(), "clusters/demo/stream/20261121T180000Z-0a1b2c/chain.json");
        assert_eq!(layout.artifact(&ChainLayout::base_name("etcd-1")), "clusters/demo/stream/20261121T180000Z-0a1b2c/base/etcd-1.db");
        assert_eq!(ChainLayout::from_descriptor_key(&layout.descriptor()), Some(layout.clone()));
        assert_eq!(ChainLayout::from_descriptor_key("clusters/demo/stream/latest/chain.json"), None);
        assert_eq!(ChainLayout::from_descriptor_key("clusters/demo/20261121T180000Z-0a1b2c/chain.json"), None);
        // a backup listing never sees the stream folder as a backup
        assert!(crate::archive::parse_backup_id(STREAM_FOLDER).is_err());
    }

    #[test]
    fn a_segment_round_trips_with_bytes_leases_and_deletes() {
        let mut builder = SegmentBuilder::default();
        let mut first = record(41, vec![put("/a", "1", 41, 0), Event::Delete { key: Bytes(vec![0xff, 0, 1]) }]);
        first.leases.push(LeaseGrant { id: 7, ttl: Some(3600) });
        let second = record(42, vec![Event::Put { key: Bytes(b"/k8s\0bin".to_vec()), value: Bytes(vec![0, 159, 146, 150]), create_revision: 3, mod_revision: 42, version: 9, lease: 7 }]);
        builder.push(&first).unwrap();
        builder.push(&second).unwrap();
        assert_eq!(builder.span(), Some((41, 42)));
        let raw = builder.finish("c").unwrap();
        let segment = Segment::parse(&raw, "seg").unwrap();
        assert_eq!(segment.records, vec![first, second]);
        assert_eq!((segment.header.first_revision, segment.header.last_revision, segment.header.events), (41, 42, 3));
        assert!(builder.push(&record(44, vec![put("/b", "2", 44, 0)])).unwrap_err().to_string().contains("does not follow 42"));
        assert!(SegmentBuilder::default().finish("c").is_none());
    }

    #[test]
    fn damaged_segments_are_refused_saying_why() {
        let mut builder = SegmentBuilder::default();
        for r in 5..=8 {
            builder.push(&record(r, vec![put("/a", "x", r, 0)])).unwrap();
        }
        let raw = builder.finish("c").unwrap();
        // a record lost
        let text = String::from_utf8(raw.clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let dropped = [lines[0], lines[1], lines[3], lines[4]].join("\n");
        assert!(Segment::parse(dropped.as_bytes(), "s").unwrap_err().reason.contains("revision 7 where 6 was due"));
        // truncated at the end
        let cut = lines[..4].join("\n");
        assert!(Segment::parse(cut.as_bytes(), "s").unwrap_err().reason.contains("truncated"));
        // not a segment, not JSON, another version
        assert!(Segment::parse(b"{\"format\":\"x\"}\n", "s").unwrap_err().reason.contains("not a stream segment"));
        assert!(Segment::parse(b"\x28\xb5\x2f\xfd", "s").unwrap_err().reason.contains("not JSON"));
        let newer = text.replacen("\"format_version\":1", "\"format_version\":9", 1);
        assert!(Segment::parse(newer.as_bytes(), "s").unwrap_err().reason.contains("version 9 is not supported"));
        assert!(Segment::parse(b"", "s").unwrap_err().reason.contains("empty"));
        // a put stamped with another revision
        let mut builder = SegmentBuilder::default();
        builder.push(&record(5, vec![put("/a", "x", 4, 0)])).unwrap();
        assert!(Segment::parse(&builder.finish("c").unwrap(), "s").unwrap_err().reason.contains("holds a put of revision 4"));
    }

    #[test]
    fn descriptors_are_checked_against_their_folder() {
        let layout = ChainLayout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        let descriptor = for_test(&layout, 10, PutReport { size: 1, sha256: "00".repeat(32) }, PutReport { size: 2, sha256: "11".repeat(32) });
        let bytes = serde_json::to_vec(&descriptor).unwrap();
        assert_eq!(ChainDescriptor::parse(&bytes, &layout).unwrap(), descriptor);
        let elsewhere = ChainLayout::new("clusters", "other", &layout.chain_id);
        assert!(ChainDescriptor::parse(&bytes, &elsewhere).unwrap_err().reason.contains("lies in the folder of clusters/other"));
        let mut escaping = descriptor.clone();
        escaping.base.artifact = "base/../../x".into();
        assert!(ChainDescriptor::parse(&serde_json::to_vec(&escaping).unwrap(), &layout).unwrap_err().reason.contains("not a file under base/"));
        let newer = String::from_utf8(bytes).unwrap().replace("\"format_version\":1", "\"format_version\":2");
        assert!(ChainDescriptor::parse(newer.as_bytes(), &layout).unwrap_err().reason.contains("version 2 is not supported"));
        assert!(ChainDescriptor::parse(b"[]", &layout).unwrap_err().reason.contains("not a chain descriptor"));
    }
}
