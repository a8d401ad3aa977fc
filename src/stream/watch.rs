//! The watch: every revision of the whole keyspace from a start revision,
//! on one member at a time, handed on one [`RevisionRecord`] per revision
//! through a bounded queue (the writer stores them; a slow store slows the
//! watch down, and etcd keeps what it has not sent in its history).
//!
//! When the member fails (an error, a closed stream, no leader, or no
//! answer to a progress request within `silence`: a hung member keeps its
//! TCP connection), the watch moves to another healthy member and starts
//! again at the revision after the last one it handed on: nothing is
//! skipped, and a revision seen twice is dropped. When etcd has compacted
//! the revision the watch needs, or a revision is missing (never expected:
//! every write transaction is one revision, and a watch of every key sees
//! each), the watch says so and ends: the chain cannot go on.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use etcd_client::{EventType, WatchOptions};
use tokio::sync::mpsc;

use super::format::{Bytes, Event, LeaseGrant, RevisionRecord};
use super::source::{MemberSource, Reached};

/// How the watch checks that its member still answers.
#[derive(Debug, Clone, Copy)]
pub struct WatchSettings {
    /// How often to ask the member for its progress.
    pub progress_every: Duration,
    /// How long without any answer before the member counts as failed.
    pub silence: Duration,
}

impl Default for WatchSettings {
    fn default() -> WatchSettings {
        WatchSettings { progress_every: Duration::from_secs(2), silence: Duration::from_secs(10) }
    }
}

/// What the watch hands on.
#[derive(Debug, Clone)]
pub enum WatchItem {
    /// The next revision.
    Revision(RevisionRecord),
    /// The watch runs on `to` from revision `at` (`from`: the member before,
    /// and why it was left).
    Moved { from: Option<String>, to: String, at: i64, reason: Option<String> },
    /// No member could be used (the watch keeps trying).
    Trouble(String),
    /// etcd compacted its history past `next`, the revision the watch
    /// needed (to `compact_revision`). The watch has ended.
    Compacted { next: i64, compact_revision: i64, member: String },
    /// Revision `got` came where `expected` was due. The watch has ended.
    Gap { expected: i64, got: i64, member: String },
    /// The member answered (a progress notification) that it had made no
    /// revision past the ones handed on so far, at `at`.
    Current { at: chrono::DateTime<Utc> },
}

/// Watch from revision `from` on, handing every revision to `tx`, until
/// `tx` is closed or the watch cannot go on.
pub fn spawn(source: Arc<dyn MemberSource>, from: i64, settings: WatchSettings, tx: mpsc::Sender<WatchItem>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(source, from, settings, tx))
}

/// How a watch on one member ended.
enum Ended {
    /// The receiver went away.
    Closed,
    /// Compacted or gap: said, and no other member can help.
    Final,
    /// The member failed; another may do.
    Failed(String),
}

async fn run(source: Arc<dyn MemberSource>, from: i64, settings: WatchSettings, tx: mpsc::Sender<WatchItem>) {
    let mut next = from;
    let mut current: Option<String> = None;
    let mut reason: Option<String> = None;
    let mut leases = HashSet::new();
    let mut attempt = 0u32;
    loop {
        let avoid: Vec<String> = current.iter().cloned().collect();
        let reached = tokio::select! {
            reached = source.reach(&avoid) => reached,
            _ = tx.closed() => return,
        };
        let reached = match reached {
            Ok(reached) => reached,
            Err(err) => {
                attempt += 1;
                if tx.send(WatchItem::Trouble(err)).await.is_err() {
                    return;
                }
                tokio::time::sleep(crate::duration::backoff(Duration::from_secs(1), Duration::from_secs(10), attempt)).await;
                continue;
            }
        };
        let moved = WatchItem::Moved { from: current.clone(), to: reached.member.name.clone(), at: next, reason: reason.take() };
        if tx.send(moved).await.is_err() {
            return;
        }
        current = Some(reached.member.name.clone());
        let started = Instant::now();
        match watch_member(&reached, &mut next, &settings, &tx, &mut leases).await {
            Ended::Closed | Ended::Final => return,
            Ended::Failed(why) => {
                reason = Some(why);
                // a member that worked for a while gets a fresh start
                attempt = if started.elapsed() > Duration::from_secs(60) { 1 } else { attempt + 1 };
                tokio::time::sleep(crate::duration::backoff(Duration::from_millis(200), Duration::from_secs(5), attempt)).await;
            }
        }
    }
}

/// The events of one watch response, one record per revision.
fn records(response: &etcd_client::WatchResponse) -> Vec<RevisionRecord> {
    let received = Utc::now();
    let mut out: Vec<RevisionRecord> = Vec::new();
    for event in response.events() {
        let Some(kv) = event.kv() else { continue };
        let revision = kv.mod_revision();
        let event = match event.event_type() {
            EventType::Put => Event::Put {
                key: Bytes(kv.key().to_vec()),
                value: Bytes(kv.value().to_vec()),
                create_revision: kv.create_revision(),
                mod_revision: revision,
                version: kv.version(),
                lease: kv.lease(),
            },
            EventType::Delete => Event::Delete { key: Bytes(kv.key().to_vec()) },
        };
        match out.last_mut() {
            Some(record) if record.revision == revision => record.events.push(event),
            _ => out.push(RevisionRecord { revision, received, events: vec![event], leases: Vec::new() }),
        }
    }
    out
}

async fn watch_member(reached: &Reached, next: &mut i64, settings: &WatchSettings, tx: &mpsc::Sender<WatchItem>, leases: &mut HashSet<i64>) -> Ended {
    let member = &reached.member;
    let failed = |what: &str, err: &dyn std::fmt::Display| Ended::Failed(format!("{}: {what}: {err}", member.name));
    let mut client = match member.connect_requiring_leader().await {
        Ok(client) => client,
        Err(err) => return Ended::Failed(err.to_string()),
    };
    let options = WatchOptions::new().with_all_keys().with_start_revision(*next).with_progress_notify();
    let (mut requests, mut responses) = match client.watch("", Some(options)).await {
        Ok(stream) => stream.split(),
        Err(err) => return failed("starting the watch", &err),
    };
    let mut probe = tokio::time::interval(settings.progress_every);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = Instant::now();
    loop {
        let response = tokio::select! {
            response = responses.message() => response,
            _ = probe.tick() => {
                if heard.elapsed() > settings.silence {
                    return Ended::Failed(format!("{}: no answer for {}s (hung or cut off)", member.name, heard.elapsed().as_secs()));
                }
                if let Err(err) = requests.request_progress().await {
                    return failed("asking for progress", &err);
                }
                continue;
            }
            _ = tx.closed() => return Ended::Closed,
        };
        let response = match response {
            Ok(Some(response)) => response,
            Ok(None) => return Ended::Failed(format!("{}: the member closed the watch", member.name)),
            Err(err) => return failed("watching", &err),
        };
        heard = Instant::now();
        if response.compact_revision() > 0 {
            let compacted = WatchItem::Compacted { next: *next, compact_revision: response.compact_revision(), member: member.name.clone() };
            let _ = tx.send(compacted).await;
            return Ended::Final;
        }
        if response.canceled() {
            return Ended::Failed(format!("{}: the member cancelled the watch: {}", member.name, response.cancel_reason()));
        }
        if response.events().is_empty()
            && response.header().is_some_and(|h| h.revision() < *next)
            && tx.send(WatchItem::Current { at: Utc::now() }).await.is_err()
        {
            return Ended::Closed;
        }
        for mut record in records(&response) {
            if record.revision < *next {
                continue;
            }
            if record.revision > *next {
                let _ = tx.send(WatchItem::Gap { expected: *next, got: record.revision, member: member.name.clone() }).await;
                return Ended::Final;
            }
            for id in lease_ids(&record) {
                if leases.contains(&id) {
                    continue;
                }
                let ttl = match client.lease_time_to_live(id, None).await {
                    Ok(answer) if answer.ttl() >= 0 => Some(answer.granted_ttl()),
                    Ok(_) => None,
                    Err(err) => return failed("reading a lease's TTL", &err),
                };
                record.leases.push(LeaseGrant { id, ttl });
                leases.insert(id);
            }
            *next = record.revision + 1;
            if tx.send(WatchItem::Revision(record)).await.is_err() {
                return Ended::Closed;
            }
        }
    }
}

/// The leases the puts of `record` attach keys to, each once.
fn lease_ids(record: &RevisionRecord) -> Vec<i64> {
    let mut ids: Vec<i64> = record
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Put { lease, .. } if *lease != 0 => Some(*lease),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}
