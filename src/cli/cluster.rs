//! `hcp-dr cluster create`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};

use super::backup::parse_duration;
use super::{Exit, Output};
use crate::hosted::render::{AwsSpec, NewCluster, Platform};
use crate::ops::OpsError;
use crate::ops::cluster::{CreateOptions, create, render};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a hosted cluster (or, with --render, print its objects).
    Create(CreateArgs),
    /// Pause reconciliation of a cluster and its NodePools until a deadline.
    Pause {
        name: String,
        #[arg(short = 'n', long, default_value = "clusters")]
        namespace: String,
        /// An RFC3339 time; default: now + --for.
        #[arg(long)]
        until: Option<String>,
        /// How long the pause lasts (when --until is not given).
        #[arg(long = "for", default_value = "1h", value_parser = parse_duration)]
        duration: Duration,
        #[command(flatten)]
        access: Access,
    },
    /// Lift the pause of a cluster and its NodePools.
    Resume {
        name: String,
        #[arg(short = 'n', long, default_value = "clusters")]
        namespace: String,
        #[command(flatten)]
        access: Access,
    },
    /// Set the replicas of one of a cluster's NodePools.
    Scale {
        name: String,
        #[arg(short = 'n', long, default_value = "clusters")]
        namespace: String,
        #[arg(long)]
        node_pool: String,
        #[arg(long)]
        replicas: i64,
        #[command(flatten)]
        access: Access,
    },
    /// Delete a cluster in order: NodePools, CAPI and platform objects,
    /// HostedControlPlane, HCP namespace, HostedCluster (finalizers cleared).
    Destroy {
        name: String,
        #[arg(short = 'n', long, default_value = "clusters")]
        namespace: String,
        #[command(flatten)]
        access: Access,
    },
}

#[derive(Debug, ClapArgs)]
pub struct Access {
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long)]
    pub context: Option<String>,
}

#[derive(Debug, ClapArgs)]
pub struct CreateArgs {
    #[arg(long)]
    pub name: String,
    #[arg(short = 'n', long, default_value = "clusters")]
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
    #[arg(long, default_value_t = 2)]
    pub node_pool_replicas: i64,
    #[arg(long, default_value = "HighlyAvailable")]
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
    /// Print the objects as YAML; create nothing.
    #[arg(long)]
    pub render: bool,
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long)]
    pub context: Option<String>,
    /// How long to wait for Available.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub wait: Duration,
}

fn cluster(args: &CreateArgs) -> Result<NewCluster, OpsError> {
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
        aws: match (&args.aws_region, &args.aws_role_arn_prefix, &args.aws_subnet_id) {
            (Some(region), Some(prefix), Some(subnet)) => {
                Some(AwsSpec { region: region.clone(), role_arn_prefix: prefix.clone(), subnet_id: subnet.clone() })
            }
            _ => None,
        },
    })
}

pub async fn exec(command: Command, output: Output) -> Exit {
    let args = match command {
        Command::Create(args) => args,
        other => return exec_other(other, output).await,
    };
    let new = match cluster(&args) {
        Ok(c) => c,
        Err(e) => return super::report::error_exit(&e),
    };
    if args.render {
        return match render(&new) {
            Ok(objects) => {
                match output {
                    Output::Json => println!("{}", serde_json::to_string_pretty(&objects).unwrap_or_default()),
                    Output::Text => print!("{}", serde_saphyr::to_string_multiple(&objects).unwrap_or_default()),
                }
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
        Command::Pause { access, .. } | Command::Resume { access, .. } | Command::Scale { access, .. } | Command::Destroy { access, .. } => access,
        Command::Create(_) => return Exit::Usage,
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
        Command::Destroy { name, namespace, .. } => crate::ops::cluster::destroy(&client, namespace, name)
            .await
            .and_then(|t| serde_json::to_value(t).map_err(|e| OpsError::Input(e.to_string()))),
        Command::Create(_) => return Exit::Usage,
    };
    match result {
        Ok(value) => {
            super::report::print(output, &value, || format!("{}\n", serde_json::to_string_pretty(&value).unwrap_or_default()));
            Exit::Success
        }
        Err(e) => super::report::error_exit(&e),
    }
}
