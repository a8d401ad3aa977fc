//! Existing clusters for the sandbox's `--mgmt-kubeconfig` mode: the
//! project's API emulator run on its own (`hcp-dr-sandbox apiserver`), as an
//! existing cluster would run: its own process, etcd, CA and kubeconfig, no
//! CRDs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use super::text;

/// `hcp-dr-sandbox` beside the hcp-dr binary (both built by `cargo build --workspace`).
pub fn sandbox_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_hcp-dr")).with_file_name("hcp-dr-sandbox");
    assert!(bin.exists(), "{} is missing: build the workspace (cargo build --workspace --all-targets)", bin.display());
    bin
}

/// One `hcp-dr-sandbox apiserver` process, killed on drop; or, when
/// `HCP_DR_TEST_EXISTING` names a kubeconfig for this name
/// (`ext-a=/abs/a.kubeconfig,ext-b=/abs/b.kubeconfig`), that cluster, used
/// as it is and left running: to run these tests by hand against real API
/// servers (k3s, a local kube-apiserver with its controller-manager and
/// scheduler). CI never sets it. Tests needing `noaccess` cannot run so.
pub struct ExistingCluster {
    child: Option<Child>,
    pub kubeconfig: PathBuf,
    pub noaccess: PathBuf,
}

/// The kubeconfig `HCP_DR_TEST_EXISTING` gives for `name`, if any.
fn given(name: &str) -> Option<PathBuf> {
    let all = std::env::var("HCP_DR_TEST_EXISTING").ok()?;
    all.split(',').find_map(|pair| {
        let (n, path) = pair.split_once('=')?;
        (n.trim() == name).then(|| PathBuf::from(path.trim()))
    })
}

impl ExistingCluster {
    pub fn start(dir: &Path, name: &str) -> ExistingCluster {
        if let Some(kubeconfig) = given(name) {
            eprintln!("using the existing cluster {} as {name} (HCP_DR_TEST_EXISTING)", kubeconfig.display());
            return ExistingCluster { child: None, kubeconfig, noaccess: dir.join("no-noaccess-kubeconfig-for-a-given-cluster") };
        }
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
            child: Some(child),
            kubeconfig: dir.join(format!("{name}.kubeconfig")),
            noaccess: dir.join(format!("{name}-noaccess.kubeconfig")),
        };
        let start = Instant::now();
        while !dir.join(format!("{name}.ready")).exists() {
            if let Some(Ok(Some(status))) = cluster.child.as_mut().map(Child::try_wait) {
                panic!("apiserver {name} exited ({status}): {}", std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default());
            }
            assert!(start.elapsed() < Duration::from_secs(60), "apiserver {name} not ready in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("kubectl not found: it is on every machine of this kind (see the README)")
    }

    /// The names `kubectl get KIND -o name` lists.
    pub fn names(&self, kind: &str) -> Vec<String> {
        let out = self.kubectl(&["get", kind, "-o", "name"]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }
}

impl Drop for ExistingCluster {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else { return };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}


/// Runs `hcp-dr-sandbox down --dir DIR` when dropped, so that a test which
/// fails after `up --detach` leaves no sandbox process behind. Declare it
/// after the [`ExistingCluster`]s: it must run while they still answer.
pub struct Down(pub PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if self.0.join("sandbox.json").exists() {
            let _ = Command::new(sandbox_bin()).arg("down").arg("--dir").arg(&self.0).output();
        }
    }
}
