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

const METRICS: &[(&str, &str, &str)] = &[
    ("hcp_dr_backup_last_success_timestamp_seconds", "gauge", "Unix time of the last successful backup."),
    ("hcp_dr_backup_last_duration_seconds", "gauge", "Duration of the last backup run, successful or not."),
    ("hcp_dr_backup_last_api_downtime_seconds", "gauge", "API downtime of the last successful backup."),
    ("hcp_dr_backup_last_bytes", "gauge", "Bytes stored by the last successful backup."),
    ("hcp_dr_backup_failures_total", "counter", "Failed backups since the metrics file was created."),
    ("hcp_dr_backup_last_success", "gauge", "1 when the last backup succeeded, 0 when it failed."),
];

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

/// Update the cluster's series in a textfile-collector file (other series,
/// e.g. other clusters', are kept), written atomically.
pub fn metrics_file(path: &Path, namespace: &str, name: &str, outcome: &Outcome, at: DateTime<Utc>) -> Result<(), String> {
    let mut series = std::fs::read_to_string(path).map(|t| read_series(&t)).unwrap_or_default();
    let labels = format!("{{namespace=\"{namespace}\",hosted_cluster=\"{name}\"}}");
    let key = |metric: &str| format!("{metric}{labels}");
    series.entry(key("hcp_dr_backup_failures_total")).or_insert(0.0);
    match outcome {
        Outcome::Started => return Ok(()),
        Outcome::Succeeded { api_downtime_seconds, bytes, seconds, .. } => {
            series.insert(key("hcp_dr_backup_last_success_timestamp_seconds"), at.timestamp() as f64);
            series.insert(key("hcp_dr_backup_last_duration_seconds"), *seconds);
            series.insert(key("hcp_dr_backup_last_api_downtime_seconds"), api_downtime_seconds.unwrap_or_default());
            series.insert(key("hcp_dr_backup_last_bytes"), *bytes as f64);
            series.insert(key("hcp_dr_backup_last_success"), 1.0);
        }
        Outcome::Failed { seconds, .. } => {
            *series.entry(key("hcp_dr_backup_failures_total")).or_insert(0.0) += 1.0;
            series.insert(key("hcp_dr_backup_last_duration_seconds"), *seconds);
            series.insert(key("hcp_dr_backup_last_success"), 0.0);
        }
    }
    let mut out = String::new();
    for (metric, kind, help) in METRICS {
        out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} {kind}\n"));
        for (s, v) in series.iter().filter(|(s, _)| s.split('{').next() == Some(*metric)) {
            out.push_str(&format!("{s} {v}\n"));
        }
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, out).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_accumulate_per_cluster_and_keep_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hcp_dr.prom");
        let at = DateTime::parse_from_rfc3339("2026-11-21T12:00:00Z").unwrap().with_timezone(&Utc);
        let ok = Outcome::Succeeded { backup: "x".into(), revision: Some(7), api_downtime_seconds: Some(2.5), bytes: 1024, seconds: 9.0 };
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
}
