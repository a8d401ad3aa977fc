//! Shared fixture for the API emulator tests: a real etcd in a temp dir and
//! an emulator on an ephemeral loopback port.
#![allow(dead_code)]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use hcp_dr_e2e::apiserver::{ApiServer, ApiServerConfig};
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::etcd::EtcdProcess;
use serde_json::Value;

pub struct Env {
    pub server: ApiServer,
    pub client: kube::Client,
    pub etcd: EtcdProcess,
    pub dir: tempfile::TempDir,
}

pub fn config(etcd: &EtcdProcess, crd_dirs: Vec<PathBuf>, port: u16) -> ApiServerConfig {
    ApiServerConfig {
        cluster_name: "mgmt-a".into(),
        bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port,
        etcd_endpoints: vec![etcd.client_url()],
        etcd_tls: None,
        key_prefix: "/registry".into(),
        crd_dirs,
        ca: Ca::new("hcp-dr-test-ca").expect("test CA"),
        tokens: vec![],
        faults_file: None,
        audit_log: None,
    }
}

pub async fn start(crd_dirs: Vec<PathBuf>) -> Env {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = match EtcdProcess::start_plain(dir.path()).await {
        Ok(e) => e,
        Err(e) => {
            panic!("starting etcd failed (is it installed? apt-get install etcd-server): {e}")
        }
    };
    let server = ApiServer::start(config(&etcd, crd_dirs, 0))
        .await
        .expect("emulator starts");
    let client = server.client().await.expect("kube client");
    Env {
        server,
        client,
        etcd,
        dir,
    }
}

/// The real CRDs ([`hcp_dr_e2e::crds::real_crds`]), or None with `SKIP:` printed.
pub fn shared_crds() -> Option<PathBuf> {
    hcp_dr_e2e::crds::real_crds_or_skip("the real-CRD cases")
}

/// A raw request; returns (status code, JSON body or Null, headers).
pub async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Option<Vec<u8>>,
) -> (u16, Value, axum::http::HeaderMap) {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(body.unwrap_or_default()))
        .expect("request");
    let resp = client.send(req).await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v, headers)
}

pub async fn raw_json(
    client: &kube::Client,
    method: &str,
    path: &str,
    ct: &str,
    body: &Value,
) -> (u16, Value) {
    let (c, v, _) = raw(
        client,
        method,
        path,
        ct,
        Some(serde_json::to_vec(body).expect("json")),
    )
    .await;
    (c, v)
}

/// Assert the shape of a failure `Status`.
pub fn assert_status(v: &Value, code: u16, reason: &str, message: &str) {
    assert_eq!(v["kind"], "Status", "not a Status: {v}");
    assert_eq!(v["apiVersion"], "v1", "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert_eq!(v["message"], message, "{v}");
}

/// Poll `f` until it returns Some; gives up (panics) after a generous bound so a broken
/// controller fails the test instead of hanging it.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    for _ in 0..600 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gave up waiting for: {what}");
}
