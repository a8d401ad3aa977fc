//! Conversion between served versions of a custom resource, standing in for
//! the conversion webhooks of real providers. A real server converts an
//! object stored at one version when it is read at another; serving it
//! unconverted would hand clients an object their version's schema rejects.
//!
//! Implemented: Cluster API `cluster.x-k8s.io` v1beta1 <-> v1beta2 object
//! references (v1beta1 `{apiVersion, kind, name, namespace}` become v1beta2
//! `{apiGroup, kind, name}`; going back, the version comes from the
//! `cluster.x-k8s.io/conversion-data` annotation written on the way up, as
//! CAPI's own conversion keeps what the other version cannot hold, else
//! `v1beta1`). Other pairs pass through unchanged (same-schema versions).

use serde_json::{Map, Value, json};

pub const CAPI: &str = "cluster.x-k8s.io";
/// Where CAPI keeps what a conversion could not represent.
pub const CONVERSION_DATA: &str = "cluster.x-k8s.io/conversion-data";

fn ref_pointers(kind: &str) -> &'static [&'static str] {
    match kind {
        "Cluster" => &["/spec/controlPlaneRef", "/spec/infrastructureRef"],
        "MachineDeployment" | "MachineSet" | "MachinePool" => {
            &["/spec/template/spec/infrastructureRef", "/spec/template/spec/bootstrap/configRef"]
        }
        "Machine" => &["/spec/infrastructureRef", "/spec/bootstrap/configRef"],
        _ => &[],
    }
}

/// Convert `obj` (stored with `from` apiVersion) to `to` in place.
pub fn convert(group: &str, kind: &str, from: &str, to: &str, obj: &mut Value) {
    if group != CAPI || from == to {
        return;
    }
    let (from_v, to_v) = (version(from), version(to));
    match (from_v, to_v) {
        ("v1beta1", "v1beta2") => up(kind, obj),
        ("v1beta2", "v1beta1") => down(kind, obj),
        _ => {}
    }
}

fn version(api_version: &str) -> &str {
    api_version.rsplit('/').next().unwrap_or(api_version)
}

fn up(kind: &str, obj: &mut Value) {
    let mut kept = Map::new();
    for pointer in ref_pointers(kind) {
        let Some(r) = obj.pointer_mut(pointer) else { continue };
        let Some(api_version) = r.get("apiVersion").and_then(Value::as_str).map(str::to_string) else { continue };
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        let converted = json!({"apiGroup": group, "kind": r["kind"], "name": r["name"]});
        kept.insert(pointer.to_string(), json!(api_version));
        *r = converted;
    }
    if !kept.is_empty() {
        obj["metadata"]["annotations"][CONVERSION_DATA] = json!(Value::Object(kept).to_string());
    }
}

fn down(kind: &str, obj: &mut Value) {
    let kept: Map<String, Value> = obj
        .pointer(&format!("/metadata/annotations/{}", CONVERSION_DATA.replace('/', "~1")))
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let namespace = obj["metadata"]["namespace"].clone();
    for pointer in ref_pointers(kind) {
        let Some(r) = obj.pointer_mut(pointer) else { continue };
        let Some(group) = r.get("apiGroup").and_then(Value::as_str).map(str::to_string) else { continue };
        let api_version = kept
            .get(*pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{group}/v1beta1"));
        *r = json!({"apiVersion": api_version, "kind": r["kind"], "name": r["name"], "namespace": namespace});
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capi_refs_round_trip() {
        let original = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"controlPlaneRef": {"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane", "name": "demo", "namespace": "ns"}}});
        let mut obj = original.clone();
        convert(CAPI, "Cluster", "cluster.x-k8s.io/v1beta1", "cluster.x-k8s.io/v1beta2", &mut obj);
        assert_eq!(obj["spec"]["controlPlaneRef"], json!({"apiGroup": "hypershift.openshift.io", "kind": "HostedControlPlane", "name": "demo"}));
        convert(CAPI, "Cluster", "cluster.x-k8s.io/v1beta2", "cluster.x-k8s.io/v1beta1", &mut obj);
        assert_eq!(obj["spec"], original["spec"]);
        // other groups pass through
        let mut other = original.clone();
        convert("example.com", "Cluster", "example.com/v1beta1", "example.com/v1beta2", &mut other);
        assert_eq!(other, original);
    }
}
