//! `preflight`: read-only checks before anything changes. The hosted cluster
//! exists and its etcd is Managed; its NodePools; the etcd StatefulSet and
//! its PVC retention; the client TLS material; every member reachable,
//! healthy and at one revision.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::context::{BackupContext, EtcdAccess, EtcdTlsMaterial, MemberTarget};
use super::{StageError, from_output};
use crate::archive::ClusterIdentity;
use crate::etcd::Member;
use crate::hosted::{self, HOSTED_CLUSTER, HostedCluster, NODE_POOL};
use crate::kube::portforward::LocalForward;
use crate::kube::{KubeError, api, get_json, list_json, request};
use crate::pipeline::{Stage, StageFailure, Step};

/// What preflight found (journaled; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Findings {
    pub identity: ClusterIdentity,
    pub node_pools: Vec<String>,
    pub members: Vec<MemberTarget>,
    pub tls_source: String,
    pub warnings: Vec<String>,
}

pub struct Preflight;

#[async_trait]
impl Stage<BackupContext> for Preflight {
    fn name(&self) -> &'static str {
        "preflight"
    }
    fn summary(&self) -> &'static str {
        "check the hosted cluster, its etcd (Managed, healthy members, PVC retention) and the TLS material"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, _ctx: &BackupContext, _params: &Value) -> Vec<String> {
        vec!["read-only checks".into()]
    }
    async fn run(&self, ctx: &mut BackupContext, _step: &mut Step<'_>) -> Result<Value, StageFailure> {
        let findings = check(ctx).await?;
        self.restore(ctx, &serde_json::to_value(&findings)?)?;
        Ok(serde_json::to_value(findings)?)
    }
    fn restore(&self, ctx: &mut BackupContext, output: &Value) -> Result<(), StageFailure> {
        let findings: Findings = from_output("preflight", output)?;
        ctx.identity = Some(findings.identity);
        ctx.node_pools = findings.node_pools;
        ctx.members = findings.members;
        ctx.warnings.extend(findings.warnings);
        Ok(())
    }
}

async fn check(ctx: &mut BackupContext) -> Result<Findings, StageFailure> {
    let (ns, name) = (ctx.inputs.namespace.clone(), ctx.inputs.hosted_cluster.clone());
    let hc = get_json(&api(&ctx.client, &HOSTED_CLUSTER, &ns), &name, &ctx.hc_label())
        .await?
        .ok_or_else(|| KubeError::NotFound {
            what: ctx.hc_label(),
            hint: format!(
                ": check the name and namespace (kubectl get hostedclusters -n {ns}); -n sets the namespace"
            ),
        })?;
    let hc = HostedCluster(hc);
    match hc.etcd_management_type() {
        "Managed" => {}
        "Unmanaged" => {
            return Err(StageError::Precondition(format!(
                "{} uses Unmanaged etcd: hcp-dr backs up Managed etcd only; back up the external etcd with its own tooling",
                ctx.hc_label()
            ))
            .into());
        }
        other => {
            return Err(StageError::Precondition(format!(
                "{} has spec.etcd.managementType `{other}`; only Managed is supported",
                ctx.hc_label()
            ))
            .into());
        }
    }
    let mut warnings = Vec::new();
    if hosted::pauses(hc.paused_until(), chrono::Utc::now()) {
        warnings.push(format!(
            "{} was already paused (pausedUntil={}); the backup keeps that value when it resumes",
            ctx.hc_label(),
            hc.paused_until().unwrap_or_default()
        ));
    }

    let pools = list_json(&api(&ctx.client, &NODE_POOL, &ns), &ListParams::default(), "NodePools").await?;
    let mut node_pools: Vec<String> = pools
        .iter()
        .filter(|np| np["spec"]["clusterName"].as_str() == Some(name.as_str()))
        .filter_map(|np| np["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    node_pools.sort();

    let hcp_ns = hc.hcp_namespace();
    let sts: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let sts = sts
        .get_opt(hosted::ETCD_STATEFULSET)
        .await
        .map_err(request(format!("reading StatefulSet {hcp_ns}/etcd")))?
        .ok_or_else(|| KubeError::NotFound {
            what: format!("StatefulSet {hcp_ns}/etcd"),
            hint: format!(": is {} fully created? (kubectl -n {hcp_ns} get statefulsets)", ctx.hc_label()),
        })?;
    if let Some(policy) = sts.spec.persistent_volume_claim_retention_policy.as_ref() {
        if policy.when_scaled.as_deref() == Some("Delete") {
            warnings.push(format!(
                "StatefulSet {hcp_ns}/etcd has persistentVolumeClaimRetentionPolicy.whenScaled=Delete: scaling etcd to zero would delete its data (backup does not scale etcd; restore procedures must not)"
            ));
        }
    }

    // The store must answer before anything is paused.
    ctx.store
        .list(&crate::archive::Layout::cluster_prefix(&ns, &name))
        .await
        .map_err(|err| StageError::Precondition(format!("the store {} cannot be used: {err}", ctx.store.url())))?;

    let tls = discover_tls(ctx, &hcp_ns).await?;
    let tls_source = tls.source.clone();
    ctx.etcd_tls = Some(tls);

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let pods = pods
        .list(&ListParams::default().labels(hosted::ETCD_POD_SELECTOR))
        .await
        .map_err(request(format!("listing etcd pods in {hcp_ns}")))?;
    let expected = hc.expected_etcd_members();
    if pods.items.len() != expected {
        return Err(StageError::Precondition(format!(
            "{} is {} and should have {expected} etcd member(s), but {} pod(s) match {} in {hcp_ns}; repair etcd first (hcp-dr etcd status)",
            ctx.hc_label(),
            hc.availability_policy(),
            pods.items.len(),
            hosted::ETCD_POD_SELECTOR
        ))
        .into());
    }
    let mut members = Vec::new();
    for pod in &pods.items {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.clone()).unwrap_or_default();
        let pod_ip = status.and_then(|s| s.pod_ip.clone()).unwrap_or_default();
        if phase != "Running" || pod_ip.is_empty() {
            return Err(StageError::Precondition(format!(
                "etcd member {hcp_ns}/{pod_name} is not running (phase `{phase}`, pod IP `{pod_ip}`); repair it first (hcp-dr etcd recover)"
            ))
            .into());
        }
        members.push(MemberTarget {
            pod: pod_name,
            pod_ip,
            revision: 0,
        });
    }
    members.sort_by(|a, b| a.pod.cmp(&b.pod));
    for target in &mut members {
        let (member, _forward) = connect_member(ctx, target).await?;
        let mut client = member.connect().await?;
        let status = member.status(&mut client).await?;
        if !status.errors.is_empty() {
            return Err(StageError::Precondition(format!(
                "etcd member {} reports errors: {}",
                target.pod,
                status.errors.join("; ")
            ))
            .into());
        }
        if status.leader_id == 0 {
            return Err(StageError::Precondition(format!("etcd member {} has no leader", target.pod)).into());
        }
        target.revision = status.revision;
    }

    Ok(Findings {
        identity: ClusterIdentity {
            namespace: ns,
            name,
            uid: hc.uid().to_string(),
            cluster_id: hc.cluster_id().map(str::to_string),
            infra_id: hc.infra_id().map(str::to_string),
            hcp_namespace: hcp_ns,
            platform: hc.platform().to_string(),
            availability_policy: hc.availability_policy().to_string(),
            release_image: hc.release_image().to_string(),
            encryption_key_secret: hc.encryption_key_secret().map(str::to_string),
        },
        node_pools,
        members,
        tls_source,
        warnings,
    })
}

fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
}

/// Find the etcd client TLS: command-line overrides first, then the current
/// HyperShift names (Secret `etcd-client-tls` with `etcd-client.crt/.key`,
/// ConfigMap `etcd-ca` with `ca.crt`), then older ones (`tls.crt/tls.key`,
/// CA in the secret as `etcd-client-ca.crt` or `ca.crt`).
pub async fn discover_tls(ctx: &BackupContext, hcp_ns: &str) -> Result<EtcdTlsMaterial, StageFailure> {
    let o = &ctx.tls_override;
    if let (Some(ca), Some(cert), Some(key)) = (&o.ca_pem, &o.cert_pem, &o.key_pem) {
        return Ok(EtcdTlsMaterial {
            ca_pem: ca.clone(),
            cert_pem: cert.clone(),
            key_pem: key.clone(),
            source: "command-line files".into(),
        });
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), hcp_ns);
    let secret = secrets
        .get_opt("etcd-client-tls")
        .await
        .map_err(request(format!("reading Secret {hcp_ns}/etcd-client-tls")))?;
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), hcp_ns);
    let ca_cm = cms
        .get_opt("etcd-ca")
        .await
        .map_err(request(format!("reading ConfigMap {hcp_ns}/etcd-ca")))?;
    let mut source = Vec::new();
    let (mut cert, mut key, mut ca) = (o.cert_pem.clone(), o.key_pem.clone(), o.ca_pem.clone());
    if let Some(secret) = &secret {
        for (c, k) in [("etcd-client.crt", "etcd-client.key"), ("tls.crt", "tls.key")] {
            if cert.is_none() && key.is_none() {
                if let (Some(c_val), Some(k_val)) = (secret_value(secret, c), secret_value(secret, k)) {
                    cert = Some(c_val);
                    key = Some(k_val);
                    source.push(format!("Secret {hcp_ns}/etcd-client-tls ({c}, {k})"));
                }
            }
        }
        if ca.is_none() {
            for k in ["etcd-client-ca.crt", "ca.crt"] {
                if let Some(v) = secret_value(secret, k) {
                    ca = Some(v);
                    source.push(format!("Secret {hcp_ns}/etcd-client-tls ({k})"));
                    break;
                }
            }
        }
    }
    if ca.is_none() {
        if let Some(v) = ca_cm.as_ref().and_then(|c| c.data.as_ref()).and_then(|d| d.get("ca.crt")) {
            ca = Some(v.clone());
            source.push(format!("ConfigMap {hcp_ns}/etcd-ca (ca.crt)"));
        }
    }
    match (ca, cert, key) {
        (Some(ca_pem), Some(cert_pem), Some(key_pem)) => Ok(EtcdTlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
            source: source.join(", "),
        }),
        (ca, cert, _) => Err(StageError::Precondition(format!(
            "no etcd client TLS material in {hcp_ns}: looked for Secret etcd-client-tls (etcd-client.crt + etcd-client.key, or tls.crt + tls.key){} and a CA in ConfigMap etcd-ca (ca.crt) or that Secret (etcd-client-ca.crt){}; pass --etcd-ca, --etcd-cert and --etcd-key to use files instead",
            if cert.is_none() { " [missing]" } else { "" },
            if ca.is_none() { " [missing]" } else { "" },
        ))
        .into()),
    }
}

/// How to reach one member under the context's access mode; the forward (if
/// any) must be kept alive while the member is used.
pub async fn connect_member(
    ctx: &BackupContext,
    target: &MemberTarget,
) -> Result<(Member, Option<LocalForward>), StageFailure> {
    let hcp_ns = ctx.hcp_namespace();
    let tls = match &ctx.etcd_tls {
        Some(tls) => tls.clone(),
        None => discover_tls(ctx, &hcp_ns).await?,
    };
    let client_tls = Some(tls.for_member(&target.pod, &hcp_ns));
    let direct = format!("{}:{}", target.pod_ip, hosted::ETCD_CLIENT_PORT);
    let use_pod_ip = match ctx.inputs.etcd_access {
        EtcdAccess::PodIp => true,
        EtcdAccess::PortForward => false,
        EtcdAccess::Auto => matches!(
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(&direct)).await,
            Ok(Ok(_))
        ),
    };
    if use_pod_ip {
        return Ok((
            Member {
                name: target.pod.clone(),
                url: format!("https://{direct}"),
                tls: client_tls,
            },
            None,
        ));
    }
    let forward = LocalForward::start(&ctx.client, &hcp_ns, &target.pod, hosted::ETCD_CLIENT_PORT).await?;
    Ok((
        Member {
            name: target.pod.clone(),
            url: format!("https://{}", forward.local_addr()),
            tls: client_tls,
        },
        Some(forward),
    ))
}
