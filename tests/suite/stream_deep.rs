//! `backups verify --deep` of a stream: each chain that hands over to the
//! next is replayed to the next chain's base revision and compared, key by
//! key, with that base (a snapshot of the live etcd). A stream of a plain
//! etcd with a new base every 2 s while writes go on compares identical; a
//! chain rewritten consistently (its segment re-sealed under a name with a
//! matching hash, so hash checks pass) but with one value changed is
//! caught, naming the key.

use std::sync::Arc;
use std::time::Duration;

use hcp_dr::etcd::Member;
use hcp_dr::store::{LocalStore, Store};
use hcp_dr::stream::format::{Event, SegmentBuilder, SegmentName};
use hcp_dr::stream::run::{Cluster, StreamSettings, run};
use hcp_dr::stream::source::FixedMembers;
use hcp_dr::stream::writer::Cut;
use hcp_dr::stream::{catalog, codec, verify};
use hcp_dr_e2e::procs::etcd::{EtcdProcess, connect_client};

use crate::support::{json_report, text};

fn hcp_dr(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(args).env_remove("HCP_DR_STORE").output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_replayed_to_the_next_base_matches_it_and_a_forged_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let source = EtcdProcess::start_plain(&dir.path().join("source")).await.expect("etcd");
    let mut client = connect_client(&[source.client_url()], None).await.unwrap();
    let root = dir.path().join("store");
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(&root));
    let settings = StreamSettings { cut: Cut { interval: Duration::from_millis(300), size: 1 << 20 }, base_interval: Duration::from_secs(2), level: 1, recipients: None, watch: Default::default(), base_from_backup: false };
    let cluster = Cluster { namespace: "clusters".into(), hosted_cluster: "plain".into(), store: store.clone(), source: Arc::new(FixedMembers(vec![Member { name: "etcd-0".into(), url: source.client_url(), tls: None }])) };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(run(cluster, settings, stopped));
    // keys written once each, others overwritten and deleted, across several bases
    for i in 0..70 {
        client.put(format!("/deep/once/{i:03}"), format!("value-{i}"), None).await.unwrap();
        client.put("/deep/counter", i.to_string(), None).await.unwrap();
        client.put(format!("/deep/gone/{i:03}"), "x", None).await.unwrap();
        if i % 10 == 9 {
            client.delete(format!("/deep/gone/{:03}", i - 5), None).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send(true).unwrap();
    let report = running.await.unwrap();
    assert!(report.error.is_none() && report.breaks.is_empty(), "{report:#?}");

    let url = format!("{}/clusters/plain/stream", root.to_str().unwrap());
    let out = hcp_dr(&["backups", "verify", &url, "--deep", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let verified = json_report(&out);
    let handovers = verified["handovers"].as_array().unwrap();
    assert!(!handovers.is_empty(), "chains handed over every 2s: {verified:#}");
    assert!(handovers.iter().all(|h| h["ok"] == true && h["keys_compared"].as_u64().unwrap() > 10), "{verified:#}");
    // a chain named: its handover alone
    let asked = handovers[0]["chain_id"].as_str().unwrap();
    let out = hcp_dr(&["backups", "verify", &format!("{url}/{asked}"), "--deep", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let one = json_report(&out);
    assert_eq!(one["handovers"].as_array().unwrap().iter().map(|h| h["chain_id"].as_str().unwrap()).collect::<Vec<_>>(), [asked], "{one:#}");

    // forge the first chain: one value changed before the next base, re-sealed, renamed
    let (chains, _) = catalog::chains(store.as_ref(), "clusters", "plain").await.unwrap();
    let (first, next) = (&chains[0], chains[1].descriptor.as_ref().unwrap());
    let descriptor = first.descriptor.as_ref().unwrap();
    let name = first.segments.iter().find(|s| s.last <= next.base.revision && s.last > descriptor.base.revision).expect("a segment before the next base").clone();
    let stored = std::fs::read(root.join(first.layout.segment(&name))).unwrap();
    let segment = verify::read_segment(&stored, first, descriptor, &name, None).await.unwrap().unwrap();
    let mut builder = SegmentBuilder::default();
    let mut forged_key = None;
    for mut record in segment.records {
        for event in &mut record.events {
            if let Event::Put { key, value, .. } = event
                && forged_key.is_none()
                && key.0.starts_with(b"/deep/once/")
            {
                value.0 = b"forged".to_vec();
                forged_key = Some(String::from_utf8_lossy(&key.0).to_string());
            }
        }
        builder.push(&record).unwrap();
    }
    let forged_key = forged_key.expect("a /deep/once/ key in the segment");
    let raw = builder.finish(&descriptor.chain_id).unwrap();
    let (sealed, digest) = codec::seal(&raw, 1, None, "forged").await.unwrap();
    std::fs::remove_file(root.join(first.layout.segment(&name))).unwrap();
    let renamed = SegmentName { sha256: digest.sha256, ..name };
    std::fs::write(root.join(first.layout.segment(&renamed)), sealed).unwrap();

    let out = hcp_dr(&["backups", "verify", &url, "-o", "json"]);
    assert!(out.status.success(), "the hashes alone pass: {}", text(&out));
    let out = hcp_dr(&["backups", "verify", &url, "--deep"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("FAILED") && said.contains(&format!("{forged_key}: value differs")) && said.contains("DIFFERENT"), "{said}");
}
