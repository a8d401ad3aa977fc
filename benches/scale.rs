//! Scale (issue 39): backup and restore of one etcd member as its database
//! grows to etcd's quota, to show that time grows linearly with the data
//! and memory does not grow at all. A SingleReplica cluster on the sandbox
//! is filled with Kubernetes-shaped objects (`hcp_dr_e2e::fill`, straight
//! into etcd as the hosted API server stores them: the only way to reach
//! 8 GiB in minutes), up to each `--sizes-gib` in turn; at each size, in
//! the same run:
//!
//! 1. **peers**: `etcdctl snapshot save` of the member (etcd's own client,
//!    nothing else done with the bytes), and `zstd -1 -T1` of that file
//!    (what compressing it costs one core);
//! 2. **backup** to S3 with the defaults (zstd level 1): wall time, peak
//!    RSS, API downtime, raw and stored size, and the snapshot's throughput
//!    (raw bytes over the stages from `etcd-snapshot` to `snapshot-finish`,
//!    during which it streams);
//! 3. **restore** of that backup from S3 onto mgmt-b to Available (the
//!    compressed snapshot is staged raw, then downloaded by etcd): wall
//!    time and peak RSS, against the raw data movement (`aws s3 cp` of the
//!    etcdctl snapshot + `etcdctl snapshot restore`); then the restored
//!    copy is destroyed and the backup deleted, to keep the disk free.
//!
//! Then, per measure, the time per GiB at each size and its spread (the
//! goal: within 10%, linear), and the RSS at each size (the goal: flat).
//!
//! `cargo bench --bench scale -- [--sizes-gib 1,4,7.5]`
//! The largest size must stay under etcd's quota (8 GiB, as HyperShift sets
//! it). Needs `aws`, `etcdctl`, `zstd` and about 6x the largest size free
//! under TMPDIR (a disk: tmpfs is too small; during the raw restore the
//! member, its restored copy, the backup, the raw snapshot in S3 and the
//! raw restore's file and data directory are all there: 41 GiB at 7.5 GiB).
//! Asserts nothing about time.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::arg;
use common::tools::{HCP_NS, NS, Tools, mib, raw_restore, report, run_ok, snapshot_sizes, stage_times};
use hcp_dr_e2e::sandbox::BUCKET;
use serde_json::Value;

const GIB: f64 = (1u64 << 30) as f64;

/// What was measured at one size.
struct Point {
    db: u64,
    etcdctl_save: Duration,
    zstd_cli: Duration,
    zstd_cli_stored: u64,
    backup: Duration,
    backup_rss: i64,
    downtime: f64,
    streaming: f64,
    raw: u64,
    stored: u64,
    restore: Duration,
    restore_rss: i64,
    raw_restore: Duration,
}

/// The seconds of the stages during which the snapshot streams.
fn streaming_seconds(report: &Value) -> f64 {
    let stages = report["stages"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = stages.iter().map(|s| s["name"].as_str().unwrap_or_default()).collect();
    let (Some(from), Some(to)) = (names.iter().position(|n| *n == "etcd-snapshot"), names.iter().position(|n| *n == "snapshot-finish")) else {
        panic!("the backup's report has no etcd-snapshot .. snapshot-finish stages: {names:?}");
    };
    stages[from..=to].iter().map(|s| s["duration"].as_f64().unwrap_or_default()).sum()
}

fn per_gib(d: Duration, bytes: u64) -> f64 {
    d.as_secs_f64() / (bytes as f64 / GIB)
}

/// "a, b, c s/GiB (spread x%)": the spread is (max - min) / min.
fn linearity(values: &[f64]) -> String {
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(0.0, f64::max);
    let each: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
    format!("{} s/GiB (spread {:.0}%, goal <= 10%)", each.join(", "), (max - min) / min * 100.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes: String = arg("--sizes-gib", "1,4,7.5".to_string());
    let sizes: Vec<f64> = sizes
        .split(',')
        .map(|s| s.trim().parse::<f64>().ok().filter(|g| *g > 0.0 && *g < 8.0))
        .collect::<Option<_>>()
        .unwrap_or_else(|| {
            eprintln!("error: --sizes-gib {sizes}: give sizes in GiB, comma-separated, each above 0 and under etcd's quota of 8 (e.g. 1,4,7.5)");
            std::process::exit(2);
        });
    for tool in ["aws", "etcdctl", "zstd"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("error: `{tool}` is not on PATH (aws: pip install awscli; apt-get install etcd-client zstd)");
            std::process::exit(2);
        }
    }
    let largest = sizes.iter().cloned().fold(0.0, f64::max);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    // the member, S3 (backup, the peer's snapshot, the staged raw copy),
    // the restored member, the peer's download and its restore
    common::ensure_room(&dir, (largest * 6.0 * GIB) as u64, "the benchmark's etcd members, snapshots and backups", "lower --sizes-gib or set TMPDIR to a disk with more room");
    println!("# hcp-dr scale benchmark: SingleReplica cluster, Kubernetes objects up to {sizes:?} GiB, in {}", dir.display());
    let (sandbox, mgmt) = common::tools::demo_sandbox(&dir, "SingleReplica").await;
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let tools = Tools::new(&sandbox, &mgmt, &work, dir.join("state")).await;
    let s3 = ["--s3-endpoint", tools.s3_url.as_str()];
    let (_, endpoint) = common::tools::member_endpoints(&mgmt).await.remove(0);
    let mut members = hcp_dr_e2e::drill::member_clients(&mgmt, HCP_NS).await.expect("member clients");
    let (_, _, etcd) = &mut members[0];

    let mut points = Vec::new();
    let mut apps = 0;
    for gib in &sizes {
        let gib = *gib;
        let started = Instant::now();
        let (filled, db) = hcp_dr_e2e::fill::kubernetes_objects_in_etcd(etcd, "shop", apps, (gib * GIB) as u64, 16).await.expect("fill");
        apps += filled.apps;
        println!(
            "{gib} GiB: filled {} more apps ({} objects, {:.0} MiB of JSON) in {:.0}s; database {:.2} GiB",
            filled.apps,
            filled.objects,
            filled.bytes as f64 / (1 << 20) as f64,
            started.elapsed().as_secs_f64(),
            db as f64 / GIB
        );

        // 1. the peers
        let peer = work.join("etcdctl.db");
        let save = run_ok(tools.etcdctl(&endpoint, &["snapshot", "save", peer.to_str().expect("path")])).wall;
        let mut zstd = Command::new("zstd");
        zstd.args(["-1", "-T1", "-q", "-f", "-o"]).arg(work.join("etcdctl.db.zst")).arg(&peer);
        let zstd_cli = run_ok(zstd).wall;
        let zstd_cli_stored = std::fs::metadata(work.join("etcdctl.db.zst")).expect("zstd output").len();
        std::fs::remove_file(work.join("etcdctl.db.zst")).ok();
        run_ok(tools.aws(&["s3", "cp", peer.to_str().expect("path"), &format!("s3://{BUCKET}/raw/etcd-0.db")]));
        std::fs::remove_file(&peer).ok();

        // 2. backup (a store per size: the restore fences the store it came
        // from against the source, which stays and is filled further)
        let store = format!("s3://{BUCKET}/scale-{gib}");
        let ran = run_ok(tools.hcp_dr(&tools.kubeconfig_a, &["backup", "--hosted-cluster", "demo", "--to", &store, s3[0], s3[1], "-o", "json"]));
        let backup = report(&ran);
        let url = backup["backup"].as_str().expect("backup URL").to_string();
        let (raw, stored) = snapshot_sizes(&tools, &url, &work);

        // 3. restore onto mgmt-b, then the raw movement, then clean up
        let restored = run_ok(tools.hcp_dr(&tools.kubeconfig_b, &["restore", "--from", &url, s3[0], s3[1], "--wait", "30m", "-o", "json"]));
        let raw_restore = raw_restore(&tools, &work, "raw/etcd-0.db", 1);
        run_ok(tools.hcp_dr(&tools.kubeconfig_b, &["cluster", "destroy", "demo", "-n", NS]));
        run_ok(tools.aws(&["s3", "rm", "--recursive", &format!("{store}/")]));
        run_ok(tools.aws(&["s3", "rm", &format!("s3://{BUCKET}/raw/etcd-0.db")]));

        let point = Point {
            db,
            etcdctl_save: save,
            zstd_cli,
            zstd_cli_stored,
            backup: ran.wall,
            backup_rss: ran.rss_kib,
            downtime: backup["api_downtime_seconds"].as_f64().unwrap_or_default(),
            streaming: streaming_seconds(&backup),
            raw,
            stored,
            restore: restored.wall,
            restore_rss: restored.rss_kib,
            raw_restore,
        };
        println!(
            "{gib} GiB: backup {:.1}s ({:.2} s/GiB, {:.2}x etcdctl snapshot save's {:.1}s), API down {:.2}s, peak RSS {:.1} MiB; snapshot {:.2} -> {:.2} GiB ({:.2}x; zstd -1 -T1: {:.2}x in {:.1}s = {:.0} MiB/s), streamed at {:.0} MiB/s raw; restore to Available {:.1}s ({:.2} s/GiB, {:.2}x the raw movement's {:.1}s), peak RSS {:.1} MiB",
            point.backup.as_secs_f64(),
            per_gib(point.backup, db),
            point.backup.as_secs_f64() / save.as_secs_f64(),
            save.as_secs_f64(),
            point.downtime,
            mib(point.backup_rss),
            raw as f64 / GIB,
            stored as f64 / GIB,
            raw as f64 / stored as f64,
            raw as f64 / zstd_cli_stored as f64,
            zstd_cli.as_secs_f64(),
            raw as f64 / (1 << 20) as f64 / zstd_cli.as_secs_f64(),
            raw as f64 / (1 << 20) as f64 / point.streaming,
            point.restore.as_secs_f64(),
            per_gib(point.restore, db),
            point.restore.as_secs_f64() / raw_restore.as_secs_f64(),
            raw_restore.as_secs_f64(),
            mib(point.restore_rss),
        );
        println!("{gib} GiB: backup stages: {}", stage_times(&backup));
        println!("{gib} GiB: restore stages: {}", stage_times(&report(&restored)));
        points.push(point);
    }

    println!("## per GiB of database, across {sizes:?} GiB");
    let series = |f: &dyn Fn(&Point) -> f64| -> Vec<f64> { points.iter().map(f).collect() };
    println!("backup: {}", linearity(&series(&|p| per_gib(p.backup, p.db))));
    println!("snapshot streaming: {}", linearity(&series(&|p| p.streaming / (p.db as f64 / GIB))));
    println!("etcdctl snapshot save (peer): {}", linearity(&series(&|p| per_gib(p.etcdctl_save, p.db))));
    println!("restore to Available: {}", linearity(&series(&|p| per_gib(p.restore, p.db))));
    println!("raw restore movement (peer): {}", linearity(&series(&|p| per_gib(p.raw_restore, p.db))));
    let rss = |f: &dyn Fn(&Point) -> i64| points.iter().map(|p| format!("{:.1}", mib(f(p)))).collect::<Vec<_>>().join(", ");
    println!("peak RSS (MiB), backup: {}; restore: {}", rss(&|p| p.backup_rss), rss(&|p| p.restore_rss));
    println!(
        "compression ratio: {}; zstd CLI (peer): {}",
        points.iter().map(|p| format!("{:.2}x", p.raw as f64 / p.stored as f64)).collect::<Vec<_>>().join(", "),
        points.iter().map(|p| format!("{:.2}x", p.raw as f64 / p.zstd_cli_stored as f64)).collect::<Vec<_>>().join(", ")
    );
    println!(
        "throughput (MiB/s of raw snapshot): streamed by the backup {}; zstd -1 -T1 of the same bytes (peer) {}",
        points.iter().map(|p| format!("{:.0}", p.raw as f64 / (1 << 20) as f64 / p.streaming)).collect::<Vec<_>>().join(", "),
        points.iter().map(|p| format!("{:.0}", p.raw as f64 / (1 << 20) as f64 / p.zstd_cli.as_secs_f64())).collect::<Vec<_>>().join(", ")
    );
    // the marginal cost: what each further GiB added, without the fixed part
    for pair in points.windows(2) {
        let gib = (pair[1].db - pair[0].db) as f64 / GIB;
        println!(
            "marginal {:.2} -> {:.2} GiB: backup {:.2} s/GiB, restore {:.2} s/GiB",
            pair[0].db as f64 / GIB,
            pair[1].db as f64 / GIB,
            (pair[1].backup.as_secs_f64() - pair[0].backup.as_secs_f64()) / gib,
            (pair[1].restore.as_secs_f64() - pair[0].restore.as_secs_f64()) / gib
        );
    }
    sandbox.shutdown().await;
}
