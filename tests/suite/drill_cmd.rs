//! `hcp-dr drill` on the sandbox: a backup of `demo` taken on mgmt-a is
//! restored on mgmt-b (the staging cluster) as `clusters-drill/demo-drill`,
//! checked against the backup, reported (RTO, RPO, every check) and removed
//! (kept with --keep), while the source and its DNS records are left alone.
//! A tampered backup fails in verify and leaves the staging cluster
//! untouched; a stage failing later removes what the drill created (kept
//! with --keep, then removed by --abort); local and encrypted backups drill
//! too. The rewritten objects pass the real CRD schemas. (`tests/suite/drill.rs`
//! is the sandbox's own DR drill.)

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hcp_dr::stages::drill::rewrite::{ClusterRef, DrillIdentity, rewrite};
use hcp_dr_e2e::apiserver::schema::Schema;
use hcp_dr_e2e::drill::{WORKLOAD_NS, WORKLOAD_OBJECTS, hosted_client};
use hcp_dr_e2e::sandbox::{BASE_DOMAIN, BUCKET, wait_available};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::Api;
use serde_json::{Value, json};
use support::*;

fn crds() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/crds");
    if dir.is_dir() {
        Some(dir)
    } else {
        println!("SKIPPED the CRD schema checks: {} is absent (the real CRDs are not on this machine)", dir.display());
        None
    }
}

/// The storage version's schema of a CRD file.
fn schema(dir: &Path, file: &str) -> Schema {
    let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
    let version = crd["spec"]["versions"].as_array().unwrap().iter().find(|v| v["storage"] == json!(true)).unwrap();
    Schema::compile(&version["schema"]["openAPIV3Schema"]).expect("schema compiles")
}

/// Every rewritten object of a kind the real CRDs define is admitted as it
/// is: nothing pruned, no validation error (CEL rules included). Returns the
/// kinds checked.
fn assert_admitted(objects: &[Value], context: &str) -> Vec<String> {
    let Some(dir) = crds() else { return Vec::new() };
    let schemas = [
        ("HostedCluster", "hostedclusters-Hypershift-Default.crd.yaml"),
        ("NodePool", "nodepools-Default.crd.yaml"),
        ("HostedControlPlane", "hostedcontrolplanes-Hypershift-Default.crd.yaml"),
        ("Cluster", "cluster.x-k8s.io_clusters.yaml"),
    ];
    let mut checked = Vec::new();
    for obj in objects {
        let Some((kind, file)) = schemas.iter().find(|(k, _)| obj["kind"] == *k) else { continue };
        let schema = schema(&dir, file);
        let mut admitted = obj.clone();
        let pruned = schema.prune(&mut admitted);
        assert!(pruned.is_empty(), "{context}: the {kind} schema prunes {pruned:?} of the rewritten object");
        schema.apply_defaults(&mut admitted);
        let errors: Vec<String> = schema.validate_create(&admitted).iter().map(|e| e.message()).collect();
        assert!(errors.is_empty(), "{context}: rewritten {kind}: {errors:#?}\n{obj:#}");
        checked.push(kind.to_string());
    }
    checked
}

fn identity(namespace: &str, name: &str) -> DrillIdentity {
    let random: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
    DrillIdentity::new(ClusterRef::new(namespace, name), "-drill", &random).unwrap()
}

/// `hcp-dr cluster create --render` of `demo` on `platform`: the objects
/// `hcp create cluster --render` would give.
fn rendered(platform: &str, dir: &Path) -> Vec<Value> {
    let pull = dir.join("pull-secret.json");
    std::fs::write(&pull, r#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
        .args(["cluster", "create", "--name", "demo", "--platform", platform, "--render", "-o", "json"])
        .args(["--release-image", "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64", "--pull-secret"])
        .arg(&pull)
        .args(["--aws-region", "us-east-1", "--aws-role-arn-prefix", "arn:aws:iam::123456789012:role/demo", "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-oidc-bucket-url", "https://hcp-oidc.s3.us-east-1.amazonaws.com"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{platform}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn rewritten_clusters_pass_the_real_crd_schemas_on_every_platform() {
    let tmp = tempfile::tempdir().unwrap();
    for platform in ["none", "agent", "kubevirt", "aws"] {
        let mut objects = rendered(platform, tmp.path());
        // what HyperShift adds once it reconciled the cluster
        let hc = objects.iter_mut().find(|o| o["kind"] == "HostedCluster").unwrap();
        // (on AWS `cluster create` chose the infraID, which its issuer URL names)
        if hc["spec"]["infraID"].is_null() {
            hc["spec"]["infraID"] = json!("demo-x7k2p");
        }
        hc["spec"]["clusterID"] = json!("2b1f3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d");
        let id = identity("clusters", "demo");
        let (rewritten, report) = rewrite(&objects, &id).unwrap_or_else(|e| panic!("{platform}: {e}"));
        let hc = rewritten.iter().find(|o| o["kind"] == "HostedCluster").unwrap();
        assert_eq!(hc["metadata"]["name"], "demo-drill");
        assert_eq!(hc["spec"]["clusterID"], id.cluster_id.as_str());
        assert!(report.hostnames.iter().all(|h| h.to.contains("demo-drill")), "{platform}: {:?}", report.hostnames);
        let checked = assert_admitted(&rewritten, platform);
        if crds().is_some() {
            assert_eq!(checked, ["HostedCluster", "NodePool"], "{platform}");
        }
    }
}

fn mgmt_b(env: &Env) -> String {
    env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string()
}

async fn mgmt_b_client(env: &Env) -> kube::Client {
    env.sandbox.clusters[1].api.client().await.expect("mgmt-b client")
}

/// Nothing of the drill is left on the staging cluster.
async fn assert_no_drill(b: &kube::Client, context: &str) {
    assert!(hc_api(b, "clusters-drill").get_opt("demo-drill").await.unwrap().is_none(), "{context}: the drill's HostedCluster is left");
    let namespaces: Api<Namespace> = Api::all(b.clone());
    for ns in ["clusters-drill", "clusters-drill-demo-drill"] {
        assert!(namespaces.get_opt(ns).await.unwrap().is_none(), "{context}: namespace {ns} is left");
    }
}

/// The source is as it was: Available on mgmt-a, in service, its workloads there.
async fn assert_source_untouched(env: &Env, context: &str) {
    env.assert_in_service(context).await;
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(30)).await.unwrap_or_else(|e| panic!("{context}: demo not Available on mgmt-a: {e}"));
    let hosted = hosted_client(&env.mgmt, "clusters", "demo").await.expect("hosted client of the source");
    let cms = Api::<ConfigMap>::namespaced(hosted, WORKLOAD_NS).list(&Default::default()).await.expect("source configmaps");
    assert_eq!(cms.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("config-"))).count(), WORKLOAD_OBJECTS, "{context}");
}

fn objects_of(backup_dir: &Path) -> Vec<Value> {
    let tarball = std::fs::File::open(backup_dir.join("objects.tar.gz")).expect("objects.tar.gz");
    hcp_dr::archive::objects::read_tar_gz(tarball).expect("objects").into_iter().map(|(_, v)| v).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drill_restores_the_backup_on_staging_checks_it_reports_and_removes_it() {
    let env = env("HighlyAvailable").await;
    let (api_host, drill_host) = (format!("api.demo.{BASE_DOMAIN}"), format!("api.demo-drill.{BASE_DOMAIN}"));
    wait_owners(&env, &api_host, &["mgmt-a"], Duration::from_secs(60), "before the drill").await;
    let (folder, revision) = backup_to_s3(&env);

    // the real backup's objects, rewritten, pass the real CRD schemas
    let key = folder.strip_prefix(&format!("s3://{BUCKET}/")).unwrap();
    let on_disk = env.sandbox.s3.root().join(BUCKET).join(key);
    let (rewritten, _) = rewrite(&objects_of(&on_disk), &identity("clusters", "demo")).expect("the backup rewrites");
    let checked = assert_admitted(&rewritten, "the sandbox backup");
    if crds().is_some() {
        for kind in ["HostedCluster", "NodePool", "HostedControlPlane", "Cluster"] {
            assert!(checked.iter().any(|k| k == kind), "{kind} not checked: {checked:?}");
        }
    }

    let endpoint = env.sandbox.s3.https_url().to_string();
    let staging = mgmt_b(&env);
    let report_base = env.dir.path().join("drill-report");
    let drill = ["drill", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &staging, "--wait", "5m", "--report", report_base.to_str().unwrap(), "-o", "json"];
    let out = env.hcp_dr(&drill, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let result = json_report(&out);
    assert_eq!(result["outcome"], "succeeded", "{result:#}");
    assert_eq!(result["passed"], true, "{result:#}");
    assert_eq!(result["source"], "clusters/demo");
    assert_eq!(result["drill"], "clusters-drill/demo-drill");
    assert_eq!(result["drill_cluster"], "removed");
    let rto = result["rto_seconds"].as_f64().expect("RTO");
    let rpo = result["rpo_seconds"].as_f64().expect("RPO");
    assert!(rto > 0.0 && rto < 300.0, "RTO {rto}");
    assert!(rpo > 0.0 && rpo < 3600.0, "RPO {rpo}");
    let checks = result["checks"].as_array().expect("checks");
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for expected in [
        "etcd members",
        "etcd one cluster",
        "etcd revision etcd-0",
        "etcd revision etcd-1",
        "etcd revision etcd-2",
        "etcd keys etcd-0",
        "etcd keys etcd-1",
        "etcd keys etcd-2",
        "hosted API samples",
        "nodes Ready demo-drill-workers",
        "DNS isolation",
    ] {
        assert!(names.contains(&expected), "no check `{expected}` in {names:?}");
    }
    assert!(checks.iter().all(|c| c["passed"] == true), "{checks:#?}");
    let samples = checks.iter().find(|c| c["name"] == "hosted API samples").unwrap()["detail"].as_str().unwrap();
    assert!(samples.contains("configmaps/") && samples.contains("secrets/"), "{samples}");
    let rewrite = &result["rewrite"];
    assert_eq!(rewrite["hcp_namespace"], json!({"from": "clusters-demo", "to": "clusters-drill-demo-drill"}));
    assert_ne!(rewrite["infra_id"]["from"], rewrite["infra_id"]["to"]);
    assert!(rewrite["cluster_id"]["to"].as_str().is_some_and(|id| id.len() == 36));
    for host in rewrite["hostnames"].as_array().unwrap() {
        assert!(host["to"].as_str().unwrap().contains(".demo-drill."), "{host}");
    }
    let wait = result["stages"].as_array().unwrap().iter().find(|s| s["name"] == "wait").unwrap()["output"].clone();
    assert!(wait["revisions"].as_object().unwrap().values().all(|r| r.as_i64().unwrap() >= revision), "{wait}");
    // HighlyAvailable: hcp-dr seeded the members' volumes, and they are one cluster
    let seeded = result["stages"].as_array().unwrap().iter().find(|s| s["name"] == "etcd-seed").unwrap()["output"].clone();
    assert_eq!(seeded["mode"], "volumes", "{seeded}");
    assert_eq!(wait["etcd"]["members"], json!(["etcd-0", "etcd-1", "etcd-2"]), "{wait}");
    let one = checks.iter().find(|c| c["name"] == "etcd one cluster").unwrap()["detail"].as_str().unwrap();
    assert!(one.contains("every member lists etcd-0, etcd-1, etcd-2"), "{one}");
    // nothing secret in the output
    let printed = text(&out);
    assert!(!printed.contains("X-Amz-Signature"), "a presigned URL was printed");
    assert!(!printed.contains("PRIVATE KEY"), "key material was printed");

    // the report, in both forms
    let md = std::fs::read_to_string(report_base.with_extension("md")).expect("report.md");
    assert!(md.starts_with("# Restore drill of clusters/demo: PASSED"), "{md}");
    assert!(md.contains("**RTO**") && md.contains("**RPO**"), "{md}");
    assert!(md.contains("| etcd keys etcd-0 | pass |"), "{md}");
    assert!(md.contains("| hostname | `api.demo.sandbox.hcp-dr.test` | `api.demo-drill.sandbox.hcp-dr.test` |"), "{md}");
    assert!(md.contains("## Stage timings") && md.contains("█"), "{md}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(report_base.with_extension("json")).expect("report.json")).unwrap();
    assert_eq!(json["passed"], true);
    assert_eq!(json["rto_seconds"], result["rto_seconds"]);
    assert_eq!(json["checks"], result["checks"]);

    // gone from staging, and the source never touched
    let b = mgmt_b_client(&env).await;
    assert_no_drill(&b, "after the drill").await;
    assert_source_untouched(&env, "after the drill").await;
    wait_owners(&env, &drill_host, &[], Duration::from_secs(60), "after the drill").await;
    assert_eq!(owners_of(&env, &api_host).await, ["mgmt-a"], "the drill touched the source's DNS records");

    // --keep leaves the drill cluster Available on staging
    let mut keep = drill.to_vec();
    keep.retain(|a| *a != "--report" && !a.ends_with("drill-report"));
    keep.push("--keep");
    let out = env.hcp_dr(&keep, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let kept = json_report(&out);
    assert_eq!(kept["passed"], true, "{kept:#}");
    assert_eq!(kept["drill_cluster"], "kept");
    let remove = kept["remove_with"].as_str().expect("how to remove the kept cluster");
    assert_eq!(remove, format!("hcp-dr drill --abort {}", kept["journal"].as_str().unwrap()));
    wait_available(&b, "clusters-drill", "demo-drill", Duration::from_secs(60)).await.expect("the kept drill cluster is Available");
    let hc = serde_json::to_value(hc_api(&b, "clusters-drill").get("demo-drill").await.unwrap()).unwrap();
    assert_eq!(hc["spec"]["infraID"], kept["rewrite"]["infra_id"]["to"]);
    assert!(hc["metadata"]["annotations"]["hcp-dr.openshift.io/restored-from"].as_str().is_some_and(|f| f.contains("clusters/demo/")));
    // the kept copy serves the backup's data under its own address
    let hosted = hosted_client(&b, "clusters-drill", "demo-drill").await.expect("hosted client of the drill");
    let cms = Api::<ConfigMap>::namespaced(hosted, WORKLOAD_NS).list(&Default::default()).await.expect("drill configmaps");
    assert_eq!(cms.items.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with("config-"))).count(), WORKLOAD_OBJECTS);
    assert_source_untouched(&env, "after the kept drill").await;
    // the kept drill publishes its own name from staging; the source keeps its own
    wait_owners(&env, &drill_host, &["mgmt-b"], Duration::from_secs(60), "the kept drill").await;
    assert_eq!(owners_of(&env, &api_host).await, ["mgmt-a"], "the kept drill took the source's DNS records");

    // its printed remove_with, as printed, removes it (UID-guarded, on the
    // cluster its journal names) and leaves the source alone
    let words: Vec<&str> = remove.split(' ').collect();
    let out = env.hcp_dr(&[&words[1..], &["-o", "json"]].concat(), &[]);
    assert!(out.status.success(), "{remove}\n{}", text(&out));
    assert_eq!(json_report(&out)["drill_cluster"], "removed_by_abort");
    assert_no_drill(&b, "after removing the kept drill").await;
    assert_source_untouched(&env, "after removing the kept drill").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tampered_backups_fail_in_verify_and_failed_drills_leave_staging_clean() {
    let env = env("SingleReplica").await;
    let (store, backup) = (env.local_store(), backup_to_local(&env));
    let staging = mgmt_b(&env);
    let endpoint = env.sandbox.s3.https_url().to_string();
    let stage_to = format!("s3://{BUCKET}/staging");
    let b = mgmt_b_client(&env).await;
    let namespaces: Api<Namespace> = Api::all(b.clone());
    let before: Vec<String> = namespaces.list(&Default::default()).await.unwrap().items.into_iter().filter_map(|n| n.metadata.name).collect();

    for file in ["etcd/etcd-0.db", "objects.tar.gz"] {
        let copy = tampered_copy(&store, &backup, file, env.dir.path());
        let report = env.dir.path().join(format!("tampered-{}.md", file.replace('/', "-")));
        let out = env.hcp_dr(
            &["drill", "--from", copy.to_str().unwrap(), "--kubeconfig", &staging, "--stage-snapshot-to", &stage_to, "--s3-endpoint", &endpoint, "--report", report.to_str().unwrap(), "-o", "json"],
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{file}: {}", text(&out));
        let result = json_report(&out);
        assert_eq!(result["passed"], false, "{file}");
        assert_eq!(result["stage"], "verify", "{file}: {result:#}");
        assert!(result["error"].as_str().unwrap().contains("damaged or was tampered with"), "{file}: {}", result["error"]);
        assert_eq!(result["drill_cluster"], "never_created", "{file}");
        let md = std::fs::read_to_string(report.with_extension("md")).expect("a failed drill has a report too");
        assert!(md.contains("FAILED at `verify`") && md.contains("damaged or was tampered with"), "{file}: {md}");
        assert!(md.contains("No check ran"), "{md}");
        let after: Vec<String> = namespaces.list(&Default::default()).await.unwrap().items.into_iter().filter_map(|n| n.metadata.name).collect();
        assert_eq!(after, before, "{file}: the staging cluster was changed");
        assert!(!env.sandbox.s3.root().join(BUCKET).join("staging").exists(), "{file}: a snapshot copy was staged");
    }

    // bad input: exit 2, said what to fix, nothing changed
    let from = backup.to_str().unwrap();
    let missing_dir = env.dir.path().join("no/such/dir/report");
    for (args, expect) in [
        (vec!["drill", "--from", from, "--kubeconfig", &staging, "--name-suffix", "-Drill"], "--name-suffix"),
        (vec!["drill", "--from", from, "--kubeconfig", &staging, "--name-suffix", "-drill-"], "--name-suffix"),
        (vec!["drill", "--from", from], "--kubeconfig"),
        (vec!["drill", "--from", from, "--kubeconfig", &staging, "--report", missing_dir.to_str().unwrap()], "does not exist"),
        (vec!["drill", "--from", "/tmp/x/clusters/demo/latest", "--kubeconfig", &staging], "no complete backup"),
    ] {
        let out = env.hcp_dr(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(expect), "{args:?}: {}", text(&out));
    }

    // the untampered local backup drills fine (its snapshot staged in S3 for
    // etcd's download, and the copy deleted afterwards)
    let out = env.hcp_dr(
        &["drill", "--from", from, "--kubeconfig", &staging, "--stage-snapshot-to", &stage_to, "--s3-endpoint", &endpoint, "--wait", "5m", "-o", "json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let result = json_report(&out);
    assert_eq!(result["passed"], true, "{result:#}");
    let names: Vec<&str> = result["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"etcd revision etcd-0") && !names.contains(&"etcd revision etcd-1"), "{names:?}");
    let url = &result["stages"].as_array().unwrap().iter().find(|s| s["name"] == "snapshot-url").unwrap()["output"];
    assert_eq!(url["staged"], true, "{url}");
    let staged = env.sandbox.s3.root().join(BUCKET).join("staging").join(url["key"].as_str().unwrap());
    assert!(!staged.exists(), "the staged snapshot copy {} was not deleted", staged.display());
    assert_no_drill(&b, "after the local drill").await;
    assert_source_untouched(&env, "after the local drill").await;

    // a stage failing after the drill cluster was created: everything the
    // drill created is removed again, and the report says where it failed
    let drill = ["drill", "--from", from, "--kubeconfig", &staging, "--stage-snapshot-to", &stage_to, "--s3-endpoint", &endpoint, "--wait", "5m", "-o", "json"];
    let out = env.hcp_dr(&drill, &[("HCP_DR_TEST_FAIL_AFTER", "wait")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let failed = json_report(&out);
    assert_eq!((failed["outcome"].as_str(), failed["stage"].as_str()), (Some("rolled_back"), Some("wait")), "{failed:#}");
    assert_eq!(failed["drill_cluster"], "removed_after_failure");
    assert_no_drill(&b, "after the failed drill").await;

    // with --keep a failure leaves the drill cluster for inspection; --abort removes it
    let mut keep = drill.to_vec();
    keep.push("--keep");
    let out = env.hcp_dr(&keep, &[("HCP_DR_TEST_FAIL_AFTER", "wait")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stopped = json_report(&out);
    assert_eq!((stopped["outcome"].as_str(), stopped["drill_cluster"].as_str()), (Some("stopped"), Some("kept")), "{stopped:#}");
    assert!(hc_api(&b, "clusters-drill").get_opt("demo-drill").await.unwrap().is_some(), "--keep removed the drill cluster");
    let journal = stopped["journal"].as_str().unwrap().to_string();
    assert_eq!(stopped["remove_with"], format!("hcp-dr drill --abort {journal}"));
    let out = env.hcp_dr(&["drill", "--abort", &journal, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json_report(&out)["aborted"], true);
    assert_no_drill(&b, "after --abort").await;
    assert_source_untouched(&env, "after the failed drills").await;

    // an encrypted backup drills with its identity (the snapshot etcd
    // downloads is a decrypted copy staged in S3, deleted afterwards), and
    // is refused without it before anything changes
    let (identity, recipient) = age_key_file(env.dir.path(), "drill.key");
    let mut args = vec!["backup", "--hosted-cluster", "demo", "--encrypt-to", &recipient, "-o", "json"];
    let s3 = env.s3_args();
    args.extend(s3.iter().map(String::as_str));
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let encrypted = json_report(&out)["backup"].as_str().unwrap().to_string();
    let out = env.hcp_dr(&["drill", "--from", &encrypted, "--kubeconfig", &staging, "--s3-endpoint", &endpoint], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--identity"), "{}", text(&out));
    assert_no_drill(&b, "after the refused encrypted drill").await;
    let identity = identity.to_str().unwrap();
    let out = env.hcp_dr(&["drill", "--from", &encrypted, "--kubeconfig", &staging, "--s3-endpoint", &endpoint, "--identity", identity, "--wait", "5m", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let result = json_report(&out);
    assert_eq!(result["passed"], true, "{result:#}");
    let url = &result["stages"].as_array().unwrap().iter().find(|s| s["name"] == "snapshot-url").unwrap()["output"];
    assert_eq!(url["staged"], true, "{url}");
    let copy = env.sandbox.s3.root().join(BUCKET).join("backups").join(url["key"].as_str().unwrap());
    assert!(!copy.exists(), "the decrypted snapshot copy {} was not deleted", copy.display());
    assert_no_drill(&b, "after the encrypted drill").await;
}
