//! One writer per cluster: a `coordination.k8s.io/v1` Lease per hosted
//! cluster, held by the stream that writes its chains.
//!
//! - **Name**: `hcp-dr-stream.<namespace>.<name>` (namespace and name are
//!   DNS labels, so the name is unambiguous), in the namespace the stream
//!   is told (`--lease-namespace`: its own in a pod, so its Role needs
//!   nothing elsewhere). Not the backup's lock (`hcp-dr-lock-<name>`): a
//!   backup and the stream may run at once.
//! - **Taking it**: a Lease nobody holds (absent, released, or not renewed
//!   within its `leaseDurationSeconds`) is created or taken over with an
//!   update guarded by the `resourceVersion` read; a 409 means someone else
//!   moved first, and the Lease is read again.
//! - **Keeping it**: renewed every third of its duration, each write
//!   guarded by the `resourceVersion` of the previous one. A renewal that
//!   finds another holder, or no success for two thirds of the duration,
//!   is the Lease lost: the stream stops writing the cluster at once
//!   (before any other holder can see the Lease expire, a third of the
//!   duration later).
//! - **Letting go**: on a clean stop the Lease is released (holder
//!   cleared, duration 1 s) so the next holder need not wait it out.

use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::kube::{is_conflict, is_not_found, lease_api};

/// Where a cluster's Lease is and who takes it.
#[derive(Clone)]
pub struct LeaseConfig {
    pub client: Client,
    /// The namespace of every Lease (the stream's own).
    pub namespace: String,
    /// `<hostname>-<random>`: this process, unlike any other.
    pub holder: String,
    /// `leaseDurationSeconds`.
    pub duration: Duration,
}

impl std::fmt::Debug for LeaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseConfig").field("namespace", &self.namespace).field("holder", &self.holder).field("duration", &self.duration).finish()
    }
}

/// The Lease's name for a hosted cluster.
pub fn lease_name(namespace: &str, hosted_cluster: &str) -> String {
    format!("hcp-dr-stream.{namespace}.{hosted_cluster}")
}

/// `hostname-xxxxxx`: the host (a pod's name) and a random suffix, so two
/// processes on one host, or a restarted one, are told apart.
pub fn holder_identity(hostname: &str) -> String {
    let id = crate::archive::new_backup_id(Utc::now());
    let suffix = id.rsplit('-').next().unwrap_or("0");
    format!("{hostname}-{suffix}")
}

fn micro(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Someone else's live Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBy {
    pub holder: String,
    pub renewed: Option<String>,
    pub duration_seconds: i64,
}

impl std::fmt::Display for HeldBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "held by `{}` (renewed {}, valid {}s after that)", self.holder, self.renewed.as_deref().unwrap_or("never"), self.duration_seconds)
    }
}

/// The holder of `lease` when it is someone's and has not expired at `now`.
fn live_holder(lease: &Value, now: DateTime<Utc>) -> Option<HeldBy> {
    let spec = &lease["spec"];
    let holder = spec["holderIdentity"].as_str().filter(|h| !h.is_empty())?;
    let duration = spec["leaseDurationSeconds"].as_i64().unwrap_or(0);
    let renewed = spec["renewTime"].as_str().or(spec["acquireTime"].as_str());
    let at = renewed.and_then(|t| DateTime::parse_from_rfc3339(t).ok())?.to_utc();
    (at + chrono::Duration::seconds(duration) >= now).then(|| HeldBy { holder: holder.to_string(), renewed: renewed.map(str::to_string), duration_seconds: duration })
}

/// A Lease this process holds.
pub struct Held {
    api: Api<DynamicObject>,
    pub name: String,
    pub namespace: String,
    holder: String,
    duration: Duration,
    /// The object as last written (its resourceVersion guards the next write).
    last: DynamicObject,
    acquired: String,
}

/// What trying to take a Lease found.
pub enum Acquire {
    Acquired(Box<Held>),
    Busy(HeldBy),
}

/// Why a Lease request failed (the API server could not be asked, or refused).
#[derive(Debug, thiserror::Error)]
#[error("Lease {namespace}/{name}: {what}: {source}")]
pub struct LeaseError {
    pub namespace: String,
    pub name: String,
    pub what: &'static str,
    #[source]
    pub source: kube::Error,
}

impl LeaseConfig {
    fn spec(&self, acquired: &str, now: DateTime<Utc>) -> Value {
        json!({
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration.as_secs().max(1),
            "acquireTime": acquired,
            "renewTime": micro(now),
        })
    }

    /// Take the Lease of `namespace/hosted_cluster` if nobody else holds it.
    pub async fn acquire(&self, namespace: &str, hosted_cluster: &str) -> Result<Acquire, LeaseError> {
        let name = lease_name(namespace, hosted_cluster);
        let api = lease_api(&self.client, &self.namespace);
        let fail = |what: &'static str| {
            let (namespace, name) = (self.namespace.clone(), name.clone());
            move |source| LeaseError { namespace, name, what, source }
        };
        let now = Utc::now();
        let acquired = micro(now);
        let held = |last: DynamicObject| {
            Acquire::Acquired(Box::new(Held { api: api.clone(), name: name.clone(), namespace: self.namespace.clone(), holder: self.holder.clone(), duration: self.duration, last, acquired: acquired.clone() }))
        };
        let raced = || Acquire::Busy(HeldBy { holder: "(another stream, at the same moment)".into(), renewed: None, duration_seconds: self.duration.as_secs() as i64 });
        match api.get_opt(&name).await.map_err(fail("reading it"))? {
            None => {
                let lease: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "hcp-dr", "app.kubernetes.io/component": "stream"},
                                 "annotations": {"hcp-dr.openshift.io/hosted-cluster": format!("{namespace}/{hosted_cluster}")}},
                    "spec": self.spec(&acquired, now),
                }))
                .expect("a Lease object");
                match api.create(&PostParams::default(), &lease).await {
                    Ok(created) => Ok(held(created)),
                    Err(err) if is_conflict(&err) => Ok(raced()),
                    Err(err) => Err(fail("creating it")(err)),
                }
            }
            Some(existing) => {
                let value = serde_json::to_value(&existing).unwrap_or_default();
                if let Some(other) = live_holder(&value, now).filter(|h| h.holder != self.holder) {
                    return Ok(Acquire::Busy(other));
                }
                let mut updated = value;
                updated["spec"] = self.spec(&acquired, now);
                let object: DynamicObject = serde_json::from_value(updated).expect("a Lease object");
                // guarded by the resourceVersion just read: a 409 is someone else's write in between
                match api.replace(&name, &PostParams::default(), &object).await {
                    Ok(replaced) => Ok(held(replaced)),
                    Err(err) if is_conflict(&err) => Ok(raced()),
                    Err(err) => Err(fail("taking it over")(err)),
                }
            }
        }
    }
}

/// What a renewal found.
#[derive(Debug)]
pub enum Renewal {
    Renewed,
    /// Someone else holds it now (or it is gone).
    Lost(String),
    /// The request failed; the Lease may still be ours.
    Failed(String),
}

impl Held {
    pub fn label(&self) -> String {
        format!("Lease {}/{}", self.namespace, self.name)
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Renew it, guarded by the resourceVersion of our last write.
    pub async fn renew(&mut self) -> Renewal {
        let mut value = serde_json::to_value(&self.last).unwrap_or_default();
        value["spec"]["renewTime"] = json!(micro(Utc::now()));
        value["spec"]["holderIdentity"] = json!(self.holder);
        value["spec"]["acquireTime"] = json!(self.acquired);
        value["spec"]["leaseDurationSeconds"] = json!(self.duration.as_secs().max(1));
        let object: DynamicObject = serde_json::from_value(value).expect("a Lease object");
        match self.api.replace(&self.name, &PostParams::default(), &object).await {
            Ok(written) => {
                self.last = written;
                Renewal::Renewed
            }
            Err(err) if is_conflict(&err) || is_not_found(&err) => match self.api.get_opt(&self.name).await {
                Ok(Some(now)) => {
                    let value = serde_json::to_value(&now).unwrap_or_default();
                    let holder = value["spec"]["holderIdentity"].as_str().unwrap_or("").to_string();
                    if holder == self.holder {
                        // still ours (a write that did not change the holder): go on from it
                        self.last = now;
                        Renewal::Failed(format!("{} changed under us (still ours); renewing again", self.label()))
                    } else {
                        Renewal::Lost(format!("{} is now held by `{}`", self.label(), if holder.is_empty() { "nobody" } else { &holder }))
                    }
                }
                Ok(None) => Renewal::Lost(format!("{} was deleted", self.label())),
                Err(err) => Renewal::Failed(format!("renewing {}: {err}", self.label())),
            },
            Err(err) => Renewal::Failed(format!("renewing {}: {err}", self.label())),
        }
    }

    /// Let it go (holder cleared, 1 s) so the next holder need not wait it out.
    pub async fn release(self) {
        let mut value = serde_json::to_value(&self.last).unwrap_or_default();
        value["spec"]["holderIdentity"] = Value::Null;
        value["spec"]["leaseDurationSeconds"] = json!(1);
        let Ok(object) = serde_json::from_value::<DynamicObject>(value) else { return };
        if let Err(err) = self.api.replace(&self.name, &PostParams::default(), &object).await {
            tracing::warn!("releasing {}: {err} (it expires by itself after {}s)", self.label(), self.duration.as_secs());
        }
    }
}

/// Keep `held` renewed every third of its duration until `done` fires;
/// `lost` gets the reason once it is lost (another holder, or no renewal
/// for two thirds of the duration). Returns the Lease for release when it
/// was not lost.
pub async fn keep(mut held: Held, lost: watch::Sender<Option<String>>, mut done: watch::Receiver<bool>) -> Option<Held> {
    let every = held.duration / 3;
    let give_up = held.duration * 2 / 3;
    let mut last_ok = Instant::now();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = done.changed() => return Some(held),
            _ = tick.tick() => {}
        }
        let sent = Instant::now();
        let renewal = match tokio::time::timeout(every.max(Duration::from_millis(500)), held.renew()).await {
            Ok(renewal) => renewal,
            Err(_) => Renewal::Failed(format!("renewing {}: no answer within {}s", held.label(), every.as_secs_f32())),
        };
        match renewal {
            Renewal::Renewed => last_ok = sent,
            Renewal::Lost(why) => {
                let _ = lost.send(Some(why));
                return None;
            }
            Renewal::Failed(why) => {
                tracing::warn!("{why}");
                if last_ok.elapsed() >= give_up {
                    let _ = lost.send(Some(format!("{} not renewed for {}s ({why}); another stream may take it over", held.label(), last_ok.elapsed().as_secs())));
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_someones_until_it_expires_or_is_released() {
        let now = Utc::now();
        let lease = |holder: Value, renewed: DateTime<Utc>, secs: i64| json!({"spec": {"holderIdentity": holder, "renewTime": micro(renewed), "leaseDurationSeconds": secs}});
        let live = live_holder(&lease(json!("a-1"), now - chrono::Duration::seconds(10), 30), now).unwrap();
        assert_eq!(live.holder, "a-1");
        assert!(live.to_string().contains("held by `a-1`"), "{live}");
        assert!(live_holder(&lease(json!("a-1"), now - chrono::Duration::seconds(31), 30), now).is_none(), "expired");
        assert!(live_holder(&lease(Value::Null, now, 30), now).is_none(), "released");
        assert!(live_holder(&lease(json!(""), now, 30), now).is_none(), "released");
        assert!(live_holder(&json!({"spec": {"holderIdentity": "a"}}), now).is_none(), "never renewed");
    }

    #[test]
    fn names_are_deterministic_and_holders_unique() {
        assert_eq!(lease_name("clusters", "demo"), "hcp-dr-stream.clusters.demo");
        let (a, b) = (holder_identity("hcp-dr-stream-0"), holder_identity("hcp-dr-stream-0"));
        assert!(a.starts_with("hcp-dr-stream-0-") && a.len() == "hcp-dr-stream-0-".len() + 6, "{a}");
        assert_ne!(a, b);
    }
}
