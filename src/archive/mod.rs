//! The backup archive format, defined here and nowhere else.
//!
//! One backup is a folder of a store:
//!
//! ```text
//! <namespace>/<hosted-cluster>/<backup-id>/
//!     etcd/<member>.db         one snapshot per etcd member, as etcd streamed it
//!                              (zstd-compressed since format version 3)
//!     objects.tar.gz           the exported objects, one JSON document per object
//!     SHA256SUMS               `sha256sum -c` compatible list of every artifact
//!     manifest.json            written LAST: a backup without it is incomplete
//! ```
//!
//! `backup-id` is `YYYYMMDDTHHMMSSZ-xxxxxx` (UTC start time and a random
//! suffix), so ids sort by time. The manifest names every artifact with its
//! size and SHA-256 as stored, and for a compressed or encrypted artifact
//! the size and SHA-256 of what it decodes to; readers check
//! `format_version` before anything else.

pub mod check;
pub mod compression;
pub mod encryption;
pub mod fence;
pub mod objects;
pub mod retention;
pub mod results;
pub mod sanitize;
pub mod sealed;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The format this code writes; readers accept exactly the versions they know.
pub const FORMAT_VERSION: u32 = 1;
/// The format of a backup whose artifacts are encrypted client-side (version
/// 1 plus `encryption`): a reader that knows only version 1 refuses it
/// instead of taking ciphertext for a snapshot.
pub const ENCRYPTED_FORMAT_VERSION: u32 = 2;
/// The format of a backup whose etcd snapshots are compressed (version 1
/// or 2 plus `compression`; `encryption` as in version 2 when set): a
/// reader that knows only versions 1 and 2 refuses it instead of taking a
/// zstd stream for a snapshot.
pub const COMPRESSED_FORMAT_VERSION: u32 = 3;
/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";
/// The checksum list's file name.
pub const SHA256SUMS: &str = "SHA256SUMS";
/// The objects tarball's file name.
pub const OBJECTS: &str = "objects.tar.gz";

/// Why an archive or manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The manifest is not JSON of the manifest's shape.
    #[error("manifest: {0}")]
    ManifestParse(#[source] serde_json::Error),
    /// The manifest was written by a format this version cannot read.
    #[error("manifest: format version {found} is not supported (this hcp-dr reads versions {FORMAT_VERSION} to {COMPRESSED_FORMAT_VERSION}); use the hcp-dr release that wrote it")]
    UnknownFormat { found: u32 },
    /// The manifest does not name an artifact it must have.
    #[error("manifest: {0}")]
    Incomplete(String),
    /// A backup id that is not of the id format.
    #[error("backup id `{0}` is not of the form YYYYMMDDTHHMMSSZ-xxxxxx")]
    BadId(String),
    /// Building or reading the objects tarball failed.
    #[error("objects archive: {0}")]
    Objects(String),
}

/// Where each part of one backup lives in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub namespace: String,
    pub hosted_cluster: String,
    pub backup_id: String,
}

impl Layout {
    pub fn new(namespace: &str, hosted_cluster: &str, backup_id: &str) -> Layout {
        Layout {
            namespace: namespace.to_string(),
            hosted_cluster: hosted_cluster.to_string(),
            backup_id: backup_id.to_string(),
        }
    }

    /// The folder of all backups of one hosted cluster.
    pub fn cluster_prefix(namespace: &str, hosted_cluster: &str) -> String {
        format!("{namespace}/{hosted_cluster}/")
    }

    pub fn dir(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.hosted_cluster, self.backup_id)
    }

    pub fn manifest(&self) -> String {
        format!("{}/{MANIFEST}", self.dir())
    }

    pub fn sums(&self) -> String {
        format!("{}/{SHA256SUMS}", self.dir())
    }

    pub fn objects(&self) -> String {
        format!("{}/{OBJECTS}", self.dir())
    }

    /// Path of a member's snapshot relative to the backup folder.
    pub fn snapshot_name(member: &str) -> String {
        format!("etcd/{member}.db")
    }

    /// Full key of an artifact named relative to the backup folder.
    pub fn artifact(&self, name: &str) -> String {
        format!("{}/{name}", self.dir())
    }

    /// Parse `<ns>/<hc>/<id>/manifest.json` (or the folder) back into a layout.
    pub fn from_key(key: &str) -> Option<Layout> {
        let key = key.strip_suffix(MANIFEST).unwrap_or(key).trim_end_matches('/');
        let mut parts = key.split('/');
        let (ns, hc, id) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || parse_backup_id(id).is_err() {
            return None;
        }
        Some(Layout::new(ns, hc, id))
    }
}

/// A new backup id for a backup started at `at`.
pub fn new_backup_id(at: DateTime<Utc>) -> String {
    let suffix: String = uuid_suffix();
    format!("{}-{suffix}", at.format("%Y%m%dT%H%M%SZ"))
}

fn uuid_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:06x}", hasher.finish() & 0xff_ffff)
}

/// The start time encoded in a backup id.
pub fn parse_backup_id(id: &str) -> Result<DateTime<Utc>, ArchiveError> {
    let bad = || ArchiveError::BadId(id.to_string());
    let (stamp, suffix) = id.split_once('-').ok_or_else(bad)?;
    if suffix.len() != 6 || !suffix.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad());
    }
    chrono::NaiveDateTime::parse_from_str(stamp, "%Y%m%dT%H%M%SZ")
        .map(|t| t.and_utc())
        .map_err(|_| bad())
}

/// One file of a backup, relative to its folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

/// One etcd member's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSnapshot {
    /// Pod name, e.g. `etcd-0`.
    pub member: String,
    /// Artifact name, e.g. `etcd/etcd-0.db`.
    pub artifact: String,
    /// etcd revision when the snapshot was taken.
    pub revision: i64,
    pub size: u64,
    pub sha256: String,
}

/// An etcd member a backup did not snapshot, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedMember {
    pub member: String,
    pub reason: String,
}

impl SkippedMember {
    /// The warning a backup that skipped it reports.
    pub fn warning(&self) -> String {
        format!("etcd member {} is not in this backup: {}", self.member, self.reason)
    }
}

/// How whole the etcd a backup was taken from was. Empty (and absent from
/// the manifest) when every member was healthy and snapshotted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdHealth {
    /// Members down, lagging or unreadable, not snapshotted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedMember>,
    /// Taken with `--allow-no-quorum` from the one readable member with the
    /// highest revision: it may lack writes the lost majority acknowledged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_quorum: bool,
}

impl EtcdHealth {
    pub fn is_whole(&self) -> bool {
        self.skipped.is_empty() && !self.no_quorum
    }

    /// `no quorum (1 member)`, `2 of 3 members (etcd-1 skipped)`, or `None` when whole.
    pub fn describe(&self, taken: usize) -> Option<String> {
        let skipped = self.skipped.iter().map(|s| s.member.as_str()).collect::<Vec<_>>().join(", ");
        match (self.no_quorum, self.skipped.is_empty()) {
            (false, true) => None,
            (true, _) => Some(format!("taken WITHOUT QUORUM from {taken} member ({skipped} not taken)")),
            (false, false) => Some(format!("{taken} of {} members ({skipped} skipped)", taken + self.skipped.len())),
        }
    }
}

/// Which hosted cluster a backup is of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.clusterID` when set.
    pub cluster_id: Option<String>,
    /// `spec.infraID` when set.
    pub infra_id: Option<String>,
    pub hcp_namespace: String,
    pub platform: String,
    pub availability_policy: String,
    pub release_image: String,
    /// The secret holding the etcd encryption key (restores need it).
    pub encryption_key_secret: Option<String>,
    /// The UID of the HostedCluster this one descends from by restore or
    /// migrate (its [`LINEAGE`] annotation), `None` for an original. Older
    /// backups lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<String>,
    /// The image of the etcd StatefulSet's `etcd` container when the backup
    /// was taken (the release's etcd): what a restore seeds the members'
    /// volumes with. Older backups lack it (`--etcd-image` then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_image: Option<String>,
}

/// The annotation a restore or migrate puts on the HostedCluster it
/// creates: the UID of the original cluster it descends from (the same etcd
/// data and encryption key, under a new UID).
pub const LINEAGE: &str = "hcp-dr.openshift.io/lineage";

impl ClusterIdentity {
    /// The original cluster's UID: the lineage when this one was restored
    /// or migrated, else its own.
    pub fn lineage_root(&self) -> &str {
        self.lineage.as_deref().unwrap_or(&self.uid)
    }
}

/// The lineage root of a live HostedCluster: its [`LINEAGE`] annotation,
/// else its UID.
pub fn lineage_of(hc: &serde_json::Value) -> Option<&str> {
    hc.pointer("/metadata/annotations")
        .and_then(|a| a.get(LINEAGE))
        .and_then(serde_json::Value::as_str)
        .or_else(|| hc.pointer("/metadata/uid").and_then(serde_json::Value::as_str))
}

/// When each part of the backup ran (RFC 3339) and how long the API was down.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub started: Option<DateTime<Utc>>,
    pub finished: Option<DateTime<Utc>>,
    /// From the first writer scaled down to the last one back.
    pub api_downtime_seconds: Option<f64>,
    /// Seconds per stage.
    #[serde(default)]
    pub stages: BTreeMap<String, f64>,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub tool_version: String,
    pub backup_id: String,
    pub cluster: ClusterIdentity,
    pub etcd: Vec<MemberSnapshot>,
    /// Every artifact except the manifest itself (snapshots, objects, SHA256SUMS).
    pub artifacts: Vec<Artifact>,
    /// Objects exported, by kind.
    #[serde(default)]
    pub object_counts: BTreeMap<String, usize>,
    pub timings: Timings,
    /// Whether the artifacts are encrypted client-side, and for whom.
    #[serde(default)]
    pub encryption: Option<Encryption>,
    /// Where the backup was taken and what the cluster published there:
    /// what a restore needs when that management cluster is lost. Older
    /// backups lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Members skipped on a degraded etcd, and whether it had quorum.
    #[serde(default, skip_serializing_if = "EtcdHealth::is_whole")]
    pub etcd_health: EtcdHealth,
    /// On the Agent platform: the hosts and their objects taken with the
    /// cluster (the objects are in the objects archive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_inventory: Option<crate::hosted::agent::AgentInventory>,
    /// On KubeVirt: the guest volumes copied (each an artifact
    /// `volumes/<pvc>.tar`) and the root disks left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_volumes: Option<GuestVolumes>,
    /// How the etcd snapshots are compressed, with their raw digests
    /// (format version 3). Older backups lack it: stored as etcd streamed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// A backup made from a stream chain by a point-in-time restore
    /// (`restore --at`, `drill --at`): which point it holds and which
    /// regular backup its objects come from. Regular backups lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<PointInTime>,
}

/// What a point-in-time backup holds: etcd replayed from a stream chain to
/// one revision, with the management-cluster objects (and guest volumes)
/// of the newest regular backup taken at or before that revision's time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointInTime {
    /// What was asked (`revision 1234`, `time 2026-11-29T18:00:00.000Z`).
    pub asked: String,
    pub chain_id: String,
    /// The revision the snapshot holds.
    pub revision: i64,
    /// When the stream received that revision.
    pub received: DateTime<Utc>,
    /// The regular backup this backup takes the cluster's identity, origin
    /// and guest volumes from (and its objects, unless `object_set`).
    pub objects_from: String,
    /// The stream's object set (`stream/objects/<name>`) its objects
    /// archive is, when one newer than that backup was read at or before
    /// the point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_set: Option<String>,
    /// Revisions the stream held after this point when it was made: the
    /// writes a restore of it does not bring back.
    pub later_revisions: i64,
}

/// The etcd snapshots of a backup, compressed before they are stored (and
/// before they are encrypted, when the backup is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compression {
    /// `zstd` ([`compression::ALGORITHM`]).
    pub algorithm: String,
    pub level: i32,
    /// The compressed artifacts with the size and SHA-256 of their raw
    /// bytes (what etcd streamed, checked after decompression); `artifacts`
    /// above holds what is stored.
    pub artifacts: Vec<Artifact>,
}

/// A KubeVirt cluster's guest volumes in a backup.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestVolumes {
    pub volumes: Vec<GuestVolumeRecord>,
    /// Root-disk PVCs not copied (re-created from the NodePool's image).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub root_disks: Vec<String>,
}

/// One guest volume: the claim a restore re-creates (same name, class,
/// size, labels, and its DataVolume) and the artifact holding its files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestVolumeRecord {
    #[serde(flatten)]
    pub volume: crate::hosted::kubevirt::GuestVolume,
    /// The artifact's name (`volumes/<pvc>.tar`).
    pub artifact: String,
    /// Files, directories and links in it.
    pub files: u64,
}

/// A management cluster as a backup or a fence names it: its API server
/// URL and, when it could be read, the UID of its `kube-system` namespace
/// (stable for the life of a cluster, different for every cluster).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagementCluster {
    pub server: String,
    #[serde(default)]
    pub kube_system_uid: Option<String>,
}

impl ManagementCluster {
    /// Same kube-system UID when both are known, else same server URL.
    pub fn same_cluster(&self, other: &ManagementCluster) -> bool {
        match (&self.kube_system_uid, &other.kube_system_uid) {
            (Some(a), Some(b)) => a == b,
            _ => self.server.trim_end_matches('/') == other.server.trim_end_matches('/'),
        }
    }

    /// `https://host:6443 (kube-system namespace 1234-...)`.
    pub fn describe(&self) -> String {
        match &self.kube_system_uid {
            Some(uid) => format!("{} (kube-system namespace {uid})", self.server),
            None => self.server.clone(),
        }
    }
}

/// What a backup records of the place it was taken (manifest `origin`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The management cluster the backup was taken on.
    pub management_cluster: ManagementCluster,
    /// The hostnames the cluster published: the Route / LoadBalancer
    /// hostnames of the HostedCluster's `spec.services` and the hosts of
    /// the Routes in its HCP namespace. Sorted, lower case.
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// Their DNS records as the zone held them at backup time (with
    /// `--route53-zone`); `None` when no zone was given or it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsOrigin>,
}

/// The DNS records of a backup's hostnames at backup time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsOrigin {
    /// The Route53 hosted zone read.
    pub zone_id: String,
    /// The external-dns owner id (TXT registry) holding every address
    /// record of the hostnames; `None` when they had several owners or none.
    #[serde(default)]
    pub owner: Option<String>,
    /// The address and owner records found, each with its owner.
    #[serde(default)]
    pub records: Vec<OriginRecord>,
}

/// One record set of [`DnsOrigin`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginRecord {
    pub name: String,
    pub kind: String,
    #[serde(default)]
    pub values: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// Client-side encryption of artifacts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encryption {
    /// `age` ([`encryption::SCHEME`]).
    pub scheme: String,
    /// The public keys (`age1…`) the artifacts are encrypted to.
    pub recipients: Vec<String>,
    /// The encrypted artifacts with the size and SHA-256 of their
    /// plaintext (checked after decryption); `artifacts` above holds what is
    /// stored (the ciphertext).
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
}

impl Manifest {
    /// Parse and check the version first, then the shape.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ArchiveError> {
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let version: Version = serde_json::from_slice(bytes).map_err(ArchiveError::ManifestParse)?;
        if !(FORMAT_VERSION..=COMPRESSED_FORMAT_VERSION).contains(&version.format_version) {
            return Err(ArchiveError::UnknownFormat {
                found: version.format_version,
            });
        }
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(ArchiveError::ManifestParse)?;
        manifest.check()?;
        Ok(manifest)
    }

    /// What every complete manifest has.
    pub fn check(&self) -> Result<(), ArchiveError> {
        parse_backup_id(&self.backup_id)?;
        if self.etcd.is_empty() {
            return Err(ArchiveError::Incomplete("no etcd snapshot is listed".into()));
        }
        for name in self
            .etcd
            .iter()
            .map(|m| m.artifact.as_str())
            .chain([OBJECTS, SHA256SUMS])
            .chain(self.volume_artifacts())
        {
            if self.artifact(name).is_none() {
                return Err(ArchiveError::Incomplete(format!("artifact `{name}` is not listed")));
            }
        }
        let version = self.format_version;
        match (version, &self.compression, &self.encryption) {
            (FORMAT_VERSION, None, None) => Ok(()),
            (ENCRYPTED_FORMAT_VERSION, None, Some(encryption)) => self.check_encryption(encryption),
            (COMPRESSED_FORMAT_VERSION, Some(compression), encryption) => {
                self.check_compression(compression)?;
                encryption.as_ref().map_or(Ok(()), |e| self.check_encryption(e))
            }
            (COMPRESSED_FORMAT_VERSION, None, _) => Err(ArchiveError::Incomplete(format!(
                "format version {version} is for compressed backups, but `compression` is missing"
            ))),
            (_, Some(_), _) => Err(ArchiveError::Incomplete(format!(
                "`compression` is set in a format version {version} manifest (compressed backups are version {COMPRESSED_FORMAT_VERSION})"
            ))),
            (_, None, None) => Err(ArchiveError::Incomplete(format!(
                "format version {version} is for encrypted backups, but `encryption` is missing"
            ))),
            (_, None, Some(_)) => Err(ArchiveError::Incomplete(format!(
                "`encryption` is set in a format version {version} manifest (encrypted backups are version {ENCRYPTED_FORMAT_VERSION}, or {COMPRESSED_FORMAT_VERSION} when compressed)"
            ))),
        }
    }

    /// The etcd snapshots are compressed with zstd, each with its raw
    /// digest; nothing else is.
    fn check_compression(&self, compression: &Compression) -> Result<(), ArchiveError> {
        if compression.algorithm != compression::ALGORITHM {
            return Err(ArchiveError::Incomplete(format!(
                "the snapshots are compressed with `{}`, which this hcp-dr cannot decompress (it knows `{}`)",
                compression.algorithm,
                compression::ALGORITHM
            )));
        }
        let mut want: Vec<&str> = self.etcd.iter().map(|m| m.artifact.as_str()).collect();
        let mut have: Vec<&str> = compression.artifacts.iter().map(|a| a.name.as_str()).collect();
        want.sort();
        have.sort();
        if want != have {
            return Err(ArchiveError::Incomplete(format!(
                "`compression.artifacts` lists {have:?}; a compressed backup compresses exactly its snapshots {want:?}"
            )));
        }
        Ok(())
    }

    /// The snapshots, the objects archive and the guest volumes are encrypted, each with its
    /// plaintext digest; nothing else is.
    fn check_encryption(&self, encryption: &Encryption) -> Result<(), ArchiveError> {
        if encryption.scheme != encryption::SCHEME {
            return Err(ArchiveError::Incomplete(format!(
                "the artifacts are encrypted with `{}`, which this hcp-dr cannot decrypt (it knows `{}`)",
                encryption.scheme,
                encryption::SCHEME
            )));
        }
        if encryption.recipients.is_empty() {
            return Err(ArchiveError::Incomplete("`encryption` names no recipient".into()));
        }
        let mut want: Vec<&str> = self.etcd.iter().map(|m| m.artifact.as_str()).chain([OBJECTS]).chain(self.volume_artifacts()).collect();
        let mut have: Vec<&str> = encryption.artifacts.iter().map(|a| a.name.as_str()).collect();
        want.sort();
        have.sort();
        if want != have {
            return Err(ArchiveError::Incomplete(format!(
                "`encryption.artifacts` lists {have:?}; an encrypted backup encrypts exactly {want:?}"
            )));
        }
        Ok(())
    }

    /// The artifacts of the guest volumes.
    pub fn volume_artifacts(&self) -> impl Iterator<Item = &str> {
        self.guest_volumes.iter().flat_map(|g| g.volumes.iter().map(|v| v.artifact.as_str()))
    }

    pub fn artifact(&self, name: &str) -> Option<&Artifact> {
        self.artifacts.iter().find(|a| a.name == name)
    }

    /// The size and SHA-256 of an artifact as a reader uses it, once
    /// decrypted and decompressed (`None`: it is stored as it is). For a
    /// compressed snapshot the raw bytes etcd streamed; for an encrypted
    /// artifact that is not compressed, its plaintext.
    pub fn plaintext(&self, name: &str) -> Option<&Artifact> {
        self.raw(name)
            .or_else(|| self.encryption.as_ref()?.artifacts.iter().find(|a| a.name == name))
    }

    /// The raw digest of a compressed artifact (`None`: not compressed).
    pub fn raw(&self, name: &str) -> Option<&Artifact> {
        self.compression.as_ref()?.artifacts.iter().find(|a| a.name == name)
    }

    /// Whether the snapshot a restore uses is compressed (etcd's own
    /// download then needs a decompressed copy staged).
    pub fn best_is_compressed(&self) -> bool {
        self.best_snapshot().is_some_and(|best| self.raw(&best.artifact).is_some())
    }

    /// Whether the artifacts are encrypted (reading them needs an identity).
    pub fn encrypted(&self) -> bool {
        self.encryption.is_some()
    }

    /// The format version of a backup so encrypted and compressed.
    pub fn version_for(encrypted: bool, compressed: bool) -> u32 {
        match (compressed, encrypted) {
            (true, _) => COMPRESSED_FORMAT_VERSION,
            (false, true) => ENCRYPTED_FORMAT_VERSION,
            (false, false) => FORMAT_VERSION,
        }
    }

    /// The recipients of an encrypted backup (empty: not encrypted).
    pub fn recipients(&self) -> &[String] {
        self.encryption.as_ref().map(|e| e.recipients.as_slice()).unwrap_or_default()
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// The member snapshot a restore should use: the highest revision, then
    /// the lowest member name (members agree when writers were stopped).
    pub fn best_snapshot(&self) -> Option<&MemberSnapshot> {
        self.etcd
            .iter()
            .max_by(|a, b| a.revision.cmp(&b.revision).then(b.member.cmp(&a.member)))
    }
}

/// `SHA256SUMS` text for the given artifacts (`sha256sum -c` format).
pub fn sha256sums(artifacts: &[Artifact]) -> String {
    let mut lines: Vec<String> = artifacts
        .iter()
        .filter(|a| a.name != SHA256SUMS)
        .map(|a| format!("{}  {}\n", a.sha256, a.name))
        .collect();
    lines.sort();
    lines.concat()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A manifest of two members' snapshots, for tests.
    pub(crate) fn manifest() -> Manifest {
        let art = |name: &str| Artifact {
            name: name.into(),
            size: 1,
            sha256: "ab".repeat(32),
        };
        Manifest {
            format_version: FORMAT_VERSION,
            tool_version: "0.1.0".into(),
            backup_id: "20261121T180000Z-0a1b2c".into(),
            cluster: ClusterIdentity {
                namespace: "clusters".into(),
                name: "demo".into(),
                uid: "u".into(),
                cluster_id: None,
                infra_id: None,
                hcp_namespace: "clusters-demo".into(),
                platform: "None".into(),
                availability_policy: "HighlyAvailable".into(),
                release_image: "img".into(),
                encryption_key_secret: Some("demo-etcd-encryption-key".into()),
                lineage: None,
                etcd_image: None,
            },
            etcd: ["etcd-0", "etcd-1"]
                .iter()
                .map(|m| MemberSnapshot {
                    member: m.to_string(),
                    artifact: Layout::snapshot_name(m),
                    revision: 42,
                    size: 1,
                    sha256: "ab".repeat(32),
                })
                .collect(),
            artifacts: vec![art("etcd/etcd-0.db"), art("etcd/etcd-1.db"), art(OBJECTS), art(SHA256SUMS)],
            object_counts: BTreeMap::new(),
            timings: Timings::default(),
            encryption: None,
            origin: None,
            etcd_health: EtcdHealth::default(),
            agent_inventory: None,
            guest_volumes: None,
            compression: None,
            point_in_time: None,
        }
    }

    #[test]
    fn layout_keys() {
        let layout = Layout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        assert_eq!(layout.manifest(), "clusters/demo/20261121T180000Z-0a1b2c/manifest.json");
        assert_eq!(layout.artifact(&Layout::snapshot_name("etcd-1")), "clusters/demo/20261121T180000Z-0a1b2c/etcd/etcd-1.db");
        assert_eq!(Layout::from_key(&layout.manifest()), Some(layout.clone()));
        assert_eq!(Layout::from_key("clusters/demo/not-an-id/manifest.json"), None);
        assert_eq!(Layout::from_key("clusters/demo"), None);
    }

    #[test]
    fn backup_ids_sort_by_time_and_parse_back() {
        let at = DateTime::parse_from_rfc3339("2026-11-21T18:00:00Z").unwrap().with_timezone(&Utc);
        let id = new_backup_id(at);
        assert!(id.starts_with("20261121T180000Z-"), "{id}");
        assert_eq!(parse_backup_id(&id).unwrap(), at);
        assert!(parse_backup_id("20261121T180000Z").is_err());
        assert!(parse_backup_id("2026-11-21-abcdef").is_err());
    }

    #[test]
    fn manifest_round_trips_and_checks_version_first() {
        let m = manifest();
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
        let mut future = serde_json::to_value(&m).unwrap();
        future["format_version"] = 4.into();
        future["something_new"] = true.into();
        let err = Manifest::parse(&serde_json::to_vec(&future).unwrap()).unwrap_err();
        assert!(matches!(err, ArchiveError::UnknownFormat { found: 4 }), "{err}");
        assert!(Manifest::parse(b"{not json").is_err());
    }

    #[test]
    fn guest_volumes_must_be_listed_as_artifacts_and_encrypted_with_the_rest() {
        let mut m = manifest();
        let volume = crate::hosted::kubevirt::GuestVolume {
            name: "pvc-0a1b".into(),
            namespace: "clusters-demo".into(),
            storage_class: "csi".into(),
            driver: "csi.example.com".into(),
            size: "1Gi".into(),
            access_modes: vec!["ReadWriteOnce".into()],
            volume_mode: "Filesystem".into(),
            labels: BTreeMap::new(),
            data_volume: None,
            virtual_machine: None,
            snapshot_class: "csi-snapshots".into(),
        };
        m.guest_volumes = Some(GuestVolumes {
            volumes: vec![GuestVolumeRecord { volume, artifact: "volumes/pvc-0a1b.tar".into(), files: 3 }],
            root_disks: vec!["demo-worker-root".into()],
        });
        let err = Manifest::parse(&m.to_json()).unwrap_err();
        assert!(err.to_string().contains("volumes/pvc-0a1b.tar"), "{err}");
        m.artifacts.push(Artifact { name: "volumes/pvc-0a1b.tar".into(), size: 10240, sha256: "ef".repeat(32) });
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);

        let plain = |name: &str| Artifact { name: name.into(), size: 2, sha256: "cd".repeat(32) };
        m.format_version = ENCRYPTED_FORMAT_VERSION;
        m.encryption = Some(Encryption {
            scheme: encryption::SCHEME.into(),
            recipients: vec!["age1xyz".into()],
            artifacts: vec![plain("etcd/etcd-0.db"), plain("etcd/etcd-1.db"), plain(OBJECTS)],
        });
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("encrypts exactly"), "a volume without its plaintext digest");
        m.encryption.as_mut().unwrap().artifacts.push(plain("volumes/pvc-0a1b.tar"));
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
    }

    #[test]
    fn encrypted_manifests_are_version_2_and_list_every_plaintext_digest() {
        let plain = |name: &str| Artifact { name: name.into(), size: 2, sha256: "cd".repeat(32) };
        let mut m = manifest();
        m.format_version = ENCRYPTED_FORMAT_VERSION;
        m.encryption = Some(Encryption {
            scheme: encryption::SCHEME.into(),
            recipients: vec!["age1xyz".into()],
            artifacts: vec![plain("etcd/etcd-0.db"), plain("etcd/etcd-1.db"), plain(OBJECTS)],
        });
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
        assert_eq!(m.plaintext(OBJECTS).unwrap().sha256, "cd".repeat(32));
        assert!(m.plaintext(SHA256SUMS).is_none());
        assert_eq!(m.recipients(), ["age1xyz".to_string()]);

        let mut v1 = m.clone();
        v1.format_version = FORMAT_VERSION;
        assert!(Manifest::parse(&v1.to_json()).unwrap_err().to_string().contains("encrypted backups are version 2"));
        let mut v3 = m.clone();
        v3.format_version = COMPRESSED_FORMAT_VERSION;
        assert!(Manifest::parse(&v3.to_json()).unwrap_err().to_string().contains("`compression` is missing"));
        let mut missing = m.clone();
        missing.encryption.as_mut().unwrap().artifacts.pop();
        assert!(Manifest::parse(&missing.to_json()).unwrap_err().to_string().contains("encrypts exactly"));
        let mut other = m.clone();
        other.encryption.as_mut().unwrap().scheme = "gpg".into();
        assert!(Manifest::parse(&other.to_json()).unwrap_err().to_string().contains("cannot decrypt"));
        let mut unencrypted = manifest();
        unencrypted.format_version = ENCRYPTED_FORMAT_VERSION;
        assert!(Manifest::parse(&unencrypted.to_json()).unwrap_err().to_string().contains("`encryption` is missing"));
    }

    #[test]
    fn compressed_manifests_are_version_3_and_list_every_snapshots_raw_digest() {
        let raw = |name: &str| Artifact { name: name.into(), size: 100, sha256: "ef".repeat(32) };
        let mut m = manifest();
        m.format_version = COMPRESSED_FORMAT_VERSION;
        m.compression = Some(Compression {
            algorithm: compression::ALGORITHM.into(),
            level: 3,
            artifacts: vec![raw("etcd/etcd-0.db"), raw("etcd/etcd-1.db")],
        });
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
        assert_eq!(m.plaintext("etcd/etcd-0.db").unwrap().size, 100);
        assert!(m.plaintext(OBJECTS).is_none(), "the objects archive is gzip already");
        assert!(!m.encrypted());

        // compressed and encrypted: the raw digest wins, the encryption lists its plaintext (the zstd stream)
        let plain = |name: &str| Artifact { name: name.into(), size: 2, sha256: "cd".repeat(32) };
        let mut both = m.clone();
        both.encryption = Some(Encryption {
            scheme: encryption::SCHEME.into(),
            recipients: vec!["age1xyz".into()],
            artifacts: vec![plain("etcd/etcd-0.db"), plain("etcd/etcd-1.db"), plain(OBJECTS)],
        });
        assert_eq!(Manifest::parse(&both.to_json()).unwrap(), both);
        assert_eq!(both.plaintext("etcd/etcd-0.db").unwrap().size, 100);
        assert_eq!(both.plaintext(OBJECTS).unwrap().size, 2);

        let mut v1 = m.clone();
        v1.format_version = FORMAT_VERSION;
        assert!(Manifest::parse(&v1.to_json()).unwrap_err().to_string().contains("compressed backups are version 3"));
        let mut missing = m.clone();
        missing.compression.as_mut().unwrap().artifacts.pop();
        assert!(Manifest::parse(&missing.to_json()).unwrap_err().to_string().contains("compresses exactly"));
        let mut other = m.clone();
        other.compression.as_mut().unwrap().algorithm = "lz4".into();
        assert!(Manifest::parse(&other.to_json()).unwrap_err().to_string().contains("cannot decompress"));
        assert_eq!(Manifest::version_for(true, true), COMPRESSED_FORMAT_VERSION);
        assert_eq!(Manifest::version_for(true, false), ENCRYPTED_FORMAT_VERSION);
        assert_eq!(Manifest::version_for(false, false), FORMAT_VERSION);
    }

    #[test]
    fn incomplete_manifests_are_refused() {
        let mut m = manifest();
        m.artifacts.retain(|a| a.name != OBJECTS);
        assert!(Manifest::parse(&m.to_json()).unwrap_err().to_string().contains("objects.tar.gz"));
        let mut m = manifest();
        m.etcd.clear();
        assert!(Manifest::parse(&m.to_json()).is_err());
    }

    #[test]
    fn best_snapshot_prefers_revision_then_member_order() {
        let mut m = manifest();
        assert_eq!(m.best_snapshot().unwrap().member, "etcd-0");
        m.etcd[1].revision = 43;
        assert_eq!(m.best_snapshot().unwrap().member, "etcd-1");
    }

    #[test]
    fn sums_are_sha256sum_format() {
        let sums = sha256sums(&manifest().artifacts);
        assert_eq!(sums.lines().count(), 3);
        assert!(sums.lines().all(|l| l.len() > 66 && &l[64..66] == "  "));
        assert!(!sums.contains(SHA256SUMS));
    }
}
