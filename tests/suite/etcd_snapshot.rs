//! Snapshots of a real etcd streamed into the local and the S3 store, then
//! restored with `etcdctl snapshot restore` into a scratch member whose every
//! key is compared with the source.

use std::path::Path;
use std::time::Duration;

use hcp_dr::etcd::Member;
use hcp_dr::store::{LocalStore, S3Options, S3Store, Store};
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::etcd::{EtcdProcess, connect_client, restore_scratch};
use hcp_dr_e2e::procs::s3::S3Endpoint;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

type KeyValues = Vec<(Vec<u8>, Vec<u8>)>;

async fn all_keys(url: &str) -> KeyValues {
    let mut client = connect_client(&[url.to_string()], None).await.unwrap();
    let resp = client
        .get(vec![0u8], Some(etcd_client::GetOptions::new().with_from_key()))
        .await
        .unwrap();
    resp.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect()
}

async fn fill(url: &str) {
    let mut client = connect_client(&[url.to_string()], None).await.unwrap();
    for i in 0..300u32 {
        let key = format!("/kubernetes.io/configmaps/ns-{}/cm-{i:03}", i % 7);
        let value: Vec<u8> = (0..(i as usize * 37 % 2000)).map(|b| (b as u8) ^ (i as u8)).collect();
        client.put(key, value, None).await.unwrap();
    }
    client.put("/kubernetes.io/big", vec![0xabu8; 300_000], None).await.unwrap();
    client.delete("/kubernetes.io/configmaps/ns-0/cm-007", None).await.unwrap();
}

/// Restore `snapshot` into a new member and return its keys.
async fn restore_and_read(snapshot: &Path, dir: &Path) -> KeyValues {
    let mut member = restore_scratch(snapshot, dir).await.unwrap();
    let keys = all_keys(&member.client_url()).await;
    member.kill();
    keys
}

#[tokio::test]
async fn snapshot_to_local_store_restores_every_key() {
    let tmp = tempfile::tempdir().unwrap();
    let source = EtcdProcess::start_plain(&tmp.path().join("src")).await.unwrap();
    fill(&source.client_url()).await;
    let expected = all_keys(&source.client_url()).await;
    assert_eq!(expected.len(), 300, "299 configmaps and the big key");

    let store = LocalStore::new(tmp.path().join("store"));
    let member = Member { name: "etcd-0".into(), url: source.client_url(), tls: None };
    let report = member.snapshot_to(&store, "b/etcd/etcd-0.db").await.unwrap();

    let path = tmp.path().join("store/b/etcd/etcd-0.db");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(report.size, bytes.len() as u64);
    assert_eq!(report.sha256, format!("{:x}", Sha256::digest(&bytes)));
    let mut status = connect_client(&[source.client_url()], None).await.unwrap();
    assert_eq!(report.revision, status.status().await.unwrap().header().unwrap().revision());

    assert_eq!(restore_and_read(&path, &tmp.path().join("restored")).await, expected);
}

#[tokio::test]
async fn snapshot_to_s3_over_https_restores_every_key() {
    let tmp = tempfile::tempdir().unwrap();
    let source = EtcdProcess::start_plain(&tmp.path().join("src")).await.unwrap();
    fill(&source.client_url()).await;
    let expected = all_keys(&source.client_url()).await;

    let ca = Ca::new("test CA").unwrap();
    let s3 = S3Endpoint::start(&tmp.path().join("s3"), &ca).await.unwrap();
    s3.create_bucket("backups").await.unwrap();
    let ca_file = tmp.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let store = S3Store::connect(
        "backups".into(),
        "prefix".into(),
        S3Options {
            endpoint: Some(s3.https_url().to_string()),
            region: Some(s3.region().to_string()),
            ca_bundle: Some(ca_file),
            // small parts, so the 300 kB database goes through multipart upload
            part_size: 5 << 20,
            static_credentials: Some((s3.access_key().to_string(), s3.secret_key().to_string())),
            ..S3Options::default()
        },
    )
    .await
    .unwrap();
    let member = Member { name: "etcd-0".into(), url: source.client_url(), tls: None };
    let report = member.snapshot_to(&store, "b/etcd/etcd-0.db").await.unwrap();

    let mut bytes = Vec::new();
    store.get("b/etcd/etcd-0.db").await.unwrap().read_to_end(&mut bytes).await.unwrap();
    assert_eq!(report.size, bytes.len() as u64);
    assert_eq!(report.sha256, format!("{:x}", Sha256::digest(&bytes)));
    let listed = store.list("b/").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, "b/etcd/etcd-0.db");
    // the object really is under the prefix in the bucket
    assert!(s3.root().join("backups/prefix/b/etcd/etcd-0.db").exists());

    let path = tmp.path().join("downloaded.db");
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(restore_and_read(&path, &tmp.path().join("restored")).await, expected);
}

#[tokio::test]
async fn s3_multipart_upload_of_many_parts_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA").unwrap();
    let s3 = S3Endpoint::start(&tmp.path().join("s3"), &ca).await.unwrap();
    s3.create_bucket("backups").await.unwrap();
    let ca_file = tmp.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let store = S3Store::connect(
        "backups".into(),
        String::new(),
        S3Options {
            endpoint: Some(s3.https_url().to_string()),
            region: Some(s3.region().to_string()),
            ca_bundle: Some(ca_file),
            part_size: 5 << 20,
            parallelism: 2,
            static_credentials: Some((s3.access_key().to_string(), s3.secret_key().to_string())),
            ..S3Options::default()
        },
    )
    .await
    .unwrap();
    let data: Vec<u8> = (0..(17usize << 20) + 123).map(|i| (i * 31 % 251) as u8).collect();
    let report = store.put("big.bin", Box::new(&data[..])).await.unwrap();
    assert_eq!(report.size, data.len() as u64);
    assert_eq!(report.sha256, format!("{:x}", Sha256::digest(&data)));
    let mut back = Vec::new();
    store.get("big.bin").await.unwrap().read_to_end(&mut back).await.unwrap();
    assert!(back == data, "downloaded bytes differ");
    let url = store.presign_get("big.bin", Duration::from_secs(300)).await.unwrap().unwrap();
    assert!(url.starts_with(s3.https_url()), "{url}");
    let (code, body) = hcp_dr_e2e::procs::s3::https_get(&url, ca.cert_pem()).await.unwrap();
    assert_eq!(code, 200);
    assert_eq!(body.len(), data.len());
    store.delete("big.bin").await.unwrap();
    assert!(store.list("").await.unwrap().is_empty());
}
