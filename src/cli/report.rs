//! What every pipeline command prints at the end: a headline saying how the
//! run ended and what to do next, a line per stage, and the exit code.

use super::Exit;
use crate::pipeline::{RunOutcome, RunReport, StageStatus};

/// The exit code of a finished run.
pub fn exit_for(outcome: &RunOutcome) -> Exit {
    match outcome {
        RunOutcome::Succeeded | RunOutcome::Planned | RunOutcome::Aborted => Exit::Success,
        RunOutcome::RolledBack { .. } | RunOutcome::Failed { .. } => Exit::Failed,
        RunOutcome::UndoFailed { .. } | RunOutcome::Stopped { .. } => Exit::NeedsAttention,
    }
}

/// How the run ended, and the command that goes on from there.
/// `command` is the operation's command line prefix, e.g. `hcp-dr restore`.
pub fn headline(operation: &str, run: &RunReport, command: &str) -> String {
    let journal = run.journal.as_deref().map(crate::ops::shell_word).unwrap_or_else(|| "JOURNAL".into());
    match &run.outcome {
        RunOutcome::Succeeded => format!("{operation} succeeded"),
        RunOutcome::Planned => format!("{operation} plan (dry run: nothing was changed)"),
        RunOutcome::RolledBack { stage, error } => {
            format!("{operation} FAILED at `{stage}`: {error}\neverything it changed was undone")
        }
        RunOutcome::Failed { stage, error } => {
            format!("{operation} FAILED at `{stage}`: {error}\nnothing was changed")
        }
        RunOutcome::Aborted => format!("{operation} aborted: everything the run had changed was undone ({journal})"),
        RunOutcome::Stopped { stage, error } => format!(
            "{operation} STOPPED at `{stage}`: {error}\nnothing was undone; what the completed stages did is still in place.\nfix the cause and run `{command} --resume {journal}` to retry `{stage}` and go on,\nor `{command} --abort {journal}` to undo everything this run did"
        ),
        RunOutcome::UndoFailed { stage, error, undo_errors } => format!(
            "{operation} FAILED at `{stage}`: {error}\nUNDO FAILED, the cluster needs attention: {}\nfix the cause and run `{command} --resume {journal}` to finish undoing",
            undo_errors.join("; "),
        ),
    }
}

/// One line per stage: name, seconds, status.
pub fn stage_lines(run: &RunReport) -> String {
    let mut out = String::new();
    for stage in &run.stages {
        let status = match &stage.status {
            StageStatus::Succeeded => "done".to_string(),
            StageStatus::Resumed => "done earlier".to_string(),
            StageStatus::Planned { actions } => format!(
                "would:\n{}",
                actions.iter().map(|a| format!("{:>30}- {a}", "")).collect::<Vec<_>>().join("\n")
            ),
            StageStatus::Failed { error } => format!("FAILED: {error}"),
            StageStatus::Undone => "undone".to_string(),
            StageStatus::UndoFailed { error } => format!("UNDO FAILED: {error}"),
            StageStatus::Skipped => "not run".to_string(),
        };
        out.push_str(&format!("  {:<21} {:>7.2}s  {status}\n", stage.name, stage.duration.as_secs_f64()));
    }
    out
}

/// Print an operation's error and map it to its exit code (2: bad input).
pub fn error_exit(err: &crate::ops::OpsError) -> Exit {
    eprintln!("error: {err}");
    if err.exit_code() == 2 { Exit::Usage } else { Exit::Failed }
}

/// SIGINT/SIGTERM as an [`Interrupt`], or the exit code when they cannot be caught.
pub fn signals() -> Result<crate::pipeline::Interrupt, Exit> {
    crate::pipeline::Interrupt::on_signals().map_err(|err| {
        eprintln!("error: installing signal handlers: {err}");
        Exit::Failed
    })
}

/// The final report: JSON or YAML of `value`, or the text `render` makes.
pub fn print<T: serde::Serialize>(output: super::Output, value: &T, render: impl FnOnce() -> String) {
    match output {
        super::Output::Json => println!("{}", serde_json::to_string_pretty(value).unwrap_or_default()),
        super::Output::Yaml => print!("{}", yaml(value)),
        // `run` refuses -o html for every command but `report`
        super::Output::Text | super::Output::Html => print!("{}", render()),
    }
}

/// `value` as YAML, the same document `-o json` prints: it goes through
/// serde_json's value first, so both show the same fields in the same order
/// with the same numbers (and a script can switch formats without surprises).
pub fn yaml<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .map_err(|e| e.to_string())
        .and_then(|value| serde_saphyr::to_string(&value).map_err(|e| e.to_string()))
        .map(|text| if text.ends_with('\n') { text } else { text + "\n" })
        .unwrap_or_default()
}

/// The exit code of a run; an `--abort` that undid everything succeeded.
pub fn exit_for_run(outcome: &RunOutcome, aborting: bool) -> Exit {
    match outcome {
        // the abort leaves nothing of the run behind: what it changed was
        // undone, or it had changed nothing
        RunOutcome::RolledBack { .. } | RunOutcome::Failed { .. } if aborting => Exit::Success,
        RunOutcome::Aborted => Exit::Success,
        other => exit_for(other),
    }
}

/// Progress bars when a person watches a terminal and asked for text.
pub fn progress(output: super::Output) -> Option<std::sync::Arc<dyn crate::pipeline::runner::Observer>> {
    (output == super::Output::Text && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| std::sync::Arc::new(super::progress::TerminalProgress::new()) as _)
}

/// A byte count for people: `512 B`, `1.5 MiB`, `8.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}
