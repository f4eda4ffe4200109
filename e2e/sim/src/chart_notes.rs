//! The chart's NOTES (what `helm install` prints) read back from an installed release, and
//! every command they show run as a user pastes it: in bash, against the sim cluster, with the
//! sim's kubectl. A command that hangs (a heredoc that never closes) or fails, or says
//! nothing at all, fails the check. The README's `kubectl` commands are run the same way
//! ([`readme_commands`]).

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::chart_install::{NAMESPACE, RELEASE};
use crate::cluster::Cluster;

/// How long one shown command may take (a port-forward and a scrape included).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// One command as the NOTES show it: its lines (a heredoc's body and end included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShownCommand(pub String);

/// The commands in `notes`: each line indented by two blanks that starts with `kubectl `, and
/// for one that opens a heredoc (`<<'END'`), the lines after it up to the one that closes it
/// (`END`, as bash reads it: alone on its line). A heredoc the NOTES never close is an error.
pub fn shown_commands(notes: &str) -> anyhow::Result<Vec<ShownCommand>> {
    commands(notes.lines(), |line| {
        line.strip_prefix("  ")
            .filter(|l| l.starts_with("kubectl "))
    })
}

/// The `kubectl` commands of `markdown`'s `sh` code blocks (a line that starts with `kubectl `,
/// and a heredoc's lines up to the one that closes it), as a reader of the README pastes them.
pub fn readme_commands(markdown: &str) -> anyhow::Result<Vec<ShownCommand>> {
    let mut in_sh = false;
    let mut block = Vec::new();
    for line in markdown.lines() {
        if let Some(fence) = line.strip_prefix("```") {
            in_sh = !in_sh && fence.trim() == "sh";
            continue;
        }
        if in_sh {
            block.push(line);
        }
    }
    commands(block.into_iter(), |line| {
        line.starts_with("kubectl ").then_some(line)
    })
}

/// The commands among `lines` that `command` recognises (and strips), each with its heredoc.
fn commands<'a>(
    mut lines: impl Iterator<Item = &'a str>,
    command: impl Fn(&'a str) -> Option<&'a str>,
) -> anyhow::Result<Vec<ShownCommand>> {
    let mut found = Vec::new();
    while let Some(line) = lines.next() {
        let Some(command) = command(line) else {
            continue;
        };
        let mut text = command.to_string();
        if let Some(end) = heredoc_end(command) {
            let mut closed = false;
            for body in lines.by_ref() {
                text.push('\n');
                text.push_str(body);
                if body == end {
                    closed = true;
                    break;
                }
            }
            ensure!(
                closed,
                "the heredoc of {command:?} is never closed: no line {end:?} alone follows it"
            );
        }
        found.push(ShownCommand(text));
    }
    Ok(found)
}

/// The word that ends the heredoc `command` opens (`<<'YAML'`, `<<YAML`, `<<"YAML"`), if any.
fn heredoc_end(command: &str) -> Option<String> {
    let (_, after) = command.split_once("<<")?;
    let word = after.trim_start_matches('-').split_whitespace().next()?;
    Some(word.trim_matches(|c| c == '\'' || c == '"').to_string())
}

/// `helm get notes` of the sim's release.
pub fn release_notes(cluster: &Cluster, helm: &Path) -> anyhow::Result<String> {
    let out = Command::new(helm)
        .args(["get", "notes", RELEASE, "-n", NAMESPACE, "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .output()
        .context("running helm get notes")?;
    ensure!(
        out.status.success(),
        "helm get notes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What a shown command did.
#[derive(Debug)]
pub struct Ran {
    pub command: String,
    pub stdout: String,
    pub took: Duration,
}

/// Runs `command` in bash from `dir` against the sim cluster (its kubeconfig, its kubectl
/// first on the PATH). `apply_dry_run`: a `kubectl apply -f -` runs as a server-side dry run,
/// so that an example policy the NOTES show is checked by the API server without being
/// created among the test's own.
pub fn run_shown(
    cluster: &Cluster,
    dir: &Path,
    command: &ShownCommand,
    apply_dry_run: bool,
) -> anyhow::Result<Ran> {
    let mut text = command.0.clone();
    if apply_dry_run {
        text = text.replacen(
            "kubectl apply -f -",
            "kubectl apply --dry-run=server -f -",
            1,
        );
    }
    let path = format!(
        "{}:{}",
        cluster.bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let started = Instant::now();
    let mut child = Command::new("bash")
        .args(["-c", &text])
        .current_dir(dir)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("running bash")?;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > COMMAND_TIMEOUT {
            // The whole group: a backgrounded port-forward too.
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            bail!("{text}\nran past {COMMAND_TIMEOUT:?} (a heredoc left open, or a hang)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // kubectl says "No resources found" on stderr: something said, all the same.
    ensure!(
        out.status.success() && !(stdout.trim().is_empty() && stderr.trim().is_empty()),
        "{text}\nexited {:?}, printing {stdout:?}; stderr: {stderr}",
        out.status.code(),
    );
    Ok(Ran {
        command: text,
        stdout,
        took: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_command_and_its_heredoc() {
        let notes = "Check it:\n  kubectl get pods\n\nCreate one:\n  kubectl apply -f - <<'YAML'\n  kind: X\nYAML\nor else.\n  not kubectl\n";
        let found = shown_commands(notes).unwrap();
        assert_eq!(
            found,
            [
                ShownCommand("kubectl get pods".into()),
                ShownCommand("kubectl apply -f - <<'YAML'\n  kind: X\nYAML".into()),
            ]
        );
    }

    #[test]
    fn the_readme_shows_its_kubectl_commands_in_sh_blocks() {
        let markdown = "Text `kubectl get x`.\n```sh\nkubectl get pods\nhelm install a b\nkubectl apply -f - <<'EOF'\nkind: X\nEOF\n```\n```\nkubectl not-sh\n```\n";
        assert_eq!(
            readme_commands(markdown).unwrap(),
            [
                ShownCommand("kubectl get pods".into()),
                ShownCommand("kubectl apply -f - <<'EOF'\nkind: X\nEOF".into()),
            ]
        );
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
                .unwrap();
        let shown = readme_commands(&readme).unwrap();
        assert!(
            shown
                .iter()
                .any(|c| c.0.starts_with("kubectl apply -f - <<")),
            "{shown:?}"
        );
    }

    #[test]
    fn a_heredoc_closed_by_an_indented_word_is_never_closed() {
        let notes = "  kubectl apply -f - <<'YAML'\n  kind: X\n  YAML\nmore text\n";
        let error = shown_commands(notes).unwrap_err().to_string();
        assert!(error.contains("never closed"), "{error}");
    }
}
