//! What the backup stages share: the management cluster, the hosted cluster
//! they work on, the store, and what earlier stages found or did.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Client;
use serde::{Deserialize, Serialize};

use crate::archive::Layout;
use crate::etcd::{ClientTls, SnapshotReport};
use crate::store::Store;

/// How hcp-dr reaches etcd members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum EtcdAccess {
    /// Pod IP when reachable from here, else port-forward through the API server.
    Auto,
    /// `https://<pod IP>:2379` (hcp-dr runs inside the management cluster).
    PodIp,
    /// `pods/portforward` through the API server.
    PortForward,
}

/// TLS files given on the command line instead of the HCP namespace's.
#[derive(Debug, Clone, Default)]
pub struct TlsOverride {
    pub ca_pem: Option<String>,
    pub cert_pem: Option<String>,
    pub key_pem: Option<String>,
}

/// `--operator-ack-timeout` when not given.
pub const DEFAULT_OPERATOR_ACK_SECONDS: u64 = 60;

/// The inputs of a backup (journaled on start, minus anything secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupInputs {
    pub hosted_cluster: String,
    pub namespace: String,
    pub store: String,
    /// S3 endpoint and CA bundle given at the start, so `--resume` reaches
    /// the same store without repeating them.
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    #[serde(default)]
    pub ca_bundle: Option<std::path::PathBuf>,
    pub pause_ttl_seconds: u64,
    pub etcd_access: EtcdAccess,
    /// Deployments scaled down besides the etcd writers (migrate adds
    /// `control-plane-operator`).
    pub extra_scale_down: Vec<String>,
    /// Upper bound for each wait (pods gone, pods back).
    pub wait_timeout_seconds: u64,
    /// How long the HyperShift operator is given to acknowledge the pause
    /// before hcp-dr pauses the HostedControlPlane and the CAPI Cluster
    /// itself (absent in older journals: 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_ack_timeout_seconds: Option<u64>,
    /// `--allow-no-quorum`: without quorum, snapshot the readable member
    /// with the highest revision instead of refusing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_no_quorum: bool,
    /// Who holds the lock (`user@host pid N`).
    pub holder: String,
    /// Set once when the run starts, so a resumed run writes the same backup.
    pub backup_id: String,
    pub started: DateTime<Utc>,
    /// age public keys (`age1…`) the snapshots and the objects archive are
    /// encrypted to; empty: not encrypted. Journaled, so a resumed run
    /// encrypts the same way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encrypt_to: Vec<String>,
    /// The zstd level the snapshots are compressed with (`--compression`);
    /// `None`: stored as etcd streams them (and in journals older than
    /// compression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress_level: Option<i32>,
    /// The Route53 zone of the cluster's hostnames (`--route53-zone`): the
    /// manifest records their records and external-dns owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route53_zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route53_endpoint: Option<String>,
    /// What a platform's cluster takes besides etcd and its objects.
    #[serde(default, flatten)]
    pub platform: PlatformSettings,
    /// `--copy-to`: stores every artifact is also written to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy_to: Vec<String>,
    /// `--copy-optional`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copy_optional: bool,
    /// `--lock-for`/`--lock-mode`: the S3 Object Lock retention every object
    /// of the backup is written with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<crate::store::object_lock::ObjectLock>,
}

/// What a backup (or migrate) takes of a platform's own data: a KubeVirt
/// cluster's guest volumes, an Agent cluster's free hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct PlatformSettings {
    /// KubeVirt: the VolumeSnapshotClass for the guest volumes' snapshots
    /// (default: the one default class of each volume's CSI driver).
    #[arg(long, value_parser = crate::cli::k8s_name)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class: Option<String>,
    /// KubeVirt: take the control plane without the guest volumes' data
    /// (when the CSI snapshots cannot be taken; the backup says so).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_guest_volumes: bool,
    /// KubeVirt: the image of the data-mover Jobs (it runs `hcp-dr
    /// volume-mover`) [default: quay.io/hcp-dr/hcp-dr:v<this version>].
    #[arg(long, env = "HCP_DR_MOVER_IMAGE", value_parser = crate::cli::image_ref)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover_image: Option<String>,
    /// Agent: also take the free Agents (bound to no cluster) of the
    /// InfraEnvs the cluster's hosts came from, with their BareMetalHosts,
    /// so a NodePool can scale up on the destination.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_free_agents: bool,
    /// KubeVirt: also copy the worker VMs' root disks (with their
    /// VirtualMachines), so the workers come back as they were instead of
    /// fresh from the NodePool's image. Crash-consistent: the VMs run while
    /// they are snapshotted.
    #[arg(long, conflicts_with = "skip_guest_volumes")]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_root_disks: bool,
}

impl BackupInputs {
    pub fn pause_ttl(&self) -> Duration {
        Duration::from_secs(self.pause_ttl_seconds)
    }
    /// How long the operator is given to acknowledge the pause (never
    /// longer than the wait timeout).
    pub fn operator_ack_timeout(&self) -> Duration {
        Duration::from_secs(self.operator_ack_timeout_seconds.unwrap_or(DEFAULT_OPERATOR_ACK_SECONDS).min(self.wait_timeout_seconds))
    }
    pub fn wait_timeout(&self) -> Duration {
        Duration::from_secs(self.wait_timeout_seconds)
    }
    pub fn layout(&self) -> Layout {
        Layout::new(&self.namespace, &self.hosted_cluster, &self.backup_id)
    }
}

/// One etcd member found by preflight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberTarget {
    pub pod: String,
    pub pod_ip: String,
    pub revision: i64,
}

/// What `pause` changed: each object's previous `spec.pausedUntil`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PauseRecord {
    pub until: String,
    /// `(kind, name, previous value)`; `None` when the field was absent.
    pub previous: Vec<(String, String, Option<String>)>,
    /// `Kind/name` to the UID of the object paused: the undo puts the value
    /// back on that object only, never on a same-named one made since.
    #[serde(default)]
    pub uids: std::collections::BTreeMap<String, String>,
    /// Set when the HyperShift operator did not acknowledge the pause in
    /// time and hcp-dr paused what it would have (absent in older journals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_stand_in: Option<OperatorStandIn>,
}

/// What hcp-dr paused itself, as the HyperShift operator would have, and
/// the values before (put back with the rest of the pause).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OperatorStandIn {
    /// How long the operator was given.
    pub waited_seconds: u64,
    /// The HostedControlPlane and its `spec.pausedUntil` before.
    pub hosted_control_plane: Option<(String, Option<String>)>,
    /// The Cluster API Cluster and its `spec.paused` before.
    pub capi_cluster: Option<(String, Option<bool>)>,
}

impl OperatorStandIn {
    /// One line for the report.
    pub fn describe(&self, hcp_ns: &str) -> String {
        let mut paused = Vec::new();
        if let Some((name, _)) = &self.hosted_control_plane {
            paused.push(format!("HostedControlPlane {hcp_ns}/{name} (spec.pausedUntil)"));
        }
        if let Some((name, _)) = &self.capi_cluster {
            paused.push(format!("Cluster {hcp_ns}/{name} (spec.paused)"));
        }
        format!(
            "the HyperShift operator did not acknowledge the pause within {}s (is it down?): hcp-dr paused {} itself, as the operator would have, and puts {} back with the rest of the pause",
            self.waited_seconds,
            if paused.is_empty() { "nothing more (neither exists)".to_string() } else { paused.join(" and ") },
            if paused.len() == 1 { "it" } else { "them" }
        )
    }
}

/// A Deployment `scale-down` scaled, and its replicas before.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScaledDeployment {
    pub name: String,
    pub replicas: i32,
    /// The Deployment's UID: scaling back names it as a precondition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// The context of one backup run.
pub struct BackupContext {
    pub client: Client,
    /// Shared with the snapshot streams that finish in the background.
    pub store: std::sync::Arc<dyn Store>,
    pub inputs: BackupInputs,
    pub tls_override: TlsOverride,
    /// Found by preflight (its output, [`super::preflight::Findings`],
    /// holds the rest: later stages read it with `step.needs`).
    pub node_pools: Vec<String>,
    pub members: Vec<MemberTarget>,
    /// Members preflight or the snapshot skipped, and whether etcd had quorum.
    pub etcd_health: crate::archive::EtcdHealth,
    pub etcd_tls: Option<EtcdTlsMaterial>,
    pub warnings: Vec<String>,
    /// Snapshot streams started by `etcd-snapshot` (content fixed), still
    /// being written to the store; `snapshot-finish` collects them.
    pub pending: Vec<PendingSnapshot>,
    /// The bytes of the pending streams, for the progress display (shown by
    /// `etcd-snapshot` and then `snapshot-finish`).
    pub streamed: crate::pipeline::Meter,
    /// With `--encrypt-to`: the store the encrypted artifacts are written
    /// through (see [`BackupContext::artifact_store`]).
    pub sealing: Option<std::sync::Arc<crate::archive::sealed::SealingStore>>,
    /// With `--compression zstd`: the store the snapshots are written
    /// through (see [`BackupContext::snapshot_store`]).
    pub compressing: Option<std::sync::Arc<crate::archive::compression::CompressingStore>>,
    /// The management cluster the backup runs on (from the client's
    /// binding): checked against the store fence, recorded in the manifest.
    pub management: Option<crate::archive::ManagementCluster>,
    /// The zone of `--route53-zone`, read by preflight.
    pub dns: Option<Box<dyn crate::dns::DnsZone>>,
    /// Found by preflight: where the backup is taken, what was published.
    pub origin: Option<crate::archive::Origin>,
    /// The management cluster's API groups, discovered by export the first
    /// time they are needed; the backups of one fleet run share them
    /// ([`ApiGroups`]), so discovery is not repeated per cluster.
    pub api_groups: ApiGroups,
}

/// The API groups of one management cluster, discovered once.
pub type ApiGroups = std::sync::Arc<tokio::sync::OnceCell<std::sync::Arc<kube::discovery::Discovery>>>;

/// A member's snapshot streaming into the store in the background.
pub struct PendingSnapshot {
    pub member: String,
    pub key: String,
    pub task: tokio::task::JoinHandle<Result<SnapshotReport, crate::etcd::EtcdError>>,
}

/// etcd client TLS from the HCP namespace (never journaled, never printed).
#[derive(Clone)]
pub struct EtcdTlsMaterial {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// Where each piece came from, for messages.
    pub source: String,
}

impl std::fmt::Debug for EtcdTlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTlsMaterial")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl EtcdTlsMaterial {
    /// Client TLS for one member (its certificate names it, not its IP).
    pub fn for_member(&self, member: &str, hcp_namespace: &str) -> ClientTls {
        ClientTls {
            ca_pem: self.ca_pem.clone(),
            cert_pem: self.cert_pem.clone(),
            key_pem: self.key_pem.clone(),
            server_name: crate::hosted::etcd_member_server_name(member, hcp_namespace),
        }
    }
}

impl BackupContext {
    pub fn new(client: Client, store: impl Into<std::sync::Arc<dyn Store>>, inputs: BackupInputs, tls_override: TlsOverride) -> Self {
        BackupContext {
            client,
            store: store.into(),
            inputs,
            tls_override,
            node_pools: Vec::new(),
            members: Vec::new(),
            etcd_health: Default::default(),
            etcd_tls: None,
            warnings: Vec::new(),
            pending: Vec::new(),
            streamed: crate::pipeline::Meter::new(),
            sealing: None,
            compressing: None,
            management: None,
            dns: None,
            origin: None,
            api_groups: ApiGroups::default(),
        }
    }

    /// Encrypt the snapshots and the objects archive to `recipients` (the
    /// manifest and SHA256SUMS stay readable).
    pub fn encrypt_to(&mut self, recipients: crate::archive::encryption::Recipients) {
        self.sealing = Some(std::sync::Arc::new(crate::archive::sealed::SealingStore::new(self.store.clone(), recipients)));
    }

    /// Compress the snapshots with zstd at `level` (before they are
    /// encrypted: call after [`BackupContext::encrypt_to`]).
    pub fn compress(&mut self, level: i32) {
        self.compressing = Some(std::sync::Arc::new(crate::archive::compression::CompressingStore::new(self.artifact_store(), level)));
    }

    /// Where the etcd snapshots are put: compressed, then encrypted, as the
    /// backup says.
    pub fn snapshot_store(&self) -> std::sync::Arc<dyn Store> {
        match &self.compressing {
            Some(compressing) => compressing.clone(),
            None => self.artifact_store(),
        }
    }

    /// Where snapshots and the objects archive are put: through the
    /// encrypting store when the backup is encrypted, else the store.
    pub fn artifact_store(&self) -> std::sync::Arc<dyn Store> {
        match &self.sealing {
            Some(sealing) => sealing.clone(),
            None => self.store.clone(),
        }
    }

    pub fn hcp_namespace(&self) -> String {
        crate::hosted::hcp_namespace(&self.inputs.namespace, &self.inputs.hosted_cluster)
    }

    /// The Deployments this backup scales down, in order.
    pub fn writers(&self) -> Vec<String> {
        crate::hosted::ETCD_WRITERS
            .iter()
            .map(|s| s.to_string())
            .chain(self.inputs.extra_scale_down.iter().cloned())
            .collect()
    }

    pub fn hc_label(&self) -> String {
        format!("HostedCluster {}/{}", self.inputs.namespace, self.inputs.hosted_cluster)
    }
}
