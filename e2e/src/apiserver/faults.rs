//! Fault injection: a share of the requests a client sends is answered with
//! 429, 500 or 503, has its connection reset, or is delayed, as an API server
//! of a management cluster in trouble answers them.
//!
//! The settings are a JSON file ([`ApiFaults`]), named by
//! `ApiServerConfig::faults_file` and read again whenever it changes, so a
//! test or a shell can turn faults on and off while the server runs.
//! Each fault is decided before the request is authenticated or processed:
//! when a fault answers, nothing of the request was applied. Every fault
//! injected is appended as one JSON line to `<faults_file>.log`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::status::ApiError;
use crate::faults_file::Watched;

/// The file name the sandbox gives the settings of a management cluster
/// (in `DIR/<cluster>/state/`).
pub const API_FAULTS_FILE: &str = "api-faults.json";

/// How long a `delay` fault waits when `delay_ms` is 0.
pub const DEFAULT_DELAY_MS: u64 = 2000;

/// The faults to inject: the JSON content of the faults file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ApiFaults {
    /// Share (0.0 to 1.0) of the matching requests that get a fault.
    #[serde(default)]
    pub share: f64,
    /// The kinds of fault, one drawn uniformly for each faulted request.
    #[serde(default)]
    pub kinds: Vec<FaultKind>,
    /// Aggregated APIs (`metrics.k8s.io/v1beta1`) registered but down, as
    /// an APIService whose backing service does not answer: the group is
    /// listed in `/apis`, and every request under `/apis/<group>/<version>`
    /// gets the aggregator's 503 (real management clusters often carry one,
    /// e.g. a stale metrics or package server). For every client.
    #[serde(default)]
    pub unavailable_api_services: Vec<String>,
    /// Only requests whose `User-Agent` header starts with this match
    /// (all requests when absent).
    #[serde(default)]
    pub user_agent: Option<String>,
    /// How long a `delay` fault waits (0: [`DEFAULT_DELAY_MS`]).
    #[serde(default)]
    pub delay_ms: u64,
    /// Seed of the random draws (a fresh random seed when absent). The
    /// sequence starts again from the seed each time the file is read.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// One kind of fault.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// 429 with `Retry-After: 1` (an overloaded API server's max-in-flight limit).
    TooManyRequests,
    /// 500 `InternalError`, no `Retry-After` (an etcd error).
    InternalError,
    /// 503 with `Retry-After: 1` (an API server restarting behind a load balancer).
    Unavailable,
    /// No answer: the connection is closed (HTTP/1.1) or the stream reset
    /// and the connection shut down (HTTP/2).
    Reset,
    /// Served normally after `delay_ms` (a slow etcd).
    Delay,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::TooManyRequests,
        FaultKind::InternalError,
        FaultKind::Unavailable,
        FaultKind::Reset,
        FaultKind::Delay,
    ];

    /// The name used in the faults file, the log and the CLI (`too-many-requests`).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::TooManyRequests => "too-many-requests",
            FaultKind::InternalError => "internal-error",
            FaultKind::Unavailable => "unavailable",
            FaultKind::Reset => "reset",
            FaultKind::Delay => "delay",
        }
    }

    /// Whether a long-lived request (a watch) may get this kind: only the
    /// error answers given at its start, never a reset or a delay.
    fn applies_to_watch(self) -> bool {
        matches!(
            self,
            FaultKind::TooManyRequests | FaultKind::InternalError | FaultKind::Unavailable
        )
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ApiFaults {
    /// How long a `delay` fault waits.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(if self.delay_ms == 0 { DEFAULT_DELAY_MS } else { self.delay_ms })
    }
}

pub use crate::faults_file::{log_path, read_log};

impl crate::faults_file::FaultSettings for ApiFaults {
    fn share(&self) -> f64 {
        self.share
    }
    fn kind_count(&self) -> usize {
        self.kinds.len()
    }
    fn seed(&self) -> Option<u64> {
        self.seed
    }
    fn standing(&self) -> bool {
        !self.unavailable_api_services.is_empty()
    }
}

/// Write `faults` to `faults_file` (replaced atomically, so a server never
/// reads half of it), or remove the file when `None`. The log is kept.
pub fn write_faults_file(faults_file: &Path, faults: Option<&ApiFaults>) -> std::io::Result<()> {
    crate::faults_file::write(faults_file, faults)
}

/// The settings in `faults_file`: `Ok(None)` when it is absent.
pub fn read_faults_file(faults_file: &Path) -> Result<Option<ApiFaults>, String> {
    crate::faults_file::read(faults_file)
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fault {
    /// Answer this (429, 500 or 503) instead of processing the request.
    Answer(FaultKind),
    /// Give no answer and close the connection.
    Reset,
    /// Wait, then serve the request.
    Delay(Duration),
}

/// Decides the faults of one API server from its faults file.
pub(crate) struct Injector {
    log: PathBuf,
    state: Mutex<Watched<ApiFaults>>,
}

/// Paths never faulted: probes and `/version` (a load balancer's health
/// checks and client discovery of the server version).
fn exempt(path: &str) -> bool {
    ["/healthz", "/readyz", "/livez", "/version"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/')))
}

/// A watch: `?watch=true` or the legacy `/api/v1/watch/...` paths.
fn is_watch(path: &str, query: Option<&str>) -> bool {
    let flagged = query.is_some_and(|q| {
        q.split('&').any(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            k == "watch" && matches!(v, "true" | "1" | "True")
        })
    });
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    flagged
        || (segs.first() == Some(&"api") && segs.get(2) == Some(&"watch"))
        || (segs.first() == Some(&"apis") && segs.get(3) == Some(&"watch"))
}

impl Injector {
    pub(crate) fn new(file: PathBuf) -> Injector {
        Injector { log: log_path(&file), state: Mutex::new(Watched::new(file, "API")) }
    }

    /// The fault for a request, if it gets one (recorded in the log).
    pub(crate) fn decide(
        &self,
        method: &str,
        path: &str,
        query: Option<&str>,
        user_agent: Option<&str>,
    ) -> Option<Fault> {
        if exempt(path) {
            return None;
        }
        let (kind, delay) = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.refresh();
            let Watched { faults, rng, .. } = &mut *state;
            let faults = faults.as_ref()?;
            let down = faults.unavailable_api_services.iter().any(|gv| {
                path.strip_prefix("/apis/")
                    .and_then(|rest| rest.strip_prefix(gv.as_str()))
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            });
            if down {
                drop(state);
                self.record(method, path, user_agent, FaultKind::Unavailable);
                return Some(Fault::Answer(FaultKind::Unavailable));
            }
            if let Some(prefix) = &faults.user_agent
                && !user_agent.is_some_and(|ua| ua.starts_with(prefix.as_str()))
            {
                return None;
            }
            let watch = is_watch(path, query);
            let kinds: Vec<FaultKind> = faults
                .kinds
                .iter()
                .copied()
                .filter(|k| !watch || k.applies_to_watch())
                .collect();
            if kinds.is_empty() {
                return None;
            }
            if faults.share <= 0.0 || rng.next_f64() >= faults.share {
                return None;
            }
            let kind = kinds[(rng.next_u64() % kinds.len() as u64) as usize];
            (kind, faults.delay())
        };
        self.record(method, path, user_agent, kind);
        Some(match kind {
            FaultKind::Reset => Fault::Reset,
            FaultKind::Delay => Fault::Delay(delay),
            other => Fault::Answer(other),
        })
    }

    /// The unavailable aggregated APIs as `(group, version)`.
    pub(crate) fn unavailable_api_services(&self) -> Vec<(String, String)> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.refresh();
        state
            .faults
            .as_ref()
            .map(|f| {
                f.unavailable_api_services
                    .iter()
                    .filter_map(|gv| gv.split_once('/'))
                    .map(|(g, v)| (g.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn record(&self, method: &str, path: &str, user_agent: Option<&str>, kind: FaultKind) {
        tracing::debug!(%method, %path, %kind, "API fault injected");
        let line = json!({"method": method, "path": path, "user_agent": user_agent, "kind": kind});
        crate::faults_file::append(&self.log, &line, "API");
    }
}

/// The answer of a 429, 500 or 503 fault, as a kube-apiserver gives it.
pub(crate) fn answer(kind: FaultKind) -> Response<Body> {
    let (error, retry_after) = match kind {
        FaultKind::TooManyRequests => (
            ApiError::new(429, "TooManyRequests", "Too many requests, please try again later.")
                .with_details(json!({"retryAfterSeconds": 1})),
            true,
        ),
        FaultKind::Unavailable => (
            ApiError::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            )
            .with_details(json!({"retryAfterSeconds": 1})),
            true,
        ),
        _ => (
            ApiError::new(
                500,
                "InternalError",
                "Internal error occurred: etcdserver: request timed out",
            )
            .with_details(json!({"causes": [{"message": "etcdserver: request timed out"}]})),
            false,
        ),
    };
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(&error.to_status()).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_kebab_case() {
        let f: ApiFaults = serde_json::from_str(
            r#"{"share": 0.5, "kinds": ["too-many-requests", "internal-error", "unavailable", "reset", "delay"]}"#,
        )
        .unwrap();
        assert_eq!(f.kinds, FaultKind::ALL.to_vec());
        assert_eq!((f.user_agent, f.delay_ms, f.seed), (None, 0, None));
        for k in FaultKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }

    #[test]
    fn watches_and_probes() {
        assert!(exempt("/healthz") && exempt("/readyz/etcd") && exempt("/version/"));
        assert!(!exempt("/healthzz") && !exempt("/api/v1/namespaces"));
        assert!(is_watch("/api/v1/pods", Some("labelSelector=a&watch=true")));
        assert!(is_watch("/api/v1/watch/pods", None));
        assert!(is_watch("/apis/apps/v1/watch/deployments", None));
        assert!(!is_watch("/api/v1/pods", Some("watch=false")));
        assert!(!is_watch("/api/v1/namespaces/watch", None));
    }

    #[test]
    fn seeded_draws_are_repeatable_and_near_the_share() {
        let draw = |seed| {
            let mut rng = crate::faults_file::SplitMix64(seed);
            (0..10_000).filter(|_| rng.next_f64() < 0.1).count()
        };
        assert_eq!(draw(7), draw(7));
        assert!((800..1200).contains(&draw(7)), "{}", draw(7));
    }
}
