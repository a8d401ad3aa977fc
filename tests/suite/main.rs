//! Every end-to-end test of hcp-dr, in one binary: one link instead of
//! one per file (each links kube, the AWS SDK and etcd-client), which
//! was a minute and a half of every clean build. nextest still runs each
//! test in its own process. Filter by file with `-E 'test(/^drill::/)'`.

mod support;
mod api_faults;
mod backup;
mod backups;
mod bolt;
mod bad_input;
mod cli_conveniences;
mod cluster;
mod compression;
mod copies;
mod degraded_etcd;
mod disaster;
mod disk_full;
mod dns;
mod drill;
mod drill_cmd;
mod encryption;
mod etcd_ops;
mod etcd_seed;
mod etcd_restore;
mod etcd_snapshot;
mod external_clusters;
mod fence;
mod fleet;
mod migrate;
mod monitoring;
mod next_steps;
mod no_panic;
mod object_lock;
mod operator_down;
mod platform_agent;
mod platform_aws;
mod platform_kubevirt;
mod playbook_params;
mod point_in_time;
mod posture;
mod prometheus_alerts;
mod publishing;
mod reconcile;
mod restore;
mod runbooks;
mod s3_faults;
mod schedule;
mod schedule_rbac;
mod sigkill;
mod signals;
mod snapshot_verify;
mod stream;
mod stream_deep;
mod stream_k8s;
mod stream_retention;
mod undo_safety;
