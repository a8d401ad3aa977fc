//! The README's first command, as a test: the sandbox drill with the real
//! hcp-dr binary.

use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sandbox_drill_backs_up_verifies_and_migrates_demo() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_hcp-dr"));
    let report = hcp_dr_e2e::drill::run(&tmp.path().join("sb"), bin).await.expect("drill");
    let steps: Vec<&str> = report.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(steps, support::DRILL_STEPS);
    assert_eq!(report.members.len(), 3);
    assert!(report.members.iter().all(|m| m.workload_keys == 40));
    let rendered = report.render();
    assert!(rendered.contains("each restore all 40 workload keys"), "{rendered}");
    assert!(rendered.contains("Available on mgmt-b, 3 members each with all 40 workload keys"), "{rendered}");
    assert!(rendered.contains("RTO "), "{rendered}");
    let drill = report.steps.iter().find(|s| s.name == "hcp-dr drill on mgmt-b").unwrap();
    assert!(drill.detail.contains("RPO") && drill.detail.contains("checks passed"), "{}", drill.detail);
    assert!(report.not_yet_available.is_empty());
}
