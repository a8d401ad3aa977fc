//! `lock` / `unlock`: a coordination.k8s.io Lease per hosted cluster, so two
//! backups of one cluster cannot run at once. The second fails naming the
//! holder; an expired Lease (its run died) is taken over.

use async_trait::async_trait;
use chrono::{DateTime, Duration as ChronoDuration, SecondsFormat, Utc};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::core::ApiResource;
use serde_json::{Value, json};

use super::StageError;
use super::context::BackupContext;
use crate::kube::{is_conflict, is_not_found, request};
use crate::pipeline::{Stage, StageFailure, Step, UndoInput};

fn leases(ctx: &BackupContext) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "coordination.k8s.io".into(),
        version: "v1".into(),
        api_version: "coordination.k8s.io/v1".into(),
        kind: "Lease".into(),
        plural: "leases".into(),
    };
    Api::namespaced_with(ctx.client.clone(), &ctx.inputs.namespace, &resource)
}

/// The Lease's name for a hosted cluster.
pub fn lease_name(hosted_cluster: &str) -> String {
    format!("hcp-dr-lock-{hosted_cluster}")
}

fn micro(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// How long the lock lasts without renewal: the pause deadline plus the waits.
fn lease_seconds(ctx: &BackupContext) -> i64 {
    (ctx.inputs.pause_ttl_seconds + 2 * ctx.inputs.wait_timeout_seconds).max(600) as i64
}

fn expired(lease: &Value, now: DateTime<Utc>) -> bool {
    let spec = &lease["spec"];
    let renew = spec["renewTime"]
        .as_str()
        .or(spec["acquireTime"].as_str())
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
    let duration = spec["leaseDurationSeconds"].as_i64().unwrap_or(0);
    match renew {
        Some(renew) => renew.to_utc() + ChronoDuration::seconds(duration) < now,
        None => true,
    }
}

pub struct Lock;

#[async_trait]
impl Stage<BackupContext> for Lock {
    fn name(&self) -> &'static str {
        "lock"
    }
    fn summary(&self) -> &'static str {
        "take a Lease on the hosted cluster so no other backup runs at the same time"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, _params: &Value) -> Vec<String> {
        vec![format!(
            "take Lease {}/{} as {} for {}s",
            ctx.inputs.namespace,
            lease_name(&ctx.inputs.hosted_cluster),
            ctx.inputs.holder,
            lease_seconds(ctx)
        )]
    }
    async fn run(&self, ctx: &mut BackupContext, _step: &mut Step<'_>) -> Result<Value, StageFailure> {
        let api = leases(ctx);
        let name = lease_name(&ctx.inputs.hosted_cluster);
        let now = Utc::now();
        let spec = json!({
            "holderIdentity": ctx.inputs.holder,
            "leaseDurationSeconds": lease_seconds(ctx),
            "acquireTime": micro(now),
            "renewTime": micro(now),
        });
        let what = format!("Lease {}/{name}", ctx.inputs.namespace);
        let existing = api.get_opt(&name).await.map_err(request(format!("reading {what}")))?;
        match existing {
            None => {
                let lease: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": ctx.inputs.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "hcp-dr"}},
                    "spec": spec,
                }))?;
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => {}
                    Err(err) if is_conflict(&err) => {
                        return Err(StageError::Locked(format!(
                            "another hcp-dr run took {what} at the same moment; try again later"
                        ))
                        .into());
                    }
                    Err(err) => return Err(request(format!("creating {what}"))(err).into()),
                }
            }
            Some(lease) => {
                let value = serde_json::to_value(&lease)?;
                let holder = value["spec"]["holderIdentity"].as_str().unwrap_or("(unknown)");
                if holder != ctx.inputs.holder && !expired(&value, now) {
                    return Err(StageError::Locked(format!(
                        "{} is locked by another run: holder `{holder}` since {}, lease {what} valid for {}s after {}; wait for it to finish, or if that run is dead, delete the Lease (kubectl -n {} delete lease {name})",
                        ctx.hc_label(),
                        value["spec"]["acquireTime"].as_str().unwrap_or("?"),
                        value["spec"]["leaseDurationSeconds"].as_i64().unwrap_or(0),
                        value["spec"]["renewTime"].as_str().unwrap_or("?"),
                        ctx.inputs.namespace,
                    ))
                    .into());
                }
                let mut updated = value.clone();
                updated["spec"] = spec;
                let obj: DynamicObject = serde_json::from_value(updated)?;
                api.replace(&name, &PostParams::default(), &obj)
                    .await
                    .map_err(|err| -> StageFailure {
                        if is_conflict(&err) {
                            StageError::Locked(format!("{what} changed while taking it over; another run is starting")).into()
                        } else {
                            request(format!("taking over {what}"))(err).into()
                        }
                    })?;
            }
        }
        Ok(json!({"lease": name, "holder": ctx.inputs.holder}))
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut BackupContext, _input: UndoInput<'_>) -> Result<(), StageFailure> {
        release(ctx).await
    }
}

/// Delete the Lease if this run holds it.
async fn release(ctx: &BackupContext) -> Result<(), StageFailure> {
    let api = leases(ctx);
    let name = lease_name(&ctx.inputs.hosted_cluster);
    let what = format!("Lease {}/{name}", ctx.inputs.namespace);
    let Some(lease) = api.get_opt(&name).await.map_err(request(format!("reading {what}")))? else {
        return Ok(());
    };
    let value = serde_json::to_value(&lease)?;
    if value["spec"]["holderIdentity"].as_str() != Some(ctx.inputs.holder.as_str()) {
        tracing::warn!("{what} is held by another run now; leaving it");
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(request(format!("releasing {what}"))(err).into()),
    }
}

pub struct Unlock;

#[async_trait]
impl Stage<BackupContext> for Unlock {
    fn name(&self) -> &'static str {
        "unlock"
    }
    fn summary(&self) -> &'static str {
        "release the Lease"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &BackupContext, _params: &Value) -> Vec<String> {
        vec![format!("release Lease {}/{}", ctx.inputs.namespace, lease_name(&ctx.inputs.hosted_cluster))]
    }
    /// The backup is complete by now: failing to release the Lease must not
    /// undo it. The Lease expires by itself; the warning says so.
    async fn run(&self, ctx: &mut BackupContext, _step: &mut Step<'_>) -> Result<Value, StageFailure> {
        match release(ctx).await {
            Ok(()) => Ok(Value::Null),
            Err(err) => {
                let warning = format!(
                    "could not release Lease {}/{} ({}); it expires by itself",
                    ctx.inputs.namespace,
                    lease_name(&ctx.inputs.hosted_cluster),
                    crate::pipeline::stage::error_chain(err.as_ref())
                );
                ctx.warnings.push(warning.clone());
                Ok(json!({"warning": warning}))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry() {
        let now = DateTime::parse_from_rfc3339("2026-11-21T18:00:00Z").unwrap().to_utc();
        let lease = |renew: &str, secs: i64| json!({"spec": {"renewTime": renew, "leaseDurationSeconds": secs}});
        assert!(!expired(&lease("2026-11-21T17:59:00.000000Z", 120), now));
        assert!(expired(&lease("2026-11-21T17:50:00.000000Z", 120), now));
        assert!(expired(&json!({"spec": {}}), now));
    }
}
