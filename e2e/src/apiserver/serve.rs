//! The TLS listener: HTTP/1.1 and HTTP/2 (ALPN), upgrades for port-forward,
//! and the injected faults (`faults`), decided here before the router
//! (`http::router`, given the `http::canonical` path) sees a request, and
//! the audit log (`audit`), written when a response starts.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tower::ServiceExt as _;

use super::faults::Fault;
use super::{Inner, http};

/// Accept connections until shutdown; then drop every open connection.
pub(crate) async fn accept_loop(
    inner: Arc<Inner>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let router = http::router(inner.clone());
    let mut shutdown = inner.shutdown.clone();
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => break,
            a = listener.accept() => a,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (tcp, _peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let reset = Arc::new(Notify::new());
        let service = FaultingService {
            inner: inner.clone(),
            router: router.clone(),
            reset: reset.clone(),
        };
        conns.spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = reset.notified() => {}
            }
            // a reset fault: HTTP/1.1 closes the connection on the failed
            // request (no response is written); HTTP/2 resets that stream,
            // sends GOAWAY and closes once its other streams are answered,
            // so no response to another request is lost
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    drop(listener);
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// What a reset fault makes the service return: hyper then drops the
/// connection (HTTP/1.1) or resets the stream (HTTP/2) without an answer.
#[derive(Debug)]
struct ResetFault;

impl std::fmt::Display for ResetFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset by an injected API fault")
    }
}

impl std::error::Error for ResetFault {}

/// The router behind the injected faults, one per connection.
#[derive(Clone)]
struct FaultingService {
    inner: Arc<Inner>,
    router: Router,
    /// Told when a reset fault hits a request of this connection.
    reset: Arc<Notify>,
}

impl hyper::service::Service<Request<Incoming>> for FaultingService {
    type Response = Response<Body>;
    type Error = ResetFault;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, ResetFault>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let user_agent = req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok());
        let fault = self.inner.faults.as_ref().and_then(|injector| {
            injector.decide(req.method().as_str(), req.uri().path(), req.uri().query(), user_agent)
        });
        // what the audit log says of the request, once its response starts
        let audited = self.inner.audit.as_ref().map(|_| {
            let uri = req.uri().path_and_query().map(|pq| pq.as_str()).unwrap_or("/").to_string();
            (req.method().to_string(), uri, user_agent.map(str::to_string))
        });
        let inner = self.inner.clone();
        let audit = move |response: &Response<Body>| {
            if let (Some(log), Some((method, uri, user_agent))) = (&inner.audit, &audited) {
                log.record(method, uri, user_agent.as_deref(), response.status().as_u16());
            }
        };
        let router = self.router.clone();
        let reset = self.reset.clone();
        Box::pin(async move {
            match fault {
                Some(Fault::Answer(kind)) => {
                    let response = super::faults::answer(kind);
                    audit(&response);
                    return Ok(response);
                }
                Some(Fault::Reset) => {
                    reset.notify_one();
                    return Err(ResetFault);
                }
                Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
                None => {}
            }
            let response: Result<Response<Body>, Infallible> =
                router.oneshot(http::canonical(req)).await;
            let response = response.map_err(|never| match never {})?;
            audit(&response);
            Ok(response)
        })
    }
}
