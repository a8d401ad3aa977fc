//! `hcp-dr restore`: one backup onto a destination management cluster,
//! through the restore playbook. Stops (never undoes by itself) on failure:
//! `--resume` continues, `--abort` deletes what the run created.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::OpsError;
use super::backup::check_name;
use crate::archive::results::{self, Kind, ResultRecord};
use crate::archive::parse_backup_id;
use crate::pipeline::{Interrupt, OnFailure, RunReport};
use crate::stages::context::EtcdAccess;
use crate::stages::restore::dns::TakenOver;
use crate::stages::restore::etcd_seed::{EtcdSeedInputs, resolve_mode};
use crate::stages::restore::{DnsInputs, RestoreContext, RestoreInputs, restore_catalog};
use crate::archive::check::{CheckError, read_manifest};
use crate::archive::encryption::{EncryptionError, Identities};
use crate::store::{self, S3Options, Store};

/// Everything `hcp-dr restore` was asked.
#[derive(Clone)]
pub struct RestoreOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// A backup's URL, or a store URL with `backup_id`.
    pub from: Option<String>,
    pub backup_id: Option<String>,
    pub hosted_cluster: Option<String>,
    pub namespace: Option<String>,
    pub s3: S3Options,
    pub stage_snapshot_to: Option<String>,
    pub presign_ttl: Duration,
    pub wait_timeout: Duration,
    pub clean_leftovers: bool,
    pub overwrite: bool,
    pub etcd_access: EtcdAccess,
    /// The data-mover image for a KubeVirt cluster's guest volumes.
    pub mover_image: Option<String>,
    /// `--etcd-seed`, `--etcd-init-fixed`, `--bump-revision`, `--etcd-image`.
    pub etcd_seed: EtcdSeedInputs,
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
    pub observer: Option<std::sync::Arc<dyn crate::pipeline::runner::Observer>>,
    /// `--route53-zone`, `--take-over-dns`, `--dns-owner`, `--dns-wait`
    /// (`None`: no zone known).
    pub dns: Option<DnsInputs>,
    /// `--dns-only`: run only `dns-takeover`, for a cluster this backup
    /// was already restored from.
    pub dns_only: bool,
    /// `--at` / `--at-revision`: restore the point of the cluster's stream
    /// (a point-in-time backup is made first), not a backup.
    pub at: Option<super::point_in_time::AtPoint>,
}

/// What a restore run reports.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreResult {
    #[serde(flatten)]
    pub run: RunReport,
    pub backup: String,
    pub hosted_cluster: String,
    pub warnings: Vec<String>,
    /// When the backup was taken (its manifest) and how old it was when
    /// this restore ran: the RPO. Writes made after it are lost.
    pub backup_taken: Option<chrono::DateTime<chrono::Utc>>,
    pub backup_age_seconds: Option<i64>,
    /// When the run did not take the DNS records over and some may still
    /// point at the old management cluster: the command that does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub take_over_dns_command: Option<String>,
    /// What `dns-takeover` did, when it ran (in `stages` of the JSON).
    #[serde(skip)]
    pub dns_takeover: Option<TakenOver>,
    /// What `wait` saw, when it ran.
    #[serde(skip)]
    pub healthy: Option<crate::stages::restore::wait::Healthy>,
    /// How etcd got its data (`etcd-seed`), when it ran.
    #[serde(skip)]
    pub seeded: Option<crate::stages::restore::etcd_seed::Seeded>,
    /// The fence `fence` wrote, when it ran.
    #[serde(skip)]
    pub fence: Option<crate::archive::fence::Fence>,
    /// What `oidc-issuer` found (an AWS cluster), when it ran.
    #[serde(skip)]
    pub oidc: Option<crate::hosted::oidc::IssuerReport>,
    /// The result record written beside the backup (`results/`): RTO and
    /// RPO, for `hcp-dr report`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<String>,
    /// The point restored, for `--at` / `--at-revision`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub point_in_time: Option<super::point_in_time::Materialized>,
}

/// The origin a journal records for the embedded `--dns-only` playbook.
/// The embedded playbook of `--dns-only`, and its origin in a journal.
const DNS_ONLY_PLAYBOOK_NAME: &str = "restore-dns-takeover";
const DNS_ONLY_PLAYBOOK: &str = "builtin:restore-dns-takeover";

/// `--from` split into the store's root and one backup, when it names one:
/// `<root>/<namespace>/<cluster>/<backup-id>` (or `.../latest`).
pub fn split_backup_url(url: &str) -> Option<(String, String, String, String)> {
    let trimmed = url.trim_end_matches('/');
    let mut parts = trimmed.rsplitn(4, '/');
    let (id, hc, ns, root) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if (id != "latest" && parse_backup_id(id).is_err()) || root.is_empty() || root.ends_with(':') || root.ends_with(":/") {
        return None;
    }
    Some((root.to_string(), ns.to_string(), hc.to_string(), id.to_string()))
}

/// The newest backup of a cluster that has its manifest (a complete one)
/// and was taken as a backup: a point-in-time backup (`restore --at`) is
/// made from the stream, and `latest` means the newest one taken.
pub async fn latest_backup(store: &dyn Store, namespace: &str, hosted_cluster: &str) -> Result<String, OpsError> {
    // an unreadable manifest is the newest all the same: verify says what is wrong with it
    let newest = crate::archive::check::newest_regular(store, namespace, hosted_cluster, |_, _| true).await?;
    newest.map(|(id, _)| id).ok_or_else(|| {
        OpsError::Input(format!(
            "no complete backup of {namespace}/{hosted_cluster} in {}: check the store URL, --hosted-cluster and -n (hcp-dr backups list)",
            store.url()
        ))
    })
}

pub(crate) async fn resolve_inputs(options: &RestoreOptions, s3: &S3Options) -> Result<RestoreInputs, OpsError> {
    let from = options
        .from
        .clone()
        .ok_or_else(|| OpsError::Input("--from is required: the URL of a backup, or of a store with --backup-id".into()))?;
    if options.at.is_some() && (options.backup_id.is_some() || split_backup_url(&from).is_some()) {
        return Err(OpsError::Input(format!(
            "--at and --at-revision pick their own backup from the cluster's stream: give --from the store's URL (not a backup's; got {from}) with --hosted-cluster and -n, and no --backup-id"
        )));
    }
    let (root, namespace, hosted_cluster, id) = match split_backup_url(&from) {
        Some(parts) => parts,
        None if options.at.is_some() => {
            let hc = options.hosted_cluster.clone().ok_or_else(|| {
                OpsError::Input("--at and --at-revision need --hosted-cluster (and -n, default clusters): the cluster whose stream is restored".into())
            })?;
            (from.clone(), options.namespace.clone().unwrap_or_else(|| "clusters".into()), hc, String::new())
        }
        None => {
            let id = options.backup_id.clone().ok_or_else(|| {
                OpsError::Input(format!(
                    "--from {from} does not end in <namespace>/<cluster>/<backup-id>: give a backup's URL, or add --backup-id ID (or latest) with --hosted-cluster and -n"
                ))
            })?;
            let hc = options.hosted_cluster.clone().ok_or_else(|| {
                OpsError::Input("--backup-id needs --hosted-cluster (and -n, default clusters) to find the backup".into())
            })?;
            (from.clone(), options.namespace.clone().unwrap_or_else(|| "clusters".into()), hc, id)
        }
    };
    check_name("hosted cluster", &hosted_cluster)?;
    check_name("namespace", &namespace)?;
    if let Some(hc) = &options.hosted_cluster {
        if hc != &hosted_cluster {
            return Err(OpsError::Input(format!(
                "--hosted-cluster {hc} does not match the backup in --from ({namespace}/{hosted_cluster}); restoring under another name is `hcp-dr drill`"
            )));
        }
    }
    store::StoreUrl::parse(&root)?;
    let backup_id = if options.at.is_some() {
        // made last, once every other input is known good
        String::new()
    } else if id == "latest" {
        let store = store::open(&root, s3.clone()).await?;
        latest_backup(store.as_ref(), &namespace, &hosted_cluster).await?
    } else {
        parse_backup_id(&id).map_err(|e| OpsError::Input(e.to_string()))?;
        id
    };
    if let Some(staging) = &options.stage_snapshot_to {
        if !matches!(store::StoreUrl::parse(staging)?, store::StoreUrl::S3 { .. }) {
            return Err(OpsError::Input(format!(
                "--stage-snapshot-to {staging} must be an S3 store (s3://bucket/prefix): etcd downloads the snapshot from a presigned URL"
            )));
        }
    }
    let ttl = options.presign_ttl.as_secs();
    if !(300..=7 * 24 * 3600).contains(&ttl) {
        return Err(OpsError::Input(format!(
            "--presign-ttl {ttl}s is out of range: between 5m (etcd must start downloading before it expires) and 168h (the SigV4 limit)"
        )));
    }
    let dns = check_dns(options)?;
    let mut point_in_time = None;
    let backup_id = match &options.at {
        Some(at) => {
            let store: Arc<dyn Store> = store::open(&root, s3.clone()).await?.into();
            let seed = options.etcd_seed.clone();
            let precheck = move |manifest: &crate::archive::Manifest| resolve_mode(&seed, &manifest.cluster.availability_policy).map(|_| ()).map_err(OpsError::Input);
            let made = super::point_in_time::materialize(store, &namespace, &hosted_cluster, at, options.run.dry_run, &precheck).await?;
            let id = made.backup_id.clone();
            point_in_time = Some(made);
            id
        }
        None => backup_id,
    };
    Ok(RestoreInputs {
        point_in_time,
        store: root,
        namespace,
        hosted_cluster,
        backup_id,
        s3_endpoint: s3.endpoint.clone(),
        ca_bundle: s3.ca_bundle.clone(),
        stage_snapshot_to: options.stage_snapshot_to.clone(),
        presign_ttl_seconds: ttl,
        wait_timeout_seconds: options.wait_timeout.as_secs(),
        clean_leftovers: options.clean_leftovers,
        overwrite: options.overwrite,
        etcd_access: options.etcd_access,
        backup_of: None,
        identity: None,
        dns,
        mover_image: options.mover_image.clone(),
        etcd_seed: options.etcd_seed.clone(),
    })
}

/// `--take-over-dns` needs a zone; `--dns-owner` and `--dns-only` need
/// `--take-over-dns`; the zone id must be one.
fn check_dns(options: &RestoreOptions) -> Result<Option<DnsInputs>, OpsError> {
    let Some(dns) = &options.dns else {
        return Ok(None);
    };
    if (dns.owner.is_some() || options.dns_only) && !dns.take_over {
        return Err(OpsError::Input("--dns-owner and --dns-only go with --take-over-dns".into()));
    }
    let zone_id = dns.zone_id.trim();
    if zone_id.is_empty() {
        if dns.take_over {
            return Err(OpsError::Input(
                "--take-over-dns needs the Route53 hosted zone of the cluster's hostnames: add --route53-zone ZONE-ID (or set HCP_DR_ROUTE53_ZONE)".into(),
            ));
        }
        return Ok(None);
    }
    if let Some(owner) = &dns.owner {
        if owner.trim().is_empty() || owner.contains(',') || owner.contains('"') {
            return Err(OpsError::Input(format!(
                "--dns-owner `{owner}` is not an external-dns owner id (the --txt-owner-id of the lost cluster's external-dns: no commas or quotes)"
            )));
        }
    }
    if !(10..=24 * 3600).contains(&dns.wait_seconds) {
        return Err(OpsError::Input(format!("--dns-wait {}s is out of range: between 10s and 24h", dns.wait_seconds)));
    }
    let zone_id = crate::dns::route53::parse_zone_id(zone_id).map_err(|e| OpsError::Input(format!("--route53-zone: {e}")))?;
    Ok(Some(DnsInputs { zone_id, ..dns.clone() }))
}

/// How long a presigned URL of a decrypted snapshot copy lives unless
/// `--presign-ttl` says otherwise: long enough for etcd's first start, short
/// because the copy is plaintext.
pub const DECRYPTED_COPY_TTL: Duration = Duration::from_secs(15 * 60);

/// How to read an encrypted backup.
#[derive(Debug, Clone, Default)]
pub struct Decrypt {
    /// The age identity file (`--identity`).
    pub identity: Option<PathBuf>,
    /// `--presign-ttl` was given; otherwise the URL of a decrypted snapshot
    /// copy lives [`DECRYPTED_COPY_TTL`].
    pub presign_ttl_given: bool,
}

/// For an encrypted backup: the identities, checked against the recipients
/// in the manifest before anything changes; the backup's own S3 store as
/// the place of the decrypted snapshot copy unless `--stage-snapshot-to`
/// names one (etcd's init download cannot decrypt); and a short URL life.
/// Returns the identities (`None`: not encrypted) and warnings.
pub(crate) async fn prepare_decryption(
    inputs: &mut RestoreInputs,
    store: &dyn Store,
    decrypt: &Decrypt,
    fresh: bool,
) -> Result<(Option<Identities>, Vec<String>), OpsError> {
    let input = |e: EncryptionError| OpsError::Input(e.to_string());
    if let Some(path) = &decrypt.identity {
        // a file that is not there or not an identity is bad input, whether
        // or not this backup turns out to need it
        Identities::from_file(path).map_err(input)?;
        inputs.identity = Some(path.clone());
    }
    let manifest = match read_manifest(store, &inputs.layout()).await {
        Ok(manifest) => manifest,
        Err(CheckError::Store(err)) => return Err(err.into()),
        // `verify` says what is wrong with it
        Err(_) => return Ok((None, Vec::new())),
    };
    // etcd's download reads raw snapshots only: a compressed one is
    // staged decompressed, in the backup's own S3 store unless told where
    if fresh && manifest.best_is_compressed() {
        stage_in_own_store(inputs)?;
    }
    let Some(encryption) = &manifest.encryption else {
        let warnings = match &inputs.identity {
            Some(path) => vec![format!("the backup is not encrypted; --identity {} was not used", path.display())],
            None => Vec::new(),
        };
        return Ok((None, warnings));
    };
    let what = format!("backup {}/{}", store.url(), inputs.layout().dir());
    let path = inputs.identity.clone().ok_or_else(|| {
        input(EncryptionError::IdentityNeeded {
            what: what.clone(),
            recipients: encryption.recipients.clone(),
        })
    })?;
    let identities = Identities::from_file(&path).map_err(input)?;
    identities.check(&what, &encryption.recipients).map_err(input)?;
    if fresh {
        stage_in_own_store(inputs)?;
        if !decrypt.presign_ttl_given {
            inputs.presign_ttl_seconds = DECRYPTED_COPY_TTL.as_secs();
        }
    }
    Ok((Some(identities), Vec::new()))
}

/// Stage the snapshot copy in the backup's own store when that is S3 and
/// `--stage-snapshot-to` names no other.
pub(crate) fn stage_in_own_store(inputs: &mut RestoreInputs) -> Result<(), OpsError> {
    if inputs.stage_snapshot_to.is_none() && matches!(store::StoreUrl::parse(&inputs.store)?, store::StoreUrl::S3 { .. }) {
        inputs.stage_snapshot_to = Some(inputs.store.clone());
    }
    Ok(())
}

/// Refuse, before anything is contacted on the destination, a seeding the
/// backup's cluster cannot be restored with (`--etcd-seed url` on a
/// HighlyAvailable backup without `--etcd-init-fixed`). A manifest that
/// cannot be read is `verify`'s to report.
pub(crate) async fn check_seed(inputs: &RestoreInputs, store: &dyn Store) -> Result<(), OpsError> {
    let manifest = match read_manifest(store, &inputs.layout()).await {
        Ok(manifest) => manifest,
        Err(CheckError::Store(err)) => return Err(err.into()),
        Err(_) => return Ok(()),
    };
    resolve_mode(&inputs.etcd_seed, &manifest.cluster.availability_policy).map(|_| ()).map_err(OpsError::Input)
}

/// Run (or resume, abort, dry-run) a restore.
pub async fn restore(options: RestoreOptions, interrupt: &mut Interrupt) -> Result<RestoreResult, OpsError> {
    restore_with(options, Decrypt::default(), interrupt).await
}

/// Run (or resume, abort, dry-run) a restore of a backup that may be
/// encrypted (`decrypt`).
pub async fn restore_with(options: RestoreOptions, decrypt: Decrypt, interrupt: &mut Interrupt) -> Result<RestoreResult, OpsError> {
    if options.dns_only && options.run.playbook.is_some() {
        return Err(OpsError::Input("--dns-only runs the embedded dns-takeover playbook: drop --playbook".into()));
    }
    let journal_given = options.run.journal_given().map(Path::to_path_buf);
    let (mut inputs, journaled) = match &journal_given {
        Some(journal) => {
            let (inputs, state) = super::journal_inputs::<RestoreInputs>(journal, "restore")?;
            (inputs, Some(state.header.playbook))
        }
        None => (resolve_inputs(&options, &options.s3).await?, None),
    };
    // a --dns-only run is resumed and aborted with its own playbook, whether
    // or not --dns-only is repeated (its printed next steps do not repeat it)
    let dns_only = options.dns_only || journaled.as_deref() == Some(DNS_ONLY_PLAYBOOK);
    let operation = if dns_only { operation().with_playbook(DNS_ONLY_PLAYBOOK_NAME) } else { operation() };
    let playbook = operation.load_playbook(&options.run)?;
    // the destination first: a journal pointed at another cluster is refused
    // before the store is read or anything is decrypted
    let target = super::reach_for("destination", options.kubeconfig.as_deref(), options.context.as_deref(), journal_given.as_deref()).await?;
    // --overwrite may be added when resuming after a conflict report, and
    // --etcd-image when the backup did not record one.
    inputs.overwrite |= options.overwrite;
    if let Some(image) = &options.etcd_seed.image {
        inputs.etcd_seed.image = Some(image.clone());
    }
    let mut s3 = options.s3.clone();
    s3.endpoint = s3.endpoint.or_else(|| inputs.s3_endpoint.clone());
    s3.ca_bundle = s3.ca_bundle.or_else(|| inputs.ca_bundle.clone());
    let store = store::open(&inputs.store, s3.clone()).await?;
    if journal_given.is_none() && !dns_only {
        check_seed(&inputs, store.as_ref()).await?;
    }
    // --abort deletes what the run made, the decrypted copy too: no key needed
    let (keys, warnings) = if options.run.aborting() {
        (None, Vec::new())
    } else {
        prepare_decryption(&mut inputs, store.as_ref(), &decrypt, journal_given.is_none()).await?
    };
    let staging = match &inputs.stage_snapshot_to {
        Some(url) => Some(store::open(url, s3).await?),
        None => None,
    };
    let mut ctx = RestoreContext::new(target.client, store, staging, inputs.clone());
    ctx.keys = keys;
    ctx.warnings.extend(warnings);
    ctx.management = Some(target.binding.management_cluster());
    if let Some(dns) = &inputs.dns {
        match super::connect_zone(&dns.zone_id, dns.endpoint.as_deref(), inputs.ca_bundle.as_deref()).await {
            Ok(zone) => ctx.dns = Some(zone),
            Err(err) if dns.take_over => return Err(err.into()),
            Err(err) => ctx.warnings.push(format!("the DNS records of the cluster's hostnames were not read: {err}")),
        }
    }
    let destination = target.binding.management_cluster().server;
    let journaled = super::Journaled::new(&inputs, vec![target.binding], &[&inputs.namespace, &inputs.hosted_cluster, &inputs.backup_id]);
    let started = chrono::Utc::now();
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;
    // the manifest verify checked; for --dns-only (no verify) the store's
    let manifest = match run.output_of::<crate::stages::restore::verify::Verify>()?.and_then(|verified| verified.manifest) {
        Some(manifest) => Some(manifest),
        None => read_manifest(ctx.store.as_ref(), &inputs.layout()).await.ok(),
    };
    let backup_taken = manifest.and_then(|m| m.timings.started);
    let backup = format!("{}/{}", ctx.store.url(), inputs.layout().dir());
    let dns_takeover = run.output_of::<crate::stages::restore::dns::DnsTakeover>()?;
    let take_over_dns_command = dns_takeover
        .as_ref()
        .filter(|t| t.skipped.is_some() && !t.hostnames.is_empty() && (t.zone_id.is_none() || !t.still_old.is_empty()))
        .map(|t| {
            let mut words = vec!["hcp-dr restore --dns-only --take-over-dns".to_string(), format!("--from {}", super::shell_word(&backup))];
            words.push(format!("--route53-zone {}", t.zone_id.as_deref().unwrap_or("ZONE-ID")));
            if let Some(k) = &options.kubeconfig {
                words.push(format!("--kubeconfig {}", super::shell_word(&k.display().to_string())));
            }
            if let Some(c) = &options.context {
                words.push(format!("--context {}", super::shell_word(c)));
            }
            if t.old_owner.is_none() {
                words.push("--dns-owner OWNER".into());
            }
            words.join(" ")
        });
    let mut warnings = ctx.warnings.clone();
    let recorded = if options.run.dry_run || options.run.aborting() || dns_only {
        None
    } else {
        let layout = inputs.layout();
        let passed = run.outcome == crate::pipeline::RunOutcome::Succeeded;
        let summary = results::outcome_summary("restore", &run.outcome);
        let mut record = ResultRecord::new(Kind::Restore, &layout.namespace, &layout.hosted_cluster, &layout.backup_id, started, passed, summary);
        record.rto_seconds = super::drill::rto_seconds(&run).filter(|_| passed && journal_given.is_none());
        record.rpo_seconds = backup_taken.map(|t| (started - t).num_milliseconds() as f64 / 1000.0);
        record.target = Some(format!("{}/{} on {destination}", inputs.namespace, inputs.hosted_cluster));
        record.failures.extend(run.outcome.failed_stage().map(|stage| format!("stage {stage}")));
        results::write_noting(ctx.store.as_ref(), &record, &mut warnings).await
    };
    Ok(RestoreResult {
        recorded,
        take_over_dns_command,
        dns_takeover,
        healthy: run.output_of::<crate::stages::restore::wait::Wait>()?,
        seeded: run.output_of::<crate::stages::restore::etcd_seed::EtcdSeed>()?,
        fence: run.output_of::<crate::stages::restore::fence::WriteFence>()?.map(|fenced| fenced.fence),
        oidc: run.output_of::<crate::stages::restore::oidc::OidcIssuer>()?.flatten(),
        backup,
        hosted_cluster: format!("{}/{}", inputs.namespace, inputs.hosted_cluster),
        warnings,
        backup_taken,
        backup_age_seconds: backup_taken.map(|t| (chrono::Utc::now() - t).num_seconds()),
        point_in_time: inputs.point_in_time.clone(),
        run,
    })
}

/// The restore operation: a failure stops it, for `--resume` or `--abort`
/// (a half-finished restore is often better continued than thrown away).
pub fn operation() -> super::Operation<RestoreContext> {
    super::Operation {
        command: "hcp-dr restore",
        playbook: "restore",
        catalog: restore_catalog(),
        on_failure: OnFailure::Stop,
        resume: Some("goes on"),
        abort: Some("deletes what it created"),
        no_abort_after: None,
        undo_stops_before: None,
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_urls_split_into_store_and_backup() {
        assert_eq!(
            split_backup_url("s3://bucket/pre/clusters/demo/20261121T180000Z-0a1b2c/"),
            Some(("s3://bucket/pre".into(), "clusters".into(), "demo".into(), "20261121T180000Z-0a1b2c".into()))
        );
        assert_eq!(
            split_backup_url("s3://bucket/clusters/demo/latest"),
            Some(("s3://bucket".into(), "clusters".into(), "demo".into(), "latest".into()))
        );
        assert_eq!(
            split_backup_url("/var/backups/clusters/demo/20261121T180000Z-0a1b2c"),
            Some(("/var/backups".into(), "clusters".into(), "demo".into(), "20261121T180000Z-0a1b2c".into()))
        );
        assert_eq!(split_backup_url("s3://bucket"), None);
        assert_eq!(split_backup_url("s3://bucket/clusters/demo"), None);
        assert_eq!(split_backup_url("s3://clusters/demo/latest"), None);
    }
}
