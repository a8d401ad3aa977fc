//! `hcp-dr schedule render`: everything a management cluster needs to run
//! backups unattended, as Kubernetes objects: a Namespace, a ServiceAccount,
//! a least-privilege ClusterRole (exactly the verbs and resources backup
//! uses) with its binding, and a CronJob (`concurrencyPolicy: Forbid`,
//! deadlines, no retries within a run: a failed backup undoes itself and
//! the next schedule tries again). Store credentials come from a Secret the
//! operator creates (named, never rendered). With `--keep-*`, prune runs
//! after each successful backup (the backup is an init container).

use serde_json::{Value, json};

use super::OpsError;

/// What `schedule render` was asked.
#[derive(Debug, Clone)]
pub struct ScheduleOptions {
    pub schedule: String,
    pub store: String,
    pub namespace: String,
    pub image: String,
    /// `None`: every HostedCluster (`--all`); else one.
    pub hosted_cluster: Option<(String, String)>,
    pub selector: Option<String>,
    pub s3_endpoint: Option<String>,
    /// A Secret (in `namespace`) with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
    pub credentials_secret: Option<String>,
    pub keep_last: Option<usize>,
    pub keep_daily: Option<usize>,
    pub keep_weekly: Option<usize>,
    pub max_age: Option<String>,
    /// Passed to each backup: the zone whose records of the clusters'
    /// hostnames (and their external-dns owner) the manifests record.
    pub route53_zone: Option<String>,
    /// Pods of an Indexed Job, each backing up its `--shard` (1: one pod).
    pub shards: usize,
    /// Passed to each backup: what it takes of a platform's own data. The
    /// data movers of KubeVirt guest volumes run `image` unless
    /// `mover_image` names another.
    pub platform: crate::stages::context::PlatformSettings,
    /// Passed to each backup: the Pushgateway its metrics go to.
    pub pushgateway: Option<String>,
    /// Passed to each backup: `--copy-to` stores (and `--copy-optional`).
    pub copy_to: Vec<String>,
    pub copy_optional: bool,
    /// Passed to each backup: `--lock-for` and `--lock-mode`.
    pub object_lock: Option<crate::store::object_lock::ObjectLock>,
    /// Render the PrometheusRule and the dashboard too (for the CronJob's
    /// schedule, in its namespace).
    pub monitoring: Option<super::monitoring::Monitoring>,
    /// Also render the continuous backup: a StatefulSet of `shards`
    /// `hcp-dr stream` pods, their Service, ServiceAccount and RBAC.
    pub continuous: bool,
}

/// The port each stream pod serves `/metrics` and `/healthz` on.
pub const STREAM_METRICS_PORT: u16 = 9102;
/// The StatefulSet (and its ServiceAccount, Service and RBAC) of the stream.
pub const STREAM_NAME: &str = "hcp-dr-stream";

/// The rules of the stream's ClusterRole: it reads, and changes nothing on
/// any cluster (its Leases are a Role's, in its own namespace). Each with why.
pub fn stream_rules() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"apiGroups": ["hypershift.openshift.io"], "resources": ["hostedclusters"], "verbs": ["get", "list", "watch"]}),
         "--all lists the HostedClusters (again every --relist-every) and takes those whose UID hashes to its shard; each is read for its HCP namespace, and watched: a change of its spec records the objects again"),
        (json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}),
         "the etcd client certificate of each HCP namespace; and the cluster's secrets, recorded with its objects as a backup exports them (again when one changes: watched)"),
        (json!({"apiGroups": ["hypershift.openshift.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]}),
         "the cluster's objects over time: its NodePools and every namespaced HyperShift resource of its HCP namespace, read as a backup's export reads them; NodePools and the HostedControlPlane watched, so a change is recorded within seconds"),
        (json!({"apiGroups": ["cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io", "bootstrap.cluster.x-k8s.io", "controlplane.cluster.x-k8s.io", "addons.cluster.x-k8s.io", "ipam.cluster.x-k8s.io", "runtime.cluster.x-k8s.io", "capi-provider.agent-install.openshift.io"], "resources": ["*"], "verbs": ["get", "list"]}),
         "the Cluster API and platform objects of the HCP namespace, recorded with the cluster's objects"),
        (json!({"apiGroups": ["agent-install.openshift.io"], "resources": ["agents", "infraenvs", "nmstateconfigs"], "verbs": ["get", "list"]}),
         "on the Agent platform, the cluster's inventory, recorded with its objects"),
        (json!({"apiGroups": ["metal3.io"], "resources": ["baremetalhosts"], "verbs": ["get"]}),
         "on the Agent platform, the BareMetalHosts of the cluster's Agents"),
        (json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}),
         "on the Agent platform, that the HostedCluster's agentNamespace exists"),
        (json!({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["etcd-ca"], "verbs": ["get"]}),
         "the etcd CA of each HCP namespace"),
        (json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}),
         "the etcd members (pods labelled app=etcd in the HCP namespace), their IPs and readiness, found again at each move of the watch"),
        (json!({"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]}),
         "reaching etcd members when pod IPs are not routable: the websocket upgrade is a GET, authorized as `get`, and from Kubernetes 1.35 also as `create`"),
    ]
}

/// The rules of the stream's Role in its own namespace.
pub fn stream_lease_rules() -> Vec<(Value, &'static str)> {
    vec![(
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}),
        "one writer per cluster: each stream takes, renews and releases (an update) the Lease of every cluster it writes, here only",
    )]
}

/// The rules of the ClusterRole: what backup (and prune, and the signals)
/// read and change, nothing more. Each with why.
pub fn rules() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"apiGroups": ["hypershift.openshift.io"], "resources": ["hostedclusters", "nodepools"], "verbs": ["get", "list", "patch"]}),
         "read the clusters; pausedUntil is patched for the pause and put back"),
        (json!({"apiGroups": ["hypershift.openshift.io"], "resources": ["hostedcontrolplanes"], "verbs": ["get", "list", "patch"]}),
         "exported; when the HyperShift operator does not acknowledge the pause (it is down), pausedUntil is patched as the operator would and put back"),
        (json!({"apiGroups": ["cluster.x-k8s.io"], "resources": ["clusters"], "verbs": ["patch"]}),
         "when the HyperShift operator is down, the Cluster API Cluster is paused (spec.paused) as the operator would and put back"),
        (json!({"apiGroups": ["hypershift.openshift.io"], "resources": ["*"], "verbs": ["list"]}),
         "export lists every namespaced HyperShift resource the server serves (awsendpointservices, controlplanecomponents, ... on real clusters)"),
        (json!({"apiGroups": ["cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io", "bootstrap.cluster.x-k8s.io", "controlplane.cluster.x-k8s.io", "addons.cluster.x-k8s.io", "ipam.cluster.x-k8s.io", "runtime.cluster.x-k8s.io", "capi-provider.agent-install.openshift.io"], "resources": ["*"], "verbs": ["get", "list"]}),
         "Cluster API and platform objects of the HCP namespace, exported (export lists every served group named *.cluster.x-k8s.io or capi-provider.*: a server with another such group needs it added here)"),
        (json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}),
         "the cluster's secrets are exported; etcd client TLS is read"),
        (json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]}),
         "etcd-ca is read; the status ConfigMap is written"),
        (json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}),
         "etcd members and the writers' pods; a watch says when the writers' pods are gone (without it hcp-dr polls)"),
        (json!({"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]}),
         "reaching etcd members when pod IPs are not routable: the websocket upgrade is a GET, authorized as `get`, and from Kubernetes 1.35 also as `create`"),
        (json!({"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}),
         "BackupStarted/Succeeded/Failed on the HostedCluster"),
        (json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "patch"]}),
         "the etcd writers are scaled to zero and back; a watch says when they are available again (without it hcp-dr polls)"),
        (json!({"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch", "update"]}),
         "scaling through the scale subresource"),
        (json!({"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get"]}),
         "the etcd StatefulSet's PVC retention is checked"),
        (json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update", "delete"]}),
         "the per-cluster lock"),
        (json!({"apiGroups": ["route.openshift.io"], "resources": ["routes"], "verbs": ["list"]}),
         "the hosts of the HCP namespace's Routes are recorded in the manifest (the hostnames a restore takes over when this management cluster is lost)"),
        (json!({"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}),
         "the external-dns hostnames of the HCP namespace's Services (an API server published through a LoadBalancer) are recorded in the manifest too"),
        (json!({"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}),
         "the management cluster's identity (the kube-system namespace's UID): the store fence is checked against it and the manifest records it"),
        (json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}),
         "on the Agent platform, that the HostedCluster's agentNamespace exists (a backup without its hosts is refused)"),
        (json!({"apiGroups": ["agent-install.openshift.io"], "resources": ["agents", "infraenvs", "nmstateconfigs"], "verbs": ["get", "list"]}),
         "on the Agent platform, the cluster's inventory: the Agents bound to it, their InfraEnvs and NMStateConfigs"),
        (json!({"apiGroups": ["metal3.io"], "resources": ["baremetalhosts"], "verbs": ["get"]}),
         "on the Agent platform, the BareMetalHosts of the cluster's Agents, with their status"),
        (json!({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "create", "delete"]}),
         "on KubeVirt, the guest volumes are found; a scratch claim restored from each one's snapshot is created for its data mover and deleted after"),
        (json!({"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get"]}),
         "on KubeVirt, each guest volume's StorageClass names the CSI driver whose snapshot class is used"),
        (json!({"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshotclasses"], "verbs": ["list"]}),
         "on KubeVirt, the snapshot class of each driver (--volume-snapshot-class, or the driver's default)"),
        (json!({"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": ["get", "create", "delete"]}),
         "on KubeVirt, one snapshot per guest volume while the API is down, deleted once copied"),
        (json!({"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["get"]}),
         "on KubeVirt, a guest volume's DataVolume is recorded (a restore re-creates it) and root disks are told apart"),
        (json!({"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["get", "list"]}),
         "on KubeVirt, the workers' root disks are found through their VirtualMachines; with --include-root-disks each VM is recorded (a restore re-creates it as its disk's owner)"),
        (json!({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create", "delete"]}),
         "on KubeVirt, the data-mover Job of each guest volume (its bearer token in the pod's environment, not a Secret: no right to create Secrets), deleted after its copy"),
    ]
}

/// The `@` macros a Kubernetes CronJob accepts (robfig/cron descriptors);
/// `@every` is left out: a five-field schedule says the same plainly.
pub const CRON_MACROS: [&str; 7] = ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"];

/// A schedule Kubernetes accepts: a macro, or five fields each checked by
/// `cron-parser` against its range, that fires at least once in four years.
pub fn check_schedule(schedule: &str) -> Result<(), OpsError> {
    let text = schedule.trim();
    let bad = |why: String| {
        OpsError::Input(format!(
            "--schedule `{schedule}`: {why}. Use five fields (minute hour day-of-month month day-of-week), e.g. \"0 */6 * * *\", or one of {}",
            CRON_MACROS.join(", ")
        ))
    };
    if text.starts_with('@') {
        return if CRON_MACROS.contains(&text) { Ok(()) } else { Err(bad(format!("`{text}` is not a schedule macro Kubernetes accepts"))) };
    }
    if text.contains("TZ=") {
        return Err(bad("a time zone does not go in the schedule (Kubernetes refuses CRON_TZ/TZ there)".into()));
    }
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(bad(format!("{} field(s), five expected", fields.len())));
    }
    let ranges = [("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 6)];
    for (field, (name, min, max)) in fields.iter().zip(ranges) {
        // names (SUN..SAT) only where they mean something
        let letters = field.chars().any(|c| c.is_ascii_alphabetic());
        let parsed = if letters && name != "day-of-week" { Err(()) } else { cron_parser::parse_field(field, min, max).map(|_| ()).map_err(|_| ()) };
        if parsed.is_err() || field.contains(",,") || field.ends_with(',') || field.starts_with(',') {
            return Err(bad(format!("the {name} field `{field}` is not valid ({min}-{max}{}, *, */N, N-M, N-M/N or a list of those)", if name == "day-of-week" { " or SUN-SAT" } else { "" })));
        }
    }
    cron_parser::parse(text, &chrono::Utc::now()).map_err(|_| bad("it never fires (no such date in the next four years)".into()))?;
    Ok(())
}

/// A backup's platform flags: the data movers run the CronJob's own image
/// (a registry mirror then serves both) unless another is named.
fn platform_args(p: &crate::stages::context::PlatformSettings, image: &str) -> Vec<String> {
    let mut args = vec!["--mover-image".to_string(), p.mover_image.clone().unwrap_or_else(|| image.to_string())];
    if let Some(class) = &p.volume_snapshot_class {
        args.extend(["--volume-snapshot-class".into(), class.clone()]);
    }
    if p.skip_guest_volumes {
        args.push("--skip-guest-volumes".into());
    }
    if p.include_free_agents {
        args.push("--include-free-agents".into());
    }
    if p.include_root_disks {
        args.push("--include-root-disks".into());
    }
    args
}

/// The objects, in apply order.
pub fn render(o: &ScheduleOptions) -> Result<Vec<Value>, OpsError> {
    check_schedule(&o.schedule)?;
    crate::store::StoreUrl::parse(&o.store)?;
    let name = "hcp-dr-backup";
    let labels = json!({"app.kubernetes.io/name": "hcp-dr", "app.kubernetes.io/component": "backup"});
    let mut backup_args = vec!["backup".to_string()];
    match &o.hosted_cluster {
        Some((ns, hc)) => backup_args.extend(["--hosted-cluster".into(), hc.clone(), "-n".into(), ns.clone()]),
        None => {
            backup_args.push("--all".into());
            if let Some(selector) = &o.selector {
                backup_args.extend(["-l".into(), selector.clone()]);
            }
            if o.shards > 1 {
                backup_args.extend(["--shard".into(), shard_arg(o.shards)]);
            }
        }
    }
    backup_args.extend(["--to".into(), o.store.clone(), "--output".into(), "json".into()]);
    if let Some(zone) = &o.route53_zone {
        crate::dns::route53::parse_zone_id(zone).map_err(|e| OpsError::Input(format!("--route53-zone: {e}")))?;
        backup_args.extend(["--route53-zone".into(), zone.clone()]);
    }
    if let Some(url) = &o.pushgateway {
        super::signals::Pushgateway::new(url, "hcp-dr", &[], None).map_err(OpsError::Input)?;
        backup_args.extend(["--pushgateway".into(), url.clone()]);
    }
    for copy in &o.copy_to {
        let url = crate::store::StoreUrl::parse(copy).map_err(|e| OpsError::Input(format!("--copy-to: {e}")))?;
        if url.same_store(&crate::store::StoreUrl::parse(&o.store)?) {
            return Err(OpsError::Input(format!("--copy-to {copy} is the store the backups are written to (--to): a copy goes to another store")));
        }
        if matches!(url, crate::store::StoreUrl::Local(_)) {
            return Err(OpsError::Input(format!("--copy-to {copy}: a CronJob's pod has no local directory that outlives it; copy to s3://bucket/prefix")));
        }
        backup_args.extend(["--copy-to".into(), copy.clone()]);
    }
    if o.copy_optional {
        backup_args.push("--copy-optional".into());
    }
    if let Some(lock) = &o.object_lock {
        if matches!(crate::store::StoreUrl::parse(&o.store)?, crate::store::StoreUrl::Local(_)) {
            return Err(OpsError::Input(format!("--lock-for: --to {} is a local directory; S3 Object Lock needs an S3 store (s3://bucket/prefix) whose bucket has Object Lock enabled", o.store)));
        }
        backup_args.extend(["--lock-for".into(), crate::duration::show(lock.retain_for), "--lock-mode".into(), lock.mode.to_string().to_lowercase()]);
    }
    backup_args.extend(platform_args(&o.platform, &o.image));
    let mut env = vec![json!({"name": "HCP_DR_STATE_DIR", "value": "/var/lib/hcp-dr"})];
    if let Some(endpoint) = &o.s3_endpoint {
        env.push(json!({"name": "AWS_ENDPOINT_URL_S3", "value": endpoint}));
    }
    let env_from: Vec<Value> = o
        .credentials_secret
        .iter()
        .map(|s| json!({"secretRef": {"name": s}}))
        .collect();
    let container = |cname: &str, args: &[String]| {
        json!({
            "name": cname, "image": o.image, "args": args, "env": env, "envFrom": env_from,
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "state", "mountPath": "/var/lib/hcp-dr"}, {"name": "tmp", "mountPath": "/tmp"}],
        })
    };
    let mut prune_args = vec!["backups".to_string(), "prune".into(), "--store".into(), o.store.clone()];
    for (flag, value) in [
        ("--keep-last", o.keep_last.map(|n| n.to_string())),
        ("--keep-daily", o.keep_daily.map(|n| n.to_string())),
        ("--keep-weekly", o.keep_weekly.map(|n| n.to_string())),
        ("--max-age", o.max_age.clone()),
    ] {
        if let Some(v) = value {
            prune_args.extend([flag.to_string(), v]);
        }
    }
    let pruning = prune_args.len() > 4;
    if pruning && o.shards > 1 {
        prune_args.extend(["--shard".into(), shard_arg(o.shards)]);
    }
    let (init, main) = if pruning {
        (vec![container("backup", &backup_args)], container("prune", &prune_args))
    } else {
        (vec![], container("backup", &backup_args))
    };
    if o.shards == 0 || o.shards > 64 {
        return Err(OpsError::Input(format!("--shards {}: from 1 to 64", o.shards)));
    }
    if o.shards > 1 && o.hosted_cluster.is_some() {
        return Err(OpsError::Input("--shards spreads a fleet (--all) over pods; one cluster is one pod".into()));
    }
    let mut job = json!({
        "backoffLimit": 0,
        "activeDeadlineSeconds": 3 * 3600,
        "template": {"metadata": {"labels": labels}, "spec": {
            "serviceAccountName": name,
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": init,
            "containers": [main],
            "volumes": [{"name": "state", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        }},
    });
    if o.shards > 1 {
        // Each index once, at once; a failed index (a cluster of it failed)
        // fails alone: backoffLimitPerIndex instead of the Job-wide
        // backoffLimit, whose first failure would end the other shards.
        let spec = job.as_object_mut().expect("an object");
        spec.remove("backoffLimit");
        spec.insert("completionMode".into(), json!("Indexed"));
        spec.insert("completions".into(), json!(o.shards));
        spec.insert("parallelism".into(), json!(o.shards));
        spec.insert("backoffLimitPerIndex".into(), json!(0));
        spec.insert("maxFailedIndexes".into(), json!(o.shards));
    }
    let mut rules_json = Vec::new();
    for (rule, _) in rules() {
        rules_json.push(rule);
    }
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": o.namespace, "labels": labels}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": o.namespace, "labels": labels}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": labels}, "rules": rules_json}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": o.namespace}]}),
        json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": o.namespace, "labels": labels},
               "spec": {
                   "schedule": o.schedule,
                   "concurrencyPolicy": "Forbid",
                   "startingDeadlineSeconds": 600,
                   "successfulJobsHistoryLimit": 3,
                   "failedJobsHistoryLimit": 5,
                   "jobTemplate": {"metadata": {"labels": labels}, "spec": job},
               }}),
    ];
    if o.continuous {
        objects.extend(stream_objects(o, &env, &env_from)?);
    }
    if let Some(m) = &o.monitoring {
        let labels = json!({"app.kubernetes.io/name": "hcp-dr", "app.kubernetes.io/component": "monitoring"});
        objects.push(super::monitoring::prometheus_rule(m, &o.schedule, &o.namespace, &labels, o.continuous)?);
        objects.push(super::monitoring::dashboard_configmap(&o.namespace, &labels));
    }
    objects.iter_mut().for_each(drop_empty_lists);
    Ok(objects)
}

/// The continuous backup: a ServiceAccount of its own (the stream only
/// reads; the backup's rights to patch and scale are not its), its
/// ClusterRole and Role with their bindings, a headless Service (the
/// StatefulSet's `serviceName`, and what a ServiceMonitor selects), and the
/// StatefulSet: `shards` pods at once (Parallel), pod i streaming the
/// clusters of shard i (its name's ordinal), each holding their Leases.
fn stream_objects(o: &ScheduleOptions, env: &[Value], env_from: &[Value]) -> Result<Vec<Value>, OpsError> {
    let name = STREAM_NAME;
    let labels = json!({"app.kubernetes.io/name": "hcp-dr", "app.kubernetes.io/component": "stream"});
    let mut args = vec!["stream".to_string()];
    match &o.hosted_cluster {
        Some((ns, hc)) => args.extend(["--hosted-cluster".into(), format!("{ns}/{hc}")]),
        None => {
            args.push("--all".into());
            if let Some(selector) = &o.selector {
                args.extend(["-l".into(), selector.clone()]);
            }
            args.extend(["--shard-from-hostname".into(), o.shards.to_string()]);
        }
    }
    args.extend([
        "--to".into(),
        o.store.clone(),
        "--lease-namespace".into(),
        o.namespace.clone(),
        "--output".into(),
        "json".into(),
    ]);
    let port = STREAM_METRICS_PORT;
    // --metrics-addr through the environment: the args are the same
    // wherever the command runs (the tests run them as they are)
    let mut env = env.to_vec();
    env.push(json!({"name": "HCP_DR_METRICS_ADDR", "value": format!("0.0.0.0:{port}")}));
    let container = json!({
        "name": "stream", "image": o.image, "args": args, "env": env, "envFrom": env_from,
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        // the loops alive; a stream whose store failed for good turns 503 and is restarted (it resumes)
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "initialDelaySeconds": 30, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "state", "mountPath": "/var/lib/hcp-dr"}, {"name": "tmp", "mountPath": "/tmp"}],
    });
    let cluster_rules: Vec<Value> = stream_rules().into_iter().map(|(rule, _)| rule).collect();
    let lease_rules: Vec<Value> = stream_lease_rules().into_iter().map(|(rule, _)| rule).collect();
    let scrape = json!({"prometheus.io/scrape": "true", "prometheus.io/port": port.to_string(), "prometheus.io/path": "/metrics"});
    Ok(vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": o.namespace, "labels": labels}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": labels}, "rules": cluster_rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": o.namespace}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name, "namespace": o.namespace, "labels": labels}, "rules": lease_rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": o.namespace, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": o.namespace}]}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": o.namespace, "labels": labels, "annotations": scrape},
               "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]}}),
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": o.namespace, "labels": labels},
               "spec": {
                   "serviceName": name,
                   "replicas": o.shards,
                   "podManagementPolicy": "Parallel",
                   "selector": {"matchLabels": labels},
                   "template": {"metadata": {"labels": labels, "annotations": scrape}, "spec": {
                       "serviceAccountName": name,
                       // SIGTERM: every open segment is written, the Leases released
                       "terminationGracePeriodSeconds": 60,
                       "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                       "containers": [container],
                       "volumes": [{"name": "state", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                   }},
               }}),
    ])
}

/// Remove every empty list (`envFrom: []`, `initContainers: []`). A real
/// API server drops them (the built-in kinds' lists are `omitempty`), so an
/// object rendered with them never matches what `kubectl apply` recorded:
/// every apply reports it `configured` and GitOps shows it out of sync.
/// Empty objects stay: `emptyDir: {}` means something.
fn drop_empty_lists(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
            map.values_mut().for_each(drop_empty_lists);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty_lists),
        _ => {}
    }
}

/// `--shard`'s value in a pod of an Indexed Job: Kubernetes puts the pod's
/// index in JOB_COMPLETION_INDEX and expands `$(VAR)` in args.
fn shard_arg(shards: usize) -> String {
    format!("$(JOB_COMPLETION_INDEX)/{shards}")
}

/// The objects as one multi-document YAML stream.
pub fn render_yaml(o: &ScheduleOptions) -> Result<String, OpsError> {
    let objects = render(o)?;
    let mut out = String::from("# Rendered by hcp-dr schedule render. Apply with: kubectl apply -f -\n");
    if let Some(secret) = &o.credentials_secret {
        out.push_str(&format!(
            "# Store credentials: create Secret {}/{secret} with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY first.\n",
            o.namespace
        ));
    }
    out.push_str(&serde_saphyr::to_string_multiple(&objects).map_err(|e| OpsError::Input(e.to_string()))?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ScheduleOptions {
        ScheduleOptions {
            schedule: "0 */6 * * *".into(),
            store: "s3://bucket/hcp".into(),
            namespace: "hcp-dr".into(),
            image: "quay.io/example/hcp-dr:0.1.0".into(),
            hosted_cluster: None,
            selector: Some("backup=yes".into()),
            s3_endpoint: None,
            credentials_secret: Some("hcp-dr-s3".into()),
            keep_last: Some(7),
            keep_daily: None,
            keep_weekly: None,
            max_age: Some("30d".into()),
            route53_zone: None,
            shards: 1,
            platform: Default::default(),
            pushgateway: None,
            copy_to: Vec::new(),
            copy_optional: false,
            object_lock: None,
            monitoring: None,
            continuous: false,
        }
    }

    #[test]
    fn continuous_renders_a_statefulset_whose_pods_stream_their_shard_with_only_read_rights() {
        let mut o = options();
        o.continuous = true;
        o.shards = 3;
        o.s3_endpoint = Some("https://minio.example:9000".into());
        let objects = render(&o).unwrap();
        let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CronJob", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "StatefulSet"]);
        let sts = &objects[11];
        assert_eq!((sts["spec"]["replicas"].as_u64(), sts["spec"]["podManagementPolicy"].as_str(), sts["spec"]["serviceName"].as_str()), (Some(3), Some("Parallel"), Some(STREAM_NAME)));
        let pod = &sts["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], STREAM_NAME);
        let c = &pod["containers"][0];
        assert_eq!(
            c["args"],
            json!(["stream", "--all", "-l", "backup=yes", "--shard-from-hostname", "3", "--to", "s3://bucket/hcp", "--lease-namespace", "hcp-dr", "--output", "json"])
        );
        let env = c["env"].as_array().unwrap();
        assert!(env.contains(&json!({"name": "HCP_DR_METRICS_ADDR", "value": "0.0.0.0:9102"})), "{env:?}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["image"], o.image);
        // the CronJob's store credentials and endpoint
        let cron = &objects[4]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0];
        assert_eq!(&c["envFrom"], &cron["envFrom"]);
        assert!(cron["env"].as_array().unwrap().iter().all(|e| env.contains(e)), "{env:?}");
        assert!(env.contains(&json!({"name": "AWS_ENDPOINT_URL_S3", "value": "https://minio.example:9000"})), "{env:?}");
        assert_eq!(sts["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"], "9102");
        assert_eq!(objects[10]["spec"]["clusterIP"], "None");
        // nothing changed on any cluster: read verbs only (get, list, watch), but the Leases, in its namespace only
        for rule in objects[6]["rules"].as_array().unwrap() {
            let verbs: Vec<&str> = rule["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
            assert!(verbs.iter().all(|v| ["get", "list", "watch"].contains(v) || (*v == "create" && rule["resources"][0] == "pods/portforward")), "{rule}");
        }
        assert_eq!(objects[8]["metadata"]["namespace"], "hcp-dr");
        assert_eq!(objects[8]["rules"], json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]));
        // one cluster: one pod streaming it
        o.shards = 1;
        o.hosted_cluster = Some(("clusters".into(), "demo".into()));
        let objects = render(&o).unwrap();
        let args = &objects.last().unwrap()["spec"]["template"]["spec"]["containers"][0]["args"];
        assert_eq!(args.as_array().unwrap()[..3], [json!("stream"), json!("--hosted-cluster"), json!("clusters/demo")]);
    }

    /// Nothing a real API server would drop: no empty list anywhere, with
    /// or without credentials and pruning (no envFrom, no init container);
    /// `emptyDir: {}` stays.
    #[test]
    fn nothing_is_rendered_that_the_server_would_drop() {
        fn empty_lists(value: &Value, at: &str, found: &mut Vec<String>) {
            match value {
                Value::Array(items) if items.is_empty() => found.push(at.to_string()),
                Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| empty_lists(v, &format!("{at}/{i}"), found)),
                Value::Object(map) => map.iter().for_each(|(k, v)| empty_lists(v, &format!("{at}/{k}"), found)),
                _ => {}
            }
        }
        let bare = ScheduleOptions { credentials_secret: None, keep_last: None, max_age: None, ..options() };
        for o in [options(), bare] {
            let objects = render(&o).unwrap();
            let mut found = Vec::new();
            objects.iter().for_each(|object| empty_lists(object, "", &mut found));
            assert!(found.is_empty(), "empty lists at {found:?}");
            let pod = &objects[4]["spec"]["jobTemplate"]["spec"]["template"]["spec"];
            assert_eq!(pod["volumes"][0]["emptyDir"], json!({}));
        }
    }

    #[test]
    fn schedules_are_checked_field_by_field() {
        for good in ["0 */6 * * *", "*/15 * * * *", "30 2 * * 1-5", "0 0 1,15 * *", "5 4 * * SUN", "0 0 29 2 *", "@daily", "@hourly", " 0 3 * * * "] {
            assert!(check_schedule(good).is_ok(), "{good}: {:?}", check_schedule(good).err());
        }
        for (bad, says) in [
            ("99 99 99 99 99", "the minute field `99`"),
            ("@sometimes", "`@sometimes` is not a schedule macro"),
            ("@every 1h", "not a schedule macro"),
            ("0 */6 * *", "4 field(s)"),
            ("0 24 * * *", "the hour field `24`"),
            ("0 0 0 * *", "the day-of-month field `0`"),
            ("0 0 * 13 *", "the month field `13`"),
            ("0 0 * * 7", "the day-of-week field `7`"),
            ("MON * * * *", "the minute field `MON`"),
            ("0 0 31 2 *", "never fires"),
            ("*/0 * * * *", "the minute field"),
            ("5-1 * * * *", "the minute field"),
            ("1,,2 * * * *", "the minute field"),
            ("CRON_TZ=UTC 0 0 * * *", "time zone"),
            ("", "0 field(s)"),
        ] {
            let err = check_schedule(bad).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains("--schedule"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn renders_a_forbid_cronjob_with_backup_then_prune() {
        let objects = render(&options()).unwrap();
        let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CronJob"]);
        let cron = &objects[4]["spec"];
        assert_eq!(cron["concurrencyPolicy"], "Forbid");
        let pod = &cron["jobTemplate"]["spec"]["template"]["spec"];
        assert_eq!(pod["initContainers"][0]["args"], json!(["backup", "--all", "-l", "backup=yes", "--to", "s3://bucket/hcp", "--output", "json", "--mover-image", "quay.io/example/hcp-dr:0.1.0"]));
        assert_eq!(pod["containers"][0]["args"], json!(["backups", "prune", "--store", "s3://bucket/hcp", "--keep-last", "7", "--max-age", "30d"]));
        assert_eq!(pod["containers"][0]["envFrom"][0]["secretRef"]["name"], "hcp-dr-s3");
        let yaml = render_yaml(&options()).unwrap();
        let back: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(back, objects, "the YAML reads back as the objects");
    }

    #[test]
    fn platform_flags_reach_the_backup_and_movers_default_to_the_cronjobs_image() {
        let mut o = options();
        o.platform = crate::stages::context::PlatformSettings {
            volume_snapshot_class: Some("fast".into()),
            skip_guest_volumes: false,
            mover_image: Some("mirror.example.com/hcp-dr:0.1.0".into()),
            include_free_agents: true,
            include_root_disks: true,
        };
        let objects = render(&o).unwrap();
        let args = &objects[4]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]["args"];
        let tail: Vec<&str> = args.as_array().unwrap()[8..].iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(tail, ["--mover-image", "mirror.example.com/hcp-dr:0.1.0", "--volume-snapshot-class", "fast", "--include-free-agents", "--include-root-disks"]);
        o.platform = crate::stages::context::PlatformSettings { skip_guest_volumes: true, ..Default::default() };
        let objects = render(&o).unwrap();
        let args = &objects[4]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]["args"];
        assert_eq!(args.as_array().unwrap()[8..], [json!("--mover-image"), json!(o.image), json!("--skip-guest-volumes")]);
    }

    #[test]
    fn the_lock_reaches_each_backup_and_needs_an_s3_store() {
        let mut o = options();
        o.object_lock = Some(crate::store::object_lock::ObjectLock { mode: crate::store::object_lock::LockMode::Governance, retain_for: std::time::Duration::from_secs(30 * 86400) });
        let objects = render(&o).unwrap();
        let args = &objects[4]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]["args"];
        let args: Vec<&str> = args.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(args.windows(4).any(|w| w == ["--lock-for", "30d", "--lock-mode", "governance"]), "{args:?}");
        o.store = "/var/backups".into();
        let err = render(&o).unwrap_err().to_string();
        assert!(err.contains("--lock-for") && err.contains("local directory"), "{err}");
    }

    #[test]
    fn shards_render_an_indexed_job_whose_pods_take_their_part() {
        let one = render(&options()).unwrap();
        let job = &one[4]["spec"]["jobTemplate"]["spec"];
        assert_eq!(job["backoffLimit"], 0);
        assert!(job.get("completionMode").is_none(), "one pod: {job:#}");
        let mut o = options();
        o.shards = 4;
        let sharded = render(&o).unwrap();
        let job = &sharded[4]["spec"]["jobTemplate"]["spec"];
        assert_eq!((job["completionMode"].as_str(), job["completions"].as_u64(), job["parallelism"].as_u64()), (Some("Indexed"), Some(4), Some(4)));
        // a failed shard fails alone
        assert_eq!((job["backoffLimitPerIndex"].as_u64(), job["maxFailedIndexes"].as_u64()), (Some(0), Some(4)));
        assert!(job.get("backoffLimit").is_none(), "a Job-wide backoffLimit would end every shard at the first failure");
        let pod = &job["template"]["spec"];
        assert_eq!(
            pod["initContainers"][0]["args"],
            json!(["backup", "--all", "-l", "backup=yes", "--shard", "$(JOB_COMPLETION_INDEX)/4", "--to", "s3://bucket/hcp", "--output", "json", "--mover-image", "quay.io/example/hcp-dr:0.1.0"])
        );
        assert_eq!(
            pod["containers"][0]["args"],
            json!(["backups", "prune", "--store", "s3://bucket/hcp", "--keep-last", "7", "--max-age", "30d", "--shard", "$(JOB_COMPLETION_INDEX)/4"])
        );
        o.hosted_cluster = Some(("clusters".into(), "demo".into()));
        assert!(render(&o).unwrap_err().to_string().contains("--shards"));
    }

    #[test]
    fn bad_schedules_are_refused() {
        for bad in ["", "every 6h", "0 */6 * *", "0 */6 * * * *"] {
            let mut o = options();
            o.schedule = bad.into();
            assert!(render(&o).is_err(), "{bad}");
        }
    }
}
