//! The runbooks are true: each runbook's *Rehearse it on the sandbox* block
//! (marked `<!-- rehearsal -->`) runs as written on a sandbox, after the
//! set-up block of docs/sandbox.md, in bash with `set -euo pipefail`, the
//! sandbox's env file sourced and `KUBECONFIG` unset. And every `hcp-dr`
//! command line of the runbooks' and the README's `sh` blocks parses: its
//! subcommand and flags exist and its values are accepted.

use std::path::{Path, PathBuf};
use std::process::Command;

use hcp_dr_e2e::sandbox::Sandbox;

use crate::support;
use support::shell::shell_words;

const SETUP: &str = "<!-- rehearsal: set-up -->";
const REHEARSAL: &str = "<!-- rehearsal -->";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `sh` blocks that directly follow `marker` in `file`.
fn marked_blocks(file: &Path, marker: &str) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != marker {
            continue;
        }
        assert_eq!(lines.get(i + 1).map(|l| l.trim()), Some("```sh"), "{}: {marker} must precede a ```sh block", file.display());
        let body: Vec<&str> = lines[i + 2..].iter().take_while(|l| l.trim() != "```").copied().collect();
        out.push(body.join("\n"));
    }
    out
}

fn rehearsal(name: &str) -> String {
    let file = repo().join("docs/runbooks").join(name);
    let blocks = marked_blocks(&file, REHEARSAL);
    assert_eq!(blocks.len(), 1, "{}: one rehearsal block expected", file.display());
    blocks[0].clone()
}

/// Run `script` as a runbook reader would, in `work`; panics with the
/// output when a command fails.
fn rehearse(sandbox: &Sandbox, work: &Path, what: &str, script: &str) {
    let out = support::sourced_shell(sandbox, work, &format!("set -x\n{script}")).output().expect("bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what}: the rehearsal failed (exit {:?})\n--- script\n{script}\n--- stdout\n{}\n--- stderr (each command after `+ `)\n{stderr}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
    );
    println!("{what}: rehearsed ({} commands)", stderr.lines().filter(|l| l.starts_with("+ ")).count());
}

/// A rehearsal line the test acts on instead of the shell:
/// `# [sandbox] lose mgmt-a` stops that management cluster entirely
/// ([`Sandbox::lose`]), as if its machine died; `# [sandbox] revive
/// mgmt-a` brings it back with its old state ([`Sandbox::revive`]).
const SANDBOX_STEP: &str = "# [sandbox] ";

/// Run a runbook's rehearsal, doing its sandbox steps between the parts.
async fn rehearse_runbook(sandbox: &mut Sandbox, work: &Path, name: &str, script: &str) {
    let mut part = String::new();
    for line in script.lines() {
        let Some(step) = line.strip_prefix(SANDBOX_STEP) else {
            part.push_str(line);
            part.push('\n');
            continue;
        };
        if !part.trim().is_empty() {
            rehearse(sandbox, work, name, &part);
        }
        part.clear();
        match step.split_whitespace().collect::<Vec<_>>()[..] {
            ["lose", cluster] => sandbox.lose(cluster).await.unwrap_or_else(|e| panic!("{name}: losing {cluster}: {e}")),
            ["revive", cluster] => sandbox.revive(cluster).await.unwrap_or_else(|e| panic!("{name}: reviving {cluster}: {e}")),
            _ => panic!("{name}: unknown sandbox step `{step}`"),
        }
    }
    if !part.trim().is_empty() {
        rehearse(sandbox, work, name, &part);
    }
}

async fn rehearse_in_order(runbooks: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sandbox = Sandbox::up(&dir.path().join("sandbox")).await.expect("sandbox up");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let setup = marked_blocks(&repo().join("docs/sandbox.md"), SETUP);
    assert_eq!(setup.len(), 1, "docs/sandbox.md: one set-up block expected");
    rehearse(&sandbox, &work, "docs/sandbox.md set-up", &setup[0]);
    for name in runbooks {
        rehearse_runbook(&mut sandbox, &work, name, &rehearsal(name)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbooks_backup_to_restore_rehearse_as_written() {
    rehearse_in_order(&[
        "backup.md",
        "snapshot-verify.md",
        "etcd-recover.md",
        "etcd-restore.md",
        "drill.md",
        "cluster-create.md",
        "restore.md",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_migrate_rehearses_as_written() {
    rehearse_in_order(&["migrate.md"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_disaster_rehearses_as_written() {
    rehearse_in_order(&["disaster.md"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_stream_rehearses_as_written() {
    rehearse_in_order(&["stream.md"]).await;
}

#[test]
fn every_runbook_has_a_rehearsal_that_a_test_runs() {
    let tested = std::fs::read_to_string(repo().join("tests/suite/runbooks.rs")).unwrap();
    for entry in std::fs::read_dir(repo().join("docs/runbooks")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".md") {
            rehearsal(&name);
            assert!(tested.contains(&format!("\"{name}\"")), "docs/runbooks/{name} has no rehearsal run by a test here");
        }
    }
}

/// One documented command line as arguments: comments, pipes and
/// redirections cut, `[optional]` kept, `a|b` alternatives reduced to the
/// first, `$(…)` and placeholders (`...`) made plain words.
fn documented_args(line: &str) -> Vec<String> {
    let mut line = line.to_string();
    while let Some(start) = line.find("$(") {
        let end = line[start..].find(')').map_or(line.len(), |e| start + e + 1);
        line.replace_range(start..end, "X");
    }
    for cut in [" #", " | ", " > ", " && ", " 2>"] {
        if let Some(at) = line.find(cut) {
            // a ` | ` inside [...] separates alternatives: keep the first
            let open = line[..at].matches('[').count() > line[..at].matches(']').count();
            if cut == " | " && open {
                let close = line[at..].find(']').map_or(line.len(), |c| at + c);
                line.replace_range(at..close, "");
                continue;
            }
            line.truncate(at);
        }
    }
    let mut args = Vec::new();
    for word in shell_words(&line) {
        let word = word.trim_matches(|c| c == '[' || c == ']');
        let word = word.split('|').next().unwrap_or_default().to_string();
        if word.is_empty() {
            continue;
        }
        if word == "..." {
            // a value left out: keep the flag's value, drop a bare ellipsis
            if args.last().is_some_and(|a: &String| a.starts_with('-')) {
                args.push("X".into());
            }
            continue;
        }
        args.push(word);
    }
    args
}

/// Every `hcp-dr …` line of the `sh` blocks of `file`, continuations joined
/// and `a; b` split.
fn documented_commands(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_sh = trimmed == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        if !pending.is_empty() || trimmed.starts_with("hcp-dr ") {
            pending.push_str(trimmed.trim_end_matches('\\'));
            pending.push(' ');
            if !trimmed.ends_with('\\') {
                let joined = std::mem::take(&mut pending);
                out.extend(joined.split("; ").filter(|c| c.trim_start().starts_with("hcp-dr ")).map(str::to_string));
            }
        }
    }
    out
}

#[test]
fn every_documented_hcp_dr_command_line_parses() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("docs/runbooks")).unwrap().map(|e| e.unwrap().path()).collect();
    files.push(repo().join("README.md"));
    files.push(repo().join("docs/sandbox.md"));
    files.sort();
    let mut checked = 0;
    let mut problems = Vec::new();
    for file in &files {
        for line in documented_commands(file) {
            let args = documented_args(&line);
            let out = Command::new(env!("CARGO_BIN_EXE_hcp-dr"))
                .args(&args[1..])
                .arg("--help")
                .env_remove("HCP_DR_STORE")
                .output()
                .expect("hcp-dr");
            checked += 1;
            if !out.status.success() {
                problems.push(format!(
                    "{}: `{}`\n  parsed as {:?}\n  {}",
                    file.strip_prefix(repo()).unwrap().display(),
                    line.trim(),
                    &args[1..],
                    String::from_utf8_lossy(&out.stderr).lines().take(3).collect::<Vec<_>>().join("\n  ")
                ));
            }
        }
    }
    assert!(checked > 40, "only {checked} documented command lines found");
    assert!(problems.is_empty(), "documented commands hcp-dr does not accept:\n{}", problems.join("\n"));
    println!("{checked} documented hcp-dr command lines parse");
}

#[test]
fn documented_args_reads_the_conventions() {
    assert_eq!(
        documented_args("hcp-dr cluster pause demo [-n clusters] [--for 1h | --until 2026-11-21T18:00:00Z]  # note"),
        ["hcp-dr", "cluster", "pause", "demo", "-n", "clusters", "--for", "1h"]
    );
    assert_eq!(
        documented_args("hcp-dr drill --from \"$X/latest\" --report drills/demo-$(date +%F) ... | tee x"),
        ["hcp-dr", "drill", "--from", "$X/latest", "--report", "drills/demo-X"]
    );
    assert_eq!(documented_args("hcp-dr etcd status [--etcd-access auto|pod-ip] --from ..."), ["hcp-dr", "etcd", "status", "--etcd-access", "auto", "--from", "X"]);
    assert_eq!(documented_args("hcp-dr schedule render --schedule \"0 */6 * * *\" --to ''"), ["hcp-dr", "schedule", "render", "--schedule", "0 */6 * * *", "--to"]);
}
