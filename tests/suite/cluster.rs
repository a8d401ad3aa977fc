//! `hcp-dr cluster create`: what it renders passes the real CRD schemas (as
//! a server with them admits it: pruning nothing, no validation error) on
//! every platform, and on the sandbox it creates a cluster that becomes
//! Available.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hcp_dr_e2e::apiserver::schema::Schema;
use hcp_dr_e2e::sandbox::Sandbox;
use serde_json::{Value, json};

fn crds() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/crds");
    if dir.is_dir() {
        Some(dir)
    } else {
        println!("SKIPPED: {} is absent (the real CRDs are not on this machine)", dir.display());
        None
    }
}

fn schema(dir: &Path, file: &str) -> Schema {
    let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
    let version = crd["spec"]["versions"].as_array().unwrap().iter().find(|v| v["storage"] == json!(true)).unwrap();
    Schema::compile(&version["schema"]["openAPIV3Schema"]).expect("schema compiles")
}

fn hcp_dr(args: &[&str], dir: &Path) -> std::process::Output {
    let pull = dir.join("pull-secret.json");
    std::fs::write(&pull, r#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#).unwrap();
    let ssh = dir.join("id_ed25519.pub");
    std::fs::write(&ssh, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK demo@example\n").unwrap();
    Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(["cluster", "create", "--release-image", "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64"])
        .arg("--pull-secret")
        .arg(&pull)
        .arg("--ssh-key")
        .arg(&ssh)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn rendered_objects_pass_the_real_crd_schemas_on_every_platform() {
    let Some(dir) = crds() else { return };
    let hc_schema = schema(&dir, "hostedclusters-Hypershift-Default.crd.yaml");
    let np_schema = schema(&dir, "nodepools-Default.crd.yaml");
    let tmp = tempfile::tempdir().unwrap();
    for platform in ["none", "agent", "kubevirt", "aws"] {
        let out = hcp_dr(
            &["--name", "demo", "--platform", platform, "--render", "-o", "json", "--aws-region", "us-east-1", "--aws-role-arn-prefix", "arn:aws:iam::123456789012:role/demo", "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-oidc-bucket-url", "https://hcp-oidc.s3.us-east-1.amazonaws.com"],
            tmp.path(),
        );
        assert!(out.status.success(), "{platform}: {}", String::from_utf8_lossy(&out.stderr));
        let objects: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        for obj in objects {
            let schema = match obj["kind"].as_str() {
                Some("HostedCluster") => &hc_schema,
                Some("NodePool") => &np_schema,
                _ => continue,
            };
            let mut admitted = obj.clone();
            schema.prune(&mut admitted);
            assert_eq!(admitted, obj, "{platform}: the schema prunes fields hcp-dr wrote");
            schema.apply_defaults(&mut admitted);
            let errors: Vec<String> = schema.validate_create(&admitted).iter().map(|e| e.message()).collect();
            assert!(errors.is_empty(), "{platform} {}: {errors:#?}", obj["kind"]);
        }
    }
    // the YAML form parses back to the same objects
    let out = hcp_dr(&["--name", "demo", "--render"], tmp.path());
    let yaml: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(yaml.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_makes_an_available_cluster_and_refuses_a_second() {
    let tmp = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::up(&tmp.path().join("sb")).await.expect("sandbox");
    let kubeconfig = sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string();
    let args = ["--name", "gamma", "--availability", "SingleReplica", "--node-pool-replicas", "1", "--base-domain", hcp_dr_e2e::sandbox::BASE_DOMAIN, "--kubeconfig", &kubeconfig, "--wait", "3m", "-o", "json"];
    let out = hcp_dr(&args, tmp.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let available = hc["status"]["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "Available" && c["status"] == "True");
    assert!(available, "{hc:#}");
    let client = sandbox.clusters[0].api.client().await.unwrap();
    hcp_dr_e2e::sandbox::wait_available(&client, "clusters", "gamma", Duration::from_secs(60)).await.expect("Available");
    // the encryption key is a fresh 32-byte key
    let key = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, "clusters").get("gamma-etcd-encryption-key").await.unwrap();
    assert_eq!(key.data.unwrap()["key"].0.len(), 32);

    let out = hcp_dr(&args, tmp.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));

    // pause (a deadline), resume, scale, destroy
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
            .args(["cluster"])
            .args(args)
            .args(["--kubeconfig", &kubeconfig])
            .env("HCP_DR_STATE_DIR", tmp.path().join("state"))
            .output()
            .unwrap()
    };
    let client = sandbox.clusters[0].api.client().await.unwrap();
    let hcs = hcp_dr_e2e::sandbox::api_for(&client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": "clusters"}}));
    let nps = hcp_dr_e2e::sandbox::api_for(&client, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool", "metadata": {"namespace": "clusters"}}));
    let get = |v: kube::api::DynamicObject| serde_json::to_value(v).unwrap();
    let out = run(&["pause", "gamma", "--for", "30m"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let until = get(hcs.get("gamma").await.unwrap())["spec"]["pausedUntil"].as_str().unwrap().to_string();
    assert!(chrono::DateTime::parse_from_rfc3339(&until).is_ok(), "a deadline, never \"true\": {until}");
    assert_eq!(get(nps.get("gamma-workers").await.unwrap())["spec"]["pausedUntil"], until.as_str());
    let out = run(&["resume", "gamma"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(get(hcs.get("gamma").await.unwrap())["spec"]["pausedUntil"].is_null());
    assert!(get(nps.get("gamma-workers").await.unwrap())["spec"]["pausedUntil"].is_null());
    let out = run(&["scale", "gamma", "--node-pool", "gamma-workers", "--replicas", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(get(nps.get("gamma-workers").await.unwrap())["spec"]["replicas"], 2);
    let out = run(&["scale", "gamma", "--node-pool", "nope", "--replicas", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["destroy", "gamma", "--dry-run"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(hcs.get_opt("gamma").await.unwrap().is_some(), "a dry-run destroy deleted the cluster");
    assert!(get(hcs.get("gamma").await.unwrap())["spec"]["pausedUntil"].is_null(), "a dry-run destroy paused the cluster");
    let out = run(&["destroy", "gamma"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("journal:"), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(hcs.get_opt("gamma").await.unwrap().is_none(), "the HostedCluster is gone");
    assert!(nps.get_opt("gamma-workers").await.unwrap().is_none(), "the NodePool is gone");
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    assert!(namespaces.get_opt("clusters-gamma").await.unwrap().is_none(), "the HCP namespace is gone");
    let out = run(&["destroy", "gamma"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to destroy"));
    let out = hcp_dr(&["--name", "Bad_Name", "--render"], tmp.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--name"));
    sandbox.shutdown().await;
}
