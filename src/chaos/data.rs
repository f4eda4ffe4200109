//! What a trial did to the data, from the storage's own account: a command the user gives
//! (`--data-check`, a template with `{volume}` among its placeholders) runs once the node is
//! back (or, without a restore, after the failover) and a few seconds have let every writer
//! that could still write do so; it prints a JSON object with two arrays:
//!
//! - `split_brain_writes`: writes the storage accepted from an old writer after the new one's
//!   first (two writers at once);
//! - `lost_acknowledged_writes`: writes a writer was told succeeded that the storage does not
//!   hold.
//!
//! `podha-csi check --acks-dir` prints exactly that (its writers keep their acknowledgements off
//! the volume); other storage can provide its own command. Optional numbers
//! `accepted_writes` and `refused_writes` are shown when present.

use serde::Deserialize;

use super::faults;

/// Why a data check gave no report. Kept as text where the cause is: a trial's record is cloned
/// and compared, which the underlying errors are not.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("it failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
    #[error("{0}")]
    NotRun(String),
    /// `output`: the first 200 characters of what it printed.
    #[error(
        "its output is not a JSON object with split_brain_writes and lost_acknowledged_writes \
         arrays ({reason}): {output}"
    )]
    NotAReport { reason: String, output: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The built-in data checks: name, template.
pub const BUILT_IN: [(&str, &str); 1] = [(
    "podha-csi-sim",
    "{podha_csi} check --volume-dir {sim_dir}/san/{volume} --acks-dir {sim_dir}/acks",
)];

/// The template of `check`: a built-in name's, or `check` itself.
pub fn template(check: &str) -> &str {
    BUILT_IN
        .iter()
        .find(|(name, _)| *name == check)
        .map_or(check, |(_, template)| template)
}

/// What the storage reported.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct DataReport {
    pub split_brain_writes: Vec<serde_json::Value>,
    pub lost_acknowledged_writes: Vec<serde_json::Value>,
    #[serde(default)]
    pub accepted_writes: Option<u64>,
    #[serde(default)]
    pub refused_writes: Option<u64>,
}

/// One trial's data check: the command as run, and the report or why there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataCheck {
    pub command: String,
    pub result: Result<DataReport>,
}

/// Parses a data check's output.
pub fn parse(stdout: &str) -> Result<DataReport> {
    serde_json::from_str(stdout.trim()).map_err(|e| Error::NotAReport {
        reason: e.to_string(),
        output: stdout.chars().take(200).collect(),
    })
}

/// Runs `command`; a failure or an output that does not parse is recorded, not raised.
pub async fn run(command: String) -> DataCheck {
    let result = match faults::run_output(&command).await {
        Ok(stdout) => parse(&stdout),
        Err(super::Error::Command { status, stderr, .. }) => Err(Error::Failed { status, stderr }),
        Err(e) => Err(Error::NotRun(e.to_string())),
    };
    DataCheck { command, result }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podha_csis_report_parses_and_other_storage_needs_only_the_two_arrays() {
        let report = parse(
            r#"{"accepted_writes": 40, "refused_writes": 3, "writers": [["n1","p1"]],
                "split_brain_writes": [], "lost_acknowledged_writes": [{"seq": 4}]}"#,
        )
        .unwrap();
        assert_eq!(report.accepted_writes, Some(40));
        assert_eq!(report.lost_acknowledged_writes.len(), 1);
        let other =
            parse(r#"{"split_brain_writes": [1, 2], "lost_acknowledged_writes": []}"#).unwrap();
        assert_eq!(
            (other.split_brain_writes.len(), other.accepted_writes),
            (2, None)
        );
    }

    #[test]
    fn output_without_the_arrays_is_an_error_that_quotes_it() {
        let err = parse("all good").unwrap_err().to_string();
        assert!(err.contains("all good"), "{err}");
        assert!(parse(r#"{"split_brain_writes": []}"#).is_err());
    }

    #[test]
    fn built_in_names_expand_to_their_template() {
        assert!(template("podha-csi-sim").contains("--acks-dir {sim_dir}/acks"));
        assert_eq!(template("my-check {volume}"), "my-check {volume}");
    }

    #[tokio::test]
    async fn a_failing_or_silent_command_is_recorded_with_the_reason() {
        let failed = run("echo broken >&2; exit 3".into()).await;
        let reason = failed.result.unwrap_err().to_string();
        assert!(
            reason.contains("exit code 3") && reason.contains("broken"),
            "{reason}"
        );
        let silent = run("true".into()).await;
        assert!(silent.result.is_err());
        let clean =
            run(r#"echo '{"split_brain_writes":[],"lost_acknowledged_writes":[]}'"#.into()).await;
        assert!(clean.result.unwrap().split_brain_writes.is_empty());
    }
}
