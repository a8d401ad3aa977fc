//! The S3 store (aws-sdk-s3): streaming multipart uploads with bounded
//! parallelism, endpoint override and path-style addressing for
//! S3-compatible services, a custom CA bundle, and optional SSE-S3 / SSE-KMS.
//!
//! A flaky S3 (500, 503 SlowDown, connections reset mid-body, stalled
//! reads) is met at two levels. Every request is retried by the SDK with
//! exponential backoff and jitter (`max_attempts`). On top of that, each
//! multipart part, single-part upload and completion is tried again as a
//! whole when the SDK gives up (`part_attempts`), and a download that breaks
//! or stalls mid-body goes on from the byte it reached with a ranged GET
//! pinned to the object's ETag (`If-Match`), so a changed object is refused
//! rather than spliced (`download_attempts` failures in a row without a
//! byte of progress end it).
//!
//! Memory is bounded by `part_size * (parallelism + 1)` whatever the object
//! size and however many uploads run at once (the member snapshots of a
//! backup, the backups of a fleet run): every upload of one store draws its
//! part buffers from one budget ([`PartBudget`]), and a buffer is reused
//! once its part is sent.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Region, SharedHttpClient};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;

use super::object_lock::{BucketLock, LockMode, ObjectHold, ObjectLock};
use super::{Body, Hasher, ObjectInfo, PutReport, Store, StoreError, check_key, read_full};
use crate::error::error_chain;

/// Server-side encryption asked of S3.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ServerSideEncryption {
    #[default]
    None,
    /// SSE-S3 (AES256).
    S3,
    /// SSE-KMS with this key (id, ARN or alias).
    Kms { key_id: String },
}

/// How to reach S3. Resolved once by the CLI: flag > environment > default.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Endpoint override (`--s3-endpoint`, else `AWS_ENDPOINT_URL_S3` /
    /// `AWS_ENDPOINT_URL` as the SDK reads them).
    pub endpoint: Option<String>,
    /// Region; the SDK's chain (AWS_REGION, profile) when None, else us-east-1.
    pub region: Option<String>,
    /// Path-style addressing (needed by most S3-compatible services); on by
    /// default when an endpoint is given.
    pub path_style: Option<bool>,
    /// Extra CA certificates (PEM) to trust, e.g. a private S3 endpoint's.
    pub ca_bundle: Option<PathBuf>,
    pub sse: ServerSideEncryption,
    /// Multipart part size (S3's minimum is 5 MiB).
    pub part_size: usize,
    /// Parts one upload sends at once. Every upload of the store draws on
    /// one budget of `parallelism + 1` part buffers, so several uploads at
    /// once share these.
    pub parallelism: usize,
    /// Attempts per request, made by the SDK (with exponential backoff).
    pub max_attempts: u32,
    /// Times a part (or a whole small object, or the completion of a
    /// multipart upload) is sent again once the SDK has given up on it.
    pub part_attempts: u32,
    /// Failed or stalled reads in a row, without a byte of progress between
    /// them, after which a download gives up.
    pub download_attempts: u32,
    /// How long a connection may stay silent (connecting, waiting for the
    /// answer, or mid-body on a download) before it is given up and retried.
    pub stall_timeout: Duration,
    /// Access key and secret to use instead of the SDK's credential chain
    /// (environment, profile, web identity). For embedding and tests.
    pub static_credentials: Option<(String, String)>,
    /// `backup --lock-for`: every object this store writes gets this S3
    /// Object Lock retention, and one still under it is kept, not deleted.
    /// Only the store a backup writes its own folder through has it.
    pub object_lock: Option<ObjectLock>,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            endpoint: None,
            region: None,
            path_style: None,
            ca_bundle: None,
            sse: ServerSideEncryption::None,
            // S3's minimum: the 5 buffers of the budget are most of a
            // backup's heap (heaptrack, 2026-11-30: 42 of 67 MiB at 8 MiB);
            // an 8 GiB member is still 1,639 parts of the 10,000 allowed
            part_size: 5 << 20,
            parallelism: 4,
            max_attempts: 5,
            part_attempts: 3,
            download_attempts: 8,
            stall_timeout: Duration::from_secs(60),
            static_credentials: None,
            object_lock: None,
        }
    }
}

pub struct S3Store {
    client: Client,
    bucket: String,
    prefix: String,
    options: S3Options,
    parts: Arc<PartBudget>,
}

/// The part buffers every upload of one store draws from: at most
/// `count` exist at once, and one whose part was sent is kept for the next
/// part rather than freed and allocated again (MiB-sized allocations freed and
/// made again by several threads leave the allocator's arenas holding them).
struct PartBudget {
    size: usize,
    permits: Arc<Semaphore>,
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

/// One part's bytes. Its buffer goes back to the budget when the last
/// `Bytes` made of it (the SDK holds one per try) is dropped.
struct PartBuffer {
    buf: Vec<u8>,
    len: usize,
    budget: Arc<PartBudget>,
    _permit: OwnedSemaphorePermit,
}

impl PartBudget {
    fn new(size: usize, count: usize) -> Arc<PartBudget> {
        Arc::new(PartBudget {
            size,
            permits: Arc::new(Semaphore::new(count.max(1))),
            free: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// A buffer, once the budget has one to give.
    async fn take(self: &Arc<Self>) -> PartBuffer {
        // the semaphore is never closed
        let permit = self.permits.clone().acquire_owned().await.expect("the part budget's semaphore is never closed");
        let reused = self.free.lock().ok().and_then(|mut free| free.pop());
        PartBuffer {
            buf: reused.unwrap_or_else(|| vec![0u8; self.size]),
            len: 0,
            budget: self.clone(),
            _permit: permit,
        }
    }
}

impl PartBuffer {
    /// Fill it from `body` (to its size, or to the body's end): the bytes read.
    async fn fill(&mut self, body: &mut Body<'_>) -> std::io::Result<usize> {
        self.len = read_full(body, &mut self.buf).await?;
        Ok(self.len)
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl AsRef<[u8]> for PartBuffer {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for PartBuffer {
    fn drop(&mut self) {
        // back before the permit (a field) is released
        let buf = std::mem::take(&mut self.buf);
        if let Ok(mut free) = self.budget.free.lock() {
            free.push(buf);
        }
    }
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The HTTPS client the AWS adapters (S3, Route53) share: rustls with ring,
/// trusting the platform roots plus the PEM certificates in `ca_bundle`.
pub(crate) fn https_client(ca_bundle: Option<&Path>) -> std::io::Result<SharedHttpClient> {
    let mut trust = aws_smithy_http_client::tls::TrustStore::default();
    if let Some(path) = ca_bundle {
        trust = trust.with_pem_certificate(std::fs::read(path)?);
    }
    let tls = aws_smithy_http_client::tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|err| std::io::Error::other(err.to_string()))?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .tls_context(tls)
        .build_https())
}

/// An AWS SDK error as one line: the service's code and message, else the
/// whole error chain. Shared by the AWS adapters.
pub(crate) fn sdk_message<E>(err: &aws_sdk_s3::error::SdkError<E>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err.as_service_error() {
        Some(service) => format!(
            "{}: {}",
            service.code().unwrap_or("error"),
            service.message().unwrap_or("no message")
        ),
        // the chain of causes, without the SDK's debug dump
        None => error_chain(err),
    }
}

impl S3Store {
    /// Build a client for `bucket` with `options`. No request is made yet.
    pub async fn connect(bucket: String, prefix: String, options: S3Options) -> Result<S3Store, StoreError> {
        let http = https_client(options.ca_bundle.as_deref()).map_err(|source| StoreError::CaBundle {
            path: options.ca_bundle.clone().unwrap_or_default(),
            source,
        })?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::standard().with_max_attempts(options.max_attempts))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5).min(options.stall_timeout))
                    .read_timeout(options.stall_timeout)
                    .build(),
            );
        if let Some(region) = &options.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some((key, secret)) = &options.static_credentials {
            loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
                key.clone(),
                secret.clone(),
                None,
                None,
                "hcp-dr",
            ));
        }
        let shared = loader.load().await;
        let mut config = aws_sdk_s3::config::Builder::from(&shared);
        if shared.region().is_none() {
            config = config.region(Region::new("us-east-1"));
        }
        if let Some(endpoint) = &options.endpoint {
            config = config.endpoint_url(endpoint);
        }
        if options.object_lock.is_some() {
            // S3 refuses a write with a retention unless it carries Content-MD5
            // or a checksum: whatever AWS_REQUEST_CHECKSUM_CALCULATION says,
            // every PutObject and UploadPart sends its CRC32
            config = config.request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenSupported);
        }
        let has_endpoint = options.endpoint.is_some() || shared.endpoint_url().is_some();
        config = config.force_path_style(options.path_style.unwrap_or(has_endpoint));
        Ok(S3Store {
            client: Client::from_conf(config.build()),
            bucket,
            prefix,
            parts: PartBudget::new(options.part_size, options.parallelism.max(1) + 1),
            options,
        })
    }

    fn full_key(&self, key: &str) -> Result<String, StoreError> {
        check_key(key)?;
        Ok(if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        })
    }

    fn err(&self, operation: &'static str, key: &str, message: String) -> StoreError {
        StoreError::S3 {
            operation,
            bucket: self.bucket.clone(),
            key: key.to_string(),
            message,
        }
    }

    async fn put_single(&self, key: &str, bytes: Bytes) -> Result<(), StoreError> {
        let lock = self.options.object_lock.map(|lock| (lock.mode, lock.until(Utc::now())));
        retried(self.options.part_attempts, "PutObject", key, || {
            let mut request = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(key)
                .body(ByteStream::from(bytes.clone()));
            // with a lock the client sends a CRC32 of the body (see `connect`)
            if let Some((mode, until)) = lock {
                request = request.object_lock_mode(mode.to_sdk()).object_lock_retain_until_date(sdk_time(until));
            }
            request = match &self.options.sse {
                ServerSideEncryption::None => request,
                ServerSideEncryption::S3 => request.server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::Aes256),
                ServerSideEncryption::Kms { key_id } => request
                    .server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::AwsKms)
                    .ssekms_key_id(key_id),
            };
            async move { request.send().await.map(|_| ()).map_err(|e| Failure::of(&e)) }
        })
        .await
        .map_err(|(failure, tries)| self.err("PutObject", key, failure.describe(tries)))
    }

    /// Write a small document anyone may read (`public-read`), as HyperShift
    /// writes an OIDC issuer's: without the store's server-side encryption,
    /// which a KMS key would make unreadable to the anonymous readers (STS)
    /// the document is for.
    pub async fn put_public_document(&self, key: &str, bytes: Bytes) -> Result<(), StoreError> {
        let key = self.full_key(key)?;
        retried(self.options.part_attempts, "PutObject", &key, || {
            let request = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(&key)
                .acl(aws_sdk_s3::types::ObjectCannedAcl::PublicRead)
                .content_type("application/json")
                .body(ByteStream::from(bytes.clone()));
            async move { request.send().await.map(|_| ()).map_err(|e| Failure::of(&e)) }
        })
        .await
        .map_err(|(failure, tries)| self.err("PutObject", &key, failure.describe(tries)))
    }

    async fn put_multipart(
        &self,
        key: &str,
        first: Bytes,
        body: &mut Body<'_>,
        hasher: &mut Hasher,
    ) -> Result<(), StoreError> {
        // another try makes another upload id; one whose answer was lost is
        // left unfinished, and aborted by `delete` of the key like any other
        let lock = self.options.object_lock.map(|lock| (lock.mode, lock.until(Utc::now())));
        let upload = retried(self.options.part_attempts, "CreateMultipartUpload", key, || {
            let mut create = self.client.create_multipart_upload().bucket(&self.bucket).key(key);
            if let Some((mode, until)) = lock {
                create = create.object_lock_mode(mode.to_sdk()).object_lock_retain_until_date(sdk_time(until));
            }
            create = match &self.options.sse {
                ServerSideEncryption::None => create,
                ServerSideEncryption::S3 => create.server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::Aes256),
                ServerSideEncryption::Kms { key_id } => create
                    .server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::AwsKms)
                    .ssekms_key_id(key_id),
            };
            async move { create.send().await.map_err(|e| Failure::of(&e)) }
        })
        .await
        .map_err(|(failure, tries)| self.err("CreateMultipartUpload", key, failure.describe(tries)))?;
        let upload_id = upload
            .upload_id()
            .ok_or_else(|| self.err("CreateMultipartUpload", key, "no upload id in the answer".into()))?
            .to_string();
        let result = match self.upload_parts(key, &upload_id, first, body, hasher).await {
            Ok(parts) => {
                let completed = retried(self.options.part_attempts, "CompleteMultipartUpload", key, || {
                    let request = self
                        .client
                        .complete_multipart_upload()
                        .bucket(&self.bucket)
                        .key(key)
                        .upload_id(&upload_id)
                        .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts.clone())).build());
                    async move { request.send().await.map(|_| ()).map_err(|e| Failure::of(&e)) }
                })
                .await;
                match completed {
                    Ok(()) => Ok(()),
                    // A try whose answer was lost on the way back may have
                    // completed it: the retry is then refused (NoSuchUpload,
                    // or AccessDenied from some services). The object is
                    // there, whole, if its size and its multipart ETag say so.
                    Err((failure, tries)) => {
                        self.check_completed(key, hasher.size(), parts.len(), failure.describe(tries)).await
                    }
                }
            }
            Err(err) => Err(err),
        };
        let result = match (result, lock) {
            (Ok(()), Some((mode, until))) => self.ensure_retention(key, mode, until).await,
            (result, _) => result,
        };
        if result.is_err() {
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(&upload_id)
                .send()
                .await;
        }
        result
    }

    /// After a multipart upload with a retention: the object holds it (a
    /// service that dropped the headers of CreateMultipartUpload gets it
    /// set with PutObjectRetention), else the upload fails.
    async fn ensure_retention(&self, key: &str, mode: LockMode, until: DateTime<Utc>) -> Result<(), StoreError> {
        let hold = self.hold_of(key, None).await?;
        if hold.as_ref().is_some_and(|h| h.mode == Some(mode) && h.retain_until.is_some_and(|u| u >= until)) {
            return Ok(());
        }
        let version = hold.and_then(|h| h.version_id);
        self.put_retention(key, version, mode, until).await
    }

    /// PutObjectRetention on `full_key` (its current version, or
    /// `version`), then checked with HeadObject: the object holds `mode`
    /// until `until` at least, else an error. S3 lets anyone with
    /// `s3:PutObjectRetention` set or lengthen a retention, never shorten
    /// one or turn COMPLIANCE into GOVERNANCE.
    async fn put_retention(&self, full_key: &str, version: Option<String>, mode: LockMode, until: DateTime<Utc>) -> Result<(), StoreError> {
        let retention = aws_sdk_s3::types::ObjectLockRetention::builder()
            .mode(match mode {
                LockMode::Compliance => aws_sdk_s3::types::ObjectLockRetentionMode::Compliance,
                LockMode::Governance => aws_sdk_s3::types::ObjectLockRetentionMode::Governance,
            })
            .retain_until_date(sdk_time(until))
            .build();
        self.client
            .put_object_retention()
            .bucket(&self.bucket)
            .key(full_key)
            .set_version_id(version.clone())
            .retention(retention)
            .send()
            .await
            .map_err(|e| self.err("PutObjectRetention", full_key, sdk_message(&e)))?;
        match self.hold_of(full_key, version.as_deref()).await? {
            Some(h) if h.mode == Some(mode) && h.retain_until.is_some_and(|u| u >= until) => Ok(()),
            _ => Err(self.err("PutObjectRetention", full_key, format!("the object does not hold the {mode} retention until {until} it was given"))),
        }
    }

    /// Hold the version `version` of `key` (relative) in `mode` until
    /// `until`: `backups copy --lock-for` on an object it found already
    /// at the destination. See [`Self::put_retention`] for what S3 allows.
    pub async fn set_retention(&self, key: &str, version: Option<String>, mode: LockMode, until: DateTime<Utc>) -> Result<(), StoreError> {
        let full = self.full_key(key)?;
        self.put_retention(&full, version, mode, until).await
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Whether the bucket has Object Lock (GetObjectLockConfiguration). A
    /// bucket without, or a service that does not implement it, is
    /// [`BucketLock::Disabled`]; a refused or failed request is an error.
    pub async fn bucket_lock(&self) -> Result<BucketLock, StoreError> {
        match self.client.get_object_lock_configuration().bucket(&self.bucket).send().await {
            Ok(answer) => {
                let config = answer.object_lock_configuration();
                let enabled = config.and_then(|c| c.object_lock_enabled()) == Some(&aws_sdk_s3::types::ObjectLockEnabled::Enabled);
                if !enabled {
                    return Ok(BucketLock::Disabled { why: "its Object Lock configuration does not say ObjectLockEnabled=Enabled".into() });
                }
                let default_retention = config.and_then(|c| c.rule()).and_then(|r| r.default_retention()).map(|d| {
                    let mode = d.mode().map(|m| m.as_str().to_string()).unwrap_or_else(|| "retention".into());
                    match (d.days(), d.years()) {
                        (Some(days), _) => format!("{mode} {days} day(s)"),
                        (_, Some(years)) => format!("{mode} {years} year(s)"),
                        _ => mode,
                    }
                });
                Ok(BucketLock::Enabled { default_retention })
            }
            Err(err) => {
                let status = err.raw_response().map(|r| r.status().as_u16());
                let code = err.as_service_error().and_then(|e| e.code()).unwrap_or_default().to_string();
                if code == "ObjectLockConfigurationNotFoundError" || code == "NotImplemented" || matches!(status, Some(404 | 501)) && code != "NoSuchBucket" {
                    Ok(BucketLock::Disabled { why: format!("GetObjectLockConfiguration answered {}", sdk_message(&err)) })
                } else {
                    Err(self.err("GetObjectLockConfiguration", "", sdk_message(&err)))
                }
            }
        }
    }

    /// The retention and holds of `key` (its current version, or
    /// `version`); `None` when there is no such object.
    async fn hold_of(&self, full_key: &str, version: Option<&str>) -> Result<Option<ObjectHold>, StoreError> {
        let answer = self.client.head_object().bucket(&self.bucket).key(full_key).set_version_id(version.map(str::to_string)).send().await;
        let head = match answer {
            Ok(head) => head,
            Err(err) if err.raw_response().is_some_and(|r| r.status().as_u16() == 404) => return Ok(None),
            Err(err) => return Err(self.err("HeadObject", full_key, sdk_message(&err))),
        };
        Ok(Some(ObjectHold {
            key: self.relative(full_key),
            version_id: head.version_id().map(str::to_string).or_else(|| version.map(str::to_string)),
            mode: head.object_lock_mode().and_then(|m| LockMode::from_s3(m.as_str())),
            retain_until: head.object_lock_retain_until_date().and_then(chrono_time),
            legal_hold: head.object_lock_legal_hold_status() == Some(&aws_sdk_s3::types::ObjectLockLegalHoldStatus::On)
                || head.object_lock_event_hold() == Some(&aws_sdk_s3::types::ObjectLockEventHold::On),
        }))
    }

    /// The retention and holds of `key`'s current version (relative to the
    /// store); `None` when there is no such object.
    pub async fn retention(&self, key: &str) -> Result<Option<ObjectHold>, StoreError> {
        let full = self.full_key(key)?;
        self.hold_of(&full, None).await
    }

    /// Every version under `prefix` (relative), delete markers too.
    async fn versions(&self, prefix: &str) -> Result<Vec<Version>, StoreError> {
        let full = format!("{}{prefix}", self.base());
        let mut out = Vec::new();
        let (mut key_marker, mut version_marker) = (None::<String>, None::<String>);
        loop {
            let page = self
                .client
                .list_object_versions()
                .bucket(&self.bucket)
                .prefix(&full)
                .set_key_marker(key_marker.clone())
                .set_version_id_marker(version_marker.clone())
                .send()
                .await
                .map_err(|e| self.err("ListObjectVersions", &full, sdk_message(&e)))?;
            for v in page.versions() {
                if let (Some(key), Some(id)) = (v.key(), v.version_id()) {
                    out.push(Version { key: key.to_string(), id: id.to_string(), marker: false, latest: v.is_latest() == Some(true) });
                }
            }
            for m in page.delete_markers() {
                if let (Some(key), Some(id)) = (m.key(), m.version_id()) {
                    out.push(Version { key: key.to_string(), id: id.to_string(), marker: true, latest: m.is_latest() == Some(true) });
                }
            }
            if page.is_truncated() != Some(true) {
                break;
            }
            key_marker = page.next_key_marker().map(str::to_string);
            version_marker = page.next_version_id_marker().map(str::to_string);
            if key_marker.is_none() {
                break;
            }
        }
        Ok(out)
    }

    /// The keys under `prefix` (relative) that have versions but no current
    /// object: deleted without their versions (a delete marker is the
    /// latest), so a listing does not show them, though they take space.
    pub async fn hidden_keys(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let versions = self.versions(prefix).await?;
        let current: std::collections::HashSet<&str> = versions.iter().filter(|v| v.latest && !v.marker).map(|v| v.key.as_str()).collect();
        let mut keys: Vec<String> = versions.iter().filter(|v| !current.contains(v.key.as_str())).map(|v| self.relative(&v.key)).collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// How many versions and delete markers there are under `prefix` (relative).
    pub async fn count_versions(&self, prefix: &str) -> Result<usize, StoreError> {
        Ok(self.versions(prefix).await?.len())
    }

    /// The retention and holds of every object version under `prefix`
    /// (relative; delete markers have none).
    pub async fn holds(&self, prefix: &str) -> Result<Vec<ObjectHold>, StoreError> {
        let mut out = Vec::new();
        for version in self.versions(prefix).await? {
            if version.marker {
                continue;
            }
            if let Some(hold) = self.hold_of(&version.key, Some(&version.id)).await? {
                out.push(hold);
            }
        }
        Ok(out)
    }

    /// Delete every version and delete marker under `prefix` (relative),
    /// those of `first` (a relative key: the manifest) before the others:
    /// in a versioned bucket this, not a DELETE without a version, frees
    /// the space. S3 refuses a version still under retention; that is the
    /// error. How many versions were deleted.
    pub async fn delete_versions(&self, prefix: &str, first: &str) -> Result<usize, StoreError> {
        let mut versions = self.versions(prefix).await?;
        let first = format!("{}{first}", self.base());
        versions.sort_by_key(|v| v.key != first);
        for Version { key, id, .. } in &versions {
            self.client
                .delete_object()
                .bucket(&self.bucket)
                .key(key)
                .version_id(id)
                .send()
                .await
                .map_err(|e| self.err("DeleteObject", &format!("{key} (version {id})"), sdk_message(&e)))?;
        }
        Ok(versions.len())
    }

    fn base(&self) -> String {
        if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) }
    }

    fn relative(&self, full_key: &str) -> String {
        full_key.strip_prefix(&self.base()).unwrap_or(full_key).to_string()
    }

    /// `key` exists with `size` bytes from a multipart upload of `parts`
    /// parts (its ETag ends in `-<parts>`); else the error `message` stands.
    async fn check_completed(&self, key: &str, size: u64, parts: usize, message: String) -> Result<(), StoreError> {
        let head = self.client.head_object().bucket(&self.bucket).key(key).send().await;
        let whole = head.ok().is_some_and(|h| {
            h.content_length().and_then(|n| u64::try_from(n).ok()) == Some(size)
                && h.e_tag().is_some_and(|e| e.trim_matches('"').ends_with(&format!("-{parts}")))
        });
        if whole {
            tracing::warn!(key, "S3 CompleteMultipartUpload of {key} was refused when tried again ({message}); an earlier try completed it (its size and ETag are the upload's)");
            Ok(())
        } else {
            Err(self.err("CompleteMultipartUpload", key, message))
        }
    }

    async fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        first: Bytes,
        body: &mut Body<'_>,
        hasher: &mut Hasher,
    ) -> Result<Vec<CompletedPart>, StoreError> {
        let mut in_flight: JoinSet<Result<CompletedPart, StoreError>> = JoinSet::new();
        let mut parts = Vec::new();
        let mut next: Option<Bytes> = Some(first);
        let mut number = 0i32;
        loop {
            let chunk = match next.take() {
                Some(chunk) => chunk,
                None => {
                    let mut part = self.parts.take().await;
                    let n = part.fill(body).await.map_err(|source| StoreError::Body {
                        key: key.to_string(),
                        source,
                    })?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(part.bytes());
                    Bytes::from_owner(part)
                }
            };
            number += 1;
            while in_flight.len() >= self.options.parallelism.max(1) {
                if let Some(done) = in_flight.join_next().await {
                    parts.push(done.map_err(|e| self.err("UploadPart", key, e.to_string()))??);
                }
            }
            let (client, bucket, key_owned, upload_id) =
                (self.client.clone(), self.bucket.clone(), key.to_string(), upload_id.to_string());
            let attempts = self.options.part_attempts;
            in_flight.spawn(async move {
                let answer = retried(attempts, "UploadPart", &key_owned, || {
                    let request = client
                        .upload_part()
                        .bucket(&bucket)
                        .key(&key_owned)
                        .upload_id(&upload_id)
                        .part_number(number)
                        .body(ByteStream::from(chunk.clone()));
                    async move { request.send().await.map_err(|e| Failure::of(&e)) }
                })
                .await
                .map_err(|(failure, tries)| StoreError::S3 {
                    operation: "UploadPart",
                    bucket: bucket.clone(),
                    key: format!("{key_owned} (part {number})"),
                    message: failure.describe(tries),
                })?;
                Ok(CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(answer.e_tag().map(str::to_string))
                    .build())
            });
        }
        while let Some(done) = in_flight.join_next().await {
            parts.push(done.map_err(|e| self.err("UploadPart", key, e.to_string()))??);
        }
        parts.sort_by_key(|p| p.part_number());
        Ok(parts)
    }
}

/// One version of an object, or a delete marker, as ListObjectVersions gives it.
struct Version {
    /// The full key.
    key: String,
    id: String,
    marker: bool,
    /// The current version of its key.
    latest: bool,
}

/// Why one try of a request failed, and whether another try may succeed.
struct Failure {
    message: String,
    transient: bool,
}

impl Failure {
    fn of<E>(err: &aws_sdk_s3::error::SdkError<E>) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        Failure {
            message: sdk_message(err),
            transient: transient(err),
        }
    }

    fn describe(&self, tries: u32) -> String {
        if tries > 1 {
            format!("{} (after {tries} tries)", self.message)
        } else {
            self.message.clone()
        }
    }
}

/// Whether an S3 error is the kind a later try can get past: no answer
/// (timeout, connection refused or reset, a body cut short), a 5xx, or
/// throttling. A 4xx names something wrong with the request itself.
fn transient<E: ProvideErrorMetadata>(err: &aws_sdk_s3::error::SdkError<E>) -> bool {
    use aws_sdk_s3::error::SdkError;
    match err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => true,
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            status >= 500
                || status == 429
                || matches!(service.err().code(), Some("SlowDown" | "RequestTimeout" | "Throttling" | "ThrottlingException"))
        }
        _ => false,
    }
}

/// A time as the SDK takes it.
fn sdk_time(t: DateTime<Utc>) -> aws_sdk_s3::primitives::DateTime {
    aws_sdk_s3::primitives::DateTime::from_secs(t.timestamp())
}

/// A time as the SDK gives it.
fn chrono_time(t: &aws_sdk_s3::primitives::DateTime) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos())
}

/// The wait before try `n + 1` (n >= 1): 1-2 s, 2-4 s, 4-8 s, ... up to
/// 16-32 s (jittered, so parts failing together do not come back together).
fn backoff(n: u32) -> Duration {
    crate::duration::backoff(Duration::from_secs(2), Duration::from_secs(32), n)
}

/// Run `attempt` up to `attempts` times while it fails transiently; the
/// last failure and the number of tries otherwise.
async fn retried<T, F, Fut>(attempts: u32, operation: &str, key: &str, mut attempt: F) -> Result<T, (Failure, u32)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>>,
{
    let attempts = attempts.max(1);
    let mut n = 1;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(failure) if failure.transient && n < attempts => {
                let wait = backoff(n);
                tracing::warn!(operation, key, attempt = n, "S3 {operation} failed ({}); trying again in {:.1}s", failure.message, wait.as_secs_f64());
                tokio::time::sleep(wait).await;
                n += 1;
            }
            Err(failure) => return Err((failure, n)),
        }
    }
}

/// One object being read: where from, which version, and how patiently.
struct Download {
    client: Client,
    bucket: String,
    key: String,
    /// The version being read; a ranged GET that goes on must match it.
    etag: Option<String>,
    total: Option<u64>,
    /// Failed or stalled reads in a row (no byte between them) that end it.
    max_failures: u32,
    /// How long a read may bring nothing before it is given up.
    stall: Duration,
}

impl Download {
    /// Feed `tx` with the object's bytes from `first` on, and the error
    /// that ended it, if one did. Ends early when the receiver is gone.
    async fn run(self, first: ByteStream, tx: mpsc::Sender<std::io::Result<Bytes>>) {
        if let Err(err) = self.pump(first, &tx).await {
            let _ = tx.send(Err(err)).await;
        }
    }

    /// Going on from the byte reached with a ranged GET pinned to the ETag
    /// whenever the body breaks or stays silent for `stall`.
    async fn pump(&self, first: ByteStream, tx: &mpsc::Sender<std::io::Result<Bytes>>) -> std::io::Result<()> {
        let (bucket, key) = (&self.bucket, &self.key);
        let mut body = Some(first);
        let mut position = 0u64;
        let mut failures = 0u32;
        loop {
            let mut stream = match body.take() {
                Some(stream) => stream,
                None => {
                    let request = self
                        .client
                        .get_object()
                        .bucket(bucket)
                        .key(key)
                        .range(format!("bytes={position}-"))
                        .set_if_match(self.etag.clone());
                    match request.send().await {
                        // a server that ignores Range would send the object from its start again
                        Ok(answer) if !answer.content_range().is_some_and(|r| r.starts_with(&format!("bytes {position}-"))) => {
                            return Err(std::io::Error::other(format!(
                                "S3 GetObject {bucket}/{key}: asked to go on from byte {position} after a broken read, the server answered with range {:?}; this S3 service does not support ranged reads",
                                answer.content_range()
                            )));
                        }
                        Ok(answer) => answer.body,
                        Err(err) if err.raw_response().map(|r| r.status().as_u16()) == Some(412) => {
                            return Err(std::io::Error::other(format!(
                                "s3://{bucket}/{key} changed while it was being read (its ETag is no longer {}); read it again",
                                self.etag.as_deref().unwrap_or("?")
                            )));
                        }
                        Err(err) => {
                            failures += 1;
                            if !transient(&err) || failures >= self.max_failures {
                                return Err(self.broken(position, failures, &sdk_message(&err)));
                            }
                            tokio::time::sleep(backoff(failures)).await;
                            continue;
                        }
                    }
                }
            };
            let last = loop {
                match tokio::time::timeout(self.stall, stream.next()).await {
                    Ok(Some(Ok(bytes))) => {
                        position += bytes.len() as u64;
                        failures = 0;
                        if tx.send(Ok(bytes)).await.is_err() {
                            return Ok(());
                        }
                    }
                    Ok(None) if self.total.is_none_or(|t| position >= t) => return Ok(()),
                    Ok(None) => break format!("the answer ended at byte {position} of {}", self.total.unwrap_or_default()),
                    Ok(Some(Err(err))) => break error_chain(&err),
                    Err(_) => break format!("no data for {}", humantime::format_duration(self.stall)),
                }
            };
            if self.total.is_some_and(|t| position >= t) {
                return Ok(());
            }
            failures += 1;
            if failures >= self.max_failures {
                return Err(self.broken(position, failures, &last));
            }
            tracing::warn!(key = %key, position, "S3 download of {key} broke at byte {position} ({last}); going on from there");
            // a connection that broke after bringing data is tried again at once;
            // one that brought nothing waits, as S3 may be overloaded
            if failures > 1 {
                tokio::time::sleep(backoff(failures - 1)).await;
            }
        }
    }

    fn broken(&self, position: u64, failures: u32, last: &str) -> std::io::Error {
        std::io::Error::other(format!(
            "S3 GetObject {}/{}: {failures} tries in a row failed at byte {position}, the last with: {last}",
            self.bucket, self.key
        ))
    }
}

#[async_trait]
impl Store for S3Store {
    fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    async fn put(&self, key: &str, mut body: Body<'_>) -> Result<PutReport, StoreError> {
        let full = self.full_key(key)?;
        let mut hasher = Hasher::default();
        let mut first = self.parts.take().await;
        let n = first.fill(&mut body).await.map_err(|source| StoreError::Body {
            key: key.to_string(),
            source,
        })?;
        hasher.update(first.bytes());
        let first = Bytes::from_owner(first);
        if n < self.options.part_size {
            self.put_single(&full, first).await?;
        } else {
            self.put_multipart(&full, first, &mut body, &mut hasher).await?;
        }
        Ok(hasher.finish())
    }

    /// The body goes on from where it broke (see the module's comment).
    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
        let full = self.full_key(key)?;
        let answer = match self.client.get_object().bucket(&self.bucket).key(&full).send().await {
            Ok(answer) => answer,
            Err(err) if err.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
                return Err(StoreError::NotFound {
                    url: self.url(),
                    key: key.to_string(),
                });
            }
            Err(err) => return Err(self.err("GetObject", &full, sdk_message(&err))),
        };
        let etag = answer.e_tag().map(str::to_string);
        let total = answer.content_length().and_then(|n| u64::try_from(n).ok());
        let (tx, mut rx) = mpsc::channel(4);
        let download = Download {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: full,
            etag,
            total,
            max_failures: self.options.download_attempts.max(1),
            stall: self.options.stall_timeout,
        };
        tokio::spawn(download.run(answer.body, tx));
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Ok(Box::new(tokio_util::io::StreamReader::new(stream)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let base = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut out = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(format!("{base}{prefix}"))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.err("ListObjectsV2", prefix, sdk_message(&e)))?;
            for object in page.contents() {
                let Some(key) = object.key() else { continue };
                out.push(ObjectInfo {
                    key: key.strip_prefix(&base).unwrap_or(key).to_string(),
                    size: object.size().unwrap_or_default().max(0) as u64,
                    modified: object
                        .last_modified()
                        .and_then(|t| DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos())),
                });
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Also aborts unfinished multipart uploads of `key` (a writer that was
    /// cancelled or killed leaves its parts behind, billed, until aborted).
    ///
    /// A store that writes with a retention (`backup --lock-for`) deletes
    /// the current version itself (in a versioned bucket a DELETE without
    /// one only hides it), and keeps an object still under retention, with
    /// a warning: S3 refuses to delete it, and hiding it behind a delete
    /// marker would claim a deletion that did not happen. The backup's
    /// report says what stayed.
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let full = self.full_key(key)?;
        // (the version to delete, whether there is an object at all)
        let (version, present) = match self.options.object_lock {
            None => (None, true),
            Some(_) => match self.hold_of(&full, None).await? {
                Some(hold) if hold.holds_at(Utc::now()) => {
                    tracing::warn!(key = %full, "s3://{}/{full} is kept: it is {}", self.bucket, super::object_lock::FolderHold::of(&[hold], Utc::now()).map(|h| h.describe()).unwrap_or_default());
                    return Ok(());
                }
                Some(hold) => (hold.version_id, true),
                // a DELETE of a missing key would add a delete marker
                None => (None, false),
            },
        };
        if present {
            self.client
                .delete_object()
                .bucket(&self.bucket)
                .key(&full)
                .set_version_id(version)
                .send()
                .await
                .map_err(|e| self.err("DeleteObject", &full, sdk_message(&e)))?;
        }
        match self.client.list_multipart_uploads().bucket(&self.bucket).prefix(&full).send().await {
            Ok(list) => {
                for upload in list.uploads() {
                    if upload.key() != Some(full.as_str()) {
                        continue;
                    }
                    if let Some(id) = upload.upload_id() {
                        self.client
                            .abort_multipart_upload()
                            .bucket(&self.bucket)
                            .key(&full)
                            .upload_id(id)
                            .send()
                            .await
                            .map_err(|e| self.err("AbortMultipartUpload", &full, sdk_message(&e)))?;
                    }
                }
            }
            // not every S3-compatible service lists uploads; say so, do not fail the delete.
            // Said once a process: such an endpoint refuses it for every object deleted
            // (a WARN per snapshot, in the middle of the progress display)
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(key = %full, "could not list unfinished uploads to abort: {} (not said again for other objects)", sdk_message(&e))
                });
            }
        }
        Ok(())
    }

    fn s3(&self) -> Option<&S3Store> {
        Some(self)
    }

    async fn presign_get(&self, key: &str, ttl: Duration) -> Result<Option<String>, StoreError> {
        let full = self.full_key(key)?;
        let config = PresigningConfig::expires_in(ttl).map_err(|e| self.err("presign", &full, e.to_string()))?;
        let request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&full)
            .presigned(config)
            .await
            .map_err(|e| self.err("presign", &full, sdk_message(&e)))?;
        Ok(Some(request.uri().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    /// At most `count` buffers exist at once, whoever holds them (a part
    /// being filled, or the `Bytes` of a part being sent), and a buffer
    /// given back is the next one handed out.
    #[tokio::test]
    async fn part_buffers_are_bounded_and_reused() {
        let budget = PartBudget::new(16, 2);
        let mut first = budget.take().await;
        let mut body: Body<'_> = Box::new(&b"0123456789abcdefXYZ"[..]);
        assert_eq!(first.fill(&mut body).await.unwrap(), 16);
        let sent = Bytes::from_owner(first);
        let held = sent.clone();
        let mut second = budget.take().await;
        assert_eq!(second.fill(&mut body).await.unwrap(), 3);
        assert_eq!(second.bytes(), b"XYZ");
        assert!(budget.take().now_or_never().is_none(), "a third buffer beyond the budget of two");
        drop(sent);
        assert!(budget.take().now_or_never().is_none(), "given back while a Bytes of it was still held");
        let address = held.as_ptr();
        drop(held);
        let third = budget.take().now_or_never().expect("the buffer given back");
        assert_eq!(third.buf.as_ptr(), address, "a new buffer instead of the one given back");
        drop(second);
        drop(third);
        assert_eq!(budget.free.lock().unwrap().len(), 2);
    }
}
