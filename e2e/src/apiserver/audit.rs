//! A request log in the shape of kube-apiserver's audit log
//! (`--audit-log-path`, `audit.k8s.io/v1` `Event` at level `Metadata`): one
//! JSON line per request once its response has started, with the verb the
//! real server would name (`list`, `watch`, `patch`, `deletecollection`,
//! ...), the request URI, the User-Agent and the response code. The sandbox
//! writes it to `DIR/<cluster>/state/audit.log`; benchmarks count a client's
//! requests from it (by User-Agent) as they would from a real server's log.
//!
//! Not logged, unlike a real server: the authenticated user (requests are
//! logged before authentication, like the injected faults), object
//! references and request bodies.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::json;

/// An append-only log file; lines are written whole (one `write` each).
pub(crate) struct AuditLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl AuditLog {
    pub(crate) fn open(path: &Path) -> std::io::Result<AuditLog> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(AuditLog {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }

    /// Log one request whose response started with `code`.
    pub(crate) fn record(&self, method: &str, uri: &str, user_agent: Option<&str>, code: u16) {
        let mut line = json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "stage": "ResponseStarted",
            "requestURI": uri,
            "verb": verb(method, uri),
            "userAgent": user_agent.unwrap_or(""),
            "responseStatus": {"code": code},
            "stageTimestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        })
        .to_string();
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = file.write_all(line.as_bytes()) {
            tracing::warn!(path = %self.path.display(), error = %err, "writing the audit log failed");
        }
    }
}

/// What a resource path names, namespace and API group left out:
/// `/apis/apps/v1/namespaces/ns/deployments/d/scale` is `deployments`,
/// object `d`, subresource `scale`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath<'a> {
    pub resource: &'a str,
    pub name: Option<&'a str>,
    pub subresource: Option<&'a str>,
}

/// The resource a request URI names (`/api/v1/...`, `/apis/<group>/<version>/...`),
/// or None for any other path (`/api`, `/apis/apps/v1`, `/version`).
pub fn resource_path(uri: &str) -> Option<ResourcePath<'_>> {
    let path = uri.split_once('?').map_or(uri, |(path, _)| path);
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    match *rest {
        [] => None,
        [resource] => Some(ResourcePath { resource, name: None, subresource: None }),
        [resource, name] => Some(ResourcePath { resource, name: Some(name), subresource: None }),
        [resource, name, subresource, ..] => Some(ResourcePath { resource, name: Some(name), subresource: Some(subresource) }),
    }
}

/// The verb kube-apiserver's audit log gives a request: for a resource path,
/// `get`/`list`/`watch`/`create`/`update`/`patch`/`delete`/`deletecollection`
/// by method and by whether the path names an object; for any other path
/// (`/api`, `/openapi/v2`, `/version`) the method in lower case.
pub fn verb(method: &str, uri: &str) -> String {
    let query = uri.split_once('?').map_or("", |(_, query)| query);
    let Some(target) = resource_path(uri) else {
        return method.to_ascii_lowercase();
    };
    let names_an_object = target.name.is_some();
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "watch");
    match (method, names_an_object) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (other, _) => return other.to_ascii_lowercase(),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::{ResourcePath, resource_path, verb};

    #[test]
    fn resource_paths_leave_out_group_and_namespace() {
        let path = |resource, name, subresource| Some(ResourcePath { resource, name, subresource });
        assert_eq!(resource_path("/apis/apps/v1/namespaces/ns/deployments/d/scale?x=1"), path("deployments", Some("d"), Some("scale")));
        assert_eq!(resource_path("/api/v1/namespaces/ns/pods"), path("pods", None, None));
        assert_eq!(resource_path("/api/v1/namespaces/ns"), path("namespaces", Some("ns"), None));
        assert_eq!(resource_path("/apis/hypershift.openshift.io/v1beta1/hostedclusters"), path("hostedclusters", None, None));
        for other in ["/api", "/api/v1", "/apis/apps/v1", "/version", "/openapi/v2"] {
            assert_eq!(resource_path(other), None, "{other}");
        }
    }

    #[test]
    fn verbs_are_the_audit_logs() {
        for (method, uri, want) in [
            ("GET", "/api/v1/namespaces/ns/pods", "list"),
            ("GET", "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=5", "watch"),
            ("GET", "/api/v1/namespaces/ns/pods/p", "get"),
            ("GET", "/api/v1/namespaces", "list"),
            ("GET", "/api/v1/namespaces/ns", "get"),
            ("DELETE", "/api/v1/namespaces/ns", "delete"),
            ("GET", "/apis/apps/v1/deployments", "list"),
            ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/d/scale", "patch"),
            ("PUT", "/apis/hypershift.openshift.io/v1beta1/namespaces/c/hostedclusters/x/status", "update"),
            ("POST", "/api/v1/namespaces/ns/secrets", "create"),
            ("DELETE", "/api/v1/namespaces/ns/pods", "deletecollection"),
            ("GET", "/apis/apps/v1", "get"),
            ("GET", "/version", "get"),
            ("GET", "/openapi/v2", "get"),
        ] {
            assert_eq!(verb(method, uri), want, "{method} {uri}");
        }
    }
}
