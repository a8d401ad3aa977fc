//! The OIDC issuer of an AWS hosted cluster: the two public documents AWS
//! STS reads to trust the cluster's service-account tokens (every
//! component's IAM role is assumed with one, `AssumeRoleWithWebIdentity`).
//!
//! HyperShift's operator writes them once, into the OIDC bucket it was
//! installed with, under the cluster's infraID: the discovery document
//! (`<issuer>/.well-known/openid-configuration`) and the key set
//! (`<issuer>/openid/v1/jwks`) publishing the public half of the
//! control-plane namespace's `sa-signing-key`. It marks the HostedCluster
//! with a finalizer and never writes them again; it deletes them when the
//! cluster is deleted. After a restore or migration onto another management
//! cluster the documents may be gone (the source's operator deleted them) or
//! written by the destination's operator into *its* bucket, not the one the
//! issuer URL names: the cluster then fails with `WebIdentityErr`. This
//! module checks the documents against the key and rewrites them, as
//! `hypershift fix dr-oidc-iam` does.
//!
//! IAM is reported, not checked: hcp-dr has no IAM client, and the checks
//! (the OIDC provider, the roles' trust) need IAM read rights a restore
//! rarely has.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::SECRET;
use crate::kube::{KubeError, api, get_json};
use crate::store::{S3Options, StoreError};

/// The discovery document, below the issuer URL.
pub const DISCOVERY_PATH: &str = ".well-known/openid-configuration";
/// The key set, below the issuer URL.
pub const JWKS_PATH: &str = "openid/v1/jwks";
/// The control-plane namespace's Secret holding the service-account signing key.
pub const SIGNING_KEY_SECRET: &str = "sa-signing-key";
/// Its public half (PEM, SubjectPublicKeyInfo).
pub const PUBLIC_KEY: &str = "service-account.pub";
/// The finalizer HyperShift marks a HostedCluster with once it wrote the documents.
pub const DOCUMENTS_FINALIZER: &str = "hypershift.openshift.io/aws-oidc-discovery";

// ---------------------------------------------------------------------------
// The key

/// A public signing key as a JSON Web Key.
#[derive(Debug, Clone, PartialEq)]
pub struct Jwk {
    /// `kid`: base64url of the SHA-256 of the key's SubjectPublicKeyInfo
    /// DER, as Kubernetes names its service-account keys.
    pub kid: String,
    /// `RS256`, `ES256` or `ES384`.
    pub alg: &'static str,
    /// The whole key as the key set publishes it.
    pub json: Value,
}

const RSA_OID: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const EC_OID: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const P256_OID: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384_OID: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];

/// One DER element of `input`: its value and what follows it, when its tag
/// is `tag`.
fn element<'a>(input: &'a [u8], tag: u8, what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
    let bad = || format!("the public key is not valid DER (at its {what})");
    let (&found, rest) = input.split_first().ok_or_else(bad)?;
    if found != tag {
        return Err(bad());
    }
    let (&first, rest) = rest.split_first().ok_or_else(bad)?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return Err(bad());
        }
        (rest[..n].iter().fold(0usize, |acc, b| acc << 8 | *b as usize), &rest[n..])
    };
    if rest.len() < len {
        return Err(bad());
    }
    Ok(rest.split_at(len))
}

fn der_seq(parts: &[&[u8]]) -> Vec<u8> {
    der_element(0x30, &parts.concat())
}

fn der_oid(oid: &[u8]) -> Vec<u8> {
    der_element(0x06, oid)
}

/// An unsigned big-endian integer without its sign padding.
fn unsigned(bytes: &[u8]) -> &[u8] {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    &bytes[zeros.min(bytes.len().saturating_sub(1))..]
}

/// A DER element of `tag` holding `content`.
fn der_element(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The JWK of a PEM public key, with the `kid` Kubernetes gives it: RSA,
/// or EC on P-256 or P-384. HyperShift labels its `service-account.pub`
/// `RSA PUBLIC KEY` around a SubjectPublicKeyInfo; a `PUBLIC KEY` label,
/// and a true PKCS#1 body under `RSA PUBLIC KEY`, are read too.
pub fn public_key(pem: &str) -> Result<Jwk, String> {
    let mut lines = pem.lines().skip_while(|l| !(l.starts_with("-----BEGIN PUBLIC KEY-----") || l.starts_with("-----BEGIN RSA PUBLIC KEY-----")));
    if lines.next().is_none() {
        return Err("no `-----BEGIN PUBLIC KEY-----` or `-----BEGIN RSA PUBLIC KEY-----` block".into());
    }
    let body: String = lines.take_while(|l| !l.starts_with("-----END")).collect();
    let mut der = STANDARD.decode(body.trim()).map_err(|e| format!("the public key's PEM is not base64: {e}"))?;
    // PKCS#1 (a SEQUENCE of two INTEGERs): wrapped as the SubjectPublicKeyInfo the kid is taken over
    if let Ok((inner, _)) = element(&der, 0x30, "key")
        && inner.first() == Some(&0x02)
    {
        let algorithm = der_seq(&[&der_oid(RSA_OID), &[0x05, 0x00]]);
        let bits = der_element(0x03, &[&[0u8][..], &der].concat());
        der = der_seq(&[&algorithm, &bits]);
    }
    let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(&der));
    let (spki, _) = element(&der, 0x30, "SubjectPublicKeyInfo")?;
    let (algorithm, rest) = element(spki, 0x30, "algorithm")?;
    let (oid, params) = element(algorithm, 0x06, "algorithm identifier")?;
    let (bits, _) = element(rest, 0x03, "key bits")?;
    let key = bits.strip_prefix(&[0u8][..]).ok_or("the public key's bit string has unused bits")?;
    let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
    if oid == RSA_OID {
        let (rsa, _) = element(key, 0x30, "RSA key")?;
        let (n, rest) = element(rsa, 0x02, "RSA modulus")?;
        let (e, _) = element(rest, 0x02, "RSA exponent")?;
        let json = json!({"use": "sig", "kty": "RSA", "kid": kid, "alg": "RS256", "n": b64(unsigned(n)), "e": b64(unsigned(e))});
        return Ok(Jwk { kid, alg: "RS256", json });
    }
    if oid == EC_OID {
        let (curve, _) = element(params, 0x06, "curve")?;
        let (crv, alg, size) = match curve {
            c if c == P256_OID => ("P-256", "ES256", 32),
            c if c == P384_OID => ("P-384", "ES384", 48),
            _ => return Err("the public key is on an elliptic curve other than P-256 and P-384".into()),
        };
        let point = key.strip_prefix(&[4u8][..]).filter(|p| p.len() == 2 * size).ok_or("the EC public key is not an uncompressed point")?;
        let (x, y) = point.split_at(size);
        let json = json!({"use": "sig", "kty": "EC", "kid": kid, "crv": crv, "alg": alg, "x": b64(x), "y": b64(y)});
        return Ok(Jwk { kid, alg, json });
    }
    Err("the public key is neither RSA nor EC".into())
}

// ---------------------------------------------------------------------------
// The documents

/// The discovery document of `issuer`, laid out as HyperShift writes it.
pub fn discovery_document(issuer: &str, alg: &str) -> String {
    format!(
        "{{\n\t\"issuer\": \"{issuer}\",\n\t\"jwks_uri\": \"{issuer}/{JWKS_PATH}\",\n\t\"response_types_supported\": [\n\t\t\"id_token\"\n\t],\n\t\"subject_types_supported\": [\n\t\t\"public\"\n\t],\n\t\"id_token_signing_alg_values_supported\": [\n\t\t\"{alg}\"\n\t]\n}}\n"
    )
}

/// The key set publishing `key`.
pub fn jwks_document(key: &Jwk) -> String {
    json!({"keys": [key.json]}).to_string()
}

/// What is wrong with the documents as found (None: absent) for `issuer`
/// and `key`; empty when they publish it. Compared by meaning, not bytes:
/// any layout, and other keys beside it (a rotation), are fine.
pub fn problems(issuer: &str, key: &Jwk, discovery: Option<&[u8]>, jwks: Option<&[u8]>) -> Vec<String> {
    let mut found = Vec::new();
    let discovery_url = format!("{issuer}/{DISCOVERY_PATH}");
    let jwks_url = format!("{issuer}/{JWKS_PATH}");
    match discovery.map(serde_json::from_slice::<Value>) {
        None => found.push(format!("{discovery_url} does not exist")),
        Some(Err(_)) => found.push(format!("{discovery_url} is not JSON")),
        Some(Ok(doc)) => {
            if doc["issuer"].as_str() != Some(issuer) {
                found.push(format!("{discovery_url} names the issuer {}, not {issuer}", doc["issuer"]));
            }
            if doc["jwks_uri"].as_str() != Some(jwks_url.as_str()) {
                found.push(format!("{discovery_url} points at the key set {}, not {jwks_url}", doc["jwks_uri"]));
            }
        }
    }
    let material: &[&str] = if key.json["kty"] == "RSA" { &["kty", "n", "e"] } else { &["kty", "crv", "x", "y"] };
    match jwks.map(serde_json::from_slice::<Value>) {
        None => found.push(format!("{jwks_url} does not exist")),
        Some(Err(_)) => found.push(format!("{jwks_url} is not JSON")),
        Some(Ok(doc)) => {
            let published = doc["keys"].as_array().into_iter().flatten().any(|k| material.iter().all(|f| k[*f] == key.json[*f]));
            if !published {
                found.push(format!("{jwks_url} does not publish the cluster's service-account signing key (kid {})", key.kid));
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------
// Where the documents live

/// The S3 bucket and key prefix serving an issuer URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub bucket: String,
    /// The keys' prefix (no leading or trailing `/`; empty: the bucket's root).
    pub prefix: String,
    /// The region an AWS hostname names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Served by AWS S3 itself (else by the S3 endpoint given to hcp-dr).
    pub aws: bool,
}

impl Location {
    pub fn key(&self, path: &str) -> String {
        if self.prefix.is_empty() { path.to_string() } else { format!("{}/{path}", self.prefix) }
    }
    pub fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

/// The bucket behind `issuer`: an AWS S3 URL, virtual-hosted
/// (`https://<bucket>.s3.<region>.amazonaws.com/<prefix>`) or path-style
/// (`https://s3.<region>.amazonaws.com/<bucket>/<prefix>`), or a path-style
/// URL of the S3 `endpoint` hcp-dr is given. Anything else (a CloudFront
/// distribution, another web server) cannot be mapped to a bucket.
pub fn location(issuer: &str, endpoint: Option<&str>) -> Result<Location, String> {
    let rest = issuer.strip_prefix("https://").ok_or_else(|| format!("the issuer URL {issuer} is not https://, which AWS requires of an OIDC issuer"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = path.trim_matches('/');
    let path_style = |region: Option<String>, aws: bool| -> Result<Location, String> {
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        if bucket.is_empty() {
            return Err(format!("the issuer URL {issuer} names no bucket"));
        }
        Ok(Location { bucket: bucket.to_string(), prefix: prefix.to_string(), region, aws })
    };
    if let Some(endpoint) = endpoint
        && let Some(endpoint_host) = endpoint.strip_prefix("https://").or_else(|| endpoint.strip_prefix("http://"))
        && endpoint_host.trim_end_matches('/').eq_ignore_ascii_case(host)
    {
        return path_style(None, false);
    }
    let domain = [".amazonaws.com", ".amazonaws.com.cn"].into_iter().find_map(|d| host.strip_suffix(d));
    let Some(domain) = domain else {
        return Err(format!(
            "the issuer URL {issuer} is not an S3 URL (a CloudFront distribution or another web server?): hcp-dr cannot tell which bucket serves it"
        ));
    };
    let region_of = |s: &str| Some(s.trim_start_matches("dualstack.").to_string()).filter(|r| !r.is_empty());
    if domain == "s3" {
        return path_style(None, true);
    }
    if let Some(region) = domain.strip_prefix("s3.").or_else(|| domain.strip_prefix("s3-")) {
        return path_style(region_of(region), true);
    }
    if let Some(at) = domain.rfind(".s3.").or_else(|| domain.rfind(".s3-")) {
        let region = &domain[at + 4..];
        return Ok(Location { bucket: domain[..at].to_string(), prefix: path.to_string(), region: region_of(region), aws: true });
    }
    if let Some(bucket) = domain.strip_suffix(".s3") {
        return Ok(Location { bucket: bucket.to_string(), prefix: path.to_string(), region: None, aws: true });
    }
    Err(format!("the issuer URL {issuer} is on amazonaws.com but not an S3 URL: hcp-dr cannot tell which bucket serves it"))
}

// ---------------------------------------------------------------------------
// The check

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum IssuerState {
    /// The documents publish the cluster's key.
    Valid,
    /// hcp-dr rewrote them; what was wrong.
    Repaired { problems: Vec<String> },
    /// Wrong or missing, and not rewritten: what is wrong and what to do.
    Stale { problems: Vec<String>, fix: String },
    /// Not checked, and why.
    NotChecked { why: String },
}

/// The check of one cluster's issuer (journaled; public data only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuerReport {
    pub issuer: String,
    /// The bucket and prefix serving it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// The `kid` of the cluster's service-account signing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(flatten)]
    pub state: IssuerState,
    /// What IAM must hold for the issuer (not checked).
    pub iam: Vec<String>,
}

impl IssuerReport {
    /// One line for the operator's report; a warning unless valid or repaired.
    pub fn summary(&self) -> (String, bool) {
        match &self.state {
            IssuerState::Valid => (format!("the OIDC issuer {} publishes the cluster's service-account key (kid {})", self.issuer, self.key_id.as_deref().unwrap_or("?")), false),
            IssuerState::Repaired { problems } => (format!("the OIDC issuer documents of {} were rewritten: {}", self.issuer, problems.join("; ")), false),
            IssuerState::Stale { problems, fix } => (format!("the OIDC issuer {} is stale, and the cluster's components will fail with WebIdentityErr: {}. {fix}", self.issuer, problems.join("; ")), true),
            IssuerState::NotChecked { why } => (format!("the OIDC issuer {} was not checked: {why}", self.issuer), true),
        }
    }
}

/// What IAM must hold for `issuer`: an OIDC provider for it, trusted by
/// each of the cluster's roles (`spec.platform.aws.rolesRef`).
pub fn iam_requirements(hc: &Value, issuer: &str) -> Vec<String> {
    let roles: Vec<&str> = hc.pointer("/spec/platform/aws/rolesRef").and_then(Value::as_object).into_iter().flatten().filter_map(|(_, v)| v.as_str()).collect();
    let Some(account) = roles.iter().find_map(|arn| arn.strip_prefix("arn:aws:iam::").and_then(|r| r.split(':').next())) else {
        return vec![format!("an IAM OIDC provider for {issuer} (client IDs openshift, sts.amazonaws.com), trusted by each of the cluster's IAM roles (none named in spec.platform.aws.rolesRef)")];
    };
    let provider = format!("arn:aws:iam::{account}:oidc-provider/{}", issuer.trim_start_matches("https://"));
    let mut lines = vec![format!(
        "the IAM OIDC provider {provider} must exist (client IDs openshift, sts.amazonaws.com): `aws iam get-open-id-connect-provider --open-id-connect-provider-arn {provider}`"
    )];
    let mut roles = roles;
    roles.sort_unstable();
    roles.dedup();
    lines.push(format!("the trust policy of each role must allow sts:AssumeRoleWithWebIdentity to the federated principal {provider}: {}", roles.join(", ")));
    lines
}

/// The S3 endpoint hcp-dr talks to: `given`, else the SDK's environment.
fn s3_endpoint(given: Option<&str>) -> Option<String> {
    given.map(str::to_string).or_else(|| ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"].into_iter().find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty())))
}


/// Check the OIDC issuer of `hc` (an AWS HostedCluster; None for any other
/// platform) against the public key of its control plane's
/// `sa-signing-key`, and with `repair` rewrite the documents when they do
/// not publish it. Only failures to read the management cluster are
/// errors: everything about the issuer is in the report.
pub async fn check_issuer(client: &kube::Client, hc: &Value, hcp_ns: &str, s3: &S3Options, repair: bool) -> Result<Option<IssuerReport>, KubeError> {
    if hc.pointer("/spec/platform/type").and_then(Value::as_str) != Some("AWS") {
        return Ok(None);
    }
    let issuer = hc.pointer("/spec/issuerURL").and_then(Value::as_str).unwrap_or_default().trim_end_matches('/').to_string();
    let mut report = IssuerReport { issuer: issuer.clone(), location: None, key_id: None, state: IssuerState::Valid, iam: iam_requirements(hc, &issuer) };
    let not_checked = |mut report: IssuerReport, why: String| {
        report.state = IssuerState::NotChecked { why };
        Ok(Some(report))
    };
    if issuer.is_empty() {
        return not_checked(report, "the HostedCluster has no spec.issuerURL".into());
    }
    let secret = get_json(&api(client, &SECRET, hcp_ns), SIGNING_KEY_SECRET, &format!("Secret {hcp_ns}/{SIGNING_KEY_SECRET}")).await?;
    let pem = secret
        .as_ref()
        .and_then(|s| s.pointer(&format!("/data/{}", PUBLIC_KEY.replace('/', "~1"))))
        .and_then(Value::as_str)
        .and_then(|b| STANDARD.decode(b).ok())
        .map(|b| String::from_utf8_lossy(&b).to_string());
    let Some(pem) = pem else {
        return not_checked(report, format!("Secret {hcp_ns}/{SIGNING_KEY_SECRET} has no {PUBLIC_KEY}: the control plane's service-account key is unknown"));
    };
    let key = match public_key(&pem) {
        Ok(key) => key,
        Err(why) => return not_checked(report, format!("Secret {hcp_ns}/{SIGNING_KEY_SECRET}'s {PUBLIC_KEY}: {why}")),
    };
    report.key_id = Some(key.kid.clone());
    let endpoint = s3_endpoint(s3.endpoint.as_deref());
    let place = match location(&issuer, endpoint.as_deref()) {
        Ok(place) => place,
        Err(why) => {
            return not_checked(report, format!("{why}. Check that {issuer}/{DISCOVERY_PATH} and {issuer}/{JWKS_PATH} publish the key with kid {} (as `hypershift fix dr-oidc-iam` writes them)", key.kid));
        }
    };
    report.location = Some(place.clone());
    let mut options = s3.clone();
    if place.aws {
        // the issuer's own bucket, not the endpoint the backups may use
        options.endpoint = None;
        options.path_style = Some(false);
        options.region = place.region.clone().or(options.region);
    }
    options.sse = crate::store::ServerSideEncryption::None;
    let store = match crate::store::S3Store::connect(place.bucket.clone(), String::new(), options).await {
        Ok(store) => store,
        Err(err) => return not_checked(report, format!("connecting to S3 for {}: {err}", place.url())),
    };
    let (discovery_key, jwks_key) = (place.key(DISCOVERY_PATH), place.key(JWKS_PATH));
    // what is wrong with the documents the bucket holds now
    let check = || async { Ok::<_, StoreError>(problems(&issuer, &key, crate::store::get_bytes(&store, &discovery_key).await?.as_deref(), crate::store::get_bytes(&store, &jwks_key).await?.as_deref())) };
    let wrong = match check().await {
        Ok(wrong) if wrong.is_empty() => return Ok(Some(report)),
        Ok(wrong) => wrong,
        Err(err) => return not_checked(report, format!("reading the documents in {}: {err}", place.url())),
    };
    let command = format!(
        "`hcp-dr cluster oidc {} --namespace {} --repair`",
        hc["metadata"]["name"].as_str().unwrap_or_default(),
        hc["metadata"]["namespace"].as_str().unwrap_or_default()
    );
    let grant = format!("give the identity hcp-dr runs as s3:PutObject and s3:PutObjectAcl on arn:aws:s3:::{}/{}*, then run {command}", place.bucket, place.key(""));
    if !repair {
        report.state = IssuerState::Stale { problems: wrong, fix: format!("To repair: run {command}") };
        return Ok(Some(report));
    }
    // the key set first: a discovery document never points at a key set without the key
    let written = async {
        store.put_public_document(&jwks_key, Bytes::from(jwks_document(&key))).await?;
        store.put_public_document(&discovery_key, Bytes::from(discovery_document(&issuer, key.alg))).await
    }
    .await;
    if let Err(err) = written {
        report.state = IssuerState::Stale { problems: wrong, fix: format!("hcp-dr could not rewrite them ({err}): {grant}") };
        return Ok(Some(report));
    }
    report.state = match check().await {
        Ok(still) if still.is_empty() => IssuerState::Repaired { problems: wrong },
        Ok(still) => IssuerState::Stale { problems: still, fix: format!("they were rewritten but read back differently (a cache or another writer?): {grant}") },
        Err(err) => IssuerState::Stale { problems: wrong, fix: format!("they were rewritten but could not be read back ({err}): check them, or {grant}") },
    };
    Ok(Some(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A 2048-bit RSA public key made with `openssl genrsa 2048 | openssl
    // pkey -pubout`; the expected values were read with openssl:
    // `openssl pkey -pubin -outform DER | sha256sum` (kid) and
    // `openssl rsa -pubin -modulus` (n). Only the public half exists here.
    const RSA_PEM: &str = include_str!("../../fixtures/oidc/rsa-2048.pub");

    #[test]
    fn an_rsa_key_becomes_the_jwk_kubernetes_publishes() {
        let expected: Value = serde_json::from_str(include_str!("../../fixtures/oidc/rsa-2048.expected.json")).unwrap();
        let key = public_key(RSA_PEM).unwrap();
        assert_eq!(key.alg, "RS256");
        assert_eq!(key.kid, expected["kid"].as_str().unwrap());
        assert_eq!(key.json["n"], expected["n"]);
        assert_eq!(key.json["e"], "AQAB");
        assert_eq!(key.json["use"], "sig");
    }

    #[test]
    fn hypershifts_label_and_pkcs1_give_the_same_key() {
        let expected = public_key(RSA_PEM).unwrap();
        // HyperShift: `RSA PUBLIC KEY` around the SubjectPublicKeyInfo
        let relabelled = RSA_PEM.replace("BEGIN PUBLIC KEY", "BEGIN RSA PUBLIC KEY").replace("END PUBLIC KEY", "END RSA PUBLIC KEY");
        assert_eq!(public_key(&relabelled).unwrap(), expected);
        // `openssl rsa -pubin -RSAPublicKey_out`: PKCS#1
        assert_eq!(public_key(include_str!("../../fixtures/oidc/rsa-2048.pkcs1.pub")).unwrap(), expected);
    }

    #[test]
    fn other_pem_and_broken_der_are_refused() {
        assert!(public_key("-----BEGIN CERTIFICATE-----\nMAo=\n-----END CERTIFICATE-----\n").unwrap_err().contains("no `-----BEGIN PUBLIC KEY-----`"));
        assert!(public_key("-----BEGIN PUBLIC KEY-----\nMAo=\n-----END PUBLIC KEY-----\n").unwrap_err().contains("DER"));
        assert!(public_key("-----BEGIN PUBLIC KEY-----\n!!\n-----END PUBLIC KEY-----\n").unwrap_err().contains("base64"));
    }

    #[test]
    fn documents_publishing_the_key_pass_and_others_name_what_is_wrong() {
        let key = public_key(RSA_PEM).unwrap();
        let issuer = "https://oidc.s3.us-east-1.amazonaws.com/demo-x1";
        let discovery = discovery_document(issuer, key.alg);
        let jwks = jwks_document(&key);
        assert!(problems(issuer, &key, Some(discovery.as_bytes()), Some(jwks.as_bytes())).is_empty());
        // another layout and a second key (a rotation) are fine
        let rotated = json!({"keys": [{"kty": "RSA", "n": "AAAA", "e": "AQAB"}, key.json]}).to_string();
        assert!(problems(issuer, &key, Some(discovery.as_bytes()), Some(rotated.as_bytes())).is_empty());
        let found = problems(issuer, &key, None, Some(b"{\"keys\": []}"));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("openid-configuration does not exist"), "{found:?}");
        assert!(found[1].contains(&key.kid), "{found:?}");
        let elsewhere = discovery_document("https://other.example.com/x", key.alg);
        let found = problems(issuer, &key, Some(elsewhere.as_bytes()), None);
        assert!(found.iter().any(|p| p.contains("names the issuer")) && found.iter().any(|p| p.contains("points at the key set")), "{found:?}");
    }

    #[test]
    fn the_discovery_document_is_laid_out_as_hypershift_writes_it() {
        let doc: Value = serde_json::from_str(&discovery_document("https://i.example.com/x", "RS256")).unwrap();
        assert_eq!(doc["jwks_uri"], "https://i.example.com/x/openid/v1/jwks");
        assert_eq!(doc["id_token_signing_alg_values_supported"], json!(["RS256"]));
        assert!(discovery_document("https://i", "RS256").starts_with("{\n\t\"issuer\": \"https://i\",\n"));
    }

    #[test]
    fn issuer_urls_map_to_their_bucket() {
        let at = |bucket: &str, prefix: &str, region: Option<&str>, aws: bool| Location { bucket: bucket.into(), prefix: prefix.into(), region: region.map(str::to_string), aws };
        assert_eq!(location("https://hcp-oidc.s3.us-east-2.amazonaws.com/demo-x1", None).unwrap(), at("hcp-oidc", "demo-x1", Some("us-east-2"), true));
        assert_eq!(location("https://my.dotted.bucket.s3.eu-west-1.amazonaws.com/a/b", None).unwrap(), at("my.dotted.bucket", "a/b", Some("eu-west-1"), true));
        assert_eq!(location("https://hcp-oidc.s3.amazonaws.com/demo", None).unwrap(), at("hcp-oidc", "demo", None, true));
        assert_eq!(location("https://s3.us-west-2.amazonaws.com/hcp-oidc/demo", None).unwrap(), at("hcp-oidc", "demo", Some("us-west-2"), true));
        assert_eq!(location("https://127.0.0.1:9443/oidc-a/demo/", Some("https://127.0.0.1:9443")).unwrap(), at("oidc-a", "demo", None, false));
        assert_eq!(location("https://127.0.0.1:9443/oidc-a", Some("https://127.0.0.1:9443/")).unwrap(), at("oidc-a", "", None, false));
        assert!(location("https://d111.cloudfront.net/demo", None).unwrap_err().contains("CloudFront"));
        assert!(location("http://hcp-oidc.s3.amazonaws.com/demo", None).unwrap_err().contains("https"));
        assert!(location("https://127.0.0.1:9443/oidc-a/demo", Some("https://127.0.0.1:9444")).is_err());
        assert_eq!(at("b", "", None, false).key(JWKS_PATH), "openid/v1/jwks");
        assert_eq!(at("b", "p/q", None, false).key(DISCOVERY_PATH), "p/q/.well-known/openid-configuration");
    }

    #[test]
    fn iam_requirements_name_the_provider_and_every_role() {
        let hc = json!({"spec": {"platform": {"aws": {"rolesRef": {
            "ingressARN": "arn:aws:iam::123456789012:role/demo-ingress",
            "nodePoolManagementARN": "arn:aws:iam::123456789012:role/demo-nodepool",
            "controlPlaneOperatorARN": "arn:aws:iam::123456789012:role/demo-ingress"
        }}}}});
        let lines = iam_requirements(&hc, "https://oidc.s3.us-east-1.amazonaws.com/demo");
        assert!(lines[0].contains("arn:aws:iam::123456789012:oidc-provider/oidc.s3.us-east-1.amazonaws.com/demo"), "{lines:?}");
        assert!(lines[1].ends_with("arn:aws:iam::123456789012:role/demo-ingress, arn:aws:iam::123456789012:role/demo-nodepool"), "{lines:?}");
    }
}
