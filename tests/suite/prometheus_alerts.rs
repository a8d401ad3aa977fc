//! The rendered alerts on a real Prometheus (issue 40): Debian's
//! Prometheus and Pushgateway on loopback, Prometheus loading the rules
//! `schedule render --monitoring` writes for a schedule of every minute
//! with `--stale-after 1` (stale after 60 s; the per-cluster alerts hold
//! at most 60 s before they fire) and scraping the Pushgateway with
//! `honor_labels: true`, as docs/operations.md says to. On the sandbox,
//! `backup --all -l backup=yes --pushgateway` runs in rounds as the
//! CronJob would: demo is backed up throughout, alpha's backups start
//! failing, beta is never selected. The stale, failing and unprotected
//! alerts fire for alpha and beta (none for demo) through Prometheus' API,
//! then resolve once alpha is repaired, beta labelled and both backed up.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hcp_dr_e2e::procs::{ManagedChild, find_program, free_ports};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PostParams};
use serde_json::{Value, json};
use support::*;

const RUNBOOKS: &str = "https://git.example.com/platform/hcp-dr/blob/main/docs/runbooks";

/// How often a round of `backup --all` starts: well within the 60 s stale
/// threshold, so demo's newest good backup never gets that old.
const ROUND_EVERY: Duration = Duration::from_secs(20);

/// `prometheus` and `prometheus-pushgateway`, or None when one is not
/// installed (CI installs both: there a missing one fails).
fn programs() -> Option<(PathBuf, PathBuf)> {
    const INSTALL: &str = "e2e/setup (apt-get install prometheus prometheus-pushgateway)";
    match (find_program("prometheus", INSTALL), find_program("prometheus-pushgateway", INSTALL)) {
        (Ok(prometheus), Ok(pushgateway)) => Some((prometheus, pushgateway)),
        (Err(e), _) | (_, Err(e)) => {
            assert!(std::env::var_os("CI").is_none(), "{e}");
            println!("skipped: {e}");
            None
        }
    }
}

/// `GET url`: the status and the body.
async fn get(url: &str) -> Result<(u16, String), String> {
    use http_body_util::{BodyExt, Empty};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let exchange = async {
        let response = client.get(uri).await.map_err(|e| format!("GET {url}: {e}"))?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(|e| format!("GET {url}: reading the answer: {e}"))?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.map_err(|_| format!("GET {url}: no answer within 10s"))?
}

/// `text` for a URL's query string.
fn escaped(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Prometheus and the Pushgateway it scrapes, on loopback ports, with
/// their data in `dir`; both killed on drop (their logs printed if the
/// test failed).
struct Monitoring {
    prometheus: ManagedChild,
    pushgateway: ManagedChild,
    prometheus_url: String,
    pushgateway_url: String,
}

impl Monitoring {
    /// Start both with `rules` (what goes under `groups:` of a rule file)
    /// and wait until they answer `/-/ready`.
    async fn start(programs: &(PathBuf, PathBuf), dir: &Path, rules: &Value) -> Monitoring {
        std::fs::create_dir_all(dir).unwrap();
        let ports = free_ports("127.0.0.1".parse().unwrap(), 2).expect("two free ports");
        let (prometheus_at, pushgateway_at) = (format!("127.0.0.1:{}", ports[0]), format!("127.0.0.1:{}", ports[1]));
        std::fs::write(dir.join("rules.yml"), json!({"groups": rules}).to_string()).unwrap();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": "pushgateway", "honor_labels": true, "static_configs": [{"targets": [pushgateway_at]}]}],
        });
        std::fs::write(dir.join("prometheus.yml"), config.to_string()).unwrap();
        let mut cmd = Command::new(&programs.1);
        // Debian's build persists to /var/lib/prometheus by default: one
        // file shared by every run would bring back another run's groups
        cmd.arg(format!("--web.listen-address={pushgateway_at}")).arg(format!("--persistence.file={}", dir.join("pushgateway.data").display()));
        let pushgateway = ManagedChild::spawn(cmd, "prometheus-pushgateway", &dir.join("pushgateway.log")).expect("start the Pushgateway");
        let mut cmd = Command::new(&programs.0);
        cmd.arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={prometheus_at}"));
        let prometheus = ManagedChild::spawn(cmd, "prometheus", &dir.join("prometheus.log")).expect("start Prometheus");
        let monitoring = Monitoring { prometheus, pushgateway, prometheus_url: format!("http://{prometheus_at}"), pushgateway_url: format!("http://{pushgateway_at}") };
        for (child, url) in [(&monitoring.pushgateway, &monitoring.pushgateway_url), (&monitoring.prometheus, &monitoring.prometheus_url)] {
            let start = Instant::now();
            loop {
                child.check_running().expect("running");
                match get(&format!("{url}/-/ready")).await {
                    Ok((200, _)) => break,
                    said => assert!(start.elapsed() < Duration::from_secs(60), "{} not ready at {url} within 60s: {said:?}", child.name()),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        monitoring
    }

    /// The `data` of a Prometheus API answer.
    async fn api(&self, path: &str) -> Value {
        self.prometheus.check_running().expect("Prometheus running");
        let url = format!("{}{path}", self.prometheus_url);
        let (status, body) = get(&url).await.unwrap_or_else(|e| panic!("{e}"));
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: HTTP {status}, no JSON ({e}): {body}"));
        assert!(status == 200 && answer["status"] == "success", "GET {url}: HTTP {status}: {body}");
        answer["data"].clone()
    }

    /// The series of an instant query, with their labels and value.
    async fn query(&self, promql: &str) -> Vec<Value> {
        self.api(&format!("/api/v1/query?query={}", escaped(promql))).await["result"].as_array().cloned().unwrap_or_default()
    }

    /// The alerts Prometheus holds pending or firing.
    async fn alerts(&self) -> Vec<Alert> {
        let data = self.api("/api/v1/alerts").await;
        let mut alerts: Vec<Alert> = data["alerts"]
            .as_array()
            .unwrap_or_else(|| panic!("no alerts list: {data}"))
            .iter()
            .map(|a| Alert {
                name: a["labels"]["alertname"].as_str().unwrap_or_default().to_string(),
                cluster: a["labels"]["hosted_cluster"].as_str().unwrap_or("-").to_string(),
                state: a["state"].as_str().unwrap_or_default().to_string(),
                whole: a.clone(),
            })
            .collect();
        // no drill runs here: HcpDrDrillOverdue is pending for every
        // backed-up cluster and holds an hour before it fires (its firing is
        // tested with promtool, tests/suite/monitoring.rs)
        assert!(!alerts.iter().any(|a| a.name == "HcpDrDrillOverdue" && a.state == "firing"), "HcpDrDrillOverdue fired within the test: {data}");
        alerts.retain(|a| a.name != "HcpDrDrillOverdue");
        alerts.sort_by(|a, b| (&a.name, &a.cluster).cmp(&(&b.name, &b.cluster)));
        alerts
    }
}

/// One alert of `/api/v1/alerts`.
#[derive(Debug, Clone)]
struct Alert {
    name: String,
    /// Its `hosted_cluster` label, `-` for none.
    cluster: String,
    /// pending or firing.
    state: String,
    whole: Value,
}

fn listed(alerts: &[Alert]) -> String {
    if alerts.is_empty() {
        return "none".into();
    }
    alerts.iter().map(|a| format!("{}{{{}}} {}", a.name, a.cluster, a.state)).collect::<Vec<_>>().join(", ")
}

/// The backup CronJob's rounds: `backup --all -l backup=yes --pushgateway`,
/// one every [`ROUND_EVERY`].
struct Rounds<'a> {
    env: &'a Env,
    pushgateway: String,
    started: Instant,
    last: Option<Instant>,
    /// What each cluster's backup must do (`clusters/<name>`, succeeds):
    /// exactly these are selected.
    expect: Vec<(&'static str, bool)>,
    /// Failed backups so far, by cluster name (every cluster backed up).
    failed: BTreeMap<String, f64>,
}

impl Rounds<'_> {
    /// Run a round if one is due; check each cluster's result and that
    /// every push reached the Pushgateway.
    fn tick(&mut self) {
        if self.last.is_some_and(|at| at.elapsed() < ROUND_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        let store = self.env.local_store();
        let args = [
            "backup", "--all", "-n", "clusters", "-l", "backup=yes", "--to", store.to_str().unwrap(), "--pushgateway", &self.pushgateway, "-o", "json",
        ];
        let out = self.env.hcp_dr(&args, &[]);
        let report = json_report(&out);
        let all_succeed = self.expect.iter().all(|(_, ok)| *ok);
        assert_eq!(out.status.code(), Some(if all_succeed { 0 } else { 1 }), "{}", text(&out));
        let results: Vec<(&str, bool)> = report["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["hosted_cluster"].as_str().unwrap(), c["succeeded"] == true))
            .collect();
        assert_eq!(results, self.expect, "{report:#}");
        for (cluster, ok) in &results {
            *self.failed.entry(cluster.trim_start_matches("clusters/").to_string()).or_default() += if *ok { 0.0 } else { 1.0 };
        }
        let said = text(&out);
        let trouble = ["could not push", "earlier values could not be read"];
        assert!(!trouble.iter().any(|t| said.contains(t)), "a push to the Pushgateway failed:\n{said}");
        println!("[{:>4}s] backup --all: {results:?}", self.started.elapsed().as_secs());
    }
}

/// Run rounds and read Prometheus' alerts until `done` holds for them;
/// fail after `within`, with the last alerts seen.
async fn until(monitoring: &Monitoring, rounds: &mut Rounds<'_>, within: Duration, what: &str, done: impl Fn(&[Alert]) -> bool) -> Vec<Alert> {
    let start = Instant::now();
    let mut seen = String::new();
    loop {
        rounds.tick();
        let alerts = monitoring.alerts().await;
        let now = listed(&alerts);
        if now != seen {
            println!("[{:>4}s] alerts: {now}", rounds.started.elapsed().as_secs());
            seen = now;
        }
        if done(&alerts) {
            return alerts;
        }
        assert!(start.elapsed() < within, "{what}: not seen within {within:?}; Prometheus' alerts: {seen}\n{alerts:#?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_failing_and_unprotected_alerts_fire_and_resolve_on_prometheus() {
    let Some(programs) = programs() else { return };
    let env = env("SingleReplica").await;
    add_clusters(&env, &["alpha", "beta"]).await;
    let hcs = hc_api(&env.mgmt, "clusters");
    for name in ["demo", "alpha"] {
        hcs.patch(name, &Default::default(), &Patch::Merge(json!({"metadata": {"labels": {"backup": "yes"}}}))).await.unwrap();
    }

    // the rules of a CronJob that runs every minute, stale after one interval
    let out = env.hcp_dr(
        &[
            "schedule", "render", "--schedule", "* * * * *", "--to", "s3://bucket/hcp", "--pushgateway", "http://pushgateway.monitoring.svc:9091", "--monitoring",
            "--runbook-base", RUNBOOKS, "--stale-after", "1", "-o", "json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let objects = json_report(&out);
    let rule = objects.as_array().unwrap().iter().find(|o| o["kind"] == "PrometheusRule").expect("a PrometheusRule").clone();
    let monitoring = Monitoring::start(&programs, &env.dir.path().join("prometheus"), &rule["spec"]["groups"]).await;
    let loaded: Vec<String> = monitoring.api("/api/v1/rules").await["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(loaded, hcp_dr::ops::monitoring::ALERTS, "the rules Prometheus loaded");

    let mut rounds = Rounds {
        env: &env,
        pushgateway: monitoring.pushgateway_url.clone(),
        started: Instant::now(),
        last: None,
        expect: vec![("clusters/alpha", true), ("clusters/demo", true)],
        failed: BTreeMap::new(),
    };
    rounds.tick();
    // Prometheus has the cluster's own labels (honor_labels), not the Pushgateway's
    let start = Instant::now();
    loop {
        let mut backed_up: Vec<(String, String)> = monitoring
            .query("hcp_dr_backup_last_success")
            .await
            .iter()
            .map(|s| (s["metric"]["hosted_cluster"].as_str().unwrap_or("-").to_string(), s["value"][1].as_str().unwrap_or("-").to_string()))
            .collect();
        backed_up.sort();
        let mut discovered: Vec<(String, String)> = monitoring
            .query("hcp_dr_hosted_cluster_discovered")
            .await
            .iter()
            .map(|s| (s["metric"]["hosted_cluster"].as_str().unwrap_or("-").to_string(), s["metric"]["selected"].as_str().unwrap_or("-").to_string()))
            .collect();
        discovered.sort();
        let pairs = |list: &[(&str, &str)]| list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        if backed_up == pairs(&[("alpha", "1"), ("demo", "1")]) && discovered == pairs(&[("alpha", "true"), ("beta", "false"), ("demo", "true")]) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "Prometheus did not scrape what the backups pushed within 60s: last success {backed_up:?}, discovered {discovered:?}; the Pushgateway has:\n{}",
            get(&format!("{}/metrics", monitoring.pushgateway_url)).await.map(|(_, b)| b).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // break alpha as tests/suite/fleet.rs does: paused by its owner (the
    // operator leaves it alone), its etcd client TLS gone
    hcs.patch("alpha", &Default::default(), &Patch::Merge(json!({"spec": {"pausedUntil": "true"}}))).await.unwrap();
    let start = Instant::now();
    loop {
        let hc = serde_json::to_value(hcs.get("alpha").await.unwrap()).unwrap();
        if hc["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "ReconciliationActive" && c["status"] == "False")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the operator never acknowledged alpha's pause");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secrets = Api::<Secret>::namespaced(env.mgmt.clone(), "clusters-alpha");
    let mut tls = secrets.get("etcd-client-tls").await.unwrap();
    secrets.delete("etcd-client-tls", &Default::default()).await.unwrap();
    rounds.expect = vec![("clusters/alpha", false), ("clusters/demo", true)];
    rounds.last = None;

    // alpha: failing, then stale; beta: unprotected; demo: nothing
    let firing = [("HcpDrBackupFailing", "alpha"), ("HcpDrBackupStale", "alpha"), ("HcpDrClusterUnprotected", "beta")];
    let alerts = until(&monitoring, &mut rounds, Duration::from_secs(300), "alpha failing and stale, beta unprotected, nothing else", |alerts| {
        alerts.len() == firing.len() && alerts.iter().zip(firing).all(|(a, (name, cluster))| a.name == name && a.cluster == cluster && a.state == "firing")
    })
    .await;
    for alert in &alerts {
        let labels = &alert.whole["labels"];
        assert_eq!(labels["namespace"], "clusters", "{alert:#?}");
        let summary = alert.whole["annotations"]["summary"].as_str().unwrap();
        assert!(summary.contains(&format!("clusters/{}", alert.cluster)), "the summary names no cluster: {alert:#?}");
        let runbook = alert.whole["annotations"]["runbook_url"].as_str().unwrap();
        assert_eq!(runbook, format!("{RUNBOOKS}/backup.md#{}", alert.name.to_lowercase()));
    }
    let beta = &alerts[2].whole;
    assert_eq!(beta["labels"]["selected"], "false", "{beta:#}");
    assert!(beta["annotations"]["description"].as_str().unwrap().contains("selected by its selector: false"), "{beta:#}");
    // each push read the group's earlier values back from the Pushgateway:
    // alpha's failures are all counted
    let start = Instant::now();
    loop {
        let counted: BTreeMap<String, f64> = monitoring
            .query("hcp_dr_backup_failures_total")
            .await
            .iter()
            .map(|s| (s["metric"]["hosted_cluster"].as_str().unwrap_or("-").to_string(), s["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(-1.0)))
            .collect();
        if counted == rounds.failed {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "hcp_dr_backup_failures_total in Prometheus: {counted:?}, failed backups: {:?}", rounds.failed);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(rounds.failed["alpha"] >= 2.0, "{:?}", rounds.failed);

    // repair alpha, select beta: the next good backups resolve every alert
    tls.metadata = kube::api::ObjectMeta {
        name: tls.metadata.name.take(),
        namespace: tls.metadata.namespace.take(),
        labels: tls.metadata.labels.take(),
        annotations: tls.metadata.annotations.take(),
        owner_references: tls.metadata.owner_references.take(),
        ..Default::default()
    };
    secrets.create(&PostParams::default(), &tls).await.unwrap();
    hcs.patch("alpha", &Default::default(), &Patch::Merge(json!({"spec": {"pausedUntil": null}}))).await.unwrap();
    hcs.patch("beta", &Default::default(), &Patch::Merge(json!({"metadata": {"labels": {"backup": "yes"}}}))).await.unwrap();
    rounds.expect = vec![("clusters/alpha", true), ("clusters/beta", true), ("clusters/demo", true)];
    rounds.last = None;
    until(&monitoring, &mut rounds, Duration::from_secs(180), "every alert resolved after good backups", <[Alert]>::is_empty).await;

    // and every rule evaluated without an error throughout
    let rules = monitoring.api("/api/v1/rules").await;
    for rule in rules["groups"][0]["rules"].as_array().unwrap() {
        assert_eq!(rule["health"], "ok", "{rule:#}");
    }
    env.assert_in_service("after the rounds").await;
}
