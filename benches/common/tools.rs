//! What the whole-path benchmarks (`dr`, `scale`) share: the sandbox's
//! tools as an administrator runs them (kubectl, etcdctl with the members'
//! client TLS, the aws CLI against the sandbox's S3, hcp-dr itself), and the
//! raw data movement of a restore, the peer of hcp-dr's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hcp_dr_e2e::sandbox::{BUCKET, HostedClusterSpec, Sandbox, create_all, wait_available};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use serde_json::Value;

use super::Ran;

/// The demo cluster's HostedCluster namespace and control-plane namespace.
pub const NS: &str = "clusters";
pub const HCP_NS: &str = "clusters-demo";

/// A sandbox under `dir` with the demo cluster Available on mgmt-a in
/// `availability` (`HighlyAvailable` or `SingleReplica`), and mgmt-a's client.
pub async fn demo_sandbox(dir: &Path, availability: &str) -> (Sandbox, kube::Client) {
    let sandbox = Sandbox::up(&dir.join("sandbox")).await.expect("sandbox up");
    let mgmt = sandbox.clusters[0].api.client().await.expect("client");
    let mut spec = HostedClusterSpec::demo();
    spec.availability = availability.into();
    create_all(&mgmt, &spec.objects()).await.expect("create demo");
    wait_available(&mgmt, NS, "demo", Duration::from_secs(300)).await.expect("demo Available");
    (sandbox, mgmt)
}

/// Run `cmd`; panic with its stderr when it fails.
pub fn run_ok(cmd: Command) -> Ran {
    super::run(cmd).ok()
}

/// What the manual procedure and hcp-dr need to reach the sandbox.
pub struct Tools {
    pub sandbox_dir: PathBuf,
    pub kubeconfig_a: PathBuf,
    pub kubeconfig_b: PathBuf,
    pub s3_url: String,
    pub s3_env: Vec<(String, String)>,
    /// CA, client certificate and key of the members (from the HCP namespace).
    pub etcd_tls: [PathBuf; 3],
    pub state: PathBuf,
}

impl Tools {
    /// The tools for `sandbox`, the members' client TLS written into `work`.
    pub async fn new(sandbox: &Sandbox, mgmt: &kube::Client, work: &Path, state: PathBuf) -> Tools {
        Tools {
            sandbox_dir: sandbox.dir.clone(),
            kubeconfig_a: sandbox.clusters[0].kubeconfig.clone(),
            kubeconfig_b: sandbox.clusters[1].kubeconfig.clone(),
            s3_url: sandbox.s3.https_url().to_string(),
            s3_env: vec![
                ("AWS_ACCESS_KEY_ID".into(), sandbox.s3.access_key().into()),
                ("AWS_SECRET_ACCESS_KEY".into(), sandbox.s3.secret_key().into()),
                ("AWS_REGION".into(), sandbox.s3.region().into()),
                ("AWS_DEFAULT_REGION".into(), sandbox.s3.region().into()),
            ],
            etcd_tls: write_etcd_tls(mgmt, work).await,
            state,
        }
    }

    pub fn kubectl(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
        cmd
    }

    pub fn etcdctl(&self, endpoint: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .arg(format!("--cacert={}", self.etcd_tls[0].display()))
            .arg(format!("--cert={}", self.etcd_tls[1].display()))
            .arg(format!("--key={}", self.etcd_tls[2].display()))
            .arg("--insecure-skip-tls-verify")
            .args(args);
        cmd
    }

    pub fn aws(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("aws");
        cmd.args(["--endpoint-url", &self.s3_url, "--ca-bundle"])
            .arg(self.sandbox_dir.join("ca.crt"))
            .args(["--only-show-errors"])
            .args(args);
        for (k, v) in &self.s3_env {
            cmd.env(k, v);
        }
        cmd
    }

    /// hcp-dr with `args`; under `HCP_DR_BENCH_WRAP` when set (a command
    /// and its arguments, e.g. `heaptrack -o DIR/backup` to profile the
    /// runs: their times and RSS are then the wrapper's, not comparable).
    pub fn hcp_dr(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let bin = env!("CARGO_BIN_EXE_hcp-dr");
        let wrap = std::env::var("HCP_DR_BENCH_WRAP").unwrap_or_default();
        let mut cmd = match wrap.split_whitespace().collect::<Vec<_>>().split_first() {
            Some((wrapper, wrapper_args)) => {
                let mut cmd = Command::new(wrapper);
                cmd.args(wrapper_args).arg(bin);
                cmd
            }
            None => Command::new(bin),
        };
        cmd.args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("HCP_DR_CA_BUNDLE", self.sandbox_dir.join("ca.crt"))
            .env("HCP_DR_STATE_DIR", &self.state)
            .env_remove("HCP_DR_STORE");
        for (k, v) in &self.s3_env {
            cmd.env(k, v);
        }
        cmd
    }
}

/// The members' `(pod, https://ip:2379)`, sorted.
pub async fn member_endpoints(mgmt: &kube::Client) -> Vec<(String, String)> {
    hcp_dr_e2e::drill::member_clients(mgmt, HCP_NS)
        .await
        .expect("member clients")
        .into_iter()
        .map(|(pod, ip, _)| (pod, format!("https://{ip}:2379")))
        .collect()
}

/// The members' client TLS as files, as an admin copies them out of the namespace.
pub async fn write_etcd_tls(mgmt: &kube::Client, dir: &Path) -> [PathBuf; 3] {
    let secret = Api::<Secret>::namespaced(mgmt.clone(), HCP_NS).get("etcd-client-tls").await.expect("etcd-client-tls");
    let ca = Api::<ConfigMap>::namespaced(mgmt.clone(), HCP_NS).get("etcd-ca").await.expect("etcd-ca");
    let data = secret.data.unwrap_or_default();
    let files = [dir.join("etcd-ca.crt"), dir.join("etcd-client.crt"), dir.join("etcd-client.key")];
    std::fs::write(&files[0], ca.data.unwrap_or_default().get("ca.crt").cloned().unwrap_or_default()).expect("ca");
    std::fs::write(&files[1], &data.get("etcd-client.crt").expect("client cert").0).expect("cert");
    std::fs::write(&files[2], &data.get("etcd-client.key").expect("client key").0).expect("key");
    files
}

/// The raw data movement of a restore: per member, download the snapshot
/// and `etcdctl snapshot restore` it into a fresh data directory.
pub fn raw_restore(tools: &Tools, dir: &Path, key: &str, members: usize) -> Duration {
    let mut total = Duration::ZERO;
    for i in 0..members {
        let file = dir.join(format!("raw-{i}.db"));
        total += run_ok(tools.aws(&["s3", "cp", &format!("s3://{BUCKET}/{key}"), file.to_str().unwrap()])).wall;
        let data = dir.join(format!("raw-{i}.etcd"));
        let mut restore = Command::new("etcdctl");
        restore.env("ETCDCTL_API", "3").args(["snapshot", "restore"]).arg(&file).arg("--data-dir").arg(&data);
        total += run_ok(restore).wall;
        std::fs::remove_file(&file).ok();
        std::fs::remove_dir_all(&data).ok();
    }
    total
}

pub fn report(out: &Ran) -> Value {
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

pub fn mib(kib: i64) -> f64 {
    kib as f64 / 1024.0
}


/// "name 1.2s, ..." of a report's stages that took at least 0.05 s.
pub fn stage_times(report: &Value) -> String {
    report["stages"]
        .as_array()
        .map(|stages| {
            stages
                .iter()
                .filter_map(|s| Some((s["name"].as_str()?, s["duration"].as_f64()?)))
                .filter(|(_, d)| *d >= 0.05)
                .map(|(n, d)| format!("{n} {d:.1}s"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The backup's raw and stored snapshot sizes, from its manifest in S3.
pub fn snapshot_sizes(tools: &Tools, url: &str, work: &Path) -> (u64, u64) {
    let file = work.join("manifest.json");
    run_ok(tools.aws(&["s3", "cp", &format!("{url}/manifest.json"), file.to_str().expect("path")]));
    let manifest: Value = serde_json::from_slice(&std::fs::read(&file).expect("manifest")).expect("manifest JSON");
    let stored = manifest["etcd"][0]["size"].as_u64().expect("size");
    (manifest["compression"]["artifacts"][0]["size"].as_u64().unwrap_or(stored), stored)
}
