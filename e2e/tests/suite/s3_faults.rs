//! The S3 endpoint's HTTPS front: requests and bodies pass through it
//! unchanged, and the faults set in its faults file reach a client as S3
//! (or the network to it) would give them.
//! Needs `s3s-fs` (`cargo install s3s-fs --version 0.14.1 --features binary --locked`).

use std::time::{Duration, Instant};

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::error::ProvideErrorMetadata as _;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::s3::{S3Endpoint, https_get, sdk_config};
use hcp_dr_e2e::procs::s3_faults::{S3FaultKind, S3Faults};

const BUCKET: &str = "hcp-backups";

/// An SDK client against `endpoint`, trusting only the sandbox CA, making
/// one attempt per request (so a test sees each fault itself).
fn s3_client(s3: &S3Endpoint, endpoint: &str, ca: &Ca) -> aws_sdk_s3::Client {
    let config = sdk_config(endpoint, s3.region(), s3.access_key(), s3.secret_key(), ca.cert_pem())
        .expect("S3 client")
        .retry_config(RetryConfig::standard().with_max_attempts(1))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

fn pattern(len: usize, salt: u32) -> Vec<u8> {
    (0..len as u32).map(|i| ((i.wrapping_mul(31) ^ salt) % 251) as u8).collect()
}

async fn start() -> (tempfile::TempDir, Ca, S3Endpoint) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("sandbox-ca").expect("ca");
    let s3 = S3Endpoint::start(dir.path(), &ca).await.unwrap_or_else(|e| panic!("{e}"));
    s3.create_bucket(BUCKET).await.expect("create bucket");
    (dir, ca, s3)
}

fn only(kind: S3FaultKind, delay_ms: u64) -> S3Faults {
    S3Faults { share: 1.0, kinds: vec![kind], delay_ms, ..Default::default() }
}

async fn put(client: &aws_sdk_s3::Client, key: &str, body: &[u8]) -> Result<(), String> {
    client
        .put_object()
        .bucket(BUCKET)
        .key(key)
        .body(ByteStream::from(body.to_vec()))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))
}

async fn get(client: &aws_sdk_s3::Client, key: &str) -> Result<Vec<u8>, String> {
    let out = client
        .get_object()
        .bucket(BUCKET)
        .key(key)
        .send()
        .await
        .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))?;
    let body = out.body.collect().await.map_err(|e| format!("reading the body: {e}"))?;
    Ok(body.into_bytes().to_vec())
}

/// Whether `key` exists, asked of s3s-fs itself (never faulted).
async fn exists(plain: &aws_sdk_s3::Client, key: &str) -> bool {
    plain.head_object().bucket(BUCKET).key(key).send().await.is_ok()
}

fn logged(s3: &S3Endpoint, kind: S3FaultKind) -> Vec<serde_json::Value> {
    s3.faults_injected().into_iter().filter(|f| f["kind"] == kind.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_fault_kind_reaches_a_client_as_s3_would_give_it() {
    let (_dir, ca, s3) = start().await;
    let client = s3_client(&s3, s3.https_url(), &ca);
    let plain = s3_client(&s3, s3.http_url(), &ca);
    let object = pattern(1 << 20, 1);
    put(&client, "obj", &object).await.expect("put without faults");
    assert!(s3.faults_path().ends_with("s3-faults.json"), "{}", s3.faults_path().display());
    assert!(s3.faults_injected().is_empty());

    // internal-error and slow-down: an S3 XML error, nothing forwarded.
    for (kind, status, code) in [(S3FaultKind::InternalError, 500, "InternalError"), (S3FaultKind::SlowDown, 503, "SlowDown")] {
        s3.set_faults(Some(&only(kind, 0))).expect("set faults");
        let err = client.get_object().bucket(BUCKET).key("obj").send().await.expect_err("a fault");
        assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(status), "{kind}");
        assert_eq!(err.code(), Some(code), "{kind}: {err:?}");
        let key = format!("put-{kind}");
        let err = client
            .put_object()
            .bucket(BUCKET)
            .key(&key)
            .body(ByteStream::from(object.clone()))
            .send()
            .await
            .expect_err("a fault");
        assert_eq!(err.code(), Some(code), "{kind}: {err:?}");
        assert!(!exists(&plain, &key).await, "{kind}: the PUT must not reach s3s-fs");
        assert_eq!(logged(&s3, kind).len(), 2, "{kind}: {:?}", s3.faults_injected());
    }

    // A presigned GET (a plain HTTPS client) gets the XML too.
    let presigned = client
        .get_object()
        .bucket(BUCKET)
        .key("obj")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(600)).expect("presign config"))
        .await
        .expect("presign");
    let (status, body) = https_get(presigned.uri(), ca.cert_pem()).await.expect("GET presigned");
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("<Error><Code>SlowDown</Code>"), "{body}");
    let last = s3.faults_injected().pop().expect("logged");
    assert_eq!((last["method"].as_str(), last["path"].as_str()), (Some("GET"), Some("/hcp-backups/obj")));
    assert!(last["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{last}");

    // reset-request: the upload is cut, nothing is stored.
    s3.set_faults(Some(&only(S3FaultKind::ResetRequest, 0))).expect("set faults");
    let err = put(&client, "cut-upload", &object).await.expect_err("a reset");
    assert!(!exists(&plain, "cut-upload").await, "a cut upload must not be stored");
    let resets = logged(&s3, S3FaultKind::ResetRequest);
    assert_eq!(resets.len(), 1, "{err}");
    let read = resets[0]["bytes"].as_u64().expect("bytes");
    assert!(read > 0 && read < object.len() as u64, "read {read} of the body before the reset");
    // A request without a body is dropped unanswered.
    let err = get(&client, "obj").await.expect_err("a reset");
    assert!(!err.contains("InternalError") && !err.contains("SlowDown"), "{err}");
    assert_eq!(logged(&s3, S3FaultKind::ResetRequest)[1]["bytes"], 0);

    // reset-response: the headers and half of the body, then a reset.
    s3.set_faults(Some(&only(S3FaultKind::ResetResponse, 0))).expect("set faults");
    let err = get(&client, "obj").await.expect_err("a reset mid-download");
    let resets = logged(&s3, S3FaultKind::ResetResponse);
    assert_eq!(resets.len(), 1, "{err}");
    assert_eq!(resets[0]["bytes"].as_u64(), Some(object.len() as u64 / 2), "{}", resets[0]);
    // A PUT's answer (empty body) is lost whole, but the PUT was applied.
    let err = put(&client, "lost-answer", &object).await.expect_err("a lost answer");
    assert!(exists(&plain, "lost-answer").await, "the PUT is forwarded before its answer is lost: {err}");
    assert_eq!(logged(&s3, S3FaultKind::ResetResponse)[1]["bytes"], 0);

    // slow-read: complete, but late.
    s3.set_faults(Some(&only(S3FaultKind::SlowRead, 1500))).expect("set faults");
    let started = Instant::now();
    let body = get(&client, "obj").await.expect("a slow read completes");
    assert!(started.elapsed() >= Duration::from_millis(1500), "{:?}", started.elapsed());
    assert!(body == object, "the slow body differs");
    assert_eq!(logged(&s3, S3FaultKind::SlowRead).len(), 1);

    // share 0, then no file: everything passes, signatures still verify.
    s3.set_faults(Some(&S3Faults { share: 0.0, kinds: S3FaultKind::ALL.to_vec(), ..Default::default() }))
        .expect("set faults");
    put(&client, "after", &object).await.expect("put with share 0");
    s3.set_faults(None).expect("faults off");
    assert!(get(&client, "after").await.expect("get with faults off") == object);
    let (status, body) = https_get(presigned.uri(), ca.cert_pem()).await.expect("GET presigned");
    assert_eq!(status, 200);
    assert!(body.as_ref() == object.as_slice());
    let total = s3.faults_injected().len();
    assert_eq!(total, 10, "{:#?}", s3.faults_injected());

    // A file that does not parse injects nothing.
    std::fs::write(s3.faults_path(), "{\"share\": 1.0, \"kinds\": [\"no-such-kind\"]}").expect("write");
    assert!(get(&client, "obj").await.expect("get with a broken faults file") == object);
    assert_eq!(s3.faults_injected().len(), total);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_object_streams_through_the_front_unchanged() {
    let (_dir, ca, s3) = start().await;
    let client = s3_client(&s3, s3.https_url(), &ca);
    let object = pattern(20 << 20, 7);
    put(&client, "big/etcd.snapshot", &object).await.expect("put 20 MiB");
    let stored = std::fs::read(s3.root().join(BUCKET).join("big/etcd.snapshot")).expect("stored file");
    assert!(stored == object, "the stored object differs ({} bytes)", stored.len());
    let body = get(&client, "big/etcd.snapshot").await.expect("get 20 MiB");
    assert!(body == object, "the object read back differs ({} bytes)", body.len());

    // Many small requests on the client's kept-alive connections.
    for i in 0..20 {
        let key = format!("small/{i}");
        let data = pattern(1000 + i, i as u32);
        put(&client, &key, &data).await.expect("put small");
        assert!(get(&client, &key).await.expect("get small") == data);
    }
    let listed = client.list_objects_v2().bucket(BUCKET).prefix("small/").send().await.expect("list");
    assert_eq!(listed.contents().len(), 20);
    assert!(s3.faults_injected().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn access_denied_refuses_only_the_paths_under_its_prefix() {
    let (_dir, ca, s3) = start().await;
    s3.create_bucket("oidc-mgmt-a").await.expect("create bucket");
    let client = s3_client(&s3, s3.https_url(), &ca);
    let plain = s3_client(&s3, s3.http_url(), &ca);
    s3.set_faults(Some(&S3Faults {
        share: 1.0,
        kinds: vec![S3FaultKind::AccessDenied],
        path_prefix: Some("/oidc-mgmt-a/".into()),
        ..Default::default()
    }))
    .expect("set faults");

    // A PUT under the prefix: 403 AccessDenied, nothing stored.
    let err = client
        .put_object()
        .bucket("oidc-mgmt-a")
        .key("infra/openid/v1/jwks")
        .body(ByteStream::from_static(b"{}"))
        .send()
        .await
        .expect_err("refused");
    assert_eq!(err.raw_response().map(|r| r.status().as_u16()), Some(403), "{err:?}");
    assert_eq!(err.code(), Some("AccessDenied"), "{err:?}");
    assert_eq!(err.message(), Some("Access Denied"), "{err:?}");
    let stored = plain.head_object().bucket("oidc-mgmt-a").key("infra/openid/v1/jwks").send().await;
    assert!(stored.is_err(), "the refused PUT must not reach s3s-fs");
    let denied = logged(&s3, S3FaultKind::AccessDenied);
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!((denied[0]["method"].as_str(), denied[0]["path"].as_str()), (Some("PUT"), Some("/oidc-mgmt-a/infra/openid/v1/jwks")));

    // Another bucket passes, PUT and GET.
    put(&client, "backup/one", b"data").await.expect("PUT outside the prefix");
    assert_eq!(get(&client, "backup/one").await.expect("GET outside the prefix"), b"data");
    assert_eq!(s3.faults_injected().len(), 1, "{:#?}", s3.faults_injected());
}
