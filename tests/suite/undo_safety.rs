//! An undo can only remove what its own run created, on the cluster it
//! created it on; the next steps hcp-dr prints work exactly as printed; and
//! a run that changed nothing says so (issue 16).

use crate::support;

use std::path::Path;
use std::process::Output;

use hcp_dr_e2e::sandbox::api_for;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use support::*;

fn hosted_clusters(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}))
}

async fn hc_uid(client: &kube::Client) -> Option<String> {
    hosted_clusters(client).get_opt("demo").await.expect("get HC").and_then(|hc| hc.metadata.uid)
}

/// The `hcp-dr …` commands a report prints between backquotes.
fn printed_commands(out: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|c| c.starts_with("hcp-dr "))
        .map(str::to_string)
        .collect()
}

/// Run a printed command verbatim, as an operator would paste it: with the
/// sandbox's environment (HCP_DR_STORE set, as its env file and the CronJob
/// set it) and without KUBECONFIG.
fn run_printed(env: &Env, command: &str, store: &str) -> Output {
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words[0], "hcp-dr", "{command}");
    let mut cmd = env.command(&words[1..], &[("HCP_DR_STORE", store)]);
    cmd.env_remove("KUBECONFIG");
    cmd.output().expect("run the printed command")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abort_refuses_another_cluster_and_deletes_only_what_its_run_created() {
    let env = env("SingleReplica").await;
    let (folder, _) = backup_to_s3(&env);
    let source_uid = hc_uid(&env.mgmt).await.expect("demo on mgmt-a");

    // a restore onto mgmt-b stops after `apply`: its journal names clusters/demo
    let (kubeconfig_a, kubeconfig_b) = (env.sandbox.clusters[0].kubeconfig.clone(), env.sandbox.clusters[1].kubeconfig.clone());
    let (kubeconfig_a, kubeconfig_b) = (kubeconfig_a.to_str().unwrap(), kubeconfig_b.to_str().unwrap());
    let endpoint = env.sandbox.s3.https_url().to_string();
    let out = env.hcp_dr(
        &["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", kubeconfig_b, "--wait", "5m"],
        &[("HCP_DR_TEST_FAIL_AFTER", "apply")],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let commands = printed_commands(&out);
    let abort = commands.iter().find(|c| c.contains("--abort")).unwrap_or_else(|| panic!("no abort command printed:\n{}", text(&out)));
    let resume = commands.iter().find(|c| c.contains("--resume")).unwrap_or_else(|| panic!("no resume command printed:\n{}", text(&out)));
    let journal = abort.split_whitespace().last().unwrap().to_string();
    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    let restored_uid = hc_uid(&b).await.expect("the stop keeps the restored HostedCluster");

    // the data-loss case: the abort pointed at mgmt-a (where demo is healthy) refuses
    for verb in ["--abort", "--resume"] {
        let out = env.hcp_dr(&["restore", verb, &journal, "--kubeconfig", kubeconfig_a], &[]);
        assert_eq!(out.status.code(), Some(2), "{verb} on another cluster: {}", text(&out));
        let said = text(&out);
        assert!(said.contains("refusing to touch another management cluster") && said.contains("Nothing was changed"), "{said}");
    }
    assert_eq!(hc_uid(&env.mgmt).await.as_deref(), Some(source_uid.as_str()), "mgmt-a's demo was touched");
    assert_eq!(hc_uid(&b).await.as_deref(), Some(restored_uid.as_str()), "mgmt-b's restore was touched by a refused abort");

    // a same-named object made since by someone else survives the undo
    let secrets: Api<Secret> = Api::namespaced(b.clone(), "clusters");
    let created = secrets.get("demo-pull-secret").await.expect("the restore created the pull secret");
    secrets.delete("demo-pull-secret", &DeleteParams::default()).await.expect("delete it");
    for _ in 0..100 {
        if secrets.get_opt("demo-pull-secret").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let replacement: Secret = serde_json::from_value(json!({"metadata": {"name": "demo-pull-secret", "namespace": "clusters"}, "stringData": {"note": "made by hand"}})).unwrap();
    let replacement = secrets.create(&PostParams::default(), &replacement).await.expect("recreate it by hand");
    assert_ne!(replacement.metadata.uid, created.metadata.uid);

    // the printed abort, verbatim, with HCP_DR_STORE set and KUBECONFIG unset
    let store = format!("s3://{}/backups", hcp_dr_e2e::sandbox::BUCKET);
    let out = run_printed(&env, abort, &store);
    assert_eq!(out.status.code(), Some(0), "the printed abort failed: {abort}\n{}", text(&out));
    let said = text(&out);
    assert!(said.contains("restore aborted") && !said.contains("FAILED"), "{said}");
    assert!(said.contains("Secret clusters/demo-pull-secret was left alone"), "{said}");
    assert!(hc_uid(&b).await.is_none(), "the abort left the restored HostedCluster");
    let kept = secrets.get("demo-pull-secret").await.expect("the replacement secret was deleted");
    assert_eq!(kept.metadata.uid, replacement.metadata.uid);
    assert_eq!(hc_uid(&env.mgmt).await.as_deref(), Some(source_uid.as_str()), "mgmt-a's demo was touched");
    // the journal says which cluster it changed, and no credentials
    let header: Value = serde_json::from_str(std::fs::read_to_string(&journal).unwrap().lines().next().unwrap()).unwrap();
    let clusters = &header["header"]["clusters"];
    assert_eq!(clusters[0]["role"], "destination", "{header:#}");
    assert!(clusters[0]["kube_system_uid"].as_str().is_some_and(|u| !u.is_empty()), "{header:#}");
    assert_eq!(clusters[0]["kubeconfig"].as_str().map(Path::new), Some(Path::new(kubeconfig_b)));
    let raw = std::fs::read_to_string(&journal).unwrap();
    assert!(!raw.contains("token") && !raw.contains("client-key"), "credentials in the journal");
    // an ended run cannot be resumed into doing more
    let out = run_printed(&env, resume, &store);
    assert!(hc_uid(&b).await.is_none(), "resuming an aborted run restored again: {}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_that_changed_nothing_says_so() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    let store = store.to_str().unwrap();

    // another run holds the lock: refused at `lock`, nothing changed, nothing undone
    let leases = api_for(&env.mgmt, &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"namespace": "clusters"}}));
    let lease: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "hcp-dr-lock-demo", "namespace": "clusters"},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                 "acquireTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                 "renewTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.expect("hold the lock");
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("locked by another run") && said.contains("nothing was changed"), "{said}");
    assert!(!said.contains("undone") && !said.contains("UNDO FAILED"), "{said}");
    let held = leases.get("hcp-dr-lock-demo").await.expect("the other run's lock was removed");
    assert_eq!(serde_json::to_value(&held).unwrap()["spec"]["holderIdentity"], "someone-else");
    leases.delete("hcp-dr-lock-demo", &DeleteParams::default()).await.unwrap();

    // an API server that does not answer: refused before anything is journaled
    let dead = env.dir.path().join("dead.kubeconfig");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    std::fs::write(
        &dead,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: dead\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: dead\n  context: {{cluster: dead, user: u}}\ncurrent-context: dead\n"
        ),
    )
    .unwrap();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", store, "--kubeconfig", dead.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains(&format!("127.0.0.1:{port}")) && !said.contains("UNDO FAILED") && !said.contains("undone"), "{said}");
    assert!(!said.contains("Status {"), "a debug structure was printed: {said}");
    env.assert_in_service("after the refusals").await;
}

/// A backup killed while the cluster is paused and scaled down is put back
/// by `--abort` (run control is the same for every operation): unpaused,
/// scaled back up, its lock released and nothing of it left in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_killed_mid_snapshot_is_undone_by_abort() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    let journal = env.dir.path().join("backup.jsonl");
    let args = ["backup", "--hosted-cluster", "demo", "--to", store.to_str().unwrap(), "--journal", journal.to_str().unwrap()];
    kill_after(&env, &args, &journal, "etcd-snapshot");
    assert!(env.paused_until().await.iter().all(|p| !p.is_null()), "the kill came before the pause");
    assert!(env.writer_replicas().await.iter().all(|(_, r)| *r == 0), "the kill came before the scale-down");

    let out = env.hcp_dr(&["backup", "--abort", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "aborted", "{report:#}");
    env.assert_in_service("after --abort").await;
    assert!(files(&store).iter().all(|f| !f.ends_with(".db") && !f.contains("manifest")), "left in the store: {:?}", files(&store));
    // an aborted run is over: --resume does not take the backup after all
    let out = env.hcp_dr(&["backup", "--resume", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert_eq!(json_report(&out)["outcome"], "aborted", "{}", text(&out));
    env.assert_in_service("after --resume of the aborted run").await;
}

/// Out-of-range values are refused up front (exit 2, the flag and value
/// named), before any cluster, store or journal is touched: no panic.
#[test]
fn huge_durations_are_refused_before_anything_is_contacted() {
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("store");
    let store = store.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["backups", "prune", "--store", store, "--max-age", "9223372036854775807d"],
        &["backups", "prune", "--store", store, "--incomplete-after", "99999999999w"],
        &["backup", "--hosted-cluster", "demo", "--to", store, "--pause-ttl", "30d"],
        &["backup", "--hosted-cluster", "demo", "--to", store, "--pause-ttl", "99999999999999999999s"],
    ];
    for args in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
            .args(*args)
            .env("HCP_DR_STATE_DIR", state.path().join("state"))
            // nothing listens here: a contacted cluster would fail differently
            .env("KUBECONFIG", state.path().join("absent.kubeconfig"))
            .output()
            .unwrap();
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        let (flag, value) = (args[args.len() - 2], args[args.len() - 1]);
        assert!((said.contains(value) || said.contains(flag)) && said.contains("too long") && !said.contains("panicked"), "{args:?}: {said}");
    }
    assert!(!state.path().join("state").exists(), "a journal was written");
    assert!(!state.path().join("store").exists(), "the store was touched");
}

/// A zone id that is not one is refused, naming the flag, before a cluster,
/// a store or Route53 is contacted: on backup, on schedule render (where it
/// would otherwise reach every CronJob run), and `--dns-only` needs
/// `--take-over-dns`.
#[test]
fn bad_dns_flags_are_refused_before_anything_is_contacted() {
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("store");
    let store = store.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["backup", "--hosted-cluster", "demo", "--to", store, "--route53-zone", "not a zone"], "--route53-zone"),
        (&["schedule", "render", "--schedule", "0 * * * *", "--to", "s3://bucket/hcp", "--route53-zone", "not a zone"], "--route53-zone"),
        (&["restore", "--from", "s3://bucket/hcp/clusters/demo/latest", "--dns-only"], "--take-over-dns"),
    ];
    for (args, names) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
            .args(*args)
            .env("HCP_DR_STATE_DIR", state.path().join("state"))
            .env("KUBECONFIG", state.path().join("absent.kubeconfig"))
            .env_remove("HCP_DR_ROUTE53_ZONE")
            .output()
            .unwrap();
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(said.contains(names) && !said.contains("panicked"), "{args:?}: {said}");
    }
    assert!(!state.path().join("state").exists(), "a journal was written");
    assert!(!state.path().join("store").exists(), "the store was touched");
}

/// Issue 41: an apply that failed before the HostedCluster existed left a
/// HostedControlPlane with the finalizer the replay carried and no
/// control-plane operator to clear it. The abort removes such untouched
/// objects' finalizers at once (it used to wait out its timeout), says so,
/// and leaves nothing; the finalizer stays until someone removes it, as on
/// a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abort_of_an_apply_that_failed_before_the_cluster_existed_does_not_wait_on_finalizers() {
    let env = env("SingleReplica").await;
    let (folder, _) = backup_to_s3(&env);
    retire_source(&env).await;
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let endpoint = env.sandbox.s3.https_url().to_string();
    let namespaces = || async { Api::<k8s_openapi::api::core::v1::Namespace>::all(b.clone()).list(&Default::default()).await.unwrap().items.len() };
    let before = namespaces().await;
    let journal = env.dir.path().join("restore.jsonl");
    let args = ["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--wait", "10m", "--journal", journal.to_str().unwrap()];
    kill_after(&env, &args, &journal, "snapshot-url");
    // the destination stops serving Cluster API Clusters: apply creates the
    // HostedControlPlane, then fails on the Cluster, before the HostedCluster
    let crds = api_for(&b, &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition"}));
    crds.delete("clusters.cluster.x-k8s.io", &DeleteParams::default()).await.expect("delete the Cluster CRD");
    for _ in 0..60 {
        if crds.get_opt("clusters.cluster.x-k8s.io").await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let out = env.hcp_dr(&["restore", "--resume", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["stage"], "apply", "{report:#}");
    assert!(hc_uid(&b).await.is_none(), "the HostedCluster was created");
    let hcps = api_for(&b, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane", "metadata": {"namespace": "clusters-demo"}}));
    let hcp = hcps.get("demo").await.expect("the replayed HostedControlPlane");
    assert!(hcp.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == "hypershift.openshift.io/finalizer")), "{:?}", hcp.metadata);

    let out = env.hcp_dr(&["restore", "--abort", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "aborted", "{report:#}");
    let warnings = report["warnings"].as_array().unwrap().iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n");
    assert!(warnings.contains("never acted on the object") && warnings.contains("HostedControlPlane clusters-demo/demo: hypershift.openshift.io/finalizer"), "{warnings}");
    assert!(hcps.get_opt("demo").await.unwrap().is_none(), "the HostedControlPlane is left");
    assert_eq!(namespaces().await, before, "the abort left namespaces");
}
