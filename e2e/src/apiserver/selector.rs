//! Label and field selectors as the list and watch verbs accept them.

use serde_json::Value;

/// A requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
pub enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(pub Vec<Req>);

/// A parsed field selector: (field, equal?, value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// Why a selector could not be parsed (400 for the caller).
#[derive(Debug, thiserror::Error)]
pub enum SelectorError {
    /// The label selector text is malformed.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// The field selector names a field that is not supported for this kind.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
    /// The field selector text is malformed.
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    Field(String, String),
}

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && k.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn set_values(s: &str) -> Result<Vec<String>, SelectorError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| SelectorError::Label(format!("found '{s}', expected: '('")))?;
    let vals: Vec<String> = inner
        .split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect();
    if let Some(bad) = vals.iter().find(|v| !valid_value(v)) {
        return Err(SelectorError::Label(format!(
            "invalid label value: \"{bad}\""
        )));
    }
    Ok(vals)
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let key_err = |k: &str| SelectorError::Label(format!("invalid label key \"{k}\""));
            let req = if let Some(k) = part.strip_prefix('!') {
                let k = k.trim();
                if !valid_key(k) {
                    return Err(key_err(k));
                }
                Req::NotExists(k.to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some(idx) = part.find(" notin ") {
                Req::NotIn(
                    part[..idx].trim().to_string(),
                    set_values(&part[idx + 7..])?,
                )
            } else if let Some(idx) = part.find(" in ") {
                Req::In(
                    part[..idx].trim().to_string(),
                    set_values(&part[idx + 4..])?,
                )
            } else if valid_key(&part) {
                Req::Exists(part.clone())
            } else {
                return Err(SelectorError::Label(format!(
                    "found '{part}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            };
            match &req {
                Req::Eq(k, v) | Req::NotEq(k, v) => {
                    if !valid_key(k) {
                        return Err(key_err(k));
                    }
                    if !valid_value(v) {
                        return Err(SelectorError::Label(format!(
                            "invalid label value: \"{v}\""
                        )));
                    }
                }
                Req::In(k, _) | Req::NotIn(k, _) | Req::Exists(k) if !valid_key(k) => {
                    return Err(key_err(k));
                }
                _ => {}
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }

    /// Build the selector string of a `metav1.LabelSelector` object (for `/scale`).
    pub fn string_from_object(sel: &Value) -> String {
        let mut parts = Vec::new();
        if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
                let vals: Vec<&str> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                match e
                    .get("operator")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                {
                    "In" => parts.push(format!("{key} in ({})", vals.join(","))),
                    "NotIn" => parts.push(format!("{key} notin ({})", vals.join(","))),
                    "Exists" => parts.push(key.to_string()),
                    "DoesNotExist" => parts.push(format!("!{key}")),
                    _ => {}
                }
            }
        }
        parts.sort();
        parts.join(",")
    }
}

/// Field paths a field selector may use for a kind (`metadata.name` and
/// `metadata.namespace` everywhere).
fn field_value(
    obj: &Value,
    field: &str,
    kind: &str,
    builtin: bool,
) -> Result<String, SelectorError> {
    let ptr = match field {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        "status.phase" if kind == "Pod" || kind == "Namespace" => "/status/phase",
        "spec.nodeName" if kind == "Pod" => "/spec/nodeName",
        "type" if kind == "Secret" => "/type",
        "involvedObject.name" if kind == "Event" => "/involvedObject/name",
        "involvedObject.kind" if kind == "Event" => "/involvedObject/kind",
        "involvedObject.namespace" if kind == "Event" => "/involvedObject/namespace",
        _ => {
            let _ = builtin;
            return Err(SelectorError::UnsupportedField(format!(
                "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )));
        }
    };
    Ok(obj
        .pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string())
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(SelectorError::Field(s.to_string(), part.to_string()));
            };
            out.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Check that every field is supported for `kind`.
    pub fn check(&self, kind: &str, builtin: bool) -> Result<(), SelectorError> {
        let probe = Value::Object(Default::default());
        for (k, _, _) in &self.0 {
            field_value(&probe, k, kind, builtin)?;
        }
        Ok(())
    }

    pub fn matches(&self, obj: &Value, kind: &str, builtin: bool) -> bool {
        self.0
            .iter()
            .all(|(k, eq, v)| match field_value(obj, k, kind, builtin) {
                Ok(actual) => (actual == *v) == *eq,
                Err(_) => false,
            })
    }

    /// The single `metadata.name=x` value, if the selector pins a name.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| k == "metadata.name" && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "etcd", "tier": "cp"}));
        let t = |s: &str| LabelSelector::parse(s).expect(s).matches(&o);
        assert!(t("app=etcd"));
        assert!(t("app==etcd,tier=cp"));
        assert!(!t("app!=etcd"));
        assert!(t("app in (etcd, kas)"));
        assert!(!t("app notin (etcd)"));
        assert!(t("tier"));
        assert!(t("!missing"));
        assert!(!t("!app"));
        assert!(t("missing notin (x)"));
        assert!(t(""));
    }

    #[test]
    fn label_selector_rejects_garbage() {
        assert!(LabelSelector::parse("app=(x").is_err());
        assert!(LabelSelector::parse("-bad=1").is_err());
    }

    #[test]
    fn field_selector_name_and_namespace() {
        let o = obj(json!({}));
        let f = FieldSelector::parse("metadata.name=a,metadata.namespace!=other").expect("parse");
        assert!(f.matches(&o, "ConfigMap", true));
        assert_eq!(f.pinned_name(), Some("a"));
        assert!(
            FieldSelector::parse("spec.foo=1")
                .expect("parse")
                .check("ConfigMap", true)
                .is_err()
        );
        assert!(
            FieldSelector::parse("status.phase=Running")
                .expect("parse")
                .check("Pod", true)
                .is_ok()
        );
    }

    #[test]
    fn selector_string_from_label_selector_object() {
        let s = LabelSelector::string_from_object(&json!({"matchLabels": {"app": "etcd"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["cp"]}]}));
        assert_eq!(s, "app=etcd,tier in (cp)");
    }
}
