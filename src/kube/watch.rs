//! Waits that answer as soon as the API server says something changed.
//!
//! [`super::wait_for`] looks every `every`; [`wait_watching`] looks again
//! on every watch event of the objects it waits on (a field or label
//! selector narrows them), so a wait ends when the change happens rather
//! than on the next tick, and a quiet wait costs one watch instead of a GET
//! per tick. A slow tick still looks now and then (a watch that went quiet
//! without closing). Where the objects cannot be watched (RBAC without
//! `watch`, a proxy that cuts long requests, a watch that breaks) it polls
//! every `every`, as before, and says so once at debug level.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use super::KubeError;

/// With a watch, look again at least this often anyway.
const QUIET_TICK: Duration = Duration::from_secs(5);

/// What a watch-driven wait watches.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    /// `metadata.name=NAME`, and other field selectors.
    pub fields: Option<String>,
    /// A label selector (`app=etcd`).
    pub labels: Option<String>,
}

impl Watched {
    /// The one object `name`.
    pub fn named(name: &str) -> Self {
        Watched { fields: Some(format!("metadata.name={name}")), labels: None }
    }

    /// The objects with these labels.
    pub fn labelled(selector: &str) -> Self {
        Watched { fields: None, labels: Some(selector.to_string()) }
    }

    fn config(&self) -> watcher::Config {
        let mut config = watcher::Config::default();
        if let Some(fields) = &self.fields {
            config = config.fields(fields);
        }
        if let Some(labels) = &self.labels {
            config = config.labels(labels);
        }
        config
    }
}

/// Run `check` now and again whenever a watch of `watched` in `api` sees a
/// change, until it returns `Some`, or fail after `timeout`; polls every
/// `every` where the objects cannot be watched.
pub async fn wait_watching<K, T, F, Fut>(api: &Api<K>, watched: Watched, what: &str, timeout: Duration, every: Duration, mut check: F) -> Result<T, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, KubeError>>,
{
    let deadline = Instant::now() + timeout;
    let mut events = Some(watcher(api.clone(), watched.config()).boxed());
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(KubeError::Timeout { what: what.to_string(), seconds: timeout.as_secs() });
        }
        match events.as_mut() {
            Some(stream) => match tokio::time::timeout(left.min(QUIET_TICK), stream.next()).await {
                // something changed (or the watch's first listing): look again
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(err))) => {
                    tracing::debug!(what, error = %err, "cannot watch; polling instead");
                    events = None;
                }
                Ok(None) => events = None,
                // quiet: look anyway
                Err(_) => {}
            },
            None => tokio::time::sleep(every.min(left)).await,
        }
    }
}
