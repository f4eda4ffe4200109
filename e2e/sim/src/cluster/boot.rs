//! Booting a cluster: etcd, the API server, the controllers, the nodes and the CSI processes, in
//! order, each waited for.

use super::*;

impl Cluster {
    pub(in crate::cluster) async fn boot(&self) -> Result<()> {
        self.spawn_etcd()?;
        let etcd_port = self.lock().ports.etcd_client;
        self.wait_until(
            "etcd to accept connections",
            Duration::from_secs(30),
            &[ETCD],
            || async move {
                Ok(TcpStream::connect_timeout(
                    &SocketAddr::from((Ipv4Addr::LOCALHOST, etcd_port)),
                    Duration::from_millis(200),
                )
                .is_ok())
            },
        )
        .await?;

        self.spawn_apiserver()?;
        let client = self.client().await?;
        self.wait_apiserver_ready(&client).await?;

        apply_csi_objects(&client).await?;

        self.spawn_controllers()?;

        // nodes
        let (real, mut nodes): (Vec<NodeRecord>, Vec<NodeRecord>) =
            self.lock().nodes.iter().cloned().partition(|n| n.real);
        for rec in &mut nodes {
            rec.boot_id = Some(create_node(&client, rec).await?);
        }
        {
            let mut st = self.lock();
            for rec in &nodes {
                st.record_boot_id(&rec.name, rec.boot_id.clone());
            }
        }
        let real_boots = self.boot_real_nodes(&real)?;
        self.spawn_nodes_and_csi(&nodes)?;

        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        self.wait_nodes_ready(&client, &names, Duration::from_secs(180))
            .await?;
        self.wait_real_nodes_ready(&client, &real_boots, Duration::from_secs(180))
            .await?;
        if !real.is_empty() {
            // The node plugin's DaemonSet needs the controller manager and the scheduler.
            self.every_process_alive()?;
            let names: Vec<String> = real.iter().map(|n| n.name.clone()).collect();
            realnode::csi::install_node_plugin(&client, &names, Duration::from_secs(120)).await?;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let sas = &sas;
        self.wait_until(
            "the controller manager to create the default service account",
            Duration::from_secs(60),
            &[CONTROLLER_MANAGER],
            || async move { Ok(sas.get_opt("default").await.ok().flatten().is_some()) },
        )
        .await?;
        self.every_process_alive()?;
        info!(dir = %self.dir.display(), nodes = names.len(), real_nodes = real.len(), "sim cluster up");
        Ok(())
    }

    /// The kwok nodes' processes and the CSI controller side (plugins and sidecars).
    fn spawn_nodes_and_csi(&self, nodes: &[NodeRecord]) -> Result<()> {
        let kubeconfig = self.kubeconfig_path();
        let mut st = self.lock();
        for rec in nodes {
            self.spawn_node(&mut st, rec)?;
        }
        let cfg = crate::csi::ControllerConfig {
            attach_delay: st.attach_delay,
            detach_delay: st.detach_delay,
        };
        let layout = crate::csi::sidecars::Layout::new(&self.dir);
        let sidecar_dir = crate::csi::sidecars::default_bin_dir();
        for (name, cmd) in crate::csi::sidecars::controller_processes(
            &st.sim_exe,
            &sidecar_dir,
            &layout,
            &kubeconfig,
            cfg,
        ) {
            self.spawn(&mut st, &name, cmd)?;
        }
        Ok(())
    }

    fn spawn_etcd(&self) -> Result<()> {
        let dir = self.dir.clone();
        let mut st = self.lock();
        let p = st.ports.clone();
        let mut cmd = Self::bin(&st, "etcd");
        cmd.arg("--name=sim")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{}",
                p.etcd_client
            ))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{}",
                p.etcd_client
            ))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{}",
                p.etcd_peer
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                p.etcd_peer
            ))
            .arg(format!(
                "--initial-cluster=sim=http://127.0.0.1:{}",
                p.etcd_peer
            ))
            .arg("--unsafe-no-fsync=true")
            .arg("--log-level=warn");
        self.spawn(&mut st, ETCD, cmd)?;
        Ok(())
    }

    /// kube-controller-manager and kube-scheduler.
    fn spawn_controllers(&self) -> Result<()> {
        let kubeconfig = self.kubeconfig_path();
        let pki = pki::Pki::paths(&self.dir);
        let mut st = self.lock();
        let p = st.ports.clone();
        let mut cmd = Self::bin(&st, "kube-controller-manager");
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", p.controller_manager))
            .arg("--leader-elect=false")
            .arg("--controllers=*")
            .arg("--use-service-account-credentials=false")
            .arg(format!(
                "--service-account-private-key-file={}",
                pki.sa_key.display()
            ))
            .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
            .arg(format!(
                "--cluster-signing-cert-file={}",
                pki.ca_cert.display()
            ))
            .arg(format!(
                "--cluster-signing-key-file={}",
                pki.ca_key.display()
            ))
            .arg("--allocate-node-cidrs=false")
            .arg("--cluster-name=podha-sim")
            .args(st.profile.controller_manager_args());
        self.spawn(&mut st, CONTROLLER_MANAGER, cmd)?;

        let mut cmd = Self::bin(&st, "kube-scheduler");
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", p.scheduler))
            .arg("--leader-elect=false")
            .args(st.profile.scheduler_args());
        self.spawn(&mut st, SCHEDULER, cmd)?;
        Ok(())
    }

    /// `Err` naming the first of the cluster's processes that exited, with its log's tail.
    fn every_process_alive(&self) -> Result<()> {
        let dead = self.processes().into_iter().find(|p| !p.alive);
        match dead {
            Some(dead) => {
                let log = self.log_path(&dead.name);
                Err(Error::ProcessExited {
                    tail: process::log_tail(&log, 20),
                    name: dead.name,
                    log,
                })
            }
            None => Ok(()),
        }
    }

    pub(in crate::cluster) fn spawn_node(&self, st: &mut State, rec: &NodeRecord) -> Result<()> {
        let kubeconfig = self.kubeconfig_path();
        let mut kwok = Self::bin(st, "kwok");
        kwok.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--config={}",
                self.dir.join("kwok-stages.yaml").display()
            ))
            .arg(format!("--manage-single-node={}", rec.name))
            .arg(format!("--node-name={}", rec.name))
            .arg(format!("--node-ip={}", rec.ip))
            .arg(format!("--node-port={}", rec.port))
            .arg(format!("--server-address={}:{}", rec.ip, rec.port))
            .arg(format!(
                "--node-lease-duration-seconds={NODE_LEASE_DURATION_SECONDS}"
            ))
            .arg(format!("--cidr=10.244.{}.0/24", rec.index))
            // kwok also loads ~/.kwok/kwok.yaml when it exists: keep the user's out.
            .env("HOME", self.dir.join("kwok-home"));
        self.spawn(st, &kwok_proc(&rec.name), kwok)?;
        let mut agent = Command::new(&st.sim_exe);
        agent
            .arg("csi-node")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--node={}", rec.name));
        self.spawn(st, &csi_node_proc(&rec.name), agent)?;
        let agent_watchdog = st.agents.as_ref().and_then(|a| a.watchdog_timeout);
        if st.redfish.is_some() && agent_watchdog.is_none() {
            // Every machine has a BMC when they are powered through Redfish; one whose agent
            // pets a watchdog gets it with the agent.
            self.spawn_bmc(st, &rec.name, None)?;
        }
        if let Some(agents) = st.agents.clone() {
            self.spawn_agent(st, &mut rec.clone(), &agents)?;
        }
        Ok(())
    }

    /// Polls `check` every 250 ms until it returns true; fails early if one of `watched`
    /// processes exits.
    pub(in crate::cluster) async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        watched: &[&str],
        mut check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if check().await? {
                return Ok(());
            }
            if let Some(exited) = self.exited(watched) {
                return Err(exited);
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    secs: timeout.as_secs(),
                    logs: self.logs_dir(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until every named node is Ready and its CSINode lists both sim-csi drivers.
    pub(in crate::cluster) async fn wait_nodes_ready(
        &self,
        client: &kube::Client,
        names: &[String],
        timeout: Duration,
    ) -> Result<()> {
        // A controller manager or scheduler that died at start leaves nodes Ready but no
        // DaemonSet pod ever scheduled: said now, with its log, not after a later timeout.
        let mut watched: Vec<String> = vec![
            APISERVER.into(),
            CONTROLLER_MANAGER.into(),
            SCHEDULER.into(),
        ];
        for n in names {
            watched.push(kwok_proc(n));
            watched.push(csi_node_proc(n));
        }
        let watched: Vec<&str> = watched.iter().map(String::as_str).collect();
        let nodes: Api<Node> = Api::all(client.clone());
        let csinodes: Api<CSINode> = Api::all(client.clone());
        let what = format!(
            "nodes {} to be Ready with sim-csi registered",
            names.join(", ")
        );
        let (nodes, csinodes) = (&nodes, &csinodes);
        self.wait_until(&what, timeout, &watched, || async move {
            for name in names {
                let Some(node) = nodes.get_opt(name).await.ok().flatten() else {
                    return Ok(false);
                };
                if !node_is_ready(&node) {
                    return Ok(false);
                }
                let Some(csinode) = csinodes.get_opt(name).await.ok().flatten() else {
                    return Ok(false);
                };
                let registered: Vec<&str> = csinode
                    .spec
                    .drivers
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect();
                if !crate::csi::DRIVERS.iter().all(|d| registered.contains(d)) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await
    }
}
