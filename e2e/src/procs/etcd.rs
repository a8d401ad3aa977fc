//! Real etcd members (the Debian etcd 3.4 binary) as process fixtures.
//!
//! A member listens for clients on `client_ip:client_port` and for peers on
//! `client_ip:peer_port`, like a pod listening on its pod IP. HyperShift members
//! also listen on `localhost:2379`; the sandbox does not, so several members can
//! share one machine.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::{ManagedChild, ProcError, find_program};
use crate::pki::CertSpec;

const ETCD_HINT: &str = "apt-get install etcd-server";
const ETCDCTL_HINT: &str = "apt-get install etcd-client";
/// The cluster token every sandbox member and every restore uses (HyperShift
/// leaves etcd's default).
pub const INITIAL_CLUSTER_TOKEN: &str = "etcd-cluster";
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How far `--bump-revision` moves the revision on restore, when supported.
pub const RESTORE_BUMP_REVISION: u64 = 1_000_000_000;

/// `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Bootstrapping a new cluster (or starting from a restored data dir).
    New,
    /// Joining a running cluster after `member add`.
    Existing,
}

impl ClusterState {
    fn as_flag(self) -> &'static str {
        match self {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        }
    }
}

/// TLS files of a member (client and peer listeners use the same CA; both
/// require client certificates when `client_cert_auth`, as in HyperShift).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// CA trusted for client and peer certificates.
    pub ca_file: PathBuf,
    /// Serving certificate for clients.
    pub server_cert_file: PathBuf,
    /// Its key.
    pub server_key_file: PathBuf,
    /// Peer certificate (server and client use): must be valid for the host in
    /// this member's peer URL.
    pub peer_cert_file: PathBuf,
    /// Its key.
    pub peer_key_file: PathBuf,
    /// `--client-cert-auth` and `--peer-client-cert-auth`.
    pub client_cert_auth: bool,
}

/// Everything needed to start one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMemberConfig {
    /// `--name` (e.g. `etcd-0`).
    pub name: String,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// Directory of the log file `<name>.log`.
    pub log_dir: PathBuf,
    /// The "pod IP" the member listens on.
    pub client_ip: IpAddr,
    /// Client port (2379 in HyperShift).
    pub client_port: u16,
    /// Peer port (2380 in HyperShift).
    pub peer_port: u16,
    /// `--initial-cluster` as (name, peer URL); must contain this member.
    pub initial_cluster: Vec<(String, String)>,
    /// `--initial-cluster-state`.
    pub initial_cluster_state: ClusterState,
    /// TLS, or plain http when `None`.
    pub tls: Option<EtcdTls>,
    /// `--quota-backend-bytes` (HyperShift: 8 GiB).
    pub quota_backend_bytes: Option<u64>,
}

impl EtcdMemberConfig {
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The log file of this member.
    pub fn log_path(&self) -> PathBuf {
        self.log_dir.join(format!("{}.log", self.name))
    }

    /// This member's peer URL from `initial_cluster`.
    pub fn own_peer_url(&self) -> Result<&str, ProcError> {
        self.initial_cluster
            .iter()
            .find(|(n, _)| n == &self.name)
            .map(|(_, u)| u.as_str())
            .ok_or_else(|| {
                ProcError::InvalidConfig(format!(
                    "member {} is not in its initial cluster {}",
                    self.name,
                    initial_cluster_flag(&self.initial_cluster)
                ))
            })
    }
}

/// Client TLS material for talking to a member.
#[derive(Clone)]
pub struct ClientTls {
    /// CA that signed the member's serving certificate.
    pub ca_pem: String,
    /// Client certificate.
    pub cert_pem: String,
    /// Its key.
    pub key_pem: String,
    /// Name to verify the serving certificate against (e.g.
    /// `etcd-0.etcd-discovery.<ns>.svc`; serving certs have no IP SANs).
    pub server_name: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// etcd-client options using this TLS material.
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions::new().with_tls(
            TlsOptions::new()
                .ca_certificate(Certificate::from_pem(self.ca_pem.as_bytes()))
                .identity(Identity::from_pem(
                    self.cert_pem.as_bytes(),
                    self.key_pem.as_bytes(),
                ))
                .domain_name(self.server_name.clone()),
        )
    }
}

/// The serving certificate HyperShift gives every member of the etcd in
/// `namespace`: `*.etcd-discovery.<ns>.svc`, `etcd-client.<ns>.svc` and
/// `localhost`, no IP SANs. Server and client usage (HyperShift's own
/// etcdctl calls present it as a client certificate).
pub fn server_cert_spec(namespace: &str) -> CertSpec {
    CertSpec {
        common_name: "etcd-server".into(),
        organization: None,
        dns_names: vec![
            format!("*.etcd-discovery.{namespace}.svc"),
            format!("etcd-client.{namespace}.svc"),
            "localhost".into(),
        ],
        ips: vec![],
        server: true,
        client: true,
    }
}

/// A peer certificate for the member at `member_ip` of the etcd in
/// `namespace`. Sandbox difference: besides HyperShift's
/// `*.etcd-discovery.<ns>.svc` it carries `member_ip` (peer URLs are IPs, as
/// there is no DNS) and `127.0.0.1` (outgoing loopback connections come from
/// 127.0.0.1, and etcd checks a peer's source address against its
/// certificate's SANs).
pub fn peer_cert_spec(namespace: &str, member_ip: IpAddr) -> CertSpec {
    CertSpec {
        common_name: "etcd-peer".into(),
        organization: None,
        dns_names: vec![format!("*.etcd-discovery.{namespace}.svc")],
        ips: vec![member_ip, IpAddr::V4(Ipv4Addr::LOCALHOST)],
        server: true,
        client: true,
    }
}

/// The client certificate (`etcd-client-tls` in HyperShift): no SANs, client usage.
pub fn client_cert_spec() -> CertSpec {
    CertSpec {
        common_name: "etcd-client".into(),
        client: true,
        ..CertSpec::default()
    }
}

/// Connect an etcd client to `endpoints` (with TLS when given), with short
/// connect and request timeouts.
pub async fn connect_client<S: AsRef<str>>(
    endpoints: &[S],
    tls: Option<&ClientTls>,
) -> Result<Client, ProcError> {
    let opts = tls.map(ClientTls::connect_options).unwrap_or_default();
    let opts = opts
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Client::connect(endpoints, Some(opts))
        .await
        .map_err(ProcError::Etcd)
}

/// A running etcd member.
#[derive(Debug)]
pub struct EtcdProcess {
    cfg: EtcdMemberConfig,
    child: ManagedChild,
}

fn initial_cluster_flag(members: &[(String, String)]) -> String {
    members
        .iter()
        .map(|(n, u)| format!("{n}={u}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl EtcdProcess {
    /// Start a member (returns once the process is spawned; see
    /// [`EtcdProcess::wait_healthy`]).
    pub fn start(cfg: EtcdMemberConfig) -> Result<EtcdProcess, ProcError> {
        let etcd = find_program("etcd", ETCD_HINT)?;
        let peer_url = cfg.own_peer_url()?.to_string();
        if let Some(parent) = cfg.data_dir.parent() {
            std::fs::create_dir_all(parent).map_err(|source| ProcError::Io {
                op: "creating",
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let scheme = cfg.scheme();
        let client_url = format!(
            "{scheme}://{}",
            SocketAddr::new(cfg.client_ip, cfg.client_port)
        );
        let listen_peer = format!(
            "{scheme}://{}",
            SocketAddr::new(cfg.client_ip, cfg.peer_port)
        );

        let mut cmd = Command::new(etcd);
        // Flags only: stray ETCD_* variables would silently change behaviour.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(k);
            }
        }
        cmd.arg(format!("--name={}", cfg.name))
            .arg(format!("--data-dir={}", cfg.data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={listen_peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!(
                "--initial-cluster={}",
                initial_cluster_flag(&cfg.initial_cluster)
            ))
            .arg(format!(
                "--initial-cluster-state={}",
                cfg.initial_cluster_state.as_flag()
            ))
            .arg(format!("--initial-cluster-token={INITIAL_CLUSTER_TOKEN}"))
            .arg("--snapshot-count=10000")
            .arg("--logger=zap")
            .arg("--log-outputs=stderr");
        if let Some(q) = cfg.quota_backend_bytes {
            cmd.arg(format!("--quota-backend-bytes={q}"));
        }
        if let Some(tls) = &cfg.tls {
            cmd.arg(format!("--cert-file={}", tls.server_cert_file.display()))
                .arg(format!("--key-file={}", tls.server_key_file.display()))
                .arg(format!("--trusted-ca-file={}", tls.ca_file.display()))
                .arg(format!("--client-cert-auth={}", tls.client_cert_auth))
                .arg(format!("--peer-cert-file={}", tls.peer_cert_file.display()))
                .arg(format!("--peer-key-file={}", tls.peer_key_file.display()))
                .arg(format!("--peer-trusted-ca-file={}", tls.ca_file.display()))
                .arg(format!("--peer-client-cert-auth={}", tls.client_cert_auth));
            // etcd 3.4 has no --tls-min-version (HyperShift's 3.5 sets TLS1.2,
            // which is also Go's default minimum for servers).
        }
        let child = ManagedChild::spawn(cmd, &format!("etcd {}", cfg.name), &cfg.log_path())?;
        Ok(EtcdProcess { cfg, child })
    }

    /// One plain-http member on `127.0.0.1:<free port>` with data in
    /// `dir/data` and its log in `dir/etcd.log`, healthy on return. Storage
    /// for a management-cluster emulator.
    pub async fn start_plain(dir: &Path) -> Result<EtcdProcess, ProcError> {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut last = None;
        // Free ports can be taken by a parallel test before etcd binds them:
        // retry a few times with fresh ports when the process dies at once.
        for _ in 0..3 {
            let ports = super::free_ports(ip, 2)?;
            let (client_port, peer_port) = (ports[0], ports[1]);
            let peer_url = format!("http://{}", SocketAddr::new(ip, peer_port));
            let data_dir = dir.join("data");
            if data_dir.exists() {
                std::fs::remove_dir_all(&data_dir).map_err(|source| ProcError::Io {
                    op: "removing",
                    path: data_dir.clone(),
                    source,
                })?;
            }
            let cfg = EtcdMemberConfig {
                name: "etcd".into(),
                data_dir,
                log_dir: dir.to_path_buf(),
                client_ip: ip,
                client_port,
                peer_port,
                initial_cluster: vec![("etcd".into(), peer_url)],
                initial_cluster_state: ClusterState::New,
                tls: None,
                quota_backend_bytes: None,
            };
            let mut proc = EtcdProcess::start(cfg)?;
            match proc.wait_healthy(Duration::from_secs(30), None).await {
                Ok(()) => return Ok(proc),
                Err(e @ ProcError::Exited { .. }) => {
                    proc.kill();
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ProcError::InvalidConfig("etcd start loop did not run".into())))
    }

    /// `http(s)://ip:port` of the client listener.
    pub fn client_url(&self) -> String {
        format!(
            "{}://{}",
            self.cfg.scheme(),
            SocketAddr::new(self.cfg.client_ip, self.cfg.client_port)
        )
    }

    /// The configuration the member was started with.
    pub fn config(&self) -> &EtcdMemberConfig {
        &self.cfg
    }

    /// Wait until the member answers `Status` with a known leader and serves a
    /// linearizable read (i.e. its cluster has quorum). Fails at once with the
    /// log tail if the process exits.
    pub async fn wait_healthy(
        &self,
        timeout: Duration,
        client_tls: Option<&ClientTls>,
    ) -> Result<(), ProcError> {
        let deadline = Instant::now() + timeout;
        let endpoints = [self.client_url()];
        loop {
            self.child.check_running()?;
            // tonic retries a failing TLS connection inside the call, so a
            // probe against a member that cannot be reached may never return.
            let last_error =
                match tokio::time::timeout(PROBE_TIMEOUT, probe(&endpoints, client_tls)).await {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(e)) => e,
                    Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
                };
            if Instant::now() >= deadline {
                return Err(ProcError::NotReady {
                    name: self.child.name().to_string(),
                    timeout,
                    last_error,
                    log_tail: self.log_tail(60),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL the member (data stays on disk).
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }

    /// The last `n` log lines.
    pub fn log_tail(&self, n: usize) -> String {
        self.child.log_tail(n)
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }
}

async fn probe(endpoints: &[String], tls: Option<&ClientTls>) -> Result<(), String> {
    let render = |e: etcd_client::Error| super::error_chain(&e);
    let mut client = connect_client(endpoints, tls)
        .await
        .map_err(|e| super::error_chain(&e))?;
    let status = client.status().await.map_err(render)?;
    if status.leader() == 0 {
        return Err("no leader yet".into());
    }
    if !status.errors().is_empty() {
        return Err(format!("member reports errors: {:?}", status.errors()));
    }
    client.get("health", None).await.map_err(render)?;
    Ok(())
}

/// Which `snapshot restore` the machine has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreTool {
    /// `etcdutl` or `etcdctl`.
    pub program: PathBuf,
    /// Whether it supports `--bump-revision` and `--mark-compacted`.
    pub bump_revision: bool,
}

/// Find the restore tool: `etcdutl` (3.5+) when present, else `etcdctl`
/// (3.4, `ETCDCTL_API=3`); detect `--bump-revision` from its help text.
pub fn restore_tool() -> Result<RestoreTool, ProcError> {
    let program = match find_program("etcdutl", ETCDCTL_HINT) {
        Ok(p) => p,
        Err(_) => find_program("etcdctl", ETCDCTL_HINT)?,
    };
    let help = Command::new(&program)
        .args(["snapshot", "restore", "--help"])
        .env("ETCDCTL_API", "3")
        .output()
        .map_err(|source| ProcError::Spawn {
            name: program.display().to_string(),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&help.stdout),
        String::from_utf8_lossy(&help.stderr)
    );
    let bump_revision = text.contains("--bump-revision") && text.contains("--mark-compacted");
    Ok(RestoreTool {
        program,
        bump_revision,
    })
}

/// A restore's target must be absent or an empty directory (an empty one is
/// removed: the tool insists on creating it); a full one would be ignored.
fn clear_restore_target(data_dir: &Path) -> Result<(), ProcError> {
    if !data_dir.exists() {
        return Ok(());
    }
    let empty = std::fs::read_dir(data_dir)
        .map_err(|source| ProcError::Io { op: "reading", path: data_dir.to_path_buf(), source })?
        .next()
        .is_none();
    if !empty {
        return Err(ProcError::InvalidConfig(format!("restore target {} is not empty: etcd would ignore the snapshot", data_dir.display())));
    }
    std::fs::remove_dir(data_dir).map_err(|source| ProcError::Io { op: "removing", path: data_dir.to_path_buf(), source })
}

/// `snapshot restore SNAPSHOT --data-dir=DATA_DIR` with the tool there is,
/// its target cleared ([`clear_restore_target`]); the caller adds flags.
fn restore_command(snapshot: &Path, data_dir: &Path) -> Result<(RestoreTool, Command), ProcError> {
    clear_restore_target(data_dir)?;
    let tool = restore_tool()?;
    let mut cmd = Command::new(&tool.program);
    cmd.env("ETCDCTL_API", "3").arg("snapshot").arg("restore").arg(snapshot).arg(format!("--data-dir={}", data_dir.display()));
    Ok((tool, cmd))
}

/// Restore `snapshot` into `data_dir` for member `name` (runs `etcdctl
/// snapshot restore`, or `etcdutl` with `--bump-revision`/`--mark-compacted`
/// when available). `data_dir` must be absent or an empty directory (an empty
/// one is removed first: the tool insists on creating it).
pub fn etcdctl_snapshot_restore(
    snapshot: &Path,
    data_dir: &Path,
    name: &str,
    initial_cluster: &[(String, String)],
    initial_advertise_peer_url: &str,
) -> Result<(), ProcError> {
    let (tool, mut cmd) = restore_command(snapshot, data_dir)?;
    cmd.arg(format!("--name={name}"))
        .arg(format!(
            "--initial-cluster={}",
            initial_cluster_flag(initial_cluster)
        ))
        .arg(format!("--initial-cluster-token={INITIAL_CLUSTER_TOKEN}"))
        .arg(format!(
            "--initial-advertise-peer-urls={initial_advertise_peer_url}"
        ));
    if tool.bump_revision {
        cmd.arg(format!("--bump-revision={RESTORE_BUMP_REVISION}"))
            .arg("--mark-compacted");
    }
    let rendered = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| ProcError::Spawn {
        name: tool.program.display().to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(ProcError::CommandFailed {
            command: rendered,
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}

/// The member flags of a `snapshot restore`; without them the tool
/// restores a one-member cluster named `default` at `http://localhost:2380`
/// (etcd's defaults), as HyperShift's shipped `etcd-init` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreMember {
    /// `--name`.
    pub name: String,
    /// `--initial-cluster`, as (name, peer URL).
    pub initial_cluster: Vec<(String, String)>,
    /// `--initial-cluster-token`.
    pub token: String,
    /// `--initial-advertise-peer-urls`.
    pub peer_url: String,
}

/// `snapshot restore SNAPSHOT --data-dir=DATA_DIR` with the member flags of
/// `member` (none: etcd's defaults) and nothing else (no revision bump,
/// whatever the tool supports). `data_dir` must not exist or be empty.
pub fn snapshot_restore(snapshot: &Path, data_dir: &Path, member: Option<&RestoreMember>) -> Result<(), ProcError> {
    let (tool, mut cmd) = restore_command(snapshot, data_dir)?;
    if let Some(m) = member {
        cmd.arg(format!("--name={}", m.name))
            .arg(format!("--initial-cluster={}", initial_cluster_flag(&m.initial_cluster)))
            .arg(format!("--initial-cluster-token={}", m.token))
            .arg(format!("--initial-advertise-peer-urls={}", m.peer_url));
    }
    let rendered = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| ProcError::Spawn { name: tool.program.display().to_string(), source })?;
    if !out.status.success() {
        return Err(ProcError::CommandFailed {
            command: rendered,
            status: out.status.to_string(),
            output: format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(())
}

/// Restore `snapshot` with `etcdctl snapshot restore` into a fresh
/// single-member cluster in `dir` (plain http on 127.0.0.1, free ports) and
/// start it; healthy on return. For checking what a snapshot holds.
pub async fn restore_scratch(snapshot: &Path, dir: &Path) -> Result<EtcdProcess, ProcError> {
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let ports = super::free_ports(ip, 2)?;
    let peer = format!("http://127.0.0.1:{}", ports[1]);
    let cluster = vec![("scratch".to_string(), peer.clone())];
    let data_dir = dir.join("data");
    etcdctl_snapshot_restore(snapshot, &data_dir, "scratch", &cluster, &peer)?;
    let member = EtcdProcess::start(EtcdMemberConfig {
        name: "scratch".into(),
        data_dir,
        log_dir: dir.to_path_buf(),
        client_ip: ip,
        client_port: ports[0],
        peer_port: ports[1],
        initial_cluster: cluster,
        initial_cluster_state: ClusterState::New,
        tls: None,
        quota_backend_bytes: None,
    })?;
    member.wait_healthy(Duration::from_secs(30), None).await?;
    Ok(member)
}
