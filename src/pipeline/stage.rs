//! The `Stage` trait every pipeline step implements, and what the runner
//! hands a stage while it runs.

use async_trait::async_trait;
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

/// One step of an operation. `C` is the operation's context (clients,
/// options, what earlier stages found).
#[async_trait]
pub trait Stage<C>: Send + Sync {
    /// The name used in playbooks and journals, e.g. `scale-down`.
    fn name(&self) -> &'static str;
    /// One line for `hcp-dr playbook show`.
    fn summary(&self) -> &'static str;
    /// Whether the stage changes a cluster or a store. Dry-run runs the
    /// stages that do not, and asks the others for their [`Stage::plan`].
    fn mutates(&self) -> bool;
    /// Dry-run: what the stage would do, one line per action, from the context
    /// built so far by the read-only stages.
    fn plan(&self, ctx: &C, params: &Value) -> Vec<String>;
    /// Do the work; the returned output is journaled and, on resume, handed
    /// back through [`Stage::restore`]. A stage that changes something calls
    /// [`Step::record`] with what it needs to undo *before* changing it.
    async fn run(&self, ctx: &mut C, step: &mut Step<'_>) -> Result<Value, StageFailure>;
    /// Resume: put a succeeded stage's output back into the context.
    fn restore(&self, _ctx: &mut C, _output: &Value) -> Result<(), StageFailure> {
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

/// What an undo is given.
#[derive(Debug, Clone, Copy)]
pub struct UndoInput<'a> {
    pub output: Option<&'a Value>,
    pub progress: Option<&'a Value>,
    pub params: &'a Value,
}

/// A running stage's handle: its parameters and its journal.
pub struct Step<'a> {
    journal: Option<&'a mut Journal>,
    stage: &'a str,
    params: &'a Value,
}

impl<'a> Step<'a> {
    pub(crate) fn new(journal: &'a mut Journal, stage: &'a str, params: &'a Value) -> Self {
        Step {
            journal: Some(journal),
            stage,
            params,
        }
    }

    /// A step with no journal (dry-run, tests).
    pub fn detached(stage: &'a str, params: &'a Value) -> Self {
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
