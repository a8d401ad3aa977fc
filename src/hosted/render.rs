//! The objects of a new hosted cluster, as `hcp create cluster --render`
//! gives them: the pull-secret Secret, a freshly generated etcd encryption
//! key Secret, the ssh key Secret, the HostedCluster and its NodePool,
//! shaped to pass the real CRD schemas. Every service is published under a
//! fixed hostname, so the cluster can later be migrated.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

/// The platforms `cluster create` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    None,
    Agent,
    Kubevirt,
    Aws,
}

/// AWS needs a region and the IAM roles HyperShift's components assume.
#[derive(Debug, Clone)]
pub struct AwsSpec {
    pub region: String,
    /// `arn:aws:iam::<account>:role/<prefix>`; each component's role is
    /// `<prefix>-<component>` (as `hcp create iam aws` names them).
    pub role_arn_prefix: String,
    /// The subnet the NodePool's machines go in.
    pub subnet_id: String,
    /// The HyperShift operator's OIDC bucket, as a URL
    /// (`https://<bucket>.s3.<region>.amazonaws.com`): the cluster's
    /// `spec.issuerURL` is `<it>/<infraID>`, as `hcp create iam aws` makes it.
    pub oidc_bucket_url: String,
}

/// A new hosted cluster.
#[derive(Debug, Clone)]
pub struct NewCluster {
    pub name: String,
    pub namespace: String,
    pub platform: Platform,
    pub release_image: String,
    /// The pull secret's content (a docker config JSON).
    pub pull_secret: Vec<u8>,
    pub ssh_public_key: Option<String>,
    pub base_domain: String,
    pub node_pool_replicas: i64,
    /// `SingleReplica` or `HighlyAvailable`.
    pub availability: String,
    pub aws: Option<AwsSpec>,
    /// `spec.platform.agent.agentNamespace` (Agent; None: `<namespace>-<name>-agents`).
    pub agent_namespace: Option<String>,
    /// `spec.nodeSelector`: HyperShift puts every control-plane pod (and
    /// hcp-dr its data movers) on management nodes with these labels.
    pub node_selector: std::collections::BTreeMap<String, String>,
    /// `spec.tolerations`: added to every control-plane pod (and data mover).
    pub tolerations: Vec<Value>,
    /// `spec.etcd.managed.storage.persistentVolume.storageClassName`
    /// (None: the management cluster's default class).
    pub etcd_storage_class: Option<String>,
}

/// A label for `--node-selector`: `KEY=VALUE`, each part as Kubernetes
/// label syntax allows (a key may have a DNS prefix: `example.com/role`).
pub fn parse_node_selector(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: give KEY=VALUE, e.g. hypershift.openshift.io/control-plane=true"))?;
    check_label_key(key).map_err(|e| format!("`{text}`: {e}"))?;
    let value_ok = value.len() <= 63
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && (value.is_empty() || (value.starts_with(|c: char| c.is_ascii_alphanumeric()) && value.ends_with(|c: char| c.is_ascii_alphanumeric())));
    if !value_ok {
        return Err(format!("`{text}`: the value `{value}` is not a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"));
    }
    Ok((key.to_string(), value.to_string()))
}

fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty() && p.len() <= 253 && p.split('.').all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
    });
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(format!("the key `{key}` is not a label key ([DNS-prefix/]name, the name at most 63 letters, digits, '-', '_' or '.')"))
    }
}

/// A toleration for `--toleration`, in the HyperShift CLI's form:
/// `key=K[,value=V][,operator=Equal|Exists][,effect=NoSchedule|PreferNoSchedule|NoExecute][,tolerationSeconds=N]`.
pub fn parse_toleration(text: &str) -> Result<Value, String> {
    let mut t = serde_json::Map::new();
    for part in text.split(',') {
        let (field, value) = part
            .split_once('=')
            .ok_or_else(|| format!("`{text}`: `{part}` is not FIELD=VALUE; give e.g. key=dedicated,value=hcp,effect=NoSchedule"))?;
        let value = match field {
            "key" => {
                check_label_key(value).map_err(|e| format!("`{text}`: {e}"))?;
                json!(value)
            }
            "value" => json!(value),
            "operator" if matches!(value, "Equal" | "Exists") => json!(value),
            "operator" => return Err(format!("`{text}`: operator `{value}`: use Equal or Exists")),
            "effect" if matches!(value, "NoSchedule" | "PreferNoSchedule" | "NoExecute") => json!(value),
            "effect" => return Err(format!("`{text}`: effect `{value}`: use NoSchedule, PreferNoSchedule or NoExecute")),
            "tolerationSeconds" => json!(value.parse::<i64>().map_err(|_| format!("`{text}`: tolerationSeconds `{value}` is not a number of seconds"))?),
            other => return Err(format!("`{text}`: unknown field `{other}`: use key, value, operator, effect, tolerationSeconds")),
        };
        if t.insert(field.to_string(), value).is_some() {
            return Err(format!("`{text}`: `{field}` given twice"));
        }
    }
    let exists = t.get("operator").and_then(Value::as_str) == Some("Exists");
    if !t.contains_key("key") && !exists {
        return Err(format!("`{text}`: give a key (only operator=Exists may leave it out, to tolerate every taint)"));
    }
    if exists && t.contains_key("value") {
        return Err(format!("`{text}`: operator=Exists takes no value"));
    }
    if t.contains_key("tolerationSeconds") && t.get("effect").and_then(Value::as_str) != Some("NoExecute") {
        return Err(format!("`{text}`: tolerationSeconds applies to effect=NoExecute only"));
    }
    Ok(Value::Object(t))
}

impl NewCluster {
    /// Where an Agent-platform cluster's hosts live.
    pub fn agent_namespace(&self) -> String {
        self.agent_namespace.clone().unwrap_or_else(|| format!("{}-{}-agents", self.namespace, self.name))
    }
}

fn secret(name: &str, namespace: &str, kind: &str, key: &str, value: Vec<u8>) -> Result<Value, String> {
    let mut s = Secret::default();
    s.metadata.name = Some(name.to_string());
    s.metadata.namespace = Some(namespace.to_string());
    s.type_ = Some(kind.to_string());
    s.data = Some([(key.to_string(), ByteString(value))].into_iter().collect());
    let mut v = serde_json::to_value(s).map_err(|e| e.to_string())?;
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("Secret");
    Ok(v)
}

/// 32 bytes from the kernel's CSPRNG: the AES-CBC key of etcd encryption.
pub(crate) fn random_key() -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut key = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| format!("reading /dev/urandom for the etcd encryption key: {e}"))?;
    Ok(key)
}

/// Five random lowercase letters and digits, as HyperShift suffixes an infraID.
fn infra_suffix() -> Result<String, String> {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    Ok(random_key()?.iter().take(5).map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect())
}

/// Check the input; the message says what to fix.
pub fn check(c: &NewCluster) -> Result<(), String> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 53
            && s.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
            && s.starts_with(|ch: char| ch.is_ascii_lowercase())
            && !s.ends_with('-')
    };
    if !name_ok(&c.name) {
        return Err(format!("--name `{}`: a cluster name is 1-53 lowercase letters, digits and '-', starting with a letter", c.name));
    }
    if !matches!(c.availability.as_str(), "SingleReplica" | "HighlyAvailable") {
        return Err(format!("--availability `{}`: use SingleReplica or HighlyAvailable", c.availability));
    }
    if c.node_pool_replicas < 0 {
        return Err("--node-pool-replicas cannot be negative".into());
    }
    let pull: Value = serde_json::from_slice(&c.pull_secret)
        .map_err(|e| format!("--pull-secret is not a docker config JSON ({e}); download it from console.redhat.com"))?;
    if !pull["auths"].is_object() {
        return Err("--pull-secret has no \"auths\" object: is it a docker config JSON?".into());
    }
    if c.platform == Platform::Aws && c.aws.is_none() {
        return Err("--platform aws needs --aws-region, --aws-role-arn-prefix (the roles `hcp create iam aws` made), --aws-subnet-id and --aws-oidc-bucket-url".into());
    }
    if let Some(aws) = c.aws.as_ref().filter(|a| !a.oidc_bucket_url.starts_with("https://")) {
        return Err(format!("--aws-oidc-bucket-url `{}` must be an https:// URL (AWS STS only trusts https issuers), e.g. https://<oidc-bucket>.s3.<region>.amazonaws.com", aws.oidc_bucket_url));
    }
    if c.base_domain.is_empty() || !c.base_domain.contains('.') {
        return Err(format!("--base-domain `{}`: give the DNS domain the cluster's names live under, e.g. example.com", c.base_domain));
    }
    Ok(())
}

/// The objects, in apply order (secrets first).
pub fn objects(c: &NewCluster) -> Result<Vec<Value>, String> {
    check(c)?;
    let (name, ns) = (&c.name, &c.namespace);
    let mut out = vec![
        secret(&format!("{name}-pull-secret"), ns, "kubernetes.io/dockerconfigjson", ".dockerconfigjson", c.pull_secret.clone())?,
        secret(&format!("{name}-etcd-encryption-key"), ns, "Opaque", "key", random_key()?)?,
    ];
    if let Some(key) = &c.ssh_public_key {
        out.push(secret(&format!("{name}-ssh-key"), ns, "Opaque", "id_rsa.pub", key.trim().as_bytes().to_vec())?);
    }
    let host = |service: &str| format!("{service}.{name}.{}", c.base_domain);
    let route = |service: &str, prefix: &str| json!({"service": service, "servicePublishingStrategy": {"type": "Route", "route": {"hostname": host(prefix)}}});
    let api = match c.platform {
        Platform::Aws => json!({"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer", "loadBalancer": {"hostname": host("api")}}}),
        _ => route("APIServer", "api"),
    };
    let (hc_platform, np_platform) = match c.platform {
        Platform::None => (json!({"type": "None"}), json!({"type": "None"})),
        Platform::Agent => (json!({"type": "Agent", "agent": {"agentNamespace": c.agent_namespace()}}), json!({"type": "Agent", "agent": {}})),
        Platform::Kubevirt => (
            json!({"type": "KubeVirt", "kubevirt": {"baseDomainPassthrough": true}}),
            json!({"type": "KubeVirt", "kubevirt": {"compute": {"cores": 2, "memory": "8Gi"},
                   "rootVolume": {"type": "Persistent", "persistent": {"size": "32Gi"}}}}),
        ),
        Platform::Aws => {
            let aws = c.aws.as_ref().ok_or("AWS settings missing")?;
            let role = |component: &str| format!("{}-{component}", aws.role_arn_prefix);
            (
                json!({"type": "AWS", "aws": {
                    "region": aws.region,
                    "endpointAccess": "Public",
                    "rolesRef": {
                        "ingressARN": role("openshift-ingress"),
                        "imageRegistryARN": role("openshift-image-registry"),
                        "storageARN": role("aws-ebs-csi-driver-controller"),
                        "networkARN": role("cloud-network-config-controller"),
                        "kubeCloudControllerARN": role("cloud-controller"),
                        "nodePoolManagementARN": role("node-pool"),
                        "controlPlaneOperatorARN": role("control-plane-operator"),
                    }}}),
                json!({"type": "AWS", "aws": {"instanceType": "m5.xlarge", "subnet": {"id": aws.subnet_id}, "rootVolume": {"size": 120, "type": "gp3"}}}),
            )
        }
    };
    let mut spec = json!({
        "release": {"image": c.release_image},
        "pullSecret": {"name": format!("{name}-pull-secret")},
        "secretEncryption": {"type": "aescbc", "aescbc": {"activeKey": {"name": format!("{name}-etcd-encryption-key")}}},
        "controllerAvailabilityPolicy": c.availability,
        "infrastructureAvailabilityPolicy": "SingleReplica",
        "dns": {"baseDomain": c.base_domain},
        "etcd": {"managementType": "Managed", "managed": {"storage": {"type": "PersistentVolume", "persistentVolume": {"size": "8Gi"}}}},
        "networking": {"networkType": "OVNKubernetes", "clusterNetwork": [{"cidr": "10.132.0.0/14"}], "serviceNetwork": [{"cidr": "172.31.0.0/16"}]},
        "platform": hc_platform,
        "services": [api, route("OAuthServer", "oauth"), route("Konnectivity", "konnectivity"), route("Ignition", "ignition")],
    });
    if let Some(class) = &c.etcd_storage_class {
        spec["etcd"]["managed"]["storage"]["persistentVolume"]["storageClassName"] = json!(class);
    }
    if let Some(aws) = c.aws.as_ref().filter(|_| c.platform == Platform::Aws) {
        // the issuer names the infraID, so both are chosen here (as `hcp create cluster aws` does)
        let infra_id = format!("{name}-{}", infra_suffix()?);
        spec["issuerURL"] = json!(format!("{}/{infra_id}", aws.oidc_bucket_url.trim_end_matches('/')));
        spec["infraID"] = json!(infra_id);
    }
    if c.ssh_public_key.is_some() {
        spec["sshKey"] = json!({"name": format!("{name}-ssh-key")});
    }
    if !c.node_selector.is_empty() {
        spec["nodeSelector"] = json!(c.node_selector);
    }
    if !c.tolerations.is_empty() {
        spec["tolerations"] = json!(c.tolerations);
    }
    out.push(json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": name, "namespace": ns}, "spec": spec}));
    out.push(json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool",
        "metadata": {"name": format!("{name}-workers"), "namespace": ns},
        "spec": {"clusterName": name, "replicas": c.node_pool_replicas, "management": {"upgradeType": "Replace"},
                 "platform": np_platform, "release": {"image": c.release_image}}}));
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `demo` in `clusters` on `platform` (other modules' tests use it too).
    pub(crate) fn demo(platform: Platform) -> NewCluster {
        NewCluster {
            name: "demo".into(),
            namespace: "clusters".into(),
            platform,
            release_image: "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64".into(),
            pull_secret: br#"{"auths":{"quay.io":{"auth":"eDp5"}}}"#.to_vec(),
            ssh_public_key: Some("ssh-ed25519 AAAA demo".into()),
            base_domain: "example.com".into(),
            node_pool_replicas: 2,
            availability: "HighlyAvailable".into(),
            aws: Some(AwsSpec { region: "us-east-1".into(), role_arn_prefix: "arn:aws:iam::123456789012:role/demo".into(), subnet_id: "subnet-0123456789abcdef0".into(), oidc_bucket_url: "https://hcp-oidc.s3.us-east-1.amazonaws.com".into() }),
            agent_namespace: None,
            node_selector: Default::default(),
            tolerations: Vec::new(),
            etcd_storage_class: None,
        }
    }

    #[test]
    fn placement_goes_into_the_hosted_cluster_spec() {
        let mut c = demo(Platform::None);
        let (k, v) = parse_node_selector("hypershift.openshift.io/control-plane=true").unwrap();
        c.node_selector.insert(k, v);
        c.tolerations.push(parse_toleration("key=hypershift.openshift.io/control-plane,operator=Exists,effect=NoSchedule").unwrap());
        let hc = objects(&c).unwrap().into_iter().find(|o| o["kind"] == "HostedCluster").unwrap();
        assert_eq!(hc["spec"]["nodeSelector"], json!({"hypershift.openshift.io/control-plane": "true"}));
        assert_eq!(hc["spec"]["tolerations"], json!([{"key": "hypershift.openshift.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]));
        // none given: the fields are absent, not empty
        let hc = objects(&demo(Platform::None)).unwrap().into_iter().find(|o| o["kind"] == "HostedCluster").unwrap();
        assert!(hc["spec"].get("nodeSelector").is_none() && hc["spec"].get("tolerations").is_none());
    }

    #[test]
    fn bad_placement_says_what_to_fix() {
        assert!(parse_node_selector("role").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_node_selector("Bad Key=x").unwrap_err().contains("not a label key"));
        assert!(parse_node_selector("role=-x").unwrap_err().contains("not a label value"));
        assert_eq!(parse_node_selector("role=").unwrap(), ("role".into(), String::new()));
        assert!(parse_toleration("effect=NoSchedule").unwrap_err().contains("give a key"));
        assert!(parse_toleration("key=a,effect=Sometimes").unwrap_err().contains("NoSchedule, PreferNoSchedule or NoExecute"));
        assert!(parse_toleration("key=a,operator=Exists,value=x").unwrap_err().contains("takes no value"));
        assert!(parse_toleration("key=a,tolerationSeconds=30,effect=NoSchedule").unwrap_err().contains("NoExecute only"));
        assert!(parse_toleration("key=a,colour=blue").unwrap_err().contains("unknown field `colour`"));
        assert!(parse_toleration("key=a,key=b").unwrap_err().contains("given twice"));
        assert_eq!(parse_toleration("operator=Exists").unwrap(), json!({"operator": "Exists"}));
        assert_eq!(parse_toleration("key=a,value=b,effect=NoExecute,tolerationSeconds=30").unwrap(),
            json!({"key": "a", "value": "b", "effect": "NoExecute", "tolerationSeconds": 30}));
    }

    #[test]
    fn every_platform_renders_secrets_then_cluster_then_pool() {
        for p in [Platform::None, Platform::Agent, Platform::Kubevirt, Platform::Aws] {
            let objects = objects(&demo(p)).unwrap();
            let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
            assert_eq!(kinds, ["Secret", "Secret", "Secret", "HostedCluster", "NodePool"], "{p:?}");
            assert_eq!(objects[3]["spec"]["sshKey"]["name"], "demo-ssh-key");
        }
        // a fresh key each time, 32 bytes
        let a = objects(&demo(Platform::None)).unwrap()[1]["data"]["key"].clone();
        let b = objects(&demo(Platform::None)).unwrap()[1]["data"]["key"].clone();
        assert_ne!(a, b);
        assert_eq!(a.as_str().unwrap().len(), 44);
    }

    #[test]
    fn bad_input_says_what_to_fix() {
        let mut c = demo(Platform::Aws);
        c.aws = None;
        assert!(check(&c).unwrap_err().contains("--aws-region"));
        let mut c = demo(Platform::None);
        c.pull_secret = b"not json".to_vec();
        assert!(check(&c).unwrap_err().contains("--pull-secret"));
        let mut c = demo(Platform::None);
        c.name = "Demo".into();
        assert!(check(&c).unwrap_err().contains("--name"));
    }
}
