//! Faults as shell command templates: the user's own (`docker kill {node}`) or a built-in one by
//! name, for kind and for the sim cluster. A template is expanded per trial and run with
//! `sh -c`; a command that fails stops the run with its exit code and stderr.

use std::path::PathBuf;
use std::time::Instant;

use super::Error;

/// A fault and how to undo it, as command templates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The built-in name, or `custom`.
    pub name: String,
    pub inject: String,
    /// Without it the node is left as the fault left it, and the taint check is skipped.
    pub restore: Option<String>,
}

/// The built-in faults: name, fault, restore, what it models.
pub const BUILT_IN: [(&str, &str, &str, &str); 8] = [
    // A machine that loses its power loses its network at the same instant: a `docker kill`
    // alone leaves the node's address refusing connects for a moment after its processes are
    // gone, which podha takes for a host up without its agent.
    (
        "kind-kill",
        "docker network disconnect kind {node} && docker kill {node} && docker network connect kind {node}",
        "docker start {node}",
        "the node's container dies with every process in it, its network first (a machine that lost power)",
    ),
    // A node its watchdog or fence reset meanwhile (a BMC stand-in's `docker kill`) is started
    // again by the restore: `docker start` of a running container does nothing.
    (
        "kind-freeze",
        "docker pause {node}",
        "docker unpause {node} || docker start {node}",
        "the node's processes are frozen (a hung VM)",
    ),
    (
        "kind-partition",
        "docker network disconnect kind {node}",
        "docker network connect kind {node} && docker start {node}",
        "the node loses its network; its containers keep running",
    ),
    (
        "sim-kill",
        "{podha_sim} node kill {node} --dir {sim_dir}",
        "{podha_sim} node start {node} --dir {sim_dir}",
        "the sim node's machine dies: kubelet gone, address silent",
    ),
    (
        "sim-kill-kubelet",
        "{podha_sim} node kill-kubelet {node} --dir {sim_dir}",
        "{podha_sim} node start {node} --dir {sim_dir}",
        "only the sim node's kubelet dies; the host stays up",
    ),
    (
        "sim-freeze",
        "{podha_sim} node freeze {node} --dir {sim_dir}",
        "{podha_sim} node thaw {node} --dir {sim_dir}",
        "every process of a real sim node is frozen (a hung machine); thawed, it goes on",
    ),
    (
        "sim-isolate",
        "{podha_sim} node isolate {node} --dir {sim_dir}",
        "{podha_sim} node isolate {node} --heal --dir {sim_dir}",
        "a real sim node is cut off from everything; its containers keep running",
    ),
    (
        "sim-partition",
        "{podha_sim} node partition {node} --dir {sim_dir}",
        "{podha_sim} node partition {node} --heal --dir {sim_dir}",
        "a real sim node's traffic to the API server is dropped; its containers keep running",
    ),
];

/// In a restore given for a built-in fault, the built-in's own restore: `{restore} && wait-for-x`
/// adds to it.
pub const BUILT_IN_RESTORE: &str = "{restore}";

impl Fault {
    /// `fault` is a built-in name or a template; `restore`, if given, replaces the built-in's
    /// (where it says `{restore}`, the built-in's restore is put).
    pub fn new(fault: &str, restore: Option<&str>) -> Fault {
        match BUILT_IN.iter().find(|(name, ..)| *name == fault) {
            Some((name, inject, built_in_restore, _)) => Fault {
                name: name.to_string(),
                inject: inject.to_string(),
                restore: Some(match restore {
                    Some(given) => given.replace(BUILT_IN_RESTORE, built_in_restore),
                    None => built_in_restore.to_string(),
                }),
            },
            None => Fault {
                name: "custom".to_string(),
                inject: fault.to_string(),
                restore: restore.map(str::to_string),
            },
        }
    }
}

/// The values a template may use.
#[derive(Clone, Debug, Default)]
pub struct Vars {
    pub node: String,
    pub namespace: String,
    pub pod: String,
    pub sim_dir: Option<PathBuf>,
    pub podha_sim: String,
    /// The pod's volume handle (its first claim's PV), for `{volume}`.
    pub volume: Option<String>,
    pub podha_csi: String,
}

/// Replaces `{node}`, `{namespace}`, `{pod}`, `{volume}`, `{sim_dir}`, `{podha_sim}` and
/// `{podha_csi}` in `template`,
/// each value shell-quoted. An unknown placeholder, or `{sim_dir}` without a sim directory, is
/// a usage error.
pub fn expand(template: &str, vars: &Vars) -> Result<String, Error> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(Error::Usage(format!("unclosed `{{` in `{template}`")));
        };
        let value = match &after[..close] {
            "node" => vars.node.clone(),
            "namespace" => vars.namespace.clone(),
            "pod" => vars.pod.clone(),
            "podha_sim" => vars.podha_sim.clone(),
            "podha_csi" => vars.podha_csi.clone(),
            "volume" => match &vars.volume {
                Some(volume) => volume.clone(),
                None => {
                    return Err(Error::Usage(format!(
                        "`{template}` uses {{volume}}, but the pod has no CSI persistent volume"
                    )));
                }
            },
            "sim_dir" => match &vars.sim_dir {
                Some(dir) => dir.display().to_string(),
                None => {
                    return Err(Error::Usage(format!(
                        "`{template}` uses {{sim_dir}}: give the sim cluster's directory with \
                         --sim-dir"
                    )));
                }
            },
            other => {
                return Err(Error::Usage(format!(
                    "unknown placeholder {{{other}}} in `{template}` (known: {{node}}, \
                     {{namespace}}, {{pod}}, {{volume}}, {{sim_dir}}, {{podha_sim}}, \
                     {{podha_csi}})"
                )));
            }
        };
        out.push_str(&shell_quote(&value));
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `value` as one shell word.
fn shell_quote(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+,".contains(c));
    if plain {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

/// Runs `command` with `sh -c`; returns when it ran, or an error with its exit code and stderr.
pub async fn run(command: &str) -> Result<Instant, Error> {
    run_output(command).await?;
    Ok(Instant::now())
}

/// Runs `command` with `sh -c`; its stdout, or an error with its exit code and stderr.
pub async fn run_output(command: &str) -> Result<String, Error> {
    let output = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| Error::Command {
            command: command.to_string(),
            status: format!("could not start sh: {e}"),
            stderr: String::new(),
        })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(failed(command, &output))
}

/// The error of `command`, which exited with `output`'s unsuccessful status.
pub fn failed(command: &str, output: &std::process::Output) -> Error {
    let status = match output.status.code() {
        Some(code) => format!("exit code {code}"),
        None => format!("{}", output.status),
    };
    Error::Command {
        command: command.to_string(),
        status,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vars {
        Vars {
            node: "node-2".into(),
            namespace: "db".into(),
            pod: "db-0".into(),
            sim_dir: Some(PathBuf::from("/tmp/my sim")),
            podha_sim: "podha-sim".into(),
            volume: Some("pvc-1".into()),
            podha_csi: "podha-csi".into(),
        }
    }

    #[test]
    fn the_sims_freeze_isolation_and_partition_are_built_in_with_their_undo() {
        let freeze = Fault::new("sim-freeze", None);
        assert_eq!(
            expand(freeze.restore.as_deref().unwrap(), &vars()).unwrap(),
            "podha-sim node thaw node-2 --dir '/tmp/my sim'"
        );
        let partition = Fault::new("sim-partition", None);
        assert_eq!(
            expand(partition.restore.as_deref().unwrap(), &vars()).unwrap(),
            "podha-sim node partition node-2 --heal --dir '/tmp/my sim'"
        );
        let isolate = Fault::new("sim-isolate", None);
        assert_eq!(
            expand(&isolate.inject, &vars()).unwrap(),
            "podha-sim node isolate node-2 --dir '/tmp/my sim'"
        );
        assert_eq!(
            expand(isolate.restore.as_deref().unwrap(), &vars()).unwrap(),
            "podha-sim node isolate node-2 --heal --dir '/tmp/my sim'"
        );
    }

    #[test]
    fn a_data_check_gets_the_volume_and_fails_clearly_without_one() {
        let check = crate::chaos::data::template("podha-csi-sim");
        assert_eq!(
            expand(check, &vars()).unwrap(),
            "podha-csi check --volume-dir '/tmp/my sim'/san/pvc-1 --acks-dir '/tmp/my sim'/acks"
        );
        let no_volume = Vars {
            volume: None,
            ..vars()
        };
        let err = expand(check, &no_volume).unwrap_err().to_string();
        assert!(err.contains("no CSI persistent volume"), "{err}");
    }

    #[test]
    fn built_in_names_give_both_commands_and_a_restore_overrides() {
        let f = Fault::new("kind-freeze", None);
        assert_eq!(f.inject, "docker pause {node}");
        assert_eq!(
            f.restore.as_deref(),
            Some("docker unpause {node} || docker start {node}")
        );
        let f = Fault::new("sim-kill", Some("true"));
        assert_eq!(f.restore.as_deref(), Some("true"));
        let f = Fault::new("kind-kill", Some("{restore} && wait-for {node}"));
        assert_eq!(
            f.restore.as_deref(),
            Some("docker start {node} && wait-for {node}"),
            "{{restore}} is the built-in's"
        );
        let f = Fault::new("ssh {node} poweroff", None);
        assert_eq!((f.name.as_str(), f.restore), ("custom", None));
    }

    #[test]
    fn expansion_quotes_values_and_refuses_unknown_placeholders() {
        let sim = Fault::new("sim-kill", None);
        assert_eq!(
            expand(&sim.inject, &vars()).unwrap(),
            "podha-sim node kill node-2 --dir '/tmp/my sim'"
        );
        assert_eq!(
            expand("kubectl -n {namespace} delete pod {pod}", &vars()).unwrap(),
            "kubectl -n db delete pod db-0"
        );
        let unknown = expand("x {nod}", &vars()).unwrap_err().to_string();
        assert!(unknown.contains("{nod}"), "{unknown}");
        let no_dir = Vars {
            sim_dir: None,
            ..vars()
        };
        let missing = expand(&sim.inject, &no_dir).unwrap_err().to_string();
        assert!(missing.contains("--sim-dir"), "{missing}");
    }

    #[tokio::test]
    async fn a_failing_command_reports_its_exit_code_and_stderr() {
        assert!(run("true").await.is_ok());
        let e = run("echo boom >&2; exit 3").await.unwrap_err().to_string();
        assert!(e.contains("exit code 3") && e.contains("boom"), "{e}");
    }
}
