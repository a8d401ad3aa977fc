//! The CronJob's commands run with nothing but the RBAC `hcp-dr schedule
//! render` prints. The sandbox's API emulator authenticates ServiceAccount
//! tokens (TokenRequest, as `kubectl create token` asks for them) and
//! enforces RBAC as a real API server does, so:
//! - the rendered backup and prune succeed as the rendered ServiceAccount,
//!   with their Events and status ConfigMap, also through port-forward;
//! - the same identity is refused what the rules do not grant;
//! - an account without the binding cannot back up (a clear 403);
//! - without one of the rules the backup fails naming that resource, and
//!   the cluster is left as it was.

use crate::support;

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::Api;
use serde_json::Value;
use support::*;

const SA_USER: &str = "system:serviceaccount:hcp-dr:hcp-dr-backup";

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .await
            .unwrap_or_else(|e| panic!("kubectl not found ({e}): install kubectl (https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubectl)"));
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.run(args).await;
        assert_eq!(code, 0, "kubectl {args:?}: {stderr}\n{stdout}");
        stdout
    }

    /// A kubeconfig for `sa` in `hcp-dr`: this one's cluster, a token from the TokenRequest API.
    async fn for_service_account(&self, sa: &str, dir: &Path) -> Kubectl {
        let token = self.ok(&["create", "token", sa, "-n", "hcp-dr", "--duration", "2h"]).await.trim().to_string();
        let kubeconfig = dir.join(format!("{sa}.kubeconfig"));
        std::fs::copy(&self.kubeconfig, &kubeconfig).unwrap();
        let k = Kubectl { kubeconfig, cache: self.cache.clone() };
        k.ok(&["config", "set-credentials", sa, "--token", &token]).await;
        k.ok(&["config", "set-context", "--current", "--user", sa]).await;
        k
    }
}

/// Run hcp-dr as the CronJob's container would: its args, the identity of `kubeconfig`.
async fn as_cronjob(env: &Env, kubeconfig: &Path, args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = tokio::process::Command::from(env.command(&args, &[("KUBECONFIG", kubeconfig.to_str().unwrap())]));
    cmd.output().await.expect("run hcp-dr")
}

fn container_args(container: &Value) -> Vec<String> {
    container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

async fn hcp_dr_events(env: &Env) -> Vec<String> {
    let events = Api::<Event>::namespaced(env.mgmt.clone(), "clusters").list(&Default::default()).await.unwrap();
    let mut reasons = events
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("demo") && e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("hcp-dr"))
        .filter_map(|e| e.reason)
        .collect::<Vec<String>>();
    reasons.sort();
    reasons
}

/// The fleet report's one cluster, which must have succeeded with no warnings.
fn assert_backed_up(out: &std::process::Output, what: &str) -> Value {
    assert!(out.status.success(), "{what}: {}", text(out));
    let report = json_report(out);
    assert_eq!(report["succeeded"], 1, "{what}: {report:#}");
    let demo = &report["clusters"][0];
    assert_eq!(demo["hosted_cluster"], "clusters/demo", "{what}: {report:#}");
    let warnings = demo["result"]["warnings"].as_array().cloned().unwrap_or_default();
    assert!(warnings.is_empty(), "{what}: signals not written: {warnings:?}");
    demo["result"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cronjob_backs_up_with_only_the_rendered_rbac() {
    let env = env("SingleReplica").await;
    let dir = env.dir.path();
    let admin = Kubectl { kubeconfig: env.sandbox.clusters[0].kubeconfig.clone(), cache: dir.join("kube-cache") };
    admin.ok(&["label", "hostedcluster", "demo", "-n", "clusters", "backup=yes"]).await;

    // render and apply as the README says
    let store = env.local_store();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(["schedule", "render", "--schedule", "0 */6 * * *", "--to", store.to_str().unwrap(), "-l", "backup=yes", "--keep-last", "5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let yaml = dir.join("schedule.yaml");
    std::fs::write(&yaml, &out.stdout).unwrap();
    admin.ok(&["apply", "-f", yaml.to_str().unwrap()]).await;
    let objects: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let cron = objects.iter().find(|o| o["kind"] == "CronJob").unwrap();
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "hcp-dr-backup");
    let backup_args = container_args(&pod["initContainers"][0]);
    let prune_args = container_args(&pod["containers"][0]);
    assert_eq!(backup_args[..2], ["backup", "--all"]);
    assert_eq!(prune_args[..2], ["backups", "prune"]);
    let rules: Vec<Value> = objects.iter().find(|o| o["kind"] == "ClusterRole").unwrap()["rules"].as_array().unwrap().clone();

    // the job's identity: the rendered ServiceAccount, with a token from the TokenRequest API
    let job = admin.for_service_account("hcp-dr-backup", dir).await;
    let who: Value = serde_json::from_str(&job.ok(&["auth", "whoami", "-o", "json"]).await).unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], SA_USER, "{who}");

    // backup then prune, as the CronJob runs them
    let out = as_cronjob(&env, &job.kubeconfig, &backup_args).await;
    let first = assert_backed_up(&out, "the rendered backup");
    let reasons = hcp_dr_events(&env).await;
    assert_eq!(reasons, ["BackupStarted", "BackupSucceeded"], "the Events the job writes (sorted)");
    let cm = Api::<ConfigMap>::namespaced(env.mgmt.clone(), "clusters").get("hcp-dr-backup-demo").await.unwrap().data.unwrap();
    assert_eq!(cm.get("last_success_backup"), first["backup"].as_str().map(str::to_string).as_ref(), "{cm:?}");
    assert!(cm.contains_key("last_start_time"), "{cm:?}");
    let out = as_cronjob(&env, &job.kubeconfig, &prune_args).await;
    assert!(out.status.success(), "the rendered prune: {}", text(&out));
    env.assert_in_service("after the rendered backup").await;

    // the same through the API server's port-forward (pods/portforward: get and create)
    let mut forwarded = backup_args.clone();
    forwarded.extend(["--etcd-access".to_string(), "port-forward".to_string()]);
    let out = as_cronjob(&env, &job.kubeconfig, &forwarded).await;
    assert_backed_up(&out, "the rendered backup through port-forward");
    env.assert_in_service("after the port-forwarded backup").await;

    // the identity is refused what the rules do not grant
    let (code, _, stderr) = job.run(&["delete", "hostedcluster", "demo", "-n", "clusters"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("hostedclusters.hypershift.openshift.io \"demo\" is forbidden: User \"{SA_USER}\" cannot delete resource \"hostedclusters\" in API group \"hypershift.openshift.io\" in the namespace \"clusters\"")),
        "{stderr}"
    );
    admin.ok(&["get", "hostedcluster", "demo", "-n", "clusters"]).await;
    for (verb, resource, subresource, ns, allowed) in [
        ("list", "hostedclusters.hypershift.openshift.io", "", "clusters", true),
        ("patch", "hostedclusters.hypershift.openshift.io", "", "clusters", true),
        ("create", "pods", "portforward", "clusters-demo", true),
        ("get", "pods", "portforward", "clusters-demo", true),
        ("delete", "hostedclusters.hypershift.openshift.io", "", "clusters", false),
        ("patch", "hostedclusters.hypershift.openshift.io", "status", "clusters", false),
        ("create", "hostedclusters.hypershift.openshift.io", "", "clusters", false),
        ("create", "secrets", "", "clusters", false),
        ("delete", "secrets", "", "clusters-demo", false),
        ("list", "configmaps", "", "clusters", false),
        ("delete", "deployments.apps", "", "clusters-demo", false),
        ("create", "pods", "", "clusters-demo", false),
        ("create", "pods", "exec", "clusters-demo", false),
        ("delete", "pods", "", "clusters-demo", false),
        ("get", "nodes", "", "", false),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", "", false),
    ] {
        let mut args = vec!["auth", "can-i", verb, resource];
        let sub = format!("--subresource={subresource}");
        if !subresource.is_empty() {
            args.push(&sub);
        }
        if !ns.is_empty() {
            args.extend(["-n", ns]);
        }
        let (code, stdout, stderr) = job.run(&args).await;
        let want = if allowed { (0, "yes") } else { (1, "no") };
        assert_eq!((code, stdout.trim()), want, "can-i {verb} {resource} {subresource} -n {ns}: {stderr}");
    }

    // a ServiceAccount without the binding cannot back up
    admin.ok(&["create", "serviceaccount", "unbound", "-n", "hcp-dr"]).await;
    let unbound = admin.for_service_account("unbound", dir).await;
    let out = as_cronjob(&env, &unbound.kubeconfig, &backup_args).await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("hostedclusters.hypershift.openshift.io is forbidden: User \"system:serviceaccount:hcp-dr:unbound\" cannot list resource \"hostedclusters\" in API group \"hypershift.openshift.io\" at the cluster scope"),
        "the 403 is surfaced: {}",
        text(&out)
    );
    env.assert_in_service("after the unbound account's attempt").await;

    // each of these rules is needed: without it the backup fails naming the resource, and undoes itself
    for (resource, group) in [("leases", "coordination.k8s.io"), ("deployments/scale", "apps"), ("hostedcontrolplanes", "hypershift.openshift.io")] {
        let index = rules.iter().position(|r| r["resources"][0] == resource).unwrap_or_else(|| panic!("no rule for {resource}"));
        admin.ok(&["patch", "clusterrole", "hcp-dr-backup", "--type=json", "-p", &format!(r#"[{{"op": "remove", "path": "/rules/{index}"}}]"#)]).await;
        let out = as_cronjob(&env, &job.kubeconfig, &backup_args).await;
        assert_eq!(out.status.code(), Some(1), "without the {resource} rule: {}", text(&out));
        let report = json_report(&out);
        let error = report["clusters"][0]["result"]["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!("is forbidden: User \"{SA_USER}\" cannot")) && error.contains(&format!("resource \"{resource}\" in API group \"{group}\"")),
            "without the {resource} rule the failure names it: {report:#}"
        );
        env.assert_in_service(&format!("after the backup without the {resource} rule")).await;
        admin.ok(&["apply", "-f", yaml.to_str().unwrap()]).await;
    }
    // with the rules back, it backs up again
    let out = as_cronjob(&env, &job.kubeconfig, &backup_args).await;
    assert_backed_up(&out, "the rendered backup, rules restored");
}
