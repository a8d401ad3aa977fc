//! Progress on a terminal: a spinner per running stage, a line per finished
//! one. Off when stderr is not a terminal (logs are structured there) or the
//! report is JSON.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::pipeline::StageStatus;
use crate::pipeline::runner::Observer;

pub struct TerminalProgress {
    bars: MultiProgress,
    running: Mutex<HashMap<String, ProgressBar>>,
}

impl TerminalProgress {
    pub fn new() -> TerminalProgress {
        TerminalProgress {
            bars: MultiProgress::new(),
            running: Mutex::new(HashMap::new()),
        }
    }
}

impl Default for TerminalProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Observer for TerminalProgress {
    fn started(&self, stage: &str, summary: &str) {
        let bar = self.bars.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix:<14} {elapsed:>4} {wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_prefix(stage.to_string());
        bar.set_message(summary.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        if let Ok(mut running) = self.running.lock() {
            running.insert(stage.to_string(), bar);
        }
    }

    fn finished(&self, stage: &str, status: &StageStatus, duration: Duration) {
        let Some(bar) = self.running.lock().ok().and_then(|mut r| r.remove(stage)) else {
            return;
        };
        let word = match status {
            StageStatus::Succeeded => "done",
            StageStatus::Undone => "undone",
            StageStatus::Failed { .. } => "FAILED",
            StageStatus::UndoFailed { .. } => "UNDO FAILED",
            _ => "",
        };
        bar.set_style(ProgressStyle::with_template("  {prefix:<14} {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()));
        bar.finish_with_message(format!("{word} in {:.1}s", duration.as_secs_f64()));
    }
}
