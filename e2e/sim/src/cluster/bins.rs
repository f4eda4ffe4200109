//! Where the control-plane binaries live: a cache directory keyed by the versions pinned in
//! `e2e/versions.mk`, filled by `make k8s`.

use std::path::{Path, PathBuf};

use super::{Error, Result};

/// The one place versions are pinned; read at compile time so the default directory always
/// matches what `make k8s` builds.
const VERSIONS_MK: &str = include_str!("../../../versions.mk");

/// Every binary the sim cluster runs.
pub const BINARIES: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
];

/// The value of `KEY := value` in `versions.mk`.
fn pinned(key: &str) -> &'static str {
    VERSIONS_MK
        .lines()
        .filter_map(|line| line.split_once(":="))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .unwrap_or("unknown")
}

/// `sim-k8s-<K8S>-etcd-<ETCD>-kwok-<KWOK>`, the cache entry `make k8s` fills.
pub fn cache_key() -> String {
    format!(
        "sim-k8s-{}-etcd-{}-kwok-{}",
        pinned("K8S_VERSION"),
        pinned("ETCD_VERSION"),
        pinned("KWOK_VERSION")
    )
}

/// The Kubernetes version the sim cluster runs (from `versions.mk`).
pub fn k8s_version() -> &'static str {
    pinned("K8S_VERSION")
}

/// `${PODHA_CACHE:-$HOME/.cache/podha}`, where the make targets cache what they build.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("PODHA_CACHE")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/".into());
            home.join(".cache/podha")
        })
}

/// `$PODHA_SIM_BIN_DIR`, else `${PODHA_CACHE:-$HOME/.cache/podha}/<cache key>/bin`.
pub fn default_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PODHA_SIM_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    cache_dir().join(cache_key()).join("bin")
}

/// `$PODHA_SUSHY_EMULATOR`, else the `sushy-emulator` of the venv `make sushy-tools` fills.
pub fn sushy_emulator() -> PathBuf {
    if let Some(path) = std::env::var_os("PODHA_SUSHY_EMULATOR").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    cache_dir()
        .join(format!("sushy-tools-{}", pinned("SUSHY_TOOLS_VERSION")))
        .join("bin/sushy-emulator")
}

/// Fails with [`Error::MissingBinaries`] unless every binary is an executable file in `dir`.
pub fn check(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let missing: Vec<String> = BINARIES
        .iter()
        .filter(|b| {
            !std::fs::metadata(dir.join(b))
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .map(|b| b.to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::MissingBinaries {
            dir: dir.to_path_buf(),
            missing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_comes_from_versions_mk() {
        let key = cache_key();
        assert!(key.starts_with("sim-k8s-1."), "{key}");
        assert!(!key.contains("unknown"), "{key}");
    }

    #[test]
    fn missing_binaries_are_named() {
        let err = check(Path::new("/nonexistent/podha")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("make k8s"), "{msg}");
        assert!(msg.contains("kube-apiserver"), "{msg}");
    }
}
