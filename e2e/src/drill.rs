//! The sandbox drill: the README's first command. It brings a sandbox up,
//! creates the hosted cluster `demo` on `mgmt-a`, writes sample workloads into
//! its hosted API, checks where they landed (the hosted cluster's own etcd
//! members, real processes), runs the hcp-dr operations that exist, and prints
//! a timed report.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde::Serialize;
use serde_json::json;

use crate::procs::etcd::{ClientTls, connect_client};
use crate::sandbox::{HostedClusterSpec, Sandbox, SandboxError, UpOptions, wait_available};

/// Namespace of the sample workloads in the hosted cluster.
pub const WORKLOAD_NS: &str = "drill-app";
/// How many ConfigMaps and Secrets the drill writes.
pub const WORKLOAD_OBJECTS: usize = 20;

/// One timed step of the drill.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: String,
    pub seconds: f64,
    pub detail: String,
}

/// One etcd member of the hosted cluster, as seen over its client port.
#[derive(Debug, Clone, Serialize)]
pub struct MemberReport {
    pub pod: String,
    pub pod_ip: String,
    pub revision: i64,
    pub db_size: i64,
    pub leader: bool,
    pub workload_keys: usize,
}

/// What the drill found.
#[derive(Debug, Clone, Serialize)]
pub struct DrillReport {
    pub sandbox_dir: String,
    pub crds: String,
    pub hosted_cluster: String,
    /// `mgmt-a: URL (emulated)` or `(existing, from --mgmt-kubeconfig)`.
    pub management_clusters: Vec<String>,
    pub steps: Vec<Step>,
    pub members: Vec<MemberReport>,
    pub not_yet_available: Vec<String>,
    /// On existing clusters: what the sandbox removed at the end, and left.
    pub cleanup: Vec<String>,
}

impl DrillReport {
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!("hcp-dr sandbox drill: {}\n", self.hosted_cluster));
        out.push_str(&format!("  sandbox dir: {}\n  CRDs: {}\n", self.sandbox_dir, self.crds));
        for cluster in &self.management_clusters {
            out.push_str(&format!("  {cluster}\n"));
        }
        out.push('\n');
        out.push_str(&format!("  {:<34} {:>8}  {}\n", "step", "seconds", "detail"));
        for step in &self.steps {
            out.push_str(&format!("  {:<34} {:>8.2}  {}\n", step.name, step.seconds, step.detail));
        }
        out.push_str(&format!(
            "\n  hosted etcd members after the migration, on mgmt-b (real etcd processes; keys under /kubernetes.io/.../{WORKLOAD_NS}/):\n"
        ));
        out.push_str(&format!(
            "  {:<8} {:<16} {:>9} {:>10} {:>7} {:>14}\n",
            "pod", "pod IP", "revision", "db bytes", "leader", "workload keys"
        ));
        for m in &self.members {
            out.push_str(&format!(
                "  {:<8} {:<16} {:>9} {:>10} {:>7} {:>14}\n",
                m.pod, m.pod_ip, m.revision, m.db_size, m.leader, m.workload_keys
            ));
        }
        if !self.cleanup.is_empty() {
            out.push_str("\n  clean-up of the existing management clusters:\n");
            for line in &self.cleanup {
                out.push_str(&format!("    {line}\n"));
            }
        }
        if !self.not_yet_available.is_empty() {
            out.push_str("\n  not run (not implemented in hcp-dr yet):\n");
            for item in &self.not_yet_available {
                out.push_str(&format!("    - {item}\n"));
            }
        }
        out
    }
}

pub(crate) fn kube_err(action: &str) -> impl FnOnce(kube::Error) -> SandboxError + '_ {
    move |source| SandboxError::Kube {
        action: action.to_string(),
        source,
    }
}

pub(crate) async fn timed<T, F>(steps: &mut Vec<Step>, name: &str, fut: F) -> Result<T, SandboxError>
where
    F: std::future::Future<Output = Result<(T, String), SandboxError>>,
{
    let start = Instant::now();
    let (value, detail) = fut.await?;
    let step = Step {
        name: name.to_string(),
        seconds: start.elapsed().as_secs_f64(),
        detail,
    };
    tracing::info!(step = %step.name, seconds = step.seconds, "{}", step.detail);
    steps.push(step);
    Ok(value)
}

/// The hosted cluster's admin kubeconfig, from its `<name>-admin-kubeconfig`
/// secret on `mgmt`.
async fn admin_kubeconfig(mgmt: &kube::Client, ns: &str, name: &str) -> Result<kube::config::Kubeconfig, SandboxError> {
    let secret_name = format!("{name}-admin-kubeconfig");
    let secret = Api::<Secret>::namespaced(mgmt.clone(), ns)
        .get(&secret_name)
        .await
        .map_err(kube_err("reading the admin kubeconfig secret"))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|b| b.0.clone())
        .ok_or_else(|| SandboxError::Timeout {
            what: format!("{secret_name} to hold a kubeconfig"),
            seconds: 0,
        })?;
    let text = String::from_utf8_lossy(&bytes).to_string();
    kube::config::Kubeconfig::from_yaml(&text).map_err(|err| SandboxError::Kube {
        action: format!("parsing {secret_name}"),
        source: kube::Error::InferKubeconfig(err),
    })
}

/// The URL of the hosted cluster's API as `mgmt` serves it (each management
/// cluster has its own address).
pub async fn hosted_server(mgmt: &kube::Client, ns: &str, name: &str) -> Result<String, SandboxError> {
    let config = admin_kubeconfig(mgmt, ns, name).await?;
    config
        .clusters
        .iter()
        .find_map(|c| c.cluster.as_ref().and_then(|c| c.server.clone()))
        .ok_or_else(|| SandboxError::Check(format!("{name}-admin-kubeconfig names no server")))
}

/// A kube client for the hosted cluster from its `<name>-admin-kubeconfig` secret.
pub async fn hosted_client(
    mgmt: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<kube::Client, SandboxError> {
    let config = admin_kubeconfig(mgmt, ns, name).await?;
    let config = kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|err| SandboxError::Kube {
            action: format!("loading {name}-admin-kubeconfig"),
            source: kube::Error::InferKubeconfig(err),
        })?;
    kube::Client::try_from(config).map_err(kube_err("building the hosted cluster client"))
}

/// Write the sample workloads into the hosted cluster.
pub async fn write_workloads(hosted: &kube::Client) -> Result<usize, SandboxError> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": WORKLOAD_NS}}))
        .map_err(|e| SandboxError::Kube { action: "namespace".into(), source: kube::Error::SerdeError(e) })?;
    match Api::<Namespace>::all(hosted.clone()).create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(kube_err("creating the workload namespace")(e)),
    }
    let cms = Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS);
    let secrets = Api::<Secret>::namespaced(hosted.clone(), WORKLOAD_NS);
    for i in 0..WORKLOAD_OBJECTS {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("config-{i:02}"), "labels": {"app": "drill"}},
            "data": {"index": i.to_string(), "payload": "x".repeat(256)}
        }))
        .map_err(|e| SandboxError::Kube { action: "configmap".into(), source: kube::Error::SerdeError(e) })?;
        cms.create(&PostParams::default(), &cm).await.map_err(kube_err("creating a workload ConfigMap"))?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("secret-{i:02}"), "labels": {"app": "drill"}},
            "stringData": {"token": format!("drill-secret-{i}")}
        }))
        .map_err(|e| SandboxError::Kube { action: "secret".into(), source: kube::Error::SerdeError(e) })?;
        secrets.create(&PostParams::default(), &secret).await.map_err(kube_err("creating a workload Secret"))?;
    }
    Ok(WORKLOAD_OBJECTS * 2)
}

/// Look at each etcd member of the hosted cluster directly over its client
/// port, with the client TLS of the HCP namespace.
/// A client per etcd member of the hosted cluster, straight to its client
/// port with the client TLS of the HCP namespace: `(pod, pod IP, client)`.
pub async fn member_clients(mgmt: &kube::Client, hcp_ns: &str) -> Result<Vec<(String, String, etcd_client::Client)>, SandboxError> {
    let secret = Api::<Secret>::namespaced(mgmt.clone(), hcp_ns)
        .get("etcd-client-tls")
        .await
        .map_err(kube_err("reading etcd-client-tls"))?;
    let ca = Api::<ConfigMap>::namespaced(mgmt.clone(), hcp_ns)
        .get("etcd-ca")
        .await
        .map_err(kube_err("reading etcd-ca"))?;
    let get = |key: &str| -> String {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).to_string())
            .unwrap_or_default()
    };
    let ca_pem = ca.data.as_ref().and_then(|d| d.get("ca.crt")).cloned().unwrap_or_default();
    let pods = Api::<Pod>::namespaced(mgmt.clone(), hcp_ns)
        .list(&ListParams::default().labels("app=etcd"))
        .await
        .map_err(kube_err("listing etcd pods"))?;
    let mut out = Vec::new();
    for pod in pods.items {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let pod_ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
        let tls = ClientTls {
            ca_pem: ca_pem.clone(),
            cert_pem: get("etcd-client.crt"),
            key_pem: get("etcd-client.key"),
            server_name: format!("{pod_name}.etcd-discovery.{hcp_ns}.svc"),
        };
        let client = connect_client(&[format!("https://{pod_ip}:2379")], Some(&tls)).await?;
        out.push((pod_name, pod_ip, client));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Every key each member holds under `prefix`, and its revision.
pub async fn member_keys(mgmt: &kube::Client, hcp_ns: &str, prefix: &str) -> Result<Vec<(String, i64, std::collections::BTreeSet<String>)>, SandboxError> {
    let mut out = Vec::new();
    for (pod, _, mut client) in member_clients(mgmt, hcp_ns).await? {
        let resp = client
            .get(prefix.as_bytes(), Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()))
            .await
            .map_err(crate::procs::ProcError::Etcd)?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
        let keys = resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).to_string()).collect();
        out.push((pod, revision, keys));
    }
    Ok(out)
}

/// Look at each etcd member of the hosted cluster directly over its client
/// port, with the client TLS of the HCP namespace.
pub async fn inspect_members(mgmt: &kube::Client, hcp_ns: &str) -> Result<Vec<MemberReport>, SandboxError> {
    let mut members = Vec::new();
    for (pod_name, pod_ip, mut client) in member_clients(mgmt, hcp_ns).await? {
        let status = client.status().await.map_err(crate::procs::ProcError::Etcd)?;
        let (header_member, leader) = (
            status.header().map(|h| h.member_id()).unwrap_or_default(),
            status.leader(),
        );
        let mut keys = 0;
        for resource in ["configmaps", "secrets"] {
            let prefix = format!("/kubernetes.io/{resource}/{WORKLOAD_NS}/");
            let resp = client
                .get(
                    prefix.as_bytes(),
                    Some(etcd_client::GetOptions::new().with_prefix().with_count_only()),
                )
                .await
                .map_err(crate::procs::ProcError::Etcd)?;
            keys += resp.count() as usize;
        }
        members.push(MemberReport {
            pod: pod_name,
            pod_ip,
            revision: status.header().map(|h| h.revision()).unwrap_or_default(),
            db_size: status.db_size(),
            leader: header_member == leader,
            workload_keys: keys,
        });
    }
    members.sort_by(|a, b| a.pod.cmp(&b.pod));
    Ok(members)
}

/// Run the drill in `dir` (a running sandbox is started there and stopped at
/// the end), driving the hcp-dr binary at `hcp_dr`.
pub async fn run(dir: &Path, hcp_dr: &Path) -> Result<DrillReport, SandboxError> {
    run_with(dir, hcp_dr, &UpOptions::default()).await
}

/// [`run`] on the management clusters `opts` names (`--mgmt-kubeconfig`);
/// what the sandbox created on them is removed at the end and listed in
/// the report.
pub async fn run_with(dir: &Path, hcp_dr: &Path, opts: &UpOptions) -> Result<DrillReport, SandboxError> {
    let mut steps = Vec::new();
    let sandbox = timed(&mut steps, "sandbox up", async {
        let sandbox = Sandbox::up_with(dir, opts).await?;
        let detail = format!(
            "mgmt-a {} / mgmt-b {}, S3 {}, Route53 {}, HyperShift etcd-init {}",
            sandbox.clusters[0].api.url(),
            sandbox.clusters[1].api.url(),
            sandbox.s3.https_url(),
            sandbox.route53.url(),
            sandbox.etcd_init
        );
        Ok((sandbox, detail))
    })
    .await?;
    let result = drill_on(&sandbox, hcp_dr, &mut steps).await;
    let crds = crate::crds::crd_dir().1.to_string();
    let sandbox_dir = sandbox.dir.display().to_string();
    let management_clusters = sandbox
        .clusters
        .iter()
        .map(|c| {
            let how = if c.etcd.is_some() { "emulated" } else { "existing, from --mgmt-kubeconfig" };
            format!("{}: {} ({how})", c.name, c.api.url())
        })
        .collect();
    let cleanup = sandbox.shutdown().await;
    let (hosted_cluster, members) = result?;
    if !cleanup.complete {
        return Err(SandboxError::Check(format!("the drill passed, but its clean-up did not:\n{}", cleanup.lines.join("\n"))));
    }
    Ok(DrillReport {
        sandbox_dir,
        crds,
        hosted_cluster,
        management_clusters,
        steps,
        members,
        not_yet_available: Vec::new(),
        cleanup: cleanup.lines,
    })
}

async fn drill_on(
    sandbox: &Sandbox,
    hcp_dr: &Path,
    steps: &mut Vec<Step>,
) -> Result<(String, Vec<MemberReport>), SandboxError> {
    let spec = HostedClusterSpec::demo();
    let mgmt = sandbox.clusters[0]
        .api
        .client()
        .await
        .map_err(|source| SandboxError::ApiServer { cluster: "mgmt-a".into(), source })?;
    timed(steps, "hcp-dr cluster create demo", async {
        let report = run_create(sandbox, hcp_dr, &spec).await?;
        let available = report["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Available" && c["status"] == "True"));
        if !available {
            return Err(SandboxError::Check("hcp-dr cluster create returned a HostedCluster that is not Available".into()));
        }
        Ok(((), format!("{} in {}, {} nodes, Available", spec.availability, spec.namespace, spec.node_pool_replicas)))
    })
    .await?;
    let hosted = timed(steps, "connect to the hosted API", async {
        let hosted = hosted_client(&mgmt, &spec.namespace, &spec.name).await?;
        let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(hosted.clone())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing hosted nodes"))?;
        Ok((hosted, format!("{} nodes", nodes.items.len())))
    })
    .await?;
    timed(steps, "write sample workloads", async {
        let n = write_workloads(&hosted).await?;
        Ok(((), format!("{n} objects in namespace {WORKLOAD_NS}")))
    })
    .await?;
    let hcp_ns = format!("{}-{}", spec.namespace, spec.name);
    timed(steps, "inspect hosted etcd members", async {
        let members = inspect_members(&mgmt, &hcp_ns).await?;
        let expected_members = if spec.availability == "HighlyAvailable" { 3 } else { 1 };
        if members.len() != expected_members {
            return Err(SandboxError::Check(format!(
                "{} etcd members answer, {expected_members} expected", members.len()
            )));
        }
        for m in &members {
            if m.workload_keys != WORKLOAD_OBJECTS * 2 {
                return Err(SandboxError::Check(format!(
                    "member {} holds {} of the {} workload keys", m.pod, m.workload_keys, WORKLOAD_OBJECTS * 2
                )));
            }
        }
        Ok(((), format!("{} members, each holding all {} workload keys", members.len(), WORKLOAD_OBJECTS * 2)))
    })
    .await?;
    let backup = timed(steps, "hcp-dr backup to S3", async {
        let report = run_backup(sandbox, hcp_dr, &spec).await?;
        let detail = format!(
            "{} (revision {}, API down {:.1}s)",
            report["backup"].as_str().unwrap_or("?"),
            report["etcd_revision"].as_i64().unwrap_or_default(),
            report["api_downtime_seconds"].as_f64().unwrap_or_default()
        );
        Ok((report, detail))
    })
    .await?;
    timed(steps, "verify the backup", async {
        let detail = verify_backup(sandbox, &backup).await?;
        Ok(((), detail))
    })
    .await?;
    timed(steps, "cluster back in service", async {
        wait_available(&mgmt, &spec.namespace, &spec.name, Duration::from_secs(120)).await?;
        let hc = crate::sandbox::api_for(
            &mgmt,
            &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": spec.namespace}}),
        )
        .get(&spec.name)
        .await
        .map_err(kube_err("reading the HostedCluster"))?;
        let value = serde_json::to_value(&hc).unwrap_or_default();
        if !value["spec"]["pausedUntil"].is_null() {
            return Err(SandboxError::Check(format!(
                "the HostedCluster is still paused after the backup: pausedUntil={}",
                value["spec"]["pausedUntil"]
            )));
        }
        let cms = Api::<ConfigMap>::namespaced(hosted.clone(), WORKLOAD_NS)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing workloads after the backup"))?;
        Ok(((), format!("Available, not paused, hosted API serves {} ConfigMaps", cms.items.len())))
    })
    .await?;
    timed(steps, "hcp-dr drill on mgmt-b", async {
        let backup_url = backup["backup"].as_str().unwrap_or_default().to_string();
        let report = run_drill(sandbox, hcp_dr, &backup_url).await?;
        let checks = report["checks"].as_array().cloned().unwrap_or_default();
        let failed: Vec<String> = checks.iter().filter(|c| c["passed"] != true).map(|c| c["name"].as_str().unwrap_or("?").to_string()).collect();
        if report["passed"] != true || !failed.is_empty() {
            return Err(SandboxError::Check(format!("the drill failed: checks {failed:?}")));
        }
        Ok(((), format!(
            "{} restored and removed: RTO {:.1}s, RPO {:.1}s, {} checks passed",
            report["drill"].as_str().unwrap_or("?"),
            report["rto_seconds"].as_f64().unwrap_or_default(),
            report["rpo_seconds"].as_f64().unwrap_or_default(),
            checks.len()
        )))
    })
    .await?;
    timed(steps, "hcp-dr migrate to mgmt-b", async {
        let report = run_migrate(sandbox, hcp_dr, &spec).await?;
        let detail = format!(
            "RTO {:.1}s (API down on mgmt-a until Available on mgmt-b), {} stages",
            report["rto_seconds"].as_f64().unwrap_or_default(),
            report["stage_seconds"].as_object().map_or(0, |s| s.len())
        );
        Ok(((), detail))
    })
    .await?;
    let mgmt_b = sandbox.clusters[1]
        .api
        .client()
        .await
        .map_err(|source| SandboxError::ApiServer { cluster: "mgmt-b".into(), source })?;
    let members = timed(steps, "verify on mgmt-b, source gone", async {
        wait_available(&mgmt_b, &spec.namespace, &spec.name, Duration::from_secs(120)).await?;
        let members = inspect_members(&mgmt_b, &hcp_ns).await?;
        if let Some(m) = members.iter().find(|m| m.workload_keys != WORKLOAD_OBJECTS * 2) {
            return Err(SandboxError::Check(format!(
                "on mgmt-b, member {} holds {} of the {} workload keys", m.pod, m.workload_keys, WORKLOAD_OBJECTS * 2
            )));
        }
        let hosted_b = hosted_client(&mgmt_b, &spec.namespace, &spec.name).await?;
        let cms = Api::<ConfigMap>::namespaced(hosted_b, WORKLOAD_NS)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing workloads on mgmt-b"))?;
        let left = crate::sandbox::api_for(
            &mgmt,
            &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": spec.namespace}}),
        )
        .get_opt(&spec.name)
        .await
        .map_err(kube_err("reading the HostedCluster on mgmt-a"))?;
        if left.is_some() {
            return Err(SandboxError::Check("the HostedCluster is still on mgmt-a after the migration".into()));
        }
        let staging = sandbox.s3.root().join(crate::sandbox::BUCKET).join("staging");
        let staged = walk_files(&staging);
        if !staged.is_empty() {
            return Err(SandboxError::Check(format!("the staged snapshot copy was not deleted: {staged:?}")));
        }
        Ok((
            members.clone(),
            format!(
                "Available on mgmt-b, {} members each with all {} workload keys, hosted API serves {} ConfigMaps; gone from mgmt-a",
                members.len(),
                WORKLOAD_OBJECTS * 2,
                cms.items.len()
            ),
        ))
    })
    .await?;
    timed(steps, "hcp-dr report", async {
        let report = run_report(sandbox, hcp_dr).await?;
        let rows = report["clusters"].as_array().cloned().unwrap_or_default();
        let demo = rows
            .iter()
            .find(|r| r["namespace"] == spec.namespace.as_str() && r["hosted_cluster"] == spec.name.as_str())
            .ok_or_else(|| SandboxError::Check(format!("hcp-dr report has no row for {}/{}", spec.namespace, spec.name)))?;
        if demo["status"] != "green" || demo["last_drill"]["passed"] != true || demo["last_restore"]["passed"] != true {
            return Err(SandboxError::Check(format!("hcp-dr report does not show {} green with its drill and migration passed: {demo}", spec.name)));
        }
        Ok(((), format!(
            "{} green: {} backups, drill passed (RTO {:.1}s), migration passed (RTO {:.1}s); {} written",
            spec.name,
            demo["complete_backups"],
            demo["last_drill"]["rto_seconds"].as_f64().unwrap_or_default(),
            demo["last_restore"]["rto_seconds"].as_f64().unwrap_or_default(),
            sandbox.dir.join("report.html").display()
        )))
    })
    .await?;
    Ok((format!("{}/{}", spec.namespace, spec.name), members))
}

/// `hcp-dr report` of the sandbox's S3 store and mgmt-b (where demo runs
/// after the migration): writes `report.html` into the sandbox's folder and
/// returns the JSON report.
pub async fn run_report(sandbox: &Sandbox, bin: &Path) -> Result<serde_json::Value, SandboxError> {
    let html = sandbox.dir.join("report.html");
    let mut page = hcp_dr_command(sandbox, bin);
    page.args(["report", "--store", &s3_store(), "--s3-endpoint", sandbox.s3.https_url(), "-o", "html", "--output-file"])
        .arg(&html)
        .arg("--kubeconfig")
        .arg(&sandbox.clusters[1].kubeconfig);
    let output = page.output().await.map_err(|source| SandboxError::Io { path: bin.to_path_buf(), source })?;
    if !output.status.success() {
        return Err(SandboxError::Check(format!("hcp-dr report -o html exited with {}:\n{}", output.status, String::from_utf8_lossy(&output.stderr))));
    }
    let mut cmd = hcp_dr_command(sandbox, bin);
    cmd.args(["report", "--store", &s3_store(), "--s3-endpoint", sandbox.s3.https_url()])
        .arg("--kubeconfig")
        .arg(&sandbox.clusters[1].kubeconfig);
    run_json("report", bin, &mut cmd).await
}

/// The hcp-dr binary: `$HCP_DR_BIN`, else next to this executable.
pub fn hcp_dr_binary() -> Result<std::path::PathBuf, SandboxError> {
    if let Ok(path) = std::env::var("HCP_DR_BIN") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe().map_err(|source| SandboxError::Io { path: "current_exe".into(), source })?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // test binaries live in target/debug/deps
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("hcp-dr");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(SandboxError::Check(format!(
            "the hcp-dr binary is not at {}: build it (cargo build -p hcp-dr) or set HCP_DR_BIN",
            bin.display()
        )))
    }
}

/// The hcp-dr binary with the sandbox's S3 credentials, CA and state dir.
pub(crate) fn hcp_dr_command(sandbox: &Sandbox, bin: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("--output")
        .arg("json")
        .env("AWS_ACCESS_KEY_ID", sandbox.s3.access_key())
        .env("AWS_SECRET_ACCESS_KEY", sandbox.s3.secret_key())
        .env("AWS_REGION", sandbox.s3.region())
        .env("HCP_DR_CA_BUNDLE", sandbox.dir.join("ca.crt"))
        .env("HCP_DR_STATE_DIR", sandbox.dir.join("state"));
    cmd
}

/// Run a prepared hcp-dr command; its JSON report, or an error with its output.
async fn run_json(what: &str, bin: &Path, cmd: &mut tokio::process::Command) -> Result<serde_json::Value, SandboxError> {
    let output = cmd.output().await.map_err(|source| SandboxError::Io { path: bin.to_path_buf(), source })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(SandboxError::Check(format!(
            "hcp-dr {what} exited with {}:\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    serde_json::from_str(&stdout)
        .map_err(|e| SandboxError::Check(format!("hcp-dr {what} printed no JSON report ({e}):\n{stdout}")))
}

/// Every file under `dir` (none when it does not exist).
fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk_files(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// The drill's store: a local directory, hcp-dr's default kind of store.
pub fn local_store(sandbox: &Sandbox) -> std::path::PathBuf {
    sandbox.dir.join("store")
}

/// The sandbox's S3 store for backups.
pub fn s3_store() -> String {
    format!("s3://{}/backups", crate::sandbox::BUCKET)
}

/// `hcp-dr cluster create` of `spec` on mgmt-a (waits for Available);
/// returns the HostedCluster.
pub async fn run_create(sandbox: &Sandbox, bin: &Path, spec: &HostedClusterSpec) -> Result<serde_json::Value, SandboxError> {
    let pull = sandbox.dir.join("pull-secret.json");
    std::fs::write(&pull, br#"{"auths":{"sandbox.invalid":{"auth":"c2FuZGJveDpzYW5kYm94"}}}"#)
        .map_err(|source| SandboxError::Io { path: pull.clone(), source })?;
    let mut cmd = hcp_dr_command(sandbox, bin);
    cmd.args(["cluster", "create", "--name", &spec.name, "-n", &spec.namespace, "--platform", "none"])
        .args(["--release-image", &spec.release_image, "--availability", &spec.availability])
        .args(["--node-pool-replicas", &spec.node_pool_replicas.to_string(), "--base-domain", crate::sandbox::BASE_DOMAIN])
        .arg("--pull-secret")
        .arg(&pull)
        .arg("--kubeconfig")
        .arg(&sandbox.clusters[0].kubeconfig)
        .args(["--wait", "3m"]);
    if sandbox.clusters[0].api.controllers() == crate::operator::Controllers::Cluster {
        // its control plane (and hcp-dr's movers) on the sandbox's Node
        cmd.args(crate::operator::kubelet::placement_args());
    }
    run_json("cluster create", bin, &mut cmd).await
}

/// Run `hcp-dr backup` of `spec` on mgmt-a into the sandbox's S3 store; returns its JSON report.
pub async fn run_backup(sandbox: &Sandbox, bin: &Path, spec: &HostedClusterSpec) -> Result<serde_json::Value, SandboxError> {
    let journal = sandbox.dir.join("journals").join("drill-backup.jsonl");
    let mut cmd = hcp_dr_command(sandbox, bin);
    cmd.args(["backup", "--hosted-cluster", &spec.name, "-n", &spec.namespace])
        .arg("--kubeconfig")
        .arg(&sandbox.clusters[0].kubeconfig)
        .args(["--to", &s3_store(), "--s3-endpoint", sandbox.s3.https_url()])
        .arg("--journal")
        .arg(&journal);
    run_json("backup", bin, &mut cmd).await
}

/// Run `hcp-dr drill` of the backup at `backup_url` on mgmt-b (the staging
/// cluster); its report is also written to `<sandbox>/drill-report.{md,json}`.
pub async fn run_drill(sandbox: &Sandbox, bin: &Path, backup_url: &str) -> Result<serde_json::Value, SandboxError> {
    let mut cmd = hcp_dr_command(sandbox, bin);
    cmd.args(["drill", "--from", backup_url, "--s3-endpoint", sandbox.s3.https_url()])
        .arg("--kubeconfig")
        .arg(&sandbox.clusters[1].kubeconfig)
        .arg("--report")
        .arg(sandbox.dir.join("drill-report"))
        .arg("--journal")
        .arg(sandbox.dir.join("journals").join("drill-drill.jsonl"));
    run_json("drill", bin, &mut cmd).await
}

/// Run `hcp-dr migrate` of `spec` from mgmt-a to mgmt-b through the sandbox's
/// S3 store, with the sandbox's Route53 zone; returns its JSON report.
pub async fn run_migrate(sandbox: &Sandbox, bin: &Path, spec: &HostedClusterSpec) -> Result<serde_json::Value, SandboxError> {
    let journal = sandbox.dir.join("journals").join("drill-migrate.jsonl");
    let mut cmd = hcp_dr_command(sandbox, bin);
    cmd.args(["migrate", "--hosted-cluster", &spec.name, "-n", &spec.namespace])
        .arg("--from-kubeconfig")
        .arg(&sandbox.clusters[0].kubeconfig)
        .arg("--to-kubeconfig")
        .arg(&sandbox.clusters[1].kubeconfig)
        .args(["--via", &s3_store()])
        .args(["--s3-endpoint", sandbox.s3.https_url()])
        .args(["--route53-zone", &sandbox.zone_id, "--route53-endpoint", sandbox.route53.url()])
        .args(["--wait", "5m", "--dns-wait", "2m"])
        .arg("--journal")
        .arg(&journal);
    run_json("migrate", bin, &mut cmd).await
}

/// Check the backup independently of hcp-dr: the manifest's hashes against
/// the bytes s3s-fs stored, then every member snapshot (decompressed by the
/// reference `zstd -d` when the backup is compressed, and checked against
/// its raw digest) restored with `etcdctl snapshot restore` into a scratch
/// etcd holding all the workload keys.
pub async fn verify_backup(sandbox: &Sandbox, report: &serde_json::Value) -> Result<String, SandboxError> {
    use sha2::{Digest, Sha256};
    let url = report["backup"].as_str().unwrap_or_default();
    let folder = match (url.strip_prefix("file://"), url.strip_prefix(&format!("s3://{}/", crate::sandbox::BUCKET))) {
        (Some(path), _) => std::path::PathBuf::from(path),
        (None, Some(rel)) => sandbox.s3.root().join(crate::sandbox::BUCKET).join(rel),
        _ => return Err(SandboxError::Check(format!("backup URL {url} is neither local nor in the sandbox bucket"))),
    };
    let read = |p: std::path::PathBuf| std::fs::read(&p).map_err(|source| SandboxError::Io { path: p, source });
    let manifest: serde_json::Value = serde_json::from_slice(&read(folder.join("manifest.json"))?)
        .map_err(|e| SandboxError::Check(format!("manifest.json: {e}")))?;
    let artifacts = manifest["artifacts"].as_array().cloned().unwrap_or_default();
    for artifact in &artifacts {
        let name = artifact["name"].as_str().unwrap_or_default();
        let bytes = read(folder.join(name))?;
        let sha = format!("{:x}", Sha256::digest(&bytes));
        if Some(sha.as_str()) != artifact["sha256"].as_str() || Some(bytes.len() as u64) != artifact["size"].as_u64() {
            return Err(SandboxError::Check(format!("artifact {name} does not match the manifest")));
        }
    }
    let snapshots = manifest["etcd"].as_array().cloned().unwrap_or_default();
    let mut restored = Vec::new();
    for snapshot in &snapshots {
        let member = snapshot["member"].as_str().unwrap_or_default().to_string();
        let artifact = snapshot["artifact"].as_str().unwrap_or_default();
        let scratch = sandbox.dir.join("verify").join(&member);
        let path = match manifest["compression"]["artifacts"].as_array().and_then(|raw| raw.iter().find(|a| a["name"] == artifact)) {
            None => folder.join(artifact),
            Some(raw) => unzstd(&folder.join(artifact), &sandbox.dir.join("verify").join(format!("{member}-raw")), raw).await?,
        };
        let keys = count_keys_in_snapshot(&path, &scratch, &[
            &format!("/kubernetes.io/configmaps/{WORKLOAD_NS}/"),
            &format!("/kubernetes.io/secrets/{WORKLOAD_NS}/"),
        ])
        .await?;
        if keys != WORKLOAD_OBJECTS * 2 {
            return Err(SandboxError::Check(format!(
                "snapshot of {member} restores {keys} of the {} workload keys",
                WORKLOAD_OBJECTS * 2
            )));
        }
        restored.push(member);
    }
    Ok(format!(
        "{} artifacts match the manifest; snapshots of {} each restore all {} workload keys",
        artifacts.len(),
        restored.join(", "),
        WORKLOAD_OBJECTS * 2
    ))
}

/// Decompress `compressed` with the `zstd` command into `dir`, and check the
/// result against the manifest's raw size and SHA-256 (`raw`).
async fn unzstd(compressed: &Path, dir: &Path, raw: &serde_json::Value) -> Result<std::path::PathBuf, SandboxError> {
    use sha2::{Digest, Sha256};
    std::fs::create_dir_all(dir).map_err(|source| SandboxError::Io { path: dir.to_path_buf(), source })?;
    let out = dir.join("raw.db");
    let status = tokio::process::Command::new("zstd")
        .args(["-d", "-q", "-f", "-o"])
        .arg(&out)
        .arg(compressed)
        .status()
        .await
        .map_err(|source| SandboxError::Io { path: "zstd".into(), source })?;
    if !status.success() {
        return Err(SandboxError::Check(format!("zstd -d {} failed: {status}", compressed.display())));
    }
    let bytes = std::fs::read(&out).map_err(|source| SandboxError::Io { path: out.clone(), source })?;
    let sha = format!("{:x}", Sha256::digest(&bytes));
    if Some(sha.as_str()) != raw["sha256"].as_str() || Some(bytes.len() as u64) != raw["size"].as_u64() {
        return Err(SandboxError::Check(format!("{} does not decompress to the raw snapshot the manifest records", compressed.display())));
    }
    Ok(out)
}

/// Restore `snapshot` with `etcdctl snapshot restore` into a scratch member in
/// `dir`, start it, and count the keys under `prefixes`.
pub async fn count_keys_in_snapshot(snapshot: &Path, dir: &Path, prefixes: &[&str]) -> Result<usize, SandboxError> {
    let mut member = crate::procs::etcd::restore_scratch(snapshot, dir).await?;
    let mut client = connect_client(&[member.client_url()], None).await?;
    let mut total = 0;
    for prefix in prefixes {
        let resp = client
            .get(*prefix, Some(etcd_client::GetOptions::new().with_prefix().with_count_only()))
            .await
            .map_err(crate::procs::ProcError::Etcd)?;
        total += resp.count() as usize;
    }
    member.kill();
    Ok(total)
}
