//! A Route53 endpoint: moto's server mode (`moto_server`, a Python
//! implementation of the AWS APIs) on loopback, behind a small strict front.
//!
//! moto is lenient where Route53 is strict: it accepts a `CREATE` of a record
//! set that already exists (and then holds two sets with one name and type).
//! The front validates every `ChangeResourceRecordSets` batch against the
//! zone's current records the way Route53 does (`CREATE` needs the set absent,
//! `DELETE` needs it present with identical TTL and values, the whole batch
//! fails atomically with `InvalidChangeBatch`) and forwards everything else
//! untouched.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use std::convert::Infallible;
use std::sync::Arc;

use aws_sdk_route53::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_http_client::tls;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{
    DEFAULT_VENV, ManagedChild, ProcError, error_chain, find_program, free_port, wait_for_tcp,
};

const MOTO_HINT: &str = "python3 -m venv /root/.local/share/hcp-dr/venv && /root/.local/share/hcp-dr/venv/bin/pip install 'moto[server]'";
/// Dummy credentials moto accepts (it does not check signatures).
pub const ACCESS_KEY: &str = "AKIASANDBOXROUTE53";
/// Dummy secret matching [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "sandbox-route53-secret-key";
/// Route53 is global; SDKs sign for us-east-1.
pub const REGION: &str = "us-east-1";

/// A running `moto_server` and its strict front. Dropping it stops both.
#[derive(Debug)]
pub struct Route53Endpoint {
    child: ManagedChild,
    front: JoinHandle<()>,
    url: String,
    moto_url: String,
}

impl Drop for Route53Endpoint {
    fn drop(&mut self) {
        self.front.abort();
    }
}

/// The moto server program: the hcp-dr venv first (`$HCP_DR_VENV`, then the
/// default venv), then anything [`find_program`] finds.
fn moto_program() -> Result<PathBuf, ProcError> {
    let mut venvs: Vec<PathBuf> = std::env::var_os("HCP_DR_VENV")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    venvs.push(PathBuf::from(DEFAULT_VENV));
    for venv in venvs {
        let candidate = venv.join("bin/moto_server");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    find_program("moto_server", MOTO_HINT)
}

impl Route53Endpoint {
    /// Start `moto_server` on `127.0.0.1:<free>`, logging to
    /// `dir/moto_server.log`; returns once it answers `ListHostedZones`.
    pub async fn start(dir: &Path) -> Result<Route53Endpoint, ProcError> {
        let program = moto_program()?;
        std::fs::create_dir_all(dir).map_err(|source| ProcError::Io {
            op: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let port = free_port(ip)?;
        let mut cmd = Command::new(program);
        cmd.arg("-H")
            .arg(ip.to_string())
            .arg("-p")
            .arg(port.to_string())
            .current_dir(dir)
            .env("PYTHONUNBUFFERED", "1")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_DEFAULT_REGION", REGION);
        let child = ManagedChild::spawn(cmd, "moto_server", &dir.join("moto_server.log"))?;
        let addr = SocketAddr::new(ip, port);
        let timeout = Duration::from_secs(60);
        let deadline = Instant::now() + timeout;
        wait_for_tcp(&child, addr, timeout).await?;
        let moto_url = format!("http://{addr}");
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(|source| ProcError::NoFreePort { ip, source })?;
        let front_addr = listener
            .local_addr()
            .map_err(|source| ProcError::NoFreePort { ip, source })?;
        let state = Arc::new(FrontState {
            moto: addr,
            moto_client: aws_sdk_route53::Client::from_conf(sdk_config_for(&moto_url)),
            batches: tokio::sync::Mutex::new(()),
        });
        let front = tokio::spawn(serve_front(listener, state));
        let endpoint = Route53Endpoint {
            child,
            front,
            url: format!("http://{front_addr}"),
            moto_url,
        };
        // Listening is not serving: wait for a real API answer.
        let client = endpoint.client();
        loop {
            endpoint.child.check_running()?;
            let last_error = match client.list_hosted_zones().send().await {
                Ok(_) => return Ok(endpoint),
                Err(e) => error_chain(&e),
            };
            if Instant::now() >= deadline {
                return Err(ProcError::NotReady {
                    name: "moto_server".into(),
                    timeout,
                    last_error,
                    log_tail: endpoint.child.log_tail(60),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `http://127.0.0.1:<port>` of the strict front: point clients here.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// moto itself, without the strict batch checks.
    pub fn moto_url(&self) -> &str {
        &self.moto_url
    }

    /// The moto log file.
    pub fn log_path(&self) -> &Path {
        self.child.log_path()
    }

    /// An SDK configuration pointing at this endpoint with the dummy credentials.
    pub fn sdk_config(&self) -> aws_sdk_route53::Config {
        sdk_config_for(&self.url)
    }

    /// A Route53 client for this endpoint.
    pub fn client(&self) -> aws_sdk_route53::Client {
        aws_sdk_route53::Client::from_conf(self.sdk_config())
    }

    /// Create a public hosted zone for `name`; returns its id without the
    /// `/hostedzone/` prefix.
    pub async fn create_hosted_zone(&self, name: &str) -> Result<String, ProcError> {
        let fail = |message: String| ProcError::Route53 {
            op: "CreateHostedZone",
            message,
        };
        let out = self
            .client()
            .create_hosted_zone()
            .name(name)
            .caller_reference(uuid::Uuid::new_v4().to_string())
            .send()
            .await
            .map_err(|e| fail(error_chain(&e)))?;
        let id = out
            .hosted_zone()
            .map(|z| z.id())
            .ok_or_else(|| fail("response without a hosted zone".into()))?;
        Ok(id.trim_start_matches("/hostedzone/").to_string())
    }
}

fn sdk_config_for(url: &str) -> aws_sdk_route53::Config {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    aws_sdk_route53::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(url)
        .credentials_provider(Credentials::new(
            ACCESS_KEY, SECRET_KEY, None, None, "sandbox",
        ))
        .http_client(http)
        .build()
}

// ---------------------------------------------------------------------------
// The strict front.

struct FrontState {
    moto: SocketAddr,
    moto_client: aws_sdk_route53::Client,
    /// Check-then-apply of a batch must be atomic, like Route53's.
    batches: tokio::sync::Mutex<()>,
}

/// The identity of a record set: name (lower case, trailing dot), type, set identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordKey {
    /// Normalized name.
    pub name: String,
    /// Record type (`A`, `TXT`, ...).
    pub kind: String,
    /// `SetIdentifier` of weighted/latency/... sets.
    pub set_identifier: Option<String>,
}

/// A record set as the strict checks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSet {
    /// Its identity.
    pub key: RecordKey,
    /// TTL (absent for alias sets).
    pub ttl: Option<i64>,
    /// Values, sorted.
    pub values: Vec<String>,
    /// Alias target DNS name (normalized), for alias sets.
    pub alias: Option<String>,
}

/// One change of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordChange {
    /// `CREATE`, `DELETE` or `UPSERT`.
    pub action: String,
    /// The record set.
    pub set: RecordSet,
}

fn normalize_name(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase().replace("\\052", "*");
    if lower.ends_with('.') {
        lower
    } else {
        format!("{lower}.")
    }
}

fn describe(key: &RecordKey) -> String {
    match &key.set_identifier {
        Some(id) => format!(
            "[name='{}', type='{}', set-identifier='{id}']",
            key.name, key.kind
        ),
        None => format!("[name='{}', type='{}']", key.name, key.kind),
    }
}

/// Apply `changes` in order to `current` as Route53 does; the messages of
/// every rejected change, or the resulting record sets.
pub fn check_change_batch(
    current: &[RecordSet],
    changes: &[RecordChange],
) -> Result<Vec<RecordSet>, Vec<String>> {
    let mut state = current.to_vec();
    let mut errors = Vec::new();
    for change in changes {
        let pos = state.iter().position(|s| s.key == change.set.key);
        match (change.action.as_str(), pos) {
            ("CREATE", Some(_)) => errors.push(format!(
                "Tried to create resource record set {} but it already exists",
                describe(&change.set.key)
            )),
            ("CREATE", None) => state.push(change.set.clone()),
            ("DELETE", None) => errors.push(format!(
                "Tried to delete resource record set {} but it was not found",
                describe(&change.set.key)
            )),
            ("DELETE", Some(i)) if state[i] != change.set => errors.push(format!(
                "Tried to delete resource record set {} but the values provided do not match the current values",
                describe(&change.set.key)
            )),
            ("DELETE", Some(i)) => {
                state.remove(i);
            }
            ("UPSERT", Some(i)) => state[i] = change.set.clone(),
            ("UPSERT", None) => state.push(change.set.clone()),
            (other, _) => errors.push(format!("Invalid action {other}")),
        }
    }
    if errors.is_empty() {
        Ok(state)
    } else {
        Err(errors)
    }
}

fn xml_err(e: aws_smithy_xml::decode::XmlDecodeError) -> String {
    error_chain(&e)
}

/// Parse a `ChangeResourceRecordSetsRequest` body.
pub fn parse_change_batch(xml: &str) -> Result<Vec<RecordChange>, String> {
    use aws_smithy_xml::decode::{Document, try_data};
    let mut doc = Document::new(xml);
    let mut root = doc.root_element().map_err(xml_err)?;
    if !root.start_el().matches("ChangeResourceRecordSetsRequest") {
        return Err(format!(
            "unexpected root element {}",
            root.start_el().local()
        ));
    }
    let mut changes = Vec::new();
    while let Some(mut batch) = root.next_tag() {
        if !batch.start_el().matches("ChangeBatch") {
            continue;
        }
        while let Some(mut list) = batch.next_tag() {
            if !list.start_el().matches("Changes") {
                continue;
            }
            while let Some(mut change) = list.next_tag() {
                let mut action = None;
                let mut set = None;
                while let Some(mut field) = change.next_tag() {
                    if field.start_el().matches("Action") {
                        action = Some(try_data(&mut field).map_err(xml_err)?.trim().to_string());
                    } else if field.start_el().matches("ResourceRecordSet") {
                        let (mut name, mut kind, mut set_identifier, mut ttl, mut alias) =
                            (None, None, None, None, None);
                        let mut values = Vec::new();
                        while let Some(mut f) = field.next_tag() {
                            let local = f.start_el().local().to_string();
                            match local.as_str() {
                                "Name" => {
                                    name = Some(try_data(&mut f).map_err(xml_err)?.to_string())
                                }
                                "Type" => {
                                    kind =
                                        Some(try_data(&mut f).map_err(xml_err)?.trim().to_string())
                                }
                                "SetIdentifier" => {
                                    set_identifier =
                                        Some(try_data(&mut f).map_err(xml_err)?.to_string())
                                }
                                "TTL" => {
                                    let text = try_data(&mut f).map_err(xml_err)?;
                                    ttl = Some(
                                        text.trim()
                                            .parse::<i64>()
                                            .map_err(|e| format!("TTL {text}: {e}"))?,
                                    );
                                }
                                "ResourceRecords" => {
                                    while let Some(mut rr) = f.next_tag() {
                                        while let Some(mut v) = rr.next_tag() {
                                            if v.start_el().matches("Value") {
                                                values.push(
                                                    try_data(&mut v).map_err(xml_err)?.to_string(),
                                                );
                                            }
                                        }
                                    }
                                }
                                "AliasTarget" => {
                                    while let Some(mut a) = f.next_tag() {
                                        if a.start_el().matches("DNSName") {
                                            alias = Some(normalize_name(
                                                &try_data(&mut a).map_err(xml_err)?,
                                            ));
                                        }
                                    }
                                }
                                _ => {}
                            }
                        }
                        values.sort();
                        set = Some(RecordSet {
                            key: RecordKey {
                                name: normalize_name(
                                    &name.ok_or("ResourceRecordSet without Name")?,
                                ),
                                kind: kind.ok_or("ResourceRecordSet without Type")?,
                                set_identifier,
                            },
                            ttl,
                            values,
                            alias,
                        });
                    }
                }
                changes.push(RecordChange {
                    action: action.ok_or("Change without Action")?,
                    set: set.ok_or("Change without ResourceRecordSet")?,
                });
            }
        }
    }
    Ok(changes)
}

fn record_set_from_sdk(s: &aws_sdk_route53::types::ResourceRecordSet) -> RecordSet {
    let mut values: Vec<String> = s
        .resource_records()
        .iter()
        .map(|r| r.value().to_string())
        .collect();
    values.sort();
    RecordSet {
        key: RecordKey {
            name: normalize_name(s.name()),
            kind: s.r#type().as_str().to_string(),
            set_identifier: s.set_identifier().map(str::to_string),
        },
        ttl: s.ttl(),
        values,
        alias: s.alias_target().map(|a| normalize_name(a.dns_name())),
    }
}

async fn current_records(
    client: &aws_sdk_route53::Client,
    zone: &str,
) -> Result<Vec<RecordSet>, String> {
    let mut out = Vec::new();
    let mut next: Option<(
        String,
        Option<aws_sdk_route53::types::RrType>,
        Option<String>,
    )> = None;
    loop {
        let mut req = client.list_resource_record_sets().hosted_zone_id(zone);
        if let Some((name, kind, id)) = next.take() {
            req = req
                .start_record_name(name)
                .set_start_record_type(kind)
                .set_start_record_identifier(id);
        }
        let page = req.send().await.map_err(|e| error_chain(&e))?;
        out.extend(page.resource_record_sets().iter().map(record_set_from_sdk));
        if !page.is_truncated() {
            return Ok(out);
        }
        match page.next_record_name() {
            Some(name) => {
                next = Some((
                    name.to_string(),
                    page.next_record_type().cloned(),
                    page.next_record_identifier().map(str::to_string),
                ))
            }
            None => return Ok(out),
        }
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The `InvalidChangeBatch` error document (400).
fn invalid_change_batch(messages: &[String]) -> hyper::Response<Full<Bytes>> {
    let items: String = messages
        .iter()
        .map(|m| format!("<Message>{}</Message>", xml_escape(m)))
        .collect();
    let joined = xml_escape(&format!("[{}]", messages.join(", ")));
    let body = format!(
        "<?xml version=\"1.0\"?>\n<ErrorResponse xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\">\
         <Error><Type>Sender</Type><Code>InvalidChangeBatch</Code><Message>{joined}</Message>\
         <Messages>{items}</Messages></Error><RequestId>{}</RequestId></ErrorResponse>",
        uuid::Uuid::new_v4()
    );
    plain_response(400, "text/xml", body)
}

fn plain_response(status: u16, content_type: &str, body: String) -> hyper::Response<Full<Bytes>> {
    let mut resp = hyper::Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

/// `Some(zone id)` for `POST /2013-04-01/hostedzone/<id>/rrset[/]`.
fn rrset_zone(method: &hyper::Method, path: &str) -> Option<String> {
    if method != hyper::Method::POST {
        return None;
    }
    let rest = path.strip_prefix("/2013-04-01/hostedzone/")?;
    let rest = rest.trim_end_matches('/');
    let zone = rest.strip_suffix("/rrset")?;
    (!zone.is_empty() && !zone.contains('/')).then(|| zone.to_string())
}

async fn serve_front(listener: TcpListener, state: Arc<FrontState>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
            // A client going away mid-request is not an error worth reporting.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

async fn handle(
    state: Arc<FrontState>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(plain_response(
                400,
                "text/plain",
                format!("reading request body: {e}"),
            ));
        }
    };
    let Some(zone) = rrset_zone(&parts.method, parts.uri.path()) else {
        return Ok(forward(state.moto, parts, body).await);
    };
    let _serialized = state.batches.lock().await;
    // A body we cannot parse goes to moto unchanged, which rejects it itself.
    if let Ok(changes) = parse_change_batch(&String::from_utf8_lossy(&body)) {
        match current_records(&state.moto_client, &zone).await {
            Ok(current) => {
                if let Err(messages) = check_change_batch(&current, &changes) {
                    return Ok(invalid_change_batch(&messages));
                }
            }
            // Unknown zone and the like: moto answers with the right error.
            Err(_) => return Ok(forward(state.moto, parts, body).await),
        }
    }
    Ok(forward(state.moto, parts, body).await)
}

async fn forward(
    moto: SocketAddr,
    parts: hyper::http::request::Parts,
    body: Bytes,
) -> hyper::Response<Full<Bytes>> {
    match try_forward(moto, parts, body).await {
        Ok(resp) => resp,
        Err(e) => plain_response(502, "text/plain", format!("forwarding to moto: {e}")),
    }
}

async fn try_forward(
    moto: SocketAddr,
    parts: hyper::http::request::Parts,
    body: Bytes,
) -> Result<hyper::Response<Full<Bytes>>, String> {
    let tcp = TcpStream::connect(moto).await.map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let mut req = hyper::Request::from_parts(parts, Full::new(body));
    req.headers_mut().remove(hyper::header::TRANSFER_ENCODING);
    req.headers_mut().remove(hyper::header::CONNECTION);
    let result = async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let (mut parts, body) = resp.into_parts();
        let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        parts.headers.remove(hyper::header::TRANSFER_ENCODING);
        parts.headers.remove(hyper::header::CONNECTION);
        Ok(hyper::Response::from_parts(parts, Full::new(bytes)))
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const BATCH: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ChangeResourceRecordSetsRequest xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><ChangeBatch><Changes>
<Change><Action>CREATE</Action><ResourceRecordSet><Name>Api.Example.com</Name><Type>A</Type><TTL>30</TTL>
<ResourceRecords><ResourceRecord><Value>192.0.2.2</Value></ResourceRecord><ResourceRecord><Value>192.0.2.1</Value></ResourceRecord></ResourceRecords>
</ResourceRecordSet></Change>
<Change><Action>DELETE</Action><ResourceRecordSet><Name>old.example.com.</Name><Type>TXT</Type><SetIdentifier>w1</SetIdentifier><TTL>60</TTL>
<ResourceRecords><ResourceRecord><Value>"a&amp;b"</Value></ResourceRecord></ResourceRecords></ResourceRecordSet></Change>
</Changes></ChangeBatch></ChangeResourceRecordSetsRequest>"#;

    fn set(name: &str, kind: &str, ttl: i64, values: &[&str]) -> RecordSet {
        RecordSet {
            key: RecordKey {
                name: normalize_name(name),
                kind: kind.into(),
                set_identifier: None,
            },
            ttl: Some(ttl),
            values: values.iter().map(|v| v.to_string()).collect(),
            alias: None,
        }
    }

    #[test]
    fn parses_sdk_change_batches() {
        let changes = parse_change_batch(BATCH).expect("parse");
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].action, "CREATE");
        assert_eq!(
            changes[0].set,
            set("api.example.com.", "A", 30, &["192.0.2.1", "192.0.2.2"])
        );
        assert_eq!(changes[1].action, "DELETE");
        assert_eq!(changes[1].set.key.set_identifier.as_deref(), Some("w1"));
        assert_eq!(changes[1].set.values, ["\"a&b\""]);
        assert!(parse_change_batch("<Other/>").is_err());
    }

    #[test]
    fn batches_are_checked_like_route53() {
        let a = set("api.example.com", "A", 30, &["192.0.2.1"]);
        let change = |action: &str, s: &RecordSet| RecordChange {
            action: action.into(),
            set: s.clone(),
        };
        // CREATE of an existing set, DELETE of a missing one, DELETE with stale values.
        let errs = check_change_batch(std::slice::from_ref(&a), &[change("CREATE", &a)])
            .expect_err("exists");
        assert!(errs[0].contains("but it already exists"), "{errs:?}");
        let missing = set("nope.example.com", "A", 30, &["192.0.2.1"]);
        let errs = check_change_batch(std::slice::from_ref(&a), &[change("DELETE", &missing)])
            .expect_err("missing");
        assert!(errs[0].contains("but it was not found"), "{errs:?}");
        let stale = set("api.example.com", "A", 30, &["192.0.2.99"]);
        let errs = check_change_batch(std::slice::from_ref(&a), &[change("DELETE", &stale)])
            .expect_err("stale");
        assert!(errs[0].contains("do not match"), "{errs:?}");
        // Changes apply in order: DELETE then CREATE of the same set is fine.
        let b = set("api.example.com", "A", 30, &["192.0.2.2"]);
        let after = check_change_batch(
            std::slice::from_ref(&a),
            &[change("DELETE", &a), change("CREATE", &b)],
        )
        .expect("delete then create");
        assert_eq!(after, vec![b.clone()]);
        assert_eq!(
            check_change_batch(&[a], &[change("UPSERT", &b)]).expect("upsert"),
            vec![b]
        );
    }

    #[test]
    fn only_rrset_posts_are_intercepted() {
        assert_eq!(
            rrset_zone(&hyper::Method::POST, "/2013-04-01/hostedzone/Z123/rrset/").as_deref(),
            Some("Z123")
        );
        assert_eq!(
            rrset_zone(&hyper::Method::POST, "/2013-04-01/hostedzone/Z1/rrset").as_deref(),
            Some("Z1")
        );
        assert_eq!(
            rrset_zone(&hyper::Method::GET, "/2013-04-01/hostedzone/Z1/rrset"),
            None
        );
        assert_eq!(
            rrset_zone(&hyper::Method::POST, "/2013-04-01/hostedzone"),
            None
        );
    }
}
