//! kube-controller-manager's Job controller, for the Jobs hcp-dr runs (one
//! pod at a time: `parallelism` and `completions` 1).
//!
//! A Job gets a pod `<job>-<5 random characters>` from its template (its
//! labels include the `batch.kubernetes.io/job-name`, `job-name`,
//! `batch.kubernetes.io/controller-uid` and `controller-uid` the API server
//! put there), owned by the Job (`controller` and `blockOwnerDeletion`
//! true) and holding the finalizer `batch.kubernetes.io/job-tracking` until
//! it is counted. Its status goes through the status subresource, as
//! upstream's: `startTime`, `active`, `ready`, `terminating`, `succeeded`,
//! `failed`, `uncountedTerminatedPods` while pods are being counted, and
//! the conditions: a succeeded pod → `SuccessCriteriaMet` then `Complete`
//! (with `completionTime`); a failed pod → a new one while `failed` ≤
//! `spec.backoffLimit`, else `FailureTarget` then `Failed`, reason
//! `BackoffLimitExceeded`; `spec.activeDeadlineSeconds` passed → the active
//! pod deleted, `FailureTarget` then `Failed`, reason `DeadlineExceeded`.
//! A pod deleted before it ended counts as failed. A deleted Job's pods are
//! removed by the API server's garbage collector (the Job owns them), or
//! orphaned, as `batch/v1`'s default propagation says.
//!
//! Sandbox differences: no back-off delay before a failed pod is replaced
//! (upstream waits 10 s, doubling); `completions` > 1, `parallelism` > 1,
//! Indexed Jobs, `podFailurePolicy`, `successPolicy` and `suspend` are not
//! simulated (a suspended Job just gets no new pod).

use std::sync::Arc;

use serde_json::{Value, json};

use super::objects::{JOB, POD, condition_true, controller_of, is_deleting, name_of, ns_of, now, str_at, uid_of};
use super::workloads::{remove_finalizer, virtual_node};
use super::{Ctx, OperatorError, log_failure};

/// The finalizer that keeps a Job's pod until the Job has counted it.
pub const JOB_TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

/// One pass over every Job.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let jobs = ctx.kube.list(&JOB, None, None).await?;
    let pods = ctx.kube.list(&POD, None, None).await?;
    for job in &jobs {
        if let Err(e) = sync_job(&ctx, job, &pods).await {
            log_failure("job-controller", &format!("{}/{}", ns_of(job), name_of(job)), &e);
        }
    }
    // as upstream's orphan-pod handling: a tracked pod whose Job is gone (or
    // going), or that has no controller any more (orphaned by the Job's
    // deletion), is let go, so the garbage collector's deletion can finish
    for pod in pods.iter().filter(|p| tracked(p)) {
        let live = match controller_of(pod) {
            Some(("Job", _, owner)) => jobs.iter().any(|j| uid_of(j) == owner && !is_deleting(j)),
            Some(_) => true,
            None => false,
        };
        if !live && let Err(e) = remove_finalizer(&ctx, &POD, pod, JOB_TRACKING_FINALIZER).await {
            log_failure("job-controller", &format!("{}/{}", ns_of(pod), name_of(pod)), &e);
        }
    }
    Ok(())
}

fn phase(pod: &Value) -> &str {
    str_at(pod, "/status/phase").unwrap_or("Pending")
}

fn terminal(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

fn tracked(pod: &Value) -> bool {
    pod.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|f| f.as_str() == Some(JOB_TRACKING_FINALIZER)))
}

/// A JobCondition, true since now.
fn job_condition(type_: &str, reason: &str, message: &str) -> Value {
    let now = now();
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": now, "lastTransitionTime": now})
}

async fn patch_status(ctx: &Ctx, job: &Value, status: Value) -> Result<Value, OperatorError> {
    ctx.kube.merge_status(&JOB, Some(ns_of(job)), name_of(job), &json!({"status": status})).await
}

async fn sync_job(ctx: &Ctx, job: &Value, pods: &[Value]) -> Result<(), OperatorError> {
    if is_deleting(job) {
        return Ok(());
    }
    let ns = ns_of(job);
    let conditions = job.pointer("/status/conditions").cloned().unwrap_or(json!([]));
    let finished = condition_true(Some(&conditions), "Complete") || condition_true(Some(&conditions), "Failed");
    let owned: Vec<&Value> = pods
        .iter()
        .filter(|p| ns_of(p) == ns && controller_of(p).is_some_and(|(kind, _, uid)| kind == "Job" && uid == uid_of(job)))
        .collect();

    // Count the pods that ended (or were deleted before they did): first
    // into uncountedTerminatedPods, then release them, then into the counters.
    let mut uncounted_ok: Vec<Value> = strings(job.pointer("/status/uncountedTerminatedPods/succeeded"));
    let mut uncounted_failed: Vec<Value> = strings(job.pointer("/status/uncountedTerminatedPods/failed"));
    let ended: Vec<&&Value> = owned.iter().filter(|p| tracked(p) && (terminal(p) || is_deleting(p))).collect();
    let mut added = false;
    for pod in &ended {
        let uid = json!(uid_of(pod));
        if uncounted_ok.contains(&uid) || uncounted_failed.contains(&uid) {
            continue;
        }
        if phase(pod) == "Succeeded" {
            uncounted_ok.push(uid);
        } else {
            uncounted_failed.push(uid);
        }
        added = true;
    }
    let mut job = job.clone();
    if added {
        job = patch_status(ctx, &job, json!({"uncountedTerminatedPods": {"succeeded": uncounted_ok, "failed": uncounted_failed}})).await?;
    }
    for pod in &ended {
        remove_finalizer(ctx, &POD, pod, JOB_TRACKING_FINALIZER).await?;
    }
    let count = |key: &str| job.pointer(&format!("/status/{key}")).and_then(Value::as_u64).unwrap_or(0);
    let succeeded = count("succeeded") + uncounted_ok.len() as u64;
    let failed = count("failed") + uncounted_failed.len() as u64;

    let active: Vec<&&Value> = owned.iter().filter(|p| !terminal(p) && !is_deleting(p)).collect();
    let terminating = owned.iter().filter(|p| is_deleting(p) && !terminal(p)).count();
    let ready = active
        .iter()
        .filter(|p| condition_true(p.pointer("/status/conditions"), "Ready"))
        .count();
    let spec_u64 = |key: &str| job.pointer(&format!("/spec/{key}")).and_then(Value::as_u64);
    let completions = spec_u64("completions").unwrap_or(1);
    let backoff_limit = spec_u64("backoffLimit").unwrap_or(6);
    let mut start_time = str_at(&job, "/status/startTime").map(str::to_string);
    let deadline_passed = match (spec_u64("activeDeadlineSeconds"), &start_time) {
        (Some(secs), Some(start)) => chrono::DateTime::parse_from_rfc3339(start)
            .is_ok_and(|t| chrono::Utc::now().signed_duration_since(t).num_seconds() >= secs as i64),
        _ => false,
    };

    let mut status = json!({"active": active.len(), "ready": ready, "terminating": terminating,
        "succeeded": succeeded, "failed": failed,
        // counted: the lists go (null removes them in a merge patch)
        "uncountedTerminatedPods": {"succeeded": null, "failed": null}});
    let mut conds: Vec<Value> = conditions.as_array().cloned().unwrap_or_default();
    let add = |conds: &mut Vec<Value>, type_: &str, reason: &str, message: &str| {
        let present = conds.iter().any(|c| str_at(c, "/type") == Some(type_) && str_at(c, "/status") == Some("True"));
        if !present {
            conds.push(job_condition(type_, reason, message));
        }
    };
    let failure = if condition_true(Some(&conditions), "FailureTarget") {
        conditions
            .as_array()
            .and_then(|a| a.iter().find(|c| str_at(c, "/type") == Some("FailureTarget")))
            .map(|c| (str_at(c, "/reason").unwrap_or_default().to_string(), str_at(c, "/message").unwrap_or_default().to_string()))
    } else if failed > backoff_limit {
        Some(("BackoffLimitExceeded".to_string(), "Job has reached the specified backoff limit".to_string()))
    } else if deadline_passed {
        Some(("DeadlineExceeded".to_string(), "Job was active longer than specified deadline".to_string()))
    } else {
        None
    };
    if !finished {
        if let Some((reason, message)) = &failure {
            add(&mut conds, "FailureTarget", reason, message);
            for pod in &active {
                ctx.kube.delete(&POD, Some(ns), name_of(pod)).await?;
            }
            // Failed once no pod of it runs or is being counted
            if active.is_empty() && terminating == 0 {
                add(&mut conds, "Failed", reason, message);
                tracing::info!(namespace = ns, job = name_of(&job), reason = %reason, "job failed");
            }
        } else if succeeded >= completions {
            add(&mut conds, "SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods");
            if active.is_empty() && terminating == 0 {
                add(&mut conds, "Complete", "CompletionsReached", "Reached expected number of succeeded pods");
                status["completionTime"] = json!(now());
                tracing::info!(namespace = ns, job = name_of(&job), "job complete");
            }
        } else if active.is_empty()
            && terminating == 0
            && job.pointer("/spec/suspend") != Some(&json!(true))
        {
            create_pod(ctx, &job).await?;
            status["active"] = json!(1);
            start_time.get_or_insert_with(now);
        }
    }
    if let Some(start) = start_time {
        status["startTime"] = json!(start);
    }
    if !conds.is_empty() {
        status["conditions"] = json!(conds);
    }
    if let Some(completion) = job.pointer("/status/completionTime") {
        status["completionTime"] = completion.clone();
    }
    if super::workloads::status_subset(&status, job.get("status").unwrap_or(&json!({}))) {
        return Ok(());
    }
    patch_status(ctx, &job, status).await.map(|_| ())
}

fn strings(v: Option<&Value>) -> Vec<Value> {
    v.and_then(Value::as_array).cloned().unwrap_or_default()
}

/// The Job's next pod, from its template.
async fn create_pod(ctx: &Ctx, job: &Value) -> Result<(), OperatorError> {
    let ns = ns_of(job);
    let mut spec = job.pointer("/spec/template/spec").cloned().unwrap_or_else(|| json!({}));
    spec["nodeName"] = json!(virtual_node(ctx));
    let owner = json!({"apiVersion": JOB.api_version(), "kind": JOB.kind, "name": name_of(job), "uid": uid_of(job),
        "controller": true, "blockOwnerDeletion": true});
    let pod = json!({
        "metadata": {
            "generateName": format!("{}-", name_of(job)),
            "namespace": ns,
            "labels": job.pointer("/spec/template/metadata/labels").cloned().unwrap_or(json!({})),
            "annotations": job.pointer("/spec/template/metadata/annotations").cloned().unwrap_or(json!({})),
            "ownerReferences": [owner],
            "finalizers": [JOB_TRACKING_FINALIZER],
        },
        "spec": spec,
    });
    let created = ctx.kube.create(&POD, Some(ns), pod).await?;
    tracing::info!(namespace = ns, job = name_of(job), pod = name_of(&created), "job: created pod");
    Ok(())
}
