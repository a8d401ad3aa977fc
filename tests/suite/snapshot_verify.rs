//! `hcp-dr snapshot verify` on snapshots of a real etcd saved with
//! `etcdctl snapshot save`: the numbers must equal `etcdctl snapshot status`
//! on the same file, the live keys must equal what was written, and damaged
//! copies must get the right verdict and exit code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use etcd_client::{CompactionOptions, GetOptions};
use hcp_dr::etcd::verify::{Report, Verdict, VerifyError, verify_file, verify_store_object};
use hcp_dr::store::{LocalStore, S3Options, S3Store, Store, hex};
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::etcd::{EtcdProcess, connect_client};
use hcp_dr_e2e::procs::find_program;
use hcp_dr_e2e::procs::s3::S3Endpoint;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A snapshot of a real etcd and what it must contain.
struct Fixture {
    dir: tempfile::TempDir,
    etcd: EtcdProcess,
    snapshot: PathBuf,
    /// Live keys per resource prefix, as written.
    expected: BTreeMap<String, u64>,
    /// Deletions after the compaction (earlier tombstones are compacted away).
    tombstones: u64,
    compacted_at: i64,
    /// `etcdctl snapshot status -w json` on the snapshot.
    status: Value,
}

fn etcdctl() -> Command {
    let program =
        find_program("etcdctl", "apt-get install etcd-client").expect("etcdctl is required");
    let mut cmd = Command::new(program);
    cmd.env("ETCDCTL_API", "3");
    cmd
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn resource(key: &str) -> String {
    let segments: Vec<&str> = key.split('/').collect();
    format!("/{}/{}/", segments[1], segments[2])
}

async fn put(
    client: &mut etcd_client::Client,
    live: &mut BTreeSet<String>,
    key: String,
    size: usize,
) {
    let value: Vec<u8> = (0..size).map(|b| (b * 31 + key.len()) as u8).collect();
    client.put(key.as_str(), value, None).await.expect("put");
    live.insert(key);
}

/// Delete `key` if the test wrote it and has not deleted it yet; 1 when deleted.
async fn delete(client: &mut etcd_client::Client, live: &mut BTreeSet<String>, key: String) -> u64 {
    if !live.remove(&key) {
        return 0;
    }
    let deleted = client
        .delete(key.as_str(), None)
        .await
        .expect("delete")
        .deleted();
    assert_eq!(deleted, 1, "{key} existed");
    1
}

/// Write secrets and configmaps (one larger than a page), overwrite some,
/// delete some before and some after a compaction, then save a snapshot.
async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdProcess::start_plain(&dir.path().join("etcd"))
        .await
        .expect("start etcd (apt-get install etcd-server)");
    let mut client = connect_client(&[etcd.client_url()], None)
        .await
        .expect("etcd client");
    let mut live = BTreeSet::new();
    for i in 0..240usize {
        put(
            &mut client,
            &mut live,
            format!("/kubernetes.io/secrets/ns-{}/secret-{i:03}", i % 4),
            50 + i * 13 % 700,
        )
        .await;
    }
    for i in 0..150usize {
        put(
            &mut client,
            &mut live,
            format!("/kubernetes.io/configmaps/ns-{}/cm-{i:03}", i % 3),
            20 + i * 7 % 300,
        )
        .await;
    }
    put(
        &mut client,
        &mut live,
        "/kubernetes.io/configmaps/big/huge".into(),
        200_000,
    )
    .await;
    for i in (0..240usize).step_by(24) {
        delete(
            &mut client,
            &mut live,
            format!("/kubernetes.io/secrets/ns-{}/secret-{i:03}", i % 4),
        )
        .await;
    }
    for i in (1..240usize).step_by(6) {
        put(
            &mut client,
            &mut live,
            format!("/kubernetes.io/secrets/ns-{}/secret-{i:03}", i % 4),
            99,
        )
        .await;
    }
    let compacted_at = client
        .get("any", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    client
        .compact(compacted_at, Some(CompactionOptions::new().with_physical()))
        .await
        .expect("compact");
    let mut tombstones = 0;
    for i in (5..240usize).step_by(11) {
        tombstones += delete(
            &mut client,
            &mut live,
            format!("/kubernetes.io/secrets/ns-{}/secret-{i:03}", i % 4),
        )
        .await;
    }
    for i in (2..150usize).step_by(9) {
        tombstones += delete(
            &mut client,
            &mut live,
            format!("/kubernetes.io/configmaps/ns-{}/cm-{i:03}", i % 3),
        )
        .await;
    }
    // a key deleted after the compaction, then written again: live
    put(
        &mut client,
        &mut live,
        "/kubernetes.io/configmaps/ns-2/cm-002".into(),
        10,
    )
    .await;

    let mut expected = BTreeMap::new();
    for key in &live {
        *expected.entry(resource(key)).or_insert(0) += 1;
    }
    let in_etcd = client
        .get(
            vec![0u8],
            Some(GetOptions::new().with_from_key().with_count_only()),
        )
        .await
        .expect("count")
        .count();
    assert_eq!(
        in_etcd as usize,
        live.len(),
        "etcd holds what the test wrote"
    );

    let snapshot = dir.path().join("etcd-0.db");
    run_ok(
        etcdctl()
            .arg(format!("--endpoints={}", etcd.client_url()))
            .args(["snapshot", "save"])
            .arg(&snapshot),
    );
    let status = run_ok(
        etcdctl()
            .args(["snapshot", "status", "-w", "json"])
            .arg(&snapshot),
    );
    let status: Value = serde_json::from_slice(&status.stdout).expect("etcdctl status JSON");
    Fixture {
        dir,
        etcd,
        snapshot,
        expected,
        tombstones,
        compacted_at,
        status,
    }
}

impl Fixture {
    /// A copy of the snapshot changed by `damage`.
    fn damaged(&self, name: &str, damage: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
        let mut bytes = std::fs::read(&self.snapshot).expect("read snapshot");
        damage(&mut bytes);
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).expect("write copy");
        path
    }

    fn status(&self, field: &str) -> u64 {
        self.status[field]
            .as_u64()
            .unwrap_or_else(|| panic!("etcdctl status has no {field}: {}", self.status))
    }
}

/// The summary equals `etcdctl snapshot status` and what was written.
fn assert_matches_etcdctl(report: &Report, fixture: &Fixture) {
    assert_eq!(report.verdict, Verdict::Ok, "{report:#?}");
    let summary = report.summary.as_ref().expect("summary");
    assert_eq!(summary.revision as u64, fixture.status("revision"));
    assert_eq!(summary.etcdctl_total_keys, fixture.status("totalKey"));
    assert_eq!(u64::from(summary.hash), fixture.status("hash"));
    assert_eq!(summary.db_size, fixture.status("totalSize"));
    assert_eq!(report.file_size, summary.db_size + 32);
    assert_eq!(summary.live_keys_by_prefix, fixture.expected);
    assert_eq!(summary.live_keys, fixture.expected.values().sum::<u64>());
    assert_eq!(summary.tombstones, fixture.tombstones);
    assert_eq!(summary.compact_revision, Some(fixture.compacted_at));
    assert!(
        summary.consistent_index.is_some_and(|i| i > 0),
        "{summary:?}"
    );
    assert!(
        summary.pages.overflow_pages >= 48,
        "the 200 kB value spans overflow pages: {:?}",
        summary.pages
    );
    assert!(
        summary.pages.branch_pages >= 1,
        "the key bucket has a branch page: {:?}",
        summary.pages
    );
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verdicts_and_numbers_match_etcdctl() {
    let mut fixture = fixture().await;
    let size = std::fs::metadata(&fixture.snapshot).expect("stat").len();
    assert_eq!(size, fixture.status("totalSize") + 32);

    let report = verify_file(&fixture.snapshot).expect("verify");
    assert_matches_etcdctl(&report, &fixture);
    assert_eq!(report.source, fixture.snapshot.display().to_string());
    let mut client = connect_client(&[fixture.etcd.client_url()], None)
        .await
        .expect("client");
    let revision = client
        .get("any", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    assert_eq!(report.summary.as_ref().map(|s| s.revision), Some(revision));

    // the same through a store
    let store = LocalStore::new(fixture.dir.path().join("store"));
    let file = tokio::fs::File::open(&fixture.snapshot)
        .await
        .expect("open");
    store
        .put("b/etcd/etcd-0.db", Box::new(file))
        .await
        .expect("put");
    let from_store = verify_store_object(&store, "b/etcd/etcd-0.db")
        .await
        .expect("verify object");
    assert_eq!(from_store.summary, report.summary);

    // cut inside a page, and inside the hash
    let db_size = fixture.status("totalSize") as usize;
    for cut in [3 * 4096 + 1000, db_size + 5] {
        let path = fixture.damaged(&format!("cut-{cut}.db"), |b| b.truncate(cut));
        let verdict = verify_file(&path).expect("verify").verdict;
        assert_eq!(
            verdict,
            Verdict::Truncated {
                expected_size: size,
                actual_size: cut as u64
            }
        );
    }

    // one flipped byte in the middle
    let mut flipped_content = Vec::new();
    let path = fixture.damaged("flipped.db", |b| {
        let middle = b.len() / 2;
        b[middle] ^= 0x20;
        flipped_content = b.clone();
    });
    let report = verify_file(&path).expect("verify");
    let content = &flipped_content[..flipped_content.len() - 32];
    assert_eq!(
        report.verdict,
        Verdict::HashMismatch {
            expected: hex(&flipped_content[flipped_content.len() - 32..]),
            actual: hex(&Sha256::digest(content)),
        }
    );

    // not snapshots: random bytes, an empty file
    let mut state = 0x853c_49e6_748f_ea9bu64;
    let random: Vec<u8> = (0..100_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for (name, bytes) in [("random.bin", random), ("empty.db", Vec::new())] {
        let path = fixture.dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        let report = verify_file(&path).expect("verify");
        assert!(
            matches!(report.verdict, Verdict::NotASnapshot { .. }),
            "{name}: {report:#?}"
        );
        assert!(report.summary.is_none());
    }

    // the member's own data file: a bbolt database but no snapshot
    fixture.etcd.kill();
    let raw = fixture.dir.path().join("etcd/data/member/snap/db");
    let report = verify_file(&raw).expect("verify");
    assert!(
        matches!(&report.verdict, Verdict::NotASnapshot { reason } if reason.contains("member/snap/db")),
        "{report:#?}"
    );
    assert!(
        report
            .summary
            .is_some_and(|s| s.live_keys == fixture.expected.values().sum::<u64>())
    );

    assert!(matches!(
        verify_file(&fixture.dir.path().join("missing.db")),
        Err(VerifyError::Open { .. })
    ));
}

fn hcp_dr(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hcp-dr"));
    cmd.args(args).env_remove("HCP_DR_CA_BUNDLE");
    for (key, value) in env {
        cmd.env(key, value);
    }
    let out = cmd.output().expect("run hcp-dr");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_exit_codes_and_reports() {
    let fixture = fixture().await;
    let snapshot = path_arg(&fixture.snapshot);
    let revision = fixture.status("revision");

    let (code, stdout, stderr) = hcp_dr(&["snapshot", "verify", snapshot], &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.starts_with(&format!("snapshot {snapshot}: OK\n")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("revision      {revision}\n")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("hash          {:08x}", fixture.status("hash"))),
        "{stdout}"
    );
    for (prefix, count) in &fixture.expected {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(prefix.as_str())
                    && l.trim_end().ends_with(&format!(" {count}"))),
            "{prefix} {count}: {stdout}"
        );
    }

    let (code, stdout, stderr) = hcp_dr(
        &[
            "-o",
            "json",
            "snapshot",
            "verify",
            &format!("file://{snapshot}"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let json: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(json["verdict"]["status"], "ok");
    assert_eq!(json["summary"]["revision"].as_u64(), Some(revision));
    assert_eq!(
        json["summary"]["hash"].as_u64(),
        Some(fixture.status("hash"))
    );
    assert_eq!(
        json["summary"]["etcdctl_total_keys"].as_u64(),
        Some(fixture.status("totalKey"))
    );
    assert_eq!(
        json["summary"]["db_size"].as_u64(),
        Some(fixture.status("totalSize"))
    );
    let by_prefix: BTreeMap<String, u64> =
        serde_json::from_value(json["summary"]["live_keys_by_prefix"].clone()).expect("prefixes");
    assert_eq!(by_prefix, fixture.expected);

    let cut = fixture.damaged("cut.db", |b| b.truncate(b.len() - 5000));
    let (code, stdout, _) = hcp_dr(&["snapshot", "verify", path_arg(&cut)], &[]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(": TRUNCATED: ") && stdout.contains("5000 missing"),
        "{stdout}"
    );

    let flipped = fixture.damaged("flipped.db", |b| {
        let middle = b.len() / 2;
        b[middle] = !b[middle];
    });
    let (code, stdout, _) = hcp_dr(&["snapshot", "verify", path_arg(&flipped)], &[]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(": HASH MISMATCH: ") && stdout.contains("do not restore from it"),
        "{stdout}"
    );
    let (code, stdout, _) = hcp_dr(
        &["-o", "json", "snapshot", "verify", path_arg(&flipped)],
        &[],
    );
    assert_eq!(code, 1);
    let json: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(json["verdict"]["status"], "hash_mismatch");

    let empty = fixture.dir.path().join("empty.db");
    std::fs::write(&empty, b"").expect("write");
    let (code, stdout, _) = hcp_dr(&["snapshot", "verify", path_arg(&empty)], &[]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(": NOT A SNAPSHOT: the file is empty"),
        "{stdout}"
    );

    let missing = fixture.dir.path().join("missing.db");
    let (code, stdout, stderr) = hcp_dr(&["snapshot", "verify", path_arg(&missing)], &[]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(&format!("cannot open snapshot {}", missing.display()))
            && stderr.contains("No such file"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: give a file written by `etcdctl snapshot save`"),
        "{stderr}"
    );

    for (arg, message) in [
        (path_arg(fixture.dir.path()), "is not a regular file"),
        ("gs://bucket/etcd-0.db", "unsupported scheme `gs`"),
        ("s3://bucket/folder/", "not an object"),
        ("file://relative.db", "absolute path"),
    ] {
        let (code, _, stderr) = hcp_dr(&["snapshot", "verify", arg], &[]);
        assert_eq!(code, 2, "{arg}: {stderr}");
        assert!(stderr.contains(message), "{arg}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_objects_through_the_binary() {
    let fixture = fixture().await;
    let ca = Ca::new("test CA").expect("CA");
    let s3 = S3Endpoint::start(&fixture.dir.path().join("s3"), &ca)
        .await
        .expect("S3 endpoint");
    s3.create_bucket("backups").await.expect("bucket");
    let ca_file = fixture.dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).expect("write CA");
    let store = S3Store::connect(
        "backups".into(),
        "clusters/demo/b1".into(),
        S3Options {
            endpoint: Some(s3.https_url().to_string()),
            region: Some(s3.region().to_string()),
            ca_bundle: Some(ca_file.clone()),
            static_credentials: Some((s3.access_key().to_string(), s3.secret_key().to_string())),
            ..S3Options::default()
        },
    )
    .await
    .expect("S3 store");
    let file = tokio::fs::File::open(&fixture.snapshot)
        .await
        .expect("open");
    store
        .put("etcd/etcd-0.db", Box::new(file))
        .await
        .expect("upload");

    let env = [
        ("AWS_ACCESS_KEY_ID", s3.access_key()),
        ("AWS_SECRET_ACCESS_KEY", s3.secret_key()),
        ("AWS_REGION", s3.region()),
    ];
    let url = "s3://backups/clusters/demo/b1/etcd/etcd-0.db";
    let args = |url: &'static str| {
        [
            "-o",
            "json",
            "snapshot",
            "verify",
            url,
            "--s3-endpoint",
            s3.https_url(),
            "--ca-bundle",
            path_arg(&ca_file),
        ]
    };
    let (code, stdout, stderr) = hcp_dr(&args(url), &env);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let json: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(json["source"], url);
    assert_eq!(json["verdict"]["status"], "ok");
    assert_eq!(
        json["summary"]["revision"].as_u64(),
        Some(fixture.status("revision"))
    );
    assert_eq!(
        json["summary"]["hash"].as_u64(),
        Some(fixture.status("hash"))
    );
    assert_eq!(
        json["file_size"].as_u64(),
        Some(fixture.status("totalSize") + 32)
    );

    let (code, _, stderr) = hcp_dr(&args("s3://backups/clusters/demo/b1/etcd/etcd-9.db"), &env);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("etcd-9.db")
            && stderr.contains("not found")
            && stderr.contains("hint: check the URL"),
        "{stderr}"
    );
}
