//! hcp-dr: parse, run, map the outcome to an exit code.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use hcp_dr::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("HCP_DR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,hcp_dr=info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if cli.log_format.json() {
        builder.json().init();
    } else {
        builder.compact().with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()).init();
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
