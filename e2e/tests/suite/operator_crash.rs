//! The etcd "kubelet": a member process that dies is restarted with backoff,
//! the restart is visible in the pod's containerStatuses, and the member comes
//! back Ready with its data; a failing `etcd-init` crash-loops in the pod's
//! initContainerStatuses.

use crate::operator_support;

use std::path::Path;

use operator_support::*;
use serde_json::Value;

/// The pid of the process whose command line mentions `needle` (our own etcd
/// member: the path is inside this test's temp dir).
fn pid_with_arg(needle: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(needle)
            .then_some(pid)
    })
}

fn etcd_container(pod: &Value) -> Option<&Value> {
    pod.pointer("/status/containerStatuses")?
        .as_array()?
        .iter()
        .find(|c| c["name"] == "etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_member_is_restarted_and_reported() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    mgmt.create_hosted_cluster("eps", "SingleReplica", 0, None)
        .await;
    mgmt.wait_condition("eps", "Available", "True").await;
    let hosted = mgmt.hosted_client("eps").await;
    wait_for("hosted API write", || async {
        put_configmap(&hosted, "kept", "yes").await.ok()
    })
    .await;

    let data_dir = mgmt
        .dir
        .path()
        .join("operator/pv/clusters-eps/data-etcd-0/data");
    assert!(
        Path::new(&data_dir).join("member/snap/db").exists(),
        "member data lives in the PVC directory"
    );
    let needle = data_dir.display().to_string();
    let pid = pid_with_arg(&needle).expect("the etcd-0 process");
    let status = std::process::Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success());

    let pod = wait_for("etcd-0 restarted and Ready", || async {
        let pod = mgmt.pod("clusters-eps", "etcd-0").await?;
        let c = etcd_container(&pod)?;
        let restarted = c["restartCount"].as_u64().unwrap_or(0) >= 1;
        (restarted && has_condition(&pod, "Ready", "True")).then_some(pod)
    })
    .await;
    let c = etcd_container(&pod).expect("etcd status");
    assert!(
        c.pointer("/lastState/terminated").is_some(),
        "last state records the exit: {c}"
    );
    assert!(c.pointer("/state/running").is_some());
    assert_ne!(pid_with_arg(&needle), Some(pid), "a new process");
    let value = wait_for("data survives the restart", || async {
        get_configmap(&hosted, "kept").await.ok().flatten()
    })
    .await;
    assert_eq!(value, "yes");
    mgmt.stop().await;
}

/// The `etcd-init` entry of the pod's `initContainerStatuses`.
fn etcd_init_status(pod: &Value) -> Option<&Value> {
    pod.pointer("/status/initContainerStatuses")?
        .as_array()?
        .iter()
        .find(|c| c["name"] == "etcd-init")
}

/// An `etcd-init` that fails (curl cannot fetch `s3://`; S3 answers an error
/// document) crash-loops as a kubelet restarts it: the member never starts,
/// etcd is unavailable, and `EtcdSnapshotRestored` is not set.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_etcd_init_keeps_the_member_initializing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    let expired = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>";
    let (xml_url, server) = serve_snapshot(&mgmt.ca, expired.as_bytes().to_vec()).await;
    mgmt.create_hosted_cluster("zeta", "SingleReplica", 0, Some("s3://bucket/backups/zeta/snapshot.db"))
        .await;
    mgmt.create_hosted_cluster("eta", "SingleReplica", 0, Some(&xml_url))
        .await;
    for (hc, message) in [("zeta", "Protocol \"s3\" not supported"), ("eta", expired)] {
        let ns = format!("clusters-{hc}");
        let pod = wait_for(&format!("{hc}: etcd-init crash-looping"), || async {
            let pod = mgmt.pod(&ns, "etcd-0").await?;
            let s = etcd_init_status(&pod)?;
            (s["state"]["waiting"]["reason"] == "CrashLoopBackOff" && s["restartCount"].as_u64() >= Some(2)).then_some(pod)
        })
        .await;
        let s = etcd_init_status(&pod).expect("etcd-init status");
        assert_eq!(s["ready"], false);
        assert_eq!(s["lastState"]["terminated"]["exitCode"], 1, "{s}");
        assert_eq!(s["lastState"]["terminated"]["reason"], "Error");
        let got = s["lastState"]["terminated"]["message"].as_str().unwrap_or_default();
        assert!(got.contains(message), "{hc}: termination message {got:?}");
        assert_eq!(pod["status"]["phase"], "Pending");
        assert!(has_condition(&pod, "Initialized", "False"));
        assert!(!has_condition(&pod, "Ready", "True"));
        assert_eq!(etcd_container(&pod).and_then(|c| c["state"]["waiting"]["reason"].as_str()), Some("PodInitializing"));
        mgmt.wait_condition(hc, "EtcdAvailable", "False").await;
        let hc_obj = mgmt.wait_condition(hc, "Available", "False").await;
        assert!(hc_obj.pointer("/status/kubeconfig/name").is_some());
        let hcps = mgmt.api("hypershift.openshift.io", "v1beta1", "HostedControlPlane", "hostedcontrolplanes", Some(&ns));
        let hcp = mgmt.get(&hcps, hc).await.expect("HostedControlPlane");
        let restored = hcp.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().any(|c| c["type"] == "EtcdSnapshotRestored");
        assert!(!restored, "{hc}: the condition waits for every member to be ready, as the control-plane operator's does");
    }
    server.abort();
    mgmt.stop().await;
}
