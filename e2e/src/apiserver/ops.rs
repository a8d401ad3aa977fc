//! The object operations behind the verbs: get, list, create, update, patch,
//! delete and scale, with the metadata rules of a real API server.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::resources::{CRD_GROUP, CRD_RESOURCE, ResourceType, crd_types};
use super::schema::FieldErrorKind;
use super::selector::{FieldSelector, LabelSelector};
use super::status::{ApiError, field_error, qualified};
use super::store::{StoreError, Stored, set_rv};
use super::{ApiServerError, Inner, defaults, patch, typed, validation};

/// The finalizer an owner carries during Foreground deletion.
pub(crate) const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// The finalizer a CRD carries until its objects are gone.
pub(crate) const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Which part of an object a write targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sub {
    Main,
    Status,
}

/// The `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

/// Options common to writes.
#[derive(Debug, Clone)]
pub(crate) struct WriteOpts {
    pub dry_run: bool,
    pub manager: String,
    pub validation: FieldValidation,
}

impl WriteOpts {
    pub(crate) fn internal() -> WriteOpts {
        WriteOpts {
            dry_run: false,
            manager: "kube-apiserver".into(),
            validation: FieldValidation::Ignore,
        }
    }
}

/// The result of a write.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub obj: Value,
    pub warnings: Vec<String>,
}

/// `DeleteOptions` (body or query).
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOpts {
    pub dry_run: bool,
    pub propagation: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// The patch content types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply { force: bool },
}

/// List parameters.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListQuery {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: i64,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub exact: bool,
}

pub(crate) fn now_ts() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(crate) fn store_err(e: StoreError) -> ApiError {
    match e {
        StoreError::Compacted(rev) => ApiError::gone(format!("too old resource version: {rev}")),
        StoreError::Timeout(_) => ApiError::new(504, "Timeout", "Timeout: request did not complete within requested timeout - context deadline exceeded")
            .with_details(json!({})),
        other => ApiError::internal(other.to_string()),
    }
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object)
        && let Some(o) = obj.as_object_mut()
    {
        o.insert("metadata".into(), Value::Object(Map::new()));
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn is_deleting(obj: &Value) -> bool {
    meta(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|v| !v.is_null())
}

/// Everything but metadata and status: what `metadata.generation` tracks.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    o
}

/// `.spec.replicas` -> JSON pointer `/spec/replicas`.
pub(crate) fn json_path_pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .map(|s| format!("/{s}"))
        .collect()
}

fn set_at(obj: &mut Value, path: &str, value: Value) {
    let parts: Vec<&str> = path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect();
    let mut cur = obj;
    for (i, p) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Some(o) = cur.as_object_mut() else { return };
        if i == parts.len() - 1 {
            o.insert(p.to_string(), value);
            return;
        }
        cur = o
            .entry(p.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

/// A Service cluster IP from 172.30.0.0/16 (the OpenShift default service network).
fn allocate_cluster_ip() -> String {
    let b = uuid::Uuid::new_v4().into_bytes();
    format!("172.30.{}.{}", b[0], 2 + (b[1] % 250))
}

const GENERATE_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn generate_suffix() -> String {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes
        .iter()
        .take(5)
        .map(|b| GENERATE_CHARS[(*b as usize) % GENERATE_CHARS.len()] as char)
        .collect()
}

fn touch_managed_fields(
    obj: &mut Value,
    manager: &str,
    operation: &str,
    api_version: &str,
    sub: Sub,
) {
    let m = meta_mut(obj);
    let entry = m
        .entry("managedFields")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !entry.is_array() {
        *entry = Value::Array(Vec::new());
    }
    let Some(list) = entry.as_array_mut() else {
        return;
    };
    let subresource = if sub == Sub::Status {
        Some("status")
    } else {
        None
    };
    let found = list.iter_mut().find(|e| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some(operation)
            && e.get("subresource").and_then(Value::as_str) == subresource
    });
    match found {
        Some(e) => {
            e["time"] = json!(now_ts());
        }
        None => {
            let mut e = json!({"manager": manager, "operation": operation, "apiVersion": api_version,
                "time": now_ts(), "fieldsType": "FieldsV1", "fieldsV1": {}});
            if let Some(s) = subresource {
                e["subresource"] = json!(s);
            }
            list.push(e);
        }
    }
}

/// `status.acceptedNames` and conditions of a CRD, as the CRD controllers set them.
fn crd_status(crd: &Value, old_status: Option<&Value>) -> Value {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let mut accepted = names.clone();
    if let Some(o) = accepted.as_object_mut() {
        if !o.contains_key("singular") {
            let k = names
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_lowercase();
            o.insert("singular".into(), json!(k));
        }
        if !o.contains_key("listKind") {
            let k = names.get("kind").and_then(Value::as_str).unwrap_or("");
            o.insert("listKind".into(), json!(format!("{k}List")));
        }
    }
    let storage: Vec<String> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut stored: Vec<String> = old_status
        .and_then(|s| s.get("storedVersions"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for s in storage {
        if !stored.contains(&s) {
            stored.push(s);
        }
    }
    let conditions = old_status.and_then(|s| s.get("conditions")).cloned().unwrap_or_else(|| {
        let t = now_ts();
        json!([
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": t, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": t, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}
        ])
    });
    json!({"conditions": conditions, "acceptedNames": accepted, "storedVersions": stored})
}

fn crd_invalid(name: &str, e: &super::resources::CrdError) -> ApiError {
    let (field, detail) = match e.to_string().split_once(": ") {
        Some((f, d)) => (f.to_string(), d.to_string()),
        None => ("spec".to_string(), e.to_string()),
    };
    ApiError::invalid(
        CRD_GROUP,
        "CustomResourceDefinition",
        name,
        &[field_error(FieldErrorKind::Invalid, &field, detail)],
    )
}

fn normalize_pruned(p: &str) -> String {
    p.trim_start_matches('.').to_string()
}

impl Inner {
    pub(crate) fn resolve(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceType>> {
        self.registry().get(group, version, plural)
    }

    /// The object as served for `rt`'s version: apiVersion/kind set, CR defaults applied.
    pub(crate) fn to_client(&self, rt: &ResourceType, mut obj: Value) -> Value {
        if rt.custom.is_some()
            && let Some(stored) = obj.get("apiVersion").and_then(Value::as_str).map(str::to_string)
        {
            super::conversion::convert(&rt.group, &rt.kind, &stored, &rt.api_version(), &mut obj);
        }
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), json!(rt.api_version()));
            o.insert("kind".into(), json!(rt.kind));
        }
        if let Some(schema) = rt.custom.as_ref().and_then(|c| c.schema.as_ref()) {
            schema.apply_defaults(&mut obj);
        }
        obj
    }

    pub(crate) async fn get_stored(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Stored, ApiError> {
        let key = self.store.key(rt, ns, name);
        self.store
            .get(&key)
            .await
            .map_err(store_err)?
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    pub(crate) async fn get_object(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let s = self.get_stored(rt, ns, name).await?;
        Ok(self.to_client(rt, s.obj))
    }

    /// List objects; returns (items, list resourceVersion, continue token).
    pub(crate) async fn list_objects(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        q: &ListQuery,
    ) -> Result<(Vec<Value>, i64, Option<String>), ApiError> {
        let prefix = self.store.collection_prefix(rt, ns);
        let (mut start, mut revision) = match &q.continue_token {
            Some(tok) => {
                let bad = || {
                    ApiError::bad_request(
                        "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
                    )
                };
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(tok)
                    .map_err(|_| bad())?;
                let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
                let rv = v.get("rv").and_then(Value::as_i64).ok_or_else(bad)?;
                let s = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
                (Some(format!("{prefix}{s}")), rv)
            }
            None => {
                let rev = match (&q.resource_version, q.exact) {
                    (Some(rv), true) => rv.parse::<i64>().map_err(|_| {
                        ApiError::bad_request(format!("invalid resource version \"{rv}\""))
                    })?,
                    _ => 0,
                };
                (None, rev)
            }
        };
        let mut items = Vec::new();
        let pinned = q.fields.pinned_name().map(str::to_string);
        loop {
            let want = if q.limit > 0 {
                q.limit - items.len() as i64
            } else {
                0
            };
            let page = match self
                .store
                .range(&prefix, start.as_deref(), want, revision)
                .await
            {
                Ok(p) => p,
                Err(StoreError::Compacted(_)) if q.continue_token.is_some() => {
                    return Err(ApiError::gone(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    ));
                }
                Err(e) => return Err(store_err(e)),
            };
            if revision == 0 {
                revision = page.revision;
            }
            let last_key = page.items.last().map(|s| s.key.clone());
            for s in page.items {
                // a namespaced collection prefix `<res>/` also covers keys of other namespaces;
                // names never contain '/', so skip deeper keys only for cluster-scoped types.
                let rest = &s.key[prefix.len()..];
                if !rt.namespaced && rest.contains('/') {
                    continue;
                }
                if let Some(n) = &pinned
                    && meta_str(&s.obj, "name") != n
                {
                    continue;
                }
                let obj = self.to_client(rt, s.obj);
                if q.labels.matches(&obj) && q.fields.matches(&obj, &rt.kind, rt.is_builtin()) {
                    items.push(obj);
                }
            }
            match (page.more, last_key) {
                (true, Some(k)) => {
                    let next = format!("{k}\0");
                    if q.limit > 0 && items.len() as i64 >= q.limit {
                        let tok = json!({"v": "meta.k8s.io/v1", "rv": revision, "start": &next[prefix.len()..]});
                        let tok = base64::engine::general_purpose::STANDARD.encode(tok.to_string());
                        return Ok((items, revision, Some(tok)));
                    }
                    start = Some(next);
                }
                _ => return Ok((items, revision, None)),
            }
        }
    }

    /// The `Priority` admission plugin: a pod's `spec.priorityClassName`
    /// must name a PriorityClass (the two `system-*-critical` classes a real
    /// API server creates at start are built in here), whose value becomes
    /// `spec.priority` (with its `preemptionPolicy`); without a name, the
    /// global default class's, else 0. A pod that sets another priority
    /// itself is refused, as upstream.
    async fn admit_priority(&self, pod: &mut Value, name: &str) -> Result<(), ApiError> {
        const BUILT_IN: [(&str, i64); 2] = [("system-node-critical", 2_000_001_000), ("system-cluster-critical", 2_000_000_000)];
        let prefix = self.registry().get("scheduling.k8s.io", "v1", "priorityclasses").map(|rt| self.store.collection_prefix(&rt, None));
        let classes = match prefix {
            Some(prefix) => self.store.list_all(&prefix).await.map_err(store_err)?.items,
            None => Vec::new(),
        };
        let wanted = pod.pointer("/spec/priorityClassName").and_then(Value::as_str).unwrap_or_default().to_string();
        let (value, policy) = if wanted.is_empty() {
            match classes.iter().find(|c| c.obj.get("globalDefault") == Some(&json!(true))) {
                Some(c) => (c.obj["value"].as_i64().unwrap_or(0), c.obj["preemptionPolicy"].as_str().map(str::to_string)),
                None => (0, None),
            }
        } else if let Some((_, v)) = BUILT_IN.iter().find(|(n, _)| *n == wanted) {
            (*v, None)
        } else {
            match classes.iter().find(|c| meta_str(&c.obj, "name") == wanted) {
                Some(c) => (c.obj["value"].as_i64().unwrap_or(0), c.obj["preemptionPolicy"].as_str().map(str::to_string)),
                None => {
                    return Err(ApiError::forbidden(format!(
                        "pods \"{name}\" is forbidden: no PriorityClass with name {wanted} was found"
                    )));
                }
            }
        };
        if let Some(given) = pod.pointer("/spec/priority").and_then(Value::as_i64)
            && given != value
        {
            return Err(ApiError::forbidden(format!(
                "pods \"{name}\" is forbidden: the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {value} from the given PriorityClass name"
            )));
        }
        if !pod.get("spec").is_some_and(Value::is_object) {
            pod["spec"] = json!({});
        }
        pod["spec"]["priority"] = json!(value);
        pod["spec"]["preemptionPolicy"] = json!(policy.unwrap_or_else(|| "PreemptLowerPriority".into()));
        Ok(())
    }

    /// The `DefaultStorageClass` admission plugin: a claim created without
    /// `spec.storageClassName` (absent or null; `""` asks for no class) gets
    /// the default StorageClass, the newest when several are marked
    /// `storageclass.kubernetes.io/is-default-class: "true"`.
    async fn default_storage_class(&self, claim: &mut Value) -> Result<(), ApiError> {
        if claim.pointer("/spec/storageClassName").is_some_and(|v| !v.is_null()) {
            return Ok(());
        }
        let Some(rt) = self.registry().get("storage.k8s.io", "v1", "storageclasses") else {
            return Ok(());
        };
        let page = self
            .store
            .list_all(&self.store.collection_prefix(&rt, None))
            .await
            .map_err(store_err)?;
        let default = page
            .items
            .iter()
            .filter(|s| {
                s.obj
                    .pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                    .and_then(Value::as_str)
                    == Some("true")
            })
            .max_by(|a, b| {
                meta_str(&a.obj, "creationTimestamp")
                    .cmp(meta_str(&b.obj, "creationTimestamp"))
                    .then_with(|| meta_str(&b.obj, "name").cmp(meta_str(&a.obj, "name")))
            });
        if let Some(class) = default {
            if !claim.get("spec").is_some_and(Value::is_object) {
                claim["spec"] = json!({});
            }
            claim["spec"]["storageClassName"] = json!(meta_str(&class.obj, "name"));
        }
        Ok(())
    }

    async fn check_namespace_for_create(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let Some(ns_rt) = self.resolve("", "v1", "namespaces") else {
            return Ok(());
        };
        match self
            .store
            .get(&self.store.key(&ns_rt, None, ns))
            .await
            .map_err(store_err)?
        {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(s) => {
                let terminating = is_deleting(&s.obj)
                    || s.obj.pointer("/status/phase").and_then(Value::as_str)
                        == Some("Terminating");
                if terminating {
                    Err(ApiError::forbidden(format!(
                        "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        qualified(&rt.group, &rt.plural)
                    ))
                    .with_details(json!({"name": name, "group": rt.group, "kind": rt.plural,
                        "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]})))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Defaulting, pruning and validation of a custom resource.
    fn custom_checks(
        &self,
        rt: &ResourceType,
        obj: &mut Value,
        old: Option<&Value>,
        o: &WriteOpts,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let Some(schema) = rt.custom.as_ref().and_then(|c| c.schema.as_ref()) else {
            return Ok(());
        };
        let name = meta_str(obj, "name").to_string();
        let pruned = schema.prune(obj);
        if !pruned.is_empty() {
            match o.validation {
                FieldValidation::Strict => {
                    let msgs: Vec<String> = pruned
                        .iter()
                        .map(|p| format!("unknown field \"{}\"", normalize_pruned(p)))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                        rt.kind,
                        rt.version,
                        rt.kind,
                        msgs.join(", ")
                    )));
                }
                FieldValidation::Warn => {
                    warnings.extend(
                        pruned
                            .iter()
                            .map(|p| format!("unknown field \"{}\"", normalize_pruned(p))),
                    );
                }
                FieldValidation::Ignore => {}
            }
        }
        schema.apply_defaults(obj);
        let errs = match old {
            None => schema.validate_create(obj),
            Some(old) => schema.validate_update(old, obj),
        };
        if !errs.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, &errs));
        }
        Ok(())
    }

    /// Create an object (POST).
    pub(crate) async fn create(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        mut obj: Value,
        o: &WriteOpts,
    ) -> Result<Outcome, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was not a JSON object",
            ));
        }
        if let Some(k) = obj.get("kind").and_then(Value::as_str)
            && k != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind of the object ({k}) does not match the kind of the resource ({})",
                rt.kind
            )));
        }
        let mut warnings = Vec::new();
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), json!(rt.api_version()));
            o.insert("kind".into(), json!(rt.kind));
        }
        typed_checks(rt, &mut obj, o, &mut warnings)?;
        let m = meta_mut(&mut obj);
        if rt.namespaced {
            let body_ns = m.get("namespace").and_then(Value::as_str).unwrap_or("");
            let ns = ns.unwrap_or("");
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        if m.get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        m.remove("resourceVersion");
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            match m.get("generateName").and_then(Value::as_str) {
                Some(g) if !g.is_empty() => {
                    let base: String = g.chars().take(58).collect();
                    name = format!("{base}{}", generate_suffix());
                    m.insert("name".into(), json!(name));
                }
                _ => {
                    return Err(ApiError::invalid(
                        &rt.group,
                        &rt.kind,
                        "",
                        &[field_error(
                            FieldErrorKind::Required,
                            "metadata.name",
                            "Required value: name or generateName is required",
                        )],
                    ));
                }
            }
        }
        m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        m.insert("creationTimestamp".into(), json!(now_ts()));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        if rt.generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        let mut errs = validation::validate_name(&rt.kind, &name);
        errs.extend(defaults::validate_labels(&obj));
        if !errs.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, &errs));
        }
        if let (true, Some(ns)) = (rt.namespaced, ns) {
            self.check_namespace_for_create(rt, ns, &name).await?;
        }
        if let Some(c) = &rt.custom {
            self.check_crd_not_terminating(&c.crd_name).await?;
        }
        if rt.is_builtin() {
            defaults::apply(&rt.kind, &mut obj, &allocate_cluster_ip)?;
            defaults::prepare_for_create(&rt.kind, &mut obj);
            if rt.group.is_empty() && rt.kind == "PersistentVolumeClaim" {
                self.default_storage_class(&mut obj).await?;
            }
            if rt.group.is_empty() && rt.kind == "Pod" {
                self.admit_priority(&mut obj, &name).await?;
            }
            let errs = validation::validate_builtin(&rt.kind, &obj);
            if !errs.is_empty() {
                return Err(ApiError::invalid(&rt.group, &rt.kind, &name, &errs));
            }
        }
        // status: writes through the main resource cannot set it (as upstream PrepareForCreate)
        if rt.status_subresource
            && rt.kind != "Node"
            && let Some(o) = obj.as_object_mut()
        {
            o.remove("status");
            match rt.kind.as_str() {
                "Pod" => {
                    let qos = defaults::pod_qos_class(o.get("spec").unwrap_or(&Value::Null));
                    o.insert("status".into(), json!({"phase": "Pending", "qosClass": qos}));
                }
                "PersistentVolumeClaim" | "PersistentVolume" => {
                    o.insert("status".into(), json!({"phase": "Pending"}));
                }
                "Namespace" => {
                    o.insert("status".into(), json!({"phase": "Active"}));
                }
                "CustomResourceDefinition" => {}
                _ if rt.is_builtin() => {
                    o.insert("status".into(), json!({}));
                }
                _ => {}
            }
        }
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "namespaces") => {
                if !obj.get("spec").is_some_and(Value::is_object) {
                    obj["spec"] = json!({});
                }
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
            }
            (CRD_GROUP, CRD_RESOURCE) => {
                crd_types(&obj).map_err(|e| crd_invalid(&name, &e))?;
                let st = crd_status(&obj, None);
                obj["status"] = st;
                let m = meta_mut(&mut obj);
                let fins = m.entry("finalizers").or_insert_with(|| json!([]));
                if let Some(a) = fins.as_array_mut()
                    && !a.iter().any(|f| f == CRD_CLEANUP_FINALIZER)
                {
                    a.push(json!(CRD_CLEANUP_FINALIZER));
                }
            }
            _ => {}
        }
        if !rt.is_builtin() {
            self.custom_checks(rt, &mut obj, None, o, &mut warnings)?;
        }
        touch_managed_fields(&mut obj, &o.manager, "Update", &rt.api_version(), Sub::Main);
        if o.dry_run {
            return Ok(Outcome { obj, warnings });
        }
        let key = self.store.key(rt, ns, &name);
        let rev = self
            .store
            .create(&key, &obj)
            .await
            .map_err(store_err)?
            .ok_or_else(|| ApiError::already_exists(&rt.group, &rt.plural, &name))?;
        set_rv(&mut obj, rev);
        if rt.group == CRD_GROUP && rt.plural == CRD_RESOURCE {
            self.register_crd_object(&obj);
        }
        Ok(Outcome { obj, warnings })
    }

    /// Create an object from a server-side apply on an absent object.
    async fn create_from_apply(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        obj: Value,
        o: &WriteOpts,
    ) -> Result<Outcome, ApiError> {
        let mut out = self.create(rt, ns, obj, o).await?;
        // keep the managedFields set by the apply
        if let Some(m) = out.obj.get_mut("metadata").and_then(Value::as_object_mut)
            && let Some(list) = m.get_mut("managedFields").and_then(Value::as_array_mut)
        {
            list.retain(|e| {
                !(e.get("operation").and_then(Value::as_str) == Some("Update")
                    && e.get("manager").and_then(Value::as_str) == Some(o.manager.as_str())
                    && e.get("fieldsV1") == Some(&json!({})))
            });
        }
        Ok(out)
    }

    pub(crate) fn register_crd_object(&self, crd: &Value) {
        let name = meta_str(crd, "name").to_string();
        match crd_types(crd) {
            Ok((types, preferred)) => {
                for t in &types {
                    let skipped = t
                        .custom
                        .as_ref()
                        .and_then(|c| c.schema.as_ref())
                        .map(|s| s.skipped_rules())
                        .unwrap_or_default();
                    if !skipped.is_empty() {
                        tracing::warn!(crd = %name, version = %t.version, rules = ?skipped, "CEL rules not enforced by the emulator");
                    }
                }
                self.registry_mut().register_crd(&name, types, preferred)
            }
            Err(e) => tracing::warn!(crd = %name, error = %e, "stored CRD not served"),
        }
    }

    /// Load the CRDs already stored in etcd (a restarted server).
    pub(crate) async fn load_stored_crds(&self) -> Result<(), ApiServerError> {
        let Some(rt) = self.resolve(CRD_GROUP, "v1", CRD_RESOURCE) else {
            return Ok(());
        };
        let page = self
            .store
            .list_all(&self.store.collection_prefix(&rt, None))
            .await
            .map_err(ApiServerError::Store)?;
        for s in page.items {
            self.register_crd_object(&s.obj);
        }
        Ok(())
    }

    /// 405 while the CRD of a custom resource is being deleted, as upstream.
    async fn check_crd_not_terminating(&self, crd_name: &str) -> Result<(), ApiError> {
        let Some(crd_rt) = self.resolve(CRD_GROUP, "v1", CRD_RESOURCE) else {
            return Ok(());
        };
        match self
            .store
            .get(&self.store.key(&crd_rt, None, crd_name))
            .await
            .map_err(store_err)?
        {
            Some(s) if is_deleting(&s.obj) => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "create not allowed while custom resource definition is terminating",
            )
            .with_details(json!({}))),
            _ => Ok(()),
        }
    }

    /// Create `default`, `kube-system`, `kube-public` and `kube-node-lease` when
    /// absent, as a kube-apiserver does at start.
    pub(crate) async fn ensure_system_namespaces(&self) -> Result<(), ApiError> {
        let rt = self
            .resolve("", "v1", "namespaces")
            .ok_or_else(|| ApiError::internal("namespaces not registered"))?;
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            match self.create(&rt, None, obj, &WriteOpts::internal()).await {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Create a CRD, or update an existing one to this content (start-up CRD files).
    pub(crate) async fn apply_crd(&self, doc: Value) -> Result<(), ApiError> {
        let rt = self
            .resolve(CRD_GROUP, "v1", CRD_RESOURCE)
            .ok_or_else(|| ApiError::internal("CustomResourceDefinition type not registered"))?;
        let name = meta_str(&doc, "name").to_string();
        match self.get_stored(&rt, None, &name).await {
            Err(e) if e.code == 404 => self
                .create(&rt, None, doc, &WriteOpts::internal())
                .await
                .map(|_| ()),
            Err(e) => Err(e),
            Ok(cur) => {
                let mut new = doc;
                set_rv(&mut new, cur.mod_revision);
                self.commit_update(&rt, &cur, new, Sub::Main, &WriteOpts::internal())
                    .await
                    .map(|_| ())
            }
        }
    }

    /// Replace an object (PUT) on the main resource or `/status`.
    pub(crate) async fn update(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        body: Value,
        sub: Sub,
        o: &WriteOpts,
    ) -> Result<Outcome, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was not a JSON object",
            ));
        }
        let body_name = meta_str(&body, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_ns = meta_str(&body, "namespace");
        if rt.namespaced && !body_ns.is_empty() && Some(body_ns) != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let rv = meta_str(&body, "resourceVersion").to_string();
        if rv.is_empty() && !rt.is_builtin() {
            return Err(ApiError::invalid(
                &rt.group,
                &rt.kind,
                name,
                &[field_error(
                    FieldErrorKind::Invalid,
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update",
                )],
            ));
        }
        loop {
            let cur = self.get_stored(rt, ns, name).await?;
            let mut new = body.clone();
            if rv.is_empty() {
                set_rv(&mut new, cur.mod_revision);
            }
            match self.commit_update(rt, &cur, new, sub, o).await {
                Err(e) if e.code == 409 && rv.is_empty() && e.reason == "Conflict" => continue,
                r => return r,
            }
        }
    }

    /// Validate and store `new` as the next version of `cur`. `new`'s
    /// resourceVersion must match `cur` (409 otherwise).
    pub(crate) async fn commit_update(
        &self,
        rt: &Arc<ResourceType>,
        cur: &Stored,
        mut new: Value,
        sub: Sub,
        o: &WriteOpts,
    ) -> Result<Outcome, ApiError> {
        let old = &cur.obj;
        let name_owned = meta_str(old, "name").to_string();
        let name = name_owned.as_str();
        let ns_owned = rt
            .namespaced
            .then(|| meta_str(old, "namespace").to_string());
        let ns = ns_owned.as_deref();
        let mut warnings = Vec::new();
        let rv = meta_str(&new, "resourceVersion").to_string();
        if !rv.is_empty() && rv != cur.mod_revision.to_string() {
            return Err(ApiError::conflict(&rt.group, &rt.plural, name));
        }
        let (new_uid, old_uid) = (meta_str(&new, "uid"), meta_str(old, "uid"));
        if !new_uid.is_empty() && new_uid != old_uid {
            return Err(ApiError::conflict_msg(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        if let Some(k) = new.get("kind").and_then(Value::as_str)
            && k != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind of the object ({k}) does not match the kind of the resource ({})",
                rt.kind
            )));
        }
        if sub == Sub::Status {
            let status = new.get("status").cloned();
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        } else if rt.status_subresource
            && let Some(o) = new.as_object_mut()
        {
            match old.get("status") {
                Some(s) => o.insert("status".into(), s.clone()),
                None => o.remove("status"),
            };
        }
        if let Some(obj) = new.as_object_mut() {
            obj.insert("apiVersion".into(), json!(rt.api_version()));
            obj.insert("kind".into(), json!(rt.kind));
        }
        typed_checks(rt, &mut new, o, &mut warnings)?;
        let old_meta = meta(old).cloned().unwrap_or_default();
        {
            let m = meta_mut(&mut new);
            m.insert("name".into(), json!(name));
            match ns {
                Some(ns) if rt.namespaced => {
                    m.insert("namespace".into(), json!(ns));
                }
                _ => {
                    m.remove("namespace");
                }
            }
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(f) {
                    Some(v) => m.insert(f.into(), v.clone()),
                    None => m.remove(f),
                };
            }
            m.remove("resourceVersion");
        }
        if is_deleting(old) {
            let old_f = finalizers(old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !old_f.contains(f))
                .collect();
            if !added.is_empty() {
                let list = added
                    .iter()
                    .map(|f| format!("\"{f}\""))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    name,
                    &[field_error(
                        FieldErrorKind::Forbidden,
                        "metadata.finalizers",
                        format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{list}}}"
                        ),
                    )],
                ));
            }
        }
        let label_errs = defaults::validate_labels(&new);
        if !label_errs.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, name, &label_errs));
        }
        if rt.is_builtin() {
            if sub == Sub::Status && rt.kind == "Pod" {
                // ValidatePodStatusUpdate: the QoS class is the server's, set at creation
                let (was, now) = (old.pointer("/status/qosClass"), new.pointer("/status/qosClass"));
                if was.is_some() && was != now {
                    let shown = now.map(Value::to_string).unwrap_or_else(|| "\"\"".into());
                    let err = field_error(FieldErrorKind::Invalid, "status.qosClass", format!("Invalid value: {shown}: field is immutable"));
                    return Err(ApiError::invalid(&rt.group, &rt.kind, name, &[err]));
                }
            }
            if sub == Sub::Main {
                // allocated values survive an update that omits them (Service clusterIP)
                let old_ip = old
                    .pointer("/spec/clusterIP")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if rt.kind == "Service"
                    && new
                        .pointer("/spec/clusterIP")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    && !old_ip.is_empty()
                    && let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut)
                {
                    spec.insert("clusterIP".into(), json!(old_ip));
                    if let Some(ips) = old.pointer("/spec/clusterIPs") {
                        spec.insert("clusterIPs".into(), ips.clone());
                    }
                }
                defaults::apply(&rt.kind, &mut new, &allocate_cluster_ip)?;
                let mut errs = validation::validate_builtin(&rt.kind, &new);
                errs.extend(validation::validate_builtin_update(&rt.kind, old, &new));
                if !errs.is_empty() {
                    return Err(ApiError::invalid(&rt.group, &rt.kind, name, &errs));
                }
            }
        } else {
            let mut old_client = self.to_client(rt, old.clone());
            if let Some(m) = old_client
                .get_mut("metadata")
                .and_then(Value::as_object_mut)
            {
                m.remove("resourceVersion");
            }
            self.custom_checks(rt, &mut new, Some(&old_client), o, &mut warnings)?;
        }
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "namespaces") => {
                // spec.finalizers changes only through /finalize; status.phase is server-owned
                if let Some(f) = old.pointer("/spec/finalizers") {
                    if !new.get("spec").is_some_and(Value::is_object) {
                        new["spec"] = json!({});
                    }
                    new["spec"]["finalizers"] = f.clone();
                }
                if let Some(p) = old.pointer("/status/phase") {
                    if !new.get("status").is_some_and(Value::is_object) {
                        new["status"] = json!({});
                    }
                    new["status"]["phase"] = p.clone();
                }
            }
            (CRD_GROUP, CRD_RESOURCE) => {
                crd_types(&new).map_err(|e| crd_invalid(name, &e))?;
                let st = crd_status(&new, old.get("status"));
                new["status"] = st;
            }
            _ => {}
        }
        if rt.generation {
            let g = old_meta
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let g = if spec_part(old) != spec_part(&new) {
                g + 1
            } else {
                g
            };
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        // a no-op write does not touch storage: same resourceVersion, no event
        let mut old_cmp = old.clone();
        let mut new_cmp = new.clone();
        for v in [&mut old_cmp, &mut new_cmp] {
            if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
                m.remove("managedFields");
            }
            if let Some(o) = v.as_object_mut() {
                o.remove("apiVersion");
            }
        }
        if old_cmp == new_cmp {
            let mut out = old.clone();
            set_rv(&mut out, cur.mod_revision);
            return Ok(Outcome {
                obj: self.to_client(rt, out),
                warnings,
            });
        }
        touch_managed_fields(&mut new, &o.manager, "Update", &rt.api_version(), sub);
        let key = self.store.key(rt, ns, name);
        let finished = is_deleting(&new)
            && finalizers(&new).is_empty()
            && !(rt.group.is_empty()
                && rt.plural == "namespaces"
                && new
                    .pointer("/spec/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty()));
        if o.dry_run {
            set_rv(&mut new, cur.mod_revision);
            return Ok(Outcome { obj: new, warnings });
        }
        if finished {
            self.store
                .delete(&key, cur.mod_revision)
                .await
                .map_err(store_err)?
                .ok_or_else(|| ApiError::conflict(&rt.group, &rt.plural, name))?;
            set_rv(&mut new, cur.mod_revision);
            self.after_removal(rt, &new);
            return Ok(Outcome { obj: new, warnings });
        }
        let rev = self
            .store
            .update(&key, &new, cur.mod_revision)
            .await
            .map_err(store_err)?
            .ok_or_else(|| ApiError::conflict(&rt.group, &rt.plural, name))?;
        set_rv(&mut new, rev);
        if rt.group == CRD_GROUP && rt.plural == CRD_RESOURCE {
            self.register_crd_object(&new);
        }
        Ok(Outcome { obj: new, warnings })
    }

    /// Book-keeping once an object has left storage.
    pub(crate) fn after_removal(&self, rt: &ResourceType, obj: &Value) {
        if rt.group == CRD_GROUP && rt.plural == CRD_RESOURCE {
            self.registry_mut().unregister_crd(meta_str(obj, "name"));
        }
        self.enqueue_gc(meta_str(obj, "uid"));
    }

    /// PATCH on the main resource or `/status`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn patch(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        pt: &PatchType,
        body: &[u8],
        sub: Sub,
        o: &WriteOpts,
    ) -> Result<Outcome, ApiError> {
        let patch_doc = parse_patch_body(pt, body)?;
        if matches!(pt, PatchType::Strategic) && !rt.is_builtin() {
            return Err(ApiError::unsupported_media_type(
                "application/strategic-merge-patch+json",
                &[
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                ],
            ));
        }
        for _attempt in 0..20 {
            let cur = match self.get_stored(rt, ns, name).await {
                Ok(c) => c,
                Err(e) if e.code == 404 => {
                    if let PatchType::Apply { force } = pt {
                        let applied = patch::server_side_apply(
                            None,
                            &patch_doc,
                            &o.manager,
                            *force,
                            &rt.kind,
                            rt.is_builtin(),
                        )
                        .map_err(|c| apply_conflict(rt, name, &c))?;
                        let mut applied = applied;
                        if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            m.insert("name".into(), json!(name));
                        }
                        return self.create_from_apply(rt, ns, applied, o).await;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            let current = self.to_client(rt, cur.obj.clone());
            let cur_rv = cur.mod_revision.to_string();
            let patched = match pt {
                PatchType::Merge => {
                    let mut t = current.clone();
                    patch::merge_patch(&mut t, &patch_doc);
                    t
                }
                PatchType::Json => {
                    let mut t = current.clone();
                    patch::json_patch(&mut t, &patch_doc).map_err(|e| patch_error(rt, name, &e))?;
                    t
                }
                PatchType::Strategic => {
                    let mut t = current.clone();
                    patch::strategic_merge_patch(&mut t, &patch_doc, &rt.kind)
                        .map_err(|e| patch_error(rt, name, &e))?;
                    t
                }
                PatchType::Apply { force } => patch::server_side_apply(
                    Some(&current),
                    &patch_doc,
                    &o.manager,
                    *force,
                    &rt.kind,
                    rt.is_builtin(),
                )
                .map_err(|c| apply_conflict(rt, name, &c))?,
            };
            if !patched.is_object() {
                return Err(ApiError::bad_request(
                    "the patched object is not a JSON object",
                ));
            }
            let patched_rv = meta_str(&patched, "resourceVersion").to_string();
            let pinned = !patched_rv.is_empty() && patched_rv != cur_rv;
            let mut new = patched;
            if patched_rv.is_empty() {
                set_rv(&mut new, cur.mod_revision);
            }
            let body_name = meta_str(&new, "name");
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            match self.commit_update(rt, &cur, new, sub, o).await {
                Err(e)
                    if e.code == 409
                        && e.reason == "Conflict"
                        && !pinned
                        && !patch_sets_rv(&patch_doc) =>
                {
                    continue;
                }
                r => return r,
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// DELETE one object. Returns the object (with deletionTimestamp when finalizers hold it).
    pub(crate) async fn delete(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        d: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        loop {
            let cur = self.get_stored(rt, ns, name).await?;
            let uid = meta_str(&cur.obj, "uid").to_string();
            if let Some(p) = &d.uid
                && *p != uid
            {
                return Err(ApiError::conflict_msg(
                    &rt.group,
                    &rt.plural,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {p}, UID in object meta: {uid}"
                    ),
                ));
            }
            if let Some(p) = &d.resource_version
                && *p != cur.mod_revision.to_string()
            {
                return Err(ApiError::conflict_msg(
                    &rt.group,
                    &rt.plural,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {}",
                        cur.mod_revision
                    ),
                ));
            }
            let is_ns = rt.group.is_empty() && rt.plural == "namespaces";
            if is_deleting(&cur.obj) {
                if is_ns {
                    return Err(ApiError::conflict_msg(
                        "",
                        "namespaces",
                        name,
                        "The system is ensuring all content is removed from this namespace.  Upon completion, this namespace will automatically be purged by the system.",
                    ));
                }
                return Ok(self.to_client(rt, cur.obj));
            }
            if d.dry_run {
                return Ok(self.to_client(rt, cur.obj));
            }
            let policy = d.propagation.clone().unwrap_or_else(|| {
                if rt.group == "batch" && rt.plural == "jobs" {
                    "Orphan".into()
                } else {
                    "Background".into()
                }
            });
            if policy == "Orphan" {
                self.orphan_dependents(&uid).await?;
            }
            let mut cur = cur;
            if policy == "Foreground" && !self.dependents_of(&uid).await?.is_empty() {
                // as upstream: the owner waits, with the foregroundDeletion finalizer,
                // until the garbage collector has removed its dependents
                let m = meta_mut(&mut cur.obj);
                let fins = m.entry("finalizers").or_insert_with(|| json!([]));
                if let Some(a) = fins.as_array_mut()
                    && !a.iter().any(|f| f == FOREGROUND_FINALIZER)
                {
                    a.push(json!(FOREGROUND_FINALIZER));
                }
                self.foreground
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((
                        rt.clone(),
                        ns.map(str::to_string),
                        name.to_string(),
                        uid.clone(),
                    ));
            }
            let key = self.store.key(rt, ns, name);
            let held = !finalizers(&cur.obj).is_empty()
                || (is_ns
                    && cur
                        .obj
                        .pointer("/spec/finalizers")
                        .and_then(Value::as_array)
                        .is_some_and(|a| !a.is_empty()));
            if held {
                let expected = cur.mod_revision;
                let mut new = cur.obj.clone();
                {
                    let m = meta_mut(&mut new);
                    m.insert("deletionTimestamp".into(), json!(now_ts()));
                    m.insert("deletionGracePeriodSeconds".into(), json!(0));
                    m.remove("resourceVersion");
                }
                if is_ns {
                    if !new.get("status").is_some_and(Value::is_object) {
                        new["status"] = json!({});
                    }
                    new["status"]["phase"] = json!("Terminating");
                }
                match self
                    .store
                    .update(&key, &new, expected)
                    .await
                    .map_err(store_err)?
                {
                    None => continue,
                    Some(rev) => {
                        set_rv(&mut new, rev);
                        self.kick.notify_one();
                        return Ok(self.to_client(rt, new));
                    }
                }
            }
            match self
                .store
                .delete(&key, cur.mod_revision)
                .await
                .map_err(store_err)?
            {
                None => continue,
                Some(_) => {
                    self.after_removal(rt, &cur.obj);
                    return Ok(self.to_client(rt, cur.obj));
                }
            }
        }
    }

    /// Every stored object with an ownerReference to `uid`: (type, object).
    pub(crate) async fn dependents_of(
        &self,
        uid: &str,
    ) -> Result<Vec<(Arc<ResourceType>, Value)>, ApiError> {
        let mut out = Vec::new();
        if uid.is_empty() {
            return Ok(out);
        }
        let types = self.registry().storage_types();
        for rt in types {
            let page = self
                .store
                .list_all(&self.store.collection_prefix(&rt, None))
                .await
                .map_err(store_err)?;
            for s in page.items {
                let refs = s
                    .obj
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array);
                if refs.is_some_and(|r| {
                    r.iter()
                        .any(|x| x.get("uid").and_then(Value::as_str) == Some(uid))
                }) {
                    out.push((rt.clone(), s.obj));
                }
            }
        }
        Ok(out)
    }

    /// Remove one finalizer (the object goes when it was the last one and it is being deleted).
    pub(crate) async fn remove_finalizer(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        finalizer: &str,
    ) -> Result<(), ApiError> {
        for _ in 0..10 {
            let cur = match self.get_stored(rt, ns, name).await {
                Ok(c) => c,
                Err(e) if e.code == 404 => return Ok(()),
                Err(e) => return Err(e),
            };
            let mut new = cur.obj.clone();
            if let Some(a) = new
                .pointer_mut("/metadata/finalizers")
                .and_then(Value::as_array_mut)
            {
                a.retain(|f| f != finalizer);
            }
            match self
                .commit_update(rt, &cur, new, Sub::Main, &WriteOpts::internal())
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// Remove ownerReferences to `uid` from every object (Orphan propagation).
    pub(crate) async fn orphan_dependents(&self, uid: &str) -> Result<(), ApiError> {
        if uid.is_empty() {
            return Ok(());
        }
        let types = self.registry().storage_types();
        for rt in types {
            let prefix = self.store.collection_prefix(&rt, None);
            let page = self.store.list_all(&prefix).await.map_err(store_err)?;
            for s in page.items {
                let refs = s
                    .obj
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array);
                if !refs.is_some_and(|r| {
                    r.iter()
                        .any(|x| x.get("uid").and_then(Value::as_str) == Some(uid))
                }) {
                    continue;
                }
                let ns = meta_str(&s.obj, "namespace").to_string();
                let name = meta_str(&s.obj, "name").to_string();
                let ns = (!ns.is_empty()).then_some(ns);
                self.strip_owner(&rt, ns.as_deref(), &name, uid).await?;
            }
        }
        Ok(())
    }

    /// Remove one ownerReference from an object (retrying on races).
    pub(crate) async fn strip_owner(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        uid: &str,
    ) -> Result<(), ApiError> {
        for _ in 0..10 {
            let cur = match self.get_stored(rt, ns, name).await {
                Ok(c) => c,
                Err(e) if e.code == 404 => return Ok(()),
                Err(e) => return Err(e),
            };
            let mut new = cur.obj.clone();
            let m = meta_mut(&mut new);
            if let Some(refs) = m.get_mut("ownerReferences").and_then(Value::as_array_mut) {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
                if refs.is_empty() {
                    m.remove("ownerReferences");
                }
            }
            m.remove("resourceVersion");
            let key = self.store.key(rt, ns, name);
            if self
                .store
                .update(&key, &new, cur.mod_revision)
                .await
                .map_err(store_err)?
                .is_some()
            {
                return Ok(());
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }

    /// autoscaling/v1 Scale view of an object.
    pub(crate) fn to_scale(&self, rt: &ResourceType, obj: &Value) -> Result<Value, ApiError> {
        let spec = rt.scale.as_ref().ok_or_else(ApiError::no_route)?;
        let replicas = obj
            .pointer(&json_path_pointer(&spec.spec_replicas_path))
            .and_then(Value::as_i64)
            .unwrap_or(if rt.is_builtin() { 1 } else { 0 });
        let status_replicas = obj
            .pointer(&json_path_pointer(&spec.status_replicas_path))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let selector = match &spec.label_selector_path {
            Some(p) => match obj.pointer(&json_path_pointer(p)) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(v @ Value::Object(_)) if rt.is_builtin() => {
                    Some(LabelSelector::string_from_object(v))
                }
                _ => None,
            },
            None => None,
        };
        let m = meta(obj).cloned().unwrap_or_default();
        let mut md = Map::new();
        for f in [
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "creationTimestamp",
        ] {
            if let Some(v) = m.get(f) {
                md.insert(f.into(), v.clone());
            }
        }
        let mut status = json!({"replicas": status_replicas});
        if let Some(s) = selector {
            status["selector"] = json!(s);
        }
        Ok(
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": md,
            "spec": {"replicas": replicas}, "status": status}),
        )
    }

    /// PUT/PATCH of `/scale`: `f` turns the current Scale into the wanted one.
    pub(crate) async fn scale_write(
        &self,
        rt: &Arc<ResourceType>,
        ns: Option<&str>,
        name: &str,
        o: &WriteOpts,
        f: &(dyn Fn(&Value) -> Result<Value, ApiError> + Send + Sync),
    ) -> Result<Value, ApiError> {
        let spec = rt.scale.clone().ok_or_else(ApiError::no_route)?;
        for _ in 0..20 {
            let cur = self.get_stored(rt, ns, name).await?;
            let obj = self.to_client(rt, cur.obj.clone());
            let scale = self.to_scale(rt, &obj)?;
            let wanted = f(&scale)?;
            let wanted_rv = meta_str(&wanted, "resourceVersion").to_string();
            let pinned = !wanted_rv.is_empty() && wanted_rv != cur.mod_revision.to_string();
            if pinned {
                return Err(ApiError::conflict(&rt.group, &rt.plural, name));
            }
            // as the scale registries do: a UID in the Scale is a precondition
            let (wanted_uid, uid) = (meta_str(&wanted, "uid"), meta_str(&obj, "uid"));
            if !wanted_uid.is_empty() && wanted_uid != uid {
                return Err(ApiError::conflict_msg(
                    &rt.group,
                    &rt.plural,
                    name,
                    &format!("Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {uid}"),
                ));
            }
            let replicas = wanted
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if replicas < 0 {
                return Err(ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    &[field_error(
                        FieldErrorKind::Invalid,
                        "spec.replicas",
                        format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                    )],
                ));
            }
            let mut new = obj.clone();
            set_at(&mut new, &spec.spec_replicas_path, json!(replicas));
            match self.commit_update(rt, &cur, new, Sub::Main, o).await {
                Ok(out) => return self.to_scale(rt, &out.obj),
                Err(e) if e.code == 409 && e.reason == "Conflict" && wanted_rv.is_empty() => {
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        Err(ApiError::conflict(&rt.group, &rt.plural, name))
    }
}

/// Decode a built-in object through its type: 400 on type errors; unknown
/// fields handled per `fieldValidation` (and always dropped).
fn typed_checks(
    rt: &ResourceType,
    obj: &mut Value,
    o: &WriteOpts,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    if !rt.is_builtin() {
        return Ok(());
    }
    let paths = typed::check_and_prune(&rt.group, &rt.version, &rt.kind, obj)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if paths.is_empty() {
        return Ok(());
    }
    let msgs: Vec<String> = paths
        .iter()
        .map(|p| format!("unknown field \"{p}\""))
        .collect();
    match o.validation {
        FieldValidation::Strict => Err(ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
            rt.kind,
            rt.version,
            rt.kind,
            msgs.join(", ")
        ))),
        FieldValidation::Warn => {
            warnings.extend(msgs);
            Ok(())
        }
        FieldValidation::Ignore => Ok(()),
    }
}

fn patch_sets_rv(doc: &Value) -> bool {
    match doc {
        Value::Object(_) => doc.pointer("/metadata/resourceVersion").is_some(),
        Value::Array(ops) => ops
            .iter()
            .any(|op| op.get("path").and_then(Value::as_str) == Some("/metadata/resourceVersion")),
        _ => false,
    }
}

fn patch_error(rt: &ResourceType, name: &str, e: &patch::PatchError) -> ApiError {
    match e {
        patch::PatchError::Invalid(m) => ApiError::bad_request(m.clone()),
        patch::PatchError::TestFailed(_) | patch::PatchError::PathNotFound(_) => {
            let _ = (rt, name);
            ApiError::new(422, "Invalid", e.to_string())
        }
    }
}

fn apply_conflict(rt: &ResourceType, name: &str, c: &patch::ApplyConflict) -> ApiError {
    let causes: Vec<Value> = c
        .conflicts
        .iter()
        .map(|x| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", x.manager), "field": x.field}))
        .collect();
    ApiError::new(409, "Conflict", c.to_string())
        .with_details(json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": causes}))
}

/// Parse a patch body by type (apply bodies may be YAML).
pub(crate) fn parse_patch_body(pt: &PatchType, body: &[u8]) -> Result<Value, ApiError> {
    let parsed: Result<Value, String> = match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(e) => match pt {
            PatchType::Apply { .. } => {
                let text = String::from_utf8_lossy(body);
                serde_saphyr::from_str::<Value>(&text).map_err(|e| e.to_string())
            }
            _ => Err(e.to_string()),
        },
    };
    let v = parsed.map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    match pt {
        PatchType::Json if !v.is_array() => Err(ApiError::bad_request(
            "json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp",
        )),
        PatchType::Merge | PatchType::Strategic | PatchType::Apply { .. } if !v.is_object() => {
            Err(ApiError::bad_request(
                "json: cannot unmarshal array into Go value of type map[string]interface {}",
            ))
        }
        _ => Ok(v),
    }
}
