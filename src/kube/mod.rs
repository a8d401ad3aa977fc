//! The Kubernetes adapter: building a client from a kubeconfig, dynamic
//! APIs for known kinds, patches, scale, and bounded waits. Every error says
//! what was being done and on which object.

pub mod portforward;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ApiResource;
use kube::{Client, Config};
use serde_json::{Value, json};

use crate::hosted::Gvk;

/// Why a request to a management cluster failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig could not be read or has no usable context.
    #[error("kubeconfig {path}: {message}")]
    Config { path: String, message: String },
    /// A request failed.
    #[error("{action}: {source}")]
    Request {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// An object the operation needs does not exist.
    #[error("{what} not found{hint}")]
    NotFound { what: String, hint: String },
    /// A wait ran out of time.
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
    /// An object is not shaped as expected.
    #[error("{0}")]
    Invalid(String),
}

/// Build a client: `kubeconfig` (else `$KUBECONFIG`, else `~/.kube/config`,
/// else in-cluster) and `context` (else the current one).
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, KubeError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let err = |message: String| KubeError::Config {
                path: path.display().to_string(),
                message,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None if context.is_some() => Config::from_kubeconfig(&options).await.map_err(|e| KubeError::Config {
            path: "(default)".into(),
            message: e.to_string(),
        })?,
        None => Config::infer().await.map_err(|e| KubeError::Config {
            path: "(default)".into(),
            message: e.to_string(),
        })?,
    };
    Client::try_from(config).map_err(|source| KubeError::Request {
        action: "building the Kubernetes client".into(),
        source,
    })
}

/// A request error with what was being done.
pub fn request(action: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeError {
    let action = action.into();
    move |source| KubeError::Request { action, source }
}

pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// A namespaced dynamic API for a known kind.
pub fn api(client: &Client, gvk: &Gvk, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &gvk.api_resource())
}

/// A namespaced dynamic API for a discovered resource.
pub fn api_for(client: &Client, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, resource)
}

/// Get an object as JSON; `None` when it does not exist.
pub async fn get_json(api: &Api<DynamicObject>, name: &str, what: &str) -> Result<Option<Value>, KubeError> {
    match api.get_opt(name).await {
        Ok(Some(obj)) => Ok(Some(serde_json::to_value(obj).map_err(|e| KubeError::Invalid(e.to_string()))?)),
        Ok(None) => Ok(None),
        Err(source) => Err(KubeError::Request {
            action: format!("reading {what}"),
            source,
        }),
    }
}

/// List objects as JSON.
pub async fn list_json(api: &Api<DynamicObject>, params: &ListParams, what: &str) -> Result<Vec<Value>, KubeError> {
    let list = api.list(params).await.map_err(request(format!("listing {what}")))?;
    list.items
        .into_iter()
        .map(|o| serde_json::to_value(o).map_err(|e| KubeError::Invalid(e.to_string())))
        .collect()
}

/// JSON merge patch (works on built-in and custom resources alike).
pub async fn merge_patch(api: &Api<DynamicObject>, name: &str, patch: &Value, what: &str) -> Result<(), KubeError> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(request(format!("patching {what}")))
}

/// Set `spec.pausedUntil` (or remove it with `None`).
pub async fn set_paused_until(
    client: &Client,
    gvk: &Gvk,
    namespace: &str,
    name: &str,
    value: Option<&str>,
) -> Result<(), KubeError> {
    merge_patch(
        &api(client, gvk, namespace),
        name,
        &json!({"spec": {"pausedUntil": value}}),
        &format!("spec.pausedUntil of {} {namespace}/{name}", gvk.kind),
    )
    .await
}

/// A Deployment's `spec.replicas` (None when the Deployment does not exist).
pub async fn deployment_replicas(client: &Client, namespace: &str, name: &str) -> Result<Option<i32>, KubeError> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(d)) => Ok(Some(d.spec.replicas.unwrap_or(1))),
        Ok(None) => Ok(None),
        Err(source) => Err(KubeError::Request {
            action: format!("reading Deployment {namespace}/{name}"),
            source,
        }),
    }
}

/// Scale a Deployment through its `scale` subresource.
pub async fn scale_deployment(client: &Client, namespace: &str, name: &str, replicas: i32) -> Result<(), KubeError> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    api.patch_scale(name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": replicas}})))
        .await
        .map(|_| ())
        .map_err(request(format!("scaling Deployment {namespace}/{name} to {replicas}")))
}

/// The pods a Deployment's selector matches.
pub async fn deployment_pods(client: &Client, namespace: &str, name: &str) -> Result<Vec<Pod>, KubeError> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deployment = api
        .get(name)
        .await
        .map_err(request(format!("reading Deployment {namespace}/{name}")))?;
    let labels = deployment.spec.selector.match_labels.unwrap_or_default();
    if labels.is_empty() {
        return Err(KubeError::Invalid(format!(
            "Deployment {namespace}/{name} has no matchLabels selector"
        )));
    }
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(request(format!("listing pods of Deployment {namespace}/{name}")))?
        .items)
}

/// Poll `check` every `every` until it returns `Some`, or fail after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, every: Duration, mut check: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, KubeError>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if start.elapsed() >= timeout {
            return Err(KubeError::Timeout {
                what: what.to_string(),
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(every).await;
    }
}
