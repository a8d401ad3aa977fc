//! `replace`: delete the member's volume claim and its pod together, so the
//! StatefulSet recreates both and the member starts empty and rejoins (its
//! init container removes the old member and adds the new one). The claim
//! goes first: while the pod exists the claim is only marked (PVC
//! protection), so the pod can never be recreated on the old volume.
//!
//! Just before, the other members are checked once more: they must keep a
//! quorum, and the pod and claim must be the ones `assess` saw. Both are
//! deleted by uid (a precondition), and the uids are journaled first, so a
//! rerun after a crash deletes only what is left of them. Not undoable:
//! the old data is gone.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Preconditions};
use serde::{Deserialize, Serialize};

use super::RecoverContext;
use super::assess::{Assess, quorum_without};
use crate::kube::{is_conflict, is_not_found, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;

pub struct Replace;

/// What `replace` deletes (journaled before deleting, and as its output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replaced {
    pub member: String,
    pub pod_uid: String,
    pub pvc: String,
    pub pvc_uid: String,
    /// When the deletion was first asked for: the rejoin is timed from here.
    pub deleted_at: DateTime<Utc>,
}

/// Delete `name` if it still has `uid`. `false` when it was already gone or
/// replaced by an object with another uid.
pub(crate) async fn delete_exact<K>(
    api: &Api<K>,
    what: &str,
    name: &str,
    uid: &str,
) -> Result<bool, StageFailure>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(err) if is_not_found(&err) || is_conflict(&err) => Ok(false),
        Err(err) => Err(request(format!("deleting {what} {name} (uid {uid})"))(err).into()),
    }
}

/// Delete a member's volume claim, then its pod, each by uid (claim first:
/// while the pod exists the claim is only marked, so the pod is never
/// recreated on it). Whether each was deleted (`false`: already gone).
pub(crate) async fn delete_claim_and_pod(ctx: &RecoverContext, member: &str, pvc: &str, pod_uid: &str, pvc_uid: &str) -> Result<(bool, bool), StageFailure> {
    let hcp_ns = ctx.inputs.hcp_namespace();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let claim_deleted = delete_exact(&pvcs, "PersistentVolumeClaim", pvc, pvc_uid).await?;
    let pod_deleted = delete_exact(&pods, "pod", member, pod_uid).await?;
    Ok((claim_deleted, pod_deleted))
}

async fn uid_of<K>(api: &Api<K>, what: &str, name: &str) -> Result<Option<String>, StageFailure>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .get_opt(name)
        .await
        .map_err(request(format!("reading {what} {name}")))?
        .and_then(|o| o.meta().uid.clone()))
}

async fn run(ctx: &mut RecoverContext, step: &mut Step<'_>) -> Result<Replaced, StageFailure> {
    let assessment = step.needs::<Assess>()?;
    let hcp_ns = ctx.inputs.hcp_namespace();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &hcp_ns);
    let earlier: Option<Replaced> = step.earlier_progress();

    // The last look before the point of no return.
    let health = ctx.probe().await?;
    quorum_without(&health, &assessment.member)?;
    if earlier.is_none() {
        let pod_uid = uid_of(&pods, "pod", &assessment.member).await?;
        let pvc_uid = uid_of(&pvcs, "PersistentVolumeClaim", &assessment.pvc).await?;
        if pod_uid.as_deref() != Some(assessment.pod_uid.as_str())
            || pvc_uid.as_deref() != Some(assessment.pvc_uid.as_str())
        {
            return Err(StageError::Precondition(format!(
                "etcd member {} changed since it was assessed (pod uid {} -> {}, claim uid {} -> {}): something else is acting on it; check kubectl -n {hcp_ns} get pods,pvc and run hcp-dr etcd recover again",
                assessment.member,
                assessment.pod_uid,
                pod_uid.as_deref().unwrap_or("(gone)"),
                assessment.pvc_uid,
                pvc_uid.as_deref().unwrap_or("(gone)"),
            ))
            .into());
        }
    }
    let record = earlier.unwrap_or_else(|| Replaced {
        member: assessment.member.clone(),
        pod_uid: assessment.pod_uid.clone(),
        pvc: assessment.pvc.clone(),
        pvc_uid: assessment.pvc_uid.clone(),
        deleted_at: Utc::now(),
    });
    step.record(serde_json::to_value(&record)?)?;
    let (claim_deleted, pod_deleted) =
        delete_claim_and_pod(ctx, &record.member, &record.pvc, &record.pod_uid, &record.pvc_uid).await?;
    tracing::info!(
        namespace = %hcp_ns,
        member = %record.member,
        claim_deleted,
        pod_deleted,
        "deleted the member's volume claim and pod (false: already gone)"
    );
    Ok(record)
}

impl StageId for Replace {
    const NAME: &'static str = "replace";
    type Output = Replaced;
}

#[async_trait]
impl Stage<RecoverContext> for Replace {
    fn summary(&self) -> &'static str {
        "delete the member's volume claim and pod together (by uid, after checking the others keep quorum); not undoable"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RecoverContext, step: &Step<'_>) -> Vec<String> {
        let ns = ctx.inputs.hcp_namespace();
        match step.output_of::<Assess>().ok().flatten() {
            Some(a) => vec![
                format!(
                    "delete PersistentVolumeClaim {ns}/{} (uid {}) and pod {ns}/{} (uid {}): the member's data is gone for good",
                    a.pvc, a.pvc_uid, a.member, a.pod_uid
                ),
                format!(
                    "meanwhile {} of {} members keep the quorum: {}",
                    a.healthy_others.len(),
                    a.members,
                    a.healthy_others.join(", ")
                ),
            ],
            None => vec![format!(
                "delete the assessed member's volume claim and pod in {ns}"
            )],
        }
    }
    async fn run(
        &self,
        ctx: &mut RecoverContext,
        step: &mut Step<'_>,
    ) -> Result<Self::Output, StageFailure> {
        run(ctx, step).await
    }
}
