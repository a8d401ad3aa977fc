//! `hcp-dr-sandbox up --detach`, `status`, `down` as a user runs them, with
//! kubectl against the written kubeconfigs.

use std::process::Command;

fn sandbox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hcp-dr-sandbox")).args(args).output().expect("run hcp-dr-sandbox")
}

fn text(out: &std::process::Output) -> String {
    format!("exit {:?}\n{}\n{}", out.status.code(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn up_detached_status_kubectl_and_down() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sb");
    let d = dir.to_str().unwrap();

    let out = sandbox(&["status", "--dir", d]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no sandbox in"), "{}", text(&out));

    let out = sandbox(&["up", "--dir", d, "--detach"]);
    assert!(out.status.success(), "{}", text(&out));
    let guard = Down(d.to_string());

    for file in ["mgmt-a.kubeconfig", "mgmt-b.kubeconfig", "ca.crt", "env", "sandbox.json"] {
        assert!(dir.join(file).exists(), "{file} missing");
    }
    let env = std::fs::read_to_string(dir.join("env")).unwrap();
    for key in ["AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_ROUTE_53", "AWS_CA_BUNDLE", "HCP_DR_ROUTE53_ZONE", "HCP_DR_STORE"] {
        assert!(env.contains(&format!("export {key}=")), "{key} not in env:\n{env}");
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(dir.join("env")).unwrap().permissions().mode() & 0o777, 0o600);

    let out = sandbox(&["status", "--dir", d]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).matches("ready; hosted clusters: none").count() == 2, "{}", text(&out));

    // a second `up` in the same directory is refused
    let out = sandbox(&["up", "--dir", d]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("already runs"), "{}", text(&out));

    for cluster in ["mgmt-a", "mgmt-b"] {
        let kubeconfig = dir.join(format!("{cluster}.kubeconfig"));
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "crd", "hostedclusters.hypershift.openshift.io", "-o", "jsonpath={.spec.names.kind}"])
            .output()
            .expect("kubectl not found: it is on every machine of this kind (see the README)");
        assert!(out.status.success(), "{cluster}: {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "HostedCluster");
    }

    // API faults on mgmt-a's API server, for kubectl only: kubectl gets the
    // 500s (no Retry-After, so client-go does not retry them), mgmt-b and
    // the operator (kube-rs) are left alone; --off counts them
    let kubectl_get = |cluster: &str| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(dir.join(format!("{cluster}.kubeconfig")))
            .args(["get", "namespaces", "-o", "name"])
            .output()
            .expect("kubectl")
    };
    let out = sandbox(&["faults", "--dir", d, "--cluster", "mgmt-a", "--share", "1", "--kinds", "internal-error", "--user-agent", "kubectl"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(dir.join("mgmt-a/state/api-faults.json").exists());
    let out = kubectl_get("mgmt-a");
    assert!(!out.status.success() && text(&out).contains("Internal error occurred"), "{}", text(&out));
    let out = kubectl_get("mgmt-b");
    assert!(out.status.success(), "{}", text(&out));
    let out = sandbox(&["faults", "--dir", d, "--cluster", "mgmt-a", "--off"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(internal-error "), "{}", text(&out));
    let out = kubectl_get("mgmt-a");
    assert!(out.status.success(), "{}", text(&out));

    // S3 faults on the sandbox's S3 endpoint, for GETs only: an unsigned GET
    // gets SlowDown (decided before s3s-fs would refuse it); --off counts them
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("sandbox.json")).unwrap()).unwrap();
    let bucket_url = format!("{}/{}", state["s3_url"].as_str().unwrap(), state["bucket"].as_str().unwrap());
    let ca_pem = std::fs::read_to_string(dir.join("ca.crt")).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let s3_get = || runtime.block_on(hcp_dr_e2e::procs::s3::https_get(&bucket_url, &ca_pem)).expect("GET the bucket");
    let out = sandbox(&["faults", "--dir", d, "--s3", "--share", "1", "--kinds", "slow-down", "--methods", "get"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 of the GET requests fail"), "{}", text(&out));
    assert!(dir.join("s3/s3-faults.json").exists());
    let (status, body) = s3_get();
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("<Code>SlowDown</Code>"));
    let out = sandbox(&["faults", "--dir", d, "--s3", "--share", "1", "--kinds", "reset"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("kind of API fault"), "{}", text(&out));
    let out = sandbox(&["faults", "--dir", d, "--s3", "--off"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("injected so far: 1 (slow-down 1)"), "{}", text(&out));
    let (status, _) = s3_get();
    assert_eq!(status, 403, "unsigned, without faults: refused by s3s-fs");

    drop(guard);
    let out = sandbox(&["status", "--dir", d]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

/// Stops the sandbox even when an assertion fails.
struct Down(String);
impl Drop for Down {
    fn drop(&mut self) {
        let out = sandbox(&["down", "--dir", &self.0]);
        assert!(out.status.success() || std::thread::panicking(), "{}", text(&out));
    }
}
