//! The repository's example policies (`examples/`) as the tests read them: the folder, its
//! files (one per platform the docs point to, none missing), each file's one policy, and
//! where a policy read back differs from one written.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use serde::Deserialize as _;
use serde_json::Value;

/// The example of each platform docs/proofs.md and the README point to.
pub const PLATFORM_EXAMPLES: [&str; 6] = [
    "eks-ebs.yaml",
    "gke-pd.yaml",
    "aks-azure-disk.yaml",
    "watchdog-agent.yaml",
    "bare-metal-bmc.yaml",
    "storage-fences.yaml",
];

/// `examples/` at the repository's root.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every `*.yaml` and `*.yml` file of `examples/`, by name; fails when the folder is missing
/// or empty, or lacks a platform's example.
pub fn example_files() -> anyhow::Result<Vec<PathBuf>> {
    let dir = examples_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    files.retain(|p| {
        p.extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
    });
    files.sort();
    ensure!(
        !files.is_empty(),
        "{} holds no example policy (*.yaml)",
        dir.display()
    );
    for platform in PLATFORM_EXAMPLES {
        ensure!(
            files.iter().any(|p| p.ends_with(platform)),
            "examples/{platform} is missing: docs/proofs.md points to it"
        );
    }
    Ok(files)
}

/// The one PodHAPolicy an example file holds, below the comment header it must open with.
pub fn read_example(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path)?;
    ensure!(
        text.starts_with('#'),
        "it does not open with a comment header saying for which nodes and storage it is, \
         which proof it uses and what it needs installed"
    );
    one_policy(&text)
}

/// The one `podha.io/v1alpha1` PodHAPolicy, with a spec, that `yaml` holds.
pub fn one_policy(yaml: &str) -> anyhow::Result<Value> {
    let documents = serde_norway::Deserializer::from_str(yaml)
        .map(Value::deserialize)
        .collect::<Result<Vec<_>, _>>()
        .context("it is not YAML")?;
    let [policy] = documents.as_slice() else {
        bail!(
            "it holds {} YAML documents, not one policy",
            documents.len()
        );
    };
    ensure!(
        policy["apiVersion"] == "podha.io/v1alpha1" && policy["kind"] == "PodHAPolicy",
        "it is not a podha.io/v1alpha1 PodHAPolicy: apiVersion {}, kind {}",
        policy["apiVersion"],
        policy["kind"]
    );
    ensure!(policy["spec"].is_object(), "it has no spec: {policy}");
    Ok(policy.clone())
}

/// Where `read` lacks or differs from a field `written` sets, by its path (`path` names the
/// root); two leaves are the same when `same` says so.
pub fn fields_not_kept(
    path: &str,
    written: &Value,
    read: &Value,
    same: &dyn Fn(&Value, &Value) -> bool,
    out: &mut Vec<String>,
) {
    match (written, read) {
        (Value::Object(w), Value::Object(r)) => {
            for (key, value) in w {
                let here = format!("{path}.{key}");
                match r.get(key) {
                    Some(read) => fields_not_kept(&here, value, read, same, out),
                    None => out.push(format!("{here} is gone")),
                }
            }
        }
        (w, r) if !same(w, r) => out.push(format!("{path} reads {r}, written {w}")),
        _ => {}
    }
}
