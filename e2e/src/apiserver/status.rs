//! `Status` bodies: every non-2xx answer of the emulator, worded as a real
//! kube-apiserver words it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::schema::FieldError;

/// An API error answered to the client as a `metav1.Status` body.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason` field (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human message.
    pub message: String,
    /// `details` object, if any.
    pub details: Option<Value>,
}

/// A group/resource pair as upstream prints it in messages (`hostedclusters.hypershift.openshift.io`).
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = serde_json::Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), json!(kind));
    }
    Value::Object(d)
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// 404 `resource.group "name" not found`; `kind` in details is the resource (as upstream).
    pub fn not_found(group: &str, resource: &str, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(details(name, group, resource))
    }

    /// 404 for a URL that matches no route.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(details(name, group, resource))
    }

    /// 409 after a stale resourceVersion.
    pub fn conflict(group: &str, resource: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(group, resource)
            ),
        )
        .with_details(details(name, group, resource))
    }

    /// 409 with a custom explanation (e.g. failed preconditions).
    pub fn conflict_msg(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(details(name, group, resource))
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(403, "Forbidden", message)
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
        .with_details(json!({ "causes": [{ "reason": "UnexpectedServerResponse", "message": content_type }] }))
    }

    pub fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
        .with_details(json!({ "causes": [] }))
    }

    /// 422 `Kind.group "name" is invalid: field: detail, field2: detail2` with causes.
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> ApiError {
        let qkind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let parts: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.detail))
            .collect();
        let message = if parts.len() == 1 {
            format!("{qkind} \"{name}\" is invalid: {}", parts[0])
        } else {
            format!("{qkind} \"{name}\" is invalid: [{}]", parts.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.kind.reason(), "message": e.detail, "field": e.field }))
            .collect();
        let mut d = details(name, group, kind);
        if let Some(o) = d.as_object_mut() {
            o.insert("causes".into(), Value::Array(causes));
        }
        ApiError::new(422, "Invalid", message).with_details(d)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Some(o)) = (&self.details, s.as_object_mut()) {
            o.insert("details".into(), d.clone());
            // keep upstream field order: details before code
            let code = o.remove("code");
            if let Some(c) = code {
                o.insert("code".into(), c);
            }
        }
        s
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_default();
        (
            code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// Shorthand for a `FieldError` built by this server (built-in kinds).
pub fn field_error(
    kind: super::schema::FieldErrorKind,
    field: &str,
    detail: impl Into<String>,
) -> FieldError {
    FieldError {
        kind,
        field: field.to_string(),
        value: None,
        detail: detail.into(),
    }
}
