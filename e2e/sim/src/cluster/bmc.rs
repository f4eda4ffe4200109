//! A node's BMC: what a machine has outside its operating system, here a `podha-sim bmc`
//! process on the host, outside the node's cgroup (a frozen node does not freeze it). Every
//! real node has one; a kwok node has one when its podha agent has a watchdog
//! (`super::Agents::watchdog_timeout`).
//!
//! - **Its watchdog and power control**, the FIFOs `DIR/nodes/<node>/bmc/watchdog` and
//!   `DIR/nodes/<node>/bmc/power` (`crate::bmc_fifo`): unpetted for the watchdog's timeout, or
//!   told `off` (the agent's fence), it powers the node off.
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

use std::time::Instant;

use super::*;
use crate::bmc_fifo::Controls;

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

impl Cluster {
    /// Starts node `name`'s BMC (before the node boots: its agent opens the watchdog).
    pub(in crate::cluster) fn spawn_bmc(
        &self,
        st: &mut State,
        name: &str,
        watchdog_timeout: Option<Duration>,
    ) -> Result<()> {
        Controls::create(&bmc_dir(&self.dir, name))?;
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
        let mut controls = Controls::open(&bmc_dir(&self.dir, name), watchdog_timeout)?;
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
            if let Some(reason) = controls.look(name, now)? {
                break reason;
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
