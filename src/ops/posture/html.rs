//! The report as one self-contained HTML page: inline CSS and SVG, no
//! script, no font, nothing fetched (its Content-Security-Policy forbids
//! it, so a browser says so if anything ever tries). Red, amber and green
//! rows, worst first; each row's reasons in words; the size and duration of
//! each cluster's recent backups as small charts. Printable.

use std::fmt::Write as _;

use super::{ClusterPosture, LastResult, PostureReport};
use crate::cli::report::human_bytes;
use crate::ops::drill::report::human_seconds;

/// Text safe inside HTML elements and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = r#"
:root { --red: #b71c1c; --red-bg: #fdecea; --amber: #9a5b00; --amber-bg: #fff4e0; --green: #1b5e20; --green-bg: #e8f5e9; --ink: #1f2328; --muted: #59636e; --line: #d0d7de; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--ink); background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
.meta, .thresholds { color: var(--muted); margin: 2px 0; }
.tiles { display: flex; gap: 12px; margin: 16px 0; }
.tile { flex: 0 0 150px; padding: 10px 14px; border-radius: 8px; border: 1px solid var(--line); }
.tile b { display: block; font-size: 30px; line-height: 1.1; }
.tile.red { background: var(--red-bg); color: var(--red); border-color: var(--red); }
.tile.amber { background: var(--amber-bg); color: var(--amber); border-color: var(--amber); }
.tile.green { background: var(--green-bg); color: var(--green); border-color: var(--green); }
.warning { background: var(--amber-bg); border-left: 4px solid var(--amber); padding: 6px 10px; margin: 6px 0; }
table { border-collapse: collapse; width: 100%; margin-top: 8px; }
th { text-align: left; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); border-bottom: 2px solid var(--line); padding: 6px 8px; }
td { vertical-align: top; border-bottom: 1px solid var(--line); padding: 8px; }
tr.red td:first-child { border-left: 6px solid var(--red); }
tr.amber td:first-child { border-left: 6px solid var(--amber); }
tr.green td:first-child { border-left: 6px solid var(--green); }
.pill { display: inline-block; min-width: 58px; text-align: center; font-weight: 700; font-size: 12px; padding: 2px 8px; border-radius: 10px; }
.pill.red { background: var(--red); color: #fff; }
.pill.amber { background: var(--amber); color: #fff; }
.pill.green { background: var(--green); color: #fff; }
.name { font-weight: 600; }
.small { color: var(--muted); font-size: 12px; }
.pass { color: var(--green); font-weight: 600; }
.fail { color: var(--red); font-weight: 600; }
.none { color: var(--muted); }
ul.reasons { margin: 0; padding-left: 16px; }
ul.reasons li.note { color: var(--muted); list-style: circle; }
svg.spark { display: block; }
footer { margin-top: 18px; color: var(--muted); font-size: 12px; }
@media print {
  body { padding: 0; font-size: 11px; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  tr { break-inside: avoid; }
}
"#;

/// The page.
pub fn page(report: &PostureReport) -> String {
    let mut html = String::new();
    let title = format!("DR posture: {} red, {} amber, {} green", report.red, report.amber, report.green);
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>hcp-dr {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(&title)
    );
    let _ = writeln!(html, "<header>\n<h1>Hosted cluster DR posture</h1>");
    let _ = writeln!(
        html,
        "<p class=\"meta\">Store <code>{}</code>{} &middot; generated {}</p>",
        escape(&report.store),
        report.copies.iter().map(|c| format!(", copy <code>{}</code>", escape(c))).collect::<String>(),
        escape(&report.generated.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
    );
    match (&report.management_cluster, &report.management_cluster_error) {
        (Some(server), _) => {
            let _ = writeln!(html, "<p class=\"meta\">Management cluster <code>{}</code>: every HostedCluster on it has a row.</p>", escape(server));
        }
        (None, Some(err)) => {
            let _ = writeln!(html, "<p class=\"warning\" id=\"management-unreachable\">{}</p>", escape(err));
        }
        (None, None) => {
            let _ = writeln!(html, "<p class=\"meta\">No management cluster read: clusters no backup covers are not listed (give <code>--kubeconfig</code>).</p>");
        }
    }
    let _ = writeln!(
        html,
        "<div class=\"tiles\"><div class=\"tile red\" id=\"count-red\"><b>{}</b>red</div><div class=\"tile amber\" id=\"count-amber\"><b>{}</b>amber</div><div class=\"tile green\" id=\"count-green\"><b>{}</b>green</div></div>",
        report.red, report.amber, report.green
    );
    let t = &report.thresholds;
    let _ = writeln!(
        html,
        "<p class=\"thresholds\">Red: no good backup, newest older than {} (<code>--stale-after {}</code> &times; the longest gap of <code>{}</code>), last drill failed, newest backup failed its verify. \
         Amber: newest older than {}, no passed drill within {} (<code>--drill-every</code>){}.</p>",
        escape(&human_seconds(report.backup_red_after_seconds as f64)),
        t.stale_after,
        escape(&t.schedule),
        escape(&human_seconds(report.backup_amber_after_seconds as f64)),
        escape(&crate::duration::show(t.drill_every)),
        t.rto_target.map(|r| format!(", drill RTO over {} (<code>--rto-target</code>)", escape(&crate::duration::show(r)))).unwrap_or_default()
    );
    for w in &report.warnings {
        let _ = writeln!(html, "<p class=\"warning\">{}</p>", escape(w));
    }
    let _ = writeln!(html, "</header>\n<main>");
    if report.clusters.is_empty() {
        let _ = writeln!(html, "<p>No hosted cluster to report.</p>");
    } else {
        let _ = writeln!(
            html,
            "<table>\n<thead><tr><th>Status</th><th>Hosted cluster</th><th>Newest good backup</th><th>Last verify</th><th>Last drill</th><th>Backup size</th><th>Backup duration</th><th>Why</th></tr></thead>\n<tbody>"
        );
        for c in &report.clusters {
            row(&mut html, c);
        }
        let _ = writeln!(html, "</tbody>\n</table>");
    }
    let _ = writeln!(
        html,
        "</main>\n<footer>Written by hcp-dr {} (<code>hcp-dr report -o html</code>). RTO: drill start to the restored cluster Available. RPO: the backup's age when the drill started.</footer>\n</body>\n</html>",
        env!("CARGO_PKG_VERSION")
    );
    html
}

fn row(html: &mut String, c: &ClusterPosture) {
    let id = format!("cluster-{}-{}", c.namespace, c.hosted_cluster);
    let class = c.status.as_str();
    let _ = writeln!(html, "<tr class=\"{class}\" id=\"{}\" data-status=\"{class}\">", escape(&id));
    let _ = writeln!(html, "<td><span class=\"pill {class}\">{}</span></td>", class.to_uppercase());
    let name = format!("<span class=\"name\">{}</span><br><span class=\"small\">{}</span>", escape(&c.hosted_cluster), escape(&c.namespace));
    let _ = writeln!(html, "<td>{name}</td>");
    let backup = match &c.newest_good_backup {
        Some(b) => format!(
            "{} old<br><span class=\"small\">{} &middot; {} backup{}{}</span>",
            escape(&human_seconds(b.age_seconds as f64)),
            escape(&b.taken.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            c.complete_backups,
            if c.complete_backups == 1 { "" } else { "s" },
            if c.incomplete_backups > 0 { format!(", {} incomplete", c.incomplete_backups) } else { String::new() }
        ) + &if b.stores.is_empty() { String::new() } else { format!("<br><span class=\"small\">in {} store(s)</span>", b.stores.len()) },
        None => "<span class=\"fail\">none</span>".into(),
    };
    let _ = writeln!(html, "<td>{backup}</td>");
    let _ = writeln!(html, "<td>{}</td>", result_cell(c.last_verify.as_ref(), false));
    let _ = writeln!(html, "<td>{}</td>", result_cell(c.last_drill.as_ref(), true));
    let sizes: Vec<f64> = c.history.iter().map(|b| b.size_bytes as f64).collect();
    let durations: Vec<f64> = c.history.iter().filter_map(|b| b.duration_seconds).collect();
    let _ = writeln!(html, "<td>{}</td>", spark(&sizes, |v| human_bytes(v as u64), "backup size"));
    let _ = writeln!(html, "<td>{}</td>", spark(&durations, human_seconds, "backup duration"));
    let mut why = String::from("<ul class=\"reasons\">");
    for r in &c.reasons {
        let _ = write!(why, "<li>{}</li>", escape(r));
    }
    for n in &c.notes {
        let _ = write!(why, "<li class=\"note\">{}</li>", escape(n));
    }
    why.push_str("</ul>");
    if c.reasons.is_empty() && c.notes.is_empty() {
        why = "<span class=\"pass\">recent backup, drill passed</span>".into();
    }
    let _ = writeln!(html, "<td>{why}</td>\n</tr>");
}

fn result_cell(r: Option<&LastResult>, with_times: bool) -> String {
    let Some(r) = r else { return "<span class=\"none\">never</span>".into() };
    let verdict = if r.passed { "<span class=\"pass\">passed</span>" } else { "<span class=\"fail\">FAILED</span>" };
    let mut cell = format!("{verdict} {} ago", escape(&human_seconds(r.age_seconds as f64)));
    if with_times {
        if let Some(rto) = r.rto_seconds {
            let _ = write!(cell, "<br>RTO {}", escape(&human_seconds(rto)));
        }
        if let Some(rpo) = r.rpo_seconds {
            let _ = write!(cell, " &middot; RPO {}", escape(&human_seconds(rpo)));
        }
    }
    let _ = write!(cell, "<br><span class=\"small\">{} of {} passed</span>", r.passed_runs, r.runs);
    if !r.passed {
        let _ = write!(cell, "<br><span class=\"small\">{}</span>", escape(&r.summary));
    }
    cell
}

/// A small line chart of `values` (oldest first), with the newest value
/// written beside it.
pub fn spark(values: &[f64], show: impl Fn(f64) -> String, what: &str) -> String {
    const W: f64 = 120.0;
    const H: f64 = 28.0;
    let Some(&last) = values.last() else { return "<span class=\"none\">&ndash;</span>".into() };
    let (lo, hi) = values.iter().fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let span = if hi > lo { hi - lo } else { 1.0 };
    let x = |i: usize| if values.len() > 1 { 2.0 + (W - 4.0) * i as f64 / (values.len() - 1) as f64 } else { W / 2.0 };
    let y = |v: f64| if hi > lo { H - 3.0 - (H - 6.0) * (v - lo) / span } else { H / 2.0 };
    let points: Vec<String> = values.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v))).collect();
    let label = format!("{what} of the last {} backups: newest {}, from {} to {}", values.len(), show(last), show(lo), show(hi));
    format!(
        "<svg class=\"spark\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{l}\"><title>{l}</title>\
         <polyline fill=\"none\" stroke=\"#57606a\" stroke-width=\"1.5\" points=\"{}\"/><circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"#1f2328\"/></svg>\
         <span class=\"small\">{}</span>",
        points.join(" "),
        x(values.len() - 1),
        y(last),
        escape(&show(last)),
        l = escape(&label)
    )
}
