//! Proof that a hosted cluster's etcd members are ONE cluster, not several
//! that happen to sit behind one Service.
//!
//! A HighlyAvailable restore through HyperShift's `etcd-init` (every
//! release before openshift/hypershift PR 9048, OCPBUGS-99534) restores the
//! snapshot into each member without `--name` or `--initial-cluster`: each
//! member becomes a one-member cluster, and all of them answer, are
//! healthy, lead and report a revision at or above the backup's. Their
//! cluster IDs are even EQUAL (the ID is computed from the same default
//! member, `default` at `http://localhost:2380`, and token), so no single
//! field gives it away. What does:
//!
//! - the member list each member reports: it must hold exactly the expected
//!   members (`etcd-0..N-1`), the same list on every member, each with its
//!   own pod's peer URL (HyperShift's `https://etcd-N.etcd-discovery.<ns>.svc:2380`,
//!   or the pod's IP; any URL for a one-member cluster, which has no peer:
//!   a SingleReplica restore through etcd-init advertises
//!   `http://localhost:2380`, harmlessly);
//! - one leader: exactly one member says it leads, and every member names it;
//! - the same cluster ID everywhere, and revisions within a small window;
//! - and, decisively, a key written through one member is read back
//!   (linearizably) through every other one ([`write_probe`]).
//!
//! [`check`] is the pure part, over what `health::probe` read; `wait`
//! (restore, migrate, drill) and `hcp-dr etcd status` share it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::health::{ClusterHealth, EtcdCluster, MemberHealth};
use crate::etcd::ListedMember;
use crate::stages::context::{EtcdAccess, MemberTarget};
use crate::stages::etcd_access;

/// How far apart the members' revisions may be and still count as one
/// cluster caught up (members apply the same log; a few writes may land
/// between the reads).
pub const REVISION_WINDOW: i64 = 1000;

/// The key [`write_probe`] writes (then deletes), outside Kubernetes' prefix.
pub const PROBE_PREFIX: &str = "/hcp-dr/probe/";

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The members disagree about the cluster they form (while every
    /// member answered): not a state etcd passes through on its way up.
    pub split: Vec<String>,
    /// Not there yet: a member does not answer, no leader yet, a member
    /// still catching up.
    pub waiting: Vec<String>,
}

impl Verdict {
    pub fn is_one_cluster(&self) -> bool {
        self.split.is_empty() && self.waiting.is_empty()
    }
    pub fn problems(&self) -> Vec<String> {
        self.split.iter().chain(&self.waiting).cloned().collect()
    }
}

/// The peer URL HyperShift's StatefulSet gives member `name`.
pub fn expected_peer_url(name: &str, hcp_ns: &str) -> String {
    format!("https://{}:2380", crate::hosted::etcd_member_server_name(name, hcp_ns))
}

/// Whether `url` is member `name`'s own: HyperShift's name for its pod, or
/// its pod's IP (what a member reached by address advertises).
fn own_peer_url(url: &str, name: &str, hcp_ns: &str, pod_ip: Option<&str>) -> bool {
    if url == expected_peer_url(name, hcp_ns) {
        return true;
    }
    let Some(ip) = pod_ip else { return false };
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() };
    url == format!("https://{host}:2380")
}

fn names(list: &[ListedMember]) -> Vec<String> {
    let mut names: Vec<String> = list.iter().map(|m| if m.name.is_empty() { format!("(unstarted {:x})", m.id) } else { m.name.clone() }).collect();
    names.sort();
    names
}

/// A member list, comparable across members: (id, name, peer URLs), sorted.
fn shape(list: &[ListedMember]) -> Vec<(u64, String, Vec<String>)> {
    let mut out: Vec<_> = list
        .iter()
        .map(|m| {
            let mut peers = m.peer_urls.clone();
            peers.sort();
            (m.id, m.name.clone(), peers)
        })
        .collect();
    out.sort();
    out
}

/// Whether `rows` (one per etcd pod, as `health::probe` read them) are one
/// cluster of exactly the `expected` members (pure).
pub fn check(expected: &[String], hcp_ns: &str, rows: &[MemberHealth]) -> Verdict {
    let mut verdict = Verdict::default();
    let row = |name: &str| rows.iter().find(|r| r.name == name && r.pod.is_some());
    let mut answered: Vec<&MemberHealth> = Vec::new();
    for name in expected {
        match row(name) {
            Some(r) if r.reachable && r.cluster_id.is_some() => answered.push(r),
            Some(r) => verdict.waiting.push(format!("{name} does not answer ({})", r.last_error.as_deref().unwrap_or("no details"))),
            None => verdict.waiting.push(format!("{name} has no pod")),
        }
    }
    for r in rows.iter().filter(|r| r.pod.is_some() && !expected.contains(&r.name)) {
        verdict.split.push(format!("pod {} runs an etcd member that is not one of {}", r.name, expected.join(", ")));
    }
    let ip_of = |name: &str| row(name).and_then(|r| r.endpoint.as_deref()).and_then(super::health::endpoint_host);

    // One cluster ID.
    let mut ids: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &answered {
        ids.entry(r.cluster_id.as_deref().unwrap_or_default()).or_default().push(&r.name);
    }
    if ids.len() > 1 {
        let groups: Vec<String> = ids.iter().map(|(id, members)| format!("{} in cluster {id}", members.join(", "))).collect();
        verdict.split.push(format!("the members report different cluster IDs: {}", groups.join("; ")));
    }

    // The same member list everywhere, of exactly the expected members,
    // each at its own pod.
    let want: Vec<String> = {
        let mut w = expected.to_vec();
        w.sort();
        w
    };
    let mut lists: BTreeMap<Vec<(u64, String, Vec<String>)>, Vec<&str>> = BTreeMap::new();
    let mut foreign: BTreeSet<String> = BTreeSet::new();
    for r in &answered {
        let Some(list) = &r.member_list else {
            verdict.waiting.push(format!("{} did not give its member list", r.name));
            continue;
        };
        let got = names(list);
        if got != want {
            verdict.split.push(format!("{} lists {} as the cluster's members, not {}", r.name, listing(&got), want.join(", ")));
        }
        for m in list {
            if m.name.is_empty() {
                continue;
            }
            if !expected.contains(&m.name) {
                foreign.insert(format!("{} lists a foreign member {} ({})", r.name, m.name, m.peer_urls.join(",")));
                continue;
            }
            // a one-member cluster has no peer to reach it: etcd-init's
            // `http://localhost:2380` is harmless there (SingleReplica)
            for url in m.peer_urls.iter().filter(|_| expected.len() > 1) {
                let ip = ip_of(&m.name);
                if ip.is_none() && !url.contains(".etcd-discovery.") && !url.contains("://localhost:") {
                    // its pod is being replaced (a rolling restart): not known yet
                    verdict.waiting.push(format!("{}'s pod has no address to check its peer URL {url} against", m.name));
                    continue;
                }
                if !own_peer_url(url, &m.name, hcp_ns, ip.as_deref()) {
                    foreign.insert(format!(
                        "{} gives member {} the peer URL {url}, not {} (a member restored without --initial-cluster advertises http://localhost:2380)",
                        r.name,
                        m.name,
                        expected_peer_url(&m.name, hcp_ns)
                    ));
                }
            }
        }
        lists.entry(shape(list)).or_default().push(&r.name);
    }
    verdict.split.extend(foreign);
    if lists.len() > 1 {
        let groups: Vec<String> = lists
            .iter()
            .map(|(list, members)| format!("{} list [{}]", members.join(", "), list.iter().map(|(id, n, _)| format!("{n}={id:x}")).collect::<Vec<_>>().join(", ")))
            .collect();
        verdict.split.push(format!("the members' member lists differ: {}", groups.join("; ")));
    }

    // One leader, named by everyone.
    let leaders: Vec<&str> = answered.iter().filter(|r| r.leader).map(|r| r.name.as_str()).collect();
    let named: BTreeSet<&str> = answered.iter().filter_map(|r| r.leader_id.as_deref()).filter(|id| *id != "0").collect();
    match leaders.len() {
        0 => verdict.waiting.push("no member leads yet".into()),
        1 if named.len() <= 1 => {}
        1 => verdict.split.push(format!("the members name different leaders ({})", named.into_iter().collect::<Vec<_>>().join(", "))),
        _ => verdict.split.push(format!("{} members each say they lead: {}", leaders.len(), leaders.join(", "))),
    }

    // Caught up together.
    let revisions: Vec<(&str, i64)> = answered.iter().filter_map(|r| r.revision.map(|rev| (r.name.as_str(), rev))).collect();
    if let (Some(low), Some(high)) = (revisions.iter().min_by_key(|(_, r)| *r), revisions.iter().max_by_key(|(_, r)| *r))
        && high.1 - low.1 > REVISION_WINDOW
    {
        verdict.waiting.push(format!(
            "revisions {} apart: {} at {}, {} at {}",
            high.1 - low.1,
            high.0,
            high.1,
            low.0,
            low.1
        ));
    }
    verdict
}

fn listing(names: &[String]) -> String {
    match names.len() {
        0 => "no members".into(),
        1 => format!("only {}", names[0]),
        _ => names.join(", "),
    }
}

/// What [`write_probe`] saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// The member written through.
    pub written_through: String,
    /// The members that read it back.
    pub read_back: Vec<String>,
    /// The members that answered without it: not in the writer's cluster.
    pub missing: Vec<String>,
    /// The members that could not be asked, with the reason.
    pub unreadable: Vec<String>,
}

/// Write a key through the first member of `members`, read it back
/// (linearizably) through each of the others, then delete it. A member of
/// the same cluster must return it; one that answers without it belongs to
/// another cluster.
pub async fn write_probe(cluster: &EtcdCluster<'_>, access: EtcdAccess, members: &[&MemberHealth]) -> Result<Probe, String> {
    let hcp_ns = cluster.hosted_cluster.hcp_namespace();
    let target = |r: &MemberHealth| -> Result<MemberTarget, String> {
        let ip = r.endpoint.as_deref().and_then(super::health::endpoint_host).ok_or_else(|| format!("{} has no pod IP", r.name))?;
        Ok(MemberTarget { pod: r.name.clone(), pod_ip: ip, revision: 0 })
    };
    let Some((first, others)) = members.split_first() else { return Ok(Probe::default()) };
    let connect = |r: &MemberHealth| {
        let target = target(r);
        let hcp_ns = hcp_ns.clone();
        async move {
            let target = target?;
            let (member, forward) = etcd_access::connect_member(cluster.client, &hcp_ns, access, cluster.tls, &target)
                .await
                .map_err(|e| crate::pipeline::stage::error_chain(e.as_ref()))?;
            let client = member.connect().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((member, forward, client))
        }
    };
    let key = format!("{PROBE_PREFIX}{}", random_token());
    let value = format!("written through {} by hcp-dr", first.name);
    let (writer, _forward, mut writer_client) = connect(first).await.map_err(|e| format!("connecting to {}: {e}", first.name))?;
    writer.put(&mut writer_client, &key, &value).await.map_err(|e| format!("writing the probe key through {}: {e}", first.name))?;
    let mut probe = Probe { written_through: first.name.clone(), ..Probe::default() };
    for other in others {
        let read = async {
            let (member, _forward, mut client) = connect(other).await?;
            member.get_value(&mut client, &key).await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(std::time::Duration::from_secs(10), read).await {
            Ok(Ok(Some(found))) if found == value.as_bytes() => probe.read_back.push(other.name.clone()),
            Ok(Ok(_)) => probe.missing.push(other.name.clone()),
            Ok(Err(err)) => probe.unreadable.push(format!("{}: {err}", other.name)),
            Err(_) => probe.unreadable.push(format!("{}: no answer within 10s", other.name)),
        }
    }
    if let Err(err) = writer.delete(&mut writer_client, &key).await {
        tracing::warn!(key = %key, member = %first.name, "the probe key was not deleted: {err}");
    }
    Ok(probe)
}

fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default());
    format!("{:016x}", h.finish())
}

/// The probe's missing members as a split (empty when every member read it back).
pub fn probe_split(probe: &Probe) -> Option<String> {
    (!probe.missing.is_empty()).then(|| {
        format!(
            "a key written through {} is missing on {}: they serve another cluster's data",
            probe.written_through,
            probe.missing.join(", ")
        )
    })
}

/// What to tell someone whose etcd is split.
pub fn split_advice(health: &ClusterHealth) -> String {
    format!(
        "the etcd members of {} are not one cluster. This is what HyperShift's etcd-init does to a HighlyAvailable cluster restored through restoreSnapshotURL (control-plane-operator/controllers/hostedcontrolplane/v2/etcd/etcd-init.sh restores every member without --name or --initial-cluster; OCPBUGS-99534): each member is a cluster of its own and the hosted API reads and writes whichever one it reaches. Do not use this copy",
        health.hosted_cluster
    )
}

#[cfg(test)]
mod tests {
    use super::super::health::tests::row;
    use super::*;

    const NS: &str = "clusters-demo";

    fn listed(name: &str, id: u64, peer: &str) -> ListedMember {
        ListedMember { id, name: name.into(), peer_urls: vec![peer.into()], client_urls: vec![], is_learner: false }
    }

    fn expected() -> Vec<String> {
        vec!["etcd-0".into(), "etcd-1".into(), "etcd-2".into()]
    }

    /// Three members of one cluster, etcd-0 leading.
    fn one_cluster() -> Vec<MemberHealth> {
        let list: Vec<ListedMember> = (0..3).map(|i| listed(&format!("etcd-{i}"), 10 + i, &expected_peer_url(&format!("etcd-{i}"), NS))).collect();
        (0..3)
            .map(|i| {
                let mut r = row(&format!("etcd-{i}"), i == 0);
                r.cluster_id = Some("c1".into());
                r.leader_id = Some("a".into());
                r.member_list = Some(list.clone());
                r.endpoint = Some(format!("https://10.0.0.{i}:2379"));
                r
            })
            .collect()
    }

    #[test]
    fn one_cluster_passes() {
        let v = check(&expected(), NS, &one_cluster());
        assert!(v.is_one_cluster(), "{v:?}");
    }

    #[test]
    fn peer_urls_on_the_pods_own_ip_are_its_own() {
        let mut rows = one_cluster();
        let list: Vec<ListedMember> = (0..3).map(|i| listed(&format!("etcd-{i}"), 10 + i, &format!("https://10.0.0.{i}:2380"))).collect();
        for r in &mut rows {
            r.member_list = Some(list.clone());
        }
        assert!(check(&expected(), NS, &rows).is_one_cluster());
        // another pod's IP is not
        let swapped: Vec<ListedMember> = (0..3).map(|i| listed(&format!("etcd-{i}"), 10 + i, &format!("https://10.0.0.{}:2380", (i + 1) % 3))).collect();
        for r in &mut rows {
            r.member_list = Some(swapped.clone());
        }
        assert!(!check(&expected(), NS, &rows).split.is_empty());
    }

    /// What HyperShift's shipped etcd-init makes of three members: each a
    /// cluster of one, all with the SAME cluster and member ID (computed
    /// from `default` at `http://localhost:2380`), each leading itself.
    #[test]
    fn the_shipped_etcd_init_split_is_found_although_the_cluster_ids_agree() {
        let rows: Vec<MemberHealth> = (0..3)
            .map(|i| {
                let name = format!("etcd-{i}");
                let mut r = row(&name, true);
                r.cluster_id = Some("cdf818194e3a8c32".into());
                r.member_id = Some("8e9e05c52164694d".into());
                r.leader_id = Some("8e9e05c52164694d".into());
                r.member_list = Some(vec![listed(&name, 0x8e9e05c52164694d, "http://localhost:2380")]);
                r
            })
            .collect();
        let v = check(&expected(), NS, &rows);
        assert!(!v.is_one_cluster());
        let text = v.split.join("\n");
        assert!(text.contains("etcd-1 lists only etcd-1 as the cluster's members, not etcd-0, etcd-1, etcd-2"), "{text}");
        assert!(text.contains("3 members each say they lead"), "{text}");
        assert!(text.contains("peer URL http://localhost:2380"), "{text}");
        assert!(text.contains("member lists differ"), "{text}");
        assert!(!text.contains("different cluster IDs"), "{text}");
    }

    #[test]
    fn different_cluster_ids_and_foreign_members_are_a_split() {
        let mut rows = one_cluster();
        rows[2].cluster_id = Some("c2".into());
        let mut list = rows[1].member_list.clone().unwrap();
        list.push(listed("etcd-9", 99, "https://etcd-9.etcd-discovery.clusters-demo.svc:2380"));
        rows[1].member_list = Some(list);
        let v = check(&expected(), NS, &rows);
        let text = v.split.join("\n");
        assert!(text.contains("different cluster IDs: etcd-0, etcd-1 in cluster c1; etcd-2 in cluster c2"), "{text}");
        assert!(text.contains("etcd-1 lists a foreign member etcd-9"), "{text}");
    }

    #[test]
    fn a_member_that_does_not_answer_or_lags_is_waited_for() {
        let mut rows = one_cluster();
        rows[1] = super::super::health::tests::down("etcd-1");
        rows[2].revision = Some(50 + REVISION_WINDOW + 1);
        let v = check(&expected(), NS, &rows);
        assert!(v.split.is_empty(), "{v:?}");
        assert!(v.waiting.iter().any(|w| w.starts_with("etcd-1 does not answer")), "{v:?}");
        assert!(v.waiting.iter().any(|w| w.starts_with("revisions 1001 apart")), "{v:?}");
        let mut rows = one_cluster();
        rows.retain(|r| r.name != "etcd-2");
        assert_eq!(check(&expected(), NS, &rows).waiting, vec!["etcd-2 has no pod"]);
        let mut rows = one_cluster();
        rows[0].leader = false;
        assert_eq!(check(&expected(), NS, &rows).waiting, vec!["no member leads yet"]);
    }

    #[test]
    fn a_member_being_replaced_is_waited_for_but_localhost_is_foreign_anyway() {
        let mut rows = one_cluster();
        let list: Vec<ListedMember> = (0..3).map(|i| listed(&format!("etcd-{i}"), 10 + i, &format!("https://10.0.0.{i}:2380"))).collect();
        for r in &mut rows {
            r.member_list = Some(list.clone());
        }
        // etcd-2's pod is recreated by a rolling restart: no address yet
        rows[2] = MemberHealth { endpoint: None, ..super::super::health::tests::down("etcd-2") };
        let v = check(&expected(), NS, &rows);
        assert!(v.split.is_empty(), "{v:?}");
        assert!(v.waiting.iter().any(|w| w.starts_with("etcd-2's pod has no address")), "{v:?}");
        let mut list = list;
        list[2].peer_urls = vec!["http://localhost:2380".into()];
        for r in rows.iter_mut().take(2) {
            r.member_list = Some(list.clone());
        }
        assert!(!check(&expected(), NS, &rows).split.is_empty());
    }

    #[test]
    fn a_single_member_restored_by_etcd_init_is_one_cluster() {
        let mut r = row("etcd-0", true);
        r.cluster_id = Some("c".into());
        r.leader_id = Some("a".into());
        r.member_list = Some(vec![listed("etcd-0", 10, "http://localhost:2380")]);
        assert!(check(&["etcd-0".to_string()], NS, &[r]).is_one_cluster());
    }

    #[test]
    fn a_missing_probe_key_is_a_split() {
        let probe = Probe { written_through: "etcd-0".into(), read_back: vec![], missing: vec!["etcd-1".into(), "etcd-2".into()], unreadable: vec![] };
        assert_eq!(probe_split(&probe).unwrap(), "a key written through etcd-0 is missing on etcd-1, etcd-2: they serve another cluster's data");
        assert!(probe_split(&Probe::default()).is_none());
    }
}
