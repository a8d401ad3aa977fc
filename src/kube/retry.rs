//! Retries of Kubernetes API requests, for a slow or flapping API server.
//!
//! Every request hcp-dr sends goes through [`RetryLayer`]:
//! - 429 and 503 (the API server's max-in-flight and unavailable answers),
//!   and any 5xx with `Retry-After`, mean the request was not processed:
//!   it is sent again, after `Retry-After` (capped) or the backoff.
//! - other 5xx (500, 502, 504), connection resets, refused connections and
//!   requests with no answer within [`Retry::attempt_timeout`] are sent
//!   again too. For a create (POST) that may have been applied before its
//!   answer was lost, an `AlreadyExists` on the retry is resolved by reading
//!   the object: when it holds everything the create sent, it is the
//!   create's own result and is returned as such.
//! - the backoff is exponential (200 ms doubling, capped at 5 s) with
//!   jitter, and a request gives up after [`Retry::max_attempts`] or once
//!   the next wait would pass [`Retry::budget`]: an unreachable API server
//!   fails in about 30 s, never minutes.
//! - TLS certificate errors and every 4xx but 429 are answered at once.
//!
//! Watches and upgraded connections (port-forward) are retried when they
//! fail to start, without the per-attempt timeout.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use kube::client::Body;
use serde_json::Value;
use tower::{BoxError, Layer, Service};

/// How hard a request is retried.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// No retry starts once this has passed since the first attempt.
    pub budget: Duration,
    /// How long one attempt waits for the response headers (not for
    /// watches or upgraded connections).
    pub attempt_timeout: Duration,
    /// The first backoff; it doubles up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// The longest `Retry-After` honoured.
    pub max_retry_after: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            max_attempts: 8,
            budget: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(60),
            first_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(10),
        }
    }
}

impl Retry {
    /// The wait before attempt `attempt + 1` (`attempt` from 1): exponential
    /// with jitter in [50 %, 100 %] of the step.
    fn backoff(&self, attempt: u32) -> Duration {
        crate::duration::backoff(self.first_backoff, self.max_backoff, attempt)
    }
}

pub struct RetryLayer(pub Retry);

impl<S> Layer<S> for RetryLayer {
    type Service = RetryService<S>;
    fn layer(&self, inner: S) -> RetryService<S> {
        RetryService { inner: std::sync::Arc::new(std::sync::Mutex::new(inner)), policy: self.0 }
    }
}

/// The stack below is shared by the attempts of every request (it is a
/// boxed service, not `Clone`); it is locked only to start a call.
pub struct RetryService<S> {
    inner: std::sync::Arc<std::sync::Mutex<S>>,
    policy: Retry,
}

/// Start one call on the shared stack once it is ready.
async fn send<S, B>(inner: &std::sync::Mutex<S>, req: Request<Body>) -> Result<S::Future, BoxError>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
{
    let lock = || inner.lock().unwrap_or_else(|p| p.into_inner());
    futures::future::poll_fn(|cx| lock().poll_ready(cx)).await.map_err(Into::into)?;
    Ok(lock().call(req))
}

/// What one answer means for the next attempt.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Done,
    /// Send again after this (from `Retry-After`) or the backoff.
    Again(Option<Duration>),
}

fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

fn judge_status(status: StatusCode, headers: &http::HeaderMap) -> Verdict {
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Verdict::Again(retry_after(headers)),
        s if s.is_server_error() => Verdict::Again(retry_after(headers)),
        _ => Verdict::Done,
    }
}

/// A transport error worth another attempt: anything but a certificate
/// the client refuses (that will not change by trying again).
fn transient(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut chain = String::new();
    let mut e: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cur) = e {
        chain.push_str(&cur.to_string());
        chain.push(' ');
        e = cur.source();
    }
    let chain = chain.to_ascii_lowercase();
    !(chain.contains("certificate") || chain.contains("unknownissuer") || chain.contains("invalid peer") || chain.contains("invaliddnsname"))
}

fn long_lived(req: &Request<Body>) -> bool {
    let query = req.uri().query().unwrap_or_default();
    query.split('&').any(|p| p == "watch=true" || p == "watch=1" || p == "follow=true")
        || req.headers().contains_key(http::header::UPGRADE)
        || req.uri().path().ends_with("/portforward")
        || req.uri().path().ends_with("/exec")
        || req.uri().path().ends_with("/attach")
}

fn copy_request(req: &Request<Body>) -> Option<Request<Body>> {
    let body = req.body().try_clone()?;
    let mut copy = Request::builder().method(req.method().clone()).uri(req.uri().clone()).version(req.version()).body(body).ok()?;
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

/// Whether `have` holds every field of `want` with the same value
/// (metadata the server sets aside). What a real server adds is allowed:
/// fields (defaults), elements appended to a list (a Pod's service-account
/// token volume and its mount, added by admission), and a Secret's
/// `stringData` folded into `data`.
fn holds(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w.iter().all(|(k, wv)| {
            matches!(k.as_str(), "resourceVersion" | "creationTimestamp" | "managedFields" | "uid" | "generation" | "status")
                || h.get(k).is_some_and(|hv| holds(hv, wv))
                || (k == "stringData" && folded_into_data(h.get("data"), wv))
        }),
        (Value::Array(h), Value::Array(w)) => h.len() >= w.len() && w.iter().zip(h).all(|(wv, hv)| holds(hv, wv)),
        (h, w) => h == w,
    }
}

/// Whether every `stringData` entry is in `data`, base64-encoded, as the
/// server stores it.
fn folded_into_data(data: Option<&Value>, string_data: &Value) -> bool {
    use base64::Engine;
    let Some(entries) = string_data.as_object() else { return false };
    entries.iter().all(|(k, v)| {
        let stored = data.and_then(|d| d.get(k)).and_then(Value::as_str);
        let decoded = stored.and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok());
        decoded.as_deref() == v.as_str().map(str::as_bytes)
    })
}

impl<S, B> Service<Request<Body>> for RetryService<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    /// The server's body, or (a retried create that found its own object)
    /// the object read back.
    type Response = Response<Either<B, Full<Bytes>>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    /// Readiness is awaited per attempt, in [`send`].
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let policy = self.policy;
        Box::pin(async move {
            let long_lived = long_lived(&req);
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            // only a create needs what it sent kept (to know its own object)
            let body = if method == Method::POST { req.body().try_clone() } else { None };
            let create = match body {
                Some(body) => {
                    let (uri, headers) = (req.uri().to_string(), req.headers().clone());
                    body.collect().await.ok().map(|b| Create { uri, headers, body: b.to_bytes() })
                }
                None => None,
            };
            let started = Instant::now();
            let mut req = req;
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                let again = copy_request(&req);
                let call = send(&inner, req).await?;
                let result: Result<Response<B>, BoxError> = if long_lived {
                    call.await.map_err(Into::into)
                } else {
                    match tokio::time::timeout(policy.attempt_timeout, call).await {
                        Ok(r) => r.map_err(Into::into),
                        Err(_) => Err(format!("no answer within {}s", policy.attempt_timeout.as_secs()).into()),
                    }
                };
                let (verdict, what) = match &result {
                    Ok(resp) => (judge_status(resp.status(), resp.headers()), resp.status().to_string()),
                    Err(err) if transient(err.as_ref()) => (Verdict::Again(None), err.to_string()),
                    Err(_) => (Verdict::Done, String::new()),
                };
                // A create retried after its answer was lost may have been applied.
                if let (Ok(resp), Some(create)) = (&result, &create)
                    && resp.status() == StatusCode::CONFLICT
                    && attempt > 1
                    && let Some(own) = own_create(&inner, &path, create).await
                {
                    return Ok(own.map(Either::Right));
                }
                let Verdict::Again(after) = verdict else { return result.map(|r| r.map(Either::Left)) };
                let wait = after.map(|a| a.min(policy.max_retry_after)).unwrap_or_else(|| policy.backoff(attempt));
                let Some(copy) = again.filter(|_| attempt < policy.max_attempts && started.elapsed() + wait <= policy.budget) else {
                    if attempt > 1 {
                        tracing::warn!(%method, %path, attempts = attempt, "Kubernetes API request failed after retries: {what}");
                    }
                    return result.map(|r| r.map(Either::Left));
                };
                tracing::info!(%method, %path, attempt, wait_ms = wait.as_millis() as u64, "Kubernetes API request answered {what}; retrying");
                drop(result);
                tokio::time::sleep(wait).await;
                req = copy;
            }
        })
    }
}

/// What a create (POST) sent: kept to recognise its own object when a
/// retry meets `AlreadyExists`.
struct Create {
    uri: String,
    headers: http::HeaderMap,
    body: Bytes,
}

/// After a retried create answered `AlreadyExists`: read the object, and
/// when it holds everything the create sent, answer with it (the earlier
/// attempt created it). `None`: someone else's object, or unreadable.
async fn own_create<S, B>(inner: &std::sync::Mutex<S>, path: &str, create: &Create) -> Option<Response<Full<Bytes>>>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let sent: Value = serde_json::from_slice(&create.body).ok()?;
    let name = sent.pointer("/metadata/name")?.as_str()?;
    let uri = format!("{}/{name}", create.uri.split('?').next()?.trim_end_matches('/'));
    let mut get = Request::builder().method(Method::GET).uri(uri).body(Body::empty()).ok()?;
    for (k, v) in &create.headers {
        if k != http::header::CONTENT_TYPE && k != http::header::CONTENT_LENGTH {
            get.headers_mut().insert(k.clone(), v.clone());
        }
    }
    let resp = send(inner, get).await.ok()?.await.map_err(Into::into).ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.ok()?.to_bytes();
    let have: Value = serde_json::from_slice(&bytes).ok()?;
    if !holds(&have, &sent) {
        return None;
    }
    tracing::info!(%path, name, "a retried create found its own object: the earlier attempt had created it");
    // a create answers 201 Created with the object
    let mut created = Response::from_parts(parts, Full::new(bytes));
    *created.status_mut() = StatusCode::CREATED;
    Some(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn overload_answers_are_retried_after_their_retry_after() {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(judge_status(StatusCode::TOO_MANY_REQUESTS, &h), Verdict::Again(Some(Duration::from_secs(3))));
        assert_eq!(judge_status(StatusCode::SERVICE_UNAVAILABLE, &http::HeaderMap::new()), Verdict::Again(None));
        assert_eq!(judge_status(StatusCode::INTERNAL_SERVER_ERROR, &http::HeaderMap::new()), Verdict::Again(None));
        for done in [StatusCode::OK, StatusCode::CONFLICT, StatusCode::NOT_FOUND, StatusCode::FORBIDDEN, StatusCode::UNPROCESSABLE_ENTITY] {
            assert_eq!(judge_status(done, &h), Verdict::Done, "{done}");
        }
    }

    #[test]
    fn the_backoff_grows_is_capped_and_jittered() {
        let r = Retry::default();
        for attempt in 1..=12 {
            let step = r.first_backoff.saturating_mul(1 << (attempt - 1).min(16)).min(r.max_backoff);
            let wait = r.backoff(attempt);
            assert!(wait >= step / 2 && wait <= step, "attempt {attempt}: {wait:?} for a step of {step:?}");
        }
        // the whole budget fits the default attempts with room to spare
        let worst: Duration = (1..r.max_attempts).map(|a| r.first_backoff.saturating_mul(1 << (a - 1)).min(r.max_backoff)).sum();
        assert!(worst < r.budget, "{worst:?}");
    }

    #[test]
    fn a_certificate_error_is_not_retried_a_reset_is() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer");
        assert!(transient(&reset));
        let cert = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert!(!transient(&cert));
    }

    #[test]
    fn an_object_holds_what_its_create_sent_plus_what_the_server_added() {
        let sent = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v"}});
        let stored = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "uid": "u", "resourceVersion": "5", "labels": {"x": "1", "added": "by-server"}}, "data": {"k": "v"}});
        assert!(holds(&stored, &sent));
        let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"x": "2"}}, "data": {"k": "v"}});
        assert!(!holds(&other, &sent));
    }

    /// A Pod as a real server stores it: container defaults, and the
    /// service-account token volume and mount appended by admission.
    #[test]
    fn a_pod_holds_what_was_sent_after_admission_and_defaults() {
        let sent = json!({"metadata": {"name": "etcd-restore"}, "spec": {
            "containers": [{"name": "restore", "image": "etcd:3.5", "volumeMounts": [{"name": "data", "mountPath": "/var/lib"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-etcd-0"}}]}});
        let stored = json!({"metadata": {"name": "etcd-restore", "uid": "u"}, "spec": {
            "containers": [{"name": "restore", "image": "etcd:3.5", "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib"}, {"name": "kube-api-access-x2k9p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-etcd-0"}}, {"name": "kube-api-access-x2k9p", "projected": {"sources": []}}],
            "restartPolicy": "Always"}});
        assert!(holds(&stored, &sent));
        // another pod of that name, with another volume first: not ours
        let other = json!({"metadata": {"name": "etcd-restore"}, "spec": {
            "containers": [{"name": "restore", "image": "etcd:3.5", "volumeMounts": [{"name": "data", "mountPath": "/var/lib"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-etcd-1"}}]}});
        assert!(!holds(&other, &sent));
        // fewer elements than sent: not ours
        let fewer = json!({"metadata": {"name": "etcd-restore"}, "spec": {"containers": [], "volumes": []}});
        assert!(!holds(&fewer, &sent));
    }

    #[test]
    fn a_secrets_string_data_is_found_in_its_data() {
        let sent = json!({"metadata": {"name": "s"}, "type": "Opaque", "stringData": {"url": "https://x/y?sig=1"}});
        let stored = json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"url": "aHR0cHM6Ly94L3k/c2lnPTE="}});
        assert!(holds(&stored, &sent));
        let other = json!({"metadata": {"name": "s"}, "type": "Opaque", "data": {"url": "b3RoZXI="}});
        assert!(!holds(&other, &sent));
    }
}
