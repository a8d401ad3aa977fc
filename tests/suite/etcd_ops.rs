//! `hcp-dr etcd status` and `hcp-dr etcd recover` on the sandbox: real etcd
//! members (one process per etcd pod), real binary. A member is broken the
//! way disks break: its database file is overwritten with garbage and its
//! process killed, so the simulated kubelet restarts it into a crash loop.

use crate::support;

use std::collections::BTreeSet;
use std::process::Output;
use std::time::Duration;

use hcp_dr_e2e::drill::{WORKLOAD_NS, WORKLOAD_OBJECTS, member_keys};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use serde_json::{Value, json};
use support::{Env, assert_one_etcd_cluster, env, etcd_pid, files, json_report, text, wait_for_stage};

/// Break `member`: replace its bbolt database with garbage (atomically, the
/// running process keeps the old file) and SIGKILL its process. Every
/// restart then fails to open the database: CrashLoopBackOff.
fn break_member(env: &Env, member: &str) {
    let dir = env.etcd_data_dir(member);
    let pid = etcd_pid(&dir)
        .unwrap_or_else(|| panic!("no etcd process with --data-dir={}", dir.display()));
    let db = dir.join("member/snap/db");
    assert!(db.exists(), "{} missing", db.display());
    let junk = dir.join("member/snap/db.junk");
    std::fs::write(&junk, vec![0xa5u8; 64 * 1024]).expect("write junk");
    std::fs::rename(&junk, &db).expect("replace db");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success(), "kill -KILL {pid}");
}

fn status(env: &Env) -> (Option<i32>, Value, Output) {
    let out = env.hcp_dr(
        &[
            "etcd",
            "status",
            "--hosted-cluster",
            "demo",
            "-n",
            "clusters",
            "-o",
            "json",
        ],
        &[],
    );
    let report = json_report(&out);
    (out.status.code(), report, out)
}

fn member<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no row {name}: {report:#}"))
}

/// Run `etcd status` until `done` holds for its report (bounded), and return it.
fn status_until(
    env: &Env,
    what: &str,
    done: impl Fn(Option<i32>, &Value) -> bool,
) -> (Option<i32>, Value) {
    let mut last = Value::Null;
    for _ in 0..90 {
        let (code, report, _) = status(env);
        if done(code, &report) {
            return (code, report);
        }
        last = report;
        std::thread::sleep(Duration::from_secs(1));
    }
    panic!("etcd status never showed {what}; last report:\n{last:#}");
}

async fn uids(env: &Env) -> Vec<(String, String)> {
    let ns = env.hcp_ns();
    let mut out = Vec::new();
    for pod in Api::<Pod>::namespaced(env.mgmt.clone(), &ns)
        .list(&kube::api::ListParams::default().labels("app=etcd"))
        .await
        .expect("pods")
        .items
    {
        out.push((
            format!("pod/{}", pod.metadata.name.unwrap_or_default()),
            pod.metadata.uid.unwrap_or_default(),
        ));
    }
    for pvc in Api::<PersistentVolumeClaim>::namespaced(env.mgmt.clone(), &ns)
        .list(&Default::default())
        .await
        .expect("pvcs")
        .items
    {
        out.push((
            format!("pvc/{}", pvc.metadata.name.unwrap_or_default()),
            pvc.metadata.uid.unwrap_or_default(),
        ));
    }
    out.sort();
    out
}

async fn uid_of(env: &Env, kind: &str, name: &str) -> String {
    uids(env)
        .await
        .into_iter()
        .find(|(k, _)| k == &format!("{kind}/{name}"))
        .map(|(_, uid)| uid)
        .unwrap_or_else(|| panic!("{kind}/{name} not found"))
}

async fn leases(env: &Env) -> Vec<String> {
    let api = hcp_dr_e2e::sandbox::api_for(
        &env.mgmt,
        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"namespace": "clusters"}}),
    );
    api.list(&Default::default())
        .await
        .expect("leases")
        .items
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .collect()
}

/// The workload keys every member must hold.
fn workload_keys(keys: &BTreeSet<String>) -> BTreeSet<String> {
    keys.iter()
        .filter(|k| {
            k.starts_with(&format!("/kubernetes.io/configmaps/{WORKLOAD_NS}/"))
                || k.starts_with(&format!("/kubernetes.io/secrets/{WORKLOAD_NS}/"))
        })
        .cloned()
        .collect()
}

/// Every member holds the same keys at the same revision (bounded wait for
/// the last writes to reach every member), returned per member.
async fn members_agree(env: &Env) -> Vec<(String, i64, BTreeSet<String>)> {
    let mut last = Vec::new();
    for _ in 0..30 {
        let members = member_keys(&env.mgmt, &env.hcp_ns(), "/")
            .await
            .expect("member keys");
        let agree = members.len() == 3
            && members
                .windows(2)
                .all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2);
        if agree {
            return members;
        }
        last = members
            .iter()
            .map(|(pod, rev, keys)| (pod.clone(), *rev, keys.len()))
            .collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("the members never agreed (pod, revision, keys): {last:?}");
}

const STATUS_FIELDS: [&str; 11] = [
    "hosted_cluster",
    "hcp_namespace",
    "availability_policy",
    "expected_members",
    "access",
    "members",
    "listed_members",
    "leader",
    "revision",
    "problems",
    "healthy",
];
const MEMBER_FIELDS: [&str; 20] = [
    "name",
    "member_id",
    "pod",
    "pod_uid",
    "phase",
    "ready",
    "restarts",
    "state",
    "endpoint",
    "reachable",
    "healthy",
    "leader",
    "raft_term",
    "raft_index",
    "revision",
    "db_size",
    "db_size_in_use",
    "version",
    "alarms",
    "last_error",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_shows_a_crash_looping_member_and_recover_brings_it_back() {
    let env = env("HighlyAvailable").await;
    let journals = env.dir.path().join("state");

    // Healthy: three rows, one leader, one revision, exit 0.
    let (code, report) = status_until(&env, "three members at one revision", |_, r| {
        let revs: BTreeSet<i64> = r["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["revision"].as_i64())
            .collect();
        r["healthy"] == true && revs.len() == 1
    });
    assert_eq!(code, Some(0), "{report:#}");
    for field in STATUS_FIELDS {
        assert!(
            report.get(field).is_some(),
            "status has no `{field}`: {report:#}"
        );
    }
    assert_eq!(report["hosted_cluster"], "clusters/demo");
    assert_eq!(report["hcp_namespace"], "clusters-demo");
    assert_eq!(report["availability_policy"], "HighlyAvailable");
    assert_eq!(report["expected_members"], 3);
    assert_eq!(report["listed_members"], 3);
    assert_eq!(report["access"], "pod-ip");
    assert_eq!(report["problems"], json!([]));
    let rows = report["members"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["etcd-0", "etcd-1", "etcd-2"]);
    assert_eq!(
        rows.iter().filter(|m| m["leader"] == true).count(),
        1,
        "{report:#}"
    );
    let leader = rows.iter().find(|m| m["leader"] == true).unwrap();
    assert_eq!(report["leader"], leader["name"]);
    assert_eq!(report["revision"], leader["revision"]);
    for m in rows {
        for field in MEMBER_FIELDS {
            assert!(m.get(field).is_some(), "member row has no `{field}`: {m:#}");
        }
        assert_eq!(m["pod"], m["name"]);
        assert_eq!(m["phase"], "Running");
        assert_eq!(m["ready"], true);
        assert_eq!(m["state"], "Running");
        assert_eq!(
            (m["reachable"].clone(), m["healthy"].clone()),
            (json!(true), json!(true)),
            "{m:#}"
        );
        assert!(
            m["endpoint"].as_str().unwrap().starts_with("https://127."),
            "{m:#}"
        );
        assert!(m["endpoint"].as_str().unwrap().ends_with(":2379"), "{m:#}");
        assert_eq!(m["raft_term"], leader["raft_term"]);
        assert!(m["raft_index"].as_u64().unwrap() > 0);
        assert!(m["db_size"].as_i64().unwrap() >= m["db_size_in_use"].as_i64().unwrap());
        assert!(m["db_size_in_use"].as_i64().unwrap() > 0);
        assert_eq!(m["alarms"], json!([]));
        assert_eq!(m["last_error"], Value::Null);
        assert!(
            m["member_id"]
                .as_str()
                .is_some_and(|id| !id.is_empty() && id.len() <= 16),
            "{m:#}"
        );
    }
    // the text report says the same
    let out = env.hcp_dr(&["etcd", "status", "--hosted-cluster", "demo"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("etcd of HostedCluster clusters/demo (clusters-demo, HighlyAvailable: 3 member(s) expected): HEALTHY"), "{}", text(&out));
    assert!(
        stdout.contains("MEMBER") && stdout.contains("LAST ERROR"),
        "{}",
        text(&out)
    );

    let before = uids(&env).await;
    let keys_before = member_keys(&env.mgmt, &env.hcp_ns(), "/")
        .await
        .expect("keys");
    let expected_workload = workload_keys(&keys_before[0].2);
    assert_eq!(
        expected_workload.len(),
        2 * WORKLOAD_OBJECTS,
        "the workloads are in etcd"
    );

    // Healthy and no --member: refused, nothing changed, the Lease given back.
    let out = env.hcp_dr(&["etcd", "recover", "--hosted-cluster", "demo"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("etcd recover FAILED at `assess`"),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("is healthy: nothing to recover"),
        "{}",
        text(&out)
    );
    assert!(stdout.contains("--member etcd-N"), "{}", text(&out));
    assert!(
        stdout.contains("everything it changed was undone"),
        "{}",
        text(&out)
    );
    assert_eq!(
        uids(&env).await,
        before,
        "a refused recovery changed pods or volumes"
    );
    assert!(
        leases(&env).await.is_empty(),
        "the Lease was not given back"
    );

    // Dry-run with --member on the healthy cluster: a plan, nothing changed, no journal.
    let journals_before = files(&journals);
    let out = env.hcp_dr(
        &[
            "etcd",
            "recover",
            "--hosted-cluster",
            "demo",
            "--member",
            "etcd-1",
            "--dry-run",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("etcd recover plan (dry run: nothing was changed)"),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains(&format!(
            "delete PersistentVolumeClaim clusters-demo/data-etcd-1 (uid {})",
            uid_of(&env, "pvc", "data-etcd-1").await
        )),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("meanwhile 2 of 3 members keep the quorum: etcd-0, etcd-2"),
        "{}",
        text(&out)
    );
    assert_eq!(
        uids(&env).await,
        before,
        "a dry run changed pods or volumes"
    );
    assert!(leases(&env).await.is_empty());
    assert_eq!(
        files(&journals),
        journals_before,
        "a dry run writes no journal"
    );

    // Break etcd-1: status shows it and exits 1.
    break_member(&env, "etcd-1");
    // (and the other two healthy again: when etcd-1 was the leader, they
    // have none for a moment, and status rightly says so)
    let (code, report) = status_until(&env, "etcd-1 crash-looping and the others healthy", |_, r| {
        let m = member(r, "etcd-1");
        m["reachable"] == false && m["restarts"].as_i64().unwrap_or(0) >= 1 && ["etcd-0", "etcd-2"].iter().all(|o| member(r, o)["healthy"] == true)
    });
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["healthy"], false);
    let broken = member(&report, "etcd-1");
    assert_eq!(broken["healthy"], false);
    assert_eq!(broken["ready"], false);
    assert!(
        broken["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("status: ") && e.contains("Connection refused")),
        "{broken:#}"
    );
    assert!(
        report["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("etcd-1: unreachable")),
        "{report:#}"
    );
    for other in ["etcd-0", "etcd-2"] {
        assert_eq!(member(&report, other)["healthy"], true, "{report:#}");
    }
    let out = env.hcp_dr(&["etcd", "status", "--hosted-cluster", "demo"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("DEGRADED"),
        "{}",
        text(&out)
    );

    // A dry run picks etcd-1 by itself and changes nothing.
    let before = uids(&env).await;
    let out = env.hcp_dr(
        &[
            "etcd",
            "recover",
            "--hosted-cluster",
            "demo",
            "--dry-run",
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let plan = json_report(&out);
    assert_eq!(plan["outcome"], "planned", "{plan:#}");
    assert_eq!(plan["member"], "etcd-1", "{plan:#}");
    assert!(
        plan["reason"].as_str().unwrap().contains("unreachable"),
        "{plan:#}"
    );
    assert_eq!(
        uids(&env).await,
        before,
        "a dry run changed pods or volumes"
    );

    // Recover it.
    let old_pod = uid_of(&env, "pod", "etcd-1").await;
    let old_pvc = uid_of(&env, "pvc", "data-etcd-1").await;
    let out = env.hcp_dr(
        &[
            "etcd",
            "recover",
            "--hosted-cluster",
            "demo",
            "-n",
            "clusters",
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let result = json_report(&out);
    assert_eq!(result["outcome"], "succeeded", "{result:#}");
    assert_eq!(result["member"], "etcd-1");
    assert_eq!(result["old_pod_uid"], old_pod.as_str());
    assert_eq!(result["old_pvc_uid"], old_pvc.as_str());
    let new_pod = uid_of(&env, "pod", "etcd-1").await;
    let new_pvc = uid_of(&env, "pvc", "data-etcd-1").await;
    assert_ne!(new_pod, old_pod);
    assert_ne!(
        new_pvc, old_pvc,
        "a new claim: the member started from an empty volume"
    );
    assert_eq!(result["new_pod_uid"], new_pod.as_str());
    assert_eq!(result["new_pvc_uid"], new_pvc.as_str());
    assert!(
        result["revision_after"].as_i64().unwrap() >= result["revision_before"].as_i64().unwrap(),
        "{result:#}"
    );
    assert!(result["seconds"].as_f64().unwrap() > 0.0);
    assert!(leases(&env).await.is_empty(), "the Lease was not released");

    // Every key is on the rebuilt member, at the others' revision.
    let members = members_agree(&env).await;
    let recovered = members.iter().find(|(pod, _, _)| pod == "etcd-1").unwrap();
    assert_eq!(
        workload_keys(&recovered.2),
        expected_workload,
        "workload keys on the recovered member"
    );
    let (code, report) = status_until(&env, "a healthy cluster again", |code, r| {
        code == Some(0)
            && r["members"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["revision"].as_i64())
                .collect::<BTreeSet<_>>()
                .len()
                == 1
    });
    assert_eq!(code, Some(0));
    assert_eq!(member(&report, "etcd-1")["pod_uid"], new_pod.as_str());
    assert_eq!(member(&report, "etcd-1")["healthy"], true);
    assert_eq!(report["listed_members"], 3);

    // The recreated pod's reset-member cannot list the members (as when the
    // etcd-client Service has no ready endpoint during the election that
    // removing a leader starts): etcd starts as a cluster of its own. The
    // recovery sees the old member id still listed, deletes the new claim and
    // pod again, and the member joins on the next try.
    env.sandbox.fail_next_reset_member("mgmt-a").expect("arm the reset-member fault");
    let out = env.hcp_dr(&["etcd", "recover", "--hosted-cluster", "demo", "--member", "etcd-1", "-o", "json"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let result = json_report(&out);
    assert_eq!(result["outcome"], "succeeded", "{result:#}");
    assert!(!env.sandbox.dir.join("mgmt-a/state/reset-member-unreachable").exists(), "the reset-member fault was never used");
    let rejoin = &result["stages"].as_array().unwrap().iter().find(|s| s["name"] == "rejoin").unwrap()["output"];
    let resets = rejoin["resets"].as_array().expect("resets");
    assert_eq!(resets.len(), 1, "{rejoin:#}");
    assert!(resets[0].as_str().unwrap().contains("started as a cluster of its own"), "{rejoin:#}");
    assert!(result["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().contains("its reset-member could not reach the cluster")), "{result:#}");
    let (code, report) = status_until(&env, "one healthy cluster after the stranded member was replaced again", |code, r| code == Some(0) && r["listed_members"] == 3);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(member(&report, "etcd-1")["pod_uid"], uid_of(&env, "pod", "etcd-1").await.as_str());
    assert_one_etcd_cluster(&env.mgmt, &env.hcp_ns(), 3, "after the stranded member rejoined").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recover_refuses_when_two_members_are_down() {
    let env = env("HighlyAvailable").await;
    status_until(&env, "a healthy cluster", |code, _| code == Some(0));
    break_member(&env, "etcd-1");
    break_member(&env, "etcd-2");
    let (code, _) = status_until(&env, "two members down", |_, r| {
        ["etcd-1", "etcd-2"]
            .iter()
            .all(|m| member(r, m)["reachable"] == false)
    });
    assert_eq!(code, Some(1));
    let before = uids(&env).await;
    for extra in [None, Some("etcd-1")] {
        let mut args = vec!["etcd", "recover", "--hosted-cluster", "demo"];
        if let Some(m) = extra {
            args.extend(["--member", m]);
        }
        let out = env.hcp_dr(&args, &[]);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("etcd recover FAILED at `assess`"),
            "{}",
            text(&out)
        );
        // etcd-0 may count too: without a quorum it cannot serve a linearizable read
        assert!(
            stdout.contains(" of the 3 etcd members of HostedCluster clusters/demo are failing"),
            "{}",
            text(&out)
        );
        assert!(
            stdout.contains("etcd-1 (unreachable") && stdout.contains("etcd-2 (unreachable"),
            "{}",
            text(&out)
        );
        assert!(stdout.contains("hcp-dr etcd restore"), "{}", text(&out));
        assert_eq!(
            uids(&env).await,
            before,
            "{extra:?}: pods or volumes changed"
        );
        assert!(
            leases(&env).await.is_empty(),
            "{extra:?}: the Lease was left"
        );
    }
}


#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_rejoin_then_resume_completes() {
    let env = env("HighlyAvailable").await;
    status_until(&env, "a healthy cluster", |code, _| code == Some(0));
    break_member(&env, "etcd-2");
    status_until(&env, "etcd-2 down", |_, r| {
        member(r, "etcd-2")["reachable"] == false
    });
    let old_pvc = uid_of(&env, "pvc", "data-etcd-2").await;
    let journal = env.dir.path().join("recover.jsonl");
    let mut child = env
        .command(
            &[
                "etcd",
                "recover",
                "--hosted-cluster",
                "demo",
                "--journal",
                journal.to_str().unwrap(),
            ],
            &[("HCP_DR_TEST_HOLD_IN", "rejoin")],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_stage(&journal, "rejoin");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(
        leases(&env).await,
        vec!["hcp-dr-lock-demo".to_string()],
        "the killed run still holds its Lease"
    );

    let out = env.hcp_dr(
        &[
            "etcd",
            "recover",
            "--resume",
            journal.to_str().unwrap(),
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let result = json_report(&out);
    let statuses: Vec<Value> = result["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json!([s["name"], s["status"]]))
        .collect();
    assert_eq!(
        statuses,
        vec![
            json!(["lock", "resumed"]),
            json!(["assess", "resumed"]),
            json!(["replace", "resumed"]),
            json!(["rejoin", "succeeded"]),
            json!(["unlock", "succeeded"]),
        ]
    );
    assert_eq!(result["member"], "etcd-2");
    assert_eq!(result["old_pvc_uid"], old_pvc.as_str());
    let new_pvc = uid_of(&env, "pvc", "data-etcd-2").await;
    assert_ne!(new_pvc, old_pvc);
    assert_eq!(result["new_pvc_uid"], new_pvc.as_str());
    assert!(
        leases(&env).await.is_empty(),
        "the resumed run released the Lease"
    );
    let members = members_agree(&env).await;
    let expected = workload_keys(&members[0].2);
    assert_eq!(expected.len(), 2 * WORKLOAD_OBJECTS);
    assert!(
        members
            .iter()
            .all(|(_, _, keys)| workload_keys(keys) == expected)
    );
    let (code, _) = status_until(&env, "a healthy cluster again", |code, _| code == Some(0));
    assert_eq!(code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_replica_is_refused_and_bad_input_exits_2() {
    let env = env("SingleReplica").await;
    let (code, report) = status_until(&env, "a healthy single member", |code, _| code == Some(0));
    assert_eq!(code, Some(0));
    assert_eq!(report["members"].as_array().unwrap().len(), 1);
    assert_eq!(report["expected_members"], 1);
    assert_eq!(member(&report, "etcd-0")["leader"], true);

    // The same through the API server's pods/portforward instead of pod IPs.
    let out = env.hcp_dr(
        &[
            "etcd",
            "status",
            "--hosted-cluster",
            "demo",
            "--etcd-access",
            "port-forward",
            "-o",
            "json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let forwarded = json_report(&out);
    assert_eq!(forwarded["access"], "port-forward");
    assert_eq!(
        member(&forwarded, "etcd-0")["healthy"],
        true,
        "{forwarded:#}"
    );
    assert_eq!(
        member(&forwarded, "etcd-0")["revision"],
        member(&report, "etcd-0")["revision"]
    );

    let before = uids(&env).await;
    let out = env.hcp_dr(
        &[
            "etcd",
            "recover",
            "--hosted-cluster",
            "demo",
            "--member",
            "etcd-0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("is SingleReplica"), "{}", text(&out));
    assert!(stdout.contains("hcp-dr etcd restore"), "{}", text(&out));
    assert_eq!(uids(&env).await, before);
    assert!(leases(&env).await.is_empty());

    for (args, message) in [
        (
            vec!["etcd", "status", "--hosted-cluster", "nope"],
            "HostedCluster clusters/nope not found",
        ),
        (
            vec!["etcd", "status", "--hosted-cluster", "Bad_Name"],
            "is not a valid Kubernetes name",
        ),
        (
            vec![
                "etcd",
                "recover",
                "--hosted-cluster",
                "demo",
                "--wait-timeout",
                "5s",
            ],
            "too short",
        ),
        (
            vec![
                "etcd",
                "recover",
                "--hosted-cluster",
                "demo",
                "--wait-timeout",
                "soon",
            ],
            "not a duration",
        ),
    ] {
        let out = env.hcp_dr(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(message), "{args:?}: {}", text(&out));
    }

    let out = env.hcp_dr(&["playbook", "show", "etcd-recover"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for stage in ["lock", "assess", "replace", "rejoin", "unlock"] {
        assert!(stdout.contains(stage), "{stage}: {}", text(&out));
    }

    // secrets never appear in the output
    let secret =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(env.mgmt.clone(), &env.hcp_ns())
            .get("etcd-client-tls")
            .await
            .unwrap();
    let key = String::from_utf8(secret.data.unwrap()["etcd-client.key"].0.clone()).unwrap();
    let key_line = key.lines().nth(1).unwrap().to_string();
    let (_, _, out) = status(&env);
    assert!(
        !text(&out).contains(&key_line),
        "the etcd client key was printed"
    );
}
