//! `assess`: read what the restore works on, before anything changes. The
//! HostedCluster (Managed etcd) and its NodePools; the etcd StatefulSet's
//! members and peer URLs (`ETCD_INITIAL_CLUSTER`), cluster token, data
//! directory, image, data volume and claim template; and its PVC retention:
//! with `whenScaled: Delete`, scaling etcd to zero would delete member 0's
//! volume, so the restore is refused until it is `Retain`. The members are
//! read too: the revision they reached (for the bump) and who answers.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::EtcdRestoreContext;
use crate::hosted::{self, NODE_POOL};
use crate::kube::{KubeError, api, list_json, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::etcd_ops::health;
use crate::stages::StageError;

pub struct Assess;

/// One member as the StatefulSet defines it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedMember {
    /// `etcd-N`, its pod's name and its `--name`.
    pub name: String,
    /// Its peer URL in `ETCD_INITIAL_CLUSTER` (`--initial-advertise-peer-urls`).
    pub peer_url: String,
    /// Its data volume claim, and that claim's uid when it exists.
    pub pvc: String,
    pub pvc_uid: Option<String>,
}

/// What the restore works on (journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestorePlan {
    pub node_pools: Vec<String>,
    pub replicas: i32,
    pub members: Vec<PlannedMember>,
    /// `ETCD_INITIAL_CLUSTER` as the StatefulSet sets it.
    pub initial_cluster: String,
    pub initial_cluster_token: String,
    /// `ETCD_DATA_DIR` (the member's data, `member/` inside it).
    pub data_dir: String,
    /// The etcd container's image (the restore pods run it).
    pub image: String,
    /// The data volume's mount path in the etcd container, and its claim template.
    pub mount_path: String,
    pub claim_template: Value,
    /// The StatefulSet's selector labels (a claim it creates carries them).
    pub selector_labels: Value,
    /// Scheduling of the etcd pods, copied to the restore pods.
    pub scheduling: Value,
    /// The highest revision a member reported now, and whether every member answered.
    pub revision_seen: Option<i64>,
    pub all_answered: bool,
}

impl RestorePlan {
    pub fn member(&self, name: &str) -> Option<&PlannedMember> {
        self.members.iter().find(|m| m.name == name)
    }
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
}

/// `name=url,name=url` into pairs, with the StatefulSet's `$(NAMESPACE)`
/// (and `$(HOSTNAME)`-free) values as they are.
pub fn parse_initial_cluster(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(|pair| {
            pair.split_once('=')
                .filter(|(n, u)| !n.is_empty() && !u.is_empty())
                .map(|(n, u)| (n.trim().to_string(), u.trim().to_string()))
                .ok_or_else(|| format!("`{pair}` is not name=peer-url"))
        })
        .collect()
}

/// Everything `assess` reads off the StatefulSet (pure, for tests).
pub fn read_statefulset(sts: &Value, hcp_ns: &str) -> Result<RestorePlan, String> {
    let spec = &sts["spec"];
    if spec["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete" {
        return Err(format!(
            "StatefulSet {hcp_ns}/etcd has persistentVolumeClaimRetentionPolicy.whenScaled: Delete, so scaling etcd to zero would delete member 0's volume: set it to Retain first (kubectl -n {hcp_ns} patch statefulset etcd --type merge -p '{{\"spec\":{{\"persistentVolumeClaimRetentionPolicy\":{{\"whenScaled\":\"Retain\"}}}}}}'; HyperShift's default is Retain)"
        ));
    }
    let replicas = spec["replicas"].as_i64().unwrap_or(1) as i32;
    let template = &spec["template"]["spec"];
    let container = template["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "etcd"))
        .ok_or_else(|| format!("StatefulSet {hcp_ns}/etcd has no container named etcd"))?;
    let image = container["image"].as_str().unwrap_or_default().to_string();
    let initial_cluster = env_value(container, "ETCD_INITIAL_CLUSTER")
        .ok_or_else(|| format!("the etcd container of StatefulSet {hcp_ns}/etcd sets no ETCD_INITIAL_CLUSTER"))?
        .replace("$(NAMESPACE)", hcp_ns);
    let pairs = parse_initial_cluster(&initial_cluster).map_err(|e| format!("ETCD_INITIAL_CLUSTER of StatefulSet {hcp_ns}/etcd: {e}"))?;
    let names: Vec<String> = pairs.iter().map(|(n, _)| n.clone()).collect();
    let want: Vec<String> = (0..replicas).map(|i| format!("etcd-{i}")).collect();
    if names != want {
        return Err(format!(
            "StatefulSet {hcp_ns}/etcd has {replicas} replica(s) but ETCD_INITIAL_CLUSTER names {}: the StatefulSet is being changed; wait until it settles",
            names.join(", ")
        ));
    }
    let claims = spec["volumeClaimTemplates"].as_array().cloned().unwrap_or_default();
    let mounts = container["volumeMounts"].as_array().cloned().unwrap_or_default();
    let data_dir = env_value(container, "ETCD_DATA_DIR").unwrap_or("/var/lib/data").to_string();
    // The claim template whose mount holds the data directory.
    let (claim_template, mount_path) = claims
        .iter()
        .find_map(|c| {
            let name = c["metadata"]["name"].as_str()?;
            let mount = mounts.iter().find(|m| m["name"] == name)?;
            let path = mount["mountPath"].as_str()?;
            let inside = data_dir == path || data_dir.starts_with(&format!("{}/", path.trim_end_matches('/')));
            inside.then(|| (c.clone(), path.to_string()))
        })
        .ok_or_else(|| format!("no volume claim template of StatefulSet {hcp_ns}/etcd is mounted at its data directory {data_dir}"))?;
    let claim_name = claim_template["metadata"]["name"].as_str().unwrap_or("data").to_string();
    let mut scheduling = serde_json::Map::new();
    for field in ["nodeSelector", "tolerations", "affinity", "priorityClassName", "securityContext", "imagePullSecrets"] {
        if !template[field].is_null() {
            scheduling.insert(field.to_string(), template[field].clone());
        }
    }
    Ok(RestorePlan {
        node_pools: Vec::new(),
        replicas,
        members: pairs
            .into_iter()
            .map(|(name, peer_url)| PlannedMember {
                pvc: format!("{claim_name}-{name}"),
                name,
                peer_url,
                pvc_uid: None,
            })
            .collect(),
        initial_cluster,
        initial_cluster_token: env_value(container, "ETCD_INITIAL_CLUSTER_TOKEN").unwrap_or("etcd-cluster").to_string(),
        data_dir,
        image,
        mount_path,
        claim_template,
        selector_labels: spec["selector"]["matchLabels"].clone(),
        scheduling: Value::Object(scheduling),
        revision_seen: None,
        all_answered: false,
    })
}

/// Read every member now (the HostedCluster and TLS looked up once).
pub async fn probe(ctx: &mut EtcdRestoreContext) -> Result<health::ClusterHealth, StageFailure> {
    let client = ctx.cluster.client.clone();
    let (ns, name) = (ctx.cluster.inputs.namespace.clone(), ctx.cluster.inputs.hosted_cluster.clone());
    let hc = health::hosted_cluster(&client, &ns, &name).await?;
    let tls = match &ctx.cluster.etcd_tls {
        Some(tls) => tls.clone(),
        None => health::tls(&client, &hc.hcp_namespace(), &ctx.cluster.tls_override).await?,
    };
    let found = health::probe(&health::EtcdCluster {
        client: &client,
        hosted_cluster: &hc,
        access: ctx.cluster.inputs.etcd_access,
        tls: &tls,
    })
    .await?;
    ctx.cluster.etcd_tls = Some(tls);
    Ok(found)
}

/// The members' revisions now (None for those that do not answer).
pub async fn revisions(ctx: &mut EtcdRestoreContext) -> Result<BTreeMap<String, Option<i64>>, StageFailure> {
    Ok(probe(ctx).await?.members.into_iter().map(|m| (m.name, m.revision)).collect())
}

impl StageId for Assess {
    const NAME: &'static str = "assess";
    type Output = RestorePlan;
}

#[async_trait]
impl Stage<EtcdRestoreContext> for Assess {
    fn summary(&self) -> &'static str {
        "read the etcd StatefulSet (members, peer URLs, image, volumes; refuse whenScaled: Delete) and the revision the members reached"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, _ctx: &EtcdRestoreContext, _step: &Step<'_>) -> Vec<String> {
        Vec::new()
    }
    async fn run(&self, ctx: &mut EtcdRestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let client = ctx.cluster.client.clone();
        let (ns, name) = (ctx.cluster.inputs.namespace.clone(), ctx.cluster.inputs.hosted_cluster.clone());
        let hc = health::hosted_cluster(&client, &ns, &name).await?;
        hc.refuse_if_fenced("restore its etcd").map_err(StageError::Precondition)?;
        let hcp_ns = hc.hcp_namespace();
        let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &hcp_ns);
        let sts = sts
            .get_opt(hosted::ETCD_STATEFULSET)
            .await
            .map_err(request(format!("reading StatefulSet {hcp_ns}/etcd")))?
            .ok_or_else(|| KubeError::NotFound {
                what: format!("StatefulSet {hcp_ns}/etcd"),
                hint: format!(": is {} fully created? (kubectl -n {hcp_ns} get statefulsets)", ctx.hc_label()),
            })?;
        let mut plan = read_statefulset(&serde_json::to_value(&sts)?, &hcp_ns).map_err(StageError::Precondition)?;
        if plan.replicas < 1 {
            return Err(StageError::Precondition(format!(
                "StatefulSet {hcp_ns}/etcd is scaled to 0: an earlier run may have stopped part-way (resume it with hcp-dr etcd restore --resume JOURNAL), or scale it back first"
            ))
            .into());
        }
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &hcp_ns);
        for member in &mut plan.members {
            member.pvc_uid = pvcs
                .get_opt(&member.pvc)
                .await
                .map_err(request(format!("reading PersistentVolumeClaim {hcp_ns}/{}", member.pvc)))?
                .and_then(|c| c.metadata.uid);
        }
        if plan.members[0].pvc_uid.is_none() {
            return Err(StageError::Precondition(format!(
                "PersistentVolumeClaim {hcp_ns}/{} of member {} does not exist: the StatefulSet has not created its volume; wait until etcd-0 has started once",
                plan.members[0].pvc, plan.members[0].name
            ))
            .into());
        }
        if let Some(image) = &ctx.inputs.image {
            plan.image = image.clone();
        }
        if plan.image.is_empty() {
            return Err(StageError::Precondition(format!("the etcd container of StatefulSet {hcp_ns}/etcd has no image; pass --image")).into());
        }
        let pools = list_json(&api(&client, &NODE_POOL, &ns), &ListParams::default(), "NodePools").await?;
        plan.node_pools = pools
            .iter()
            .filter(|np| np["spec"]["clusterName"].as_str() == Some(name.as_str()))
            .filter_map(|np| np["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        plan.node_pools.sort();
        let seen = revisions(ctx).await?;
        plan.all_answered = plan.members.iter().all(|m| seen.get(&m.name).is_some_and(Option::is_some));
        plan.revision_seen = seen.values().flatten().max().copied();
        if let Some(snapshot) = step.output_of::<super::fetch::FetchSnapshot>()?
            && let Some(seen) = plan.revision_seen
            && snapshot.revision > seen
        {
            ctx.warn(format!(
                "the snapshot's revision {} is above the {seen} the members report: is it of this cluster?",
                snapshot.revision
            ));
        }
        ctx.cluster.node_pools = plan.node_pools.clone();
        Ok(plan)
    }
    fn restore(&self, ctx: &mut EtcdRestoreContext, plan: RestorePlan) -> Result<(), StageFailure> {
        ctx.cluster.node_pools = plan.node_pools;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sts(when_scaled: &str) -> Value {
        json!({"spec": {
            "replicas": 3,
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": when_scaled},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Gi"}}}}],
            "template": {"spec": {
                "nodeSelector": {"hypershift.openshift.io/control-plane": "true"},
                "containers": [{"name": "etcd", "image": "quay.io/etcd:v3.5",
                    "env": [
                        {"name": "ETCD_DATA_DIR", "value": "/var/lib/data"},
                        {"name": "ETCD_INITIAL_CLUSTER", "value": "etcd-0=https://etcd-0.etcd-discovery.$(NAMESPACE).svc:2380,etcd-1=https://etcd-1.etcd-discovery.$(NAMESPACE).svc:2380,etcd-2=https://etcd-2.etcd-discovery.$(NAMESPACE).svc:2380"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib"}, {"name": "tmp", "mountPath": "/tmp"}]}]}}}})
    }

    #[test]
    fn the_statefulset_gives_members_urls_and_the_data_volume() {
        let plan = read_statefulset(&sts("Retain"), "clusters-demo").unwrap();
        assert_eq!(plan.replicas, 3);
        let names: Vec<_> = plan.members.iter().map(|m| (m.name.as_str(), m.pvc.as_str())).collect();
        assert_eq!(names, vec![("etcd-0", "data-etcd-0"), ("etcd-1", "data-etcd-1"), ("etcd-2", "data-etcd-2")]);
        assert_eq!(plan.members[1].peer_url, "https://etcd-1.etcd-discovery.clusters-demo.svc:2380");
        assert!(plan.initial_cluster.starts_with("etcd-0=https://etcd-0.etcd-discovery.clusters-demo.svc:2380,"));
        assert_eq!(plan.initial_cluster_token, "etcd-cluster");
        assert_eq!((plan.data_dir.as_str(), plan.mount_path.as_str()), ("/var/lib/data", "/var/lib"));
        assert_eq!(plan.image, "quay.io/etcd:v3.5");
        assert_eq!(plan.scheduling["nodeSelector"]["hypershift.openshift.io/control-plane"], "true");
    }

    #[test]
    fn when_scaled_delete_is_refused_with_the_fix() {
        let err = read_statefulset(&sts("Delete"), "clusters-demo").unwrap_err();
        assert!(err.contains("whenScaled: Delete") && err.contains("Retain"), "{err}");
    }

    #[test]
    fn members_must_match_the_replicas() {
        let mut s = sts("Retain");
        s["spec"]["replicas"] = json!(2);
        let err = read_statefulset(&s, "clusters-demo").unwrap_err();
        assert!(err.contains("2 replica(s)"), "{err}");
    }

    #[test]
    fn initial_cluster_pairs_are_checked() {
        assert!(parse_initial_cluster("etcd-0=https://a:2380,bogus").is_err());
        assert_eq!(parse_initial_cluster("a=u").unwrap(), vec![("a".to_string(), "u".to_string())]);
    }
}
