//! zstd compression of the etcd snapshots (`backup --compression zstd`, the
//! default): a snapshot is compressed while it streams to the store (and
//! before it is encrypted, when the backup is), and decompressed while it
//! streams back. The work runs on a thread of its own, so the task
//! receiving etcd's stream only hands chunks over: compressing and hashing
//! the raw bytes happen on another core.
//!
//! Decompression is bounded: a reader is given the raw size the manifest
//! records and stops with an error the moment the data expands past it (a
//! "zstd bomb"), or ends short of it (truncated). zstd's own default
//! window limit (128 MiB) bounds the memory a frame can ask for.
//!
//! The objects archive is not compressed again: it is a gzip tarball
//! already (zstd over it gains nothing; docs/performance.md).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use super::Manifest;
use super::encryption::{self, EncryptionError, Identities};
use crate::store::{Body, Hasher, ObjectInfo, PutReport, Store, StoreError, Stored};

/// The `algorithm` the manifest records.
pub const ALGORITHM: &str = "zstd";
/// The level `--compression zstd` uses: chosen by measurement on the
/// Kubernetes-shaped fill (docs/performance.md "Compression").
pub const DEFAULT_LEVEL: i32 = 1;
/// How every zstd frame begins.
pub const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// Bytes handed between the stream and the compressing thread at once.
const CHUNK: usize = 256 << 10;
/// Chunks in flight each way: bounds the memory a stream holds.
const DEPTH: usize = 4;

/// Whether `head` (the first bytes of a file) is a zstd frame.
pub fn is_zstd(head: &[u8]) -> bool {
    head.starts_with(&MAGIC)
}

/// What `--compression` chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Zstd { level: i32 },
}

impl Compression {
    /// `zstd`, `zstd:LEVEL` (1-19) or `none`.
    pub fn parse(value: &str) -> Result<Compression, String> {
        let bad = || format!("--compression `{value}` is not one of `zstd` (the default), `zstd:LEVEL` with LEVEL from 1 to 19, or `none`");
        match value.trim() {
            "none" => Ok(Compression::None),
            "zstd" => Ok(Compression::Zstd { level: DEFAULT_LEVEL }),
            other => {
                let level = other.strip_prefix("zstd:").ok_or_else(bad)?.parse::<i32>().map_err(|_| bad())?;
                match (1..=19).contains(&level) {
                    true => Ok(Compression::Zstd { level }),
                    false => Err(bad()),
                }
            }
        }
    }

    /// The zstd level; `None` when not compressed.
    pub fn level(&self) -> Option<i32> {
        match self {
            Compression::None => None,
            Compression::Zstd { level } => Some(*level),
        }
    }
}

/// The size and SHA-256 of the raw bytes a compressing reader was given,
/// once it has ended.
pub type RawDigest = Arc<Mutex<Option<PutReport>>>;

/// A thread's side of a [`Transformed`] reader: the chunks the stream
/// hands over, hashed as they are read.
struct ChunkReader {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
    /// `None` when the caller hashes the raw bytes itself.
    hasher: Option<Hasher>,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    if let Some(hasher) = self.hasher.as_mut() {
                        hasher.update(&chunk);
                    }
                    self.chunk = chunk;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A thread's output, sent on in chunks; a closed reader ends the thread.
struct ChunkWriter {
    tx: mpsc::Sender<io::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reader of the stream went away"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// A reader of `inner` transformed by `work` on a thread of its own:
/// `inner` is read here (so it need not be `'static`), its chunks go to the
/// thread, and what the thread writes comes back out.
pub struct Transformed<R> {
    inner: R,
    input: Option<PollSender<Vec<u8>>>,
    output: mpsc::Receiver<io::Result<Vec<u8>>>,
    pending: Option<(Vec<u8>, usize)>,
    buf: Vec<u8>,
}

impl<R> Transformed<R> {
    fn spawn(
        inner: R,
        name: &str,
        work: impl FnOnce(&mut ChunkReader, &mut ChunkWriter) -> io::Result<()> + Send + 'static,
        raw: Option<RawDigest>,
    ) -> io::Result<Transformed<R>> {
        let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(DEPTH);
        let (out_tx, out_rx) = mpsc::channel::<io::Result<Vec<u8>>>(DEPTH);
        std::thread::Builder::new().name(name.into()).spawn(move || {
            let mut reader = ChunkReader { rx: in_rx, chunk: Vec::new(), at: 0, hasher: raw.as_ref().map(|_| Hasher::default()) };
            let mut writer = ChunkWriter { tx: out_tx.clone(), buf: Vec::with_capacity(CHUNK) };
            let done = work(&mut reader, &mut writer).and_then(|()| writer.flush());
            match done {
                Ok(()) => {
                    if let (Some(Ok(mut raw)), Some(hasher)) = (raw.as_ref().map(|r| r.lock()), reader.hasher.take()) {
                        *raw = Some(hasher.finish());
                    }
                }
                Err(err) => {
                    let _ = out_tx.blocking_send(Err(err));
                }
            }
        })?;
        Ok(Transformed {
            inner,
            input: Some(PollSender::new(in_tx)),
            output: out_rx,
            pending: None,
            buf: vec![0u8; CHUNK],
        })
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Transformed<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, target: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some((chunk, at)) = &mut this.pending {
                let n = (chunk.len() - *at).min(target.remaining());
                target.put_slice(&chunk[*at..*at + n]);
                *at += n;
                if *at == chunk.len() {
                    this.pending = None;
                }
                return Poll::Ready(Ok(()));
            }
            let mut fed = false;
            if let Some(tx) = this.input.as_mut() {
                match tx.poll_reserve(cx) {
                    Poll::Ready(Ok(())) => {
                        let mut read = ReadBuf::new(&mut this.buf);
                        match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                            Poll::Ready(Ok(())) => {
                                let n = read.filled().len();
                                if n == 0 {
                                    // the end of the input: the thread finishes its frame
                                    this.input = None;
                                } else if tx.send_item(this.buf[..n].to_vec()).is_err() {
                                    this.input = None;
                                }
                                fed = true;
                            }
                            Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                            Poll::Pending => {}
                        }
                    }
                    // the thread ended early: its output says why
                    Poll::Ready(Err(_)) => {
                        this.input = None;
                        fed = true;
                    }
                    Poll::Pending => {}
                }
            }
            match this.output.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) if chunk.is_empty() => {}
                Poll::Ready(Some(Ok(chunk))) => this.pending = Some((chunk, 0)),
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(err)),
                Poll::Ready(None) if this.input.is_some() => {
                    return Poll::Ready(Err(io::Error::other("the compression thread ended before its input")));
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending if fed => {}
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Compress `inner` with zstd at `level` as it is read; the digest
/// receives the size and SHA-256 of what was compressed once the stream
/// has ended.
pub fn compressing<R: AsyncRead + Unpin>(inner: R, level: i32) -> io::Result<(Transformed<R>, RawDigest)> {
    let raw = RawDigest::default();
    let reader = compress_with(inner, level, Some(raw.clone()))?;
    Ok((reader, raw))
}

fn compress_with<R: AsyncRead + Unpin>(inner: R, level: i32, raw: Option<RawDigest>) -> io::Result<Transformed<R>> {
    Transformed::spawn(
        inner,
        "hcp-dr-zstd",
        move |input, output| {
            let mut encoder = zstd::stream::write::Encoder::new(output, level)?;
            // the frame's own checksum: a flipped byte fails decompression,
            // naming the artifact, before any hash is compared
            encoder.include_checksum(true)?;
            io::copy(input, &mut encoder)?;
            encoder.finish()?;
            Ok(())
        },
        raw,
    )
}

/// Decompress `inner` as it is read, expecting exactly `raw_size` bytes:
/// more is stopped at `raw_size` (a bomb), fewer or a damaged frame is an
/// error naming `what`.
pub fn decompressing<R: AsyncRead + Unpin>(inner: R, raw_size: u64, what: &str) -> io::Result<Transformed<R>> {
    decompress_with(inner, Some(raw_size), what)
}

fn decompress_with<R: AsyncRead + Unpin>(inner: R, raw_size: Option<u64>, what: &str) -> io::Result<Transformed<R>> {
    let what = what.to_string();
    Transformed::spawn(
        inner,
        "hcp-dr-unzstd",
        move |input, output| {
            let damaged = |e: io::Error| io::Error::new(e.kind(), format!("{what}: does not decompress (zstd: {e}): the backup is damaged or was tampered with"));
            let mut decoder = zstd::stream::read::Decoder::new(input).map_err(damaged)?;
            let mut buf = vec![0u8; CHUNK];
            let mut total = 0u64;
            loop {
                let n = decoder.read(&mut buf).map_err(damaged)?;
                if n == 0 {
                    break;
                }
                if let Some(raw_size) = raw_size.filter(|raw| total + n as u64 > *raw) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{what}: decompresses past the {raw_size} bytes the manifest records (stopped there): the backup is damaged or was tampered with"),
                    ));
                }
                total += n as u64;
                output.write_all(&buf[..n])?;
            }
            if let Some(raw_size) = raw_size.filter(|raw| total != *raw) {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{what}: decompresses to {total} bytes, but the manifest records {raw_size}: the backup is damaged or was tampered with"),
                ));
            }
            Ok(())
        },
        None,
    )
}

/// Decompress `inner` (a zstd stream of unknown raw size, e.g. a file given
/// to `hcp-dr snapshot verify`) as it is read.
pub fn decompressing_unbounded<R: AsyncRead + Unpin>(inner: R, what: &str) -> io::Result<Transformed<R>> {
    decompress_with(inner, None, what)
}

/// An artifact's stored bytes as a reader uses them: decrypted with
/// `identities` when the artifact is encrypted, then decompressed when it
/// is compressed (bounded by the raw size the manifest records). `what`
/// names it in errors. The caller checks what comes out against
/// [`Manifest::plaintext`] (or the stored digest, for a plain artifact).
pub async fn decoded<'a>(
    manifest: &Manifest,
    name: &str,
    what: &str,
    body: Body<'a>,
    identities: Option<&Identities>,
) -> Result<Body<'a>, EncryptionError> {
    let encrypted = manifest.encryption.as_ref().is_some_and(|e| e.artifacts.iter().any(|a| a.name == name));
    let recipients = encrypted.then(|| manifest.recipients());
    decode(body, what, recipients, identities, manifest.raw(name).map(|raw| raw.size)).await
}

/// Stored bytes decoded: decrypted when `recipients` says they are
/// encrypted (to those keys, named in messages), then decompressed when
/// `raw_size` says they are compressed (bounded by it). What
/// [`decoded`] does from a manifest, for a caller that kept only this
/// much of it (`etcd restore`'s resumed fetch).
pub async fn decode<'a>(
    body: Body<'a>,
    what: &str,
    recipients: Option<&[String]>,
    identities: Option<&Identities>,
    raw_size: Option<u64>,
) -> Result<Body<'a>, EncryptionError> {
    let body = match (recipients, identities) {
        (None, _) => body,
        (Some(recipients), Some(ids)) => encryption::decrypting_reader(body, ids, what, recipients).await?,
        (Some(recipients), None) => {
            return Err(EncryptionError::IdentityNeeded { what: what.to_string(), recipients: recipients.to_vec() });
        }
    };
    let Some(raw_size) = raw_size else { return Ok(body) };
    Ok(match decompressing(body, raw_size, what) {
        Ok(reader) => Box::new(reader),
        Err(err) => Box::new(Failed(Some(err))),
    })
}

/// A reader whose first read fails (a decompressing thread that could not start).
struct Failed(Option<io::Error>);

impl AsyncRead for Failed {
    fn poll_read(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, _buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(self.0.take().unwrap_or_else(|| io::Error::other("the decompressing thread could not start"))))
    }
}

/// A store that compresses what is put into it (the etcd snapshots of a
/// compressed backup are written through it, over the encrypting store
/// when the backup is also encrypted). Everything else goes to the store
/// underneath unchanged.
pub struct CompressingStore {
    inner: Arc<dyn Store>,
    level: i32,
    /// Raw size and SHA-256 of every object put, by key.
    raw: Mutex<BTreeMap<String, PutReport>>,
}

impl CompressingStore {
    pub fn new(inner: Arc<dyn Store>, level: i32) -> CompressingStore {
        CompressingStore { inner, level, raw: Mutex::new(BTreeMap::new()) }
    }

    /// The raw digest of what was put at `key` (`put` returns what is stored).
    pub fn raw(&self, key: &str) -> Option<PutReport> {
        self.raw.lock().ok().and_then(|r| r.get(key).cloned())
    }
}

#[async_trait]
impl Store for CompressingStore {
    fn url(&self) -> String {
        self.inner.url()
    }

    async fn put(&self, key: &str, body: Body<'_>) -> Result<PutReport, StoreError> {
        let body_error = |source: io::Error| StoreError::Body { key: key.to_string(), source };
        let (reader, raw) = compressing(body, self.level).map_err(body_error)?;
        let stored = self.inner.put(key, Box::new(reader)).await?;
        let raw = raw.lock().ok().and_then(|mut r| r.take()).ok_or_else(|| {
            body_error(io::Error::other("the store stopped reading before the end of the data"))
        })?;
        if let Ok(mut map) = self.raw.lock() {
            map.insert(key.to_string(), raw);
        }
        Ok(stored)
    }

    /// A snapshot: etcd's stream is hashed by the caller (for its trailing
    /// hash and the raw digest), so only what is stored is hashed here.
    async fn put_verbatim(&self, key: &str, body: Body<'_>) -> Result<Stored, StoreError> {
        let reader = compress_with(body, self.level, None).map_err(|source| StoreError::Body { key: key.to_string(), source })?;
        self.inner.put(key, Box::new(reader)).await.map(Stored::Hashed)
    }

    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
        self.inner.get(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        if let Ok(mut map) = self.raw.lock() {
            map.remove(key);
        }
        self.inner.delete(key).await
    }

    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, StoreError> {
        self.inner.presign_get(key, ttl).await
    }

    fn local_dir(&self) -> Option<&std::path::Path> {
        self.inner.local_dir()
    }

    fn s3(&self) -> Option<&crate::store::S3Store> {
        self.inner.s3()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Bytes like an etcd database of Kubernetes objects: repetitive JSON.
    fn kubernetes_like(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| format!("{{\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"cm-{i}\",\"namespace\":\"workload\",\"resourceVersion\":\"{}\"}},\"data\":{{\"key\":\"value-{}\"}}}}\n", i * 7, i % 13).into_bytes())
            .collect()
    }

    async fn compress(raw: &[u8], level: i32) -> (Vec<u8>, PutReport) {
        let (mut reader, digest) = compressing(raw, level).unwrap();
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        let digest = digest.lock().unwrap().clone().unwrap();
        (out, digest)
    }

    async fn decompress(stored: &[u8], raw_size: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        decompressing(stored, raw_size, "etcd/etcd-0.db")?.read_to_end(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn round_trips_and_records_the_raw_digest() {
        let raw = kubernetes_like(50_000);
        let (stored, digest) = compress(&raw, DEFAULT_LEVEL).await;
        assert!(is_zstd(&stored));
        assert!(stored.len() * 5 < raw.len(), "{} of {}", stored.len(), raw.len());
        assert_eq!(digest.size, raw.len() as u64);
        assert_eq!(digest.sha256, crate::store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&raw)));
        assert_eq!(decompress(&stored, raw.len() as u64).await.unwrap(), raw);
        // the empty stream is a frame too
        let (empty, digest) = compress(b"", 1).await;
        assert_eq!(digest.size, 0);
        assert!(decompress(&empty, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_bomb_is_stopped_at_the_recorded_size() {
        let (stored, _) = compress(&vec![0u8; 64 << 20], 19).await;
        assert!(stored.len() < 64 << 10, "{}", stored.len());
        let err = decompress(&stored, 1 << 20).await.unwrap_err().to_string();
        assert!(err.contains("etcd/etcd-0.db: decompresses past the 1048576 bytes"), "{err}");
    }

    #[tokio::test]
    async fn truncated_and_flipped_streams_are_refused_naming_the_artifact() {
        let raw = kubernetes_like(20_000);
        let (stored, _) = compress(&raw, DEFAULT_LEVEL).await;
        let err = decompress(&stored[..stored.len() / 2], raw.len() as u64).await.unwrap_err().to_string();
        assert!(err.contains("etcd/etcd-0.db") && err.contains("damaged"), "{err}");
        let mut flipped = stored.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 0x40;
        let err = decompress(&flipped, raw.len() as u64).await.unwrap_err().to_string();
        assert!(err.contains("etcd/etcd-0.db") && err.contains("damaged"), "{err}");
        let err = decompress(b"not zstd at all", 15).await.unwrap_err().to_string();
        assert!(err.contains("does not decompress"), "{err}");
    }

    #[tokio::test]
    async fn a_failing_input_fails_the_stream() {
        struct Failing(usize);
        impl AsyncRead for Failing {
            fn poll_read(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                if self.0 == 0 {
                    return Poll::Ready(Err(io::Error::other("etcd went away")));
                }
                self.0 -= 1;
                buf.put_slice(&[7u8; 1000]);
                Poll::Ready(Ok(()))
            }
        }
        let (mut reader, digest) = compressing(Failing(100), 1).unwrap();
        let mut out = Vec::new();
        let err = reader.read_to_end(&mut out).await.unwrap_err();
        assert!(err.to_string().contains("etcd went away"), "{err}");
        drop(digest);
    }

    #[tokio::test]
    async fn the_store_compresses_and_keeps_both_digests() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn Store> = Arc::new(crate::store::LocalStore::new(dir.path()));
        let store = CompressingStore::new(local.clone(), DEFAULT_LEVEL);
        let raw = kubernetes_like(10_000);
        let stored = store.put("b/etcd/etcd-0.db", Box::new(&raw[..])).await.unwrap();
        let on_disk = std::fs::read(dir.path().join("b/etcd/etcd-0.db")).unwrap();
        assert_eq!(stored.size, on_disk.len() as u64);
        assert_eq!(store.raw("b/etcd/etcd-0.db").unwrap().size, raw.len() as u64);
        assert_eq!(decompress(&on_disk, raw.len() as u64).await.unwrap(), raw);
    }

    #[test]
    fn the_flag_parses() {
        assert_eq!(Compression::parse("zstd"), Ok(Compression::Zstd { level: DEFAULT_LEVEL }));
        assert_eq!(Compression::parse("zstd:9"), Ok(Compression::Zstd { level: 9 }));
        assert_eq!(Compression::parse("none"), Ok(Compression::None));
        for bad in ["gzip", "zstd:0", "zstd:20", "zstd:x", ""] {
            assert!(Compression::parse(bad).unwrap_err().contains("--compression"), "{bad}");
        }
    }
}
