//! Management clusters the sandbox does not run: any Kubernetes API server a
//! kubeconfig names (kind, k3s, a real cluster without HyperShift, or the
//! emulator started on its own with `hcp-dr-sandbox apiserver`).
//!
//! Before anything is created the sandbox checks each one ([`connect`],
//! [`check`]): it answers, the kubeconfig's user may do what the sandbox
//! does (cluster-admin in practice; the missing permissions are listed),
//! no HyperShift operator runs there (unless forced), and no HostedCluster
//! is named like the demo; [`controllers`] says who runs the
//! controller-manager's controllers there (the cluster's own where its
//! kube-controller-manager renews its Lease: the sandbox is then a kubelet
//! with a Node of its own, [`crate::operator::kubelet`]). Then [`prepare`]
//! records what is already there and installs what is missing: the CRDs
//! (HyperShift, Cluster API with the sandbox's conversion webhook, and the
//! platform CRDs: Route, Agent, BareMetalHost, ...), HyperShift's
//! PriorityClasses, and in that mode the sandbox's StorageClass; the
//! simulated operator runs against the cluster as against an emulated one.
//! At the end [`remove`] deletes only what the sandbox created: its
//! HostedClusters (the operator, still running, tears each down), the
//! namespaces created since `up` that held them, and the CRDs and other
//! cluster-scoped objects it installed (its Node goes when its operator
//! stops);
//! anything that existed before `up` is left, and so is a namespace another
//! client created meanwhile.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::operator::Controllers;
use crate::sandbox::{SandboxError, api_for};

/// How long one cluster may take to answer the first request.
const REACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`prepare`] waits for each CRD it installed to be Established.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`remove`] waits for what it deleted to be gone.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(120);

/// A management cluster named by a kubeconfig.
#[derive(Clone)]
pub struct External {
    /// The kubeconfig as given.
    pub kubeconfig: PathBuf,
    /// Its server URL.
    pub url: String,
    pub client: kube::Client,
    /// The uid of its `kube-system` Namespace: what tells two clusters apart
    /// (two kubeconfigs may name one server by different addresses).
    pub identity: String,
}

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("External")
            .field("kubeconfig", &self.kubeconfig)
            .field("url", &self.url)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// What a cluster held before the sandbox came, and what the sandbox
/// installed: kept in `sandbox.json`, read by [`remove`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Footprint {
    /// The CRDs the sandbox created (those already there are left alone).
    pub installed_crds: Vec<String>,
    /// Namespaces that existed at `up`: never removed.
    pub preexisting_namespaces: BTreeSet<String>,
    /// HostedClusters (`ns/name`) that existed at `up`: never removed.
    pub preexisting_hosted_clusters: BTreeSet<String>,
    /// Who runs the controller-manager's controllers there.
    #[serde(default)]
    pub controllers: Controllers,
    /// Other cluster-scoped objects the sandbox created (`Kind/name`: the
    /// PriorityClasses of HyperShift's control planes and the StorageClass
    /// the sandbox provisions, where the cluster's own controllers run).
    #[serde(default)]
    pub installed_objects: Vec<String>,
}

/// The cluster-scoped objects a real API server needs before the pods of a
/// hosted control plane can be created and their claims bound, as the
/// HyperShift operator's install and a CSI driver's give them: the
/// PriorityClasses the control-plane pods name (the Priority admission
/// plugin refuses a pod naming a class that does not exist; installed on
/// every cluster) and the sandbox's own StorageClass (where the cluster's
/// binder runs; not the default: the cluster's stays so).
pub fn cluster_objects() -> Vec<Value> {
    let priority = |name: &str, value: i64, what: &str| {
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "globalDefault": false, "description": what})
    };
    vec![
        priority("hypershift-etcd", 100002000, "etcd pods of hosted control planes (installed by hcp-dr-sandbox)"),
        priority("hypershift-api-critical", 100001000, "API servers of hosted control planes (installed by hcp-dr-sandbox)"),
        priority("hypershift-control-plane", 100000000, "hosted control plane pods (installed by hcp-dr-sandbox)"),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": crate::operator::workloads::LOCAL_CLASS},
            "provisioner": crate::operator::workloads::LOCAL_PROVISIONER, "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate"}),
    ]
}

/// The sandbox's CSI driver's StorageClass and VolumeSnapshotClass (KubeVirt
/// guest volumes), as on an emulated cluster but not the cluster's default
/// StorageClass: the existing cluster's default stays so.
pub fn csi_objects() -> Vec<Value> {
    crate::operator::snapshots::storage_objects()
        .into_iter()
        .map(|mut o| {
            if o["kind"] == "StorageClass"
                && let Some(annotations) = o["metadata"]["annotations"].as_object_mut()
            {
                annotations.clear();
            }
            o
        })
        .collect()
}

fn refused(text: String) -> SandboxError {
    SandboxError::Refused(text)
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> SandboxError {
    let action = action.into();
    move |source| SandboxError::Kube { action, source }
}

/// Read `path`, build a client and check the server answers; its identity
/// is the `kube-system` Namespace's uid.
pub async fn connect(path: &Path) -> Result<External, SandboxError> {
    let shown = path.display();
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| refused(format!("--mgmt-kubeconfig {shown}: not a readable kubeconfig: {e}")))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| refused(format!("--mgmt-kubeconfig {shown}: its current context cannot be used: {e}")))?;
    let url = config.cluster_url.to_string().trim_end_matches('/').to_string();
    let mut config = config;
    config.connect_timeout = Some(REACH_TIMEOUT);
    config.read_timeout = Some(Duration::from_secs(30));
    let client = kube::Client::try_from(config)
        .map_err(|e| refused(format!("--mgmt-kubeconfig {shown}: no client for {url}: {e}")))?;
    let unreachable = |e: String| {
        refused(format!(
            "--mgmt-kubeconfig {shown}: the API server at {url} does not answer ({e}); check that it runs, that this machine reaches it and that the kubeconfig's credentials are valid"
        ))
    };
    match tokio::time::timeout(REACH_TIMEOUT, client.apiserver_version()).await {
        Err(_) => return Err(unreachable(format!("no answer in {}s", REACH_TIMEOUT.as_secs()))),
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Ok(Ok(_)) => {}
    }
    // a user who may not read it is told what is missing by [`check`]
    let identity = match Api::<Namespace>::all(client.clone()).get("kube-system").await {
        Ok(ns) => ns.metadata.uid.unwrap_or_default(),
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => String::new(),
        Err(e) => return Err(unreachable(format!("reading Namespace kube-system: {e}"))),
    };
    Ok(External { kubeconfig: path.to_path_buf(), url, client, identity })
}

/// Refuse the same cluster given twice (by kube-system uid, or by URL when
/// it has none).
pub fn check_distinct(clusters: &[External]) -> Result<(), SandboxError> {
    for (i, a) in clusters.iter().enumerate() {
        for b in &clusters[i + 1..] {
            let same = if a.identity.is_empty() || b.identity.is_empty() { a.url == b.url } else { a.identity == b.identity };
            if same {
                return Err(refused(format!(
                    "--mgmt-kubeconfig {} and {} name the same cluster ({}, kube-system uid {}); give two different management clusters, or one for mgmt-a alone",
                    a.kubeconfig.display(),
                    b.kubeconfig.display(),
                    a.url,
                    if a.identity.is_empty() { "unknown" } else { &a.identity }
                )));
            }
        }
    }
    Ok(())
}

/// What the sandbox does on a cluster: `(verb, group, resource, subresource)`.
/// Cluster-admin has all of them.
const NEEDED: &[(&str, &str, &str, &str)] = &[
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("delete", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("create", "", "namespaces", ""),
    ("delete", "", "namespaces", ""),
    ("list", "", "namespaces", ""),
    ("create", "", "secrets", ""),
    ("create", "", "configmaps", ""),
    ("create", "", "services", ""),
    ("list", "", "services", ""),
    ("patch", "", "services", "status"),
    ("create", "", "pods", ""),
    ("delete", "", "pods", ""),
    ("patch", "", "pods", "status"),
    ("create", "", "persistentvolumeclaims", ""),
    ("patch", "", "persistentvolumeclaims", ""),
    ("list", "apps", "deployments", ""),
    ("get", "coordination.k8s.io", "leases", ""),
    ("patch", "apps", "deployments", "status"),
    ("patch", "apps", "statefulsets", "status"),
    ("*", "hypershift.openshift.io", "*", ""),
    ("*", "cluster.x-k8s.io", "*", ""),
    ("*", "infrastructure.cluster.x-k8s.io", "*", ""),
    ("*", "route.openshift.io", "routes", ""),
    ("*", "agent-install.openshift.io", "*", ""),
    ("*", "metal3.io", "baremetalhosts", ""),
    // the storage controllers (snapshots, Jobs, provisioning Events)
    ("list", "storage.k8s.io", "storageclasses", ""),
    ("*", "snapshot.storage.k8s.io", "*", ""),
    ("patch", "batch", "jobs", "status"),
    ("create", "", "events", ""),
];

/// Whether the kubeconfig's user may do what the sandbox does; the error
/// lists every permission missing.
async fn check_permissions(cluster: &External) -> Result<(), SandboxError> {
    let api = Api::<SelfSubjectAccessReview>::all(cluster.client.clone());
    let mut missing = Vec::new();
    for (verb, group, resource, sub) in NEEDED {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_string()),
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    subresource: (!sub.is_empty()).then(|| sub.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(kube_err(format!("asking {} whether the kubeconfig may {verb} {resource}", cluster.url)))?;
        if !answer.status.is_some_and(|s| s.allowed) {
            let what = if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
            let what = if sub.is_empty() { what } else { format!("{what}/{sub}") };
            missing.push(format!("{verb} {what}"));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(refused(format!(
        "--mgmt-kubeconfig {}: its user may not do what the sandbox does on {} (cluster-admin can); missing, cluster-wide: {}",
        cluster.kubeconfig.display(),
        cluster.url,
        missing.join(", ")
    )))
}

/// A Deployment that looks like the real HyperShift operator: `operator` in
/// `hypershift`, or any container image named hypershift.
fn hypershift_operator(deployments: &[Value]) -> Option<String> {
    deployments.iter().find_map(|d| {
        let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        let images = d["spec"]["template"]["spec"]["containers"].as_array().cloned().unwrap_or_default();
        let by_image = images.iter().any(|c| c["image"].as_str().is_some_and(|i| i.contains("hypershift")));
        ((ns == "hypershift" && name == "operator") || by_image).then(|| format!("{ns}/{name}"))
    })
}

/// Everything checked before the sandbox creates anything on `cluster`:
/// permissions, no HyperShift operator (unless `force`), no HostedCluster
/// `demo_ns/demo_name`.
pub async fn check(cluster: &External, force: bool, demo_ns: &str, demo_name: &str) -> Result<(), SandboxError> {
    check_permissions(cluster).await?;
    let deployments = api_for(&cluster.client, &json!({"apiVersion": "apps/v1", "kind": "Deployment"}))
        .list(&ListParams::default())
        .await
        .map_err(kube_err(format!("listing the Deployments of {}", cluster.url)))?;
    let deployments: Vec<Value> = deployments.items.iter().filter_map(|d| serde_json::to_value(d).ok()).collect();
    if let Some(found) = hypershift_operator(&deployments) {
        if !force {
            return Err(refused(format!(
                "{} ({}) runs a HyperShift operator (Deployment {found}): the simulated operator would fight it over every HostedCluster; use a cluster without HyperShift, or --force if you are sure",
                cluster.url,
                cluster.kubeconfig.display()
            )));
        }
        tracing::warn!(cluster = %cluster.url, deployment = %found, "a HyperShift operator runs there: going on because of --force");
    }
    let hc = hosted_clusters(&cluster.client, Some(demo_ns));
    match hc.get_opt(demo_name).await {
        Ok(Some(_)) => Err(refused(format!(
            "{} ({}) already has a HostedCluster {demo_ns}/{demo_name}, the name the sandbox's drill uses; nothing was touched",
            cluster.url,
            cluster.kubeconfig.display()
        ))),
        // 404: the object or the whole kind is absent (CRD not installed yet)
        Ok(None) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!("looking for HostedCluster {demo_ns}/{demo_name} on {}", cluster.url))(e)),
    }
}

/// Who runs the controller-manager's controllers on `cluster`: `wanted`
/// when given (`--controllers`), else [`Controllers::Cluster`] when a
/// kube-controller-manager runs there ([`running_controller_manager`]).
pub async fn controllers(cluster: &External, wanted: Option<Controllers>) -> Result<Controllers, SandboxError> {
    let running = running_controller_manager(cluster).await?;
    let chosen = match (wanted, &running) {
        (Some(w), _) => w,
        (None, Some(_)) => Controllers::Cluster,
        (None, None) => Controllers::Sandbox,
    };
    match (&running, chosen) {
        (Some(holder), Controllers::Cluster) => {
            tracing::info!(cluster = %cluster.url, %holder, "a kube-controller-manager runs there: the sandbox is a kubelet with its own Node")
        }
        (Some(holder), Controllers::Sandbox) => tracing::warn!(cluster = %cluster.url, %holder,
            "a kube-controller-manager runs there, yet --controllers sandbox: the sandbox's controllers will make pods beside it"),
        (None, Controllers::Cluster) => tracing::warn!(cluster = %cluster.url,
            "--controllers cluster, yet no kube-controller-manager Lease is renewed there: Deployments and StatefulSets will get no pods"),
        (None, Controllers::Sandbox) => {}
    }
    Ok(chosen)
}

/// How recently a controller-manager's leader Lease must have been renewed
/// for it to count as running.
const LEASE_FRESH: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// Whether a kube-controller-manager runs there: its leader-election Lease
/// `kube-system/kube-controller-manager`, renewed within [`LEASE_FRESH`].
/// Says who holds it and when it was renewed.
async fn running_controller_manager(cluster: &External) -> Result<Option<String>, SandboxError> {
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(cluster.client.clone(), "kube-system");
    let lease = leases
        .get_opt("kube-controller-manager")
        .await
        .map_err(kube_err(format!("reading Lease kube-system/kube-controller-manager on {}", cluster.url)))?;
    let Some(spec) = lease.and_then(|l| l.spec) else { return Ok(None) };
    let Some(renewed) = spec.renew_time.map(|t| t.0.as_second()) else { return Ok(None) };
    let age = chrono::TimeDelta::seconds(chrono::Utc::now().timestamp() - renewed);
    Ok(lease_fresh(age).then(|| {
        format!(
            "Lease kube-system/kube-controller-manager held by {}, renewed {}s ago",
            spec.holder_identity.as_deref().unwrap_or("?"),
            age.num_seconds().max(0)
        )
    }))
}

fn lease_fresh(age: chrono::TimeDelta) -> bool {
    age < LEASE_FRESH
}

fn hosted_clusters(client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
    let mut probe = json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster"});
    if let Some(ns) = ns {
        probe["metadata"] = json!({"namespace": ns});
    }
    api_for(client, &probe)
}

/// The CRDs of each file of `paths`, and of every `*.yaml` in each
/// directory of them and in its `platform/` subdirectory
/// ([`crate::crds::crd_files`]; multi-document files allowed).
pub fn crds_in(paths: &[PathBuf]) -> Result<Vec<Value>, SandboxError> {
    let mut crds = Vec::new();
    for given in paths {
        let files = if given.is_dir() {
            crate::crds::crd_files(given).map_err(|source| SandboxError::Io { path: given.clone(), source })?
        } else {
            vec![given.clone()]
        };
        for path in files {
            let text = std::fs::read_to_string(&path).map_err(|source| SandboxError::Io { path: path.clone(), source })?;
            let docs = crate::apiserver::yaml_documents(&text)
                .map_err(|e| SandboxError::Io { path: path.clone(), source: std::io::Error::other(e) })?;
            crds.extend(docs.into_iter().filter(|d| d["kind"] == "CustomResourceDefinition"));
        }
    }
    Ok(crds)
}

/// Record what `cluster` holds, then create each CRD of `crds` it lacks and
/// wait until every one is Established. A CRD already there is left as it is.
pub async fn prepare(
    cluster: &External,
    crds: &[Value],
    controllers: Controllers,
    webhook: Option<&crate::conversion_webhook::ConversionWebhook>,
) -> Result<Footprint, SandboxError> {
    let mut footprint = Footprint { controllers, ..Footprint::default() };
    let namespaces = Api::<Namespace>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kube_err(format!("listing the namespaces of {}", cluster.url)))?;
    footprint.preexisting_namespaces = namespaces.items.iter().filter_map(|n| n.metadata.name.clone()).collect();
    if let Ok(list) = hosted_clusters(&cluster.client, None).list(&ListParams::default()).await {
        footprint.preexisting_hosted_clusters = list.items.iter().map(key_of).collect();
    }
    let api = Api::<CustomResourceDefinition>::all(cluster.client.clone());
    for doc in crds {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if api.get_opt(&name).await.map_err(kube_err(format!("reading CRD {name} on {}", cluster.url)))?.is_some()
            || served(&cluster.client, doc).await
        {
            continue;
        }
        let mut doc = doc.clone();
        if let Some(webhook) = webhook.filter(|_| crate::conversion_webhook::converts(&doc)) {
            doc["spec"]["conversion"] = webhook.conversion();
        }
        let crd: CustomResourceDefinition = serde_json::from_value(doc)
            .map_err(|e| kube_err(format!("reading CRD {name}"))(kube::Error::SerdeError(e)))?;
        api.create(&PostParams { field_manager: Some("hcp-dr-sandbox".into()), ..Default::default() }, &crd)
            .await
            .map_err(kube_err(format!("creating CRD {name} on {}", cluster.url)))?;
        footprint.installed_crds.push(name);
    }
    for name in &footprint.installed_crds {
        let established = kube::runtime::wait::await_condition(api.clone(), name, kube::runtime::wait::conditions::is_crd_established());
        match tokio::time::timeout(ESTABLISH_TIMEOUT, established).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(SandboxError::Check(format!("waiting for CRD {name} to be Established on {}: {e}", cluster.url))),
            Err(_) => {
                return Err(SandboxError::Timeout {
                    what: format!("CRD {name} to be Established on {}", cluster.url),
                    seconds: ESTABLISH_TIMEOUT.as_secs(),
                });
            }
        }
    }
    {
        // after the CRDs: the VolumeSnapshotClass is one of theirs
        let needed = cluster_objects()
            .into_iter()
            .filter(|o| controllers == Controllers::Cluster || o["kind"] == "PriorityClass")
            .chain(csi_objects());
        for obj in needed {
            let api = api_for(&cluster.client, &obj);
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let kind = obj["kind"].as_str().unwrap_or_default().to_string();
            if api.get_opt(&name).await.map_err(kube_err(format!("reading {kind} {name} on {}", cluster.url)))?.is_some() {
                continue;
            }
            let dynamic: DynamicObject = serde_json::from_value(obj.clone())
                .map_err(|e| kube_err(format!("{kind} {name}"))(kube::Error::SerdeError(e)))?;
            api.create(&PostParams { field_manager: Some("hcp-dr-sandbox".into()), ..Default::default() }, &dynamic)
                .await
                .map_err(kube_err(format!("creating {kind} {name} on {}", cluster.url)))?;
            footprint.installed_objects.push(format!("{kind}/{name}"));
        }
    }
    Ok(footprint)
}

/// Whether the resource `crd` defines is served already without it (built
/// in, as the emulator serves Routes).
async fn served(client: &kube::Client, crd: &Value) -> bool {
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
    let Some(versions) = crd["spec"]["versions"].as_array() else { return false };
    for version in versions.iter().filter_map(|v| v["name"].as_str()) {
        if let Ok(list) = client.list_api_group_resources(&format!("{group}/{version}")).await
            && list.resources.iter().any(|r| r.name == plural)
        {
            return true;
        }
    }
    false
}

fn key_of(obj: &DynamicObject) -> String {
    format!("{}/{}", obj.metadata.namespace.as_deref().unwrap_or_default(), obj.metadata.name.as_deref().unwrap_or_default())
}

/// What [`remove`] did on one cluster.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Removal {
    pub removed: Vec<String>,
    /// Left on purpose, with the reason.
    pub left: Vec<String>,
}

/// Delete what the sandbox created on `client` (see the module docs), while
/// the simulated operator still runs (it takes the HostedClusters' finalizer
/// off once each is torn down), and wait until it is gone.
pub async fn remove(client: &kube::Client, url: &str, footprint: &Footprint) -> Result<Removal, SandboxError> {
    let mut removal = Removal::default();
    let start = Instant::now();
    // 1. the sandbox's HostedClusters; remember their namespaces
    let mut owned_ns: BTreeSet<String> = BTreeSet::new();
    let hcs = match hosted_clusters(client, None).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(kube_err(format!("listing the HostedClusters of {url}"))(e)),
    };
    for hc in &hcs {
        let key = key_of(hc);
        if footprint.preexisting_hosted_clusters.contains(&key) {
            removal.left.push(format!("HostedCluster {key} (there before the sandbox)"));
            continue;
        }
        let (ns, name) = key.split_once('/').unwrap_or_default();
        owned_ns.insert(ns.to_string());
        owned_ns.insert(crate::operator::hypershift::hcp_namespace(ns, name));
        match hosted_clusters(client, Some(ns)).delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting HostedCluster {key} on {url}"))(e)),
        }
        removal.removed.push(format!("HostedCluster {key}"));
    }
    wait_gone(&format!("the sandbox's HostedClusters on {url}"), start, || async {
        let list = hosted_clusters(client, None).list(&ListParams::default()).await;
        Ok(list.map(|l| l.items.iter().any(|hc| !footprint.preexisting_hosted_clusters.contains(&key_of(hc)))).unwrap_or(false))
    })
    .await?;
    // 2. namespaces created since up: the sandbox's hosted clusters' (and
    // `clusters`/`clusters-*`, where the drill and hcp-dr put them even after
    // a migration took the HostedCluster away); others are left
    let ns_api = Api::<Namespace>::all(client.clone());
    let namespaces = ns_api.list(&ListParams::default()).await.map_err(kube_err(format!("listing the namespaces of {url}")))?;
    let mut deleting = Vec::new();
    for ns in namespaces.items.iter().filter_map(|n| n.metadata.name.clone()) {
        if footprint.preexisting_namespaces.contains(&ns) {
            continue;
        }
        let ours = owned_ns.contains(&ns) || ns == "clusters" || ns.starts_with("clusters-");
        if !ours {
            removal.left.push(format!("Namespace {ns} (created after up, not by the sandbox's clusters)"));
            continue;
        }
        match ns_api.delete(&ns, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting Namespace {ns} on {url}"))(e)),
        }
        removal.removed.push(format!("Namespace {ns}"));
        deleting.push(ns);
    }
    wait_gone(&format!("namespaces {} on {url}", deleting.join(", ")), start, || async {
        let mut any = false;
        for ns in &deleting {
            any |= ns_api.get_opt(ns).await.map_err(kube_err(format!("reading Namespace {ns}")))?.is_some();
        }
        Ok(any)
    })
    .await?;
    // 3. the other cluster-scoped objects it installed (before the CRDs:
    // a VolumeSnapshotClass goes with its CRD)
    for object in &footprint.installed_objects {
        let Some((kind, name)) = object.split_once('/') else { continue };
        let api_version = match kind {
            "PriorityClass" => "scheduling.k8s.io/v1",
            "StorageClass" => "storage.k8s.io/v1",
            "VolumeSnapshotClass" => "snapshot.storage.k8s.io/v1",
            other => {
                removal.left.push(format!("{other} {name} (a kind this version of the sandbox does not remove)"));
                continue;
            }
        };
        let api = api_for(client, &json!({"apiVersion": api_version, "kind": kind}));
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => removal.removed.push(format!("{kind} {name}")),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting {kind} {name} on {url}"))(e)),
        }
    }
    // 4. the CRDs it installed
    let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
    for name in &footprint.installed_crds {
        match crd_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => removal.removed.push(format!("CustomResourceDefinition {name}")),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting CRD {name} on {url}"))(e)),
        }
    }
    wait_gone(&format!("the CRDs the sandbox installed on {url}"), start, || async {
        let mut any = false;
        for name in &footprint.installed_crds {
            any |= crd_api.get_opt(name).await.map_err(kube_err(format!("reading CRD {name}")))?.is_some();
        }
        Ok(any)
    })
    .await?;
    Ok(removal)
}

/// Poll `still_there` until it says false; [`REMOVE_TIMEOUT`] from `start`.
async fn wait_gone<F, Fut>(what: &str, start: Instant, mut still_there: F) -> Result<(), SandboxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, SandboxError>>,
{
    while still_there().await? {
        if start.elapsed() > REMOVE_TIMEOUT {
            return Err(SandboxError::Timeout { what: format!("{what} to be gone"), seconds: REMOVE_TIMEOUT.as_secs() });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hypershift_operator_is_found_by_name_or_image() {
        let d = |ns: &str, name: &str, image: &str| {
            json!({"metadata": {"namespace": ns, "name": name},
                   "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}})
        };
        assert_eq!(hypershift_operator(&[d("hypershift", "operator", "x")]), Some("hypershift/operator".into()));
        assert_eq!(
            hypershift_operator(&[d("ops", "hs", "quay.io/acm-d/hypershift-rhel9-operator:4.16")]),
            Some("ops/hs".into())
        );
        assert_eq!(hypershift_operator(&[d("hypershift", "web", "nginx"), d("default", "operator", "x")]), None);
    }

    #[test]
    fn only_a_recently_renewed_lease_means_a_running_controller_manager() {
        assert!(lease_fresh(chrono::TimeDelta::seconds(5)));
        assert!(lease_fresh(chrono::TimeDelta::seconds(-3)), "clock skew: renewed \"in the future\" is running");
        assert!(!lease_fresh(chrono::TimeDelta::seconds(61)));
        assert!(!lease_fresh(chrono::TimeDelta::hours(5)), "a stale Lease from a stopped controller-manager");
    }
}
