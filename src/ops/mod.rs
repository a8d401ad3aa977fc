//! The library's front door: one public async function per user-visible
//! operation. The CLI builds the options and calls these.

pub mod backup;
pub mod backups;
pub mod etcd;
pub mod migrate;
pub mod restore;

use crate::kube::KubeError;
use crate::pipeline::{JournalError, PlaybookError, RunnerError};
use crate::store::StoreError;

/// Why an operation could not run (a stage failing is reported in the run's
/// outcome instead, after its undo).
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Bad input: says what is wrong and how to fix it.
    #[error("{0}")]
    Input(String),
    /// The playbook is malformed or does not fit the operation.
    #[error(transparent)]
    Playbook(#[from] PlaybookError),
    /// The journal could not be read or written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The runner refused the run (journal mismatch, missing stage).
    #[error(transparent)]
    Runner(#[from] RunnerError),
    /// The management cluster could not be reached.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// The store URL or the store itself.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The DNS zone.
    #[error(transparent)]
    Dns(#[from] crate::dns::DnsError),
}

impl OpsError {
    /// 2 for input the user can fix, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            OpsError::Input(_) | OpsError::Playbook(_) => 2,
            OpsError::Store(StoreError::BadUrl { .. }) => 2,
            _ => 1,
        }
    }
}
