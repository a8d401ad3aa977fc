//! The emulated `snapshot restore --bump-revision N --mark-compacted`.
//!
//! etcd 3.5's `etcdutl` raises the restored revision by `N` and marks the
//! history up to it compacted, so that watchers resuming from a revision of
//! the old cluster get `compacted` instead of silently missing changes.
//! Debian's etcd 3.4 has no such flags, so the sandbox reaches the same
//! result with writes: the snapshot is restored into a scratch single-member
//! etcd, one key is written `N - 1` times and deleted (each write is one
//! revision; up to [`IN_FLIGHT`] writes are in flight at once, sent as raw
//! gRPC frames made once, see [`raw_puts`]: about 20,000 revisions a second
//! on two cores, etcd's own limit), the history is compacted at the new
//! revision, the store defragmented, and a snapshot of that member is what
//! the members are restored from. Same revision, same
//! keys, same compacted revision as etcdutl's result; at most
//! [`MAX_EMULATED_BUMP`] revisions.
//!
//! The bumped snapshot depends only on the snapshot and `N`, so it is made
//! once per (snapshot SHA-256, `N`) and shared by the members of a restore
//! ([`BumpCache`], in `state_dir/bumped-snapshots/`); it is removed once no
//! pod that may still need it remains ([`BumpCache::collect`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{OperatorError, io_err};
use crate::procs::etcd::restore_scratch;

/// The most revisions the emulated `--bump-revision` writes.
pub const MAX_EMULATED_BUMP: u64 = 1_000_000;
/// How many writes of the emulated bump are in flight at once.
pub const IN_FLIGHT: usize = 256;
/// The key the emulated bump writes, then deletes.
const KEY: &str = "\0hcp-dr-sandbox/bump-revision";

/// A bumped snapshot: the SHA-256 of the snapshot and the bump.
pub type BumpKey = (String, u64);

/// Wall time this process has spent making bumped snapshots, in
/// nanoseconds (see [`emulated_time`]).
static EMULATED_NANOS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long the sandboxes of this process have spent emulating
/// `--bump-revision` with writes, a restore, a compaction and a
/// defragmentation, while the restore pods waited for it. etcdutl does the
/// same in place, with one write, so the benchmarks take this time out of a
/// seeded restore's to compare it with the raw data steps.
pub fn emulated_time() -> std::time::Duration {
    std::time::Duration::from_nanos(EMULATED_NANOS.load(std::sync::atomic::Ordering::Relaxed))
}

/// The bumped snapshots of the restores in progress, and who uses them.
pub struct BumpCache {
    dir: PathBuf,
    /// One lock per key: the first member computes, the others wait and reuse.
    locks: Mutex<HashMap<BumpKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Restores in progress by pod uid, with the key they use once known.
    users: Mutex<HashMap<String, Option<BumpKey>>>,
}

/// A restore in progress ([`BumpCache::enter`]); leaves when dropped (also
/// when its task is aborted).
pub struct BumpUser<'a> {
    cache: &'a BumpCache,
    uid: String,
}

impl BumpUser<'_> {
    /// The key this restore uses (from here on kept by [`BumpCache::collect`]).
    pub fn uses(&self, key: &BumpKey) {
        if let Ok(mut users) = self.cache.users.lock() {
            users.insert(self.uid.clone(), Some(key.clone()));
        }
    }
}

impl Drop for BumpUser<'_> {
    fn drop(&mut self) {
        if let Ok(mut users) = self.cache.users.lock() {
            users.remove(&self.uid);
        }
    }
}

impl BumpCache {
    /// The cache of an operator whose state is in `state_dir`.
    pub fn new(state_dir: &Path) -> BumpCache {
        BumpCache {
            dir: state_dir.join("bumped-snapshots"),
            locks: Mutex::new(HashMap::new()),
            users: Mutex::new(HashMap::new()),
        }
    }

    /// The file of `key`.
    fn path(&self, key: &BumpKey) -> PathBuf {
        self.dir.join(format!("{}-{}.db", key.0, key.1))
    }

    /// Register the restore of pod `uid` (its key not known yet: until it
    /// is, nothing is collected).
    pub fn enter(&self, uid: &str) -> BumpUser<'_> {
        if let Ok(mut users) = self.users.lock() {
            users.insert(uid.to_string(), None);
        }
        BumpUser { cache: self, uid: uid.to_string() }
    }

    /// `snapshot` (whose SHA-256 is `sha256`) bumped by `bump` revisions and
    /// compacted there: made in `work` (a scratch directory of the caller)
    /// the first time, reused afterwards. `user` must come from
    /// [`BumpCache::enter`] and is marked as using it.
    pub async fn bumped(&self, user: &BumpUser<'_>, snapshot: &Path, sha256: &str, bump: u64, work: &Path) -> Result<PathBuf, OperatorError> {
        if !(2..=MAX_EMULATED_BUMP).contains(&bump) {
            return Err(OperatorError::Invalid {
                what: format!(
                    "--bump-revision {bump}: the sandbox emulates the bump with writes and does 2 to {MAX_EMULATED_BUMP}; pass another --bump-revision"
                ),
            });
        }
        let key = (sha256.to_string(), bump);
        user.uses(&key);
        let lock = self
            .locks
            .lock()
            .map_err(|_| OperatorError::Waiting("bump cache poisoned".into()))?
            .entry(key.clone())
            .or_default()
            .clone();
        let _held = lock.lock().await;
        let path = self.path(&key);
        if path.is_file() {
            tracing::info!(sha256, bump, "emulated --bump-revision: reusing the bumped snapshot");
            return Ok(path);
        }
        std::fs::create_dir_all(&self.dir).map_err(io_err("creating", &self.dir))?;
        let started = std::time::Instant::now();
        let made = bump_revision(snapshot, work, bump).await?;
        let took = started.elapsed();
        tracing::info!(sha256, bump, seconds = took.as_secs_f64(), "emulated --bump-revision");
        EMULATED_NANOS.fetch_add(took.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        if std::fs::rename(&made, &path).is_err() {
            // another file system: copy, then move within the cache
            let partial = self.dir.join(format!(".{}-{}.partial", key.0, key.1));
            std::fs::copy(&made, &partial).map_err(io_err("copying the bumped snapshot to", &partial))?;
            std::fs::rename(&partial, &path).map_err(io_err("moving the bumped snapshot to", &path))?;
            let _ = std::fs::remove_file(&made);
        }
        Ok(path)
    }

    /// Remove the bumped snapshots nobody needs any more: those not in
    /// `wanted` (the keys of restores not started yet) and not used by a
    /// restore in progress. Nothing is removed while `unsure` (a pod that may
    /// need one whose key is not known) or while a restore in progress has
    /// not said which key it uses.
    pub fn collect(&self, wanted: &HashSet<BumpKey>, unsure: bool) {
        let Ok(users) = self.users.lock() else { return };
        if unsure || users.values().any(Option::is_none) {
            return;
        }
        let mut keep: HashSet<BumpKey> = wanted.clone();
        keep.extend(users.values().flatten().cloned());
        drop(users);
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Some((sha, bump)) = name.strip_suffix(".db").and_then(|n| n.rsplit_once('-')) else {
                continue;
            };
            let Ok(bump) = bump.parse::<u64>() else { continue };
            let key = (sha.to_string(), bump);
            if keep.contains(&key) {
                continue;
            }
            tracing::info!(sha256 = sha, bump, "no restore needs this bumped snapshot any more: removing it");
            if let Err(e) = std::fs::remove_file(entry.path()) {
                tracing::warn!(path = %entry.path().display(), "removing: {e}");
            }
            if let Ok(mut locks) = self.locks.lock() {
                locks.remove(&key);
            }
        }
    }

    /// The bumped snapshots there are (their keys).
    pub fn cached(&self) -> Vec<BumpKey> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let (sha, bump) = name.strip_suffix(".db")?.rsplit_once('-')?;
                Some((sha.to_string(), bump.parse().ok()?))
            })
            .collect()
    }
}

/// HTTP/2 frame types and flags used by [`raw_puts`].
mod h2 {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK literal header field without indexing, with a new name (the
/// names and values here are all shorter than 127 bytes: one-byte lengths).
fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out.push(value.len() as u8);
    out.extend_from_slice(value.as_bytes());
}

/// `count` etcd `Put(key, "")` calls on the plain-http member at `addr`,
/// [`IN_FLIGHT`] at a time, as raw gRPC over HTTP/2: the request frames
/// are made once and only their stream ids change, so the sandbox (built
/// without optimisation) spends next to nothing per call and etcd's own
/// speed is the limit.
async fn raw_puts(addr: std::net::SocketAddr, key: &[u8], count: u64) -> Result<(), String> {
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (mut rd, wr) = stream.into_split();
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    // the request: headers (static-table and literal fields), then one
    // gRPC message holding PutRequest{key}
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    literal(&mut block, ":path", "/etcdserverpb.KV/Put");
    literal(&mut block, ":authority", &addr.to_string());
    literal(&mut block, "content-type", "application/grpc");
    literal(&mut block, "te", "trailers");
    // field 1 (bytes) of PutRequest; the key is shorter than 128 bytes
    let mut message = vec![0x0a, key.len() as u8];
    message.extend_from_slice(key);
    let mut data = vec![0u8];
    data.extend_from_slice(&(message.len() as u32).to_be_bytes());
    data.extend_from_slice(&message);
    // receive windows wide open: no WINDOW_UPDATE to send afterwards
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut hello, h2::SETTINGS, 0, 0, &[0x00, 0x04, 0x7f, 0xff, 0xff, 0xff]);
    frame(&mut hello, h2::WINDOW_UPDATE, 0, 0, &(0x7fff_ffffu32 - 65_535).to_be_bytes());
    wr.lock().await.write_all(&hello).await.map_err(|e| e.to_string())?;

    struct Progress {
        done: AtomicU64,
        failed: AtomicU64,
        /// What the server lets us send on the connection.
        window: AtomicI64,
        changed: tokio::sync::Notify,
        error: Mutex<Option<String>>,
    }
    let progress = Arc::new(Progress {
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        window: AtomicI64::new(65_535),
        changed: tokio::sync::Notify::new(),
        error: Mutex::new(None),
    });
    let reader = {
        let (progress, wr) = (progress.clone(), wr.clone());
        tokio::spawn(async move {
            let fail = |why: String| {
                if let Ok(mut e) = progress.error.lock() {
                    e.get_or_insert(why);
                }
                progress.changed.notify_one();
            };
            // streams that got a response message (a failed call ends with
            // trailers only), and those that ended (grpc-go may follow the
            // trailers with a RST_STREAM(NO_ERROR): counted once)
            let mut answered = HashSet::new();
            let mut ended_streams = vec![0u64; (count as usize).div_ceil(64) + 1];
            let mut head = [0u8; 9];
            let mut payload = Vec::new();
            loop {
                if let Err(e) = rd.read_exact(&mut head).await {
                    return fail(format!("reading: {e}"));
                }
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let (kind, flags) = (head[3], head[4]);
                let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                payload.resize(len, 0);
                if let Err(e) = rd.read_exact(&mut payload).await {
                    return fail(format!("reading: {e}"));
                }
                let mut ended = false;
                match kind {
                    h2::DATA => {
                        if len > 0 {
                            answered.insert(id);
                        }
                        ended = flags & h2::END_STREAM != 0;
                    }
                    h2::HEADERS => ended = flags & h2::END_STREAM != 0,
                    h2::RST_STREAM => ended = true,
                    h2::SETTINGS if flags & h2::ACK == 0 => {
                        let mut ack = Vec::new();
                        frame(&mut ack, h2::SETTINGS, h2::ACK, 0, &[]);
                        if wr.lock().await.write_all(&ack).await.is_err() {
                            return fail("writing a SETTINGS ack".into());
                        }
                    }
                    h2::PING if flags & h2::ACK == 0 => {
                        let mut pong = Vec::new();
                        frame(&mut pong, h2::PING, h2::ACK, 0, &payload);
                        if wr.lock().await.write_all(&pong).await.is_err() {
                            return fail("writing a PING ack".into());
                        }
                    }
                    h2::GOAWAY => return fail("the member sent GOAWAY".into()),
                    h2::WINDOW_UPDATE if id == 0 && len == 4 => {
                        let more = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
                        progress.window.fetch_add(i64::from(more), Ordering::SeqCst);
                        progress.changed.notify_one();
                    }
                    _ => {}
                }
                let index = (id as usize).saturating_sub(1) / 2;
                if ended && id != 0 && index < count as usize {
                    let (word, bit) = (index / 64, 1u64 << (index % 64));
                    if ended_streams[word] & bit != 0 {
                        continue;
                    }
                    ended_streams[word] |= bit;
                    if !answered.remove(&id) {
                        progress.failed.fetch_add(1, Ordering::SeqCst);
                    }
                    if progress.done.fetch_add(1, Ordering::SeqCst) + 1 == count {
                        progress.changed.notify_one();
                        return;
                    }
                    progress.changed.notify_one();
                }
            }
        })
    };
    let mut sent = 0u64;
    let mut next_id = 1u32;
    let per_call = data.len() as i64 + 9;
    let result = loop {
        if let Some(e) = progress.error.lock().ok().and_then(|e| e.clone()) {
            break Err(e);
        }
        let done = progress.done.load(Ordering::SeqCst);
        if done == count {
            break Ok(());
        }
        let room = (IN_FLIGHT as u64).saturating_sub(sent.saturating_sub(done)).min(count - sent);
        let affordable = (progress.window.load(Ordering::SeqCst) / per_call).max(0) as u64;
        let batch = room.min(affordable);
        if batch == 0 {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(50), progress.changed.notified()).await;
            continue;
        }
        let mut out = Vec::with_capacity(batch as usize * (block.len() + data.len() + 18));
        for _ in 0..batch {
            frame(&mut out, h2::HEADERS, h2::END_HEADERS, next_id, &block);
            frame(&mut out, h2::DATA, h2::END_STREAM, next_id, &data);
            next_id += 2;
        }
        progress.window.fetch_sub(batch as i64 * (data.len() as i64), Ordering::SeqCst);
        if let Err(e) = wr.lock().await.write_all(&out).await {
            break Err(format!("writing: {e}"));
        }
        sent += batch;
    };
    reader.abort();
    let failed = progress.failed.load(Ordering::SeqCst);
    match result {
        Ok(()) if failed > 0 => Err(format!("{failed} of {count} puts failed")),
        other => other,
    }
}

/// `--bump-revision bump --mark-compacted`, emulated (see the module docs):
/// the path (in `work`) of a snapshot at the snapshot's revision plus
/// `bump`, compacted there.
pub async fn bump_revision(snapshot: &Path, work: &Path, bump: u64) -> Result<PathBuf, OperatorError> {
    let scratch = work.join("bump");
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).map_err(io_err("removing", &scratch))?;
    }
    let mut member = restore_scratch(snapshot, &scratch).await?;
    let result = async {
        let etcd = |action: &str| {
            let action = action.to_string();
            move |source| OperatorError::Etcd { action, source: Box::new(source) }
        };
        let addr = member
            .client_url()
            .trim_start_matches("http://")
            .parse::<std::net::SocketAddr>()
            .map_err(|e| OperatorError::Waiting(format!("scratch member address: {e}")))?;
        // each put is one revision; many in flight so etcd batches them
        raw_puts(addr, KEY.as_bytes(), bump - 1)
            .await
            .map_err(|e| OperatorError::Invalid { what: format!("emulated --bump-revision {bump}: writing to the scratch member: {e}") })?;
        let client = etcd_client::Client::connect([member.client_url()], None).await.map_err(etcd("connect"))?;
        let mut client = client;
        let deleted = client.delete(KEY, None).await.map_err(etcd("delete"))?;
        let revision = deleted.header().map(|h| h.revision()).unwrap_or_default();
        client
            .compact(revision, Some(etcd_client::CompactionOptions::new().with_physical()))
            .await
            .map_err(etcd("compact"))?;
        // the freed pages of the writes out of the snapshot
        client.defragment().await.map_err(etcd("defragment"))?;
        let out = work.join("bumped.db");
        let mut stream = client.snapshot().await.map_err(etcd("snapshot"))?;
        let mut file = std::fs::File::create(&out).map_err(io_err("creating", &out))?;
        while let Some(chunk) = stream.message().await.map_err(etcd("snapshot"))? {
            std::io::Write::write_all(&mut file, chunk.blob()).map_err(io_err("writing", &out))?;
        }
        file.sync_all().map_err(io_err("syncing", &out))?;
        Ok(out)
    }
    .await;
    member.kill();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collect_keeps_what_is_wanted_or_in_use() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cache = BumpCache::new(tmp.path());
        std::fs::create_dir_all(&cache.dir).expect("dir");
        for key in ["aa-10", "bb-20", "cc-30"] {
            std::fs::write(cache.dir.join(format!("{key}.db")), b"x").expect("write");
        }
        let user = cache.enter("uid-1");
        // a restore whose key is not known yet: nothing goes
        cache.collect(&HashSet::new(), false);
        assert_eq!(cache.cached().len(), 3);
        user.uses(&("bb".to_string(), 20));
        cache.collect(&HashSet::new(), true);
        assert_eq!(cache.cached().len(), 3, "unsure: nothing goes");
        cache.collect(&HashSet::from([("aa".to_string(), 10)]), false);
        let mut left = cache.cached();
        left.sort();
        assert_eq!(left, vec![("aa".to_string(), 10), ("bb".to_string(), 20)]);
        drop(user);
        cache.collect(&HashSet::new(), false);
        assert!(cache.cached().is_empty());
    }
}
