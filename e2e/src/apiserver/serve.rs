//! The TLS listener: HTTP/1.1 and HTTP/2 (ALPN), upgrades for port-forward.

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

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
        let service = TowerToHyperService::new(router.clone());
        conns.spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
        });
    }
    drop(listener);
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}
