//! `rewrite`: the backup's objects made into a *different* hosted cluster,
//! so a drill can restore next to the original (even on the same management
//! cluster) without touching anything of it.
//!
//! What changes, and where (each rule says what it applies to):
//! - **identifiers found anywhere** (every string value and map key, except
//!   Secret payloads): the HCP namespace `<ns>-<name>`, the `<ns>/<name>`
//!   pair HyperShift annotations use, `spec.infraID` (the CAPI Cluster's name
//!   and `cluster.x-k8s.io/cluster-name` labels), `spec.clusterID`, and every
//!   published hostname. They are unique to the cluster, so wherever they
//!   stand they mean it.
//! - **the cluster's name in name positions**: `metadata.name`, label and
//!   annotation values (`labels`, `annotations`, `matchLabels` at any depth)
//!   and, under `spec`, fields named `name`, `namespace` or `...Name`
//!   (object references: `clusterName`, `dataSecretName`, `pullSecret.name`,
//!   `infrastructureRef.name`, ...). `demo` becomes `demo-drill`, `demo-workers`
//!   `demo-drill-workers`, `user-data-demo-workers-x` `user-data-demo-drill-workers-x`.
//! - **the HostedCluster namespace** where it is a namespace (`metadata.namespace`,
//!   `namespace` fields under `spec`).
//! - **a fresh identity**: new `spec.clusterID` (an RFC 4122 UUID) and
//!   `spec.infraID` on the HostedCluster and HostedControlPlane, so cloud
//!   resources and telemetry never collide with the source.
//! - **DNS**: every `spec.services[].servicePublishingStrategy` route or
//!   load-balancer hostname is changed (the label equal to the cluster's name
//!   is renamed, else the suffix goes into the first label), so the drill
//!   never claims the source's DNS names.
//!
//! What is dropped ([`DROPS`]): credentials HyperShift generates for a cluster
//! (admin kubeconfigs, kubeadmin password: the backup's copies point at the
//! source's API), HCP-namespace Secrets whose data names the source
//! (certificates for its namespace and hostnames: the control-plane operator
//! issues new ones) and the CAPI `controlPlaneEndpoint` (the source's API
//! address; it cannot change once set). What is kept on purpose ([`KEPT`]) is
//! reported. Secret payloads are never rewritten.
//!
//! Then every string is scanned again: any left that still names the source
//! (outside the kept fields, images and the base domain) fails the rewrite,
//! naming the object and the field: a reference hcp-dr does not know is not
//! silently left pointing at the live cluster.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::DrillContext;
use crate::archive::{GuestVolumeRecord, sanitize};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;
use crate::stages::restore::preflight::{describe, gvk_of};
use crate::stages::restore::verify::verified_manifest;

pub struct Rewrite;

/// A hosted cluster's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRef {
    pub namespace: String,
    pub name: String,
}

impl ClusterRef {
    pub fn new(namespace: &str, name: &str) -> ClusterRef {
        ClusterRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
    pub fn hcp_namespace(&self) -> String {
        crate::hosted::hcp_namespace(&self.namespace, &self.name)
    }
    /// `<namespace>/<name>`, as HyperShift's annotations write it.
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Who the drill cluster is: chosen once when the drill starts and journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrillIdentity {
    /// The backed-up cluster.
    pub source: ClusterRef,
    /// The drill's cluster: both names with the suffix.
    pub drill: ClusterRef,
    pub suffix: String,
    /// The drill's `spec.clusterID` (RFC 4122 version 4 UUID).
    pub cluster_id: String,
    /// The drill's `spec.infraID`: `<name>-<5 random characters>`, as HyperShift makes them.
    pub infra_id: String,
}

/// Longest HostedCluster name HyperShift accepts (its resources add to it).
const MAX_CLUSTER_NAME: usize = 53;

impl DrillIdentity {
    /// The drill's names (`source` + `suffix`, both name and namespace) and a
    /// fresh identity made from `random` (at least 21 random bytes).
    pub fn new(source: ClusterRef, suffix: &str, random: &[u8]) -> Result<DrillIdentity, String> {
        let suffix_ok = !suffix.is_empty()
            && suffix.len() <= 20
            && suffix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !suffix.ends_with('-');
        if !suffix_ok {
            return Err(format!(
                "--name-suffix `{suffix}`: use 1-20 lowercase letters, digits and '-', not ending in '-' (e.g. -drill)"
            ));
        }
        let drill = ClusterRef::new(&format!("{}{suffix}", source.namespace), &format!("{}{suffix}", source.name));
        if drill.name.len() > MAX_CLUSTER_NAME {
            return Err(format!(
                "--name-suffix `{suffix}`: the drill cluster's name `{}` is longer than {MAX_CLUSTER_NAME} characters; use a shorter suffix",
                drill.name
            ));
        }
        if drill.hcp_namespace().len() > 63 {
            return Err(format!(
                "--name-suffix `{suffix}`: the drill's control-plane namespace `{}` is longer than 63 characters; use a shorter suffix",
                drill.hcp_namespace()
            ));
        }
        if random.len() < 21 {
            return Err("internal: not enough random bytes for a new cluster identity".into());
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&random[..16]);
        uuid[6] = (uuid[6] & 0x0f) | 0x40; // version 4
        uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
        let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
        let cluster_id = format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let tail: String = random[16..21].iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect();
        let infra_id = format!("{}-{tail}", drill.name);
        Ok(DrillIdentity {
            source,
            drill,
            suffix: suffix.to_string(),
            cluster_id,
            infra_id,
        })
    }

    /// A source hostname made the drill's: the label equal to the cluster's
    /// name renamed, else the suffix added to the first label.
    pub fn hostname(&self, host: &str) -> String {
        let mut labels: Vec<String> = host.split('.').map(str::to_string).collect();
        match labels.iter().position(|l| *l == self.source.name) {
            Some(i) => labels[i] = self.drill.name.clone(),
            None => {
                let dash = if self.suffix.starts_with('-') { "" } else { "-" };
                labels[0] = format!("{}{dash}{}", labels[0], self.suffix);
            }
        }
        labels.join(".")
    }
}

/// `from` became `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renamed {
    pub from: String,
    pub to: String,
}

/// Something of the backup not replayed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    pub what: String,
    pub rule: String,
    pub reason: String,
}

/// A field left as the backup has it although it names the source, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub object: String,
    pub path: String,
    pub value: String,
    pub reason: String,
}

/// What the rewrite did (journaled; no secret data).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteReport {
    pub hosted_cluster: Renamed,
    pub hcp_namespace: Renamed,
    /// `from` is empty when the backup's cluster had none set.
    pub cluster_id: Renamed,
    pub infra_id: Renamed,
    /// Every published hostname, old and new: the drill claims none of the source's.
    pub hostnames: Vec<Renamed>,
    /// Every replayed object, `Kind namespace/name` before and after.
    pub objects: Vec<Renamed>,
    pub dropped: Vec<Dropped>,
    pub kept: Vec<Kept>,
    /// String values changed (references, labels, identifiers).
    pub values_rewritten: usize,
}

/// Why the backup's objects cannot be made into a drill cluster.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The objects hold no HostedCluster of the backup's name.
    #[error("the backup's objects hold no HostedCluster {0}: the backup is not of the cluster its folder names")]
    NoHostedCluster(String),
    /// Strings that still name the source after every rule ran.
    #[error(
        "the rewrite left {} reference(s) to the source cluster that hcp-dr does not know how to rename; the drill stops before touching anything (a drill must never point at the live cluster's names):\n  - {}\nrename them in a copy of the backup, or report the kinds and fields so hcp-dr learns them",
        .0.len(),
        .0.join("\n  - ")
    )]
    Leftover(Vec<String>),
    /// A renamed value no longer fits its field.
    #[error("with the suffix, these values are too long:\n  - {}\nuse a shorter --name-suffix", .0.join("\n  - "))]
    TooLong(Vec<String>),
}

/// One source identifier and what it becomes.
#[derive(Debug, Clone)]
struct Token {
    old: String,
    new: String,
    /// Only replaced in name positions (the bare cluster name).
    names_only: bool,
    /// Hostnames are whole dotted names: '.' and '-' do not end them.
    host: bool,
}

/// Single-pass replacement of whole tokens (never inside a longer word).
#[derive(Debug, Clone)]
struct Renamer {
    /// Longest first, so `clusters-demo` wins over `demo`.
    tokens: Vec<Token>,
}

fn is_word(c: char, host: bool) -> bool {
    c.is_ascii_alphanumeric() || (host && (c == '.' || c == '-'))
}

fn bounded(s: &str, at: usize, len: usize, host: bool) -> bool {
    let before = s[..at].chars().next_back();
    let after = s[at + len..].chars().next();
    !before.is_some_and(|c| is_word(c, host)) && !after.is_some_and(|c| is_word(c, host))
}

impl Renamer {
    fn new(mut tokens: Vec<Token>) -> Renamer {
        tokens.retain(|t| !t.old.is_empty() && t.old != t.new);
        tokens.sort_by_key(|t| std::cmp::Reverse(t.old.len()));
        Renamer { tokens }
    }

    fn old_at(&self, s: &str, at: usize, names: bool) -> Option<&Token> {
        self.tokens
            .iter()
            .filter(|t| names || !t.names_only)
            .find(|t| s[at..].starts_with(&t.old) && bounded(s, at, t.old.len(), t.host))
    }

    fn new_at(&self, s: &str, at: usize) -> Option<usize> {
        let mut lens: Vec<usize> = self
            .tokens
            .iter()
            .filter(|t| s[at..].starts_with(&t.new) && bounded(s, at, t.new.len(), t.host))
            .map(|t| t.new.len())
            .collect();
        lens.sort_unstable();
        lens.pop()
    }

    /// `s` with every source token replaced; how many were.
    fn replace(&self, s: &str, names: bool) -> (String, usize) {
        let (mut out, mut count, mut at) = (String::with_capacity(s.len()), 0, 0);
        while at < s.len() {
            if let Some(t) = self.old_at(s, at, names) {
                out.push_str(&t.new);
                at += t.old.len();
                count += 1;
                continue;
            }
            let c = s[at..].chars().next().unwrap_or_default();
            out.push(c);
            at += c.len_utf8().max(1);
        }
        (out, count)
    }

    /// The first source token left in `s` (the drill's own names skipped).
    fn leftover(&self, s: &str) -> Option<&str> {
        let mut at = 0;
        while at < s.len() {
            if let Some(len) = self.new_at(s, at) {
                at += len;
                continue;
            }
            if let Some(t) = self.old_at(s, at, true) {
                return Some(&t.old);
            }
            at += s[at..].chars().next().map(char::len_utf8).unwrap_or(1);
        }
        None
    }
}

/// A field left alone on purpose.
pub struct KeptRule {
    /// A JSON pointer; ending in `/`, every field below it.
    pub path: &'static str,
    pub reason: &'static str,
}

impl KeptRule {
    fn matches(&self, pointer: &str) -> bool {
        match self.path.strip_suffix('/') {
            Some(parent) => pointer.strip_prefix(parent).is_some_and(|rest| rest.starts_with('/')),
            None => pointer == self.path,
        }
    }
}

/// Fields kept as the backup has them although they may name the source.
pub const KEPT: &[KeptRule] = &[
    KeptRule {
        path: "/spec/platform/aws/rolesRef/",
        reason: "IAM roles are cloud resources outside the backup; renamed they would name roles that do not exist. They trust the source's OIDC issuer: an AWS drill needs roles of its own (see docs/runbooks/drill.md)",
    },
];

/// One rule removing something of the backup from the drill.
pub struct DropRule {
    pub name: &'static str,
    pub applies_to: &'static str,
    pub reason: &'static str,
}

/// What the rewrite drops, and why.
pub const DROPS: &[DropRule] = &[
    DropRule {
        name: "generated-credentials",
        applies_to: "Secrets labelled hypershift.openshift.io/kubeconfig, and <hc>-admin-kubeconfig, <hc>-kubeadmin-password, admin-kubeconfig, kubeadmin-password",
        reason: "HyperShift writes them for each cluster; the backup's copies point at the source's API server, so checks reading them would read the live cluster",
    },
    DropRule {
        name: "source-bound-data",
        applies_to: "Secrets of the HCP namespace whose data (certificates decoded) names the source's HCP namespace, infra ID, cluster ID or hostnames",
        reason: "issued for the source's names; the control-plane operator issues new ones for the drill (keys that name nothing, like signer CAs, client certificates and the encryption key, are kept)",
    },
    DropRule {
        name: "agent-inventory",
        applies_to: "the Agent platform's inventory in the agentNamespace (Agents, BareMetalHosts, InfraEnvs, NMStateConfigs and their Secrets): every object outside the cluster's two namespaces; and each AgentMachine's status (its binding to one of those hosts)",
        reason: "the hosts are the source's, in service: a drill never touches its Agents, BareMetalHosts or InfraEnv, so its NodePools get no hosts",
    },
    DropRule {
        name: "control-plane-endpoint",
        applies_to: "spec.controlPlaneEndpoint of the CAPI Cluster and the platform cluster (AWSCluster, AgentCluster, ...)",
        reason: "the source's API address; HyperShift fills in the drill's, and the field cannot change once set",
    },
    DropRule {
        name: "root-disks",
        applies_to: "KubeVirt worker VMs' root disks (owned by a VirtualMachine): named by a backup, or copied with their VirtualMachines under --include-root-disks",
        reason: "the drill's NodePools create their own VMs, which boot fresh disks from the NodePool's image: replaying the source's disks would boot a second copy of each source node (`backups verify` checks the copies); only guest volumes (kubevirt-csi) are restored",
    },
];

fn is_kind(obj: &Value, group: &str, kinds: &[&str]) -> bool {
    gvk_of(obj).group == group && kinds.iter().any(|k| obj["kind"] == *k)
}

fn is_platform_cluster(obj: &Value) -> bool {
    let group = gvk_of(obj).group;
    let infra = group.ends_with(".cluster.x-k8s.io") || group.starts_with("capi-provider.");
    (group == "cluster.x-k8s.io" && obj["kind"] == "Cluster")
        || (infra && obj["kind"].as_str().is_some_and(|k| k.ends_with("Cluster")))
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    serde_json::from_value::<k8s_openapi::ByteString>(Value::String(compact)).ok().map(|b| b.0)
}

/// The DER bodies of the PEM blocks in `bytes` (where certificates keep names).
fn pem_bodies(bytes: &[u8]) -> Vec<Vec<u8>> {
    let text = String::from_utf8_lossy(bytes);
    text.split("-----BEGIN ")
        .skip(1)
        .filter_map(|block| {
            let body = block.split_once("-----")?.1;
            let body = body.split("-----END").next()?;
            decode_base64(body)
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// The data key of a Secret whose payload names one of `needles`, and the needle.
fn payload_names<'a>(secret: &Value, needles: &'a [String]) -> Option<(String, &'a str)> {
    let data = secret["data"].as_object()?;
    for (key, value) in data {
        let Some(bytes) = value.as_str().and_then(decode_base64) else { continue };
        let mut blobs = vec![bytes.clone()];
        blobs.extend(pem_bodies(&bytes));
        for needle in needles {
            if blobs.iter().any(|b| contains(b, needle)) {
                return Some((key.clone(), needle));
            }
        }
    }
    None
}

/// Why a Secret of the backup is not replayed (None: it is).
fn drop_secret(obj: &Value, id: &DrillIdentity, needles: &[String]) -> Option<Dropped> {
    if obj["kind"] != "Secret" || !gvk_of(obj).group.is_empty() {
        return None;
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let hcp_ns = id.source.hcp_namespace();
    let rule = |index: usize, detail: String| {
        Some(Dropped {
            what: format!("{}{detail}", describe(obj)),
            rule: DROPS[index].name.to_string(),
            reason: DROPS[index].reason.to_string(),
        })
    };
    let generated = [
        format!("{}-admin-kubeconfig", id.source.name),
        format!("{}-kubeadmin-password", id.source.name),
        "admin-kubeconfig".to_string(),
        "kubeadmin-password".to_string(),
    ];
    if obj["metadata"]["labels"]["hypershift.openshift.io/kubeconfig"].is_string() || generated.iter().any(|g| g == name) {
        return rule(0, String::new());
    }
    if namespace == hcp_ns
        && let Some((key, needle)) = payload_names(obj, needles)
    {
        return rule(1, format!(" (its {key} names {needle})"));
    }
    None
}

/// Where in an object a string stands.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// Replaced and scanned, the bare name only in name positions.
    Value { name_position: bool },
    /// Neither: Secret payloads, images, the base domain, kept fields.
    Exempt,
}

fn place(kind: &str, path: &[String]) -> Place {
    let last = path.last().map(String::as_str).unwrap_or_default();
    let parent = path.len().checked_sub(2).and_then(|i| path.get(i)).map(String::as_str).unwrap_or_default();
    let joined = format!("/{}", path.join("/"));
    let payload = kind == "Secret" && matches!(path.first().map(String::as_str), Some("data" | "stringData"));
    if payload || matches!(last, "image" | "releaseImage" | "baseDomain") || KEPT.iter().any(|k| k.matches(&joined)) {
        return Place::Exempt;
    }
    let in_spec = path.first().is_some_and(|p| p == "spec");
    let name_position = joined == "/metadata/name"
        || matches!(parent, "labels" | "annotations" | "matchLabels")
        || (in_spec && (matches!(last, "name" | "namespace") || last.ends_with("Name")));
    Place::Value { name_position }
}

/// Visit every string with its path; map keys too (`true`: a key).
fn walk(value: &mut Value, path: &mut Vec<String>, visit: &mut dyn FnMut(&[String], bool, &mut String)) {
    match value {
        Value::String(s) => visit(path, false, s),
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                walk(item, path, visit);
                path.pop();
            }
        }
        Value::Object(map) => {
            let old = std::mem::take(map);
            let mut out = Map::new();
            for (key, mut item) in old {
                let mut new_key = key.clone();
                path.push(key.clone());
                visit(path, true, &mut new_key);
                walk(&mut item, path, visit);
                path.pop();
                out.insert(new_key, item);
            }
            *map = out;
        }
        _ => {}
    }
}

/// The hostnames the backup's HyperShift objects publish.
fn published_hostnames(objects: &[Value]) -> Vec<String> {
    let mut hosts: Vec<String> = objects
        .iter()
        .filter(|o| is_kind(o, "hypershift.openshift.io", &["HostedCluster", "HostedControlPlane"]))
        .filter_map(|o| o["spec"]["services"].as_array())
        .flatten()
        .flat_map(|s| {
            let strategy = &s["servicePublishingStrategy"];
            [strategy["route"]["hostname"].as_str(), strategy["loadBalancer"]["hostname"].as_str()]
        })
        .flatten()
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Make the backup's objects (as exported) into the drill cluster's.
pub fn rewrite(objects: &[Value], id: &DrillIdentity) -> Result<(Vec<Value>, RewriteReport), RewriteError> {
    rewrite_with(objects, &[], id).map(|(objects, _, report)| (objects, report))
}

/// A guest volume's claim and DataVolume as objects of the source's
/// control-plane namespace, for the rules to rename.
fn volume_objects(v: &GuestVolumeRecord, hcp_ns: &str) -> Vec<Value> {
    let mut out = vec![json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": v.volume.name, "namespace": hcp_ns, "labels": v.volume.labels}})];
    if let Some(dv) = &v.volume.data_volume {
        let mut dv = dv.clone();
        dv["metadata"]["namespace"] = json!(hcp_ns);
        out.push(dv);
    }
    out
}

/// [`rewrite`], and a KubeVirt backup's guest volumes made the drill's
/// with the same rules: the claims' and DataVolumes' names, labels (the
/// `infra-id` kubevirt-csi selects by) and namespace. They are reported
/// with the objects; nothing of them may still name the source either.
pub fn rewrite_with(objects: &[Value], volumes: &[GuestVolumeRecord], id: &DrillIdentity) -> Result<(Vec<Value>, Vec<GuestVolumeRecord>, RewriteReport), RewriteError> {
    let source_hcp = id.source.hcp_namespace();
    let extra: Vec<Vec<Value>> = volumes.iter().map(|v| volume_objects(v, &source_hcp)).collect();
    let count: usize = extra.iter().map(Vec::len).sum();
    let all: Vec<Value> = objects.iter().cloned().chain(extra.into_iter().flatten()).collect();
    let (mut out, report) = rewrite_objects(&all, id)?;
    // claims and DataVolumes are never dropped: they are the last `count` out
    let Some(at) = out.len().checked_sub(count) else {
        return Err(RewriteError::Leftover(vec![format!("internal: the rewrite dropped some of the guest volumes' {count} claims and DataVolumes")]));
    };
    let mut renamed = out.split_off(at).into_iter();
    let mut records = Vec::new();
    for v in volumes {
        let mut record = v.clone();
        let claim = renamed.next().unwrap_or_default();
        record.volume.name = claim["metadata"]["name"].as_str().unwrap_or_default().to_string();
        record.volume.namespace = id.drill.hcp_namespace();
        record.volume.labels = serde_json::from_value(claim["metadata"]["labels"].clone()).unwrap_or_default();
        if v.volume.data_volume.is_some() {
            record.volume.data_volume = renamed.next();
        }
        records.push(record);
    }
    Ok((out, records, report))
}

fn rewrite_objects(objects: &[Value], id: &DrillIdentity) -> Result<(Vec<Value>, RewriteReport), RewriteError> {
    let hc = objects
        .iter()
        .find(|o| {
            is_kind(o, "hypershift.openshift.io", &["HostedCluster"])
                && o["metadata"]["name"] == id.source.name.as_str()
                && o["metadata"]["namespace"] == id.source.namespace.as_str()
        })
        .ok_or_else(|| RewriteError::NoHostedCluster(id.source.path()))?;
    let old_infra = hc["spec"]["infraID"].as_str().unwrap_or_default().to_string();
    let old_cluster_id = hc["spec"]["clusterID"].as_str().unwrap_or_default().to_string();
    let hostnames: Vec<Renamed> = published_hostnames(objects)
        .into_iter()
        .map(|h| Renamed { to: id.hostname(&h), from: h })
        .collect();

    let anywhere = |old: &str, new: &str, host: bool| Token { old: old.to_string(), new: new.to_string(), names_only: false, host };
    let mut tokens = vec![
        anywhere(&id.source.hcp_namespace(), &id.drill.hcp_namespace(), false),
        anywhere(&id.source.path(), &id.drill.path(), false),
        anywhere(&old_infra, &id.infra_id, false),
        anywhere(&old_cluster_id, &id.cluster_id, false),
        Token { old: id.source.name.clone(), new: id.drill.name.clone(), names_only: true, host: false },
    ];
    tokens.extend(hostnames.iter().map(|h| anywhere(&h.from, &h.to, true)));
    let renamer = Renamer::new(tokens);
    let mut needles = vec![id.source.hcp_namespace(), old_infra.clone(), old_cluster_id.clone()];
    needles.extend(hostnames.iter().map(|h| h.from.clone()));
    needles.retain(|n| !n.is_empty());

    let mut report = RewriteReport {
        hosted_cluster: Renamed { from: id.source.path(), to: id.drill.path() },
        hcp_namespace: Renamed { from: id.source.hcp_namespace(), to: id.drill.hcp_namespace() },
        cluster_id: Renamed { from: old_cluster_id.clone(), to: id.cluster_id.clone() },
        infra_id: Renamed { from: old_infra.clone(), to: id.infra_id.clone() },
        hostnames,
        objects: Vec::new(),
        dropped: Vec::new(),
        kept: Vec::new(),
        values_rewritten: 0,
    };
    let mut out = Vec::new();
    let (mut leftovers, mut too_long) = (Vec::new(), Vec::new());
    for original in objects {
        if let Some(dropped) = drop_secret(original, id, &needles) {
            report.dropped.push(dropped);
            continue;
        }
        let namespace = original["metadata"]["namespace"].as_str().unwrap_or_default();
        if crate::hosted::agent::is_inventory(original) || (!namespace.is_empty() && namespace != id.source.namespace && namespace != id.source.hcp_namespace()) {
            report.dropped.push(Dropped { what: describe(original), rule: DROPS[2].name.to_string(), reason: DROPS[2].reason.to_string() });
            continue;
        }
        let mut obj = original.clone();
        sanitize::apply(sanitize::REPLAY, &mut obj);
        // an AgentMachine's binding names the source's host: the drill's must take none
        if crate::hosted::agent::is_agent_machine(&obj) && obj.as_object_mut().and_then(|o| o.remove("status")).is_some() {
            report.dropped.push(Dropped { what: format!("{} status.agentRef", describe(original)), rule: DROPS[2].name.to_string(), reason: DROPS[2].reason.to_string() });
        }
        let endpoint = is_platform_cluster(&obj)
            .then(|| obj.get_mut("spec").and_then(Value::as_object_mut).and_then(|spec| spec.remove("controlPlaneEndpoint")))
            .flatten();
        if endpoint.is_some() {
            report.dropped.push(Dropped {
                what: format!("{} spec.controlPlaneEndpoint", describe(original)),
                rule: DROPS[3].name.to_string(),
                reason: DROPS[3].reason.to_string(),
            });
        }
        let kind = obj["kind"].as_str().unwrap_or_default().to_string();
        let object = describe(original);
        let mut count = 0;
        walk(&mut obj, &mut Vec::new(), &mut |path, key, s| match place(&kind, path) {
            Place::Exempt if key => {}
            Place::Exempt => {
                let joined = format!("/{}", path.join("/"));
                if let (Some(rule), Some(_)) = (KEPT.iter().find(|k| k.matches(&joined)), renamer.leftover(s)) {
                    report.kept.push(Kept { object: object.clone(), path: joined, value: s.clone(), reason: rule.reason.to_string() });
                }
            }
            Place::Value { name_position } => {
                // keys are field and label names: only the unique identifiers
                let name_position = name_position && !key;
                let is_namespace = !key && (path.join("/") == "metadata/namespace" || (name_position && path.last().is_some_and(|l| l == "namespace")));
                let (new, n) = if is_namespace && *s == id.source.namespace {
                    (id.drill.namespace.clone(), 1)
                } else {
                    renamer.replace(s, name_position)
                };
                count += n;
                *s = new;
            }
        });
        if is_kind(&obj, "hypershift.openshift.io", &["HostedCluster", "HostedControlPlane"]) {
            obj["spec"]["clusterID"] = json!(id.cluster_id);
            obj["spec"]["infraID"] = json!(id.infra_id);
            // its hosts are the source's: the drill's NodePools must find none
            if let Some(agent_ns) = crate::hosted::agent::agent_namespace(original) {
                let own = format!("{}-no-hosts", id.drill.hcp_namespace());
                obj["spec"]["platform"]["agent"]["agentNamespace"] = json!(own);
                report.dropped.push(Dropped {
                    what: format!("{} spec.platform.agent.agentNamespace {agent_ns} (now {own}, which holds no hosts)", describe(original)),
                    rule: DROPS[2].name.to_string(),
                    reason: DROPS[2].reason.to_string(),
                });
            }
        }
        report.values_rewritten += count;
        walk(&mut obj, &mut Vec::new(), &mut |path, key, s| {
            if let (Place::Value { .. }, Some(old)) = (place(&kind, path), renamer.leftover(s)) {
                let what = if key { "key" } else { "value" };
                leftovers.push(format!("{object} (as backed up) /{}: {what} `{s}` still names `{old}`", path.join("/")));
            }
        });
        check_lengths(&obj, &mut too_long);
        report.objects.push(Renamed { from: describe(original), to: describe(&obj) });
        out.push(obj);
    }
    if !leftovers.is_empty() {
        return Err(RewriteError::Leftover(leftovers));
    }
    if !too_long.is_empty() {
        return Err(RewriteError::TooLong(too_long));
    }
    Ok((out, report))
}

fn check_lengths(obj: &Value, too_long: &mut Vec<String>) {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if name.len() > 253 {
        too_long.push(format!("{}: metadata.name is {} characters (at most 253)", describe(obj), name.len()));
    }
    if let Some(labels) = obj["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            let len = v.as_str().map(str::len).unwrap_or_default();
            if len > 63 {
                too_long.push(format!("{}: label {k} is {len} characters (at most 63)", describe(obj)));
            }
        }
    }
}

impl StageId for Rewrite {
    const NAME: &'static str = "rewrite";
    type Output = RewriteReport;
}

#[async_trait]
impl Stage<DrillContext> for Rewrite {
    fn summary(&self) -> &'static str {
        "make the backup's objects a new cluster: names, namespaces and references renamed, fresh clusterID and infraID, different hostnames; unknown references to the source fail the drill"
    }
    fn mutates(&self) -> bool {
        false
    }
    fn plan(&self, ctx: &DrillContext, _step: &Step<'_>) -> Vec<String> {
        let id = &ctx.inputs.identity;
        vec![format!(
            "rename {} to {} (HCP namespace {}), new clusterID {} and infraID {}, hostnames changed",
            id.source.path(),
            id.drill.path(),
            id.drill.hcp_namespace(),
            id.cluster_id,
            id.infra_id
        )]
    }
    async fn run(&self, ctx: &mut DrillContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let objects = ctx.restore.objects.as_deref().ok_or(StageError::Missing("the backup's objects (verify)"))?;
        let guest = verified_manifest(step).and_then(|m| m.guest_volumes).unwrap_or_default();
        let (copied_disks, guest_volumes): (Vec<_>, Vec<_>) = guest.volumes.into_iter().partition(|v| v.volume.virtual_machine.is_some());
        let (rewritten, volumes, mut report) = rewrite_with(objects, &guest_volumes, &ctx.inputs.identity)?;
        ctx.restore.guest_volumes = Some(volumes);
        if !guest.root_disks.is_empty() {
            report.dropped.push(Dropped {
                what: format!("root-disk PVCs {} (not in the backup)", guest.root_disks.join(", ")),
                rule: DROPS[4].name.to_string(),
                reason: DROPS[4].reason.to_string(),
            });
        }
        if !copied_disks.is_empty() {
            let names: Vec<&str> = copied_disks.iter().map(|v| v.volume.name.as_str()).collect();
            report.dropped.push(Dropped {
                what: format!("root disks {} and their VirtualMachines (in the backup, not replayed)", names.join(", ")),
                rule: DROPS[4].name.to_string(),
                reason: DROPS[4].reason.to_string(),
            });
        }
        tracing::info!(
            objects = rewritten.len(),
            dropped = report.dropped.len(),
            hostnames = report.hostnames.len(),
            "rewrote the backup's objects for {}",
            ctx.inputs.identity.drill.path()
        );
        ctx.restore.objects = Some(rewritten);
        ctx.rewrite = Some(report.clone());
        Ok(report)
    }
    fn restore(&self, ctx: &mut DrillContext, output: Self::Output) -> Result<(), StageFailure> {
        ctx.rewrite = Some(output);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosted::render::tests::demo;
    use crate::hosted::render::{Platform, objects};

    fn b64(bytes: &[u8]) -> String {
        serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap().as_str().unwrap().to_string()
    }

    /// A PEM "certificate" whose DER body carries `names` as a real one
    /// carries its subject alternative names.
    fn pem(names: &[&str]) -> String {
        let mut der = vec![0x30, 0x82, 0x01, 0x0a];
        for n in names {
            der.extend_from_slice(&[0x82, n.len() as u8]);
            der.extend_from_slice(n.as_bytes());
        }
        format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", b64(&der))
    }

    fn secret(ns: &str, name: &str, data: &[(&str, String)], labels: Value) -> Value {
        let data: Map<String, Value> = data.iter().map(|(k, v)| (k.to_string(), json!(b64(v.as_bytes())))).collect();
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": [{"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane", "name": "demo", "uid": "u"}]},
            "type": "Opaque", "data": data})
    }

    /// What a backup of `demo` on the Agent platform holds (the shapes of a
    /// real export: HC and NodePool as `cluster create` renders them plus
    /// what HyperShift adds, and the HCP namespace's objects).
    fn backup(platform: Platform) -> Vec<Value> {
        let mut out = objects(&demo(platform)).unwrap();
        let hc = out.iter_mut().find(|o| o["kind"] == "HostedCluster").unwrap();
        hc["spec"]["infraID"] = json!("demo-b28db");
        hc["spec"]["clusterID"] = json!("8a5b6c1e-3f2d-4b7a-9c0e-1d2f3a4b5c6d");
        hc["spec"]["issuerURL"] = json!("https://oidc.example.com/demo-b28db");
        hc["spec"]["pausedUntil"] = json!("2026-11-22T00:11:13Z");
        hc["metadata"]["finalizers"] = json!(["hypershift.openshift.io/finalizer"]);
        let spec = hc["spec"].clone();
        let ms = "demo-workers-19ddb";
        out.extend([
            json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedControlPlane",
                "metadata": {"name": "demo", "namespace": "clusters-demo", "annotations": {"hypershift.openshift.io/cluster": "clusters/demo"}},
                "spec": {"releaseImage": spec["release"]["image"], "pullSecret": {"name": "pull-secret"}, "sshKey": spec["sshKey"],
                    "infraID": "demo-b28db", "clusterID": spec["clusterID"], "services": spec["services"], "dns": spec["dns"],
                    "platform": spec["platform"], "secretEncryption": spec["secretEncryption"], "etcd": spec["etcd"],
                    "pausedUntil": "2026-11-22T00:11:13Z"}}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "demo-b28db", "namespace": "clusters-demo"},
                "spec": {"controlPlaneEndpoint": {"host": "api.demo.example.com", "port": 6443}, "paused": true,
                    "controlPlaneRef": {"apiGroup": "hypershift.openshift.io", "kind": "HostedControlPlane", "name": "demo"},
                    "infrastructureRef": {"apiGroup": "capi-provider.agent-install.openshift.io", "kind": "AgentCluster", "name": "demo"}}}),
            json!({"apiVersion": "capi-provider.agent-install.openshift.io/v1beta1", "kind": "AgentCluster",
                "metadata": {"name": "demo", "namespace": "clusters-demo", "annotations": {"hypershift.openshift.io/cluster": "clusters/demo"}},
                "spec": {"controlPlaneEndpoint": {"host": "api.demo.example.com", "port": 6443}}}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": {"name": "demo-workers", "namespace": "clusters-demo", "labels": {"hypershift.openshift.io/nodePool": "demo-workers"},
                    "annotations": {"hypershift.openshift.io/nodePool": "clusters/demo-workers"}},
                "spec": {"clusterName": "demo-b28db", "replicas": 2,
                    "selector": {"matchLabels": {"hypershift.openshift.io/nodePool": "demo-workers", "cluster.x-k8s.io/cluster-name": "demo-b28db"}},
                    "template": {"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "demo-b28db", "cluster.x-k8s.io/set-name": ms}},
                        "spec": {"clusterName": "demo-b28db", "bootstrap": {"dataSecretName": format!("user-data-{ms}")},
                            "infrastructureRef": {"apiGroup": "capi-provider.agent-install.openshift.io", "kind": "AgentMachineTemplate", "name": ms}}}}}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": format!("{ms}-16c5e"), "namespace": "clusters-demo",
                    "labels": {"cluster.x-k8s.io/cluster-name": "demo-b28db", "cluster.x-k8s.io/set-name": ms, "hypershift.openshift.io/nodePool": "demo-workers"}},
                "spec": {"clusterName": "demo-b28db", "bootstrap": {"dataSecretName": format!("user-data-{ms}")},
                    "infrastructureRef": {"apiGroup": "capi-provider.agent-install.openshift.io", "kind": "AgentMachine", "name": format!("{ms}-16c5e")}}}),
            secret("clusters-demo", "etcd-signer", &[("tls.crt", pem(&["etcd-signer"])), ("tls.key", "KEY".into())], json!({})),
            secret("clusters-demo", "etcd-client-tls", &[("etcd-client.crt", pem(&["etcd-client"])), ("etcd-client.key", "KEY".into())], json!({})),
            secret("clusters-demo", "etcd-server-tls", &[("server.crt", pem(&["*.etcd-discovery.clusters-demo.svc", "localhost"]))], json!({})),
            secret("clusters-demo", "kas-server-crt", &[("tls.crt", pem(&["api.demo.example.com"]))], json!({})),
            secret("clusters-demo", "admin-kubeconfig", &[("kubeconfig", "server: https://127.0.0.1:6443".into())], json!({"hypershift.openshift.io/kubeconfig": "external"})),
            secret("clusters-demo", "demo-etcd-encryption-key", &[("key", "0123456789abcdef".into())], json!({})),
            secret("clusters", "demo-admin-kubeconfig", &[("kubeconfig", "server: https://api.demo.example.com:6443".into())], json!({})),
        ]);
        out
    }

    fn identity() -> DrillIdentity {
        DrillIdentity::new(ClusterRef::new("clusters", "demo"), "-drill", &[7u8; 32]).unwrap()
    }

    fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {:#?}", objects.iter().map(describe).collect::<Vec<_>>()))
    }

    #[test]
    fn identity_is_fresh_and_names_take_the_suffix() {
        let id = identity();
        assert_eq!(id.drill, ClusterRef::new("clusters-drill", "demo-drill"));
        assert_eq!(id.drill.hcp_namespace(), "clusters-drill-demo-drill");
        assert_eq!(id.cluster_id, "07070707-0707-4707-8707-070707070707");
        assert!(id.infra_id.starts_with("demo-drill-") && id.infra_id.len() == "demo-drill-".len() + 5, "{}", id.infra_id);
        assert_eq!(id.hostname("api.demo.example.com"), "api.demo-drill.example.com");
        assert_eq!(id.hostname("api.example.com"), "api-drill.example.com");
        for bad in ["", "-Drill", "-drill-", "_x", &"-x".repeat(11)] {
            assert!(DrillIdentity::new(ClusterRef::new("clusters", "demo"), bad, &[1u8; 32]).unwrap_err().contains("--name-suffix"), "{bad}");
        }
        let long = "c".repeat(50);
        assert!(DrillIdentity::new(ClusterRef::new("clusters", &long), "-drill", &[1u8; 32]).unwrap_err().contains("longer than 53"));
    }

    #[test]
    fn every_name_reference_and_identity_is_the_drills() {
        let id = identity();
        let source = backup(Platform::Agent);
        let (objects, report) = rewrite(&source, &id).unwrap();

        let hc = find(&objects, "HostedCluster", "demo-drill");
        assert_eq!(hc["metadata"]["namespace"], "clusters-drill");
        assert_eq!(hc["spec"]["pullSecret"]["name"], "demo-drill-pull-secret");
        assert_eq!(hc["spec"]["secretEncryption"]["aescbc"]["activeKey"]["name"], "demo-drill-etcd-encryption-key");
        assert_eq!(hc["spec"]["sshKey"]["name"], "demo-drill-ssh-key");
        assert_eq!(hc["spec"]["clusterID"], id.cluster_id.as_str());
        assert_eq!(hc["spec"]["infraID"], id.infra_id.as_str());
        assert_eq!(hc["spec"]["issuerURL"], format!("https://oidc.example.com/{}", id.infra_id));
        assert!(hc["spec"].get("pausedUntil").is_none(), "the backup's pause travelled");
        let hosts: Vec<&str> = hc["spec"]["services"].as_array().unwrap().iter().filter_map(|s| s.pointer("/servicePublishingStrategy/route/hostname").and_then(Value::as_str)).collect();
        assert_eq!(hosts, ["api.demo-drill.example.com", "oauth.demo-drill.example.com", "konnectivity.demo-drill.example.com", "ignition.demo-drill.example.com"]);
        // the Agent inventory is the source's: the drill points at a namespace without hosts, and says so
        assert_eq!(hc["spec"]["platform"]["agent"]["agentNamespace"], "clusters-drill-demo-drill-no-hosts");
        assert!(report.dropped.iter().any(|d| d.rule == "agent-inventory" && d.what.starts_with("HostedCluster clusters/demo spec.platform.agent.agentNamespace clusters-demo-agents")), "{:#?}", report.dropped);

        let np = find(&objects, "NodePool", "demo-drill-workers");
        assert_eq!(np["metadata"]["namespace"], "clusters-drill");
        assert_eq!(np["spec"]["clusterName"], "demo-drill");
        assert_eq!(np["spec"]["release"]["image"], "quay.io/openshift-release-dev/ocp-release:4.16.10-x86_64");

        let hcp = find(&objects, "HostedControlPlane", "demo-drill");
        assert_eq!(hcp["metadata"]["namespace"], "clusters-drill-demo-drill");
        assert_eq!(hcp["metadata"]["annotations"]["hypershift.openshift.io/cluster"], "clusters-drill/demo-drill");
        assert_eq!(hcp["spec"]["infraID"], id.infra_id.as_str());
        assert_eq!(hcp["spec"]["clusterID"], id.cluster_id.as_str());
        assert_eq!(hcp["spec"]["pullSecret"]["name"], "pull-secret");
        assert_eq!(hcp["spec"]["services"], hc["spec"]["services"]);

        let cluster = find(&objects, "Cluster", &id.infra_id);
        assert_eq!(cluster["spec"]["controlPlaneRef"]["name"], "demo-drill");
        assert_eq!(cluster["spec"]["infrastructureRef"]["name"], "demo-drill");
        assert!(cluster["spec"].get("controlPlaneEndpoint").is_none() && cluster["spec"].get("paused").is_none(), "{}", cluster["spec"]);
        assert!(find(&objects, "AgentCluster", "demo-drill")["spec"].get("controlPlaneEndpoint").is_none());

        let md = find(&objects, "MachineDeployment", "demo-drill-workers");
        assert_eq!(md["metadata"]["annotations"]["hypershift.openshift.io/nodePool"], "clusters-drill/demo-drill-workers");
        assert_eq!(md["spec"]["clusterName"], id.infra_id.as_str());
        assert_eq!(md["spec"]["selector"]["matchLabels"]["hypershift.openshift.io/nodePool"], "demo-drill-workers");
        assert_eq!(md["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/cluster-name"], id.infra_id.as_str());
        assert_eq!(md["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"], "user-data-demo-drill-workers-19ddb");
        assert_eq!(md["spec"]["template"]["spec"]["infrastructureRef"]["name"], "demo-drill-workers-19ddb");
        let machine = find(&objects, "Machine", "demo-drill-workers-19ddb-16c5e");
        assert_eq!(machine["metadata"]["labels"]["cluster.x-k8s.io/set-name"], "demo-drill-workers-19ddb");

        // secrets: renamed, or dropped when they name the source or are generated
        for name in ["demo-drill-pull-secret", "demo-drill-etcd-encryption-key", "demo-drill-ssh-key"] {
            assert_eq!(find(&objects, "Secret", name)["metadata"]["namespace"], "clusters-drill");
        }
        assert_eq!(find(&objects, "Secret", "demo-drill-etcd-encryption-key")["data"], source.iter().find(|o| o["metadata"]["name"] == "demo-etcd-encryption-key" && o["metadata"]["namespace"] == "clusters").unwrap()["data"], "a payload was rewritten");
        assert_eq!(find(&objects, "Secret", "etcd-signer")["metadata"]["namespace"], "clusters-drill-demo-drill");
        assert!(find(&objects, "Secret", "etcd-client-tls")["metadata"].get("ownerReferences").is_none());
        let dropped: Vec<&str> = report.dropped.iter().map(|d| d.what.as_str()).collect();
        for gone in ["Secret clusters-demo/etcd-server-tls (its server.crt names clusters-demo)", "Secret clusters-demo/kas-server-crt (its tls.crt names api.demo.example.com)", "Secret clusters-demo/admin-kubeconfig", "Secret clusters/demo-admin-kubeconfig"] {
            assert!(dropped.contains(&gone), "{gone} not in {dropped:#?}");
            assert!(!objects.iter().any(|o| describe(o) == gone.split(" (").next().unwrap()));
        }
        assert!(dropped.iter().any(|d| d.starts_with("Cluster clusters-demo/demo-b28db spec.controlPlaneEndpoint")));

        assert_eq!(report.hcp_namespace, Renamed { from: "clusters-demo".into(), to: "clusters-drill-demo-drill".into() });
        assert_eq!(report.hostnames.len(), 4);
        assert!(report.hostnames.iter().all(|h| h.from != h.to && !report.hostnames.iter().any(|o| o.from == h.to)));
        // nothing replayed still names the source, outside the kept field
        let text = serde_json::to_string(&objects).unwrap();
        for old in ["clusters/demo\"", "demo-b28db", "8a5b6c1e-3f2d-4b7a-9c0e-1d2f3a4b5c6d", "api.demo.example.com", "\"clusters-demo\""] {
            assert!(!text.contains(old), "{old} left in the objects");
        }
    }

    #[test]
    fn every_platform_rewrites_cleanly() {
        for platform in [Platform::None, Platform::Agent, Platform::Kubevirt, Platform::Aws] {
            let source = backup(platform);
            let (objects, report) = rewrite(&source, &identity()).unwrap_or_else(|e| panic!("{platform:?}: {e}"));
            // (a dropped field is not a dropped object)
            let dropped_objects = report.dropped.iter().filter(|d| !d.what.contains(" spec.")).count();
            assert_eq!(objects.len() + dropped_objects, source.len(), "{platform:?}");
            assert_eq!(report.objects.len(), objects.len());
            let hc = find(&objects, "HostedCluster", "demo-drill");
            let api = &hc["spec"]["services"][0]["servicePublishingStrategy"];
            let host = api["route"]["hostname"].as_str().or(api["loadBalancer"]["hostname"].as_str());
            assert_eq!(host, Some("api.demo-drill.example.com"), "{platform:?}");
        }
        // AWS: the IAM roles are kept (they are not the backup's to rename), and said so
        let (objects, report) = rewrite(&backup(Platform::Aws), &identity()).unwrap();
        let hc = find(&objects, "HostedCluster", "demo-drill");
        assert_eq!(hc["spec"]["platform"]["aws"]["rolesRef"]["ingressARN"], "arn:aws:iam::123456789012:role/demo-openshift-ingress");
        assert!(report.kept.iter().any(|k| k.path == "/spec/platform/aws/rolesRef/ingressARN"), "{:#?}", report.kept);
    }

    #[test]
    fn an_unknown_reference_to_the_source_fails_naming_it() {
        let mut objects = backup(Platform::None);
        let np = objects.iter_mut().find(|o| o["kind"] == "NodePool").unwrap();
        np["spec"]["tuningConfig"] = json!([{"configMap": "demo-tuned"}]);
        np["spec"]["description"] = json!("workers of demo");
        let err = rewrite(&objects, &identity()).unwrap_err().to_string();
        assert!(err.contains("NodePool clusters/demo-workers (as backed up) /spec/tuningConfig/0/configMap: value `demo-tuned` still names `demo`"), "{err}");
        assert!(err.contains("/spec/description: value `workers of demo`"), "{err}");
        assert!(err.contains("2 reference(s)"), "{err}");
        // a word merely containing the name is not a reference
        let mut objects = backup(Platform::None);
        objects.iter_mut().find(|o| o["kind"] == "NodePool").unwrap()["spec"]["description"] = json!("demonstration pool");
        assert!(rewrite(&objects, &identity()).is_ok());
    }

    fn guest_volume(name: &str, labels: Value, data_volume: Option<Value>) -> GuestVolumeRecord {
        GuestVolumeRecord {
            volume: crate::hosted::kubevirt::GuestVolume {
                name: name.into(),
                namespace: "clusters-demo".into(),
                storage_class: "sandbox-csi".into(),
                driver: "csi.sandbox.hcp-dr.io".into(),
                size: "1Gi".into(),
                access_modes: vec!["ReadWriteOnce".into()],
                volume_mode: "Filesystem".into(),
                labels: serde_json::from_value(labels).unwrap(),
                data_volume,
                virtual_machine: None,
                snapshot_class: "sandbox-csi-snapshots".into(),
            },
            artifact: format!("volumes/{name}.tar"),
            files: 7,
        }
    }

    #[test]
    fn guest_volumes_take_the_drills_namespace_and_infra_id() {
        let id = identity();
        let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "pvc-4b1e", "namespace": "clusters-demo", "labels": {"hypershift.openshift.io/infra-id": "demo-b28db"}},
            "spec": {"storage": {"resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "sandbox-csi"}, "source": {"blank": {}}}});
        let volumes = [
            guest_volume("pvc-4b1e", json!({"hypershift.openshift.io/infra-id": "demo-b28db"}), Some(dv)),
            guest_volume("demo-scratch", json!({"hypershift.openshift.io/infra-id": "demo-b28db"}), None),
        ];
        let (objects, renamed, report) = rewrite_with(&backup(Platform::Kubevirt), &volumes, &id).unwrap();
        // the volumes are not replayed by apply: they are the stage's own
        assert!(!objects.iter().any(|o| o["kind"] == "PersistentVolumeClaim" || o["kind"] == "DataVolume"));
        assert_eq!(renamed.len(), 2);
        let infra = |v: &GuestVolumeRecord| v.volume.labels["hypershift.openshift.io/infra-id"].clone();
        assert_eq!((renamed[0].volume.name.as_str(), renamed[0].volume.namespace.as_str()), ("pvc-4b1e", "clusters-drill-demo-drill"));
        assert_eq!(infra(&renamed[0]), id.infra_id);
        let dv = renamed[0].volume.data_volume.as_ref().unwrap();
        assert_eq!(dv["metadata"]["namespace"], "clusters-drill-demo-drill");
        assert_eq!(dv["metadata"]["labels"]["hypershift.openshift.io/infra-id"], json!(id.infra_id));
        // a claim named after the cluster is renamed like any object
        assert_eq!(renamed[1].volume.name, "demo-drill-scratch");
        assert_eq!(infra(&renamed[1]), id.infra_id);
        assert_eq!((renamed[1].artifact.as_str(), renamed[1].files), ("volumes/demo-scratch.tar", 7), "the artifact is the backup's");
        assert!(report.objects.iter().any(|o| o.from == "PersistentVolumeClaim clusters-demo/pvc-4b1e"), "{:#?}", report.objects);

        // a DataVolume field naming the source that no rule knows stops the drill
        let mut odd = volumes[0].clone();
        odd.volume.data_volume.as_mut().unwrap()["spec"]["source"] = json!({"http": {"url": "https://images.example.com/demo/disk.img"}});
        let err = rewrite_with(&backup(Platform::Kubevirt), &[odd], &id).unwrap_err().to_string();
        assert!(err.contains("DataVolume clusters-demo/pvc-4b1e (as backed up) /spec/source/http/url"), "{err}");
    }

    #[test]
    fn a_backup_of_another_cluster_is_refused() {
        let id = DrillIdentity::new(ClusterRef::new("clusters", "other"), "-drill", &[1u8; 32]).unwrap();
        assert!(matches!(rewrite(&backup(Platform::None), &id), Err(RewriteError::NoHostedCluster(_))));
    }

    #[test]
    fn tokens_are_whole_words_and_replaced_once() {
        let r = Renamer::new(vec![
            Token { old: "clusters-demo".into(), new: "clusters-drill-demo-drill".into(), names_only: false, host: false },
            Token { old: "demo".into(), new: "demo-drill".into(), names_only: true, host: false },
            Token { old: "api.demo.x.com".into(), new: "api.demo-drill.x.com".into(), names_only: false, host: true },
        ]);
        assert_eq!(r.replace("clusters-demo-agents", false).0, "clusters-drill-demo-drill-agents");
        assert_eq!(r.replace("demo-workers demonstration", true).0, "demo-drill-workers demonstration");
        assert_eq!(r.replace("demo", false).0, "demo");
        assert_eq!(r.replace("https://api.demo.x.com:6443", false).0, "https://api.demo-drill.x.com:6443");
        assert_eq!(r.replace("xapi.demo.x.com", false).0, "xapi.demo.x.com");
        assert_eq!(r.leftover("clusters-drill-demo-drill-agents"), None);
        assert_eq!(r.leftover("https://api.demo-drill.x.com"), None);
        assert_eq!(r.leftover("user-data-demo-x"), Some("demo"));
    }
}
