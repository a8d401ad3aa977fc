//! Reaching a hosted cluster's etcd members from outside the cluster: the
//! client TLS material (command-line files or the HCP namespace's secrets)
//! and the connection path (pod IP or a port-forward through the API
//! server). Shared by every operation that talks to etcd.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::Api;

use super::StageError;
use super::context::{EtcdAccess, EtcdTlsMaterial, MemberTarget, TlsOverride};
use crate::etcd::Member;
use crate::hosted;
use crate::kube::portforward::LocalForward;
use crate::kube::request;
use crate::pipeline::StageFailure;

fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
}

/// Find the etcd client TLS: command-line overrides first, then the current
/// HyperShift names (Secret `etcd-client-tls` with `etcd-client.crt/.key`,
/// ConfigMap `etcd-ca` with `ca.crt`), then older ones (`tls.crt/tls.key`,
/// CA in the secret as `etcd-client-ca.crt` or `ca.crt`).
pub async fn discover_tls(
    client: &Client,
    hcp_ns: &str,
    o: &TlsOverride,
) -> Result<EtcdTlsMaterial, StageFailure> {
    if let (Some(ca), Some(cert), Some(key)) = (&o.ca_pem, &o.cert_pem, &o.key_pem) {
        return Ok(EtcdTlsMaterial {
            ca_pem: ca.clone(),
            cert_pem: cert.clone(),
            key_pem: key.clone(),
            source: "command-line files".into(),
        });
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), hcp_ns);
    let secret = secrets
        .get_opt("etcd-client-tls")
        .await
        .map_err(request(format!("reading Secret {hcp_ns}/etcd-client-tls")))?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), hcp_ns);
    let ca_cm = cms
        .get_opt("etcd-ca")
        .await
        .map_err(request(format!("reading ConfigMap {hcp_ns}/etcd-ca")))?;
    let mut source = Vec::new();
    let (mut cert, mut key, mut ca) = (o.cert_pem.clone(), o.key_pem.clone(), o.ca_pem.clone());
    if let Some(secret) = &secret {
        for (c, k) in [("etcd-client.crt", "etcd-client.key"), ("tls.crt", "tls.key")] {
            if cert.is_none() && key.is_none() {
                if let (Some(c_val), Some(k_val)) = (secret_value(secret, c), secret_value(secret, k)) {
                    cert = Some(c_val);
                    key = Some(k_val);
                    source.push(format!("Secret {hcp_ns}/etcd-client-tls ({c}, {k})"));
                }
            }
        }
        if ca.is_none() {
            for k in ["etcd-client-ca.crt", "ca.crt"] {
                if let Some(v) = secret_value(secret, k) {
                    ca = Some(v);
                    source.push(format!("Secret {hcp_ns}/etcd-client-tls ({k})"));
                    break;
                }
            }
        }
    }
    if ca.is_none() {
        if let Some(v) = ca_cm.as_ref().and_then(|c| c.data.as_ref()).and_then(|d| d.get("ca.crt")) {
            ca = Some(v.clone());
            source.push(format!("ConfigMap {hcp_ns}/etcd-ca (ca.crt)"));
        }
    }
    match (ca, cert, key) {
        (Some(ca_pem), Some(cert_pem), Some(key_pem)) => Ok(EtcdTlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
            source: source.join(", "),
        }),
        (ca, cert, _) => Err(StageError::Precondition(format!(
            "no etcd client TLS material in {hcp_ns}: looked for Secret etcd-client-tls (etcd-client.crt + etcd-client.key, or tls.crt + tls.key){} and a CA in ConfigMap etcd-ca (ca.crt) or that Secret (etcd-client-ca.crt){}; pass --etcd-ca, --etcd-cert and --etcd-key to use files instead",
            if cert.is_none() { " [missing]" } else { "" },
            if ca.is_none() { " [missing]" } else { "" },
        ))
        .into()),
    }
}

/// How to reach one member of `hcp_ns` under `access`; the forward (if any)
/// must be kept alive while the member is used.
pub async fn connect_member(
    client: &Client,
    hcp_ns: &str,
    access: EtcdAccess,
    tls: &EtcdTlsMaterial,
    target: &MemberTarget,
) -> Result<(Member, Option<LocalForward>), StageFailure> {
    let client_tls = Some(tls.for_member(&target.pod, hcp_ns));
    let direct = format!("{}:{}", target.pod_ip, hosted::ETCD_CLIENT_PORT);
    let use_pod_ip = match access {
        EtcdAccess::PodIp => true,
        EtcdAccess::PortForward => false,
        EtcdAccess::Auto => matches!(
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(&direct)).await,
            Ok(Ok(_))
        ),
    };
    if use_pod_ip {
        return Ok((
            Member {
                name: target.pod.clone(),
                url: format!("https://{direct}"),
                tls: client_tls,
            },
            None,
        ));
    }
    let forward = LocalForward::start(client, hcp_ns, &target.pod, hosted::ETCD_CLIENT_PORT).await?;
    Ok((
        Member {
            name: target.pod.clone(),
            url: format!("https://{}", forward.local_addr()),
            tls: client_tls,
        },
        Some(forward),
    ))
}
