//! Untyped access to the management cluster: every controller here reads and
//! writes objects as JSON through `Api<DynamicObject>`, exactly as a client of a
//! real kube-apiserver would (no shortcut into the emulator).

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::OperatorError;

/// A resource type the operator touches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Res {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

impl Res {
    pub(crate) const fn new(
        group: &'static str,
        version: &'static str,
        kind: &'static str,
        plural: &'static str,
    ) -> Res {
        Res {
            group,
            version,
            kind,
            plural,
            namespaced: true,
        }
    }

    /// `apiVersion` as written in objects.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, self.version, self.kind),
            self.plural,
        )
    }
}

pub(crate) const NAMESPACE: Res = Res {
    namespaced: false,
    ..Res::new("", "v1", "Namespace", "namespaces")
};
pub(crate) const NODE: Res = Res {
    namespaced: false,
    ..Res::new("", "v1", "Node", "nodes")
};
pub(crate) const POD: Res = Res::new("", "v1", "Pod", "pods");
pub(crate) const PVC: Res = Res::new("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims");
pub(crate) const SECRET: Res = Res::new("", "v1", "Secret", "secrets");
pub(crate) const CONFIGMAP: Res = Res::new("", "v1", "ConfigMap", "configmaps");
pub(crate) const SERVICE: Res = Res::new("", "v1", "Service", "services");
pub(crate) const SERVICE_ACCOUNT: Res = Res::new("", "v1", "ServiceAccount", "serviceaccounts");
pub(crate) const DEPLOYMENT: Res = Res::new("apps", "v1", "Deployment", "deployments");
pub(crate) const STATEFULSET: Res = Res::new("apps", "v1", "StatefulSet", "statefulsets");
pub(crate) const ROUTE: Res = Res::new("route.openshift.io", "v1", "Route", "routes");
pub(crate) const EVENT: Res = Res::new("", "v1", "Event", "events");
pub(crate) const JOB: Res = Res::new("batch", "v1", "Job", "jobs");
pub(crate) const PV: Res = Res {
    namespaced: false,
    ..Res::new("", "v1", "PersistentVolume", "persistentvolumes")
};
pub(crate) const STORAGE_CLASS: Res = Res {
    namespaced: false,
    ..Res::new("storage.k8s.io", "v1", "StorageClass", "storageclasses")
};
pub(crate) const VOLUME_SNAPSHOT: Res =
    Res::new("snapshot.storage.k8s.io", "v1", "VolumeSnapshot", "volumesnapshots");
pub(crate) const VOLUME_SNAPSHOT_CLASS: Res = Res {
    namespaced: false,
    ..Res::new("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass", "volumesnapshotclasses")
};
pub(crate) const VOLUME_SNAPSHOT_CONTENT: Res = Res {
    namespaced: false,
    ..Res::new("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent", "volumesnapshotcontents")
};
pub(crate) const HOSTED_CLUSTER: Res = Res::new(
    "hypershift.openshift.io",
    "v1beta1",
    "HostedCluster",
    "hostedclusters",
);
pub(crate) const NODE_POOL: Res = Res::new(
    "hypershift.openshift.io",
    "v1beta1",
    "NodePool",
    "nodepools",
);
pub(crate) const HOSTED_CONTROL_PLANE: Res = Res::new(
    "hypershift.openshift.io",
    "v1beta1",
    "HostedControlPlane",
    "hostedcontrolplanes",
);
pub(crate) const CAPI_CLUSTER: Res = Res::new("cluster.x-k8s.io", "v1beta1", "Cluster", "clusters");
pub(crate) const MACHINE_DEPLOYMENT: Res = Res::new(
    "cluster.x-k8s.io",
    "v1beta1",
    "MachineDeployment",
    "machinedeployments",
);
pub(crate) const MACHINE_SET: Res =
    Res::new("cluster.x-k8s.io", "v1beta1", "MachineSet", "machinesets");
pub(crate) const MACHINE: Res = Res::new("cluster.x-k8s.io", "v1beta1", "Machine", "machines");
pub(crate) const AGENT_MACHINE: Res = Res::new(
    "capi-provider.agent-install.openshift.io",
    "v1beta1",
    "AgentMachine",
    "agentmachines",
);
pub(crate) const AGENT: Res = Res::new("agent-install.openshift.io", "v1beta1", "Agent", "agents");
pub(crate) const INFRA_ENV: Res =
    Res::new("agent-install.openshift.io", "v1beta1", "InfraEnv", "infraenvs");
pub(crate) const BARE_METAL_HOST: Res =
    Res::new("metal3.io", "v1alpha1", "BareMetalHost", "baremetalhosts");

/// Platform infrastructure kinds (`infrastructure.cluster.x-k8s.io` and the
/// agent provider group): (cluster, machine template, machine).
pub(crate) fn platform_kinds(platform: &str) -> Option<(Res, Res, Res)> {
    match platform {
        "AWS" => Some((
            Res::new(
                "infrastructure.cluster.x-k8s.io",
                "v1beta2",
                "AWSCluster",
                "awsclusters",
            ),
            Res::new(
                "infrastructure.cluster.x-k8s.io",
                "v1beta2",
                "AWSMachineTemplate",
                "awsmachinetemplates",
            ),
            Res::new(
                "infrastructure.cluster.x-k8s.io",
                "v1beta2",
                "AWSMachine",
                "awsmachines",
            ),
        )),
        "Agent" => Some((
            Res::new(
                "capi-provider.agent-install.openshift.io",
                "v1beta1",
                "AgentCluster",
                "agentclusters",
            ),
            Res::new(
                "capi-provider.agent-install.openshift.io",
                "v1beta1",
                "AgentMachineTemplate",
                "agentmachinetemplates",
            ),
            AGENT_MACHINE,
        )),
        "KubeVirt" => Some((
            Res::new(
                "infrastructure.cluster.x-k8s.io",
                "v1alpha1",
                "KubevirtCluster",
                "kubevirtclusters",
            ),
            Res::new(
                "infrastructure.cluster.x-k8s.io",
                "v1alpha1",
                "KubevirtMachineTemplate",
                "kubevirtmachinetemplates",
            ),
            Res::new(
                "infrastructure.cluster.x-k8s.io",
                "v1alpha1",
                "KubevirtMachine",
                "kubevirtmachines",
            ),
        )),
        _ => None,
    }
}

/// A thin JSON client over one cluster.
#[derive(Clone)]
pub(crate) struct Kube {
    client: kube::Client,
}

fn kube_err(action: String) -> impl FnOnce(kube::Error) -> OperatorError {
    move |source| OperatorError::Kube {
        action,
        source: Box::new(source),
    }
}

/// The HTTP status of an API error, if the error is one.
pub(crate) fn status_code(err: &OperatorError) -> Option<u16> {
    match err {
        OperatorError::Kube { source, .. } => match source.as_ref() {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        },
        _ => None,
    }
}

fn to_value(obj: DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

fn from_value(res: &Res, mut obj: Value) -> Result<DynamicObject, OperatorError> {
    if let Some(map) = obj.as_object_mut() {
        map.insert("apiVersion".into(), json!(res.api_version()));
        map.insert("kind".into(), json!(res.kind));
    }
    serde_json::from_value(obj).map_err(|e| OperatorError::Invalid {
        what: format!("{} object: {e}", res.kind),
    })
}

impl Kube {
    pub fn new(client: kube::Client) -> Kube {
        Kube { client }
    }

    fn api(&self, res: &Res, ns: Option<&str>) -> Api<DynamicObject> {
        let ar = res.api_resource();
        match (res.namespaced, ns) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        }
    }

    /// GET; `None` on 404.
    pub async fn get(
        &self,
        res: &Res,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, OperatorError> {
        let got = self
            .api(res, ns)
            .get_opt(name)
            .await
            .map_err(kube_err(format!(
                "getting {} {}/{name}",
                res.kind,
                ns.unwrap_or("")
            )))?;
        Ok(got.map(to_value))
    }

    /// LIST (all namespaces when `ns` is `None`), optionally with a label selector.
    pub async fn list(
        &self,
        res: &Res,
        ns: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Vec<Value>, OperatorError> {
        let mut lp = ListParams::default();
        if let Some(l) = labels {
            lp = lp.labels(l);
        }
        let list = self.api(res, ns).list(&lp).await.map_err(kube_err(format!(
            "listing {} in {}",
            res.plural,
            ns.unwrap_or("all namespaces")
        )))?;
        Ok(list.items.into_iter().map(to_value).collect())
    }

    /// POST.
    pub async fn create(
        &self,
        res: &Res,
        ns: Option<&str>,
        obj: Value,
    ) -> Result<Value, OperatorError> {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let dynobj = from_value(res, obj)?;
        let created = self
            .api(res, ns)
            .create(&PostParams::default(), &dynobj)
            .await
            .map_err(kube_err(format!(
                "creating {} {}/{name}",
                res.kind,
                ns.unwrap_or("")
            )))?;
        Ok(to_value(created))
    }

    /// POST unless it exists (409 is success); returns whether it was created.
    pub async fn create_if_absent(
        &self,
        res: &Res,
        ns: Option<&str>,
        obj: Value,
    ) -> Result<bool, OperatorError> {
        match self.create(res, ns, obj).await {
            Ok(_) => Ok(true),
            Err(e) if status_code(&e) == Some(409) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// JSON merge patch of the main resource.
    pub async fn merge(
        &self,
        res: &Res,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, OperatorError> {
        let out = self
            .api(res, ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(format!(
                "patching {} {}/{name}",
                res.kind,
                ns.unwrap_or("")
            )))?;
        Ok(to_value(out))
    }

    /// JSON merge patch of the `status` subresource.
    pub async fn merge_status(
        &self,
        res: &Res,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, OperatorError> {
        let out = self
            .api(res, ns)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(format!(
                "patching status of {} {}/{name}",
                res.kind,
                ns.unwrap_or("")
            )))?;
        Ok(to_value(out))
    }

    /// PUT of the `status` subresource with `obj` as read (its
    /// resourceVersion guards it: 409 if it changed). Unlike a merge patch,
    /// it can write an explicit `null` (a required, nullable field).
    pub async fn replace_status(&self, res: &Res, obj: &Value) -> Result<Value, OperatorError> {
        let (ns, name) = (ns_of(obj), name_of(obj));
        let ns = (!ns.is_empty()).then_some(ns);
        let body = from_value(res, obj.clone())?;
        let out = self
            .api(res, ns)
            .replace_status(name, &PostParams::default(), &body)
            .await
            .map_err(kube_err(format!("replacing status of {} {}/{name}", res.kind, ns.unwrap_or(""))))?;
        Ok(to_value(out))
    }

    /// LIST of a kind that may not be served (a CRD not installed): empty then.
    pub async fn list_if_served(&self, res: &Res, ns: Option<&str>) -> Result<Vec<Value>, OperatorError> {
        match self.list(res, ns, None).await {
            Err(e) if status_code(&e) == Some(404) => Ok(Vec::new()),
            other => other,
        }
    }

    /// Record a core/v1 Event about `obj` (of kind `res`) from `component`,
    /// once per distinct reason and message (later repeats are not counted).
    pub async fn event(
        &self,
        res: &Res,
        obj: &Value,
        warning: bool,
        reason: &str,
        message: &str,
        component: &str,
    ) -> Result<(), OperatorError> {
        let ns = match ns_of(obj) {
            "" => "default",
            ns => ns,
        };
        // recorded once: later passes do not ask the API server again
        static RECORDED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> = std::sync::OnceLock::new();
        let name = format!("{}.{}", name_of(obj), short_hash(&[uid_of(obj), reason, message], 16));
        let key = format!("{ns}/{name}");
        let recorded = RECORDED.get_or_init(Default::default);
        if recorded.lock().is_ok_and(|set| set.contains(&key)) {
            return Ok(());
        }
        let now = now();
        let event = json!({
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"apiVersion": res.api_version(), "kind": res.kind, "name": name_of(obj),
                "namespace": (!ns_of(obj).is_empty()).then(|| ns_of(obj)), "uid": uid_of(obj),
                "resourceVersion": obj.pointer("/metadata/resourceVersion").cloned()},
            "reason": reason, "message": message, "type": if warning { "Warning" } else { "Normal" },
            "source": {"component": component}, "reportingComponent": component, "reportingInstance": "",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        });
        self.create_if_absent(&EVENT, Some(ns), event).await?;
        if let Ok(mut set) = recorded.lock() {
            set.insert(key);
        }
        Ok(())
    }

    /// DELETE; `false` when it was already gone.
    pub async fn delete(
        &self,
        res: &Res,
        ns: Option<&str>,
        name: &str,
    ) -> Result<bool, OperatorError> {
        self.delete_params(res, ns, name, &DeleteParams::default())
            .await
    }

    /// DELETE with `gracePeriodSeconds`; `false` when it was already gone.
    pub async fn delete_with_grace(
        &self,
        res: &Res,
        ns: Option<&str>,
        name: &str,
        grace_seconds: u32,
    ) -> Result<bool, OperatorError> {
        self.delete_params(
            res,
            ns,
            name,
            &DeleteParams::default().grace_period(grace_seconds),
        )
        .await
    }

    async fn delete_params(
        &self,
        res: &Res,
        ns: Option<&str>,
        name: &str,
        dp: &DeleteParams,
    ) -> Result<bool, OperatorError> {
        match self.api(res, ns).delete(name, dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(source) => Err(OperatorError::Kube {
                action: format!("deleting {} {}/{name}", res.kind, ns.unwrap_or("")),
                source: Box::new(source),
            }),
        }
    }
}

/// `metadata.name`.
pub(crate) fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata.namespace`.
pub(crate) fn ns_of(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata.uid`.
pub(crate) fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A string at a JSON pointer.
pub(crate) fn str_at<'a>(obj: &'a Value, ptr: &str) -> Option<&'a str> {
    obj.pointer(ptr).and_then(Value::as_str)
}

/// Whether `metadata.deletionTimestamp` is set.
pub(crate) fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// A controller ownerReference to `owner` (which must carry apiVersion/kind).
pub(crate) fn owner_ref(res: &Res, owner: &Value) -> Value {
    json!({
        "apiVersion": res.api_version(),
        "kind": res.kind,
        "name": name_of(owner),
        "uid": uid_of(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// The controller ownerReference of `obj`: (kind, name, uid).
pub(crate) fn controller_of(obj: &Value) -> Option<(&str, &str, &str)> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find_map(|r| {
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                Some((
                    r.get("kind").and_then(Value::as_str).unwrap_or(""),
                    r.get("name").and_then(Value::as_str).unwrap_or(""),
                    r.get("uid").and_then(Value::as_str).unwrap_or(""),
                ))
            } else {
                None
            }
        })
}

/// `key=value,...` form of a `matchLabels` selector.
pub(crate) fn selector_string(selector: &Value) -> String {
    selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// RFC3339 "now" in the Kubernetes style (second precision, `Z`).
pub(crate) fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `status` with every condition's `observedGeneration` set to `obj`'s
/// `metadata.generation`, as HyperShift stamps the conditions it computes
/// from the spec it has seen.
pub(crate) fn observed(mut status: Value, obj: &Value) -> Value {
    let generation = obj.pointer("/metadata/generation").cloned().unwrap_or(json!(1));
    for c in status.pointer_mut("/conditions").and_then(Value::as_array_mut).into_iter().flatten() {
        c["observedGeneration"] = generation.clone();
    }
    status
}

/// Build a metav1.Condition, keeping `lastTransitionTime` from `previous`
/// when the status did not change.
pub(crate) fn condition(
    previous: Option<&Value>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> Value {
    let status_s = if status { "True" } else { "False" };
    let old = previous.and_then(|conds| conds.as_array()).and_then(|a| {
        a.iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
    });
    let ltt = match old {
        Some(c) if c.get("status").and_then(Value::as_str) == Some(status_s) => c
            .get("lastTransitionTime")
            .cloned()
            .unwrap_or_else(|| json!(now())),
        _ => json!(now()),
    };
    json!({"type": type_, "status": status_s, "reason": reason, "message": message, "lastTransitionTime": ltt})
}

/// Whether a condition of `type_` with status `True` is among `conds`.
pub(crate) fn condition_true(conds: Option<&Value>, type_: &str) -> bool {
    conds.and_then(Value::as_array).is_some_and(|a| {
        a.iter().any(|c| {
            c.get("type").and_then(Value::as_str) == Some(type_)
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
    })
}

/// A short stable hex digest of `parts`.
pub(crate) fn short_hash(parts: &[&str], len: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    hex[..len.min(hex.len())].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_strings_join_match_labels() {
        assert_eq!(
            selector_string(&json!({"matchLabels": {"a": "b", "c": "d"}})),
            "a=b,c=d"
        );
    }

    #[test]
    fn condition_keeps_transition_time_when_status_is_unchanged() {
        let prev = json!([{"type": "Available", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}]);
        let c = condition(Some(&prev), "Available", true, "AsExpected", "");
        assert_eq!(c["lastTransitionTime"], "2020-01-01T00:00:00Z");
        let c = condition(Some(&prev), "Available", false, "Down", "");
        assert_ne!(c["lastTransitionTime"], "2020-01-01T00:00:00Z");
        assert!(condition_true(Some(&prev), "Available"));
        assert!(!condition_true(Some(&prev), "Degraded"));
    }

    #[test]
    fn short_hash_is_stable_and_sized() {
        assert_eq!(short_hash(&["a", "b"], 10), short_hash(&["a", "b"], 10));
        assert_ne!(short_hash(&["a", "b"], 10), short_hash(&["ab"], 10));
        assert_eq!(short_hash(&["x"], 5).len(), 5);
    }
}
