//! What an unattended backup tells people: a Kubernetes Event on the
//! HostedCluster when it starts, succeeds or fails; a status ConfigMap per
//! cluster (`hcp-dr-backup-<cluster>` in its namespace: last success, last
//! failure and why); and Prometheus metrics in the text format for the node
//! exporter's textfile collector (`--metrics-file`). All best effort: a
//! signal that cannot be written is a warning, never a failed backup.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;

use crate::hosted::HOSTED_CLUSTER;
use crate::kube::{api, get_json};

/// The status ConfigMap of a cluster.
pub fn status_configmap(hosted_cluster: &str) -> String {
    format!("hcp-dr-backup-{hosted_cluster}")
}

/// How a backup ended, for the signals.
#[derive(Debug, Clone)]
pub enum Outcome {
    Started,
    Succeeded {
        backup: String,
        revision: Option<i64>,
        api_downtime_seconds: Option<f64>,
        bytes: u64,
        seconds: f64,
        /// `--copy-to` stores the backup is not complete in.
        copies_incomplete: usize,
    },
    Failed {
        reason: String,
        seconds: f64,
    },
}

/// An Event on the HostedCluster (Warning for a failure).
pub async fn event(client: &Client, namespace: &str, name: &str, outcome: &Outcome) -> Result<(), String> {
    let hc = get_json(&api(client, &HOSTED_CLUSTER, namespace), name, "HostedCluster")
        .await
        .map_err(|e| e.to_string())?;
    let uid = hc.as_ref().and_then(|h| h["metadata"]["uid"].as_str()).unwrap_or_default().to_string();
    let (reason, kind, message) = match outcome {
        Outcome::Started => ("BackupStarted", "Normal", "hcp-dr backup started".to_string()),
        Outcome::Succeeded { backup, api_downtime_seconds, .. } => (
            "BackupSucceeded",
            "Normal",
            format!(
                "hcp-dr backup stored at {backup}; API down {:.1}s",
                api_downtime_seconds.unwrap_or_default()
            ),
        ),
        Outcome::Failed { reason, .. } => ("BackupFailed", "Warning", format!("hcp-dr backup failed: {reason}")),
    };
    let now = Utc::now();
    let event: Event = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{name}.hcp-dr-"), "namespace": namespace},
        "involvedObject": {"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                           "name": name, "namespace": namespace, "uid": uid},
        "reason": reason,
        "type": kind,
        "message": message,
        "source": {"component": "hcp-dr"},
        "reportingComponent": "hcp-dr",
        "firstTimestamp": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "lastTimestamp": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "count": 1,
    }))
    .map_err(|e| e.to_string())?;
    Api::<Event>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
        .map_err(|e| format!("creating an Event in {namespace}: {e}"))
}

/// Merge the outcome into the cluster's status ConfigMap.
pub async fn status(client: &Client, namespace: &str, name: &str, outcome: &Outcome, at: DateTime<Utc>) -> Result<(), String> {
    let stamp = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let data = match outcome {
        Outcome::Started => json!({"last_start_time": stamp}),
        Outcome::Succeeded { backup, revision, api_downtime_seconds, .. } => json!({
            "last_success_time": stamp,
            "last_success_backup": backup,
            "last_success_revision": revision.map(|r| r.to_string()).unwrap_or_default(),
            "last_api_downtime_seconds": format!("{:.3}", api_downtime_seconds.unwrap_or_default()),
        }),
        Outcome::Failed { reason, .. } => json!({"last_failure_time": stamp, "last_failure_reason": reason}),
    };
    // a merge patch, not server-side apply: an apply of only this outcome's
    // keys would remove the keys the previous outcome set
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let cm_name = status_configmap(name);
    let what = format!("ConfigMap {namespace}/{cm_name}");
    let exists = api.get_opt(&cm_name).await.map_err(|e| format!("reading {what}: {e}"))?.is_some();
    if exists {
        api.patch(&cm_name, &PatchParams::default(), &Patch::Merge(json!({"data": data})))
            .await
            .map(|_| ())
            .map_err(|e| format!("updating {what}: {e}"))
    } else {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": cm_name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "hcp-dr", "hypershift.openshift.io/hosted-cluster": name}},
            "data": data,
        }))
        .map_err(|e| e.to_string())?;
        api.create(&PostParams::default(), &cm).await.map(|_| ()).map_err(|e| format!("creating {what}: {e}"))
    }
}

pub const METRICS: &[(&str, &str, &str)] = &[
    ("hcp_dr_backup_last_success_timestamp_seconds", "gauge", "Unix time of the last successful backup."),
    ("hcp_dr_backup_last_duration_seconds", "gauge", "Duration of the last backup run, successful or not."),
    ("hcp_dr_backup_last_api_downtime_seconds", "gauge", "API downtime of the last successful backup."),
    ("hcp_dr_backup_last_bytes", "gauge", "Bytes stored by the last successful backup."),
    ("hcp_dr_backup_failures_total", "counter", "Failed backups since the metrics file was created."),
    ("hcp_dr_backup_last_success", "gauge", "1 when the last backup succeeded, 0 when it failed."),
    ("hcp_dr_backup_last_copies_incomplete", "gauge", "Copy stores (--copy-to) the last successful backup is not complete in (0: every copy complete, or none asked)."),
];

/// One series per HostedCluster `backup --all` finds on the management
/// cluster (`namespace`, `hosted_cluster`, `selected`: whether its `-l`
/// selector took it): what the unprotected-cluster alert compares with the
/// clusters that have a good backup.
pub const DISCOVERED: (&str, &str, &str) = (
    "hcp_dr_hosted_cluster_discovered",
    "gauge",
    "1 for each HostedCluster backup --all found on the management cluster; selected=\"false\" when its selector left it out.",
);

/// A drill's series (`drill --metrics-file`, `--pushgateway`), per cluster:
/// what the drill-failed and drill-overdue alerts read. Pushed as the
/// cluster's group with `operation="drill"` (the backup's group is not
/// touched).
pub const DRILL_METRICS: &[(&str, &str, &str)] = &[
    ("hcp_dr_drill_last_success", "gauge", "1 when the last drill of the cluster's backup passed, 0 when it failed."),
    ("hcp_dr_drill_last_timestamp_seconds", "gauge", "Unix time the last drill finished, passed or not."),
    ("hcp_dr_drill_last_success_timestamp_seconds", "gauge", "Unix time the last passed drill finished."),
    ("hcp_dr_drill_last_rto_seconds", "gauge", "RTO of the last passed drill: its start to the drill cluster Available."),
    ("hcp_dr_drill_last_rpo_seconds", "gauge", "RPO of the last passed drill: the backup's age when it started."),
];

/// Whether `backup --all` could list the store at the end of its round
/// (`store` label: the store's URL), with the discovered clusters.
pub const STORE_REACHABLE: (&str, &str, &str) = (
    "hcp_dr_store_reachable",
    "gauge",
    "1 when backup --all could list the store at the end of its round, 0 when it could not.",
);

/// How a drill ended, for its series.
#[derive(Debug, Clone, Copy)]
pub struct DrillOutcome {
    pub passed: bool,
    pub rto_seconds: Option<f64>,
    pub rpo_seconds: Option<f64>,
}

/// A cluster's drill series after `outcome`, from their values before:
/// a failed drill keeps the last passed one's time, RTO and RPO.
pub fn next_drill_values(previous: &BTreeMap<String, f64>, outcome: &DrillOutcome, at: DateTime<Utc>) -> BTreeMap<String, f64> {
    let mut values = previous.clone();
    values.insert("hcp_dr_drill_last_success".into(), if outcome.passed { 1.0 } else { 0.0 });
    values.insert("hcp_dr_drill_last_timestamp_seconds".into(), at.timestamp() as f64);
    if outcome.passed {
        values.insert("hcp_dr_drill_last_success_timestamp_seconds".into(), at.timestamp() as f64);
        for (metric, value) in [("hcp_dr_drill_last_rto_seconds", outcome.rto_seconds), ("hcp_dr_drill_last_rpo_seconds", outcome.rpo_seconds)] {
            match value {
                Some(v) => values.insert(metric.into(), v),
                None => values.remove(metric),
            };
        }
    }
    values
}

/// A cluster `backup --all` found: namespace, name, selected.
pub type Discovered = (String, String, bool);

fn discovered_lines(clusters: &[Discovered]) -> BTreeMap<String, f64> {
    clusters
        .iter()
        .map(|(ns, name, selected)| (format!("{}{{namespace=\"{ns}\",hosted_cluster=\"{name}\",selected=\"{selected}\"}}", DISCOVERED.0), 1.0))
        .collect()
}

/// Read-modify-write of the metrics file: one at a time in this process
/// (the backups of `backup --all` run concurrently).
static METRICS_FILE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Write `series` (the known metrics only) to `path`, atomically.
fn write_series(path: &Path, series: &BTreeMap<String, f64>) -> Result<(), String> {
    let mut out = String::new();
    for (metric, kind, help) in METRICS.iter().chain(DRILL_METRICS).copied().chain([DISCOVERED, STORE_REACHABLE]) {
        out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} {kind}\n"));
        for (s, v) in series.iter().filter(|(s, _)| s.split('{').next() == Some(metric)) {
            out.push_str(&format!("{s} {v}\n"));
        }
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, out).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Replace the discovered clusters in the metrics file (the backups'
/// series are kept).
pub fn discovered_file(path: &Path, clusters: &[Discovered], store: &StoreProbe) -> Result<(), String> {
    let _one = METRICS_FILE.lock().unwrap_or_else(|e| e.into_inner());
    let mut series = std::fs::read_to_string(path).map(|t| read_series(&t)).unwrap_or_default();
    series.retain(|s, _| !matches!(s.split('{').next(), Some(metric) if metric == DISCOVERED.0 || metric == STORE_REACHABLE.0));
    series.extend(discovered_lines(clusters));
    series.insert(store.series(), store.value());
    write_series(path, &series)
}

/// Whether the store answered a listing, by URL.
#[derive(Debug, Clone)]
pub struct StoreProbe {
    pub url: String,
    pub reachable: bool,
}

impl StoreProbe {
    fn series(&self) -> String {
        format!("{}{{store=\"{}\"}}", STORE_REACHABLE.0, self.url.replace('\\', "\\\\").replace('"', "\\\""))
    }

    fn value(&self) -> f64 {
        if self.reachable { 1.0 } else { 0.0 }
    }
}

/// Push the discovered clusters as one group of the management cluster
/// (`URL/metrics/job/<job>/management_cluster/<id>[/<label>/<value>...]`;
/// every shard pushes the same list), replacing its earlier list.
pub async fn push_discovered(gateway: &Pushgateway, management_cluster: &str, clusters: &[Discovered], store: &StoreProbe) -> Result<(), String> {
    let group = gateway.url_of(&gateway.grouping_of(&[("management_cluster", management_cluster)]));
    let mut body = format!("# HELP {} {}\n# TYPE {} {}\n", DISCOVERED.0, DISCOVERED.2, DISCOVERED.0, DISCOVERED.1);
    for (series, value) in discovered_lines(clusters) {
        body.push_str(&format!("{series} {value}\n"));
    }
    body.push_str(&format!("# HELP {} {}\n# TYPE {} {}\n{} {}\n", STORE_REACHABLE.0, STORE_REACHABLE.2, STORE_REACHABLE.0, STORE_REACHABLE.1, store.series(), store.value()));
    gateway.put(&group, body).await
}

/// `name{labels} value` lines of a Prometheus text file, keyed by series.
fn read_series(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// One cluster's metric values (by metric name) after `outcome`, from
/// their values before (`previous`); `None` for a start (nothing changes).
pub fn next_values(previous: &BTreeMap<String, f64>, outcome: &Outcome, at: DateTime<Utc>) -> Option<BTreeMap<String, f64>> {
    let mut values = previous.clone();
    values.entry("hcp_dr_backup_failures_total".into()).or_insert(0.0);
    match outcome {
        Outcome::Started => return None,
        Outcome::Succeeded { api_downtime_seconds, bytes, seconds, copies_incomplete, .. } => {
            values.insert("hcp_dr_backup_last_copies_incomplete".into(), *copies_incomplete as f64);
            values.insert("hcp_dr_backup_last_success_timestamp_seconds".into(), at.timestamp() as f64);
            values.insert("hcp_dr_backup_last_duration_seconds".into(), *seconds);
            values.insert("hcp_dr_backup_last_api_downtime_seconds".into(), api_downtime_seconds.unwrap_or_default());
            values.insert("hcp_dr_backup_last_bytes".into(), *bytes as f64);
            values.insert("hcp_dr_backup_last_success".into(), 1.0);
        }
        Outcome::Failed { seconds, .. } => {
            *values.entry("hcp_dr_backup_failures_total".into()).or_insert(0.0) += 1.0;
            values.insert("hcp_dr_backup_last_duration_seconds".into(), *seconds);
            values.insert("hcp_dr_backup_last_success".into(), 0.0);
        }
    }
    Some(values)
}

/// Update the cluster's series in a textfile-collector file (other series,
/// e.g. other clusters', are kept), written atomically.
pub fn metrics_file(path: &Path, namespace: &str, name: &str, outcome: &Outcome, at: DateTime<Utc>) -> Result<(), String> {
    update_file(path, namespace, name, METRICS, |previous| next_values(previous, outcome, at))
}

/// As [`metrics_file`], for a drill's series.
pub fn drill_metrics_file(path: &Path, namespace: &str, name: &str, outcome: &DrillOutcome, at: DateTime<Utc>) -> Result<(), String> {
    update_file(path, namespace, name, DRILL_METRICS, |previous| Some(next_drill_values(previous, outcome, at)))
}

/// Read-modify-write of one cluster's `table` series in the file.
fn update_file(
    path: &Path,
    namespace: &str,
    name: &str,
    table: &[(&str, &str, &str)],
    next: impl FnOnce(&BTreeMap<String, f64>) -> Option<BTreeMap<String, f64>>,
) -> Result<(), String> {
    let _one = METRICS_FILE.lock().unwrap_or_else(|e| e.into_inner());
    let mut series = std::fs::read_to_string(path).map(|t| read_series(&t)).unwrap_or_default();
    let labels = format!("{{namespace=\"{namespace}\",hosted_cluster=\"{name}\"}}");
    let key = |metric: &str| format!("{metric}{labels}");
    let previous: BTreeMap<String, f64> = table
        .iter()
        .filter_map(|(metric, _, _)| series.get(&key(metric)).map(|v| (metric.to_string(), *v)))
        .collect();
    let Some(values) = next(&previous) else { return Ok(()) };
    for (metric, _, _) in table {
        series.remove(&key(metric));
    }
    for (metric, value) in values {
        series.insert(key(&metric), value);
    }
    write_series(path, &series)
}

/// Where to push the metrics (`--pushgateway`): the same metrics as the
/// textfile, one group per cluster at
/// `<url>/metrics/job/<job>/namespace/<ns>/hosted_cluster/<name>[/<label>/<value>...]`.
#[derive(Debug, Clone)]
pub struct Pushgateway {
    /// `http://host:port` or `https://host:port`, optionally with a path prefix.
    url: String,
    /// The `job` grouping label.
    job: String,
    /// Extra grouping labels.
    labels: Vec<(String, String)>,
    /// Extra CA certificates (PEM) to trust for https.
    ca_bundle: Option<std::path::PathBuf>,
    timeout: std::time::Duration,
}

/// The grouping labels hcp-dr sets itself.
const RESERVED_LABELS: [&str; 3] = ["job", "namespace", "hosted_cluster"];

fn valid_label_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

/// A path segment of a grouping label: plain when it is safe, else
/// `name@base64/<url-safe base64>` as the Pushgateway accepts.
fn label_segments(name: &str, value: &str) -> String {
    let plain = !value.is_empty()
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~'));
    if plain {
        format!("{name}/{value}")
    } else {
        use base64::Engine;
        let encoded = base64::engine::general_purpose::URL_SAFE.encode(value.as_bytes());
        format!("{name}@base64/{}", if encoded.is_empty() { "=".to_string() } else { encoded })
    }
}

impl Pushgateway {
    /// Check the URL (http or https, no credentials, no query) and the labels
    /// (`name=value`, names as Prometheus allows, not `job`, `namespace` or
    /// `hosted_cluster`, which hcp-dr sets).
    pub fn new(url: &str, job: &str, labels: &[String], ca_bundle: Option<std::path::PathBuf>) -> Result<Pushgateway, String> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| format!("--pushgateway `{url}` is not a URL ({e}): give http://host:9091 or https://host:9091"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(format!("--pushgateway `{url}`: use an http:// or https:// URL (e.g. http://pushgateway:9091)")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(format!("--pushgateway `{url}` names no host"));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err("--pushgateway: credentials in the URL are not supported (they would show in messages); put the Pushgateway behind a proxy that authenticates hcp-dr another way".into());
        }
        if uri.query().is_some() {
            return Err(format!("--pushgateway `{url}`: a query string is not supported; give the Pushgateway's base URL"));
        }
        if job.is_empty() {
            return Err("--pushgateway-job must not be empty".into());
        }
        let mut parsed = Vec::new();
        for label in labels {
            let (name, value) = label
                .split_once('=')
                .ok_or_else(|| format!("--pushgateway-label `{label}`: use NAME=VALUE (e.g. cluster=prod-east)"))?;
            if !valid_label_name(name) {
                return Err(format!("--pushgateway-label `{label}`: `{name}` is not a Prometheus label name (letters, digits and _, not starting with a digit or __)"));
            }
            if RESERVED_LABELS.contains(&name) {
                return Err(format!("--pushgateway-label `{label}`: hcp-dr sets `{name}` itself (use --pushgateway-job for the job)"));
            }
            if value.is_empty() {
                return Err(format!("--pushgateway-label `{label}`: the value is empty"));
            }
            parsed.push((name.to_string(), value.to_string()));
        }
        Ok(Pushgateway {
            url: url.trim_end_matches('/').to_string(),
            job: job.to_string(),
            labels: parsed,
            ca_bundle,
            timeout: std::time::Duration::from_secs(10),
        })
    }

    /// Every grouping label of a group identified by `own` (after `job`,
    /// before the extra labels), in path order.
    fn grouping_of(&self, own: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut out = vec![("job".to_string(), self.job.clone())];
        out.extend(own.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        out.extend(self.labels.iter().cloned());
        out
    }

    /// Every grouping label of a cluster's group, in path order.
    fn grouping(&self, namespace: &str, name: &str) -> Vec<(String, String)> {
        self.grouping_of(&[("namespace", namespace), ("hosted_cluster", name)])
    }

    /// The URL of the group with these grouping labels.
    fn url_of(&self, grouping: &[(String, String)]) -> String {
        let path: Vec<String> = grouping.iter().map(|(k, v)| label_segments(k, v)).collect();
        format!("{}/metrics/{}", self.url, path.join("/"))
    }

    /// The URL of a cluster's group.
    pub fn group_url(&self, namespace: &str, name: &str) -> String {
        self.url_of(&self.grouping(namespace, name))
    }

    /// The values of `table` the group with exactly these grouping labels
    /// holds now (`GET /metrics`), and a note (ending in `consequence`)
    /// when they could not be read.
    async fn read_back(&self, grouping: &[(String, String)], table: &[(&str, &str, &str)], consequence: &str) -> (BTreeMap<String, f64>, Vec<String>) {
        let mut previous = BTreeMap::new();
        let url = format!("{}/metrics", self.url);
        match self.request(hyper::Method::GET, &url, String::new()).await {
            Ok((status, text)) if status.is_success() => {
                for (metric, labels, value) in text.lines().filter_map(parse_sample) {
                    let ours = table.iter().any(|(m, _, _)| *m == metric) && grouping.iter().all(|(k, v)| labels.get(k) == Some(v));
                    if ours {
                        previous.insert(metric, value);
                    }
                }
                (previous, Vec::new())
            }
            Ok((status, _)) => (previous, vec![format!("the Pushgateway's earlier values could not be read (GET {url}: HTTP {status}); {consequence}")]),
            Err(e) => (previous, vec![format!("the Pushgateway's earlier values could not be read ({e}); {consequence}")]),
        }
    }

    /// Replace the group at `group` with `body` (`PUT`).
    async fn put(&self, group: &str, body: String) -> Result<(), String> {
        let (status, answer) = self.request(hyper::Method::PUT, group, body).await?;
        if !status.is_success() {
            return Err(format!("PUT {group}: HTTP {status}: {}", answer.trim().chars().take(300).collect::<String>()));
        }
        Ok(())
    }

    async fn request(&self, method: hyper::Method, url: &str, body: String) -> Result<(hyper::StatusCode, String), String> {
        use http_body_util::{BodyExt, Full};
        let client = http_client(self.ca_bundle.as_deref())?;
        let request = hyper::Request::builder()
            .method(method.clone())
            .uri(url)
            .header(hyper::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(bytes::Bytes::from(body)))
            .map_err(|e| format!("{method} {url}: {e}"))?;
        let exchange = async {
            let response = client.request(request).await.map_err(|e| format!("{method} {url}: {}", error_chain(&e)))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("{method} {url}: reading the answer: {e}"))?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).to_string()))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("{method} {url}: no answer within {}s", self.timeout.as_secs()))?
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    out
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
>;

/// An HTTP/1 client for http and https (rustls; the platform's roots plus
/// the PEM certificates in `ca_bundle`).
fn http_client(ca_bundle: Option<&Path>) -> Result<HttpClient, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_bundle {
        let pem = std::fs::read(path).map_err(|e| format!("CA bundle {}: {e}", path.display()))?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("CA bundle {}: {e}", path.display()))?;
            roots.add(cert).map_err(|e| format!("CA bundle {}: {e}", path.display()))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector))
}

/// The Prometheus text format of one group's values (no labels: the
/// Pushgateway adds the grouping labels).
fn exposition(table: &[(&str, &str, &str)], values: &BTreeMap<String, f64>) -> String {
    let mut out = String::new();
    for (metric, kind, help) in table {
        if let Some(value) = values.get(*metric) {
            out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} {kind}\n{metric} {value}\n"));
        }
    }
    out
}

/// `name{labels} value` of a text exposition, split into the name, the
/// labels and the value (`None` for comments and lines it cannot read).
fn parse_sample(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest;
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '}' => {
                    end = Some(i + 1);
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next().map(|(_, q)| q) != Some('"') {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()? {
                            (_, '\\') => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            (_, '"') => break,
                            (_, other) => value.push(other),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                other => key.push(other),
            }
        }
        rest = &inner[end?..];
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name.to_string(), labels, value))
}

/// Push a backup's outcome to the Pushgateway: the group's earlier values
/// are read back (`GET /metrics`) so the failure counter goes on counting,
/// then the whole group is replaced (`PUT`). Returns notes worth a warning
/// (the earlier values could not be read); `Err` when the push failed.
pub async fn push(gateway: &Pushgateway, namespace: &str, name: &str, outcome: &Outcome, at: DateTime<Utc>) -> Result<Vec<String>, String> {
    if matches!(outcome, Outcome::Started) {
        return Ok(Vec::new());
    }
    let grouping = gateway.grouping(namespace, name);
    push_group(gateway, &grouping, METRICS, "hcp_dr_backup_failures_total restarts from this run", |previous| next_values(previous, outcome, at)).await
}

/// Push a drill's outcome as the cluster's `operation="drill"` group (its
/// earlier values read back first, so a failed drill keeps the last passed
/// one's time). Returns notes worth a warning; `Err` when the push failed.
pub async fn push_drill(gateway: &Pushgateway, namespace: &str, name: &str, outcome: &DrillOutcome, at: DateTime<Utc>) -> Result<Vec<String>, String> {
    let grouping = gateway.grouping_of(&[("namespace", namespace), ("hosted_cluster", name), ("operation", "drill")]);
    push_group(gateway, &grouping, DRILL_METRICS, "the last passed drill's time is not known to this push", |previous| Some(next_drill_values(previous, outcome, at))).await
}

/// Read the group's `table` values back, compute the next ones (`None`:
/// nothing to push) and replace the group with them; the notes say what
/// could not be read back.
async fn push_group(
    gateway: &Pushgateway,
    grouping: &[(String, String)],
    table: &[(&str, &str, &str)],
    if_unread: &str,
    next: impl FnOnce(&BTreeMap<String, f64>) -> Option<BTreeMap<String, f64>>,
) -> Result<Vec<String>, String> {
    let (previous, notes) = gateway.read_back(grouping, table, if_unread).await;
    let Some(values) = next(&previous) else { return Ok(notes) };
    let group = gateway.url_of(grouping);
    gateway.put(&group, exposition(table, &values)).await?;
    tracing::info!(group = %group, "metrics pushed to the Pushgateway");
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_accumulate_per_cluster_and_keep_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hcp_dr.prom");
        let at = DateTime::parse_from_rfc3339("2026-11-21T12:00:00Z").unwrap().with_timezone(&Utc);
        let ok = Outcome::Succeeded { backup: "x".into(), revision: Some(7), api_downtime_seconds: Some(2.5), bytes: 1024, seconds: 9.0, copies_incomplete: 0 };
        let failed = Outcome::Failed { reason: "boom".into(), seconds: 3.0 };
        metrics_file(&path, "clusters", "a", &ok, at).unwrap();
        metrics_file(&path, "clusters", "b", &failed, at).unwrap();
        metrics_file(&path, "clusters", "b", &failed, at).unwrap();
        let series = read_series(&std::fs::read_to_string(&path).unwrap());
        assert_eq!(series["hcp_dr_backup_last_success_timestamp_seconds{namespace=\"clusters\",hosted_cluster=\"a\"}"], at.timestamp() as f64);
        assert_eq!(series["hcp_dr_backup_last_bytes{namespace=\"clusters\",hosted_cluster=\"a\"}"], 1024.0);
        assert_eq!(series["hcp_dr_backup_failures_total{namespace=\"clusters\",hosted_cluster=\"a\"}"], 0.0);
        assert_eq!(series["hcp_dr_backup_failures_total{namespace=\"clusters\",hosted_cluster=\"b\"}"], 2.0);
        assert_eq!(series["hcp_dr_backup_last_success{namespace=\"clusters\",hosted_cluster=\"b\"}"], 0.0);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("# TYPE hcp_dr_backup_failures_total counter"));
    }

    /// A Pushgateway stand-in on 127.0.0.1:0: records every request
    /// (method, path, body) and answers `GET /metrics` with `metrics`.
    async fn fake_gateway(metrics: &'static str, put_status: u16) -> (String, std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut data = Vec::new();
                let mut buf = [0u8; 4096];
                let (head, body) = loop {
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break (String::new(), Vec::new());
                    }
                    data.extend_from_slice(&buf[..n]);
                    if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&data[..end]).to_string();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                            .unwrap_or(0);
                        while data.len() < end + 4 + length {
                            let n = conn.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                break;
                            }
                            data.extend_from_slice(&buf[..n]);
                        }
                        break (head, data[end + 4..].to_vec());
                    }
                };
                let mut first = head.lines().next().unwrap_or_default().split(' ');
                let (method, path) = (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
                let (status, answer) = if method == "GET" { (200, metrics) } else { (put_status, "") };
                record.lock().unwrap().push((method, path, String::from_utf8_lossy(&body).to_string()));
                let reply = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}", answer.len());
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        (url, seen)
    }

    fn pushed(body: &str) -> BTreeMap<String, f64> {
        body.lines().filter_map(parse_sample).map(|(m, labels, v)| {
            assert!(labels.is_empty(), "pushed series carry labels: {body}");
            (m, v)
        }).collect()
    }

    #[tokio::test]
    async fn pushes_the_same_metrics_and_keeps_counting_failures() {
        // the group's earlier values, as the Pushgateway shows them: other
        // label order, `instance`, another cluster's series, and its own metrics
        const EARLIER: &str = "# TYPE hcp_dr_backup_failures_total counter\n\
            hcp_dr_backup_failures_total{hosted_cluster=\"demo\",instance=\"\",job=\"hcp-dr\",namespace=\"clusters\",site=\"east/1\"} 2\n\
            hcp_dr_backup_failures_total{hosted_cluster=\"other\",instance=\"\",job=\"hcp-dr\",namespace=\"clusters\",site=\"east/1\"} 9\n\
            hcp_dr_backup_last_success_timestamp_seconds{hosted_cluster=\"demo\",instance=\"\",job=\"hcp-dr\",namespace=\"clusters\",site=\"east/1\"} 1.7e+09\n\
            push_time_seconds{hosted_cluster=\"demo\",instance=\"\",job=\"hcp-dr\",namespace=\"clusters\",site=\"east/1\"} 1.7e+09\n";
        let (url, seen) = fake_gateway(EARLIER, 200).await;
        let gateway = Pushgateway::new(&url, "hcp-dr", &["site=east/1".into()], None).unwrap();
        let at = DateTime::parse_from_rfc3339("2026-11-21T12:00:00Z").unwrap().with_timezone(&Utc);
        let failed = Outcome::Failed { reason: "boom".into(), seconds: 3.5 };
        assert!(push(&gateway, "clusters", "demo", &Outcome::Started, at).await.unwrap().is_empty());
        assert!(seen.lock().unwrap().is_empty(), "a start pushed something");
        let notes = push(&gateway, "clusters", "demo", &failed, at).await.unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 2, "{requests:?}");
        assert_eq!((requests[0].0.as_str(), requests[0].1.as_str()), ("GET", "/metrics"));
        let (method, path, body) = &requests[1];
        assert_eq!(method, "PUT");
        assert_eq!(path, "/metrics/job/hcp-dr/namespace/clusters/hosted_cluster/demo/site@base64/ZWFzdC8x");
        assert!(body.contains("# TYPE hcp_dr_backup_failures_total counter\n"), "{body}");
        let values = pushed(body);
        assert_eq!(values["hcp_dr_backup_failures_total"], 3.0, "{body}");
        assert_eq!(values["hcp_dr_backup_last_success"], 0.0);
        assert_eq!(values["hcp_dr_backup_last_duration_seconds"], 3.5);
        assert_eq!(values["hcp_dr_backup_last_success_timestamp_seconds"], 1.7e9, "the last success is kept");

        seen.lock().unwrap().clear();
        let ok = Outcome::Succeeded { backup: "x".into(), revision: Some(7), api_downtime_seconds: Some(2.5), bytes: 1024, seconds: 9.0, copies_incomplete: 0 };
        push(&gateway, "clusters", "demo", &ok, at).await.unwrap();
        let requests = seen.lock().unwrap().clone();
        let values = pushed(&requests[1].2);
        let expected: BTreeMap<String, f64> = [
            ("hcp_dr_backup_last_success_timestamp_seconds", at.timestamp() as f64),
            ("hcp_dr_backup_last_duration_seconds", 9.0),
            ("hcp_dr_backup_last_api_downtime_seconds", 2.5),
            ("hcp_dr_backup_last_bytes", 1024.0),
            ("hcp_dr_backup_failures_total", 2.0),
            ("hcp_dr_backup_last_success", 1.0),
            ("hcp_dr_backup_last_copies_incomplete", 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(values, expected);
    }

    #[tokio::test]
    async fn the_discovered_clusters_are_one_group_per_management_cluster() {
        let (url, seen) = fake_gateway("", 200).await;
        let gateway = Pushgateway::new(&url, "nightly", &["site=east/1".to_string()], None).unwrap();
        let clusters = vec![("clusters".to_string(), "a".to_string(), true), ("clusters".to_string(), "b".to_string(), false)];
        let store = StoreProbe { url: "s3://bucket/hcp".into(), reachable: false };
        push_discovered(&gateway, "uid-1", &clusters, &store).await.unwrap();
        let seen = seen.lock().unwrap();
        let (method, path, body) = seen.last().unwrap().clone();
        assert_eq!(method, "PUT");
        assert_eq!(path, "/metrics/job/nightly/management_cluster/uid-1/site@base64/ZWFzdC8x");
        assert!(body.contains("hcp_dr_hosted_cluster_discovered{namespace=\"clusters\",hosted_cluster=\"a\",selected=\"true\"} 1\n"), "{body}");
        assert!(body.contains("hcp_dr_hosted_cluster_discovered{namespace=\"clusters\",hosted_cluster=\"b\",selected=\"false\"} 1\n"), "{body}");
        assert!(body.contains("# TYPE hcp_dr_store_reachable gauge\nhcp_dr_store_reachable{store=\"s3://bucket/hcp\"} 0\n"), "{body}");
        // the file keeps the backups' series and replaces the list
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.prom");
        let at = Utc::now();
        metrics_file(&path, "clusters", "a", &Outcome::Succeeded { backup: "b1".into(), revision: Some(1), seconds: 2.0, api_downtime_seconds: None, bytes: 10, copies_incomplete: 1 }, at).unwrap();
        discovered_file(&path, &clusters, &store).unwrap();
        let reachable = StoreProbe { reachable: true, ..store };
        discovered_file(&path, &clusters[..1], &reachable).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("hcp_dr_backup_last_success{namespace=\"clusters\",hosted_cluster=\"a\"} 1"), "{text}");
        assert!(text.contains("hosted_cluster=\"a\",selected=\"true\"} 1") && !text.contains("hosted_cluster=\"b\""), "{text}");
        assert!(text.contains("hcp_dr_store_reachable{store=\"s3://bucket/hcp\"} 1\n") && !text.contains("store=\"s3://bucket/hcp\"} 0"), "{text}");
        metrics_file(&path, "clusters", "a", &Outcome::Failed { reason: "x".into(), seconds: 1.0 }, at).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("selected=\"true\"} 1"), "a backup's write dropped the discovered clusters");
    }

    #[tokio::test]
    async fn a_drill_is_its_own_group_and_a_failure_keeps_the_last_pass() {
        let earlier = "hcp_dr_drill_last_success_timestamp_seconds{job=\"hcp-dr\",namespace=\"clusters\",hosted_cluster=\"demo\",operation=\"drill\"} 1700000000\n\
                       hcp_dr_drill_last_rto_seconds{job=\"hcp-dr\",namespace=\"clusters\",hosted_cluster=\"demo\",operation=\"drill\"} 80\n\
                       hcp_dr_drill_last_rto_seconds{job=\"hcp-dr\",namespace=\"clusters\",hosted_cluster=\"other\",operation=\"drill\"} 999\n";
        let (url, seen) = fake_gateway(earlier, 200).await;
        let gateway = Pushgateway::new(&url, "hcp-dr", &[], None).unwrap();
        let at = DateTime::parse_from_rfc3339("2026-11-29T12:00:00Z").unwrap().with_timezone(&Utc);
        let failed = DrillOutcome { passed: false, rto_seconds: None, rpo_seconds: None };
        push_drill(&gateway, "clusters", "demo", &failed, at).await.unwrap();
        let (method, path, body) = seen.lock().unwrap().last().unwrap().clone();
        assert_eq!((method.as_str(), path.as_str()), ("PUT", "/metrics/job/hcp-dr/namespace/clusters/hosted_cluster/demo/operation/drill"));
        for line in [
            "hcp_dr_drill_last_success 0\n",
            &format!("hcp_dr_drill_last_timestamp_seconds {}\n", at.timestamp()),
            "hcp_dr_drill_last_success_timestamp_seconds 1700000000\n",
            "hcp_dr_drill_last_rto_seconds 80\n",
        ] {
            assert!(body.contains(line), "{line}: {body}");
        }
        // the file: a pass sets everything, a failure keeps the pass
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.prom");
        let passed = DrillOutcome { passed: true, rto_seconds: Some(61.0), rpo_seconds: Some(300.0) };
        drill_metrics_file(&path, "clusters", "demo", &passed, at).unwrap();
        drill_metrics_file(&path, "clusters", "demo", &failed, at + chrono::Duration::hours(1)).unwrap();
        let series = read_series(&std::fs::read_to_string(&path).unwrap());
        let of = |m: &str| series[&format!("{m}{{namespace=\"clusters\",hosted_cluster=\"demo\"}}")];
        assert_eq!(of("hcp_dr_drill_last_success"), 0.0);
        assert_eq!(of("hcp_dr_drill_last_success_timestamp_seconds"), at.timestamp() as f64);
        assert_eq!(of("hcp_dr_drill_last_timestamp_seconds"), (at.timestamp() + 3600) as f64);
        assert_eq!((of("hcp_dr_drill_last_rto_seconds"), of("hcp_dr_drill_last_rpo_seconds")), (61.0, 300.0));
    }

    #[tokio::test]
    async fn a_refused_or_unreachable_push_is_an_error_for_a_warning() {
        let (url, _) = fake_gateway("", 400).await;
        let gateway = Pushgateway::new(&url, "nightly", &[], None).unwrap();
        assert_eq!(gateway.group_url("clusters", "demo"), format!("{url}/metrics/job/nightly/namespace/clusters/hosted_cluster/demo"));
        let at = Utc::now();
        let failed = Outcome::Failed { reason: "boom".into(), seconds: 1.0 };
        let err = push(&gateway, "clusters", "demo", &failed, at).await.unwrap_err();
        assert!(err.contains("HTTP 400"), "{err}");
        // nothing listens there any more
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let gateway = Pushgateway::new(&closed, "hcp-dr", &[], None).unwrap();
        let err = push(&gateway, "clusters", "demo", &failed, at).await.unwrap_err();
        assert!(err.starts_with(&format!("PUT {closed}/metrics/job/hcp-dr")), "{err}");
    }

    #[test]
    fn pushgateway_input_is_checked() {
        for (url, labels, expect) in [
            ("ftp://gw:9091", vec![], "http:// or https://"),
            ("http://user:pw@gw:9091", vec![], "credentials"),
            ("http://gw:9091", vec!["nolabel".to_string()], "NAME=VALUE"),
            ("http://gw:9091", vec!["9x=a".to_string()], "not a Prometheus label name"),
            ("http://gw:9091", vec!["namespace=a".to_string()], "sets `namespace` itself"),
            ("not a url at all", vec![], "not a URL"),
        ] {
            let err = Pushgateway::new(url, "hcp-dr", &labels, None).unwrap_err();
            assert!(err.contains(expect), "{url} {labels:?}: {err}");
        }
        assert!(Pushgateway::new("https://gw.example:9091/prefix/", "hcp-dr", &["site=a".into()], None).is_ok());
    }

    #[test]
    fn a_ca_bundle_is_read_as_pem_certificates() {
        const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBcDCCARWgAwIBAgIUPgz5ttP7RZeNvYx4YeRKa8sffKkwCgYIKoZIzj0EAwIw
DDEKMAgGA1UEAwwBdDAgFw0yNjExMjQxNzU5MDBaGA8yMTI2MTAzMTE3NTkwMFow
DDEKMAgGA1UEAwwBdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABAgCIKCWCKDu
n/8UpRYfIcOtqiMMjYCH9g70sMGvFLEBBs871lLOr1+sPGfKjxvBNC7tbzpk+Edy
VgQ48aU+ndSjUzBRMB0GA1UdDgQWBBRSG4tWq0yMNCGi5kpiaLtTZ39rFDAfBgNV
HSMEGDAWgBRSG4tWq0yMNCGi5kpiaLtTZ39rFDAPBgNVHRMBAf8EBTADAQH/MAoG
CCqGSM49BAMCA0kAMEYCIQD706VSgkOlOBiv/gyItgieYbkA4Z8XdRJ4p8tDH+CJ
twIhAMHTu/AAVB5xm2ghU0ZtSby+3mJRpPZ5CZkyNnDmKhn/
-----END CERTIFICATE-----
";
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.pem");
        std::fs::write(&good, format!("some text\n{CERT}{CERT}")).unwrap();
        assert!(http_client(Some(&good)).is_ok());
        let cut = dir.path().join("cut.pem");
        std::fs::write(&cut, &CERT[..200]).unwrap();
        let err = http_client(Some(&cut)).err().unwrap();
        assert!(err.starts_with(&format!("CA bundle {}: ", cut.display())), "{err}");
        assert!(http_client(Some(&dir.path().join("missing.pem"))).err().unwrap().starts_with("CA bundle "));
    }
}
