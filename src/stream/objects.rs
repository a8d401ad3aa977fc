//! Management-cluster objects over time: beside its chains, the stream of
//! a cluster keeps its HostedCluster, NodePools, their secrets, and the
//! HyperShift, Cluster API and platform objects of its control-plane
//! namespace, read as a backup's `export` reads them (the same function,
//! the same sanitizers), as **object sets**:
//!
//! ```text
//! <namespace>/<hosted-cluster>/stream/objects/<YYYYMMDDTHHMMSS.mmmZ>-<sha256>.tar.gz[.age]
//! ```
//!
//! The objects are read when a watch sees one of them change (the
//! HostedCluster's or one of its NodePools' or the HostedControlPlane's
//! spec, as their generation says, or a Secret named after the cluster:
//! `<name>-...`; a shared one it references is read at the interval), a
//! second later so a burst is read once, and in any case every
//! `--objects-interval` (what no watch covers: Cluster API and platform
//! objects, and a watch that failed); a set is written only
//! when they differ from the newest one stored (the SHA-256 of the
//! deterministic `objects.tar.gz` is in the name, so a restart compares
//! without reading anything back). The time in the name is when the
//! objects were read: a restore to time T takes the newest set read at or
//! before T, so a watched change is seen a second or two late, any other
//! at most one interval late. Encrypted sets
//! (`--encrypt-to`) end in `.age`; the name's digest is of the plaintext
//! archive, checked when the set is read back.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::sync::watch as signal;

use super::format::ChainLayout;
use super::{StreamError, store_error};
use crate::archive::encryption::{EncryptingReader, Identities, Recipients};
use crate::store::{Hasher, Store};

/// The folder of the object sets, under the cluster's `stream/`.
pub const FOLDER: &str = "objects";
const STAMP: &str = "%Y%m%dT%H%M%S%.3fZ";
/// More than any cluster's objects archive holds: a set decrypting past it is refused.
const MAX_SET: u64 = 256 << 20;

/// The key prefix of a cluster's object sets.
pub fn prefix(namespace: &str, hosted_cluster: &str) -> String {
    format!("{}{FOLDER}/", ChainLayout::stream_prefix(namespace, hosted_cluster))
}

/// One object set, as its name says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetName {
    /// When the objects were read.
    pub taken: DateTime<Utc>,
    /// SHA-256 of the (plaintext) `objects.tar.gz`.
    pub sha256: String,
    pub encrypted: bool,
}

impl SetName {
    pub fn file_name(&self) -> String {
        format!("{}-{}.tar.gz{}", self.taken.format(STAMP), self.sha256, if self.encrypted { ".age" } else { "" })
    }

    pub fn parse(file: &str) -> Option<SetName> {
        let (file, encrypted) = match file.strip_suffix(".age") {
            Some(file) => (file, true),
            None => (file, false),
        };
        let (stamp, sha256) = file.strip_suffix(".tar.gz")?.split_once('-')?;
        if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let taken = NaiveDateTime::parse_from_str(stamp, STAMP).ok()?.and_utc();
        Some(SetName { taken, sha256: sha256.to_ascii_lowercase(), encrypted })
    }
}

/// The object sets of a cluster, oldest first (files of other names are ignored).
pub async fn list(store: &dyn Store, namespace: &str, hosted_cluster: &str) -> Result<Vec<SetName>, StreamError> {
    let prefix = prefix(namespace, hosted_cluster);
    let listed = store.list(&prefix).await.map_err(store_error(format!("listing {}{prefix}", super::catalog::url_slash(store))))?;
    let mut sets: Vec<SetName> = listed.iter().filter_map(|o| o.key.strip_prefix(&prefix)).filter_map(SetName::parse).collect();
    sets.sort_by_key(|s| s.taken);
    Ok(sets)
}

/// The newest set read at or before `at`.
pub fn at(sets: &[SetName], at: DateTime<Utc>) -> Option<&SetName> {
    sets.iter().rev().find(|s| s.taken <= at)
}

/// A set's `objects.tar.gz`: decrypted with `identities` when it is
/// encrypted, and checked against the digest in its name.
pub async fn read(store: &dyn Store, namespace: &str, hosted_cluster: &str, set: &SetName, identities: Option<&Identities>) -> Result<Vec<u8>, StreamError> {
    let key = format!("{}{}", prefix(namespace, hosted_cluster), set.file_name());
    let what = format!("{}{key}", super::catalog::url_slash(store));
    let body = store.get(&key).await.map_err(store_error(format!("reading {what}")))?;
    // the recipients are not recorded: the identity is checked by decrypting
    let recipients: &[String] = &[];
    let body = crate::archive::compression::decode(body, &what, set.encrypted.then_some(recipients), identities, None).await?;
    let mut bytes = Vec::new();
    body.take(MAX_SET + 1).read_to_end(&mut bytes).await.map_err(|source| StreamError::Io { what: what.clone(), source })?;
    let mut hasher = Hasher::default();
    hasher.update(&bytes);
    let digest = hasher.finish();
    if bytes.len() as u64 > MAX_SET || digest.sha256 != set.sha256 {
        return Err(StreamError::Io {
            what,
            source: std::io::Error::other(format!("reads back as {} bytes with SHA-256 {}, not the {} its name records: it is damaged or was altered", bytes.len(), digest.sha256, set.sha256)),
        });
    }
    Ok(bytes)
}

/// How a cluster's objects are read and its sets written.
#[derive(Clone)]
pub struct Recorder {
    pub client: kube::Client,
    pub store: Arc<dyn Store>,
    pub namespace: String,
    pub hosted_cluster: String,
    pub interval: Duration,
    pub recipients: Option<Recipients>,
    pub include_free_agents: bool,
}

/// What the object recorder did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ObjectsReport {
    /// Sets written by this run.
    pub sets_written: u64,
    /// The newest set in the store when the run ended.
    pub newest: Option<String>,
    /// Reads or writes that failed (each retried at the next interval).
    pub failures: u64,
    pub last_failure: Option<String>,
}

/// How long after a watched change the objects are read: the rest of a
/// burst (a NodePool scaled, its status, the HostedCluster's) lands first.
const SETTLE: Duration = Duration::from_secs(1);

/// What counts as a change of an object: its generation when it has one
/// (its spec changed; status updates and reconciles do not move it), else
/// its resourceVersion (Secrets).
fn change_key(meta: &kube::api::ObjectMeta) -> String {
    match meta.generation {
        Some(generation) => format!("g{generation}"),
        None => format!("rv{}", meta.resource_version.as_deref().unwrap_or_default()),
    }
}

/// Watch `api` (restricted by `fields`) and wake `changed` whenever an
/// object is added, deleted or changed as [`change_key`] says, after the
/// first complete list. A watch that fails is retried with backoff and
/// says so once: the interval still reads the objects meanwhile.
async fn watch_changes<K>(api: kube::Api<K>, fields: Option<String>, relevant: impl Fn(&K) -> bool + Send, what: String, changed: Arc<tokio::sync::Notify>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let mut config = watcher::Config::default();
    if let Some(fields) = &fields {
        config = config.fields(fields);
    }
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let (mut listed, mut failing) = (false, false);
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                if !failing {
                    tracing::warn!("{what}: watching for changes failed ({err}); the objects are still read every --objects-interval");
                }
                failing = true;
                continue;
            }
        };
        if failing {
            tracing::info!("{what}: watching for changes again");
            failing = false;
        }
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitDone => listed = true,
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) | watcher::Event::Delete(object) if !relevant(&object) => {}
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                let key = change_key(object.meta());
                let before = seen.insert(object.meta().name.clone().unwrap_or_default(), key.clone());
                if listed && before.as_ref() != Some(&key) {
                    changed.notify_one();
                }
            }
            watcher::Event::Delete(object) => {
                seen.remove(object.meta().name.as_deref().unwrap_or_default());
                changed.notify_one();
            }
        }
    }
}

impl Recorder {
    /// Watch the objects that say when to read them again ([`watch_changes`]).
    fn watch(&self, changed: &Arc<tokio::sync::Notify>) -> tokio::task::JoinSet<()> {
        use crate::hosted::{HOSTED_CLUSTER, HOSTED_CONTROL_PLANE, NODE_POOL};
        let (ns, name) = (&self.namespace, &self.hosted_cluster);
        let hcp_ns = crate::hosted::hcp_namespace(ns, name);
        let mut watches = tokio::task::JoinSet::new();
        let api = |gvk, namespace: &str| crate::kube::api(&self.client, gvk, namespace);
        watches.spawn(watch_changes(api(&HOSTED_CLUSTER, ns), Some(format!("metadata.name={name}")), |_| true, format!("HostedCluster {ns}/{name}"), changed.clone()));
        // several clusters share a namespace: only this one's NodePools and Secrets wake it
        let cluster = name.clone();
        let its_pool = move |pool: &kube::api::DynamicObject| pool.data["spec"]["clusterName"].as_str() == Some(cluster.as_str());
        watches.spawn(watch_changes(api(&NODE_POOL, ns), None, its_pool, format!("NodePools in {ns}"), changed.clone()));
        watches.spawn(watch_changes(api(&HOSTED_CONTROL_PLANE, &hcp_ns), None, |_| true, format!("HostedControlPlane in {hcp_ns}"), changed.clone()));
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(self.client.clone(), ns);
        let prefix = format!("{name}-");
        let its_secret = move |secret: &k8s_openapi::api::core::v1::Secret| secret.metadata.name.as_ref().is_some_and(|n| n.starts_with(&prefix));
        watches.spawn(watch_changes(secrets, None, its_secret, format!("Secrets in {ns}"), changed.clone()));
        watches
    }

    /// Read the objects at once, then whenever a watched one changes and
    /// every interval, and write a set when they changed, until `stop`
    /// turns true.
    pub async fn run(self, mut stop: signal::Receiver<bool>) -> ObjectsReport {
        let mut report = ObjectsReport::default();
        let label = format!("{}/{}", self.namespace, self.hosted_cluster);
        let mut newest: Option<SetName> = match list(self.store.as_ref(), &self.namespace, &self.hosted_cluster).await {
            Ok(sets) => sets.last().cloned(),
            Err(err) => {
                report.failures += 1;
                report.last_failure = Some(err.to_string());
                None
            }
        };
        let api_groups = crate::stages::context::ApiGroups::default();
        let changed = Arc::new(tokio::sync::Notify::new());
        let _watches = self.watch(&changed);
        loop {
            if *stop.borrow() {
                break;
            }
            match self.once(&api_groups, newest.as_ref()).await {
                Ok(Some(written)) => {
                    tracing::info!("{label}: objects changed, set {} written", written.file_name());
                    report.sets_written += 1;
                    newest = Some(written);
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!("{label}: the objects were not recorded ({err}); trying again in {}", crate::duration::show(self.interval));
                    report.failures += 1;
                    report.last_failure = Some(err);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = changed.notified() => {
                    tokio::select! {
                        _ = tokio::time::sleep(SETTLE) => {}
                        _ = stop.changed() => {}
                    }
                }
                _ = stop.changed() => {}
            }
        }
        report.newest = newest.map(|s| s.file_name());
        report
    }

    /// Read the objects once; write a set when they differ from `newest`.
    async fn once(&self, api_groups: &crate::stages::context::ApiGroups, newest: Option<&SetName>) -> Result<Option<SetName>, String> {
        let taken = Utc::now();
        let source = crate::stages::export::ObjectSource {
            client: &self.client,
            namespace: &self.namespace,
            hosted_cluster: &self.hosted_cluster,
            node_pools: None,
            include_free_agents: self.include_free_agents,
            api_groups,
        };
        let (objects, _) = crate::stages::export::collect_objects(&source).await.map_err(|e| crate::pipeline::stage::error_chain(e.as_ref()))?;
        let mut tarball = Vec::new();
        crate::archive::objects::write_tar_gz(&objects, &mut tarball).map_err(|e| e.to_string())?;
        let mut hasher = Hasher::default();
        hasher.update(&tarball);
        let sha256 = hasher.finish().sha256;
        if newest.is_some_and(|n| n.sha256 == sha256) {
            return Ok(None);
        }
        let name = SetName { taken, sha256, encrypted: self.recipients.is_some() };
        let key = format!("{}{}", prefix(&self.namespace, &self.hosted_cluster), name.file_name());
        let body: crate::store::Body<'_> = match &self.recipients {
            Some(recipients) => Box::new(EncryptingReader::new(&tarball[..], recipients, &key).map_err(|e| e.to_string())?.0),
            None => Box::new(&tarball[..]),
        };
        self.store.put(&key, body).await.map_err(|e| format!("writing {key}: {e}"))?;
        Ok(Some(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_time() {
        let sha = "ab".repeat(32);
        let name = SetName { taken: "2026-11-29T18:04:05.123Z".parse().unwrap(), sha256: sha.clone(), encrypted: false };
        assert_eq!(name.file_name(), format!("20261129T180405.123Z-{sha}.tar.gz"));
        assert_eq!(SetName::parse(&name.file_name()), Some(name.clone()));
        let sealed = SetName { encrypted: true, ..name.clone() };
        assert_eq!(SetName::parse(&sealed.file_name()), Some(sealed));
        assert_eq!(SetName::parse("20261129T180405.123Z-abc.tar.gz"), None);
        assert_eq!(SetName::parse("notes.txt"), None);
        let later = SetName { taken: "2026-11-29T18:05:00Z".parse().unwrap(), ..name.clone() };
        let sets = vec![name.clone(), later.clone()];
        assert_eq!(at(&sets, "2026-11-29T18:04:59Z".parse().unwrap()), Some(&name));
        assert_eq!(at(&sets, "2026-11-29T18:05:00Z".parse().unwrap()), Some(&later));
        assert_eq!(at(&sets, "2026-11-29T18:00:00Z".parse().unwrap()), None);
    }

    #[tokio::test]
    async fn a_set_reads_back_only_whole_and_with_its_identity() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::LocalStore::new(dir.path().to_path_buf());
        let tarball = b"not really a tarball, but bytes".to_vec();
        let mut hasher = Hasher::default();
        hasher.update(&tarball);
        let plain = SetName { taken: Utc::now(), sha256: hasher.finish().sha256, encrypted: false };
        let key = format!("{}{}", prefix("clusters", "demo"), plain.file_name());
        store.put(&key, Box::new(&tarball[..])).await.unwrap();
        assert_eq!(read(&store, "clusters", "demo", &plain, None).await.unwrap(), tarball);
        store.put(&key, Box::new(&b"altered"[..])).await.unwrap();
        let err = read(&store, "clusters", "demo", &plain, None).await.unwrap_err().to_string();
        assert!(err.contains("damaged or was altered"), "{err}");

        let identity = age::x25519::Identity::generate();
        let public = identity.to_public().to_string();
        let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
        let recipients = Recipients::parse(std::slice::from_ref(&public)).unwrap().unwrap();
        let sealed = SetName { encrypted: true, ..plain.clone() };
        let key = format!("{}{}", prefix("clusters", "demo"), sealed.file_name());
        let (reader, _) = EncryptingReader::new(&tarball[..], &recipients, &key).unwrap();
        store.put(&key, Box::new(reader)).await.unwrap();
        let err = read(&store, "clusters", "demo", &sealed, None).await.unwrap_err().to_string();
        assert!(err.contains("--identity"), "{err}");
        let ids = Identities::parse(std::path::Path::new("key"), &secret).unwrap();
        assert_eq!(read(&store, "clusters", "demo", &sealed, Some(&ids)).await.unwrap(), tarball);
        assert_eq!(list(&store, "clusters", "demo").await.unwrap().len(), 2);
    }
}
