//! Server-side defaulting and conversion of built-in kinds that clients
//! observe: `Secret.stringData` folded into `data`, replica counts, the
//! StatefulSet PVC retention policy, Service cluster IPs and ports.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::schema::FieldErrorKind;
use super::status::{ApiError, field_error};

fn obj_at<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v.get(key).is_some_and(Value::is_object) {
        v[key] = json!({});
    }
    match v.get_mut(key) {
        Some(Value::Object(m)) => m,
        _ => unreachable!("{key} was just made an object"),
    }
}

fn default_field(m: &mut Map<String, Value>, key: &str, value: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), value);
    }
}

/// Fold `stringData` into `data` and check that `data` values are base64, as
/// the API server's Secret decoding does.
fn secret(obj: &mut Value) -> Result<(), ApiError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if let Some(Value::Object(data)) = obj.get("data") {
        for (k, v) in data {
            let s = v.as_str().unwrap_or("");
            if base64::engine::general_purpose::STANDARD.decode(s).is_err() {
                return Err(ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data[{k}] of secret {name}"
                )));
            }
        }
    }
    if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|o| o.remove("stringData")) {
        let data = obj_at(obj, "data");
        for (k, v) in sd {
            let s = v.as_str().unwrap_or("").to_string();
            data.insert(
                k,
                json!(base64::engine::general_purpose::STANDARD.encode(s)),
            );
        }
    }
    if let Some(o) = obj.as_object_mut() {
        default_field(o, "type", json!("Opaque"));
    }
    Ok(())
}

fn service(obj: &mut Value, allocate_ip: &dyn Fn() -> String) {
    let spec = obj_at(obj, "spec");
    default_field(spec, "type", json!("ClusterIP"));
    default_field(spec, "sessionAffinity", json!("None"));
    let ip = match spec.get("clusterIP").and_then(Value::as_str) {
        Some(ip) if !ip.is_empty() => ip.to_string(),
        _ if spec.get("type").and_then(Value::as_str) == Some("ExternalName") => String::new(),
        _ => allocate_ip(),
    };
    if !ip.is_empty() {
        spec.insert("clusterIP".into(), json!(ip));
        default_field(spec, "clusterIPs", json!([ip]));
        default_field(spec, "ipFamilies", json!(["IPv4"]));
        default_field(spec, "ipFamilyPolicy", json!("SingleStack"));
        default_field(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    let kind = spec.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    let external = kind == "NodePort" || kind == "LoadBalancer";
    if external {
        default_field(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if kind == "LoadBalancer" {
        default_field(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    let node_ports = external && spec.get("allocateLoadBalancerNodePorts") != Some(&json!(false));
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if let Some(pm) = p.as_object_mut() {
                default_field(pm, "protocol", json!("TCP"));
                if let Some(port) = pm.get("port").cloned() {
                    default_field(pm, "targetPort", port);
                }
                // as the real allocator: a port of the 30000-32767 range
                if node_ports && pm.get("nodePort").and_then(Value::as_i64).unwrap_or(0) == 0 {
                    let b = uuid::Uuid::new_v4().into_bytes();
                    pm.insert("nodePort".into(), json!(30000 + (u16::from_be_bytes([b[0], b[1]]) % 2768)));
                }
            }
        }
    }
}

/// Defaults applied on create (and update) of built-in kinds. Service
/// cluster IPs come from `allocate_ip`.
pub(crate) fn apply(
    kind: &str,
    obj: &mut Value,
    allocate_ip: &dyn Fn() -> String,
) -> Result<(), ApiError> {
    match kind {
        "Secret" => secret(obj)?,
        "ConfigMap" => {}
        "Deployment" | "ReplicaSet" => {
            let spec = obj_at(obj, "spec");
            default_field(spec, "replicas", json!(1));
            default_field(spec, "revisionHistoryLimit", json!(10));
            if kind == "Deployment" {
                default_field(spec, "progressDeadlineSeconds", json!(600));
                default_field(
                    spec,
                    "strategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}),
                );
            }
        }
        "StatefulSet" => {
            let spec = obj_at(obj, "spec");
            default_field(spec, "replicas", json!(1));
            default_field(spec, "podManagementPolicy", json!("OrderedReady"));
            default_field(spec, "revisionHistoryLimit", json!(10));
            default_field(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            default_field(
                spec,
                "persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
        }
        "Service" => service(obj, allocate_ip),
        "Pod" => {
            let spec = obj_at(obj, "spec");
            default_field(spec, "restartPolicy", json!("Always"));
            default_field(spec, "terminationGracePeriodSeconds", json!(30));
            default_field(spec, "dnsPolicy", json!("ClusterFirst"));
            default_field(spec, "schedulerName", json!("default-scheduler"));
            default_field(spec, "serviceAccountName", json!("default"));
        }
        "PersistentVolumeClaim" => {
            let spec = obj_at(obj, "spec");
            default_field(spec, "volumeMode", json!("Filesystem"));
        }
        "Job" => job(obj),
        "StorageClass" => {
            if let Some(o) = obj.as_object_mut() {
                default_field(o, "reclaimPolicy", json!("Delete"));
                default_field(o, "volumeBindingMode", json!("Immediate"));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The QoS class the API server gives a pod at creation (`GetPodQOS`):
/// `BestEffort` without any cpu or memory request or limit, `Guaranteed`
/// when every container limits both and requests what it limits,
/// `Burstable` otherwise.
pub(crate) fn pod_qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .flat_map(|list| spec.get(*list).and_then(Value::as_array).into_iter().flatten())
        .collect();
    let get = |c: &Value, kind: &str, res: &str| c.pointer(&format!("/resources/{kind}/{res}")).filter(|v| !v.is_null()).cloned();
    let any = containers.iter().any(|c| {
        ["cpu", "memory"].iter().any(|r| get(c, "requests", r).is_some() || get(c, "limits", r).is_some())
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| match get(c, "limits", r) {
            Some(limit) => get(c, "requests", r).is_none_or(|req| req == limit),
            None => false,
        })
    });
    if guaranteed { "Guaranteed" } else { "Burstable" }
}

/// `SetDefaults_Job` (batch/v1): completions and parallelism 1 when both are
/// unset, backoffLimit 6, the other knobs' defaults, and the Job's labels
/// from its template's when it has none.
fn job(obj: &mut Value) {
    let template_labels = obj.pointer("/spec/template/metadata/labels").filter(|l| l.is_object()).cloned();
    let spec = obj_at(obj, "spec");
    let unset = |m: &Map<String, Value>, k: &str| m.get(k).is_none_or(Value::is_null);
    if unset(spec, "completions") && unset(spec, "parallelism") {
        spec.insert("completions".into(), json!(1));
    }
    default_field(spec, "parallelism", json!(1));
    let backoff = if unset(spec, "backoffLimitPerIndex") { 6 } else { i32::MAX };
    default_field(spec, "backoffLimit", json!(backoff));
    default_field(spec, "completionMode", json!("NonIndexed"));
    default_field(spec, "suspend", json!(false));
    default_field(spec, "manualSelector", json!(false));
    let replacement = if unset(spec, "podFailurePolicy") { "TerminatingOrFailed" } else { "Failed" };
    default_field(spec, "podReplacementPolicy", json!(replacement));
    let meta = obj_at(obj, "metadata");
    let no_labels = meta.get("labels").and_then(Value::as_object).is_none_or(Map::is_empty);
    if let (Some(labels), true) = (template_labels, no_labels) {
        meta.insert("labels".into(), labels);
    }
}

/// The `PrepareForCreate` steps of built-in kinds that run on create only
/// (after [`apply`], with `metadata.uid` assigned).
pub(crate) fn prepare_for_create(kind: &str, obj: &mut Value) {
    match kind {
        "PersistentVolumeClaim" => normalize_data_sources(obj),
        "Job" => generate_job_selector(obj),
        _ => {}
    }
}

/// `NormalizeDataSources`: `spec.dataSource` and `spec.dataSourceRef` get the
/// same contents when only one is given (not a cross-namespace
/// `dataSourceRef`).
fn normalize_data_sources(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let copy = |from: &Value| {
        let mut to = Map::new();
        for k in ["apiGroup", "kind", "name"] {
            if let Some(v) = from.get(k).filter(|v| !v.is_null()) {
                to.insert(k.into(), v.clone());
            }
        }
        Value::Object(to)
    };
    let set = |k: &str| spec.get(k).is_some_and(|v| !v.is_null());
    match (set("dataSource"), set("dataSourceRef")) {
        (true, false) => {
            let r = copy(&spec["dataSource"]);
            spec.insert("dataSourceRef".into(), r);
        }
        (false, true) => {
            let cross = spec["dataSourceRef"].get("namespace").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
            if !cross {
                let r = copy(&spec["dataSourceRef"]);
                spec.insert("dataSource".into(), r);
            }
        }
        _ => {}
    }
}

/// `generateSelector` of the Job strategy (unless `spec.manualSelector`):
/// the template gets `batch.kubernetes.io/job-name`, `job-name`,
/// `batch.kubernetes.io/controller-uid` and `controller-uid` (those not
/// set), and the selector matches `batch.kubernetes.io/controller-uid`.
fn generate_job_selector(obj: &mut Value) {
    if obj.pointer("/spec/manualSelector") == Some(&json!(true)) {
        return;
    }
    let name = obj.pointer("/metadata/name").cloned().unwrap_or(json!(""));
    let uid = obj.pointer("/metadata/uid").cloned().unwrap_or(json!(""));
    let spec = obj_at(obj, "spec");
    let template = spec.entry("template").or_insert_with(|| json!({}));
    let labels = obj_at(obj_at_value(template, "metadata"), "labels");
    for (key, value) in [
        ("job-name", &name),
        (JOB_NAME_LABEL, &name),
        ("controller-uid", &uid),
        (CONTROLLER_UID_LABEL, &uid),
    ] {
        labels.entry(key).or_insert_with(|| value.clone());
    }
    let spec = obj_at(obj, "spec");
    let selector = spec.entry("selector").or_insert_with(|| json!({}));
    if !selector.is_object() {
        *selector = json!({});
    }
    let match_labels = obj_at(selector, "matchLabels");
    match_labels.entry(CONTROLLER_UID_LABEL).or_insert(uid);
}

fn obj_at_value<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
    if !v.get(key).is_some_and(Value::is_object) {
        v[key] = json!({});
    }
    &mut v[key]
}

/// The label naming a Job on its pods (and `job-name`, its legacy twin).
pub(crate) const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// The label holding a Job's uid on its pods (and `controller-uid`).
pub(crate) const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";

/// Validate `metadata.labels` keys and values as upstream ObjectMeta validation does.
pub(crate) fn validate_labels(obj: &Value) -> Vec<super::schema::FieldError> {
    let mut errs = Vec::new();
    let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) else {
        return errs;
    };
    for (k, v) in labels {
        let (prefix, name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
            && name
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric());
        let prefix_ok = prefix.is_none_or(|p| super::validation::dns1123_subdomain(p).is_none());
        if !name_ok || !prefix_ok {
            errs.push(field_error(
                FieldErrorKind::Invalid,
                "metadata.labels",
                format!("Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
            ));
        }
        let val = v.as_str().unwrap_or("");
        let val_ok = val.is_empty()
            || (val.len() <= 63
                && val
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && val
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric())
                && val
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_ascii_alphanumeric()));
        if !val_ok || !v.is_string() {
            errs.push(field_error(
                FieldErrorKind::Invalid,
                "metadata.labels",
                format!("Invalid value: \"{val}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_string_data_is_folded_into_data() {
        let mut s =
            json!({"metadata": {"name": "x"}, "stringData": {"k": "v"}, "data": {"a": "eA=="}});
        apply("Secret", &mut s, &|| String::new()).expect("valid");
        assert_eq!(s["data"], json!({"a": "eA==", "k": "dg=="}));
        assert!(s.get("stringData").is_none());
        assert_eq!(s["type"], "Opaque");
        let mut bad = json!({"metadata": {"name": "x"}, "data": {"a": "%%%"}});
        assert_eq!(
            apply("Secret", &mut bad, &|| String::new())
                .expect_err("bad base64")
                .code,
            400
        );
    }

    #[test]
    fn statefulset_and_service_defaults() {
        let mut sts = json!({"spec": {}});
        apply("StatefulSet", &mut sts, &|| String::new()).expect("ok");
        assert_eq!(sts["spec"]["replicas"], 1);
        assert_eq!(
            sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"],
            "Retain"
        );
        let mut svc = json!({"spec": {"ports": [{"port": 2379}]}});
        apply("Service", &mut svc, &|| "172.30.0.10".to_string()).expect("ok");
        assert_eq!(svc["spec"]["clusterIP"], "172.30.0.10");
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], 2379);
        let mut headless = json!({"spec": {"clusterIP": "None"}});
        apply("Service", &mut headless, &|| "172.30.0.11".to_string()).expect("ok");
        assert_eq!(headless["spec"]["clusterIP"], "None");
    }

    #[test]
    fn label_validation() {
        assert!(validate_labels(&json!({"metadata": {"labels": {"app": "etcd", "hypershift.openshift.io/hosted-control-plane": "clusters-demo"}}})).is_empty());
        assert_eq!(
            validate_labels(&json!({"metadata": {"labels": {"app": "bad value"}}})).len(),
            1
        );
    }
}
