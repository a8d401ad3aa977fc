//! The sandbox: two emulated management clusters (`mgmt-a`, `mgmt-b`), each an
//! API emulator on its own real etcd with the HyperShift CRDs and a simulated
//! operator, plus an S3 endpoint (HTTPS, sandbox CA; the backup bucket and
//! each operator's OIDC bucket, [`oidc_bucket`]) and a Route53 endpoint.
//! `hcp-dr-sandbox up|down|status|drill|faults` is built on this module.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::apiserver::faults::ApiFaults;
use crate::apiserver::{ApiServer, ApiServerConfig, ApiServerError};
use crate::external::{External, Footprint, Removal};
use crate::operator::agent::INFRAENV_LABEL;
pub use crate::operator::snapshots::{SANDBOX_CSI_DRIVER, SANDBOX_SNAPSHOT_CLASS, SANDBOX_STORAGE_CLASS};
use crate::operator::{Controllers, EtcdInit, OidcConfig, Operator, OperatorConfig, OperatorError, Route53Config};
use crate::pki::{Ca, PkiError};
use crate::procs::ProcError;
use crate::procs::etcd::EtcdProcess;
use crate::procs::route53::Route53Endpoint;
use crate::procs::s3::S3Endpoint;
use crate::procs::s3_faults::S3Faults;

/// The management clusters every sandbox has.
pub const CLUSTERS: [&str; 2] = ["mgmt-a", "mgmt-b"];
/// The bucket backups go to.
pub const BUCKET: &str = "hcp-dr-backups";
/// The base domain of hosted clusters and the Route53 zone external-dns writes.
pub const BASE_DOMAIN: &str = "sandbox.hcp-dr.test";

/// Why the sandbox could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A file of the sandbox directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The sandbox CA could not be made or loaded.
    #[error("sandbox CA: {0}")]
    Pki(#[from] PkiError),
    /// A process fixture (etcd, s3s-fs, moto) failed to start.
    #[error(transparent)]
    Process(#[from] ProcError),
    /// An API emulator failed to start.
    #[error("API emulator for {cluster}: {source}")]
    ApiServer {
        cluster: String,
        #[source]
        source: ApiServerError,
    },
    /// The simulated operator failed to start.
    #[error("operator for {cluster}: {source}")]
    Operator {
        cluster: String,
        #[source]
        source: OperatorError,
    },
    /// A request to a sandbox API server failed.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// Something did not become ready in time.
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
    /// A drill check found something other than expected.
    #[error("drill check failed: {0}")]
    Check(String),
    /// No sandbox is recorded in the directory.
    #[error("no sandbox in {dir}: run `hcp-dr-sandbox up --dir {dir}` first")]
    NotRunning { dir: String },
    /// Bad input or a cluster the sandbox must not use; nothing was created.
    #[error("{0}")]
    Refused(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError + '_ {
    move |source| SandboxError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What `up` records in `DIR/sandbox.json` for `status` and `down`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxState {
    pub pid: u32,
    pub sandbox_id: String,
    pub clusters: Vec<ClusterState>,
    pub s3_url: String,
    pub bucket: String,
    pub route53_url: String,
    pub zone_id: String,
    pub crds: String,
    /// The `etcd-init` the simulated HyperShift operators render (absent in
    /// the state of an older sandbox: shipped).
    #[serde(default)]
    pub etcd_init: EtcdInit,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterState {
    pub name: String,
    pub api_url: String,
    pub kubeconfig: String,
    /// The emulator's etcd; empty for a cluster given with `--mgmt-kubeconfig`.
    pub etcd_url: String,
    /// For a cluster given with `--mgmt-kubeconfig`: the kubeconfig as given,
    /// and what the sandbox found and installed there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalState>,
}

/// A management cluster the sandbox did not start (see [`crate::external`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExternalState {
    pub given_kubeconfig: String,
    pub footprint: Footprint,
}

impl SandboxState {
    pub fn load(dir: &Path) -> Result<SandboxState, SandboxError> {
        let path = dir.join("sandbox.json");
        let text = std::fs::read_to_string(&path).map_err(|_| SandboxError::NotRunning {
            dir: dir.display().to_string(),
        })?;
        serde_json::from_str(&text).map_err(|err| SandboxError::Io {
            path,
            source: std::io::Error::other(err),
        })
    }
}

/// A management cluster's API: the sandbox's own emulator, or a server
/// given with `--mgmt-kubeconfig`.
pub enum ClusterApi {
    Emulated(ApiServer),
    External { cluster: External, footprint: Footprint },
}

impl ClusterApi {
    /// `https://host:port`.
    pub fn url(&self) -> &str {
        match self {
            ClusterApi::Emulated(api) => api.url(),
            ClusterApi::External { cluster, .. } => &cluster.url,
        }
    }

    /// An admin client.
    pub async fn client(&self) -> Result<kube::Client, ApiServerError> {
        match self {
            ClusterApi::Emulated(api) => api.client().await,
            ClusterApi::External { cluster, .. } => Ok(cluster.client.clone()),
        }
    }

    /// Who runs the controller-manager's controllers there.
    pub fn controllers(&self) -> Controllers {
        match self {
            ClusterApi::Emulated(_) => Controllers::Sandbox,
            ClusterApi::External { footprint, .. } => footprint.controllers,
        }
    }
}

/// One management cluster: emulated on its own etcd, or external.
pub struct ManagementCluster {
    pub name: String,
    /// The emulator's etcd; None for an external cluster.
    pub etcd: Option<EtcdProcess>,
    pub api: ClusterApi,
    pub operator: Operator,
    pub kubeconfig: PathBuf,
}

/// A management cluster [`Sandbox::lose`] stopped.
#[derive(Debug, Clone)]
pub struct LostCluster {
    pub name: String,
    pub kubeconfig: PathBuf,
    pub api_url: String,
    pub dir: PathBuf,
    /// How its etcd ran: [`Sandbox::revive`] starts it again on its data.
    pub etcd: crate::procs::etcd::EtcdMemberConfig,
}

/// A running sandbox. Dropping it kills its processes; [`Sandbox::shutdown`]
/// stops it in order.
pub struct Sandbox {
    pub dir: PathBuf,
    pub ca: Ca,
    pub sandbox_id: String,
    pub clusters: Vec<ManagementCluster>,
    pub s3: S3Endpoint,
    pub route53: Route53Endpoint,
    pub zone_id: String,
    pub crds: PathBuf,
    /// Management clusters stopped by [`Sandbox::lose`].
    pub lost: Vec<LostCluster>,
    /// The Cluster API conversion webhook of the CRDs installed on existing
    /// clusters ([`crate::conversion_webhook`]).
    pub conversion_webhook: Option<crate::conversion_webhook::ConversionWebhook>,
    /// The `etcd-init` the simulated HyperShift operators render (an
    /// operator started again by [`Sandbox::revive`] keeps it).
    pub etcd_init: EtcdInit,
}

/// Write `text` to `path`, readable by its owner only (kubeconfigs, env).
pub fn write_private(path: &Path, text: &str) -> Result<(), SandboxError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    file.write_all(text.as_bytes()).map_err(io_err(path))
}

/// `DIR/<cluster>/state/api-faults.json`: the faults the API server of
/// management cluster `cluster` of the sandbox in `dir` injects (see
/// [`crate::apiserver::faults`]); absent: none.
pub fn api_faults_path(dir: &Path, cluster: &str) -> PathBuf {
    dir.join(cluster).join("state").join(crate::apiserver::faults::API_FAULTS_FILE)
}

/// `DIR/cloud`: the simulated cloud the sandbox's management clusters share
/// (see [`crate::operator::cloud`]).
pub fn cloud_dir(dir: &Path) -> PathBuf {
    dir.join("cloud")
}

/// The worker instances the sandbox's CAPI terminated so far,
/// `<infraID>/<machine> by <management cluster>` each.
pub fn terminated_instances(dir: &Path) -> Vec<String> {
    crate::operator::cloud::terminated(&cloud_dir(dir))
}

/// The bare-metal hosts the sandbox's metal3 deprovisioned so far (a
/// BareMetalHost it managed was deleted), `<bootMACAddress> by <management
/// cluster>` each.
pub fn deprovisioned_hosts(dir: &Path) -> Vec<String> {
    crate::operator::cloud::deprovisioned(&cloud_dir(dir))
}

/// The boot MAC address of host `index` of [`agent_inventory`]`(namespace,
/// infraenv, ..)`.
pub fn inventory_mac(namespace: &str, infraenv: &str, index: usize) -> String {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(format!("{namespace}/{infraenv}").as_bytes());
    format!("52:54:{:02x}:{:02x}:{:02x}:{:02x}", h[0], h[1], (index >> 8) & 0xff, index & 0xff)
}

/// An Agent-platform host inventory, as an administrator writes it before
/// any cluster uses it: the Namespace `namespace`, the pull secret
/// `<infraenv>-pull-secret` the InfraEnv `infraenv` references, the
/// InfraEnv (selecting the NMStateConfigs labelled
/// `infraenvs.agent-install.openshift.io: <infraenv>`), and per host
/// `<infraenv>-host-<i>` (`i` from 0; at most 254 hosts, the addresses of
/// 192.0.2.0/24): its NMStateConfig, its BMC credentials Secret
/// `<host>-bmc-secret` and its BareMetalHost (labelled with the InfraEnv,
/// online, boot MAC [`inventory_mac`], BMC at
/// `redfish-virtualmedia+https://192.0.2.<i+1>/redfish/v1/Systems/1`,
/// automated cleaning disabled). Shaped to pass the real CRD schemas; the
/// simulated metal3 and assisted-service turn the hosts into Agents.
pub fn agent_inventory(namespace: &str, infraenv: &str, hosts: usize) -> Vec<Value> {
    let selector = json!({INFRAENV_LABEL: infraenv});
    let pull_secret = base64_encode(br#"{"auths":{"sandbox.invalid":{"auth":"c2FuZGJveDpzYW5kYm94"}}}"#);
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
               "metadata": {"name": format!("{infraenv}-pull-secret"), "namespace": namespace},
               "data": {".dockerconfigjson": pull_secret}}),
        json!({"apiVersion": "agent-install.openshift.io/v1beta1", "kind": "InfraEnv",
               "metadata": {"name": infraenv, "namespace": namespace},
               "spec": {"pullSecretRef": {"name": format!("{infraenv}-pull-secret")},
                        "cpuArchitecture": "x86_64",
                        "nmStateConfigLabelSelector": {"matchLabels": selector}}}),
    ];
    for i in 0..hosts.min(254) {
        let host = format!("{infraenv}-host-{i}");
        let mac = inventory_mac(namespace, infraenv, i);
        let ip = format!("192.0.2.{}", i + 1);
        objects.push(json!({"apiVersion": "agent-install.openshift.io/v1beta1", "kind": "NMStateConfig",
            "metadata": {"name": host, "namespace": namespace, "labels": selector},
            "spec": {"interfaces": [{"name": "eth0", "macAddress": mac}],
                     "config": {"interfaces": [{"name": "eth0", "type": "ethernet", "state": "up",
                                                "mac-address": mac,
                                                "ipv4": {"enabled": true, "dhcp": true}}]}}}));
        objects.push(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": format!("{host}-bmc-secret"), "namespace": namespace},
            "data": {"username": base64_encode(b"admin"), "password": base64_encode(format!("sandbox-{i}").as_bytes())}}));
        objects.push(json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": host, "namespace": namespace, "labels": selector,
                         "annotations": {"inspect.metal3.io": "disabled"}},
            "spec": {"online": true, "bootMACAddress": mac, "automatedCleaningMode": "disabled",
                     "bootMode": "UEFI",
                     "bmc": {"address": format!("redfish-virtualmedia+https://{ip}/redfish/v1/Systems/1"),
                             "credentialsName": format!("{host}-bmc-secret"),
                             "disableCertificateVerification": true}}}));
    }
    objects
}

/// `DIR/<cluster>/state/audit.log`: every request the API server of
/// management cluster `cluster` served, one JSON line each (see
/// [`crate::apiserver::audit`]).
pub fn audit_log_path(dir: &Path, cluster: &str) -> PathBuf {
    dir.join(cluster).join("state").join("audit.log")
}

/// `DIR/s3/s3-faults.json`: the faults the HTTPS front of the sandbox's S3
/// endpoint injects (see [`crate::procs::s3_faults`]); absent: none.
pub fn s3_faults_path(dir: &Path) -> PathBuf {
    dir.join("s3").join(crate::procs::s3_faults::S3_FAULTS_FILE)
}

/// The OIDC bucket of the HyperShift operator of management cluster
/// `cluster_name` (`oidc-mgmt-a`): each install has its own, so the issuer
/// documents of a hosted cluster moved to another management cluster stay
/// in the first one's bucket (see [`crate::operator::oidc`]).
pub fn oidc_bucket(cluster_name: &str) -> String {
    format!("oidc-{cluster_name}")
}

/// The issuer URL of documents at `path` (`<infraID>`) of `bucket`, served
/// path-style by the sandbox's S3 endpoint at `s3_https_url`:
/// `https://127.0.0.1:PORT/oidc-mgmt-a/<infraID>`. Set it as a
/// HostedCluster's `spec.issuerURL`; its documents are then at
/// `<issuer>/.well-known/openid-configuration` and `<issuer>/openid/v1/jwks`.
pub fn oidc_issuer_url(s3_https_url: &str, bucket: &str, path: &str) -> String {
    format!("{}/{bucket}/{path}", s3_https_url.trim_end_matches('/'))
}

/// What every management cluster of one sandbox shares.
struct Common<'a> {
    dir: &'a Path,
    ca: &'a Ca,
    sandbox_id: &'a str,
    crds: &'a Path,
    route53: &'a Route53Endpoint,
    zone_id: &'a str,
    s3: &'a S3Endpoint,
    etcd_init: EtcdInit,
}

/// One management cluster's API server on `etcd` (at `port`, 0: any) with
/// its kubeconfig at `DIR/<name>.kubeconfig`, and its operator on
/// `DIR/<name>/state`.
async fn start_cluster(common: &Common<'_>, name: &str, etcd: &EtcdProcess, port: u16) -> Result<(ApiServer, Operator), SandboxError> {
    let api = ApiServer::start(ApiServerConfig {
        cluster_name: name.to_string(),
        bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port,
        etcd_endpoints: vec![etcd.client_url()],
        etcd_tls: None,
        key_prefix: "/registry".into(),
        crd_dirs: vec![common.crds.to_path_buf()],
        ca: common.ca.clone(),
        tokens: vec![],
        faults_file: Some(api_faults_path(common.dir, name)),
        audit_log: Some(audit_log_path(common.dir, name)),
    })
    .await
    .map_err(|source| SandboxError::ApiServer {
        cluster: name.into(),
        source,
    })?;
    let kubeconfig = common.dir.join(format!("{name}.kubeconfig"));
    api.write_kubeconfig(&kubeconfig, name).map_err(io_err(&kubeconfig))?;
    let client = api.client().await.map_err(|source| SandboxError::ApiServer {
        cluster: name.into(),
        source,
    })?;
    install_storage(&client).await?;
    let operator = start_operator(common, name, client, Controllers::Sandbox).await?;
    Ok((api, operator))
}

/// The simulated HyperShift operator (with its kubelet, controller-manager
/// and external-dns) for management cluster `name`, on `DIR/<name>/state`.
async fn start_operator(common: &Common<'_>, name: &str, client: kube::Client, controllers: Controllers) -> Result<Operator, SandboxError> {
    Operator::start(OperatorConfig {
        kubeconfig_client: client,
        cluster_name: name.to_string(),
        state_dir: common.dir.join(name).join("state"),
        ca: common.ca.clone(),
        sandbox_id: common.sandbox_id.to_string(),
        route53: Some(Route53Config {
            endpoint_url: common.route53.url().to_string(),
            zone_id: common.zone_id.to_string(),
            region: "us-east-1".into(),
            domain: BASE_DOMAIN.into(),
        }),
        snapshot_ca_pem: Some(common.ca.cert_pem().to_string()),
        cloud_dir: Some(cloud_dir(common.dir)),
        oidc: Some(OidcConfig {
            endpoint_url: common.s3.https_url().to_string(),
            bucket: oidc_bucket(name),
            region: common.s3.region().to_string(),
            access_key: common.s3.access_key().to_string(),
            secret_key: common.s3.secret_key().to_string(),
            ca_pem: common.ca.cert_pem().to_string(),
        }),
        controllers,
        etcd_init: common.etcd_init,
    })
    .await
    .map_err(|source| SandboxError::Operator {
        cluster: name.into(),
        source,
    })
}

/// How `up` is to run.
#[derive(Debug, Clone, Default)]
pub struct UpOptions {
    /// Existing API servers to use as mgmt-a (and mgmt-b), in that order,
    /// instead of starting emulators; at most two.
    pub mgmt_kubeconfigs: Vec<PathBuf>,
    /// Go on where a HyperShift operator already runs.
    pub force: bool,
    /// Who runs Deployments, StatefulSets, Jobs, garbage collection and
    /// PVC protection on the clusters of `mgmt_kubeconfigs`; `None`: the
    /// cluster's kube-controller-manager where one runs (its leader Lease
    /// is renewed), else the sandbox.
    pub controllers: Option<Controllers>,
    /// Where the API servers of `mgmt_kubeconfigs` reach this machine, for
    /// the Cluster API conversion webhook; `None`: 127.0.0.1.
    pub webhook_address: Option<IpAddr>,
    /// The `etcd-init` init container the simulated HyperShift operators
    /// render: as HyperShift ships it (default), or as PR 9048 fixes it.
    pub etcd_init: EtcdInit,
}

/// Connect to and check every cluster of `opts` before anything is created:
/// reachable, distinct, permitted, no HyperShift operator, no demo.
async fn external_clusters(opts: &UpOptions) -> Result<Vec<(External, Controllers)>, SandboxError> {
    if opts.mgmt_kubeconfigs.len() > CLUSTERS.len() {
        return Err(SandboxError::Refused(format!(
            "--mgmt-kubeconfig given {} times: the sandbox has {} management clusters ({}); give one or two",
            opts.mgmt_kubeconfigs.len(),
            CLUSTERS.len(),
            CLUSTERS.join(", ")
        )));
    }
    let mut clusters = Vec::new();
    for path in &opts.mgmt_kubeconfigs {
        clusters.push(crate::external::connect(path).await?);
    }
    crate::external::check_distinct(&clusters)?;
    let demo = HostedClusterSpec::demo();
    let mut checked = Vec::new();
    for cluster in clusters {
        crate::external::check(&cluster, opts.force, &demo.namespace, &demo.name).await?;
        let controllers = crate::external::controllers(&cluster, opts.controllers).await?;
        checked.push((cluster, controllers));
    }
    Ok(checked)
}

/// The CRDs an external cluster needs: those of `crds` (HyperShift, Cluster
/// API) and of its `platform/` folder (the Route CRD, which the emulator
/// serves built in, and the Agent platform's: Agent, InfraEnv,
/// NMStateConfig, BareMetalHost, ...).
fn external_crds(crds: &Path) -> Result<Vec<Value>, SandboxError> {
    crate::external::crds_in(&[crds.to_path_buf()])
}

/// Copy `from` (a kubeconfig given with `--mgmt-kubeconfig`) to `to`, private.
fn copy_kubeconfig(from: &Path, to: &Path) -> Result<(), SandboxError> {
    let text = std::fs::read_to_string(from).map_err(io_err(from))?;
    write_private(to, &text)
}

impl Sandbox {
    /// Start everything in `dir` (created if missing) and write the
    /// kubeconfigs, `ca.crt`, `env` and `sandbox.json`.
    pub async fn up(dir: &Path) -> Result<Sandbox, SandboxError> {
        Sandbox::up_with(dir, &UpOptions::default()).await
    }

    /// [`Sandbox::up`], using the API servers of `opts.mgmt_kubeconfigs` as
    /// mgmt-a (and mgmt-b) instead of emulators: each is checked before
    /// anything is created (see [`crate::external`]), then the missing CRDs
    /// are installed there and the operator runs against it.
    /// `DIR/<name>.kubeconfig` is a copy of the one given.
    pub async fn up_with(dir: &Path, opts: &UpOptions) -> Result<Sandbox, SandboxError> {
        let mut externals = external_clusters(opts).await?.into_iter();
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let dir = dir.canonicalize().map_err(io_err(dir))?;
        let ca = Ca::new("hcp-dr sandbox CA")?;
        ca.save(&dir)?;
        let sandbox_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let (crds, _) = crate::crds::crd_dir();

        let s3_dir = dir.join("s3");
        std::fs::create_dir_all(&s3_dir).map_err(io_err(&s3_dir))?;
        let s3 = S3Endpoint::start(&s3_dir, &ca).await?;
        s3.create_bucket(BUCKET).await?;
        for name in CLUSTERS {
            s3.create_bucket(&oidc_bucket(name)).await?;
        }
        let r53_dir = dir.join("route53");
        std::fs::create_dir_all(&r53_dir).map_err(io_err(&r53_dir))?;
        let route53 = Route53Endpoint::start(&r53_dir).await?;
        let zone_id = route53.create_hosted_zone(BASE_DOMAIN).await?;

        let conversion_webhook = match opts.mgmt_kubeconfigs.is_empty() {
            true => None,
            false => Some(crate::conversion_webhook::ConversionWebhook::start(&ca, opts.webhook_address).await?),
        };
        let common = Common { dir: &dir, ca: &ca, sandbox_id: &sandbox_id, crds: &crds, route53: &route53, zone_id: &zone_id, s3: &s3, etcd_init: opts.etcd_init };
        let mut clusters = Vec::new();
        for name in CLUSTERS {
            let cluster_dir = dir.join(name);
            std::fs::create_dir_all(&cluster_dir).map_err(io_err(&cluster_dir))?;
            let kubeconfig = dir.join(format!("{name}.kubeconfig"));
            let cluster = match externals.next() {
                Some((external, controllers)) => {
                    let footprint = crate::external::prepare(&external, &external_crds(&crds)?, controllers, conversion_webhook.as_ref()).await?;
                    copy_kubeconfig(&external.kubeconfig, &kubeconfig)?;
                    let operator = start_operator(&common, name, external.client.clone(), controllers).await?;
                    tracing::info!(cluster = name, server = %external.url, installed = ?footprint.installed_crds,
                        objects = ?footprint.installed_objects, controllers = controllers.as_str(), "using an existing API server");
                    ManagementCluster {
                        name: name.to_string(),
                        etcd: None,
                        api: ClusterApi::External { cluster: external, footprint },
                        operator,
                        kubeconfig,
                    }
                }
                None => {
                    let etcd = EtcdProcess::start_plain(&cluster_dir.join("etcd")).await?;
                    let (api, operator) = start_cluster(&common, name, &etcd, 0).await?;
                    ManagementCluster {
                        name: name.to_string(),
                        etcd: Some(etcd),
                        api: ClusterApi::Emulated(api),
                        operator,
                        kubeconfig,
                    }
                }
            };
            clusters.push(cluster);
        }
        let sandbox = Sandbox {
            dir,
            ca,
            sandbox_id,
            clusters,
            s3,
            route53,
            zone_id,
            crds,
            lost: Vec::new(),
            conversion_webhook,
            etcd_init: opts.etcd_init,
        };
        sandbox.write_files()?;
        Ok(sandbox)
    }

    fn write_files(&self) -> Result<(), SandboxError> {
        let ca_path = self.dir.join("ca.crt");
        write_private(&ca_path, self.ca.cert_pem())?;
        let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
        let mut env = String::from("# hcp-dr sandbox: source this file (credentials are the sandbox's own)\n");
        let mut line = |key: &str, value: &str| env.push_str(&format!("export {key}={}\n", quote(value)));
        line("HCP_DR_SANDBOX_DIR", &self.dir.display().to_string());
        for cluster in &self.clusters {
            let key = format!("KUBECONFIG_{}", cluster.name.trim_start_matches("mgmt-").to_uppercase());
            line(&key, &cluster.kubeconfig.display().to_string());
        }
        line("AWS_ACCESS_KEY_ID", self.s3.access_key());
        line("AWS_SECRET_ACCESS_KEY", self.s3.secret_key());
        line("AWS_REGION", self.s3.region());
        line("AWS_DEFAULT_REGION", self.s3.region());
        line("AWS_ENDPOINT_URL_S3", self.s3.https_url());
        line("AWS_ENDPOINT_URL_ROUTE_53", self.route53.url());
        line("AWS_CA_BUNDLE", &ca_path.display().to_string());
        line("HCP_DR_CA_BUNDLE", &ca_path.display().to_string());
        line("HCP_DR_S3_BUCKET", BUCKET);
        line("HCP_DR_STORE", &format!("s3://{BUCKET}/backups"));
        line("HCP_DR_ROUTE53_ZONE", &self.zone_id);
        line("HCP_DR_BASE_DOMAIN", BASE_DOMAIN);
        write_private(&self.dir.join("env"), &env)?;

        let state = SandboxState {
            pid: std::process::id(),
            sandbox_id: self.sandbox_id.clone(),
            clusters: self
                .clusters
                .iter()
                .map(|c| ClusterState {
                    name: c.name.clone(),
                    api_url: c.api.url().to_string(),
                    kubeconfig: c.kubeconfig.display().to_string(),
                    etcd_url: c.etcd.as_ref().map(EtcdProcess::client_url).unwrap_or_default(),
                    external: match &c.api {
                        ClusterApi::External { cluster, footprint } => Some(ExternalState {
                            given_kubeconfig: cluster.kubeconfig.display().to_string(),
                            footprint: footprint.clone(),
                        }),
                        ClusterApi::Emulated(_) => None,
                    },
                })
                .collect(),
            s3_url: self.s3.https_url().to_string(),
            bucket: BUCKET.into(),
            route53_url: self.route53.url().to_string(),
            zone_id: self.zone_id.clone(),
            crds: self.crds.display().to_string(),
            etcd_init: self.etcd_init,
        };
        let text = serde_json::to_string_pretty(&state).map_err(|err| SandboxError::Io {
            path: self.dir.join("sandbox.json"),
            source: std::io::Error::other(err),
        })?;
        write_private(&self.dir.join("sandbox.json"), &text)
    }

    pub fn cluster(&self, name: &str) -> Option<&ManagementCluster> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// [`guest_volume_on`] management cluster `mgmt`: a volume of KubeVirt
    /// hosted cluster `hc_namespace/hc_name`'s guest, as kubevirt-csi makes
    /// one (a DataVolume and its claim `pvc-<uuid>` in the HCP namespace, of
    /// the [`SANDBOX_STORAGE_CLASS`]); returns the claim's name and its data
    /// directory, where a test writes the guest's files.
    pub async fn guest_volume(
        &self,
        mgmt: &str,
        hc_namespace: &str,
        hc_name: &str,
        size: &str,
    ) -> Result<(String, PathBuf), SandboxError> {
        let cluster = self
            .cluster(mgmt)
            .ok_or_else(|| SandboxError::Check(format!("no running management cluster {mgmt}")))?;
        let client = cluster
            .api
            .client()
            .await
            .map_err(|source| SandboxError::ApiServer { cluster: mgmt.into(), source })?;
        guest_volume_on(&client, &self.dir.join(mgmt).join("state"), hc_namespace, hc_name, size).await
    }

    /// Stop (`down`) or start again the simulated HyperShift operator of
    /// management cluster `name`: its reconciler stops acting (nothing is
    /// paused, scaled or acknowledged), while the kubelet with every etcd
    /// member, the controller-manager and external-dns go on. The marker
    /// file `DIR/<name>/state/hypershift-operator-down` does it, so a shell
    /// can too.
    pub fn set_hypershift_down(&self, name: &str, down: bool) -> Result<(), SandboxError> {
        let marker = self.dir.join(name).join("state").join(crate::operator::hypershift::DOWN_MARKER);
        if down {
            std::fs::write(&marker, b"stopped by the sandbox\n").map_err(io_err(&marker))
        } else {
            match std::fs::remove_file(&marker) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&marker)(e)),
                _ => Ok(()),
            }
        }
    }

    /// Make the next `reset-member` init container of an etcd pod with no
    /// data on management cluster `name` fail to reach the cluster, as the
    /// real script's `etcdctl member list` does when the `etcd-client`
    /// Service has no ready endpoint or times out (a leader election, a DNS
    /// hiccup): it says "Cannot list members in cluster, so likely not up
    /// yet" and etcd starts as a new cluster, which never joins the others.
    /// The marker file `DIR/<name>/state/reset-member-unreachable` does it
    /// (consumed by the one it fails), so a shell can too.
    pub fn fail_next_reset_member(&self, name: &str) -> Result<(), SandboxError> {
        let marker = self.dir.join(name).join("state").join(crate::operator::etcd_member::RESET_UNREACHABLE_MARKER);
        std::fs::write(&marker, b"the next reset-member cannot list the members\n").map_err(io_err(&marker))
    }

    /// Make the API server of management cluster `cluster` fail a share of
    /// its requests (`Some`), or stop (`None`): writes or removes
    /// `DIR/<cluster>/state/api-faults.json`, which the server reads again on
    /// its next request, so a shell can do the same (`hcp-dr-sandbox
    /// faults`). A lost cluster keeps its setting for when it is revived.
    pub fn set_api_faults(&self, cluster: &str, faults: Option<&ApiFaults>) -> std::io::Result<()> {
        if self.cluster(cluster).is_none() && !self.lost.iter().any(|c| c.name == cluster) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no management cluster {cluster} in the sandbox"),
            ));
        }
        crate::apiserver::faults::write_faults_file(&api_faults_path(&self.dir, cluster), faults)
    }

    /// The faults the API server of `cluster` injected so far, oldest first:
    /// one `{"method", "path", "user_agent", "kind"}` object each (from
    /// `DIR/<cluster>/state/api-faults.json.log`).
    pub fn api_faults_injected(&self, cluster: &str) -> Vec<Value> {
        crate::apiserver::faults::read_log(&api_faults_path(&self.dir, cluster))
    }

    /// Make the S3 endpoint's HTTPS front (`AWS_ENDPOINT_URL_S3`) fail a
    /// share of its requests (`Some`), or stop (`None`): writes or removes
    /// `DIR/s3/s3-faults.json`, which the front reads again at its next
    /// request, so a shell can do the same (`hcp-dr-sandbox faults --s3`).
    pub fn set_s3_faults(&self, faults: Option<&S3Faults>) -> std::io::Result<()> {
        self.s3.set_faults(faults)
    }

    /// The faults the S3 endpoint injected so far, oldest first: one
    /// `{"time", "kind", "method", "path", "user_agent"}` object each, with
    /// `"bytes"` for the resets (from `DIR/s3/s3-faults.json.log`).
    pub fn s3_faults_injected(&self) -> Vec<Value> {
        self.s3.faults_injected()
    }

    /// The external-dns owners of `host`'s records in the sandbox zone
    /// (from their TXT registry records).
    pub async fn owners_of(&self, host: &str) -> Result<Vec<String>, SandboxError> {
        let out = self
            .route53
            .client()
            .list_resource_record_sets()
            .hosted_zone_id(&self.zone_id)
            .send()
            .await
            .map_err(|e| SandboxError::Check(format!("listing the records of zone {}: {e:?}", self.zone_id)))?;
        Ok(out
            .resource_record_sets()
            .iter()
            .filter(|r| r.name().trim_end_matches('.') == host && r.r#type().as_str() == "TXT")
            .flat_map(|r| r.resource_records().iter().map(|v| v.value().to_string()))
            .filter_map(|v| crate::operator::external_dns::txt_owner(&v))
            .collect())
    }

    /// Make management cluster `name` disappear as if its machine died:
    /// its operator stops (hosted API servers, external-dns, the kubelet and
    /// with it every hosted etcd member it ran), then its API server, then
    /// the etcd behind it. It leaves `clusters` (indexes shift: look
    /// clusters up by name) and is recorded in `lost`; its data directory
    /// stays. Nothing is told: records it published stay in the zone.
    pub async fn lose(&mut self, name: &str) -> Result<(), SandboxError> {
        let index = self
            .clusters
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| SandboxError::Check(format!("no running management cluster {name}")))?;
        let Some(etcd) = &self.clusters[index].etcd else {
            return Err(SandboxError::Refused(format!(
                "{name} is an existing cluster given with --mgmt-kubeconfig: the sandbox cannot make it fail; lose needs an emulated management cluster"
            )));
        };
        let etcd = etcd.config().clone();
        let cluster = self.clusters.remove(index);
        let lost = LostCluster {
            name: cluster.name.clone(),
            kubeconfig: cluster.kubeconfig.clone(),
            api_url: cluster.api.url().to_string(),
            dir: self.dir.join(&cluster.name),
            etcd,
        };
        cluster.operator.shutdown().await;
        if let ClusterApi::Emulated(api) = cluster.api {
            api.shutdown().await;
        }
        drop(cluster.etcd);
        tracing::info!(cluster = %lost.name, "management cluster lost: its operator, API server and etcd are stopped");
        self.lost.push(lost);
        Ok(())
    }

    /// Bring a cluster [`Sandbox::lose`] stopped back with everything it
    /// had, as when a dead machine is repaired: its etcd on its old data, its
    /// API server at the same URL (its kubeconfig works again), and its
    /// operator on the same state directory, which starts again whatever
    /// its objects say should run (the old hosted control planes on their
    /// old etcd data, external-dns with its old Routes). It is appended to
    /// `clusters` (look clusters up by name).
    pub async fn revive(&mut self, name: &str) -> Result<(), SandboxError> {
        let index = self
            .lost
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| SandboxError::Check(format!("no lost management cluster {name}")))?;
        let lost = self.lost.remove(index);
        let etcd = EtcdProcess::start(lost.etcd.clone())?;
        etcd.wait_healthy(Duration::from_secs(30), None).await?;
        let port = lost
            .api_url
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| SandboxError::Check(format!("{}: no port in {}", lost.name, lost.api_url)))?;
        let common = Common {
            dir: &self.dir,
            ca: &self.ca,
            sandbox_id: &self.sandbox_id,
            crds: &self.crds,
            route53: &self.route53,
            zone_id: &self.zone_id,
            s3: &self.s3,
            etcd_init: self.etcd_init,
        };
        let (api, operator) = start_cluster(&common, &lost.name, &etcd, port).await?;
        tracing::info!(cluster = %lost.name, "management cluster back with its old state");
        self.clusters.push(ManagementCluster {
            name: lost.name,
            etcd: Some(etcd),
            api: ClusterApi::Emulated(api),
            operator,
            kubeconfig: lost.kubeconfig,
        });
        self.write_files()
    }

    /// Stop the operators first (they own the hosted etcd processes), then the
    /// API servers; the fixtures die with the value. On a cluster given with
    /// `--mgmt-kubeconfig`, what the sandbox created is removed first, while
    /// its operator still runs (see [`crate::external::remove`]); what was
    /// removed, left or not removed is also written to `DIR/down.txt` for
    /// `hcp-dr-sandbox down`.
    pub async fn shutdown(self) -> Cleanup {
        let _ = std::fs::remove_file(self.dir.join("sandbox.json"));
        let mut cleanup = Cleanup { lines: Vec::new(), complete: true };
        for cluster in self.clusters {
            if let ClusterApi::External { cluster: external, footprint } = &cluster.api {
                let removal = crate::external::remove(&external.client, &external.url, footprint).await;
                cleanup.add(&cluster.name, &external.url, removal);
            }
            if let Some(node) = cluster.operator.shutdown().await {
                cleanup.lines.push(format!("  removed {node}"));
            }
            if let ClusterApi::Emulated(api) = cluster.api {
                api.shutdown().await;
            }
            drop(cluster.etcd);
        }
        if !cleanup.lines.is_empty() {
            let _ = std::fs::write(self.dir.join("down.txt"), cleanup.lines.join("\n") + "\n");
        }
        cleanup
    }
}

/// What [`Sandbox::shutdown`] did on the clusters given with
/// `--mgmt-kubeconfig` (nothing for an all-emulated sandbox).
#[derive(Debug, Clone)]
pub struct Cleanup {
    /// One line per cluster, then one per thing removed or left.
    pub lines: Vec<String>,
    /// False when something the sandbox created could not be removed.
    pub complete: bool,
}

impl Cleanup {
    fn add(&mut self, name: &str, url: &str, removal: Result<Removal, SandboxError>) {
        match removal {
            Ok(removal) => {
                self.lines.push(format!(
                    "{name} ({url}): removed what the sandbox created{}",
                    if removal.removed.is_empty() { ": nothing was left" } else { "" }
                ));
                self.lines.extend(removal.removed.iter().map(|r| format!("  removed {r}")));
                self.lines.extend(removal.left.iter().map(|l| format!("  left {l}")));
            }
            Err(err) => {
                self.complete = false;
                self.lines.push(format!(
                    "{name} ({url}): {NOT_REMOVED}: {err}; delete what remains by hand (kubectl get hostedclusters -A; namespaces clusters and clusters-*)"
                ));
            }
        }
    }
}

/// What a clean-up line says when something was not removed; `down`, which
/// reads `DIR/down.txt` from another process, looks for it.
pub const NOT_REMOVED: &str = "NOT everything the sandbox created was removed";

/// How a hosted cluster for the sandbox is shaped.
#[derive(Debug, Clone)]
pub struct HostedClusterSpec {
    pub name: String,
    pub namespace: String,
    /// `SingleReplica` (one etcd member) or `HighlyAvailable` (three).
    pub availability: String,
    pub node_pool_replicas: i64,
    pub release_image: String,
    /// `spec.services`; `None`: every service a Route with the hostname
    /// `<service>.<name>.<base domain>`.
    pub services: Option<Value>,
    /// The HostedCluster's and the NodePool's `spec.platform`; `None`:
    /// `{"type": "None"}` (no Machines).
    pub platform: Option<(Value, Value)>,
}

impl HostedClusterSpec {
    pub fn demo() -> Self {
        HostedClusterSpec {
            name: "demo".into(),
            namespace: "clusters".into(),
            availability: "HighlyAvailable".into(),
            node_pool_replicas: 2,
            release_image: "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64".into(),
            services: None,
            platform: None,
        }
    }

    /// [`HostedClusterSpec::demo`] on KubeVirt: its NodePool's workers are
    /// CAPI Machines (KubevirtMachines), as on every platform but None.
    pub fn kubevirt() -> Self {
        HostedClusterSpec {
            platform: Some((
                json!({"type": "KubeVirt", "kubevirt": {"baseDomainPassthrough": true}}),
                json!({"type": "KubeVirt", "kubevirt": {"compute": {"cores": 2, "memory": "8Gi"},
                       "rootVolume": {"type": "Persistent", "persistent": {"size": "32Gi"}}}}),
            )),
            ..HostedClusterSpec::demo()
        }
    }

    /// The objects `hcp create cluster none --render` would give for this
    /// cluster (namespace, secrets, HostedCluster, NodePool), shaped to pass
    /// the real CRD schemas.
    pub fn objects(&self) -> Vec<Value> {
        let (name, ns) = (&self.name, &self.namespace);
        let pull_secret = base64_encode(br#"{"auths":{"sandbox.invalid":{"auth":"c2FuZGJveDpzYW5kYm94"}}}"#);
        let key: [u8; 32] = rand_bytes();
        let (hc_platform, np_platform) = self.platform.clone().unwrap_or_else(|| (json!({"type": "None"}), json!({"type": "None"})));
        let route = |service: &str, host: Option<String>| {
            let mut strategy = json!({"type": "Route"});
            if let Some(host) = host {
                strategy["route"] = json!({"hostname": host});
            }
            json!({"service": service, "servicePublishingStrategy": strategy})
        };
        vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                   "metadata": {"name": format!("{name}-pull-secret"), "namespace": ns},
                   "data": {".dockerconfigjson": pull_secret}}),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                   "metadata": {"name": format!("{name}-etcd-encryption-key"), "namespace": ns},
                   "data": {"key": base64_encode(&key)}}),
            json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                   "metadata": {"name": name, "namespace": ns},
                   "spec": {
                       "release": {"image": self.release_image},
                       "pullSecret": {"name": format!("{name}-pull-secret")},
                       "secretEncryption": {"type": "aescbc", "aescbc": {"activeKey": {"name": format!("{name}-etcd-encryption-key")}}},
                       "controllerAvailabilityPolicy": self.availability,
                       "infrastructureAvailabilityPolicy": "SingleReplica",
                       "dns": {"baseDomain": BASE_DOMAIN},
                       "etcd": {"managementType": "Managed",
                                "managed": {"storage": {"type": "PersistentVolume",
                                                        "persistentVolume": {"size": "8Gi"}}}},
                       "networking": {"networkType": "OVNKubernetes",
                                      "clusterNetwork": [{"cidr": "10.132.0.0/14"}],
                                      "serviceNetwork": [{"cidr": "172.31.0.0/16"}]},
                       "platform": hc_platform,
                       "services": self.services.clone().unwrap_or_else(|| json!([
                           route("APIServer", Some(format!("api.{name}.{BASE_DOMAIN}"))),
                           route("OAuthServer", Some(format!("oauth.{name}.{BASE_DOMAIN}"))),
                           route("Konnectivity", Some(format!("konnectivity.{name}.{BASE_DOMAIN}"))),
                           route("Ignition", Some(format!("ignition.{name}.{BASE_DOMAIN}"))),
                       ])),
                   }}),
            json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool",
                   "metadata": {"name": format!("{name}-workers"), "namespace": ns},
                   "spec": {
                       "clusterName": name,
                       "replicas": self.node_pool_replicas,
                       "management": {"upgradeType": "InPlace"},
                       "platform": np_platform,
                       "release": {"image": self.release_image},
                   }}),
        ]
    }
}

fn rand_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(16) {
        let id = uuid::Uuid::new_v4();
        chunk.copy_from_slice(&id.as_bytes()[..chunk.len()]);
    }
    out
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `Api` for an object's kind, from its `apiVersion` and `kind`.
pub fn api_for(client: &kube::Client, obj: &Value) -> Api<DynamicObject> {
    let api_version = obj["apiVersion"].as_str().unwrap_or("v1");
    let kind = obj["kind"].as_str().unwrap_or_default();
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Create each object (an existing one is left as it is).
pub async fn create_all(client: &kube::Client, objects: &[Value]) -> Result<(), SandboxError> {
    for obj in objects {
        let api = api_for(client, obj);
        let what = format!(
            "creating {} {}",
            obj["kind"].as_str().unwrap_or("?"),
            obj["metadata"]["name"].as_str().unwrap_or("?")
        );
        let dynamic: DynamicObject = serde_json::from_value(obj.clone()).map_err(|err| SandboxError::Kube {
            action: what.clone(),
            source: kube::Error::SerdeError(err),
        })?;
        match api.create(&PostParams::default(), &dynamic).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => return Err(SandboxError::Kube { action: what, source }),
        }
    }
    Ok(())
}

/// The PriorityClasses of HyperShift's control planes (as its install
/// creates them), and the storage an emulated management cluster has, as
/// installing a CSI driver gives a real one: the default StorageClass [`SANDBOX_STORAGE_CLASS`]
/// and the default VolumeSnapshotClass [`SANDBOX_SNAPSHOT_CLASS`] of the
/// sandbox's CSI driver [`SANDBOX_CSI_DRIVER`], which the simulated operator
/// provisions and snapshots (see [`crate::operator::snapshots`]). Existing
/// ones are left as they are; without the VolumeSnapshot CRDs the snapshot
/// class is skipped, with a warning.
pub async fn install_storage(client: &kube::Client) -> Result<(), SandboxError> {
    install_priority_classes(client).await?;
    for obj in crate::operator::snapshots::storage_objects() {
        match create_all(client, std::slice::from_ref(&obj)).await {
            Err(SandboxError::Kube { source: kube::Error::Api(status), .. })
                if status.code == 404 && obj["kind"] == "VolumeSnapshotClass" =>
            {
                tracing::warn!("the VolumeSnapshot CRDs are not served: no VolumeSnapshotClass {SANDBOX_SNAPSHOT_CLASS}");
            }
            other => other?,
        }
    }
    Ok(())
}

/// The PriorityClasses the control-plane pods name, as HyperShift's install
/// creates them (existing ones are left as they are).
pub async fn install_priority_classes(client: &kube::Client) -> Result<(), SandboxError> {
    let priority: Vec<Value> = crate::external::cluster_objects().into_iter().filter(|o| o["kind"] == "PriorityClass").collect();
    create_all(client, &priority).await
}

/// How long [`guest_volume_on`] waits for the hosted cluster's infraID and
/// for the claim to be bound.
const GUEST_VOLUME_TIMEOUT: Duration = Duration::from_secs(120);

/// A volume of KubeVirt hosted cluster `hc_namespace/hc_name`'s guest, made
/// as kubevirt-csi's controller makes one on the management cluster when the
/// guest cluster asks for a volume of `size` (a quantity, `1Gi`): in the HCP
/// namespace, a DataVolume `pvc-<uuid>` labelled
/// `hypershift.openshift.io/infra-id: <spec.infraID>` (blank source,
/// `spec.storage` of the [`SANDBOX_STORAGE_CLASS`], Filesystem,
/// ReadWriteOnce), and the claim of the same name CDI makes for it (same
/// label, owned by the DataVolume), bound by the sandbox; the DataVolume's
/// status then says Succeeded, as CDI's would. Returns the claim's name and
/// its data directory (write the guest's files there). `state_dir` is the
/// state directory of the cluster's operator (`DIR/<cluster>/state` in a
/// sandbox).
pub async fn guest_volume_on(
    client: &kube::Client,
    state_dir: &Path,
    hc_namespace: &str,
    hc_name: &str,
    size: &str,
) -> Result<(String, PathBuf), SandboxError> {
    let kube_err = |action: String| move |source| SandboxError::Kube { action, source };
    let hc_api = api_for(client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"namespace": hc_namespace}}));
    let start = Instant::now();
    let infra_id = loop {
        let hc = hc_api
            .get_opt(hc_name)
            .await
            .map_err(kube_err(format!("getting HostedCluster {hc_namespace}/{hc_name}")))?
            .ok_or_else(|| SandboxError::Check(format!("no HostedCluster {hc_namespace}/{hc_name}")))?;
        let hc = serde_json::to_value(hc).unwrap_or(Value::Null);
        let ns_api = api_for(client, &json!({"apiVersion": "v1", "kind": "Namespace"}));
        let hcp_ns = crate::operator::hypershift::hcp_namespace(hc_namespace, hc_name);
        let ns_ready = ns_api.get_opt(&hcp_ns).await.map_err(kube_err(format!("getting Namespace {hcp_ns}")))?.is_some();
        match hc["spec"]["infraID"].as_str().filter(|id| !id.is_empty()) {
            Some(id) if ns_ready => break id.to_string(),
            _ if start.elapsed() > GUEST_VOLUME_TIMEOUT => {
                return Err(SandboxError::Timeout {
                    what: format!("HostedCluster {hc_namespace}/{hc_name} to have spec.infraID and its namespace {hcp_ns}"),
                    seconds: GUEST_VOLUME_TIMEOUT.as_secs(),
                });
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    };
    let hcp_ns = crate::operator::hypershift::hcp_namespace(hc_namespace, hc_name);
    let name = format!("pvc-{}", uuid::Uuid::new_v4());
    let labels = json!({"hypershift.openshift.io/infra-id": infra_id});
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name, "namespace": hcp_ns, "labels": labels},
        "spec": {"source": {"blank": {}},
                 "storage": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                             "storageClassName": SANDBOX_STORAGE_CLASS,
                             "resources": {"requests": {"storage": size}}}}});
    let dv_api = api_for(client, &dv);
    let dynamic: DynamicObject = serde_json::from_value(dv.clone()).map_err(|e| SandboxError::Check(format!("DataVolume {name}: {e}")))?;
    let created = dv_api
        .create(&PostParams::default(), &dynamic)
        .await
        .map_err(kube_err(format!("creating DataVolume {hcp_ns}/{name}")))?;
    let mut pvc_labels = labels.clone();
    pvc_labels["app"] = json!("containerized-data-importer");
    pvc_labels["app.kubernetes.io/component"] = json!("storage");
    pvc_labels["app.kubernetes.io/managed-by"] = json!("cdi-controller");
    let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": hcp_ns, "labels": pvc_labels,
            "annotations": {"cdi.kubevirt.io/storage.contentType": "kubevirt", "cdi.kubevirt.io/storage.import.source": "none"},
            "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": name,
                "uid": created.metadata.uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem", "storageClassName": SANDBOX_STORAGE_CLASS,
                 "resources": {"requests": {"storage": size}}}});
    let pvc_api = api_for(client, &pvc);
    let dynamic: DynamicObject = serde_json::from_value(pvc.clone()).map_err(|e| SandboxError::Check(format!("PersistentVolumeClaim {name}: {e}")))?;
    pvc_api
        .create(&PostParams::default(), &dynamic)
        .await
        .map_err(kube_err(format!("creating PersistentVolumeClaim {hcp_ns}/{name}")))?;
    let start = Instant::now();
    let dir = loop {
        let got = pvc_api.get(&name).await.map_err(kube_err(format!("getting PersistentVolumeClaim {hcp_ns}/{name}")))?;
        let got = serde_json::to_value(got).unwrap_or(Value::Null);
        let dir = crate::operator::workloads::existing_pv_dir(state_dir, &got);
        match dir.filter(|_| got["status"]["phase"] == "Bound") {
            Some(dir) => break dir,
            None if start.elapsed() > GUEST_VOLUME_TIMEOUT => {
                return Err(SandboxError::Timeout {
                    what: format!("PersistentVolumeClaim {hcp_ns}/{name} to be bound (kubectl describe pvc shows why not)"),
                    seconds: GUEST_VOLUME_TIMEOUT.as_secs(),
                });
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let status = json!({"status": {"phase": "Succeeded", "progress": "100.0%", "claimName": name,
        "conditions": [condition("Bound", "True", "Bound", &format!("PVC {name} Bound")),
                       condition("Ready", "True", "", ""),
                       condition("Running", "False", "Completed", "")]}});
    dv_api
        .patch_status(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status))
        .await
        .map_err(kube_err(format!("setting the status of DataVolume {hcp_ns}/{name}")))?;
    tracing::info!(namespace = %hcp_ns, pvc = %name, dir = %dir.display(), "guest volume provisioned");
    Ok((name, dir))
}

/// The value of a condition of an object's status, e.g. `Available`.
pub fn condition(obj: &Value, kind: &str) -> Option<String> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
        .map(str::to_string)
}

/// Whether the etcd StatefulSet of `hcp_ns` has observed its spec and has
/// every replica ready.
async fn all_etcd_members_ready(client: &kube::Client, hcp_ns: &str) -> bool {
    let api: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> =
        kube::Api::namespaced(client.clone(), hcp_ns);
    match api.get_opt("etcd").await {
        Ok(Some(sts)) => {
            let want = sts.spec.replicas.unwrap_or(1);
            let status = sts.status.as_ref();
            let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
            // a status written before the last change of the spec (a scale
            // back up right after a scale to zero) still counts the old pods
            let observed = status.and_then(|s| s.observed_generation).unwrap_or(0);
            observed >= sts.metadata.generation.unwrap_or(0) && ready >= want
        }
        _ => false,
    }
}

pub async fn wait_available(
    client: &kube::Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<Value, SandboxError> {
    let api = api_for(
        client,
        &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": ns}}),
    );
    let start = Instant::now();
    loop {
        if let Ok(hc) = api.get(name).await {
            let value = serde_json::to_value(&hc).unwrap_or(Value::Null);
            // Available needs only etcd quorum; a drill or test wants every
            // member serving, so also wait for the StatefulSet to be ready
            if condition(&value, "Available").as_deref() == Some("True")
                && all_etcd_members_ready(client, &crate::operator::hypershift::hcp_namespace(ns, name)).await
            {
                return Ok(value);
            }
        }
        if start.elapsed() > timeout {
            return Err(SandboxError::Timeout {
                what: format!(
                    "HostedCluster {ns}/{name} to become Available with every etcd member ready"
                ),
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
