//! Point-in-time restore (`restore --at`, `drill --at`): the cluster's
//! stream is replayed to the point asked (`stream::replay`: the chain's
//! base restored into a scratch etcd, each original revision applied as one
//! transaction), and the result is written into the store as a backup of
//! its own, beside the regular ones: the replayed snapshot, compressed
//! (and encrypted when the backup it takes its objects from is), with the
//! objects archive and guest volumes of the newest complete regular backup
//! taken at or before the point, and a manifest that records both
//! (`point_in_time`). The restore then runs on that backup like on any
//! other: verify, seeded volumes or URL, revision bump, the one-cluster
//! proof, and its journal names it, so `--resume` and `--abort` need no
//! replay.
//!
//! The management-cluster objects are the stream's newest object set read
//! at or before the point (`stream::objects`) when it is newer than that
//! backup; otherwise the backup's own (the report says which).

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::OpsError;
use crate::archive::compression::{CompressingStore, DEFAULT_LEVEL};
use crate::archive::encryption::{Identities, Recipients};
use crate::archive::sealed::SealingStore;
use crate::archive::{self, Artifact, Layout, Manifest, MemberSnapshot, PointInTime, SHA256SUMS, Timings};
use crate::store::{Store, StoreError};
use crate::stream::catalog;
use crate::stream::replay::Target;

/// `--at TIME` or `--at-revision R`, and the identity that opens an
/// encrypted stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AtPoint {
    pub target: Target,
    pub identity: Option<PathBuf>,
}

/// The point-in-time backup a restore runs on (journaled with its inputs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Materialized {
    /// The backup written (or, in a dry run, the regular backup whose
    /// objects a real run would take).
    pub backup_id: String,
    #[serde(flatten)]
    pub point: PointInTime,
    /// The revision of the newest durable event in the stream when the
    /// point was made.
    pub stream_through: i64,
    pub replay_seconds: f64,
    /// Nothing was replayed or written (`--dry-run`).
    pub dry_run: bool,
}

impl Materialized {
    /// One line for a report.
    pub fn describe(&self) -> String {
        let point = &self.point;
        if self.dry_run {
            return format!(
                "point in time: {} of the stream (dry run: not replayed; a real run restores etcd at that point with the objects of {}; the plan below is backup {}'s)",
                point.asked,
                match &point.object_set {
                    Some(set) => format!("the stream's object set {set}, the cluster's identity from backup {}", point.objects_from),
                    None => format!("backup {}", point.objects_from),
                },
                point.objects_from
            );
        }
        format!(
            "point in time: {} -> revision {} received {} (chain {}); {} later revision(s) in the stream are not restored; objects from {}",
            point.asked,
            point.revision,
            point.received.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            point.chain_id,
            point.later_revisions,
            match &point.object_set {
                Some(set) => format!("the stream's object set {set} (identity and volumes from backup {})", point.objects_from),
                None => format!("backup {}", point.objects_from),
            }
        )
    }
}

/// When a backup's state was taken: its manifest's start, else its id's time.
fn taken(manifest: &Manifest) -> Option<DateTime<Utc>> {
    manifest.timings.started.or_else(|| archive::parse_backup_id(&manifest.backup_id).ok())
}

/// The newest regular backup of the cluster taken at or before `at`.
async fn objects_backup(store: &dyn Store, at: DateTime<Utc>, namespace: &str, hosted_cluster: &str) -> Result<Manifest, OpsError> {
    let found = archive::check::newest_regular(store, namespace, hosted_cluster, |_, m| m.and_then(taken).is_some_and(|t| t <= at)).await?;
    found.and_then(|(_, manifest)| manifest).ok_or_else(|| {
        OpsError::Input(format!(
            "no complete backup of {namespace}/{hosted_cluster} in {} was taken at or before {}: a point-in-time restore takes the HostedCluster, NodePools and secrets from one (the stream records etcd only); take one with `hcp-dr backup`, or pick a later point (`hcp-dr backups list` shows both)",
            store.url(),
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ))
    })
}

/// Check, from listings and manifests only, that `at` can be restored
/// from `store`'s stream of `namespace/hosted_cluster`: it has chains, a
/// window that can hold the point, and (for a time) a regular backup taken
/// at or before it to take the objects from. A point refused here is
/// refused before anything is replayed, paused or written; the replay
/// still checks the rest (when the stream received its last record).
pub async fn check_point(store: &dyn Store, namespace: &str, hosted_cluster: &str, at: &AtPoint) -> Result<(), OpsError> {
    let (chains, _) = catalog::chains(store, namespace, hosted_cluster).await.map_err(super::stream::stream_error)?;
    check_chains(store, &chains, namespace, hosted_cluster, at).await
}

/// [`check_point`] on the chains already listed.
async fn check_chains(store: &dyn Store, chains: &[catalog::ChainListing], namespace: &str, hosted_cluster: &str, at: &AtPoint) -> Result<(), OpsError> {
    if chains.is_empty() {
        return Err(OpsError::Input(format!(
            "{namespace}/{hosted_cluster} has no stream chain in {}: --at and --at-revision restore from `hcp-dr stream`'s chains; without one, restore a backup (--backup-id)",
            store.url()
        )));
    }
    let windows = catalog::windows(chains);
    let refuse = |reason: String| {
        OpsError::Input(format!(
            "{} cannot be restored from the stream of {namespace}/{hosted_cluster} in {}: {reason}; the windows that can:\n{}",
            at.target,
            store.url(),
            catalog::describe_windows(&windows)
        ))
    };
    match at.target {
        Target::Revision(revision) if !windows.iter().any(|w| w.from <= revision && revision <= w.through) => {
            return Err(refuse("no chain holds it (a base at or before it and segments reaching it without a gap)".into()));
        }
        Target::Time(t) if t > Utc::now() => return Err(refuse("it is in the future".into())),
        Target::Time(t) if !windows.iter().any(|w| w.base_taken <= t) => return Err(refuse("no chain's base was taken at or before it".into())),
        Target::Time(t) => {
            objects_backup(store, t, namespace, hosted_cluster).await?;
        }
        _ => {}
    }
    Ok(())
}

/// Make the backup of `namespace/hosted_cluster` at `at` in `store`
/// (`--dry-run`: only check that there is a regular backup to take the
/// objects from, and name it). A point no chain covers is refused with the
/// windows that can be restored; a stream encrypted when the regular
/// backup is not is refused (the snapshot would be stored in the clear).
///
/// `precheck` is asked of the regular backup the objects come from (and,
/// before the replay, of the newest one), so a restore that would refuse
/// it refuses before anything is replayed or written.
pub async fn materialize(
    store: Arc<dyn Store>,
    namespace: &str,
    hosted_cluster: &str,
    at: &AtPoint,
    dry_run: bool,
    precheck: &(dyn Fn(&Manifest) -> Result<(), OpsError> + Sync),
) -> Result<Materialized, OpsError> {
    let clock = std::time::Instant::now();
    let identities = at.identity.as_deref().map(Identities::from_file).transpose().map_err(|e| OpsError::Input(e.to_string()))?;
    let (chains, _) = catalog::chains(store.as_ref(), namespace, hosted_cluster).await.map_err(super::stream::stream_error)?;
    check_chains(store.as_ref(), &chains, namespace, hosted_cluster, at).await?;
    let stream_through = catalog::windows(&chains).iter().map(|w| w.through).max().unwrap_or_default();
    let newest = archive::check::newest_regular(store.as_ref(), namespace, hosted_cluster, |_, m| m.is_some()).await?;
    if let Some((_, Some(newest))) = &newest {
        precheck(newest)?;
    }
    if dry_run {
        let at_time = match at.target {
            Target::Time(t) => t,
            _ => Utc::now(),
        };
        let objects = objects_backup(store.as_ref(), at_time, namespace, hosted_cluster).await?;
        let sets = crate::stream::objects::list(store.as_ref(), namespace, hosted_cluster).await.map_err(super::stream::stream_error)?;
        let set = crate::stream::objects::at(&sets, at_time).filter(|set| taken(&objects).is_none_or(|t| set.taken > t));
        return Ok(Materialized {
            backup_id: objects.backup_id.clone(),
            point: PointInTime {
                asked: at.target.to_string(),
                chain_id: String::new(),
                revision: 0,
                received: at_time,
                objects_from: objects.backup_id.clone(),
                object_set: set.map(|s| s.file_name()),
                later_revisions: 0,
            },
            stream_through,
            replay_seconds: 0.0,
            dry_run: true,
        });
    }
    let tools = crate::etcd::scratch::ScratchTools::find_for("a point-in-time restore replays one").map_err(OpsError::Input)?;
    let scratch = tempfile::Builder::new()
        .prefix("hcp-dr-point-")
        .tempdir()
        .map_err(|e| OpsError::Input(format!("a scratch folder for the replay (TMPDIR): {e}")))?;
    let out = scratch.path().join("point.db");
    let replayed = crate::stream::replay::replay(store.as_ref(), namespace, hosted_cluster, at.target, &out, identities.as_ref(), &tools)
        .await
        .map_err(super::stream::stream_error)?;
    let objects = objects_backup(store.as_ref(), replayed.received, namespace, hosted_cluster).await?;
    precheck(&objects)?;
    // the stream's objects, when it read them after that backup
    let sets = crate::stream::objects::list(store.as_ref(), namespace, hosted_cluster).await.map_err(super::stream::stream_error)?;
    let set = crate::stream::objects::at(&sets, replayed.received).filter(|set| taken(&objects).is_none_or(|t| set.taken > t));
    let stream_encrypted = chains
        .iter()
        .find(|c| c.layout.chain_id == replayed.chain_id)
        .and_then(|c| c.descriptor.as_ref().ok())
        .is_some_and(|d| d.encrypted())
        || set.is_some_and(|s| s.encrypted);
    if stream_encrypted && objects.encryption.is_none() {
        return Err(OpsError::Input(format!(
            "chain {} is encrypted but backup {} (whose objects a point-in-time backup takes) is not: the replayed snapshot would be stored in the clear; take an encrypted backup (`hcp-dr backup --encrypt-to`) and restore a later point",
            replayed.chain_id, objects.backup_id
        )));
    }
    let set_archive = match set {
        Some(set) => Some(crate::stream::objects::read(store.as_ref(), namespace, hosted_cluster, set, identities.as_ref()).await.map_err(super::stream::stream_error)?),
        None => None,
    };
    let point = PointInTime {
        asked: replayed.asked.clone(),
        chain_id: replayed.chain_id.clone(),
        revision: replayed.revision,
        received: replayed.received,
        objects_from: objects.backup_id.clone(),
        object_set: set.map(|s| s.file_name()),
        later_revisions: (stream_through - replayed.revision).max(0),
    };
    let backup_id = archive::new_backup_id(replayed.received);
    let layout = Layout::new(namespace, hosted_cluster, &backup_id);
    write(store, &layout, &objects, set_archive, &replayed.base_member, &out, point.clone(), replayed.seconds).await?;
    Ok(Materialized { backup_id, point, stream_through, replay_seconds: clock.elapsed().as_secs_f64(), dry_run: false })
}

/// Write the point-in-time backup: the regular backup's artifacts other
/// than its snapshots copied (each checked against its recorded digest),
/// the replayed snapshot compressed (and sealed to the regular backup's
/// recipients when it is encrypted), `SHA256SUMS`, and the manifest last.
/// On failure what was written is deleted again (without its manifest the
/// folder would never be listed, but nothing is left for prune to explain).
#[allow(clippy::too_many_arguments)]
async fn write(
    store: Arc<dyn Store>,
    layout: &Layout,
    objects: &Manifest,
    set_archive: Option<Vec<u8>>,
    member: &str,
    snapshot: &std::path::Path,
    point: PointInTime,
    replay_seconds: f64,
) -> Result<(), OpsError> {
    let from = Layout::new(&layout.namespace, &layout.hosted_cluster, &objects.backup_id);
    let copied: Vec<&Artifact> = objects
        .artifacts
        .iter()
        .filter(|a| a.name != SHA256SUMS && !objects.etcd.iter().any(|m| m.artifact == a.name))
        .filter(|a| set_archive.is_none() || a.name != archive::OBJECTS)
        .collect();
    let object_counts = match &set_archive {
        Some(tarball) => {
            let mut counts = std::collections::BTreeMap::new();
            for (path, object) in archive::objects::read_tar_gz(&tarball[..]).map_err(|e| OpsError::Input(format!("the stream's object set {}: {e}", point.object_set.as_deref().unwrap_or("?"))))? {
                let kind = object["kind"].as_str().map(str::to_string).unwrap_or(path);
                *counts.entry(kind).or_insert(0usize) += 1;
            }
            counts
        }
        None => objects.object_counts.clone(),
    };
    let mut written: Vec<String> = Vec::new();
    let result = async {
        let mut artifacts = Vec::new();
        for artifact in &copied {
            let key = format!("{}/{}", layout.dir(), artifact.name);
            let body = store.get(&format!("{}/{}", from.dir(), artifact.name)).await?;
            written.push(key.clone());
            let put = store.put(&key, body).await?;
            if put.sha256 != artifact.sha256 || put.size != artifact.size {
                return Err(OpsError::Input(format!(
                    "{} of backup {} does not match its manifest (read {} bytes, SHA-256 {}; recorded {} bytes, {}): `hcp-dr backups verify` shows what is damaged",
                    artifact.name, objects.backup_id, put.size, put.sha256, artifact.size, artifact.sha256
                )));
            }
            artifacts.push((*artifact).clone());
        }
        let name = Layout::snapshot_name(member);
        let key = format!("{}/{name}", layout.dir());
        let recipients = match &objects.encryption {
            Some(encryption) => Recipients::parse(&encryption.recipients).map_err(|e| OpsError::Input(format!("backup {}: {e}", objects.backup_id)))?,
            None => None,
        };
        let sealing = recipients.map(|r| Arc::new(SealingStore::new(store.clone(), r)));
        let under: Arc<dyn Store> = match &sealing {
            Some(s) => s.clone(),
            None => store.clone(),
        };
        let mut set_plaintext = None;
        if let Some(tarball) = &set_archive {
            let key = format!("{}/{}", layout.dir(), archive::OBJECTS);
            written.push(key.clone());
            let put = under.put(&key, Box::new(&tarball[..])).await?;
            artifacts.push(Artifact { name: archive::OBJECTS.into(), size: put.size, sha256: put.sha256 });
            set_plaintext = sealing.as_ref().and_then(|s| s.plaintext(&key)).map(|p| Artifact { name: archive::OBJECTS.into(), size: p.size, sha256: p.sha256 });
        }
        let compressing = CompressingStore::new(under, DEFAULT_LEVEL);
        let file = tokio::fs::File::open(snapshot).await.map_err(|e| OpsError::Input(format!("the replayed snapshot {}: {e}", snapshot.display())))?;
        written.push(key.clone());
        let stored = compressing.put(&key, Box::new(file)).await?;
        let raw = compressing.raw(&key).ok_or_else(|| StoreError::Body { key: key.clone(), source: std::io::Error::other("no raw digest of the snapshot") })?;
        let snapshot_artifact = Artifact { name: name.clone(), size: stored.size, sha256: stored.sha256.clone() };
        artifacts.insert(0, snapshot_artifact.clone());
        let sums = archive::sha256sums(&artifacts);
        written.push(layout.sums());
        let put = store.put(&layout.sums(), Box::new(sums.as_bytes())).await?;
        artifacts.push(Artifact { name: SHA256SUMS.into(), size: put.size, sha256: put.sha256 });
        let encryption = match (&objects.encryption, &sealing) {
            (Some(encryption), Some(sealing)) => {
                let plain = sealing.plaintext(&key).ok_or_else(|| StoreError::Body { key: key.clone(), source: std::io::Error::other("no plaintext digest of the snapshot") })?;
                let mut kept: Vec<Artifact> = encryption.artifacts.iter().filter(|a| copied.iter().any(|c| c.name == a.name)).cloned().collect();
                kept.insert(0, Artifact { name: name.clone(), size: plain.size, sha256: plain.sha256 });
                kept.extend(set_plaintext.clone());
                Some(archive::Encryption { artifacts: kept, ..encryption.clone() })
            }
            _ => None,
        };
        let manifest = Manifest {
            format_version: Manifest::version_for(encryption.is_some(), true),
            tool_version: env!("CARGO_PKG_VERSION").into(),
            backup_id: layout.backup_id.clone(),
            cluster: objects.cluster.clone(),
            etcd: vec![MemberSnapshot { member: member.to_string(), artifact: name.clone(), revision: point.revision, size: stored.size, sha256: stored.sha256 }],
            artifacts,
            object_counts,
            timings: Timings {
                started: Some(point.received),
                finished: Some(Utc::now()),
                // nothing was paused or scaled: the stream watched
                api_downtime_seconds: Some(0.0),
                stages: [("replay".to_string(), replay_seconds)].into_iter().collect(),
            },
            encryption,
            origin: objects.origin.clone(),
            etcd_health: Default::default(),
            agent_inventory: objects.agent_inventory.clone(),
            guest_volumes: objects.guest_volumes.clone(),
            compression: Some(archive::Compression {
                algorithm: archive::compression::ALGORITHM.into(),
                level: DEFAULT_LEVEL,
                artifacts: vec![Artifact { name, size: raw.size, sha256: raw.sha256 }],
            }),
            point_in_time: Some(point),
        };
        manifest.check().map_err(|e| OpsError::Input(format!("the point-in-time manifest: {e}")))?;
        store.put(&layout.manifest(), Box::new(&manifest.to_json()[..])).await?;
        Ok(())
    }
    .await;
    if result.is_err() {
        for key in written.iter().rev() {
            let _ = store.delete(key).await;
        }
    }
    result
}
