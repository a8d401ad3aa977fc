//! HyperShift's `etcd-init` in the sandbox, as shipped and as PR 9048 fixes
//! it: a HighlyAvailable HostedCluster restored through `restoreSnapshotURL`
//! alone is three single-member clusters with the shipped script and one
//! three-member cluster with the fixed one; the HCP's `EtcdSnapshotRestored`
//! and the StatefulSet template follow the control-plane operator. Also
//! hcp-dr's restore pods when their claims bind late or their node
//! selection fits no node, and the speed of the emulated revision bump.

use crate::operator_support;

use std::collections::BTreeSet;
use std::time::Instant;

use base64::Engine as _;
use hcp_dr_e2e::operator::EtcdInit;
use hcp_dr_e2e::operator::etcd_init::FIXED_BUMP;
use hcp_dr_e2e::procs::etcd::{ClientTls, EtcdProcess, connect_client, restore_scratch};
use operator_support::*;
use serde_json::{Value, json};
use sha2::Digest as _;

fn init_logs() {
    let _ = tracing_subscriber::fmt().with_env_filter("hcp_dr_e2e=info").with_test_writer().try_init();
}

/// A snapshot of a plain etcd holding `keys` (under `/sandbox-test/`), and
/// its revision.
async fn snapshot_with(dir: &std::path::Path, keys: usize) -> (Vec<u8>, i64) {
    let etcd = match EtcdProcess::start_plain(dir).await {
        Ok(e) => e,
        Err(e) => panic!("starting etcd failed (install it: apt-get install etcd-server etcd-client): {e}"),
    };
    let mut client = connect_client(&[etcd.client_url()], None).await.expect("connect");
    let mut revision = 0;
    for i in 0..keys {
        let put = client.put(format!("/sandbox-test/key-{i}"), format!("value-{i}"), None).await.expect("put");
        revision = put.header().expect("header").revision();
    }
    let mut snapshot = Vec::new();
    let mut stream = client.snapshot().await.expect("snapshot");
    while let Some(chunk) = stream.message().await.expect("chunk") {
        snapshot.extend_from_slice(chunk.blob());
    }
    (snapshot, revision)
}

fn names(list: Option<&Value>) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|c| c["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Each member of `hcp_ns` (`replicas` of them) ready, with its client.
async fn members(mgmt: &Mgmt, hcp_ns: &str, replicas: usize) -> Vec<(Value, etcd_client::Client)> {
    let pods = mgmt.api("", "v1", "Pod", "pods", Some(hcp_ns));
    let mut out = Vec::new();
    for i in 0..replicas {
        let name = format!("etcd-{i}");
        let pod = wait_for(&format!("{name} ready"), || async {
            let pod = mgmt.get(&pods, &name).await?;
            has_condition(&pod, "Ready", "True").then_some(pod)
        })
        .await;
        let ip = pod["status"]["podIP"].as_str().expect("pod IP").to_string();
        let tls: ClientTls = mgmt.etcd_tls(hcp_ns, &format!("{name}.etcd-discovery.{hcp_ns}.svc")).await;
        let client = connect_client(&[format!("https://{ip}:2379")], Some(&tls)).await.expect("member connects over TLS");
        out.push((pod, client));
    }
    out
}

/// The HCP's `EtcdSnapshotRestored` once set, and the etcd template once it
/// no longer carries `etcd-init`.
async fn restore_finished(mgmt: &Mgmt, hcp_ns: &str, name: &str) -> Value {
    let hcps = mgmt.api("hypershift.openshift.io", "v1beta1", "HostedControlPlane", "hostedcontrolplanes", Some(hcp_ns));
    let hcp = wait_for("EtcdSnapshotRestored=True on the HostedControlPlane", || async {
        let hcp = mgmt.get(&hcps, name).await?;
        has_condition(&hcp, "EtcdSnapshotRestored", "True").then_some(hcp)
    })
    .await;
    let condition = hcp["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "EtcdSnapshotRestored"))
        .cloned()
        .expect("condition");
    assert_eq!(condition["reason"], "AsExpected");
    let sets = mgmt.api("apps", "v1", "StatefulSet", "statefulsets", Some(hcp_ns));
    wait_for("etcd-init gone from the etcd StatefulSet's template", || async {
        let sts = mgmt.get(&sets, "etcd").await?;
        let init = names(sts.pointer("/spec/template/spec/initContainers"));
        (!init.iter().any(|n| n == "etcd-init")).then_some(())
    })
    .await;
    condition
}

/// What every pod says of its init containers: all completed, in `order`.
fn assert_init_statuses(pod: &Value, order: &[&str]) {
    assert_eq!(names(pod.pointer("/spec/initContainers")), order, "{} init containers", pod["metadata"]["name"]);
    let statuses = pod["status"]["initContainerStatuses"].as_array().expect("initContainerStatuses");
    assert_eq!(statuses.iter().filter_map(|s| s["name"].as_str()).collect::<Vec<_>>(), order);
    for s in statuses {
        assert_eq!(s["ready"], true, "{s}");
        assert_eq!(s["state"]["terminated"]["exitCode"], 0, "{s}");
        assert_eq!(s["state"]["terminated"]["reason"], "Completed", "{s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shipped_etcd_init_splits_a_highly_available_restore() {
    init_logs();
    let mgmt = Mgmt::start("mgmt-a").await;
    let (snapshot, _) = snapshot_with(&mgmt.dir.path().join("source"), 5).await;
    let (url, server) = serve_snapshot(&mgmt.ca, snapshot).await;
    mgmt.create_hosted_cluster("split", "HighlyAvailable", 0, Some(&url)).await;
    let hcp_ns = "clusters-split";
    let mut members = members(&mgmt, hcp_ns, 3).await;
    let condition = restore_finished(&mgmt, hcp_ns, "split").await;
    eprintln!("EtcdSnapshotRestored: {condition}");
    let pods = mgmt.api("", "v1", "Pod", "pods", Some(hcp_ns));
    for i in 0..3 {
        let pod = mgmt.get(&pods, &format!("etcd-{i}")).await.expect("pod");
        assert_init_statuses(&pod, &["ensure-dns", "reset-member", "etcd-init"]);
    }

    // each member restored etcd's default one-member cluster: alone
    for (i, (_, client)) in members.iter_mut().enumerate() {
        let list = client.member_list().await.expect("member list");
        let listed: Vec<(String, Vec<String>)> = list.members().iter().map(|m| (m.name().to_string(), m.peer_urls().to_vec())).collect();
        eprintln!("etcd-{i} lists {listed:?}");
        assert_eq!(listed.len(), 1, "etcd-{i} is a cluster of its own: {listed:?}");
        assert_eq!(listed[0].1, vec!["http://localhost:2380".to_string()], "the default member's peer URL");
        let got = client.get("/sandbox-test/key-0", None).await.expect("get");
        assert_eq!(got.kvs().len(), 1, "etcd-{i} restored the snapshot");
    }
    members[0].1.put("/sandbox-test/written-through-etcd-0", "x", None).await.expect("put through etcd-0");
    for (i, (_, client)) in members.iter_mut().enumerate() {
        let got = client.get("/sandbox-test/written-through-etcd-0", None).await.expect("get");
        assert_eq!(got.kvs().len(), usize::from(i == 0), "etcd-{i}: a key written through etcd-0 is only there");
    }
    server.abort();
    mgmt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_etcd_init_restores_one_cluster() {
    init_logs();
    let mgmt = Mgmt::start_with_etcd_init("mgmt-a", EtcdInit::Fixed).await;
    let (snapshot, revision) = snapshot_with(&mgmt.dir.path().join("source"), 5).await;
    let (url, server) = serve_snapshot(&mgmt.ca, snapshot).await;
    mgmt.create_hosted_cluster("whole", "HighlyAvailable", 0, Some(&url)).await;
    let hcp_ns = "clusters-whole";
    let started = Instant::now();
    let mut members = members(&mgmt, hcp_ns, 3).await;
    eprintln!("three members ready {:.1}s after the HostedCluster was created", started.elapsed().as_secs_f64());
    restore_finished(&mgmt, hcp_ns, "whole").await;
    let pods = mgmt.api("", "v1", "Pod", "pods", Some(hcp_ns));
    for i in 0..3 {
        let pod = mgmt.get(&pods, &format!("etcd-{i}")).await.expect("pod");
        assert_init_statuses(&pod, &["ensure-dns", "etcd-init", "reset-member"]);
    }

    let mut views = Vec::new();
    for (i, (_, client)) in members.iter_mut().enumerate() {
        let list = client.member_list().await.expect("member list");
        let view: BTreeSet<(u64, String)> = list.members().iter().map(|m| (m.id(), m.name().to_string())).collect();
        eprintln!("etcd-{i} lists {view:?}");
        assert_eq!(view.len(), 3, "etcd-{i} lists three members");
        views.push(view);
    }
    assert!(views.windows(2).all(|w| w[0] == w[1]), "every member lists the same three: {views:?}");
    let names: BTreeSet<&str> = views[0].iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["etcd-0", "etcd-1", "etcd-2"]));

    let put = members[0].1.put("/sandbox-test/written-through-etcd-0", "x", None).await.expect("put through etcd-0");
    let now = put.header().expect("header").revision();
    assert!(now > revision + FIXED_BUMP as i64, "revision {now}: the snapshot's {revision} bumped by {FIXED_BUMP}");
    let old = members[1].1.get("/sandbox-test/key-0", Some(etcd_client::GetOptions::new().with_revision(revision))).await;
    assert!(old.is_err_and(|e| e.to_string().contains("compacted")), "the history before the bump is compacted");
    for (i, (_, client)) in members.iter_mut().enumerate() {
        let got = client.get("/sandbox-test/written-through-etcd-0", None).await.expect("get");
        assert_eq!(got.kvs().len(), 1, "etcd-{i} reads the key written through etcd-0");
    }
    server.abort();
    mgmt.stop().await;
}

/// A pod as hcp-dr's `etcd restore` makes it, restoring member `member` of
/// namespace `ns` (a one-member cluster) from the URL in Secret
/// `restore-url`, on claim `data-<member>`.
fn restore_pod(ns: &str, member: &str, sha256: &str, extra_spec: Value) -> Value {
    let env = |n: &str, v: &str| json!({"name": n, "value": v});
    let peer = format!("https://{member}.etcd-discovery.{ns}.svc:2380");
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("restore-{member}"), "namespace": ns,
            "annotations": {"hcp-dr.openshift.io/restore-script": "v1"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "restore", "image": "etcd", "command": ["/bin/bash", "-c", "true"],
                "env": [
                    {"name": "RESTORE_SNAPSHOT_URL", "valueFrom": {"secretKeyRef": {"name": "restore-url", "key": "url"}}},
                    env("RESTORE_SNAPSHOT_SHA256", sha256), env("RESTORE_NAME", member),
                    env("RESTORE_INITIAL_CLUSTER", &format!("{member}={peer}")),
                    env("RESTORE_INITIAL_CLUSTER_TOKEN", "etcd-cluster"), env("RESTORE_PEER_URL", &peer),
                    env("RESTORE_DATA_DIR", "/var/lib/data"), env("RESTORE_BUMP_REVISION", "1000"),
                ],
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{member}")}}],
        },
    });
    for (k, v) in extra_spec.as_object().into_iter().flatten() {
        pod["spec"][k] = v.clone();
    }
    pod
}

fn claim(ns: &str, name: &str, class: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}})
}

fn scheduled(pod: &Value) -> Option<Value> {
    pod["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "PodScheduled").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restore_pods_wait_for_their_claims_and_a_node_that_fits() {
    init_logs();
    let mgmt = Mgmt::start("mgmt-a").await;
    let ns = "seed";
    mgmt.create(&mgmt.api("", "v1", "Namespace", "namespaces", None), json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await;
    mgmt.create(&mgmt.api("storage.k8s.io", "v1", "StorageClass", "storageclasses", None), json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "late"},
        "provisioner": hcp_dr_e2e::operator::snapshots::SANDBOX_CSI_DRIVER, "volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let (snapshot, revision) = snapshot_with(&mgmt.dir.path().join("source"), 3).await;
    let sha: String = sha2::Sha256::digest(&snapshot).iter().map(|b| format!("{b:02x}")).collect();
    let (url, server) = serve_snapshot(&mgmt.ca, snapshot).await;
    let secrets = mgmt.api("", "v1", "Secret", "secrets", Some(ns));
    mgmt.create(&secrets, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "restore-url"},
        "data": {"url": base64::engine::general_purpose::STANDARD.encode(&url)}}))
        .await;
    let pods = mgmt.api("", "v1", "Pod", "pods", Some(ns));
    let claims = mgmt.api("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", Some(ns));

    // no claim yet: Pending, unschedulable
    mgmt.create(&pods, restore_pod(ns, "etcd-0", &sha, json!({}))).await;
    let waiting = wait_for("restore-etcd-0 unschedulable without its claim", || async {
        let pod = mgmt.get(&pods, "restore-etcd-0").await?;
        scheduled(&pod).filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(waiting["reason"], "Unschedulable");
    assert_eq!(waiting["message"], "0/1 nodes are available: persistentvolumeclaim \"data-etcd-0\" not found.");
    // its claim, of a WaitForFirstConsumer class: bound for the pod, which then runs
    mgmt.create(&claims, claim(ns, "data-etcd-0", "late")).await;
    let done = wait_for("restore-etcd-0 finished", || async {
        let pod = mgmt.get(&pods, "restore-etcd-0").await?;
        matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(pod)
    })
    .await;
    assert_eq!(done["status"]["phase"], "Succeeded", "{}", done["status"]);
    assert_eq!(scheduled(&done).map(|c| c["status"].clone()), Some(json!("True")));
    let bound = mgmt.get(&claims, "data-etcd-0").await.expect("claim");
    assert_eq!(bound["status"]["phase"], "Bound");
    let pod_ip = bound["metadata"]["annotations"]["sandbox.hcp-dr.io/pod-ip"].as_str().expect("the claim records the member's pod IP");
    eprintln!("data-etcd-0 bound with pod IP {pod_ip}");
    // what the pod restored: the snapshot, bumped by RESTORE_BUMP_REVISION
    let db = mgmt.dir.path().join("operator/pv").join(ns).join("data-etcd-0/data/member/snap/db");
    assert!(db.is_file(), "{} restored", db.display());
    // started on a copy (plain http: the member alone needs no peer)
    let copy = tempfile::tempdir().expect("tempdir");
    let status = std::process::Command::new("cp").arg("-r").arg(db.parent().and_then(|p| p.parent()).and_then(|p| p.parent()).expect("data dir")).arg(copy.path().join("data")).status().expect("cp");
    assert!(status.success());
    let ip = std::net::IpAddr::from([127, 0, 0, 1]);
    let ports = hcp_dr_e2e::procs::free_ports(ip, 2).expect("ports");
    let member = EtcdProcess::start(hcp_dr_e2e::procs::etcd::EtcdMemberConfig {
        name: "etcd-0".into(),
        data_dir: copy.path().join("data"),
        log_dir: copy.path().to_path_buf(),
        client_ip: ip,
        client_port: ports[0],
        peer_port: ports[1],
        initial_cluster: vec![("etcd-0".into(), format!("http://127.0.0.1:{}", ports[1]))],
        initial_cluster_state: hcp_dr_e2e::procs::etcd::ClusterState::New,
        tls: None,
        quota_backend_bytes: None,
    })
    .expect("start the restored member");
    member.wait_healthy(std::time::Duration::from_secs(30), None).await.expect("the restored member runs");
    let mut c = connect_client(&[member.client_url()], None).await.expect("connect");
    let got = c.get("/sandbox-test/key-0", None).await.expect("get");
    assert_eq!(got.kvs().len(), 1, "the snapshot's keys");
    assert_eq!(got.header().expect("header").revision(), revision + 1000, "bumped by RESTORE_BUMP_REVISION");
    let list = c.member_list().await.expect("members");
    assert_eq!(list.members().iter().map(|m| m.name().to_string()).collect::<Vec<_>>(), ["etcd-0"]);
    assert_eq!(list.members()[0].peer_urls(), [format!("https://{pod_ip}:2380")], "restored as etcd-0 at its pod IP");
    drop(member);

    // a node selection no node fits: Pending with the scheduler's words, its
    // WaitForFirstConsumer claim never bound
    mgmt.create(&claims, claim(ns, "data-etcd-1", "late")).await;
    let misplaced = restore_pod(ns, "etcd-1", &sha, json!({"nodeSelector": {"hypershift.openshift.io/control-plane": "true"}}));
    mgmt.create(&pods, misplaced).await;
    let unschedulable = wait_for("restore-etcd-1 unschedulable", || async {
        let pod = mgmt.get(&pods, "restore-etcd-1").await?;
        scheduled(&pod).filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(unschedulable["reason"], "Unschedulable");
    assert_eq!(unschedulable["message"], "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.");
    let pod = mgmt.get(&pods, "restore-etcd-1").await.expect("pod");
    assert_eq!(pod["status"]["phase"], "Pending");
    let unbound = mgmt.get(&claims, "data-etcd-1").await.expect("claim");
    assert_ne!(unbound["status"]["phase"], "Bound", "no node fits its only consumer: not bound");
    server.abort();
    mgmt.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_emulated_bump_of_100000_revisions() {
    init_logs();
    let dir = tempfile::tempdir().expect("tempdir");
    let (snapshot, revision) = snapshot_with(&dir.path().join("source"), 3).await;
    let file = dir.path().join("snapshot.db");
    std::fs::write(&file, &snapshot).expect("write");
    let sha: String = sha2::Sha256::digest(&snapshot).iter().map(|b| format!("{b:02x}")).collect();
    let cache = hcp_dr_e2e::operator::bump::BumpCache::new(&dir.path().join("state"));
    let user = cache.enter("pod-uid-1");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let started = Instant::now();
    let bumped = cache.bumped(&user, &file, &sha, 100_000, &work).await.expect("bumped");
    let first = started.elapsed();
    let started = Instant::now();
    let again = cache.bumped(&user, &file, &sha, 100_000, &work).await.expect("bumped again");
    let second = started.elapsed();
    eprintln!(
        "emulated --bump-revision 100000: {:.2}s; the same bump for another member of the restore: {:.3}s (reused); bumped snapshot {} bytes",
        first.as_secs_f64(),
        second.as_secs_f64(),
        std::fs::metadata(&bumped).map(|m| m.len()).unwrap_or_default()
    );
    assert_eq!(bumped, again, "computed once per snapshot and bump");
    let mut member = restore_scratch(&bumped, &dir.path().join("check")).await.expect("restores");
    let mut client = connect_client(&[member.client_url()], None).await.expect("connect");
    let got = client.get("/sandbox-test/key-2", None).await.expect("get");
    assert_eq!(got.kvs().len(), 1, "the keys are kept");
    assert_eq!(got.header().expect("header").revision(), revision + 100_000);
    let before = client.get("/sandbox-test/key-2", Some(etcd_client::GetOptions::new().with_revision(revision + 99_999))).await;
    assert!(before.is_err_and(|e| e.to_string().contains("compacted")), "compacted at the new revision");
    member.kill();
    drop(user);
    cache.collect(&Default::default(), false);
    assert!(cache.cached().is_empty(), "removed once nobody needs it");
}
