//! `hcp-dr backup` on the sandbox: real etcd members, real binary.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hcp_dr_e2e::procs::etcd::{ClientTls, connect_client, restore_scratch};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::{Env, env, files, finished_lines, json_report, text, wait_for_stage};

type KeyValues = Vec<(Vec<u8>, Vec<u8>)>;

/// All keys of a live hosted etcd member at `revision`, over its TLS client port.
async fn live_keys(env: &Env, revision: i64) -> KeyValues {
    let ns = env.hcp_ns();
    let secret = Api::<Secret>::namespaced(env.mgmt.clone(), &ns).get("etcd-client-tls").await.unwrap();
    let ca = Api::<ConfigMap>::namespaced(env.mgmt.clone(), &ns).get("etcd-ca").await.unwrap();
    let data = secret.data.unwrap();
    let pod = Api::<Pod>::namespaced(env.mgmt.clone(), &ns).get("etcd-0").await.unwrap();
    let ip = pod.status.unwrap().pod_ip.unwrap();
    let tls = ClientTls {
        ca_pem: ca.data.unwrap()["ca.crt"].clone(),
        cert_pem: String::from_utf8(data["etcd-client.crt"].0.clone()).unwrap(),
        key_pem: String::from_utf8(data["etcd-client.key"].0.clone()).unwrap(),
        server_name: format!("etcd-0.etcd-discovery.{ns}.svc"),
    };
    let mut client = connect_client(&[format!("https://{ip}:2379")], Some(&tls)).await.unwrap();
    let resp = client
        .get(vec![0u8], Some(etcd_client::GetOptions::new().with_from_key().with_revision(revision)))
        .await
        .unwrap();
    resp.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect()
}

/// Restore a snapshot file with etcdctl into a scratch member; all its keys.
async fn restored_keys(snapshot: &Path, dir: &Path) -> KeyValues {
    let mut member = restore_scratch(snapshot, dir).await.unwrap();
    let mut client = connect_client(&[member.client_url()], None).await.unwrap();
    let resp = client.get(vec![0u8], Some(etcd_client::GetOptions::new().with_from_key())).await.unwrap();
    let keys = resp.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect();
    member.kill();
    keys
}

/// The raw snapshot of `artifact`: the stored file, or for a compressed
/// backup that decompressed into `scratch`, checked against the manifest's
/// raw size and SHA-256.
async fn raw_snapshot(folder: &Path, manifest: &Value, artifact: &str, scratch: &Path) -> PathBuf {
    let stored = folder.join(artifact);
    let Some(raw) = manifest["compression"]["artifacts"].as_array().and_then(|a| a.iter().find(|r| r["name"] == artifact)) else { return stored };
    let compressed = std::fs::read(&stored).unwrap();
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut hcp_dr::archive::compression::decompressing(&compressed[..], raw["size"].as_u64().unwrap(), artifact).unwrap(), &mut bytes)
        .await
        .unwrap();
    assert_eq!(format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&bytes)), raw["sha256"].as_str().unwrap(), "{artifact}: not the raw snapshot");
    std::fs::write(scratch, &bytes).unwrap();
    scratch.to_path_buf()
}

/// Check a finished backup folder: every snapshot restores to exactly the
/// live keys at the recorded revision; the manifest lists every artifact.
async fn check_backup(env: &Env, folder: &Path, expected_members: usize) -> Value {
    let manifest: Value = serde_json::from_slice(&std::fs::read(folder.join("manifest.json")).unwrap()).unwrap();
    // compressed, the default
    assert_eq!(manifest["format_version"], 3);
    assert_eq!(manifest["compression"]["algorithm"], "zstd");
    let snapshots = manifest["etcd"].as_array().unwrap();
    assert_eq!(snapshots.len(), expected_members, "{manifest:#}");
    let revision = snapshots[0]["revision"].as_i64().unwrap();
    let live = live_keys(env, revision).await;
    assert!(live.iter().any(|(k, _)| k.starts_with(b"/kubernetes.io/configmaps/drill-app/")), "workloads are in etcd");
    for (i, snapshot) in snapshots.iter().enumerate() {
        assert_eq!(snapshot["revision"].as_i64().unwrap(), revision, "members agree");
        let id = folder.file_name().unwrap().to_string_lossy();
        let path = raw_snapshot(folder, &manifest, snapshot["artifact"].as_str().unwrap(), &env.dir.path().join(format!("raw-{id}-{i}.db"))).await;
        let restored = restored_keys(&path, &env.dir.path().join(format!("scratch-{id}-{i}"))).await;
        assert!(restored == live, "snapshot {} does not restore the live keys at revision {revision}", snapshot["member"]);
    }
    let objects = manifest["object_counts"].clone();
    assert_eq!(objects["HostedCluster"], 1, "{objects}");
    assert_eq!(objects["NodePool"], 1, "{objects}");
    assert_eq!(objects["HostedControlPlane"], 1, "{objects}");
    assert!(objects["Secret"].as_u64().unwrap() >= 4, "{objects}");
    assert!(manifest["timings"]["api_downtime_seconds"].as_f64().unwrap() > 0.0);
    manifest
}

fn s3_folder(env: &Env, report: &Value) -> PathBuf {
    let url = report["backup"].as_str().unwrap();
    let rel = url.strip_prefix(&format!("s3://{}/", hcp_dr_e2e::sandbox::BUCKET)).unwrap();
    env.sandbox.s3.root().join(hcp_dr_e2e::sandbox::BUCKET).join(rel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn highly_available_cluster_to_s3() {
    let env = env("HighlyAvailable").await;
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-n", "clusters", "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    check_backup(&env, &s3_folder(&env, &report), 3).await;
    env.assert_in_service("after the backup").await;
    // secrets never appear in the output
    let secret = Api::<Secret>::namespaced(env.mgmt.clone(), &env.hcp_ns()).get("etcd-client-tls").await.unwrap();
    let key = String::from_utf8(secret.data.unwrap()["etcd-client.key"].0.clone()).unwrap();
    let key_line = key.lines().nth(1).unwrap();
    assert!(!text(&out).contains(key_line), "the etcd client key was printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_replica_cluster_to_local_store() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    let out = env.hcp_dr(
        &["backup", "--hosted-cluster", "demo", "-n", "clusters", "-o", "json", "--to", store.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let url = report["backup"].as_str().unwrap();
    let folder = PathBuf::from(url.strip_prefix("file://").unwrap());
    check_backup(&env, &folder, 1).await;
    env.assert_in_service("after the backup").await;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(folder.join("objects.tar.gz")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the objects archive holds secrets");

    // On a terminal the snapshot's stages show the bytes streamed and their rate.
    let (status, drawn) = env.on_a_terminal(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap()]);
    assert!(status.success(), "{drawn}");
    let finished = finished_lines(&drawn, "snapshot-finish");
    assert!(finished.iter().any(|line| line.contains("B at ") && line.trim_end().ends_with("B/s")), "snapshot-finish's line shows no bytes and rate:\n{drawn}");

    // The same through the API server's pods/portforward instead of pod IPs.
    let out = env.hcp_dr(
        &["backup", "--hosted-cluster", "demo", "-o", "json", "--etcd-access", "port-forward", "--to", store.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let folder = PathBuf::from(report["backup"].as_str().unwrap().strip_prefix("file://").unwrap());
    check_backup(&env, &folder, 1).await;
    env.assert_in_service("after the port-forward backup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dry_run_plans_from_the_live_cluster_and_changes_nothing() {
    let env = env("HighlyAvailable").await;
    let store = env.local_store();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--dry-run", "--to", store.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("backup plan (dry run: nothing was changed)"), "{}", text(&out));
    assert!(stdout.contains("scale Deployment clusters-demo/kube-apiserver to 0"), "{}", text(&out));
    assert!(stdout.contains("stream a snapshot of etcd-2"), "preflight ran for real and found 3 members: {}", text(&out));
    assert!(stdout.contains("set spec.pausedUntil on NodePool clusters/demo-workers"), "{}", text(&out));
    env.assert_in_service("after a dry run").await;
    assert!(files(&store).is_empty());
    assert!(files(&env.dir.path().join("state")).is_empty(), "a dry run writes no journal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_after_any_stage_is_undone() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    for stage in ["lock", "preflight", "pause", "scale-down", "etcd-snapshot", "volume-snapshot", "resume", "export", "snapshot-finish", "volume-copy", "package"] {
        let out = env.hcp_dr(
            &["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--wait-timeout", "60s"],
            &[("HCP_DR_TEST_FAIL_AFTER", stage)],
        );
        if out.status.code() != Some(1) || !String::from_utf8_lossy(&out.stdout).contains(&format!("FAILED at `{stage}`")) {
            let pods = Api::<Pod>::namespaced(env.mgmt.clone(), &env.hcp_ns()).list(&ListParams::default()).await.unwrap();
            for p in pods.items {
                eprintln!("pod {} labels {:?} deleting {:?} phase {:?}", p.metadata.name.unwrap_or_default(), p.metadata.labels, p.metadata.deletion_timestamp, p.status.and_then(|s| s.phase));
            }
        }
        assert_eq!(out.status.code(), Some(1), "{stage}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&format!("backup FAILED at `{stage}`")), "{stage}: {}", text(&out));
        assert!(stdout.contains("everything it changed was undone"), "{stage}: {}", text(&out));
        env.assert_in_service(&format!("after a failure in {stage}")).await;
        let left = files(&store);
        assert!(left.is_empty(), "{stage}: a failed backup left files: {left:?}");
    }
}

/// Wait until the journal records that `stage` started.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_after_the_snapshots_started_retakes_them_before_the_writers_return() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    let journal = env.dir.path().join("backup.jsonl");
    let args = ["backup", "--hosted-cluster", "demo", "--journal", journal.to_str().unwrap(), "--to", store.to_str().unwrap()];
    // etcd-snapshot succeeded (streams started in the background), then the process dies
    let mut child = env
        .command(&args, &[("HCP_DR_TEST_HOLD_IN", "resume")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_stage(&journal, "resume");
    child.kill().unwrap(); // SIGKILL: the streams die with it
    child.wait().unwrap();
    assert!(env.writer_replicas().await.iter().all(|(_, r)| *r == 0), "the writers are still stopped");

    let out = env.hcp_dr(&["backup", "--resume", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert!(text(&out).contains("taking them again before the writers come back"), "{}", text(&out));
    let folder = PathBuf::from(report["backup"].as_str().unwrap().strip_prefix("file://").unwrap());
    check_backup(&env, &folder, 1).await;
    env.assert_in_service("after the resumed backup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_the_snapshot_then_resume_finishes_the_backup() {
    let env = env("HighlyAvailable").await;
    let journal = env.dir.path().join("backup.jsonl");
    let mut args: Vec<String> = ["backup", "--hosted-cluster", "demo", "--journal", journal.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(env.s3_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = env
        .command(&args, &[("HCP_DR_TEST_HOLD_IN", "etcd-snapshot")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_stage(&journal, "etcd-snapshot");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // The crash left the cluster paused (until a deadline) and scaled down; the journal says so.
    let paused = env.paused_until().await;
    assert!(paused.iter().all(|p| p.as_str().is_some_and(|s| s.ends_with('Z'))), "paused with a deadline: {paused:?}");
    assert!(env.writer_replicas().await.iter().all(|(_, r)| *r == 0));

    let out = env.hcp_dr(&["backup", "--resume", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let statuses: Vec<Value> = report["stages"].as_array().unwrap().iter().map(|s| json!([s["name"], s["status"]])).collect();
    assert_eq!(statuses[0], json!(["lock", "resumed"]), "{statuses:?}");
    assert_eq!(statuses[3], json!(["scale-down", "resumed"]), "{statuses:?}");
    assert_eq!(statuses[4], json!(["etcd-snapshot", "succeeded"]), "{statuses:?}");
    check_backup(&env, &s3_folder(&env, &report), 3).await;
    env.assert_in_service("after the resumed backup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_during_the_snapshot_undoes_everything() {
    let env = env("SingleReplica").await;
    let journal = env.dir.path().join("backup.jsonl");
    let store = env.local_store();
    let child = env
        .command(
            &["backup", "--hosted-cluster", "demo", "--journal", journal.to_str().unwrap(), "--to", store.to_str().unwrap()],
            &[("HCP_DR_TEST_HOLD_IN", "etcd-snapshot")],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_stage(&journal, "etcd-snapshot");
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("interrupted by SIGTERM"), "{}", text(&out));
    env.assert_in_service("after SIGTERM").await;
    assert!(files(&store).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_backup_of_the_same_cluster_is_refused() {
    let env = env("SingleReplica").await;
    let leases = hcp_dr_e2e::sandbox::api_for(
        &env.mgmt,
        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"namespace": "clusters"}}),
    );
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "hcp-dr-lock-demo", "namespace": "clusters"},
        "spec": {"holderIdentity": "hcp-dr@other-host/pid-42", "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now}
    }))
    .unwrap();
    leases.create(&Default::default(), &lease).await.unwrap();
    let store = env.local_store();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("locked by another run: holder `hcp-dr@other-host/pid-42`"), "{}", text(&out));
    assert!(env.paused_until().await.iter().all(Value::is_null));
    assert!(leases.get("hcp-dr-lock-demo").await.is_ok(), "the other run's lock is left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_inputs_fail_clearly_and_change_nothing() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    let store = store.to_str().unwrap();

    let out = env.hcp_dr(&["backup", "--hosted-cluster", "nope", "--to", store], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("HostedCluster clusters/nope not found"), "{}", text(&out));

    let out = env.hcp_dr(
        &["backup", "--hosted-cluster", "demo", "--to", "s3://hcp-dr-backups/x", "--s3-endpoint", "https://127.0.0.1:9"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("the store s3://hcp-dr-backups/x cannot be used"), "{}", text(&out));

    let bad = env.dir.path().join("bad.yaml");
    std::fs::write(&bad, "operation: backup\nstages:\n  - name: lock\n  - name: snapshop\n").unwrap();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store, "--playbook", bad.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("line 4: unknown stage `snapshop`"), "{}", text(&out));

    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store, "--pause-ttl", "soon"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    env.assert_in_service("after bad inputs").await;
    assert!(files(&env.local_store()).is_empty());

    // Missing TLS material: pause the cluster so the operator does not put the secret back.
    let hc_api = hcp_dr_e2e::sandbox::api_for(
        &env.mgmt,
        &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}),
    );
    hc_api
        .patch("demo", &Default::default(), &kube::api::Patch::Merge(json!({"spec": {"pausedUntil": "true"}})))
        .await
        .unwrap();
    // Wait until the operator has seen the pause, or a reconcile under way puts the secret back.
    let start = Instant::now();
    loop {
        let hc = serde_json::to_value(hc_api.get("demo").await.unwrap()).unwrap();
        let acknowledged = hc["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "ReconciliationActive" && c["status"] == "False"));
        if acknowledged {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the operator never acknowledged the pause");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Api::<Secret>::namespaced(env.mgmt.clone(), &env.hcp_ns())
        .delete("etcd-client-tls", &Default::default())
        .await
        .unwrap();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no etcd client TLS material"), "{}", text(&out));
    assert_eq!(env.paused_until().await[0], json!("true"), "the user's pause is untouched");
    let _ = ListParams::default();
}
