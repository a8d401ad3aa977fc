//! The CRD conversion webhook a Cluster API install brings, served by the
//! sandbox for the CRDs it installs on an existing cluster.
//!
//! Cluster API's CRDs serve `v1beta1` and `v1beta2` (object references
//! changed shape between them) and are installed with a conversion webhook
//! run by CAPI's controller. The CRDs in `../shared/crds` are the
//! repository's, without that webhook: on a real API server their
//! conversion is `None`, which only relabels `apiVersion`, so a `v1beta1`
//! object read as `v1beta2` (the preferred version, what hcp-dr exports)
//! lacks `controlPlaneRef.apiGroup` and is refused when replayed. The
//! emulator converts built in ([`crate::apiserver::conversion`]); on an
//! existing cluster the sandbox installs the CRDs with this webhook
//! (`spec.conversion.strategy: Webhook`, a loopback URL and the sandbox
//! CA), which answers ConversionReviews with the same conversion. It lives
//! as long as the sandbox process; `down` removes the CRDs first.

use std::net::{IpAddr, Ipv4Addr};

use axum::Json;
use axum::routing::post;
use base64::Engine as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::ServiceExt as _;

use crate::pki::{Ca, CertSpec, server_tls_config};
use crate::sandbox::SandboxError;

/// A running webhook.
pub struct ConversionWebhook {
    url: String,
    ca_bundle: String,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for ConversionWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConversionWebhook").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Drop for ConversionWebhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answer one ConversionReview (`apiextensions.k8s.io/v1`).
pub fn review(request: &Value) -> Value {
    let uid = request.pointer("/request/uid").cloned().unwrap_or(json!(""));
    let desired = request.pointer("/request/desiredAPIVersion").and_then(Value::as_str).unwrap_or_default();
    let group = desired.split_once('/').map(|(g, _)| g).unwrap_or_default();
    let objects = request.pointer("/request/objects").and_then(Value::as_array).cloned().unwrap_or_default();
    let converted: Vec<Value> = objects
        .into_iter()
        .map(|mut obj| {
            let from = obj["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = obj["kind"].as_str().unwrap_or_default().to_string();
            crate::apiserver::conversion::convert(group, &kind, &from, desired, &mut obj);
            obj["apiVersion"] = json!(desired);
            obj
        })
        .collect();
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": uid, "convertedObjects": converted, "result": {"status": "Success"}}})
}

impl ConversionWebhook {
    /// Listen on a port of `address` (where the clusters' API servers reach
    /// this machine: 127.0.0.1 for one on this machine's network; for kind,
    /// whose API server runs in a container, the container network's
    /// gateway) with a certificate of `ca` for that address.
    pub async fn start(ca: &Ca, address: Option<IpAddr>) -> Result<ConversionWebhook, SandboxError> {
        let address = address.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let pair = ca.issue(&CertSpec {
            common_name: "hcp-dr-sandbox-conversion-webhook".into(),
            organization: None,
            dns_names: vec!["localhost".into()],
            ips: vec![address],
            server: true,
            client: false,
        })?;
        let tls = server_tls_config(&pair, None)?;
        let shown = format!("{address}:0 (conversion webhook; --webhook-address)");
        let listener = TcpListener::bind((address, 0))
            .await
            .map_err(|source| SandboxError::Io { path: shown.clone().into(), source })?;
        let port = listener.local_addr().map_err(|source| SandboxError::Io { path: shown.into(), source })?.port();
        let router = axum::Router::new().route("/convert", post(|Json(body): Json<Value>| async move { Json(review(&body)) }));
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (acceptor, router) = (acceptor.clone(), router.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let router = router.clone();
                        async move { router.oneshot(req.map(axum::body::Body::new)).await }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(ConversionWebhook {
            url: format!("https://{}/convert", std::net::SocketAddr::new(address, port)),
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca.cert_pem()),
            task,
        })
    }

    /// The `spec.conversion` of a CRD converted here.
    pub fn conversion(&self) -> Value {
        json!({"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
            "clientConfig": {"url": self.url, "caBundle": self.ca_bundle}}})
    }
}

/// Whether the sandbox converts `crd`'s versions (several served versions
/// of a group it knows how to convert).
pub fn converts(crd: &Value) -> bool {
    let served = crd["spec"]["versions"].as_array().map(|v| v.iter().filter(|v| v["served"] == true).count()).unwrap_or(0);
    served > 1 && crd["spec"]["group"] == crate::apiserver::conversion::CAPI
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_webhook_is_served_where_the_api_servers_reach_it() {
        let ca = Ca::new("test CA").expect("ca");
        let hook = ConversionWebhook::start(&ca, Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)))).await.expect("start");
        let conversion = hook.conversion();
        assert_eq!(conversion["strategy"], "Webhook");
        let url = conversion["webhook"]["clientConfig"]["url"].as_str().expect("url");
        assert!(url.starts_with("https://127.0.0.9:") && url.ends_with("/convert"), "{url}");
        assert!(!conversion["webhook"]["clientConfig"]["caBundle"].as_str().unwrap_or_default().is_empty());
        let crd = |group: &str, versions: usize| json!({"spec": {"group": group,
            "versions": (0..versions).map(|i| json!({"name": format!("v{i}"), "served": true})).collect::<Vec<_>>()}});
        assert!(converts(&crd("cluster.x-k8s.io", 2)));
        assert!(!converts(&crd("cluster.x-k8s.io", 1)));
        assert!(!converts(&crd("infrastructure.cluster.x-k8s.io", 2)));
    }

    #[test]
    fn a_review_converts_capi_references_and_echoes_the_uid() {
        let request = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "7", "desiredAPIVersion": "cluster.x-k8s.io/v1beta2", "objects": [
                {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "metadata": {"name": "demo"},
                 "spec": {"controlPlaneRef": {"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane", "name": "demo", "namespace": "ns"}}}]}});
        let answer = review(&request);
        assert_eq!(answer["response"]["uid"], "7");
        assert_eq!(answer["response"]["result"]["status"], "Success");
        let obj = &answer["response"]["convertedObjects"][0];
        assert_eq!(obj["apiVersion"], "cluster.x-k8s.io/v1beta2");
        assert_eq!(obj["spec"]["controlPlaneRef"]["apiGroup"], "hypershift.openshift.io");
        assert!(obj["spec"]["controlPlaneRef"].get("apiVersion").is_none(), "{obj}");
    }
}
