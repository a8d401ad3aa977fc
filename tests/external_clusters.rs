//! The sandbox on management clusters it did not start (issue 12): the
//! project's API emulator run on its own, as an existing cluster would run
//! (its own process, etcd, CA and kubeconfig, no CRDs), twice; the drill
//! with `--mgmt-kubeconfig` twice against them; the refusals that must
//! leave such a cluster untouched; and `down` removing only what the
//! sandbox created.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use hcp_dr_e2e::sandbox::UpOptions;

mod support;

/// `hcp-dr-sandbox` beside the hcp-dr binary (both built by `cargo build --workspace`).
fn sandbox_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_hcp-dr")).with_file_name("hcp-dr-sandbox");
    assert!(bin.exists(), "{} is missing: build the workspace (cargo build --workspace --all-targets)", bin.display());
    bin
}

/// One `hcp-dr-sandbox apiserver` process, killed on drop.
struct ExistingCluster {
    child: Child,
    kubeconfig: PathBuf,
    noaccess: PathBuf,
}

impl ExistingCluster {
    fn start(dir: &Path, name: &str) -> ExistingCluster {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(sandbox_bin())
            .args(["apiserver", "--dir"])
            .arg(dir)
            .args(["--name", name])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start hcp-dr-sandbox apiserver");
        let mut cluster = ExistingCluster {
            child,
            kubeconfig: dir.join(format!("{name}.kubeconfig")),
            noaccess: dir.join(format!("{name}-noaccess.kubeconfig")),
        };
        let start = Instant::now();
        while !dir.join(format!("{name}.ready")).exists() {
            if let Ok(Some(status)) = cluster.child.try_wait() {
                panic!("apiserver {name} exited ({status}): {}", std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default());
            }
            assert!(start.elapsed() < Duration::from_secs(60), "apiserver {name} not ready in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("kubectl not found: it is on every machine of this kind (see the README)")
    }

    /// The names `kubectl get KIND -o name` lists.
    fn names(&self, kind: &str) -> Vec<String> {
        let out = self.kubectl(&["get", kind, "-o", "name"]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }
}

impl Drop for ExistingCluster {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(out: &Output) -> String {
    format!("exit {:?}\n{}\n{}", out.status.code(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

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

    let opts = UpOptions { mgmt_kubeconfigs: vec![a.kubeconfig.clone(), b.kubeconfig.clone()], force: false };
    let bin = Path::new(env!("CARGO_BIN_EXE_hcp-dr"));
    let report = hcp_dr_e2e::drill::run_with(&tmp.path().join("sb"), bin, &opts).await.expect("drill on the existing clusters");

    // the same end state as the drill on emulated clusters (tests/drill.rs)
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
    assert!(!cleanup.contains("NOT everything"), "{cleanup}");
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

    // up --detach on it (mgmt-b emulated), then down: the CRDs and the
    // namespaces the sandbox made are gone again, and down says so
    let namespaces_before = a.names("namespaces");
    let out = sandbox(&["up", "--dir", d, "--detach", "--mgmt-kubeconfig", ka]);
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
    // one file per object: kubectl validates a `List` against /openapi/v2,
    // which the emulator does not serve
    let objects = tmp.path().join("demo");
    std::fs::create_dir(&objects).unwrap();
    let mut spec = hcp_dr_e2e::sandbox::HostedClusterSpec::demo();
    spec.availability = "SingleReplica".into();
    for (i, obj) in spec.objects().iter().enumerate() {
        std::fs::write(objects.join(format!("{i}.json")), obj.to_string()).unwrap();
    }
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
