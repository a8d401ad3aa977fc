//! Injected API faults (`ApiServerConfig::faults_file`): the exact answers
//! of each kind seen by a plain HTTP client, that a faulted request is not
//! applied, the user-agent filter, the share, the log, watches, kubectl, and
//! `hcp-dr-sandbox faults`; and the audit log (`ApiServerConfig::audit_log`),
//! which records faulted answers like the others.

use crate::apiserver_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use apiserver_support::config;
use axum::http::HeaderMap;
use hcp_dr_e2e::apiserver::ApiServer;
use hcp_dr_e2e::apiserver::faults::{self, ApiFaults, FaultKind};
use hcp_dr_e2e::procs::etcd::EtcdProcess;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

struct Env {
    server: ApiServer,
    faults_file: PathBuf,
    dir: tempfile::TempDir,
    _etcd: EtcdProcess,
}

/// An emulator whose faults file is `DIR/state/api-faults.json`.
async fn start() -> Env {
    let dir = tempfile::tempdir().expect("temp dir");
    start_with(dir, None).await
}

async fn start_with(dir: tempfile::TempDir, faults_file: Option<PathBuf>) -> Env {
    let faults_file = faults_file.unwrap_or_else(|| dir.path().join("state").join(faults::API_FAULTS_FILE));
    let etcd = EtcdProcess::start_plain(&dir.path().join("etcd"))
        .await
        .unwrap_or_else(|e| panic!("starting etcd failed (apt-get install etcd-server): {e}"));
    let mut cfg = config(&etcd, vec![], 0);
    cfg.faults_file = Some(faults_file.clone());
    let server = ApiServer::start(cfg).await.expect("emulator starts");
    Env { server, faults_file, dir, _etcd: etcd }
}

fn set(env: &Env, faults: Option<&ApiFaults>) {
    faults::write_faults_file(&env.faults_file, faults).expect("write the faults file");
}

fn only(kind: FaultKind) -> ApiFaults {
    ApiFaults { share: 1.0, kinds: vec![kind], user_agent: None, delay_ms: 0, seed: None, unavailable_api_services: Vec::new() }
}

/// What a plain client saw: an answer, or an error of the connection.
#[derive(Debug)]
struct Answer {
    code: u16,
    headers: HeaderMap,
    body: Value,
}

#[derive(Clone, Copy, PartialEq)]
enum Proto {
    Http1,
    Http2,
}

fn tls_client(ca_pem: &str, proto: Proto) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in hcp_dr_e2e::pki::parse_certs(ca_pem).expect("CA certificate") {
        roots.add(cert).expect("add the CA");
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![match proto {
        Proto::Http1 => b"http/1.1".to_vec(),
        Proto::Http2 => b"h2".to_vec(),
    }];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// A new TLS connection to the emulator.
async fn connect(server: &ApiServer, proto: Proto) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let addr = server.url().trim_start_matches("https://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.expect("TCP connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("server name");
    tls_client(server.ca_pem(), proto).connect(name, tcp).await.expect("TLS handshake")
}

fn request(server: &ApiServer, method: &str, path: &str, user_agent: &str, body: Option<&Value>) -> axum::http::Request<String> {
    axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", server.url().trim_start_matches("https://"))
        .header("authorization", format!("Bearer {}", server.admin_token()))
        .header("user-agent", user_agent)
        .header("accept", "application/json")
        .header("content-type", "application/json")
        .body(body.map(|b| b.to_string()).unwrap_or_default())
        .expect("request")
}

async fn read(resp: hyper::Response<hyper::body::Incoming>) -> Answer {
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    Answer { code, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
}

/// One request on a new HTTP/1.1 connection.
async fn send(server: &ApiServer, method: &str, path: &str, user_agent: &str, body: Option<&Value>) -> Result<Answer, hyper::Error> {
    let io = hyper_util::rt::TokioIo::new(connect(server, Proto::Http1).await);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.expect("HTTP/1.1 handshake");
    tokio::spawn(conn);
    let resp = sender.send_request(request(server, method, path, user_agent, body)).await?;
    Ok(read(resp).await)
}

async fn get(server: &ApiServer, path: &str, user_agent: &str) -> Answer {
    send(server, "GET", path, user_agent, None).await.unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Assert a fault's `Status` body.
fn assert_status(a: &Answer, code: u16, reason: &str) {
    let v = &a.body;
    assert_eq!(a.code, code, "{a:?}");
    assert_eq!(a.headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/json"), "{a:?}");
    assert_eq!((v["kind"].as_str(), v["apiVersion"].as_str()), (Some("Status"), Some("v1")), "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
}

fn retry_after(a: &Answer) -> Option<&str> {
    a.headers.get("retry-after").and_then(|v| v.to_str().ok())
}

fn log(env: &Env) -> Vec<Value> {
    faults::read_log(&env.faults_file)
}

fn kinds_logged(env: &Env) -> Vec<String> {
    log(env).iter().map(|l| l["kind"].as_str().unwrap_or("?").to_string()).collect()
}

const NS: &str = "/api/v1/namespaces";
const CM: &str = "/api/v1/namespaces/default/configmaps";

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1"}})
}

#[tokio::test]
async fn error_answers_429_500_503_and_nothing_is_applied() {
    let env = start().await;
    let s = &env.server;
    assert!(!env.faults_file.exists());
    assert_eq!(get(s, NS, "test").await.code, 200, "no faults file: no faults");

    // 429: Retry-After and the max-in-flight filter's message
    set(&env, Some(&only(FaultKind::TooManyRequests)));
    let a = get(s, NS, "test/1").await;
    assert_status(&a, 429, "TooManyRequests");
    assert_eq!(retry_after(&a), Some("1"), "{a:?}");
    assert_eq!(a.body["message"], "Too many requests, please try again later.");
    assert_eq!(a.body["details"]["retryAfterSeconds"], 1, "{:?}", a.body);
    // decided before authentication: a request with a bad token gets the fault too
    let mut req = request(s, "GET", NS, "test/1", None);
    req.headers_mut().insert("authorization", "Bearer wrong".parse().unwrap());
    let io = hyper_util::rt::TokioIo::new(connect(s, Proto::Http1).await);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    assert_eq!(read(sender.send_request(req).await.unwrap()).await.code, 429);
    // probes and /version are never faulted
    for path in ["/healthz", "/readyz", "/livez", "/version", "/readyz/etcd"] {
        let a = get(s, path, "test/1").await;
        assert_ne!(a.code, 429, "{path}: {a:?}");
    }
    // a create that gets the fault is not applied
    let a = send(s, "POST", CM, "test/1", Some(&configmap("after-429"))).await.unwrap();
    assert_eq!(a.code, 429, "{a:?}");

    // 500: an etcd error, no Retry-After
    set(&env, Some(&only(FaultKind::InternalError)));
    let a = send(s, "POST", CM, "test/1", Some(&configmap("after-500"))).await.unwrap();
    assert_status(&a, 500, "InternalError");
    assert_eq!(retry_after(&a), None, "{a:?}");
    assert!(a.body["message"].as_str().unwrap().starts_with("Internal error occurred: "), "{:?}", a.body);

    // 503: Retry-After
    set(&env, Some(&only(FaultKind::Unavailable)));
    let a = send(s, "POST", CM, "test/1", Some(&configmap("after-503"))).await.unwrap();
    assert_status(&a, 503, "ServiceUnavailable");
    assert_eq!(retry_after(&a), Some("1"), "{a:?}");

    set(&env, None);
    for name in ["after-429", "after-500", "after-503"] {
        let a = get(s, &format!("{CM}/{name}"), "test/1").await;
        assert_eq!(a.code, 404, "{name} was applied although its request got a fault: {a:?}");
    }
    let lines = log(&env);
    assert_eq!(kinds_logged(&env), ["too-many-requests", "too-many-requests", "too-many-requests", "internal-error", "unavailable"], "{lines:?}");
    assert_eq!(lines[0], json!({"method": "GET", "path": NS, "user_agent": "test/1", "kind": "too-many-requests"}));
    assert_eq!(lines[4], json!({"method": "POST", "path": CM, "user_agent": "test/1", "kind": "unavailable"}));
}

#[tokio::test]
async fn audit_log_names_each_request_with_the_real_servers_verb_and_its_code() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = EtcdProcess::start_plain(&dir.path().join("etcd"))
        .await
        .unwrap_or_else(|e| panic!("starting etcd failed (apt-get install etcd-server): {e}"));
    let audit = dir.path().join("state/audit.log");
    let mut cfg = config(&etcd, vec![], 0);
    let faults_file = dir.path().join("state").join(faults::API_FAULTS_FILE);
    cfg.faults_file = Some(faults_file.clone());
    cfg.audit_log = Some(audit.clone());
    let s = ApiServer::start(cfg).await.expect("emulator starts");
    assert_eq!(get(&s, CM, "audit/1").await.code, 200);
    assert_eq!(send(&s, "POST", CM, "audit/1", Some(&configmap("logged"))).await.unwrap().code, 201);
    assert_eq!(get(&s, &format!("{CM}/logged"), "audit/1").await.code, 200);
    assert_eq!(get(&s, &format!("{CM}/missing"), "other/2").await.code, 404);
    faults::write_faults_file(&faults_file, Some(&only(FaultKind::Unavailable))).expect("faults");
    assert_eq!(send(&s, "DELETE", &format!("{CM}/logged"), "audit/1", None).await.unwrap().code, 503);
    faults::write_faults_file(&faults_file, None).expect("faults off");
    assert_eq!(send(&s, "DELETE", &format!("{CM}/logged"), "audit/1", None).await.unwrap().code, 200);
    assert_eq!(get(&s, "/version", "audit/1").await.code, 200);
    let events: Vec<Value> = std::fs::read_to_string(&audit)
        .expect("audit log written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect();
    let seen: Vec<(String, String, u64, String)> = events
        .iter()
        .map(|e| {
            assert_eq!((e["kind"].as_str(), e["apiVersion"].as_str(), e["level"].as_str()), (Some("Event"), Some("audit.k8s.io/v1"), Some("Metadata")), "{e}");
            (
                e["verb"].as_str().unwrap().to_string(),
                e["requestURI"].as_str().unwrap().to_string(),
                e["responseStatus"]["code"].as_u64().unwrap(),
                e["userAgent"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let obj = format!("{CM}/logged");
    let want: Vec<(String, String, u64, String)> = [
        ("list", CM, 200, "audit/1"),
        ("create", CM, 201, "audit/1"),
        ("get", obj.as_str(), 200, "audit/1"),
        ("get", &format!("{CM}/missing"), 404, "other/2"),
        ("delete", obj.as_str(), 503, "audit/1"),
        ("delete", obj.as_str(), 200, "audit/1"),
        ("get", "/version", 200, "audit/1"),
    ]
    .iter()
    .map(|(v, u, c, a)| (v.to_string(), u.to_string(), *c, a.to_string()))
    .collect();
    assert_eq!(seen, want);
}

/// The connection ended with no answer: closed before a response (or,
/// through TLS, without close_notify), or reset.
fn closed(err: &hyper::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, UnexpectedEof};
    let io = std::error::Error::source(err).and_then(|e| e.downcast_ref::<std::io::Error>());
    err.is_incomplete_message() || err.is_closed() || io.is_some_and(|e| matches!(e.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted))
}

#[tokio::test]
async fn reset_closes_the_connection_without_an_answer() {
    let env = start().await;
    let s = &env.server;
    set(&env, Some(&ApiFaults { user_agent: Some("hcp-dr".into()), ..only(FaultKind::Reset) }));

    // HTTP/1.1: the connection is closed, no response at all
    let err = send(s, "POST", CM, "hcp-dr/0.1", Some(&configmap("after-reset"))).await.expect_err("a reset");
    assert!(closed(&err), "not a closed connection: {err:?}");
    // the server goes on: the next request, on a new connection, is served
    assert_eq!(get(s, NS, "kubectl/v1.32").await.code, 200);
    let err = send(s, "GET", NS, "hcp-dr/0.1", None).await.expect_err("a reset");
    assert!(closed(&err), "not a closed connection: {err:?}");

    // HTTP/2: the stream is reset with no answer; the server goes on
    let io = hyper_util::rt::TokioIo::new(connect(s, Proto::Http2).await);
    let (mut sender, conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let mut req = request(s, "GET", &format!("{}{NS}", s.url()), "hcp-dr/0.1", None);
    req.headers_mut().remove("host");
    let err = sender.send_request(req).await.expect_err("a reset stream");
    assert!(format!("{err:?}").contains("INTERNAL_ERROR"), "not a reset stream: {err:?}");
    assert_eq!(get(s, NS, "kubectl/v1.32").await.code, 200);

    set(&env, None);
    assert_eq!(get(s, NS, "hcp-dr/0.1").await.code, 200);
    assert_eq!(get(s, &format!("{CM}/after-reset"), "hcp-dr/0.1").await.code, 404, "a reset request was applied");
    assert_eq!(kinds_logged(&env), ["reset", "reset", "reset"]);
}

#[tokio::test]
async fn delay_serves_the_request_and_watches_are_never_reset_or_delayed() {
    let env = start().await;
    let s = &env.server;
    set(&env, Some(&ApiFaults { delay_ms: 300, ..only(FaultKind::Delay) }));
    let a = send(s, "POST", CM, "test", Some(&configmap("delayed"))).await.unwrap();
    assert_eq!(a.code, 201, "{a:?}");
    assert_eq!(get(s, &format!("{CM}/delayed"), "test").await.code, 200);
    assert_eq!(kinds_logged(&env), ["delay", "delay"]);

    // a watch is neither reset nor delayed: its stream opens at once
    set(&env, Some(&ApiFaults { kinds: vec![FaultKind::Reset, FaultKind::Delay], delay_ms: 60_000, ..only(FaultKind::Reset) }));
    for path in [format!("{CM}?watch=true"), format!("{CM}?watch=1&resourceVersion=0")] {
        let io = hyper_util::rt::TokioIo::new(connect(s, Proto::Http1).await);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let resp = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request(s, "GET", &path, "test", None)))
            .await
            .unwrap_or_else(|_| panic!("{path}: the watch was delayed"))
            .unwrap_or_else(|e| panic!("{path}: the watch was reset: {e}"));
        assert_eq!(resp.status().as_u16(), 200, "{path}");
    }
    assert_eq!(log(&env).len(), 2, "a watch got a reset or a delay: {:?}", log(&env));

    // but it may get an error answer at its start
    set(&env, Some(&ApiFaults { kinds: vec![FaultKind::Reset, FaultKind::Unavailable], ..only(FaultKind::Reset) }));
    let a = get(s, &format!("{CM}?watch=true"), "test").await;
    assert_status(&a, 503, "ServiceUnavailable");
    assert_eq!(kinds_logged(&env).last().map(String::as_str), Some("unavailable"));
}

#[tokio::test]
async fn share_user_agent_seed_log_and_unparsable_files() {
    let env = start().await;
    let s = &env.server;

    // share 0: nothing
    set(&env, Some(&ApiFaults { share: 0.0, ..only(FaultKind::InternalError) }));
    for _ in 0..20 {
        assert_eq!(get(s, NS, "hcp-dr/0.1").await.code, 200);
    }
    assert!(log(&env).is_empty(), "{:?}", log(&env));

    // the user-agent filter leaves other clients alone
    set(&env, Some(&ApiFaults { user_agent: Some("hcp-dr".into()), ..only(FaultKind::InternalError) }));
    assert_eq!(get(s, NS, "kubectl/v1.32.0 (linux/amd64)").await.code, 200);
    assert_eq!(get(s, NS, "not-hcp-dr/1").await.code, 200);
    assert_eq!(get(s, NS, "hcp-dr/0.1 (backup)").await.code, 500);
    assert_eq!(log(&env).len(), 1);
    assert_eq!(log(&env)[0]["user_agent"], "hcp-dr/0.1 (backup)");

    // a share of the requests, drawn from the seed: the log counts what the client saw
    std::fs::remove_file(faults::log_path(&env.faults_file)).unwrap();
    let mixed = ApiFaults {
        share: 0.5,
        kinds: vec![FaultKind::TooManyRequests, FaultKind::InternalError, FaultKind::Unavailable],
        user_agent: None,
        delay_ms: 0,
        seed: Some(42),
        unavailable_api_services: Vec::new(),
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        set(&env, Some(&mixed)); // read again: the draws start again from the seed
        let mut codes = Vec::new();
        for _ in 0..60 {
            codes.push(get(s, NS, "test").await.code);
        }
        runs.push(codes);
    }
    assert_eq!(runs[0], runs[1], "the same seed gives the same faults");
    let codes: Vec<u16> = runs.concat();
    let count = |c: u16| codes.iter().filter(|x| **x == c).count();
    let faulted = codes.len() - count(200);
    assert!((20..=100).contains(&faulted), "about half of 120 requests should fail, {faulted} did: {codes:?}");
    assert!(count(429) > 0 && count(500) > 0 && count(503) > 0, "{codes:?}");
    let logged = kinds_logged(&env);
    assert_eq!(logged.len(), faulted);
    assert_eq!(logged.iter().filter(|k| *k == "too-many-requests").count(), count(429));
    assert_eq!(logged.iter().filter(|k| *k == "internal-error").count(), count(500));
    assert_eq!(logged.iter().filter(|k| *k == "unavailable").count(), count(503));

    // a file that does not parse injects nothing; a valid one again does
    std::fs::write(&env.faults_file, "{\"share\": 1.0, \"kinds\": [\"meteor\"]}").unwrap();
    assert_eq!(get(s, NS, "test").await.code, 200);
    std::fs::write(&env.faults_file, "{\"share\": 7, \"kinds\": [\"reset\"]}").unwrap();
    assert_eq!(get(s, NS, "test").await.code, 200);
    std::fs::write(&env.faults_file, "{\"share\": 1, \"kinds\": [\"too-many-requests\"]}").unwrap();
    assert_eq!(get(s, NS, "test").await.code, 429);
    std::fs::remove_file(&env.faults_file).unwrap();
    assert_eq!(get(s, NS, "test").await.code, 200);
    assert_eq!(log(&env).len(), faulted + 1);
}

#[tokio::test]
async fn kube_client_sees_the_status_and_kubectl_works_with_faults_off_or_filtered() {
    let env = start().await;
    let s = &env.server;
    let client = s.client().await.expect("kube client");
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);

    // a 500 (kube-rs 5's default client retries 429 and 503 by itself, up
    // to 15 times with a backoff growing to minutes: not for this test)
    set(&env, Some(&only(FaultKind::InternalError)));
    match api.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (500, "InternalError"), "{status:?}");
        }
        other => panic!("expected a 500 Status: {other:?}"),
    }

    let kubeconfig = env.dir.path().join("kubeconfig");
    s.write_kubeconfig(&kubeconfig, "mgmt-a").expect("kubeconfig");
    // tokio's Command: the server runs on this test's runtime
    let kubectl = async |args: &[&str]| {
        tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .await
            .expect("kubectl not found: it is on every machine of this kind (see the README)")
    };
    let before = log(&env).len();
    for faults in [None, Some(ApiFaults { user_agent: Some("hcp-dr".into()), ..only(FaultKind::Reset) })] {
        set(&env, faults.as_ref());
        let out = kubectl(&["get", "namespaces", "-o", "name"]).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/kube-system"));
        let out = kubectl(&["create", "configmap", "by-kubectl", "--from-literal=a=1"]).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = kubectl(&["delete", "configmap", "by-kubectl"]).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(log(&env).len(), before, "kubectl got faults: {:?}", log(&env));
}

fn sandbox_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr-sandbox")).args(args).output().expect("run hcp-dr-sandbox");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// A `sandbox.json` as `up` writes it, for this process (the API server of
/// `mgmt-a` is started by the test itself on `DIR/mgmt-a/state/api-faults.json`).
fn fake_sandbox(dir: &Path, api_url: &str) {
    let state = hcp_dr_e2e::sandbox::SandboxState {
        pid: std::process::id(),
        sandbox_id: "test".into(),
        clusters: ["mgmt-a", "mgmt-b"]
            .iter()
            .map(|name| hcp_dr_e2e::sandbox::ClusterState {
                name: name.to_string(),
                api_url: api_url.into(),
                kubeconfig: dir.join(format!("{name}.kubeconfig")).display().to_string(),
                etcd_url: String::new(),
                external: None,
            })
            .collect(),
        s3_url: String::new(),
        bucket: String::new(),
        route53_url: String::new(),
        zone_id: String::new(),
        crds: String::new(),
        etcd_init: Default::default(),
    };
    std::fs::write(dir.join("sandbox.json"), serde_json::to_string(&state).unwrap()).unwrap();
}

/// An aggregated API registered but down, as real clusters often carry
/// one: listed in discovery, 503 under its path for every client. A
/// discovery of every group fails on it (after the client's retries); one
/// of the groups needed does not.
#[tokio::test]
async fn an_unavailable_aggregated_api_is_listed_and_answers_503() {
    let env = start().await;
    let s = &env.server;
    let mut faults = only(FaultKind::Unavailable);
    faults.share = 0.0;
    faults.kinds.clear();
    faults.unavailable_api_services = vec!["metrics.k8s.io/v1beta1".into()];
    set(&env, Some(&faults));
    let groups = get(s, "/apis", "kubectl/v1.32").await;
    assert_eq!(groups.code, 200);
    assert!(groups.body["groups"].as_array().unwrap().iter().any(|g| g["name"] == "metrics.k8s.io"), "{}", groups.body);
    let down = get(s, "/apis/metrics.k8s.io/v1beta1", "kubectl/v1.32").await;
    assert_eq!(down.code, 503, "{}", down.body);
    assert_eq!(down.body["message"], "the server is currently unable to handle the request");
    assert_eq!(get(s, "/apis/metrics.k8s.io/v1beta1/nodes", "anyone").await.code, 503);
    assert_eq!(get(s, "/apis/apps/v1", "anyone").await.code, 200, "other groups answer");

    let client = s.client().await.unwrap();
    let some = kube::discovery::Discovery::new(client).filter(&["apps", ""]).run().await.expect("a discovery of the groups needed");
    assert!(some.has_group("apps"));
}

#[tokio::test]
async fn sandbox_faults_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sandbox_dir = dir.path().join("sb");
    std::fs::create_dir_all(&sandbox_dir).unwrap();
    let file = hcp_dr_e2e::sandbox::api_faults_path(&sandbox_dir, "mgmt-a");
    assert_eq!(file, sandbox_dir.join("mgmt-a/state/api-faults.json"));
    let env = start_with(dir, Some(file.clone())).await;
    let s = &env.server;
    fake_sandbox(&sandbox_dir, s.url());
    let d = sandbox_dir.to_str().unwrap();

    // validation
    let bad: &[(&[&str], &str)] = &[
        (&["--cluster", "mgmt-a", "--share", "1.5", "--kinds", "reset"], "within 0..=1"),
        (&["--cluster", "mgmt-a", "--share=-0.1", "--kinds", "reset"], "within 0..=1"),
        (&["--cluster", "mgmt-a", "--share", "0.5"], "--kinds"),
        (&["--cluster", "mgmt-a", "--share", "0.5", "--kinds", "meteor"], "meteor"),
        (&["--cluster", "mgmt-a", "--share", "0.5", "--kinds", ""], "--kinds"),
        (&["--cluster", "mgmt-a", "--off", "--share", "0.5", "--kinds", "reset"], "--off"),
        (&["--cluster", "mgmt-c", "--share", "0.5", "--kinds", "reset"], "no management cluster \"mgmt-c\""),
    ];
    for (args, needle) in bad {
        let mut all = vec!["faults", "--dir", d];
        all.extend_from_slice(args);
        let (code, out, err) = sandbox_cli(&all);
        assert_ne!(code, Some(0), "{all:?} was accepted: {out}");
        assert!(err.contains(needle), "{all:?}: no {needle:?} in: {err}");
        assert!(!file.exists(), "{all:?} wrote the faults file");
    }
    let (code, _, err) = sandbox_cli(&["faults", "--dir", dir_missing().as_str(), "--cluster", "mgmt-a", "--off"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no sandbox in"), "{err}");

    // on
    let (code, out, err) = sandbox_cli(&[
        "faults", "--dir", d, "--cluster", "mgmt-a", "--share", "1", "--kinds", "too-many-requests,unavailable",
        "--user-agent", "hcp-dr", "--seed", "7",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("API faults in force on mgmt-a: 1 of the requests from user agents starting with \"hcp-dr\" fail"), "{out}");
    assert!(out.contains("kinds: too-many-requests, unavailable") && out.contains("seed: 7"), "{out}");
    let written: ApiFaults = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        written,
        ApiFaults {
            share: 1.0,
            kinds: vec![FaultKind::TooManyRequests, FaultKind::Unavailable],
            user_agent: Some("hcp-dr".into()),
            delay_ms: 0,
            seed: Some(7),
            unavailable_api_services: Vec::new(),
        }
    );
    let mut codes = Vec::new();
    for _ in 0..10 {
        codes.push(get(s, NS, "hcp-dr/0.1").await.code);
    }
    assert!(codes.iter().all(|c| *c == 429 || *c == 503) && codes.contains(&429) && codes.contains(&503), "{codes:?}");
    assert_eq!(get(s, NS, "kubectl/v1.32").await.code, 200);

    // show, then off: the counts by kind
    let (code, out, _) = sandbox_cli(&["faults", "--dir", d, "--cluster", "mgmt-a"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("API faults in force on mgmt-a") && out.contains("injected so far: 10"), "{out}");
    let (code, out, err) = sandbox_cli(&["faults", "--dir", d, "--cluster", "mgmt-a", "--off"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let n429 = codes.iter().filter(|c| **c == 429).count();
    let expected = format!("injected so far: 10 (too-many-requests {n429}, unavailable {})", 10 - n429);
    assert!(out.contains("no API faults on mgmt-a") && out.contains(&expected), "no {expected:?} in: {out}");
    assert!(!file.exists());
    assert_eq!(get(s, NS, "hcp-dr/0.1").await.code, 200);

    // mgmt-b, with every kind and a delay
    let (code, out, err) = sandbox_cli(&[
        "faults", "--dir", d, "--cluster", "mgmt-b", "--share", "0.1", "--kinds",
        "too-many-requests,internal-error,unavailable,reset,delay", "--delay-ms", "1500",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("delay: 1500 ms") && out.contains("seed: random"), "{out}");
    let written = faults::read_faults_file(&hcp_dr_e2e::sandbox::api_faults_path(&sandbox_dir, "mgmt-b")).unwrap().unwrap();
    assert_eq!((written.share, written.kinds.len(), written.delay_ms), (0.1, 5, 1500));
}

fn dir_missing() -> String {
    std::env::temp_dir().join("hcp-dr-no-such-sandbox-dir").display().to_string()
}
