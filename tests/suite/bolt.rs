//! Appending revisions straight into a snapshot's bbolt file
//! (`hcp_dr::etcd::bolt::Appender`), checked against real etcd 3.4: a
//! source etcd is snapshotted at revision B, written on (leases granted,
//! used, revoked; a multi-key transaction; a prefix delete; values that
//! overflow a page; enough keys for a key bucket of several levels, its
//! history compacted) and
//! snapshotted again at E. Its revisions B+1..=E, as a watch reports them,
//! are appended to a copy of snapshot B. The result must be what etcd
//! itself wrote at E: `etcdctl snapshot status` accepts it at revision E,
//! its "key" and "lease" buckets are byte for byte those of snapshot E,
//! and both restored with `etcdctl snapshot restore` serve the same
//! keyspace (key, value, create/mod revision, version, lease) and leases,
//! and take writes from E+1 on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::{Client, CompactionOptions, DeleteOptions, EventType, GetOptions, LeaseGrantOptions, PutOptions, Txn, TxnOp, WatchOptions};
use hcp_dr::etcd::bbolt::{Db, Visitor, WalkStats};
use hcp_dr::etcd::bolt::Appender;
use hcp_dr::stream::format::{Bytes, Event, LeaseGrant, RevisionRecord};
use hcp_dr_e2e::procs::etcd::{EtcdProcess, connect_client, restore_scratch};

fn etcdctl() -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3");
    cmd
}

fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e} (etcdctl comes with etcd 3.4: apt-get install etcd-client)"));
    assert!(out.status.success(), "{cmd:?} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out
}

fn snapshot_save(url: &str, path: &Path) {
    run_ok(etcdctl().arg(format!("--endpoints={url}")).args(["snapshot", "save"]).arg(path));
}

/// `etcdctl snapshot status`: (revision, total keys).
fn snapshot_status(path: &Path) -> (i64, u64) {
    let out = run_ok(etcdctl().args(["snapshot", "status", "-w", "json"]).arg(path));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl status JSON");
    (status["revision"].as_i64().expect("revision"), status["totalKey"].as_u64().expect("totalKey"))
}

async fn revision(client: &mut Client) -> i64 {
    client.status().await.unwrap().header().unwrap().revision()
}

/// The revisions after `after` up to `to`, as the stream's watch records
/// them (`src/stream/watch.rs`): one record per revision, the TTL of each
/// lease the first time a put uses it (`None` once the lease is gone).
async fn record(client: &mut Client, after: i64, to: i64) -> Vec<RevisionRecord> {
    let options = WatchOptions::new().with_all_keys().with_start_revision(after + 1);
    let (_watcher, mut stream) = client.watch("", Some(options)).await.unwrap().split();
    let mut records: Vec<RevisionRecord> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while records.last().map_or(after, |r| r.revision) < to {
        assert!(Instant::now() < deadline, "the watch did not reach revision {to}");
        let response = tokio::time::timeout(Duration::from_secs(30), stream.message()).await.expect("watch answer").unwrap().expect("watch open");
        for event in response.events() {
            let kv = event.kv().unwrap();
            let event = match event.event_type() {
                EventType::Put => Event::Put { key: Bytes(kv.key().to_vec()), value: Bytes(kv.value().to_vec()), create_revision: kv.create_revision(), mod_revision: kv.mod_revision(), version: kv.version(), lease: kv.lease() },
                EventType::Delete => Event::Delete { key: Bytes(kv.key().to_vec()) },
            };
            match records.last_mut() {
                Some(r) if r.revision == kv.mod_revision() => r.events.push(event),
                _ => records.push(RevisionRecord { revision: kv.mod_revision(), received: chrono::Utc::now(), events: vec![event], leases: Vec::new() }),
            }
        }
    }
    let mut lookup = client.clone();
    for r in &mut records {
        let mut ids: Vec<i64> = r.events.iter().filter_map(|e| match e { Event::Put { lease, .. } if *lease != 0 => Some(*lease), _ => None }).collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            if seen.insert(id) {
                let answer = lookup.lease_time_to_live(id, None).await.unwrap();
                r.leases.push(LeaseGrant { id, ttl: (answer.ttl() >= 0).then(|| answer.granted_ttl()) });
            }
        }
    }
    assert_eq!(records.last().unwrap().revision, to);
    records
}

/// One key as etcd serves it: (key, value, create, mod, version, lease).
type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

/// Everything a restored member serves: its keys, leases and revision.
async fn served(url: &str) -> (Vec<Kv>, Vec<i64>, i64) {
    let mut client = connect_client(&[url.to_string()], None).await.unwrap();
    let resp = client.get("", Some(GetOptions::new().with_all_keys())).await.unwrap();
    let kvs = resp.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease())).collect();
    let mut leases: Vec<i64> = client.leases().await.unwrap().leases().iter().map(|l| l.id()).collect();
    leases.sort_unstable();
    (kvs, leases, resp.header().unwrap().revision())
}

/// (bucket, key, value).
type Entry = (String, Vec<u8>, Vec<u8>);

/// The entries of buckets `key` and `lease` of a snapshot file, read by
/// hcp-dr's own bbolt reader (which checks the structure on the way).
fn buckets(path: &Path) -> (Vec<Entry>, WalkStats) {
    struct Collect(Vec<Entry>, String);
    impl Visitor for Collect {
        fn bucket(&mut self, name: &[u8]) {
            self.1 = String::from_utf8_lossy(name).into_owned();
        }
        fn entry(&mut self, key: &[u8], value: Option<&[u8]>) {
            if self.1 == "key" || self.1 == "lease" {
                self.0.push((self.1.clone(), key.to_vec(), value.unwrap_or_default().to_vec()));
            }
        }
    }
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() - 32;
    let mut db = Db::open(std::io::BufReader::new(file), len).unwrap();
    let mut out = Collect(Vec::new(), String::new());
    let stats = db.walk(&mut out).unwrap();
    (out.0, stats)
}

/// The root page of a snapshot's "key" bucket (0: inline), read by hand
/// from the root bucket's leaf page.
fn key_bucket_root(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let meta = *Db::open(std::io::Cursor::new(&bytes), bytes.len() as u64 - 32).unwrap().meta();
    let page = &bytes[(meta.root * u64::from(meta.page_size)) as usize..];
    let at = |offset: usize, n: usize| u64::from_le_bytes(bytes_of(&page[offset..offset + n]));
    assert_eq!(at(8, 2), 0x02, "the root bucket is one leaf page");
    for i in 0..at(10, 2) as usize {
        let element = 16 + i * 16;
        let (pos, ksize) = (at(element + 4, 4) as usize, at(element + 8, 4) as usize);
        let key = &page[element + pos..element + pos + ksize];
        if key == b"key" {
            return at(element + pos + ksize, 8);
        }
    }
    panic!("no key bucket");
}

/// Check that every branch element of the "key" bucket's tree names its
/// child by the child's first key: bbolt relies on it when it rewrites a
/// node (`node.spill` finds the parent's element by the node's old first
/// key; another key there would add a second element for the same page).
fn check_separators(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let meta = *Db::open(std::io::Cursor::new(&bytes), bytes.len() as u64 - 32).unwrap().meta();
    let page_size = meta.page_size as usize;
    let field = |page: usize, offset: usize, n: usize| u64::from_le_bytes(bytes_of(&bytes[page * page_size + offset..page * page_size + offset + n]));
    // (flags, first key) of a page
    let first_key = |page: usize| {
        let element = page * page_size + 16;
        let pos = field(page, 16 + if field(page, 8, 2) == 0x01 { 0 } else { 4 }, 4) as usize;
        let ksize = field(page, 16 + if field(page, 8, 2) == 0x01 { 4 } else { 8 }, 4) as usize;
        bytes[element + pos..element + pos + ksize].to_vec()
    };
    let mut pages = vec![key_bucket_root(path) as usize];
    let mut checked = 0;
    while let Some(page) = pages.pop() {
        if field(page, 8, 2) != 0x01 {
            continue;
        }
        for i in 0..field(page, 10, 2) as usize {
            let element = page * page_size + 16 + i * 16;
            let pos = u32::from_le_bytes(bytes[element..element + 4].try_into().unwrap()) as usize;
            let ksize = u32::from_le_bytes(bytes[element + 4..element + 8].try_into().unwrap()) as usize;
            let child = u64::from_le_bytes(bytes[element + 8..element + 16].try_into().unwrap()) as usize;
            assert_eq!(bytes[element + pos..element + pos + ksize], first_key(child), "{}: branch page {page} element {i}", path.display());
            pages.push(child);
            checked += 1;
        }
    }
    assert!(checked > 0 || key_bucket_root(path) == 0 || field(key_bucket_root(path) as usize, 8, 2) == 0x02);
}

fn bytes_of(slice: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..slice.len()].copy_from_slice(slice);
    out
}

/// Append `records` to a copy of snapshot `base` and check the result
/// against snapshot `end` (revision `to`) in every way etcd shows it.
async fn append_and_compare(dir: &Path, base: &Path, end: &Path, records: &[RevisionRecord], to: i64) -> (PathBuf, Vec<i64>) {
    let appended = dir.join("appended.db");
    std::fs::copy(base, &appended).unwrap();
    let mut appender = Appender::open(&appended).unwrap();
    assert_eq!(appender.revision(), records[0].revision - 1, "the base's revision");
    for r in records {
        appender.push(r).unwrap();
    }
    let finished = appender.finish().unwrap();
    assert_eq!(finished.revision, to);
    let bytes = std::fs::read(&appended).unwrap();
    assert_eq!(finished.size, bytes.len() as u64);
    use sha2::Digest;
    assert_eq!(finished.sha256, hcp_dr::store::hex(&sha2::Sha256::digest(&bytes)));

    let (status_rev, status_keys) = snapshot_status(&appended);
    let (end_rev, end_keys) = snapshot_status(end);
    assert_eq!((status_rev, end_rev), (to, to), "etcdctl snapshot status revisions");
    assert_eq!(status_keys, end_keys, "etcdctl snapshot status key counts");
    check_separators(&appended);
    check_separators(end);
    let (ours, theirs) = (buckets(&appended).0, buckets(end).0);
    assert_eq!(ours.len(), theirs.len(), "entries of the key and lease buckets");
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b, "the first entry that differs from what etcd wrote");
    }

    let mut restored = restore_scratch(&appended, &dir.join("restored-appended")).await.unwrap();
    let mut reference = restore_scratch(end, &dir.join("restored-end")).await.unwrap();
    let (ours, theirs) = (served(&restored.client_url()).await, served(&reference.client_url()).await);
    assert_eq!(ours.2, to, "the restored member's revision");
    assert_eq!(ours.1, theirs.1, "leases");
    assert_eq!(ours.0.len(), theirs.0.len(), "keys");
    assert!(ours.0 == theirs.0, "the keyspaces differ");
    // it takes writes, from the next revision on
    let mut client = connect_client(&[restored.client_url()], None).await.unwrap();
    let put = client.put("/after-restore", "x", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), to + 1);
    // bbolt rewrites old and new leaves alike when etcd compacts: the
    // keyspace stays, and the file still passes bbolt's check
    client.compact(to, Some(CompactionOptions::new().with_physical())).await.unwrap();
    let (compacted, _, _) = served(&restored.client_url()).await;
    let mut expected = theirs.0.clone();
    expected.push((b"/after-restore".to_vec(), b"x".to_vec(), to + 1, to + 1, 1, 0));
    expected.sort();
    assert!(compacted == expected, "the keyspace after a compaction differs");
    let compacted_snapshot = dir.join("compacted.db");
    snapshot_save(&restored.client_url(), &compacted_snapshot);
    assert_eq!(snapshot_status(&compacted_snapshot).0, to + 1);
    check_separators(&compacted_snapshot);
    restored.kill();
    reference.kill();
    println!("appended {} revisions: {} bytes, {} leases added", records.len(), finished.size, finished.leases_added);
    (appended, ours.1)
}

#[tokio::test]
async fn appended_revisions_equal_what_etcd_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let source = EtcdProcess::start_plain(&tmp.path().join("src")).await.unwrap();
    let url = source.client_url();
    let mut client = connect_client(std::slice::from_ref(&url), None).await.unwrap();

    // the base: 20,000 keys (a key bucket of several levels), a lease
    // with keys, a value over a page, deletions
    for batch in 0..200 {
        let ops: Vec<TxnOp> = (0..100).map(|i| TxnOp::put(format!("/registry/pods/ns-{}/pod-{batch:03}-{i:03}", i % 9), format!("spec of {batch}/{i}"), None)).collect();
        client.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    let kept = client.lease_grant(600, None).await.unwrap().id();
    for i in 0..5 {
        client.put(format!("/registry/events/base-{i}"), "e", Some(PutOptions::new().with_lease(kept))).await.unwrap();
    }
    client.put("/registry/big/base", vec![0x5au8; 9000], None).await.unwrap();
    // history compacted away in the middle of the key bucket (its pages
    // rebalanced, some freed), the last revision a deletion
    for i in 0..2000 {
        client.put(format!("/registry/pods/ns-{}/pod-{:03}-{:03}", i % 9, 50 + i / 100, i % 100), "rewritten", None).await.unwrap();
    }
    client.delete("/registry/pods/ns-0/pod-000-000", None).await.unwrap();
    let base_rev = revision(&mut client).await;
    client.compact(base_rev, Some(CompactionOptions::new().with_physical())).await.unwrap();
    let base = tmp.path().join("base.db");
    snapshot_save(&url, &base);
    // the key bucket's last entry, unless compaction removed that tombstone
    let status_rev = snapshot_status(&base).0;
    assert!(status_rev <= base_rev && status_rev > base_rev - 5, "snapshot status says {status_rev}, etcd {base_rev}");
    let stats = buckets(&base).1;
    assert!(stats.branch_pages >= 2, "the base's key bucket has a branch page under its root branch: {stats:?}");

    // what the stream records
    let fresh = client.lease_grant(300, Some(LeaseGrantOptions::new().with_id(0x1234_5678))).await.unwrap().id();
    let revoked = client.lease_grant(120, None).await.unwrap().id();
    for i in 0..3000 {
        let lease = match i % 50 {
            0 => Some(PutOptions::new().with_lease(fresh)),
            1 => Some(PutOptions::new().with_lease(revoked)),
            2 => Some(PutOptions::new().with_lease(kept)),
            _ => None,
        };
        let value: Vec<u8> = (0..(i * 7 % 1500)).map(|b| (b ^ i) as u8).collect();
        client.put(format!("/registry/configmaps/ns-{}/cm-{i:04}", i % 4), value, lease).await.unwrap();
    }
    // overwrites (versions, create revisions kept), a multi-key transaction
    for i in 0..50 {
        client.put(format!("/registry/pods/ns-{}/pod-001-{i:03}", i % 9), "updated", None).await.unwrap();
    }
    let txn = Txn::new().and_then(vec![
        TxnOp::put("/registry/txn/a", "1", None),
        TxnOp::put("/registry/pods/ns-1/pod-002-001", "in a txn", Some(PutOptions::new().with_lease(fresh))),
        TxnOp::delete("/registry/pods/ns-2/pod-002-002", None),
        TxnOp::put("/registry/txn/b", vec![7u8; 5000], None),
    ]);
    client.txn(txn).await.unwrap();
    // values spanning several pages
    client.put("/registry/big/new", vec![0xa5u8; 100_000], None).await.unwrap();
    client.put("/registry/big/base", vec![0x5bu8; 4500], None).await.unwrap();
    // a prefix deleted at one revision, a lease revoked (its keys deleted)
    client.delete("/registry/configmaps/ns-3/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    client.lease_revoke(revoked).await.unwrap();
    // a key moved off its lease, one deleted and put again
    client.put("/registry/configmaps/ns-0/cm-0000", "no lease now", None).await.unwrap();
    client.delete("/registry/txn/a", None).await.unwrap();
    client.put("/registry/txn/a", "2", None).await.unwrap();
    let end_rev = revision(&mut client).await;
    let end = tmp.path().join("end.db");
    snapshot_save(&url, &end);
    assert_eq!(snapshot_status(&end).0, end_rev);

    let records = record(&mut client, base_rev, end_rev).await;
    assert_eq!(records.len() as i64, end_rev - base_rev);
    let (appended, leases) = append_and_compare(tmp.path(), &base, &end, &records, end_rev).await;
    let mut expected = vec![kept, fresh];
    expected.sort_unstable();
    assert_eq!(leases, expected, "the base's lease and the one granted after it still holding keys; not the revoked one");

    // a second append continues from the first (its key bucket now has
    // leaves after the old high-water mark and a rebuilt branch level)
    for i in 0..500 {
        client.put(format!("/registry/second/{i}"), vec![b'z'; i], None).await.unwrap();
    }
    client.delete("/registry/second/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    let later_rev = revision(&mut client).await;
    let later = tmp.path().join("later.db");
    snapshot_save(&url, &later);
    let records = record(&mut client, end_rev, later_rev).await;
    let again = tmp.path().join("again");
    std::fs::create_dir(&again).unwrap();
    append_and_compare(&again, &appended, &later, &records, later_rev).await;
}

#[tokio::test]
async fn a_base_with_an_inline_key_bucket_takes_revisions() {
    let tmp = tempfile::tempdir().unwrap();
    let source = EtcdProcess::start_plain(&tmp.path().join("src")).await.unwrap();
    let url = source.client_url();
    let mut client = connect_client(std::slice::from_ref(&url), None).await.unwrap();
    client.put("/a", "1", None).await.unwrap();
    client.put("/b", "2", None).await.unwrap();
    let base_rev = revision(&mut client).await;
    let base = tmp.path().join("base.db");
    snapshot_save(&url, &base);
    assert_eq!(key_bucket_root(&base), 0, "the base's key bucket is inline in the root bucket's page");

    let lease = client.lease_grant(900, None).await.unwrap().id();
    client.put("/c", "3", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    client.delete("/a", None).await.unwrap();
    client.put("/b", "22", None).await.unwrap();
    for i in 0..40 {
        client.put(format!("/d/{i}"), vec![b'd'; 100], None).await.unwrap();
    }
    let end_rev = revision(&mut client).await;
    let end = tmp.path().join("end.db");
    snapshot_save(&url, &end);
    let records = record(&mut client, base_rev, end_rev).await;
    let (_, leases) = append_and_compare(tmp.path(), &base, &end, &records, end_rev).await;
    assert_eq!(leases, vec![lease]);
}

/// Not a check: how fast revisions are appended (100,000 revisions of one
/// ~1 KiB put each, on a real base), printed. The result is still checked
/// with `etcdctl snapshot status`. Run with `--no-capture` to see it.
#[tokio::test]
async fn rate_of_appending_100k_revisions() {
    let tmp = tempfile::tempdir().unwrap();
    let source = EtcdProcess::start_plain(&tmp.path().join("src")).await.unwrap();
    let url = source.client_url();
    let mut client = connect_client(std::slice::from_ref(&url), None).await.unwrap();
    for i in 0..100 {
        client.put(format!("/registry/seed/{i}"), vec![b's'; 1000], None).await.unwrap();
    }
    let base_rev = revision(&mut client).await;
    let base = tmp.path().join("base.db");
    snapshot_save(&url, &base);
    let records: Vec<RevisionRecord> = (1..=100_000i64)
        .map(|n| {
            let revision = base_rev + n;
            let key = format!("/registry/configmaps/ns-{}/cm-{}", n % 100, n % 5000);
            let value: Vec<u8> = (0..1024).map(|b| (b as i64 ^ n) as u8).collect();
            let event = Event::Put { key: Bytes(key.into_bytes()), value: Bytes(value), create_revision: revision, mod_revision: revision, version: 1, lease: 0 };
            RevisionRecord { revision, received: chrono::Utc::now(), events: vec![event], leases: Vec::new() }
        })
        .collect();
    let started = Instant::now();
    let mut appender = Appender::open(&base).unwrap();
    let opened = started.elapsed();
    for r in &records {
        appender.push(r).unwrap();
    }
    let pushed = started.elapsed();
    let finished = appender.finish().unwrap();
    let total = started.elapsed();
    println!(
        "appended 100000 revisions of ~1 KiB in {:.2}s ({:.0} revisions/s; open {:.3}s, push {:.2}s, finish {:.2}s), {} MB",
        total.as_secs_f64(),
        100_000.0 / total.as_secs_f64(),
        opened.as_secs_f64(),
        (pushed - opened).as_secs_f64(),
        (total - pushed).as_secs_f64(),
        finished.size / 1_000_000
    );
    assert_eq!(snapshot_status(&base).0, base_rev + 100_000);
    // opening checks the trailing hash: the cost a large base adds
    let started = Instant::now();
    assert_eq!(Appender::open(&base).unwrap().revision(), base_rev + 100_000);
    println!("opening the {} MB result (its hash checked) took {:.2}s", finished.size / 1_000_000, started.elapsed().as_secs_f64());
}
