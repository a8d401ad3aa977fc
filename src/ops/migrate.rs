//! `hcp-dr migrate`: move one hosted cluster from management cluster A to B
//! through a store, never tearing A down before B is verified. Stops (never
//! undoes by itself) on failure: `--resume` continues; `--abort` brings the
//! source back until teardown has started.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use serde::Serialize;

use super::OpsError;
use crate::archive::results::{self, Kind, ResultRecord};
use super::backup::{check_name, holder};
use crate::archive::new_backup_id;
use crate::dns::DnsZone;
use crate::pipeline::{Interrupt, Journal, JournalState, OnFailure, RunReport, StageState};
use crate::stages::context::{BackupContext, BackupInputs, EtcdAccess, TlsOverride};
use crate::stages::migrate::{MigrateContext, MigrateInputs, migrate_catalog};
use crate::stages::restore::{RestoreContext, RestoreInputs};
use crate::store::{self, S3Options};

/// Everything `hcp-dr migrate` was asked.
#[derive(Clone)]
pub struct MigrateOptions {
    pub hosted_cluster: Option<String>,
    pub namespace: String,
    pub from_kubeconfig: Option<PathBuf>,
    pub from_context: Option<String>,
    pub to_kubeconfig: Option<PathBuf>,
    pub to_context: Option<String>,
    pub via: Option<String>,
    pub s3: S3Options,
    pub stage_snapshot_to: Option<String>,
    pub route53_zone: Option<String>,
    pub route53_endpoint: Option<String>,
    /// How long the source's HyperShift operator is given to acknowledge the pause.
    pub operator_ack_timeout: Option<std::time::Duration>,
    /// Without etcd quorum on the source, move what its most advanced
    /// readable member holds instead of refusing.
    pub allow_no_quorum: bool,
    /// KubeVirt: how the guest volumes are taken.
    pub platform: crate::stages::context::PlatformSettings,
    pub dns_direct: bool,
    pub dns_wait: Duration,
    pub pause_ttl: Duration,
    pub wait_timeout: Duration,
    pub restore_wait: Duration,
    pub presign_ttl: Duration,
    pub etcd_access: EtcdAccess,
    pub tls: TlsOverride,
    /// `--etcd-seed`, `--etcd-init-fixed`, `--bump-revision`, `--etcd-image`.
    pub etcd_seed: crate::stages::restore::etcd_seed::EtcdSeedInputs,
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
    /// `--at`/`--at-revision` (with `--identity` for an encrypted stream):
    /// restore the cluster as it was at that point of its stream.
    pub at: Option<super::point_in_time::AtPoint>,
    pub observer: Option<std::sync::Arc<dyn crate::pipeline::runner::Observer>>,
}

/// What a migration reports.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateResult {
    #[serde(flatten)]
    pub run: RunReport,
    pub hosted_cluster: String,
    pub backup: String,
    /// API unavailable: from scale-down on the source to Available on the destination.
    pub rto_seconds: Option<f64>,
    /// Seconds per stage, from the journal (this run and earlier ones).
    pub stage_seconds: BTreeMap<String, f64>,
    /// The names the cluster is reached under: which hcp-dr's DNS steps
    /// managed, which they left alone, and why.
    pub dns_names: Vec<crate::hosted::publishing::PublishedName>,
    pub warnings: Vec<String>,
    /// The point of the stream restored (`--at`), when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<super::point_in_time::Materialized>,
    /// The result record written beside the backup (`results/`), for
    /// `hcp-dr report`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<String>,
}

fn new_inputs(options: &MigrateOptions) -> Result<MigrateInputs, OpsError> {
    let hosted_cluster = options
        .hosted_cluster
        .clone()
        .ok_or_else(|| OpsError::Input("--hosted-cluster is required".into()))?;
    check_name("hosted cluster", &hosted_cluster)?;
    check_name("namespace", &options.namespace)?;
    let via = options
        .via
        .clone()
        .ok_or_else(|| OpsError::Input("--via is required: the store the backup travels through (s3://bucket/prefix)".into()))?;
    let local = matches!(store::StoreUrl::parse(&via)?, store::StoreUrl::Local(_));
    if local && options.stage_snapshot_to.is_none() {
        return Err(OpsError::Input(format!(
            "--via {via} is a local directory, which the destination's etcd cannot download from: use an S3 store, or add --stage-snapshot-to s3://bucket/prefix"
        )));
    }
    if options.from_kubeconfig.is_none() && options.from_context.is_none() {
        return Err(OpsError::Input("--from-kubeconfig (or --from-context) is required: the source management cluster".into()));
    }
    if options.to_kubeconfig.is_none() && options.to_context.is_none() {
        return Err(OpsError::Input("--to-kubeconfig (or --to-context) is required: the destination management cluster".into()));
    }
    if options.from_kubeconfig == options.to_kubeconfig && options.from_context == options.to_context {
        return Err(OpsError::Input("the source and the destination are the same management cluster".into()));
    }
    if options.pause_ttl < Duration::from_secs(600) {
        return Err(OpsError::Input(format!(
            "--pause-ttl {}s is too short for a migration: the source must stay paused until the destination serves; use at least 10m (default 2h)",
            options.pause_ttl.as_secs()
        )));
    }
    if options.dns_direct && options.route53_zone.is_none() {
        return Err(OpsError::Input("--dns-direct needs --route53-zone".into()));
    }
    let started = Utc::now();
    let backup_id = new_backup_id(started);
    let presign = options.presign_ttl.as_secs();
    if !(300..=7 * 24 * 3600).contains(&presign) {
        return Err(OpsError::Input(format!("--presign-ttl {presign}s is out of range: between 5m and 168h")));
    }
    let mut inputs = MigrateInputs {
        source: BackupInputs {
            hosted_cluster: hosted_cluster.clone(),
            namespace: options.namespace.clone(),
            store: via.clone(),
            s3_endpoint: options.s3.endpoint.clone(),
            ca_bundle: options.s3.ca_bundle.clone(),
            pause_ttl_seconds: options.pause_ttl.as_secs(),
            etcd_access: options.etcd_access,
            extra_scale_down: vec![crate::hosted::CONTROL_PLANE_OPERATOR.to_string()],
            wait_timeout_seconds: options.wait_timeout.as_secs(),
            operator_ack_timeout_seconds: options.operator_ack_timeout.map(|d| d.as_secs()),
            allow_no_quorum: options.allow_no_quorum,
                platform: options.platform.clone(),
            holder: holder(),
            backup_id: backup_id.clone(),
            started,
            encrypt_to: Vec::new(),
            route53_zone: None,
            route53_endpoint: None,
            copy_to: Vec::new(),
            copy_optional: false,
            object_lock: None,
            // The migration's backup is restored minutes later through
            // etcd's own download, which reads raw snapshots only: stored
            // raw, it needs no decompressed copy staged while the API is down.
            compress_level: None,
        },
        destination: RestoreInputs {
            store: via,
            namespace: options.namespace.clone(),
            hosted_cluster,
            backup_id,
            s3_endpoint: options.s3.endpoint.clone(),
            ca_bundle: options.s3.ca_bundle.clone(),
            stage_snapshot_to: options.stage_snapshot_to.clone(),
            presign_ttl_seconds: presign,
            wait_timeout_seconds: options.restore_wait.as_secs(),
            clean_leftovers: false,
            overwrite: false,
            etcd_access: options.etcd_access,
            backup_of: None,
            identity: options.at.as_ref().and_then(|at| at.identity.clone()),
            dns: None,
            mover_image: options.platform.mover_image.clone(),
            // the source's writers stay stopped from the snapshot on
            etcd_seed: crate::stages::restore::etcd_seed::EtcdSeedInputs { source_stopped: true, ..options.etcd_seed.clone() },
            point_in_time: None,
        },
        from_kubeconfig: options.from_kubeconfig.clone(),
        from_context: options.from_context.clone(),
        to_kubeconfig: options.to_kubeconfig.clone(),
        to_context: options.to_context.clone(),
        route53_zone: options.route53_zone.clone(),
        route53_endpoint: options.route53_endpoint.clone(),
        dns_direct: options.dns_direct,
        dns_wait_seconds: options.dns_wait.as_secs(),
        at: options.at.clone(),
    };
    if inputs.at.is_some() {
        // a point-in-time backup is compressed: etcd's download needs a raw copy staged
        super::restore::stage_in_own_store(&mut inputs.destination)?;
    }
    Ok(inputs)
}

/// `--at`: refuse, before the source is paused (`fresh`: not a resumed
/// run), a playbook that would not restore the point, a point the stream
/// cannot restore, or an identity that cannot be read; the identities.
async fn check_point(inputs: &MigrateInputs, playbook: &crate::pipeline::Playbook, store: &dyn store::Store, fresh: bool) -> Result<Option<crate::archive::encryption::Identities>, OpsError> {
    let Some(at) = &inputs.at else { return Ok(None) };
    let identities = at.identity.as_deref().map(crate::archive::encryption::Identities::from_file).transpose().map_err(|e| OpsError::Input(e.to_string()))?;
    if !fresh {
        return Ok(identities);
    }
    let names: Vec<&str> = playbook.stages.iter().map(|s| s.name.as_str()).collect();
    let point = names.iter().position(|n| *n == <crate::stages::migrate::point::PointInTime as crate::pipeline::StageId>::NAME);
    let verify = names.iter().position(|n| *n == <crate::stages::restore::verify::Verify as crate::pipeline::StageId>::NAME);
    if point.is_none() || verify.is_some_and(|v| point.is_some_and(|p| p > v)) {
        return Err(OpsError::Input(format!(
            "--at needs the stage point-in-time before verify in the playbook ({}): without it the destination would restore the cluster as it is now; add `- name: point-in-time` after package",
            playbook.origin
        )));
    }
    super::point_in_time::check_point(store, &inputs.source.namespace, &inputs.source.hosted_cluster, at).await?;
    Ok(identities)
}

/// Seconds per succeeded stage, and the RTO: from scale-down's start on the
/// source to the moment `wait` saw the destination Available.
fn timings(state: &JournalState) -> (BTreeMap<String, f64>, Option<f64>) {
    let mut stages = BTreeMap::new();
    for (name, record) in &state.stages {
        if let (StageState::Succeeded, Some(start), Some(end)) = (record.state, record.started_at, record.finished_at) {
            stages.insert(name.clone(), (end - start).num_milliseconds() as f64 / 1000.0);
        }
    }
    let down = state.stage(<crate::stages::scale_down::ScaleDown as crate::pipeline::StageId>::NAME).started_at;
    let wait = state.stage(<crate::stages::restore::wait::Wait as crate::pipeline::StageId>::NAME);
    let available = wait.output.as_ref().and_then(|o| <crate::stages::restore::wait::Healthy as serde::Deserialize>::deserialize(o).ok()).map(|h| h.available_after_seconds);
    let rto = match (down, wait.started_at, available) {
        (Some(down), Some(wait_start), Some(after)) => {
            // whole milliseconds, as the drill's: a JSON reader gets the printed number
            Some((((wait_start - down).num_milliseconds() as f64 / 1000.0 + after) * 1000.0).round() / 1000.0)
        }
        _ => None,
    };
    (stages, rto)
}

/// Run (or resume, abort, dry-run) a migration.
pub async fn migrate(options: MigrateOptions, interrupt: &mut Interrupt) -> Result<MigrateResult, OpsError> {
    let operation = operation();
    let playbook = operation.load_playbook(&options.run)?;
    let journal_given = options.run.journal_given().map(Path::to_path_buf);
    let (inputs, state) = match &journal_given {
        Some(journal) => {
            let (inputs, state) = super::journal_inputs::<MigrateInputs>(journal, "migrate")?;
            (inputs, Some(state))
        }
        None => (new_inputs(&options)?, None),
    };
    let mut inputs = inputs;
    if let Some(image) = &options.etcd_seed.image {
        inputs.destination.etcd_seed.image = Some(image.clone());
    }
    // a resumed run reaches the clusters its journal recorded (absolute
    // kubeconfig paths and resolved contexts) unless the flags say otherwise;
    // journals of older versions only have the inputs
    let legacy = state.as_ref().is_some_and(|s| s.header.clusters.is_empty());
    fn or_legacy<T: Clone>(given: &Option<T>, old: &Option<T>, legacy: bool) -> Option<T> {
        given.clone().or_else(|| old.clone().filter(|_| legacy))
    }
    let from_kubeconfig = or_legacy(&options.from_kubeconfig, &inputs.from_kubeconfig, legacy);
    let to_kubeconfig = or_legacy(&options.to_kubeconfig, &inputs.to_kubeconfig, legacy);
    let from_context = or_legacy(&options.from_context, &inputs.from_context, legacy);
    let to_context = or_legacy(&options.to_context, &inputs.to_context, legacy);
    let bound = journal_given.as_deref().zip(state.as_ref());
    let source = super::target::reach("source", from_kubeconfig.as_deref(), from_context.as_deref(), bound).await?;
    let destination = super::target::reach("destination", to_kubeconfig.as_deref(), to_context.as_deref(), bound).await?;
    if source.binding.same_cluster(&destination.binding) {
        return Err(OpsError::Input(format!(
            "the source and the destination are the same management cluster ({}): migrate moves a hosted cluster to another one",
            source.binding.describe()
        )));
    }
    if journal_given.is_none() {
        // a seeding the cluster cannot be restored with is refused before the source is paused
        let label = format!("HostedCluster {}/{}", inputs.source.namespace, inputs.source.hosted_cluster);
        let hcs = crate::kube::api(&source.client, &crate::hosted::HOSTED_CLUSTER, &inputs.source.namespace);
        if let Some(hc) = crate::kube::get_json(&hcs, &inputs.source.hosted_cluster, &label).await? {
            let hc = crate::hosted::HostedCluster(hc);
            crate::stages::restore::etcd_seed::resolve_mode(&inputs.destination.etcd_seed, hc.availability_policy()).map_err(OpsError::Input)?;
        }
    }
    let clusters = vec![source.binding.clone(), destination.binding.clone()];
    let destination_binding = destination.binding.clone();
    let (source_client, dest_client) = (source.client, destination.client);
    let mut s3 = options.s3.clone();
    s3.endpoint = s3.endpoint.or_else(|| inputs.source.s3_endpoint.clone());
    s3.ca_bundle = s3.ca_bundle.or_else(|| inputs.source.ca_bundle.clone());
    let source_store = store::open(&inputs.source.store, s3.clone()).await?;
    let keys = if options.run.aborting() { None } else { check_point(&inputs, &playbook, source_store.as_ref(), journal_given.is_none()).await? };
    let dest_store = store::open(&inputs.destination.store, s3.clone()).await?;
    let staging = match &inputs.destination.stage_snapshot_to {
        Some(url) => Some(store::open(url, s3.clone()).await?),
        None => None,
    };
    let dns: Option<Box<dyn DnsZone>> = match &inputs.route53_zone {
        Some(zone) => {
            let endpoint = options.route53_endpoint.clone().or(inputs.route53_endpoint.clone());
            Some(super::connect_zone(zone, endpoint.as_deref(), s3.ca_bundle.as_deref()).await?)
        }
        None => None,
    };
    let mut source_ctx = BackupContext::new(source_client, source_store, inputs.source.clone(), options.tls.clone());
    source_ctx.management = Some(source.binding.management_cluster());
    let mut ctx = MigrateContext {
        source: source_ctx,
        destination: {
            let mut destination = RestoreContext::new(dest_client, dest_store, staging, inputs.destination.clone());
            destination.management = Some(destination_binding.management_cluster());
            destination.keys = keys;
            destination
        },
        dns,
        inputs: inputs.clone(),
        hosts: Vec::new(),
        published: Vec::new(),
    };
    let journaled = super::Journaled::new(&inputs, clusters, &[&inputs.source.namespace, &inputs.source.hosted_cluster, &inputs.source.backup_id]);
    let started = chrono::Utc::now();
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;
    let (stage_seconds, rto_seconds) = match &run.journal {
        Some(path) => timings(&Journal::read(Path::new(path))?),
        None => (BTreeMap::new(), None),
    };
    let mut warnings = ctx.source.warnings.clone();
    warnings.extend(ctx.destination.warnings.iter().cloned());
    let recorded = if options.run.dry_run || options.run.aborting() {
        None
    } else {
        let source = &inputs.source;
        let passed = run.outcome == crate::pipeline::RunOutcome::Succeeded;
        let summary = results::outcome_summary("migrate", &run.outcome);
        let mut record = ResultRecord::new(Kind::Migrate, &source.namespace, &source.hosted_cluster, &source.backup_id, started, passed, summary);
        // the backup is taken with the source's API down: a migration that
        // finished lost no write
        record.rto_seconds = rto_seconds.filter(|_| passed);
        // (unless it restored an earlier point: the writes after it are
        // in its own backup, deliberately not restored)
        record.rpo_seconds = Some(0.0).filter(|_| passed && inputs.at.is_none());
        record.target = Some(format!("{}/{} on {}", source.namespace, source.hosted_cluster, destination_binding.management_cluster().server));
        record.failures.extend(run.outcome.failed_stage().map(|stage| format!("stage {stage}")));
        results::write_noting(ctx.source.store.as_ref(), &record, &mut warnings).await
    };
    Ok(MigrateResult {
        recorded,
        hosted_cluster: format!("{}/{}", inputs.source.namespace, inputs.source.hosted_cluster),
        backup: format!("{}/{}", ctx.source.store.url(), inputs.source.layout().dir()),
        rto_seconds,
        stage_seconds,
        dns_names: ctx.published.clone(),
        point_in_time: ctx.destination.inputs.point_in_time.clone(),
        warnings,
        run,
    })
}

/// The migrate operation: a failure stops it, for `--resume` or `--abort`.
pub fn operation() -> super::Operation<MigrateContext> {
    super::Operation {
        command: "hcp-dr migrate",
        playbook: "migrate",
        catalog: migrate_catalog(),
        on_failure: OnFailure::Stop,
        resume: Some("goes on"),
        abort: Some("brings the source back (before teardown)"),
        no_abort_after: Some(super::run::NoReturn {
            stage: <crate::stages::migrate::teardown::Teardown as crate::pipeline::StageId>::NAME,
            from_start: true,
            why: "the source's teardown has started, so the source cannot be brought back (the destination was verified healthy before it began)",
        }),
        undo_stops_before: None,
    }
}

