//! The controllers a kube-controller-manager and the apiextensions server run
//! that clients observe through the API: namespace termination, CRD cleanup
//! and ownerReference garbage collection.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Inner;
use super::ops::{CRD_CLEANUP_FINALIZER, DeleteOpts, FOREGROUND_FINALIZER, meta_str, store_err};
use super::resources::{CRD_GROUP, CRD_RESOURCE, ResourceType};
use super::status::ApiError;
use super::store::set_rv;

/// Interval of the periodic reconcile (besides wake-ups after writes).
const RESYNC: Duration = Duration::from_millis(500);

pub(crate) async fn run(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = inner.kick.notified() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
        if let Err(e) = reconcile(&inner).await {
            tracing::debug!(error = %e, "controller pass failed; retrying");
        }
    }
}

async fn reconcile(inner: &Arc<Inner>) -> Result<(), ApiError> {
    collect_garbage(inner).await?;
    finish_foreground(inner).await?;
    terminate_namespaces(inner).await?;
    cleanup_crds(inner).await?;
    Ok(())
}

fn ns_of(rt: &ResourceType, obj: &Value) -> Option<String> {
    rt.namespaced
        .then(|| meta_str(obj, "namespace").to_string())
}

fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

async fn delete_quietly(
    inner: &Arc<Inner>,
    rt: &Arc<ResourceType>,
    obj: &Value,
) -> Result<(), ApiError> {
    let ns = ns_of(rt, obj);
    match inner
        .delete(
            rt,
            ns.as_deref(),
            meta_str(obj, "name"),
            &DeleteOpts::default(),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Does the owner named by `r` (in `ns`) still exist with that uid?
async fn owner_exists(inner: &Arc<Inner>, r: &Value, ns: Option<&str>) -> Result<bool, ApiError> {
    let av = r.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
    let name = r.get("name").and_then(Value::as_str).unwrap_or("");
    let uid = r.get("uid").and_then(Value::as_str).unwrap_or("");
    let Some(rt) = inner.registry().by_kind(av, kind) else {
        // unknown kinds are left alone, as the upstream collector does
        return Ok(true);
    };
    let ns = if rt.namespaced { ns } else { None };
    match inner.get_stored(&rt, ns, name).await {
        Ok(s) => Ok(meta_str(&s.obj, "uid") == uid),
        Err(e) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

async fn collect_garbage(inner: &Arc<Inner>) -> Result<(), ApiError> {
    let gone: BTreeSet<String> = {
        let mut q = inner.gc_queue.lock().unwrap_or_else(|p| p.into_inner());
        q.drain(..).collect()
    };
    if gone.is_empty() {
        return Ok(());
    }
    let types = inner.registry().storage_types();
    for rt in types {
        let page = inner
            .store
            .list_all(&inner.store.collection_prefix(&rt, None))
            .await
            .map_err(store_err)?;
        for s in page.items {
            let Some(refs) = s
                .obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
            else {
                continue;
            };
            let hit: Vec<&Value> = refs
                .iter()
                .filter(|r| {
                    r.get("uid")
                        .and_then(Value::as_str)
                        .is_some_and(|u| gone.contains(u))
                })
                .collect();
            if hit.is_empty() {
                continue;
            }
            let ns = ns_of(&rt, &s.obj);
            let mut others_alive = false;
            for r in refs.iter().filter(|r| !hit.contains(r)) {
                if owner_exists(inner, r, ns.as_deref()).await? {
                    others_alive = true;
                    break;
                }
            }
            if others_alive {
                for r in hit {
                    let uid = r.get("uid").and_then(Value::as_str).unwrap_or("");
                    inner
                        .strip_owner(&rt, ns.as_deref(), meta_str(&s.obj, "name"), uid)
                        .await?;
                }
            } else if !deleting(&s.obj) {
                delete_quietly(inner, &rt, &s.obj).await?;
            }
        }
    }
    Ok(())
}

/// Delete the dependents of owners in Foreground deletion; release an owner
/// (remove `foregroundDeletion`) once none are left.
async fn finish_foreground(inner: &Arc<Inner>) -> Result<(), ApiError> {
    let pending: Vec<_> = inner
        .foreground
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for (rt, ns, name, uid) in pending {
        let deps = inner.dependents_of(&uid).await?;
        for (drt, d) in &deps {
            if !deleting(d) {
                let dns = ns_of(drt, d);
                let opts = DeleteOpts {
                    propagation: Some("Foreground".into()),
                    ..Default::default()
                };
                match inner
                    .delete(drt, dns.as_deref(), meta_str(d, "name"), &opts)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.code == 404 || e.code == 409 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if deps.is_empty() {
            inner
                .remove_finalizer(&rt, ns.as_deref(), &name, FOREGROUND_FINALIZER)
                .await?;
            inner
                .foreground
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(_, _, _, u)| u != &uid);
        }
    }
    Ok(())
}

async fn terminate_namespaces(inner: &Arc<Inner>) -> Result<(), ApiError> {
    let Some(ns_rt) = inner.resolve("", "v1", "namespaces") else {
        return Ok(());
    };
    let page = inner
        .store
        .list_all(&inner.store.collection_prefix(&ns_rt, None))
        .await
        .map_err(store_err)?;
    for s in page.items {
        if !deleting(&s.obj) {
            continue;
        }
        let ns = meta_str(&s.obj, "name").to_string();
        let types = inner.registry().storage_types();
        let mut remaining = 0usize;
        // what is left, as the namespace controller reports it:
        // `<resource>.<group>` → instances, finalizer → instances
        let mut by_resource: std::collections::BTreeMap<String, usize> = Default::default();
        let mut by_finalizer: std::collections::BTreeMap<String, usize> = Default::default();
        for rt in types.iter().filter(|t| t.namespaced) {
            let objs = inner
                .store
                .list_all(&inner.store.collection_prefix(rt, Some(&ns)))
                .await
                .map_err(store_err)?;
            for o in objs.items {
                remaining += 1;
                *by_resource.entry(format!("{}.{}", rt.plural, rt.group)).or_default() += 1;
                for f in o.obj.pointer("/metadata/finalizers").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(f) = f.as_str() {
                        *by_finalizer.entry(f.to_string()).or_default() += 1;
                    }
                }
                if !deleting(&o.obj) {
                    delete_quietly(inner, rt, &o.obj).await?;
                }
            }
        }
        set_namespace_conditions(inner, &s, &by_resource, &by_finalizer).await?;
        if remaining == 0 {
            let mut wanted = s.obj.clone();
            wanted["spec"]["finalizers"] = json!([]);
            match inner.finalize_namespace(&ns, &wanted).await {
                Ok(_) => {}
                Err(e) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The `NamespaceContentRemaining` and `NamespaceFinalizersRemaining`
/// conditions of a Terminating namespace, worded as kube-controller-manager's
/// namespace controller words them; written only when they change.
async fn set_namespace_conditions(
    inner: &Arc<Inner>,
    stored: &super::store::Stored,
    by_resource: &std::collections::BTreeMap<String, usize>,
    by_finalizer: &std::collections::BTreeMap<String, usize>,
) -> Result<(), ApiError> {
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let content = if by_resource.is_empty() {
        json!({"type": "NamespaceContentRemaining", "status": "False", "reason": "ContentDeleted", "message": "All content successfully deleted, may be waiting on finalization"})
    } else {
        let left: Vec<String> = by_resource.iter().map(|(r, n)| format!("{r} has {n} resource instances")).collect();
        json!({"type": "NamespaceContentRemaining", "status": "True", "reason": "SomeResourcesRemain", "message": format!("Some resources are remaining: {}", left.join(", "))})
    };
    let finalizers = if by_finalizer.is_empty() {
        json!({"type": "NamespaceFinalizersRemaining", "status": "False", "reason": "ContentHasNoFinalizers", "message": "All content-preserving finalizers finished"})
    } else {
        let left: Vec<String> = by_finalizer.iter().map(|(f, n)| format!("{f} in {n} resource instances")).collect();
        json!({"type": "NamespaceFinalizersRemaining", "status": "True", "reason": "SomeFinalizersRemain", "message": format!("Some content in the namespace has finalizers remaining: {}", left.join(", "))})
    };
    let current = stored.obj.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let same = |c: &Value, want: &Value| c["type"] == want["type"] && c["status"] == want["status"] && c["message"] == want["message"];
    if [&content, &finalizers].iter().all(|want| current.iter().any(|c| same(c, want))) {
        return Ok(());
    }
    let mut conditions: Vec<Value> = current
        .into_iter()
        .filter(|c| c["type"] != "NamespaceContentRemaining" && c["type"] != "NamespaceFinalizersRemaining")
        .collect();
    for mut want in [content, finalizers] {
        want["lastTransitionTime"] = json!(now);
        conditions.push(want);
    }
    let mut new = stored.obj.clone();
    new["status"]["conditions"] = json!(conditions);
    // a lost race is retried on the next pass
    inner.store.update(&stored.key, &new, stored.mod_revision).await.map_err(store_err)?;
    Ok(())
}

async fn cleanup_crds(inner: &Arc<Inner>) -> Result<(), ApiError> {
    let Some(crd_rt) = inner.resolve(CRD_GROUP, "v1", CRD_RESOURCE) else {
        return Ok(());
    };
    let page = inner
        .store
        .list_all(&inner.store.collection_prefix(&crd_rt, None))
        .await
        .map_err(store_err)?;
    for s in page.items {
        if !deleting(&s.obj) {
            continue;
        }
        let group = s
            .obj
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = s
            .obj
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut remaining = 0usize;
        let rt = inner.registry().any_version(group, plural);
        if let Some(rt) = rt {
            let objs = inner
                .store
                .list_all(&inner.store.collection_prefix(&rt, None))
                .await
                .map_err(store_err)?;
            for o in objs.items {
                remaining += 1;
                if !deleting(&o.obj) {
                    delete_quietly(inner, &rt, &o.obj).await?;
                }
            }
        }
        if remaining > 0 {
            continue;
        }
        let mut new = s.obj.clone();
        if let Some(f) = new
            .pointer_mut("/metadata/finalizers")
            .and_then(Value::as_array_mut)
        {
            f.retain(|x| x != CRD_CLEANUP_FINALIZER);
        }
        let left = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if left {
            let _ = inner
                .store
                .update(&s.key, &new, s.mod_revision)
                .await
                .map_err(store_err)?;
        } else if inner
            .store
            .delete(&s.key, s.mod_revision)
            .await
            .map_err(store_err)?
            .is_some()
        {
            inner.after_removal(&crd_rt, &s.obj);
        }
    }
    Ok(())
}

impl Inner {
    /// `PUT /api/v1/namespaces/<name>/finalize`: set `spec.finalizers`; a
    /// terminating namespace without finalizers left is removed.
    pub(crate) async fn finalize_namespace(
        &self,
        name: &str,
        wanted: &Value,
    ) -> Result<Value, ApiError> {
        let rt = self
            .resolve("", "v1", "namespaces")
            .ok_or_else(ApiError::no_route)?;
        for _ in 0..10 {
            let cur = self.get_stored(&rt, None, name).await?;
            let mut new = cur.obj.clone();
            let fins = wanted
                .pointer("/spec/finalizers")
                .cloned()
                .unwrap_or(json!([]));
            if !new.get("spec").is_some_and(Value::is_object) {
                new["spec"] = json!({});
            }
            new["spec"]["finalizers"] = fins.clone();
            let spec_empty = fins.as_array().is_none_or(|a| a.is_empty());
            let meta_empty = new
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(|a| a.is_empty());
            let key = self.store.key(&rt, None, name);
            if deleting(&new) && spec_empty && meta_empty {
                if self
                    .store
                    .delete(&key, cur.mod_revision)
                    .await
                    .map_err(store_err)?
                    .is_some()
                {
                    self.after_removal(&rt, &new);
                    set_rv(&mut new, cur.mod_revision);
                    return Ok(self.to_client(&rt, new));
                }
                continue;
            }
            if let Some(rev) = self
                .store
                .update(&key, &new, cur.mod_revision)
                .await
                .map_err(store_err)?
            {
                set_rv(&mut new, rev);
                return Ok(self.to_client(&rt, new));
            }
        }
        Err(ApiError::conflict("", "namespaces", name))
    }
}
