//! What an unattended backup leaves behind for people: Events on the
//! HostedCluster, a status ConfigMap, Prometheus metrics.

use crate::support;

use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::Api;
use support::*;

async fn reasons(env: &Env) -> Vec<(String, String)> {
    let events = Api::<Event>::namespaced(env.mgmt.clone(), "clusters").list(&Default::default()).await.unwrap();
    let mut out: Vec<(String, String)> = events
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("HostedCluster") && e.involved_object.name.as_deref() == Some("demo"))
        .filter(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("hcp-dr"))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect();
    out.sort();
    out
}

/// A Pushgateway stand-in on 127.0.0.1:0 recording each request as
/// (method, path, body); it knows no earlier values (`GET` answers empty).
async fn pushgateway() -> (String, std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut data = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = conn.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                data.extend_from_slice(&buf[..n]);
                let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                let head = String::from_utf8_lossy(&data[..end]).to_string();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                    .unwrap_or(0);
                if data.len() < end + 4 + length {
                    continue;
                }
                let mut first = head.lines().next().unwrap_or_default().split(' ');
                let (method, path) = (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
                let body = String::from_utf8_lossy(&data[end + 4..end + 4 + length]).to_string();
                record.lock().unwrap().push((method, path, body));
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                break;
            }
        }
    });
    (url, seen)
}

/// The value of `metric` in a pushed body (no labels: the group carries them).
fn pushed(body: &str, metric: &str) -> f64 {
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("{metric} ")))
        .unwrap_or_else(|| panic!("{metric} not pushed:\n{body}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

const PUSHED: [&str; 6] = [
    "hcp_dr_backup_last_success_timestamp_seconds",
    "hcp_dr_backup_last_duration_seconds",
    "hcp_dr_backup_last_api_downtime_seconds",
    "hcp_dr_backup_last_bytes",
    "hcp_dr_backup_failures_total",
    "hcp_dr_backup_last_success",
];

/// The PUT of the last push, after checking its group.
fn last_put(seen: &std::sync::Mutex<Vec<(String, String, String)>>) -> String {
    let seen = seen.lock().unwrap();
    let (method, path, body) = seen.iter().rev().find(|(m, _, _)| m != "GET").expect("nothing pushed").clone();
    assert_eq!(method, "PUT");
    assert_eq!(path, "/metrics/job/nightly/namespace/clusters/hosted_cluster/demo/site/sandbox");
    body
}

fn series(text: &str, metric: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{metric}{{namespace=\"clusters\",hosted_cluster=\"demo\"}}")))
        .unwrap_or_else(|| panic!("{metric} missing:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backups_record_events_status_and_metrics() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    let metrics = env.dir.path().join("hcp_dr.prom");
    let (gateway, pushes) = pushgateway().await;
    let args = [
        "backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--metrics-file", metrics.to_str().unwrap(),
        "--pushgateway", &gateway, "--pushgateway-job", "nightly", "--pushgateway-label", "site=sandbox", "-o", "json",
    ];
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let backup = report["backup"].as_str().unwrap().to_string();

    let seen = reasons(&env).await;
    assert_eq!(seen.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(), ["BackupStarted", "BackupSucceeded"], "{seen:?}");
    assert!(seen[1].1.contains(&backup), "{seen:?}");
    let cm = Api::<ConfigMap>::namespaced(env.mgmt.clone(), "clusters").get("hcp-dr-backup-demo").await.unwrap();
    let data = cm.data.unwrap();
    assert_eq!(data["last_success_backup"], backup);
    assert_eq!(data["last_success_revision"], report["etcd_revision"].as_i64().unwrap().to_string());
    let prom = std::fs::read_to_string(&metrics).unwrap();
    assert_eq!(series(&prom, "hcp_dr_backup_last_success"), 1.0);
    assert_eq!(series(&prom, "hcp_dr_backup_failures_total"), 0.0);
    assert!(series(&prom, "hcp_dr_backup_last_bytes") > 1000.0);
    let success_at = series(&prom, "hcp_dr_backup_last_success_timestamp_seconds");
    assert!(success_at > 1.7e9);
    // the Pushgateway got the same metrics, in the cluster's group
    let body = last_put(&pushes);
    for metric in PUSHED {
        assert_eq!(pushed(&body, metric), series(&prom, metric), "{metric}:\n{body}");
    }

    // a failed backup: a Warning Event with the reason, the failure recorded, the last success kept
    let out = env.hcp_dr(&args, &[("HCP_DR_TEST_FAIL_AFTER", "export")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let seen = reasons(&env).await;
    let failed: Vec<&(String, String)> = seen.iter().filter(|(r, _)| r == "BackupFailed").collect();
    assert_eq!(failed.len(), 1, "{seen:?}");
    assert!(failed[0].1.contains("export"), "{seen:?}");
    let data = Api::<ConfigMap>::namespaced(env.mgmt.clone(), "clusters").get("hcp-dr-backup-demo").await.unwrap().data.unwrap();
    assert!(data["last_failure_reason"].contains("injected failure after `export`"), "{data:?}");
    assert_eq!(data["last_success_backup"], backup, "the last success is kept");
    let prom = std::fs::read_to_string(&metrics).unwrap();
    assert_eq!(series(&prom, "hcp_dr_backup_failures_total"), 1.0);
    assert_eq!(series(&prom, "hcp_dr_backup_last_success"), 0.0);
    assert_eq!(series(&prom, "hcp_dr_backup_last_success_timestamp_seconds"), success_at);
    let body = last_put(&pushes);
    assert_eq!(pushed(&body, "hcp_dr_backup_failures_total"), 1.0, "{body}");
    assert_eq!(pushed(&body, "hcp_dr_backup_last_success"), 0.0, "{body}");
    assert_eq!(pushed(&body, "hcp_dr_backup_last_duration_seconds"), series(&prom, "hcp_dr_backup_last_duration_seconds"));
    env.assert_in_service("after the failed backup").await;
    // the rendered alerts fire on these very series (promtool test rules)
    crate::monitoring::rules_fire_on_hcp_drs_own_series(&prom);

    // a Pushgateway that cannot be reached is a warning, never a failed backup
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--pushgateway", &closed, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let warnings = json_report(&out)["warnings"].clone();
    assert!(
        warnings.as_array().unwrap().iter().any(|w| w.as_str().unwrap().starts_with("could not push metrics to the Pushgateway: PUT")),
        "{warnings:#}"
    );
}
