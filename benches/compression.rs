//! Compression of the etcd snapshots (`backup --compression`): the ratio
//! and the cost per zstd level, on a Kubernetes-shaped fill written through
//! the hosted API (ConfigMaps, TLS and token Secrets, Pods, Events, renewed
//! Leases: `hcp_dr_e2e::fill`) and on random data, against peers in the
//! same run: the same backup with `--compression none` (what compressing
//! costs the backup), and the reference `zstd` CLI (one thread) on the raw
//! snapshot that backup stored (what the library gives at that level).
//!
//! `cargo bench --bench compression -- [--size-mib N] [--random-mib N] [--rounds N]`
//! Prints ratios; asserts nothing about time.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Ran, arg};
use hcp_dr_e2e::sandbox::Sandbox;
use serde_json::Value;

const NS: &str = "clusters";
const HCP_NS: &str = "clusters-demo";

struct Backup {
    wall: Duration,
    rss_kib: i64,
    downtime: f64,
    raw: u64,
    stored: u64,
    folder: PathBuf,
}

fn backup(sandbox: &Sandbox, store: &Path, compression: &str) -> Backup {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hcp-dr"));
    cmd.args(["backup", "--hosted-cluster", "demo", "--to"])
        .arg(store)
        .args(["--compression", compression, "-o", "json"])
        .env("KUBECONFIG", &sandbox.clusters[0].kubeconfig)
        .env("HCP_DR_STATE_DIR", sandbox.dir.join("state"))
        .env_remove("HCP_DR_STORE");
    let ran: Ran = common::run(cmd).ok();
    let report: Value = serde_json::from_slice(&ran.stdout).expect("JSON report");
    let folder = PathBuf::from(report["backup"].as_str().expect("backup").strip_prefix("file://").expect("local"));
    let manifest: Value = serde_json::from_slice(&std::fs::read(folder.join("manifest.json")).expect("manifest")).expect("manifest JSON");
    let stored = manifest["etcd"][0]["size"].as_u64().expect("size");
    let raw = manifest["compression"]["artifacts"][0]["size"].as_u64().unwrap_or(stored);
    Backup { wall: ran.wall, rss_kib: ran.rss_kib, downtime: report["api_downtime_seconds"].as_f64().unwrap_or_default(), raw, stored, folder }
}

/// `zstd -LEVEL -T1` of `file`: (seconds, compressed bytes).
fn zstd_cli(file: &Path, level: i32) -> (f64, u64) {
    let out = file.with_extension(format!("l{level}.zst"));
    let mut cmd = Command::new("zstd");
    cmd.arg(format!("-{level}")).args(["-T1", "-q", "-f", "-o"]).arg(&out).arg(file);
    let ran = common::run(cmd).ok();
    let size = std::fs::metadata(&out).expect("zstd output").len();
    std::fs::remove_file(&out).ok();
    (ran.wall.as_secs_f64(), size)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Back up at every level and print ratio, cost and the zstd CLI's
/// result; returns `(level, raw, stored)` per level (0: none).
fn levels(sandbox: &Sandbox, store: &Path, fill: &str, rounds: usize) -> Vec<(i32, u64, u64)> {
    let best = |compression: &str| {
        (0..rounds.max(1))
            .map(|_| backup(sandbox, store, compression))
            .min_by(|a, b| a.wall.cmp(&b.wall))
            .expect("a round")
    };
    let plain = best("none");
    let raw_file = plain.folder.join("etcd/etcd-0.db");
    println!(
        "{fill}: snapshot {:.1} MiB; backup --compression none {:.2}s (API down {:.2}s, peak RSS {:.1} MiB)",
        mib(plain.raw),
        plain.wall.as_secs_f64(),
        plain.downtime,
        plain.rss_kib as f64 / 1024.0
    );
    // zstd's own in-memory benchmark of the raw snapshot, one thread: the
    // library's speed per level without any I/O
    let mut cmd = Command::new("zstd");
    cmd.args(["-b1", "-e9", "-T1", "-i2", "-q"]).arg(&raw_file);
    let ran = common::run(cmd).ok();
    for line in String::from_utf8_lossy(&ran.stdout).lines().chain(String::from_utf8_lossy(&ran.stderr).lines()).filter(|l| l.contains("MB/s")) {
        println!("{fill}: zstd -b: {}", line.trim());
    }
    let mut sizes = vec![(0, plain.raw, plain.stored)];
    for level in [1, 3, 6, 9, 19] {
        let ours = best(&format!("zstd:{level}"));
        let (cli_seconds, cli_size) = zstd_cli(&raw_file, level);
        println!(
            "{fill}: zstd:{level:<2} ratio {:>5.2}x ({:.1} -> {:.2} MiB); backup {:.2}s = {:.2}x of uncompressed (API down {:.2}s, peak RSS {:.1} MiB); zstd -{level} -T1 CLI ratio {:.2}x in {:.2}s ({:.0} MiB/s)",
            ours.raw as f64 / ours.stored as f64,
            mib(ours.raw),
            mib(ours.stored),
            ours.wall.as_secs_f64(),
            ours.wall.as_secs_f64() / plain.wall.as_secs_f64(),
            ours.downtime,
            ours.rss_kib as f64 / 1024.0,
            ours.raw as f64 / cli_size as f64,
            cli_seconds,
            mib(ours.raw) / cli_seconds,
        );
        sizes.push((level, ours.raw, ours.stored));
    }
    sizes
}

#[tokio::main]
async fn main() {
    let size: u64 = arg("--size-mib", 128);
    let random: u64 = arg("--random-mib", 128);
    let rounds: usize = arg("--rounds", 1);
    for tool in ["zstd", "etcd"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("error: `{tool}` is not on PATH (apt-get install zstd etcd-server)");
            std::process::exit(2);
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    common::ensure_room(&dir, ((size + random) * 12) << 20, "the benchmark's etcd member and backups", "lower --size-mib/--random-mib or set TMPDIR");
    println!("# hcp-dr compression benchmark: SingleReplica cluster, {size} MiB of Kubernetes objects then {random} MiB of random values, in {}", dir.display());
    let (sandbox, mgmt) = common::tools::demo_sandbox(&dir, "SingleReplica").await;
    let hosted = hcp_dr_e2e::drill::hosted_client(&mgmt, NS, "demo").await.expect("hosted client");
    let started = std::time::Instant::now();
    let filled = hcp_dr_e2e::fill::kubernetes_objects(&hosted, "shop", size << 20, 8).await.expect("fill");
    println!(
        "filled {} apps, {} objects, {:.1} MiB of JSON through the hosted API in {:.1}s",
        filled.apps,
        filled.objects,
        mib(filled.bytes),
        started.elapsed().as_secs_f64()
    );
    let store = dir.join("store");
    let objects = levels(&sandbox, &store, "kubernetes objects", rounds);

    // random values, put into the member directly (no API server stores such objects)
    let mut members = hcp_dr_e2e::drill::member_clients(&mgmt, HCP_NS).await.expect("member clients");
    let (_, _, client) = &mut members[0];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for i in 0..random {
        let value: Vec<u8> = (0..1 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        client.put(format!("/hcp-dr-bench/random/{i:06}"), value, None).await.expect("put");
    }
    let mixed = levels(&sandbox, &store, "+ random values", rounds);
    // what the random values alone added, and how much of it compression saved
    for ((level, raw0, stored0), (_, raw1, stored1)) in objects.iter().zip(&mixed).filter(|((l, _, _), _)| *l > 0) {
        println!(
            "random values alone at zstd:{level}: +{:.1} MiB raw -> +{:.1} MiB stored: {:.2}x",
            mib(raw1 - raw0),
            mib(stored1.saturating_sub(*stored0)),
            (raw1 - raw0) as f64 / stored1.saturating_sub(*stored0).max(1) as f64
        );
    }
}
