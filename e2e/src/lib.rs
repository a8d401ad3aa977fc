//! The hcp-dr sandbox: management-cluster emulators on real etcd, a simulated
//! HyperShift operator, and process fixtures for etcd, S3 and Route53.
pub mod apiserver;
pub mod crds;
pub mod pki;
pub mod procs;
pub mod operator;
pub mod sandbox;
pub mod external;
pub mod conversion_webhook;
pub mod drill;
pub mod fill;
pub mod disaster;
pub mod faults_file;
