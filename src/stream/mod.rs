//! Continuous backup of a hosted cluster's etcd (`hcp-dr stream`): a
//! *chain* is a base (an etcd snapshot taken without pausing anything)
//! followed by *segments* of every revision etcd made since, cut every few
//! seconds, each durable before the next starts. A point-in-time copy is
//! the base restored into a scratch etcd with the segments replayed up to
//! the revision asked for, one transaction per original revision.
//!
//! | piece | file |
//! |---|---|
//! | the stored format: layout, descriptor, segments, names | `format.rs` |
//! | a segment's stored bytes (zstd, age) | `codec.rs` |
//! | what a store holds: chains, their segments, windows | `catalog.rs` |
//! | which member to use, and reaching it | `source.rs` |
//! | the watch of one member after another | `watch.rs` |
//! | the open segment and its durable writes | `writer.rs` |
//! | segments waiting while the store cannot take them | `spool.rs` |
//! | taking a base | `base.rs` |
//! | one cluster's chains over time | `run.rs` |
//! | one writer per cluster: its Lease | `lease.rs` |
//! | `/metrics` (lag, segments, bytes, breaks) and `/healthz` | `metrics.rs` |
//! | the management-cluster objects over time (object sets) | `objects.rs` |
//! | checking a chain | `verify.rs` |
//! | replay against reality: a chain replayed to the next base, compared | `deep.rs` |
//! | replaying a chain into a snapshot | `replay.rs` |
//!
//! Unlike the staged pipelines it has no journal: what it wrote is its own
//! record (the newest chain's last segment names the last durable
//! revision), so a restarted stream resumes from the store alone.

pub mod base;
pub mod catalog;
pub mod codec;
pub mod deep;
pub mod format;
pub mod lease;
pub mod metrics;
pub mod objects;
pub mod replay;
pub mod run;
pub mod source;
pub mod spool;
pub mod verify;
pub mod watch;
pub mod writer;

use crate::archive::encryption::EncryptionError;
use crate::etcd::EtcdError;
use crate::store::StoreError;

pub use format::FormatError;

/// Why streaming, verifying or replaying failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// Reading or writing the store failed.
    #[error("{what}: {source}")]
    Store {
        what: String,
        #[source]
        source: Box<StoreError>,
    },
    /// Stored data that is not what it should be.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Encrypting or decrypting failed (a missing or wrong identity).
    #[error(transparent)]
    Encryption(#[from] EncryptionError),
    /// Reading or decoding bytes failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// An etcd request failed.
    #[error(transparent)]
    Etcd(Box<EtcdError>),
    /// No etcd member could be reached.
    #[error("{0}")]
    Members(String),
    /// The base snapshot could not be taken or checked.
    #[error("base snapshot: {0}")]
    Base(String),
    /// The scratch etcd (replay) could not be used.
    #[error("scratch etcd: {0}")]
    Scratch(String),
    /// Replaying stopped at a revision.
    #[error("replay of chain {chain} stopped at revision {revision}: {reason}")]
    Replay { chain: String, revision: i64, reason: String },
    /// What was asked cannot be done with what the store holds (a revision
    /// outside every chain, no chain at all): the message says what can.
    #[error("{0}")]
    Input(String),
}

impl From<EtcdError> for StreamError {
    fn from(err: EtcdError) -> StreamError {
        StreamError::Etcd(Box::new(err))
    }
}

impl StreamError {
    /// Whether the user can fix it with other arguments (exit code 2).
    pub fn is_input(&self) -> bool {
        matches!(self, StreamError::Input(_) | StreamError::Encryption(_))
    }
}

/// `what` failed against the store.
pub(crate) fn store_error(what: impl Into<String>) -> impl FnOnce(StoreError) -> StreamError {
    let what = what.into();
    move |source| StreamError::Store { what, source: Box::new(source) }
}
