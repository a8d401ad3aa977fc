//! `hcp-dr backup`: one hosted cluster, through the backup playbook.

use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use serde::Serialize;

use super::{OpsError, signals};
use crate::archive::encryption::Recipients;
use crate::archive::new_backup_id;
use crate::pipeline::{Interrupt, RunReport};
use crate::stages::context::{BackupContext, BackupInputs, EtcdAccess, TlsOverride};
use crate::stages::{backup_catalog};
use crate::store::{self, S3Options};

/// Everything `hcp-dr backup` was asked.
#[derive(Clone)]
pub struct BackupOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub hosted_cluster: String,
    pub namespace: String,
    pub store: String,
    pub s3: S3Options,
    pub pause_ttl: Duration,
    pub etcd_access: EtcdAccess,
    pub wait_timeout: Duration,
    pub extra_scale_down: Vec<String>,
    pub tls: TlsOverride,
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
    /// Progress display, if any.
    pub observer: Option<std::sync::Arc<dyn crate::pipeline::runner::Observer>>,
    /// Where to keep Prometheus metrics (textfile collector), if anywhere.
    pub metrics_file: Option<PathBuf>,
    /// A Pushgateway to push the same metrics to, if any.
    pub pushgateway: Option<signals::Pushgateway>,
    /// age public keys to encrypt the snapshots and the objects archive to
    /// (`--encrypt-to`, repeatable); empty: not encrypted.
    pub encrypt_to: Vec<String>,
    /// The Route53 zone of the cluster's hostnames: the manifest records
    /// their records and external-dns owner (for a restore that takes them over).
    pub route53_zone: Option<String>,
    pub route53_endpoint: Option<String>,
    /// How long the HyperShift operator is given to acknowledge the pause.
    pub operator_ack_timeout: Option<std::time::Duration>,
    /// Without etcd quorum, snapshot the readable member with the highest
    /// revision instead of refusing.
    pub allow_no_quorum: bool,
    /// KubeVirt: how the guest volumes are taken.
    pub platform: crate::stages::context::PlatformSettings,
    /// What the backups of one fleet run (`backup --all`) share; a single
    /// backup builds its own.
    pub fleet: Option<FleetShared>,
    /// `--copy-to`: stores every artifact is also written to, in the same pass.
    pub copy_to: Vec<String>,
    /// `--copy-optional`: a copy that fails is a warning, not a failed backup.
    pub copy_optional: bool,
    /// `--compression`: how the etcd snapshots are stored.
    pub compression: crate::archive::compression::Compression,
    /// `--lock-for`/`--lock-mode`: S3 Object Lock retention on every object of the backup.
    pub object_lock: Option<store::object_lock::ObjectLock>,
}

/// What the backups of one fleet run share instead of each building its
/// own: the management cluster's client (one connection pool, one TLS
/// setup, one identity check), its API groups (one discovery) and the
/// store (one S3 client, and one budget of part buffers for every upload
/// of the run).
#[derive(Clone)]
pub struct FleetShared {
    pub client: kube::Client,
    pub binding: crate::pipeline::journal::ClusterBinding,
    pub store: std::sync::Arc<dyn store::Store>,
    pub api_groups: crate::stages::context::ApiGroups,
}

impl std::fmt::Debug for FleetShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetShared").field("server", &self.binding.server).field("store", &self.store.url()).finish_non_exhaustive()
    }
}

/// The S3 options of a run: the flags', else what its inputs recorded.
fn s3_options(options: &BackupOptions, inputs: &BackupInputs) -> S3Options {
    let mut s3 = options.s3.clone();
    s3.endpoint = s3.endpoint.or_else(|| inputs.s3_endpoint.clone());
    s3.ca_bundle = s3.ca_bundle.or_else(|| inputs.ca_bundle.clone());
    s3.object_lock = inputs.object_lock;
    s3
}

/// What a backup run reports.
#[derive(Debug, Clone, Serialize)]
pub struct BackupResult {
    #[serde(flatten)]
    pub run: RunReport,
    /// The backup's folder in the store, when it completed.
    pub backup: Option<String>,
    pub etcd_revision: Option<i64>,
    pub api_downtime_seconds: Option<f64>,
    pub warnings: Vec<String>,
    /// `--copy-to`: each copy store, complete or why not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<crate::store::mirrored::CopyState>,
    /// `--lock-for`: the backup's S3 Object Lock, as S3 reports it on its manifest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<super::object_lock::LockReport>,
}

pub(crate) fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    format!("hcp-dr@{host}/pid-{}", std::process::id())
}

pub(crate) fn check_name(what: &str, value: &str) -> Result<(), OpsError> {
    let ok = !value.is_empty()
        && value.len() <= 253
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(OpsError::Input(format!(
            "{what} `{value}` is not a valid Kubernetes name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )))
    }
}

/// Run (or resume, or dry-run) a backup.
pub async fn backup(options: BackupOptions, interrupt: &mut Interrupt) -> Result<BackupResult, OpsError> {
    let operation = operation();
    let playbook = operation.load_playbook(&options.run)?;

    let inputs = match options.run.journal_given() {
        Some(journal) => super::journal_inputs::<BackupInputs>(journal, "backup")?.0,
        None => {
            check_name("hosted cluster", &options.hosted_cluster)?;
            check_name("namespace", &options.namespace)?;
            store::StoreUrl::parse(&options.store)?;
            let started = Utc::now();
            BackupInputs {
                hosted_cluster: options.hosted_cluster.clone(),
                namespace: options.namespace.clone(),
                store: options.store.clone(),
                s3_endpoint: options.s3.endpoint.clone(),
                ca_bundle: options.s3.ca_bundle.clone(),
                pause_ttl_seconds: options.pause_ttl.as_secs(),
                etcd_access: options.etcd_access,
                extra_scale_down: options.extra_scale_down.clone(),
                wait_timeout_seconds: options.wait_timeout.as_secs(),
                operator_ack_timeout_seconds: options.operator_ack_timeout.map(|d| d.as_secs()),
                allow_no_quorum: options.allow_no_quorum,
                platform: options.platform.clone(),
                holder: holder(),
                backup_id: new_backup_id(started),
                started,
                encrypt_to: Recipients::parse(&options.encrypt_to)
                    .map_err(|e| OpsError::Input(e.to_string()))?
                    .map(|r| r.names())
                    .unwrap_or_default(),
                route53_zone: match &options.route53_zone {
                    Some(zone) => Some(crate::dns::route53::parse_zone_id(zone).map_err(|e| OpsError::Input(format!("--route53-zone: {e}")))?),
                    None => None,
                },
                route53_endpoint: options.route53_endpoint.clone(),
                copy_to: check_copies(&options.store, &options.copy_to)?,
                copy_optional: options.copy_optional,
                compress_level: options.compression.level(),
                object_lock: options.object_lock,
            }
        }
    };
    let recipients = Recipients::parse(&inputs.encrypt_to).map_err(|e| OpsError::Input(format!("journal inputs: {e}")))?;
    if inputs.pause_ttl_seconds < 60 {
        return Err(OpsError::Input(format!(
            "--pause-ttl {}s is too short: the pause must outlast the snapshot; use at least 1m (default 30m)",
            inputs.pause_ttl_seconds
        )));
    }
    if inputs.pause_ttl_seconds > 7 * 86400 {
        return Err(OpsError::Input(format!(
            "--pause-ttl {}s is too long: a crashed backup would leave the cluster paused that long; use at most 7d (default 30m)",
            inputs.pause_ttl_seconds
        )));
    }

    // --lock-for: every store an S3 bucket with Object Lock, before anything is contacted
    let lock_warnings = match (options.run.journal_given(), &options.fleet) {
        (None, None) => super::object_lock::check_stores(inputs.object_lock, &inputs.store, &inputs.copy_to, &s3_options(&options, &inputs)).await?,
        _ => Vec::new(),
    };
    let (client, binding, store, api_groups) = match &options.fleet {
        Some(fleet) => (fleet.client.clone(), fleet.binding.clone(), fleet.store.clone(), Some(fleet.api_groups.clone())),
        None => {
            if options.run.journal_given().is_none() {
                check_local_store("--to", &inputs.store, options.run.dry_run).await?;
            }
            let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), options.run.journal_given()).await?;
            let store = store::open(&inputs.store, s3_options(&options, &inputs)).await?;
            (target.client, target.binding, store.into(), None)
        }
    };
    // --copy-to: the primary and its copies written in one pass
    let (store, mirrored) = if inputs.copy_to.is_empty() {
        (store, None)
    } else {
        let mut copies = Vec::new();
        for url in &inputs.copy_to {
            if options.run.journal_given().is_none() {
                check_local_store("--copy-to", url, options.run.dry_run).await?;
            }
            copies.push(store::open(url, s3_options(&options, &inputs)).await?);
        }
        let mirrored = std::sync::Arc::new(store::mirrored::Mirrored::new(store, copies, inputs.copy_optional));
        (mirrored.clone() as std::sync::Arc<dyn store::Store>, Some(mirrored))
    };
    let mut ctx = BackupContext::new(client, store, inputs.clone(), options.tls.clone());
    if let Some(shared) = api_groups {
        ctx.api_groups = shared;
    }
    ctx.management = Some(binding.management_cluster());
    ctx.warnings.extend(lock_warnings);
    if let Some(zone) = &inputs.route53_zone {
        match super::connect_zone(zone, inputs.route53_endpoint.as_deref(), inputs.ca_bundle.as_deref()).await {
            Ok(zone) => ctx.dns = Some(zone),
            Err(err) => ctx.warnings.push(format!("the DNS records of the cluster's hostnames will not be recorded: {err}")),
        }
    }
    if let Some(recipients) = recipients {
        ctx.encrypt_to(recipients);
    }
    if let Some(level) = inputs.compress_level {
        ctx.compress(level);
    }
    let signalling = !options.run.dry_run;
    if signalling {
        signal(&ctx, &options, &signals::Outcome::Started).await;
    }
    let started = std::time::Instant::now();
    let journaled = super::Journaled::new(&inputs, vec![binding], &[&inputs.namespace, &inputs.hosted_cluster, &inputs.backup_id]);
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;
    let package = run.output_of::<crate::stages::package::Package>()?;
    let snapshots = run.output_of::<crate::stages::etcd_snapshot::SnapshotFinish>()?;
    let resumed = run.output_of::<crate::stages::resume::Resume>()?;
    let copies = mirrored.map(|m| m.states()).unwrap_or_default();
    let mut warnings = ctx.warnings.clone();
    let object_lock = match inputs.object_lock {
        Some(_) if !options.run.dry_run => super::object_lock::after_run(ctx.store.as_ref(), &inputs.layout(), package.is_some(), &mut warnings).await,
        _ => None,
    };
    for copy in copies.iter().filter(|c| c.error.is_some()) {
        warnings.push(format!(
            "the copy to {} is incomplete ({}): the backup is complete in {} only; `hcp-dr backups copy --from {} --to {}` completes it",
            copy.store,
            copy.error.as_deref().unwrap_or_default(),
            ctx.store.url(),
            ctx.store.url(),
            copy.store
        ));
    }
    let mut result = BackupResult {
        copies,
        object_lock,
        backup: package.as_ref().map(|p| p.backup.clone()),
        etcd_revision: package.as_ref().and_then(|p| p.revision),
        api_downtime_seconds: resumed.and_then(|r| r.api_downtime_seconds),
        warnings,
        run,
    };
    if signalling {
        let seconds = started.elapsed().as_secs_f64();
        let outcome = match (&result.run.outcome, &result.backup) {
            (crate::pipeline::RunOutcome::Succeeded, Some(backup)) => signals::Outcome::Succeeded {
                backup: backup.clone(),
                revision: result.etcd_revision,
                api_downtime_seconds: result.api_downtime_seconds,
                bytes: package.as_ref().map(|p| p.bytes).unwrap_or_else(|| snapshots.iter().flat_map(|s| &s.snapshots).map(|s| s.size).sum()),
                seconds,
                copies_incomplete: result.copies.iter().filter(|c| !c.complete).count(),
            },
            (crate::pipeline::RunOutcome::RolledBack { stage, error }, _)
            | (crate::pipeline::RunOutcome::Stopped { stage, error }, _)
            | (crate::pipeline::RunOutcome::UndoFailed { stage, error, .. }, _) => signals::Outcome::Failed {
                reason: format!("{stage}: {error}"),
                seconds,
            },
            _ => signals::Outcome::Failed { reason: "the run ended without a backup".into(), seconds },
        };
        result.warnings.extend(signal(&ctx, &options, &outcome).await);
    }
    Ok(result)
}

/// A listed HostedCluster's namespace and name.
pub(crate) fn namespace_and_name(hc: &serde_json::Value) -> Option<(String, String)> {
    Some((hc["metadata"]["namespace"].as_str()?.to_string(), hc["metadata"]["name"].as_str()?.to_string()))
}

/// The HostedClusters of `namespace`, or of every namespace.
pub(crate) fn hosted_clusters_api(client: &kube::Client, namespace: Option<&str>) -> kube::Api<kube::api::DynamicObject> {
    match namespace {
        Some(ns) => crate::kube::api(client, &crate::hosted::HOSTED_CLUSTER, ns),
        None => kube::Api::all_with(client.clone(), &crate::hosted::HOSTED_CLUSTER.api_resource()),
    }
}

/// The `--copy-to` stores: valid URLs, none the primary store, none twice.
fn check_copies(primary: &str, copies: &[String]) -> Result<Vec<String>, OpsError> {
    let primary_url = store::StoreUrl::parse(primary)?;
    let mut seen: Vec<store::StoreUrl> = Vec::new();
    for copy in copies {
        let url = store::StoreUrl::parse(copy).map_err(|e| OpsError::Input(format!("--copy-to: {e}")))?;
        if url.same_store(&primary_url) {
            return Err(OpsError::Input(format!("--copy-to {copy} is the store the backup is written to (--to {primary}): a copy goes to another store")));
        }
        if seen.iter().any(|s| s.same_store(&url)) {
            return Err(OpsError::Input(format!("--copy-to {copy} is given twice")));
        }
        seen.push(url);
    }
    Ok(copies.to_vec())
}

/// A local store (`--to DIR`) hcp-dr cannot create or write is bad input,
/// refused before anything is contacted, locked or written: the OS error
/// says why (a dry run removes the folders the check created).
async fn check_local_store(flag: &str, url: &str, dry_run: bool) -> Result<(), OpsError> {
    let store::StoreUrl::Local(path) = store::StoreUrl::parse(url)? else { return Ok(()) };
    let local = store::LocalStore::new(path);
    local.check_writable(dry_run).await.map_err(|err| OpsError::Input(format!("{flag} {url}: backups cannot be written there ({err}); give a directory hcp-dr can create and write")))
}

/// Record every HostedCluster of the fleet's namespace scope, selected by
/// `-l` or not, for the unprotected-cluster alert (best effort: a warning).
async fn discovered(options: &BackupOptions, fleet: &FleetSelection, shared: &FleetShared, matching: &[serde_json::Value]) {
    let selected: std::collections::BTreeSet<(String, String)> = matching.iter().filter_map(namespace_and_name).collect();
    let api = hosted_clusters_api(&shared.client, fleet.namespace.as_deref());
    let all = match crate::kube::list_json(&api, &kube::api::ListParams::default(), "HostedClusters").await {
        Ok(all) => all,
        Err(e) => {
            tracing::warn!("could not list every HostedCluster for hcp_dr_hosted_cluster_discovered: {e}");
            return;
        }
    };
    let clusters: Vec<signals::Discovered> = all
        .iter()
        .filter_map(namespace_and_name)
        .map(|(ns, name)| {
            let chosen = selected.contains(&(ns.clone(), name.clone()));
            (ns, name, chosen)
        })
        .collect();
    // the store as the next round will find it: a listing of a prefix no
    // backup uses answers fast on any store
    let store = signals::StoreProbe {
        url: shared.store.url(),
        reachable: match shared.store.list("hcp-dr-probe/").await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("the store {} cannot be listed: {e}", shared.store.url());
                false
            }
        },
    };
    if let Some(path) = &options.metrics_file
        && let Err(e) = signals::discovered_file(path, &clusters, &store)
    {
        tracing::warn!("could not write the discovered clusters' metrics: {e}");
    }
    if let Some(gateway) = &options.pushgateway {
        let id = shared.binding.kube_system_uid.clone().unwrap_or_else(|| shared.binding.server.clone());
        if let Err(e) = signals::push_discovered(gateway, &id, &clusters, &store).await {
            tracing::warn!("could not push the discovered clusters to the Pushgateway: {e}");
        }
    }
}

/// Event, status ConfigMap and metrics for one outcome; what could not be
/// written comes back as warnings.
async fn signal(ctx: &BackupContext, options: &BackupOptions, outcome: &signals::Outcome) -> Vec<String> {
    let metrics = options.metrics_file.as_deref();
    let (ns, name) = (&ctx.inputs.namespace, &ctx.inputs.hosted_cluster);
    let now = Utc::now();
    let mut warnings = Vec::new();
    if let Err(e) = signals::event(&ctx.client, ns, name, outcome).await {
        warnings.push(format!("could not record an Event: {e}"));
    }
    if let Err(e) = signals::status(&ctx.client, ns, name, outcome, now).await {
        warnings.push(format!("could not update the status ConfigMap: {e}"));
    }
    if let Some(path) = metrics {
        if let Err(e) = signals::metrics_file(path, ns, name, outcome, now) {
            warnings.push(format!("could not write metrics: {e}"));
        }
    }
    if let Some(gateway) = &options.pushgateway {
        match signals::push(gateway, ns, name, outcome, now).await {
            Ok(notes) => warnings.extend(notes),
            Err(e) => warnings.push(format!("could not push metrics to the Pushgateway: {e}")),
        }
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }
    warnings
}

/// The backup operation: on failure everything is undone at once (the
/// cluster goes back to service).
pub fn operation() -> super::Operation<BackupContext> {
    super::Operation {
        command: "hcp-dr backup",
        playbook: "backup",
        catalog: backup_catalog(),
        on_failure: crate::pipeline::OnFailure::Undo,
        resume: Some("finishes the backup, or its undo"),
        abort: Some("undoes it: the cluster unpaused and scaled back up, the partial backup deleted"),
        no_abort_after: None,
        undo_stops_before: None,
    }
}


/// Which hosted clusters a fleet backup takes.
#[derive(Debug, Clone)]
pub struct FleetSelection {
    /// `None`: every namespace.
    pub namespace: Option<String>,
    /// A label selector on the HostedClusters (`-l`).
    pub selector: Option<String>,
    /// How many backups run at once.
    pub concurrency: usize,
    /// Only the clusters whose UID falls in this part (`--shard i/K`).
    pub shard: Option<super::shard::Shard>,
}

/// One cluster's result in a fleet backup.
#[derive(Debug, Clone, Serialize)]
pub struct FleetMember {
    pub hosted_cluster: String,
    pub succeeded: bool,
    /// The backup's report, when it ran.
    pub result: Option<BackupResult>,
    /// Why it could not run at all.
    pub error: Option<String>,
}

/// What `hcp-dr backup --all` reports.
#[derive(Debug, Clone, Serialize)]
pub struct FleetResult {
    pub clusters: Vec<FleetMember>,
    pub succeeded: usize,
    pub failed: usize,
    /// With `--shard`: which part this run took, and how many of the
    /// matching clusters it left to the other parts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_shards: Option<usize>,
}

/// Back up every matching hosted cluster, each with its own lock, pause,
/// journal and undo; one failing does not stop the others. `options`
/// carries everything but the cluster's name and namespace.
pub async fn backup_all(options: BackupOptions, fleet: FleetSelection, interrupt: &mut Interrupt) -> Result<FleetResult, OpsError> {
    use futures::StreamExt;
    if options.run.journal_given().is_some() {
        return Err(OpsError::Input("--resume and --abort go on from one backup's journal; they do not go with --all".into()));
    }
    if fleet.concurrency == 0 {
        return Err(OpsError::Input("--concurrency must be at least 1".into()));
    }
    check_local_store("--to", &options.store, options.run.dry_run).await?;
    let mut s3 = options.s3.clone();
    s3.object_lock = options.object_lock;
    for warning in super::object_lock::check_stores(options.object_lock, &options.store, &options.copy_to, &s3).await? {
        tracing::warn!("{warning}");
    }
    let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), None).await?;
    let client = target.client.clone();
    let mut params = kube::api::ListParams::default();
    if let Some(selector) = &fleet.selector {
        params = params.labels(selector);
    }
    let api = hosted_clusters_api(&client, fleet.namespace.as_deref());
    let matching = crate::kube::list_json(&api, &params, "HostedClusters").await?;
    if matching.is_empty() {
        return Err(OpsError::Input(format!(
            "no HostedCluster matches (namespace {}, selector {}): nothing to back up",
            fleet.namespace.as_deref().unwrap_or("(all)"),
            fleet.selector.as_deref().unwrap_or("(none)")
        )));
    }
    // a shard takes the clusters whose UID falls in it (an empty part is no error: the fleet is small)
    let mine = |hc: &&serde_json::Value| fleet.shard.is_none_or(|shard| shard.owns(hc["metadata"]["uid"].as_str().unwrap_or_default()));
    let mut targets: Vec<(String, String)> = matching
        .iter()
        .filter(mine)
        .filter_map(namespace_and_name)
        .collect();
    targets.sort();
    let other_shards = fleet.shard.map(|_| matching.len() - targets.len());
    if let Some(shard) = fleet.shard {
        tracing::info!(shard = %shard, clusters = targets.len(), others = matching.len() - targets.len(), "backing up this shard's clusters");
    }
    // one interrupt per backup, all fired by the command's
    let mut triggers = Vec::new();
    let mut interrupts = Vec::new();
    for _ in &targets {
        let (trigger, interrupt) = Interrupt::manual();
        triggers.push(trigger);
        interrupts.push(interrupt);
    }
    let fan_out = async {
        let signal = interrupt.wait().await;
        for t in &triggers {
            t.fire(signal);
        }
    };
    // one client, one discovery and one store for the whole fleet, not one per cluster
    store::StoreUrl::parse(&options.store)?;
    let shared = FleetShared {
        client: target.client,
        binding: target.binding,
        store: store::open(&options.store, s3).await?.into(),
        api_groups: crate::stages::context::ApiGroups::default(),
    };
    let runs = futures::stream::iter(targets.into_iter().zip(interrupts).map(|((ns, name), mut own)| {
        let mut one = options.clone();
        one.fleet = Some(shared.clone());
        one.namespace = ns.clone();
        one.hosted_cluster = name.clone();
        // several progress bars would garble a terminal
        one.observer = None;
        async move {
            let label = format!("{ns}/{name}");
            match backup(one, &mut own).await {
                Ok(result) => FleetMember {
                    succeeded: result.run.outcome.is_success(),
                    hosted_cluster: label,
                    result: Some(result),
                    error: None,
                },
                Err(err) => FleetMember {
                    hosted_cluster: label,
                    succeeded: false,
                    result: None,
                    error: Some(err.to_string()),
                },
            }
        }
    }))
    .buffer_unordered(fleet.concurrency)
    .collect::<Vec<_>>();
    tokio::pin!(runs);
    tokio::pin!(fan_out);
    // on a signal every backup is told (each undoes itself); then wait for them all
    let mut clusters = tokio::select! {
        done = &mut runs => done,
        () = &mut fan_out => runs.await,
    };
    clusters.sort_by(|a, b| a.hosted_cluster.cmp(&b.hosted_cluster));
    if options.metrics_file.is_some() || options.pushgateway.is_some() {
        discovered(&options, &fleet, &shared, &matching).await;
    }
    let succeeded = clusters.iter().filter(|c| c.succeeded).count();
    Ok(FleetResult {
        failed: clusters.len() - succeeded,
        succeeded,
        clusters,
        shard: fleet.shard.map(|shard| shard.to_string()),
        other_shards,
    })
}
