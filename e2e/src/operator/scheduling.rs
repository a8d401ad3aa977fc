//! The scheduler's part in the emulated mode ([`super::Controllers::Sandbox`]):
//! one virtual node stands for the management cluster's nodes, and a pod the
//! sandbox places there itself (hcp-dr's etcd restore pods, which have no
//! `spec.nodeName`) must fit it as the scheduler would check: its
//! `nodeSelector`, its required node affinity and its tolerations against
//! the node's labels and taints.
//!
//! The virtual node `<cluster>-control-plane-0` has the labels of
//! [`virtual_node_labels`] (a real node's `kubernetes.io/hostname`,
//! `kubernetes.io/os: linux`, `kubernetes.io/arch: amd64`,
//! `topology.kubernetes.io/zone: <cluster>-zone-a`, and the sandbox Node's
//! own `sandbox.hcp-dr.io/kubelet: "true"` and `sandbox.hcp-dr.io/cluster`),
//! and no taints.
//!
//! Not evaluated: inter-pod affinity and anti-affinity (one virtual node
//! stands for every node, so "not on the same node as" cannot be decided),
//! preferred terms (they only rank nodes), resources, ports. Where the
//! cluster's own scheduler runs ([`super::Controllers::Cluster`]) it does
//! all of this, and the sandbox checks nothing.

use std::collections::BTreeMap;

use serde_json::Value;

/// The scheduler's message for a pod no node's labels fit (one node).
pub const AFFINITY_MISMATCH: &str = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.";
/// The scheduler's message for a pod with a claim not bound yet (not of a
/// `WaitForFirstConsumer` class).
pub const UNBOUND_CLAIMS: &str = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.";

/// The labels of the virtual node `node` of management cluster `cluster`.
pub fn virtual_node_labels(cluster: &str, node: &str) -> BTreeMap<String, String> {
    [
        ("kubernetes.io/hostname", node.to_string()),
        ("kubernetes.io/os", "linux".to_string()),
        ("kubernetes.io/arch", "amd64".to_string()),
        ("topology.kubernetes.io/zone", format!("{cluster}-zone-a")),
        (super::kubelet::NODE_LABEL, "true".to_string()),
        ("sandbox.hcp-dr.io/cluster", cluster.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The virtual node of the emulated mode, as the scheduler would see it.
pub(crate) fn virtual_node(ctx: &super::Ctx) -> NodeView {
    let name = super::workloads::virtual_node(ctx);
    NodeView { labels: virtual_node_labels(&ctx.cfg.cluster_name, &name), name, taints: Vec::new() }
}

/// A node as the scheduler sees it.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.taints` (`key`, `value`, `effect`).
    pub taints: Vec<Value>,
}

/// Whether the pod spec `spec` fits `node`: `Err` with the scheduler's
/// message when it does not.
pub fn fits(spec: &Value, node: &NodeView) -> Result<(), String> {
    if !selector_matches(spec.get("nodeSelector"), &node.labels) || !required_affinity_matches(spec, node) {
        return Err(AFFINITY_MISMATCH.to_string());
    }
    let tolerations = spec.get("tolerations").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if let Some(taint) = node.taints.iter().find(|t| {
        matches!(t.get("effect").and_then(Value::as_str), Some("NoSchedule" | "NoExecute"))
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    }) {
        let key = taint.get("key").and_then(Value::as_str).unwrap_or_default();
        let value = taint.get("value").and_then(Value::as_str).unwrap_or_default();
        return Err(format!("0/1 nodes are available: 1 node(s) had untolerated taint {{{key}: {value}}}."));
    }
    Ok(())
}

/// `nodeSelector`: every pair among the labels.
fn selector_matches(selector: Option<&Value>, labels: &BTreeMap<String, String>) -> bool {
    selector.and_then(Value::as_object).is_none_or(|m| {
        m.iter().all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
    })
}

/// `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`:
/// any of its terms matches (a term: all of its expressions and fields); no
/// terms (or none given) matches every node, as upstream.
fn required_affinity_matches(spec: &Value, node: &NodeView) -> bool {
    let Some(terms) = spec
        .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return true;
    };
    if terms.is_empty() {
        return true;
    }
    terms.iter().any(|term| {
        let exprs = term.get("matchExpressions").and_then(Value::as_array);
        let fields = term.get("matchFields").and_then(Value::as_array);
        // an empty term matches no node
        if exprs.is_none_or(Vec::is_empty) && fields.is_none_or(Vec::is_empty) {
            return false;
        }
        exprs.into_iter().flatten().all(|e| requirement_matches(e, |k| node.labels.get(k).cloned()))
            && fields
                .into_iter()
                .flatten()
                .all(|e| requirement_matches(e, |k| (k == "metadata.name").then(|| node.name.clone())))
    })
}

/// One `NodeSelectorRequirement` (In, NotIn, Exists, DoesNotExist, Gt, Lt).
fn requirement_matches(req: &Value, value_of: impl Fn(&str) -> Option<String>) -> bool {
    let key = req.get("key").and_then(Value::as_str).unwrap_or_default();
    let values: Vec<&str> = req.get("values").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let have = value_of(key);
    match req.get("operator").and_then(Value::as_str).unwrap_or_default() {
        "In" => have.is_some_and(|v| values.contains(&v.as_str())),
        "NotIn" => have.is_none_or(|v| !values.contains(&v.as_str())),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        op @ ("Gt" | "Lt") => {
            let (Some(have), Some(bound)) = (have.and_then(|v| v.parse::<i64>().ok()), values.first().and_then(|v| v.parse::<i64>().ok())) else {
                return false;
            };
            if op == "Gt" { have > bound } else { have < bound }
        }
        _ => false,
    }
}

/// Whether `toleration` tolerates `taint` (upstream's `ToleratesTaint`).
fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let effect = s(toleration, "effect");
    if !effect.is_empty() && effect != s(taint, "effect") {
        return false;
    }
    let key = s(toleration, "key");
    if !key.is_empty() && key != s(taint, "key") {
        return false;
    }
    match s(toleration, "operator").as_str() {
        "Exists" => true,
        "" | "Equal" => !key.is_empty() && s(toleration, "value") == s(taint, "value"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> NodeView {
        NodeView {
            name: "mgmt-a-control-plane-0".into(),
            labels: virtual_node_labels("mgmt-a", "mgmt-a-control-plane-0"),
            taints: vec![],
        }
    }

    #[test]
    fn node_selectors_match_the_virtual_node_labels() {
        assert!(fits(&json!({}), &node()).is_ok());
        assert!(fits(&json!({"nodeSelector": {"kubernetes.io/os": "linux"}}), &node()).is_ok());
        assert!(fits(&json!({"nodeSelector": {"sandbox.hcp-dr.io/kubelet": "true", "kubernetes.io/arch": "amd64"}}), &node()).is_ok());
        assert_eq!(
            fits(&json!({"nodeSelector": {"hypershift.openshift.io/control-plane": "true"}}), &node()),
            Err(AFFINITY_MISMATCH.to_string())
        );
        assert!(fits(&json!({"nodeSelector": {"kubernetes.io/os": "windows"}}), &node()).is_err());
    }

    #[test]
    fn required_node_affinity_is_an_or_of_ands() {
        let affinity = |terms: Value| json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}});
        let expr = |key: &str, op: &str, values: &[&str]| json!({"key": key, "operator": op, "values": values});
        let n = node();
        assert!(fits(&affinity(json!([{"matchExpressions": [expr("kubernetes.io/os", "In", &["linux", "darwin"])]}])), &n).is_ok());
        assert!(fits(&affinity(json!([{"matchExpressions": [expr("kubernetes.io/os", "NotIn", &["linux"])]}])), &n).is_err());
        assert!(fits(&affinity(json!([{"matchExpressions": [expr("node-role.kubernetes.io/infra", "NotIn", &["x"])]}])), &n).is_ok());
        assert!(fits(&affinity(json!([{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "Exists"}]}])), &n).is_ok());
        assert!(fits(&affinity(json!([{"matchExpressions": [{"key": "hypershift.openshift.io/control-plane", "operator": "Exists"}]}])), &n).is_err());
        assert!(fits(&affinity(json!([{"matchExpressions": [{"key": "hypershift.openshift.io/control-plane", "operator": "DoesNotExist"}]}])), &n).is_ok());
        // all expressions of a term, any term
        let both = json!([{"matchExpressions": [expr("kubernetes.io/os", "In", &["linux"]), expr("kubernetes.io/arch", "In", &["arm64"])]}]);
        assert!(fits(&affinity(both), &n).is_err());
        let either = json!([{"matchExpressions": [expr("kubernetes.io/arch", "In", &["arm64"])]},
                            {"matchExpressions": [expr("kubernetes.io/arch", "In", &["amd64"])]}]);
        assert!(fits(&affinity(either), &n).is_ok());
        // matchFields on the node's name; an empty term matches nothing
        assert!(fits(&affinity(json!([{"matchFields": [expr("metadata.name", "In", &["mgmt-a-control-plane-0"])]}])), &n).is_ok());
        assert!(fits(&affinity(json!([{"matchFields": [expr("metadata.name", "In", &["other"])]}])), &n).is_err());
        assert!(fits(&affinity(json!([{}])), &n).is_err());
        // anti-affinity and preferred terms are not evaluated
        let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "etcd"}}, "topologyKey": "kubernetes.io/hostname"}]},
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "preference": {"matchExpressions": [expr("hypershift.openshift.io/control-plane", "In", &["true"])]}}]}}});
        assert!(fits(&anti, &n).is_ok());
    }

    #[test]
    fn taints_need_tolerations() {
        let mut n = node();
        assert!(fits(&json!({"tolerations": [{"key": "x", "operator": "Exists"}]}), &n).is_ok());
        n.taints = vec![json!({"key": "sandbox.hcp-dr.io/kubelet", "value": "true", "effect": "NoSchedule"})];
        assert_eq!(
            fits(&json!({}), &n),
            Err("0/1 nodes are available: 1 node(s) had untolerated taint {sandbox.hcp-dr.io/kubelet: true}.".to_string())
        );
        let exists = json!({"tolerations": [{"key": "sandbox.hcp-dr.io/kubelet", "operator": "Exists", "effect": "NoSchedule"}]});
        assert!(fits(&exists, &n).is_ok());
        let equal = json!({"tolerations": [{"key": "sandbox.hcp-dr.io/kubelet", "operator": "Equal", "value": "true"}]});
        assert!(fits(&equal, &n).is_ok());
        let wrong = json!({"tolerations": [{"key": "sandbox.hcp-dr.io/kubelet", "value": "false"}]});
        assert!(fits(&wrong, &n).is_err());
        let everything = json!({"tolerations": [{"operator": "Exists"}]});
        assert!(fits(&everything, &n).is_ok());
        n.taints = vec![json!({"key": "k", "value": "v", "effect": "PreferNoSchedule"})];
        assert!(fits(&json!({}), &n).is_ok(), "PreferNoSchedule does not filter");
    }
}
