//! The sandbox's cloud, as far as DR needs it: the worker instances behind
//! the CAPI Machines, and the bare-metal hosts behind the BareMetalHosts. A
//! cluster's workers outlive its management cluster (they run in the cloud
//! or in a rack, not on it), so a restored or migrated cluster's Machines
//! and hosts stand for the same machines as the source's. Two ledgers,
//! shared by every management cluster of a sandbox, record what a real
//! provider would have destroyed, one line each:
//!
//! - `DIR/cloud/terminated`, `<infraID>/<machine> by <management cluster>`:
//!   the operator, playing CAPI, deleted a Machine of a cluster that is not
//!   paused (a NodePool scaled down or deleted, a HostedCluster deleted), and
//!   a real provider terminates the instance.
//! - `DIR/cloud/deprovisioned`, `<bootMACAddress> by <management cluster>`:
//!   the operator, playing metal3, saw a BareMetalHost it manages (not
//!   detached) deleted, and metal3 powers the host off and wipes it.
//!
//! Tests read them to prove an undo or a teardown never deprovisioned a
//! cluster's workers.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{Ctx, OperatorError, io_err};

/// The ledger of terminated instances under the sandbox's cloud directory.
pub fn ledger(cloud_dir: &Path) -> PathBuf {
    cloud_dir.join("terminated")
}

/// The ledger of deprovisioned bare-metal hosts under the sandbox's cloud
/// directory.
pub fn deprovisioned_ledger(cloud_dir: &Path) -> PathBuf {
    cloud_dir.join("deprovisioned")
}

/// Record that the worker `machine` of infrastructure `infra_id` was
/// terminated by this management cluster's CAPI.
pub(crate) fn terminate(ctx: &Ctx, infra_id: &str, machine: &str) -> Result<(), OperatorError> {
    tracing::info!(cluster = %ctx.cfg.cluster_name, infra_id, machine, "terminating the worker instance");
    append(ctx, ledger, &format!("{infra_id}/{machine}"))
}

/// Record that the bare-metal host booting from `boot_mac` was deprovisioned
/// (powered off and wiped) by this management cluster's metal3.
pub(crate) fn deprovision(ctx: &Ctx, boot_mac: &str) -> Result<(), OperatorError> {
    tracing::info!(cluster = %ctx.cfg.cluster_name, boot_mac, "deprovisioning the bare-metal host");
    append(ctx, deprovisioned_ledger, boot_mac)
}

/// Append `<what> by <management cluster>` to one ledger (nothing when the
/// operator has no cloud directory).
fn append(ctx: &Ctx, ledger: fn(&Path) -> PathBuf, what: &str) -> Result<(), OperatorError> {
    let Some(dir) = &ctx.cfg.cloud_dir else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    let path = ledger(dir);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io_err("opening", &path))?;
    writeln!(file, "{what} by {}", ctx.cfg.cluster_name).map_err(io_err("writing", &path))
}

/// Every termination recorded so far (none when the ledger is absent).
pub fn terminated(cloud_dir: &Path) -> Vec<String> {
    lines(&ledger(cloud_dir))
}

/// Every deprovisioned host recorded so far (none when the ledger is absent).
pub fn deprovisioned(cloud_dir: &Path) -> Vec<String> {
    lines(&deprovisioned_ledger(cloud_dir))
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|text| text.lines().map(str::to_string).collect())
        .unwrap_or_default()
}
