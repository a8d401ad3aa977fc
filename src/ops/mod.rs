//! The library's front door: one public async function per user-visible
//! operation. The CLI builds the options and calls these.

pub mod backup;
pub mod backups;
pub mod cluster;
pub mod copy;
pub mod copy_stream;
pub mod drill;
pub mod etcd;
pub mod etcd_restore;
pub mod fence;
pub mod migrate;
pub mod monitoring;
pub mod object_lock;
pub mod posture;
pub mod reconcile;
pub mod registry;
pub mod point_in_time;
pub mod restore;
pub mod run;
pub mod schedule;
pub mod shard;
pub mod signals;
pub mod stream;
pub mod target;

pub use run::{Journaled, Operation, RunFlags, RunMode, default_journal_dir, execute};

use crate::kube::KubeError;
use crate::pipeline::{JournalError, PlaybookError, RunnerError};
use crate::store::StoreError;

/// Why an operation could not run (a stage failing is reported in the run's
/// outcome instead, after its undo).
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Bad input: says what is wrong and how to fix it.
    #[error("{0}")]
    Input(String),
    /// The playbook is malformed or does not fit the operation.
    #[error(transparent)]
    Playbook(#[from] PlaybookError),
    /// The journal could not be read or written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The runner refused the run (journal mismatch, missing stage).
    #[error(transparent)]
    Runner(#[from] RunnerError),
    /// The management cluster could not be reached.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// The store URL or the store itself.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The DNS zone.
    #[error(transparent)]
    Dns(#[from] crate::dns::DnsError),
    /// A stage's journaled output that this version cannot read.
    #[error(transparent)]
    Output(#[from] crate::pipeline::OutputError),
    /// Streaming, verifying or replaying a stream (`hcp-dr stream`).
    #[error(transparent)]
    Stream(#[from] crate::stream::StreamError),
}

impl OpsError {
    /// 2 for input the user can fix, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            OpsError::Input(_) | OpsError::Playbook(_) => 2,
            OpsError::Store(StoreError::BadUrl { .. }) => 2,
            // a kubeconfig that cannot be read or has no such context
            OpsError::Kube(KubeError::Config { .. }) => 2,
            // a --resume/--abort file that is not a journal, or is not there
            OpsError::Journal(JournalError::Parse { .. } | JournalError::NoHeader { .. }) => 2,
            OpsError::Journal(JournalError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => 2,
            _ => 1,
        }
    }
}

/// The inputs an earlier run of `operation` journaled (for `--resume` and
/// `--abort`), and the journal's state.
pub fn journal_inputs<T: serde::de::DeserializeOwned>(
    journal: &std::path::Path,
    operation: &str,
) -> Result<(T, crate::pipeline::JournalState), OpsError> {
    let state = crate::pipeline::Journal::read(journal)?;
    if state.header.operation != operation {
        return Err(OpsError::Input(format!(
            "{} is a `{}` journal; use `hcp-dr {}` with it",
            journal.display(),
            state.header.operation,
            state.header.operation
        )));
    }
    let inputs = serde_json::from_value(state.header.inputs.clone())
        .map_err(|e| OpsError::Input(format!("{}: journal inputs unreadable: {e}", journal.display())))?;
    Ok((inputs, state))
}

/// Reach the cluster playing `role` for a run: through the flags on a fresh
/// run, and on `--resume`/`--abort` (`journal`) through what the journal
/// recorded unless the flags override it, refusing another cluster.
pub async fn reach_for(
    role: &str,
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
    journal: Option<&std::path::Path>,
) -> Result<target::Target, OpsError> {
    let state = journal.map(crate::pipeline::Journal::read).transpose()?;
    target::reach(role, kubeconfig, context, journal.zip(state.as_ref())).await
}

/// The commands that go on from a fresh run's journal if its process dies,
/// logged when the journal is created: they work as printed (the journal
/// records the cluster, and no environment default conflicts with them).
#[derive(Debug, Clone, Copy)]
pub struct NextSteps<'c> {
    /// The command line prefix, e.g. `hcp-dr restore`.
    pub command: &'c str,
    /// What `--resume` does.
    pub resume: Option<&'c str>,
    /// What `--abort` does.
    pub abort: Option<&'c str>,
}

impl NextSteps<'_> {
    /// One log line naming each command verbatim.
    pub fn line(&self, journal: &std::path::Path) -> String {
        let journal = shell_word(&journal.display().to_string());
        let mut steps = Vec::new();
        if let Some(what) = self.resume {
            steps.push(format!("`{} --resume {journal}` {what}", self.command));
        }
        if let Some(what) = self.abort {
            steps.push(format!("`{} --abort {journal}` {what}", self.command));
        }
        format!("journal written; if this process dies: {}", steps.join(", "))
    }
}

/// `word` as one shell word: unchanged when it needs no quoting, else in
/// single quotes, so a printed command can be pasted as it is.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:@%=,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A Route53 zone client: `zone` (`Z…`), an endpoint override, and the
/// CA bundle also trusted for S3.
pub async fn connect_zone(
    zone: &str,
    endpoint: Option<&str>,
    ca_bundle: Option<&std::path::Path>,
) -> Result<Box<dyn crate::dns::DnsZone>, crate::dns::DnsError> {
    let zone = crate::dns::Route53Zone::connect(crate::dns::Route53Options {
        zone_id: zone.to_string(),
        endpoint: endpoint.map(str::to_string),
        ca_bundle: ca_bundle.map(std::path::Path::to_path_buf),
        region: None,
        static_credentials: None,
    })
    .await?;
    Ok(Box::new(zone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_commands_quote_only_what_needs_it() {
        assert_eq!(shell_word("/home/ops/.local/state/hcp-dr/journals/backup-x.jsonl"), "/home/ops/.local/state/hcp-dr/journals/backup-x.jsonl");
        assert_eq!(shell_word("/tmp/my journals/it's.jsonl"), "'/tmp/my journals/it'\\''s.jsonl'");
        assert_eq!(shell_word(""), "''");
        let next = NextSteps {
            command: "hcp-dr restore",
            resume: Some("goes on"),
            abort: Some("deletes what it created"),
        };
        assert_eq!(
            next.line(std::path::Path::new("/j/r.jsonl")),
            "journal written; if this process dies: `hcp-dr restore --resume /j/r.jsonl` goes on, `hcp-dr restore --abort /j/r.jsonl` deletes what it created"
        );
    }
}
