//! The S3 store (aws-sdk-s3): streaming multipart uploads with bounded
//! parallelism, SDK retries with backoff, endpoint override and path-style
//! addressing for S3-compatible services, a custom CA bundle, and optional
//! SSE-S3 / SSE-KMS.
//!
//! Memory is bounded by `part_size * (parallelism + 1)` whatever the object size.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, Region, SharedHttpClient};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use chrono::{DateTime, Utc};
use tokio::task::JoinSet;

use super::{Body, Hasher, ObjectInfo, PutReport, Store, StoreError, check_key, read_full};

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
    /// Parts uploaded at once.
    pub parallelism: usize,
    /// Attempts per request (with exponential backoff).
    pub max_attempts: u32,
    /// Access key and secret to use instead of the SDK's credential chain
    /// (environment, profile, web identity). For embedding and tests.
    pub static_credentials: Option<(String, String)>,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            endpoint: None,
            region: None,
            path_style: None,
            ca_bundle: None,
            sse: ServerSideEncryption::None,
            part_size: 8 << 20,
            parallelism: 4,
            max_attempts: 5,
            static_credentials: None,
        }
    }
}

pub struct S3Store {
    client: Client,
    bucket: String,
    prefix: String,
    options: S3Options,
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
        None => {
            let mut parts: Vec<String> = Vec::new();
            let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
            while let Some(e) = cur {
                let text = e.to_string();
                if !parts.last().is_some_and(|last| last.ends_with(&text)) {
                    parts.push(text);
                }
                cur = e.source();
            }
            parts.join(": ")
        }
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
            .retry_config(RetryConfig::standard().with_max_attempts(options.max_attempts));
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
        let has_endpoint = options.endpoint.is_some() || shared.endpoint_url().is_some();
        config = config.force_path_style(options.path_style.unwrap_or(has_endpoint));
        Ok(S3Store {
            client: Client::from_conf(config.build()),
            bucket,
            prefix,
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

    async fn put_single(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(bytes));
        request = match &self.options.sse {
            ServerSideEncryption::None => request,
            ServerSideEncryption::S3 => request.server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::Aes256),
            ServerSideEncryption::Kms { key_id } => request
                .server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::AwsKms)
                .ssekms_key_id(key_id),
        };
        request
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.err("PutObject", key, sdk_message(&e)))
    }

    async fn put_multipart(
        &self,
        key: &str,
        first: Vec<u8>,
        body: &mut Body<'_>,
        hasher: &mut Hasher,
    ) -> Result<(), StoreError> {
        let mut create = self.client.create_multipart_upload().bucket(&self.bucket).key(key);
        create = match &self.options.sse {
            ServerSideEncryption::None => create,
            ServerSideEncryption::S3 => create.server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::Aes256),
            ServerSideEncryption::Kms { key_id } => create
                .server_side_encryption(aws_sdk_s3::types::ServerSideEncryption::AwsKms)
                .ssekms_key_id(key_id),
        };
        let upload = create
            .send()
            .await
            .map_err(|e| self.err("CreateMultipartUpload", key, sdk_message(&e)))?;
        let upload_id = upload
            .upload_id()
            .ok_or_else(|| self.err("CreateMultipartUpload", key, "no upload id in the answer".into()))?
            .to_string();
        let result = self.upload_parts(key, &upload_id, first, body, hasher).await;
        match result {
            Ok(parts) => self
                .client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(&upload_id)
                .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
                .send()
                .await
                .map(|_| ())
                .map_err(|e| self.err("CompleteMultipartUpload", key, sdk_message(&e))),
            Err(err) => {
                let _ = self
                    .client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .send()
                    .await;
                Err(err)
            }
        }
    }

    async fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        first: Vec<u8>,
        body: &mut Body<'_>,
        hasher: &mut Hasher,
    ) -> Result<Vec<CompletedPart>, StoreError> {
        let mut in_flight: JoinSet<Result<CompletedPart, StoreError>> = JoinSet::new();
        let mut parts = Vec::new();
        let mut next: Option<Vec<u8>> = Some(first);
        let mut number = 0i32;
        loop {
            let chunk = match next.take() {
                Some(chunk) => chunk,
                None => {
                    let mut buf = vec![0u8; self.options.part_size];
                    let n = read_full(body, &mut buf).await.map_err(|source| StoreError::Body {
                        key: key.to_string(),
                        source,
                    })?;
                    if n == 0 {
                        break;
                    }
                    buf.truncate(n);
                    hasher.update(&buf);
                    buf
                }
            };
            number += 1;
            while in_flight.len() >= self.options.parallelism.max(1) {
                if let Some(done) = in_flight.join_next().await {
                    parts.push(done.map_err(|e| self.err("UploadPart", key, e.to_string()))??);
                }
            }
            let request = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(number)
                .body(ByteStream::from(chunk));
            let (bucket, key_owned) = (self.bucket.clone(), key.to_string());
            in_flight.spawn(async move {
                let answer = request.send().await.map_err(|e| StoreError::S3 {
                    operation: "UploadPart",
                    bucket,
                    key: key_owned,
                    message: sdk_message(&e),
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
        let mut first = vec![0u8; self.options.part_size];
        let n = read_full(&mut body, &mut first).await.map_err(|source| StoreError::Body {
            key: key.to_string(),
            source,
        })?;
        first.truncate(n);
        hasher.update(&first);
        if n < self.options.part_size {
            self.put_single(&full, first).await?;
        } else {
            self.put_multipart(&full, first, &mut body, &mut hasher).await?;
        }
        Ok(hasher.finish())
    }

    async fn get(&self, key: &str) -> Result<Body<'static>, StoreError> {
        let full = self.full_key(key)?;
        match self.client.get_object().bucket(&self.bucket).key(&full).send().await {
            Ok(answer) => Ok(Box::new(answer.body.into_async_read())),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_no_such_key()) => Err(StoreError::NotFound {
                url: self.url(),
                key: key.to_string(),
            }),
            Err(err) => Err(self.err("GetObject", &full, sdk_message(&err))),
        }
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
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let full = self.full_key(key)?;
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
            .map_err(|e| self.err("DeleteObject", &full, sdk_message(&e)))?;
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
            // not every S3-compatible service lists uploads; say so, do not fail the delete
            Err(e) => tracing::warn!(key = %full, "could not list unfinished uploads to abort: {}", sdk_message(&e)),
        }
        Ok(())
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
