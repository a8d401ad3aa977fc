//! The Route53 fixture: moto_server driven with the real aws-sdk-route53.
//! Needs moto (`python3 -m venv /root/.local/share/hcp-dr/venv &&
//! /root/.local/share/hcp-dr/venv/bin/pip install 'moto[server]'`).

use aws_sdk_route53::types::{
    Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType,
};
use hcp_dr_e2e::procs::route53::Route53Endpoint;

const ZONE: &str = "sandbox.example.com";
const API: &str = "api.hc1.sandbox.example.com.";

fn record(name: &str, kind: RrType, value: &str) -> ResourceRecordSet {
    ResourceRecordSet::builder()
        .name(name)
        .r#type(kind)
        .ttl(30)
        .resource_records(
            ResourceRecord::builder()
                .value(value)
                .build()
                .expect("record"),
        )
        .build()
        .expect("record set")
}

async fn try_change(
    r53: &aws_sdk_route53::Client,
    zone: &str,
    action: ChangeAction,
    sets: &[ResourceRecordSet],
) -> Result<(), String> {
    let mut batch = ChangeBatch::builder();
    for set in sets {
        batch = batch.changes(
            Change::builder()
                .action(action.clone())
                .resource_record_set(set.clone())
                .build()
                .expect("change"),
        );
    }
    r53.change_resource_record_sets()
        .hosted_zone_id(zone)
        .change_batch(batch.build().expect("batch"))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| aws_sdk_route53::error::DisplayErrorContext(e).to_string())
}

async fn change(
    r53: &aws_sdk_route53::Client,
    zone: &str,
    action: ChangeAction,
    sets: &[ResourceRecordSet],
) {
    if let Err(e) = try_change(r53, zone, action.clone(), sets).await {
        panic!("{action:?}: {e}");
    }
}

/// (name, type, values) of the non-SOA/NS records of `zone`.
async fn records(r53: &aws_sdk_route53::Client, zone: &str) -> Vec<(String, String, Vec<String>)> {
    let out = r53
        .list_resource_record_sets()
        .hosted_zone_id(zone)
        .send()
        .await
        .expect("list records");
    let mut found: Vec<_> = out
        .resource_record_sets()
        .iter()
        .filter(|s| !matches!(s.r#type(), RrType::Soa | RrType::Ns))
        .map(|s| {
            (
                s.name().to_string(),
                s.r#type().as_str().to_string(),
                s.resource_records()
                    .iter()
                    .map(|r| r.value().to_string())
                    .collect(),
            )
        })
        .collect();
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn records_are_upserted_listed_and_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let endpoint = Route53Endpoint::start(dir.path())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        endpoint.url().starts_with("http://127.0.0.1:"),
        "{}",
        endpoint.url()
    );
    let zone = endpoint
        .create_hosted_zone(ZONE)
        .await
        .expect("create zone");
    assert!(!zone.is_empty() && !zone.contains('/'), "{zone}");

    let r53 = endpoint.client();
    let zones = r53.list_hosted_zones().send().await.expect("list zones");
    assert!(
        zones
            .hosted_zones()
            .iter()
            .any(|z| z.name() == format!("{ZONE}."))
    );

    let a = record(API, RrType::A, "192.0.2.10");
    let txt = record(
        API,
        RrType::Txt,
        "\"heritage=external-dns,external-dns/owner=hc1\"",
    );
    change(&r53, &zone, ChangeAction::Upsert, &[a.clone(), txt.clone()]).await;
    assert_eq!(
        records(&r53, &zone).await,
        vec![
            (
                API.to_string(),
                "A".to_string(),
                vec!["192.0.2.10".to_string()]
            ),
            (
                API.to_string(),
                "TXT".to_string(),
                vec!["\"heritage=external-dns,external-dns/owner=hc1\"".to_string()]
            ),
        ]
    );

    // UPSERT replaces the value in place.
    let a2 = record(API, RrType::A, "192.0.2.20");
    change(&r53, &zone, ChangeAction::Upsert, std::slice::from_ref(&a2)).await;
    let after = records(&r53, &zone).await;
    assert_eq!(after.iter().filter(|(_, t, _)| t == "A").count(), 1);
    assert!(
        after.contains(&(
            API.to_string(),
            "A".to_string(),
            vec!["192.0.2.20".to_string()]
        )),
        "{after:?}"
    );

    // Like real Route53: CREATE of an existing record and DELETE with stale
    // values are rejected as a whole batch.
    let dup = try_change(&r53, &zone, ChangeAction::Create, std::slice::from_ref(&a2)).await;
    let dup = dup.expect_err("CREATE of an existing record set");
    assert!(
        dup.contains("InvalidChangeBatch") && dup.contains("already exists"),
        "{dup}"
    );
    let stale = try_change(&r53, &zone, ChangeAction::Delete, std::slice::from_ref(&a)).await;
    let stale = stale.expect_err("DELETE with stale values");
    assert!(
        stale.contains("InvalidChangeBatch") && stale.contains("do not match"),
        "{stale}"
    );
    // The failed batches changed nothing.
    assert_eq!(records(&r53, &zone).await.len(), 2);

    change(&r53, &zone, ChangeAction::Delete, &[a2, txt]).await;
    assert_eq!(
        records(&r53, &zone).await,
        Vec::<(String, String, Vec<String>)>::new()
    );
}
