//! The `with:` parameters stages take in a playbook, as types: checked when
//! the playbook loads (unknown keys, wrong types and out-of-range values
//! refused with the line), listed by `hcp-dr playbook show`, and read by the
//! stage when it runs. A parameter overrides the command's flag for that
//! stage.

use std::time::Duration;

use serde::Deserialize;

use crate::duration::{self, DurationIn};
use crate::pipeline::StageParams;

/// A duration key, checked against its range: `None` when absent.
fn duration_in(key: &str, text: &Option<String>, range: DurationIn) -> Result<Option<Duration>, String> {
    text.as_deref().map(|t| range.check(t).map_err(|e| format!("{key}: {e}"))).transpose()
}

/// `scale-down`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ScaleDownParams {
    pub timeout: Option<String>,
    #[serde(default)]
    pub extra_deployments: Vec<String>,
}

impl StageParams for ScaleDownParams {
    const KEYS: &'static [(&'static str, &'static str)] = &[
        ("timeout", "how long the writers' pods may take to go (10s to 6h; default: --wait-timeout)"),
        ("extra-deployments", "more Deployments of the HCP namespace to stop with the etcd writers (list of names)"),
    ];
    fn check(&self) -> Result<(), String> {
        self.timeout()?;
        for name in &self.extra_deployments {
            let ok = !name.is_empty()
                && name.len() <= 253
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                && name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name.ends_with(|c: char| c.is_ascii_alphanumeric());
            if !ok {
                return Err(format!("extra-deployments: `{name}` is not a valid Kubernetes name (lowercase letters, digits, '-' and '.')"));
            }
        }
        Ok(())
    }
}

impl ScaleDownParams {
    pub fn timeout(&self) -> Result<Option<Duration>, String> {
        duration_in("timeout", &self.timeout, duration::WAIT)
    }
}

/// A stage that waits: `wait` (Available), `rejoin` (a member back).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitParams {
    pub timeout: Option<String>,
}

/// What a stage that takes a `timeout` waits for: its help line and range.
pub trait WaitFor {
    const KEYS: &'static [(&'static str, &'static str)];
    const RANGE: DurationIn;
}

/// The `timeout` of a stage that waits for `W`.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct Timeout<W> {
    params: WaitParams,
    #[serde(skip)]
    waits_for: std::marker::PhantomData<fn() -> W>,
}

impl<W> Default for Timeout<W> {
    fn default() -> Self {
        Timeout { params: WaitParams::default(), waits_for: std::marker::PhantomData }
    }
}

impl<W: WaitFor> StageParams for Timeout<W> {
    const KEYS: &'static [(&'static str, &'static str)] = W::KEYS;
    fn check(&self) -> Result<(), String> {
        self.timeout().map(|_| ())
    }
}

impl<W: WaitFor> Timeout<W> {
    pub fn timeout(&self) -> Result<Option<Duration>, String> {
        duration_in("timeout", &self.params.timeout, W::RANGE)
    }
}

/// `wait`: how long the restored cluster has to become Available.
#[derive(Debug)]
pub enum Available {}

impl WaitFor for Available {
    const KEYS: &'static [(&'static str, &'static str)] =
        &[("timeout", "how long the cluster has to become Available with its nodes Ready (10s to 1d; default: --wait-timeout)")];
    const RANGE: DurationIn = duration::AVAILABLE_WAIT;
}

pub type AvailableWait = Timeout<Available>;

/// `rejoin`: how long the recovered member has to catch up.
#[derive(Debug)]
pub enum MemberBack {}

impl WaitFor for MemberBack {
    const KEYS: &'static [(&'static str, &'static str)] =
        &[("timeout", "how long the member has to come back healthy at the leader's revision (30s to 1d; default: --wait-timeout)")];
    const RANGE: DurationIn = duration::MEMBER_WAIT;
}

pub type MemberWait = Timeout<MemberBack>;

/// The DNS stages (migrate's `dns`, restore's `dns-takeover`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsParams {
    pub wait: Option<String>,
}

impl StageParams for DnsParams {
    const KEYS: &'static [(&'static str, &'static str)] =
        &[("wait", "how long the hostnames' records have to move (10s to 1d; default: --dns-wait)")];
    fn check(&self) -> Result<(), String> {
        self.wait().map(|_| ())
    }
}

impl DnsParams {
    pub fn wait(&self) -> Result<Option<Duration>, String> {
        duration_in("wait", &self.wait, duration::DNS_WAIT)
    }
}

/// `etcd-seed`: how long a seeding pod may stay unschedulable, and its
/// volume claim unbound, before the restore stops and says why.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SeedParams {
    pub unschedulable_for: Option<String>,
    pub unbound_for: Option<String>,
}

/// The defaults of [`SeedParams`]: long enough for a cluster autoscaler to
/// add a node, or a provisioner to make a volume.
pub const SEED_UNSCHEDULABLE_FOR: Duration = Duration::from_secs(120);
pub const SEED_UNBOUND_FOR: Duration = Duration::from_secs(180);

impl StageParams for SeedParams {
    const KEYS: &'static [(&'static str, &'static str)] = &[
        ("unschedulable-for", "how long a seeding pod may stay unschedulable before the restore stops (5s to 6h; default 2m)"),
        ("unbound-for", "how long a seeded volume claim may stay Pending once it can bind (5s to 6h; default 3m)"),
    ];
    fn check(&self) -> Result<(), String> {
        self.unschedulable_for()?;
        self.unbound_for().map(|_| ())
    }
}

impl SeedParams {
    pub fn unschedulable_for(&self) -> Result<Duration, String> {
        Ok(duration_in("unschedulable-for", &self.unschedulable_for, duration::SEED_GRACE)?.unwrap_or(SEED_UNSCHEDULABLE_FOR))
    }
    pub fn unbound_for(&self) -> Result<Duration, String> {
        Ok(duration_in("unbound-for", &self.unbound_for, duration::SEED_GRACE)?.unwrap_or(SEED_UNBOUND_FOR))
    }
}

/// `etcd-snapshot`: how many members stream their snapshot at once.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotParams {
    pub concurrency: Option<usize>,
}

/// The most members a `concurrency` may name (HyperShift runs 1 or 3).
pub const MAX_SNAPSHOT_CONCURRENCY: usize = 16;

impl StageParams for SnapshotParams {
    const KEYS: &'static [(&'static str, &'static str)] = &[(
        "concurrency",
        "how many members stream their snapshot at once (1 to 16; default: all). Fewer than the members: the next group starts when the last one is stored, and the writers stay down until every group has started (longer API downtime, less bandwidth and store load at once)",
    )];
    fn check(&self) -> Result<(), String> {
        match self.concurrency {
            Some(n) if !(1..=MAX_SNAPSHOT_CONCURRENCY).contains(&n) => {
                Err(format!("concurrency: {n} is out of range (1 to {MAX_SNAPSHOT_CONCURRENCY})"))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::read_params;
    use serde_json::json;

    #[test]
    fn parameters_are_typed_and_checked() {
        let p: ScaleDownParams = read_params(&json!({"timeout": "90s", "extra-deployments": ["konnectivity-agent"]})).unwrap();
        assert_eq!(p.timeout().unwrap(), Some(Duration::from_secs(90)));
        assert_eq!(p.extra_deployments, ["konnectivity-agent"]);
        let none: ScaleDownParams = read_params(&serde_json::Value::Null).unwrap();
        assert_eq!(none.timeout().unwrap(), None);
        for (bad, says) in [
            (json!({"timout": "5m"}), "unknown field `timout`"),
            (json!({"timeout": 300}), "invalid type"),
            (json!({"timeout": "5s"}), "timeout: `5s` is too short"),
            (json!({"extra-deployments": ["Bad_Name"]}), "not a valid Kubernetes name"),
        ] {
            let err = read_params::<ScaleDownParams>(&bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let err = read_params::<AvailableWait>(&json!({"timeout": "2d"})).unwrap_err();
        assert!(err.contains("too long"), "{err}");
        let err = read_params::<MemberWait>(&json!({"wait": "2m"})).unwrap_err();
        assert!(err.contains("unknown field `wait`"), "{err}");
        assert_eq!(read_params::<DnsParams>(&json!({"wait": "15m"})).unwrap().wait().unwrap(), Some(Duration::from_secs(900)));
    }
}
