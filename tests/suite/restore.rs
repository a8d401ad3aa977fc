//! `hcp-dr restore` on the sandbox: a backup of `demo` taken on mgmt-a is
//! replayed onto mgmt-b and serves the same data, while the copy on mgmt-a
//! still serves at its own address (a partition: the restore reads only the
//! store), and the store fence then refuses mgmt-a's backups; damaged
//! backups, leftover etcd volumes and bad input are refused before anything
//! changes.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hcp_dr_e2e::drill::{WORKLOAD_NS, WORKLOAD_OBJECTS, hosted_client, hosted_server};
use hcp_dr_e2e::sandbox::{api_for, wait_available};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Secret};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::*;

fn mgmt_b(env: &Env) -> &Path {
    &env.sandbox.clusters[1].kubeconfig
}

async fn mgmt_b_client(env: &Env) -> kube::Client {
    env.sandbox.clusters[1].api.client().await.expect("mgmt-b client")
}

async fn hc_exists(client: &kube::Client) -> bool {
    let hc = api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    hc.get_opt("demo").await.expect("get HC").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_from_s3_restores_onto_another_management_cluster() {
    let env = env("HighlyAvailable").await;
    let (folder, revision) = backup_to_s3(&env);
    // mgmt-a's copy keeps serving throughout: mgmt-b cannot reach it (a
    // partition), and the restore needs nothing but the store

    // dry-run: read-only stages run, nothing is created
    let endpoint = env.sandbox.s3.https_url().to_string();
    let kubeconfig_b = mgmt_b(&env).to_str().unwrap().to_string();
    let out = env.hcp_dr(&["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--dry-run"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("create HostedCluster clusters/demo"), "{}", text(&out));
    let b = mgmt_b_client(&env).await;
    assert!(!hc_exists(&b).await, "dry-run created the HostedCluster");
    // the snapshots are compressed (the default): snapshot verify reads one as it is stored
    let out = env.hcp_dr(&["snapshot", "verify", &format!("{folder}/etcd/etcd-0.db"), "--s3-endpoint", &endpoint], &[]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(": OK"), "{}", text(&out));
    // on a terminal, the dry-run's verify (it reads the whole backup) shows the bytes it read and their rate
    let (status, drawn) = env.on_a_terminal(&["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--dry-run"]);
    assert!(status.success(), "{drawn}");
    let verify = finished_lines(&drawn, "verify");
    assert!(verify.iter().any(|line| line.contains("B at ") && line.trim_end().ends_with("B/s")), "verify's line shows no bytes and rate:\n{drawn}");

    // a failure after `apply` stops with everything in place; --abort removes it
    let restore_args = ["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--wait", "5m", "-o", "json"];
    let out = env.hcp_dr(&restore_args, &[("HCP_DR_TEST_FAIL_AFTER", "apply")]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let stopped = json_report(&out);
    assert_eq!(stopped["outcome"], "stopped", "{stopped:#}");
    // the compressed snapshot was staged from the copy verify checked, not downloaded and decompressed again
    let url = &stopped["stages"].as_array().unwrap().iter().find(|s| s["name"] == "snapshot-url").unwrap()["output"];
    assert_eq!((&url["staged"], &url["from_checked_copy"]), (&Value::Bool(true), &Value::Bool(true)), "{url}");
    assert!(hc_exists(&b).await, "the stop undid the restore");
    let journal = stopped["journal"].as_str().unwrap().to_string();
    let out = env.hcp_dr(&["restore", "--abort", &journal, "--kubeconfig", &kubeconfig_b], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!hc_exists(&b).await, "--abort left the HostedCluster");
    let namespaces_b: Api<Namespace> = Api::all(b.clone());
    for ns in ["clusters", "clusters-demo"] {
        assert!(namespaces_b.get_opt(ns).await.unwrap().is_none(), "--abort left namespace {ns}");
    }

    // stopped again, then --resume finishes it
    let out = env.hcp_dr(&restore_args, &[("HCP_DR_TEST_FAIL_AFTER", "apply")]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let journal = json_report(&out)["journal"].as_str().unwrap().to_string();
    let out = env.hcp_dr(&["restore", "--resume", &journal, "--kubeconfig", &kubeconfig_b, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    // verify read each byte of the backup once (the snapshot it reads offline is the copy it hashed)
    let verify = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "verify").unwrap()["output"];
    let (checked, read) = (verify["bytes_checked"].as_u64().unwrap(), verify["bytes_read"].as_u64().unwrap());
    println!("verify read {read} bytes for {checked} bytes of artifacts: {:.3}x", read as f64 / checked as f64);
    // besides the artifacts only the manifest is read (twice: resolving and
    // checking), less than the snapshot: it was not downloaded twice
    let best = format!("etcd/{}.db", verify["snapshot"]["member"].as_str().unwrap());
    let snapshot_stored = verify["manifest"]["artifacts"].as_array().unwrap().iter().find(|a| a["name"] == best.as_str()).unwrap()["size"].as_u64().unwrap();
    assert!(read >= checked && read - checked < snapshot_stored, "verify read {read} bytes for {checked} bytes of artifacts: {verify:#}");
    // and only the snapshot it restores: the two others are found, not read
    let restored = verify["snapshot"]["member"].as_str().unwrap();
    let not_read: Vec<&str> = verify["not_read"].as_array().expect("not_read").iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(not_read.len(), 2, "{verify:#}");
    assert!(not_read.iter().all(|artifact| artifact.starts_with("etcd/") && !artifact.contains(restored)), "{verify:#}");
    // the RPO: the backup's age when restored (writes after it are lost)
    assert!(report["backup_taken"].as_str().is_some_and(|t| t.starts_with("20")), "{report:#}");
    assert!(report["backup_age_seconds"].as_i64().is_some_and(|age| age >= 0), "{report:#}");
    let wait = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "wait").unwrap()["output"];
    assert_eq!(wait["backup_revision"].as_i64(), Some(revision));
    let revisions = wait["revisions"].as_object().expect("revisions");
    assert_eq!(revisions.len(), 3, "{wait}");
    assert!(revisions.values().all(|r| r.as_i64().unwrap() >= revision), "{wait}");
    // the presigned URL's signature is never printed
    assert!(!text(&out).contains("X-Amz-Signature"), "{}", text(&out));

    // the restored cluster serves the backup's data, from one etcd cluster
    wait_available(&b, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");
    assert_one_etcd_cluster(&b, &env.hcp_ns(), 3, "after the restore").await;
    let hosted = hosted_client(&b, "clusters", "demo").await.expect("hosted client on mgmt-b");
    let cms = Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS).list(&Default::default()).await.expect("configmaps");
    let secrets = Api::<Secret>::namespaced(hosted, WORKLOAD_NS).list(&Default::default()).await.expect("secrets");
    assert_eq!(cms.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("config-"))).count(), WORKLOAD_OBJECTS);
    assert_eq!(secrets.items.iter().filter(|s| s.metadata.name.as_deref().is_some_and(|n| n.starts_with("secret-"))).count(), WORKLOAD_OBJECTS);
    // the HostedCluster carries the URL and where it came from, and no pause
    let hc = api_for(&b, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    let hc = serde_json::to_value(hc.get("demo").await.unwrap()).unwrap();
    assert!(hc.pointer("/spec/etcd/managed/storage/restoreSnapshotURL/0").and_then(Value::as_str).is_some_and(|u| u.starts_with("https://")));
    assert!(hc["spec"].get("pausedUntil").is_none(), "the backup's pause travelled: {}", hc["spec"]);
    assert!(hc["metadata"]["annotations"]["hcp-dr.openshift.io/restored-from"].as_str().is_some_and(|f| f.ends_with(folder.rsplit('/').next().unwrap())));

    // both copies serve, each at its own management cluster's address: they
    // diverge, and the store fence keeps the stale one's backups out
    let a_api = hosted_server(&env.mgmt, "clusters", "demo").await.unwrap();
    let b_api = hosted_server(&b, "clusters", "demo").await.unwrap();
    assert_ne!(a_api, b_api, "both copies name one hosted API address");
    let on_a: Api<ConfigMap> = Api::namespaced(env.hosted.clone(), WORKLOAD_NS);
    on_a.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "written-on-a-after-the-restore"}})).unwrap())
        .await
        .expect("mgmt-a's copy still serves after the restore");
    let on_b: Api<ConfigMap> = Api::namespaced(hosted_client(&b, "clusters", "demo").await.unwrap(), WORKLOAD_NS);
    assert!(on_b.get_opt("written-on-a-after-the-restore").await.unwrap().is_none(), "a write on mgmt-a's copy reached mgmt-b's");
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(json_report(&out)["error"].as_str().is_some_and(|e| e.contains("the store is fenced")), "{}", text(&out));

    // a second restore of the same backup is refused: the cluster exists
    let out = env.hcp_dr(&["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("already exists on the destination"), "{}", text(&out));
}

/// Copy the local store and change one byte of `file` in the copy.
fn tampered_copy(store: &Path, backup: &Path, file: &str, dest: &Path) -> PathBuf {
    let copy = dest.join(format!("tampered-{}", file.replace('/', "-")));
    let status = std::process::Command::new("cp").arg("-a").arg(store).arg(&copy).status().unwrap();
    assert!(status.success());
    let target = copy.join(backup.strip_prefix(store).unwrap()).join(file);
    let mut bytes = std::fs::read(&target).unwrap();
    let at = if file == "manifest.json" {
        // inside the first SHA-256 so the JSON stays valid
        let text = String::from_utf8_lossy(&bytes).to_string();
        text.find("\"sha256\": \"").unwrap() + 20
    } else {
        bytes.len() / 2
    };
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
    std::fs::write(&target, bytes).unwrap();
    copy.join(backup.strip_prefix(store).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_backups_leftover_volumes_and_bad_input_are_refused_before_any_change() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    // uncompressed: format version 1, as every backup before compression
    // was; the restore at the end proves such backups still restore
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "-o", "json", "--compression", "none", "--to", store.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let backup = PathBuf::from(report["backup"].as_str().unwrap().strip_prefix("file://").unwrap());
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(backup.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format_version"], 1, "{manifest:#}");
    assert!(manifest.get("compression").is_none(), "{manifest:#}");
    let kubeconfig_b = mgmt_b(&env).to_str().unwrap().to_string();
    let endpoint = env.sandbox.s3.https_url().to_string();
    let staging = format!("s3://{}/staging", hcp_dr_e2e::sandbox::BUCKET);
    let b = mgmt_b_client(&env).await;
    let namespaces: Api<Namespace> = Api::all(b.clone());

    for file in ["etcd/etcd-0.db", "objects.tar.gz", "manifest.json"] {
        let copy = tampered_copy(&store, &backup, file, env.dir.path());
        let out = env.hcp_dr(
            &["restore", "--from", copy.to_str().unwrap(), "--kubeconfig", &kubeconfig_b, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint],
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{file}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("restore FAILED at `verify`"), "{file}: {}", text(&out));
        assert!(stdout.contains("damaged or was tampered with"), "{file}: {}", text(&out));
        assert!(namespaces.get_opt("clusters").await.unwrap().is_none(), "{file}: the destination was changed");
    }

    // a local backup without a staging store: told how to give etcd a URL
    let out = env.hcp_dr(&["restore", "--from", backup.to_str().unwrap(), "--kubeconfig", &kubeconfig_b], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--stage-snapshot-to"), "{}", text(&out));

    // a namespace still Terminating (held here by an object's finalizer, on a
    // real cluster by pods' grace periods, PVC protection, ...) takes no new
    // object: refused, with what to wait for
    let held: Namespace = serde_json::from_value(json!({"metadata": {"name": "clusters"}})).unwrap();
    namespaces.create(&PostParams::default(), &held).await.unwrap();
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(b.clone(), "clusters");
    let cm = serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["hcp-dr.test/hold"]}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    namespaces.delete("clusters", &Default::default()).await.unwrap();
    let out = env.hcp_dr(
        &["restore", "--from", backup.to_str().unwrap(), "--kubeconfig", &kubeconfig_b, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Namespace clusters is being deleted (Terminating) on the destination"), "{}", text(&out));
    // and the namespace says what holds it, as the namespace controller does
    let terminating = namespaces.get("clusters").await.unwrap();
    let said: Vec<String> = terminating.status.unwrap().conditions.unwrap_or_default().into_iter().filter(|c| c.status == "True").filter_map(|c| c.message).collect();
    assert!(said.iter().any(|m| m == "Some content in the namespace has finalizers remaining: hcp-dr.test/hold in 1 resource instances"), "{said:?}");
    assert!(said.iter().any(|m| m == "Some resources are remaining: configmaps. has 1 resource instances"), "{said:?}");
    cms.patch("held", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    let start = std::time::Instant::now();
    while namespaces.get_opt("clusters").await.unwrap().is_some() {
        assert!(start.elapsed() < Duration::from_secs(30), "namespace clusters still there");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // leftover etcd volumes would silently defeat the restore: refused
    let hcp_ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "clusters-demo"}})).unwrap();
    namespaces.create(&PostParams::default(), &hcp_ns).await.unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "data-etcd-0"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Gi"}}}})).unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(b.clone(), "clusters-demo");
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let out = env.hcp_dr(
        &["restore", "--from", backup.to_str().unwrap(), "--kubeconfig", &kubeconfig_b, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("leftover etcd volumes in clusters-demo: data-etcd-0"), "{}", text(&out));
    assert!(stdout.contains("--clean-leftovers"), "{}", text(&out));
    assert!(namespaces.get_opt("clusters").await.unwrap().is_none(), "the destination was changed");
    assert!(pvcs.get_opt("data-etcd-0").await.unwrap().is_some(), "the leftover PVC was deleted without --clean-leftovers");

    // with --clean-leftovers the volume goes and the restore (from the local
    // store, its snapshot staged in S3) completes; the staged copy is deleted
    retire_source(&env).await;
    let out = env.hcp_dr(
        &["restore", "--from", backup.to_str().unwrap(), "--kubeconfig", &kubeconfig_b, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint, "--clean-leftovers", "--wait", "5m", "-o", "json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let applied = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "apply").unwrap()["output"];
    assert_eq!(applied["deleted_leftovers"], json!(["data-etcd-0"]), "{applied}");
    let url = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "snapshot-url").unwrap()["output"];
    assert_eq!(url["staged"], true, "{url}");
    let staged = env.sandbox.s3.root().join(hcp_dr_e2e::sandbox::BUCKET).join("staging").join(url["key"].as_str().unwrap());
    assert!(!staged.exists(), "the staged snapshot copy {} was not deleted", staged.display());
    wait_available(&b, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");

    // bad input: exit 2 with what to do
    for (args, expect) in [
        (vec!["restore", "--from", "s3://bucket"], "--backup-id"),
        (vec!["restore", "--from", "s3://bucket/clusters/demo/not-an-id", "--backup-id", "nope", "--hosted-cluster", "demo"], "is not of the form"),
        (vec!["restore", "--from", "/tmp/x/clusters/demo/20261121T180000Z-0a1b2c", "--presign-ttl", "10s"], "--presign-ttl"),
        (vec!["restore", "--from", "/tmp/x/clusters/demo/20261121T180000Z-0a1b2c", "--stage-snapshot-to", "/tmp/y"], "must be an S3 store"),
        (vec!["restore", "--from", "/tmp/x/clusters/demo/latest", "--kubeconfig", &kubeconfig_b], "no complete backup"),
    ] {
        let out = env.hcp_dr(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(expect), "{args:?}: {}", text(&out));
    }
}
