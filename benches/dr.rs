//! The whole DR path at size, against the documented manual procedure and
//! the raw data movement, in one run on the sandbox (real etcd members,
//! S3 over HTTPS from s3s-fs, the emulated management clusters):
//!
//! 1. **backup to S3** of a HighlyAvailable cluster whose three etcd members
//!    hold `--size-mib` (1100) MiB: hcp-dr against the manual procedure
//!    (pause with `kubectl patch`, `kubectl scale` the API servers to zero
//!    and wait for their pods to go, `etcdctl snapshot save` of each member
//!    in turn, `aws s3 cp` of each, `kubectl get -o yaml` per object kind,
//!    scale back up and wait for the rollout, unpause): wall time, API
//!    downtime (scale-down to API servers ready, as hcp-dr reports it) and
//!    peak RSS (hcp-dr's process; for the procedure the largest of its
//!    commands);
//! 2. **restore** of that backup from S3 to Available on mgmt-b, mgmt-a
//!    lost (`Sandbox::lose`; revived before the migrate): hcp-dr's
//!    wall time against the raw data movement measured alone (`aws s3 cp`
//!    of the snapshot + `etcdctl snapshot restore`, per member);
//! 3. **migrate** mgmt-a to mgmt-b after the restored copy is destroyed:
//!    hcp-dr's RTO (API down on the source until Available on the
//!    destination) against the sum of the raw data steps (one `etcdctl
//!    snapshot save`, its upload, then the restore's raw steps).
//!
//! A HighlyAvailable restore seeds the members' volumes with
//! `etcdutl snapshot restore --bump-revision`, which Debian's etcd 3.4
//! lacks: the sandbox emulates the bump with a scratch etcd (writes,
//! compaction, defragmentation), seconds that etcdutl does not spend. Restore
//! and migrate are printed with and without that time
//! (`hcp_dr_e2e::operator::bump::emulated_time`). The backup's compression
//! ratio is printed too.
//!
//! `cargo bench --bench dr -- [--size-mib N] [--fill kubernetes|patterned]`
//! Needs the `aws` CLI (`pip install awscli`), `etcdctl` and `kubectl`.
//! Prints ratios; it asserts nothing about time.
//!
//! etcdctl reaches the members at their pod IPs with `--insecure-skip-tls-verify`:
//! the members' serving certificates name only their in-cluster DNS names (as
//! real ones do; the procedure runs etcdctl inside the pod). The TLS and the
//! client certificate are the same, only the name check is skipped.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Fill, arg};
use common::tools::{HCP_NS, NS, Tools, member_endpoints, mib, raw_restore, report, run_ok, snapshot_sizes, stage_times};

use hcp_dr_e2e::sandbox::{BUCKET, wait_available};

const WRITERS: [&str; 3] = ["kube-apiserver", "openshift-apiserver", "openshift-oauth-apiserver"];

/// Fill the cluster's etcd through its first member (raft copies it to the
/// others), as `--fill` says.
async fn fill(mgmt: &kube::Client, mib: u64, kind: Fill) {
    let mut members = hcp_dr_e2e::drill::member_clients(mgmt, HCP_NS).await.expect("member clients");
    let (_, _, client) = &mut members[0];
    kind.write(client, mib, "/hcp-dr-bench/").await;
}

/// A seeded restore's time without the sandbox's emulated `--bump-revision`
/// (Debian's etcd 3.4 has none: the sandbox replays it with writes, a
/// restore, a compaction and a defragmentation while the seeding pods wait;
/// etcdutl makes it one write in place), against the raw data steps.
fn without_emulated_bump(what: &str, wall: Duration, bump: Duration, raw: Duration) -> String {
    let net = wall.saturating_sub(bump);
    format!(
        "{what} without the sandbox's emulated --bump-revision ({:.1}s; etcdutl bumps in place): {:.1}s vs raw {:.1}s: {:.2}x",
        bump.as_secs_f64(),
        net.as_secs_f64(),
        raw.as_secs_f64(),
        net.as_secs_f64() / raw.as_secs_f64()
    )
}

/// 1. The documented procedure, step by step; (wall, downtime, largest RSS).
async fn manual_backup(tools: &Tools, mgmt: &kube::Client, dir: &Path) -> (Duration, Duration, i64) {
    let a = &tools.kubeconfig_a;
    let mut rss = 0;
    let mut step = |cmd: Command| {
        let ran = run_ok(cmd);
        rss = rss.max(ran.rss_kib);
        ran
    };
    let start = Instant::now();
    step(tools.kubectl(a, &["patch", "-n", NS, "hostedcluster/demo", "--type", "merge", "-p", r#"{"spec":{"pausedUntil":"true"}}"#]));
    step(tools.kubectl(a, &["patch", "-n", NS, "nodepool/demo-workers", "--type", "merge", "-p", r#"{"spec":{"pausedUntil":"true"}}"#]));
    let deployments: Vec<String> = WRITERS.iter().map(|w| format!("deployment/{w}")).collect();
    let mut scale = vec!["scale", "-n", HCP_NS, "--replicas=0"];
    scale.extend(deployments.iter().map(String::as_str));
    let replicas: Vec<String> = WRITERS
        .iter()
        .map(|w| {
            let out = run_ok(tools.kubectl(a, &["get", "-n", HCP_NS, &format!("deployment/{w}"), "-o", "jsonpath={.spec.replicas}"]));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .collect();
    let down = Instant::now();
    step(tools.kubectl(a, &scale));
    // until their pods are gone (`kubectl wait --for=delete` fails when none is left to wait for)
    for w in WRITERS {
        while !step(tools.kubectl(a, &["get", "pod", "-n", HCP_NS, "-l", &format!("app={w}"), "-o", "name"])).stdout.is_empty() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    for (pod, endpoint) in member_endpoints(mgmt).await {
        let file = dir.join(format!("{pod}.db"));
        step(tools.etcdctl(&endpoint, &["snapshot", "save", file.to_str().unwrap()]));
        step(tools.aws(&["s3", "cp", file.to_str().unwrap(), &format!("s3://{BUCKET}/manual/{pod}.db")]));
        std::fs::remove_file(&file).ok();
    }
    for (kind, ns) in [
        ("hostedcluster,nodepool", NS),
        ("secret", NS),
        ("hostedcontrolplane", HCP_NS),
        ("cluster.cluster.x-k8s.io,machinedeployment,machineset,machine", HCP_NS),
        ("secret", HCP_NS),
        ("configmap", HCP_NS),
    ] {
        let out = step(tools.kubectl(a, &["get", "-n", ns, kind, "-o", "yaml"]));
        std::fs::write(dir.join(format!("{ns}-{}.yaml", kind.replace([',', '.'], "_"))), &out.stdout).expect("write yaml");
    }
    for (w, n) in WRITERS.iter().zip(&replicas) {
        step(tools.kubectl(a, &["scale", "-n", HCP_NS, &format!("deployment/{w}"), &format!("--replicas={n}")]));
    }
    for w in WRITERS {
        step(tools.kubectl(a, &["rollout", "status", "-n", HCP_NS, &format!("deployment/{w}"), "--timeout=300s"]));
    }
    let downtime = down.elapsed();
    step(tools.kubectl(a, &["patch", "-n", NS, "nodepool/demo-workers", "--type", "json", "-p", r#"[{"op":"remove","path":"/spec/pausedUntil"}]"#]));
    step(tools.kubectl(a, &["patch", "-n", NS, "hostedcluster/demo", "--type", "json", "-p", r#"[{"op":"remove","path":"/spec/pausedUntil"}]"#]));
    (start.elapsed(), downtime, rss)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let size: u64 = arg("--size-mib", 1100);
    let kind = Fill::from_args();
    for tool in ["aws", "etcdctl", "kubectl"] {
        if Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            eprintln!("error: `{tool}` is not on PATH; the manual procedure needs it (aws: pip install awscli; etcdctl: apt-get install etcd-client)");
            std::process::exit(2);
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    // three members on mgmt-a, the manual and hcp-dr backups in S3, three
    // restored members on mgmt-b, three migrated ones, a raw restore, each
    // about 1.15x the values
    let needed = (size * 14) << 20;
    common::ensure_room(&dir, needed, "the benchmark's etcd members, snapshots and backups", "lower --size-mib or set TMPDIR to a file system with more room");
    println!("# hcp-dr DR benchmark: HighlyAvailable cluster, 3 etcd members filled with {size} MiB, in {}", dir.display());
    let (sandbox, mgmt) = common::tools::demo_sandbox(&dir, "HighlyAvailable").await;
    let t = Instant::now();
    fill(&mgmt, size, kind).await;
    println!("filled {size} MiB ({}) in {:.1}s", kind.name(), t.elapsed().as_secs_f64());
    let work = dir.join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let tools = Tools::new(&sandbox, &mgmt, &work, dir.join("state")).await;
    let s3 = ["--s3-endpoint", &tools.s3_url];

    // 1. backup: the manual procedure, then hcp-dr
    let (manual_wall, manual_down, manual_rss) = manual_backup(&tools, &mgmt, &work).await;
    let store = format!("s3://{BUCKET}/backups");
    let ours = run_ok(tools.hcp_dr(&tools.kubeconfig_a, &["backup", "--hosted-cluster", "demo", "--to", &store, s3[0], s3[1], "-o", "json"]));
    let backup = report(&ours);
    let our_down = backup["api_downtime_seconds"].as_f64().expect("api_downtime_seconds");
    println!(
        "backup to S3: hcp-dr {:.1}s vs manual procedure {:.1}s: {:.2}x (goal <= 0.5x); API downtime {:.2}s vs {:.1}s: {:.3}x (goal <= 0.1x); peak RSS {:.1} MiB (goal < 100 MiB) vs the procedure's largest command {:.1} MiB",
        ours.wall.as_secs_f64(),
        manual_wall.as_secs_f64(),
        ours.wall.as_secs_f64() / manual_wall.as_secs_f64(),
        our_down,
        manual_down.as_secs_f64(),
        our_down / manual_down.as_secs_f64(),
        mib(ours.rss_kib),
        mib(manual_rss),
    );

    println!("backup stages: {}", stage_times(&backup));
    let (raw_size, stored) = snapshot_sizes(&tools, backup["backup"].as_str().expect("backup URL"), &work);
    println!(
        "compression (--fill {}): a member's snapshot {:.1} MiB raw, {:.1} MiB stored: {:.2}x",
        kind.name(),
        mib(raw_size as i64 / 1024),
        mib(stored as i64 / 1024),
        raw_size as f64 / stored.max(1) as f64
    );

    // 2. mgmt-a is lost (the restore's case: its hosted API's address is
    // free again); restore onto mgmt-b, against the raw movement measured alone
    let mut sandbox = sandbox;
    sandbox.lose("mgmt-a").await.expect("lose mgmt-a");
    let url = backup["backup"].as_str().expect("backup URL").to_string();
    // exit 3: the run stopped after a stage with changes in place; the
    // report says which (shown), the cluster may still have come up
    let bump_before = hcp_dr_e2e::operator::bump::emulated_time();
    let restored = common::run(tools.hcp_dr(&tools.kubeconfig_b, &["restore", "--from", &url, s3[0], s3[1], "--wait", "10m", "-o", "json"]));
    let restored = match restored.status.code() {
        Some(3) => {
            let text = String::from_utf8_lossy(&restored.stdout).to_string();
            println!("restore needs attention (exit 3), its report: {}", &text[..text.len().min(3000)]);
            restored
        }
        _ => restored.ok(),
    };
    // the manual procedure's raw snapshot of the same data (hcp-dr's is
    // compressed, which `etcdctl snapshot restore` cannot read)
    let bump = hcp_dr_e2e::operator::bump::emulated_time() - bump_before;
    let raw = raw_restore(&tools, &work, "manual/etcd-0.db", 3);
    println!(
        "restore from S3 to Available on mgmt-b: hcp-dr {:.1}s vs raw (aws s3 cp + etcdctl snapshot restore, 3 members) {:.1}s: {:.2}x (goal <= 1.3x); peak RSS {:.1} MiB",
        restored.wall.as_secs_f64(),
        raw.as_secs_f64(),
        restored.wall.as_secs_f64() / raw.as_secs_f64(),
        mib(restored.rss_kib),
    );
    println!("{}", without_emulated_bump("restore", restored.wall, bump, raw));
    if let Ok(restored) = serde_json::from_slice::<serde_json::Value>(&restored.stdout) {
        println!("restore stages: {}", stage_times(&restored));
    }

    // 3. migrate a -> b once the restored copy is gone from b and mgmt-a is back
    run_ok(tools.hcp_dr(&tools.kubeconfig_b, &["cluster", "destroy", "demo", "-n", NS]));
    sandbox.revive("mgmt-a").await.expect("revive mgmt-a");
    let mgmt = sandbox.cluster("mgmt-a").expect("mgmt-a").api.client().await.expect("client");
    wait_available(&mgmt, NS, "demo", Duration::from_secs(300)).await.expect("demo Available again on mgmt-a");
    let (_, endpoint) = member_endpoints(&mgmt).await.remove(0);
    let file = work.join("raw-save.db");
    let save = run_ok(tools.etcdctl(&endpoint, &["snapshot", "save", file.to_str().unwrap()])).wall;
    let upload = run_ok(tools.aws(&["s3", "cp", file.to_str().unwrap(), &format!("s3://{BUCKET}/raw/save.db")])).wall;
    std::fs::remove_file(&file).ok();
    let raw_migrate = save + upload + raw;
    let journal = dir.join("migrate.journal");
    let bump_before = hcp_dr_e2e::operator::bump::emulated_time();
    let moved = run_ok(tools.hcp_dr(
        &tools.kubeconfig_a,
        &[
            "migrate", "--hosted-cluster", "demo",
            "--from-kubeconfig", tools.kubeconfig_a.to_str().unwrap(),
            "--to-kubeconfig", tools.kubeconfig_b.to_str().unwrap(),
            "--via", &format!("s3://{BUCKET}/migrations"), s3[0], s3[1],
            "--journal", journal.to_str().unwrap(), "--wait", "10m",
            "--route53-zone", &sandbox.zone_id, "--route53-endpoint", sandbox.route53.url(),
            "-o", "json",
        ],
    ));
    let migrated = report(&moved);
    let rto = migrated["rto_seconds"].as_f64().expect("rto_seconds");
    println!(
        "migrate: RTO {:.1}s (whole run {:.1}s) vs raw data steps (snapshot save + upload + the restore's raw steps) {:.1}s: {:.2}x (goal <= 1.5x); peak RSS {:.1} MiB",
        rto,
        moved.wall.as_secs_f64(),
        raw_migrate.as_secs_f64(),
        rto / raw_migrate.as_secs_f64(),
        mib(moved.rss_kib),
    );
    let bump = hcp_dr_e2e::operator::bump::emulated_time() - bump_before;
    println!("{}", without_emulated_bump("migrate RTO", Duration::from_secs_f64(rto), bump, raw_migrate));
    println!("migrate stages: {}", stage_times(&migrated));
    sandbox.shutdown().await;
}
