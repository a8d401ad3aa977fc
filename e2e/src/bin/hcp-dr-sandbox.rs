//! `hcp-dr-sandbox`: start, inspect and stop the management-cluster sandbox,
//! make its API servers or its S3 endpoint fail a share of their requests
//! (`faults`),
//! and run the local DR drill.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use hcp_dr_e2e::apiserver::faults::{self, ApiFaults, FaultKind};
use hcp_dr_e2e::procs::s3_faults::{self, S3FaultKind, S3Faults};
use hcp_dr_e2e::operator::{Controllers, EtcdInit};
use hcp_dr_e2e::sandbox::{Sandbox, SandboxError, SandboxState, UpOptions};

#[derive(Parser)]
#[command(name = "hcp-dr-sandbox", version, about = "Emulated management clusters on real etcd, for hcp-dr")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start mgmt-a, mgmt-b, the S3 and the Route53 endpoints; write kubeconfigs, ca.crt and env into DIR.
    Up {
        #[arg(long)]
        dir: PathBuf,
        /// Return once everything is ready, leaving the sandbox running in the background.
        #[arg(long)]
        detach: bool,
        #[command(flatten)]
        clusters: ExistingClusters,
        #[command(flatten)]
        hypershift: HyperShiftOptions,
    },
    /// Run one API emulator on its own etcd as an existing cluster would
    /// run (no CRDs, its own CA), for `--mgmt-kubeconfig`: writes
    /// DIR/NAME.kubeconfig (cluster-admin) and DIR/NAME-noaccess.kubeconfig
    /// (a user without any permission), then DIR/NAME.ready, and serves
    /// until stopped (SIGTERM or Ctrl-C).
    Apiserver {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "cluster")]
        name: String,
    },
    /// Stop the sandbox running in DIR.
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Show what runs in DIR and whether it answers.
    Status {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Make the API server of a management cluster (--cluster) or the S3
    /// endpoint (--s3) of the running sandbox fail a share of its requests,
    /// or stop (--off); without --share or --off, show what is in force.
    /// API faults (429, 500, 503, connection reset, delay) are decided before
    /// a request is processed: nothing of a faulted request is applied.
    /// S3 faults: internal-error, slow-down (nothing applied), reset-request
    /// (upload cut), reset-response (applied, answer cut), slow-read, and
    /// access-denied (403, nothing applied: no rights, e.g. on one bucket
    /// with --path-prefix /BUCKET/).
    Faults {
        #[arg(long)]
        dir: PathBuf,
        /// The management cluster (mgmt-a, mgmt-b).
        #[arg(long, required_unless_present = "s3", conflicts_with = "s3")]
        cluster: Option<String>,
        /// The S3 endpoint's HTTPS front (AWS_ENDPOINT_URL_S3) instead of an API server.
        #[arg(long)]
        s3: bool,
        /// Share of the matching requests that fail, 0.0 to 1.0 (0.1: one in ten).
        #[arg(long, value_parser = parse_share, requires = "kinds", conflicts_with = "off")]
        share: Option<f64>,
        /// Comma-separated kinds of fault, one drawn at random for each failed request.
        #[arg(long, value_delimiter = ',', requires = "share", value_parser = kind_names())]
        kinds: Vec<String>,
        /// With --s3: only requests with these methods (comma-separated, e.g. GET,PUT).
        #[arg(long, value_delimiter = ',', requires = "s3", requires = "share")]
        methods: Vec<String>,
        /// With --s3: only requests whose URL path starts with this (e.g.
        /// /oidc-mgmt-a/ for one bucket).
        #[arg(long, requires = "s3", requires = "share")]
        path_prefix: Option<String>,
        /// Only requests whose User-Agent starts with this (e.g. hcp-dr; the
        /// AWS SDK for Rust sends aws-sdk-rust).
        #[arg(long, requires = "share")]
        user_agent: Option<String>,
        /// How long a `delay` fault waits (0: 2000), or a `slow-read` stalls
        /// (0: 3000), in milliseconds.
        #[arg(long, requires = "share", default_value_t = 0)]
        delay_ms: u64,
        /// Seed of the random draws, for a repeatable sequence of faults.
        #[arg(long, requires = "share")]
        seed: Option<u64>,
        /// An aggregated API (GROUP/VERSION, e.g. metrics.k8s.io/v1beta1)
        /// listed in discovery but down: every request under it gets a 503,
        /// as a real cluster with a stale APIService answers (repeatable).
        #[arg(long, conflicts_with_all = ["s3", "off"])]
        unavailable_api_service: Vec<String>,
        /// Stop injecting faults and count those injected, by kind.
        #[arg(long)]
        off: bool,
    },
    /// The local DR drill: a sandbox, the hosted cluster `demo`, workloads, a report.
    Drill {
        /// Where the sandbox lives (default: a temporary directory, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        clusters: ExistingClusters,
        #[command(flatten)]
        hypershift: HyperShiftOptions,
    },
    /// The lost-management-cluster scenario: demo backed up on mgmt-a, mgmt-a
    /// dies, restore on mgmt-b with the DNS taken over, mgmt-a comes back
    /// with its old state and is fenced; fails when any check does not hold.
    Disaster {
        /// Where the sandbox lives (default: a temporary directory, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Existing API servers to use instead of emulated management clusters.
#[derive(clap::Args, Clone, Default)]
struct ExistingClusters {
    /// An existing API server's kubeconfig (cluster-admin, no HyperShift) to
    /// use as mgmt-a; given twice, the second is mgmt-b. The sandbox installs
    /// the CRDs it lacks, runs the simulated operator against it, and removes
    /// what it created when it stops.
    #[arg(long = "mgmt-kubeconfig", value_name = "KUBECONFIG")]
    mgmt_kubeconfig: Vec<PathBuf>,
    /// Use a cluster anyway that runs a HyperShift operator: the simulated
    /// operator may fight it.
    #[arg(long, requires = "mgmt_kubeconfig")]
    force: bool,
    /// Who runs Deployments, StatefulSets, Jobs, garbage collection and PVC
    /// protection there: `cluster`, its own kube-controller-manager and
    /// scheduler (the sandbox registers a Node and is its kubelet: kind,
    /// k3s, a real cluster); `sandbox`, the sandbox's controllers (an API
    /// server alone, such as `hcp-dr-sandbox apiserver`); `auto`: `cluster`
    /// where a kube-controller-manager's leader Lease is renewed.
    #[arg(long, value_enum, default_value_t = ControllersArg::Auto, requires = "mgmt_kubeconfig")]
    controllers: ControllersArg,
    /// The address of this machine the clusters' API servers reach, where
    /// the sandbox serves the Cluster API conversion webhook of the CRDs it
    /// installs [default: 127.0.0.1]. kind runs its API server in a
    /// container: give the kind network's gateway (`docker network inspect
    /// kind`, e.g. 172.18.0.1).
    #[arg(long, value_name = "IP", requires = "mgmt_kubeconfig")]
    webhook_address: Option<std::net::IpAddr>,
}

/// How the simulated HyperShift operator behaves.
#[derive(clap::Args, Clone, Default)]
struct HyperShiftOptions {
    /// The etcd-init init container of restores through restoreSnapshotURL:
    /// `shipped`, HyperShift's as it ships (after reset-member, no member
    /// flags: a HighlyAvailable restore becomes three single-member
    /// clusters); `fixed`, as openshift/hypershift PR 9048 fixes it (before
    /// reset-member, each member restored with its name, the initial
    /// cluster and a revision bump: one cluster).
    #[arg(long, value_enum, default_value_t = EtcdInitArg::Shipped)]
    etcd_init: EtcdInitArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
enum EtcdInitArg {
    #[default]
    Shipped,
    Fixed,
}

impl EtcdInitArg {
    fn mode(self) -> EtcdInit {
        match self {
            EtcdInitArg::Shipped => EtcdInit::Shipped,
            EtcdInitArg::Fixed => EtcdInit::Fixed,
        }
    }
}

impl HyperShiftOptions {
    /// The flags again, for the process `up --detach` starts.
    fn args(&self) -> Vec<std::ffi::OsString> {
        vec!["--etcd-init".into(), self.etcd_init.mode().as_str().into()]
    }
}

/// The options of `up` and `drill`.
fn up_options(clusters: &ExistingClusters, hypershift: &HyperShiftOptions) -> UpOptions {
    UpOptions { etcd_init: hypershift.etcd_init.mode(), ..clusters.options() }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
enum ControllersArg {
    #[default]
    Auto,
    Sandbox,
    Cluster,
}

impl ControllersArg {
    fn chosen(self) -> Option<Controllers> {
        match self {
            ControllersArg::Auto => None,
            ControllersArg::Sandbox => Some(Controllers::Sandbox),
            ControllersArg::Cluster => Some(Controllers::Cluster),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            ControllersArg::Auto => "auto",
            ControllersArg::Sandbox => "sandbox",
            ControllersArg::Cluster => "cluster",
        }
    }
}

impl ExistingClusters {
    fn options(&self) -> UpOptions {
        UpOptions {
            mgmt_kubeconfigs: self.mgmt_kubeconfig.clone(),
            force: self.force,
            controllers: self.controllers.chosen(),
            webhook_address: self.webhook_address,
            etcd_init: EtcdInit::default(),
        }
    }

    /// The flags again, for the process `up --detach` starts.
    fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        for path in &self.mgmt_kubeconfig {
            args.push("--mgmt-kubeconfig".into());
            args.push(std::path::absolute(path).unwrap_or_else(|_| path.clone()).into_os_string());
        }
        if self.force {
            args.push("--force".into());
        }
        if !self.mgmt_kubeconfig.is_empty() {
            args.push("--controllers".into());
            args.push(self.controllers.as_str().into());
        }
        if let Some(address) = self.webhook_address {
            args.push("--webhook-address".into());
            args.push(address.to_string().into());
        }
        args
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,hcp_dr_e2e::drill=info,hcp_dr_e2e::disaster=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: starting the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Up { dir, detach: true, clusters, hypershift } => detach(&dir, &clusters, &hypershift).await,
            Command::Up { dir, detach: false, clusters, hypershift } => up(&dir, &clusters, &hypershift).await,
            Command::Apiserver { dir, name } => apiserver(&dir, &name).await,
            Command::Down { dir } => down(&dir).await,
            Command::Status { dir } => status(&dir).await,
            Command::Faults { dir, cluster, s3: true, share, kinds, methods, path_prefix, user_agent, delay_ms, seed, off, .. } => {
                debug_assert!(cluster.is_none(), "clap: --cluster conflicts with --s3");
                let kinds = parse_kinds::<S3FaultKind>(&kinds, "S3", "API fault, without --s3")?;
                let methods = methods.iter().map(|m| m.to_uppercase()).collect();
                let faults = share.map(|share| S3Faults { share, kinds, methods, user_agent, path_prefix, delay_ms, seed });
                s3_faults_command(&dir, faults, off)
            }
            Command::Faults { dir, cluster, share, kinds, user_agent, delay_ms, seed, unavailable_api_service, off, .. } => {
                let kinds = parse_kinds::<FaultKind>(&kinds, "API", "S3 fault, with --s3")?;
                if let Some(bad) = unavailable_api_service.iter().find(|gv| gv.split_once('/').is_none_or(|(g, v)| g.is_empty() || v.is_empty() || v.contains('/'))) {
                    anyhow::bail!("--unavailable-api-service {bad}: expected GROUP/VERSION, e.g. metrics.k8s.io/v1beta1");
                }
                let faults = (share.is_some() || !unavailable_api_service.is_empty()).then(|| ApiFaults {
                    share: share.unwrap_or(0.0),
                    kinds,
                    user_agent,
                    delay_ms,
                    seed,
                    unavailable_api_services: unavailable_api_service,
                });
                faults_command(&dir, cluster.as_deref().unwrap_or_default(), faults, off)
            }
            Command::Drill { dir, json, clusters, hypershift } => drill(dir, json, &clusters, &hypershift).await,
            Command::Disaster { dir, json } => disaster(dir, json).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            // bad input, or a cluster the sandbox must not use: nothing was created
            if matches!(err.downcast_ref::<SandboxError>(), Some(SandboxError::Refused(_))) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn up(dir: &Path, clusters: &ExistingClusters, hypershift: &HyperShiftOptions) -> anyhow::Result<()> {
    if let Ok(state) = SandboxState::load(dir) {
        if process_alive(state.pid) {
            anyhow::bail!(
                "a sandbox (pid {}) already runs in {}: stop it with `hcp-dr-sandbox down --dir {}`",
                state.pid,
                dir.display(),
                dir.display()
            );
        }
    }
    let sandbox = Sandbox::up_with(dir, &up_options(clusters, hypershift)).await?;
    println!("sandbox up in {} (pid {})", sandbox.dir.display(), std::process::id());
    println!("  HyperShift etcd-init: {}", describe_etcd_init(sandbox.etcd_init));
    for c in &sandbox.clusters {
        println!("  {}: {}  kubeconfig {}", c.name, c.api.url(), c.kubeconfig.display());
    }
    println!("  S3: {} (bucket {})", sandbox.s3.https_url(), hcp_dr_e2e::sandbox::BUCKET);
    println!("  Route53: {} (zone {})", sandbox.route53.url(), sandbox.zone_id);
    println!("  source {}/env for the endpoints and credentials", sandbox.dir.display());
    std::fs::write(sandbox.dir.join("ready"), b"ready\n")?;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    let _ = std::fs::remove_file(sandbox.dir.join("ready"));
    println!("stopping the sandbox");
    for line in sandbox.shutdown().await.lines {
        println!("{line}");
    }
    Ok(())
}

/// `apiserver`: one emulator on its own etcd, until SIGTERM or Ctrl-C.
async fn apiserver(dir: &Path, name: &str) -> anyhow::Result<()> {
    use hcp_dr_e2e::apiserver::{ApiServer, ApiServerConfig, TokenUser};
    std::fs::create_dir_all(dir.join(name))?;
    let dir = dir.canonicalize()?;
    let ca = hcp_dr_e2e::pki::Ca::new(&format!("{name} API server CA"))?;
    let etcd = hcp_dr_e2e::procs::etcd::EtcdProcess::start_plain(&dir.join(name).join("etcd")).await?;
    let token = || uuid_token();
    let (admin, noaccess) = (token(), token());
    let api = ApiServer::start(ApiServerConfig {
        cluster_name: name.to_string(),
        bind_ip: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        port: 0,
        etcd_endpoints: vec![etcd.client_url()],
        etcd_tls: None,
        key_prefix: "/registry".into(),
        crd_dirs: vec![],
        ca,
        tokens: vec![
            TokenUser { token: admin, user: "admin".into(), groups: vec!["system:masters".into(), "system:authenticated".into()] },
            TokenUser { token: noaccess.clone(), user: "noaccess".into(), groups: vec!["system:authenticated".into()] },
        ],
        faults_file: None,
        audit_log: Some(dir.join(name).join("audit.log")),
    })
    .await?;
    api.write_kubeconfig(&dir.join(format!("{name}.kubeconfig")), name)?;
    hcp_dr_e2e::sandbox::write_private(&dir.join(format!("{name}-noaccess.kubeconfig")), &api.kubeconfig_with_token(name, "noaccess", &noaccess))?;
    println!("API server {name} at {} (etcd {}); kubeconfig {}", api.url(), etcd.client_url(), dir.join(format!("{name}.kubeconfig")).display());
    std::fs::write(dir.join(format!("{name}.ready")), b"ready\n")?;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    let _ = std::fs::remove_file(dir.join(format!("{name}.ready")));
    api.shutdown().await;
    drop(etcd);
    Ok(())
}

fn uuid_token() -> String {
    let bytes: Vec<u8> = (0..2).flat_map(|_| *uuid::Uuid::new_v4().as_bytes()).collect();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the sandbox's `etcd-init` mode means, in one line.
fn describe_etcd_init(mode: EtcdInit) -> String {
    match mode {
        EtcdInit::Shipped => "shipped (as HyperShift ships it: a HighlyAvailable restore through restoreSnapshotURL becomes three single-member clusters)".into(),
        EtcdInit::Fixed => format!(
            "fixed (openshift/hypershift PR 9048: each member restored with its name and the initial cluster; --bump-revision emulated as {})",
            hcp_dr_e2e::operator::etcd_init::FIXED_BUMP
        ),
    }
}

async fn detach(dir: &Path, clusters: &ExistingClusters, hypershift: &HyperShiftOptions) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let _ = std::fs::remove_file(dir.join("ready"));
    let log = std::fs::File::create(dir.join("sandbox.log"))?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["up", "--dir"])
        .arg(&dir)
        .args(clusters.args())
        .args(hypershift.args())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if dir.join("ready").exists() {
            print!("{}", std::fs::read_to_string(dir.join("sandbox.log"))?);
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(dir.join("sandbox.log")).unwrap_or_default();
            if status.code() == Some(2) {
                // refused before anything was created: say it as `up` did
                return Err(SandboxError::Refused(log.trim().trim_start_matches("error: ").to_string()).into());
            }
            anyhow::bail!(
                "the sandbox exited ({status}) before it was ready; its log:\n{}",
                std::fs::read_to_string(dir.join("sandbox.log")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("the sandbox was not ready after 120s; see {}", dir.join("sandbox.log").display())
}

fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn down(dir: &Path) -> anyhow::Result<()> {
    let state = SandboxState::load(dir)?;
    let external: Vec<_> = state.clusters.iter().filter_map(|c| c.external.as_ref().map(|e| (c, e))).collect();
    if !process_alive(state.pid) {
        let _ = std::fs::remove_file(dir.join("sandbox.json"));
        if !external.is_empty() {
            // the operator that takes the HostedClusters' finalizers off is gone with the process
            let mut text = format!("the sandbox process (pid {}) died without removing what it created on existing clusters; remove it by hand:\n", state.pid);
            for (c, e) in &external {
                text.push_str(&format!(
                    "  {} ({}, kubeconfig {}): HostedClusters other than {:?}; namespaces clusters and clusters-* not in {:?}; CRDs {}\n",
                    c.name,
                    c.api_url,
                    e.given_kubeconfig,
                    e.footprint.preexisting_hosted_clusters,
                    e.footprint.preexisting_namespaces,
                    e.footprint.installed_crds.join(", ")
                ));
            }
            anyhow::bail!(text);
        }
        println!("no sandbox process (pid {}) is running; cleaned up {}", state.pid, dir.display());
        return Ok(());
    }
    let _ = std::fs::remove_file(dir.join("down.txt"));
    let _ = std::process::Command::new("kill").args(["-TERM", &state.pid.to_string()]).status();
    // on existing clusters the sandbox first removes what it created there
    let limit = Duration::from_secs(if external.is_empty() { 30 } else { 300 });
    let start = Instant::now();
    while process_alive(state.pid) {
        if start.elapsed() > limit {
            let _ = std::process::Command::new("kill").args(["-KILL", &state.pid.to_string()]).status();
            anyhow::bail!("the sandbox (pid {}) did not stop in {}s and was killed; its etcd processes may remain", state.pid, limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("sandbox in {} stopped", dir.display());
    // on existing clusters: what the sandbox removed from them, and left
    if let Ok(text) = std::fs::read_to_string(dir.join("down.txt")) {
        print!("{text}");
        if text.contains(hcp_dr_e2e::sandbox::NOT_REMOVED) {
            anyhow::bail!("the sandbox did not remove everything it created on the existing clusters (above)");
        }
    }
    Ok(())
}

async fn status(dir: &Path) -> anyhow::Result<()> {
    let state = SandboxState::load(dir)?;
    let alive = process_alive(state.pid);
    println!("sandbox {} in {}: process {} {}", state.sandbox_id, dir.display(), state.pid, if alive { "running" } else { "NOT running" });
    println!("  CRDs: {}", state.crds);
    println!("  HyperShift etcd-init: {}", describe_etcd_init(state.etcd_init));
    let mut healthy = alive;
    for c in &state.clusters {
        let answer = match cluster_summary(&c.kubeconfig).await {
            Ok(summary) => summary,
            Err(err) => {
                healthy = false;
                format!("not answering: {err:#}")
            }
        };
        println!("  {}: {}  {}", c.name, c.api_url, answer);
    }
    println!("  S3: {} bucket {}", state.s3_url, state.bucket);
    println!("  Route53: {} zone {}", state.route53_url, state.zone_id);
    if !healthy {
        anyhow::bail!("the sandbox in {} is not healthy", dir.display());
    }
    Ok(())
}

async fn cluster_summary(kubeconfig: &str) -> anyhow::Result<String> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(config, &kube::config::KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(config)?;
    let api = hcp_dr_e2e::sandbox::api_for(
        &client,
        &serde_json::json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster"}),
    );
    let list = api.list(&Default::default()).await?;
    let names: Vec<String> = list
        .items
        .iter()
        .map(|hc| {
            let value = serde_json::to_value(hc).unwrap_or_default();
            format!(
                "{}/{} (Available={})",
                hc.metadata.namespace.clone().unwrap_or_default(),
                hc.metadata.name.clone().unwrap_or_default(),
                hcp_dr_e2e::sandbox::condition(&value, "Available").unwrap_or_else(|| "?".into())
            )
        })
        .collect();
    Ok(format!("ready; hosted clusters: {}", if names.is_empty() { "none".into() } else { names.join(", ") }))
}

/// `dir`, or a temporary directory removed when the guard drops.
fn scenario_dir(dir: Option<PathBuf>) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    Ok(match dir {
        Some(dir) => (dir, None),
        None => {
            let temp = tempfile::Builder::new().prefix("hcp-dr-sandbox-").tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    })
}

async fn disaster(dir: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let (dir, _temp) = scenario_dir(dir)?;
    let report = hcp_dr_e2e::disaster::run(&dir, &hcp_dr_e2e::drill::hcp_dr_binary()?).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

async fn drill(dir: Option<PathBuf>, json: bool, clusters: &ExistingClusters, hypershift: &HyperShiftOptions) -> anyhow::Result<()> {
    let (dir, _temp) = scenario_dir(dir)?;
    let report = hcp_dr_e2e::drill::run_with(&dir, &hcp_dr_e2e::drill::hcp_dr_binary()?, &up_options(clusters, hypershift)).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

/// Every kind of fault `faults --kinds` knows: the API ones and the S3 ones.
fn kind_names() -> clap::builder::PossibleValuesParser {
    let api = FaultKind::ALL.iter().map(|k| k.as_str());
    let s3 = S3FaultKind::EVERY.iter().map(|k| k.as_str());
    let mut names: Vec<&'static str> = api.chain(s3).collect();
    names.sort_unstable();
    names.dedup();
    clap::builder::PossibleValuesParser::new(names)
}

/// `names` as kinds of the target's faults (`what`: "API" or "S3"), or an
/// error saying which target a name is a kind of (`other`) and listing
/// the target's kinds.
fn parse_kinds<K: clap::ValueEnum + std::fmt::Display>(names: &[String], what: &str, other: &str) -> anyhow::Result<Vec<K>> {
    names
        .iter()
        .map(|name| {
            K::from_str(name, false).map_err(|_| {
                let list = |kinds: &[K]| kinds.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(", ");
                anyhow::anyhow!(
                    "`{name}` is not a kind of {what} fault (it is a kind of {other}); {what} kinds: {}",
                    list(K::value_variants()),
                )
            })
        })
        .collect()
}

fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("must be a number within 0..=1 (0.1: one request in ten), not {text:?}")),
    }
}

/// `faults`: write, remove or show `DIR/<cluster>/state/api-faults.json`.
fn faults_command(dir: &Path, cluster: &str, set: Option<ApiFaults>, off: bool) -> anyhow::Result<()> {
    let state = SandboxState::load(dir)?;
    if !state.clusters.iter().any(|c| c.name == cluster) {
        let names: Vec<&str> = state.clusters.iter().map(|c| c.name.as_str()).collect();
        anyhow::bail!(
            "no management cluster {cluster:?} in the sandbox in {}; its clusters: {}",
            dir.display(),
            names.join(", ")
        );
    }
    let file = hcp_dr_e2e::sandbox::api_faults_path(dir, cluster);
    if let Some(set) = &set {
        // refuses settings that cannot be used, with the reason
        faults::write_faults_file(&file, Some(set))?;
    } else if off {
        faults::write_faults_file(&file, None)?;
    }
    if !process_alive(state.pid) {
        println!("note: the sandbox process (pid {}) is not running; its API servers read this when they run again", state.pid);
    }
    match faults::read_faults_file(&file) {
        Ok(Some(f)) => {
            let from = match &f.user_agent {
                Some(prefix) => format!(" from user agents starting with {prefix:?}"),
                None => String::new(),
            };
            let kinds: Vec<&str> = f.kinds.iter().map(|k| k.as_str()).collect();
            for gv in &f.unavailable_api_services {
                println!("aggregated API {gv} is down on {cluster}: listed in discovery, every request under /apis/{gv} gets a 503");
            }
            if !kinds.is_empty() {
                println!("API faults in force on {cluster}: {} of the requests{from} fail", f.share);
                println!("  kinds: {}", kinds.join(", "));
            }
            if f.kinds.contains(&FaultKind::Delay) {
                println!("  delay: {} ms", f.delay().as_millis());
            }
            match f.seed {
                Some(seed) => println!("  seed: {seed}"),
                None => println!("  seed: random"),
            }
            println!("  settings: {}", file.display());
        }
        Ok(None) => println!("no API faults on {cluster}"),
        Err(err) => println!("{} does not parse ({err}): no API faults are injected on {cluster}", file.display()),
    }
    let injected = faults::read_log(&file);
    let mut counts: Vec<(FaultKind, usize)> = FaultKind::ALL
        .iter()
        .map(|k| (*k, injected.iter().filter(|f| f["kind"] == k.as_str()).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    counts.sort_by_key(|(k, _)| *k);
    if off || !injected.is_empty() {
        let by_kind: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "  injected so far: {}{}  (log: {})",
            injected.len(),
            if by_kind.is_empty() { String::new() } else { format!(" ({})", by_kind.join(", ")) },
            faults::log_path(&file).display()
        );
    }
    Ok(())
}

/// `faults --s3`: write, remove or show `DIR/s3/s3-faults.json`.
fn s3_faults_command(dir: &Path, set: Option<S3Faults>, off: bool) -> anyhow::Result<()> {
    let state = SandboxState::load(dir)?;
    let file = hcp_dr_e2e::sandbox::s3_faults_path(dir);
    if let Some(set) = &set {
        // refuses settings that cannot be used, with the reason
        s3_faults::write_faults_file(&file, Some(set))?;
    } else if off {
        s3_faults::write_faults_file(&file, None)?;
    }
    if !process_alive(state.pid) {
        println!("note: the sandbox process (pid {}) is not running; its S3 endpoint reads this when it runs again", state.pid);
    }
    match s3_faults::read_faults_file(&file) {
        Ok(Some(f)) => {
            let mut which = Vec::new();
            if !f.methods.is_empty() {
                which.push(format!(" {}", f.methods.join("/")));
            }
            let to = match &f.path_prefix {
                Some(prefix) => format!(" to {prefix}*"),
                None => String::new(),
            };
            let from = match &f.user_agent {
                Some(prefix) => format!(" from user agents starting with {prefix:?}"),
                None => String::new(),
            };
            let kinds: Vec<&str> = f.kinds.iter().map(|k| k.as_str()).collect();
            println!("S3 faults in force on {}: {} of the{} requests{to}{from} fail", state.s3_url, f.share, which.concat());
            println!("  kinds: {}", kinds.join(", "));
            if f.kinds.contains(&S3FaultKind::SlowRead) {
                println!("  slow-read stall: {} ms", f.stall().as_millis());
            }
            match f.seed {
                Some(seed) => println!("  seed: {seed}"),
                None => println!("  seed: random"),
            }
            println!("  settings: {}", file.display());
        }
        Ok(None) => println!("no S3 faults on {}", state.s3_url),
        Err(err) => println!("{} does not parse ({err}): no S3 faults are injected", file.display()),
    }
    let injected = s3_faults::read_log(&file);
    if off || !injected.is_empty() {
        let by_kind: Vec<String> = S3FaultKind::EVERY
            .iter()
            .map(|k| (k, injected.iter().filter(|f| f["kind"] == k.as_str()).count()))
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!(
            "  injected so far: {}{}  (log: {})",
            injected.len(),
            if by_kind.is_empty() { String::new() } else { format!(" ({})", by_kind.join(", ")) },
            s3_faults::log_path(&file).display()
        );
    }
    Ok(())
}
