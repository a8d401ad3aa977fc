//! Client-side encryption on the sandbox: backups taken with `--encrypt-to`
//! (to a local store and to S3) are checked with and without the key,
//! restored onto mgmt-b with `--identity` (through a decrypted staging copy
//! that is deleted afterwards) and serve the backup's data; a wrong or
//! missing identity is refused before the destination changes; and no
//! secret value of the cluster appears in any stored artifact, journal,
//! temporary file or output of any command.

use crate::support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use hcp_dr::archive::encryption::{Identities, decrypting_reader};
use hcp_dr_e2e::drill::{WORKLOAD_NS, WORKLOAD_OBJECTS, hosted_client};
use hcp_dr_e2e::sandbox::{BUCKET, api_for, wait_available};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::Api;
use serde_json::{Value, json};
use support::*;
use tokio::io::AsyncReadExt;

/// An age key file as `age-keygen -o` writes it, and its public key.
fn key_file(dir: &Path, name: &str) -> (PathBuf, String) {
    let identity = age::x25519::Identity::generate();
    let public = identity.to_public().to_string();
    let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
    let path = dir.join(name);
    std::fs::write(&path, format!("# created: 2026-11-21T18:00:00Z\n# public key: {public}\n{secret}\n")).unwrap();
    (path, public)
}

/// Values that must never be readable outside an encrypted artifact: the
/// etcd encryption key and the pull secret of the hosted cluster (in the
/// objects archive), and a workload secret of the hosted cluster (in the
/// etcd snapshots), each as stored (base64) and, for the workload one, raw.
async fn canaries(env: &Env) -> Vec<String> {
    let secrets: Api<Secret> = Api::namespaced(env.mgmt.clone(), "clusters");
    let mut out = Vec::new();
    for (name, key) in [("demo-etcd-encryption-key", "key"), ("demo-pull-secret", ".dockerconfigjson")] {
        let secret = serde_json::to_value(secrets.get(name).await.unwrap()).unwrap();
        out.push(secret["data"][key].as_str().unwrap_or_else(|| panic!("{name} has no {key}")).to_string());
    }
    out.push("drill-secret-7".into());
    out.push(serde_json::to_value(k8s_openapi::ByteString(b"drill-secret-7".to_vec())).unwrap().as_str().unwrap().trim_end_matches('=').to_string());
    out
}

/// Which canaries `bytes` shows: as they are, and inside a gzip'd tar of
/// JSON objects (an unencrypted objects archive).
fn leaks(bytes: &[u8], canaries: &[String]) -> Vec<String> {
    let mut texts = vec![String::from_utf8_lossy(bytes).to_string()];
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut plain = Vec::new();
        if flate2::read::GzDecoder::new(bytes).read_to_end(&mut plain).is_ok() {
            texts.push(String::from_utf8_lossy(&plain).to_string());
        }
    }
    canaries.iter().filter(|c| texts.iter().any(|t| t.contains(c.as_str()))).cloned().collect()
}

/// Every file under `dir` that shows a canary.
fn leaking_files(dir: &Path, canaries: &[String]) -> Vec<String> {
    files(dir)
        .into_iter()
        .filter_map(|f| {
            let bytes = std::fs::read(dir.join(&f)).ok()?;
            let found = leaks(&bytes, canaries);
            (!found.is_empty()).then(|| format!("{}/{f}: {found:?}", dir.display()))
        })
        .collect()
}

/// Runs hcp-dr and keeps every output, to scan them all at the end.
struct Runs<'a> {
    env: &'a Env,
    tmp: PathBuf,
    outputs: Vec<(String, Output)>,
}

impl Runs<'_> {
    fn run(&mut self, args: &[&str]) -> Output {
        let tmp = self.tmp.to_str().unwrap().to_string();
        let out = self.env.hcp_dr(args, &[("TMPDIR", &tmp), ("HCP_DR_LOG", "warn,hcp_dr=debug")]);
        self.outputs.push((args.join(" "), out.clone()));
        out
    }

    fn leaking_outputs(&self, canaries: &[String]) -> Vec<String> {
        self.outputs
            .iter()
            .filter_map(|(cmd, out)| {
                let found = leaks(text(out).as_bytes(), canaries);
                (!found.is_empty()).then(|| format!("`hcp-dr {cmd}`: {found:?}"))
            })
            .collect()
    }
}

async fn decrypt_file(path: &Path, identities: &Identities) -> Vec<u8> {
    let body = Box::new(tokio::fs::File::open(path).await.unwrap());
    let mut out = Vec::new();
    decrypting_reader(body, identities, "test", &[]).await.unwrap().read_to_end(&mut out).await.unwrap();
    out
}

/// What the zstd stream `compressed` decompresses to.
async fn unzstd(compressed: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    hcp_dr::archive::compression::decompressing_unbounded(compressed, "test").unwrap().read_to_end(&mut out).await.unwrap();
    out
}

/// Delete `demo` from a management cluster and wait for its control plane
/// to go; with `all`, its namespace (secrets and all) too.
async fn retire(client: &kube::Client, all: bool) {
    let hc = api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    hc.delete("demo", &Default::default()).await.expect("delete HC");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut gone = vec!["clusters-demo"];
    for _ in 0..360 {
        if namespaces.get_opt("clusters-demo").await.expect("ns").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if all {
        namespaces.delete("clusters", &Default::default()).await.expect("delete namespace clusters");
        gone.push("clusters");
    }
    for _ in 0..360 {
        let mut left = Vec::new();
        for ns in &gone {
            if namespaces.get_opt(ns).await.expect("ns").is_some() {
                left.push(*ns);
            }
        }
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("namespaces {gone:?} were not removed");
}

/// The restored cluster on mgmt-b serves the backup's workloads.
async fn assert_restored(b: &kube::Client) {
    wait_available(b, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");
    let hosted = hosted_client(b, "clusters", "demo").await.expect("hosted client on mgmt-b");
    let cms = Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS).list(&Default::default()).await.expect("configmaps");
    let secrets = Api::<Secret>::namespaced(hosted, WORKLOAD_NS).list(&Default::default()).await.expect("secrets");
    assert_eq!(cms.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("config-"))).count(), WORKLOAD_OBJECTS);
    assert_eq!(secrets.items.iter().filter(|s| s.metadata.name.as_deref().is_some_and(|n| n.starts_with("secret-"))).count(), WORKLOAD_OBJECTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn encrypted_backups_restore_with_the_key_only_and_never_leak_a_secret() {
    let env = env("SingleReplica").await;
    let keys = env.dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (identity, recipient) = key_file(&keys, "backup.key");
    let (second, second_recipient) = key_file(&keys, "second.key");
    let (wrong, wrong_recipient) = key_file(&keys, "wrong.key");
    let canaries = canaries(&env).await;
    let tmp = env.dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut runs = Runs { env: &env, tmp: tmp.clone(), outputs: Vec::new() };
    let (identity_arg, wrong_arg) = (identity.to_str().unwrap().to_string(), wrong.to_str().unwrap().to_string());

    // a bad recipient is bad input, before anything changes
    let store = env.local_store();
    let out = runs.run(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--encrypt-to", "age1notakey"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an age X25519 public key"), "{}", text(&out));
    assert!(files(&store).is_empty(), "a refused backup wrote {:?}", files(&store));

    // encrypted backups: to a local store (two recipients) and to S3
    let out = runs.run(&["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--encrypt-to", &recipient, "--encrypt-to", &second_recipient, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let local = PathBuf::from(json_report(&out)["backup"].as_str().unwrap().strip_prefix("file://").unwrap());
    let mut args = vec!["backup", "--hosted-cluster", "demo", "--encrypt-to", &recipient, "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = runs.run(&args);
    assert!(out.status.success(), "{}", text(&out));
    let s3_backup = json_report(&out)["backup"].as_str().unwrap().to_string();

    // the manifest says what is encrypted and to whom; SHA256SUMS checks the stored bytes
    let manifest: Value = serde_json::from_slice(&std::fs::read(local.join("manifest.json")).unwrap()).unwrap();
    // compressed (the default) before it is encrypted: format version 3
    assert_eq!(manifest["format_version"], 3, "{manifest:#}");
    assert_eq!(manifest["compression"]["algorithm"], "zstd", "{manifest:#}");
    assert_eq!(manifest["encryption"]["scheme"], "age");
    assert_eq!(manifest["encryption"]["recipients"], json!([recipient, second_recipient]));
    let encrypted: Vec<&str> = manifest["encryption"]["artifacts"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(encrypted, ["etcd/etcd-0.db", "objects.tar.gz"], "{manifest:#}");
    for name in &encrypted {
        let stored = std::fs::read(local.join(name)).unwrap();
        assert!(stored.starts_with(b"age-encryption.org/v1\n"), "{name} is not an age file");
    }
    let sums = std::process::Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(&local).output().expect("sha256sum");
    assert!(sums.status.success(), "sha256sum -c: {}", text(&sums));

    // control: the scan below would find the secrets, they are in the decrypted artifacts
    let ids = Identities::from_file(&second).unwrap();
    let objects = decrypt_file(&local.join("objects.tar.gz"), &ids).await;
    assert_eq!(leaks(&objects, &canaries[..2]), canaries[..2].to_vec(), "the canaries are not in the objects archive");
    let snapshot = decrypt_file(&local.join("etcd/etcd-0.db"), &ids).await;
    assert!(snapshot.starts_with(&hcp_dr::archive::compression::MAGIC), "the snapshot is compressed before it is encrypted");
    let snapshot = unzstd(&snapshot).await;
    assert!(!leaks(&snapshot, &canaries[2..]).is_empty(), "the workload secret is not in the snapshot");

    // verify without the key: the stored bytes only, and it says what the plaintext needs
    let local_arg = local.to_str().unwrap().to_string();
    let out = runs.run(&["backups", "verify", &local_arg]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("encrypted (age) to {recipient}, {second_recipient}")), "{}", text(&out));
    assert!(stdout.contains("needs --identity"), "{}", text(&out));
    let out = runs.run(&["backups", "verify", &local_arg, "-o", "json"]);
    let report = json_report(&out);
    assert_eq!((report["ok"].as_bool(), report["plaintext_checked"].as_bool()), (Some(true), Some(false)), "{report:#}");
    // with it: every plaintext checked, the snapshot read offline
    let out = runs.run(&["backups", "verify", &local_arg, "--identity", &identity_arg, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["plaintext_checked"], true, "{report:#}");
    assert!(report["objects"].as_u64().unwrap() > 5, "{report:#}");
    assert_eq!(report["snapshots"][0]["verdict"], "OK", "{report:#}");
    // a wrong key: bad input, naming the recipients
    let out = runs.run(&["backups", "verify", &local_arg, "--identity", &wrong_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("none of the identities in {wrong_arg} can decrypt")), "{}", text(&out));
    assert!(stderr.contains(&recipient) && stderr.contains(&wrong_recipient), "{}", text(&out));

    // snapshot verify: refused without the key (naming the recipients), read with it
    let snapshot_arg = local.join("etcd/etcd-0.db").to_str().unwrap().to_string();
    let out = runs.run(&["snapshot", "verify", &snapshot_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("is encrypted (age) to {recipient}")), "{}", text(&out));
    let out = runs.run(&["snapshot", "verify", &snapshot_arg, "--identity", &identity_arg]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(": OK"), "{}", text(&out));

    // killed before `package`, resumed without the flag: the journal keeps the
    // recipients and the plaintext digests, and the manifest is complete
    let resumed_store = env.dir.path().join("resumed-store");
    let journal = env.dir.path().join("encrypted-backup.jsonl");
    let mut child = env
        .command(
            &["backup", "--hosted-cluster", "demo", "--to", resumed_store.to_str().unwrap(), "--journal", journal.to_str().unwrap(), "--encrypt-to", &recipient],
            &[("HCP_DR_TEST_HOLD_IN", "package"), ("TMPDIR", tmp.to_str().unwrap())],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = format!("\"event\":\"started\",\"stage\":\"package\"");
    for _ in 0..240 {
        if std::fs::read_to_string(&journal).unwrap_or_default().contains(&started) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(std::fs::read_to_string(&journal).unwrap_or_default().contains(&started), "package never started");
    child.kill().unwrap();
    child.wait().unwrap();
    let out = runs.run(&["backup", "--resume", journal.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let resumed = json_report(&out)["backup"].as_str().unwrap().strip_prefix("file://").unwrap().to_string();
    let out = runs.run(&["backups", "verify", &resumed, "--identity", &identity_arg, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json_report(&out)["plaintext_checked"], true, "{}", text(&out));

    // restore: without a key, or with the wrong one, refused before the destination changes
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let endpoint = env.sandbox.s3.https_url().to_string();
    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    let namespaces_b: Api<Namespace> = Api::all(b.clone());
    for (extra, expect) in [
        (vec![], format!("is encrypted (age) to {recipient}: pass --identity FILE")),
        (vec!["--identity", wrong_arg.as_str()], format!("none of the identities in {wrong_arg} can decrypt backup")),
    ] {
        let mut args = vec!["restore", "--from", &s3_backup, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b];
        args.extend(extra);
        let out = runs.run(&args);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&expect), "{}", text(&out));
        assert!(namespaces_b.get_opt("clusters").await.unwrap().is_none(), "a refused restore changed the destination");
    }

    // the plan names the decrypted copy, staged in the backup's own S3 store
    let out = runs.run(&["restore", "--from", &s3_backup, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--identity", &identity_arg, "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("decrypt (--identity) and decompress the snapshot into a temporary copy at s3://{BUCKET}/backups/hcp-dr-staging/")), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("presign it for 900s"), "{}", text(&out));

    // with the key: restored on mgmt-b from the decrypted copy, which is then deleted
    retire(&env.mgmt, false).await;
    let out = runs.run(&["restore", "--from", &s3_backup, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--identity", &identity_arg, "--wait", "5m", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    let stage = |name: &str| report["stages"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()["output"].clone();
    let url = stage("snapshot-url");
    assert_eq!(url["staged"], true, "{url}");
    assert_eq!(url["store"], format!("s3://{BUCKET}/backups"), "{url}");
    let staged = env.sandbox.s3.root().join(BUCKET).join("backups").join(url["key"].as_str().unwrap());
    assert!(!staged.exists(), "the decrypted snapshot copy {} was not deleted", staged.display());
    assert!(!text(&out).contains("X-Amz-Signature"), "{}", text(&out));
    assert_restored(&b).await;
    // the journal recorded the identity's path and the short URL life, never a key
    let journal = std::fs::read_to_string(report["journal"].as_str().unwrap()).unwrap();
    let header: Value = serde_json::from_str(journal.lines().next().unwrap()).unwrap();
    assert_eq!(header["header"]["inputs"]["identity"], json!(identity_arg), "{header:#}");
    assert_eq!(header["header"]["inputs"]["presign_ttl_seconds"], 900, "{header:#}");
    assert!(!journal.contains("AGE-SECRET-KEY"), "a private key in the journal");

    // the local backup too (the second recipient's key), its decrypted
    // snapshot staged in --stage-snapshot-to and deleted there
    retire(&b, true).await;
    let staging = format!("s3://{BUCKET}/staging");
    let second_arg = second.to_str().unwrap().to_string();
    let out = runs.run(&["restore", "--from", &local_arg, "--stage-snapshot-to", &staging, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--identity", &second_arg, "--wait", "5m", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let url = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "snapshot-url").unwrap()["output"].clone();
    assert_eq!(url["store"], staging, "{url}");
    let staged = env.sandbox.s3.root().join(BUCKET).join("staging").join(url["key"].as_str().unwrap());
    assert!(!staged.exists(), "the decrypted snapshot copy {} was not deleted", staged.display());
    assert_restored(&b).await;

    // nothing readable anywhere: stores, journals, temporary files, outputs
    let mut found = leaking_files(&store, &canaries);
    found.extend(leaking_files(&resumed_store, &canaries));
    found.extend(leaking_files(&env.sandbox.s3.root().join(BUCKET), &canaries));
    found.extend(leaking_files(&env.dir.path().join("state"), &canaries));
    found.extend(leaking_files(&tmp, &canaries));
    found.extend(runs.leaking_outputs(&canaries));
    assert!(found.is_empty(), "secret values readable outside the encrypted artifacts:\n{}", found.join("\n"));
    assert!(files(&tmp).is_empty(), "temporary files left behind: {:?}", files(&tmp));
    let secret_keys: Vec<String> = [&identity, &second, &wrong]
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap().lines().last().unwrap().to_string())
        .collect();
    assert!(runs.leaking_outputs(&secret_keys).is_empty(), "a private key was printed");
}
