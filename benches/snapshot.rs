//! Snapshot benchmarks against peers measured in the same run:
//!
//! 1. throughput of one member: hcp-dr (hashing, checking etcd's hash,
//!    writing to the local store) vs `etcdctl snapshot save` on the same
//!    member, and vs the limit: the raw stream drained to nothing; and the
//!    same through the compressing store (`--compression zstd`, the default);
//!    with the CPU seconds etcd and this process spent on each, and the
//!    bound that two cores set on the ratio to the raw stream;
//! 2. API downtime: hcp-dr starting three members' snapshots (writers may
//!    resume once every stream has started) vs one
//!    `etcdctl snapshot save` of one member;
//! 3. peak RSS of hcp-dr snapshotting a database of >= 1 GiB;
//! 4. offline verification of that snapshot file: `hcp-dr snapshot verify`
//!    (trailing SHA-256, then the bbolt walk with etcd's CRC-32C hash) vs
//!    `etcdctl snapshot status` (the same walk and CRC-32C) and `sha256sum`;
//!    and the CRC-32C alone vs SHA-256 over one buffer in memory.
//!
//! `cargo bench --bench snapshot -- [--size-mib N] [--ha-size-mib N] [--rounds N] [--dir PATH] [--ha-only] [--fill kubernetes|patterned]`
//! (`--dir` puts the members and the store there, e.g. `/dev/shm` to take the
//! disk out of the comparison)
//! Prints ratios; it asserts nothing about time.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hcp_dr::etcd::Member;
use hcp_dr::store::LocalStore;
use hcp_dr_e2e::procs::etcd::{ClusterState, EtcdMemberConfig, EtcdProcess, connect_client};
use hcp_dr_e2e::procs::free_ports;

use common::{Fill, arg};

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU seconds (user + system) used so far by process `pid` (`None`: this one).
fn cpu_seconds(pid: Option<u32>) -> f64 {
    let stat = std::fs::read_to_string(match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".into(),
    })
    .unwrap_or_default();
    // after the command's parenthesised name: utime and stime are fields 14 and 15
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: f64 = fields.get(11..13).map(|f| f.iter().filter_map(|t| t.parse::<f64>().ok()).sum()).unwrap_or_default();
    // SAFETY: sysconf reads a constant
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Where the CPU of one snapshot went: etcd's (serving the stream) and
/// this process's (receiving, hashing, compressing, writing), in seconds,
/// against the wall time on this machine's cores.
struct Cpu {
    etcd: f64,
    ours: f64,
}

impl Cpu {
    /// Run `f`, measuring both processes' CPU around it.
    async fn around<T>(etcd_pid: u32, f: impl std::future::Future<Output = T>) -> (T, Cpu) {
        let (e0, o0) = (cpu_seconds(Some(etcd_pid)), cpu_seconds(None));
        let out = f.await;
        (out, Cpu { etcd: cpu_seconds(Some(etcd_pid)) - e0, ours: cpu_seconds(None) - o0 })
    }

    fn describe(&self, wall: Duration) -> String {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        format!(
            "CPU etcd {:.2}s + receiver {:.2}s = {:.2} of {cores} cores busy over {:.2}s",
            self.etcd,
            self.ours,
            (self.etcd + self.ours) / wall.as_secs_f64(),
            wall.as_secs_f64()
        )
    }
}

/// Fill a member as `--fill` says (`common::Fill`).
async fn fill(url: &str, mib: u64) {
    let mut client = connect_client(&[url.to_string()], None).await.expect("connect");
    Fill::from_args().write(&mut client, mib, "/kubernetes.io/bench/").await;
}

fn etcdctl_save(url: &str, out: &Path) -> Duration {
    let _ = std::fs::remove_file(out);
    let start = Instant::now();
    let status = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", url, "snapshot", "save"])
        .arg(out)
        .output()
        .expect("etcdctl not found: apt-get install etcd-client");
    assert!(status.status.success(), "etcdctl: {}", String::from_utf8_lossy(&status.stderr));
    start.elapsed()
}

/// The limit: etcd's Maintenance/Snapshot stream drained to nothing by a
/// minimal etcd-client loop (no hash, no write), on the same member.
async fn raw_stream(url: &str) -> (Duration, u64) {
    let client = connect_client(&[url.to_string()], None).await.expect("connect");
    let start = Instant::now();
    let mut stream = client.maintenance_client().snapshot().await.expect("snapshot");
    let mut bytes = 0u64;
    while let Some(response) = stream.message().await.expect("stream") {
        bytes += std::hint::black_box(response.blob()).len() as u64;
    }
    (start.elapsed(), bytes)
}

async fn ours(url: &str, dir: &Path, member: &str) -> Duration {
    let store = LocalStore::new(dir);
    let start = Instant::now();
    Member { name: member.into(), url: url.into(), tls: None }
        .snapshot_to(&store, &format!("{member}.db"))
        .await
        .expect("snapshot");
    start.elapsed()
}

/// As [`ours`], through the compressing store a backup uses by default
/// (`--compression zstd`): `(time, stored bytes)`.
async fn ours_compressed(url: &str, dir: &Path, member: &str) -> (Duration, u64) {
    let local: std::sync::Arc<dyn hcp_dr::store::Store> = std::sync::Arc::new(LocalStore::new(dir));
    let store = hcp_dr::archive::compression::CompressingStore::new(local, hcp_dr::archive::compression::DEFAULT_LEVEL);
    let start = Instant::now();
    let report = Member { name: member.into(), url: url.into(), tls: None }
        .snapshot_to(&store, &format!("{member}.db"))
        .await
        .expect("snapshot");
    (start.elapsed(), report.size)
}

async fn three_members(dir: &Path) -> Vec<EtcdProcess> {
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let ports = free_ports(ip, 6).expect("ports");
    let cluster: Vec<(String, String)> = (0..3)
        .map(|i| (format!("m{i}"), format!("http://127.0.0.1:{}", ports[2 * i + 1])))
        .collect();
    let mut members: Vec<EtcdProcess> = (0..3)
        .map(|i| {
            EtcdProcess::start(EtcdMemberConfig {
                name: format!("m{i}"),
                data_dir: dir.join(format!("m{i}")),
                log_dir: dir.to_path_buf(),
                client_ip: ip,
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                initial_cluster: cluster.clone(),
                initial_cluster_state: ClusterState::New,
                tls: None,
                quota_backend_bytes: Some(8 << 30),
            })
            .expect("start member")
        })
        .collect();
    for m in &mut members {
        m.wait_healthy(Duration::from_secs(60), None).await.expect("healthy");
    }
    members
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Child mode for the RSS measurement: snapshot one member, print VmHWM.
    if let Some(i) = args.iter().position(|a| a == "--child-snapshot") {
        let (url, dir) = (&args[i + 1], &args[i + 2]);
        ours(url, Path::new(dir), "rss").await;
        println!("VmHWM_KiB {}", vm_hwm_kib());
        return;
    }
    // Child mode to look at one drain alone (perf, time): the raw stream.
    if let Some(i) = args.iter().position(|a| a == "--child-raw") {
        let (t, n) = raw_stream(&args[i + 1]).await;
        println!("raw stream: {n} B in {:.2}s", t.as_secs_f64());
        return;
    }
    let size: u64 = arg("--size-mib", 1100);
    let ha_size: u64 = arg("--ha-size-mib", 256);
    let tmp = match args.iter().position(|a| a == "--dir").and_then(|i| args.get(i + 1)) {
        Some(dir) => tempfile::tempdir_in(dir).expect("tempdir in --dir"),
        None => tempfile::tempdir().expect("tempdir"),
    };
    let ha_only = args.iter().any(|a| a == "--ha-only");
    // refuse before filling: the single member's database, etcdctl's copy,
    // hcp-dr's copy and the RSS run's copy (about 1.15x the values each);
    // three HA members, etcdctl's copy and hcp-dr's three
    let needed_mib = if ha_only { 0 } else { size * 47 / 10 } + ha_size * 8;
    common::ensure_room(
        tmp.path(),
        needed_mib << 20,
        "the benchmark's etcd members and snapshots",
        "lower --size-mib/--ha-size-mib, or point --dir at a file system with more room",
    );

    println!(
        "# hcp-dr snapshot benchmarks ({size} MiB single member, {ha_size} MiB x3 members) in {}",
        tmp.path().display()
    );
    if !ha_only {
        single_member(tmp.path(), size).await;
    }
    three_member_downtime(tmp.path(), ha_size).await;
}

async fn single_member(dir: &Path, size: u64) {
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let ports = free_ports(ip, 2).expect("ports");
    let mut single = EtcdProcess::start(EtcdMemberConfig {
        name: "single".into(),
        data_dir: dir.join("single"),
        log_dir: dir.to_path_buf(),
        client_ip: ip,
        client_port: ports[0],
        peer_port: ports[1],
        initial_cluster: vec![("single".into(), format!("http://127.0.0.1:{}", ports[1]))],
        initial_cluster_state: ClusterState::New,
        tls: None,
        quota_backend_bytes: Some(8 << 30),
    })
    .expect("etcd");
    single.wait_healthy(Duration::from_secs(60), None).await.expect("healthy");
    let url = single.client_url();
    let t = Instant::now();
    fill(&url, size).await;
    let db = {
        let mut c = connect_client(&[url.clone()], None).await.unwrap();
        c.status().await.unwrap().db_size()
    };
    println!("filled {size} MiB in {:.1}s; db size {:.1} MiB", t.elapsed().as_secs_f64(), db as f64 / 1048576.0);

    // 1. throughput, best of `--rounds` (2) each, alternating
    let mut peer = Duration::MAX;
    let mut mine = Duration::MAX;
    let mut raw = Duration::MAX;
    let mut compressed = Duration::MAX;
    let mut stored = 0;
    let mut streamed = 0;
    let etcd = single.pid();
    let mut cpu = Vec::new();
    for round in 0..arg::<u64>("--rounds", 2) {
        peer = peer.min(etcdctl_save(&url, &dir.join("etcdctl.db")));
        let ((t, n), c) = Cpu::around(etcd, raw_stream(&url)).await;
        cpu.push(("raw stream", t, c));
        (raw, streamed) = (raw.min(t), n);
        let (t, c) = Cpu::around(etcd, ours(&url, &dir.join(format!("ours-{round}")), "single")).await;
        cpu.push(("hcp-dr uncompressed", t, c));
        mine = mine.min(t);
        let _ = std::fs::remove_dir_all(dir.join(format!("ours-{round}")));
        let ((t, n), c) = Cpu::around(etcd, ours_compressed(&url, &dir.join(format!("zstd-{round}")), "single")).await;
        cpu.push(("hcp-dr zstd:1", t, c));
        (compressed, stored) = (compressed.min(t), n);
        let _ = std::fs::remove_dir_all(dir.join(format!("zstd-{round}")));
    }
    for (what, wall, c) in &cpu {
        println!("cpu: {what}: {}", c.describe(*wall));
    }
    // the limit two cores set: hcp-dr cannot finish before the CPU it and
    // etcd need together is spent on both cores, nor before etcd's raw stream
    let best = |name: &str| cpu.iter().filter(|(w, _, _)| *w == name).min_by(|a, b| a.1.cmp(&b.1)).map(|(_, t, c)| (*t, c.etcd + c.ours));
    if let (Some((raw_t, _)), Some((_, plain_cpu)), Some((_, zstd_cpu))) = (best("raw stream"), best("hcp-dr uncompressed"), best("hcp-dr zstd:1")) {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        let bound = |cpu: f64| raw_t.as_secs_f64() / raw_t.as_secs_f64().max(cpu / cores);
        println!(
            "cpu bound: on {cores} cores the CPU both processes need caps hcp-dr/raw at {:.2}x uncompressed and {:.2}x compressed (if every core were busy all along)",
            bound(plain_cpu),
            bound(zstd_cpu)
        );
    }
    let mib = db as f64 / 1048576.0;
    println!(
        "stream limit: raw Maintenance/Snapshot drained {:.1} MiB/s ({:.2}s, {streamed} B); hcp-dr {:.1} MiB/s; ratio hcp-dr/raw = {:.2}x (goal >= 0.95x)",
        streamed as f64 / 1048576.0 / raw.as_secs_f64(),
        raw.as_secs_f64(),
        mib / mine.as_secs_f64(),
        raw.as_secs_f64() / mine.as_secs_f64()
    );
    println!(
        "compressed (zstd:{}, the default): hcp-dr {:.1} MiB/s ({:.2}s), {:.1} MiB stored ({:.2}x); ratio compressed/raw stream = {:.2}x, compressed/uncompressed = {:.2}x (--fill {})",
        hcp_dr::archive::compression::DEFAULT_LEVEL,
        mib / compressed.as_secs_f64(),
        compressed.as_secs_f64(),
        stored as f64 / 1048576.0,
        db as f64 / stored.max(1) as f64,
        raw.as_secs_f64() / compressed.as_secs_f64(),
        mine.as_secs_f64() / compressed.as_secs_f64(),
        Fill::from_args().name()
    );
    println!(
        "throughput: etcdctl snapshot save {:.1} MiB/s ({:.2}s), hcp-dr {:.1} MiB/s ({:.2}s); ratio hcp-dr/etcdctl = {:.2}x (goal >= 1.0x)",
        mib / peer.as_secs_f64(),
        peer.as_secs_f64(),
        mib / mine.as_secs_f64(),
        mine.as_secs_f64(),
        peer.as_secs_f64() / mine.as_secs_f64()
    );

    // 3. peak RSS of a snapshot of the >= 1 GiB member, in a fresh process
    let exe = std::env::current_exe().expect("exe");
    let out = Command::new(exe)
        .args(["--child-snapshot", &url])
        .arg(dir.join("rss"))
        .output()
        .expect("child");
    let hwm: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM_KiB "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    println!(
        "peak RSS: {:.1} MiB while snapshotting a {:.0} MiB database (goal < 100 MiB)",
        hwm as f64 / 1024.0,
        mib
    );
    verify_snapshot(&dir.join("etcdctl.db"), mib);
    crc_throughput();
    single.kill();
    let _ = std::fs::remove_dir_all(dir.join("single"));
    let _ = std::fs::remove_file(dir.join("etcdctl.db"));
    let _ = std::fs::remove_dir_all(dir.join("rss"));
}

fn timed(program: &str, args: &[&str], file: &Path) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    let out = Command::new(program)
        .env("ETCDCTL_API", "3")
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program}: {}", String::from_utf8_lossy(&out.stderr));
    (start.elapsed(), out.stdout)
}

/// 4. verify the etcdctl snapshot file (in the page cache after the first
/// round): hcp-dr's verify vs `etcdctl snapshot status` (same bbolt walk and
/// CRC-32C, no SHA-256) and `sha256sum`; best of 3 each, alternating. The
/// hash hcp-dr computes must be etcdctl's.
fn verify_snapshot(file: &Path, mib: f64) {
    let (mut mine, mut status, mut sha) = (Duration::MAX, Duration::MAX, Duration::MAX);
    let (mut ours_hash, mut etcdctl_hash) = (None, None);
    for _ in 0..3 {
        let (t, out) = timed("etcdctl", &["snapshot", "status", "-w", "json"], file);
        status = status.min(t);
        let json: serde_json::Value = serde_json::from_slice(&out).expect("etcdctl snapshot status json");
        etcdctl_hash = json["hash"].as_u64();
        sha = sha.min(timed("sha256sum", &[], file).0);
        let start = Instant::now();
        let report = hcp_dr::etcd::verify::verify_file(file).expect("verify");
        mine = mine.min(start.elapsed());
        assert!(report.is_ok(), "verify: {}", report.verdict);
        ours_hash = report.summary.map(|s| u64::from(s.hash));
    }
    assert_eq!(ours_hash, etcdctl_hash, "hcp-dr's hash differs from etcdctl snapshot status'");
    println!(
        "verify: hcp-dr {:.1} MiB/s ({:.2}s) vs etcdctl snapshot status {:.2}s ({:.2}x), sha256sum {:.2}s ({:.2}x); hash {:08x} = etcdctl's",
        mib / mine.as_secs_f64(),
        mine.as_secs_f64(),
        status.as_secs_f64(),
        status.as_secs_f64() / mine.as_secs_f64(),
        sha.as_secs_f64(),
        sha.as_secs_f64() / mine.as_secs_f64(),
        ours_hash.unwrap_or(0)
    );
}

/// 5. CRC-32C (hcp_dr's `Crc32c`, fed in 1 MiB pieces as the walk feeds
/// values) vs SHA-256 (sha2) over the same 256 MiB in memory; best of 3.
fn crc_throughput() {
    use sha2::Digest;
    let buf: Vec<u8> = (0..256u64 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let (mut crc_t, mut sha_t) = (Duration::MAX, Duration::MAX);
    let mut crc_value = 0;
    for _ in 0..3 {
        let start = Instant::now();
        let mut crc = hcp_dr::etcd::verify::Crc32c::default();
        for piece in buf.chunks(1 << 20) {
            crc.update(piece);
        }
        crc_value = std::hint::black_box(crc.finish());
        crc_t = crc_t.min(start.elapsed());
        let start = Instant::now();
        std::hint::black_box(sha2::Sha256::digest(&buf));
        sha_t = sha_t.min(start.elapsed());
    }
    println!(
        "crc32c: {:.0} MiB/s vs sha256 {:.0} MiB/s over 256 MiB in memory; ratio crc32c/sha256 = {:.2}x (crc {crc_value:08x})",
        256.0 / crc_t.as_secs_f64(),
        256.0 / sha_t.as_secs_f64(),
        sha_t.as_secs_f64() / crc_t.as_secs_f64()
    );
}

/// 2. API downtime: how long the writers must stay stopped for hcp-dr's
/// three-member snapshot (until every member's stream has started: etcd then
/// serves it from a fixed read transaction) vs one etcdctl snapshot, which
/// needs the writers stopped for its whole length; and the time until all
/// three are stored, with writes resumed meanwhile.
async fn three_member_downtime(dir: &Path, ha_size: u64) {
    let members = three_members(&dir.join("ha")).await;
    let urls: Vec<String> = members.iter().map(|m| m.client_url()).collect();
    fill(&urls[0], ha_size).await;
    let peer = etcdctl_save(&urls[0], &dir.join("ha-etcdctl.db"));
    let dir = dir.join("ha-ours");
    let store = std::sync::Arc::new(LocalStore::new(&dir));
    let start = Instant::now();
    let starts = urls.iter().enumerate().map(|(i, u)| async move {
        Member { name: format!("m{i}"), url: u.clone(), tls: None }.start_snapshot().await.expect("start")
    });
    let started = futures::future::join_all(starts).await;
    let downtime = start.elapsed();
    let revision = started[0].revision();
    assert!(started.iter().all(|s| s.revision() == revision), "members disagree");
    // the writers are back: write during the rest of the streams
    let writer = {
        let url = urls[0].clone();
        tokio::spawn(async move {
            let mut client = etcd_client::Client::connect([url.as_str()], None).await.expect("connect");
            for i in 0..200 {
                client.put(format!("/after/{i}"), "x", None).await.expect("put");
            }
        })
    };
    let finishes = started.into_iter().map(|s| {
        let store = store.clone();
        async move {
            let key = format!("{}.db", s.member());
            s.finish(store.as_ref(), &key, &hcp_dr::pipeline::Meter::new()).await.expect("finish")
        }
    });
    let reports = futures::future::join_all(finishes).await;
    let complete = start.elapsed();
    writer.await.expect("writer");
    assert!(reports.iter().all(|r| r.revision == revision), "a snapshot holds another revision");
    println!(
        "downtime: hcp-dr 3 members, writers stopped {:.2}s vs etcdctl 1 member {:.2}s; ratio = {:.3}x (goal <= 1.2x); all 3 stored after {:.2}s ({:.2}x), with 200 writes meanwhile, every snapshot at revision {revision}",
        downtime.as_secs_f64(),
        peer.as_secs_f64(),
        downtime.as_secs_f64() / peer.as_secs_f64(),
        complete.as_secs_f64(),
        complete.as_secs_f64() / peer.as_secs_f64()
    );
}
