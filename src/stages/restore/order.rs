//! The order objects are replayed in, as data: each class says what it
//! matches and why it comes where it does. Objects no class names go just
//! before the HostedCluster (they are in an exported group, so they belong
//! to the control plane).

use serde_json::Value;

/// One step of the replay order.
pub struct Class {
    pub name: &'static str,
    pub reason: &'static str,
    matches: fn(group: &str, kind: &str) -> bool,
}

fn group_of(obj: &Value) -> &str {
    obj["apiVersion"].as_str().and_then(|v| v.rsplit_once('/')).map(|(g, _)| g).unwrap_or("")
}

fn infra(group: &str) -> bool {
    group.ends_with(".cluster.x-k8s.io") || group.starts_with("capi-provider.")
}

/// The replay order, first to last.
pub const ORDER: &[Class] = &[
    Class {
        name: "secrets",
        reason: "everything else references them: pull secret, etcd encryption key, etcd PKI, CAPI bootstrap data",
        matches: |g, k| g.is_empty() && k == "Secret",
    },
    Class {
        name: "InfraEnvs",
        reason: "Agent platform: the hosts' discovery environment, which the Agents and BareMetalHosts name by label",
        matches: |g, k| g == "agent-install.openshift.io" && k == "InfraEnv",
    },
    Class {
        name: "NMStateConfigs",
        reason: "Agent platform: the hosts' static network configuration, selected by the InfraEnv",
        matches: |g, k| g == "agent-install.openshift.io" && k == "NMStateConfig",
    },
    Class {
        name: "Agents",
        reason: "Agent platform: bound to the cluster, approved, their status written back; before their BareMetalHosts (once metal3 has a host back, the assisted-service would register an Agent for it itself) and the AgentMachines, which find them",
        matches: |g, k| g == "agent-install.openshift.io" && k == "Agent",
    },
    Class {
        name: "BareMetalHosts",
        reason: "Agent platform: created with their status in the baremetalhost.metal3.io/status annotation, so metal3 adopts the provisioned hosts instead of inspecting or provisioning them",
        matches: |g, k| g == "metal3.io" && k == "BareMetalHost",
    },
    Class {
        name: "HostedControlPlane",
        reason: "carries restoreSnapshotURL; replayed before the HostedCluster so HyperShift adopts it rather than creating one without the URL",
        matches: |g, k| g == "hypershift.openshift.io" && k == "HostedControlPlane",
    },
    Class {
        name: "Cluster",
        reason: "the Cluster API root every machine object points at",
        matches: |g, k| g == "cluster.x-k8s.io" && k == "Cluster",
    },
    Class {
        name: "platform cluster",
        reason: "Cluster.spec.infrastructureRef names it (AWSCluster, AgentCluster, KubevirtCluster, ...)",
        matches: |g, k| infra(g) && k.ends_with("Cluster") && !k.ends_with("MachineTemplate"),
    },
    Class {
        name: "platform templates",
        reason: "MachineDeployments and MachineSets reference them",
        matches: |g, k| infra(g) && k.ends_with("Template"),
    },
    Class {
        name: "platform machines",
        reason: "existing Machines point at them; replayed before the Machines so they are adopted, not recreated",
        matches: |g, k| infra(g) && k.ends_with("Machine"),
    },
    Class {
        name: "MachineDeployments",
        reason: "own the MachineSets",
        matches: |g, k| g == "cluster.x-k8s.io" && k == "MachineDeployment",
    },
    Class {
        name: "MachineSets",
        reason: "own the Machines",
        matches: |g, k| g == "cluster.x-k8s.io" && k == "MachineSet",
    },
    Class {
        name: "Machines",
        reason: "the existing nodes: replayed so CAPI adopts them instead of provisioning new ones",
        matches: |g, k| g == "cluster.x-k8s.io" && k == "Machine",
    },
    Class {
        name: "other control-plane objects",
        reason: "objects of exported groups hcp-dr has no rule for; before the HostedCluster so it finds them",
        matches: |g, k| !(g == "hypershift.openshift.io" && matches!(k, "HostedCluster" | "NodePool")),
    },
    Class {
        name: "HostedCluster",
        reason: "last but the NodePools: HyperShift reconciles everything above into a control plane restored from the snapshot",
        matches: |g, k| g == "hypershift.openshift.io" && k == "HostedCluster",
    },
    Class {
        name: "NodePools",
        reason: "reference the HostedCluster",
        matches: |g, k| g == "hypershift.openshift.io" && k == "NodePool",
    },
];

/// The index in [`ORDER`] of the class an object belongs to.
pub fn rank(obj: &Value) -> usize {
    let (group, kind) = (group_of(obj), obj["kind"].as_str().unwrap_or(""));
    ORDER.iter().position(|c| (c.matches)(group, kind)).unwrap_or(ORDER.len())
}

/// Sort objects into replay order (stable: within a class, as given).
pub fn sort(objects: &mut [Value]) {
    objects.sort_by_key(rank);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(api_version: &str, kind: &str) -> Value {
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": kind}})
    }

    #[test]
    fn documented_order() {
        let mut objects = vec![
            obj("hypershift.openshift.io/v1beta1", "NodePool"),
            obj("hypershift.openshift.io/v1beta1", "HostedCluster"),
            obj("cluster.x-k8s.io/v1beta1", "Machine"),
            obj("cluster.x-k8s.io/v1beta1", "MachineSet"),
            obj("cluster.x-k8s.io/v1beta1", "MachineDeployment"),
            obj("infrastructure.cluster.x-k8s.io/v1beta2", "AWSMachine"),
            obj("infrastructure.cluster.x-k8s.io/v1beta2", "AWSMachineTemplate"),
            obj("infrastructure.cluster.x-k8s.io/v1beta2", "AWSCluster"),
            obj("cluster.x-k8s.io/v1beta1", "Cluster"),
            obj("hypershift.openshift.io/v1beta1", "HostedControlPlane"),
            obj("capi-provider.agent-install.openshift.io/v1beta1", "AgentMachine"),
            obj("agent-install.openshift.io/v1beta1", "Agent"),
            obj("metal3.io/v1alpha1", "BareMetalHost"),
            obj("agent-install.openshift.io/v1beta1", "NMStateConfig"),
            obj("agent-install.openshift.io/v1beta1", "InfraEnv"),
            obj("v1", "Secret"),
        ];
        sort(&mut objects);
        let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "Secret",
                "InfraEnv",
                "NMStateConfig",
                "Agent",
                "BareMetalHost",
                "HostedControlPlane",
                "Cluster",
                "AWSCluster",
                "AWSMachineTemplate",
                "AWSMachine",
                "AgentMachine",
                "MachineDeployment",
                "MachineSet",
                "Machine",
                "HostedCluster",
                "NodePool"
            ]
        );
    }

    #[test]
    fn every_class_has_a_reason() {
        assert!(ORDER.iter().all(|c| c.reason.len() > 10));
        // something unknown lands before the HostedCluster, never after it
        let unknown = rank(&obj("hypershift.openshift.io/v1beta1", "ControlPlaneComponent"));
        assert!(unknown < rank(&obj("hypershift.openshift.io/v1beta1", "HostedCluster")));
    }
}
