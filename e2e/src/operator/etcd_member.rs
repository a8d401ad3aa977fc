//! The "kubelet" for etcd pods: every pod of the `etcd` StatefulSet of a
//! hosted control plane runs a REAL etcd process.
//!
//! Per pod, a supervisor task does what the pod's init containers and the
//! kubelet do:
//! 1. `reset-member`: when the member's data directory is empty and the
//!    cluster answers (through the *ready* members, as the `etcd-client`
//!    Service only routes to ready pods), a member of this name is removed and
//!    re-added with this pod's peer URL, and etcd starts with
//!    `initial-cluster-state=existing`.
//! 2. `etcd-init`: otherwise, when the HostedControlPlane has
//!    `spec.etcd.managed.storage.restoreSnapshotURL` and the data directory is
//!    empty, the snapshot is downloaded (https only) and restored.
//! 3. etcd runs on `https://<podIP>:2379` (clients) and `:2380` (peers) with
//!    the server certificate of Secret `etcd-server-tls` (no IP SANs, as real),
//!    client certificate auth against ConfigMap `etcd-ca`, data in the PVC's
//!    directory (`<pv>/data`, the real `/var/lib/data`).
//! 4. The pod is Ready only while the member answers a status request over TLS;
//!    a process that exits is restarted with backoff (CrashLoopBackOff and the
//!    restart count are visible in `containerStatuses`); a deleted pod's
//!    process is killed.
//!
//! Sandbox differences: members address each other by pod IP (real ones use
//! `<pod>.etcd-discovery.<ns>.svc`), so the kubelet issues each member a peer
//! certificate from the `etcd-signer` CA that adds the pod IP and 127.0.0.1 to
//! the DNS names of `etcd-peer-tls`; members do not listen on localhost (they
//! share one machine); the `etcd-metrics` and `healthz` containers are only
//! reported, not run.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::objects::{
    self, CONFIGMAP, HOSTED_CONTROL_PLANE, POD, PVC, SECRET, STATEFULSET, is_deleting, name_of,
    ns_of, str_at, uid_of,
};
use super::workloads::{POD_IP_ANNOTATION, existing_pv_dir, is_etcd_pod};
use super::{Ctx, OperatorError, io_err};
use crate::pki::{Ca, CertPair, CertSpec};
use crate::procs::etcd::{ClientTls, ClusterState, EtcdMemberConfig, EtcdProcess, EtcdTls};

/// etcd client port (as in HyperShift).
pub const CLIENT_PORT: u16 = 2379;
/// etcd peer port.
pub const PEER_PORT: u16 = 2380;
/// `ETCD_QUOTA_BACKEND_BYTES` of hosted etcd (8 GiB).
pub const QUOTA_BACKEND_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// A running supervisor of one etcd pod.
pub struct MemberHandle {
    task: JoinHandle<()>,
}

/// Whether the pod with this uid has a supervisor (its process may run).
pub(crate) fn is_supervised(ctx: &Ctx, uid: &str) -> bool {
    ctx.members
        .lock()
        .map(|m| m.contains_key(uid))
        .unwrap_or(false)
}

/// One pass: start supervisors for new etcd pods, stop those of deleted pods.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let pods = ctx.pods_here(ctx.kube.list(&POD, None, None).await?);
    let etcd_pods: Vec<&Value> = pods.iter().filter(|p| is_etcd_pod(p)).collect();
    let live: std::collections::HashMap<&str, &Value> = etcd_pods
        .iter()
        .filter(|p| !is_deleting(p) && str_at(p, "/status/podIP").is_some())
        .map(|p| (uid_of(p), *p))
        .collect();
    let mut stopped = Vec::new();
    {
        let mut members = ctx
            .members
            .lock()
            .map_err(|_| OperatorError::Waiting("member table poisoned".into()))?;
        let gone: Vec<String> = members
            .keys()
            .filter(|uid| !live.contains_key(uid.as_str()))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(h) = members.remove(&uid) {
                h.task.abort();
                stopped.push(h.task);
            }
        }
        for (uid, pod) in &live {
            if members.contains_key(*uid) {
                continue;
            }
            let Some(ip) = str_at(pod, "/status/podIP").and_then(|s| s.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let member = Member {
                ctx: ctx.clone(),
                ns: ns_of(pod).to_string(),
                pod: name_of(pod).to_string(),
                ip,
                dir: ctx
                    .cfg
                    .state_dir
                    .join("pods")
                    .join(ns_of(pod))
                    .join(format!("{}-{}", name_of(pod), uid)),
                containers: pod
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .map(|cs| {
                        cs.iter()
                            .filter_map(|c| {
                                c.get("name").and_then(Value::as_str).map(str::to_string)
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            tracing::info!(namespace = %member.ns, pod = %member.pod, %ip, "starting etcd member supervisor");
            members.insert(
                uid.to_string(),
                MemberHandle {
                    task: tokio::spawn(member.supervise()),
                },
            );
        }
    }
    for t in stopped {
        // Wait until the process is killed (the task dropped it).
        let _ = t.await;
    }
    // Pods being deleted whose process is now stopped: confirm the deletion.
    for pod in etcd_pods.iter().filter(|p| is_deleting(p)) {
        if !is_supervised(&ctx, uid_of(pod)) {
            super::workloads::delete_now(&ctx, &POD, ns_of(pod), name_of(pod)).await?;
        }
    }
    Ok(())
}

/// Kill every member process.
pub(crate) async fn stop_all(ctx: &Ctx) {
    let handles: Vec<MemberHandle> = match ctx.members.lock() {
        Ok(mut m) => m.drain().map(|(_, h)| h).collect(),
        Err(_) => Vec::new(),
    };
    for h in &handles {
        h.task.abort();
    }
    for h in handles {
        let _ = h.task.await;
    }
}

/// Decode `data[key]` of a Secret or `data[key]` of a ConfigMap.
pub(crate) fn secret_data(secret: &Value, key: &str) -> Option<String> {
    let b64 = secret.get("data")?.get(key)?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

pub(crate) fn configmap_data(cm: &Value, key: &str) -> Option<String> {
    cm.get("data")?.get(key)?.as_str().map(str::to_string)
}

/// A cert/key pair from a Secret.
pub(crate) async fn secret_pair(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    crt: &str,
    key: &str,
) -> Result<CertPair, OperatorError> {
    let secret = ctx
        .kube
        .get(&SECRET, Some(ns), name)
        .await?
        .ok_or_else(|| OperatorError::Waiting(format!("Secret {ns}/{name}")))?;
    match (secret_data(&secret, crt), secret_data(&secret, key)) {
        (Some(cert_pem), Some(key_pem)) => Ok(CertPair { cert_pem, key_pem }),
        _ => Err(OperatorError::Invalid {
            what: format!("Secret {ns}/{name}: missing {crt} or {key}"),
        }),
    }
}

/// The CA bundle of ConfigMap `etcd-ca`.
pub(crate) async fn etcd_ca_pem(ctx: &Ctx, ns: &str) -> Result<String, OperatorError> {
    let cm = ctx
        .kube
        .get(&CONFIGMAP, Some(ns), "etcd-ca")
        .await?
        .ok_or_else(|| OperatorError::Waiting(format!("ConfigMap {ns}/etcd-ca")))?;
    configmap_data(&cm, "ca.crt").ok_or_else(|| OperatorError::Invalid {
        what: format!("ConfigMap {ns}/etcd-ca has no ca.crt"),
    })
}

/// Client TLS for the members of `ns` (Secret `etcd-client-tls`, ConfigMap
/// `etcd-ca`), verifying the server as `server_name`.
pub(crate) async fn client_tls(
    ctx: &Ctx,
    ns: &str,
    server_name: String,
) -> Result<ClientTls, OperatorError> {
    let ca_pem = etcd_ca_pem(ctx, ns).await?;
    let pair = secret_pair(
        ctx,
        ns,
        "etcd-client-tls",
        "etcd-client.crt",
        "etcd-client.key",
    )
    .await?;
    Ok(ClientTls {
        ca_pem,
        cert_pem: pair.cert_pem,
        key_pem: pair.key_pem,
        server_name,
    })
}

/// The etcd signer CA of an HCP namespace (Secret `etcd-signer`).
pub(crate) async fn load_signer(ctx: &Ctx, ns: &str) -> Result<Ca, OperatorError> {
    let pair = secret_pair(ctx, ns, "etcd-signer", "tls.crt", "tls.key").await?;
    ca_from_pair(&ctx.cfg.state_dir, ns, &pair)
}

/// Load a CA from PEMs (via `Ca::load` on a private directory).
pub(crate) fn ca_from_pair(
    state_dir: &Path,
    ns: &str,
    pair: &CertPair,
) -> Result<Ca, OperatorError> {
    let dir = state_dir.join("signers").join(ns);
    std::fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
    write_private(&dir.join("ca.crt"), &pair.cert_pem)?;
    write_private(&dir.join("ca.key"), &pair.key_pem)?;
    Ok(Ca::load(&dir)?)
}

fn write_private(path: &Path, text: &str) -> Result<(), OperatorError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).map_err(io_err("writing", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err("chmod", path))
}

/// The member names of `ETCD_INITIAL_CLUSTER` in the StatefulSet's `etcd`
/// container (falling back to `etcd-0..replicas`).
pub(crate) fn initial_cluster_names(sts: &Value) -> Vec<String> {
    let containers = sts
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array);
    let env_value = containers
        .into_iter()
        .flatten()
        .filter(|c| c.get("name").and_then(Value::as_str) == Some("etcd"))
        .find_map(|c| {
            c.get("env")?.as_array()?.iter().find_map(|e| {
                (e.get("name").and_then(Value::as_str) == Some("ETCD_INITIAL_CLUSTER"))
                    .then(|| e.get("value").and_then(Value::as_str))
                    .flatten()
            })
        });
    match env_value {
        Some(v) => v
            .split(',')
            .filter_map(|m| m.split_once('=').map(|(n, _)| n.trim().to_string()))
            .filter(|n| !n.is_empty())
            .collect(),
        None => {
            let n = sts
                .pointer("/spec/replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            (0..n).map(|i| format!("{}-{i}", name_of(sts))).collect()
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    // The kubelet's 10s..5min, scaled down for the sandbox.
    Duration::from_millis((500u64 << attempt.min(6)).min(20_000))
}

/// What `reset-member` found.
enum Reset {
    /// No ready member answered: first start (or a restore).
    NoCluster,
    /// The cluster answered and has no member of this name: start as new.
    NotMember,
    /// The old member was replaced; join with this initial cluster.
    Rejoined(Vec<(String, String)>),
}

struct Member {
    ctx: Arc<Ctx>,
    ns: String,
    pod: String,
    ip: IpAddr,
    dir: PathBuf,
    containers: Vec<String>,
}

impl Member {
    fn own_peer_url(&self) -> String {
        format!("https://{}:{PEER_PORT}", self.ip)
    }

    async fn supervise(self) {
        let mut attempt = 0u32;
        let mut last_error = String::new();
        let cfg = loop {
            match self.init().await {
                Ok(cfg) => break cfg,
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(namespace = %self.ns, pod = %self.pod, "etcd init: {text}");
                        last_error = text.clone();
                    }
                    self.report(
                        json!({"waiting": {"reason": "PodInitializing", "message": text}}),
                        None,
                        false,
                        0,
                        false,
                    )
                    .await;
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        };
        let mut restarts = 0u32;
        let mut last_state: Option<Value> = None;
        loop {
            let started_at = objects::now();
            match EtcdProcess::start(cfg.clone()) {
                Ok(mut proc) => {
                    let running = json!({"running": {"startedAt": started_at}});
                    let mut reported: Option<bool> = None;
                    while proc.is_running() {
                        let healthy = self.healthy().await;
                        if reported != Some(healthy) {
                            self.report(
                                running.clone(),
                                last_state.clone(),
                                healthy,
                                restarts,
                                true,
                            )
                            .await;
                            reported = Some(healthy);
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    tracing::warn!(namespace = %self.ns, pod = %self.pod, "etcd exited; last log lines:\n{}", proc.log_tail(15));
                }
                Err(e) => {
                    tracing::warn!(namespace = %self.ns, pod = %self.pod, "starting etcd: {e}")
                }
            }
            restarts = restarts.saturating_add(1);
            last_state = Some(
                json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": started_at,
                "finishedAt": objects::now()}}),
            );
            let message = format!(
                "back-off restarting failed container etcd in pod {}_{}",
                self.pod, self.ns
            );
            self.report(
                json!({"waiting": {"reason": "CrashLoopBackOff", "message": message}}),
                last_state.clone(),
                false,
                restarts,
                true,
            )
            .await;
            tokio::time::sleep(backoff(restarts)).await;
        }
    }

    /// Patch the pod status: the etcd container's state, readiness, restarts.
    async fn report(
        &self,
        state: Value,
        last_state: Option<Value>,
        ready: bool,
        restarts: u32,
        initialized: bool,
    ) {
        let now = objects::now();
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                if c == "etcd" {
                    let mut s = json!({"name": c, "image": "etcd", "imageID": "", "ready": ready,
                        "started": state.get("running").is_some(), "restartCount": restarts, "state": state});
                    if let Some(l) = &last_state {
                        s["lastState"] = l.clone();
                    }
                    s
                } else {
                    json!({"name": c, "image": c, "imageID": "", "ready": initialized, "started": initialized, "restartCount": 0,
                        "state": if initialized { json!({"running": {"startedAt": now}}) } else { json!({"waiting": {"reason": "PodInitializing"}}) }})
                }
            })
            .collect();
        let cond = |t: &str, s: bool| json!({"type": t, "status": if s { "True" } else { "False" }, "lastTransitionTime": now});
        let status = json!({
            "phase": if initialized { "Running" } else { "Pending" },
            "podIP": self.ip.to_string(), "podIPs": [{"ip": self.ip.to_string()}],
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "conditions": [cond("PodScheduled", true), cond("Initialized", initialized), cond("ContainersReady", ready), cond("Ready", ready)],
            "containerStatuses": statuses,
        });
        if let Err(e) = self
            .ctx
            .kube
            .merge_status(&POD, Some(&self.ns), &self.pod, &json!({"status": status}))
            .await
        {
            tracing::debug!(namespace = %self.ns, pod = %self.pod, "pod status: {e}");
        }
    }

    /// The member answers a status request over TLS (as the readiness probe).
    async fn healthy(&self) -> bool {
        let Ok(tls) = client_tls(
            &self.ctx,
            &self.ns,
            format!("{}.etcd-discovery.{}.svc", self.pod, self.ns),
        )
        .await
        else {
            return false;
        };
        let url = format!("https://{}:{CLIENT_PORT}", self.ip);
        let check = async {
            let mut client = crate::procs::etcd::connect_client(&[url], Some(&tls))
                .await
                .ok()?;
            let status = client.status().await.ok()?;
            (status.leader() != 0 && status.errors().is_empty()).then_some(())?;
            client.get("health", None).await.ok()
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(3), check).await,
            Ok(Some(_))
        )
    }

    /// The init containers: TLS files, volume, reset-member, restore.
    async fn init(&self) -> Result<EtcdMemberConfig, OperatorError> {
        let ctx = &self.ctx;
        let ns = self.ns.as_str();
        let tls_dir = self.dir.join("tls");
        std::fs::create_dir_all(&tls_dir).map_err(io_err("creating", &tls_dir))?;
        let ca_pem = etcd_ca_pem(ctx, ns).await?;
        let server = secret_pair(ctx, ns, "etcd-server-tls", "server.crt", "server.key").await?;
        let signer = load_signer(ctx, ns).await?;
        let peer = signer.issue(&CertSpec {
            common_name: format!("{}.etcd-discovery.{ns}.svc", self.pod),
            organization: None,
            dns_names: vec![
                format!("*.etcd-discovery.{ns}.svc"),
                format!("*.etcd-discovery.{ns}.svc.cluster.local"),
                format!("{}.etcd-discovery.{ns}.svc", self.pod),
            ],
            ips: vec![self.ip, IpAddr::from([127, 0, 0, 1])],
            server: true,
            client: true,
        })?;
        let ca_file = tls_dir.join("ca.crt");
        write_private(&ca_file, &ca_pem)?;
        let (server_cert_file, server_key_file) = server.write_files(&tls_dir, "server")?;
        let (peer_cert_file, peer_key_file) = peer.write_files(&tls_dir, "peer")?;

        let pvc_name = format!("data-{}", self.pod);
        let pvc = ctx
            .kube
            .get(&PVC, Some(ns), &pvc_name)
            .await?
            .ok_or_else(|| OperatorError::Waiting(format!("PVC {ns}/{pvc_name}")))?;
        if is_deleting(&pvc) {
            return Err(OperatorError::Waiting(format!(
                "PVC {ns}/{pvc_name} is being deleted"
            )));
        }
        let pv = existing_pv_dir(&ctx.cfg.state_dir, &pvc)
            .ok_or_else(|| OperatorError::Waiting(format!("volume of PVC {ns}/{pvc_name}")))?;
        let data_dir = pv.join("data");

        let sts = ctx
            .kube
            .get(&STATEFULSET, Some(ns), "etcd")
            .await?
            .ok_or_else(|| OperatorError::Waiting(format!("StatefulSet {ns}/etcd")))?;
        let mut initial = Vec::new();
        for name in initial_cluster_names(&sts) {
            let ip = if name == self.pod {
                self.ip.to_string()
            } else {
                let claim = ctx
                    .kube
                    .get(&PVC, Some(ns), &format!("data-{name}"))
                    .await?;
                claim
                    .as_ref()
                    .and_then(|c| {
                        str_at(
                            c,
                            &format!(
                                "/metadata/annotations/{}",
                                POD_IP_ANNOTATION.replace('/', "~1")
                            ),
                        )
                    })
                    .map(str::to_string)
                    .ok_or_else(|| OperatorError::Waiting(format!("address of peer {name}")))?
            };
            initial.push((name, format!("https://{ip}:{PEER_PORT}")));
        }
        let mut state = ClusterState::New;
        if !data_dir.join("member").join("snap").join("db").exists() {
            if data_dir.exists() {
                std::fs::remove_dir_all(&data_dir).map_err(io_err("removing", &data_dir))?;
            }
            match self.reset_member(initial.len()).await? {
                Reset::Rejoined(cluster) => {
                    state = ClusterState::Existing;
                    initial = cluster;
                }
                Reset::NotMember => {
                    tracing::info!(namespace = ns, pod = %self.pod, "cluster is functional and has no member of this name: starting as new");
                }
                Reset::NoCluster => {
                    if let Some(url) = restore_snapshot_url(ctx, ns).await? {
                        self.restore(&url, &data_dir, &initial).await?;
                    }
                }
            }
        }
        let log_dir = ctx.cfg.state_dir.join("logs").join(ns);
        Ok(EtcdMemberConfig {
            name: self.pod.clone(),
            data_dir,
            log_dir,
            client_ip: self.ip,
            client_port: CLIENT_PORT,
            peer_port: PEER_PORT,
            initial_cluster: initial,
            initial_cluster_state: state,
            tls: Some(EtcdTls {
                ca_file,
                server_cert_file,
                server_key_file,
                peer_cert_file,
                peer_key_file,
                client_cert_auth: true,
            }),
            quota_backend_bytes: Some(QUOTA_BACKEND_BYTES),
        })
    }

    /// The `reset-member` init container, against the ready members only
    /// (what the `etcd-client` Service would route to).
    async fn reset_member(&self, expected: usize) -> Result<Reset, OperatorError> {
        let ctx = &self.ctx;
        let ns = self.ns.as_str();
        let pods = ctx.kube.list(&POD, Some(ns), Some("app=etcd")).await?;
        let endpoints: Vec<String> = pods
            .iter()
            .filter(|p| {
                is_etcd_pod(p)
                    && name_of(p) != self.pod
                    && objects::condition_true(p.pointer("/status/conditions"), "Ready")
            })
            .filter_map(|p| {
                str_at(p, "/status/podIP").map(|ip| format!("https://{ip}:{CLIENT_PORT}"))
            })
            .collect();
        if endpoints.is_empty() {
            return Ok(Reset::NoCluster);
        }
        let tls = client_tls(ctx, ns, format!("etcd-client.{ns}.svc")).await?;
        let etcd_err = |action: &str| {
            let action = action.to_string();
            move |source| OperatorError::Etcd {
                action,
                source: Box::new(source),
            }
        };
        let mut client = match crate::procs::etcd::connect_client(&endpoints, Some(&tls)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(namespace = ns, pod = %self.pod, "cannot reach the cluster, likely not up yet: {e}");
                return Ok(Reset::NoCluster);
            }
        };
        let list = match client.member_list().await {
            Ok(l) => l,
            Err(e) => {
                tracing::info!(namespace = ns, pod = %self.pod, "cannot list members, likely not up yet: {e}");
                return Ok(Reset::NoCluster);
            }
        };
        let own = self.own_peer_url();
        let members = match list
            .members()
            .iter()
            .find(|m| m.name() == self.pod || m.peer_urls().contains(&own))
        {
            // Added by an earlier attempt of this pod (not started yet): keep it.
            Some(m) if m.name().is_empty() && m.peer_urls().contains(&own) => {
                list.members().to_vec()
            }
            Some(old) => {
                tracing::info!(namespace = ns, pod = %self.pod, id = old.id(), "a member with this name exists: removing it and adding this pod as a new member");
                client
                    .member_remove(old.id())
                    .await
                    .map_err(etcd_err("member remove"))?;
                client
                    .member_add([own.clone()], None)
                    .await
                    .map_err(etcd_err("member add"))?
                    .member_list()
                    .to_vec()
            }
            // A removal whose reply was lost leaves the cluster short of this
            // member (the real script would crash-loop here): add it.
            None if list.members().len() < expected => {
                tracing::info!(namespace = ns, pod = %self.pod, "cluster is short of this member: adding it");
                client
                    .member_add([own.clone()], None)
                    .await
                    .map_err(etcd_err("member add"))?
                    .member_list()
                    .to_vec()
            }
            None => return Ok(Reset::NotMember),
        };
        let mut cluster = Vec::new();
        for m in &members {
            let name = if m.peer_urls().contains(&own) {
                self.pod.clone()
            } else {
                m.name().to_string()
            };
            if let Some(url) = m.peer_urls().first() {
                if name.is_empty() {
                    continue;
                }
                cluster.push((name, url.clone()));
            }
        }
        Ok(Reset::Rejoined(cluster))
    }

    /// The `etcd-init` restore from `restoreSnapshotURL`.
    async fn restore(
        &self,
        url: &str,
        data_dir: &Path,
        initial: &[(String, String)],
    ) -> Result<(), OperatorError> {
        let shown = redact(url);
        if !url.starts_with("https://") {
            return Err(OperatorError::Snapshot {
                url: shown,
                reason: "only https:// snapshot URLs are supported in the sandbox (s3:// needs AWS credentials in the pod); use a presigned URL".into(),
            });
        }
        let snapshot = self.dir.join("snapshot.db");
        let mut roots = self.ctx.cfg.ca.cert_pem().to_string();
        if let Some(extra) = &self.ctx.cfg.snapshot_ca_pem {
            roots.push('\n');
            roots.push_str(extra);
        }
        tracing::info!(namespace = %self.ns, pod = %self.pod, url = %shown, "restoring etcd snapshot");
        download(url, &roots, &snapshot).await?;
        let (snap, dir, name, cluster, peer) = (
            snapshot.clone(),
            data_dir.to_path_buf(),
            self.pod.clone(),
            initial.to_vec(),
            self.own_peer_url(),
        );
        tokio::task::spawn_blocking(move || {
            crate::procs::etcd::etcdctl_snapshot_restore(&snap, &dir, &name, &cluster, &peer)
        })
        .await
        .map_err(|e| OperatorError::Waiting(format!("restore task: {e}")))??;
        let _ = std::fs::remove_file(&snapshot);
        Ok(())
    }
}

/// The first `restoreSnapshotURL` of the HostedControlPlane in `ns`.
async fn restore_snapshot_url(ctx: &Ctx, ns: &str) -> Result<Option<String>, OperatorError> {
    let hcps = ctx.kube.list(&HOSTED_CONTROL_PLANE, Some(ns), None).await?;
    Ok(hcps.iter().find_map(|h| {
        h.pointer("/spec/etcd/managed/storage/restoreSnapshotURL/0")
            .and_then(Value::as_str)
            .map(str::to_string)
    }))
}

/// A URL without its query string (presigned URLs carry credentials there).
pub(crate) fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?<redacted>"),
        None => url.to_string(),
    }
}

/// GET an https URL trusting only `roots_pem`, streaming the body to `dest`.
pub(crate) async fn download(url: &str, roots_pem: &str, dest: &Path) -> Result<(), OperatorError> {
    use http_body_util::BodyExt as _;
    use tokio::io::AsyncWriteExt as _;
    let fail = |reason: String| OperatorError::Snapshot {
        url: redact(url),
        reason,
    };
    let uri: hyper::Uri = url.parse().map_err(|e| fail(format!("invalid URL: {e}")))?;
    let host = uri
        .host()
        .ok_or_else(|| fail("no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_else(|| host.clone());
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut config = (*crate::pki::client_tls_config(roots_pem, None)?).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| fail(format!("connect: {e}")))?;
    let server_name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| fail(format!("server name: {e}")))?;
    let tls = connector
        .connect(server_name, tcp)
        .await
        .map_err(|e| fail(format!("TLS: {e}")))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| fail(format!("HTTP handshake: {e}")))?;
    let conn_task = tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| fail(format!("request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| fail(format!("request: {e}")))?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = body
            .collect()
            .await
            .map(|b| {
                String::from_utf8_lossy(&b.to_bytes())
                    .chars()
                    .take(300)
                    .collect::<String>()
            })
            .unwrap_or_default();
        conn_task.abort();
        return Err(fail(format!("HTTP {status}: {text}")));
    }
    let mut file = tokio::fs::File::create(dest)
        .await
        .map_err(io_err("creating", dest))?;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail(format!("reading body: {e}")))?;
        if let Some(data) = frame.data_ref() {
            file.write_all(data)
                .await
                .map_err(io_err("writing", dest))?;
        }
    }
    file.flush().await.map_err(io_err("writing", dest))?;
    conn_task.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_cluster_names_come_from_the_env() {
        let sts = json!({"metadata": {"name": "etcd"}, "spec": {"replicas": 3, "template": {"spec": {"containers": [
            {"name": "etcd", "env": [{"name": "ETCD_INITIAL_CLUSTER",
              "value": "etcd-0=https://etcd-0.etcd-discovery.ns.svc:2380,etcd-1=https://etcd-1.etcd-discovery.ns.svc:2380"}]}]}}}});
        assert_eq!(initial_cluster_names(&sts), vec!["etcd-0", "etcd-1"]);
        let bare = json!({"metadata": {"name": "etcd"}, "spec": {"replicas": 3}});
        assert_eq!(
            initial_cluster_names(&bare),
            vec!["etcd-0", "etcd-1", "etcd-2"]
        );
    }

    #[test]
    fn presigned_queries_are_redacted() {
        assert_eq!(
            redact("https://h/b/k?X-Amz-Signature=abc"),
            "https://h/b/k?<redacted>"
        );
        assert_eq!(redact("https://h/b/k"), "https://h/b/k");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(1) > backoff(0));
        assert_eq!(backoff(30), backoff(40));
        assert!(backoff(40) <= Duration::from_secs(20));
    }
}
