//! `hcp-dr migrate` on the sandbox: `demo` moves from mgmt-a to mgmt-b with
//! its workloads and every etcd key; the run is SIGKILLed at the start of
//! every stage and resumed each time; `--abort` before teardown returns the
//! source to service; bad input is refused.

use crate::support;

use std::time::Duration;

use hcp_dr_e2e::drill::{WORKLOAD_NS, member_keys};
use hcp_dr_e2e::sandbox::{BUCKET, wait_available};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::Api;
use serde_json::Value;
use support::*;

const STAGES: [&str; 26] = [
    "lock",
    "preflight",
    "destination-check",
    "pause",
    "scale-down",
    "etcd-snapshot",
    "volume-snapshot",
    "volume-copy",
    "export",
    "snapshot-finish",
    "package",
    "point-in-time",
    "dns-withdraw",
    "detach-hosts",
    "verify",
    "destination-preflight",
    "snapshot-url",
    "volume-restore",
    "etcd-seed",
    "apply",
    "wait",
    "fence",
    "oidc-issuer",
    "teardown",
    "ovn-restart",
    "unlock",
];

async fn owners_of(env: &Env, host: &str) -> Vec<String> {
    let client = env.sandbox.route53.client();
    let out = client.list_resource_record_sets().hosted_zone_id(&env.sandbox.zone_id).send().await.expect("list records");
    out.resource_record_sets()
        .iter()
        .filter(|r| r.name().trim_end_matches('.') == host && r.r#type().as_str() == "TXT")
        .flat_map(|r| r.resource_records().iter().map(|v| v.value().to_string()))
        .filter_map(|v| v.split(',').find_map(|kv| kv.trim_matches('"').strip_prefix("external-dns/owner=").map(str::to_string)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_survives_a_sigkill_in_every_stage_and_moves_everything() {
    let env = env("HighlyAvailable").await;
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let host = format!("api.demo.{}", hcp_dr_e2e::sandbox::BASE_DOMAIN);
    // external-dns of mgmt-a has published the API name
    for _ in 0..120 {
        if owners_of(&env, &host).await == vec!["mgmt-a".to_string()] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(owners_of(&env, &host).await, vec!["mgmt-a".to_string()]);
    let source_uid = hc_on(&env.mgmt).await.expect("demo on mgmt-a")["metadata"]["uid"].as_str().unwrap().to_string();
    let before = member_keys(&env.mgmt, &env.hcp_ns(), "/kubernetes.io/").await.expect("keys before");
    let (_, revision_before, keys_before) = before.iter().max_by_key(|m| m.1).cloned().unwrap();
    assert!(keys_before.iter().any(|k| k.starts_with(&format!("/kubernetes.io/secrets/{WORKLOAD_NS}/"))));

    let journal = env.dir.path().join("migrate.jsonl");
    let (a, bk) = (env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string(), env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string());
    let via = format!("s3://{BUCKET}/migrations");
    let endpoint = env.sandbox.s3.https_url().to_string();
    let mut fresh: Vec<String> = ["migrate", "--hosted-cluster", "demo", "--from-kubeconfig", &a, "--to-kubeconfig", &bk, "--via", &via, "--s3-endpoint", &endpoint, "--journal", journal.to_str().unwrap(), "--wait", "5m", "--dns-wait", "2m"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    fresh.extend(dns_args(&env));
    let fresh: Vec<&str> = fresh.iter().map(String::as_str).collect();
    let resume = ["migrate", "--resume", journal.to_str().unwrap(), "-o", "json"];

    kill_in(&env, &fresh, &journal, STAGES[0]);
    for stage in &STAGES[1..] {
        if *stage == "ovn-restart" {
            // teardown is done: the source cannot be brought back any more
            let out = env.hcp_dr(&["migrate", "--abort", journal.to_str().unwrap()], &[]);
            assert_eq!(out.status.code(), Some(2), "{}", text(&out));
            assert!(String::from_utf8_lossy(&out.stderr).contains("teardown has started"), "{}", text(&out));
        }
        kill_in(&env, &resume, &journal, stage);
    }
    let out = env.hcp_dr(&resume, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    let rto = report["rto_seconds"].as_f64().expect("RTO measured");
    assert!(rto > 0.0, "{report:#}");
    assert_eq!(report["stage_seconds"].as_object().unwrap().len(), STAGES.len(), "{report:#}");
    // every stage but the last ran in an earlier (killed and resumed) process
    let statuses: Vec<&str> = report["stages"].as_array().unwrap().iter().map(|s| s["status"].as_str().unwrap_or("?")).collect();
    assert_eq!(statuses.iter().filter(|s| **s == "resumed").count(), STAGES.len() - 1, "{statuses:?}");

    // the source is gone from mgmt-a
    assert!(hc_on(&env.mgmt).await.is_none(), "the source HostedCluster is still on mgmt-a");
    assert!(Api::<Namespace>::all(env.mgmt.clone()).get_opt(&env.hcp_ns()).await.unwrap().is_none());
    // the destination serves every workload object and every etcd key from before
    assert_moved(&b, &env.hcp_ns(), revision_before, &keys_before, 3).await;
    // with HyperShift's shipped etcd-init: one cluster, because hcp-dr seeded the volumes
    assert_one_etcd_cluster(&b, &env.hcp_ns(), 3, "after the migration").await;
    let ovn_before = keys_before.iter().filter(|k| k.starts_with("/kubernetes.io/pods/openshift-ovn-kubernetes/ovnkube-node-")).count();
    let restarted = report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "ovn-restart").unwrap()["output"]["restarted"].as_array().map_or(0, Vec::len);
    assert_eq!(restarted, ovn_before, "every OVN pod from before was restarted");
    // the source's records are gone; the name is now mgmt-b's
    for _ in 0..120 {
        if owners_of(&env, &host).await == vec!["mgmt-b".to_string()] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(owners_of(&env, &host).await, vec!["mgmt-b".to_string()]);

    // the Secrets the cluster used left mgmt-a with it: moving back is not refused for them
    let secrets_a: Api<Secret> = Api::namespaced(env.mgmt.clone(), "clusters");
    for name in ["demo-pull-secret", "demo-etcd-encryption-key"] {
        assert!(secrets_a.get_opt(name).await.unwrap().is_none(), "Secret clusters/{name} was left on mgmt-a");
    }
    // the migrated cluster carries its lineage, so the migration's own backup
    // is accepted by `etcd restore` on mgmt-b (a dry-run runs its checks)
    let moved = hc_on(&b).await.expect("demo on mgmt-b");
    assert_eq!(moved["metadata"]["annotations"]["hcp-dr.openshift.io/lineage"].as_str(), Some(source_uid.as_str()), "{}", moved["metadata"]);
    assert_ne!(moved["metadata"]["uid"].as_str(), Some(source_uid.as_str()));
    let out = env.hcp_dr(
        &["etcd", "restore", "--hosted-cluster", "demo", "--from", &via, "--backup-id", "latest", "--kubeconfig", &bk, "--s3-endpoint", &endpoint, "--dry-run"],
        &[],
    );
    assert!(out.status.success(), "etcd restore refused the migration's own backup: {}", text(&out));
    // a backup on mgmt-b is of the moved cluster (its own UID) and of the same lineage
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "--to", &via, "--kubeconfig", &bk, "--s3-endpoint", &endpoint], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = env.hcp_dr(&["backups", "list", "--store", &via, "--hosted-cluster", "demo", "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = json_report(&out);
    let complete: Vec<&Value> = listed.as_array().unwrap().iter().filter(|b| b["complete"] == true).collect();
    assert_eq!(complete[0]["cluster_uid"].as_str(), moved["metadata"]["uid"].as_str(), "{listed:#}");
    assert!(complete.iter().all(|b| b["lineage"].as_str() == Some(source_uid.as_str())), "{listed:#}");
    assert!(complete.iter().any(|b| b["cluster_uid"].as_str() == Some(source_uid.as_str())), "the migration's backup: {listed:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abort_before_teardown_returns_the_source_to_service_and_bad_input_is_refused() {
    // on KubeVirt: its workers are CAPI Machines, which a careless undo would deprovision
    let spec = hcp_dr_e2e::sandbox::HostedClusterSpec { availability: "SingleReplica".into(), ..hcp_dr_e2e::sandbox::HostedClusterSpec::kubevirt() };
    let env = env_of(spec, &Default::default()).await;
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let (a, bk) = (env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string(), env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string());
    let via = format!("s3://{BUCKET}/migrations");
    let endpoint = env.sandbox.s3.https_url().to_string();
    let journal = env.dir.path().join("migrate.jsonl");
    let mut args: Vec<String> = ["migrate", "--hosted-cluster", "demo", "--from-kubeconfig", &a, "--to-kubeconfig", &bk, "--via", &via, "--s3-endpoint", &endpoint, "--journal", journal.to_str().unwrap(), "--wait", "5m", "--dns-wait", "2m", "--dns-direct", "-o", "json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(dns_args(&env));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // --dry-run: the read-only stages run for real, the plan is printed, nothing changes
    let mut dry: Vec<&str> = args.iter().copied().filter(|a| *a != "-o" && *a != "json").collect();
    dry.push("--dry-run");
    let out = env.hcp_dr(&dry, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("migrate plan (dry run: nothing was changed)"), "{}", text(&out));
    assert!(plan.contains("source: scale every Deployment and StatefulSet in clusters-demo to 0"), "{}", text(&out));
    assert!(plan.contains("destination: HostedCluster clusters/demo is created with restoreSnapshotURL"), "{}", text(&out));
    assert!(plan.contains("destination: read back s3://"), "{}", text(&out));
    env.assert_in_service("after --dry-run").await;
    assert!(hc_on(&b).await.is_none(), "--dry-run created the cluster on mgmt-b");
    assert!(!journal.exists(), "--dry-run wrote a journal");

    let out = env.hcp_dr(&args, &[("HCP_DR_TEST_FAIL_AFTER", "wait")]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "stopped", "{report:#}");
    assert!(hc_on(&b).await.is_some(), "the destination was not restored before the stop");
    let machines = Api::<kube::api::DynamicObject>::namespaced_with(
        b.clone(),
        &env.hcp_ns(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Machine")),
    );
    assert_eq!(machines.list(&Default::default()).await.expect("Machines on mgmt-b").items.len(), 2, "the copy on mgmt-b has no workers to protect");
    assert!(hc_on(&env.mgmt).await.is_some(), "the source was torn down before the destination was confirmed");

    let out = env.hcp_dr(&["migrate", "--abort", journal.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(hc_on(&b).await.is_none(), "--abort left the copy on mgmt-b");
    // the copy was paused before it was deleted: mgmt-b's CAPI terminated none of the workers the source goes on using
    let terminated = hcp_dr_e2e::sandbox::terminated_instances(&env.sandbox.dir);
    assert!(terminated.is_empty(), "--abort deprovisioned the source's workers: {terminated:?}\n{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("before deleting, so no controller cleaned up"), "{}", text(&out));
    env.assert_in_service("after --abort").await;
    let cpo = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.mgmt.clone(), &env.hcp_ns())
        .get("control-plane-operator")
        .await
        .expect("control-plane-operator");
    assert!(cpo.spec.replicas.unwrap_or(1) > 0, "control-plane-operator left at 0");
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(120)).await.expect("the source serves again");

    // bad input: exit 2, nothing changed
    for (bad, expect) in [
        (vec!["migrate", "--hosted-cluster", "demo", "--via", via.as_str(), "--to-kubeconfig", bk.as_str()], "--from-kubeconfig"),
        (vec!["migrate", "--hosted-cluster", "demo", "--via", via.as_str(), "--from-kubeconfig", a.as_str(), "--to-kubeconfig", a.as_str()], "the same management cluster"),
        (vec!["migrate", "--hosted-cluster", "demo", "--via", "/tmp/local", "--from-kubeconfig", a.as_str(), "--to-kubeconfig", bk.as_str()], "--stage-snapshot-to"),
        (vec!["migrate", "--hosted-cluster", "Demo!", "--via", via.as_str(), "--from-kubeconfig", a.as_str(), "--to-kubeconfig", bk.as_str()], "not a valid Kubernetes name"),
        (vec!["migrate", "--hosted-cluster", "demo", "--via", via.as_str(), "--from-kubeconfig", a.as_str(), "--to-kubeconfig", bk.as_str(), "--pause-ttl", "1m"], "--pause-ttl"),
    ] {
        let out = env.hcp_dr(&bad, &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(expect), "{bad:?}: {}", text(&out));
    }
    env.assert_in_service("after refused input").await;
}
