//! Patch semantics of the Kubernetes API: JSON merge patch (RFC 7386), JSON
//! patch (RFC 6902), strategic merge patch for built-in kinds, and a
//! simplified server-side apply.
//!
//! Simplifications, all documented where they apply:
//! - the strategic-merge-patch table is keyed by *field name* (plus the kind
//!   for the one ambiguous name, `ports`), not by full Go type path;
//! - `$setElementOrder` puts the listed elements first in the given order and
//!   keeps the server-only elements after them in their original order
//!   (upstream interleaves them by their original relative position);
//! - server-side apply tracks ownership only for `Apply` operations; entries
//!   written by other operations are read (and may conflict) but never
//!   created or updated here.

use serde_json::{Map, Value};

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document itself is malformed (400/422 for the caller).
    #[error("invalid patch: {0}")]
    Invalid(String),
    /// A JSON patch `test` operation did not match (422 for the caller).
    #[error("the server rejected our request due to an error in our request: {0}")]
    TestFailed(String),
    /// A JSON patch path does not exist (422 for the caller).
    #[error("{0}")]
    PathNotFound(String),
}

/// Server-side apply conflict: another manager owns a field with a different value.
#[derive(Debug, thiserror::Error)]
#[error("Apply failed with {} conflict(s): {}", .conflicts.len(), .conflicts.iter().map(|c| format!("conflict with \"{}\": {}", c.manager, c.field)).collect::<Vec<_>>().join(", "))]
pub struct ApplyConflict {
    pub conflicts: Vec<FieldConflict>,
}

#[derive(Debug, Clone)]
pub struct FieldConflict {
    pub manager: String,
    /// Dotted path such as `.spec.replicas`.
    pub field: String,
}

// ---------------------------------------------------------------------------
// RFC 7386
// ---------------------------------------------------------------------------

/// RFC 7386 JSON merge patch, applied in place, as the API server applies
/// it (evanphx/json-patch): a value that replaces the target's (an array,
/// a scalar, an object where there was none) has its nested `null` members
/// pruned, arrays included, so `{"list": [{"a": null}]}` writes `[{}]`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        let mut value = patch.clone();
        prune_nulls(&mut value);
        *target = value;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else {
        return;
    };
    for (key, value) in patch_map {
        if value.is_null() {
            target_map.remove(key);
        } else {
            let entry = target_map.entry(key.clone()).or_insert(Value::Null);
            merge_patch(entry, value);
        }
    }
}

/// evanphx/json-patch's `pruneNulls`: object members that are `null` are
/// removed, recursively, through arrays too (a `null` array element stays).
fn prune_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(prune_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(prune_nulls),
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// RFC 6902
// ---------------------------------------------------------------------------

/// Decode an RFC 6901 JSON pointer into its reference tokens.
fn parse_pointer(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(PatchError::Invalid(format!(
            "JSON pointer {pointer:?} must start with '/'"
        )));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => {
                            return Err(PatchError::Invalid(format!(
                                "JSON pointer {pointer:?} has an invalid escape"
                            )));
                        }
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

fn array_index(token: &str, len: usize, allow_end: bool, path: &str) -> Result<usize, PatchError> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let valid = !token.is_empty()
        && token.chars().all(|c| c.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    let index: usize = if valid {
        token
            .parse()
            .map_err(|_| PatchError::Invalid(format!("invalid array index {token:?} in {path}")))?
    } else {
        return Err(PatchError::Invalid(format!(
            "invalid array index {token:?} in {path}"
        )));
    };
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if index > limit || (!allow_end && len == 0) {
        return Err(PatchError::PathNotFound(format!(
            "Unable to access invalid index: {index}: doc is missing path: {path:?}"
        )));
    }
    Ok(index)
}

fn missing(path: &str) -> PatchError {
    PatchError::PathNotFound(format!("doc is missing path: {path:?}: missing value"))
}

/// Walk to the parent container of the pointer's last token.
fn parent_mut<'a>(
    doc: &'a mut Value,
    tokens: &[String],
    path: &str,
) -> Result<&'a mut Value, PatchError> {
    let mut current = doc;
    for token in &tokens[..tokens.len().saturating_sub(1)] {
        current = match current {
            Value::Object(map) => map.get_mut(token).ok_or_else(|| missing(path))?,
            Value::Array(items) => {
                let len = items.len();
                let index = array_index(token, len, false, path)?;
                items.get_mut(index).ok_or_else(|| missing(path))?
            }
            _ => return Err(missing(path)),
        };
    }
    Ok(current)
}

fn pointer_get<'a>(doc: &'a Value, tokens: &[String], path: &str) -> Result<&'a Value, PatchError> {
    let mut current = doc;
    for token in tokens {
        current = match current {
            Value::Object(map) => map.get(token).ok_or_else(|| missing(path))?,
            Value::Array(items) => {
                let index = array_index(token, items.len(), false, path)?;
                items.get(index).ok_or_else(|| missing(path))?
            }
            _ => return Err(missing(path)),
        };
    }
    Ok(current)
}

fn pointer_add(
    doc: &mut Value,
    tokens: &[String],
    value: Value,
    path: &str,
) -> Result<(), PatchError> {
    let Some(last) = tokens.last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, tokens, path)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let index = array_index(last, items.len(), true, path)?;
            items.insert(index, value);
            Ok(())
        }
        _ => Err(missing(path)),
    }
}

fn pointer_remove(doc: &mut Value, tokens: &[String], path: &str) -> Result<Value, PatchError> {
    let Some(last) = tokens.last() else {
        return Err(PatchError::Invalid(
            "cannot remove the whole document".into(),
        ));
    };
    match parent_mut(doc, tokens, path)? {
        Value::Object(map) => map.shift_remove(last).ok_or_else(|| missing(path)),
        Value::Array(items) => {
            let index = array_index(last, items.len(), false, path)?;
            Ok(items.remove(index))
        }
        _ => Err(missing(path)),
    }
}

fn op_str<'a>(
    op: &'a Map<String, Value>,
    field: &str,
    index: usize,
) -> Result<&'a str, PatchError> {
    op.get(field).and_then(Value::as_str).ok_or_else(|| {
        PatchError::Invalid(format!(
            "operation {index} is missing the string field {field:?}"
        ))
    })
}

/// RFC 6902 JSON patch; atomic (target unchanged on error).
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let Value::Array(ops) = ops else {
        return Err(PatchError::Invalid(
            "a JSON patch must be an array of operations".into(),
        ));
    };
    let mut doc = target.clone();
    for (index, op) in ops.iter().enumerate() {
        let Value::Object(op) = op else {
            return Err(PatchError::Invalid(format!(
                "operation {index} is not an object"
            )));
        };
        let kind = op_str(op, "op", index)?;
        let path = op_str(op, "path", index)?;
        let tokens = parse_pointer(path)?;
        let value = || {
            op.get("value").cloned().ok_or_else(|| {
                PatchError::Invalid(format!("operation {index} ({kind}) is missing \"value\""))
            })
        };
        match kind {
            "add" => pointer_add(&mut doc, &tokens, value()?, path)?,
            "remove" => {
                pointer_remove(&mut doc, &tokens, path)?;
            }
            "replace" => {
                pointer_get(&doc, &tokens, path)?;
                if tokens.is_empty() {
                    doc = value()?;
                } else {
                    pointer_remove(&mut doc, &tokens, path)?;
                    pointer_add(&mut doc, &tokens, value()?, path)?;
                }
            }
            "move" => {
                let from = op_str(op, "from", index)?;
                let from_tokens = parse_pointer(from)?;
                if tokens.len() > from_tokens.len()
                    && tokens[..from_tokens.len()] == from_tokens[..]
                {
                    return Err(PatchError::Invalid(format!(
                        "cannot move {from} into its own child {path}"
                    )));
                }
                let moved = pointer_remove(&mut doc, &from_tokens, from)?;
                pointer_add(&mut doc, &tokens, moved, path)?;
            }
            "copy" => {
                let from = op_str(op, "from", index)?;
                let copied = pointer_get(&doc, &parse_pointer(from)?, from)?.clone();
                pointer_add(&mut doc, &tokens, copied, path)?;
            }
            "test" => {
                let expected = value()?;
                let actual = pointer_get(&doc, &tokens, path).map_err(|_| {
                    PatchError::TestFailed(format!("testing value {path} failed: test failed"))
                })?;
                if *actual != expected {
                    return Err(PatchError::TestFailed(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => return Err(PatchError::Invalid(format!("Unexpected kind: {other}"))),
        }
    }
    *target = doc;
    Ok(())
}

// ---------------------------------------------------------------------------
// Strategic merge patch
// ---------------------------------------------------------------------------

/// How a list field merges, after upstream's `patchStrategy`/`patchMergeKey`
/// (and, for server-side apply, `listType`/`listMapKeys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    /// `patchStrategy:"merge"` on a list of maps, keyed by these fields.
    MergeByKey(&'static [&'static str]),
    /// `patchStrategy:"merge"` on a list of primitives (a set).
    PrimitiveSet,
    /// No strategy: the patch replaces the list.
    Atomic,
}

/// Strategy of list field `field` of an object of kind `kind`. Keyed by
/// field name (a documented simplification of upstream's per-type tables).
fn list_strategy(field: &str, kind: &str) -> ListStrategy {
    use ListStrategy::*;
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "secrets"
        | "resourceClaims" => MergeByKey(&["name"]),
        "volumeMounts" => MergeByKey(&["mountPath"]),
        "volumeDevices" => MergeByKey(&["devicePath"]),
        "ports" if kind == "Service" => MergeByKey(&["port", "protocol"]),
        "ports" => MergeByKey(&["containerPort", "protocol"]),
        "conditions" => MergeByKey(&["type"]),
        "ownerReferences" => MergeByKey(&["uid"]),
        "hostAliases" => MergeByKey(&["ip"]),
        "topologySpreadConstraints" => MergeByKey(&["topologyKey", "whenUnsatisfiable"]),
        "finalizers" => PrimitiveSet,
        _ => Atomic,
    }
}

/// Keys used to *match* elements in a strategic merge patch (upstream's
/// `patchMergeKey` is a single field; the extra SSA map keys are ignored).
fn smp_key(keys: &'static [&'static str]) -> &'static str {
    keys.first().copied().unwrap_or("name")
}

const DIRECTIVE_PATCH: &str = "$patch";
const DIRECTIVE_RETAIN_KEYS: &str = "$retainKeys";
const PREFIX_DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";
const PREFIX_SET_ORDER: &str = "$setElementOrder/";

/// Strategic merge patch for built-in kinds (patchMergeKey tables for
/// containers, env, volumes, ports, conditions, ...; `$patch`,
/// `$deleteFromPrimitiveList`, `$setElementOrder`, `$retainKeys` directives).
/// `kind` is the object's kind (e.g. "Deployment").
pub fn strategic_merge_patch(
    target: &mut Value,
    patch: &Value,
    kind: &str,
) -> Result<(), PatchError> {
    let Value::Object(patch_map) = patch else {
        return Err(PatchError::Invalid(
            "a strategic merge patch must be a JSON object".into(),
        ));
    };
    let mut doc = target.clone();
    if !doc.is_object() {
        doc = Value::Object(Map::new());
    }
    match smp_map(&mut doc, patch_map, kind)? {
        MapOutcome::Keep => {}
        MapOutcome::Delete => doc = Value::Object(Map::new()),
    }
    *target = doc;
    Ok(())
}

enum MapOutcome {
    Keep,
    Delete,
}

/// Merge a patch map into `target` (which becomes an object).
fn smp_map(
    target: &mut Value,
    patch: &Map<String, Value>,
    kind: &str,
) -> Result<MapOutcome, PatchError> {
    match patch.get(DIRECTIVE_PATCH) {
        None => {}
        Some(Value::String(s)) if s == "merge" => {}
        Some(Value::String(s)) if s == "delete" => return Ok(MapOutcome::Delete),
        Some(Value::String(s)) if s == "replace" => {
            let mut replaced = Map::new();
            for (k, v) in patch {
                if k == DIRECTIVE_PATCH || v.is_null() {
                    continue;
                }
                replaced.insert(k.clone(), strip_directives(v));
            }
            *target = Value::Object(replaced);
            return Ok(MapOutcome::Keep);
        }
        Some(other) => return Err(PatchError::Invalid(format!("Unknown patch type: {other}"))),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target_map) = target else {
        return Ok(MapOutcome::Keep);
    };
    // $retainKeys: clear everything not listed, before merging.
    if let Some(retain) = patch.get(DIRECTIVE_RETAIN_KEYS) {
        let Value::Array(retain) = retain else {
            return Err(PatchError::Invalid(
                "$retainKeys must be a list of strings".into(),
            ));
        };
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        if keep.len() != retain.len() {
            return Err(PatchError::Invalid(
                "$retainKeys must be a list of strings".into(),
            ));
        }
        target_map.retain(|k, _| keep.contains(&k.as_str()));
    }
    // The server-side order of lists that `$setElementOrder` will reorder.
    let server_orders: Vec<(String, Vec<Value>)> = patch
        .keys()
        .filter_map(|k| k.strip_prefix(PREFIX_SET_ORDER))
        .map(|field| {
            let items = match target_map.get(field) {
                Some(Value::Array(items)) => items.clone(),
                _ => Vec::new(),
            };
            (field.to_string(), items)
        })
        .collect();
    // Plain keys first, then the list directives that refer to them.
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target_map.shift_remove(key);
            continue;
        }
        match value {
            Value::Object(sub) => {
                let entry = target_map.entry(key.clone()).or_insert(Value::Null);
                if let MapOutcome::Delete = smp_map(entry, sub, kind)? {
                    target_map.shift_remove(key);
                }
            }
            Value::Array(items) => {
                let merged = match target_map.get(key) {
                    Some(Value::Array(orig)) => {
                        smp_list(orig, items, list_strategy(key, kind), kind)?
                    }
                    _ => smp_list(&[], items, list_strategy(key, kind), kind)?,
                };
                target_map.insert(key.clone(), Value::Array(merged));
            }
            _ => {
                target_map.insert(key.clone(), value.clone());
            }
        }
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(PREFIX_DELETE_PRIMITIVE) {
            let Value::Array(remove) = value else {
                return Err(PatchError::Invalid(format!("{key} must be a list")));
            };
            if let Some(Value::Array(current)) = target_map.get_mut(field) {
                current.retain(|v| !remove.contains(v));
            }
        } else if let Some(field) = key.strip_prefix(PREFIX_SET_ORDER) {
            let Value::Array(order) = value else {
                return Err(PatchError::Invalid(format!("{key} must be a list")));
            };
            if let Some(Value::Array(current)) = target_map.get_mut(field) {
                let merge_key = match list_strategy(field, kind) {
                    ListStrategy::MergeByKey(keys) => Some(smp_key(keys)),
                    _ => None,
                };
                let server = server_orders
                    .iter()
                    .find(|(f, _)| f == field)
                    .map(|(_, items)| items.as_slice())
                    .unwrap_or(&[]);
                reorder(current, order, server, merge_key);
            }
        } else if key.starts_with('$') && key != DIRECTIVE_PATCH && key != DIRECTIVE_RETAIN_KEYS {
            return Err(PatchError::Invalid(format!("unknown directive {key:?}")));
        }
    }
    Ok(MapOutcome::Keep)
}

/// Remove `$`-directives from a value (used where a patch value is taken verbatim).
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|v| !is_directive_only(v))
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn is_directive_only(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.contains_key(DIRECTIVE_PATCH) && m.len() == 1)
}

fn element_key<'a>(item: &'a Value, key: &str) -> Option<&'a Value> {
    item.as_object().and_then(|m| m.get(key))
}

fn smp_list(
    orig: &[Value],
    patch: &[Value],
    strategy: ListStrategy,
    kind: &str,
) -> Result<Vec<Value>, PatchError> {
    // A `{"$patch": "replace"}` element replaces the whole list.
    let replace = patch.iter().any(|v| {
        v.as_object()
            .and_then(|m| m.get(DIRECTIVE_PATCH))
            .and_then(Value::as_str)
            == Some("replace")
    });
    if replace {
        return Ok(patch
            .iter()
            .filter(|v| v.as_object().and_then(|m| m.get(DIRECTIVE_PATCH)).is_none())
            .map(strip_directives)
            .collect());
    }
    match strategy {
        ListStrategy::Atomic => Ok(patch.iter().map(strip_directives).collect()),
        ListStrategy::PrimitiveSet => {
            let mut out = orig.to_vec();
            for item in patch {
                if !out.contains(item) {
                    out.push(item.clone());
                }
            }
            Ok(out)
        }
        ListStrategy::MergeByKey(keys) => {
            let key = smp_key(keys);
            let mut out = orig.to_vec();
            for item in patch {
                let Value::Object(item_map) = item else {
                    return Err(PatchError::Invalid(format!(
                        "list elements must be objects with merge key {key:?}, got {item}"
                    )));
                };
                let Some(wanted) = item_map.get(key) else {
                    return Err(PatchError::Invalid(format!(
                        "map: {item} does not contain declared merge key: {key}"
                    )));
                };
                let position = out.iter().position(|o| element_key(o, key) == Some(wanted));
                let directive = item_map.get(DIRECTIVE_PATCH).and_then(Value::as_str);
                if directive == Some("delete") {
                    out.retain(|o| element_key(o, key) != Some(wanted));
                    continue;
                }
                match position {
                    Some(i) => {
                        let slot = &mut out[i];
                        if let MapOutcome::Delete = smp_map(slot, item_map, kind)? {
                            out.remove(i);
                        }
                    }
                    None => {
                        let mut fresh = Value::Object(Map::new());
                        smp_map(&mut fresh, item_map, kind)?;
                        out.push(fresh);
                    }
                }
            }
            Ok(out)
        }
    }
}

/// `$setElementOrder`, as upstream's `normalizeElementOrder`: the elements
/// named in the order list are sorted by it, the server-only ones keep the
/// server order, and the two runs are merged by their server positions.
fn reorder(current: &mut Vec<Value>, order: &[Value], server: &[Value], merge_key: Option<&str>) {
    let identity = |v: &Value| -> Value {
        match merge_key {
            Some(k) => element_key(v, k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let order_ids: Vec<Value> = order.iter().map(identity).collect();
    let server_ids: Vec<Value> = server.iter().map(identity).collect();
    let position = |ids: &[Value], v: &Value| -> Option<usize> {
        let id = identity(v);
        ids.iter().position(|x| *x == id)
    };
    let (mut patched, mut server_only): (Vec<Value>, Vec<Value>) = std::mem::take(current)
        .into_iter()
        .partition(|v| position(&order_ids, v).is_some());
    patched.sort_by_key(|v| position(&order_ids, v));
    server_only.sort_by_key(|v| position(&server_ids, v));
    let mut out = Vec::with_capacity(patched.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        patched.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (position(&server_ids, l), position(&server_ids, r)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    *current = out;
}

// ---------------------------------------------------------------------------
// Server-side apply
// ---------------------------------------------------------------------------

/// Fields server-side apply never tracks (upstream's reset/strip set).
fn is_stripped(path: &[String]) -> bool {
    match path {
        [f] => f == "f:apiVersion" || f == "f:kind",
        [m, f] if m == "f:metadata" => matches!(
            f.as_str(),
            "f:name"
                | "f:namespace"
                | "f:uid"
                | "f:resourceVersion"
                | "f:generation"
                | "f:creationTimestamp"
                | "f:deletionTimestamp"
                | "f:deletionGracePeriodSeconds"
                | "f:managedFields"
                | "f:selfLink"
        ),
        _ => false,
    }
}

/// The list strategy server-side apply uses for `field` under `parents`
/// (metadata lists always follow ObjectMeta; others only for built-ins).
fn ssa_strategy(parents: &[String], field: &str, kind: &str, builtin: bool) -> ListStrategy {
    let in_metadata = parents.len() == 1 && parents[0] == "f:metadata";
    if builtin || in_metadata {
        list_strategy(field, kind)
    } else {
        ListStrategy::Atomic
    }
}

/// Leaf paths (in `fieldsV1` key form) of an applied configuration, with the
/// value at each leaf. Associative-list items also contribute their `.` path.
fn collect_leaves(
    value: &Value,
    path: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Value)>,
    kind: &str,
    builtin: bool,
) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                path.push(format!("f:{k}"));
                if !is_stripped(path) {
                    match v {
                        Value::Array(items) => {
                            let parents = path[..path.len() - 1].to_vec();
                            match ssa_strategy(&parents, k, kind, builtin) {
                                ListStrategy::Atomic => out.push((path.clone(), v.clone())),
                                ListStrategy::PrimitiveSet => {
                                    for item in items {
                                        path.push(format!("v:{item}"));
                                        out.push((path.clone(), item.clone()));
                                        path.pop();
                                    }
                                    if items.is_empty() {
                                        out.push((path.clone(), v.clone()));
                                    }
                                }
                                ListStrategy::MergeByKey(keys) => {
                                    for item in items {
                                        let Some(key) = item_key(item, keys) else {
                                            // Not keyable: treat the whole list as atomic.
                                            out.push((path.clone(), v.clone()));
                                            break;
                                        };
                                        path.push(key);
                                        out.push((
                                            {
                                                let mut p = path.clone();
                                                p.push(".".into());
                                                p
                                            },
                                            Value::Null,
                                        ));
                                        collect_leaves(item, path, out, kind, builtin);
                                        path.pop();
                                    }
                                    if items.is_empty() {
                                        out.push((path.clone(), v.clone()));
                                    }
                                }
                            }
                        }
                        _ => collect_leaves(v, path, out, kind, builtin),
                    }
                }
                path.pop();
            }
        }
        _ => out.push((path.clone(), value.clone())),
    }
}

/// Whether an applied associative-list item designates the live item: the
/// first (required) key matches and so does every other key the applied
/// item sets (a key it omits, such as a defaulted `protocol`, is not compared).
fn same_item(applied: &Value, live: &Value, keys: &[&str]) -> bool {
    let (Some(a), Some(l)) = (applied.as_object(), live.as_object()) else {
        return false;
    };
    let Some(first) = keys.first() else {
        return false;
    };
    a.get(*first).is_some()
        && keys.iter().all(|k| match a.get(*k) {
            Some(v) => l.get(*k) == Some(v),
            None => true,
        })
}

/// `k:{...}` element key of an associative-list item, keys sorted as upstream.
/// None when the first (required) key is missing.
fn item_key(item: &Value, keys: &[&str]) -> Option<String> {
    let map = item.as_object()?;
    map.get(*keys.first()?)?;
    let mut present: Vec<(&str, &Value)> = keys
        .iter()
        .filter_map(|k| map.get(*k).map(|v| (*k, v)))
        .collect();
    if present.is_empty() {
        return None;
    }
    present.sort_by(|a, b| a.0.cmp(b.0));
    let obj: Map<String, Value> = present
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Some(format!("k:{}", Value::Object(obj)))
}

/// Build a `fieldsV1` tree from leaf paths.
fn to_fields_v1(leaves: &[Vec<String>]) -> Value {
    let mut root = Map::new();
    for path in leaves {
        let mut node = &mut root;
        for segment in path {
            let entry = node
                .entry(segment.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            let Value::Object(next) = entry else {
                break;
            };
            node = next;
        }
    }
    Value::Object(root)
}

/// Leaf paths of a `fieldsV1` tree (`.` entries included as leaves).
fn from_fields_v1(tree: &Value) -> Vec<Vec<String>> {
    fn walk(node: &Map<String, Value>, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for (k, v) in node {
            path.push(k.clone());
            match v {
                Value::Object(child) if !child.is_empty() => walk(child, path, out),
                _ => out.push(path.clone()),
            }
            path.pop();
        }
    }
    let mut out = Vec::new();
    if let Value::Object(map) = tree {
        walk(map, &mut Vec::new(), &mut out);
    }
    out
}

/// Resolve a `fieldsV1` path against an object.
fn resolve<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut current = obj;
    for segment in path {
        if segment == "." {
            return Some(current);
        }
        if let Some(name) = segment.strip_prefix("f:") {
            current = current.as_object()?.get(name)?;
        } else if let Some(key) = segment.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(key).ok()?;
            current = current.as_array()?.iter().find(|item| {
                item.as_object()
                    .is_some_and(|m| key.iter().all(|(k, v)| m.get(k) == Some(v)))
            })?;
        } else if let Some(value) = segment.strip_prefix("v:") {
            let value: Value = serde_json::from_str(value).ok()?;
            current = current.as_array()?.iter().find(|item| **item == value)?;
        } else {
            return None;
        }
    }
    Some(current)
}

/// Remove the field a `fieldsV1` path designates (a `.` path removes the list item).
fn remove_path(obj: &mut Value, path: &[String]) {
    let path: &[String] = match path.last() {
        Some(last) if last == "." => &path[..path.len() - 1],
        _ => path,
    };
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut current = obj;
    for segment in parents {
        let next = if let Some(name) = segment.strip_prefix("f:") {
            current.as_object_mut().and_then(|m| m.get_mut(name))
        } else if let Some(key) = segment.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Map<String, Value>>(key) else {
                return;
            };
            current.as_array_mut().and_then(|items| {
                items.iter_mut().find(|item| {
                    item.as_object()
                        .is_some_and(|m| key.iter().all(|(k, v)| m.get(k) == Some(v)))
                })
            })
        } else {
            None
        };
        match next {
            Some(n) => current = n,
            None => return,
        }
    }
    if let Some(name) = last.strip_prefix("f:") {
        if let Some(map) = current.as_object_mut() {
            map.shift_remove(name);
        }
    } else if let Some(key) = last.strip_prefix("k:") {
        if let (Ok(key), Some(items)) = (
            serde_json::from_str::<Map<String, Value>>(key),
            current.as_array_mut(),
        ) {
            items.retain(|item| {
                !item
                    .as_object()
                    .is_some_and(|m| key.iter().all(|(k, v)| m.get(k) == Some(v)))
            });
        }
    } else if let Some(value) = last.strip_prefix("v:")
        && let (Ok(value), Some(items)) =
            (serde_json::from_str::<Value>(value), current.as_array_mut())
    {
        items.retain(|item| *item != value);
    }
}

/// Merge an applied configuration into live: maps recursively, associative
/// and set lists per `ssa_strategy`, everything else replaced.
fn ssa_merge(
    live: &mut Value,
    applied: &Value,
    parents: &mut Vec<String>,
    kind: &str,
    builtin: bool,
) {
    let (Value::Object(live_map), Value::Object(applied_map)) = (&mut *live, applied) else {
        *live = applied.clone();
        return;
    };
    for (k, v) in applied_map {
        parents.push(format!("f:{k}"));
        if is_stripped(parents) {
            parents.pop();
            continue;
        }
        match (live_map.get_mut(k), v) {
            (Some(existing @ Value::Object(_)), Value::Object(_)) => {
                ssa_merge(existing, v, parents, kind, builtin)
            }
            (Some(Value::Array(existing)), Value::Array(items)) => {
                let outer = parents[..parents.len() - 1].to_vec();
                match ssa_strategy(&outer, k, kind, builtin) {
                    ListStrategy::Atomic => *existing = items.clone(),
                    ListStrategy::PrimitiveSet => {
                        for item in items {
                            if !existing.contains(item) {
                                existing.push(item.clone());
                            }
                        }
                    }
                    ListStrategy::MergeByKey(keys) => {
                        if items.iter().any(|i| item_key(i, keys).is_none()) {
                            *existing = items.clone();
                        } else {
                            for item in items {
                                let key = item_key(item, keys);
                                match existing.iter_mut().find(|e| same_item(item, e, keys)) {
                                    Some(slot) => {
                                        if let Some(key) = &key {
                                            parents.push(key.clone());
                                        }
                                        ssa_merge(slot, item, parents, kind, builtin);
                                        if key.is_some() {
                                            parents.pop();
                                        }
                                    }
                                    None => existing.push(item.clone()),
                                }
                            }
                        }
                    }
                }
            }
            _ => {
                live_map.insert(k.clone(), v.clone());
            }
        }
        parents.pop();
    }
}

fn dotted(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        if segment == "." {
            continue;
        }
        if let Some(name) = segment.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(key) = segment.strip_prefix("k:") {
            // structured-merge-diff prints keys as `[name="c"]`, `[containerPort=80,protocol="TCP"]`.
            out.push('[');
            match serde_json::from_str::<Map<String, Value>>(key) {
                Ok(fields) => {
                    let parts: Vec<String> =
                        fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    out.push_str(&parts.join(","));
                }
                Err(_) => out.push_str(key),
            }
            out.push(']');
        } else if let Some(value) = segment.strip_prefix("v:") {
            out.push_str("[=");
            out.push_str(value);
            out.push(']');
        }
    }
    out
}

/// Server-side apply (`application/apply-patch+yaml`). `live` is the current
/// object (None: create). Returns the merged object with
/// `metadata.managedFields` updated for `manager`. Without `force`, fields
/// owned by another manager with a different value are conflicts.
/// `structural_lists` says whether list merging may use built-in merge keys
/// (true for built-in kinds, false for custom resources: lists are atomic
/// unless the schema says otherwise).
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    kind: &str,
    builtin: bool,
) -> Result<Value, ApplyConflict> {
    let mut applied_clean = applied.clone();
    if let Some(meta) = applied_clean
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
    {
        meta.shift_remove("managedFields");
    }
    let api_version = applied
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1")
        .to_string();
    let mut leaves = Vec::new();
    collect_leaves(&applied_clean, &mut Vec::new(), &mut leaves, kind, builtin);
    let new_paths: Vec<Vec<String>> = leaves.iter().map(|(p, _)| p.clone()).collect();

    let Some(live) = live else {
        let mut created = applied_clean;
        set_managed_fields(&mut created, Vec::new(), manager, &api_version, &new_paths);
        return Ok(created);
    };

    // Existing ownership, split into ours (Apply) and everybody else's.
    let mut entries: Vec<Value> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if entries.is_empty() {
        // Nothing recorded yet (the object was written without apply): as
        // upstream, every existing field is owned by "before-first-apply",
        // so applying a different value conflicts unless forced.
        let mut live_leaves = Vec::new();
        collect_leaves(live, &mut Vec::new(), &mut live_leaves, kind, builtin);
        let paths: Vec<Vec<String>> = live_leaves
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| p.first().is_some_and(|f| f != "f:status"))
            .collect();
        if !paths.is_empty() {
            let live_version = live
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or(&api_version)
                .to_string();
            entries.push(serde_json::json!({
                "manager": "before-first-apply",
                "operation": "Update",
                "apiVersion": live_version,
                "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&paths),
            }));
        }
    }
    let is_ours = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some("Apply")
    };
    let old_paths: Vec<Vec<String>> = entries
        .iter()
        .filter(|e| is_ours(e))
        .flat_map(|e| from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)))
        .collect();
    let mut others: Vec<(Value, Vec<Vec<String>>)> = entries
        .iter()
        .filter(|e| !is_ours(e))
        .map(|e| {
            (
                e.clone(),
                from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
            )
        })
        .collect();

    // Conflicts: a leaf we apply that another manager owns, with a different live value.
    let mut conflicts = Vec::new();
    for (path, value) in &leaves {
        if path.last().is_some_and(|s| s == ".") {
            continue;
        }
        let live_value = resolve(live, path);
        if live_value == Some(value) {
            continue;
        }
        for (entry, paths) in &others {
            if paths.iter().any(|p| p == path) {
                conflicts.push(FieldConflict {
                    manager: entry
                        .get("manager")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    field: dotted(path),
                });
            }
        }
    }
    if !conflicts.is_empty() {
        if !force {
            return Err(ApplyConflict { conflicts });
        }
        for (_, paths) in &mut others {
            paths.retain(|p| !new_paths.contains(p));
        }
    }

    let mut merged = live.clone();
    // Fields we applied before but no longer apply, and nobody else owns, go away.
    for path in &old_paths {
        if new_paths.contains(path) || is_stripped(path) {
            continue;
        }
        if others.iter().any(|(_, paths)| paths.contains(path)) {
            continue;
        }
        remove_path(&mut merged, path);
    }
    ssa_merge(&mut merged, &applied_clean, &mut Vec::new(), kind, builtin);

    let kept: Vec<Value> = others
        .into_iter()
        .filter(|(_, paths)| !paths.is_empty())
        .map(|(mut entry, paths)| {
            if let Some(map) = entry.as_object_mut() {
                map.insert("fieldsV1".into(), to_fields_v1(&paths));
            }
            entry
        })
        .collect();
    set_managed_fields(&mut merged, kept, manager, &api_version, &new_paths);
    Ok(merged)
}

fn set_managed_fields(
    obj: &mut Value,
    mut entries: Vec<Value>,
    manager: &str,
    api_version: &str,
    paths: &[Vec<String>],
) {
    let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    entries.push(serde_json::json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(paths),
    }));
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    if let Some(map) = obj.as_object_mut() {
        let meta = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}}));
        let mut doc = json!({"a": [1, 2]});
        merge_patch(&mut doc, &json!({"a": [3]}));
        assert_eq!(doc, json!({"a": [3]}));
        let mut doc = json!("x");
        merge_patch(&mut doc, &json!({"a": {"b": null, "c": 1}}));
        assert_eq!(doc, json!({"a": {"c": 1}}));
        // as a real API server: nulls inside a replaced array are pruned
        // (a required, nullable field cannot be written by a merge patch)
        let mut doc = json!({"history": [{"completionTime": "t"}]});
        merge_patch(&mut doc, &json!({"history": [{"state": "Partial", "completionTime": null}, null]}));
        assert_eq!(doc, json!({"history": [{"state": "Partial"}, null]}));
    }

    #[test]
    fn json_patch_all_operations() {
        let mut doc = json!({"metadata": {"labels": {"a/b": "1", "m~n": "2"}}, "list": [1, 2]});
        json_patch(
            &mut doc,
            &json!([
                {"op": "test", "path": "/metadata/labels/a~1b", "value": "1"},
                {"op": "replace", "path": "/metadata/labels/m~0n", "value": "3"},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "add", "path": "/list/0", "value": 0},
                {"op": "remove", "path": "/list/1"},
                {"op": "copy", "from": "/list", "path": "/copy"},
                {"op": "move", "from": "/metadata/labels/a~1b", "path": "/moved"}
            ]),
        )
        .expect("patch applies");
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"m~n": "3"}}, "list": [0, 2, 3], "copy": [0, 2, 3], "moved": "1"})
        );
    }

    #[test]
    fn json_patch_is_atomic_and_reports_errors() {
        let original = json!({"spec": {"replicas": 1}});
        let mut doc = original.clone();
        let err = json_patch(
            &mut doc,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 2},
                {"op": "test", "path": "/spec/replicas", "value": 3}
            ]),
        )
        .expect_err("test must fail");
        assert!(matches!(err, PatchError::TestFailed(_)), "{err:?}");
        assert_eq!(doc, original);
        let err = json_patch(
            &mut doc,
            &json!([{"op": "remove", "path": "/spec/missing"}]),
        )
        .expect_err("missing");
        assert!(matches!(err, PatchError::PathNotFound(_)), "{err:?}");
        let err = json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "/spec/x", "value": 1}]),
        )
        .expect_err("x");
        assert!(matches!(err, PatchError::PathNotFound(_)), "{err:?}");
        let err =
            json_patch(&mut doc, &json!([{"op": "frobnicate", "path": "/"}])).expect_err("bad op");
        assert!(matches!(err, PatchError::Invalid(_)), "{err:?}");
        let err = json_patch(&mut doc, &json!({"op": "add"})).expect_err("not a list");
        assert!(matches!(err, PatchError::Invalid(_)), "{err:?}");
    }

    fn deployment() -> Value {
        json!({
            "kind": "Deployment",
            "metadata": {"name": "d", "finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
            "spec": {"replicas": 1, "template": {"spec": {
                "containers": [
                    {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                     "ports": [{"containerPort": 80}]},
                    {"name": "side", "image": "side:1"}
                ],
                "tolerations": [{"key": "k1"}]
            }}}
        })
    }

    #[test]
    fn smp_merges_lists_by_key_and_replaces_atomic_lists() {
        let mut doc = deployment();
        strategic_merge_patch(
            &mut doc,
            &json!({
                "metadata": {"labels": {"x": null}, "finalizers": ["b"]},
                "spec": {"template": {"spec": {
                    "containers": [{"name": "app", "image": "app:2", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}],
                    "tolerations": [{"key": "k2"}]
                }}}
            }),
            "Deployment",
        )
        .expect("patch applies");
        let spec = &doc["spec"]["template"]["spec"];
        assert_eq!(spec["containers"][0]["image"], "app:2");
        assert_eq!(
            spec["containers"][0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}])
        );
        assert_eq!(
            spec["containers"][0]["ports"],
            json!([{"containerPort": 80}])
        );
        assert_eq!(spec["containers"][1]["image"], "side:1");
        assert_eq!(spec["tolerations"], json!([{"key": "k2"}]));
        assert_eq!(doc["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
    }

    #[test]
    fn smp_directives() {
        let mut doc = deployment();
        strategic_merge_patch(
            &mut doc,
            &json!({
                "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"$patch": "replace", "z": "9"}},
                "spec": {"template": {"spec": {
                    "containers": [{"name": "side", "$patch": "delete"}, {"name": "new", "image": "n"}],
                    "$setElementOrder/containers": [{"name": "new"}, {"name": "app"}]
                }}}
            }),
            "Deployment",
        )
        .expect("patch applies");
        assert_eq!(doc["metadata"]["finalizers"], json!([]));
        assert_eq!(doc["metadata"]["labels"], json!({"z": "9"}));
        let names: Vec<&str> = doc["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["new", "app"]);

        let mut doc = deployment();
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "o"}]}}}}),
            "Deployment",
        )
        .expect("replace list");
        assert_eq!(
            doc["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "o"}])
        );

        let mut doc = json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
            "Deployment",
        )
        .expect("retainKeys");
        assert_eq!(doc, json!({"spec": {"strategy": {"type": "Recreate"}}}));

        let mut doc = deployment();
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"template": {"$patch": "delete"}}}),
            "Deployment",
        )
        .expect("delete map");
        assert!(doc["spec"].get("template").is_none());

        let err = strategic_merge_patch(
            &mut deployment(),
            &json!({"spec": {"template": {"spec": {"containers": [{"image": "nameless"}]}}}}),
            "Deployment",
        )
        .expect_err("missing merge key");
        assert!(matches!(err, PatchError::Invalid(_)));
    }

    #[test]
    fn smp_set_element_order_interleaves_server_only_elements() {
        let mut doc =
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {
                "$setElementOrder/containers": [{"name": "c"}, {"name": "new"}, {"name": "a"}],
                "containers": [{"name": "new", "image": "n"}]
            }}),
            "Pod",
        )
        .expect("patch applies");
        let names: Vec<&str> = doc["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        // As upstream: server-only "b" keeps its place before "c".
        assert_eq!(names, ["b", "c", "new", "a"]);
        let mut doc = json!({"metadata": {"finalizers": ["x", "y"]}});
        strategic_merge_patch(
            &mut doc,
            &json!({"metadata": {"$setElementOrder/finalizers": ["y", "z", "x"], "finalizers": ["z"]}}),
            "Pod",
        )
        .expect("primitive order");
        assert_eq!(doc["metadata"]["finalizers"], json!(["y", "z", "x"]));
    }

    #[test]
    fn smp_service_ports_merge_by_port() {
        let mut doc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        strategic_merge_patch(
            &mut doc,
            &json!({"spec": {"ports": [{"port": 443, "name": "tls"}]}}),
            "Service",
        )
        .expect("patch applies");
        assert_eq!(
            doc["spec"]["ports"],
            json!([{"port": 80, "name": "http"}, {"port": 443, "name": "tls"}])
        );
    }

    #[test]
    fn ssa_create_records_managed_fields_in_upstream_format() {
        let applied = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns", "labels": {"app": "x"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
        });
        let out =
            server_side_apply(None, &applied, "mgr", false, "Deployment", true).expect("create");
        let mf = &out["metadata"]["managedFields"][0];
        assert_eq!(mf["manager"], "mgr");
        assert_eq!(mf["operation"], "Apply");
        assert_eq!(mf["apiVersion"], "apps/v1");
        assert_eq!(mf["fieldsType"], "FieldsV1");
        assert!(mf["time"].as_str().is_some_and(|t| t.ends_with('Z')));
        assert_eq!(
            mf["fieldsV1"],
            json!({
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}
                }}}}
            })
        );
        assert_eq!(out["spec"]["replicas"], 2);
    }

    #[test]
    fn ssa_removes_dropped_fields_and_detects_conflicts() {
        let first = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "1", "b": "2"}}, "data": {"k": "v"}});
        let live =
            server_side_apply(None, &first, "one", false, "ConfigMap", true).expect("create");
        // Same manager drops label b and data.k: both go away.
        let second = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "1"}}});
        let live = server_side_apply(Some(&live), &second, "one", false, "ConfigMap", true)
            .expect("reapply");
        assert_eq!(live["metadata"]["labels"], json!({"a": "1"}));
        assert!(
            live.get("data").is_none_or(|d| d.get("k").is_none()),
            "{live}"
        );
        // Another manager setting the same value shares ownership; a different value conflicts.
        let same = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "1"}}});
        let live =
            server_side_apply(Some(&live), &same, "two", false, "ConfigMap", true).expect("shared");
        let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "9"}}});
        let conflict = server_side_apply(Some(&live), &other, "three", false, "ConfigMap", true)
            .expect_err("conflict");
        let managers: Vec<&str> = conflict
            .conflicts
            .iter()
            .map(|c| c.manager.as_str())
            .collect();
        assert_eq!(managers, ["one", "two"]);
        assert_eq!(conflict.conflicts[0].field, ".metadata.labels.a");
        assert!(
            conflict
                .to_string()
                .starts_with("Apply failed with 2 conflict(s)"),
            "{conflict}"
        );
        // Forced: ownership moves to "three"; the others' entries lose the field.
        let live = server_side_apply(Some(&live), &other, "three", true, "ConfigMap", true)
            .expect("force");
        assert_eq!(live["metadata"]["labels"]["a"], "9");
        let entries = live["metadata"]["managedFields"]
            .as_array()
            .expect("entries");
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0]["manager"], "three");
    }

    #[test]
    fn ssa_matches_ports_whose_protocol_was_defaulted() {
        let live = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}});
        // Written without apply (protocol defaulted by the server), then applied with force.
        let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i2",
                "ports": [{"containerPort": 80, "name": "http"}]}]}}}});
        let out =
            server_side_apply(Some(&live), &applied, "m", true, "Deployment", true).expect("apply");
        let c = &out["spec"]["template"]["spec"]["containers"][0];
        let conflict = server_side_apply(Some(&live), &applied, "m", false, "Deployment", true)
            .expect_err("conflict");
        let fields: Vec<&str> = conflict
            .conflicts
            .iter()
            .map(|c| c.field.as_str())
            .collect();
        assert_eq!(fields, [".spec.template.spec.containers[name=\"c\"].image"]);
        assert_eq!(c["image"], "i2");
        assert_eq!(
            c["ports"],
            json!([{"containerPort": 80, "protocol": "TCP", "name": "http"}])
        );
    }

    #[test]
    fn ssa_over_an_object_written_without_apply() {
        let live = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}});
        let same = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
        let out = server_side_apply(Some(&live), &same, "m", false, "ConfigMap", true)
            .expect("same value: no conflict");
        assert_eq!(
            out["data"],
            json!({"a": "1", "b": "2"}),
            "fields of before-first-apply are kept"
        );
        let managers: Vec<&str> = out["metadata"]["managedFields"]
            .as_array()
            .expect("entries")
            .iter()
            .filter_map(|e| e["manager"].as_str())
            .collect();
        assert_eq!(managers, ["before-first-apply", "m"]);
        let different = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"b": "9"}});
        let err = server_side_apply(Some(&live), &different, "m", false, "ConfigMap", true)
            .expect_err("conflict");
        assert_eq!(err.conflicts[0].manager, "before-first-apply");
        assert_eq!(err.conflicts[0].field, ".data.b");
        let forced = server_side_apply(Some(&live), &different, "m", true, "ConfigMap", true)
            .expect("forced");
        assert_eq!(forced["data"], json!({"a": "1", "b": "9"}));
    }

    #[test]
    fn ssa_custom_resource_lists_are_atomic() {
        let first = json!({"apiVersion": "x/v1", "kind": "Thing", "metadata": {"name": "t", "finalizers": ["f1"]}, "spec": {"items": [{"name": "a"}, {"name": "b"}]}});
        let live = server_side_apply(None, &first, "m", false, "Thing", false).expect("create");
        let mut live = live;
        live["metadata"]["finalizers"] = json!(["f0", "f1"]);
        let second = json!({"apiVersion": "x/v1", "kind": "Thing", "metadata": {"name": "t", "finalizers": ["f2"]}, "spec": {"items": [{"name": "c"}]}});
        let out =
            server_side_apply(Some(&live), &second, "m", false, "Thing", false).expect("apply");
        assert_eq!(out["spec"]["items"], json!([{"name": "c"}]));
        // finalizers is a set: f1 (dropped by us) goes, f0 (not ours) stays, f2 is added.
        assert_eq!(out["metadata"]["finalizers"], json!(["f0", "f2"]));
    }
}
