//! Custom resources through the emulator: CRD registration, schema
//! defaulting/pruning/validation, status and scale subresources, the real
//! HyperShift CRDs when they are present ([`hcp_dr_e2e::crds::real_crds`]).

use crate::apiserver_support;

use apiserver_support::{assert_status, eventually, raw, raw_json, shared_crds, start};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{Value, json};

fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}},
                "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}],
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["size"], "properties": {
                        "size": {"type": "string", "enum": ["S", "M", "L"]},
                        "replicas": {"type": "integer", "default": 1, "minimum": 0}}},
                    "status": {"type": "object", "properties": {"replicas": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}
    })
}

fn widget_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn mk_ns(client: &kube::Client, name: &str) {
    let (code, body) = raw_json(
        client,
        "POST",
        "/api/v1/namespaces",
        "application/json",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
}

#[tokio::test]
async fn crd_lifecycle_schema_status_and_scale() {
    let env = start(vec![]).await;
    let c = &env.client;
    mk_ns(c, "w").await;
    let (code, crd) = raw_json(
        c,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        "application/json",
        &widget_crd(),
    )
    .await;
    assert_eq!(code, 201, "{crd}");
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "Widget");
    let established = crd["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .any(|c| c["type"] == "Established" && c["status"] == "True");
    assert!(established, "{crd}");

    // discovery shows the new resource and its subresources
    let (_, rl, _) = raw(c, "GET", "/apis/example.com/v1", "application/json", None).await;
    let names: Vec<&str> = rl["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, vec!["widgets", "widgets/status", "widgets/scale"]);

    let widgets = widget_api(c, "w");
    // create: defaults applied, status dropped
    let (code, w) = raw_json(c, "POST", "/apis/example.com/v1/namespaces/w/widgets", "application/json",
        &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"}, "spec": {"size": "M"}, "status": {"replicas": 5}})).await;
    assert_eq!(code, 201, "{w}");
    assert_eq!(w["spec"]["replicas"], 1);
    assert!(w.get("status").is_none(), "{w}");
    assert_eq!(w["metadata"]["generation"], 1);

    // schema validation -> 422 with causes
    let (code, body) = raw_json(c, "POST", "/apis/example.com/v1/namespaces/w/widgets", "application/json",
        &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "bad"}, "spec": {"size": "XL"}})).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["kind"], "Widget");
    assert_eq!(body["details"]["group"], "example.com");
    assert_eq!(body["details"]["causes"][0]["field"], "spec.size");
    assert_eq!(
        body["details"]["causes"][0]["reason"],
        "FieldValueNotSupported"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| m.starts_with(
            "Widget.example.com \"bad\" is invalid: spec.size: Unsupported value: \"XL\""
        )),
        "{body}"
    );

    // unknown fields: Strict -> 400, Warn (default) -> Warning header and pruned
    let (code, body) = raw_json(c, "POST", "/apis/example.com/v1/namespaces/w/widgets?fieldValidation=Strict", "application/json",
        &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "strict"}, "spec": {"size": "S", "foo": 1}})).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["reason"], "BadRequest");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown field \"spec.foo\"")),
        "{body}"
    );
    let (code, body, headers) = raw(c, "POST", "/apis/example.com/v1/namespaces/w/widgets", "application/json",
        Some(serde_json::to_vec(&json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "warn"}, "spec": {"size": "S", "foo": 1}})).expect("json"))).await;
    assert_eq!(code, 201);
    assert!(body["spec"].get("foo").is_none());
    let warning = headers
        .get("warning")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert_eq!(warning, "299 - \"unknown field \\\"spec.foo\\\"\"");

    // PUT without resourceVersion is rejected for custom resources
    let (code, body) = raw_json(c, "PUT", "/apis/example.com/v1/namespaces/w/widgets/a", "application/json",
        &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"}, "spec": {"size": "L"}})).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["details"]["causes"][0]["field"],
        "metadata.resourceVersion"
    );

    // strategic merge patch is not supported for custom resources
    let (code, body) = raw_json(
        c,
        "PATCH",
        "/apis/example.com/v1/namespaces/w/widgets/a",
        "application/strategic-merge-patch+json",
        &json!({"spec": {"size": "L"}}),
    )
    .await;
    assert_eq!(code, 415);
    assert_eq!(body["reason"], "UnsupportedMediaType");

    // status subresource semantics and generation
    let p = widgets
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": "L"}, "status": {"replicas": 3}})),
        )
        .await
        .expect("patch");
    assert_eq!(p.metadata.generation, Some(2));
    assert!(
        p.data.get("status").is_none(),
        "status ignored on the main resource: {:?}",
        p.data
    );
    let p = widgets
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"size": "S"}, "status": {"replicas": 3, "selector": "app=w"}}),
            ),
        )
        .await
        .expect("status");
    assert_eq!(p.data["status"]["replicas"], 3);
    assert_eq!(p.data["spec"]["size"], "L");
    assert_eq!(p.metadata.generation, Some(2));

    // scale subresource from the CRD's paths
    let (code, s, _) = raw(
        c,
        "GET",
        "/apis/example.com/v1/namespaces/w/widgets/a/scale",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(s["spec"]["replicas"], 1);
    assert_eq!(s["status"], json!({"replicas": 3, "selector": "app=w"}));
    let (code, s) = raw_json(
        c,
        "PATCH",
        "/apis/example.com/v1/namespaces/w/widgets/a/scale",
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 4}}),
    )
    .await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(
        widgets.get("a").await.expect("get").data["spec"]["replicas"],
        4
    );

    // Table with printer columns
    let req = axum::http::Request::builder()
        .method("GET")
        .uri("/apis/example.com/v1/namespaces/w/widgets")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(kube::client::Body::empty())
        .expect("req");
    let resp = c.send(req).await.expect("table");
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    let table: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(table["kind"], "Table");
    let cols: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("cols")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(cols, vec!["Name", "Replicas"]);

    // kubectl get -w asks for Table events: each event object is a one-row Table
    let req = axum::http::Request::builder()
        .method("GET")
        .uri("/apis/example.com/v1/namespaces/w/widgets?watch=1&timeoutSeconds=1&fieldSelector=metadata.name%3Da")
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
        .body(kube::client::Body::empty())
        .expect("req");
    let resp = c.send(req).await.expect("table watch");
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    let event: Value = serde_json::from_slice(&bytes).expect("one event line");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["kind"], "Table");
    assert_eq!(event["object"]["rows"][0]["cells"][0], "a");

    // deleting the CRD removes its objects and unregisters the resource
    let (code, _, _) = raw(
        c,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    eventually("CRD gone", || async {
        let (code, _, _) = raw(
            c,
            "GET",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
            "application/json",
            None,
        )
        .await;
        (code == 404).then_some(())
    })
    .await;
    let (code, _, _) = raw(
        c,
        "GET",
        "/apis/example.com/v1/namespaces/w/widgets",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 404);
    let mut etcd = etcd_client::Client::connect([env.etcd.client_url()], None)
        .await
        .expect("etcd");
    let left = etcd
        .get(
            "/registry/example.com/widgets/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .expect("get");
    assert_eq!(left.count(), 0);
}

fn hosted_cluster(name: &str, restore: Option<&str>) -> Value {
    let mut storage = json!({"type": "PersistentVolume", "persistentVolume": {"size": "8Gi"}});
    if let Some(u) = restore {
        storage["restoreSnapshotURL"] = json!([u]);
    }
    let svc = |s: &str| json!({"service": s, "servicePublishingStrategy": {"type": "Route"}});
    json!({
        "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": name, "namespace": "clusters"},
        "spec": {
            "release": {"image": "quay.io/openshift-release-dev/ocp-release:4.17.0-multi"},
            "pullSecret": {"name": format!("{name}-pull-secret")},
            "platform": {"type": "None"},
            "networking": {"networkType": "OVNKubernetes", "clusterNetwork": [{"cidr": "10.132.0.0/14"}], "serviceNetwork": [{"cidr": "172.31.0.0/16"}]},
            "etcd": {"managementType": "Managed", "managed": {"storage": storage}},
            "services": [svc("APIServer"), svc("OAuthServer"), svc("Konnectivity"), svc("Ignition")]
        }
    })
}

#[tokio::test]
async fn hosted_cluster_with_real_crds() {
    let Some(crds) = shared_crds() else { return };
    let env = start(vec![crds]).await;
    let c = &env.client;
    mk_ns(c, "clusters").await;
    let base = "/apis/hypershift.openshift.io/v1beta1/namespaces/clusters/hostedclusters";

    let (code, hc) = raw_json(
        c,
        "POST",
        base,
        "application/json",
        &hosted_cluster("demo", Some("s3://bucket/snap.db")),
    )
    .await;
    assert_eq!(code, 201, "{hc}");
    assert_eq!(hc["kind"], "HostedCluster");
    assert_eq!(hc["metadata"]["generation"], 1);

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("hypershift.openshift.io", "v1beta1", "HostedCluster"),
        "hostedclusters",
    );
    let hcs: Api<DynamicObject> = Api::namespaced_with(c.clone(), "clusters", &ar);
    let all: Api<DynamicObject> = Api::all_with(c.clone(), &ar);
    assert_eq!(
        all.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );

    // pause with a deadline, merge patch
    let p = hcs
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pausedUntil": "2030-01-01T00:00:00Z"}})),
        )
        .await
        .expect("pause");
    assert_eq!(p.data["spec"]["pausedUntil"], "2030-01-01T00:00:00Z");
    // json patch
    let ops = serde_json::from_value(
        json!([{"op": "replace", "path": "/spec/pausedUntil", "value": "true"}]),
    )
    .expect("ops");
    let p = hcs
        .patch("demo", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .expect("json patch");
    assert_eq!(p.data["spec"]["pausedUntil"], "true");
    // server-side apply
    let ssa = PatchParams::apply("hcp-dr").force();
    let p = hcs
        .patch(
            "demo",
            &ssa,
            &Patch::Apply(
                json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": "demo", "annotations": {"hcp-dr/backup": "b1"}}}),
            ),
        )
        .await
        .expect("apply");
    assert_eq!(
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("hcp-dr/backup"))
            .map(String::as_str),
        Some("b1")
    );
    // strategic merge: 415 for custom resources
    let (code, body) = raw_json(
        c,
        "PATCH",
        &format!("{base}/demo"),
        "application/strategic-merge-patch+json",
        &json!({"spec": {}}),
    )
    .await;
    assert_eq!(code, 415);
    assert_status(
        &body,
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
    );

    // an invalid pausedUntil -> 422 with the CRD's CEL message
    let (code, body) = raw_json(
        c,
        "PATCH",
        &format!("{base}/demo"),
        "application/merge-patch+json",
        &json!({"spec": {"pausedUntil": "soon"}}),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["name"], "demo");
    assert_eq!(body["details"]["group"], "hypershift.openshift.io");
    assert_eq!(body["details"]["kind"], "HostedCluster");
    assert_eq!(body["details"]["causes"][0]["field"], "spec.pausedUntil");
    let msg = body["message"].as_str().unwrap_or_default();
    assert!(msg.starts_with("HostedCluster.hypershift.openshift.io \"demo\" is invalid: spec.pausedUntil: Invalid value: "), "{msg}");
    assert!(
        msg.contains(
            "PausedUntil must be a date in RFC3339 format or 'True', 'true', 'False' or 'false'"
        ),
        "{msg}"
    );

    // restoreSnapshotURL is immutable
    let (code, body) = raw_json(c, "PATCH", &format!("{base}/demo"), "application/merge-patch+json",
        &json!({"spec": {"etcd": {"managed": {"storage": {"restoreSnapshotURL": ["s3://bucket/other.db"]}}}}})).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["details"]["causes"][0]["field"],
        "spec.etcd.managed.storage.restoreSnapshotURL"
    );
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("restoreSnapshotURL is immutable")),
        "{body}"
    );

    // a missing required field on create
    let mut bad = hosted_cluster("bad", None);
    bad["spec"].as_object_mut().expect("spec").remove("release");
    let (code, body) = raw_json(c, "POST", base, "application/json", &bad).await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["details"]["causes"]
            .as_array()
            .expect("causes")
            .iter()
            .any(|c| c["field"] == "spec.release" && c["reason"] == "FieldValueRequired"),
        "{body}"
    );

    // stale resourceVersion -> 409 with the qualified resource name
    let cur = hcs.get("demo").await.expect("get");
    let mut stale = serde_json::to_value(&cur).expect("json");
    stale["metadata"]["resourceVersion"] = json!("1");
    let (code, body) = raw_json(
        c,
        "PUT",
        &format!("{base}/demo"),
        "application/json",
        &stale,
    )
    .await;
    assert_eq!(code, 409);
    assert_status(
        &body,
        409,
        "Conflict",
        "Operation cannot be fulfilled on hostedclusters.hypershift.openshift.io \"demo\": the object has been modified; please apply your changes to the latest version and try again",
    );

    // not found wording
    let (code, body, _) = raw(c, "GET", &format!("{base}/nope"), "application/json", None).await;
    assert_eq!(code, 404);
    assert_status(
        &body,
        404,
        "NotFound",
        "hostedclusters.hypershift.openshift.io \"nope\" not found",
    );

    // a finalizer holds deletion until removed
    hcs.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["hypershift.openshift.io/finalizer"]}})),
    )
    .await
    .expect("finalizer");
    hcs.delete("demo", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        hcs.get("demo")
            .await
            .expect("held")
            .metadata
            .deletion_timestamp
            .is_some()
    );
    hcs.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
    assert!(hcs.get_opt("demo").await.expect("get").is_none());

    // NodePool CRD from the same directory is served too
    let (code, _, _) = raw(
        c,
        "GET",
        "/apis/hypershift.openshift.io/v1beta1/namespaces/clusters/nodepools",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
}

/// The `platform/` CRDs beside the real ones are served too, except the
/// Route CRD: Routes are built in, and stay so.
#[tokio::test]
async fn platform_crds_are_served_except_built_in_groups() {
    let Some(crds) = shared_crds() else { return };
    if !crds.join(hcp_dr_e2e::crds::PLATFORM_DIR).is_dir() {
        eprintln!(
            "SKIP: {} has no platform/ subdirectory; the platform CRD case not run",
            crds.display()
        );
        return;
    }
    let env = start(vec![crds]).await;
    let c = &env.client;
    let crd =
        |name: &str| format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
    for name in [
        "agents.agent-install.openshift.io",
        "infraenvs.agent-install.openshift.io",
        "nmstateconfigs.agent-install.openshift.io",
        "baremetalhosts.metal3.io",
    ] {
        let (code, body, _) = raw(c, "GET", &crd(name), "application/json", None).await;
        assert_eq!(code, 200, "{name}: {body}");
    }
    let (code, _, _) = raw(
        c,
        "GET",
        &crd("routes.route.openshift.io"),
        "application/json",
        None,
    )
    .await;
    assert_eq!(
        code, 404,
        "the Route CRD is not registered over the built-in Routes"
    );
    let (_, rl, _) = raw(
        c,
        "GET",
        "/apis/metal3.io/v1alpha1",
        "application/json",
        None,
    )
    .await;
    let names: Vec<&str> = rl["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(names.contains(&"baremetalhosts/status"), "{rl}");
    let (code, rl, _) = raw(
        c,
        "GET",
        "/apis/route.openshift.io/v1",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200, "{rl}");
}
