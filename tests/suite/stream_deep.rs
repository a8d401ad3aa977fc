//! `backups verify --deep` of a stream: each chain that hands over to the
//! next is replayed to the next chain's base revision and compared, key by
//! key, with that base (a snapshot of the live etcd). A stream of a plain
//! etcd with a new base every 2 s while writes go on compares identical; a
//! chain rewritten consistently (its segment re-sealed under a name with a
//! matching hash, so hash checks pass) but with one value changed is
//! caught, naming the key.

use std::time::Duration;

use hcp_dr::stream::format::{Event, SegmentBuilder, SegmentName};
use hcp_dr::stream::{catalog, codec, verify};

use crate::support::plain::Plain;
use crate::support::{json_report, text};

fn hcp_dr(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hcp-dr")).args(args).env_remove("HCP_DR_STORE").output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_replayed_to_the_next_base_matches_it_and_a_forged_one_does_not() {
    let plain = Plain::start().await;
    // keys written once each, others overwritten and deleted, across several bases
    let report = plain
        .stream_while(Plain::settings(Duration::from_secs(2), None), async {
            let mut client = plain.client.clone();
            for i in 0..70 {
                client.put(format!("/deep/once/{i:03}"), format!("value-{i}"), None).await.unwrap();
                client.put("/deep/counter", i.to_string(), None).await.unwrap();
                client.put(format!("/deep/gone/{i:03}"), "x", None).await.unwrap();
                if i % 10 == 9 {
                    client.delete(format!("/deep/gone/{:03}", i - 5), None).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
    assert!(report.error.is_none() && report.breaks.is_empty(), "{report:#?}");
    let (root, store) = (plain.dir.path().join("store"), &plain.store);

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
    // (the first segment may hold only the harness's marker, written before the work)
    let mut picked = None;
    for name in first.segments.iter().filter(|s| s.last <= next.base.revision && s.last > descriptor.base.revision) {
        let stored = std::fs::read(root.join(first.layout.segment(name))).unwrap();
        let segment = verify::read_segment(&stored, first, descriptor, name, None).await.unwrap().unwrap();
        if segment.records.iter().flat_map(|r| &r.events).any(|e| matches!(e, Event::Put { key, .. } if key.0.starts_with(b"/deep/once/"))) {
            picked = Some((name.clone(), segment));
            break;
        }
    }
    let (name, segment) = picked.expect("a segment with a /deep/once/ key before the next base");
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
