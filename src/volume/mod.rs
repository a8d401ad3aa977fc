//! Guest volume data of a hosted cluster (KubeVirt's kubevirt-csi volumes):
//! the data mover that runs in a pod next to a volume ([`mover`]) and the
//! client hcp-dr uses to stream a volume out of it or into it ([`client`]).
//!
//! The mover never holds store credentials: hcp-dr pulls the volume's tar
//! from the mover (pod IP or a port-forward through the API server, as for
//! etcd) and writes it into the store itself, so every store (a local
//! directory too) and the backup's encryption work alike. On restore it
//! pushes the tar back the same way.

pub mod client;
pub mod mover;

use serde::{Deserialize, Serialize};

/// The annotation on a mover pod naming the protocol it speaks.
pub const MOVER_ANNOTATION: &str = "hcp-dr.openshift.io/volume-mover";
/// The protocol version.
pub const MOVER_PROTOCOL: &str = "v1";
/// The environment variable holding the bearer token every request needs.
pub const TOKEN_ENV: &str = "HCP_DR_MOVER_TOKEN";
/// The environment variable naming the address the mover listens on
/// (default `0.0.0.0`: every address of the pod).
pub const BIND_ENV: &str = "HCP_DR_MOVER_BIND";
/// The mover's port.
pub const MOVER_PORT: u16 = 8080;
/// Where the mover pod mounts the volume.
pub const MOUNT_PATH: &str = "/volume";

/// What one archive held: its SHA-256 and size as sent or received, and
/// how many entries (files, directories, links) it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveDigest {
    pub sha256: String,
    pub bytes: u64,
    pub files: u64,
}
