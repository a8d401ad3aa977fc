//! `hcp-dr cluster`: create, pause, resume, scale, oidc, reconcile, destroy.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};

use crate::duration;
use super::{Exit, Output};
use crate::hosted::render::{AwsSpec, NewCluster, Platform, parse_node_selector, parse_toleration};
use crate::ops::OpsError;
use crate::ops::cluster::{CreateOptions, create, render};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a hosted cluster (or, with --render, print its objects).
    #[command(after_help = "Example:\n  hcp-dr cluster create --name demo --release-image quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64 --pull-secret pull-secret.json --render")]
    Create(CreateArgs),
    /// Pause reconciliation of a cluster and its NodePools until a deadline.
    #[command(after_help = "Example:\n  hcp-dr cluster pause demo -n clusters --for 2h")]
    Pause {
        /// The HostedCluster.
        #[arg(value_parser = super::k8s_name)]
        name: String,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters", value_parser = super::k8s_name)]
        namespace: String,
        /// An RFC3339 time; default: now + --for.
        #[arg(long)]
        until: Option<String>,
        /// How long the pause lasts (when --until is not given) [range: 1m to 366d].
        #[arg(long = "for", default_value = "1h", value_parser = duration::PAUSE_FOR)]
        duration: Duration,
        #[command(flatten)]
        access: Access,
    },
    /// Lift the pause of a cluster and its NodePools.
    #[command(after_help = "Example:\n  hcp-dr cluster resume demo -n clusters")]
    Resume {
        /// The HostedCluster.
        #[arg(value_parser = super::k8s_name)]
        name: String,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters", value_parser = super::k8s_name)]
        namespace: String,
        #[command(flatten)]
        access: Access,
    },
    /// Set the replicas of one of a cluster's NodePools.
    #[command(after_help = "Example:\n  hcp-dr cluster scale demo -n clusters --node-pool demo --replicas 3")]
    Scale {
        /// The HostedCluster.
        #[arg(value_parser = super::k8s_name)]
        name: String,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters", value_parser = super::k8s_name)]
        namespace: String,
        #[arg(long, value_parser = super::k8s_name)]
        node_pool: String,
        /// The NodePool's replicas [range: 0 to 500].
        #[arg(long, value_parser = super::node_pool_replicas())]
        replicas: i64,
        #[command(flatten)]
        access: Access,
    },
    /// AWS: check that the cluster's OIDC issuer documents (in S3) publish
    /// its service-account signing key, and with --repair rewrite them, as
    /// `hypershift fix dr-oidc-iam` does. Exits 1 when they are still wrong
    /// or could not be checked; prints what IAM must hold (not checked).
    #[command(after_help = "Example:\n  hcp-dr cluster oidc demo -n clusters --repair")]
    Oidc {
        /// The HostedCluster.
        #[arg(value_parser = super::k8s_name)]
        name: String,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters", value_parser = super::k8s_name)]
        namespace: String,
        /// Rewrite the documents when they are missing or do not publish the key.
        #[arg(long)]
        repair: bool,
        /// S3 endpoint of an issuer served by an S3-compatible service (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
        #[arg(long)]
        s3_endpoint: Option<String>,
        /// Extra CA bundle (PEM) to trust for the S3 endpoint.
        #[arg(long, env = "HCP_DR_CA_BUNDLE")]
        ca_bundle: Option<PathBuf>,
        #[command(flatten)]
        access: Access,
    },
    /// Converge a cluster to a desired file (a HostedCluster, its NodePools
    /// and Secrets): create what is missing, patch what differs, report the
    /// drift, wait for Available and Ready. A second run changes nothing.
    #[command(after_help = "Example:\n  hcp-dr cluster reconcile -f demo.yaml --dry-run")]
    Reconcile(ReconcileArgs),
    /// Delete a cluster in order: NodePools, CAPI and platform objects,
    /// HostedControlPlane, HCP namespace, HostedCluster (finalizers cleared);
    /// journaled (playbook cluster-destroy), a stopped teardown resumable.
    #[command(after_help = "Example:\n  hcp-dr cluster destroy demo -n clusters --dry-run")]
    Destroy {
        /// The HostedCluster (not with --resume/--abort).
        #[arg(required_unless_present_any = ["resume", "abort"], conflicts_with_all = ["resume", "abort"], value_parser = super::k8s_name)]
        name: Option<String>,
        /// Its namespace.
        #[arg(short = 'n', long, default_value = "clusters", value_parser = super::k8s_name)]
        namespace: String,
        #[command(flatten)]
        access: Access,
        #[command(flatten)]
        run: crate::ops::RunFlags,
    },
}

#[derive(Debug, ClapArgs)]
pub struct ReconcileArgs {
    /// The desired objects (YAML, several documents).
    #[arg(short = 'f', long = "file", required_unless_present_any = ["resume", "abort"], conflicts_with_all = ["resume", "abort"])]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub access: Access,
    /// How long to wait for Available and Ready [range: 10s to 1d].
    #[arg(long, default_value = "30m", value_parser = duration::AVAILABLE_WAIT)]
    pub wait: Duration,
    /// Do not wait for readiness.
    #[arg(long)]
    pub no_wait: bool,
    #[command(flatten)]
    pub run: crate::ops::RunFlags,
}

async fn exec_reconcile(args: ReconcileArgs, output: Output) -> Exit {
    let mut interrupt = match super::report::signals() {
        Ok(i) => i,
        Err(exit) => return exit,
    };
    let aborting = args.run.aborting();
    let options = crate::ops::reconcile::ReconcileOptions {
        file: args.file,
        kubeconfig: args.access.kubeconfig,
        context: args.access.context,
        wait_timeout: args.wait,
        wait: !args.no_wait,
        run: args.run,
        observer: super::report::progress(output),
    };
    match crate::ops::reconcile::reconcile(options, &mut interrupt).await {
        Ok(result) => {
            super::report::print(output, &result, || render_reconcile(&result));
            super::report::exit_for_run(&result.run.outcome, aborting)
        }
        Err(err) => super::report::error_exit(&err),
    }
}

pub fn render_reconcile(result: &crate::ops::reconcile::ReconcileResult) -> String {
    use crate::stages::reconcile::Action;
    let mut out = super::report::headline("cluster reconcile", &result.run, "hcp-dr cluster reconcile");
    out.push('\n');
    out.push_str(&super::report::stage_lines(&result.run));
    for o in &result.objects {
        let what = format!("{} {}", o.kind, o.name);
        match o.action {
            Action::Create => out.push_str(&format!("{what}: missing, created\n")),
            Action::Unchanged => out.push_str(&format!("{what}: as desired\n")),
            Action::Patch => {
                out.push_str(&format!("{what}: drifted\n"));
                for d in &o.drift {
                    if o.kind == "Secret" {
                        out.push_str(&format!("  {} differs (value not shown)\n", d.path));
                    } else {
                        out.push_str(&format!("  {}: live {} -> desired {}\n", d.path, d.live, d.desired));
                    }
                }
            }
        }
    }
    if !result.changed {
        out.push_str("no drift: nothing to change\n");
    }
    if let Some(journal) = &result.run.journal {
        out.push_str(&format!("journal: {journal}\n"));
    }
    for warning in &result.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

#[derive(Debug, ClapArgs)]
pub struct Access {
    /// Management cluster kubeconfig (default: $KUBECONFIG, which may list
    /// several files, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
}

#[derive(Debug, ClapArgs)]
pub struct CreateArgs {
    /// The new HostedCluster's name (--hosted-cluster, as the other commands
    /// call it, is the same flag).
    #[arg(long, visible_alias = "hosted-cluster", value_parser = super::k8s_name)]
    pub name: String,
    /// Its namespace.
    #[arg(short = 'n', long, default_value = "clusters", value_parser = super::k8s_name)]
    pub namespace: String,
    #[arg(long, value_enum, default_value_t = Platform::None)]
    pub platform: Platform,
    /// The OpenShift release image.
    #[arg(long)]
    pub release_image: String,
    /// The pull secret file (a docker config JSON).
    #[arg(long)]
    pub pull_secret: PathBuf,
    /// An SSH public key file for the nodes.
    #[arg(long)]
    pub ssh_key: Option<PathBuf>,
    #[arg(long, default_value = "example.com")]
    pub base_domain: String,
    /// Replicas of the cluster's NodePool [range: 0 to 500].
    #[arg(long, default_value_t = 2, value_parser = super::node_pool_replicas())]
    pub node_pool_replicas: i64,
    /// The control plane's availability policy (etcd members: 1 or 3).
    #[arg(long, default_value = "HighlyAvailable", value_parser = ["SingleReplica", "HighlyAvailable"])]
    pub availability: String,
    /// AWS region (--platform aws).
    #[arg(long)]
    pub aws_region: Option<String>,
    /// AWS IAM role ARN prefix; each component's role is `<prefix>-<component>` (--platform aws).
    #[arg(long)]
    pub aws_role_arn_prefix: Option<String>,
    /// AWS subnet for the NodePool's machines (--platform aws).
    #[arg(long)]
    pub aws_subnet_id: Option<String>,
    /// The HyperShift operator's OIDC bucket as a URL,
    /// https://<bucket>.s3.<region>.amazonaws.com; the cluster's issuer is
    /// <it>/<infraID> (--platform aws).
    #[arg(long)]
    pub aws_oidc_bucket_url: Option<String>,
    /// The namespace of the hosts' Agents, BareMetalHosts and InfraEnv
    /// (--platform agent; default `<namespace>-<name>-agents`). It must exist.
    #[arg(long)]
    pub agent_namespace: Option<String>,
    /// A label the management nodes of the control plane must carry,
    /// KEY=VALUE (repeatable): the HostedCluster's spec.nodeSelector, which
    /// HyperShift gives every control-plane pod and hcp-dr its data movers.
    #[arg(long = "node-selector", value_name = "KEY=VALUE", value_parser = parse_node_selector)]
    pub node_selector: Vec<(String, String)>,
    /// A toleration for the control-plane pods (repeatable), as the
    /// HyperShift CLI takes it: key=K[,value=V][,operator=Equal|Exists][,effect=E][,tolerationSeconds=N];
    /// the HostedCluster's spec.tolerations.
    #[arg(long = "toleration", value_name = "TOLERATION", value_parser = parse_toleration)]
    pub toleration: Vec<serde_json::Value>,
    /// The StorageClass of the etcd members' volumes (the HostedCluster's
    /// spec.etcd.managed.storage.persistentVolume.storageClassName)
    /// [default: the management cluster's default class].
    #[arg(long, value_name = "CLASS", value_parser = super::k8s_name)]
    pub etcd_storage_class: Option<String>,
    /// Print the objects as YAML; create nothing.
    #[arg(long)]
    pub render: bool,
    /// Management cluster kubeconfig (default: $KUBECONFIG, which may list
    /// several files, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// How long to wait for Available [range: 10s to 1d].
    #[arg(long, default_value = "30m", value_parser = duration::AVAILABLE_WAIT)]
    pub wait: Duration,
}

fn cluster(args: &CreateArgs) -> Result<NewCluster, OpsError> {
    for (i, (key, value)) in args.node_selector.iter().enumerate() {
        if let Some((_, other)) = args.node_selector[..i].iter().find(|(k, v)| k == key && v != value) {
            return Err(OpsError::Input(format!("--node-selector gives {key} twice ({other} and {value}): a node has one value per label; keep one")));
        }
    }
    let read = |what: &str, p: &PathBuf| std::fs::read(p).map_err(|e| OpsError::Input(format!("--{what} {}: {e}", p.display())));
    Ok(NewCluster {
        name: args.name.clone(),
        namespace: args.namespace.clone(),
        platform: args.platform,
        release_image: args.release_image.clone(),
        pull_secret: read("pull-secret", &args.pull_secret)?,
        ssh_public_key: match &args.ssh_key {
            Some(p) => Some(String::from_utf8_lossy(&read("ssh-key", p)?).to_string()),
            None => None,
        },
        base_domain: args.base_domain.clone(),
        node_pool_replicas: args.node_pool_replicas,
        availability: args.availability.clone(),
        agent_namespace: args.agent_namespace.clone(),
        node_selector: args.node_selector.iter().cloned().collect(),
        tolerations: args.toleration.clone(),
        etcd_storage_class: args.etcd_storage_class.clone(),
        aws: match (&args.aws_region, &args.aws_role_arn_prefix, &args.aws_subnet_id, &args.aws_oidc_bucket_url) {
            (Some(region), Some(prefix), Some(subnet), Some(issuer)) => {
                Some(AwsSpec { region: region.clone(), role_arn_prefix: prefix.clone(), subnet_id: subnet.clone(), oidc_bucket_url: issuer.clone() })
            }
            _ => None,
        },
    })
}

pub async fn exec(command: Command, output: Output) -> Exit {
    let args = match command {
        Command::Create(args) => args,
        Command::Reconcile(args) => return exec_reconcile(args, output).await,
        Command::Destroy { name, namespace, access, run } => {
            let mut interrupt = match super::report::signals() {
                Ok(i) => i,
                Err(exit) => return exit,
            };
            let aborting = run.aborting();
            let options = crate::ops::cluster::DestroyOptions {
                kubeconfig: access.kubeconfig,
                context: access.context,
                namespace,
                name,
                run,
                observer: super::report::progress(output),
            };
            return match crate::ops::cluster::destroy_journaled(options, &mut interrupt).await {
                Ok(result) => {
                    super::report::print(output, &result, || {
                        let mut out = super::report::headline("cluster destroy", &result.run, "hcp-dr cluster destroy");
                        out.push('\n');
                        out.push_str(&super::report::stage_lines(&result.run));
                        if let Some(runs_on) = &result.fenced_copy_of {
                            out.push_str(&format!(
                                "this was a fenced copy (the cluster runs on {runs_on}): only this management cluster's objects are deleted, finalizers cleared with the copy's controllers stopped and its pause kept, so no controller here cleans up cloud resources, workers or DNS records the live copy uses (what to check on AWS: docs/runbooks/disaster.md)\n"
                            ));
                        }
                        if let Some(journal) = &result.run.journal {
                            out.push_str(&format!("journal: {journal}\n"));
                        }
                        out
                    });
                    super::report::exit_for_run(&result.run.outcome, aborting)
                }
                Err(err) => super::report::error_exit(&err),
            };
        }
        other => return exec_other(other, output).await,
    };
    let new = match cluster(&args) {
        Ok(c) => c,
        Err(e) => return super::report::error_exit(&e),
    };
    if args.render {
        return match render(&new) {
            Ok(objects) => {
                super::report::print(output, &objects, || serde_saphyr::to_string_multiple(&objects).unwrap_or_default());
                Exit::Success
            }
            Err(e) => super::report::error_exit(&e),
        };
    }
    let options = CreateOptions { cluster: new, kubeconfig: args.kubeconfig, context: args.context, wait: args.wait };
    match create(&options).await {
        Ok(hc) => {
            super::report::print(output, &hc, || format!("HostedCluster {}/{} is Available\n", args.namespace, args.name));
            Exit::Success
        }
        Err(e) => super::report::error_exit(&e),
    }
}

async fn exec_other(command: Command, output: Output) -> Exit {
    let access = match &command {
        Command::Pause { access, .. } | Command::Resume { access, .. } | Command::Scale { access, .. } | Command::Oidc { access, .. } => access,
        Command::Create(_) | Command::Reconcile(_) | Command::Destroy { .. } => return Exit::Usage,
    };
    let client = match crate::kube::client(access.kubeconfig.as_deref(), access.context.as_deref()).await {
        Ok(c) => c,
        Err(e) => return super::report::error_exit(&e.into()),
    };
    let result: Result<serde_json::Value, OpsError> = match &command {
        Command::Pause { name, namespace, until, duration, .. } => {
            let until = match until {
                Some(t) => match chrono::DateTime::parse_from_rfc3339(t) {
                    Ok(_) => t.clone(),
                    Err(e) => return super::report::error_exit(&OpsError::Input(format!("--until `{t}` is not an RFC3339 time ({e}), e.g. 2026-11-21T18:00:00Z"))),
                },
                None => (chrono::Utc::now() + chrono::Duration::seconds(duration.as_secs() as i64)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            };
            crate::ops::cluster::pause(&client, namespace, name, &until)
                .await
                .map(|changed| serde_json::json!({"paused_until": until, "objects": changed}))
        }
        Command::Resume { name, namespace, .. } => crate::ops::cluster::resume(&client, namespace, name)
            .await
            .map(|changed| serde_json::json!({"resumed": changed})),
        Command::Scale { name, namespace, node_pool, replicas, .. } => crate::ops::cluster::scale(&client, namespace, name, node_pool, *replicas)
            .await
            .map(|()| serde_json::json!({"node_pool": node_pool, "replicas": replicas})),
        Command::Oidc { name, namespace, repair, s3_endpoint, ca_bundle, .. } => {
            let s3 = crate::store::S3Options { endpoint: s3_endpoint.clone(), ca_bundle: ca_bundle.clone(), ..Default::default() };
            return match crate::ops::cluster::oidc(&client, namespace, name, &s3, *repair).await {
                Ok(report) => {
                    let (line, warn) = report.summary();
                    super::report::print(output, &report, || {
                        let mut out = format!("{line}\n");
                        for need in &report.iam {
                            out.push_str(&format!("IAM (not checked): {need}\n"));
                        }
                        out
                    });
                    if warn { Exit::Failed } else { Exit::Success }
                }
                Err(e) => super::report::error_exit(&e),
            };
        }
        Command::Create(_) | Command::Reconcile(_) | Command::Destroy { .. } => return Exit::Usage,
    };
    match result {
        Ok(value) => {
            super::report::print(output, &value, || format!("{}\n", serde_json::to_string_pretty(&value).unwrap_or_default()));
            Exit::Success
        }
        Err(e) => super::report::error_exit(&e),
    }
}
