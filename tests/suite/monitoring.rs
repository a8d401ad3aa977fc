//! The alert rules `schedule render --monitoring` renders, checked and
//! tested with Prometheus' own `promtool` (Debian's `prometheus` package,
//! installed by e2e/setup): `promtool check rules` on the rendered group,
//! and `promtool test rules` on input series whose names and labels are the
//! lines `hcp-dr backup --metrics-file` wrote (tests/suite/signals.rs hands
//! them over), so a renamed metric or label fails here.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::support::text;

const RUNBOOKS: &str = "https://git.example.com/platform/hcp-dr/blob/main/docs/runbooks";

fn hcp_dr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(args).output().expect("run hcp-dr")
}

/// `promtool`, or None when it is not installed (CI installs it: there a
/// missing promtool fails).
fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "promtool is not installed: e2e/setup installs Debian's prometheus package");
        println!("skipped: promtool is not installed (e2e/setup installs Debian's prometheus package)");
        return None;
    }
    Some("promtool")
}

/// The objects `schedule render --monitoring` prints for a 6-hourly schedule.
fn rendered() -> Vec<Value> {
    let out = hcp_dr(&[
        "schedule", "render", "--schedule", "0 */6 * * *", "--to", "s3://bucket/hcp", "--pushgateway", "http://pushgateway.monitoring.svc:9091",
        "--monitoring", "--runbook-base", RUNBOOKS, "-o", "json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).expect("a JSON list")
}

fn rule_groups() -> Value {
    let objects = rendered();
    let rule = objects.iter().find(|o| o["kind"] == "PrometheusRule").expect("a PrometheusRule");
    json!({"groups": rule["spec"]["groups"]})
}

fn promtool_run(promtool: &str, args: &[&str], dir: &Path) -> String {
    let out = Command::new(promtool).args(args).current_dir(dir).output().expect("run promtool");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{said}");
    said
}

#[test]
fn the_rendered_schedule_carries_the_rules_the_dashboard_and_the_pushgateway() {
    let objects = rendered();
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(kinds, ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CronJob", "PrometheusRule", "ConfigMap"]);
    let cronjob = &objects[4];
    let args: Vec<&str> = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    let at = args.iter().position(|a| *a == "--pushgateway").expect("the backup pushes its metrics");
    assert_eq!(args[at + 1], "http://pushgateway.monitoring.svc:9091");
    assert_eq!(objects[6]["metadata"]["labels"]["grafana_dashboard"], "1");
    let Some(promtool) = promtool() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), rule_groups().to_string()).unwrap();
    let said = promtool_run(promtool, &["check", "rules", "rules.yml"], dir.path());
    assert!(said.contains(&format!("SUCCESS: {} rules found", hcp_dr::ops::monitoring::ALERTS.len())), "{said}");

    // bad input: exit 2, saying what to give
    for (extra, says) in [
        (vec!["--stale-after", "0.5"], "--stale-after 0.5"),
        (vec!["--runbook-base", "not a url"], "--runbook-base `not a url`"),
    ] {
        let mut args = vec!["schedule", "render", "--schedule", "@daily", "--to", "s3://bucket/hcp", "--pushgateway", "http://pg:9091", "--monitoring"];
        if !extra.contains(&"--runbook-base") {
            args.extend(["--runbook-base", RUNBOOKS]);
        }
        args.extend(extra.iter().copied());
        let out = hcp_dr(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(says) || String::from_utf8_lossy(&out.stdout).contains(says), "{args:?}: {}", text(&out));
    }
    let out = hcp_dr(&["schedule", "render", "--schedule", "@daily", "--to", "s3://bucket/hcp", "--pushgateway", "ftp://pg:9091"]);
    assert_eq!(out.status.code(), Some(2), "a Pushgateway that is no http(s) URL: {}", text(&out));
    assert!(text(&out).contains("--pushgateway"), "{}", text(&out));
    let out = hcp_dr(&["schedule", "render", "--schedule", "@daily", "--to", "s3://bucket/hcp", "--monitoring", "--runbook-base", RUNBOOKS]);
    assert_eq!(out.status.code(), Some(2), "--monitoring without --pushgateway: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pushgateway"), "{}", text(&out));
}

/// The series (name and labels, as written) of a metrics file, in order.
fn series_lines(prom: &str) -> Vec<&str> {
    prom.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(series, _)| series))
        .collect()
}

/// The series of each metric in a metrics file (the last one of a name).
fn series_of(prom: &str) -> std::collections::BTreeMap<String, String> {
    series_lines(prom)
        .into_iter()
        .map(|series| (series.split('{').next().unwrap_or_default().to_string(), series.to_string()))
        .collect()
}

/// The rule's annotations as Prometheus renders them for `labels`.
fn annotations(rule: &Value, labels: &[(&str, &str)]) -> Value {
    let mut out = serde_json::Map::new();
    for (k, v) in rule["annotations"].as_object().unwrap() {
        let mut text = v.as_str().unwrap().to_string();
        for (name, value) in labels {
            text = text.replace(&format!("{{{{ $labels.{name} }}}}"), value);
        }
        out.insert(k.clone(), json!(text));
    }
    Value::Object(out)
}

/// `promtool test rules` on series named and labelled as in `prom` (what
/// `hcp-dr backup --metrics-file` wrote for demo): demo's last good backup
/// at time 0, its backups failing from 5 h on; a second cluster `fresh`
/// (demo's series, relabelled) that only ever failed. The 6-hourly
/// schedule's alerts fire when they should and not before.
pub fn rules_fire_on_hcp_drs_own_series(prom: &str) {
    let Some(promtool) = promtool() else { return };
    let series = series_of(prom);
    let name = |metric: &str| series.get(metric).unwrap_or_else(|| panic!("{metric} not in what hcp-dr wrote:\n{prom}")).clone();
    assert!(name("hcp_dr_backup_last_success").contains("hosted_cluster=\"demo\""), "{prom}");
    let fresh = |metric: &str| name(metric).replace("hosted_cluster=\"demo\"", "hosted_cluster=\"fresh\"");
    let gone = |metric: &str| name(metric).replace("hosted_cluster=\"demo\"", "hosted_cluster=\"gone\"");
    let discovered = |cluster: &str| format!("hcp_dr_hosted_cluster_discovered{{namespace=\"clusters\",hosted_cluster=\"{cluster}\",selected=\"true\"}}");
    let groups = rule_groups();
    let rule = |alert: &str| groups["groups"][0]["rules"].as_array().unwrap().iter().find(|r| r["alert"] == alert).unwrap().clone();
    let expect = |alert: &str, cluster: Option<&str>| {
        let rule = rule(alert);
        let mut labels = rule["labels"].clone();
        let mut pairs = Vec::new();
        if let Some(c) = cluster {
            labels["namespace"] = json!("clusters");
            labels["hosted_cluster"] = json!(c);
            pairs = vec![("namespace", "clusters"), ("hosted_cluster", c)];
        }
        json!({"exp_labels": labels, "exp_annotations": annotations(&rule, &pairs)})
    };
    // an alert whose summary carries its value
    let expect_with = |alert: &str, cluster: &str, value: &str| {
        let mut expected = expect(alert, Some(cluster));
        let summary = expected["exp_annotations"]["summary"].as_str().unwrap().replace("{{ $value }}", value);
        expected["exp_annotations"]["summary"] = json!(summary);
        expected
    };
    let case = |at: &str, alert: &str, alerts: Vec<Value>| json!({"eval_time": at, "alertname": alert, "exp_alerts": alerts});
    let tests = json!({
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": name("hcp_dr_backup_last_success_timestamp_seconds"), "values": "0+0x900"},
                    {"series": name("hcp_dr_backup_last_success"), "values": "1x300 0x600"},
                    {"series": name("hcp_dr_backup_failures_total"), "values": "0x300 1+0x600"},
                    {"series": fresh("hcp_dr_backup_last_success"), "values": "0x900"},
                    {"series": fresh("hcp_dr_backup_failures_total"), "values": "1+1x900"},
                    {"series": name("hcp_dr_backup_last_copies_incomplete"), "values": "0x120 1x780"},
                ],
                "alert_rule_test": [
                    case("4h", "HcpDrBackupFailing", vec![expect("HcpDrBackupFailing", Some("fresh"))]),
                    case("6h", "HcpDrBackupFailing", vec![expect("HcpDrBackupFailing", Some("demo")), expect("HcpDrBackupFailing", Some("fresh"))]),
                    case("11h", "HcpDrBackupStale", vec![]),
                    case("13h", "HcpDrBackupStale", vec![expect("HcpDrBackupStale", Some("demo"))]),
                    case("2m", "HcpDrClusterNeverBackedUp", vec![]),
                    case("1h", "HcpDrClusterNeverBackedUp", vec![expect("HcpDrClusterNeverBackedUp", Some("fresh"))]),
                    case("13h", "HcpDrNoBackupReports", vec![]),
                    case("1h", "HcpDrBackupCopyIncomplete", vec![]),
                    case("3h", "HcpDrBackupCopyIncomplete", vec![expect_with("HcpDrBackupCopyIncomplete", "demo", "1")]),
                ],
            },
            {
                // with discovery pushed, a cluster no management cluster has any
                // more (`gone`: its group stays on the Pushgateway) never alerts
                "interval": "1m",
                "input_series": [
                    {"series": discovered("demo"), "values": "1x900"},
                    {"series": name("hcp_dr_backup_last_success_timestamp_seconds"), "values": "0+0x900"},
                    {"series": name("hcp_dr_backup_last_success"), "values": "1x300 0x600"},
                    {"series": gone("hcp_dr_backup_last_success_timestamp_seconds"), "values": "0+0x900"},
                    {"series": gone("hcp_dr_backup_last_success"), "values": "0x900"},
                    {"series": gone("hcp_dr_backup_failures_total"), "values": "1x900"},
                ],
                "alert_rule_test": [
                    case("6h", "HcpDrBackupFailing", vec![expect("HcpDrBackupFailing", Some("demo"))]),
                    case("13h", "HcpDrBackupStale", vec![expect("HcpDrBackupStale", Some("demo"))]),
                ],
            },
            {
                "interval": "1m",
                "input_series": [{"series": "up{job=\"pushgateway\"}", "values": "1x900"}],
                "alert_rule_test": [
                    case("11h", "HcpDrNoBackupReports", vec![]),
                    case("13h", "HcpDrNoBackupReports", vec![expect("HcpDrNoBackupReports", None)]),
                ],
            },
        ],
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), groups.to_string()).unwrap();
    std::fs::write(dir.path().join("tests.yml"), tests.to_string()).unwrap();
    let said = promtool_run(promtool, &["test", "rules", "tests.yml"], dir.path());
    assert!(said.contains("SUCCESS"), "{said}");
}

#[test]
fn the_text_output_carries_the_rules_as_yaml_for_kubectl_apply() {
    let out = hcp_dr(&[
        "schedule", "render", "--schedule", "@hourly", "--to", "s3://bucket/hcp", "--pushgateway", "http://pg:9091", "--monitoring", "--runbook-base", RUNBOOKS,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(yaml.contains("kind: PrometheusRule") && yaml.contains("alert: HcpDrBackupStale") && yaml.contains("> 7200"), "{yaml}");
}

/// The labels of a series as written (`name{a="x",b="y"}`).
fn labels_of(series: &str) -> Vec<(String, String)> {
    let inside = series.split_once('{').map_or("", |(_, rest)| rest.trim_end_matches('}'));
    inside
        .split("\",")
        .filter_map(|pair| pair.split_once("=\""))
        .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
        .collect()
}

/// `promtool test rules` of HcpDrClusterUnprotected on what `backup --all
/// --metrics-file` wrote (tests/suite/fleet.rs): every discovered cluster
/// without a good backup of its own fires once the stale threshold has
/// passed, with its `selected` label; the backed-up ones never do.
pub fn unprotected_fires_on_hcp_drs_own_series(prom: &str) {
    let Some(promtool) = promtool() else { return };
    let lines = series_lines(prom);
    let discovered: Vec<&str> = lines.iter().copied().filter(|s| s.starts_with("hcp_dr_hosted_cluster_discovered{")).collect();
    let backed_up: Vec<&str> = lines.iter().copied().filter(|s| s.starts_with("hcp_dr_backup_last_success_timestamp_seconds{")).collect();
    assert!(!discovered.is_empty() && !backed_up.is_empty(), "backup --all wrote no discovered clusters or no backup:\n{prom}");
    let cluster = |series: &str| {
        let labels = labels_of(series);
        let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
        (get("namespace"), get("hosted_cluster"), get("selected"))
    };
    let covered: Vec<(String, String)> = backed_up.iter().map(|s| { let (ns, name, _) = cluster(s); (ns, name) }).collect();
    let groups = rule_groups();
    let rule = groups["groups"][0]["rules"].as_array().unwrap().iter().find(|r| r["alert"] == "HcpDrClusterUnprotected").unwrap().clone();
    let mut expected = Vec::new();
    for series in &discovered {
        let (ns, name, selected) = cluster(series);
        if covered.contains(&(ns.clone(), name.clone())) {
            continue;
        }
        let mut labels = rule["labels"].clone();
        labels["namespace"] = json!(ns);
        labels["hosted_cluster"] = json!(name);
        labels["selected"] = json!(selected);
        expected.push(json!({"exp_labels": labels, "exp_annotations": annotations(&rule, &[("namespace", &ns), ("hosted_cluster", &name), ("selected", &selected)])}));
    }
    assert!(!expected.is_empty() && expected.len() < discovered.len(), "the fleet test should leave some clusters unprotected and back up others:\n{prom}");
    let mut input: Vec<Value> = discovered.iter().map(|s| json!({"series": s, "values": "1x900"})).collect();
    input.extend(backed_up.iter().map(|s| json!({"series": s, "values": "0+0x900"})));
    // the store's reachability, written with the discovered clusters: a 0
    // alerts with the store's URL, a 1 never does
    let store = lines.iter().copied().find(|s| s.starts_with("hcp_dr_store_reachable{")).unwrap_or_else(|| panic!("backup --all wrote no hcp_dr_store_reachable:\n{prom}"));
    assert!(prom.contains(&format!("{store} 1\n")), "the fleet's store answered:\n{prom}");
    let url = labels_of(store).into_iter().find(|(k, _)| k == "store").map(|(_, v)| v).expect("a store label");
    let unreachable = groups["groups"][0]["rules"].as_array().unwrap().iter().find(|r| r["alert"] == "HcpDrStoreUnreachable").unwrap().clone();
    let mut labels = unreachable["labels"].clone();
    labels["store"] = json!(url);
    let down = json!({"exp_labels": labels, "exp_annotations": annotations(&unreachable, &[("store", &url)])});
    let tests = json!({
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input,
                "alert_rule_test": [
                    {"eval_time": "11h", "alertname": "HcpDrClusterUnprotected", "exp_alerts": []},
                    {"eval_time": "13h", "alertname": "HcpDrClusterUnprotected", "exp_alerts": expected},
                ],
            },
            {
                "interval": "1m",
                "input_series": [{"series": store, "values": "1x30 0x30"}],
                "alert_rule_test": [
                    {"eval_time": "25m", "alertname": "HcpDrStoreUnreachable", "exp_alerts": []},
                    {"eval_time": "32m", "alertname": "HcpDrStoreUnreachable", "exp_alerts": []},
                    {"eval_time": "40m", "alertname": "HcpDrStoreUnreachable", "exp_alerts": [down]},
                ],
            },
        ],
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), groups.to_string()).unwrap();
    std::fs::write(dir.path().join("tests.yml"), tests.to_string()).unwrap();
    let said = promtool_run(promtool, &["test", "rules", "tests.yml"], dir.path());
    assert!(said.contains("SUCCESS"), "{said}");
}

/// `promtool test rules` of the drill's alerts on what `hcp-dr drill
/// --metrics-file` wrote (tests/suite/posture.rs): demo's drill passed at
/// time 0 and failed at 40 d; `undrilled` has backups and never a drill.
/// HcpDrDrillOverdue fires once the 30-day default has passed (and, after
/// its hour, for the cluster never drilled); HcpDrDrillFailed fires on the
/// failed drill.
pub fn drill_rules_fire_on_hcp_drs_own_series(prom: &str) {
    let Some(promtool) = promtool() else { return };
    let series = series_of(prom);
    let name = |metric: &str| series.get(metric).unwrap_or_else(|| panic!("{metric} not in what hcp-dr drill wrote:\n{prom}")).clone();
    assert!(name("hcp_dr_drill_last_success").contains("hosted_cluster=\"demo\""), "{prom}");
    for metric in ["hcp_dr_drill_last_timestamp_seconds", "hcp_dr_drill_last_rto_seconds", "hcp_dr_drill_last_rpo_seconds"] {
        name(metric);
    }
    let backup_of = |cluster: &str| format!("hcp_dr_backup_last_success_timestamp_seconds{{namespace=\"clusters\",hosted_cluster=\"{cluster}\"}}");
    let success_of = |cluster: &str| format!("hcp_dr_backup_last_success{{namespace=\"clusters\",hosted_cluster=\"{cluster}\"}}");
    let groups = rule_groups();
    let expect = |alert: &str, cluster: &str| {
        let rule = groups["groups"][0]["rules"].as_array().unwrap().iter().find(|r| r["alert"] == alert).unwrap().clone();
        let mut labels = rule["labels"].clone();
        labels["namespace"] = json!("clusters");
        labels["hosted_cluster"] = json!(cluster);
        json!({"exp_labels": labels, "exp_annotations": annotations(&rule, &[("namespace", "clusters"), ("hosted_cluster", cluster)])})
    };
    let case = |at: &str, alert: &str, alerts: Vec<Value>| json!({"eval_time": at, "alertname": alert, "exp_alerts": alerts});
    let tests = json!({
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1h",
        "tests": [{
            "interval": "1h",
            "input_series": [
                {"series": name("hcp_dr_drill_last_success"), "values": "1x960 0x100"},
                {"series": name("hcp_dr_drill_last_success_timestamp_seconds"), "values": "0+0x1060"},
                {"series": backup_of("demo"), "values": "0+3600x1060"},
                {"series": backup_of("undrilled"), "values": "0+3600x1060"},
                {"series": success_of("demo"), "values": "1x1060"},
                {"series": success_of("undrilled"), "values": "1x1060"},
            ],
            "alert_rule_test": [
                case("30m", "HcpDrDrillOverdue", vec![]),
                case("3h", "HcpDrDrillOverdue", vec![expect("HcpDrDrillOverdue", "undrilled")]),
                case("29d", "HcpDrDrillOverdue", vec![expect("HcpDrDrillOverdue", "undrilled")]),
                case("31d", "HcpDrDrillOverdue", vec![expect("HcpDrDrillOverdue", "demo"), expect("HcpDrDrillOverdue", "undrilled")]),
                case("39d", "HcpDrDrillFailed", vec![]),
                case("41d", "HcpDrDrillFailed", vec![expect("HcpDrDrillFailed", "demo")]),
            ],
        }],
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), groups.to_string()).unwrap();
    std::fs::write(dir.path().join("tests.yml"), tests.to_string()).unwrap();
    let said = promtool_run(promtool, &["test", "rules", "tests.yml"], dir.path());
    assert!(said.contains("SUCCESS"), "{said}");
}
