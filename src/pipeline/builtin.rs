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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_playbooks_parse_and_check() {
        let backup = builtin("backup").unwrap().unwrap();
        backup.check(&crate::stages::BACKUP_RULES).unwrap();
        let catalog = crate::stages::backup_catalog();
        for stage in backup.stage_names() {
            assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
        }
        let migrate = builtin("migrate").unwrap().unwrap();
        migrate.check(&crate::stages::migrate::MIGRATE_RULES).unwrap();
        let catalog = crate::stages::migrate::migrate_catalog();
        for stage in migrate.stage_names() {
            assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
        }
        for name in ["restore", "restore-dns-takeover"] {
            let restore = builtin(name).unwrap().unwrap();
            restore.check(&crate::stages::restore::RESTORE_RULES).unwrap();
            let catalog = crate::stages::restore::restore_catalog();
            for stage in restore.stage_names() {
                assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
            }
        }
        let recover = builtin("etcd-recover").unwrap().unwrap();
        recover.check(&crate::stages::etcd_ops::RECOVER_RULES).unwrap();
        let catalog = crate::stages::etcd_ops::recover_catalog();
        for stage in recover.stage_names() {
            assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
        }
        let drill = builtin("drill").unwrap().unwrap();
        drill.check(&crate::stages::drill::DRILL_RULES).unwrap();
        let catalog = crate::stages::drill::drill_catalog();
        for stage in drill.stage_names() {
            assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
        }
        let destroy = builtin("cluster-destroy").unwrap().unwrap();
        destroy.check(&crate::stages::cluster_destroy::DESTROY_RULES).unwrap();
        for (name, rules, catalog) in [
            ("fence", &crate::stages::fence::FENCE_RULES, crate::stages::fence::fence_catalog()),
            ("fence-release", &crate::stages::fence::RELEASE_RULES, crate::stages::fence::release_catalog()),
        ] {
            let playbook = builtin(name).unwrap().unwrap();
            playbook.check(rules).unwrap();
            for stage in playbook.stage_names() {
                assert!(catalog.get(&stage).is_some(), "{name}: {stage} has no implementation");
            }
        }
        let catalog = crate::stages::cluster_destroy::destroy_catalog();
        for stage in destroy.stage_names() {
            assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
        }
        let reconcile = builtin("cluster-reconcile").unwrap().unwrap();
        reconcile.check(&crate::stages::reconcile::RECONCILE_RULES).unwrap();
        let catalog = crate::stages::reconcile::reconcile_catalog();
        for stage in reconcile.stage_names() {
            assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
        }
        let etcd_restore = builtin("etcd-restore").unwrap().unwrap();
        etcd_restore.check(&crate::stages::etcd_restore::ETCD_RESTORE_RULES).unwrap();
        let catalog = crate::stages::etcd_restore::etcd_restore_catalog();
        for stage in etcd_restore.stage_names() {
            assert!(catalog.get(&stage).is_some(), "{stage} has no implementation");
        }
    }
}
