//! A local TCP port that forwards to a pod's port through the API server
//! (`pods/portforward`), for when pod IPs are not reachable from where
//! hcp-dr runs. Each accepted connection opens its own forward.

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::KubeError;

/// A running forward; dropping it stops accepting.
pub struct LocalForward {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for LocalForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LocalForward {
    /// Listen on `127.0.0.1:<ephemeral>` and forward to `pod:port`.
    pub async fn start(client: &Client, namespace: &str, pod: &str, port: u16) -> Result<LocalForward, KubeError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| KubeError::Invalid(format!("binding a local port for port-forward: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| KubeError::Invalid(format!("local port-forward address: {e}")))?;
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        // Fail early and clearly if the API server refuses port-forward.
        let mut probe = api
            .portforward(pod, &[port])
            .await
            .map_err(super::request(format!("port-forward to pod {namespace}/{pod}:{port}")))?;
        drop(probe.take_stream(port));
        let pod = pod.to_string();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let api = api.clone();
                let pod = pod.clone();
                tokio::spawn(async move {
                    let Ok(mut forwarder) = api.portforward(&pod, &[port]).await else {
                        tracing::warn!(pod = %pod, port, "port-forward could not be opened");
                        return;
                    };
                    if let Some(mut upstream) = forwarder.take_stream(port) {
                        let _ = tokio::io::copy_bidirectional(&mut socket, &mut upstream).await;
                    }
                    drop(forwarder);
                });
            }
        });
        Ok(LocalForward { addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}
