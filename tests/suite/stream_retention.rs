//! Stream chains through `hcp-dr backups`: `list` shows each cluster's
//! restorable windows and the gaps between them, `verify` checks the
//! chains (a tampered and a deleted segment named, with the revision the
//! chain is good through), `prune` removes old ended chains whole and
//! never the newest. The chains are written by the stream's own writer
//! into a local store, without etcd: what is checked here is what the
//! store holds, not how the stream got it (tests/suite/stream.rs does).

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use hcp_dr::store::{Hasher, LocalStore, Store};
use hcp_dr::stream::format::{Bytes, ChainLayout, Event, RevisionRecord};
use hcp_dr::stream::writer::{ChainWriter, Cut};

use crate::support::{files, json_report, text};

const NS: &str = "clusters";
const HC: &str = "demo";

/// A chain `id` in the store at `root`: a base at `base` taken at
/// `taken`, then one revision per segment through `last`, every file
/// dated `taken` plus a second per revision.
async fn chain(root: &Path, id: &str, base: i64, last: i64, taken: DateTime<Utc>) -> ChainLayout {
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(root));
    let layout = ChainLayout::new(NS, HC, id);
    let snapshot = format!("the base of {id}").into_bytes();
    let (sealed, stored) = hcp_dr::stream::codec::seal(&snapshot, 1, None, "base").await.unwrap();
    store.put(&layout.artifact("base/etcd-0.db"), Box::new(std::io::Cursor::new(sealed))).await.unwrap();
    let mut raw = Hasher::default();
    raw.update(&snapshot);
    let raw = raw.finish();
    let descriptor = serde_json::json!({
        "format": "hcp-dr-stream-chain", "format_version": 1, "chain_id": id,
        "namespace": NS, "hosted_cluster": HC, "started": taken,
        "base": {"how": "snapshot", "member": "etcd-0", "revision": base, "taken": taken,
                 "artifact": "base/etcd-0.db", "size": stored.size, "sha256": stored.sha256,
                 "raw": {"size": raw.size, "sha256": raw.sha256}},
        "coding": {"compression": "zstd", "level": 1}, "tool_version": "test"
    });
    store.put(&layout.descriptor(), Box::new(std::io::Cursor::new(serde_json::to_vec(&descriptor).unwrap()))).await.unwrap();
    let mut writer = ChainWriter::new(store.clone(), layout.clone(), 1, None, Cut { interval: Duration::from_secs(3600), size: 1 << 20 }, base);
    for revision in base + 1..=last {
        let event = Event::Put { key: Bytes(b"/registry/k".to_vec()), value: Bytes(revision.to_le_bytes().to_vec()), create_revision: base + 1, mod_revision: revision, version: revision - base, lease: 0 };
        writer.push(&RevisionRecord { revision, received: Utc::now(), events: vec![event], leases: Vec::new() }).unwrap();
        let hcp_dr::stream::writer::Flushed::Stored(name) = writer.flush().await.unwrap() else { panic!("a segment, stored") };
        date(&root.join(layout.segment(&name)), taken + chrono::Duration::seconds(revision - base));
    }
    for file in files(&root.join(layout.dir())) {
        if !file.starts_with("segments/") {
            date(&root.join(layout.dir()).join(file), taken);
        }
    }
    layout
}

fn date(path: &Path, at: DateTime<Utc>) {
    let file = std::fs::File::options().append(true).open(path).unwrap();
    file.set_modified(SystemTime::from(at)).unwrap();
}

/// A complete backup's manifest (enough for `list` and `prune`: neither
/// reads the artifacts).
fn backup(root: &Path, taken: DateTime<Utc>) -> String {
    let id = format!("{}-0a1b2c", taken.format("%Y%m%dT%H%M%SZ"));
    let dir = root.join(NS).join(HC).join(&id);
    std::fs::create_dir_all(&dir).unwrap();
    let artifacts = ["etcd/etcd-0.db", "objects.tar.gz", "SHA256SUMS"].map(|name| serde_json::json!({"name": name, "size": 1, "sha256": "00"}));
    let manifest = serde_json::json!({
        "format_version": hcp_dr::archive::FORMAT_VERSION, "tool_version": "test", "backup_id": id,
        "cluster": {"namespace": NS, "name": HC, "uid": "uid", "hcp_namespace": format!("{NS}-{HC}"), "platform": "None",
                    "availability_policy": "SingleReplica", "release_image": "img"},
        "etcd": [{"member": "etcd-0", "artifact": "etcd/etcd-0.db", "revision": 1, "size": 1, "sha256": "00"}],
        "artifacts": artifacts,
        "timings": {}
    });
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
    id
}

fn hcp_dr(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(args).env_remove("HCP_DR_STORE").output().unwrap()
}

fn id_at(at: DateTime<Utc>, suffix: &str) -> String {
    format!("{}-{suffix}", at.format("%Y%m%dT%H%M%SZ"))
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

#[tokio::test]
async fn backups_list_shows_each_chain_window_and_the_gaps_between() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let t0 = at("2026-11-20T10:00:00Z");
    let t1 = at("2026-11-20T16:00:00Z");
    let first = chain(root, &id_at(t0, "000001"), 100, 104, t0).await;
    // the stream was down: revisions 105..119 are in no chain
    let second = chain(root, &id_at(t1, "000002"), 120, 123, t1).await;
    backup(root, at("2026-11-20T12:00:00Z"));
    let store = root.to_str().unwrap();

    let out = hcp_dr(&["backups", "list", "--store", store]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = shown.lines().filter(|l| l.starts_with("  window") || l.starts_with("  GAP")).collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert!(lines[0].contains("revisions 100..104") && lines[0].contains("2026-11-20T10:00:00Z .. 2026-11-20T10:00:04Z") && lines[0].contains(&first.chain_id), "{shown}");
    assert!(lines[1].contains("GAP") && lines[1].contains("revisions 105..119") && lines[1].contains("2026-11-20T10:00:04Z .. 2026-11-20T16:00:00Z"), "{shown}");
    assert!(lines[2].contains("revisions 120..123") && lines[2].contains(&second.chain_id), "{shown}");

    let out = hcp_dr(&["backups", "list", "--store", store, "-o", "json"]);
    let json = json_report(&out);
    let stream = &json[0]["stream"][0];
    assert_eq!(stream["hosted_cluster"], HC, "{json:#}");
    let windows: Vec<(i64, i64)> = stream["chains"].as_array().unwrap().iter().map(|c| (c["from_revision"].as_i64().unwrap(), c["through_revision"].as_i64().unwrap())).collect();
    assert_eq!(windows, [(100, 104), (120, 123)], "{json:#}");
    assert_eq!(stream["chains"][0]["through"], "2026-11-20T10:00:04Z", "{json:#}");
    assert_eq!(stream["gaps"][0]["revisions"], serde_json::json!([105, 119]), "{json:#}");

    // a segment gone: the window stops before it, and says why
    let names = hcp_dr::stream::catalog::chains(&LocalStore::new(root), NS, HC).await.unwrap().0;
    std::fs::remove_file(root.join(second.segment(&names[1].segments[1]))).unwrap();
    let out = hcp_dr(&["backups", "list", "--store", store]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("revisions 120..121") && shown.contains("revisions 122..122 are missing"), "{shown}");

    // a store without stream lists as before: no stream field, no window line
    let plain = tempfile::tempdir().unwrap();
    backup(plain.path(), t0);
    let out = hcp_dr(&["backups", "list", "--store", plain.path().to_str().unwrap(), "-o", "json"]);
    assert!(json_report(&out)[0].get("stream").is_none(), "{}", text(&out));
}

#[tokio::test]
async fn backups_verify_checks_every_segment_and_names_the_first_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let t0 = at("2026-11-20T10:00:00Z");
    let older = chain(root, &id_at(t0, "000001"), 100, 103, t0).await;
    let newer = chain(root, &id_at(t0 + chrono::Duration::hours(6), "000002"), 103, 110, t0 + chrono::Duration::hours(6)).await;
    let store = root.to_str().unwrap();
    let stream_url = format!("{store}/{NS}/{HC}/stream");

    let out = hcp_dr(&["backups", "verify", &stream_url, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["chains"].as_array().unwrap().len(), 2, "{report:#}");
    assert_eq!(report["chains"][1]["good_through"], 110, "{report:#}");

    // one chain by its URL
    let out = hcp_dr(&["backups", "verify", &format!("{stream_url}/{}", older.chain_id)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("revisions 100..103 restore"), "{}", text(&out));

    // a segment altered in place
    let segments = hcp_dr::stream::catalog::chains(&LocalStore::new(root), NS, HC).await.unwrap().0[1].segments.clone();
    let tampered = newer.segment(&segments[3]);
    let path = root.join(&tampered);
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let out = hcp_dr(&["backups", "verify", &stream_url]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(&tampered) && shown.contains("damaged or altered") && shown.contains("it restores revisions 103..106 only"), "{shown}");

    // and deleted
    std::fs::remove_file(&path).unwrap();
    let out = hcp_dr(&["backups", "verify", &stream_url, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json_report(&out);
    let problem = report["problems"][0].as_str().unwrap();
    assert!(problem.contains("revisions 107..107 are missing") && problem.contains("it restores revisions 103..106 only"), "{report:#}");

    // --streams with a backup URL: the chains' verdicts join the backup's
    let id = backup(root, t0 + chrono::Duration::hours(7));
    let out = hcp_dr(&["backups", "verify", "--streams", &format!("{store}/{NS}/{HC}/{id}"), "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["streams"].as_array().unwrap().len(), 2, "{report:#}");
    assert!(report["problems"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().contains("revisions 107..107 are missing")), "{report:#}");

    // bad input: exit 2, nothing read or written
    let before = files(root);
    let cases: [(Vec<String>, &str); 3] = [
        (vec!["--streams".into(), format!("{store}/{NS}/other/{id}")], "has no stream chain"),
        (vec![format!("{stream_url}/20261120T000000Z-ffffff")], "no stream chain 20261120T000000Z-ffffff"),
        (vec!["--deep".into(), "--at-revision".into(), "105".into(), stream_url.clone()], "cannot be used with"),
    ];
    for (args, says) in cases {
        let mut all = vec!["backups", "verify"];
        all.extend(args.iter().map(String::as_str));
        let out = hcp_dr(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{args:?}: {}", text(&out));
    }
    assert_eq!(files(root), before);
}

#[tokio::test]
async fn backups_prune_removes_old_ended_chains_whole_and_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let now = Utc::now();
    let day = chrono::Duration::days(1);
    let oldest = chain(root, &id_at(now - day * 40, "000001"), 100, 102, now - day * 40).await;
    let old = chain(root, &id_at(now - day * 20, "000002"), 103, 105, now - day * 20).await;
    let recent = chain(root, &id_at(now - day * 3, "000003"), 106, 108, now - day * 3).await;
    // the newest, however old: the stream may still be writing it
    let newest = chain(root, &id_at(now - day * 2, "000004"), 109, 110, now - day * 60).await;
    let store = root.to_str().unwrap();
    // object sets read over time: the kept chains reach back to the newest
    // chain's base, 60 days ago; the set read before it is still needed
    let sets: Vec<hcp_dr::stream::objects::SetName> = [70, 65, 62, 1]
        .iter()
        .map(|days| hcp_dr::stream::objects::SetName { taken: now - day * *days, sha256: format!("{:064x}", days), encrypted: false })
        .collect();
    let set_dir = root.join(hcp_dr::stream::objects::prefix(NS, HC));
    std::fs::create_dir_all(&set_dir).unwrap();
    for set in &sets {
        std::fs::write(set_dir.join(set.file_name()), b"objects").unwrap();
    }

    let before = files(root);
    let out = hcp_dr(&["backups", "prune", "--store", store, "--keep-stream", "7d", "--dry-run", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(files(root), before, "a dry run deletes nothing");
    let report = json_report(&out);
    let planned = report.as_array().unwrap();
    let going: Vec<&str> = planned.iter().filter(|e| e["keep"] == false && e["stream_chain"] == true).map(|e| e["backup_id"].as_str().unwrap()).collect();
    assert_eq!(going, [oldest.chain_id.as_str(), old.chain_id.as_str()], "{report:#}");
    let sets_going: Vec<&str> = planned.iter().filter(|e| e["keep"] == false && e["object_set"] == true).map(|e| e["backup_id"].as_str().unwrap()).collect();
    assert_eq!(sets_going, [sets[0].file_name(), sets[1].file_name()], "{report:#}");
    assert!(planned.iter().all(|e| (e["stream_chain"] == true || e["object_set"] == true) && e["deleted"] == false), "{report:#}");

    let out = hcp_dr(&["backups", "prune", "--store", store, "--keep-stream", "7d"]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(&format!("stream/{}", oldest.chain_id)) && shown.contains("DELETED") && shown.contains("0 backup(s) and 4 stream chain(s) and 4 object set(s), 4 deleted"), "{shown}");
    let left_sets: Vec<String> = hcp_dr::stream::objects::list(&LocalStore::new(root), NS, HC).await.unwrap().iter().map(|s| s.file_name()).collect();
    assert_eq!(left_sets, [sets[2].file_name(), sets[3].file_name()], "the set a kept chain's base needs, and the newer one");
    assert!(shown.contains("the newest chain"), "{shown}");
    for gone in [&oldest, &old] {
        assert!(!root.join(gone.dir()).exists() || files(&root.join(gone.dir())).is_empty(), "{} left: {:?}", gone.dir(), files(&root.join(gone.dir())));
    }
    let (left, incomplete) = hcp_dr::stream::catalog::chains(&LocalStore::new(root), NS, HC).await.unwrap();
    assert_eq!(left.iter().map(|c| c.layout.chain_id.as_str()).collect::<Vec<_>>(), [recent.chain_id.as_str(), newest.chain_id.as_str()]);
    assert!(incomplete.is_empty(), "{incomplete:?}");
    assert_eq!(left[0].segments.len(), 2, "the kept chains are whole");

    // without --keep-stream, chains go with the backups they predate
    let kept = backup(root, now - day);
    let out = hcp_dr(&["backups", "prune", "--store", store, "--keep-last", "1", "--dry-run"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && shown.contains(&kept), "{}", text(&out));
    assert!(shown.contains(&format!("stream/{}", recent.chain_id)) && shown.contains("WOULD DELETE") && shown.contains("before the oldest kept backup"), "{shown}");
}

/// `backups copy` takes the chains and object sets along: every object
/// checked, the chain listed at the destination only once its base and
/// segments are there; a copy cut short is completed, a second run copies
/// nothing, and a segment damaged at the source fails its chain (exit 1)
/// without the chain appearing at the destination.
#[tokio::test]
async fn backups_copy_takes_chains_and_object_sets_resumably() {
    let dir = tempfile::tempdir().unwrap();
    let (root, dest) = (dir.path().join("from"), dir.path().join("to"));
    let now = Utc::now();
    let day = chrono::Duration::days(1);
    let first = chain(&root, &id_at(now - day * 2, "0000c1"), 100, 104, now - day * 2).await;
    let second = chain(&root, &id_at(now - day, "0000c2"), 104, 107, now - day).await;
    let tarball = b"objects".to_vec();
    let mut hasher = Hasher::default();
    hasher.update(&tarball);
    let set = hcp_dr::stream::objects::SetName { taken: now - day, sha256: hasher.finish().sha256, encrypted: false };
    LocalStore::new(&root).put(&format!("{}{}", hcp_dr::stream::objects::prefix(NS, HC), set.file_name()), Box::new(&tarball[..])).await.unwrap();
    let (from, to) = (root.to_str().unwrap(), dest.to_str().unwrap());
    let copy = |to: &str| hcp_dr(&["backups", "copy", "--from", from, "--to", to, "-o", "json"]);

    let out = copy(to);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let results: Vec<&str> = report["chains"].as_array().unwrap().iter().map(|c| c["result"].as_str().unwrap()).collect();
    assert_eq!(results, ["copied", "copied"], "{report:#}");
    assert_eq!(report["object_sets"][0]["copied"], 1, "{report:#}");
    let verified = hcp_dr(&["backups", "verify", &format!("{to}/{NS}/{HC}/stream"), "-o", "json"]);
    assert!(verified.status.success(), "{}", text(&verified));
    assert_eq!(hcp_dr::stream::objects::read(&LocalStore::new(&dest), NS, HC, &set, None).await.unwrap(), tarball);

    // cut short: the second chain's descriptor and last segment never made it
    let (chains, _) = hcp_dr::stream::catalog::chains(&LocalStore::new(&dest), NS, HC).await.unwrap();
    let last = chains[1].segments.last().unwrap().clone();
    std::fs::remove_file(dest.join(second.segment(&last))).unwrap();
    std::fs::remove_file(dest.join(second.descriptor())).unwrap();
    let out = copy(to);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["chains"][0]["result"], "already there", "{report:#}");
    assert_eq!((report["chains"][1]["result"].as_str(), report["chains"][1]["segments_copied"].as_u64()), (Some("completed"), Some(1)), "{report:#}");
    let out = copy(to);
    let report = json_report(&out);
    assert!(report["chains"].as_array().unwrap().iter().all(|c| c["result"] == "already there") && report["object_sets"][0]["copied"] == 0, "{report:#}");
    assert!(hcp_dr(&["backups", "verify", &format!("{to}/{NS}/{HC}/stream")]).status.success());

    // damaged at the source: that chain fails, and is not listed where it went
    let (chains, _) = hcp_dr::stream::catalog::chains(&LocalStore::new(&root), NS, HC).await.unwrap();
    let victim = root.join(first.segment(&chains[0].segments[1]));
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&victim, bytes).unwrap();
    let other = dir.path().join("other");
    let out = copy(other.to_str().unwrap());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!(report["chains"][0]["result"], "failed", "{report:#}");
    assert!(report["chains"][0]["error"].as_str().is_some_and(|e| e.contains(&chains[0].segments[1].file_name()) && e.contains("damaged or altered")), "{report:#}");
    let (copied, _) = hcp_dr::stream::catalog::chains(&LocalStore::new(&other), NS, HC).await.unwrap();
    assert_eq!(copied.iter().map(|c| c.layout.chain_id.as_str()).collect::<Vec<_>>(), [second.chain_id.as_str()], "the damaged chain is not listed there");
}
