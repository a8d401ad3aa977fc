//! The KubeVirt platform's guest data on the sandbox: a cluster made by
//! `hcp-dr cluster create --platform kubevirt` whose guest asked for two
//! volumes (kubevirt-csi's DataVolumes and their claims in the control-plane
//! namespace, labelled with its infraID), with files written into them.
//! Bad snapshot classes are refused before anything is paused; a data mover
//! that dies mid-backup fails the backup and leaves nothing behind (no
//! artifact, snapshot, Job or scratch claim); a backup copies both volumes
//! through CSI snapshots and data-mover Jobs run as local `hcp-dr
//! volume-mover` processes; a migration to mgmt-b re-creates them there with
//! the same names and files before the NodePools (a drill there first
//! restores them under its own names, checks and removes them); with mgmt-b then lost, a
//! restore of the migration's backup brings them back onto mgmt-a.
//! With `--include-root-disks`, the worker's root disk moves too, with its
//! VirtualMachine: on mgmt-b the disk holds what the worker wrote (not a
//! fresh import), owned by the VM, which the machine's provider keeps; a
//! drill of that backup leaves the root disk out and says so.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hcp_dr_e2e::operator::workloads::pv_path;
use hcp_dr_e2e::sandbox::{api_for, guest_volume_on, wait_available};
use serde_json::{Value, json};
use support::*;

const HCP_NS: &str = "clusters-demo";

/// What the guest wrote into its volumes: nested files, an empty
/// directory, a symlink, a larger file of varied bytes.
fn write_guest_files(dir: &Path, tag: &str) {
    std::fs::create_dir_all(dir.join("db/wal")).unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    std::fs::write(dir.join("db/wal/000001.log"), format!("wal of {tag}\n")).unwrap();
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(dir.join("db/data.bin"), big).unwrap();
    std::os::unix::fs::symlink("db/wal/000001.log", dir.join("latest")).unwrap();
}

/// The tree under `dir` (minus lost+found): path → file bytes, link target
/// or `dir`, for comparing two volumes.
fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(&rel).display())) {
            let entry = entry.unwrap();
            let name = rel.join(entry.file_name());
            let kind = entry.file_type().unwrap();
            let what = if kind.is_symlink() {
                format!("-> {}", std::fs::read_link(entry.path()).unwrap().display())
            } else if kind.is_dir() {
                stack.push(name.clone());
                "dir".into()
            } else {
                let bytes = std::fs::read(entry.path()).unwrap();
                format!("{} bytes, sha256 {}", bytes.len(), hcp_dr::store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes)))
            };
            if name.as_os_str() != "lost+found" && !name.starts_with(".sandbox-pvc-uid") {
                out.push((name.display().to_string(), what));
            }
        }
    }
    out.retain(|(name, _)| !name.starts_with('.'));
    out.sort();
    out
}

fn state_dir(env: &Env, mgmt: &str) -> PathBuf {
    env.sandbox.dir.join(mgmt).join("state")
}

/// Objects of `kind` in the control-plane namespace carrying hcp-dr's backup label.
async fn leftovers(client: &kube::Client) -> Vec<String> {
    let mut found = Vec::new();
    for (api_version, kind) in [("snapshot.storage.k8s.io/v1", "VolumeSnapshot"), ("batch/v1", "Job"), ("v1", "PersistentVolumeClaim"), ("v1", "Secret"), ("v1", "Pod")] {
        let api = api_for(client, &kind_in(api_version, kind, HCP_NS));
        let list = api.list(&kube::api::ListParams::default().labels("hcp-dr.openshift.io/backup-id")).await.expect("list");
        found.extend(list.items.iter().map(|o| format!("{kind} {}", o.metadata.name.clone().unwrap_or_default())));
    }
    found
}

/// Waits (up to 90 s) until nothing labelled by a backup is left: deletions
/// finish asynchronously (finalizers, a pod's grace period, the garbage
/// collector), as on a real cluster.
async fn assert_nothing_left(client: &kube::Client, after: &str) {
    let start = std::time::Instant::now();
    loop {
        let left = leftovers(client).await;
        if left.is_empty() {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "{after} left {left:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn kind_in(api_version: &str, kind: &str, ns: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"namespace": ns}})
}

/// Deletes the pod of the data mover of volume `index` (`...-v<index>-`)
/// as soon as it appears; its name when it did.
fn kill_mover(client: &kube::Client, index: usize) -> tokio::task::JoinHandle<String> {
    let client = client.clone();
    let infix = format!("-v{index}-");
    tokio::spawn(async move {
        let pods = api_for(&client, &kind_in("v1", "Pod", HCP_NS));
        loop {
            let list = pods.list(&kube::api::ListParams::default().labels("hcp-dr.openshift.io/backup-id")).await.expect("list pods");
            if let Some(name) = list.items.iter().filter_map(|p| p.metadata.name.clone()).find(|n| n.contains(&infix)) {
                pods.delete(&name, &Default::default()).await.expect("delete the mover pod");
                return name;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

async fn paused(client: &kube::Client) -> Option<String> {
    hc_on(client).await.and_then(|hc| hc["spec"]["pausedUntil"].as_str().map(str::to_string))
}

async fn kubevirt_env() -> Env {
    let env = bare_env().await;
    let out = create_demo(&env, &["--platform", "kubevirt", "--node-pool-replicas", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available");
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guest_volumes_are_backed_up_refused_migrated_and_restored_with_the_source_lost() {
    let mut env = kubevirt_env().await;
    let endpoint = env.sandbox.s3.https_url().to_string();
    let a = env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string();
    let mut volumes = Vec::new();
    for tag in ["first", "second"] {
        let (name, dir) = guest_volume_on(&env.mgmt, &state_dir(&env, "mgmt-a"), "clusters", "demo", "1Gi").await.expect("a guest volume");
        write_guest_files(&dir, tag);
        volumes.push((name, tree(&dir)));
    }
    volumes.sort();

    eprintln!("-- refused classes");
    // a snapshot class that does not exist, or is another driver's, is
    // refused before anything is paused or created
    let s3 = env.s3_args();
    let s3: Vec<&str> = s3.iter().map(String::as_str).collect();
    let mut args = vec!["backup", "--hosted-cluster", "demo", "--volume-snapshot-class", "no-such-class"];
    args.extend(&s3);
    let out = env.hcp_dr(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--volume-snapshot-class no-such-class does not exist"), "{}", text(&out));
    let other = json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass", "metadata": {"name": "other-driver"}, "driver": "other.csi.example.com", "deletionPolicy": "Delete"});
    let classes = api_for(&env.mgmt, &json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass"}));
    classes.create(&Default::default(), &serde_json::from_value(other).unwrap()).await.expect("create a class of another driver");
    let mut args = vec!["backup", "--hosted-cluster", "demo", "--volume-snapshot-class", "other-driver"];
    args.extend(&s3);
    let out = env.hcp_dr(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("is for the driver other.csi.example.com"), "{}", text(&out));
    assert_eq!(paused(&env.mgmt).await, None, "a refused backup paused the cluster");
    assert!(leftovers(&env.mgmt).await.is_empty(), "a refused backup created {:?}", leftovers(&env.mgmt).await);
    // a guest volume of a driver that cannot snapshot (no VolumeSnapshotClass) is refused too
    let no_snapshots = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "no-snapshots"}, "provisioner": "nosnap.example.com"});
    api_for(&env.mgmt, &no_snapshots).create(&Default::default(), &serde_json::from_value(no_snapshots.clone()).unwrap()).await.expect("a class without snapshots");
    let infra_id = hc_on(&env.mgmt).await.unwrap()["spec"]["infraID"].as_str().unwrap().to_string();
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "no-snapshots-volume", "namespace": HCP_NS, "labels": {"hypershift.openshift.io/infra-id": infra_id}},
        "spec": {"storageClassName": "no-snapshots", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let claims = api_for(&env.mgmt, &kind_in("v1", "PersistentVolumeClaim", HCP_NS));
    claims.create(&Default::default(), &serde_json::from_value(claim).unwrap()).await.expect("a guest volume of that class");
    let mut args = vec!["backup", "--hosted-cluster", "demo"];
    args.extend(&s3);
    let out = env.hcp_dr(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("provisioned by nosnap.example.com (StorageClass no-snapshots), which has no VolumeSnapshotClass"), "{}", text(&out));
    assert_eq!(paused(&env.mgmt).await, None, "a refused backup paused the cluster");
    claims.delete("no-snapshots-volume", &Default::default()).await.expect("delete the claim");
    let start = std::time::Instant::now();
    while claims.get_opt("no-snapshots-volume").await.expect("get claim").is_some() {
        assert!(start.elapsed() < Duration::from_secs(30), "the claim without snapshots is still there");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    eprintln!("-- mover killed");
    // the second volume's data mover dies as soon as it starts: the backup
    // fails, the first volume's copy is removed from the store, and no
    // snapshot, Job, claim or token is left; the cluster runs again
    let killer = kill_mover(&env.mgmt, 1);
    let mut args = vec!["backup", "--hosted-cluster", "demo", "-o", "json"];
    args.extend(&s3);
    let out = env.hcp_dr(&args, &[]);
    killer.abort();
    let killed = killer.await.unwrap_or_else(|_| panic!("no mover pod of the second volume was seen: {}", text(&out)));
    assert_eq!(out.status.code(), Some(1), "the backup survived the death of its mover {killed}: {}", text(&out));
    assert!(text(&out).contains("data mover"), "{}", text(&out));
    let stored: Vec<String> = files(&env.sandbox.s3.root()).into_iter().filter(|f| f.contains("/volumes/")).collect();
    assert!(stored.is_empty(), "a failed backup left volume data in the store: {stored:?}");
    assert_nothing_left(&env.mgmt, "a failed backup").await;
    assert_eq!(paused(&env.mgmt).await, None, "a failed backup left the cluster paused");

    eprintln!("-- backup");
    // the backup: both volumes, their files, in the manifest and described
    let (folder, _) = backup_to_s3(&env);
    assert_nothing_left(&env.mgmt, "a backup").await;
    let out = env.hcp_dr(&["backups", "describe", &folder, "--s3-endpoint", &endpoint], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let described = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(described.contains("guest volumes: 2 copied (KubeVirt)"), "{described}");
    // the worker's root disk is named, not copied (no --include-root-disks)
    assert!(described.contains("root disks not copied (re-created from the NodePool's image): demo-"), "{described}");
    let out = env.hcp_dr(&["backups", "describe", &folder, "--s3-endpoint", &endpoint, "-o", "json"], &[]);
    let manifest = json_report(&out);
    let recorded: Vec<&str> = manifest["guest_volumes"]["volumes"].as_array().expect("guest volumes").iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(recorded, volumes.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), "{manifest:#}");
    for v in manifest["guest_volumes"]["volumes"].as_array().unwrap() {
        assert_eq!(v["files"].as_u64(), Some(6), "db, db/wal, db/wal/000001.log, db/data.bin, empty, latest: {v:#}");
        assert_eq!(v["data_volume"]["kind"], "DataVolume", "{v:#}");
    }
    let out = env.hcp_dr(&["backups", "verify", &folder, "--s3-endpoint", &endpoint], &[]);
    assert!(out.status.success(), "the volumes' artifacts verify: {}", text(&out));

    eprintln!("-- restore onto mgmt-b without the StorageClass");
    // refused before anything is created; the class comes back for the rest
    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    let class_api = api_for(&b, &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass"}));
    let class = serde_json::to_value(class_api.get("sandbox-csi").await.expect("mgmt-b's class")).unwrap();
    class_api.delete("sandbox-csi", &Default::default()).await.expect("delete mgmt-b's class");
    let b_kubeconfig = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let out = env.hcp_dr(&["restore", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &b_kubeconfig], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("StorageClass sandbox-csi does not exist here"), "{}", text(&out));
    let namespaces = api_for(&b, &json!({"apiVersion": "v1", "kind": "Namespace"}));
    assert!(namespaces.get_opt(HCP_NS).await.expect("get namespace").is_none(), "a refused restore created {HCP_NS} on mgmt-b");
    let class = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "sandbox-csi", "annotations": class["metadata"]["annotations"]},
        "provisioner": class["provisioner"], "reclaimPolicy": class["reclaimPolicy"], "volumeBindingMode": class["volumeBindingMode"]});
    class_api.create(&Default::default(), &serde_json::from_value(class).unwrap()).await.expect("mgmt-b's class back");

    eprintln!("-- drill on mgmt-b");
    // a drill restores the volumes under the drill's names before its
    // NodePools, checks each, and removes them with the drill cluster
    let staging = env.sandbox.clusters[1].kubeconfig.to_str().unwrap().to_string();
    let out = env.hcp_dr(&["drill", "--from", &folder, "--s3-endpoint", &endpoint, "--kubeconfig", &staging, "--wait", "5m", "-o", "json"], &[]);
    let drill = json_report(&out);
    assert!(out.status.success() && drill["passed"] == true, "{drill:#}");
    let order: Vec<&str> = drill["stages"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert!(order.iter().position(|s| *s == "volume-restore") < order.iter().position(|s| *s == "apply"), "{order:?}");
    for (name, _) in &volumes {
        let check = drill["checks"].as_array().unwrap().iter().find(|c| c["name"] == format!("guest volume {name}").as_str());
        let check = check.unwrap_or_else(|| panic!("no check of guest volume {name}: {drill:#}"));
        assert_eq!(check["passed"], true, "{check:#}");
        assert!(check["detail"].as_str().unwrap().contains("6 entries as backed up"), "{check:#}");
    }
    // the drill's control-plane namespace: `clusters-drill`/`demo-drill` (the default suffix)
    let drill_ns = "clusters-drill-demo-drill";
    let claims = api_for(&b, &kind_in("v1", "PersistentVolumeClaim", drill_ns)).list(&Default::default()).await.map(|l| l.items.len()).unwrap_or(0);
    assert_eq!(claims, 0, "the drill left claims in {drill_ns}");
    assert!(leftovers(&b).await.is_empty(), "the drill left {:?} on mgmt-b", leftovers(&b).await);

    eprintln!("-- migrate");
    // migrate: the volumes are on mgmt-b under their names, with their
    // files, owned by their DataVolumes, before the NodePools
    let args = migrate_json_args(&env);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let order: Vec<&str> = report["stages"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    let at = |stage: &str| order.iter().position(|s| *s == stage).unwrap_or_else(|| panic!("{stage} did not run: {order:?}"));
    assert!(at("volume-restore") < at("apply"), "{order:?}");
    wait_available(&b, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available on mgmt-b");
    for (name, files) in &volumes {
        assert_eq!(&tree(&pv_path(&state_dir(&env, "mgmt-b"), HCP_NS, name)), files, "volume {name} on mgmt-b");
        let claim = api_for(&b, &kind_in("v1", "PersistentVolumeClaim", HCP_NS)).get(name).await.expect("the claim on mgmt-b");
        let owner = claim.metadata.owner_references.unwrap_or_default();
        assert_eq!(owner.first().map(|o| (o.kind.as_str(), o.name.as_str())), Some(("DataVolume", name.as_str())), "{name}");
        api_for(&b, &kind_in("cdi.kubevirt.io/v1beta1", "DataVolume", HCP_NS)).get(name).await.expect("the DataVolume on mgmt-b");
    }
    assert_nothing_left(&b, "the migration (on mgmt-b)").await;

    eprintln!("-- restore onto mgmt-a");
    // mgmt-b is lost with the cluster: a restore of the migration's backup
    // brings the volumes back onto mgmt-a
    let backup = report["backup"].as_str().expect("the migration's backup").to_string();
    env.sandbox.lose("mgmt-b").await.expect("lose mgmt-b");
    let out = env.hcp_dr(&["restore", "--from", &backup, "--s3-endpoint", &endpoint, "--kubeconfig", &a, "--wait", "5m", "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    wait_available(&env.mgmt, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available on mgmt-a");
    for (name, files) in &volumes {
        assert_eq!(&tree(&pv_path(&state_dir(&env, "mgmt-a"), HCP_NS, name)), files, "volume {name} back on mgmt-a");
    }
    assert_nothing_left(&env.mgmt, "the restore").await;
}

/// The worker's VirtualMachine in the control-plane namespace and its root
/// disk's claim, once the disk is imported (up to 90 s).
async fn worker_disk(client: &kube::Client, state: &Path) -> (String, String, PathBuf) {
    let vms = api_for(client, &kind_in("kubevirt.io/v1", "VirtualMachine", HCP_NS));
    let start = std::time::Instant::now();
    loop {
        let list = vms.list(&Default::default()).await.expect("list VMs");
        if let Some(vm) = list.items.first() {
            let vm = serde_json::to_value(vm).unwrap();
            let disk = vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"].as_str().expect("a root disk template").to_string();
            let dir = pv_path(state, HCP_NS, &disk);
            if dir.join("disk.img").is_file() {
                return (vm["metadata"]["name"].as_str().unwrap().to_string(), disk, dir);
            }
        }
        assert!(start.elapsed() < Duration::from_secs(90), "no worker VM with an imported root disk: {:?}", list.items);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn root_disks_move_with_their_machines_when_asked_and_a_drill_leaves_them_out() {
    let env = kubevirt_env().await;
    let (vm, disk, dir) = worker_disk(&env.mgmt, &state_dir(&env, "mgmt-a")).await;
    // what the worker wrote to its disk since it booted
    std::fs::write(dir.join("disk.img"), "imported, then written by the node\n").unwrap();
    std::fs::create_dir_all(dir.join("var/lib/kubelet")).unwrap();
    std::fs::write(dir.join("var/lib/kubelet/node-state"), "node demo-worker was here\n").unwrap();
    // enough bytes that the mover is still streaming when the test kills
    // it: a disk of a few bytes was copied whole between two of the
    // killer's looks, and the migration it meant to break succeeded
    let layer: Vec<u8> = (0..48u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::create_dir_all(dir.join("var/lib/containers")).unwrap();
    std::fs::write(dir.join("var/lib/containers/layer.bin"), layer).unwrap();
    let written = tree(&dir);

    eprintln!("-- migrate with --include-root-disks, its mover killed, resumed");
    // the root disk's data mover dies: the migration stops, and --resume
    // copies the disk again and goes on
    let killer = kill_mover(&env.mgmt, 0);
    let journal = env.dir.path().join("migrate-root-disks.journal");
    let args = migrate_args(&env, &journal, &["--dns-direct", "--include-root-disks", "-o", "json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.hcp_dr(&args, &[]);
    killer.abort();
    let killed = killer.await.unwrap_or_else(|_| panic!("no mover pod of the root disk was seen: {}", text(&out)));
    assert!(!out.status.success(), "the migration survived the death of its mover {killed}: {}", text(&out));
    assert!(text(&out).contains("data mover"), "{}", text(&out));
    let out = env.hcp_dr(&["migrate", "--resume", journal.to_str().unwrap(), "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report = json_report(&out);
    let backup = report["backup"].as_str().expect("the migration's backup").to_string();
    let endpoint = env.sandbox.s3.https_url().to_string();
    let out = env.hcp_dr(&["backups", "describe", &backup, "--s3-endpoint", &endpoint], &[]);
    let described = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(described.contains(&format!("root disk of VirtualMachine {vm}")), "{described}");
    assert!(!described.contains("root disks not copied"), "{described}");

    let b = env.sandbox.clusters[1].api.client().await.expect("mgmt-b client");
    wait_available(&b, "clusters", "demo", Duration::from_secs(180)).await.expect("demo Available on mgmt-b");
    // the disk holds what the node wrote: restored, not imported again
    assert_eq!(tree(&pv_path(&state_dir(&env, "mgmt-b"), HCP_NS, &disk)), written, "root disk {disk} on mgmt-b");
    let vm_b = api_for(&b, &kind_in("kubevirt.io/v1", "VirtualMachine", HCP_NS)).get(&vm).await.expect("the VM on mgmt-b");
    let dv = api_for(&b, &kind_in("cdi.kubevirt.io/v1beta1", "DataVolume", HCP_NS)).get(&disk).await.expect("the root disk's DataVolume");
    let dv = serde_json::to_value(dv).unwrap();
    let owner = &dv["metadata"]["ownerReferences"][0];
    assert_eq!((owner["kind"].as_str(), owner["uid"].as_str()), (Some("VirtualMachine"), vm_b.metadata.uid.as_deref()), "{dv:#}");
    assert_eq!(dv["metadata"]["annotations"]["cdi.kubevirt.io/storage.prePopulated"], disk.as_str(), "{dv:#}");
    // the machine's provider kept the restored VM as the machine's
    let start = std::time::Instant::now();
    loop {
        let vm_b = api_for(&b, &kind_in("kubevirt.io/v1", "VirtualMachine", HCP_NS)).get(&vm).await.expect("the VM on mgmt-b");
        let owners = vm_b.metadata.owner_references.clone().unwrap_or_default();
        let ready = serde_json::to_value(&vm_b).unwrap()["status"]["ready"] == true;
        if owners.iter().any(|o| o.kind == "KubevirtMachine" && o.name == vm) && ready {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the restored VM was not taken up by its KubevirtMachine and started: {vm_b:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_nothing_left(&b, "the migration (on mgmt-b)").await;
    // the source's machine and its disk are gone with the source's cluster
    let start = std::time::Instant::now();
    while api_for(&env.mgmt, &kind_in("kubevirt.io/v1", "VirtualMachine", HCP_NS)).get_opt(&vm).await.expect("get VM").is_some() {
        assert!(start.elapsed() < Duration::from_secs(60), "the source's VM {vm} is still on mgmt-a");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    eprintln!("-- drill of that backup on mgmt-a");
    let a = env.sandbox.clusters[0].kubeconfig.to_str().unwrap().to_string();
    let out = env.hcp_dr(&["drill", "--from", &backup, "--s3-endpoint", &endpoint, "--kubeconfig", &a, "--wait", "5m", "-o", "json"], &[]);
    let drill = json_report(&out);
    assert!(out.status.success() && drill["passed"] == true, "{drill:#}");
    // the report's dropped list names the root disk and why (rule root-disks)
    assert!(drill.to_string().contains(&format!("root disks {disk} and their VirtualMachines (in the backup, not replayed)")), "{drill:#}");
    assert!(!drill["checks"].as_array().unwrap().iter().any(|c| c["name"] == format!("guest volume {disk}").as_str()), "{drill:#}");
}
