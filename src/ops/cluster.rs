//! `hcp-dr cluster create`: a new hosted cluster's objects, rendered or
//! applied (then waited for until Available).

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::OpsError;
use crate::hosted::render::{NewCluster, objects};
use crate::hosted::{HOSTED_CLUSTER, HostedCluster, NODE_POOL};
use crate::kube::{api, get_json, request, wait_for};

/// What `cluster create` was asked.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub cluster: NewCluster,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub wait: Duration,
}

/// The objects as `hcp create cluster --render` prints them.
pub fn render(cluster: &NewCluster) -> Result<Vec<Value>, OpsError> {
    objects(cluster).map_err(OpsError::Input)
}

/// Create the objects (refusing a name in use) and wait until Available;
/// returns the HostedCluster.
pub async fn create(options: &CreateOptions) -> Result<Value, OpsError> {
    let objects = render(&options.cluster)?;
    let (ns, name) = (&options.cluster.namespace, &options.cluster.name);
    let label = format!("HostedCluster {ns}/{name}");
    let client = crate::kube::client(options.kubeconfig.as_deref(), options.context.as_deref()).await?;
    let hcs = api(&client, &HOSTED_CLUSTER, ns);
    if get_json(&hcs, name, &label).await?.is_some() {
        return Err(OpsError::Input(format!("{label} already exists: choose another --name, or `hcp-dr cluster destroy` it first")));
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(ns).await.map_err(request(format!("reading Namespace {ns}")))?.is_none() {
        let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).map_err(|e| OpsError::Input(e.to_string()))?;
        namespaces.create(&PostParams::default(), &body).await.map_err(request(format!("creating Namespace {ns}")))?;
    }
    for obj in &objects {
        let what = format!("{} {ns}/{}", obj["kind"].as_str().unwrap_or("?"), obj["metadata"]["name"].as_str().unwrap_or("?"));
        match obj["kind"].as_str() {
            Some("Secret") => {
                let secret: Secret = serde_json::from_value(obj.clone()).map_err(|e| OpsError::Input(e.to_string()))?;
                Api::<Secret>::namespaced(client.clone(), ns)
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(request(format!("creating {what}")))?;
            }
            Some(kind) => {
                let gvk = if kind == "NodePool" { &NODE_POOL } else { &HOSTED_CLUSTER };
                let body: DynamicObject = serde_json::from_value(obj.clone()).map_err(|e| OpsError::Input(e.to_string()))?;
                api(&client, gvk, ns).create(&PostParams::default(), &body).await.map_err(request(format!("creating {what}")))?;
            }
            None => {}
        }
        tracing::info!(object = %what, "created");
    }
    let hc = wait_for(&format!("{label} to become Available"), options.wait, Duration::from_secs(1), || async {
        let hc = get_json(&hcs, name, &label).await?;
        Ok(hc.filter(|h| HostedCluster(h.clone()).condition("Available") == Some("True")))
    })
    .await?;
    Ok(hc)
}
