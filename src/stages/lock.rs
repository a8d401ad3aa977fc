//! `lock` / `unlock`: a coordination.k8s.io Lease per hosted cluster, so two
//! hcp-dr runs that change one cluster (backups, migrations, etcd recovery)
//! cannot run at once. The second fails naming the holder; an expired Lease
//! (its run died) is taken over. Any operation whose context is [`Lockable`]
//! uses these stages.

use async_trait::async_trait;
use chrono::{DateTime, Duration as ChronoDuration, SecondsFormat, Utc};
use kube::Client;
use kube::api::{DeleteParams, DynamicObject, PostParams, Preconditions};
use serde_json::{Value, json};

use super::StageError;
use super::context::BackupContext;
use crate::kube::{is_conflict, is_not_found, lease_api, request};
use crate::pipeline::{Stage, StageId, StageFailure, Step, UndoInput};

/// Which hosted cluster's Lease a run takes, as whom, and for how long.
pub struct LeaseTarget<'a> {
    pub client: &'a Client,
    /// The HostedCluster's namespace (the Lease lives there).
    pub namespace: &'a str,
    pub hosted_cluster: &'a str,
    /// Journaled with the run's inputs, so a resumed run is the same holder.
    pub holder: &'a str,
    /// How long the Lease lasts without renewal.
    pub seconds: i64,
}

impl LeaseTarget<'_> {
    fn label(&self) -> String {
        format!("HostedCluster {}/{}", self.namespace, self.hosted_cluster)
    }
}

/// A context whose operation holds the hosted cluster's Lease while it runs.
pub trait Lockable: Send + Sync {
    fn lease_target(&self) -> LeaseTarget<'_>;
    /// Told when the Lease could not be released at the end (it expires by itself).
    fn lock_warning(&mut self, warning: String);
}

impl Lockable for BackupContext {
    fn lease_target(&self) -> LeaseTarget<'_> {
        LeaseTarget {
            client: &self.client,
            namespace: &self.inputs.namespace,
            hosted_cluster: &self.inputs.hosted_cluster,
            holder: &self.inputs.holder,
            seconds: lease_seconds(self),
        }
    }
    fn lock_warning(&mut self, warning: String) {
        self.warnings.push(warning);
    }
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

/// The Lease taken, and by whom.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Taken {
    pub lease: String,
    pub holder: String,
}

/// Why the Lease was left to expire.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NotReleased {
    pub warning: String,
}

impl StageId for Lock {
    const NAME: &'static str = "lock";
    type Output = Taken;
}

#[async_trait]
impl<C: Lockable> Stage<C> for Lock {
    fn summary(&self) -> &'static str {
        "take a Lease on the hosted cluster so no other hcp-dr run changes it at the same time"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &C, _step: &Step<'_>) -> Vec<String> {
        let target = ctx.lease_target();
        vec![format!(
            "take Lease {}/{} as {} for {}s",
            target.namespace,
            lease_name(target.hosted_cluster),
            target.holder,
            target.seconds
        )]
    }
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let target = ctx.lease_target();
        let api = lease_api(target.client, target.namespace);
        let name = lease_name(target.hosted_cluster);
        let now = Utc::now();
        let spec = json!({
            "holderIdentity": target.holder,
            "leaseDurationSeconds": target.seconds,
            "acquireTime": micro(now),
            "renewTime": micro(now),
        });
        let what = format!("Lease {}/{name}", target.namespace);
        let existing = api.get_opt(&name).await.map_err(request(format!("reading {what}")))?;
        let taking = Taken { lease: name.clone(), holder: target.holder.to_string() };
        match existing {
            None => {
                // journaled just before the change: a run refused here changed nothing
                step.record(serde_json::to_value(&taking)?)?;
                let lease: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": target.namespace,
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
                if holder != target.holder && !expired(&value, now) {
                    return Err(StageError::Locked(format!(
                        "{} is locked by another run: holder `{holder}` since {}, lease {what} valid for {}s after {}; wait for it to finish, or if that run is dead, delete the Lease (kubectl -n {} delete lease {name})",
                        target.label(),
                        value["spec"]["acquireTime"].as_str().unwrap_or("?"),
                        value["spec"]["leaseDurationSeconds"].as_i64().unwrap_or(0),
                        value["spec"]["renewTime"].as_str().unwrap_or("?"),
                        target.namespace,
                    ))
                    .into());
                }
                step.record(serde_json::to_value(&taking)?)?;
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
        Ok(taking)
    }
    fn undoable(&self) -> bool {
        true
    }
    async fn undo(&self, ctx: &mut C, _input: UndoInput<'_>) -> Result<(), StageFailure> {
        release(&ctx.lease_target()).await
    }
}

/// Delete the Lease if this run holds it.
async fn release(target: &LeaseTarget<'_>) -> Result<(), StageFailure> {
    let api = lease_api(target.client, target.namespace);
    let name = lease_name(target.hosted_cluster);
    let what = format!("Lease {}/{name}", target.namespace);
    let Some(lease) = api.get_opt(&name).await.map_err(request(format!("reading {what}")))? else {
        return Ok(());
    };
    let value = serde_json::to_value(&lease)?;
    if value["spec"]["holderIdentity"].as_str() != Some(target.holder) {
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

impl StageId for Unlock {
    const NAME: &'static str = "unlock";
    type Output = Option<NotReleased>;
}

#[async_trait]
impl<C: Lockable> Stage<C> for Unlock {
    fn summary(&self) -> &'static str {
        "release the Lease"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &C, _step: &Step<'_>) -> Vec<String> {
        let target = ctx.lease_target();
        vec![format!("release Lease {}/{}", target.namespace, lease_name(target.hosted_cluster))]
    }
    /// The operation is complete by now: failing to release the Lease must
    /// not undo it. The Lease expires by itself; the output says so.
    async fn run(&self, ctx: &mut C, _step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let target = ctx.lease_target();
        let warning = match release(&target).await {
            Ok(()) => return Ok(None),
            Err(err) => format!(
                "could not release Lease {}/{} ({}); it expires by itself",
                target.namespace,
                lease_name(target.hosted_cluster),
                crate::pipeline::stage::error_chain(err.as_ref())
            ),
        };
        ctx.lock_warning(warning.clone());
        Ok(Some(NotReleased { warning }))
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
