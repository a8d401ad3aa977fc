//! A flaky S3: the sandbox's S3 front answers a share of hcp-dr's requests
//! with 500 InternalError or 503 SlowDown, resets connections mid-upload and
//! mid-download, and stalls reads. Uploads are retried per part, downloads
//! go on from the byte they reached, and backup, `backups verify --deep` and
//! restore complete with every hash right; when S3 keeps failing, the
//! backup fails cleanly (nothing marked complete, the cluster in service);
//! a backup killed mid-snapshot under faults is completed by `--resume`.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use hcp_dr::store::{S3Options, S3Store, Store};
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::s3::S3Endpoint;
use hcp_dr_e2e::procs::s3_faults::{S3FaultKind, S3Faults};
use serde_json::Value;
use sha2::{Digest, Sha256};
use support::*;
use tokio::io::AsyncReadExt;

const BUCKET: &str = "flaky";

/// hcp-dr's own requests (the AWS SDK's User-Agent): the presigned GETs of
/// the sandbox's etcd init containers are left alone.
const HCP_DR_REQUESTS: &str = "aws-sdk-rust";

fn pattern(len: usize, salt: u32) -> Vec<u8> {
    (0..len as u32).map(|i| ((i.wrapping_mul(2654435761) ^ salt) >> 7) as u8).collect()
}

fn sha(bytes: &[u8]) -> String {
    hcp_dr::store::hex(&Sha256::digest(bytes))
}

/// How many faults of each kind `log` holds.
fn by_kind(log: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for entry in log {
        *counts.entry(entry["kind"].as_str().unwrap_or("?").to_string()).or_insert(0) += 1;
    }
    counts
}

/// An S3 endpoint of its own and a store on it.
async fn endpoint(options: S3Options) -> (tempfile::TempDir, S3Endpoint, S3Store) {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("s3-faults-ca").unwrap();
    let s3 = S3Endpoint::start(dir.path(), &ca).await.unwrap_or_else(|e| panic!("{e}"));
    s3.create_bucket(BUCKET).await.unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let store = S3Store::connect(
        BUCKET.into(),
        "backups".into(),
        S3Options {
            endpoint: Some(s3.https_url().to_string()),
            region: Some(s3.region().to_string()),
            ca_bundle: Some(ca_file),
            static_credentials: Some((s3.access_key().to_string(), s3.secret_key().to_string())),
            part_size: 5 << 20,
            ..options
        },
    )
    .await
    .unwrap();
    (dir, s3, store)
}

async fn read_all(store: &S3Store, key: &str) -> Result<Vec<u8>, String> {
    let mut body = store.get(key).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    body.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_s3_store_rides_out_a_quarter_of_its_requests_failing() {
    let (_dir, s3, store) = endpoint(S3Options::default()).await;
    s3.set_faults(Some(&S3Faults { share: 0.25, kinds: S3FaultKind::ALL.to_vec(), seed: Some(17), delay_ms: 500, ..Default::default() }))
        .unwrap();
    // multipart (4 parts of 5 MiB), one part, and small objects
    for (i, len) in [(0u32, 17 << 20), (1, 5 << 20), (2, 300 << 10), (3, 1), (4, 64 << 10)] {
        let data = pattern(len, i);
        let key = format!("obj-{i}");
        let put = store.put(&key, Box::new(std::io::Cursor::new(data.clone()))).await.unwrap_or_else(|e| panic!("put {key}: {e}\nfaults: {:#?}", s3.faults_injected()));
        assert_eq!((put.size, put.sha256.as_str()), (len as u64, sha(&data).as_str()), "{key}");
        let read = read_all(&store, &key).await.unwrap_or_else(|e| panic!("get {key}: {e}"));
        assert!(read.len() == len && read == data, "{key}: {} bytes read back of {len}, equal: {}", read.len(), read == data);
    }
    let log = s3.faults_injected();
    let kinds = by_kind(&log);
    println!("faults injected and survived: {} {kinds:?}", log.len());
    assert!(log.len() >= 5, "faults were injected: {kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_download_cut_or_stalled_mid_body_goes_on_from_where_it_broke() {
    let (_dir, s3, store) = endpoint(S3Options { stall_timeout: Duration::from_secs(1), ..S3Options::default() }).await;
    let data = pattern(9 << 20, 3);
    store.put("snap", Box::new(std::io::Cursor::new(data.clone()))).await.unwrap();
    for kind in [S3FaultKind::ResetResponse, S3FaultKind::SlowRead] {
        s3.set_faults(Some(&S3Faults { share: 1.0, kinds: vec![kind], methods: vec!["GET".into()], delay_ms: 5000, ..Default::default() }))
            .unwrap();
        let before = s3.faults_injected().len();
        let mut body = store.get("snap").await.unwrap();
        // the first answer is under way and will break (or stall) halfway; the next one is not
        let mut first = vec![0u8; 1024];
        body.read_exact(&mut first).await.unwrap();
        s3.set_faults(None).unwrap();
        let mut rest = Vec::new();
        body.read_to_end(&mut rest).await.unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        first.extend(rest);
        assert!(first == data, "{kind:?}: {} bytes, equal: {}", first.len(), first == data);
        let log = s3.faults_injected();
        assert_eq!(log.len() - before, 1, "{kind:?}: one fault: {log:?}");
    }
    // a download that keeps breaking without progress gives up and says where
    s3.set_faults(Some(&S3Faults { share: 1.0, kinds: vec![S3FaultKind::InternalError], methods: vec!["GET".into()], ..Default::default() }))
        .unwrap();
    let err = read_all(&store, "snap").await.unwrap_err();
    assert!(err.contains("GetObject") && err.contains("InternalError"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upload_s3_keeps_refusing_fails_with_its_reason_and_stores_nothing() {
    let (_dir, s3, store) = endpoint(S3Options { max_attempts: 2, part_attempts: 2, ..S3Options::default() }).await;
    s3.set_faults(Some(&S3Faults { share: 1.0, kinds: vec![S3FaultKind::SlowDown], methods: vec!["PUT".into()], ..Default::default() }))
        .unwrap();
    for len in [100 << 10, 11 << 20] {
        let err = store.put("refused", Box::new(std::io::Cursor::new(pattern(len, 9)))).await.unwrap_err().to_string();
        assert!(err.contains("SlowDown") && err.contains("after 2 tries"), "{len}: {err}");
    }
    s3.set_faults(None).unwrap();
    assert!(store.list("").await.unwrap().is_empty(), "nothing stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_verify_and_restore_complete_under_s3_faults() {
    let env = env("SingleReplica").await;
    env.sandbox
        .set_s3_faults(Some(&S3Faults {
            share: 0.3,
            kinds: S3FaultKind::ALL.to_vec(),
            user_agent: Some(HCP_DR_REQUESTS.into()),
            delay_ms: 1000,
            seed: Some(5),
            ..Default::default()
        }))
        .unwrap();
    let (folder, revision) = backup_to_s3(&env);
    env.assert_in_service("after the backup").await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    let out = env.hcp_dr(&["backups", "verify", &folder, "--deep", "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let verified = json_report(&out);
    assert_eq!(verified["ok"], true, "{verified:#}");

    // the source copy keeps serving on mgmt-a (its own hosted API address)
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let out = env.hcp_dr(&["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--wait", "5m", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let (restored, _) = etcd_keys(&b, &env.hcp_ns()).await;
    assert!(restored >= revision, "the restored etcd is at revision {restored}, the backup's was {revision}");

    let log = env.sandbox.s3_faults_injected();
    let kinds = by_kind(&log);
    println!("S3 faults injected and survived: {} {kinds:?}", log.len());
    assert!(log.len() >= 3, "faults were injected: {kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_s3_keeps_failing_fails_cleanly_and_a_killed_one_resumes_under_faults() {
    let env = env("SingleReplica").await;
    env.sandbox
        .set_s3_faults(Some(&S3Faults {
            share: 1.0,
            kinds: vec![S3FaultKind::InternalError, S3FaultKind::ResetRequest],
            methods: vec!["PUT".into(), "POST".into()],
            user_agent: Some(HCP_DR_REQUESTS.into()),
            ..Default::default()
        }))
        .unwrap();
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "failed and undone: {}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert!(report["error"].as_str().is_some_and(|e| e.contains("S3") && e.contains("tries")), "{report:#}");
    env.assert_in_service("after the failed backup").await;
    env.sandbox.set_s3_faults(None).unwrap();
    let store = format!("s3://{}/backups", hcp_dr_e2e::sandbox::BUCKET);
    let list = ["backups", "list", "--store", &store, "--hosted-cluster", "demo", "--s3-endpoint", env.sandbox.s3.https_url(), "-o", "json"];
    let out = env.hcp_dr(&list, &[]);
    let listed = json_report(&out);
    assert!(listed.as_array().unwrap().iter().all(|b| b["complete"] != true), "nothing marked complete: {listed:#}");

    // a backup killed mid-snapshot while S3 is flaky: --resume completes it
    env.sandbox
        .set_s3_faults(Some(&S3Faults {
            share: 0.5,
            kinds: S3FaultKind::ALL.to_vec(),
            user_agent: Some(HCP_DR_REQUESTS.into()),
            delay_ms: 1000,
            seed: Some(23),
            ..Default::default()
        }))
        .unwrap();
    let before = env.sandbox.s3_faults_injected().len();
    let journal = env.dir.path().join("backup.jsonl");
    let mut fresh = args.clone();
    fresh.extend(["--journal", journal.to_str().unwrap()]);
    kill_in(&env, &fresh, &journal, "etcd-snapshot");
    let out = env.hcp_dr(&["backup", "--resume", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let folder = report["backup"].as_str().expect("backup URL").to_string();
    env.assert_in_service("after the resumed backup").await;
    let out = env.hcp_dr(&["backups", "verify", &folder, "--s3-endpoint", env.sandbox.s3.https_url()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let during = env.sandbox.s3_faults_injected().split_off(before);
    println!("S3 faults injected in the killed and resumed backup: {:?}", by_kind(&during));
    assert!(!during.is_empty(), "faults were injected");
}
