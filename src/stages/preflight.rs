//! `preflight`: read-only checks before anything changes. The hosted cluster
//! exists and its etcd is Managed; its NodePools; the etcd StatefulSet and
//! its PVC retention; the client TLS material; every member reachable,
//! healthy and at one revision.

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};

use super::context::{BackupContext, EtcdTlsMaterial, MemberTarget};
use super::etcd_members::{self, Seen};
use super::{StageError, etcd_access};
use crate::archive::fence::{self, FenceError};
use crate::archive::{ClusterIdentity, DnsOrigin, ManagementCluster, Origin, OriginRecord, SkippedMember};
use crate::etcd::Member;
use crate::hosted::{self, HOSTED_CLUSTER, HostedCluster, NODE_POOL};
use crate::kube::portforward::LocalForward;
use crate::kube::{KubeError, api, get_json, list_json, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step};

/// What preflight found (journaled; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Findings {
    pub identity: ClusterIdentity,
    pub node_pools: Vec<String>,
    pub members: Vec<MemberTarget>,
    /// Members skipped and whether etcd had quorum (older journals lack it).
    #[serde(default)]
    pub etcd_health: crate::archive::EtcdHealth,
    pub tls_source: String,
    pub warnings: Vec<String>,
    /// Where the backup is taken and what the cluster publishes (older
    /// journals lack it).
    #[serde(default)]
    pub origin: Option<Origin>,
    /// The Agents bound to the cluster (None: another platform); the
    /// export takes them and the rest of the inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// KubeVirt: the guest volumes `volume-snapshot` and `volume-copy`
    /// take, each with its VolumeSnapshotClass (None: another platform, or
    /// `--skip-guest-volumes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_volumes: Option<hosted::kubevirt::GuestData>,
}

pub struct Preflight;

impl StageId for Preflight {
    const NAME: &'static str = "preflight";
    type Output = Findings;
}

#[async_trait]
impl Stage<BackupContext> for Preflight {
    fn summary(&self) -> &'static str {
        "check the hosted cluster, its etcd (Managed, healthy members, PVC retention) and the TLS material"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, _ctx: &BackupContext, _step: &Step<'_>) -> Vec<String> {
        vec!["read-only checks".into()]
    }
    async fn run(&self, ctx: &mut BackupContext, _step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let findings = check(ctx).await?;
        self.restore(ctx, findings.clone())?;
        Ok(findings)
    }
    fn restore(&self, ctx: &mut BackupContext, findings: Findings) -> Result<(), StageFailure> {
        ctx.node_pools = findings.node_pools;
        ctx.members = findings.members;
        ctx.etcd_health = findings.etcd_health;
        ctx.origin = findings.origin;
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
    if let Some(runs_on) = hc.fenced() {
        return Err(StageError::Precondition(format!(
            "{} is fenced on this management cluster (annotation {}: the cluster runs on {runs_on}): this copy is stale and is not backed up; back up the live copy where it runs, or lift the fence with `hcp-dr fence --release --hosted-cluster {name} -n {ns}` once this copy is the one to keep",
            ctx.hc_label(),
            hosted::FENCED
        ))
        .into());
    }
    check_store_fence(ctx).await?;
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

    // The platform's own objects, checked before anything is paused.
    let agents = match hosted::agent::check(&ctx.client, &hc.0, &hcp_ns).await {
        Ok(found) => found,
        Err(hosted::agent::InventoryError::Refused(why)) => return Err(StageError::Precondition(why).into()),
        Err(hosted::agent::InventoryError::Kube(err)) => return Err(err.into()),
    };
    let guest_volumes = if ctx.inputs.platform.skip_guest_volumes {
        None
    } else {
        match hosted::kubevirt::guest_volumes(
            &ctx.client,
            &hc.0,
            &hcp_ns,
            ctx.inputs.platform.volume_snapshot_class.as_deref(),
            ctx.inputs.platform.include_root_disks,
        )
        .await {
            Ok(found) => found,
            Err(hosted::kubevirt::GuestError::Refused(why)) => return Err(StageError::Precondition(why).into()),
            Err(hosted::kubevirt::GuestError::Kube(err)) => return Err(err.into()),
        }
    };
    if let Some(missing) = platform_gap(hc.platform(), guest_volumes.as_ref()) {
        warnings.push(format!("{} is on the {} platform: {missing}", ctx.hc_label(), hc.platform()));
    }

    // The store must answer before anything is paused.
    ctx.store
        .list(&crate::archive::Layout::cluster_prefix(&ns, &name))
        .await
        .map_err(|err| StageError::Precondition(format!("the store {} cannot be used: {err}", ctx.store.url())))?;

    let origin = match &ctx.management {
        Some(management) => Some(origin(ctx, &hc, management.clone(), &mut warnings).await?),
        None => None,
    };

    let tls = discover_tls(ctx, &hcp_ns).await?;
    let tls_source = tls.source.clone();
    ctx.etcd_tls = Some(tls);

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let pods = pods
        .list(&ListParams::default().labels(hosted::ETCD_POD_SELECTOR))
        .await
        .map_err(request(format!("listing etcd pods in {hcp_ns}")))?;
    let expected = hc.expected_etcd_members();
    if pods.items.len() > expected {
        return Err(StageError::Precondition(format!(
            "{} is {} and should have {expected} etcd member(s), but {} pod(s) match {} in {hcp_ns}; repair etcd first (hcp-dr etcd status)",
            ctx.hc_label(),
            hc.availability_policy(),
            pods.items.len(),
            hosted::ETCD_POD_SELECTOR
        ))
        .into());
    }
    let mut seen = Vec::new();
    let mut db_sizes = std::collections::BTreeMap::new();
    for pod in &pods.items {
        let (member, db_size) = look_at(ctx, &hcp_ns, pod).await;
        if let (Seen::Healthy(t) | Seen::Unhealthy { target: t, .. }, Some(size)) = (&member, db_size) {
            db_sizes.insert(t.pod.clone(), size);
        }
        seen.push(member);
    }
    // the StatefulSet's members with no pod at all
    if pods.items.len() < expected {
        for ordinal in 0..expected {
            let member = format!("etcd-{ordinal}");
            if !pods.items.iter().any(|p| p.metadata.name.as_deref() == Some(member.as_str())) {
                seen.push(Seen::Down { member, reason: "has no pod".into() });
            }
        }
    }
    let choice = etcd_members::choose(expected, seen, ctx.inputs.allow_no_quorum)
        .map_err(|reason| StageError::Precondition(format!("{}: {reason}", ctx.hc_label())))?;
    warnings.extend(choice.skipped.iter().map(SkippedMember::warning));
    if choice.no_quorum {
        warnings.push(format!(
            "etcd has no quorum: the backup is taken from {} alone (--allow-no-quorum) and may lack the last writes the lost majority acknowledged",
            choice.members.iter().map(|m| m.pod.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    let mut members = choice.members;
    members.sort_by(|a, b| a.pod.cmp(&b.pod));
    // A local store must have room for the snapshots before anything is paused.
    if let Some(dir) = ctx.store.local_dir() {
        let needed: u64 = members.iter().filter_map(|m| db_sizes.get(&m.pod)).sum();
        crate::space::ensure(
            dir,
            needed,
            &format!("{} etcd snapshot(s) of {}", members.len(), ctx.hc_label()),
            "free space there or back up to another store (--to); nothing was paused",
        )
        .map_err(|err| StageError::Precondition(err.to_string()))?;
    }
    let etcd_health = crate::archive::EtcdHealth { skipped: choice.skipped, no_quorum: choice.no_quorum };
    let etcd_image = etcd_image(ctx, &hcp_ns).await?;

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
            lineage: hc.0["metadata"]["annotations"][crate::archive::LINEAGE].as_str().map(str::to_string),
            etcd_image,
        },
        node_pools,
        members,
        etcd_health,
        tls_source,
        warnings,
        origin,
        agents,
        guest_volumes,
    })
}

/// What a backup of a cluster on `platform` does not hold (None: nothing
/// hcp-dr knows of): said as a warning, so nobody takes the backup for
/// more than it is.
pub fn platform_gap(platform: &str, guest: Option<&hosted::kubevirt::GuestData>) -> Option<String> {
    match platform {
        "None" | "Agent" => None,
        "KubeVirt" => match guest {
            None => Some("--skip-guest-volumes: the guest cluster's persistent volumes (kubevirt-csi PVCs on the management cluster) and the worker VMs' root disks are not in this backup; a restore brings back the control plane and recreates workers from the NodePool's image, without their data".into()),
            Some(guest) if guest.root_disks.is_empty() => None,
            Some(guest) => Some(format!(
                "the worker VMs' root disks ({}) are not copied: a restore re-creates the workers from the NodePool's image (--include-root-disks copies them); the guest volumes ({}) are",
                guest.root_disks.join(", "),
                guest.volumes.len()
            )),
        },
        "AWS" => Some("the IAM OIDC provider and the roles' trust policies are cloud resources outside this backup: a restore or migrate checks and rewrites the OIDC issuer's documents (from the signing key the backup holds), but only reports which provider and roles must trust the issuer".into()),
        other => Some(format!("hcp-dr does not know the platform `{other}`: the backup holds etcd, the HyperShift objects and the control-plane namespace's Cluster API and provider objects, but none of the platform's objects elsewhere (hosts, volumes, cloud identity); back those up with the platform's own tooling")),
    }
}

/// The image of the etcd StatefulSet's `etcd` container (the release's
/// etcd), recorded so a restore can seed the members' volumes with it.
async fn etcd_image(ctx: &BackupContext, hcp_ns: &str) -> Result<Option<String>, StageFailure> {
    let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), hcp_ns);
    let sts = sets
        .get_opt(hosted::ETCD_STATEFULSET)
        .await
        .map_err(request(format!("reading StatefulSet {hcp_ns}/{}", hosted::ETCD_STATEFULSET)))?;
    Ok(sts
        .map(|s| s.spec)
        .and_then(|spec| spec.template.spec)
        .and_then(|pod| pod.containers.into_iter().find(|c| c.name == "etcd"))
        .and_then(|c| c.image)
        .filter(|image| !image.is_empty()))
}

/// How long one member has to answer: a hung member (stopped,
/// partitioned) must be skipped, not wait out the client's timeouts.
const MEMBER_ANSWER: std::time::Duration = std::time::Duration::from_secs(10);

/// One member's status within [`MEMBER_ANSWER`]; `Err` says why it could
/// not be read.
pub(crate) async fn member_status(ctx: &BackupContext, target: &MemberTarget) -> Result<crate::etcd::MemberStatus, String> {
    let ask = async {
        let (member, _forward) = connect_member(ctx, target).await?;
        let mut client = member.connect().await?;
        Ok::<_, StageFailure>(member.status(&mut client).await?)
    };
    match tokio::time::timeout(MEMBER_ANSWER, ask).await {
        Err(_) => Err(format!("did not answer within {}s", MEMBER_ANSWER.as_secs())),
        Ok(Err(err)) => Err(format!("cannot be read: {}", crate::pipeline::stage::error_chain(err.as_ref()))),
        Ok(Ok(status)) => Ok(status),
    }
}

/// What one etcd pod's member looks like: healthy, readable without a
/// leader, or down (with the reason).
async fn look_at(ctx: &BackupContext, hcp_ns: &str, pod: &Pod) -> (Seen, Option<u64>) {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.clone()).unwrap_or_default();
    let pod_ip = status.and_then(|s| s.pod_ip.clone()).unwrap_or_default();
    if phase != "Running" || pod_ip.is_empty() {
        let reason = format!("its pod {hcp_ns}/{pod_name} is not running (phase `{phase}`, pod IP `{pod_ip}`)");
        return (Seen::Down { member: pod_name, reason }, None);
    }
    let mut target = MemberTarget { pod: pod_name, pod_ip, revision: 0 };
    let status = match member_status(ctx, &target).await {
        Ok(status) => status,
        Err(reason) => return (Seen::Down { member: target.pod, reason }, None),
    };
    target.revision = status.revision;
    let seen = match (status.errors.is_empty(), status.leader_id) {
        (true, 0) => Seen::Unhealthy { target, reason: "has no leader".into() },
        (true, _) => Seen::Healthy(target),
        (false, _) => Seen::Unhealthy { target, reason: format!("reports errors: {}", status.errors.join("; ")) },
    };
    (seen, u64::try_from(status.db_size).ok())
}

/// Refuse when the store's fence names another management cluster: the
/// cluster was restored elsewhere and this copy is stale (nothing is
/// written to the store). An unreadable fence refuses too.
async fn check_store_fence(ctx: &BackupContext) -> Result<(), StageFailure> {
    let (ns, name) = (&ctx.inputs.namespace, &ctx.inputs.hosted_cluster);
    let fence = match fence::read(ctx.store.as_ref(), ns, name).await {
        Ok(fence) => fence,
        Err(FenceError::Store(err)) => {
            return Err(StageError::Precondition(format!("the store {} cannot be used: {err}", ctx.store.url())).into());
        }
        Err(err @ FenceError::Unreadable { .. }) => {
            return Err(StageError::Precondition(format!("not backing up {}: {err}", ctx.hc_label())).into());
        }
    };
    let (Some(fence), Some(here)) = (fence, ctx.management.as_ref()) else {
        return Ok(());
    };
    if fence.allows(here) {
        return Ok(());
    }
    Err(StageError::Precondition(format!(
        "refusing to back up {} on {}: the store is fenced ({}/{}): {}. The copy on this management cluster is stale; nothing was written to the store and `latest` still names the live copy's backup. Fence this copy (`hcp-dr fence --hosted-cluster {name} -n {ns}` with this cluster's kubeconfig) and back up the cluster where it runs",
        ctx.hc_label(),
        here.describe(),
        ctx.store.url(),
        fence::key(ns, name),
        fence.describe()
    ))
    .into())
}

/// What the manifest records of where the backup is taken: the management
/// cluster, the hostnames the cluster publishes, and (with a zone) their
/// records and external-dns owner. A zone that cannot be read is a warning,
/// never a failed backup.
async fn origin(
    ctx: &BackupContext,
    hc: &HostedCluster,
    management_cluster: ManagementCluster,
    warnings: &mut Vec<String>,
) -> Result<Origin, StageFailure> {
    let (_, mut hostnames) = hc.published_hosts();
    match crate::kube::publishing_objects(&ctx.client, &hc.hcp_namespace()).await {
        Ok((routes, services)) => {
            hostnames.extend(routes.iter().filter_map(|r| r.pointer("/spec/host").and_then(serde_json::Value::as_str)).filter(|h| !h.is_empty()).map(str::to_string));
            hostnames.extend(services.iter().flat_map(crate::hosted::publishing::annotated_hostnames));
        }
        Err(err) => warnings.push(format!(
            "the hosts of the Routes and Services in {} are not recorded (only the HostedCluster's service hostnames are): {err}",
            hc.hcp_namespace()
        )),
    }
    let hostnames = crate::dns::normalize_names(hostnames);
    // the zone can only answer for its own names (a Route without a
    // hostname is named in the management cluster's ingress domain)
    let in_zone: Vec<String> = match &ctx.dns {
        Some(zone) => hostnames.iter().filter(|h| crate::hosted::publishing::in_domain(h, zone.domain())).cloned().collect(),
        None => Vec::new(),
    };
    let dns = match &ctx.dns {
        Some(zone) if !in_zone.is_empty() => match zone.cluster_records(&in_zone).await {
            Ok(records) => {
                let owner = crate::dns::sole_owner(&records);
                if owner.is_none() {
                    warnings.push(format!(
                        "the DNS records of {} in zone {} have no single external-dns owner: the backup does not record one, and a restore that takes the records over needs --dns-owner",
                        in_zone.join(", "),
                        zone.zone_id()
                    ));
                }
                Some(DnsOrigin {
                    zone_id: zone.zone_id().to_string(),
                    owner,
                    records: records
                        .into_iter()
                        .map(|r| OriginRecord { name: r.name, kind: r.kind, values: r.values, alias: r.alias, owner: r.owner })
                        .collect(),
                })
            }
            Err(err) => {
                warnings.push(format!("the DNS records of the cluster's hostnames were not recorded: {err}"));
                None
            }
        },
        _ => None,
    };
    Ok(Origin { management_cluster, hostnames, dns })
}

/// The backup's TLS material: `--etcd-*` files first, then the HCP namespace's.
pub async fn discover_tls(ctx: &BackupContext, hcp_ns: &str) -> Result<EtcdTlsMaterial, StageFailure> {
    etcd_access::discover_tls(&ctx.client, hcp_ns, &ctx.tls_override).await
}

/// How to reach one member under the backup's access mode; the forward (if
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
    etcd_access::connect_member(&ctx.client, &hcp_ns, ctx.inputs.etcd_access, &tls, target).await
}
