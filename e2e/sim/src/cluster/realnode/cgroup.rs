//! A real node's cgroup: the same directory in every cgroup v1 hierarchy of the host (and in
//! the hybrid `unified` one), `/podha-sim-<cluster id>-<node>`. It is the kubelet's
//! `cgroupRoot`; containerd and the kubelet run in its `runtime` child, so containerd's shims
//! inherit it, and runc puts every container under its `kubepods` child. Everything the node
//! runs is in this tree: that is how a fault reaches all of it.
//!
//! The host must have the v1 `freezer` hierarchy (a kill freezes the tree first, so nothing
//! forks while it is being killed; `freeze` is a hung machine).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cluster::{Error, Result};

const CGROUP_FS: &str = "/sys/fs/cgroup";
/// The host's cgroup v2 hierarchy beside the v1 ones.
const UNIFIED: &str = "unified";
/// The child the node's own processes (containerd, shims, kubelet) run in.
pub const RUNTIME: &str = "runtime";

/// One node's cgroup tree, by its name directly under each hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCgroup {
    name: String,
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(context, e)
}

/// The host's cgroup hierarchies (directories of /sys/fs/cgroup with a `cgroup.procs`).
fn hierarchies() -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(CGROUP_FS).map_err(io(format!("list {CGROUP_FS}")))?;
    for entry in entries {
        let path = entry.map_err(io(format!("list {CGROUP_FS}")))?.path();
        if path.join("cgroup.procs").is_file() {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(io(format!("write {value:?} to {}", path.display())))
}

/// Copies the parent's `cpuset.cpus` and `cpuset.mems` into `dir`: a v1 cpuset cgroup starts
/// with none, and no task can join it until both are set.
fn init_cpuset(dir: &Path) -> Result<()> {
    let parent = dir.parent().unwrap_or(dir);
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let value = std::fs::read_to_string(parent.join(file))
            .map_err(io(format!("read {}", parent.join(file).display())))?;
        write(&dir.join(file), value.trim())?;
    }
    Ok(())
}

impl NodeCgroup {
    pub fn new(name: impl Into<String>) -> Self {
        NodeCgroup { name: name.into() }
    }

    /// The kubelet's `cgroupRoot`.
    pub fn root(&self) -> String {
        format!("/{}", self.name)
    }

    fn freezer(&self) -> PathBuf {
        Path::new(CGROUP_FS).join("freezer").join(&self.name)
    }

    /// The tree in the host's cgroup v2 hierarchy (the hybrid layout's `unified`), where runc
    /// places every container too: what a cgroup v2 machine shows as `/sys/fs/cgroup`, with
    /// `cgroup.kill` and `cgroup.events` (`populated`) in every directory.
    pub fn unified(&self) -> PathBuf {
        Path::new(CGROUP_FS).join(UNIFIED).join(&self.name)
    }

    /// Creates the tree in every hierarchy (idempotent), cpusets initialised; children the
    /// kubelet creates later inherit the cpuset (`cgroup.clone_children`).
    pub fn create(&self) -> Result<()> {
        let all = hierarchies()?;
        if !all.iter().any(|h| h.ends_with("freezer")) {
            return Err(Error::Other(format!(
                "real nodes need the cgroup v1 freezer hierarchy, not mounted in {CGROUP_FS}"
            )));
        }
        for h in all {
            let root = h.join(&self.name);
            let runtime = root.join(RUNTIME);
            std::fs::create_dir_all(&runtime)
                .map_err(io(format!("create {}", runtime.display())))?;
            if h.ends_with("cpuset") {
                init_cpuset(&root)?;
                init_cpuset(&runtime)?;
                write(&root.join("cgroup.clone_children"), "1")?;
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes its pid to, to join the `runtime` child in
    /// every hierarchy.
    pub fn runtime_procs_files(&self) -> Result<Vec<PathBuf>> {
        Ok(hierarchies()?
            .into_iter()
            .map(|h| h.join(&self.name).join(RUNTIME).join("cgroup.procs"))
            .collect())
    }

    /// Every process in the tree (from the freezer hierarchy, which every task of the node
    /// joins), sorted.
    pub fn pids(&self) -> Vec<i32> {
        Self::pids_below(self.freezer())
    }

    /// Every process of pod `uid` on the node (see [`NodeCgroup::pod_dirs`]).
    pub fn pod_pids(&self, uid: &str) -> Vec<i32> {
        self.pod_dirs(uid).flat_map(Self::pids_below).collect()
    }

    /// Where pod `uid`'s cgroup may be in the freezer hierarchy: under `kubepods/` (Guaranteed)
    /// or its `burstable/` or `besteffort/` child, as `pod<uid>` (the kubelet's cgroupfs name).
    fn pod_dirs(&self, uid: &str) -> impl Iterator<Item = PathBuf> {
        let pod = format!("pod{uid}");
        let kubepods = self.freezer().join("kubepods");
        ["", "burstable", "besteffort"]
            .into_iter()
            .map(move |class| kubepods.join(class).join(&pod))
    }

    /// Freezes (or thaws) pod `uid`'s processes through the v1 freezer: a frozen task takes no
    /// signal until thawed, a SIGKILL included, so its cgroup stays populated meanwhile.
    pub fn freeze_pod(&self, uid: &str, frozen: bool) -> Result<()> {
        let dir = self
            .pod_dirs(uid)
            .find(|d| d.is_dir())
            .ok_or_else(|| Error::Other(format!("no cgroup of pod {uid} on {}", self.name)))?;
        let state = if frozen { "FROZEN" } else { "THAWED" };
        write(&dir.join("freezer.state"), state)
    }

    fn pids_below(top: PathBuf) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut stack = vec![top];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    fn freezer_state(&self) -> String {
        std::fs::read_to_string(self.freezer().join("freezer.state"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Stops every task of the tree (a hung machine): they stay, do nothing, answer nothing
    /// (the kernel still accepts TCP connects to their listening sockets). Waits up to 5 s
    /// for the kernel to report the tree `FROZEN`.
    pub fn freeze(&self) -> Result<()> {
        write(&self.freezer().join("freezer.state"), "FROZEN")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.freezer_state() != "FROZEN" {
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "cgroup {} still {} 5 s after freezing",
                    self.name,
                    self.freezer_state()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn thaw(&self) -> Result<()> {
        write(&self.freezer().join("freezer.state"), "THAWED")
    }

    /// SIGKILLs every task of the tree: frozen first so that none forks in between, killed,
    /// thawed (a frozen task dies once thawed); waits up to 10 s for the tree to be empty.
    pub fn kill_all(&self) -> Result<()> {
        if !self.freezer().is_dir() {
            return Ok(());
        }
        // A tree that does not freeze in time is killed anyway, then checked until empty.
        let _ = self.freeze();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for pid in self.pids() {
                match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(e) => {
                        return Err(Error::io(
                            format!("kill pid {pid} of node cgroup {}", self.name),
                            std::io::Error::from(e),
                        ));
                    }
                }
            }
            self.thaw()?;
            if self.pids().is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "node cgroup {} still has pids {:?} 10 s after SIGKILL",
                    self.name,
                    self.pids()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills what is left and removes the tree from every hierarchy (deepest first).
    pub fn remove(&self) -> Result<()> {
        self.kill_all()?;
        for h in hierarchies()? {
            let root = h.join(&self.name);
            if !root.is_dir() {
                continue;
            }
            let mut dirs = vec![];
            let mut stack = vec![root];
            while let Some(dir) = stack.pop() {
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    stack.extend(
                        entries
                            .flatten()
                            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                            .map(|e| e.path()),
                    );
                }
                dirs.push(dir);
            }
            // Children come after their parents in `dirs`.
            for dir in dirs.iter().rev() {
                std::fs::remove_dir(dir).map_err(io(format!("remove cgroup {}", dir.display())))?;
            }
        }
        Ok(())
    }
}
