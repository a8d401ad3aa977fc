//! The `Stage` trait every pipeline step implements, and what the runner
//! hands a stage while it runs.

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
pub trait StageId {
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
    /// built so far by the read-only stages.
    fn plan(&self, ctx: &C, params: &Value) -> Vec<String>;
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
    fn summary(&self) -> &'static str;
    fn mutates(&self) -> bool;
    fn plan(&self, ctx: &C, params: &Value) -> Vec<String>;
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
    fn summary(&self) -> &'static str {
        Stage::summary(self)
    }
    fn mutates(&self) -> bool {
        Stage::mutates(self)
    }
    fn plan(&self, ctx: &C, params: &Value) -> Vec<String> {
        Stage::plan(self, ctx, params)
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
}

/// A running stage's handle: its parameters and its journal.
pub struct Step<'a> {
    journal: Option<&'a mut Journal>,
    stage: &'static str,
    params: &'a Value,
}

impl<'a> Step<'a> {
    pub(crate) fn new(journal: &'a mut Journal, stage: &'static str, params: &'a Value) -> Self {
        Step {
            journal: Some(journal),
            stage,
            params,
        }
    }

    /// A step with no journal (dry-run, tests).
    pub fn detached(stage: &'static str, params: &'a Value) -> Self {
        Step {
            journal: None,
            stage,
            params,
        }
    }

    /// What the journal says so far (None in dry-run): stage times, outputs.
    pub fn history(&self) -> Option<&super::journal::JournalState> {
        self.journal.as_deref().map(|j| j.state())
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

    /// The output of the earlier stage `S` in this run (or the run resumed):
    /// the typed handle a later stage reads an earlier one's result through.
    /// The playbook rules, checked when the playbook loads, make sure `S`
    /// ran first where a stage needs it; `None` when it did not run (dry-run,
    /// or a playbook that left it out).
    pub fn output_of<S: StageId>(&self) -> Result<Option<S::Output>, OutputError> {
        self.history()
            .and_then(|history| history.stage(S::NAME).output)
            .map(|output| parse_output(S::NAME, &output))
            .transpose()
    }

    /// The output of `S`, an earlier stage this one needs: the catalog
    /// declares it ([`super::Catalog::after`]), so the playbook rules,
    /// checked when the playbook loads, put `S` before this stage. An error
    /// only for a journal that does not hold it (written by another version,
    /// or edited).
    pub fn needs<S: StageId>(&self) -> Result<S::Output, OutputError> {
        self.output_of::<S>()?.ok_or_else(|| OutputError {
            stage: S::NAME,
            message: format!("`{}` needs its output and the journal has none (resume with the playbook the run started with)", self.stage),
        })
    }

    /// Whether the earlier stage `S` succeeded in this run (or the run
    /// resumed). False in dry-run.
    pub fn succeeded<S: StageId>(&self) -> bool {
        self.history().is_some_and(|history| history.stage(S::NAME).state == super::StageState::Succeeded)
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
        match &mut self.journal {
            Some(journal) => journal.append(Event::Progress {
                stage: self.stage.to_string(),
                data,
            }),
            None => Ok(()),
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
