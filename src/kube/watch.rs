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
use futures::stream::BoxStream;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher::{self, Event, watcher};
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

/// One item per moment worth a new look: each time the watch's listing is
/// complete (at the start and after it restarts) and on every change after
/// it. The objects of the listing itself are not counted one by one: a wait
/// on them would look once per object before anything changed.
pub type Changes = BoxStream<'static, Result<(), watcher::Error>>;

/// The changes of the objects `watched` in `api`.
pub fn changes<K>(api: &Api<K>, watched: &Watched) -> Changes
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api.clone(), watched.config())
        .filter_map(|event| async move {
            match event {
                Ok(Event::Init | Event::InitApply(_)) => None,
                Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_)) => Some(Ok(())),
                Err(err) => Some(Err(err)),
            }
        })
        .boxed()
}

/// Run `check` now and again whenever a watch of `watched` in `api` sees a
/// change, until it returns `Some`, or fail after `timeout`; polls every
/// `every` where the objects cannot be watched.
pub async fn wait_watching<K, T, F, Fut>(api: &Api<K>, watched: Watched, what: &str, timeout: Duration, every: Duration, check: F) -> Result<T, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, KubeError>>,
{
    wait_on(changes(api, &watched), what, timeout, every, check).await
}

/// Run `check` now and again on every item of `changes` (several watches
/// merged with `futures::stream::select`, say), until it returns `Some`, or
/// fail after `timeout`; polls every `every` once a watch fails.
pub async fn wait_on<T, F, Fut>(changes: Changes, what: &str, timeout: Duration, every: Duration, mut check: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, KubeError>>,
{
    let deadline = Instant::now() + timeout;
    let mut events = Some(changes);
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
                // something changed (or the watch's listing is complete): look again
                Ok(Some(Ok(()))) => {}
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

/// Wait until `check` says yes of the object `name` in `api` (`None`: it
/// does not exist), judged from the object each watch event carries: no
/// GET per event. A quiet watch is looked past with a GET now and then;
/// where the object cannot be watched it is read every `every`.
pub async fn wait_for_object<K, T, F>(api: &Api<K>, name: &str, what: &str, timeout: Duration, every: Duration, mut check: F) -> Result<T, KubeError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(Option<&K>) -> Option<T>,
{
    let deadline = Instant::now() + timeout;
    let mut events = Some(watcher(api.clone(), Watched::named(name).config()).boxed());
    let mut listed: Option<K> = None;
    let read = || async { api.get_opt(name).await.map_err(super::request(format!("reading {name} ({what})"))) };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = match events.as_mut() {
            Some(stream) => match tokio::time::timeout(left.min(QUIET_TICK), stream.next()).await {
                Ok(Some(Ok(Event::Init))) => {
                    listed = None;
                    None
                }
                Ok(Some(Ok(Event::InitApply(object)))) => {
                    listed = Some(object);
                    None
                }
                Ok(Some(Ok(Event::InitDone))) => Some(listed.take()),
                Ok(Some(Ok(Event::Apply(object)))) => Some(Some(object)),
                Ok(Some(Ok(Event::Delete(_)))) => Some(None),
                Ok(Some(Err(err))) => {
                    tracing::debug!(what, error = %err, "cannot watch; polling instead");
                    events = None;
                    Some(read().await?)
                }
                Ok(None) => {
                    events = None;
                    None
                }
                // quiet: look anyway
                Err(_) => Some(read().await?),
            },
            None => {
                let object = read().await?;
                if let Some(value) = check(object.as_ref()) {
                    return Ok(value);
                }
                tokio::time::sleep(every.min(left)).await;
                None
            }
        };
        if let Some(object) = seen
            && let Some(value) = check(object.as_ref())
        {
            return Ok(value);
        }
        if deadline.saturating_duration_since(Instant::now()).is_zero() {
            return Err(KubeError::Timeout { what: what.to_string(), seconds: timeout.as_secs() });
        }
    }
}
