//! Progress on a terminal: a spinner per running stage, a line per finished
//! one, with bytes, rate and share of the expected size for a stage that
//! moves bytes ([`Meter`]). Off when stderr is not a terminal (logs are structured there) or the
//! report is JSON or YAML. Log lines are written above the bars
//! ([`StderrAboveBars`]), and a stage's description is cut to the
//! terminal's width ([`fit`]), so neither tears the display. No colour is
//! used; with NO_COLOR or --no-color, console (indicatif's terminal layer) is
//! told so too.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressState, ProgressStyle};

use crate::pipeline::{Meter, StageStatus};
use crate::pipeline::runner::Observer;

/// The width the running-stage template takes before the description:
/// spinner, space, prefix (14 or the stage's name), space, elapsed (4), space.
const PREFIX_WIDTH: usize = 14;

pub struct TerminalProgress {
    id: u64,
    bars: MultiProgress,
    running: Mutex<HashMap<String, Running>>,
}

struct Running {
    bar: ProgressBar,
    meter: Option<Meter>,
}

/// The bars on screen now, newest last, for log lines to suspend.
static SHOWN: Mutex<Vec<(u64, MultiProgress)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl TerminalProgress {
    pub fn new() -> TerminalProgress {
        let progress = TerminalProgress {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            bars: MultiProgress::new(),
            running: Mutex::new(HashMap::new()),
        };
        if let Ok(mut shown) = SHOWN.lock() {
            shown.push((progress.id, progress.bars.clone()));
        }
        progress
    }
}

impl Default for TerminalProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TerminalProgress {
    fn drop(&mut self) {
        if let Ok(mut shown) = SHOWN.lock() {
            shown.retain(|(id, _)| *id != self.id);
        }
    }
}

/// Run `write` with the progress bars (if any are shown) cleared from the
/// terminal, and draw them again below what it wrote.
pub fn above_bars<R>(write: impl FnOnce() -> R) -> R {
    // cloned out: the lock is not held while the bars are redrawn
    let bars = SHOWN.lock().ok().and_then(|shown| shown.last().map(|(_, bars)| bars.clone()));
    match bars {
        Some(bars) => bars.suspend(write),
        None => write(),
    }
}

/// The tracing writer: stderr, one whole log event at a time written above
/// the progress bars (a WARN in the middle of a stage used to be drawn over
/// by the next tick of its spinner, or split it in two).
#[derive(Debug, Clone, Copy, Default)]
pub struct StderrAboveBars;

/// One log event, buffered until tracing is done with it.
pub struct LogEvent(Vec<u8>);

impl Write for LogEvent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let event = std::mem::take(&mut self.0);
            above_bars(|| {
                let _ = std::io::stderr().lock().write_all(&event);
            });
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for StderrAboveBars {
    type Writer = LogEvent;

    fn make_writer(&'a self) -> LogEvent {
        LogEvent(Vec::new())
    }
}

/// A stage's description as one line that fits a terminal `width` columns
/// wide after the spinner, the stage's name and the elapsed time: its first
/// line, cut with `…` when longer. Unchanged without a width (not known).
pub fn fit(stage: &str, description: &str, width: Option<usize>) -> String {
    let first = description.lines().next().unwrap_or_default();
    let line = if description.lines().nth(1).is_some() { format!("{first} …") } else { first.to_string() };
    match width {
        None => line,
        Some(width) => {
            let room = width.saturating_sub(2 + console::measure_text_width(stage).max(PREFIX_WIDTH) + 1 + 4 + 1);
            // (truncate_str gives the tail alone for no room, one column too many)
            if room == 0 { String::new() } else { console::truncate_str(&line, room, "…").into_owned() }
        }
    }
}

/// What a meter has counted, for a stage's line: `12.0 MiB of 1.1 GiB
/// at 40.0 MiB/s` (`of` only when the size is known); empty before the first
/// byte.
pub fn metered(bytes: u64, expected: Option<u64>, rate: f64) -> String {
    if bytes == 0 {
        return String::new();
    }
    let of = expected.map(|total| format!(" of {}", HumanBytes(total))).unwrap_or_default();
    format!("{}{of} at {}/s", HumanBytes(bytes), HumanBytes(rate as u64))
}

fn meter_text(meter: &Meter) -> String {
    metered(meter.bytes(), meter.expected(), meter.rate())
}

/// The width of the terminal on stderr, when it is one.
fn terminal_width() -> Option<usize> {
    console::Term::stderr().size_checked().map(|(_rows, columns)| columns as usize)
}

impl Observer for TerminalProgress {
    fn started(&self, stage: &str, summary: &str) {
        let bar = self.bars.add(ProgressBar::new_spinner());
        bar.set_style(
            // wide_msg cuts again should the terminal narrow while the stage runs
            ProgressStyle::with_template("{spinner} {prefix:<14} {elapsed:>4} {wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_prefix(stage.to_string());
        bar.set_message(fit(stage, summary, terminal_width()));
        bar.enable_steady_tick(Duration::from_millis(120));
        if let Ok(mut running) = self.running.lock() {
            running.insert(stage.to_string(), Running { bar, meter: None });
        }
    }

    fn metering(&self, stage: &str, meter: &Meter) {
        let Ok(mut running) = self.running.lock() else { return };
        let Some(running) = running.get_mut(stage) else { return };
        let shown = meter.clone();
        let style = ProgressStyle::with_template("{spinner} {prefix:<14} {elapsed:>4} {bytes}{wide_msg}")
            .map(|style| {
                style.with_key("bytes", move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let text = meter_text(&shown);
                    if !text.is_empty() {
                        let _ = w.write_str(&format!("{text} · "));
                    }
                })
            })
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        running.bar.set_style(style);
        running.meter = Some(meter.clone());
    }

    fn finished(&self, stage: &str, status: &StageStatus, duration: Duration) {
        let Some(Running { bar, meter }) = self.running.lock().ok().and_then(|mut r| r.remove(stage)) else {
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
        let moved = meter.map(|meter| metered(meter.bytes(), None, meter.rate())).filter(|text| !text.is_empty());
        let moved = moved.map(|text| format!(", {text}")).unwrap_or_default();
        bar.finish_with_message(format!("{word} in {:.1}s{moved}", duration.as_secs_f64()));
    }
}

#[cfg(test)]
mod tests {
    use super::metered;

    #[test]
    fn a_meter_reads_bytes_share_and_rate_and_nothing_before_the_first_byte() {
        assert_eq!(metered(0, Some(1 << 30), 0.0), "");
        assert_eq!(metered(12 << 20, Some(1 << 30), 40.0 * 1024.0 * 1024.0), "12.00 MiB of 1.00 GiB at 40.00 MiB/s");
        assert_eq!(metered(3 << 10, None, 1024.0), "3.00 KiB at 1.00 KiB/s");
    }
}
