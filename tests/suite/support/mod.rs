//! Shared set-up for the end-to-end tests: a sandbox with one hosted
//! cluster, the real hcp-dr binary, and checks on the cluster's state.
#![allow(dead_code)]

pub mod existing;
pub mod logged;
pub mod plain;
pub mod shell;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use hcp_dr_e2e::drill::{hosted_client, write_workloads};
use hcp_dr_e2e::sandbox::{HostedClusterSpec, Sandbox, UpOptions, api_for, create_all, wait_available};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde_json::{Value, json};

/// The steps of the sandbox drill (`hcp_dr_e2e::drill::run`), in order.
pub const DRILL_STEPS: [&str; 12] = [
    "sandbox up",
    "hcp-dr cluster create demo",
    "connect to the hosted API",
    "write sample workloads",
    "inspect hosted etcd members",
    "hcp-dr backup to S3",
    "verify the backup",
    "cluster back in service",
    "hcp-dr drill on mgmt-b",
    "hcp-dr migrate to mgmt-b",
    "verify on mgmt-b, source gone",
    "hcp-dr report",
];

pub const WRITERS: [&str; 3] = ["kube-apiserver", "openshift-apiserver", "openshift-oauth-apiserver"];

pub struct Env {
    pub dir: tempfile::TempDir,
    pub sandbox: Sandbox,
    pub spec: HostedClusterSpec,
    pub mgmt: kube::Client,
    pub hosted: kube::Client,
    /// Writer replicas before any test ran.
    pub replicas: Vec<(String, i32)>,
}

/// A sandbox with `spec` created on mgmt-a, Available, with workloads written.
pub async fn env(availability: &str) -> Env {
    env_with(availability, &UpOptions::default()).await
}

/// [`env`] on the management clusters `opts` names (`--mgmt-kubeconfig`).
pub async fn env_with(availability: &str, opts: &UpOptions) -> Env {
    let mut spec = HostedClusterSpec::demo();
    spec.availability = availability.to_string();
    env_of(spec, opts).await
}

/// [`env_with`] for a HostedCluster of `spec`, written by hand (as
/// `kubectl apply` would create it), not by `hcp-dr cluster create`.
pub async fn env_of(spec: HostedClusterSpec, opts: &UpOptions) -> Env {
    env_editing(spec, opts, |_| {}).await
}

/// [`env_of`], its objects changed by `edit` before they are created.
pub async fn env_editing(spec: HostedClusterSpec, opts: &UpOptions, edit: impl FnOnce(&mut Vec<Value>)) -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let sandbox = Sandbox::up_with(&dir.path().join("sandbox"), opts).await.expect("sandbox up");
    let mgmt = sandbox.clusters[0].api.client().await.expect("client");
    let mut objects = spec.objects();
    edit(&mut objects);
    if sandbox.clusters[0].api.controllers() == hcp_dr_e2e::operator::Controllers::Cluster {
        // its control plane on the sandbox's Node (docs/sandbox.md)
        let (selector, tolerations) = hcp_dr_e2e::operator::kubelet::placement();
        for hc in objects.iter_mut().filter(|o| o["kind"] == "HostedCluster") {
            hc["spec"]["nodeSelector"] = selector.clone();
            hc["spec"]["tolerations"] = tolerations.clone();
            hc["spec"]["etcd"]["managed"]["storage"]["persistentVolume"]["storageClassName"] = json!(hcp_dr_e2e::operator::workloads::LOCAL_CLASS);
        }
    }
    create_all(&mgmt, &objects).await.expect("create demo");
    wait_available(&mgmt, &spec.namespace, &spec.name, Duration::from_secs(180))
        .await
        .expect("demo Available");
    let hosted = hosted_client(&mgmt, &spec.namespace, &spec.name).await.expect("hosted client");
    write_workloads(&hosted).await.expect("workloads");
    let mut env = Env { dir, sandbox, spec, mgmt, hosted, replicas: Vec::new() };
    env.replicas = env.writer_replicas().await;
    env
}

impl Env {
    /// The `cluster create` flags that put a control plane on the sandbox's
    /// Node, where mgmt-a's own controller-manager runs; none otherwise.
    pub fn placement_args(&self) -> Vec<String> {
        if self.sandbox.clusters[0].api.controllers() != hcp_dr_e2e::operator::Controllers::Cluster {
            return Vec::new();
        }
        hcp_dr_e2e::operator::kubelet::placement_args()
    }

    /// The directory of a member's data: `<state>/pv/<hcp-ns>/data-<member>/data`.
    pub fn etcd_data_dir(&self, member: &str) -> PathBuf {
        let cluster = &self.sandbox.clusters[0];
        self.sandbox.dir.join(&cluster.name).join("state/pv").join(self.hcp_ns()).join(format!("data-{member}")).join("data")
    }

    /// Hang `member`'s etcd process (SIGSTOP) as a frozen or partitioned
    /// member looks: the port accepts, nothing answers. It runs again when
    /// the guard is dropped.
    pub fn freeze_etcd_member(&self, member: &str) -> Frozen {
        let dir = self.etcd_data_dir(member);
        let pid = etcd_pid(&dir).unwrap_or_else(|| panic!("no etcd process with --data-dir={}", dir.display()));
        signal(pid, "-STOP");
        Frozen { pid }
    }

    pub fn hcp_ns(&self) -> String {
        format!("{}-{}", self.spec.namespace, self.spec.name)
    }

    /// Run the real hcp-dr binary against mgmt-a with the sandbox's S3 credentials.
    pub fn hcp_dr(&self, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
        let mut cmd = self.command(args, extra_env);
        cmd.output().expect("run hcp-dr")
    }

    pub fn command(&self, args: &[&str], extra_env: &[(&str, &str)]) -> std::process::Command {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr"));
        cmd.args(args)
            .env("KUBECONFIG", &self.sandbox.clusters[0].kubeconfig)
            .env("AWS_ACCESS_KEY_ID", self.sandbox.s3.access_key())
            .env("AWS_SECRET_ACCESS_KEY", self.sandbox.s3.secret_key())
            .env("AWS_REGION", self.sandbox.s3.region())
            .env("HCP_DR_CA_BUNDLE", self.sandbox.dir.join("ca.crt"))
            .env("HCP_DR_STATE_DIR", self.dir.path().join("state"))
            .env_remove("HCP_DR_STORE");
        require_test_hooks(extra_env);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd
    }

    pub fn s3_args(&self) -> Vec<String> {
        vec![
            "--to".into(),
            format!("s3://{}/backups", hcp_dr_e2e::sandbox::BUCKET),
            "--s3-endpoint".into(),
            self.sandbox.s3.https_url().into(),
        ]
    }

    pub fn local_store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    pub async fn writer_replicas(&self) -> Vec<(String, i32)> {
        let api: Api<Deployment> = Api::namespaced(self.mgmt.clone(), &self.hcp_ns());
        let mut out = Vec::new();
        for w in WRITERS {
            let d = api.get(w).await.expect("writer deployment");
            out.push((w.to_string(), d.spec.replicas.unwrap_or(1)));
        }
        out
    }

    /// `spec.pausedUntil` of the HostedCluster and each NodePool.
    pub async fn paused_until(&self) -> Vec<Value> {
        let hc = api_for(&self.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": self.spec.namespace}}));
        let np = api_for(&self.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool", "metadata": {"namespace": self.spec.namespace}}));
        let mut out = vec![serde_json::to_value(hc.get(&self.spec.name).await.expect("hc")).unwrap()["spec"]["pausedUntil"].clone()];
        for item in np.list(&Default::default()).await.expect("nodepools").items {
            out.push(serde_json::to_value(item).unwrap()["spec"]["pausedUntil"].clone());
        }
        out
    }

    /// The cluster is as before: not paused, writers at their replicas, no lock.
    pub async fn assert_in_service(&self, context: &str) {
        let paused = self.paused_until().await;
        assert!(paused.iter().all(Value::is_null), "{context}: still paused: {paused:?}");
        assert_eq!(self.writer_replicas().await, self.replicas, "{context}: writers not scaled back");
        let leases = api_for(&self.mgmt, &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"namespace": self.spec.namespace}}));
        let held: Vec<String> = leases
            .list(&Default::default())
            .await
            .expect("leases")
            .items
            .into_iter()
            .filter_map(|l| l.metadata.name)
            .filter(|n| n.starts_with("hcp-dr-lock-"))
            .collect();
        assert!(held.is_empty(), "{context}: lock still held: {held:?}");
    }
}

/// A member hung by [`Env::freeze_etcd_member`]; continued on drop.
pub struct Frozen {
    pid: u32,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.pid, "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let sent = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill");
    assert!(sent.success(), "kill {sig} {pid}");
}

/// The pid of the etcd process started with `--data-dir=<dir>`.
pub fn etcd_pid(dir: &Path) -> Option<u32> {
    let flag = format!("--data-dir={}", dir.display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        cmdline.split(|b| *b == 0).any(|arg| arg == flag.as_bytes()).then_some(pid)
    })
}

/// A test that sets a test hook (`HCP_DR_TEST_*`) fails here, naming the
/// feature, when the binary was built without it: such a binary ignores the
/// variable, and the test would silently prove nothing. hcp-dr's
/// dev-dependency on itself turns the feature on in every test build.
pub fn require_test_hooks(extra_env: &[(&str, &str)]) {
    if let Some((hook, _)) = extra_env.iter().find(|(k, _)| k.starts_with("HCP_DR_TEST_")) {
        assert!(
            hcp_dr::pipeline::runner::TEST_HOOKS,
            "{hook} needs the test hooks: build with the cargo feature `test-hooks` (`cargo nextest run --features test-hooks`)"
        );
    }
}

pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

pub fn json_report(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("no JSON report ({e}):\n{}", text(output)))
}

/// Every file under `dir`, relative.
pub fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Copy the local store to `dest` and flip one bit in the middle of `file`
/// of `backup` in the copy; returns the copied backup's folder.
pub fn tampered_copy(store: &Path, backup: &Path, file: &str, dest: &Path) -> PathBuf {
    let copy = dest.join(format!("tampered-{}", file.replace('/', "-")));
    let status = std::process::Command::new("cp").arg("-a").arg(store).arg(&copy).status().unwrap();
    assert!(status.success());
    let target = copy.join(backup.strip_prefix(store).unwrap()).join(file);
    let mut bytes = std::fs::read(&target).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&target, bytes).unwrap();
    copy.join(backup.strip_prefix(store).unwrap())
}

/// The external-dns owners of `host`'s records in the sandbox zone.
pub async fn owners_of(env: &Env, host: &str) -> Vec<String> {
    env.sandbox.owners_of(host).await.expect("list records")
}

/// Wait up to `within` until `host`'s records belong to `owners`
/// (external-dns works in passes).
pub async fn wait_owners(env: &Env, host: &str, owners: &[&str], within: Duration, context: &str) {
    let start = std::time::Instant::now();
    let mut now = owners_of(env, host).await;
    while now != owners && start.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = owners_of(env, host).await;
    }
    assert_eq!(now, owners, "{context}: the records of {host}");
}

/// HostedClusters in `namespace`.
pub fn hc_api(client: &kube::Client, namespace: &str) -> Api<kube::api::DynamicObject> {
    api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": namespace}}))
}

/// NodePools in `namespace`.
pub fn np_api(client: &kube::Client, namespace: &str) -> Api<kube::api::DynamicObject> {
    api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool", "metadata": {"namespace": namespace}}))
}

/// Test keys written straight into demo's etcd, and what the etcd restore
/// tests read of its members.
pub mod etcd_data {
    use std::collections::BTreeMap;

    use hcp_dr_e2e::drill::member_clients;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::api::{Api, ListParams};

    use super::Env;

    /// Keys written before the backup.
    pub const BEFORE: &str = "/hcp-dr-test/before/";
    /// Keys written after it.
    pub const AFTER: &str = "/hcp-dr-test/after/";

    /// Write `key` through the first member; the revision it made.
    pub async fn put(env: &Env, key: &str, value: &str) -> i64 {
        let (_, _, mut client) = member_clients(&env.mgmt, &env.hcp_ns()).await.expect("clients").remove(0);
        client.put(key, value, None).await.expect("put").header().unwrap().revision()
    }

    /// Every member's `(revision, {key: value})` under `prefix`.
    pub async fn member_values(env: &Env, prefix: &str) -> BTreeMap<String, (i64, BTreeMap<String, String>)> {
        let mut out = BTreeMap::new();
        for (pod, _, mut client) in member_clients(&env.mgmt, &env.hcp_ns()).await.expect("member clients") {
            let resp = client
                .get(prefix, Some(etcd_client::GetOptions::new().with_prefix().with_serializable()))
                .await
                .expect("get");
            let kvs = resp
                .kvs()
                .iter()
                .map(|kv| (kv.key_str().unwrap().to_string(), kv.value_str().unwrap().to_string()))
                .collect();
            out.insert(pod, (resp.header().unwrap().revision(), kvs));
        }
        out
    }

    /// The UID of each etcd data claim, by name.
    pub async fn claim_uids(env: &Env) -> BTreeMap<String, String> {
        Api::<PersistentVolumeClaim>::namespaced(env.mgmt.clone(), &env.hcp_ns())
            .list(&ListParams::default())
            .await
            .expect("pvcs")
            .items
            .into_iter()
            .filter_map(|c| Some((c.metadata.name?, c.metadata.uid?)))
            .filter(|(n, _)| n.starts_with("data-etcd-"))
            .collect()
    }

    /// The etcd StatefulSet's replicas.
    pub async fn etcd_replicas(env: &Env) -> i32 {
        Api::<StatefulSet>::namespaced(env.mgmt.clone(), &env.hcp_ns()).get("etcd").await.expect("sts").spec.replicas.unwrap_or(1)
    }

    /// What an etcd restore of demo (backup taken with 20 keys under
    /// BEFORE, `BEFORE00` then changed, keys written under AFTER since, the
    /// members at revision `reached`) must leave, by its `report`: every
    /// member holds the backup's keys and values and nothing written after,
    /// at a revision above any reached before, the old revisions compacted;
    /// member 0 kept its volume (`uids_before`), the others have fresh ones.
    pub async fn assert_restored_to_backup(env: &Env, report: &serde_json::Value, reached: i64, uids_before: &BTreeMap<String, String>) {
        assert_eq!(report["revision_before"].as_i64(), Some(reached), "{report:#}");
        let bump = report["bump_revision"].as_i64().expect("bump");
        let snapshot_revision = report["snapshot_revision"].as_i64().expect("snapshot revision");
        assert!(snapshot_revision + bump > reached, "{report:#}");
        let before = member_values(env, BEFORE).await;
        let after = member_values(env, AFTER).await;
        assert_eq!(before.len(), 3, "{before:?}");
        for (member, (revision, kvs)) in &before {
            assert_eq!(kvs.len(), 20, "{member}: {kvs:?}");
            assert_eq!(kvs[&format!("{BEFORE}00")], "value-0", "{member}: the change after the backup survived");
            assert!(*revision > reached, "{member}: revision {revision} not above {reached}");
            assert!(after[member].1.is_empty(), "{member} kept keys written after the backup: {:?}", after[member].1);
        }
        let (_, _, mut client) = member_clients(&env.mgmt, &env.hcp_ns()).await.unwrap().remove(0);
        let old = client.get(BEFORE, Some(etcd_client::GetOptions::new().with_prefix().with_revision(reached))).await;
        let err = old.expect_err("a read at a revision from before the restore must fail");
        assert!(err.to_string().contains("compacted"), "{err}");
        let uids_after = claim_uids(env).await;
        assert_eq!(uids_after["data-etcd-0"], uids_before["data-etcd-0"]);
        for claim in ["data-etcd-1", "data-etcd-2"] {
            assert_ne!(uids_after[claim], uids_before[claim], "{claim} was not replaced");
        }
    }
}

/// `hcp-dr backup` of demo to the sandbox's S3 store: the backup's URL and etcd revision.
pub fn backup_to_s3(env: &Env) -> (String, i64) {
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let backup = json_report(&out);
    (backup["backup"].as_str().expect("backup URL").to_string(), backup["etcd_revision"].as_i64().expect("revision"))
}

/// `hcp-dr backup` of demo to the local store: the backup's folder.
pub fn backup_to_local(env: &Env) -> PathBuf {
    let store = env.local_store();
    let out = env.hcp_dr(&["backup", "--hosted-cluster", "demo", "-o", "json", "--to", store.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    PathBuf::from(json_report(&out)["backup"].as_str().expect("backup URL").strip_prefix("file://").expect("a local backup"))
}

/// An age key file as `age-keygen -o` writes it, and its public key.
pub fn age_key_file(dir: &Path, name: &str) -> (PathBuf, String) {
    let identity = age::x25519::Identity::generate();
    let public = identity.to_public().to_string();
    let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
    let path = dir.join(name);
    std::fs::write(&path, format!("# public key: {public}\n{secret}\n")).unwrap();
    (path, public)
}

/// Wait (up to 120 s) until the journal records that `stage` started.
pub fn wait_for_stage(journal: &Path, stage: &str) {
    let needle = format!("\"event\":\"started\",\"stage\":\"{stage}\"");
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if std::fs::read_to_string(journal).is_ok_and(|j| j.contains(&needle)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{stage} never started; journal:\n{}", std::fs::read_to_string(journal).unwrap_or_default());
}

/// How many times the journal records that `stage` started.
pub fn started_count(journal: &Path, stage: &str) -> usize {
    let needle = format!("\"event\":\"started\",\"stage\":\"{stage}\"");
    std::fs::read_to_string(journal).map(|j| j.matches(&needle).count()).unwrap_or(0)
}

/// Run hcp-dr with `args` holding in `stage` (`HCP_DR_TEST_HOLD_IN`: it
/// waits right after journaling that the stage started, before the stage
/// does anything); SIGKILL it once the journal shows the stage started.
pub fn kill_in(env: &Env, args: &[&str], journal: &Path, stage: &str) {
    let before = started_count(journal, stage);
    let mut child = env
        .command(args, &[("HCP_DR_TEST_HOLD_IN", stage)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while started_count(journal, stage) <= before {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).ok();
            panic!("hcp-dr ended ({status}) before `{stage}` started:\n{err}\njournal:\n{}", std::fs::read_to_string(journal).unwrap_or_default());
        }
        assert!(start.elapsed() < Duration::from_secs(300), "`{stage}` never started; journal:\n{}", std::fs::read_to_string(journal).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// Run hcp-dr with `args` holding once `stage` has done its work, before
/// its result is journaled (`HCP_DR_TEST_HOLD_AFTER`); SIGKILL it when its
/// log says it holds there. `journal` is only shown when it fails.
pub fn kill_after(env: &Env, args: &[&str], journal: &Path, stage: &str) {
    let mut child = env
        .command(args, &[("HCP_DR_TEST_HOLD_AFTER", stage), ("HCP_DR_LOG_FORMAT", "text")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = logged::lines_of(child.stderr.take().unwrap());
    let holding = format!("holding after `{stage}`");
    let mut log = String::new();
    let start = std::time::Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let found = line.contains(&holding);
                log.push_str(&line);
                log.push('\n');
                if found {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().unwrap();
                panic!("hcp-dr ended ({status}) before `{stage}` was done:\n{log}\njournal:\n{}", std::fs::read_to_string(journal).unwrap_or_default());
            }
        }
        assert!(start.elapsed() < Duration::from_secs(600), "`{stage}` never done:\n{log}\njournal:\n{}", std::fs::read_to_string(journal).unwrap_or_default());
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// `script` as an operator runs it: in bash with `set -euo pipefail`, the
/// sandbox's env file sourced, hcp-dr on PATH, `KUBECONFIG` unset and no
/// other environment, in `work` (journals under `work/state`).
pub fn sourced_shell(sandbox: &Sandbox, work: &Path, script: &str) -> std::process::Command {
    let bin = Path::new(env!("CARGO_BIN_EXE_hcp-dr")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let sourced = format!("set -euo pipefail\nsource {}\n{script}", sandbox.dir.join("env").display());
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c")
        .arg(sourced)
        .current_dir(work)
        .env_clear()
        .env("PATH", path)
        .env("HOME", work)
        .env("HCP_DR_STATE_DIR", work.join("state"))
        .env("HCP_DR_LOG_FORMAT", "text");
    cmd
}

/// demo's HostedCluster on the management cluster `client` talks to, if any.
pub async fn hc_on(client: &kube::Client) -> Option<Value> {
    let hc = api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    hc.get_opt("demo").await.expect("get HC").map(|o| serde_json::to_value(o).unwrap())
}

/// The Route53 arguments of a migrate on the sandbox.
pub fn dns_args(env: &Env) -> Vec<String> {
    vec!["--route53-zone".into(), env.sandbox.zone_id.clone(), "--route53-endpoint".into(), env.sandbox.route53.url().to_string()]
}

/// `hcp-dr migrate` of demo from mgmt-a to mgmt-b through the sandbox's S3
/// store, waiting 5m for the destination and 2m for DNS, with the sandbox's
/// Route53 zone.
fn migrate_common(env: &Env) -> Vec<String> {
    let (a, b) = (&env.sandbox.clusters[0].kubeconfig, &env.sandbox.clusters[1].kubeconfig);
    let mut args: Vec<String> = ["migrate", "--hosted-cluster", "demo", "--from-kubeconfig", a.to_str().unwrap(), "--to-kubeconfig", b.to_str().unwrap()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--via".into(), format!("s3://{}/migrations", hcp_dr_e2e::sandbox::BUCKET), "--s3-endpoint".into(), env.sandbox.s3.https_url().to_string()]);
    args.extend(["--wait", "5m", "--dns-wait", "2m"].map(String::from));
    args.extend(dns_args(env));
    args
}

/// [`migrate_common`], journaled at `journal`, with `extra` arguments after the rest.
pub fn migrate_args(env: &Env, journal: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = migrate_common(env);
    args.extend(["--journal".into(), journal.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// [`migrate_common`], DNS records taken over directly, reporting JSON.
pub fn migrate_json_args(env: &Env) -> Vec<String> {
    let mut args = migrate_common(env);
    args.extend(["--dns-direct", "-o", "json"].map(String::from));
    args
}

/// The etcd keys under `/kubernetes.io/` of demo's most advanced member on
/// `mgmt`: its revision and keys.
pub async fn etcd_keys(mgmt: &kube::Client, hcp_ns: &str) -> (i64, std::collections::BTreeSet<String>) {
    let members = hcp_dr_e2e::drill::member_keys(mgmt, hcp_ns, "/kubernetes.io/").await.expect("etcd keys");
    let (_, revision, keys) = members.into_iter().max_by_key(|m| m.1).expect("an etcd member");
    (revision, keys)
}

/// Delete `demo` on mgmt-a and wait for its control plane to go, as a lost
/// cluster would be gone (the copies could serve at once: each management
/// cluster has its own hosted API addresses).
pub async fn retire_source(env: &Env) {
    let hc = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    hc.delete("demo", &Default::default()).await.expect("delete source HC");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.mgmt.clone());
    for _ in 0..360 {
        if namespaces.get_opt(&env.hcp_ns()).await.expect("ns").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the source control plane namespace was not removed");
}

/// What each etcd member of `hcp_ns` on `mgmt` says: (member, the names
/// in its member list, its cluster ID), and whether a key written through
/// the first member is read back through each of the others (then deleted).
pub async fn etcd_views(mgmt: &kube::Client, hcp_ns: &str) -> (Vec<(String, Vec<String>, u64)>, Vec<(String, bool)>) {
    let mut members = hcp_dr_e2e::drill::member_clients(mgmt, hcp_ns).await.expect("member clients");
    let mut views = Vec::new();
    for (pod, _, client) in &mut members {
        let list = client.member_list().await.expect("member list");
        let cluster_id = list.header().map(|h| h.cluster_id()).unwrap_or_default();
        let mut names: Vec<String> = list.members().iter().map(|m| m.name().to_string()).collect();
        names.sort();
        views.push((pod.clone(), names, cluster_id));
    }
    let key = format!("/hcp-dr-test/one-cluster/{}", std::process::id());
    let (first, rest) = members.split_first_mut().expect("an etcd member");
    first.2.put(key.as_str(), "written through the first member", None).await.expect("put");
    let mut read = Vec::new();
    for (pod, _, client) in rest {
        let got = client.get(key.as_str(), None).await.expect("get");
        read.push((pod.clone(), !got.kvs().is_empty()));
    }
    first.2.delete(key.as_str(), None).await.expect("delete");
    (views, read)
}

/// The etcd members of `hcp_ns` are one cluster of `n` (etcd-0..n-1): each
/// lists all of them, one cluster ID, a key written through one is read
/// through the others.
pub async fn assert_one_etcd_cluster(mgmt: &kube::Client, hcp_ns: &str, n: usize, context: &str) {
    let want: Vec<String> = (0..n).map(|i| format!("etcd-{i}")).collect();
    let (views, read) = etcd_views(mgmt, hcp_ns).await;
    assert_eq!(views.len(), n, "{context}: {views:?}");
    for (pod, names, _) in &views {
        assert_eq!(names, &want, "{context}: {pod} lists {names:?}");
    }
    let ids: std::collections::BTreeSet<u64> = views.iter().map(|v| v.2).collect();
    assert_eq!(ids.len(), 1, "{context}: cluster IDs {views:?}");
    assert!(read.iter().all(|(_, found)| *found), "{context}: a key written through {} is missing on some: {read:?}", views[0].0);
}

/// demo was moved to `dest` whole: Available there, its workload objects
/// served by its API, and each of its `members` etcd members at or above
/// `revision_before` with every key from before (the OVN pods' aside:
/// `ovn-restart` replaces them by design).
pub async fn assert_moved(dest: &kube::Client, hcp_ns: &str, revision_before: i64, keys_before: &std::collections::BTreeSet<String>, members: usize) {
    use hcp_dr_e2e::drill::{WORKLOAD_NS, WORKLOAD_OBJECTS};
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    wait_available(dest, "clusters", "demo", Duration::from_secs(60)).await.expect("Available on the destination");
    let hosted = hosted_client(dest, "clusters", "demo").await.unwrap();
    let cms = Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS).list(&Default::default()).await.unwrap();
    let secrets = Api::<Secret>::namespaced(hosted, WORKLOAD_NS).list(&Default::default()).await.unwrap();
    assert_eq!(cms.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("config-"))).count(), WORKLOAD_OBJECTS);
    assert_eq!(secrets.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("secret-"))).count(), WORKLOAD_OBJECTS);
    let after = hcp_dr_e2e::drill::member_keys(dest, hcp_ns, "/kubernetes.io/").await.expect("keys after");
    assert_eq!(after.len(), members);
    for (pod, revision, keys) in &after {
        assert!(*revision >= revision_before, "{pod}: revision {revision} < {revision_before}");
        let missing: Vec<&String> = keys_before
            .difference(keys)
            .filter(|k| !k.starts_with("/kubernetes.io/pods/openshift-ovn-kubernetes/ovnkube-node-"))
            .collect();
        assert!(missing.is_empty(), "{pod} lacks keys from before: {missing:?}");
    }
}

impl Env {
    /// `hcp-dr ARGS` as [`Env::command`] runs it, but on a pseudo-terminal
    /// (`script`, from util-linux), as someone at a terminal sees it: its
    /// exit status and everything it drew, stdout and stderr together, with
    /// the terminal's control sequences taken out and each redraw on a line
    /// of its own.
    pub fn on_a_terminal(&self, args: &[&str]) -> (std::process::ExitStatus, String) {
        let cmd = self.command(args, &[("TERM", "xterm"), ("HCP_DR_LOG_FORMAT", "text")]);
        let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', "'\\''"));
        let line = std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(quote).collect::<Vec<_>>().join(" ");
        let mut script = std::process::Command::new("script");
        // a size: a pseudo-terminal made without a terminal has none
        script.args(["-qefc", &format!("stty rows 50 cols 120 2>/dev/null; exec {line}"), "/dev/null"]);
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => script.env(key, value),
                None => script.env_remove(key),
            };
        }
        let out = script.output().expect("run script (util-linux)");
        (out.status, without_control_sequences(&String::from_utf8_lossy(&out.stdout)))
    }
}

/// `drawn` without ANSI control sequences, each carriage return, cursor
/// movement or erase a new line.
pub fn without_control_sequences(drawn: &str) -> String {
    let mut out = String::new();
    let mut chars = drawn.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // parameters, then one final byte in @..~; a cursor
                    // movement or an erase starts another line
                    while let Some(p) = chars.next() {
                        if ('@'..='~').contains(&p) {
                            if p != 'm' {
                                out.push('\n');
                            }
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\r' => out.push('\n'),
            c => out.push(c),
        }
    }
    out
}

/// The lines of a terminal's output that show `stage` finished: `done in
/// 1.2s, 12.00 MiB at 40.00 MiB/s` for one that moved bytes.
pub fn finished_lines<'a>(drawn: &'a str, stage: &str) -> Vec<&'a str> {
    drawn
        .lines()
        // up to the next spinner (braille), should the terminal have wrapped into it
        .map(|line| line.split(|c: char| ('\u{2800}'..='\u{28ff}').contains(&c)).next().unwrap_or_default())
        .filter(|line| line.split_whitespace().next() == Some(stage) && line.contains("done in"))
        .collect()
}

/// A sandbox with no hosted cluster yet, for a test that makes its own with
/// `hcp-dr cluster create` ([`create_demo`]); SingleReplica.
pub async fn bare_env() -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let sandbox = Sandbox::up(&dir.path().join("sandbox")).await.expect("sandbox up");
    let mgmt = sandbox.clusters[0].api.client().await.expect("client");
    let spec = HostedClusterSpec { availability: "SingleReplica".into(), ..HostedClusterSpec::demo() };
    Env { hosted: mgmt.clone(), dir, sandbox, spec, mgmt, replicas: Vec::new() }
}

/// `hcp-dr cluster create --name demo` on mgmt-a, SingleReplica, waiting up
/// to 5m, with `platform_args` (`--platform ...`, `--node-pool-replicas`,
/// the platform's flags); the pull secret is written first.
pub fn create_demo(env: &Env, platform_args: &[&str]) -> Output {
    let pull = env.dir.path().join("pull-secret.json");
    std::fs::write(&pull, r#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#).unwrap();
    let mut args = vec!["cluster", "create", "--name", "demo", "--availability", "SingleReplica"];
    args.extend(platform_args);
    args.extend(["--release-image", &env.spec.release_image, "--pull-secret", pull.to_str().unwrap(), "--base-domain", hcp_dr_e2e::sandbox::BASE_DOMAIN, "--wait", "5m"]);
    env.hcp_dr(&args, &[])
}

/// SingleReplica clusters `names` in demo's namespace, Available.
pub async fn add_clusters(env: &Env, names: &[&str]) {
    for name in names {
        let mut spec = HostedClusterSpec::demo();
        spec.name = name.to_string();
        spec.availability = "SingleReplica".into();
        spec.node_pool_replicas = 1;
        // the namespace exists already
        let objects: Vec<Value> = spec.objects().into_iter().filter(|o| o["kind"] != "Namespace").collect();
        create_all(&env.mgmt, &objects).await.expect("create");
        wait_available(&env.mgmt, "clusters", name, Duration::from_secs(180)).await.expect("Available");
    }
}
