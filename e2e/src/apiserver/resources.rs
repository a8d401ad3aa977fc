//! The resource types the emulator serves: a fixed table of built-in kinds and
//! the kinds registered by CustomResourceDefinitions.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::schema::Schema;

/// Where `/scale` reads and writes replicas (JSON paths like `.spec.replicas`).
#[derive(Debug, Clone)]
pub struct ScaleSpec {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// A printer column of a CRD (`additionalPrinterColumns`).
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// What a CRD adds to a resource type.
#[derive(Debug, Clone)]
pub struct CustomInfo {
    /// `metadata.name` of the CRD (`hostedclusters.hypershift.openshift.io`).
    pub crd_name: String,
    /// Compiled schema of this version (None when the version has no schema).
    pub schema: Option<Arc<Schema>>,
    pub printer_columns: Vec<PrinterColumn>,
    pub categories: Vec<String>,
    /// True for the storage version.
    pub storage: bool,
}

/// One served resource (group, version, plural).
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    /// Plural resource name (`hostedclusters`).
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub status_subresource: bool,
    pub scale: Option<ScaleSpec>,
    /// Whether `metadata.generation` is maintained.
    pub generation: bool,
    pub custom: Option<CustomInfo>,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The etcd key component. As upstream: built-in kinds use the bare resource
    /// name (`/registry/deployments/ns/x`), CRDs and custom resources
    /// `<group>/<resource>`. events.k8s.io events are kept apart from core
    /// events (upstream shares one storage and converts; the emulator does not convert).
    pub fn storage_prefix(&self) -> String {
        if self.custom.is_some() || self.group == CRD_GROUP || self.group == "events.k8s.io" {
            format!("{}/{}", self.group, self.plural)
        } else {
            self.plural.clone()
        }
    }

    pub fn is_builtin(&self) -> bool {
        self.custom.is_none()
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    status: bool,
    scale: bool,
    generation: bool,
}

#[allow(clippy::too_many_arguments)] // a table-row constructor: one argument per column
const fn b(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    short: &'static [&'static str],
    status: bool,
    scale: bool,
    generation: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        plural,
        kind,
        namespaced,
        short,
        status,
        scale,
        generation,
    }
}

const BUILTINS: &[Builtin] = &[
    b(
        "",
        "v1",
        "namespaces",
        "Namespace",
        false,
        &["ns"],
        true,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "secrets",
        "Secret",
        true,
        &[],
        false,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "configmaps",
        "ConfigMap",
        true,
        &["cm"],
        false,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "services",
        "Service",
        true,
        &["svc"],
        true,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "endpoints",
        "Endpoints",
        true,
        &["ep"],
        false,
        false,
        false,
    ),
    b("", "v1", "pods", "Pod", true, &["po"], true, false, false),
    b(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        &["pv"],
        true,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        &["sa"],
        false,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "events",
        "Event",
        true,
        &["ev"],
        false,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "nodes",
        "Node",
        false,
        &["no"],
        true,
        false,
        false,
    ),
    b(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        &["deploy"],
        true,
        true,
        true,
    ),
    b(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        &["sts"],
        true,
        true,
        true,
    ),
    b(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        true,
        &["rs"],
        true,
        true,
        true,
    ),
    b(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        false,
        &["pc"],
        false,
        false,
        false,
    ),
    b(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        &[],
        false,
        false,
        false,
    ),
    b(
        "route.openshift.io",
        "v1",
        "routes",
        "Route",
        true,
        &[],
        true,
        false,
        false,
    ),
    b(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        true,
        &["ev"],
        false,
        false,
        false,
    ),
    b("batch", "v1", "jobs", "Job", true, &[], true, false, true),
    b(
        "batch",
        "v1",
        "cronjobs",
        "CronJob",
        true,
        &["cj"],
        true,
        false,
        true,
    ),
    b(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        &["sc"],
        false,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        &[],
        false,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        &[],
        false,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        &[],
        false,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
        false,
        false,
        false,
    ),
    b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        true,
        false,
        true,
    ),
];

/// The built-in resource types.
pub fn builtins() -> Vec<ResourceType> {
    BUILTINS
        .iter()
        .map(|x| ResourceType {
            group: x.group.into(),
            version: x.version.into(),
            plural: x.plural.into(),
            singular: x.kind.to_lowercase(),
            kind: x.kind.into(),
            list_kind: format!("{}List", x.kind),
            namespaced: x.namespaced,
            short_names: x.short.iter().map(|s| s.to_string()).collect(),
            status_subresource: x.status,
            scale: x.scale.then(|| ScaleSpec {
                spec_replicas_path: ".spec.replicas".into(),
                status_replicas_path: ".status.replicas".into(),
                label_selector_path: Some(".spec.selector".into()),
            }),
            generation: x.generation,
            custom: None,
        })
        .collect()
}

/// The group whose CRDs are themselves served (for readability at call sites).
pub const CRD_GROUP: &str = "apiextensions.k8s.io";
pub const CRD_RESOURCE: &str = "customresourcedefinitions";

/// All served types, keyed by (group, version, plural).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: BTreeMap<(String, String, String), Arc<ResourceType>>,
    /// Group -> preferred version (CRD: first served version in spec order... upstream sorts by priority).
    preferred: BTreeMap<String, String>,
}

impl Registry {
    pub fn with_builtins() -> Registry {
        let mut r = Registry::default();
        for t in builtins() {
            r.preferred
                .entry(t.group.clone())
                .or_insert_with(|| t.version.clone());
            r.types.insert(
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(t),
            );
        }
        r
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    /// Any served version of (group, plural): the one used for storage-level scans.
    pub fn any_version(&self, group: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .values()
            .find(|t| t.group == group && t.plural == plural)
            .cloned()
    }

    /// Find a type by apiVersion + kind (for ownerReferences).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        self.types
            .values()
            .find(|t| t.api_version() == api_version && t.kind == kind)
            .cloned()
    }

    /// One entry per stored (group, plural) pair (versions collapsed).
    pub fn storage_types(&self) -> Vec<Arc<ResourceType>> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for t in self.types.values() {
            if seen.insert((t.group.clone(), t.plural.clone())) {
                out.push(t.clone());
            }
        }
        out
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.values()
    }

    /// Groups with their versions (preferred first).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (g, v, _) in self.types.keys() {
            let e = m.entry(g.clone()).or_default();
            if !e.contains(v) {
                e.push(v.clone());
            }
        }
        m.into_iter()
            .map(|(g, mut vs)| {
                let pref = self.preferred.get(&g).cloned();
                vs.sort_by_key(|v| (Some(v) != pref.as_ref(), version_priority(v)));
                (g, vs)
            })
            .collect()
    }

    pub fn resources_of(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.types
            .values()
            .filter(|t| t.group == group && t.version == version)
            .cloned()
            .collect()
    }

    /// Register the types of one CRD (replacing its previous registration).
    pub fn register_crd(
        &mut self,
        crd_name: &str,
        types: Vec<ResourceType>,
        preferred: Option<String>,
    ) {
        self.unregister_crd(crd_name);
        for t in types {
            if let Some(p) = &preferred {
                self.preferred.insert(t.group.clone(), p.clone());
            }
            self.types.insert(
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(t),
            );
        }
    }

    pub fn unregister_crd(&mut self, crd_name: &str) {
        let before: Vec<String> = self
            .types
            .values()
            .filter(|t| t.custom.as_ref().is_some_and(|c| c.crd_name == crd_name))
            .map(|t| t.group.clone())
            .collect();
        self.types
            .retain(|_, t| t.custom.as_ref().is_none_or(|c| c.crd_name != crd_name));
        for g in before {
            if !self.types.keys().any(|(tg, _, _)| tg == &g) {
                self.preferred.remove(&g);
            }
        }
    }
}

/// Kubernetes version ordering: GA > beta > alpha, higher numbers first.
pub fn version_priority(v: &str) -> (u8, i64, i64) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major: i64 = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (class, minor) = if tail.is_empty() {
        (0, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (1, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (2, n.parse().unwrap_or(0))
    } else {
        (3, 0)
    };
    (class, -major, -minor)
}

/// Why a CRD could not be turned into served types.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A required field is missing or has the wrong type.
    #[error("{0}")]
    Field(String),
    /// A version's schema does not compile.
    #[error("spec.versions[{version}].schema.openAPIV3Schema: {source}")]
    Schema {
        version: String,
        #[source]
        source: super::schema::SchemaError,
    },
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// The served resource types of a CRD object (one per served version), and its preferred version.
pub fn crd_types(crd: &Value) -> Result<(Vec<ResourceType>, Option<String>), CrdError> {
    let crd_name = str_at(crd, "/metadata/name")
        .ok_or_else(|| CrdError::Field("metadata.name: Required value".into()))?;
    let group = str_at(crd, "/spec/group")
        .ok_or_else(|| CrdError::Field("spec.group: Required value".into()))?;
    let plural = str_at(crd, "/spec/names/plural")
        .ok_or_else(|| CrdError::Field("spec.names.plural: Required value".into()))?;
    let kind = str_at(crd, "/spec/names/kind")
        .ok_or_else(|| CrdError::Field("spec.names.kind: Required value".into()))?;
    let singular = str_at(crd, "/spec/names/singular")
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let list_kind = str_at(crd, "/spec/names/listKind")
        .map(str::to_string)
        .unwrap_or_else(|| format!("{kind}List"));
    let scope = str_at(crd, "/spec/scope").unwrap_or("Namespaced");
    let strs = |p: &str| -> Vec<String> {
        crd.pointer(p)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let short_names = strs("/spec/names/shortNames");
    let categories = strs("/spec/names/categories");
    if format!("{plural}.{group}") != crd_name {
        return Err(CrdError::Field(format!(
            "metadata.name: Invalid value: \"{crd_name}\": must be spec.names.plural+\".\"+spec.group"
        )));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .ok_or_else(|| CrdError::Field("spec.versions: Invalid value: null: must have exactly one version marked as storage version".into()))?;
    let mut out = Vec::new();
    let mut served_names = Vec::new();
    for v in versions {
        let name = str_at(v, "/name")
            .ok_or_else(|| CrdError::Field("spec.versions[].name: Required value".into()))?;
        if !v.get("served").and_then(Value::as_bool).unwrap_or(false) {
            continue;
        }
        served_names.push(name.to_string());
        let schema = match v.pointer("/schema/openAPIV3Schema") {
            Some(s) => Some(Arc::new(Schema::compile(s).map_err(|source| {
                CrdError::Schema {
                    version: name.to_string(),
                    source,
                }
            })?)),
            None => None,
        };
        let status = v.pointer("/subresources/status").is_some();
        let scale = v.pointer("/subresources/scale").map(|s| ScaleSpec {
            spec_replicas_path: str_at(s, "/specReplicasPath")
                .unwrap_or(".spec.replicas")
                .to_string(),
            status_replicas_path: str_at(s, "/statusReplicasPath")
                .unwrap_or(".status.replicas")
                .to_string(),
            label_selector_path: str_at(s, "/labelSelectorPath").map(str::to_string),
        });
        let printer_columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: str_at(c, "/name").unwrap_or("").to_string(),
                        type_: str_at(c, "/type").unwrap_or("string").to_string(),
                        format: str_at(c, "/format").unwrap_or("").to_string(),
                        description: str_at(c, "/description").unwrap_or("").to_string(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        json_path: str_at(c, "/jsonPath").unwrap_or("").to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ResourceType {
            group: group.to_string(),
            version: name.to_string(),
            plural: plural.to_string(),
            singular: singular.clone(),
            kind: kind.to_string(),
            list_kind: list_kind.clone(),
            namespaced: scope == "Namespaced",
            short_names: short_names.clone(),
            status_subresource: status,
            scale,
            generation: true,
            custom: Some(CustomInfo {
                crd_name: crd_name.to_string(),
                schema,
                printer_columns,
                categories: categories.clone(),
                storage: v.get("storage").and_then(Value::as_bool).unwrap_or(false),
            }),
        });
    }
    served_names.sort_by_key(|v| version_priority(v));
    Ok((out, served_names.into_iter().next()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_order_ga_beta_alpha() {
        let mut v = vec!["v1alpha1", "v1beta1", "v2", "v1", "v1beta2"];
        v.sort_by_key(|x| version_priority(x));
        assert_eq!(v, vec!["v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }

    #[test]
    fn builtin_storage_prefix_omits_core_group() {
        let r = Registry::with_builtins();
        let secrets = r.get("", "v1", "secrets").expect("secrets registered");
        assert_eq!(secrets.storage_prefix(), "secrets");
        let deploy = r
            .get("apps", "v1", "deployments")
            .expect("deployments registered");
        assert_eq!(deploy.storage_prefix(), "deployments");
        let crd = r
            .get(CRD_GROUP, "v1", CRD_RESOURCE)
            .expect("crds registered");
        assert_eq!(
            crd.storage_prefix(),
            "apiextensions.k8s.io/customresourcedefinitions"
        );
        assert!(deploy.scale.is_some());
    }
}
