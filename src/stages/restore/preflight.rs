//! `preflight` (read-only) on the destination: every kind in the backup is
//! served (CRDs installed), the HostedCluster's name is unused, none of the
//! objects to create exists (but an Agent inventory's shared objects, which
//! may be there as the backup has them: [`shared`]), the HCP namespace is absent or empty, no
//! leftover `data-etcd-*` PVC would make etcd skip the restore, the etcd
//! encryption key is in the backup, and the snapshot can be given a URL.

use std::collections::BTreeSet;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RestoreContext;
use super::verify::ensure_loaded;
use crate::hosted::{HOSTED_CLUSTER, HostedCluster};
use crate::kube::{api, get_json, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;
use crate::store::StoreUrl;

pub struct Preflight;

/// What preflight found (journaled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Findings {
    /// Leftover etcd PVCs `apply` deletes (only with --clean-leftovers).
    pub leftover_pvcs: Vec<String>,
    pub hcp_namespace_exists: bool,
    pub hc_namespace_exists: bool,
    pub objects: usize,
}

/// `apiVersion` split into group and version.
pub fn gvk_of(obj: &Value) -> GroupVersionKind {
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap_or(""))
}

/// `Kind ns/name` of an object, for messages.
pub fn describe(obj: &Value) -> String {
    format!(
        "{} {}/{}",
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The namespaces of `objects` other than the HostedCluster's and the
/// control plane's (an Agent inventory's agentNamespace), sorted.
pub fn other_namespaces(objects: &[Value], ns: &str, hcp_ns: &str) -> Vec<String> {
    let found: BTreeSet<String> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .filter(|n| *n != ns && *n != hcp_ns && !n.is_empty())
        .map(str::to_string)
        .collect();
    found.into_iter().collect()
}

/// Whether `obj` is an Agent inventory's shared object: an InfraEnv, an
/// NMStateConfig or a Secret of the agent namespace, which a management
/// cluster's other hosts may come from too. One already on the destination
/// as the backup has it is kept, not refused; the hosts themselves (Agents,
/// BareMetalHosts) never are (see `agent::clashes`).
pub fn shared(obj: &Value, ns: &str, hcp_ns: &str) -> bool {
    let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let inventory_kind = crate::hosted::agent::is_inventory(obj) && matches!(obj["kind"].as_str(), Some("InfraEnv" | "NMStateConfig"));
    let outside_secret = obj["kind"] == "Secret" && obj["apiVersion"] == "v1" && !namespace.is_empty() && namespace != ns && namespace != hcp_ns;
    inventory_kind || outside_secret
}

/// The backup's HostedCluster object.
pub fn hosted_cluster(objects: &[Value]) -> Result<HostedCluster, StageError> {
    let mut found = objects.iter().filter(|o| {
        o["kind"] == "HostedCluster" && gvk_of(o).group == HOSTED_CLUSTER.group
    });
    match (found.next(), found.next()) {
        (Some(hc), None) => Ok(HostedCluster(hc.clone())),
        (None, _) => Err(StageError::Precondition("the backup's objects hold no HostedCluster".into())),
        (Some(_), Some(_)) => Err(StageError::Precondition("the backup's objects hold more than one HostedCluster".into())),
    }
}

async fn check(ctx: &mut RestoreContext, manifest: Option<&crate::archive::Manifest>) -> Result<Findings, StageFailure> {
    let guest = manifest.and_then(|m| m.guest_volumes.as_ref());
    ensure_loaded(ctx).await?;
    let objects = ctx.objects.clone().unwrap_or_default();
    let (ns, hcp_ns) = (ctx.inputs.namespace.clone(), ctx.inputs.hcp_namespace());
    let mut problems: Vec<String> = Vec::new();

    // The snapshot must be given a URL etcd can download.
    if matches!(StoreUrl::parse(&ctx.inputs.store)?, StoreUrl::Local(_)) && ctx.staging.is_none() {
        problems.push(format!(
            "the backup is in a local directory ({}), which etcd cannot download from: pass --stage-snapshot-to s3://BUCKET/PREFIX (a temporary copy of the snapshot is uploaded there, presigned for --presign-ttl and deleted once etcd has restored it), or restore from a copy of the backup in S3",
            ctx.store.url()
        ));
    }

    // Every kind is served.
    let kinds: BTreeSet<(String, String, String)> = objects
        .iter()
        .map(|o| {
            let g = gvk_of(o);
            (g.group, g.version, g.kind)
        })
        .collect();
    let discovery = crate::kube::discover(&ctx.client, |g| kinds.iter().any(|k| k.0 == g), "discovering the destination's API groups").await?;
    for (group, version, kind) in &kinds {
        if discovery.resolve_gvk(&GroupVersionKind::gvk(group, version, kind)).is_none() {
            problems.push(format!(
                "the destination does not serve {kind} ({}{version}): install the HyperShift operator and its CRDs (and the platform's CAPI provider) first",
                if group.is_empty() { String::new() } else { format!("{group}/") }
            ));
        }
    }

    // The HostedCluster's name is unused and none of the objects exists.
    let hc = hosted_cluster(&objects)?;
    if let Some(existing) = get_json(&api(&ctx.client, &HOSTED_CLUSTER, &ns), &ctx.inputs.hosted_cluster, &ctx.inputs.hc_label()).await? {
        problems.push(format!(
            "{} already exists on the destination (uid {}): restore never overwrites a cluster; destroy it first, or restore onto another management cluster",
            ctx.inputs.hc_label(),
            existing["metadata"]["uid"].as_str().unwrap_or("?")
        ));
    }
    if problems.is_empty() {
        for obj in &objects {
            let gvk = gvk_of(obj);
            let Some((resource, _)) = discovery.resolve_gvk(&gvk) else { continue };
            let namespace = obj["metadata"]["namespace"].as_str().unwrap_or(&ns);
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            let Some(existing) = get_json(&crate::kube::api_for(&ctx.client, &resource, namespace), name, &describe(obj)).await? else { continue };
            if !shared(obj, &ns, &hcp_ns) {
                problems.push(format!("{} already exists on the destination", describe(obj)));
                continue;
            }
            match super::apply::differs(obj, &existing) {
                None => tracing::info!(object = %describe(obj), "already on the destination as the backup has it: kept (other hosts there come from it)"),
                Some(path) => problems.push(format!(
                    "{} already exists on the destination and differs from the backup's at {path}: the destination's other hosts may come from it, so the restore neither replaces nor deletes it. Make the two agree (or restore onto another management cluster)",
                    describe(obj)
                )),
            }
        }
    }

    // Each host of an Agent inventory is managed by one cluster only.
    if objects.iter().any(crate::hosted::agent::is_inventory) {
        for clash in crate::hosted::agent::clashes(&ctx.client, &objects).await? {
            problems.push(format!(
                "{clash}: one host cannot be managed from two places. Remove it from the destination first (annotate the BareMetalHost baremetalhost.metal3.io/detached before deleting it, or metal3 deprovisions the host), or restore onto another management cluster"
            ));
        }
    }

    // KubeVirt: each guest volume's StorageClass is here (a volume is
    // re-created in it and filled by a data mover before the NodePools).
    problems.extend(super::volumes::missing_classes(&ctx.client, guest).await?);

    // The HCP namespace is absent or empty; no leftover etcd volumes.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    let hcp_namespace = namespaces.get_opt(&hcp_ns).await.map_err(request(format!("reading Namespace {hcp_ns}")))?;
    let hc_namespace = namespaces.get_opt(&ns).await.map_err(request(format!("reading Namespace {ns}")))?;
    for (name, namespace) in [(&ns, &hc_namespace), (&hcp_ns, &hcp_namespace)] {
        problems.extend(crate::kube::terminating_namespace(name, namespace.as_ref()));
    }
    // the other namespaces the backup's objects live in (an Agent inventory's)
    for name in other_namespaces(&objects, &ns, &hcp_ns) {
        let namespace = namespaces.get_opt(&name).await.map_err(request(format!("reading Namespace {name}")))?;
        problems.extend(crate::kube::terminating_namespace(&name, namespace.as_ref()));
    }
    let hcp_namespace_exists = hcp_namespace.is_some();
    let hc_namespace_exists = hc_namespace.is_some();
    let mut leftover_pvcs = Vec::new();
    if hcp_namespace_exists {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &hcp_ns);
        for pvc in pvcs.list(&ListParams::default()).await.map_err(request(format!("listing PVCs in {hcp_ns}")))?.items {
            let name = pvc.metadata.name.unwrap_or_default();
            if name.starts_with("data-etcd-") {
                leftover_pvcs.push(name);
            } else {
                problems.push(format!("the HCP namespace {hcp_ns} is not empty: it holds PVC {name}; delete the namespace's contents first"));
            }
        }
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &hcp_ns);
        let pods = pods.list(&ListParams::default()).await.map_err(request(format!("listing Pods in {hcp_ns}")))?.items;
        if let Some(pod) = pods.first() {
            problems.push(format!(
                "the HCP namespace {hcp_ns} is not empty: {} pod(s) run there (e.g. {}); a control plane from an earlier attempt? delete the namespace first",
                pods.len(),
                pod.metadata.name.as_deref().unwrap_or("?")
            ));
        }
    }
    if !leftover_pvcs.is_empty() && !ctx.inputs.clean_leftovers {
        // a drill has no --clean-leftovers: its leftovers are a kept drill's
        let fix = if ctx.inputs.backup_of.is_some() {
            "a kept or killed drill? remove it with `hcp-dr drill --abort JOURNAL` (the journal path its report printed), or delete them by hand".to_string()
        } else {
            "or pass --clean-leftovers".to_string()
        };
        problems.push(format!(
            "leftover etcd volumes in {hcp_ns}: {}. etcd would start from their old data and silently skip the restore; delete them (kubectl -n {hcp_ns} delete pvc {}) {fix}",
            leftover_pvcs.join(", "),
            leftover_pvcs.join(" ")
        ));
    }

    // HighlyAvailable: hcp-dr seeds the members' volumes (a class to make
    // them in, an image to fill them with), or the URL path is allowed.
    if let Some(manifest) = manifest {
        let (seeding, warnings) = super::etcd_seed::preflight_problems(ctx, manifest, &hc).await?;
        problems.extend(seeding);
        for warning in warnings {
            tracing::warn!("{warning}");
            ctx.warnings.push(warning);
        }
    }

    // Secrets in etcd are useless without the exact encryption key.
    if let Some(key) = hc.encryption_key_secret() {
        let included = objects.iter().any(|o| {
            o["kind"] == "Secret" && o["metadata"]["name"] == key && o["metadata"]["namespace"].as_str().unwrap_or(&ns) == ns
        });
        if !included {
            problems.push(format!(
                "the HostedCluster encrypts secrets with the key in Secret {ns}/{key}, which is not in the backup: without that exact key the restored etcd's secrets cannot be read; take a new backup (hcp-dr exports it) or add the secret to the destination by hand first"
            ));
        }
    }

    if !problems.is_empty() {
        return Err(StageError::Precondition(format!(
            "the destination is not ready for the restore; nothing was changed:\n  - {}",
            problems.join("\n  - ")
        ))
        .into());
    }
    Ok(Findings {
        leftover_pvcs,
        hcp_namespace_exists,
        hc_namespace_exists,
        objects: objects.len(),
    })
}

impl StageId for Preflight {
    const NAME: &'static str = "preflight";
    type Output = Findings;
}

#[async_trait]
impl Stage<RestoreContext> for Preflight {
    fn summary(&self) -> &'static str {
        "check the destination: CRDs served, names unused, HCP namespace empty, no leftover etcd PVCs, encryption key in the backup"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, ctx: &RestoreContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "check the destination for {}: every kind served, names unused, {} empty, no leftover etcd PVCs, the encryption key in the backup",
            ctx.inputs.hc_label(),
            ctx.inputs.hcp_namespace()
        )]
    }
    async fn run(&self, ctx: &mut RestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let manifest = super::verify::manifest(ctx, step).await?;
        let findings = check(ctx, Some(&manifest)).await?;
        ctx.findings = Some(findings.clone());
        Ok(findings)
    }
    fn restore(&self, ctx: &mut RestoreContext, output: Self::Output) -> Result<(), StageFailure> {
        ctx.findings = Some(output);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_an_inventorys_infraenvs_nmstateconfigs_and_secrets_are_shared() {
        let obj = |api_version: &str, kind: &str, ns: &str| json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x", "namespace": ns}});
        let shared = |o: &Value| shared(o, "clusters", "clusters-demo");
        assert!(shared(&obj("agent-install.openshift.io/v1beta1", "InfraEnv", "hosts")));
        assert!(shared(&obj("agent-install.openshift.io/v1beta1", "NMStateConfig", "hosts")));
        assert!(shared(&obj("v1", "Secret", "hosts")));
        // the hosts themselves, and anything of the cluster's own namespaces, never
        assert!(!shared(&obj("agent-install.openshift.io/v1beta1", "Agent", "hosts")));
        assert!(!shared(&obj("metal3.io/v1alpha1", "BareMetalHost", "hosts")));
        assert!(!shared(&obj("v1", "Secret", "clusters")));
        assert!(!shared(&obj("v1", "Secret", "clusters-demo")));
        assert!(!shared(&obj("v1", "ConfigMap", "hosts")));
    }
}
