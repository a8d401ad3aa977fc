//! Authentication: who a request is, as kube-apiserver's authenticators and
//! impersonation filter decide it.
//!
//! - Static bearer tokens from the configuration ([`super::TokenUser`], the
//!   admin of a sandbox cluster: `system:masters`).
//! - ServiceAccount tokens issued by the TokenRequest API
//!   (`POST /api/v1/namespaces/NS/serviceaccounts/NAME/token`, what
//!   `kubectl create token` calls): signed JWTs that authenticate as
//!   `system:serviceaccount:NS:NAME` while they have not expired, name the
//!   API server's audience, and the ServiceAccount (and the object the token
//!   is bound to, if any) still exists with the uid it had at issue.
//! - Anything else is a 401 `Status`.
//! - `Impersonate-User`/`-Group`/`-Uid`/`-Extra-*` headers (`kubectl --as`),
//!   allowed only with the `impersonate` verb, as upstream.
//! - `SelfSubjectReview` (`kubectl auth whoami`) and `TokenReview`.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::Inner;
use super::ops::now_ts;
use super::rbac::{self, Attributes};
use super::schema::FieldErrorKind;
use super::status::{ApiError, field_error};

/// The issuer and the one audience of the tokens the emulator issues
/// (kubeadm's defaults: `--service-account-issuer`, and `--api-audiences`
/// defaulting to the issuer).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// TokenRequest's default lifetime (`spec.expirationSeconds`), and its bounds.
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
const MIN_EXPIRATION_SECONDS: i64 = 600;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// The group every authenticated identity is in.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group whose members may do anything (upstream's privileged group).
pub const MASTERS: &str = "system:masters";

/// An authenticated identity (upstream `user.Info`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// In `system:masters`: every request is allowed without consulting RBAC.
    pub fn is_privileged(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// As `status.userInfo` of a review.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty() {
            v["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            v["extra"] = json!(self.extra);
        }
        v
    }
}

/// `system:serviceaccount:NS:NAME`.
pub fn service_account_username(ns: &str, name: &str) -> String {
    format!("system:serviceaccount:{ns}:{name}")
}

/// The namespace and name in a ServiceAccount username.
pub fn parse_service_account_username(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// The groups of every ServiceAccount of `ns`.
pub fn service_account_groups(ns: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{ns}"),
        AUTHENTICATED.into(),
    ]
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// The key tokens are signed with: derived from the CA's private key and the
/// cluster, so it survives a restart of the emulator (as a kube-apiserver's
/// `--service-account-signing-key-file` does) and differs between clusters.
pub(crate) fn signing_key(ca_key_pem: &str, cluster_name: &str, key_prefix: &str) -> [u8; 32] {
    let material = format!(
        "hcp-dr emulator service-account signing key\0{cluster_name}\0{key_prefix}\0{ca_key_pem}"
    );
    Sha256::digest(material.as_bytes()).into()
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A signed JWT (HS256) with `claims`.
fn sign(key: &[u8; 32], claims: &Value) -> String {
    let kid = b64url(&Sha256::digest(key)[..12]);
    let header = json!({"alg": "HS256", "kid": kid, "typ": "JWT"});
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let signature = hmac_sha256(key, signing_input.as_bytes());
    format!("{signing_input}.{}", b64url(&signature))
}

/// The claims of a token whose signature `key` made; None otherwise.
fn verify(key: &[u8; 32], token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let (header, claims, signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let decode = |s: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .ok()
    };
    let expected = hmac_sha256(key, format!("{header}.{claims}").as_bytes());
    let given = decode(signature)?;
    // compare without stopping at the first difference
    if given.len() != expected.len()
        || given
            .iter()
            .zip(expected.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            != 0
    {
        return None;
    }
    let header: Value = serde_json::from_slice(&decode(header)?).ok()?;
    if header.get("alg").and_then(Value::as_str) != Some("HS256") {
        return None;
    }
    serde_json::from_slice(&decode(claims)?).ok()
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Who sent the request; 401 when no token or an invalid one is presented.
pub(crate) async fn authenticate(inner: &Inner, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
    let token = bearer_token(headers).ok_or_else(ApiError::unauthorized)?;
    authenticate_token(inner, token)
        .await
        .ok_or_else(ApiError::unauthorized)
}

/// The identity a token authenticates, if any (also for TokenReview).
async fn authenticate_token(inner: &Inner, token: &str) -> Option<UserInfo> {
    if let Some(u) = inner.tokens.iter().find(|u| u.token == token) {
        return Some(UserInfo {
            name: u.user.clone(),
            uid: String::new(),
            groups: u.groups.clone(),
            extra: BTreeMap::new(),
        });
    }
    match service_account_token(inner, token).await {
        Ok(user) => Some(user),
        Err(why) => {
            tracing::debug!(%why, "bearer token rejected");
            None
        }
    }
}

/// Validate a ServiceAccount token as upstream's JWT authenticator and
/// ServiceAccount token getter do; the error says why it was rejected (logged only).
async fn service_account_token(inner: &Inner, token: &str) -> Result<UserInfo, String> {
    let claims = verify(&inner.token_signing_key, token).ok_or("not a token this server signed")?;
    if claims.get("iss").and_then(Value::as_str) != Some(ISSUER) {
        return Err("unknown issuer".into());
    }
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !audiences.contains(&ISSUER) {
        return Err(format!(
            "token audiences {audiences:?} do not include the API audience {ISSUER}"
        ));
    }
    let now = chrono::Utc::now().timestamp();
    let exp = claims.get("exp").and_then(Value::as_i64).ok_or("no exp")?;
    let nbf = claims.get("nbf").and_then(Value::as_i64).unwrap_or(0);
    if now >= exp {
        return Err("token has expired".into());
    }
    if now < nbf {
        return Err("token is not valid yet".into());
    }
    let k8s = claims
        .get("kubernetes.io")
        .ok_or("no kubernetes.io claim")?;
    let ns = k8s
        .get("namespace")
        .and_then(Value::as_str)
        .ok_or("no namespace")?;
    let sa_name = k8s
        .pointer("/serviceaccount/name")
        .and_then(Value::as_str)
        .ok_or("no serviceaccount")?;
    let sa_uid = k8s
        .pointer("/serviceaccount/uid")
        .and_then(Value::as_str)
        .ok_or("no serviceaccount uid")?;
    if claims.get("sub").and_then(Value::as_str)
        != Some(service_account_username(ns, sa_name).as_str())
    {
        return Err("subject does not match the serviceaccount".into());
    }
    still_live(
        inner,
        ("ServiceAccount", "serviceaccounts"),
        ns,
        sa_name,
        sa_uid,
    )
    .await?;
    let mut extra = BTreeMap::new();
    if let Some(jti) = claims.get("jti").and_then(Value::as_str) {
        extra.insert(
            "authentication.kubernetes.io/credential-id".to_string(),
            vec![format!("JTI={jti}")],
        );
    }
    for (kind, plural, key) in [("Pod", "pods", "pod"), ("Secret", "secrets", "secret")] {
        if let Some(bound) = k8s.get(key) {
            let name = bound["name"].as_str().unwrap_or_default();
            let uid = bound["uid"].as_str().unwrap_or_default();
            still_live(inner, (kind, plural), ns, name, uid).await?;
            if kind == "Pod" {
                extra.insert(
                    "authentication.kubernetes.io/pod-name".to_string(),
                    vec![name.to_string()],
                );
                extra.insert(
                    "authentication.kubernetes.io/pod-uid".to_string(),
                    vec![uid.to_string()],
                );
            }
        }
    }
    Ok(UserInfo {
        name: service_account_username(ns, sa_name),
        uid: sa_uid.to_string(),
        groups: service_account_groups(ns),
        extra,
    })
}

/// The object a token names still exists with the uid it had at issue and is not being deleted.
async fn still_live(
    inner: &Inner,
    (kind, plural): (&str, &str),
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<(), String> {
    let rt = inner
        .resolve("", "v1", plural)
        .ok_or_else(|| format!("{plural} not served"))?;
    let stored = inner
        .get_stored(&rt, Some(ns), name)
        .await
        .map_err(|e| format!("{kind} {name}: {}", e.message))?;
    let meta = &stored.obj["metadata"];
    if meta["uid"].as_str() != Some(uid) {
        return Err(format!(
            "{kind} {name} has uid {}, the token was issued for {uid}",
            meta["uid"]
        ));
    }
    if meta.get("deletionTimestamp").is_some_and(|d| !d.is_null()) {
        return Err(format!("{kind} {name} is being deleted"));
    }
    Ok(())
}

fn json_created(v: &Value) -> Response {
    use axum::response::IntoResponse as _;
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

fn invalid_token_request(name: &str, field: &str, detail: String) -> ApiError {
    ApiError::invalid(
        "authentication.k8s.io",
        "TokenRequest",
        name,
        &[field_error(FieldErrorKind::Invalid, field, detail)],
    )
}

/// `POST serviceaccounts/NAME/token`: a token for the ServiceAccount, 201
/// with the TokenRequest and `status.token`.
pub(crate) async fn token_request(
    inner: &Inner,
    ns: &str,
    sa_name: &str,
    body: &Value,
) -> Result<Response, ApiError> {
    if let Some(kind) = body.get("kind").and_then(Value::as_str)
        && kind != "TokenRequest"
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the object ({kind}) does not match the kind of the resource (TokenRequest)"
        )));
    }
    let req_name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let expiration = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::bad_request(format!("spec.expirationSeconds: {v} is not an integer"))
        })?,
    };
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid_token_request(
            req_name,
            "spec.expirationSeconds",
            format!("Invalid value: {expiration}: may not specify a duration less than 10 minutes"),
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid_token_request(
            req_name,
            "spec.expirationSeconds",
            format!(
                "Invalid value: {expiration}: may not specify a duration larger than 2^32 seconds"
            ),
        ));
    }
    let audiences: Vec<String> = match spec.get("audiences") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => vec![ISSUER.to_string()],
    };
    let sa_rt = inner
        .resolve("", "v1", "serviceaccounts")
        .ok_or_else(|| ApiError::internal("serviceaccounts not registered"))?;
    let sa = inner.get_stored(&sa_rt, Some(ns), sa_name).await?.obj;
    let sa_uid = sa
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();

    let mut k8s = json!({"namespace": ns, "serviceaccount": {"name": sa_name, "uid": sa_uid}});
    let bound_ref = spec.get("boundObjectRef").filter(|b| !b.is_null());
    if let Some(bound) = bound_ref {
        let kind = bound.get("kind").and_then(Value::as_str).unwrap_or("");
        let (plural, key) = match kind {
            "Pod" => ("pods", "pod"),
            "Secret" => ("secrets", "secret"),
            other => {
                return Err(invalid_token_request(
                    req_name,
                    "spec.boundObjectRef.kind",
                    format!(
                        "Unsupported value: \"{other}\": supported values: \"Pod\", \"Secret\""
                    ),
                ));
            }
        };
        let name = bound.get("name").and_then(Value::as_str).unwrap_or("");
        let rt = inner
            .resolve("", "v1", plural)
            .ok_or_else(|| ApiError::internal(format!("{plural} not registered")))?;
        let obj = inner.get_stored(&rt, Some(ns), name).await?.obj;
        let uid = obj
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(want) = bound.get("uid").and_then(Value::as_str)
            && !want.is_empty()
            && want != uid
        {
            return Err(ApiError::conflict_msg(
                "",
                plural,
                name,
                &format!(
                    "the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        k8s[key] = json!({"name": name, "uid": uid});
    }

    let now = chrono::Utc::now();
    let exp = now.timestamp() + expiration;
    let claims = json!({
        "aud": audiences,
        "exp": exp,
        "iat": now.timestamp(),
        "iss": ISSUER,
        "jti": uuid::Uuid::new_v4().to_string(),
        "kubernetes.io": k8s,
        "nbf": now.timestamp(),
        "sub": service_account_username(ns, sa_name),
    });
    let token = sign(&inner.token_signing_key, &claims);
    let expires = chrono::DateTime::from_timestamp(exp, 0)
        .unwrap_or(now)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    Ok(json_created(&json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa_name, "namespace": ns, "creationTimestamp": now_ts()},
        "spec": {"audiences": audiences, "expirationSeconds": expiration, "boundObjectRef": bound_ref.cloned()},
        "status": {"token": token, "expirationTimestamp": expires},
    })))
}

/// `POST selfsubjectreviews`: who the server thinks the caller is.
pub(crate) fn self_subject_review(user: &UserInfo) -> Response {
    json_created(&json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": now_ts()},
        "status": {"userInfo": user.to_json()},
    }))
}

/// `POST tokenreviews`: whether a token authenticates, and as whom.
pub(crate) async fn token_review(inner: &Inner, body: &Value) -> Result<Response, ApiError> {
    let token = body
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("");
    let status = match authenticate_token(inner, token).await {
        Some(user) => json!({"authenticated": true, "user": user.to_json(), "audiences": [ISSUER]}),
        None => {
            json!({"user": {}, "error": "[invalid bearer token, service account token has been invalidated]"})
        }
    };
    Ok(json_created(&json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": now_ts()},
        "spec": body.get("spec").cloned().unwrap_or_else(|| json!({})),
        "status": status,
    })))
}

/// Apply `Impersonate-*` headers: the requester must be allowed to
/// `impersonate` each requested user, group, uid and extra value (403
/// otherwise); the request then runs as the impersonated identity.
pub(crate) async fn impersonate(
    inner: &Inner,
    requester: UserInfo,
    headers: &HeaderMap,
) -> Result<UserInfo, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect()
    };
    let user = values("impersonate-user").into_iter().next();
    let groups = values("impersonate-group");
    let uid = values("impersonate-uid").into_iter().next();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-")
            && let Ok(v) = value.to_str()
        {
            let key = percent_decode(key);
            extra.entry(key).or_default().push(v.to_string());
        }
    }
    let Some(user) = user else {
        if !groups.is_empty() || uid.is_some() || !extra.is_empty() {
            return Err(ApiError::internal(
                "requested impersonation of groups, uid or extra without impersonating a user",
            ));
        }
        return Ok(requester);
    };
    let mut checks: Vec<Attributes> = Vec::new();
    let mut groups_out = groups.clone();
    match parse_service_account_username(&user) {
        Some((ns, name)) => {
            checks.push(Attributes::impersonate("", "serviceaccounts", "", ns, name));
            if groups.is_empty() {
                groups_out = service_account_groups(ns);
            }
        }
        None => checks.push(Attributes::impersonate("", "users", "", "", &user)),
    }
    for g in &groups {
        checks.push(Attributes::impersonate("", "groups", "", "", g));
    }
    if let Some(u) = &uid {
        checks.push(Attributes::impersonate(
            "authentication.k8s.io",
            "uids",
            "",
            "",
            u,
        ));
    }
    for (key, vals) in &extra {
        for v in vals {
            checks.push(Attributes::impersonate(
                "authentication.k8s.io",
                "userextras",
                key,
                "",
                v,
            ));
        }
    }
    for a in &checks {
        rbac::require(inner, &requester, a).await?;
    }
    let anonymous = user == "system:anonymous";
    let implied = if anonymous {
        "system:unauthenticated"
    } else {
        AUTHENTICATED
    };
    if !groups_out.iter().any(|g| g == implied) {
        groups_out.push(implied.to_string());
    }
    Ok(UserInfo {
        name: user,
        uid: uid.unwrap_or_default(),
        groups: groups_out,
        extra,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn tokens_verify_only_with_their_key_and_untampered() {
        let key = signing_key("KEY", "mgmt-a", "/registry");
        let claims = json!({"sub": "system:serviceaccount:a:b", "exp": 1});
        let token = sign(&key, &claims);
        assert_eq!(token.split('.').count(), 3, "JWT-shaped");
        assert_eq!(verify(&key, &token), Some(claims));
        let other = signing_key("KEY", "mgmt-b", "/registry");
        assert_eq!(verify(&other, &token), None, "another cluster's key");
        let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
        parts[1] = b64url(
            json!({"sub": "system:serviceaccount:kube-system:admin", "exp": 1})
                .to_string()
                .as_bytes(),
        );
        assert_eq!(verify(&key, &parts.join(".")), None, "changed claims");
        assert_eq!(verify(&key, "not-a-jwt"), None);
    }

    #[test]
    fn service_account_usernames() {
        assert_eq!(
            parse_service_account_username("system:serviceaccount:hcp-dr:hcp-dr-backup"),
            Some(("hcp-dr", "hcp-dr-backup"))
        );
        assert_eq!(
            parse_service_account_username("system:serviceaccount:hcp-dr"),
            None
        );
        assert_eq!(parse_service_account_username("alice"), None);
        assert_eq!(percent_decode("scopes%2Fa"), "scopes/a");
    }
}
