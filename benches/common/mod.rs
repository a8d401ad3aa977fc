//! What the benchmarks share: their `--flag value` arguments, and running a
//! command to completion with its own wall time and peak RSS.

#![allow(dead_code)]

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The value after `name` on the command line, or `default` when the flag
/// is absent; a flag without a value that parses is refused (exit 2).
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == name) else {
        return default;
    };
    match args.get(i + 1).map(|v| v.parse()) {
        Some(Ok(value)) => value,
        _ => {
            eprintln!("error: {name} needs a value of type {} (got {:?})", std::any::type_name::<T>(), args.get(i + 1));
            std::process::exit(2);
        }
    }
}

/// Refuse (exit 2) before filling anything when `dir`'s file system has
/// less than `needed` bytes free for `what`; `hint` says how to get past it.
pub fn ensure_room(dir: &std::path::Path, needed: u64, what: &str, hint: &str) {
    if let Err(refused) = hcp_dr::space::ensure(dir, needed, what, hint) {
        eprintln!("error: {refused}");
        std::process::exit(2);
    }
}

/// A finished command: its wall time, its own peak RSS (KiB, from wait4),
/// how it exited and what it printed.
pub struct Ran {
    pub what: String,
    pub wall: Duration,
    pub rss_kib: i64,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Ran {
    /// Panic with its stderr and stdout unless it succeeded.
    pub fn ok(self) -> Ran {
        let out = String::from_utf8_lossy(&self.stdout);
        assert!(
            self.status.success(),
            "{} failed ({}):\n{}\nstdout: {}",
            self.what,
            self.status,
            String::from_utf8_lossy(&self.stderr),
            &out[..out.len().min(4000)]
        );
        self
    }
}

/// Run `cmd` to completion and reap it with wait4 for its own peak RSS
/// (`Child::wait` does not give it). Its output is drained on threads, so a
/// full pipe never blocks it.
pub fn run(mut cmd: Command) -> Ran {
    // the program and its arguments, never its environment (it may hold credentials)
    let what = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let start = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("{what}: {e}"));
    let pid = child.id() as libc::pid_t;
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            pipe.read_to_end(&mut buf).ok();
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let mut status = 0;
    // SAFETY: FFI with pointers to locals; the child is reaped here, not by
    // `Child`, which is forgotten below so that it never waits on the pid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    Ran {
        what,
        wall,
        rss_kib: usage.ru_maxrss,
        status: ExitStatus::from_raw(status),
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}
