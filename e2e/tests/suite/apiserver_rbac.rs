//! Authentication and RBAC in the API emulator: ServiceAccount tokens from
//! the TokenRequest API, 401s, verb mapping, resourceNames, subresources,
//! Role vs ClusterRole bindings, the 403 `Status` bodies, impersonation, the
//! review APIs, the extra `create` a websocket port-forward needs, and the
//! real `kubectl` (`create token`, `auth can-i`, `auth whoami`, `get`) with
//! a token kubeconfig.

use crate::apiserver_support;

use std::path::Path;

use apiserver_support::{Env, assert_status, raw, raw_json, start};
use serde_json::{Value, json};

const SA_USER: &str = "system:serviceaccount:team:reader";
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

async fn post(client: &kube::Client, path: &str, body: Value) -> Value {
    let (code, v) = raw_json(client, "POST", path, "application/json", &body).await;
    assert!(code == 201 || code == 200, "POST {path}: {code} {v}");
    v
}

async fn put(client: &kube::Client, path: &str, body: Value) -> Value {
    let (code, v) = raw_json(client, "PUT", path, "application/json", &body).await;
    assert_eq!(code, 200, "PUT {path}: {v}");
    v
}

async fn get(client: &kube::Client, path: &str) -> (u16, Value) {
    let (code, v, _) = raw(client, "GET", path, "application/json", None).await;
    (code, v)
}

/// Namespaces `team` and `other`, ServiceAccount `team/reader`, ConfigMaps `cm1`/`cm2` in both.
async fn fixture(env: &Env) {
    for ns in ["team", "other"] {
        post(
            &env.client,
            "/api/v1/namespaces",
            json!({"metadata": {"name": ns}}),
        )
        .await;
        for cm in ["cm1", "cm2"] {
            post(
                &env.client,
                &format!("/api/v1/namespaces/{ns}/configmaps"),
                json!({"metadata": {"name": cm}, "data": {"k": "v"}}),
            )
            .await;
        }
    }
    post(
        &env.client,
        "/api/v1/namespaces/team/serviceaccounts",
        json!({"metadata": {"name": "reader"}}),
    )
    .await;
}

async fn token_for(env: &Env, ns: &str, sa: &str, spec: Value) -> String {
    let v = post(
        &env.client,
        &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
    )
    .await;
    v["status"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {v}"))
        .to_string()
}

async fn client_for(env: &Env, token: &str) -> kube::Client {
    env.server
        .client_with_token(token)
        .await
        .expect("token client")
}

fn role(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules})
}

fn binding(kind: &str, name: &str, role_kind: &str, role: &str, subjects: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}, "subjects": subjects})
}

fn reader_subject() -> Value {
    json!([{"kind": "ServiceAccount", "name": "reader", "namespace": "team"}])
}

#[tokio::test]
async fn service_account_tokens_authenticate_while_the_account_lives() {
    let env = start(vec![]).await;
    fixture(&env).await;

    let v = post(
        &env.client,
        "/api/v1/namespaces/team/serviceaccounts/reader/token",
        json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1", "spec": {}}),
    )
    .await;
    assert_eq!(v["kind"], "TokenRequest", "{v}");
    assert_eq!(v["spec"]["expirationSeconds"], 3600, "{v}");
    assert_eq!(v["spec"]["audiences"], json!([ISSUER]), "{v}");
    let issued = v["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(issued.split('.').count(), 3, "JWT-shaped: {issued}");
    let expires =
        chrono::DateTime::parse_from_rfc3339(v["status"]["expirationTimestamp"].as_str().unwrap())
            .unwrap();
    let left = expires.timestamp() - chrono::Utc::now().timestamp();
    assert!((3500..=3600).contains(&left), "expires in {left}s");

    let sa = client_for(&env, &issued).await;
    let who = post(
        &sa,
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    .await;
    let uid = get(
        &env.client,
        "/api/v1/namespaces/team/serviceaccounts/reader",
    )
    .await
    .1["metadata"]["uid"]
        .clone();
    assert_eq!(who["status"]["userInfo"]["username"], SA_USER, "{who}");
    assert_eq!(who["status"]["userInfo"]["uid"], uid, "{who}");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:team",
            "system:authenticated"
        ])
    );

    // not tokens: 401 with upstream's Status
    let mut tampered = issued.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    for bad in ["not-a-token", tampered.as_str()] {
        let c = client_for(&env, bad).await;
        let (code, v) = get(&c, "/api/v1/namespaces/team/configmaps").await;
        assert_eq!(code, 401, "{bad}: {v}");
        assert_status(&v, 401, "Unauthorized", "Unauthorized");
    }
    // a token for another audience is not for the API server
    let vault = token_for(&env, "team", "reader", json!({"audiences": ["vault"]})).await;
    assert_eq!(get(&client_for(&env, &vault).await, "/api").await.0, 401);

    // TokenRequest validation
    let (code, v) = raw_json(
        &env.client,
        "POST",
        "/api/v1/namespaces/team/serviceaccounts/reader/token",
        "application/json",
        &json!({"spec": {"expirationSeconds": 60}}),
    )
    .await;
    assert_eq!(code, 422, "{v}");
    assert_status(
        &v,
        422,
        "Invalid",
        "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes",
    );
    let (code, v) = raw_json(
        &env.client,
        "POST",
        "/api/v1/namespaces/team/serviceaccounts/nobody/token",
        "application/json",
        &json!({}),
    )
    .await;
    assert_eq!(code, 404, "{v}");
    assert_status(&v, 404, "NotFound", "serviceaccounts \"nobody\" not found");
    let (code, _, _) = raw(
        &env.client,
        "GET",
        "/api/v1/namespaces/team/serviceaccounts/reader/token",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 405);

    // a token bound to a Secret dies with it
    post(
        &env.client,
        "/api/v1/namespaces/team/secrets",
        json!({"metadata": {"name": "holder"}}),
    )
    .await;
    let bound = token_for(
        &env,
        "team",
        "reader",
        json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": "holder"}}),
    )
    .await;
    let bound_client = client_for(&env, &bound).await;
    assert_eq!(get(&bound_client, "/api").await.0, 200);
    let (code, _, _) = raw(
        &env.client,
        "DELETE",
        "/api/v1/namespaces/team/secrets/holder",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(get(&bound_client, "/api").await.0, 401);

    // deleting the ServiceAccount invalidates its tokens, also once one of the same name is back
    assert_eq!(get(&sa, "/api").await.0, 200);
    let (code, _, _) = raw(
        &env.client,
        "DELETE",
        "/api/v1/namespaces/team/serviceaccounts/reader",
        "application/json",
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(get(&sa, "/api").await.0, 401);
    post(
        &env.client,
        "/api/v1/namespaces/team/serviceaccounts",
        json!({"metadata": {"name": "reader"}}),
    )
    .await;
    assert_eq!(
        get(&sa, "/api").await.0,
        401,
        "a new account of the same name has another uid"
    );
    let fresh = token_for(&env, "team", "reader", json!({})).await;
    assert_eq!(get(&client_for(&env, &fresh).await, "/api").await.0, 200);

    // the admin is unaffected: everything, and the review of itself
    let who = post(
        &env.client,
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        json!({}),
    )
    .await;
    assert!(
        who["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters")),
        "{who}"
    );
}

#[tokio::test]
async fn verbs_map_like_the_real_api_server() {
    let env = start(vec![]).await;
    fixture(&env).await;
    let sa = client_for(&env, &token_for(&env, "team", "reader", json!({})).await).await;

    // without a binding: discovery only
    for path in [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps/v1",
        "/version",
        "/openapi/v3",
    ] {
        assert_eq!(get(&sa, path).await.0, 200, "{path}");
    }
    let (code, v) = get(&sa, "/metrics").await;
    assert_eq!(code, 403, "{v}");
    assert_status(
        &v,
        403,
        "Forbidden",
        &format!("forbidden: User \"{SA_USER}\" cannot get path \"/metrics\""),
    );
    let (code, v) = get(&sa, "/api/v1/namespaces/team/configmaps").await;
    assert_eq!(code, 403, "{v}");
    assert_status(
        &v,
        403,
        "Forbidden",
        &format!(
            "configmaps is forbidden: User \"{SA_USER}\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team\""
        ),
    );
    assert_eq!(v["details"], json!({"kind": "configmaps"}));

    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles",
        role("one-verb", json!([])),
    )
    .await;
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings",
        binding(
            "RoleBinding",
            "one-verb",
            "Role",
            "one-verb",
            reader_subject(),
        ),
    )
    .await;
    let cms = "/api/v1/namespaces/team/configmaps";
    let verbs = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    for granted in verbs {
        let mut r = role(
            "one-verb",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": [granted]}]),
        );
        let current = get(
            &env.client,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles/one-verb",
        )
        .await
        .1;
        r["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        put(
            &env.client,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles/one-verb",
            r,
        )
        .await;
        post(
            &env.client,
            cms,
            json!({"metadata": {"name": format!("victim-{granted}")}}),
        )
        .await;
        for verb in verbs {
            let (code, v) = match verb {
                "get" => get(&sa, &format!("{cms}/cm1")).await,
                "list" => get(&sa, cms).await,
                "watch" => get(&sa, &format!("{cms}?watch=true&timeoutSeconds=1")).await,
                "create" => {
                    raw_json(
                        &sa,
                        "POST",
                        cms,
                        "application/json",
                        &json!({"metadata": {"name": format!("made-{granted}")}}),
                    )
                    .await
                }
                "update" => {
                    raw_json(
                        &sa,
                        "PUT",
                        &format!("{cms}/cm1"),
                        "application/json",
                        &json!({"metadata": {"name": "cm1"}, "data": {"k": granted}}),
                    )
                    .await
                }
                "patch" => {
                    raw_json(
                        &sa,
                        "PATCH",
                        &format!("{cms}/cm1"),
                        "application/merge-patch+json",
                        &json!({"data": {"p": granted}}),
                    )
                    .await
                }
                "delete" => {
                    raw_json(
                        &sa,
                        "DELETE",
                        &format!("{cms}/victim-{granted}"),
                        "application/json",
                        &json!({}),
                    )
                    .await
                }
                _ => {
                    raw_json(
                        &sa,
                        "DELETE",
                        &format!("{cms}?labelSelector=nothing%3Dhere"),
                        "application/json",
                        &json!({}),
                    )
                    .await
                }
            };
            if verb == granted {
                assert!(
                    (200..300).contains(&code),
                    "{verb} with `{granted}` granted: {code} {v}"
                );
            } else {
                assert_eq!(code, 403, "{verb} with only `{granted}` granted: {v}");
                let needle = format!(
                    "cannot {verb} resource \"configmaps\" in API group \"\" in the namespace \"team\""
                );
                assert!(
                    v["message"].as_str().unwrap().contains(&needle),
                    "{verb}: {v}"
                );
            }
        }
    }

    // resourceNames: the named object only; a list only when a field selector pins the name
    let named = role(
        "named",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"], "resourceNames": ["cm1"]}]),
    );
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles",
        named,
    )
    .await;
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings",
        binding("RoleBinding", "named", "Role", "named", reader_subject()),
    )
    .await;
    assert_eq!(get(&sa, &format!("{cms}/cm1")).await.0, 200);
    let (code, v) = get(&sa, &format!("{cms}/cm2")).await;
    assert_eq!(code, 403);
    assert_status(
        &v,
        403,
        "Forbidden",
        &format!(
            "configmaps \"cm2\" is forbidden: User \"{SA_USER}\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"team\""
        ),
    );
    assert_eq!(v["details"], json!({"name": "cm2", "kind": "configmaps"}));
    assert_eq!(get(&sa, cms).await.0, 403);
    let (code, v) = get(&sa, &format!("{cms}?fieldSelector=metadata.name%3Dcm1")).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(
        get(&sa, &format!("{cms}?fieldSelector=metadata.name%3Dcm2"))
            .await
            .0,
        403
    );
}

#[tokio::test]
async fn subresources_and_binding_scopes() {
    let env = start(vec![]).await;
    fixture(&env).await;
    let sa = client_for(&env, &token_for(&env, "team", "reader", json!({})).await).await;
    let deploy = json!({"metadata": {"name": "d", "labels": {"app": "d"}}, "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    post(
        &env.client,
        "/apis/apps/v1/namespaces/team/deployments",
        deploy,
    )
    .await;

    // a subresource rule grants the subresource only, and the resource rule not the subresource
    post(&env.client, "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles", role("scaler", json!([{"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]}]))).await;
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings",
        binding("RoleBinding", "scaler", "Role", "scaler", reader_subject()),
    )
    .await;
    let d = "/apis/apps/v1/namespaces/team/deployments/d";
    assert_eq!(
        get(&sa, &format!("{d}/scale")).await.1["spec"]["replicas"],
        2
    );
    let (code, v) = raw_json(
        &sa,
        "PATCH",
        &format!("{d}/scale"),
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 0}}),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let (code, v) = raw_json(
        &sa,
        "PATCH",
        d,
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 1}}),
    )
    .await;
    assert_eq!(code, 403);
    assert_status(
        &v,
        403,
        "Forbidden",
        &format!(
            "deployments.apps \"d\" is forbidden: User \"{SA_USER}\" cannot patch resource \"deployments\" in API group \"apps\" in the namespace \"team\""
        ),
    );
    assert_eq!(
        v["details"],
        json!({"name": "d", "group": "apps", "kind": "deployments"})
    );
    let (code, v) = get(&sa, &format!("{d}/status")).await;
    assert_eq!(code, 403);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("cannot get resource \"deployments/status\" in API group \"apps\""),
        "{v}"
    );

    // a ClusterRole through a RoleBinding: that namespace only; through a ClusterRoleBinding: everywhere
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "cm-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]}),
    )
    .await;
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings",
        binding(
            "RoleBinding",
            "cm-reader",
            "ClusterRole",
            "cm-reader",
            reader_subject(),
        ),
    )
    .await;
    assert_eq!(get(&sa, "/api/v1/namespaces/team/configmaps").await.0, 200);
    let (code, v) = get(&sa, "/api/v1/namespaces/other/configmaps").await;
    assert_eq!(code, 403);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .ends_with("in the namespace \"other\""),
        "{v}"
    );
    let (code, v) = get(&sa, "/api/v1/configmaps").await;
    assert_eq!(code, 403);
    assert_status(
        &v,
        403,
        "Forbidden",
        &format!(
            "configmaps is forbidden: User \"{SA_USER}\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope"
        ),
    );
    // a namespace is in its own namespace: the RoleBinding in team grants `get namespaces/team`
    assert_eq!(get(&sa, "/api/v1/namespaces/team").await.0, 200);
    assert_eq!(get(&sa, "/api/v1/namespaces/other").await.0, 403);

    // a ClusterRoleBinding to the account's group
    post(&env.client, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        binding("ClusterRoleBinding", "team-cm-reader", "ClusterRole", "cm-reader", json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:serviceaccounts:team"}]))).await;
    assert_eq!(get(&sa, "/api/v1/namespaces/other/configmaps").await.0, 200);
    assert_eq!(get(&sa, "/api/v1/configmaps").await.0, 200);
    assert_eq!(get(&sa, "/api/v1/namespaces/other").await.0, 200);

    // a binding to a role that does not exist says so in the refusal
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        binding(
            "ClusterRoleBinding",
            "ghostly",
            "ClusterRole",
            "ghost",
            reader_subject(),
        ),
    )
    .await;
    let (code, v) = get(&sa, "/api/v1/nodes").await;
    assert_eq!(code, 403);
    assert_status(
        &v,
        403,
        "Forbidden",
        &format!(
            "nodes is forbidden: User \"{SA_USER}\" cannot list resource \"nodes\" in API group \"\" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io \"ghost\" not found"
        ),
    );

    // the bootstrap policy is there, as on every cluster
    let (code, v) = get(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/system:discovery",
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["subjects"][0]["name"], "system:authenticated");
}

/// A raw request with extra headers; (status, JSON body).
async fn with_headers(
    client: &kube::Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut req = axum::http::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .send(req.body(kube::client::Body::empty()).unwrap())
        .await
        .expect("request sent");
    let code = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn impersonation_reviews_and_port_forward() {
    let env = start(vec![]).await;
    fixture(&env).await;
    let sa = client_for(&env, &token_for(&env, "team", "reader", json!({})).await).await;
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles",
        role(
            "pf",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]),
        ),
    )
    .await;
    post(
        &env.client,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings",
        binding("RoleBinding", "pf", "Role", "pf", reader_subject()),
    )
    .await;

    // the admin acting as the account gets the account's answers
    let as_sa = [("Impersonate-User", SA_USER)];
    assert_eq!(
        with_headers(
            &env.client,
            "GET",
            "/api/v1/namespaces/team/configmaps",
            &as_sa
        )
        .await
        .0,
        200
    );
    let (code, v) = with_headers(
        &env.client,
        "GET",
        "/api/v1/namespaces/team/secrets",
        &as_sa,
    )
    .await;
    assert_eq!(code, 403);
    assert!(
        v["message"].as_str().unwrap().contains(&format!(
            "User \"{SA_USER}\" cannot list resource \"secrets\""
        )),
        "{v}"
    );
    // the account may not impersonate
    let (code, v) = with_headers(
        &sa,
        "GET",
        "/api/v1/namespaces/team/configmaps",
        &[(
            "Impersonate-User",
            "system:serviceaccount:kube-system:admin",
        )],
    )
    .await;
    assert_eq!(code, 403);
    assert_status(
        &v,
        403,
        "Forbidden",
        &format!(
            "serviceaccounts \"admin\" is forbidden: User \"{SA_USER}\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"kube-system\""
        ),
    );

    // SelfSubjectAccessReview and SubjectAccessReview
    let ssar = |verb: &str, resource: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": "team", "verb": verb, "resource": resource}}})
    };
    let yes = post(
        &sa,
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        ssar("list", "configmaps"),
    )
    .await;
    assert_eq!(yes["status"]["allowed"], true, "{yes}");
    assert_eq!(
        yes["status"]["reason"],
        "RBAC: allowed by RoleBinding \"pf/team\" of Role \"pf\" to ServiceAccount \"reader/team\""
    );
    let no = post(
        &sa,
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        ssar("delete", "configmaps"),
    )
    .await;
    assert_eq!(no["status"]["allowed"], false, "{no}");
    let sar = post(
        &env.client,
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        json!({"spec": {"user": SA_USER, "groups": ["system:serviceaccounts"],
        "resourceAttributes": {"namespace": "team", "verb": "list", "resource": "configmaps"}}}),
    )
    .await;
    assert_eq!(sar["status"]["allowed"], true, "{sar}");
    let (code, _) = raw_json(
        &sa,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "application/json",
        &json!({"spec": {"user": "x", "nonResourceAttributes": {"path": "/", "verb": "get"}}}),
    )
    .await;
    assert_eq!(code, 403, "only the self reviews are for everyone");

    // port-forward over a websocket upgrade needs get and create on pods/portforward
    post(&env.client, "/api/v1/namespaces/team/pods", json!({"metadata": {"name": "etcd-0"}, "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}})).await;
    let upgrade = [
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-protocol", "v4.channel.k8s.io"),
    ];
    let pf = "/api/v1/namespaces/team/pods/etcd-0/portforward?ports=2379";
    for (verbs, missing) in [
        (json!(["create"]), Some("get")),
        (json!(["get"]), Some("create")),
        (json!(["get", "create"]), None),
    ] {
        let current = get(
            &env.client,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles/pf",
        )
        .await
        .1;
        let mut r = role(
            "pf",
            json!([{"apiGroups": [""], "resources": ["pods/portforward"], "verbs": verbs}]),
        );
        r["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        put(
            &env.client,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team/roles/pf",
            r,
        )
        .await;
        let (code, v) = with_headers(&sa, "GET", pf, &upgrade).await;
        match missing {
            Some(verb) => {
                assert_eq!(code, 403, "{verbs}: {v}");
                assert_status(
                    &v,
                    403,
                    "Forbidden",
                    &format!(
                        "pods \"etcd-0\" is forbidden: User \"{SA_USER}\" cannot {verb} resource \"pods/portforward\" in API group \"\" in the namespace \"team\""
                    ),
                );
            }
            None => {
                // authorized: the emulator goes on to the pod, which has no IP yet
                assert_eq!(code, 400, "{v}");
                assert!(
                    v["message"]
                        .as_str()
                        .unwrap()
                        .contains("does not have an IP address"),
                    "{v}"
                );
            }
        }
    }
}

struct Kubectl<'a> {
    kubeconfig: &'a Path,
    cache: &'a Path,
}

impl Kubectl<'_> {
    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .await
            .unwrap_or_else(|e| panic!("kubectl not found ({e}): install kubectl v1.32 (https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubectl into /usr/local/bin)"));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.run(args).await;
        assert_eq!(code, 0, "kubectl {args:?}: {stderr}\n{stdout}");
        stdout
    }
}

#[tokio::test]
async fn kubectl_with_a_service_account_token() {
    let env = start(vec![]).await;
    fixture(&env).await;
    let cache = env.dir.path().join("kube-cache");
    let admin_kc = env.dir.path().join("admin.kubeconfig");
    env.server
        .write_kubeconfig(&admin_kc, "admin")
        .expect("kubeconfig");
    let admin = Kubectl {
        kubeconfig: &admin_kc,
        cache: &cache,
    };
    admin
        .ok(&[
            "create",
            "role",
            "cm-reader",
            "-n",
            "team",
            "--verb=get,list",
            "--resource=configmaps",
        ])
        .await;
    admin
        .ok(&[
            "create",
            "rolebinding",
            "cm-reader",
            "-n",
            "team",
            "--role=cm-reader",
            "--serviceaccount=team:reader",
        ])
        .await;

    let token = admin
        .ok(&["create", "token", "reader", "-n", "team", "--duration=20m"])
        .await
        .trim()
        .to_string();
    assert_eq!(token.split('.').count(), 3, "{token}");
    let (code, _, stderr) = admin
        .run(&["create", "token", "reader", "-n", "team", "--duration=1m"])
        .await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("may not specify a duration less than 10 minutes"),
        "{stderr}"
    );

    let sa_kc = env.dir.path().join("reader.kubeconfig");
    std::fs::write(
        &sa_kc,
        env.server.kubeconfig_with_token("reader", "reader", &token),
    )
    .unwrap();
    let sa = Kubectl {
        kubeconfig: &sa_kc,
        cache: &cache,
    };
    let who: Value = serde_json::from_str(&sa.ok(&["auth", "whoami", "-o", "json"]).await).unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], SA_USER, "{who}");

    assert_eq!(
        sa.ok(&["auth", "can-i", "list", "configmaps", "-n", "team"])
            .await
            .trim(),
        "yes"
    );
    let (code, stdout, _) = sa
        .run(&["auth", "can-i", "delete", "configmaps", "-n", "team"])
        .await;
    assert_eq!((code, stdout.trim()), (1, "no"));
    let (code, stdout, _) = sa
        .run(&["auth", "can-i", "list", "configmaps", "-n", "other"])
        .await;
    assert_eq!((code, stdout.trim()), (1, "no"));
    let rules = sa.ok(&["auth", "can-i", "--list", "-n", "team"]).await;
    assert!(
        rules
            .lines()
            .any(|l| l.starts_with("configmaps ") && l.contains("[get list]")),
        "{rules}"
    );
    // the admin asks about the account by impersonating it
    assert_eq!(
        admin
            .ok(&[
                "auth",
                "can-i",
                "list",
                "configmaps",
                "-n",
                "team",
                &format!("--as={SA_USER}")
            ])
            .await
            .trim(),
        "yes"
    );
    let (code, stdout, _) = admin
        .run(&[
            "auth",
            "can-i",
            "get",
            "secrets",
            "-n",
            "team",
            &format!("--as={SA_USER}"),
        ])
        .await;
    assert_eq!((code, stdout.trim()), (1, "no"));

    let names = sa
        .ok(&["get", "configmaps", "-n", "team", "-o", "name"])
        .await;
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        ["configmap/cm1", "configmap/cm2"]
    );
    let (code, _, stderr) = sa.run(&["get", "configmaps", "-n", "other"]).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains(&format!("Error from server (Forbidden): configmaps is forbidden: User \"{SA_USER}\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"other\"")),
        "{stderr}"
    );
    let (code, _, stderr) = sa.run(&["delete", "configmap", "cm1", "-n", "team"]).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("cannot delete resource \"configmaps\""),
        "{stderr}"
    );
    admin.ok(&["get", "configmap", "cm1", "-n", "team"]).await;
}
