//! The sandbox on management clusters it did not start (issue 12): the
//! project's API emulator run on its own, as an existing cluster would run
//! (its own process, etcd, CA and kubeconfig, no CRDs), twice; the drill
//! with `--mgmt-kubeconfig` twice against them; the refusals that must
//! leave such a cluster untouched; and `down` removing only what the
//! sandbox created.

use std::path::Path;
use std::process::{Command, Output};

use hcp_dr_e2e::sandbox::UpOptions;
use support::existing::{ExistingCluster, sandbox_bin};
use support::{json_report, text};

use crate::support;

fn sandbox(args: &[&str]) -> Output {
    Command::new(sandbox_bin()).args(args).output().expect("run hcp-dr-sandbox")
}

const OURS: [&str; 3] = [
    "customresourcedefinition.apiextensions.k8s.io/hostedclusters.hypershift.openshift.io",
    "customresourcedefinition.apiextensions.k8s.io/nodepools.hypershift.openshift.io",
    "customresourcedefinition.apiextensions.k8s.io/clusters.cluster.x-k8s.io",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drill_runs_on_two_existing_api_servers_and_leaves_them_as_it_found_them() {
    let tmp = tempfile::tempdir().unwrap();
    let a = ExistingCluster::start(tmp.path(), "ext-a");
    let b = ExistingCluster::start(tmp.path(), "ext-b");
    // something of the user's own on each, which the sandbox must leave
    for cluster in [&a, &b] {
        let out = cluster.kubectl(&["create", "namespace", "users-own"]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let namespaces_before = (a.names("namespaces"), b.names("namespaces"));
    assert!(a.names("crd").is_empty(), "an existing cluster of this test starts without CRDs");

    let opts = UpOptions { mgmt_kubeconfigs: vec![a.kubeconfig.clone(), b.kubeconfig.clone()], force: false, ..Default::default() };
    let bin = Path::new(env!("CARGO_BIN_EXE_hcp-dr"));
    let report = hcp_dr_e2e::drill::run_with(&tmp.path().join("sb"), bin, &opts).await.expect("drill on the existing clusters");

    // the same end state as the drill on emulated clusters (tests/suite/drill.rs)
    let steps: Vec<&str> = report.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(steps, support::DRILL_STEPS);
    assert_eq!(report.members.len(), 3);
    assert!(report.members.iter().all(|m| m.workload_keys == 40), "{:?}", report.members);
    let rendered = report.render();
    assert!(rendered.contains("Available on mgmt-b, 3 members each with all 40 workload keys"), "{rendered}");
    assert!(rendered.contains("(existing, from --mgmt-kubeconfig)"), "{rendered}");
    assert!(report.not_yet_available.is_empty());

    // the clean-up: what the sandbox created is gone, the rest is there
    let cleanup = report.cleanup.join("\n");
    assert!(cleanup.contains("mgmt-b (") && cleanup.contains("removed HostedCluster clusters/demo"), "{cleanup}");
    assert!(cleanup.contains("removed CustomResourceDefinition hostedclusters.hypershift.openshift.io"), "{cleanup}");
    assert!(!cleanup.contains(hcp_dr_e2e::sandbox::NOT_REMOVED), "{cleanup}");
    assert_eq!(a.names("namespaces"), namespaces_before.0, "{cleanup}");
    assert_eq!(b.names("namespaces"), namespaces_before.1, "{cleanup}");
    for cluster in [&a, &b] {
        let crds = cluster.names("crd");
        for ours in OURS {
            assert!(!crds.contains(&ours.to_string()), "{ours} left: {crds:?}\n{cleanup}");
        }
        assert!(crds.is_empty(), "CRDs left: {crds:?}\n{cleanup}");
    }
}

#[test]
fn bad_clusters_are_refused_before_anything_is_created_and_down_removes_what_up_made() {
    let tmp = tempfile::tempdir().unwrap();
    let a = ExistingCluster::start(tmp.path(), "ext-a");
    let dir = tmp.path().join("sb");
    let d = dir.to_str().unwrap();
    let ka = a.kubeconfig.to_str().unwrap();
    let refused = |args: &[&str], says: &str| {
        let mut all = vec!["up", "--dir", d];
        all.extend_from_slice(args);
        let out = sandbox(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{args:?} should say {says:?}: {}", text(&out));
        assert!(!dir.exists(), "{args:?}: the sandbox directory was created");
        assert!(a.names("crd").is_empty(), "{args:?}: CRDs were installed");
    };

    // one cluster given twice, by the same file and by a copy of it
    refused(&["--mgmt-kubeconfig", ka, "--mgmt-kubeconfig", ka], "name the same cluster");
    let copy = tmp.path().join("copy.kubeconfig");
    std::fs::copy(&a.kubeconfig, &copy).unwrap();
    refused(&["--mgmt-kubeconfig", ka, "--mgmt-kubeconfig", copy.to_str().unwrap()], "name the same cluster");
    // a server that does not answer
    let dead = tmp.path().join("dead.kubeconfig");
    let text_a = std::fs::read_to_string(&a.kubeconfig).unwrap();
    let server = text_a.lines().find_map(|l| l.trim().strip_prefix("server: ")).expect("server line").trim().to_string();
    std::fs::write(&dead, text_a.replace(&server, "https://127.0.0.1:1")).unwrap();
    refused(&["--mgmt-kubeconfig", dead.to_str().unwrap()], "does not answer");
    // not a kubeconfig
    refused(&["--mgmt-kubeconfig", tmp.path().join("absent").to_str().unwrap()], "not a readable kubeconfig");
    // the mode and the webhook address: a value that is none, or given without a cluster
    refused(&["--mgmt-kubeconfig", ka, "--controllers", "kubelet"], "invalid value 'kubelet' for '--controllers");
    refused(&["--mgmt-kubeconfig", ka, "--webhook-address", "kind-gateway"], "invalid value 'kind-gateway' for '--webhook-address");
    refused(&["--controllers", "cluster"], "--mgmt-kubeconfig");
    // a user without permissions: every missing one is named
    let out = sandbox(&["up", "--dir", d, "--mgmt-kubeconfig", a.noaccess.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for missing in ["create customresourcedefinitions.apiextensions.k8s.io", "patch pods/status", "* hostedclusters"] {
        if missing.starts_with('*') {
            assert!(err.contains("* *.hypershift.openshift.io"), "{err}");
        } else {
            assert!(err.contains(missing), "{missing} not named: {err}");
        }
    }
    assert!(!dir.exists());
    // a HyperShift operator runs there
    let out = a.kubectl(&["create", "namespace", "hypershift"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = a.kubectl(&["create", "deployment", "operator", "-n", "hypershift", "--image=quay.io/hypershift/hypershift:latest"]);
    assert!(out.status.success(), "{}", text(&out));
    refused(&["--mgmt-kubeconfig", ka], "runs a HyperShift operator (Deployment hypershift/operator)");
    let out = a.kubectl(&["delete", "namespace", "hypershift", "--wait=true"]);
    assert!(out.status.success(), "{}", text(&out));

    // a kube-controller-manager runs there (its leader Lease renewed just now)
    let lease = tmp.path().join("kcm-lease.json");
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let lease_json = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kube-controller-manager", "namespace": "kube-system"},
        "spec": {"holderIdentity": "control-plane_0b1c", "leaseDurationSeconds": 15, "renewTime": now, "acquireTime": now}});
    std::fs::write(&lease, lease_json.to_string()).unwrap();
    let out = a.kubectl(&["create", "-f", lease.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    // no longer refused: the sandbox becomes a kubelet there (its Node,
    // tainted, with a Lease; the PriorityClasses and StorageClass a real
    // cluster needs), and down removes all of it
    let namespaces_before = a.names("namespaces");
    let kubelet_dir = tmp.path().join("sb-kubelet");
    let kd = kubelet_dir.to_str().unwrap();
    let out = sandbox(&["up", "--dir", kd, "--detach", "--mgmt-kubeconfig", ka]);
    assert!(out.status.success(), "{}", text(&out));
    let down = support::existing::Down(kubelet_dir.clone());
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(kubelet_dir.join("sandbox.json")).unwrap()).unwrap();
    assert_eq!(state["clusters"][0]["external"]["footprint"]["controllers"], "cluster", "{state:#}");
    // three Nodes, one per zone (etcd members go one per node and zone)
    for (i, zone) in ["a", "b", "c"].iter().enumerate() {
        let name = format!("mgmt-a-control-plane-{i}");
        let out = a.kubectl(&["get", "node", &name, "-o", "json"]);
        assert!(out.status.success(), "the sandbox registered its Node {name}: {}", text(&out));
        let node: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(node["metadata"]["labels"]["sandbox.hcp-dr.io/kubelet"], "true", "{node:#}");
        assert_eq!(node["metadata"]["labels"]["topology.kubernetes.io/zone"], format!("mgmt-a-zone-{zone}"), "{node:#}");
        assert_eq!(node["spec"]["taints"][0]["key"], "sandbox.hcp-dr.io/kubelet", "{node:#}");
        let ready = node["status"]["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{node:#}");
        let out = a.kubectl(&["get", "lease", &name, "-n", "kube-node-lease", "-o", "jsonpath={.spec.holderIdentity}"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), name, "{}", text(&out));
    }
    for object in ["priorityclass/hypershift-etcd", "priorityclass/hypershift-api-critical", "storageclass/sandbox-local"] {
        let out = a.kubectl(&["get", object, "-o", "name"]);
        assert!(out.status.success(), "{object}: {}", text(&out));
    }
    let out = sandbox(&["down", "--dir", kd]);
    drop(down);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    for removed in ["removed Nodes mgmt-a-control-plane-0, mgmt-a-control-plane-1, mgmt-a-control-plane-2", "removed PriorityClass hypershift-etcd", "removed StorageClass sandbox-local"] {
        assert!(said.contains(removed), "{removed}: {said}");
    }
    for kind in ["nodes", "priorityclasses", "storageclasses", "crd"] {
        assert!(a.names(kind).is_empty(), "{kind} left: {said}");
    }
    assert_eq!(a.names("namespaces"), namespaces_before, "{said}");
    let out = a.kubectl(&["delete", "lease", "kube-controller-manager", "-n", "kube-system"]);
    assert!(out.status.success(), "{}", text(&out));

    // up --detach on it (mgmt-b emulated), then down: the CRDs and the
    // namespaces the sandbox made are gone again, and down says so
    let namespaces_before = a.names("namespaces");
    let out = sandbox(&["up", "--dir", d, "--detach", "--mgmt-kubeconfig", ka]);
    let _down = support::existing::Down(dir.clone());
    assert!(out.status.success(), "{}", text(&out));
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(dir.join("mgmt-a.kubeconfig"))
        .args(["get", "crd", "hostedclusters.hypershift.openshift.io", "nodepools.hypershift.openshift.io", "-o", "name"])
        .output()
        .unwrap();
    assert!(out.status.success(), "the CRDs are installed on the existing cluster: {}", text(&out));
    // Routes: this emulator serves them built in, so no Route CRD is installed
    let out = a.kubectl(&["get", "routes.route.openshift.io", "-A"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!a.names("crd").iter().any(|c| c.ends_with("/routes.route.openshift.io")));
    // a HostedCluster named like the demo on it: a second sandbox refuses
    // applied as one `v1 List`, as a user would (kubectl reads /openapi/v2
    // to validate a List)
    let objects = tmp.path().join("demo.json");
    let mut spec = hcp_dr_e2e::sandbox::HostedClusterSpec::demo();
    spec.availability = "SingleReplica".into();
    std::fs::write(&objects, serde_json::json!({"apiVersion": "v1", "kind": "List", "items": spec.objects()}).to_string()).unwrap();
    let out = a.kubectl(&["apply", "-f", objects.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let other = tmp.path().join("other");
    let out = sandbox(&["up", "--dir", other.to_str().unwrap(), "--mgmt-kubeconfig", ka]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("already has a HostedCluster clusters/demo"), "{}", text(&out));
    assert!(!other.exists());

    let out = sandbox(&["down", "--dir", d]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("removed CustomResourceDefinition hostedclusters.hypershift.openshift.io"), "{said}");
    assert!(said.contains("removed HostedCluster clusters/demo") && said.contains("removed Namespace clusters"), "{said}");
    assert!(a.names("crd").is_empty(), "{said}");
    assert_eq!(a.names("namespaces"), namespaces_before, "{said}");
}

/// Every command of hcp-dr that the drill does not run, on existing clusters
/// (the drill runs cluster create, backup, drill and migrate): etcd status
/// and recover, backups list and verify, etcd restore, cluster destroy,
/// restore onto the other cluster, cluster reconcile, and schedule render
/// applied with kubectl.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_command_runs_on_existing_clusters() {
    let tmp = tempfile::tempdir().unwrap();
    let a = ExistingCluster::start(tmp.path(), "ext-a");
    let b = ExistingCluster::start(tmp.path(), "ext-b");
    let opts = UpOptions { mgmt_kubeconfigs: vec![a.kubeconfig.clone(), b.kubeconfig.clone()], force: false, ..Default::default() };
    let env = support::env_with("HighlyAvailable", &opts).await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    let kubeconfig_b = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();

    // etcd status and recover (healthy: nothing to recover, refused)
    let out = env.hcp_dr(&["etcd", "status", "--hosted-cluster", "demo"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 member(s) expected): HEALTHY"), "{}", text(&out));
    let out = env.hcp_dr(&["etcd", "recover", "--hosted-cluster", "demo"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("is healthy: nothing to recover"), "{}", text(&out));
    env.assert_in_service("after etcd status and recover").await;

    // backup to S3, backups list and verify --deep
    let (folder, revision) = support::backup_to_s3(&env);
    env.assert_in_service("after the backup").await;
    let store = format!("s3://{}/backups", hcp_dr_e2e::sandbox::BUCKET);
    let out = env.hcp_dr(&["backups", "list", "--store", &store, "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(json_report(&out).to_string().contains(&folder), "{}", text(&out));
    let out = env.hcp_dr(&["backups", "verify", &folder, "--s3-endpoint", &endpoint, "--deep", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let verified = json_report(&out);
    assert_eq!((verified["ok"].as_bool(), verified["snapshots"][0]["revision"].as_i64()), (Some(true), Some(revision)), "{verified:#}");

    // etcd restore of the backup in place
    let args = ["etcd", "restore", "--hosted-cluster", "demo", "-n", "clusters", "-o", "json", "--s3-endpoint", &endpoint, "--from", &store, "--backup-id", "latest"];
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "etcd restore:\n{}", text(&out));
    env.assert_in_service("after the etcd restore").await;

    // cluster destroy on mgmt-a, then restore onto mgmt-b
    let out = env.hcp_dr(&["cluster", "destroy", "demo"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!a.names("namespaces").iter().any(|n| n == "namespace/clusters-demo"), "destroy left the HCP namespace");
    let out = env.hcp_dr(&["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &kubeconfig_b, "--wait", "5m", "-o", "json"], &[]);
    assert!(out.status.success(), "restore onto mgmt-b:\n{}", text(&out));
    assert_eq!(json_report(&out)["outcome"], "succeeded", "{}", text(&out));
    let out = b.kubectl(&["get", "hostedclusters.hypershift.openshift.io", "-n", "clusters", "-o", "name"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hostedcluster.hypershift.openshift.io/demo", "{}", text(&out));

    // cluster reconcile of a second, small cluster on mgmt-a: created, then no drift
    let pull = tmp.path().join("pull-secret.json");
    std::fs::write(&pull, r#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#).unwrap();
    let placement = env.placement_args();
    let mut args = vec!["cluster", "create", "--name", "recon", "--release-image", "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64",
        "--pull-secret", pull.to_str().unwrap(), "--availability", "SingleReplica", "--node-pool-replicas", "1",
        "--base-domain", hcp_dr_e2e::sandbox::BASE_DOMAIN, "--render", "-o", "json"];
    args.extend(placement.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "render: {}", text(&out));
    let objects: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let desired = tmp.path().join("desired.yaml");
    std::fs::write(&desired, serde_saphyr::to_string_multiple(&objects).unwrap()).unwrap();
    let out = env.hcp_dr(&["cluster", "reconcile", "-f", desired.to_str().unwrap(), "--wait", "3m", "-o", "json"], &[]);
    assert!(out.status.success(), "first reconcile: {}", text(&out));
    assert_eq!(json_report(&out)["changed"], true, "{}", text(&out));
    let out = env.hcp_dr(&["cluster", "reconcile", "-f", desired.to_str().unwrap(), "--no-wait", "-o", "json"], &[]);
    assert!(out.status.success(), "second reconcile: {}", text(&out));
    assert_eq!(json_report(&out)["changed"], false, "{}", text(&out));

    // schedule render, applied with kubectl, twice: unchanged the second time
    let out = env.hcp_dr(&["schedule", "render", "--schedule", "0 */6 * * *", "--to", "s3://backups/hcp", "--keep-daily", "7"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let schedule = tmp.path().join("schedule.yaml");
    std::fs::write(&schedule, &out.stdout).unwrap();
    let out = a.kubectl(&["apply", "-f", schedule.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cronjob.batch/hcp-dr-backup created"), "{}", text(&out));
    let out = a.kubectl(&["apply", "-f", schedule.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).lines().all(|l| l.ends_with("unchanged")), "{}", text(&out));

    // the sandbox removes its clusters and CRDs; the schedule's namespace is the user's
    let cleanup = env.sandbox.shutdown().await;
    assert!(cleanup.complete, "{:?}", cleanup.lines);
    let cleanup = cleanup.lines.join("\n");
    assert!(cleanup.contains("removed HostedCluster clusters/recon") && cleanup.contains("removed HostedCluster clusters/demo"), "{cleanup}");
    assert!(cleanup.contains("left Namespace hcp-dr"), "{cleanup}");
    assert!(a.names("crd").is_empty() && b.names("crd").is_empty(), "{cleanup}");
}

/// KubeVirt guest volumes on existing clusters: the sandbox's CSI classes
/// are installed there, a backup copies a guest volume through hcp-dr's
/// data-mover Job, and a migration writes it back on the other cluster.
/// (With HCP_DR_TEST_EXISTING naming clusters whose own controller-manager
/// runs, their Job controller and scheduler run the movers, placed on the
/// sandbox's Node by the HostedCluster's nodeSelector and tolerations.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guest_volumes_move_between_existing_clusters() {
    let tmp = tempfile::tempdir().unwrap();
    let a = ExistingCluster::start(tmp.path(), "ext-a");
    let b = ExistingCluster::start(tmp.path(), "ext-b");
    let opts = UpOptions { mgmt_kubeconfigs: vec![a.kubeconfig.clone(), b.kubeconfig.clone()], ..Default::default() };
    let spec = hcp_dr_e2e::sandbox::HostedClusterSpec {
        availability: "SingleReplica".into(),
        node_pool_replicas: 1,
        ..hcp_dr_e2e::sandbox::HostedClusterSpec::kubevirt()
    };
    let env = support::env_of(spec, &opts).await;
    let state = |mgmt: &str| env.sandbox.dir.join(mgmt).join("state");
    let (name, dir) = hcp_dr_e2e::sandbox::guest_volume_on(&env.mgmt, &state("mgmt-a"), "clusters", "demo", "1Gi").await.expect("a guest volume");
    std::fs::write(dir.join("guest.txt"), "written in the guest on mgmt-a\n").unwrap();

    let args = support::migrate_json_args(&env);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "migrate:\n{}", text(&out));
    let report = json_report(&out);
    let ran: Vec<&str> = report["stages"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    for stage in ["volume-snapshot", "volume-copy", "volume-restore"] {
        assert!(ran.contains(&stage), "{stage} did not run: {ran:?}");
    }
    let moved = hcp_dr_e2e::operator::workloads::pv_path(&state("mgmt-b"), "clusters-demo", &name).join("guest.txt");
    assert_eq!(std::fs::read_to_string(&moved).unwrap_or_default(), "written in the guest on mgmt-a\n", "{}", moved.display());
    let out = b.kubectl(&["get", "pvc", &name, "-n", "clusters-demo", "-o", "jsonpath={.status.phase} {.metadata.ownerReferences[0].kind}"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Bound DataVolume", "{}", text(&out));
    // nothing of hcp-dr's movers is left on either cluster
    for cluster in [&a, &b] {
        let out = cluster.kubectl(&["get", "jobs,pods,pvc,volumesnapshots", "-A", "-l", "hcp-dr.openshift.io/backup-id", "-o", "name"]);
        assert!(out.status.success() && out.stdout.is_empty(), "movers left: {}", text(&out));
    }
}
