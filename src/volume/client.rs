//! hcp-dr's side of the mover protocol ([`super::mover`]): one HTTP/1.1
//! connection per request to the mover's address (its pod IP, or a local
//! port-forward).

use std::net::SocketAddr;

use bytes::Bytes;
use futures::TryStreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, StatusCode};
use tokio::io::AsyncRead;
use tokio::net::TcpStream;

use super::ArchiveDigest;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the volume mover at {addr}: {message}")]
    Mover { addr: SocketAddr, message: String },
}

/// A mover at `addr` with its token.
#[derive(Clone)]
pub struct MoverClient {
    pub addr: SocketAddr,
    token: String,
}

impl std::fmt::Debug for MoverClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the token
        f.debug_struct("MoverClient").field("addr", &self.addr).finish_non_exhaustive()
    }
}

type ReqBody = UnsyncBoxBody<Bytes, std::io::Error>;

impl MoverClient {
    pub fn new(addr: SocketAddr, token: String) -> MoverClient {
        MoverClient { addr, token }
    }

    fn err(&self, message: impl Into<String>) -> ClientError {
        ClientError::Mover { addr: self.addr, message: message.into() }
    }

    async fn request(&self, method: Method, path: &str, body: ReqBody) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let stream = TcpStream::connect(self.addr).await.map_err(|e| self.err(format!("connecting: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| self.err(format!("HTTP handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, self.addr.to_string())
            .header(hyper::header::AUTHORIZATION, format!("Bearer {}", self.token))
            .body(body)
            .map_err(|e| self.err(format!("building {method} {path}: {e}")))?;
        let res = sender.send_request(req).await.map_err(|e| self.err(format!("{method} {path}: {e}")))?;
        if res.status() == StatusCode::OK {
            return Ok(res);
        }
        let status = res.status();
        let text = res.into_body().collect().await.map(|b| String::from_utf8_lossy(&b.to_bytes()).to_string()).unwrap_or_default();
        Err(self.err(format!("{method} {path} answered {status}: {}", text.trim())))
    }

    fn empty() -> ReqBody {
        Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync()
    }

    /// Whether the mover answers its readiness endpoint.
    pub async fn ready(&self) -> bool {
        self.request(Method::GET, "/healthz", Self::empty()).await.is_ok()
    }

    /// The volume as a tar stream. An archive that breaks off mid-way ends
    /// the stream with an error, never a short tar read as whole.
    pub async fn archive(&self) -> Result<Box<dyn AsyncRead + Send + Unpin>, ClientError> {
        let res = self.request(Method::GET, "/v1/archive", Self::empty()).await?;
        let addr = self.addr;
        let stream = res
            .into_body()
            .into_data_stream()
            .map_err(move |e| std::io::Error::other(format!("the volume mover at {addr} broke off the archive: {e}")));
        Ok(Box::new(tokio_util::io::StreamReader::new(stream)))
    }

    /// The digest of the last archive the mover sent whole.
    pub async fn digest(&self) -> Result<ArchiveDigest, ClientError> {
        let res = self.request(Method::GET, "/v1/digest", Self::empty()).await?;
        let body = res.into_body().collect().await.map_err(|e| self.err(format!("reading the digest: {e}")))?.to_bytes();
        serde_json::from_slice(&body).map_err(|e| self.err(format!("the digest is not JSON: {e}")))
    }

    /// Send a tar into the volume; returns what the mover read.
    pub async fn put_archive(&self, body: Box<dyn AsyncRead + Send + Unpin>) -> Result<ArchiveDigest, ClientError> {
        let frames = tokio_util::io::ReaderStream::with_capacity(body, 256 * 1024).map_ok(Frame::data);
        let res = self.request(Method::PUT, "/v1/archive", StreamBody::new(frames).boxed_unsync()).await?;
        let body = res.into_body().collect().await.map_err(|e| self.err(format!("reading the answer: {e}")))?.to_bytes();
        serde_json::from_slice(&body).map_err(|e| self.err(format!("the answer is not JSON: {e}")))
    }

    /// Ask the mover to exit 0 (its Job completes).
    pub async fn exit(&self) -> Result<(), ClientError> {
        self.request(Method::POST, "/v1/exit", Self::empty()).await.map(|_| ())
    }
}
