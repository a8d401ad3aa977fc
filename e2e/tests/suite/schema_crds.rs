//! The CRD schema compiler, defaulting, pruning, validation and CEL rules
//! against the real HyperShift and Cluster API CRDs
//! ([`hcp_dr_e2e::crds::real_crds`]: `$HCP_DR_CRDS` or `../shared/crds`
//! beside the repository). Each test prints `SKIP:` and returns when they are absent.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hcp_dr_e2e::apiserver::schema::{FieldError, FieldErrorKind, Schema};
use serde_json::{Value, json};

fn crd_dir() -> Option<PathBuf> {
    hcp_dr_e2e::crds::real_crds_or_skip("the schema checks against the real CRDs")
}

fn load(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn storage_schema(crd: &Value) -> &Value {
    crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["storage"] == json!(true)))
        .map(|v| &v["schema"]["openAPIV3Schema"])
        .expect("CRD has a storage version with a schema")
}

fn schema(file: &str) -> Option<Schema> {
    let dir = crd_dir()?;
    let crd = load(&dir.join(file));
    Some(Schema::compile(storage_schema(&crd)).expect("schema compiles"))
}

fn count_rules(v: &Value) -> usize {
    match v {
        Value::Object(m) => {
            m.get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
                + m.iter()
                    .filter(|(k, _)| k.as_str() != "x-kubernetes-validations")
                    .map(|(_, v)| count_rules(v))
                    .sum::<usize>()
        }
        Value::Array(items) => items.iter().map(count_rules).sum(),
        _ => 0,
    }
}

fn hosted_cluster() -> Value {
    json!({
        "apiVersion": "hypershift.openshift.io/v1beta1",
        "kind": "HostedCluster",
        "metadata": {"name": "demo", "namespace": "clusters"},
        "spec": {
            "release": {"image": "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64"},
            "pullSecret": {"name": "demo-pull-secret"},
            "platform": {"type": "None"},
            "services": [
                {"service": "APIServer", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}},
                {"service": "OAuthServer", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}},
                {"service": "Konnectivity", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}},
                {"service": "Ignition", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}}
            ]
        }
    })
}

/// Prune, default and validate as the server does on create.
fn admit(schema: &Schema, obj: &mut Value) -> Vec<FieldError> {
    schema.prune(obj);
    schema.apply_defaults(obj);
    schema.validate_create(obj)
}

fn admit_update(schema: &Schema, old: &Value, new: &mut Value) -> Vec<FieldError> {
    schema.prune(new);
    schema.apply_defaults(new);
    schema.validate_update(old, new)
}

fn messages(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(FieldError::message).collect()
}

#[test]
fn every_crd_compiles_and_rules_are_counted() {
    let Some(dir) = crd_dir() else { return };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read crd dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let (mut total, mut skipped_total) = (0, 0);
    let mut all_skipped = Vec::new();
    for path in &files {
        let crd = load(path);
        for version in crd["spec"]["versions"].as_array().expect("versions") {
            let Some(s) = version.pointer("/schema/openAPIV3Schema") else {
                continue;
            };
            let started = Instant::now();
            let compiled = Schema::compile(s).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let elapsed = started.elapsed();
            let rules = count_rules(s);
            let skipped: Vec<String> = compiled
                .skipped_rules()
                .into_iter()
                .filter(|r| !r.contains(": pattern "))
                .collect();
            total += rules;
            skipped_total += skipped.len();
            eprintln!(
                "{} {}: {} rules, {} compiled, {} skipped, compile {:?}",
                path.file_name().and_then(|f| f.to_str()).unwrap_or("?"),
                version["name"].as_str().unwrap_or("?"),
                rules,
                rules - skipped.len(),
                skipped.len(),
                elapsed
            );
            all_skipped.extend(skipped);
        }
    }
    eprintln!(
        "TOTAL: {total} rules, {} compiled, {skipped_total} skipped",
        total - skipped_total
    );
    for s in &all_skipped {
        eprintln!("  skipped {s}");
    }
    assert!(
        total > 500,
        "expected the real CRDs' ~550 rules, found {total}"
    );
    // Every rule on the DR path must be enforced.
    for s in &all_skipped {
        for dr in ["spec.pausedUntil", "spec.etcd", "<root>"] {
            assert!(!s.starts_with(dr), "a DR-path rule was skipped: {s}");
        }
        assert!(
            !s.starts_with("spec: "),
            "a spec-level rule was skipped: {s}"
        );
    }
}

#[test]
fn a_minimal_hosted_cluster_is_valid_and_defaulted() {
    let Some(schema) = schema("hostedclusters-Hypershift-Default.crd.yaml") else {
        return;
    };
    let mut hc = hosted_cluster();
    let errs = admit(&schema, &mut hc);
    assert!(errs.is_empty(), "{:#?}", messages(&errs));
    // Defaults from the CRD: etcd, networking, availability policies.
    assert_eq!(hc["spec"]["etcd"]["managementType"], "Managed");
    assert_eq!(
        hc["spec"]["etcd"]["managed"]["storage"]["persistentVolume"]["size"],
        "8Gi"
    );
    assert_eq!(
        hc["spec"]["controllerAvailabilityPolicy"],
        "HighlyAvailable"
    );
    assert_eq!(hc["spec"]["networking"]["networkType"], "OVNKubernetes");
    assert_eq!(
        hc["metadata"],
        json!({"name": "demo", "namespace": "clusters"})
    );
}

#[test]
fn unknown_fields_are_pruned_with_their_paths() {
    let Some(schema) = schema("hostedclusters-Hypershift-Default.crd.yaml") else {
        return;
    };
    let mut hc = hosted_cluster();
    hc["spec"]["bogus"] = json!(1);
    hc["spec"]["services"][1]["servicePublishingStrategy"]["extra"] = json!("x");
    hc["status"] = json!({"unknownStatusField": true});
    hc["metadata"]["annotations"] = json!({"kept": "yes"});
    let mut removed = schema.prune(&mut hc);
    removed.sort();
    assert_eq!(
        removed,
        [
            "spec.bogus",
            "spec.services[1].servicePublishingStrategy.extra",
            "status.unknownStatusField"
        ]
    );
    assert!(hc["spec"].get("bogus").is_none());
    assert_eq!(hc["metadata"]["annotations"]["kept"], "yes");
    assert_eq!(hc["kind"], "HostedCluster");
}

#[test]
fn paused_until_accepts_dates_and_booleans_only() {
    let Some(schema) = schema("hostedclusters-Hypershift-Default.crd.yaml") else {
        return;
    };
    for ok in ["2026-11-21T20:00:00Z", "true", "True", "false"] {
        let mut hc = hosted_cluster();
        hc["spec"]["pausedUntil"] = json!(ok);
        let errs = admit(&schema, &mut hc);
        assert!(errs.is_empty(), "{ok}: {:#?}", messages(&errs));
    }
    let mut hc = hosted_cluster();
    hc["spec"]["pausedUntil"] = json!("soon");
    let errs = admit(&schema, &mut hc);
    assert_eq!(
        messages(&errs),
        [
            "spec.pausedUntil: Invalid value: \"string\": PausedUntil must be a date in RFC3339 format or 'True', 'true', 'False' or 'false'"
        ]
    );
    assert_eq!(errs[0].kind, FieldErrorKind::Invalid);
    assert_eq!(errs[0].kind.reason(), "FieldValueInvalid");
}

#[test]
fn restore_snapshot_url_rules() {
    let Some(schema) = schema("hostedclusters-Hypershift-Default.crd.yaml") else {
        return;
    };
    let with_urls = |urls: Value| {
        let mut hc = hosted_cluster();
        hc["spec"]["etcd"] = json!({
            "managementType": "Managed",
            "managed": {"storage": {"type": "PersistentVolume", "persistentVolume": {"size": "8Gi"}, "restoreSnapshotURL": urls}}
        });
        hc
    };
    let field = "spec.etcd.managed.storage.restoreSnapshotURL";

    let mut one = with_urls(json!([
        "https://bucket.s3.amazonaws.com/snap.db?X-Amz-Signature=abc"
    ]));
    let errs = admit(&schema, &mut one);
    assert!(errs.is_empty(), "{:#?}", messages(&errs));
    let mut s3 = with_urls(json!(["s3://bucket/snap.db"]));
    assert!(admit(&schema, &mut s3).is_empty());

    let mut two = with_urls(json!(["https://a/1", "https://a/2"]));
    let msgs = messages(&admit(&schema, &mut two));
    assert!(
        msgs.contains(&format!("{field}: Too many: 2: must have at most 1 items")),
        "{msgs:#?}"
    );
    assert!(
        msgs.contains(&format!("{field}: Invalid value: \"array\": RestoreSnapshotURL shouldn't contain more than 1 entry")),
        "{msgs:#?}"
    );

    let mut ftp = with_urls(json!(["ftp://a/1"]));
    assert_eq!(
        messages(&admit(&schema, &mut ftp)),
        [format!(
            "{field}: Invalid value: \"array\": restoreSnapshotURL must be a valid URL with scheme https or s3"
        )]
    );

    // Updates: changing, adding or removing the URL is rejected; keeping it is fine.
    let mut old = with_urls(json!(["https://a/1"]));
    assert!(admit(&schema, &mut old).is_empty());
    let mut same = old.clone();
    same["spec"]["pausedUntil"] = json!("true");
    let errs = admit_update(&schema, &old, &mut same);
    assert!(errs.is_empty(), "{:#?}", messages(&errs));

    let mut changed = with_urls(json!(["https://a/2"]));
    assert_eq!(
        messages(&admit_update(&schema, &old, &mut changed)),
        [format!(
            "{field}: Invalid value: \"array\": restoreSnapshotURL is immutable"
        )]
    );

    let mut removed = hosted_cluster();
    let msgs = messages(&admit_update(&schema, &old, &mut removed));
    assert_eq!(
        msgs,
        [
            "spec.etcd.managed.storage: Invalid value: \"object\": restoreSnapshotURL cannot be added or removed after creation"
        ]
    );

    let mut plain = hosted_cluster();
    assert!(admit(&schema, &mut plain).is_empty());
    let mut added = with_urls(json!(["https://a/1"]));
    let msgs = messages(&admit_update(&schema, &plain, &mut added));
    assert_eq!(
        msgs,
        [
            "spec.etcd.managed.storage: Invalid value: \"object\": restoreSnapshotURL cannot be added or removed after creation"
        ]
    );
}

#[test]
fn required_fields_and_enums_use_upstream_messages() {
    let Some(schema) = schema("hostedclusters-Hypershift-Default.crd.yaml") else {
        return;
    };
    let mut hc = hosted_cluster();
    hc["spec"].as_object_mut().expect("spec").remove("release");
    hc["spec"]["platform"]["type"] = json!("Nope");
    let errs = admit(&schema, &mut hc);
    let msgs = messages(&errs);
    assert!(
        msgs.contains(&"spec.release: Required value".to_string()),
        "{msgs:#?}"
    );
    let platform = msgs.iter().find(|m| {
        m.starts_with("spec.platform.type: Unsupported value: \"Nope\": supported values: ")
    });
    assert!(
        platform.is_some_and(|m| m.contains("\"AWS\"") && m.contains("\"None\"")),
        "{msgs:#?}"
    );
    let kinds: Vec<FieldErrorKind> = errs.iter().map(|e| e.kind).collect();
    assert!(
        kinds.contains(&FieldErrorKind::Required) && kinds.contains(&FieldErrorKind::NotSupported)
    );
}

#[test]
fn node_pool_enum_and_pause_rules() {
    let Some(schema) = schema("nodepools-Default.crd.yaml") else {
        return;
    };
    let node_pool = || {
        json!({
            "apiVersion": "hypershift.openshift.io/v1beta1",
            "kind": "NodePool",
            "metadata": {"name": "demo-workers", "namespace": "clusters"},
            "spec": {
                "clusterName": "demo",
                "replicas": 2,
                "management": {"upgradeType": "Replace"},
                "platform": {"type": "None"},
                "release": {"image": "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64"}
            }
        })
    };
    let mut np = node_pool();
    let errs = admit(&schema, &mut np);
    assert!(errs.is_empty(), "{:#?}", messages(&errs));

    let mut bad = node_pool();
    bad["spec"]["management"]["upgradeType"] = json!("Sideways");
    let msgs = messages(&admit(&schema, &mut bad));
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].starts_with(
            "spec.management.upgradeType: Unsupported value: \"Sideways\": supported values: "
        ),
        "{msgs:#?}"
    );

    let mut soon = node_pool();
    soon["spec"]["pausedUntil"] = json!("soon");
    let msgs = messages(&admit(&schema, &mut soon));
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].starts_with("spec.pausedUntil: Invalid value: \"string\": "),
        "{msgs:#?}"
    );

    // clusterName is immutable.
    let mut old = node_pool();
    assert!(admit(&schema, &mut old).is_empty());
    let mut renamed = node_pool();
    renamed["spec"]["clusterName"] = json!("other");
    let msgs = messages(&admit_update(&schema, &old, &mut renamed));
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].starts_with("spec.clusterName: Invalid value: \"string\": "),
        "{msgs:#?}"
    );
}

/// A HostedCluster as `hypershift create cluster aws` renders it: every
/// rule on this richer object must pass (no false positives from the CEL
/// interpreter), and a round of updates that keep immutable fields must too.
#[test]
fn a_rendered_aws_hosted_cluster_is_valid() {
    let Some(schema) = schema("hostedclusters-Hypershift-Default.crd.yaml") else {
        return;
    };
    let route = |host: &str| json!({"type": "Route", "route": {"hostname": host}});
    let role = |name: &str| format!("arn:aws:iam::123456789012:role/demo-{name}");
    let mut hc = json!({
        "apiVersion": "hypershift.openshift.io/v1beta1",
        "kind": "HostedCluster",
        "metadata": {"name": "demo", "namespace": "clusters"},
        "spec": {
            "release": {"image": "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64"},
            "pullSecret": {"name": "demo-pull-secret"},
            "sshKey": {"name": "demo-ssh-key"},
            "infraID": "demo-x7k2p",
            "clusterID": "0f6a1e58-7f3c-4d0b-9b5e-2a1c3d4e5f60",
            "issuerURL": "https://demo-oidc.s3.us-east-1.amazonaws.com/demo-x7k2p",
            "fips": false,
            "controllerAvailabilityPolicy": "HighlyAvailable",
            "infrastructureAvailabilityPolicy": "HighlyAvailable",
            "pausedUntil": "2026-11-21T20:00:00Z",
            "dns": {"baseDomain": "example.com", "publicZoneID": "Z0123456789ABCDEFGHIJ", "privateZoneID": "Z9876543210ABCDEFGHIJ"},
            "networking": {
                "networkType": "OVNKubernetes",
                "clusterNetwork": [{"cidr": "10.132.0.0/14"}],
                "serviceNetwork": [{"cidr": "172.31.0.0/16"}],
                "machineNetwork": [{"cidr": "10.0.0.0/16"}]
            },
            "secretEncryption": {"type": "aescbc", "aescbc": {"activeKey": {"name": "demo-etcd-encryption-key"}}},
            "etcd": {"managementType": "Managed", "managed": {"storage": {"type": "PersistentVolume",
                "persistentVolume": {"size": "8Gi", "storageClassName": "gp3-csi"},
                "restoreSnapshotURL": ["https://demo-backups.s3.amazonaws.com/demo/snapshot.db?X-Amz-Expires=3600"]}}},
            "platform": {"type": "AWS", "aws": {
                "region": "us-east-1",
                "endpointAccess": "Public",
                "cloudProviderConfig": {"vpc": "vpc-0123456789abcdef0", "zone": "us-east-1a", "subnet": {"id": "subnet-0123456789abcdef0"}},
                "resourceTags": [{"key": "kubernetes.io/cluster/demo-x7k2p", "value": "owned"}],
                "rolesRef": {
                    "ingressARN": role("ingress"),
                    "imageRegistryARN": role("image-registry"),
                    "storageARN": role("aws-ebs-csi-driver-controller"),
                    "networkARN": role("cloud-network-config-controller"),
                    "kubeCloudControllerARN": role("cloud-controller"),
                    "nodePoolManagementARN": role("node-pool"),
                    "controlPlaneOperatorARN": role("control-plane-operator")
                }
            }},
            "services": [
                {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer"}},
                {"service": "OAuthServer", "servicePublishingStrategy": route("oauth.demo.example.com")},
                {"service": "Konnectivity", "servicePublishingStrategy": route("konnectivity.demo.example.com")},
                {"service": "Ignition", "servicePublishingStrategy": route("ignition.demo.example.com")}
            ]
        }
    });
    let errs = admit(&schema, &mut hc);
    assert!(errs.is_empty(), "{:#?}", messages(&errs));
    // Lift the pause and change the release: allowed; identity fields stay.
    let mut next = hc.clone();
    next["spec"]["pausedUntil"] = json!("false");
    next["spec"]["release"]["image"] =
        json!("quay.io/openshift-release-dev/ocp-release:4.17.1-x86_64");
    let errs = admit_update(&schema, &hc, &mut next);
    assert!(errs.is_empty(), "{:#?}", messages(&errs));
    // Dropping secretEncryption or infraID once set is refused by the real rules.
    let mut dropped = next.clone();
    dropped["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("secretEncryption");
    dropped["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("infraID");
    let msgs = messages(&admit_update(&schema, &next, &mut dropped));
    assert!(
        msgs.iter().any(|m| m
            .starts_with("spec: Invalid value: \"object\": secretEncryption cannot be removed")),
        "{msgs:#?}"
    );
    // Root-level rules report on the nil path, printed `<nil>` as upstream does.
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("<nil>: Invalid value: \"object\": ") && m.contains("infraID")),
        "{msgs:#?}"
    );
}

/// The HostedControlPlane carries the same restoreSnapshotURL rules (it is
/// replayed before the HostedCluster on restore).
#[test]
fn hosted_control_plane_restore_snapshot_url_rules() {
    let Some(schema) = schema("hostedcontrolplanes-Hypershift-Default.crd.yaml") else {
        return;
    };
    let hcp = |urls: Option<Value>| {
        let mut storage = json!({"type": "PersistentVolume", "persistentVolume": {"size": "8Gi"}});
        if let Some(urls) = urls {
            storage["restoreSnapshotURL"] = urls;
        }
        json!({
            "apiVersion": "hypershift.openshift.io/v1beta1",
            "kind": "HostedControlPlane",
            "metadata": {"name": "demo", "namespace": "clusters-demo"},
            "spec": {
                "releaseImage": "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64",
                "pullSecret": {"name": "pull-secret"},
                "sshKey": {"name": "ssh-key"},
                "infraID": "demo-x7k2p",
                "issuerURL": "https://kubernetes.default.svc",
                "dns": {"baseDomain": "example.com"},
                "platform": {"type": "None"},
                "etcd": {"managementType": "Managed", "managed": {"storage": storage}},
                "services": [
                    {"service": "APIServer", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}},
                    {"service": "OAuthServer", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}},
                    {"service": "Konnectivity", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}},
                    {"service": "Ignition", "servicePublishingStrategy": {"type": "NodePort", "nodePort": {"address": "10.0.0.10"}}}
                ]
            }
        })
    };
    let mut old = hcp(Some(json!(["s3://bucket/demo/snapshot.db"])));
    let errs = admit(&schema, &mut old);
    assert!(errs.is_empty(), "{:#?}", messages(&errs));
    let mut ftp = hcp(Some(json!(["ftp://bucket/snapshot.db"])));
    let msgs = messages(&admit(&schema, &mut ftp));
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].ends_with("restoreSnapshotURL must be a valid URL with scheme https or s3"),
        "{msgs:#?}"
    );
    let mut changed = hcp(Some(json!(["s3://bucket/demo/other.db"])));
    let msgs = messages(&admit_update(&schema, &old, &mut changed));
    assert_eq!(
        msgs,
        [
            "spec.etcd.managed.storage.restoreSnapshotURL: Invalid value: \"array\": restoreSnapshotURL is immutable"
        ]
    );
    let mut removed = hcp(None);
    let msgs = messages(&admit_update(&schema, &old, &mut removed));
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].ends_with("restoreSnapshotURL cannot be added or removed after creation"),
        "{msgs:#?}"
    );
}

/// The storage schema of a CRD of the `platform/` subdirectory.
fn platform_schema(file: &str) -> Option<Schema> {
    let dir = crd_dir()?.join(hcp_dr_e2e::crds::PLATFORM_DIR);
    let crd = load(&dir.join(file));
    Some(Schema::compile(storage_schema(&crd)).expect("schema compiles"))
}

/// Pruned nothing, and valid.
fn admitted_whole(schema: &Schema, obj: &mut Value) {
    let pruned = schema.prune(obj);
    assert!(pruned.is_empty(), "unknown fields {pruned:?} in {obj:#}");
    schema.apply_defaults(obj);
    let errs = schema.validate_create(obj);
    assert!(errs.is_empty(), "{:#?}\n{obj:#}", messages(&errs));
}

#[test]
fn every_platform_crd_compiles() {
    let Some(dir) = crd_dir() else { return };
    let files = hcp_dr_e2e::crds::yaml_files(&dir.join(hcp_dr_e2e::crds::PLATFORM_DIR))
        .expect("the platform CRDs");
    assert!(files.len() >= 4, "{files:?}");
    for path in &files {
        let crd = load(path);
        for version in crd["spec"]["versions"].as_array().expect("versions") {
            if let Some(s) = version.pointer("/schema/openAPIV3Schema") {
                Schema::compile(s).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
    }
}

#[test]
fn the_agent_inventory_and_the_simulated_statuses_pass_the_platform_schemas() {
    use hcp_dr_e2e::operator::agent::{agent_name, agent_status, provisioned_status};
    let (Some(bmh_schema), Some(agent_schema), Some(infraenv_schema), Some(nmstate_schema)) = (
        platform_schema("metal3.io_baremetalhosts.yaml"),
        platform_schema("agent-install.openshift.io_agents.yaml"),
        platform_schema("agent-install.openshift.io_infraenvs.yaml"),
        platform_schema("agent-install.openshift.io_nmstateconfigs.yaml"),
    ) else {
        return;
    };
    let inventory = hcp_dr_e2e::sandbox::agent_inventory("hardware", "rack-a", 3);
    let of_kind = |kind: &str| -> Vec<Value> {
        inventory
            .iter()
            .filter(|o| o["kind"] == kind)
            .cloned()
            .collect()
    };
    for mut infraenv in of_kind("InfraEnv") {
        admitted_whole(&infraenv_schema, &mut infraenv);
    }
    let nmstate = of_kind("NMStateConfig");
    assert_eq!(nmstate.len(), 3);
    for mut config in nmstate {
        admitted_whole(&nmstate_schema, &mut config);
    }
    let hosts = of_kind("BareMetalHost");
    assert_eq!(hosts.len(), 3);
    for host in hosts {
        let mut bmh = host.clone();
        admitted_whole(&bmh_schema, &mut bmh);
        bmh["status"] = provisioned_status(&host);
        admitted_whole(&bmh_schema, &mut bmh);
        let mac = host["spec"]["bootMACAddress"].as_str().expect("boot MAC");
        let mut agent = json!({
            "apiVersion": "agent-install.openshift.io/v1beta1", "kind": "Agent",
            "metadata": {"name": agent_name(mac), "namespace": "hardware"},
            "spec": {"approved": true, "role": "", "hostname": host["metadata"]["name"],
                     "clusterDeploymentName": {"name": "echo", "namespace": "clusters-echo"}},
            "status": agent_status(&host, None),
        });
        admitted_whole(&agent_schema, &mut agent);
    }
    let Some(machine_schema) =
        schema("capi-provider.agent-install.openshift.io_agentmachines.yaml")
    else {
        return;
    };
    let mut machine = json!({
        "apiVersion": "capi-provider.agent-install.openshift.io/v1beta1", "kind": "AgentMachine",
        "metadata": {"name": "echo-workers-abcde-fghij", "namespace": "clusters-echo"},
        "spec": {},
        "status": {"agentRef": {"namespace": "hardware", "name": "x"},
                   "addresses": [{"type": "InternalDNS", "address": "rack-a-host-0"}]},
    });
    admitted_whole(&machine_schema, &mut machine);
}
