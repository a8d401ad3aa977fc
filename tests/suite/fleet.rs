//! `hcp-dr backup --all`: every matching hosted cluster, each with its own
//! lock, pause and undo; one broken cluster fails alone.

use crate::support;

use std::time::{Duration, Instant};

use hcp_dr_e2e::sandbox::api_for;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch};
use serde_json::{Value, json};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fleet_backup_reports_the_broken_cluster_and_backs_up_the_others() {
    let env = env("SingleReplica").await;
    add_clusters(&env, &["alpha", "beta"]).await;
    // break beta: paused by its owner (the operator leaves it alone) and its etcd client TLS gone
    let hcs = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    hcs.patch("beta", &Default::default(), &Patch::Merge(json!({"spec": {"pausedUntil": "true"}}))).await.unwrap();
    let start = Instant::now();
    loop {
        let hc = serde_json::to_value(hcs.get("beta").await.unwrap()).unwrap();
        if hc["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "ReconciliationActive" && c["status"] == "False")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the operator never acknowledged the pause");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Api::<Secret>::namespaced(env.mgmt.clone(), "clusters-beta").delete("etcd-client-tls", &Default::default()).await.unwrap();

    let store = env.local_store();
    let out = env.hcp_dr(&["backup", "--all", "-n", "clusters", "--concurrency", "2", "--to", store.to_str().unwrap(), "-o", "json"], &[]);
    assert_eq!(out.status.code(), Some(1), "one failed: {}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["succeeded"], 2, "{report:#}");
    assert_eq!(report["failed"], 1, "{report:#}");
    let by_name = |n: &str| report["clusters"].as_array().unwrap().iter().find(|c| c["hosted_cluster"] == n).cloned().unwrap();
    for ok in ["clusters/alpha", "clusters/demo"] {
        let c = by_name(ok);
        assert_eq!(c["succeeded"], true, "{c:#}");
        let folder = c["result"]["backup"].as_str().unwrap().strip_prefix("file://").unwrap().to_string();
        assert!(std::path::Path::new(&folder).join("manifest.json").exists(), "{ok}: no manifest in {folder}");
    }
    let beta = by_name("clusters/beta");
    assert_eq!(beta["succeeded"], false);
    assert!(beta.to_string().contains("no etcd client TLS material"), "{beta:#}");
    // beta's own pause is untouched; the others are back in service
    let hc = serde_json::to_value(hcs.get("beta").await.unwrap()).unwrap();
    assert_eq!(hc["spec"]["pausedUntil"], "true");
    env.assert_in_service("after the fleet backup").await;
    for name in ["alpha", "demo"] {
        let hc = serde_json::to_value(hcs.get(name).await.unwrap()).unwrap();
        assert!(hc["spec"]["pausedUntil"].is_null(), "{name} still paused");
    }

    // with a selector that takes demo only, and metrics: every HostedCluster
    // found is recorded, selected or not, and the rendered
    // HcpDrClusterUnprotected alert fires for alpha and beta, not demo
    hcs.patch("demo", &Default::default(), &Patch::Merge(json!({"metadata": {"labels": {"backup": "yes"}}}))).await.unwrap();
    let metrics = env.dir.path().join("fleet.prom");
    let out = env.hcp_dr(&["backup", "--all", "-l", "backup=yes", "--to", store.to_str().unwrap(), "--metrics-file", metrics.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let prom = std::fs::read_to_string(&metrics).unwrap();
    for (name, selected) in [("alpha", false), ("beta", false), ("demo", true)] {
        let line = format!("hcp_dr_hosted_cluster_discovered{{namespace=\"clusters\",hosted_cluster=\"{name}\",selected=\"{selected}\"}} 1");
        assert!(prom.lines().any(|l| l == line), "{line} missing:\n{prom}");
    }
    crate::monitoring::unprotected_fires_on_hcp_drs_own_series(&prom);

    // a selector that matches nothing is bad input
    let out = env.hcp_dr(&["backup", "--all", "-l", "team=nobody", "--to", store.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no HostedCluster matches"), "{}", text(&out));
}

/// `backup --all --shard i/K`, K processes at once as the pods of an Indexed
/// Job run: every cluster is backed up exactly once, by the shard its UID
/// falls in, each shard reports what it left to the others, and `backups
/// prune --shard` splits the store's clusters the same way (each once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sharded_fleet_backups_take_each_cluster_exactly_once() {
    let env = env("SingleReplica").await;
    add_clusters(&env, &["alpha", "beta"]).await;
    let store = env.local_store();
    let store = store.to_str().unwrap();
    const K: usize = 3;
    // the pods' commands as `schedule render --shards` writes them, each
    // with its index where Kubernetes puts JOB_COMPLETION_INDEX
    let out = env.hcp_dr(&["schedule", "render", "--schedule", "0 * * * *", "--to", store, "--shards", "3", "--keep-last", "1", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let rendered = json_report(&out);
    let pod = rendered[4]["spec"]["jobTemplate"]["spec"]["template"]["spec"].clone();
    let args_of = |container: &Value, index: usize| -> Vec<String> {
        let mut args: Vec<String> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().replace("$(JOB_COMPLETION_INDEX)", &index.to_string())).collect();
        if !args.iter().any(|a| a == "--output") {
            args.extend(["-o".into(), "json".into()]);
        }
        args
    };
    let children: Vec<_> = (0..K)
        .map(|i| {
            let args = args_of(&pod["initContainers"][0], i);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut cmd = env.command(&args, &[]);
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            cmd.spawn().expect("spawn a shard")
        })
        .collect();
    let mut taken: Vec<String> = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "shard {i}/{K}: {}", text(&out));
        let report = json_report(&out);
        assert_eq!(report["shard"], format!("{i}/{K}"), "{report:#}");
        let here = report["clusters"].as_array().unwrap();
        assert_eq!(here.len() + report["other_shards"].as_u64().unwrap() as usize, 3, "{report:#}");
        for c in here {
            assert_eq!(c["succeeded"], true, "shard {i}: {c:#}");
            taken.push(c["hosted_cluster"].as_str().unwrap().to_string());
        }
    }
    taken.sort();
    assert_eq!(taken, ["clusters/alpha", "clusters/beta", "clusters/demo"], "each cluster exactly once");
    env.assert_in_service("after the sharded fleet backup").await;
    let hcs = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    for name in ["alpha", "beta", "demo"] {
        let hc = serde_json::to_value(hcs.get(name).await.unwrap()).unwrap();
        assert!(hc["spec"]["pausedUntil"].is_null(), "{name} still paused");
    }

    // the pods' prunes split the store's clusters: each once (one backup each, kept)
    let mut pruned: Vec<String> = Vec::new();
    for i in 0..K {
        let args = args_of(&pod["containers"][0], i);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = env.hcp_dr(&args, &[]);
        assert!(out.status.success(), "{}", text(&out));
        let entries = json_report(&out);
        assert!(entries.as_array().unwrap().iter().all(|e| e["keep"] == true), "{entries:#}");
        let mut clusters: Vec<String> = entries.as_array().unwrap().iter().map(|e| e["cluster"].as_str().unwrap().to_string()).collect();
        clusters.dedup();
        pruned.extend(clusters);
    }
    pruned.sort();
    assert_eq!(pruned, ["clusters/alpha", "clusters/beta", "clusters/demo"]);

    // a bad shard is refused before anything is contacted
    let out = env.hcp_dr(&["backup", "--all", "--shard", "3/3", "--to", store], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the index must be below the count"), "{}", text(&out));
}
