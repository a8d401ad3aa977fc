//! AWS platform OIDC issuer: the operator creates the HCP namespace's
//! `sa-signing-key` (keeping one already there), uploads the discovery
//! document and the JWKS under `<infraID>/` into its own OIDC bucket and
//! adds the `aws-oidc-discovery` finalizer; with the finalizer already there,
//! or while paused, it uploads nothing; a refused upload (403) is retried;
//! deleting the HostedCluster deletes both documents and the finalizer.
//! Needs `etcd` and `s3s-fs`.

use crate::operator_support;

use base64::Engine as _;
use hcp_dr_e2e::operator::OidcConfig;
use hcp_dr_e2e::operator::hypershift::FINALIZER;
use hcp_dr_e2e::operator::oidc::{
    OIDC_FINALIZER, SA_PRIVATE_KEY, SA_PUBLIC_KEY, SA_SIGNING_KEY_SECRET, discovery_document,
    discovery_key, jwks_document, jwks_key,
};
use hcp_dr_e2e::pki::Ca;
use hcp_dr_e2e::procs::s3::{S3Endpoint, sdk_config};
use hcp_dr_e2e::procs::s3_faults::{S3FaultKind, S3Faults};
use hcp_dr_e2e::sandbox::{oidc_bucket, oidc_issuer_url};
use operator_support::*;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// The DER prefix of every EC P-256 SubjectPublicKeyInfo (RFC 5480): the
/// algorithm (id-ecPublicKey, prime256v1), then the BIT STRING header; the
/// uncompressed point `04 || X || Y` follows.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

fn s3_client(s3: &S3Endpoint, ca: &Ca) -> aws_sdk_s3::Client {
    // s3s-fs itself: never faulted
    let config = sdk_config(s3.http_url(), s3.region(), s3.access_key(), s3.secret_key(), ca.cert_pem()).expect("S3 client").build();
    aws_sdk_s3::Client::from_conf(config)
}

/// The object's content, `None` when absent.
async fn object(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Option<String> {
    let out = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .ok()?;
    let body = out.body.collect().await.expect("object body").into_bytes();
    Some(String::from_utf8(body.to_vec()).expect("utf8 document"))
}

/// The keys under `prefix` in `bucket`.
async fn keys(client: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Vec<String> {
    let listed = client
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .send()
        .await
        .expect("ListObjectsV2");
    listed
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_string))
        .collect()
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn aws_platform() -> Value {
    let role = |name: &str| format!("arn:aws:iam::123456789012:role/sandbox-{name}");
    json!({"type": "AWS", "aws": {"region": "us-east-1", "endpointAccess": "Public",
    "rolesRef": {
        "ingressARN": role("ingress"),
        "imageRegistryARN": role("image-registry"),
        "storageARN": role("aws-ebs-csi-driver-controller"),
        "networkARN": role("cloud-network-config-controller"),
        "kubeCloudControllerARN": role("cloud-controller"),
        "nodePoolManagementARN": role("node-pool"),
        "controlPlaneOperatorARN": role("control-plane-operator"),
    }}})
}

/// An AWS HostedCluster without NodePools, with `extra` (see
/// [`Mgmt::create_hosted_cluster_with`]).
async fn create_aws(mgmt: &Mgmt, name: &str, extra: Value) {
    mgmt.create_hosted_cluster_with(
        name,
        "SingleReplica",
        0,
        None,
        aws_platform(),
        json!({}),
        extra,
    )
    .await;
}

/// The JWKS of `public_pem` computed here, without the operator's code: the
/// DER under the PEM armour, checked to be a P-256 SubjectPublicKeyInfo,
/// `kid` = SHA-256 of it, `x`/`y` = the point's halves, all base64url.
fn expected_jwk(public_pem: &str) -> Value {
    let body: String = public_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("PEM body");
    assert_eq!(der.len(), 91, "a P-256 SubjectPublicKeyInfo");
    assert_eq!(der[..26], P256_SPKI_PREFIX, "id-ecPublicKey on prime256v1");
    assert_eq!(der[26], 0x04, "an uncompressed point");
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    json!({"use": "sig", "kty": "EC", "kid": b64(&Sha256::digest(&der)), "crv": "P-256", "alg": "ES256",
        "x": b64(&der[27..59]), "y": b64(&der[59..91])})
}

/// `(service-account.key, service-account.pub)` of `sa-signing-key` in `hcp_ns`.
async fn signing_key(mgmt: &Mgmt, hcp_ns: &str) -> Option<(String, String)> {
    let secret = mgmt
        .get(
            &mgmt.api("", "v1", "Secret", "secrets", Some(hcp_ns)),
            SA_SIGNING_KEY_SECRET,
        )
        .await?;
    let dec = |k: &str| {
        let b = base64::engine::general_purpose::STANDARD
            .decode(secret["data"][k].as_str().expect(k))
            .expect("base64");
        String::from_utf8(b).expect("utf8 PEM")
    };
    Some((dec(SA_PRIVATE_KEY), dec(SA_PUBLIC_KEY)))
}

/// Wait until the HostedCluster `name` has `finalizer`; returns it.
async fn wait_finalizer(mgmt: &Mgmt, name: &str, finalizer: &str) -> Value {
    wait_for(
        &format!("HostedCluster {name} with finalizer {finalizer}"),
        || async {
            let hc = mgmt.get(&mgmt.hc_api(), name).await?;
            finalizers(&hc).iter().any(|f| f == finalizer).then_some(hc)
        },
    )
    .await
}

/// Check the two documents of `infra_id` in `bucket` against `issuer` and
/// the public key `public_pem`.
async fn assert_documents(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    infra_id: &str,
    issuer: &str,
    public_pem: &str,
) {
    let discovery = object(
        s3,
        bucket,
        &format!("{infra_id}/.well-known/openid-configuration"),
    )
    .await
    .expect("discovery document uploaded");
    let literal = format!(
        "{{\n\t\"issuer\": \"{issuer}\",\n\t\"jwks_uri\": \"{issuer}/openid/v1/jwks\",\n\t\"response_types_supported\": [\n\t\t\"id_token\"\n\t],\n\t\"subject_types_supported\": [\n\t\t\"public\"\n\t],\n\t\"id_token_signing_alg_values_supported\": [\n\t\t\"ES256\"\n\t]\n}}"
    );
    assert_eq!(discovery, literal);
    assert_eq!(discovery, discovery_document(issuer, "ES256"));
    let jwks_text = object(s3, bucket, &format!("{infra_id}/openid/v1/jwks"))
        .await
        .expect("JWKS uploaded");
    let jwks: Value = serde_json::from_str(&jwks_text).expect("JWKS is JSON");
    assert_eq!(jwks, json!({"keys": [expected_jwk(public_pem)]}));
    assert_eq!(jwks_text, jwks_document(public_pem).expect("jwks_document"));
    // the go-jose field order
    assert!(
        jwks_text.starts_with(r#"{"keys":[{"use":"sig","kty":"EC","kid":""#),
        "{jwks_text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aws_hosted_clusters_publish_their_oidc_documents() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let s3_dir = tempfile::tempdir().expect("temp dir");
    let s3_ca = Ca::new("oidc-s3-ca").expect("CA");
    let s3 = S3Endpoint::start(s3_dir.path(), &s3_ca)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let bucket = oidc_bucket("mgmt-a");
    assert_eq!(bucket, "oidc-mgmt-a");
    s3.create_bucket(&bucket).await.expect("OIDC bucket");
    let client = s3_client(&s3, &s3_ca);
    let mgmt = Mgmt::start_with_oidc(
        "mgmt-a",
        OidcConfig {
            endpoint_url: s3.https_url().to_string(),
            bucket: bucket.clone(),
            region: s3.region().to_string(),
            access_key: s3.access_key().to_string(),
            secret_key: s3.secret_key().to_string(),
            ca_pem: s3_ca.cert_pem().to_string(),
        },
    )
    .await;
    let issuer =
        |infra_id: &str| oidc_issuer_url(&format!("{}/", s3.https_url()), &bucket, infra_id);
    assert_eq!(issuer("x"), format!("{}/oidc-mgmt-a/x", s3.https_url()));

    // alpha: the bucket refuses the operator (403) at first: retried, no finalizer.
    s3.set_faults(Some(&S3Faults {
        share: 1.0,
        kinds: vec![S3FaultKind::AccessDenied],
        path_prefix: Some(format!("/{bucket}/")),
        ..Default::default()
    }))
    .expect("set faults");
    create_aws(
        &mgmt,
        "alpha",
        json!({"spec": {"infraID": "alpha-x1", "issuerURL": issuer("alpha-x1")}}),
    )
    .await;
    wait_for("two refused uploads", || async {
        (s3.faults_injected()
            .iter()
            .filter(|f| f["kind"] == "access-denied")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    let hc = mgmt.get(&mgmt.hc_api(), "alpha").await.expect("alpha");
    assert!(
        !finalizers(&hc).contains(&OIDC_FINALIZER.to_string()),
        "{hc}"
    );
    assert!(keys(&client, &bucket, "alpha-x1/").await.is_empty());
    s3.set_faults(None).expect("faults off");

    let hc = wait_finalizer(&mgmt, "alpha", OIDC_FINALIZER).await;
    assert!(finalizers(&hc).contains(&FINALIZER.to_string()), "{hc}");
    let (private_pem, public_pem) = signing_key(&mgmt, "clusters-alpha")
        .await
        .expect("sa-signing-key created");
    assert!(
        private_pem.starts_with("-----BEGIN PRIVATE KEY-----"),
        "{private_pem}"
    );
    assert!(
        public_pem.starts_with("-----BEGIN PUBLIC KEY-----"),
        "{public_pem}"
    );
    let pair = rcgen::KeyPair::from_pem(&private_pem).expect("the private key parses");
    assert_eq!(
        pair.public_key_pem(),
        public_pem,
        "the two keys are one pair"
    );
    assert_eq!(
        hc["spec"]["issuerURL"].as_str(),
        Some(issuer("alpha-x1").as_str())
    );
    assert_documents(
        &client,
        &bucket,
        "alpha-x1",
        &issuer("alpha-x1"),
        &public_pem,
    )
    .await;
    assert_eq!(
        discovery_key("alpha-x1"),
        "alpha-x1/.well-known/openid-configuration"
    );
    assert_eq!(jwks_key("alpha-x1"), "alpha-x1/openid/v1/jwks");

    // beta: a sa-signing-key already there (as a restore replays it) is kept and published.
    let ns_api = mgmt.api("", "v1", "Namespace", "namespaces", None);
    mgmt.create(
        &ns_api,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "clusters-beta"}}),
    )
    .await;
    let (old_private, old_public) =
        hcp_dr_e2e::operator::oidc::generate_signing_key().expect("key");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    mgmt.create(
        &mgmt.api("", "v1", "Secret", "secrets", Some("clusters-beta")),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SA_SIGNING_KEY_SECRET},
            "type": "Opaque", "data": {SA_PRIVATE_KEY: b64(&old_private), SA_PUBLIC_KEY: b64(&old_public)}}),
    )
    .await;
    create_aws(
        &mgmt,
        "beta",
        json!({"spec": {"infraID": "beta-x2", "issuerURL": issuer("beta-x2")}}),
    )
    .await;
    wait_finalizer(&mgmt, "beta", OIDC_FINALIZER).await;
    assert_eq!(
        signing_key(&mgmt, "clusters-beta").await,
        Some((old_private, old_public.clone())),
        "not overwritten"
    );
    assert_documents(&client, &bucket, "beta-x2", &issuer("beta-x2"), &old_public).await;

    // gamma: the finalizer is there already (restored elsewhere): no upload.
    create_aws(
        &mgmt,
        "gamma",
        json!({"metadata": {"finalizers": [OIDC_FINALIZER]},
            "spec": {"infraID": "gamma-x3", "issuerURL": issuer("gamma-x3")}}),
    )
    .await;
    // status is written at the end of a pass: the OIDC step was passed
    mgmt.wait_condition("gamma", "ReconciliationActive", "True")
        .await;
    assert!(
        signing_key(&mgmt, "clusters-gamma").await.is_some(),
        "the key is still made"
    );
    assert!(keys(&client, &bucket, "gamma-x3/").await.is_empty());

    // delta: paused, nothing; once unpaused, the documents.
    create_aws(&mgmt, "delta", json!({"spec": {"infraID": "delta-x4", "issuerURL": issuer("delta-x4"), "pausedUntil": "true"}})).await;
    mgmt.wait_condition("delta", "ReconciliationActive", "False")
        .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let hc = mgmt.get(&mgmt.hc_api(), "delta").await.expect("delta");
    assert!(
        !finalizers(&hc).contains(&OIDC_FINALIZER.to_string()),
        "{hc}"
    );
    assert!(keys(&client, &bucket, "delta-x4/").await.is_empty());
    mgmt.merge(
        &mgmt.hc_api(),
        "delta",
        json!({"spec": {"pausedUntil": null}}),
    )
    .await;
    wait_finalizer(&mgmt, "delta", OIDC_FINALIZER).await;
    assert_eq!(keys(&client, &bucket, "delta-x4/").await.len(), 2);

    // epsilon: not AWS: no key, no documents, no OIDC finalizer.
    mgmt.create_hosted_cluster_with(
        "epsilon",
        "SingleReplica",
        0,
        None,
        json!({"type": "None"}),
        json!({"type": "None"}),
        json!({"spec": {"infraID": "epsilon-x5", "issuerURL": issuer("epsilon-x5")}}),
    )
    .await;
    let hc = mgmt
        .wait_condition("epsilon", "ReconciliationActive", "True")
        .await;
    assert_eq!(finalizers(&hc), vec![FINALIZER.to_string()]);
    assert!(signing_key(&mgmt, "clusters-epsilon").await.is_none());
    assert!(keys(&client, &bucket, "epsilon-x5/").await.is_empty());

    // Deleting alpha deletes its documents, then the finalizers go; gamma
    // (finalizer, no documents here) goes too; beta's documents stay.
    for name in ["alpha", "gamma"] {
        mgmt.hc_api()
            .delete(name, &Default::default())
            .await
            .expect("delete HC");
    }
    for name in ["alpha", "gamma"] {
        wait_for(&format!("HostedCluster {name} gone"), || async {
            mgmt.get(&mgmt.hc_api(), name).await.is_none().then_some(())
        })
        .await;
    }
    assert!(keys(&client, &bucket, "alpha-x1/").await.is_empty());
    assert_eq!(keys(&client, &bucket, "beta-x2/").await.len(), 2);
    mgmt.stop().await;
}
