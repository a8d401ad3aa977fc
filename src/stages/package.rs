//! `package`: write `SHA256SUMS` and then `manifest.json`, last, so a backup
//! is listed as complete only when every artifact is in the store.

use async_trait::async_trait;
use chrono::Utc;

use super::context::BackupContext;
use super::StageError;
use super::etcd_snapshot::{SnapshotFinish, Snapshots};
use super::export::{Export, Exported};
use super::preflight::Preflight;
use super::resume::Resume;
use super::volumes::{VolumeCopy, VolumesCopied};
use crate::archive::{GuestVolumeRecord, GuestVolumes};
use crate::hosted::kubevirt::GuestData;
use crate::archive::{self, Artifact, Encryption, Manifest, MemberSnapshot, SHA256SUMS, Timings};
use crate::pipeline::{Stage, StageId, StageFailure, StageState, Step, UndoInput};

pub struct Package;

/// The manifest's record of the guest volumes preflight found, each with
/// the artifact `volume-copy` stored. A volume found but not copied (a
/// playbook without `volume-copy`) fails the backup: it must not pass for
/// one that holds the guest's data.
fn guest_record(guest: Option<GuestData>, copied: &VolumesCopied) -> Result<Option<GuestVolumes>, StageFailure> {
    let Some(guest) = guest else { return Ok(None) };
    let mut volumes = Vec::new();
    for volume in guest.volumes {
        let Some(c) = copied.volumes.iter().find(|c| c.volume == volume.name) else {
            return Err(StageError::Precondition(format!(
                "guest volume {}/{} was found but not copied: the playbook needs the stages volume-snapshot and volume-copy (or run with --skip-guest-volumes to back up the control plane alone)",
                volume.namespace, volume.name
            ))
            .into());
        };
        volumes.push(GuestVolumeRecord { artifact: c.artifact.name.clone(), files: c.files, volume });
    }
    Ok(Some(GuestVolumes { volumes, root_disks: guest.root_disks }))
}

/// Where the finished backup is.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Packaged {
    /// The store URL and the backup's folder.
    pub backup: String,
    /// The manifest's key in the store.
    pub manifest: String,
    pub revision: Option<i64>,
    pub bytes: u64,
}

/// The manifest's `encryption` for an encrypted backup: the recipients and
/// the plaintext digests `snapshot-finish` and `export` journaled.
fn encryption(ctx: &BackupContext, snapshots: &Snapshots, export: &Exported, volumes: &VolumesCopied) -> Result<Option<Encryption>, StageFailure> {
    if ctx.inputs.encrypt_to.is_empty() {
        return Ok(None);
    }
    let mut artifacts = snapshots.plaintext.clone().unwrap_or_default();
    if artifacts.len() != snapshots.snapshots.len() {
        return Err(StageError::Missing("the plaintext digests of the encrypted snapshots").into());
    }
    let Some(objects) = export.plaintext.clone() else {
        return Err(StageError::Missing("the plaintext digest of the encrypted objects archive").into());
    };
    artifacts.push(objects);
    for copied in &volumes.volumes {
        artifacts.push(copied.plaintext.clone().ok_or(StageError::Missing("the plaintext digest of an encrypted guest volume"))?);
    }
    Ok(Some(Encryption {
        scheme: archive::encryption::SCHEME.into(),
        recipients: ctx.inputs.encrypt_to.clone(),
        artifacts,
    }))
}

/// The manifest's `compression` for a compressed backup: the level and the
/// raw digests `snapshot-finish` journaled.
fn compression(ctx: &BackupContext, snapshots: &Snapshots) -> Result<Option<archive::Compression>, StageFailure> {
    let Some(level) = ctx.inputs.compress_level else { return Ok(None) };
    let artifacts = snapshots.raw.clone().unwrap_or_default();
    if artifacts.len() != snapshots.snapshots.len() {
        return Err(StageError::Missing("the raw digests of the compressed snapshots").into());
    }
    Ok(Some(archive::Compression {
        algorithm: archive::compression::ALGORITHM.into(),
        level,
        artifacts,
    }))
}

impl StageId for Package {
    const NAME: &'static str = "package";
    type Output = Packaged;
}

#[async_trait]
impl Stage<BackupContext> for Package {
    fn summary(&self) -> &'static str {
        "write SHA256SUMS, then manifest.json last (a backup without its manifest is incomplete)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, _step: &Step<'_>) -> Vec<String> {
        let layout = ctx.inputs.layout();
        vec![format!("write {} and then {} to {}", layout.sums(), layout.manifest(), ctx.store.url())]
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let layout = ctx.inputs.layout();
        let history = step.history().ok_or(StageError::Missing("journal"))?;
        let export = step.needs::<Export>()?;
        let snapshots = step.needs::<SnapshotFinish>()?;
        let identity = step.needs::<Preflight>()?.identity;
        // migrate resumes nothing: the source stays down
        let api_downtime_seconds = step.output_of::<Resume>()?.and_then(|resumed| resumed.api_downtime_seconds);
        let objects = export.artifact.clone();
        let object_counts = export.object_counts.clone();
        let mut stages = std::collections::BTreeMap::new();
        for (name, record) in &history.stages {
            if let (StageState::Succeeded, Some(start), Some(end)) = (record.state, record.started_at, record.finished_at) {
                stages.insert(name.clone(), (end - start).num_milliseconds() as f64 / 1000.0);
            }
        }
        if snapshots.snapshots.is_empty() {
            return Err(StageError::Precondition("snapshot-finish stored no etcd snapshot".into()).into());
        }
        let guest = step.needs::<Preflight>()?.guest_volumes;
        let volumes = step.output_of::<VolumeCopy>()?.unwrap_or_default();
        let guest_volumes = guest_record(guest, &volumes)?;

        let mut artifacts: Vec<Artifact> = snapshots
            .snapshots
            .iter()
            .map(|s| Artifact {
                name: archive::Layout::snapshot_name(&s.member),
                size: s.size,
                sha256: s.sha256.clone(),
            })
            .collect();
        artifacts.push(objects);
        artifacts.extend(volumes.volumes.iter().map(|c| c.artifact.clone()));
        let sums = archive::sha256sums(&artifacts);
        let put = ctx.store.put(&layout.sums(), Box::new(sums.as_bytes())).await?;
        artifacts.push(Artifact {
            name: SHA256SUMS.into(),
            size: put.size,
            sha256: put.sha256,
        });
        let encryption = encryption(ctx, &snapshots, &export, &volumes)?;
        let compression = compression(ctx, &snapshots)?;
        let manifest = Manifest {
            format_version: Manifest::version_for(encryption.is_some(), compression.is_some()),
            tool_version: env!("CARGO_PKG_VERSION").into(),
            backup_id: ctx.inputs.backup_id.clone(),
            cluster: identity,
            etcd: snapshots
                .snapshots
                .iter()
                .map(|s| MemberSnapshot {
                    member: s.member.clone(),
                    artifact: archive::Layout::snapshot_name(&s.member),
                    revision: s.revision,
                    size: s.size,
                    sha256: s.sha256.clone(),
                })
                .collect(),
            artifacts,
            object_counts,
            timings: Timings {
                started: Some(ctx.inputs.started),
                finished: Some(Utc::now()),
                api_downtime_seconds,
                stages,
            },
            encryption,
            origin: ctx.origin.clone(),
            agent_inventory: export.agent_inventory.clone(),
            guest_volumes,
            etcd_health: ctx.etcd_health.clone(),
            compression,
            point_in_time: None,
        };
        manifest.check()?;
        ctx.store.put(&layout.manifest(), Box::new(&manifest.to_json()[..])).await?;
        Ok(Packaged {
            backup: format!("{}/{}", ctx.store.url(), layout.dir()),
            manifest: layout.manifest(),
            revision: manifest.best_snapshot().map(|s| s.revision),
            bytes: manifest.artifacts.iter().map(|a| a.size).sum::<u64>(),
        })
    }
    fn undoable(&self) -> bool {
        true
    }
    /// Manifest first, so the backup stops being listed as complete at once.
    async fn undo(&self, ctx: &mut BackupContext, _input: UndoInput<'_>) -> Result<(), StageFailure> {
        let layout = ctx.inputs.layout();
        ctx.store.delete(&layout.manifest()).await?;
        ctx.store.delete(&layout.sums()).await?;
        Ok(())
    }
}
