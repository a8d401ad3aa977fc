//! The etcd "kubelet": a member process that dies is restarted with backoff,
//! the restart is visible in the pod's containerStatuses, and the member comes
//! back Ready with its data.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_s3_restore_url_keeps_the_member_not_ready() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let mgmt = Mgmt::start("mgmt-a").await;
    mgmt.create_hosted_cluster(
        "zeta",
        "SingleReplica",
        0,
        Some("s3://bucket/backups/zeta/snapshot.db"),
    )
    .await;
    let pod = wait_for("etcd-0 waiting on the unsupported URL", || async {
        let pod = mgmt.pod("clusters-zeta", "etcd-0").await?;
        let message = etcd_container(&pod)?
            .pointer("/state/waiting/message")?
            .as_str()?
            .to_string();
        message.contains("https://").then_some(pod)
    })
    .await;
    assert!(!has_condition(&pod, "Ready", "True"));
    mgmt.wait_condition("zeta", "EtcdAvailable", "False").await;
    let hc = mgmt.wait_condition("zeta", "Available", "False").await;
    assert!(hc.pointer("/status/kubeconfig/name").is_some());
    mgmt.stop().await;
}
