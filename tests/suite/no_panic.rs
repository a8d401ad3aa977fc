//! No panic on any input: property tests for every parser fed by users or by
//! stored data (store and backup URLs, manifests and `SHA256SUMS`, the
//! objects archive, fence records, journals, playbooks, age keys and
//! headers, etcd snapshots, kubeconfigs). Each parser gets arbitrary input
//! and input made from a valid document (bytes set, cut, inserted, removed
//! or repeated; JSON values swapped, dropped or added) and must return: an
//! `Err` when it cannot read it, and when it says `Ok`, something that holds
//! what the caller relies on.
//!
//! A panic found here is fixed where it happens, with a plain test holding
//! the input that caused it. Durations and retention arguments are covered
//! in `src/duration.rs`.
//!
//! `cargo nextest run --test no_panic` (a few seconds); `NO_PANIC_SCALE=100`
//! runs a hundred times as many cases of each (a longer search, by hand).

use std::io::{Cursor, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hcp_dr::archive::encryption::{self, Identities, Recipients};
use hcp_dr::archive::fence::Fence;
use hcp_dr::archive::{Layout, Manifest, OBJECTS, SHA256SUMS, check, objects, parse_backup_id, sha256sums};
use hcp_dr::etcd::bbolt::{self, BRANCH_PAGE, BUCKET_LEAF_FLAG, LEAF_PAGE, MAGIC, META_PAGE, NO_FREELIST, VERSION};
use hcp_dr::etcd::verify::{self, Decryption, SnapshotSource};
use hcp_dr::pipeline::journal::{ClusterBinding, Event, Header, Journal, Record};
use hcp_dr::ops::registry;
use hcp_dr::pipeline::{Playbook, StageRules};
use hcp_dr::store::{LocalStore, Store, StoreUrl, check_key, hex};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------
// Shared strategies and mutations

fn cases(n: u32) -> ProptestConfig {
    let scale: u32 = std::env::var("NO_PANIC_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    ProptestConfig {
        cases: n.saturating_mul(scale.max(1)),
        // a failure becomes a plain test beside its fix, not a regressions file
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Bytes that matter to the formats here (JSON, YAML, URLs, tar, age).
const SPECIAL: &[u8] = b"{}[]\":,\n\r\t \\/-#&*!|>'%=.0123456789aeEzZ+\x00\x7f\xff";

fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![3 => any::<u8>(), 2 => prop::sample::select(SPECIAL)]
}

/// A little-endian integer of interest to binary formats (page ids, sizes, counts).
fn word() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0u64, 1, 2, 3, 4, 5, 6, 7, 8, 16, 0x7f, 0xff, 0x100, 0xffff, 4096, 4097, 0x8000_0000,
            u32::MAX as u64, i64::MAX as u64, u64::MAX,
        ]),
        any::<u64>(),
    ]
}

/// One change to a byte string; positions wrap around its length.
#[derive(Debug, Clone)]
enum Edit {
    Set(usize, u8),
    /// Write `width` bytes of a little-endian integer.
    Word(usize, usize, u64),
    Cut(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    Repeat(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        5 => (any::<usize>(), byte()).prop_map(|(at, b)| Edit::Set(at, b)),
        2 => (any::<usize>(), prop::sample::select(vec![2usize, 4, 8]), word()).prop_map(|(at, w, v)| Edit::Word(at, w, v)),
        1 => any::<usize>().prop_map(Edit::Cut),
        2 => (any::<usize>(), prop::collection::vec(byte(), 1..16)).prop_map(|(at, b)| Edit::Insert(at, b)),
        2 => (any::<usize>(), 1usize..64).prop_map(|(at, n)| Edit::Remove(at, n)),
        1 => (any::<usize>(), 1usize..64).prop_map(|(at, n)| Edit::Repeat(at, n)),
    ]
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(edit(), 1..6)
}

fn mutate(original: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = original.to_vec();
    for edit in edits {
        let len = out.len();
        let at = |i: usize| if len == 0 { 0 } else { i % len };
        match edit {
            Edit::Set(i, b) if len > 0 => out[at(*i)] = *b,
            Edit::Word(i, width, value) if len > 0 => {
                let start = at(*i);
                let end = (start + width).min(len);
                out[start..end].copy_from_slice(&value.to_le_bytes()[..end - start]);
            }
            Edit::Cut(i) => out.truncate(at(*i)),
            Edit::Insert(i, bytes) => {
                let i = if len == 0 { 0 } else { i % (len + 1) };
                out.splice(i..i, bytes.iter().copied());
            }
            Edit::Remove(i, n) if len > 0 => {
                let start = at(*i);
                out.drain(start..(start + n).min(len));
            }
            Edit::Repeat(i, n) if len > 0 => {
                let start = at(*i);
                let piece = out[start..(start + n).min(len)].to_vec();
                out.splice(start..start, piece);
            }
            _ => {}
        }
    }
    out
}

/// Mutated text, kept UTF-8 (what `&str` parsers are given).
fn mutate_text(original: &str, edits: &[Edit]) -> String {
    String::from_utf8_lossy(&mutate(original.as_bytes(), edits)).into_owned()
}

/// Any JSON value, small, with strings and numbers the formats here use.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![0i64, 1, 2, 3, -1, u32::MAX as i64, u32::MAX as i64 + 1]).prop_map(Value::from),
        ".{0,16}".prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "age",
            "age1",
            "20261121T180000Z-0a1b2c",
            "etcd/etcd-0.db",
            "etcd-0",
            OBJECTS,
            SHA256SUMS,
            "../../x",
            "/abs",
            "a//b",
            "2026-11-21T18:00:00Z",
            "started",
            "succeeded",
            "begin",
            "pause",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{0,10}",
        prop::sample::select(vec![
            "format_version",
            "encryption",
            "etcd",
            "artifacts",
            "name",
            "sha256",
            "size",
            "scheme",
            "recipients",
            "event",
            "stage",
            "header",
            "at",
            "output",
            "data",
            "error",
            "outcome",
            "stages",
            "with",
            "operation",
            "runs_on",
            "server",
        ])
        .prop_map(str::to_string),
    ]
}

/// One change to a JSON document, at a path of child indexes (wrapping).
#[derive(Debug, Clone)]
enum JsonEdit {
    Replace(Vec<usize>, Value),
    RemoveChild(Vec<usize>, usize),
    Insert(Vec<usize>, String, Value),
}

fn json_edits() -> impl Strategy<Value = Vec<JsonEdit>> {
    let path = || prop::collection::vec(any::<usize>(), 0..6);
    prop::collection::vec(
        prop_oneof![
            3 => (path(), json_value()).prop_map(|(p, v)| JsonEdit::Replace(p, v)),
            2 => (path(), any::<usize>()).prop_map(|(p, i)| JsonEdit::RemoveChild(p, i)),
            1 => (path(), key(), json_value()).prop_map(|(p, k, v)| JsonEdit::Insert(p, k, v)),
        ],
        1..4,
    )
}

fn node_at<'a>(mut node: &'a mut Value, path: &[usize]) -> &'a mut Value {
    for step in path {
        let len = match &*node {
            Value::Object(map) => map.len(),
            Value::Array(items) => items.len(),
            _ => 0,
        };
        if len == 0 {
            break;
        }
        node = match node {
            Value::Object(map) => map.values_mut().nth(step % len).expect("index below len"),
            Value::Array(items) => &mut items[step % len],
            _ => unreachable!(),
        };
    }
    node
}

fn mutate_json(original: &Value, edits: &[JsonEdit]) -> Value {
    let mut doc = original.clone();
    for edit in edits {
        match edit {
            JsonEdit::Replace(path, value) => *node_at(&mut doc, path) = value.clone(),
            JsonEdit::RemoveChild(path, index) => match node_at(&mut doc, path) {
                Value::Object(map) if !map.is_empty() => {
                    let key = map.keys().nth(index % map.len()).cloned().expect("index below len");
                    map.remove(&key);
                }
                Value::Array(items) if !items.is_empty() => {
                    let len = items.len();
                    items.remove(index % len);
                }
                _ => {}
            },
            JsonEdit::Insert(path, key, value) => match node_at(&mut doc, path) {
                Value::Object(map) => {
                    map.insert(key.clone(), value.clone());
                }
                Value::Array(items) => items.push(value.clone()),
                other => *other = value.clone(),
            },
        }
    }
    doc
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
}

// ---------------------------------------------------------------------------
// Store URLs, backup URLs, keys and names typed by users

/// Pieces URLs, keys, ids and names are made of.
const URL_PIECES: &[&str] = &[
    "s3://",
    "file://",
    "gs://",
    "://",
    "/",
    "//",
    ":",
    ":/",
    "my-bucket",
    "b",
    "ab",
    "My_Bucket",
    ".",
    "..",
    "clusters",
    "demo",
    "20261121T180000Z-0a1b2c",
    "20261121T180000Z-",
    "99999999T999999Z-ffffff",
    "20261121T180000Z-0a1b2c-extra",
    "latest",
    "manifest.json",
    "etcd",
    "etcd-0.db",
    " ",
    "\t",
    "\n",
    "é",
    "\u{1f4a5}",
    "-",
    "_",
    "%2F",
    "\\",
    "\0",
    "/hostedzone/",
    "hostedzone/",
    "Z123",
    "=",
    ",",
    "etcd-0",
    "https://etcd-0.etcd-discovery.$(NAMESPACE).svc:2380",
    "heritage=external-dns",
    "external-dns/owner=",
    "\"",
    "\\052",
    "\\777",
    "\\0",
];

fn url_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,64}",
        "[ -~]{0,64}",
        prop::collection::vec(prop::sample::select(URL_PIECES), 0..14).prop_map(|pieces| pieces.concat()),
    ]
}

/// Every user-typed name and URL parser on one text: they must not panic,
/// and what they accept must be what their callers rely on.
fn user_text_parsers(text: &str) -> Result<(), TestCaseError> {
    match StoreUrl::parse(text) {
        Ok(StoreUrl::S3 { bucket, prefix }) => {
            prop_assert!((3..=63).contains(&bucket.len()), "bucket {bucket:?}");
            prop_assert!(!prefix.starts_with('/') && !prefix.ends_with('/'), "prefix {prefix:?}");
        }
        Ok(StoreUrl::Local(_)) => {}
        Err(err) => prop_assert!(err.to_string().contains("s3://bucket/prefix")),
    }
    if check_key(text).is_ok() {
        prop_assert!(!text.is_empty() && !text.starts_with('/'));
        prop_assert!(text.split('/').all(|s| !s.is_empty() && s != "." && s != ".."));
    }
    if let Some((root, ns, hc, id)) = hcp_dr::ops::restore::split_backup_url(text) {
        prop_assert!(!root.is_empty());
        prop_assert!(id == "latest" || parse_backup_id(&id).is_ok(), "{id:?}");
        prop_assert!(!ns.contains('/') && !hc.contains('/') && !id.contains('/'));
    }
    if let Some(layout) = Layout::from_key(text) {
        prop_assert!(parse_backup_id(&layout.backup_id).is_ok());
    }
    let _ = parse_backup_id(text).map_err(|e| e.to_string());
    match SnapshotSource::parse(text) {
        Ok(SnapshotSource::Object { store_url, key }) => {
            prop_assert!(!key.is_empty() && !key.contains('/'), "{key:?}");
            prop_assert!(StoreUrl::parse(&store_url).is_ok(), "{store_url:?}");
        }
        Ok(SnapshotSource::File(_)) => {}
        Err(err) => {
            let _ = err.to_string();
        }
    }
    if let Ok(id) = hcp_dr::dns::route53::parse_zone_id(text) {
        prop_assert!(!id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()));
    }
    if let Ok(pairs) = hcp_dr::stages::etcd_restore::assess::parse_initial_cluster(text) {
        prop_assert!(!pairs.is_empty());
    }
    let _ = hcp_dr::dns::txt_owner(text);
    let _ = hcp_dr::dns::normalize_name(text);
    let _ = hcp_dr::dns::registry_names(text);
    let _ = verify::resource_prefix(text.as_bytes());
    Ok(())
}

/// Pieces of cron schedules, right and wrong.
const CRON_PIECES: &[&str] = &[
    "*", "*/", "/", "0", "1", "5", "6", "7", "12", "23", "24", "31", "32", "59", "60", "99999999999999999999", "-", ",",
    " ", "  ", "\t", "SUN", "sat", "MON-FRI", "JAN", "L", "W", "#", "?", "@daily", "@every", "@", "TZ=UTC ", "CRON_TZ=",
    "*/0", "0/0", "1-0", "5-5/0", "é",
];

fn cron_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        prop::collection::vec(prop::sample::select(CRON_PIECES), 0..16).prop_map(|pieces| pieces.concat()),
        // five fields of pieces: what reaches the field parser
        prop::collection::vec(prop::collection::vec(prop::sample::select(CRON_PIECES), 1..4), 5)
            .prop_map(|fields| fields.iter().map(|f| f.concat().replace(' ', "")).collect::<Vec<_>>().join(" ")),
    ]
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn user_urls_and_names_never_panic(text in url_text()) {
        user_text_parsers(&text)?;
    }

    #[test]
    fn schedules_never_panic(text in cron_text()) {
        if let Err(err) = hcp_dr::ops::schedule::check_schedule(&text) {
            prop_assert!(err.to_string().contains("--schedule"), "{err}");
        }
    }

    #[test]
    fn resource_prefix_of_any_key_never_panics(key in prop::collection::vec(any::<u8>(), 0..40)) {
        let prefix = verify::resource_prefix(&key);
        prop_assert!(prefix.len() <= key.len() * 3, "{prefix:?}");
    }
}

// ---------------------------------------------------------------------------
// Manifests, fence records, objects archives and stored backups

const ID: &str = "20261121T180000Z-0a1b2c";

fn manifest_doc(encrypted: bool, artifacts: &[(String, u64, String)]) -> Value {
    let listed: Vec<Value> = artifacts.iter().map(|(n, s, h)| json!({"name": n, "size": s, "sha256": h})).collect();
    let (snapshot_size, snapshot_sha) = artifacts
        .iter()
        .find(|(n, _, _)| *n == "etcd/etcd-0.db")
        .map(|(_, s, h)| (*s, h.clone()))
        .unwrap_or_default();
    let mut doc = json!({
        "format_version": if encrypted { 2 } else { 1 },
        "tool_version": "0.1.0",
        "backup_id": ID,
        "cluster": {
            "namespace": "clusters", "name": "demo", "uid": "u-1", "cluster_id": "c-1", "infra_id": null,
            "hcp_namespace": "clusters-demo", "platform": "None", "availability_policy": "SingleReplica",
            "release_image": "quay.io/img:1", "encryption_key_secret": "demo-etcd-encryption-key", "lineage": "u-0"
        },
        "etcd": [{"member": "etcd-0", "artifact": "etcd/etcd-0.db", "revision": 7, "size": snapshot_size, "sha256": snapshot_sha}],
        "artifacts": listed,
        "object_counts": {"Secret": 1, "HostedCluster": 1},
        "timings": {"started": "2026-11-21T18:00:00Z", "finished": "2026-11-21T18:01:00Z", "api_downtime_seconds": 1.5, "stages": {"pause": 0.25}},
        "origin": {
            "management_cluster": {"server": "https://api.mgmt:6443", "kube_system_uid": "ks-1"},
            "hostnames": ["api.demo.example.com"],
            "dns": {"zone_id": "Z123", "owner": "mgmt-a", "records": [
                {"name": "api.demo.example.com", "kind": "A", "values": ["192.0.2.1"], "owner": "mgmt-a"},
                {"name": "api.demo.example.com", "kind": "TXT", "values": ["\"heritage=external-dns,external-dns/owner=mgmt-a\""]}
            ]}
        }
    });
    if encrypted {
        doc["encryption"] = json!({
            "scheme": "age",
            "recipients": ["age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"],
            "artifacts": [
                {"name": "etcd/etcd-0.db", "size": 10, "sha256": "cd".repeat(32)},
                {"name": OBJECTS, "size": 10, "sha256": "ef".repeat(32)}
            ]
        });
    }
    doc
}

fn placeholder_artifacts() -> Vec<(String, u64, String)> {
    vec![
        ("etcd/etcd-0.db".into(), 1, "ab".repeat(32)),
        (OBJECTS.into(), 2, "bc".repeat(32)),
        (SHA256SUMS.into(), 3, "cd".repeat(32)),
    ]
}

fn check_manifest(bytes: &[u8]) -> Result<(), TestCaseError> {
    match Manifest::parse(bytes) {
        Ok(manifest) => {
            prop_assert!(manifest.check().is_ok());
            prop_assert!(manifest.best_snapshot().is_some());
            prop_assert!(parse_backup_id(&manifest.backup_id).is_ok());
            let again = Manifest::parse(&manifest.to_json());
            prop_assert!(again.is_ok(), "a parsed manifest does not parse back: {again:?}");
            let _ = sha256sums(&manifest.artifacts);
            let _ = manifest.recipients();
        }
        Err(err) => {
            let _ = err.to_string();
        }
    }
    Ok(())
}

fn fence_doc() -> Value {
    json!({
        "format_version": 1, "namespace": "clusters", "hosted_cluster": "demo",
        "runs_on": {"server": "https://api.mgmt-b:6443", "kube_system_uid": "ks-b"},
        "hosted_cluster_uid": "u-2", "backup_id": ID,
        "backup_taken_on": {"server": "https://api.mgmt-a:6443/", "kube_system_uid": null},
        "by": "restore", "at": "2026-11-21T18:00:00Z", "tool_version": "0.1.0"
    })
}

fn check_fence(bytes: &[u8]) {
    if let Ok(fence) = Fence::parse(bytes) {
        let _ = fence.describe();
        let _ = fence.allows(&fence.runs_on);
        let _ = fence.to_json();
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn manifest_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check_manifest(&bytes)?;
        check_fence(&bytes);
    }

    #[test]
    fn mutated_manifest_text_never_panics(encrypted in any::<bool>(), edits in edits()) {
        let text = serde_json::to_vec_pretty(&manifest_doc(encrypted, &placeholder_artifacts())).unwrap();
        check_manifest(&mutate(&text, &edits))?;
        check_fence(&mutate(&serde_json::to_vec_pretty(&fence_doc()).unwrap(), &edits));
    }

    #[test]
    fn manifest_values_never_panic(encrypted in any::<bool>(), edits in json_edits()) {
        let doc = mutate_json(&manifest_doc(encrypted, &placeholder_artifacts()), &edits);
        check_manifest(&serde_json::to_vec(&doc).unwrap())?;
        let fence = mutate_json(&fence_doc(), &edits);
        check_fence(&serde_json::to_vec(&fence).unwrap());
    }

    #[test]
    fn object_paths_of_any_value_never_panic(obj in json_value()) {
        if let Ok(path) = objects::entry_path(&obj) {
            prop_assert!(path.ends_with(".json"));
        }
        let mut out = Vec::new();
        let _ = objects::write_tar_gz(std::slice::from_ref(&obj), &mut out);
    }
}

fn sample_objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
               "metadata": {"name": "demo", "namespace": "clusters"}, "spec": {"release": {"image": "img"}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-pull-secret", "namespace": "clusters"},
               "data": {".dockerconfigjson": "e30="}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "clusters"}}),
    ]
}

/// The objects as a plain (not gzipped) tar, as `write_tar_gz` lays them out.
fn sample_tar() -> Vec<u8> {
    let mut gz = Vec::new();
    objects::write_tar_gz(&sample_objects(), &mut gz).unwrap();
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut tar).unwrap();
    tar
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

fn check_objects(gz: &[u8]) -> Result<(), TestCaseError> {
    match objects::read_tar_gz(gz) {
        Ok(entries) => {
            for (path, value) in entries {
                prop_assert!(value.is_object());
                prop_assert_eq!(objects::entry_path(&value).ok(), Some(path));
            }
        }
        Err(err) => {
            let _ = err.to_string();
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn objects_archive_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), zipped in any::<bool>()) {
        check_objects(&if zipped { gzip(&bytes) } else { bytes })?;
    }

    /// The tar inside is mutated and gzipped again, so the tar reader (not
    /// gzip's CRC) meets the damage.
    #[test]
    fn mutated_objects_archives_never_panic(edits in edits(), rezip in any::<bool>()) {
        let tar = sample_tar();
        let damaged = if rezip {
            gzip(&mutate(&tar, &edits))
        } else {
            mutate(&gzip(&tar), &edits)
        };
        check_objects(&damaged)?;
    }
}

/// A complete, unencrypted backup in a local store, as `package` writes it,
/// with a real snapshot: the files, by name.
fn backup_files() -> Vec<(String, Vec<u8>)> {
    let snapshot = snapshot_of(&etcd_like());
    let mut tarball = Vec::new();
    objects::write_tar_gz(&sample_objects(), &mut tarball).unwrap();
    let mut files = vec![("etcd/etcd-0.db".to_string(), snapshot), (OBJECTS.to_string(), tarball)];
    let sums = sums_of(&files);
    files.push((SHA256SUMS.to_string(), sums.into_bytes()));
    let manifest = manifest_for(&files);
    files.push(("manifest.json".to_string(), manifest));
    files
}

fn listed(files: &[(String, Vec<u8>)]) -> Vec<hcp_dr::archive::Artifact> {
    files
        .iter()
        .filter(|(n, _)| n != "manifest.json")
        .map(|(n, b)| hcp_dr::archive::Artifact { name: n.clone(), size: b.len() as u64, sha256: sha256(b) })
        .collect()
}

fn sums_of(files: &[(String, Vec<u8>)]) -> String {
    sha256sums(&listed(files).into_iter().filter(|a| a.name != SHA256SUMS).collect::<Vec<_>>())
}

fn manifest_for(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let artifacts: Vec<(String, u64, String)> = listed(files).into_iter().map(|a| (a.name, a.size, a.sha256)).collect();
    serde_json::to_vec_pretty(&manifest_doc(false, &artifacts)).unwrap()
}

/// Write `files` into the backup folder of `dir`.
fn write_backup(dir: &Path, files: &[(String, Vec<u8>)]) {
    let folder = dir.join(Layout::new("clusters", "demo", ID).dir());
    for (name, bytes) in files {
        let path = folder.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

#[test]
fn stored_backups_never_panic_when_damaged() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(dir.path()));
    let layout = Layout::new("clusters", "demo", ID);
    let good = backup_files();
    write_backup(dir.path(), &good);
    rt.block_on(check::check_backup(store.as_ref(), &layout)).expect("the undamaged backup checks");

    let names: Vec<String> = good.iter().map(|(n, _)| n.clone()).collect();
    proptest!(cases(96), |(which in 0..names.len(), edits in edits(), json in json_edits(), rehash in any::<bool>())| {
        let mut files = good.clone();
        let name = names[which].clone();
        let index = files.iter().position(|(n, _)| *n == name).unwrap();
        files[index].1 = if name == "manifest.json" && rehash {
            // a manifest of another shape, still JSON
            let doc: Value = serde_json::from_slice(&good[index].1).unwrap();
            serde_json::to_vec(&mutate_json(&doc, &json)).unwrap()
        } else {
            mutate(&good[index].1, &edits)
        };
        if rehash && name != "manifest.json" {
            // the damage made consistent: the sums and the manifest agree with
            // the damaged file, so the reader gets past the hashes
            if name != SHA256SUMS {
                let sums = index_of(&files, SHA256SUMS);
                files[sums].1 = sums_of(&files).into_bytes();
            }
            let manifest = index_of(&files, "manifest.json");
            files[manifest].1 = manifest_for(&files);
        }
        write_backup(dir.path(), &files);
        let checked = rt.block_on(check::check_backup_with(store.as_ref(), &layout, None));
        match checked {
            Ok(checked) => {
                prop_assert!(checked.manifest.check().is_ok());
                prop_assert!(checked.objects.is_some());
            }
            Err(err) => {
                let _ = err.to_string();
            }
        }
        let _ = rt.block_on(check::read_manifest_at(store.as_ref(), &layout.manifest()));
        let _ = rt.block_on(hcp_dr::archive::fence::read(store.as_ref(), "clusters", "demo"));
    });
}

fn index_of(files: &[(String, Vec<u8>)], name: &str) -> usize {
    files.iter().position(|(n, _)| n == name).unwrap()
}

// ---------------------------------------------------------------------------
// Journals

fn header() -> Header {
    Header {
        operation: "backup".into(),
        playbook: "builtin:backup".into(),
        stages: vec!["pause".into(), "scale-down".into(), "snapshot".into()],
        inputs: json!({"hosted_cluster": "demo", "namespace": "clusters", "store": "/var/b"}),
        tool_version: "0.1.0".into(),
        clusters: vec![ClusterBinding {
            role: "management".into(),
            server: "https://api.mgmt:6443/".into(),
            kube_system_uid: Some("ks".into()),
            kubeconfig: Some("/home/u/.kube/config".into()),
            context: Some("admin".into()),
        }],
        run_id: "run-1".into(),
    }
}

/// A journal of a run that paused, scaled down, failed and undid.
fn journal_bytes(dir: &Path) -> Vec<u8> {
    let path = dir.join("template.journal");
    let mut journal = Journal::create(&path, header()).unwrap();
    for event in [
        Event::Started { stage: "pause".into() },
        Event::Progress { stage: "pause".into(), data: json!({"before": {"pausedUntil": null}}) },
        Event::Succeeded { stage: "pause".into(), output: json!({"paused": ["demo"]}) },
        Event::Started { stage: "scale-down".into() },
        Event::Failed { stage: "scale-down".into(), error: "timed out".into() },
        Event::UndoStarted { stage: "scale-down".into() },
        Event::Undone { stage: "scale-down".into() },
        Event::UndoStarted { stage: "pause".into() },
        Event::UndoFailed { stage: "pause".into(), error: "conflict".into() },
        Event::End { outcome: "undone".into() },
    ] {
        journal.append(event).unwrap();
    }
    drop(journal);
    std::fs::read(&path).unwrap()
}

fn event() -> impl Strategy<Value = Event> {
    let stage = || prop::sample::select(vec!["pause", "scale-down", "snapshot", "", "pause\n"]).prop_map(str::to_string);
    prop_oneof![
        Just(Event::Begin { header: header() }),
        stage().prop_map(|stage| Event::Started { stage }),
        (stage(), json_value()).prop_map(|(stage, data)| Event::Progress { stage, data }),
        (stage(), json_value()).prop_map(|(stage, output)| Event::Succeeded { stage, output }),
        (stage(), ".{0,10}").prop_map(|(stage, error)| Event::Failed { stage, error }),
        stage().prop_map(|stage| Event::UndoStarted { stage }),
        stage().prop_map(|stage| Event::Undone { stage }),
        (stage(), ".{0,10}").prop_map(|(stage, error)| Event::UndoFailed { stage, error }),
        (stage(), ".{0,10}").prop_map(|(stage, error)| Event::Halted { stage, error }),
        ".{0,10}".prop_map(|outcome| Event::End { outcome }),
    ]
}

fn check_journal(path: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    match Journal::read(path) {
        Ok(state) => {
            for record in state.stages.values() {
                let _ = record.state;
            }
            // what reads back opens for appending too
            let opened = Journal::open(path);
            prop_assert!(opened.is_ok(), "read but not opened: {:?}", opened.err());
        }
        Err(err) => {
            let _ = err.to_string();
        }
    }
    Ok(())
}

#[test]
fn journals_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = journal_bytes(dir.path());
    let path = dir.path().join("fuzzed.journal");
    let lines: Vec<Value> = String::from_utf8(good.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();

    proptest!(cases(256), |(bytes in prop::collection::vec(any::<u8>(), 0..300))| {
        check_journal(&path, &bytes)?;
    });
    proptest!(cases(256), |(edits in edits())| {
        check_journal(&path, &mutate(&good, &edits))?;
    });
    // records of the right shape in any order: replay must refuse, not panic
    proptest!(cases(256), |(events in prop::collection::vec(event(), 0..12), torn in any::<bool>())| {
        let mut text = String::new();
        for event in events {
            text.push_str(&serde_json::to_string(&Record { at: chrono::Utc::now(), event }).unwrap());
            text.push('\n');
        }
        if torn {
            text.push_str("{\"at\":\"2026-");
        }
        check_journal(&path, text.as_bytes())?;
    });
    // lines whose fields have other values and types
    proptest!(cases(256), |(line in 0..lines.len(), edits in json_edits())| {
        let mut doc = lines.clone();
        doc[line] = mutate_json(&lines[line], &edits);
        let text: String = doc.iter().map(|l| format!("{l}\n")).collect();
        check_journal(&path, text.as_bytes())?;
    });
}

// ---------------------------------------------------------------------------
// Playbooks

const YAML_PIECES: &[&str] = &[
    "operation: ",
    "backup",
    "restore",
    "description: ",
    "stages:",
    "stages: []",
    "\n",
    "\n  ",
    "  - name: ",
    "- name: ",
    "pause",
    "scale-down",
    "lock",
    "    with:",
    "\n      timeout: 5m",
    "&a ",
    "*a",
    "<<: *a",
    "[",
    "]",
    "{",
    "}",
    ", ",
    ": ",
    "- ",
    "|",
    ">-",
    "!!str ",
    "!!binary ",
    "!tag ",
    "? ",
    "---\n",
    "...\n",
    "'",
    "\"",
    "\\u",
    "#",
    "\t",
    "~",
    "null",
    "0x1F",
    ".inf",
    "1e999",
    "-9223372036854775809",
    "%YAML 1.2\n",
    "\u{feff}",
    "é",
    "\r",
    "\0",
];

fn yaml_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(YAML_PIECES), 0..40).prop_map(|p| p.concat())
}

fn check_playbook(text: &str) -> Result<(), TestCaseError> {
    let rules: [StageRules; 3] = [
        hcp_dr::stages::backup_catalog().rules(),
        hcp_dr::stages::restore::restore_catalog().rules(),
        hcp_dr::stages::migrate::migrate_catalog().rules(),
    ];
    match Playbook::parse(text, "fuzzed.yaml") {
        Ok(playbook) => {
            prop_assert!(!playbook.stages.is_empty());
            for rules in rules {
                if let Err(err) = playbook.check(&rules) {
                    let _ = err.to_string();
                }
            }
            let _ = playbook.stage_names();
        }
        Err(err) => {
            prop_assert!(err.to_string().contains("fuzzed.yaml"), "{err}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn playbook_text_never_panics(text in prop_oneof![".{0,200}", yaml_soup()]) {
        check_playbook(&text)?;
    }

    #[test]
    fn mutated_builtin_playbooks_never_panic(which in 0..registry::PLAYBOOKS.len(), edits in edits()) {
        check_playbook(&mutate_text(registry::PLAYBOOKS[which].text, &edits))?;
    }

    #[test]
    fn playbooks_of_any_shape_never_panic(edits in json_edits()) {
        let doc = json!({"operation": "backup", "description": "d", "stages": [
            {"name": "lock"}, {"name": "pause", "with": {"ttl": "30m", "n": [1, 2]}}
        ]});
        // JSON is YAML
        check_playbook(&mutate_json(&doc, &edits).to_string())?;
    }
}

#[test]
fn deeply_nested_playbooks_are_refused_not_overflowed() {
    for nest in ["[", "{a: ", "- "] {
        let deep = format!("operation: backup\nstages:\n  - name: lock\n    with: {}", nest.repeat(100_000));
        assert!(Playbook::parse(&deep, "deep.yaml").is_err(), "{nest}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, [0xff, 0xfe, b'o', b'p']).unwrap();
    let err = registry::load("backup", Some(&file)).unwrap_err().to_string();
    assert!(err.contains("p.yaml"), "{err}");
}

// ---------------------------------------------------------------------------
// age: recipients, identity files, headers

fn keypair() -> (String, String) {
    let identity = age::x25519::Identity::generate();
    let secret = age::secrecy::ExposeSecret::expose_secret(&identity.to_string()).to_string();
    (secret, identity.to_public().to_string())
}

fn encrypt_to(public: &str, plain: &[u8]) -> Vec<u8> {
    let recipient: age::x25519::Recipient = public.parse().unwrap();
    let encryptor = age::Encryptor::with_recipients(std::iter::once(&recipient as &dyn age::Recipient)).unwrap();
    let mut out = Vec::new();
    let mut writer = encryptor.wrap_output(&mut out).unwrap();
    writer.write_all(plain).unwrap();
    writer.finish().unwrap();
    out
}

const BECH32: &str = "qpzry9x8gf2tvdw0s3jn54khce6mua7l";

fn key_text() -> impl Strategy<Value = String> {
    let bech = |upper: bool| {
        prop::collection::vec(prop::sample::select(BECH32.chars().collect::<Vec<_>>()), 0..80).prop_map(move |cs| {
            let s: String = cs.into_iter().collect();
            if upper { s.to_uppercase() } else { s }
        })
    };
    prop_oneof![
        ".{0,80}",
        bech(false).prop_map(|s| format!("age1{s}")),
        bech(true).prop_map(|s| format!("AGE-SECRET-KEY-1{s}")),
        (prop::sample::select(vec!["age1", "AGE-SECRET-KEY-1", "# ", "", "AGE-PLUGIN-X-1"]), ".{0,60}")
            .prop_map(|(p, s)| format!("{p}{s}")),
    ]
}

/// Lines an age header is made of.
fn header_soup() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            "age-encryption.org/v1\n",
            "age-encryption.org/v2\n",
            "-> X25519 ",
            "-> scrypt ",
            "-> scrypt c2FsdA 64\n",
            "-> ",
            "--- ",
            "\n",
            " ",
            "-----BEGIN AGE ENCRYPTED FILE-----\n",
            "-----END AGE ENCRYPTED FILE-----\n",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        "[A-Za-z0-9+/]{0,70}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..40),
    ];
    prop::collection::vec(piece, 0..16).prop_map(|p| p.concat())
}

fn decrypt_all(rt: &tokio::runtime::Runtime, cipher: &[u8], ids: &Identities) {
    rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let body: hcp_dr::store::Body<'_> = Box::new(cipher);
        match encryption::decrypting_reader(body, ids, "fuzzed", &[]).await {
            Ok(mut reader) => {
                let mut out = Vec::new();
                let _ = reader.read_to_end(&mut out).await;
            }
            Err(err) => {
                let _ = err.to_string();
            }
        }
    });
}

fn decrypt_file(path: &Path, cipher: &[u8], ids: &Identities, seeks: &[(u8, i64)]) {
    std::fs::write(path, cipher).unwrap();
    let file = std::fs::File::open(path).unwrap();
    let Ok(mut reader) = encryption::decrypting_file(file, ids, "fuzzed", &[]) else { return };
    let mut buf = [0u8; 100];
    for (whence, at) in seeks {
        let to = match whence % 3 {
            0 => SeekFrom::Start(at.unsigned_abs()),
            1 => SeekFrom::End(*at),
            _ => SeekFrom::Current(*at),
        };
        if reader.seek(to).is_ok() {
            let _ = reader.read(&mut buf);
        }
    }
}

#[test]
fn age_keys_and_headers_never_panic() {
    let rt = runtime();
    let (secret, public) = keypair();
    let ids = Identities::parse(Path::new("k"), &format!("# key\n{secret}\n")).unwrap();
    // one chunk and a bit: the header, a full 64 KiB chunk and a short last one
    let plain: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    let cipher = encrypt_to(&public, &plain);
    let small = encrypt_to(&public, b"apiVersion: v1\nkind: Secret\n");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.age");

    proptest!(cases(512), |(text in key_text(), more in key_text())| {
        if let Ok(Some(recipients)) = Recipients::parse(&[text.clone(), more.clone()]) {
            prop_assert!(!recipients.names().is_empty());
        }
        match Identities::parse(Path::new("key.txt"), &format!("{text}\n{more}")) {
            Ok(parsed) => prop_assert!(!parsed.public_keys().is_empty()),
            // never the line itself: it may be a private key (short lines
            // may be a word of the message)
            Err(err) => prop_assert!(text.trim().len() < 20 || !err.to_string().contains(text.trim()), "{err}"),
        }
    });
    proptest!(cases(256), |(head in header_soup(), tail in prop::collection::vec(any::<u8>(), 0..64))| {
        let bytes = [head, tail].concat();
        let _ = encryption::is_age(&bytes);
        decrypt_all(&rt, &bytes, &ids);
    });
    // the header region of a real file, damaged: short files are mostly header
    proptest!(cases(256), |(edits in edits())| {
        decrypt_all(&rt, &mutate(&small, &edits), &ids);
    });
    proptest!(cases(48), |(edits in edits(), seeks in prop::collection::vec((any::<u8>(), prop_oneof![any::<i64>(), -70_100i64..70_100]), 0..4))| {
        let damaged = mutate(&cipher, &edits);
        decrypt_all(&rt, &damaged, &ids);
        decrypt_file(&path, &damaged, &ids, &seeks);
    });
}

// ---------------------------------------------------------------------------
// etcd snapshots (bbolt)

const PAGE: usize = 4096;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;

fn page(id: u64, flags: u16, count: u16, overflow: u32, size: usize) -> Vec<u8> {
    let mut p = vec![0u8; size];
    p[0..8].copy_from_slice(&id.to_le_bytes());
    p[8..10].copy_from_slice(&flags.to_le_bytes());
    p[10..12].copy_from_slice(&count.to_le_bytes());
    p[12..16].copy_from_slice(&overflow.to_le_bytes());
    p
}

fn meta_page(id: u64, root: u64, pgid: u64, txid: u64, freelist: u64) -> Vec<u8> {
    let mut p = page(id, META_PAGE, 0, 0, PAGE);
    let m = &mut p[PAGE_HEADER..PAGE_HEADER + 64];
    m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    m[4..8].copy_from_slice(&VERSION.to_le_bytes());
    m[8..12].copy_from_slice(&(PAGE as u32).to_le_bytes());
    m[16..24].copy_from_slice(&root.to_le_bytes());
    m[32..40].copy_from_slice(&freelist.to_le_bytes());
    m[40..48].copy_from_slice(&pgid.to_le_bytes());
    m[48..56].copy_from_slice(&txid.to_le_bytes());
    let sum = bbolt::fnv64a(&m[..56]);
    m[56..64].copy_from_slice(&sum.to_le_bytes());
    p
}

/// A leaf page (size 0: an inline page, exactly as long as its content).
fn leaf(id: u64, entries: &[(u32, &[u8], &[u8])], size: usize) -> Vec<u8> {
    let body: usize = entries.iter().map(|(_, k, v)| k.len() + v.len()).sum();
    let needed = PAGE_HEADER + entries.len() * ELEMENT + body;
    let pages = needed.checked_div(size).map(|_| needed.div_ceil(size));
    let span = pages.map_or(needed, |n| n * size);
    let overflow = pages.map_or(0, |n| (n - 1) as u32);
    let mut p = page(id, LEAF_PAGE, entries.len() as u16, overflow, span);
    let mut data = PAGE_HEADER + entries.len() * ELEMENT;
    for (i, (flags, key, value)) in entries.iter().enumerate() {
        let at = PAGE_HEADER + i * ELEMENT;
        p[at..at + 4].copy_from_slice(&flags.to_le_bytes());
        p[at + 4..at + 8].copy_from_slice(&((data - at) as u32).to_le_bytes());
        p[at + 8..at + 12].copy_from_slice(&(key.len() as u32).to_le_bytes());
        p[at + 12..at + 16].copy_from_slice(&(value.len() as u32).to_le_bytes());
        p[data..data + key.len()].copy_from_slice(key);
        data += key.len();
        p[data..data + value.len()].copy_from_slice(value);
        data += value.len();
    }
    p
}

fn branch(id: u64, children: &[(&[u8], u64)]) -> Vec<u8> {
    let mut p = page(id, BRANCH_PAGE, children.len() as u16, 0, PAGE);
    let mut data = PAGE_HEADER + children.len() * ELEMENT;
    for (i, (key, child)) in children.iter().enumerate() {
        let at = PAGE_HEADER + i * ELEMENT;
        p[at..at + 4].copy_from_slice(&((data - at) as u32).to_le_bytes());
        p[at + 4..at + 8].copy_from_slice(&(key.len() as u32).to_le_bytes());
        p[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
        p[data..data + key.len()].copy_from_slice(key);
        data += key.len();
    }
    p
}

fn bucket_at(root: u64) -> Vec<u8> {
    let mut v = root.to_le_bytes().to_vec();
    v.extend_from_slice(&[0u8; 8]);
    v
}

fn revision_key(main: u64, tombstone: bool) -> Vec<u8> {
    let mut k = main.to_be_bytes().to_vec();
    k.push(b'_');
    k.extend_from_slice(&0u64.to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

/// mvccpb.KeyValue with key, create/mod revision, version and value.
fn key_value(key: &[u8], revision: u64, value: &[u8]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut n: u64) {
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }
    let mut out = vec![0x0a];
    varint(&mut out, key.len() as u64);
    out.extend_from_slice(key);
    for field in [0x10u8, 0x18, 0x20] {
        out.push(field);
        varint(&mut out, revision);
    }
    if !value.is_empty() {
        out.push(0x2a);
        varint(&mut out, value.len() as u64);
        out.extend_from_slice(value);
    }
    out
}

/// An etcd-like bbolt database: a root leaf (page 2) holding the `key`
/// bucket (a branch at page 3 over leaves 4 and 5, the second with an
/// overflow page), an inline `meta` bucket and a `lease` bucket with a
/// nested inline bucket; a freelist at page 7 listing page 8. Pages 0..=8.
fn etcd_like() -> Vec<u8> {
    let kv = |rev: u64, key: &str, value: &[u8]| (revision_key(rev, false), key_value(key.as_bytes(), rev, value));
    let r2 = kv(2, "/registry/secrets/clusters/a", b"one");
    let r3 = kv(3, "/registry/configmaps/clusters/b", b"two");
    let r4 = kv(4, "/a/x/3", b"three");
    let r5 = kv(5, "/b/y/1", &[7u8; 5000]);
    let r6 = kv(6, "/a/x/2", b"two again");
    let r7 = (revision_key(7, true), key_value(b"/registry/secrets/clusters/a", 7, b""));
    let leaf4 = leaf(4, &[(0, &r2.0, &r2.1), (0, &r3.0, &r3.1), (0, &r4.0, &r4.1)], PAGE);
    let leaf5 = leaf(5, &[(0, &r5.0, &r5.1), (0, &r6.0, &r6.1), (0, &r7.0, &r7.1)], PAGE);
    let branch3 = branch(3, &[(&r2.0, 4), (&r5.0, 5)]);
    let inline = |entries: &[(u32, &[u8], &[u8])]| {
        let mut v = bucket_at(0);
        v.extend_from_slice(&leaf(0, entries, 0));
        v
    };
    let meta_bucket = inline(&[
        (0, b"consistent_index", &42u64.to_be_bytes()),
        (0, b"finishedCompactRev", &revision_key(3, false)),
        (0, b"scheduledCompactRev", &revision_key(3, false)),
    ]);
    let nested = inline(&[(0, b"x", b"y")]);
    let lease_bucket = inline(&[(0, b"a", b"1"), (BUCKET_LEAF_FLAG, b"n", &nested)]);
    let root = leaf(
        2,
        &[
            (BUCKET_LEAF_FLAG, b"key", &bucket_at(3)),
            (BUCKET_LEAF_FLAG, b"lease", &lease_bucket),
            (BUCKET_LEAF_FLAG, b"meta", &meta_bucket),
        ],
        PAGE,
    );
    let mut freelist = page(7, bbolt::FREELIST_PAGE, 1, 0, PAGE);
    freelist[PAGE_HEADER..PAGE_HEADER + 8].copy_from_slice(&8u64.to_le_bytes());
    let mut db = meta_page(0, 2, 9, 10, 7);
    db.extend(meta_page(1, 2, 9, 9, NO_FREELIST));
    db.extend(root);
    db.extend(branch3);
    db.extend(leaf4);
    assert_eq!(leaf5.len(), 2 * PAGE, "leaf 5 has one overflow page");
    db.extend(leaf5);
    db.extend(freelist);
    db.extend(page(8, 0, 0, 0, PAGE));
    db
}

/// A snapshot: the database and etcd's trailing SHA-256 of it.
fn snapshot_of(db: &[u8]) -> Vec<u8> {
    let mut out = db.to_vec();
    out.extend_from_slice(&Sha256::digest(db));
    out
}

/// Make both meta pages' checksums match their (damaged) content again, so
/// the damage reaches past the meta check.
fn fix_meta_checksums(db: &mut [u8]) {
    for at in [0, PAGE] {
        let meta = at + PAGE_HEADER;
        if db.len() >= meta + 64 {
            let sum = bbolt::fnv64a(&db[meta..meta + 56]);
            db[meta + 56..meta + 64].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

#[derive(Default)]
struct Count(u64);

impl bbolt::Visitor for Count {
    fn bucket(&mut self, _: &[u8]) {
        self.0 += 1;
    }
    fn entry(&mut self, _: &[u8], _: Option<&[u8]>) {
        self.0 += 1;
    }
}

/// Every reader of the snapshot on `bytes`, told the data is `len` bytes
/// long (callers pass a file's length; it may disagree with the reader).
fn check_snapshot(bytes: &[u8], len: u64) -> Result<(), TestCaseError> {
    match verify::verify_reader(Cursor::new(bytes), len) {
        Ok(report) => {
            if report.is_ok() {
                prop_assert!(report.summary.is_some() && report.structure_error.is_none());
            }
            let _ = serde_json::to_string(&report);
            let _ = report.verdict.to_string();
        }
        Err(err) => {
            let _ = err.to_string();
        }
    }
    let mut cursor = Cursor::new(bytes);
    if let Ok(meta) = bbolt::read_meta(&mut cursor, len) {
        prop_assert!(meta.page_size.is_power_of_two());
    }
    let _ = bbolt::parse_meta(0, bytes);
    if let Ok(mut db) = bbolt::Db::open(Cursor::new(bytes), len) {
        let _ = db.walk(&mut Count::default()).map_err(|e| e.to_string());
    }
    Ok(())
}

/// Mostly in place: a database cut short is found by its size alone.
fn page_aligned_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        1 => edit(),
        2 => (any::<usize>(), byte()).prop_map(|(at, b)| Edit::Set(at, b)),
        // the headers, elements and meta fields at the start of each page
        4 => (0usize..9, 0usize..160, prop::sample::select(vec![1usize, 2, 4, 8]), word())
            .prop_map(|(p, o, w, v)| Edit::Word(p * PAGE + o, w, v)),
    ]
}

#[test]
fn snapshots_never_panic() {
    let db = etcd_like();
    let good = snapshot_of(&db);
    let report = verify::verify_reader(Cursor::new(&good), good.len() as u64).unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(report.summary.as_ref().unwrap().pages.free_pages, Some(1), "{report:?}");

    proptest!(cases(256), |(bytes in prop::collection::vec(any::<u8>(), 0..9000))| {
        check_snapshot(&bytes, bytes.len() as u64)?;
    });
    proptest!(cases(256), |(edits in prop::collection::vec(page_aligned_edit(), 1..6), fix in any::<bool>(), rehash in any::<bool>(), skew in prop_oneof![6 => Just(0i64), 1 => -40i64..40, 1 => i64::MIN..0])| {
        let mut damaged = mutate(&db, &edits);
        if fix {
            fix_meta_checksums(&mut damaged);
        }
        let snapshot = if rehash { snapshot_of(&damaged) } else { mutate(&good, &edits) };
        let len = (snapshot.len() as u64).saturating_add_signed(skew);
        check_snapshot(&snapshot, len)?;
        check_snapshot(&damaged, damaged.len() as u64)?;
    });
}

/// Found by the property tests: the reader allocated a bitmap of the
/// meta's page count (`pgid / 8` bytes) once the given length could hold
/// that many pages, before reading one. A length far past the data (a wrong
/// `len`, or a sparse file on a file system that allows 2 PiB ones) aborted
/// the process: "memory allocation of 68719476736 bytes failed". Now a meta
/// claiming more than 1 TiB, or pages past the data, is refused first.
#[test]
fn a_page_count_far_past_the_data_is_refused_not_allocated() {
    let mut db = etcd_like();
    db[PAGE_HEADER + 40..PAGE_HEADER + 48].copy_from_slice(&(1u64 << 39).to_le_bytes());
    fix_meta_checksums(&mut db);
    match verify::verify_reader(Cursor::new(&db), 1 << 51) {
        Ok(report) => assert!(!report.is_ok(), "{report:?}"),
        Err(err) => assert!(!err.to_string().is_empty()),
    }
}

#[test]
fn encrypted_snapshots_never_panic() {
    let (secret, public) = keypair();
    let ids = Identities::parse(Path::new("k"), &secret).unwrap();
    let db = etcd_like();
    let cipher = encrypt_to(&public, &snapshot_of(&db));
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("etcd-0.db");
    let decryption = Decryption { identities: Some(&ids), recipients: &[] };
    std::fs::write(&path, &cipher).unwrap();
    assert!(verify::verify_file_with(&path, &decryption).unwrap().is_ok());

    proptest!(cases(48), |(edits in prop::collection::vec(page_aligned_edit(), 1..4), plaintext in any::<bool>())| {
        let bytes = if plaintext {
            // a damaged database, well encrypted: read at random through age
            let mut damaged = mutate(&db, &edits);
            fix_meta_checksums(&mut damaged);
            encrypt_to(&public, &snapshot_of(&damaged))
        } else {
            mutate(&cipher, &edits)
        };
        std::fs::write(&path, &bytes).unwrap();
        for decryption in [decryption, Decryption::default()] {
            match verify::verify_file_with(&path, &decryption) {
                Ok(report) => {
                    let _ = report.verdict.to_string();
                }
                Err(err) => {
                    let _ = err.to_string();
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------
// Kubeconfigs (read only here: src/kube is not changed by these tests)

struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn pki() -> Pki {
    use base64::Engine;
    let ca = hcp_dr_e2e::pki::Ca::new("fuzz-ca").unwrap();
    let pair = ca
        .issue(&hcp_dr_e2e::pki::CertSpec {
            common_name: "admin".into(),
            organization: Some("system:masters".into()),
            client: true,
            ..Default::default()
        })
        .unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    Pki { ca: b64(ca.cert_pem()), cert: b64(&pair.cert_pem), key: b64(&pair.key_pem) }
}

/// A kubeconfig with a client certificate, a token user and two contexts;
/// never an exec or auth-provider user (those run programs).
fn kubeconfig_doc(pki: &Pki) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "mgmt", "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority-data": pki.ca, "tls-server-name": "api.mgmt"}},
            {"name": "plain", "cluster": {"server": "http://127.0.0.1:8080", "insecure-skip-tls-verify": true}}
        ],
        "users": [
            {"name": "admin", "user": {"client-certificate-data": pki.cert, "client-key-data": pki.key}},
            {"name": "bot", "user": {"token": "abc", "impersonate": "x", "impersonate-groups": ["g"]}}
        ],
        "contexts": [
            {"name": "admin", "context": {"cluster": "mgmt", "user": "admin", "namespace": "clusters"}},
            {"name": "bot", "context": {"cluster": "plain", "user": "bot"}}
        ],
        "current-context": "admin",
        "preferences": {}
    })
}

fn yaml_of(doc: &Value) -> String {
    serde_saphyr::to_string(doc).unwrap_or_else(|_| doc.to_string())
}

/// Build a client from kubeconfig text the two ways hcp-dr does: from a
/// file (`--kubeconfig`) and from text (the hosted cluster's kubeconfig
/// Secret, as `restore`'s wait reads it). No request is sent.
fn check_kubeconfig(rt: &tokio::runtime::Runtime, path: &Path, text: &str, context: Option<&str>) {
    std::fs::write(path, text).unwrap();
    rt.block_on(async {
        if let Err(err) = hcp_dr::kube::client(Some(path), context).await {
            let _ = err.to_string();
        }
        if let Ok(file) = kube::config::Kubeconfig::from_yaml(text) {
            let options = kube::config::KubeConfigOptions { context: context.map(str::to_string), ..Default::default() };
            if let Ok(config) = kube::Config::from_custom_kubeconfig(file, &options).await {
                let _ = kube::Client::try_from(config).map_err(|e| e.to_string());
            }
        }
    });
}

fn never_runs_programs(text: &str) -> bool {
    !text.contains("exec") && !text.contains("auth-provider") && !text.contains("command")
}

#[test]
fn kubeconfigs_never_panic() {
    let rt = runtime();
    let pki = pki();
    let doc = kubeconfig_doc(&pki);
    let good = yaml_of(&doc);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, &good).unwrap();
    rt.block_on(hcp_dr::kube::client(Some(&path), None)).expect("the undamaged kubeconfig builds a client");
    let context = || prop::option::of(prop::sample::select(vec!["admin", "bot", "missing", ""]));

    proptest!(cases(64), |(text in prop_oneof![".{0,200}", yaml_soup()], ctx in context())| {
        prop_assume!(never_runs_programs(&text));
        check_kubeconfig(&rt, &path, &text, ctx);
    });
    proptest!(cases(64), |(edits in edits(), ctx in context())| {
        let text = mutate_text(&good, &edits);
        prop_assume!(never_runs_programs(&text));
        check_kubeconfig(&rt, &path, &text, ctx);
    });
    // fields of other values and types: servers, certificates, proxies, names
    let servers = vec![
        "https://127.0.0.1:6443", "http://[::1", "", "not a url", "https://h:99999", "unix:///x", "https://[fe80::1%25eth0]:6443",
        "https://user:pw@h/path?q#f", "socks5://127.0.0.1:1080", "http://", "https://\u{1f4a5}", "https://h:6443/\0",
    ];
    proptest!(cases(96), |(edits in json_edits(), server in prop::sample::select(servers.clone()), field in 0usize..6, ctx in context())| {
        let mut doc = mutate_json(&doc, &edits);
        if let Some(Value::Object(cluster)) = doc.pointer_mut("/clusters/0/cluster") {
            let name = ["server", "proxy-url", "tls-server-name", "certificate-authority", "server", "certificate-authority-data"][field];
            cluster.insert(name.to_string(), Value::from(server));
        }
        let text = yaml_of(&doc);
        prop_assume!(never_runs_programs(&text));
        check_kubeconfig(&rt, &path, &text, ctx);
    });
}
