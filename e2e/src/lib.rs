//! The hcp-dr sandbox: management-cluster emulators on real etcd, a simulated
//! HyperShift operator, and process fixtures for etcd, S3 and Route53.
