//! `hcp-dr stream` on Kubernetes, on one sandbox (SingleReplica):
//!
//! - `schedule render --continuous --shards 2` applies with kubectl (and
//!   again, unchanged); the StatefulSet's pod args are then run exactly as
//!   rendered, as the rendered ServiceAccount (a token from the
//!   TokenRequest API, nothing but the rendered RBAC, which reads and
//!   writes only its Leases), with HOSTNAME set to
//!   the pod's name: the pod of the other shard streams nothing; the pod
//!   of demo's shard writes its chain;
//! - a second stream of the same shard finds demo's Lease held and does
//!   not write; once the first is SIGKILLed and its Lease expires, it takes
//!   over and resumes the chain; a Lease taken from under it stops its
//!   writes at once (`LEASE LOST`, no segment until it holds it again);
//! - relisting: demo no longer selected stops (its open segment written,
//!   the Lease released), selected again starts again;
//! - `/metrics` passes `promtool check metrics` and says the lag, segments,
//!   bytes and Lease; `/healthz` answers 200; the store refusing a
//!   cluster's segments with no room to spool breaks its chain (the
//!   metric counts it, the process lives on, a new chain starts once the
//!   store answers); the rendered stream alerts
//!   pass `promtool check rules` and fire in `promtool test rules` on series
//!   named and labelled as the scrape.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::logged::Logged;
use crate::support::{self, Env, text};

const RUNBOOKS: &str = "https://git.example.com/platform/hcp-dr/blob/main/docs/runbooks";

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap_or_else(|e| panic!("kubectl not found ({e}): install kubectl (https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubectl)"));
    assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A kubeconfig for ServiceAccount `sa` of `namespace`, with a token from the TokenRequest API.
fn service_account_kubeconfig(admin: &Path, sa: &str, namespace: &str, dir: &Path) -> PathBuf {
    let token = kubectl(admin, &["create", "token", sa, "-n", namespace, "--duration", "2h"]).trim().to_string();
    let kubeconfig = dir.join(format!("{sa}.kubeconfig"));
    std::fs::copy(admin, &kubeconfig).unwrap();
    kubectl(&kubeconfig, &["config", "set-credentials", sa, "--token", &token]);
    kubectl(&kubeconfig, &["config", "set-context", "--current", "--user", sa]);
    kubeconfig
}

fn hcp_dr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(args).output().expect("run hcp-dr")
}

/// A running stream pod: its log lines as they come (all kept, in order).
struct Pod {
    logged: Logged,
    metrics: Option<String>,
}

impl Pod {
    /// Run `args` as the StatefulSet's pod `hostname` would: its args, its
    /// name in HOSTNAME, the ServiceAccount's identity; the metrics on a
    /// free port, a 3 s Lease, relisting every 2 s (the environment).
    fn start(env: &Env, hostname: &str, args: &[String], kubeconfig: &Path) -> Pod {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let vars = [
            ("HOSTNAME", hostname),
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("HCP_DR_METRICS_ADDR", "127.0.0.1:0"),
            ("HCP_DR_LEASE_DURATION", "3s"),
            ("HCP_DR_RELIST_EVERY", "2s"),
            ("HCP_DR_LOG_FORMAT", "text"),
            ("NO_COLOR", "1"),
        ];
        let mut pod = Pod { logged: Logged::spawn(hostname, env.command(&args, &vars)), metrics: None };
        let serving = pod.wait_for("serving /metrics and /healthz on ");
        pod.metrics = serving.rsplit(' ').next().map(str::to_string);
        pod
    }

    /// The log lines read so far.
    fn log(&self) -> &[String] {
        &self.logged.log
    }

    /// Wait until a log line after line `from` contains `needle`; its index.
    fn wait_after(&mut self, from: usize, needle: &str) -> usize {
        self.logged.wait_after(from, needle, Duration::from_secs(120))
    }

    fn wait_for(&mut self, needle: &str) -> String {
        let at = self.wait_after(0, needle);
        self.log()[at].clone()
    }

    /// `GET path` on the pod's metrics address: status and body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut socket = std::net::TcpStream::connect(self.metrics.as_deref().expect("serving")).expect("connect to the metrics address");
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(socket, "GET {path} HTTP/1.0\r\nHost: pod\r\n\r\n").unwrap();
        let mut response = String::new();
        socket.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP response: {response}"));
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, body.to_string())
    }

    /// SIGTERM; the exit status, the JSON report and the whole log.
    fn term(self) -> (std::process::ExitStatus, Value, Vec<String>) {
        self.logged.term()
    }

    fn kill(self) {
        self.logged.kill(); // SIGKILL
    }
}

/// The value of the series `name{...hosted_cluster="demo"}`, if exported.
fn demo_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("hosted_cluster=\"demo\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The series (name and labels) of `name` for demo, as exported.
fn demo_series(metrics: &str, name: &str) -> String {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("hosted_cluster=\"demo\""))
        .and_then(|l| l.rsplit_once(' ').map(|(s, _)| s.to_string()))
        .unwrap_or_else(|| panic!("no {name} of demo in:\n{metrics}"))
}

fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "promtool is not installed: e2e/setup installs Debian's prometheus package");
        println!("skipped: promtool is not installed (e2e/setup installs Debian's prometheus package)");
        return None;
    }
    Some("promtool")
}

fn promtool_ok(args: &[&str], dir: &Path, stdin: Option<&str>) -> String {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{said}");
    said
}

/// The Lease's holder, as the API server has it.
fn holder(admin: &Path) -> String {
    let lease: Value = serde_json::from_str(&kubectl(admin, &["get", "lease", "hcp-dr-stream.clusters.demo", "-n", "hcp-dr", "-o", "json"])).unwrap();
    lease["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string()
}

/// A key written to demo's etcd; its revision.
async fn put(env: &Env, key: &str) -> i64 {
    let members = hcp_dr_e2e::drill::member_clients(&env.mgmt, &env.hcp_ns()).await.expect("member clients");
    let (_, _, mut client) = members.into_iter().next().expect("a member");
    let response = client.put(key, "x", None).await.expect("put");
    response.header().map(|h| h.revision()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rendered_statefulset_streams_its_shard_with_one_writer_per_cluster() {
    let env = support::env("SingleReplica").await;
    let dir = env.dir.path();
    let admin = env.sandbox.clusters[0].kubeconfig.clone();
    let store = env.local_store();
    let store_arg = store.to_str().unwrap().to_string();

    // render and apply as the runbook says; again: nothing changes
    let render = ["schedule", "render", "--schedule", "0 */6 * * *", "--to", &store_arg, "-l", "backup=yes", "--continuous", "--shards", "2"];
    let out = hcp_dr(&render);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = dir.join("continuous.yaml");
    std::fs::write(&yaml, &out.stdout).unwrap();
    let applied = kubectl(&admin, &["apply", "-f", yaml.to_str().unwrap()]);
    for created in [
        "serviceaccount/hcp-dr-stream",
        "clusterrole.rbac.authorization.k8s.io/hcp-dr-stream",
        "clusterrolebinding.rbac.authorization.k8s.io/hcp-dr-stream",
        "role.rbac.authorization.k8s.io/hcp-dr-stream",
        "rolebinding.rbac.authorization.k8s.io/hcp-dr-stream",
        "service/hcp-dr-stream",
        "statefulset.apps/hcp-dr-stream",
        "cronjob.batch/hcp-dr-backup",
    ] {
        assert!(applied.contains(created), "{created} not applied: {applied}");
    }
    let again = kubectl(&admin, &["apply", "-f", yaml.to_str().unwrap()]);
    assert!(again.lines().all(|l| l.ends_with("unchanged")), "{again}");

    // the pods' command, as the API server holds it
    let sts: Value = serde_json::from_str(&kubectl(&admin, &["get", "statefulset", "hcp-dr-stream", "-n", "hcp-dr", "-o", "json"])).unwrap();
    assert_eq!((sts["spec"]["replicas"].as_u64(), sts["spec"]["podManagementPolicy"].as_str()), (Some(2), Some("Parallel")), "{sts:#}");
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    let args: Vec<String> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    assert_eq!(args[..6], ["stream", "--all", "-l", "backup=yes", "--shard-from-hostname", "2"], "{args:?}");
    let pod_env = container["env"].as_array().unwrap();
    assert!(pod_env.iter().any(|e| e["name"] == "HCP_DR_METRICS_ADDR" && e["value"] == "0.0.0.0:9102"), "{pod_env:?}");
    let identity = service_account_kubeconfig(&admin, "hcp-dr-stream", "hcp-dr", dir);

    // the stream's identity reads, and writes nothing but its Leases, in its namespace
    for (verb, resource, ns, allowed) in [
        ("list", "hostedclusters.hypershift.openshift.io", "", true),
        ("patch", "hostedclusters.hypershift.openshift.io", "clusters", false),
        ("get", "secrets/etcd-client-tls", "clusters-demo", true),
        // it records the cluster's objects, its secrets among them, as a backup exports them
        ("get", "secrets/demo-pull-secret", "clusters", true),
        ("list", "secrets", "clusters-demo", true),
        ("patch", "secrets", "clusters-demo", false),
        ("list", "nodepools.hypershift.openshift.io", "clusters", true),
        ("patch", "nodepools.hypershift.openshift.io", "clusters", false),
        ("get", "configmaps/etcd-ca", "clusters-demo", true),
        ("list", "pods", "clusters-demo", true),
        ("delete", "pods", "clusters-demo", false),
        ("update", "leases.coordination.k8s.io", "hcp-dr", true),
        ("create", "leases.coordination.k8s.io", "clusters", false),
        ("delete", "leases.coordination.k8s.io", "hcp-dr", false),
        ("patch", "deployments.apps", "clusters-demo", false),
    ] {
        let mut args = vec!["--kubeconfig", identity.to_str().unwrap(), "auth", "can-i", verb, resource];
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        let out = Command::new("kubectl").args(&args).env_remove("KUBECONFIG").output().unwrap();
        assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).trim()), if allowed { (Some(0), "yes") } else { (Some(1), "no") }, "can-i {verb} {resource} -n {ns}: {}", text(&out));
    }

    kubectl(&admin, &["label", "hostedcluster", "demo", "-n", "clusters", "backup=yes"]);
    let hc: Value = serde_json::from_str(&kubectl(&admin, &["get", "hostedcluster", "demo", "-n", "clusters", "-o", "json"])).unwrap();
    let mine = hcp_dr::ops::shard::Shard::of(hc["metadata"]["uid"].as_str().unwrap(), 2);
    let (pod_mine, pod_other) = (format!("hcp-dr-stream-{mine}"), format!("hcp-dr-stream-{}", 1 - mine));

    // the other shard's pod: nothing to stream, healthy
    let mut other = Pod::start(&env, &pod_other, &args, &identity);
    other.wait_for(&format!("0 HostedCluster(s) to stream (shard {}/2)", 1 - mine));
    assert_eq!(other.get("/healthz"), (200, "ok\n".to_string()));
    let (status, report, _) = other.term();
    assert!(status.success(), "{report:#}");
    assert_eq!((report["shard"].as_str(), report["clusters"].as_array().map(Vec::len)), (Some(format!("{}/2", 1 - mine).as_str()), Some(0)), "{report:#}");
    assert!(!store.join("clusters/demo/stream").exists(), "the other shard wrote demo's stream");

    // demo's pod takes the Lease and writes the chain
    let mut first = Pod::start(&env, &pod_mine, &args, &identity);
    first.wait_for("took Lease hcp-dr/hcp-dr-stream.clusters.demo as ");
    first.wait_for("started at base revision");
    // and the cluster's objects beside the chain, under the rendered identity
    first.wait_for("objects changed, set");
    put(&env, "/hcp-dr-test/k8s/first").await;
    first.wait_for("segment ");
    assert!(holder(&admin).starts_with(&format!("{pod_mine}-")), "{}", holder(&admin));

    // a second stream of the same shard (a rollout's overlap): the Lease is held, it writes nothing
    let mut second = Pod::start(&env, &pod_mine, &args, &identity);
    second.wait_for(&format!("Lease hcp-dr/hcp-dr-stream.clusters.demo held by `{pod_mine}-"));
    let metrics = first.get("/metrics").1;
    assert_eq!(demo_value(&metrics, "hcp_dr_stream_lease_held"), Some(1.0), "{metrics}");
    assert!(demo_value(&metrics, "hcp_dr_stream_segments_total").is_some_and(|n| n >= 1.0), "{metrics}");
    assert!(demo_value(&metrics, "hcp_dr_stream_bytes_total").is_some_and(|n| n > 0.0), "{metrics}");
    assert_eq!(demo_value(&metrics, "hcp_dr_stream_chain_breaks_total"), Some(0.0), "{metrics}");
    // a quiet etcd does not look lagging: the member's progress answers move it on
    let lag = demo_value(&metrics, "hcp_dr_stream_lag_seconds").unwrap_or_else(|| panic!("no lag: {metrics}"));
    assert!((0.0..60.0).contains(&lag), "{lag}: {metrics}");
    let waiting = second.get("/metrics").1;
    assert_eq!(demo_value(&waiting, "hcp_dr_stream_lease_held"), Some(0.0), "{waiting}");
    assert_eq!(demo_value(&waiting, "hcp_dr_stream_lag_seconds"), None, "the waiting stream exports no lag: {waiting}");
    assert_eq!(second.get("/healthz").0, 200);
    assert_eq!(first.get("/nothing").0, 404);
    if promtool().is_some() {
        promtool_ok(&["check", "metrics"], dir, Some(&metrics));
    }

    // the first is SIGKILLed: its Lease expires, the second takes over and resumes the chain
    first.kill();
    let after_kill = put(&env, "/hcp-dr-test/k8s/after-kill").await;
    let took = second.wait_after(0, "took Lease hcp-dr/hcp-dr-stream.clusters.demo");
    second.wait_after(took, "resuming chain");
    second.wait_after(took, "segment ");
    assert!(holder(&admin).starts_with(&format!("{pod_mine}-")), "{}", holder(&admin));

    // the Lease taken from under it: it stops writing at once, and takes it again once that one expires
    let lease: Value = serde_json::from_str(&kubectl(&admin, &["get", "lease", "hcp-dr-stream.clusters.demo", "-n", "hcp-dr", "-o", "json"])).unwrap();
    let mut stolen = lease.clone();
    stolen["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    stolen["spec"]["holderIdentity"] = json!("intruder");
    stolen["spec"]["renewTime"] = json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    let stolen_file = dir.join("stolen.json");
    std::fs::write(&stolen_file, stolen.to_string()).unwrap();
    kubectl(&admin, &["replace", "-f", stolen_file.to_str().unwrap()]);
    let lost = second.wait_after(took, "is now held by `intruder`");
    put(&env, "/hcp-dr-test/k8s/while-lost").await;
    let again = second.wait_after(lost, "took Lease hcp-dr/hcp-dr-stream.clusters.demo");
    let written_after = second.log().iter().skip(lost + 1).position(|l| l.contains("segment ") && l.contains("written")).map(|i| i + lost + 1);
    assert!(written_after.is_none_or(|at| at > again), "a segment written without the Lease:\n{}", second.log().join("\n"));
    second.wait_after(again, "segment ");

    // relisting: no longer selected, demo stops (open segment written, Lease released); selected again, it starts again
    kubectl(&admin, &["label", "hostedcluster", "demo", "-n", "clusters", "backup-"]);
    let gone = second.wait_after(again, "clusters/demo: no longer a HostedCluster this stream owns");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !holder(&admin).is_empty() {
        assert!(std::time::Instant::now() < deadline, "the Lease was not released: {}", holder(&admin));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(demo_value(&second.get("/metrics").1, "hcp_dr_stream_lease_held"), None, "a cluster not owned has no series");
    kubectl(&admin, &["label", "hostedcluster", "demo", "-n", "clusters", "backup=yes"]);
    let back = second.wait_after(gone, "clusters/demo: a new HostedCluster to stream");
    second.wait_after(back, "took Lease hcp-dr/hcp-dr-stream.clusters.demo");
    let last = put(&env, "/hcp-dr-test/k8s/last").await;
    second.wait_after(back, "segment ");
    let scraped = second.get("/metrics").1;
    let (status, report, log) = second.term();
    assert!(status.success(), "{report:#}\n{}", log.join("\n"));
    let runs = report["clusters"].as_array().unwrap();
    assert!(runs.iter().any(|r| r["lease_lost"].as_str().is_some_and(|l| l.contains("intruder") && l.contains("stopped writing clusters/demo at once"))), "{report:#}");
    assert!(runs.iter().all(|r| r["error"].is_null()), "{report:#}");
    assert!(report["lease_holder"].as_str().is_some_and(|h| h.starts_with(&format!("{pod_mine}-"))), "{report:#}");
    let durable = runs.iter().filter_map(|r| r["last_durable_revision"].as_i64()).max().unwrap();
    assert!(durable >= last && last > after_kill, "{report:#}");

    // one chain, written by three runs of two streams, contiguous
    let verified = hcp_dr(&["stream", "verify", "--hosted-cluster", "clusters/demo", "--from", &store_arg, "-o", "json"]);
    assert!(verified.status.success(), "{}", text(&verified));
    let verified: Value = serde_json::from_slice(&verified.stdout).unwrap();
    assert_eq!(verified["chains"].as_array().unwrap().len(), 1, "{verified:#}");
    assert!(verified["chains"][0]["good_through"].as_i64().unwrap() >= last, "{verified:#}");

    // the alerts, on series named and labelled as scraped
    let Some(_) = promtool() else { return };
    let out = hcp_dr(&["schedule", "render", "--schedule", "0 */6 * * *", "--to", "s3://bucket/hcp", "--continuous", "--monitoring", "--pushgateway", "http://pg:9091", "--runbook-base", RUNBOOKS, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let objects: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let rule = objects.iter().find(|o| o["kind"] == "PrometheusRule").unwrap();
    let group = rule["spec"]["groups"].as_array().unwrap().iter().find(|g| g["name"] == "hcp-dr-stream").expect("the stream's group").clone();
    std::fs::write(dir.join("stream-rules.yml"), json!({"groups": [group]}).to_string()).unwrap();
    let said = promtool_ok(&["check", "rules", "stream-rules.yml"], dir, None);
    assert!(said.contains(&format!("SUCCESS: {} rules found", hcp_dr::ops::monitoring::STREAM_ALERTS.len())), "{said}");
    let (lag, breaks) = (demo_series(&scraped, "hcp_dr_stream_lag_seconds"), demo_series(&scraped, "hcp_dr_stream_chain_breaks_total"));
    let expect = |alert: &str, value: &str| {
        let rule = group["rules"].as_array().unwrap().iter().find(|r| r["alert"] == alert).unwrap();
        let mut labels = rule["labels"].clone();
        labels["namespace"] = json!("clusters");
        labels["hosted_cluster"] = json!("demo");
        let mut annotations = rule["annotations"].clone();
        for (_, v) in annotations.as_object_mut().unwrap().iter_mut() {
            *v = json!(v.as_str().unwrap().replace("{{ $labels.namespace }}", "clusters").replace("{{ $labels.hosted_cluster }}", "demo").replace("{{ $value }}", value));
        }
        json!([{"exp_labels": labels, "exp_annotations": annotations}])
    };
    let case = |at: &str, alert: &str, alerts: Value| json!({"eval_time": at, "alertname": alert, "exp_alerts": alerts});
    let tests = json!({
        "rule_files": ["stream-rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            // a few seconds of lag for 10 minutes, then 120 s and more; a break at 30 minutes
            "input_series": [
                {"series": lag, "values": "3x10 120+60x30"},
                {"series": breaks, "values": "0x30 1x30"},
            ],
            "alert_rule_test": [
                case("10m", "HcpDrStreamLagging", json!([])),
                case("14m", "HcpDrStreamLagging", json!([])),
                case("17m", "HcpDrStreamLagging", expect("HcpDrStreamLagging", "480")),
                case("29m", "HcpDrStreamChainBroken", json!([])),
                case("32m", "HcpDrStreamChainBroken", expect("HcpDrStreamChainBroken", "1")),
            ],
        }],
    });
    std::fs::write(dir.join("stream-tests.yml"), tests.to_string()).unwrap();
    promtool_ok(&["test", "rules", "stream-tests.yml"], dir, None);

    // one shard by hand, to S3, with no room to spool (--spool-size 0): the
    // store refusing its segments breaks the cluster's chain at once (the
    // metric says so), the process lives on (/healthz 200) and a new chain
    // starts once the store takes writes again
    let s3_store = format!("s3://{}/stream-k8s", hcp_dr_e2e::sandbox::BUCKET);
    let shard = format!("{mine}/2");
    let spool_dir = env.dir.path().join("spool-by-hand");
    let spool_dir = spool_dir.to_str().unwrap();
    let by_hand: Vec<String> = [
        "stream", "--all", "--shard", &shard, "--lease-namespace", "hcp-dr", "--to", &s3_store, "--s3-endpoint", env.sandbox.s3.https_url(), "--segment-interval", "1s", "--spool-dir", spool_dir, "--spool-size", "0", "-o", "json",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut hand = Pod::start(&env, "laptop", &by_hand, &admin);
    hand.wait_for("started at base revision");
    put(&env, "/hcp-dr-test/k8s/by-hand").await;
    hand.wait_for("segment ");
    assert_eq!(hand.get("/healthz").0, 200);
    let refuse = hcp_dr_e2e::procs::s3_faults::S3Faults {
        share: 1.0,
        kinds: vec![hcp_dr_e2e::procs::s3_faults::S3FaultKind::AccessDenied],
        methods: vec!["PUT".into()],
        user_agent: None,
        path_prefix: None,
        delay_ms: 0,
        seed: None,
    };
    env.sandbox.set_s3_faults(Some(&refuse)).unwrap();
    put(&env, "/hcp-dr-test/k8s/refused").await;
    let refused = hand.wait_after(0, "is full");
    let metrics = hand.get("/metrics").1;
    assert!(metrics.contains("hcp_dr_stream_chain_breaks_total{namespace=\"clusters\",hosted_cluster=\"demo\"} 1\n"), "{metrics}\n{}", hand.log()[refused..].join("\n"));
    assert!(metrics.contains("hcp_dr_stream_spooled_bytes{namespace=\"clusters\",hosted_cluster=\"demo\"} 0\n"), "{metrics}");
    assert!(metrics.contains("hcp_dr_stream_up 1\n"), "{metrics}");
    assert_eq!(hand.get("/healthz").0, 200, "a break is not a dead loop");
    env.sandbox.set_s3_faults(None).unwrap();
    hand.wait_after(refused, "started at base revision");
    let (status, report, _) = hand.term();
    assert_eq!(status.code(), Some(0), "{report:#}");
    let breaks = &report["clusters"][0]["breaks"];
    assert!(breaks[0]["reason"].as_str().is_some_and(|r| r.contains("store unreachable") && r.contains("the spool (0 bytes) is full")), "{report:#}");
    assert!(breaks[0]["next_chain"].is_string(), "{report:#}");

    // bad input: exit 2, saying how to fix it, nothing written
    let out = env.hcp_dr(&["stream", "--all", "--shard-from-hostname", "2", "--to", &store_arg, "--lease-namespace", "hcp-dr"], &[("HOSTNAME", "laptop")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("does not end in -ORDINAL") && text(&out).contains("--shard INDEX/COUNT"), "{}", text(&out));
    let out = env.hcp_dr(&["stream", "--all", "--to", &store_arg], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--lease-namespace"), "{}", text(&out));
    let out = env.hcp_dr(&["stream", "--all", "--shard", "2/2", "--to", &store_arg, "--lease-namespace", "hcp-dr"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("INDEX/COUNT"), "{}", text(&out));
}
