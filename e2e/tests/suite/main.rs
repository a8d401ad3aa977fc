//! Every test of the sandbox (API emulator, operator, fixtures), in one
//! binary: one link instead of one per file. nextest still runs each test
//! in its own process.

mod apiserver_support;
mod operator_support;
mod apiserver_core;
mod apiserver_crds;
mod apiserver_faults;
mod apiserver_kubectl;
mod apiserver_rbac;
mod fixtures_etcd;
mod fixtures_route53;
mod fixtures_s3;
mod operator_agent;
mod operator_capi;
mod operator_crash;
mod operator_dns;
mod operator_etcd_init;
mod operator_ha;
mod operator_oidc;
mod operator_single;
mod operator_volumes;
mod operator_workloads;
mod portforward;
mod s3_faults;
mod sandbox_cli;
mod schema_crds;
