//! The local spool: where sealed segments wait while the store cannot
//! take them. A segment is durable only once it is in the store; the spool
//! only keeps the stream consuming its watch (so etcd's compaction does not
//! overtake it) while the store is refused or unreachable, and hands the
//! segments back in revision order when the store answers again.
//!
//! Layout: `<dir>/<namespace>/<hosted cluster>/<chain id>/<segment file
//! name>` (the name the segment gets in the store). Files are written as
//! `.partial`, fsynced and renamed, mode 0600 in 0700 directories: an
//! unencrypted segment holds the cluster's secrets as etcd does.
//!
//! One bound for the whole process ([`SpoolSettings::limit`], shared by
//! every clone): a segment that would pass it is not spooled, and its
//! chain breaks.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::format::{ChainLayout, SegmentName};

/// How long a stopping chain keeps trying to upload its spool, by default.
pub const STOP_DRAIN: std::time::Duration = std::time::Duration::from_secs(20);

/// Where segments wait, and how many bytes may wait (every chain of the
/// process together).
#[derive(Debug, Clone)]
pub struct SpoolSettings {
    pub dir: PathBuf,
    pub limit: u64,
    /// How long a stopping chain keeps trying to upload its spool.
    pub stop_drain: std::time::Duration,
    /// Bytes spooled now by every chain sharing these settings.
    used: Arc<AtomicU64>,
}

/// Why a segment could not be spooled, or a spool file not handled.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The segment would take the spool past its bound.
    #[error("the spool ({used} of {limit} bytes used) has no room for a segment of {wanted} bytes")]
    Full { used: u64, limit: u64, wanted: u64 },
    /// Writing, reading or removing a spool file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// A segment in the spool, with what the writer counts of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spooled {
    pub name: SegmentName,
    pub stored_bytes: u64,
    pub raw_bytes: u64,
    pub revisions: u64,
    pub events: u64,
    pub path: PathBuf,
}

impl SpoolSettings {
    pub fn new(dir: PathBuf, limit: u64) -> SpoolSettings {
        SpoolSettings { dir, limit, stop_drain: STOP_DRAIN, used: Arc::new(AtomicU64::new(0)) }
    }

    /// Give a stopping chain `drain` (not [`STOP_DRAIN`]) to upload its spool.
    pub fn with_stop_drain(mut self, drain: std::time::Duration) -> SpoolSettings {
        self.stop_drain = drain;
        self
    }

    /// Bytes spooled now, every chain together.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The directory of a chain's spooled segments.
    pub fn chain_dir(&self, layout: &ChainLayout) -> PathBuf {
        self.cluster_dir(&layout.namespace, &layout.hosted_cluster).join(&layout.chain_id)
    }

    pub fn cluster_dir(&self, namespace: &str, hosted_cluster: &str) -> PathBuf {
        self.dir.join(namespace).join(hosted_cluster)
    }

    /// Create the spool directory (0700) and check a file can be written
    /// there; the error says why not.
    pub fn check(&self) -> Result<(), SpoolError> {
        create_dirs(&self.dir)?;
        let probe = self.dir.join(".hcp-dr-write-check");
        write_synced(&probe, b"")?;
        std::fs::remove_file(&probe).map_err(io(format!("removing {}", probe.display())))
    }

    fn reserve(&self, wanted: u64) -> Result<(), SpoolError> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| used.checked_add(wanted).filter(|total| *total <= self.limit))
            .map(|_| ())
            .map_err(|used| SpoolError::Full { used, limit: self.limit, wanted })
    }

    fn release(&self, bytes: u64) {
        let _ = self.used.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| Some(used.saturating_sub(bytes)));
    }

    /// The chains of a cluster with segments left in the spool (by an
    /// earlier run), each with its segment files in revision order. Files
    /// that are not segments (a `.partial` a crash left) are removed.
    pub fn found(&self, namespace: &str, hosted_cluster: &str) -> Result<Vec<Left>, SpoolError> {
        let dir = self.cluster_dir(namespace, hosted_cluster);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(SpoolError::Io { what: format!("reading {}", dir.display()), source: err }),
        };
        let mut chains = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
            let chain_dir = entry.path();
            if !chain_dir.is_dir() {
                continue;
            }
            let mut segments = Vec::new();
            for file in std::fs::read_dir(&chain_dir).map_err(io(format!("reading {}", chain_dir.display())))? {
                let path = file.map_err(io(format!("reading {}", chain_dir.display())))?.path();
                match path.file_name().and_then(|n| n.to_str()).map(SegmentName::parse) {
                    Some(Ok(name)) => segments.push((name, path)),
                    _ => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            segments.sort_by_key(|(name, _)| name.first);
            if segments.is_empty() {
                let _ = std::fs::remove_dir(&chain_dir);
            } else {
                chains.push(Left { chain_id: entry.file_name().to_string_lossy().into_owned(), segments });
            }
        }
        chains.sort_by(|a, b| a.chain_id.cmp(&b.chain_id));
        Ok(chains)
    }
}

/// A chain's segments an earlier run left in the spool, oldest first.
#[derive(Debug)]
pub struct Left {
    pub chain_id: String,
    pub segments: Vec<(SegmentName, PathBuf)>,
}

/// One chain's spooled segments, oldest first.
#[derive(Debug)]
pub struct ChainSpool {
    settings: SpoolSettings,
    dir: PathBuf,
    queue: VecDeque<Spooled>,
}

impl ChainSpool {
    pub fn new(settings: SpoolSettings, layout: &ChainLayout) -> ChainSpool {
        let dir = settings.chain_dir(layout);
        ChainSpool { settings, dir, queue: VecDeque::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Bytes this chain has spooled.
    pub fn bytes(&self) -> u64 {
        self.queue.iter().map(|s| s.stored_bytes).sum()
    }

    /// The revisions spooled, first to last.
    pub fn span(&self) -> Option<(i64, i64)> {
        Some((self.queue.front()?.name.first, self.queue.back()?.name.last))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn settings(&self) -> &SpoolSettings {
        &self.settings
    }

    /// The oldest spooled segment: the next to upload.
    pub fn head(&self) -> Option<&Spooled> {
        self.queue.front()
    }

    /// Keep `stored` (the segment's bytes as the store would hold them)
    /// durably after the ones spooled before it.
    pub async fn add(&mut self, mut segment: Spooled, stored: Vec<u8>) -> Result<(), SpoolError> {
        let wanted = stored.len() as u64;
        self.settings.reserve(wanted)?;
        let path = self.dir.join(segment.name.file_name());
        let (dir, target) = (self.dir.clone(), path.clone());
        let written = tokio::task::spawn_blocking(move || {
            create_dirs(&dir)?;
            write_synced(&target, &stored)
        })
        .await
        .unwrap_or_else(|err| Err(SpoolError::Io { what: format!("writing {}", path.display()), source: std::io::Error::other(err.to_string()) }));
        if let Err(err) = written {
            self.settings.release(wanted);
            return Err(err);
        }
        segment.path = path;
        segment.stored_bytes = wanted;
        self.queue.push_back(segment);
        Ok(())
    }

    /// The oldest segment is in the store now: forget it here.
    pub fn remove_head(&mut self) -> Result<Spooled, SpoolError> {
        let Some(head) = self.queue.pop_front() else {
            return Err(SpoolError::Io { what: format!("the spool of {}", self.dir.display()), source: std::io::Error::other("nothing spooled") });
        };
        self.settings.release(head.stored_bytes);
        let removed = std::fs::remove_file(&head.path).map_err(io(format!("removing {}", head.path.display())));
        if self.queue.is_empty() {
            let _ = std::fs::remove_dir(&self.dir);
        }
        removed.map(|_| head)
    }

    /// Segments an earlier run left, counted against the bound (even past
    /// it: they are on disk already).
    pub fn adopt(&mut self, segment: Spooled) {
        self.settings.used.fetch_add(segment.stored_bytes, Ordering::SeqCst);
        self.queue.push_back(segment);
    }
}

impl Drop for ChainSpool {
    /// A chain task that ends (or is aborted: its Lease lost) gives its
    /// share of the bound back; its files stay for the next run.
    fn drop(&mut self) {
        self.settings.release(self.bytes());
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> SpoolError {
    move |source| SpoolError::Io { what, source }
}

fn create_dirs(dir: &Path) -> Result<(), SpoolError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io(format!("creating {}", dir.display())))
}

/// `path` holds `bytes` durably: written as `.partial` (0600), fsynced,
/// renamed, the directory fsynced.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), SpoolError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = path.with_extension("partial");
    let what = || format!("writing {}", partial.display());
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&partial).map_err(io(what()))?;
    file.write_all(bytes).map_err(io(what()))?;
    file.sync_all().map_err(io(what()))?;
    std::fs::rename(&partial, path).map_err(io(format!("renaming {} to {}", partial.display(), path.display())))?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io(format!("syncing {}", parent.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(first: i64, last: i64) -> Spooled {
        Spooled { name: SegmentName { first, last, sha256: "a".repeat(64) }, stored_bytes: 0, raw_bytes: 1, revisions: 1, events: 1, path: PathBuf::new() }
    }

    #[tokio::test]
    async fn the_spool_keeps_segments_in_order_on_disk_within_its_bound() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let settings = SpoolSettings::new(dir.path().join("spool"), 10);
        settings.check().unwrap();
        let layout = ChainLayout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        let mut spool = ChainSpool::new(settings.clone(), &layout);
        spool.add(segment(5, 6), vec![1; 4]).await.unwrap();
        spool.add(segment(7, 7), vec![2; 4]).await.unwrap();
        let err = spool.add(segment(8, 8), vec![3; 4]).await.unwrap_err();
        assert!(matches!(err, SpoolError::Full { used: 8, limit: 10, wanted: 4 }), "{err}");
        assert_eq!((settings.used(), spool.bytes(), spool.span()), (8, 8, Some((5, 7))));
        let head = spool.head().unwrap();
        assert_eq!(std::fs::read(&head.path).unwrap(), [1; 4]);
        assert_eq!(std::fs::metadata(&head.path).unwrap().permissions().mode() & 0o777, 0o600);
        let found = settings.found("clusters", "demo").unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].chain_id, layout.chain_id);
        assert_eq!(found[0].segments.iter().map(|(n, _)| n.first).collect::<Vec<_>>(), [5, 7]);
        assert_eq!(spool.remove_head().unwrap().name.first, 5);
        assert_eq!(settings.used(), 4);
        spool.remove_head().unwrap();
        assert!(spool.is_empty() && settings.used() == 0 && !spool.dir().exists());
        assert!(settings.found("clusters", "demo").unwrap().is_empty());
    }
}
