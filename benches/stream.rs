//! Continuous backup (issue 38, item 7), measured on the sandbox's
//! HighlyAvailable demo cluster (three real etcd members with TLS, the
//! emulated management cluster), with the built `hcp-dr stream` and its
//! defaults (`--segment-interval 10s`) writing to a local store:
//!
//! 1. **store per day**: `--steady-seconds` (120) of the write load
//!    (`--rate`, 200 writes/s of Kubernetes-shaped values, each one etcd
//!    revision) with the stream attached; the segments it wrote, as
//!    objects and bytes per cluster per day at that load, plus the bases
//!    (one every `--base-interval`, default 6h, at the base's stored size);
//! 2. **RPO**: under the same load, the stream is SIGKILLed at `--kills`
//!    (20) random instants, 2 to 30 s after it was (re)started, and
//!    restarted each time; at each kill the RPO is the kill time minus the
//!    receive time of the newest durable record (the last segment's last
//!    record, read back from the store): p50, p99, max, against the goal
//!    (p99 <= 15 s);
//! 3. **cost to etcd**: write throughput of 8 concurrent writers (each put
//!    waits for its answer) for `--cost-seconds` (20) with the stream
//!    attached and not, alternating, `--cost-runs` (3) of each: the ratio
//!    (goal >= 0.95x);
//! 4. **point-in-time restore**: the chain's base (the database filled to
//!    `--base-mib`, 1024, before the stream started) plus `--revisions`
//!    (360,000: 30 minutes at 200 writes/s) after it, written as fast as
//!    etcd takes them (what a replay costs is the revisions and their
//!    content, not the time they took to happen): `hcp-dr stream replay
//!    --latest` and `etcdctl snapshot restore` of its result, against the
//!    plain restore of the base alone (`zstd -d` of the stored base and
//!    `etcdctl snapshot restore`): replay speed (revisions/s, events/s)
//!    and the ratio (goal <= 1.5x). With `--before-bin PATH` (an older
//!    hcp-dr), that binary replays the first `--before-revisions`
//!    (36,000) of the same chain too, for its rate.
//!
//! The writes stand for writes through the hosted API server: they go
//! straight into etcd with its client (the emulated API server would be
//! the bottleneck, not etcd or the stream), with the keys and JSON values
//! the emulated API server stores: Lease renewals, Pod status updates,
//! Events (created, attached to a lease, as kube-apiserver does) and
//! ConfigMap updates.
//!
//! `cargo bench --bench stream -- [--base-mib 1024] [--rate 200]
//! [--steady-seconds 120] [--kills 20] [--cost-runs 3] [--cost-seconds 20]
//! [--revisions 360000] [--before-bin PATH] [--before-revisions 36000]`
//! Needs `etcdctl`, `etcd` and `zstd`, and about 4x `--base-mib` free
//! under TMPDIR. Prints ratios; asserts nothing about time.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::arg;
use common::tools::{HCP_NS, Tools, run_ok};
use etcd_client::{Client, PutOptions};
use hcp_dr::store::LocalStore;
use hcp_dr::stream::{catalog, verify};
use serde_json::{Value, json};

const GIB: f64 = (1u64 << 30) as f64;
const DAY: f64 = 86_400.0;

// ---------------------------------------------------------------------
// The write load

/// A deterministic generator (xorshift64*).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn hex(&mut self, n: usize) -> String {
        (0..n).map(|_| format!("{:x}", self.next() >> 60)).collect()
    }
    /// Uniform in [lo, hi).
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// How many apps the load's objects belong to.
const APPS: u64 = 500;

/// Write number `n` of the load: (key, JSON value, whether it is an Event
/// (written with a lease)), in the proportions of a busy cluster's steady
/// state: half Lease renewals, a fifth Pod status updates, a fifth Event
/// creates, a tenth ConfigMap updates.
fn write(n: u64, noise: &mut Noise) -> (String, Vec<u8>, bool) {
    let app = format!("app-{:05}", noise.next() % APPS);
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let ns = "bench";
    let meta = |name: &str| json!({"name": name, "namespace": ns, "uid": format!("{}-{}-{}", noise_free_uid(name), n % 7, "4f6c"), "resourceVersion": n.to_string(), "creationTimestamp": "2026-11-29T10:00:05Z"});
    let (key, value, event) = match n % 10 {
        0..=4 => (
            format!("/kubernetes.io/leases/{ns}/{app}"),
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta(&app),
                "spec": {"holderIdentity": format!("{app}-7d9f8b6c5d-x2k4z_{}", noise.hex(36)), "leaseDurationSeconds": 15, "acquireTime": "2026-11-29T10:00:10.000000Z", "renewTime": now, "leaseTransitions": 0}}),
            false,
        ),
        5 | 6 => {
            let conditions: Vec<Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
                .iter()
                .map(|c| json!({"type": c, "status": if n.is_multiple_of(3) && *c == "Ready" { "False" } else { "True" }, "lastProbeTime": null, "lastTransitionTime": now}))
                .collect();
            let env: Vec<Value> = (0..12).map(|k| json!({"name": format!("APP_SETTING_{k}"), "value": format!("value-{}", (n + k) % 13)})).collect();
            (
                format!("/kubernetes.io/pods/{ns}/{app}-7d9f8b6c5d-x2k4z"),
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta(&format!("{app}-7d9f8b6c5d-x2k4z")),
                    "spec": {"containers": [{"name": "app", "image": format!("quay.io/shop/{app}@sha256:{}", noise.hex(64)), "env": env,
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10}}],
                        "nodeName": format!("demo-workers-{}", n % 2), "serviceAccountName": app, "restartPolicy": "Always"},
                    "status": {"phase": "Running", "podIP": format!("10.128.{}.{}", n % 250, (n / 250) % 250), "conditions": conditions,
                        "containerStatuses": [{"name": "app", "ready": !n.is_multiple_of(3), "restartCount": n % 5, "started": true,
                            "containerID": format!("cri-o://{}", noise.hex(64)), "state": {"running": {"startedAt": now}}}]}}),
                false,
            )
        }
        7 | 8 => {
            let name = format!("{app}-7d9f8b6c5d-x2k4z.{}", noise.hex(16));
            (
                format!("/kubernetes.io/events/{ns}/{name}"),
                json!({"apiVersion": "v1", "kind": "Event", "metadata": meta(&name),
                    "involvedObject": {"kind": "Pod", "namespace": ns, "name": format!("{app}-7d9f8b6c5d-x2k4z"), "apiVersion": "v1", "fieldPath": "spec.containers{app}"},
                    "reason": if n.is_multiple_of(4) { "Unhealthy" } else { "Pulled" }, "message": format!("Readiness probe failed: Get \"http://10.128.{}.{}:8080/healthz\": context deadline exceeded", n % 250, n % 200),
                    "source": {"component": "kubelet", "host": format!("demo-workers-{}", n % 2)}, "type": "Warning", "count": 1 + n % 9,
                    "firstTimestamp": now, "lastTimestamp": now, "reportingComponent": "kubelet"}),
                true,
            )
        }
        _ => {
            let config: String = (0..24).map(|k| format!("  setting_{k}: {}\n", (n * 31 + k) % 997)).collect();
            (
                format!("/kubernetes.io/configmaps/{ns}/{app}-config"),
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(&format!("{app}-config")),
                    "data": {"application.yaml": format!("server:\n  port: 8080\n  name: {app}\nfeatures:\n{config}"), "log-level": "info"}}),
                false,
            )
        }
    };
    (key, serde_json::to_vec(&value).expect("JSON"), event)
}

/// A stable uid prefix for an object name.
fn noise_free_uid(name: &str) -> String {
    format!("{:08x}", name.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193)))
}

/// The lease Events are written with (kube-apiserver attaches Events to a
/// lease of the events TTL, 1 h, shared by the Events of a window); a new
/// one every 1,000 Events.
struct EventLeases {
    current: AtomicU64,
    used: AtomicU64,
}

impl EventLeases {
    async fn lease(&self, client: &mut Client) -> i64 {
        let used = self.used.fetch_add(1, Ordering::Relaxed);
        if used.is_multiple_of(1000) {
            let id = client.lease_grant(3600, None).await.expect("lease grant").id();
            self.current.store(id as u64, Ordering::Relaxed);
            return id;
        }
        loop {
            let id = self.current.load(Ordering::Relaxed) as i64;
            if id != 0 {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Put write `n`; its revision.
async fn put(client: &mut Client, n: u64, noise: &mut Noise, leases: &EventLeases) -> i64 {
    let (key, value, event) = write(n, noise);
    let options = if event { Some(PutOptions::new().with_lease(leases.lease(client).await)) } else { None };
    client.put(key, value, options).await.expect("put").header().map(|h| h.revision()).unwrap_or_default()
}

/// The write load at `rate` writes/s until `stop`: a put started every
/// 1/rate s, each on its own task (at most 64 in flight); the count written.
fn steady_load(client: Client, rate: f64, stop: Arc<AtomicBool>, leases: Arc<EventLeases>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let slots = Arc::new(tokio::sync::Semaphore::new(64));
        let written = Arc::new(AtomicU64::new(0));
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let permit = slots.clone().acquire_owned().await.expect("semaphore");
            let (mut client, leases, written) = (client.clone(), leases.clone(), written.clone());
            n += 1;
            let i = n;
            tokio::spawn(async move {
                put(&mut client, i, &mut Noise(0x9e37_79b9 ^ i), &leases).await;
                written.fetch_add(1, Ordering::Relaxed);
                drop(permit);
            });
        }
        let _ = slots.acquire_many(64).await;
        written.load(Ordering::Relaxed)
    })
}

/// `writers` writers putting one write after another, as fast as etcd
/// answers, for `seconds` or until `count` writes in all; (writes, seconds).
async fn flat_out(client: &Client, writers: u64, seconds: Option<f64>, count: Option<u64>, leases: &Arc<EventLeases>) -> (u64, f64) {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (mut client, next, leases) = (client.clone(), next.clone(), leases.clone());
            tokio::spawn(async move {
                let mut noise = Noise(0x5851_f42d ^ (w + 1));
                loop {
                    if seconds.is_some_and(|s| started.elapsed().as_secs_f64() >= s) {
                        return;
                    }
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if count.is_some_and(|c| n >= c) {
                        return;
                    }
                    put(&mut client, 1_000_000_000 + n, &mut noise, &leases).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer");
    }
    let written = next.load(Ordering::Relaxed).min(count.unwrap_or(u64::MAX));
    (written.saturating_sub(if count.is_none() { writers } else { 0 }), started.elapsed().as_secs_f64())
}

async fn revision(client: &Client) -> i64 {
    client.clone().status().await.expect("status").header().map(|h| h.revision()).unwrap_or_default()
}

// ---------------------------------------------------------------------
// The stream

struct Stream<'a> {
    tools: &'a Tools,
    store: PathBuf,
    logs: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Stream<'_> {
    fn start(&mut self) {
        assert!(self.child.is_none());
        self.starts += 1;
        let log = std::fs::File::create(self.logs.join(format!("stream-{}.log", self.starts))).expect("log");
        let out = std::fs::File::create(self.logs.join(format!("stream-{}.json", self.starts))).expect("report");
        let mut cmd = self.tools.hcp_dr(&self.tools.kubeconfig_a, &["stream", "--hosted-cluster", "clusters/demo", "--to", self.store.to_str().expect("path"), "-o", "json"]);
        cmd.stdout(out).stderr(log).stdin(Stdio::null());
        self.child = Some(cmd.spawn().expect("hcp-dr stream"));
    }

    /// SIGKILL it; when that was.
    fn kill(&mut self) -> DateTime<Utc> {
        let mut child = self.child.take().expect("a running stream");
        let at = Utc::now();
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        at
    }

    /// SIGTERM it and wait for it to finish the segment in flight.
    fn stop(&mut self) {
        let mut child = self.child.take().expect("a running stream");
        // SAFETY: a signal to our own child, whose pid is not reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let status = child.wait().expect("wait");
        assert!(status.success(), "hcp-dr stream exited {status}: see {}", self.logs.display());
    }

    fn check_alive(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().expect("try_wait")) {
            panic!("hcp-dr stream exited {status}: see {}", self.logs.display());
        }
    }

    async fn chains(&self) -> Vec<catalog::ChainListing> {
        catalog::chains(&LocalStore::new(&self.store), "clusters", "demo").await.expect("chains").0
    }

    /// The newest durable revision (the furthest chain's), and when the
    /// stream received it.
    async fn newest(&self) -> Option<(i64, DateTime<Utc>)> {
        let chains = self.chains().await;
        let chain = chains.iter().filter(|c| c.descriptor.is_ok()).max_by_key(|c| c.span().map(|s| s.through))?;
        let descriptor = chain.descriptor.as_ref().ok()?;
        let span = chain.span()?;
        let Some(name) = chain.segments.iter().take(span.segments).next_back() else { return Some((descriptor.base.revision, descriptor.base.taken)) };
        let stored = std::fs::read(self.store.join(chain.layout.segment(name))).expect("segment");
        let segment = verify::read_segment(&stored, chain, descriptor, name, None).await.expect("segment").expect("not encrypted");
        Some((segment.header.last_revision, segment.header.last_received))
    }

    /// Wait until the stream has written `revision` durably (at most `within`).
    async fn wait_durable(&mut self, revision: i64, within: Duration) {
        let started = Instant::now();
        while self.newest().await.is_none_or(|(r, _)| r < revision) {
            self.check_alive();
            assert!(started.elapsed() < within, "the stream did not write revision {revision} within {within:?}: see {}", self.logs.display());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Segment files and their bytes under `store` whose first revision is in (after, through].
fn segments_between(store: &Path, chains: &[catalog::ChainListing], after: i64, through: i64) -> (u64, u64) {
    let (mut count, mut bytes) = (0, 0);
    for chain in chains {
        for name in chain.segments.iter().filter(|s| s.first > after && s.first <= through) {
            count += 1;
            bytes += std::fs::metadata(store.join(chain.layout.segment(name))).expect("segment").len();
        }
    }
    (count, bytes)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// `BIN stream replay` of the demo cluster's stream in `store` to `target`, into `out`.
fn replay_cmd(bin: &Path, store: &Path, target: &[&str], out: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_remove("HCP_DR_STORE")
        .args(["stream", "replay", "--hosted-cluster", "clusters/demo", "--from", store.to_str().expect("path"), "--out", out.to_str().expect("path"), "-o", "json"])
        .args(target);
    cmd
}

fn snapshot_restore(snapshot: &Path, data: &Path) -> Duration {
    let mut restore = Command::new("etcdctl");
    restore.env("ETCDCTL_API", "3").args(["snapshot", "restore"]).arg(snapshot).arg("--data-dir").arg(data);
    let wall = run_ok(restore).wall;
    std::fs::remove_dir_all(data).ok();
    wall
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let base_mib: u64 = arg("--base-mib", 1024);
    let rate: f64 = arg("--rate", 200.0);
    let steady_seconds: f64 = arg("--steady-seconds", 120.0);
    let kills: usize = arg("--kills", 20);
    let cost_runs: usize = arg("--cost-runs", 3);
    let cost_seconds: f64 = arg("--cost-seconds", 20.0);
    let revisions: i64 = arg("--revisions", 360_000);
    let before_bin: String = arg("--before-bin", String::new());
    let before_revisions: i64 = arg("--before-revisions", 36_000);
    let keep_store: String = arg("--keep-store", String::new());
    for tool in ["etcdctl", "etcd", "zstd"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("error: `{tool}` is not on PATH (apt-get install etcd-server etcd-client zstd)");
            std::process::exit(2);
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    common::ensure_room(&dir, (base_mib * 4) << 20, "the members, the base, its replay and restores", "lower --base-mib or set TMPDIR to a disk with more room");
    println!(
        "# hcp-dr stream benchmark: HighlyAvailable demo cluster, base {base_mib} MiB, {rate} writes/s, {kills} kills, {cost_runs}x{cost_seconds}s cost runs, {revisions} revisions replayed, in {}",
        dir.display()
    );
    let (sandbox, mgmt) = common::tools::demo_sandbox(&dir, "HighlyAvailable").await;
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let tools = Tools::new(&sandbox, &mgmt, &work, dir.join("state")).await;
    let members = hcp_dr_e2e::drill::member_clients(&mgmt, HCP_NS).await.expect("member clients");
    let client = members[0].2.clone();
    let leases = Arc::new(EventLeases { current: AtomicU64::new(0), used: AtomicU64::new(0) });

    let started = Instant::now();
    let (filled, db) = hcp_dr_e2e::fill::kubernetes_objects_in_etcd(&client, "shop", 0, base_mib << 20, 16).await.expect("fill");
    println!("fill: {} apps, {} objects in {:.0}s; database {:.2} GiB", filled.apps, filled.objects, started.elapsed().as_secs_f64(), db as f64 / GIB);

    let mut stream = Stream { tools: &tools, store: dir.join("store"), logs: work.clone(), child: None, starts: 0 };
    let started = Instant::now();
    stream.start();
    let at = revision(&client).await;
    stream.wait_durable(at, Duration::from_secs(1800)).await;
    let chains = stream.chains().await;
    let base = chains.last().and_then(|c| c.descriptor.as_ref().ok()).map(|d| d.base.clone()).expect("a chain");
    println!("stream: base of {:.2} GiB ({:.2} GiB stored) at revision {}, durable in {:.0}s", base.raw.size as f64 / GIB, base.size as f64 / GIB, base.revision, started.elapsed().as_secs_f64());

    // 1. store per day, 2. RPO: under the steady load
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(client.clone(), rate, stop.clone(), leases.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let from = revision(&client).await;
    let clock = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(steady_seconds)).await;
    let to = revision(&client).await;
    let seconds = clock.elapsed().as_secs_f64();
    stream.wait_durable(to, Duration::from_secs(60)).await;
    let (segments, bytes) = segments_between(&stream.store, &stream.chains().await, from, to);
    let measured_rate = (to - from) as f64 / seconds;
    // the segments cut in `seconds` (rounded to whole intervals by the cut)
    let per_day = |n: u64| n as f64 / seconds * DAY;
    let base_interval_per_day = 4.0;
    println!(
        "store: {segments} segments, {:.1} KiB over {seconds:.0}s at {measured_rate:.0} revisions/s ({:.0} B/revision stored): per cluster per day {:.0} segment objects, {:.2} GiB; with a base every 6h ({:.2} GiB stored each): {:.0} objects, {:.2} GiB",
        bytes as f64 / 1024.0,
        bytes as f64 / (to - from) as f64,
        per_day(segments),
        per_day(bytes) / GIB,
        base.size as f64 / GIB,
        per_day(segments) + base_interval_per_day * 2.0,
        (per_day(bytes) + base_interval_per_day * base.size as f64) / GIB
    );

    let mut noise = Noise(0x2545_f491 ^ Utc::now().timestamp() as u64);
    let mut rpos = Vec::new();
    for k in 0..kills {
        tokio::time::sleep(Duration::from_secs_f64(noise.between(2.0, 30.0))).await;
        stream.check_alive();
        let killed = stream.kill();
        let (durable, received) = stream.newest().await.expect("a durable revision");
        let rpo = (killed - received).num_milliseconds() as f64 / 1000.0;
        println!("kill {}: at {} the newest durable revision {durable} was received {rpo:.1}s before", k + 1, killed.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        rpos.push(rpo);
        stream.start();
    }
    stop.store(true, Ordering::Relaxed);
    let written = load.await.expect("load");
    println!("load: {written} writes in the steady phases");
    if !rpos.is_empty() {
        let mut sorted = rpos.clone();
        sorted.sort_by(f64::total_cmp);
        let p99 = percentile(&sorted, 99.0);
        println!(
            "RPO at {} SIGKILLs under {rate} writes/s (--segment-interval 10s): p50 {:.1}s, p99 {p99:.1}s, max {:.1}s; goal p99 <= 15s {}",
            sorted.len(),
            percentile(&sorted, 50.0),
            sorted[sorted.len() - 1],
            met(p99 <= 15.0)
        );
    }
    let at = revision(&client).await;
    stream.wait_durable(at, Duration::from_secs(300)).await;

    // 3. cost to etcd: alternating, without first
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for run in 0..cost_runs * 2 {
        let attached = run % 2 == 1;
        if attached {
            stream.start();
            tokio::time::sleep(Duration::from_secs(3)).await;
        } else if stream.child.is_some() {
            stream.stop();
        }
        let (writes, seconds) = flat_out(&client, 8, Some(cost_seconds), None, &leases).await;
        let per_second = writes as f64 / seconds;
        println!("cost run {}: stream {}: {per_second:.0} writes/s", run + 1, if attached { "attached" } else { "not attached" });
        if attached {
            with.push(per_second);
        } else {
            without.push(per_second);
        }
    }
    if cost_runs > 0 {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let ratio = mean(&with) / mean(&without);
        println!(
            "cost to etcd (8 writers, {cost_seconds}s runs, {cost_runs} each, alternating): {:.0} writes/s with the stream, {:.0} without: {ratio:.3}x; goal >= 0.95x {}",
            mean(&with),
            mean(&without),
            met(ratio >= 0.95)
        );
    }
    if stream.child.is_none() {
        stream.start();
    }

    // 4. point-in-time restore: the chain's revisions after its base up to `revisions`
    let chains = stream.chains().await;
    let chain = chains.iter().filter(|c| c.descriptor.is_ok()).max_by_key(|c| c.span().map(|s| s.through)).expect("a chain");
    let descriptor = chain.descriptor.clone().expect("descriptor");
    let missing = descriptor.base.revision + revisions - revision(&client).await;
    let started = Instant::now();
    if missing > 0 {
        let (writes, seconds) = flat_out(&client, 8, None, Some(missing as u64), &leases).await;
        println!("wrote {writes} more revisions in {seconds:.0}s ({:.0}/s), as fast as etcd took them", writes as f64 / seconds);
    }
    let end = revision(&client).await;
    stream.wait_durable(end, Duration::from_secs(600)).await;
    stream.stop();
    let chains = stream.chains().await;
    let chain = chains.iter().filter(|c| c.descriptor.is_ok()).max_by_key(|c| c.span().map(|s| s.through)).expect("a chain");
    let descriptor = chain.descriptor.clone().expect("descriptor");
    println!("chain {}: base {} + {} revisions durable ({:.0}s to write them and catch up)", descriptor.chain_id, descriptor.base.revision, end - descriptor.base.revision, started.elapsed().as_secs_f64());
    drop(members);
    if !keep_store.is_empty() {
        let copied = Command::new("cp").arg("-a").arg(&stream.store).arg(&keep_store).status().expect("cp");
        assert!(copied.success(), "copying the store to {keep_store}");
        println!("store copied to {keep_store}");
    }

    // the plain restore of the base
    let stored_base = stream.store.join(chain.layout.artifact(&descriptor.base.artifact));
    let base_file = work.join("base.db");
    let mut unzstd = Command::new("zstd");
    unzstd.args(["-d", "-q", "-f", "-o"]).arg(&base_file).arg(&stored_base);
    let decompress = run_ok(unzstd).wall;
    let plain_restore = snapshot_restore(&base_file, &work.join("plain.etcd"));
    std::fs::remove_file(&base_file).ok();
    let plain = decompress + plain_restore;
    println!("plain restore of the base: {:.1}s (zstd -d {:.1}s + etcdctl snapshot restore {:.1}s)", plain.as_secs_f64(), decompress.as_secs_f64(), plain_restore.as_secs_f64());

    // the point-in-time restore
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_hcp-dr"));
    let out = work.join("replayed.db");
    let replayed = run_ok(replay_cmd(&bin, &stream.store, &["--latest"], &out));
    let report: Value = serde_json::from_slice(&replayed.stdout).expect("replay report");
    let pitr_restore = snapshot_restore(&out, &work.join("pitr.etcd"));
    std::fs::remove_file(&out).ok();
    let applied = report["revisions_applied"].as_f64().unwrap_or_default();
    let events = report["events_applied"].as_f64().unwrap_or_default();
    let replay_seconds = replayed.wall.as_secs_f64();
    let pitr = replay_seconds + pitr_restore.as_secs_f64();
    println!(
        "replay --latest: {applied:.0} revisions, {events:.0} events in {replay_seconds:.1}s ({:.0} revisions/s, {:.0} events/s over the whole command; resent {}; scratch in {}), peak RSS {:.0} MiB",
        applied / replay_seconds,
        events / replay_seconds,
        report["revisions_resent"],
        report["scratch"].as_str().unwrap_or("?"),
        replayed.rss_kib as f64 / 1024.0
    );
    let phase = |name: &str| report["phases"][name].as_f64().unwrap_or_default();
    println!(
        "replay phases: base read, decompressed and checked {:.1}s; revisions applied and hashed {:.1}s; result checked offline {:.1}s",
        phase("base_seconds"),
        phase("apply_seconds"),
        phase("check_seconds")
    );
    let ratio = pitr / plain.as_secs_f64();
    println!(
        "point-in-time restore of base + {applied:.0} revisions: {pitr:.1}s (replay {replay_seconds:.1}s + etcdctl snapshot restore {:.1}s) against the base's plain restore {:.1}s: {ratio:.2}x; goal <= 1.5x {}",
        pitr_restore.as_secs_f64(),
        plain.as_secs_f64(),
        met(ratio <= 1.5)
    );
    if !before_bin.is_empty() {
        let out = work.join("before.db");
        let target = (descriptor.base.revision + before_revisions.min(end - descriptor.base.revision)).to_string();
        let ran = run_ok(replay_cmd(Path::new(&before_bin), &stream.store, &["--at-revision", &target], &out));
        let report: Value = serde_json::from_slice(&ran.stdout).expect("replay report");
        std::fs::remove_file(&out).ok();
        let applied = report["revisions_applied"].as_f64().unwrap_or_default();
        println!(
            "before ({before_bin}): replay of {applied:.0} revisions, {:.0} events in {:.1}s ({:.0} revisions/s over the whole command)",
            report["events_applied"].as_f64().unwrap_or_default(),
            ran.wall.as_secs_f64(),
            applied / ran.wall.as_secs_f64()
        );
    }
    println!("(revisions/s are over the whole command: the base read from the store and decompressed, the replay (written into the base's database, or through a scratch etcd with HCP_DR_REPLAY_THROUGH_ETCD=1), the result's offline check)");
    sandbox.shutdown().await;
}

