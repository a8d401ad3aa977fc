//! `ovn-restart`: after a move the OVN pods in the hosted cluster hold
//! connections to the old control plane; deleting them lets their
//! DaemonSet recreate them against the new one. Waits until as many are
//! running again.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};

use super::MigrateContext;
use crate::hosted::{HOSTED_CLUSTER, HostedCluster};
use crate::kube::{api, get_json, request, wait_for};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;
use crate::stages::restore::wait::hosted_client;

pub struct OvnRestart;

/// The namespace and selector of the pods restarted.
pub const OVN_NAMESPACE: &str = "openshift-ovn-kubernetes";
pub const OVN_SELECTOR: &str = "app=ovnkube-node";

fn running(pods: &[Pod]) -> usize {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

/// The OVN pods restarted in the hosted cluster.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Restarted {
    pub restarted: Vec<String>,
}

impl StageId for OvnRestart {
    const NAME: &'static str = "ovn-restart";
    type Output = Restarted;
}

#[async_trait]
impl Stage<MigrateContext> for OvnRestart {
    fn summary(&self) -> &'static str {
        "restart the OVN pods in the hosted cluster so they reconnect to the moved control plane"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, _ctx: &MigrateContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!("hosted cluster: delete the pods {OVN_SELECTOR} in {OVN_NAMESPACE} and wait until they run again")]
    }
    async fn run(&self, ctx: &mut MigrateContext, _step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let (ns, name) = (ctx.inputs.destination.namespace.clone(), ctx.inputs.destination.hosted_cluster.clone());
        let label = format!("HostedCluster {ns}/{name}");
        let hc = get_json(&api(&ctx.destination.client, &HOSTED_CLUSTER, &ns), &name, &label)
            .await?
            .map(HostedCluster)
            .ok_or_else(|| StageError::Precondition(format!("{label} not found on the destination")))?;
        let hosted = hosted_client(&ctx.destination.client, &hc)
            .await?
            .ok_or_else(|| StageError::Precondition(format!("{label} has no admin kubeconfig yet")))?;
        let pods: Api<Pod> = Api::namespaced(hosted, OVN_NAMESPACE);
        let params = ListParams::default().labels(OVN_SELECTOR);
        let before = pods.list(&params).await.map_err(request(format!("listing OVN pods in the hosted cluster ({label})")))?.items;
        let names: Vec<String> = before.iter().filter_map(|p| p.metadata.name.clone()).collect();
        for pod in &names {
            match pods.delete(pod, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(err) if crate::kube::is_not_found(&err) => {}
                Err(err) => return Err(request(format!("deleting OVN pod {pod}"))(err).into()),
            }
        }
        let want = names.len();
        wait_for(&format!("{want} OVN pod(s) running again in the hosted cluster"), Duration::from_secs(300), Duration::from_secs(1), || async {
            let now = pods.list(&params).await.map_err(request("listing OVN pods"))?.items;
            let fresh: Vec<Pod> = now.into_iter().filter(|p| !p.metadata.name.as_ref().is_some_and(|n| names.contains(n))).collect();
            Ok((running(&fresh) >= want).then_some(()))
        })
        .await?;
        Ok(Restarted { restarted: names })
    }
}
