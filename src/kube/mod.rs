//! The Kubernetes adapter: building a client from a kubeconfig, dynamic
//! APIs for known kinds, patches, scale, and bounded waits. Every error says
//! what was being done and on which object.

pub mod portforward;
pub mod retry;
pub mod watch;

pub use watch::{Changes, Watched, changes, wait_for_object, wait_on, wait_watching};

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
    /// A request failed. Shown as the server's message, reason and the
    /// fields it names (never the client's debug structures); the cause is
    /// kept for callers that inspect it, not chained into the text.
    #[error("{action}: {}", describe_error(source))]
    Request { action: String, source: kube::Error },
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

/// A management cluster as a run reached it: the client, and what a journal
/// records to find the same cluster again (never credentials).
pub struct Connected {
    pub client: Client,
    /// The API server URL.
    pub server: String,
    /// The kubeconfig file(s) used, absolute, `:`-separated as in
    /// `$KUBECONFIG` (`None`: in-cluster configuration).
    pub kubeconfig: Option<String>,
    /// The context used (the current one resolved to its name).
    pub context: Option<String>,
    /// The `kube-system` namespace's UID (`None` when the caller may not read it).
    pub kube_system_uid: Option<String>,
}

/// Connect like [`client`], resolving which kubeconfig file and context
/// were used (`kubeconfig` may be a `:`-separated list, as `$KUBECONFIG`),
/// and read the cluster's identity: the `kube-system` namespace's UID. An
/// unreachable server fails here, before anything is journaled.
pub async fn connect(kubeconfig: Option<&str>, context: Option<&str>) -> Result<Connected, KubeError> {
    let paths: Vec<std::path::PathBuf> = match kubeconfig.filter(|k| !k.is_empty()) {
        Some(list) => std::env::split_paths(list).collect(),
        None => match std::env::var_os("KUBECONFIG").filter(|k| !k.is_empty()) {
            Some(list) => std::env::split_paths(&list).collect(),
            None => std::env::var_os("HOME")
                .map(|home| Path::new(&home).join(".kube/config"))
                .filter(|p| p.exists())
                .into_iter()
                .collect(),
        },
    };
    let (config, kubeconfig, context) = if paths.is_empty() {
        let config = Config::incluster().map_err(|e| KubeError::Config {
            path: "(none)".into(),
            message: format!(
                "no kubeconfig: give --kubeconfig or set KUBECONFIG (not running in a pod either: {e})"
            ),
        })?;
        (config, None, None)
    } else {
        let absolute: Vec<std::path::PathBuf> = paths
            .iter()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
            .collect();
        let joined = std::env::join_paths(&absolute)
            .map(|j| j.to_string_lossy().into_owned())
            .unwrap_or_else(|_| absolute[0].display().to_string());
        let err = |message: String| KubeError::Config {
            path: joined.clone(),
            message,
        };
        let mut merged: Option<Kubeconfig> = None;
        for path in &absolute {
            // with several files, say which one (the error names it only as a debug string)
            let file = Kubeconfig::read_from(path)
                .map_err(|e| err(if absolute.len() == 1 { e.to_string() } else { format!("{}: {e}", path.display()) }))?;
            merged = Some(match merged {
                None => file,
                Some(first) => first.merge(file).map_err(|e| err(e.to_string()))?,
            });
        }
        let file = merged.ok_or_else(|| err("no kubeconfig file".into()))?;
        let context = context.map(str::to_string).or_else(|| file.current_context.clone());
        let options = KubeConfigOptions {
            context: context.clone(),
            ..Default::default()
        };
        let config = Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(|e| err(e.to_string()))?;
        (config, Some(joined), context)
    };
    let server = config.cluster_url.to_string();
    let client = build(config)?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let kube_system_uid = match namespaces.get("kube-system").await {
        Ok(ns) => ns.metadata.uid,
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 404 => {
            tracing::warn!(server = %server, "cannot read the kube-system namespace ({}): the journal identifies this cluster by its server URL only", status.reason);
            None
        }
        Err(source) => {
            return Err(KubeError::Request {
                action: format!("reaching the management cluster at {server}"),
                source,
            });
        }
    };
    Ok(Connected {
        client,
        server,
        kubeconfig,
        context,
        kube_system_uid,
    })
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
    build(config)
}

/// How long connecting to an API server may take: an unreachable one fails
/// within the retry budget (about 30 s), not the client's default minutes.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The client for a configuration: requests identified as hcp-dr's
/// (`User-Agent: hcp-dr/<version>`, as audit logs show them) and retried as
/// [`retry`] says, instead of the client's own narrower retry.
fn build(mut config: Config) -> Result<Client, KubeError> {
    config.default_retry = false;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("hcp-dr/", env!("CARGO_PKG_VERSION"))),
    ));
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|source| KubeError::Request {
        action: "building the Kubernetes client".into(),
        source,
    })?;
    Ok(builder.with_layer(&retry::RetryLayer(retry::Retry::default())).build())
}

/// A client error for people: for an API error, the server's message with
/// its reason, HTTP code and the fields it names; otherwise the error and
/// its causes on one line.
pub fn describe_error(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            let mut text = if status.message.is_empty() {
                "the API server refused the request".to_string()
            } else {
                status.message.clone()
            };
            let mut notes = Vec::new();
            if !status.reason.is_empty() {
                notes.push(status.reason.clone());
            }
            if status.code != 0 {
                notes.push(format!("HTTP {}", status.code));
            }
            if let Some(details) = &status.details {
                for cause in &details.causes {
                    // the message usually repeats the causes; add what it lacks
                    let line = match (cause.field.is_empty(), cause.message.is_empty()) {
                        (false, false) => format!("{}: {}", cause.field, cause.message),
                        (false, true) => format!("field {}", cause.field),
                        (true, false) => cause.message.clone(),
                        (true, true) => continue,
                    };
                    if !text.contains(&line) && !text.contains(&cause.message) {
                        notes.push(line);
                    }
                }
            }
            if !notes.is_empty() {
                text.push_str(&format!(" ({})", notes.join("; ")));
            }
            text
        }
        other => crate::error::error_chain(other),
    }
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

/// 422: the server refused the object (e.g. a patch changing an immutable field).
pub fn is_invalid(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 422)
}

/// A namespaced dynamic API for a known kind.
pub fn api(client: &Client, gvk: &Gvk, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &gvk.api_resource())
}

/// coordination.k8s.io/v1 Lease: the hcp-dr lock and the stream's shard
/// ownership both take one.
const LEASE: Gvk = Gvk { group: "coordination.k8s.io", version: "v1", kind: "Lease", plural: "leases" };

/// The Leases of `namespace`.
pub fn lease_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    api(client, &LEASE, namespace)
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

/// List objects as JSON; `None` when the server does not serve the type
/// (a 404 on the list: its CRD is not installed).
pub async fn list_if_served(api: &Api<DynamicObject>, params: &ListParams, what: &str) -> Result<Option<Vec<Value>>, KubeError> {
    match list_json(api, params, what).await {
        Ok(items) => Ok(Some(items)),
        Err(KubeError::Request { source, .. }) if is_not_found(&source) => Ok(None),
        Err(err) => Err(err),
    }
}

/// API discovery of only the groups `wanted` accepts (`""`: the core
/// group). A management cluster often has an aggregated API registered but
/// down (a stale metrics or package server answering 503): a discovery of
/// every group, as `Discovery::run` alone does, would fail an operation on
/// a group it never uses. The groups asked for must answer.
pub async fn discover(client: &Client, wanted: impl Fn(&str) -> bool, what: &str) -> Result<kube::discovery::Discovery, KubeError> {
    let listed = client.list_api_groups().await.map_err(request(what))?;
    let mut names: Vec<String> = listed.groups.into_iter().map(|g| g.name).filter(|name| wanted(name)).collect();
    if wanted("") {
        names.push(String::new());
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    kube::discovery::Discovery::new(client.clone()).filter(&names).run().await.map_err(request(what))
}

/// Why a namespace the destination must create things in cannot be used:
/// it is being deleted (Terminating), and a Terminating namespace refuses
/// every new object (403) until the namespace controller has emptied and
/// removed it (on a real cluster: the pods' grace periods and more).
pub fn terminating_namespace(name: &str, live: Option<&k8s_openapi::api::core::v1::Namespace>) -> Option<String> {
    live.filter(|n| n.metadata.deletion_timestamp.is_some()).map(|_| {
        format!(
            "Namespace {name} is being deleted (Terminating) on the destination: nothing can be created in it until it is gone. Wait until `kubectl get namespace {name}` finds nothing, then run again"
        )
    })
}

/// The Routes (none when the server does not serve them) and Services of
/// a namespace, as JSON: what publishes a hosted cluster's services.
pub async fn publishing_objects(client: &Client, namespace: &str) -> Result<(Vec<Value>, Vec<Value>), KubeError> {
    let routes = match api(client, &crate::hosted::ROUTE, namespace).list(&ListParams::default()).await {
        Ok(list) => list.items.into_iter().map(|r| serde_json::to_value(r).unwrap_or_default()).collect(),
        Err(err) if is_not_found(&err) => Vec::new(),
        Err(err) => return Err(request(format!("listing Routes in {namespace}"))(err)),
    };
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), namespace);
    let services = services
        .list(&ListParams::default())
        .await
        .map_err(request(format!("listing Services in {namespace}")))?
        .items
        .into_iter()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .collect();
    Ok((routes, services))
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

/// Set `spec.pausedUntil` of the HostedCluster `namespace/name` (`hc`, as
/// read) and of each of its NodePools to `value(object as read)`; returns
/// what was changed (`HostedCluster ns/name`, `NodePool ns/pool`, in order).
pub async fn set_cluster_paused_until(
    client: &Client,
    namespace: &str,
    name: &str,
    hc: &Value,
    value: impl Fn(&Value) -> Option<String>,
) -> Result<Vec<String>, KubeError> {
    let (hosted_cluster, node_pool) = (&crate::hosted::HOSTED_CLUSTER, &crate::hosted::NODE_POOL);
    let mut changed = Vec::new();
    set_paused_until(client, hosted_cluster, namespace, name, value(hc).as_deref()).await?;
    changed.push(format!("HostedCluster {namespace}/{name}"));
    let pools = api(client, node_pool, namespace);
    for np in list_json(&pools, &Default::default(), "NodePools").await? {
        if np["spec"]["clusterName"].as_str() == Some(name) {
            let np_name = np["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let what = format!("NodePool {namespace}/{np_name}");
            set_paused_until(client, node_pool, namespace, &np_name, value(&np).as_deref()).await?;
            changed.push(what);
        }
    }
    Ok(changed)
}

/// A Deployment's `spec.replicas` (None when the Deployment does not exist).
pub async fn deployment_replicas(client: &Client, namespace: &str, name: &str) -> Result<Option<i32>, KubeError> {
    Ok(deployment_uid_and_replicas(client, namespace, name).await?.map(|(_, replicas)| replicas))
}

/// A Deployment's UID and `spec.replicas` (None when it does not exist).
pub async fn deployment_uid_and_replicas(client: &Client, namespace: &str, name: &str) -> Result<Option<(Option<String>, i32)>, KubeError> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(d)) => Ok(Some((d.metadata.uid, d.spec.replicas.unwrap_or(1)))),
        Ok(None) => Ok(None),
        Err(source) => Err(KubeError::Request {
            action: format!("reading Deployment {namespace}/{name}"),
            source,
        }),
    }
}

/// Scale an object (a Deployment, a StatefulSet) through its `scale`
/// subresource, only if it is still the object with `uid` (a precondition
/// the server checks). False: it was replaced by another of the same name,
/// which is left alone. `what` names it in errors.
pub async fn scale_if<K>(api: &Api<K>, name: &str, replicas: i32, uid: Option<&str>, what: &str) -> Result<bool, KubeError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut patch = json!({"spec": {"replicas": replicas}});
    if let Some(uid) = uid {
        patch["metadata"] = json!({"uid": uid});
    }
    match api.patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(true),
        Err(err) if uid.is_some() && is_conflict(&err) => Ok(false),
        Err(source) => Err(KubeError::Request {
            action: format!("scaling {what} to {replicas}"),
            source,
        }),
    }
}

/// [`scale_if`] for a Deployment.
pub async fn scale_deployment_if(client: &Client, namespace: &str, name: &str, replicas: i32, uid: Option<&str>) -> Result<bool, KubeError> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    scale_if(&api, name, replicas, uid, &format!("Deployment {namespace}/{name}")).await
}

/// Scale a Deployment through its `scale` subresource.
pub async fn scale_deployment(client: &Client, namespace: &str, name: &str, replicas: i32) -> Result<(), KubeError> {
    scale_deployment_if(client, namespace, name, replicas, None).await.map(|_| ())
}

/// The pods a Deployment's selector matches.
pub async fn deployment_pods(client: &Client, namespace: &str, name: &str) -> Result<Vec<Pod>, KubeError> {
    let selector = deployment_selector(client, namespace, name).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(request(format!("listing pods of Deployment {namespace}/{name}")))?
        .items)
}

/// The label selector of Deployment `name`'s pods (its matchLabels).
pub async fn deployment_selector(client: &Client, namespace: &str, name: &str) -> Result<String, KubeError> {
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
    Ok(labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
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
