use super::*;

const HOUR: i64 = 3600;

fn thresholds() -> Thresholds {
    Thresholds {
        schedule: "0 */6 * * *".into(),
        stale_after: 2.0,
        drill_every: Duration::from_secs(30 * 86400),
        rto_target: Some(Duration::from_secs(600)),
    }
}

fn entry(hc: &str, age: i64, complete: bool, now: DateTime<Utc>) -> BackupEntry {
    let taken = now - chrono::Duration::seconds(age);
    BackupEntry {
        namespace: "clusters".into(),
        hosted_cluster: hc.into(),
        backup_id: format!("{}-0a1b2c", taken.format("%Y%m%dT%H%M%SZ")),
        url: String::new(),
        taken,
        age_seconds: age,
        complete,
        problem: None,
        size_bytes: 1 << 20,
        objects: 5,
        etcd_revision: Some(7),
        duration_seconds: Some(4.0),
        api_downtime_seconds: Some(2.0),
        cluster_uid: None,
        lineage: None,
        fence: None,
        fence_error: None,
        degraded: None,
        no_quorum: false,
        stores: Vec::new(),
        point_in_time: None,
    }
}

fn record(kind: Kind, hc: &str, backup_id: &str, age: i64, passed: bool, now: DateTime<Utc>) -> ResultRecord {
    let mut r = ResultRecord::new(kind, "clusters", hc, backup_id, now - chrono::Duration::seconds(age + 60), passed, format!("{} {}", kind.as_str(), if passed { "passed" } else { "FAILED at `wait`" }));
    r.finished = now - chrono::Duration::seconds(age);
    r.rto_seconds = Some(90.0);
    r.rpo_seconds = Some(600.0);
    r
}

#[test]
fn the_thresholds_follow_the_schedule_and_nonsense_is_refused() {
    assert_eq!(thresholds().backup_ages().unwrap(), (9 * HOUR, 12 * HOUR));
    let once = Thresholds { stale_after: 1.0, ..thresholds() };
    assert_eq!(once.backup_ages().unwrap(), (6 * HOUR, 6 * HOUR));
    for bad in [0.0, 0.5, f64::NAN, 101.0] {
        let err = Thresholds { stale_after: bad, ..thresholds() }.backup_ages().unwrap_err().to_string();
        assert!(err.contains("--stale-after"), "{err}");
    }
    let err = Thresholds { schedule: "every day".into(), ..thresholds() }.backup_ages().unwrap_err().to_string();
    assert!(err.contains("--schedule `every day`"), "{err}");
}

#[test]
fn each_row_is_coloured_by_its_worst_fact() {
    let now = Utc::now();
    let t = thresholds();
    let (amber_after, red_after) = t.backup_ages().unwrap();
    let stores = vec!["s3://a/hcp".to_string()];
    let facts = Facts { now, amber_after, red_after, thresholds: &t, management: Some("https://mgmt-a:6443"), stores: &stores };
    let fresh = entry("demo", HOUR, true, now);
    let id = fresh.backup_id.clone();

    let green = facts.row("clusters", "demo", Some(true), &[fresh.clone()], &[record(Kind::Drill, "demo", &id, HOUR, true, now)]);
    assert_eq!(green.status, Status::Green, "{:?}", green.reasons);
    assert_eq!(green.last_drill.as_ref().unwrap().rto_seconds, Some(90.0));

    let unbacked = facts.row("clusters", "new", Some(true), &[], &[]);
    assert_eq!(unbacked.status, Status::Red);
    assert_eq!(unbacked.reasons, ["runs on https://mgmt-a:6443 and no backup covers it"]);

    let stale = facts.row("clusters", "old", None, &[entry("old", 13 * HOUR, true, now)], &[record(Kind::Drill, "old", &id, HOUR, true, now)]);
    assert_eq!(stale.status, Status::Red);
    assert!(stale.reasons[0].starts_with("newest good backup is 13h 00m old: stale after 12h 00m"), "{:?}", stale.reasons);

    let late = facts.row("clusters", "late", None, &[entry("late", 10 * HOUR, true, now), entry("late", 0, false, now)], &[record(Kind::Drill, "late", &id, HOUR, true, now)]);
    assert_eq!(late.status, Status::Amber);
    assert!(late.reasons[0].contains("a scheduled run (`0 */6 * * *`) is missing"), "{:?}", late.reasons);
    assert_eq!(late.notes, ["1 incomplete backup(s) in the store"]);

    let undrilled = facts.row("clusters", "u", None, &[fresh.clone()], &[]);
    assert_eq!((undrilled.status, undrilled.reasons[0].as_str()), (Status::Amber, "never drilled: no proof its backups restore"));

    let overdue = facts.row("clusters", "o", None, &[fresh.clone()], &[record(Kind::Drill, "o", &id, 31 * 86400, true, now)]);
    assert_eq!(overdue.status, Status::Amber);
    assert!(overdue.reasons[0].contains("drills are due every 30d"), "{:?}", overdue.reasons);

    // the newest drill decides, not an older pass
    let failed = facts.row("clusters", "f", None, &[fresh.clone()], &[record(Kind::Drill, "f", &id, 2 * HOUR, true, now), record(Kind::Drill, "f", &id, HOUR, false, now)]);
    assert_eq!(failed.status, Status::Red);
    assert!(failed.reasons[0].starts_with("last drill failed 1h 00m ago: drill FAILED"), "{:?}", failed.reasons);
    assert_eq!((failed.last_drill.as_ref().unwrap().runs, failed.last_drill.as_ref().unwrap().passed_runs), (2, 1));

    let mut slow = record(Kind::Drill, "s", &id, HOUR, true, now);
    slow.rto_seconds = Some(900.0);
    let slow = facts.row("clusters", "s", None, &[fresh.clone()], &[slow]);
    assert_eq!(slow.status, Status::Amber);
    assert!(slow.reasons[0].contains("RTO 15m 00s is over the 10m target"), "{:?}", slow.reasons);

    // with a copy store: a newest backup missing from it is amber
    let two = vec!["s3://a/hcp".to_string(), "s3://b/hcp".to_string()];
    let copied = Facts { stores: &two, ..Facts { now, amber_after, red_after, thresholds: &t, management: None, stores: &stores } };
    let mut only_here = fresh.clone();
    only_here.stores = vec!["s3://a/hcp".into()];
    let behind = copied.row("clusters", "c", None, &[only_here.clone()], &[record(Kind::Drill, "c", &id, HOUR, true, now)]);
    assert_eq!(behind.status, Status::Amber);
    assert_eq!(behind.reasons, ["newest good backup is in 1 of 2 stores (not in s3://b/hcp): the off-site copy is behind"]);
    only_here.stores = two.clone();
    assert_eq!(copied.row("clusters", "c", None, &[only_here], &[record(Kind::Drill, "c", &id, HOUR, true, now)]).status, Status::Green);

    // a failed verify of the newest backup is red, of an older one amber
    let drill = record(Kind::Drill, "v", &id, HOUR, true, now);
    let bad_newest = facts.row("clusters", "v", None, &[fresh.clone()], &[drill.clone(), record(Kind::Verify, "v", &id, 60, false, now)]);
    assert_eq!(bad_newest.status, Status::Red);
    let bad_older = facts.row("clusters", "v", None, &[fresh.clone()], &[drill, record(Kind::Verify, "v", "20250101T000000Z-000000", 60, false, now)]);
    assert_eq!(bad_older.status, Status::Amber);
}

#[tokio::test]
async fn the_report_reads_the_store_worst_first_and_the_page_is_self_contained() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::LocalStore::new(dir.path().to_path_buf());
    let now = Utc::now();
    // a result for a cluster the store has no backup of, and a foreign file
    results::write(&store, &record(Kind::Drill, "gone<script>", "20250101T000000Z-000000", HOUR, true, now)).await.unwrap();
    std::fs::write(dir.path().join("clusters/gone<script>/results/x.json"), b"{").unwrap();
    let options = PostureOptions {
        stores: vec![dir.path().display().to_string()],
        s3: S3Options::default(),
        kubeconfig: None,
        context: None,
        thresholds: thresholds(),
    };
    let report = report(&options).await.unwrap();
    assert_eq!((report.red, report.amber, report.green), (1, 0, 0));
    assert_eq!(report.clusters[0].reasons, ["no good backup"]);
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert!(report.warnings[0].contains("x.json"), "{:?}", report.warnings);

    let page = html::page(&report);
    assert!(page.starts_with("<!doctype html>"));
    assert!(page.contains("content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\""));
    assert!(!page.contains("<script"), "names are escaped, and the page has no script");
    assert!(page.contains("gone&lt;script&gt;"));
    for external in ["http://", "https://", "src=", "@import", "url("] {
        assert!(!page.contains(external), "the page fetches nothing: {external}");
    }
    assert!(page.contains("data-status=\"red\""));
    let text = text(&report);
    assert!(text.starts_with(&format!("DR posture of {}", report.store)), "{text}");
    assert!(text.contains("RED    clusters/gone<script>\n"), "{text}");

    // a kubeconfig that is no file is bad input; an unreachable server is not
    let missing = PostureOptions { kubeconfig: Some(dir.path().join("nope")), ..options.clone() };
    assert!(matches!(report_err(&missing).await, Some(OpsError::Input(m)) if m.contains("nope: no such file")));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let unreachable = report_of(&PostureOptions { kubeconfig: Some(kubeconfig), ..options }).await;
    assert!(unreachable.management_cluster_error.as_deref().unwrap().starts_with("the management cluster could not be read, so this report is from the store alone"));
    assert!(html::page(&unreachable).contains("id=\"management-unreachable\""));
}

async fn report_err(options: &PostureOptions) -> Option<OpsError> {
    report(options).await.err()
}

async fn report_of(options: &PostureOptions) -> PostureReport {
    report(options).await.unwrap()
}

#[test]
fn a_chart_scales_its_points_and_labels_the_newest() {
    let chart = html::spark(&[1.0, 3.0, 2.0], |v| format!("{v}s"), "backup duration");
    assert!(chart.contains("points=\"2.0,25.0 60.0,3.0 118.0,14.0\""), "{chart}");
    assert!(chart.contains("aria-label=\"backup duration of the last 3 backups: newest 2s, from 1s to 3s\""), "{chart}");
    assert!(html::spark(&[], |v| v.to_string(), "x").contains("&ndash;"));
}
