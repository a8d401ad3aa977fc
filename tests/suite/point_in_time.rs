//! Point-in-time restore (`restore --at`, `drill --at`) on the sandbox
//! (HighlyAvailable, the shipped etcd-init): ConfigMaps are written through
//! the hosted API at known instants while `hcp-dr stream` runs (its chain
//! based on the regular backup taken just before, `--base-from-backup`),
//! and the
//! NodePool is scaled on the management cluster before and after one of
//! them; the cluster is then restored onto the other management cluster
//! at an instant between two writes and holds exactly the writes before
//! it, as one etcd cluster, with the NodePool as it was then (the stream's
//! object set, not the older backup's). Around it: points that cannot be
//! restored (before the stream, in the future, a backup named too) are
//! refused with exit 2 and change nothing; the point-in-time backup is
//! listed, verifies, and is not `latest`; a drill of the newest durable
//! revision passes its checks. `migrate --at` moves a live cluster to
//! mgmt-b as it was at a point: the source stopped and backed up, torn
//! down, the destination with exactly the writes before the point.

use std::time::Duration;

use chrono::Utc;
use hcp_dr_e2e::drill::hosted_client;
use hcp_dr_e2e::sandbox::wait_available;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::stream::Streaming;
use crate::support::{self, Env, json_report, text};

/// Create ConfigMap `name` in the workload namespace through the hosted API.
async fn create(hosted: &kube::Client, name: &str) {
    let api: Api<ConfigMap> = Api::namespaced(hosted.clone(), hcp_dr_e2e::drill::WORKLOAD_NS);
    let cm: ConfigMap = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"written": Utc::now().to_rfc3339()}})).unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// The ConfigMaps [`create`] wrote (`before-*`, `after-*`) that demo on
/// `mgmt` holds, through its hosted API.
async fn written(mgmt: &kube::Client) -> Vec<String> {
    let hosted = hosted_client(mgmt, "clusters", "demo").await.expect("hosted client");
    Api::<ConfigMap>::namespaced(hosted, hcp_dr_e2e::drill::WORKLOAD_NS)
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|n| n.starts_with("before-") || n.starts_with("after-"))
        .collect()
}

/// The backup folders of demo in the local store (complete or not).
fn backup_folders(env: &Env) -> Vec<String> {
    let dir = env.local_store().join("clusters/demo");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().to_string()).filter(|n| hcp_dr::archive::parse_backup_id(n).is_ok()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_point_between_two_writes_is_restored_onto_the_other_management_cluster() {
    let env = support::env("HighlyAvailable").await;
    let store = env.local_store();
    let store_arg = store.to_str().unwrap().to_string();
    let hosted = hosted_client(&env.mgmt, "clusters", "demo").await.expect("hosted client");
    let regular = support::backup_to_local(&env);
    let regular_id = regular.file_name().unwrap().to_string_lossy().to_string();

    // writes at known instants while the stream runs, and the NodePool
    // scaled on the management cluster before and after that instant
    let pools = support::np_api(&env.mgmt, "clusters");
    let pool = pools.list(&Default::default()).await.expect("NodePools").items.into_iter().next().expect("a NodePool");
    let pool_name = pool.metadata.name.clone().unwrap();
    let replicas = pool.data["spec"]["replicas"].as_i64().expect("replicas");
    let scale = |to: i64| {
        let (pools, pool_name) = (pools.clone(), pool_name.clone());
        async move {
            let patch = kube::api::Patch::Merge(json!({"spec": {"replicas": to}}));
            pools.patch(&pool_name, &Default::default(), &patch).await.expect("scale the NodePool");
        }
    };
    // the chain starts from that backup's snapshot: etcd is not asked for one
    let mut streaming = Streaming::start_with(&env, &store, &[("HCP_DR_OBJECTS_INTERVAL", "1s"), ("HCP_DR_BASE_FROM_BACKUP", "true")]);
    streaming.wait_for("started at base revision", Duration::from_secs(120));
    streaming.wait_for("objects changed, set", Duration::from_secs(60));
    create(&hosted, "before-1").await;
    scale(replicas + 1).await;
    streaming.wait_for("objects changed, set", Duration::from_secs(60));
    create(&hosted, "before-2").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let between = Utc::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    create(&hosted, "after-1").await;
    scale(replicas + 2).await;
    streaming.wait_for("objects changed, set", Duration::from_secs(60));
    create(&hosted, "after-2").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, report) = streaming.term();
    assert!(status.success(), "{report:#}");
    let durable = report["clusters"][0]["last_durable_revision"].as_i64().unwrap();
    let chain_id = report["clusters"][0]["chains"][0]["chain_id"].as_str().unwrap().to_string();
    let descriptor: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("clusters/demo/stream").join(&chain_id).join("chain.json")).unwrap()).unwrap();
    assert_eq!((descriptor["base"]["how"].as_str(), descriptor["base"]["backup_id"].as_str()), (Some("backup"), Some(regular_id.as_str())), "{descriptor:#}");

    // points that cannot be restored: exit 2, nothing written, nothing on mgmt-b
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let folders = backup_folders(&env);
    let future = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    for (args, says) in [
        (vec!["--at", future.as_str()], "the windows that can:"),
        (vec!["--at-revision", "1"], "the windows that can:"),
        (vec!["--at", future.as_str(), "--backup-id", "latest"], "cannot be used with"),
    ] {
        let mut all = vec!["restore", "--from", &store_arg, "--hosted-cluster", "demo", "--kubeconfig", &kubeconfig_b];
        all.extend(args.iter().copied());
        let out = env.hcp_dr(&all, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    let backup_url = regular.to_str().unwrap().to_string();
    let out = env.hcp_dr(&["restore", "--from", &backup_url, "--at", &between.to_rfc3339(), "--kubeconfig", &kubeconfig_b], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("give --from the store's URL"), "{}", text(&out));
    env.assert_in_service("after the refused points").await;
    assert_eq!(backup_folders(&env), folders, "a refused point wrote nothing");
    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    assert!(support::hc_on(&b).await.is_none(), "nothing was created on mgmt-b");

    // the point verifies (replayed and checked, nothing kept); a future one does not
    let stream_url = format!("{store_arg}/clusters/demo/stream");
    let out = env.hcp_dr(&["backups", "verify", &stream_url, "--at", &between.to_rfc3339(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let checked = json_report(&out)["revision"].as_i64().unwrap();
    let out = env.hcp_dr(&["backups", "verify", &stream_url, "--at", &future], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("the windows that can:"), "{}", text(&out));

    // the point between the writes, onto mgmt-b, the source gone
    // (the seeding pods download the snapshot: a copy staged in S3)
    support::retire_source(&env).await;
    let staging = format!("s3://{}/staging", hcp_dr_e2e::sandbox::BUCKET);
    let endpoint = env.sandbox.s3.https_url().to_string();
    let at = between.to_rfc3339();
    let out = env.hcp_dr(
        &["restore", "--from", &store_arg, "--hosted-cluster", "demo", "--at", &at, "--kubeconfig", &kubeconfig_b, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint, "--dry-run"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("dry run: not replayed; a real run restores etcd at that point with the objects of the stream's object set") && said.contains(&format!("the cluster's identity from backup {regular_id}")), "{said}");
    assert_eq!(backup_folders(&env), folders, "a dry run wrote nothing");
    let out = env.hcp_dr(
        &["restore", "--from", &store_arg, "--hosted-cluster", "demo", "--at", &at, "--kubeconfig", &kubeconfig_b, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint, "--wait", "5m", "-o", "json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let restored = json_report(&out);
    let point = &restored["point_in_time"];
    let revision = point["revision"].as_i64().unwrap();
    assert_eq!(revision, checked, "backups verify --at checked the point restore took");
    assert!(revision < durable, "{point:#}");
    assert_eq!(point["objects_from"], regular_id.as_str(), "{point:#}");
    assert!(point["later_revisions"].as_i64().unwrap() >= 2, "the two later writes are not restored: {point:#}");
    assert_eq!(point["dry_run"], false);
    let pit_id = point["backup_id"].as_str().unwrap().to_string();
    assert!(restored["backup"].as_str().unwrap().ends_with(&pit_id), "{restored:#}");
    assert!(restored["rpo_seconds"].is_null() || restored["backup_age_seconds"].as_i64().is_some(), "{restored:#}");

    wait_available(&b, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");
    support::assert_one_etcd_cluster(&b, &env.hcp_ns(), 3, "a point-in-time restore").await;
    let names = written(&b).await;
    assert_eq!(names, ["before-1", "before-2"], "exactly the writes before {between}");
    // the management-cluster objects as they were then: the stream's set
    assert!(point["object_set"].as_str().is_some_and(|s| s.ends_with(".tar.gz")), "{point:#}");
    let restored_pool = support::np_api(&b, "clusters").get(&pool_name).await.expect("NodePool on mgmt-b");
    assert_eq!(restored_pool.data["spec"]["replicas"].as_i64(), Some(replicas + 1), "the NodePool as it was at {between}");

    // the point-in-time backup: listed as such, verifies, never `latest`
    let listed = env.hcp_dr(&["backups", "list", "--store", &store_arg, "-o", "json"], &[]);
    assert!(listed.status.success(), "{}", text(&listed));
    let listed = json_report(&listed);
    let entry = listed.as_array().unwrap().iter().find(|b| b["backup_id"] == pit_id.as_str()).unwrap_or_else(|| panic!("{pit_id} not listed: {listed:#}"));
    assert_eq!(entry["point_in_time"]["revision"], revision, "{entry:#}");
    let pit_folder = store.join("clusters/demo").join(&pit_id);
    let out = env.hcp_dr(&["backups", "verify", pit_folder.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = env.hcp_dr(&["backups", "describe", &format!("{store_arg}/clusters/demo/latest")], &[]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&regular_id), "latest is the regular backup: {}", text(&out));

    // a segment damaged: a restore through it is refused, saying how far the chain goes
    let mut segments: Vec<std::path::PathBuf> = support::files(&store).into_iter().filter(|f| f.ends_with(".seg")).map(|f| store.join(f)).collect();
    segments.sort();
    let victim = segments.last().unwrap().clone();
    let original = std::fs::read(&victim).unwrap();
    let mut bytes = original.clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x08;
    std::fs::write(&victim, bytes).unwrap();
    let folders = backup_folders(&env);
    let out = env.hcp_dr(&["restore", "--from", &store_arg, "--hosted-cluster", "demo", "--at-revision", &durable.to_string(), "--kubeconfig", &kubeconfig_b, "--overwrite"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("damaged or altered") && text(&out).contains("the chain restores through revision"), "{}", text(&out));
    assert_eq!(backup_folders(&env), folders, "a refused point wrote nothing");
    std::fs::write(&victim, original).unwrap();

    // a drill of the newest durable revision onto mgmt-a (text report)
    let kubeconfig_a = env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string();
    let durable_arg = durable.to_string();
    let out = env.hcp_dr(
        &["drill", "--from", &store_arg, "--hosted-cluster", "demo", "--at-revision", &durable_arg, "--kubeconfig", &kubeconfig_a, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint, "--wait", "5m"],
        &[],
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", text(&out));
    assert!(said.contains(&format!("point in time: revision {durable} -> revision {durable}")) && said.contains("0 later revision(s)"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_at_moves_the_cluster_as_it_was_at_the_point() {
    let env = support::env("SingleReplica").await;
    let store = env.local_store();
    let store_arg = store.to_str().unwrap().to_string();
    let hosted = hosted_client(&env.mgmt, "clusters", "demo").await.expect("hosted client");
    let regular = support::backup_to_local(&env);
    let regular_id = regular.file_name().unwrap().to_string_lossy().to_string();
    // objects read every hour: only the watch can record the NodePool's change in time
    let mut streaming = Streaming::start_with(&env, &store, &[("HCP_DR_OBJECTS_INTERVAL", "1h")]);
    streaming.wait_for("started at base revision", Duration::from_secs(120));
    streaming.wait_for("objects changed, set", Duration::from_secs(60));
    let pools = support::np_api(&env.mgmt, "clusters");
    let pool = pools.list(&Default::default()).await.expect("NodePools").items.into_iter().next().expect("a NodePool");
    let pool_name = pool.metadata.name.clone().unwrap();
    let replicas = pool.data["spec"]["replicas"].as_i64().expect("replicas");
    let patch = kube::api::Patch::Merge(json!({"spec": {"replicas": replicas + 1}}));
    pools.patch(&pool_name, &Default::default(), &patch).await.expect("scale the NodePool");
    streaming.wait_for("objects changed, set", Duration::from_secs(20));
    create(&hosted, "before-1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let between = Utc::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    create(&hosted, "after-1").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, report) = streaming.term();
    assert!(status.success(), "{report:#}");

    // the stream is in the local store: the destination's etcd downloads a copy staged in S3
    let mut args = support::migrate_json_args(&env);
    let via = args.iter().position(|a| a == "--via").unwrap() + 1;
    args[via] = store_arg.clone();
    args.extend(["--stage-snapshot-to".to_string(), format!("s3://{}/staging", hcp_dr_e2e::sandbox::BUCKET)]);
    let with = |extra: &[&str]| {
        let mut all: Vec<String> = args.clone();
        all.extend(extra.iter().map(|s| s.to_string()));
        all
    };
    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    // a point the stream cannot restore, an identity without a point: refused before the source is touched
    let folders = backup_folders(&env);
    for (extra, says) in [(vec!["--at-revision", "1"], "the windows that can:"), (vec!["--identity", "/nonexistent"], "--identity opens an encrypted stream")] {
        let all = with(&extra);
        let out = env.hcp_dr(&all.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{extra:?}: {}", text(&out));
    }
    env.assert_in_service("after the refused migrations").await;
    assert!(support::hc_on(&b).await.is_none(), "nothing was created on mgmt-b");
    assert_eq!(backup_folders(&env), folders, "a refused migration wrote nothing");

    let all = with(&["--at", &between.to_rfc3339()]);
    let out = env.hcp_dr(&all.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    let point = &report["point_in_time"];
    assert_eq!(point["objects_from"], regular_id.as_str(), "{point:#}");
    assert!(point["later_revisions"].as_i64().unwrap() >= 1, "the later write is not restored: {point:#}");
    let pit_id = point["backup_id"].as_str().unwrap().to_string();
    let point_stage = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "point-in-time").expect("the point-in-time stage ran");
    let source_revision = point_stage["output"]["source_revision"].as_i64().unwrap();
    assert!(source_revision > point["revision"].as_i64().unwrap(), "{point_stage:#}");

    // the source is gone; the destination holds exactly the write before the point
    assert!(support::hc_on(&env.mgmt).await.is_none(), "the source HostedCluster is still on mgmt-a");
    wait_available(&b, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");
    let names = written(&b).await;
    assert_eq!(names, ["before-1"], "exactly the writes before {between}");
    let restored_pool = support::np_api(&b, "clusters").get(&pool_name).await.expect("NodePool on mgmt-b");
    assert_eq!(restored_pool.data["spec"]["replicas"].as_i64(), Some(replicas + 1), "the NodePool as the watched change left it");
    // the writes after the point are kept: the migration's own backup, taken with the source stopped
    let now = backup_folders(&env);
    let own: Vec<&String> = now.iter().filter(|f| !folders.contains(f) && **f != pit_id).collect();
    assert_eq!(own.len(), 1, "the migration's own backup beside {pit_id}: {now:?}");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("clusters/demo").join(own[0]).join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["etcd"][0]["revision"].as_i64(), Some(source_revision), "{manifest:#}");
}
