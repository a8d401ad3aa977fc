//! `hcp-dr volume-mover`: the data mover hcp-dr runs in a pod that mounts
//! one guest volume (see `volume::mover`). Not for people: a backup or
//! restore starts it as a Job and talks to it.

use std::path::PathBuf;
use std::time::Duration;

use super::Exit;
use crate::duration;
use crate::volume::{self, mover};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The volume's mount path.
    #[arg(long)]
    pub dir: PathBuf,
    /// The port to serve on (on $HCP_DR_MOVER_BIND, default every address).
    #[arg(long, default_value_t = volume::MOVER_PORT)]
    pub port: u16,
    /// Exit 1 after this long without a request [range: 1m to 1d].
    #[arg(long, default_value = "1h", value_parser = duration::MOVER_IDLE)]
    pub idle_timeout: Duration,
}

pub async fn exec(args: Args) -> Exit {
    let Ok(token) = std::env::var(volume::TOKEN_ENV) else {
        eprintln!("error: ${} is not set: the mover needs the token hcp-dr gave its pod", volume::TOKEN_ENV);
        return Exit::Usage;
    };
    let bind = std::env::var(volume::BIND_ENV).ok().filter(|b| !b.is_empty()).unwrap_or_else(|| "0.0.0.0".into());
    let cfg = mover::MoverConfig { dir: args.dir, bind, port: args.port, token, idle_timeout: args.idle_timeout };
    match mover::serve(cfg).await {
        Ok(()) => Exit::Success,
        Err(mover::MoverError::Setup(message)) => {
            eprintln!("error: {message}");
            Exit::Usage
        }
        Err(err) => {
            eprintln!("error: {err}");
            Exit::Failed
        }
    }
}
