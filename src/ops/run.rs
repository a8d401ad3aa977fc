//! Run control, written once for every operation: the flags that choose how
//! a run goes ([`RunFlags`]), what an operation is to the runner
//! ([`Operation`]), and [`execute`], which resolves the journal and the mode
//! and runs the playbook.
//!
//! An operation's own module builds its inputs (fresh from its flags, or
//! from the journal on `--resume`/`--abort`) and its context, then hands
//! both to [`execute`].

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::OpsError;
use crate::pipeline::journal::ClusterBinding;
use crate::pipeline::runner::Observer;
use crate::pipeline::{
    Catalog, Interrupt, Journal, Mode, OnFailure, Playbook, RunOutcome, RunReport, Runner, StageReport, StageState, StageStatus,
};

/// The flags every journaled operation takes, in one place.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Run control")]
pub struct RunFlags {
    /// A playbook file instead of the embedded one (`hcp-dr playbook show
    /// OPERATION` prints the embedded one).
    #[arg(long, value_name = "FILE")]
    pub playbook: Option<PathBuf>,
    /// Where to write the journal [default: $HCP_DR_STATE_DIR/journals, else
    /// ~/.local/state/hcp-dr/journals].
    #[arg(long, value_name = "FILE", conflicts_with_all = ["resume", "abort"])]
    pub journal: Option<PathBuf>,
    /// Continue the run recorded in this journal: retry the stage that
    /// stopped, or finish an undo that was under way. The cluster and the
    /// inputs come from the journal.
    #[arg(long, value_name = "JOURNAL", conflicts_with = "abort")]
    pub resume: Option<PathBuf>,
    /// Undo what the run recorded in this journal changed, newest first
    /// (what each operation can still undo: its runbook, docs/runbooks/).
    #[arg(long, value_name = "JOURNAL")]
    pub abort: Option<PathBuf>,
    /// Print what would be done; change nothing (the stages that only read
    /// run for real, so the plan comes from the live cluster).
    #[arg(long, conflicts_with_all = ["resume", "abort"])]
    pub dry_run: bool,
    /// Where journals go without --journal (not a flag:
    /// [`default_journal_dir`] unless set, e.g. by a caller of the library).
    #[arg(skip)]
    pub journal_dir: Option<PathBuf>,
}

/// How a run goes, from [`RunFlags`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode<'a> {
    /// A fresh run with a new journal.
    Run,
    /// Change nothing, journal nothing.
    DryRun,
    /// Go on with the run this journal recorded.
    Resume(&'a Path),
    /// Undo the run this journal recorded.
    Abort(&'a Path),
}

impl RunFlags {
    /// The mode the flags ask for (clap has refused combinations).
    pub fn mode(&self) -> RunMode<'_> {
        match (&self.resume, &self.abort) {
            (Some(journal), _) => RunMode::Resume(journal),
            (None, Some(journal)) => RunMode::Abort(journal),
            (None, None) if self.dry_run => RunMode::DryRun,
            (None, None) => RunMode::Run,
        }
    }

    /// The journal of an earlier run this one continues or undoes.
    pub fn journal_given(&self) -> Option<&Path> {
        self.resume.as_deref().or(self.abort.as_deref())
    }

    /// `--abort` was given.
    pub fn aborting(&self) -> bool {
        self.abort.is_some()
    }
}

/// Default journal location: `$HCP_DR_STATE_DIR`, else `$XDG_STATE_HOME/hcp-dr`,
/// else `~/.local/state/hcp-dr`, then `journals/`.
pub fn default_journal_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("HCP_DR_STATE_DIR") {
        return PathBuf::from(dir).join("journals");
    }
    let base = std::env::var("XDG_STATE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/tmp".into())).join(".local/state"));
    base.join("hcp-dr/journals")
}

/// An operation as the runner sees it: its name, its stages and playbook,
/// what a failure leads to, and what `--resume` and `--abort` do.
pub struct Operation<C> {
    /// The command that runs it, for the printed next steps (`hcp-dr restore`).
    pub command: &'static str,
    /// The embedded playbook used without `--playbook`.
    pub playbook: &'static str,
    /// Its stages: the names a playbook may list and their order.
    pub catalog: Catalog<C>,
    pub on_failure: OnFailure,
    /// What `--resume` does, for the log line a fresh run prints and for
    /// refusing `--resume` where it is `None`.
    pub resume: Option<&'static str>,
    /// What `--abort` does (`None`: the operation cannot be aborted).
    pub abort: Option<&'static str>,
    /// From where `--abort` is refused: what it would undo is gone.
    pub no_abort_after: Option<NoReturn>,
    /// A run that stops before this stage journaled a change is undone at
    /// once, as a plain failure: nothing it did is worth keeping open.
    pub undo_stops_before: Option<&'static str>,
}

/// The point from which a run can only be finished, not undone.
#[derive(Debug, Clone, Copy)]
pub struct NoReturn {
    pub stage: &'static str,
    /// From the stage's start (it changes things before it journals them),
    /// else from its first journaled change.
    pub from_start: bool,
    /// Why, for the refusal.
    pub why: &'static str,
}

/// Whether the run in `journal` has journaled a first change in `stage`.
pub(crate) fn changed_in(journal: &Path, stage: &str) -> Result<bool, OpsError> {
    Ok(Journal::read(journal)?.stage(stage).progress.is_some())
}

/// The stopped run's report with the undo's statuses, as a plain failure.
fn undone(stopped: RunReport, undo: RunReport, stage: String, error: String) -> RunReport {
    let stages = stopped
        .stages
        .into_iter()
        .zip(undo.stages)
        .map(|(first, later)| match later.status {
            StageStatus::Undone | StageStatus::UndoFailed { .. } => StageReport { status: later.status, ..first },
            _ => first,
        })
        .collect();
    let outcome = match undo.outcome {
        RunOutcome::UndoFailed { undo_errors, .. } => RunOutcome::UndoFailed { stage, error, undo_errors },
        _ => RunOutcome::RolledBack { stage, error },
    };
    RunReport { outcome, stages, ..stopped }
}

impl<C: Send + Sync> Operation<C> {
    /// The same operation running another embedded playbook (restore's
    /// `restore-dns-takeover`).
    pub fn with_playbook(self, playbook: &'static str) -> Self {
        Operation { playbook, ..self }
    }

    /// The name in journals and in `hcp-dr playbook show` (`restore`): its
    /// catalog's.
    pub fn name(&self) -> &'static str {
        self.catalog.operation()
    }

    /// Refuse `--resume`/`--abort` the operation does not offer, before
    /// anything is read.
    pub fn check_flags(&self, flags: &RunFlags) -> Result<(), OpsError> {
        match flags.mode() {
            RunMode::Resume(journal) if self.resume.is_none() => Err(OpsError::Input(format!(
                "`{}` runs are not resumed: undo this one with `{} --abort {}`, then run it again",
                self.name(),
                self.command,
                super::shell_word(&journal.display().to_string())
            ))),
            RunMode::Abort(_) if self.abort.is_none() => Err(OpsError::Input(format!(
                "`{}` runs cannot be aborted: `{} --resume JOURNAL` finishes one (or its undo)",
                self.name(), self.command
            ))),
            _ => Ok(()),
        }
    }

    /// `--playbook FILE` or the embedded one, checked against the stages;
    /// refuses the flags the operation does not take, and an `--abort` past
    /// the point of no return. Called first, before anything is reached.
    pub fn load_playbook(&self, flags: &RunFlags) -> Result<Playbook, OpsError> {
        self.check_flags(flags)?;
        if let (RunMode::Abort(journal), Some(no_return)) = (flags.mode(), self.no_abort_after) {
            let state = Journal::read(journal)?;
            let record = state.stage(no_return.stage);
            let past = if no_return.from_start { record.state != StageState::NotStarted } else { record.progress.is_some() };
            if past {
                let journal = super::shell_word(&journal.display().to_string());
                return Err(OpsError::Input(format!(
                    "--abort {journal}: {}; finish with `{} --resume {journal}`",
                    no_return.why, self.command
                )));
            }
        }
        self.playbook_from(flags.playbook.as_deref())
    }

    /// The playbook in `file` (or the embedded one), its stages and their
    /// `with:` parameters checked.
    fn playbook_from(&self, file: Option<&Path>) -> Result<Playbook, OpsError> {
        let playbook = super::registry::load(self.playbook, file)?;
        playbook.check(&self.catalog.rules())?;
        playbook.check_params(|name| self.catalog.get(name).map(|stage| stage.params()))?;
        Ok(playbook)
    }

    /// For `playbook show`: each stage of the (embedded or given) playbook
    /// with its summary and whether it is undoable.
    pub fn describe(&self, file: Option<&Path>) -> Result<Vec<StageInfo>, OpsError> {
        let playbook = self.playbook_from(file)?;
        Ok(playbook
            .stages
            .iter()
            .filter_map(|s| {
                self.catalog.get(&s.name).map(|stage| StageInfo {
                    name: s.name.clone(),
                    summary: stage.summary().to_string(),
                    undoable: stage.undoable(),
                    params: stage.params().keys.iter().map(|(key, what)| (key.to_string(), what.to_string())).collect(),
                    with: s.params.clone(),
                })
            })
            .collect())
    }

    fn next_steps(&self) -> super::NextSteps<'static> {
        super::NextSteps {
            command: self.command,
            resume: self.resume,
            abort: self.abort,
        }
    }
}

/// One stage of a playbook, for `hcp-dr playbook show`.
#[derive(Debug, Clone, Serialize)]
pub struct StageInfo {
    pub name: String,
    pub summary: String,
    pub undoable: bool,
    /// The `with:` keys the stage takes and what each sets.
    pub params: Vec<(String, String)>,
    /// What this playbook sets (Null: nothing).
    pub with: serde_json::Value,
}

/// What a fresh run journals, and whom its journal is named after.
pub struct Journaled<'a, I: Serialize> {
    /// The run's inputs: `--resume` and `--abort` read them back.
    pub inputs: &'a I,
    /// The management clusters the run changes (a journal pointed at
    /// another cluster is refused).
    pub clusters: Vec<ClusterBinding>,
    /// The journal's default file name after the operation's name, e.g.
    /// `clusters-demo`: `<operation>-<subject>-<time>.jsonl`.
    pub subject: String,
    /// `--abort` also undoes a run that succeeded and kept what it made
    /// (a drill run with `--keep`).
    pub abort_finished: bool,
}

impl<'a, I: Serialize> Journaled<'a, I> {
    /// A run with `inputs` that changes `clusters`, its journal named after
    /// `subject` joined with `-` (namespace, name, backup id).
    pub fn new(inputs: &'a I, clusters: Vec<ClusterBinding>, subject: &[&str]) -> Self {
        Journaled { inputs, clusters, subject: subject.join("-"), abort_finished: false }
    }

    /// `--abort` also undoes the run once it succeeded (see the field).
    pub fn abort_finished(self, abort_finished: bool) -> Self {
        Journaled { abort_finished, ..self }
    }
}

/// Run `op` on `ctx` as `flags` say: a fresh run journals under
/// `--journal` or the journal directory, `--resume`/`--abort` go on from
/// the journal given, `--dry-run` journals nothing.
pub async fn execute<C: Send + Sync, I: Serialize>(
    op: &Operation<C>,
    playbook: &Playbook,
    ctx: &mut C,
    flags: &RunFlags,
    journaled: Journaled<'_, I>,
    observer: Option<&dyn Observer>,
    interrupt: &mut Interrupt,
) -> Result<RunReport, OpsError> {
    op.check_flags(flags)?;
    let runner = Runner {
        playbook,
        catalog: &op.catalog,
        observer,
        on_failure: op.on_failure,
    };
    let fresh_path = match &flags.journal {
        Some(path) => path.clone(),
        None => flags.journal_dir.clone().unwrap_or_else(default_journal_dir).join(format!(
            "{}-{}-{}.jsonl",
            op.name(),
            journaled.subject,
            chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ")
        )),
    };
    let mode = match flags.mode() {
        RunMode::DryRun => Mode::DryRun,
        RunMode::Resume(journal) => Mode::Resume { journal },
        RunMode::Abort(journal) if journaled.abort_finished => Mode::Remove { journal },
        RunMode::Abort(journal) => Mode::Abort { journal },
        RunMode::Run => {
            tracing::info!(journal = %fresh_path.display(), "{}", op.next_steps().line(&fresh_path));
            Mode::Fresh {
                journal: &fresh_path,
                inputs: serde_json::to_value(journaled.inputs).map_err(|e| OpsError::Input(e.to_string()))?,
                clusters: journaled.clusters,
            }
        }
    };
    let run = runner.run(ctx, mode, interrupt).await?;
    match (op.undo_stops_before, &run.outcome, &run.journal) {
        (Some(stage), RunOutcome::Stopped { stage: stopped, error }, Some(journal)) if !changed_in(Path::new(journal), stage)? => {
            let (stopped, error) = (stopped.clone(), error.clone());
            let journal = PathBuf::from(journal);
            let undo = runner.run(ctx, Mode::Abort { journal: &journal }, interrupt).await?;
            Ok(undone(run, undo, stopped, error))
        }
        _ => Ok(run),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        run: RunFlags,
    }

    #[test]
    fn the_flags_give_one_mode_and_refuse_mixtures() {
        let parse = |args: &[&str]| Command::try_parse_from([&["x"], args].concat()).map(|c| c.run);
        assert_eq!(parse(&[]).unwrap().mode(), RunMode::Run);
        assert_eq!(parse(&["--dry-run"]).unwrap().mode(), RunMode::DryRun);
        let resume = parse(&["--resume", "j.jsonl"]).unwrap();
        assert_eq!(resume.mode(), RunMode::Resume(Path::new("j.jsonl")));
        assert_eq!(resume.journal_given(), Some(Path::new("j.jsonl")));
        assert_eq!(parse(&["--abort", "j.jsonl"]).unwrap().mode(), RunMode::Abort(Path::new("j.jsonl")));
        for mixed in [&["--resume", "a", "--abort", "b"][..], &["--dry-run", "--abort", "b"], &["--journal", "a", "--resume", "b"]] {
            assert!(parse(mixed).is_err(), "{mixed:?} was accepted");
        }
    }

    #[test]
    fn an_operation_refuses_the_modes_it_does_not_offer() {
        let op: Operation<()> = Operation {
            command: "hcp-dr x",
            playbook: "x",
            catalog: Catalog::new("x"),
            on_failure: OnFailure::Undo,
            resume: None,
            abort: Some("undoes it"),
            no_abort_after: None,
            undo_stops_before: None,
        };
        let flags = RunFlags { resume: Some("/j/x.jsonl".into()), ..RunFlags::default() };
        let err = op.check_flags(&flags).unwrap_err().to_string();
        assert!(err.contains("hcp-dr x --abort /j/x.jsonl"), "{err}");
        let flags = RunFlags { abort: Some("/j/x.jsonl".into()), ..RunFlags::default() };
        op.check_flags(&flags).unwrap();
    }

    fn report(outcome: RunOutcome, statuses: Vec<StageStatus>) -> RunReport {
        RunReport {
            operation: "etcd-recover".into(),
            outcome,
            stages: ["lock", "assess", "replace"]
                .iter()
                .zip(statuses)
                .map(|(name, status)| StageReport {
                    name: name.to_string(),
                    status,
                    duration: std::time::Duration::from_secs(1),
                    output: None,
                })
                .collect(),
            journal: Some("j".into()),
        }
    }

    #[test]
    fn an_early_stop_becomes_a_plain_failure_with_the_lock_undone() {
        let stopped = report(
            RunOutcome::Stopped {
                stage: "assess".into(),
                error: "refused".into(),
            },
            vec![
                StageStatus::Succeeded,
                StageStatus::Failed {
                    error: "refused".into(),
                },
                StageStatus::Skipped,
            ],
        );
        let undo = report(
            RunOutcome::RolledBack {
                stage: "(abort)".into(),
                error: "aborted".into(),
            },
            vec![
                StageStatus::Undone,
                StageStatus::Skipped,
                StageStatus::Skipped,
            ],
        );
        let merged = undone(stopped, undo, "assess".into(), "refused".into());
        assert_eq!(
            merged.outcome,
            RunOutcome::RolledBack {
                stage: "assess".into(),
                error: "refused".into()
            }
        );
        let statuses: Vec<_> = merged.stages.iter().map(|s| s.status.clone()).collect();
        assert_eq!(
            statuses,
            vec![
                StageStatus::Undone,
                StageStatus::Failed {
                    error: "refused".into()
                },
                StageStatus::Skipped
            ]
        );
        assert_eq!(merged.stages[1].duration, std::time::Duration::from_secs(1));
    }
}
