//! Monitoring as code for `hcp-dr schedule render --monitoring`: a
//! PrometheusRule (prometheus-operator's `monitoring.coreos.com/v1`) whose
//! alerts read the series each scheduled backup pushes to the Pushgateway
//! ([`crate::ops::signals`]), and a Grafana dashboard in a ConfigMap labelled
//! `grafana_dashboard: "1"` for the dashboard sidecar.
//!
//! Every alert names the cluster in its summary and links its runbook. The
//! stale threshold is a multiple of the longest gap between two runs of the
//! CronJob's schedule, so a 6-hourly schedule alerts after 12 h without a
//! good backup (two missed runs), an hourly one after 2 h.

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Value, json};

use super::OpsError;

/// The alerts' names, in the order they are rendered.
pub const ALERTS: [&str; 9] = [
    "HcpDrBackupFailing",
    "HcpDrBackupStale",
    "HcpDrClusterNeverBackedUp",
    "HcpDrClusterUnprotected",
    "HcpDrNoBackupReports",
    "HcpDrDrillFailed",
    "HcpDrDrillOverdue",
    "HcpDrStoreUnreachable",
    "HcpDrBackupCopyIncomplete",
];

/// The continuous backup's alerts (`--monitoring` with `--continuous`), in
/// the order they are rendered. They read what each stream pod serves on
/// /metrics (scraped directly, not through the Pushgateway).
pub const STREAM_ALERTS: [&str; 2] = ["HcpDrStreamLagging", "HcpDrStreamChainBroken"];

/// The stream is lagging past this many seconds ...
pub const STREAM_LAG_SECONDS: u64 = 60;
/// ... for this long.
pub const STREAM_LAG_FOR: &str = "5m";

/// What `--monitoring` was asked (the schedule and namespace are the
/// CronJob's).
#[derive(Debug, Clone)]
pub struct Monitoring {
    /// Alert when the newest good backup is older than this many of the
    /// schedule's longest gaps.
    pub stale_after: f64,
    /// Alert when a cluster's last passed drill is older than this.
    pub drill_every: std::time::Duration,
    /// Where `docs/runbooks` is published: each alert links a page there.
    pub runbook_base: String,
}

impl Monitoring {
    /// Refuse thresholds that make no sense and a base that is no URL.
    pub fn check(&self) -> Result<(), OpsError> {
        if !(self.stale_after.is_finite() && self.stale_after >= 1.0 && self.stale_after <= 100.0) {
            return Err(OpsError::Input(format!(
                "--stale-after {}: a backup is stale after 1 to 100 of the schedule's intervals (e.g. 2: two missed runs)",
                self.stale_after
            )));
        }
        let base = self.runbook_base.parse::<http::Uri>().ok().filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some());
        if base.is_none() {
            return Err(OpsError::Input(format!(
                "--runbook-base `{}`: give the http(s) URL where this project's docs/runbooks are published",
                self.runbook_base
            )));
        }
        Ok(())
    }
}

/// Five-field form of a CronJob macro.
fn expand_macro(schedule: &str) -> &str {
    match schedule.trim() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        other => other,
    }
}

/// The longest gap, in seconds, between two consecutive runs of `schedule`
/// over a year of its runs (a monthly schedule's longest month, a weekday
/// schedule's weekend), from a fixed start so the result never depends on
/// today. At most 20,000 runs are stepped through: a schedule that runs
/// more often than that in a year (every few minutes) has its longest gap
/// within the runs stepped.
pub fn longest_gap_seconds(schedule: &str) -> Result<i64, OpsError> {
    let text = expand_macro(schedule);
    let start: DateTime<Utc> = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).single().expect("a valid date");
    let end = start + chrono::Duration::days(366);
    let bad = |e: cron_parser::ParseError| OpsError::Input(format!("--schedule `{schedule}`: {e:?}"));
    let mut previous = cron_parser::parse(text, &start).map_err(bad)?;
    let mut longest = 0i64;
    for _ in 0..20_000 {
        let next = cron_parser::parse(text, &previous).map_err(bad)?;
        longest = longest.max((next - previous).num_seconds());
        previous = next;
        if previous > end {
            break;
        }
    }
    Ok(longest)
}

/// An alert; its runbook is the section of `docs/runbooks/<page>` headed
/// with its name (backup.md, or drill.md for the drill's alerts).
fn alert(base: &str, name: &str, expr: String, for_: &str, severity: &str, summary: &str, description: &str) -> Value {
    let page = if name.starts_with("HcpDrDrill") {
        "drill.md"
    } else if name.starts_with("HcpDrStream") {
        "stream.md"
    } else {
        "backup.md"
    };
    let runbook = format!("{base}/{page}#{}", name.to_lowercase());
    json!({
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, "app_kubernetes_io_name": "hcp-dr"},
        "annotations": {"summary": summary, "description": description, "runbook_url": runbook},
    })
}

/// The rule group for the CronJob's `schedule` (what goes under
/// `spec.groups` of the PrometheusRule and what `promtool check rules`
/// reads under `groups`).
pub fn rule_groups(m: &Monitoring, schedule: &str) -> Result<Value, OpsError> {
    m.check()?;
    let gap = longest_gap_seconds(schedule)?;
    let stale = (gap as f64 * m.stale_after).round() as i64;
    // How long a condition must hold before it fires: a few minutes, but
    // never more than one interval of a schedule that runs more often.
    let hold = |seconds: i64| format!("{}s", seconds.min(gap).max(1));
    let base = m.runbook_base.trim_end_matches('/');
    let cluster = "{{ $labels.namespace }}/{{ $labels.hosted_cluster }}";
    let by = "max by (namespace, hosted_cluster)";
    // The clusters that still exist: those `backup --all` found on a
    // management cluster in its last round. A deleted cluster's group stays
    // on the Pushgateway, so without this it would alert stale forever.
    // Where no discovery is pushed at all (single-cluster schedules), every
    // cluster with backup series counts.
    let known = format!(
        "on (namespace, hosted_cluster) ({by} (hcp_dr_hosted_cluster_discovered) or ({by} (hcp_dr_backup_last_success) unless on () group(hcp_dr_hosted_cluster_discovered)))"
    );
    let drill_every = m.drill_every.as_secs();
    let drill_every_text = crate::duration::show(m.drill_every);
    let rules = vec![
        alert(
            base,
            "HcpDrBackupFailing",
            format!("{by} (hcp_dr_backup_last_success) == 0 and {known}"),
            &hold(300),
            "warning",
            &format!("The last backup of hosted cluster {cluster} failed"),
            &format!("hcp-dr's last scheduled backup of {cluster} failed; the newest good backup is getting older. The failed run undid itself: read the CronJob's pod log (its JSON report names the stage and the error)."),
        ),
        alert(
            base,
            "HcpDrBackupStale",
            format!("(time() - {by} (hcp_dr_backup_last_success_timestamp_seconds) > {stale}) and {known}"),
            &hold(600.min(gap / 2)),
            "critical",
            &format!("No good backup of hosted cluster {cluster} for more than {}", humantime::format_duration(std::time::Duration::from_secs(stale.max(0) as u64))),
            &format!("The newest successful backup of {cluster} is older than {stale} s ({} times the longest gap of the schedule `{}`): a restore now would lose everything written since. Check the CronJob's last runs and the store.", m.stale_after, schedule),
        ),
        alert(
            base,
            "HcpDrClusterNeverBackedUp",
            format!("({by} (hcp_dr_backup_failures_total) > 0 unless on (namespace, hosted_cluster) {by} (hcp_dr_backup_last_success_timestamp_seconds)) and {known}"),
            &hold(300),
            "critical",
            &format!("Hosted cluster {cluster} has never been backed up"),
            &format!("Every backup of {cluster} hcp-dr reported has failed: there is no backup to restore it from."),
        ),
        alert(
            base,
            "HcpDrClusterUnprotected",
            format!("max by (namespace, hosted_cluster, selected) (hcp_dr_hosted_cluster_discovered) unless on (namespace, hosted_cluster) {by} (hcp_dr_backup_last_success_timestamp_seconds)"),
            &format!("{stale}s"),
            "critical",
            &format!("Hosted cluster {cluster} exists on the management cluster and has no backup"),
            &format!("backup --all found {cluster} (selected by its selector: {{{{ $labels.selected }}}}) and no good backup of it was reported for {stale} s: no backup covers it. A cluster its selector leaves out needs the label, or a schedule of its own."),
        ),
        alert(
            base,
            "HcpDrNoBackupReports",
            "absent(hcp_dr_backup_last_success)".to_string(),
            &format!("{}s", gap * 2),
            "warning",
            "No hcp-dr backup has reported for two scheduled intervals",
            &format!("Prometheus sees no hcp_dr_backup_last_success series: the backup CronJob has not run, cannot reach the Pushgateway, or the Pushgateway lost its groups. Schedule `{schedule}`."),
        ),
        alert(
            base,
            "HcpDrDrillFailed",
            format!("{by} (hcp_dr_drill_last_success) == 0"),
            "1m",
            "warning",
            &format!("The last restore drill of hosted cluster {cluster} failed"),
            &format!("hcp-dr drill could not restore {cluster}'s backup on the staging cluster, or a check failed: its backups may not restore. Its result record (hcp-dr report) and the drill's report name the stage or check."),
        ),
        alert(
            base,
            "HcpDrDrillOverdue",
            format!(
                "((time() - {by} (hcp_dr_drill_last_success_timestamp_seconds) > {drill_every}) or ({by} (hcp_dr_backup_last_success_timestamp_seconds) unless on (namespace, hosted_cluster) {by} (hcp_dr_drill_last_success_timestamp_seconds))) and {known}"
            ),
            "1h",
            "warning",
            &format!("Hosted cluster {cluster} has had no passed restore drill for more than {drill_every_text}"),
            &format!("No hcp-dr drill of {cluster} has passed within {drill_every_text} (or ever, while it has backups): nothing proves its backups still restore. Drills report with hcp-dr drill --pushgateway."),
        ),
        alert(
            base,
            "HcpDrStoreUnreachable",
            "max by (store) (hcp_dr_store_reachable) == 0".to_string(),
            &hold(300),
            "critical",
            "The backup store {{ $labels.store }} cannot be listed",
            "backup --all could not list the store at the end of its round: backups cannot be written or restored from it. Check the endpoint, the credentials Secret and the bucket policy.",
        ),
        alert(
            base,
            "HcpDrBackupCopyIncomplete",
            format!("{by} (hcp_dr_backup_last_copies_incomplete) > 0 and {known}"),
            &hold(300),
            "warning",
            &format!("The last backup of hosted cluster {cluster} is missing from {{{{ $value }}}} copy store(s)"),
            &format!("The last backup of {cluster} completed in its store but not in every --copy-to store (--copy-optional let it go on): the off-site copy is behind. The backup's report names the copy and why; hcp-dr backups copy completes it."),
        ),
    ];
    Ok(json!([{"name": "hcp-dr", "rules": rules}]))
}

/// The continuous backup's rule group: a stream lagging (nothing durable
/// for a minute, for five minutes: the store or etcd is unreachable, or
/// the stream cannot keep up) and a chain broken (revisions in no chain).
pub fn stream_rule_group(m: &Monitoring) -> Result<Value, OpsError> {
    m.check()?;
    let base = m.runbook_base.trim_end_matches('/');
    let cluster = "{{ $labels.namespace }}/{{ $labels.hosted_cluster }}";
    let by = "max by (namespace, hosted_cluster)";
    let rules = vec![
        alert(
            base,
            "HcpDrStreamLagging",
            format!("{by} (hcp_dr_stream_lag_seconds) > {STREAM_LAG_SECONDS}"),
            STREAM_LAG_FOR,
            "critical",
            &format!("The continuous backup of hosted cluster {cluster} is more than {STREAM_LAG_SECONDS}s behind"),
            &format!("For {STREAM_LAG_FOR}, the newest instant at which everything {cluster}'s etcd held was durable in the store has been more than {STREAM_LAG_SECONDS}s old ({{{{ $value }}}}s now): losing the management cluster now loses that much. The stream pod's log says why (the store failing, no etcd member answering)."),
        ),
        alert(
            base,
            "HcpDrStreamChainBroken",
            format!("{by} (increase(hcp_dr_stream_chain_breaks_total[1h])) > 0"),
            "0s",
            "warning",
            &format!("The continuous backup of hosted cluster {cluster} broke: some revisions are in no chain"),
            &format!("A chain of {cluster} ended within the last hour because the watch could not go on (etcd compacted the revisions it needed: the stream was down or behind for too long); a new chain started from a new base. The writes between are restorable from no chain: `hcp-dr stream list` names them."),
        ),
    ];
    Ok(json!({"name": "hcp-dr-stream", "rules": rules}))
}

/// The PrometheusRule object, in `namespace`; with `stream`, the
/// continuous backup's group too.
pub fn prometheus_rule(m: &Monitoring, schedule: &str, namespace: &str, labels: &Value, stream: bool) -> Result<Value, OpsError> {
    let mut groups = rule_groups(m, schedule)?;
    if stream && let Some(list) = groups.as_array_mut() {
        list.push(stream_rule_group(m)?);
    }
    Ok(json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "hcp-dr", "namespace": namespace, "labels": labels},
        "spec": {"groups": groups},
    }))
}

fn panel(id: u64, title: &str, expr: &str, unit: &str, kind: &str, (x, y): (u64, u64)) -> Value {
    json!({
        "id": id, "type": kind, "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": "A", "expr": expr, "legendFormat": "{{namespace}}/{{hosted_cluster}}"}],
    })
}

/// The Grafana dashboard, as the JSON its ConfigMap carries.
pub fn dashboard() -> Value {
    let by = "max by (namespace, hosted_cluster)";
    json!({
        "uid": "hcp-dr", "title": "hcp-dr: hosted cluster backups", "schemaVersion": 39, "version": 1,
        "tags": ["hcp-dr", "hypershift"], "time": {"from": "now-7d", "to": "now"}, "refresh": "1m",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]},
        "panels": [
            panel(1, "Age of the newest good backup", &format!("time() - {by} (hcp_dr_backup_last_success_timestamp_seconds)"), "s", "timeseries", (0, 0)),
            panel(2, "Last backup succeeded (1) or failed (0)", &format!("{by} (hcp_dr_backup_last_success)"), "none", "stat", (12, 0)),
            panel(3, "Backup duration", &format!("{by} (hcp_dr_backup_last_duration_seconds)"), "s", "timeseries", (0, 8)),
            panel(4, "Hosted API downtime per backup", &format!("{by} (hcp_dr_backup_last_api_downtime_seconds)"), "s", "timeseries", (12, 8)),
            panel(5, "Backup size", &format!("{by} (hcp_dr_backup_last_bytes)"), "bytes", "timeseries", (0, 16)),
            panel(6, "Failed backups (increase over 1 d)", &format!("{by} (increase(hcp_dr_backup_failures_total[1d]))"), "none", "timeseries", (12, 16)),
            panel(7, "Hosted clusters with no good backup", &format!("{by} (hcp_dr_hosted_cluster_discovered) unless on (namespace, hosted_cluster) {by} (hcp_dr_backup_last_success_timestamp_seconds)"), "none", "table", (0, 24)),
            panel(8, "Last drill passed (1) or failed (0)", &format!("{by} (hcp_dr_drill_last_success)"), "none", "stat", (12, 24)),
            panel(9, "Age of the last passed drill", &format!("time() - {by} (hcp_dr_drill_last_success_timestamp_seconds)"), "s", "timeseries", (0, 32)),
            panel(10, "Age of the last drill, passed or not", &format!("time() - {by} (hcp_dr_drill_last_timestamp_seconds)"), "s", "timeseries", (12, 32)),
            panel(11, "RTO of the last passed drill", &format!("{by} (hcp_dr_drill_last_rto_seconds)"), "s", "timeseries", (0, 40)),
            panel(12, "RPO of the last passed drill", &format!("{by} (hcp_dr_drill_last_rpo_seconds)"), "s", "timeseries", (12, 40)),
            panel(13, "Store reachable", "max by (store) (hcp_dr_store_reachable)", "none", "stat", (0, 48)),
            panel(14, "Copy stores the last backup is missing from", &format!("{by} (hcp_dr_backup_last_copies_incomplete)"), "none", "stat", (12, 48)),
        ],
    })
}

/// The ConfigMap the Grafana dashboard sidecar picks up, in `namespace`.
pub fn dashboard_configmap(namespace: &str, labels: &Value) -> Value {
    let mut labels = labels.clone();
    labels["grafana_dashboard"] = json!("1");
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "hcp-dr-dashboard", "namespace": namespace, "labels": labels},
        "data": {"hcp-dr.json": serde_json::to_string_pretty(&dashboard()).unwrap_or_default()},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any base: there is no default, the user names where the runbooks are.
    const RUNBOOK_BASE: &str = "https://git.example.com/platform/hcp-dr/blob/main/docs/runbooks";

    fn monitoring() -> Monitoring {
        Monitoring { stale_after: 2.0, drill_every: std::time::Duration::from_secs(30 * 86400), runbook_base: RUNBOOK_BASE.into() }
    }

    #[test]
    fn the_stale_threshold_follows_the_schedules_longest_gap() {
        assert_eq!(longest_gap_seconds("0 */6 * * *").unwrap(), 6 * 3600);
        assert_eq!(longest_gap_seconds("@hourly").unwrap(), 3600);
        assert_eq!(longest_gap_seconds("@daily").unwrap(), 86400);
        // weekdays at 02:00: the weekend is the longest gap
        assert_eq!(longest_gap_seconds("0 2 * * 1-5").unwrap(), 3 * 86400);
        // monthly: the longest month
        assert_eq!(longest_gap_seconds("@monthly").unwrap(), 31 * 86400);
        let groups = rule_groups(&monitoring(), "0 */6 * * *").unwrap();
        let stale = groups[0]["rules"].as_array().unwrap().iter().find(|r| r["alert"] == "HcpDrBackupStale").unwrap();
        assert!(stale["expr"].as_str().unwrap().contains("> 43200) and on (namespace, hosted_cluster)"), "{stale}");
        assert_eq!(stale["for"], "600s");
        // a schedule that runs every minute holds its conditions for less
        // than an interval, so its alerts fire within minutes
        let groups = rule_groups(&monitoring(), "* * * * *").unwrap();
        let fors: Vec<&str> = groups[0]["rules"].as_array().unwrap().iter().map(|r| r["for"].as_str().unwrap()).collect();
        assert_eq!(fors, ["60s", "30s", "60s", "120s", "120s", "1m", "1h", "60s", "60s"]);
    }

    #[test]
    fn every_alert_names_the_cluster_and_links_a_runbook_that_exists() {
        let groups = rule_groups(&monitoring(), "0 */6 * * *").unwrap();
        let stream = stream_rule_group(&monitoring()).unwrap();
        let rules = groups[0]["rules"].as_array().unwrap();
        let names: Vec<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
        assert_eq!(names, ALERTS);
        let stream_names: Vec<&str> = stream["rules"].as_array().unwrap().iter().map(|r| r["alert"].as_str().unwrap()).collect();
        assert_eq!(stream_names, STREAM_ALERTS);
        for rule in rules.iter().chain(stream["rules"].as_array().unwrap()) {
            let url = rule["annotations"]["runbook_url"].as_str().unwrap();
            let (page, anchor) = url.strip_prefix(RUNBOOK_BASE).unwrap().trim_start_matches('/').split_once('#').unwrap();
            let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/runbooks").join(page)).unwrap();
            let slug = |h: &str| h.trim_start_matches('#').trim().to_lowercase().replace(' ', "-").chars().filter(|c| c.is_alphanumeric() || *c == '-').collect::<String>();
            assert!(text.lines().filter(|l| l.starts_with("## ") || l.starts_with("### ")).any(|h| slug(h) == anchor), "{url}: no heading #{anchor} in docs/runbooks/{page}");
            if !["HcpDrNoBackupReports", "HcpDrStoreUnreachable"].contains(&rule["alert"].as_str().unwrap()) {
                assert!(rule["annotations"]["summary"].as_str().unwrap().contains("{{ $labels.namespace }}/{{ $labels.hosted_cluster }}"), "{rule}");
            }
        }
    }

    #[test]
    fn nonsense_thresholds_are_refused() {
        for bad in [0.5, 0.0, -1.0, f64::NAN, 1000.0] {
            let m = Monitoring { stale_after: bad, ..monitoring() };
            assert!(rule_groups(&m, "@daily").unwrap_err().to_string().contains("--stale-after"), "{bad}");
        }
    }

    #[test]
    fn the_dashboard_reads_the_series_hcp_dr_writes() {
        let text = dashboard().to_string();
        use crate::ops::signals::{DISCOVERED, DRILL_METRICS, METRICS, STORE_REACHABLE};
        for (metric, _, _) in METRICS.iter().chain(DRILL_METRICS).chain([&DISCOVERED, &STORE_REACHABLE]) {
            assert!(text.contains(metric), "the dashboard shows no {metric}");
        }
        let cm = dashboard_configmap("hcp-dr", &json!({"app.kubernetes.io/name": "hcp-dr"}));
        assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
        let _: Value = serde_json::from_str(cm["data"]["hcp-dr.json"].as_str().unwrap()).unwrap();
    }
}
