//! `hcp-dr etcd restore` on the sandbox: real etcd members, real binary.
//! A backup is taken, more writes follow, and the restore must bring every
//! member back to exactly the backup's keys at a revision above any the
//! cluster had reached, with older revisions compacted; bad snapshots and a
//! deleting retention policy are refused before anything changes.

use crate::support;


use hcp_dr_e2e::drill::member_clients;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use support::etcd_data::*;
use support::{Env, env, json_report, text};

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().is_dir() {
            out.extend(walk(&entry.path()));
        } else {
            out.push(entry.path());
        }
    }
    out
}

fn restore_args<'a>(env: &'a Env, extra: &[&'a str], endpoint: &'a str) -> Vec<&'a str> {
    let _ = env;
    let mut args = vec!["etcd", "restore", "--hosted-cluster", "demo", "-n", "clusters", "-o", "json", "--s3-endpoint", endpoint];
    args.extend_from_slice(extra);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_restore_puts_every_member_back_to_the_backup_above_the_reached_revision() {
    let env = env("HighlyAvailable").await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    for i in 0..20 {
        put(&env, &format!("{BEFORE}{i:02}"), &format!("value-{i}")).await;
    }

    // The backup, to S3.
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "backup:\n{}", text(&out));
    let store = format!("s3://{}/backups", hcp_dr_e2e::sandbox::BUCKET);

    // Writes after the backup: new keys and a changed one.
    for i in 0..30 {
        put(&env, &format!("{AFTER}{i:02}"), "later").await;
    }
    let reached = put(&env, &format!("{BEFORE}00"), "changed after the backup").await;
    let uids_before = claim_uids(&env).await;

    // Refused before any change: a snapshot that is not one, a damaged one,
    // a local file with no staging store, and whenScaled: Delete.
    let scratch = tempfile::tempdir().unwrap();
    let junk = scratch.path().join("junk.db");
    std::fs::write(&junk, b"this is not an etcd snapshot").unwrap();
    let staging = format!("s3://{}/staging", hcp_dr_e2e::sandbox::BUCKET);
    let out = env.hcp_dr(&restore_args(&env, &["--from", junk.to_str().unwrap()], &endpoint), &[]);
    assert_eq!(out.status.code(), Some(2), "local file without staging:\n{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--stage-snapshot-to"), "{}", text(&out));
    let out = env.hcp_dr(&restore_args(&env, &["--from", junk.to_str().unwrap(), "--stage-snapshot-to", &staging], &endpoint), &[]);
    assert!(!out.status.success(), "junk accepted:\n{}", text(&out));
    let report = json_report(&out);
    assert!(report.to_string().contains("NOT A SNAPSHOT"), "{report:#}");
    // A real snapshot with one byte flipped.
    let damaged = scratch.path().join("damaged.db");
    {
        let (_, _, mut client) = member_clients(&env.mgmt, &env.hcp_ns()).await.unwrap().remove(0);
        let mut stream = client.snapshot().await.unwrap();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            bytes.extend_from_slice(chunk.blob());
        }
        let at = bytes.len() / 2;
        bytes[at] ^= 0x55;
        std::fs::write(&damaged, bytes).unwrap();
    }
    let out = env.hcp_dr(&restore_args(&env, &["--from", damaged.to_str().unwrap(), "--stage-snapshot-to", &staging], &endpoint), &[]);
    assert!(!out.status.success(), "damaged snapshot accepted:\n{}", text(&out));
    assert!(json_report(&out).to_string().contains("HASH MISMATCH"), "{}", text(&out));
    let sts: Api<StatefulSet> = Api::namespaced(env.mgmt.clone(), &env.hcp_ns());
    let retention = |when: &str| json!({"spec": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": when}}});
    sts.patch("etcd", &PatchParams::default(), &Patch::Merge(&retention("Delete"))).await.unwrap();
    let out = env.hcp_dr(&restore_args(&env, &["--from", &store, "--backup-id", "latest"], &endpoint), &[]);
    assert!(!out.status.success(), "whenScaled: Delete accepted:\n{}", text(&out));
    assert!(json_report(&out).to_string().contains("whenScaled: Delete"), "{}", text(&out));
    sts.patch("etcd", &PatchParams::default(), &Patch::Merge(&retention("Retain"))).await.unwrap();
    env.assert_in_service("after the refusals").await;
    assert_eq!(etcd_replicas(&env).await, 3);
    assert_eq!(claim_uids(&env).await, uids_before, "a refused restore touched the volumes");

    // A dry-run verifies the snapshot and changes nothing.
    let out = env.hcp_dr(&restore_args(&env, &["--from", &store, "--backup-id", "latest", "--dry-run"], &endpoint), &[]);
    assert!(out.status.success(), "dry-run:\n{}", text(&out));
    let plan = json_report(&out).to_string();
    assert!(plan.contains("--mark-compacted") && plan.contains("data-etcd-1"), "{plan}");
    env.assert_in_service("after the dry-run").await;
    assert_eq!(claim_uids(&env).await, uids_before);

    // The restore.
    let out = env.hcp_dr(&restore_args(&env, &["--from", &store, "--backup-id", "latest"], &endpoint), &[]);
    assert!(out.status.success(), "etcd restore:\n{}", text(&out));
    let report = json_report(&out);
    assert_restored_to_backup(&env, &report, reached, &uids_before).await;
    // Back in service, nothing left behind.
    env.assert_in_service("after the restore").await;
    let leftovers = Api::<Pod>::namespaced(env.mgmt.clone(), &env.hcp_ns())
        .list(&ListParams::default().labels("app.kubernetes.io/name=hcp-dr-etcd-restore"))
        .await
        .unwrap();
    assert!(leftovers.items.is_empty(), "restore pods left");
    let secret = Api::<Secret>::namespaced(env.mgmt.clone(), &env.hcp_ns()).get_opt("hcp-dr-etcd-restore").await.unwrap();
    assert!(secret.is_none(), "the URL secret was left");
    // An encrypted backup: refused without the key, restored with it through
    // a decrypted copy that is gone afterwards.
    let keys = tempfile::tempdir().unwrap();
    let identity = age::x25519::Identity::generate();
    let recipient = identity.to_public().to_string();
    let key_file = keys.path().join("backup.key");
    std::fs::write(&key_file, format!("{}\n", age::secrecy::ExposeSecret::expose_secret(&identity.to_string()))).unwrap();
    let encrypted_store = format!("s3://{}/encrypted", hcp_dr_e2e::sandbox::BUCKET);
    let out = env.hcp_dr(
        &["backup", "--hosted-cluster", "demo", "-o", "json", "--to", &encrypted_store, "--s3-endpoint", &endpoint, "--encrypt-to", &recipient],
        &[],
    );
    assert!(out.status.success(), "encrypted backup:\n{}", text(&out));
    put(&env, &format!("{AFTER}encrypted"), "after the encrypted backup").await;
    let out = env.hcp_dr(&restore_args(&env, &["--from", &encrypted_store, "--backup-id", "latest"], &endpoint), &[]);
    assert_eq!(out.status.code(), Some(2), "no identity:\n{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&recipient), "{}", text(&out));
    env.assert_in_service("after the refused encrypted restore").await;
    let out = env.hcp_dr(
        &restore_args(&env, &["--from", &encrypted_store, "--backup-id", "latest", "--identity", key_file.to_str().unwrap()], &endpoint),
        &[],
    );
    assert!(out.status.success(), "encrypted etcd restore:\n{}", text(&out));
    let after_encrypted = member_values(&env, AFTER).await;
    assert!(after_encrypted.values().all(|(_, kvs)| kvs.is_empty()), "{after_encrypted:?}");
    assert!(member_values(&env, BEFORE).await.values().all(|(_, kvs)| kvs.len() == 20));
    let staging_dir = env.sandbox.s3.root().join(hcp_dr_e2e::sandbox::BUCKET).join("encrypted").join("hcp-dr-staging");
    let left: Vec<_> = walk(&staging_dir);
    assert!(left.is_empty(), "the decrypted copy was left: {left:?}");
    env.assert_in_service("after the encrypted restore").await;

    // The hosted API answers again on the restored data.
    let workloads = hcp_dr_e2e::drill::member_keys(&env.mgmt, &env.hcp_ns(), &format!("/kubernetes.io/configmaps/{}/", hcp_dr_e2e::drill::WORKLOAD_NS))
        .await
        .unwrap();
    assert!(workloads.iter().all(|(_, _, keys)| !keys.is_empty()), "{workloads:?}");
}
