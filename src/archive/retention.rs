//! Which backups a retention policy keeps, per hosted cluster, as pure
//! functions of the backups' times (so the rules are tested exactly).
//!
//! Rules combine as in common backup tools (restic, borg): a complete
//! backup is kept when ANY `keep-*` rule selects it; `max-age` removes what
//! is older than it even if a keep rule selected it. Two safety rules come
//! last and win: the newest complete backup of a cluster is never removed
//! (a cluster is never left without a usable backup), and incomplete backups
//! (no manifest) are removed only once older than `incomplete_after`, so a
//! backup still being written is never touched.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Datelike, Duration, Utc};
use serde::Serialize;

/// A retention policy; all `None`/0 keeps everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// The N newest complete backups.
    pub keep_last: Option<usize>,
    /// The newest complete backup of each of the last N days that have one.
    pub keep_daily: Option<usize>,
    /// The newest complete backup of each of the last N ISO weeks that have one.
    pub keep_weekly: Option<usize>,
    /// Remove complete backups older than this.
    pub max_age: Option<Duration>,
    /// Remove incomplete backups older than this.
    pub incomplete_after: Duration,
    /// Remove ended stream chains last written longer ago than this; `None`:
    /// those last written before the cluster's oldest kept complete backup.
    pub keep_stream: Option<Duration>,
}

impl Policy {
    pub fn is_empty(&self) -> bool {
        self.keep_last.is_none() && self.keep_daily.is_none() && self.keep_weekly.is_none() && self.max_age.is_none()
    }
}

/// One backup as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub taken: DateTime<Utc>,
    pub complete: bool,
    /// A point-in-time backup (`restore --at`): made from the stream and a
    /// regular backup's objects, not taken. It does not count for the keep
    /// rules (each would push a regular backup out) and goes with the
    /// regular backups of its time.
    pub derived: bool,
}

/// The decision for one backup, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub id: String,
    pub keep: bool,
    pub reasons: Vec<String>,
}

fn newest_per<K: Ord>(complete: &[&Candidate], key: impl Fn(&Candidate) -> K, n: usize) -> BTreeSet<String> {
    // complete is newest first: the first seen of each key is its newest
    let mut seen = BTreeMap::new();
    let mut order = Vec::new();
    for c in complete {
        let k = key(c);
        if !seen.contains_key(&k) {
            order.push(c.id.clone());
            seen.insert(k, ());
        }
        if order.len() == n {
            break;
        }
    }
    order.into_iter().collect()
}

/// Decide, for the backups of ONE cluster, which to keep at `now`.
/// Returned newest first.
pub fn decide(backups: &[Candidate], policy: &Policy, now: DateTime<Utc>) -> Vec<Decision> {
    let mut sorted: Vec<&Candidate> = backups.iter().collect();
    sorted.sort_by(|a, b| b.taken.cmp(&a.taken).then(b.id.cmp(&a.id)));
    let complete: Vec<&Candidate> = sorted.iter().copied().filter(|c| c.complete && !c.derived).collect();
    let last: BTreeSet<String> = policy.keep_last.map(|n| complete.iter().take(n).map(|c| c.id.clone()).collect()).unwrap_or_default();
    let daily = policy.keep_daily.map(|n| newest_per(&complete, |c| c.taken.date_naive(), n)).unwrap_or_default();
    let weekly = policy
        .keep_weekly
        .map(|n| newest_per(&complete, |c| (c.taken.iso_week().year(), c.taken.iso_week().week()), n))
        .unwrap_or_default();
    let any_keep_rule = policy.keep_last.is_some() || policy.keep_daily.is_some() || policy.keep_weekly.is_some();
    let newest_complete = complete.first().map(|c| c.id.clone());

    let mut decisions: Vec<Decision> = sorted
        .iter()
        .map(|c| {
            let mut reasons = Vec::new();
            let keep = if c.derived {
                // decided below, from the regular backups kept
                true
            } else if !c.complete {
                if now - c.taken > policy.incomplete_after {
                    reasons.push(format!("incomplete (no manifest) for more than {}h", policy.incomplete_after.num_hours()));
                    false
                } else {
                    reasons.push("incomplete but recent: may still be being written".into());
                    true
                }
            } else {
                let mut keep = !any_keep_rule;
                for (set, rule) in [(&last, "keep-last"), (&daily, "keep-daily"), (&weekly, "keep-weekly")] {
                    if set.contains(&c.id) {
                        keep = true;
                        reasons.push(rule.to_string());
                    }
                }
                if any_keep_rule && !keep {
                    reasons.push("selected by no keep rule".into());
                }
                if let Some(max_age) = policy.max_age {
                    if now - c.taken > max_age {
                        keep = false;
                        reasons.push(format!("older than max-age ({}d)", max_age.num_days()));
                    }
                }
                if !keep && newest_complete.as_deref() == Some(c.id.as_str()) {
                    keep = true;
                    reasons.push("the newest complete backup of the cluster is never removed".into());
                }
                keep
            };
            Decision {
                id: c.id.clone(),
                keep,
                reasons,
            }
        })
        .collect();
    // a point-in-time backup stays while a regular backup as old or older
    // stays (max-age still applies): it goes with the backups of its time
    let oldest_kept = sorted.iter().zip(&decisions).filter(|(c, d)| d.keep && c.complete && !c.derived).map(|(c, _)| c.taken).min();
    for (c, decision) in sorted.iter().zip(decisions.iter_mut()) {
        if !c.derived {
            continue;
        }
        let (keep, why) = match oldest_kept {
            // only --max-age: it alone decides, as for the regular backups
            _ if !any_keep_rule => (true, "point in time"),
            Some(oldest) if c.taken >= oldest => (true, "point in time: a regular backup as old or older is kept"),
            Some(_) => (false, "point in time: older than every regular backup kept"),
            // nothing to go with: never the last backups a cluster has
            None => (true, "point in time: no regular backup is kept to go with"),
        };
        decision.keep = keep;
        decision.reasons.push(why.into());
        if let Some(max_age) = policy.max_age
            && now - c.taken > max_age
        {
            decision.keep = false;
            decision.reasons.push(format!("older than max-age ({}d)", max_age.num_days()));
        }
    }
    decisions
}

/// One `hcp-dr stream` chain as retention sees it (a cluster's chains are
/// given oldest first; the last is the newest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainCandidate {
    pub id: String,
    /// When anything was last written to it (`None`: unknown, or its
    /// descriptor is unreadable).
    pub last_written: Option<DateTime<Utc>>,
    /// Why its descriptor cannot be read, when it cannot.
    pub unreadable: Option<String>,
}

/// Which chains go: a chain is removed, whole, only when a newer chain
/// follows it (it ended: the stream writes only the newest) and it was
/// last written before `cutoff` (the time and what it is, for the
/// reasons); with no cutoff every chain is kept. A chain that cannot be
/// read, or whose time is unknown, is kept.
pub fn decide_chains(chains: &[ChainCandidate], cutoff: Option<(DateTime<Utc>, &str)>) -> Vec<Decision> {
    let at = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    chains
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (keep, reason) = match (i + 1 == chains.len(), &c.unreadable, c.last_written, cutoff) {
                (true, _, _, _) => (true, "the newest chain: the stream may still be writing it, and it holds the latest revisions".to_string()),
                (_, Some(why), _, _) => (true, format!("its chain.json is unreadable ({why}): nothing says what it holds; repair or remove it by hand")),
                (_, _, None, _) => (true, "the store gives no write time for it".to_string()),
                (_, _, Some(_), None) => (true, "no cutoff: no --keep-stream and no complete backup of the cluster kept".to_string()),
                (_, _, Some(last), Some((cutoff, what))) if last >= cutoff => (true, format!("last written {}, within {what}", at(last))),
                (_, _, Some(last), Some((_, what))) => (false, format!("ended (chain {} follows it), last written {}, before {what}", chains[i + 1].id, at(last))),
            };
            Decision { id: c.id.clone(), keep, reasons: vec![reason] }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// Backups every 12 hours for 20 days before `now` (newest at now-1h),
    /// ids `b00` (newest) .. `b39`.
    fn history() -> (Vec<Candidate>, DateTime<Utc>) {
        let now = at("2026-11-21T12:00:00Z");
        let backups = (0..40)
            .map(|i| Candidate {
                id: format!("b{i:02}"),
                taken: now - Duration::hours(1) - Duration::hours(12 * i),
                complete: true,
                derived: false,
            })
            .collect();
        (backups, now)
    }

    fn kept(decisions: &[Decision]) -> Vec<&str> {
        decisions.iter().filter(|d| d.keep).map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn no_policy_keeps_everything() {
        let (b, now) = history();
        assert_eq!(kept(&decide(&b, &Policy::default(), now)).len(), 40);
    }

    #[test]
    fn keep_last() {
        let (b, now) = history();
        let p = Policy { keep_last: Some(3), ..Policy::default() };
        assert_eq!(kept(&decide(&b, &p, now)), ["b00", "b01", "b02"]);
    }

    #[test]
    fn keep_daily_takes_the_newest_of_each_day() {
        let (b, now) = history();
        // b00 2026-11-21T11, b01 2026-11-20T23, b02 11-20T11, b03 11-19T23 ...
        let p = Policy { keep_daily: Some(3), ..Policy::default() };
        assert_eq!(kept(&decide(&b, &p, now)), ["b00", "b01", "b03"]);
    }

    #[test]
    fn keep_weekly_takes_the_newest_of_each_iso_week() {
        let (b, now) = history();
        // 2026-11-21 is a Saturday (week 47); week 46 ends Sunday 11-15 23:59
        let p = Policy { keep_weekly: Some(3), ..Policy::default() };
        let decisions = decide(&b, &p, now);
        let k = kept(&decisions);
        assert_eq!(k.len(), 3);
        assert_eq!(k[0], "b00");
        // newest of week 46: Sunday 2026-11-15T23:00 = now - 133h = b11
        assert_eq!(k[1], "b11");
        // newest of week 45: 2026-11-08T23:00 = b25
        assert_eq!(k[2], "b25");
    }

    #[test]
    fn rules_combine_as_a_union_and_max_age_cuts() {
        let (b, now) = history();
        let p = Policy { keep_last: Some(2), keep_daily: Some(4), ..Policy::default() };
        assert_eq!(kept(&decide(&b, &p, now)), ["b00", "b01", "b03", "b05"]);
        let p = Policy { keep_last: Some(2), keep_weekly: Some(3), max_age: Some(Duration::days(7)), ..Policy::default() };
        // b25 (13 days old) is cut by max-age although keep-weekly picked it
        assert_eq!(kept(&decide(&b, &p, now)), ["b00", "b01", "b11"]);
        let p = Policy { max_age: Some(Duration::days(2)), ..Policy::default() };
        assert_eq!(kept(&decide(&b, &p, now)), ["b00", "b01", "b02", "b03"]);
    }

    #[test]
    fn the_newest_complete_backup_always_stays() {
        let now = at("2026-11-21T12:00:00Z");
        let b = vec![
            Candidate { id: "old".into(), taken: now - Duration::days(90), complete: true, derived: false },
            Candidate { id: "partial".into(), taken: now - Duration::days(2), complete: false, derived: false },
        ];
        let p = Policy { max_age: Some(Duration::days(30)), incomplete_after: Duration::hours(24), ..Policy::default() };
        let d = decide(&b, &p, now);
        assert_eq!(kept(&d), ["old"]);
        assert!(d.iter().find(|x| x.id == "old").unwrap().reasons.iter().any(|r| r.contains("never removed")));
    }

    #[test]
    fn point_in_time_backups_count_for_no_rule_and_go_with_the_backups_of_their_time() {
        let now = at("2026-11-21T12:00:00Z");
        let regular = |id: &str, hours: i64| Candidate { id: id.into(), taken: now - Duration::hours(hours), complete: true, derived: false };
        let point = |id: &str, hours: i64| Candidate { id: id.into(), taken: now - Duration::hours(hours), complete: true, derived: true };
        let b = vec![point("p1", 1), regular("r2", 2), point("p3", 3), regular("r4", 4), point("p5", 5), regular("r6", 6)];
        // keep-last 2 keeps two regular backups, not a point-in-time one in their place
        let p = Policy { keep_last: Some(2), ..Policy::default() };
        let d = decide(&b, &p, now);
        assert_eq!(kept(&d), ["p1", "r2", "p3", "r4"]);
        assert!(d.iter().find(|x| x.id == "p5").unwrap().reasons.iter().any(|r| r.contains("older than every regular backup kept")), "{d:?}");
        // max-age cuts them as any backup
        let p = Policy { keep_last: Some(3), max_age: Some(Duration::hours(2)), ..Policy::default() };
        assert_eq!(kept(&decide(&b, &p, now)), ["p1", "r2"]);
        // --max-age alone decides for them as for the others
        let p = Policy { max_age: Some(Duration::hours(4)), ..Policy::default() };
        assert_eq!(kept(&decide(&b, &p, now)), ["p1", "r2", "p3", "r4"]);
        // no regular backup kept: the point-in-time ones stay (never a cluster's last backups)
        let only = vec![point("p1", 1)];
        assert_eq!(kept(&decide(&only, &Policy { keep_last: Some(1), ..Policy::default() }, now)), ["p1"]);
    }

    #[test]
    fn incomplete_backups_go_only_when_old() {
        let now = at("2026-11-21T12:00:00Z");
        let b = vec![
            Candidate { id: "good".into(), taken: now - Duration::hours(2), complete: true, derived: false },
            Candidate { id: "writing".into(), taken: now - Duration::minutes(5), complete: false, derived: false },
            Candidate { id: "crashed".into(), taken: now - Duration::hours(30), complete: false, derived: false },
        ];
        let p = Policy { keep_last: Some(5), incomplete_after: Duration::hours(24), ..Policy::default() };
        assert_eq!(kept(&decide(&b, &p, now)), ["writing", "good"]);
    }

    #[test]
    fn a_chain_goes_only_when_ended_and_older_than_the_cutoff() {
        let now = at("2026-11-21T12:00:00Z");
        let chain = |id: &str, days: i64| ChainCandidate { id: id.into(), last_written: Some(now - Duration::days(days)), unreadable: None };
        let chains = vec![
            chain("c0", 30),
            ChainCandidate { id: "c1".into(), last_written: None, unreadable: Some("not JSON".into()) },
            ChainCandidate { id: "c2".into(), last_written: None, unreadable: None },
            chain("c3", 20),
            chain("c4", 3),
            chain("c5", 40),
        ];
        let cutoff = Some((now - Duration::days(7), "--keep-stream 7d"));
        let decided = decide_chains(&chains, cutoff);
        assert_eq!(kept(&decided), ["c1", "c2", "c4", "c5"]);
        assert!(decided[0].reasons[0].contains("chain c1 follows it") && decided[0].reasons[0].contains("before --keep-stream 7d"), "{decided:?}");
        assert!(decided[1].reasons[0].contains("unreadable"));
        assert!(decided[4].reasons[0].contains("within --keep-stream 7d"));
        // the newest is kept however old
        assert!(decided[5].reasons[0].contains("the newest chain"));
        // no cutoff keeps everything
        assert!(decide_chains(&chains, None).iter().all(|d| d.keep));
        assert!(decide_chains(&[], cutoff).is_empty());
    }
}
