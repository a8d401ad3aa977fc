//! The drill report: `<base>.json` (the result as `-o json` prints it) and
//! `<base>.md` (for people and tickets): verdict, RTO and RPO, every check,
//! the drill cluster's identity next to the source's, stage timings as a
//! bar chart, and what the rewrite dropped or kept. Nothing secret: names,
//! counts, revisions and times only.

use std::fmt::Write as _;
use std::path::Path;

use super::DrillResult;
use crate::pipeline::{RunOutcome, StageStatus};

/// `42.0s`, `3m 05s`, `2h 10m`, `3d 4h`.
pub fn human_seconds(seconds: f64) -> String {
    let s = seconds.max(0.0);
    let whole = s.round() as u64;
    match whole {
        _ if s < 60.0 => format!("{s:.1}s"),
        0..3600 => format!("{}m {:02}s", whole / 60, whole % 60),
        3600..86400 => format!("{}h {:02}m", whole / 3600, whole % 3600 / 60),
        _ => format!("{}d {}h", whole / 86400, whole % 86400 / 3600),
    }
}

/// One bar per stage, scaled to the longest (`width` characters).
pub fn bar_chart(stages: &[(String, f64)], width: usize) -> String {
    let longest = stages.iter().map(|(_, s)| *s).fold(0.0_f64, f64::max);
    let name_width = stages.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (name, seconds) in stages {
        let cells = if longest > 0.0 { (seconds / longest * width as f64).round() as usize } else { 0 };
        let bar = match cells {
            0 if *seconds > 0.0 => "▏".to_string(),
            n => "█".repeat(n),
        };
        let _ = writeln!(out, "{name:<name_width$}  {bar:<width$}  {}", human_seconds(*seconds));
    }
    out
}

fn verdict(result: &DrillResult) -> String {
    if result.passed {
        return "PASSED".into();
    }
    if result.aborted {
        return match &result.run.outcome {
            RunOutcome::UndoFailed { undo_errors, .. } => format!("ABORT FAILED: {}", undo_errors.join("; ")),
            _ => "ABORTED: what the drill created was removed".into(),
        };
    }
    match &result.run.outcome {
        RunOutcome::Planned => "PLANNED (dry run)".into(),
        RunOutcome::Succeeded => {
            let failed: Vec<&str> = result.failed_checks().iter().map(|c| c.name.as_str()).collect();
            if failed.is_empty() {
                "FAILED: the checks did not run".into()
            } else {
                format!("FAILED: check(s) {}", failed.join(", "))
            }
        }
        RunOutcome::RolledBack { stage, error } | RunOutcome::Stopped { stage, error } | RunOutcome::UndoFailed { stage, error, .. } => {
            format!("FAILED at `{stage}`: {error}")
        }
        RunOutcome::Failed { stage, error } => format!("FAILED at `{stage}`: {error} (nothing was created)"),
        RunOutcome::Aborted => "ABORTED: what the drill created was removed".into(),
    }
}

/// The headline: PASSED, or what failed.
pub fn headline(result: &DrillResult) -> String {
    format!("drill {}", verdict(result))
}

/// The stages that ran, with their seconds.
pub fn timings(result: &DrillResult) -> Vec<(String, f64)> {
    result
        .run
        .stages
        .iter()
        .filter(|s| !matches!(s.status, StageStatus::Skipped | StageStatus::Planned { .. }))
        .map(|s| (s.name.clone(), s.duration.as_secs_f64()))
        .collect()
}

fn or_unknown(value: Option<f64>) -> String {
    value.map(human_seconds).unwrap_or_else(|| "not measured".into())
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The Markdown report.
pub fn markdown(result: &DrillResult) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Restore drill of {}: {}\n", result.source, verdict(result));
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| backup | `{}` |", result.backup);
    if let Some(taken) = result.backup_taken {
        let _ = writeln!(md, "| backup taken | {} |", taken.to_rfc3339());
    }
    if let Some(point) = &result.point_in_time {
        let _ = writeln!(md, "| point in time | {} |", cell(&point.describe()));
    }
    let _ = writeln!(md, "| drill started | {} |", result.started.to_rfc3339());
    let _ = writeln!(md, "| **RTO** (drill start to Available) | {} |", or_unknown(result.rto_seconds));
    let _ = writeln!(md, "| **RPO** (backup age at the drill's start) | {} |", or_unknown(result.rpo_seconds));
    let _ = writeln!(md, "| drill cluster | `{}`: {} |", result.drill, result.drill_cluster.describe());
    if let Some(remove) = &result.remove_with {
        let _ = writeln!(md, "| remove it with | `{remove}` |");
    }
    if let Some(journal) = &result.run.journal {
        let _ = writeln!(md, "| journal | `{journal}` |");
    }

    let _ = writeln!(md, "\n## Checks\n");
    if result.checks.is_empty() {
        let _ = writeln!(md, "No check ran: the drill stopped before `checks`.");
    } else {
        let _ = writeln!(md, "| check | result | detail |\n|---|---|---|");
        for check in &result.checks {
            let _ = writeln!(md, "| {} | {} | {} |", check.name, if check.passed { "pass" } else { "**FAIL**" }, cell(&check.detail));
        }
    }

    if let Some(rewrite) = &result.rewrite {
        let _ = writeln!(md, "\n## Identity\n");
        let _ = writeln!(md, "| | source | drill |\n|---|---|---|");
        let _ = writeln!(md, "| HostedCluster | `{}` | `{}` |", rewrite.hosted_cluster.from, rewrite.hosted_cluster.to);
        let _ = writeln!(md, "| HCP namespace | `{}` | `{}` |", rewrite.hcp_namespace.from, rewrite.hcp_namespace.to);
        if let (Some(uid), Some(lineage)) = (&result.source_uid, &result.lineage) {
            let _ = writeln!(md, "| UID, lineage | `{uid}`, lineage `{lineage}` | its own UID; a copy of the data under the same etcd encryption key |");
        }
        let unset = |v: &str| if v.is_empty() { "(not set)".to_string() } else { format!("`{v}`") };
        let _ = writeln!(md, "| clusterID | {} | `{}` |", unset(&rewrite.cluster_id.from), rewrite.cluster_id.to);
        let _ = writeln!(md, "| infraID | {} | `{}` |", unset(&rewrite.infra_id.from), rewrite.infra_id.to);
        for host in &rewrite.hostnames {
            let _ = writeln!(md, "| hostname | `{}` | `{}` |", host.from, host.to);
        }
        let _ = writeln!(
            md,
            "\nDNS: every hostname the backup publishes was changed, so the drill cluster never claims the source's DNS records. {} objects replayed, {} values rewritten.",
            rewrite.objects.len(),
            rewrite.values_rewritten
        );
        if !rewrite.dropped.is_empty() {
            let _ = writeln!(md, "\nNot replayed:\n");
            for d in &rewrite.dropped {
                let _ = writeln!(md, "- {} ({}: {})", d.what, d.rule, d.reason);
            }
        }
        if !rewrite.kept.is_empty() {
            let _ = writeln!(md, "\nKept as backed up:\n");
            for k in &rewrite.kept {
                let _ = writeln!(md, "- {} `{}` = `{}`: {}", k.object, k.path, k.value, k.reason);
            }
        }
    }

    let _ = writeln!(md, "\n## Stage timings\n\n```text\n{}```", bar_chart(&timings(result), 40));
    for stage in &result.run.stages {
        match &stage.status {
            StageStatus::Failed { error } => {
                let _ = writeln!(md, "\n`{}` failed: {}", stage.name, error);
            }
            StageStatus::UndoFailed { error } => {
                let _ = writeln!(md, "\n`{}`: undo FAILED: {}", stage.name, error);
            }
            _ => {}
        }
    }
    for warning in &result.warnings {
        let _ = writeln!(md, "\nwarning: {warning}");
    }
    md
}

/// `<base>.<extension>` (added, never replacing a dot already in the name).
fn with_suffix(base: &Path, extension: &str) -> std::path::PathBuf {
    let mut name = base.as_os_str().to_owned();
    name.push(".");
    name.push(extension);
    name.into()
}

/// Write `<base>.md` and `<base>.json`; returns their paths.
pub fn write(base: &Path, result: &DrillResult) -> std::io::Result<Vec<String>> {
    let (md, json) = (with_suffix(base, "md"), with_suffix(base, "json"));
    let mut value = serde_json::to_value(result).map_err(std::io::Error::other)?;
    let files = vec![md.display().to_string(), json.display().to_string()];
    value["report_files"] = serde_json::json!(files);
    std::fs::write(&md, markdown(result))?;
    std::fs::write(&json, serde_json::to_string_pretty(&value).map_err(std::io::Error::other)? + "\n")?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::drill::DrillCluster;
    use crate::pipeline::{RunReport, StageReport};
    use crate::stages::drill::checks::CheckResult;
    use std::time::Duration;

    fn result(checks: Vec<CheckResult>) -> DrillResult {
        let stage = |name: &str, s: f64| StageReport { name: name.into(), status: StageStatus::Succeeded, duration: Duration::from_secs_f64(s), output: None };
        let passed = checks.iter().all(|c| c.passed);
        DrillResult {
            run: RunReport { operation: "drill".into(), outcome: RunOutcome::Succeeded, stages: vec![stage("verify", 2.0), stage("wait", 40.0), stage("teardown", 0.0)], journal: None },
            passed,
            backup: "s3://b/clusters/demo/20261121T180000Z-0a1b2c".into(),
            source: "clusters/demo".into(),
            source_uid: None,
            lineage: None,
            drill: "clusters-drill/demo-drill".into(),
            rto_seconds: Some(75.0),
            rpo_seconds: Some(3600.0 * 5.0 + 60.0),
            backup_taken: None,
            started: chrono::Utc::now(),
            checks,
            rewrite: None,
            drill_cluster: DrillCluster::Removed,
            remove_with: None,
            aborted: false,
            point_in_time: None,
            report_files: Vec::new(),
            recorded: None,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn durations_for_people() {
        assert_eq!(human_seconds(4.25), "4.2s");
        assert_eq!(human_seconds(75.0), "1m 15s");
        assert_eq!(human_seconds(18060.0), "5h 01m");
        assert_eq!(human_seconds(2.0 * 86400.0 + 7200.0), "2d 2h");
    }

    #[test]
    fn the_chart_scales_to_the_longest_stage() {
        let chart = bar_chart(&[("verify".into(), 1.0), ("wait".into(), 4.0), ("rewrite".into(), 0.001)], 8);
        let lines: Vec<&str> = chart.lines().collect();
        assert!(lines[0].starts_with("verify   ██  "), "{chart}");
        assert!(lines[1].starts_with("wait     ████████  4.0s"), "{chart}");
        assert!(lines[2].starts_with("rewrite  ▏"), "{chart}");
    }

    #[test]
    fn a_failed_check_fails_the_report_by_name() {
        let ok = result(vec![CheckResult { name: "etcd revision etcd-0".into(), passed: true, detail: "revision 20, the backup's 14".into() }]);
        let md = markdown(&ok);
        assert!(md.starts_with("# Restore drill of clusters/demo: PASSED"), "{md}");
        assert!(md.contains("| **RTO** (drill start to Available) | 1m 15s |"), "{md}");
        assert!(md.contains("| **RPO** (backup age at the drill's start) | 5h 01m |"), "{md}");
        assert!(md.contains("| etcd revision etcd-0 | pass | revision 20, the backup's 14 |"), "{md}");
        assert!(md.contains("wait      ████████████████████████████████████████  40.0s"), "{md}");
        let bad = result(vec![
            CheckResult { name: "etcd revision etcd-0".into(), passed: true, detail: "ok".into() },
            CheckResult { name: "hosted API samples".into(), passed: false, detail: "/kubernetes.io/secrets/w/s | is missing".into() },
        ]);
        assert_eq!(headline(&bad), "drill FAILED: check(s) hosted API samples");
        let md = markdown(&bad);
        assert!(md.contains("| hosted API samples | **FAIL** | /kubernetes.io/secrets/w/s \\| is missing |"), "{md}");
    }
}
