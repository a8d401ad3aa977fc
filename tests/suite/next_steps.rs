//! Every next step hcp-dr prints is run exactly as printed, the way an
//! operator pastes it at 3 a.m.: in a shell with the sandbox's env file
//! sourced (`HCP_DR_STORE`, `HCP_DR_ROUTE53_ZONE`, … set, as the CronJob's
//! environment sets them), `KUBECONFIG` unset, nothing added. The run that
//! printed it is stopped the ways runs stop: killed mid-stage, or a stage
//! failing (the test hook `HCP_DR_TEST_FAIL_AFTER`).

use crate::support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::json;
use support::{Env, env, sourced_shell, text, wait_for_stage};

/// `script` in bash with the sandbox's env file sourced, hcp-dr on PATH,
/// `KUBECONFIG` unset, in the test's work directory.
fn shell(env: &Env, script: &str, hooks: &[(&str, &str)]) -> Command {
    let mut cmd = sourced_shell(&env.sandbox, env.dir.path(), script);
    support::require_test_hooks(hooks);
    for (k, v) in hooks {
        cmd.env(k, v);
    }
    cmd
}

fn run(env: &Env, script: &str, hooks: &[(&str, &str)]) -> Output {
    shell(env, script, hooks).output().expect("bash")
}

/// Every `hcp-dr …` command the output prints between backticks, in order.
fn printed(output: &Output) -> Vec<String> {
    let all = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    all.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("hcp-dr "))
        .map(str::to_string)
        .collect()
}

/// The one printed command that contains `flag`.
fn step(output: &Output, flag: &str) -> String {
    let found: Vec<String> = printed(output).into_iter().filter(|c| c.contains(flag)).collect();
    assert!(!found.is_empty(), "no printed `hcp-dr … {flag} …`:\n{}", text(output));
    assert!(found.windows(2).all(|w| w[0] == w[1]), "different {flag} commands printed: {found:?}");
    found[0].clone()
}


/// Run `script` (which writes `journal`) holding in `stage`, and SIGKILL it
/// there, as a node loss would; returns what it printed until then.
fn killed_in(env: &Env, script: &str, journal: &Path, stage: &str) -> Output {
    let child = shell(env, script, &[("HCP_DR_TEST_HOLD_IN", stage)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for_stage(journal, stage);
    // SIGKILL to hcp-dr (bash's child, or bash itself once it exec'd it)
    let _ = Command::new("pkill").args(["-KILL", "-f", &format!("journal {}", journal.display())]).status();
    let mut child = child;
    let _ = child.kill();
    child.wait_with_output().expect("wait")
}

/// Run `script` failing right after `stage` (the test hook): it stops (exit 3).
fn stopped_after(env: &Env, script: &str, stage: &str) -> Output {
    let out = run(env, script, &[("HCP_DR_TEST_FAIL_AFTER", stage)]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    out
}

/// Run the command `output` printed with `flag`, exactly as printed; it must succeed.
fn follow(env: &Env, output: &Output, flag: &str) -> Output {
    let command = step(output, flag);
    let out = run(env, &command, &[]);
    assert!(out.status.success(), "{command}\n{}", text(&out));
    out
}

async fn hosted_clusters(client: &kube::Client, namespace: &str) -> Vec<String> {
    let api = hcp_dr_e2e::sandbox::api_for(
        client,
        &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": namespace}}),
    );
    api.list(&Default::default()).await.expect("list").items.into_iter().filter_map(|o| o.metadata.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn printed_next_steps_work_verbatim_with_the_env_file_sourced() {
    let env = env("HighlyAvailable").await;
    let mgmt_b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");

    // backup, killed mid-snapshot: its start log names the resume
    let journal = env.dir.path().join("backup.jsonl");
    let backup = format!("hcp-dr backup --hosted-cluster demo -n clusters --kubeconfig \"$KUBECONFIG_A\" --journal {}", journal.display());
    let killed = killed_in(&env, &backup, &journal, "etcd-snapshot");
    assert!(env.writer_replicas().await.iter().all(|(_, r)| *r == 0), "the kill left the writers stopped");
    assert_eq!(step(&killed, "--resume"), format!("hcp-dr backup --resume {}", journal.display()));
    follow(&env, &killed, "--resume");
    env.assert_in_service("after the printed backup --resume").await;

    // migrate stopped after apply: the printed abort brings the source back
    let migrate = "hcp-dr migrate --hosted-cluster demo -n clusters --from-kubeconfig \"$KUBECONFIG_A\" --to-kubeconfig \"$KUBECONFIG_B\"";
    let out = follow(&env, &stopped_after(&env, migrate, "apply"), "--abort");
    assert!(text(&out).contains("migrate aborted"), "{}", text(&out));
    assert!(hosted_clusters(&mgmt_b, "clusters").await.is_empty(), "the abort left demo on mgmt-b");
    env.assert_in_service("after the printed migrate --abort").await;

    // a drill kept for inspection: the printed command removes it
    let drill = "mkdir -p drills && hcp-dr drill --from \"$HCP_DR_STORE/clusters/demo/latest\" --kubeconfig \"$KUBECONFIG_B\" --report drills/demo --keep";
    let kept = run(&env, drill, &[]);
    assert!(kept.status.success(), "{}", text(&kept));
    assert_eq!(hosted_clusters(&mgmt_b, "clusters-drill").await, vec!["demo-drill".to_string()]);
    follow(&env, &kept, "--abort");
    assert!(hosted_clusters(&mgmt_b, "clusters-drill").await.is_empty(), "the drill cluster is still on mgmt-b");

    // etcd restore killed while stopping etcd: its start log names the
    // abort, which brings the writers and the pause back
    let journal = env.dir.path().join("etcd-restore.jsonl");
    let restore = format!(
        "hcp-dr etcd restore --hosted-cluster demo -n clusters --kubeconfig \"$KUBECONFIG_A\" --from \"$HCP_DR_STORE\" --backup-id latest --journal {}",
        journal.display()
    );
    let killed = killed_in(&env, &restore, &journal, "stop-etcd");
    assert!(env.writer_replicas().await.iter().all(|(_, r)| *r == 0), "the kill left the writers stopped");
    follow(&env, &killed, "--abort");
    env.assert_in_service("after the printed etcd restore --abort").await;

    // migrate stopped while waiting on mgmt-b: the printed resume finishes it
    follow(&env, &stopped_after(&env, migrate, "wait"), "--resume");
    assert_eq!(hosted_clusters(&mgmt_b, "clusters").await, vec!["demo".to_string()]);
    assert!(hosted_clusters(&env.mgmt, "clusters").await.is_empty(), "demo is still on mgmt-a");

    // demo lost on mgmt-b; a restore onto mgmt-a stopped after apply: the
    // printed resume finishes it
    let out = run(&env, "hcp-dr cluster destroy demo -n clusters --kubeconfig \"$KUBECONFIG_B\"", &[]);
    assert!(out.status.success(), "{}", text(&out));
    let restore = "hcp-dr restore --from \"$HCP_DR_STORE/clusters/demo/latest\" --kubeconfig \"$KUBECONFIG_A\"";
    let out = follow(&env, &stopped_after(&env, restore, "apply"), "--resume");
    assert_eq!(hosted_clusters(&env.mgmt, "clusters").await, vec!["demo".to_string()]);
    assert!(text(&out).contains("RPO: the backup was taken"), "the report states the RPO: {}", text(&out));
}
