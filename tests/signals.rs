//! What an unattended backup leaves behind for people: Events on the
//! HostedCluster, a status ConfigMap, Prometheus metrics.

mod support;

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
    let args = ["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--metrics-file", metrics.to_str().unwrap(), "-o", "json"];
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
    env.assert_in_service("after the failed backup").await;
}
