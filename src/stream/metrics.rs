//! What a running stream tells Prometheus and the kubelet, on one small
//! HTTP/1.1 server (`--metrics-addr`): `/metrics` in the Prometheus text
//! format and `/healthz` (200 while every loop of the stream is alive, 503
//! with a one-line reason otherwise).
//!
//! **Lag** (`hcp_dr_stream_lag_seconds`): now minus the newest instant T
//! such that everything the cluster's etcd held at T is durable in the
//! store. T moves on when a segment is written (to the last moment before
//! its write at which the watched member confirmed the stream had every
//! revision it had made: a progress answer, asked every 2 s) and, while
//! nothing is waiting to be written, at each such confirmation. So a quiet
//! etcd has a lag of a few seconds, not the age of its last write; a
//! stream that cannot write, or whose member stopped answering, lags more
//! and more. Before the first such instant of a run, T is when this
//! process started streaming the cluster (a new chain's base counts: its
//! snapshot holds everything etcd had when it was taken).
//! Lag counts the store only: segments waiting in the local spool
//! (`hcp_dr_stream_spooled_bytes`, while the store does not take them)
//! are not durable, so the lag grows while they wait.
//! The series exist only for the clusters whose Lease this process holds.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};

/// One cluster's numbers.
#[derive(Debug)]
pub struct ClusterMetrics {
    pub segments: AtomicU64,
    pub bytes: AtomicU64,
    pub breaks: AtomicU64,
    /// Bytes of segments waiting in the local spool for the store.
    pub spooled_bytes: AtomicU64,
    pub lease_held: AtomicBool,
    /// Streaming now (the Lease held, the run going).
    pub streaming: AtomicBool,
    /// Everything etcd held at this instant is durable.
    durable_as_of: Mutex<Option<DateTime<Utc>>>,
}

impl ClusterMetrics {
    fn new() -> ClusterMetrics {
        ClusterMetrics { segments: AtomicU64::new(0), bytes: AtomicU64::new(0), breaks: AtomicU64::new(0), spooled_bytes: AtomicU64::new(0), lease_held: AtomicBool::new(false), streaming: AtomicBool::new(false), durable_as_of: Mutex::new(None) }
    }

    /// Everything etcd held at `at` is durable (never moves back).
    pub fn durable_as_of(&self, at: DateTime<Utc>) {
        let mut current = self.durable_as_of.lock().expect("metrics lock");
        if current.is_none_or(|c| c < at) {
            *current = Some(at);
        }
    }

    /// A run starts: its lag counts from now until it confirms a point.
    pub fn start_run(&self) {
        *self.durable_as_of.lock().expect("metrics lock") = Some(Utc::now());
        self.streaming.store(true, Ordering::Relaxed);
    }

    pub fn lag_seconds(&self, now: DateTime<Utc>) -> Option<f64> {
        let at = (*self.durable_as_of.lock().expect("metrics lock"))?;
        Some(((now - at).num_milliseconds() as f64 / 1000.0).max(0.0))
    }

    pub fn segment_written(&self, stored_bytes: u64) {
        self.segments.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(stored_bytes, Ordering::Relaxed);
    }
}

/// The stream's metrics and health, shared by its loops and the server.
#[derive(Debug, Default)]
pub struct Registry {
    clusters: Mutex<BTreeMap<(String, String), Arc<ClusterMetrics>>>,
    /// Why the stream is not healthy (a loop that died), if it is not.
    unhealthy: Mutex<Option<String>>,
    /// The supervising loop's last turn (relisting), for liveness.
    heartbeat: Mutex<Option<std::time::Instant>>,
    /// The supervising loop turns at least this often.
    pub heartbeat_every: Mutex<Option<std::time::Duration>>,
}

impl Registry {
    /// The numbers of `namespace/name` (created at zero).
    pub fn cluster(&self, namespace: &str, name: &str) -> Arc<ClusterMetrics> {
        self.clusters.lock().expect("metrics lock").entry((namespace.to_string(), name.to_string())).or_insert_with(|| Arc::new(ClusterMetrics::new())).clone()
    }

    /// A cluster this process no longer owns (deleted, another shard's): its series go.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.clusters.lock().expect("metrics lock").remove(&(namespace.to_string(), name.to_string()));
    }

    /// A loop died: `/healthz` answers 503 with `reason` from now on.
    pub fn fail(&self, reason: String) {
        self.unhealthy.lock().expect("metrics lock").get_or_insert(reason);
    }

    pub fn beat(&self) {
        *self.heartbeat.lock().expect("metrics lock") = Some(std::time::Instant::now());
    }

    /// `None` when healthy; else the one-line reason.
    pub fn health(&self) -> Option<String> {
        if let Some(reason) = self.unhealthy.lock().expect("metrics lock").clone() {
            return Some(reason);
        }
        let every = (*self.heartbeat_every.lock().expect("metrics lock"))?;
        let last = (*self.heartbeat.lock().expect("metrics lock"))?;
        let limit = every * 3 + std::time::Duration::from_secs(5);
        (last.elapsed() > limit).then(|| format!("the loop that lists the hosted clusters has not turned for {}s (it turns every {}s)", last.elapsed().as_secs(), every.as_secs()))
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, now: DateTime<Utc>) -> String {
        let clusters: Vec<((String, String), Arc<ClusterMetrics>)> = self.clusters.lock().expect("metrics lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut out = String::new();
        let families: [(&str, &str, &str); 6] = [
            (LAG, "gauge", LAG_HELP),
            ("hcp_dr_stream_segments_total", "counter", "Segments this process wrote durably to the store for the cluster."),
            ("hcp_dr_stream_bytes_total", "counter", "Bytes of segments (as stored: compressed, encrypted when asked) this process wrote for the cluster."),
            ("hcp_dr_stream_chain_breaks_total", "counter", "Chains of the cluster that ended because the watch could not go on (etcd compacted the revision it needed, or a revision was missing): revisions until the next base are in no chain."),
            ("hcp_dr_stream_spooled_bytes", "gauge", "Bytes of the cluster's segments waiting in the local spool because the store did not take them (not durable yet; uploaded in order when it answers, the chain breaks when the spool is full)."),
            ("hcp_dr_stream_lease_held", "gauge", "1 while this process holds the cluster's Lease (and so is its one writer), 0 while another stream holds it or it is being taken."),
        ];
        for (name, kind, help) in families {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for ((namespace, hosted_cluster), m) in &clusters {
                let streaming = m.streaming.load(Ordering::Relaxed);
                let value = match name {
                    LAG if streaming => m.lag_seconds(now),
                    LAG => None,
                    "hcp_dr_stream_segments_total" => Some(m.segments.load(Ordering::Relaxed) as f64),
                    "hcp_dr_stream_bytes_total" => Some(m.bytes.load(Ordering::Relaxed) as f64),
                    "hcp_dr_stream_chain_breaks_total" => Some(m.breaks.load(Ordering::Relaxed) as f64),
                    "hcp_dr_stream_spooled_bytes" => Some(m.spooled_bytes.load(Ordering::Relaxed) as f64),
                    _ => Some(if m.lease_held.load(Ordering::Relaxed) { 1.0 } else { 0.0 }),
                };
                if let Some(value) = value {
                    out.push_str(&format!("{name}{{namespace=\"{}\",hosted_cluster=\"{}\"}} {value}\n", escape(namespace), escape(hosted_cluster)));
                }
            }
        }
        out.push_str("# HELP hcp_dr_stream_up 1 while every loop of the stream is alive (what /healthz answers 200 for).\n# TYPE hcp_dr_stream_up gauge\n");
        out.push_str(&format!("hcp_dr_stream_up {}\n", if self.health().is_none() { 1 } else { 0 }));
        out
    }
}

/// The lag gauge.
pub const LAG: &str = "hcp_dr_stream_lag_seconds";
const LAG_HELP: &str = "Seconds since the newest instant at which everything the cluster's etcd held was durable in the store (moves on at each segment written and, while nothing waits to be written, at each progress answer of the watched member, every 2 s): a quiet etcd stays at a few seconds; a stream that cannot write or hear etcd grows. Only for clusters this process streams.";

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn respond(registry: &Registry, request: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, content_type: &str, body: String| {
        Response::builder().status(status).header("content-type", content_type).body(Full::new(Bytes::from(body))).expect("a response")
    };
    match (request.method().as_str(), request.uri().path()) {
        ("GET" | "HEAD", "/metrics") => text(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", registry.render(Utc::now())),
        ("GET" | "HEAD", "/healthz") => match registry.health() {
            None => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into()),
            Some(reason) => text(StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", format!("{reason}\n")),
        },
        ("GET" | "HEAD", _) => text(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "not found: /metrics and /healthz are served\n".into()),
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "GET only\n".into()),
    }
}

/// Bind `addr` (bad input when it cannot be: in use, not this host's).
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, String> {
    let parsed: SocketAddr = addr.parse().map_err(|_| format!("--metrics-addr {addr}: not HOST:PORT with an IP address (e.g. 0.0.0.0:9102 or 127.0.0.1:9102)"))?;
    tokio::net::TcpListener::bind(parsed).await.map_err(|e| format!("--metrics-addr {addr}: cannot listen there ({e}): choose a free port on an address of this host"))
}

/// Serve `/metrics` and `/healthz` on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((socket, _)) = listener.accept().await else { continue };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&registry, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(socket), service).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_holds_every_family_and_lag_only_while_streaming() {
        let registry = Registry::default();
        let demo = registry.cluster("clusters", "demo");
        demo.segment_written(100);
        demo.segment_written(50);
        demo.lease_held.store(true, Ordering::Relaxed);
        let waiting = registry.cluster("clusters", "other");
        let now = Utc::now();
        demo.start_run();
        demo.durable_as_of(now - chrono::Duration::seconds(3));
        demo.durable_as_of(now - chrono::Duration::seconds(7)); // never back
        let text = registry.render(now);
        assert!(text.contains("hcp_dr_stream_lag_seconds{namespace=\"clusters\",hosted_cluster=\"demo\"} "), "{text}");
        let lag: f64 = text.lines().find(|l| l.starts_with("hcp_dr_stream_lag_seconds{")).unwrap().rsplit(' ').next().unwrap().parse().unwrap();
        assert!(lag <= 1.0, "the newer point holds: {lag}");
        assert!(!text.contains("lag_seconds{namespace=\"clusters\",hosted_cluster=\"other\"}"), "not streamed here: {text}");
        assert!(text.contains("hcp_dr_stream_segments_total{namespace=\"clusters\",hosted_cluster=\"demo\"} 2\n"), "{text}");
        assert!(text.contains("hcp_dr_stream_bytes_total{namespace=\"clusters\",hosted_cluster=\"demo\"} 150\n"), "{text}");
        assert!(text.contains("hcp_dr_stream_lease_held{namespace=\"clusters\",hosted_cluster=\"other\"} 0\n"), "{text}");
        assert!(text.contains("# TYPE hcp_dr_stream_spooled_bytes gauge\nhcp_dr_stream_spooled_bytes{namespace=\"clusters\",hosted_cluster=\"demo\"} 0\n"), "{text}");
        assert!(text.contains("hcp_dr_stream_up 1\n"));
        drop(waiting);
        registry.forget("clusters", "other");
        assert!(!registry.render(now).contains("\"other\""));
        registry.fail("clusters/demo: the store failed".into());
        assert_eq!(registry.health().as_deref(), Some("clusters/demo: the store failed"));
        assert!(registry.render(now).contains("hcp_dr_stream_up 0\n"));
    }
}
