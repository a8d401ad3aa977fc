//! The watch verb: newline-delimited JSON events (ADDED, MODIFIED, DELETED,
//! BOOKMARK, ERROR) streamed from an etcd watch on the collection's key prefix.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use etcd_client::{EventType, WatchOptions};
use futures::SinkExt as _;
use serde_json::{Value, json};

use super::Inner;
use super::ops::{ListQuery, store_err};
use super::resources::ResourceType;
use super::status::ApiError;
use super::store::decode;
use super::table;

/// How often an idle watch asks etcd for progress (the source of BOOKMARK events).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// Parameters of one watch request.
pub(crate) struct WatchParams {
    pub rt: Arc<ResourceType>,
    pub ns: Option<String>,
    pub query: ListQuery,
    pub timeout: Option<Duration>,
    pub bookmarks: bool,
    pub table: bool,
}

type Tx = futures::channel::mpsc::Sender<Result<Bytes, Infallible>>;

fn frame(kind: &str, object: Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

struct Emitter {
    inner: Arc<Inner>,
    p: WatchParams,
    tx: Tx,
}

impl Emitter {
    fn matches(&self, obj: &Value) -> bool {
        self.p.query.labels.matches(obj)
            && self
                .p
                .query
                .fields
                .matches(obj, &self.p.rt.kind, self.p.rt.is_builtin())
    }

    fn in_scope(&self, key: &str, prefix: &str) -> bool {
        // cluster-scoped collections must not see deeper keys
        self.p.rt.namespaced || !key[prefix.len().min(key.len())..].contains('/')
    }

    async fn send(&mut self, kind: &str, obj: Value) -> bool {
        let obj = if self.p.table && kind != "ERROR" && kind != "BOOKMARK" {
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
            table::to_table(&self.p.rt, std::slice::from_ref(&obj), rv, None)
        } else {
            obj
        };
        self.tx.send(Ok(frame(kind, obj))).await.is_ok()
    }
}

/// Start a watch; the response streams until timeout, shutdown, error or client disconnect.
pub(crate) async fn watch(inner: Arc<Inner>, p: WatchParams) -> Result<Response, ApiError> {
    let prefix = inner.store.collection_prefix(&p.rt, p.ns.as_deref());
    let rv = p.query.resource_version.clone().unwrap_or_default();
    let mut initial = Vec::new();
    let start = if rv.is_empty() || rv == "0" {
        let page = inner.store.list_all(&prefix).await.map_err(store_err)?;
        for s in page.items {
            initial.push(s);
        }
        page.revision + 1
    } else {
        let n: i64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version \"{rv}\"")))?;
        n + 1
    };
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, Infallible>>(64);
    let mut client = inner.store.watch_client();
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(start)
        .with_prev_key()
        .with_progress_notify();
    let stream = client
        .watch(prefix.clone(), Some(opts))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut em = Emitter {
        inner: inner.clone(),
        p,
        tx,
    };
    tokio::spawn(async move {
        for s in initial {
            if !em.in_scope(&s.key, &prefix) {
                continue;
            }
            let obj = em.inner.to_client(&em.p.rt, s.obj);
            if em.matches(&obj) && !em.send("ADDED", obj).await {
                return;
            }
        }
        pump(&mut em, stream, &prefix, start - 1).await;
    });
    Ok(Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(Body::from_stream(rx))
        .unwrap_or_default())
}

async fn pump(em: &mut Emitter, stream: etcd_client::WatchStream, prefix: &str, requested: i64) {
    let (mut sender, mut responses) = stream.split();
    let mut shutdown = em.inner.shutdown.clone();
    let deadline = em.p.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ticker = tokio::time::interval(PROGRESS_INTERVAL);
    ticker.tick().await;
    loop {
        let sleep_until = deadline
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400 * 365));
        let msg = tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep_until(sleep_until) => return,
            _ = ticker.tick() => {
                if em.tx.is_closed() {
                    return;
                }
                if em.p.bookmarks {
                    let _ = sender.request_progress().await;
                }
                continue;
            }
            m = responses.message() => m,
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                let st = ApiError::internal(format!("watch on etcd failed: {e}")).to_status();
                let _ = em.send("ERROR", st).await;
                return;
            }
        };
        if resp.compact_revision() > 0 || resp.canceled() {
            let st = ApiError::gone(format!(
                "too old resource version: {} ({})",
                requested,
                resp.compact_revision()
            ))
            .to_status();
            let _ = em.send("ERROR", st).await;
            return;
        }
        if resp.events().is_empty() {
            if em.p.bookmarks
                && !resp.created()
                && let Some(h) = resp.header()
            {
                let obj = json!({"kind": em.p.rt.kind, "apiVersion": em.p.rt.api_version(),
                    "metadata": {"resourceVersion": h.revision().to_string()}});
                if !em.send("BOOKMARK", obj).await {
                    return;
                }
            }
            continue;
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).to_string();
            if !em.in_scope(&key, prefix) {
                continue;
            }
            let prev = ev
                .prev_kv()
                .and_then(|p| decode(&key, p.value(), p.mod_revision()).ok())
                .map(|s| em.inner.to_client(&em.p.rt, s.obj));
            let old_match = prev.as_ref().is_some_and(|o| em.matches(o));
            let (kind, obj) = match ev.event_type() {
                EventType::Put => {
                    let Ok(s) = decode(&key, kv.value(), kv.mod_revision()) else {
                        continue;
                    };
                    let obj = em.inner.to_client(&em.p.rt, s.obj);
                    let new_match = em.matches(&obj);
                    match (old_match, new_match) {
                        (true, true) => ("MODIFIED", obj),
                        (false, true) => ("ADDED", obj),
                        (true, false) => ("DELETED", obj),
                        (false, false) => continue,
                    }
                }
                EventType::Delete => {
                    let Some(mut obj) = prev else { continue };
                    if !old_match {
                        continue;
                    }
                    super::store::set_rv(&mut obj, kv.mod_revision());
                    ("DELETED", obj)
                }
            };
            if !em.send(kind, obj).await {
                return;
            }
        }
    }
}
