//! The storage of a KubeVirt management cluster: the emulator's StorageClass
//! (defaults, immutable fields, the default-class admission) and PVC data
//! sources; a guest volume ([`hcp_dr_e2e::sandbox::guest_volume_on`])
//! snapshotted by the simulated CSI snapshot controller, a claim restored
//! from the snapshot, a snapshot with a missing class, deletion with
//! `Delete` and `Retain`; the Job controller (complete, backoff limit,
//! deadline, garbage collection); and hcp-dr's volume-mover pods run as
//! local processes of the real hcp-dr binary (the archive fetched through
//! the pod IP when `hcp-dr volume-mover` exists). Needs `etcd` and a built
//! hcp-dr (`cargo build --workspace`).

use crate::operator_support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hcp_dr_e2e::operator::jobs::JOB_TRACKING_FINALIZER;
use hcp_dr_e2e::operator::snapshots::{
    CONTENT_BOUND_PROTECTION, PVC_AS_SOURCE_PROTECTION, SANDBOX_CSI_DRIVER, SANDBOX_SNAPSHOT_CLASS,
    SANDBOX_STORAGE_CLASS, SNAPSHOT_AS_SOURCE_PROTECTION, SNAPSHOT_BOUND_PROTECTION, snapshot_dir,
};
use hcp_dr_e2e::operator::volume_mover::{MOVER_ANNOTATION, log_path};
use hcp_dr_e2e::sandbox::{guest_volume_on, install_storage};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, PropagationPolicy};
use operator_support::*;
use serde_json::{Value, json};

const HC: &str = "vm";
const HCP_NS: &str = "clusters-vm";

fn str_at<'a>(obj: &'a Value, ptr: &str) -> Option<&'a str> {
    obj.pointer(ptr).and_then(Value::as_str)
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn storage_classes(m: &Mgmt) -> Api<DynamicObject> {
    m.api("storage.k8s.io", "v1", "StorageClass", "storageclasses", None)
}
fn pvcs(m: &Mgmt, ns: &str) -> Api<DynamicObject> {
    m.api("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", Some(ns))
}
fn snapshots(m: &Mgmt, ns: &str) -> Api<DynamicObject> {
    m.api("snapshot.storage.k8s.io", "v1", "VolumeSnapshot", "volumesnapshots", Some(ns))
}
fn snapshot_classes(m: &Mgmt) -> Api<DynamicObject> {
    m.api("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass", "volumesnapshotclasses", None)
}
fn contents(m: &Mgmt) -> Api<DynamicObject> {
    m.api("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent", "volumesnapshotcontents", None)
}
fn jobs(m: &Mgmt, ns: &str) -> Api<DynamicObject> {
    m.api("batch", "v1", "Job", "jobs", Some(ns))
}
fn pods(m: &Mgmt, ns: &str) -> Api<DynamicObject> {
    m.api("", "v1", "Pod", "pods", Some(ns))
}

async fn items(api: &Api<DynamicObject>) -> Vec<Value> {
    api.list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("json"))
        .collect()
}

/// Create `obj`; the API server's refusal (status code, message) if any.
async fn try_create(api: &Api<DynamicObject>, obj: Value) -> Result<Value, (u16, String)> {
    let o: DynamicObject = serde_json::from_value(obj).expect("object");
    match api.create(&PostParams::default(), &o).await {
        Ok(created) => Ok(serde_json::to_value(created).expect("json")),
        Err(kube::Error::Api(s)) => Err((s.code, s.message)),
        Err(e) => panic!("create: {e}"),
    }
}

/// A merge patch the API server must refuse with 422; its message.
async fn refused_patch(api: &Api<DynamicObject>, name: &str, patch: Value) -> String {
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{patch}: {}", s.message);
            s.message
        }
        other => panic!("{patch} was accepted: {other:?}"),
    }
}

async fn ns(m: &Mgmt, name: &str) {
    let api = m.api("", "v1", "Namespace", "namespaces", None);
    if m.get(&api, name).await.is_none() {
        m.create(&api, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})).await;
    }
}

fn claim(name: &str, size: &str, extra: Value) -> Value {
    let mut pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        pvc["spec"][k] = v.clone();
    }
    pvc
}

fn snapshot_source(name: &str) -> Value {
    json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": name})
}

/// Every entry below `dir` (and `dir` itself as ""): kind, mode, mtime and
/// content or link target.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let path = e.expect("entry").path();
            let rel = path.strip_prefix(root).expect("below root").display().to_string();
            let m = std::fs::symlink_metadata(&path).expect("metadata");
            let desc = if m.file_type().is_symlink() {
                format!("link -> {} mtime {}", std::fs::read_link(&path).expect("link").display(), m.mtime())
            } else if m.is_dir() {
                walk(root, &path, out);
                format!("dir {:o} mtime {}", m.mode() & 0o7777, m.mtime())
            } else {
                format!("file {:o} mtime {}.{} {:?}", m.mode() & 0o7777, m.mtime(), m.mtime_nsec(), std::fs::read(&path).expect("read"))
            };
            out.insert(rel, desc);
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    let m = std::fs::metadata(dir).expect("metadata");
    out.insert(String::new(), format!("dir {:o} mtime {}", m.mode() & 0o7777, m.mtime()));
    out
}

/// A guest's files: text, a private file two levels down, an empty
/// directory, a symlink, an mtime in the past.
fn write_guest_files(dir: &Path) {
    std::fs::write(dir.join("disk.img"), b"guest disk image").expect("write");
    std::fs::create_dir_all(dir.join("etc/ssh")).expect("mkdir");
    std::fs::write(dir.join("etc/ssh/host_key"), b"not a real key").expect("write");
    std::fs::set_permissions(dir.join("etc/ssh/host_key"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::create_dir(dir.join("empty")).expect("mkdir");
    std::os::unix::fs::symlink("disk.img", dir.join("current")).expect("symlink");
    let past = SystemTime::now() - Duration::from_secs(30 * 86_400);
    std::fs::File::options().write(true).open(dir.join("disk.img")).expect("open").set_modified(past).expect("mtime");
}

fn kubevirt_platform() -> (Value, Value) {
    (
        json!({"type": "KubeVirt", "kubevirt": {"baseDomainPassthrough": true}}),
        json!({"type": "KubeVirt", "kubevirt": {"compute": {"cores": 2, "memory": "8Gi"},
               "rootVolume": {"type": "Persistent", "persistent": {"size": "32Gi"}}}}),
    )
}

/// The events recorded about `name` in `ns`, as `reason: message`.
async fn events_of(m: &Mgmt, ns: &str, name: &str) -> Vec<String> {
    items(&m.api("", "v1", "Event", "events", Some(ns)))
        .await
        .into_iter()
        .filter(|e| str_at(e, "/involvedObject/name") == Some(name))
        .map(|e| format!("{}: {}", str_at(&e, "/reason").unwrap_or_default(), str_at(&e, "/message").unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_classes_and_claim_data_sources_follow_the_api_server_rules() {
    let m = Mgmt::start("mgmt-a").await;
    let classes = storage_classes(&m);

    // defaults
    let sc = try_create(&classes, json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "plain"}, "provisioner": "example.com/disks", "parameters": {"tier": "gold"}}))
    .await
    .expect("created");
    assert_eq!((sc["reclaimPolicy"].as_str(), sc["volumeBindingMode"].as_str()), (Some("Delete"), Some("Immediate")), "{sc}");

    // immutable fields (ValidateStorageClassUpdate)
    for (patch, said) in [
        (json!({"provisioner": "example.com/other"}), "provisioner: Forbidden: updates to provisioner are forbidden."),
        (json!({"parameters": {"tier": "silver"}}), "parameters: Forbidden: updates to parameters are forbidden."),
        (json!({"reclaimPolicy": "Retain"}), "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden."),
        (json!({"volumeBindingMode": "WaitForFirstConsumer"}), "volumeBindingMode: Invalid value: \"WaitForFirstConsumer\": field is immutable"),
    ] {
        let message = refused_patch(&classes, "plain", patch.clone()).await;
        assert!(message.starts_with("StorageClass.storage.k8s.io \"plain\" is invalid: ") && message.contains(said), "{patch}: {message}");
    }
    // what may change does
    classes
        .patch("plain", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}, "allowVolumeExpansion": true})))
        .await
        .expect("labels and allowVolumeExpansion may change");
    // create-time validation
    for (obj, said) in [
        (json!({"metadata": {"name": "bad-policy"}, "provisioner": "example.com/disks", "reclaimPolicy": "Recycle"}),
         "reclaimPolicy: Unsupported value: \"Recycle\": supported values: \"Delete\", \"Retain\""),
        (json!({"metadata": {"name": "no-provisioner"}}), "provisioner: Required value"),
        (json!({"metadata": {"name": "bad-mode"}, "provisioner": "example.com/disks", "volumeBindingMode": "Later"}),
         "volumeBindingMode: Unsupported value: \"Later\""),
    ] {
        let mut obj = obj;
        obj["apiVersion"] = json!("storage.k8s.io/v1");
        obj["kind"] = json!("StorageClass");
        let (code, message) = try_create(&classes, obj).await.expect_err("refused");
        assert_eq!(code, 422, "{message}");
        assert!(message.contains(said), "{message}");
    }

    // the sandbox's classes; the DefaultStorageClass admission
    install_storage(&m.client).await.expect("storage installed");
    install_storage(&m.client).await.expect("installing again is a no-op");
    let sc = m.get(&classes, SANDBOX_STORAGE_CLASS).await.expect("sandbox-csi");
    assert_eq!(sc["provisioner"], SANDBOX_CSI_DRIVER);
    assert_eq!(sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"], "true");
    let vsc = m.get(&snapshot_classes(&m), SANDBOX_SNAPSHOT_CLASS).await.expect("snapshot class");
    assert_eq!((vsc["driver"].as_str(), vsc["deletionPolicy"].as_str()), (Some(SANDBOX_CSI_DRIVER), Some("Delete")));

    ns(&m, "claims").await;
    let claims = pvcs(&m, "claims");
    let defaulted = try_create(&claims, claim("defaulted", "1Gi", json!({}))).await.expect("created");
    assert_eq!(defaulted["spec"]["storageClassName"], SANDBOX_STORAGE_CLASS, "{defaulted}");
    let classless = try_create(&claims, claim("classless", "1Gi", json!({"storageClassName": ""}))).await.expect("created");
    assert_eq!(classless["spec"]["storageClassName"], "", "\"\" asks for no class: {classless}");

    // dataSource and dataSourceRef are normalized on create
    let from_source = try_create(&claims, claim("from-source", "1Gi", json!({"dataSource": snapshot_source("s1")}))).await.expect("created");
    assert_eq!(from_source["spec"]["dataSourceRef"], snapshot_source("s1"), "{from_source}");
    let from_ref = try_create(&claims, claim("from-ref", "1Gi", json!({"dataSourceRef": snapshot_source("s2")}))).await.expect("created");
    assert_eq!(from_ref["spec"]["dataSource"], snapshot_source("s2"), "{from_ref}");
    for (extra, said) in [
        (json!({"dataSource": {"kind": "VolumeSnapshot", "name": "s"}}), "must be 'PersistentVolumeClaim' when referencing the default apiGroup"),
        (json!({"dataSource": snapshot_source("a"), "dataSourceRef": snapshot_source("b")}), "must match dataSourceRef"),
    ] {
        let (code, message) = try_create(&claims, claim("bad-source", "1Gi", extra)).await.expect_err("refused");
        assert_eq!(code, 422, "{message}");
        assert!(message.contains(said), "{message}");
    }
    let message = refused_patch(&claims, "from-source", json!({"spec": {"dataSource": snapshot_source("other")}})).await;
    assert!(message.contains("spec is immutable after creation"), "{message}");

    // Jobs: the selector and the pod labels are generated; a restartPolicy a Job cannot have is refused
    ns(&m, "batch").await;
    let job = try_create(&jobs(&m, "batch"), json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gen"},
        "spec": {"suspend": true, "template": {"metadata": {"labels": {"app": "x"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}))
    .await
    .expect("created");
    let uid = str_at(&job, "/metadata/uid").expect("uid");
    assert_eq!(job["spec"]["selector"], json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}), "{job}");
    let labels = &job["spec"]["template"]["metadata"]["labels"];
    for (k, v) in [("app", "x"), ("job-name", "gen"), ("batch.kubernetes.io/job-name", "gen"), ("controller-uid", uid),
        ("batch.kubernetes.io/controller-uid", uid)]
    {
        assert_eq!(labels[k], v, "{k}: {labels}");
    }
    assert_eq!((job["spec"]["backoffLimit"].as_i64(), job["spec"]["completions"].as_i64()), (Some(6), Some(1)));
    assert_eq!(job["metadata"]["labels"]["app"], "x", "a Job's labels default to its template's");
    let (code, message) = try_create(&jobs(&m, "batch"), json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "always"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
    .await
    .expect_err("refused");
    assert_eq!(code, 422);
    assert!(message.contains("spec.template.spec.restartPolicy: Unsupported value: \"Always\""), "{message}");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guest_volume_is_snapshotted_restored_and_deleted() {
    let _ = tracing_subscriber::fmt().with_env_filter("hcp_dr_e2e=info").with_test_writer().try_init();
    let m = Mgmt::start("mgmt-a").await;
    let state = m.dir.path().join("operator");
    install_storage(&m.client).await.expect("storage installed");
    let (hc_platform, np_platform) = kubevirt_platform();
    m.create_hosted_cluster_on(HC, "SingleReplica", 0, None, hc_platform, np_platform).await;

    // the guest's volume, as kubevirt-csi and CDI make it
    let (pvc_name, dir) = guest_volume_on(&m.client, &state, HC_NS, HC, "1Gi").await.expect("guest volume");
    assert!(pvc_name.starts_with("pvc-") && pvc_name.len() == 40, "{pvc_name}");
    let hc = m.get(&m.hc_api(), HC).await.expect("hc");
    let infra_id = str_at(&hc, "/spec/infraID").expect("infraID").to_string();
    let dv = m.get(&m.api("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes", Some(HCP_NS)), &pvc_name).await.expect("DataVolume");
    assert_eq!(dv["metadata"]["labels"]["hypershift.openshift.io/infra-id"], infra_id.as_str());
    assert_eq!((str_at(&dv, "/status/phase"), str_at(&dv, "/status/progress")), (Some("Succeeded"), Some("100.0%")), "{dv}");
    assert_eq!(dv["spec"]["storage"]["storageClassName"], SANDBOX_STORAGE_CLASS);
    let pvc = m.get(&pvcs(&m, HCP_NS), &pvc_name).await.expect("claim");
    assert_eq!(pvc["metadata"]["labels"]["hypershift.openshift.io/infra-id"], infra_id.as_str());
    let owner = &pvc["metadata"]["ownerReferences"][0];
    assert_eq!((owner["kind"].as_str(), owner["controller"].as_bool(), owner["uid"].as_str()),
        (Some("DataVolume"), Some(true), str_at(&dv, "/metadata/uid")));
    assert_eq!((str_at(&pvc, "/spec/storageClassName"), str_at(&pvc, "/spec/volumeMode"), str_at(&pvc, "/status/phase")),
        (Some(SANDBOX_STORAGE_CLASS), Some("Filesystem"), Some("Bound")), "{pvc}");
    assert_eq!(pvc["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"], SANDBOX_CSI_DRIVER);
    assert!(std::fs::read_dir(&dir).expect("dir").next().is_none(), "a new volume is empty: {}", dir.display());
    write_guest_files(&dir);
    let at_snapshot = tree(&dir);

    // a snapshot without a class gets the driver's default and is cut
    let vs_api = snapshots(&m, HCP_NS);
    m.create(&vs_api, json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "snap-1"}, "spec": {"source": {"persistentVolumeClaimName": pvc_name}}}))
    .await;
    let vs = wait_for("snapshot snap-1 ready", || async {
        m.get(&vs_api, "snap-1").await.filter(|v| v.pointer("/status/readyToUse") == Some(&json!(true)))
    })
    .await;
    assert_eq!(vs["spec"]["volumeSnapshotClassName"], SANDBOX_SNAPSHOT_CLASS, "{vs}");
    let fins = finalizers(&vs);
    assert!(fins.contains(&SNAPSHOT_AS_SOURCE_PROTECTION.to_string()) && fins.contains(&SNAPSHOT_BOUND_PROTECTION.to_string()), "{fins:?}");
    let vs_uid = str_at(&vs, "/metadata/uid").expect("uid");
    let content_name = format!("snapcontent-{vs_uid}");
    assert_eq!(str_at(&vs, "/status/boundVolumeSnapshotContentName"), Some(content_name.as_str()));
    assert_eq!(str_at(&vs, "/status/restoreSize"), Some("1Gi"));
    assert!(str_at(&vs, "/status/creationTime").is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok()), "{vs}");
    let content = m.get(&contents(&m), &content_name).await.expect("content");
    assert_eq!((str_at(&content, "/spec/driver"), str_at(&content, "/spec/deletionPolicy")), (Some(SANDBOX_CSI_DRIVER), Some("Delete")));
    assert_eq!(str_at(&content, "/spec/source/volumeHandle"), str_at(&pvc, "/spec/volumeName"));
    assert_eq!(str_at(&content, "/spec/volumeSnapshotClassName"), Some(SANDBOX_SNAPSHOT_CLASS));
    let r = &content["spec"]["volumeSnapshotRef"];
    assert_eq!(
        (r["kind"].as_str(), r["namespace"].as_str(), r["name"].as_str(), r["uid"].as_str(), r["apiVersion"].as_str()),
        (Some("VolumeSnapshot"), Some(HCP_NS), Some("snap-1"), Some(vs_uid), Some("snapshot.storage.k8s.io/v1"))
    );
    assert_eq!(finalizers(&content), vec![CONTENT_BOUND_PROTECTION.to_string()]);
    assert_eq!(content["status"]["readyToUse"], true);
    assert_eq!(content["status"]["restoreSize"], 1u64 << 30);
    assert!(content["status"]["creationTime"].as_i64().is_some_and(|t| t > 1_600_000_000_000_000_000), "unix nanos: {content}");
    assert!(str_at(&content, "/status/snapshotHandle").is_some());
    let snap_dir = snapshot_dir(&state, &content_name);
    assert_eq!(tree(&snap_dir), at_snapshot, "the snapshot is a copy of the volume");
    wait_for("the claim to lose pvc-as-source-protection", || async {
        let p = m.get(&pvcs(&m, HCP_NS), &pvc_name).await?;
        (!finalizers(&p).contains(&PVC_AS_SOURCE_PROTECTION.to_string())).then_some(())
    })
    .await;
    // the guest goes on writing: the snapshot does not change
    std::fs::write(dir.join("later.txt"), b"after the snapshot").expect("write");
    std::fs::write(dir.join("disk.img"), b"changed").expect("write");
    assert_eq!(tree(&snap_dir), at_snapshot);

    // a claim from the snapshot starts with its data
    let claims = pvcs(&m, HCP_NS);
    m.create(&claims, claim("restored", "1Gi", json!({"dataSource": snapshot_source("snap-1")}))).await;
    let restored = wait_for("claim restored bound", || async {
        m.get(&claims, "restored").await.filter(|p| str_at(p, "/status/phase") == Some("Bound"))
    })
    .await;
    assert_eq!(restored["spec"]["dataSourceRef"], snapshot_source("snap-1"));
    assert_eq!(restored["spec"]["storageClassName"], SANDBOX_STORAGE_CLASS, "the default class");
    let restored_dir = hcp_dr_e2e::operator::workloads::existing_pv_dir(&state, &restored).expect("restored data");
    assert_eq!(tree(&restored_dir), at_snapshot, "the restored volume holds the snapshot's files");

    // a claim smaller than the snapshot, and one of a class that does not exist, stay Pending
    m.create(&claims, claim("too-small", "512Mi", json!({"dataSource": snapshot_source("snap-1")}))).await;
    m.create(&claims, claim("no-class", "1Gi", json!({"storageClassName": "nope"}))).await;
    let said = wait_for("ProvisioningFailed events", || async {
        let small = events_of(&m, HCP_NS, "too-small").await;
        let none = events_of(&m, HCP_NS, "no-class").await;
        (!small.is_empty() && !none.is_empty()).then_some((small, none))
    })
    .await;
    assert!(said.0.iter().any(|e| e.starts_with("ProvisioningFailed: requested volume size 536870912 is less than the size 1073741824")), "{said:?}");
    assert!(said.1.iter().any(|e| e == "ProvisioningFailed: storageclass.storage.k8s.io \"nope\" not found"), "{said:?}");
    for name in ["too-small", "no-class"] {
        let p = m.get(&claims, name).await.expect("claim");
        assert_eq!(str_at(&p, "/status/phase"), Some("Pending"), "{p}");
    }

    // a snapshot of a class that does not exist reports it and is not cut
    m.create(&vs_api, json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "snap-nope"}, "spec": {"volumeSnapshotClassName": "nope", "source": {"persistentVolumeClaimName": pvc_name}}}))
    .await;
    let failed = wait_for("snap-nope's error", || async {
        m.get(&vs_api, "snap-nope").await.filter(|v| v.pointer("/status/error/message").is_some())
    })
    .await;
    let message = str_at(&failed, "/status/error/message").unwrap_or_default();
    assert!(message.contains("volumesnapshotclass.snapshot.storage.k8s.io \"nope\" not found"), "{message}");
    assert!(str_at(&failed, "/status/error/time").is_some());
    assert_eq!(failed["status"]["readyToUse"], false);
    assert!(finalizers(&failed).is_empty() && failed.pointer("/status/boundVolumeSnapshotContentName").is_none(), "{failed}");
    let failed_content = format!("snapcontent-{}", str_at(&failed, "/metadata/uid").expect("uid"));
    assert!(m.get(&contents(&m), &failed_content).await.is_none());

    // Retain: the content and its data outlive the snapshot
    m.create(&snapshot_classes(&m), json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "keep"}, "driver": SANDBOX_CSI_DRIVER, "deletionPolicy": "Retain"}))
    .await;
    m.create(&vs_api, json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "snap-keep"}, "spec": {"volumeSnapshotClassName": "keep", "source": {"persistentVolumeClaimName": pvc_name}}}))
    .await;
    let kept = wait_for("snap-keep ready", || async {
        m.get(&vs_api, "snap-keep").await.filter(|v| v.pointer("/status/readyToUse") == Some(&json!(true)))
    })
    .await;
    let kept_content = str_at(&kept, "/status/boundVolumeSnapshotContentName").expect("content").to_string();
    vs_api.delete("snap-keep", &DeleteParams::default()).await.expect("delete");
    wait_for("snap-keep gone", || async { m.get(&vs_api, "snap-keep").await.is_none().then_some(()) }).await;
    let retained = wait_for("the retained content released", || async {
        m.get(&contents(&m), &kept_content).await.filter(|c| finalizers(c).is_empty())
    })
    .await;
    assert_eq!(retained["spec"]["deletionPolicy"], "Retain");
    assert!(snapshot_dir(&state, &kept_content).join("etc/ssh/host_key").exists());

    // Delete: held while a claim is being provisioned from it, then gone with its content and data
    vs_api.delete("snap-1", &DeleteParams::default()).await.expect("delete");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = m.get(&vs_api, "snap-1").await.expect("held by the pending claim too-small");
    assert!(held.pointer("/metadata/deletionTimestamp").is_some() && finalizers(&held).contains(&SNAPSHOT_AS_SOURCE_PROTECTION.to_string()));
    assert!(snap_dir.exists());
    claims.delete("too-small", &DeleteParams::default()).await.expect("delete");
    wait_for("snap-1 gone", || async { m.get(&vs_api, "snap-1").await.is_none().then_some(()) }).await;
    wait_for("its content gone", || async { m.get(&contents(&m), &content_name).await.is_none().then_some(()) }).await;
    assert!(!snap_dir.exists(), "the snapshot's data is deleted");
    assert_eq!(tree(&restored_dir), at_snapshot, "the restored volume does not depend on the snapshot");
    m.stop().await;
}

/// The hcp-dr binary the volume-mover pods run (a build step when missing).
fn hcp_dr() -> PathBuf {
    match hcp_dr_e2e::drill::hcp_dr_binary() {
        Ok(bin) if bin.exists() => bin,
        Ok(bin) => panic!("{} does not exist: build it first (cargo build --workspace)", bin.display()),
        Err(e) => panic!("{e}"),
    }
}

/// Whether the hcp-dr built has `volume-mover`.
fn has_volume_mover(bin: &Path) -> bool {
    std::process::Command::new(bin)
        .args(["volume-mover", "--help"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn mover_job(name: &str, claim: &str, env: Value, backoff_limit: u32) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": backoff_limit,
            "template": {"metadata": {"labels": {"app": "hcp-dr-volume-mover"}, "annotations": {MOVER_ANNOTATION: "v1"}},
                "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "mover", "image": "quay.io/hcp-dr/hcp-dr:latest",
                        "command": ["hcp-dr", "volume-mover", "--dir", "/volume", "--port", "8443"],
                        "env": env,
                        "ports": [{"containerPort": 8443, "name": "mover"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/volume"}]}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}}}})
}

async fn job_pods(m: &Mgmt, ns: &str, job: &str) -> Vec<Value> {
    items(&pods(m, ns))
        .await
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job)
        .collect()
}

async fn wait_job_condition(m: &Mgmt, ns: &str, job: &str, type_: &str) -> Value {
    wait_for(&format!("Job {job} {type_}"), || async {
        m.get(&jobs(m, ns), job).await.filter(|j| has_condition(j, type_, "True"))
    })
    .await
}

fn condition_types(job: &Value) -> Vec<String> {
    job["status"]["conditions"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c["type"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_complete_fail_after_their_backoff_limit_and_meet_their_deadline() {
    let _ = tracing_subscriber::fmt().with_env_filter("hcp_dr_e2e=info").with_test_writer().try_init();
    let bin = hcp_dr();
    let m = Mgmt::start("mgmt-a").await;
    install_storage(&m.client).await.expect("storage installed");
    ns(&m, "batch").await;
    let claims = pvcs(&m, "batch");
    m.create(&claims, claim("scratch", "1Gi", json!({}))).await;

    // a mover without its token exits non-zero (as hcp-dr without volume-mover does): Failed, no retry with backoffLimit 0
    m.create(&jobs(&m, "batch"), mover_job("fails", "scratch", json!([]), 0)).await;
    let job = wait_job_condition(&m, "batch", "fails", "Failed").await;
    assert_eq!(condition_types(&job), ["FailureTarget", "Failed"], "{job}");
    let failed = job["status"]["conditions"].as_array().expect("conditions").iter().find(|c| c["type"] == "Failed").expect("Failed").clone();
    assert_eq!(failed["reason"], "BackoffLimitExceeded");
    assert_eq!((job["status"]["failed"].as_u64(), job["status"]["active"].as_u64()), (Some(1), Some(0)), "{job}");
    assert!(job.pointer("/status/startTime").is_some() && job.pointer("/status/completionTime").is_none());
    // counted once, for good
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let job = m.get(&jobs(&m, "batch"), "fails").await.expect("job");
    assert_eq!(job["status"]["failed"], 1, "{job}");
    assert!(job.pointer("/status/uncountedTerminatedPods/failed").is_none(), "{job}");
    let made = job_pods(&m, "batch", "fails").await;
    assert_eq!(made.len(), 1, "one pod, not retried: {made:?}");
    let pod = &made[0];
    let name = str_at(pod, "/metadata/name").expect("name");
    let suffix = name.strip_prefix("fails-").expect("named after the job");
    assert!(suffix.len() == 5 && suffix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()), "{name}");
    let uid = str_at(&job, "/metadata/uid").expect("uid");
    for (k, v) in [("batch.kubernetes.io/job-name", "fails"), ("job-name", "fails"), ("batch.kubernetes.io/controller-uid", uid),
        ("controller-uid", uid), ("app", "hcp-dr-volume-mover")]
    {
        assert_eq!(pod["metadata"]["labels"][k], v, "{k}: {pod}");
    }
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!((owner["kind"].as_str(), owner["uid"].as_str(), owner["controller"].as_bool(), owner["blockOwnerDeletion"].as_bool()),
        (Some("Job"), Some(uid), Some(true), Some(true)));
    assert!(!finalizers(pod).contains(&JOB_TRACKING_FINALIZER.to_string()), "counted pods are released: {pod}");
    assert_eq!(str_at(pod, "/status/phase"), Some("Failed"));
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert!(terminated["exitCode"].as_i64().is_some_and(|c| c != 0) && terminated["reason"] == "Error", "{pod}");
    assert!(terminated["message"].as_str().is_some_and(|m| !m.is_empty()), "the output's tail: {pod}");
    let log = log_path(&m.dir.path().join("operator"), "batch", name);
    assert!(std::fs::metadata(&log).is_ok(), "{} kept", log.display());
    eprintln!("{} (hcp-dr {}):\n{}", log.display(), bin.display(), terminated["message"].as_str().unwrap_or_default());

    // a pod that succeeds completes its Job (the test plays the kubelet of an ordinary pod whose container exited 0)
    let plain = |name: &str, deadline: Option<u64>| {
        let mut job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.invalid/sleep:1"}]}}}});
        if let Some(d) = deadline {
            job["spec"]["activeDeadlineSeconds"] = json!(d);
        }
        job
    };
    m.create(&jobs(&m, "batch"), plain("done", None)).await;
    let running = wait_for("Job done's pod running", || async {
        job_pods(&m, "batch", "done").await.into_iter().find(|p| str_at(p, "/status/phase") == Some("Running"))
    })
    .await;
    let job = wait_for("Job done active and ready", || async {
        m.get(&jobs(&m, "batch"), "done").await.filter(|j| j["status"]["ready"] == 1 && j["status"]["active"] == 1)
    })
    .await;
    assert!(job.pointer("/status/conditions").is_none_or(|c| c.as_array().is_some_and(Vec::is_empty)), "{job}");
    let pod_name = str_at(&running, "/metadata/name").expect("name");
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    pods(&m, "batch")
        .patch_status(pod_name, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Succeeded",
            "containerStatuses": [{"name": "main", "image": "registry.invalid/sleep:1", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}}]}})))
        .await
        .expect("pod status");
    let job = wait_job_condition(&m, "batch", "done", "Complete").await;
    assert_eq!(condition_types(&job), ["SuccessCriteriaMet", "Complete"], "{job}");
    assert_eq!((job["status"]["succeeded"].as_u64(), job["status"]["active"].as_u64()), (Some(1), Some(0)), "{job}");
    assert!(job.pointer("/status/completionTime").is_some());
    assert_eq!(job_pods(&m, "batch", "done").await.len(), 1);

    // activeDeadlineSeconds: the running pod is deleted, the Job fails
    m.create(&jobs(&m, "batch"), plain("slow", Some(2))).await;
    let job = wait_job_condition(&m, "batch", "slow", "Failed").await;
    let reasons: Vec<&str> = job["status"]["conditions"].as_array().expect("conditions").iter().filter_map(|c| c["reason"].as_str()).collect();
    assert_eq!(reasons, ["DeadlineExceeded", "DeadlineExceeded"], "{job}");
    assert_eq!(condition_types(&job), ["FailureTarget", "Failed"]);
    assert!(job_pods(&m, "batch", "slow").await.is_empty(), "the active pod is deleted");

    // deleting a Job (propagation Background, as kubectl does) removes its pods
    jobs(&m, "batch")
        .delete("done", &DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() })
        .await
        .expect("delete");
    wait_for("Job done's pods collected", || async { job_pods(&m, "batch", "done").await.is_empty().then_some(()) }).await;
    // batch/v1's default propagation orphans the pods: a running one stays, no longer owned nor held
    m.create(&jobs(&m, "batch"), plain("orphaned", None)).await;
    let pod = wait_for("Job orphaned's pod running", || async {
        job_pods(&m, "batch", "orphaned").await.into_iter().find(|p| str_at(p, "/status/phase") == Some("Running"))
    })
    .await;
    assert!(finalizers(&pod).contains(&JOB_TRACKING_FINALIZER.to_string()), "{pod}");
    jobs(&m, "batch").delete("orphaned", &DeleteParams::default()).await.expect("delete");
    let pod_name = str_at(&pod, "/metadata/name").expect("name").to_string();
    let orphan = wait_for("the orphaned pod released", || async {
        m.pod("batch", &pod_name).await.filter(|p| finalizers(p).is_empty())
    })
    .await;
    assert!(orphan.pointer("/metadata/ownerReferences").is_none_or(|r| r.as_array().is_some_and(Vec::is_empty)), "{orphan}");
    assert_eq!(str_at(&orphan, "/status/phase"), Some("Running"));
    m.stop().await;
}

/// An HTTP/1.1 request to a mover; (status, body).
async fn mover_request(ip: &str, port: u16, method: &str, path: &str, token: &str) -> (u16, Vec<u8>) {
    let stream = tokio::net::TcpStream::connect((ip, port)).await.expect("connect to the pod IP");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("{ip}:{port}"))
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes().to_vec();
    (status, body)
}

/// The entry names of a tar stream (ustar, GNU long names, pax paths),
/// without `./` or a trailing `/`.
fn tar_names(data: &[u8]) -> BTreeSet<String> {
    fn field(b: &[u8]) -> String {
        String::from_utf8_lossy(b.split(|c| *c == 0).next().unwrap_or_default()).to_string()
    }
    fn octal(b: &[u8]) -> usize {
        usize::from_str_radix(field(b).trim(), 8).unwrap_or(0)
    }
    let mut names = BTreeSet::new();
    let mut next_name: Option<String> = None;
    let mut at = 0;
    while at + 512 <= data.len() {
        let h = &data[at..at + 512];
        if h.iter().all(|b| *b == 0) {
            break;
        }
        let size = octal(&h[124..136]);
        let body = &data[(at + 512).min(data.len())..(at + 512 + size).min(data.len())];
        match h[156] {
            b'L' => next_name = Some(field(body)),
            b'x' => {
                next_name = String::from_utf8_lossy(body)
                    .lines()
                    .find_map(|l| l.split_once(" path=").map(|(_, p)| p.to_string()))
                    .or(next_name)
            }
            b'g' => {}
            _ => {
                let mut name = field(&h[0..100]);
                if &h[257..263] == b"ustar\0" && h[345] != 0 {
                    name = format!("{}/{name}", field(&h[345..500]));
                }
                let name = next_name.take().unwrap_or(name);
                let name = name.trim_start_matches("./").trim_end_matches('/').to_string();
                if !name.is_empty() && name != "." {
                    names.insert(name);
                }
            }
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn volume_mover_pods_run_hcp_dr_on_the_claims_data() {
    let _ = tracing_subscriber::fmt().with_env_filter("hcp_dr_e2e=info").with_test_writer().try_init();
    let bin = hcp_dr();
    let m = Mgmt::start("mgmt-a").await;
    let state = m.dir.path().join("operator");
    install_storage(&m.client).await.expect("storage installed");
    ns(&m, "movers").await;
    let claims = pvcs(&m, "movers");
    m.create(&claims, claim("guest-data", "1Gi", json!({}))).await;
    let pvc = wait_for("claim bound", || async {
        m.get(&claims, "guest-data").await.filter(|p| str_at(p, "/status/phase") == Some("Bound"))
    })
    .await;
    let dir = hcp_dr_e2e::operator::workloads::existing_pv_dir(&state, &pvc).expect("data dir");
    write_guest_files(&dir);

    // the token's Secret is missing: the container cannot be created
    let env = json!([{"name": "HCP_DR_MOVER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mover-token", "key": "token"}}},
                     {"name": "RUST_LOG", "value": "info"}]);
    m.create(&jobs(&m, "movers"), mover_job("mover", "guest-data", env, 0)).await;
    let waiting = wait_for("CreateContainerConfigError", || async {
        job_pods(&m, "movers", "mover").await.into_iter().find(|p| {
            p.pointer("/status/containerStatuses/0/state/waiting/reason") == Some(&json!("CreateContainerConfigError"))
        })
    })
    .await;
    assert_eq!(str_at(&waiting, "/status/phase"), Some("Pending"));
    assert_eq!(str_at(&waiting, "/status/containerStatuses/0/state/waiting/message"), Some("secret \"mover-token\" not found"));

    if !has_volume_mover(&bin) {
        eprintln!("SKIP: hcp-dr volume-mover not built yet ({} volume-mover --help fails); the mover's archive round trip not run", bin.display());
        m.stop().await;
        return;
    }
    let token = "sandbox-mover-token-0123456789abcdef";
    m.create(&m.api("", "v1", "Secret", "secrets", Some("movers")), json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "mover-token"}, "stringData": {"token": token}}))
    .await;
    let ready = wait_for("mover pod ready", || async {
        job_pods(&m, "movers", "mover").await.into_iter().find(|p| has_condition(p, "Ready", "True"))
    })
    .await;
    let pod_name = str_at(&ready, "/metadata/name").expect("name").to_string();
    let ip = str_at(&ready, "/status/podIP").expect("pod IP").to_string();
    assert!(ip.starts_with("127.") && ip != "127.0.0.1", "a pod IP of its own: {ip}");
    assert_eq!(ready["status"]["podIPs"][0]["ip"], ip.as_str());
    assert!(ready.pointer("/status/containerStatuses/0/state/running").is_some(), "{ready}");

    let (status, archive) = mover_request(&ip, 8443, "GET", "/v1/archive", token).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&archive));
    let expected: BTreeSet<String> = tree(&dir).into_keys().filter(|k| !k.is_empty()).collect();
    assert_eq!(tar_names(&archive), expected, "the archive holds the claim's files");
    let (status, _) = mover_request(&ip, 8443, "GET", "/v1/archive", "wrong-token-wrong-token").await;
    assert_eq!(status, 401, "a wrong token is refused");
    let (status, digest) = mover_request(&ip, 8443, "GET", "/v1/digest", token).await;
    assert_eq!(status, 200);
    let digest: Value = serde_json::from_slice(&digest).expect("digest JSON");
    assert!(digest["sha256"].as_str().is_some_and(|s| s.len() == 64), "{digest}");

    let (status, _) = mover_request(&ip, 8443, "POST", "/v1/exit", token).await;
    assert_eq!(status, 200);
    let done = wait_for("mover pod Succeeded", || async {
        m.pod("movers", &pod_name).await.filter(|p| str_at(p, "/status/phase") == Some("Succeeded"))
    })
    .await;
    let terminated = &done["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!((terminated["exitCode"].as_i64(), terminated["reason"].as_str()), (Some(0), Some("Completed")), "{done}");
    let log = std::fs::read_to_string(log_path(&state, "movers", &pod_name)).expect("mover log");
    assert!(!log.contains(token), "the mover's output holds no token:\n{log}");
    let job = wait_job_condition(&m, "movers", "mover", "Complete").await;
    assert_eq!(job["status"]["succeeded"], 1);
    assert_eq!(job_pods(&m, "movers", "mover").await.len(), 1, "never restarted");

    // a second mover is stopped by deleting its pod (SIGTERM)
    m.create(&jobs(&m, "movers"), mover_job("stopped", "guest-data", json!([{"name": "HCP_DR_MOVER_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "mover-token", "key": "token"}}}]), 0))
    .await;
    let ready = wait_for("second mover ready", || async {
        job_pods(&m, "movers", "stopped").await.into_iter().find(|p| has_condition(p, "Ready", "True"))
    })
    .await;
    let ip = str_at(&ready, "/status/podIP").expect("pod IP").to_string();
    pods(&m, "movers").delete(str_at(&ready, "/metadata/name").expect("name"), &DeleteParams::default()).await.expect("delete");
    let job = wait_job_condition(&m, "movers", "stopped", "Failed").await;
    assert_eq!(job["status"]["failed"], 1, "a pod deleted while running counts as failed: {job}");
    wait_for("the stopped mover's port closed", || async {
        tokio::net::TcpStream::connect((ip.as_str(), 8443)).await.is_err().then_some(())
    })
    .await;
    m.stop().await;
}

/// What `Sandbox::up` gives every management cluster, and
/// [`hcp_dr_e2e::sandbox::Sandbox::guest_volume`] on a KubeVirt hosted
/// cluster of the sandbox (needs `s3s-fs` and moto as every sandbox does).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_sandbox_cluster_has_the_csi_storage_and_guest_volumes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sandbox = hcp_dr_e2e::sandbox::Sandbox::up(&tmp.path().join("sb")).await.expect("sandbox up");
    for cluster in &sandbox.clusters {
        let client = cluster.api.client().await.expect("client");
        let sc = hcp_dr_e2e::sandbox::api_for(&client, &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass"}))
            .get(hcp_dr_e2e::sandbox::SANDBOX_STORAGE_CLASS)
            .await
            .expect("sandbox-csi");
        let sc = serde_json::to_value(sc).expect("json");
        assert_eq!((sc["provisioner"].as_str(), sc["reclaimPolicy"].as_str()), (Some(SANDBOX_CSI_DRIVER), Some("Delete")), "{}", cluster.name);
        assert_eq!(sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"], "true");
        let vsc = hcp_dr_e2e::sandbox::api_for(&client, &json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass"}))
            .get(SANDBOX_SNAPSHOT_CLASS)
            .await
            .expect("sandbox-csi-snapshots");
        let vsc = serde_json::to_value(vsc).expect("json");
        assert_eq!((vsc["driver"].as_str(), vsc["deletionPolicy"].as_str()), (Some(SANDBOX_CSI_DRIVER), Some("Delete")));
        assert_eq!(vsc["metadata"]["annotations"]["snapshot.storage.kubernetes.io/is-default-class"], "true");
    }
    let spec = hcp_dr_e2e::sandbox::HostedClusterSpec {
        availability: "SingleReplica".into(),
        node_pool_replicas: 0,
        ..hcp_dr_e2e::sandbox::HostedClusterSpec::kubevirt()
    };
    let client = sandbox.clusters[0].api.client().await.expect("client");
    hcp_dr_e2e::sandbox::create_all(&client, &spec.objects()).await.expect("hosted cluster");
    let (name, dir) = sandbox.guest_volume("mgmt-a", &spec.namespace, &spec.name, "2Gi").await.expect("guest volume");
    assert!(dir.starts_with(sandbox.dir.join("mgmt-a").join("state")), "{}", dir.display());
    std::fs::write(dir.join("file"), b"x").expect("the test writes the guest's files");
    let pvc = hcp_dr_e2e::sandbox::api_for(&client, &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"namespace": format!("{}-{}", spec.namespace, spec.name)}}))
        .get(&name)
        .await
        .expect("claim");
    let pvc = serde_json::to_value(pvc).expect("json");
    assert_eq!((pvc["spec"]["resources"]["requests"]["storage"].as_str(), pvc["status"]["phase"].as_str()), (Some("2Gi"), Some("Bound")));
    assert!(sandbox.guest_volume("mgmt-x", "clusters", "demo", "1Gi").await.is_err());
    sandbox.shutdown().await;
}
