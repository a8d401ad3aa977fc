//! `hcp-dr man [--dir DIR]`: manual pages (roff), generated from the same
//! clap definitions the commands parse with: one page per command and
//! subcommand, `hcp-dr.1`, `hcp-dr-backup.1`, `hcp-dr-etcd-restore.1`, …
//! docs/man/ holds them as generated; tests/suite/cli_conveniences.rs fails when
//! they are stale.

use std::io::Write;
use std::path::PathBuf;

use clap::CommandFactory;

use super::Exit;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write every page (hcp-dr.1, hcp-dr-backup.1, hcp-dr-etcd-restore.1,
    /// …) into this directory, created if missing, instead of printing
    /// hcp-dr.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Every page as `(file name, roff)`, the top command's first, then each
/// command before its subcommands.
pub fn pages() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    fn walk(cmd: &clap::Command, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
        let man = clap_mangen::Man::new(cmd.clone())
            .source(concat!("hcp-dr ", env!("CARGO_PKG_VERSION")))
            .manual("hcp-dr manual");
        let mut roff = Vec::new();
        man.render(&mut roff)?;
        out.push((man.get_filename(), roff));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, out)?;
        }
        Ok(())
    }
    // built once from the top, so each subcommand's page is named and
    // synopsised by its whole path (hcp-dr-etcd-restore, `hcp-dr etcd restore`)
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, &mut out)?;
    Ok(out)
}

pub fn exec(args: Args) -> Exit {
    let written = pages().and_then(|pages| match &args.dir {
        None => std::io::stdout().lock().write_all(&pages[0].1),
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            for (name, roff) in &pages {
                std::fs::write(dir.join(name), roff)?;
            }
            println!("wrote {} manual pages to {}", pages.len(), dir.display());
            Ok(())
        }
    });
    match written {
        Ok(()) => Exit::Success,
        // `hcp-dr man | head` is no failure
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Exit::Success,
        Err(err) => {
            let to = args.dir.map(|d| format!(" to {}", d.display())).unwrap_or_default();
            eprintln!("error: writing the manual pages{to}: {err}");
            Exit::Failed
        }
    }
}
