//! A tiny certificate authority for the sandbox.
//!
//! Every simulated cluster gets its own CA (like a real HyperShift control
//! plane, whose etcd, kube-apiserver and clients each chain to a CA kept in the
//! HCP namespace). Keys are ECDSA P-256, certificates are valid from 2020 to
//! 2099, and serial numbers are random.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::pem::{Error as PemError, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Errors of the PKI helpers.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused to generate a key or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[source] rcgen::Error),
    /// A DNS name could not be used as a subject alternative name.
    #[error("invalid DNS name `{name}` for a certificate: {source}")]
    InvalidDnsName {
        /// The rejected name.
        name: String,
        /// Why rcgen rejected it.
        #[source]
        source: rcgen::Error,
    },
    /// A PEM document held no usable certificate or key.
    #[error("no {what} found in PEM data")]
    MissingPem {
        /// What was looked for ("certificate", "private key").
        what: &'static str,
    },
    /// A PEM document could not be parsed.
    #[error("invalid PEM data ({what}): {source}")]
    InvalidPem {
        /// What was being parsed.
        what: &'static str,
        /// The parser error.
        #[source]
        source: PemError,
    },
    /// The saved CA certificate or key could not be loaded back.
    #[error("loading the CA from {path}: {source}")]
    LoadCa {
        /// The CA directory.
        path: PathBuf,
        /// The rcgen parse error.
        #[source]
        source: rcgen::Error,
    },
    /// Reading or writing a PEM file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// "reading" or "writing".
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// rustls rejected the certificate, key or client CA.
    #[error("building the TLS configuration: {0}")]
    Tls(#[source] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("building the client certificate verifier: {0}")]
    ClientVerifier(#[source] rustls::server::VerifierBuilderError),
}

/// A certificate authority: its certificate and signing key, both PEM.
#[derive(Clone)]
pub struct Ca {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// What to put in a leaf certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertSpec {
    /// Subject CN (for client certs this is the user name a kube-apiserver sees).
    pub common_name: String,
    /// Subject O (for client certs: the group, e.g. `system:masters`).
    pub organization: Option<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ips: Vec<IpAddr>,
    /// Usable as a TLS server certificate (extended key usage serverAuth).
    pub server: bool,
    /// Usable as a TLS client certificate (extended key usage clientAuth).
    pub client: bool,
}

/// A leaf certificate and its private key, both PEM (the key is PKCS#8).
#[derive(Clone)]
pub struct CertPair {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl CertPair {
    /// Write `<stem>.crt` and `<stem>.key` (mode 0600) into `dir`, returning both paths.
    pub fn write_files(&self, dir: &Path, stem: &str) -> Result<(PathBuf, PathBuf), PkiError> {
        let crt = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        write_file(&crt, &self.cert_pem, false)?;
        write_file(&key, &self.key_pem, true)?;
        Ok((crt, key))
    }
}

const CA_CERT_FILE: &str = "ca.crt";
const CA_KEY_FILE: &str = "ca.key";

fn validity(params: &mut CertificateParams) {
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 12, 31);
}

fn random_serial() -> SerialNumber {
    let mut bytes = *uuid::Uuid::new_v4().as_bytes();
    // Positive and never starting with a zero byte (DER INTEGER rules).
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

impl Ca {
    /// A new self-signed CA with subject CN `common_name`.
    pub fn new(common_name: &str) -> Result<Ca, PkiError> {
        let key = KeyPair::generate().map_err(PkiError::Generate)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial());
        validity(&mut params);
        let cert = params.self_signed(&key).map_err(PkiError::Generate)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM (for fixtures that must hand it to a simulated component).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issue a leaf certificate signed by this CA.
    pub fn issue(&self, spec: &CertSpec) -> Result<CertPair, PkiError> {
        let ca_key = KeyPair::from_pem(&self.key_pem).map_err(PkiError::Generate)?;
        let issuer =
            Issuer::from_ca_cert_pem(&self.cert_pem, ca_key).map_err(PkiError::Generate)?;
        let key = KeyPair::generate().map_err(PkiError::Generate)?;

        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, spec.common_name.as_str());
        if let Some(org) = &spec.organization {
            dn.push(DnType::OrganizationName, org.as_str());
        }
        params.distinguished_name = dn;
        for name in &spec.dns_names {
            let ia5 = name
                .clone()
                .try_into()
                .map_err(|source| PkiError::InvalidDnsName {
                    name: name.clone(),
                    source,
                })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        for ip in &spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if spec.server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if spec.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        validity(&mut params);
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(PkiError::Generate)?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Write `ca.crt` and `ca.key` (mode 0600) into `dir` (created if missing).
    pub fn save(&self, dir: &Path) -> Result<(), PkiError> {
        std::fs::create_dir_all(dir).map_err(|source| PkiError::Io {
            op: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
        write_file(&dir.join(CA_CERT_FILE), &self.cert_pem, false)?;
        write_file(&dir.join(CA_KEY_FILE), &self.key_pem, true)?;
        Ok(())
    }

    /// Load a CA written by [`Ca::save`].
    pub fn load(dir: &Path) -> Result<Ca, PkiError> {
        let cert_pem = read_file(&dir.join(CA_CERT_FILE))?;
        let key_pem = read_file(&dir.join(CA_KEY_FILE))?;
        // Validate now so a broken CA fails at load, not at the first issue().
        let key = KeyPair::from_pem(&key_pem).map_err(|source| PkiError::LoadCa {
            path: dir.to_path_buf(),
            source,
        })?;
        Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|source| PkiError::LoadCa {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Ca { cert_pem, key_pem })
    }
}

fn read_file(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        op: "reading",
        path: path.to_path_buf(),
        source,
    })
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), PkiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| PkiError::Io {
        op: "writing",
        path: path.to_path_buf(),
        source,
    };
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    opts.mode(if private { 0o600 } else { 0o644 });
    let mut f = opts.open(path).map_err(io)?;
    f.write_all(contents.as_bytes()).map_err(io)?;
    if private {
        // `mode` only applies to newly created files; tighten an existing one too.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
    }
    Ok(())
}

/// Parse every certificate in a PEM bundle.
pub fn parse_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| PkiError::InvalidPem {
            what: "certificate",
            source,
        })?;
    if certs.is_empty() {
        return Err(PkiError::MissingPem {
            what: "certificate",
        });
    }
    Ok(certs)
}

/// Parse the first private key in a PEM document.
pub fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|source| match source {
        PemError::NoItemsFound => PkiError::MissingPem {
            what: "private key",
        },
        source => PkiError::InvalidPem {
            what: "private key",
            source,
        },
    })
}

/// A root store holding every certificate of `ca_pem`.
pub fn root_store(ca_pem: &str) -> Result<rustls::RootCertStore, PkiError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in parse_certs(ca_pem)? {
        roots.add(cert).map_err(PkiError::Tls)?;
    }
    Ok(roots)
}

fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    // Explicit provider: several crypto backends may be compiled into the
    // test binaries, and rustls refuses to guess between them.
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server configuration presenting `pair`, offering ALPN `h2` and
/// `http/1.1`. With `client_ca_pem`, clients must present a certificate
/// signed by that CA (as a kube-apiserver or etcd with client-cert-auth does).
pub fn server_tls_config(
    pair: &CertPair,
    client_ca_pem: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>, PkiError> {
    let certs = parse_certs(&pair.cert_pem)?;
    let key = parse_key(&pair.key_pem)?;
    let provider = ring_provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(PkiError::Tls)?;
    let builder = match client_ca_pem {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(root_store(ca)?),
                provider,
            )
            .build()
            .map_err(PkiError::ClientVerifier)?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(PkiError::Tls)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A rustls client configuration trusting only `ca_pem`, optionally presenting
/// a client certificate. ALPN `h2` and `http/1.1`.
pub fn client_tls_config(
    ca_pem: &str,
    client: Option<&CertPair>,
) -> Result<Arc<rustls::ClientConfig>, PkiError> {
    let builder = rustls::ClientConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .map_err(PkiError::Tls)?
        .with_root_certificates(root_store(ca_pem)?);
    let mut config = match client {
        Some(pair) => builder
            .with_client_auth_cert(parse_certs(&pair.cert_pem)?, parse_key(&pair.key_pem)?)
            .map_err(PkiError::Tls)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn server_spec() -> CertSpec {
        CertSpec {
            common_name: "server".into(),
            organization: None,
            dns_names: vec!["localhost".into()],
            ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            server: true,
            client: false,
        }
    }

    /// Run one TLS handshake + echo of 4 bytes; returns the client's result.
    async fn handshake(
        server: Arc<rustls::ServerConfig>,
        client: Arc<rustls::ClientConfig>,
        name: &str,
    ) -> Result<Vec<u8>, std::io::Error> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let server_task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await?;
            let mut tls = acceptor.accept(tcp).await?;
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await?;
            tls.write_all(&buf).await?;
            tls.shutdown().await?;
            Ok::<_, std::io::Error>(())
        });
        let connector = tokio_rustls::TlsConnector::from(client);
        let result = async {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let server_name = rustls::pki_types::ServerName::try_from(name.to_string())
                .map_err(std::io::Error::other)?;
            let mut tls = connector.connect(server_name, tcp).await?;
            tls.write_all(b"ping").await?;
            let mut out = Vec::new();
            tls.read_to_end(&mut out).await?;
            Ok(out)
        }
        .await;
        server_task.abort();
        result
    }

    #[tokio::test]
    async fn issued_server_cert_verifies_against_its_ca_only() {
        let ca = Ca::new("test-ca").expect("ca");
        let pair = ca.issue(&server_spec()).expect("issue");
        let server = server_tls_config(&pair, None).expect("server config");

        let good = client_tls_config(ca.cert_pem(), None).expect("client config");
        assert_eq!(
            handshake(server.clone(), good.clone(), "localhost")
                .await
                .expect("tls"),
            b"ping"
        );
        assert_eq!(
            handshake(server.clone(), good.clone(), "127.0.0.1")
                .await
                .expect("tls"),
            b"ping"
        );
        // Name not in the SANs: rejected.
        assert!(
            handshake(server.clone(), good, "other.example")
                .await
                .is_err()
        );

        let other = Ca::new("other-ca").expect("ca");
        let wrong = client_tls_config(other.cert_pem(), None).expect("client config");
        assert!(handshake(server, wrong, "localhost").await.is_err());
    }

    #[tokio::test]
    async fn client_certificates_are_required_when_a_client_ca_is_given() {
        let ca = Ca::new("test-ca").expect("ca");
        let pair = ca.issue(&server_spec()).expect("issue");
        let server = server_tls_config(&pair, Some(ca.cert_pem())).expect("server config");
        let client_pair = ca
            .issue(&CertSpec {
                common_name: "admin".into(),
                organization: Some("system:masters".into()),
                client: true,
                ..CertSpec::default()
            })
            .expect("client cert");
        let with_cert = client_tls_config(ca.cert_pem(), Some(&client_pair)).expect("cfg");
        assert_eq!(
            handshake(server.clone(), with_cert, "localhost")
                .await
                .expect("tls"),
            b"ping"
        );

        let without = client_tls_config(ca.cert_pem(), None).expect("cfg");
        assert!(
            handshake(server.clone(), without, "localhost")
                .await
                .is_err()
        );

        let stranger = Ca::new("stranger").expect("ca");
        let foreign = stranger
            .issue(&CertSpec {
                common_name: "x".into(),
                client: true,
                ..CertSpec::default()
            })
            .expect("cert");
        let foreign_cfg = client_tls_config(ca.cert_pem(), Some(&foreign)).expect("cfg");
        assert!(handshake(server, foreign_cfg, "localhost").await.is_err());
    }

    #[tokio::test]
    async fn saved_ca_loads_and_keeps_issuing_trusted_certs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new("persisted").expect("ca");
        ca.save(dir.path()).expect("save");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca.key"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let loaded = Ca::load(dir.path()).expect("load");
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        let pair = loaded.issue(&server_spec()).expect("issue from loaded CA");
        let server = server_tls_config(&pair, None).expect("server config");
        // Trusting the ORIGINAL CA certificate must be enough.
        let client = client_tls_config(ca.cert_pem(), None).expect("client config");
        assert_eq!(
            handshake(server, client, "localhost").await.expect("tls"),
            b"ping"
        );
    }

    #[test]
    fn load_reports_missing_files_and_bad_pem() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(Ca::load(dir.path()), Err(PkiError::Io { .. })));
        std::fs::write(dir.path().join("ca.crt"), "garbage").expect("write");
        std::fs::write(dir.path().join("ca.key"), "garbage").expect("write");
        assert!(matches!(Ca::load(dir.path()), Err(PkiError::LoadCa { .. })));
        assert!(matches!(
            parse_certs("nothing here"),
            Err(PkiError::MissingPem { .. })
        ));
        assert!(matches!(
            parse_key("nothing here"),
            Err(PkiError::MissingPem { .. })
        ));
        let truncated = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n";
        assert!(matches!(
            parse_key(truncated),
            Err(PkiError::InvalidPem { .. })
        ));
    }
}
