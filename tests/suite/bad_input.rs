//! The bad-input catalogue: flags, files, journals, playbooks, stores,
//! kubeconfigs and unreachable endpoints, across every command. Each case
//! asserts the exit code, that the message names the problem, and that
//! nothing changed: the hosted cluster and its NodePools (their metadata
//! and spec; the operator keeps writing status), the writers' replicas, the store's files and the
//! journal directory. No case may panic.

use crate::support;

use std::path::Path;

use hcp_dr_e2e::sandbox::api_for;
use serde_json::json;
use support::*;

/// What must not change: resourceVersions of the HostedCluster and its
/// NodePools, writer replicas, every file of the store, the journals.
async fn fingerprint(env: &Env, store: &Path) -> String {
    let hc = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"namespace": env.spec.namespace}}));
    let np = api_for(&env.mgmt, &json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool", "metadata": {"namespace": env.spec.namespace}}));
    // what a client changes (the operator keeps writing status meanwhile)
    let desired = |o: kube::api::DynamicObject| {
        let v = serde_json::to_value(o).unwrap();
        let m = &v["metadata"];
        json!([m["name"], m["generation"], m["labels"], m["annotations"], m["finalizers"], m["deletionTimestamp"], v["spec"]]).to_string()
    };
    let mut out = format!("hc {}\n", desired(hc.get(&env.spec.name).await.expect("hc")));
    for item in np.list(&Default::default()).await.expect("nodepools").items {
        out.push_str(&format!("np {}\n", desired(item)));
    }
    out.push_str(&format!("writers {:?}\n", env.writer_replicas().await));
    for f in files(store) {
        let meta = std::fs::metadata(store.join(&f)).expect("store file");
        out.push_str(&format!("store {f} {} {:?}\n", meta.len(), meta.modified().ok()));
    }
    out.push_str(&format!("journals {:?}\n", files(&env.dir.path().join("state"))));
    out
}

/// One case: the arguments, the exit code, and what the message must say.
struct Case {
    args: Vec<String>,
    code: i32,
    says: Vec<&'static str>,
}

fn case(args: &[&str], code: i32, says: &[&'static str]) -> Case {
    Case { args: args.iter().map(|s| s.to_string()).collect(), code, says: says.to_vec() }
}

fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster: {{server: \"{server}\"}}\ncontexts:\n- name: x\n  context: {{cluster: x, user: u}}\nusers:\n- name: u\n  user: {{token: t}}\ncurrent-context: x\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_command_refuses_bad_input_cleanly_and_changes_nothing() {
    let env = env("SingleReplica").await;
    let store = env.local_store();
    // one real backup, for the cases that need a backup to exist
    let backup = backup_to_local(&env);
    let backup = backup.to_str().unwrap().to_string();
    let s = store.to_str().unwrap().to_string();
    let files = tempfile::tempdir().unwrap();
    let file = |name: &str, body: &str| {
        let p = files.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_string()
    };
    let not_yaml = file("not-yaml.yaml", "stages: [unclosed\n");
    let foreign_playbook = file("restore.yaml", "operation: restore\nstages:\n  - verify\n");
    let unknown_stage = file("unknown-stage.yaml", "operation: backup\nstages:\n  - preflight\n  - teleport\n");
    let garbage_journal = file("garbage.jsonl", "this is not a journal\n");
    let empty_journal = file("empty.jsonl", "");
    let garbage_kubeconfig = file("garbage.kubeconfig", "clusters: [\n");
    let unreachable = file("unreachable.kubeconfig", &kubeconfig("https://127.0.0.1:1"));
    let not_pem = file("not.pem", "not a certificate\n");
    let pull_secret = file("pull-secret.json", r#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#);
    let not_identity = file("identity.txt", "AGE-SECRET-KEY-NOTREALLY\n");
    // S3 Object Lock (issue 39): the sandbox's s3s-fs has none
    let s3_endpoint = env.sandbox.s3.https_url().to_string();
    let unlocked = format!("s3://{}/locked", hcp_dr_e2e::sandbox::BUCKET);
    let junk_snapshot = file("junk.db", "junk");
    let kc_a = env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string();
    let latest = format!("{s}/clusters/demo/latest");
    let empty_store = files.path().join("empty-store").to_str().unwrap().to_string();
    let nothing = format!("{empty_store}/clusters/demo/latest");

    // a journal of another operation: the backup's own, offered to restore
    let backup_journal = {
        let journals = env.dir.path().join("state/journals");
        let found = std::fs::read_dir(&journals).expect("journals").flatten().map(|e| e.path()).find(|p| p.to_string_lossy().contains("backup-"));
        let copy = files.path().join("backup-journal.jsonl");
        std::fs::copy(found.expect("the backup's journal"), &copy).unwrap();
        copy.to_str().unwrap().to_string()
    };

    let cases = vec![
        // backup: flags
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--pause-ttl", "30s"], 2, &["--pause-ttl", "too short", "1m to 7d"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--pause-ttl", "99999999999999999999s"], 2, &["--pause-ttl", "too long"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--wait-timeout", "7h"], 2, &["--wait-timeout", "at most 6h"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--operator-ack-timeout", "soon"], 2, &["--operator-ack-timeout", "not a duration"]),
        case(&["backup", "--hosted-cluster", "Bad_Name", "--to", &s], 2, &["Bad_Name", "not a valid Kubernetes name"]),
        case(&["backup", "--all", "--concurrency", "0", "--to", &s], 2, &["--concurrency", "0"]),
        case(&["backup", "--all", "--concurrency", "65", "--to", &s], 2, &["--concurrency", "65"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--sse", "kms:"], 2, &["--sse", "kms:KEY-ID"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--route53-zone", "not a zone"], 2, &["--route53-zone"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--encrypt-to", "not-a-recipient"], 2, &["not-a-recipient"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--volume-snapshot-class", "Fast_Snaps"], 2, &["--volume-snapshot-class", "Fast_Snaps", "not a valid Kubernetes name"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--mover-image", "Quay.io/HCP DR"], 2, &["--mover-image", "not a container image reference"]),
        case(&["restore", "--from", &s, "--mover-image", "quay.io/HcpDr/mover:v1"], 2, &["--mover-image", "repository in lowercase"]),
        case(&["restore", "--from", &s, "--etcd-seed", "disk"], 2, &["--etcd-seed", "possible values: volumes, url"]),
        case(&["restore", "--from", &s, "--bump-revision", "0"], 2, &["--bump-revision", "0 is not in 1..="]),
        case(&["drill", "--from", &s, "--etcd-image", "Quay.io/Etcd"], 2, &["--etcd-image", "container image reference"]),
        case(&["migrate", "--hosted-cluster", "demo", "--bump-revision", "many"], 2, &["--bump-revision", "invalid digit"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--include-root-disks", "--skip-guest-volumes"], 2, &["--include-root-disks", "--skip-guest-volumes", "cannot be used with"]),
        case(&["migrate", "--hosted-cluster", "demo", "--include-root-disks", "--skip-guest-volumes"], 2, &["--include-root-disks", "cannot be used with"]),
        // backup: stores
        case(&["backup", "--hosted-cluster", "demo", "--to", "ftp://host/path"], 2, &["ftp://host/path", "unsupported scheme"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", "s3://"], 2, &["s3://", "no bucket"]),
        case(&["backup", "--hosted-cluster", "demo"], 2, &["--to"]),
        // backup: files
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--etcd-ca", "/nonexistent/ca.pem"], 2, &["--etcd-ca", "/nonexistent/ca.pem"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--etcd-cert", &not_pem], 2, &["--etcd-cert and --etcd-key"]),
        // backup: playbooks
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--playbook", "/nonexistent/playbook.yaml"], 2, &["playbook", "/nonexistent/playbook.yaml"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--playbook", &not_yaml], 2, &["playbook", "not-yaml.yaml"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--playbook", &foreign_playbook], 2, &["restore"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--playbook", &unknown_stage], 2, &["teleport"]),
        // backup: journals
        case(&["backup", "--resume", &garbage_journal], 2, &["garbage.jsonl"]),
        case(&["backup", "--resume", &empty_journal], 2, &["empty.jsonl", "no header"]),
        case(&["backup", "--resume", "/nonexistent/journal.jsonl"], 2, &["/nonexistent/journal.jsonl"]),
        case(&["restore", "--resume", &backup_journal], 2, &["is a `backup` journal", "hcp-dr backup"]),
        // kubeconfigs and endpoints
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--kubeconfig", "/nonexistent/kubeconfig"], 2, &["kubeconfig", "/nonexistent/kubeconfig"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--kubeconfig", &garbage_kubeconfig], 2, &["kubeconfig", "garbage.kubeconfig"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--context", "no-such-context"], 2, &["no-such-context"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--kubeconfig", &unreachable], 1, &["https://127.0.0.1:1", "Connection refused"]),
        case(&["etcd", "status", "--hosted-cluster", "demo", "--kubeconfig", &unreachable], 1, &["reading HostedCluster clusters/demo", "Connection refused"]),
        // backups
        case(&["backups", "list", "--store", "ftp://host/path"], 2, &["ftp://host/path"]),
        case(&["backups", "describe", &format!("{s}/clusters/demo")], 2, &["<namespace>/<cluster>/<backup-id>"]),
        case(&["backups", "verify", &nothing], 2, &["no complete backup"]),
        case(&["backups", "verify", &format!("{s}/clusters/demo/stream")], 2, &["clusters/demo has no stream chain"]),
        case(&["backups", "verify", "--deep", &format!("{s}/clusters/demo/stream")], 2, &["has no stream chain"]),
        case(&["backups", "prune", "--store", &s, "--keep-stream", "5 fortnights"], 2, &["--keep-stream", "1h to 36500d"]),
        case(&["backups", "prune", "--store", &s], 2, &["--keep-last"]),
        case(&["backups", "prune", "--store", &s, "--keep-last", "0"], 2, &["--keep-last", "0"]),
        case(&["backups", "prune", "--store", &s, "--max-age", "5 fortnights"], 2, &["--max-age", "1h to 36500d"]),
        case(&["backups", "prune", "--store", &s, "--incomplete-after", "5m"], 2, &["--incomplete-after", "too short"]),
        // restore
        case(&["restore", "--from", &nothing], 2, &["no complete backup"]),
        case(&["restore", "--from", &latest, "--presign-ttl", "8d"], 2, &["--presign-ttl", "at most 7d"]),
        case(&["restore", "--from", &latest, "--wait", "2d"], 2, &["--wait", "at most 1d"]),
        case(&["restore", "--from", &backup, "--identity", "/nonexistent/key.txt"], 2, &["/nonexistent/key.txt"]),
        case(&["restore", "--from", &backup, "--identity", &not_identity], 2, &["identity.txt"]),
        case(&["restore", "--from", "ftp://host/clusters/demo/latest"], 2, &["ftp://host"]),
        // migrate
        case(&["migrate", "--hosted-cluster", "demo", "--to-kubeconfig", "/nonexistent/b.kubeconfig", "--via", &s], 2, &["--via", "local directory", "--stage-snapshot-to"]),
        case(&["migrate", "--hosted-cluster", "demo", "--from-kubeconfig", &kc_a, "--to-kubeconfig", "/nonexistent/b.kubeconfig", "--via", &s, "--stage-snapshot-to", "s3://bucket/staging"], 2, &["/nonexistent/b.kubeconfig"]),
        case(&["migrate", "--hosted-cluster", "demo", "--to-kubeconfig", &kc_a, "--via", &s, "--dns-wait", "1s"], 2, &["--dns-wait", "too short"]),
        case(&["migrate", "--hosted-cluster", "Bad_Name", "--to-kubeconfig", &kc_a, "--via", &s], 2, &["Bad_Name"]),
        // drill
        case(&["drill", "--from", &latest, "--presign-ttl", "1m"], 2, &["--presign-ttl", "5m to 7d"]),
        case(&["drill", "--from", &nothing, "--kubeconfig", &kc_a], 2, &["no complete backup"]),
        case(&["drill", "--from", &latest], 2, &["--kubeconfig"]),
        // etcd
        case(&["etcd", "status", "--hosted-cluster", "nope"], 2, &["clusters/nope not found"]),
        case(&["etcd", "recover", "--hosted-cluster", "demo", "--wait-timeout", "5s"], 2, &["--wait-timeout", "too short"]),
        case(&["etcd", "restore", "--hosted-cluster", "demo", "--from", &backup, "--bump-revision", "0"], 2, &["--bump-revision", "0"]),
        case(&["etcd", "restore", "--hosted-cluster", "demo", "--from", &backup, "--pause-ttl", "8d"], 2, &["--pause-ttl", "at most 7d"]),
        // snapshot
        case(&["snapshot", "verify", "/nonexistent/snapshot.db"], 2, &["/nonexistent/snapshot.db"]),
        case(&["snapshot", "verify", &junk_snapshot], 1, &["NOT A SNAPSHOT"]),
        // schedule
        case(&["schedule", "render", "--schedule", "99 99 99 99 99", "--to", "s3://b/p"], 2, &["--schedule", "minute field `99`"]),
        case(&["schedule", "render", "--schedule", "@sometimes", "--to", "s3://b/p"], 2, &["@sometimes"]),
        case(&["schedule", "render", "--schedule", "0 * * *", "--to", "s3://b/p"], 2, &["--schedule", "five fields"]),
        case(&["schedule", "render", "--schedule", "0 * * * *", "--to", "s3://b/p", "--image", "quay.io/You/hcp-dr"], 2, &["--image", "repository in lowercase"]),
        case(&["schedule", "render", "--schedule", "0 * * * *", "--to", "s3://b/p", "--mover-image", "bad image"], 2, &["--mover-image", "not a container image reference"]),
        case(&["schedule", "render", "--schedule", "0 * * * *", "--to", "s3://b/p", "--max-age", "10m"], 2, &["--max-age", "too short"]),
        // off-site copies and the posture report (issues 39 and 40)
        case(&["schedule", "render", "--schedule", "0 * * * *", "--to", "s3://bucket/p", "--copy-to", "/var/backups"], 2, &["--copy-to /var/backups", "s3://bucket/prefix"]),
        case(&["schedule", "render", "--schedule", "0 * * * *", "--to", "s3://bucket/p", "--copy-to", "s3://bucket/p/"], 2, &["--copy-to s3://bucket/p/", "another store"]),
        case(&["schedule", "render", "--schedule", "0 * * * *", "--to", "s3://bucket/p", "--monitoring", "--pushgateway", "http://pg:9091", "--runbook-base", "https://x.example/r", "--drill-every", "5m"], 2, &["--drill-every", "too short"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--copy-to", "s3://bucket/p", "--copy-to", "s3://bucket/p"], 2, &["--copy-to s3://bucket/p is given twice"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--copy-to", "/proc/nope"], 2, &["--copy-to /proc/nope: backups cannot be written there"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--copy-to", "gs://b/p"], 2, &["--copy-to", "unsupported scheme `gs`"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--compression", "gzip"], 2, &["--compression `gzip`", "`zstd:LEVEL` with LEVEL from 1 to 19", "`none`"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--compression", "zstd:22"], 2, &["--compression `zstd:22`"]),
        case(&["backups", "copy", "--from", &s, "--to", &s], 2, &["--from and --to are the same store"]),
        case(&["backups", "copy", "--from", &s, "--to", &empty_store, "--hosted-cluster", "Demo"], 2, &["hosted cluster `Demo`"]),
        case(&["backups", "copy", "--from", &s, "--to", &empty_store, "--since", "5m"], 2, &["--since", "too short"]),
        case(&["report", "--store", &s, "--stale-after", "0"], 2, &["--stale-after 0"]),
        case(&["report", "--store", &s, "--rto-target", "1s"], 2, &["--rto-target", "too short"]),
        case(&["report", "--store", &s, "--kubeconfig", "/nonexistent/kubeconfig"], 2, &["--kubeconfig /nonexistent/kubeconfig: no such file"]),
        case(&["drill", "--from", &latest, "--kubeconfig", &kc_a, "--pushgateway", "ftp://pg:9091"], 2, &["--pushgateway"]),
        case(&["backups", "list", "--store", &s, "-o", "html"], 2, &["-o html is for `hcp-dr report` only"]),
        // S3 Object Lock (issue 39)
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--lock-for", "30d"], 2, &["--lock-for", "--to", "is a local directory", "s3://bucket/prefix"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &unlocked, "--s3-endpoint", &s3_endpoint, "--lock-for", "30d"], 2, &["--lock-for 30d", "does not have S3 Object Lock enabled", "put-object-lock-configuration", "--object-lock-enabled-for-bucket"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &unlocked, "--s3-endpoint", &s3_endpoint, "--lock-for", "30d", "--copy-to", "/var/tmp/hcp-dr-copy"], 2, &["--lock-for", "--copy-to /var/tmp/hcp-dr-copy", "is a local directory"]),
        case(&["backup", "--all", "--to", &s, "--lock-for", "30d"], 2, &["--lock-for", "is a local directory"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--lock-mode", "governance"], 2, &["--lock-for"]),
        case(&["backup", "--hosted-cluster", "demo", "--to", &s, "--lock-for", "0s"], 2, &["--lock-for", "too short"]),
        case(&["schedule", "render", "--schedule", "0 * * * *", "--to", "/var/backups", "--lock-for", "30d"], 2, &["--lock-for", "local directory"]),
        case(&["backups", "copy", "--from", &s, "--to", &empty_store, "--lock-for", "30d"], 2, &["--lock-for", "--to", "is a local directory", "s3://bucket/prefix"]),
        case(&["backups", "copy", "--from", &s, "--to", &unlocked, "--s3-endpoint", &s3_endpoint, "--lock-for", "30d"], 2, &["--lock-for 30d", "does not have S3 Object Lock enabled", "put-object-lock-configuration"]),
        case(&["backups", "copy", "--from", &s, "--to", &empty_store, "--lock-mode", "governance"], 2, &["--lock-for"]),
        case(&["backups", "copy", "--from", &s, "--to", &empty_store, "--lock-for", "0s"], 2, &["--lock-for", "too short"]),
        // cluster
        case(&["cluster", "scale", "demo", "--node-pool", "demo", "--replicas", "9999"], 2, &["--replicas", "9999"]),
        case(&["cluster", "scale", "demo", "--node-pool", "demo", "--replicas", "-1"], 2, &["-1"]),
        case(&["cluster", "pause", "Bad_Name"], 2, &["Bad_Name", "not a valid Kubernetes name"]),
        case(&["cluster", "pause", "demo", "--for", "400d"], 2, &["--for", "at most 366d"]),
        case(&["cluster", "pause", "demo", "--until", "yesterday"], 2, &["yesterday"]),
        case(&["cluster", "create", "--name", "x", "--release-image", "img", "--pull-secret", "/nonexistent/pull-secret.json"], 2, &["--pull-secret", "/nonexistent/pull-secret.json"]),
        case(&["cluster", "create", "--name", "x", "--release-image", "img", "--pull-secret", &not_pem, "--availability", "Sometimes"], 2, &["--availability", "Sometimes"]),
        case(
            &["cluster", "create", "--name", "x", "--release-image", "img", "--pull-secret", &pull_secret, "--platform", "aws", "--aws-region", "us-east-1", "--aws-role-arn-prefix", "arn:aws:iam::123456789012:role/x", "--aws-subnet-id", "subnet-1", "--aws-oidc-bucket-url", "http://oidc.example.com"],
            2,
            &["--aws-oidc-bucket-url `http://oidc.example.com` must be an https:// URL"],
        ),
        case(&["cluster", "create", "--name", "x", "--release-image", "img", "--pull-secret", &pull_secret, "--platform", "aws", "--aws-region", "us-east-1"], 2, &["--platform aws needs", "--aws-oidc-bucket-url"]),
        case(&["cluster", "create", "--name", "x", "--release-image", "img", "--pull-secret", &pull_secret, "--node-selector", "role"], 2, &["--node-selector", "KEY=VALUE"]),
        case(&["cluster", "create", "--name", "x", "--release-image", "img", "--pull-secret", &pull_secret, "--toleration", "key=a,effect=Sometimes"], 2, &["--toleration", "NoSchedule, PreferNoSchedule or NoExecute"]),
        case(&["cluster", "create", "--name", "x", "--release-image", "img", "--pull-secret", &pull_secret, "--node-selector", "role=a", "--node-selector", "role=b", "--render"], 2, &["--node-selector gives role twice"]),
        case(&["cluster", "reconcile", "--file", &not_yaml], 2, &["not-yaml.yaml"]),
        case(&["cluster", "destroy", "nope"], 2, &["nope"]),
        case(&["cluster", "oidc", "demo"], 2, &["clusters/demo is on the None platform", "only AWS clusters have an OIDC issuer"]),
        case(&["cluster", "oidc", "nope"], 2, &["clusters/nope not found"]),
        // fence
        case(&["fence", "--hosted-cluster", "demo"], 2, &["--store", "--runs-on"]),
        case(&["fence", "--hosted-cluster", "nope", "--runs-on", "https://elsewhere:6443"], 2, &["clusters/nope not found"]),
        // playbook
        case(&["playbook", "show", "teleport"], 2, &["teleport"]),
        // the store given by the environment must be a store too
        case(&["backups", "list"], 2, &["--store"]),
    ];
    assert!(cases.len() >= 40, "the catalogue has {} cases", cases.len());

    let before = fingerprint(&env, &store).await;
    let mut failures = Vec::new();
    for c in &cases {
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let out = env.hcp_dr(&args, &[]);
        let said = text(&out);
        let mut wrong = Vec::new();
        if out.status.code() != Some(c.code) {
            wrong.push(format!("exit {:?}, expected {}", out.status.code(), c.code));
        }
        for s in &c.says {
            if !said.contains(s) {
                wrong.push(format!("does not say `{s}`"));
            }
        }
        if said.contains("panicked") || said.contains("RUST_BACKTRACE") {
            wrong.push("panicked".into());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if c.code == 2 && stderr.lines().filter(|l| l.starts_with("error:")).count() != 1 {
            wrong.push("bad input must be one `error:` line".into());
        }
        if !wrong.is_empty() {
            failures.push(format!("hcp-dr {}: {}\n{said}", c.args.join(" "), wrong.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases went wrong:\n\n{}", failures.len(), cases.len(), failures.join("\n\n"));
    assert_eq!(fingerprint(&env, &store).await, before, "a refused command changed something");
    env.assert_in_service("after the catalogue").await;
}
