//! The CLI conveniences (issue 14, item 6), through the built binary: shell
//! completions, manual pages (and docs/man/ kept as generated), `-o yaml`,
//! an example in every command's help, NO_COLOR, and flag names that mean
//! the same thing everywhere. No cluster needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clap::CommandFactory;
use hcp_dr::cli::Cli;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `hcp-dr ARGS` with no store, colour or log settings from the caller's environment.
fn hcp_dr(args: &[&str]) -> Output {
    hcp_dr_env(args, &[])
}

fn hcp_dr_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hcp-dr"));
    cmd.args(args);
    for var in ["HCP_DR_STORE", "HCP_DR_LOG_FORMAT", "HCP_DR_LOG", "NO_COLOR", "CLICOLOR", "CLICOLOR_FORCE"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run hcp-dr")
}

fn stdout_ok(args: &[&str]) -> String {
    let out = hcp_dr(args);
    assert!(
        out.status.success(),
        "hcp-dr {}: exit {:?}\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Every command below the top, as its words (`["etcd", "restore"]`), with
/// its clap definition; clap's own `help` subcommand left out.
fn commands() -> Vec<(Vec<String>, clap::Command)> {
    fn walk(path: &[String], cmd: &clap::Command, out: &mut Vec<(Vec<String>, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut words = path.to_vec();
            words.push(sub.get_name().to_string());
            out.push((words.clone(), sub.clone()));
            walk(&words, sub, out);
        }
    }
    let mut out = Vec::new();
    walk(&[], &Cli::command(), &mut out);
    assert!(out.len() > 20, "only {} commands found: did the walk break?", out.len());
    out
}

#[test]
fn completion_scripts_for_bash_zsh_and_fish_name_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_ok(&["completion", shell]);
        assert!(script.len() > 1000, "{shell}: a {}-byte script", script.len());
        for (words, _) in commands() {
            let name = words.last().unwrap();
            assert!(script.contains(name.as_str()), "the {shell} completion never names `{}`", words.join(" "));
        }
        // flags of a nested command too
        assert!(script.contains("bump-revision"), "the {shell} completion lacks `etcd restore --bump-revision`");
    }
    let refused = hcp_dr(&["completion", "tcsh"]);
    assert_eq!(refused.status.code(), Some(2), "an unknown shell is bad input");
}

/// The page names `man --dir` must write: hcp-dr.1 and one per command.
fn expected_pages() -> Vec<String> {
    let mut names: Vec<String> = commands().into_iter().map(|(words, _)| format!("hcp-dr-{}.1", words.join("-"))).collect();
    names.push("hcp-dr.1".into());
    names.sort();
    names
}

/// The files of `dir` and their bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().to_string(), std::fs::read(e.path()).unwrap())
        })
        .collect()
}

#[test]
fn man_writes_one_page_per_command_and_prints_the_top_one() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("man1");
    stdout_ok(&["man", "--dir", out_dir.to_str().unwrap()]);
    let written = files(&out_dir);
    assert_eq!(written.keys().cloned().collect::<Vec<_>>(), expected_pages());
    for (name, roff) in &written {
        let text = String::from_utf8_lossy(roff);
        let title = name.trim_end_matches(".1");
        assert!(text.contains(&format!(".TH {title} 1 ")), "{name} has no title line for {title}");
        assert!(text.contains(".SH SYNOPSIS"), "{name} has no synopsis");
    }
    let restore = String::from_utf8_lossy(&written["hcp-dr-etcd-restore.1"]).to_string();
    assert!(restore.contains("\\-\\-bump\\-revision"), "hcp-dr-etcd-restore.1 lacks its flags");
    assert!(restore.contains("\\fBhcp\\-dr etcd restore\\fR"), "the synopsis names the whole command:\n{restore}");

    let top = stdout_ok(&["man"]);
    assert_eq!(top.as_bytes(), &written["hcp-dr.1"][..], "`hcp-dr man` prints hcp-dr.1");
}

/// docs/man/ is what `hcp-dr man --dir` writes today: a changed flag or
/// help text without regenerated pages fails here, naming the pages.
#[test]
fn docs_man_is_current() {
    let dir = tempfile::tempdir().unwrap();
    stdout_ok(&["man", "--dir", dir.path().to_str().unwrap()]);
    let generated = files(dir.path());
    let committed = files(&repo().join("docs/man"));
    let mut problems = Vec::new();
    for (name, roff) in &generated {
        match committed.get(name) {
            None => problems.push(format!("docs/man/{name} is missing")),
            Some(old) if old != roff => problems.push(format!("docs/man/{name} is stale")),
            Some(_) => {}
        }
    }
    for name in committed.keys().filter(|n| !generated.contains_key(*n)) {
        problems.push(format!("docs/man/{name} is no command's page any more: `git rm docs/man/{name}`"));
    }
    assert!(
        problems.is_empty(),
        "{}\nregenerate the pages with `cargo run -- man --dir docs/man` and commit them",
        problems.join("\n")
    );
}
