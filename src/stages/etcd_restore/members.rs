//! `restore-members`: the point of no return. The other members' volume
//! claims are deleted (their data, damaged or not, goes with them) and
//! created again, empty, from the StatefulSet's claim template, as the
//! StatefulSet would; member 0 keeps its volume. Then, one member at a time,
//! a short-lived pod running the etcd image mounts the member's volume,
//! downloads the snapshot from a presigned URL (handed over in a Secret,
//! never in the pod spec), checks its SHA-256 and runs `etcdutl snapshot
//! restore` with the member's `--name` and `--initial-advertise-peer-urls`,
//! the StatefulSet's `--initial-cluster` and token, `--bump-revision` and
//! `--mark-compacted`, then puts the restored `member/` in place of the old.
//!
//! Journaled before each change; a rerun (`--resume`) skips claims already
//! replaced and restores every member again (the pod's script is
//! idempotent). Not undoable: the old data is gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::EtcdRestoreContext;
use super::assess::{Assess, PlannedMember, RestorePlan};
use super::fetch::{CheckedSnapshot, FetchSnapshot};
use super::stop::StopEtcd;
use crate::kube::request;
use crate::stages::etcd_ops::replace::delete_exact;
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;

pub struct RestoreMembers;

/// The Secret holding the presigned URL while the restore pods run.
pub const URL_SECRET: &str = "hcp-dr-etcd-restore";
/// Label of the restore pods.
pub const POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "hcp-dr-etcd-restore");
/// The contract between hcp-dr and the restore pod (its script's version).
pub const SCRIPT_ANNOTATION: (&str, &str) = ("hcp-dr.openshift.io/restore-script", "v1");

/// What the restore pod runs in the etcd image. Restores next to the data
/// directory, then swaps: a failure part-way leaves the old data or none,
/// never a mix, and a rerun starts over.
pub const SCRIPT: &str = r#"set -euo pipefail
data="$RESTORE_DATA_DIR"
work="$(dirname "$data")/hcp-dr-restore"
rm -rf "$work"
mkdir -p "$work"
curl --fail --silent --show-error --location --retry 3 --output "$work/snapshot.db" "$RESTORE_SNAPSHOT_URL"
echo "$RESTORE_SNAPSHOT_SHA256  $work/snapshot.db" | sha256sum --check --status || { echo "the downloaded snapshot does not have SHA-256 $RESTORE_SNAPSHOT_SHA256" >&2; exit 1; }
etcdutl snapshot restore "$work/snapshot.db" --data-dir "$work/data" \
  --name "$RESTORE_NAME" \
  --initial-cluster "$RESTORE_INITIAL_CLUSTER" \
  --initial-cluster-token "$RESTORE_INITIAL_CLUSTER_TOKEN" \
  --initial-advertise-peer-urls "$RESTORE_PEER_URL" \
  --bump-revision "$RESTORE_BUMP_REVISION" --mark-compacted
rm -rf "$data"
mv "$work/data" "$data"
rm -rf "$work"
echo "restored $RESTORE_NAME"
"#;

/// Progress and output (journaled).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    /// The staging key of the snapshot copy, when one was made.
    pub staged_key: Option<String>,
    /// Volume claims created afresh: name to new uid.
    pub recreated: BTreeMap<String, String>,
    /// Members restored, with the seconds their pod took.
    pub members: BTreeMap<String, f64>,
}

/// The restore pod of `member` (pure, for tests).
pub fn restore_pod(plan: &RestorePlan, member: &PlannedMember, namespace: &str, sha256: &str, bump: u64, deadline: Duration) -> Value {
    let env = |name: &str, value: &str| json!({"name": name, "value": value});
    let mut spec = plan.scheduling.as_object().cloned().unwrap_or_default();
    spec.insert("restartPolicy".into(), json!("Never"));
    // the script never calls the API: no service-account token mounted
    spec.insert("automountServiceAccountToken".into(), json!(false));
    spec.insert("activeDeadlineSeconds".into(), json!(deadline.as_secs().max(60)));
    spec.insert(
        "containers".into(),
        json!([{
            "name": "restore",
            "image": plan.image,
            "command": ["/bin/bash", "-c", SCRIPT],
            "env": [
                {"name": "RESTORE_SNAPSHOT_URL", "valueFrom": {"secretKeyRef": {"name": URL_SECRET, "key": "url"}}},
                env("RESTORE_SNAPSHOT_SHA256", sha256),
                env("RESTORE_NAME", &member.name),
                env("RESTORE_INITIAL_CLUSTER", &plan.initial_cluster),
                env("RESTORE_INITIAL_CLUSTER_TOKEN", &plan.initial_cluster_token),
                env("RESTORE_PEER_URL", &member.peer_url),
                env("RESTORE_DATA_DIR", &plan.data_dir),
                env("RESTORE_BUMP_REVISION", &bump.to_string()),
            ],
            "volumeMounts": [{"name": "data", "mountPath": plan.mount_path}],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            // nothing it does needs a privilege (PodSecurity `restricted`)
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
        }]),
    );
    spec.insert("volumes".into(), json!([{"name": "data", "persistentVolumeClaim": {"claimName": member.pvc}}]));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(&member.name),
            "namespace": namespace,
            "labels": {POD_LABEL.0: POD_LABEL.1, "app.kubernetes.io/managed-by": "hcp-dr", "hcp-dr.openshift.io/member": member.name},
            "annotations": {SCRIPT_ANNOTATION.0: SCRIPT_ANNOTATION.1},
        },
        "spec": spec,
    })
}

/// A fresh claim for `member`, as the StatefulSet creates it from its template.
pub fn fresh_claim(plan: &RestorePlan, member: &PlannedMember, namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": member.pvc, "namespace": namespace, "labels": plan.selector_labels},
        "spec": plan.claim_template["spec"],
    })
}

/// Replace `member`'s claim with a fresh one (unless done before); its uid.
async fn replace_claim(ctx: &EtcdRestoreContext, plan: &RestorePlan, member: &PlannedMember, done: &Restored) -> Result<String, StageFailure> {
    let ns = ctx.hcp_namespace();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.cluster.client.clone(), &ns);
    let what = format!("PersistentVolumeClaim {ns}/{}", member.pvc);
    let current = api.get_opt(&member.pvc).await.map_err(request(format!("reading {what}")))?;
    let current_uid = current.as_ref().and_then(|c| c.metadata.uid.clone());
    if let (Some(uid), Some(new)) = (&current_uid, done.recreated.get(&member.pvc))
        && uid == new
    {
        return Ok(uid.clone());
    }
    if let Some(uid) = &current_uid {
        delete_exact(&api, "PersistentVolumeClaim", &member.pvc, uid).await?;
        crate::teardown::wait_gone(&api, &member.pvc, &what, ctx.cluster.inputs.wait_timeout()).await?;
    }
    let claim: PersistentVolumeClaim = serde_json::from_value(fresh_claim(plan, member, &ns))?;
    let created = api.create(&PostParams::default(), &claim).await.map_err(request(format!("creating {what}")))?;
    created
        .metadata
        .uid
        .ok_or_else(|| StageError::Precondition(format!("{what} was created without a uid")).into())
}

/// The name of `member`'s restore pod.
pub fn pod_name(member: &str) -> String {
    format!("hcp-dr-etcd-restore-{member}")
}

/// How a restore pod ended: `Some(Ok)` succeeded, `Some(Err(why))` failed,
/// `None` still going (pure, for tests).
pub fn pod_outcome(pod: &Pod, ns: &str) -> Option<Result<(), String>> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let what = format!("restore pod {ns}/{name}");
    let status = pod.status.clone().unwrap_or_default();
    let terminated = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find_map(|c| c.state.and_then(|s| s.terminated));
    match status.phase.as_deref() {
        Some("Succeeded") => Some(Ok(())),
        Some("Failed") => Some(Err(format!(
            "{what} failed ({}): {}",
            terminated
                .as_ref()
                .map(|t| format!("exit code {}{}", t.exit_code, t.reason.as_ref().map(|r| format!(", {r}")).unwrap_or_default()))
                .or(status.reason.clone())
                .unwrap_or_else(|| "no reason given".into()),
            terminated
                .and_then(|t| t.message)
                .or(status.message)
                .map(|m| m.trim().to_string())
                .unwrap_or_else(|| format!("see kubectl -n {ns} describe pod {name}"))
        ))),
        _ => None,
    }
}

/// Run the restore pod of `member` to completion; the seconds it took.
async fn run_pod(ctx: &EtcdRestoreContext, plan: &RestorePlan, member: &PlannedMember, sha256: &str, bump: u64) -> Result<f64, StageFailure> {
    let ns = ctx.hcp_namespace();
    let timeout = ctx.cluster.inputs.wait_timeout();
    let api: Api<Pod> = Api::namespaced(ctx.cluster.client.clone(), &ns);
    let pod: Pod = serde_json::from_value(restore_pod(plan, member, &ns, sha256, bump, timeout))?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let what = format!("restore pod {ns}/{name}");
    // A pod left by an earlier try: start over.
    crate::teardown::delete_and_wait(&api, &name, &what, timeout).await?;
    let started = Instant::now();
    api.create(&PostParams::default(), &pod).await.map_err(request(format!("creating {what}")))?;
    let outcome = crate::kube::wait_watching(&api, crate::kube::Watched::named(&name), &format!("{what} to finish"), timeout, Duration::from_millis(500), || async {
        let pod = api.get(&name).await.map_err(request(format!("reading {what}")))?;
        Ok(pod_outcome(&pod, &ns))
    })
    .await?;
    outcome.map_err(|message| StageError::Precondition(format!("{message}; fix the cause and resume (hcp-dr etcd restore --resume JOURNAL)")))?;
    let seconds = started.elapsed().as_secs_f64();
    crate::teardown::delete_and_wait(&api, &name, &what, timeout).await?;
    Ok(seconds)
}

/// Presign the snapshot (copying it to the staging store first when its own
/// store cannot presign). Returns the staging key when a copy was made.
async fn presign(ctx: &mut EtcdRestoreContext, snapshot: &CheckedSnapshot, done: &mut Restored, step: &mut Step<'_>) -> Result<(), StageFailure> {
    let ttl = Duration::from_secs(ctx.inputs.presign_ttl_seconds);
    // An encrypted or compressed snapshot is never presigned: the pods get a decoded copy.
    if !snapshot.decoded()
        && let Some(url) = ctx.snapshot_store().presign_get(&snapshot.key, ttl).await?
    {
        ctx.url = Some(url);
        return Ok(());
    }
    if ctx.staging.is_none() {
        return Err(StageError::Precondition(format!(
            "{} cannot presign a URL for the restore pods to download from: pass --stage-snapshot-to s3://bucket/prefix (the copy is deleted when the members are restored)",
            ctx.snapshot_store().url()
        ))
        .into());
    }
    let key = format!(
        "hcp-dr-staging/etcd-restore/{}/{}/{}.db",
        ctx.cluster.inputs.namespace, ctx.cluster.inputs.hosted_cluster, snapshot.sha256
    );
    done.staged_key = Some(key.clone());
    step.record(serde_json::to_value(&*done)?)?;
    if ctx.local_copy.is_none() {
        // A resumed run: fetch (and decrypt) it again, checked against the verified hash.
        ctx.local_copy = Some(super::fetch::local_plaintext(ctx, snapshot).await?);
    }
    let path = ctx.local_copy.as_ref().ok_or(StageError::Missing("the local copy"))?;
    let meter = crate::pipeline::Meter::new();
    meter.expect(snapshot.size);
    step.show(&meter);
    let body: crate::store::Body<'static> = Box::new(
        meter.reader(
            tokio::fs::File::open(path)
                .await
                .map_err(|e| StageError::Precondition(format!("reading the local copy {}: {e}", path.display())))?,
        ),
    );
    let staging = ctx.staging.as_ref().ok_or(StageError::Missing("the staging store"))?;
    let put = staging.put(&key, body).await?;
    if put.sha256 != snapshot.sha256 || put.size != snapshot.size {
        staging.delete(&key).await?;
        return Err(StageError::Precondition(format!(
            "the copy staged at {}/{key} is {} bytes with SHA-256 {}, not the verified {} bytes with {}: {} changed since it was verified; run the restore again",
            staging.url(),
            put.size,
            put.sha256,
            snapshot.size,
            snapshot.sha256,
            snapshot.source
        ))
        .into());
    }
    ctx.url = staging.presign_get(&key, ttl).await?;
    if ctx.url.is_none() {
        return Err(StageError::Precondition(format!("--stage-snapshot-to {} cannot presign URLs: use an s3:// store", staging.url())).into());
    }
    Ok(())
}

/// Hand the URL to the pods in a Secret (replaced if left over).
async fn put_url_secret(ctx: &EtcdRestoreContext) -> Result<(), StageFailure> {
    let url = ctx.url.clone().ok_or(StageError::Missing("the presigned URL"))?;
    write_url_secret(&ctx.cluster.client, &ctx.hcp_namespace(), &url, ctx.cluster.inputs.wait_timeout()).await
}

/// The Secret [`URL_SECRET`] in `ns` holding `url` (replacing one left over).
pub async fn write_url_secret(client: &kube::Client, ns: &str, url: &str, timeout: Duration) -> Result<(), StageFailure> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let what = format!("Secret {ns}/{URL_SECRET}");
    crate::teardown::delete_and_wait(&api, URL_SECRET, &what, timeout).await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": URL_SECRET, "namespace": ns, "labels": {POD_LABEL.0: POD_LABEL.1, "app.kubernetes.io/managed-by": "hcp-dr"}},
        "type": "Opaque",
        "stringData": {"url": url},
    }))?;
    api.create(&PostParams::default(), &secret).await.map_err(request(format!("creating {what}")))?;
    Ok(())
}

/// Delete the Secret [`URL_SECRET`] of `ns` (a missing one is fine).
pub async fn remove_url_secret(client: &kube::Client, ns: &str, timeout: Duration) -> Result<(), StageFailure> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    crate::teardown::delete_and_wait(&api, URL_SECRET, &format!("Secret {ns}/{URL_SECRET}"), timeout).await?;
    Ok(())
}

/// Remove the Secret and the staged copy (also after a failure).
async fn clean_up(ctx: &EtcdRestoreContext, done: &Restored) -> Result<(), StageFailure> {
    remove_url_secret(&ctx.cluster.client, &ctx.hcp_namespace(), ctx.cluster.inputs.wait_timeout()).await?;
    if let (Some(key), Some(staging)) = (&done.staged_key, &ctx.staging) {
        staging.delete(key).await?;
    }
    Ok(())
}

impl StageId for RestoreMembers {
    const NAME: &'static str = "restore-members";
    type Output = Restored;
}

#[async_trait]
impl Stage<EtcdRestoreContext> for RestoreMembers {
    fn summary(&self) -> &'static str {
        "replace the other members' volume claims with fresh ones, then restore the snapshot into every member's volume through a short-lived pod with the etcd image (not undoable)"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &EtcdRestoreContext, step: &Step<'_>) -> Vec<String> {
        let ns = ctx.hcp_namespace();
        let Some(plan) = step.output_of::<Assess>().ok().flatten() else { return vec!["(cannot plan: assess did not run)".into()] };
        let mut lines = Vec::new();
        let fetched = step.output_of::<FetchSnapshot>().ok().flatten();
        let decrypted = fetched.as_ref().is_some_and(|s| s.decrypted);
        if ctx.snapshot_store().url().starts_with("s3://") && !fetched.as_ref().is_some_and(|s| s.decoded()) {
            lines.push(format!("presign the snapshot for {}s", ctx.inputs.presign_ttl_seconds));
        } else {
            lines.push(format!(
                "copy the snapshot{} to {} and presign it for {}s (deleted when done)",
                match (decrypted, fetched.as_ref().is_some_and(|s| s.decompressed)) {
                    (true, _) => " (decrypted)",
                    (false, true) => " (decompressed)",
                    _ => "",
                },
                ctx.inputs.stage_snapshot_to.as_deref().unwrap_or("(--stage-snapshot-to, required)"),
                ctx.inputs.presign_ttl_seconds
            ));
        }
        for member in plan.members.iter().skip(1) {
            lines.push(format!("delete PersistentVolumeClaim {ns}/{} (member {}'s data) and create it again, empty", member.pvc, member.name));
        }
        let bump = ctx.inputs.bump_revision.map(|b| b.to_string()).unwrap_or_else(|| "(measured by stop-etcd)".into());
        for member in &plan.members {
            lines.push(format!(
                "run pod hcp-dr-etcd-restore-{} ({}) on {}: etcdutl snapshot restore --name {} --initial-cluster {} --initial-advertise-peer-urls {} --bump-revision {bump} --mark-compacted",
                member.name, plan.image, member.pvc, member.name, plan.initial_cluster, member.peer_url
            ));
        }
        lines
    }
    async fn run(&self, ctx: &mut EtcdRestoreContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let plan = step.needs::<Assess>()?;
        let stopped = step.needs::<StopEtcd>()?;
        let snapshot = step.needs::<FetchSnapshot>()?;
        let mut done = step.earlier_progress::<Restored>().unwrap_or_default();
        // Journaled first: from here on the run is past the point of no return.
        step.record(serde_json::to_value(&done)?)?;
        presign(ctx, &snapshot, &mut done, step).await?;
        let result = async {
            put_url_secret(ctx).await?;
            for member in plan.members.iter().skip(1) {
                let uid = replace_claim(ctx, &plan, member, &done).await?;
                done.recreated.insert(member.pvc.clone(), uid);
                step.record(serde_json::to_value(&done)?)?;
            }
            for member in &plan.members {
                let seconds = run_pod(ctx, &plan, member, &snapshot.sha256, stopped.bump).await?;
                tracing::info!(member = %member.name, seconds, "member restored");
                done.members.insert(member.name.clone(), seconds);
                step.record(serde_json::to_value(&done)?)?;
            }
            Ok::<(), StageFailure>(())
        }
        .await;
        let cleaned = clean_up(ctx, &done).await;
        result?;
        cleaned?;
        Ok(done)
    }
    fn restore(&self, _ctx: &mut EtcdRestoreContext, output: Self::Output) -> Result<(), StageFailure> {
        drop(output);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::etcd_restore::assess::read_statefulset;

    fn plan() -> RestorePlan {
        let sts = json!({"spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "etcd"}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Gi"}}}}],
            "template": {"spec": {
                "tolerations": [{"key": "hypershift.openshift.io/control-plane", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
                "containers": [{"name": "etcd", "image": "quay.io/etcd:v3.5",
                    "env": [{"name": "ETCD_DATA_DIR", "value": "/var/lib/data"},
                        {"name": "ETCD_INITIAL_CLUSTER", "value": "etcd-0=https://etcd-0.etcd-discovery.$(NAMESPACE).svc:2380,etcd-1=https://etcd-1.etcd-discovery.$(NAMESPACE).svc:2380,etcd-2=https://etcd-2.etcd-discovery.$(NAMESPACE).svc:2380"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib"}]}]}}}});
        read_statefulset(&sts, "clusters-demo").unwrap()
    }

    #[test]
    fn the_restore_pod_mounts_the_member_volume_and_passes_the_flags() {
        let plan = plan();
        let pod = restore_pod(&plan, &plan.members[1], "clusters-demo", "abc", 1500, Duration::from_secs(600));
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], "quay.io/etcd:v3.5");
        let env: BTreeMap<&str, &Value> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e.get("value").unwrap_or(&e["valueFrom"])))
            .collect();
        assert_eq!(env["RESTORE_NAME"], "etcd-1");
        assert_eq!(env["RESTORE_PEER_URL"], "https://etcd-1.etcd-discovery.clusters-demo.svc:2380");
        assert_eq!(env["RESTORE_BUMP_REVISION"], "1500");
        assert_eq!(env["RESTORE_SNAPSHOT_URL"]["secretKeyRef"]["name"], URL_SECRET);
        assert_eq!(pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], "data-etcd-1");
        assert_eq!(container["volumeMounts"][0]["mountPath"], "/var/lib");
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        assert_eq!(pod["spec"]["tolerations"][0]["key"], "hypershift.openshift.io/control-plane");
        // The URL is never in the spec.
        assert!(!pod.to_string().contains("X-Amz-Signature"));
        let script = container["command"][2].as_str().unwrap();
        for flag in ["--name", "--initial-cluster ", "--initial-advertise-peer-urls", "--bump-revision", "--mark-compacted", "sha256sum --check"] {
            assert!(script.contains(flag), "{flag} missing from the script");
        }
        // It parses as a Pod.
        let _: Pod = serde_json::from_value(pod).unwrap();
    }

    #[test]
    fn a_fresh_claim_follows_the_template() {
        let plan = plan();
        let claim = fresh_claim(&plan, &plan.members[2], "clusters-demo");
        assert_eq!(claim["metadata"]["name"], "data-etcd-2");
        assert_eq!(claim["metadata"]["labels"]["app"], "etcd");
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "8Gi");
        let _: PersistentVolumeClaim = serde_json::from_value(claim).unwrap();
    }
}
