//! Which etcd members a backup snapshots when etcd is degraded.
//!
//! With quorum (a majority of the expected members healthy, with a leader)
//! the backup is taken from the healthy members and the others are recorded
//! as skipped, with the reason. Without quorum it refuses, unless
//! `--allow-no-quorum`: then it snapshots the one readable member with the
//! highest revision, and the manifest says so (that member may lack the
//! last writes the lost majority acknowledged).

use serde::{Deserialize, Serialize};

use super::context::MemberTarget;
use crate::archive::SkippedMember;

/// What preflight saw of one expected member.
#[derive(Debug, Clone)]
pub enum Seen {
    /// Answers, no errors, knows a leader.
    Healthy(MemberTarget),
    /// Answers, but has no leader or reports errors (`etcdserver: no
    /// leader`, an alarm): readable, not counted towards a quorum.
    Unhealthy { target: MemberTarget, reason: String },
    /// Cannot be read (no pod, not running, unreachable, errors).
    Down { member: String, reason: String },
}

/// The members to snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub members: Vec<MemberTarget>,
    pub skipped: Vec<SkippedMember>,
    /// Taken from one member without quorum (`--allow-no-quorum`).
    pub no_quorum: bool,
}

/// A majority of `expected`.
pub fn quorum(expected: usize) -> usize {
    expected / 2 + 1
}

/// Choose the members of a backup from what preflight saw.
pub fn choose(expected: usize, seen: Vec<Seen>, allow_no_quorum: bool) -> Result<Choice, String> {
    let mut healthy = Vec::new();
    let mut leaderless = Vec::new();
    let mut skipped = Vec::new();
    for s in seen {
        match s {
            Seen::Healthy(t) => healthy.push(t),
            Seen::Unhealthy { target, reason } => leaderless.push((target, reason)),
            Seen::Down { member, reason } => skipped.push(SkippedMember { member, reason }),
        }
    }
    let need = quorum(expected);
    if healthy.len() >= need {
        skipped.extend(leaderless.into_iter().map(|(t, reason)| SkippedMember { member: t.pod, reason }));
        skipped.sort_by(|a, b| a.member.cmp(&b.member));
        return Ok(Choice { members: healthy, skipped, no_quorum: false });
    }
    let listing = |skipped: &[SkippedMember]| {
        skipped.iter().map(|s| format!("{}: {}", s.member, s.reason)).collect::<Vec<_>>().join("; ")
    };
    let with_leader = healthy.len();
    let unhealthy = leaderless.iter().map(|(t, reason)| format!("{}: {reason}", t.pod)).collect::<Vec<_>>().join("; ");
    let readable: Vec<MemberTarget> = healthy.into_iter().chain(leaderless.into_iter().map(|(t, _)| t)).collect();
    if !allow_no_quorum {
        return Err(format!(
            "etcd has no quorum: {} of {expected} member(s) are healthy with a leader, {need} are needed{}{}. Repair etcd first (hcp-dr etcd status, hcp-dr etcd recover); to save what one member holds now, back up with --allow-no-quorum (it snapshots the readable member with the highest revision and marks the backup as taken without quorum)",
            with_leader,
            if skipped.is_empty() { String::new() } else { format!(" (down: {})", listing(&skipped)) },
            if unhealthy.is_empty() { String::new() } else { format!(" (unhealthy: {unhealthy})") },
        ));
    }
    let Some(best) = readable.iter().max_by(|a, b| a.revision.cmp(&b.revision).then(b.pod.cmp(&a.pod))).cloned() else {
        return Err(format!(
            "no etcd member can be read, even without quorum ({}): there is nothing to back up; restore from an earlier backup (hcp-dr backups list)",
            listing(&skipped)
        ));
    };
    for t in readable.into_iter().filter(|t| t.pod != best.pod) {
        skipped.push(SkippedMember {
            member: t.pod,
            reason: format!("without quorum only the member with the highest revision is taken ({} is at {}, this one at {})", best.pod, best.revision, t.revision),
        });
    }
    skipped.sort_by(|a, b| a.member.cmp(&b.member));
    Ok(Choice { members: vec![best], skipped, no_quorum: true })
}

/// With the writers stopped, the members' revisions: those at the highest
/// revision are taken when they are a quorum of `expected` (or the one
/// member of a no-quorum backup); the others are lagging and skipped.
/// `Err` when the members at the top are not a quorum.
pub fn agree(expected: usize, revisions: &[(String, i64)], no_quorum: bool) -> Result<(i64, Vec<SkippedMember>), String> {
    let top = revisions.iter().map(|(_, r)| *r).max().ok_or("no etcd member to agree on a revision")?;
    let at_top = revisions.iter().filter(|(_, r)| *r == top).count();
    if at_top == revisions.len() || (at_top >= quorum(expected) && !no_quorum) {
        let lagging = revisions
            .iter()
            .filter(|(_, r)| *r != top)
            .map(|(m, r)| SkippedMember {
                member: m.clone(),
                reason: format!("lagging: at revision {r} while the others are at {top} with the writers stopped"),
            })
            .collect();
        return Ok((top, lagging));
    }
    Err(format!(
        "etcd members disagree on the revision with the writers stopped ({}): something still writes to etcd, or too many members lag to leave a quorum at the top",
        revisions.iter().map(|(m, r)| format!("{m}: {r}")).collect::<Vec<_>>().join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(pod: &str, revision: i64) -> MemberTarget {
        MemberTarget { pod: pod.into(), pod_ip: "127.0.0.1".into(), revision }
    }
    fn down(pod: &str) -> Seen {
        Seen::Down { member: pod.into(), reason: "did not answer".into() }
    }

    #[test]
    fn one_member_down_of_three_is_skipped_and_recorded() {
        let choice = choose(3, vec![Seen::Healthy(target("etcd-0", 10)), down("etcd-1"), Seen::Healthy(target("etcd-2", 10))], false).unwrap();
        assert_eq!(choice.members.iter().map(|m| m.pod.as_str()).collect::<Vec<_>>(), ["etcd-0", "etcd-2"]);
        assert_eq!(choice.skipped, vec![SkippedMember { member: "etcd-1".into(), reason: "did not answer".into() }]);
        assert!(!choice.no_quorum);
    }

    #[test]
    fn without_quorum_it_refuses_unless_allowed_then_takes_the_highest_revision() {
        let no_leader = |pod, revision| Seen::Unhealthy { target: target(pod, revision), reason: "has no leader".into() };
        let seen = || vec![no_leader("etcd-0", 7), down("etcd-1"), no_leader("etcd-2", 9)];
        let err = choose(3, seen(), false).unwrap_err();
        assert!(err.contains("no quorum") && err.contains("--allow-no-quorum") && err.contains("etcd-1: did not answer"), "{err}");
        let choice = choose(3, seen(), true).unwrap();
        assert!(choice.no_quorum);
        assert_eq!(choice.members, vec![target("etcd-2", 9)]);
        assert_eq!(choice.skipped.len(), 2);
        assert!(choice.skipped[0].reason.contains("highest revision"), "{:?}", choice.skipped);
    }

    #[test]
    fn nothing_readable_is_refused_even_when_allowed() {
        let err = choose(3, vec![down("etcd-0"), down("etcd-1"), down("etcd-2")], true).unwrap_err();
        assert!(err.contains("no etcd member can be read"), "{err}");
        let err = choose(1, vec![down("etcd-0")], false).unwrap_err();
        assert!(err.contains("0 of 1"), "{err}");
    }

    #[test]
    fn a_single_replica_member_is_its_own_quorum() {
        let choice = choose(1, vec![Seen::Healthy(target("etcd-0", 3))], false).unwrap();
        assert_eq!(choice.members.len(), 1);
        assert!(choice.skipped.is_empty());
    }

    #[test]
    fn a_lagging_member_is_dropped_while_a_quorum_agrees_at_the_top() {
        let revs = |v: &[(&str, i64)]| v.iter().map(|(m, r)| (m.to_string(), *r)).collect::<Vec<_>>();
        let (top, lagging) = agree(3, &revs(&[("etcd-0", 20), ("etcd-1", 17), ("etcd-2", 20)]), false).unwrap();
        assert_eq!(top, 20);
        assert_eq!(lagging.len(), 1);
        assert!(lagging[0].member == "etcd-1" && lagging[0].reason.contains("17"));
        assert!(agree(3, &revs(&[("etcd-0", 20), ("etcd-1", 17), ("etcd-2", 18)]), false).is_err());
        assert!(agree(3, &revs(&[("etcd-0", 20), ("etcd-2", 18)]), false).is_err(), "one at the top is no quorum of 3");
        assert_eq!(agree(3, &revs(&[("etcd-2", 9)]), true).unwrap(), (9, vec![]));
    }
}
