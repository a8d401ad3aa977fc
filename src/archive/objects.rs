//! `objects.tar.gz`: every exported object as one pretty JSON document
//! (JSON is YAML, and it round-trips every value exactly), at
//! `<Kind>[.<group>]/<namespace or _cluster>/<name>.json`. Entries are sorted
//! and carry no timestamps, so the same objects give the same bytes.

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde_json::Value;

use super::ArchiveError;

/// Where an object goes inside the tarball.
pub fn entry_path(obj: &Value) -> Result<String, ArchiveError> {
    let kind = obj["kind"].as_str().filter(|k| !k.is_empty());
    let name = obj["metadata"]["name"].as_str().filter(|n| !n.is_empty());
    let (Some(kind), Some(name)) = (kind, name) else {
        return Err(ArchiveError::Objects(format!(
            "an object without kind or metadata.name cannot be archived: {}",
            obj.get("metadata").map(|m| m.to_string()).unwrap_or_default()
        )));
    };
    let group = obj["apiVersion"]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .map(|(g, _)| g)
        .unwrap_or("");
    let folder = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
    let namespace = obj["metadata"]["namespace"].as_str().unwrap_or("_cluster");
    Ok(format!("{folder}/{namespace}/{name}.json"))
}

/// Write `objects` as a deterministic tar.gz into `out`.
pub fn write_tar_gz(objects: &[Value], out: impl Write) -> Result<(), ArchiveError> {
    let mut entries = objects
        .iter()
        .map(|obj| Ok((entry_path(obj)?, obj)))
        .collect::<Result<Vec<_>, ArchiveError>>()?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(dup) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ArchiveError::Objects(format!("two objects map to {}", dup[0].0)));
    }
    let err = |e: std::io::Error| ArchiveError::Objects(e.to_string());
    let mut tar = tar::Builder::new(GzEncoder::new(out, Compression::default()));
    for (path, obj) in entries {
        let mut body = serde_json::to_vec_pretty(obj).map_err(|e| ArchiveError::Objects(e.to_string()))?;
        body.push(b'\n');
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o600);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, &path, &body[..]).map_err(err)?;
    }
    tar.into_inner().map_err(err)?.finish().map_err(err)?.flush().map_err(err)
}

/// Read every object back; an entry that is not a JSON object is an error naming it.
pub fn read_tar_gz(input: impl Read) -> Result<Vec<(String, Value)>, ArchiveError> {
    let err = |e: std::io::Error| ArchiveError::Objects(e.to_string());
    let mut archive = tar::Archive::new(GzDecoder::new(input));
    let mut out = Vec::new();
    for entry in archive.entries().map_err(err)? {
        let mut entry = entry.map_err(err)?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().map_err(err)?.to_string_lossy().to_string();
        let mut body = Vec::new();
        entry.read_to_end(&mut body).map_err(err)?;
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| ArchiveError::Objects(format!("{path}: not a JSON document: {e}")))?;
        if !value.is_object() || entry_path(&value)? != path {
            return Err(ArchiveError::Objects(format!("{path}: does not hold the object its path names")));
        }
        out.push((path, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn objects() -> Vec<Value> {
        vec![
            json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                   "metadata": {"name": "demo", "namespace": "clusters"},
                   "spec": {"x-unknown-field": {"kept": [1, 2.5, "3", null, true]}}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo-pull-secret", "namespace": "clusters"},
                   "data": {".dockerconfigjson": "e30="}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "clusters"}}),
        ]
    }

    #[test]
    fn round_trips_losslessly_and_deterministically() {
        let mut a = Vec::new();
        write_tar_gz(&objects(), &mut a).unwrap();
        let mut b = Vec::new();
        let mut reversed = objects();
        reversed.reverse();
        write_tar_gz(&reversed, &mut b).unwrap();
        assert_eq!(a, b, "same objects, same bytes");
        let back = read_tar_gz(&a[..]).unwrap();
        let paths: Vec<_> = back.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "HostedCluster.hypershift.openshift.io/clusters/demo.json",
                "Namespace/_cluster/clusters.json",
                "Secret/clusters/demo-pull-secret.json"
            ]
        );
        assert_eq!(back[0].1, objects()[0]);
    }

    #[test]
    fn refuses_nameless_and_duplicate_objects() {
        let mut out = Vec::new();
        assert!(write_tar_gz(&[json!({"kind": "Secret", "metadata": {}})], &mut out).is_err());
        let twice = vec![objects()[1].clone(), objects()[1].clone()];
        assert!(write_tar_gz(&twice, &mut out).unwrap_err().to_string().contains("two objects"));
    }

    #[test]
    fn corrupt_archives_are_refused() {
        let mut a = Vec::new();
        write_tar_gz(&objects(), &mut a).unwrap();
        let mid = a.len() / 2;
        a[mid] ^= 0xff;
        assert!(read_tar_gz(&a[..]).is_err());
        assert!(read_tar_gz(&b"not gzip"[..]).is_err());
    }
}
