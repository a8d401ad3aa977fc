//! What a store holds of one cluster's stream: its chains (oldest first),
//! each with its descriptor and segment names, and from the names alone
//! how far each chain runs without a gap. One listing of the cluster's
//! `stream/` folder; descriptors are read, segments are not.

use serde::Serialize;

use super::format::{ChainDescriptor, ChainLayout, DESCRIPTOR, SEGMENTS, SegmentName};
use super::{StreamError, store_error};
use crate::store::Store;

/// One chain folder.
#[derive(Debug, Clone)]
pub struct ChainListing {
    pub layout: ChainLayout,
    /// The descriptor, or why it could not be read.
    pub descriptor: Result<ChainDescriptor, String>,
    /// The segments whose names parse, sorted by first revision.
    pub segments: Vec<SegmentName>,
    /// Objects under `segments/` whose names do not parse.
    pub strays: Vec<String>,
    /// When the store says each segment was written, by file name (a store
    /// that does not say leaves it out).
    pub written: std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>>,
}

/// How far a chain runs from its base without a gap, by its segment names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Span {
    /// The base revision.
    pub base: i64,
    /// The last revision reached from the base with no gap (the base's
    /// own when no segment follows it).
    pub through: i64,
    /// Segments in that run.
    pub segments: usize,
    /// Where the run stops short of the last segment, when it does.
    pub problem: Option<String>,
}

/// The run of `names` (sorted by first revision) from `base`.
pub fn span(base: i64, names: &[SegmentName]) -> Span {
    let mut through = base;
    for (n, name) in names.iter().enumerate() {
        let problem = if name.first > through + 1 {
            Some(format!("revisions {}..{} are missing: no segment holds them (the next, {}, starts after the gap)", through + 1, name.first - 1, name.file_name()))
        } else if name.first <= through {
            Some(format!("segment {} overlaps revisions already held (through {through}): two streams wrote this chain, or a segment was copied in", name.file_name()))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Span { base, through, segments: n, problem: Some(problem) };
        }
        through = name.last;
    }
    Span { base, through, segments: names.len(), problem: None }
}

impl ChainListing {
    /// The chain's run from its base; `None` without a readable descriptor.
    pub fn span(&self) -> Option<Span> {
        let descriptor = self.descriptor.as_ref().ok()?;
        Some(span(descriptor.base.revision, &self.segments))
    }

    /// The last segment's name, when there is one.
    pub fn last_segment(&self) -> Option<&SegmentName> {
        self.segments.last()
    }

    /// When the chain's restorable run ends: the store's write time of the
    /// last segment of the run from its base (its last revision came
    /// before), the base's time when no segment follows it; `None` without
    /// a readable descriptor or when the store gives no time.
    pub fn run_ends(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let descriptor = self.descriptor.as_ref().ok()?;
        let run = self.span()?;
        match run.segments {
            0 => Some(descriptor.base.taken),
            n => self.written.get(&self.segments[n - 1].file_name()).copied(),
        }
    }

    /// When anything was last written to the chain: its newest segment's
    /// write time, else its base's (`None` as for [`run_ends`](Self::run_ends)).
    pub fn last_written(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let descriptor = self.descriptor.as_ref().ok()?;
        match self.segments.last() {
            None => Some(descriptor.base.taken),
            Some(last) => self.written.get(&last.file_name()).copied(),
        }
    }
}

/// Every chain of `namespace/hosted_cluster` in `store`, oldest first, and
/// the chain folders without a descriptor (a base whose chain never
/// started: the stream stopped while taking it).
pub async fn chains(store: &dyn Store, namespace: &str, hosted_cluster: &str) -> Result<(Vec<ChainListing>, Vec<String>), StreamError> {
    let prefix = ChainLayout::stream_prefix(namespace, hosted_cluster);
    let objects = store.list(&prefix).await.map_err(store_error(format!("listing {}{prefix}", url_slash(store))))?;
    // chain id -> (has descriptor, segment names, strays, write times)
    type Folder = (bool, Vec<SegmentName>, Vec<String>, std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>>);
    let mut folders: std::collections::BTreeMap<String, Folder> = Default::default();
    for object in &objects {
        let Some(rest) = object.key.strip_prefix(&prefix) else { continue };
        let Some((id, inside)) = rest.split_once('/') else { continue };
        if crate::archive::parse_backup_id(id).is_err() {
            continue;
        }
        let folder = folders.entry(id.to_string()).or_default();
        if inside == DESCRIPTOR {
            folder.0 = true;
        } else if let Some(file) = inside.strip_prefix(&format!("{SEGMENTS}/")) {
            match SegmentName::parse(file) {
                Ok(name) => {
                    if let Some(modified) = object.modified {
                        folder.3.insert(name.file_name(), modified);
                    }
                    folder.1.push(name)
                }
                Err(_) => folder.2.push(object.key.clone()),
            }
        }
    }
    let mut listed = Vec::new();
    let mut incomplete = Vec::new();
    for (id, (has_descriptor, mut segments, strays, written)) in folders {
        let layout = ChainLayout::new(namespace, hosted_cluster, &id);
        if !has_descriptor {
            incomplete.push(layout.dir());
            continue;
        }
        segments.sort_by_key(|s| (s.first, s.last));
        let descriptor = read_descriptor(store, &layout).await?;
        listed.push(ChainListing { layout, descriptor, segments, strays, written });
    }
    Ok((listed, incomplete))
}

/// A chain's descriptor: `Err` with the reason when it does not parse.
pub async fn read_descriptor(store: &dyn Store, layout: &ChainLayout) -> Result<Result<ChainDescriptor, String>, StreamError> {
    let key = layout.descriptor();
    let bytes = crate::store::get_bytes(store, &key).await.map_err(store_error(format!("reading {}{key}", url_slash(store))))?;
    Ok(match bytes {
        Some(bytes) => ChainDescriptor::parse(&bytes, layout).map_err(|e| e.to_string()),
        None => Err(format!("{key}: not found")),
    })
}

/// The store's URL with one trailing slash, to put before a key.
pub fn url_slash(store: &dyn Store) -> String {
    format!("{}/", store.url().trim_end_matches('/'))
}

/// One stretch of revisions a chain can restore: its base through the
/// last revision its segments reach without a gap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Window {
    pub chain_id: String,
    pub from: i64,
    pub through: i64,
    pub base_taken: chrono::DateTime<chrono::Utc>,
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "chain {}: revisions {}..{} (base taken {})", self.chain_id, self.from, self.through, self.base_taken.format("%Y-%m-%dT%H:%M:%SZ"))
    }
}

/// The restorable windows of `chains` (those with a readable descriptor).
pub fn windows(chains: &[ChainListing]) -> Vec<Window> {
    chains
        .iter()
        .filter_map(|chain| {
            let descriptor = chain.descriptor.as_ref().ok()?;
            let span = chain.span()?;
            Some(Window { chain_id: chain.layout.chain_id.clone(), from: span.base, through: span.through, base_taken: descriptor.base.taken })
        })
        .collect()
}

/// `windows` as one line each, for messages; says so when there is none.
pub fn describe_windows(windows: &[Window]) -> String {
    if windows.is_empty() {
        return "no chain (start `hcp-dr stream` for the cluster first)".into();
    }
    windows.iter().map(|w| format!("  {w}")).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(first: i64, last: i64) -> SegmentName {
        SegmentName { first, last, sha256: "0".repeat(64) }
    }

    #[test]
    fn a_run_from_the_base_stops_at_the_first_gap_or_overlap() {
        assert_eq!(span(10, &[]), Span { base: 10, through: 10, segments: 0, problem: None });
        assert_eq!(span(10, &[name(11, 15), name(16, 16), name(17, 30)]).through, 30);
        let gap = span(10, &[name(11, 15), name(18, 20)]);
        assert_eq!((gap.through, gap.segments), (15, 1));
        assert!(gap.problem.unwrap().contains("revisions 16..17 are missing"));
        let late_start = span(10, &[name(12, 15)]);
        assert_eq!(late_start.through, 10);
        assert!(late_start.problem.unwrap().contains("revisions 11..11 are missing"));
        let overlap = span(10, &[name(11, 15), name(15, 20)]);
        assert_eq!(overlap.through, 15);
        assert!(overlap.problem.unwrap().contains("overlaps"));
    }

    #[tokio::test]
    async fn chains_are_listed_oldest_first_with_their_segments() {
        use super::super::format::*;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::LocalStore::new(dir.path());
        let old = ChainLayout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        let new = ChainLayout::new("clusters", "demo", "20261121T190000Z-0a1b2d");
        let half = ChainLayout::new("clusters", "demo", "20261121T200000Z-0a1b2e");
        for layout in [&old, &new] {
            let descriptor = serde_json::json!({
                "format": CHAIN_FORMAT, "format_version": FORMAT_VERSION, "chain_id": layout.chain_id,
                "namespace": "clusters", "hosted_cluster": "demo", "started": "2026-11-21T18:00:00Z",
                "base": {"how": "snapshot", "member": "etcd-0", "revision": 100, "taken": "2026-11-21T18:00:00Z",
                         "artifact": "base/etcd-0.db", "size": 1, "sha256": "00", "raw": {"size": 2, "sha256": "11"}},
                "coding": {"compression": "zstd", "level": 1}, "tool_version": "0"
            });
            store.put(&layout.descriptor(), Box::new(serde_json::to_vec(&descriptor).unwrap().as_slice())).await.unwrap();
        }
        for (first, last) in [(104, 110), (101, 103)] {
            store.put(&new.segment(&name(first, last)), Box::new(&b"x"[..])).await.unwrap();
        }
        store.put(&format!("{}stray.txt", new.segments_prefix()), Box::new(&b"x"[..])).await.unwrap();
        store.put(&half.artifact("base/etcd-0.db"), Box::new(&b"x"[..])).await.unwrap();
        // a backup beside the stream is not a chain
        store.put("clusters/demo/20261121T180000Z-0a1b2c/manifest.json", Box::new(&b"{}"[..])).await.unwrap();
        let (chains, incomplete) = chains(&store, "clusters", "demo").await.unwrap();
        assert_eq!(chains.iter().map(|c| c.layout.chain_id.as_str()).collect::<Vec<_>>(), [old.chain_id.as_str(), new.chain_id.as_str()]);
        assert_eq!(chains[1].segments.iter().map(SegmentName::span).collect::<Vec<_>>(), ["101..103", "104..110"]);
        assert_eq!(chains[1].strays.len(), 1);
        assert_eq!(chains[1].span().unwrap().through, 110);
        assert_eq!(incomplete, [half.dir()]);
        let windows = windows(&chains);
        assert_eq!(windows.iter().map(|w| (w.from, w.through)).collect::<Vec<_>>(), [(100, 100), (100, 110)]);
        assert!(describe_windows(&windows).contains("revisions 100..110"));
    }
}
