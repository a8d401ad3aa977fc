//! `hcp-dr completion SHELL`: the shell's completion script, generated
//! from the same clap definitions the commands parse with.

use std::io::Write;

use clap::CommandFactory;

use super::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// The completion script for `shell`.
pub fn script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut cmd = super::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "hcp-dr", &mut out);
    out
}

pub fn exec(args: Args) -> Exit {
    // written whole, so a closed pipe is an error here, not a panic in the generator
    match std::io::stdout().lock().write_all(&script(args.shell)) {
        Ok(()) => Exit::Success,
        // `hcp-dr completion bash | head` is no failure
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Exit::Success,
        Err(err) => {
            eprintln!("error: writing the completion script: {err}");
            Exit::Failed
        }
    }
}
