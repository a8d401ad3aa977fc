//! `hcp-dr schedule render`: the rendered objects are what `kubectl apply`
//! and the API server accept, and say exactly what the CronJob does.

use std::process::Command;

use hcp_dr_e2e::sandbox::Sandbox;
use serde_json::Value;

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("kubectl not found ({e}): install kubectl (https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubectl)"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rendered_schedule_applies_with_kubectl() {
    let tmp = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::up(&tmp.path().join("sb")).await.expect("sandbox");
    let out = Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(["schedule", "render", "--schedule", "0 */6 * * *", "--to", "s3://backups/hcp", "--credentials-secret", "hcp-dr-s3", "--keep-daily", "7", "--max-age", "30d", "-l", "backup=yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = tmp.path().join("schedule.yaml");
    std::fs::write(&yaml, &out.stdout).unwrap();
    let kubeconfig = &sandbox.clusters[0].kubeconfig;
    let applied = kubectl(kubeconfig, &["apply", "-f", yaml.to_str().unwrap()]);
    assert!(applied.status.success(), "kubectl apply: {}\n{}", String::from_utf8_lossy(&applied.stdout), String::from_utf8_lossy(&applied.stderr));
    let text = String::from_utf8_lossy(&applied.stdout);
    for created in ["namespace/hcp-dr", "serviceaccount/hcp-dr-backup", "clusterrole.rbac.authorization.k8s.io/hcp-dr-backup", "clusterrolebinding.rbac.authorization.k8s.io/hcp-dr-backup", "cronjob.batch/hcp-dr-backup"] {
        assert!(text.contains(created), "{created} not applied: {text}");
    }
    // applying again changes nothing
    let again = kubectl(kubeconfig, &["apply", "-f", yaml.to_str().unwrap()]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).lines().all(|l| l.ends_with("unchanged")), "{}", String::from_utf8_lossy(&again.stdout));

    let cron = kubectl(kubeconfig, &["get", "cronjob", "hcp-dr-backup", "-n", "hcp-dr", "-o", "json"]);
    let cron: Value = serde_json::from_slice(&cron.stdout).unwrap();
    assert_eq!(cron["spec"]["concurrencyPolicy"], "Forbid");
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "hcp-dr-backup");
    assert_eq!(pod["initContainers"][0]["args"][0], "backup");
    assert_eq!(pod["containers"][0]["args"][1], "prune");
    let role = kubectl(kubeconfig, &["get", "clusterrole", "hcp-dr-backup", "-o", "json"]);
    let role: Value = serde_json::from_slice(&role.stdout).unwrap();
    let rules = role["rules"].as_array().unwrap();
    // least privilege: no wildcard verbs; nothing deleted but the lock
    // Lease and what the KubeVirt data movers are made of (snapshots, their
    // scratch claims and Jobs), none of them cluster-scoped
    assert!(rules.iter().all(|r| r["verbs"].as_array().unwrap().iter().all(|v| v != "*")));
    let mut deleted: Vec<&str> = rules
        .iter()
        .filter(|r| r["verbs"].as_array().unwrap().iter().any(|v| v == "delete"))
        .flat_map(|r| r["resources"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()))
        .collect();
    deleted.sort();
    assert_eq!(deleted, ["jobs", "leases", "persistentvolumeclaims", "volumesnapshots"]);

    // spread over three pods: an Indexed Job the API server (and kubectl) accept
    let out = Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(["schedule", "render", "--schedule", "0 */6 * * *", "--to", "s3://backups/hcp", "--namespace", "hcp-dr-sharded", "--shards", "3", "--keep-daily", "7"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sharded = tmp.path().join("sharded.yaml");
    std::fs::write(&sharded, &out.stdout).unwrap();
    let applied = kubectl(kubeconfig, &["apply", "-f", sharded.to_str().unwrap()]);
    assert!(applied.status.success(), "kubectl apply: {}\n{}", String::from_utf8_lossy(&applied.stdout), String::from_utf8_lossy(&applied.stderr));
    let cron = kubectl(kubeconfig, &["get", "cronjob", "hcp-dr-backup", "-n", "hcp-dr-sharded", "-o", "json"]);
    let cron: Value = serde_json::from_slice(&cron.stdout).unwrap();
    let job = &cron["spec"]["jobTemplate"]["spec"];
    assert_eq!((job["completionMode"].as_str(), job["parallelism"].as_u64(), job["backoffLimitPerIndex"].as_u64()), (Some("Indexed"), Some(3), Some(0)), "{job:#}");
    assert_eq!(job["template"]["spec"]["initContainers"][0]["args"][2], "--shard");

    // bad input: exit 2
    let out = Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(["schedule", "render", "--schedule", "every 6h", "--to", "s3://b/p"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("five fields"));
    sandbox.shutdown().await;
}
