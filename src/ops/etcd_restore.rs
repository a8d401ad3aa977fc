//! `hcp-dr etcd restore`: put a hosted cluster's etcd back to a snapshot in
//! place, through the etcd-restore playbook (journaled, resumable). A stop
//! before `restore-members` changed anything is undone at once; after it,
//! `--resume` finishes and `--abort` is refused (the old data is gone).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::OpsError;
use super::backup::{check_name, holder};
use super::restore::{latest_backup, split_backup_url};
use crate::etcd::verify::SnapshotSource;
use crate::pipeline::runner::Observer;
use crate::pipeline::{Interrupt, OnFailure, RunReport};
use crate::stages::context::{BackupContext, BackupInputs, EtcdAccess, TlsOverride};
use crate::stages::etcd_restore::{
    BackupRef, EtcdRestoreContext, EtcdRestoreInputs, SnapshotRef, etcd_restore_catalog,
};
use crate::store::{self, S3Options, StoreUrl};

/// The operation's name in playbooks and journals.
pub const ETCD_RESTORE: &str = "etcd-restore";
/// How long each wait may take unless told (pods gone, restore pods, members healthy).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(900);

/// Everything `hcp-dr etcd restore` was asked.
#[derive(Clone)]
pub struct EtcdRestoreOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub hosted_cluster: Option<String>,
    pub namespace: String,
    /// A backup URL, a store with `backup_id`, or a snapshot file or object.
    pub from: Option<String>,
    pub backup_id: Option<String>,
    pub s3: S3Options,
    pub stage_snapshot_to: Option<String>,
    /// None: 1h, or 15m for the decrypted copy of an encrypted backup.
    pub presign_ttl: Option<Duration>,
    /// The age identity file for an encrypted backup.
    pub identity: Option<PathBuf>,
    pub bump_revision: Option<u64>,
    pub image: Option<String>,
    pub pause_ttl: Duration,
    pub etcd_access: EtcdAccess,
    pub tls: TlsOverride,
    pub wait_timeout: Option<Duration>,
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
    pub observer: Option<std::sync::Arc<dyn Observer>>,
}

/// What an etcd restore reports.
#[derive(Debug, Clone, Serialize)]
pub struct EtcdRestoreResult {
    #[serde(flatten)]
    pub run: RunReport,
    pub hosted_cluster: String,
    /// `<store>/<key>` of the snapshot, its revision and SHA-256.
    pub snapshot: Option<String>,
    pub snapshot_revision: Option<i64>,
    pub snapshot_sha256: Option<String>,
    /// The revision the cluster had reached, the bump, and each member's after.
    pub revision_before: Option<i64>,
    pub bump_revision: Option<u64>,
    pub revisions_after: Option<std::collections::BTreeMap<String, i64>>,
    /// From the first writer scaled down to the writers back.
    pub api_downtime_seconds: Option<f64>,
    pub warnings: Vec<String>,
}

/// Where the snapshot is: a backup (resolved to an id) or a bare snapshot.
async fn locate(options: &EtcdRestoreOptions, namespace: &str, hosted_cluster: &str) -> Result<SnapshotRef, OpsError> {
    let from = options.from.clone().ok_or_else(|| {
        OpsError::Input("--from is required: a backup (STORE/NS/CLUSTER/ID, or STORE with --backup-id ID|latest) or a snapshot file or s3:// object".into())
    })?;
    let backup = match (&options.backup_id, split_backup_url(&from)) {
        (Some(id), _) => Some((from.trim_end_matches('/').to_string(), namespace.to_string(), hosted_cluster.to_string(), id.clone())),
        (None, Some(parts)) => Some(parts),
        (None, None) => None,
    };
    if let Some((root, ns, hc, id)) = backup {
        let id = if id == "latest" {
            let store = store::open(&root, options.s3.clone()).await?;
            latest_backup(store.as_ref(), &ns, &hc).await?
        } else {
            id
        };
        return Ok(SnapshotRef {
            store: root,
            key: String::new(),
            backup: Some(BackupRef { namespace: ns, hosted_cluster: hc, backup_id: id }),
        });
    }
    match SnapshotSource::parse(&from).map_err(|e| OpsError::Input(e.to_string()))? {
        SnapshotSource::File(path) => {
            let path = std::path::absolute(&path).unwrap_or(path);
            if !path.is_file() {
                return Err(OpsError::Input(format!(
                    "--from {from}: no such snapshot file (give a snapshot file, an s3:// object, or a backup: STORE/NS/CLUSTER/ID)"
                )));
            }
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
            let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            Ok(SnapshotRef { store: dir.display().to_string(), key: name, backup: None })
        }
        SnapshotSource::Object { store_url, key } => Ok(SnapshotRef { store: store_url, key, backup: None }),
    }
}

async fn resolve_inputs(options: &EtcdRestoreOptions) -> Result<EtcdRestoreInputs, OpsError> {
    let hosted_cluster = options.hosted_cluster.clone().ok_or_else(|| {
        OpsError::Input("--hosted-cluster is required (or --resume/--abort JOURNAL)".into())
    })?;
    check_name("hosted cluster", &hosted_cluster)?;
    check_name("namespace", &options.namespace)?;
    let snapshot = locate(options, &options.namespace, &hosted_cluster).await?;
    let local_source = matches!(StoreUrl::parse(&snapshot.store)?, StoreUrl::Local(_));
    // An encrypted backup: the identity must open it, and the pods get a
    // decrypted copy (in the backup's own S3 store unless told otherwise).
    let mut stage_snapshot_to = options.stage_snapshot_to.clone();
    let mut encrypted = false;
    if let Some(backup) = &snapshot.backup {
        let store = store::open(&snapshot.store, options.s3.clone()).await?;
        let layout = crate::archive::Layout::new(&backup.namespace, &backup.hosted_cluster, &backup.backup_id);
        let manifest = crate::archive::check::read_manifest(store.as_ref(), &layout).await.ok();
        // a compressed snapshot: the pods get a decompressed copy, staged as an encrypted one is
        let compressed = manifest.as_ref().is_some_and(crate::archive::Manifest::best_is_compressed);
        if compressed && stage_snapshot_to.is_none() && !local_source {
            stage_snapshot_to = Some(snapshot.store.clone());
        }
        if let Some(manifest) = &manifest
            && let Some(encryption) = &manifest.encryption
        {
            encrypted = true;
            let what = format!("backup {}/{}", store.url(), layout.dir());
            let input = |e: crate::archive::encryption::EncryptionError| OpsError::Input(e.to_string());
            let path = options.identity.clone().ok_or_else(|| {
                input(crate::archive::encryption::EncryptionError::IdentityNeeded { what: what.clone(), recipients: encryption.recipients.clone() })
            })?;
            let identities = crate::archive::encryption::Identities::from_file(&path).map_err(input)?;
            identities.check(&what, &encryption.recipients).map_err(input)?;
            if stage_snapshot_to.is_none() && !local_source {
                stage_snapshot_to = Some(snapshot.store.clone());
            }
        }
    }
    let presign_ttl = options.presign_ttl.unwrap_or(if encrypted { super::restore::DECRYPTED_COPY_TTL } else { Duration::from_secs(3600) });
    match &stage_snapshot_to {
        Some(url) if !matches!(StoreUrl::parse(url)?, StoreUrl::S3 { .. }) => {
            return Err(OpsError::Input(format!(
                "--stage-snapshot-to {url}: the restore pods download the snapshot from a presigned URL, so this must be an s3:// store"
            )));
        }
        None if local_source => {
            return Err(OpsError::Input(format!(
                "the snapshot is in {}, which the restore pods cannot download from: pass --stage-snapshot-to s3://bucket/prefix (a copy is presigned there and deleted when the members are restored)",
                snapshot.store
            )));
        }
        _ => {}
    }
    if presign_ttl < Duration::from_secs(60) || presign_ttl > Duration::from_secs(7 * 24 * 3600) {
        return Err(OpsError::Input(format!(
            "--presign-ttl {}s: use between 1m and 7d (SigV4's limit); it must cover the restore pods' downloads",
            presign_ttl.as_secs()
        )));
    }
    if options.bump_revision == Some(0) {
        return Err(OpsError::Input("--bump-revision 0: the restored revision must move forward; give a positive number or leave it out to measure it".into()));
    }
    let wait = options.wait_timeout.unwrap_or(DEFAULT_WAIT);
    if wait < Duration::from_secs(30) {
        return Err(OpsError::Input(format!(
            "--wait-timeout {}s is too short: etcd needs time to stop, restore and start; use at least 30s (default 15m)",
            wait.as_secs()
        )));
    }
    if options.pause_ttl < 3 * wait {
        return Err(OpsError::Input(format!(
            "--pause-ttl {}s is shorter than three waits ({}s each): the pause must outlast the restore; raise --pause-ttl",
            options.pause_ttl.as_secs(),
            wait.as_secs()
        )));
    }
    let started = chrono::Utc::now();
    Ok(EtcdRestoreInputs {
        cluster: BackupInputs {
            hosted_cluster,
            namespace: options.namespace.clone(),
            store: snapshot.store.clone(),
            s3_endpoint: options.s3.endpoint.clone(),
            ca_bundle: options.s3.ca_bundle.clone(),
            pause_ttl_seconds: options.pause_ttl.as_secs(),
            etcd_access: options.etcd_access,
            extra_scale_down: Vec::new(),
            wait_timeout_seconds: wait.as_secs(),
            operator_ack_timeout_seconds: None,
            allow_no_quorum: false,
            platform: Default::default(),
            holder: holder(),
            backup_id: crate::archive::new_backup_id(started),
            started,
            // Nothing is written: the backup stages here only pause and scale.
            encrypt_to: Vec::new(),
            route53_zone: None,
            route53_endpoint: None,
            copy_to: Vec::new(),
            copy_optional: false,
            object_lock: None,
            compress_level: None,
        },
        snapshot,
        stage_snapshot_to,
        bump_revision: options.bump_revision,
        presign_ttl_seconds: presign_ttl.as_secs(),
        image: options.image.clone(),
        identity: options.identity.clone(),
    })
}

/// Run (or resume, abort, dry-run) an etcd restore.
pub async fn etcd_restore(options: EtcdRestoreOptions, interrupt: &mut Interrupt) -> Result<EtcdRestoreResult, OpsError> {
    let operation = operation();
    let playbook = operation.load_playbook(&options.run)?;
    let journal_given = options.run.journal_given().map(Path::to_path_buf);
    let mut inputs = match &journal_given {
        Some(journal) => super::journal_inputs::<EtcdRestoreInputs>(journal, ETCD_RESTORE)?.0,
        None => resolve_inputs(&options).await?,
    };
    if let Some(wait) = options.wait_timeout {
        inputs.cluster.wait_timeout_seconds = wait.as_secs();
    }
    let mut s3 = options.s3.clone();
    s3.endpoint = s3.endpoint.or_else(|| inputs.cluster.s3_endpoint.clone());
    s3.ca_bundle = s3.ca_bundle.or_else(|| inputs.cluster.ca_bundle.clone());
    if let Some(identity) = &options.identity {
        inputs.identity = Some(identity.clone());
    }
    let identities = match &inputs.identity {
        Some(path) => Some(crate::archive::encryption::Identities::from_file(path).map_err(|e| OpsError::Input(e.to_string()))?),
        None => None,
    };
    let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), journal_given.as_deref()).await?;
    let client = target.client;
    let staging = match &inputs.stage_snapshot_to {
        Some(url) => Some(store::open(url, s3.clone()).await?),
        None => None,
    };
    let mut ctx = EtcdRestoreContext {
        cluster: BackupContext::new(client, store::open(&inputs.snapshot.store, s3).await?, inputs.cluster.clone(), options.tls.clone()),
        inputs: inputs.clone(),
        staging,
        local_copy: None,
        url: None,
        identities,
    };
    let journaled = super::Journaled::new(&inputs, vec![target.binding], &[&inputs.cluster.namespace, &inputs.cluster.hosted_cluster]);
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;
    let fetch = run.output_of::<crate::stages::etcd_restore::fetch::FetchSnapshot>()?;
    let stop = run.output_of::<crate::stages::etcd_restore::stop::StopEtcd>()?;
    let start = run.output_of::<crate::stages::etcd_restore::start::StartEtcd>()?;
    let resume = run.output_of::<crate::stages::resume::Resume>()?;
    Ok(EtcdRestoreResult {
        hosted_cluster: format!("{}/{}", inputs.cluster.namespace, inputs.cluster.hosted_cluster),
        snapshot: fetch.as_ref().map(|f| f.source.clone()),
        snapshot_revision: fetch.as_ref().map(|f| f.revision),
        snapshot_sha256: fetch.as_ref().map(|f| f.sha256.clone()),
        revision_before: stop.as_ref().and_then(|s| s.revision_before),
        bump_revision: stop.as_ref().map(|s| s.bump),
        revisions_after: start.map(|s| s.revisions),
        api_downtime_seconds: resume.and_then(|r| r.api_downtime_seconds),
        warnings: ctx.cluster.warnings.clone(),
        run,
    })
}

/// The etcd-restore operation: a failure stops it; before restore-members
/// a stop is undone at once (the old members come back), after it only
/// `--resume` can finish.
pub fn operation() -> super::Operation<EtcdRestoreContext> {
    super::Operation {
        command: "hcp-dr etcd restore",
        playbook: ETCD_RESTORE,
        catalog: etcd_restore_catalog(),
        on_failure: OnFailure::Stop,
        resume: Some("goes on"),
        abort: Some("brings the old members back (before restore-members)"),
        no_abort_after: Some(super::run::NoReturn {
            stage: "restore-members",
            from_start: false,
            why: "restore-members has started, so the members' old data is gone and there is nothing to go back to",
        }),
        undo_stops_before: Some(<crate::stages::etcd_restore::members::RestoreMembers as crate::pipeline::StageId>::NAME),
    }
}

