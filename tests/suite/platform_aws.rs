//! The AWS platform's OIDC issuer on the sandbox: a cluster made by
//! `hcp-dr cluster create --platform aws`, whose issuer lives in mgmt-a's
//! OIDC bucket (each management cluster's simulated HyperShift has its own
//! bucket in the sandbox's S3, writes a cluster's documents once, marks it
//! with a finalizer, and deletes them with the cluster). The documents go
//! missing: a migration to mgmt-b rewrites them itself and its teardown of
//! the source leaves them in place; with mgmt-b lost, a restore onto mgmt-a
//! by an identity that may not write the bucket completes and says what to
//! grant and run, and that command repairs them; `cluster oidc` tells valid
//! from stale. A drill writes nothing into the source's bucket.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use hcp_dr_e2e::procs::s3_faults::{S3FaultKind, S3Faults};
use hcp_dr_e2e::sandbox::{oidc_bucket, wait_available};
use serde_json::Value;
use support::*;

const DISCOVERY: &str = ".well-known/openid-configuration";
const JWKS: &str = "openid/v1/jwks";

/// The issuer's documents as mgmt-a's bucket holds them (None: absent), parsed.
fn documents(env: &Env, infra_id: &str) -> (Option<Value>, Option<Value>) {
    let dir = env.sandbox.s3.root().join(oidc_bucket("mgmt-a")).join(infra_id);
    let read = |path: &str| std::fs::read(dir.join(path)).ok().map(|b| serde_json::from_slice::<Value>(&b).expect("a JSON document"));
    (read(DISCOVERY), read(JWKS))
}

fn lose_documents(env: &Env, infra_id: &str) {
    let dir: PathBuf = env.sandbox.s3.root().join(oidc_bucket("mgmt-a")).join(infra_id);
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("removing {}: {e}", dir.display()));
}

fn stage_output(report: &Value, stage: &str) -> Value {
    report["stages"].as_array().expect("stages").iter().find(|s| s["name"] == stage).unwrap_or_else(|| panic!("{stage} did not run: {report:#}"))["output"].clone()
}

/// `hcp-dr cluster oidc demo` against `kubeconfig`: its exit code and report.
fn oidc(env: &Env, kubeconfig: &str, repair: bool) -> (Option<i32>, Value) {
    let endpoint = env.sandbox.s3.https_url().to_string();
    let mut args = vec!["cluster", "oidc", "demo", "-n", "clusters", "--kubeconfig", kubeconfig, "--s3-endpoint", &endpoint, "-o", "json"];
    if repair {
        args.push("--repair");
    }
    let out = env.hcp_dr(&args, &[]);
    (out.status.code(), serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("no JSON report: {}", text(&out))))
}

async fn aws_env() -> Env {
    let env = bare_env().await;
    let bucket_url = format!("{}/{}", env.sandbox.s3.https_url().trim_end_matches('/'), oidc_bucket("mgmt-a"));
    let out = create_demo(
        &env,
        &[
            "--platform", "aws", "--node-pool-replicas", "1", "--aws-region", "us-east-1", "--aws-role-arn-prefix", "arn:aws:iam::123456789012:role/demo",
            "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-oidc-bucket-url", &bucket_url,
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available");
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_oidc_issuer_is_checked_and_repaired_after_a_migration_and_a_restore() {
    let mut env = aws_env().await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    let (a, b) = (env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string(), env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string());
    let hc = hc_on(&env.mgmt).await.expect("demo on mgmt-a");
    let infra_id = hc["spec"]["infraID"].as_str().expect("infraID").to_string();
    let issuer = hc["spec"]["issuerURL"].as_str().expect("issuerURL").to_string();
    assert_eq!(issuer, format!("{endpoint}/{}/{infra_id}", oidc_bucket("mgmt-a")), "the issuer names the infraID in mgmt-a's OIDC bucket");

    // what mgmt-a's HyperShift wrote, and hcp-dr agrees it publishes the key
    let written = documents(&env, &infra_id);
    assert!(written.0.is_some() && written.1.is_some(), "mgmt-a's operator wrote no issuer documents");
    let (code, report) = oidc(&env, &a, false);
    assert_eq!((code, report["state"].as_str()), (Some(0), Some("valid")), "{report:#}");
    assert!(report["iam"].to_string().contains("arn:aws:iam::123456789012:oidc-provider/"), "{report:#}");

    let (folder, _) = backup_to_s3(&env);

    // a drill on mgmt-b gets an issuer of its own, writes nothing into the
    // source's bucket, and names the IAM roles it shares with the source
    let out = env.hcp_dr(&["drill", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &b, "--wait", "5m", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let drill = json_report(&out);
    let rewrite = stage_output(&drill, "rewrite");
    assert_eq!(rewrite["infra_id"]["from"], infra_id.as_str(), "{rewrite:#}");
    assert_ne!(rewrite["infra_id"]["to"], infra_id.as_str(), "{rewrite:#}");
    let kept: Vec<&str> = rewrite["kept"].as_array().expect("kept").iter().filter_map(|k| k["value"].as_str()).collect();
    for role in hc["spec"]["platform"]["aws"]["rolesRef"].as_object().expect("rolesRef").values() {
        assert!(kept.contains(&role.as_str().unwrap()), "the drill report does not name the shared role {role}: {kept:?}");
    }
    let prefixes: Vec<String> = std::fs::read_dir(env.sandbox.s3.root().join(oidc_bucket("mgmt-a"))).expect("mgmt-a's OIDC bucket").map(|e| e.unwrap().file_name().to_string_lossy().to_string()).filter(|n| !n.starts_with('.')).collect();
    assert_eq!(prefixes, [infra_id.clone()], "the drill wrote into the source's OIDC bucket");
    assert_eq!(documents(&env, &infra_id), written, "the drill changed the source's issuer");

    // the documents go missing; a migration to mgmt-b finds them so and
    // rewrites them, and tearing the source down does not let mgmt-a's
    // HyperShift delete them (its finalizers are removed first)
    lose_documents(&env, &infra_id);
    let args = migrate_json_args(&env);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let migrated = json_report(&out);
    let checked = stage_output(&migrated, "oidc-issuer");
    assert_eq!(checked["state"], "repaired", "{checked:#}");
    assert!(checked["problems"].to_string().contains("does not exist"), "{checked:#}");
    let b_client = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    wait_available(&b_client, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available on mgmt-b");
    assert!(hc_on(&env.mgmt).await.is_none(), "demo is still on mgmt-a");
    assert_eq!(documents(&env, &infra_id), written, "the issuer is not as HyperShift wrote it after the migration");
    assert_eq!(oidc(&env, &b, false).0, Some(0));

    // mgmt-b is lost, and the documents with it; the cluster is restored on
    // mgmt-a (whose HyperShift never writes them again: the restored cluster
    // carries its finalizer) by an identity that may not write the bucket:
    // the restore completes, and says what to grant and run
    let backup = migrated["backup"].as_str().expect("the migration's backup").to_string();
    env.sandbox.lose("mgmt-b").await.expect("lose mgmt-b");
    lose_documents(&env, &infra_id);
    let deny = S3Faults { share: 1.0, kinds: vec![S3FaultKind::AccessDenied], methods: vec!["PUT".into()], path_prefix: Some(format!("/{}/", oidc_bucket("mgmt-a"))), ..S3Faults::default() };
    env.sandbox.s3.set_faults(Some(&deny)).expect("faults");
    let out = env.hcp_dr(&["restore", "--from", &backup, "--s3-endpoint", &endpoint, "--kubeconfig", &a, "--wait", "5m", "-o", "json"], &[]);
    env.sandbox.s3.set_faults(None).expect("faults off");
    assert!(out.status.success(), "a bucket hcp-dr cannot write must not fail the restore: {}", text(&out));
    let restored = json_report(&out);
    let checked = stage_output(&restored, "oidc-issuer");
    assert_eq!(checked["state"], "stale", "{checked:#}");
    let warnings = restored["warnings"].to_string();
    for needed in ["does not exist", "s3:PutObject", "hcp-dr cluster oidc demo --namespace clusters --repair", "WebIdentityErr"] {
        assert!(warnings.contains(needed), "the restore's warnings do not say `{needed}`: {warnings}");
    }
    assert_eq!(documents(&env, &infra_id), (None, None), "something wrote the documents although the bucket refused it");

    // once allowed, the command the warning names repairs them, as HyperShift wrote them
    let (code, report) = oidc(&env, &a, false);
    assert_eq!((code, report["state"].as_str()), (Some(1), Some("stale")), "{report:#}");
    let (code, report) = oidc(&env, &a, true);
    assert_eq!((code, report["state"].as_str()), (Some(0), Some("repaired")), "{report:#}");
    assert_eq!(documents(&env, &infra_id), written, "the repaired documents differ from the ones HyperShift wrote");
    assert_eq!(oidc(&env, &a, false).0, Some(0));
}
