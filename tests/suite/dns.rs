//! The Route53 adapter against a real Route53 API (moto behind the sandbox's
//! strict front, which rejects DELETEs whose values do not match as Route53
//! does): finding a cluster's records and their external-dns owners,
//! owner-checked deletion, bounded waits, pagination.

use std::time::{Duration, Instant};

use aws_sdk_route53::types::{
    Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType,
};
use hcp_dr::dns::{DnsError, DnsZone, Record, Route53Options, Route53Zone};
use hcp_dr_e2e::operator::external_dns::{TTL, owner_txt};
use hcp_dr_e2e::procs::route53::{ACCESS_KEY, REGION, Route53Endpoint, SECRET_KEY};
use hcp_dr_e2e::procs::tail_file;

const ZONE: &str = "example.com";
const API_C1: &str = "api.c1.example.com";
const OAUTH_C1: &str = "oauth.c1.example.com";
const API_C2: &str = "api.c2.example.com";

/// A moto Route53 endpoint with one zone; prints moto's log if the test fails.
struct Fixture {
    endpoint: Route53Endpoint,
    zone_id: String,
    _dir: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- moto_server log ({}) ---\n{}",
                self.endpoint.log_path().display(),
                tail_file(self.endpoint.log_path(), 80)
            );
        }
    }
}

impl Fixture {
    async fn start() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let endpoint = Route53Endpoint::start(&dir.path().join("moto"))
            .await
            .expect("start moto_server (installed by `bash e2e/setup`)");
        let zone_id = endpoint
            .create_hosted_zone(ZONE)
            .await
            .expect("create zone");
        Fixture {
            endpoint,
            zone_id,
            _dir: dir,
        }
    }

    fn options(&self, zone_id: &str) -> Route53Options {
        Route53Options {
            zone_id: zone_id.to_string(),
            endpoint: Some(self.endpoint.url().to_string()),
            ca_bundle: None,
            region: Some(REGION.to_string()),
            static_credentials: Some((ACCESS_KEY.to_string(), SECRET_KEY.to_string())),
        }
    }

    async fn zone(&self) -> Route53Zone {
        Route53Zone::connect(self.options(&self.zone_id))
            .await
            .expect("connect to the zone")
    }

    /// Apply `changes` (action, name, type, value) in one batch, with the SDK.
    async fn change(&self, changes: &[(ChangeAction, &str, RrType, &str)]) {
        let changes = changes
            .iter()
            .map(|(action, name, kind, value)| {
                let set = ResourceRecordSet::builder()
                    .name(*name)
                    .r#type(kind.clone())
                    .ttl(TTL)
                    .resource_records(ResourceRecord::builder().value(*value).build().unwrap())
                    .build()
                    .unwrap();
                Change::builder()
                    .action(action.clone())
                    .resource_record_set(set)
                    .build()
                    .unwrap()
            })
            .collect();
        self.endpoint
            .client()
            .change_resource_record_sets()
            .hosted_zone_id(&self.zone_id)
            .change_batch(
                ChangeBatch::builder()
                    .set_changes(Some(changes))
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .expect("change records");
    }

    /// Cluster 1 (owner mgmt-a): `api` with its owner TXT at the same name
    /// (older external-dns) and `oauth` with it at `a-oauth` (newer); cluster 2
    /// (owner mgmt-b): `api`; and a record external-dns does not manage.
    async fn seed_two_clusters(&self) {
        let txt_a = owner_txt("mgmt-a", "clusters-c1", "kube-apiserver");
        let txt_a_oauth = owner_txt("mgmt-a", "clusters-c1", "oauth");
        let txt_b = owner_txt("mgmt-b", "clusters-c2", "kube-apiserver");
        self.change(&[
            (ChangeAction::Create, API_C1, RrType::A, "192.0.2.1"),
            (ChangeAction::Create, API_C1, RrType::Txt, &txt_a),
            (ChangeAction::Create, OAUTH_C1, RrType::A, "192.0.2.2"),
            (
                ChangeAction::Create,
                "a-oauth.c1.example.com",
                RrType::Txt,
                &txt_a_oauth,
            ),
            (ChangeAction::Create, API_C2, RrType::A, "192.0.2.3"),
            (ChangeAction::Create, API_C2, RrType::Txt, &txt_b),
            (
                ChangeAction::Create,
                "www.example.com",
                RrType::A,
                "192.0.2.80",
            ),
        ])
        .await;
    }
}

fn hosts(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// (name, type, values, owner) of each record, for exact comparisons.
fn summary(records: &[Record]) -> Vec<(String, String, Vec<String>, Option<String>)> {
    records
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                r.kind.clone(),
                r.values.clone(),
                r.owner.clone(),
            )
        })
        .collect()
}

fn row(
    name: &str,
    kind: &str,
    value: &str,
    owner: Option<&str>,
) -> (String, String, Vec<String>, Option<String>) {
    (
        name.into(),
        kind.into(),
        vec![value.into()],
        owner.map(str::to_string),
    )
}

fn cluster1_rows() -> Vec<(String, String, Vec<String>, Option<String>)> {
    vec![
        row(
            "a-oauth.c1.example.com",
            "TXT",
            &owner_txt("mgmt-a", "clusters-c1", "oauth"),
            Some("mgmt-a"),
        ),
        row(API_C1, "A", "192.0.2.1", Some("mgmt-a")),
        row(
            API_C1,
            "TXT",
            &owner_txt("mgmt-a", "clusters-c1", "kube-apiserver"),
            Some("mgmt-a"),
        ),
        row(OAUTH_C1, "A", "192.0.2.2", Some("mgmt-a")),
    ]
}

fn cluster2_rows() -> Vec<(String, String, Vec<String>, Option<String>)> {
    vec![
        row(API_C2, "A", "192.0.2.3", Some("mgmt-b")),
        row(
            API_C2,
            "TXT",
            &owner_txt("mgmt-b", "clusters-c2", "kube-apiserver"),
            Some("mgmt-b"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finds_and_deletes_only_the_owners_records() {
    let fx = Fixture::start().await;
    fx.seed_two_clusters().await;
    // The zone id as the console shows it works too.
    let zone = Route53Zone::connect(fx.options(&format!("/hostedzone/{}", fx.zone_id)))
        .await
        .expect("connect with a /hostedzone/ id");
    assert_eq!(zone.zone_id(), fx.zone_id);
    assert_eq!(zone.zone_name(), ZONE);
    let c1 = hosts(&["API.c1.example.com.", OAUTH_C1]);

    // Plain look-up: names normalised, TXT owners parsed.
    let found = zone
        .records(&hosts(&["Api.C2.Example.Com.", "www.example.com"]))
        .await
        .expect("records");
    // A plain look-up names no owner for address records.
    assert_eq!(
        summary(&found),
        [
            row(API_C2, "A", "192.0.2.3", None),
            cluster2_rows()[1].clone(),
            row("www.example.com", "A", "192.0.2.80", None),
        ]
    );
    assert!(found.iter().all(|r| r.ttl == Some(TTL)));

    // Cluster 1's records: exactly its A records and owner TXT records.
    let records = zone.cluster_records(&c1).await.expect("cluster records");
    assert_eq!(summary(&records), cluster1_rows());

    // The wrong owner: nothing deleted, the records named.
    let err = zone
        .delete_owned(&hosts(&[API_C2]), "mgmt-a")
        .await
        .expect_err("mgmt-b's records are not mgmt-a's");
    let DnsError::NotOwned {
        zone_id,
        owner,
        records,
    } = &err
    else {
        panic!("expected NotOwned, got {err}");
    };
    assert_eq!(
        (zone_id.as_str(), owner.as_str()),
        (fx.zone_id.as_str(), "mgmt-a")
    );
    assert_eq!(summary(records), cluster2_rows());
    let message = err.to_string();
    assert!(
        message.contains("api.c2.example.com A 192.0.2.3 [owner mgmt-b]")
            && message.contains("nothing was deleted"),
        "{message}"
    );

    // Mixed ownership: all or nothing.
    let err = zone
        .delete_owned(&hosts(&[API_C1, API_C2]), "mgmt-a")
        .await
        .expect_err("mixed owners");
    assert!(matches!(err, DnsError::NotOwned { .. }), "{err}");
    assert_eq!(
        summary(&zone.cluster_records(&c1).await.expect("after refusal")),
        cluster1_rows()
    );

    // The right owner: cluster 1's records go, in one batch with exact values.
    let deleted = zone.delete_owned(&c1, "mgmt-a").await.expect("delete");
    assert_eq!(summary(&deleted), cluster1_rows());
    assert_eq!(
        zone.cluster_records(&c1).await.expect("after delete"),
        Vec::<Record>::new()
    );
    let left = zone
        .records(&hosts(&[API_C2, "www.example.com"]))
        .await
        .expect("others");
    assert_eq!(left.len(), 3, "mgmt-b's and the unmanaged records stay");
    assert_eq!(
        summary(&zone.cluster_records(&hosts(&[API_C2])).await.unwrap()),
        cluster2_rows()
    );

    // Again: nothing left, nothing done.
    assert_eq!(
        zone.delete_owned(&c1, "mgmt-a")
            .await
            .expect("second delete"),
        Vec::<Record>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_gone_returns_when_the_records_go_and_reports_those_that_stay() {
    let fx = Fixture::start().await;
    fx.seed_two_clusters().await;
    let zone = fx.zone().await;

    // external-dns withdrawing cluster 1's records a little later.
    let withdraw = {
        let client = fx.endpoint.client();
        let zone_id = fx.zone_id.clone();
        let records = zone
            .cluster_records(&hosts(&[API_C1, OAUTH_C1]))
            .await
            .expect("cluster 1");
        assert_eq!(records.len(), 4);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let changes = records
                .iter()
                .map(|r| {
                    let set = ResourceRecordSet::builder()
                        .name(&r.name)
                        .r#type(RrType::from(r.kind.as_str()))
                        .set_ttl(r.ttl)
                        .resource_records(
                            ResourceRecord::builder()
                                .value(&r.values[0])
                                .build()
                                .unwrap(),
                        )
                        .build()
                        .unwrap();
                    Change::builder()
                        .action(ChangeAction::Delete)
                        .resource_record_set(set)
                        .build()
                        .unwrap()
                })
                .collect();
            client
                .change_resource_record_sets()
                .hosted_zone_id(zone_id)
                .change_batch(
                    ChangeBatch::builder()
                        .set_changes(Some(changes))
                        .build()
                        .unwrap(),
                )
                .send()
                .await
                .expect("withdraw");
        })
    };
    let start = Instant::now();
    zone.wait_gone(
        &hosts(&[API_C1, OAUTH_C1]),
        Duration::from_secs(60),
        Duration::from_millis(100),
    )
    .await
    .expect("records withdrawn");
    assert!(
        start.elapsed() >= Duration::from_millis(700),
        "returned before the withdrawal"
    );
    withdraw.await.expect("withdraw task");
    assert!(
        zone.cluster_records(&hosts(&[API_C1, OAUTH_C1]))
            .await
            .unwrap()
            .is_empty()
    );

    // Records that stay: a bounded wait, then the records and what to do.
    let err = zone
        .wait_gone(
            &hosts(&[API_C2]),
            Duration::from_secs(2),
            Duration::from_millis(250),
        )
        .await
        .expect_err("mgmt-b's records stay");
    let DnsError::StillPresent {
        zone_id,
        records,
        waited,
    } = &err
    else {
        panic!("expected StillPresent, got {err}");
    };
    assert_eq!(zone_id, &fx.zone_id);
    assert_eq!(summary(records), cluster2_rows());
    assert!(*waited >= Duration::from_secs(2), "{waited:?}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("zone {}", fx.zone_id))
            && message.contains("api.c2.example.com A 192.0.2.3 [owner mgmt-b]")
            && message.contains("--dns-direct"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listings_follow_pagination() {
    let fx = Fixture::start().await;
    let names: Vec<String> = (0..320)
        .map(|i| format!("h{i:03}.bulk.example.com"))
        .collect();
    let values: Vec<String> = (0..320)
        .map(|i| format!("198.51.100.{}", i % 250))
        .collect();
    let changes: Vec<(ChangeAction, &str, RrType, &str)> = names
        .iter()
        .zip(&values)
        .map(|(n, v)| (ChangeAction::Create, n.as_str(), RrType::A, v.as_str()))
        .collect();
    fx.change(&changes).await;
    let zone = fx.zone().await;

    // More than one page (Route53 answers 300 at most): all 320, SOA and NS.
    let all = zone.list_all().await.expect("list all");
    assert_eq!(all.len(), 322, "320 A records + SOA + NS");
    let last = all
        .iter()
        .find(|r| r.name == "h319.bulk.example.com")
        .expect("a record from the second page");
    assert_eq!(last.values, ["198.51.100.69"]);
    let bulk: Vec<&str> = all
        .iter()
        .filter(|r| r.kind == "A")
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(bulk.len(), 320, "no record listed twice or skipped");

    // A look-up by name near the end of the zone finds exactly that record.
    let found = zone
        .records(&hosts(&["H318.bulk.example.com."]))
        .await
        .expect("records");
    assert_eq!(
        summary(&found),
        [row("h318.bulk.example.com", "A", "198.51.100.68", None)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connect_and_lookups_refuse_the_wrong_zone() {
    let fx = Fixture::start().await;
    let err = Route53Zone::connect(fx.options("ZNOSUCHZONE0"))
        .await
        .expect_err("unknown zone");
    assert!(
        matches!(&err, DnsError::ZoneNotFound { zone_id, .. } if zone_id == "ZNOSUCHZONE0"),
        "{err}"
    );
    let err = Route53Zone::connect(fx.options("/hostedzone/"))
        .await
        .expect_err("empty id");
    assert!(matches!(err, DnsError::BadZoneId { .. }), "{err}");

    let zone = fx.zone().await;
    let err = zone
        .records(&hosts(&["api.c1.example.org"]))
        .await
        .expect_err("not in the zone");
    assert_eq!(
        err.to_string(),
        format!(
            "api.c1.example.org is not in Route53 hosted zone {} (example.com): check the zone id",
            fx.zone_id
        )
    );
    // A name that merely ends like the zone is not in it either.
    assert!(matches!(
        zone.records(&hosts(&["api.notexample.com"])).await,
        Err(DnsError::NotInZone { .. })
    ));
}

/// What `dns-takeover` deletes, `create` puts back as it was (values, TTL,
/// owner records), in one change; a record that exists again refuses the
/// whole change. (The records are seeded with UPSERT, as external-dns
/// writes them: moto refuses a CREATE identical to an earlier CREATE of its
/// journal whenever any record sorts after it, which Route53 does not.)
#[tokio::test(flavor = "multi_thread")]
async fn deleted_records_are_put_back_exactly_and_all_or_nothing() {
    let fx = Fixture::start().await;
    let txt_a = owner_txt("mgmt-a", "clusters-c1", "kube-apiserver");
    let txt_a_oauth = owner_txt("mgmt-a", "clusters-c1", "oauth");
    fx.change(&[
        (ChangeAction::Upsert, API_C1, RrType::A, "192.0.2.1"),
        (ChangeAction::Upsert, API_C1, RrType::Txt, &txt_a),
        (ChangeAction::Upsert, OAUTH_C1, RrType::A, "192.0.2.2"),
        (ChangeAction::Upsert, "a-oauth.c1.example.com", RrType::Txt, &txt_a_oauth),
        (ChangeAction::Upsert, "www.example.com", RrType::A, "192.0.2.80"),
    ])
    .await;
    let zone = fx.zone().await;
    let c1 = hosts(&[API_C1, OAUTH_C1]);
    let before = zone.cluster_records(&c1).await.expect("records");
    let deleted = zone.delete_owned(&c1, "mgmt-a").await.expect("delete");
    assert_eq!(summary(&deleted), summary(&before));
    assert!(zone.cluster_records(&c1).await.unwrap().is_empty());

    zone.create(&deleted).await.expect("put back");
    let after = zone.cluster_records(&c1).await.expect("records");
    assert_eq!(after, before, "values, TTLs and owners as before");

    // again: every record exists, so nothing is created and the error names them
    let err = zone.create(&deleted).await.expect_err("exists");
    assert!(err.to_string().contains("api.c1.example.com"), "{err}");
    assert_eq!(zone.cluster_records(&c1).await.unwrap(), before);
    // an empty change is no change
    zone.create(&[]).await.expect("nothing to create");
}
