//! Fleet backups at scale: one sandbox management cluster with a fleet of
//! SingleReplica hosted clusters (real etcd members), backed up by
//! `hcp-dr backup --all --concurrency N` for each N, in a fresh process each:
//!
//! - wall time, and the ratio to N=1;
//! - peak RSS of the hcp-dr process (its own VmHWM, see `common::run`);
//! - API requests per cluster, counted by the emulator's audit log
//!   (`DIR/mgmt-a/state/audit.log`, hcp-dr's by its User-Agent), at a small
//!   fleet first and at the full one, to show whether they grow with it, and
//!   the requests by verb and resource;
//! - that every cluster was backed up and ends unpaused with its API servers'
//!   replicas back.
//!
//! `cargo bench --bench fleet -- [--clusters 50] [--small 10] [--concurrency 1,4,8]`
//! Prints ratios; it asserts nothing about time.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hcp_dr_e2e::apiserver::audit::ResourcePath;
use hcp_dr_e2e::sandbox::{HostedClusterSpec, Sandbox, api_for, audit_log_path, create_all, wait_available};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::{Value, json};

use common::arg;

const NAMESPACE: &str = "clusters";

/// Create SingleReplica clusters `from..to` (`fleet-000`, ...), ten at a
/// time, and wait until each is Available.
async fn grow(mgmt: &kube::Client, from: usize, to: usize) {
    let names: Vec<String> = (from..to).map(|i| format!("fleet-{i:03}")).collect();
    for batch in names.chunks(10) {
        for name in batch {
            let mut spec = HostedClusterSpec::demo();
            spec.name = name.clone();
            spec.namespace = NAMESPACE.into();
            spec.availability = "SingleReplica".into();
            spec.node_pool_replicas = 1;
            // the namespace, created by the first, is left as it is by the others
            create_all(mgmt, &spec.objects()).await.unwrap_or_else(|e| panic!("creating {name}: {e}"));
        }
        for name in batch {
            wait_available(mgmt, NAMESPACE, name, Duration::from_secs(600))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

/// What one `backup --all` run measured.
struct Run {
    concurrency: usize,
    wall: Duration,
    peak_rss_kib: i64,
    requests: usize,
    by_verb: BTreeMap<String, usize>,
    succeeded: u64,
}

/// hcp-dr's lines of the audit log, from line `skip` on.
fn hcp_dr_requests(log: &Path, skip: usize) -> Vec<Value> {
    std::fs::read_to_string(log)
        .expect("audit log")
        .lines()
        .skip(skip)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["userAgent"].as_str().is_some_and(|ua| ua.starts_with("hcp-dr/")))
        .collect()
}

fn line_count(log: &Path) -> usize {
    std::fs::read_to_string(log).map(|t| t.lines().count()).unwrap_or(0)
}

/// `verb resource` of an audit event, names and namespaces left out
/// (`list hostedclusters`, `patch deployments/scale`).
fn shape(event: &Value) -> String {
    let uri = event["requestURI"].as_str().unwrap_or("");
    let resource = match hcp_dr_e2e::apiserver::audit::resource_path(uri) {
        Some(ResourcePath { resource, subresource: Some(sub), .. }) => format!("{resource}/{sub}"),
        Some(ResourcePath { resource, .. }) => resource.to_string(),
        None => uri.split('?').next().unwrap_or("").to_string(),
    };
    format!("{} {resource}", event["verb"].as_str().unwrap_or("?"))
}

/// Run `hcp-dr backup --all` in a fresh process, with
/// its own peak RSS.
fn backup_all(sandbox: &Sandbox, state: &Path, store: &Path, concurrency: usize) -> (Duration, i64, Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hcp-dr"));
    cmd.args(["backup", "--all", "-n", NAMESPACE, "--concurrency", &concurrency.to_string(), "-o", "json", "--to"])
        .arg(store)
        .env("KUBECONFIG", &sandbox.clusters[0].kubeconfig)
        .env("HCP_DR_CA_BUNDLE", sandbox.dir.join("ca.crt"))
        .env("HCP_DR_STATE_DIR", state)
        .env_remove("HCP_DR_STORE");
    let ran = common::run(cmd);
    let (exit, stdout, stderr, wall) = (ran.status, ran.stdout, ran.stderr, ran.wall);
    // exit 1: some clusters failed, the report says which and why
    let report: Value = match serde_json::from_slice(&stdout) {
        Ok(report) if exit.success() || exit.code() == Some(1) => report,
        _ => panic!("backup --all --concurrency {concurrency} failed ({exit}):\n{}", String::from_utf8_lossy(&stderr)),
    };
    for failed in report["clusters"].as_array().into_iter().flatten().filter(|c| c["succeeded"] != true) {
        let text = failed.to_string();
        println!("  failed: {}", &text[..text.len().min(600)]);
    }
    (wall, ran.rss_kib, report)
}

/// Every HostedCluster and NodePool unpaused, every kube-apiserver back at
/// its replicas.
async fn check_all_back(mgmt: &kube::Client, names: &[String], replicas: &BTreeMap<String, i32>) {
    let hcs = api_for(mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": NAMESPACE}}));
    let nps = api_for(mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool", "metadata": {"namespace": NAMESPACE}}));
    for hc in hcs.list(&Default::default()).await.expect("list").items {
        let value = serde_json::to_value(&hc).unwrap();
        assert!(value["spec"]["pausedUntil"].is_null(), "{} left paused", value["metadata"]["name"]);
    }
    for np in nps.list(&Default::default()).await.expect("list").items {
        let value = serde_json::to_value(&np).unwrap();
        assert!(value["spec"]["pausedUntil"].is_null(), "NodePool {} left paused", value["metadata"]["name"]);
    }
    for name in names {
        let ns = format!("{NAMESPACE}-{name}");
        let kas = Api::<Deployment>::namespaced(mgmt.clone(), &ns).get("kube-apiserver").await.expect("kube-apiserver");
        let now = kas.spec.replicas.unwrap_or(0);
        assert_eq!(Some(&now), replicas.get(name), "{ns}/kube-apiserver replicas not back");
    }
}

async fn replicas_of(mgmt: &kube::Client, names: &[String]) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    for name in names {
        let ns = format!("{NAMESPACE}-{name}");
        let kas = Api::<Deployment>::namespaced(mgmt.clone(), &ns).get("kube-apiserver").await.expect("kube-apiserver");
        out.insert(name.clone(), kas.spec.replicas.unwrap_or(0));
    }
    out
}

async fn measure(sandbox: &Sandbox, mgmt: &kube::Client, dir: &Path, clusters: usize, concurrency: usize) -> Run {
    let names: Vec<String> = (0..clusters).map(|i| format!("fleet-{i:03}")).collect();
    let replicas = replicas_of(mgmt, &names).await;
    let log = audit_log_path(&sandbox.dir, &sandbox.clusters[0].name);
    let before = line_count(&log);
    let store = dir.join(format!("store-{clusters}-{concurrency}"));
    let (wall, peak_rss_kib, report) = backup_all(sandbox, &dir.join("state"), &store, concurrency);
    let events = hcp_dr_requests(&log, before);
    let mut by_verb = BTreeMap::new();
    for event in &events {
        *by_verb.entry(shape(event)).or_insert(0) += 1;
    }
    // a failed backup must still leave its cluster unpaused and scaled back
    check_all_back(mgmt, &names, &replicas).await;
    let succeeded = report["succeeded"].as_u64().unwrap_or(0);
    let _ = std::fs::remove_dir_all(&store);
    Run {
        concurrency,
        wall,
        peak_rss_kib,
        requests: events.len(),
        by_verb,
        succeeded,
    }
}

fn print(clusters: usize, runs: &[Run]) {
    let one = runs.iter().find(|r| r.concurrency == 1).map(|r| r.wall);
    for run in runs {
        let ratio = one.map(|t| run.wall.as_secs_f64() / t.as_secs_f64());
        println!(
            "fleet {clusters}: --concurrency {} {:.1}s{}, peak RSS {:.1} MiB (goal < 200 MiB), {} requests = {:.1} per cluster, {} of {clusters} backed up",
            run.concurrency,
            run.wall.as_secs_f64(),
            match ratio {
                Some(r) if run.concurrency != 1 => format!(" ({r:.2}x of N=1{})", if run.concurrency == 8 { ", goal <= 0.25x" } else { "" }),
                _ => String::new(),
            },
            run.peak_rss_kib as f64 / 1024.0,
            run.requests,
            run.requests as f64 / clusters as f64,
            run.succeeded,
        );
    }
    if let Some(run) = runs.last() {
        let mut shapes: Vec<(&String, &usize)> = run.by_verb.iter().collect();
        shapes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let text: Vec<String> = shapes.iter().map(|(s, n)| format!("{s} {:.1}", **n as f64 / clusters as f64)).collect();
        println!("fleet {clusters}: requests per cluster by verb and resource (--concurrency {}): {}", run.concurrency, text.join(", "));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let clusters: usize = arg("--clusters", 50);
    let small: usize = arg("--small", 10).min(clusters);
    let concurrency: Vec<usize> = match arg("--concurrency", "1,4,8".to_string())
        .split(',')
        .map(|n| n.trim().parse::<usize>().ok().filter(|n| *n > 0))
        .collect::<Option<Vec<_>>>()
    {
        Some(list) => list,
        None => {
            eprintln!("error: --concurrency takes a comma-separated list of counts of at least 1, e.g. 1,4,8");
            std::process::exit(2);
        }
    };
    if clusters == 0 {
        eprintln!("error: --clusters must be at least 1");
        std::process::exit(2);
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir: PathBuf = tmp.path().to_path_buf();
    // each cluster: one etcd member (~70 MiB of data dir and WAL) and its backups
    let needed = (clusters as u64) * (100 << 20) * (1 + concurrency.len() as u64);
    common::ensure_room(&dir, needed, "the fleet's etcd members and backups", "lower --clusters or set TMPDIR to a file system with more room");
    println!("# hcp-dr fleet benchmark: {small} then {clusters} SingleReplica hosted clusters, --concurrency {concurrency:?}, in {}", dir.display());
    let sandbox = Sandbox::up(&dir.join("sandbox")).await.expect("sandbox up");
    let mgmt = sandbox.clusters[0].api.client().await.expect("client");
    let start = Instant::now();
    grow(&mgmt, 0, small).await;
    println!("created {small} clusters in {:.1}s", start.elapsed().as_secs_f64());
    let at_small = measure(&sandbox, &mgmt, &dir, small, *concurrency.last().unwrap_or(&8)).await;
    print(small, &[at_small]);
    let start = Instant::now();
    grow(&mgmt, small, clusters).await;
    println!("created {} more clusters in {:.1}s", clusters - small, start.elapsed().as_secs_f64());
    let mut runs = Vec::new();
    for n in &concurrency {
        runs.push(measure(&sandbox, &mgmt, &dir, clusters, *n).await);
        print(clusters, &runs[runs.len() - 1..]);
    }
    print(clusters, &runs);
    sandbox.shutdown().await;
}
