//! The restore stages (`playbooks/restore.yaml`): verify a backup, check the
//! destination, make a snapshot URL etcd can download, replay the objects in
//! order, and wait until the restored cluster serves.
//!
//! Restore stops on failure instead of undoing (`OnFailure::Stop`): a
//! half-finished restore is usually better continued (`--resume`) than thrown
//! away; `--abort` deletes what it created.

pub mod apply;
pub mod dns;
pub mod etcd_seed;
pub mod fence;
pub mod oidc;
pub mod order;
pub mod preflight;
pub mod snapshot_url;
pub mod verify;
pub mod volumes;
pub mod wait;

use std::time::Duration;

use kube::Client;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::archive::Layout;
use crate::pipeline::{Catalog, StageId};
use crate::stages::context::EtcdAccess;
use crate::store::Store;

/// The inputs of a restore (journaled on start; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreInputs {
    /// The store holding the backup, and the backup in it.
    pub store: String,
    pub namespace: String,
    pub hosted_cluster: String,
    pub backup_id: String,
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    #[serde(default)]
    pub ca_bundle: Option<std::path::PathBuf>,
    /// An S3 store a local backup's snapshot is copied to, for its URL.
    #[serde(default)]
    pub stage_snapshot_to: Option<String>,
    pub presign_ttl_seconds: u64,
    pub wait_timeout_seconds: u64,
    /// Delete leftover `data-etcd-*` PVCs instead of refusing.
    pub clean_leftovers: bool,
    /// Replace existing objects that differ instead of refusing.
    pub overwrite: bool,
    pub etcd_access: EtcdAccess,
    /// The cluster the backup is of, when it is restored under another
    /// name (`hcp-dr drill`); `None`: `namespace` and `hosted_cluster` are both.
    #[serde(default)]
    pub backup_of: Option<BackupOf>,
    /// The age identity file that decrypts an encrypted backup (the path,
    /// never the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<std::path::PathBuf>,
    /// The DNS zone of the cluster's hostnames, and whether to take the
    /// records over from the old management cluster's external-dns
    /// (`dns-takeover`). `None`: no zone known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsInputs>,
    /// The data-mover image for the guest volumes (`--mover-image`;
    /// default hcp-dr's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover_image: Option<String>,
    /// How the members get etcd's data (`--etcd-seed` and friends).
    #[serde(default)]
    pub etcd_seed: etcd_seed::EtcdSeedInputs,
    /// The point of the stream restored (`--at`), and the point-in-time
    /// backup made for it (`backup_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<crate::ops::point_in_time::Materialized>,
}

/// `--route53-zone`, `--take-over-dns`, `--dns-owner`, `--dns-wait`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsInputs {
    pub zone_id: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Delete the old owner's records and wait for the destination's.
    pub take_over: bool,
    /// The old owner named on the command line (else the backup's).
    #[serde(default)]
    pub owner: Option<String>,
    pub wait_seconds: u64,
}

/// The namespace and name a backup was taken of (its folder in the store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupOf {
    pub namespace: String,
    pub hosted_cluster: String,
}

impl RestoreInputs {
    /// Where the backup is in the store.
    pub fn layout(&self) -> Layout {
        match &self.backup_of {
            Some(of) => Layout::new(&of.namespace, &of.hosted_cluster, &self.backup_id),
            None => Layout::new(&self.namespace, &self.hosted_cluster, &self.backup_id),
        }
    }
    pub fn hcp_namespace(&self) -> String {
        crate::hosted::hcp_namespace(&self.namespace, &self.hosted_cluster)
    }
    pub fn wait_timeout(&self) -> Duration {
        Duration::from_secs(self.wait_timeout_seconds)
    }
    pub fn presign_ttl(&self) -> Duration {
        Duration::from_secs(self.presign_ttl_seconds)
    }
    pub fn hc_label(&self) -> String {
        format!("HostedCluster {}/{}", self.namespace, self.hosted_cluster)
    }
}

/// The context of one restore run.
pub struct RestoreContext {
    /// The destination management cluster.
    pub client: Client,
    pub store: Box<dyn Store>,
    /// Where a local backup's snapshot is staged for its URL (an S3 store).
    pub staging: Option<Box<dyn Store>>,
    pub inputs: RestoreInputs,
    /// The sanitized objects to replay; never journaled (they hold secrets).
    pub objects: Option<Vec<Value>>,
    /// The presigned snapshot URL; never journaled or printed (it grants
    /// read access to the snapshot until it expires).
    pub snapshot_url: Option<String>,
    /// What `preflight` found and what `snapshot-url` presigned (journaled;
    /// put back on resume).
    pub findings: Option<preflight::Findings>,
    pub url_record: Option<snapshot_url::UrlRecord>,
    pub warnings: Vec<String>,
    /// The identities that decrypt an encrypted backup (`--identity`);
    /// never journaled or printed.
    pub keys: Option<crate::archive::encryption::Identities>,
    /// The destination management cluster's identity (the store fence names it).
    pub management: Option<crate::archive::ManagementCluster>,
    /// The zone of `inputs.dns`.
    pub dns: Option<Box<dyn crate::dns::DnsZone>>,
    /// The guest volumes to re-create when not the manifest's own: a
    /// drill's, renamed with its objects by `rewrite`.
    pub guest_volumes: Option<Vec<crate::archive::GuestVolumeRecord>>,
    /// The snapshot `verify` checked, as etcd reads it (decrypted and
    /// decompressed), kept under TMPDIR when it is to be staged: `snapshot-url`
    /// uploads it instead of downloading and decoding it a second time.
    /// Never journaled; a resumed run stages from the store.
    pub checked_copy: Option<CheckedCopy>,
}

/// A checked snapshot copy (removed when dropped).
pub struct CheckedCopy {
    pub member: String,
    pub path: tempfile::TempPath,
}

impl RestoreContext {
    pub fn new(client: Client, store: Box<dyn Store>, staging: Option<Box<dyn Store>>, inputs: RestoreInputs) -> Self {
        RestoreContext {
            client,
            store,
            staging,
            inputs,
            objects: None,
            snapshot_url: None,
            findings: None,
            url_record: None,
            warnings: Vec::new(),
            keys: None,
            management: None,
            dns: None,
            guest_volumes: None,
            checked_copy: None,
        }
    }
}

/// Every restore stage, and what must come before what (the playbook rules).
pub fn restore_catalog() -> Catalog<RestoreContext> {
    use {apply::Apply, dns::DnsTakeover, etcd_seed::EtcdSeed, fence::WriteFence, oidc::OidcIssuer, preflight::Preflight, snapshot_url::SnapshotUrl, verify::Verify, volumes::VolumeRestore, wait::Wait};
    Catalog::new("restore")
        .with(Verify)
        .with(Preflight)
        .after(&[Verify::NAME])
        .with(SnapshotUrl)
        .after(&[Verify::NAME])
        .with(VolumeRestore)
        .after(&[Preflight::NAME])
        .with(EtcdSeed)
        .after(&[Preflight::NAME, SnapshotUrl::NAME])
        .with(Apply)
        .after(&[Preflight::NAME, SnapshotUrl::NAME, EtcdSeed::NAME])
        .with(Wait)
        .after(&[Apply::NAME])
        .with(WriteFence { by: "restore" })
        .after(&[Wait::NAME])
        .with(OidcIssuer)
        .after(&[Wait::NAME])
        .with(DnsTakeover)
}

/// A URL without its query string (a presigned URL's signature lives there).
pub fn redact_url(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?<signature redacted>"),
        None => url.to_string(),
    }
}
