//! `hcp-dr cluster reconcile -f DESIRED.yaml`: read and check the desired
//! objects, then run the cluster-reconcile playbook (journaled; stops on
//! failure: `--resume` goes on, `--abort` puts back what it changed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::OpsError;
use super::backup::check_name;
use crate::pipeline::runner::Observer;
use crate::pipeline::{Interrupt, OnFailure, RunReport};
use crate::stages::reconcile::{ObjectDiff, ReconcileContext, ReconcileInputs, reconcile_catalog};

pub const RECONCILE: &str = "cluster-reconcile";

#[derive(Clone)]
pub struct ReconcileOptions {
    pub file: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub wait_timeout: Duration,
    pub wait: bool,
    /// Playbook, journal, resume/abort, dry-run.
    pub run: super::RunFlags,
    pub observer: Option<std::sync::Arc<dyn Observer>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReconcileResult {
    #[serde(flatten)]
    pub run: RunReport,
    pub hosted_cluster: String,
    /// Per object: created, patched (with the drifted fields) or unchanged.
    pub objects: Vec<ObjectDiff>,
    /// Whether anything was (or, in a dry-run, would be) changed.
    pub changed: bool,
    pub warnings: Vec<String>,
}

/// Parse the desired file: one HostedCluster, its NodePools, and Secrets,
/// all in one namespace; returned in apply order (Secrets, HostedCluster,
/// NodePools). Everything wrong is said at once.
pub fn desired_objects(text: &str, origin: &str) -> Result<(String, String, Vec<Value>), OpsError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| OpsError::Input(format!("{origin}: not YAML: {e}")))?;
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let mut problems = Vec::new();
    let hcs: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "HostedCluster").collect();
    if hcs.len() != 1 {
        problems.push(format!("it must hold exactly one HostedCluster (found {})", hcs.len()));
    }
    let hc_name = hcs.first().and_then(|h| h["metadata"]["name"].as_str()).unwrap_or_default().to_string();
    let ns = hcs.first().and_then(|h| h["metadata"]["namespace"].as_str()).unwrap_or("clusters").to_string();
    for (i, doc) in docs.iter().enumerate() {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let at = format!("document {} ({kind} {name})", i + 1);
        match (kind, doc["apiVersion"].as_str()) {
            ("HostedCluster" | "NodePool", Some(v)) if v.starts_with("hypershift.openshift.io/") => {}
            ("Secret", Some("v1")) => {}
            _ => problems.push(format!("{at}: only HostedCluster, NodePool (hypershift.openshift.io) and Secret (v1) are reconciled")),
        }
        if let Err(e) = check_name(&format!("{at} name"), name) {
            problems.push(e.to_string());
        }
        if let Some(other) = doc["metadata"]["namespace"].as_str()
            && other != ns
        {
            problems.push(format!("{at}: namespace {other}, but the HostedCluster is in {ns}: everything goes in one namespace"));
        }
        if kind == "NodePool" && doc["spec"]["clusterName"].as_str() != Some(hc_name.as_str()) {
            problems.push(format!(
                "{at}: spec.clusterName is {}, not the HostedCluster {hc_name}",
                doc["spec"]["clusterName"].as_str().unwrap_or("unset")
            ));
        }
        if doc.get("status").is_some_and(|s| !s.is_null()) {
            problems.push(format!("{at}: has a status; the desired file sets spec only (status is the operator's)"));
        }
    }
    if !problems.is_empty() {
        return Err(OpsError::Input(format!("{origin}: {}", problems.join("; "))));
    }
    let rank = |d: &Value| match d["kind"].as_str() {
        Some("Secret") => 0,
        Some("HostedCluster") => 1,
        _ => 2,
    };
    let mut ordered = docs;
    ordered.sort_by_key(rank);
    Ok((ns, hc_name, ordered))
}

fn read_file(path: &Path) -> Result<(String, String), OpsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| OpsError::Input(format!("-f {}: {e}", path.display())))?;
    let sha = crate::store::hex(&Sha256::digest(text.as_bytes()));
    Ok((text, sha))
}

pub async fn reconcile(options: ReconcileOptions, interrupt: &mut Interrupt) -> Result<ReconcileResult, OpsError> {
    let operation = operation();
    let playbook = operation.load_playbook(&options.run)?;
    let journal_given = options.run.journal_given().map(Path::to_path_buf);
    let inputs = match &journal_given {
        Some(journal) => super::journal_inputs::<ReconcileInputs>(journal, RECONCILE)?.0,
        None => {
            let file = options.file.clone().ok_or_else(|| OpsError::Input("-f DESIRED.yaml is required (or --resume/--abort JOURNAL)".into()))?;
            let (_, sha) = read_file(&file)?;
            let mut inputs = ReconcileInputs {
                file,
                file_sha256: sha,
                namespace: String::new(),
                hosted_cluster: String::new(),
                wait_timeout_seconds: options.wait_timeout.as_secs(),
                wait: options.wait,
            };
            let (text, _) = read_file(&inputs.file)?;
            let (ns, name, _) = desired_objects(&text, &inputs.file.display().to_string())?;
            (inputs.namespace, inputs.hosted_cluster) = (ns, name);
            inputs
        }
    };
    if let Some(abort) = &options.run.abort
        && crate::pipeline::Journal::read(abort)?.outcome.is_some()
    {
        return Err(OpsError::Input(format!(
            "--abort {}: that run finished; nothing is left to undo. To go back, reconcile with the earlier desired file (its `objects` in the report list every value that changed)",
            abort.display()
        )));
    }
    let (text, sha) = read_file(&inputs.file)?;
    if sha != inputs.file_sha256 {
        return Err(OpsError::Input(format!(
            "{} changed since the run began (SHA-256 {sha}, was {}): resume needs the same desired file; start a new run instead",
            inputs.file.display(),
            inputs.file_sha256
        )));
    }
    let (_, _, desired) = desired_objects(&text, &inputs.file.display().to_string())?;
    let target = super::reach_for("management", options.kubeconfig.as_deref(), options.context.as_deref(), journal_given.as_deref()).await?;
    let mut ctx = ReconcileContext { client: target.client, inputs: inputs.clone(), desired, diff: None, warnings: Vec::new() };
    let journaled = super::Journaled::new(&inputs, vec![target.binding], &[&inputs.namespace, &inputs.hosted_cluster]);
    let run = super::execute(&operation, &playbook, &mut ctx, &options.run, journaled, options.observer.as_deref(), interrupt).await?;
    let objects: Vec<ObjectDiff> = ctx.diff.clone().unwrap_or_default();
    let changed = objects.iter().any(|o| o.action != crate::stages::reconcile::Action::Unchanged);
    Ok(ReconcileResult {
        hosted_cluster: format!("{}/{}", inputs.namespace, inputs.hosted_cluster),
        objects,
        changed,
        warnings: ctx.warnings.clone(),
        run,
    })
}

/// The cluster-reconcile operation: a failure stops it, for `--resume` or
/// `--abort`.
pub fn operation() -> super::Operation<ReconcileContext> {
    super::Operation {
        command: "hcp-dr cluster reconcile",
        playbook: RECONCILE,
        catalog: reconcile_catalog(),
        on_failure: OnFailure::Stop,
        resume: Some("goes on"),
        abort: Some("undoes what it changed"),
        no_abort_after: None,
        undo_stops_before: None,
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: v1\nkind: Secret\nmetadata: {name: demo-pull-secret, namespace: clusters}\nstringData: {.dockerconfigjson: '{}'}\n---\napiVersion: hypershift.openshift.io/v1beta1\nkind: NodePool\nmetadata: {name: demo-workers, namespace: clusters}\nspec: {clusterName: demo, replicas: 2}\n---\napiVersion: hypershift.openshift.io/v1beta1\nkind: HostedCluster\nmetadata: {name: demo, namespace: clusters}\nspec: {release: {image: img}}\n";

    #[test]
    fn objects_come_in_apply_order() {
        let (ns, name, objects) = desired_objects(GOOD, "f").unwrap();
        assert_eq!((ns.as_str(), name.as_str()), ("clusters", "demo"));
        let kinds: Vec<_> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, vec!["Secret", "HostedCluster", "NodePool"]);
    }

    #[test]
    fn every_problem_is_named() {
        let bad = GOOD.replace("clusterName: demo", "clusterName: other").replace("kind: Secret", "kind: ConfigMap");
        let err = desired_objects(&bad, "f").unwrap_err().to_string();
        assert!(err.contains("spec.clusterName is other") && err.contains("only HostedCluster, NodePool"), "{err}");
        let two = format!("{GOOD}---\napiVersion: hypershift.openshift.io/v1beta1\nkind: HostedCluster\nmetadata: {{name: b, namespace: clusters}}\n");
        assert!(desired_objects(&two, "f").unwrap_err().to_string().contains("exactly one HostedCluster"));
    }
}
