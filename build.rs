//! Gives the build its git commit and date, for `podha --version` and `podha_build_info`
//! (`src/build_info.rs`): `PODHA_GIT_COMMIT` (else `git rev-parse HEAD`, else `unknown`) and
//! `SOURCE_DATE_EPOCH` (else the time of this build), both as the build's environment gives
//! them, so that a build from a source archive, or one made reproducible, can say them too.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PODHA_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = std::env::var("PODHA_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_string());
    let built = match std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .filter(|e| !e.trim().is_empty())
    {
        Some(epoch) => {
            let secs: u64 = epoch
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("SOURCE_DATE_EPOCH is not seconds: {epoch:?}"));
            UNIX_EPOCH + Duration::from_secs(secs)
        }
        None => SystemTime::now(),
    };
    println!("cargo:rustc-env=PODHA_GIT_COMMIT={}", commit.trim());
    println!(
        "cargo:rustc-env=PODHA_BUILD_DATE={}",
        humantime::format_rfc3339_seconds(built)
    );
}

/// HEAD's commit, when the sources are a git work tree with git at hand; the build script runs
/// again when HEAD moves (a commit, a checkout).
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = git(&["rev-parse", "HEAD"])?;
    // Where git keeps them for this work tree (a linked work tree has its own HEAD and reflog,
    // and shares the refs): HEAD, its reflog (written by every commit and checkout), the
    // branch's ref and the packed refs.
    let mut watched = vec![
        "HEAD".to_string(),
        "logs/HEAD".to_string(),
        "packed-refs".to_string(),
    ];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        // Only files that exist: cargo runs a build script every time for a missing one.
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_file())
        {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Some(commit)
}
