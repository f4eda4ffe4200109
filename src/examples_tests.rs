//! The policies in `examples/`, and those README.md and docs/install.md tell users to apply:
//! each parses as a `PodHAPolicy` keeping every field it sets (serde would drop a field the
//! type does not know without a word), and each platform's example asks for the proof its
//! header and docs/proofs.md give it. The kwok suite applies the examples to a real API server
//! (`tests/failover/examples.rs`).

use std::str::FromStr;

use podha_sim::examples::{
    PLATFORM_EXAMPLES, example_files, examples_dir, fields_not_kept, one_policy, read_example,
};
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

/// Where `parsed` lacks or differs from a field `written` sets, by its path; durations are
/// compared as durations (`90s` is written back `1m30s`).
fn lost_fields(written: &Value, parsed: &Value) -> Vec<String> {
    let duration = |v: &Value| v.as_str().and_then(|s| HumanDuration::from_str(s).ok());
    let same =
        |w: &Value, p: &Value| w == p || (duration(w).is_some() && duration(w) == duration(p));
    let mut lost = Vec::new();
    fields_not_kept("spec", written, parsed, &same, &mut lost);
    lost
}

/// `yaml` as the one PodHAPolicy it holds; panics naming `what` and the field it loses.
fn parse_policy(what: &str, written: anyhow::Result<Value>) -> PodHAPolicy {
    let written = written.unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let policy: PodHAPolicy = serde_json::from_value(written.clone())
        .unwrap_or_else(|e| panic!("{what} is no PodHAPolicy: {e}"));
    let parsed = serde_json::to_value(&policy).expect("a policy serializes");
    let lost = lost_fields(&written["spec"], &parsed["spec"]);
    assert!(
        lost.is_empty(),
        "{what} sets fields a PodHAPolicy does not keep: {}",
        lost.join("; ")
    );
    policy
}

#[test]
fn every_example_parses_and_each_platform_asks_for_its_proof() {
    // Every platform's example there, each opening with its header (read_example).
    let files = example_files().unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        PLATFORMS.map(|p| p.file),
        PLATFORM_EXAMPLES,
        "the platforms whose proofs are checked here are those whose example must be there"
    );
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let policy = parse_policy(&format!("examples/{name}"), read_example(path));
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
        let what = format!("examples/{}", platform.file);
        let spec = parse_policy(&what, read_example(&examples_dir().join(platform.file))).spec;
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
        let policy = parse_policy(&format!("README.md's policy {}", i + 1), one_policy(yaml));
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
        parse_policy(
            &format!("docs/install.md's policy {}", i + 1),
            one_policy(yaml),
        );
    }
}
