//! An S3 endpoint: `s3s-fs` (a real S3 protocol implementation that checks
//! SigV4 signatures, including presigned URLs) storing objects in a directory,
//! plus an HTTPS front so presigned `https://` URLs work like real S3 ones.
//!
//! The HTTPS front ([`super::s3_front`]) is an HTTP/1.1 proxy: method, path,
//! query and every header, including the `Host` header that SigV4 signs,
//! reach s3s-fs untouched, bodies are streamed. It injects the faults set in
//! `dir/s3-faults.json` ([`super::s3_faults`]; none without the file).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::s3_faults::{S3_FAULTS_FILE, S3Faults, S3Injector, read_log, write_faults_file};
use super::{ManagedChild, ProcError, find_program, free_port, wait_for_tcp};
use crate::pki::{Ca, CertSpec, client_tls_config, server_tls_config};

const S3S_FS_HINT: &str = "cargo install s3s-fs --version 0.14.1 --features binary --locked";
const REGION: &str = "us-east-1";

/// A running s3s-fs with its HTTPS front. Dropping it stops both.
#[derive(Debug)]
pub struct S3Endpoint {
    child: ManagedChild,
    front: JoinHandle<()>,
    root: PathBuf,
    faults_path: PathBuf,
    http_url: String,
    https_url: String,
    access_key: String,
    secret_key: String,
}

impl Drop for S3Endpoint {
    fn drop(&mut self) {
        self.front.abort();
    }
}

fn random_token(len: usize) -> String {
    let mut s = String::new();
    while s.len() < len {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string().to_uppercase());
    }
    s.truncate(len);
    s
}

impl S3Endpoint {
    /// Start s3s-fs on `127.0.0.1:<free>` (plain http) serving `dir/root`, with a
    /// random access/secret key pair, and an HTTPS front on `127.0.0.1:<free>`
    /// whose certificate is issued by `ca` for `127.0.0.1` and `localhost`.
    /// The log goes to `dir/s3s-fs.log`. The front injects the faults set in
    /// `dir/s3-faults.json` ([`S3Endpoint::set_faults`]). Ready on return.
    pub async fn start(dir: &Path, ca: &Ca) -> Result<S3Endpoint, ProcError> {
        let program = find_program("s3s-fs", S3S_FS_HINT)?;
        let root = dir.join("root");
        std::fs::create_dir_all(&root).map_err(|source| ProcError::Io {
            op: "creating",
            path: root.clone(),
            source,
        })?;
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let access_key = format!("AKIA{}", random_token(16));
        let secret_key = random_token(40);

        let port = free_port(ip)?;
        let mut cmd = Command::new(program);
        cmd.arg("--host")
            .arg(ip.to_string())
            .arg("--port")
            .arg(port.to_string())
            .arg("--access-key")
            .arg(&access_key)
            .arg("--secret-key")
            .arg(&secret_key)
            .arg(&root)
            .env("RUST_LOG", "s3s_fs=debug,s3s=info");
        let child = ManagedChild::spawn(cmd, "s3s-fs", &dir.join("s3s-fs.log"))?;
        let backend = SocketAddr::new(ip, port);
        wait_for_tcp(&child, backend, Duration::from_secs(30)).await?;

        let pair = ca.issue(&CertSpec {
            common_name: "s3-sandbox".into(),
            dns_names: vec!["localhost".into()],
            ips: vec![ip],
            server: true,
            ..CertSpec::default()
        })?;
        let mut tls = (*server_tls_config(&pair, None)?).clone();
        // The backend speaks HTTP/1.1; never negotiate h2 on its behalf.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(|source| ProcError::NoFreePort { ip, source })?;
        let front_addr = listener
            .local_addr()
            .map_err(|source| ProcError::NoFreePort { ip, source })?;
        let faults_path = dir.join(S3_FAULTS_FILE);
        let front = tokio::spawn(super::s3_front::serve(
            listener,
            tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
            backend,
            Arc::new(S3Injector::new(faults_path.clone())),
        ));

        Ok(S3Endpoint {
            child,
            front,
            root,
            faults_path,
            http_url: format!("http://{backend}"),
            https_url: format!("https://{front_addr}"),
            access_key,
            secret_key,
        })
    }

    /// `https://127.0.0.1:<port>` (certificate from the sandbox CA).
    pub fn https_url(&self) -> &str {
        &self.https_url
    }

    /// `http://127.0.0.1:<port>` (s3s-fs itself).
    pub fn http_url(&self) -> &str {
        &self.http_url
    }

    /// The access key id s3s-fs accepts.
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The matching secret key.
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// The region to sign for (`us-east-1`).
    pub fn region(&self) -> &str {
        REGION
    }

    /// The directory s3s-fs stores buckets in (one sub-directory per bucket).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The s3s-fs log file.
    pub fn log_path(&self) -> &Path {
        self.child.log_path()
    }

    /// `dir/s3-faults.json`: the faults the HTTPS front injects (absent: none).
    pub fn faults_path(&self) -> &Path {
        &self.faults_path
    }

    /// Make the HTTPS front fail a share of its requests (`Some`), or stop
    /// (`None`): writes or removes [`S3Endpoint::faults_path`], which the
    /// front reads again at its next request. The plain-http URL is never
    /// faulted.
    pub fn set_faults(&self, faults: Option<&S3Faults>) -> std::io::Result<()> {
        write_faults_file(&self.faults_path, faults)
    }

    /// The faults the HTTPS front injected so far, oldest first (from
    /// `dir/s3-faults.json.log`, one object per fault: `time`, `kind`,
    /// `method`, `path`, `user_agent`, and `bytes` for the resets).
    pub fn faults_injected(&self) -> Vec<serde_json::Value> {
        read_log(&self.faults_path)
    }

    /// Create a bucket. s3s-fs keeps each bucket as a directory under its root,
    /// so this creates that directory (after checking the S3 naming rules);
    /// it fails if the bucket exists, like `CreateBucket` in us-east-1 for a
    /// foreign owner.
    pub async fn create_bucket(&self, name: &str) -> Result<(), ProcError> {
        self.child.check_running()?;
        if !valid_bucket_name(name) {
            return Err(ProcError::S3 {
                op: "CreateBucket",
                message: format!("invalid bucket name `{name}`"),
            });
        }
        let path = self.root.join(name);
        std::fs::create_dir(&path).map_err(|e| ProcError::S3 {
            op: "CreateBucket",
            message: format!("{}: {e}", path.display()),
        })
    }
}

/// An AWS SDK S3 client configuration for `endpoint` (the HTTPS front, or
/// s3s-fs itself), path-style, trusting only `ca_pem`, signing with
/// `access_key` and `secret_key`; callers add retries or timeouts and build.
pub fn sdk_config(endpoint: &str, region: &str, access_key: &str, secret_key: &str, ca_pem: &str) -> Result<aws_sdk_s3::config::Builder, ProcError> {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    let tls_context = TlsContext::builder()
        .with_trust_store(TrustStore::empty().with_pem_certificate(ca_pem.as_bytes()))
        .build()
        .map_err(|e| ProcError::InvalidConfig(format!("the S3 client's trust store: {e}")))?;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .tls_context(tls_context)
        .build_https();
    Ok(aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new(region.to_string()))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(aws_sdk_s3::config::Credentials::new(access_key, secret_key, None, None, "hcp-dr-sandbox"))
        .http_client(http))
}

/// S3 bucket naming rules: 3-63 characters of lowercase letters, digits, `.`
/// and `-`, starting and ending with a letter or digit, no `..`, not an IP.
pub fn valid_bucket_name(name: &str) -> bool {
    let len_ok = (3..=63).contains(&name.len());
    let chars_ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    let ends_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    len_ok && chars_ok && ends_ok && !name.contains("..") && name.parse::<Ipv4Addr>().is_err()
}

/// GET `url` (`https://`) over HTTP/1.1 trusting only `ca_pem`; returns the
/// status code and body. For fetching presigned URLs the way a real client
/// (e.g. etcd's restore init container) would.
pub async fn https_get(url: &str, ca_pem: &str) -> Result<(u16, Bytes), ProcError> {
    let fail = |message: String| ProcError::S3 { op: "GET", message };
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| fail(format!("invalid URL {url}: {e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(fail(format!("not an https URL: {url}")));
    }
    let host = uri
        .host()
        .ok_or_else(|| fail(format!("no host in {url}")))?
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_else(|| host.clone());
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());

    let mut config = (*client_tls_config(ca_pem, None)?).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let bare_host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let server_name = rustls::pki_types::ServerName::try_from(bare_host.clone())
        .map_err(|e| fail(format!("invalid server name {bare_host}: {e}")))?;
    let tcp = TcpStream::connect((bare_host.as_str(), port))
        .await
        .map_err(|e| fail(format!("connecting to {authority}: {e}")))?;
    let tls = connector
        .connect(server_name, tcp)
        .await
        .map_err(|e| fail(format!("TLS with {authority}: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| fail(format!("HTTP handshake with {authority}: {e}")))?;
    let driver = tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(format!("building request: {e}")))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail(format!("GET {url}: {e}")))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(format!("reading body of {url}: {e}")))?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::valid_bucket_name;

    #[test]
    fn bucket_names_follow_s3_rules() {
        for ok in ["hcp-backups", "a.b-c", "abc", "x1y"] {
            assert!(valid_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            "Upper",
            "-lead",
            "trail-",
            "a..b",
            "192.168.1.1",
            "under_score",
            &"a".repeat(64),
        ] {
            assert!(!valid_bucket_name(bad), "{bad}");
        }
    }
}
