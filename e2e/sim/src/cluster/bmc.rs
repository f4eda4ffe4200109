//! A node's BMC: what a machine has outside its operating system, here a `podha-sim bmc`
//! process on the host, outside the node's cgroup (a frozen node does not freeze it). Every
//! real node has one; a kwok node has one when its podha agent has a watchdog
//! (`super::Agents::watchdog_timeout`).
//!
//! - **Its watchdog.** `DIR/nodes/<node>/bmc/watchdog` is a FIFO standing in for the node's
//!   `/dev/watchdog`, with the Linux watchdog's rules: the first write arms it, any write pets
//!   it, a `V` before the writer closes disarms it; unpetted for the timeout, it powers the
//!   node off. The node's podha agent pets it (`--watchdog`).
//! - **Its power control.** `off` written to `DIR/nodes/<node>/bmc/power` powers the node off
//!   (the agent's fence: what a site's fence command does through IPMI or redfish).
//! - **Its Redfish system**, when the cluster's BMCs are powered through Redfish
//!   ([`super::redfish`]): the node is the system named after it on the cluster's emulator. The
//!   BMC reads the system's `PowerState` every [`super::redfish::READ_EVERY`] (a read is what
//!   makes the emulator apply a pending reset), in a task of its own, and powers the node off
//!   when it reads `Off` after having read `On` (a node boots only while its system says `On`,
//!   see `Cluster::start_node`); when it powers the node off for another reason it asks the
//!   system for `ForceOff` until the system says `Off`, so the system's state follows the
//!   machine.
//!   Once the node is off it keeps reading, and boots the node again (`podha-sim node start`)
//!   when the system says `On`.
//!
//! Powering off is [`Cluster::fence_node`] for a real node: every process of the node
//! SIGKILLed, its link down, the fence appended to `fences.log`; a kwok node is powered off as
//! [`Cluster::kill_node`] kills it (its agent too, its addresses silent), and the fence
//! recorded. The BMC then exits (without Redfish); the node's next boot starts a new one.

use std::io::{ErrorKind, Read as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::time::Instant;

use super::*;

/// The BMC of real node `name`.
pub(in crate::cluster) fn bmc_proc(name: &str) -> String {
    format!("bmc-{name}")
}

/// Where a real node's BMC keeps its FIFOs.
pub fn bmc_dir(cluster_dir: &Path, node: &str) -> PathBuf {
    cluster_dir.join("nodes").join(node).join("bmc")
}

/// How often the BMC looks at its FIFOs.
const TICK: Duration = Duration::from_millis(100);

/// Why a BMC powers its node off when its Redfish system says so.
pub const REDFISH_OFF_REASON: &str = "its BMC reports PowerState Off (Redfish)";

/// The BMC's Redfish system, followed in a task of its own so that a slow read never holds up
/// the watchdog: `off` turns true once the system reads `Off` after having read `On`.
struct RedfishFeed {
    task: tokio::task::JoinHandle<()>,
    off: tokio::sync::watch::Receiver<bool>,
}

impl RedfishFeed {
    fn follow(system: std::sync::Arc<podha::redfish::Bmc>, node: String) -> Self {
        let (said_off, off) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut seen_on = false;
            loop {
                match system.power_state().await {
                    Ok(podha::redfish::PowerState::On) => seen_on = true,
                    Ok(state) if state.is_off() && seen_on => {
                        let _ = said_off.send(true);
                        return;
                    }
                    Ok(_) => {}
                    Err(error) => warn!(node, %error, "reading the Redfish system's power state"),
                }
                tokio::time::sleep(super::redfish::READ_EVERY).await;
            }
        });
        Self { task, off }
    }

    fn says_off(&self) -> bool {
        *self.off.borrow()
    }
}

impl Drop for RedfishFeed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// After the BMC powered its node off: makes the system say `Off` (unless it did already,
/// `seen_off`), then waits until it says `On`.
async fn follow_until_on(system: &podha::redfish::Bmc, node: &str, seen_off: bool) {
    if !seen_off {
        super::redfish::bring_to(system, node, podha::redfish::ResetType::ForceOff).await;
    }
    loop {
        tokio::time::sleep(super::redfish::READ_EVERY).await;
        match system.power_state().await {
            Ok(podha::redfish::PowerState::On) => return,
            Ok(_) => {}
            Err(error) => warn!(node, %error, "reading the Redfish system's power state"),
        }
    }
}

/// The watchdog's state, fed what its FIFO delivers.
#[derive(Debug, Default)]
struct Watchdog {
    /// Last pet while armed.
    petted: Option<Instant>,
    /// The last write held a `V`: a close now disarms.
    magic: bool,
}

impl Watchdog {
    fn wrote(&mut self, bytes: &[u8], now: Instant) {
        self.petted = Some(now);
        self.magic = bytes.contains(&b'V');
    }

    /// The writer closed the device.
    fn closed(&mut self) {
        if self.magic {
            self.petted = None;
            self.magic = false;
        }
    }

    /// How long it has not been petted while armed.
    fn unpetted_for(&self, now: Instant) -> Option<Duration> {
        self.petted.map(|at| now.saturating_duration_since(at))
    }
}

fn mkfifo(path: &Path) -> Result<()> {
    match nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(e) => Err(Error::Other(format!("mkfifo {}: {e}", path.display()))),
    }
}

fn open_fifo(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))
}

/// What one read of a FIFO gave.
enum Got {
    Bytes(Vec<u8>),
    /// No writer has it open.
    Closed,
    Nothing,
}

fn read_fifo(file: &mut std::fs::File) -> Result<Got> {
    let mut buf = [0u8; 512];
    match file.read(&mut buf) {
        Ok(0) => Ok(Got::Closed),
        Ok(n) => Ok(Got::Bytes(buf[..n].to_vec())),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(Got::Nothing),
        Err(e) => Err(Error::io("read a BMC FIFO", e)),
    }
}

impl Cluster {
    /// Starts node `name`'s BMC (before the node boots: its agent opens the watchdog).
    pub(in crate::cluster) fn spawn_bmc(
        &self,
        st: &mut State,
        name: &str,
        watchdog_timeout: Option<Duration>,
    ) -> Result<()> {
        let dir = bmc_dir(&self.dir, name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        mkfifo(&dir.join("watchdog"))?;
        mkfifo(&dir.join("power"))?;
        self.stop_bmc(st, name)?;
        let mut cmd = Command::new(&st.sim_exe);
        cmd.arg("bmc")
            .arg(name)
            .arg(format!("--dir={}", self.dir.display()));
        if let Some(timeout) = watchdog_timeout {
            cmd.arg(format!(
                "--watchdog-timeout={}",
                humantime::format_duration(timeout)
            ));
        }
        self.spawn(st, &bmc_proc(name), cmd)
    }

    /// Stops node `name`'s BMC, if it runs.
    pub(in crate::cluster) fn stop_bmc(&self, st: &mut State, name: &str) -> Result<()> {
        if let Some(rec) = st.processes.get(&bmc_proc(name)).copied() {
            process::kill(&bmc_proc(name), &rec)?;
            st.processes.remove(&bmc_proc(name));
            st.save(&self.dir)?;
        }
        Ok(())
    }

    /// The BMC of node `name` (`podha-sim bmc`): watches its watchdog and power FIFOs
    /// until it powers the node off; returns the reason. Without `watchdog_timeout` the node has
    /// no watchdog: what its FIFO gets is ignored.
    pub async fn run_bmc(&self, name: &str, watchdog_timeout: Option<Duration>) -> Result<String> {
        let dir = bmc_dir(&self.dir, name);
        let mut watchdog_fifo = open_fifo(&dir.join("watchdog"))?;
        let mut power_fifo = open_fifo(&dir.join("power"))?;
        let mut watchdog = Watchdog::default();
        let system = self.redfish_system(name)?;
        let feed = system
            .clone()
            .map(|system| RedfishFeed::follow(system, name.to_string()));
        info!(
            node = name,
            ?watchdog_timeout,
            redfish = system.is_some(),
            "BMC up"
        );
        let reason = loop {
            tokio::time::sleep(TICK).await;
            let now = Instant::now();
            if feed.as_ref().is_some_and(RedfishFeed::says_off) {
                break REDFISH_OFF_REASON.to_string();
            }
            match read_fifo(&mut watchdog_fifo)? {
                Got::Bytes(bytes) => watchdog.wrote(&bytes, now),
                Got::Closed => watchdog.closed(),
                Got::Nothing => {}
            }
            if let Got::Bytes(bytes) = read_fifo(&mut power_fifo)? {
                let said = String::from_utf8_lossy(&bytes).trim().to_string();
                if said == "off" {
                    break "powered off by its podha agent".to_string();
                }
                warn!(
                    node = name,
                    said, "the BMC's power control takes only \"off\""
                );
            }
            if let Some(silent) = watchdog.unpetted_for(now)
                && let Some(timeout) = watchdog_timeout
                && silent > timeout
            {
                break format!(
                    "watchdog: not petted for {}",
                    humantime::format_duration(Duration::from_millis(silent.as_millis() as u64))
                );
            }
        };
        if self.node(name)?.real {
            self.fence_node(name, &reason)?;
        } else {
            // A kwok machine powered off: as one killed, but for its BMC (this process).
            self.silence_kwok_node(name)?;
            self.kill_node_processes(name, true)?;
            self.record_fence(name, &reason)?;
        }
        drop(feed);
        if let Some(system) = system {
            follow_until_on(&system, name, reason == REDFISH_OFF_REASON).await;
            info!(node = name, "the Redfish system says On: booting the node");
            self.power_on(name)?;
            return Ok(format!(
                "{reason}; booting again: its Redfish system says On"
            ));
        }
        Ok(reason)
    }

    /// The node's Redfish system, when the cluster's BMCs are powered through Redfish.
    fn redfish_system(&self, name: &str) -> Result<Option<std::sync::Arc<podha::redfish::Bmc>>> {
        let access = self.lock_reloaded().redfish.clone();
        access
            .map(|access| access.system(name).map(std::sync::Arc::new))
            .transpose()
    }

    /// Boots node `name` as `podha-sim node start` does, in a process of its own: the boot
    /// starts the node's next BMC, which stops this one.
    fn power_on(&self, name: &str) -> Result<()> {
        let exe = self.lock_reloaded().sim_exe.clone();
        let mut cmd = Command::new(exe);
        cmd.args(["node", "start", name])
            .arg(format!("--dir={}", self.dir.display()));
        self.spawn(&mut self.lock_reloaded(), &format!("power-on-{name}"), cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_reads_as_closed_until_a_writer_opens_it_and_after_it_closes() {
        let dir = std::env::temp_dir().join(format!("podha-bmc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("watchdog");
        mkfifo(&path).expect("mkfifo");
        mkfifo(&path).expect("a second mkfifo finds it there");
        let mut reader = open_fifo(&path).expect("open without a writer");
        assert!(matches!(read_fifo(&mut reader), Ok(Got::Closed)));
        let mut writer = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("writer");
        assert!(matches!(read_fifo(&mut reader), Ok(Got::Nothing)));
        std::io::Write::write_all(&mut writer, b"\nV").expect("write");
        match read_fifo(&mut reader) {
            Ok(Got::Bytes(b)) => assert_eq!(b, b"\nV"),
            _ => panic!("the bytes written"),
        }
        drop(writer);
        assert!(matches!(read_fifo(&mut reader), Ok(Got::Closed)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_watchdog_arms_on_the_first_write_and_only_a_v_disarms_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Watchdog::default();
        assert_eq!(w.unpetted_for(t0), None, "not armed before a write");
        w.closed();
        w.wrote(b"\n", t0);
        assert_eq!(w.unpetted_for(t0 + s(3)), Some(s(3)));
        w.closed();
        assert_eq!(
            w.unpetted_for(t0 + s(4)),
            Some(s(4)),
            "a crash keeps it armed"
        );
        w.wrote(b"V", t0 + s(5));
        w.closed();
        assert_eq!(w.unpetted_for(t0 + s(9)), None, "magic close");
        w.wrote(b"V", t0 + s(10));
        w.wrote(b"\n", t0 + s(11));
        w.closed();
        assert_eq!(
            w.unpetted_for(t0 + s(12)),
            Some(s(1)),
            "a pet after the V takes the magic back"
        );
    }
}
