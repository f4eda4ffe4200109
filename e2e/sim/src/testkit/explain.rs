//! `podha explain`, run as a user runs it against the sim cluster.

use std::path::Path;

use anyhow::{Context as _, ensure};

use crate::cluster::Cluster;

/// `podha explain <subject…> -o json` with podha's namespace `podha_namespace`: whether it says
/// the subject is protected (its exit code, 0 or 1, checked against the answer), and the answer.
pub fn podha_explain(
    podha: &Path,
    cluster: &Cluster,
    subject: &[&str],
    podha_namespace: &str,
) -> anyhow::Result<(bool, serde_json::Value)> {
    let out = std::process::Command::new(podha)
        .arg("explain")
        .args(subject)
        .args(["-o", "json", "--podha-namespace", podha_namespace])
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .output()
        .with_context(|| format!("running {}", podha.display()))?;
    let asked = subject.join(" ");
    let code = out.status.code();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("podha explain {asked} ({code:?}): {stderr}"))?;
    let protected = answer["protected"].as_bool() == Some(true);
    ensure!(
        code == Some(if protected { 0 } else { 1 }),
        "podha explain {asked} exited {code:?} with protected={protected}: {stderr}"
    );
    Ok((protected, answer))
}

/// The answer's check of `rule`, if it has one.
pub fn explained_rule<'a>(
    answer: &'a serde_json::Value,
    rule: &str,
) -> Option<&'a serde_json::Value> {
    answer["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["rule"] == rule)
}
