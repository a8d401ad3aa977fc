//! What the benchmarks share: their `--flag value` arguments, and running a
//! command to completion with its own wall time and peak RSS.

#![allow(dead_code)]

pub mod tools;

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

/// `--fill`: what a benchmark fills etcd with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Kubernetes-shaped objects as the hosted API server stores them
    /// (`hcp_dr_e2e::fill`, about 4.5x compressible, with random key
    /// material): the default.
    Kubernetes,
    /// 1 MiB values of patterned bytes, the fill of the runs before
    /// 2026-11-29: they compress about 100x, so they flatter a compressed
    /// backup.
    Patterned,
}

impl Fill {
    /// From `--fill kubernetes|patterned` (default kubernetes); anything
    /// else is refused (exit 2).
    pub fn from_args() -> Fill {
        match arg("--fill", "kubernetes".to_string()).as_str() {
            "kubernetes" => Fill::Kubernetes,
            "patterned" => Fill::Patterned,
            other => {
                eprintln!("error: --fill {other}: use kubernetes (objects as a hosted cluster holds them) or patterned (1 MiB values)");
                std::process::exit(2);
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fill::Kubernetes => "kubernetes",
            Fill::Patterned => "patterned",
        }
    }

    /// Fill through `client`: Kubernetes objects until the database holds
    /// `mib` MiB, or `mib` patterned values of 1 MiB under `prefix`.
    pub async fn write(self, client: &mut etcd_client::Client, mib: u64, prefix: &str) {
        if self == Fill::Kubernetes {
            let (filled, db) = hcp_dr_e2e::fill::kubernetes_objects_in_etcd(client, "shop", 0, mib << 20, 16).await.expect("fill");
            println!("fill: {} apps, {} objects, {} MiB of JSON; database {} MiB", filled.apps, filled.objects, filled.bytes >> 20, db >> 20);
            return;
        }
        let mut value = vec![0u8; 1 << 20];
        for i in 0..mib {
            for (j, b) in value.iter_mut().enumerate() {
                *b = ((j as u64).wrapping_mul(2654435761).wrapping_add(i * 97) >> 13) as u8;
            }
            client.put(format!("{prefix}{i:06}"), value.clone(), None).await.expect("put");
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

/// A finished command: its wall time, its own peak RSS (KiB, its VmHWM),
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

/// The peak RSS (VmHWM, KiB) of process `pid` so far; None once it exited.
fn vm_hwm_kib(pid: libc::pid_t) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Run `cmd` to completion with its own peak RSS. That is not the
/// `ru_maxrss` of wait4: a child started with vfork (as `Command` does)
/// execs from its parent's address space, and Linux counts the parent's
/// peak into the child's `ru_maxrss` at exec (the benchmark process, which
/// holds the sandbox, grows with the fleet). The child's own VmHWM is read
/// every 10 ms until it exits (it only rises, so what is missed is the
/// growth of its last 10 ms), then it is reaped. Its output is drained on
/// threads, so a full pipe never blocks it.
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
    let exited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let exited = exited.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !exited.load(std::sync::atomic::Ordering::Acquire) {
                if let Some(hwm) = vm_hwm_kib(pid) {
                    peak = peak.max(hwm);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    // SAFETY: FFI with pointers to locals. waitid with WNOWAIT waits for
    // the exit but leaves the child unreaped, so its pid cannot be reused
    // while the sampler still reads /proc/<pid>; wait4 then reaps it (here,
    // not by `Child`, which is forgotten below so it never waits on the pid).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
    assert_eq!(waited, 0, "waitid: {}", std::io::Error::last_os_error());
    let wall = start.elapsed();
    exited.store(true, std::sync::atomic::Ordering::Release);
    let rss_kib = sampler.join().expect("RSS sampler");
    let mut status = 0;
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, std::ptr::null_mut()) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    Ran {
        what,
        wall,
        rss_kib,
        status: ExitStatus::from_raw(status),
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}
