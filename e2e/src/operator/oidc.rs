//! The OIDC issuer of AWS hosted clusters, as a HyperShift operator
//! installed with `--oidc-storage-provider-s3-bucket-name` keeps it.
//!
//! For a HostedCluster with `spec.platform.type` `AWS`:
//!
//! - the Secret `sa-signing-key` of the HCP namespace (`service-account.key`,
//!   `service-account.pub`), created once and never overwritten: a restore
//!   replays the backup's copy, which is kept. Real HyperShift uses an RSA
//!   key; the sandbox an ECDSA P-256 one (ring cannot generate RSA keys), so
//!   its documents say `ES256` where HyperShift's say `RS256`;
//! - the discovery document and the JWKS under `<spec.infraID>/` in the
//!   operator's OIDC bucket, uploaded (`public-read`) once, when the
//!   HostedCluster does not carry [`OIDC_FINALIZER`] yet; the finalizer is
//!   added afterwards. An HC that carries it (one restored onto another
//!   management cluster, whose operator has another bucket) gets no upload:
//!   its issuer documents stay wherever they were, possibly stale;
//! - on deletion, both documents are deleted from the operator's bucket and
//!   the finalizer goes.
//!
//! The rendering ([`discovery_document`], [`jwks_document`]) is pure, for
//! tests to compute what the operator must have written.

use std::time::Duration;

use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata as _};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ObjectCannedAcl;
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::objects::{HOSTED_CLUSTER, SECRET, name_of, ns_of, str_at};
use super::workloads::add_finalizer;
use super::{Ctx, OperatorError, log_failure};

/// The finalizer HyperShift puts on an AWS HostedCluster once its OIDC
/// documents are in the operator's bucket.
pub const OIDC_FINALIZER: &str = "hypershift.openshift.io/aws-oidc-discovery";
/// The Secret of the HCP namespace holding the service-account signing key.
pub const SA_SIGNING_KEY_SECRET: &str = "sa-signing-key";
/// Its private key (PKCS#8 PEM).
pub const SA_PRIVATE_KEY: &str = "service-account.key";
/// Its public key (SubjectPublicKeyInfo PEM, `-----BEGIN PUBLIC KEY-----`).
pub const SA_PUBLIC_KEY: &str = "service-account.pub";
/// Where the discovery document lives, below the issuer URL and below
/// `<infraID>` in the bucket.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// Where the JWKS lives, below the issuer URL and below `<infraID>`.
pub const JWKS_PATH: &str = "/openid/v1/jwks";
/// The signing algorithm of the sandbox's keys (ECDSA P-256).
pub const SIGNING_ALG: &str = "ES256";

/// The OIDC S3 bucket of one HyperShift operator install.
#[derive(Clone)]
pub struct OidcConfig {
    /// The S3 endpoint (`https://...`), addressed path-style.
    pub endpoint_url: String,
    /// The bucket (`oidc-mgmt-a`).
    pub bucket: String,
    /// The region to sign for.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret key (never printed).
    pub secret_key: String,
    /// PEM of the CA to trust for the endpoint.
    pub ca_pem: String,
}

impl std::fmt::Debug for OidcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcConfig")
            .field("endpoint_url", &self.endpoint_url)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// The bucket key of the discovery document of `infra_id`.
pub fn discovery_key(infra_id: &str) -> String {
    format!("{infra_id}{DISCOVERY_PATH}")
}

/// The bucket key of the JWKS of `infra_id`.
pub fn jwks_key(infra_id: &str) -> String {
    format!("{infra_id}{JWKS_PATH}")
}

/// The discovery document for `issuer`, byte for byte as HyperShift renders
/// it (tabs, no final newline), with `alg` as the one signing algorithm.
pub fn discovery_document(issuer: &str, alg: &str) -> String {
    format!(
        "{{\n\t\"issuer\": \"{issuer}\",\n\t\"jwks_uri\": \"{issuer}{JWKS_PATH}\",\n\
         \t\"response_types_supported\": [\n\t\t\"id_token\"\n\t],\n\
         \t\"subject_types_supported\": [\n\t\t\"public\"\n\t],\n\
         \t\"id_token_signing_alg_values_supported\": [\n\t\t\"{alg}\"\n\t]\n}}"
    )
}

/// The DER inside the first PEM block whose label ends with `PUBLIC KEY`
/// (`PUBLIC KEY`; HyperShift labels its PKIX RSA keys `RSA PUBLIC KEY`).
fn public_key_der(pem: &str) -> Result<Vec<u8>, String> {
    let mut lines = pem.lines().map(str::trim);
    lines
        .find(|l| l.starts_with("-----BEGIN ") && l.ends_with("PUBLIC KEY-----"))
        .ok_or("no PUBLIC KEY PEM block")?;
    let body: String = lines.take_while(|l| !l.starts_with("-----END ")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| format!("PEM body: {e}"))
}

/// The JWKS for the public key `public_key_pem` (an EC P-256
/// SubjectPublicKeyInfo), as go-jose marshals it: `kid` is the base64url
/// SHA-256 of the SubjectPublicKeyInfo DER (Kubernetes' `KeyIDFromPublicKey`),
/// `x` and `y` the base64url coordinates of the uncompressed point.
pub fn jwks_document(public_key_pem: &str) -> Result<String, String> {
    let der = public_key_der(public_key_pem)?;
    let spki =
        rcgen::SubjectPublicKeyInfo::from_der(&der).map_err(|e| format!("public key: {e}"))?;
    use rcgen::PublicKeyData as _;
    if spki.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
        return Err(
            "the public key is not an EC P-256 key (the sandbox publishes only those)".into(),
        );
    }
    let point = spki.der_bytes();
    let (x, y) = match point {
        [0x04, coords @ ..] if coords.len() == 64 => coords.split_at(32),
        _ => {
            return Err(format!(
                "not an uncompressed P-256 point ({} bytes)",
                point.len()
            ));
        }
    };
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let kid = b64(&Sha256::digest(&der));
    Ok(format!(
        r#"{{"keys":[{{"use":"sig","kty":"EC","kid":"{kid}","crv":"P-256","alg":"{SIGNING_ALG}","x":"{}","y":"{}"}}]}}"#,
        b64(x),
        b64(y)
    ))
}

/// A fresh signing key: (private key PEM, public key PEM).
pub fn generate_signing_key() -> Result<(String, String), String> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("generating an EC P-256 key: {e}"))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

fn s3_err(action: String) -> impl FnOnce(String) -> OperatorError {
    move |message| OperatorError::S3 { action, message }
}

/// The operator's client of its OIDC bucket.
pub(crate) struct OidcStore {
    client: aws_sdk_s3::Client,
    bucket: String,
}

impl OidcStore {
    /// A path-style client of `cfg.endpoint_url` trusting only `cfg.ca_pem`.
    pub(crate) fn new(cfg: &OidcConfig) -> Result<OidcStore, OperatorError> {
        let conf = crate::procs::s3::sdk_config(&cfg.endpoint_url, &cfg.region, &cfg.access_key, &cfg.secret_key, &cfg.ca_pem)
            .map_err(|e| OperatorError::Invalid { what: format!("OIDC S3 client: {e}") })?
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(20))
                    .build(),
            )
            .build();
        Ok(OidcStore {
            client: aws_sdk_s3::Client::from_conf(conf),
            bucket: cfg.bucket.clone(),
        })
    }

    /// PutObject `key` with `body`, `x-amz-acl: public-read` as HyperShift
    /// sends it (s3s-fs accepts the header and ignores it).
    async fn put(&self, key: &str, body: String) -> Result<(), OperatorError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .acl(ObjectCannedAcl::PublicRead)
            .body(ByteStream::from(body.into_bytes()))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| {
                s3_err(format!("PutObject {}/{key}", self.bucket))(
                    DisplayErrorContext(e).to_string(),
                )
            })
    }

    /// DeleteObject `key`; a missing key or bucket is no error (HyperShift
    /// skips a missing bucket; S3 answers a missing key with 204).
    async fn delete(&self, key: &str) -> Result<(), OperatorError> {
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.code(), Some("NoSuchBucket" | "NoSuchKey")) => Ok(()),
            Err(e) => Err(s3_err(format!("DeleteObject {}/{key}", self.bucket))(
                DisplayErrorContext(e).to_string(),
            )),
        }
    }
}

/// Whether `hc` is on the AWS platform (the only one with OIDC documents here).
pub(crate) fn is_aws(hc: &Value) -> bool {
    str_at(hc, "/spec/platform/type") == Some("AWS")
}

fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|f| f.as_str() == Some(finalizer)))
}

/// Create the Secret `sa-signing-key` in `hcp_ns` unless it exists (kept as
/// found otherwise: a restored one is never replaced).
pub(crate) async fn ensure_signing_key(ctx: &Ctx, hcp_ns: &str) -> Result<(), OperatorError> {
    if ctx
        .kube
        .get(&SECRET, Some(hcp_ns), SA_SIGNING_KEY_SECRET)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let (private_pem, public_pem) =
        generate_signing_key().map_err(|what| OperatorError::Invalid { what })?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = json!({"metadata": {"name": SA_SIGNING_KEY_SECRET, "namespace": hcp_ns},
        "type": "Opaque", "data": {SA_PRIVATE_KEY: b64(&private_pem), SA_PUBLIC_KEY: b64(&public_pem)}});
    ctx.kube
        .create_if_absent(&SECRET, Some(hcp_ns), secret)
        .await?;
    Ok(())
}

/// Upload the documents of `hc` into the operator's bucket and add
/// [`OIDC_FINALIZER`], unless there is no bucket, the finalizer is there
/// already, or `spec.issuerURL` is empty (a warning).
pub(crate) async fn publish_documents(
    ctx: &Ctx,
    hc: &Value,
    infra_id: &str,
    hcp_ns: &str,
) -> Result<(), OperatorError> {
    let Some(store) = &ctx.oidc else {
        return Ok(());
    };
    if has_finalizer(hc, OIDC_FINALIZER) {
        return Ok(());
    }
    let (ns, name) = (ns_of(hc), name_of(hc));
    let issuer = str_at(hc, "/spec/issuerURL").unwrap_or("");
    if issuer.is_empty() {
        let why = OperatorError::Invalid {
            what: "spec.issuerURL: empty, no OIDC documents uploaded".into(),
        };
        log_failure("oidc", &format!("{ns}/{name}"), &why);
        return Ok(());
    }
    let secret = ctx
        .kube
        .get(&SECRET, Some(hcp_ns), SA_SIGNING_KEY_SECRET)
        .await?
        .ok_or_else(|| {
            OperatorError::Waiting(format!("Secret {hcp_ns}/{SA_SIGNING_KEY_SECRET}"))
        })?;
    let public_pem = str_at(&secret, &format!("/data/{SA_PUBLIC_KEY}"))
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .and_then(|v| String::from_utf8(v).ok())
        .ok_or_else(|| OperatorError::Invalid {
            what: format!("Secret {hcp_ns}/{SA_SIGNING_KEY_SECRET}: no {SA_PUBLIC_KEY}"),
        })?;
    let jwks = jwks_document(&public_pem).map_err(|e| OperatorError::Invalid {
        what: format!("Secret {hcp_ns}/{SA_SIGNING_KEY_SECRET}: {e}"),
    })?;
    store
        .put(
            &discovery_key(infra_id),
            discovery_document(issuer, SIGNING_ALG),
        )
        .await?;
    store.put(&jwks_key(infra_id), jwks).await?;
    tracing::info!(namespace = ns, name, bucket = %store.bucket, infra_id, "OIDC documents uploaded");
    // earlier steps of this pass may have changed the HC since it was listed
    let fresh = ctx
        .kube
        .get(&HOSTED_CLUSTER, Some(ns), name)
        .await?
        .ok_or_else(|| OperatorError::Waiting(format!("HostedCluster {ns}/{name}")))?;
    add_finalizer(ctx, &HOSTED_CLUSTER, &fresh, OIDC_FINALIZER).await
}

/// On deletion of `hc`: delete its documents from the operator's bucket if
/// it carries [`OIDC_FINALIZER`]. (The caller removes the finalizer.)
pub(crate) async fn withdraw_documents(ctx: &Ctx, hc: &Value) -> Result<(), OperatorError> {
    if !has_finalizer(hc, OIDC_FINALIZER) {
        return Ok(());
    }
    let Some(store) = &ctx.oidc else {
        // as HyperShift without a bucket: nothing to clean up
        return Ok(());
    };
    match str_at(hc, "/spec/infraID").filter(|s| !s.is_empty()) {
        Some(infra_id) => {
            store.delete(&discovery_key(infra_id)).await?;
            store.delete(&jwks_key(infra_id)).await?;
            tracing::info!(namespace = ns_of(hc), name = name_of(hc), bucket = %store.bucket, infra_id, "OIDC documents deleted");
        }
        None => tracing::warn!(
            namespace = ns_of(hc),
            name = name_of(hc),
            "no spec.infraID: no OIDC documents to delete"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_document_is_hypershifts_template() {
        let doc = discovery_document("https://s3.example/oidc-mgmt-a/demo-x1", "RS256");
        let expected = "{\n\t\"issuer\": \"https://s3.example/oidc-mgmt-a/demo-x1\",\n\t\"jwks_uri\": \"https://s3.example/oidc-mgmt-a/demo-x1/openid/v1/jwks\",\n\t\"response_types_supported\": [\n\t\t\"id_token\"\n\t],\n\t\"subject_types_supported\": [\n\t\t\"public\"\n\t],\n\t\"id_token_signing_alg_values_supported\": [\n\t\t\"RS256\"\n\t]\n}";
        assert_eq!(doc, expected);
        let parsed: Value = serde_json::from_str(&doc).expect("JSON");
        assert_eq!(
            parsed["jwks_uri"],
            "https://s3.example/oidc-mgmt-a/demo-x1/openid/v1/jwks"
        );
    }

    #[test]
    fn jwks_of_a_generated_key() {
        let (private_pem, public_pem) = generate_signing_key().expect("key");
        assert!(
            private_pem.starts_with("-----BEGIN PRIVATE KEY-----"),
            "{private_pem}"
        );
        assert!(
            public_pem.starts_with("-----BEGIN PUBLIC KEY-----"),
            "{public_pem}"
        );
        let key = rcgen::KeyPair::from_pem(&private_pem).expect("private key parses");
        let jwks: Value =
            serde_json::from_str(&jwks_document(&public_pem).expect("jwks")).expect("JSON");
        let jwk = &jwks["keys"][0];
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let raw = key.public_key_raw();
        assert_eq!(jwk["x"], b64(&raw[1..33]));
        assert_eq!(jwk["y"], b64(&raw[33..65]));
        assert_eq!(
            jwk["kid"],
            b64(&Sha256::digest(public_key_der(&public_pem).unwrap()))
        );
        assert_eq!(
            (
                jwk["kty"].as_str(),
                jwk["crv"].as_str(),
                jwk["alg"].as_str(),
                jwk["use"].as_str()
            ),
            (Some("EC"), Some("P-256"), Some("ES256"), Some("sig"))
        );
        assert!(jwks_document("garbage").is_err());
    }

    #[test]
    fn debug_hides_the_secret_key() {
        let cfg = OidcConfig {
            endpoint_url: "https://127.0.0.1:1".into(),
            bucket: "oidc-mgmt-a".into(),
            region: "us-east-1".into(),
            access_key: "AKIA".into(),
            secret_key: "very-secret".into(),
            ca_pem: String::new(),
        };
        assert!(!format!("{cfg:?}").contains("very-secret"));
    }
}
