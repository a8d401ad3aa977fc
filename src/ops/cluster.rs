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
use crate::kube::{api, get_json, request};

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
    if options.cluster.platform == crate::hosted::render::Platform::Agent {
        let agent_ns = options.cluster.agent_namespace();
        if namespaces.get_opt(&agent_ns).await.map_err(request(format!("reading Namespace {agent_ns}")))?.is_none() {
            return Err(OpsError::Input(format!(
                "--platform agent: the agent namespace `{agent_ns}` does not exist; it holds the hosts' InfraEnv, BareMetalHosts and Agents, which must be there before the cluster (create them, or name their namespace with --agent-namespace)"
            )));
        }
    }
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
    let hc = crate::kube::wait_watching(&hcs, crate::kube::Watched::named(name), &format!("{label} to become Available"), options.wait, Duration::from_secs(1), || async {
        let hc = get_json(&hcs, name, &label).await?;
        Ok(hc.filter(|h| HostedCluster(h.clone()).condition("Available") == Some("True")))
    })
    .await?;
    Ok(hc)
}

/// Pause reconciliation of a cluster and its NodePools until `until`
/// (an RFC3339 deadline: a forgotten pause ends by itself).
pub async fn pause(client: &kube::Client, ns: &str, name: &str, until: &str) -> Result<Vec<String>, OpsError> {
    set_pause(client, ns, name, Some(until)).await
}

/// Lift the pause of a cluster and its NodePools. A fenced cluster is
/// refused: its pause is the fence's, lifted only by `hcp-dr fence --release`.
pub async fn resume(client: &kube::Client, ns: &str, name: &str) -> Result<Vec<String>, OpsError> {
    set_pause(client, ns, name, None).await
}

/// Check the OIDC issuer of an AWS cluster against its service-account
/// key; with `repair`, rewrite the documents when they do not publish it.
/// A cluster on another platform is refused (it has no issuer to check).
pub async fn oidc(client: &kube::Client, ns: &str, name: &str, s3: &crate::store::S3Options, repair: bool) -> Result<crate::hosted::oidc::IssuerReport, OpsError> {
    let label = format!("HostedCluster {ns}/{name}");
    let Some(hc) = get_json(&api(client, &HOSTED_CLUSTER, ns), name, &label).await? else {
        return Err(OpsError::Input(format!("{label} not found: check the name and -n")));
    };
    let hcp_ns = crate::hosted::hcp_namespace(ns, name);
    crate::hosted::oidc::check_issuer(client, &hc, &hcp_ns, s3, repair).await?.ok_or_else(|| {
        OpsError::Input(format!("{label} is on the {} platform: only AWS clusters have an OIDC issuer hcp-dr checks", HostedCluster(hc.clone()).platform()))
    })
}

/// `until` None lifts the pause; a fenced copy keeps a pause in place that
/// lasts longer than `until` (the fence's).
async fn set_pause(client: &kube::Client, ns: &str, name: &str, until: Option<&str>) -> Result<Vec<String>, OpsError> {
    let label = format!("HostedCluster {ns}/{name}");
    let hcs = api(client, &HOSTED_CLUSTER, ns);
    let Some(hc) = get_json(&hcs, name, &label).await? else {
        return Err(OpsError::Input(format!("{label} not found: check the name and -n")));
    };
    let hosted = HostedCluster(hc.clone());
    if until.is_none() {
        hosted.refuse_if_fenced("lift its pause").map_err(OpsError::Input)?;
    }
    // a fenced copy's far pause is never shortened
    let keep_longer = hosted.fenced().is_some();
    let value = |existing: &Value| match until {
        Some(until) if keep_longer => Some(crate::hosted::longest_pause(existing["spec"]["pausedUntil"].as_str(), until)),
        other => other.map(str::to_string),
    };
    Ok(crate::kube::set_cluster_paused_until(client, ns, name, &hc, value).await?)
}

/// Set a NodePool's replicas (it must belong to the cluster).
pub async fn scale(client: &kube::Client, ns: &str, name: &str, pool: &str, replicas: i64) -> Result<(), OpsError> {
    if replicas < 0 {
        return Err(OpsError::Input("--replicas cannot be negative".into()));
    }
    let what = format!("NodePool {ns}/{pool}");
    let pools = api(client, &NODE_POOL, ns);
    let np = get_json(&pools, pool, &what)
        .await?
        .ok_or_else(|| OpsError::Input(format!("{what} not found: kubectl get nodepools -n {ns}")))?;
    if np["spec"]["clusterName"].as_str() != Some(name) {
        return Err(OpsError::Input(format!("{what} belongs to {}, not {name}", np["spec"]["clusterName"].as_str().unwrap_or("?"))));
    }
    if np.pointer("/spec/autoScaling").is_some_and(|a| !a.is_null()) {
        return Err(OpsError::Input(format!("{what} is autoscaled: change spec.autoScaling instead of replicas")));
    }
    crate::kube::merge_patch(&pools, pool, &json!({"spec": {"replicas": replicas}}), &what).await?;
    Ok(())
}

/// What `cluster destroy` was asked.
#[derive(Clone)]
pub struct DestroyOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: String,
    pub name: Option<String>,
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
    pub observer: Option<std::sync::Arc<dyn crate::pipeline::runner::Observer>>,
}

/// What a destroy reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DestroyResult {
    #[serde(flatten)]
    pub run: crate::pipeline::RunReport,
    pub hosted_cluster: String,
    pub torn_down: Option<crate::teardown::TornDown>,
    /// The copy was fenced: where the cluster runs.
    pub fenced_copy_of: Option<String>,
}

pub const DESTROY: &str = "cluster-destroy";

/// `cluster destroy` through the cluster-destroy playbook: journaled, a
/// stopped teardown resumable, `--abort` only before the teardown began.
pub async fn destroy_journaled(
    options: DestroyOptions,
    interrupt: &mut crate::pipeline::Interrupt,
) -> Result<DestroyResult, OpsError> {
    use crate::stages::cluster_destroy::{DestroyContext, DestroyInputs};
    let operation = destroy_operation();
    let playbook = operation.load_playbook(&options.run)?;
    let journal_given = options.run.journal_given().map(std::path::Path::to_path_buf);
    let inputs = match &journal_given {
        Some(journal) => super::journal_inputs::<DestroyInputs>(journal, DESTROY)?.0,
        None => {
            let name = options.name.clone().ok_or_else(|| OpsError::Input("name the cluster to destroy (or --resume/--abort JOURNAL)".into()))?;
            super::backup::check_name("hosted cluster", &name)?;
            super::backup::check_name("namespace", &options.namespace)?;
            DestroyInputs { namespace: options.namespace.clone(), hosted_cluster: name, pause_seconds: 3600, fenced: None }
        }
    };
    let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), journal_given.as_deref()).await?;
    let client = target.client;
    let label = format!("HostedCluster {}/{}", inputs.namespace, inputs.hosted_cluster);
    let mut inputs = inputs;
    if journal_given.is_none() {
        let Some(hc) = get_json(&api(&client, &HOSTED_CLUSTER, &inputs.namespace), &inputs.hosted_cluster, &label).await? else {
            return Err(OpsError::Input(format!("{label} not found: nothing to destroy")));
        };
        inputs.fenced = HostedCluster(hc).fenced().map(str::to_string);
    }
    let mut ctx = DestroyContext { client, inputs: inputs.clone() };
    let journaled = super::Journaled::new(&inputs, vec![target.binding], &[&inputs.namespace, &inputs.hosted_cluster]);
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;
    Ok(DestroyResult {
        hosted_cluster: format!("{}/{}", inputs.namespace, inputs.hosted_cluster),
        torn_down: run.output_of::<crate::stages::cluster_destroy::Teardown>()?,
        fenced_copy_of: inputs.fenced.clone(),
        run,
    })
}

/// The cluster-destroy operation: a failure stops it for `--resume`;
/// `--abort` only lifts the pause, before the teardown began.
pub fn destroy_operation() -> super::Operation<crate::stages::cluster_destroy::DestroyContext> {
    use crate::stages::cluster_destroy::{destroy_catalog};
    super::Operation {
        command: "hcp-dr cluster destroy",
        playbook: DESTROY,
        catalog: destroy_catalog(),
        on_failure: crate::pipeline::OnFailure::Stop,
        resume: Some("finishes it"),
        abort: Some("lifts the pause if the teardown has not begun"),
        no_abort_after: Some(super::run::NoReturn {
            stage: <crate::stages::cluster_destroy::Teardown as crate::pipeline::StageId>::NAME,
            from_start: false,
            why: "the teardown has begun and deleted objects cannot come back",
        }),
        undo_stops_before: None,
    }
}

