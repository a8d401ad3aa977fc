//! The S3 fixture: s3s-fs behind an HTTPS front with a sandbox-CA certificate.
//! Needs `s3s-fs` (`cargo install s3s-fs --version 0.14.1 --features binary --locked`).

use std::time::Duration;

use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::s3::{S3Endpoint, https_get, sdk_config};

const BUCKET: &str = "hcp-backups";

/// An SDK client against `endpoint`, trusting only the sandbox CA.
fn s3_client(s3: &S3Endpoint, endpoint: &str, ca: &Ca, secret_key: &str) -> aws_sdk_s3::Client {
    let config = sdk_config(endpoint, s3.region(), s3.access_key(), secret_key, ca.cert_pem()).expect("S3 client").build();
    aws_sdk_s3::Client::from_conf(config)
}

#[tokio::test(flavor = "multi_thread")]
async fn presigned_urls_over_https_are_checked_by_s3s_fs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("sandbox-ca").expect("ca");
    let s3 = S3Endpoint::start(dir.path(), &ca)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        s3.https_url().starts_with("https://127.0.0.1:"),
        "{}",
        s3.https_url()
    );
    assert!(
        s3.http_url().starts_with("http://127.0.0.1:"),
        "{}",
        s3.http_url()
    );
    assert_eq!(s3.region(), "us-east-1");
    s3.create_bucket(BUCKET).await.expect("create bucket");
    assert!(
        s3.create_bucket(BUCKET).await.is_err(),
        "a bucket cannot be created twice"
    );

    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let client = s3_client(&s3, s3.https_url(), &ca, s3.secret_key());
    client
        .put_object()
        .bucket(BUCKET)
        .key("hc/etcd-0.snapshot")
        .body(ByteStream::from(payload.clone()))
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "put over https: {}",
                aws_sdk_s3::error::DisplayErrorContext(e)
            )
        });

    // The plain-http endpoint serves the same store.
    let plain = s3_client(&s3, s3.http_url(), &ca, s3.secret_key());
    let listed = plain
        .list_objects_v2()
        .bucket(BUCKET)
        .send()
        .await
        .expect("list over http");
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, ["hc/etcd-0.snapshot"]);

    // A wrong secret is refused.
    let wrong = s3_client(
        &s3,
        s3.https_url(),
        &ca,
        "not-the-secret-key-at-all-0000000000000",
    );
    assert!(
        wrong.list_objects_v2().bucket(BUCKET).send().await.is_err(),
        "bad signature accepted"
    );

    let presigned = client
        .get_object()
        .bucket(BUCKET)
        .key("hc/etcd-0.snapshot")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(3600)).expect("presign config"))
        .await
        .expect("presign");
    let url = presigned.uri().to_string();
    assert!(url.starts_with(s3.https_url()), "{url}");
    assert!(url.contains("X-Amz-Signature="), "{url}");

    let (status, body) = https_get(&url, ca.cert_pem()).await.expect("GET presigned");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body.as_ref(), payload.as_slice());

    // Flip one hex digit of the signature: refused.
    let sig_at = url.find("X-Amz-Signature=").expect("signature") + "X-Amz-Signature=".len();
    let mut tampered = url.clone().into_bytes();
    tampered[sig_at] = if tampered[sig_at] == b'0' { b'1' } else { b'0' };
    let tampered = String::from_utf8(tampered).expect("ascii url");
    let (status, body) = https_get(&tampered, ca.cert_pem())
        .await
        .expect("GET tampered");
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));

    // A URL signed two hours ago for one hour has expired.
    let expired = client
        .get_object()
        .bucket(BUCKET)
        .key("hc/etcd-0.snapshot")
        .presigned(
            PresigningConfig::builder()
                .start_time(std::time::SystemTime::now() - Duration::from_secs(7200))
                .expires_in(Duration::from_secs(3600))
                .build()
                .expect("presign config"),
        )
        .await
        .expect("presign");
    let (status, body) = https_get(expired.uri(), ca.cert_pem())
        .await
        .expect("GET expired");
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));

    // An HTTPS client that does not trust the sandbox CA cannot even connect.
    let stranger = Ca::new("stranger").expect("ca");
    assert!(https_get(&url, stranger.cert_pem()).await.is_err());
}
