//! hcp-dr: back up, restore, migrate and repair OpenShift hosted control planes.
//!
//! The library's front door is `ops` (one function per user-visible
//! operation); `pipeline` is the staged runner every operation is built on.
pub mod archive;
pub mod cli;
pub mod dns;
pub mod duration;
pub mod error;
pub mod etcd;
pub mod hosted;
pub mod kube;
pub mod meter;
pub mod ops;
pub mod stages;
pub mod pipeline;
pub mod space;
pub mod store;
pub mod stream;
pub mod teardown;
pub mod volume;
