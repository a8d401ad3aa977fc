//! The `Stage` trait every pipeline step implements, and what the runner
//! hands a stage while it runs.

use std::any::TypeId;
use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

use super::journal::{Event, Journal, JournalError};

/// A stage's error: whatever the stage's own module returns, with its causes.
pub type StageFailure = Box<dyn std::error::Error + Send + Sync>;

/// A stage's `with:` parameters as a type: unknown keys refused
/// (`#[serde(deny_unknown_fields)]`), every key optional (`Default` is
/// what the stage does without them).
pub trait StageParams: DeserializeOwned + Default {
    /// `(key, what it sets and its default)`, for `hcp-dr playbook show`.
    const KEYS: &'static [(&'static str, &'static str)];
    /// What the types cannot say (ranges).
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The parameters a stage takes, for checking a playbook when it loads and
/// for `playbook show`.
#[derive(Clone, Copy)]
pub struct Params {
    pub keys: &'static [(&'static str, &'static str)],
    check: fn(&Value) -> Result<(), String>,
}

impl Params {
    /// A stage without parameters: any `with:` is refused.
    pub const NONE: Params = Params { keys: &[], check: no_params };

    /// The parameters of type `T`.
    pub fn of<T: StageParams>() -> Params {
        Params { keys: T::KEYS, check: |value| read_params::<T>(value).map(|_| ()) }
    }

    /// Whether `value` (a playbook's `with:`, Null when absent) is valid.
    pub fn check(&self, value: &Value) -> Result<(), String> {
        (self.check)(value)
    }
}

fn no_params(value: &Value) -> Result<(), String> {
    match value {
        Value::Null => Ok(()),
        Value::Object(map) if map.is_empty() => Ok(()),
        _ => Err("this stage takes no parameters (`hcp-dr playbook show OPERATION` lists the ones that do)".into()),
    }
}

/// `value` read as `T`: Null is `T::default()`.
pub fn read_params<T: StageParams>(value: &Value) -> Result<T, String> {
    let params: T = if value.is_null() { T::default() } else { serde_json::from_value(value.clone()).map_err(|e| e.to_string())? };
    params.check()?;
    Ok(params)
}

/// What names a stage and what it produces, whatever the context it runs
/// in: the runner journals the output and hands it back, typed, to
/// [`Stage::restore`] on resume and to later stages through
/// [`Step::output_of`].
pub trait StageId: 'static {
    /// The name used in playbooks and journals, e.g. `scale-down`: the one
    /// place it is written.
    const NAME: &'static str;
    /// What the stage produces (journaled as JSON).
    type Output: Serialize + DeserializeOwned + Send + Sync;
}

/// One step of an operation. `C` is the operation's context (clients,
/// options, what earlier stages found).
#[async_trait]
pub trait Stage<C>: StageId + Send + Sync {
    /// One line for `hcp-dr playbook show`.
    fn summary(&self) -> &'static str;
    /// Whether the stage changes a cluster or a store. Dry-run runs the
    /// stages that do not, and asks the others for their [`Stage::plan`].
    fn mutates(&self) -> bool;
    /// Dry-run: what the stage would do, one line per action, from the context
    /// and `step`: its parameters and what the read-only stages before it
    /// produced ([`Step::output_of`]; a mutating stage's output is absent).
    fn plan(&self, ctx: &C, step: &Step<'_>) -> Vec<String>;
    /// Do the work; the output is journaled and, on resume, handed back
    /// through [`Stage::restore`]. A stage that changes something calls
    /// [`Step::record`] with what it needs to undo *before* changing it.
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Self::Output, StageFailure>;
    /// Resume: put a succeeded stage's output back into the context.
    fn restore(&self, _ctx: &mut C, _output: Self::Output) -> Result<(), StageFailure> {
        Ok(())
    }
    /// Its `with:` parameters ([`Params::NONE`] unless it takes some).
    fn params(&self) -> Params {
        Params::NONE
    }
    /// Whether [`Stage::undo`] does anything (stages that change a cluster).
    fn undoable(&self) -> bool {
        false
    }
    /// Put back what [`Stage::run`] changed. Called for a succeeded stage (with
    /// its output) and for a stage that failed or was interrupted part-way
    /// (output `None`, with the last progress record). Must be idempotent.
    async fn undo(&self, _ctx: &mut C, _input: UndoInput<'_>) -> Result<(), StageFailure> {
        Ok(())
    }
}

/// A stage as the runner drives it: outputs as JSON, the name a value.
/// Every [`Stage`] is one; a wrapper that runs another stage on part of its
/// context (migrate's source and destination stages) implements it directly.
#[async_trait]
pub trait DynStage<C>: Send + Sync {
    fn name(&self) -> &'static str;
    /// The [`Stage`] type behind it (a wrapper gives its inner stage's):
    /// how [`Step::needs`] finds a stage whatever its name in the operation
    /// (`None`: one no other stage can read, like the runner's test fakes).
    fn stage_type(&self) -> Option<TypeId>;
    fn summary(&self) -> &'static str;
    fn mutates(&self) -> bool;
    fn plan(&self, ctx: &C, step: &Step<'_>) -> Vec<String>;
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Value, StageFailure>;
    fn restore(&self, ctx: &mut C, output: &Value) -> Result<(), StageFailure>;
    fn params(&self) -> Params;
    fn undoable(&self) -> bool;
    async fn undo(&self, ctx: &mut C, input: UndoInput<'_>) -> Result<(), StageFailure>;
}

#[async_trait]
impl<C: Send, S: Stage<C>> DynStage<C> for S {
    fn name(&self) -> &'static str {
        S::NAME
    }
    fn stage_type(&self) -> Option<TypeId> {
        Some(TypeId::of::<S>())
    }
    fn summary(&self) -> &'static str {
        Stage::summary(self)
    }
    fn mutates(&self) -> bool {
        Stage::mutates(self)
    }
    fn plan(&self, ctx: &C, step: &Step<'_>) -> Vec<String> {
        Stage::plan(self, ctx, step)
    }
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Value, StageFailure> {
        let output = Stage::run(self, ctx, step).await?;
        serde_json::to_value(output).map_err(|e| OutputError { stage: S::NAME, message: e.to_string() }.into())
    }
    fn restore(&self, ctx: &mut C, output: &Value) -> Result<(), StageFailure> {
        Stage::restore(self, ctx, parse_output(S::NAME, output)?)
    }
    fn params(&self) -> Params {
        Stage::params(self)
    }
    fn undoable(&self) -> bool {
        Stage::undoable(self)
    }
    async fn undo(&self, ctx: &mut C, input: UndoInput<'_>) -> Result<(), StageFailure> {
        Stage::undo(self, ctx, input).await
    }
}

/// A journaled output or progress record that cannot be read back as the
/// type its stage declares (a journal from another version, or edited).
#[derive(Debug, thiserror::Error)]
#[error("journaled output of `{stage}`: {message}")]
pub struct OutputError {
    pub stage: &'static str,
    pub message: String,
}

fn parse_output<T: DeserializeOwned>(stage: &'static str, value: &Value) -> Result<T, OutputError> {
    T::deserialize(value).map_err(|e| OutputError { stage, message: e.to_string() })
}

/// What an undo is given.
#[derive(Debug, Clone, Copy)]
pub struct UndoInput<'a> {
    /// The stage being undone (its name, for messages).
    pub stage: &'static str,
    pub output: Option<&'a Value>,
    pub progress: Option<&'a Value>,
    pub params: &'a Value,
    /// The run so far, for [`UndoInput::output_of`] (None in tests).
    pub earlier: Option<&'a super::journal::JournalState>,
    pub index: &'a StageIndex,
}

impl UndoInput<'_> {
    /// What the undo works from, as `T`: the stage's output, or, when it
    /// stopped part-way, its last progress record. `None` when it changed
    /// nothing yet.
    pub fn record<T: DeserializeOwned>(&self) -> Result<Option<T>, OutputError> {
        self.output.or(self.progress).map(|value| parse_output(self.stage, value)).transpose()
    }

    /// The stage's output, as `T` (`None`: it did not finish).
    pub fn output<T: DeserializeOwned>(&self) -> Result<Option<T>, OutputError> {
        self.output.map(|value| parse_output(self.stage, value)).transpose()
    }

    /// The stage's last progress record, as `T` (`None`: none journaled).
    pub fn progress<T: DeserializeOwned>(&self) -> Result<Option<T>, OutputError> {
        self.progress.map(|value| parse_output(self.stage, value)).transpose()
    }

    /// The output of an earlier stage `S` of the run being undone, as
    /// [`Step::output_of`] (`None`: it did not finish).
    pub fn output_of<S: StageId>(&self) -> Result<Option<S::Output>, OutputError> {
        let (Some(earlier), Some(name)) = (self.earlier, self.index.name_of::<S>()) else { return Ok(None) };
        earlier.stage(name).output.map(|output| parse_output(name, &output)).transpose()
    }
}

/// The stages of one run, for [`Step`]: each one's [`Stage`] type, its
/// name in this operation, and the stages it declared it needs
/// ([`super::Catalog::after`]).
#[derive(Debug, Default)]
pub struct StageIndex {
    stages: Vec<(Option<TypeId>, &'static str, Vec<&'static str>)>,
}

impl StageIndex {
    pub(crate) fn add(&mut self, stage_type: Option<TypeId>, name: &'static str, after: Vec<&'static str>) {
        self.stages.push((stage_type, name, after));
    }

    /// The name the stage of type `S` has in this operation (a migration
    /// runs restore's `preflight` as `destination-preflight`).
    fn name_of<S: StageId>(&self) -> Option<&'static str> {
        self.stages.iter().find(|(t, _, _)| *t == Some(TypeId::of::<S>())).map(|(_, name, _)| *name)
    }

    fn declared(&self, stage: &str) -> &[&'static str] {
        self.stages.iter().find(|(_, name, _)| *name == stage).map(|(_, _, after)| after.as_slice()).unwrap_or_default()
    }
}

static NO_STAGES: StageIndex = StageIndex { stages: Vec::new() };

/// Where a step reads earlier stages' outputs.
enum Record<'a> {
    /// A run: the journal (outputs of this run and of the run resumed).
    Journal(&'a mut Journal),
    /// A dry-run: what its read-only stages returned so far.
    DryRun(&'a BTreeMap<&'static str, Value>),
    None,
}

/// A running stage's handle: its parameters, its journal, and the outputs
/// of the stages before it.
pub struct Step<'a> {
    record: Record<'a>,
    stage: &'static str,
    params: &'a Value,
    index: &'a StageIndex,
    observer: Option<&'a dyn super::runner::Observer>,
}

impl<'a> Step<'a> {
    pub(crate) fn new(journal: &'a mut Journal, index: &'a StageIndex, stage: &'static str, params: &'a Value) -> Self {
        Step {
            record: Record::Journal(journal),
            stage,
            params,
            index,
            observer: None,
        }
    }

    /// A dry-run's step: `outputs` are what the read-only stages before it
    /// returned.
    pub(crate) fn planning(outputs: &'a BTreeMap<&'static str, Value>, index: &'a StageIndex, stage: &'static str, params: &'a Value) -> Self {
        Step {
            record: Record::DryRun(outputs),
            stage,
            params,
            index,
            observer: None,
        }
    }

    /// Whether this is a dry-run's step (nothing after it will use what it
    /// keeps for later stages).
    pub fn dry_run(&self) -> bool {
        matches!(self.record, Record::DryRun(_))
    }

    /// A step with no journal and no earlier stages (tests).
    pub fn detached(stage: &'static str, params: &'a Value) -> Self {
        Step {
            record: Record::None,
            stage,
            params,
            index: &NO_STAGES,
            observer: None,
        }
    }

    /// This step's progress is shown by `observer`.
    pub(crate) fn observed(mut self, observer: Option<&'a dyn super::runner::Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Show the bytes `meter` counts as this stage's progress (nothing
    /// without a display, or in a dry-run).
    pub fn show(&self, meter: &super::Meter) {
        if let Some(observer) = self.observer {
            observer.metering(self.stage, meter);
        }
    }

    /// What the journal says so far (None in dry-run): stage times, outputs.
    pub fn history(&self) -> Option<&super::journal::JournalState> {
        match &self.record {
            Record::Journal(journal) => Some(journal.state()),
            _ => None,
        }
    }

    /// The progress an earlier, interrupted attempt of this stage journaled
    /// (a rerun must keep what was there before the first attempt changed
    /// anything). `None` in dry-run, on a first attempt, or when the record
    /// is not a `T`.
    pub fn earlier_progress<T: DeserializeOwned>(&self) -> Option<T> {
        self.history()
            .and_then(|history| history.stage(self.stage).progress)
            .and_then(|progress| T::deserialize(&progress).ok())
    }

    /// The output of the earlier stage `S` in this run (or the run resumed,
    /// or, in a dry-run, the read-only stages so far), found by its type
    /// whatever its name in this operation: the typed handle a stage reads
    /// an earlier one's result through, where that stage is optional.
    /// `None` when it did not run (a playbook that left it out, or a
    /// mutating stage in a dry-run) or the operation has no such stage.
    pub fn output_of<S: StageId>(&self) -> Result<Option<S::Output>, OutputError> {
        let Some(name) = self.index.name_of::<S>() else { return Ok(None) };
        let output = match &self.record {
            Record::Journal(journal) => journal.state().stage(name).output,
            Record::DryRun(outputs) => outputs.get(name).cloned(),
            Record::None => None,
        };
        output.map(|output| parse_output(name, &output)).transpose()
    }

    /// The output of `S`, an earlier stage this one needs. The catalog
    /// declares it ([`super::Catalog::after`]), so the playbook rules,
    /// checked when the playbook loads, put `S` before this stage; reading
    /// a stage not declared is refused, so a missing declaration shows in
    /// the first test that runs the stage. An error otherwise only for a
    /// journal that does not hold it (written by another version, or
    /// edited), or in a dry-run when `S` mutates and so did not run.
    pub fn needs<S: StageId>(&self) -> Result<S::Output, OutputError> {
        let Some(name) = self.index.name_of::<S>() else {
            return Err(OutputError {
                stage: S::NAME,
                message: format!("`{}` needs `{}`, which this operation does not have", self.stage, S::NAME),
            });
        };
        if !self.index.declared(self.stage).contains(&name) {
            return Err(OutputError {
                stage: S::NAME,
                message: format!("`{}` reads `{name}` without declaring it (Catalog::after): a bug in hcp-dr", self.stage),
            });
        }
        self.output_of::<S>()?.ok_or_else(|| OutputError {
            stage: S::NAME,
            message: match self.record {
                Record::Journal(_) => format!("`{}` needs its output and the journal has none (resume with the playbook the run started with)", self.stage),
                _ => format!("`{}` needs its output, which a dry-run does not produce", self.stage),
            },
        })
    }

    /// Whether the earlier stage `S` succeeded in this run (or the run
    /// resumed). False in dry-run.
    pub fn succeeded<S: StageId>(&self) -> bool {
        let (Some(history), Some(name)) = (self.history(), self.index.name_of::<S>()) else { return false };
        history.stage(name).state == super::StageState::Succeeded
    }

    /// The stage's `with:` parameters from the playbook (Null when none).
    pub fn params(&self) -> &Value {
        self.params
    }

    /// The stage's parameters as `T` (checked when the playbook loaded).
    pub fn read_params<T: StageParams>(&self) -> Result<T, StageFailure> {
        read_params(self.params).map_err(|e| format!("with: {e}").into())
    }

    /// Journal `data` (fsynced) before changing something, so that a crash or an
    /// interrupt part-way through can still be undone from it.
    pub fn record(&mut self, data: Value) -> Result<(), JournalError> {
        match &mut self.record {
            Record::Journal(journal) => journal.append(Event::Progress {
                stage: self.stage.to_string(),
                data,
            }),
            _ => Ok(()),
        }
    }
}

/// Fires when the run must stop (SIGINT or SIGTERM).
pub struct Interrupt {
    rx: watch::Receiver<Option<&'static str>>,
    _keep: Option<watch::Sender<Option<&'static str>>>,
}

/// Fires an [`Interrupt`] by hand.
pub struct InterruptTrigger(watch::Sender<Option<&'static str>>);

impl InterruptTrigger {
    pub fn fire(&self, signal: &'static str) {
        let _ = self.0.send(Some(signal));
    }
}

impl Interrupt {
    /// Never fires.
    pub fn never() -> Interrupt {
        let (tx, rx) = watch::channel(None);
        Interrupt { rx, _keep: Some(tx) }
    }

    /// Fired by the returned trigger.
    pub fn manual() -> (InterruptTrigger, Interrupt) {
        let (tx, rx) = watch::channel(None);
        (InterruptTrigger(tx), Interrupt { rx, _keep: None })
    }

    /// Fires on SIGINT or SIGTERM. Must be called inside a tokio runtime.
    pub fn on_signals() -> std::io::Result<Interrupt> {
        use tokio::signal::unix::{SignalKind, signal};
        let (trigger, interrupt) = Interrupt::manual();
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
            trigger.fire(name);
            // keep the sender alive so the receiver does not see a closed channel
            std::future::pending::<()>().await;
        });
        Ok(interrupt)
    }

    /// Wait until fired; returns the signal's name. Returns at once if it has
    /// already fired; never returns when nothing can fire it any more.
    pub async fn wait(&mut self) -> &'static str {
        loop {
            if let Some(signal) = *self.rx.borrow_and_update() {
                return signal;
            }
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// An error and its causes on one line: `a: b: c`.
pub use crate::error::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chain_joins_causes_once() {
        let err = Outer(std::io::Error::other("disk full"));
        assert_eq!(error_chain(&err), "outer: disk full");
    }

    #[tokio::test]
    async fn interrupt_fires_once_and_stays_fired() {
        let (trigger, mut interrupt) = Interrupt::manual();
        trigger.fire("SIGINT");
        assert_eq!(interrupt.wait().await, "SIGINT");
        assert_eq!(interrupt.wait().await, "SIGINT");
    }
}
