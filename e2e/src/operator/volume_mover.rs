//! The "kubelet" for hcp-dr's volume-mover pods (`hcp-dr volume-mover`).
//!
//! The sandbox cannot run container images, so it runs the pods it knows by
//! doing what their containers do. A volume-mover pod carries the
//! annotation `hcp-dr.openshift.io/volume-mover: v1`; its single container
//! runs `hcp-dr volume-mover --dir <mountPath> --port <port> ...` with the
//! claim to move mounted at `<mountPath>`. This module runs that command as
//! a local process of the real hcp-dr binary ([`crate::drill::hcp_dr_binary`]):
//! the arguments naming the mount (or a path below it) are rewritten to the
//! claim's data directory, the environment is the container's (values,
//! Secret and ConfigMap keys resolved, `$(VAR)` references expanded) plus
//! `PATH` and `HCP_DR_MOVER_BIND=<pod IP>` (the address the mover listens
//! on; each pod gets its own loopback IP, as other pods do).
//!
//! The pod reports what a kubelet would: Pending (PodScheduled False) until
//! its claims are bound; Pending with the container waiting
//! (`CreateContainerConfigError`) while a Secret, ConfigMap or key it needs
//! is missing, or `ErrImagePull` while the hcp-dr binary is not built;
//! Running, Ready once its port accepts connections; Succeeded (exit 0) or
//! Failed, with the exit code and the last lines of the process's output as
//! the termination message. `restartPolicy` is honoured (`Never`: never
//! restarted; `OnFailure`/`Always`: restarted after a back-off of 10 s,
//! doubling to 5 min). Deleting the pod stops the process: SIGTERM, then
//! SIGKILL after the pod's grace period (at most 30 s). Its output is kept in
//! `state_dir/logs/<namespace>_<pod>.log` ([`log_path`]).
//!
//! Sandbox differences: one container per pod; only `persistentVolumeClaim`
//! volumes; the process runs as the test's user on the host, with host
//! paths; readiness is a TCP connect to the first container port, whatever
//! probe the pod declares.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::etcd_member::{configmap_data, secret_data};
use super::objects::{CONFIGMAP, POD, PVC, SECRET, is_deleting, name_of, ns_of, str_at, uid_of};
use super::workloads::{alloc_pod_ip, existing_pv_dir, patch_status_if_changed, running_status};
use super::{Ctx, OperatorError, log_failure};
use crate::procs::ManagedChild;

/// The annotation naming the volume-mover contract a pod's container follows.
pub const MOVER_ANNOTATION: &str = "hcp-dr.openshift.io/volume-mover";
/// The variable holding the address the mover listens on.
pub const BIND_ENV: &str = "HCP_DR_MOVER_BIND";
/// Lines of output kept as a failed or finished container's message.
const MESSAGE_LINES: usize = 20;
/// Bytes of output kept as that message at most.
const MESSAGE_BYTES: usize = 4096;

/// Whether this pod is an hcp-dr volume-mover pod.
pub fn is_mover_pod(pod: &Value) -> bool {
    pod.pointer(&format!("/metadata/annotations/{}", MOVER_ANNOTATION.replace('/', "~1")))
        .is_some()
}

/// Where the output of the mover of pod `ns/name` goes.
pub fn log_path(state_dir: &Path, ns: &str, name: &str) -> PathBuf {
    state_dir.join("logs").join(format!("{ns}_{name}.log"))
}

/// A running mover: its supervising task and the switch that stops it.
pub(crate) struct Mover {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

/// Running movers by pod uid.
pub(crate) type Running = std::sync::Mutex<HashMap<String, Mover>>;

/// Why a pod cannot start its container yet.
enum Wait {
    /// Not schedulable (its claims are not bound): PodScheduled False.
    Unschedulable(String),
    /// The container cannot be created: waiting with this reason.
    Container { reason: &'static str, message: String },
}

/// What running the container takes.
struct Prepared {
    binary: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ip: IpAddr,
    port: Option<u16>,
}

/// One pass: start new mover pods, stop deleted ones.
pub(crate) async fn sync(ctx: Arc<Ctx>) -> Result<(), OperatorError> {
    let pods: Vec<Value> = ctx.pods_here(ctx.kube.list(&POD, None, None).await?).into_iter().filter(is_mover_pod).collect();
    let starting: Vec<&Value> = {
        let Ok(mut running) = ctx.movers.lock() else {
            return Ok(());
        };
        running.retain(|uid, mover| {
            let live = pods.iter().any(|p| uid_of(p) == uid && !is_deleting(p));
            if !live {
                let _ = mover.stop.send(true);
            }
            live || !mover.task.is_finished()
        });
        pods.iter()
            .filter(|p| !is_deleting(p) && !running.contains_key(uid_of(p)))
            .filter(|p| !matches!(str_at(p, "/status/phase"), Some("Succeeded" | "Failed")))
            .collect()
    };
    for pod in starting {
        if let Err(e) = start(&ctx, pod).await {
            log_failure("volume-mover-kubelet", &format!("{}/{}", ns_of(pod), name_of(pod)), &e);
        }
    }
    Ok(())
}

/// Stop every mover (the operator is shutting down).
pub(crate) async fn stop_all(ctx: &Ctx) {
    let movers: Vec<Mover> = match ctx.movers.lock() {
        Ok(mut m) => m.drain().map(|(_, v)| v).collect(),
        Err(_) => return,
    };
    for m in movers {
        m.task.abort();
        let _ = m.task.await;
    }
}

async fn start(ctx: &Arc<Ctx>, pod: &Value) -> Result<(), OperatorError> {
    if str_at(pod, "/status/phase") == Some("Running") {
        // Running without a process: the kubelet that ran it is gone (the
        // operator stopped), and its container with it.
        let prepared_ip = str_at(pod, "/status/podIP").and_then(|ip| ip.parse().ok());
        let restarts = pod.pointer("/status/containerStatuses/0/restartCount").and_then(Value::as_u64).unwrap_or(0);
        let (stop, rx) = watch::channel(false);
        drop(rx);
        let (ctx2, pod2) = (ctx.clone(), pod.clone());
        let task = tokio::spawn(async move {
            let exit = Exit { code: 137, output: "the container was killed when the sandbox's kubelet stopped".into() };
            finish(&ctx2, &pod2, prepared_ip, restarts, &exit).await;
        });
        register(ctx, pod, Mover { task, stop });
        return Ok(());
    }
    let prepared = match prepare(ctx, pod).await? {
        Ok(p) => p,
        Err(wait) => return report_waiting(ctx, pod, &wait).await,
    };
    let (stop, rx) = watch::channel(false);
    let (ctx2, pod2) = (ctx.clone(), pod.clone());
    let task = tokio::spawn(async move { run(ctx2, pod2, prepared, rx).await });
    register(ctx, pod, Mover { task, stop });
    Ok(())
}

fn register(ctx: &Ctx, pod: &Value, mover: Mover) {
    if let Ok(mut running) = ctx.movers.lock() {
        running.insert(uid_of(pod).to_string(), mover);
    }
}

fn container_waiting(reason: &'static str, message: impl Into<String>) -> Wait {
    Wait::Container { reason, message: message.into() }
}

/// Everything the container needs, or why it cannot start yet.
async fn prepare(ctx: &Ctx, pod: &Value) -> Result<Result<Prepared, Wait>, OperatorError> {
    let version = str_at(pod, &format!("/metadata/annotations/{}", MOVER_ANNOTATION.replace('/', "~1"))).unwrap_or_default();
    if version != "v1" {
        return Ok(Err(container_waiting("CreateContainerError", format!(
            "{MOVER_ANNOTATION}: {version}: the sandbox runs volume-mover v1 pods only"
        ))));
    }
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default();
    let [container] = containers.as_slice() else {
        return Ok(Err(container_waiting("CreateContainerError", "the sandbox runs volume-mover pods of one container only")));
    };
    let command: Vec<String> = strings(container.get("command")).into_iter().chain(strings(container.get("args"))).collect();
    if command.first().and_then(|c| Path::new(c).file_name()).is_none_or(|n| n != "hcp-dr") {
        return Ok(Err(container_waiting("CreateContainerError", format!(
            "the sandbox runs only hcp-dr in volume-mover pods (command {:?})",
            command.first()
        ))));
    }
    // volumes first: the scheduler holds a pod whose claims are not bound
    let mut mounts = Vec::new();
    for m in container.get("volumeMounts").and_then(Value::as_array).into_iter().flatten() {
        let (Some(volume), Some(path)) = (str_at(m, "/name"), str_at(m, "/mountPath")) else {
            continue;
        };
        let spec = pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .and_then(|vs| vs.iter().find(|v| str_at(v, "/name") == Some(volume)));
        // the service-account token a real API server's ServiceAccount
        // admission projects into a pod that does not opt out: the mover
        // never reads it, so it is not mounted here
        let token = spec.and_then(|v| v.pointer("/projected/sources")).and_then(Value::as_array)
            .is_some_and(|sources| sources.iter().any(|s| s.get("serviceAccountToken").is_some()));
        if token {
            continue;
        }
        let Some(claim) = spec.and_then(|v| str_at(v, "/persistentVolumeClaim/claimName")) else {
            return Ok(Err(container_waiting("CreateContainerError", format!(
                "volume {volume}: the sandbox mounts only persistentVolumeClaim volumes in volume-mover pods"
            ))));
        };
        let ns = ns_of(pod);
        let Some(pvc) = ctx.kube.get(&PVC, Some(ns), claim).await? else {
            return Ok(Err(Wait::Unschedulable(format!("persistentvolumeclaim \"{claim}\" not found"))));
        };
        let bound = str_at(&pvc, "/status/phase") == Some("Bound");
        let Some(dir) = existing_pv_dir(&ctx.cfg.state_dir, &pvc).filter(|_| bound && !is_deleting(&pvc)) else {
            return Ok(Err(Wait::Unschedulable(
                "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.".to_string(),
            )));
        };
        mounts.push((path.trim_end_matches('/').to_string(), dir));
    }
    let env = match environment(ctx, pod, container).await? {
        Ok(env) => env,
        Err(message) => return Ok(Err(container_waiting("CreateContainerConfigError", message))),
    };
    let binary = match crate::drill::hcp_dr_binary() {
        Ok(b) if b.exists() => b,
        Ok(b) => return Ok(Err(container_waiting("ErrImagePull", format!("{} does not exist: build hcp-dr", b.display())))),
        Err(e) => return Ok(Err(container_waiting("ErrImagePull", e.to_string()))),
    };
    let args = command[1..].iter().map(|a| host_arg(&expand(a, &env), &mounts)).collect();
    let port = container
        .pointer("/ports/0/containerPort")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let ip = match str_at(pod, "/status/podIP").and_then(|ip| ip.parse().ok()) {
        Some(ip) => ip,
        None => alloc_pod_ip(pod.get("spec").unwrap_or(&Value::Null))?,
    };
    Ok(Ok(Prepared { binary, args, env, ip, port }))
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// An argument as the host sees it: a mount path (alone, below, or as the
/// value of `--flag=`) becomes the claim's data directory.
fn host_arg(arg: &str, mounts: &[(String, PathBuf)]) -> String {
    let map = |s: &str| -> Option<String> {
        mounts.iter().find_map(|(mount, dir)| {
            if s == mount {
                Some(dir.display().to_string())
            } else {
                s.strip_prefix(&format!("{mount}/")).map(|rest| dir.join(rest).display().to_string())
            }
        })
    };
    if let Some(mapped) = map(arg) {
        return mapped;
    }
    match arg.split_once('=') {
        Some((flag, value)) if flag.starts_with("--") => map(value).map(|v| format!("{flag}={v}")).unwrap_or_else(|| arg.to_string()),
        _ => arg.to_string(),
    }
}

/// `$(VAR)` references to the container's environment expanded, `$$(VAR)`
/// kept literally as `$(VAR)`, unknown references left as written (as the
/// kubelet expands `command` and `args`).
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some((name, after)) = tail.strip_prefix("$(").and_then(|t| t.split_once(')')) {
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&tail[..name.len() + 3]),
            }
            rest = after;
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment (in order; later entries may refer to
/// earlier ones), or the kubelet's message for what is missing.
async fn environment(ctx: &Ctx, pod: &Value, container: &Value) -> Result<Result<Vec<(String, String)>, String>, OperatorError> {
    let ns = ns_of(pod);
    let mut env: Vec<(String, String)> = Vec::new();
    for e in container.get("env").and_then(Value::as_array).into_iter().flatten() {
        let name = str_at(e, "/name").unwrap_or_default().to_string();
        if let Some(v) = str_at(e, "/value") {
            let v = expand(v, &env);
            env.push((name, v));
            continue;
        }
        let (res, what, key_ref) = match (e.pointer("/valueFrom/secretKeyRef"), e.pointer("/valueFrom/configMapKeyRef")) {
            (Some(r), _) => (SECRET, "Secret", r),
            (None, Some(r)) => (CONFIGMAP, "ConfigMap", r),
            (None, None) if e.get("valueFrom").is_some() => {
                return Ok(Err(format!("env {name}: the sandbox resolves value, secretKeyRef and configMapKeyRef only")));
            }
            (None, None) => {
                env.push((name, String::new()));
                continue;
            }
        };
        let optional = key_ref.get("optional") == Some(&json!(true));
        let (object, key) = (str_at(key_ref, "/name").unwrap_or_default(), str_at(key_ref, "/key").unwrap_or_default());
        let found = ctx.kube.get(&res, Some(ns), object).await?;
        let value = found.as_ref().and_then(|o| if what == "Secret" { secret_data(o, key) } else { configmap_data(o, key) });
        match (found, value) {
            (_, Some(v)) => env.push((name, v)),
            _ if optional => {}
            (None, _) => return Ok(Err(format!("{} \"{object}\" not found", what.to_lowercase()))),
            (Some(_), None) => return Ok(Err(format!("couldn't find key {key} in {what} {ns}/{object}"))),
        }
    }
    Ok(Ok(env))
}

async fn report_waiting(ctx: &Ctx, pod: &Value, wait: &Wait) -> Result<(), OperatorError> {
    let prev = pod.pointer("/status/conditions");
    let status = match wait {
        Wait::Unschedulable(message) => json!({"phase": "Pending",
            "conditions": [super::objects::condition(prev, "PodScheduled", false, "Unschedulable", message)]}),
        Wait::Container { reason, message } => json!({"phase": "Pending", "hostIP": "127.0.0.1",
            "conditions": [
                super::objects::condition(prev, "PodScheduled", true, "", ""),
                super::objects::condition(prev, "Initialized", true, "", ""),
                super::objects::condition(prev, "ContainersReady", false, "ContainersNotReady", "containers with unready status: [mover]"),
                super::objects::condition(prev, "Ready", false, "ContainersNotReady", "containers with unready status: [mover]"),
            ],
            "containerStatuses": [container_status(pod, 0, false, json!({"waiting": {"reason": reason, "message": message}}), None)]}),
    };
    patch_status_if_changed(ctx, &POD, pod, status).await
}

fn container_status(pod: &Value, restarts: u64, ready: bool, state: Value, last: Option<Value>) -> Value {
    let mut s = json!({"name": str_at(pod, "/spec/containers/0/name").unwrap_or_default(),
        "image": str_at(pod, "/spec/containers/0/image").unwrap_or_default(), "imageID": "",
        "ready": ready, "started": state.get("running").is_some(), "restartCount": restarts, "state": state});
    if let Some(last) = last {
        s["lastState"] = last;
    }
    s
}

/// How a container run ended.
struct Exit {
    code: i32,
    output: String,
}

/// Run the container (again, as its restart policy says) until it ends for
/// good or the pod is deleted.
async fn run(ctx: Arc<Ctx>, pod: Value, prepared: Prepared, mut stop: watch::Receiver<bool>) {
    let (ns, name) = (ns_of(&pod).to_string(), name_of(&pod).to_string());
    let log = log_path(&ctx.cfg.state_dir, &ns, &name);
    let policy = str_at(&pod, "/spec/restartPolicy").unwrap_or("Always").to_string();
    let grace = pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_u64).unwrap_or(30).min(30);
    let mut restarts = 0u64;
    let mut last_state: Option<Value> = None;
    loop {
        let mut cmd = std::process::Command::new(&prepared.binary);
        cmd.args(&prepared.args)
            .env_clear()
            .envs(prepared.env.iter().map(|(k, v)| (k, v)))
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(BIND_ENV, prepared.ip.to_string())
            .current_dir("/");
        let child = match ManagedChild::spawn(cmd, &format!("volume-mover {ns}/{name}"), &log) {
            Ok(c) => c,
            Err(e) => {
                let exit = Exit { code: 128, output: format!("starting the container: {e}") };
                finish(&ctx, &pod, Some(prepared.ip), restarts, &exit).await;
                return;
            }
        };
        tracing::info!(namespace = %ns, pod = %name, pid = child.pid(), ip = %prepared.ip, "volume-mover pod: started hcp-dr");
        let started = super::objects::now();
        report_running(&ctx, &pod, &prepared, restarts, false, last_state.clone(), &started).await;
        let (exit, stopped) = supervise(&ctx, &pod, &prepared, child, &mut stop, grace, restarts, &last_state, &started).await;
        if stopped {
            tracing::info!(namespace = %ns, pod = %name, code = exit.code, "volume-mover pod deleted: hcp-dr stopped");
            finish(&ctx, &pod, Some(prepared.ip), restarts, &exit).await;
            return;
        }
        let again = match policy.as_str() {
            "Never" => false,
            "OnFailure" => exit.code != 0,
            _ => true,
        };
        if !again {
            tracing::info!(namespace = %ns, pod = %name, code = exit.code, "volume-mover pod: hcp-dr exited");
            finish(&ctx, &pod, Some(prepared.ip), restarts, &exit).await;
            return;
        }
        // CrashLoopBackOff: 10 s, doubling, at most 5 min
        let terminated = terminated_state(&exit, &started);
        restarts += 1;
        let backoff = Duration::from_secs((10u64 << (restarts - 1).min(5)).min(300));
        let status = json!({"status": {"containerStatuses": [container_status(&pod, restarts - 1, false,
            json!({"waiting": {"reason": "CrashLoopBackOff",
                "message": format!("back-off {}s restarting failed container", backoff.as_secs())}}),
            Some(terminated.clone()))]}});
        let _ = ctx.kube.merge_status(&POD, Some(&ns), &name, &status).await;
        last_state = Some(terminated);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
    }
}

fn terminated_state(exit: &Exit, started: &str) -> Value {
    json!({"terminated": {"exitCode": exit.code, "reason": if exit.code == 0 { "Completed" } else { "Error" },
        "message": exit.output, "startedAt": started, "finishedAt": super::objects::now()}})
}

async fn report_running(ctx: &Ctx, pod: &Value, prepared: &Prepared, restarts: u64, ready: bool, last: Option<Value>, started: &str) {
    let mut status = running_status(pod, &prepared.ip.to_string(), ready);
    status["containerStatuses"] = json!([container_status(pod, restarts, ready, json!({"running": {"startedAt": started}}), last)]);
    if let Err(e) = ctx.kube.merge_status(&POD, Some(ns_of(pod)), name_of(pod), &json!({"status": status})).await {
        tracing::warn!(pod = %name_of(pod), "reporting the volume-mover pod's status: {e}");
    }
}

/// Watch the process: Ready once its port answers; its exit; or the pod's
/// deletion (then SIGTERM, SIGKILL after `grace` seconds). Returns how it
/// ended and whether it was stopped.
#[allow(clippy::too_many_arguments)] // one container run's context, used once
async fn supervise(
    ctx: &Ctx,
    pod: &Value,
    prepared: &Prepared,
    mut child: ManagedChild,
    stop: &mut watch::Receiver<bool>,
    grace: u64,
    restarts: u64,
    last: &Option<Value>,
    started: &str,
) -> (Exit, bool) {
    let mut ready = false;
    loop {
        if let Some(status) = child.exit_status() {
            return (exit_of(&child, status), false);
        }
        if !ready
            && let Some(port) = prepared.port
            && tokio::time::timeout(Duration::from_millis(300), tokio::net::TcpStream::connect((prepared.ip, port)))
                .await
                .is_ok_and(|c| c.is_ok())
        {
            ready = true;
            report_running(ctx, pod, prepared, restarts, true, last.clone(), started).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => {
                if let Ok(pgid) = libc::pid_t::try_from(child.pid()) {
                    // SAFETY: kill(2) on the process group ManagedChild made
                    // (its pgid is the child's pid); no memory is involved.
                    unsafe {
                        libc::kill(-pgid, libc::SIGTERM);
                    }
                }
                let deadline = tokio::time::Instant::now() + Duration::from_secs(grace);
                while child.exit_status().is_none() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if child.exit_status().is_none() {
                    child.kill();
                    return (Exit { code: 137, output: child.log_tail(MESSAGE_LINES) }, true);
                }
                let status = child.exit_status();
                return (status.map(|s| exit_of(&child, s)).unwrap_or(Exit { code: 137, output: String::new() }), true);
            }
        }
    }
}

fn exit_of(child: &ManagedChild, status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(9));
    let mut output = child.log_tail(MESSAGE_LINES);
    if output.len() > MESSAGE_BYTES {
        let mut cut = output.len() - MESSAGE_BYTES;
        while !output.is_char_boundary(cut) {
            cut += 1;
        }
        output = output[cut..].to_string();
    }
    Exit { code, output }
}

/// The pod's final status: Succeeded on exit 0, else Failed.
async fn finish(ctx: &Ctx, pod: &Value, ip: Option<IpAddr>, restarts: u64, exit: &Exit) {
    let started = pod.pointer("/status/startTime").and_then(Value::as_str).map(str::to_string).unwrap_or_else(super::objects::now);
    let phase = if exit.code == 0 { "Succeeded" } else { "Failed" };
    let prev = pod.pointer("/status/conditions");
    let mut status = json!({
        "phase": phase, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}], "startTime": started,
        "conditions": [
            super::objects::condition(prev, "PodScheduled", true, "", ""),
            super::objects::condition(prev, "Initialized", true, "", ""),
            super::objects::condition(prev, "ContainersReady", false, "PodCompleted", ""),
            super::objects::condition(prev, "Ready", false, "PodCompleted", ""),
        ],
        "containerStatuses": [container_status(pod, restarts, false, terminated_state(exit, &started), None)],
    });
    if let Some(ip) = ip {
        status["podIP"] = json!(ip.to_string());
        status["podIPs"] = json!([{"ip": ip.to_string()}]);
    }
    match ctx.kube.merge_status(&POD, Some(ns_of(pod)), name_of(pod), &json!({"status": status})).await {
        Ok(_) => {}
        Err(e) if super::objects::status_code(&e) == Some(404) => {}
        Err(e) => tracing::warn!(pod = %name_of(pod), "reporting the volume-mover pod's end: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_become_host_paths() {
        let mounts = vec![("/data".to_string(), PathBuf::from("/state/pv/ns/pvc-1"))];
        assert_eq!(host_arg("/data", &mounts), "/state/pv/ns/pvc-1");
        assert_eq!(host_arg("/data/sub/x", &mounts), "/state/pv/ns/pvc-1/sub/x");
        assert_eq!(host_arg("--dir=/data", &mounts), "--dir=/state/pv/ns/pvc-1");
        assert_eq!(host_arg("/database", &mounts), "/database");
        assert_eq!(host_arg("--port", &mounts), "--port");
    }

    #[test]
    fn references_expand_as_the_kubelet_does() {
        let env = vec![("PORT".to_string(), "8443".to_string())];
        assert_eq!(expand("--port=$(PORT)", &env), "--port=8443");
        assert_eq!(expand("$$(PORT)", &env), "$(PORT)");
        assert_eq!(expand("$(NOPE)", &env), "$(NOPE)");
        assert_eq!(expand("a$b", &env), "a$b");
    }

    #[test]
    fn mover_pods_are_recognised_by_annotation() {
        assert!(is_mover_pod(&json!({"metadata": {"annotations": {MOVER_ANNOTATION: "v1"}}})));
        assert!(!is_mover_pod(&json!({"metadata": {"annotations": {}}})));
    }
}
