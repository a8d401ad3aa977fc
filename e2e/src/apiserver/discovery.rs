//! Discovery documents (`/api`, `/apis`, resource lists), `/version`, and the
//! minimal OpenAPI v3 documents kubectl consults before writing.

use serde_json::{Value, json};

use super::Inner;
use super::resources::ResourceType;

/// The Kubernetes version the emulator claims.
pub(crate) const GIT_VERSION: &str = "v1.31.4";

pub(crate) fn version() -> Value {
    json!({
        "major": "1", "minor": "31", "gitVersion": GIT_VERSION,
        "gitCommit": "a78aa47129b8539636eb86a9d00e31b2720fe06b", "gitTreeState": "clean",
        "buildDate": "2024-12-10T11:37:02Z", "goVersion": "go1.22.9", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub(crate) fn api_versions(inner: &Inner) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": inner.address}]})
}

fn group_entry(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(json!({}));
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

/// The registry's groups and the groups of the review resources (not stored).
fn served_groups(inner: &Inner) -> Vec<(String, Vec<String>)> {
    let mut groups = inner.registry().groups();
    for (group, ..) in super::rbac::REVIEWS {
        if !groups.iter().any(|(g, _)| g == group) {
            groups.push((group.to_string(), vec!["v1".to_string()]));
        }
    }
    // aggregated APIs that are down are still listed, as the aggregator does
    for (group, version) in inner.faults.as_ref().map(|f| f.unavailable_api_services()).unwrap_or_default() {
        match groups.iter_mut().find(|(g, _)| g == &group) {
            Some((_, versions)) if !versions.contains(&version) => versions.push(version),
            Some(_) => {}
            None => groups.push((group, vec![version])),
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    groups
}

pub(crate) fn api_group_list(inner: &Inner) -> Value {
    let groups: Vec<Value> = served_groups(inner)
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn api_group(inner: &Inner, group: &str) -> Option<Value> {
    served_groups(inner)
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(g, vs)| {
            let mut e = group_entry(&g, &vs);
            e["kind"] = json!("APIGroup");
            e["apiVersion"] = json!("v1");
            e
        })
}

fn resource_entries(t: &ResourceType) -> Vec<Value> {
    let mut main = json!({
        "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
        "kind": t.kind, "verbs": t.verbs(),
    });
    if !t.short_names.is_empty() {
        main["shortNames"] = json!(t.short_names);
    }
    let cats = match &t.custom {
        Some(c) => c.categories.clone(),
        None if [
            "pods",
            "services",
            "deployments",
            "statefulsets",
            "replicasets",
            "jobs",
            "cronjobs",
        ]
        .contains(&t.plural.as_str()) =>
        {
            vec!["all".to_string()]
        }
        None => vec![],
    };
    if !cats.is_empty() {
        main["categories"] = json!(cats);
    }
    let mut out = vec![main];
    if t.status_subresource {
        out.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
            "kind": t.kind, "verbs": ["get", "patch", "update"]}));
    }
    if t.scale.is_some() {
        out.push(json!({"name": format!("{}/scale", t.plural), "singularName": "", "namespaced": t.namespaced,
            "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
    }
    if t.is_builtin() && t.group.is_empty() && t.plural == "pods" {
        out.push(
            json!({"name": "pods/portforward", "singularName": "", "namespaced": true,
            "kind": "PodPortForwardOptions", "verbs": ["create", "get"]}),
        );
    }
    if t.is_builtin() && t.group.is_empty() && t.plural == "serviceaccounts" {
        out.push(
            json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true,
            "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}),
        );
    }
    if t.is_builtin() && t.group.is_empty() && t.plural == "namespaces" {
        out.push(
            json!({"name": "namespaces/finalize", "singularName": "", "namespaced": false,
            "kind": "Namespace", "verbs": ["update"]}),
        );
    }
    out
}

pub(crate) fn resource_list(inner: &Inner, group: &str, version: &str) -> Option<Value> {
    let types = inner.registry().resources_of(group, version);
    let reviews = super::rbac::review_resources(group, version);
    if types.is_empty() && reviews.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources: Vec<Value> = types.iter().flat_map(|t| resource_entries(t)).collect();
    resources.extend(reviews);
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The `/openapi/v2` document as JSON: Swagger 2.0, no paths or definitions.
pub(crate) fn openapi_v2_json() -> Value {
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": GIT_VERSION}, "paths": {}, "definitions": {}})
}

/// The same document as gnostic's `openapi_v2.Document` protobuf: field 1
/// `swagger`, field 2 `info` (`title` 1, `version` 2).
pub(crate) fn openapi_v2_protobuf() -> Vec<u8> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2); // length-delimited
        let mut len = bytes.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(&mut info, 1, b"Kubernetes");
    field(&mut info, 2, GIT_VERSION.as_bytes());
    let mut doc = Vec::new();
    field(&mut doc, 1, b"2.0");
    field(&mut doc, 2, &info);
    doc
}

/// `/openapi/v3`: one entry per group-version.
pub(crate) fn openapi_v3_root(inner: &Inner) -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=0"}),
    );
    for (g, vs) in inner.registry().groups() {
        if g.is_empty() {
            continue;
        }
        for v in vs {
            paths.insert(
                format!("apis/{g}/{v}"),
                json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash=0")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/apis/<g>/<v>`: PATCH operations tagged with their GVK and the
/// `fieldValidation` parameter (how kubectl learns that server-side field
/// validation is available). Schemas are not published.
pub(crate) fn openapi_v3_group_version(inner: &Inner, group: &str, version: &str) -> Option<Value> {
    let types = inner.registry().resources_of(group, version);
    if types.is_empty() {
        return None;
    }
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = serde_json::Map::new();
    for t in types {
        let item = if t.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{base}/{}/{{name}}", t.plural)
        };
        let mut content = serde_json::Map::new();
        for ct in [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ] {
            content.insert(ct.into(), json!({"schema": {"type": "object"}}));
        }
        paths.insert(
            item,
            json!({"patch": {
                "operationId": format!("patch{}", t.kind),
                "parameters": [
                    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}
                ],
                "requestBody": {"content": content, "required": true},
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": t.group, "version": t.version, "kind": t.kind}
            }}),
        );
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": GIT_VERSION}, "paths": paths,
        "components": {"schemas": {}}}),
    )
}
