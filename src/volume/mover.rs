//! `hcp-dr volume-mover`: the data mover a backup or restore runs in a pod
//! that mounts one volume. Plain HTTP/1.1 on `$HCP_DR_MOVER_BIND:<port>`,
//! every request authorised by the bearer token in `$HCP_DR_MOVER_TOKEN`:
//!
//! - `GET /healthz`: 200 (the pod's readiness probe; no token needed).
//! - `GET /v1/archive`: the volume as a tar stream, in constant memory.
//! - `GET /v1/digest`: `{"sha256","bytes","files"}` of the last archive
//!   sent whole (409 before one was).
//! - `PUT /v1/archive`: unpack the body (a tar) into the volume, which must
//!   be empty apart from `lost+found`; answers the digest of what it read.
//! - `POST /v1/exit`: answers 200, then the process exits 0 (the Job
//!   completes).
//!
//! One transfer at a time (409 while one runs). With no request for
//! `--idle-timeout` the mover exits 1, so a Job whose hcp-dr went away ends.

use std::convert::Infallible;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::ArchiveDigest;
use crate::store::hex;

/// Bytes per chunk sent or received through the channel between the
/// blocking tar code and the connection; at most [`CHANNEL_CHUNKS`] in flight.
const CHUNK: usize = 256 * 1024;
const CHANNEL_CHUNKS: usize = 8;
/// A top-level directory a fresh filesystem has, never archived.
const LOST_FOUND: &str = "lost+found";

#[derive(Debug, thiserror::Error)]
pub enum MoverError {
    #[error("{0}")]
    Setup(String),
    #[error("no request for {0:?}: the hcp-dr that started this mover is gone; exiting")]
    Idle(Duration),
    #[error("{0}")]
    Failed(String),
}

/// What the mover serves.
pub struct MoverConfig {
    pub dir: PathBuf,
    pub bind: String,
    pub port: u16,
    pub token: String,
    pub idle_timeout: Duration,
}

struct State {
    dir: PathBuf,
    token: String,
    last_sent: Mutex<Option<ArchiveDigest>>,
    busy: Mutex<bool>,
    last_request: Mutex<Instant>,
    exit: tokio::sync::Notify,
    /// Set when an archive could not be made: the mover exits 1 with it,
    /// so its Job fails and says why.
    failed: Mutex<Option<String>>,
}

type ResBody = BoxBody<Bytes, std::io::Error>;

fn text(status: StatusCode, body: impl Into<String>) -> Response<ResBody> {
    let body = Full::new(Bytes::from(body.into())).map_err(|never: Infallible| match never {}).boxed();
    let mut res = Response::new(body);
    *res.status_mut() = status;
    res
}

fn json(digest: &ArchiveDigest) -> Response<ResBody> {
    let mut res = text(StatusCode::OK, serde_json::to_string(digest).unwrap_or_default());
    res.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    res
}

/// Whether two byte strings are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serve until `POST /v1/exit` (Ok) or the idle timeout (Err).
pub async fn serve(cfg: MoverConfig) -> Result<(), MoverError> {
    if cfg.token.len() < 16 {
        return Err(MoverError::Setup(format!(
            "${} must hold the token hcp-dr gave this mover (at least 16 characters)",
            super::TOKEN_ENV
        )));
    }
    if !cfg.dir.is_dir() {
        return Err(MoverError::Setup(format!("--dir {} is not a directory (the volume's mount)", cfg.dir.display())));
    }
    let addr = format!("{}:{}", cfg.bind, cfg.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|e| MoverError::Setup(format!("listening on {addr}: {e}")))?;
    eprintln!("hcp-dr volume-mover: serving {} on {addr}", cfg.dir.display());
    let state = Arc::new(State {
        dir: cfg.dir,
        token: cfg.token,
        last_sent: Mutex::new(None),
        busy: Mutex::new(false),
        last_request: Mutex::new(Instant::now()),
        exit: tokio::sync::Notify::new(),
        failed: Mutex::new(None),
    });
    loop {
        let idle_for = state.last_request.lock().map(|t| t.elapsed()).unwrap_or_default();
        let busy = state.busy.lock().map(|b| *b).unwrap_or(false);
        if !busy && idle_for >= cfg.idle_timeout {
            return Err(MoverError::Idle(cfg.idle_timeout));
        }
        let wait = cfg.idle_timeout.saturating_sub(idle_for).max(Duration::from_secs(1));
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(state, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
            () = state.exit.notified() => {
                // let the answer to /v1/exit (or the broken stream) reach the client
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Some(why) = state.failed.lock().ok().and_then(|f| f.clone()) {
                    return Err(MoverError::Failed(why));
                }
                eprintln!("hcp-dr volume-mover: asked to exit");
                return Ok(());
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<ResBody> {
    if let Ok(mut t) = state.last_request.lock() {
        *t = Instant::now();
    }
    let path = req.uri().path().to_string();
    if req.method() == Method::GET && path == "/healthz" {
        return text(StatusCode::OK, "ok");
    }
    let authorised = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| same(t.as_bytes(), state.token.as_bytes()));
    if !authorised {
        return text(StatusCode::UNAUTHORIZED, "a bearer token is required");
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/v1/digest") => match state.last_sent.lock().ok().and_then(|d| d.clone()) {
            Some(d) => json(&d),
            None => text(StatusCode::CONFLICT, "no archive was sent whole yet"),
        },
        (Method::POST, "/v1/exit") => {
            state.exit.notify_one();
            text(StatusCode::OK, "exiting")
        }
        (Method::GET, "/v1/archive") => match Busy::take(&state) {
            Some(busy) => send(state.clone(), busy),
            None => text(StatusCode::CONFLICT, "a transfer is running"),
        },
        (Method::PUT, "/v1/archive") => match Busy::take(&state) {
            Some(busy) => receive(state.clone(), busy, req.into_body()).await,
            None => text(StatusCode::CONFLICT, "a transfer is running"),
        },
        _ => text(StatusCode::NOT_FOUND, format!("no such endpoint: {} {path}", req.method())),
    }
}

/// The transfer slot, given back when dropped.
struct Busy(Arc<State>);

impl Busy {
    fn take(state: &Arc<State>) -> Option<Busy> {
        let mut busy = state.busy.lock().ok()?;
        if *busy {
            return None;
        }
        *busy = true;
        Some(Busy(state.clone()))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.0.busy.lock() {
            *busy = false;
        }
        if let Ok(mut t) = self.0.last_request.lock() {
            *t = Instant::now();
        }
    }
}

/// A `Write` that hashes what it is given and hands it, in chunks, to the
/// connection (blocking while [`CHANNEL_CHUNKS`] are in flight).
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
    sha: Sha256,
    bytes: u64,
}

impl ChannelWriter {
    fn flush_chunk(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.sha.update(data);
        self.bytes += data.len() as u64;
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush_chunk()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn send(state: Arc<State>, busy: Busy) -> Response<ResBody> {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHANNEL_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let _busy = busy;
        let mut writer = ChannelWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK), sha: Sha256::new(), bytes: 0 };
        let written = write_tar(&state.dir, &mut writer).and_then(|files| writer.flush_chunk().map(|()| files));
        match written {
            Ok(files) => {
                let digest = ArchiveDigest { sha256: hex(&writer.sha.finalize()), bytes: writer.bytes, files };
                eprintln!("hcp-dr volume-mover: sent {} entries, {} bytes, sha256 {}", digest.files, digest.bytes, digest.sha256);
                // recorded before the body ends, so a digest asked for after it is there
                if let Ok(mut last) = state.last_sent.lock() {
                    *last = Some(digest);
                }
            }
            Err(err) => {
                let why = format!("archiving {} failed: {err}", state.dir.display());
                eprintln!("hcp-dr volume-mover: {why}");
                let _ = tx.blocking_send(Err(err));
                if let Ok(mut failed) = state.failed.lock() {
                    *failed = Some(why);
                }
                state.exit.notify_one();
            }
        }
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item.map(Frame::data), rx)) });
    let mut res = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    res.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/x-tar"));
    res
}

/// Every entry of `dir` below it, sorted, as a tar (paths relative, links
/// not followed, `lost+found` at the top and sockets left out). Returns the
/// entry count.
pub fn write_tar(dir: &Path, out: &mut dyn Write) -> std::io::Result<u64> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Complete);
    let mut files = 0u64;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(dir.join(&rel))?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for entry in entries {
            let name = rel.join(entry.file_name());
            if rel.as_os_str().is_empty() && entry.file_name() == LOST_FOUND {
                continue;
            }
            let kind = entry.file_type()?;
            if std::os::unix::fs::FileTypeExt::is_socket(&kind) {
                // as GNU tar does: a socket has no content and is made anew by whoever listens
                eprintln!("hcp-dr volume-mover: {}: socket ignored", name.display());
                continue;
            }
            builder.append_path_with_name(entry.path(), &name)?;
            files += 1;
            if kind.is_dir() {
                subdirs.push(name);
            }
        }
        // depth-first, in name order
        stack.extend(subdirs.into_iter().rev());
    }
    builder.finish()?;
    Ok(files)
}

/// A `Read` over the chunks the connection hands it, hashing what is read.
struct ChannelReader {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
    current: Bytes,
    sha: Sha256,
    bytes: u64,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(err)) => return Err(err),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        let chunk = self.current.split_to(n);
        out[..n].copy_from_slice(&chunk);
        self.sha.update(&chunk);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Whether `dir` holds nothing but (maybe) `lost+found`.
fn is_empty_volume(dir: &Path) -> std::io::Result<bool> {
    for entry in std::fs::read_dir(dir)? {
        if entry?.file_name() != LOST_FOUND {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn receive(state: Arc<State>, busy: Busy, body: Incoming) -> Response<ResBody> {
    match is_empty_volume(&state.dir) {
        Ok(true) => {}
        Ok(false) => {
            return text(
                StatusCode::CONFLICT,
                format!("{} is not empty: a restore writes only into a fresh volume", state.dir.display()),
            );
        }
        Err(err) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("reading {}: {err}", state.dir.display())),
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHANNEL_CHUNKS);
    let pump = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let item = chunk.map_err(|e| std::io::Error::other(format!("reading the request body: {e}")));
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                return;
            }
        }
    });
    let dir = state.dir.clone();
    let unpacked = tokio::task::spawn_blocking(move || {
        let _busy = busy;
        let mut reader = ChannelReader { rx, current: Bytes::new(), sha: Sha256::new(), bytes: 0 };
        let files = unpack_tar(&dir, &mut reader)?;
        // the tar's trailing blocks and padding count too
        std::io::copy(&mut reader, &mut std::io::sink())?;
        Ok::<_, std::io::Error>(ArchiveDigest { sha256: hex(&reader.sha.finalize()), bytes: reader.bytes, files })
    })
    .await;
    pump.abort();
    match unpacked {
        Ok(Ok(digest)) => {
            eprintln!("hcp-dr volume-mover: received {} entries, {} bytes, sha256 {}", digest.files, digest.bytes, digest.sha256);
            json(&digest)
        }
        Ok(Err(err)) => {
            eprintln!("hcp-dr volume-mover: unpacking into {} failed: {err}", state.dir.display());
            text(StatusCode::UNPROCESSABLE_ENTITY, format!("unpacking into {}: {err}", state.dir.display()))
        }
        Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("the unpacking task failed: {err}")),
    }
}

/// Unpack a tar into `dir` (entries stay inside it: absolute paths and
/// `..` are refused by the tar crate), keeping modes and times, and owners
/// when running as root. Returns the entry count.
pub fn unpack_tar(dir: &Path, input: &mut dyn Read) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_preserve_ownerships(root);
    archive.set_overwrite(false);
    let mut files = 0u64;
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.unpack_in(dir)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the archive names a path outside the volume: {}", entry.path()?.display()),
            ));
        }
        files += 1;
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_round_trips_through_tar_without_lost_and_found() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("lost+found")).unwrap();
        std::fs::create_dir_all(src.path().join("data/nested")).unwrap();
        std::fs::write(src.path().join("data/nested/a.txt"), b"alpha").unwrap();
        std::fs::write(src.path().join("disk.img"), vec![7u8; 100_000]).unwrap();
        std::os::unix::fs::symlink("data/nested/a.txt", src.path().join("link")).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(src.path().join("data/app.sock")).unwrap();
        let mut tar = Vec::new();
        let files = write_tar(src.path(), &mut tar).unwrap();
        assert_eq!(files, 5, "data, data/nested, data/nested/a.txt, disk.img, link");
        let dst = tempfile::tempdir().unwrap();
        assert_eq!(unpack_tar(dst.path(), &mut tar.as_slice()).unwrap(), 5);
        assert_eq!(std::fs::read(dst.path().join("data/nested/a.txt")).unwrap(), b"alpha");
        assert_eq!(std::fs::read(dst.path().join("disk.img")).unwrap(), vec![7u8; 100_000]);
        assert_eq!(std::fs::read_link(dst.path().join("link")).unwrap(), Path::new("data/nested/a.txt"));
        assert!(!dst.path().join("lost+found").exists());
    }

    #[test]
    fn an_archive_climbing_out_of_the_volume_is_refused() {
        let mut tar = Vec::new();
        {
            let mut b = tar::Builder::new(&mut tar);
            let mut header = tar::Header::new_gnu();
            let data = b"x";
            header.set_size(1);
            header.set_mode(0o644);
            // set_path refuses `..`; write the name bytes directly, as a hostile archive would
            header.as_old_mut().name[..9].copy_from_slice(b"../escape");
            header.set_cksum();
            b.append(&header, &data[..]).unwrap();
            b.finish().unwrap();
        }
        let outer = tempfile::tempdir().unwrap();
        let dst = outer.path().join("volume");
        std::fs::create_dir(&dst).unwrap();
        let err = unpack_tar(&dst, &mut tar.as_slice()).unwrap_err();
        assert!(err.to_string().contains("outside the volume"), "{err}");
        assert!(!outer.path().join("escape").exists());
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeX"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcde"));
    }
}
