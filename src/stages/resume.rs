//! `resume`: as soon as the snapshots' content is fixed, scale the writers back and
//! lift the pause (to exactly what it was). The API downtime window, from
//! the first writer scaled down until the writers are available again, is
//! measured here.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use super::context::BackupContext;
use super::pause::{self, Pause};
use super::scale_down::{self, ScaleDown};
use crate::kube::wait_for_object;
use crate::pipeline::{Stage, StageId, StageFailure, Step};

pub struct Resume;

/// What resume reports: the API downtime and what did not come back in time.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Resumed {
    pub api_downtime_seconds: Option<f64>,
    pub warnings: Vec<String>,
}

impl StageId for Resume {
    const NAME: &'static str = "resume";
    type Output = Resumed;
}

#[async_trait]
impl Stage<BackupContext> for Resume {
    fn summary(&self) -> &'static str {
        "scale the writers back, wait until they are available, lift the pause; report the API downtime"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, _step: &Step<'_>) -> Vec<String> {
        vec![
            format!("scale {} back to their replicas", ctx.writers().join(", ")),
            "put spec.pausedUntil back to its previous value".into(),
        ]
    }
    async fn run(&self, ctx: &mut BackupContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        super::etcd_snapshot::ensure_started(ctx, step).await?;
        let scaled = step.needs::<ScaleDown>()?;
        let paused = step.needs::<Pause>()?;
        let ns = ctx.hcp_namespace();
        scale_down::scale_back(ctx, &scaled.scaled).await?;
        let mut warnings = Vec::new();
        for d in scaled.scaled.iter().filter(|d| d.replicas > 0) {
            let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
            let what = format!("Deployment {ns}/{} to be available again", d.name);
            // judged from the watched Deployment itself: no GET per change
            // counted only once the controller has seen the scale-up: a
            // status about the scaled-down spec (observedGeneration below
            // generation) says nothing yet
            let waited = wait_for_object(&api, &d.name, &what, ctx.inputs.wait_timeout(), Duration::from_millis(250), |dep: Option<&Deployment>| {
                let dep = dep?;
                let status = dep.status.as_ref()?;
                let seen = status.observed_generation.unwrap_or(0) >= dep.metadata.generation.unwrap_or(0);
                (seen && status.available_replicas.unwrap_or(0) >= d.replicas).then_some(())
            })
            .await;
            if let Err(err) = waited {
                // Scaled back already: the cluster is resumed; say so rather than undo.
                warnings.push(err.to_string());
            }
        }
        let downtime = Some((Utc::now() - scaled.started).num_milliseconds() as f64 / 1000.0);
        pause::put_back(ctx, &paused).await?;
        ctx.warnings.extend(warnings.iter().cloned());
        Ok(Resumed { api_downtime_seconds: downtime, warnings })
    }
}
