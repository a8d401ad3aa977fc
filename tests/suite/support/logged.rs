//! A child process whose log (stderr) is read line by line as it comes,
//! every line kept in order, and whose report is its stdout (`hcp-dr
//! stream` run by `stream.rs`, `stream_k8s.rs`, `point_in_time.rs`).

use std::io::{BufRead, Read};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The lines of `stderr` as they come, read by a thread of their own.
pub fn lines_of(stderr: ChildStderr) -> Receiver<String> {
    let stderr = std::io::BufReader::new(stderr);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

pub struct Logged {
    /// Named in failures.
    pub name: String,
    child: Child,
    lines: Receiver<String>,
    /// The lines read so far.
    pub log: Vec<String>,
}

impl Logged {
    /// Spawn `command`, its stdout and stderr piped.
    pub fn spawn(name: &str, mut command: Command) -> Logged {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        let lines = lines_of(child.stderr.take().unwrap());
        Logged { name: name.to_string(), child, lines, log: Vec::new() }
    }

    /// Wait (at most `within`) until a log line after the first `from`
    /// contains `needle`; its index.
    pub fn wait_after(&mut self, from: usize, needle: &str, within: Duration) -> usize {
        if let Some(at) = self.log.iter().skip(from).position(|l| l.contains(needle)) {
            return from + at;
        }
        let start = Instant::now();
        while start.elapsed() < within {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.log.push(line);
                    if hit {
                        return self.log.len() - 1;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!("{}: no log line with `{needle}` within {within:?}:\n{}", self.name, self.log.join("\n"));
    }

    /// SIGTERM; the exit status, the JSON report and the whole log.
    pub fn term(mut self) -> (ExitStatus, serde_json::Value, Vec<String>) {
        assert!(Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap().success());
        let mut stdout = String::new();
        self.child.stdout.as_mut().unwrap().read_to_string(&mut stdout).unwrap();
        let status = self.child.wait().unwrap();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.log.push(line);
        }
        let report = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{}: no JSON report ({e}): {stdout}\n--- log\n{}", self.name, self.log.join("\n")));
        (status, report, self.log)
    }

    /// SIGKILL, and wait for it.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}
