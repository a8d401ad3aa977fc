//! HTTP routing: authentication and authorization (`authn`, `rbac`), URL
//! parsing, verb dispatch, content types.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Inner;
use super::discovery;
use super::ops::{DeleteOpts, FieldValidation, ListQuery, PatchType, Sub, WriteOpts, meta_str};
use super::resources::ResourceType;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::table;
use super::watch;

/// Largest request body accepted (etcd's own limit is 1.5 MiB per value).
const MAX_BODY: usize = 16 * 1024 * 1024;

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new().fallback(dispatch).with_state(inner)
}

async fn dispatch(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let resp = match handle(inner, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    tracing::debug!(%method, %uri, status = resp.status().as_u16(), "api request");
    resp
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

async fn handle(inner: Arc<Inner>, req: Request) -> Result<Response, ApiError> {
    let path = req.uri().path().to_string();
    match path.as_str() {
        "/healthz" | "/readyz" | "/livez" | "/healthz/" | "/readyz/" | "/livez/" => {
            return Ok(text(StatusCode::OK, "ok"));
        }
        "/version" | "/version/" => {
            return Ok(json_response(StatusCode::OK, &discovery::version(), &[]));
        }
        _ => {}
    }
    let user = super::authn::authenticate(&inner, req.headers()).await?;
    let user = super::authn::impersonate(&inner, user, req.headers()).await?;
    let params = Params(
        Query::<Vec<(String, String)>>::try_from_uri(req.uri())
            .map(|q| q.0)
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?,
    );
    super::rbac::authorize_request(&inner, &user, req.method(), &path, &params.0, req.headers())
        .await?;
    let segs: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let get_only = |m: &Method| {
        if m == Method::GET {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed())
        }
    };
    match s.as_slice() {
        ["api"] => {
            get_only(req.method())?;
            Ok(json_response(
                StatusCode::OK,
                &discovery::api_versions(&inner),
                &[],
            ))
        }
        ["apis"] => {
            get_only(req.method())?;
            Ok(json_response(
                StatusCode::OK,
                &discovery::api_group_list(&inner),
                &[],
            ))
        }
        ["apis", g] => {
            get_only(req.method())?;
            let v = discovery::api_group(&inner, g).ok_or_else(ApiError::no_route)?;
            Ok(json_response(StatusCode::OK, &v, &[]))
        }
        ["openapi", "v3"] => Ok(json_response(
            StatusCode::OK,
            &discovery::openapi_v3_root(&inner),
            &[],
        )),
        ["openapi", "v3", "api", "v1"] => {
            let v = discovery::openapi_v3_group_version(&inner, "", "v1")
                .ok_or_else(ApiError::no_route)?;
            Ok(json_response(StatusCode::OK, &v, &[]))
        }
        ["openapi", "v3", "apis", g, v] => {
            let d =
                discovery::openapi_v3_group_version(&inner, g, v).ok_or_else(ApiError::no_route)?;
            Ok(json_response(StatusCode::OK, &d, &[]))
        }
        ["api", "v1", rest @ ..] => resource_request(inner, req, &params, "", "v1", rest).await,
        [
            "apis",
            "authentication.k8s.io" | "authorization.k8s.io",
            "v1",
            rest @ ..,
        ] if !rest.is_empty() => review_request(&inner, &user, rest, req).await,
        ["apis", g, v, rest @ ..] => resource_request(inner, req, &params, g, v, rest).await,
        _ => Err(ApiError::no_route()),
    }
}

/// `POST` of a review (SelfSubjectAccessReview, TokenReview, ...): computed, not stored.
async fn review_request(
    inner: &Inner,
    user: &super::authn::UserInfo,
    rest: &[&str],
    req: Request,
) -> Result<Response, ApiError> {
    let (ns, plural) = match rest {
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
    super::rbac::review(inner, user, plural, ns, obj).await
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

async fn resource_request(
    inner: Arc<Inner>,
    req: Request,
    params: &Params,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response, ApiError> {
    if rest.is_empty() {
        if req.method() != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
        let v = discovery::resource_list(&inner, group, version).ok_or_else(ApiError::no_route)?;
        return Ok(json_response(StatusCode::OK, &v, &[]));
    }
    let namespaced_path = rest[0] == "namespaces"
        && rest.len() >= 3
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (ns, rest) = if namespaced_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    if rest.len() > 3 {
        return Err(ApiError::no_route());
    }
    let rt = inner
        .resolve(group, version, rest[0])
        .ok_or_else(ApiError::no_route)?;
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).copied();
    if ns.is_some() && !rt.namespaced {
        return Err(ApiError::no_route());
    }
    if rt.namespaced && ns.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    let ns = ns.as_deref();
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
