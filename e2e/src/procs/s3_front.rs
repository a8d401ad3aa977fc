//! The S3 endpoint's HTTPS front: an HTTP/1.1 server on TLS that forwards
//! every request to s3s-fs over a plain HTTP/1.1 connection (one per client
//! connection, kept alive with it) and injects the faults of
//! [`crate::procs::s3_faults`].
//!
//! Forwarding keeps the method, the path and query, every header (`Host`
//! included, which SigV4 signs) and streams both bodies frame by frame:
//! nothing is buffered whole. `Expect: 100-continue` is forwarded; the front
//! answers it itself (hyper does) when it starts reading the body.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd as _, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, BodyStream, Full, StreamBody};
use hyper::body::{Body as _, Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use super::s3_faults::{RequestInfo, S3FaultKind, S3Injector};

type FrontBody = UnsyncBoxBody<Bytes, FrontError>;

/// How long a reset waits after the last bytes it lets through, so they
/// leave the front before the connection is reset.
const FLUSH_PAUSE: Duration = Duration::from_millis(150);

/// Accept TLS connections on `listener` and serve each (until aborted).
pub(crate) async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    backend: SocketAddr,
    faults: Arc<S3Injector>,
) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(err) => {
                // out of file descriptors, or the like: do not spin
                tracing::warn!(error = %err, "S3 front: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        tokio::spawn(connection(tcp, acceptor.clone(), backend, faults.clone()));
    }
}

/// What the requests of one client connection share.
struct Conn {
    backend: SocketAddr,
    faults: Arc<S3Injector>,
    /// The connection to s3s-fs, opened at the first request.
    upstream: tokio::sync::Mutex<Option<SendRequest<Incoming>>>,
    /// Set by a reset fault: the client connection is reset, not closed.
    abort: AtomicBool,
}

async fn connection(tcp: TcpStream, acceptor: tokio_rustls::TlsAcceptor, backend: SocketAddr, faults: Arc<S3Injector>) {
    let _ = tcp.set_nodelay(true);
    let fd = tcp.as_raw_fd();
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    let conn = Arc::new(Conn { backend, faults, upstream: tokio::sync::Mutex::new(None), abort: AtomicBool::new(false) });
    let shared = conn.clone();
    let service = hyper::service::service_fn(move |req| {
        let conn = shared.clone();
        async move { conn.handle(req).await }
    });
    let serving = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service);
    let mut serving = std::pin::pin!(serving);
    // Errors here are the client or backend going away, or a reset fault.
    let _ = serving.as_mut().await;
    if conn.abort.load(Ordering::SeqCst) {
        // still open: `serving` owns the stream until it is dropped below
        reset_on_close(fd);
    }
}

/// Make the close of `fd` send a TCP RST instead of a FIN (SO_LINGER 0).
fn reset_on_close(fd: RawFd) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: `fd` is an open socket owned by the caller's stream; the option
    // value is a valid `linger` of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "S3 front: SO_LINGER");
    }
}

/// Why the front drops a client connection (hyper drops it on an error of
/// the service or of a response body).
#[derive(Debug, thiserror::Error)]
enum FrontError {
    /// s3s-fs could not be reached.
    #[error("connecting to s3s-fs: {0}")]
    Connect(#[source] std::io::Error),
    /// The exchange with s3s-fs (or the client's body) failed.
    #[error("forwarding to s3s-fs: {0}")]
    Forward(#[source] hyper::Error),
    /// A reset fault.
    #[error("S3 fault injected: {0}")]
    Injected(S3FaultKind),
}

impl Conn {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<FrontBody>, FrontError> {
        let info = RequestInfo {
            method: req.method().as_str().to_string(),
            path: req.uri().path().to_string(),
            user_agent: req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).map(str::to_string),
        };
        let Some((kind, stall)) = self.faults.decide(&info) else {
            return Ok(self.forward(req).await?.map(|b| b.map_err(FrontError::Forward).boxed_unsync()));
        };
        match kind {
            S3FaultKind::InternalError | S3FaultKind::SlowDown | S3FaultKind::AccessDenied => {
                self.faults.record(&info, kind, None);
                Ok(error_answer(kind, req).await)
            }
            S3FaultKind::ResetRequest => {
                let received = read_part(req).await;
                self.faults.record(&info, kind, Some(received));
                self.abort.store(true, Ordering::SeqCst);
                Err(FrontError::Injected(kind))
            }
            S3FaultKind::ResetResponse => {
                let head = req.method() == hyper::Method::HEAD;
                let response = self.forward(req).await?;
                let length = if head { Some(0) } else { content_length(response.headers()) };
                if length == Some(0) || response.body().is_end_stream() {
                    // an empty answer is lost whole: the request was applied
                    self.faults.record(&info, kind, Some(0));
                    self.abort.store(true, Ordering::SeqCst);
                    return Err(FrontError::Injected(kind));
                }
                let (parts, body) = response.into_parts();
                Ok(Response::from_parts(parts, self.cut_body(body, length, info)))
            }
            S3FaultKind::SlowRead => {
                self.faults.record(&info, kind, None);
                let head = req.method() == hyper::Method::HEAD;
                let response = self.forward(req).await?;
                let length = if head { Some(0) } else { content_length(response.headers()) };
                let (parts, body) = response.into_parts();
                Ok(Response::from_parts(parts, stalled_body(body, length, stall)))
            }
        }
    }

    /// Send `req` to s3s-fs on this connection's upstream connection (opened
    /// again if s3s-fs closed it) and return its answer, body unread.
    async fn forward(&self, req: Request<Incoming>) -> Result<Response<Incoming>, FrontError> {
        let mut upstream = self.upstream.lock().await;
        let mut reused = upstream.take();
        if let Some(sender) = &mut reused
            && sender.ready().await.is_err()
        {
            reused = None;
        }
        let mut sender = match reused {
            Some(sender) => sender,
            None => {
                let tcp = TcpStream::connect(self.backend).await.map_err(FrontError::Connect)?;
                let _ = tcp.set_nodelay(true);
                let (mut sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.map_err(FrontError::Forward)?;
                tokio::spawn(async move {
                    // ends when `sender` is dropped and the exchange done
                    let _ = driver.await;
                });
                sender.ready().await.map_err(FrontError::Forward)?;
                sender
            }
        };
        let answer = sender.send_request(req);
        *upstream = Some(sender);
        drop(upstream);
        answer.await.map_err(FrontError::Forward)
    }

    /// The first part of `body` (half of `length`, at least one byte; the
    /// first half-frame when the length is unknown), then an error that
    /// resets the connection. Records the fault with the bytes sent.
    fn cut_body(self: &Arc<Self>, body: Incoming, length: Option<u64>, info: RequestInfo) -> FrontBody {
        struct Cut {
            frames: BodyStream<Incoming>,
            /// Bytes still to let through (None: half of the first frame).
            left: Option<u64>,
            sent: u64,
            conn: Arc<Conn>,
            info: RequestInfo,
        }
        let start = Cut {
            frames: BodyStream::new(body),
            left: length.map(|n| (n / 2).max(1)),
            sent: 0,
            conn: self.clone(),
            info,
        };
        let stream = futures::stream::unfold(Some(start), |state| async move {
            let mut cut = state?;
            if cut.left != Some(0) {
                match cut.frames.next().await {
                    Some(Ok(frame)) => {
                        let frame = match frame.into_data() {
                            Ok(mut data) => {
                                let left = *cut.left.get_or_insert((data.len() as u64 / 2).max(1));
                                data.truncate(data.len().min(left as usize));
                                cut.left = Some(left - data.len() as u64);
                                cut.sent += data.len() as u64;
                                Frame::data(data)
                            }
                            Err(frame) => frame,
                        };
                        return Some((Ok(frame), Some(cut)));
                    }
                    Some(Err(err)) => return Some((Err(FrontError::Forward(err)), None)),
                    None => {}
                }
            }
            // let what was sent leave, then reset
            tokio::time::sleep(FLUSH_PAUSE).await;
            cut.conn.faults.record(&cut.info, S3FaultKind::ResetResponse, Some(cut.sent));
            cut.conn.abort.store(true, Ordering::SeqCst);
            Some((Err(FrontError::Injected(S3FaultKind::ResetResponse)), None))
        });
        StreamBody::new(stream).boxed_unsync()
    }
}

/// `body` whole, but stalled for `stall` once half of `length` (or the first
/// frame, when the length is unknown) went through; at its end when empty.
fn stalled_body(body: Incoming, length: Option<u64>, stall: Duration) -> FrontBody {
    struct Slow {
        frames: BodyStream<Incoming>,
        /// Bytes before the stall (None: the first frame).
        before: Option<u64>,
        /// The rest of a frame split at the stall.
        rest: Option<Bytes>,
        stalled: bool,
        stall: Duration,
    }
    let start = Slow { frames: BodyStream::new(body), before: length.map(|n| n / 2), rest: None, stalled: false, stall };
    let stream = futures::stream::unfold(start, |mut slow| async move {
        if !slow.stalled && slow.before == Some(0) {
            tokio::time::sleep(slow.stall).await;
            slow.stalled = true;
        }
        if let Some(rest) = slow.rest.take() {
            return Some((Ok(Frame::data(rest)), slow));
        }
        match slow.frames.next().await {
            Some(Ok(frame)) => {
                let frame = match frame.into_data() {
                    Ok(mut data) if !slow.stalled => {
                        let before = *slow.before.get_or_insert(data.len() as u64);
                        if data.len() as u64 > before {
                            slow.rest = Some(data.split_off(before as usize));
                        }
                        slow.before = Some(before - data.len() as u64);
                        Frame::data(data)
                    }
                    Ok(data) => Frame::data(data),
                    Err(frame) => frame,
                };
                Some((Ok(frame), slow))
            }
            Some(Err(err)) => Some((Err(FrontError::Forward(err)), slow)),
            None if !slow.stalled => {
                tokio::time::sleep(slow.stall).await;
                None
            }
            None => None,
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

fn content_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Read part of the request body, as a server does before it dies: half of
/// its length (at least one byte) or, length unknown, one frame. Returns the
/// bytes read.
async fn read_part(req: Request<Incoming>) -> u64 {
    let length = content_length(req.headers());
    let target = match length {
        Some(0) => return 0,
        Some(n) => (n / 2).max(1),
        None => 1,
    };
    let mut body = req.into_body();
    let mut read = 0u64;
    while read < target {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len() as u64),
            _ => break,
        }
    }
    read
}

/// The answer of an `internal-error`, `slow-down` or `access-denied` fault,
/// as S3 gives it.
/// A request body is read and dropped first (so the client gets the answer
/// rather than a reset for unread data), unless the client waits for
/// `100 Continue`: then it is not asked for the body at all.
async fn error_answer(kind: S3FaultKind, req: Request<Incoming>) -> Response<FrontBody> {
    let (status, code, message) = match kind {
        S3FaultKind::SlowDown => (StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "Please reduce your request rate."),
        S3FaultKind::AccessDenied => (StatusCode::FORBIDDEN, "AccessDenied", "Access Denied"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "We encountered an internal error. Please try again."),
    };
    let resource = req.uri().path().to_string();
    let expects_continue = req
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if !expects_continue {
        let mut body = req.into_body();
        while let Some(Ok(_)) = body.frame().await {}
    }
    let request_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_uppercase();
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message>\
         <Resource>{}</Resource><RequestId>{request_id}</RequestId></Error>",
        xml_escape(&resource)
    );
    let mut response = Response::new(Full::new(Bytes::from(xml)).map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/xml"));
    if let Ok(id) = header::HeaderValue::from_str(&request_id) {
        headers.insert("x-amz-request-id", id);
    }
    response
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
