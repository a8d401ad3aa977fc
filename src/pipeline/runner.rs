//! The runner: executes a playbook's stages against an operation's context,
//! journaling every step, and undoes every completed stage (newest first)
//! when a stage fails or the run is interrupted.
//!
//! Dry-run goes through the same loop: stages that only read run for real
//! (so the plan is built from the live cluster), stages that change anything
//! print what they would do instead, and no journal is written.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::journal::{ClusterBinding, Event, Header, Journal, JournalError, JournalState, StageState};
use super::playbook::Playbook;

use super::playbook::StageRules;
use super::stage::{DynStage, Interrupt, StageIndex, Step, UndoInput, error_chain};

/// Hooks for tests of undo and resume, driven by environment variables so
/// they work on the real binary. They only ever make a run fail or wait;
/// none can make anything succeed. Compiled in only with the cargo feature
/// `test-hooks` (the integration tests enable it through hcp-dr's
/// dev-dependency on itself); a release build or `cargo install` has the
/// no-op versions below, so no environment variable can make it fail or hang.
#[cfg(feature = "test-hooks")]
mod test_hooks {
    use std::time::Duration;

    /// `HCP_DR_TEST_FAIL_AFTER=<stage>`: the stage runs, then the run fails
    /// as if it had, exercising the undo of everything done so far.
    pub fn fail_after(stage: &str) -> Result<(), String> {
        match std::env::var("HCP_DR_TEST_FAIL_AFTER") {
            Ok(target) if target == stage => Err(format!("injected failure after `{stage}` (HCP_DR_TEST_FAIL_AFTER)")),
            _ => Ok(()),
        }
    }

    /// `HCP_DR_TEST_HOLD_IN=<stage>`: wait 120 s after journaling that the
    /// stage started, so a test can kill the process inside it.
    pub async fn hold_in(stage: &str) {
        if std::env::var("HCP_DR_TEST_HOLD_IN").is_ok_and(|target| target == stage) {
            tracing::warn!("holding in `{stage}` for 120s (HCP_DR_TEST_HOLD_IN)");
            tokio::time::sleep(Duration::from_secs(120)).await;
        }
    }

    /// `HCP_DR_TEST_HOLD_AFTER=<stage>`: wait 120 s once the stage has done
    /// its work, before its result is journaled (the log says so), so a
    /// test can kill the process between a change and its record.
    pub async fn hold_after(stage: &str) {
        if std::env::var("HCP_DR_TEST_HOLD_AFTER").is_ok_and(|target| target == stage) {
            tracing::warn!("holding after `{stage}` for 120s (HCP_DR_TEST_HOLD_AFTER)");
            tokio::time::sleep(Duration::from_secs(120)).await;
        }
    }
}

/// Without the `test-hooks` feature: nothing is read, nothing fails, nothing waits.
#[cfg(not(feature = "test-hooks"))]
mod test_hooks {
    pub fn fail_after(_stage: &str) -> Result<(), String> {
        Ok(())
    }
    pub async fn hold_in(_stage: &str) {}
    pub async fn hold_after(_stage: &str) {}
}

/// Whether this build has the test hooks (`HCP_DR_TEST_FAIL_AFTER`,
/// `HCP_DR_TEST_HOLD_IN`, `HCP_DR_TEST_HOLD_AFTER`): the cargo feature
/// `test-hooks`. Tests that need them check it first and fail naming it.
pub const TEST_HOOKS: bool = cfg!(feature = "test-hooks");

/// Why a run could not be carried out (a stage failing is not one of these:
/// that is a [`RunOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The playbook names a stage this operation has no implementation for.
    #[error("playbook {origin}: stage `{stage}` is not implemented by the {operation} operation")]
    MissingStage {
        origin: String,
        operation: String,
        stage: String,
    },
    /// The journal could not be written or read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The journal being resumed is for another operation or playbook.
    #[error("journal {path} is for `{found}`, not `{expected}`: resume it with the command that wrote it")]
    JournalMismatch {
        path: String,
        found: String,
        expected: String,
    },
    /// A succeeded stage's journaled output could not be restored on resume.
    #[error("resume: stage `{stage}`: its journaled output cannot be used: {message}")]
    Restore { stage: String, message: String },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RunOutcome {
    /// Every stage succeeded.
    Succeeded,
    /// Dry-run: nothing was changed.
    Planned,
    /// A stage failed (or the run was interrupted) and every completed stage was undone.
    RolledBack { stage: String, error: String },
    /// A stage failed before the run had changed anything: there was nothing to undo.
    Failed { stage: String, error: String },
    /// `--abort`: everything the run had changed was undone, as asked.
    Aborted,
    /// A stage failed (or the run was interrupted) and, as the playbook stops
    /// on failure, nothing was undone: resume or abort the journal.
    Stopped { stage: String, error: String },
    /// A stage failed and at least one undo failed too: the cluster needs attention.
    UndoFailed {
        stage: String,
        error: String,
        undo_errors: Vec<String>,
    },
}

impl RunOutcome {
    pub fn is_success(&self) -> bool {
        matches!(self, RunOutcome::Succeeded | RunOutcome::Planned)
    }

    /// The stage that failed, when one did.
    pub fn failed_stage(&self) -> Option<&str> {
        match self {
            RunOutcome::RolledBack { stage, .. } | RunOutcome::Failed { stage, .. } | RunOutcome::Stopped { stage, .. } | RunOutcome::UndoFailed { stage, .. } => Some(stage),
            RunOutcome::Succeeded | RunOutcome::Planned | RunOutcome::Aborted => None,
        }
    }
}

/// What happened to one stage in this run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// Ran and succeeded in this run.
    Succeeded,
    /// Succeeded in an earlier run (resume) and was not run again.
    Resumed,
    /// Dry-run: what it would do.
    Planned { actions: Vec<String> },
    Failed { error: String },
    Undone,
    UndoFailed { error: String },
    /// Not reached.
    Skipped,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageReport {
    pub name: String,
    pub status: StageStatus,
    #[serde(serialize_with = "ser_duration")]
    pub duration: Duration,
    pub output: Option<Value>,
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The result of a run: its outcome and a line per stage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    pub operation: String,
    #[serde(flatten)]
    pub outcome: RunOutcome,
    pub stages: Vec<StageReport>,
    pub journal: Option<String>,
}

impl RunReport {
    /// The output a stage produced (this run or a resumed one).
    pub fn output(&self, stage: &str) -> Option<&Value> {
        self.stages
            .iter()
            .find(|s| s.name == stage)
            .and_then(|s| s.output.as_ref())
    }

    /// The output of stage `S`, typed, found by its name (`None`: it did
    /// not run); an error when the output is not an `S::Output` (a journal
    /// resumed from another version, or edited).
    pub fn output_of<S: super::StageId>(&self) -> Result<Option<S::Output>, super::OutputError> {
        self.output(S::NAME)
            .map(|value| S::Output::deserialize(value).map_err(|e| super::OutputError { stage: S::NAME, message: e.to_string() }))
            .transpose()
    }

    /// The report of stage `S`, found by its name (`None`: not in the playbook).
    pub fn stage_of<S: super::StageId>(&self) -> Option<&StageReport> {
        self.stages.iter().find(|s| s.name == S::NAME)
    }
}

/// The stages an operation implements: the one registry of its stage names
/// (each stage's [`super::StageId::NAME`]) and of which must come before
/// which, from which the playbook rules derive ([`Catalog::rules`]).
pub struct Catalog<C> {
    operation: &'static str,
    stages: Vec<(Box<dyn DynStage<C>>, Vec<&'static str>)>,
}

impl<C> Catalog<C> {
    /// An empty catalog for `operation` (the playbooks' `operation:`).
    pub fn new(operation: &'static str) -> Self {
        Catalog { operation, stages: Vec::new() }
    }

    /// Add a stage. Two stages of one operation cannot share a name.
    pub fn with(mut self, stage: impl DynStage<C> + 'static) -> Self {
        assert!(
            self.get(stage.name()).is_none(),
            "{}: two stages named `{}`",
            self.operation,
            stage.name()
        );
        assert!(
            stage.stage_type().is_none() || self.stages.iter().all(|(s, _)| s.stage_type() != stage.stage_type()),
            "{}: the stage type of `{}` is in the catalog twice (Step::needs finds a stage by its type)",
            self.operation,
            stage.name()
        );
        self.stages.push((Box::new(stage), Vec::new()));
        self
    }

    /// The stage added last needs `stages` listed before it in a playbook
    /// (it reads what they produce, or must not run without them).
    pub fn after(mut self, stages: &[&'static str]) -> Self {
        let (_, after) = self.stages.last_mut().expect("Catalog::after follows Catalog::with");
        after.extend_from_slice(stages);
        self
    }

    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The stage names, in the order they were added.
    pub fn names(&self) -> Vec<&'static str> {
        self.stages.iter().map(|(stage, _)| stage.name()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&dyn DynStage<C>> {
        self.stages.iter().find(|(stage, _)| stage.name() == name).map(|(stage, _)| stage.as_ref())
    }

    /// What a running stage's [`Step`] finds earlier stages by.
    fn index(&self) -> StageIndex {
        let mut index = StageIndex::default();
        for (stage, after) in &self.stages {
            index.add(stage.stage_type(), stage.name(), after.clone());
        }
        index
    }

    /// What a playbook of this operation may name, and in which order.
    pub fn rules(&self) -> StageRules {
        StageRules {
            operation: self.operation,
            known: self.names(),
            requires_before: self
                .stages
                .iter()
                .flat_map(|(stage, after)| after.iter().map(move |needs| (stage.name(), *needs)))
                .collect(),
        }
    }
}

/// What a failed stage (or an interrupt) leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Undo every completed stage, newest first (backup: the cluster goes
    /// back to service at once).
    Undo,
    /// Stop and keep everything as it is, for `--resume` (retry the failed
    /// stage) or `--abort` (undo). Restore and migrate: a half-finished move
    /// is often better continued than thrown away.
    Stop,
}

/// How to run: fresh with a new journal, resumed from one, or as a dry-run.
pub enum Mode<'a> {
    /// Write a new journal at this path, recording the inputs and the
    /// management clusters the run changes.
    Fresh {
        journal: &'a std::path::Path,
        inputs: Value,
        clusters: Vec<ClusterBinding>,
    },
    /// Continue (or finish undoing) the run recorded in this journal.
    Resume { journal: &'a std::path::Path },
    /// Undo everything the run recorded in this journal did, newest first.
    Abort { journal: &'a std::path::Path },
    /// As `Abort`, also for a run that succeeded and kept what it made (a
    /// drill run with `--keep`): its stages are undone all the same.
    Remove { journal: &'a std::path::Path },
    /// Change nothing; write no journal.
    DryRun,
}

/// Told as stages start and end (progress bars on a terminal).
pub trait Observer: Send + Sync {
    fn started(&self, stage: &str, summary: &str);
    fn finished(&self, stage: &str, status: &StageStatus, duration: Duration);
    /// The running `stage` moves bytes and counts them in `meter` (it may
    /// go on counting after the stage: a snapshot streams on in the
    /// background until the stage that waits for it shows the same meter).
    fn metering(&self, _stage: &str, _meter: &super::Meter) {}
}

/// Runs one playbook for one operation.
pub struct Runner<'a, C> {
    pub playbook: &'a Playbook,
    pub catalog: &'a Catalog<C>,
    pub observer: Option<&'a dyn Observer>,
    pub on_failure: OnFailure,
}

struct Planned<'a, C> {
    stage: &'a dyn DynStage<C>,
    params: &'a Value,
}

impl<'a, C: Send + Sync> Runner<'a, C> {
    fn notify_started(&self, stage: &dyn DynStage<C>) {
        if let Some(observer) = self.observer {
            observer.started(stage.name(), stage.summary());
        }
    }

    fn notify_finished(&self, report: &StageReport) {
        if let Some(observer) = self.observer {
            observer.finished(&report.name, &report.status, report.duration);
        }
    }

    fn resolve(&self) -> Result<Vec<Planned<'a, C>>, RunnerError> {
        self.playbook
            .stages
            .iter()
            .map(|entry| {
                self.catalog
                    .get(&entry.name)
                    .map(|stage| Planned {
                        stage,
                        params: &entry.params,
                    })
                    .ok_or_else(|| RunnerError::MissingStage {
                        origin: self.playbook.origin.clone(),
                        operation: self.catalog.operation().to_string(),
                        stage: entry.name.clone(),
                    })
            })
            .collect()
    }

    /// Run the playbook. `interrupt` fires on SIGINT/SIGTERM: the current
    /// stage is stopped and everything done so far is undone.
    pub async fn run(
        &self,
        ctx: &mut C,
        mode: Mode<'_>,
        interrupt: &mut Interrupt,
    ) -> Result<RunReport, RunnerError> {
        let plan = self.resolve()?;
        let stages = self.catalog.index();
        let aborting = matches!(mode, Mode::Abort { .. } | Mode::Remove { .. });
        let removing = matches!(mode, Mode::Remove { .. });
        let mut journal = match mode {
            Mode::DryRun => return Ok(self.dry_run(ctx, &plan, &stages).await),
            Mode::Fresh { journal, inputs, clusters } => Journal::create(
                journal,
                Header {
                    operation: self.catalog.operation().to_string(),
                    playbook: self.playbook.origin.clone(),
                    stages: self.playbook.stage_names(),
                    inputs,
                    tool_version: env!("CARGO_PKG_VERSION").to_string(),
                    clusters,
                    run_id: new_run_id(journal),
                },
            )?,
            Mode::Resume { journal } | Mode::Abort { journal } | Mode::Remove { journal } => {
                let journal = Journal::open(journal)?;
                if journal.state().header.operation != self.catalog.operation()
                    || journal.state().header.stages != self.playbook.stage_names()
                {
                    return Err(RunnerError::JournalMismatch {
                        path: journal.path().display().to_string(),
                        found: format!(
                            "{} ({})",
                            journal.state().header.operation,
                            journal.state().header.stages.join(", ")
                        ),
                        expected: format!("{} ({})", self.catalog.operation(), self.playbook.stage_names().join(", ")),
                    });
                }
                journal
            }
        };
        let mut reports: Vec<StageReport> = plan
            .iter()
            .map(|p| StageReport {
                name: p.stage.name().to_string(),
                status: StageStatus::Skipped,
                duration: Duration::ZERO,
                output: None,
            })
            .collect();

        let state = journal.state().clone();
        if let Some(outcome) = &state.outcome
            && !(removing && outcome == "succeeded")
        {
            return Ok(self.finished_report(&state, outcome, reports, &journal));
        }

        // Put back what earlier runs produced, then go on (or go on undoing).
        let mut failure: Option<(String, String)> = None;
        for (index, planned) in plan.iter().enumerate() {
            let record = state.stage(planned.stage.name());
            match record.state {
                StageState::Succeeded => {
                    let output = record.output.clone().unwrap_or(Value::Null);
                    planned.stage.restore(ctx, &output).map_err(|err| RunnerError::Restore {
                        stage: planned.stage.name().to_string(),
                        message: error_chain(err.as_ref()),
                    })?;
                    reports[index].status = StageStatus::Resumed;
                    reports[index].output = Some(output);
                }
                StageState::Failed | StageState::UndoStarted | StageState::UndoFailed | StageState::Undone => {
                    failure.get_or_insert((
                        planned.stage.name().to_string(),
                        record.error.clone().unwrap_or_else(|| "failed in an earlier run".into()),
                    ));
                }
                StageState::NotStarted | StageState::Started | StageState::Halted => {}
            }
        }
        // Resuming a run that was on its way back finishes undoing it; an
        // abort undoes it whatever state it is in.
        let undoing_only = failure.is_some() || state.rolling_back || aborting;

        if !undoing_only {
            for (index, planned) in plan.iter().enumerate() {
                if reports[index].status == StageStatus::Resumed {
                    continue;
                }
                let name = planned.stage.name().to_string();
                journal.append(Event::Started { stage: name.clone() })?;
                self.notify_started(planned.stage);
                let started = Instant::now();
                let result = {
                    let mut step = Step::new(&mut journal, &stages, planned.stage.name(), planned.params).observed(self.observer);
                    tokio::select! {
                        result = async {
                            test_hooks::hold_in(&name).await;
                            let result = planned.stage.run(ctx, &mut step).await;
                            test_hooks::hold_after(&name).await;
                            result
                        } => result.map_err(|e| error_chain(e.as_ref())),
                        signal = interrupt.wait() => Err(format!("interrupted by {signal}")),
                    }
                };
                reports[index].duration = started.elapsed();
                let result = result.and_then(|output| test_hooks::fail_after(&name).map(|()| output));
                match result {
                    Ok(output) => {
                        journal.append(Event::Succeeded {
                            stage: name,
                            output: output.clone(),
                        })?;
                        reports[index].status = StageStatus::Succeeded;
                        reports[index].output = Some(output);
                        self.notify_finished(&reports[index]);
                    }
                    Err(error) => {
                        journal.append(match self.on_failure {
                            OnFailure::Undo => Event::Failed {
                                stage: name.clone(),
                                error: error.clone(),
                            },
                            OnFailure::Stop => Event::Halted {
                                stage: name.clone(),
                                error: error.clone(),
                            },
                        })?;
                        reports[index].status = StageStatus::Failed { error: error.clone() };
                        self.notify_finished(&reports[index]);
                        failure = Some((name, error));
                        break;
                    }
                }
            }
        }

        let changed = self.changed_anything(&plan, journal.state());
        let outcome = match failure {
            None if !undoing_only => RunOutcome::Succeeded,
            // Stopping keeps what was changed; when nothing was, there is
            // nothing to keep and the run simply failed.
            Some((stage, error)) if self.on_failure == OnFailure::Stop && !aborting && !state.rolling_back && changed => {
                RunOutcome::Stopped { stage, error }
            }
            failure => {
                // a run that changed nothing has nothing to undo
                let undo_errors = if changed || aborting {
                    self.undo_all(ctx, &plan, &mut journal, &mut reports, &stages).await?
                } else {
                    Vec::new()
                };
                match failure {
                    _ if !undo_errors.is_empty() => {
                        let (stage, error) = failure.unwrap_or_else(|| {
                            ("--abort".into(), "aborted by the operator".into())
                        });
                        RunOutcome::UndoFailed { stage, error, undo_errors }
                    }
                    _ if aborting => RunOutcome::Aborted,
                    Some((stage, error)) if changed => RunOutcome::RolledBack { stage, error },
                    Some((stage, error)) => RunOutcome::Failed { stage, error },
                    // resumed a run that was rolling back, with no failed stage on record
                    None => RunOutcome::RolledBack {
                        stage: "an earlier run".into(),
                        error: "it was being undone when it stopped".into(),
                    },
                }
            }
        };
        // An undo that failed, or a stop, leaves the run open for `--resume`.
        if !matches!(outcome, RunOutcome::UndoFailed { .. } | RunOutcome::Stopped { .. }) {
            journal.append(Event::End {
                outcome: match outcome {
                    RunOutcome::Succeeded => "succeeded".into(),
                    RunOutcome::Aborted => "aborted".into(),
                    RunOutcome::Failed { .. } => "failed".into(),
                    _ => "undone".into(),
                },
            })?;
        }
        Ok(RunReport {
            operation: self.catalog.operation().to_string(),
            outcome,
            stages: reports,
            journal: Some(journal.path().display().to_string()),
        })
    }

    /// Whether any undoable stage of the run changed something that is not
    /// undone yet: it succeeded, or journaled progress (a stage records what
    /// it is about to change before changing it, so one that failed without
    /// a progress record changed nothing).
    fn changed_anything(&self, plan: &[Planned<'a, C>], state: &JournalState) -> bool {
        plan.iter().any(|p| {
            let record = state.stage(p.stage.name());
            p.stage.undoable()
                && !matches!(record.state, StageState::NotStarted | StageState::Undone)
                && (record.output.is_some() || record.progress.is_some())
        })
    }

    /// Undo, newest first, every stage that changed something and is not undone yet.
    async fn undo_all(
        &self,
        ctx: &mut C,
        plan: &[Planned<'a, C>],
        journal: &mut Journal,
        reports: &mut [StageReport],
        stages: &StageIndex,
    ) -> Result<Vec<String>, RunnerError> {
        let mut errors = Vec::new();
        for (index, planned) in plan.iter().enumerate().rev() {
            let name = planned.stage.name().to_string();
            let record = journal.state().stage(&name);
            let needs_undo = matches!(
                record.state,
                StageState::Succeeded
                    | StageState::Failed
                    | StageState::Halted
                    | StageState::Started
                    | StageState::UndoStarted
                    | StageState::UndoFailed
            );
            if !needs_undo || !planned.stage.undoable() {
                continue;
            }
            journal.append(Event::UndoStarted { stage: name.clone() })?;
            if let Some(observer) = self.observer {
                observer.started(&name, "undo");
            }
            let earlier = journal.state().clone();
            let input = UndoInput {
                stage: planned.stage.name(),
                output: record.output.as_ref(),
                progress: record.progress.as_ref(),
                params: planned.params,
                earlier: Some(&earlier),
                index: stages,
            };
            match planned.stage.undo(ctx, input).await {
                Ok(()) => {
                    journal.append(Event::Undone { stage: name.clone() })?;
                    reports[index].status = StageStatus::Undone;
                    self.notify_finished(&reports[index]);
                }
                Err(err) => {
                    let error = error_chain(err.as_ref());
                    journal.append(Event::UndoFailed {
                        stage: name.clone(),
                        error: error.clone(),
                    })?;
                    errors.push(format!("{name}: {error}"));
                    reports[index].status = StageStatus::UndoFailed { error };
                    self.notify_finished(&reports[index]);
                }
            }
        }
        Ok(errors)
    }

    async fn dry_run(&self, ctx: &mut C, plan: &[Planned<'a, C>], index: &StageIndex) -> RunReport {
        let mut reports = Vec::new();
        let mut outputs = BTreeMap::new();
        let mut outcome = RunOutcome::Planned;
        for planned in plan {
            let name = planned.stage.name().to_string();
            let started = Instant::now();
            let status = if planned.stage.mutates() {
                StageStatus::Planned {
                    actions: planned.stage.plan(ctx, &Step::planning(&outputs, index, planned.stage.name(), planned.params)),
                }
            } else {
                // read-only stages run (a restore's verify reads the whole backup): shown as they go
                self.notify_started(planned.stage);
                let result = {
                    let mut step = Step::planning(&outputs, index, planned.stage.name(), planned.params).observed(self.observer);
                    planned.stage.run(ctx, &mut step).await
                };
                match result {
                    Ok(output) => {
                        outputs.insert(planned.stage.name(), output.clone());
                        reports.push(StageReport {
                            name,
                            status: StageStatus::Succeeded,
                            duration: started.elapsed(),
                            output: Some(output),
                        });
                        self.notify_finished(&reports[reports.len() - 1]);
                        continue;
                    }
                    Err(err) => {
                        let error = error_chain(err.as_ref());
                        outcome = RunOutcome::Failed {
                            stage: name.clone(),
                            error: error.clone(),
                        };
                        reports.push(StageReport {
                            name,
                            status: StageStatus::Failed { error },
                            duration: started.elapsed(),
                            output: None,
                        });
                        self.notify_finished(&reports[reports.len() - 1]);
                        break;
                    }
                }
            };
            reports.push(StageReport {
                name,
                status,
                duration: started.elapsed(),
                output: None,
            });
        }
        RunReport {
            operation: self.catalog.operation().to_string(),
            outcome,
            stages: reports,
            journal: None,
        }
    }

    fn finished_report(
        &self,
        state: &JournalState,
        outcome: &str,
        mut reports: Vec<StageReport>,
        journal: &Journal,
    ) -> RunReport {
        for report in &mut reports {
            let record = state.stage(&report.name);
            report.status = match record.state {
                StageState::Succeeded => StageStatus::Resumed,
                StageState::Undone => StageStatus::Undone,
                StageState::Failed => StageStatus::Failed {
                    error: record.error.clone().unwrap_or_default(),
                },
                _ => StageStatus::Skipped,
            };
            report.output = record.output.clone();
        }
        let failed = state
            .stages
            .iter()
            .find(|(_, r)| r.error.is_some())
            .map(|(name, r)| (name.clone(), r.error.clone().unwrap_or_default()));
        RunReport {
            operation: self.catalog.operation().to_string(),
            outcome: match (outcome, failed) {
                ("succeeded", _) => RunOutcome::Succeeded,
                ("aborted", _) => RunOutcome::Aborted,
                ("failed", Some((stage, error))) => RunOutcome::Failed { stage, error },
                (_, Some((stage, error))) => RunOutcome::RolledBack { stage, error },
                (_, None) => RunOutcome::RolledBack {
                    stage: "(unknown)".into(),
                    error: "the run was undone".into(),
                },
            },
            stages: reports,
            journal: Some(journal.path().display().to_string()),
        }
    }
}

/// A run's unique id: the journal path and the moment, hashed.
fn new_run_id(journal: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let digest = Sha256::digest(format!("{}\0{nanos}\0{}", journal.display(), std::process::id()));
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::playbook::Playbook;
    use crate::pipeline::stage::StageFailure;
    use async_trait::async_trait;
    use serde_json::json;
    use std::sync::Mutex;

    /// A context that records what the stages did.
    #[derive(Default)]
    struct Ctx {
        log: Mutex<Vec<String>>,
        fail_at: Option<&'static str>,
        /// fails before journaling any progress: changed nothing
        refuse_at: Option<&'static str>,
        fail_undo_at: Option<&'static str>,
        hang_at: Option<&'static str>,
        restored: Vec<String>,
    }

    struct Fake {
        name: &'static str,
        mutates: bool,
    }

    #[async_trait]
    impl DynStage<Ctx> for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn stage_type(&self) -> Option<std::any::TypeId> {
            None
        }
        fn params(&self) -> crate::pipeline::Params {
            crate::pipeline::Params::NONE
        }
        fn summary(&self) -> &'static str {
            "fake"
        }
        fn mutates(&self) -> bool {
            self.mutates
        }
        fn undoable(&self) -> bool {
            self.mutates
        }
        fn plan(&self, _ctx: &Ctx, step: &Step<'_>) -> Vec<String> {
            vec![format!("would {} with {}", self.name, step.params())]
        }
        async fn run(&self, ctx: &mut Ctx, step: &mut Step<'_>) -> Result<Value, StageFailure> {
            if ctx.refuse_at == Some(self.name) {
                return Err(format!("{} refused", self.name).into());
            }
            step.record(json!({"before": self.name}))?;
            ctx.log.lock().unwrap().push(format!("run {}", self.name));
            if ctx.hang_at == Some(self.name) {
                futures_pending().await;
            }
            if ctx.fail_at == Some(self.name) {
                return Err(format!("{} broke", self.name).into());
            }
            Ok(json!({"did": self.name}))
        }
        fn restore(&self, ctx: &mut Ctx, output: &Value) -> Result<(), StageFailure> {
            ctx.restored.push(output["did"].as_str().unwrap_or("?").to_string());
            Ok(())
        }
        async fn undo(&self, ctx: &mut Ctx, input: UndoInput<'_>) -> Result<(), StageFailure> {
            ctx.log.lock().unwrap().push(format!(
                "undo {} output={} progress={}",
                self.name,
                input.output.is_some(),
                input.progress.is_some()
            ));
            if ctx.fail_undo_at == Some(self.name) {
                return Err("undo broke".into());
            }
            Ok(())
        }
    }

    async fn futures_pending() {
        std::future::pending::<()>().await
    }

    fn catalog() -> Catalog<Ctx> {
        Catalog::new("test")
            .with(Fake { name: "check", mutates: false })
            .with(Fake { name: "pause", mutates: true })
            .with(Fake { name: "scale", mutates: true })
            .with(Fake { name: "copy", mutates: false })
    }

    fn playbook() -> Playbook {
        Playbook::parse(
            "operation: test\nstages:\n  - name: check\n  - name: pause\n  - name: scale\n    with: {replicas: 0}\n  - name: copy\n",
            "builtin:test",
        )
        .unwrap()
    }

    fn log(ctx: &Ctx) -> Vec<String> {
        ctx.log.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn runs_every_stage_and_journals_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (catalog, playbook) = (catalog(), playbook());
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx::default();
        let report = runner
            .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut Interrupt::never())
            .await
            .unwrap();
        assert_eq!(report.outcome, RunOutcome::Succeeded);
        assert_eq!(log(&ctx), vec!["run check", "run pause", "run scale", "run copy"]);
        assert_eq!(report.output("scale"), Some(&json!({"did": "scale"})));
        let state = Journal::read(&path).unwrap();
        assert_eq!(state.outcome.as_deref(), Some("succeeded"));
        assert!(["check", "pause", "scale", "copy"]
            .iter()
            .all(|s| state.stage(s).state == StageState::Succeeded));
    }

    #[tokio::test]
    async fn stop_policy_keeps_state_then_resume_retries_and_abort_undoes() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, playbook) = (catalog(), playbook());
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Stop };

        // a failure stops the run with nothing undone, the journal left open
        let path = dir.path().join("resumed");
        let mut ctx = Ctx { fail_at: Some("scale"), ..Default::default() };
        let report = runner
            .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut Interrupt::never())
            .await
            .unwrap();
        assert_eq!(report.outcome, RunOutcome::Stopped { stage: "scale".into(), error: "scale broke".into() });
        assert_eq!(log(&ctx), vec!["run check", "run pause", "run scale"]);
        let state = Journal::read(&path).unwrap();
        assert_eq!(state.stage("scale").state, StageState::Halted);
        assert_eq!(state.outcome, None);
        assert!(!state.rolling_back);

        // --resume runs the halted stage again and goes on
        let mut ctx = Ctx::default();
        let report = runner.run(&mut ctx, Mode::Resume { journal: &path }, &mut Interrupt::never()).await.unwrap();
        assert_eq!(report.outcome, RunOutcome::Succeeded);
        assert_eq!(log(&ctx), vec!["run scale", "run copy"]);
        assert_eq!(ctx.restored, vec!["check", "pause"]);
        assert_eq!(Journal::read(&path).unwrap().outcome.as_deref(), Some("succeeded"));

        // --abort undoes the completed stages and the halted one, newest first
        let path = dir.path().join("aborted");
        let mut ctx = Ctx { fail_at: Some("scale"), ..Default::default() };
        runner
            .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut Interrupt::never())
            .await
            .unwrap();
        let mut ctx = Ctx::default();
        let report = runner.run(&mut ctx, Mode::Abort { journal: &path }, &mut Interrupt::never()).await.unwrap();
        assert_eq!(report.outcome, RunOutcome::Aborted);
        assert_eq!(
            log(&ctx),
            vec!["undo scale output=false progress=true", "undo pause output=true progress=true"]
        );
        let state = Journal::read(&path).unwrap();
        assert_eq!(state.outcome.as_deref(), Some("aborted"));
        assert_eq!(state.stage("pause").state, StageState::Undone);
        // an ended run cannot be resumed into doing more
        let mut ctx = Ctx::default();
        runner.run(&mut ctx, Mode::Resume { journal: &path }, &mut Interrupt::never()).await.unwrap();
        assert!(log(&ctx).is_empty());
    }

    #[tokio::test]
    async fn a_refusal_before_any_change_reads_as_nothing_changed() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, playbook) = (catalog(), playbook());
        for on_failure in [OnFailure::Undo, OnFailure::Stop] {
            let path = dir.path().join(format!("{on_failure:?}"));
            let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure };
            let mut ctx = Ctx { refuse_at: Some("pause"), ..Default::default() };
            let report = runner
                .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut Interrupt::never())
                .await
                .unwrap();
            assert_eq!(report.outcome, RunOutcome::Failed { stage: "pause".into(), error: "pause refused".into() }, "{on_failure:?}");
            assert_eq!(Journal::read(&path).unwrap().outcome.as_deref(), Some("failed"));
        }
        // a stage that journaled progress before failing did change something
        let path = dir.path().join("changed");
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx { fail_at: Some("pause"), ..Default::default() };
        let report = runner
            .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut Interrupt::never())
            .await
            .unwrap();
        assert_eq!(report.outcome, RunOutcome::RolledBack { stage: "pause".into(), error: "pause broke".into() });
    }

    #[tokio::test]
    async fn a_failure_undoes_completed_stages_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (catalog, playbook) = (catalog(), playbook());
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx { fail_at: Some("copy"), ..Default::default() };
        let report = runner
            .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut Interrupt::never())
            .await
            .unwrap();
        assert_eq!(
            report.outcome,
            RunOutcome::RolledBack { stage: "copy".into(), error: "copy broke".into() }
        );
        assert_eq!(
            log(&ctx),
            vec![
                "run check",
                "run pause",
                "run scale",
                "run copy",
                // copy and check do not change anything: nothing to undo
                "undo scale output=true progress=true",
                "undo pause output=true progress=true",
            ]
        );
        let state = Journal::read(&path).unwrap();
        assert_eq!(state.stage("scale").state, StageState::Undone);
        assert_eq!(state.stage("pause").state, StageState::Undone);
        assert_eq!(state.stage("copy").state, StageState::Failed);
        assert_eq!(state.outcome.as_deref(), Some("undone"));
    }

    #[tokio::test]
    async fn an_interrupt_stops_the_stage_and_undoes_it_from_its_progress() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (catalog, playbook) = (catalog(), playbook());
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx { hang_at: Some("scale"), ..Default::default() };
        let (trigger, mut interrupt) = Interrupt::manual();
        let handle = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            trigger.fire("SIGTERM");
        });
        let report = runner
            .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut interrupt)
            .await
            .unwrap();
        handle.await.unwrap();
        assert_eq!(
            report.outcome,
            RunOutcome::RolledBack { stage: "scale".into(), error: "interrupted by SIGTERM".into() }
        );
        // the interrupted stage had recorded progress but no output
        assert!(log(&ctx).contains(&"undo scale output=false progress=true".to_string()));
        assert!(log(&ctx).contains(&"undo pause output=true progress=true".to_string()));
    }

    #[tokio::test]
    async fn resume_after_a_crash_skips_what_succeeded_and_reruns_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (catalog, playbook) = (catalog(), playbook());
        // A crash in `scale`: the journal says check and pause succeeded, scale started.
        {
            let mut journal = Journal::create(
                &path,
                Header {
                    operation: "test".into(),
                    playbook: "builtin:test".into(),
                    stages: playbook.stage_names(),
                    inputs: json!({}),
                    tool_version: "test".into(),
                    clusters: Vec::new(),
                    run_id: String::new(),
                },
            )
            .unwrap();
            for stage in ["check", "pause"] {
                journal.append(Event::Started { stage: stage.into() }).unwrap();
                journal
                    .append(Event::Succeeded { stage: stage.into(), output: json!({"did": stage}) })
                    .unwrap();
            }
            journal.append(Event::Started { stage: "scale".into() }).unwrap();
        }
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx::default();
        let report = runner
            .run(&mut ctx, Mode::Resume { journal: &path }, &mut Interrupt::never())
            .await
            .unwrap();
        assert_eq!(report.outcome, RunOutcome::Succeeded);
        assert_eq!(ctx.restored, vec!["check", "pause"]);
        assert_eq!(log(&ctx), vec!["run scale", "run copy"]);
        assert_eq!(report.stages[0].status, StageStatus::Resumed);
        assert_eq!(report.stages[2].status, StageStatus::Succeeded);

        // Resuming a finished run changes nothing.
        let mut again = Ctx::default();
        let report = runner
            .run(&mut again, Mode::Resume { journal: &path }, &mut Interrupt::never())
            .await
            .unwrap();
        assert_eq!(report.outcome, RunOutcome::Succeeded);
        assert!(log(&again).is_empty());
    }

    #[tokio::test]
    async fn a_failed_undo_is_reported_and_resume_retries_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (catalog, playbook) = (catalog(), playbook());
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx { fail_at: Some("copy"), fail_undo_at: Some("pause"), ..Default::default() };
        let report = runner
            .run(&mut ctx, Mode::Fresh { journal: &path, inputs: json!({}), clusters: Vec::new() }, &mut Interrupt::never())
            .await
            .unwrap();
        assert!(
            matches!(&report.outcome, RunOutcome::UndoFailed { undo_errors, .. } if undo_errors == &vec!["pause: undo broke".to_string()])
        );
        assert_eq!(Journal::read(&path).unwrap().outcome, None, "the run stays open");

        let mut ctx = Ctx::default();
        let report = runner
            .run(&mut ctx, Mode::Resume { journal: &path }, &mut Interrupt::never())
            .await
            .unwrap();
        assert!(matches!(report.outcome, RunOutcome::RolledBack { .. }));
        // only pause still needed undoing; nothing ran forward
        assert_eq!(log(&ctx), vec!["undo pause output=true progress=true"]);
        assert_eq!(Journal::read(&path).unwrap().outcome.as_deref(), Some("undone"));
    }

    #[tokio::test]
    async fn dry_run_runs_readers_plans_writers_and_writes_no_journal() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, playbook) = (catalog(), playbook());
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx::default();
        let report = runner.run(&mut ctx, Mode::DryRun, &mut Interrupt::never()).await.unwrap();
        assert_eq!(report.outcome, RunOutcome::Planned);
        assert_eq!(log(&ctx), vec!["run check", "run copy"]);
        assert_eq!(
            report.stages[2].status,
            StageStatus::Planned { actions: vec!["would scale with {\"replicas\":0}".into()] }
        );
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[tokio::test]
    async fn resume_refuses_a_journal_of_another_operation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        Journal::create(
            &path,
            Header {
                operation: "restore".into(),
                playbook: "x".into(),
                stages: vec![],
                inputs: Value::Null,
                tool_version: "t".into(),
                clusters: Vec::new(),
                run_id: String::new(),
            },
        )
        .unwrap();
        let (catalog, playbook) = (catalog(), playbook());
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let err = runner
            .run(&mut Ctx::default(), Mode::Resume { journal: &path }, &mut Interrupt::never())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is for `restore"), "{err}");
    }

    #[tokio::test]
    async fn a_stage_missing_from_the_catalog_is_refused_before_anything_runs() {
        let playbook = Playbook::parse("operation: test\nstages:\n  - name: nope\n", "p").unwrap();
        let catalog = catalog();
        let runner = Runner { playbook: &playbook, catalog: &catalog, observer: None, on_failure: OnFailure::Undo };
        let mut ctx = Ctx::default();
        let err = runner.run(&mut ctx, Mode::DryRun, &mut Interrupt::never()).await.unwrap_err();
        assert!(matches!(err, RunnerError::MissingStage { .. }));
        assert!(log(&ctx).is_empty());
    }
}
