//! The simulated external-dns: Route → A + owner TXT records in Route53
//! (moto), no take-over of records another owner holds, withdrawal when the
//! Route is deleted (with the HostedCluster paused, as a migration does).

use crate::operator_support;

use std::time::Duration;

use aws_sdk_route53::types::RrType;
use hcp_dr_e2e::operator::Route53Config;
use hcp_dr_e2e::operator::external_dns::owner_txt;
use hcp_dr_e2e::operator::hosted_api::hosted_api_address;
use hcp_dr_e2e::procs::route53::Route53Endpoint;
use operator_support::*;
use serde_json::json;

/// (type, values) of the records named `name` in the zone.
async fn records(
    client: &aws_sdk_route53::Client,
    zone: &str,
    name: &str,
) -> Vec<(String, Vec<String>)> {
    let out = client
        .list_resource_record_sets()
        .hosted_zone_id(zone)
        .send()
        .await
        .expect("list records");
    out.resource_record_sets()
        .iter()
        .filter(|r| r.name().trim_end_matches('.') == name)
        .map(|r| {
            (
                r.r#type().as_str().to_string(),
                r.resource_records()
                    .iter()
                    .map(|v| v.value().to_string())
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn external_dns_publishes_respects_owners_and_withdraws() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hcp_dr_e2e=info")
        .with_test_writer()
        .try_init();
    let dns_dir = tempfile::tempdir().expect("temp dir");
    let r53 = match Route53Endpoint::start(dns_dir.path()).await {
        Ok(r) => r,
        Err(e) => panic!("Route53 endpoint (moto) failed to start: {e}"),
    };
    let zone = r53
        .create_hosted_zone("example.com")
        .await
        .expect("hosted zone");
    let client = r53.client();
    let host = "api.gamma.example.com";
    // A record of this name already owned by another management cluster.
    let foreign = owner_txt("mgmt-b", "clusters-gamma", "kube-apiserver");
    let change = |action, value: &str| {
        aws_sdk_route53::types::Change::builder()
            .action(action)
            .resource_record_set(
                aws_sdk_route53::types::ResourceRecordSet::builder()
                    .name(host)
                    .r#type(RrType::Txt)
                    .ttl(30)
                    .resource_records(
                        aws_sdk_route53::types::ResourceRecord::builder()
                            .value(value)
                            .build()
                            .expect("rr"),
                    )
                    .build()
                    .expect("rrs"),
            )
            .build()
            .expect("change")
    };
    client
        .change_resource_record_sets()
        .hosted_zone_id(&zone)
        .change_batch(
            aws_sdk_route53::types::ChangeBatch::builder()
                .changes(change(
                    aws_sdk_route53::types::ChangeAction::Create,
                    &foreign,
                ))
                .build()
                .expect("batch"),
        )
        .send()
        .await
        .expect("create foreign TXT");

    let mgmt = Mgmt::start_with(
        "mgmt-a",
        Some(Route53Config {
            endpoint_url: r53.url().to_string(),
            zone_id: zone.clone(),
            region: "us-east-1".into(),
            domain: "example.com".into(),
        }),
    )
    .await;
    mgmt.create_hosted_cluster("gamma", "SingleReplica", 0, None)
        .await;
    mgmt.wait_condition("gamma", "Available", "True").await;
    // Several external-dns passes later the foreign record is untouched and no A record exists.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = records(&client, &zone, host).await;
    assert_eq!(
        now,
        vec![("TXT".to_string(), vec![foreign.clone()])],
        "another owner's name is not taken over"
    );

    // Once the other owner withdraws, this cluster publishes A + its owner TXT.
    client
        .change_resource_record_sets()
        .hosted_zone_id(&zone)
        .change_batch(
            aws_sdk_route53::types::ChangeBatch::builder()
                .changes(change(
                    aws_sdk_route53::types::ChangeAction::Delete,
                    &foreign,
                ))
                .build()
                .expect("batch"),
        )
        .send()
        .await
        .expect("delete foreign TXT");
    let (ip, _) = hosted_api_address(&mgmt.sandbox_id, "mgmt-a", HC_NS, "gamma");
    let ours = owner_txt("mgmt-a", "clusters-gamma", "kube-apiserver");
    let mut published = wait_for("A and TXT published", || async {
        let r = records(&client, &zone, host).await;
        (r.len() == 2).then_some(r)
    })
    .await;
    published.sort();
    assert_eq!(
        published,
        vec![
            ("A".to_string(), vec![ip.to_string()]),
            ("TXT".to_string(), vec![ours])
        ]
    );

    // Paused (so the operator does not recreate it), the Route is deleted: records withdrawn.
    mgmt.merge(
        &mgmt.hc_api(),
        "gamma",
        json!({"spec": {"pausedUntil": "true"}}),
    )
    .await;
    mgmt.wait_condition("gamma", "ReconciliationActive", "False")
        .await;
    let routes = mgmt.api(
        "route.openshift.io",
        "v1",
        "Route",
        "routes",
        Some("clusters-gamma"),
    );
    routes
        .delete("kube-apiserver", &Default::default())
        .await
        .expect("delete route");
    wait_for("records withdrawn", || async {
        records(&client, &zone, host).await.is_empty().then_some(())
    })
    .await;
    mgmt.stop().await;
}
