//! Typed views of the HyperShift objects hcp-dr works on, and the naming
//! rules that tie them together (HCP namespace, secret names, writers).
//! Views wrap the object as JSON so nothing the tool does not know is lost.

pub mod agent;
pub mod kubevirt;
pub mod oidc;
pub mod publishing;
pub mod render;

use kube::core::ApiResource;
use serde_json::Value;

/// `(group, version, kind, plural)` of an API type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gvk {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

impl Gvk {
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.to_string(),
            version: self.version.to_string(),
            api_version: if self.group.is_empty() {
                self.version.to_string()
            } else {
                format!("{}/{}", self.group, self.version)
            },
            kind: self.kind.to_string(),
            plural: self.plural.to_string(),
        }
    }
}

pub const SECRET: Gvk = Gvk { group: "", version: "v1", kind: "Secret", plural: "secrets" };
pub const HOSTED_CLUSTER: Gvk = Gvk {
    group: "hypershift.openshift.io",
    version: "v1beta1",
    kind: "HostedCluster",
    plural: "hostedclusters",
};
pub const NODE_POOL: Gvk = Gvk {
    group: "hypershift.openshift.io",
    version: "v1beta1",
    kind: "NodePool",
    plural: "nodepools",
};
pub const HOSTED_CONTROL_PLANE: Gvk = Gvk {
    group: "hypershift.openshift.io",
    version: "v1beta1",
    kind: "HostedControlPlane",
    plural: "hostedcontrolplanes",
};

/// The Cluster API Cluster of a hosted control plane (named by the
/// HostedCluster's infraID, in the HCP namespace).
pub const CAPI_CLUSTER: Gvk = Gvk {
    group: "cluster.x-k8s.io",
    version: "v1beta1",
    kind: "Cluster",
    plural: "clusters",
};

/// OpenShift Routes: how a hosted cluster's services are published on an
/// OpenShift management cluster (external-dns reads their `spec.host`).
pub const ROUTE: Gvk = Gvk {
    group: "route.openshift.io",
    version: "v1",
    kind: "Route",
    plural: "routes",
};

/// The annotation `hcp-dr fence` puts on a HostedCluster whose copy on this
/// management cluster must not run: where the cluster runs now. Backup and
/// `cluster resume` refuse a cluster that carries it.
pub const FENCED: &str = "hcp-dr.openshift.io/fenced";

/// The annotation naming the run (journal `run_id`) that created an object.
pub const RUN_ANNOTATION: &str = "hcp-dr.openshift.io/created-by-run";

/// API groups whose namespaced resources in the HCP namespace belong to the
/// hosted cluster: exported by a backup, deleted by a teardown.
pub fn exported_group(group: &str) -> bool {
    group == "hypershift.openshift.io"
        || group == "cluster.x-k8s.io"
        || group.ends_with(".cluster.x-k8s.io")
        || group.starts_with("capi-provider.")
}

/// The Deployments that write to etcd: scaled to zero for a consistent snapshot.
pub const ETCD_WRITERS: [&str; 3] = ["kube-apiserver", "openshift-apiserver", "openshift-oauth-apiserver"];
/// Also stopped when migrating, so nothing reconciles the source behind our back.
pub const CONTROL_PLANE_OPERATOR: &str = "control-plane-operator";
/// The etcd StatefulSet and its pods' label.
pub const ETCD_STATEFULSET: &str = "etcd";
pub const ETCD_POD_SELECTOR: &str = "app=etcd";
pub const ETCD_CLIENT_PORT: u16 = 2379;

/// The HCP namespace of a hosted cluster: `<namespace>-<name>`.
pub fn hcp_namespace(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// The name an etcd member's serving certificate is valid for.
pub fn etcd_member_server_name(member: &str, hcp_namespace: &str) -> String {
    format!("{member}.etcd-discovery.{hcp_namespace}.svc")
}

/// A HostedCluster as JSON, with accessors for what DR needs.
#[derive(Debug, Clone, PartialEq)]
pub struct HostedCluster(pub Value);

impl HostedCluster {
    pub fn name(&self) -> &str {
        self.0["metadata"]["name"].as_str().unwrap_or_default()
    }
    pub fn namespace(&self) -> &str {
        self.0["metadata"]["namespace"].as_str().unwrap_or_default()
    }
    pub fn uid(&self) -> &str {
        self.0["metadata"]["uid"].as_str().unwrap_or_default()
    }
    pub fn hcp_namespace(&self) -> String {
        hcp_namespace(self.namespace(), self.name())
    }
    /// Where its control-plane pods may run, as a pod spec fragment: its
    /// `spec.nodeSelector` and `spec.tolerations` (those HyperShift
    /// propagates to every control-plane pod), each only when set.
    pub fn control_plane_placement(&self) -> Value {
        let mut out = serde_json::Map::new();
        for field in ["nodeSelector", "tolerations"] {
            let v = &self.0["spec"][field];
            let set = v.as_object().is_some_and(|m| !m.is_empty()) || v.as_array().is_some_and(|a| !a.is_empty());
            if set {
                out.insert(field.to_string(), v.clone());
            }
        }
        Value::Object(out)
    }
    /// `Managed`, `Unmanaged`, or "" when unset.
    pub fn etcd_management_type(&self) -> &str {
        self.0["spec"]["etcd"]["managementType"].as_str().unwrap_or_default()
    }
    /// `SingleReplica` or `HighlyAvailable` (the CRD's default, which the
    /// API server fills in; used here too when the field is absent).
    pub fn availability_policy(&self) -> &str {
        self.0["spec"]["controllerAvailabilityPolicy"]
            .as_str()
            .unwrap_or("HighlyAvailable")
    }
    pub fn expected_etcd_members(&self) -> usize {
        if self.availability_policy() == "HighlyAvailable" { 3 } else { 1 }
    }
    pub fn platform(&self) -> &str {
        self.0["spec"]["platform"]["type"].as_str().unwrap_or_default()
    }
    pub fn release_image(&self) -> &str {
        self.0["spec"]["release"]["image"].as_str().unwrap_or_default()
    }
    pub fn paused_until(&self) -> Option<&str> {
        self.0["spec"]["pausedUntil"].as_str()
    }
    pub fn cluster_id(&self) -> Option<&str> {
        self.0["spec"]["clusterID"].as_str()
    }
    pub fn infra_id(&self) -> Option<&str> {
        self.0["spec"]["infraID"].as_str()
    }
    pub fn restore_snapshot_url(&self) -> Option<&str> {
        self.0["spec"]["etcd"]["managed"]["storage"]["restoreSnapshotURL"][0].as_str()
    }
    /// Names of the secrets the spec points at in the HC namespace: pull
    /// secret, etcd encryption key, SSH key, and any other `...Ref`/`...Secret`
    /// name fields under spec (found by walking, so new fields are not missed).
    pub fn referenced_secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        for path in [
            &["pullSecret", "name"][..],
            &["secretEncryption", "aescbc", "activeKey", "name"],
            &["secretEncryption", "aescbc", "backupKey", "name"],
            &["sshKey", "name"],
            &["auditWebhook", "name"],
            &["serviceAccountSigningKey", "name"],
        ] {
            let mut v = &self.0["spec"];
            for p in path {
                v = &v[*p];
            }
            if let Some(name) = v.as_str().filter(|n| !n.is_empty()) {
                out.push(name.to_string());
            }
        }
        out.sort();
        out.dedup();
        out
    }
    pub fn encryption_key_secret(&self) -> Option<&str> {
        self.0["spec"]["secretEncryption"]["aescbc"]["activeKey"]["name"].as_str()
    }
    /// The fixed hostnames of the services (Route `route.hostname`,
    /// LoadBalancer `loadBalancer.hostname`), sorted, and the API server's
    /// (`None`: the API server has no fixed hostname).
    pub fn published_hosts(&self) -> (Option<String>, Vec<String>) {
        let mut api_host = None;
        let mut hosts = Vec::new();
        for service in self.0.pointer("/spec/services").and_then(Value::as_array).into_iter().flatten() {
            let strategy = &service["servicePublishingStrategy"];
            let host = match strategy["type"].as_str() {
                Some("Route") => strategy.pointer("/route/hostname"),
                Some("LoadBalancer") => strategy.pointer("/loadBalancer/hostname"),
                _ => None,
            }
            .and_then(Value::as_str)
            .filter(|h| !h.is_empty());
            if let Some(host) = host {
                if service["service"] == "APIServer" {
                    api_host = Some(host.to_string());
                }
                hosts.push(host.to_string());
            }
        }
        hosts.sort();
        hosts.dedup();
        (api_host, hosts)
    }

    /// The `hcp-dr fence` annotation: where the live copy runs.
    pub fn fenced(&self) -> Option<&str> {
        self.0.pointer("/metadata/annotations").and_then(|a| a.get(FENCED)).and_then(Value::as_str)
    }

    /// Refuse to `doing` (start or repair) a copy `hcp-dr fence` stopped.
    pub fn refuse_if_fenced(&self, doing: &str) -> Result<(), String> {
        let (ns, name) = (self.0["metadata"]["namespace"].as_str().unwrap_or_default(), self.0["metadata"]["name"].as_str().unwrap_or_default());
        match self.fenced() {
            Some(runs_on) => Err(format!(
                "HostedCluster {ns}/{name} is fenced on this management cluster (annotation {FENCED}: the cluster runs on {runs_on}): refusing to {doing}, which would start a second, stale copy. If this copy is the one to keep, stop the other first and lift the fence with `hcp-dr fence --release --hosted-cluster {name} -n {ns}`"
            )),
            None => Ok(()),
        }
    }

    /// The value of a status condition (`True`/`False`/`Unknown`).
    pub fn condition(&self, kind: &str) -> Option<&str> {
        condition(&self.0, kind)
    }
}

/// The value of condition `kind` in `obj.status.conditions` if it speaks of
/// the current spec: `None` while its `observedGeneration` is below
/// `metadata.generation` (the controller has not seen the last change; its
/// `True` is about the spec before). A condition without
/// `observedGeneration` is taken as current.
pub fn current_condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    let generation = obj.pointer("/metadata/generation").and_then(Value::as_i64);
    let cond = obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)?;
    match (cond["observedGeneration"].as_i64(), generation) {
        (Some(observed), Some(generation)) if observed < generation => None,
        _ => cond["status"].as_str(),
    }
}

/// The value of condition `kind` in `obj.status.conditions`.
pub fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
}

/// Whether a `pausedUntil` value pauses reconciliation at `now`, as HyperShift reads it.
pub fn pauses(paused_until: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> bool {
    match paused_until {
        Some("true") | Some("True") => true,
        Some(value) => chrono::DateTime::parse_from_rfc3339(value)
            .map(|t| t > now)
            .unwrap_or(false),
        None => false,
    }
}

/// The `pausedUntil` to set: `wanted`, unless `existing` pauses longer
/// (`true`, or a later deadline), which is kept.
pub fn longest_pause(existing: Option<&str>, wanted: &str) -> String {
    match existing {
        Some(v) if v.eq_ignore_ascii_case("true") => v.to_string(),
        Some(v) => match (chrono::DateTime::parse_from_rfc3339(v), chrono::DateTime::parse_from_rfc3339(wanted)) {
            (Ok(have), Ok(want)) if have > want => v.to_string(),
            _ => wanted.to_string(),
        },
        None => wanted.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_about_an_older_spec_is_not_current() {
        let obj = |observed: Option<i64>| {
            let mut c = serde_json::json!({"type": "Available", "status": "True"});
            if let Some(g) = observed {
                c["observedGeneration"] = serde_json::json!(g);
            }
            serde_json::json!({"metadata": {"generation": 3}, "status": {"conditions": [c]}})
        };
        assert_eq!(current_condition(&obj(Some(2)), "Available"), None);
        assert_eq!(current_condition(&obj(Some(3)), "Available"), Some("True"));
        assert_eq!(current_condition(&obj(None), "Available"), Some("True"));
        assert_eq!(current_condition(&obj(Some(3)), "Degraded"), None);
    }
    use serde_json::json;

    #[test]
    fn the_control_plane_placement_is_the_spec_node_selector_and_tolerations_when_set() {
        let hc = HostedCluster(json!({"spec": {"nodeSelector": {"role": "hcp"},
            "tolerations": [{"key": "role", "operator": "Exists", "effect": "NoSchedule"}]}}));
        assert_eq!(hc.control_plane_placement(), json!({"nodeSelector": {"role": "hcp"},
            "tolerations": [{"key": "role", "operator": "Exists", "effect": "NoSchedule"}]}));
        let empty = HostedCluster(json!({"spec": {"nodeSelector": {}, "tolerations": []}}));
        assert_eq!(empty.control_plane_placement(), json!({}));
        assert_eq!(HostedCluster(json!({"spec": {}})).control_plane_placement(), json!({}));
        // the mover Job carries it on its pod template, nothing else moves
        let job = crate::stages::volumes::mover_job("m", "ns", "c", "img", "t", &json!({}), &hc.control_plane_placement(), std::time::Duration::from_secs(60));
        assert_eq!(job["spec"]["template"]["spec"]["nodeSelector"], json!({"role": "hcp"}));
        assert_eq!(job["spec"]["template"]["spec"]["tolerations"][0]["key"], "role");
        assert_eq!(job["spec"]["template"]["spec"]["automountServiceAccountToken"], false);
        let bare = crate::stages::volumes::mover_job("m", "ns", "c", "img", "t", &json!({}), &json!({}), std::time::Duration::from_secs(60));
        assert!(bare["spec"]["template"]["spec"].get("nodeSelector").is_none());
    }

    #[test]
    fn views_read_the_spec() {
        let hc = HostedCluster(json!({
            "metadata": {"name": "demo", "namespace": "clusters", "uid": "u1"},
            "spec": {"etcd": {"managementType": "Managed"}, "platform": {"type": "None"},
                     "pullSecret": {"name": "demo-pull-secret"},
                     "secretEncryption": {"aescbc": {"activeKey": {"name": "demo-etcd-encryption-key"}}},
                     "sshKey": {"name": ""}}
        }));
        assert_eq!(hc.hcp_namespace(), "clusters-demo");
        assert_eq!(hc.availability_policy(), "HighlyAvailable");
        assert_eq!(hc.expected_etcd_members(), 3);
        assert_eq!(hc.referenced_secrets(), vec!["demo-etcd-encryption-key", "demo-pull-secret"]);
        assert_eq!(etcd_member_server_name("etcd-1", "clusters-demo"), "etcd-1.etcd-discovery.clusters-demo.svc");
    }

    #[test]
    fn paused_until_semantics() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-21T18:00:00Z").unwrap().to_utc();
        assert!(pauses(Some("true"), now));
        assert!(pauses(Some("True"), now));
        assert!(!pauses(Some("false"), now));
        assert!(pauses(Some("2026-11-21T18:30:00Z"), now));
        assert!(!pauses(Some("2026-11-21T17:30:00Z"), now));
        assert!(!pauses(None, now));
    }

    #[test]
    fn a_longer_pause_in_place_is_never_shortened() {
        let soon = "2026-11-24T12:00:00Z";
        assert_eq!(longest_pause(None, soon), soon);
        assert_eq!(longest_pause(Some("2026-11-24T11:00:00Z"), soon), soon, "an earlier deadline is extended");
        assert_eq!(longest_pause(Some("2036-11-24T12:00:00Z"), soon), "2036-11-24T12:00:00Z", "a fence's far deadline is kept");
        assert_eq!(longest_pause(Some("true"), soon), "true");
        assert_eq!(longest_pause(Some("not a time"), soon), soon, "an unreadable value is replaced");
    }

    #[test]
    fn hosted_cluster_groups() {
        for g in ["hypershift.openshift.io", "cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io", "capi-provider.agent-install.openshift.io", "bootstrap.cluster.x-k8s.io"] {
            assert!(exported_group(g), "{g}");
        }
        for g in ["", "apps", "route.openshift.io", "agent-install.openshift.io"] {
            assert!(!exported_group(g), "{g}");
        }
    }
}
