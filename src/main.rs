//! hcp-dr: parse, run, map the outcome to an exit code.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use hcp_dr::cli::{Cli, color_allowed, progress, run};

fn main() -> ExitCode {
    // known before parsing, so clap's help and errors obey --no-color too
    let color = color_allowed(std::env::args_os().any(|arg| arg == "--no-color"));
    let mut command = Cli::command();
    if !color {
        command = command.color(clap::ColorChoice::Never);
        // indicatif draws through console, which CLICOLOR_FORCE would turn on again
        console::set_colors_enabled(false);
        console::set_colors_enabled_stderr(false);
    }
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|err| err.exit());
    let filter = tracing_subscriber::EnvFilter::try_from_env("HCP_DR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,hcp_dr=info"));
    // log lines go above the progress bars, not through them
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(progress::StderrAboveBars);
    if cli.log_format.json() {
        builder.json().init();
    } else {
        builder.compact().with_ansi(std::io::stderr().is_terminal() && color).init();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: starting the async runtime: {err}");
            return ExitCode::from(1);
        }
    };
    ExitCode::from(runtime.block_on(run(cli)) as u8)
}
