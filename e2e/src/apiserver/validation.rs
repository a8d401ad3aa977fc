//! The little validation the emulator does on built-in kinds: names, and the
//! immutable fields disaster recovery runs into.

use serde_json::{Value, json};

use super::schema::{FieldError, FieldErrorKind};
use super::status::field_error;

/// DNS-1123 subdomain (most object names).
pub fn dns1123_subdomain(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok {
        None
    } else {
        Some(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        ))
    }
}

/// DNS-1123 label (namespaces, services).
pub fn dns1123_label(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        None
    } else {
        Some(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        ))
    }
}

/// Name validation for a kind (RBAC kinds accept path-segment names as upstream).
pub fn validate_name(kind: &str, name: &str) -> Vec<FieldError> {
    let problem = match kind {
        "Namespace" | "Service" => dns1123_label(name),
        "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => {
            if name.is_empty()
                || name == "."
                || name == ".."
                || name.contains('/')
                || name.contains('%')
            {
                Some(format!(
                    "Invalid value: \"{name}\": may not contain '/' or '%'"
                ))
            } else {
                None
            }
        }
        _ => dns1123_subdomain(name),
    };
    problem
        .map(|p| vec![field_error(FieldErrorKind::Invalid, "metadata.name", p)])
        .unwrap_or_default()
}

fn at<'a>(v: &'a Value, ptr: &str) -> &'a Value {
    v.pointer(ptr).unwrap_or(&Value::Null)
}

fn without(v: &Value, keys: &[&str]) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in keys {
            o.remove(*k);
        }
    }
    v
}

/// Immutable-field checks on update of built-in kinds.
pub fn validate_builtin_update(kind: &str, old: &Value, new: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match kind {
        "StatefulSet" => {
            let keep = [
                "replicas",
                "ordinals",
                "template",
                "updateStrategy",
                "persistentVolumeClaimRetentionPolicy",
                "minReadySeconds",
            ];
            let o = without(at(old, "/spec"), &keep);
            let n = without(at(new, "/spec"), &keep);
            if o != n {
                errs.push(field_error(
                    FieldErrorKind::Forbidden,
                    "spec",
                    "Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
                ));
            }
        }
        "Deployment" | "ReplicaSet" | "Job"
            if at(old, "/spec/selector") != at(new, "/spec/selector") =>
        {
            errs.push(field_error(
                FieldErrorKind::Invalid,
                "spec.selector",
                format!(
                    "Invalid value: {}: field is immutable",
                    at(new, "/spec/selector")
                ),
            ));
        }
        "Secret" | "ConfigMap" => {
            if at(old, "/immutable") == &Value::Bool(true) {
                if at(new, "/immutable") != &Value::Bool(true) {
                    errs.push(field_error(
                        FieldErrorKind::Forbidden,
                        "immutable",
                        "Forbidden: field is immutable when `immutable` is set",
                    ));
                }
                for f in ["data", "binaryData", "stringData"] {
                    if at(old, &format!("/{f}")) != at(new, &format!("/{f}")) {
                        errs.push(field_error(
                            FieldErrorKind::Forbidden,
                            f,
                            "Forbidden: field is immutable when `immutable` is set",
                        ));
                    }
                }
            }
            if kind == "Secret"
                && at(old, "/type") != at(new, "/type")
                && !at(old, "/type").is_null()
            {
                errs.push(field_error(
                    FieldErrorKind::Invalid,
                    "type",
                    format!("Invalid value: {}: field is immutable", at(new, "/type")),
                ));
            }
        }
        "PersistentVolumeClaim" => {
            // As the real validation: `volumeName` may be set once, by the
            // binder, on a claim that has none.
            let unbound = at(old, "/spec/volumeName").as_str().is_none_or(str::is_empty);
            let ignored: &[&str] = if unbound {
                &["resources", "volumeAttributesClassName", "volumeName"]
            } else {
                &["resources", "volumeAttributesClassName"]
            };
            let o = without(at(old, "/spec"), ignored);
            let n = without(at(new, "/spec"), ignored);
            if o != n {
                errs.push(field_error(
                    FieldErrorKind::Forbidden,
                    "spec",
                    "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
                ));
            }
        }
        "StorageClass" => {
            // ValidateStorageClassUpdate
            let forbidden = |field: &str| {
                field_error(FieldErrorKind::Forbidden, field, format!("Forbidden: updates to {field} are forbidden."))
            };
            let params = |v: &Value| match at(v, "/parameters") {
                Value::Object(m) if m.is_empty() => Value::Null,
                p => p.clone(),
            };
            if params(old) != params(new) {
                errs.push(forbidden("parameters"));
            }
            for field in ["provisioner", "reclaimPolicy"] {
                if at(old, &format!("/{field}")) != at(new, &format!("/{field}")) {
                    errs.push(forbidden(field));
                }
            }
            if at(old, "/volumeBindingMode") != at(new, "/volumeBindingMode") {
                errs.push(field_error(
                    FieldErrorKind::Invalid,
                    "volumeBindingMode",
                    format!("Invalid value: {}: field is immutable", at(new, "/volumeBindingMode")),
                ));
            }
        }
        "Service" => {
            let oc = at(old, "/spec/clusterIP");
            let nc = at(new, "/spec/clusterIP");
            if !oc.is_null() && oc != nc {
                errs.push(field_error(
                    FieldErrorKind::Invalid,
                    "spec.clusterIPs[0]",
                    format!("Invalid value: {}: may not change once set", nc),
                ));
            }
        }
        "Pod" => {
            let strip = |spec: &Value| -> Value {
                let mut s = without(spec, &["activeDeadlineSeconds", "tolerations"]);
                for list in ["containers", "initContainers"] {
                    if let Some(cs) = s.get_mut(list).and_then(Value::as_array_mut) {
                        for c in cs {
                            if let Some(o) = c.as_object_mut() {
                                o.remove("image");
                            }
                        }
                    }
                }
                s
            };
            if strip(at(old, "/spec")) != strip(at(new, "/spec")) {
                errs.push(field_error(
                    FieldErrorKind::Forbidden,
                    "spec",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                ));
            }
        }
        _ => {}
    }
    errs
}

/// `Unsupported value: "x": supported values: "a", "b"`.
fn not_supported(field: &str, value: &Value, supported: &[&str]) -> FieldError {
    let list = supported.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    field_error(FieldErrorKind::NotSupported, field, format!("Unsupported value: {value}: supported values: {list}"))
}

/// A qualified name (`[prefix/]name`, as label keys and provisioners):
/// the problems found, in upstream's words.
fn qualified_name(value: &str) -> Vec<String> {
    let (prefix, name) = match value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    let mut problems = Vec::new();
    let name_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let ends = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if name.is_empty() {
        problems.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        problems.push("name part must be no more than 63 characters".to_string());
    }
    if !(name.is_empty() || name_chars && ends) {
        problems.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string());
    }
    if let Some(p) = prefix {
        if p.is_empty() {
            problems.push("prefix part must be non-empty".to_string());
        } else if let Some(e) = dns1123_subdomain(p) {
            problems.push(format!("prefix part {}", e.trim_start_matches(&format!("Invalid value: \"{p}\": "))));
        }
    }
    problems
}

/// Validation of built-in objects on create and update (after defaulting):
/// the spec rules of upstream's `Validate<Kind>` that the sandbox's kinds
/// run into.
pub fn validate_builtin(kind: &str, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match kind {
        "StorageClass" => {
            match at(obj, "/provisioner").as_str().unwrap_or_default() {
                "" => errs.push(field_error(FieldErrorKind::Required, "provisioner", "Required value")),
                p => {
                    for problem in qualified_name(&p.to_lowercase()) {
                        errs.push(field_error(
                            FieldErrorKind::Invalid,
                            "provisioner",
                            format!("Invalid value: \"{p}\": {problem}"),
                        ));
                    }
                }
            }
            let policy = at(obj, "/reclaimPolicy");
            if policy.as_str().is_some_and(|p| !p.is_empty() && p != "Delete" && p != "Retain") {
                errs.push(not_supported("reclaimPolicy", policy, &["Delete", "Retain"]));
            }
            let mode = at(obj, "/volumeBindingMode");
            match mode.as_str() {
                None => errs.push(field_error(FieldErrorKind::Required, "volumeBindingMode", "Required value")),
                Some("Immediate" | "WaitForFirstConsumer") => {}
                Some(_) => errs.push(not_supported("volumeBindingMode", mode, &["Immediate", "WaitForFirstConsumer"])),
            }
        }
        "PersistentVolumeClaim" => errs.extend(claim_data_sources(obj)),
        "Job" => {
            let policy = match at(obj, "/spec/template/spec/restartPolicy") {
                Value::Null => json!("Always"),
                p => p.clone(),
            };
            if policy != "OnFailure" && policy != "Never" {
                errs.push(not_supported("spec.template.spec.restartPolicy", &policy, &["OnFailure", "Never"]));
            }
            let selector = at(obj, "/spec/selector/matchLabels").as_object();
            let labels = at(obj, "/spec/template/metadata/labels");
            if let Some(selector) = selector
                && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            {
                errs.push(field_error(
                    FieldErrorKind::Invalid,
                    "spec.template.metadata.labels",
                    format!("Invalid value: {labels}: `selector` does not match template `labels`"),
                ));
            }
            if at(obj, "/spec/manualSelector") != &Value::Bool(true) {
                let uid = at(obj, "/metadata/uid");
                if selector.and_then(|s| s.get(crate::apiserver::defaults::CONTROLLER_UID_LABEL)) != Some(uid) {
                    errs.push(field_error(
                        FieldErrorKind::Invalid,
                        "spec.selector",
                        format!("Invalid value: {}: `selector` not auto-generated", at(obj, "/spec/selector")),
                    ));
                }
            }
        }
        _ => {}
    }
    errs
}

/// The `dataSource` / `dataSourceRef` rules of `ValidatePersistentVolumeClaimSpec`.
fn claim_data_sources(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let source = at(obj, "/spec/dataSource");
    let source_ref = at(obj, "/spec/dataSourceRef");
    for (field, r) in [("spec.dataSource", source), ("spec.dataSourceRef", source_ref)] {
        if r.is_null() {
            continue;
        }
        if at(r, "/name").as_str().is_none_or(str::is_empty) {
            errs.push(field_error(FieldErrorKind::Required, &format!("{field}.name"), "Required value"));
        }
        let kind = at(r, "/kind").as_str().unwrap_or_default();
        if kind.is_empty() {
            errs.push(field_error(FieldErrorKind::Required, &format!("{field}.kind"), "Required value"));
        }
        let group = at(r, "/apiGroup").as_str().unwrap_or_default();
        if group.is_empty() && kind != "PersistentVolumeClaim" {
            errs.push(field_error(
                FieldErrorKind::Invalid,
                field,
                format!("Invalid value: \"{kind}\": must be 'PersistentVolumeClaim' when referencing the default apiGroup"),
            ));
        }
    }
    let cross = at(source_ref, "/namespace").as_str().is_some_and(|n| !n.is_empty());
    let fields = |r: &Value| ["apiGroup", "kind", "name"].map(|k| at(r, &format!("/{k}")).as_str().unwrap_or_default().to_string());
    if cross && !source.is_null() {
        errs.push(field_error(
            FieldErrorKind::Invalid,
            "spec",
            "Invalid value: \"dataSource\": may not be specified when dataSourceRef.namespace is specified",
        ));
    } else if !cross && !source.is_null() && !source_ref.is_null() && fields(source) != fields(source_ref) {
        errs.push(field_error(
            FieldErrorKind::Invalid,
            "spec",
            "Invalid value: \"dataSource\": must match dataSourceRef",
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(dns1123_subdomain("etcd-0").is_none());
        assert!(dns1123_subdomain("a.b-c").is_none());
        assert!(dns1123_subdomain("Bad").is_some());
        assert!(dns1123_label("a.b").is_some());
        assert_eq!(validate_name("Namespace", "clusters-demo"), vec![]);
        assert_eq!(validate_name("ConfigMap", "x_y").len(), 1);
    }

    #[test]
    fn statefulset_selector_is_immutable_replicas_not() {
        let old = json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"app": "etcd"}}, "serviceName": "etcd-discovery"}});
        let mut scaled = old.clone();
        scaled["spec"]["replicas"] = json!(0);
        assert!(validate_builtin_update("StatefulSet", &old, &scaled).is_empty());
        let mut bad = old.clone();
        bad["spec"]["serviceName"] = json!("other");
        let errs = validate_builtin_update("StatefulSet", &old, &bad);
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0]
                .detail
                .starts_with("Forbidden: updates to statefulset spec")
        );
    }

    #[test]
    fn immutable_secret_data() {
        let old = json!({"immutable": true, "data": {"a": "eA=="}});
        let new = json!({"immutable": true, "data": {"a": "eQ=="}});
        assert_eq!(validate_builtin_update("Secret", &old, &new).len(), 1);
        assert!(validate_builtin_update("Secret", &old, &old).is_empty());
    }
}
