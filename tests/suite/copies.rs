//! `hcp-dr backups copy`: complete backups and their result records to a
//! second store (the sandbox's S3, checking signatures), idempotent and
//! resumable, a damaged source refused by name and never listed complete at
//! the destination; `backups list` across both stores shows where each
//! backup is, and the copy verifies on its own.

use crate::support;

use serde_json::Value;
use support::*;

fn tamper(path: &std::path::Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backups_copy_to_another_store_idempotently_resumably_and_refuse_a_damaged_source() {
    let env = env("SingleReplica").await;
    let primary = env.local_store();
    let (first, second) = (backup_to_local(&env), backup_to_local(&env));
    let out = env.hcp_dr(&["backups", "verify", &format!("{}/clusters/demo/latest", primary.display()), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let endpoint = env.sandbox.s3.https_url().to_string();
    let copies = format!("s3://{}/copies", hcp_dr_e2e::sandbox::BUCKET);
    let copy = |extra: &[&str]| {
        let mut args = vec!["backups", "copy", "--from", primary.to_str().unwrap(), "--to", &copies, "--s3-endpoint", &endpoint, "-o", "json"];
        args.extend(extra);
        env.hcp_dr(&args, &[])
    };

    let out = copy(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    assert_eq!((report["copied"].as_u64(), report["already_there"].as_u64(), report["failed"].as_u64()), (Some(2), Some(0), Some(0)), "{report:#}");
    assert_eq!(report["results_copied"], 1, "the verify's record goes along: {report:#}");
    let on_disk = env.sandbox.s3.root().join(hcp_dr_e2e::sandbox::BUCKET).join("copies/clusters/demo");
    for backup in [&first, &second] {
        let id = backup.file_name().unwrap();
        for file in files(backup) {
            assert_eq!(std::fs::read(backup.join(&file)).unwrap(), std::fs::read(on_disk.join(id).join(&file)).unwrap(), "{file} copied byte for byte");
        }
    }

    // again: nothing to copy, every hash at the destination checked
    let again = json_report(&copy(&[]));
    assert_eq!((again["copied"].as_u64(), again["already_there"].as_u64(), again["bytes_copied"].as_u64()), (Some(0), Some(2), Some(0)), "{again:#}");

    // a copy cut short (its manifest and one artifact missing) is finished
    let cut = on_disk.join(second.file_name().unwrap());
    std::fs::remove_file(cut.join("manifest.json")).unwrap();
    std::fs::remove_file(cut.join("objects.tar.gz")).unwrap();
    let resumed = json_report(&copy(&[]));
    let row = resumed["backups"].as_array().unwrap().iter().find(|b| b["backup"].as_str().unwrap().ends_with(second.file_name().unwrap().to_str().unwrap())).unwrap();
    assert_eq!(row["result"], "completed", "{resumed:#}");
    assert!(row["kept"].as_u64().unwrap() >= 2, "the artifacts there were kept: {row}");

    // a damaged source: refused by name, nothing listed complete there
    let third = backup_to_local(&env);
    tamper(&third.join("objects.tar.gz"));
    let out = copy(&["--since", "1h"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let failed = json_report(&out);
    assert_eq!(failed["failed"], 1, "{failed:#}");
    let error = failed["backups"].as_array().unwrap().iter().find_map(|b| b["error"].as_str()).unwrap();
    assert!(error.contains("objects.tar.gz") && error.contains("damaged at the source"), "{error}");
    assert!(!on_disk.join(third.file_name().unwrap()).join("manifest.json").exists(), "the damaged backup is listed complete at the destination");

    // one list across both stores: where each backup is
    let out = env.hcp_dr(&["backups", "list", "--store", primary.to_str().unwrap(), "--store", &copies, "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let stores_of = |backup: &std::path::Path| -> usize {
        let id = backup.file_name().unwrap().to_str().unwrap();
        listed.iter().find(|e| e["backup_id"] == id).unwrap()["stores"].as_array().unwrap().len()
    };
    assert_eq!((stores_of(&first), stores_of(&second), stores_of(&third)), (2, 2, 1), "{listed:#?}");
    let out = env.hcp_dr(&["backups", "list", "--store", primary.to_str().unwrap(), "--store", &copies, "--s3-endpoint", &endpoint], &[]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("STORES") && said.contains("  1,2\n") && said.contains(&format!("store 2: {copies}")), "{said}");

    // the posture report across both: the newest backup (the damaged one)
    // is not in the copy store, which is amber
    let out = env.hcp_dr(&["report", "--store", primary.to_str().unwrap(), "--store", &copies, "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let posture = json_report(&out);
    let reasons: Vec<&str> = posture["clusters"][0]["reasons"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(reasons.contains(&format!("newest good backup is in 1 of 2 stores (not in {copies}): the off-site copy is behind").as_str()), "{posture:#}");
    assert_eq!(posture["copies"], serde_json::json!([copies]));

    // the copy stands on its own
    let copied = format!("{copies}/clusters/demo/{}", first.file_name().unwrap().to_str().unwrap());
    let out = env.hcp_dr(&["backups", "verify", &copied, "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));

    // the same store twice is bad input
    let out = env.hcp_dr(&["backups", "copy", "--from", primary.to_str().unwrap(), "--to", &format!("file://{}", primary.display())], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--from and --to are the same store"), "{}", text(&out));
}
