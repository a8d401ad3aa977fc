//! Deleting what hcp-dr created or moved away: one object at a time, waiting
//! until it is really gone, and clearing finalizers only when their
//! controller is not going to (it was scaled away, or the object is ours).

use std::time::Duration;

use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::kube::{KubeError, is_not_found, request};

/// Delete `name` and wait until it is gone. Finalizers still holding it after
/// `timeout` are removed (their controller is not coming back for it), then
/// it is waited for once more; an object still there is an error.
pub async fn delete_and_wait<K>(api: &Api<K>, name: &str, what: &str, timeout: Duration) -> Result<(), KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => return Ok(()),
        Err(err) => return Err(request(format!("deleting {what}"))(err)),
    }
    if wait_gone(api, name, what, timeout).await.is_ok() {
        return Ok(());
    }
    tracing::warn!(object = %what, "still present after {}s: removing its finalizers", timeout.as_secs());
    remove_finalizers(api, name, what).await?;
    wait_gone(api, name, what, Duration::from_secs(60)).await
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
