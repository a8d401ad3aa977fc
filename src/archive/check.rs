//! Checking a stored backup before anything is done with it: the manifest's
//! format and shape, then every artifact streamed back from the store and
//! compared (size and SHA-256) with the manifest, `SHA256SUMS` agreeing with
//! the manifest, and the objects archive parsed. Nothing is trusted that has
//! not been re-read.

use serde::Serialize;
use serde_json::Value;
use tokio::io::AsyncReadExt;

use super::{ArchiveError, Layout, Manifest, OBJECTS, SHA256SUMS, objects, sha256sums};
use crate::store::{Hasher, Store, StoreError};

/// Why a stored backup cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// No manifest: the backup never completed (or is being written).
    #[error("{url}/{dir}: no manifest.json: the backup is incomplete (it never finished, or is still being written); choose a complete backup (hcp-dr backups list)")]
    NoManifest { url: String, dir: String },
    #[error("{url}/{dir}: {source}")]
    Manifest {
        url: String,
        dir: String,
        #[source]
        source: ArchiveError,
    },
    /// An artifact's bytes are not what the manifest recorded.
    #[error("{url}/{key}: {what}: the backup is damaged or was tampered with; use another backup")]
    Mismatch { url: String, key: String, what: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{url}/{key}: {source}")]
    Objects {
        url: String,
        key: String,
        #[source]
        source: ArchiveError,
    },
}

/// What a check found (nothing secret).
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub backup: String,
    pub artifacts_checked: usize,
    pub bytes_checked: u64,
    pub objects: usize,
}

/// Read and parse the manifest of one backup.
pub async fn read_manifest(store: &dyn Store, layout: &Layout) -> Result<Manifest, CheckError> {
    let mut body = match store.get(&layout.manifest()).await {
        Ok(body) => body,
        Err(StoreError::NotFound { .. }) => {
            return Err(CheckError::NoManifest {
                url: store.url(),
                dir: layout.dir(),
            });
        }
        Err(err) => return Err(err.into()),
    };
    let mut bytes = Vec::new();
    body.read_to_end(&mut bytes).await.map_err(|source| StoreError::Body {
        key: layout.manifest(),
        source,
    })?;
    Manifest::parse(&bytes).map_err(|source| CheckError::Manifest {
        url: store.url(),
        dir: layout.dir(),
        source,
    })
}

/// Stream `key` back, hashing it; `keep` collects the bytes too (small artifacts).
async fn rehash(store: &dyn Store, key: &str, mut keep: Option<&mut Vec<u8>>) -> Result<crate::store::PutReport, CheckError> {
    let mut body = store.get(key).await?;
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = body.read(&mut buf).await.map_err(|source| StoreError::Body {
            key: key.to_string(),
            source,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        if let Some(keep) = keep.as_deref_mut() {
            keep.extend_from_slice(&buf[..n]);
        }
    }
    Ok(hasher.finish())
}

/// Check every artifact of a backup against its manifest and parse the
/// objects; returns the manifest, the objects and what was checked.
pub async fn check_backup(store: &dyn Store, layout: &Layout) -> Result<(Manifest, Vec<Value>, CheckReport), CheckError> {
    let manifest = read_manifest(store, layout).await?;
    if manifest.backup_id != layout.backup_id
        || manifest.cluster.namespace != layout.namespace
        || manifest.cluster.name != layout.hosted_cluster
    {
        return Err(CheckError::Mismatch {
            url: store.url(),
            key: layout.manifest(),
            what: format!(
                "the manifest describes {}/{} backup {}, not the folder it is in",
                manifest.cluster.namespace, manifest.cluster.name, manifest.backup_id
            ),
        });
    }
    let mut report = CheckReport {
        backup: format!("{}/{}", store.url(), layout.dir()),
        artifacts_checked: 0,
        bytes_checked: 0,
        objects: 0,
    };
    let mut tarball = Vec::new();
    let mut sums = Vec::new();
    for artifact in &manifest.artifacts {
        let key = layout.artifact(&artifact.name);
        let keep = match artifact.name.as_str() {
            OBJECTS => Some(&mut tarball),
            SHA256SUMS => Some(&mut sums),
            _ => None,
        };
        let got = match rehash(store, &key, keep).await {
            Err(CheckError::Store(StoreError::NotFound { .. })) => {
                return Err(CheckError::Mismatch {
                    url: store.url(),
                    key,
                    what: "listed in the manifest but missing from the store".into(),
                });
            }
            other => other?,
        };
        if got.size != artifact.size || got.sha256 != artifact.sha256 {
            return Err(CheckError::Mismatch {
                url: store.url(),
                key,
                what: format!(
                    "{} bytes with SHA-256 {}, but the manifest records {} bytes with SHA-256 {}",
                    got.size, got.sha256, artifact.size, artifact.sha256
                ),
            });
        }
        report.artifacts_checked += 1;
        report.bytes_checked += got.size;
    }
    for member in &manifest.etcd {
        let listed = manifest.artifact(&member.artifact);
        if listed.is_none_or(|a| a.sha256 != member.sha256 || a.size != member.size) {
            return Err(CheckError::Mismatch {
                url: store.url(),
                key: layout.artifact(&member.artifact),
                what: format!("the manifest's etcd entry for {} disagrees with its artifact list", member.member),
            });
        }
    }
    if String::from_utf8_lossy(&sums) != sha256sums(&manifest.artifacts) {
        return Err(CheckError::Mismatch {
            url: store.url(),
            key: layout.sums(),
            what: "SHA256SUMS does not list the manifest's artifacts".into(),
        });
    }
    let objects: Vec<Value> = objects::read_tar_gz(&tarball[..])
        .map_err(|source| CheckError::Objects {
            url: store.url(),
            key: layout.objects(),
            source,
        })?
        .into_iter()
        .map(|(_, value)| value)
        .collect();
    report.objects = objects.len();
    Ok((manifest, objects, report))
}
