//! A degraded etcd on the source. One member of three hung: the backup
//! completes from the two healthy members and records which member was
//! skipped and why. Two hung (no quorum): the backup refuses before
//! anything changes, unless `--allow-no-quorum`, which snapshots the
//! readable member with the highest revision and marks the backup so in
//! the manifest, `backups list` and `backups describe`, and a restore of it
//! warns.

use crate::support;

use std::path::Path;

use serde_json::Value;
use support::*;

fn manifest(backup_url: &str) -> Value {
    let dir = backup_url.strip_prefix("file://").expect("a local backup");
    serde_json::from_slice(&std::fs::read(Path::new(dir).join("manifest.json")).expect("manifest")).expect("manifest JSON")
}

fn members(manifest: &Value) -> Vec<String> {
    manifest["etcd"].as_array().unwrap().iter().map(|m| m["member"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_skips_a_hung_member_and_needs_allow_no_quorum_without_a_majority() {
    let env = env("HighlyAvailable").await;
    let store = env.local_store();
    let store = store.to_str().unwrap();
    let list = || {
        let out = env.hcp_dr(&["backups", "list", "--store", store], &[]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    };

    // One member of three hung: backed up from the other two.
    let etcd_1 = env.freeze_etcd_member("etcd-1");
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let degraded = manifest(report["backup"].as_str().unwrap());
    assert_eq!(members(&degraded), ["etcd-0", "etcd-2"]);
    let skipped = &degraded["etcd_health"]["skipped"];
    assert_eq!(skipped.as_array().map(Vec::len), Some(1), "{degraded}");
    assert_eq!(skipped[0]["member"], "etcd-1");
    assert!(skipped[0]["reason"].as_str().unwrap().contains("did not answer within 10s"), "{skipped}");
    assert!(degraded["etcd_health"].get("no_quorum").is_none(), "quorum held: {degraded}");
    assert!(text(&out).contains("etcd member etcd-1 is not in this backup"), "the report says so: {}", text(&out));
    let listed = list();
    assert!(listed.contains("degraded") && listed.contains("2 of 3 members (etcd-1 skipped)"), "{listed}");
    env.assert_in_service("after a backup with one member hung").await;

    // Two hung: no quorum. Refused before anything changed.
    let etcd_2 = env.freeze_etcd_member("etcd-2");
    let before = list();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("etcd has no quorum") && said.contains("--allow-no-quorum") && said.contains("etcd-1") && said.contains("etcd-2"), "{said}");
    assert!(env.paused_until().await.iter().all(Value::is_null), "nothing was paused");
    assert_eq!(list(), before, "nothing was written to the store");

    // --allow-no-quorum: the one readable member, marked.
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store, "--allow-no-quorum", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let url = json_report(&out)["backup"].as_str().unwrap().to_string();
    let lone = manifest(&url);
    assert_eq!(members(&lone), ["etcd-0"]);
    assert_eq!(lone["etcd_health"]["no_quorum"], true, "{lone}");
    assert_eq!(lone["etcd_health"]["skipped"].as_array().map(Vec::len), Some(2), "{lone}");
    assert!(list().contains("NO-QUORUM"), "{}", list());
    let out = env.hcp_dr(&["backups", "describe", &url], &[]);
    assert!(text(&out).contains("WITHOUT QUORUM") && text(&out).contains("etcd-2   SKIPPED"), "{}", text(&out));

    drop(etcd_2);
    drop(etcd_1);
    assert!(env.paused_until().await.iter().all(Value::is_null), "nothing left paused");
    assert_eq!(env.writer_replicas().await, env.replicas, "the writers are back");
    env.assert_in_service("with every member running again").await;
}
