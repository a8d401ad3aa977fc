//! `hcp-dr cluster reconcile -f` on the sandbox: it creates a cluster from
//! the objects `cluster create --render` gives, changes nothing the second
//! time (not a single write), reports drift in a dry-run without touching
//! anything, converges, and `--abort` puts back what it changed.

use std::path::Path;
use std::process::{Command, Output};

use hcp_dr_e2e::sandbox::{BASE_DOMAIN, Sandbox, api_for};
use serde_json::{Value, json};

fn run(kubeconfig: &Path, state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HCP_DR_STATE_DIR", state)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!("exit {:?}\n{}\n{}", out.status.code(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("no JSON ({e}): {}", text(out)))
}

fn actions(report: &Value) -> Vec<(String, String)> {
    report["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (format!("{}/{}", o["kind"].as_str().unwrap(), o["name"].as_str().unwrap()), o["action"].as_str().unwrap().to_string()))
        .collect()
}

async fn live(client: &kube::Client, kind: &str, name: &str) -> Value {
    let api = api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": kind, "metadata": {"namespace": "clusters"}}));
    serde_json::to_value(api.get(name).await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_creates_converges_is_idempotent_and_reports_drift() {
    let tmp = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::up(&tmp.path().join("sb")).await.expect("sandbox");
    let kubeconfig = sandbox.clusters[0].kubeconfig.clone();
    let state = tmp.path().join("state");
    let client = sandbox.clusters[0].api.client().await.unwrap();

    // The desired file: what `cluster create --render` prints, plus a label.
    let pull = tmp.path().join("pull-secret.json");
    std::fs::write(&pull, r#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#).unwrap();
    let out = run(&kubeconfig, &state, &[
        "cluster", "create", "--name", "recon", "--release-image", "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64",
        "--pull-secret", pull.to_str().unwrap(), "--availability", "SingleReplica", "--node-pool-replicas", "1",
        "--base-domain", BASE_DOMAIN, "--render", "-o", "json",
    ]);
    assert!(out.status.success(), "render: {}", text(&out));
    let mut objects: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    for o in &mut objects {
        if o["kind"] == "HostedCluster" {
            o["metadata"]["labels"] = json!({"example.com/team": "platform"});
        }
    }
    let pool = objects.iter().find(|o| o["kind"] == "NodePool").unwrap()["metadata"]["name"].as_str().unwrap().to_string();
    let pool = pool.as_str();
    let desired = tmp.path().join("desired.yaml");
    std::fs::write(&desired, serde_saphyr::to_string_multiple(&objects).unwrap()).unwrap();
    let file = desired.to_str().unwrap();

    // 1. Everything missing: created, then Available and Ready.
    let out = run(&kubeconfig, &state, &["cluster", "reconcile", "-f", file, "--wait", "3m", "-o", "json"]);
    assert!(out.status.success(), "first reconcile: {}", text(&out));
    let first = report(&out);
    assert_eq!(first["changed"], true);
    assert!(actions(&first).iter().all(|(_, a)| a == "create"), "{first:#}");
    assert_eq!(live(&client, "HostedCluster", "recon").await["metadata"]["labels"]["example.com/team"], "platform");

    // 2. Again: no drift, and not one write (resourceVersions unchanged).
    let rv = |v: &Value| v["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let before = (rv(&live(&client, "HostedCluster", "recon").await), rv(&live(&client, "NodePool", pool).await));
    let out = run(&kubeconfig, &state, &["cluster", "reconcile", "-f", file, "--no-wait", "-o", "json"]);
    assert!(out.status.success(), "second reconcile: {}", text(&out));
    let second = report(&out);
    assert_eq!(second["changed"], false, "{second:#}");
    assert!(actions(&second).iter().all(|(_, a)| a == "unchanged"), "{second:#}");
    let after = (rv(&live(&client, "HostedCluster", "recon").await), rv(&live(&client, "NodePool", pool).await));
    assert_eq!(before, after, "an idempotent run wrote to the cluster");

    // 3. Drift made by hand: replicas and the label.
    let nps = api_for(&client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool", "metadata": {"namespace": "clusters"}}));
    let hcs = api_for(&client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    let pp = kube::api::PatchParams::default();
    nps.patch(pool, &pp, &kube::api::Patch::Merge(json!({"spec": {"replicas": 2}}))).await.unwrap();
    hcs.patch("recon", &pp, &kube::api::Patch::Merge(json!({"metadata": {"labels": {"example.com/team": "someone-else"}}}))).await.unwrap();

    // A dry-run names each drifted field and changes nothing.
    let out = run(&kubeconfig, &state, &["cluster", "reconcile", "-f", file, "--dry-run", "-o", "json"]);
    assert!(out.status.success(), "dry-run: {}", text(&out));
    let dry = report(&out);
    let drift: Vec<(String, Value, Value)> = dry["objects"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|o| o["drift"].as_array().unwrap().iter().map(|d| (d["path"].as_str().unwrap().to_string(), d["live"].clone(), d["desired"].clone())))
        .collect();
    assert_eq!(
        drift,
        vec![
            ("/metadata/labels/example.com~1team".to_string(), json!("someone-else"), json!("platform")),
            ("/spec/replicas".to_string(), json!(2), json!(1)),
        ],
        "{dry:#}"
    );
    assert_eq!(live(&client, "NodePool", pool).await["spec"]["replicas"], 2, "the dry-run changed the NodePool");

    // Converge.
    let out = run(&kubeconfig, &state, &["cluster", "reconcile", "-f", file, "--wait", "3m", "-o", "json"]);
    assert!(out.status.success(), "converge: {}", text(&out));
    let converged = report(&out);
    let journal = converged["journal"].as_str().unwrap().to_string();
    assert_eq!(live(&client, "NodePool", pool).await["spec"]["replicas"], 1);
    assert_eq!(live(&client, "HostedCluster", "recon").await["metadata"]["labels"]["example.com/team"], "platform");
    // the wait ended on a Ready about the spec as changed, not the one before
    let np = live(&client, "NodePool", pool).await;
    let ready = np["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
    assert_eq!(ready["observedGeneration"], np["metadata"]["generation"], "{np:#}");
    assert_eq!(ready["status"], "True", "{np:#}");
    let out = run(&kubeconfig, &state, &["cluster", "reconcile", "-f", file, "--no-wait", "-o", "json"]);
    assert_eq!(report(&out)["changed"], false, "{}", text(&out));

    // --abort undoes a stopped run only; a finished one is refused, loudly.
    let out = run(&kubeconfig, &state, &["cluster", "reconcile", "--abort", &journal, "-o", "json"]);
    assert_eq!(out.status.code(), Some(2), "abort of a finished run: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("that run finished"), "{}", text(&out));
    assert_eq!(live(&client, "NodePool", pool).await["spec"]["replicas"], 1);

    // Bad input: a NodePool of another cluster, exit 2, nothing done.
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, std::fs::read_to_string(&desired).unwrap().replace("clusterName: recon", "clusterName: other")).unwrap();
    let out = run(&kubeconfig, &state, &["cluster", "reconcile", "-f", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.clusterName is other"), "{}", text(&out));
    // The pull secret's value never shows.
    for o in [&first, &second, &dry, &converged] {
        assert!(!o.to_string().contains("eDp5"), "a secret value in the report");
    }
}
