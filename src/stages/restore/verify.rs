//! `verify`: before anything touches the destination, re-read the backup
//! from the store and check it against its manifest (format version, the
//! size and SHA-256 of every artifact the restore uses, SHA256SUMS, the
//! objects archive parsing, and the best snapshot read offline as a bbolt
//! database at its revision). The other members' snapshots are only found
//! in the store with their size: the restore does not use them, and
//! reading them would double what it downloads.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RestoreContext;
use crate::archive::Manifest;
use crate::archive::check::{CheckReport, check_backup_with, read_manifest};
use crate::archive::encryption::EncryptionError;
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;

pub struct Verify;

/// Check the backup (decrypting it with `--identity` when it is encrypted)
/// and read its objects.
async fn load(ctx: &RestoreContext) -> Result<(Manifest, Vec<Value>, CheckReport), StageFailure> {
    let checked = check_backup_with(ctx.store.as_ref(), &ctx.inputs.layout(), ctx.keys.as_ref()).await?;
    loaded(checked)
}

/// A checked backup's parts, or the identity it needs.
fn loaded(checked: crate::archive::check::Checked) -> Result<(Manifest, Vec<Value>, CheckReport), StageFailure> {
    match checked.objects {
        Some(objects) => Ok((checked.manifest, objects, checked.report)),
        None => Err(EncryptionError::IdentityNeeded {
            what: format!("backup {}", checked.report.backup),
            recipients: checked.report.encrypted_to,
        }
        .into()),
    }
}

/// Load (and check) the backup's objects into the context unless they
/// already are: a resumed run re-reads them, as objects are never
/// journaled (they hold Secrets).
pub async fn ensure_loaded(ctx: &mut RestoreContext) -> Result<(), StageFailure> {
    if ctx.objects.is_none() {
        let (_, objects, _) = load(ctx).await?;
        ctx.objects = Some(objects);
    }
    Ok(())
}

/// The backup's manifest: the one `verify` checked (its output, journaled),
/// else read from the store (a playbook without `verify`, as
/// `restore --dns-only`; the manifest is small and needs no key).
pub async fn manifest(ctx: &RestoreContext, step: &Step<'_>) -> Result<Manifest, StageFailure> {
    if let Some(manifest) = step.output_of::<Verify>()?.and_then(|verified| verified.manifest) {
        return Ok(manifest);
    }
    Ok(read_manifest(ctx.store.as_ref(), &ctx.inputs.layout()).await?)
}

/// An artifact's bytes as the restore uses them: `body` (the stored bytes
/// of artifact `name` at `key`) decrypted with `--identity` when the backup
/// is encrypted and decompressed when the artifact is compressed, and the
/// size and SHA-256 the manifest says they must have (the raw or plaintext
/// ones, for such an artifact).
pub async fn plaintext_of(
    ctx: &RestoreContext,
    manifest: &Manifest,
    name: &str,
    key: &str,
    body: crate::store::Body<'static>,
) -> Result<(crate::store::Body<'static>, u64, String), StageFailure> {
    let (size, sha256) = wanted(manifest, name)?;
    if manifest.plaintext(name).is_none() {
        return Ok((body, size, sha256));
    }
    if manifest.encrypted() && ctx.keys.is_none() {
        return Err(EncryptionError::IdentityNeeded {
            what: format!("backup {}/{}", ctx.store.url(), ctx.inputs.layout().dir()),
            recipients: manifest.recipients().to_vec(),
        }
        .into());
    }
    let body = crate::archive::compression::decoded(manifest, name, key, body, ctx.keys.as_ref()).await?;
    Ok((body, size, sha256))
}

/// The size and SHA-256 artifact `name` has as the restore uses it: the
/// raw or plaintext ones for an artifact stored compressed or encrypted.
pub fn wanted(manifest: &Manifest, name: &str) -> Result<(u64, String), StageFailure> {
    match (manifest.plaintext(name), manifest.artifact(name)) {
        (Some(plain), _) => Ok((plain.size, plain.sha256.clone())),
        (None, Some(stored)) => Ok((stored.size, stored.sha256.clone())),
        (None, None) => Err(StageError::Precondition(format!("the manifest does not list the artifact {name}")).into()),
    }
}

/// The manifest `verify` checked, for a plan (`None` before it ran: a
/// migrate's dry-run, whose backup does not exist yet).
pub fn verified_manifest(step: &Step<'_>) -> Option<Manifest> {
    step.output_of::<Verify>().ok().flatten().and_then(|verified| verified.manifest)
}

/// Reads the best member snapshot offline from the copy the check made,
/// and keeps that copy when it is to be staged.
struct BestOffline {
    report: Option<crate::etcd::verify::Report>,
    keep: bool,
    kept: Option<super::CheckedCopy>,
}

#[async_trait]
impl crate::archive::check::Inspect for BestOffline {
    fn wants(&self, manifest: &crate::archive::Manifest, member: &crate::archive::MemberSnapshot) -> bool {
        manifest.best_snapshot().is_some_and(|best| best.member == member.member)
    }
    /// The other members' snapshots are not restored: reading them would
    /// double what a restore downloads. `backups verify` reads them.
    fn skips_unwanted(&self) -> bool {
        true
    }
    async fn inspect(&mut self, _member: &crate::archive::MemberSnapshot, copy: &std::path::Path) -> Result<(), crate::archive::check::CheckError> {
        let report = crate::etcd::verify::verify_copy(copy).await.map_err(|e| crate::archive::check::CheckError::Offline(e.to_string()))?;
        self.report = Some(report);
        Ok(())
    }
    fn keep(&mut self, member: &crate::archive::MemberSnapshot, copy: tempfile::TempPath) {
        if self.keep {
            self.kept = Some(super::CheckedCopy { member: member.member.clone(), path: copy });
        }
    }
}

/// What verify checked: the backup's artifacts, and the snapshot a restore
/// uses, read offline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Verified {
    pub backup: String,
    pub artifacts_checked: usize,
    pub bytes_checked: u64,
    /// What was read from the store to check it, the manifest included:
    /// each artifact once.
    #[serde(default)]
    pub bytes_read: u64,
    pub objects: usize,
    /// The other members' snapshots, found in the store with their
    /// recorded size but not read (the restore does not use them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_read: Vec<String>,
    pub snapshot: VerifiedSnapshot,
    pub backup_finished: Option<chrono::DateTime<chrono::Utc>>,
    pub encrypted_to: Vec<String>,
    /// The manifest checked, for the stages after (journals written
    /// before it was recorded here have none: read from the store then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<Manifest>,
}

/// The snapshot a restore uses: its member, revision and keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifiedSnapshot {
    pub member: String,
    pub revision: i64,
    pub size: u64,
    pub keys: Option<u64>,
    pub keys_by_prefix: Option<std::collections::BTreeMap<String, u64>>,
}

impl StageId for Verify {
    const NAME: &'static str = "verify";
    type Output = Verified;
}

#[async_trait]
impl Stage<RestoreContext> for Verify {
    fn summary(&self) -> &'static str {
        "re-read what the restore uses: format version, each artifact's size and SHA-256 (the other members' snapshots only found, with their size), the objects archive, and the best snapshot read offline at its revision"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, ctx: &RestoreContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "read back {}/{} and check it against its manifest, the best snapshot offline (the others only found)",
            ctx.store.url(),
            ctx.inputs.layout().dir()
        )]
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let meter = crate::pipeline::Meter::new();
        step.show(&meter);
        let store = crate::store::metered::MeteredStore::new(ctx.store.as_ref(), &meter);
        let layout = ctx.inputs.layout();
        // Every artifact is read once: the best snapshot is read offline
        // from the copy made while it was hashed (TMPDIR's room for it is
        // checked before anything is read), and staged from it too (not
        // kept by a dry run: nothing is staged)
        let mut best_offline = BestOffline { report: None, keep: ctx.staging.is_some() && !step.dry_run(), kept: None };
        let checked = crate::archive::check::check_backup_inspecting(&store, &layout, ctx.keys.as_ref(), &mut best_offline).await?;
        let (manifest, objects, report) = loaded(checked)?;
        let best = manifest
            .best_snapshot()
            .ok_or_else(|| StageError::Precondition("the manifest lists no etcd snapshot".into()))?;
        // The snapshot etcd will restore is also read as etcd will: its
        // trailing hash and its database, and it must hold the recorded revision.
        let key = layout.artifact(&best.artifact);
        // an encrypted backup read without its identity stopped in `loaded`
        let offline = best_offline.report.ok_or_else(|| {
            StageError::Precondition(format!("{}/{key}: the snapshot was not read offline during the check", ctx.store.url()))
        })?;
        let revision = offline.summary.as_ref().map(|s| s.store_revision());
        if !offline.is_ok() || revision != Some(best.revision) {
            return Err(StageError::Precondition(format!(
                "{}/{key}: the snapshot does not verify offline ({}; revision {revision:?}, the manifest records {}): the backup is damaged or was tampered with; use another backup",
                ctx.store.url(),
                offline.verdict,
                best.revision
            ))
            .into());
        }
        let output = Verified {
            backup: report.backup,
            artifacts_checked: report.artifacts_checked,
            bytes_checked: report.bytes_checked,
            objects: report.objects,
            not_read: report.not_read,
            snapshot: VerifiedSnapshot {
                member: best.member.clone(),
                revision: best.revision,
                size: best.size,
                keys: offline.summary.as_ref().map(|s| s.live_keys),
                keys_by_prefix: offline.summary.as_ref().map(|s| s.live_keys_by_prefix.clone()),
            },
            bytes_read: meter.bytes(),
            backup_finished: manifest.timings.finished,
            encrypted_to: manifest.recipients().to_vec(),
            manifest: Some(manifest.clone()),
        };
        if manifest.etcd_health.no_quorum {
            ctx.warnings.push(format!(
                "the backup was taken WITHOUT etcd quorum (--allow-no-quorum) from {}: the restored cluster may lack the last writes its lost majority acknowledged; prefer an earlier backup taken with quorum if those writes matter",
                best.member
            ));
        }
        ctx.objects = Some(objects);
        // only the best snapshot is inspected, so only it can be kept
        ctx.checked_copy = best_offline.kept;
        Ok(output)
    }
}
