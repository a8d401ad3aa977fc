//! HTTP routing: the axum route table of the API paths, authentication and
//! authorization (`authn`, `rbac`) ahead of every route but the health and
//! version endpoints, verb dispatch, content types.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, FromRequestParts, MatchedPath, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Value, json};

use super::Inner;
use super::authn::UserInfo;
use super::discovery;
use super::ops::{DeleteOpts, FieldValidation, ListQuery, PatchType, Sub, WriteOpts, meta_str};
use super::resources::ResourceType;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::table;
use super::watch;

/// Largest request body accepted (etcd's own limit is 1.5 MiB per value).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// The paths of resources below a group version (`/api/v1`, the core
/// group, or `/apis/{group}/{version}`). `namespaces/{namespace}/status`
/// and `.../finalize` are a namespace's subresources ([`ResourcePath`]).
const RESOURCE_ROUTES: [&str; 6] = [
    "/{resource}",
    "/{resource}/{name}",
    "/{resource}/{name}/{subresource}",
    "/namespaces/{namespace}/{resource}",
    "/namespaces/{namespace}/{resource}/{name}",
    "/namespaces/{namespace}/{resource}/{name}/{subresource}",
];

/// The routes, matched against the [`canonical`] path. Every route but the
/// health and version endpoints is behind [`admit`] (authentication,
/// impersonation, authorization), and so is the fallback: a path no route
/// matches is a 404 `Status` to an authorized caller only, as on a
/// kube-apiserver. Every handler takes any method and answers 405 itself.
pub(crate) fn router(inner: Arc<Inner>) -> Router {
    let mut api = Router::new()
        .route("/api", any(api_versions))
        .route("/apis", any(api_group_list))
        .route("/apis/{group}", any(api_group))
        .route("/openapi/v2", any(openapi_v2))
        .route("/openapi/v3", any(openapi_root))
        .route("/openapi/v3/api/v1", any(openapi_group_version))
        .route("/openapi/v3/apis/{group}/{version}", any(openapi_group_version))
        // every path below these is a review (computed, not stored)
        .route("/apis/authentication.k8s.io/v1/{*review}", any(review))
        .route("/apis/authorization.k8s.io/v1/{*review}", any(review));
    for prefix in ["/api/v1", "/apis/{group}/{version}"] {
        api = api.route(prefix, any(resource_list));
        for route in RESOURCE_ROUTES {
            api = api.route(&format!("{prefix}{route}"), any(resource));
        }
    }
    let api = api
        .fallback(no_route)
        .layer(middleware::from_fn_with_state(inner.clone(), admit));
    Router::new()
        .route("/healthz", any(health))
        .route("/readyz", any(health))
        .route("/livez", any(health))
        .route("/version", any(version))
        .merge(api)
        .layer(middleware::from_fn(log))
        .with_state(inner)
}

/// The path as sent, kept by [`canonical`] when it differs from the one routed.
#[derive(Clone)]
struct SentPath(String);

/// The request as the router matches it: its path without empty segments
/// (`/api/v1/pods/` is `/api/v1/pods`, as the emulator always read paths);
/// authorization still sees the path as sent.
pub(crate) fn canonical<B>(mut req: axum::http::Request<B>) -> axum::http::Request<B> {
    let sent = req.uri().path();
    let segments: Vec<&str> = sent.split('/').filter(|s| !s.is_empty()).collect();
    let path = format!("/{}", segments.join("/"));
    if path == sent {
        return req;
    }
    let path_and_query = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let mut parts = req.uri().clone().into_parts();
    let Ok(pq) = path_and_query.parse() else {
        return req;
    };
    parts.path_and_query = Some(pq);
    let Ok(uri) = Uri::from_parts(parts) else {
        return req;
    };
    let sent = SentPath(sent.to_string());
    *req.uri_mut() = uri;
    req.extensions_mut().insert(sent);
    req
}

async fn log(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let resp = next.run(req).await;
    tracing::debug!(%method, %uri, status = resp.status().as_u16(), "api request");
    resp
}

/// The authenticated (and impersonated) caller, for the handlers behind [`admit`].
#[derive(Clone)]
struct Caller(UserInfo);

/// Authenticate, impersonate and authorize the request, and hand its
/// [`Caller`] and query [`Params`] to the route.
async fn admit(State(inner): State<Arc<Inner>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    match caller(&inner, &parts).await {
        Ok((caller, params)) => {
            parts.extensions.insert(caller);
            parts.extensions.insert(params);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(e) => e.into_response(),
    }
}

async fn caller(inner: &Inner, req: &Parts) -> Result<(Caller, Params), ApiError> {
    let user = super::authn::authenticate(inner, &req.headers).await?;
    let user = super::authn::impersonate(inner, user, &req.headers).await?;
    let params = Params(
        Query::<Vec<(String, String)>>::try_from_uri(&req.uri)
            .map(|q| q.0)
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?,
    );
    let path = req
        .extensions
        .get::<SentPath>()
        .map_or(req.uri.path(), |p| p.0.as_str());
    super::rbac::authorize_request(inner, &user, &req.method, path, &params.0, &req.headers)
        .await?;
    Ok((Caller(user), params))
}

/// The parameters of the matched route, segments as sent: axum's own path
/// parameters decode percent-escapes, but objects are named (and
/// authorized, `rbac::Attributes::of_request`) by the segments as sent.
/// A `{*rest}` parameter holds the rest of the path.
struct RouteParams(Vec<(String, String)>);

impl RouteParams {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, v)| v.as_str())
    }

    /// The group and version: `/api/v1` (no parameters) is the core group.
    fn group_version(&self) -> (&str, &str) {
        (
            self.get("group").unwrap_or(""),
            self.get("version").unwrap_or("v1"),
        )
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RouteParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let route = MatchedPath::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::no_route())?;
        let mut sent = parts.uri.path().split('/').filter(|s| !s.is_empty());
        let mut params = Vec::new();
        for segment in route.as_str().split('/').filter(|s| !s.is_empty()) {
            if let Some(name) = segment.strip_prefix("{*").and_then(|s| s.strip_suffix('}')) {
                params.push((name.to_string(), sent.by_ref().collect::<Vec<_>>().join("/")));
                break;
            }
            let value = sent.next().unwrap_or_default();
            if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                params.push((name.to_string(), value.to_string()));
            }
        }
        Ok(RouteParams(params))
    }
}

/// A path of [`RESOURCE_ROUTES`]: what it names, before the resource is resolved.
struct ResourcePath<'a> {
    group: &'a str,
    version: &'a str,
    namespace: Option<&'a str>,
    resource: &'a str,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
}

impl<'a> ResourcePath<'a> {
    fn of(params: &'a RouteParams) -> ResourcePath<'a> {
        let (group, version) = params.group_version();
        let path = ResourcePath {
            group,
            version,
            namespace: params.get("namespace"),
            resource: params.get("resource").unwrap_or(""),
            name: params.get("name"),
            subresource: params.get("subresource"),
        };
        match path {
            // `namespaces/{name}/status` and `namespaces/{name}/finalize`
            // are the namespace's subresources, not a collection in it
            ResourcePath {
                namespace: Some(namespace),
                resource: sub @ ("status" | "finalize"),
                name: None,
                ..
            } => ResourcePath {
                namespace: None,
                resource: "namespaces",
                name: Some(namespace),
                subresource: Some(sub),
                ..path
            },
            path => path,
        }
    }
}

fn json_response(code: StatusCode, v: &Value, warnings: &[String]) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = (code, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(h) = format!("299 - \"{escaped}\"").parse() {
            r.headers_mut().append(header::WARNING, h);
        }
    }
    r
}

fn text(code: StatusCode, s: &'static str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        s,
    )
        .into_response()
}

/// Query parameters, last value wins.
#[derive(Clone)]
struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True"))
    }
}

fn get_only(method: &Method) -> Result<(), ApiError> {
    if method == Method::GET {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed())
    }
}

async fn health() -> Response {
    text(StatusCode::OK, "ok")
}

async fn version() -> Response {
    json_response(StatusCode::OK, &discovery::version(), &[])
}

async fn no_route() -> ApiError {
    ApiError::no_route()
}

/// `/api`.
async fn api_versions(State(inner): State<Arc<Inner>>, method: Method) -> Result<Response, ApiError> {
    get_only(&method)?;
    Ok(json_response(StatusCode::OK, &discovery::api_versions(&inner), &[]))
}

/// `/apis`.
async fn api_group_list(State(inner): State<Arc<Inner>>, method: Method) -> Result<Response, ApiError> {
    get_only(&method)?;
    Ok(json_response(StatusCode::OK, &discovery::api_group_list(&inner), &[]))
}

/// `/apis/{group}`.
async fn api_group(
    State(inner): State<Arc<Inner>>,
    method: Method,
    params: RouteParams,
) -> Result<Response, ApiError> {
    get_only(&method)?;
    let (group, _) = params.group_version();
    let v = discovery::api_group(&inner, group).ok_or_else(ApiError::no_route)?;
    Ok(json_response(StatusCode::OK, &v, &[]))
}

/// `/openapi/v2`: a Swagger 2.0 document without definitions, in protobuf
/// (gnostic's `openapi_v2.Document`, what kubectl asks for) or JSON. kubectl
/// reads it to validate a `v1 List` client-side: with no definitions it
/// skips the items' client-side validation, and the server validates each
/// object as it is created (field validation), as it does for any apply.
async fn openapi_v2(method: Method, headers: axum::http::HeaderMap) -> Result<Response, ApiError> {
    get_only(&method)?;
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if accept.contains("protobuf") {
        let body = discovery::openapi_v2_protobuf();
        return Ok(Response::builder()
            .status(StatusCode::OK)
            .header(axum::http::header::CONTENT_TYPE, "application/octet-stream")
            .body(axum::body::Body::from(body))
            .expect("static response"));
    }
    Ok(json_response(StatusCode::OK, &discovery::openapi_v2_json(), &[]))
}

/// `/openapi/v3`.
async fn openapi_root(State(inner): State<Arc<Inner>>) -> Response {
    json_response(StatusCode::OK, &discovery::openapi_v3_root(&inner), &[])
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/{group}/{version}`.
async fn openapi_group_version(
    State(inner): State<Arc<Inner>>,
    params: RouteParams,
) -> Result<Response, ApiError> {
    let (group, version) = params.group_version();
    let v = discovery::openapi_v3_group_version(&inner, group, version)
        .ok_or_else(ApiError::no_route)?;
    Ok(json_response(StatusCode::OK, &v, &[]))
}

/// `/api/v1`, `/apis/{group}/{version}`: the group version's resources.
async fn resource_list(
    State(inner): State<Arc<Inner>>,
    method: Method,
    params: RouteParams,
) -> Result<Response, ApiError> {
    get_only(&method)?;
    let (group, version) = params.group_version();
    let v = discovery::resource_list(&inner, group, version).ok_or_else(ApiError::no_route)?;
    Ok(json_response(StatusCode::OK, &v, &[]))
}

/// `POST` of a review (SelfSubjectAccessReview, TokenReview, ...): computed, not stored.
async fn review(
    State(inner): State<Arc<Inner>>,
    Extension(Caller(user)): Extension<Caller>,
    params: RouteParams,
    req: Request,
) -> Result<Response, ApiError> {
    let rest: Vec<&str> = params.get("review").unwrap_or("").split('/').collect();
    let (ns, plural) = match rest.as_slice() {
        [plural] => (None, *plural),
        ["namespaces", ns, plural] => (Some(*ns), *plural),
        _ => return Err(ApiError::no_route()),
    };
    if !super::rbac::REVIEWS.iter().any(|r| r.1 == plural) {
        return Err(ApiError::no_route());
    }
    if req.method() != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    let headers = req.headers().clone();
    let body = read_body(req.into_body()).await?;
    let obj = decode_body(&headers, &body)?;
    super::rbac::review(&inner, &user, plural, ns, obj).await
}

fn write_opts(params: &Params, headers: &HeaderMap) -> Result<WriteOpts, ApiError> {
    let dry_run = match params.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "DeleteOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{{\"{other}\"}}: supported values: \"All\""
                ),
            ));
        }
    };
    let validation = match params.get("fieldValidation") {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
            )));
        }
    };
    let manager = match params.get("fieldManager") {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string(),
    };
    Ok(WriteOpts {
        dry_run,
        manager,
        validation,
    })
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.split(';').next().unwrap_or("").trim().to_lowercase())
        .unwrap_or_default()
}

fn decode_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let ct = content_type(headers);
    match ct.as_str() {
        "" | "application/json" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        }),
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            serde_saphyr::from_str::<Value>(&String::from_utf8_lossy(body)).map_err(|e| {
                ApiError::bad_request(format!(
                    "the body of the request could not be decoded as YAML: {e}"
                ))
            })
        }
        other => Err(ApiError::unsupported_media_type(
            other,
            &["application/json", "application/yaml"],
        )),
    }
}

fn list_query(params: &Params, rt: &ResourceType) -> Result<ListQuery, ApiError> {
    let labels = LabelSelector::parse(params.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(params.get("fieldSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    fields
        .check(&rt.kind, rt.is_builtin())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let limit = match params.get("limit") {
        None | Some("") => 0,
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit \"{l}\"")))?
            .max(0),
    };
    let rv_match = params.get("resourceVersionMatch").unwrap_or("");
    if !matches!(rv_match, "" | "Exact" | "NotOlderThan") {
        return Err(ApiError::bad_request(format!(
            "resourceVersionMatch: Unsupported value: \"{rv_match}\""
        )));
    }
    Ok(ListQuery {
        labels,
        fields,
        limit,
        continue_token: params
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        resource_version: params
            .get("resourceVersion")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        exact: rv_match == "Exact",
    })
}

fn delete_opts(params: &Params, body: &Bytes) -> Result<DeleteOpts, ApiError> {
    let mut d = DeleteOpts {
        dry_run: params.get("dryRun") == Some("All"),
        ..Default::default()
    };
    if let Some(p) = params.get("propagationPolicy") {
        d.propagation = Some(p.to_string());
    }
    if let Some(o) = params.get("orphanDependents") {
        d.propagation = Some(if o == "true" {
            "Orphan".into()
        } else {
            "Background".into()
        });
    }
    if !body.is_empty() {
        let v: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as DeleteOptions: {e}"
            ))
        })?;
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            d.propagation = Some(p.to_string());
        }
        if let Some(o) = v.get("orphanDependents").and_then(Value::as_bool) {
            d.propagation = Some(if o {
                "Orphan".into()
            } else {
                "Background".into()
            });
        }
        if let Some(dr) = v.get("dryRun").and_then(Value::as_array) {
            d.dry_run = dr.iter().any(|x| x == "All");
        }
        d.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        d.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(p) = &d.propagation
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""
            ),
        ));
    }
    Ok(d)
}

fn patch_type(headers: &HeaderMap, params: &Params) -> Result<PatchType, ApiError> {
    let ct = content_type(headers);
    Ok(match ct.as_str() {
        "application/merge-patch+json" => PatchType::Merge,
        "application/json-patch+json" => PatchType::Json,
        "application/strategic-merge-patch+json" => PatchType::Strategic,
        "application/apply-patch+yaml" | "application/apply-patch+cbor"
            if ct == "application/apply-patch+yaml" =>
        {
            PatchType::Apply {
                force: params.flag("force"),
            }
        }
        other => {
            return Err(ApiError::unsupported_media_type(
                other,
                &[
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                    "application/strategic-merge-patch+json",
                ],
            ));
        }
    })
}

/// Strip TypeMeta from list items of built-in kinds, as typed upstream lists do.
fn list_value(rt: &ResourceType, items: Vec<Value>, rv: i64, cont: Option<String>) -> Value {
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut o| {
            if rt.is_builtin()
                && let Some(m) = o.as_object_mut()
            {
                m.remove("apiVersion");
                m.remove("kind");
            }
            o
        })
        .collect();
    let mut md = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        md["continue"] = json!(c);
    }
    json!({"apiVersion": rt.api_version(), "kind": rt.list_kind, "metadata": md, "items": items})
}

async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("request body could not be read: {e}"),
        )
    })
}

/// A path of [`RESOURCE_ROUTES`]: a collection, an object or its subresource.
async fn resource(
    State(inner): State<Arc<Inner>>,
    Extension(ref params): Extension<Params>,
    route: RouteParams,
    req: Request,
) -> Result<Response, ApiError> {
    let path = ResourcePath::of(&route);
    let rt = inner
        .resolve(path.group, path.version, path.resource)
        .ok_or_else(ApiError::no_route)?;
    let name = path.name.map(str::to_string);
    let sub = path.subresource;
    let ns = path.namespace;
    if ns.is_some() && !rt.namespaced {
        return Err(ApiError::no_route());
    }
    if rt.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    let method = req.method().clone();
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let want_table = table::wants_table(&accept);

    if sub == Some("token")
        && rt.is_builtin()
        && rt.group.is_empty()
        && rt.plural == "serviceaccounts"
    {
        let (Some(name), Some(ns)) = (name.as_deref(), ns) else {
            return Err(ApiError::no_route());
        };
        if method != Method::POST {
            return Err(ApiError::method_not_allowed());
        }
        let headers = req.headers().clone();
        let body = read_body(req.into_body()).await?;
        let obj = decode_body(&headers, &body)?;
        return super::authn::token_request(&inner, ns, name, &obj).await;
    }

    if sub == Some("portforward") && rt.is_builtin() && rt.group.is_empty() && rt.plural == "pods" {
        let Some(name) = name.as_deref() else {
            return Err(ApiError::no_route());
        };
        return port_forward(&inner, &rt, ns, name, req).await;
    }

    let headers = req.headers().clone();
    let body = read_body(req.into_body()).await?;

    let Some(name) = name else {
        // collection
        return match method {
            Method::GET => {
                let q = list_query(params, &rt)?;
                if params.get("sendInitialEvents").is_some() {
                    // the emulator answers as a 1.31 server with the WatchList feature gate off
                    return Err(ApiError::invalid(
                        "meta.k8s.io",
                        "ListOptions",
                        "",
                        &[super::status::field_error(
                            super::schema::FieldErrorKind::Forbidden,
                            "sendInitialEvents",
                            "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                        )],
                    ));
                }
                if params.flag("watch") {
                    let timeout = params
                        .get("timeoutSeconds")
                        .and_then(|t| t.parse::<u64>().ok())
                        .filter(|t| *t > 0)
                        .map(Duration::from_secs);
                    let p = watch::WatchParams {
                        rt: rt.clone(),
                        ns: ns.map(str::to_string),
                        query: q,
                        timeout,
                        bookmarks: params.flag("allowWatchBookmarks"),
                        table: want_table,
                    };
                    return watch::watch(inner.clone(), p).await;
                }
                let (items, rv, cont) = inner.list_objects(&rt, ns, &q).await?;
                if want_table {
                    return Ok(json_response(
                        StatusCode::OK,
                        &table::to_table(&rt, &items, Some(rv.to_string()), cont),
                        &[],
                    ));
                }
                Ok(json_response(
                    StatusCode::OK,
                    &list_value(&rt, items, rv, cont),
                    &[],
                ))
            }
            Method::POST => {
                if rt.namespaced && ns.is_none() {
                    return Err(ApiError::method_not_allowed());
                }
                let o = write_opts(params, &headers)?;
                let obj = decode_body(&headers, &body)?;
                let out = inner.create(&rt, ns, obj, &o).await?;
                Ok(json_response(
                    StatusCode::CREATED,
                    &inner.to_client(&rt, out.obj),
                    &out.warnings,
                ))
            }
            Method::DELETE => {
                let q = list_query(params, &rt)?;
                let d = delete_opts(params, &body)?;
                let (items, _, _) = inner.list_objects(&rt, ns, &q).await?;
                let mut deleted = Vec::new();
                for it in items {
                    let n = meta_str(&it, "name").to_string();
                    let its_ns = meta_str(&it, "namespace").to_string();
                    let its_ns = if rt.namespaced { Some(its_ns) } else { None };
                    match inner.delete(&rt, its_ns.as_deref(), &n, &d).await {
                        Ok(o) => deleted.push(o),
                        Err(e) if e.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
                let rv = inner
                    .store
                    .revision()
                    .await
                    .map_err(super::ops::store_err)?;
                Ok(json_response(
                    StatusCode::OK,
                    &list_value(&rt, deleted, rv, None),
                    &[],
                ))
            }
            _ => Err(ApiError::method_not_allowed()),
        };
    };

    match sub {
        None => match method {
            Method::GET => {
                let obj = inner.get_object(&rt, ns, &name).await?;
                if want_table {
                    let rv = obj
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    return Ok(json_response(
                        StatusCode::OK,
                        &table::to_table(&rt, &[obj], rv, None),
                        &[],
                    ));
                }
                Ok(json_response(StatusCode::OK, &obj, &[]))
            }
            Method::PUT => {
                let o = write_opts(params, &headers)?;
                let obj = decode_body(&headers, &body)?;
                let out = inner.update(&rt, ns, &name, obj, Sub::Main, &o).await?;
                Ok(json_response(
                    StatusCode::OK,
                    &inner.to_client(&rt, out.obj),
                    &out.warnings,
                ))
            }
            Method::PATCH => {
                let o = write_opts(params, &headers)?;
                let pt = patch_type(&headers, params)?;
                if matches!(pt, PatchType::Apply { .. })
                    && params.get("fieldManager").is_none_or(str::is_empty)
                {
                    return Err(ApiError::bad_request(
                        "PATCH, application/apply-patch+yaml requests must include fieldManager",
                    ));
                }
                let existed = inner.get_stored(&rt, ns, &name).await.is_ok();
                let out = inner
                    .patch(&rt, ns, &name, &pt, &body, Sub::Main, &o)
                    .await?;
                let code = if !existed && matches!(pt, PatchType::Apply { .. }) {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                };
                Ok(json_response(
                    code,
                    &inner.to_client(&rt, out.obj),
                    &out.warnings,
                ))
            }
            Method::DELETE => {
                let d = delete_opts(params, &body)?;
                let obj = inner.delete(&rt, ns, &name, &d).await?;
                Ok(json_response(StatusCode::OK, &obj, &[]))
            }
            _ => Err(ApiError::method_not_allowed()),
        },
        Some("status") if rt.status_subresource => match method {
            Method::GET => Ok(json_response(
                StatusCode::OK,
                &inner.get_object(&rt, ns, &name).await?,
                &[],
            )),
            Method::PUT => {
                let o = write_opts(params, &headers)?;
                let obj = decode_body(&headers, &body)?;
                let out = inner.update(&rt, ns, &name, obj, Sub::Status, &o).await?;
                Ok(json_response(
                    StatusCode::OK,
                    &inner.to_client(&rt, out.obj),
                    &out.warnings,
                ))
            }
            Method::PATCH => {
                let o = write_opts(params, &headers)?;
                let pt = patch_type(&headers, params)?;
                let out = inner
                    .patch(&rt, ns, &name, &pt, &body, Sub::Status, &o)
                    .await?;
                Ok(json_response(
                    StatusCode::OK,
                    &inner.to_client(&rt, out.obj),
                    &out.warnings,
                ))
            }
            _ => Err(ApiError::method_not_allowed()),
        },
        Some("scale") if rt.scale.is_some() => {
            let o = write_opts(params, &headers)?;
            match method {
                Method::GET => {
                    let obj = inner.get_object(&rt, ns, &name).await?;
                    Ok(json_response(
                        StatusCode::OK,
                        &inner.to_scale(&rt, &obj)?,
                        &[],
                    ))
                }
                Method::PUT => {
                    let wanted = decode_body(&headers, &body)?;
                    let body_name = meta_str(&wanted, "name");
                    if !body_name.is_empty() && body_name != name {
                        return Err(ApiError::bad_request(format!(
                            "the name of the object ({body_name}) does not match the name on the URL ({name})"
                        )));
                    }
                    let f = move |_cur: &Value| Ok(wanted.clone());
                    let v = inner.scale_write(&rt, ns, &name, &o, &f).await?;
                    Ok(json_response(StatusCode::OK, &v, &[]))
                }
                Method::PATCH => {
                    let pt = patch_type(&headers, params)?;
                    let doc = super::ops::parse_patch_body(&pt, &body)?;
                    let f = move |cur: &Value| -> Result<Value, ApiError> {
                        let mut t = cur.clone();
                        match &pt {
                            PatchType::Merge | PatchType::Apply { .. } => {
                                super::patch::merge_patch(&mut t, &doc)
                            }
                            PatchType::Json => super::patch::json_patch(&mut t, &doc)
                                .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?,
                            PatchType::Strategic => {
                                super::patch::strategic_merge_patch(&mut t, &doc, "Scale")
                                    .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?
                            }
                        }
                        // a patch that does not mention resourceVersion is unconditional
                        let mentions_rv = doc.pointer("/metadata/resourceVersion").is_some()
                            || doc.as_array().is_some_and(|ops| {
                                ops.iter().any(|op| {
                                    op.get("path").and_then(Value::as_str)
                                        == Some("/metadata/resourceVersion")
                                })
                            });
                        if !mentions_rv
                            && let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            m.remove("resourceVersion");
                        }
                        Ok(t)
                    };
                    let v = inner.scale_write(&rt, ns, &name, &o, &f).await?;
                    Ok(json_response(StatusCode::OK, &v, &[]))
                }
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        Some("finalize") if rt.group.is_empty() && rt.plural == "namespaces" => {
            if method != Method::PUT {
                return Err(ApiError::method_not_allowed());
            }
            let wanted = decode_body(&headers, &body)?;
            let out = inner.finalize_namespace(&name, &wanted).await?;
            Ok(json_response(StatusCode::OK, &out, &[]))
        }
        _ => Err(ApiError::no_route()),
    }
}

/// `pods/<name>/portforward`: websocket upgrade to the pod's `status.podIP`.
async fn port_forward(
    inner: &Arc<Inner>,
    rt: &Arc<ResourceType>,
    ns: Option<&str>,
    name: &str,
    req: Request,
) -> Result<Response, ApiError> {
    use axum::extract::FromRequestParts as _;
    use axum::extract::ws::WebSocketUpgrade;
    if req.method() != Method::GET && req.method() != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    let pod = inner.get_object(rt, ns, name).await?;
    let ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!("pod {name} does not have an IP address assigned"))
        })?;
    let ip: std::net::IpAddr = ip
        .parse()
        .map_err(|_| ApiError::bad_request(format!("pod {name} has an invalid podIP \"{ip}\"")))?;
    let ports = super::portforward::parse_ports(req.uri().query().unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    // Only the websocket stream protocols are spoken: refuse SPDY tunnelling
    // (kubectl port-forward) before upgrading rather than after.
    let offered = req
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(str::trim).map(str::to_string).collect::<Vec<_>>())
        .collect::<Vec<_>>();
    if !offered.iter().any(|p| super::portforward::SUBPROTOCOLS.contains(&p.as_str())) {
        return Err(ApiError::bad_request(format!(
            "port-forward: none of the offered stream protocols {offered:?} is supported (supported: {:?}); this emulator speaks the websocket protocol kube-rs uses, not SPDY",
            super::portforward::SUBPROTOCOLS
        )));
    }
    let (mut parts, _body) = req.into_parts();
    let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|_| ApiError::bad_request("Upgrade request required"))?;
    Ok(upgrade
        .protocols(super::portforward::SUBPROTOCOLS)
        .on_upgrade(move |ws| super::portforward::serve(ws, ip, ports)))
}
