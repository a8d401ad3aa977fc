//! Process fixtures: real external programs (etcd, an S3 endpoint, a Route53
//! endpoint) started on loopback, logging to a file, killed on drop.

pub mod etcd;
pub mod route53;
pub mod s3;
pub mod s3_faults;
mod s3_front;

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::pki::PkiError;

/// Errors of the process fixtures.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// A required external program is not installed.
    #[error("`{program}` not found on PATH: install it with `{install_hint}`")]
    ProgramNotFound {
        /// The program name.
        program: String,
        /// The command that installs it.
        install_hint: String,
    },
    /// The process could not be started.
    #[error("starting {name}: {source}")]
    Spawn {
        /// The fixture name.
        name: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file or directory operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("creating", "opening log", ...).
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No free TCP port could be bound.
    #[error("finding a free port on {ip}: {source}")]
    NoFreePort {
        /// The address that was tried.
        ip: IpAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// No loopback address had all the requested ports free.
    #[error("no 127.a.b.c address with ports {ports:?} free after {attempts} attempts")]
    NoLoopbackIp {
        /// The ports that had to be free.
        ports: Vec<u16>,
        /// How many addresses were tried.
        attempts: u32,
    },
    /// The process exited while it was expected to run.
    #[error("{name} exited ({status}); last log lines:\n{log_tail}")]
    Exited {
        /// The fixture name.
        name: String,
        /// Its exit status.
        status: String,
        /// The end of its log.
        log_tail: String,
    },
    /// The process did not become ready in time.
    #[error("{name} not ready after {timeout:?}: {last_error}; last log lines:\n{log_tail}")]
    NotReady {
        /// The fixture name.
        name: String,
        /// The time waited.
        timeout: Duration,
        /// The last readiness probe error.
        last_error: String,
        /// The end of its log.
        log_tail: String,
    },
    /// A helper command (etcdctl, ...) failed.
    #[error("`{command}` failed ({status}): {output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stdout and stderr.
        output: String,
    },
    /// The configuration given to a fixture is inconsistent.
    #[error("invalid fixture configuration: {0}")]
    InvalidConfig(String),
    /// A certificate could not be issued or a TLS configuration built.
    #[error("TLS setup: {0}")]
    Pki(#[from] PkiError),
    /// An etcd client call failed.
    #[error("etcd client: {0}")]
    Etcd(#[source] etcd_client::Error),
    /// An S3 request failed.
    #[error("S3 {op}: {message}")]
    S3 {
        /// The S3 operation.
        op: &'static str,
        /// The error, rendered with its causes.
        message: String,
    },
    /// A Route53 request failed.
    #[error("Route53 {op}: {message}")]
    Route53 {
        /// The Route53 operation.
        op: &'static str,
        /// The error, rendered with its causes.
        message: String,
    },
}

/// The default location of the Python venv holding `moto_server`.
pub const DEFAULT_VENV: &str = "/root/.local/share/hcp-dr/venv";

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Locate `name`: on `PATH`, then in `~/.cargo/bin`, then in `$HCP_DR_VENV/bin`
/// and `/root/.local/share/hcp-dr/venv/bin`. The error names `install_hint`.
pub fn find_program(name: &str, install_hint: &str) -> Result<PathBuf, ProcError> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    if let Some(venv) = std::env::var_os("HCP_DR_VENV") {
        dirs.push(PathBuf::from(venv).join("bin"));
    }
    dirs.push(PathBuf::from(DEFAULT_VENV).join("bin"));
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| ProcError::ProgramNotFound {
            program: name.to_string(),
            install_hint: install_hint.to_string(),
        })
}

/// A spawned process in its own process group, stdout and stderr appended to
/// a log file. Dropping it SIGKILLs the whole group; when dropped during a
/// panic it first prints the last 60 log lines to stderr.
#[derive(Debug)]
pub struct ManagedChild {
    name: String,
    log_path: PathBuf,
    pid: u32,
    child: Mutex<Child>,
    killed: bool,
}

impl ManagedChild {
    /// Spawn `cmd` (its stdin is closed, stdout/stderr go to `log_path`, whose
    /// parent directory is created).
    pub fn spawn(mut cmd: Command, name: &str, log_path: &Path) -> Result<Self, ProcError> {
        if let Some(parent) = log_path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| ProcError::Io {
                op: "creating log directory",
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let open_err = |source| ProcError::Io {
            op: "opening log",
            path: log_path.to_path_buf(),
            source,
        };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(open_err)?;
        let log2 = log.try_clone().map_err(open_err)?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .process_group(0);
        let child = spawn_on_reaper_thread(cmd).map_err(|source| ProcError::Spawn {
            name: name.to_string(),
            source,
        })?;
        Ok(ManagedChild {
            name: name.to_string(),
            log_path: log_path.to_path_buf(),
            pid: child.id(),
            child: Mutex::new(child),
            killed: false,
        })
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The fixture name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the log (lossy UTF-8; empty if unreadable).
    pub fn log_tail(&self, lines: usize) -> String {
        tail_file(&self.log_path, lines)
    }

    /// The exit status if the process has exited (reaping it), else `None`.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        child.try_wait().ok().flatten()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// An [`ProcError::Exited`] if the process is gone, with its log tail.
    pub fn check_running(&self) -> Result<(), ProcError> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => Err(ProcError::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                log_tail: self.log_tail(60),
            }),
        }
    }

    /// SIGKILL the process group and reap the process. Idempotent.
    pub fn kill(&mut self) {
        if self.killed {
            return;
        }
        self.killed = true;
        if let Ok(pgid) = libc::pid_t::try_from(self.pid) {
            // SAFETY: kill(2) with a negative pid signals the process group we
            // created at spawn (process_group(0) makes pgid == pid); it has no
            // memory-safety preconditions.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- last 60 log lines of {} (pid {}, {}) -----\n{}\n----- end of {} log -----",
                self.name,
                self.pid,
                self.log_path.display(),
                self.log_tail(60),
                self.name
            );
        }
        self.kill();
    }
}

type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// Spawn `cmd` from one long-lived thread with `PR_SET_PDEATHSIG=SIGKILL`.
///
/// Drop kills children on an orderly exit, but a test binary killed by a
/// signal (nextest timeout, Ctrl-C) runs no destructors. The parent-death
/// signal covers that case. Linux delivers it when the *thread* that forked
/// exits, so all spawns go through a dedicated thread that lives as long as
/// the process (spawning from a short-lived blocking-pool thread would kill
/// the child when that thread retires).
fn spawn_on_reaper_thread(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only calls the
    // async-signal-safe prctl(2), getppid(2) and _exit(2).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let sender = SPAWNER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("hcp-dr-e2e-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in rx {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .expect("spawning the process-spawner thread");
            Mutex::new(tx)
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let (reply_tx, reply_rx) = std::sync::mpsc::channel();
    let gone = || std::io::Error::other("process-spawner thread is gone");
    sender.send((cmd, reply_tx)).map_err(|_| gone())?;
    reply_rx.recv().map_err(|_| gone())?
}

/// The last `lines` lines of a file, reading at most its last 256 KiB.
pub fn tail_file(path: &Path, lines: usize) -> String {
    const MAX: u64 = 256 * 1024;
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX && f.seek(SeekFrom::Start(len - MAX)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A TCP port on `ip` that was free a moment ago (bound to port 0 and released).
pub fn free_port(ip: IpAddr) -> Result<u16, ProcError> {
    Ok(free_ports(ip, 1)?[0])
}

/// `n` distinct free TCP ports on `ip` (all bound at once, then released).
pub fn free_ports(ip: IpAddr, n: usize) -> Result<Vec<u16>, ProcError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind(SocketAddr::new(ip, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ProcError::NoFreePort { ip, source })?;
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(|source| ProcError::NoFreePort { ip, source })
        })
        .collect()
}

fn handed_out() -> &'static Mutex<HashSet<Ipv4Addr>> {
    static SET: OnceLock<Mutex<HashSet<Ipv4Addr>>> = OnceLock::new();
    SET.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A random `127.a.b.c` (a in 1..=250, c in 1..=254; never `127.0.0.x`) on
/// which every port in `ports` can be bound right now and which this process
/// has not handed out before. Used as "pod IPs", so etcd members can listen on
/// their real ports 2379/2380 while parallel tests do not collide.
pub fn alloc_loopback_ip(ports: &[u16]) -> Result<IpAddr, ProcError> {
    const ATTEMPTS: u32 = 200;
    for _ in 0..ATTEMPTS {
        let r = uuid::Uuid::new_v4();
        let b = r.as_bytes();
        let ip = Ipv4Addr::new(127, 1 + b[0] % 250, b[1], 1 + b[2] % 254);
        let mut seen = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&ip) {
            continue;
        }
        let all_free = ports
            .iter()
            .all(|&port| TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), port)).is_ok());
        if all_free {
            seen.insert(ip);
            return Ok(IpAddr::V4(ip));
        }
    }
    Err(ProcError::NoLoopbackIp {
        ports: ports.to_vec(),
        attempts: ATTEMPTS,
    })
}

/// Wait until `addr` accepts TCP connections, failing early if `child` exits.
pub async fn wait_for_tcp(
    child: &ManagedChild,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), ProcError> {
    let deadline = Instant::now() + timeout;
    loop {
        child.check_running()?;
        let last_error = match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => return Ok(()),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(ProcError::NotReady {
                name: child.name().to_string(),
                timeout,
                last_error,
                log_tail: child.log_tail(60),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Render an error with its chain of causes on one line.
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_program_error_names_the_install_step() {
        let err =
            find_program("hcp-dr-no-such-program", "apt-get install nothing").expect_err("absent");
        assert_eq!(
            err.to_string(),
            "`hcp-dr-no-such-program` not found on PATH: install it with `apt-get install nothing`"
        );
        assert!(
            find_program("sh", "apt-get install dash")
                .expect("sh exists")
                .is_absolute()
        );
    }

    #[test]
    fn managed_child_logs_and_dies_with_its_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("logs/child.log");
        let pidfile = dir.path().join("grandchild.pid");
        let mut cmd = Command::new("sh");
        // A grandchild in the same group must die too.
        cmd.arg("-c").arg(format!(
            "echo hello-out; echo hello-err >&2; sleep 600 & echo $! > {}; wait",
            pidfile.display()
        ));
        let mut child = ManagedChild::spawn(cmd, "sleeper", &log).expect("spawn");
        assert!(child.is_running());
        let grandchild: i32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break pid;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while !child.log_tail(10).contains("hello-err") {
            std::thread::sleep(Duration::from_millis(20));
        }
        let tail = child.log_tail(10);
        assert!(tail.contains("hello-out"), "{tail}");
        child.kill();
        assert!(!child.is_running());
        // The grandchild was reparented; once killed it is reaped by init, so
        // poll until kill(pid, 0) reports it gone (bounded so a bug cannot hang the suite).
        let give_up = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(
                Instant::now() < give_up,
                "grandchild {grandchild} survived the group kill"
            );
            // SAFETY: signal 0 only checks for existence.
            let alive = unsafe { libc::kill(grandchild, 0) } == 0;
            let zombie = std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true);
            if !alive || zombie {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(matches!(
            child.check_running(),
            Err(ProcError::Exited { .. })
        ));
    }

    #[test]
    fn loopback_ips_are_distinct_and_bindable() {
        let a = alloc_loopback_ip(&[2379, 2380]).expect("ip");
        let b = alloc_loopback_ip(&[2379, 2380]).expect("ip");
        assert_ne!(a, b);
        for ip in [a, b] {
            let IpAddr::V4(v4) = ip else {
                panic!("not v4: {ip}")
            };
            let o = v4.octets();
            assert_eq!(o[0], 127);
            assert!((1..=250).contains(&o[1]), "{ip}");
            TcpListener::bind(SocketAddr::new(ip, 2379)).expect("bind 2379");
        }
        let ports = free_ports(IpAddr::V4(Ipv4Addr::LOCALHOST), 3).expect("ports");
        assert_eq!(ports.iter().collect::<HashSet<_>>().len(), 3);
    }

    #[test]
    fn tail_returns_last_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f.log");
        std::fs::write(&p, "1\n2\n3\n4\n").expect("write");
        assert_eq!(tail_file(&p, 2), "3\n4");
        assert_eq!(tail_file(&p, 10), "1\n2\n3\n4");
        assert_eq!(tail_file(&dir.path().join("missing"), 3), "");
    }
}
