//! Every embedded playbook and the operation that runs it: the one list
//! from which `hcp-dr playbook show`, the lookup of a playbook by name and
//! the check of every embedded playbook (stages, order, parameters) derive.
//! Adding an operation adds one line here (see docs/architecture.md).

use std::path::Path;

use super::OpsError;
use super::run::StageInfo;
use crate::pipeline::{Playbook, PlaybookError};

/// One embedded playbook: `playbooks/<name>.yaml`, and its stages as its
/// operation's catalog describes them.
pub struct Entry {
    pub name: &'static str,
    pub text: &'static str,
    describe: fn(Option<&Path>) -> Result<Vec<StageInfo>, OpsError>,
}

impl Entry {
    /// The stages of this playbook (or of `file` in its place), checked
    /// against the operation's catalog, with what each does.
    pub fn describe(&self, file: Option<&Path>) -> Result<Vec<StageInfo>, OpsError> {
        (self.describe)(file)
    }
}

macro_rules! entry {
    ($name:literal, $operation:expr) => {
        Entry {
            name: $name,
            text: include_str!(concat!("../../playbooks/", $name, ".yaml")),
            describe: |file| $operation.with_playbook($name).describe(file),
        }
    };
}

pub const PLAYBOOKS: &[Entry] = &[
    entry!("backup", super::backup::operation()),
    entry!("restore", super::restore::operation()),
    entry!("restore-dns-takeover", super::restore::operation()),
    entry!("migrate", super::migrate::operation()),
    entry!("drill", super::drill::operation()),
    entry!("etcd-recover", super::etcd::operation()),
    entry!("etcd-restore", super::etcd_restore::operation()),
    entry!("cluster-reconcile", super::reconcile::operation()),
    entry!("cluster-destroy", super::cluster::destroy_operation()),
    entry!("fence", super::fence::fence_operation()),
    entry!("fence-release", super::fence::release_operation()),
];

/// The embedded playbook `name`.
pub fn find(name: &str) -> Result<&'static Entry, OpsError> {
    PLAYBOOKS.iter().find(|entry| entry.name == name).ok_or_else(|| {
        OpsError::Input(format!("no operation has a playbook `{name}`; known: {}", names().join(", ")))
    })
}

/// Every embedded playbook's name, in the order listed.
pub fn names() -> Vec<&'static str> {
    PLAYBOOKS.iter().map(|entry| entry.name).collect()
}

/// Load `--playbook FILE` or the embedded playbook `name`, parsed (not yet
/// checked against a catalog).
pub fn load(name: &str, file: Option<&Path>) -> Result<Playbook, PlaybookError> {
    match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| PlaybookError::Syntax {
                origin: path.display().to_string(),
                message: e.to_string(),
            })?;
            Playbook::parse(&text, &path.display().to_string())
        }
        None => match PLAYBOOKS.iter().find(|entry| entry.name == name) {
            Some(entry) => Playbook::parse(entry.text, &format!("builtin:{name}")),
            None => Err(PlaybookError::Syntax {
                origin: format!("builtin:{name}"),
                message: format!("no embedded playbook for `{name}`"),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every embedded playbook names only stages its operation has, in an
    /// order its rules allow, with parameters its stages take; and every
    /// file under playbooks/ is embedded.
    #[test]
    fn every_embedded_playbook_checks_against_its_operation() {
        for entry in PLAYBOOKS {
            let stages = entry.describe(None).unwrap_or_else(|e| panic!("{}: {e}", entry.name));
            assert!(!stages.is_empty(), "{}: empty playbook", entry.name);
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("playbooks");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".yaml").map(str::to_string))
            .collect();
        files.sort();
        let mut listed = names();
        listed.sort();
        assert_eq!(files, listed, "playbooks/ and the registry differ");
    }
}
