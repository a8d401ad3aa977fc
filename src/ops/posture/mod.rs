//! `hcp-dr report`: the fleet's DR posture, one row per hosted cluster,
//! worst first. Read from the store (backups, and the result records
//! drills, verifies, restores and migrations leave beside them) and, with a
//! kubeconfig, from the management cluster, so a HostedCluster no backup
//! covers is the first red row.
//!
//! Red: no good backup, the newest one older than the stale threshold
//! (`--stale-after` intervals of `--schedule`, as the HcpDrBackupStale
//! alert), the last drill failed, or the newest backup failed its verify.
//! Amber: the newest backup older than one and a half intervals (a run
//! missed), no drill within `--drill-every`, a drill slower than
//! `--rto-target`, an older backup that failed its verify. Green otherwise.

pub mod html;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OpsError;
use super::backups::{self, BackupEntry};
use crate::archive::results::{self, Kind, ResultRecord};
use crate::ops::drill::report::human_seconds;
use crate::store::{self, S3Options};

/// How many backups of a cluster the size and duration history shows.
pub const HISTORY: usize = 30;

/// What `hcp-dr report` was asked.
#[derive(Debug, Clone)]
pub struct PostureOptions {
    /// The store, then its copies (`backups copy`, `backup --copy-to`):
    /// with several, a newest backup missing from a copy is amber.
    pub stores: Vec<String>,
    pub s3: S3Options,
    /// The management cluster whose HostedClusters must all be covered.
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub thresholds: Thresholds,
}

/// When a row turns amber or red.
#[derive(Debug, Clone, Serialize)]
pub struct Thresholds {
    /// The backup schedule (cron), whose longest gap is one interval.
    pub schedule: String,
    /// Red when the newest good backup is older than this many intervals.
    pub stale_after: f64,
    /// Amber when the last passed drill is older than this.
    #[serde(with = "seconds")]
    pub drill_every: Duration,
    /// Amber when the last drill's RTO is longer than this.
    #[serde(with = "optional_seconds", skip_serializing_if = "Option::is_none")]
    pub rto_target: Option<Duration>,
}

mod seconds {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
}

mod optional_seconds {
    pub fn serialize<S: serde::Serializer>(d: &Option<std::time::Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_u64(d.as_secs()),
            None => s.serialize_none(),
        }
    }
}

impl Thresholds {
    /// The backup ages, in seconds, past which a row is amber and red.
    pub fn backup_ages(&self) -> Result<(i64, i64), OpsError> {
        if !(self.stale_after.is_finite() && (1.0..=100.0).contains(&self.stale_after)) {
            return Err(OpsError::Input(format!(
                "--stale-after {}: a backup is stale after 1 to 100 of the schedule's intervals (e.g. 2: two missed runs)",
                self.stale_after
            )));
        }
        let gap = super::monitoring::longest_gap_seconds(&self.schedule)?;
        let red = (gap as f64 * self.stale_after).round() as i64;
        // amber once a run is late by half an interval
        let amber = ((gap as f64 * 1.5).round() as i64).min(red);
        Ok((amber, red))
    }
}

/// Worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Red,
    Amber,
    Green,
}

impl Status {
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Red => "red",
            Status::Amber => "amber",
            Status::Green => "green",
        }
    }
}

/// One backup, as the history shows it.
#[derive(Debug, Clone, Serialize)]
pub struct BackupPoint {
    pub backup_id: String,
    pub taken: DateTime<Utc>,
    pub age_seconds: i64,
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_downtime_seconds: Option<f64>,
    /// With several stores: those holding it complete.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stores: Vec<String>,
}

impl BackupPoint {
    fn of(entry: &BackupEntry) -> BackupPoint {
        BackupPoint {
            stores: entry.stores.clone(),
            backup_id: entry.backup_id.clone(),
            taken: entry.taken,
            age_seconds: entry.age_seconds,
            size_bytes: entry.size_bytes,
            duration_seconds: entry.duration_seconds,
            api_downtime_seconds: entry.api_downtime_seconds,
        }
    }
}

/// The last result of one kind, as a row shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LastResult {
    pub finished: DateTime<Utc>,
    pub age_seconds: i64,
    pub passed: bool,
    pub summary: String,
    pub backup_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rto_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpo_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Runs of this kind recorded, and how many of them passed.
    pub runs: usize,
    pub passed_runs: usize,
}

/// One hosted cluster's row.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterPosture {
    pub namespace: String,
    pub hosted_cluster: String,
    pub status: Status,
    /// Why it is not green, worst first.
    pub reasons: Vec<String>,
    /// Facts worth a look that do not change the colour.
    pub notes: Vec<String>,
    /// Whether the management cluster given has it (`None`: none given or
    /// unreachable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_management_cluster: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest_good_backup: Option<BackupPoint>,
    pub complete_backups: usize,
    pub incomplete_backups: usize,
    /// The newest complete backups, oldest first (at most [`HISTORY`]).
    pub history: Vec<BackupPoint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_verify: Option<LastResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_drill: Option<LastResult>,
    /// The last restore or migration of one of its backups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_restore: Option<LastResult>,
}

/// What `hcp-dr report` prints.
#[derive(Debug, Clone, Serialize)]
pub struct PostureReport {
    pub generated: DateTime<Utc>,
    pub store: String,
    /// The copy stores read besides `store`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<String>,
    /// The management cluster read (its API server), when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub management_cluster: Option<String>,
    /// Why it could not be read: the report is from the store alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub management_cluster_error: Option<String>,
    pub thresholds: Thresholds,
    pub backup_amber_after_seconds: i64,
    pub backup_red_after_seconds: i64,
    pub red: usize,
    pub amber: usize,
    pub green: usize,
    pub clusters: Vec<ClusterPosture>,
    /// Records skipped, and anything else the report could not read.
    pub warnings: Vec<String>,
}

/// Build the report.
pub async fn report(options: &PostureOptions) -> Result<PostureReport, OpsError> {
    let (amber_after, red_after) = options.thresholds.backup_ages()?;
    let (management_cluster, management_cluster_error, live) = match &options.kubeconfig {
        None => (None, None, None),
        Some(path) => {
            if !path.is_file() {
                return Err(OpsError::Input(format!("--kubeconfig {}: no such file", path.display())));
            }
            match hosted_clusters_on(path, options.context.as_deref()).await {
                Ok((server, found)) => (Some(server), None, Some(found)),
                Err(err) => (None, Some(format!("the management cluster could not be read, so this report is from the store alone: {err}")), None),
            }
        }
    };
    if options.stores.is_empty() {
        return Err(OpsError::Input("--store is required: the store the backups are in".into()));
    }
    let mut stores = Vec::new();
    for url in &options.stores {
        stores.push(store::open(url, options.s3.clone()).await?);
    }
    let store_urls: Vec<String> = stores.iter().map(|s| s.url()).collect();
    let entries = match stores.as_slice() {
        [one] => backups::list(one.as_ref(), None).await?,
        _ => backups::list_across(&stores, None).await?,
    };
    // a record copied to several stores is one record
    let (mut records, mut warnings) = (Vec::new(), Vec::new());
    for store in &stores {
        let (found, skipped) = results::read_all(store.as_ref(), None).await?;
        warnings.extend(skipped);
        for record in found {
            if !records.contains(&record) {
                records.push(record);
            }
        }
    }
    records.sort_by(|a, b| a.finished.cmp(&b.finished));
    let now = Utc::now();

    let mut by_cluster: BTreeMap<(String, String), (Vec<BackupEntry>, Vec<ResultRecord>)> = BTreeMap::new();
    for entry in entries {
        by_cluster.entry((entry.namespace.clone(), entry.hosted_cluster.clone())).or_default().0.push(entry);
    }
    for record in records {
        by_cluster.entry((record.namespace.clone(), record.hosted_cluster.clone())).or_default().1.push(record);
    }
    if let Some(live) = &live {
        for key in live {
            by_cluster.entry(key.clone()).or_default();
        }
    }
    let facts = Facts { now, amber_after, red_after, thresholds: &options.thresholds, management: management_cluster.as_deref(), stores: &store_urls };
    let mut clusters: Vec<ClusterPosture> = by_cluster
        .into_iter()
        .map(|((ns, hc), (entries, records))| {
            let on = live.as_ref().map(|l| l.contains(&(ns.clone(), hc.clone())));
            facts.row(&ns, &hc, on, &entries, &records)
        })
        .collect();
    clusters.sort_by(|a, b| {
        a.status
            .cmp(&b.status)
            .then_with(|| b.newest_good_backup.is_none().cmp(&a.newest_good_backup.is_none()))
            .then_with(|| {
                let age = |c: &ClusterPosture| c.newest_good_backup.as_ref().map(|p| p.age_seconds).unwrap_or(i64::MAX);
                age(b).cmp(&age(a))
            })
            .then_with(|| (&a.namespace, &a.hosted_cluster).cmp(&(&b.namespace, &b.hosted_cluster)))
    });
    if clusters.is_empty() {
        warnings.push(format!("{} holds no backup and no result, and no management cluster was read: nothing to report", store_urls.join(", ")));
    }
    let count = |s: Status| clusters.iter().filter(|c| c.status == s).count();
    Ok(PostureReport {
        generated: now,
        store: store_urls[0].clone(),
        copies: store_urls[1..].to_vec(),
        management_cluster,
        management_cluster_error,
        thresholds: options.thresholds.clone(),
        backup_amber_after_seconds: amber_after,
        backup_red_after_seconds: red_after,
        red: count(Status::Red),
        amber: count(Status::Amber),
        green: count(Status::Green),
        clusters,
        warnings,
    })
}

/// Every HostedCluster on the management cluster, and its API server.
async fn hosted_clusters_on(kubeconfig: &std::path::Path, context: Option<&str>) -> Result<(String, std::collections::BTreeSet<(String, String)>), String> {
    let connected = crate::kube::connect(Some(&kubeconfig.to_string_lossy()), context).await.map_err(|e| e.to_string())?;
    let api = super::backup::hosted_clusters_api(&connected.client, None);
    let all = crate::kube::list_json(&api, &kube::api::ListParams::default(), "HostedClusters").await.map_err(|e| e.to_string())?;
    let found = all.iter().filter_map(super::backup::namespace_and_name).collect();
    Ok((connected.server.trim_end_matches('/').to_string(), found))
}

struct Facts<'a> {
    now: DateTime<Utc>,
    amber_after: i64,
    red_after: i64,
    thresholds: &'a Thresholds,
    management: Option<&'a str>,
    /// Every store read: with more than one, the newest backup must be in all.
    stores: &'a [String],
}

fn last_of(records: &[ResultRecord], kinds: &[Kind], now: DateTime<Utc>) -> Option<LastResult> {
    let of: Vec<&ResultRecord> = records.iter().filter(|r| kinds.contains(&r.kind)).collect();
    let last = of.last()?;
    Some(LastResult {
        finished: last.finished,
        age_seconds: (now - last.finished).num_seconds(),
        passed: last.passed,
        summary: last.summary.clone(),
        backup_id: last.backup_id.clone(),
        rto_seconds: last.rto_seconds,
        rpo_seconds: last.rpo_seconds,
        target: last.target.clone(),
        runs: of.len(),
        passed_runs: of.iter().filter(|r| r.passed).count(),
    })
}

impl Facts<'_> {
    /// One cluster's row: `entries` newest first, `records` oldest first.
    fn row(&self, ns: &str, hc: &str, on: Option<bool>, entries: &[BackupEntry], records: &[ResultRecord]) -> ClusterPosture {
        let complete: Vec<&BackupEntry> = entries.iter().filter(|e| e.complete).collect();
        let newest = complete.first().map(|e| BackupPoint::of(e));
        let mut history: Vec<BackupPoint> = complete.iter().take(HISTORY).map(|e| BackupPoint::of(e)).collect();
        history.reverse();
        let last_verify = last_of(records, &[Kind::Verify], self.now);
        let last_drill = last_of(records, &[Kind::Drill], self.now);
        let last_restore = last_of(records, &[Kind::Restore, Kind::Migrate], self.now);
        let mut red = Vec::new();
        let mut amber = Vec::new();
        let mut notes = Vec::new();
        let show = |s: i64| human_seconds(s as f64);
        match &newest {
            None if on == Some(true) => red.push(format!("runs on {} and no backup covers it", self.management.unwrap_or("the management cluster"))),
            None => red.push("no good backup".to_string()),
            Some(b) if b.age_seconds > self.red_after => {
                red.push(format!("newest good backup is {} old: stale after {}", show(b.age_seconds), show(self.red_after)))
            }
            Some(b) if b.age_seconds > self.amber_after => amber.push(format!(
                "newest good backup is {} old: a scheduled run (`{}`) is missing",
                show(b.age_seconds),
                self.thresholds.schedule
            )),
            Some(_) => {}
        }
        if let Some(b) = newest.as_ref().filter(|_| self.stores.len() > 1) {
            let missing: Vec<&str> = self.stores.iter().filter(|s| !b.stores.contains(s)).map(String::as_str).collect();
            if !missing.is_empty() {
                amber.push(format!(
                    "newest good backup is in {} of {} stores (not in {}): the off-site copy is behind",
                    self.stores.len() - missing.len(),
                    self.stores.len(),
                    missing.join(", ")
                ));
            }
        }
        match &last_drill {
            Some(d) if !d.passed => red.push(format!("last drill failed {} ago: {}", show(d.age_seconds), d.summary)),
            Some(d) if d.age_seconds > self.thresholds.drill_every.as_secs() as i64 => {
                amber.push(format!("last drill {} ago: drills are due every {}", show(d.age_seconds), crate::duration::show(self.thresholds.drill_every)))
            }
            Some(_) => {}
            None if newest.is_some() => amber.push("never drilled: no proof its backups restore".to_string()),
            None => {}
        }
        if let (Some(d), Some(target)) = (&last_drill, self.thresholds.rto_target) {
            if let Some(rto) = d.rto_seconds.filter(|rto| d.passed && *rto > target.as_secs_f64()) {
                amber.push(format!("last drill's RTO {} is over the {} target", human_seconds(rto), crate::duration::show(target)));
            }
        }
        if let Some(v) = last_verify.as_ref().filter(|v| !v.passed) {
            let of_newest = newest.as_ref().is_some_and(|n| n.backup_id == v.backup_id);
            let said = format!("backup {} failed its verify: {}", v.backup_id, v.summary);
            if of_newest { red.push(said) } else { amber.push(said) }
        }
        if let Some(r) = last_restore.as_ref().filter(|r| !r.passed) {
            notes.push(format!("last restore or migration did not finish: {}", r.summary));
        }
        let incomplete = entries.len() - complete.len();
        if incomplete > 0 {
            notes.push(format!("{incomplete} incomplete backup(s) in the store"));
        }
        if on == Some(false) {
            notes.push(format!("not on {}: backups only", self.management.unwrap_or("the management cluster")));
        }
        if let Some(fence) = entries.iter().find_map(|e| e.fence.as_ref()) {
            notes.push(format!("store fence: runs on {}", fence.runs_on.server));
        }
        let status = match (red.is_empty(), amber.is_empty()) {
            (false, _) => Status::Red,
            (true, false) => Status::Amber,
            (true, true) => Status::Green,
        };
        red.extend(amber);
        ClusterPosture {
            namespace: ns.to_string(),
            hosted_cluster: hc.to_string(),
            status,
            reasons: red,
            notes,
            on_management_cluster: on,
            newest_good_backup: newest,
            complete_backups: complete.len(),
            incomplete_backups: incomplete,
            history,
            last_verify,
            last_drill,
            last_restore,
        }
    }
}

/// The report as text: a summary line, then one block per cluster.
pub fn text(report: &PostureReport) -> String {
    let copies = if report.copies.is_empty() { String::new() } else { format!(" (copies: {})", report.copies.join(", ")) };
    let mut out = format!(
        "DR posture of {}{copies} at {}: {} red, {} amber, {} green\n",
        report.store,
        report.generated.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        report.red,
        report.amber,
        report.green
    );
    match (&report.management_cluster, &report.management_cluster_error) {
        (Some(server), _) => out.push_str(&format!("management cluster: {server} (every HostedCluster on it is listed)\n")),
        (None, Some(err)) => out.push_str(&format!("WARNING: {err}\n")),
        (None, None) => out.push_str("management cluster: not read (give --kubeconfig to list clusters no backup covers)\n"),
    }
    out.push_str(&format!(
        "thresholds: backups amber after {}, red after {} (schedule `{}`, stale after {}); drills every {}{}\n\n",
        human_seconds(report.backup_amber_after_seconds as f64),
        human_seconds(report.backup_red_after_seconds as f64),
        report.thresholds.schedule,
        report.thresholds.stale_after,
        crate::duration::show(report.thresholds.drill_every),
        report.thresholds.rto_target.map(|t| format!("; RTO target {}", crate::duration::show(t))).unwrap_or_default()
    ));
    for c in &report.clusters {
        out.push_str(&format!("{:<6} {}/{}\n", c.status.as_str().to_uppercase(), c.namespace, c.hosted_cluster));
        let backup = match &c.newest_good_backup {
            Some(b) => format!("{} ({} old, {}, {} complete)", b.backup_id, human_seconds(b.age_seconds as f64), crate::cli::report::human_bytes(b.size_bytes), c.complete_backups),
            None => "none".into(),
        };
        out.push_str(&format!("       newest good backup: {backup}\n"));
        out.push_str(&format!("       last verify: {}\n", last_line(c.last_verify.as_ref())));
        out.push_str(&format!("       last drill:  {}\n", last_line(c.last_drill.as_ref())));
        if let Some(r) = &c.last_restore {
            out.push_str(&format!("       last restore: {}\n", last_line(Some(r))));
        }
        for reason in &c.reasons {
            out.push_str(&format!("       - {reason}\n"));
        }
        for note in &c.notes {
            out.push_str(&format!("       note: {note}\n"));
        }
    }
    for w in &report.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

fn last_line(r: Option<&LastResult>) -> String {
    let Some(r) = r else { return "never".into() };
    let mut line = format!("{} {} ago", if r.passed { "passed" } else { "FAILED" }, human_seconds(r.age_seconds as f64));
    if let Some(rto) = r.rto_seconds {
        line.push_str(&format!(", RTO {}", human_seconds(rto)));
    }
    if let Some(rpo) = r.rpo_seconds {
        line.push_str(&format!(", RPO {}", human_seconds(rpo)));
    }
    line.push_str(&format!(" ({} of {} passed)", r.passed_runs, r.runs));
    line
}

#[cfg(test)]
mod tests;
