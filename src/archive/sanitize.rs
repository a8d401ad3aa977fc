//! Per-object clean-ups applied on export: small named transforms, each
//! saying what it applies to. Everything they do not name is kept, unknown
//! fields included.

use serde_json::Value;

/// One clean-up.
pub struct Sanitizer {
    pub name: &'static str,
    /// What it applies to, for docs and `--dry-run`.
    pub applies_to: &'static str,
    pub applies: fn(&Value) -> bool,
    pub apply: fn(&mut Value),
}

fn all(_: &Value) -> bool {
    true
}

fn strip_server_metadata(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "generation",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            meta.remove(field);
        }
    }
}

fn strip_status(obj: &mut Value) {
    if let Some(map) = obj.as_object_mut() {
        map.remove("status");
    }
}

fn strip_last_applied(obj: &mut Value) {
    if let Some(annotations) = obj
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        if annotations.is_empty() {
            if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("annotations");
            }
        }
    }
}

fn strip_owner_references(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("ownerReferences");
    }
}

fn remove_paused_until(obj: &mut Value) {
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("pausedUntil");
    }
}

fn is_capi_cluster(obj: &Value) -> bool {
    obj["apiVersion"].as_str().is_some_and(|v| v.starts_with("cluster.x-k8s.io/")) && obj["kind"] == "Cluster"
}

fn remove_capi_pause(obj: &mut Value) {
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("paused");
    }
}

fn is_bare_metal_host(obj: &Value) -> bool {
    obj["apiVersion"].as_str().is_some_and(|v| v.starts_with("metal3.io/")) && obj["kind"] == "BareMetalHost"
}

fn status_into_annotation(obj: &mut Value) {
    use crate::hosted::agent::{DETACHED, STATUS_ANNOTATION};
    let status = obj.as_object_mut().and_then(|map| map.remove("status")).filter(|s| s.as_object().is_some_and(|m| !m.is_empty()));
    if !obj["metadata"]["annotations"].is_object() {
        obj["metadata"]["annotations"] = Value::Object(Default::default());
    }
    let Some(annotations) = obj.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) else { return };
    annotations.remove(DETACHED);
    if let Some(status) = status {
        annotations.insert(STATUS_ANNOTATION.to_string(), Value::String(status.to_string()));
    }
    if annotations.is_empty() {
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("annotations");
        }
    }
}

fn is_hypershift_top(obj: &Value) -> bool {
    obj["apiVersion"].as_str().is_some_and(|v| v.starts_with("hypershift.openshift.io/"))
        && matches!(obj["kind"].as_str(), Some("HostedCluster" | "NodePool" | "HostedControlPlane"))
}

/// Applied to every exported object.
pub const EXPORT: &[Sanitizer] = &[
    Sanitizer {
        name: "strip-server-metadata",
        applies_to: "every object",
        applies: all,
        apply: strip_server_metadata,
    },
    Sanitizer {
        name: "strip-status",
        applies_to: "every object but Agents and BareMetalHosts (status is rebuilt by controllers; theirs is the host's record of discovery and provisioning, which would otherwise be redone)",
        applies: |obj| !crate::hosted::agent::keeps_status(obj),
        apply: strip_status,
    },
    Sanitizer {
        name: "strip-last-applied",
        applies_to: "every object (the annotation can hold a second copy of a Secret)",
        applies: all,
        apply: strip_last_applied,
    },
];

/// Applied when replaying a backup onto a cluster.
pub const REPLAY: &[Sanitizer] = &[
    Sanitizer {
        name: "strip-server-metadata",
        applies_to: "every object",
        applies: all,
        apply: strip_server_metadata,
    },
    Sanitizer {
        name: "drop-owner-references",
        applies_to: "every object (the owners' uids do not exist on the destination)",
        applies: all,
        apply: strip_owner_references,
    },
    Sanitizer {
        name: "remove-paused-until",
        applies_to: "HostedCluster, NodePool, HostedControlPlane (the backup's pause must not travel)",
        applies: is_hypershift_top,
        apply: remove_paused_until,
    },
    Sanitizer {
        name: "bare-metal-host-status",
        applies_to: "BareMetalHost (its status goes into the baremetalhost.metal3.io/status annotation, from which metal3 restores it instead of inspecting or provisioning the host again; a detach by the source's migration must not travel)",
        applies: is_bare_metal_host,
        apply: status_into_annotation,
    },
    Sanitizer {
        name: "remove-capi-pause",
        applies_to: "Cluster API Cluster (HyperShift pauses it with the HostedCluster; the backup's pause must not travel)",
        applies: is_capi_cluster,
        apply: remove_capi_pause,
    },
];

/// Run every applicable sanitizer; returns the names that applied.
pub fn apply(sanitizers: &[Sanitizer], obj: &mut Value) -> Vec<&'static str> {
    let mut applied = Vec::new();
    for s in sanitizers {
        if (s.applies)(obj) {
            (s.apply)(obj);
            applied.push(s.name);
        }
    }
    applied
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn export_keeps_everything_but_server_state() {
        let mut obj = json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
            "metadata": {"name": "demo", "namespace": "clusters", "uid": "u", "resourceVersion": "7",
                         "creationTimestamp": "t", "managedFields": [], "generation": 3,
                         "labels": {"a": "b"}, "finalizers": ["hypershift.openshift.io/finalizer"],
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                         "ownerReferences": [{"uid": "x"}]},
            "spec": {"pausedUntil": "2026-01-01T00:00:00Z", "unknownField": {"kept": true}},
            "status": {"conditions": []}
        });
        let applied = apply(EXPORT, &mut obj);
        assert_eq!(applied, vec!["strip-server-metadata", "strip-status", "strip-last-applied"]);
        assert_eq!(
            obj,
            json!({
                "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                "metadata": {"name": "demo", "namespace": "clusters", "labels": {"a": "b"},
                             "finalizers": ["hypershift.openshift.io/finalizer"],
                             "ownerReferences": [{"uid": "x"}]},
                "spec": {"pausedUntil": "2026-01-01T00:00:00Z", "unknownField": {"kept": true}}
            })
        );
        let applied = apply(REPLAY, &mut obj);
        assert!(applied.contains(&"remove-paused-until"));
        assert!(obj["metadata"].get("ownerReferences").is_none());
        assert!(obj["spec"].get("pausedUntil").is_none());
        assert_eq!(obj["spec"]["unknownField"]["kept"], true);
    }

    #[test]
    fn a_bare_metal_host_keeps_its_status_in_the_annotation_metal3_restores() {
        let mut bmh = json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": "host-0", "namespace": "hosts", "uid": "u", "annotations": {"baremetalhost.metal3.io/detached": ""}},
            "spec": {"online": true, "bootMACAddress": "52:54:00:00:00:01"},
            "status": {"provisioning": {"state": "provisioned"}, "poweredOn": true}});
        assert!(!apply(EXPORT, &mut bmh).contains(&"strip-status"));
        assert_eq!(bmh["status"]["provisioning"]["state"], "provisioned");
        assert!(apply(REPLAY, &mut bmh).contains(&"bare-metal-host-status"));
        assert!(bmh.get("status").is_none());
        let annotations = bmh["metadata"]["annotations"].as_object().unwrap();
        assert!(!annotations.contains_key("baremetalhost.metal3.io/detached"), "{annotations:?}");
        let restored: Value = serde_json::from_str(annotations["baremetalhost.metal3.io/status"].as_str().unwrap()).unwrap();
        assert_eq!(restored, json!({"provisioning": {"state": "provisioned"}, "poweredOn": true}));
        // an Agent keeps its status for the status subresource
        let mut agent = json!({"apiVersion": "agent-install.openshift.io/v1beta1", "kind": "Agent", "metadata": {"name": "a"}, "status": {"inventory": {}}});
        apply(EXPORT, &mut agent);
        assert!(agent.get("status").is_some());
    }

    #[test]
    fn replay_unpauses_the_capi_cluster() {
        let mut obj = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "x"}, "spec": {"paused": true, "clusterNetwork": {}}});
        assert!(apply(REPLAY, &mut obj).contains(&"remove-capi-pause"));
        assert_eq!(obj["spec"], json!({"clusterNetwork": {}}));
    }

    #[test]
    fn replay_leaves_other_kinds_paused_until_alone() {
        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "spec": {"pausedUntil": "keep"}});
        apply(REPLAY, &mut obj);
        assert_eq!(obj["spec"]["pausedUntil"], "keep");
    }
}
