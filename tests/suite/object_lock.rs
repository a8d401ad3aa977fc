//! S3 Object Lock (`backup --lock-for`) against moto, an S3 that enforces
//! Object Lock (it checks no signatures; s3s-fs does that elsewhere):
//! every object of a locked backup carries its retention, S3 refuses to
//! delete a version under it, `backups prune` keeps such a backup and says
//! until when, then removes every version of it once the retention has
//! ended; the store fence is written and rewritten beside locked backups;
//! a bucket without Object Lock is refused up front with nothing written.
//! `backups copy --lock-for` locks what it copies (and what it finds
//! there unlocked), not the result records; `backups list` and
//! `describe` show until when.

use crate::support;

use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use chrono::{DateTime, Utc};
use hcp_dr::archive::fence::{self, Fence};
use hcp_dr::archive::results::{self, Kind, ResultRecord};
use hcp_dr::archive::{Layout, ManagementCluster};
use hcp_dr::store::object_lock::{LockMode, ObjectLock};
use hcp_dr::store::{LocalStore, S3Options, S3Store, Store};
use hcp_dr_e2e::procs::route53::{ACCESS_KEY, REGION, Route53Endpoint, SECRET_KEY};
use serde_json::Value;
use support::*;

const LOCKED: &str = "locked-backups";
const PLAIN: &str = "plain-backups";

/// An S3 client of moto (path-style, its dummy credentials).
fn moto_client(url: &str) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .endpoint_url(url)
            .force_path_style(true)
            .credentials_provider(Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test"))
            .http_client(http)
            .build(),
    )
}

/// A bucket with Object Lock (so versioned) and one without.
async fn buckets(client: &Client) {
    client.create_bucket().bucket(LOCKED).object_lock_enabled_for_bucket(true).send().await.expect("create the locked bucket");
    client.create_bucket().bucket(PLAIN).send().await.expect("create the plain bucket");
}

/// moto started in `dir` with [`buckets`]: the endpoint (stopped when
/// dropped), its URL and a client.
async fn moto_with_buckets(dir: &std::path::Path) -> (Route53Endpoint, String, Client) {
    let moto = Route53Endpoint::start(&dir.join("moto")).await.expect("moto");
    let url = moto.url().to_string();
    let client = moto_client(&url);
    buckets(&client).await;
    (moto, url, client)
}

/// hcp-dr's store on moto's `bucket`, writing with `lock`.
async fn store(url: &str, bucket: &str, prefix: &str, lock: Option<ObjectLock>) -> S3Store {
    S3Store::connect(
        bucket.into(),
        prefix.into(),
        S3Options {
            endpoint: Some(url.to_string()),
            region: Some(REGION.into()),
            static_credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
            part_size: 5 << 20,
            object_lock: lock,
            ..S3Options::default()
        },
    )
    .await
    .expect("S3 store")
}

/// Every version (delete markers too) under `prefix` of `bucket`: `(key, version id)`.
async fn versions(client: &Client, bucket: &str, prefix: &str) -> Vec<(String, String)> {
    let listed = client.list_object_versions().bucket(bucket).prefix(prefix).send().await.expect("list versions");
    let mut out: Vec<(String, String)> = listed
        .versions()
        .iter()
        .map(|v| (v.key().unwrap_or_default().to_string(), v.version_id().unwrap_or_default().to_string()))
        .chain(listed.delete_markers().iter().map(|m| (m.key().unwrap_or_default().to_string(), m.version_id().unwrap_or_default().to_string())))
        .collect();
    out.sort();
    out
}

/// `(mode, retain until)` of `key`'s current version, as HeadObject gives them.
async fn retention_of(client: &Client, bucket: &str, key: &str) -> (Option<String>, Option<DateTime<Utc>>) {
    let head = client.head_object().bucket(bucket).key(key).send().await.unwrap_or_else(|e| panic!("HeadObject {key}: {e:?}"));
    (
        head.object_lock_mode().map(|m| m.as_str().to_string()),
        head.object_lock_retain_until_date().and_then(|t| DateTime::from_timestamp(t.secs(), 0)),
    )
}

/// S3 refuses to delete `key`'s current version (AccessDenied).
async fn deleting_the_version_is_refused(client: &Client, bucket: &str, key: &str) {
    let head = client.head_object().bucket(bucket).key(key).send().await.expect("head");
    let version = head.version_id().expect("a versioned bucket gives version ids").to_string();
    let err = client.delete_object().bucket(bucket).key(key).version_id(&version).send().await.expect_err(&format!("deleting locked {key} version {version} succeeded"));
    let code = err.as_service_error().and_then(aws_sdk_s3::error::ProvideErrorMetadata::code).map(str::to_string);
    assert_eq!(code.as_deref(), Some("AccessDenied"), "{err:?}");
}

/// Sleep until `until` has passed (by a second, S3's resolution).
async fn wait_past(until: DateTime<Utc>) {
    let left = (until - Utc::now()).num_milliseconds() + 1500;
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

fn store_fence(runs_on: ManagementCluster) -> Fence {
    Fence {
        format_version: fence::FENCE_VERSION,
        namespace: "clusters".into(),
        hosted_cluster: "demo".into(),
        runs_on,
        hosted_cluster_uid: None,
        backup_id: "20261124T000000Z-abcdef".into(),
        backup_taken_on: None,
        by: "restore".into(),
        at: Utc::now(),
        tool_version: "test".into(),
    }
}

fn hcp_dr(moto: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(args)
        .args(["--s3-endpoint", moto])
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", REGION)
        .env_remove("HCP_DR_STORE")
        .output()
        .unwrap()
}

/// The store's part: objects written with a retention hold it (a
/// multipart upload too, whose CreateMultipartUpload headers moto drops),
/// a delete through the locking store keeps them, prune keeps a backup
/// under retention and says until when, then deletes every version of it;
/// the fence is rewritten beside locked backups. No cluster needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locked_objects_outlive_prune_until_their_retention_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let (_moto, url, client) = moto_with_buckets(tmp.path()).await;
    let lock = ObjectLock { mode: LockMode::Compliance, retain_for: Duration::from_secs(8) };
    let locking = store(&url, LOCKED, "hcp", Some(lock)).await;

    // a multipart upload (3 parts of 5 MiB) and a single PUT hold the retention asked
    let before = Utc::now();
    let big = vec![7u8; (11 << 20) + 5];
    locking.put("scratch/big.bin", Box::new(&big[..])).await.expect("multipart put with a lock");
    locking.put("scratch/small.bin", Box::new(&b"small"[..])).await.expect("single put with a lock");
    for key in ["hcp/scratch/big.bin", "hcp/scratch/small.bin"] {
        let (mode, until) = retention_of(&client, LOCKED, key).await;
        assert_eq!(mode.as_deref(), Some("COMPLIANCE"), "{key}");
        let until = until.expect("a retain-until date");
        assert!(until >= before + chrono::Duration::seconds(8) && until <= Utc::now() + chrono::Duration::seconds(9), "{key}: until {until}");
        deleting_the_version_is_refused(&client, LOCKED, key).await;
    }
    // hcp-dr's own delete (a failed backup's undo) keeps it rather than hide it behind a delete marker
    locking.delete("scratch/small.bin").await.unwrap();
    locking.delete("scratch/never-written.bin").await.unwrap();
    assert_eq!(locking.list("scratch/").await.unwrap().len(), 2, "a locked object was hidden or deleted");
    assert_eq!(versions(&client, LOCKED, "hcp/scratch/").await.len(), 2, "no delete marker added");

    // two backups of demo under retention: the older is what --keep-last 1 removes
    let old = crate::backups::seed(&locking, "clusters", "demo", 48, true).await;
    let new = crate::backups::seed(&locking, "clusters", "demo", 1, true).await;
    let old_dir = format!("hcp/{}/", Layout::new("clusters", "demo", &old).dir());
    let (_, old_until) = retention_of(&client, LOCKED, &format!("{old_dir}manifest.json")).await;
    let old_until = old_until.expect("the manifest is locked");

    // the store fence lives beside them, unlocked: written, read, rewritten
    let plain_view = store(&url, LOCKED, "hcp", None).await;
    let elsewhere = ManagementCluster { server: "https://api.mgmt-b.example.com:6443".into(), kube_system_uid: Some("uid-b".into()) };
    fence::write(&plain_view, &store_fence(elsewhere)).await.expect("fence written beside locked backups");
    let here = ManagementCluster { server: "https://api.mgmt-a.example.com:6443".into(), kube_system_uid: Some("uid-a".into()) };
    fence::write(&plain_view, &store_fence(here.clone())).await.expect("fence rewritten beside locked backups");
    let read = fence::read(&plain_view, "clusters", "demo").await.unwrap().expect("fence");
    assert!(read.runs_on.same_cluster(&here), "{read:?}");
    assert_eq!(retention_of(&client, LOCKED, "hcp/clusters/demo/fence.json").await, (None, None), "the fence must not be locked");

    // the up-front check: a bucket without Object Lock is refused saying how
    // to enable it; one with a default retention passes with a warning
    let options = S3Options { endpoint: Some(url.clone()), region: Some(REGION.into()), static_credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())), ..S3Options::default() };
    let err = hcp_dr::ops::object_lock::check_stores(Some(lock), &format!("s3://{PLAIN}/hcp"), &[], &options).await.unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(err.to_string().contains(&format!("put-bucket-versioning --bucket {PLAIN}")), "{err}");
    client.create_bucket().bucket("defaulted").object_lock_enabled_for_bucket(true).send().await.unwrap();
    let rule = aws_sdk_s3::types::ObjectLockConfiguration::builder()
        .object_lock_enabled(aws_sdk_s3::types::ObjectLockEnabled::Enabled)
        .rule(
            aws_sdk_s3::types::ObjectLockRule::builder()
                .default_retention(aws_sdk_s3::types::DefaultRetention::builder().mode(aws_sdk_s3::types::ObjectLockRetentionMode::Governance).days(1).build())
                .build(),
        )
        .build();
    client.put_object_lock_configuration().bucket("defaulted").object_lock_configuration(rule).send().await.expect("a default retention");
    let warnings = hcp_dr::ops::object_lock::check_stores(Some(lock), "s3://defaulted/hcp", &[], &options).await.expect("a bucket with Object Lock");
    assert!(warnings.len() == 1 && warnings[0].contains("default retention (GOVERNANCE 1 day(s))") && warnings[0].contains("store fence"), "{warnings:?}");
    assert!(hcp_dr::ops::object_lock::check_stores(Some(lock), &format!("s3://{LOCKED}/hcp"), &[], &options).await.expect("locked bucket").is_empty());

    // a backup folder deleted without its versions (delete markers hide
    // them; they still take space): no listing shows it, prune removes it
    let hidden = hcp_dr::archive::new_backup_id(Utc::now() - chrono::Duration::hours(30));
    let hidden_dir = format!("hcp/{}/", Layout::new("clusters", "demo", &hidden).dir());
    let hidden_layout = Layout::new("clusters", "demo", &hidden);
    plain_view.put(&hidden_layout.objects(), Box::new(&b"objects"[..])).await.unwrap();
    plain_view.delete(&hidden_layout.objects()).await.unwrap();
    assert_eq!(versions(&client, LOCKED, &hidden_dir).await.len(), 2, "the object and its delete marker");
    // a complete backup hidden so (what an attacker who may only delete
    // objects can do): prune never finishes that deletion
    let hidden_whole = hcp_dr::archive::new_backup_id(Utc::now() - chrono::Duration::hours(31));
    let whole_layout = Layout::new("clusters", "demo", &hidden_whole);
    let whole_dir = format!("hcp/{}/", whole_layout.dir());
    for key in [whole_layout.objects(), whole_layout.manifest()] {
        plain_view.put(&key, Box::new(&b"{}"[..])).await.unwrap();
        plain_view.delete(&key).await.unwrap();
    }
    assert_eq!(versions(&client, LOCKED, &whole_dir).await.len(), 4, "two objects and their delete markers");

    let store_url = format!("s3://{LOCKED}/hcp");
    let prune = |extra: &[&str]| {
        let mut args = vec!["backups", "prune", "--store", &store_url, "--keep-last", "1", "-o", "json"];
        args.extend(extra);
        hcp_dr(&url, &args)
    };
    // under retention: kept, saying until when (a dry run says the same)
    for extra in [&["--dry-run"][..], &[]] {
        let out = prune(extra);
        assert!(out.status.success(), "{}", text(&out));
        let entries: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let entry = entries.iter().find(|e| e["backup_id"] == old.as_str()).expect("the old backup");
        assert_eq!((entry["keep"].as_bool(), entry["deleted"].as_bool()), (Some(true), Some(false)), "{entry:#}");
        let said = old_until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        assert!(entry["reasons"].to_string().contains(&format!("under S3 Object Lock (COMPLIANCE) until {said}")), "{entry:#}");
        assert_eq!(entry["locked"]["until"], said.as_str(), "{entry:#}");
        let gone = entries.iter().find(|e| e["backup_id"] == hidden.as_str()).expect("the hidden folder");
        assert!(gone["reasons"].to_string().contains("hidden: deleted without its object versions"), "{gone:#}");
        assert_eq!((gone["keep"].as_bool(), gone["deleted"].as_bool()), (Some(false), Some(extra.is_empty())), "{gone:#}");
        let whole = entries.iter().find(|e| e["backup_id"] == hidden_whole.as_str()).expect("the hidden complete backup");
        assert!(whole["reasons"].to_string().contains("hidden: a COMPLETE backup") && whole["reasons"].to_string().contains("delete-object --version-id"), "{whole:#}");
        assert_eq!((whole["keep"].as_bool(), whole["deleted"].as_bool()), (Some(true), Some(false)), "{whole:#}");
    }
    assert_eq!(versions(&client, LOCKED, &whole_dir).await.len(), 4, "a hidden complete backup lost a version");
    assert_eq!(versions(&client, LOCKED, &hidden_dir).await, Vec::<(String, String)>::new(), "the hidden folder's versions are left");
    let out = hcp_dr(&url, &["backups", "prune", "--store", &store_url, "--keep-last", "1"]);
    assert!(text(&out).contains("kept under S3 Object Lock"), "{}", text(&out));
    assert!(!versions(&client, LOCKED, &old_dir).await.is_empty(), "nothing of the locked backup may go");

    // once it has ended: every version of the old backup deleted, the new one and the fence stay
    wait_past(old_until).await;
    let out = prune(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let entry = entries.iter().find(|e| e["backup_id"] == old.as_str()).expect("the old backup");
    assert_eq!((entry["keep"].as_bool(), entry["deleted"].as_bool()), (Some(false), Some(true)), "{entry:#}");
    assert_eq!(versions(&client, LOCKED, &old_dir).await, Vec::<(String, String)>::new(), "versions of the pruned backup are left");
    let new_dir = format!("hcp/{}/", Layout::new("clusters", "demo", &new).dir());
    assert!(!versions(&client, LOCKED, &new_dir).await.is_empty(), "the newest backup stays");
    assert!(fence::read(&plain_view, "clusters", "demo").await.unwrap().is_some(), "the fence stays");
}

/// `backup --lock-for` of demo to moto: every object of the backup locked
/// (the report says until when), the fence set and released around locked
/// backups, prune keeps the older backup until its retention ends and then
/// removes it; a bucket without Object Lock is refused with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_lock_for_locks_every_object_and_the_fence_still_works() {
    let env = env("SingleReplica").await;
    let url = env.sandbox.route53.url().to_string();
    let client = moto_client(&url);
    buckets(&client).await;
    let locked_url = format!("s3://{LOCKED}/backups");
    let backup = |to: &str, lock_for: &str| {
        env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", to, "--s3-endpoint", &url, "--lock-for", lock_for, "-o", "json"], &[])
    };

    // a bucket without Object Lock: refused before anything, nothing written
    let out = backup(&format!("s3://{PLAIN}/backups"), "1h");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    for says in ["--lock-for", PLAIN, "does not have S3 Object Lock enabled", "put-object-lock-configuration", "--object-lock-enabled-for-bucket"] {
        assert!(text(&out).contains(says), "{says}: {}", text(&out));
    }
    assert!(versions(&client, PLAIN, "").await.is_empty(), "written to a bucket without lock");
    assert!(!env.dir.path().join("state/journals").exists() || std::fs::read_dir(env.dir.path().join("state/journals")).unwrap().next().is_none(), "journaled");
    env.assert_in_service("after the refused backup").await;

    // two locked backups
    let out = backup(&locked_url, "40s");
    assert!(out.status.success(), "{}", text(&out));
    let first = json_report(&out);
    let out = backup(&locked_url, "40s");
    assert!(out.status.success(), "{}", text(&out));
    let second = json_report(&out);
    let folder = |report: &Value| report["backup"].as_str().unwrap().strip_prefix(&format!("s3://{LOCKED}/")).unwrap().to_string();
    let first_dir = format!("{}/", folder(&first));
    assert_eq!(first["object_lock"]["mode"], "compliance", "{first:#}");
    let reported: DateTime<Utc> = first["object_lock"]["retain_until"].as_str().unwrap().parse().unwrap();
    let listed = client.list_objects_v2().bucket(LOCKED).prefix(&first_dir).send().await.unwrap();
    let keys: Vec<String> = listed.contents().iter().filter_map(|o| o.key().map(str::to_string)).collect();
    assert!(keys.iter().any(|k| k.ends_with("manifest.json")) && keys.iter().any(|k| k.ends_with("etcd/etcd-0.db")) && keys.iter().any(|k| k.ends_with("SHA256SUMS")), "{keys:?}");
    for key in &keys {
        let (mode, until) = retention_of(&client, LOCKED, key).await;
        assert_eq!(mode.as_deref(), Some("COMPLIANCE"), "{key}");
        assert!(until.is_some_and(|u| u <= reported), "{key}: {until:?}, the manifest's {reported}");
    }
    assert_eq!(retention_of(&client, LOCKED, &format!("{first_dir}manifest.json")).await.1, Some(reported));
    deleting_the_version_is_refused(&client, LOCKED, &format!("{first_dir}etcd/etcd-0.db")).await;
    let said = text(&env.hcp_dr(&["backups", "list", "--store", &locked_url, "--s3-endpoint", &url], &[]));
    assert!(said.contains(second["backup"].as_str().unwrap().rsplit('/').next().unwrap()), "{said}");

    // a locked backup that fails: undone, the cluster back in service, and
    // what S3 holds is kept and said so, not hidden behind delete markers
    let out = env.hcp_dr(
        &["backup", "--hosted-cluster", "demo", "--to", &locked_url, "--s3-endpoint", &url, "--lock-for", "40s", "-o", "json"],
        &[("HCP_DR_TEST_FAIL_AFTER", "snapshot-finish")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let failed = json_report(&out);
    let warning = failed["warnings"].as_array().unwrap().iter().filter_map(Value::as_str).find(|w| w.contains("of the failed backup stay in")).unwrap_or_else(|| panic!("no word of what stayed: {failed:#}"));
    assert!(warning.contains("under S3 Object Lock (COMPLIANCE) until") && warning.contains("incomplete backup"), "{warning}");
    env.assert_in_service("after the failed locked backup").await;
    let listed: Vec<Value> = serde_json::from_slice(&env.hcp_dr(&["backups", "list", "--store", &locked_url, "--s3-endpoint", &url, "-o", "json"], &[]).stdout).unwrap();
    let kept = listed.iter().filter(|b| b["complete"] == false).count();
    assert_eq!(kept, 1, "the failed backup's locked objects, listed as an incomplete backup: {listed:#?}");
    let markers = client.list_object_versions().bucket(LOCKED).prefix("backups/").send().await.unwrap();
    assert!(markers.delete_markers().is_empty(), "delete markers hide locked objects: {:?}", markers.delete_markers());

    // prune keeps the older backup while it is locked, naming until when
    let prune = || env.hcp_dr(&["backups", "prune", "--store", &locked_url, "--s3-endpoint", &url, "--keep-last", "1", "-o", "json"], &[]);
    let out = prune();
    assert!(out.status.success(), "{}", text(&out));
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let old = entries.iter().find(|e| first["backup"].as_str().unwrap().ends_with(e["backup_id"].as_str().unwrap())).expect("the first backup");
    assert_eq!(old["keep"], true, "{old:#}");
    assert!(old["reasons"].to_string().contains(&format!("until {}", reported.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))), "{old:#}");

    // the fence beside locked backups: the store names another cluster, demo
    // here is fenced, backups refused; released with --claim-store, which
    // rewrites the store fence in the locked bucket
    let view = S3Store::connect(
        LOCKED.into(),
        "backups".into(),
        S3Options { endpoint: Some(url.clone()), region: Some(REGION.into()), static_credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())), ..S3Options::default() },
    )
    .await
    .unwrap();
    let elsewhere = ManagementCluster { server: "https://api.mgmt-b.example.com:6443".into(), kube_system_uid: Some("uid-of-mgmt-b".into()) };
    fence::write(&view, &store_fence(elsewhere)).await.expect("store fence written");
    let out = env.hcp_dr(&["fence", "--hosted-cluster", "demo", "--store", &locked_url, "--s3-endpoint", &url], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = backup(&locked_url, "40s");
    assert_ne!(out.status.code(), Some(0), "a backup of the fenced copy: {}", text(&out));
    assert!(text(&out).contains("is fenced on this management cluster"), "{}", text(&out));
    let out = env.hcp_dr(&["fence", "--release", "--claim-store", "--hosted-cluster", "demo", "--store", &locked_url, "--s3-endpoint", &url], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let claimed = fence::read(&view, "clusters", "demo").await.unwrap().expect("store fence");
    assert_eq!(claimed.by, "fence --release --claim-store", "{claimed:?}");
    assert_eq!(retention_of(&client, LOCKED, "backups/clusters/demo/fence.json").await, (None, None), "the fence must not be locked");

    // once the retention has ended, prune removes the older backup, every version
    wait_past(reported).await;
    let out = prune();
    assert!(out.status.success(), "{}", text(&out));
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let old = entries.iter().find(|e| first["backup"].as_str().unwrap().ends_with(e["backup_id"].as_str().unwrap())).expect("the first backup");
    assert_eq!((old["keep"].as_bool(), old["deleted"].as_bool()), (Some(false), Some(true)), "{old:#}");
    assert_eq!(versions(&client, LOCKED, &first_dir).await, Vec::<(String, String)>::new(), "versions of the pruned backup are left");
    assert!(!versions(&client, LOCKED, &format!("{}/", folder(&second))).await.is_empty(), "the newest backup stays");
}

/// The keys of every object under `prefix` of `bucket`.
async fn keys(client: &Client, bucket: &str, prefix: &str) -> Vec<String> {
    let listed = client.list_objects_v2().bucket(bucket).prefix(prefix).send().await.expect("list objects");
    listed.contents().iter().filter_map(|o| o.key().map(str::to_string)).collect()
}

/// `backups copy --lock-for` from a local store into a bucket with Object
/// Lock: every object of each copied backup holds the retention (one
/// copied earlier without a lock gets it now), the result records do not,
/// S3 refuses to delete a copied version; a second run copies nothing and
/// reports the same lock; `backups list` and `describe` show until when.
/// A local --to, or a bucket without Object Lock, is refused with nothing
/// written. No cluster needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backups_copy_lock_for_locks_each_copy_and_list_and_describe_show_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (_moto, url, client) = moto_with_buckets(tmp.path()).await;
    let primary = tmp.path().join("primary");
    let source = LocalStore::new(&primary);
    let older = crate::backups::seed(&source, "clusters", "demo", 30, true).await;
    let newer = crate::backups::seed(&source, "clusters", "demo", 2, true).await;
    let from = primary.to_str().unwrap();
    let copies = format!("s3://{LOCKED}/copies");
    let copy = |to: &str, extra: &[&str]| {
        let mut args = vec!["backups", "copy", "--from", from, "--to", to];
        args.extend(extra);
        hcp_dr(&url, &args)
    };

    // refused before anything is written: a local --to, a bucket without Object Lock
    let local = tmp.path().join("local-copy");
    let out = copy(local.to_str().unwrap(), &["--lock-for", "1h"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    for says in ["--lock-for", &format!("--to {}", local.display()), "is a local directory", "s3://bucket/prefix"] {
        assert!(text(&out).contains(says), "{says}: {}", text(&out));
    }
    assert!(!local.exists(), "the local --to was written");
    let out = copy(&format!("s3://{PLAIN}/copies"), &["--lock-for", "1h"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    for says in ["--lock-for 1h", PLAIN, "does not have S3 Object Lock enabled", "put-object-lock-configuration"] {
        assert!(text(&out).contains(says), "{says}: {}", text(&out));
    }
    assert!(versions(&client, PLAIN, "").await.is_empty(), "written to a bucket without Object Lock");

    // the newer backup copied earlier without a lock: none of it is held
    let out = copy(&copies, &["--since", "5h", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let newer_dir = format!("copies/{}/", Layout::new("clusters", "demo", &newer).dir());
    let older_dir = format!("copies/{}/", Layout::new("clusters", "demo", &older).dir());
    assert_eq!(retention_of(&client, LOCKED, &format!("{newer_dir}manifest.json")).await, (None, None));
    // a result record beside the backups, which the locked run copies
    let verified = ResultRecord::new(Kind::Verify, "clusters", "demo", &newer, Utc::now(), true, "verify passed".into());
    results::write(&source, &verified).await.unwrap();

    // with --lock-for: the older copied locked, the newer given the retention
    let before = Utc::now();
    let out = copy(&copies, &["--lock-for", "1h", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let after = Utc::now();
    let report = json_report(&out);
    assert_eq!((report["copied"].as_u64(), report["already_there"].as_u64(), report["failed"].as_u64()), (Some(1), Some(1), Some(0)), "{report:#}");
    let row = |report: &Value, id: &str| report["backups"].as_array().unwrap().iter().find(|b| b["backup"].as_str().unwrap().ends_with(id)).cloned().unwrap_or_else(|| panic!("{id}: {report:#}"));
    assert_eq!(report["results_copied"], 1, "{report:#}");
    assert_eq!(row(&report, &newer)["retention_set"], 4, "three artifacts and the manifest there already: {report:#}");
    assert!(row(&report, &older).get("retention_set").is_none(), "{report:#}");
    let mut until_of = std::collections::BTreeMap::new();
    for (id, dir) in [(&older, &older_dir), (&newer, &newer_dir)] {
        let listed = keys(&client, LOCKED, dir).await;
        assert_eq!(listed.len(), 4, "{listed:?}");
        for key in &listed {
            let (mode, until) = retention_of(&client, LOCKED, key).await;
            assert_eq!(mode.as_deref(), Some("COMPLIANCE"), "{key}");
            let until = until.unwrap_or_else(|| panic!("{key}: no retain-until date"));
            assert!(until >= before + chrono::Duration::seconds(3599) && until <= after + chrono::Duration::seconds(3601), "{key}: until {until}");
        }
        let (_, manifest_until) = retention_of(&client, LOCKED, &format!("{dir}manifest.json")).await;
        let said = manifest_until.unwrap().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let lock = &row(&report, id)["object_lock"];
        assert_eq!((lock["mode"].as_str(), lock["retain_until"].as_str()), (Some("compliance"), Some(said.as_str())), "{report:#}");
        until_of.insert(id.clone(), said);
    }
    deleting_the_version_is_refused(&client, LOCKED, &format!("{older_dir}etcd/etcd-0.db")).await;
    deleting_the_version_is_refused(&client, LOCKED, &format!("{newer_dir}manifest.json")).await;
    let records = keys(&client, LOCKED, "copies/clusters/demo/results/").await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(retention_of(&client, LOCKED, &records[0]).await, (None, None), "a result record must not be locked");

    // again: nothing copied, nothing lengthened, the same lock reported
    let out = copy(&copies, &["--lock-for", "1h", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let again = json_report(&out);
    assert_eq!((again["copied"].as_u64(), again["already_there"].as_u64(), again["bytes_copied"].as_u64()), (Some(0), Some(2), Some(0)), "{again:#}");
    for id in [&older, &newer] {
        let b = row(&again, id);
        assert!(b.get("retention_set").is_none(), "a lock pushed further: {again:#}");
        assert_eq!(b["object_lock"]["retain_until"].as_str(), Some(until_of[id].as_str()), "{again:#}");
    }
    let out = copy(&copies, &["--lock-for", "1h"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("locked: S3 Object Lock COMPLIANCE until {}", until_of[&older])), "{}", text(&out));

    // backups list and describe: until when, in text and JSON
    let out = hcp_dr(&url, &["backups", "list", "--store", &copies, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.len(), 2, "{listed:#?}");
    for entry in &listed {
        let id = entry["backup_id"].as_str().unwrap().to_string();
        let expected = serde_json::json!([{"store": copies, "state": "held", "mode": "compliance", "retain_until": until_of[&id]}]);
        assert_eq!(entry["object_lock"], expected, "{entry:#}");
    }
    let out = hcp_dr(&url, &["backups", "list", "--store", &copies]);
    let said = text(&out);
    assert!(out.status.success() && said.contains("  LOCK\n"), "{said}");
    for id in [&older, &newer] {
        let line = said.lines().find(|l| l.contains(id.as_str())).unwrap_or_else(|| panic!("{id}: {said}"));
        assert!(line.ends_with(&format!("  COMPLIANCE until {}", until_of[id])), "{line}");
    }
    let described = format!("{copies}/clusters/demo/{older}");
    let out = hcp_dr(&url, &["backups", "describe", &described]);
    assert!(text(&out).contains(&format!("object lock: held by S3 Object Lock, COMPLIANCE until {}: nobody can delete it before", until_of[&older])), "{}", text(&out));
    let out = hcp_dr(&url, &["backups", "describe", &described, "-o", "json"]);
    let json = json_report(&out);
    assert_eq!(json["object_lock"], serde_json::json!({"state": "held", "mode": "compliance", "retain_until": until_of[&older]}), "{json:#}");

    // a store without Object Lock (local, or a bucket without) shows none, and says nothing of it
    let plain = format!("s3://{PLAIN}/copies");
    assert!(copy(&plain, &[]).status.success());
    for store in [plain.as_str(), from] {
        let out = hcp_dr(&url, &["backups", "list", "--store", store, "-o", "json"]);
        assert!(out.status.success(), "{}", text(&out));
        let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert!(listed.len() == 2 && listed.iter().all(|e| e.get("object_lock").is_none()), "{listed:#?}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("Object Lock"), "{}", text(&out));
        let out = hcp_dr(&url, &["backups", "list", "--store", store]);
        assert!(!text(&out).contains("LOCK"), "{}", text(&out));
        let out = hcp_dr(&url, &["backups", "describe", &format!("{store}/clusters/demo/latest"), "-o", "json"]);
        assert!(json_report(&out).get("object_lock").is_none(), "{}", text(&out));
    }
    // across both: each store's lock, by store
    let out = hcp_dr(&url, &["backups", "list", "--store", &plain, "--store", &copies]);
    let said = text(&out);
    let line = said.lines().find(|l| l.contains(older.as_str())).unwrap();
    assert!(line.ends_with(&format!("  1,2     2: COMPLIANCE until {}", until_of[&older])), "{said}");

    // a backup damaged at the source: refused, never listed complete; what
    // it wrote before the damage was found stays, locked, and is reported
    let damaged = crate::backups::seed(&source, "clusters", "demo", 1, true).await;
    let objects = primary.join(Layout::new("clusters", "demo", &damaged).objects());
    std::fs::write(&objects, b"objectz").unwrap();
    let out = copy(&copies, &["--lock-for", "1h", "--since", "90m", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let failed = json_report(&out);
    assert!(row(&failed, &damaged)["error"].as_str().is_some_and(|e| e.contains("objects.tar.gz") && e.contains("damaged at the source")), "{failed:#}");
    let damaged_dir = format!("copies/{}/", Layout::new("clusters", "demo", &damaged).dir());
    let left = keys(&client, LOCKED, &damaged_dir).await;
    assert!(!left.is_empty() && !left.iter().any(|k| k.ends_with("manifest.json")), "{left:?}");
    let warning = failed["warnings"].as_array().unwrap().iter().filter_map(Value::as_str).find(|w| w.contains("of the failed copy stay in")).unwrap_or_else(|| panic!("no word of what stayed: {failed:#}"));
    assert!(warning.starts_with(&format!("{} object(s)", left.len())) && warning.contains("under S3 Object Lock (COMPLIANCE) until") && warning.contains("incomplete backup"), "{warning}");
}
