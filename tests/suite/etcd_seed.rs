//! A HighlyAvailable restore is ONE etcd cluster with HyperShift's etcd-init
//! as it ships (issue 37): the sandbox's default `etcd-init` restores
//! `restoreSnapshotURL` into each member without `--name` or
//! `--initial-cluster`, as openshift/hypershift's etcd-init.sh does.
//!
//! - the URL path is refused for HighlyAvailable (exit 2, nothing changed);
//!   forced (`--etcd-init-fixed` against the shipped etcd-init) it splits,
//!   and `wait` stops the restore on it; `etcd status` shows the split;
//!   `--abort` leaves nothing;
//! - by default hcp-dr seeds the members' volumes itself: one three-member
//!   cluster, the revision moved above what the source reached after the
//!   backup, the StatefulSet running on hcp-dr's claims;
//! - a StorageClass the destination lacks is refused by preflight; a claim
//!   no provisioner binds and seeding pods no node takes stop the restore
//!   naming the claim, the class or the rule, and `--abort` leaves nothing.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use support::etcd_data::put;
use support::*;

async fn namespaces(client: &kube::Client) -> BTreeSet<String> {
    Api::<Namespace>::all(client.clone()).list(&Default::default()).await.expect("namespaces").items.into_iter().filter_map(|n| n.metadata.name).collect()
}

/// Wait until the namespaces of `client` are `want` again (an abort's
/// namespace deletion finishes in the background of the emulator).
async fn assert_namespaces(client: &kube::Client, want: &BTreeSet<String>, context: &str) {
    let mut now = BTreeSet::new();
    for _ in 0..120 {
        now = namespaces(client).await;
        if &now == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{context}: namespaces {now:?}, before {want:?}");
}

fn stage<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["stages"].as_array().expect("stages").iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no stage {name}: {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_highly_available_restore_is_one_cluster_and_the_url_alone_splits() {
    let env = env("HighlyAvailable").await;
    let (folder, revision) = backup_to_s3(&env);
    // the source goes on writing after the backup
    for i in 0..20 {
        put(&env, &format!("/hcp-dr-test/after-backup/{i:02}"), "written after the backup").await;
    }
    let reached = put(&env, "/hcp-dr-test/after-backup/last", "the source's last write").await;
    assert!(reached > revision);
    // a migration with the URL path is refused before the source is paused
    let journal = env.dir.path().join("migrate-url.jsonl");
    let args = migrate_args(&env, &journal, &["--etcd-seed", "url"]);
    let out = env.hcp_dr(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--etcd-seed url on a HighlyAvailable backup"), "{}", text(&out));
    assert!(!journal.exists(), "the refused migration wrote a journal");
    env.assert_in_service("after the refused migration").await;
    retire_source(&env).await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let hcp_ns = env.hcp_ns();
    let before = namespaces(&b).await;
    let restore = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--wait", "5m", "-o", "json"].iter().map(|s| s.to_string()).collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run = |args: &[String]| env.hcp_dr(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);

    // the URL path on a HighlyAvailable backup is refused before anything
    for command in [restore(&["--etcd-seed", "url"]), vec!["drill".into(), "--from".into(), folder.clone(), "--s3-endpoint".into(), endpoint.clone(), "--kubeconfig".into(), kubeconfig_b.clone(), "--etcd-seed".into(), "url".into()]] {
        let out = run(&command);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--etcd-seed url on a HighlyAvailable backup") && err.contains("--etcd-init-fixed") && err.contains("OCPBUGS-99534"), "{err}");
        assert_eq!(namespaces(&b).await, before, "{}: the refusal changed mgmt-b", command[0]);
    }

    // forced against the shipped etcd-init: three clusters, and wait says so
    let out = run(&restore(&["--etcd-seed", "url", "--etcd-init-fixed"]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["outcome"], "stopped", "{report:#}");
    assert_eq!(report["stage"], "wait", "{report:#}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("is not one cluster of etcd-0, etcd-1, etcd-2"), "{error}");
    assert!(error.contains("lists only etcd-1 as the cluster's members"), "{error}");
    assert!(error.contains("etcd-init") && error.contains("--etcd-seed volumes"), "{error}");
    let journal = report["journal"].as_str().unwrap().to_string();
    let (views, read) = etcd_views(&b, &hcp_ns).await;
    for (pod, names, _) in &views {
        assert_eq!(names, &vec![pod.clone()], "{pod} should list only itself: {views:?}");
    }
    assert!(read.iter().all(|(_, found)| !found), "a key written through {} reached {read:?}", views[0].0);
    // etcd status shows the split, per member
    let out = env.hcp_dr(&["etcd", "status", "--hosted-cluster", "demo", "-n", "clusters", "--kubeconfig", &kubeconfig_b, "-o", "json"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let status = json_report(&out);
    assert!(!status["split"].as_array().unwrap().is_empty(), "{status:#}");
    for member in status["members"].as_array().unwrap().iter().filter(|m| m["pod"].is_string()) {
        assert_eq!(member["members"], json!([member["name"]]), "{member:#}");
        assert!(member["cluster_id"].is_string(), "{member:#}");
    }
    let out = env.hcp_dr(&["etcd", "status", "--hosted-cluster", "demo", "-n", "clusters", "--kubeconfig", &kubeconfig_b], &[]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("): SPLIT") && shown.contains("NOT ONE CLUSTER"), "{shown}");
    // --abort removes it all
    let out = env.hcp_dr(&["restore", "--abort", &journal, "--kubeconfig", &kubeconfig_b], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_namespaces(&b, &before, "after --abort of the split restore").await;

    // the default: hcp-dr seeds the members' volumes
    let out = run(&restore(&[]));
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let seeded = &stage(&report, "etcd-seed")["output"];
    assert_eq!(seeded["mode"], "volumes", "{seeded:#}");
    assert_eq!(seeded["members"].as_object().map(|m| m.len()), Some(3), "{seeded:#}");
    let min = seeded["expected_min_revision"].as_i64().unwrap();
    // the revision moves forward, past what the source reached after the backup
    assert!(min > reached, "restored from revision {revision} to {min}, the source reached {reached}: {seeded:#}");
    assert_eq!(seeded["backup_revision"].as_i64(), Some(revision));
    let etcd = &stage(&report, "wait")["output"]["etcd"];
    assert_eq!(etcd["members"], json!(["etcd-0", "etcd-1", "etcd-2"]), "{etcd:#}");
    assert_eq!(etcd["probe_read_back"].as_array().map(Vec::len), Some(2), "{etcd:#}");
    assert!(etcd["revisions"].as_object().unwrap().values().all(|r| r.as_i64().unwrap() >= min), "{etcd:#}");
    assert_one_etcd_cluster(&b, &hcp_ns, 3, "after the seeded restore").await;
    // the StatefulSet's members run on hcp-dr's claims; its pods and Secret are gone
    let claims = Api::<PersistentVolumeClaim>::namespaced(b.clone(), &hcp_ns);
    for (name, uid) in seeded["claims"].as_object().unwrap() {
        let claim = claims.get(name).await.unwrap();
        assert_eq!(claim.metadata.uid.as_deref(), uid.as_str(), "{name} was replaced");
        assert!(claim.metadata.annotations.unwrap_or_default().get("hcp-dr.openshift.io/etcd-seeded-from").is_some_and(|f| f.ends_with(folder.rsplit('/').next().unwrap())));
    }
    let seeders = Api::<Pod>::namespaced(b.clone(), &hcp_ns).list(&ListParams::default().labels("app.kubernetes.io/name=hcp-dr-etcd-restore")).await.unwrap();
    assert!(seeders.items.is_empty(), "seeding pods left");
    assert!(Api::<Secret>::namespaced(b.clone(), &hcp_ns).get_opt("hcp-dr-etcd-restore").await.unwrap().is_none(), "the URL Secret was left");
    // the backup's data, not the source's later writes
    let keys = hcp_dr_e2e::drill::member_keys(&b, &hcp_ns, "/hcp-dr-test/after-backup/").await.unwrap();
    assert!(keys.iter().all(|(_, _, k)| k.is_empty()), "writes after the backup came back: {keys:?}");
    let text_out = String::from_utf8_lossy(&env.hcp_dr(&["etcd", "status", "--hosted-cluster", "demo", "-n", "clusters", "--kubeconfig", &kubeconfig_b], &[]).stdout).to_string();
    assert!(text_out.contains("): HEALTHY"), "{text_out}");
}

/// The restore playbook with `with` under `etcd-seed`.
fn seed_playbook(dir: &std::path::Path, name: &str, with: &str) -> String {
    let builtin = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("playbooks/restore.yaml")).unwrap();
    let text = builtin.replace("  - name: etcd-seed\n", &format!("  - name: etcd-seed\n    with:\n{with}"));
    assert_ne!(text, builtin);
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The sandbox's CSI StorageClass on `client`, its provisioner `provisioner`.
async fn replace_class(client: &kube::Client, provisioner: Option<&str>) {
    let classes = Api::<StorageClass>::all(client.clone());
    let name = hcp_dr_e2e::operator::snapshots::SANDBOX_STORAGE_CLASS;
    if classes.get_opt(name).await.unwrap().is_some() {
        classes.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let Some(provisioner) = provisioner else { return };
    let mut class = hcp_dr_e2e::operator::snapshots::storage_objects().into_iter().find(|o| o["kind"] == "StorageClass").unwrap();
    class["provisioner"] = json!(provisioner);
    let class: StorageClass = serde_json::from_value(class).unwrap();
    classes.create(&PostParams::default(), &class).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seeding_faults_name_the_claim_the_class_or_the_rule_and_abort_leaves_nothing() {
    // etcd in the sandbox's CSI class, the control plane on nodes of a zone
    // mgmt-b has none of (the emulated source runs it anyway)
    let mut spec = hcp_dr_e2e::sandbox::HostedClusterSpec::demo();
    spec.availability = "HighlyAvailable".into();
    let env = env_editing(spec, &Default::default(), |objects| {
        for hc in objects.iter_mut().filter(|o| o["kind"] == "HostedCluster") {
            hc["spec"]["etcd"]["managed"]["storage"]["persistentVolume"]["storageClassName"] = json!(hcp_dr_e2e::operator::snapshots::SANDBOX_STORAGE_CLASS);
            hc["spec"]["nodeSelector"] = json!({"topology.kubernetes.io/zone": "nowhere"});
        }
    })
    .await;
    let (folder, _) = backup_to_s3(&env);
    retire_source(&env).await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let b = env.sandbox.clusters[1].api.client().await.unwrap();
    let before = namespaces(&b).await;
    let unbound = seed_playbook(env.dir.path(), "unbound.yaml", "      unbound-for: 10s\n      unschedulable-for: 1h\n");
    let unschedulable = seed_playbook(env.dir.path(), "unschedulable.yaml", "      unschedulable-for: 10s\n");
    let restore = |playbook: Option<&str>| {
        let mut args = vec!["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--wait", "5m", "-o", "json"];
        if let Some(p) = playbook {
            args.extend(["--playbook", p]);
        }
        env.hcp_dr(&args, &[])
    };
    let abort = |report: &Value| {
        let journal = report["journal"].as_str().unwrap().to_string();
        let out = env.hcp_dr(&["restore", "--abort", &journal, "--kubeconfig", &kubeconfig_b, "-o", "json"], &[]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(json_report(&out)["outcome"], "aborted", "{}", text(&out));
    };

    // the backup's StorageClass is not on mgmt-b: refused, nothing changed
    replace_class(&b, None).await;
    let out = restore(None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json_report(&out);
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("StorageClass sandbox-csi does not exist here") && error.contains("nothing was changed"), "{error}");
    assert_eq!(namespaces(&b).await, before, "the refused restore changed mgmt-b");

    // a class whose provisioner never makes a volume: the claims stay Pending
    replace_class(&b, Some("example.com/nobody")).await;
    let out = restore(Some(&unbound));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["stage"], "etcd-seed", "{report:#}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("clusters-demo/data-etcd-") && error.contains("(StorageClass sandbox-csi) is still Pending"), "{error}");
    abort(&report);
    assert_namespaces(&b, &before, "after --abort of the unbound claims").await;

    // a placement no node of mgmt-b satisfies: the seeding pods stay unschedulable
    replace_class(&b, Some(hcp_dr_e2e::operator::snapshots::SANDBOX_CSI_DRIVER)).await;
    let out = restore(Some(&unschedulable));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["stage"], "etcd-seed", "{report:#}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.contains("cannot be scheduled") && error.contains("node affinity/selector") && error.contains("nowhere"), "{error}");
    abort(&report);
    assert_namespaces(&b, &before, "after --abort of the unschedulable seeding").await;
}
