//! The store fence: one small record per hosted cluster, beside its
//! backups, naming the management cluster that runs the cluster now.
//!
//! ```text
//! <namespace>/<hosted-cluster>/fence.json
//! ```
//!
//! A restore (or migrate) that brings a cluster up on another management
//! cluster than the one its backup was taken on writes it. From then on a
//! backup of that cluster taken anywhere else is refused: when the lost
//! management cluster comes back with its old copy, its scheduled backups
//! would otherwise write stale data that becomes `latest`. The record is
//! never deleted by hcp-dr; the next restore or migrate rewrites it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::ManagementCluster;
use crate::store::{Store, StoreError};

/// The fence's file name, in the cluster's folder.
pub const FENCE: &str = "fence.json";
/// The record format this code writes and reads.
pub const FENCE_VERSION: u32 = 1;

/// `fence.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub format_version: u32,
    pub namespace: String,
    pub hosted_cluster: String,
    /// The management cluster the hosted cluster runs on now.
    pub runs_on: ManagementCluster,
    /// The UID of the HostedCluster the restore created there.
    #[serde(default)]
    pub hosted_cluster_uid: Option<String>,
    /// The backup it was restored from, and where that backup was taken.
    pub backup_id: String,
    #[serde(default)]
    pub backup_taken_on: Option<ManagementCluster>,
    /// `restore` or `migrate`.
    pub by: String,
    pub at: DateTime<Utc>,
    pub tool_version: String,
}

/// Why the fence could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The record is there but is not a fence this version reads: callers
    /// treat that as a fence they cannot see through, never as no fence.
    #[error(
        "{url}: {key} is not a fence record this hcp-dr reads ({message}); fix or remove it by hand once you know which management cluster runs the cluster"
    )]
    Unreadable { url: String, key: String, message: String },
}

/// The fence's key for one hosted cluster.
pub fn key(namespace: &str, hosted_cluster: &str) -> String {
    format!("{namespace}/{hosted_cluster}/{FENCE}")
}

impl Fence {
    /// Parse a stored record; the version first.
    pub fn parse(bytes: &[u8]) -> Result<Fence, String> {
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let version: Version = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if version.format_version != FENCE_VERSION {
            return Err(format!(
                "format version {} (this hcp-dr reads version {FENCE_VERSION})",
                version.format_version
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    /// Whether a backup taken on `here` may be written: only on the
    /// management cluster the fence names.
    pub fn allows(&self, here: &ManagementCluster) -> bool {
        self.runs_on.same_cluster(here)
    }

    /// One line: where the cluster runs and since when.
    pub fn describe(&self) -> String {
        format!(
            "{}/{} runs on {} since {} ({} from backup {})",
            self.namespace,
            self.hosted_cluster,
            self.runs_on.describe(),
            self.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.by,
            self.backup_id
        )
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

/// The fence of a hosted cluster, `None` when the store holds none.
pub async fn read(store: &dyn Store, namespace: &str, hosted_cluster: &str) -> Result<Option<Fence>, FenceError> {
    let key = key(namespace, hosted_cluster);
    let Some(bytes) = crate::store::get_bytes(store, &key).await? else { return Ok(None) };
    Fence::parse(&bytes).map(Some).map_err(|message| FenceError::Unreadable {
        url: store.url(),
        key,
        message,
    })
}

/// Write (or replace) the fence of `fence.namespace/fence.hosted_cluster`.
pub async fn write(store: &dyn Store, fence: &Fence) -> Result<(), StoreError> {
    let key = key(&fence.namespace, &fence.hosted_cluster);
    store.put(&key, Box::new(&fence.to_json()[..])).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalStore;

    fn mgmt(server: &str, uid: Option<&str>) -> ManagementCluster {
        ManagementCluster {
            server: server.into(),
            kube_system_uid: uid.map(str::to_string),
        }
    }

    fn fence(runs_on: ManagementCluster) -> Fence {
        Fence {
            format_version: FENCE_VERSION,
            namespace: "clusters".into(),
            hosted_cluster: "demo".into(),
            runs_on,
            hosted_cluster_uid: Some("uid-b".into()),
            backup_id: "20261124T100000Z-0a1b2c".into(),
            backup_taken_on: Some(mgmt("https://a:6443", Some("ks-a"))),
            by: "restore".into(),
            at: "2026-11-24T10:30:00Z".parse().unwrap(),
            tool_version: "test".into(),
        }
    }

    #[test]
    fn a_fence_allows_only_the_cluster_it_names() {
        let f = fence(mgmt("https://b:6443", Some("ks-b")));
        assert!(f.allows(&mgmt("https://b:6443", Some("ks-b"))));
        // the same cluster reached at another URL: the UID decides
        assert!(f.allows(&mgmt("https://10.0.0.1:443", Some("ks-b"))));
        assert!(!f.allows(&mgmt("https://a:6443", Some("ks-a"))));
        // a returned cluster on the fenced cluster's old URL is still another cluster
        assert!(!f.allows(&mgmt("https://b:6443", Some("ks-a"))));
        // without a UID on one side, the server URL is all there is
        assert!(f.allows(&mgmt("https://b:6443/", None)));
        assert!(!f.allows(&mgmt("https://a:6443", None)));
        assert_eq!(
            f.describe(),
            "clusters/demo runs on https://b:6443 (kube-system namespace ks-b) since 2026-11-24T10:30:00Z (restore from backup 20261124T100000Z-0a1b2c)"
        );
    }

    #[test]
    fn records_round_trip_and_unknown_versions_are_refused() {
        let f = fence(mgmt("https://b:6443", None));
        assert_eq!(Fence::parse(&f.to_json()).unwrap(), f);
        let mut v: serde_json::Value = serde_json::from_slice(&f.to_json()).unwrap();
        v["format_version"] = 2.into();
        let err = Fence::parse(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(err.contains("format version 2"), "{err}");
        assert!(Fence::parse(b"{").is_err());
        assert!(Fence::parse(b"{\"format_version\":1}").is_err());
    }

    #[tokio::test]
    async fn the_store_holds_one_fence_per_cluster_beside_its_backups() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().to_path_buf());
        assert_eq!(read(&store, "clusters", "demo").await.unwrap(), None);
        let f = fence(mgmt("https://b:6443", Some("ks-b")));
        write(&store, &f).await.unwrap();
        assert!(dir.path().join("clusters/demo/fence.json").is_file());
        assert_eq!(read(&store, "clusters", "demo").await.unwrap(), Some(f));
        assert_eq!(read(&store, "clusters", "other").await.unwrap(), None);
        std::fs::write(dir.path().join("clusters/demo/fence.json"), b"not json").unwrap();
        let err = read(&store, "clusters", "demo").await.unwrap_err();
        assert!(matches!(err, FenceError::Unreadable { .. }), "{err}");
        assert!(err.to_string().contains("clusters/demo/fence.json"), "{err}");
    }
}
