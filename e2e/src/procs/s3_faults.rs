//! Fault injection at the S3 endpoint's HTTPS front: a share of the requests
//! is answered with an S3 error (500 `InternalError`, 503 `SlowDown`), has
//! its connection reset mid-upload or mid-download, or gets its answer
//! slowly, as S3 (or the network to it) misbehaves; or is refused with 403
//! `AccessDenied`, as for credentials without rights on a bucket
//! (`access-denied`, with a `path_prefix` naming the bucket).
//!
//! The settings are a JSON file ([`S3Faults`], `DIR/s3/s3-faults.json` in the
//! sandbox, [`crate::procs::s3::S3Endpoint::faults_path`]), read again
//! whenever it changes, so a test or a shell can turn faults on and off while
//! the endpoint runs. Faults are decided per HTTP request. Every fault
//! injected is appended as one JSON line to `<faults_file>.log`.
//! [`crate::procs::s3_front`] applies them.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::faults_file::Watched;

pub use crate::faults_file::{log_path, read_log};

/// The file name of the settings in the S3 endpoint's directory
/// (`DIR/s3/s3-faults.json` in the sandbox).
pub const S3_FAULTS_FILE: &str = "s3-faults.json";

/// How long a `slow-read` stalls when `delay_ms` is 0.
pub const DEFAULT_STALL_MS: u64 = 3000;

/// The faults to inject: the JSON content of the faults file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct S3Faults {
    /// Share (0.0 to 1.0) of the matching requests that get a fault.
    pub share: f64,
    /// The kinds of fault, one drawn uniformly for each faulted request.
    pub kinds: Vec<S3FaultKind>,
    /// Only requests with one of these methods match (`GET`, `PUT`, ...;
    /// all requests when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Only requests whose `User-Agent` header starts with this match (all
    /// when absent; the AWS SDK for Rust sends `aws-sdk-rust/...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// Only requests whose URL path starts with this match (all when
    /// absent), e.g. `/oidc-mgmt-a/` for one bucket addressed path-style.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// How long a `slow-read` stalls mid-body (0: [`DEFAULT_STALL_MS`]).
    #[serde(default)]
    pub delay_ms: u64,
    /// Seed of the random draws (a fresh random seed when absent). The
    /// sequence starts again from the seed each time the file is read.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// One kind of S3 fault.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum S3FaultKind {
    /// 500 with an S3 XML error `InternalError`; nothing forwarded.
    InternalError,
    /// 503 with an S3 XML error `SlowDown`; nothing forwarded.
    SlowDown,
    /// Part of the request body is read (none without a body), then the
    /// connection is reset without an answer; nothing forwarded.
    ResetRequest,
    /// The request is forwarded and applied; of the answer only the status,
    /// the headers and part of the body are sent (nothing when the body is
    /// empty), then the connection is reset.
    ResetResponse,
    /// The request is forwarded; the answer's body stalls for `delay_ms`
    /// halfway (at its end when empty), then arrives complete.
    SlowRead,
    /// 403 with an S3 XML error `AccessDenied`; nothing forwarded. Not a
    /// transient failure (retrying does not help): never in [`S3FaultKind::ALL`],
    /// only injected when asked for by name, usually with `path_prefix`.
    AccessDenied,
}

impl S3FaultKind {
    /// The transient kinds, which a client is expected to survive by
    /// retrying: what chaos runs draw from. [`S3FaultKind::AccessDenied`]
    /// is not one of them ([`S3FaultKind::EVERY`] lists every kind).
    pub const ALL: [S3FaultKind; 5] = [
        S3FaultKind::InternalError,
        S3FaultKind::SlowDown,
        S3FaultKind::ResetRequest,
        S3FaultKind::ResetResponse,
        S3FaultKind::SlowRead,
    ];

    /// Every kind: [`S3FaultKind::ALL`] and [`S3FaultKind::AccessDenied`].
    pub const EVERY: [S3FaultKind; 6] = [
        S3FaultKind::InternalError,
        S3FaultKind::SlowDown,
        S3FaultKind::ResetRequest,
        S3FaultKind::ResetResponse,
        S3FaultKind::SlowRead,
        S3FaultKind::AccessDenied,
    ];

    /// The name used in the faults file, the log and the CLI (`slow-down`).
    pub fn as_str(self) -> &'static str {
        match self {
            S3FaultKind::InternalError => "internal-error",
            S3FaultKind::SlowDown => "slow-down",
            S3FaultKind::ResetRequest => "reset-request",
            S3FaultKind::ResetResponse => "reset-response",
            S3FaultKind::SlowRead => "slow-read",
            S3FaultKind::AccessDenied => "access-denied",
        }
    }
}

impl std::fmt::Display for S3FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl S3Faults {
    /// How long a `slow-read` stalls.
    pub fn stall(&self) -> Duration {
        Duration::from_millis(if self.delay_ms == 0 { DEFAULT_STALL_MS } else { self.delay_ms })
    }
}

impl crate::faults_file::FaultSettings for S3Faults {
    fn share(&self) -> f64 {
        self.share
    }
    fn kind_count(&self) -> usize {
        self.kinds.len()
    }
    fn seed(&self) -> Option<u64> {
        self.seed
    }
}

/// Write `faults` to `faults_file` (replaced atomically, so the front never
/// reads half of it), or remove the file when `None`. The log is kept.
pub fn write_faults_file(faults_file: &Path, faults: Option<&S3Faults>) -> std::io::Result<()> {
    crate::faults_file::write(faults_file, faults)
}

/// The settings in `faults_file`: `Ok(None)` when it is absent.
pub fn read_faults_file(faults_file: &Path) -> Result<Option<S3Faults>, String> {
    crate::faults_file::read(faults_file)
}

/// The request a fault is decided for (and recorded with).
#[derive(Debug, Clone)]
pub(crate) struct RequestInfo {
    pub(crate) method: String,
    /// The path only: a presigned URL's query holds its signature.
    pub(crate) path: String,
    pub(crate) user_agent: Option<String>,
}

/// Decides the faults of one S3 front from its faults file and records them.
pub(crate) struct S3Injector {
    log: PathBuf,
    state: Mutex<Watched<S3Faults>>,
}

impl S3Injector {
    pub(crate) fn new(file: PathBuf) -> S3Injector {
        S3Injector { log: log_path(&file), state: Mutex::new(Watched::new(file, "S3")) }
    }

    /// The fault for a request, if it gets one, and the `slow-read` stall.
    /// Not recorded yet: the front records it once applied
    /// ([`S3Injector::record`]), with the bytes that went through.
    pub(crate) fn decide(&self, request: &RequestInfo) -> Option<(S3FaultKind, Duration)> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.refresh();
        let Watched { faults, rng, .. } = &mut *state;
        let faults = faults.as_ref()?;
        if !faults.methods.is_empty()
            && !faults.methods.iter().any(|m| m.eq_ignore_ascii_case(&request.method))
        {
            return None;
        }
        if let Some(prefix) = &faults.user_agent
            && !request.user_agent.as_deref().is_some_and(|ua| ua.starts_with(prefix.as_str()))
        {
            return None;
        }
        if let Some(prefix) = &faults.path_prefix
            && !request.path.starts_with(prefix.as_str())
        {
            return None;
        }
        if faults.share <= 0.0 || rng.next_f64() >= faults.share {
            return None;
        }
        let kind = faults.kinds[(rng.next_u64() % faults.kinds.len() as u64) as usize];
        Some((kind, faults.stall()))
    }

    /// Append one line to the log: `bytes` is what of the body went through
    /// before a reset (request body read for `reset-request`, response body
    /// sent for `reset-response`).
    pub(crate) fn record(&self, request: &RequestInfo, kind: S3FaultKind, bytes: Option<u64>) {
        tracing::debug!(method = %request.method, path = %request.path, %kind, ?bytes, "S3 fault injected");
        let mut line = json!({
            "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "kind": kind,
            "method": request.method,
            "path": request.path,
            "user_agent": request.user_agent,
        });
        if let Some(bytes) = bytes {
            line["bytes"] = json!(bytes);
        }
        crate::faults_file::append(&self.log, &line, "S3");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_kebab_case_and_fields_optional() {
        let f: S3Faults = serde_json::from_str(
            r#"{"share": 0.5, "kinds": ["internal-error", "slow-down", "reset-request", "reset-response", "slow-read"]}"#,
        )
        .unwrap();
        assert_eq!(f.kinds, S3FaultKind::ALL.to_vec());
        assert_eq!((f.methods.len(), f.user_agent.as_deref(), f.delay_ms, f.seed), (0, None, 0, None));
        assert_eq!(f.path_prefix, None);
        assert!(!serde_json::to_string(&f).unwrap().contains("path_prefix"));
        assert!(!S3FaultKind::ALL.contains(&S3FaultKind::AccessDenied), "never drawn in chaos runs");
        assert_eq!(&S3FaultKind::EVERY[..5], &S3FaultKind::ALL[..]);
        assert_eq!(
            <S3FaultKind as clap::ValueEnum>::value_variants(),
            &S3FaultKind::EVERY[..],
            "EVERY lists every kind"
        );
        let denied: S3Faults =
            serde_json::from_str(r#"{"share": 1, "kinds": ["access-denied"], "path_prefix": "/oidc-mgmt-a/"}"#).unwrap();
        assert_eq!((denied.kinds[0], denied.path_prefix.as_deref()), (S3FaultKind::AccessDenied, Some("/oidc-mgmt-a/")));
        assert_eq!(f.stall(), Duration::from_millis(DEFAULT_STALL_MS));
        for k in S3FaultKind::EVERY {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }

    #[test]
    fn filters_and_share() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(S3_FAULTS_FILE);
        let injector = S3Injector::new(file.clone());
        let get = RequestInfo { method: "GET".into(), path: "/b/k".into(), user_agent: Some("aws-sdk-rust/1".into()) };
        let put = RequestInfo { method: "PUT".into(), ..get.clone() };
        let curl = RequestInfo { user_agent: Some("curl/8".into()), ..get.clone() };
        assert_eq!(injector.decide(&get), None, "no file: no faults");

        let faults = S3Faults {
            share: 1.0,
            kinds: vec![S3FaultKind::SlowDown],
            methods: vec!["get".into()],
            user_agent: Some("aws-sdk-rust".into()),
            ..Default::default()
        };
        write_faults_file(&file, Some(&faults)).unwrap();
        assert_eq!(injector.decide(&get).map(|d| d.0), Some(S3FaultKind::SlowDown));
        assert_eq!(injector.decide(&put), None);
        assert_eq!(injector.decide(&curl), None);

        let only_oidc = S3Faults { path_prefix: Some("/oidc-mgmt-a/".into()), ..faults.clone() };
        write_faults_file(&file, Some(&only_oidc)).unwrap();
        assert_eq!(injector.decide(&get), None, "another path");
        let oidc = RequestInfo { path: "/oidc-mgmt-a/id/openid/v1/jwks".into(), ..get.clone() };
        assert_eq!(injector.decide(&oidc).map(|d| d.0), Some(S3FaultKind::SlowDown));

        std::fs::write(&file, "{not json").unwrap();
        assert_eq!(injector.decide(&get), None, "a file that does not parse: no faults");

        write_faults_file(&file, Some(&S3Faults { share: 0.0, ..faults.clone() })).unwrap();
        assert_eq!(injector.decide(&get), None);
        write_faults_file(&file, None).unwrap();
        assert_eq!(injector.decide(&get), None);

        injector.record(&get, S3FaultKind::ResetResponse, Some(7));
        let log = read_log(&file);
        assert_eq!(log.len(), 1);
        assert_eq!((log[0]["kind"].as_str(), log[0]["bytes"].as_u64()), (Some("reset-response"), Some(7)));
        assert_eq!(log[0]["path"], "/b/k");
    }

    #[test]
    fn seeded_decisions_repeat() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(S3_FAULTS_FILE);
        let faults = S3Faults { share: 0.3, kinds: S3FaultKind::ALL.to_vec(), seed: Some(7), ..Default::default() };
        let req = RequestInfo { method: "GET".into(), path: "/".into(), user_agent: None };
        let run = || {
            write_faults_file(&file, None).unwrap();
            write_faults_file(&file, Some(&faults)).unwrap();
            let injector = S3Injector::new(file.clone());
            (0..200).map(|_| injector.decide(&req).map(|d| d.0)).collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run());
        let hit = first.iter().filter(|d| d.is_some()).count();
        assert!((30..90).contains(&hit), "{hit}");
    }
}
