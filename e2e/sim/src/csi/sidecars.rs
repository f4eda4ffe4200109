//! The controller side of the sim's CSI drivers: per driver, podha-csi's Controller service on a
//! unix socket (run by `podha-sim csi-plugin`) behind the real kubernetes-csi `csi-provisioner`
//! and `csi-attacher`, built from Go modules by `make csi-sidecars` into a cache directory keyed
//! by the versions pinned in `e2e/versions.mk`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{ControllerConfig, DRIVERS};

const VERSIONS_MK: &str = include_str!("../../../versions.mk");

/// The sidecar binaries the sim runs.
pub const SIDECARS: [&str; 2] = ["csi-provisioner", "csi-attacher"];

/// The value of `KEY := value` in `versions.mk`.
fn pinned(key: &str) -> &'static str {
    VERSIONS_MK
        .lines()
        .filter_map(|line| line.split_once(":="))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .unwrap_or("unknown")
}

/// `csi-sidecars-attacher-<A>-provisioner-<P>-static`, the cache entry `make csi-sidecars`
/// fills (static binaries, which the kind kit's images hold too).
pub fn cache_key() -> String {
    format!(
        "csi-sidecars-attacher-{}-provisioner-{}-static",
        pinned("CSI_ATTACHER_VERSION"),
        pinned("CSI_PROVISIONER_VERSION")
    )
}

/// `$PODHA_CSI_SIDECARS_BIN_DIR`, else `${PODHA_CACHE:-$HOME/.cache/podha}/<cache key>/bin`.
pub fn default_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PODHA_CSI_SIDECARS_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("PODHA_CACHE")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/".into())
                .join(".cache/podha")
        });
    cache.join(cache_key()).join("bin")
}

/// The sidecars missing from `dir` (not an executable file there).
pub fn missing(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    SIDECARS
        .iter()
        .filter(|b| {
            !std::fs::metadata(dir.join(b))
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .map(|b| b.to_string())
        .collect()
}

/// Where the sim's CSI state lives inside the cluster directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The shared store (the "SAN") of every volume.
    pub store: PathBuf,
    /// Directory of the plugins' unix sockets.
    pub sockets: PathBuf,
}

impl Layout {
    pub fn new(cluster_dir: &Path) -> Self {
        Layout {
            store: cluster_dir.join("san"),
            sockets: cluster_dir.join("csi"),
        }
    }

    /// The socket of `driver`'s plugin.
    pub fn socket(&self, driver: &str) -> PathBuf {
        self.sockets.join(format!("{}.sock", short_name(driver)))
    }
}

/// `rwo` for `rwo.sim.podha.io`: names processes and sockets.
pub fn short_name(driver: &str) -> &str {
    driver.split('.').next().unwrap_or(driver)
}

/// What to start for the controller side: (process name, command) per process, three per driver.
pub fn controller_processes(
    sim_exe: &Path,
    sidecar_dir: &Path,
    layout: &Layout,
    kubeconfig: &Path,
    cfg: ControllerConfig,
) -> Vec<(String, Command)> {
    // A sidecar's CSI call times out after this; it must outlast the simulated delays.
    let timeout = cfg.attach_delay.max(cfg.detach_delay) + Duration::from_secs(15);
    let mut processes = Vec::new();
    for driver in DRIVERS {
        let short = short_name(driver);
        let socket = layout.socket(driver);
        let mut plugin = Command::new(sim_exe);
        plugin
            .arg("csi-plugin")
            .arg(format!("--driver={driver}"))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--store={}", layout.store.display()))
            .arg(format!(
                "--attach-delay={}",
                humantime::format_duration(cfg.attach_delay)
            ))
            .arg(format!(
                "--detach-delay={}",
                humantime::format_duration(cfg.detach_delay)
            ));
        processes.push((format!("csi-plugin-{short}"), plugin));
        for sidecar in SIDECARS {
            let mut cmd = Command::new(sidecar_dir.join(sidecar));
            cmd.arg(format!("--csi-address={}", socket.display()))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg("--leader-election=false")
                .arg(format!("--timeout={}s", timeout.as_secs()));
            processes.push((format!("{sidecar}-{short}"), cmd));
        }
    }
    processes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_comes_from_versions_mk() {
        let key = cache_key();
        assert!(key.starts_with("csi-sidecars-attacher-4."), "{key}");
        assert!(!key.contains("unknown"), "{key}");
    }

    #[test]
    fn each_driver_gets_a_plugin_a_provisioner_and_an_attacher_on_one_socket() {
        let layout = Layout::new(Path::new("/sim"));
        let cfg = ControllerConfig {
            attach_delay: Duration::from_secs(1),
            detach_delay: Duration::from_secs(2),
        };
        let processes = controller_processes(
            Path::new("/bin/podha-sim"),
            Path::new("/sidecars"),
            &layout,
            Path::new("/sim/kubeconfig"),
            cfg,
        );
        let names: Vec<&str> = processes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "csi-plugin-rwo",
                "csi-provisioner-rwo",
                "csi-attacher-rwo",
                "csi-plugin-other",
                "csi-provisioner-other",
                "csi-attacher-other"
            ]
        );
        let args = |i: usize| -> Vec<String> {
            processes[i]
                .1
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        assert!(args(0).contains(&"--socket=/sim/csi/rwo.sock".to_string()));
        assert!(args(0).contains(&"--detach-delay=2s".to_string()));
        assert!(args(2).contains(&"--csi-address=/sim/csi/rwo.sock".to_string()));
        assert!(args(2).contains(&"--timeout=17s".to_string()));
        assert_eq!(processes[5].1.get_program(), "/sidecars/csi-attacher");
    }

    #[test]
    fn missing_sidecars_are_named() {
        assert_eq!(
            missing(Path::new("/nonexistent")),
            SIDECARS.map(String::from)
        );
    }
}
