//! podha agents and the fences they carry out.
//!
//! A real node's agent is what a user installs: a pod of podha's chart (its DaemonSet, values
//! from `crate::chart_install::sim_agent_values`), started by the node's kubelet, so it lives in
//! the node's cgroup (a frozen or killed node freezes or kills it) and, on the host network, in
//! the node's network namespace (it listens on the node's address; a partition cuts it from the
//! API server). It fences through the node's BMC (`super::bmc`), which the node shows its pods
//! at `realnode::MACHINE_DIR`: `off` written to the BMC's power FIFO; with a watchdog it pets the
//! BMC's watchdog. Its BMC carries the fence out and records it.
//!
//! A kwok node is a kwok process and a sim-csi node agent; in a cluster started with
//! [`super::Agents`] it also runs `podha agent` on its own loopback address (a free port,
//! advertised on the Node by the agent itself), recorded with the node's processes so that a killed node loses its agent too. Its
//! fence is `podha-sim node fence`: the node's kwok and sim-csi node agent are SIGKILLed (its
//! workloads stop: its Lease, status and volumes freeze) while its host, and the agent, run on,
//! as after a fence that stops a machine's kubelet and containers; each fence is appended to
//! `fences.log` in the cluster directory, the record the tests read. It confirms the fence with
//! `podha-sim node fenced` (those two processes gone) before it acknowledges a request.
//!
//! With [`Agents::watchdog_timeout`] a kwok node also has a BMC (`super::bmc`, outside the
//! node: a kill of the node stops it with the machine, as a real node's) whose watchdog the
//! agent pets; unpetted, it powers the node off: its kwok, sim-csi node agent and podha agent
//! SIGKILLed and its addresses silent, as [`Cluster::kill_node`].
//!
//! What a real machine has and this lacks: a kwok node's fence cannot reboot anything, and a
//! kwok node cannot be frozen or cut off from the API server alone (real nodes can); only its
//! agent can, from a restart on ([`Cluster::restart_agent_cut_from_api_server`]).

use super::*;

/// One fence an agent carried out, as `fences.log` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u128,
    pub node: String,
    pub reason: String,
}

impl Cluster {
    /// Starts the podha agent of kwok node `rec`, booted: on a free port of its address, with
    /// an empty hearing file (a reboot empties it, as it empties the node's /run, where the
    /// chart keeps it).
    pub(in crate::cluster) fn spawn_agent(
        &self,
        st: &mut State,
        rec: &mut NodeRecord,
        agents: &Agents,
    ) -> Result<()> {
        // A rebooted node's agent listens where the last one did, as a DaemonSet's pod on the
        // host network does, unless another process took the port meanwhile.
        let port = match rec.agent_port {
            Some(port) if ports::port_is_free(rec.ip, port) => port,
            _ => free_port(rec.ip)?,
        };
        rec.agent_port = Some(port);
        if rec.agent_cut {
            // The cut outlives the reboot: the new agent is unreachable from its start.
            blackhole::silence(&self.dir, rec.ip, port)?;
        }
        if let Some(stored) = st.nodes.iter_mut().find(|n| n.name == rec.name) {
            stored.agent_port = Some(port);
        }
        let hearing = self.agent_hearing_file(&rec.name);
        match std::fs::remove_file(&hearing) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("remove {}", hearing.display()), e)),
        }
        if agents.watchdog_timeout.is_some() {
            // The machine's BMC first: the agent opens the watchdog at start.
            self.spawn_bmc(st, &rec.name, agents.watchdog_timeout)?;
        }
        self.start_agent(st, rec, agents, port, &self.kubeconfig_path())
    }

    /// Restarts kwok node `name`'s podha agent as the kubelet restarts a crashed container:
    /// SIGKILLed, started again on the same port with the same hearing file.
    pub fn restart_agent(&self, name: &str) -> Result<()> {
        self.restart_agent_with(name, &self.kubeconfig_path())
    }

    /// Restarts kwok node `name`'s podha agent as [`Self::restart_agent`] does, cut off from
    /// the API server: its kubeconfig names a loopback port nothing listens on, so every
    /// request it makes is refused, as on a node that lost its path to the control plane (it
    /// renews no Lease, reads no peer list). The cut lasts as long as that process: the node's
    /// next boot starts its agent with the cluster's kubeconfig. (A running kwok agent cannot
    /// be cut from the API server alone: it shares the host's loopback with it.)
    pub fn restart_agent_cut_from_api_server(&self, name: &str) -> Result<()> {
        let cut = self
            .dir
            .join("nodes")
            .join(name)
            .join("kubeconfig-unreachable");
        let text = std::fs::read_to_string(self.kubeconfig_path())
            .map_err(|e| Error::io("read the cluster's kubeconfig".to_string(), e))?;
        let mut doc: serde_json::Value = serde_norway::from_str(&text)
            .map_err(|e| Error::Other(format!("the cluster's kubeconfig: {e}")))?;
        let server = doc
            .pointer_mut("/clusters/0/cluster/server")
            .ok_or_else(|| Error::Other("the cluster's kubeconfig names no server".into()))?;
        // The discard port: closed on loopback here, as every test that needs a refusal takes it.
        *server = serde_json::json!("https://127.0.0.1:9");
        let yaml =
            serde_norway::to_string(&doc).map_err(|e| Error::Other(format!("kubeconfig: {e}")))?;
        std::fs::write(&cut, yaml).map_err(|e| Error::io(format!("write {}", cut.display()), e))?;
        self.restart_agent_with(name, &cut)?;
        info!(node = name, "podha agent cut off from the API server");
        Ok(())
    }

    fn restart_agent_with(&self, name: &str, kubeconfig: &Path) -> Result<()> {
        let mut st = self.lock_reloaded();
        let agents = st
            .agents
            .clone()
            .ok_or_else(|| Error::Other("the cluster runs no agents on its kwok nodes".into()))?;
        let rec = st.node(name)?.clone();
        let port = rec
            .agent_port
            .ok_or_else(|| Error::Other(format!("{name} has no podha agent")))?;
        if let Some(old) = st.processes.remove(&agent_proc(name)) {
            process::kill(&agent_proc(name), &old)?;
        }
        self.start_agent(&mut st, &rec, &agents, port, kubeconfig)?;
        info!(node = name, "podha agent restarted");
        Ok(())
    }

    /// Stops kwok node `name`'s podha agent for good, as an uninstall does: SIGTERM, and the
    /// wait for it to exit. The node runs on without an agent until it boots again.
    pub fn stop_agent(&self, name: &str) -> Result<()> {
        let mut st = self.lock_reloaded();
        let old = st
            .processes
            .remove(&agent_proc(name))
            .ok_or_else(|| Error::Other(format!("{name} runs no podha agent")))?;
        process::terminate(&agent_proc(name), &old)?;
        st.save(&self.dir)?;
        info!(node = name, "podha agent stopped");
        Ok(())
    }

    /// Cuts (`cut`) podha off kwok node `name`'s agent or lets it through again: packets to
    /// the agent's address and port are dropped, so podha's probes and the peers' surveys go
    /// unanswered, while the node, its agent and the agent's own requests run on. The cut
    /// outlives the node's reboots (a blocked port is the network's, not the machine's).
    pub fn cut_agent_off(&self, name: &str, cut: bool) -> Result<()> {
        let rec = self.lock_reloaded().node(name)?.clone();
        let port = rec
            .agent_port
            .ok_or_else(|| Error::Other(format!("{name} has no podha agent")))?;
        if cut {
            blackhole::silence(&self.dir, rec.ip, port)?;
        } else {
            blackhole::restore(&self.dir, rec.ip, port)?;
        }
        let mut st = self.lock_reloaded();
        if let Some(stored) = st.nodes.iter_mut().find(|n| n.name == name) {
            stored.agent_cut = cut;
        }
        st.save(&self.dir)?;
        info!(node = name, cut, "podha agent cut off");
        Ok(())
    }

    /// Where kwok node `name`'s agent keeps when podha last heard it.
    /// Where node `name`'s agent keeps when podha last heard it (`--hearing-file`).
    pub fn agent_hearing_file(&self, name: &str) -> PathBuf {
        self.dir.join("nodes").join(name).join("agent-heard")
    }

    /// Where node `name`'s agent keeps the node's boot history (`--boot-history-file`): beside
    /// the hearing file, which a reboot removes, but kept, as the chart keeps it under the
    /// node's /var/lib (the host's, which every kwok agent shares, would mix the nodes' boots).
    pub fn agent_boot_history_file(&self, name: &str) -> PathBuf {
        self.dir.join("nodes").join(name).join("agent-boots")
    }

    fn start_agent(
        &self,
        st: &mut State,
        rec: &NodeRecord,
        agents: &Agents,
        port: u16,
        kubeconfig: &Path,
    ) -> Result<()> {
        let fence = format!(
            "command:'{}' node fence '{}' --dir '{}'",
            st.sim_exe.display(),
            rec.name,
            self.dir.display()
        );
        // The host's boot ID is every kwok node's: each agent reads the one the sim gave its node.
        let boot_id_file = self.dir.join("nodes").join(&rec.name).join("boot_id");
        let dir = boot_id_file.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir)
            .and_then(|()| {
                std::fs::write(&boot_id_file, rec.boot_id.as_deref().unwrap_or_default())
            })
            .map_err(|e| Error::io(format!("write {}", boot_id_file.display()), e))?;
        let mut agent = Command::new(&agents.exe);
        agent
            .arg("agent")
            .arg(format!("--node={}", rec.name))
            .arg(format!("--listen={}:{port}", rec.ip))
            .arg(format!(
                "--isolation-timeout={}",
                humantime::format_duration(agents.isolation_timeout)
            ))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--boot-id-file={}", boot_id_file.display()))
            .arg(format!(
                "--boot-history-file={}",
                self.agent_boot_history_file(&rec.name).display()
            ))
            .arg(format!(
                "--hearing-file={}",
                self.agent_hearing_file(&rec.name).display()
            ))
            .arg(format!("--fence={fence}"))
            .arg(format!(
                "--fence-confirm=command:'{}' node fenced '{}' --dir '{}'",
                st.sim_exe.display(),
                rec.name,
                self.dir.display()
            ));
        if let Some(timeout) = agents.survey_timeout {
            agent.arg(format!(
                "--survey-timeout={}",
                humantime::format_duration(timeout)
            ));
        }
        if let Some(timeout) = agents.watchdog_timeout {
            let device = super::bmc::bmc_dir(&self.dir, &rec.name).join("watchdog");
            agent
                .arg(format!("--watchdog={}", device.display()))
                // The BMC's watchdog is a FIFO standing in for a device.
                .arg("--watchdog-stand-in")
                .arg(format!(
                    "--watchdog-timeout={}",
                    humantime::format_duration(timeout)
                ));
        }
        self.spawn(st, &agent_proc(&rec.name), agent)
    }

    /// A node's fence, recorded in `fences.log`. A kwok node's (what its agent asks for): its
    /// kwok and sim-csi node agent are SIGKILLed, the agent and the host stay. A real node's
    /// (what its BMC does): powered off, every process SIGKILLed and its link down, as
    /// [`Cluster::kill_node`] but with the BMC left to the caller.
    pub fn fence_node(&self, name: &str, reason: &str) -> Result<()> {
        if self.node(name)?.real {
            realnode::kill(&self.real_node(name, "fenced")?)?;
            self.kill_node_processes(name, true)?;
        } else {
            self.kill_node_processes(name, false)?;
        }
        self.record_fence(name, reason)
    }

    /// Whether kwok node `name` is fenced: neither its kwok nor its node agent runs (what its
    /// agent's `--fence-confirm` checks).
    pub fn node_fenced(&self, name: &str) -> Result<bool> {
        let st = self.lock_reloaded();
        st.node(name)?;
        Ok([kwok_proc(name), csi_node_proc(name)].iter().all(|p| {
            st.processes
                .get(p)
                .is_none_or(|rec| !process::is_alive(rec))
        }))
    }

    /// Appends a fence of node `name` to `fences.log`.
    pub(in crate::cluster) fn record_fence(&self, name: &str, reason: &str) -> Result<()> {
        crate::bmc_fifo::append_fence(&self.fences_log(), name, reason)?;
        info!(node = name, reason, "node fenced by its agent");
        Ok(())
    }

    fn fences_log(&self) -> PathBuf {
        self.dir.join("fences.log")
    }

    /// Every fence carried out so far, oldest first.
    pub fn fences(&self) -> Result<Vec<Fence>> {
        let path = self.fences_log();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
        };
        text.lines()
            .map(|line| {
                let mut parts = line.splitn(3, ' ');
                let at_ms = parts.next().and_then(|t| t.parse().ok());
                match (at_ms, parts.next(), parts.next()) {
                    (Some(at_ms), Some(node), reason) => Ok(Fence {
                        at_ms,
                        node: node.to_string(),
                        reason: reason.unwrap_or_default().to_string(),
                    }),
                    _ => Err(Error::Other(format!(
                        "{}: malformed line {line:?}",
                        path.display()
                    ))),
                }
            })
            .collect()
    }
}
