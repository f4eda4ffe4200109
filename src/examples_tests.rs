//! The policies in `examples/`, and those README.md and docs/install.md tell users to apply:
//! each parses as a `PodHAPolicy` keeping every field it sets (serde would drop a field the
//! type does not know without a word), and each platform's example asks for the proof its
//! header and docs/proofs.md give it. The kwok suite applies the examples to a real API server
//! (`tests/failover/examples.rs`).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;
use serde_json::Value;

use crate::api::{FencingProof, HumanDuration, PodHAPolicy};

const README: &str = include_str!("../README.md");
const INSTALL_MD: &str = include_str!("../docs/install.md");
const PROOFS_MD: &str = include_str!("../docs/proofs.md");

/// What each platform's example must say: its file, the drivers it names (none: any CSI
/// driver), its proof and the proofs listed with it.
struct Platform {
    file: &'static str,
    drivers: &'static [&'static str],
    proof: FencingProof,
    listed: &'static [FencingProof],
}

/// A cloud's VMs: the shutdown taint, or a fence controller that stops a running instance
/// (the taint alone never comes for a hung or cut-off VM).
const CLOUD: &[FencingProof] = &[FencingProof::CloudShutdownTaint, FencingProof::External];

const PLATFORMS: [Platform; 6] = [
    Platform {
        file: "eks-ebs.yaml",
        drivers: &["ebs.csi.aws.com"],
        proof: FencingProof::AnyOf,
        listed: CLOUD,
    },
    Platform {
        file: "gke-pd.yaml",
        drivers: &["pd.csi.storage.gke.io"],
        // GCE's cloud provider never reports an instance shut down: no shutdown taint.
        proof: FencingProof::External,
        listed: &[],
    },
    Platform {
        file: "aks-azure-disk.yaml",
        drivers: &["disk.csi.azure.com"],
        proof: FencingProof::AnyOf,
        listed: CLOUD,
    },
    Platform {
        file: "watchdog-agent.yaml",
        drivers: &[],
        proof: FencingProof::Agent,
        listed: &[],
    },
    Platform {
        file: "bare-metal-bmc.yaml",
        drivers: &[],
        proof: FencingProof::Bmc,
        listed: &[],
    },
    Platform {
        file: "storage-fences.yaml",
        drivers: &["linstor.csi.linbit.com"],
        proof: FencingProof::None,
        listed: &[],
    },
];

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// Every `*.yaml` and `*.yml` file of `examples/`, by name.
fn example_files() -> Vec<PathBuf> {
    let dir = examples_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

/// Where `parsed` lacks or differs from a field `written` sets, by its path; durations are
/// compared as durations (`90s` is written back `1m30s`).
fn lost_fields(path: &str, written: &Value, parsed: &Value, out: &mut Vec<String>) {
    let duration = |v: &Value| v.as_str().and_then(|s| HumanDuration::from_str(s).ok());
    match (written, parsed) {
        (Value::Object(w), Value::Object(p)) => {
            for (key, value) in w {
                let here = format!("{path}.{key}");
                match p.get(key) {
                    Some(parsed) => lost_fields(&here, value, parsed, out),
                    None => out.push(format!("{here} is dropped")),
                }
            }
        }
        (w, p) if w == p => {}
        (w, p) if duration(w).is_some() && duration(w) == duration(p) => {}
        (w, p) => out.push(format!("{path} reads {p}, written {w}")),
    }
}

/// `yaml` as the one PodHAPolicy it holds; panics naming `what` and the field it loses.
fn parse_policy(what: &str, yaml: &str) -> PodHAPolicy {
    let documents: Vec<Value> = serde_norway::Deserializer::from_str(yaml)
        .map(Value::deserialize)
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{what} is not YAML: {e}"));
    let [written] = documents.as_slice() else {
        panic!(
            "{what} holds {} YAML documents, not one policy",
            documents.len()
        );
    };
    assert!(
        written["apiVersion"] == "podha.io/v1alpha1" && written["kind"] == "PodHAPolicy",
        "{what} is not a podha.io/v1alpha1 PodHAPolicy: {written}"
    );
    let policy: PodHAPolicy = serde_json::from_value(written.clone())
        .unwrap_or_else(|e| panic!("{what} is no PodHAPolicy: {e}"));
    let parsed = serde_json::to_value(&policy).expect("a policy serializes");
    let mut lost = Vec::new();
    lost_fields("spec", &written["spec"], &parsed["spec"], &mut lost);
    assert!(
        lost.is_empty(),
        "{what} sets fields a PodHAPolicy does not keep: {}",
        lost.join("; ")
    );
    policy
}

#[test]
fn every_example_parses_and_each_platform_asks_for_its_proof() {
    let files = example_files();
    assert!(
        !files.is_empty(),
        "{} holds no example policy",
        examples_dir().display()
    );
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("examples/{name}: {e}"));
        assert!(
            text.starts_with('#'),
            "examples/{name} does not open with a comment header saying for which nodes and \
             storage it is, which proof it uses and what it needs installed"
        );
        let policy = parse_policy(&format!("examples/{name}"), &text);
        assert!(
            policy.spec.dry_run,
            "examples/{name} must start in dry run, as every example's header says"
        );
        assert!(
            PROOFS_MD.contains(&format!("examples/{name}")),
            "docs/proofs.md does not list examples/{name}"
        );
    }
    for platform in &PLATFORMS {
        let path = examples_dir().join(platform.file);
        assert!(
            path.exists(),
            "examples/{} is missing: docs/proofs.md points to it",
            platform.file
        );
        let what = format!("examples/{}", platform.file);
        let text = std::fs::read_to_string(&path).expect("the example");
        let spec = parse_policy(&what, &text).spec;
        assert_eq!(
            spec.volumes.drivers, platform.drivers,
            "{what}: the CSI drivers it is for"
        );
        let fencing = &spec.fencing;
        let listed = match platform.proof {
            FencingProof::AnyOf => fencing.any_of.clone(),
            FencingProof::AllOf => fencing.all_of.clone(),
            _ => None,
        }
        .unwrap_or_default();
        assert_eq!(
            (fencing.proof, listed.as_slice()),
            (platform.proof, platform.listed),
            "{what}: the proof its header gives it"
        );
        if platform.proof == FencingProof::Bmc {
            assert!(
                fencing.bmc.is_some(),
                "{what}: proof BMC without fencing.bmc"
            );
        }
    }
}

/// The bodies of the heredocs in `doc` (`<<'EOF'` up to `EOF` alone on a line) that hold a
/// PodHAPolicy.
fn heredoc_policies(doc: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(start) = line.find("<<'") else {
            continue;
        };
        let rest = &line[start + 3..];
        let Some(end) = rest.find('\'') else {
            continue;
        };
        let terminator = &rest[..end];
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != terminator).collect();
        let body = body.join("\n");
        if body.contains("kind: PodHAPolicy") {
            found.push(body);
        }
    }
    found
}

#[test]
fn the_policies_the_readme_and_install_md_give_parse() {
    let readme = heredoc_policies(README);
    assert!(
        !readme.is_empty(),
        "README.md gives no policy to apply (a heredoc holding kind: PodHAPolicy)"
    );
    for (i, yaml) in readme.iter().enumerate() {
        let policy = parse_policy(&format!("README.md's policy {}", i + 1), yaml);
        assert!(
            policy.spec.dry_run,
            "README.md's policy {} is applied in dry run, as the text around it says",
            i + 1
        );
    }
    let install = heredoc_policies(INSTALL_MD);
    assert!(
        !install.is_empty(),
        "docs/install.md gives no policy to apply (a heredoc holding kind: PodHAPolicy)"
    );
    for (i, yaml) in install.iter().enumerate() {
        parse_policy(&format!("docs/install.md's policy {}", i + 1), yaml);
    }
}
