//! Which management cluster a run works on, bound to its journal: a fresh
//! run records the cluster it reached (server, kube-system UID, kubeconfig
//! path and context, never credentials); `--resume` and `--abort` reach it
//! again through what was recorded, unless the flags say otherwise, and
//! refuse any other cluster before changing anything.

use std::path::Path;

use kube::Client;

use super::OpsError;
use crate::pipeline::JournalState;
use crate::pipeline::journal::ClusterBinding;

/// A management cluster reached for a run, and its journal record.
pub struct Target {
    pub client: Client,
    pub binding: ClusterBinding,
}

/// Reach the cluster playing `role` in a run. A fresh run (`journal` None)
/// connects through the flags (or the environment's defaults). A resumed or
/// aborted run connects through the flags when given, else through the
/// kubeconfig and context its journal recorded, and refuses (bad input,
/// exit 2, nothing changed) when that is not the cluster the run changed.
pub async fn reach(
    role: &str,
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    journal: Option<(&Path, &JournalState)>,
) -> Result<Target, OpsError> {
    let given = kubeconfig.map(|p| p.to_string_lossy().into_owned());
    let recorded = journal.and_then(|(_, state)| state.header.clusters.iter().find(|c| c.role == role));
    // the recorded context belongs to the recorded kubeconfig: another file
    // given by flag is used with its own (or the given) context
    let context = context
        .map(str::to_string)
        .or_else(|| if given.is_none() { recorded.and_then(|r| r.context.clone()) } else { None });
    let kubeconfig = given.or_else(|| recorded.and_then(|r| r.kubeconfig.clone()));
    let connected = crate::kube::connect(kubeconfig.as_deref(), context.as_deref()).await?;
    let binding = ClusterBinding {
        role: role.to_string(),
        server: connected.server,
        kube_system_uid: connected.kube_system_uid,
        kubeconfig: connected.kubeconfig,
        context: connected.context,
    };
    if let Some((path, state)) = journal {
        match recorded {
            Some(recorded) => check_same(path, recorded, &binding)?,
            None if state.header.clusters.is_empty() => tracing::warn!(
                journal = %path.display(),
                "the journal records no management cluster (written by an older hcp-dr): make sure --kubeconfig/--context name the cluster that run changed"
            ),
            None => {
                return Err(OpsError::Input(format!(
                    "{}: the journal records no {role} cluster; it was not written by this operation",
                    path.display()
                )));
            }
        }
    }
    Ok(Target {
        client: connected.client,
        binding,
    })
}

/// Refuse a cluster other than the one the journal's run changed.
pub fn check_same(journal: &Path, recorded: &ClusterBinding, reached: &ClusterBinding) -> Result<(), OpsError> {
    if recorded.same_cluster(reached) {
        return Ok(());
    }
    Err(OpsError::Input(format!(
        "{journal}: refusing to touch another management cluster. The run changed the {role} cluster {want} (kubeconfig {kc}, context {ctx}), but {via} reaches {got}. Nothing was changed. Drop --kubeconfig/--context to use the recorded ones, or point them at that cluster.",
        journal = journal.display(),
        role = recorded.role,
        want = recorded.describe(),
        kc = recorded.kubeconfig.as_deref().unwrap_or("(in-cluster)"),
        ctx = recorded.context.as_deref().unwrap_or("(default)"),
        via = match (&reached.kubeconfig, &reached.context) {
            (Some(k), Some(c)) => format!("kubeconfig {k}, context {c},"),
            (Some(k), None) => format!("kubeconfig {k}"),
            _ => "the in-cluster configuration".into(),
        },
        got = reached.describe(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(server: &str, uid: Option<&str>) -> ClusterBinding {
        ClusterBinding {
            role: "destination".into(),
            server: server.into(),
            kube_system_uid: uid.map(str::to_string),
            kubeconfig: Some("/home/me/b.kubeconfig".into()),
            context: Some("b".into()),
        }
    }

    #[test]
    fn the_kube_system_uid_decides_and_the_server_only_without_it() {
        let journal = Path::new("/j.jsonl");
        let a = binding("https://127.0.0.1:6443", Some("uid-a"));
        // same cluster under another URL (a load balancer, a port-forward)
        assert!(check_same(journal, &a, &binding("https://api.example:6443", Some("uid-a"))).is_ok());
        // another cluster at the same URL (rebuilt, or a kubeconfig reused)
        let err = check_same(journal, &a, &binding("https://127.0.0.1:6443", Some("uid-b"))).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(text.contains("uid-a") && text.contains("uid-b") && text.contains("Nothing was changed"), "{text}");
        // unreadable kube-system: the server URL is all there is
        assert!(check_same(journal, &binding("https://x:6443/", None), &binding("https://x:6443", Some("u"))).is_ok());
        assert!(check_same(journal, &binding("https://x:6443", None), &binding("https://y:6443", None)).is_err());
    }
}
