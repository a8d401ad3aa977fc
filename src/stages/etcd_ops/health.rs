//! Reading a hosted cluster's etcd: one row per member (its pod as the
//! kubelet reports it, what the member says about itself over its client
//! port, the alarms raised on it) and the problems that make the cluster
//! degraded. Read-only; shared by `hcp-dr etcd status`, `assess`, `replace`
//! (its last check) and `rejoin` (its wait).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};

use crate::etcd::{EtcdError, ListedMember, MemberAlarm, MemberStatus};
use crate::hosted::{self, HOSTED_CLUSTER, HostedCluster};
use crate::kube::{KubeError, api, get_json, request};
use crate::pipeline::stage::error_chain;
use crate::stages::context::{EtcdAccess, EtcdTlsMaterial, MemberTarget, TlsOverride};
use crate::stages::etcd_access;

/// Bound on reaching one member and reading its status: a member that
/// cannot be reached must not hang the whole check.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on each further request (a linearizable read waits for a quorum).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(6);

/// Why the cluster's etcd could not be looked at (a member that does not
/// answer is not one of these: it is a row of the report).
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The HostedCluster does not exist.
    #[error(
        "HostedCluster {namespace}/{name} not found: check the name and namespace (kubectl get hostedclusters -n {namespace}); -n sets the namespace"
    )]
    NotFound { namespace: String, name: String },
    /// Its etcd is not run by HyperShift.
    #[error(
        "HostedCluster {namespace}/{name} has spec.etcd.managementType `{management_type}`: hcp-dr works on Managed etcd only; use the external etcd's own tooling"
    )]
    NotManaged {
        namespace: String,
        name: String,
        management_type: String,
    },
    /// No client TLS material was found (the message says where it looked).
    #[error("{0}")]
    Tls(String),
    /// Reading from the management cluster failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl HealthError {
    /// Whether the user can fix it with other arguments (exit code 2).
    pub fn is_input(&self) -> bool {
        !matches!(self, HealthError::Kube(_))
    }
}

/// Which cluster, and how its members are reached.
pub struct EtcdCluster<'a> {
    pub client: &'a Client,
    pub hosted_cluster: &'a HostedCluster,
    pub access: EtcdAccess,
    pub tls: &'a EtcdTlsMaterial,
}

/// The HostedCluster, refused unless its etcd is Managed.
pub async fn hosted_cluster(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<HostedCluster, HealthError> {
    let label = format!("HostedCluster {namespace}/{name}");
    let hc = get_json(&api(client, &HOSTED_CLUSTER, namespace), name, &label)
        .await?
        .map(HostedCluster)
        .ok_or_else(|| HealthError::NotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    match hc.etcd_management_type() {
        // An absent field is the CRD's default, Managed.
        "Managed" | "" => Ok(hc),
        other => Err(HealthError::NotManaged {
            namespace: namespace.to_string(),
            name: name.to_string(),
            management_type: other.to_string(),
        }),
    }
}

/// The client TLS: `--etcd-*` files first, then the HCP namespace's.
pub async fn tls(
    client: &Client,
    hcp_ns: &str,
    files: &TlsOverride,
) -> Result<EtcdTlsMaterial, HealthError> {
    etcd_access::discover_tls(client, hcp_ns, files)
        .await
        .map_err(|err| HealthError::Tls(error_chain(err.as_ref())))
}

/// One member: its pod and what it says. A member the cluster lists but no
/// pod runs has `pod: None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberHealth {
    /// The member's name (its pod's name).
    pub name: String,
    /// etcd's member id, in hex as etcdctl prints it.
    pub member_id: Option<String>,
    /// The cluster this member says it belongs to (hex).
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// The member id this member says leads (hex; `0`: none).
    #[serde(default)]
    pub leader_id: Option<String>,
    /// The names in this member's member list (sorted).
    #[serde(default)]
    pub members: Option<Vec<String>>,
    /// This member's member list in full (ids and peer URLs).
    #[serde(default)]
    pub member_list: Option<Vec<ListedMember>>,
    pub pod: Option<String>,
    pub pod_uid: Option<String>,
    pub phase: Option<String>,
    /// The pod's Ready condition.
    pub ready: Option<bool>,
    /// The etcd container's restart count.
    pub restarts: Option<i32>,
    /// The etcd container's state: `Running`, or the reason it waits or
    /// terminated (`CrashLoopBackOff`, `Error`, `PodInitializing`), or
    /// `Terminating` for a pod being deleted.
    pub state: Option<String>,
    /// The member's client URL (`https://<pod IP>:2379`).
    pub endpoint: Option<String>,
    /// It answered a status request.
    pub reachable: bool,
    /// It answered, reports no errors, knows a leader and serves a
    /// linearizable read.
    pub healthy: bool,
    pub leader: bool,
    pub raft_term: Option<u64>,
    pub raft_index: Option<u64>,
    pub revision: Option<i64>,
    pub db_size: Option<i64>,
    pub db_size_in_use: Option<i64>,
    pub version: Option<String>,
    /// Alarms raised on this member: `NOSPACE`, `CORRUPT`.
    pub alarms: Vec<String>,
    pub last_error: Option<String>,
}

impl MemberHealth {
    /// Healthy, with a pod and no alarm.
    pub fn ok(&self) -> bool {
        self.healthy && self.alarms.is_empty() && self.pod.is_some()
    }

    /// What is wrong with it, in a few words (None when nothing is).
    pub fn problem(&self) -> Option<String> {
        let error = self.last_error.as_deref().unwrap_or("no details");
        if self.pod.is_none() {
            Some(format!("in the member list but no pod runs it ({error})"))
        } else if !self.reachable {
            Some(format!("unreachable: {error}"))
        } else if !self.healthy {
            Some(format!("unhealthy: {error}"))
        } else if !self.alarms.is_empty() {
            Some(format!("alarm {}", self.alarms.join(", ")))
        } else {
            None
        }
    }
}

/// The cluster's etcd as `hcp-dr etcd status` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterHealth {
    /// `namespace/name` of the HostedCluster.
    pub hosted_cluster: String,
    pub hcp_namespace: String,
    pub availability_policy: String,
    pub expected_members: usize,
    /// How the members were reached: `pod-ip` or `port-forward`.
    pub access: EtcdAccess,
    /// Sorted by name; members the cluster lists without a pod come last.
    pub members: Vec<MemberHealth>,
    /// How many members the cluster's member list has (None: no member answered).
    pub listed_members: Option<usize>,
    pub leader: Option<String>,
    /// The leader's revision.
    pub revision: Option<i64>,
    /// Why the cluster is degraded; empty when it is healthy.
    pub problems: Vec<String>,
    pub healthy: bool,
    /// Why the members are not one cluster (they answer, but disagree about
    /// the cluster they form: `one_cluster::check`); empty when they are.
    #[serde(default)]
    pub split: Vec<String>,
}

impl ClusterHealth {
    pub fn member(&self, name: &str) -> Option<&MemberHealth> {
        self.members.iter().find(|m| m.name == name)
    }
}

/// What one member answered.
#[derive(Default)]
struct Answer {
    status: Option<MemberStatus>,
    read_error: Option<String>,
    alarms: Option<Vec<MemberAlarm>>,
    listed: Option<Vec<ListedMember>>,
    error: Option<String>,
}

/// The pod's view: phase, readiness, the etcd container's restarts and state.
fn pod_row(pod: &Pod) -> MemberHealth {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "etcd").or(cs.first()));
    let container_state = container.and_then(|c| c.state.as_ref()).and_then(|s| {
        if s.running.is_some() {
            Some("Running".to_string())
        } else if let Some(w) = &s.waiting {
            Some(w.reason.clone().unwrap_or_else(|| "Waiting".into()))
        } else {
            s.terminated
                .as_ref()
                .map(|t| t.reason.clone().unwrap_or_else(|| "Terminated".into()))
        }
    });
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let pod_ip = status
        .and_then(|s| s.pod_ip.clone())
        .filter(|ip| !ip.is_empty());
    MemberHealth {
        name: name.clone(),
        member_id: None,
        cluster_id: None,
        leader_id: None,
        members: None,
        member_list: None,
        pod: Some(name),
        pod_uid: pod.metadata.uid.clone(),
        phase: status.and_then(|s| s.phase.clone()),
        ready,
        restarts: container.map(|c| c.restart_count),
        state: if deleting {
            Some("Terminating".into())
        } else {
            container_state
        },
        endpoint: pod_ip
            .map(|ip| format!("https://{}", join_host_port(&ip, hosted::ETCD_CLIENT_PORT))),
        reachable: false,
        healthy: false,
        leader: false,
        raft_term: None,
        raft_index: None,
        revision: None,
        db_size: None,
        db_size_in_use: None,
        version: None,
        alarms: Vec::new(),
        last_error: None,
    }
}

/// Whether `row`'s pod runs the listed member: same name, or a peer URL on
/// the pod's IP or its `<pod>.etcd-discovery` name.
fn runs(row: &MemberHealth, member: &ListedMember) -> bool {
    if !member.name.is_empty() {
        return member.name == row.name;
    }
    let ip = pod_ip(row);
    member.peer_urls.iter().any(|url| {
        let host = url
            .split_once("://")
            .map_or(url.as_str(), |(_, rest)| rest)
            .rsplit_once(':')
            .map_or(url.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        Some(host) == ip.as_deref() || host.starts_with(&format!("{}.", row.name))
    })
}

fn join_host_port(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

fn pod_ip(row: &MemberHealth) -> Option<String> {
    row.endpoint.as_deref().and_then(endpoint_host)
}

/// The host of a client URL `https://<host>:<port>` (brackets of an IPv6
/// address removed).
pub fn endpoint_host(endpoint: &str) -> Option<String> {
    endpoint
        .strip_prefix("https://")
        .and_then(|hp| hp.rsplit_once(':'))
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']').to_string())
}

/// `auto`: pod IPs when any member's answers a TCP connect from here, else
/// port-forward through the API server, decided once for every member (a
/// dead member must not switch its row to another path).
async fn resolve_access(access: EtcdAccess, ips: &[String]) -> EtcdAccess {
    if access != EtcdAccess::Auto {
        return access;
    }
    let tries = ips.iter().map(|ip| async move {
        let addr = join_host_port(ip, hosted::ETCD_CLIENT_PORT);
        matches!(
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                .await,
            Ok(Ok(_))
        )
    });
    if futures::future::join_all(tries)
        .await
        .into_iter()
        .any(|ok| ok)
    {
        EtcdAccess::PodIp
    } else {
        EtcdAccess::PortForward
    }
}

/// An etcd error in a few words, for a row that already names the member:
/// what was asked, the gRPC message and its innermost cause
/// (`status: tcp connect error: Connection refused (os error 111)`).
fn brief(err: &EtcdError) -> String {
    let (action, source) = match err {
        EtcdError::Connect { source, .. } => ("connect", source),
        EtcdError::Request { action, source, .. } => (*action, source),
        other => return other.to_string(),
    };
    let etcd_client::Error::GRpcStatus(status) = source else {
        return format!("{action}: {source}");
    };
    let mut innermost = None;
    let mut cause = std::error::Error::source(status);
    while let Some(c) = cause {
        innermost = Some(c.to_string());
        cause = c.source();
    }
    match innermost {
        Some(cause) if !status.message().contains(&cause) => {
            format!("{action}: {}: {cause}", status.message())
        }
        _ => format!("{action}: {}", status.message()),
    }
}

async fn bounded<T>(
    what: &str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, EtcdError>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(brief(&err)),
        Err(_) => Err(format!("{what}: no answer within {}s", limit.as_secs())),
    }
}

/// Ask one member for its status, a linearizable read, the alarms and the
/// member list, each bounded.
async fn ask(cluster: &EtcdCluster<'_>, access: EtcdAccess, target: MemberTarget) -> Answer {
    let hcp_ns = cluster.hosted_cluster.hcp_namespace();
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let (member, forward) =
            etcd_access::connect_member(cluster.client, &hcp_ns, access, cluster.tls, &target)
                .await
                .map_err(|e| error_chain(e.as_ref()))?;
        let mut client = member.connect().await.map_err(|e| brief(&e))?;
        let status = member.status(&mut client).await.map_err(|e| brief(&e))?;
        Ok::<_, String>((member, forward, client, status))
    })
    .await;
    let (member, _forward, mut client, status) = match connected {
        Ok(Ok(parts)) => parts,
        Ok(Err(error)) => {
            return Answer {
                error: Some(error),
                ..Answer::default()
            };
        }
        Err(_) => {
            return Answer {
                error: Some(format!("no answer within {}s", CONNECT_TIMEOUT.as_secs())),
                ..Answer::default()
            };
        }
    };
    let read_error = bounded(
        "linearizable read",
        REQUEST_TIMEOUT,
        member.check_read(&mut client),
    )
    .await
    .err();
    let alarms = bounded("alarm list", REQUEST_TIMEOUT, member.alarms(&mut client))
        .await
        .ok();
    let listed = bounded(
        "member list",
        REQUEST_TIMEOUT,
        member.member_list(&mut client),
    )
    .await
    .ok();
    Answer {
        status: Some(status),
        read_error,
        alarms,
        listed,
        error: None,
    }
}

fn fill(row: &mut MemberHealth, answer: Answer) {
    let Some(status) = answer.status else {
        row.last_error = answer.error.or_else(|| Some("no answer".into()));
        return;
    };
    row.reachable = true;
    row.member_id = Some(format!("{:x}", status.member_id));
    row.cluster_id = Some(format!("{:x}", status.cluster_id));
    row.leader_id = Some(format!("{:x}", status.leader_id));
    if let Some(list) = &answer.listed {
        let mut names: Vec<String> = list.iter().map(|m| if m.name.is_empty() { format!("(unstarted {:x})", m.id) } else { m.name.clone() }).collect();
        names.sort();
        row.members = Some(names);
        row.member_list = Some(list.clone());
    }
    row.leader = status.is_leader;
    row.raft_term = Some(status.raft_term);
    row.raft_index = Some(status.raft_index);
    row.revision = Some(status.revision);
    row.db_size = Some(status.db_size);
    row.db_size_in_use = Some(status.db_size_in_use);
    row.version = Some(status.version.clone());
    row.last_error = if !status.errors.is_empty() {
        Some(status.errors.join("; "))
    } else if status.leader_id == 0 {
        Some("no leader: the member cannot reach a quorum".into())
    } else {
        answer.read_error.clone()
    };
    row.healthy = row.last_error.is_none();
}

/// Look at every member of the cluster.
pub async fn probe(cluster: &EtcdCluster<'_>) -> Result<ClusterHealth, HealthError> {
    let hc = cluster.hosted_cluster;
    let hcp_ns = hc.hcp_namespace();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &hcp_ns);
    let pods = pods
        .list(&ListParams::default().labels(hosted::ETCD_POD_SELECTOR))
        .await
        .map_err(request(format!(
            "listing etcd pods ({}) in {hcp_ns}",
            hosted::ETCD_POD_SELECTOR
        )))?;
    let mut rows: Vec<MemberHealth> = pods.items.iter().map(pod_row).collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    let ips: Vec<String> = rows.iter().filter_map(pod_ip).collect();
    let access = resolve_access(cluster.access, &ips).await;

    let asks = rows.iter().map(|row| {
        let target = pod_ip(row).map(|ip| MemberTarget {
            pod: row.name.clone(),
            pod_ip: ip,
            revision: 0,
        });
        async move {
            match target {
                Some(target) => ask(cluster, access, target).await,
                None => Answer {
                    error: Some("the pod has no IP yet".into()),
                    ..Answer::default()
                },
            }
        }
    });
    let answers = futures::future::join_all(asks).await;

    // The member list and alarms as the leader knows them (else any member).
    let mut listed: Option<Vec<ListedMember>> = None;
    let mut alarms: Option<Vec<MemberAlarm>> = None;
    let leader_first = {
        let mut order: Vec<usize> = (0..answers.len()).collect();
        order.sort_by_key(|i| !answers[*i].status.as_ref().is_some_and(|s| s.is_leader));
        order
    };
    for i in leader_first {
        if listed.is_none() {
            listed = answers[i].listed.clone();
        }
        if alarms.is_none() {
            alarms = answers[i].alarms.clone();
        }
    }
    for (row, answer) in rows.iter_mut().zip(answers) {
        fill(row, answer);
    }
    let alarms = alarms.unwrap_or_default();
    for row in &mut rows {
        let id = row.member_id.clone();
        row.alarms = alarms
            .iter()
            .filter(|a| id.as_deref() == Some(format!("{:x}", a.member_id).as_str()))
            .map(|a| a.alarm.clone())
            .collect();
    }
    // Members the cluster lists that no pod runs.
    for member in listed.iter().flatten() {
        let id = format!("{:x}", member.id);
        if rows
            .iter()
            .any(|r| r.member_id.as_deref() == Some(id.as_str()))
        {
            continue;
        }
        // A member that did not answer: by name, or (not started yet) by its peer URL.
        if let Some(row) = rows
            .iter_mut()
            .find(|r| r.member_id.is_none() && r.pod.is_some() && runs(r, member))
        {
            row.member_id = Some(id);
            continue;
        }
        let started = !member.name.is_empty();
        rows.push(MemberHealth {
            name: if started {
                member.name.clone()
            } else {
                format!("(unstarted {id})")
            },
            member_id: Some(id.clone()),
            cluster_id: None,
            leader_id: None,
            members: None,
            member_list: None,
            pod: None,
            pod_uid: None,
            phase: None,
            ready: None,
            restarts: None,
            state: None,
            endpoint: member.client_urls.first().cloned(),
            reachable: false,
            healthy: false,
            leader: false,
            raft_term: None,
            raft_index: None,
            revision: None,
            db_size: None,
            db_size_in_use: None,
            version: None,
            alarms: alarms
                .iter()
                .filter(|a| format!("{:x}", a.member_id) == id)
                .map(|a| a.alarm.clone())
                .collect(),
            last_error: Some(if started {
                format!("member {id} has no pod `{}`", member.name)
            } else {
                format!(
                    "member {id} was added (peer {}) but never started",
                    member.peer_urls.join(",")
                )
            }),
        });
    }
    let leader = rows.iter().find(|r| r.leader);
    let expected = hc.expected_etcd_members();
    let listed_members = listed.as_ref().map(Vec::len);
    let mut problems = problems(expected, hc.availability_policy(), &rows, listed_members);
    let names: Vec<String> = (0..expected).map(|i| format!("{}-{i}", hosted::ETCD_STATEFULSET)).collect();
    let split = super::one_cluster::check(&names, &hcp_ns, &rows).split;
    problems.extend(split.iter().cloned());
    Ok(ClusterHealth {
        hosted_cluster: format!("{}/{}", hc.namespace(), hc.name()),
        hcp_namespace: hcp_ns,
        availability_policy: hc.availability_policy().to_string(),
        expected_members: expected,
        access,
        leader: leader.map(|l| l.name.clone()),
        revision: leader.and_then(|l| l.revision),
        listed_members,
        healthy: problems.is_empty(),
        problems,
        split,
        members: rows,
    })
}

/// Why a cluster with these members is degraded (empty: it is healthy).
pub fn problems(
    expected: usize,
    policy: &str,
    rows: &[MemberHealth],
    listed: Option<usize>,
) -> Vec<String> {
    let mut out: Vec<String> = rows
        .iter()
        .filter_map(|row| row.problem().map(|p| format!("{}: {p}", row.name)))
        .collect();
    let pods = rows.iter().filter(|r| r.pod.is_some()).count();
    if pods < expected {
        out.push(format!(
            "{pods} etcd pod(s), {expected} expected ({policy})"
        ));
    }
    match listed {
        Some(n) if n != expected => out.push(format!(
            "the member list has {n} member(s), {expected} expected ({policy})"
        )),
        Some(_) => {}
        None => out.push("no member answered with the member list".into()),
    }
    if !rows.iter().any(|r| r.leader && r.healthy) {
        out.push("no healthy leader: the cluster has no quorum".into());
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A healthy member row for tests.
    pub fn row(name: &str, leader: bool) -> MemberHealth {
        MemberHealth {
            name: name.into(),
            member_id: Some(format!(
                "{:x}",
                name.len() * 1000 + name.bytes().last().unwrap_or(0) as usize
            )),
            cluster_id: None,
            leader_id: None,
            members: None,
            member_list: None,
            pod: Some(name.into()),
            pod_uid: Some(format!("uid-{name}")),
            phase: Some("Running".into()),
            ready: Some(true),
            restarts: Some(0),
            state: Some("Running".into()),
            endpoint: Some("https://10.0.0.1:2379".into()),
            reachable: true,
            healthy: true,
            leader,
            raft_term: Some(2),
            raft_index: Some(100),
            revision: Some(50),
            db_size: Some(1 << 20),
            db_size_in_use: Some(1 << 19),
            version: Some("3.5.0".into()),
            alarms: vec![],
            last_error: None,
        }
    }

    /// The same member, crash-looping.
    pub fn down(name: &str) -> MemberHealth {
        MemberHealth {
            reachable: false,
            healthy: false,
            ready: Some(false),
            restarts: Some(4),
            state: Some("CrashLoopBackOff".into()),
            last_error: Some("connection refused".into()),
            raft_term: None,
            raft_index: None,
            revision: None,
            ..row(name, false)
        }
    }

    #[test]
    fn a_healthy_cluster_has_no_problem() {
        let rows = vec![
            row("etcd-0", true),
            row("etcd-1", false),
            row("etcd-2", false),
        ];
        assert!(problems(3, "HighlyAvailable", &rows, Some(3)).is_empty());
    }

    #[test]
    fn every_kind_of_trouble_is_named() {
        let mut alarmed = row("etcd-2", false);
        alarmed.alarms = vec!["NOSPACE".into()];
        let rows = vec![row("etcd-0", true), down("etcd-1"), alarmed];
        let found = problems(3, "HighlyAvailable", &rows, Some(3));
        assert_eq!(
            found,
            vec![
                "etcd-1: unreachable: connection refused",
                "etcd-2: alarm NOSPACE"
            ]
        );

        let rows = vec![row("etcd-0", true), row("etcd-1", false)];
        let found = problems(3, "HighlyAvailable", &rows, Some(2));
        assert_eq!(
            found,
            vec![
                "2 etcd pod(s), 3 expected (HighlyAvailable)",
                "the member list has 2 member(s), 3 expected (HighlyAvailable)"
            ]
        );

        let rows = vec![down("etcd-0")];
        let found = problems(1, "SingleReplica", &rows, None);
        assert!(
            found.contains(&"no healthy leader: the cluster has no quorum".to_string()),
            "{found:?}"
        );
        assert!(
            found.contains(&"no member answered with the member list".to_string()),
            "{found:?}"
        );
    }

    #[test]
    fn a_status_without_leader_or_with_errors_is_unhealthy() {
        let status = |leader_id: u64, errors: Vec<String>| MemberStatus {
            cluster_id: 1,
            member_id: 7,
            leader_id,
            is_leader: false,
            revision: 9,
            raft_term: 2,
            raft_index: 30,
            db_size: 100,
            db_size_in_use: 50,
            version: "3.4.30".into(),
            errors,
        };
        let mut r = down("etcd-0");
        fill(
            &mut r,
            Answer {
                status: Some(status(7, vec![])),
                ..Answer::default()
            },
        );
        assert!(r.reachable && r.healthy && r.last_error.is_none());
        assert_eq!(r.member_id.as_deref(), Some("7"));

        let mut r = down("etcd-0");
        fill(
            &mut r,
            Answer {
                status: Some(status(0, vec![])),
                ..Answer::default()
            },
        );
        assert!(r.reachable && !r.healthy);
        assert!(r.last_error.unwrap().contains("no leader"));

        let mut r = down("etcd-0");
        fill(
            &mut r,
            Answer {
                status: Some(status(7, vec!["corrupt".into()])),
                ..Answer::default()
            },
        );
        assert_eq!(r.last_error.as_deref(), Some("corrupt"));

        let mut r = down("etcd-0");
        fill(
            &mut r,
            Answer {
                status: Some(status(7, vec![])),
                read_error: Some("timed out".into()),
                ..Answer::default()
            },
        );
        assert!(!r.healthy);
    }

    #[test]
    fn listed_members_are_matched_to_pods_by_name_or_peer_url() {
        let listed = |name: &str, peer: &str| ListedMember {
            id: 1,
            name: name.into(),
            peer_urls: vec![peer.into()],
            client_urls: vec![],
            is_learner: false,
        };
        let r = row("etcd-1", false);
        assert!(runs(&r, &listed("etcd-1", "https://x:2380")));
        assert!(!runs(&r, &listed("etcd-2", "https://10.0.0.1:2380")));
        assert!(runs(&r, &listed("", "https://10.0.0.1:2380")));
        assert!(runs(
            &r,
            &listed("", "https://etcd-1.etcd-discovery.ns.svc:2380")
        ));
        assert!(!runs(
            &r,
            &listed("", "https://etcd-2.etcd-discovery.ns.svc:2380")
        ));
    }

    #[test]
    fn etcd_errors_are_told_briefly() {
        // (the gRPC path, with its innermost cause, is checked on the sandbox)
        let err = EtcdError::Request {
            member: "etcd-1".into(),
            action: "alarm list",
            source: etcd_client::Error::InvalidArgs("bad".into()),
        };
        assert_eq!(brief(&err), "alarm list: invalid arguments: bad");
    }

    #[test]
    fn pod_ip_round_trips_through_the_endpoint() {
        let mut r = row("etcd-0", true);
        assert_eq!(pod_ip(&r).as_deref(), Some("10.0.0.1"));
        r.endpoint = Some(format!("https://{}", join_host_port("fd00::1", 2379)));
        assert_eq!(pod_ip(&r).as_deref(), Some("fd00::1"));
        r.endpoint = None;
        assert_eq!(pod_ip(&r), None);
    }
}
