//! Structural-schema handling for CustomResourceDefinitions, as a real API
//! server does it: defaulting, pruning of unknown fields, OpenAPI v3
//! validation (types, required, enum, formats, min/max, maxItems, maxLength,
//! patterns, list types) and `x-kubernetes-validations` CEL rules evaluated
//! by `cel.rs` (including transition rules with `oldSelf`).
//!
//! The schema is compiled once into a tree of [`Node`]s (regular expressions
//! and CEL programs included), so requests never walk the CRD's JSON again.
//!
//! Known differences from apiextensions-apiserver:
//! - validation ratcheting is approximated: on update, a subtree whose value
//!   equals its correlated old value is not validated again (upstream
//!   ratchets per error, with the same correlation rules);
//! - `metadata` at the root is left to the caller (name/generateName rules);
//! - formats are checked for the common `strfmt` names only (date-time, date,
//!   byte, int32, int64, uuid, ipv4, ipv6, cidr, hostname, email, duration,
//!   uri); unknown formats are accepted, as upstream does;
//! - CEL rules the interpreter cannot compile are not enforced; they are
//!   listed by [`Schema::skipped_rules`]; there is no CEL cost budget.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::cel::{CelValue, LazyRegex, ListKind, Rule, Verdict};

/// One invalid field, the unit of a 422 `Status` body's `details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    /// Path as the real server prints it, e.g. `spec.pausedUntil` or
    /// `spec.etcd.managed.storage.restoreSnapshotURL`.
    pub field: String,
    /// The offending value, when there is one.
    pub value: Option<Value>,
    /// Human text, e.g. `Invalid value: "soon": PausedUntil must be a date in RFC3339 format or 'True', 'true', 'False' or 'false'`.
    pub detail: String,
}

impl FieldError {
    /// `field: detail`, as upstream's `field.Error.Error()` prints it.
    pub fn message(&self) -> String {
        format!("{}: {}", self.field, self.detail)
    }
}

/// Mirrors k8s.io/apimachinery field.ErrorType; `reason()` gives the
/// `FieldValueRequired`-style string for `details.causes[].reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    NotSupported,
    TooMany,
    TooLong,
    TypeInvalid,
    Forbidden,
    Duplicate,
}

impl FieldErrorKind {
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
        }
    }

    /// Upstream's `ErrorType.String()`.
    fn label(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid | FieldErrorKind::TypeInvalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::Duplicate => "Duplicate value",
        }
    }
}

/// The schema could not be compiled.
#[derive(Debug, thiserror::Error)]
#[error("invalid openAPIV3Schema at {path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Object => "object",
            Ty::Array => "array",
            Ty::String => "string",
            Ty::Integer => "integer",
            Ty::Number => "number",
            Ty::Boolean => "boolean",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum ListType {
    Atomic,
    Set,
    Map(Arc<[String]>),
}

#[derive(Debug)]
enum Additional {
    Allowed(bool),
    Schema(Box<Node>),
}

/// One compiled schema node.
#[derive(Debug, Default)]
struct Node {
    ty: Option<Ty>,
    nullable: bool,
    format: Option<String>,
    enum_values: Option<Vec<Value>>,
    minimum: Option<f64>,
    exclusive_minimum: bool,
    maximum: Option<f64>,
    exclusive_maximum: bool,
    multiple_of: Option<f64>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    unique_items: bool,
    pattern: Option<LazyRegex>,
    required: Vec<String>,
    properties: Option<BTreeMap<String, Node>>,
    additional: Option<Additional>,
    items: Option<Box<Node>>,
    int_or_string: bool,
    preserve_unknown: bool,
    embedded: bool,
    list_type: Option<ListType>,
    all_of: Vec<Node>,
    any_of: Vec<Node>,
    one_of: Vec<Node>,
    not: Option<Box<Node>>,
    default: Option<Value>,
    rules: Vec<Rule>,
}

/// A compiled `openAPIV3Schema` of one CRD version.
#[derive(Debug, Clone)]
pub struct Schema {
    root: Arc<Node>,
    skipped: Arc<Vec<String>>,
}

struct Compiler {
    skipped: Vec<String>,
}

fn schema_err<T>(path: &str, message: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError {
        path: path.to_string(),
        message: message.into(),
    })
}

fn u64_at(map: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) => Ok(Some(n)),
            None => schema_err(path, format!("{key} must be a non-negative integer")),
        },
    }
}

fn f64_at(map: &Map<String, Value>, key: &str, path: &str) -> Result<Option<f64>, SchemaError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(n) => Ok(Some(n)),
            None => schema_err(path, format!("{key} must be a number")),
        },
    }
}

fn bool_at(map: &Map<String, Value>, key: &str) -> bool {
    map.get(key).and_then(Value::as_bool).unwrap_or(false)
}

impl Compiler {
    fn node(&mut self, value: &Value, path: &str) -> Result<Node, SchemaError> {
        let Value::Object(map) = value else {
            return schema_err(path, "a schema must be an object");
        };
        let ty = match map.get("type").and_then(Value::as_str) {
            None | Some("") => None,
            Some("object") => Some(Ty::Object),
            Some("array") => Some(Ty::Array),
            Some("string") => Some(Ty::String),
            Some("integer") => Some(Ty::Integer),
            Some("number") => Some(Ty::Number),
            Some("boolean") => Some(Ty::Boolean),
            Some(other) => return schema_err(path, format!("unsupported type {other:?}")),
        };
        let mut node = Node {
            ty,
            ..Node::default()
        };
        node.nullable = bool_at(map, "nullable");
        node.format = map
            .get("format")
            .and_then(Value::as_str)
            .map(str::to_string);
        node.enum_values = map.get("enum").and_then(Value::as_array).cloned();
        node.minimum = f64_at(map, "minimum", path)?;
        node.maximum = f64_at(map, "maximum", path)?;
        node.exclusive_minimum = bool_at(map, "exclusiveMinimum");
        node.exclusive_maximum = bool_at(map, "exclusiveMaximum");
        node.multiple_of = f64_at(map, "multipleOf", path)?;
        node.min_length = u64_at(map, "minLength", path)?;
        node.max_length = u64_at(map, "maxLength", path)?;
        node.min_items = u64_at(map, "minItems", path)?;
        node.max_items = u64_at(map, "maxItems", path)?;
        node.min_properties = u64_at(map, "minProperties", path)?;
        node.max_properties = u64_at(map, "maxProperties", path)?;
        node.unique_items = bool_at(map, "uniqueItems");
        if let Some(p) = map.get("pattern").and_then(Value::as_str) {
            match LazyRegex::new(p) {
                Ok(re) => node.pattern = Some(re),
                Err(e) => self
                    .skipped
                    .push(format!("{path}: pattern {p:?} not enforced: {e}")),
            }
        }
        node.required = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(props) = map.get("properties") {
            let Value::Object(props) = props else {
                return schema_err(path, "properties must be an object");
            };
            let mut out = BTreeMap::new();
            for (k, v) in props {
                out.insert(k.clone(), self.node(v, &join(path, k))?);
            }
            node.properties = Some(out);
        }
        node.additional = match map.get("additionalProperties") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(Additional::Allowed(*b)),
            Some(v) => Some(Additional::Schema(Box::new(
                self.node(v, &format!("{path}[*]"))?,
            ))),
        };
        if let Some(items) = map.get("items") {
            node.items = Some(Box::new(self.node(items, &format!("{path}[*]"))?));
        }
        node.int_or_string = bool_at(map, "x-kubernetes-int-or-string");
        node.preserve_unknown = bool_at(map, "x-kubernetes-preserve-unknown-fields");
        node.embedded = bool_at(map, "x-kubernetes-embedded-resource");
        node.list_type = match map.get("x-kubernetes-list-type").and_then(Value::as_str) {
            None => None,
            Some("atomic") => Some(ListType::Atomic),
            Some("set") => Some(ListType::Set),
            Some("map") => {
                let keys: Vec<String> = map
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| {
                        k.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                if keys.is_empty() {
                    return schema_err(
                        path,
                        "x-kubernetes-list-type map requires x-kubernetes-list-map-keys",
                    );
                }
                Some(ListType::Map(keys.into()))
            }
            Some(other) => {
                return schema_err(
                    path,
                    format!("unsupported x-kubernetes-list-type {other:?}"),
                );
            }
        };
        for (key, target) in [
            ("allOf", &mut node.all_of),
            ("anyOf", &mut node.any_of),
            ("oneOf", &mut node.one_of),
        ] {
            if let Some(list) = map.get(key).and_then(Value::as_array) {
                for (i, sub) in list.iter().enumerate() {
                    target.push(self.node(sub, &format!("{path}.{key}[{i}]"))?);
                }
            }
        }
        if let Some(not) = map.get("not") {
            node.not = Some(Box::new(self.node(not, &format!("{path}.not"))?));
        }
        node.default = map.get("default").cloned();
        if let Some(rules) = map
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
        {
            for entry in rules {
                match Rule::compile(entry) {
                    Ok(rule) => node.rules.push(rule),
                    Err(e) => {
                        let src = entry
                            .get("rule")
                            .and_then(Value::as_str)
                            .unwrap_or("<missing>");
                        self.skipped.push(format!(
                            "{}: {src}: {e}",
                            if path.is_empty() { "<root>" } else { path }
                        ));
                    }
                }
            }
        }
        Ok(node)
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn keyed(path: &str, key: &str) -> String {
    format!("{path}[{key}]")
}

/// Upstream's `%v`-style rendering of a bad value in an error body.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".to_string(),
        other => other.to_string(),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn type_matches(ty: Ty, value: &Value) -> bool {
    match ty {
        Ty::Object => value.is_object(),
        Ty::Array => value.is_array(),
        Ty::String => value.is_string(),
        Ty::Integer => is_integer(value),
        Ty::Number => value.is_number(),
        Ty::Boolean => value.is_boolean(),
    }
}

/// Errors of one validation: schema (OpenAPI) errors first, then CEL rule
/// errors, as apiextensions-apiserver concatenates them.
#[derive(Default)]
struct Errors {
    out: Vec<FieldError>,
    cel: Vec<FieldError>,
    /// While true, `push` goes to `cel`.
    in_rules: bool,
}

impl Errors {
    fn push(&mut self, kind: FieldErrorKind, field: &str, value: Option<Value>, detail: &str) {
        let body = match (kind, &value) {
            (FieldErrorKind::Required | FieldErrorKind::Forbidden | FieldErrorKind::TooLong, _)
            | (_, None) => {
                if detail.is_empty() {
                    kind.label().to_string()
                } else {
                    format!("{}: {detail}", kind.label())
                }
            }
            (_, Some(v)) => {
                if detail.is_empty() {
                    format!("{}: {}", kind.label(), render(v))
                } else {
                    format!("{}: {}: {detail}", kind.label(), render(v))
                }
            }
        };
        // A nil field.Path (rules on the root) prints as `<nil>` upstream.
        let field = if field.is_empty() { "<nil>" } else { field };
        let err = FieldError {
            kind,
            field: field.to_string(),
            value,
            detail: body,
        };
        if self.in_rules {
            self.cel.push(err)
        } else {
            self.out.push(err)
        }
    }

    /// kube-openapi's generic form: `Invalid value: <v>: <path> in body <msg>`.
    fn finish(mut self) -> Vec<FieldError> {
        self.out.append(&mut self.cel);
        self.out
    }

    fn in_body(&mut self, field: &str, value: &Value, msg: &str) {
        self.push(
            FieldErrorKind::Invalid,
            field,
            Some(value.clone()),
            &format!("{field} in body {msg}"),
        );
    }
}

fn check_format(format: &str, s: &str) -> bool {
    use base64::Engine as _;
    match format {
        "date-time" | "datetime" => chrono::DateTime::parse_from_rfc3339(s).is_ok(),
        "date" => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok(),
        "byte" => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
        "int32" => s.parse::<i32>().is_ok(),
        "int64" => s.parse::<i64>().is_ok(),
        "uuid" => {
            let b = s.as_bytes();
            b.len() == 36
                && b.iter().enumerate().all(|(i, c)| {
                    if matches!(i, 8 | 13 | 18 | 23) {
                        *c == b'-'
                    } else {
                        c.is_ascii_hexdigit()
                    }
                })
        }
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, p)| {
            ip.parse::<std::net::IpAddr>().is_ok() && p.parse::<u8>().is_ok_and(|p| p <= 128)
        }),
        "hostname" => {
            !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        }
        "email" => s
            .split_once('@')
            .is_some_and(|(a, b)| !a.is_empty() && b.contains('.')),
        "duration" => {
            let re_ok = s
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '+');
            re_ok && s.chars().any(|c| c.is_ascii_alphabetic())
        }
        "uri" => s.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }),
        _ => true,
    }
}

/// The old value correlated with a list item, as upstream correlates them
/// (map lists by keys, set lists by value, atomic lists not at all).
fn correlate_item<'a>(
    list_type: Option<&ListType>,
    item: &Value,
    old: Option<&'a Value>,
) -> Option<&'a Value> {
    let old = old?.as_array()?;
    match list_type? {
        ListType::Atomic => None,
        ListType::Set => old.iter().find(|o| *o == item),
        ListType::Map(keys) => {
            let key_of = |v: &Value| -> Vec<Option<Value>> {
                keys.iter().map(|k| v.get(k).cloned()).collect()
            };
            let want = key_of(item);
            old.iter().find(|o| key_of(o) == want)
        }
    }
}

impl Node {
    fn type_name(&self) -> &'static str {
        match self.ty {
            Some(t) => t.name(),
            None => "",
        }
    }

    /// Convert a value to CEL with list kinds from the schema.
    fn to_cel(&self, value: &Value) -> CelValue {
        match value {
            Value::Array(items) => {
                let item_node = self.items.as_deref();
                let converted = items
                    .iter()
                    .map(|i| item_node.map_or_else(|| CelValue::from_json(i), |n| n.to_cel(i)))
                    .collect();
                let kind = match &self.list_type {
                    Some(ListType::Set) => ListKind::Set,
                    Some(ListType::Map(keys)) => ListKind::Map(keys.clone()),
                    _ => ListKind::Atomic,
                };
                CelValue::List(Arc::new(converted), kind)
            }
            Value::Object(map) => {
                let out: BTreeMap<String, CelValue> =
                    map.iter()
                        .map(|(k, v)| {
                            let child = self.properties.as_ref().and_then(|p| p.get(k)).or(
                                match &self.additional {
                                    Some(Additional::Schema(s)) => Some(s.as_ref()),
                                    _ => None,
                                },
                            );
                            (
                                k.clone(),
                                child.map_or_else(|| CelValue::from_json(v), |n| n.to_cel(v)),
                            )
                        })
                        .collect();
                CelValue::Map(Arc::new(out))
            }
            other => CelValue::from_json(other),
        }
    }

    fn default_into(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                if let Some(props) = &self.properties {
                    for (k, prop) in props {
                        let missing = match map.get(k) {
                            None => true,
                            Some(Value::Null) => !prop.nullable,
                            Some(_) => false,
                        };
                        if missing {
                            match &prop.default {
                                Some(d) => {
                                    map.insert(k.clone(), d.clone());
                                }
                                None => {
                                    // Non-nullable nulls without a default are pruned.
                                    if map.get(k).is_some_and(Value::is_null) {
                                        map.shift_remove(k);
                                    }
                                }
                            }
                        }
                    }
                }
                for (k, v) in map.iter_mut() {
                    if let Some(prop) = self.properties.as_ref().and_then(|p| p.get(k)) {
                        prop.default_into(v);
                    } else if let Some(Additional::Schema(s)) = &self.additional {
                        s.default_into(v);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_node) = &self.items {
                    for item in items.iter_mut() {
                        if item.is_null()
                            && !item_node.nullable
                            && let Some(d) = &item_node.default
                        {
                            *item = d.clone();
                        }
                        item_node.default_into(item);
                    }
                }
            }
            _ => {}
        }
    }

    fn prune_into(&self, value: &mut Value, path: &str, root: bool, removed: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                let keep_unknown = self.preserve_unknown
                    || matches!(self.additional, Some(Additional::Allowed(true)));
                let mut drop = Vec::new();
                for (k, v) in map.iter_mut() {
                    let meta_key = (root || self.embedded)
                        && matches!(k.as_str(), "apiVersion" | "kind" | "metadata");
                    if root && k == "metadata" {
                        continue;
                    }
                    let child_path = join(path, k);
                    if let Some(prop) = self.properties.as_ref().and_then(|p| p.get(k)) {
                        prop.prune_into(v, &child_path, false, removed);
                    } else if let Some(Additional::Schema(s)) = &self.additional {
                        s.prune_into(v, &child_path, false, removed);
                    } else if !keep_unknown && !meta_key {
                        drop.push(k.clone());
                    }
                }
                for k in drop {
                    map.shift_remove(&k);
                    removed.push(join(path, &k));
                }
            }
            Value::Array(items) => {
                if let Some(item_node) = &self.items {
                    for (i, item) in items.iter_mut().enumerate() {
                        item_node.prune_into(item, &index(path, i), false, removed);
                    }
                }
            }
            _ => {}
        }
    }

    /// Validate `value` at `path`. `old` is the correlated old value on
    /// update (None on create or when nothing correlates); `update` says
    /// whether this is an update at all.
    fn validate(
        &self,
        value: &Value,
        old: Option<&Value>,
        path: &str,
        root: bool,
        errs: &mut Errors,
    ) {
        if let Some(o) = old
            && o == value
        {
            // Ratcheting: unchanged values are not validated again.
            return;
        }
        if value.is_null() {
            if self.nullable {
                return;
            }
            if let Some(ty) = self.ty {
                errs.push(
                    FieldErrorKind::TypeInvalid,
                    path,
                    Some(Value::String("null".into())),
                    &format!("{path} in body must be of type {}: \"null\"", ty.name()),
                );
                return;
            }
        }
        if self.int_or_string {
            if !(value.is_string() || is_integer(value)) {
                errs.push(
                    FieldErrorKind::TypeInvalid,
                    path,
                    Some(Value::String(json_type(value).into())),
                    &format!(
                        "{path} in body must be of type integer,string: {}",
                        render(&Value::String(json_type(value).into()))
                    ),
                );
                return;
            }
        } else if let Some(ty) = self.ty
            && !type_matches(ty, value)
        {
            let actual = json_type(value);
            errs.push(
                FieldErrorKind::TypeInvalid,
                path,
                Some(Value::String(actual.into())),
                &format!("{path} in body must be of type {}: {actual:?}", ty.name()),
            );
            return;
        }
        self.validate_value(value, path, errs);
        // CEL rules run unless the value has the wrong type (returned above),
        // top-down like upstream's walk: a node's rules before its children's.
        self.validate_rules(value, old, path, errs);
        match value {
            Value::Object(map) => self.validate_object(map, old, path, root, errs),
            Value::Array(items) => self.validate_array(items, old, path, errs),
            _ => {}
        }
    }

    /// enum, format, bounds, lengths, pattern, and the value-validation combinators.
    fn validate_value(&self, value: &Value, path: &str, errs: &mut Errors) {
        if let Some(allowed) = &self.enum_values
            && !allowed.iter().any(|a| a == value)
        {
            let list: Vec<String> = allowed.iter().map(render).collect();
            errs.push(
                FieldErrorKind::NotSupported,
                path,
                Some(value.clone()),
                &format!("supported values: {}", list.join(", ")),
            );
        }
        if let Value::String(s) = value {
            if let Some(max) = self.max_length
                && s.chars().count() as u64 > max
            {
                errs.push(
                    FieldErrorKind::TooLong,
                    path,
                    Some(value.clone()),
                    &format!(
                        "may not be more than {max} {}",
                        if max == 1 { "byte" } else { "bytes" }
                    ),
                );
            }
            if let Some(min) = self.min_length
                && (s.chars().count() as u64) < min
            {
                errs.in_body(path, value, &format!("should be at least {min} chars long"));
            }
            if let Some(re) = &self.pattern {
                match re.is_match(s) {
                    Ok(true) => {}
                    Ok(false) => {
                        errs.in_body(path, value, &format!("should match '{}'", re.as_str()))
                    }
                    Err(e) => errs.in_body(
                        path,
                        value,
                        &format!("pattern '{}' cannot be evaluated: {e}", re.as_str()),
                    ),
                }
            }
            if let Some(format) = &self.format
                && !check_format(format, s)
            {
                errs.in_body(
                    path,
                    value,
                    &format!("must be of type {format}: {}", render(value)),
                );
            }
        }
        if let Some(n) = value.as_f64() {
            if let Some(min) = self.minimum
                && ((self.exclusive_minimum && n <= min) || n < min)
            {
                let rel = if self.exclusive_minimum {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                errs.in_body(path, value, &format!("should be {rel} {}", trim_float(min)));
            }
            if let Some(max) = self.maximum
                && ((self.exclusive_maximum && n >= max) || n > max)
            {
                let rel = if self.exclusive_maximum {
                    "less than"
                } else {
                    "less than or equal to"
                };
                errs.in_body(path, value, &format!("should be {rel} {}", trim_float(max)));
            }
            if let Some(m) = self.multiple_of
                && m != 0.0
                && (n / m).fract().abs() > f64::EPSILON
            {
                errs.in_body(
                    path,
                    value,
                    &format!("should be a multiple of {}", trim_float(m)),
                );
            }
        }
        if let Value::Array(items) = value {
            if let Some(max) = self.max_items
                && items.len() as u64 > max
            {
                errs.push(
                    FieldErrorKind::TooMany,
                    path,
                    Some(Value::from(items.len())),
                    &format!("must have at most {max} items"),
                );
            }
            if let Some(min) = self.min_items
                && (items.len() as u64) < min
            {
                errs.in_body(
                    path,
                    &Value::from(items.len()),
                    &format!("should have at least {min} items"),
                );
            }
            if self.unique_items {
                for (i, item) in items.iter().enumerate() {
                    if items[..i].contains(item) {
                        errs.push(
                            FieldErrorKind::Duplicate,
                            &index(path, i),
                            Some(item.clone()),
                            "",
                        );
                    }
                }
            }
        }
        if let Value::Object(map) = value {
            if let Some(max) = self.max_properties
                && map.len() as u64 > max
            {
                errs.push(
                    FieldErrorKind::TooMany,
                    path,
                    Some(Value::from(map.len())),
                    &format!("must have at most {max} items"),
                );
            }
            if let Some(min) = self.min_properties
                && (map.len() as u64) < min
            {
                errs.in_body(
                    path,
                    &Value::from(map.len()),
                    &format!("should have at least {min} properties"),
                );
            }
        }
        // Value validations: all of the sub-schema errors count for allOf;
        // anyOf/oneOf/not report one summary error each.
        for sub in &self.all_of {
            sub.validate_combinator(value, path, errs);
        }
        if !self.any_of.is_empty() {
            let ok = self.any_of.iter().any(|s| s.passes(value, path));
            if !ok {
                errs.in_body(path, value, "must validate at least one schema (anyOf)");
            }
        }
        if !self.one_of.is_empty() {
            let passing = self.one_of.iter().filter(|s| s.passes(value, path)).count();
            if passing != 1 {
                errs.in_body(path, value, "must validate one and only one schema (oneOf)");
            }
        }
        if let Some(not) = &self.not
            && not.passes(value, path)
        {
            errs.in_body(path, value, "must not validate the schema (not)");
        }
    }

    /// Validation inside allOf/anyOf/oneOf/not: types, values, required and
    /// nested properties, without CEL rules.
    fn validate_combinator(&self, value: &Value, path: &str, errs: &mut Errors) {
        if let Some(ty) = self.ty
            && !type_matches(ty, value)
            && !(value.is_null() && self.nullable)
        {
            let actual = json_type(value);
            errs.push(
                FieldErrorKind::TypeInvalid,
                path,
                Some(Value::String(actual.into())),
                &format!("{path} in body must be of type {}: {actual:?}", ty.name()),
            );
            return;
        }
        self.validate_value(value, path, errs);
        if let Value::Object(map) = value {
            for r in &self.required {
                if !map.contains_key(r) {
                    errs.push(FieldErrorKind::Required, &join(path, r), None, "");
                }
            }
            if let Some(props) = &self.properties {
                for (k, v) in map {
                    if let Some(p) = props.get(k) {
                        p.validate_combinator(v, &join(path, k), errs);
                    }
                }
            }
        }
        if let (Value::Array(items), Some(item_node)) = (value, &self.items) {
            for (i, item) in items.iter().enumerate() {
                item_node.validate_combinator(item, &index(path, i), errs);
            }
        }
    }

    fn passes(&self, value: &Value, path: &str) -> bool {
        let mut scratch = Errors::default();
        self.validate_combinator(value, path, &mut scratch);
        scratch.out.is_empty()
    }

    fn validate_object(
        &self,
        map: &Map<String, Value>,
        old: Option<&Value>,
        path: &str,
        root: bool,
        errs: &mut Errors,
    ) {
        for r in &self.required {
            if root && matches!(r.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if !map.contains_key(r)
                || (map.get(r).is_some_and(Value::is_null) && !self.nullable_prop(r))
            {
                errs.push(FieldErrorKind::Required, &join(path, r), None, "");
            }
        }
        if self.embedded && !map.is_empty() {
            for k in ["apiVersion", "kind"] {
                if map
                    .get(k)
                    .and_then(Value::as_str)
                    .is_none_or(|s| s.is_empty())
                {
                    errs.push(
                        FieldErrorKind::Required,
                        &join(path, k),
                        None,
                        "must not be empty",
                    );
                }
            }
        }
        for (k, v) in map {
            if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if self.embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            let old_child = old.and_then(|o| o.get(k));
            if let Some(prop) = self.properties.as_ref().and_then(|p| p.get(k)) {
                prop.validate(v, old_child, &join(path, k), false, errs);
            } else if let Some(Additional::Schema(s)) = &self.additional {
                s.validate(v, old_child, &keyed(path, k), false, errs);
            }
        }
    }

    fn nullable_prop(&self, key: &str) -> bool {
        self.properties
            .as_ref()
            .and_then(|p| p.get(key))
            .is_some_and(|p| p.nullable)
    }

    fn validate_array(&self, items: &[Value], old: Option<&Value>, path: &str, errs: &mut Errors) {
        match &self.list_type {
            Some(ListType::Set) => {
                for (i, item) in items.iter().enumerate() {
                    if items[..i].contains(item) {
                        errs.push(
                            FieldErrorKind::Duplicate,
                            &index(path, i),
                            Some(item.clone()),
                            "",
                        );
                    }
                }
            }
            Some(ListType::Map(keys)) => {
                let key_of = |v: &Value| -> Vec<Option<Value>> {
                    keys.iter().map(|k| v.get(k).cloned()).collect()
                };
                for (i, item) in items.iter().enumerate() {
                    let k = key_of(item);
                    if items[..i].iter().any(|o| key_of(o) == k) {
                        let key_map: Map<String, Value> = keys
                            .iter()
                            .filter_map(|name| item.get(name).map(|v| (name.clone(), v.clone())))
                            .collect();
                        errs.push(
                            FieldErrorKind::Duplicate,
                            &index(path, i),
                            Some(Value::Object(key_map)),
                            "",
                        );
                    }
                }
            }
            _ => {}
        }
        if let Some(item_node) = &self.items {
            for (i, item) in items.iter().enumerate() {
                let old_item = correlate_item(self.list_type.as_ref(), item, old);
                item_node.validate(item, old_item, &index(path, i), false, errs);
            }
        }
    }

    fn validate_rules(&self, value: &Value, old: Option<&Value>, path: &str, errs: &mut Errors) {
        if self.rules.is_empty() {
            return;
        }
        errs.in_rules = true;
        let this = self.to_cel(value);
        let old_cel = old.map(|o| self.to_cel(o));
        for rule in &self.rules {
            let field = match &rule.field_path {
                Some(fp) => {
                    let fp = fp.trim_start_matches('.');
                    if path.is_empty() {
                        fp.to_string()
                    } else {
                        format!("{path}.{fp}")
                    }
                }
                None => path.to_string(),
            };
            let type_value = Some(Value::String(self.type_name().into()));
            match rule.evaluate(&this, old_cel.as_ref()) {
                Verdict::Pass => {}
                Verdict::Fail(message) => {
                    let kind = match rule.reason.as_deref() {
                        Some("FieldValueRequired") => FieldErrorKind::Required,
                        Some("FieldValueForbidden") => FieldErrorKind::Forbidden,
                        Some("FieldValueDuplicate") => FieldErrorKind::Duplicate,
                        _ => FieldErrorKind::Invalid,
                    };
                    errs.push(kind, &field, type_value, &message);
                }
                Verdict::Error(message) => {
                    errs.push(
                        FieldErrorKind::Invalid,
                        &field,
                        type_value,
                        &format!("{}: {message}", rule.rule),
                    );
                }
            }
        }
        errs.in_rules = false;
    }
}

fn trim_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        f.to_string()
    }
}

impl Schema {
    /// Compile `spec.versions[].schema.openAPIV3Schema`.
    pub fn compile(open_api_v3_schema: &Value) -> Result<Schema, SchemaError> {
        let mut compiler = Compiler {
            skipped: Vec::new(),
        };
        let root = compiler.node(open_api_v3_schema, "")?;
        Ok(Schema {
            root: Arc::new(root),
            skipped: Arc::new(compiler.skipped),
        })
    }

    /// Apply `default:` values in place, as the server does on create, update and read.
    pub fn apply_defaults(&self, obj: &mut Value) {
        let metadata = obj.as_object_mut().and_then(|m| m.shift_remove("metadata"));
        self.root.default_into(obj);
        if let (Some(meta), Some(map)) = (metadata, obj.as_object_mut()) {
            map.insert("metadata".into(), meta);
        }
    }

    /// Remove fields the schema does not declare (unless
    /// `x-kubernetes-preserve-unknown-fields`); returns the removed paths
    /// (for `fieldValidation=Strict|Warn`). `metadata`, `apiVersion`, `kind`
    /// are kept at the root.
    pub fn prune(&self, obj: &mut Value) -> Vec<String> {
        let mut removed = Vec::new();
        self.root.prune_into(obj, "", true, &mut removed);
        removed
    }

    /// Validate a new object (create).
    pub fn validate_create(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Errors::default();
        self.root.validate(obj, None, "", true, &mut errs);
        errs.finish()
    }

    /// Validate an update, including transition rules (`oldSelf`).
    pub fn validate_update(&self, old: &Value, new: &Value) -> Vec<FieldError> {
        let mut errs = Errors::default();
        // The root itself is always validated (metadata changes make it differ anyway).
        let root_old = strip_meta(old);
        let root_new = strip_meta(new);
        if root_old == root_new {
            return Vec::new();
        }
        self.root.validate(new, Some(old), "", true, &mut errs);
        errs.finish()
    }

    /// CEL rules that could not be compiled by `cel.rs` and are therefore not
    /// enforced (for logs and docs/sandbox.md).
    pub fn skipped_rules(&self) -> Vec<String> {
        self.skipped.as_ref().clone()
    }
}

fn strip_meta(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "metadata")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile(s: Value) -> Schema {
        Schema::compile(&s).expect("schema compiles")
    }

    fn msgs(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(FieldError::message).collect()
    }

    fn sample() -> Schema {
        compile(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "maxLength": 5, "minLength": 2, "pattern": "^[a-z]+$"},
                        "replicas": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 3, "default": 1},
                        "when": {"type": "string", "format": "date-time"},
                        "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                        "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
                        "nested": {"type": "object", "default": {}, "properties": {"x": {"type": "string", "default": "dx"}}},
                        "opt": {"type": "string", "nullable": true},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", "minItems": 1},
                        "entries": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "v": {"type": "integer"}}}
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                        "either": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
                    },
                    "x-kubernetes-validations": [
                        {"rule": "self.replicas <= 2 || self.mode == 'B'", "message": "3 replicas need mode B", "fieldPath": ".replicas"},
                        {"rule": "!has(self.opt) || self.opt != 'forbidden'", "message": "opt is forbidden", "reason": "FieldValueForbidden"},
                        {"rule": "self.unknownFunction()", "message": "never enforced"}
                    ]
                },
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
            }
        }))
    }

    #[test]
    fn defaults_fill_missing_and_non_nullable_nulls() {
        let schema = sample();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "T", "metadata": {"name": "n"}, "spec": {"name": "ab", "opt": null, "when": null}});
        schema.apply_defaults(&mut obj);
        assert_eq!(obj["spec"]["replicas"], 1);
        assert_eq!(obj["spec"]["mode"], "A");
        assert_eq!(
            obj["spec"]["nested"],
            json!({"x": "dx"}),
            "defaults apply inside defaults"
        );
        assert_eq!(obj["spec"]["opt"], Value::Null, "nullable null is kept");
        assert!(
            obj["spec"].get("when").is_none(),
            "non-nullable null without default is dropped"
        );
        assert_eq!(obj["metadata"], json!({"name": "n"}));
        assert!(obj.get("status").is_none(), "no default for status");
    }

    #[test]
    fn pruning_keeps_declared_preserved_and_embedded_fields() {
        let schema = sample();
        let mut obj = json!({
            "apiVersion": "x/v1", "kind": "T", "metadata": {"name": "n", "whatever": 1},
            "spec": {
                "name": "ab", "junk": 1,
                "labels": {"a": "b"},
                "entries": [{"name": "e", "extra": true}],
                "free": {"anything": {"deep": 1}, "known": {"a": "x", "b": "pruned"}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}, "other": 2}
            }
        });
        let mut removed = schema.prune(&mut obj);
        removed.sort();
        assert_eq!(
            removed,
            [
                "spec.entries[0].extra",
                "spec.free.known.b",
                "spec.junk",
                "spec.template.other"
            ]
        );
        assert_eq!(obj["spec"]["free"]["anything"], json!({"deep": 1}));
        assert_eq!(obj["spec"]["template"]["kind"], "Pod");
        assert_eq!(obj["spec"]["template"]["spec"], json!({"x": 1}));
        assert_eq!(
            obj["metadata"]["whatever"], 1,
            "metadata is left to the caller"
        );
    }

    #[test]
    fn validation_messages_match_upstream() {
        let schema = sample();
        let obj = json!({"spec": {
            "name": "ABCDEFG", "replicas": 7, "when": "yesterday", "port": true, "mode": "C",
            "tags": ["a", "a"], "entries": [{"name": "x"}, {"name": "x"}], "labels": {"k": 1},
            "template": {"spec": {}}, "either": {"a": "1", "b": "2"}
        }});
        let got = msgs(&schema.validate_create(&obj));
        let want = [
            "spec.name: Too long: may not be more than 5 bytes",
            "spec.name: Invalid value: \"ABCDEFG\": spec.name in body should match '^[a-z]+$'",
            "spec.replicas: Invalid value: 7: spec.replicas in body should be less than or equal to 3",
            "spec.when: Invalid value: \"yesterday\": spec.when in body must be of type date-time: \"yesterday\"",
            "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"",
            "spec.mode: Unsupported value: \"C\": supported values: \"A\", \"B\"",
            "spec.tags[1]: Duplicate value: \"a\"",
            "spec.entries[1]: Duplicate value: {\"name\":\"x\"}",
            "spec.labels[k]: Invalid value: \"integer\": spec.labels[k] in body must be of type string: \"integer\"",
            "spec.template.apiVersion: Required value: must not be empty",
            "spec.template.kind: Required value: must not be empty",
            "spec.either: Invalid value: {\"a\":\"1\",\"b\":\"2\"}: spec.either in body must validate one and only one schema (oneOf)",
            "spec.replicas: Invalid value: \"object\": 3 replicas need mode B",
        ];
        for w in want {
            assert!(got.contains(&w.to_string()), "missing {w:?} in {got:#?}");
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
        // Schema errors first, CEL errors after them, as upstream concatenates them.
        assert_eq!(
            got.last().map(String::as_str),
            Some("spec.replicas: Invalid value: \"object\": 3 replicas need mode B")
        );

        let errs = schema
            .validate_create(&json!({"spec": {"opt": "forbidden", "replicas": 1, "mode": "A"}}));
        assert_eq!(
            msgs(&errs),
            [
                "spec.name: Required value",
                "spec: Forbidden: opt is forbidden"
            ]
        );
        assert_eq!(errs[1].kind, FieldErrorKind::Forbidden);
        assert_eq!(
            msgs(&schema.validate_create(
                &json!({"spec": {"name": "ab", "replicas": 1, "mode": "A", "tags": []}})
            )),
            ["spec.tags: Invalid value: 0: spec.tags in body should have at least 1 items"]
        );
        assert_eq!(
            msgs(&schema.validate_create(&json!({"spec": "x"}))),
            ["spec: Invalid value: \"string\": spec in body must be of type object: \"string\""]
        );
        assert!(schema.validate_create(&json!({"spec": {"name": "ab", "replicas": 1, "mode": "A", "port": "http", "when": "2024-01-01T00:00:00Z", "opt": null}})).is_empty());
        // A rule that cannot be evaluated (missing field, no defaults applied) is an error, as upstream.
        let got = msgs(&schema.validate_create(&json!({"spec": {"name": "ab"}})));
        assert_eq!(
            got,
            [
                "spec.replicas: Invalid value: \"object\": self.replicas <= 2 || self.mode == 'B': no such key: replicas"
            ]
        );
    }

    #[test]
    fn uncompilable_rules_are_listed_not_enforced() {
        let schema = sample();
        let skipped = schema.skipped_rules();
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(
            skipped[0].starts_with("spec: self.unknownFunction(): undeclared reference"),
            "{skipped:?}"
        );
    }

    #[test]
    fn transition_rules_run_on_update_with_correlated_old_values() {
        let schema = compile(json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "id": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "id is immutable"}]},
                "items": {
                    "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                    "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "string",
                        "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "v is immutable"}]}}}
                },
                "bad": {"type": "string", "maxLength": 1}
            }}}
        }));
        let old = json!({"metadata": {"resourceVersion": "1"}, "spec": {"id": "a", "items": [{"k": "1", "v": "x"}], "bad": "toolong"}});
        assert!(
            schema
                .validate_create(&json!({"spec": {"id": "a"}}))
                .is_empty()
        );
        // Unchanged invalid values are ratcheted; a reordered map list still correlates by key.
        let new = json!({"metadata": {"resourceVersion": "2"}, "spec": {"id": "a", "items": [{"k": "2", "v": "y"}, {"k": "1", "v": "x"}], "bad": "toolong"}});
        assert!(
            schema.validate_update(&old, &new).is_empty(),
            "{:?}",
            msgs(&schema.validate_update(&old, &new))
        );
        let new = json!({"spec": {"id": "b", "items": [{"k": "1", "v": "z"}], "bad": "toolong"}});
        assert_eq!(
            msgs(&schema.validate_update(&old, &new)),
            [
                "spec.id: Invalid value: \"string\": id is immutable",
                "spec.items[0].v: Invalid value: \"string\": v is immutable"
            ]
        );
    }

    #[test]
    fn invalid_schemas_are_rejected() {
        assert!(Schema::compile(&json!({"type": "frob"})).is_err());
        assert!(
            Schema::compile(&json!({"type": "array", "x-kubernetes-list-type": "map"})).is_err()
        );
        assert!(Schema::compile(&json!("x")).is_err());
    }
}
