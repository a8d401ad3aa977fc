//! The playbooks shipped in `playbooks/`, embedded in the binary.

use super::playbook::{Playbook, PlaybookError};

/// `(name, text)` of every embedded playbook.
pub const BUILTIN: &[(&str, &str)] = &[
    ("backup", include_str!("../../playbooks/backup.yaml")),
    ("restore", include_str!("../../playbooks/restore.yaml")),
    ("restore-dns-takeover", include_str!("../../playbooks/restore-dns-takeover.yaml")),
    ("migrate", include_str!("../../playbooks/migrate.yaml")),
    ("etcd-recover", include_str!("../../playbooks/etcd-recover.yaml")),
    ("etcd-restore", include_str!("../../playbooks/etcd-restore.yaml")),
    ("cluster-reconcile", include_str!("../../playbooks/cluster-reconcile.yaml")),
    ("cluster-destroy", include_str!("../../playbooks/cluster-destroy.yaml")),
    ("drill", include_str!("../../playbooks/drill.yaml")),
    ("fence", include_str!("../../playbooks/fence.yaml")),
    ("fence-release", include_str!("../../playbooks/fence-release.yaml")),
];

/// The embedded playbook `name`, parsed.
pub fn builtin(name: &str) -> Option<Result<Playbook, PlaybookError>> {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, text)| Playbook::parse(text, &format!("builtin:{n}")))
}

/// Load `--playbook FILE` or the embedded default for `operation`.
pub fn load(operation: &str, file: Option<&std::path::Path>) -> Result<Playbook, PlaybookError> {
    match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| PlaybookError::Syntax {
                origin: path.display().to_string(),
                message: e.to_string(),
            })?;
            Playbook::parse(&text, &path.display().to_string())
        }
        None => builtin(operation).unwrap_or_else(|| {
            Err(PlaybookError::Syntax {
                origin: format!("builtin:{operation}"),
                message: format!("no embedded playbook for `{operation}`"),
            })
        }),
    }
}
