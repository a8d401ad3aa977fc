//! `pods/portforward` end to end: kube-rs' `Api::<Pod>::portforward` through
//! the emulator to a TCP echo server listening on the pod's IP (a loopback
//! address other than 127.0.0.1, so the pod IP is really used).

use crate::apiserver_support;

use apiserver_support::{raw_json, start};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POD_IP: &str = "127.0.0.2";

/// A TCP echo server on `POD_IP`, ephemeral port.
async fn echo_server() -> u16 {
    let listener = tokio::net::TcpListener::bind((POD_IP, 0))
        .await
        .expect("bind echo server on the pod IP");
    let port = listener.local_addr().expect("echo addr").port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = sock.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

async fn pod_with_ip(client: &kube::Client, ns: &str, name: &str, ip: Option<&str>) {
    let nss: Api<Namespace> = Api::all(client.clone());
    if nss.get_opt(ns).await.expect("get namespace").is_none() {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns"),
        )
        .await
        .expect("namespace created");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "etcd", "image": "quay.io/example/etcd:latest"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    if let Some(ip) = ip {
        let (code, body) = raw_json(
            client,
            "PATCH",
            &format!("/api/v1/namespaces/{ns}/pods/{name}/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}),
        )
        .await;
        assert_eq!(code, 200, "{body}");
    }
}

#[tokio::test]
async fn kube_rs_portforward_reaches_the_pod_ip() {
    let env = start(vec![]).await;
    let echo = echo_server().await;
    pod_with_ip(&env.client, "clusters-demo", "etcd-0", Some(POD_IP)).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "clusters-demo");

    let mut pf = pods
        .portforward("etcd-0", &[echo])
        .await
        .expect("portforward upgrade");
    let mut stream = pf.take_stream(echo).expect("stream for the port");
    for round in 0..3 {
        let msg = format!("hello through the tunnel #{round}");
        stream.write_all(msg.as_bytes()).await.expect("write");
        let mut buf = vec![0u8; msg.len()];
        stream.read_exact(&mut buf).await.expect("read echo");
        assert_eq!(String::from_utf8_lossy(&buf), msg);
    }
    drop(stream);
    pf.abort();
}

#[tokio::test]
async fn refused_ports_report_on_the_error_channel() {
    let env = start(vec![]).await;
    // A port nothing listens on at the pod IP.
    let closed = {
        let l = tokio::net::TcpListener::bind((POD_IP, 0))
            .await
            .expect("bind");
        l.local_addr().expect("addr").port()
    };
    pod_with_ip(&env.client, "clusters-demo", "etcd-1", Some(POD_IP)).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "clusters-demo");
    let mut pf = pods
        .portforward("etcd-1", &[closed])
        .await
        .expect("portforward upgrade");
    let error = pf.take_error(closed).expect("error future").await;
    let text = error.expect("an error message for the refused port");
    assert!(
        text.contains(&format!("error forwarding port {closed}")),
        "{text}"
    );
    pf.abort();
}

#[tokio::test]
async fn a_pod_without_an_ip_is_a_bad_request() {
    let env = start(vec![]).await;
    pod_with_ip(&env.client, "clusters-demo", "pending", None).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "clusters-demo");
    let Err(err) = pods.portforward("pending", &[2379]).await else {
        panic!("portforward to a pod without an IP must fail");
    };
    let text = err.to_string();
    eprintln!("portforward error: {text}");
    assert!(text.contains("400"), "{text}");
}
