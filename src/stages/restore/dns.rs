//! `dns-takeover`: when the management cluster a backup was taken on is
//! lost, its external-dns still owns the Route53 records of the cluster's
//! hostnames, pointing at its dead load balancers, and the destination's
//! external-dns will not overwrite another owner's records. With
//! `--take-over-dns`, after the restored cluster is Available:
//!
//! 1. the hostnames are the ones the backup recorded (and the restored
//!    HostedCluster publishes); the old owner is `--dns-owner`, else the
//!    one the backup recorded;
//! 2. every record of those hostnames must be owned by the old owner (or
//!    be absent): any other owner, or a record without an owner record,
//!    refuses the take-over and nothing is deleted;
//! 3. the records to delete are journaled, then deleted in one atomic
//!    change (`DnsZone::delete_owned`, owner-checked again);
//! 4. then a bounded wait (`--dns-wait`) until the destination's
//!    external-dns has published every hostname under its own owner;
//! 5. each hostname is reported with its old and new targets.
//!
//! `--abort` recreates the deleted records whose names the destination has
//! not taken yet. Without `--take-over-dns` the stage only reads: it reports
//! which records still belong to the old owner.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::RestoreContext;
use super::verify::manifest;
use crate::dns::{DnsZone, Record, normalize_names};
use crate::hosted::publishing::in_domain;
use crate::hosted::{HOSTED_CLUSTER, HostedCluster};
use crate::kube::{api, get_json};
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, UndoInput, read_params};
use crate::stages::params::DnsParams;
use crate::stages::StageError;

pub struct DnsTakeover;

/// One hostname's records before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMove {
    pub host: String,
    /// The addresses the old owner's records pointed at.
    pub old_targets: Vec<String>,
    /// Who holds the hostname now, and where it points.
    pub new_owner: Option<String>,
    pub new_targets: Vec<String>,
}

/// What the stage did (journaled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TakenOver {
    /// Why nothing was taken over (`None`: the take-over ran).
    pub skipped: Option<String>,
    pub zone_id: Option<String>,
    /// The hostnames taken over (or checked): those inside the zone.
    pub hostnames: Vec<String>,
    /// The cluster's hostnames outside the zone, left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside_zone: Vec<String>,
    /// The external-dns owner the records were taken from.
    pub old_owner: Option<String>,
    /// The records deleted (address and owner records).
    pub deleted: Vec<Record>,
    pub hosts: Vec<HostMove>,
    /// Without the take-over: the address records the old owner still holds.
    pub still_old: Vec<Record>,
    pub waited_seconds: f64,
}

/// Journaled before anything is deleted.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Deleting {
    owner: String,
    records: Vec<Record>,
}

const POLL: Duration = Duration::from_secs(1);

fn targets(record: &Record) -> Vec<String> {
    match &record.alias {
        Some(alias) => vec![alias.clone()],
        None => record.values.clone(),
    }
}

/// Each host's move: the old owner's address targets (from `deleted`), and
/// the address records now there that someone else owns. `None` for a host
/// that is not taken yet (no address record, or one still the old owner's
/// or without an owner).
pub fn moves(hosts: &[String], deleted: &[Record], now: &[Record], old_owner: &str) -> Vec<(HostMove, bool)> {
    hosts
        .iter()
        .map(|host| {
            let old_targets: Vec<String> =
                deleted.iter().filter(|r| &r.name == host && r.is_address()).flat_map(targets).collect();
            let current: Vec<&Record> = now.iter().filter(|r| &r.name == host && r.is_address()).collect();
            let owners: BTreeSet<Option<&str>> = current.iter().map(|r| r.owner.as_deref()).collect();
            let taken = !current.is_empty() && owners.iter().all(|o| o.is_some_and(|o| o != old_owner));
            let new_owner = match owners.len() {
                1 => owners.into_iter().next().flatten().map(str::to_string),
                _ => None,
            };
            let new_targets = current.iter().flat_map(|r| targets(r)).collect();
            (HostMove { host: host.clone(), old_targets, new_owner, new_targets }, taken)
        })
        .collect()
}

/// The records of `present` that `owner` does not own: the take-over
/// refuses when there is any.
pub fn foreign<'a>(present: &'a [Record], owner: &str) -> Vec<&'a Record> {
    present.iter().filter(|r| r.owner.as_deref() != Some(owner)).collect()
}

async fn run(ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<TakenOver, StageFailure> {
    let manifest = manifest(ctx, step).await?;
    let label = ctx.inputs.hc_label();
    let hc = get_json(&api(&ctx.client, &HOSTED_CLUSTER, &ctx.inputs.namespace), &ctx.inputs.hosted_cluster, &label).await?.map(HostedCluster);
    // the hostnames: what the backup recorded, and what the restored
    // HostedCluster publishes
    let recorded = manifest.origin.as_ref().map(|o| o.hostnames.clone()).unwrap_or_default();
    let published = hc.as_ref().map(|hc| hc.published_hosts().1).unwrap_or_default();
    let hosts = normalize_names(recorded.iter().chain(&published));
    let recorded_owner = manifest.origin.as_ref().and_then(|o| o.dns.as_ref()).and_then(|d| d.owner.clone());
    let mut out = TakenOver { hostnames: hosts.clone(), ..TakenOver::default() };
    let (Some(inputs), Some(zone)) = (ctx.inputs.dns.clone(), ctx.dns.as_deref()) else {
        out.skipped = Some("no Route53 zone was given (--route53-zone)".into());
        return Ok(out);
    };
    out.zone_id = Some(zone.zone_id().to_string());
    // the zone holds only its own names: the others (a Route without a
    // hostname, named in the lost management cluster's ingress domain) are
    // left alone
    let (hosts, outside): (Vec<String>, Vec<String>) = hosts.into_iter().partition(|h| in_domain(h, zone.domain()));
    out.hostnames = hosts.clone();
    out.outside_zone = outside;
    if hosts.is_empty() {
        out.skipped = Some("the cluster publishes no hostname".into());
        return Ok(out);
    }
    let owner = inputs.owner.clone().or(recorded_owner);
    if !inputs.take_over {
        let present = zone.cluster_records(&hosts).await?;
        out.still_old = present
            .into_iter()
            .filter(|r| r.is_address() && owner.as_ref().is_none_or(|o| r.owner.as_ref() == Some(o)))
            .collect();
        out.old_owner = owner;
        out.skipped = Some("--take-over-dns was not given".into());
        return Ok(out);
    }
    if hc.as_ref().and_then(|h| h.condition("Available")) != Some("True") {
        return Err(StageError::Precondition(format!(
            "{label} is not Available on the destination: its DNS records are taken over only once it serves (nothing was deleted)"
        ))
        .into());
    }
    let owner = owner.ok_or_else(|| {
        StageError::Precondition(format!(
            "the backup does not record which external-dns owner held {} (it was taken without --route53-zone, or the records had no single owner): nothing was deleted. Pass --dns-owner OWNER, the --txt-owner-id of the lost management cluster's external-dns (`hcp-dr backups describe` shows what the backup recorded)",
            hosts.join(", ")
        ))
    })?;
    out.old_owner = Some(owner.clone());
    let earlier: Option<Deleting> = step.earlier_progress();
    let present = zone.cluster_records(&hosts).await?;
    let held: Vec<Record> = present.iter().filter(|r| r.owner.as_deref() == Some(owner.as_str())).cloned().collect();
    match &earlier {
        None => {
            let others = foreign(&present, &owner);
            if !others.is_empty() {
                return Err(StageError::Precondition(format!(
                    "not taking over the DNS records of {} in zone {}: {} not owned by `{owner}`, the old management cluster's external-dns: {}; nothing was deleted. If another owner is the lost cluster's, name it with --dns-owner OWNER; a record someone else owns is theirs to remove",
                    hosts.join(", "),
                    zone.zone_id(),
                    if others.len() == 1 { "this record is" } else { "these records are" },
                    others.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; ")
                ))
                .into());
            }
            step.record(serde_json::to_value(Deleting { owner: owner.clone(), records: held.clone() })?)?;
            out.deleted = zone.delete_owned(&hosts, &owner).await?;
        }
        Some(before) => {
            // resumed: what is left of the old owner's records goes; the
            // destination's records may already be there
            out.deleted = before.records.clone();
            let left: Vec<String> = hosts.iter().filter(|h| held.iter().any(|r| crate::dns::registry_names(h).contains(&r.name))).cloned().collect();
            if !left.is_empty() {
                let mut all = before.records.clone();
                all.extend(held.iter().cloned());
                all.sort_by(|a, b| a.key().cmp(&b.key()));
                all.dedup_by(|a, b| a.key() == b.key());
                step.record(serde_json::to_value(Deleting { owner: owner.clone(), records: all.clone() })?)?;
                zone.delete_owned(&left, &owner).await?;
                out.deleted = all;
            }
        }
    }
    let started = Instant::now();
    let timeout = step.read_params::<DnsParams>()?.wait()?.unwrap_or(Duration::from_secs(inputs.wait_seconds));
    loop {
        let now = zone.cluster_records(&hosts).await?;
        let state = moves(&hosts, &out.deleted, &now, &owner);
        if state.iter().all(|(_, taken)| *taken) {
            out.hosts = state.into_iter().map(|(m, _)| m).collect();
            break;
        }
        if started.elapsed() >= timeout {
            let waiting: Vec<String> = state.iter().filter(|(_, taken)| !taken).map(|(m, _)| m.host.clone()).collect();
            return Err(StageError::Precondition(format!(
                "the old owner's records are deleted, but after {}s the destination's external-dns has not published {} in zone {}: check external-dns on the destination management cluster (its logs, the Routes of {}); then resume this restore (--resume with its journal) to wait again, or --abort to put the old records back",
                timeout.as_secs(),
                waiting.join(", "),
                zone.zone_id(),
                ctx.inputs.hcp_namespace()
            ))
            .into());
        }
        tokio::time::sleep(POLL.min(timeout.saturating_sub(started.elapsed()))).await;
    }
    out.waited_seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

/// Recreate the deleted records whose names nobody holds now.
async fn put_back(zone: &dyn DnsZone, deleted: &[Record], warnings: &mut Vec<String>) -> Result<(), StageFailure> {
    let names: Vec<String> = deleted.iter().map(|r| r.name.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    let now = zone.records(&names).await?;
    let mut missing = Vec::new();
    for record in deleted {
        match now.iter().find(|r| r.name == record.name && r.kind == record.kind) {
            None => missing.push(record.clone()),
            Some(r) if r.key() == record.key() && r.values == record.values => {}
            Some(r) => warnings.push(format!("DNS record {record} was not put back: {r} is there now")),
        }
    }
    // an address record is put back only with its owner record, and only
    // where the destination has not published the name yet
    let taken: BTreeSet<&str> = now.iter().filter(|r| r.is_address()).map(|r| r.name.as_str()).collect();
    let (keep, skip): (Vec<Record>, Vec<Record>) = missing.into_iter().partition(|r| !r.is_address() || !taken.contains(r.name.as_str()));
    for r in &skip {
        warnings.push(format!("DNS record {r} was not put back: the name is published again"));
    }
    zone.create(&keep).await?;
    Ok(())
}

impl StageId for DnsTakeover {
    const NAME: &'static str = "dns-takeover";
    type Output = TakenOver;
}

#[async_trait]
impl Stage<RestoreContext> for DnsTakeover {
    fn summary(&self) -> &'static str {
        "with --take-over-dns: delete the lost management cluster's DNS records of the cluster's hostnames (owner-checked, all or nothing) and wait for the destination's external-dns to publish them; else report the records still pointing at the old cluster"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn params(&self) -> Params {
        Params::of::<DnsParams>()
    }
    fn plan(&self, ctx: &RestoreContext, step: &Step<'_>) -> Vec<String> {
        let wait = read_params::<DnsParams>(step.params()).ok().and_then(|p| p.wait().ok().flatten());
        match &ctx.inputs.dns {
            Some(dns) if dns.take_over => vec![format!(
                "delete the records of the cluster's hostnames owned by {} in zone {}, then wait up to {}s for the destination's external-dns to publish them",
                dns.owner.as_deref().unwrap_or("the owner the backup recorded"),
                dns.zone_id,
                wait.map_or(dns.wait_seconds, |w| w.as_secs())
            )],
            Some(dns) => vec![format!("read zone {}: which records still point at the old management cluster", dns.zone_id)],
            None => vec!["nothing (no --route53-zone)".into()],
        }
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        Ok(run(ctx, step).await?)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut RestoreContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        let deleted: Vec<Record> = match (input.output::<TakenOver>()?, input.progress::<Deleting>()?) {
            (Some(output), _) => output.deleted,
            (None, Some(progress)) => progress.records,
            (None, None) => return Ok(()),
        };
        if deleted.is_empty() {
            return Ok(());
        }
        let zone = ctx.dns.as_deref().ok_or(StageError::Missing("the Route53 zone (--route53-zone) to put the deleted records back"))?;
        let mut warnings = Vec::new();
        put_back(zone, &deleted, &mut warnings).await?;
        ctx.warnings.extend(warnings);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, kind: &str, value: &str, owner: Option<&str>) -> Record {
        Record {
            name: name.into(),
            kind: kind.into(),
            ttl: Some(30),
            values: vec![value.into()],
            set_identifier: None,
            alias: None,
            owner: owner.map(str::to_string),
        }
    }

    #[test]
    fn a_host_is_taken_when_every_address_record_has_a_new_owner() {
        let hosts = vec!["api.demo.example.com".to_string(), "oauth.demo.example.com".to_string()];
        let deleted = vec![
            rec("api.demo.example.com", "A", "192.0.2.1", Some("mgmt-a")),
            rec("api.demo.example.com", "TXT", "\"heritage=external-dns,external-dns/owner=mgmt-a\"", Some("mgmt-a")),
            rec("oauth.demo.example.com", "A", "192.0.2.1", Some("mgmt-a")),
        ];
        let now = vec![rec("api.demo.example.com", "A", "198.51.100.7", Some("mgmt-b"))];
        let state = moves(&hosts, &deleted, &now, "mgmt-a");
        assert_eq!(
            state[0],
            (
                HostMove {
                    host: "api.demo.example.com".into(),
                    old_targets: vec!["192.0.2.1".into()],
                    new_owner: Some("mgmt-b".into()),
                    new_targets: vec!["198.51.100.7".into()]
                },
                true
            )
        );
        assert!(!state[1].1, "no record yet for oauth");
        // a record without an owner record, or still the old owner's, is not taken
        let now = vec![rec("oauth.demo.example.com", "A", "198.51.100.7", None)];
        assert!(!moves(&hosts[1..], &deleted, &now, "mgmt-a")[0].1);
        let now = vec![rec("oauth.demo.example.com", "A", "192.0.2.1", Some("mgmt-a"))];
        assert!(!moves(&hosts[1..], &deleted, &now, "mgmt-a")[0].1);
    }

    #[test]
    fn records_of_any_other_owner_or_of_none_refuse_the_take_over() {
        let present = vec![
            rec("api.demo.example.com", "A", "192.0.2.1", Some("mgmt-a")),
            rec("oauth.demo.example.com", "A", "192.0.2.1", Some("third")),
            rec("ignition.demo.example.com", "A", "192.0.2.1", None),
        ];
        let names: Vec<&str> = foreign(&present, "mgmt-a").iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["oauth.demo.example.com", "ignition.demo.example.com"]);
        assert!(foreign(&present[..1], "mgmt-a").is_empty());
    }
}
