//! The DNS zone a hosted cluster's API hostnames live in, as migrate needs
//! it: read the record sets of some names, find a cluster's records and the
//! external-dns owner records next to them, withdraw the records one owner
//! holds, and wait until they are gone.
//!
//! external-dns (TXT registry) marks every record it manages with a TXT
//! record holding `"heritage=external-dns,external-dns/owner=<owner>,..."`:
//! older releases put it at the record's own name, newer ones at
//! `<type>-<name>` (`a-api.example.com`, `cname-api.example.com`). A record is
//! *owned* by the owner its TXT record names; hcp-dr only ever deletes records
//! owned by the source management cluster's external-dns. Custom
//! `--txt-prefix` / `--txt-suffix` settings are not recognised.
//!
//! The pure rules (name normalisation, owner parsing, which records belong to
//! a host and to whom, what a deletion may touch) live here; `route53` is the
//! AWS implementation.

pub mod route53;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

pub use route53::{Route53Options, Route53Zone};

/// Record types that carry a hostname's address (and that external-dns
/// writes for a Route).
pub const ADDRESS_KINDS: [&str; 3] = ["A", "AAAA", "CNAME"];

/// One record set of a zone.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// Owner name, normalised: lower case, no trailing dot, escapes decoded.
    pub name: String,
    /// Record type, upper case (`A`, `CNAME`, `TXT`, ...).
    pub kind: String,
    /// TTL in seconds (absent for alias records).
    pub ttl: Option<i64>,
    /// Values as the zone stores them (TXT values keep their quotes).
    pub values: Vec<String>,
    /// Set identifier of weighted / latency / failover / ... record sets.
    pub set_identifier: Option<String>,
    /// Alias target DNS name, for alias records.
    pub alias: Option<String>,
    /// The external-dns owner: for a registry TXT record, the owner its value
    /// names; for an address record returned by
    /// [`DnsZone::cluster_records`], the owner its registry TXT record names.
    /// `None` when no owner record says.
    pub owner: Option<String>,
}

impl Record {
    /// Whether this is an address record (A, AAAA or CNAME).
    pub fn is_address(&self) -> bool {
        ADDRESS_KINDS.contains(&self.kind.as_str())
    }

    /// Whether this is an external-dns registry (owner) TXT record.
    pub fn is_owner_record(&self) -> bool {
        self.kind == "TXT" && self.values.iter().any(|v| txt_owner(v).is_some())
    }

    /// Name, type and set identifier: what identifies a record set in a zone.
    pub fn key(&self) -> (&str, &str, Option<&str>) {
        (&self.name, &self.kind, self.set_identifier.as_deref())
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.kind)?;
        if let Some(id) = &self.set_identifier {
            write!(f, " (set {id})")?;
        }
        match &self.alias {
            Some(target) => write!(f, " alias {target}")?,
            None => write!(f, " {}", self.values.join(" "))?,
        }
        match (&self.owner, self.kind.as_str()) {
            (Some(owner), _) => write!(f, " [owner {owner}]"),
            (None, "TXT") => Ok(()),
            (None, _) => write!(f, " [no owner record]"),
        }
    }
}

/// Why a DNS operation failed. Messages name the zone and the records;
/// they never hold credentials.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The hosted zone id is not of the form `Z123` or `/hostedzone/Z123`.
    #[error("hosted zone id `{zone_id}` is not valid: expected `Z...` or `/hostedzone/Z...`")]
    BadZoneId {
        /// The id as given.
        zone_id: String,
    },
    /// The CA bundle given for the Route53 endpoint could not be used.
    #[error("CA bundle {path} for Route53: {source}", path = path.display())]
    CaBundle {
        /// The bundle's path.
        path: std::path::PathBuf,
        /// Why it could not be read or parsed.
        #[source]
        source: std::io::Error,
    },
    /// The AWS credential chain produced no credentials.
    #[error(
        "no AWS credentials for Route53 zone {zone_id} at {endpoint}: set AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or a web identity token)"
    )]
    NoCredentials {
        /// The zone asked for.
        zone_id: String,
        /// The endpoint in use (`the AWS Route53 endpoint` when not overridden).
        endpoint: String,
        /// What the credential chain said (never the credentials).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The hosted zone does not exist or cannot be read with these credentials.
    #[error("Route53 hosted zone {zone_id} not found: {message}")]
    ZoneNotFound {
        /// The zone asked for.
        zone_id: String,
        /// Route53's answer.
        message: String,
    },
    /// A name asked about is not inside the zone.
    #[error("{name} is not in Route53 hosted zone {zone_id} ({zone_name}): check the zone id")]
    NotInZone {
        /// The zone.
        zone_id: String,
        /// The zone's domain.
        zone_name: String,
        /// The name asked about.
        name: String,
    },
    /// A Route53 API call failed.
    #[error("Route53 {operation} in zone {zone_id} ({subject}): {message}")]
    Route53 {
        /// The API operation (`ListResourceRecordSets`, ...).
        operation: &'static str,
        /// The zone.
        zone_id: String,
        /// What it was about (names, records).
        subject: String,
        /// Route53's error code and message, or the transport error.
        message: String,
    },
    /// Some of the records of the hosts are not owned by the owner asked for;
    /// nothing was deleted.
    #[error(
        "not deleting DNS records in zone {zone_id}: {} not owned by external-dns owner `{owner}`: {}; \
         nothing was deleted. Check the owner id (external-dns --txt-owner-id on the source \
         management cluster) or remove these records by hand",
        if records.len() == 1 { "this record is" } else { "these records are" },
        list(records)
    )]
    NotOwned {
        /// The zone.
        zone_id: String,
        /// The owner the caller named.
        owner: String,
        /// The records owned by someone else or by no one.
        records: Vec<Record>,
    },
    /// The records kept changing while a deletion was prepared.
    #[error(
        "deleting DNS records in zone {zone_id}: the records changed under us {attempts} times: {message}"
    )]
    Changing {
        /// The zone.
        zone_id: String,
        /// How many batches were tried.
        attempts: u32,
        /// Route53's last answer.
        message: String,
    },
    /// Records were still there when the wait ran out.
    #[error(
        "DNS records still present in zone {zone_id} after {}: {}. Check that external-dns on the \
         source management cluster is running and withdrawing them (its logs, its --txt-owner-id), \
         or rerun with --dns-direct to delete them directly",
        seconds(*waited),
        list(records)
    )]
    StillPresent {
        /// The zone.
        zone_id: String,
        /// The records that remained.
        records: Vec<Record>,
        /// How long was waited.
        waited: Duration,
    },
}

fn list(records: &[Record]) -> String {
    records
        .iter()
        .map(Record::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

/// A DNS zone holding hosted clusters' hostnames.
#[async_trait]
pub trait DnsZone: Send + Sync {
    /// The zone's id, for messages.
    fn zone_id(&self) -> &str;

    /// The zone's domain (normalised): the names it can hold.
    fn domain(&self) -> &str;

    /// The record sets whose name is one of `names` (any case, with or
    /// without a trailing dot), sorted by name, type and set identifier.
    /// TXT records carry the external-dns owner their value names.
    async fn records(&self, names: &[String]) -> Result<Vec<Record>, DnsError>;

    /// The address records (A, AAAA, CNAME) of `hosts` and their external-dns
    /// owner TXT records, each with its owner; other records at those names
    /// (a hand-made TXT record, MX, ...) are left out.
    async fn cluster_records(&self, hosts: &[String]) -> Result<Vec<Record>, DnsError> {
        let names: Vec<String> = hosts.iter().flat_map(|h| registry_names(h)).collect();
        let records = self.records(&names).await?;
        Ok(cluster_view(hosts, &records))
    }

    /// Delete, in one atomic change, the records of `hosts` owned by `owner`
    /// and `owner`'s TXT records for them; returns what was deleted (empty
    /// when nothing is left). When any record of those hosts is owned by
    /// someone else or by no one, nothing is deleted and
    /// [`DnsError::NotOwned`] lists those records.
    async fn delete_owned(&self, hosts: &[String], owner: &str) -> Result<Vec<Record>, DnsError>;

    /// Create `records` (plain records: values and TTL; alias records
    /// cannot be recreated from what is listed) in one atomic change: all
    /// of them, or none when any already exists.
    async fn create(&self, records: &[Record]) -> Result<(), DnsError>;

    /// Wait until no address record and no owner TXT record of `hosts` is
    /// left, looking every `poll`; [`DnsError::StillPresent`] with what is
    /// left once `timeout` has passed.
    async fn wait_gone(
        &self,
        hosts: &[String],
        timeout: Duration,
        poll: Duration,
    ) -> Result<(), DnsError> {
        let start = Instant::now();
        loop {
            let left = self.cluster_records(hosts).await?;
            if left.is_empty() {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(DnsError::StillPresent {
                    zone_id: self.zone_id().to_string(),
                    records: left,
                    waited,
                });
            }
            tracing::debug!(
                zone = self.zone_id(),
                left = left.len(),
                "waiting for DNS records to go"
            );
            tokio::time::sleep(poll.min(timeout - waited)).await;
        }
    }
}

/// A DNS name as compared here: trimmed, lower case, no trailing dot, and
/// Route53's `\ddd` octal escapes (`\052` for `*`) decoded.
pub fn normalize_name(name: &str) -> String {
    let name = name.trim();
    let name = name.strip_suffix('.').unwrap_or(name);
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).to_ascii_lowercase()
}

/// `names` normalised ([`normalize_name`]), sorted, each once.
pub fn normalize_names<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Vec<String> {
    let set: BTreeSet<String> = names.into_iter().map(|n| normalize_name(n.as_ref())).collect();
    set.into_iter().collect()
}

/// The owner named by an external-dns registry TXT value
/// (`"heritage=external-dns,external-dns/owner=<owner>,..."`), if it is one.
pub fn txt_owner(value: &str) -> Option<String> {
    let value = value.trim().trim_matches('"');
    let mut fields = value.split(',').map(str::trim);
    if !fields.clone().any(|f| f == "heritage=external-dns") {
        return None;
    }
    fields
        .find_map(|f| f.strip_prefix("external-dns/owner="))
        .filter(|owner| !owner.is_empty())
        .map(str::to_string)
}

/// The names where `host`'s records and their owner TXT records can be:
/// the host itself and the `a-`, `aaaa-` and `cname-` prefixed names newer
/// external-dns releases use.
pub fn registry_names(host: &str) -> Vec<String> {
    let host = normalize_name(host);
    let mut names = vec![host.clone()];
    names.extend(
        ADDRESS_KINDS
            .iter()
            .map(|kind| format!("{}-{host}", kind.to_ascii_lowercase())),
    );
    names
}

/// From `records` (the record sets at the hosts' registry names), the address
/// records of `hosts` and their owner TXT records, with owners filled in:
/// an address record's owner comes from the TXT record at `<type>-<host>`,
/// else from the one at `<host>`. Sorted by name, type and set identifier.
pub fn cluster_view(hosts: &[String], records: &[Record]) -> Vec<Record> {
    // Owners come from the TXT values themselves, whatever the input says.
    let records: Vec<Record> = records
        .iter()
        .map(|r| Record {
            owner: if r.kind == "TXT" {
                r.values.iter().find_map(|v| txt_owner(v))
            } else {
                None
            },
            ..r.clone()
        })
        .collect();
    let owner_at: BTreeMap<&str, &str> = records
        .iter()
        .filter(|r| r.kind == "TXT")
        .filter_map(|r| Some((r.name.as_str(), r.owner.as_deref()?)))
        .collect();
    let hosts: BTreeSet<String> = hosts.iter().map(|h| normalize_name(h)).collect();
    let mut out = Vec::new();
    for host in &hosts {
        let registry = registry_names(host);
        for record in records.iter().filter(|r| registry.contains(&r.name)) {
            if record.is_address() && &record.name == host {
                let typed = format!("{}-{host}", record.kind.to_ascii_lowercase());
                let owner = owner_at
                    .get(typed.as_str())
                    .or_else(|| owner_at.get(host.as_str()));
                out.push(Record {
                    owner: owner.map(|o| o.to_string()),
                    ..record.clone()
                });
            } else if record.kind == "TXT" && record.owner.is_some() {
                out.push(record.clone());
            }
        }
    }
    out.sort_by(|a, b| a.key().cmp(&b.key()));
    out.dedup_by(|a, b| a.key() == b.key());
    out
}

/// The one external-dns owner of every address record in a
/// [`cluster_view`]; `None` when there is no address record, or one has no
/// owner record, or they have several owners.
pub fn sole_owner(cluster_records: &[Record]) -> Option<String> {
    let mut owners = cluster_records.iter().filter(|r| r.is_address()).map(|r| r.owner.clone());
    let first = owners.next()??;
    owners.all(|o| o.as_deref() == Some(first.as_str())).then_some(first)
}

/// What a deletion for one owner may and may not touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deletion {
    /// Records owned by the owner: to delete.
    pub delete: Vec<Record>,
    /// Records owned by someone else or by no one: to leave alone.
    pub foreign: Vec<Record>,
}

/// Split a [`cluster_view`] into what `owner` owns and what it does not.
pub fn plan_deletion(cluster_records: &[Record], owner: &str) -> Deletion {
    let (delete, foreign) = cluster_records
        .iter()
        .cloned()
        .partition(|r| r.owner.as_deref() == Some(owner));
    Deletion { delete, foreign }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER_A: &str = "\"heritage=external-dns,external-dns/owner=mgmt-a,external-dns/resource=route/clusters-hc1/kube-apiserver\"";
    const OWNER_B: &str = "\"heritage=external-dns,external-dns/owner=mgmt-b,external-dns/resource=route/clusters-hc2/kube-apiserver\"";

    fn rec(name: &str, kind: &str, value: &str) -> Record {
        Record {
            name: normalize_name(name),
            kind: kind.into(),
            ttl: Some(30),
            values: vec![value.into()],
            set_identifier: None,
            alias: None,
            owner: if kind == "TXT" {
                txt_owner(value)
            } else {
                None
            },
        }
    }

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(normalize_name(" Api.Example.COM. "), "api.example.com");
        assert_eq!(normalize_name("api.example.com"), "api.example.com");
        assert_eq!(
            normalize_name("\\052.apps.example.com."),
            "*.apps.example.com"
        );
        // A backslash that is not an octal escape is kept.
        assert_eq!(normalize_name("a\\9.example.com"), "a\\9.example.com");
    }

    #[test]
    fn name_lists_are_normalised_sorted_and_deduplicated() {
        assert_eq!(
            normalize_names(["OAuth.Example.com.", "api.example.com", "oauth.example.com"]),
            ["api.example.com", "oauth.example.com"]
        );
        assert!(normalize_names(Vec::<String>::new()).is_empty());
    }

    #[test]
    fn owners_are_parsed_from_registry_values_only() {
        assert_eq!(txt_owner(OWNER_A).as_deref(), Some("mgmt-a"));
        assert_eq!(
            txt_owner("heritage=external-dns,external-dns/owner=x").as_deref(),
            Some("x")
        );
        assert_eq!(txt_owner("\"v=spf1 -all\""), None);
        assert_eq!(txt_owner("\"external-dns/owner=x\""), None, "no heritage");
        assert_eq!(
            txt_owner("\"heritage=external-dns,external-dns/owner=\""),
            None
        );
    }

    #[test]
    fn registry_names_cover_old_and_new_formats() {
        assert_eq!(
            registry_names("API.example.com."),
            [
                "api.example.com",
                "a-api.example.com",
                "aaaa-api.example.com",
                "cname-api.example.com"
            ]
        );
    }

    #[test]
    fn cluster_view_assigns_owners_and_drops_other_records() {
        let records = vec![
            rec("api.c1.example.com", "A", "192.0.2.1"),
            rec("api.c1.example.com", "TXT", OWNER_A),
            rec("oauth.c1.example.com", "CNAME", "lb.example.com"),
            rec("cname-oauth.c1.example.com", "TXT", OWNER_A),
            rec("oauth.c1.example.com", "TXT", "\"v=spf1 -all\""),
            rec("api.c1.example.com", "MX", "10 mail.example.com"),
            rec("bare.c1.example.com", "A", "192.0.2.9"),
        ];
        let view = cluster_view(
            &hosts(&[
                "API.c1.example.com.",
                "oauth.c1.example.com",
                "bare.c1.example.com",
            ]),
            &records,
        );
        let got: Vec<(&str, &str, Option<&str>)> = view
            .iter()
            .map(|r| (r.name.as_str(), r.kind.as_str(), r.owner.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("api.c1.example.com", "A", Some("mgmt-a")),
                ("api.c1.example.com", "TXT", Some("mgmt-a")),
                ("bare.c1.example.com", "A", None),
                ("cname-oauth.c1.example.com", "TXT", Some("mgmt-a")),
                ("oauth.c1.example.com", "CNAME", Some("mgmt-a")),
            ]
        );
    }

    #[test]
    fn the_typed_owner_record_wins() {
        let records = vec![
            rec("api.example.com", "A", "192.0.2.1"),
            rec("api.example.com", "TXT", OWNER_B),
            rec("a-api.example.com", "TXT", OWNER_A),
        ];
        let view = cluster_view(&hosts(&["api.example.com"]), &records);
        let a = view.iter().find(|r| r.kind == "A").expect("A record");
        assert_eq!(a.owner.as_deref(), Some("mgmt-a"));
    }

    #[test]
    fn a_deletion_touches_only_the_owners_records() {
        let records = vec![
            rec("api.c1.example.com", "A", "192.0.2.1"),
            rec("api.c1.example.com", "TXT", OWNER_A),
            rec("api.c2.example.com", "A", "192.0.2.2"),
            rec("api.c2.example.com", "TXT", OWNER_B),
            rec("bare.example.com", "A", "192.0.2.3"),
        ];
        let view = cluster_view(
            &hosts(&[
                "api.c1.example.com",
                "api.c2.example.com",
                "bare.example.com",
            ]),
            &records,
        );
        let plan = plan_deletion(&view, "mgmt-a");
        let names = |rs: &[Record]| {
            rs.iter()
                .map(|r| format!("{} {}", r.name, r.kind))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&plan.delete),
            ["api.c1.example.com A", "api.c1.example.com TXT"]
        );
        assert_eq!(
            names(&plan.foreign),
            [
                "api.c2.example.com A",
                "api.c2.example.com TXT",
                "bare.example.com A"
            ]
        );
        assert_eq!(plan_deletion(&[], "mgmt-a"), Deletion::default());
    }

    #[test]
    fn the_sole_owner_owns_every_address_record() {
        let mut a = rec("api.c1.example.com", "A", "192.0.2.1");
        let mut b = rec("oauth.c1.example.com", "A", "192.0.2.1");
        let txt = rec("api.c1.example.com", "TXT", OWNER_B);
        assert_eq!(sole_owner(&[]), None);
        assert_eq!(sole_owner(std::slice::from_ref(&a)), None, "no owner record");
        a.owner = Some("mgmt-a".into());
        b.owner = Some("mgmt-a".into());
        assert_eq!(sole_owner(&[a.clone(), b.clone(), txt.clone()]).as_deref(), Some("mgmt-a"));
        b.owner = Some("mgmt-b".into());
        assert_eq!(sole_owner(&[a.clone(), b.clone()]), None, "two owners");
        b.owner = None;
        assert_eq!(sole_owner(&[a, b]), None, "one record without an owner");
        assert_eq!(sole_owner(&[txt]), None, "owner records alone are no address");
    }

    #[test]
    fn errors_name_the_zone_the_records_and_what_to_do() {
        let mut a = rec("api.c1.example.com", "A", "192.0.2.1");
        a.owner = Some("mgmt-a".into());
        let err = DnsError::StillPresent {
            zone_id: "Z123".into(),
            records: vec![a.clone()],
            waited: Duration::from_secs(2),
        };
        assert_eq!(
            err.to_string(),
            "DNS records still present in zone Z123 after 2s: api.c1.example.com A 192.0.2.1 [owner mgmt-a]. \
             Check that external-dns on the source management cluster is running and withdrawing them \
             (its logs, its --txt-owner-id), or rerun with --dns-direct to delete them directly"
        );
        let bare = rec("bare.example.com", "A", "192.0.2.3");
        let err = DnsError::NotOwned {
            zone_id: "Z123".into(),
            owner: "mgmt-a".into(),
            records: vec![bare],
        };
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "not deleting DNS records in zone Z123: this record is not owned by external-dns owner `mgmt-a`: \
                 bare.example.com A 192.0.2.3 [no owner record]; nothing was deleted."
            ),
            "{msg}"
        );
    }
}
