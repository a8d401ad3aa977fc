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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::status::ApiError;

/// The file name the sandbox gives the settings of a management cluster
/// (in `DIR/<cluster>/state/`).
pub const API_FAULTS_FILE: &str = "api-faults.json";

/// How long a `delay` fault waits when `delay_ms` is 0.
pub const DEFAULT_DELAY_MS: u64 = 2000;

/// The faults to inject: the JSON content of the faults file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ApiFaults {
    /// Share (0.0 to 1.0) of the matching requests that get a fault.
    pub share: f64,
    /// The kinds of fault, one drawn uniformly for each faulted request.
    pub kinds: Vec<FaultKind>,
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
    /// Why these settings cannot be used, if they cannot.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.share) {
            return Err(format!("share must be within 0.0..=1.0, not {}", self.share));
        }
        if self.kinds.is_empty() {
            return Err("kinds must name at least one kind of fault".into());
        }
        Ok(())
    }

    /// How long a `delay` fault waits.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(if self.delay_ms == 0 { DEFAULT_DELAY_MS } else { self.delay_ms })
    }
}

/// `<faults_file>.log`: where the injected faults are recorded.
pub fn log_path(faults_file: &Path) -> PathBuf {
    let mut name = faults_file.as_os_str().to_os_string();
    name.push(".log");
    PathBuf::from(name)
}

/// Write `faults` to `faults_file` (replaced atomically, so a server never
/// reads half of it), or remove the file when `None`. The log is kept.
pub fn write_faults_file(faults_file: &Path, faults: Option<&ApiFaults>) -> std::io::Result<()> {
    let Some(faults) = faults else {
        return match std::fs::remove_file(faults_file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    faults
        .validate()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    if let Some(parent) = faults_file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut tmp = faults_file.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_string_pretty(faults).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, format!("{text}\n"))?;
    std::fs::rename(&tmp, faults_file)
}

/// The settings in `faults_file`: `Ok(None)` when it is absent.
pub fn read_faults_file(faults_file: &Path) -> Result<Option<ApiFaults>, String> {
    match std::fs::read_to_string(faults_file) {
        Ok(text) => {
            let faults: ApiFaults = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            faults.validate()?;
            Ok(Some(faults))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The faults recorded in `<faults_file>.log`, oldest first (lines that do
/// not parse are skipped; no log: none).
pub fn read_log(faults_file: &Path) -> Vec<Value> {
    std::fs::read_to_string(log_path(faults_file))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
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

/// Identity of one version of the faults file: a rewrite (even within the
/// same mtime tick) changes the size or, replaced by a rename, the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    mtime: Option<SystemTime>,
    len: u64,
    ino: u64,
}

struct State {
    /// The version of the file `faults` was read from (None: no file).
    key: Option<FileKey>,
    faults: Option<ApiFaults>,
    rng: SplitMix64,
}

/// Decides the faults of one API server from its faults file.
pub(crate) struct Injector {
    file: PathBuf,
    log: PathBuf,
    state: Mutex<State>,
}

/// A small, seedable generator: enough for drawing faults (the S3 front's
/// too, in [`crate::procs::s3_faults`]).
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn random() -> SplitMix64 {
        let id = uuid::Uuid::new_v4();
        let b = id.as_bytes();
        SplitMix64(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
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
        Injector {
            log: log_path(&file),
            file,
            state: Mutex::new(State { key: None, faults: None, rng: SplitMix64::random() }),
        }
    }

    /// Read the file again if it changed since it was last read.
    fn refresh(&self, state: &mut State) {
        use std::os::unix::fs::MetadataExt as _;
        let key = match std::fs::metadata(&self.file) {
            Ok(m) => Some(FileKey { mtime: m.modified().ok(), len: m.len(), ino: m.ino() }),
            Err(_) => None,
        };
        if key == state.key {
            return;
        }
        state.key = key;
        state.faults = None;
        if key.is_none() {
            tracing::info!(file = %self.file.display(), "API faults off");
            return;
        }
        match read_faults_file(&self.file) {
            Ok(faults) => {
                if let Some(f) = &faults {
                    if let Some(seed) = f.seed {
                        state.rng = SplitMix64(seed);
                    }
                    tracing::info!(file = %self.file.display(), faults = ?f, "API faults in force");
                }
                state.faults = faults;
            }
            // once per version of the file: it is read again only when it changes
            Err(err) => tracing::warn!(
                file = %self.file.display(),
                error = %err,
                "ignoring the API faults file: it does not parse; no faults are injected"
            ),
        }
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
            self.refresh(&mut state);
            let State { faults, rng, .. } = &mut *state;
            let faults = faults.as_ref()?;
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

    fn record(&self, method: &str, path: &str, user_agent: Option<&str>, kind: FaultKind) {
        tracing::debug!(%method, %path, %kind, "API fault injected");
        let line = json!({"method": method, "path": path, "user_agent": user_agent, "kind": kind});
        let mut text = line.to_string();
        text.push('\n');
        // one write of one line with O_APPEND: concurrent records do not interleave
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(err) = written {
            tracing::warn!(log = %self.log.display(), error = %err, "recording an API fault failed");
        }
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
            let mut rng = SplitMix64(seed);
            (0..10_000).filter(|_| rng.next_f64() < 0.1).count()
        };
        assert_eq!(draw(7), draw(7));
        assert!((800..1200).contains(&draw(7)), "{}", draw(7));
    }
}
