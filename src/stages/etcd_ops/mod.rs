//! The etcd repair stages (`playbooks/etcd-recover.yaml`): take the hosted
//! cluster's Lease, find the one failing member (or take the one named),
//! delete its pod and volume claim together, and wait until the StatefulSet
//! has recreated it and the member has rejoined and caught up.
//!
//! `health` reads the cluster for these stages and for `hcp-dr etcd status`.
//! Recovery stops on failure (`OnFailure::Stop`): once the volume is deleted
//! nothing can bring it back, and `--resume` goes on waiting for the rejoin.
//! A run that fails before `replace` changed anything is undone at once by
//! `ops::etcd` (only the Lease was taken).

pub mod assess;
pub mod health;
pub mod one_cluster;
pub mod rejoin;
pub mod replace;

use std::time::Duration;

use kube::Client;
use serde::{Deserialize, Serialize};

use crate::hosted::HostedCluster;
use crate::pipeline::{Catalog, StageId};
use crate::stages::context::{EtcdAccess, EtcdTlsMaterial, TlsOverride};
use crate::stages::lock::{LeaseTarget, Lockable};
use health::{EtcdCluster, HealthError};

/// The inputs of an etcd recovery (journaled on start; nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecoverInputs {
    pub hosted_cluster: String,
    pub namespace: String,
    /// The member to recover (`--member etcd-N`); None: the one that fails.
    pub member: Option<String>,
    pub etcd_access: EtcdAccess,
    /// Bound on the wait for the member to rejoin.
    pub wait_timeout_seconds: u64,
    /// Who holds the Lease (kept on resume).
    pub holder: String,
}

impl RecoverInputs {
    pub fn hcp_namespace(&self) -> String {
        crate::hosted::hcp_namespace(&self.namespace, &self.hosted_cluster)
    }
    pub fn wait_timeout(&self) -> Duration {
        Duration::from_secs(self.wait_timeout_seconds)
    }
    pub fn hc_label(&self) -> String {
        format!("HostedCluster {}/{}", self.namespace, self.hosted_cluster)
    }
}

/// The context of one etcd recovery.
pub struct RecoverContext {
    pub client: Client,
    pub inputs: RecoverInputs,
    /// `--etcd-*` files (never journaled).
    pub tls_override: TlsOverride,
    /// Found on first use (never journaled or printed).
    pub tls: Option<EtcdTlsMaterial>,
    pub hosted_cluster: Option<HostedCluster>,
    /// What `assess` decided and `replace` did (journaled; put back on resume).
    pub warnings: Vec<String>,
}

impl RecoverContext {
    pub fn new(client: Client, inputs: RecoverInputs, tls_override: TlsOverride) -> Self {
        RecoverContext {
            client,
            inputs,
            tls_override,
            tls: None,
            hosted_cluster: None,
            warnings: Vec::new(),
        }
    }

    /// Read the cluster's etcd now (the HostedCluster and the TLS material
    /// are looked up once per run).
    pub async fn probe(&mut self) -> Result<health::ClusterHealth, HealthError> {
        let hosted_cluster = match self.hosted_cluster.take() {
            Some(hc) => hc,
            None => {
                health::hosted_cluster(
                    &self.client,
                    &self.inputs.namespace,
                    &self.inputs.hosted_cluster,
                )
                .await?
            }
        };
        let tls = match self.tls.take() {
            Some(tls) => tls,
            None => {
                health::tls(
                    &self.client,
                    &self.inputs.hcp_namespace(),
                    &self.tls_override,
                )
                .await?
            }
        };
        let found = health::probe(&EtcdCluster {
            client: &self.client,
            hosted_cluster: &hosted_cluster,
            access: self.inputs.etcd_access,
            tls: &tls,
        })
        .await;
        self.hosted_cluster = Some(hosted_cluster);
        self.tls = Some(tls);
        found
    }
}

impl Lockable for RecoverContext {
    fn lease_target(&self) -> LeaseTarget<'_> {
        LeaseTarget {
            client: &self.client,
            namespace: &self.inputs.namespace,
            hosted_cluster: &self.inputs.hosted_cluster,
            holder: &self.inputs.holder,
            // the rejoin wait, plus room for the rest and a resume
            seconds: (2 * self.inputs.wait_timeout_seconds + 300).max(900) as i64,
        }
    }
    fn lock_warning(&mut self, warning: String) {
        self.warnings.push(warning);
    }
}

/// Every etcd-recover stage, by name.
pub fn recover_catalog() -> Catalog<RecoverContext> {
    use super::lock::{Lock, Unlock};
    use {assess::Assess, rejoin::Rejoin, replace::Replace};
    Catalog::new("etcd-recover")
        .with(Lock)
        .with(Assess)
        .with(Replace)
        .after(&[Lock::NAME, Assess::NAME])
        .with(Rejoin)
        .after(&[Replace::NAME])
        .with(Unlock)
        .after(&[Lock::NAME])
}

