//! Decoding of built-in kinds through their typed definitions (k8s-openapi),
//! as a kube-apiserver decodes a request body into Go structs: type errors
//! are 400s and fields the type does not declare are "unknown fields"
//! (rejected with `fieldValidation=Strict`, warned about with `Warn`, dropped
//! in every case).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use k8s_openapi::api::{apps, batch, coordination, core, events, rbac, storage};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;

fn roundtrip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&t).map_err(|e| e.to_string())
}

/// The object as its Go type would re-encode it, or the decoding error.
/// `None` for kinds without a typed definition here (e.g. OpenShift Routes).
fn typed(group: &str, kind: &str, v: &Value) -> Option<Result<Value, String>> {
    Some(match (group, kind) {
        ("", "Namespace") => roundtrip::<core::v1::Namespace>(v),
        ("", "Secret") => roundtrip::<core::v1::Secret>(v),
        ("", "ConfigMap") => roundtrip::<core::v1::ConfigMap>(v),
        ("", "Service") => roundtrip::<core::v1::Service>(v),
        ("", "Endpoints") => roundtrip::<core::v1::Endpoints>(v),
        ("", "Pod") => roundtrip::<core::v1::Pod>(v),
        ("", "PersistentVolumeClaim") => roundtrip::<core::v1::PersistentVolumeClaim>(v),
        ("", "PersistentVolume") => roundtrip::<core::v1::PersistentVolume>(v),
        ("", "ServiceAccount") => roundtrip::<core::v1::ServiceAccount>(v),
        ("", "Event") => roundtrip::<core::v1::Event>(v),
        ("", "Node") => roundtrip::<core::v1::Node>(v),
        ("apps", "Deployment") => roundtrip::<apps::v1::Deployment>(v),
        ("apps", "StatefulSet") => roundtrip::<apps::v1::StatefulSet>(v),
        ("apps", "ReplicaSet") => roundtrip::<apps::v1::ReplicaSet>(v),
        ("coordination.k8s.io", "Lease") => roundtrip::<coordination::v1::Lease>(v),
        ("events.k8s.io", "Event") => roundtrip::<events::v1::Event>(v),
        ("batch", "Job") => roundtrip::<batch::v1::Job>(v),
        ("batch", "CronJob") => roundtrip::<batch::v1::CronJob>(v),
        ("storage.k8s.io", "StorageClass") => roundtrip::<storage::v1::StorageClass>(v),
        ("rbac.authorization.k8s.io", "Role") => roundtrip::<rbac::v1::Role>(v),
        ("rbac.authorization.k8s.io", "RoleBinding") => roundtrip::<rbac::v1::RoleBinding>(v),
        ("rbac.authorization.k8s.io", "ClusterRole") => roundtrip::<rbac::v1::ClusterRole>(v),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            roundtrip::<rbac::v1::ClusterRoleBinding>(v)
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            roundtrip::<apiext::CustomResourceDefinition>(v)
        }
        _ => return None,
    })
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// Paths (`spec.foo`, `spec.containers[0].bar`) present in `orig` but not in `rt`.
fn unknown_paths(orig: &Value, rt: &Value, path: &str, out: &mut Vec<String>) {
    match (orig, rt) {
        (Value::Object(o), Value::Object(r)) => {
            for (k, v) in o {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match r.get(k) {
                    Some(rv) => unknown_paths(v, rv, &p, out),
                    None if !is_empty(v) && !is_free_form(&p) => out.push(p),
                    None => {}
                }
            }
        }
        (Value::Array(o), Value::Array(r)) => {
            for (i, (a, b)) in o.iter().zip(r.iter()).enumerate() {
                unknown_paths(a, b, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Free-form maps whose keys a typed round-trip cannot lose anyway; kept as a guard.
fn is_free_form(path: &str) -> bool {
    path.starts_with("metadata.labels.") || path.starts_with("metadata.annotations.")
}

fn remove_path(v: &mut Value, path: &str) {
    // split "a.b[2].c" into segments
    let mut segs: Vec<(String, Option<usize>)> = Vec::new();
    for part in path.split('.') {
        let mut name = part;
        let mut idx = None;
        if let Some(open) = part.find('[') {
            name = &part[..open];
            idx = part[open + 1..].trim_end_matches(']').parse().ok();
        }
        segs.push((name.to_string(), idx));
    }
    let mut cur = v;
    for (i, (name, idx)) in segs.iter().enumerate() {
        let last = i == segs.len() - 1;
        if last && idx.is_none() {
            if let Some(o) = cur.as_object_mut() {
                o.remove(name);
            }
            return;
        }
        let Some(next) = cur.get_mut(name.as_str()) else {
            return;
        };
        cur = match idx {
            Some(n) => match next.get_mut(*n) {
                Some(x) => x,
                None => return,
            },
            None => next,
        };
    }
}

/// Why a built-in object cannot be decoded (400 for the caller).
#[derive(Debug, thiserror::Error)]
#[error("{kind} in version \"{version}\" cannot be handled as a {kind}: {message}")]
pub(crate) struct DecodeError {
    pub kind: String,
    pub version: String,
    pub message: String,
}

/// Decode `obj` as its built-in type; remove and return its unknown fields.
pub(crate) fn check_and_prune(
    group: &str,
    version: &str,
    kind: &str,
    obj: &mut Value,
) -> Result<Vec<String>, DecodeError> {
    let Some(res) = typed(group, kind, obj) else {
        return Ok(Vec::new());
    };
    let rt = res.map_err(|message| DecodeError {
        kind: kind.to_string(),
        version: version.to_string(),
        message,
    })?;
    let mut paths = Vec::new();
    unknown_paths(obj, &rt, "", &mut paths);
    for p in &paths {
        remove_path(obj, p);
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_found_and_removed() {
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "labels": {"a": "b"}},
            "spec": {"replicas": 1, "bogus": 1, "selector": {"matchLabels": {"a": "b"}},
                "template": {"spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicyy": "Always"}]}}}});
        let paths = check_and_prune("apps", "v1", "Deployment", &mut d).expect("decodes");
        assert_eq!(
            paths,
            vec![
                "spec.bogus".to_string(),
                "spec.template.spec.containers[0].imagePullPolicyy".to_string()
            ]
        );
        assert!(d["spec"].get("bogus").is_none());
        assert!(
            d["spec"]["template"]["spec"]["containers"][0]
                .get("imagePullPolicyy")
                .is_none()
        );
        assert_eq!(d["metadata"]["labels"]["a"], "b");
    }

    #[test]
    fn type_errors_are_decode_errors() {
        let mut d = json!({"metadata": {"name": "x"}, "spec": {"replicas": "three"}});
        let e = check_and_prune("apps", "v1", "Deployment", &mut d).expect_err("type error");
        assert!(
            e.to_string()
                .starts_with("Deployment in version \"v1\" cannot be handled as a Deployment: "),
            "{e}"
        );
    }

    #[test]
    fn clean_objects_round_trip_without_findings() {
        let mut s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", "namespace": "n"}, "type": "Opaque", "data": {"k": "dg=="}, "immutable": true});
        assert!(
            check_and_prune("", "v1", "Secret", &mut s)
                .expect("decodes")
                .is_empty()
        );
        let mut sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "etcd"},
            "spec": {"serviceName": "etcd-discovery", "replicas": 3, "selector": {"matchLabels": {"app": "etcd"}},
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Gi"}}}}],
                "template": {"metadata": {"labels": {"app": "etcd"}}, "spec": {"containers": [{"name": "etcd", "image": "etcd",
                    "ports": [{"containerPort": 2379, "name": "client", "protocol": "TCP"}]}]}}},
            "status": {}});
        assert_eq!(
            check_and_prune("apps", "v1", "StatefulSet", &mut sts).expect("decodes"),
            Vec::<String>::new()
        );
    }
}
