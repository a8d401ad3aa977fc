//! The CLI conveniences (issue 14, item 6), through the built binary: shell
//! completions, manual pages (and docs/man/ kept as generated), `-o yaml`,
//! an example in every command's help, NO_COLOR, and flag names that mean
//! the same thing everywhere. No cluster needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clap::{CommandFactory, Parser};
use hcp_dr::cli::Cli;

use crate::support::shell;
use shell::shell_words;

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
/// its clap definition; clap's own `help` subcommand and the hidden ones
/// people do not run (`volume-mover`, run by hcp-dr in a pod) left out.
fn commands() -> Vec<(Vec<String>, clap::Command)> {
    fn walk(path: &[String], cmd: &clap::Command, out: &mut Vec<(Vec<String>, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help" && !s.is_hide_set()) {
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

/// `-o yaml` prints the document `-o json` prints: the same value, parsed.
#[test]
fn yaml_output_is_the_json_report_as_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    // not a snapshot: a report all the same (exit 1), the same every time
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![b'x'; 70_000]).unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["playbook", "show", "backup"],
        vec!["playbook", "show", "etcd-restore"],
        vec!["playbook", "show", "migrate"],
        vec!["schedule", "render", "--schedule", "0 */6 * * *", "--to", "s3://bucket/prefix", "--keep-daily", "7", "--hosted-cluster", "demo"],
        vec!["backups", "list", "--store", store.to_str().unwrap()],
        vec!["snapshot", "verify", junk.to_str().unwrap()],
    ];
    for args in cases {
        let run = |format: &str| {
            let mut with = args.clone();
            with.extend(["-o", format]);
            let out = hcp_dr(&with);
            assert!(matches!(out.status.code(), Some(0 | 1)), "hcp-dr {}: {}", with.join(" "), String::from_utf8_lossy(&out.stderr));
            (out.status.code(), String::from_utf8(out.stdout).unwrap())
        };
        let (json_code, json) = run("json");
        let (yaml_code, yaml) = run("yaml");
        let what = args.join(" ");
        assert_eq!(json_code, yaml_code, "{what}: the format changed the exit code");
        let from_json: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{what} -o json: {e}\n{json}"));
        let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{what} -o yaml: {e}\n{yaml}"));
        assert_eq!(from_yaml, from_json, "{what}: -o yaml and -o json differ\n--- yaml\n{yaml}\n--- json\n{json}");
        if from_json != serde_json::json!([]) {
            assert!(!yaml.trim_start().starts_with(['{', '[']), "{what} -o yaml printed JSON:\n{yaml}");
        }
    }
}

/// Every command that runs (no subcommands of its own) shows an example in
/// its `--help`, and the example is of that command and parses: its flags
/// exist and its values are accepted.
#[test]
fn every_command_help_has_an_example_that_parses() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (words, mut cmd) in commands().into_iter().filter(|(_, c)| !c.has_subcommands()) {
        let path = format!("hcp-dr {}", words.join(" "));
        let help = cmd.render_long_help().to_string();
        let Some((_, after)) = help.split_once("Example:") else {
            problems.push(format!("`{path} --help` shows no Example:"));
            continue;
        };
        let examples: Vec<&str> = after.lines().map(str::trim).filter(|l| l.starts_with("hcp-dr ")).collect();
        if examples.is_empty() {
            problems.push(format!("`{path} --help`: no `hcp-dr …` line after Example:"));
        }
        for example in examples {
            // what the shell does with the rest: a pipe, a redirection, a comment
            let command = [" | ", " > ", " #"].iter().fold(example, |line, cut| line.split(cut).next().unwrap());
            let args = shell_words(command);
            if !command.starts_with(&format!("{path} ")) {
                problems.push(format!("`{path} --help`: the example `{example}` is of another command"));
            } else if let Err(err) = Cli::try_parse_from(&args) {
                problems.push(format!("`{path} --help`: the example `{example}` does not parse:\n{err}"));
            }
            checked += 1;
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 20, "only {checked} examples");
    // and the binary shows them
    let help = stdout_ok(&["etcd", "restore", "--help"]);
    assert!(help.contains("Example:\n  hcp-dr etcd restore "), "{help}");
}

const ESC: char = '\u{1b}';

/// `hcp-dr ARGS` in a pseudo-terminal (util-linux `script`), where clap
/// colours its help and tracing its log lines unless told not to; stdout and
/// stderr together. None without `script`.
fn in_terminal(args: &[&str], env: &[(&str, &str)]) -> Option<String> {
    let quote = |w: &str| format!("'{}'", w.replace('\'', "'\\''"));
    let line = std::iter::once(env!("CARGO_BIN_EXE_hcp-dr")).chain(args.iter().copied()).map(quote).collect::<Vec<_>>().join(" ");
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"]);
    for var in ["HCP_DR_STORE", "HCP_DR_LOG_FORMAT", "HCP_DR_LOG", "NO_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "AWS_PROFILE", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        cmd.env_remove(var);
    }
    // no AWS configuration, and an instance metadata endpoint that refuses at once:
    // the SDK logs a WARN per attempt without waiting on the network
    cmd.env("HOME", home.path()).env("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9").env("TERM", "xterm-256color");
    cmd.envs(env.iter().copied());
    let out = cmd.output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).to_string())
}

/// NO_COLOR (and --no-color) leave no escape sequence in help, errors or
/// log lines, on a terminal and when colour is forced.
#[test]
fn no_color_means_no_escape_sequences() {
    let help = ["backup", "--help"];
    let bad_flag = ["backup", "--no-such-flag"];
    // logs a WARN from the AWS SDK, then fails to reach the store
    let logs = ["backups", "list", "--store", "s3://bucket/prefix", "--s3-endpoint", "http://127.0.0.1:9"];

    // forced colour, no terminal: clap colours unless NO_COLOR says otherwise
    let forced = hcp_dr_env(&help, &[("CLICOLOR_FORCE", "1")]);
    assert!(String::from_utf8_lossy(&forced.stdout).contains(ESC), "CLICOLOR_FORCE=1 gave no colour: the check below would prove nothing");
    for (args, env) in [(&help[..], &[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")][..]), (&bad_flag[..], &[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")][..])] {
        let out = hcp_dr_env(args, env);
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!all.contains(ESC), "hcp-dr {} with NO_COLOR=1: {all:?}", args.join(" "));
    }

    let Some(coloured) = in_terminal(&help, &[]) else {
        println!("SKIP: no `script` (util-linux) to run hcp-dr in a terminal");
        return;
    };
    assert!(coloured.contains(ESC), "--help on a terminal has no colour: the checks below would prove nothing\n{coloured:?}");
    let coloured_logs = in_terminal(&logs, &[]).unwrap();
    assert!(coloured_logs.contains("WARN") && coloured_logs.contains(ESC), "no coloured WARN on a terminal: {coloured_logs:?}");
    for (how, env, flag) in [("NO_COLOR=1", &[("NO_COLOR", "1")][..], None), ("--no-color", &[][..], Some("--no-color"))] {
        for args in [&help[..], &bad_flag[..], &logs[..]] {
            let mut args = args.to_vec();
            args.extend(flag);
            let out = in_terminal(&args, env).unwrap();
            assert!(!out.contains(ESC), "hcp-dr {} on a terminal with {how}: {out:?}", args.join(" "));
            if args[0] == "backups" {
                assert!(out.contains("WARN") && out.contains("error: S3"), "hcp-dr {}: {out:?}", args.join(" "));
            }
        }
    }
}

/// A stage's description on the progress line: one line, cut with `…` to
/// what the terminal has left after the spinner, the name and the time.
#[test]
fn stage_descriptions_fit_the_terminal_width() {
    use hcp_dr::cli::progress::fit;
    let long = "scale the etcd writers to zero and wait until their pods are gone (API downtime starts)";
    let width = |s: &str| s.chars().count();
    // 2 + 14 + 1 + 4 + 1 = 22 columns before the description
    let cut = fit("scale-down", long, Some(60));
    assert_eq!(width(&cut), 60 - 22, "{cut:?}");
    assert!(cut.ends_with('…') && long.starts_with(cut.trim_end_matches('…')), "{cut:?}");
    // a name longer than the column takes its own width
    assert_eq!(width(&fit("restore-members-and-more", long, Some(60))), 60 - 2 - 24 - 6);
    assert_eq!(fit("lock", "take a Lease", Some(60)), "take a Lease");
    assert_eq!(fit("lock", long, None), long, "no width known: wide_msg still cuts at draw time");
    assert_eq!(fit("lock", "first line\nsecond line", Some(200)), "first line …");
    assert_eq!(fit("lock", long, Some(10)), "", "no room: nothing rather than a wrapped line");
}

/// The commands that name their hosted cluster with a positional NAME
/// rather than --hosted-cluster. Renaming them would break the runbooks
/// and every script that calls them; a new command takes --hosted-cluster.
const POSITIONAL_NAME: [&str; 5] = ["cluster pause", "cluster resume", "cluster scale", "cluster oidc", "cluster destroy"];

/// The same thing has the same flag everywhere: -n is --namespace (or, in
/// `schedule render`, whose --namespace is the CronJob's, --cluster-namespace),
/// a kubeconfig comes with its context, a hosted cluster is --hosted-cluster
/// or a positional NAME but never both, and each of them says what it is.
#[test]
fn flag_names_are_consistent_across_commands() {
    let mut problems = Vec::new();
    for (words, cmd) in leaves_of_tree() {
        let path = words.join(" ");
        let args: Vec<&clap::Arg> = cmd.get_arguments().collect();
        let long = |name: &str| args.iter().find(|a| a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|al| al.contains(&name)));
        for arg in &args {
            let (id, l, short) = (arg.get_id().as_str(), arg.get_long(), arg.get_short());
            if l == Some("namespace") && short != Some('n') && long("cluster-namespace").is_none() {
                problems.push(format!("{path}: --namespace has no -n"));
            }
            if short == Some('n') && !matches!(l, Some("namespace" | "cluster-namespace")) {
                problems.push(format!("{path}: -n is --{}", l.unwrap_or(id)));
            }
            let named = matches!(l, Some("kubeconfig" | "context" | "namespace" | "cluster-namespace" | "hosted-cluster")) || (arg.is_positional() && id == "name");
            if named && arg.get_help().is_none() && arg.get_long_help().is_none() {
                problems.push(format!("{path}: {} says nothing about itself in --help", l.map(|l| format!("--{l}")).unwrap_or_else(|| id.to_uppercase())));
            }
        }
        for (config, context) in [("kubeconfig", "context"), ("from-kubeconfig", "from-context"), ("to-kubeconfig", "to-context")] {
            if long(config).is_some() && long(context).is_none() {
                problems.push(format!("{path}: --{config} without --{context}"));
            }
        }
        // (playbook show's NAME is an operation's, not a cluster's)
        let positional_name = path != "playbook show" && args.iter().any(|a| a.is_positional() && a.get_id() == "name");
        if positional_name && long("hosted-cluster").is_some() {
            problems.push(format!("{path}: both a NAME and --hosted-cluster"));
        }
        if positional_name != POSITIONAL_NAME.contains(&path.as_str()) {
            problems.push(format!("{path}: a positional NAME {}", if positional_name { "where --hosted-cluster is the rule" } else { "expected (POSITIONAL_NAME)" }));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // cluster create's --name answers to --hosted-cluster as well
    assert!(Cli::try_parse_from(["hcp-dr", "cluster", "create", "--hosted-cluster", "demo", "--release-image", "img", "--pull-secret", "ps.json"]).is_ok());
}

/// The runnable commands of the built tree (global flags propagated).
fn leaves_of_tree() -> Vec<(Vec<String>, clap::Command)> {
    fn walk(path: &[String], cmd: &clap::Command, out: &mut Vec<(Vec<String>, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut words = path.to_vec();
            words.push(sub.get_name().to_string());
            if sub.has_subcommands() {
                walk(&words, sub, out);
            } else {
                out.push((words, sub.clone()));
            }
        }
    }
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    walk(&[], &cmd, &mut out);
    out
}
