//! Playbook `with:` parameters: checked when the playbook loads (unknown
//! keys, wrong types and out-of-range values refused with the line, before
//! anything is contacted), shown by `playbook show`, and used by the stage
//! (issue 14).

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use support::*;

/// The embedded backup playbook with `with` under `scale-down`.
fn backup_playbook(dir: &std::path::Path, with: &str) -> std::path::PathBuf {
    backup_playbook_with(dir, "scale-down", with)
}

/// The line of the first `with:` value under `stage` in
/// [`backup_playbook_with`]'s file: two below the stage's `- name:` line.
fn value_line(stage: &str) -> usize {
    let builtin = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playbooks/backup.yaml")).unwrap();
    builtin.lines().position(|l| l == format!("  - name: {stage}")).expect("the stage") + 3
}

/// The embedded backup playbook with `with` under `stage`.
fn backup_playbook_with(dir: &std::path::Path, stage: &str, with: &str) -> std::path::PathBuf {
    let builtin = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playbooks/backup.yaml")).unwrap();
    let text = builtin.replace(&format!("  - name: {stage}\n"), &format!("  - name: {stage}\n    with:\n{with}"));
    assert_ne!(text, builtin, "the embedded backup playbook has no {stage} stage");
    let path = dir.join("backup.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn hcp_dr(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(args).env("HCP_DR_STATE_DIR", std::env::temp_dir()).output().unwrap()
}

#[test]
fn bad_parameters_are_refused_with_their_line_before_anything_is_contacted() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // a kubeconfig nobody answers: the refusal must come first
    let kubeconfig = dir.path().join("nobody.kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster: {server: 'https://127.0.0.1:9'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: x, user: u}\ncurrent-context: x\n").unwrap();
    for (with, says) in [
        ("      timout: 5m\n", "unknown field `timout`"),
        ("      timeout: 300\n", "invalid type"),
        ("      timeout: 2s\n", "`2s` is too short"),
        ("      extra-deployments: [Not_A_Name]\n", "not a valid Kubernetes name"),
    ] {
        let playbook = backup_playbook(dir.path(), with);
        let out = hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--kubeconfig", kubeconfig.to_str().unwrap(), "--playbook", playbook.to_str().unwrap()]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{with}: {said}");
        // the `with:` value starts two lines below the stage's name
        assert!(said.contains(&format!("line {}: stage `scale-down`: with:", value_line("scale-down"))) && said.contains(says), "{with}: {said}");
        assert!(!said.contains("127.0.0.1:9"), "the cluster was contacted before the playbook was checked: {said}");
        assert!(!store.exists(), "the store was written");
    }
    // etcd-snapshot's concurrency: a count, in range
    for (with, says) in [("      concurrency: 0\n", "concurrency: 0 is out of range (1 to 16)"), ("      concurrency: all\n", "invalid type")] {
        let playbook = backup_playbook_with(dir.path(), "etcd-snapshot", with);
        let out = hcp_dr(&["playbook", "show", "backup", "--playbook", playbook.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{with}: {}", text(&out));
        assert!(text(&out).contains("stage `etcd-snapshot`: with:") && text(&out).contains(says), "{with}: {}", text(&out));
    }
    // a stage that takes no parameters refuses any
    let builtin = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playbooks/backup.yaml")).unwrap();
    let path = dir.path().join("lock.yaml");
    std::fs::write(&path, builtin.replace("  - name: lock\n", "  - name: lock\n    with:\n      ttl: 5m\n")).unwrap();
    let out = hcp_dr(&["playbook", "show", "backup", "--playbook", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("stage `lock`: with: this stage takes no parameters"), "{}", text(&out));

    // shown by playbook show, with what the file sets
    let playbook = backup_playbook(dir.path(), "      timeout: 2m\n");
    let out = hcp_dr(&["playbook", "show", "backup", "--playbook", playbook.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = json_report(&out);
    let scale_down = shown["stages"].as_array().unwrap().iter().find(|s| s["name"] == "scale-down").unwrap().clone();
    assert_eq!(scale_down["with"]["timeout"], "2m", "{shown:#}");
    let keys: Vec<&str> = scale_down["params"].as_array().unwrap().iter().filter_map(|p| p["key"].as_str()).collect();
    assert_eq!(keys, ["timeout", "extra-deployments"], "{shown:#}");
    // every embedded playbook's parameters check (the wait stages say theirs)
    for (operation, stage) in [("restore", "wait"), ("etcd-recover", "rejoin"), ("migrate", "dns-withdraw"), ("restore", "dns-takeover")] {
        let out = hcp_dr(&["playbook", "show", operation, "-o", "json"]);
        assert!(out.status.success(), "{operation}: {}", text(&out));
        let shown = json_report(&out);
        let Some(found) = shown["stages"].as_array().unwrap().iter().find(|s| s["name"] == stage) else { continue };
        assert!(!found["params"].as_array().unwrap().is_empty(), "{operation}/{stage} lists no parameters: {shown:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scale_down_parameters_change_what_a_backup_stops_and_how_long_it_waits() {
    let env = env("SingleReplica").await;
    let deployments: Api<Deployment> = Api::namespaced(env.mgmt.clone(), &env.hcp_ns());
    let extra = "control-plane-operator";
    let replicas = deployments.get(extra).await.expect("the sandbox runs a control-plane-operator").spec.replicas.unwrap_or(1);
    assert!(replicas > 0);
    let playbook = backup_playbook(env.dir.path(), &format!("      timeout: 2m\n      extra-deployments: [{extra}]\n"));
    let store = env.local_store();
    let args = ["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--playbook", playbook.to_str().unwrap(), "-o", "json"];

    // the plan says it
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let out = env.hcp_dr(&dry, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let planned = json_report(&out);
    let plan = planned["stages"].as_array().unwrap().iter().find(|s| s["name"] == "scale-down").unwrap()["status"]["planned"]["actions"].to_string();
    assert!(plan.contains(&format!("{extra} to 0 and wait up to 2m")), "{planned:#}");

    // and the run does it: the extra Deployment stopped with the writers, then back
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let scaled: Vec<&str> = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "scale-down").unwrap()["output"]["scaled"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert!(scaled.contains(&extra) && scaled.contains(&"kube-apiserver"), "{report:#}");
    env.assert_in_service("after the backup").await;
    let back = deployments.get(extra).await.unwrap().spec.replicas.unwrap_or(1);
    assert_eq!(back, replicas, "{extra} was not scaled back");

    // without the parameter, it is left alone
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let scaled = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "scale-down").unwrap()["output"]["scaled"].to_string();
    assert!(!scaled.contains(extra), "{report:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_concurrency_streams_the_members_one_group_after_the_other() {
    let env = env("HighlyAvailable").await;
    let playbook = backup_playbook_with(env.dir.path(), "etcd-snapshot", "      concurrency: 1\n");
    let store = env.local_store();
    let args = ["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--playbook", playbook.to_str().unwrap(), "-o", "json"];
    let stage = |report: &serde_json::Value, name: &str| report["stages"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap().clone();

    // the plan says it
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let out = env.hcp_dr(&dry, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let planned = json_report(&out);
    let plan = stage(&planned, "etcd-snapshot")["status"]["planned"]["actions"].to_string();
    assert!(plan.contains("1 member(s) at a time"), "{planned:#}");

    // the run streams the three members one after the other, all at the
    // agreed revision, and the backup verifies
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let started = stage(&report, "etcd-snapshot")["output"].clone();
    assert_eq!(started["concurrency"], 1, "{report:#}");
    let groups: Vec<Vec<String>> = serde_json::from_value(started["groups"].clone()).unwrap();
    assert_eq!(groups.len(), 3, "{report:#}");
    assert!(groups.iter().all(|g| g.len() == 1), "{report:#}");
    let mut members: Vec<String> = groups.concat();
    members.sort();
    assert_eq!(members, ["etcd-0", "etcd-1", "etcd-2"], "{report:#}");
    let snapshots = stage(&report, "snapshot-finish")["output"]["snapshots"].as_array().unwrap().clone();
    assert_eq!(snapshots.len(), 3, "{report:#}");
    assert!(snapshots.iter().all(|s| s["revision"] == started["revision"]), "{report:#}");
    let url = report["backup"].as_str().unwrap().to_string();
    let out = env.hcp_dr(&["backups", "verify", &url, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json_report(&out)["ok"], true, "{}", text(&out));
    env.assert_in_service("after the grouped backup").await;

    // without it, one group: every stream at once
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let started = stage(&report, "etcd-snapshot")["output"].clone();
    assert!(started.get("groups").is_none() && started.get("concurrency").is_none(), "{report:#}");
}
