//! The disaster scenario (`hcp-dr-sandbox disaster`, and the test suite):
//! the management cluster running `demo` dies, the cluster is restored on
//! the other one from the last scheduled backup with its DNS records taken
//! over, and when the dead cluster comes back with its old state (its hosted
//! API answering clients at mgmt-a's own address, with data the restored
//! copy does not have: a split brain), `hcp-dr fence` stops the stale copy
//! and the store fence keeps its backups out.
//!
//! Every step drives the real hcp-dr binary; every check reads the real
//! thing (etcd member processes, the Route53 zone, the S3 store) and fails
//! the scenario when it does not hold.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde::Serialize;
use serde_json::{Value, json};

use crate::drill::{Step, WORKLOAD_NS, WORKLOAD_OBJECTS, hcp_dr_command, hosted_client, hosted_server, kube_err, run_create, s3_store, timed, write_workloads};
use crate::sandbox::{HostedClusterSpec, Sandbox, SandboxError, api_for, wait_available};

/// What the scenario found.
#[derive(Debug, Clone, Serialize)]
pub struct DisasterReport {
    pub sandbox_dir: String,
    pub hosted_cluster: String,
    pub steps: Vec<Step>,
    /// The scheduled backup taken on mgmt-a, restored on mgmt-b.
    pub restored_backup: String,
    /// Workload objects (ConfigMaps and Secrets) of the backup found on mgmt-b.
    pub workload_objects_restored: usize,
    /// The write made after the backup is absent (the RPO).
    pub write_after_backup_lost: bool,
    /// Each published hostname with its external-dns owner(s) at the end.
    pub records: Vec<(String, Vec<String>)>,
    /// etcd members of the stale copy running once mgmt-a was back, and after the fence.
    pub stale_members_before_fence: usize,
    pub stale_members_after_fence: usize,
    /// Routes of the stale copy after the fence.
    pub stale_routes_after_fence: usize,
    /// The restored copy's hosted API URL (mgmt-b) and the stale copy's (mgmt-a).
    pub live_api: String,
    pub stale_api: String,
    /// What the stale copy's hosted API answered before the fence, and how
    /// a request to it failed after.
    pub stale_api_before_fence: String,
    pub stale_api_after_fence: String,
    /// Why the backup on mgmt-a was refused, before and after the fence.
    pub stale_backup_refused: Vec<String>,
    /// mgmt-b's backup after the restore, and what `latest` names at the end.
    pub live_backup: String,
    pub latest_at_end: String,
}

impl DisasterReport {
    pub fn render(&self) -> String {
        let mut out = format!("hcp-dr sandbox disaster: {}\n  sandbox dir: {}\n\n", self.hosted_cluster, self.sandbox_dir);
        out.push_str(&format!("  {:<44} {:>8}  {}\n", "step", "seconds", "detail"));
        for step in &self.steps {
            out.push_str(&format!("  {:<44} {:>8.2}  {}\n", step.name, step.seconds, step.detail));
        }
        out.push_str(&format!(
            "\n  restored from {}: {} workload objects; the write made after the backup is {}\n",
            self.restored_backup,
            self.workload_objects_restored,
            if self.write_after_backup_lost { "lost (RPO)" } else { "PRESENT (unexpected)" }
        ));
        out.push_str("  DNS records at the end (external-dns owner):\n");
        for (host, owners) in &self.records {
            out.push_str(&format!("    {host:<44} {}\n", owners.join(", ")));
        }
        out.push_str(&format!(
            "  stale copy on mgmt-a: {} etcd member(s) running when it came back, {} after the fence; {} Route(s) left\n",
            self.stale_members_before_fence, self.stale_members_after_fence, self.stale_routes_after_fence
        ));
        out.push_str(&format!("  stale copy's API {}: before the fence {}\n", self.stale_api, self.stale_api_before_fence));
        out.push_str(&format!("  stale copy's API after the fence: {}\n", self.stale_api_after_fence));
        out.push_str(&format!("  live copy's API: {}\n", self.live_api));
        for refusal in &self.stale_backup_refused {
            out.push_str(&format!("  backup on mgmt-a refused: {refusal}\n"));
        }
        out.push_str(&format!("  latest: {} (mgmt-b's backup: {})\n", self.latest_at_end, self.live_backup));
        out
    }
}

/// Bring a sandbox up in `dir`, run the scenario with the hcp-dr binary at
/// `hcp_dr`, and shut the sandbox down.
pub async fn run(dir: &Path, hcp_dr: &Path) -> Result<DisasterReport, SandboxError> {
    let mut steps = Vec::new();
    let mut sandbox = timed(&mut steps, "sandbox up", async {
        let sandbox = Sandbox::up(dir).await?;
        Ok((sandbox, "mgmt-a and mgmt-b, S3, Route53".to_string()))
    })
    .await?;
    let result = scenario(&mut sandbox, hcp_dr, &mut steps).await;
    let sandbox_dir = sandbox.dir.display().to_string();
    sandbox.shutdown().await;
    let mut report = result?;
    report.sandbox_dir = sandbox_dir;
    report.steps = steps;
    Ok(report)
}

/// An hcp-dr command that exited: its code and its output.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self, what: &str) -> Result<Value, SandboxError> {
        if self.code != Some(0) {
            return Err(SandboxError::Check(format!("hcp-dr {what} exited with {:?}:\n{}\n{}", self.code, self.stdout, self.stderr)));
        }
        serde_json::from_str(&self.stdout).map_err(|e| SandboxError::Check(format!("hcp-dr {what} printed no JSON report ({e}):\n{}", self.stdout)))
    }
}

async fn hcp_dr(sandbox: &Sandbox, bin: &Path, args: &[&str]) -> Result<Ran, SandboxError> {
    let mut cmd = hcp_dr_command(sandbox, bin);
    cmd.args(args);
    let out = cmd.output().await.map_err(|source| SandboxError::Io { path: bin.to_path_buf(), source })?;
    Ok(Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// The id of the backup a backup report names (the last part of its URL).
fn backup_id(report: &Value) -> String {
    report["backup"].as_str().and_then(|url| url.rsplit('/').next()).unwrap_or_default().to_string()
}

/// How many processes mention `needle` on their command line.
pub fn processes_with(needle: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok()))
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle)))
        .count()
}

/// Poll `check` every 250 ms until it returns Some, for at most `limit`.
async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T, SandboxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, SandboxError>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if start.elapsed() > limit {
            return Err(SandboxError::Timeout { what: what.to_string(), seconds: limit.as_secs() });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn cluster_client(sandbox: &Sandbox, name: &str) -> Result<(String, std::path::PathBuf), SandboxError> {
    let cluster = sandbox.cluster(name).ok_or_else(|| SandboxError::Check(format!("{name} is not running")))?;
    Ok((cluster.api.url().to_string(), cluster.kubeconfig.clone()))
}

async fn client_of(sandbox: &Sandbox, name: &str) -> Result<kube::Client, SandboxError> {
    let cluster = sandbox.cluster(name).ok_or_else(|| SandboxError::Check(format!("{name} is not running")))?;
    cluster.api.client().await.map_err(|source| SandboxError::ApiServer { cluster: name.into(), source })
}

/// The hosts of the Routes of `hcp_ns`.
async fn route_hosts(client: &kube::Client, hcp_ns: &str) -> Result<Vec<String>, SandboxError> {
    let routes = api_for(client, &json!({"apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"namespace": hcp_ns}}));
    let listed = routes.list(&ListParams::default()).await.map_err(kube_err("listing Routes"))?;
    let mut hosts: Vec<String> = listed.items.iter().filter_map(|r| r.data.pointer("/spec/host").and_then(Value::as_str).map(str::to_string)).collect();
    hosts.sort();
    Ok(hosts)
}

async fn owned_by(sandbox: &Sandbox, hosts: &[String], owner: &str) -> Result<bool, SandboxError> {
    for host in hosts {
        if sandbox.owners_of(host).await? != [owner] {
            return Ok(false);
        }
    }
    Ok(!hosts.is_empty())
}

async fn scenario(sandbox: &mut Sandbox, bin: &Path, steps: &mut Vec<Step>) -> Result<DisasterReport, SandboxError> {
    let spec = HostedClusterSpec::demo();
    let hcp_ns = format!("{}-{}", spec.namespace, spec.name);
    let (zone, r53) = (sandbox.zone_id.clone(), sandbox.route53.url().to_string());
    let s3_endpoint = sandbox.s3.https_url().to_string();
    let latest = format!("{}/{}/{}/latest", s3_store(), spec.namespace, spec.name);
    let (a_url, a_kubeconfig) = cluster_client(sandbox, "mgmt-a")?;
    let (b_url, b_kubeconfig) = cluster_client(sandbox, "mgmt-b")?;
    let (a_kubeconfig, b_kubeconfig) = (a_kubeconfig.display().to_string(), b_kubeconfig.display().to_string());
    let a = client_of(sandbox, "mgmt-a").await?;

    let hosts = timed(steps, "create demo on mgmt-a, records published", async {
        run_create(sandbox, bin, &spec).await?;
        let hosts = until("mgmt-a's Routes", Duration::from_secs(60), || async {
            let hosts = route_hosts(&a, &hcp_ns).await?;
            Ok((hosts.len() >= 4).then_some(hosts))
        })
        .await?;
        until("mgmt-a's external-dns to publish every hostname", Duration::from_secs(60), || async { Ok(owned_by(sandbox, &hosts, "mgmt-a").await?.then_some(())) }).await?;
        let detail = format!("{} hostnames owned by mgmt-a", hosts.len());
        Ok((hosts, detail))
    })
    .await?;

    let hosted = hosted_client(&a, &spec.namespace, &spec.name).await?;
    let restored_backup = timed(steps, "workloads, scheduled backup to S3", async {
        let written = write_workloads(&hosted).await?;
        let ran = hcp_dr(
            sandbox,
            bin,
            &["backup", "--hosted-cluster", &spec.name, "-n", &spec.namespace, "--kubeconfig", &a_kubeconfig, "--to", &s3_store(), "--s3-endpoint", &s3_endpoint, "--route53-zone", &zone, "--route53-endpoint", &r53],
        )
        .await?;
        let id = backup_id(&ran.json("backup on mgmt-a")?);
        Ok((id.clone(), format!("{written} workload objects; backup {id}")))
    })
    .await?;

    timed(steps, "a write after the backup", async {
        let late: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after-the-backup"}, "data": {"k": "v"}}))
            .map_err(|e| SandboxError::Check(e.to_string()))?;
        Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS).create(&PostParams::default(), &late).await.map_err(kube_err("writing after the backup"))?;
        Ok(((), "ConfigMap after-the-backup".to_string()))
    })
    .await?;

    timed(steps, "mgmt-a dies", async {
        sandbox.lose("mgmt-a").await?;
        Ok(((), format!("{a_url}: API server, operator, external-dns, etcd members all stopped")))
    })
    .await?;

    let b = client_of(sandbox, "mgmt-b").await?;
    let (objects, lost_write) = timed(steps, "restore latest on mgmt-b, take DNS over", async {
        let ran = hcp_dr(
            sandbox,
            bin,
            &["restore", "--from", &latest, "--kubeconfig", &b_kubeconfig, "--s3-endpoint", &s3_endpoint, "--take-over-dns", "--route53-zone", &zone, "--route53-endpoint", &r53, "--dns-wait", "2m"],
        )
        .await?;
        ran.json("restore on mgmt-b")?;
        wait_available(&b, &spec.namespace, &spec.name, Duration::from_secs(120)).await?;
        let hosted = hosted_client(&b, &spec.namespace, &spec.name).await?;
        let cms = Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS).list(&ListParams::default()).await.map_err(kube_err("listing restored ConfigMaps"))?;
        let secrets = Api::<Secret>::namespaced(hosted, WORKLOAD_NS).list(&ListParams::default().labels("app=drill")).await.map_err(kube_err("listing restored Secrets"))?;
        let names: Vec<String> = cms.items.iter().filter_map(|c| c.metadata.name.clone()).collect();
        let missing: Vec<String> = (0..WORKLOAD_OBJECTS).map(|i| format!("config-{i:02}")).filter(|n| !names.contains(n)).collect();
        if !missing.is_empty() || secrets.items.len() < WORKLOAD_OBJECTS {
            return Err(SandboxError::Check(format!("restored data incomplete: ConfigMaps missing {missing:?}, {} Secrets", secrets.items.len())));
        }
        let lost_write = !names.iter().any(|n| n == "after-the-backup");
        if !owned_by(sandbox, &hosts, "mgmt-b").await? {
            return Err(SandboxError::Check("after the take-over, not every hostname is owned by mgmt-b".into()));
        }
        let objects = names.iter().filter(|n| n.starts_with("config-")).count() + secrets.items.len();
        Ok(((objects, lost_write), format!("Available on {b_url}; {objects} workload objects; records owned by mgmt-b")))
    })
    .await?;

    let live_backup = timed(steps, "scheduled backup on mgmt-b", async {
        let ran = hcp_dr(
            sandbox,
            bin,
            &["backup", "--hosted-cluster", &spec.name, "-n", &spec.namespace, "--kubeconfig", &b_kubeconfig, "--to", &s3_store(), "--s3-endpoint", &s3_endpoint, "--route53-zone", &zone, "--route53-endpoint", &r53],
        )
        .await?;
        let id = backup_id(&ran.json("backup on mgmt-b")?);
        Ok((id.clone(), format!("backup {id} becomes latest")))
    })
    .await?;

    let stale_needle = format!("{}/pv/{hcp_ns}/", sandbox.dir.join("mgmt-a").join("state").display());
    let stale_members_before_fence = timed(steps, "mgmt-a comes back with its old state", async {
        sandbox.revive("mgmt-a").await?;
        let running = until("the stale copy's etcd members to start on mgmt-a", Duration::from_secs(90), || async {
            let n = processes_with(&stale_needle);
            Ok((n > 0).then_some(n))
        })
        .await?;
        Ok((running, format!("{running} stale etcd member(s) running again: two control planes for one cluster")))
    })
    .await?;

    // The stale copy serves clients at mgmt-a's own address (its load
    // balancer), with the write the restore lost: two copies of one cluster
    // answering at once, the split brain the fence ends.
    let a = client_of(sandbox, "mgmt-a").await?;
    let live_api = hosted_server(&b, &spec.namespace, &spec.name).await?;
    let stale = hosted_client(&a, &spec.namespace, &spec.name).await?;
    let (stale_api, stale_api_before_fence) = timed(steps, "the stale copy's API answers on mgmt-a", async {
        let stale_api = hosted_server(&a, &spec.namespace, &spec.name).await?;
        if stale_api == live_api {
            return Err(SandboxError::Check(format!("the stale and the live copy name one API address ({stale_api})")));
        }
        let late = until("the stale copy's hosted API to answer", Duration::from_secs(90), || async {
            Ok(Api::<ConfigMap>::namespaced(stale.clone(), WORKLOAD_NS).get_opt("after-the-backup").await.ok())
        })
        .await?;
        if late.is_none() {
            return Err(SandboxError::Check(format!("the stale copy at {stale_api} answered without the write made on it after the backup")));
        }
        let live = hosted_client(&b, &spec.namespace, &spec.name).await?;
        if Api::<ConfigMap>::namespaced(live, WORKLOAD_NS).get_opt("after-the-backup").await.map_err(kube_err("reading the live copy"))?.is_some() {
            return Err(SandboxError::Check("the live copy holds the write made after the backup".into()));
        }
        let said = "served ConfigMap after-the-backup, which the live copy does not have".to_string();
        Ok(((stale_api.clone(), said.clone()), format!("{stale_api} {said}")))
    })
    .await?;

    let mut stale_backup_refused = Vec::new();
    let backup_on_a = ["backup", "--hosted-cluster", spec.name.as_str(), "-n", spec.namespace.as_str(), "--kubeconfig", a_kubeconfig.as_str(), "--to", &s3_store(), "--s3-endpoint", s3_endpoint.as_str()].map(str::to_string);
    // refused with exit 1 and the reason in the report, naming `says`
    let refused = |ran: Ran, says: &str| -> Result<String, SandboxError> {
        let report: Value = serde_json::from_str(&ran.stdout).unwrap_or_default();
        let why = report["error"].as_str().unwrap_or_default().to_string();
        if ran.code != Some(1) || !why.contains(says) {
            return Err(SandboxError::Check(format!(
                "a backup of the stale copy was not refused for `{says}` (exit {:?}):\n{}\n{}",
                ran.code, ran.stdout, ran.stderr
            )));
        }
        Ok(why)
    };
    let why = timed(steps, "backup on mgmt-a (before the fence)", async {
        let args: Vec<&str> = backup_on_a.iter().map(String::as_str).collect();
        let why = refused(hcp_dr(sandbox, bin, &args).await?, "the store is fenced")?;
        Ok((why, "refused by the store fence".to_string()))
    })
    .await?;
    stale_backup_refused.push(why);

    let (stale_members_after_fence, stale_routes_after_fence, stale_api_after_fence) = timed(steps, "hcp-dr fence on mgmt-a", async {
        let ran = hcp_dr(
            sandbox,
            bin,
            &["fence", "--hosted-cluster", &spec.name, "-n", &spec.namespace, "--kubeconfig", &a_kubeconfig, "--store", &s3_store(), "--s3-endpoint", &s3_endpoint],
        )
        .await?;
        let report = ran.json("fence on mgmt-a")?;
        // the kubelet stops a member when its pod goes: give it a moment
        let members = until("the stale etcd members to stop", Duration::from_secs(30), || async {
            let n = processes_with(&stale_needle);
            Ok((n == 0).then_some(n))
        })
        .await?;
        let routes = route_hosts(&a, &hcp_ns).await?.len();
        if routes != 0 {
            return Err(SandboxError::Check(format!("{routes} Route(s) of the stale copy left after the fence")));
        }
        let refused = until("the stale copy's hosted API to stop answering", Duration::from_secs(30), || async {
            Ok(Api::<ConfigMap>::namespaced(stale.clone(), WORKLOAD_NS).get_opt("after-the-backup").await.err().map(|e| e.to_string()))
        })
        .await?;
        let scaled = report["scaled_to_zero"].as_array().map(Vec::len).unwrap_or(0);
        Ok(((members, routes, refused), format!("{scaled} workloads scaled to 0, Routes removed, HostedCluster annotated; its API no longer answers")))
    })
    .await?;

    let records = timed(steps, "records stay with mgmt-b", async {
        // several passes of both external-dns controllers
        tokio::time::sleep(Duration::from_secs(4)).await;
        if !owned_by(sandbox, &hosts, "mgmt-b").await? {
            return Err(SandboxError::Check("a record left mgmt-b after mgmt-a came back".into()));
        }
        let mut records = Vec::new();
        for host in &hosts {
            records.push((host.clone(), sandbox.owners_of(host).await?));
        }
        Ok((records, format!("{} hostnames owned by mgmt-b", hosts.len())))
    })
    .await?;

    let why = timed(steps, "backup on mgmt-a (after the fence)", async {
        let args: Vec<&str> = backup_on_a.iter().map(String::as_str).collect();
        let why = refused(hcp_dr(sandbox, bin, &args).await?, "is fenced on this management cluster")?;
        Ok((why, "refused: the copy is fenced".to_string()))
    })
    .await?;
    stale_backup_refused.push(why);

    let latest_at_end = timed(steps, "latest still names mgmt-b's backup", async {
        let ran = hcp_dr(sandbox, bin, &["backups", "describe", &latest, "--s3-endpoint", &s3_endpoint]).await?;
        let id = ran.json("backups describe latest")?["backup_id"].as_str().unwrap_or_default().to_string();
        if id != live_backup {
            return Err(SandboxError::Check(format!("latest names {id}, not mgmt-b's backup {live_backup}")));
        }
        Ok((id.clone(), id))
    })
    .await?;

    let fence_key = format!("{}/{}/fence.json", spec.namespace, spec.name);
    let store_fence = || async {
        let ran = hcp_dr(sandbox, bin, &["backups", "list", "--store", &s3_store(), "--s3-endpoint", &s3_endpoint]).await?;
        Ok::<Value, SandboxError>(ran.json("backups list")?.as_array().and_then(|l| l.first()).map(|c| c["fence"].clone()).unwrap_or_default())
    };
    let fence_before = store_fence().await?;
    timed(steps, "destroy the fenced copy on mgmt-a", async {
        let ran = hcp_dr(sandbox, bin, &["cluster", "destroy", &spec.name, "-n", &spec.namespace, "--kubeconfig", &a_kubeconfig]).await?;
        let report = ran.json("cluster destroy on mgmt-a")?;
        if report["fenced_copy_of"].as_str() != Some(b_url.trim_end_matches('/')) && report["fenced_copy_of"].as_str() != Some(b_url.as_str()) {
            return Err(SandboxError::Check(format!("cluster destroy did not see a fenced copy: {report}")));
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        if !owned_by(sandbox, &hosts, "mgmt-b").await? {
            return Err(SandboxError::Check("destroying the fenced copy moved a record away from mgmt-b".into()));
        }
        if store_fence().await? != fence_before {
            return Err(SandboxError::Check(format!("destroying the fenced copy changed the store fence ({fence_key})")));
        }
        wait_available(&b, &spec.namespace, &spec.name, Duration::from_secs(30)).await?;
        let hosted = hosted_client(&b, &spec.namespace, &spec.name).await?;
        Api::<ConfigMap>::namespaced(hosted, WORKLOAD_NS).get("config-00").await.map_err(kube_err("reading the live copy after the destroy"))?;
        Ok(((), "deleted on mgmt-a only: records, store fence and the live copy on mgmt-b untouched".to_string()))
    })
    .await?;

    Ok(DisasterReport {
        sandbox_dir: String::new(),
        hosted_cluster: format!("{}/{}", spec.namespace, spec.name),
        steps: Vec::new(),
        restored_backup,
        workload_objects_restored: objects,
        write_after_backup_lost: lost_write,
        records,
        stale_members_before_fence,
        stale_members_after_fence,
        stale_routes_after_fence,
        live_api,
        stale_api,
        stale_api_before_fence,
        stale_api_after_fence,
        stale_backup_refused,
        live_backup,
        latest_at_end,
    })
}
