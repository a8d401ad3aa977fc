//! The API emulator driven by the real `kubectl` (exit codes, output, JSON).

use crate::apiserver_support;

use std::path::{Path, PathBuf};

use apiserver_support::{shared_crds, start};
use serde_json::Value;

struct Kubectl {
    kubeconfig: PathBuf,
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    async fn run(&self, args: &[&str]) -> Out {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .await
            .unwrap_or_else(|e| panic!("kubectl not found ({e}): install kubectl v1.32 (https://dl.k8s.io/release/v1.32.0/bin/linux/amd64/kubectl into /usr/local/bin)"));
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        }
    }

    async fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args).await;
        assert_eq!(
            o.code, 0,
            "kubectl {args:?} failed: {}\n{}",
            o.stderr, o.stdout
        );
        if !o.stderr.is_empty() {
            eprintln!("kubectl {args:?} stderr: {}", o.stderr);
        }
        o.stdout
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let s = self.ok(&a).await;
        serde_json::from_str(&s)
            .unwrap_or_else(|e| panic!("kubectl {args:?} printed no JSON ({e}): {s}"))
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write manifest");
    p.to_string_lossy().to_string()
}

const MANIFESTS: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: demo
  namespace: clusters
data:
  a: "1"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: kube-apiserver
  namespace: clusters
  labels: {app: kube-apiserver}
spec:
  replicas: 3
  selector:
    matchLabels: {app: kube-apiserver}
  template:
    metadata:
      labels: {app: kube-apiserver}
    spec:
      containers:
      - name: kas
        image: kas:1
      - name: konnectivity
        image: konn:1
"#;

#[tokio::test]
async fn kubectl_workflow_on_builtin_kinds() {
    let env = start(vec![]).await;
    let kc = env.dir.path().join("kubeconfig");
    env.server
        .write_kubeconfig(&kc, "mgmt-a")
        .expect("kubeconfig");
    let k = Kubectl { kubeconfig: kc };

    let v: Value =
        serde_json::from_str(&k.ok(&["version", "-o", "json"]).await).expect("version json");
    assert!(
        v["serverVersion"]["gitVersion"]
            .as_str()
            .is_some_and(|s| s.starts_with("v1.3")),
        "{v}"
    );
    let ns = k.ok(&["get", "namespaces"]).await;
    assert!(
        ns.starts_with("NAME") && ns.contains("default") && ns.contains("kube-system"),
        "{ns}"
    );

    k.ok(&["create", "namespace", "clusters"]).await;
    let file = write(env.dir.path(), "m.yaml", MANIFESTS);
    let out = k.ok(&["apply", "-f", &file]).await;
    assert!(
        out.contains("configmap/demo created")
            && out.contains("deployment.apps/kube-apiserver created"),
        "{out}"
    );
    let out = k.ok(&["apply", "-f", &file]).await;
    assert!(out.contains("configmap/demo unchanged"), "{out}");

    // a `v1 List`: kubectl reads /openapi/v2 for it; the server still
    // refuses an unknown field of an item (strict field validation)
    let list = write(
        env.dir.path(),
        "list.yaml",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: listed, namespace: clusters}\n  data: {k: v}\n",
    );
    let out = k.ok(&["apply", "-f", &list]).await;
    assert!(out.contains("configmap/listed created"), "{out}");
    let out = k.ok(&["apply", "-f", &list]).await;
    assert!(out.contains("configmap/listed unchanged"), "{out}");
    let bad = write(
        env.dir.path(),
        "bad-list.yaml",
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: listed, namespace: clusters}\n  bogus: 1\n",
    );
    let out = k.run(&["apply", "-f", &bad]).await;
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("unknown field \"bogus\""), "{}", out.stderr);

    let cm = k
        .json(&["get", "configmap", "demo", "-n", "clusters"])
        .await;
    assert_eq!(cm["data"]["a"], "1");
    assert!(
        cm["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    // patch types
    k.ok(&[
        "patch",
        "configmap",
        "demo",
        "-n",
        "clusters",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "configmap",
        "demo",
        "-n",
        "clusters",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "deployment",
        "kube-apiserver",
        "-n",
        "clusters",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"kas","image":"kas:2"}]}}}}"#,
    ])
    .await;
    let cm = k.json(&["get", "cm", "demo", "-n", "clusters"]).await;
    assert_eq!(
        (cm["data"]["b"].as_str(), cm["data"]["c"].as_str()),
        (Some("2"), Some("3"))
    );
    let d = k
        .json(&["get", "deploy", "kube-apiserver", "-n", "clusters"])
        .await;
    let containers = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 2);
    assert_eq!(containers[0]["image"], "kas:2");

    // scale
    let out = k
        .ok(&[
            "scale",
            "deployment",
            "kube-apiserver",
            "-n",
            "clusters",
            "--replicas=0",
        ])
        .await;
    assert!(out.contains("scaled"), "{out}");
    let r = k
        .ok(&[
            "get",
            "deploy",
            "kube-apiserver",
            "-n",
            "clusters",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .await;
    assert_eq!(r, "0");
    let table = k.ok(&["get", "deployments", "-n", "clusters"]).await;
    assert!(
        table.starts_with("NAME") && table.contains("kube-apiserver"),
        "{table}"
    );

    // server-side apply
    let ssa = write(
        env.dir.path(),
        "ssa.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: clusters\ndata:\n  k: v\n",
    );
    let out = k.ok(&["apply", "--server-side", "-f", &ssa]).await;
    assert!(out.contains("configmap/ssa serverside-applied"), "{out}");

    // stale resourceVersion through kubectl replace -> conflict
    let mut stale = k.json(&["get", "cm", "demo", "-n", "clusters"]).await;
    k.ok(&[
        "patch",
        "configmap",
        "demo",
        "-n",
        "clusters",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"d":"4"}}"#,
    ])
    .await;
    stale["data"]["e"] = Value::from("5");
    let stale_file = write(env.dir.path(), "stale.json", &stale.to_string());
    let o = k.run(&["replace", "-f", &stale_file]).await;
    assert_eq!(o.code, 1, "{}", o.stdout);
    assert!(
        o.stderr.contains("Error from server (Conflict)")
            && o.stderr.contains("the object has been modified"),
        "{}",
        o.stderr
    );

    // delete and NotFound
    let out = k
        .ok(&["delete", "configmap", "demo", "-n", "clusters"])
        .await;
    assert!(out.contains("configmap \"demo\" deleted"), "{out}");
    let o = k.run(&["get", "configmap", "demo", "-n", "clusters"]).await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains("Error from server (NotFound): configmaps \"demo\" not found"),
        "{}",
        o.stderr
    );

    // namespace deletion (kubectl waits until it is gone)
    let out = k.ok(&["delete", "namespace", "clusters"]).await;
    assert!(out.contains("namespace \"clusters\" deleted"), "{out}");
    let o = k.run(&["get", "namespace", "clusters"]).await;
    assert_eq!(o.code, 1, "{}", o.stdout);
}

#[tokio::test]
async fn kubectl_with_hypershift_crds() {
    let Some(crds) = shared_crds() else { return };
    let env = start(vec![crds]).await;
    let kc = env.dir.path().join("kubeconfig");
    env.server
        .write_kubeconfig(&kc, "mgmt-a")
        .expect("kubeconfig");
    let k = Kubectl { kubeconfig: kc };

    let crds = k.ok(&["get", "crd"]).await;
    assert!(
        crds.contains("hostedclusters.hypershift.openshift.io"),
        "{crds}"
    );
    k.ok(&["create", "namespace", "clusters"]).await;
    let hc = r#"
apiVersion: hypershift.openshift.io/v1beta1
kind: HostedCluster
metadata:
  name: demo
  namespace: clusters
spec:
  release:
    image: quay.io/openshift-release-dev/ocp-release:4.17.0-multi
  pullSecret:
    name: demo-pull-secret
  platform:
    type: None
  networking:
    networkType: OVNKubernetes
    clusterNetwork: [{cidr: 10.132.0.0/14}]
    serviceNetwork: [{cidr: 172.31.0.0/16}]
  etcd:
    managementType: Managed
    managed:
      storage:
        type: PersistentVolume
        persistentVolume: {size: 8Gi}
  services:
  - {service: APIServer, servicePublishingStrategy: {type: Route}}
  - {service: OAuthServer, servicePublishingStrategy: {type: Route}}
  - {service: Konnectivity, servicePublishingStrategy: {type: Route}}
  - {service: Ignition, servicePublishingStrategy: {type: Route}}
"#;
    let file = write(env.dir.path(), "hc.yaml", hc);
    let out = k.ok(&["apply", "-f", &file]).await;
    assert!(
        out.contains("hostedcluster.hypershift.openshift.io/demo created"),
        "{out}"
    );
    let list = k.ok(&["get", "hostedclusters", "-A"]).await;
    assert!(
        list.contains("demo") && list.contains("NAMESPACE"),
        "{list}"
    );
    assert!(
        list.contains("AVAILABLE") && list.contains("PROGRESSING"),
        "CRD printer columns: {list}"
    );
    let got = k.json(&["get", "hc", "demo", "-n", "clusters"]).await;
    assert_eq!(got["spec"]["platform"]["type"], "None");

    k.ok(&[
        "patch",
        "hostedcluster",
        "demo",
        "-n",
        "clusters",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"pausedUntil":"true"}}"#,
    ])
    .await;
    let o = k
        .run(&[
            "patch",
            "hostedcluster",
            "demo",
            "-n",
            "clusters",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"pausedUntil":"soon"}}"#,
        ])
        .await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("is invalid") && o.stderr.contains("spec.pausedUntil"),
        "{}",
        o.stderr
    );
    let o = k
        .run(&[
            "patch",
            "hostedcluster",
            "demo",
            "-n",
            "clusters",
            "-p",
            r#"{"spec":{"pausedUntil":"true"}}"#,
        ])
        .await;
    assert_eq!(
        o.code, 1,
        "strategic merge patch on a custom resource must fail"
    );

    let out = k
        .ok(&["delete", "hostedcluster", "demo", "-n", "clusters"])
        .await;
    assert!(out.contains("deleted"), "{out}");
}

const STORAGE: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: sandbox-csi
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: csi.sandbox.hcp-dr.io
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: sandbox-csi-snapshots
driver: csi.sandbox.hcp-dr.io
deletionPolicy: Delete
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata:
  name: guest-disk
  namespace: clusters-vm
spec:
  source: {persistentVolumeClaimName: pvc-guest}
"#;

/// The storage kinds a KubeVirt guest-volume backup touches: the built-in
/// StorageClass (defaults, `NAME (default)`, immutable fields) and the
/// snapshot CRDs (the real ones, else the fallback ones).
#[tokio::test]
async fn kubectl_on_storage_classes_and_volume_snapshots() {
    let (crds, from) = hcp_dr_e2e::crds::crd_dir();
    eprintln!("CRDs: {from}");
    let env = start(vec![crds]).await;
    let kc = env.dir.path().join("kubeconfig");
    env.server
        .write_kubeconfig(&kc, "mgmt-a")
        .expect("kubeconfig");
    let k = Kubectl { kubeconfig: kc };

    k.ok(&["create", "namespace", "clusters-vm"]).await;
    let file = write(env.dir.path(), "storage.yaml", STORAGE);
    let out = k.ok(&["apply", "-f", &file]).await;
    assert!(
        out.contains("storageclass.storage.k8s.io/sandbox-csi created")
            && out.contains("volumesnapshotclass.snapshot.storage.k8s.io/sandbox-csi-snapshots created")
            && out.contains("volumesnapshot.snapshot.storage.k8s.io/guest-disk created"),
        "{out}"
    );
    let out = k.ok(&["apply", "-f", &file]).await;
    assert!(out.contains("storageclass.storage.k8s.io/sandbox-csi unchanged"), "{out}");

    let table = k.ok(&["get", "storageclass"]).await;
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "PROVISIONER", "RECLAIMPOLICY", "VOLUMEBINDINGMODE", "ALLOWVOLUMEEXPANSION", "AGE"] {
        assert!(header.contains(column), "{table}");
    }
    assert!(
        table.contains("sandbox-csi (default)") && table.contains("csi.sandbox.hcp-dr.io") && table.contains("Delete") && table.contains("Immediate"),
        "{table}"
    );
    let sc = k.json(&["get", "sc", "sandbox-csi"]).await;
    assert_eq!((sc["reclaimPolicy"].as_str(), sc["volumeBindingMode"].as_str()), (Some("Delete"), Some("Immediate")));

    let o = k
        .run(&["patch", "storageclass", "sandbox-csi", "--type", "merge", "-p", r#"{"reclaimPolicy":"Retain"}"#])
        .await;
    assert_eq!(o.code, 1, "{}", o.stdout);
    assert!(
        o.stderr.contains("The StorageClass \"sandbox-csi\" is invalid: reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden."),
        "{}",
        o.stderr
    );

    let list = k.ok(&["get", "volumesnapshot", "-A"]).await;
    assert!(
        list.contains("NAMESPACE") && list.contains("SOURCEPVC") && list.contains("clusters-vm") && list.contains("guest-disk") && list.contains("pvc-guest"),
        "{list}"
    );
    let classes = k.ok(&["get", "vsclass"]).await;
    assert!(classes.contains("sandbox-csi-snapshots") && classes.contains("DRIVER"), "{classes}");
    // exactly one source (the CRD's rule)
    let both = write(
        env.dir.path(),
        "both.yaml",
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {name: both, namespace: clusters-vm}\nspec:\n  source: {persistentVolumeClaimName: a, volumeSnapshotContentName: b}\n",
    );
    let o = k.run(&["apply", "-f", &both]).await;
    assert_eq!(o.code, 1, "{}", o.stdout);
    assert!(o.stderr.contains("exactly one of volumeSnapshotContentName and persistentVolumeClaimName must be set"), "{}", o.stderr);
}
