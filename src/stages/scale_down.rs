//! `scale-down`: stop every etcd writer (kube-apiserver, openshift-apiserver,
//! openshift-oauth-apiserver, and control-plane-operator when migrating) so
//! the members converge on one revision; the API is down from here until
//! `resume`. Original replica counts are journaled before scaling.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::context::{BackupContext, ScaledDeployment};
use crate::kube::{deployment_replicas, deployment_uid_and_replicas, scale_deployment, scale_deployment_if};
use super::params::ScaleDownParams;
use crate::pipeline::{Params, Stage, StageId, StageFailure, Step, UndoInput, read_params};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub scaled: Vec<ScaledDeployment>,
    /// When the first writer was scaled down (API downtime starts).
    pub started: chrono::DateTime<Utc>,
}

pub struct ScaleDown;

/// The etcd writers, the `--extra-scale-down` ones and the playbook's
/// `extra-deployments`, each once.
fn writers(ctx: &BackupContext, params: &ScaleDownParams) -> Vec<String> {
    let mut writers = ctx.writers();
    for extra in &params.extra_deployments {
        if !writers.contains(extra) {
            writers.push(extra.clone());
        }
    }
    writers
}

/// Scale the recorded Deployments back to their replicas.
pub async fn scale_back(ctx: &BackupContext, scaled: &[ScaledDeployment]) -> Result<(), StageFailure> {
    let ns = ctx.hcp_namespace();
    for d in scaled {
        if deployment_replicas(&ctx.client, &ns, &d.name).await?.is_none() {
            continue;
        }
        if !scale_deployment_if(&ctx.client, &ns, &d.name, d.replicas, d.uid.as_deref()).await? {
            tracing::warn!("Deployment {ns}/{} was replaced since it was scaled down (not the UID journaled); left alone", d.name);
        }
    }
    Ok(())
}

impl StageId for ScaleDown {
    const NAME: &'static str = "scale-down";
    type Output = Record;
}

#[async_trait]
impl Stage<BackupContext> for ScaleDown {
    fn summary(&self) -> &'static str {
        "scale the etcd writers to zero and wait until their pods are gone (API downtime starts)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, step: &Step<'_>) -> Vec<String> {
        let params: ScaleDownParams = read_params(step.params()).unwrap_or_default();
        let timeout = params.timeout().ok().flatten().unwrap_or(ctx.inputs.wait_timeout());
        writers(ctx, &params)
            .iter()
            .map(|w| format!("scale Deployment {}/{w} to 0 and wait up to {} until its pods are gone", ctx.hcp_namespace(), crate::duration::show(timeout)))
            .collect()
    }
    fn params(&self) -> Params {
        Params::of::<ScaleDownParams>()
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let params: ScaleDownParams = step.read_params()?;
        let ns = ctx.hcp_namespace();
        let mut scaled = Vec::new();
        for name in writers(ctx, &params) {
            match deployment_uid_and_replicas(&ctx.client, &ns, &name).await? {
                Some((uid, replicas)) => scaled.push(ScaledDeployment { name, replicas, uid }),
                None => ctx.warnings.push(format!("Deployment {ns}/{name} does not exist; not scaled")),
            }
        }
        // A resumed run finds writers already at 0: keep the counts journaled first.
        if let Some(previous) = step.earlier_progress::<Record>() {
            scaled = previous.scaled;
        }
        let record = Record {
            scaled: scaled.clone(),
            started: Utc::now(),
        };
        step.record(serde_json::to_value(&record)?)?;
        for d in &scaled {
            scale_deployment(&ctx.client, &ns, &d.name, 0).await?;
        }
        let timeout = params.timeout()?.unwrap_or(ctx.inputs.wait_timeout());
        for d in &scaled {
            let what = format!("the pods of Deployment {ns}/{} to terminate", d.name);
            let selector = crate::kube::deployment_selector(&ctx.client, &ns, &d.name).await?;
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
            // woken by the pods' own deletions (a watch), not a poll
            crate::kube::wait_watching(&pods, crate::kube::Watched::labelled(&selector), &what, timeout, Duration::from_millis(250), || async {
                if let Some(replicas) = deployment_replicas(&ctx.client, &ns, &d.name).await? {
                    if replicas > 0 {
                        return Err(crate::kube::KubeError::Invalid(format!(
                            "Deployment {ns}/{} was scaled back to {replicas} by something else while the cluster is paused: is the HyperShift operator honouring spec.pausedUntil?",
                            d.name
                        )));
                    }
                }
                // the selector read once above: one GET and one LIST per look
                let left = pods
                    .list(&kube::api::ListParams::default().labels(&selector))
                    .await
                    .map_err(crate::kube::request(format!("listing pods of Deployment {ns}/{}", d.name)))?;
                Ok(left.items.is_empty().then_some(()))
            })
            .await?;
        }
        Ok(record)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut BackupContext, input: UndoInput<'_>) -> Result<(), StageFailure> {
        match input.record::<Record>()? {
            Some(record) => scale_back(ctx, &record.scaled).await,
            None => Ok(()),
        }
    }
}
