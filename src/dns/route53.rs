//! The Route53 zone (aws-sdk-route53): record look-ups by name with
//! `ListResourceRecordSets` pagination, and owner-checked deletions as one
//! atomic `ChangeResourceRecordSets` batch.
//!
//! Credentials come from the usual AWS chain (environment, profile, web
//! identity, ...) unless given; they are resolved once at `connect` so a
//! missing one is reported before any DNS work starts. The HTTPS client
//! (rustls, optional CA bundle) and the error formatting are the S3 store's.
//!
//! A look-up asks Route53 for the record sets starting at each name and stops
//! at the first set of another name, so its cost does not grow with the zone.
//! A deletion sends every record set exactly as listed (Route53 deletes only
//! a set whose TTL and values match); when the records change between the
//! listing and the batch, the batch is rejected whole and the deletion is
//! re-planned from a fresh listing.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_route53::Client;
use aws_sdk_route53::config::retry::RetryConfig;
use aws_sdk_route53::config::{
    BehaviorVersion, Credentials, ProvideCredentials, Region, SharedCredentialsProvider,
};
use aws_sdk_route53::types::{Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType};

use super::{
    DnsError, DnsZone, Record, cluster_view, normalize_name, plan_deletion, registry_names,
    txt_owner,
};
use crate::store::s3::{https_client, sdk_message};

/// Route53 is global; requests are signed for this region unless another is set.
const DEFAULT_REGION: &str = "us-east-1";
/// Attempts per request (Route53 throttles at five requests a second per account).
const MAX_ATTEMPTS: u32 = 6;
/// Record sets asked for per page when looking up one name.
const NAME_PAGE: i32 = 16;
/// Deletion batches tried when the records change under us.
const BATCH_ATTEMPTS: u32 = 3;
/// How long resolving credentials at `connect` may take.
const CREDENTIALS_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach a Route53 hosted zone. Resolved once by the CLI.
#[derive(Clone, Default)]
pub struct Route53Options {
    /// The hosted zone: `Z123` or `/hostedzone/Z123`.
    pub zone_id: String,
    /// Endpoint override (tests, private endpoints); else the SDK's
    /// (`AWS_ENDPOINT_URL_ROUTE_53`, `AWS_ENDPOINT_URL`, then AWS).
    pub endpoint: Option<String>,
    /// Extra CA certificates (PEM) to trust, e.g. a private endpoint's.
    pub ca_bundle: Option<PathBuf>,
    /// Region to sign for; the SDK's chain when None, else us-east-1.
    pub region: Option<String>,
    /// Access key and secret to use instead of the SDK's credential chain.
    /// For embedding and tests.
    pub static_credentials: Option<(String, String)>,
}

impl std::fmt::Debug for Route53Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route53Options")
            .field("zone_id", &self.zone_id)
            .field("endpoint", &self.endpoint)
            .field("ca_bundle", &self.ca_bundle)
            .field("region", &self.region)
            .field(
                "static_credentials",
                &self.static_credentials.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// A Route53 hosted zone.
pub struct Route53Zone {
    client: Client,
    zone_id: String,
    zone_name: String,
}

impl std::fmt::Debug for Route53Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route53Zone")
            .field("zone_id", &self.zone_id)
            .field("zone_name", &self.zone_name)
            .finish_non_exhaustive()
    }
}

/// The bare zone id (`Z123`) of `Z123` or `/hostedzone/Z123`.
pub fn parse_zone_id(raw: &str) -> Result<String, DnsError> {
    let trimmed = raw.trim();
    let id = trimmed
        .strip_prefix("/hostedzone/")
        .or_else(|| trimmed.strip_prefix("hostedzone/"))
        .unwrap_or(trimmed);
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(DnsError::BadZoneId {
            zone_id: raw.to_string(),
        });
    }
    Ok(id.to_string())
}

/// A listed record set as hcp-dr sees it.
fn record_of(set: &ResourceRecordSet) -> Record {
    let kind = set.r#type().as_str().to_string();
    let values: Vec<String> = set
        .resource_records()
        .iter()
        .map(|r| r.value().to_string())
        .collect();
    let owner = if kind == "TXT" {
        values.iter().find_map(|v| txt_owner(v))
    } else {
        None
    };
    Record {
        name: normalize_name(set.name()),
        kind,
        ttl: set.ttl(),
        values,
        set_identifier: set.set_identifier().map(str::to_string),
        alias: set.alias_target().map(|a| normalize_name(a.dns_name())),
        owner,
    }
}

/// Resolve credentials once, so that missing ones are reported now, saying
/// what to set, rather than as a signing error in the middle of a migration.
async fn check_credentials(
    provider: Option<SharedCredentialsProvider>,
    zone_id: &str,
    endpoint: Option<&str>,
) -> Result<(), DnsError> {
    let no_credentials =
        |source: Box<dyn std::error::Error + Send + Sync>| DnsError::NoCredentials {
            zone_id: zone_id.to_string(),
            endpoint: endpoint.unwrap_or("the AWS Route53 endpoint").to_string(),
            source,
        };
    let provider =
        provider.ok_or_else(|| no_credentials("no credential provider is configured".into()))?;
    match tokio::time::timeout(CREDENTIALS_TIMEOUT, provider.provide_credentials()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(no_credentials(Box::new(err))),
        Err(_) => Err(no_credentials(
            format!(
                "the credential chain gave no answer in {}s",
                CREDENTIALS_TIMEOUT.as_secs()
            )
            .into(),
        )),
    }
}

/// Where a listing continues: name, type, set identifier.
type Cursor = (String, Option<RrType>, Option<String>);

impl Route53Zone {
    /// Build a client for the zone in `options`, resolve credentials, and
    /// read the zone (which checks that it exists and can be read).
    pub async fn connect(options: Route53Options) -> Result<Route53Zone, DnsError> {
        let zone_id = parse_zone_id(&options.zone_id)?;
        let http =
            https_client(options.ca_bundle.as_deref()).map_err(|source| DnsError::CaBundle {
                path: options.ca_bundle.clone().unwrap_or_default(),
                source,
            })?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS));
        if let Some(region) = &options.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some((key, secret)) = &options.static_credentials {
            loader = loader.credentials_provider(Credentials::new(
                key.clone(),
                secret.clone(),
                None,
                None,
                "hcp-dr",
            ));
        }
        let shared = loader.load().await;
        let endpoint = options
            .endpoint
            .clone()
            .or_else(|| shared.endpoint_url().map(str::to_string));
        if options.static_credentials.is_none() {
            check_credentials(shared.credentials_provider(), &zone_id, endpoint.as_deref()).await?;
        }
        let mut config = aws_sdk_route53::config::Builder::from(&shared);
        if shared.region().is_none() {
            config = config.region(Region::new(DEFAULT_REGION));
        }
        if let Some(endpoint) = &options.endpoint {
            config = config.endpoint_url(endpoint);
        }
        let client = Client::from_conf(config.build());
        let zone = client
            .get_hosted_zone()
            .id(&zone_id)
            .send()
            .await
            .map_err(|err| {
                match err
                    .as_service_error()
                    .filter(|e| e.is_no_such_hosted_zone())
                {
                    Some(_) => DnsError::ZoneNotFound {
                        zone_id: zone_id.clone(),
                        message: sdk_message(&err),
                    },
                    None => DnsError::Route53 {
                        operation: "GetHostedZone",
                        zone_id: zone_id.clone(),
                        subject: "the zone".into(),
                        message: sdk_message(&err),
                    },
                }
            })?;
        let zone_name = zone
            .hosted_zone()
            .map(|z| normalize_name(z.name()))
            .ok_or_else(|| DnsError::ZoneNotFound {
                zone_id: zone_id.clone(),
                message: "GetHostedZone answered without a zone".into(),
            })?;
        Ok(Route53Zone {
            client,
            zone_id,
            zone_name,
        })
    }

    /// The zone's domain (normalised: lower case, no trailing dot).
    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// Every record set of the zone (SOA and NS included), page after page.
    pub async fn list_all(&self) -> Result<Vec<Record>, DnsError> {
        let sets = self.scan(None, None, "all records", &|_| true).await?;
        Ok(sets.iter().map(record_of).collect())
    }

    /// Record sets in Route53's order from `start` (or the zone's first),
    /// `page` at a time, until one whose normalised name `keep` refuses or
    /// the zone ends.
    async fn scan(
        &self,
        start: Option<&str>,
        page: Option<i32>,
        subject: &str,
        keep: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Vec<ResourceRecordSet>, DnsError> {
        let mut out = Vec::new();
        let mut cursor: Option<Cursor> = start.map(|name| (name.to_string(), None, None));
        loop {
            let mut request = self
                .client
                .list_resource_record_sets()
                .hosted_zone_id(&self.zone_id)
                .set_max_items(page);
            if let Some((name, kind, identifier)) = cursor.clone() {
                request = request
                    .start_record_name(name)
                    .set_start_record_type(kind)
                    .set_start_record_identifier(identifier);
            }
            let answer = request
                .send()
                .await
                .map_err(|err| self.error("ListResourceRecordSets", subject, sdk_message(&err)))?;
            for set in answer.resource_record_sets() {
                if !keep(&normalize_name(set.name())) {
                    return Ok(out);
                }
                out.push(set.clone());
            }
            let next = match answer.next_record_name() {
                Some(name) if answer.is_truncated() => (
                    name.to_string(),
                    answer.next_record_type().cloned(),
                    answer.next_record_identifier().map(str::to_string),
                ),
                _ => return Ok(out),
            };
            if cursor.as_ref() == Some(&next) {
                return Err(self.error(
                    "ListResourceRecordSets",
                    subject,
                    format!("the listing did not advance past {}", next.0),
                ));
            }
            cursor = Some(next);
        }
    }

    /// The record sets at `names`, each with what was listed.
    async fn lookup(&self, names: &[String]) -> Result<Vec<(Record, ResourceRecordSet)>, DnsError> {
        let names: BTreeSet<String> = names.iter().map(|n| normalize_name(n)).collect();
        for name in &names {
            if name != &self.zone_name && !name.ends_with(&format!(".{}", self.zone_name)) {
                return Err(DnsError::NotInZone {
                    zone_id: self.zone_id.clone(),
                    zone_name: self.zone_name.clone(),
                    name: name.clone(),
                });
            }
        }
        let mut out = Vec::new();
        for name in &names {
            let sets = self
                .scan(Some(name), Some(NAME_PAGE), name, &|listed| listed == name)
                .await?;
            out.extend(sets.into_iter().map(|set| (record_of(&set), set)));
        }
        out.sort_by(|a, b| a.0.key().cmp(&b.0.key()));
        Ok(out)
    }

    fn error(&self, operation: &'static str, subject: &str, message: String) -> DnsError {
        DnsError::Route53 {
            operation,
            zone_id: self.zone_id.clone(),
            subject: subject.to_string(),
            message,
        }
    }

    /// One DELETE batch for `records`, each sent exactly as `listed`.
    fn delete_batch(
        &self,
        records: &[Record],
        listed: &[(Record, ResourceRecordSet)],
        owner: &str,
    ) -> Result<ChangeBatch, DnsError> {
        let build = |e: aws_sdk_route53::error::BuildError| {
            self.error(
                "ChangeResourceRecordSets",
                "building the batch",
                e.to_string(),
            )
        };
        let mut changes = Vec::with_capacity(records.len());
        for record in records {
            let set = listed
                .iter()
                .find(|(seen, _)| seen.key() == record.key())
                .map(|(_, set)| set.clone())
                .ok_or_else(|| {
                    self.error(
                        "ChangeResourceRecordSets",
                        &record.to_string(),
                        "not in the listing".into(),
                    )
                })?;
            changes.push(
                Change::builder()
                    .action(ChangeAction::Delete)
                    .resource_record_set(set)
                    .build()
                    .map_err(build)?,
            );
        }
        ChangeBatch::builder()
            .comment(format!("hcp-dr: withdraw records owned by {owner}"))
            .set_changes(Some(changes))
            .build()
            .map_err(build)
    }
}

#[async_trait]
impl DnsZone for Route53Zone {
    fn zone_id(&self) -> &str {
        &self.zone_id
    }
    fn domain(&self) -> &str {
        &self.zone_name
    }

    async fn records(&self, names: &[String]) -> Result<Vec<Record>, DnsError> {
        Ok(self
            .lookup(names)
            .await?
            .into_iter()
            .map(|(record, _)| record)
            .collect())
    }

    async fn create(&self, records: &[Record]) -> Result<(), DnsError> {
        if records.is_empty() {
            return Ok(());
        }
        let subject = records.iter().map(|r| format!("{} {}", r.name, r.kind)).collect::<Vec<_>>().join(", ");
        let build = |e: aws_sdk_route53::error::BuildError| self.error("ChangeResourceRecordSets", &subject, e.to_string());
        let mut changes = Vec::with_capacity(records.len());
        for record in records {
            if let Some(target) = &record.alias {
                return Err(self.error(
                    "ChangeResourceRecordSets",
                    &record.to_string(),
                    format!("an alias record (to {target}) cannot be recreated from its listing: recreate it by hand"),
                ));
            }
            let mut set = ResourceRecordSet::builder()
                .name(format!("{}.", record.name))
                .r#type(RrType::from(record.kind.as_str()))
                .set_ttl(Some(record.ttl.unwrap_or(300)))
                .set_set_identifier(record.set_identifier.clone());
            for value in &record.values {
                set = set.resource_records(ResourceRecord::builder().value(value).build().map_err(build)?);
            }
            changes.push(
                Change::builder()
                    .action(ChangeAction::Create)
                    .resource_record_set(set.build().map_err(build)?)
                    .build()
                    .map_err(build)?,
            );
        }
        let batch = ChangeBatch::builder()
            .comment("hcp-dr: put back records it deleted")
            .set_changes(Some(changes))
            .build()
            .map_err(build)?;
        self.client
            .change_resource_record_sets()
            .hosted_zone_id(&self.zone_id)
            .change_batch(batch)
            .send()
            .await
            .map_err(|err| self.error("ChangeResourceRecordSets", &format!("creating {subject}"), sdk_message(&err)))?;
        for record in records {
            tracing::info!(zone = %self.zone_id, record = %record, "created DNS record");
        }
        Ok(())
    }

    async fn delete_owned(&self, hosts: &[String], owner: &str) -> Result<Vec<Record>, DnsError> {
        let names: Vec<String> = hosts.iter().flat_map(|h| registry_names(h)).collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let listed = self.lookup(&names).await?;
            let records: Vec<Record> = listed.iter().map(|(record, _)| record.clone()).collect();
            let plan = plan_deletion(&cluster_view(hosts, &records), owner);
            if !plan.foreign.is_empty() {
                return Err(DnsError::NotOwned {
                    zone_id: self.zone_id.clone(),
                    owner: owner.to_string(),
                    records: plan.foreign,
                });
            }
            if plan.delete.is_empty() {
                tracing::info!(zone = %self.zone_id, owner, "no DNS records left to delete");
                return Ok(Vec::new());
            }
            let batch = self.delete_batch(&plan.delete, &listed, owner)?;
            let sent = self
                .client
                .change_resource_record_sets()
                .hosted_zone_id(&self.zone_id)
                .change_batch(batch)
                .send()
                .await;
            match sent {
                Ok(_) => {
                    for record in &plan.delete {
                        tracing::info!(zone = %self.zone_id, record = %record, "deleted DNS record");
                    }
                    return Ok(plan.delete);
                }
                Err(err)
                    if err
                        .as_service_error()
                        .is_some_and(|e| e.is_invalid_change_batch()) =>
                {
                    if attempt >= BATCH_ATTEMPTS {
                        return Err(DnsError::Changing {
                            zone_id: self.zone_id.clone(),
                            attempts: attempt,
                            message: sdk_message(&err),
                        });
                    }
                    tracing::warn!(zone = %self.zone_id, error = %sdk_message(&err), "DNS records changed while deleting; listing them again");
                }
                Err(err) => {
                    let subject = plan
                        .delete
                        .iter()
                        .map(|r| format!("{} {}", r.name, r.kind))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(self.error(
                        "ChangeResourceRecordSets",
                        &format!("deleting {subject}"),
                        sdk_message(&err),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_ids_take_both_forms() {
        assert_eq!(parse_zone_id("Z0123ABC").expect("bare"), "Z0123ABC");
        assert_eq!(
            parse_zone_id("/hostedzone/Z0123ABC").expect("prefixed"),
            "Z0123ABC"
        );
        assert_eq!(parse_zone_id(" hostedzone/Z9 ").expect("no slash"), "Z9");
        for bad in ["", "/hostedzone/", "Z12/rrset", "Z 12"] {
            let err = parse_zone_id(bad).expect_err(bad);
            assert!(matches!(err, DnsError::BadZoneId { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn listed_sets_become_records_with_owners() {
        let set = ResourceRecordSet::builder()
            .name("API.example.com.")
            .r#type(RrType::Txt)
            .ttl(30)
            .resource_records(
                aws_sdk_route53::types::ResourceRecord::builder()
                    .value("\"heritage=external-dns,external-dns/owner=mgmt-a\"")
                    .build()
                    .expect("record"),
            )
            .build()
            .expect("set");
        let record = record_of(&set);
        assert_eq!(record.name, "api.example.com");
        assert_eq!(record.kind, "TXT");
        assert_eq!(record.ttl, Some(30));
        assert_eq!(record.owner.as_deref(), Some("mgmt-a"));
        assert!(record.is_owner_record());
    }

    #[tokio::test]
    async fn missing_credentials_say_what_to_set() {
        // A real provider that finds nothing: a profile that does not exist.
        let http = https_client(None).expect("http client");
        let provider = aws_config::profile::ProfileFileCredentialsProvider::builder()
            .configure(&aws_config::provider_config::ProviderConfig::empty().with_http_client(http))
            .profile_name("hcp-dr-test-profile-that-does-not-exist")
            .build();
        let err = check_credentials(
            Some(SharedCredentialsProvider::new(provider)),
            "Z1",
            Some("http://127.0.0.1:9"),
        )
        .await
        .expect_err("no such profile");
        assert!(matches!(err, DnsError::NoCredentials { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "no AWS credentials for Route53 zone Z1 at http://127.0.0.1:9: set AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or a web identity token)"
        );
        let err = check_credentials(None, "Z1", None)
            .await
            .expect_err("no provider");
        assert!(
            err.to_string()
                .contains("zone Z1 at the AWS Route53 endpoint: set AWS_ACCESS_KEY_ID"),
            "{err}"
        );
        let fine =
            SharedCredentialsProvider::new(Credentials::new("AKIAX", "secret", None, None, "test"));
        check_credentials(Some(fine), "Z1", None)
            .await
            .expect("static credentials");
    }

    #[test]
    fn options_debug_hides_the_secret() {
        let options = Route53Options {
            zone_id: "Z1".into(),
            static_credentials: Some(("AKIAEXAMPLE".into(), "very-secret".into())),
            ..Route53Options::default()
        };
        let shown = format!("{options:?}");
        assert!(
            !shown.contains("very-secret") && !shown.contains("AKIAEXAMPLE"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
