//! `hcp-dr fence` and `hcp-dr fence --release` on one management cluster
//! (the two-cluster path is the disaster scenario in tests/suite/disaster.rs):
//! bad input and the live copy are refused before anything is journaled;
//! a fence stopped half-way is resumed from its journal and then holds
//! (nothing of the copy runs, its Routes are gone, backup and `cluster
//! resume` refuse it); a release is refused while the store names another
//! cluster, and with --claim-store puts everything back and takes the
//! store fence; `cluster destroy` of a fenced copy keeps its far pause and
//! leaves the store alone.

use crate::support;

use std::time::Duration;

use hcp_dr::archive::ManagementCluster;
use hcp_dr::archive::fence::{self, Fence};
use hcp_dr_e2e::sandbox::{api_for, wait_available};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::*;

const ELSEWHERE: &str = "https://api.mgmt-b.example.com:6443";

async fn hosted_cluster(env: &Env) -> Value {
    let hcs = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    serde_json::to_value(hcs.get("demo").await.expect("demo")).unwrap()
}

/// `(kind name, replicas)` of every workload of the HCP namespace.
async fn replicas(env: &Env) -> Vec<(String, i32)> {
    let ns = env.hcp_ns();
    let mut out: Vec<(String, i32)> = Api::<StatefulSet>::namespaced(env.mgmt.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| (format!("StatefulSet {}", s.metadata.name.unwrap()), s.spec.replicas.unwrap_or(1)))
        .collect();
    out.extend(
        Api::<Deployment>::namespaced(env.mgmt.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|d| (format!("Deployment {}", d.metadata.name.unwrap()), d.spec.replicas.unwrap_or(1))),
    );
    out.sort();
    out
}

async fn routes(env: &Env) -> Vec<String> {
    let routes = api_for(&env.mgmt, &json!({"apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"namespace": env.hcp_ns()}}));
    let mut names: Vec<String> = routes.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|r| r.metadata.name).collect();
    names.sort();
    names
}

fn journals(env: &Env) -> usize {
    std::fs::read_dir(env.dir.path().join("state/journals")).map(|d| d.count()).unwrap_or(0)
}

async fn mgmt_a(env: &Env) -> ManagementCluster {
    let ns: Api<Namespace> = Api::all(env.mgmt.clone());
    ManagementCluster {
        server: env.sandbox.clusters[0].api.url().trim_end_matches('/').to_string(),
        kube_system_uid: ns.get("kube-system").await.unwrap().metadata.uid,
    }
}

fn store_fence(runs_on: ManagementCluster) -> Fence {
    Fence {
        format_version: fence::FENCE_VERSION,
        namespace: "clusters".into(),
        hosted_cluster: "demo".into(),
        runs_on,
        hosted_cluster_uid: None,
        backup_id: "20261124T000000Z-abcdef".into(),
        backup_taken_on: None,
        by: "restore".into(),
        at: chrono::Utc::now(),
        tool_version: "test".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fence_holds_resumes_and_is_released_only_for_the_copy_to_keep() {
    let env = env("SingleReplica").await;
    let store_dir = env.local_store();
    let store_url = store_dir.display().to_string();
    let store = hcp_dr::store::open(&store_url, Default::default()).await.unwrap();
    let before = replicas(&env).await;
    let routes_before = routes(&env).await;
    assert!(!routes_before.is_empty(), "the operator published Routes");

    // Bad input and the live copy: exit 2, nothing journaled or changed.
    let here = mgmt_a(&env).await;
    fence::write(store.as_ref(), &store_fence(here.clone())).await.unwrap();
    for (args, says) in [
        (vec!["fence", "--hosted-cluster", "nope", "--runs-on", ELSEWHERE], "HostedCluster clusters/nope not found"),
        (vec!["fence", "--hosted-cluster", "demo"], "say where the cluster runs now"),
        (vec!["fence", "--hosted-cluster", "demo", "--runs-on", "mgmt-b"], "--runs-on `mgmt-b`"),
        (vec!["fence", "--hosted-cluster", "demo", "--store", store_url.as_str()], "the store fence says the cluster runs HERE"),
        (vec!["fence", "--hosted-cluster", "demo", "--release"], "is not fenced"),
        (vec!["fence", "--hosted-cluster", "demo", "--release", "--claim-store"], "--claim-store rewrites the store fence"),
        (vec!["fence", "--hosted-cluster", "Bad_Name", "--runs-on", ELSEWHERE], "hosted cluster"),
    ] {
        let out = env.hcp_dr(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    let out = env.hcp_dr(&["fence", "--hosted-cluster", "demo", "--runs-on", ELSEWHERE, "--dry-run"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("scale every Deployment and StatefulSet in clusters-demo to 0"), "the plan: {}", text(&out));
    assert_eq!(journals(&env), 0, "nothing journaled");
    assert_eq!(replicas(&env).await, before, "nothing scaled");
    assert!(hcp_dr::hosted::HostedCluster(hosted_cluster(&env).await).fenced().is_none());

    // The store says the cluster runs elsewhere; the fence stops after
    // `pause` (as if killed there), then its journal finishes it.
    let elsewhere = ManagementCluster { server: ELSEWHERE.into(), kube_system_uid: Some("uid-of-mgmt-b".into()) };
    fence::write(store.as_ref(), &store_fence(elsewhere.clone())).await.unwrap();
    let out = env.hcp_dr(&["fence", "--hosted-cluster", "demo", "--store", &store_url, "-o", "json"], &[("HCP_DR_TEST_FAIL_AFTER", "pause")]);
    assert_eq!(out.status.code(), Some(3), "stopped with changes in place: needs attention: {}", text(&out));
    let stopped = json_report(&out);
    let journal = stopped["journal"].as_str().expect("journal").to_string();
    let hc = hosted_cluster(&env).await;
    assert_eq!(hcp_dr::hosted::HostedCluster(hc.clone()).fenced(), Some(ELSEWHERE), "marked before anything stopped");
    let far = hc["spec"]["pausedUntil"].as_str().expect("paused").to_string();
    let deadline = chrono::DateTime::parse_from_rfc3339(&far).expect("an RFC3339 deadline");
    assert!(deadline > chrono::Utc::now() + chrono::Duration::days(5 * 365), "a far deadline: {far}");
    assert_eq!(replicas(&env).await, before, "interrupted before scale-to-zero");
    let out = env.hcp_dr(&["fence", "--resume", &journal], &[]);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(&format!("is fenced on {}", here.describe())) && report.contains(ELSEWHERE), "{report}");
    let far = hosted_cluster(&env).await["spec"]["pausedUntil"].as_str().expect("paused").to_string();

    // It holds: nothing of the copy runs, no Route, the state to put back is on the object.
    let now = replicas(&env).await;
    assert!(now.iter().all(|(_, r)| *r == 0), "every workload at 0: {now:?}");
    let pods: Api<Pod> = Api::namespaced(env.mgmt.clone(), &env.hcp_ns());
    let left: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.owner_references.as_deref().unwrap_or_default().iter().any(|o| o.kind != "Job"))
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(left.is_empty(), "no pod of the copy left: {left:?}");
    assert!(routes(&env).await.is_empty(), "Routes removed");
    let hc = hosted_cluster(&env).await;
    let state = hcp_dr::stages::fence::FenceState::of(&hc).unwrap().expect("fence state");
    let recorded: Vec<(String, i32)> = {
        let mut r: Vec<(String, i32)> = state.replicas.iter().map(|(k, n, r)| (format!("{k} {n}"), *r)).collect();
        r.sort();
        r
    };
    assert_eq!(recorded, before, "the replicas before the fence are recorded on the HostedCluster");

    // Refused while fenced: cluster resume (exit 2), backup (exit 1).
    let out = env.hcp_dr(&["cluster", "resume", "demo"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("is fenced on this management cluster"), "{}", text(&out));
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", &store_url], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("is fenced on this management cluster"), "{}", text(&out));
    // a short pause does not shorten the fence's
    let out = env.hcp_dr(&["cluster", "pause", "demo", "--for", "1m"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(hosted_cluster(&env).await["spec"]["pausedUntil"], json!(far), "the far pause is kept");

    // Release: refused while the store names another cluster...
    let out = env.hcp_dr(&["fence", "--release", "--hosted-cluster", "demo", "--store", &store_url], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("the store fence says the cluster runs elsewhere") && text(&out).contains("--claim-store"), "{}", text(&out));
    // ...and with --claim-store everything comes back and the store names this cluster.
    let out = env.hcp_dr(&["fence", "--release", "--claim-store", "--hosted-cluster", "demo", "--store", &store_url], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(replicas(&env).await, before, "scaled back as recorded");
    assert!(env.paused_until().await.iter().all(Value::is_null), "pauses put back");
    let hc = hosted_cluster(&env).await;
    assert!(hcp_dr::hosted::HostedCluster(hc.clone()).fenced().is_none(), "unmarked");
    assert!(hcp_dr::stages::fence::FenceState::of(&hc).unwrap().is_none());
    let claimed = fence::read(store.as_ref(), "clusters", "demo").await.unwrap().expect("store fence");
    assert!(claimed.runs_on.same_cluster(&here), "the store fence names this cluster: {claimed:?}");
    assert_eq!(claimed.backup_id, "20261124T000000Z-abcdef", "the backup it came from is kept");
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(90)).await.expect("Available again");
    let start = std::time::Instant::now();
    while routes(&env).await != routes_before {
        assert!(start.elapsed() < Duration::from_secs(60), "the operator recreates the Routes: {:?}", routes(&env).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    backup_to_local(&env);

    // Fenced again (no store: --runs-on), then destroyed: the far pause
    // holds during the teardown and the store is not touched.
    let out = env.hcp_dr(&["fence", "--hosted-cluster", "demo", "--runs-on", ELSEWHERE], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let far = hosted_cluster(&env).await["spec"]["pausedUntil"].as_str().expect("paused").to_string();
    let listed = store.list("clusters/demo/").await.unwrap();
    let journal = env.dir.path().join("destroy.jsonl");
    let journal = journal.to_str().unwrap();
    let out = env.hcp_dr(&["cluster", "destroy", "demo", "--journal", journal], &[("HCP_DR_TEST_FAIL_AFTER", "pause")]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(hosted_cluster(&env).await["spec"]["pausedUntil"], json!(far), "the destroy's pause kept the fence's far deadline");
    let out = env.hcp_dr(&["cluster", "destroy", "--resume", journal], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("this was a fenced copy (the cluster runs on {ELSEWHERE})")), "{}", text(&out));
    assert_eq!(store.list("clusters/demo/").await.unwrap().len(), listed.len(), "the store is untouched");
}
