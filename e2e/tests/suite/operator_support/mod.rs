//! Shared fixture for the operator tests: a management-cluster emulator on a
//! real etcd with the HyperShift / CAPI CRDs, and the simulated operator.
#![allow(dead_code)]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use hcp_dr_e2e::apiserver::{ApiServer, ApiServerConfig};
use hcp_dr_e2e::operator::{EtcdInit, OidcConfig, Operator, OperatorConfig, Route53Config};
use hcp_dr_e2e::pki::{Ca, CertSpec};
use hcp_dr_e2e::procs::etcd::{ClientTls, EtcdProcess};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

pub const RELEASE: &str = "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64";
pub const HC_NS: &str = "clusters";

/// How long convergence may take before a wait gives up (a failure, not a
/// timing assertion: nothing checks how fast it converged).
pub const CONVERGE: Duration = Duration::from_secs(180);

pub struct Mgmt {
    pub operator: Option<Operator>,
    pub server: Option<ApiServer>,
    pub client: kube::Client,
    pub etcd: EtcdProcess,
    pub ca: Ca,
    pub sandbox_id: String,
    pub dir: tempfile::TempDir,
}

/// The CRDs ([`hcp_dr_e2e::crds::crd_dir`]: the real ones, else the
/// repository's `fixtures/crds`), with where they come from printed.
pub fn crd_dir() -> PathBuf {
    let (dir, from) = hcp_dr_e2e::crds::crd_dir();
    eprintln!("CRDs: {from}: {}", dir.display());
    dir
}

impl Mgmt {
    pub async fn start(cluster: &str) -> Mgmt {
        Mgmt::start_with(cluster, None).await
    }

    /// With external-dns writing into `route53`.
    pub async fn start_with(cluster: &str, route53: Option<Route53Config>) -> Mgmt {
        Mgmt::start_full(cluster, route53, None).await
    }

    /// With the operator's OIDC bucket `oidc`.
    pub async fn start_with_oidc(cluster: &str, oidc: OidcConfig) -> Mgmt {
        Mgmt::start_full(cluster, None, Some(oidc)).await
    }

    /// With the simulated HyperShift operator rendering `etcd_init`.
    pub async fn start_with_etcd_init(cluster: &str, etcd_init: EtcdInit) -> Mgmt {
        Mgmt::start_all(cluster, None, None, etcd_init).await
    }

    /// With external-dns writing into `route53` and the OIDC bucket `oidc`.
    pub async fn start_full(
        cluster: &str,
        route53: Option<Route53Config>,
        oidc: Option<OidcConfig>,
    ) -> Mgmt {
        Mgmt::start_all(cluster, route53, oidc, EtcdInit::default()).await
    }

    async fn start_all(
        cluster: &str,
        route53: Option<Route53Config>,
        oidc: Option<OidcConfig>,
        etcd_init: EtcdInit,
    ) -> Mgmt {
        let dir = tempfile::tempdir().expect("temp dir");
        let etcd = match EtcdProcess::start_plain(&dir.path().join("mgmt-etcd")).await {
            Ok(e) => e,
            Err(e) => panic!("starting etcd failed (install it: apt-get install etcd-server): {e}"),
        };
        let ca = Ca::new("hcp-dr-sandbox-ca").expect("sandbox CA");
        let server = ApiServer::start(ApiServerConfig {
            cluster_name: cluster.into(),
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            etcd_endpoints: vec![etcd.client_url()],
            etcd_tls: None,
            key_prefix: "/registry".into(),
            crd_dirs: vec![crd_dir()],
            ca: ca.clone(),
            tokens: vec![],
            faults_file: None,
            audit_log: None,
        })
        .await
        .expect("management API emulator starts");
        let client = server.client().await.expect("management client");
        let sandbox_id = uuid::Uuid::new_v4().to_string();
        hcp_dr_e2e::sandbox::install_priority_classes(&client).await.expect("HyperShift's PriorityClasses installed");
        let operator = Operator::start(OperatorConfig {
            kubeconfig_client: client.clone(),
            cluster_name: cluster.into(),
            state_dir: dir.path().join("operator"),
            ca: ca.clone(),
            sandbox_id: sandbox_id.clone(),
            route53,
            snapshot_ca_pem: None,
            cloud_dir: Some(dir.path().join("cloud")),
            oidc,
            controllers: Default::default(),
            etcd_init,
        })
        .await
        .expect("operator starts");
        Mgmt {
            operator: Some(operator),
            server: Some(server),
            client,
            etcd,
            ca,
            sandbox_id,
            dir,
        }
    }

    pub async fn stop(mut self) {
        if let Some(op) = self.operator.take() {
            op.shutdown().await;
        }
        if let Some(s) = self.server.take() {
            s.shutdown().await;
        }
    }

    pub fn api(
        &self,
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        ns: Option<&str>,
    ) -> Api<DynamicObject> {
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        match ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    pub fn hc_api(&self) -> Api<DynamicObject> {
        self.api(
            "hypershift.openshift.io",
            "v1beta1",
            "HostedCluster",
            "hostedclusters",
            Some(HC_NS),
        )
    }

    pub async fn get(&self, api: &Api<DynamicObject>, name: &str) -> Option<Value> {
        api.get_opt(name)
            .await
            .expect("GET")
            .map(|o| serde_json::to_value(o).expect("json"))
    }

    pub async fn create(&self, api: &Api<DynamicObject>, obj: Value) {
        let o: DynamicObject = serde_json::from_value(obj).expect("object");
        if let Err(e) = api.create(&PostParams::default(), &o).await {
            panic!("creating {:?}: {e}", o.metadata.name);
        }
    }

    pub async fn merge(&self, api: &Api<DynamicObject>, name: &str, patch: Value) {
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("merge patch");
    }

    /// Namespace, pull secret, encryption key, HostedCluster and NodePool.
    pub async fn create_hosted_cluster(
        &self,
        name: &str,
        policy: &str,
        nodes: u32,
        restore_url: Option<&str>,
    ) {
        let none = json!({"type": "None"});
        self.create_hosted_cluster_on(name, policy, nodes, restore_url, none.clone(), none)
            .await;
    }

    /// As [`Mgmt::create_hosted_cluster`] with the HC's and NodePool's `spec.platform`.
    pub async fn create_hosted_cluster_on(
        &self,
        name: &str,
        policy: &str,
        nodes: u32,
        restore_url: Option<&str>,
        platform: Value,
        np_platform: Value,
    ) {
        self.create_hosted_cluster_with(
            name,
            policy,
            nodes,
            restore_url,
            platform,
            np_platform,
            json!({}),
        )
        .await;
    }

    /// As [`Mgmt::create_hosted_cluster_on`], with the fields of `extra`'s
    /// `metadata` and `spec` set on the HostedCluster (e.g. `infraID`,
    /// `issuerURL`, `pausedUntil`, `finalizers`).
    #[allow(clippy::too_many_arguments)]
    pub async fn create_hosted_cluster_with(
        &self,
        name: &str,
        policy: &str,
        nodes: u32,
        restore_url: Option<&str>,
        platform: Value,
        np_platform: Value,
        extra: Value,
    ) {
        let ns_api = self.api("", "v1", "Namespace", "namespaces", None);
        if self.get(&ns_api, HC_NS).await.is_none() {
            self.create(
                &ns_api,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HC_NS}}),
            )
            .await;
        }
        let secrets = self.api("", "v1", "Secret", "secrets", Some(HC_NS));
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        self.create(&secrets, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-pull-secret")},
            "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": b64(br#"{"auths":{}}"#)}}))
            .await;
        self.create(&secrets, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-etcd-encryption-key")},
            "type": "Opaque", "data": {"key": b64(&[7u8; 32])}}))
            .await;
        let route = |svc: &str, host: &str| json!({"service": svc, "servicePublishingStrategy": {"type": "Route", "route": {"hostname": host}}});
        let mut storage = json!({"type": "PersistentVolume", "persistentVolume": {"size": "8Gi"}});
        if let Some(url) = restore_url {
            storage["restoreSnapshotURL"] = json!([url]);
        }
        let mut hc = json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
            "metadata": {"name": name, "namespace": HC_NS},
            "spec": {
                "release": {"image": RELEASE},
                "pullSecret": {"name": format!("{name}-pull-secret")},
                "networking": {"clusterNetwork": [{"cidr": "10.132.0.0/14"}], "serviceNetwork": [{"cidr": "172.31.0.0/16"}],
                    "networkType": "OVNKubernetes"},
                "platform": platform,
                "dns": {"baseDomain": "example.com"},
                "etcd": {"managementType": "Managed", "managed": {"storage": storage}},
                "services": [
                    route("APIServer", &format!("api.{name}.example.com")),
                    route("OAuthServer", &format!("oauth.{name}.example.com")),
                    route("Konnectivity", &format!("konnectivity.{name}.example.com")),
                    route("Ignition", &format!("ignition.{name}.example.com")),
                ],
                "secretEncryption": {"type": "aescbc", "aescbc": {"activeKey": {"name": format!("{name}-etcd-encryption-key")}}},
                "controllerAvailabilityPolicy": policy,
                "infrastructureAvailabilityPolicy": "SingleReplica",
            },
        });
        for part in ["metadata", "spec"] {
            if let Some(fields) = extra.get(part).and_then(Value::as_object) {
                for (k, v) in fields {
                    hc[part][k] = v.clone();
                }
            }
        }
        self.create(&self.hc_api(), hc).await;
        if nodes > 0 {
            let np_api = self.api(
                "hypershift.openshift.io",
                "v1beta1",
                "NodePool",
                "nodepools",
                Some(HC_NS),
            );
            self.create(&np_api, json!({
                "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool",
                "metadata": {"name": format!("{name}-workers"), "namespace": HC_NS},
                "spec": {"clusterName": name, "replicas": nodes, "management": {"upgradeType": "Replace"},
                    "platform": np_platform, "release": {"image": RELEASE}},
            }))
            .await;
        }
    }

    /// Wait until the HostedCluster's condition has `status`.
    pub async fn wait_condition(&self, name: &str, type_: &str, status: &str) -> Value {
        let api = self.hc_api();
        wait_for(
            &format!("HostedCluster {name} condition {type_}={status}"),
            || async {
                let hc = self.get(&api, name).await?;
                has_condition(&hc, type_, status).then_some(hc)
            },
        )
        .await
    }

    /// Client TLS for the etcd members of `hcp_ns`, verifying `server_name`.
    pub async fn etcd_tls(&self, hcp_ns: &str, server_name: &str) -> ClientTls {
        let secrets = self.api("", "v1", "Secret", "secrets", Some(hcp_ns));
        let cms = self.api("", "v1", "ConfigMap", "configmaps", Some(hcp_ns));
        let client = self
            .get(&secrets, "etcd-client-tls")
            .await
            .expect("etcd-client-tls");
        let ca = self.get(&cms, "etcd-ca").await.expect("etcd-ca");
        let dec = |v: &Value, k: &str| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(v["data"][k].as_str().expect("key"))
                    .expect("b64"),
            )
            .expect("utf8")
        };
        ClientTls {
            ca_pem: ca["data"]["ca.crt"].as_str().expect("ca.crt").to_string(),
            cert_pem: dec(&client, "etcd-client.crt"),
            key_pem: dec(&client, "etcd-client.key"),
            server_name: server_name.to_string(),
        }
    }

    /// The pod as JSON.
    pub async fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.get(&self.api("", "v1", "Pod", "pods", Some(ns)), name)
            .await
    }

    /// The hosted cluster's admin client, from Secret `<hc>-admin-kubeconfig`.
    pub async fn hosted_client(&self, hc: &str) -> kube::Client {
        let secrets = self.api("", "v1", "Secret", "secrets", Some(HC_NS));
        let secret = wait_for(&format!("Secret {hc}-admin-kubeconfig"), || async {
            self.get(&secrets, &format!("{hc}-admin-kubeconfig")).await
        })
        .await;
        let yaml = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(
                    secret["data"]["kubeconfig"]
                        .as_str()
                        .expect("kubeconfig key"),
                )
                .expect("base64"),
        )
        .expect("utf8");
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses");
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("kubeconfig usable");
        kube::Client::try_from(config).expect("hosted client")
    }
}

pub fn has_condition(obj: &Value, type_: &str, status: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == type_ && c["status"] == status)
        })
}

/// Poll `f` every 250 ms until it yields a value; panics after [`CONVERGE`].
pub async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("gave up waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A ConfigMap in the hosted cluster's `default` namespace.
pub async fn put_configmap(
    client: &kube::Client,
    name: &str,
    value: &str,
) -> Result<(), kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "default");
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"value": value}}))
            .expect("configmap");
    api.create(&PostParams::default(), &cm).await.map(|_| ())
}

pub async fn get_configmap(
    client: &kube::Client,
    name: &str,
) -> Result<Option<String>, kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "default");
    Ok(api
        .get_opt(name)
        .await?
        .and_then(|cm| cm.data.and_then(|d| d.get("value").cloned())))
}

/// Keys under `prefix` in the etcd member at `url`.
pub async fn etcd_keys(url: &str, tls: &ClientTls, prefix: &str) -> Result<Vec<String>, String> {
    let mut client = hcp_dr_e2e::procs::etcd::connect_client(&[url.to_string()], Some(tls))
        .await
        .map_err(|e| e.to_string())?;
    let resp = client
        .get(
            prefix,
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_serializable(),
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).to_string())
        .collect())
}

/// A one-file HTTPS server (cert from `ca`, SAN 127.0.0.1) serving `body` at
/// `/snapshot.db`; returns its URL and the server task.
pub async fn serve_snapshot(ca: &Ca, body: Vec<u8>) -> (String, tokio::task::JoinHandle<()>) {
    let pair = ca
        .issue(&CertSpec {
            common_name: "snapshot-server".into(),
            ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            dns_names: vec!["localhost".into()],
            server: true,
            ..Default::default()
        })
        .expect("server cert");
    let tls = hcp_dr_e2e::pki::server_tls_config(&pair, None).expect("tls config");
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let body = Arc::new(bytes::Bytes::from(body));
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let body = body.clone();
                        async move {
                            let resp = if req.uri().path() == "/snapshot.db" {
                                hyper::Response::new(http_body_util::Full::new((*body).clone()))
                            } else {
                                let mut r = hyper::Response::new(http_body_util::Full::new(
                                    bytes::Bytes::from_static(b"not found"),
                                ));
                                *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                                r
                            };
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("https://127.0.0.1:{port}/snapshot.db"), task)
}
