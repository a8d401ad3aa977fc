//! SIGKILL at every stage boundary of `restore`, `etcd restore` and
//! `drill` (migrate and backup have their own), then `--resume` or
//! `--abort`: each ends as consistent as an uninterrupted run.
//!
//! A run is killed at both ends of every stage: right after the stage is
//! journaled as started, before it does anything (`HCP_DR_TEST_HOLD_IN`),
//! and right after it did its work, before its result is journaled
//! (`HCP_DR_TEST_HOLD_AFTER`), so the next run must do it again over what
//! is already done. A resume goes on from the journal; an abort undoes
//! everything, including the work of a stage that was never recorded as
//! done.
//!
//! - restore (mgmt-a lost, restored onto mgmt-b with --take-over-dns):
//!   killed once `apply` created everything (and once `fence` wrote the
//!   store fence) and aborted, mgmt-b holds nothing of it, no fence is left
//!   and the DNS records are still the lost cluster's; then killed around every stage and resumed, it ends
//!   Available with the backup's data, fenced, the DNS names taken over.
//! - etcd restore: killed once `stop-etcd` stopped etcd and aborted, the
//!   cluster serves its own data again; then killed around every stage and
//!   resumed (`--abort` refused once `restore-members` replaced the data),
//!   every member holds the backup's keys above the revision reached, the
//!   cluster in service.
//! - drill: it has no `--resume` (it measures an uninterrupted RTO): killed
//!   around every stage, `--abort` removes whatever the drill made and the
//!   source is never touched; a drill afterwards passes.
//!
//! The sandboxes are independent (each serves its hosted clusters at
//! addresses derived from its own id), so the tests run in parallel.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use hcp_dr_e2e::drill::{WORKLOAD_NS, WORKLOAD_OBJECTS, hosted_client, member_clients, member_keys};
use hcp_dr_e2e::sandbox::{BASE_DOMAIN, BUCKET, wait_available};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::etcd_data::*;
use support::*;

/// Statuses of the final resume's stages: all `resumed` but the last.
fn assert_all_resumed_but_last(report: &Value, stages: &[&str]) {
    let got: Vec<(&str, &str)> = report["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| (s["name"].as_str().unwrap_or("?"), s["status"].as_str().unwrap_or("?")))
        .collect();
    let want: Vec<(&str, &str)> = stages
        .iter()
        .enumerate()
        .map(|(i, s)| (*s, if i + 1 == stages.len() { "succeeded" } else { "resumed" }))
        .collect();
    assert_eq!(got, want, "{report:#}");
}

/// SIGKILL the run at both boundaries of every stage, resuming each time:
/// right after a stage is journaled as started (it did nothing yet), then
/// right after it did its work but before that is journaled (the next run
/// does it again). `fresh` starts the run; `done(stage)` is called after
/// each kill of the second kind. The final resume is left to the caller.
fn kill_around_every_stage(env: &Env, fresh: &[&str], resume: &[&str], journal: &Path, stages: &[&str], mut done: impl FnMut(&str)) {
    kill_in(env, fresh, journal, stages[0]);
    for (i, stage) in stages.iter().enumerate() {
        kill_after(env, resume, journal, stage);
        done(stage);
        if let Some(next) = stages.get(i + 1) {
            kill_in(env, resume, journal, next);
        }
    }
    // each stage started three times: killed before doing anything, killed
    // after doing its work, and done again by the next run (the last one's
    // next run is the caller's)
    for (i, stage) in stages.iter().enumerate() {
        let want = if i + 1 == stages.len() { 2 } else { 3 };
        assert_eq!(started_count(journal, stage), want, "`{stage}`; journal:\n{}", std::fs::read_to_string(journal).unwrap());
    }
}

async fn namespaces(client: &kube::Client) -> BTreeSet<String> {
    Api::<Namespace>::all(client.clone()).list(&Default::default()).await.expect("namespaces").items.into_iter().filter_map(|n| n.metadata.name).collect()
}

/// The workload objects of `name` in `namespace` on `mgmt` are all served.
async fn assert_workloads(mgmt: &kube::Client, namespace: &str, name: &str, context: &str) {
    let hosted = hosted_client(mgmt, namespace, name).await.unwrap_or_else(|e| panic!("{context}: hosted client: {e}"));
    let cms = Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS).list(&Default::default()).await.expect("configmaps");
    let secrets = Api::<Secret>::namespaced(hosted, WORKLOAD_NS).list(&Default::default()).await.expect("secrets");
    assert_eq!(cms.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("config-"))).count(), WORKLOAD_OBJECTS, "{context}");
    assert_eq!(secrets.items.iter().filter(|s| s.metadata.name.as_deref().is_some_and(|n| n.starts_with("secret-"))).count(), WORKLOAD_OBJECTS, "{context}");
}

const RESTORE_STAGES: [&str; 10] = ["verify", "preflight", "snapshot-url", "volume-restore", "etcd-seed", "apply", "wait", "fence", "oidc-issuer", "dns-takeover"];

fn hostnames() -> Vec<String> {
    ["api", "ignition", "konnectivity", "oauth"].iter().map(|s| format!("{s}.demo.{BASE_DOMAIN}")).collect()
}

/// Wait (up to 2 minutes each) until every name of demo belongs to `owners`.
async fn wait_owners_of_demo(env: &Env, owners: &[&str], context: &str) {
    for host in hostnames() {
        wait_owners(env, &host, owners, Duration::from_secs(120), context).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restore_survives_a_sigkill_in_every_stage_and_an_abort_leaves_nothing() {
    let mut env = env("HighlyAvailable").await;
    let zone = env.sandbox.zone_id.clone();
    let r53 = env.sandbox.route53.url().to_string();
    let endpoint = env.sandbox.s3.https_url().to_string();
    wait_owners_of_demo(&env, &["mgmt-a"], "before the backup").await;
    let (revision_before, keys_before) = {
        let members = member_keys(&env.mgmt, &env.hcp_ns(), "/kubernetes.io/").await.expect("keys before");
        let (_, revision, keys) = members.into_iter().max_by_key(|m| m.1).unwrap();
        (revision, keys)
    };
    assert!(keys_before.iter().any(|k| k.starts_with(&format!("/kubernetes.io/secrets/{WORKLOAD_NS}/"))));
    // the backup records the DNS origin (owner mgmt-a) the take-over needs
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-o", "json", "--route53-zone", &zone, "--route53-endpoint", &r53];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let backup = json_report(&out);
    let folder = backup["backup"].as_str().unwrap().to_string();
    let revision = backup["etcd_revision"].as_i64().unwrap();
    let fence_file = env.sandbox.s3.root().join(BUCKET).join("backups").join(hcp_dr::archive::fence::key("clusters", "demo"));
    assert!(!fence_file.exists(), "a fence before any restore");

    env.sandbox.lose("mgmt-a").await.expect("lose mgmt-a");
    let mgmt_b = env.sandbox.cluster("mgmt-b").unwrap();
    let kubeconfig_b = mgmt_b.kubeconfig.display().to_string();
    let b = mgmt_b.api.client().await.unwrap();
    let namespaces_before = namespaces(&b).await;
    let restore = |journal: &Path| -> Vec<String> {
        ["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--wait", "5m", "--take-over-dns", "--route53-zone", &zone, "--route53-endpoint", &r53, "--dns-wait", "2m", "--journal", journal.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };

    // killed once apply created everything, and once fence wrote the store
    // fence (Available), each before its stage was journaled as done, then
    // --abort: nothing of the restore is left on mgmt-b, no store fence, the
    // DNS records still the lost cluster's
    for stage in ["etcd-seed", "apply", "fence"] {
        let aborted = env.dir.path().join(format!("restore-aborted-{stage}.jsonl"));
        let args = restore(&aborted);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kill_after(&env, &args, &aborted, stage);
        if stage == "etcd-seed" {
            // the members' volumes are seeded, nothing else made yet
            let claims = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(b.clone(), &env.hcp_ns()).list(&Default::default()).await.unwrap();
            assert_eq!(claims.items.len(), 3, "{stage}: the seeded claims before the kill");
            assert!(hc_api(&b, "clusters").get_opt("demo").await.unwrap().is_none(), "{stage}: apply ran");
        } else {
            assert!(hc_api(&b, "clusters").get_opt("demo").await.unwrap().is_some(), "{stage}: apply ran before the kill");
        }
        assert_eq!(fence_file.exists(), stage == "fence", "{stage}: the store fence before --abort");
        let out = env.hcp_dr(&["restore", "--abort", aborted.to_str().unwrap(), "-o", "json"], &[]);
        assert!(out.status.success(), "{stage}: {}", text(&out));
        assert_eq!(json_report(&out)["outcome"], "aborted", "{stage}: {}", text(&out));
        assert!(hc_api(&b, "clusters").get_opt("demo").await.unwrap().is_none(), "{stage}: --abort left the HostedCluster");
        assert!(np_api(&b, "clusters").list(&Default::default()).await.map(|l| l.items.is_empty()).unwrap_or(true), "{stage}: --abort left NodePools");
        assert_eq!(namespaces(&b).await, namespaces_before, "{stage}: --abort left namespaces behind");
        assert!(!fence_file.exists(), "{stage}: --abort left the store fence");
        wait_owners_of_demo(&env, &["mgmt-a"], &format!("{stage}: after --abort")).await;
    }

    // killed in every stage, resumed each time
    let journal = env.dir.path().join("restore.jsonl");
    let args = restore(&journal);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let resume = ["restore", "--resume", journal.to_str().unwrap(), "-o", "json"];
    kill_around_every_stage(&env, &args, &resume, &journal, &RESTORE_STAGES, |_| {});
    let out = env.hcp_dr(&resume, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    assert_all_resumed_but_last(&report, &RESTORE_STAGES);
    let wait = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "wait").unwrap()["output"];
    assert_eq!(wait["backup_revision"].as_i64(), Some(revision), "{wait}");
    let revisions = wait["revisions"].as_object().expect("revisions");
    assert_eq!(revisions.len(), 3, "{wait}");
    let seeded = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "etcd-seed").unwrap()["output"];
    let min = seeded["expected_min_revision"].as_i64().unwrap();
    assert!(min > revision && revisions.values().all(|r| r.as_i64().unwrap() >= min), "{wait} {seeded}");
    assert_eq!(wait["etcd"]["members"], json!(["etcd-0", "etcd-1", "etcd-2"]), "{wait}");
    assert!(!text(&out).contains("X-Amz-Signature"), "{}", text(&out));

    // as an uninterrupted restore: Available with the backup's data
    wait_available(&b, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");
    assert_workloads(&b, "clusters", "demo", "after the resumed restore").await;
    assert_one_etcd_cluster(&b, &env.hcp_ns(), 3, "after the resumed restore").await;
    let after = member_keys(&b, &env.hcp_ns(), "/kubernetes.io/").await.expect("keys after");
    assert_eq!(after.len(), 3);
    for (pod, member_revision, keys) in &after {
        assert!(*member_revision >= revision_before, "{pod}: revision {member_revision} < {revision_before}");
        let missing: Vec<&String> = keys_before.difference(keys).collect();
        assert!(missing.is_empty(), "{pod} lacks keys from before the backup: {missing:?}");
    }
    let hc = serde_json::to_value(hc_api(&b, "clusters").get("demo").await.unwrap()).unwrap();
    assert!(hc["spec"].get("pausedUntil").is_none(), "the backup's pause travelled: {}", hc["spec"]);
    assert!(hc["metadata"]["annotations"]["hcp-dr.openshift.io/restored-from"].as_str().is_some_and(|f| f.ends_with(folder.rsplit('/').next().unwrap())));
    // fenced on mgmt-b, and the names are mgmt-b's
    let fence: Value = serde_json::from_slice(&std::fs::read(&fence_file).expect("the store fence")).unwrap();
    assert_eq!(fence["runs_on"]["server"], json!(mgmt_b.api.url()), "{fence}");
    assert_eq!(fence["by"], "restore", "{fence}");
    wait_owners_of_demo(&env, &["mgmt-b"], "after the resumed restore").await;
    let taken = &report["stages"].as_array().unwrap().iter().find(|s| s["name"] == "dns-takeover").unwrap()["output"];
    assert!(!taken["deleted"].as_array().map(Vec::is_empty).unwrap_or(true), "{taken}");
}

const ETCD_RESTORE_STAGES: [&str; 10] =
    ["lock", "fetch-snapshot", "assess", "pause", "scale-down", "stop-etcd", "restore-members", "start-etcd", "resume", "unlock"];

/// Every member answers with the data written after the backup: nothing was restored.
async fn assert_own_data(env: &Env, reached: i64, context: &str) {
    let mut last = BTreeMap::new();
    for _ in 0..120 {
        if let Ok(members) = member_clients(&env.mgmt, &env.hcp_ns()).await
            && members.len() == 3
        {
            last = member_values(env, AFTER).await;
            if last.values().all(|(_, kvs)| kvs.len() == 30) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(last.len(), 3, "{context}: {last:?}");
    for (member, (revision, kvs)) in &last {
        assert_eq!(kvs.len(), 30, "{context}: {member} lost writes made after the backup");
        assert!(*revision >= reached, "{context}: {member} at {revision} < {reached}");
    }
    for (member, (_, kvs)) in member_values(env, BEFORE).await {
        assert_eq!(kvs[&format!("{BEFORE}00")], "changed after the backup", "{context}: {member}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_restore_survives_a_sigkill_in_every_stage_and_an_abort_puts_the_old_members_back() {
    let env = env("HighlyAvailable").await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    for i in 0..20 {
        put(&env, &format!("{BEFORE}{i:02}"), &format!("value-{i}")).await;
    }
    let _ = backup_to_s3(&env);
    let store = format!("s3://{BUCKET}/backups");
    for i in 0..30 {
        put(&env, &format!("{AFTER}{i:02}"), "later").await;
    }
    let reached = put(&env, &format!("{BEFORE}00"), "changed after the backup").await;
    let uids_before = claim_uids(&env).await;
    let restore = |journal: &Path| -> Vec<String> {
        ["etcd", "restore", "--hosted-cluster", "demo", "-n", "clusters", "--from", &store, "--backup-id", "latest", "--s3-endpoint", &endpoint, "--journal", journal.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };

    // killed once stop-etcd stopped etcd, before that was journaled (locked,
    // paused, writers and etcd down), then --abort: the cluster serves its
    // own data again
    let aborted = env.dir.path().join("etcd-restore-aborted.jsonl");
    let args = restore(&aborted);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kill_after(&env, &args, &aborted, "stop-etcd");
    assert!(env.writer_replicas().await.iter().all(|(_, r)| *r == 0), "scale-down ran before the kill");
    assert_eq!(etcd_replicas(&env).await, 0, "stop-etcd ran before the kill");
    let out = env.hcp_dr(&["etcd", "restore", "--abort", aborted.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json_report(&out)["outcome"], "aborted", "{}", text(&out));
    env.assert_in_service("after --abort").await;
    assert_eq!(etcd_replicas(&env).await, 3);
    assert_eq!(claim_uids(&env).await, uids_before, "--abort touched the volumes");
    assert_own_data(&env, reached, "after --abort").await;

    // killed in every stage, resumed each time
    let journal = env.dir.path().join("etcd-restore.jsonl");
    let args = restore(&journal);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let resume = ["etcd", "restore", "--resume", journal.to_str().unwrap(), "-o", "json"];
    kill_around_every_stage(&env, &args, &resume, &journal, &ETCD_RESTORE_STAGES, |stage| {
        if stage == "restore-members" {
            // the members' data is replaced: there is nothing to go back to
            let out = env.hcp_dr(&["etcd", "restore", "--abort", journal.to_str().unwrap()], &[]);
            assert_eq!(out.status.code(), Some(2), "{}", text(&out));
            assert!(String::from_utf8_lossy(&out.stderr).contains("restore-members has started"), "{}", text(&out));
        }
    });
    let out = env.hcp_dr(&resume, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    assert_all_resumed_but_last(&report, &ETCD_RESTORE_STAGES);
    // as an uninterrupted restore
    assert_restored_to_backup(&env, &report, reached, &uids_before).await;
    let uids_after = claim_uids(&env).await;
    assert_eq!(uids_after.len(), 3, "{uids_after:?}");
    env.assert_in_service("after the resumed restore").await;
    assert_eq!(etcd_replicas(&env).await, 3);
    let leftovers = Api::<Pod>::namespaced(env.mgmt.clone(), &env.hcp_ns())
        .list(&ListParams::default().labels("app.kubernetes.io/name=hcp-dr-etcd-restore"))
        .await
        .unwrap();
    assert!(leftovers.items.is_empty(), "restore pods left");
    assert!(Api::<Secret>::namespaced(env.mgmt.clone(), &env.hcp_ns()).get_opt("hcp-dr-etcd-restore").await.unwrap().is_none(), "the URL secret was left");
    let workloads = member_keys(&env.mgmt, &env.hcp_ns(), &format!("/kubernetes.io/configmaps/{WORKLOAD_NS}/")).await.unwrap();
    assert!(workloads.iter().all(|(_, _, keys)| keys.len() >= WORKLOAD_OBJECTS), "{workloads:?}");
    assert_workloads(&env.mgmt, "clusters", "demo", "after the resumed restore").await;
}

const DRILL_STAGES: [&str; 9] = ["verify", "rewrite", "preflight", "snapshot-url", "etcd-seed", "apply", "wait", "checks", "teardown"];

/// Nothing of the drill is left on the staging cluster.
async fn assert_no_drill(b: &kube::Client, namespaces_before: &BTreeSet<String>, context: &str) {
    assert!(hc_api(b, "clusters-drill").get_opt("demo-drill").await.unwrap().is_none(), "{context}: the drill's HostedCluster is left");
    assert!(np_api(b, "clusters-drill").list(&Default::default()).await.map(|l| l.items.is_empty()).unwrap_or(true), "{context}: NodePools are left");
    assert_eq!(&namespaces(b).await, namespaces_before, "{context}: namespaces left");
}

/// The source is as it was: Available on mgmt-a, in service, its workloads there.
async fn assert_source_untouched(env: &Env, uid: &str, context: &str) {
    env.assert_in_service(context).await;
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(30)).await.unwrap_or_else(|e| panic!("{context}: demo not Available on mgmt-a: {e}"));
    let hc = serde_json::to_value(hc_api(&env.mgmt, "clusters").get("demo").await.unwrap()).unwrap();
    assert_eq!(hc["metadata"]["uid"].as_str(), Some(uid), "{context}");
    assert_workloads(&env.mgmt, "clusters", "demo", context).await;
    assert_eq!(owners_of(env, &format!("api.demo.{BASE_DOMAIN}")).await, ["mgmt-a"], "{context}: the source's DNS records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drill_killed_in_any_stage_is_removed_by_abort_and_the_source_is_never_touched() {
    let env = env("SingleReplica").await;
    wait_owners_of_demo(&env, &["mgmt-a"], "before the drill").await;
    let uid = serde_json::to_value(hc_api(&env.mgmt, "clusters").get("demo").await.unwrap()).unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    let (folder, _) = backup_to_s3(&env);
    let endpoint = env.sandbox.s3.https_url().to_string();
    let staging = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let namespaces_before = namespaces(&b).await;
    let drill_host = format!("api.demo-drill.{BASE_DOMAIN}");

    for (stage, when) in DRILL_STAGES.iter().flat_map(|s| [(*s, "in"), (*s, "after")]) {
        let journal = env.dir.path().join(format!("drill-{when}-{stage}.jsonl"));
        let args = ["drill", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &staging, "--wait", "5m", "--journal", journal.to_str().unwrap()];
        let context = format!("killed {when} {stage}, aborted");
        if when == "in" {
            kill_in(&env, &args, &journal, stage);
        } else {
            kill_after(&env, &args, &journal, stage);
        }
        let created = ["wait", "checks"].contains(&stage) || (stage, when) == ("apply", "after") || (stage, when) == ("teardown", "in");
        assert_eq!(hc_api(&b, "clusters-drill").get_opt("demo-drill").await.unwrap().is_some(), created, "{context}");
        let out = env.hcp_dr(&["drill", "--abort", journal.to_str().unwrap(), "-o", "json"], &[]);
        assert!(out.status.success(), "{context}: {}", text(&out));
        let result = json_report(&out);
        assert_eq!(result["aborted"], true, "{context}: {result:#}");
        // from `apply` on, the abort undid what apply made (or had started to)
        let expected = if DRILL_STAGES.iter().position(|s| *s == stage) >= DRILL_STAGES.iter().position(|s| *s == "apply") { "removed_by_abort" } else { "never_created" };
        assert_eq!(result["drill_cluster"], expected, "{context}: {result:#}");
        // aborting again finds nothing more to do
        let again = env.hcp_dr(&["drill", "--abort", journal.to_str().unwrap(), "-o", "json"], &[]);
        assert!(again.status.success(), "{context} twice: {}", text(&again));
        assert_no_drill(&b, &namespaces_before, &context).await;
        assert_source_untouched(&env, &uid, &context).await;
    }
    wait_owners(&env, &drill_host, &[], Duration::from_secs(60), "after the aborted drills").await;

    // the staging cluster is clean for the next drill, which passes
    let report_base = env.dir.path().join("drill-report");
    let out = env.hcp_dr(
        &["drill", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &staging, "--wait", "5m", "--report", report_base.to_str().unwrap(), "-o", "json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let result = json_report(&out);
    assert_eq!(result["outcome"], "succeeded", "{result:#}");
    assert_eq!(result["passed"], true, "{result:#}");
    assert_eq!(result["drill_cluster"], "removed");
    assert!(result["checks"].as_array().unwrap().iter().all(|c| c["passed"] == true), "{result:#}");
    assert!(std::fs::read_to_string(report_base.with_extension("md")).unwrap().starts_with("# Restore drill of clusters/demo: PASSED"));
    assert_no_drill(&b, &namespaces_before, "after the drill").await;
    assert_source_untouched(&env, &uid, "after the drill").await;
}
