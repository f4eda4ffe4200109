//! The operations on one node: kill it (a dead machine), kill only its kubelet, start it
//! again, add one.

use super::*;

impl Cluster {
    /// The node's machine dies: its kwok and sim-csi node agent are SIGKILLed (its lease stops
    /// being renewed, its status and `volumesInUse` freeze) and its address stops answering
    /// (packets to its kubelet endpoint are dropped: a connect times out, as against a host that
    /// is off).
    ///
    /// A real node: every process in its cgroup tree (containerd, shims, containers, kubelet)
    /// is SIGKILLed and its veth goes down.
    ///
    /// Its BMC goes with it, unless the cluster's BMCs are powered through Redfish: then the
    /// BMC runs on (as on standby power), its system still says `On`, and a `ForceOff` then
    /// `On` through Redfish boots the node again.
    pub fn kill_node(&self, name: &str) -> Result<()> {
        let rec = self.node(name)?;
        if rec.real {
            realnode::kill(&self.real_node(name, "killed")?)?;
        } else {
            self.silence_kwok_node(name)?;
        }
        // The machine's processes first, its BMC after them: an agent still running when its
        // BMC is gone takes its watchdog's failed pet for a node nothing resets any more, and
        // withdraws its advert.
        self.kill_node_processes(name, true)?;
        if self.redfish().is_none() {
            self.stop_bmc(&mut self.lock_reloaded(), name)?;
        }
        info!(node = name, "node killed");
        Ok(())
    }

    /// Kwok node `name`'s addresses stop answering, as a machine's that is off: its kubelet
    /// endpoint and its podha agent's.
    pub(in crate::cluster) fn silence_kwok_node(&self, name: &str) -> Result<()> {
        let rec = self.lock_reloaded().node(name)?.clone();
        blackhole::silence(&self.dir, rec.ip, rec.port)?;
        if let Some(port) = rec.agent_port {
            blackhole::silence(&self.dir, rec.ip, port)?;
        }
        Ok(())
    }

    /// Only the node's kubelet dies (kwok and the sim-csi node agent are SIGKILLed): the host
    /// stays up, so its kernel refuses connects to the kubelet port. Containers of a real node
    /// would go on running.
    ///
    /// A real node: only its kubelet is SIGKILLed; containerd and the containers run on.
    pub fn kill_kubelet(&self, name: &str) -> Result<()> {
        if self.node(name)?.real {
            let proc_name = kubelet_proc(name);
            {
                let mut st = self.lock_reloaded();
                if let Some(rec) = st.processes.get(&proc_name).copied() {
                    // The boot script that restarts the kubelet (as systemd would) first, then
                    // the kubelet itself.
                    process::kill_leader(&proc_name, &rec)?;
                    st.processes.remove(&proc_name);
                    st.save(&self.dir)?;
                }
            }
            // The state's lock is free again: listing the node's processes takes it.
            for pid in self.node_pids(name)? {
                let is_kubelet = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    c.split(|b| *b == 0)
                        .next()
                        .is_some_and(|exe| exe.ends_with(b"/kubelet"))
                });
                if is_kubelet {
                    // Gone already (ESRCH) is what was asked for.
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            info!(node = name, "kubelet killed, containers running");
            return Ok(());
        }
        self.kill_node_processes(name, false)?;
        info!(node = name, "kubelet killed, host up");
        Ok(())
    }

    /// SIGKILLs the node's processes: a real node's kubelet, a kwok node's kwok and sim-csi
    /// node agent, and, `with_agent`, its podha agent (the machine is gone, not only its
    /// workloads).
    pub(in crate::cluster) fn kill_node_processes(
        &self,
        name: &str,
        with_agent: bool,
    ) -> Result<()> {
        let mut st = self.lock_reloaded();
        let mut names = if st.node(name)?.real {
            vec![kubelet_proc(name)]
        } else {
            vec![kwok_proc(name), csi_node_proc(name)]
        };
        if with_agent {
            names.push(agent_proc(name));
        }
        let mut result = Ok(());
        for proc_name in names {
            if let Some(rec) = st.processes.get(&proc_name).copied() {
                match process::kill(&proc_name, &rec) {
                    Ok(()) => {
                        st.processes.remove(&proc_name);
                    }
                    Err(e) => result = Err(e),
                }
            }
        }
        st.save(&self.dir)?;
        result
    }

    /// Whether node `name`'s machine runs: a real node's kubelet, or a kwok node's kwok and
    /// node agent.
    fn machine_runs(&self, name: &str) -> Result<bool> {
        let st = self.lock_reloaded();
        let alive = |proc: String| st.processes.get(&proc).is_some_and(process::is_alive);
        Ok(if st.node(name)?.real {
            alive(kubelet_proc(name))
        } else {
            alive(kwok_proc(name)) && alive(csi_node_proc(name))
        })
    }

    /// Restarts a killed node's kwok and node agent as a rebooted machine would come back: a
    /// new `nodeInfo.bootID`, the stale lease dropped so that the new kwok (which has a new
    /// holder identity, unlike a kubelet) takes it over at once. Returns once the node is Ready.
    ///
    /// A real node reboots: whatever still runs of it is killed, then it boots with a new boot
    /// ID (which its kubelet reports); returns once it is Ready with that boot ID.
    ///
    /// Under Redfish power the node's system is made to say `On` first. The BMC of a node that
    /// is off is stopped before that: a BMC that powered its node off waits for its system to
    /// say `On` and then boots the node itself (`run_bmc`), which would be a second boot beside
    /// this one, with a second BMC whose watchdog nobody pets. The boot starts the next BMC.
    /// (A `ForceOff` the emulator has not applied yet when the node starts still powers the new
    /// boot off: the emulator keeps it pending while its system reads `On`.)
    pub async fn start_node(&self, name: &str) -> Result<()> {
        if self.redfish().is_some() && !self.machine_runs(name)? {
            self.stop_bmc(&mut self.lock_reloaded(), name)?;
        }
        self.power_system_on(name).await?;
        if self.node(name)?.real {
            return self.reboot_real_node(name).await;
        }
        if self.machine_runs(name)? {
            return Err(Error::NodeRunning(name.to_string()));
        }
        // A fenced node's podha agent still runs: the node boots with a new one (and a new
        // BMC, if it has one: a reboot disarms the watchdog, so the old agent's end fires
        // nothing).
        {
            let mut st = self.lock_reloaded();
            self.stop_bmc(&mut st, name)?;
            if let Some(rec) = st.processes.get(&agent_proc(name)).copied() {
                process::kill(&agent_proc(name), &rec)?;
                st.processes.remove(&agent_proc(name));
                st.save(&self.dir)?;
            }
        }
        let client = self.client().await?;
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        match leases.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("delete lease of {name}"), e)),
        }
        let boot_id = set_boot_id(&client, name).await?;
        {
            let mut st = self.lock_reloaded();
            st.record_boot_id(name, Some(boot_id));
            let mut rec = st.node(name)?.clone();
            blackhole::restore(&self.dir, rec.ip, rec.port)?;
            if let Some(port) = rec.agent_port.filter(|_| !rec.agent_cut) {
                blackhole::restore(&self.dir, rec.ip, port)?;
            }
            // Another process may have taken the node's port while it was down (a second sim
            // cluster shares the loopback addresses): take a free one; kwok reports it in the
            // Node's daemonEndpoints, where probes read it.
            if !ports::port_is_free(rec.ip, rec.port) {
                rec.port = free_port(rec.ip)?;
                if let Some(stored) = st.nodes.iter_mut().find(|n| n.name == name) {
                    stored.port = rec.port;
                }
            }
            self.spawn_node(&mut st, &rec)?;
        }
        self.wait_nodes_ready(&client, &[name.to_string()], Duration::from_secs(120))
            .await?;
        info!(node = name, "node started");
        Ok(())
    }

    /// Adds kwok node `node-<N+1>` and returns its name once it is Ready.
    pub async fn add_node(&self) -> Result<String> {
        let rec = {
            let mut st = self.lock_reloaded();
            let index = st
                .nodes
                .iter()
                .map(|n| n.index)
                .max()
                .unwrap_or(0)
                .checked_add(1);
            let rec = node_record(index.unwrap_or(0))?;
            st.nodes.push(rec.clone());
            st.save(&self.dir)?;
            rec
        };
        let client = self.client().await?;
        let boot_id = create_node(&client, &rec).await?;
        {
            let mut st = self.lock_reloaded();
            st.record_boot_id(&rec.name, Some(boot_id.clone()));
            let rec = NodeRecord {
                boot_id: Some(boot_id),
                ..rec.clone()
            };
            self.spawn_node(&mut st, &rec)?;
        }
        self.wait_nodes_ready(
            &client,
            std::slice::from_ref(&rec.name),
            Duration::from_secs(120),
        )
        .await?;
        info!(node = %rec.name, "node added");
        Ok(rec.name)
    }
}
