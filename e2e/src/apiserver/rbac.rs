//! Authorization as kube-apiserver's `--authorization-mode=RBAC` does it.
//!
//! - `system:masters` may do anything (upstream's privileged-group
//!   authorizer, ahead of RBAC).
//! - Everyone else is allowed a request only when a rule of a Role or
//!   ClusterRole bound to them allows it: ClusterRoleBindings everywhere,
//!   RoleBindings in their namespace. Rules match on verbs, API groups,
//!   resources (`pods/portforward`, `*/scale`), resourceNames and, for
//!   non-resource requests (`/api`, `/version`), nonResourceURLs; `*`
//!   wildcards as upstream. Refusals are 403 `Status`es worded as upstream
//!   (`pods "x" is forbidden: User "…" cannot get resource "pods" in API group "" in the namespace "ns"`).
//! - Requests map to verbs as upstream's `RequestInfoFactory` maps them
//!   ([`Attributes::of_request`]). A websocket upgrade (GET) of `pods/exec`,
//!   `pods/attach` or `pods/portforward` needs `get` and also `create`, as
//!   with `AuthorizePodWebsocketUpgradeCreatePermission` (on from 1.35): the
//!   stricter of the two behaviours, so RBAC that passes here passes on
//!   servers before and after the change.
//! - The bootstrap policy every cluster has ([`Inner::ensure_bootstrap_policy`]):
//!   `cluster-admin` for `system:masters`, `system:discovery`,
//!   `system:basic-user` and `system:public-info-viewer` for every
//!   authenticated identity.
//! - The review APIs: SelfSubjectAccessReview (`kubectl auth can-i`),
//!   SelfSubjectRulesReview (`kubectl auth can-i --list`),
//!   SubjectAccessReview and LocalSubjectAccessReview.

use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef, Subject};
use serde_json::{Value, json};

use super::Inner;
use super::authn::{self, UserInfo};
use super::ops::{ListQuery, WriteOpts};
use super::schema::FieldErrorKind;
use super::status::{ApiError, field_error};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// What a request asks to do (upstream `authorizer.Attributes`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    pub verb: String,
    /// False for `/version`, `/api`, `/apis/apps/v1`, `/healthz`, ...
    pub resource_request: bool,
    /// The URL path (what non-resource rules match).
    pub path: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

impl Attributes {
    /// Upstream's `RequestInfoFactory.NewRequestInfo`: the verb from the
    /// method (GET on a collection is `list`, or `watch` with `?watch`; DELETE
    /// on a collection `deletecollection`), the resource, subresource,
    /// namespace and name from the path, the name also from a
    /// `metadata.name=` field selector on lists and watches.
    pub fn of_request(method: &Method, path: &str, query: &[(String, String)]) -> Attributes {
        let mut a = Attributes {
            verb: method.as_str().to_lowercase(),
            path: path.to_string(),
            ..Default::default()
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
            return a;
        }
        let mut rest = &parts[1..];
        if parts[0] == "apis" {
            if rest.len() < 3 {
                return a;
            }
            a.api_group = rest[0].to_string();
            rest = &rest[1..];
        }
        a.api_version = rest[0].to_string();
        rest = &rest[1..];
        if matches!(rest[0], "watch" | "proxy") {
            if rest.len() < 2 {
                return a;
            }
            a.verb = rest[0].to_string();
            rest = &rest[1..];
        } else {
            a.verb = match *method {
                Method::POST => "create",
                Method::GET | Method::HEAD => "get",
                Method::PUT => "update",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "",
            }
            .to_string();
        }
        a.resource_request = true;
        if rest[0] == "namespaces" && rest.len() > 1 {
            a.namespace = rest[1].to_string();
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        if rest.len() >= 3 && a.verb != "proxy" {
            a.subresource = rest[2].to_string();
        }
        if rest.len() >= 2 {
            a.name = rest[1].to_string();
        }
        a.resource = rest[0].to_string();
        let param = |k: &str| {
            query
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        if a.name.is_empty() && a.verb == "get" {
            let watch =
                param("watch").is_some_and(|w| !matches!(w.to_lowercase().as_str(), "false" | "0"));
            a.verb = if watch { "watch" } else { "list" }.to_string();
            if let Some(name) = param("fieldSelector").and_then(exact_name)
                && !matches!(name, "." | "..")
                && !name.contains(['/', '%'])
            {
                a.name = name.to_string();
            }
        }
        if a.name.is_empty() && a.verb == "delete" {
            a.verb = "deletecollection".to_string();
        }
        a
    }

    /// The `impersonate` check of one impersonated user, group, uid or extra.
    pub fn impersonate(
        group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            verb: "impersonate".into(),
            resource_request: true,
            api_group: group.into(),
            namespace: namespace.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    /// `resource/subresource`.
    fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The websocket upgrade of exec, attach and port-forward also needs `create`.
    fn connect_create(&self, headers: &HeaderMap) -> Option<Attributes> {
        let upgrade = headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        (upgrade
            && self.verb == "get"
            && self.api_group.is_empty()
            && self.resource == "pods"
            && matches!(self.subresource.as_str(), "exec" | "attach" | "portforward"))
        .then(|| Attributes {
            verb: "create".into(),
            ..self.clone()
        })
    }
}

/// The name a field selector pins with `metadata.name=` (`RequiresExactMatch`).
fn exact_name(selector: &str) -> Option<&str> {
    selector.split(',').find_map(|term| {
        let term = term.trim();
        if term.contains("!=") {
            return None;
        }
        let (field, value) = term.split_once("==").or_else(|| term.split_once('='))?;
        (field.trim() == "metadata.name").then(|| value.trim())
    })
}

fn has(list: &Option<Vec<String>>, wanted: &str) -> bool {
    list.as_ref()
        .is_some_and(|l| l.iter().any(|x| x == "*" || x == wanted))
}

/// Whether one rule allows the request (upstream `RuleAllows`).
pub fn rule_allows(a: &Attributes, rule: &PolicyRule) -> bool {
    if !rule.verbs.iter().any(|v| v == "*" || *v == a.verb) {
        return false;
    }
    if !a.resource_request {
        return rule.non_resource_urls.as_ref().is_some_and(|urls| {
            urls.iter().any(|u| {
                u == "*"
                    || *u == a.path
                    || u.strip_suffix('*').is_some_and(|p| a.path.starts_with(p))
            })
        });
    }
    if !has(&rule.api_groups, &a.api_group) {
        return false;
    }
    let combined = a.combined_resource();
    let resource_ok = rule.resources.as_ref().is_some_and(|rs| {
        rs.iter().any(|r| {
            r == "*"
                || *r == combined
                || (!a.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(a.subresource.as_str()))
        })
    });
    if !resource_ok {
        return false;
    }
    match &rule.resource_names {
        None => true,
        Some(names) if names.is_empty() => true,
        Some(names) => names.contains(&a.name),
    }
}

/// Whether a binding's subject is `user` (upstream `appliesToUser`);
/// `binding_ns` is the RoleBinding's namespace ("" for a ClusterRoleBinding).
pub fn subject_matches(subject: &Subject, user: &UserInfo, binding_ns: &str) -> bool {
    match subject.kind.as_str() {
        "User" => subject.name == user.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => {
            let ns = subject
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            !ns.is_empty() && user.name == authn::service_account_username(ns, &subject.name)
        }
        _ => false,
    }
}

fn describe_subject(subject: &Subject, binding_ns: &str) -> String {
    if subject.kind == "ServiceAccount" {
        let ns = subject
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(binding_ns);
        format!("{} \"{}/{ns}\"", subject.kind, subject.name)
    } else {
        format!("{} \"{}\"", subject.kind, subject.name)
    }
}

/// The rules one binding gives a user.
struct Granted {
    /// `ClusterRoleBinding "x" of ClusterRole "y" to ServiceAccount "sa/ns"`.
    source: String,
    rules: Vec<PolicyRule>,
}

fn field<T: serde::de::DeserializeOwned>(obj: &Value, key: &str) -> Option<T> {
    obj.get(key)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

impl Inner {
    async fn list_rbac(&self, plural: &str, ns: Option<&str>) -> Result<Vec<Value>, ApiError> {
        let rt = self
            .resolve(RBAC_GROUP, "v1", plural)
            .ok_or_else(|| ApiError::internal(format!("{plural} not registered")))?;
        Ok(self.list_objects(&rt, ns, &ListQuery::default()).await?.0)
    }

    /// The rules of a binding's role; Err is the RBAC error text upstream reports.
    async fn role_rules(
        &self,
        role_ref: &RoleRef,
        binding_ns: &str,
    ) -> Result<Result<Vec<PolicyRule>, String>, ApiError> {
        let (plural, ns, singular) = match role_ref.kind.as_str() {
            "ClusterRole" => ("clusterroles", None, "clusterrole"),
            "Role" if !binding_ns.is_empty() => ("roles", Some(binding_ns), "role"),
            other => return Ok(Err(format!("unsupported role reference kind: \"{other}\""))),
        };
        let rt = self
            .resolve(RBAC_GROUP, "v1", plural)
            .ok_or_else(|| ApiError::internal(format!("{plural} not registered")))?;
        match self.get_stored(&rt, ns, &role_ref.name).await {
            Ok(s) => Ok(Ok(field(&s.obj, "rules").unwrap_or_default())),
            Err(e) if e.code == 404 => Ok(Err(format!(
                "{singular}.{RBAC_GROUP} \"{}\" not found",
                role_ref.name
            ))),
            Err(e) => Err(e),
        }
    }

    /// Every binding that names `user` and applies in `namespace` (cluster
    /// bindings first, then the namespace's RoleBindings), with its rules;
    /// and the errors met (a role that does not exist).
    async fn granted(
        &self,
        user: &UserInfo,
        namespace: &str,
    ) -> Result<(Vec<Granted>, Vec<String>), ApiError> {
        let mut out = Vec::new();
        let mut errors = Vec::new();
        let mut bindings: Vec<(Value, &str)> = self
            .list_rbac("clusterrolebindings", None)
            .await?
            .into_iter()
            .map(|b| (b, "ClusterRoleBinding"))
            .collect();
        if !namespace.is_empty() {
            bindings.extend(
                self.list_rbac("rolebindings", Some(namespace))
                    .await?
                    .into_iter()
                    .map(|b| (b, "RoleBinding")),
            );
        }
        for (binding, kind) in bindings {
            let binding_ns = if kind == "RoleBinding" { namespace } else { "" };
            let subjects: Vec<Subject> = field(&binding, "subjects").unwrap_or_default();
            let Some(subject) = subjects
                .iter()
                .find(|s| subject_matches(s, user, binding_ns))
            else {
                continue;
            };
            let Some(role_ref) = field::<RoleRef>(&binding, "roleRef") else {
                continue;
            };
            let name = binding
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let shown = if binding_ns.is_empty() {
                name.to_string()
            } else {
                format!("{name}/{binding_ns}")
            };
            match self.role_rules(&role_ref, binding_ns).await? {
                Ok(rules) => out.push(Granted {
                    source: format!(
                        "{kind} \"{shown}\" of {} \"{}\" to {}",
                        role_ref.kind,
                        role_ref.name,
                        describe_subject(subject, binding_ns)
                    ),
                    rules,
                }),
                Err(e) => errors.push(e),
            }
        }
        Ok((out, errors))
    }

    /// Allow or not, with upstream's reason text.
    pub(crate) async fn authorize(
        &self,
        user: &UserInfo,
        a: &Attributes,
    ) -> Result<Decision, ApiError> {
        if user.is_privileged() {
            return Ok(Decision {
                allowed: true,
                reason: String::new(),
            });
        }
        let (granted, mut errors) = self.granted(user, &a.namespace).await?;
        for g in &granted {
            if g.rules.iter().any(|r| rule_allows(a, r)) {
                return Ok(Decision {
                    allowed: true,
                    reason: format!("RBAC: allowed by {}", g.source),
                });
            }
        }
        errors.dedup();
        let reason = match errors.len() {
            0 => String::new(),
            1 => format!("RBAC: {}", errors[0]),
            _ => format!("RBAC: [{}]", errors.join(", ")),
        };
        Ok(Decision {
            allowed: false,
            reason,
        })
    }

    /// Create the bootstrap roles and bindings every cluster has, when absent.
    pub(crate) async fn ensure_bootstrap_policy(&self) -> Result<(), ApiError> {
        for (plural, obj) in bootstrap_policy() {
            let rt = self
                .resolve(RBAC_GROUP, "v1", plural)
                .ok_or_else(|| ApiError::internal(format!("{plural} not registered")))?;
            match self.create(&rt, None, obj, &WriteOpts::internal()).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// An authorization decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// Upstream's `forbiddenMessage` in a `NewForbidden` Status.
pub(crate) fn forbidden(user: &UserInfo, a: &Attributes, reason: &str) -> ApiError {
    let what = if !a.resource_request {
        format!(
            "User \"{}\" cannot {} path \"{}\"",
            user.name, a.verb, a.path
        )
    } else if !a.namespace.is_empty() {
        format!(
            "User \"{}\" cannot {} resource \"{}\" in API group \"{}\" in the namespace \"{}\"",
            user.name,
            a.verb,
            a.combined_resource(),
            a.api_group,
            a.namespace
        )
    } else {
        format!(
            "User \"{}\" cannot {} resource \"{}\" in API group \"{}\" at the cluster scope",
            user.name,
            a.verb,
            a.combined_resource(),
            a.api_group
        )
    };
    let what = if reason.is_empty() {
        what
    } else {
        format!("{what}: {reason}")
    };
    if !a.resource_request || a.resource.is_empty() {
        return ApiError::forbidden(format!("forbidden: {what}")).with_details(json!({}));
    }
    let qualified = super::status::qualified(&a.api_group, &a.resource);
    let message = if a.name.is_empty() {
        format!("{qualified} is forbidden: {what}")
    } else {
        format!("{qualified} \"{}\" is forbidden: {what}", a.name)
    };
    let mut details = serde_json::Map::new();
    if !a.name.is_empty() {
        details.insert("name".into(), json!(a.name));
    }
    if !a.api_group.is_empty() {
        details.insert("group".into(), json!(a.api_group));
    }
    details.insert("kind".into(), json!(a.resource));
    ApiError::forbidden(message).with_details(Value::Object(details))
}

/// 403 unless `user` may do `a`.
pub(crate) async fn require(
    inner: &Inner,
    user: &UserInfo,
    a: &Attributes,
) -> Result<(), ApiError> {
    let d = inner.authorize(user, a).await?;
    if d.allowed {
        Ok(())
    } else {
        Err(forbidden(user, a, &d.reason))
    }
}

/// Authorize one HTTP request (and the extra `create` of a websocket exec,
/// attach or port-forward).
pub(crate) async fn authorize_request(
    inner: &Inner,
    user: &UserInfo,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    if user.is_privileged() {
        return Ok(());
    }
    let a = Attributes::of_request(method, path, query);
    require(inner, user, &a).await?;
    if let Some(create) = a.connect_create(headers) {
        require(inner, user, &create).await?;
    }
    Ok(())
}

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"verbs": verbs, "apiGroups": groups, "resources": resources})
}

/// Upstream's bootstrap ClusterRoles and ClusterRoleBindings that concern
/// authorization of ordinary identities (no controllers run here).
fn bootstrap_policy() -> Vec<(&'static str, Value)> {
    let meta = |name: &str| {
        json!({"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
               "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
    };
    let role = |name: &str, rules: Vec<Value>| {
        (
            "clusterroles",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(name), "rules": rules}),
        )
    };
    let binding = |name: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| json!({"apiGroup": RBAC_GROUP, "kind": "Group", "name": g}))
            .collect();
        (
            "clusterrolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta(name),
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name}, "subjects": subjects}),
        )
    };
    let public_info = ["/healthz", "/livez", "/readyz", "/version", "/version/"];
    let mut discovery = vec![
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
        "/openapi",
        "/openapi/*",
    ];
    discovery.extend(public_info);
    discovery.sort();
    vec![
        role(
            "cluster-admin",
            vec![
                rule(&["*"], &["*"], &["*"]),
                json!({"verbs": ["*"], "nonResourceURLs": ["*"]}),
            ],
        ),
        role(
            "system:discovery",
            vec![json!({"verbs": ["get"], "nonResourceURLs": discovery})],
        ),
        role(
            "system:basic-user",
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        role(
            "system:public-info-viewer",
            vec![json!({"verbs": ["get"], "nonResourceURLs": public_info})],
        ),
        binding("cluster-admin", &[authn::MASTERS]),
        binding("system:discovery", &[authn::AUTHENTICATED]),
        binding("system:basic-user", &[authn::AUTHENTICATED]),
        binding(
            "system:public-info-viewer",
            &[authn::AUTHENTICATED, "system:unauthenticated"],
        ),
    ]
}

/// The review resources: created (POST) only, computed, never stored.
/// (group, plural, kind, namespaced), all `v1`.
pub(crate) const REVIEWS: &[(&str, &str, &str, bool)] = &[
    (
        "authentication.k8s.io",
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
    ),
    (
        "authentication.k8s.io",
        "tokenreviews",
        "TokenReview",
        false,
    ),
    (
        "authorization.k8s.io",
        "localsubjectaccessreviews",
        "LocalSubjectAccessReview",
        true,
    ),
    (
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
    ),
    (
        "authorization.k8s.io",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        false,
    ),
    (
        "authorization.k8s.io",
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
    ),
];

/// Discovery entries of the review resources of `group`/`version`.
pub(crate) fn review_resources(group: &str, version: &str) -> Vec<Value> {
    if version != "v1" {
        return Vec::new();
    }
    REVIEWS
        .iter()
        .filter(|(g, ..)| *g == group)
        .map(|(_, plural, kind, namespaced)| {
            json!({"name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced, "kind": kind, "verbs": ["create"]})
        })
        .collect()
}

fn created(v: &Value) -> Response {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

fn invalid(kind: &str, field: &str, detail: &str) -> ApiError {
    let group = REVIEWS
        .iter()
        .find(|r| r.2 == kind)
        .map(|r| r.0)
        .unwrap_or("");
    ApiError::invalid(
        group,
        kind,
        "",
        &[field_error(FieldErrorKind::Invalid, field, detail)],
    )
}

/// The attributes a (Self/Local)SubjectAccessReview's spec asks about.
fn review_attributes(kind: &str, spec: &Value) -> Result<Attributes, ApiError> {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match (
        spec.get("resourceAttributes"),
        spec.get("nonResourceAttributes"),
    ) {
        (Some(r), None) if r.is_object() => Ok(Attributes {
            verb: s(r, "verb"),
            resource_request: true,
            path: String::new(),
            api_group: s(r, "group"),
            api_version: s(r, "version"),
            namespace: s(r, "namespace"),
            resource: s(r, "resource"),
            subresource: s(r, "subresource"),
            name: s(r, "name"),
        }),
        (None, Some(n)) if n.is_object() => Ok(Attributes {
            verb: s(n, "verb"),
            path: s(n, "path"),
            ..Default::default()
        }),
        _ => Err(invalid(
            kind,
            "spec.resourceAttributes",
            "Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
    }
}

/// `POST` of a review resource; `url_ns` is the namespace of a
/// LocalSubjectAccessReview's URL.
pub(crate) async fn review(
    inner: &Inner,
    user: &UserInfo,
    plural: &str,
    url_ns: Option<&str>,
    body: Value,
) -> Result<Response, ApiError> {
    let Some(&(group, _, kind, namespaced)) = REVIEWS.iter().find(|r| r.1 == plural) else {
        return Err(ApiError::no_route());
    };
    if namespaced != url_ns.is_some() {
        return Err(ApiError::no_route());
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str)
        && k != kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the object ({k}) does not match the kind of the resource ({kind})"
        )));
    }
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match plural {
        "selfsubjectreviews" => return Ok(authn::self_subject_review(user)),
        "tokenreviews" => return authn::token_review(inner, &body).await,
        "selfsubjectrulesreviews" => rules_review(inner, user, &spec).await?,
        "selfsubjectaccessreviews" => {
            access_status(inner, user, &review_attributes(kind, &spec)?).await?
        }
        _ => {
            let subject = UserInfo {
                name: spec
                    .get("user")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                uid: spec
                    .get("uid")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                groups: field(&spec, "groups").unwrap_or_default(),
                extra: field(&spec, "extra").unwrap_or_default(),
            };
            if subject.name.is_empty() && subject.groups.is_empty() {
                return Err(invalid(
                    kind,
                    "spec.user",
                    "Invalid value: \"\": at least one of user or group must be specified",
                ));
            }
            let a = review_attributes(kind, &spec)?;
            if let Some(ns) = url_ns
                && a.namespace != ns
            {
                return Err(invalid(
                    kind,
                    "spec.resourceAttributes.namespace",
                    &format!(
                        "Invalid value: \"{}\": must match metadata.namespace",
                        a.namespace
                    ),
                ));
            }
            access_status(inner, &subject, &a).await?
        }
    };
    let mut metadata = json!({"creationTimestamp": null});
    if let Some(ns) = url_ns {
        metadata["namespace"] = json!(ns);
    }
    Ok(created(&json!({
        "kind": kind,
        "apiVersion": format!("{group}/v1"),
        "metadata": metadata,
        "spec": spec,
        "status": status,
    })))
}

async fn access_status(inner: &Inner, user: &UserInfo, a: &Attributes) -> Result<Value, ApiError> {
    let d = inner.authorize(user, a).await?;
    let mut status = json!({"allowed": d.allowed});
    if !d.reason.is_empty() {
        status["reason"] = json!(d.reason);
    }
    Ok(status)
}

/// SelfSubjectRulesReview: every rule that applies to the caller in `spec.namespace`.
async fn rules_review(inner: &Inner, user: &UserInfo, spec: &Value) -> Result<Value, ApiError> {
    let namespace = spec.get("namespace").and_then(Value::as_str).unwrap_or("");
    let (granted, errors) = inner.granted(user, namespace).await?;
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for rule in granted.into_iter().flat_map(|g| g.rules) {
        if rule
            .non_resource_urls
            .as_ref()
            .is_some_and(|u| !u.is_empty())
        {
            non_resource_rules
                .push(json!({"verbs": rule.verbs, "nonResourceURLs": rule.non_resource_urls}));
        } else {
            let mut r = json!({"verbs": rule.verbs});
            for (key, list) in [
                ("apiGroups", &rule.api_groups),
                ("resources", &rule.resources),
                ("resourceNames", &rule.resource_names),
            ] {
                if let Some(l) = list.as_ref().filter(|l| !l.is_empty()) {
                    r[key] = json!(l);
                }
            }
            resource_rules.push(r);
        }
    }
    let mut status = json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": !errors.is_empty()});
    if !errors.is_empty() {
        status["evaluationError"] = json!(errors.join(", "));
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn attrs(method: Method, path: &str, query: &[(&str, &str)]) -> Attributes {
        Attributes::of_request(&method, path, &q(query))
    }

    #[test]
    fn verbs_from_methods_and_paths() {
        let hc = "/apis/hypershift.openshift.io/v1beta1/namespaces/clusters/hostedclusters";
        let cases = [
            (Method::GET, hc.to_string(), vec![], "list", ""),
            (
                Method::GET,
                hc.to_string(),
                vec![("watch", "true")],
                "watch",
                "",
            ),
            (
                Method::GET,
                hc.to_string(),
                vec![("watch", "1"), ("fieldSelector", "metadata.name=demo")],
                "watch",
                "demo",
            ),
            (
                Method::GET,
                hc.to_string(),
                vec![("watch", "false")],
                "list",
                "",
            ),
            (Method::GET, format!("{hc}/demo"), vec![], "get", "demo"),
            (Method::HEAD, format!("{hc}/demo"), vec![], "get", "demo"),
            (Method::POST, hc.to_string(), vec![], "create", ""),
            (Method::PUT, format!("{hc}/demo"), vec![], "update", "demo"),
            (Method::PATCH, format!("{hc}/demo"), vec![], "patch", "demo"),
            (
                Method::DELETE,
                format!("{hc}/demo"),
                vec![],
                "delete",
                "demo",
            ),
            (
                Method::DELETE,
                hc.to_string(),
                vec![],
                "deletecollection",
                "",
            ),
        ];
        for (method, path, query, verb, name) in cases {
            let a = attrs(method.clone(), &path, &query);
            assert!(a.resource_request, "{method} {path}");
            assert_eq!(
                (a.verb.as_str(), a.name.as_str()),
                (verb, name),
                "{method} {path} {query:?}"
            );
            assert_eq!(
                (a.api_group.as_str(), a.api_version.as_str()),
                ("hypershift.openshift.io", "v1beta1")
            );
            assert_eq!(
                (a.namespace.as_str(), a.resource.as_str()),
                ("clusters", "hostedclusters")
            );
        }
    }

    #[test]
    fn subresources_namespaces_and_non_resource_paths() {
        let a = attrs(
            Method::PATCH,
            "/apis/apps/v1/namespaces/clusters-demo/deployments/kube-apiserver/scale",
            &[],
        );
        assert_eq!(
            (
                a.resource.as_str(),
                a.subresource.as_str(),
                a.combined_resource().as_str()
            ),
            ("deployments", "scale", "deployments/scale")
        );
        let a = attrs(
            Method::GET,
            "/api/v1/namespaces/clusters-demo/pods/etcd-0/portforward",
            &[],
        );
        assert_eq!(
            (
                a.verb.as_str(),
                a.combined_resource().as_str(),
                a.name.as_str()
            ),
            ("get", "pods/portforward", "etcd-0")
        );
        let a = attrs(
            Method::POST,
            "/api/v1/namespaces/hcp-dr/serviceaccounts/hcp-dr-backup/token",
            &[],
        );
        assert_eq!(
            (a.verb.as_str(), a.combined_resource().as_str()),
            ("create", "serviceaccounts/token")
        );
        // a namespace and its own subresources: the namespace is the object's
        let a = attrs(Method::GET, "/api/v1/namespaces/clusters", &[]);
        assert_eq!(
            (
                a.verb.as_str(),
                a.namespace.as_str(),
                a.resource.as_str(),
                a.name.as_str()
            ),
            ("get", "clusters", "namespaces", "clusters")
        );
        let a = attrs(Method::PUT, "/api/v1/namespaces/clusters/finalize", &[]);
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.subresource.as_str()),
            ("namespaces", "clusters", "finalize")
        );
        let a = attrs(Method::GET, "/api/v1/namespaces", &[]);
        assert_eq!(
            (a.verb.as_str(), a.namespace.as_str(), a.resource.as_str()),
            ("list", "", "namespaces")
        );
        let a = attrs(Method::GET, "/api/v1/watch/namespaces/x/pods", &[]);
        assert_eq!(
            (a.verb.as_str(), a.namespace.as_str(), a.resource.as_str()),
            ("watch", "x", "pods")
        );
        for path in [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps/v1",
            "/apis/apps",
            "/version",
            "/openapi/v3",
            "/metrics",
        ] {
            let a = attrs(Method::GET, path, &[]);
            assert!(!a.resource_request, "{path}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", path));
        }
    }

    fn policy(v: Value) -> PolicyRule {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rules_match_like_upstream() {
        let get_scale = attrs(
            Method::GET,
            "/apis/apps/v1/namespaces/n/deployments/d/scale",
            &[],
        );
        let patch_deploy = attrs(
            Method::PATCH,
            "/apis/apps/v1/namespaces/n/deployments/d",
            &[],
        );
        let scale = policy(
            json!({"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get"]}),
        );
        assert!(rule_allows(&get_scale, &scale));
        assert!(
            !rule_allows(&patch_deploy, &scale),
            "a subresource rule does not grant the resource"
        );
        let deploy =
            policy(json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["*"]}));
        assert!(rule_allows(&patch_deploy, &deploy));
        assert!(
            !rule_allows(&get_scale, &deploy),
            "nor the resource the subresource"
        );
        assert!(rule_allows(
            &get_scale,
            &policy(json!({"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["get"]}))
        ));
        assert!(rule_allows(
            &get_scale,
            &policy(json!({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["get"]}))
        ));
        assert!(
            !rule_allows(
                &get_scale,
                &policy(json!({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}))
            ),
            "wrong group"
        );

        let named = policy(
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"], "resourceNames": ["a"]}),
        );
        assert!(rule_allows(
            &attrs(Method::GET, "/api/v1/namespaces/n/configmaps/a", &[]),
            &named
        ));
        assert!(!rule_allows(
            &attrs(Method::GET, "/api/v1/namespaces/n/configmaps/b", &[]),
            &named
        ));
        assert!(
            !rule_allows(
                &attrs(Method::GET, "/api/v1/namespaces/n/configmaps", &[]),
                &named
            ),
            "a list has no name"
        );
        assert!(rule_allows(
            &attrs(
                Method::GET,
                "/api/v1/namespaces/n/configmaps",
                &[("fieldSelector", "metadata.name=a")]
            ),
            &named
        ));

        let discovery = policy(json!({"nonResourceURLs": ["/api", "/apis/*"], "verbs": ["get"]}));
        assert!(rule_allows(&attrs(Method::GET, "/api", &[]), &discovery));
        assert!(rule_allows(
            &attrs(Method::GET, "/apis/apps/v1", &[]),
            &discovery
        ));
        assert!(
            !rule_allows(&attrs(Method::GET, "/api/v1", &[]), &discovery),
            "/api does not cover /api/v1"
        );
        assert!(
            !rule_allows(&attrs(Method::POST, "/apis/x", &[]), &discovery),
            "non-resource verbs are the lower-case method"
        );
        assert!(
            !rule_allows(&attrs(Method::GET, "/api/v1/pods", &[]), &discovery),
            "nonResourceURLs never grant resources"
        );
    }

    #[test]
    fn subjects() {
        let sa = UserInfo {
            name: "system:serviceaccount:hcp-dr:backup".into(),
            groups: authn::service_account_groups("hcp-dr"),
            ..Default::default()
        };
        let subject = |v: Value| -> Subject { serde_json::from_value(v).unwrap() };
        assert!(subject_matches(
            &subject(json!({"kind": "ServiceAccount", "name": "backup", "namespace": "hcp-dr"})),
            &sa,
            ""
        ));
        assert!(
            subject_matches(
                &subject(json!({"kind": "ServiceAccount", "name": "backup"})),
                &sa,
                "hcp-dr"
            ),
            "a RoleBinding's namespace is the default"
        );
        assert!(
            !subject_matches(
                &subject(json!({"kind": "ServiceAccount", "name": "backup"})),
                &sa,
                ""
            ),
            "a ClusterRoleBinding needs the namespace"
        );
        assert!(!subject_matches(
            &subject(json!({"kind": "ServiceAccount", "name": "backup", "namespace": "other"})),
            &sa,
            ""
        ));
        assert!(subject_matches(
            &subject(json!({"kind": "Group", "name": "system:serviceaccounts:hcp-dr"})),
            &sa,
            ""
        ));
        assert!(!subject_matches(
            &subject(json!({"kind": "User", "name": "backup"})),
            &sa,
            ""
        ));
    }

    #[test]
    fn forbidden_messages_as_upstream() {
        let user = UserInfo {
            name: "system:serviceaccount:hcp-dr:hcp-dr".into(),
            ..Default::default()
        };
        let list = attrs(
            Method::GET,
            "/apis/hypershift.openshift.io/v1beta1/namespaces/clusters/hostedclusters",
            &[],
        );
        let e = forbidden(&user, &list, "");
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "hostedclusters.hypershift.openshift.io is forbidden: User \"system:serviceaccount:hcp-dr:hcp-dr\" cannot list resource \"hostedclusters\" in API group \"hypershift.openshift.io\" in the namespace \"clusters\""
        );
        assert_eq!(
            e.details,
            Some(json!({"group": "hypershift.openshift.io", "kind": "hostedclusters"}))
        );
        let e = forbidden(
            &user,
            &attrs(Method::GET, "/api/v1/nodes/n1", &[]),
            "RBAC: clusterrole.rbac.authorization.k8s.io \"x\" not found",
        );
        assert_eq!(
            e.message,
            "nodes \"n1\" is forbidden: User \"system:serviceaccount:hcp-dr:hcp-dr\" cannot get resource \"nodes\" in API group \"\" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io \"x\" not found"
        );
        let e = forbidden(&user, &attrs(Method::GET, "/metrics", &[]), "");
        assert_eq!(
            e.message,
            "forbidden: User \"system:serviceaccount:hcp-dr:hcp-dr\" cannot get path \"/metrics\""
        );
        assert_eq!(e.details, Some(json!({})));
    }

    #[test]
    fn websocket_connects_also_need_create() {
        let mut headers = HeaderMap::new();
        let pf = attrs(
            Method::GET,
            "/api/v1/namespaces/n/pods/etcd-0/portforward",
            &[],
        );
        assert_eq!(pf.connect_create(&headers), None, "no upgrade");
        headers.insert(header::UPGRADE, "websocket".parse().unwrap());
        let create = pf.connect_create(&headers).expect("upgrade needs create");
        assert_eq!(
            (create.verb.as_str(), create.combined_resource().as_str()),
            ("create", "pods/portforward")
        );
        let logs = attrs(Method::GET, "/api/v1/namespaces/n/pods/etcd-0/log", &[]);
        assert_eq!(logs.connect_create(&headers), None);
    }
}
