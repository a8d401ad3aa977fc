//! Compressed backups (`backup --compression`, zstd by default) on the
//! sandbox, on a Kubernetes-shaped fill written through the hosted API: the
//! snapshot shrinks, the backup verifies, `sha256sum -c` holds, the
//! reference `zstd -d` gives back the raw snapshot the manifest records, and
//! the backup restores onto the other management cluster (a decompressed
//! copy staged for etcd's download) with every object back.

use crate::support;

use std::time::Duration;

use hcp_dr_e2e::drill::hosted_client;
use hcp_dr_e2e::sandbox::wait_available;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::Value;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compressed_backup_of_kubernetes_objects_verifies_and_restores_elsewhere() {
    let env = env("SingleReplica").await;
    let hosted = hosted_client(&env.mgmt, "clusters", "demo").await.expect("hosted client");
    let filled = hcp_dr_e2e::fill::kubernetes_objects(&hosted, "shop", 3 << 20, 8).await.expect("fill");
    assert!(filled.apps > 100, "{filled:?}");

    let store = env.local_store();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "-o", "json", "--to", store.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let folder = std::path::PathBuf::from(json_report(&out)["backup"].as_str().unwrap().strip_prefix("file://").unwrap());
    let manifest: Value = serde_json::from_slice(&std::fs::read(folder.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format_version"], 3, "{manifest:#}");
    assert_eq!(manifest["compression"]["algorithm"], "zstd", "{manifest:#}");
    let stored = manifest["etcd"][0]["size"].as_u64().unwrap();
    let raw = &manifest["compression"]["artifacts"][0];
    let ratio = raw["size"].as_u64().unwrap() as f64 / stored as f64;
    println!("{} apps, {} objects, {} bytes of JSON: snapshot {} -> {stored} bytes, {ratio:.2}x", filled.apps, filled.objects, filled.bytes, raw["size"]);
    assert!(ratio > 2.0, "Kubernetes objects compress: {ratio:.2}x ({manifest:#})");

    // the stored bytes check with sha256sum; the reference zstd gives back the raw snapshot
    let sums = std::process::Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(&folder).output().expect("sha256sum");
    assert!(sums.status.success(), "sha256sum -c: {}", text(&sums));
    let unzstd = env.dir.path().join("raw.db");
    let out = std::process::Command::new("zstd").args(["-d", "-q", "-o"]).arg(&unzstd).arg(folder.join("etcd/etcd-0.db")).output().expect("zstd");
    assert!(out.status.success(), "zstd -d: {}", text(&out));
    let bytes = std::fs::read(&unzstd).unwrap();
    assert_eq!(bytes.len() as u64, raw["size"].as_u64().unwrap());
    assert_eq!(format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&bytes)), raw["sha256"].as_str().unwrap());

    let backup = folder.to_str().unwrap().to_string();
    let out = env.hcp_dr(&["backups", "verify", &backup, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json_report(&out)["snapshots"][0]["verdict"], "OK", "{}", text(&out));
    let out = env.hcp_dr(&["backups", "describe", &backup], &[]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("compressed: zstd level 1"), "{}", text(&out));

    // restored on mgmt-b from a decompressed copy staged in S3, then deleted
    retire_source(&env).await;
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let staging = format!("s3://{}/staging", hcp_dr_e2e::sandbox::BUCKET);
    let endpoint = env.sandbox.s3.https_url().to_string();
    // killed as `snapshot-url` starts and resumed: the resumed run has no
    // checked copy and stages by decompressing from the store
    let journal = env.dir.path().join("compressed-restore.jsonl");
    let restore = ["restore", "--from", &backup, "--kubeconfig", &kubeconfig_b, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint, "--wait", "5m", "--journal", journal.to_str().unwrap()];
    kill_in(&env, &restore, &journal, "snapshot-url");
    let out = env.hcp_dr(&["restore", "--resume", journal.to_str().unwrap(), "--kubeconfig", &kubeconfig_b, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let url = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "snapshot-url").unwrap()["output"];
    assert_eq!(url["staged"], true, "{url}");
    assert!(url.get("from_checked_copy").is_none(), "a resumed run has no checked copy to stage from: {url}");
    let staged = env.sandbox.s3.root().join(hcp_dr_e2e::sandbox::BUCKET).join("staging").join(url["key"].as_str().unwrap());
    assert!(!staged.exists(), "the decompressed copy {} was not deleted", staged.display());
    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    wait_available(&b, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");
    let hosted_b = hosted_client(&b, "clusters", "demo").await.expect("hosted client on mgmt-b");
    let configmaps = Api::<ConfigMap>::namespaced(hosted_b, "shop").list(&Default::default()).await.expect("list");
    assert_eq!(configmaps.items.len(), filled.apps, "every app's ConfigMap is back");
}
