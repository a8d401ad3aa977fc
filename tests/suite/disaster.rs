//! Disaster recovery when the source management cluster is lost: `demo`
//! is backed up on mgmt-a (the manifest records where, the hostnames and
//! their external-dns owner), written to after the backup, and then mgmt-a
//! dies (its API server, operator, external-dns and etcd members all
//! stopped). `restore` from `latest` onto mgmt-b brings the data of the
//! backup back (and not the later writes), fences the store, and reports
//! the records still held by the dead cluster with the command that takes
//! them over; that command, run as printed, takes them over (after a third
//! owner was refused with nothing changed), and mgmt-b's external-dns
//! publishes every hostname. Bad DNS input is refused before anything runs.

use crate::support;

use std::time::Duration;

use hcp_dr_e2e::drill::{WORKLOAD_NS, WORKLOAD_OBJECTS, hosted_client};
use hcp_dr_e2e::sandbox::{BASE_DOMAIN, BUCKET, wait_available};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use hcp_dr::archive::fence;
use support::*;

fn hostnames() -> Vec<String> {
    ["api", "ignition", "konnectivity", "oauth"].iter().map(|s| format!("{s}.demo.{BASE_DOMAIN}")).collect()
}

async fn kube_system_uid(client: &kube::Client) -> String {
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.get("kube-system").await.expect("kube-system").metadata.uid.expect("uid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_management_cluster_is_restored_elsewhere_fenced_and_its_dns_taken_over() {
    let mut env = env("SingleReplica").await;
    let zone = env.sandbox.zone_id.clone();
    let r53 = env.sandbox.route53.url().to_string();
    let dns_args = ["--route53-zone", zone.as_str(), "--route53-endpoint", r53.as_str()];
    let a_uid = kube_system_uid(&env.mgmt).await;
    for host in hostnames() {
        assert_eq!(owners_of(&env, &host).await, ["mgmt-a"], "{host} is published by mgmt-a's external-dns");
    }

    // The scheduled backup, with the zone: the manifest records the origin.
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    args.extend(dns_args);
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let backup_url = json_report(&out)["backup"].as_str().unwrap().to_string();
    let latest = format!("s3://{BUCKET}/backups/clusters/demo/latest");
    let s3_endpoint = env.sandbox.s3.https_url().to_string();
    let out = env.hcp_dr(&["backups", "describe", &latest, "--s3-endpoint", &s3_endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let described = json_report(&out);
    let origin = &described["origin"];
    assert_eq!(origin["management_cluster"]["kube_system_uid"], json!(a_uid), "{origin}");
    assert_eq!(origin["management_cluster"]["server"], json!(env.sandbox.cluster("mgmt-a").unwrap().api.url()));
    let recorded: Vec<&str> = origin["hostnames"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(recorded, hostnames(), "{origin}");
    assert_eq!(origin["dns"]["owner"], "mgmt-a", "{origin}");
    assert_eq!(origin["dns"]["zone_id"], json!(zone));
    assert!(described.get("fence").is_none(), "no fence before any restore: {described}");

    // Written after the backup: lost by the RPO.
    let late: Api<ConfigMap> = Api::namespaced(env.hosted.clone(), WORKLOAD_NS);
    late.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "after-the-backup"}, "data": {"k": "v"}})).unwrap())
        .await
        .expect("write after the backup");

    // mgmt-a dies.
    env.sandbox.lose("mgmt-a").await.expect("lose mgmt-a");
    let mgmt_b = env.sandbox.cluster("mgmt-b").unwrap();
    let b_kubeconfig = mgmt_b.kubeconfig.display().to_string();
    let b_client = mgmt_b.api.client().await.unwrap();
    let b_uid = kube_system_uid(&b_client).await;

    // Bad DNS input is refused before anything is contacted or journaled.
    let journals = env.dir.path().join("state/journals");
    let before = std::fs::read_dir(&journals).map(|d| d.count()).unwrap_or(0);
    for (extra, says) in [
        (vec!["--take-over-dns"], "--take-over-dns needs the Route53 hosted zone"),
        (vec!["--take-over-dns", "--route53-zone", "not-a-zone"], "--route53-zone"),
        (vec!["--dns-owner", "mgmt-a", "--route53-zone", zone.as_str()], "go with --take-over-dns"),
        (vec!["--take-over-dns", "--route53-zone", zone.as_str(), "--dns-wait", "1s"], "--dns-wait"),
    ] {
        let mut args = vec!["restore", "--from", latest.as_str(), "--kubeconfig", b_kubeconfig.as_str(), "--s3-endpoint", s3_endpoint.as_str()];
        args.extend(extra.iter().copied());
        let out = env.hcp_dr(&args, &[("HCP_DR_ROUTE53_ZONE", "")]);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{extra:?}: {}", text(&out));
    }
    assert_eq!(std::fs::read_dir(&journals).map(|d| d.count()).unwrap_or(0), before, "nothing journaled");

    // Restore from latest on mgmt-b, the zone known but no take-over.
    let out = env.hcp_dr(
        &["restore", "--from", &latest, "--kubeconfig", &b_kubeconfig, "--s3-endpoint", &s3_endpoint, "--route53-zone", &zone, "--route53-endpoint", &r53],
        &[],
    );
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(&format!("fenced in the store: clusters/demo runs on {}", mgmt_b.api.url())), "{report}");
    assert!(report.contains("DNS: these records still point at the old management cluster (external-dns owner mgmt-a)"), "{report}");
    for host in hostnames() {
        assert!(report.contains(&format!("{host} A")), "{host} listed: {report}");
    }
    let command = report
        .lines()
        .find_map(|l| l.strip_prefix("once the old management cluster is down for good, take them over: "))
        .unwrap_or_else(|| panic!("no take-over command: {report}"))
        .to_string();
    assert!(command.starts_with("hcp-dr restore --dns-only --take-over-dns --from "), "{command}");
    assert!(command.contains(&backup_url), "{command}");

    // The data: every workload object of the backup, not the later write.
    wait_available(&b_client, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on mgmt-b");
    let hosted = hosted_client(&b_client, "clusters", "demo").await.expect("hosted client on mgmt-b");
    let cms: Api<ConfigMap> = Api::namespaced(hosted, WORKLOAD_NS);
    let names: Vec<String> = cms.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|c| c.metadata.name).collect();
    assert!(names.len() >= WORKLOAD_OBJECTS, "workloads restored: {names:?}");
    assert!(!names.contains(&"after-the-backup".to_string()), "a write after the backup is lost: {names:?}");

    // The store fence names mgmt-b.
    let out = env.hcp_dr(&["backups", "list", "--store", &format!("s3://{BUCKET}/backups"), "--s3-endpoint", &s3_endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = json_report(&out);
    let fence = &listed[0]["fence"];
    assert_eq!(fence["runs_on"]["kube_system_uid"], json!(b_uid), "{listed}");
    assert_eq!(fence["backup_taken_on"]["kube_system_uid"], json!(a_uid), "{listed}");
    assert_eq!(fence["by"], "restore");

    // mgmt-b's external-dns cannot publish while mgmt-a's records stand.
    for host in hostnames() {
        assert_eq!(owners_of(&env, &host).await, ["mgmt-a"], "{host} still the dead cluster's");
    }

    // A third owner is refused, nothing changed.
    let work = env.dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let out = sourced_shell(&env.sandbox, &work, &format!("{command} --dns-owner someone-else")).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let refused = text(&out);
    assert!(refused.contains("not owned by `someone-else`") && refused.contains("nothing was deleted"), "{refused}");
    for host in hostnames() {
        assert_eq!(owners_of(&env, &host).await, ["mgmt-a"], "{host} untouched by the refused take-over");
    }
    // its printed abort, as printed (without --dns-only): the run's own
    // playbook comes from its journal; nothing was deleted, so the abort
    // has nothing to undo and says so
    let abort = refused
        .split('`')
        .find(|part| part.starts_with("hcp-dr restore --abort "))
        .unwrap_or_else(|| panic!("no abort command printed: {refused}"))
        .to_string();
    let out = sourced_shell(&env.sandbox, &work, &abort).output().unwrap();
    assert!(out.status.success(), "{abort}: {}", text(&out));
    assert!(text(&out).contains("nothing was changed"), "{abort}: {}", text(&out));
    for host in hostnames() {
        assert_eq!(owners_of(&env, &host).await, ["mgmt-a"], "{host} untouched by the abort");
    }

    // The printed command, as printed: the records move to mgmt-b.
    let out = sourced_shell(&env.sandbox, &work, &command).output().unwrap();
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("DNS taken over from external-dns owner mgmt-a"), "{report}");
    for host in hostnames() {
        assert!(report.contains(&format!("  {host}: ")) && report.contains("(owner mgmt-b)"), "{host}: {report}");
        assert_eq!(owners_of(&env, &host).await, ["mgmt-b"], "{host} now mgmt-b's");
    }

    // The store fence holds on mgmt-b's side too: a backup where the fence
    // says the cluster runs is accepted; one anywhere else is refused with
    // nothing written. Here the fence is pointed at (dead) mgmt-a, as a
    // restore there would have written it.
    let store = hcp_dr::store::open(
        &format!("s3://{BUCKET}/backups"),
        hcp_dr::store::S3Options {
            endpoint: Some(s3_endpoint.clone()),
            ca_bundle: Some(env.sandbox.dir.join("ca.crt")),
            region: Some(env.sandbox.s3.region().to_string()),
            static_credentials: Some((env.sandbox.s3.access_key().to_string(), env.sandbox.s3.secret_key().to_string())),
            ..Default::default()
        },
    )
    .await
    .expect("open the store");
    let here = fence::read(store.as_ref(), "clusters", "demo").await.unwrap().expect("the restore's fence");
    let lost = env.sandbox.lost[0].clone();
    let elsewhere = fence::Fence {
        runs_on: hcp_dr::archive::ManagementCluster { server: lost.api_url.trim_end_matches('/').to_string(), kube_system_uid: Some(a_uid.clone()) },
        ..here.clone()
    };
    fence::write(store.as_ref(), &elsewhere).await.unwrap();
    let listed_before = store.list("clusters/demo/").await.unwrap().len();
    let mut args = vec!["backup", "--hosted-cluster", "demo", "--kubeconfig", b_kubeconfig.as_str()];
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    let refused = text(&out);
    assert_eq!(out.status.code(), Some(1), "{refused}");
    assert!(refused.contains("refusing to back up HostedCluster clusters/demo") && refused.contains("the store is fenced"), "{refused}");
    assert!(refused.contains(&format!("runs on {}", lost.api_url.trim_end_matches('/'))), "the message names the fence: {refused}");
    assert_eq!(store.list("clusters/demo/").await.unwrap().len(), listed_before, "nothing written to the store");
    let out = env.hcp_dr(&["backups", "describe", &latest, "--s3-endpoint", &s3_endpoint, "-o", "json"], &[]);
    assert_eq!(json_report(&out)["backup_id"], described["backup_id"], "latest did not move");
    let status: Api<ConfigMap> = Api::namespaced(b_client.clone(), "clusters");
    let status = status.get("hcp-dr-backup-demo").await.expect("status ConfigMap");
    let reason = status.data.unwrap_or_default().get("last_failure_reason").cloned().unwrap_or_default();
    assert!(reason.contains("the store is fenced"), "status ConfigMap: {reason}");
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(b_client.clone(), "clusters");
    let events = events.list(&ListParams::default()).await.unwrap().items;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("BackupFailed") && e.message.as_deref().is_some_and(|m| m.contains("the store is fenced"))),
        "a BackupFailed Event names the fence"
    );

    // The fence back on mgmt-b: its backup is accepted and becomes latest.
    fence::write(store.as_ref(), &here).await.unwrap();
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = env.hcp_dr(&["backups", "describe", &latest, "--s3-endpoint", &s3_endpoint, "-o", "json"], &[]);
    let latest_now = json_report(&out);
    assert_ne!(latest_now["backup_id"], described["backup_id"], "mgmt-b's backup is latest");
    assert_eq!(latest_now["origin"]["management_cluster"]["kube_system_uid"], json!(b_uid));
    assert_eq!(latest_now["fence"]["runs_on"]["kube_system_uid"], json!(b_uid));
}

/// The scenario `hcp-dr-sandbox disaster` runs, as the test suite runs it:
/// it fails on any check that does not hold; here its findings are checked
/// once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sandbox_disaster_scenario_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = hcp_dr_e2e::disaster::run(&dir.path().join("sandbox"), std::path::Path::new(env!("CARGO_BIN_EXE_hcp-dr")))
        .await
        .unwrap_or_else(|e| panic!("the disaster scenario failed: {e}"));
    assert!(report.workload_objects_restored >= 2 * WORKLOAD_OBJECTS, "{}", report.render());
    assert!(report.write_after_backup_lost, "{}", report.render());
    assert_eq!(report.records.len(), 4, "{}", report.render());
    assert!(report.records.iter().all(|(_, owners)| owners == &["mgmt-b"]), "{}", report.render());
    assert!(report.stale_members_before_fence > 0, "the stale copy ran again before the fence: {}", report.render());
    assert_eq!(report.stale_members_after_fence, 0, "{}", report.render());
    assert_eq!(report.stale_routes_after_fence, 0, "{}", report.render());
    // the stale copy answered clients at its own address before the fence, and not after
    assert_ne!(report.stale_api, report.live_api, "{}", report.render());
    assert!(report.stale_api_before_fence.contains("served ConfigMap after-the-backup"), "{}", report.render());
    assert!(!report.stale_api_after_fence.is_empty(), "{}", report.render());
    assert_eq!(report.stale_backup_refused.len(), 2, "{}", report.render());
    assert_eq!(report.latest_at_end, report.live_backup, "{}", report.render());
    assert_ne!(report.live_backup, report.restored_backup, "{}", report.render());
}
