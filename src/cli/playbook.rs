//! `hcp-dr playbook show NAME [--playbook FILE]`.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::{Exit, Output};
use crate::ops;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the stages an operation runs, in order, and what each does.
    #[command(after_help = "Example:\n  hcp-dr playbook show restore")]
    Show {
        /// The playbook: an operation's name (its default playbook), or another embedded playbook of it (restore-dns-takeover).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(ops::registry::names()))]
        name: String,
        /// Check and show this file instead of the embedded playbook.
        #[arg(long)]
        playbook: Option<PathBuf>,
    },
}

pub fn exec(command: Command, output: Output) -> Exit {
    let Command::Show { name, playbook } = command;
    let result = ops::registry::find(&name).and_then(|entry| entry.describe(playbook.as_deref()));
    match result {
        Ok(stages) => {
            let value = json!({"operation": name, "stages": stages.iter().map(|s| json!({
                "name": s.name,
                "summary": s.summary,
                "undoable": s.undoable,
                "params": s.params.iter().map(|(key, what)| json!({"key": key, "what": what})).collect::<Vec<_>>(),
                "with": s.with,
            })).collect::<Vec<_>>()});
            super::report::print(output, &value, || {
                let mut out = format!("{name} ({})\n", playbook.map(|p| p.display().to_string()).unwrap_or_else(|| format!("builtin:{name}")));
                for (index, s) in stages.iter().enumerate() {
                    out.push_str(&format!("  {:>2}. {:<21} {}{}\n", index + 1, s.name, s.summary, if s.undoable { "  [undoable]" } else { "" }));
                    for (key, what) in &s.params {
                        let set = s.with.get(key).map(|v| format!(" = {}", v.as_str().map_or_else(|| v.to_string(), str::to_string))).unwrap_or_default();
                        out.push_str(&format!("        with: {key}{set}: {what}\n"));
                    }
                }
                out
            });
            Exit::Success
        }
        Err(err) => super::report::error_exit(&err),
    }
}
