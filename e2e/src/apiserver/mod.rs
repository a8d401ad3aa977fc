//! A Kubernetes API server emulator on real etcd.
//!
//! One [`ApiServer`] emulates the API of one cluster: objects are stored in
//! etcd as a kube-apiserver stores them, served over TLS with bearer-token
//! authentication, with the status codes, `Status` bodies, resourceVersion
//! conflicts, finalizers, namespace lifecycle, garbage collection, CRDs
//! (schema defaulting, pruning and validation), watches and discovery that
//! clients such as kube-rs and kubectl rely on, and the authentication
//! (static and ServiceAccount bearer tokens) and RBAC authorization a real
//! server applies. See `docs/sandbox.md` for the scope and the known
//! differences from a real server.
pub mod audit;
mod authn;
pub mod cel;
pub mod patch;
pub mod portforward;
pub mod schema;

mod controllers;
pub mod conversion;
pub mod faults;
mod defaults;
mod discovery;
mod http;
mod ops;
mod rbac;
pub mod resources;
pub mod selector;
mod serve;
pub mod status;
mod store;
mod table;
mod typed;
pub mod validation;
mod watch;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Notify, watch as tokio_watch};
use tokio::task::JoinHandle;

use crate::pki;
use resources::Registry;
use store::Store;

/// Bound on one etcd key-value request (a kube-apiserver answers 504 after 60 s).
const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How the emulator reaches its etcd over TLS.
#[derive(Clone)]
pub struct EtcdClientTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// Name the etcd serving certificate is checked against.
    pub server_name: String,
}

impl std::fmt::Debug for EtcdClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// A bearer token and the identity it authenticates.
#[derive(Clone)]
pub struct TokenUser {
    pub token: String,
    pub user: String,
    pub groups: Vec<String>,
}

impl std::fmt::Debug for TokenUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenUser")
            .field("user", &self.user)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

/// Everything an [`ApiServer`] needs to start.
pub struct ApiServerConfig {
    /// Cluster name used in the kubeconfig (`mgmt-a`).
    pub cluster_name: String,
    pub bind_ip: IpAddr,
    /// 0 = ephemeral; a fixed port lets a restarted server keep its URL.
    pub port: u16,
    pub etcd_endpoints: Vec<String>,
    pub etcd_tls: Option<EtcdClientTls>,
    /// `/registry` (management clusters) or `/kubernetes.io` (hosted clusters).
    pub key_prefix: String,
    /// Every `*.yaml` here and in its `platform/` subdirectory is created (or
    /// updated) as a CRD at start, except a CRD of a group served built in
    /// (Routes); multi-document YAML allowed.
    pub crd_dirs: Vec<PathBuf>,
    /// Issues the serving certificate (SANs: bind_ip, 127.0.0.1, localhost).
    pub ca: pki::Ca,
    /// Bearer tokens; empty: one random admin token is generated.
    pub tokens: Vec<TokenUser>,
    /// Faults to inject ([`faults::ApiFaults`] as JSON), read again whenever
    /// the file changes; absent file: none. Injected faults are recorded in
    /// `<faults_file>.log`. None: this server never injects faults.
    pub faults_file: Option<PathBuf>,
    /// Append one line per request here, as kube-apiserver's
    /// `--audit-log-path` does ([`audit`]); None: no log.
    pub audit_log: Option<PathBuf>,
}

/// Why the emulator could not start or build a client.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// Connecting to etcd failed.
    #[error("connecting to etcd at {endpoints:?}: {source}")]
    EtcdConnect {
        endpoints: Vec<String>,
        #[source]
        source: etcd_client::Error,
    },
    /// Reading stored objects (CRDs) at start failed.
    #[error("reading stored state from etcd: {0}")]
    Store(#[source] store::StoreError),
    /// Issuing the serving certificate or building the TLS configuration failed.
    #[error("serving certificate: {0}")]
    Pki(#[source] pki::PkiError),
    /// Binding the listening socket failed.
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A CRD directory or file could not be read.
    #[error("reading CRD file {path}: {source}")]
    CrdRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A CRD file is not valid YAML.
    #[error("parsing CRD file {path}: {message}")]
    CrdParse { path: PathBuf, message: String },
    /// A CRD from a file was rejected by the server logic.
    #[error("creating CRD from {path}: {source}")]
    CrdRejected {
        path: PathBuf,
        #[source]
        source: status::ApiError,
    },
    /// Creating the system namespaces (default, kube-system, ...) failed.
    #[error("creating the system namespaces: {source}")]
    Bootstrap {
        #[source]
        source: status::ApiError,
    },
    /// Creating the bootstrap RBAC roles and bindings failed.
    #[error("creating the bootstrap RBAC policy: {source}")]
    BootstrapPolicy {
        #[source]
        source: status::ApiError,
    },
    /// The audit log could not be opened.
    #[error("opening the audit log {path}: {source}")]
    AuditLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kube-rs client could not be configured from the kubeconfig.
    #[error("building a kube client: {0}")]
    Client(String),
}

/// An owner waiting for its dependents (Foreground deletion).
pub(crate) type ForegroundOwner = (Arc<resources::ResourceType>, Option<String>, String, String);

/// Shared state of a running emulator.
pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) registry: RwLock<Registry>,
    pub(crate) tokens: Vec<TokenUser>,
    /// Signs and checks the ServiceAccount tokens of the TokenRequest API.
    pub(crate) token_signing_key: [u8; 32],
    pub(crate) shutdown: tokio_watch::Receiver<bool>,
    /// Wakes the controllers (namespace lifecycle, CRD cleanup, garbage collection).
    pub(crate) kick: Notify,
    /// uids of objects removed from storage, for the garbage collector.
    pub(crate) gc_queue: Mutex<Vec<String>>,
    /// Owners in Foreground deletion: (type, namespace, name, uid).
    pub(crate) foreground: Mutex<Vec<ForegroundOwner>>,
    /// `ip:port` clients use (for `/api` serverAddressByClientCIDRs).
    pub(crate) address: String,
    /// Decides the injected faults (from `ApiServerConfig::faults_file`).
    pub(crate) faults: Option<faults::Injector>,
    /// Logs every request (from `ApiServerConfig::audit_log`).
    pub(crate) audit: Option<audit::AuditLog>,
}

impl Inner {
    pub(crate) fn registry(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }
    pub(crate) fn registry_mut(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|p| p.into_inner())
    }
    pub(crate) fn enqueue_gc(&self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        self.gc_queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(uid.to_string());
        self.kick.notify_one();
    }
}

/// A running emulated API server.
pub struct ApiServer {
    inner: Arc<Inner>,
    url: String,
    admin_token: String,
    ca_pem: String,
    cluster_name: String,
    shutdown_tx: tokio_watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Parse every document of a (multi-document) YAML text.
pub(crate) fn yaml_documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

impl ApiServer {
    /// Connect to etcd, load CRDs, bind and serve.
    pub async fn start(cfg: ApiServerConfig) -> Result<ApiServer, ApiServerError> {
        let mut opts =
            etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
        if let Some(t) = &cfg.etcd_tls {
            opts = opts.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(t.ca_pem.as_bytes()))
                    .identity(etcd_client::Identity::from_pem(
                        t.cert_pem.as_bytes(),
                        t.key_pem.as_bytes(),
                    ))
                    .domain_name(t.server_name.clone()),
            );
        }
        // one client for watches (long-lived streams: no request timeout) and
        // one for key-value requests, bounded like a kube-apiserver's 60 s
        let watch_client = etcd_client::Client::connect(&cfg.etcd_endpoints, Some(opts.clone()))
            .await
            .map_err(|source| ApiServerError::EtcdConnect {
                endpoints: cfg.etcd_endpoints.clone(),
                source,
            })?;
        let kv_opts = opts.with_timeout(ETCD_REQUEST_TIMEOUT);
        let client = etcd_client::Client::connect(&cfg.etcd_endpoints, Some(kv_opts))
            .await
            .map_err(|source| ApiServerError::EtcdConnect {
                endpoints: cfg.etcd_endpoints.clone(),
                source,
            })?;
        let store = Store::new(client, watch_client, &cfg.key_prefix);

        let tokens = if cfg.tokens.is_empty() {
            vec![TokenUser {
                token: random_token(),
                user: "system:admin".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
            }]
        } else {
            cfg.tokens.clone()
        };
        let admin_token = tokens[0].token.clone();

        let addr = SocketAddr::new(cfg.bind_ip, cfg.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ApiServerError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| ApiServerError::Bind { addr, source })?;
        let url = format!("https://{local}");

        let mut ips = vec![cfg.bind_ip];
        for ip in [IpAddr::from([127, 0, 0, 1])] {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        let pair = cfg
            .ca
            .issue(&pki::CertSpec {
                common_name: "kube-apiserver".into(),
                organization: None,
                dns_names: vec![
                    "localhost".into(),
                    "kubernetes".into(),
                    "kubernetes.default".into(),
                    "kubernetes.default.svc".into(),
                    "kubernetes.default.svc.cluster.local".into(),
                ],
                ips,
                server: true,
                client: false,
            })
            .map_err(ApiServerError::Pki)?;
        let tls = pki::server_tls_config(&pair, None).map_err(ApiServerError::Pki)?;

        let audit = match &cfg.audit_log {
            Some(path) => Some(audit::AuditLog::open(path).map_err(|source| ApiServerError::AuditLog {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        let (shutdown_tx, shutdown_rx) = tokio_watch::channel(false);
        let inner = Arc::new(Inner {
            store,
            registry: RwLock::new(Registry::with_builtins()),
            tokens,
            token_signing_key: authn::signing_key(cfg.ca.key_pem(), &cfg.cluster_name, &cfg.key_prefix),
            shutdown: shutdown_rx,
            kick: Notify::new(),
            gc_queue: Mutex::new(Vec::new()),
            foreground: Mutex::new(Vec::new()),
            address: local.to_string(),
            faults: cfg.faults_file.clone().map(faults::Injector::new),
            audit,
        });

        inner.load_stored_crds().await?;
        inner
            .ensure_system_namespaces()
            .await
            .map_err(|source| ApiServerError::Bootstrap { source })?;
        inner
            .ensure_bootstrap_policy()
            .await
            .map_err(|source| ApiServerError::BootstrapPolicy { source })?;
        for dir in &cfg.crd_dirs {
            load_crd_dir(&inner, dir).await?;
        }

        let tasks = vec![
            tokio::spawn(serve::accept_loop(inner.clone(), listener, tls)),
            tokio::spawn(controllers::run(inner.clone())),
        ];

        Ok(ApiServer {
            inner,
            url,
            admin_token,
            ca_pem: cfg.ca.cert_pem().to_string(),
            cluster_name: cfg.cluster_name,
            shutdown_tx,
            tasks,
        })
    }

    /// `https://ip:port`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig (YAML) with the CA data and the admin token, `context` current.
    pub fn kubeconfig(&self, context: &str) -> String {
        let user = format!("admin-{}", self.cluster_name);
        self.kubeconfig_with_token(context, &user, &self.admin_token)
    }

    /// A kubeconfig (YAML) with the CA data and `token` (e.g. a
    /// ServiceAccount's, from `kubectl create token`) for `user`, `context` current.
    pub fn kubeconfig_with_token(&self, context: &str, user: &str, token: &str) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        let cluster = &self.cluster_name;
        let doc = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster, "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": context, "context": {"cluster": cluster, "user": user}}],
            "current-context": context,
            "preferences": {},
        });
        serde_saphyr::to_string(&doc)
            .unwrap_or_else(|_| serde_json::to_string_pretty(&doc).unwrap_or_default())
    }

    /// Write [`ApiServer::kubeconfig`] to `path` with mode 0600.
    pub fn write_kubeconfig(&self, path: &Path, context: &str) -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        use std::os::unix::fs::PermissionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(self.kubeconfig(context).as_bytes())?;
        f.sync_all()
    }

    /// A kube-rs client authenticated with the admin token.
    pub async fn client(&self) -> Result<kube::Client, ApiServerError> {
        self.client_with_token(&self.admin_token).await
    }

    /// A kube-rs client authenticated with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client, ApiServerError> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_with_token("client", "client", token))
            .map_err(|e| ApiServerError::Client(e.to_string()))?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ApiServerError::Client(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| ApiServerError::Client(e.to_string()))
    }

    /// Stop accepting connections, end open watches and connections, stop the controllers.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
        for t in &self.tasks {
            t.abort();
        }
        let _ = &self.inner;
    }
}

/// Register the CRDs of `dir` and of its platform subdirectory
/// ([`crate::crds::crd_files`]), except those of a group served built in
/// (the Route CRD: Routes are built in), which would register it twice.
async fn load_crd_dir(inner: &Arc<Inner>, dir: &Path) -> Result<(), ApiServerError> {
    let files = crate::crds::crd_files(dir).map_err(|source| ApiServerError::CrdRead {
        path: dir.to_path_buf(),
        source,
    })?;
    let builtin_groups: std::collections::BTreeSet<String> =
        resources::builtins().into_iter().map(|t| t.group).collect();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|source| ApiServerError::CrdRead {
            path: path.clone(),
            source,
        })?;
        let docs = yaml_documents(&text).map_err(|message| ApiServerError::CrdParse {
            path: path.clone(),
            message,
        })?;
        for doc in docs {
            if doc.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
                continue;
            }
            let group = doc.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
            if builtin_groups.contains(group) {
                tracing::debug!(path = %path.display(), group, "CRD of a group served built in: skipped");
                continue;
            }
            inner
                .apply_crd(doc)
                .await
                .map_err(|source| ApiServerError::CrdRejected {
                    path: path.clone(),
                    source,
                })?;
        }
    }
    Ok(())
}
