//! Checking a stored backup before anything is done with it: the manifest's
//! format and shape, then every artifact streamed back from the store and
//! compared (size and SHA-256) with the manifest, `SHA256SUMS` agreeing with
//! the manifest, and the objects archive parsed. Nothing is trusted that has
//! not been re-read.

use serde::Serialize;
use serde_json::Value;
use tokio::io::AsyncReadExt;

use super::compression;
use super::encryption::{EncryptionError, HashingReader, Identities};
use super::{ArchiveError, Layout, Manifest, MemberSnapshot, OBJECTS, SHA256SUMS, objects, sha256sums};
use crate::store::{Hasher, PutReport, Store, StoreError};

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
    /// The backup is encrypted and cannot be decrypted with what was given
    /// (no identity, or none of the recipients').
    #[error(transparent)]
    Encryption(#[from] EncryptionError),
    /// The local copy of the snapshot a restore uses could not be written.
    #[error("writing a scratch copy of {what} at {}: {source} ({})", path.display(), crate::space::SCRATCH_HINT)]
    Scratch {
        what: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    NoSpace(#[from] crate::space::NoSpace),
    /// A copy could not be read offline (not a verdict: a damaged
    /// snapshot is a report, not this).
    #[error("{0}")]
    Offline(String),
}

/// Where a checked artifact's bytes go besides the hash: small artifacts
/// into memory (the objects, SHA256SUMS), the snapshot a restore uses into
/// a scratch file (so it is downloaded once, checked and read offline from
/// the same copy).
enum Keep<'a> {
    Memory(&'a mut Vec<u8>),
    File { file: tokio::fs::File, path: &'a std::path::Path, written: u64 },
}

impl Keep<'_> {
    async fn write(&mut self, key: &str, bytes: &[u8]) -> Result<(), CheckError> {
        match self {
            Keep::Memory(keep) => keep.extend_from_slice(bytes),
            Keep::File { file, path, written } => {
                if let Err(source) = tokio::io::AsyncWriteExt::write_all(file, bytes).await {
                    return Err(spool_error(key, path, *written, source));
                }
                *written += bytes.len() as u64;
            }
        }
        Ok(())
    }

    async fn finish(self, key: &str) -> Result<(), CheckError> {
        if let Keep::File { mut file, path, written } = self {
            tokio::io::AsyncWriteExt::flush(&mut file).await.map_err(|source| spool_error(key, path, written, source))?;
        }
        Ok(())
    }
}

fn spool_error(key: &str, path: &std::path::Path, written: u64, source: std::io::Error) -> CheckError {
    match crate::space::scratch_filled_up(&source, path, key, written) {
        Some(full) => CheckError::NoSpace(full),
        None => CheckError::Scratch { what: key.to_string(), path: path.to_path_buf(), source },
    }
}

/// What a check found (nothing secret).
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub backup: String,
    pub artifacts_checked: usize,
    pub bytes_checked: u64,
    pub objects: usize,
    /// The recipients of an encrypted backup (empty: not encrypted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub encrypted_to: Vec<String>,
    /// Whether the encrypted artifacts were decrypted and their plaintext
    /// checked too (always true for a backup that is not encrypted).
    pub plaintext_checked: bool,
    /// Member snapshots found in the store with the recorded size but not
    /// read (a restore reads only the snapshot it restores; `backups
    /// verify` reads them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_read: Vec<String>,
}

/// A checked backup: its manifest, its objects (`None` when it is
/// encrypted and no identity was given) and what was checked.
#[derive(Debug, Clone)]
pub struct Checked {
    pub manifest: Manifest,
    pub objects: Option<Vec<Value>>,
    pub report: CheckReport,
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

/// The manifest at `key` of `store` (a backup folder opened as a store),
/// parsed; `None` when it is absent or unreadable. For messages only.
pub async fn read_manifest_at(store: &dyn Store, key: &str) -> Option<Manifest> {
    let mut body = store.get(key).await.ok()?;
    let mut bytes = Vec::new();
    body.read_to_end(&mut bytes).await.ok()?;
    Manifest::parse(&bytes).ok()
}

/// The newest regular backup of `namespace/hosted_cluster` in `store`
/// (complete: it has a manifest; not a point-in-time backup, which is made
/// from the stream) that `accept`s its id and manifest (`None`: the
/// manifest is there but unreadable), with that manifest. Manifests are
/// read newest first, only as far as needed.
pub async fn newest_regular(
    store: &dyn Store,
    namespace: &str,
    hosted_cluster: &str,
    accept: impl Fn(&str, Option<&Manifest>) -> bool,
) -> Result<Option<(String, Option<Manifest>)>, crate::store::StoreError> {
    use super::{Layout, MANIFEST};
    let prefix = Layout::cluster_prefix(namespace, hosted_cluster);
    let mut ids: Vec<String> = store
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|o| Layout::from_key(&o.key).filter(|_| o.key.ends_with(MANIFEST)))
        .map(|l| l.backup_id)
        .collect();
    ids.sort();
    for id in ids.into_iter().rev() {
        let manifest = read_manifest_at(store, &Layout::new(namespace, hosted_cluster, &id).manifest()).await;
        if manifest.as_ref().is_some_and(|m| m.point_in_time.is_some()) {
            continue;
        }
        if accept(&id, manifest.as_ref()) {
            return Ok(Some((id, manifest)));
        }
    }
    Ok(None)
}

/// The size and SHA-256 of what `key` holds in `store`, streamed back.
pub(crate) async fn hash_stored(store: &dyn Store, key: &str) -> Result<PutReport, CheckError> {
    rehash(store, key, None).await
}

/// Stream `key` back, hashing it; `keep` collects the bytes too.
async fn rehash(store: &dyn Store, key: &str, mut keep: Option<Keep<'_>>) -> Result<crate::store::PutReport, CheckError> {
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
        if let Some(keep) = keep.as_mut() {
            keep.write(key, &buf[..n]).await?;
        }
    }
    if let Some(keep) = keep {
        keep.finish(key).await?;
    }
    Ok(hasher.finish())
}

/// Stream an encrypted or compressed artifact back: hash what is stored
/// and, decrypting and decompressing on the way, what it decodes to;
/// `keep` collects the decoded bytes.
async fn rehash_decoded(
    store: &dyn Store,
    key: &str,
    manifest: &Manifest,
    name: &str,
    identities: Option<&Identities>,
    mut keep: Option<Keep<'_>>,
) -> Result<(PutReport, Result<PutReport, String>), CheckError> {
    let body = store.get(key).await?;
    let (hashing, stored) = HashingReader::new(body);
    let mut plain = compression::decoded(manifest, name, key, Box::new(hashing), identities).await?;
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; 1 << 20];
    // a read that fails is the backup's (it does not decode); a copy that
    // cannot be written is this machine's, and said as such
    let mut kept: Result<(), CheckError> = Ok(());
    let read: Result<(), String> = async {
        loop {
            let n = plain.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Ok(());
            }
            hasher.update(&buf[..n]);
            if let Some(keep) = keep.as_mut()
                && let Err(err) = keep.write(key, &buf[..n]).await
            {
                kept = Err(err);
                return Ok(());
            }
        }
    }
    .await;
    kept?;
    if let (Ok(()), Some(keep)) = (&read, keep) {
        keep.finish(key).await?;
    }
    drop(plain);
    let stored = std::mem::take(&mut *stored.lock().map_err(|_| StoreError::Body {
        key: key.to_string(),
        source: std::io::Error::other("hash state poisoned"),
    })?)
    .finish();
    Ok((stored, read.map(|()| hasher.finish())))
}

/// Check every artifact of a backup against its manifest and parse the
/// objects; returns the manifest, the objects and what was checked. An
/// encrypted backup needs an identity here ([`check_backup_with`] checks
/// its stored bytes without one).
pub async fn check_backup(store: &dyn Store, layout: &Layout) -> Result<(Manifest, Vec<Value>, CheckReport), CheckError> {
    let checked = check_backup_with(store, layout, None).await?;
    match checked.objects {
        Some(objects) => Ok((checked.manifest, objects, checked.report)),
        None => Err(EncryptionError::IdentityNeeded {
            what: format!("backup {}", checked.report.backup),
            recipients: checked.report.encrypted_to,
        }
        .into()),
    }
}

/// Check a backup as [`check_backup`] does. For an encrypted backup, the
/// stored (encrypted) bytes are always checked against the manifest and
/// `SHA256SUMS`; with `identities`, every encrypted artifact is also
/// decrypted while it streams and its plaintext checked against the
/// manifest's `encryption.artifacts`, and the objects are parsed from the
/// decrypted archive (in memory: it is never written out). A wrong identity
/// is refused before any artifact is read.
pub async fn check_backup_with(store: &dyn Store, layout: &Layout, identities: Option<&Identities>) -> Result<Checked, CheckError> {
    check(store, layout, identities, None).await
}

/// What reads member snapshots offline during a check, so each is
/// downloaded once: a snapshot it wants is written to a private scratch
/// file (under TMPDIR) as it is hashed (its plaintext, for an encrypted
/// backup read with an identity), handed to [`Inspect::inspect`] once its
/// hash matched the manifest, and removed.
#[async_trait::async_trait]
pub trait Inspect: Send {
    fn wants(&self, manifest: &Manifest, member: &MemberSnapshot) -> bool;
    /// Whether the member snapshots it does not want are left unread: each
    /// is then only found in one listing of the backup, with the recorded
    /// size (its content is not checked).
    fn skips_unwanted(&self) -> bool {
        false
    }
    async fn inspect(&mut self, member: &MemberSnapshot, copy: &std::path::Path) -> Result<(), CheckError>;
    /// The copy once [`Inspect::inspect`] accepted it, to keep beyond the
    /// check (it is removed when the `TempPath` is dropped; by default
    /// at once).
    fn keep(&mut self, _member: &MemberSnapshot, _copy: tempfile::TempPath) {}
}

/// As [`check_backup_with`], with the member snapshots `inspect` wants
/// read offline from the copy made while they were hashed, instead of
/// being downloaded again (none of an encrypted backup without an identity:
/// its plaintext cannot be had). Before anything is read, TMPDIR must have
/// room for the largest copy.
pub async fn check_backup_inspecting(store: &dyn Store, layout: &Layout, identities: Option<&Identities>, inspect: &mut dyn Inspect) -> Result<Checked, CheckError> {
    check(store, layout, identities, Some(inspect)).await
}

async fn check(store: &dyn Store, layout: &Layout, identities: Option<&Identities>, mut inspect: Option<&mut dyn Inspect>) -> Result<Checked, CheckError> {
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
    let backup = format!("{}/{}", store.url(), layout.dir());
    let recipients = manifest.recipients().to_vec();
    let decrypting = match (manifest.encryption.is_some(), identities) {
        (true, Some(ids)) => {
            ids.check(&format!("backup {backup}"), &recipients)?;
            Some(ids)
        }
        _ => None,
    };
    // room for the largest copy, refused before anything is read
    if let Some(inspect) = inspect.as_deref() {
        let largest = manifest
            .etcd
            .iter()
            .filter(|m| (!manifest.encrypted() || decrypting.is_some()) && inspect.wants(&manifest, m))
            .map(|m| (manifest.plaintext(&m.artifact).map_or(m.size, |p| p.size), &m.artifact))
            .max_by_key(|(size, _)| *size);
        if let Some((size, artifact)) = largest {
            crate::space::ensure_scratch(size, &format!("{}/{}", store.url(), layout.artifact(artifact)))?;
        }
    }
    let mut report = CheckReport {
        backup,
        artifacts_checked: 0,
        bytes_checked: 0,
        objects: 0,
        plaintext_checked: manifest.encryption.is_none() || decrypting.is_some(),
        encrypted_to: recipients.clone(),
        not_read: Vec::new(),
    };
    // the snapshots left unread are found in one listing
    let skips_unwanted = inspect.as_deref().is_some_and(|inspect| inspect.skips_unwanted());
    let listing = match skips_unwanted {
        true => Some(store.list(&format!("{}/", layout.dir())).await?),
        false => None,
    };
    let mut tarball = Vec::new();
    let mut sums = Vec::new();
    for artifact in &manifest.artifacts {
        let key = layout.artifact(&artifact.name);
        // a member snapshot to read offline: the stored bytes, or the
        // plaintext when they are decrypted on the way
        let member = manifest.etcd.iter().find(|m| m.artifact == artifact.name);
        if let (Some(member), Some(listing), Some(inspect)) = (member, &listing, inspect.as_deref())
            && !inspect.wants(&manifest, member)
        {
            let what = match listing.iter().find(|o| o.key == key) {
                None => "listed in the manifest but missing from the store".to_string(),
                Some(found) if found.size != artifact.size => {
                    format!("{} bytes in the store, but the manifest records {}", found.size, artifact.size)
                }
                Some(_) => {
                    report.not_read.push(artifact.name.clone());
                    continue;
                }
            };
            return Err(CheckError::Mismatch { url: store.url(), key, what });
        }
        let readable = manifest.plaintext(&artifact.name).is_none() || !manifest.encrypted() || decrypting.is_some();
        let copy = match (member, inspect.as_deref()) {
            (Some(member), Some(inspect)) if readable && inspect.wants(&manifest, member) => Some(
                tempfile::Builder::new()
                    .prefix("hcp-dr-check-")
                    .suffix(".db")
                    .tempfile()
                    .map_err(|source| CheckError::Scratch { what: key.clone(), path: std::env::temp_dir(), source })?
                    .into_parts(),
            ),
            _ => None,
        };
        let (copy_file, copy_path) = match copy {
            Some((file, path)) => (Some(tokio::fs::File::from_std(file)), Some(path)),
            None => (None, None),
        };
        let keep = match (artifact.name.as_str(), copy_file, copy_path.as_deref()) {
            (OBJECTS, _, _) => Some(Keep::Memory(&mut tarball)),
            (SHA256SUMS, _, _) => Some(Keep::Memory(&mut sums)),
            (_, Some(file), Some(path)) => Some(Keep::File { file, path, written: 0 }),
            _ => None,
        };
        let plaintext = manifest.plaintext(&artifact.name);
        let (keep, plain_keep) = if plaintext.is_some() { (None, keep) } else { (keep, None) };
        let rehashed = match plaintext {
            Some(want) if readable => match rehash_decoded(store, &key, &manifest, &artifact.name, decrypting, plain_keep).await {
                Ok((_, Err(e))) => {
                    let verb = match (manifest.encrypted(), manifest.raw(&artifact.name).is_some()) {
                        (true, true) => "decrypt and decompress",
                        (true, false) => "decrypt",
                        _ => "decompress",
                    };
                    return Err(CheckError::Mismatch {
                        url: store.url(),
                        key,
                        what: format!("does not {verb} ({e})"),
                    });
                }
                Ok((stored, Ok(got))) => {
                    // the stored bytes are compared below; the plaintext here
                    let stored_ok = stored.size == artifact.size && stored.sha256 == artifact.sha256;
                    if stored_ok && (got.size != want.size || got.sha256 != want.sha256) {
                        return Err(CheckError::Mismatch {
                            url: store.url(),
                            key,
                            what: format!(
                                "decodes to {} bytes with SHA-256 {}, but the manifest records {} bytes with SHA-256 {}",
                                got.size, got.sha256, want.size, want.sha256
                            ),
                        });
                    }
                    Ok(stored)
                }
                Err(err) => Err(err),
            },
            _ => rehash(store, &key, keep).await,
        };
        let got = match rehashed {
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
        if let (Some(member), Some(path), Some(inspect)) = (member, copy_path, inspect.as_deref_mut()) {
            inspect.inspect(member, &path).await?;
            inspect.keep(member, path);
        }
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
    if !report.plaintext_checked {
        return Ok(Checked {
            manifest,
            objects: None,
            report,
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
    Ok(Checked {
        manifest,
        objects: Some(objects),
        report,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::archive::encryption::Recipients;
    use crate::archive::{Artifact, ClusterIdentity, Encryption, MemberSnapshot, Timings};
    use crate::store::LocalStore;
    use crate::archive::sealed::SealingStore;

    fn key() -> (Identities, String) {
        let identity = age::x25519::Identity::generate();
        let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
        (Identities::parse(Path::new("test.key"), &secret).unwrap(), identity.to_public().to_string())
    }

    /// An encrypted backup in a local store, written as `package` writes it.
    async fn encrypted_backup(dir: &Path, recipient: &str) -> (Arc<dyn Store>, Layout) {
        backup_in(dir, Some(recipient), false).await
    }

    /// A backup in a local store, encrypted to `recipient` and its snapshot
    /// compressed as asked, written as `package` writes it.
    async fn backup_in(dir: &Path, recipient: Option<&str>, compressed: bool) -> (Arc<dyn Store>, Layout) {
        let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir));
        let sealed: Option<Arc<SealingStore>> = recipient.map(|r| Arc::new(SealingStore::new(store.clone(), Recipients::parse(&[r.to_string()]).unwrap().unwrap())));
        let artifact_store: Arc<dyn Store> = match &sealed {
            Some(sealed) => sealed.clone(),
            None => store.clone(),
        };
        let compressing = compression::CompressingStore::new(artifact_store.clone(), compression::DEFAULT_LEVEL);
        let layout = Layout::new("clusters", "demo", "20261121T180000Z-0a1b2c");
        let mut tarball = Vec::new();
        let objects = vec![json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-pull-secret", "namespace": "clusters"}, "data": {"k": "c2VjcmV0"}})];
        objects::write_tar_gz(&objects, &mut tarball).unwrap();
        let snapshot: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        let mut artifacts = Vec::new();
        let mut plain = Vec::new();
        let mut raw = Vec::new();
        for (name, bytes) in [("etcd/etcd-0.db", &snapshot), (OBJECTS, &tarball)] {
            let key = layout.artifact(name);
            let stored = match (name, compressed) {
                (OBJECTS, _) | (_, false) => artifact_store.put(&key, Box::new(&bytes[..])).await.unwrap(),
                _ => {
                    let stored = compressing.put(&key, Box::new(&bytes[..])).await.unwrap();
                    let r = compressing.raw(&key).unwrap();
                    raw.push(Artifact { name: name.into(), size: r.size, sha256: r.sha256 });
                    stored
                }
            };
            artifacts.push(Artifact { name: name.into(), size: stored.size, sha256: stored.sha256 });
            if let Some(p) = sealed.as_ref().and_then(|s| s.plaintext(&key)) {
                plain.push(Artifact { name: name.into(), size: p.size, sha256: p.sha256 });
            }
        }
        let sums = sha256sums(&artifacts);
        let put = store.put(&layout.sums(), Box::new(sums.as_bytes())).await.unwrap();
        artifacts.push(Artifact { name: SHA256SUMS.into(), size: put.size, sha256: put.sha256 });
        let manifest = Manifest {
            format_version: Manifest::version_for(recipient.is_some(), compressed),
            tool_version: "test".into(),
            backup_id: layout.backup_id.clone(),
            cluster: ClusterIdentity {
                namespace: "clusters".into(),
                name: "demo".into(),
                uid: "u".into(),
                cluster_id: None,
                infra_id: None,
                hcp_namespace: "clusters-demo".into(),
                platform: "None".into(),
                availability_policy: "SingleReplica".into(),
                release_image: "img".into(),
                encryption_key_secret: None,
                lineage: None,
                etcd_image: None,
            },
            etcd: vec![MemberSnapshot {
                member: "etcd-0".into(),
                artifact: "etcd/etcd-0.db".into(),
                revision: 7,
                size: artifacts[0].size,
                sha256: artifacts[0].sha256.clone(),
            }],
            artifacts,
            object_counts: Default::default(),
            timings: Timings::default(),
            encryption: recipient.map(|r| Encryption { scheme: "age".into(), recipients: vec![r.to_string()], artifacts: plain }),
            origin: None,
            etcd_health: Default::default(),
            agent_inventory: None,
            guest_volumes: None,
            compression: compressed.then(|| crate::archive::Compression { algorithm: "zstd".into(), level: compression::DEFAULT_LEVEL, artifacts: raw }),
            point_in_time: None,
        };
        store.put(&layout.manifest(), Box::new(&manifest.to_json()[..])).await.unwrap();
        (store, layout)
    }

    #[tokio::test]
    async fn encrypted_backups_check_stored_bytes_without_a_key_and_plaintext_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let (ids, recipient) = key();
        let (store, layout) = encrypted_backup(dir.path(), &recipient).await;

        let blind = check_backup_with(store.as_ref(), &layout, None).await.unwrap();
        assert!(!blind.report.plaintext_checked);
        assert!(blind.objects.is_none());
        assert_eq!(blind.report.encrypted_to, vec![recipient.clone()]);
        assert_eq!(blind.report.artifacts_checked, 3);
        let err = check_backup(store.as_ref(), &layout).await.unwrap_err().to_string();
        assert!(err.contains(&format!("is encrypted (age) to {recipient}: pass --identity")), "{err}");

        let full = check_backup_with(store.as_ref(), &layout, Some(&ids)).await.unwrap();
        assert!(full.report.plaintext_checked);
        let objects = full.objects.unwrap();
        assert_eq!(objects[0]["data"]["k"], "c2VjcmV0");

        let (wrong, _) = key();
        let err = check_backup_with(store.as_ref(), &layout, Some(&wrong)).await.unwrap_err().to_string();
        assert!(err.contains("none of the identities in test.key can decrypt backup"), "{err}");
    }

    /// Keeps what it was handed, to look at after the check.
    struct Keeper {
        kept: Vec<(String, Vec<u8>)>,
    }

    #[async_trait::async_trait]
    impl Inspect for Keeper {
        fn wants(&self, _manifest: &Manifest, _member: &MemberSnapshot) -> bool {
            true
        }
        async fn inspect(&mut self, member: &MemberSnapshot, copy: &Path) -> Result<(), CheckError> {
            self.kept.push((member.member.clone(), std::fs::read(copy).unwrap()));
            Ok(())
        }
    }

    /// A member snapshot is copied as it is checked (its plaintext when
    /// decrypted), handed over once its hash matched, and removed: it is
    /// read from the store once.
    #[tokio::test]
    async fn member_snapshots_are_handed_over_from_the_copy_made_while_checking() {
        let dir = tempfile::tempdir().unwrap();
        let (ids, recipient) = key();
        let (store, layout) = encrypted_backup(dir.path(), &recipient).await;
        let mut keeper = Keeper { kept: Vec::new() };
        check_backup_inspecting(store.as_ref(), &layout, Some(&ids), &mut keeper).await.unwrap();
        let snapshot: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        assert_eq!(keeper.kept.len(), 1);
        assert!(keeper.kept[0].0 == "etcd-0" && keeper.kept[0].1 == snapshot, "not the snapshot's plaintext");
        // without a key the plaintext cannot be had: nothing is handed over
        let mut blind = Keeper { kept: Vec::new() };
        check_backup_inspecting(store.as_ref(), &layout, None, &mut blind).await.unwrap();
        assert!(blind.kept.is_empty());
        // a damaged snapshot is refused before it is handed over
        let path = dir.path().join(layout.artifact("etcd/etcd-0.db"));
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let mut damaged = Keeper { kept: Vec::new() };
        assert!(check_backup_inspecting(store.as_ref(), &layout, Some(&ids), &mut damaged).await.is_err());
        assert!(damaged.kept.is_empty(), "a snapshot that failed its check was handed over");
    }

    /// Keeps the checked copy past the check, and notes where copies were.
    struct Holder {
        seen: Vec<std::path::PathBuf>,
        held: Option<tempfile::TempPath>,
        hold: bool,
    }

    #[async_trait::async_trait]
    impl Inspect for Holder {
        fn wants(&self, _manifest: &Manifest, _member: &MemberSnapshot) -> bool {
            true
        }
        async fn inspect(&mut self, _member: &MemberSnapshot, copy: &Path) -> Result<(), CheckError> {
            self.seen.push(copy.to_path_buf());
            Ok(())
        }
        fn keep(&mut self, _member: &MemberSnapshot, copy: tempfile::TempPath) {
            if self.hold {
                self.held = Some(copy);
            }
        }
    }

    /// A copy is removed once inspected unless the inspector keeps it
    /// (restore's verify keeps the one `snapshot-url` stages); a kept copy
    /// holds the checked plaintext and goes when it is dropped.
    #[tokio::test]
    async fn a_checked_copy_is_removed_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (ids, recipient) = key();
        let (store, layout) = encrypted_backup(dir.path(), &recipient).await;
        let mut passing = Holder { seen: Vec::new(), held: None, hold: false };
        check_backup_inspecting(store.as_ref(), &layout, Some(&ids), &mut passing).await.unwrap();
        assert_eq!(passing.seen.len(), 1);
        assert!(!passing.seen[0].exists(), "a copy nobody kept outlived the check");
        let mut holding = Holder { seen: Vec::new(), held: None, hold: true };
        check_backup_inspecting(store.as_ref(), &layout, Some(&ids), &mut holding).await.unwrap();
        let held = holding.held.take().expect("the copy was handed over to keep");
        let snapshot: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        assert_eq!(std::fs::read(&held).unwrap(), snapshot, "the kept copy is not the checked plaintext");
        let path = held.to_path_buf();
        drop(held);
        assert!(!path.exists(), "a dropped copy stayed on disk");
    }

    /// Wants no snapshot and leaves the unwanted ones unread.
    struct Skipper;

    #[async_trait::async_trait]
    impl Inspect for Skipper {
        fn wants(&self, _manifest: &Manifest, _member: &MemberSnapshot) -> bool {
            false
        }
        fn skips_unwanted(&self) -> bool {
            true
        }
        async fn inspect(&mut self, _member: &MemberSnapshot, _copy: &Path) -> Result<(), CheckError> {
            panic!("handed a snapshot it did not want")
        }
    }

    /// A snapshot left unread must still be in the store with its recorded
    /// size; its content is not read (a change of the same size passes).
    #[tokio::test]
    async fn unread_snapshots_are_found_with_their_size_and_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let (_, recipient) = key();
        let (store, layout) = encrypted_backup(dir.path(), &recipient).await;
        let path = dir.path().join(layout.artifact("etcd/etcd-0.db"));
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let checked = check_backup_inspecting(store.as_ref(), &layout, None, &mut Skipper).await.unwrap();
        assert_eq!(checked.report.not_read, vec!["etcd/etcd-0.db".to_string()]);
        assert_eq!(checked.report.artifacts_checked, 2, "objects and SHA256SUMS only");
        // the same bytes are refused by a check that reads them
        assert!(check_backup_with(store.as_ref(), &layout, None).await.is_err());

        std::fs::write(&path, &bytes[..at]).unwrap();
        let err = check_backup_inspecting(store.as_ref(), &layout, None, &mut Skipper).await.unwrap_err().to_string();
        assert!(err.contains(&format!("{at} bytes in the store, but the manifest records {}", bytes.len())), "{err}");
        std::fs::remove_file(&path).unwrap();
        let err = check_backup_inspecting(store.as_ref(), &layout, None, &mut Skipper).await.unwrap_err().to_string();
        assert!(err.contains("listed in the manifest but missing from the store"), "{err}");
    }

    /// A copy that cannot be written while an encrypted snapshot is
    /// decrypted is this machine's problem, said as such: not "the backup
    /// does not decrypt".
    #[tokio::test]
    async fn a_copy_that_cannot_be_written_is_not_called_a_damaged_backup() {
        let dir = tempfile::tempdir().unwrap();
        let (ids, recipient) = key();
        let (store, layout) = encrypted_backup(dir.path(), &recipient).await;
        let path = dir.path().join("read-only.db");
        std::fs::write(&path, b"").unwrap();
        // opened for reading only: every write fails
        let file = tokio::fs::File::open(&path).await.unwrap();
        let keep = Keep::File { file, path: &path, written: 0 };
        let manifest = read_manifest(store.as_ref(), &layout).await.unwrap();
        let err = rehash_decoded(store.as_ref(), &layout.artifact("etcd/etcd-0.db"), &manifest, "etcd/etcd-0.db", Some(&ids), Some(keep)).await.unwrap_err();
        assert!(matches!(err, CheckError::Scratch { .. }), "{err}");
        assert!(err.to_string().contains("read-only.db") && err.to_string().contains("set TMPDIR"), "{err}");
    }

    #[tokio::test]
    async fn tampered_or_mislabelled_ciphertext_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let (ids, recipient) = key();
        let (store, layout) = encrypted_backup(dir.path(), &recipient).await;
        let path = dir.path().join(layout.artifact("etcd/etcd-0.db"));
        let original = std::fs::read(&path).unwrap();

        // a flipped byte: the stored hash no longer matches, with or without the key
        let mut bytes = original.clone();
        let at = bytes.len() - 500;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        for ids in [None, Some(&ids)] {
            let err = check_backup_with(store.as_ref(), &layout, ids).await.unwrap_err().to_string();
            assert!(err.contains("damaged or was tampered with"), "{err}");
        }

        // ciphertext re-encrypted from other plaintext, hashes updated to match:
        // only the plaintext digest catches it
        std::fs::write(&path, &original).unwrap();
        let manifest = read_manifest(store.as_ref(), &layout).await.unwrap();
        let mut forged = manifest.clone();
        forged.encryption.as_mut().unwrap().artifacts[0].sha256 = "00".repeat(32);
        store.put(&layout.manifest(), Box::new(&forged.to_json()[..])).await.unwrap();
        check_backup_with(store.as_ref(), &layout, None).await.unwrap();
        let err = check_backup_with(store.as_ref(), &layout, Some(&ids)).await.unwrap_err().to_string();
        assert!(err.contains("decodes to 200000 bytes"), "{err}");
    }

    #[tokio::test]
    async fn compressed_backups_check_what_is_stored_and_what_it_decompresses_to() {
        let (ids, recipient) = key();
        for recipient in [None, Some(recipient.as_str())] {
            let dir = tempfile::tempdir().unwrap();
            let (store, layout) = backup_in(dir.path(), recipient, true).await;
            let manifest = read_manifest(store.as_ref(), &layout).await.unwrap();
            assert_eq!(manifest.format_version, crate::archive::COMPRESSED_FORMAT_VERSION);
            let stored = manifest.artifact("etcd/etcd-0.db").unwrap().size;
            assert!(stored < 200_000 / 4, "{stored} bytes stored of 200000");
            let checked = check_backup_with(store.as_ref(), &layout, Some(&ids)).await.unwrap();
            assert!(checked.report.plaintext_checked);
            assert_eq!(checked.objects.unwrap().len(), 1);

            // the snapshot kept for an offline look is the raw one
            struct Keeper(Option<Vec<u8>>);
            #[async_trait::async_trait]
            impl Inspect for Keeper {
                fn wants(&self, _: &Manifest, _: &MemberSnapshot) -> bool {
                    true
                }
                async fn inspect(&mut self, _: &MemberSnapshot, copy: &Path) -> Result<(), CheckError> {
                    self.0 = Some(std::fs::read(copy).unwrap());
                    Ok(())
                }
            }
            let mut keeper = Keeper(None);
            check_backup_inspecting(store.as_ref(), &layout, Some(&ids), &mut keeper).await.unwrap();
            let want: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
            assert!(keeper.0.unwrap() == want, "the copy is not the raw snapshot");
        }
    }

    #[tokio::test]
    async fn damaged_compressed_snapshots_are_refused_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let (store, layout) = backup_in(dir.path(), None, true).await;
        let path = dir.path().join(layout.artifact("etcd/etcd-0.db"));
        let original = std::fs::read(&path).unwrap();
        let manifest = read_manifest(store.as_ref(), &layout).await.unwrap();

        // truncated, then a flipped byte, with the stored digests forged to
        // match: decompression itself refuses them, naming the artifact
        for damaged in [original[..original.len() / 2].to_vec(), { let mut b = original.clone(); let at = b.len() / 2; b[at] ^= 0x10; b }] {
            std::fs::write(&path, &damaged).unwrap();
            let mut forged = manifest.clone();
            let digest = crate::store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&damaged));
            for a in forged.artifacts.iter_mut().filter(|a| a.name == "etcd/etcd-0.db") {
                (a.size, a.sha256) = (damaged.len() as u64, digest.clone());
            }
            forged.etcd[0].size = damaged.len() as u64;
            forged.etcd[0].sha256 = digest.clone();
            let sums = sha256sums(&forged.artifacts);
            let put = store.put(&layout.sums(), Box::new(sums.as_bytes())).await.unwrap();
            for a in forged.artifacts.iter_mut().filter(|a| a.name == SHA256SUMS) {
                (a.size, a.sha256) = (put.size, put.sha256.clone());
            }
            store.put(&layout.manifest(), Box::new(&forged.to_json()[..])).await.unwrap();
            let err = check_backup_with(store.as_ref(), &layout, None).await.unwrap_err().to_string();
            assert!(err.contains("etcd/etcd-0.db") && err.contains("does not decompress"), "{err}");
        }

        // a bomb: the manifest records a smaller raw size than the stream expands to
        std::fs::write(&path, &original).unwrap();
        let mut bomb = manifest.clone();
        bomb.compression.as_mut().unwrap().artifacts[0].size = 1000;
        store.put(&layout.manifest(), Box::new(&bomb.to_json()[..])).await.unwrap();
        let err = check_backup_with(store.as_ref(), &layout, None).await.unwrap_err().to_string();
        assert!(err.contains("etcd/etcd-0.db") && err.contains("decompresses past the 1000 bytes the manifest records"), "{err}");
    }
}
