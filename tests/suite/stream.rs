//! `hcp-dr stream`: continuous backup of a hosted cluster's etcd, checked
//! by what it restores. Every replay is compared key by key (value,
//! create and mod revision, version, lease) with the source etcd read at
//! the same revision.
//!
//! - On a plain etcd, through the library: a chain replays to any
//!   revision (a multi-key transaction atomically, a range delete, a
//!   leased key with its TTL, a time), a revision outside every chain is
//!   refused listing the windows, a compaction while the stream is down
//!   breaks the chain and a new one starts, a new base every
//!   `base_interval` hands over without a gap, and an encrypted chain
//!   needs its identity.
//! - On the sandbox (HighlyAvailable), through the binary: keys written at
//!   known instants while it runs, SIGTERM, `stream verify`, `stream
//!   replay` by revision and by time; SIGKILL under a write load and a
//!   restart (the chain stays contiguous and verifies); a member hung
//!   under the watch (it moves to another); a tampered segment found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use etcd_client::{Client, GetOptions, PutOptions, Txn, TxnOp};
use hcp_dr::store::Store;
use hcp_dr::stream::replay::{Target, replay};
use hcp_dr::stream::run::{Cluster, ClusterReport, run};
use hcp_dr::stream::source::FixedMembers;
use hcp_dr::stream::{StreamError, catalog, verify};
use hcp_dr_e2e::procs::etcd::{connect_client, restore_scratch};

use crate::support::logged::Logged;
use crate::support::plain::{Plain, put, revision_of};
use crate::support::{self, Env, json_report, text};

/// What replay must reproduce of a key: key, value, create revision, mod
/// revision, version, lease.
type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

/// Every key at `revision` (0: now), a page at a time.
async fn keyspace(client: &mut Client, revision: i64) -> Vec<Kv> {
    let mut out: Vec<Kv> = Vec::new();
    let mut from = vec![0u8];
    loop {
        let mut options = GetOptions::new().with_from_key().with_limit(500);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let page = client.get(from.clone(), Some(options)).await.expect("range");
        out.extend(page.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease())));
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return out,
        }
    }
}

/// What a replayed snapshot holds, read from a scratch etcd restored from
/// it: its keys, and the granted TTL of each lease its keys use.
async fn restored(snapshot: &Path, dir: &Path) -> (Vec<Kv>, BTreeMap<i64, i64>) {
    let mut member = restore_scratch(snapshot, dir).await.expect("restore the replayed snapshot");
    let mut client = connect_client(&[member.client_url()], None).await.unwrap();
    let keys = keyspace(&mut client, 0).await;
    let mut ttls = BTreeMap::new();
    for lease in keys.iter().map(|k| k.5).filter(|l| *l != 0) {
        let ttl = client.lease_time_to_live(lease, None).await.expect("lease").granted_ttl();
        ttls.insert(lease, ttl);
    }
    member.kill();
    (keys, ttls)
}

/// The difference between two keyspaces, for a readable failure.
fn differences(want: &[Kv], got: &[Kv]) -> String {
    let show = |kv: &Kv| format!("{} rev {}/{} v{} lease {:x}", String::from_utf8_lossy(&kv.0), kv.2, kv.3, kv.4, kv.5);
    let missing: Vec<String> = want.iter().filter(|kv| !got.contains(kv)).map(show).take(10).collect();
    let extra: Vec<String> = got.iter().filter(|kv| !want.contains(kv)).map(show).take(10).collect();
    format!("{} keys wanted, {} restored\nmissing or different: {missing:#?}\nextra or different: {extra:#?}", want.len(), got.len())
}

fn value_of(keys: &[Kv], key: &str) -> Option<Vec<u8>> {
    keys.iter().find(|kv| kv.0 == key.as_bytes()).map(|kv| kv.1.clone())
}

/// Three keys in one transaction: one revision.
async fn put_three(client: &mut Client, prefix: &str) -> i64 {
    let ops: Vec<TxnOp> = (1..=3).map(|i| TxnOp::put(format!("{prefix}{i}"), format!("together-{i}"), None)).collect();
    revision_of(client.txn(Txn::new().and_then(ops)).await.expect("txn").header())
}

/// A key attached to a new lease of `ttl` seconds: the lease and the revision.
async fn put_leased(client: &mut Client, key: &str, ttl: i64) -> (i64, i64) {
    let lease = client.lease_grant(ttl, None).await.expect("lease").id();
    let revision = revision_of(client.put(key, "with a lease", Some(PutOptions::new().with_lease(lease))).await.expect("put").header());
    (lease, revision)
}

// ---------------------------------------------------------------------
// A plain etcd, through the library

/// What [`Plain`] replays, checked key by key.
impl Plain {
    async fn replay_to(&self, target: Target, name: &str) -> Result<(hcp_dr::stream::replay::ReplayReport, PathBuf), StreamError> {
        let out = self.dir.path().join(format!("{name}.db"));
        replay(self.store.as_ref(), "clusters", "plain", target, &out, None, &self.tools).await.map(|r| (r, out))
    }

    /// Replay to `revision` and compare every key with the source at it.
    async fn assert_replays(&self, revision: i64, context: &str) -> Vec<Kv> {
        let (report, out) = self.replay_to(Target::Revision(revision), &format!("r{revision}")).await.unwrap_or_else(|e| panic!("{context}: replay to {revision}: {e}"));
        assert_eq!(report.revision, revision, "{context}");
        let want = keyspace(&mut self.client.clone(), revision).await;
        let (got, _) = restored(&out, &self.dir.path().join(format!("scratch-{revision}"))).await;
        assert!(want == got, "{context}: replay to {revision}:\n{}", differences(&want, &got));
        got
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_replays_every_revision_exactly_and_breaks_and_hands_over_as_it_says() {
    let plain = Plain::start().await;
    let mut client = plain.client.clone();
    for i in 0..50 {
        put(&mut client, &format!("/registry/configmaps/before/{i:02}"), &"x".repeat(i * 10)).await;
    }
    let mut revisions = BTreeMap::new();
    let mut times = BTreeMap::new();
    let report = plain
        .stream_while(Plain::settings(Duration::from_secs(3600), None), async {
            let mut client = plain.client.clone();
            revisions.insert("a", put(&mut client, "/t/a", "1").await);
            times.insert("a", Utc::now());
            tokio::time::sleep(Duration::from_millis(1500)).await;
            revisions.insert("b", put(&mut client, "/t/b", "2").await);
            revisions.insert("three", put_three(&mut client, "/t/three/").await);
            let (lease, leased) = put_leased(&mut client, "/t/leased", 600).await;
            revisions.insert("leased", leased);
            revisions.insert("lease", lease);
            for i in 0..5 {
                put(&mut client, &format!("/t/range/{i}"), "r").await;
            }
            let deleted = client.delete("/t/range/", Some(etcd_client::DeleteOptions::new().with_prefix())).await.expect("delete");
            revisions.insert("range", revision_of(deleted.header()));
            revisions.insert("overwritten", put(&mut client, "/t/a", "1 again").await);
        })
        .await;
    assert!(report.error.is_none(), "{report:#?}");
    assert_eq!(report.chains.len(), 1, "{report:#?}");
    let chain = &report.chains[0];
    assert!(chain.ended == "stopped" && chain.written.segments >= 2, "{chain:#?}");
    assert!(chain.last_durable_revision >= revisions["overwritten"], "{chain:#?}");

    let chains = plain.chains().await;
    let verdict = verify::verify_chain(plain.store.as_ref(), &chains[0], None).await.unwrap();
    assert!(verdict.ok && verdict.content_checked, "{verdict:#?}");
    assert_eq!(verdict.good_through, Some(chain.last_durable_revision));

    // between two writes: exactly the writes before
    let between = plain.assert_replays(revisions["b"] - 1, "between a and b").await;
    assert_eq!(value_of(&between, "/t/a").as_deref(), Some(&b"1"[..]));
    assert_eq!(value_of(&between, "/t/b"), None);
    // a transaction of three keys: none before it, all three at it
    let before = plain.assert_replays(revisions["three"] - 1, "before the transaction").await;
    assert!(value_of(&before, "/t/three/1").is_none());
    let with = plain.assert_replays(revisions["three"], "at the transaction").await;
    for i in 1..=3 {
        let kv = with.iter().find(|kv| kv.0 == format!("/t/three/{i}").as_bytes()).expect("a key of the transaction");
        assert_eq!((kv.2, kv.3), (revisions["three"], revisions["three"]));
    }
    // a leased key keeps its lease, with its TTL
    let (report_leased, out) = plain.replay_to(Target::Revision(revisions["leased"]), "leased").await.unwrap();
    assert!(report_leased.leases_granted >= 1, "{report_leased:#?}");
    let (keys, ttls) = restored(&out, &plain.dir.path().join("scratch-leased")).await;
    let leased = keys.iter().find(|kv| kv.0 == b"/t/leased").expect("the leased key");
    assert_eq!(leased.5, revisions["lease"]);
    assert_eq!(ttls.get(&revisions["lease"]), Some(&600), "{ttls:?}");
    // a range delete (one revision, an event per key), and the last revision
    plain.assert_replays(revisions["range"], "at the range delete").await;
    plain.assert_replays(chain.last_durable_revision, "at the end").await;
    // by time: what the stream had received then
    let (at_time, out) = plain.replay_to(Target::Time(times["a"] + chrono::Duration::milliseconds(700)), "time").await.unwrap();
    assert!(at_time.revision >= revisions["a"] && at_time.revision < revisions["b"], "{at_time:#?} {revisions:?}");
    let (keys, _) = restored(&out, &plain.dir.path().join("scratch-time")).await;
    assert!(value_of(&keys, "/t/a").is_some() && value_of(&keys, "/t/b").is_none());

    // outside the chain: refused, naming the windows
    let base = chains[0].descriptor.as_ref().unwrap().base.revision;
    for outside in [base - 1, chain.last_durable_revision + 1000] {
        let err = plain.replay_to(Target::Revision(outside), &format!("outside-{outside}")).await.unwrap_err();
        let said = err.to_string();
        assert!(err.is_input() && said.contains(&format!("revision {outside} cannot be restored")) && said.contains(&format!("revisions {base}..{}", chain.last_durable_revision)), "{said}");
    }
    let err = plain.replay_to(Target::Time(Utc::now() + chrono::Duration::hours(1)), "future").await.unwrap_err().to_string();
    assert!(err.contains("cannot be proven"), "{err}");

    // down while etcd compacts: the chain breaks, a new one starts
    let last = chain.last_durable_revision;
    put(&mut client, "/t/while-down", "lost to the stream").await;
    let now = put(&mut client, "/t/while-down-2", "lost too").await;
    client.compact(now, Some(etcd_client::CompactionOptions::new().with_physical())).await.expect("compact");
    let report = plain.stream_while(Plain::settings(Duration::from_secs(3600), None), async {}).await;
    assert!(report.error.is_none(), "{report:#?}");
    assert_eq!(report.breaks.len(), 1, "{report:#?}");
    let broken = &report.breaks[0];
    assert_eq!(broken.last_revision, last);
    assert!(broken.reason.contains(&format!("compacted its history to revision {now}")), "{broken:#?}");
    let (from, to) = broken.lost().expect("revisions lost");
    assert_eq!(from, last + 1);
    assert!(to >= now - 1, "{broken:#?}");
    assert!(report.warnings.iter().any(|w| w.contains(&format!("revisions {from}..{to}")) && w.contains("in no chain")), "{:#?}", report.warnings);
    let chains = plain.chains().await;
    assert_eq!(chains.len(), 2);
    let new_chain = chains[1].descriptor.as_ref().unwrap();
    assert!(new_chain.previous.as_ref().is_some_and(|p| p.chain_id == chains[0].layout.chain_id && p.last_revision == last), "{new_chain:#?}");
    let err = plain.replay_to(Target::Revision(last + 1), "lost").await.unwrap_err().to_string();
    assert!(err.contains("cannot be restored"), "{err}");

    // a new base every 2s while writes go on: chains overlap, nothing lost
    let report = plain
        .stream_while(Plain::settings(Duration::from_secs(2), None), async {
            let mut client = plain.client.clone();
            for i in 0..50 {
                put(&mut client, &format!("/t/steady/{i}"), "v").await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
    assert!(report.error.is_none() && report.breaks.is_empty(), "{report:#?}");
    assert!(report.chains.iter().any(|c| c.ended.starts_with("handed over")), "{report:#?}");
    let windows = catalog::windows(&plain.chains().await);
    for pair in windows.windows(2).skip(1) {
        assert!(pair[1].from <= pair[0].through, "chains leave a gap: {windows:#?}");
    }
    let handed = windows.iter().rev().nth(1).expect("a chain handed over");
    plain.assert_replays(handed.through, "at the end of a chain handed over").await;
    for listing in plain.chains().await {
        let verdict = verify::verify_chain(plain.store.as_ref(), &listing, None).await.unwrap();
        assert!(verdict.ok, "{verdict:#?}");
    }

    // encrypted: a new chain (the recipients changed); its content needs the identity
    let (key_file, public) = support::age_key_file(plain.dir.path(), "stream.key");
    let report = plain.stream_while(Plain::settings(Duration::from_secs(3600), Some(&public)), async {}).await;
    assert!(report.error.is_none(), "{report:#?}");
    let chains = plain.chains().await;
    let sealed = chains.last().unwrap();
    assert!(sealed.descriptor.as_ref().unwrap().encrypted());
    let verdict = verify::verify_chain(plain.store.as_ref(), sealed, None).await.unwrap();
    assert!(verdict.ok && !verdict.content_checked, "{verdict:#?}");
    let identities = hcp_dr::archive::encryption::Identities::from_file(&key_file).unwrap();
    let verdict = verify::verify_chain(plain.store.as_ref(), sealed, Some(&identities)).await.unwrap();
    assert!(verdict.ok && verdict.content_checked, "{verdict:#?}");
    let through = sealed.span().unwrap().through;
    let out = plain.dir.path().join("sealed.db");
    let err = replay(plain.store.as_ref(), "clusters", "plain", Target::Revision(through), &out, None, &plain.tools).await.unwrap_err().to_string();
    assert!(err.contains("--identity"), "{err}");
    let replayed = replay(plain.store.as_ref(), "clusters", "plain", Target::Revision(through), &out, Some(&identities), &plain.tools).await.unwrap();
    assert_eq!(replayed.chain_id, sealed.layout.chain_id);
}

/// A store whose segments take `delay` each to read: a replay slower than
/// a lease's TTL.
struct SlowSegments {
    inner: Arc<dyn Store>,
    delay: Duration,
}

#[async_trait::async_trait]
impl Store for SlowSegments {
    fn url(&self) -> String {
        self.inner.url()
    }
    async fn put(&self, key: &str, body: hcp_dr::store::Body<'_>) -> Result<hcp_dr::store::PutReport, hcp_dr::store::StoreError> {
        self.inner.put(key, body).await
    }
    async fn get(&self, key: &str) -> Result<hcp_dr::store::Body<'static>, hcp_dr::store::StoreError> {
        if key.contains("/segments/") {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<hcp_dr::store::ObjectInfo>, hcp_dr::store::StoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), hcp_dr::store::StoreError> {
        self.inner.delete(key).await
    }
    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, hcp_dr::store::StoreError> {
        self.inner.presign_get(key, ttl).await
    }
}

/// A replay that takes longer than a lease's TTL keeps the lease alive: it
/// does not expire in the scratch etcd and delete its key at a revision
/// of its own (which would stop the replay at the next revision).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_slower_than_a_lease_keeps_the_lease_alive() {
    let plain = Plain::start().await;
    let mut last = 0;
    let report = plain
        .stream_while(Plain::settings(Duration::from_secs(3600), None), async {
            let mut client = plain.client.clone();
            put_leased(&mut client, "/t/short-lived", 5).await;
            for i in 0..4 {
                tokio::time::sleep(Duration::from_millis(700)).await;
                last = put(&mut client, &format!("/t/after/{i}"), "v").await;
            }
        })
        .await;
    assert!(report.error.is_none() && report.chains[0].written.segments >= 4, "{report:#?}");
    let slow = SlowSegments { inner: plain.store.clone(), delay: Duration::from_millis(2500) };
    let out = plain.dir.path().join("slow.db");
    let started = std::time::Instant::now();
    // the lease lives in a scratch etcd only on the way through one
    let tools = hcp_dr::etcd::scratch::ScratchTools { replay_through_etcd: true, ..hcp_dr::etcd::scratch::ScratchTools::find_for("this test").unwrap() };
    let replayed = replay(&slow, "clusters", "plain", Target::Revision(last), &out, None, &tools).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(replayed.scratch.starts_with("a scratch etcd"), "{replayed:#?}");
    assert!(started.elapsed() > Duration::from_secs(6), "the replay took {:?}: not longer than the lease's TTL", started.elapsed());
    assert_eq!(replayed.revision, last);
    let want = keyspace(&mut plain.client.clone(), last).await;
    let (got, ttls) = restored(&out, &plain.dir.path().join("scratch-slow")).await;
    assert!(want == got, "{}", differences(&want, &got));
    assert!(ttls.values().any(|ttl| *ttl == 5), "{ttls:?}");
}

// ---------------------------------------------------------------------
// The sandbox, through the binary

/// A running `hcp-dr stream`: its log lines as they come.
pub struct Streaming(Logged);

impl Streaming {
    pub fn start(env: &Env, store: &Path) -> Streaming {
        Streaming::start_with(env, store, &[])
    }

    /// [`Streaming::start`] with more environment (e.g. `HCP_DR_OBJECTS_INTERVAL`).
    pub fn start_with(env: &Env, store: &Path, extra_env: &[(&str, &str)]) -> Streaming {
        let args = ["stream", "--hosted-cluster", "clusters/demo", "--to", store.to_str().unwrap(), "--segment-interval", "1s", "-o", "json"];
        let mut vars = vec![("HCP_DR_LOG_FORMAT", "text"), ("NO_COLOR", "1")];
        vars.extend_from_slice(extra_env);
        Streaming(Logged::spawn("hcp-dr stream", env.command(&args, &vars)))
    }

    /// Wait until a log line not seen yet contains `needle`; that line.
    pub fn wait_for(&mut self, needle: &str, within: Duration) -> String {
        let at = self.0.wait_after(self.0.log.len(), needle, within);
        self.0.log[at].clone()
    }

    /// SIGTERM; the exit status and the JSON report.
    pub fn term(self) -> (std::process::ExitStatus, serde_json::Value) {
        let (status, report, _) = self.0.term();
        (status, report)
    }

    fn kill(self) {
        self.0.kill(); // SIGKILL
    }
}

/// A client of a member of demo's etcd that is not `avoid`.
async fn member_client(env: &Env, avoid: Option<&str>) -> Client {
    let members = hcp_dr_e2e::drill::member_clients(&env.mgmt, &env.hcp_ns()).await.expect("member clients");
    members.into_iter().find(|(pod, _, _)| Some(pod.as_str()) != avoid).map(|(_, _, c)| c).expect("a member")
}

fn hcp_dr_ok(env: &Env, args: &[&str]) -> serde_json::Value {
    let out = env.hcp_dr(args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    json_report(&out)
}

/// `hcp-dr stream replay` to `target` (`--at-revision N` or `--at TIME`);
/// what the snapshot holds.
async fn replay_cli(env: &Env, store: &Path, target: &[&str], name: &str) -> (serde_json::Value, Vec<Kv>, BTreeMap<i64, i64>) {
    let out = env.dir.path().join(format!("{name}.db"));
    let mut args = vec!["stream", "replay", "--hosted-cluster", "clusters/demo", "--from", store.to_str().unwrap(), "--out", out.to_str().unwrap(), "-o", "json"];
    args.extend_from_slice(target);
    let report = hcp_dr_ok(env, &args);
    let (keys, ttls) = restored(&out, &env.dir.path().join(format!("scratch-{name}"))).await;
    (report, keys, ttls)
}

/// Replay to `revision` with the binary and compare every key with the source.
async fn assert_cli_replays(env: &Env, store: &Path, revision: i64, context: &str) -> Vec<Kv> {
    let (report, got, _) = replay_cli(env, store, &["--at-revision", &revision.to_string()], &format!("r{revision}")).await;
    assert_eq!(report["revision"], revision, "{context}: {report:#}");
    let want = keyspace(&mut member_client(env, None).await, revision).await;
    assert!(want == got, "{context}: replay to {revision}:\n{}", differences(&want, &got));
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_of_a_hosted_cluster_replays_to_any_revision_through_kills_and_a_hung_member() {
    let env = support::env("HighlyAvailable").await;
    let store = env.local_store();
    let store_arg = store.to_str().unwrap().to_string();
    let prefix = "/hcp-dr-test/stream/";

    // keys written at known instants while it streams, then SIGTERM
    let mut streaming = Streaming::start(&env, &store);
    streaming.wait_for("started at base revision", Duration::from_secs(120));
    let mut client = member_client(&env, None).await;
    let a = put(&mut client, &format!("{prefix}a"), "1").await;
    let after_a = Utc::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = put(&mut client, &format!("{prefix}b"), "2").await;
    let three = put_three(&mut client, &format!("{prefix}three/")).await;
    let (lease, leased) = put_leased(&mut client, &format!("{prefix}leased"), 600).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, report) = streaming.term();
    assert!(status.success(), "{status}: {report:#}");
    assert_eq!(report["stopped_by"], "SIGTERM");
    let cluster = &report["clusters"][0];
    assert!(cluster["last_durable_revision"].as_i64().unwrap() >= leased, "{report:#}");
    assert_eq!(cluster["chains"][0]["start"]["how"], "new-base", "{report:#}");

    let verified = hcp_dr_ok(&env, &["stream", "verify", "--hosted-cluster", "clusters/demo", "--from", &store_arg, "-o", "json"]);
    assert_eq!(verified["ok"], true, "{verified:#}");

    let between = assert_cli_replays(&env, &store, b - 1, "between a and b").await;
    assert!(value_of(&between, &format!("{prefix}a")).is_some() && value_of(&between, &format!("{prefix}b")).is_none());
    assert!(a < b);
    let (at_time, keys, _) = replay_cli(&env, &store, &["--at", &(after_a + chrono::Duration::seconds(1)).to_rfc3339()], "time").await;
    assert!(at_time["revision"].as_i64().unwrap() >= a && at_time["revision"].as_i64().unwrap() < b, "{at_time:#}");
    assert!(value_of(&keys, &format!("{prefix}a")).is_some() && value_of(&keys, &format!("{prefix}b")).is_none());
    let before = assert_cli_replays(&env, &store, three - 1, "before the transaction").await;
    assert!(!before.iter().any(|kv| kv.0.starts_with(format!("{prefix}three/").as_bytes())));
    let with = assert_cli_replays(&env, &store, three, "at the transaction").await;
    assert_eq!(with.iter().filter(|kv| kv.0.starts_with(format!("{prefix}three/").as_bytes()) && kv.3 == three).count(), 3);
    let (_, keys, ttls) = replay_cli(&env, &store, &["--at-revision", &leased.to_string()], "leased").await;
    assert_eq!(keys.iter().find(|kv| kv.0 == format!("{prefix}leased").as_bytes()).map(|kv| kv.5), Some(lease));
    assert_eq!(ttls.get(&lease), Some(&600), "{ttls:?}");
    // outside the chain: exit 2, the windows listed
    let out = env.hcp_dr(&["stream", "replay", "--hosted-cluster", "clusters/demo", "--from", &store_arg, "--at-revision", "1", "--out", env.dir.path().join("never.db").to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("the windows that can:") && text(&out).contains("revisions "), "{}", text(&out));

    // SIGKILL under a write load, then a restart: contiguous, verified
    let load = Arc::new(AtomicBool::new(true));
    let writer = {
        let (load, mut client, prefix) = (load.clone(), member_client(&env, None).await, prefix.to_string());
        tokio::spawn(async move {
            let mut n = 0u64;
            while load.load(Ordering::Relaxed) {
                put(&mut client, &format!("{prefix}load/{}", n % 200), &n.to_string()).await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            n
        })
    };
    let mut streaming = Streaming::start(&env, &store);
    streaming.wait_for("resuming chain", Duration::from_secs(60));
    streaming.wait_for("segment", Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    streaming.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut streaming = Streaming::start(&env, &store);
    streaming.wait_for("resuming chain", Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.store(false, Ordering::Relaxed);
    let written = writer.await.unwrap();
    assert!(written > 50, "only {written} writes under load");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, report) = streaming.term();
    assert!(status.success(), "{report:#}");
    let resumed = &report["clusters"][0]["chains"][0];
    assert_eq!(resumed["start"]["how"], "resumed", "{report:#}");
    let listed = hcp_dr_ok(&env, &["stream", "list", "--hosted-cluster", "clusters/demo", "--from", &store_arg, "-o", "json"]);
    assert_eq!(listed["chains"].as_array().unwrap().len(), 1, "one chain, resumed twice: {listed:#}");
    let verified = hcp_dr_ok(&env, &["stream", "verify", "--hosted-cluster", "clusters/demo", "--from", &store_arg, "-o", "json"]);
    let end = verified["chains"][0]["good_through"].as_i64().unwrap();
    assert_eq!(Some(end), report["clusters"][0]["last_durable_revision"].as_i64(), "{verified:#}");
    assert_cli_replays(&env, &store, end, "after a SIGKILL under load").await;

    // the watched member hangs: the watch moves to another, nothing is lost
    let mut streaming = Streaming::start(&env, &store);
    let watching = streaming.wait_for("watching etcd-", Duration::from_secs(60));
    let member = watching.split("watching ").nth(1).and_then(|r| r.split_whitespace().next()).expect("a member").to_string();
    let hung = env.freeze_etcd_member(&member);
    let mut client = member_client(&env, Some(&member)).await;
    let during = put(&mut client, &format!("{prefix}while-{member}-hung"), "x").await;
    streaming.wait_for(&format!("instead of {member}"), Duration::from_secs(60));
    drop(hung);
    let after = put(&mut client, &format!("{prefix}after-{member}-came-back"), "y").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, report) = streaming.term();
    assert!(status.success(), "{report:#}");
    let moves = report["clusters"][0]["moves"].as_array().unwrap();
    assert!(moves.iter().any(|m| m["from"] == member.as_str() && m["reason"].as_str().is_some_and(|r| r.contains(&member))), "{report:#}");
    assert!(report["clusters"][0]["last_durable_revision"].as_i64().unwrap() >= after);
    let keys = assert_cli_replays(&env, &store, after, "after the watched member hung").await;
    assert!(during < after && value_of(&keys, &format!("{prefix}while-{member}-hung")).is_some());

    // a tampered segment is named
    let copy = env.dir.path().join("tampered");
    assert!(std::process::Command::new("cp").arg("-a").arg(&store).arg(&copy).status().unwrap().success());
    let mut segments: Vec<PathBuf> = support::files(&copy).into_iter().filter(|f| f.ends_with(".seg")).map(|f| copy.join(f)).collect();
    segments.sort();
    let victim = segments[segments.len() / 2].clone();
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x04;
    std::fs::write(&victim, bytes).unwrap();
    let out = env.hcp_dr(&["stream", "verify", "--hosted-cluster", "clusters/demo", "--from", copy.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let file = victim.file_name().unwrap().to_string_lossy().to_string();
    assert!(said.contains("PROBLEMS") && said.contains("first problem: segment clusters/demo/stream/") && said.contains(&file) && said.contains("damaged or altered"), "{said}");
}

// ---------------------------------------------------------------------
// Replay with revisions in flight, through the binary

/// A replay keeps several revisions in flight on its scratch etcd, each
/// guarded so that it applies only right after its predecessor. With the
/// test hook making every run of 8 revisions reach the scratch etcd in
/// reverse order, guards fail and revisions are sent again: each is still
/// applied once, at its own revision, and the result is the source key by
/// key (multi-key transactions, deletions that leave no key to guard on,
/// keys with leases, keys overwritten many times).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_whose_revisions_overtake_each_other_is_still_exact() {
    let hooks = hcp_dr::pipeline::runner::TEST_HOOKS;
    assert!(hooks, "HCP_DR_TEST_REPLAY_OVERTAKE needs the test hooks: build with the cargo feature `test-hooks`");
    let plain = Plain::start().await;
    let mut last = 0;
    let report = plain
        .stream_while(Plain::settings(Duration::from_secs(3600), None), async {
            let mut client = plain.client.clone();
            let mut lease = 0;
            for i in 0..400 {
                last = match i % 10 {
                    3 => put_three(&mut client, &format!("/t/three/{i}/")).await,
                    6 => revision_of(client.delete(format!("/registry/pods/ns/p{:02}", (i - 1) % 40), None).await.expect("delete").header()),
                    7 => revision_of(client.delete(format!("/t/three/{}/", i - 4), Some(etcd_client::DeleteOptions::new().with_prefix())).await.expect("delete").header()),
                    8 => {
                        if i % 50 == 8 {
                            lease = client.lease_grant(600, None).await.expect("lease").id();
                        }
                        revision_of(client.put(format!("/registry/events/ns/e{i}"), "event", Some(PutOptions::new().with_lease(lease))).await.expect("put").header())
                    }
                    _ => put(&mut client, &format!("/registry/pods/ns/p{:02}", i % 40), &format!("pod at step {i}")).await,
                };
            }
        })
        .await;
    assert!(report.error.is_none(), "{report:#?}");
    let out = plain.dir.path().join("overtaken.db");
    let store = plain.dir.path().join("store");
    let args = ["stream", "replay", "--hosted-cluster", "clusters/plain", "--from", store.to_str().unwrap(), "--at-revision", &last.to_string(), "--out", out.to_str().unwrap(), "-o", "json"];
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(args).env("HCP_DR_TEST_REPLAY_OVERTAKE", "8").env("HCP_DR_REPLAY_THROUGH_ETCD", "1").output().expect("run hcp-dr");
    assert!(output.status.success(), "{}", text(&output));
    let replayed = json_report(&output);
    assert_eq!(replayed["revision"], last, "{replayed:#}");
    assert!(replayed["revisions_applied"].as_i64().unwrap() >= 400, "{replayed:#}");
    assert!(replayed["revisions_resent"].as_i64().unwrap() > 0, "the hook made no revision overtake another: {replayed:#}");
    let want = keyspace(&mut plain.client.clone(), last).await;
    let (got, ttls) = restored(&out, &plain.dir.path().join("scratch-overtaken")).await;
    assert!(want == got, "{}", differences(&want, &got));
    assert!(ttls.values().all(|ttl| *ttl == 600), "{ttls:?}");
}

// ---------------------------------------------------------------------
// The store unreachable: the spool, through the library

/// A store that refuses every write while `down` is set (an outage).
struct Outage {
    inner: Arc<dyn Store>,
    down: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl Store for Outage {
    fn url(&self) -> String {
        self.inner.url()
    }
    async fn put(&self, key: &str, body: hcp_dr::store::Body<'_>) -> Result<hcp_dr::store::PutReport, hcp_dr::store::StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(hcp_dr::store::StoreError::Io { path: key.into(), source: std::io::Error::other("the store is down (test outage)") });
        }
        self.inner.put(key, body).await
    }
    async fn get(&self, key: &str) -> Result<hcp_dr::store::Body<'static>, hcp_dr::store::StoreError> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<hcp_dr::store::ObjectInfo>, hcp_dr::store::StoreError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), hcp_dr::store::StoreError> {
        self.inner.delete(key).await
    }
    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, hcp_dr::store::StoreError> {
        self.inner.presign_get(key, ttl).await
    }
}

/// A stream of the plain etcd through an [`Outage`] with a spool of
/// `limit` bytes, running until `stop`.
struct Spooling {
    down: Arc<AtomicBool>,
    spool: hcp_dr::stream::spool::SpoolSettings,
    metrics: Arc<hcp_dr::stream::metrics::ClusterMetrics>,
    stop: tokio::sync::watch::Sender<bool>,
    running: tokio::task::JoinHandle<ClusterReport>,
}

impl Spooling {
    async fn start(plain: &Plain, limit: u64) -> Spooling {
        Spooling::start_with(plain, hcp_dr::stream::spool::SpoolSettings::new(plain.dir.path().join("spool"), limit)).await
    }

    async fn start_with(plain: &Plain, spool: hcp_dr::stream::spool::SpoolSettings) -> Spooling {
        let down = Arc::new(AtomicBool::new(false));
        let store: Arc<dyn Store> = Arc::new(Outage { inner: plain.store.clone(), down: down.clone() });
        let metrics = hcp_dr::stream::metrics::Registry::default().cluster("clusters", "plain");
        let cluster = Cluster { namespace: "clusters".into(), hosted_cluster: "plain".into(), store, source: Arc::new(FixedMembers(vec![plain.member.clone()])) };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (_never, lost) = tokio::sync::watch::channel(None);
        let hooks = hcp_dr::stream::run::Hooks { stop: stopped, lost, metrics: Some(metrics.clone()), spool: Some(spool.clone()) };
        let running = tokio::spawn(hcp_dr::stream::run::run_with(cluster, Plain::settings(Duration::from_secs(3600), None), hooks));
        let marker = put(&mut plain.client.clone(), "/stream-test/spool-marker", "m").await;
        until(|| async { durable_while_writing(&plain).await >= marker }, "the stream never wrote its first revision").await;
        Spooling { down, spool, metrics, stop, running }
    }

    fn spooled(&self) -> u64 {
        self.metrics.spooled_bytes.load(Ordering::SeqCst)
    }

    /// Files in the spool directory.
    fn files(&self) -> Vec<PathBuf> {
        files_under(&self.spool.dir)
    }

    async fn stop(self) -> ClusterReport {
        self.stop.send(true).unwrap();
        self.running.await.unwrap()
    }
}

/// [`Plain::durable_through`] while the stream writes: a listing that
/// races a segment's write (its `.partial` renamed away meanwhile) counts
/// as nothing yet, and is asked again.
async fn durable_while_writing(plain: &Plain) -> i64 {
    match catalog::chains(plain.store.as_ref(), "clusters", "plain").await {
        Ok((chains, _)) => chains.last().and_then(|c| c.span()).map_or(0, |s| s.through),
        Err(_) => 0,
    }
}

/// Wait for `ready` (polled every 100 ms, at most 60 s), else fail saying `what`.
async fn until<F: std::future::Future<Output = bool>>(ready: impl Fn() -> F, what: &str) {
    for _ in 0..600 {
        if ready().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} (waited 60 s)");
}

/// A value zstd cannot shrink much: hex of a xorshift sequence.
fn noise(seed: u64, chars: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..chars.div_ceil(16))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect::<String>()[..chars]
        .to_string()
}

/// The store down for a while: the stream spools its segments on disk,
/// keeps watching, and uploads them in order when the store answers: no
/// break, one contiguous chain that replays key by key at every point.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_down_for_a_while_is_caught_up_from_the_spool_in_order() {
    let plain = Plain::start().await;
    let streaming = Spooling::start(&plain, 64 << 20).await;
    let durable_before = plain.durable_through().await;
    streaming.down.store(true, Ordering::SeqCst);
    let mut client = plain.client.clone();
    let mut written = Vec::new();
    for i in 0..8 {
        written.push(put(&mut client, &format!("/t/outage/{i}"), &format!("v{i}")).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let last = put_three(&mut client, "/t/outage/three/").await;
    until(|| async { streaming.files().len() >= 2 }, "the segments written during the outage were not spooled").await;
    assert!(streaming.spooled() > 0, "hcp_dr_stream_spooled_bytes says nothing waits");
    assert_eq!(plain.durable_through().await, durable_before, "the store took a segment while it was down");
    for file in streaming.files() {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600, "{}", file.display());
    }

    streaming.down.store(false, Ordering::SeqCst);
    until(|| async { durable_while_writing(&plain).await >= last }, "the spooled segments were not uploaded once the store answered").await;
    until(|| async { streaming.spooled() == 0 && streaming.files().is_empty() }, "the spool was not emptied").await;
    let spool_used = streaming.spool.used();
    let report = streaming.stop().await;
    assert!(report.error.is_none() && report.breaks.is_empty(), "{report:#?}");
    assert_eq!(report.chains.len(), 1, "{report:#?}");
    assert_eq!(spool_used, 0);

    let chains = plain.chains().await;
    let span = chains[0].span().unwrap();
    assert!(span.problem.is_none() && span.through >= last, "{span:#?}");
    let verdict = verify::verify_chain(plain.store.as_ref(), &chains[0], None).await.unwrap();
    assert!(verdict.ok && verdict.content_checked, "{verdict:#?}");
    plain.assert_replays(written[3], "in the middle of the outage").await;
    plain.assert_replays(last, "at the end of the outage").await;
}

/// The store down past a tiny spool: the chain breaks when the spool is
/// full (the metrics say so at once), what was spooled is uploaded when
/// the store answers, the revisions after it are reported lost, and a new
/// chain starts from a new base. The spool never holds more than its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_down_past_a_full_spool_breaks_the_chain_and_a_new_one_starts() {
    let plain = Plain::start().await;
    // room for a segment of a value of 1000 hex digits (500 bytes of
    // entropy), not for one of 6000 (3000 bytes of entropy)
    let limit = 3000;
    let streaming = Spooling::start(&plain, limit).await;
    let chains_before = plain.chains().await.len();
    streaming.down.store(true, Ordering::SeqCst);
    let mut client = plain.client.clone();
    let spooled = put(&mut client, "/t/full/spooled", &noise(1, 1000)).await;
    until(|| async { streaming.files().len() == 1 }, "the first segment of the outage was not spooled").await;
    let dropped = put(&mut client, "/t/full/dropped", &noise(2, 6000)).await;
    until(|| async { streaming.metrics.breaks.load(Ordering::SeqCst) == 1 }, "the full spool was not reported as a break").await;
    assert!(streaming.spooled() <= limit && streaming.spool.used() <= limit, "the spool holds {} bytes, past its bound {limit}", streaming.spool.used());
    let lost_too = put(&mut client, "/t/full/while-down", "lost").await;

    streaming.down.store(false, Ordering::SeqCst);
    until(|| async { catalog::chains(plain.store.as_ref(), "clusters", "plain").await.is_ok_and(|(c, _)| c.len() > chains_before) }, "no new chain started once the store answered").await;
    let after = put(&mut client, "/t/full/after", "kept").await;
    until(|| async { durable_while_writing(&plain).await >= after }, "the new chain did not write").await;
    let report = streaming.stop().await;
    assert!(report.error.is_none(), "{report:#?}");
    assert_eq!(report.breaks.len(), 1, "{report:#?}");
    let broken = &report.breaks[0];
    assert_eq!(broken.last_revision, spooled, "the spooled segment was uploaded: {broken:#?}");
    assert!(broken.reason.contains("store unreachable") && broken.reason.contains(&format!("the spool ({limit} bytes) is full")), "{broken:#?}");
    let (from, to) = broken.lost().expect("revisions lost");
    assert_eq!(from, dropped);
    // the write while down is in the new base, or lost with the dropped segment
    assert!(to == broken.next_base_revision.unwrap() - 1 && broken.next_base_revision.unwrap() >= lost_too, "{broken:#?}");
    assert!(report.warnings.iter().any(|w| w.contains(&format!("revisions {from}..{to}")) && w.contains("in no chain")), "{:#?}", report.warnings);
    assert!(files_under(&plain.dir.path().join("spool")).is_empty(), "spool files left behind");

    let chains = plain.chains().await;
    let old = &chains[chains_before - 1];
    let verdict = verify::verify_chain(plain.store.as_ref(), old, None).await.unwrap();
    assert!(verdict.ok && verdict.good_through == Some(spooled), "{verdict:#?}");
    let new_chain = chains.last().unwrap().descriptor.as_ref().unwrap();
    assert!(new_chain.previous.as_ref().is_some_and(|p| p.chain_id == old.layout.chain_id && p.last_revision == spooled), "{new_chain:#?}");
    plain.assert_replays(spooled, "the last revision the spool kept").await;
    let err = plain.replay_to(Target::Revision(dropped), "dropped").await.unwrap_err().to_string();
    assert!(err.contains("cannot be restored"), "{err}");
    plain.assert_replays(after, "after the new base").await;
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().is_dir() {
            out.extend(files_under(&entry.path()));
        } else {
            out.push(entry.path());
        }
    }
    out
}

/// A stop while the store is down: the spool gets its bounded time, then
/// the run fails naming the revisions that are not durable and where they
/// wait; the next run uploads them first and resumes the chain after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_while_the_store_is_down_leaves_the_spool_to_the_next_run() {
    let plain = Plain::start().await;
    let dir = plain.dir.path().join("spool");
    let spool = hcp_dr::stream::spool::SpoolSettings::new(dir.clone(), 64 << 20).with_stop_drain(Duration::from_secs(1));
    let streaming = Spooling::start_with(&plain, spool).await;
    let durable_before = plain.durable_through().await;
    streaming.down.store(true, Ordering::SeqCst);
    let mut client = plain.client.clone();
    let first = put(&mut client, "/t/stop/first", "1").await;
    until(|| async { streaming.files().len() == 1 }, "the first segment of the outage was not spooled").await;
    let last = put(&mut client, "/t/stop/last", "2").await;
    until(|| async { streaming.files().len() == 2 }, "the second segment of the outage was not spooled").await;
    let report = streaming.stop().await;
    let error = report.error.clone().unwrap_or_else(|| panic!("a stop leaving revisions not durable did not fail: {report:#?}"));
    assert!(error.contains(&format!("revisions {first}..{last} are not durable")) && error.contains(&dir.display().to_string()), "{error}");
    assert_eq!(plain.durable_through().await, durable_before);
    assert_eq!(files_under(&dir).len(), 2, "the spooled segments are kept for the next run");

    let streaming = Spooling::start(&plain, 64 << 20).await;
    let after = put(&mut client, "/t/stop/after", "3").await;
    until(|| async { durable_while_writing(&plain).await >= after }, "the resumed chain did not write").await;
    let report = streaming.stop().await;
    assert!(report.error.is_none() && report.breaks.is_empty(), "{report:#?}");
    assert!(report.warnings.iter().any(|w| w.contains("left in the spool uploaded first") && w.contains(&format!("revisions {first}..{last}"))), "{:#?}", report.warnings);
    assert!(matches!(report.chains[0].start, hcp_dr::stream::run::ChainStart::Resumed { after } if after == last), "{report:#?}");
    assert!(files_under(&dir).is_empty(), "spool files left behind");
    let chains = plain.chains().await;
    assert_eq!(chains.len(), 1);
    let verdict = verify::verify_chain(plain.store.as_ref(), &chains[0], None).await.unwrap();
    assert!(verdict.ok && verdict.content_checked, "{verdict:#?}");
    plain.assert_replays(first, "the first revision the spool kept over the stop").await;
    plain.assert_replays(after, "after the restart").await;
}

/// What etcd wrote while no stream ran (after a crash or a restart) is
/// older than any interval: a resumed chain makes it durable as soon as
/// the watch has caught up with it (the member's first progress answer),
/// not a whole `--segment-interval` later: with a 10-minute interval the
/// catch-up segment still comes within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resumed_chain_writes_what_it_missed_once_caught_up_not_an_interval_later() {
    let plain = Plain::start().await;
    let report = plain.stream_while(Plain::settings(Duration::from_secs(3600), None), async {}).await;
    assert!(report.error.is_none(), "{report:#?}");
    let mut client = plain.client.clone();
    let mut missed = 0;
    for i in 0..5 {
        missed = put(&mut client, &format!("/t/missed/{i}"), "while no stream ran").await;
    }
    let mut settings = Plain::settings(Duration::from_secs(3600), None);
    settings.cut.interval = Duration::from_secs(600);
    let cluster = Cluster { namespace: "clusters".into(), hosted_cluster: "plain".into(), store: plain.store.clone(), source: Arc::new(FixedMembers(vec![plain.member.clone()])) };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(run(cluster, settings, stopped));
    let mut caught_up = false;
    for _ in 0..600 {
        if plain.durable_through().await >= missed {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send(true).unwrap();
    let report = running.await.unwrap();
    assert!(caught_up, "the revisions missed while down were not durable within a minute of resuming (interval 10 minutes): {report:#?}");
    assert!(matches!(report.chains[0].start, hcp_dr::stream::run::ChainStart::Resumed { .. }), "{report:#?}");
    plain.assert_replays(missed, "what was written while no stream ran").await;
}
