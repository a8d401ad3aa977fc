//! `hcp-dr backups list|describe|verify|prune`: a catalogue read from the
//! store itself. Prune runs against an S3 store seeded with backups of known
//! ages and must leave exactly the ones its policy keeps, bytes included.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;

use chrono::{Duration, Utc};
use hcp_dr::archive::{self, Artifact, ClusterIdentity, Layout, Manifest, MemberSnapshot, Timings};
use hcp_dr::store::{S3Options, S3Store, Store};
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::s3::S3Endpoint;
use serde_json::Value;
use sha2::{Digest, Sha256};
use support::*;

struct Seeded {
    _tmp: tempfile::TempDir,
    s3: S3Endpoint,
    ca_file: PathBuf,
    store: S3Store,
}

async fn s3_store() -> Seeded {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA").unwrap();
    let s3 = S3Endpoint::start(&tmp.path().join("s3"), &ca).await.unwrap();
    s3.create_bucket("backups").await.unwrap();
    let ca_file = tmp.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let store = S3Store::connect(
        "backups".into(),
        "hcp".into(),
        S3Options {
            endpoint: Some(s3.https_url().to_string()),
            region: Some(s3.region().to_string()),
            ca_bundle: Some(ca_file.clone()),
            static_credentials: Some((s3.access_key().to_string(), s3.secret_key().to_string())),
            ..S3Options::default()
        },
    )
    .await
    .unwrap();
    Seeded { _tmp: tmp, s3, ca_file, store }
}

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A backup of `ns/hc` taken `hours_ago`, complete (manifest last) or not.
pub(crate) async fn seed(store: &dyn Store, ns: &str, hc: &str, hours_ago: i64, complete: bool) -> String {
    let taken = Utc::now() - Duration::hours(hours_ago);
    let id = archive::new_backup_id(taken);
    let layout = Layout::new(ns, hc, &id);
    let snapshot = format!("not a real snapshot of {hc} at {id}").repeat(100).into_bytes();
    let objects = b"objects".to_vec();
    let mut artifacts = vec![
        Artifact { name: Layout::snapshot_name("etcd-0"), size: snapshot.len() as u64, sha256: sha(&snapshot) },
        Artifact { name: archive::OBJECTS.into(), size: objects.len() as u64, sha256: sha(&objects) },
    ];
    store.put(&layout.artifact(&Layout::snapshot_name("etcd-0")), Box::new(&snapshot[..])).await.unwrap();
    store.put(&layout.objects(), Box::new(&objects[..])).await.unwrap();
    let sums = archive::sha256sums(&artifacts);
    store.put(&layout.sums(), Box::new(sums.as_bytes())).await.unwrap();
    artifacts.push(Artifact { name: archive::SHA256SUMS.into(), size: sums.len() as u64, sha256: sha(sums.as_bytes()) });
    if complete {
        let manifest = Manifest {
            format_version: archive::FORMAT_VERSION,
            tool_version: "test".into(),
            backup_id: id.clone(),
            cluster: ClusterIdentity {
                namespace: ns.into(),
                name: hc.into(),
                uid: "uid".into(),
                cluster_id: None,
                infra_id: None,
                hcp_namespace: format!("{ns}-{hc}"),
                platform: "None".into(),
                availability_policy: "SingleReplica".into(),
                release_image: "img".into(),
                encryption_key_secret: None,
                lineage: None,
                etcd_image: None,
            },
            etcd: vec![MemberSnapshot {
                member: "etcd-0".into(),
                artifact: Layout::snapshot_name("etcd-0"),
                revision: 1000 - hours_ago,
                size: snapshot.len() as u64,
                sha256: sha(&snapshot),
            }],
            artifacts,
            object_counts: Default::default(),
            timings: Timings { started: Some(taken), finished: Some(taken + Duration::seconds(7)), api_downtime_seconds: Some(2.5), stages: Default::default() },
            encryption: None,
            origin: None,
            etcd_health: Default::default(),
            agent_inventory: None,
            guest_volumes: None,
            compression: None,
            point_in_time: None,
        };
        store.put(&layout.manifest(), Box::new(&manifest.to_json()[..])).await.unwrap();
    }
    id
}

fn hcp_dr(seeded: &Seeded, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(args)
        .args(["--s3-endpoint", seeded.s3.https_url()])
        .env("HCP_DR_CA_BUNDLE", &seeded.ca_file)
        .env("AWS_ACCESS_KEY_ID", seeded.s3.access_key())
        .env("AWS_SECRET_ACCESS_KEY", seeded.s3.secret_key())
        .env("AWS_REGION", seeded.s3.region())
        .env_remove("HCP_DR_STORE")
        .output()
        .unwrap()
}

/// Backup ids still present on s3s-fs's disk for `ns/hc`.
fn on_disk(s3: &S3Endpoint, ns: &str, hc: &str) -> Vec<String> {
    let dir = s3.root().join("backups").join("hcp").join(ns).join(hc);
    let mut ids: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().filter(|e| dir_has_files(&e.path())).map(|e| e.file_name().to_string_lossy().to_string()).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

fn dir_has_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).map(|d| d.flatten().any(|e| e.path().is_file() || dir_has_files(&e.path()))).unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_and_prune_keep_exactly_what_the_policy_says() {
    let seeded = s3_store().await;
    // demo: a backup every 12 hours for 5 days (newest 1h old), plus a
    // crashed one (30h, no manifest) and one being written (now)
    let mut demo = Vec::new();
    for i in 0..10 {
        demo.push(seed(&seeded.store, "clusters", "demo", 1 + 12 * i, true).await);
    }
    let crashed = seed(&seeded.store, "clusters", "demo", 30, false).await;
    let writing = seed(&seeded.store, "clusters", "demo", 0, false).await;
    // old: only old backups
    let old: Vec<String> = vec![seed(&seeded.store, "clusters", "old", 24 * 40, true).await, seed(&seeded.store, "clusters", "old", 24 * 50, true).await];

    let out = hcp_dr(&seeded, &["backups", "list", "--store", "s3://backups/hcp", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.len(), 14);
    let ids: Vec<&str> = listed.iter().map(|e| e["backup_id"].as_str().unwrap()).collect();
    assert_eq!(ids[0], writing, "newest first");
    let incomplete: Vec<&str> = listed.iter().filter(|e| e["complete"] == false).map(|e| e["backup_id"].as_str().unwrap()).collect();
    assert_eq!(incomplete.len(), 2);
    assert!(incomplete.contains(&crashed.as_str()) && incomplete.contains(&writing.as_str()));
    let newest = listed.iter().find(|e| e["backup_id"] == demo[0].as_str()).unwrap();
    assert_eq!(newest["etcd_revision"], 999);
    assert_eq!(newest["api_downtime_seconds"], 2.5);
    let out = hcp_dr(&seeded, &["backups", "list", "--store", "s3://backups/hcp", "--hosted-cluster", "old"]);
    let text_out = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(text_out.lines().count(), 3, "{text_out}");

    // dry-run: the plan, nothing deleted
    let policy = ["--keep-last", "2", "--keep-daily", "4"];
    let mut args = vec!["backups", "prune", "--store", "s3://backups/hcp", "--hosted-cluster", "demo", "--dry-run", "-o", "json"];
    args.extend(policy);
    let out = hcp_dr(&seeded, &args);
    assert!(out.status.success(), "{}", text(&out));
    let plan: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(plan.iter().all(|e| e["deleted"] == false));
    assert_eq!(on_disk(&seeded.s3, "clusters", "demo").len(), 12);

    // keep-last 2 (demo[0], demo[1]) + keep-daily 4: the newest of each of the
    // last 4 days that have a backup; the crashed one goes, the one being written stays
    let kept_by_plan: Vec<&str> = plan.iter().filter(|e| e["keep"] == true).map(|e| e["backup_id"].as_str().unwrap()).collect();
    let mut args = vec!["backups", "prune", "--store", "s3://backups/hcp", "--hosted-cluster", "demo", "-o", "json"];
    args.extend(policy);
    let out = hcp_dr(&seeded, &args);
    assert!(out.status.success(), "{}", text(&out));
    let mut remaining = on_disk(&seeded.s3, "clusters", "demo");
    let mut expected: Vec<String> = kept_by_plan.iter().map(|s| s.to_string()).collect();
    expected.sort();
    remaining.sort();
    assert_eq!(remaining, expected, "the bytes left on S3 are exactly the kept backups");
    assert!(remaining.contains(&writing), "a backup being written was removed");
    assert!(!remaining.contains(&crashed), "the crashed backup's bytes remain");
    assert!(remaining.contains(&demo[0]) && remaining.contains(&demo[1]));
    // one complete backup per calendar day among the complete ones kept
    let complete_kept = remaining.iter().filter(|id| demo.contains(id)).count();
    assert!((4..=5).contains(&complete_kept), "{remaining:?}");

    // max-age on a cluster whose backups are all old: its newest stays
    let out = hcp_dr(&seeded, &["backups", "prune", "--store", "s3://backups/hcp", "--hosted-cluster", "old", "--max-age", "30d"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("never removed"), "{}", text(&out));
    assert_eq!(on_disk(&seeded.s3, "clusters", "old"), vec![old[0].clone()]);

    // no policy: refused, nothing deleted
    let out = hcp_dr(&seeded, &["backups", "prune", "--store", "s3://backups/hcp"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--keep-last"), "{}", text(&out));
    let out = hcp_dr(&seeded, &["backups", "prune", "--store", "s3://backups/hcp", "--max-age", "5 fortnights"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--max-age") && text(&out).contains("1h to 36500d"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn describe_and_verify_a_real_backup_deeply_and_catch_damage() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "-o", "json", "--to", store.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let url = report["backup"].as_str().unwrap().to_string();
    let revision = report["etcd_revision"].as_i64().unwrap();
    let latest = format!("{}/clusters/demo/latest", store.display());

    let out = env.hcp_dr(&["backups", "describe", &latest], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let described = String::from_utf8_lossy(&out.stdout);
    assert!(described.contains(&format!("revision {revision}")), "{described}");
    assert!(described.contains("(used by restore)"), "{described}");
    assert!(described.contains("demo-etcd-encryption-key"), "{described}");

    let out = env.hcp_dr(&["backups", "verify", &url, "--deep", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let verified = json_report(&out);
    assert_eq!(verified["ok"], true, "{verified:#}");
    let snap = &verified["snapshots"][0];
    assert_eq!(snap["revision"].as_i64(), Some(revision));
    assert!(snap["live_keys"].as_u64().unwrap() > 40);
    assert_eq!(snap["restored_keys"], snap["live_keys"], "the scratch etcd and the offline reading agree: {verified:#}");
    // each byte read once, the deep restore included (it used to be three times the snapshot)
    let (checked, read) = (verified["bytes_checked"].as_u64().unwrap(), verified["bytes_read"].as_u64().unwrap());
    println!("backups verify --deep read {read} bytes for {checked} bytes of artifacts: {:.3}x", read as f64 / checked as f64);
    let manifest = std::fs::metadata(PathBuf::from(url.strip_prefix("file://").unwrap()).join("manifest.json")).unwrap().len();
    assert_eq!(read, checked + manifest, "each artifact once, the manifest once: {verified:#}");

    // one flipped byte in the snapshot: FAILED, exit 1
    let folder = PathBuf::from(url.strip_prefix("file://").unwrap());
    let file = folder.join("etcd/etcd-0.db");
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let out = env.hcp_dr(&["backups", "verify", &url], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("damaged or was tampered with"), "{}", text(&out));

    // not a backup URL: exit 2 with what to give
    let out = env.hcp_dr(&["backups", "describe", store.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("<namespace>/<cluster>/<backup-id>"), "{}", text(&out));
}
