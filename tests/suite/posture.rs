//! `hcp-dr report`: after a backup, a verify and a drill on the sandbox,
//! the fleet's posture from the S3 store and mgmt-a, as text, JSON and the
//! HTML page, rendered by Debian's headless Chromium: demo green, a
//! cluster never drilled amber, a HostedCluster no backup covers red and
//! first, no console error.

use crate::support;

use std::path::Path;
use std::process::Command;

use hcp_dr_e2e::sandbox::{HostedClusterSpec, create_all};
use serde_json::Value;
use support::*;

/// Chromium, or None when it is not installed (CI installs it: there a
/// missing one fails).
fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()));
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "chromium is not installed: e2e/setup installs Debian's chromium package");
        println!("skipped the browser checks: chromium is not installed (e2e/setup installs Debian's chromium package)");
    }
    found
}

/// Headless Chromium on `page`: the DOM it built, and the console lines it logged.
fn render(browser: &str, page: &Path, screenshot: &Path) -> (String, Vec<String>) {
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}", page.display());
    let common = [
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--no-first-run".into(),
        // no background requests: this machine's network is closed
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--disable-quic".into(),
        format!("--user-data-dir={}", profile.path().display()),
        "--enable-logging=stderr".into(),
        "--v=0".into(),
    ];
    let dom = Command::new(browser).args(&common).args(["--dump-dom", &url]).output().expect("run chromium");
    assert!(dom.status.success(), "chromium --dump-dom: {}", String::from_utf8_lossy(&dom.stderr));
    let shot = Command::new(browser)
        .args(&common)
        .args([&format!("--screenshot={}", screenshot.display()), "--window-size=1400,900", "--hide-scrollbars", &url])
        .output()
        .expect("run chromium");
    assert!(shot.status.success(), "chromium --screenshot: {}", String::from_utf8_lossy(&shot.stderr));
    let console = [&dom.stderr, &shot.stderr]
        .iter()
        .flat_map(|e| String::from_utf8_lossy(e).lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect::<Vec<_>>())
        .collect();
    (String::from_utf8_lossy(&dom.stdout).into_owned(), console)
}

/// The RGB pixels of a PNG Chromium wrote (8-bit RGB or RGBA, not interlaced).
fn png_pixels(path: &Path) -> Vec<[u8; 3]> {
    use std::io::Read;
    let bytes = std::fs::read(path).expect("screenshot");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (mut at, mut idat, mut width, mut channels) = (8, Vec::new(), 0usize, 0usize);
    while at + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = &bytes[at + 4..at + 8];
        let data = &bytes[at + 8..at + 8 + len];
        match kind {
            b"IHDR" => {
                width = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
                assert_eq!((data[8], data[12]), (8, 0), "8-bit, not interlaced");
                channels = match data[9] {
                    2 => 3,
                    6 => 4,
                    other => panic!("PNG colour type {other}"),
                };
            }
            b"IDAT" => idat.extend_from_slice(data),
            _ => {}
        }
        at += 12 + len;
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&idat[..]).read_to_end(&mut raw).expect("inflate");
    let stride = width * channels;
    let mut previous = vec![0u8; stride];
    let mut pixels = Vec::new();
    for line in raw.chunks(stride + 1) {
        let (filter, data) = (line[0], &line[1..]);
        let mut row = vec![0u8; stride];
        for i in 0..stride {
            let a = if i >= channels { row[i - channels] as i16 } else { 0 };
            let b = previous[i] as i16;
            let c = if i >= channels { previous[i - channels] as i16 } else { 0 };
            let predicted = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => (a + b) / 2,
                4 => {
                    let p = a + b - c;
                    let (pa, pb, pc) = ((p - a).abs(), (p - b).abs(), (p - c).abs());
                    if pa <= pb && pa <= pc { a } else if pb <= pc { b } else { c }
                }
                other => panic!("PNG filter {other}"),
            };
            row[i] = data[i].wrapping_add(predicted as u8);
        }
        pixels.extend(row.chunks(channels).map(|p| [p[0], p[1], p[2]]));
        previous = row;
    }
    pixels
}

fn report(env: &Env, extra: &[&str]) -> std::process::Output {
    let store = format!("s3://{}/backups", hcp_dr_e2e::sandbox::BUCKET);
    let mut args = vec!["report", "--store", &store, "--s3-endpoint", env.sandbox.s3.https_url()];
    args.extend(extra);
    env.hcp_dr(&args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_shows_demo_green_after_a_drill_and_an_unbacked_cluster_red() {
    let env = env("SingleReplica").await;
    // a HostedCluster no backup covers (its control plane need not come up)
    let mut spec = HostedClusterSpec::demo();
    spec.name = "unbacked".into();
    spec.availability = "SingleReplica".into();
    let objects: Vec<Value> = spec.objects().into_iter().filter(|o| o["kind"] == "HostedCluster").collect();
    create_all(&env.mgmt, &objects).await.expect("create unbacked");

    // backed up, never drilled
    add_clusters(&env, &["undrilled"]).await;
    let mut args = vec!["backup", "--hosted-cluster", "undrilled"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));

    // demo: a few backups (their sizes and durations are charted), the newest verified and drilled
    for _ in 0..2 {
        backup_to_s3(&env);
    }
    let (folder, _) = backup_to_s3(&env);
    let endpoint = env.sandbox.s3.https_url().to_string();
    let out = env.hcp_dr(&["backups", "verify", &folder, "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let verified = json_report(&out);
    let recorded = verified["recorded"].as_str().expect("the verify recorded its result");
    assert!(recorded.starts_with("s3://") && recorded.contains("/clusters/demo/results/") && recorded.ends_with(".json"), "{recorded}");
    let staging = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let metrics = env.dir.path().join("drill.prom");
    let out = env.hcp_dr(
        &["drill", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &staging, "--wait", "5m", "--metrics-file", metrics.to_str().unwrap(), "-o", "json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let drill = json_report(&out);
    assert_eq!(drill["passed"], true, "{drill:#}");
    assert!(drill["recorded"].as_str().is_some_and(|r| r.contains("-drill-")), "{drill:#}");
    // the drill's series, as the drill alerts read them
    let prom = std::fs::read_to_string(&metrics).expect("the drill's metrics file");
    assert!(prom.contains("hcp_dr_drill_last_success{namespace=\"clusters\",hosted_cluster=\"demo\"} 1\n"), "{prom}");
    let rto = prom.lines().find_map(|l| l.strip_prefix("hcp_dr_drill_last_rto_seconds{namespace=\"clusters\",hosted_cluster=\"demo\"} ")).and_then(|v| v.parse::<f64>().ok());
    assert_eq!(rto, drill["rto_seconds"].as_f64(), "{prom}");
    crate::monitoring::drill_rules_fire_on_hcp_drs_own_series(&prom);

    // JSON: worst first, the drill's own RTO and RPO
    let mgmt_a = env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string();
    let out = report(&env, &["--kubeconfig", &mgmt_a, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let posture = json_report(&out);
    let rows = posture["clusters"].as_array().unwrap();
    let names: Vec<(&str, &str)> = rows.iter().map(|r| (r["hosted_cluster"].as_str().unwrap(), r["status"].as_str().unwrap())).collect();
    assert_eq!(names, [("unbacked", "red"), ("undrilled", "amber"), ("demo", "green")], "{posture:#}");
    assert_eq!(rows[1]["reasons"], serde_json::json!(["never drilled: no proof its backups restore"]));
    assert_eq!(rows[0]["reasons"][0].as_str().unwrap(), format!("runs on {} and no backup covers it", env.sandbox.clusters[0].api.url()));
    let demo = &rows[2];
    assert_eq!(demo["history"].as_array().unwrap().len(), 3);
    assert_eq!(demo["last_drill"]["passed"], true);
    assert_eq!(demo["last_drill"]["rto_seconds"], drill["rto_seconds"]);
    assert_eq!(demo["last_drill"]["rpo_seconds"], drill["rpo_seconds"]);
    assert_eq!(demo["last_verify"]["passed"], true);
    assert_eq!(demo["newest_good_backup"]["backup_id"].as_str(), folder.rsplit('/').next());
    assert_eq!((posture["red"].as_u64(), posture["amber"].as_u64(), posture["green"].as_u64()), (Some(1), Some(1), Some(1)));

    // HTML, in a real browser
    let page = env.dir.path().join("posture.html");
    let out = report(&env, &["--kubeconfig", &mgmt_a, "-o", "html", "--output-file", page.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 red, 1 amber, 1 green"), "{}", text(&out));
    if let Some(browser) = chromium() {
        let shot = std::env::var_os("HCP_DR_REPORT_SCREENSHOT").map(std::path::PathBuf::from).unwrap_or_else(|| env.dir.path().join("posture.png"));
        let (dom, console) = render(browser, &page, &shot);
        assert!(console.is_empty(), "the page logged to the console:\n{}", console.join("\n"));
        let red = dom.find("id=\"cluster-clusters-unbacked\" data-status=\"red\"").expect("the unbacked cluster's row is red");
        let amber = dom.find("id=\"cluster-clusters-undrilled\" data-status=\"amber\"").expect("the undrilled cluster's row is amber");
        let green = dom.find("id=\"cluster-clusters-demo\" data-status=\"green\"").expect("demo's row is green");
        assert!(red < amber && amber < green, "worst first");
        assert!(dom.contains("<polyline"), "demo's backups are charted");
        // the colours were painted: the red and green status pills are in the screenshot
        let pixels = png_pixels(&shot);
        for (name, colour) in [("red", [0xb7, 0x1c, 0x1c]), ("amber", [0x9a, 0x5b, 0x00]), ("green", [0x1b, 0x5e, 0x20])] {
            let painted = pixels.iter().filter(|p| **p == colour).count();
            assert!(painted > 200, "{painted} {name} pixels in the screenshot");
        }
    }

    // text: the same verdicts for a terminal
    let out = report(&env, &["--kubeconfig", &mgmt_a]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("1 red, 1 amber, 1 green") && said.contains("RED    clusters/unbacked") && said.contains("AMBER  clusters/undrilled") && said.contains("GREEN  clusters/demo"), "{said}");

    // a foreign and a truncated record are skipped by name; an unreachable
    // management cluster leaves the report to the store, saying so
    let results = env.sandbox.s3.root().join(hcp_dr_e2e::sandbox::BUCKET).join("backups/clusters/demo/results");
    std::fs::write(results.join("foreign.json"), b"{\"kind\": \"audit\"}").unwrap();
    let stored = std::fs::read_dir(&results).unwrap().filter_map(Result::ok).find(|e| e.file_name().to_string_lossy().contains("-drill-")).unwrap().path();
    let whole = std::fs::read(&stored).unwrap();
    std::fs::write(results.join("20261129T000000Z-drill-000000.json"), &whole[..whole.len() / 2]).unwrap();
    let dead = env.dir.path().join("dead.kubeconfig");
    std::fs::write(
        &dead,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let out = report(&env, &["--kubeconfig", dead.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let alone = json_report(&out);
    assert!(alone["management_cluster_error"].as_str().unwrap().contains("from the store alone"), "{alone:#}");
    let warnings: Vec<&str> = alone["warnings"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("foreign.json")) && warnings.iter().any(|w| w.contains("20261129T000000Z-drill-000000.json")), "{warnings:?}");
    let known: Vec<&str> = alone["clusters"].as_array().unwrap().iter().map(|c| c["hosted_cluster"].as_str().unwrap()).collect();
    assert_eq!(known, ["undrilled", "demo"], "only what the store knows: {alone:#}");

    // thresholds that make no sense, and -o html elsewhere: exit 2
    for (args, says) in [
        (vec!["--stale-after", "0.5"], "--stale-after 0.5"),
        (vec!["--drill-every", "5m"], "`5m` is too short"),
        (vec!["--schedule", "every day"], "--schedule `every day`"),
        (vec!["--output-file", "/nonexistent/dir/x.html"], "/nonexistent/dir does not exist"),
    ] {
        let out = report(&env, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    let out = env.hcp_dr(&["backups", "list", "--store", "/tmp", "-o", "html"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("-o html is for `hcp-dr report` only"), "{}", text(&out));
}
