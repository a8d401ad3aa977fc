//! The simulated HyperShift operator and the management cluster's
//! controller-manager, kubelet and external-dns.
//!
//! Every controller is an ordinary client of the management cluster's API
//! (list / create / merge-patch / delete through `kube::Client`), run as a
//! tokio task that relists every few hundred milliseconds; failures are logged
//! and retried on the next pass, never fatal.
//!
//! - [`workloads`]: Deployments and StatefulSets become Pods and PVCs (with a
//!   data directory per PVC under `state_dir/pv/<ns>/<pvc>`), garbage
//!   collection by owner, namespace finalization.
//! - [`etcd_member`]: the "kubelet" for the pods of every `etcd` StatefulSet of
//!   a hosted control plane: their init containers, then one REAL etcd
//!   process per pod.
//! - [`etcd_init`]: HyperShift's `etcd-init` init container (shipped or
//!   fixed, [`EtcdInit`]): how the operator renders it, what it does in a
//!   pod, and the `EtcdSnapshotRestored` condition.
//! - [`bump`]: the emulated `--bump-revision --mark-compacted` of etcd 3.5's
//!   tools, computed once per snapshot and bump for the members of a restore.
//! - [`scheduling`]: the virtual node's labels and taints, and whether a
//!   pod fits it (the scheduler's part in the emulated mode).
//! - [`hypershift`]: HostedCluster / NodePool reconciler (namespace, secrets,
//!   HostedControlPlane, etcd PKI, services, StatefulSet, Deployments, Routes,
//!   Cluster API and platform objects, conditions).
//! - [`hosted_api`]: the hosted cluster's own API server (an emulator on the
//!   etcd members) while kube-apiserver pods run and etcd has quorum.
//! - [`external_dns`]: Route53 records for the Routes of hosted control planes.
//! - [`agent`]: the Agent platform's metal3, assisted-service (with BMAC)
//!   and Cluster API agent provider, where their CRDs are served.
//! - [`cloud`]: the ledgers of what a real provider would have destroyed.
//! - [`oidc`]: the OIDC issuer documents of AWS hosted clusters in the
//!   operator's OIDC bucket, and their service-account signing keys.
//! - [`snapshots`]: the CSI driver of the sandbox's StorageClass and the
//!   snapshot controller (VolumeSnapshots cut as copies of a claim's data).
//! - [`jobs`]: the Job controller (one pod at a time).
//! - [`restore_pod`]: the "kubelet" for hcp-dr's etcd restore pods.
//! - [`volume_mover`]: the "kubelet" for hcp-dr's volume-mover pods, run as
//!   local processes of the real hcp-dr binary.
//! - [`kubelet`]: on a cluster whose own kube-controller-manager runs
//!   ([`Controllers::Cluster`]), the sandbox's Node, its Lease and the
//!   admission of the pods scheduled to it; the controllers above then only
//!   run the pods on that Node and provision volumes, and leave Deployments,
//!   StatefulSets, Jobs, garbage collection and PVC protection to the
//!   cluster.

pub mod agent;
pub mod bump;
pub mod cloud;
pub mod etcd_init;
pub mod etcd_member;
pub mod external_dns;
pub mod hosted_api;
pub mod hypershift;
pub mod jobs;
pub mod kubelet;
pub mod kubevirt;
pub mod oidc;
pub mod publishing;
pub(crate) mod objects;
pub mod restore_pod;
pub mod scheduling;
pub mod snapshots;
pub mod volume_mover;
pub mod workloads;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinHandle;

use crate::pki::Ca;

pub use oidc::OidcConfig;

/// The Route53 zone external-dns writes into.
#[derive(Debug, Clone)]
pub struct Route53Config {
    /// Endpoint override, e.g. the sandbox's moto server `http://127.0.0.1:PORT`.
    pub endpoint_url: String,
    /// Hosted zone id (without the `/hostedzone/` prefix).
    pub zone_id: String,
    /// AWS region to sign with.
    pub region: String,
    /// The zone's domain: external-dns's domain filter.
    pub domain: String,
}

/// Who runs the controller-manager's controllers on a management cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Controllers {
    /// The sandbox: the emulator, or a cluster without a
    /// kube-controller-manager. Deployments, StatefulSets and Jobs become
    /// pods here, claims are bound here, and every pod runs on the virtual
    /// node (no Node object, no scheduler).
    #[default]
    Sandbox,
    /// The cluster's own kube-controller-manager and scheduler: the sandbox
    /// registers a Node (tainted, see [`kubelet`]) and is the kubelet of
    /// the pods scheduled to it, and the provisioner of its StorageClasses
    /// (PersistentVolume objects, bound by the cluster's binder).
    Cluster,
}

impl Controllers {
    pub fn as_str(self) -> &'static str {
        match self {
            Controllers::Sandbox => "sandbox",
            Controllers::Cluster => "cluster",
        }
    }
}

/// Which `etcd-init` init container the simulated HyperShift operator
/// renders, and so how a restore through `restoreSnapshotURL` turns out
/// (see [`etcd_init`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EtcdInit {
    /// As HyperShift ships it: after `reset-member`, `snapshot restore`
    /// without member flags. A HighlyAvailable restore through the URL
    /// becomes three single-member clusters (split brain).
    #[default]
    Shipped,
    /// openshift/hypershift PR 9048 (OCPBUGS-99534): before `reset-member`,
    /// restoring each member with `--name`, `--initial-cluster`, the token,
    /// its peer URL and a revision bump: one cluster.
    Fixed,
}

impl EtcdInit {
    pub fn as_str(self) -> &'static str {
        match self {
            EtcdInit::Shipped => "shipped",
            EtcdInit::Fixed => "fixed",
        }
    }
}

impl std::str::FromStr for EtcdInit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "shipped" => Ok(EtcdInit::Shipped),
            "fixed" => Ok(EtcdInit::Fixed),
            other => Err(format!("etcd-init mode {other:?}: expected shipped or fixed")),
        }
    }
}

impl std::fmt::Display for EtcdInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything the operator needs.
#[derive(Clone)]
pub struct OperatorConfig {
    /// Admin client of the management cluster.
    pub kubeconfig_client: kube::Client,
    /// The management cluster's name (`mgmt-a`); external-dns owner id.
    pub cluster_name: String,
    /// PV data directories, etcd logs and member TLS files.
    pub state_dir: PathBuf,
    /// The sandbox CA: serves the hosted API servers (so their kubeconfigs stay
    /// valid across management clusters of one sandbox) and is trusted for
    /// snapshot downloads. Per-HCP etcd CAs are generated separately and kept
    /// in the Secret `etcd-signer` of the HCP namespace, as HyperShift does.
    pub ca: Ca,
    /// Shared by the management clusters of one sandbox; seeds the stable
    /// hosted API addresses and tokens.
    pub sandbox_id: String,
    /// Where external-dns writes; `None` disables external-dns.
    pub route53: Option<Route53Config>,
    /// Extra CA trusted when downloading `restoreSnapshotURL`.
    pub snapshot_ca_pem: Option<String>,
    /// The simulated cloud shared by the sandbox's management clusters
    /// (the ledgers of terminated worker instances and deprovisioned
    /// bare-metal hosts, [`cloud`]); `None`: not recorded.
    pub cloud_dir: Option<PathBuf>,
    /// The OIDC S3 bucket of this HyperShift install
    /// (`--oidc-storage-provider-s3-bucket-name`), where the issuer documents
    /// of AWS hosted clusters go ([`oidc`]); `None`: none are published.
    pub oidc: Option<OidcConfig>,
    /// Whether the cluster's own controller-manager runs ([`Controllers`]).
    pub controllers: Controllers,
    /// The `etcd-init` the HyperShift operator renders ([`EtcdInit`]).
    pub etcd_init: EtcdInit,
}

impl std::fmt::Debug for OperatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorConfig")
            .field("cluster_name", &self.cluster_name)
            .field("state_dir", &self.state_dir)
            .field("sandbox_id", &self.sandbox_id)
            .field("route53", &self.route53)
            .field("oidc", &self.oidc)
            .field("controllers", &self.controllers)
            .field("etcd_init", &self.etcd_init)
            .finish_non_exhaustive()
    }
}

/// Why an operator step failed. Controllers log these and retry.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// A request to an API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done (`creating Pod ns/name`).
        action: String,
        /// The client error (boxed: it is large).
        #[source]
        source: Box<kube::Error>,
    },
    /// An object did not have the shape this operator needs.
    #[error("invalid {what}")]
    Invalid {
        /// What was wrong.
        what: String,
    },
    /// Issuing or loading certificates failed.
    #[error("pki: {0}")]
    Pki(#[source] Box<crate::pki::PkiError>),
    /// Starting, stopping or restoring a process failed.
    #[error("process: {0}")]
    Proc(#[source] Box<crate::procs::ProcError>),
    /// A local file operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The operation (`writing`, `removing`).
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An etcd request (member list/add/remove, status) failed.
    #[error("etcd {action}: {source}")]
    Etcd {
        /// The request.
        action: String,
        /// The cause.
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// Downloading `restoreSnapshotURL` failed or is not possible.
    #[error("snapshot {url}: {reason}")]
    Snapshot {
        /// The URL (query string removed: it holds a signature).
        url: String,
        /// Why.
        reason: String,
    },
    /// The hosted API server could not start.
    #[error("hosted API server: {0}")]
    ApiServer(#[source] Box<crate::apiserver::ApiServerError>),
    /// A Route53 call failed.
    #[error("route53 {action}: {message}")]
    Route53 {
        /// The call.
        action: String,
        /// The SDK's error, rendered.
        message: String,
    },
    /// An S3 call to the OIDC bucket failed.
    #[error("s3 {action}: {message}")]
    S3 {
        /// The call and object (`PutObject bucket/key`).
        action: String,
        /// The SDK's error, rendered.
        message: String,
    },
    /// Something is not ready yet (a peer address, a secret): retried later.
    #[error("waiting: {0}")]
    Waiting(String),
}

impl From<crate::pki::PkiError> for OperatorError {
    fn from(e: crate::pki::PkiError) -> Self {
        OperatorError::Pki(Box::new(e))
    }
}

impl From<crate::procs::ProcError> for OperatorError {
    fn from(e: crate::procs::ProcError) -> Self {
        OperatorError::Proc(Box::new(e))
    }
}

impl From<crate::apiserver::ApiServerError> for OperatorError {
    fn from(e: crate::apiserver::ApiServerError) -> Self {
        OperatorError::ApiServer(Box::new(e))
    }
}

pub(crate) fn io_err(
    op: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> OperatorError {
    let path = path.into();
    move |source| OperatorError::Io { op, path, source }
}

/// State shared by the controllers of one operator.
pub(crate) struct Ctx {
    pub kube: objects::Kube,
    pub cfg: OperatorConfig,
    /// etcd pod supervisors by pod uid.
    pub members: std::sync::Mutex<HashMap<String, etcd_member::MemberHandle>>,
    /// Running hosted API servers by `<hc-namespace>/<hc-name>`.
    pub hosted: tokio::sync::Mutex<HashMap<String, hosted_api::HostedApi>>,
    /// What the hosted API servers report (readable without awaiting).
    pub hosted_up: std::sync::Mutex<HashMap<String, hosted_api::HostedStatus>>,
    /// hcp-dr restore pods being run, by pod uid.
    pub restores: restore_pod::Running,
    /// hcp-dr volume-mover pods being run, by pod uid.
    pub movers: volume_mover::Running,
    /// Bumped snapshots shared by the members of one restore.
    pub bumps: bump::BumpCache,
    /// The client of the OIDC bucket, when there is one.
    pub oidc: Option<oidc::OidcStore>,
}

impl Ctx {
    /// Whether the cluster's own controller-manager runs.
    pub fn cluster_controllers(&self) -> bool {
        self.cfg.controllers == Controllers::Cluster
    }

    /// Whether this sandbox is the kubelet of `pod`: it is bound to the
    /// sandbox's node, or (no scheduler: [`Controllers::Sandbox`]) to none.
    /// Pods on the cluster's other nodes are their kubelets' business.
    pub fn runs_here(&self, pod: &Value) -> bool {
        match objects::str_at(pod, "/spec/nodeName").filter(|n| !n.is_empty()) {
            Some(node) => workloads::sandbox_nodes(self).iter().any(|(n, _)| n == node),
            None => !self.cluster_controllers(),
        }
    }

    /// `pods`, less those another kubelet runs ([`Ctx::runs_here`]).
    pub fn pods_here(&self, pods: Vec<Value>) -> Vec<Value> {
        pods.into_iter().filter(|p| self.runs_here(p)).collect()
    }

    pub fn hosted_api_up(&self, key: &str) -> bool {
        self.hosted_up
            .lock()
            .map(|m| m.get(key).is_some_and(|s| s.up))
            .unwrap_or(false)
    }
}

/// A running simulated operator (all its controllers).
pub struct Operator {
    ctx: Arc<Ctx>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("cluster", &self.ctx.cfg.cluster_name)
            .finish_non_exhaustive()
    }
}

/// Run `pass` every `period`, logging (de-duplicated) failures.
fn spawn_loop<F, Fut>(
    name: &'static str,
    period: Duration,
    ctx: Arc<Ctx>,
    pass: F,
) -> JoinHandle<()>
where
    F: Fn(Arc<Ctx>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), OperatorError>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut last_error = String::new();
        loop {
            match pass(ctx.clone()).await {
                Ok(()) => last_error.clear(),
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(controller = name, cluster = %ctx.cfg.cluster_name, "{text}");
                        last_error = text;
                    }
                }
            }
            tokio::time::sleep(period).await;
        }
    })
}

/// Log a per-object failure inside a pass without stopping the pass (each
/// distinct error once per object, so a retried failure does not flood).
pub(crate) fn log_failure(controller: &str, object: &str, err: &OperatorError) {
    static LAST: std::sync::OnceLock<std::sync::Mutex<HashMap<String, String>>> =
        std::sync::OnceLock::new();
    let text = err.to_string();
    let key = format!("{controller}/{object}");
    let fresh = LAST
        .get_or_init(Default::default)
        .lock()
        .map(|mut m| m.insert(key, text.clone()).as_deref() != Some(text.as_str()))
        .unwrap_or(true);
    if fresh {
        tracing::warn!(controller, object, "{text}");
    }
}

impl Operator {
    /// Start every controller. Returns once they are running (not once they
    /// have converged).
    pub async fn start(cfg: OperatorConfig) -> Result<Operator, OperatorError> {
        std::fs::create_dir_all(&cfg.state_dir).map_err(io_err("creating", &cfg.state_dir))?;
        let oidc = cfg.oidc.as_ref().map(oidc::OidcStore::new).transpose()?;
        let cfg_state_dir = cfg.state_dir.clone();
        let ctx = Arc::new(Ctx {
            kube: objects::Kube::new(cfg.kubeconfig_client.clone()),
            cfg,
            members: std::sync::Mutex::new(HashMap::new()),
            hosted: tokio::sync::Mutex::new(HashMap::new()),
            hosted_up: std::sync::Mutex::new(HashMap::new()),
            restores: std::sync::Mutex::new(HashMap::new()),
            movers: std::sync::Mutex::new(HashMap::new()),
            bumps: bump::BumpCache::new(&cfg_state_dir),
            oidc,
        });
        let mut tasks = vec![
            spawn_loop(
                "workloads",
                Duration::from_millis(400),
                ctx.clone(),
                workloads::sync,
            ),
            spawn_loop(
                "etcd-kubelet",
                Duration::from_millis(400),
                ctx.clone(),
                etcd_member::sync,
            ),
            spawn_loop(
                "hypershift",
                Duration::from_millis(500),
                ctx.clone(),
                hypershift::sync,
            ),
            spawn_loop(
                "hosted-api",
                Duration::from_millis(500),
                ctx.clone(),
                hosted_api::sync,
            ),
            spawn_loop("agent", Duration::from_millis(1000), ctx.clone(), agent::sync),
            spawn_loop(
                "snapshot-controller",
                Duration::from_millis(400),
                ctx.clone(),
                snapshots::sync,
            ),
            spawn_loop("kubevirt", Duration::from_millis(500), ctx.clone(), kubevirt::sync),
            spawn_loop(
                "volume-mover-kubelet",
                Duration::from_millis(300),
                ctx.clone(),
                volume_mover::sync,
            ),
        ];
        if ctx.cluster_controllers() {
            kubelet::register(&ctx).await?;
            tasks.push(spawn_loop("node-heartbeat", kubelet::HEARTBEAT, ctx.clone(), kubelet::heartbeat));
        } else {
            tasks.push(spawn_loop("job-controller", Duration::from_millis(400), ctx.clone(), jobs::sync));
        }
        if let Some(r53) = ctx.cfg.route53.clone() {
            let dns = Arc::new(external_dns::ExternalDns::new(&r53));
            tasks.push(spawn_loop(
                "external-dns",
                Duration::from_millis(1000),
                ctx.clone(),
                move |ctx| {
                    let dns = dns.clone();
                    async move { dns.sync(&ctx).await }
                },
            ));
        }
        Ok(Operator { ctx, tasks })
    }

    /// Stop every controller, then the hosted API servers, then kill the etcd
    /// members and the volume movers; on a cluster with its own controllers,
    /// remove the sandbox's Node (returned as `Node <name>` once removed).
    pub async fn shutdown(self) -> Option<String> {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        hosted_api::stop_all(&self.ctx).await;
        etcd_member::stop_all(&self.ctx).await;
        volume_mover::stop_all(&self.ctx).await;
        if self.ctx.cluster_controllers() {
            return kubelet::deregister(&self.ctx).await;
        }
        None
    }
}
