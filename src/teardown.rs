//! Deleting what hcp-dr created or moved away: one object at a time, waiting
//! until it is really gone, and clearing finalizers only when their
//! controller is not going to (it was scaled away, or the object is ours).

use std::time::Duration;

use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::kube::{KubeError, is_conflict, is_invalid, is_not_found, request};
use crate::pipeline::journal::RUN_ANNOTATION;

/// What a conditional deletion found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// It was there and is gone now.
    Deleted,
    /// It was already gone.
    Absent,
    /// An object of that name exists with another UID: not the one the run
    /// created, so it was left alone.
    NotOurs { uid: String },
}

/// Delete `name` and wait until it is gone. Finalizers still holding it after
/// `timeout` are removed (their controller is not coming back for it), then
/// it is waited for once more; an object still there is an error.
pub async fn delete_and_wait<K>(api: &Api<K>, name: &str, what: &str, timeout: Duration) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    delete_if_uid(api, name, None, what, timeout).await.map(|_| ())
}

/// [`delete_and_wait`] conditional on the object's UID: every request
/// (the delete, and the finalizer removal) carries `uid` as a precondition,
/// so only the object a run created can be removed, never a same-named one
/// made since by someone else (`NotOurs`). `uid` None: whatever is there.
pub async fn delete_if_uid<K>(api: &Api<K>, name: &str, uid: Option<&str>, what: &str, timeout: Duration) -> Result<Removal, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => return Ok(Removal::Absent),
        // 409: another object holds the name, or ours is already being
        // deleted (a terminating namespace answers a second delete so)
        Err(err) if uid.is_some() && is_conflict(&err) => match not_ours(api, name, what).await? {
            Removal::NotOurs { uid: live } if Some(live.as_str()) == uid => {}
            other => return Ok(other),
        },
        Err(err) => return Err(request(format!("deleting {what}"))(err)),
    }
    if wait_gone_or_replaced(api, name, uid, what, timeout).await? {
        return Ok(Removal::Deleted);
    }
    tracing::warn!(object = %what, "still present after {}s: removing its finalizers", timeout.as_secs());
    let patch = match uid {
        // a patch that names the UID fails on any other object (uid is immutable)
        Some(uid) => json!({"metadata": {"uid": uid, "finalizers": null}}),
        None => json!({"metadata": {"finalizers": null}}),
    };
    match api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => return Ok(Removal::Deleted),
        Err(err) if uid.is_some() && (is_conflict(&err) || is_invalid(&err)) => return Ok(Removal::Deleted),
        Err(err) => return Err(request(format!("removing the finalizers of {what}"))(err)),
    }
    if wait_gone_or_replaced(api, name, uid, what, Duration::from_secs(60)).await? {
        Ok(Removal::Deleted)
    } else {
        Err(KubeError::Timeout {
            what: format!("{what} to be deleted"),
            seconds: 60,
        })
    }
}

/// Whether an object was created by the run `run_id`: its
/// [`RUN_ANNOTATION`] says so. A journal of an older hcp-dr has no run id,
/// and the name is all it had.
pub fn created_by_run(annotation: Option<&str>, run_id: &str) -> bool {
    run_id.is_empty() || annotation == Some(run_id)
}

/// Whose the object at `name` is, for an undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// The run's own object, with its UID.
    Ours(String),
    /// Nothing is there.
    Gone,
    /// Another object of that name (its UID).
    NotOurs(String),
}

/// Whether the object at `name` is the one a run created: the UID the run
/// journaled when it has one, else (a create interrupted before its UID was
/// journaled) the run's annotation on the live object.
pub async fn ownership<K>(api: &Api<K>, name: &str, recorded: Option<&str>, run_id: &str, what: &str) -> Result<Owned, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(live) = api.get_opt(name).await.map_err(request(format!("reading {what}")))? else {
        return Ok(Owned::Gone);
    };
    let meta = live.meta();
    let uid = meta.uid.clone().unwrap_or_default();
    let ours = match recorded {
        Some(recorded) => recorded == uid,
        None => created_by_run(meta.annotations.as_ref().and_then(|a| a.get(RUN_ANNOTATION)).map(String::as_str), run_id),
    };
    Ok(if ours { Owned::Ours(uid) } else { Owned::NotOurs(uid) })
}

/// Delete what a run created under `name` ([`ownership`]), conditional on its
/// UID ([`delete_if_uid`]); anything else there is left alone (`NotOurs`).
pub async fn delete_created<K>(api: &Api<K>, name: &str, recorded: Option<&str>, run_id: &str, what: &str, timeout: Duration) -> Result<Removal, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let uid = match recorded {
        // the precondition decides: no read needed
        Some(uid) => uid.to_string(),
        None => match ownership(api, name, None, run_id, what).await? {
            Owned::Ours(uid) => uid,
            Owned::Gone => return Ok(Removal::Absent),
            Owned::NotOurs(uid) => return Ok(Removal::NotOurs { uid }),
        },
    };
    delete_if_uid(api, name, Some(&uid), what, timeout).await
}

/// The object at `name` is not the one a run created: say which it is.
async fn not_ours<K>(api: &Api<K>, name: &str, what: &str) -> Result<Removal, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await.map_err(request(format!("reading {what}")))? {
        Some(obj) => Ok(Removal::NotOurs {
            uid: obj.meta().uid.clone().unwrap_or_default(),
        }),
        None => Ok(Removal::Absent),
    }
}

/// Wait until the object with `uid` (any, when None) no longer exists under
/// `name`; true when gone, false after `timeout`.
async fn wait_gone_or_replaced<K>(api: &Api<K>, name: &str, uid: Option<&str>, what: &str, timeout: Duration) -> Result<bool, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let waited = crate::kube::wait_for(&format!("{what} to be deleted"), timeout, Duration::from_millis(500), || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(Some(())),
            Ok(Some(obj)) if uid.is_some() && obj.meta().uid.as_deref() != uid => Ok(Some(())),
            Ok(Some(_)) => Ok(None),
            Err(err) => Err(request(format!("reading {what}"))(err)),
        }
    })
    .await;
    match waited {
        Ok(()) => Ok(true),
        Err(KubeError::Timeout { .. }) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Clear `metadata.finalizers` (a missing object is fine).
pub async fn remove_finalizers<K>(api: &Api<K>, name: &str, what: &str) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(request(format!("removing the finalizers of {what}"))(err)),
    }
}

/// Wait until `name` no longer exists.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, what: &str, timeout: Duration) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    crate::kube::wait_for(&format!("{what} to be deleted"), timeout, Duration::from_millis(500), || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(Some(())),
            Ok(Some(_)) => Ok(None),
            Err(err) => Err(request(format!("reading {what}"))(err)),
        }
    })
    .await
}
