//! `meta.k8s.io/v1` Table rendering (what `kubectl get` asks for), and the
//! small JSONPath subset CRD printer columns use.

use serde_json::{Value, json};

use super::resources::ResourceType;

/// Does an Accept header ask for a Table?
pub(crate) fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// Evaluate a printer-column JSONPath such as `.spec.version`,
/// `.status.conditions[?(@.type=="Available")].status` or `.spec.list[0].name`.
pub(crate) fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut cur: Vec<Value> = vec![obj.clone()];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            rest = &r[end..];
            cur = cur.iter().filter_map(|v| v.get(field).cloned()).collect();
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, v, eq) = match filter.split_once("!=") {
                    Some((k, v)) => (k, v, false),
                    None => {
                        let (k, v) = filter.split_once("==")?;
                        (k, v, true)
                    }
                };
                let v = v.trim().trim_matches('"').trim_matches('\'');
                let k = k.trim();
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flat_map(|a| a.iter())
                    .filter(|item| {
                        let actual = item.get(k).map(|x| {
                            x.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| x.to_string())
                        });
                        match actual {
                            Some(a) => (a == v) == eq,
                            None => false,
                        }
                    })
                    .cloned()
                    .collect();
            } else if inner == "*" {
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flat_map(|a| a.iter().cloned())
                    .collect();
            } else {
                let i: usize = inner.parse().ok()?;
                cur = cur.iter().filter_map(|v| v.get(i).cloned()).collect();
            }
        } else {
            return None;
        }
    }
    match cur.len() {
        0 => None,
        1 => cur.into_iter().next(),
        _ => Some(Value::Array(cur)),
    }
}

/// `5m`, `3h`, `2d` as kubectl prints ages.
pub(crate) fn human_age(ts: &str) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(ts) else {
        return "<unknown>".into();
    };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    if secs < 120 {
        format!("{secs}s")
    } else if secs < 600 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else if secs < 3 * 3600 {
        format!("{}m", secs / 60)
    } else if secs < 48 * 3600 {
        format!("{}h", secs / 3600)
    } else {
        format!("{}d", secs / 86400)
    }
}

fn column(name: &str, type_: &str, format: &str, description: &str, priority: i64) -> Value {
    json!({"name": name, "type": type_, "format": format, "description": description, "priority": priority})
}

fn columns(rt: &ResourceType) -> Vec<(Value, Option<String>)> {
    let mut cols = vec![(
        column(
            "Name",
            "string",
            "name",
            "Name must be unique within a namespace.",
            0,
        ),
        None,
    )];
    match &rt.custom {
        Some(c) if !c.printer_columns.is_empty() => {
            for pc in &c.printer_columns {
                cols.push((
                    column(
                        &pc.name,
                        &pc.type_,
                        &pc.format,
                        &pc.description,
                        pc.priority,
                    ),
                    Some(pc.json_path.clone()),
                ));
            }
        }
        _ => {
            if rt.scale.is_some() && rt.is_builtin() {
                cols.push((
                    column("Replicas", "integer", "", "Desired replicas", 0),
                    Some(".spec.replicas".into()),
                ));
            }
            if rt.is_builtin() && rt.kind == "StorageClass" {
                for (name, path) in [
                    ("Provisioner", ".provisioner"),
                    ("ReclaimPolicy", ".reclaimPolicy"),
                    ("VolumeBindingMode", ".volumeBindingMode"),
                    ("AllowVolumeExpansion", ".allowVolumeExpansion"),
                ] {
                    cols.push((column(name, "string", "", "", 0), Some(path.into())));
                }
            }
            if rt.kind == "Pod" || rt.kind == "Namespace" {
                cols.push((
                    column("Status", "string", "", "Phase", 0),
                    Some(".status.phase".into()),
                ));
            }
            cols.push((column("Age", "date", "", "CreationTimestamp is a timestamp representing the server time when this object was created.", 0), Some(".metadata.creationTimestamp".into())));
        }
    }
    cols
}

fn cell(obj: &Value, col: &Value, path: &Option<String>) -> Value {
    let Some(path) = path else {
        return obj
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or(Value::Null);
    };
    let v = json_path(obj, path);
    if col.get("type").and_then(Value::as_str) == Some("date") {
        return match v {
            Some(Value::String(s)) => json!(human_age(&s)),
            _ => json!("<unknown>"),
        };
    }
    match v {
        None | Some(Value::Null) => json!("<none>"),
        Some(Value::Array(a)) => json!(
            a.iter()
                .map(|x| x
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| x.to_string()))
                .collect::<Vec<_>>()
                .join(",")
        ),
        Some(x) => x,
    }
}

/// A Table of `objects` (rows carry PartialObjectMetadata).
pub(crate) fn to_table(
    rt: &ResourceType,
    objects: &[Value],
    resource_version: Option<String>,
    cont: Option<String>,
) -> Value {
    let cols = columns(rt);
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells: Vec<Value> = cols.iter().map(|(c, p)| cell(o, c, p)).collect();
            // as kubectl's printer for StorageClasses: `NAME (default)`
            if rt.is_builtin()
                && rt.kind == "StorageClass"
                && o.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                    .and_then(Value::as_str)
                    == Some("true")
                && let Some(Value::String(name)) = cells.first_mut()
            {
                name.push_str(" (default)");
            }
            if rt.is_builtin() && rt.kind == "StorageClass" && cells.get(4) == Some(&json!("<none>")) {
                cells[4] = json!(false);
            }
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}})
        })
        .collect();
    let mut md = json!({});
    if let Some(rv) = resource_version {
        md["resourceVersion"] = json!(rv);
    }
    if let Some(c) = cont {
        md["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": md,
        "columnDefinitions": cols.into_iter().map(|(c, _)| c).collect::<Vec<_>>(), "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_subset() {
        let o = json!({"spec": {"v": "4.17", "l": [{"n": "a"}, {"n": "b"}]},
            "status": {"conditions": [{"type": "Available", "status": "True"}, {"type": "Degraded", "status": "False"}]}});
        assert_eq!(json_path(&o, ".spec.v"), Some(json!("4.17")));
        assert_eq!(json_path(&o, ".spec.l[1].n"), Some(json!("b")));
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Available\")].status"),
            Some(json!("True"))
        );
        assert_eq!(json_path(&o, ".spec.missing"), None);
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type!=\"Available\")].type"),
            Some(json!("Degraded"))
        );
    }

    #[test]
    fn table_accept_detection() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
