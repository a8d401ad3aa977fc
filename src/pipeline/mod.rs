//! The pipeline core: playbooks (what to run), stages (how), the journal
//! (what happened) and the runner (doing it, undoing it on failure,
//! resuming it after a crash).
pub mod journal;
pub mod playbook;
pub mod runner;
pub mod stage;

pub use crate::meter::Meter;
pub use journal::{Journal, JournalError, JournalState, StageState};
pub use playbook::{Playbook, PlaybookError, StageRules};
pub use runner::{Catalog, Mode, OnFailure, RunOutcome, RunReport, Runner, RunnerError, StageReport, StageStatus};
pub use stage::{DynStage, Interrupt, OutputError, Params, Stage, StageFailure, StageId, StageIndex, StageParams, Step, UndoInput, read_params};
