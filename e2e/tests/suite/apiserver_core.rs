//! The API emulator against kube-rs and raw HTTP: status codes and Status
//! bodies as a real kube-apiserver answers them.

use crate::apiserver_support;

use apiserver_support::{assert_status, eventually, raw, raw_json, start};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};

async fn mk_ns(client: &kube::Client, name: &str) {
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns"),
    )
    .await
    .expect("namespace created");
}

fn cm(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).expect("configmap")
}

#[tokio::test]
async fn health_version_and_authentication() {
    let env = start(vec![]).await;
    let (code, body, _) = raw(&env.client, "GET", "/version", "application/json", None).await;
    assert_eq!(code, 200);
    assert!(
        body["gitVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.3")),
        "{body}"
    );

    // without a token: 401 Status, except health endpoints
    let http = reqwest_like_get(&env, "/api/v1/namespaces", None).await;
    assert_eq!(http.0, 401);
    assert_status(&http.1, 401, "Unauthorized", "Unauthorized");
    let bad = reqwest_like_get(&env, "/api/v1/namespaces", Some("wrong")).await;
    assert_eq!(bad.0, 401);
    let health = reqwest_like_get(&env, "/healthz", None).await;
    assert_eq!(health.0, 200);
    let good = reqwest_like_get(&env, "/api/v1/namespaces", Some(env.server.admin_token())).await;
    assert_eq!(good.0, 200);
    assert_eq!(good.1["kind"], "NamespaceList");
}

/// A GET with an explicit (or no) bearer token through a kube client built from a
/// kubeconfig without credentials.
async fn reqwest_like_get(
    env: &apiserver_support::Env,
    path: &str,
    token: Option<&str>,
) -> (u16, Value) {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(env.server.ca_pem());
    let user = match token {
        Some(t) => json!({"token": t}),
        None => json!({}),
    };
    let kc = json!({"apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": env.server.url(), "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"});
    let kc = kube::config::Kubeconfig::from_yaml(&kc.to_string()).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(cfg).expect("client");
    let (c, v, _) = raw(&client, "GET", path, "application/json", None).await;
    (c, v)
}

#[tokio::test]
async fn crud_conflicts_and_status_bodies() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "clusters").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "clusters");
    let created = cms
        .create(&PostParams::default(), &cm("demo", json!({"a": "1"})))
        .await
        .expect("create");
    let rv1 = created.metadata.resource_version.clone().expect("rv");
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());

    // AlreadyExists
    let (code, body) = raw_json(
        c,
        "POST",
        "/api/v1/namespaces/clusters/configmaps",
        "application/json",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo"}}),
    )
    .await;
    assert_eq!(code, 409);
    assert_status(
        &body,
        409,
        "AlreadyExists",
        "configmaps \"demo\" already exists",
    );
    assert_eq!(
        body["details"],
        json!({"name": "demo", "kind": "configmaps"})
    );

    // NotFound
    let (code, body, _) = raw(
        c,
        "GET",
        "/api/v1/namespaces/clusters/configmaps/nope",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 404);
    assert_status(&body, 404, "NotFound", "configmaps \"nope\" not found");

    // namespace must exist
    let (code, body) = raw_json(
        c,
        "POST",
        "/api/v1/namespaces/missing/configmaps",
        "application/json",
        &json!({"metadata": {"name": "x"}}),
    )
    .await;
    assert_eq!(code, 404);
    assert_status(&body, 404, "NotFound", "namespaces \"missing\" not found");

    // invalid name
    let (code, body) = raw_json(
        c,
        "POST",
        "/api/v1/namespaces/clusters/configmaps",
        "application/json",
        &json!({"metadata": {"name": "Bad_Name"}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.name");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m
                .starts_with("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value")),
        "{body}"
    );

    // update with the current resourceVersion works and bumps it
    let mut upd = created.clone();
    upd.data = Some([("a".to_string(), "2".to_string())].into());
    let updated = cms
        .replace("demo", &PostParams::default(), &upd)
        .await
        .expect("update");
    let rv2 = updated.metadata.resource_version.clone().expect("rv");
    assert_ne!(rv1, rv2);

    // stale resourceVersion -> 409 Conflict with the upstream body
    let (code, body) = raw_json(
        c,
        "PUT",
        "/api/v1/namespaces/clusters/configmaps/demo",
        "application/json",
        &serde_json::to_value(&upd).expect("json"),
    )
    .await;
    assert_eq!(code, 409);
    assert_status(
        &body,
        409,
        "Conflict",
        "Operation cannot be fulfilled on configmaps \"demo\": the object has been modified; please apply your changes to the latest version and try again",
    );
    assert_eq!(body["details"]["name"], "demo");
    assert_eq!(body["details"]["kind"], "configmaps");

    // a no-op update keeps the resourceVersion
    let same = cms
        .replace("demo", &PostParams::default(), &updated)
        .await
        .expect("no-op update");
    assert_eq!(
        same.metadata.resource_version.as_deref(),
        Some(rv2.as_str())
    );

    // list: resourceVersion and items without TypeMeta for built-ins
    let (code, list, _) = raw(
        c,
        "GET",
        "/api/v1/namespaces/clusters/configmaps",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "ConfigMapList");
    assert!(
        list["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    assert_eq!(list["items"][0]["metadata"]["name"], "demo");
    assert!(list["items"][0].get("kind").is_none());

    // generateName
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).expect("cm");
    let g = cms
        .create(&PostParams::default(), &generated)
        .await
        .expect("generateName create");
    let gname = g.metadata.name.expect("name");
    assert!(gname.starts_with("gen-") && gname.len() == 9, "{gname}");

    // dry run writes nothing
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    cms.create(&dry, &cm("dry", json!({})))
        .await
        .expect("dry-run create");
    assert!(cms.get_opt("dry").await.expect("get").is_none());

    // delete returns the object; then 404
    let (code, body, _) = raw(
        c,
        "DELETE",
        "/api/v1/namespaces/clusters/configmaps/demo",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(body["metadata"]["name"], "demo");
    assert!(cms.get_opt("demo").await.expect("get").is_none());

    // unknown resource
    let (code, body, _) = raw(
        c,
        "GET",
        "/apis/nope.example.com/v1/things",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(body["kind"], "Status");
}

#[tokio::test]
async fn patch_types_and_scale_on_deployments() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "clusters-demo").await;
    let deploys: Api<Deployment> = Api::namespaced(c.clone(), "clusters-demo");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "kube-apiserver", "labels": {"app": "kube-apiserver"}},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "kube-apiserver"}},
            "template": {"metadata": {"labels": {"app": "kube-apiserver"}},
                "spec": {"containers": [{"name": "kas", "image": "kas:1"}, {"name": "konnectivity", "image": "k:1"}]}}}
    })).expect("deployment");
    let created = deploys
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    assert_eq!(created.metadata.generation, Some(1));

    // merge patch
    let p = deploys
        .patch(
            "kube-apiserver",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("merge");
    assert_eq!(
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("x"))
            .map(String::as_str),
        Some("y")
    );
    assert_eq!(
        p.metadata.generation,
        Some(1),
        "metadata changes do not bump generation"
    );

    // json patch
    let p = deploys
        .patch(
            "kube-apiserver",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "replace", "path": "/spec/replicas", "value": 2}]),
                )
                .expect("ops"),
            ),
        )
        .await
        .expect("json patch");
    assert_eq!(p.spec.replicas, Some(2));
    assert_eq!(p.metadata.generation, Some(2));

    // strategic merge patch merges containers by name
    let p = deploys.patch("kube-apiserver", &PatchParams::default(),
        &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "kas", "image": "kas:2"}]}}}}))).await.expect("strategic");
    let containers = p
        .spec
        .template
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .expect("containers");
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0].image.as_deref(), Some("kas:2"));

    // server-side apply
    let ssa = PatchParams::apply("hcp-dr").force();
    let p = deploys
        .patch(
            "kube-apiserver",
            &ssa,
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "kube-apiserver", "annotations": {"hcp-dr/paused": "true"}}})),
        )
        .await
        .expect("apply");
    assert_eq!(
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("hcp-dr/paused"))
            .map(String::as_str),
        Some("true")
    );

    // patch with a stale resourceVersion -> 409
    let (code, body) = raw_json(
        c,
        "PATCH",
        "/apis/apps/v1/namespaces/clusters-demo/deployments/kube-apiserver",
        "application/merge-patch+json",
        &json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 5}}),
    )
    .await;
    assert_eq!(code, 409);
    assert_status(
        &body,
        409,
        "Conflict",
        "Operation cannot be fulfilled on deployments.apps \"kube-apiserver\": the object has been modified; please apply your changes to the latest version and try again",
    );
    assert_eq!(body["details"]["group"], "apps");

    // unsupported patch content type -> 415
    let (code, body, _) = raw(
        c,
        "PATCH",
        "/apis/apps/v1/namespaces/clusters-demo/deployments/kube-apiserver",
        "text/plain",
        Some(b"{}".to_vec()),
    )
    .await;
    assert_eq!(code, 415);
    assert_eq!(body["reason"], "UnsupportedMediaType");

    // scale subresource
    let s = deploys
        .get_scale("kube-apiserver")
        .await
        .expect("get scale");
    assert_eq!(s.spec.as_ref().and_then(|s| s.replicas), Some(2));
    assert_eq!(
        s.status
            .as_ref()
            .and_then(|s| s.selector.clone())
            .as_deref(),
        Some("app=kube-apiserver")
    );
    let s = deploys
        .patch_scale(
            "kube-apiserver",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("patch scale");
    assert_eq!(s.spec.as_ref().and_then(|s| s.replicas), Some(0));
    let (code, body, _) = raw(
        c,
        "GET",
        "/apis/apps/v1/namespaces/clusters-demo/deployments/kube-apiserver/scale",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(body["kind"], "Scale");
    assert_eq!(body["apiVersion"], "autoscaling/v1");
    let mut put = body.clone();
    put["spec"]["replicas"] = json!(3);
    let (code, body) = raw_json(
        c,
        "PUT",
        "/apis/apps/v1/namespaces/clusters-demo/deployments/kube-apiserver/scale",
        "application/json",
        &put,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = raw_json(
        c,
        "PUT",
        "/apis/apps/v1/namespaces/clusters-demo/deployments/kube-apiserver/scale",
        "application/json",
        &put,
    )
    .await;
    assert_eq!(code, 409, "stale Scale resourceVersion: {body}");
    let d = deploys.get("kube-apiserver").await.expect("get");
    assert_eq!(d.spec.replicas, Some(3));

    // status subresource: main resource writes ignore status, /status writes only status
    let p = deploys
        .patch(
            "kube-apiserver",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 9}})),
        )
        .await
        .expect("patch");
    assert_eq!(p.status.as_ref().and_then(|s| s.replicas), None);
    let p = deploys
        .patch_status(
            "kube-apiserver",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 3}, "spec": {"replicas": 7}})),
        )
        .await
        .expect("patch status");
    assert_eq!(p.status.as_ref().and_then(|s| s.replicas), Some(3));
    assert_eq!(p.spec.replicas, Some(3));

    // immutable selector
    let (code, body) = raw_json(
        c,
        "PATCH",
        "/apis/apps/v1/namespaces/clusters-demo/deployments/kube-apiserver",
        "application/merge-patch+json",
        &json!({"spec": {"selector": {"matchLabels": {"app": "other"}}}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["causes"][0]["field"], "spec.selector");
}

#[tokio::test]
async fn statefulset_immutable_fields() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "hcp").await;
    let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "etcd"},
        "spec": {"replicas": 3, "serviceName": "etcd-discovery", "selector": {"matchLabels": {"app": "etcd"}},
            "template": {"metadata": {"labels": {"app": "etcd"}}, "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}}}});
    let (code, _) = raw_json(
        c,
        "POST",
        "/apis/apps/v1/namespaces/hcp/statefulsets",
        "application/json",
        &sts,
    )
    .await;
    assert_eq!(code, 201);
    let (code, body) = raw_json(
        c,
        "PATCH",
        "/apis/apps/v1/namespaces/hcp/statefulsets/etcd",
        "application/merge-patch+json",
        &json!({"spec": {"serviceName": "other"}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["reason"], "Invalid");
    assert!(body["message"].as_str().is_some_and(|m| m.starts_with(
        "StatefulSet.apps \"etcd\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than")), "{body}");
    let (code, body) = raw_json(
        c,
        "PATCH",
        "/apis/apps/v1/namespaces/hcp/statefulsets/etcd/scale",
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 0}}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["spec"]["replicas"], 0);
}

#[tokio::test]
async fn a_claim_is_bound_once_and_is_immutable_after() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "hcp").await;
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data-etcd-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Gi"}}}});
    let path = "/api/v1/namespaces/hcp/persistentvolumeclaims";
    let (code, _) = raw_json(c, "POST", path, "application/json", &claim).await;
    assert_eq!(code, 201);
    let merge = "application/merge-patch+json";
    let named = format!("{path}/data-etcd-1");
    // The binder sets volumeName once on an unbound claim.
    let (code, body) = raw_json(c, "PATCH", &named, merge, &json!({"spec": {"volumeName": "pvc-1"}})).await;
    assert_eq!(code, 200, "{body}");
    // Not twice, and no other spec field ever.
    for patch in [json!({"spec": {"volumeName": "pvc-2"}}), json!({"spec": {"accessModes": ["ReadWriteMany"]}})] {
        let (code, body) = raw_json(c, "PATCH", &named, merge, &patch).await;
        assert_eq!(code, 422, "{patch}: {body}");
        assert!(body["message"].as_str().is_some_and(|m| m.contains("spec is immutable after creation")), "{body}");
    }
    // The requested size may grow.
    let (code, body) = raw_json(c, "PATCH", &named, merge, &json!({"spec": {"resources": {"requests": {"storage": "9Gi"}}}})).await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "clusters").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "clusters");
    let mut o = cm("held", json!({}));
    o.metadata.finalizers = Some(vec!["hcp-dr.openshift.io/test".into()]);
    cms.create(&PostParams::default(), &o)
        .await
        .expect("create");
    let (code, body, _) = raw(
        c,
        "DELETE",
        "/api/v1/namespaces/clusters/configmaps/held",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert!(body["metadata"]["deletionTimestamp"].is_string(), "{body}");
    assert_eq!(body["metadata"]["deletionGracePeriodSeconds"], 0);
    let still = cms.get("held").await.expect("still there");
    assert!(still.metadata.deletion_timestamp.is_some());

    // no new finalizers once deleting
    let (code, body) = raw_json(
        c,
        "PATCH",
        "/api/v1/namespaces/clusters/configmaps/held",
        "application/merge-patch+json",
        &json!({"metadata": {"finalizers": ["hcp-dr.openshift.io/test", "another"]}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.finalizers");

    // removing the last finalizer removes the object
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("unfinalize");
    assert!(cms.get_opt("held").await.expect("get").is_none());

    // preconditions
    cms.create(&PostParams::default(), &cm("pre", json!({})))
        .await
        .expect("create");
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = cms
        .delete("pre", &dp)
        .await
        .expect_err("precondition fails");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message
                    .contains("Precondition failed: UID in precondition: wrong"),
                "{}",
                s.message
            );
        }
        other => panic!("unexpected error {other}"),
    }
}

#[tokio::test]
async fn namespace_deletion_removes_contents() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "doomed").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "doomed");
    cms.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .expect("create a");
    let mut held = cm("held", json!({}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &held)
        .await
        .expect("create held");

    let nss: Api<Namespace> = Api::all(c.clone());
    let ns = nss.get("doomed").await.expect("ns");
    assert_eq!(
        ns.spec.as_ref().and_then(|s| s.finalizers.clone()),
        Some(vec!["kubernetes".to_string()])
    );
    assert_eq!(
        ns.status.as_ref().and_then(|s| s.phase.clone()).as_deref(),
        Some("Active")
    );
    let (code, body, _) = raw(
        c,
        "DELETE",
        "/api/v1/namespaces/doomed",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(body["status"]["phase"], "Terminating");

    // creating in a terminating namespace is forbidden
    let (code, body) = raw_json(
        c,
        "POST",
        "/api/v1/namespaces/doomed/configmaps",
        "application/json",
        &json!({"metadata": {"name": "late"}}),
    )
    .await;
    assert_eq!(code, 403);
    assert_status(
        &body,
        403,
        "Forbidden",
        "configmaps \"late\" is forbidden: unable to create new content in namespace doomed because it is being terminated",
    );

    // the unheld object goes; the held one waits for its finalizer
    eventually("configmap a deleted", || async {
        cms.get_opt("a").await.expect("get").is_none().then_some(())
    })
    .await;
    // the namespace controller deletes contents one by one: wait for it to
    // reach "held" rather than assuming it did so before "a" vanished
    eventually("held marked for deletion", || async {
        let h = cms.get("held").await.expect("held still present");
        h.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    assert!(nss.get_opt("doomed").await.expect("get").is_some());
    // deleting again: 409 as upstream
    let (code, body, _) = raw(
        c,
        "DELETE",
        "/api/v1/namespaces/doomed",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(body["reason"], "Conflict");

    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
    eventually("namespace removed", || async {
        nss.get_opt("doomed")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn garbage_collection_by_owner_reference() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "gc").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "gc");
    let owner = cms
        .create(&PostParams::default(), &cm("owner", json!({})))
        .await
        .expect("owner");
    let uid = owner.metadata.uid.clone().expect("uid");
    let owned = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]}}))
        .expect("cm")
    };
    cms.create(&PostParams::default(), &owned("dep"))
        .await
        .expect("dependent");
    cms.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    eventually("dependent collected", || async {
        cms.get_opt("dep")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;

    // Orphan keeps the dependent and strips the reference
    let owner = cms
        .create(&PostParams::default(), &cm("owner2", json!({})))
        .await
        .expect("owner2");
    let uid2 = owner.metadata.uid.clone().expect("uid");
    let dep2: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "dep2", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner2", "uid": uid2}]}}))
        .expect("cm");
    cms.create(&PostParams::default(), &dep2)
        .await
        .expect("dependent 2");
    cms.delete("owner2", &DeleteParams::orphan())
        .await
        .expect("orphan delete");
    let d = cms.get("dep2").await.expect("orphan kept");
    assert!(d.metadata.owner_references.is_none_or(|r| r.is_empty()));
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "a").await;
    mk_ns(c, "b").await;
    for (ns, name, tier) in [
        ("a", "one", "cp"),
        ("a", "two", "data"),
        ("b", "three", "cp"),
        ("b", "four", "cp"),
    ] {
        let cms: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
        let o: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"tier": tier}}}))
                .expect("cm");
        cms.create(&PostParams::default(), &o)
            .await
            .expect("create");
    }
    let all: Api<ConfigMap> = Api::all(c.clone());
    let names = |l: &kube::api::ObjectList<ConfigMap>| -> Vec<String> {
        let mut v: Vec<String> = l
            .items
            .iter()
            .filter_map(|o| o.metadata.name.clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&all.list(&ListParams::default()).await.expect("list")).len(),
        4
    );
    assert_eq!(
        names(
            &all.list(&ListParams::default().labels("tier=cp"))
                .await
                .expect("list")
        ),
        vec!["four", "one", "three"]
    );
    assert_eq!(
        names(
            &all.list(&ListParams::default().labels("tier notin (cp)"))
                .await
                .expect("list")
        ),
        vec!["two"]
    );
    assert_eq!(
        names(
            &all.list(&ListParams::default().labels("!tier"))
                .await
                .expect("list")
        )
        .len(),
        0
    );
    assert_eq!(
        names(
            &all.list(&ListParams::default().fields("metadata.namespace=b"))
                .await
                .expect("list")
        ),
        vec!["four", "three"]
    );
    assert_eq!(
        names(
            &all.list(&ListParams::default().fields("metadata.name=two"))
                .await
                .expect("list")
        ),
        vec!["two"]
    );

    // pages of 3 with a continue token
    let p1 = all
        .list(&ListParams::default().limit(3))
        .await
        .expect("page 1");
    assert_eq!(p1.items.len(), 3);
    let token = p1.metadata.continue_.clone().expect("continue token");
    let p2 = all
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(p2.items.len(), 1);
    assert!(p2.metadata.continue_.is_none_or(|c| c.is_empty()));

    let (code, body, _) = raw(
        c,
        "GET",
        "/api/v1/configmaps?fieldSelector=spec.foo%3D1",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(body["reason"], "BadRequest");
}

#[tokio::test]
async fn watch_events_resume_and_expiry() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "w").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "w");
    let list = cms.list(&ListParams::default()).await.expect("list");
    let rv0 = list.metadata.resource_version.clone().expect("rv");
    let mut stream = cms
        .watch(&WatchParams::default(), &rv0)
        .await
        .expect("watch")
        .boxed();

    cms.create(&PostParams::default(), &cm("w1", json!({"k": "1"})))
        .await
        .expect("create");
    cms.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .expect("patch");
    cms.delete("w1", &DeleteParams::default())
        .await
        .expect("delete");

    let mut seen = Vec::new();
    let mut mod_rv = String::new();
    while seen.len() < 3 {
        match stream
            .try_next()
            .await
            .expect("watch event")
            .expect("stream open")
        {
            WatchEvent::Added(o) => seen.push(("ADDED", o.metadata.name.unwrap_or_default())),
            WatchEvent::Modified(o) => {
                mod_rv = o.metadata.resource_version.clone().unwrap_or_default();
                seen.push(("MODIFIED", o.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Deleted(o) => seen.push(("DELETED", o.metadata.name.unwrap_or_default())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED", "w1".to_string()),
            ("MODIFIED", "w1".to_string()),
            ("DELETED", "w1".to_string())
        ]
    );
    drop(stream);

    // resume after the MODIFIED event: only DELETED follows
    let mut resumed = cms
        .watch(&WatchParams::default(), &mod_rv)
        .await
        .expect("watch")
        .boxed();
    match resumed.try_next().await.expect("event").expect("open") {
        WatchEvent::Deleted(o) => assert_eq!(o.metadata.name.as_deref(), Some("w1")),
        other => panic!("expected DELETED, got {other:?}"),
    }
    drop(resumed);

    // compact etcd past rv0: a watch from rv0 gets an ERROR event with 410
    let mut etcd = etcd_client::Client::connect([env.etcd.client_url()], None)
        .await
        .expect("etcd client");
    let rev = etcd
        .get("x", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    etcd.compact(rev, None).await.expect("compact");
    let mut old = cms
        .watch(&WatchParams::default(), &rv0)
        .await
        .expect("watch")
        .boxed();
    match old.try_next().await.expect("event").expect("open") {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }

    // a kube-rs watcher (list + watch) sees current objects
    cms.create(&PostParams::default(), &cm("w2", json!({})))
        .await
        .expect("create");
    let mut w = kube::runtime::watcher(cms.clone(), Default::default()).boxed();
    let found = loop {
        match w.try_next().await.expect("watcher").expect("open") {
            kube::runtime::watcher::Event::InitApply(o)
            | kube::runtime::watcher::Event::Apply(o) => break o,
            _ => continue,
        }
    };
    assert_eq!(found.metadata.name.as_deref(), Some("w2"));
}

#[tokio::test]
async fn discovery_serves_groups_and_subresources() {
    let env = start(vec![]).await;
    let c = &env.client;
    let (code, api, _) = raw(c, "GET", "/api", "application/json", None).await;
    assert_eq!(code, 200);
    assert_eq!(api["versions"], json!(["v1"]));
    let (_, groups, _) = raw(c, "GET", "/apis", "application/json", None).await;
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for g in [
        "apps",
        "batch",
        "coordination.k8s.io",
        "route.openshift.io",
        "rbac.authorization.k8s.io",
        "apiextensions.k8s.io",
    ] {
        assert!(names.contains(&g), "{g} missing from {names:?}");
    }
    let (_, apps, _) = raw(c, "GET", "/apis/apps/v1", "application/json", None).await;
    let res: Vec<&str> = apps["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(
        res.contains(&"deployments/scale") && res.contains(&"statefulsets/status"),
        "{res:?}"
    );

    let discovery = kube::Discovery::new(c.clone())
        .run()
        .await
        .expect("kube-rs discovery");
    assert!(discovery.has_group("apps"));
    assert!(discovery.groups().any(|g| g.name() == "route.openshift.io"));
}

#[tokio::test]
async fn restart_keeps_objects_and_url() {
    let env = start(vec![]).await;
    mk_ns(&env.client, "keep").await;
    let url = env.server.url().to_string();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let apiserver_support::Env {
        server, etcd, dir, ..
    } = env;
    server.shutdown().await;
    let server =
        hcp_dr_e2e::apiserver::ApiServer::start(apiserver_support::config(&etcd, vec![], port))
            .await
            .expect("restart");
    assert_eq!(server.url(), url);
    let client = server.client().await.expect("client");
    let nss: Api<Namespace> = Api::all(client);
    assert!(nss.get_opt("keep").await.expect("get").is_some());
    let kc = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(&kc, "mgmt-a")
        .expect("write kubeconfig");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&kc).expect("meta").permissions().mode() & 0o777,
        0o600
    );
}

#[tokio::test]
async fn port_forward_reaches_the_pod_ip() {
    use k8s_openapi::api::core::v1::Pod;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "pf").await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "pf");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "etcd-0"},
        "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}}))
    .expect("pod");
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );

    // absent pod -> 404; pod without an IP -> 400
    let (code, body, _) = raw(
        c,
        "GET",
        "/api/v1/namespaces/pf/pods/nope/portforward?ports=2379",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 404);
    assert_status(&body, 404, "NotFound", "pods \"nope\" not found");
    let (code, body, _) = raw(
        c,
        "GET",
        "/api/v1/namespaces/pf/pods/etcd-0/portforward?ports=2379",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(body["reason"], "BadRequest");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = sock.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    pods.patch_status(
        "etcd-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podIP": "127.0.0.1", "phase": "Running"}})),
    )
    .await
    .expect("status");
    let mut pf = pods
        .portforward("etcd-0", &[port])
        .await
        .expect("port-forward");
    let mut stream = pf.take_stream(port).expect("stream");
    stream.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).await.expect("read");
    assert_eq!(&buf, b"ping");
}

#[tokio::test]
async fn builtin_defaults_secret_conversion_and_label_validation() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "d").await;
    let (code, s) = raw_json(c, "POST", "/api/v1/namespaces/d/secrets", "application/json",
        &json!({"metadata": {"name": "demo-pull-secret"}, "stringData": {".dockerconfigjson": "{}"}})).await;
    assert_eq!(code, 201, "{s}");
    assert_eq!(s["data"][".dockerconfigjson"], "e30=");
    assert!(s.get("stringData").is_none());
    assert_eq!(s["type"], "Opaque");
    let (code, body) = raw_json(
        c,
        "POST",
        "/api/v1/namespaces/d/secrets",
        "application/json",
        &json!({"metadata": {"name": "bad"}, "data": {"k": "not base64!"}}),
    )
    .await;
    assert_eq!(code, 400, "{body}");

    let (code, svc) = raw_json(c, "POST", "/api/v1/namespaces/d/services", "application/json",
        &json!({"metadata": {"name": "etcd-client"}, "spec": {"selector": {"app": "etcd"}, "ports": [{"name": "etcd-client", "port": 2379}]}})).await;
    assert_eq!(code, 201, "{svc}");
    let ip = svc["spec"]["clusterIP"]
        .as_str()
        .expect("clusterIP allocated")
        .to_string();
    assert!(ip.starts_with("172.30."), "{ip}");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 2379);
    // an update that omits clusterIP keeps it; changing it is refused
    let mut upd = svc.clone();
    upd["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("clusterIP");
    upd["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("clusterIPs");
    let (code, body) = raw_json(
        c,
        "PUT",
        "/api/v1/namespaces/d/services/etcd-client",
        "application/json",
        &upd,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["spec"]["clusterIP"], ip.as_str());
    let (code, body) = raw_json(
        c,
        "PATCH",
        "/api/v1/namespaces/d/services/etcd-client",
        "application/merge-patch+json",
        &json!({"spec": {"clusterIP": "172.30.9.9", "clusterIPs": ["172.30.9.9"]}}),
    )
    .await;
    assert_eq!(code, 422, "{body}");

    let (code, sts) = raw_json(c, "POST", "/apis/apps/v1/namespaces/d/statefulsets", "application/json",
        &json!({"metadata": {"name": "etcd"}, "spec": {"serviceName": "etcd-discovery", "selector": {"matchLabels": {"app": "etcd"}},
            "template": {"metadata": {"labels": {"app": "etcd"}}, "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}}}})).await;
    assert_eq!(code, 201, "{sts}");
    assert_eq!(sts["spec"]["replicas"], 1);
    assert_eq!(
        sts["spec"]["persistentVolumeClaimRetentionPolicy"],
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );
    assert_eq!(sts["status"], json!({}));

    let (code, body) = raw_json(
        c,
        "POST",
        "/api/v1/namespaces/d/configmaps",
        "application/json",
        &json!({"metadata": {"name": "l", "labels": {"app": "not valid"}}}),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["details"]["causes"][0]["field"], "metadata.labels");

    // built-in kinds decode through their types: unknown fields and type errors
    let (code, body) = raw_json(
        c,
        "POST",
        "/api/v1/namespaces/d/configmaps?fieldValidation=Strict",
        "application/json",
        &json!({"metadata": {"name": "typo"}, "datta": {"a": "b"}}),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_status(
        &body,
        400,
        "BadRequest",
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"datta\"",
    );
    let (code, body, headers) = raw(
        c,
        "POST",
        "/api/v1/namespaces/d/configmaps",
        "application/json",
        Some(
            serde_json::to_vec(&json!({"metadata": {"name": "typo"}, "datta": {"a": "b"}}))
                .expect("json"),
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert!(body.get("datta").is_none());
    assert_eq!(
        headers.get("warning").and_then(|v| v.to_str().ok()),
        Some("299 - \"unknown field \\\"datta\\\"\"")
    );
    let (code, body) = raw_json(
        c,
        "POST",
        "/apis/apps/v1/namespaces/d/deployments",
        "application/json",
        &json!({"metadata": {"name": "x"}, "spec": {"replicas": "three"}}),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m
                .starts_with("Deployment in version \"v1\" cannot be handled as a Deployment: ")),
        "{body}"
    );

    // the kubeconfig is YAML with the CA and token
    let kc = env.server.kubeconfig("mgmt-a");
    assert!(kc.contains("current-context: mgmt-a"), "{kc}");
    assert!(kc.contains("certificate-authority-data:"), "{kc}");
    assert!(kc.contains(env.server.admin_token()), "{kc}");
}

#[tokio::test]
async fn foreground_deletion_waits_for_dependents() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "fg").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "fg");
    let owner = cms
        .create(&PostParams::default(), &cm("owner", json!({})))
        .await
        .expect("owner");
    let uid = owner.metadata.uid.clone().expect("uid");
    let dep: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dep", "finalizers": ["example.com/hold"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "blockOwnerDeletion": true}]}})).expect("cm");
    cms.create(&PostParams::default(), &dep)
        .await
        .expect("dependent");
    let (code, body) = raw_json(
        c,
        "DELETE",
        "/api/v1/namespaces/fg/configmaps/owner",
        "application/json",
        &json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
    assert!(body["metadata"]["deletionTimestamp"].is_string());
    // the dependent is being deleted, held by its finalizer; the owner waits for it
    eventually("dependent marked for deletion", || async {
        cms.get("dep")
            .await
            .ok()
            .and_then(|d| d.metadata.deletion_timestamp)
            .map(|_| ())
    })
    .await;
    assert!(cms.get_opt("owner").await.expect("get").is_some());
    cms.patch(
        "dep",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
    eventually("owner removed", || async {
        cms.get_opt("owner")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn watch_bookmarks_carry_the_current_revision() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "bm").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "bm");
    let rv = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut stream = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    cms.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .expect("create");
    let mut added_rv = None;
    loop {
        match stream.try_next().await.expect("event").expect("open") {
            WatchEvent::Added(o) => added_rv = o.metadata.resource_version,
            WatchEvent::Bookmark(b) => {
                let added: i64 = added_rv
                    .as_deref()
                    .expect("ADDED before BOOKMARK")
                    .parse()
                    .expect("rv");
                let bm: i64 = b.metadata.resource_version.parse().expect("bookmark rv");
                assert!(
                    bm >= added,
                    "bookmark {bm} older than the ADDED event {added}"
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// The route table keeps the path grammar the emulator has always read:
/// empty segments and a trailing slash are ignored, `namespaces/{name}/status`
/// is the namespace's subresource, reviews own every path below their group
/// version, and each miss is a Status (404 after authentication, 405 for a
/// method the path does not take).
#[tokio::test]
async fn routes_follow_the_kubernetes_path_grammar() {
    let env = start(vec![]).await;
    let c = &env.client;
    let get = |path: &'static str| raw(c, "GET", path, "application/json", None);
    let not_found = "the server could not find the requested resource";
    let not_allowed = "the server does not allow this method on the requested resource";

    let (code, list, _) = get("/api/v1/namespaces/").await;
    assert_eq!((code, list["kind"].as_str()), (200, Some("NamespaceList")), "{list}");
    let (code, ns, _) = get("/api/v1//namespaces/default").await;
    assert_eq!((code, ns["kind"].as_str()), (200, Some("Namespace")), "{ns}");
    let (code, ns, _) = get("/api/v1/namespaces/default/status").await;
    assert_eq!((code, ns["metadata"]["name"].as_str()), (200, Some("default")), "{ns}");
    let (code, cms, _) = get("/api/v1/namespaces/default/configmaps").await;
    assert_eq!((code, cms["kind"].as_str()), (200, Some("ConfigMapList")), "{cms}");
    let (code, cms, _) = get("/apis/apps/v1/deployments").await;
    assert_eq!((code, cms["kind"].as_str()), (200, Some("DeploymentList")), "{cms}");
    let (code, ok, _) = get("/healthz/").await;
    assert_eq!((code, ok), (200, Value::Null));
    let (code, _, _) = raw(c, "POST", "/livez", "application/json", None).await;
    assert_eq!(code, 200);
    let (code, oa, _) = get("/openapi/v3/api/v1").await;
    assert_eq!(code, 200, "{oa}");
    let (code, rl, _) = get("/apis/authorization.k8s.io/v1").await;
    assert_eq!((code, rl["kind"].as_str()), (200, Some("APIResourceList")), "{rl}");

    for path in [
        "/nonsense",
        "/api/v2/pods",
        "/api/v1/namespaces/default/configmaps/a/b/c",
        "/api/v1/configmaps/a/b/c",
        "/api/v1/nonsense",
        "/apis/nonsense.example.com/v1/things",
        "/apis/authorization.k8s.io/v1/namespaces/default/nonsense",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews/a",
    ] {
        let (code, v, _) = raw(c, "GET", path, "application/json", None).await;
        assert_eq!(code, 404, "{path}: {v}");
        assert_status(&v, 404, "NotFound", not_found);
    }
    for (method, path) in [
        ("POST", "/api"),
        ("DELETE", "/apis"),
        ("PUT", "/apis/apps"),
        ("POST", "/api/v1"),
        ("GET", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
        ("PUT", "/api/v1/namespaces/default/configmaps"),
        ("GET", "/api/v1/namespaces/default/finalize"),
    ] {
        let (code, v, _) = raw(c, method, path, "application/json", None).await;
        assert_eq!(code, 405, "{method} {path}: {v}");
        assert_status(&v, 405, "MethodNotAllowed", not_allowed);
    }
    let (code, v) = reqwest_like_get(&env, "/nonsense", None).await;
    assert_eq!(code, 401, "{v}");
    assert_status(&v, 401, "Unauthorized", "Unauthorized");
}
