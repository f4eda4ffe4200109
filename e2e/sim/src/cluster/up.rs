//! Starting a new cluster: the binaries checked, the directory prepared, ports and node
//! addresses chosen, then `Cluster::boot` runs the processes.

use super::*;

impl Cluster {
    /// Starts a new cluster in `opts.dir` and returns once every node is Ready, every node's
    /// CSINode lists the sim-csi drivers and the controller manager has created the `default`
    /// service account. On error, whatever was started is killed again (logs stay in
    /// `DIR/logs`).
    pub async fn up(opts: ClusterOptions) -> Result<Cluster> {
        let tools = Tools::check(&opts)?;
        let total = opts.nodes + opts.real_nodes;
        if total == 0 || total > 250 {
            return Err(Error::Other(format!(
                "--nodes plus --real-nodes must be 1..=250, got {total}"
            )));
        }
        if opts.real_nodes > 0 {
            realnode::check_host(&tools.node_bin_dir, &tools.node_images_dir)?;
        }
        let dir = fresh_dir(&opts.dir)?;
        let ports = allocate_ports(opts.apiserver_port)?;
        let token = pki::generate(&dir)?;
        pki::write_kubeconfig(
            &dir.join("kubeconfig"),
            &pki::Pki::paths(&dir).ca_cert,
            ports.apiserver,
            &token,
        )?;
        std::fs::write(dir.join("kwok-stages.yaml"), KWOK_STAGES)
            .map_err(|e| Error::io("write kwok-stages.yaml", e))?;
        let mut nodes = (1..=opts.nodes as u8)
            .map(node_record)
            .collect::<Result<Vec<_>>>()?;
        let real_nodes = if opts.real_nodes > 0 {
            let seed = u8::from_str_radix(&realnode::cluster_id(&dir)[..2], 16).unwrap_or(0);
            let subnet = realnode::net::free_subnet(seed)?;
            for index in opts.nodes + 1..=total {
                nodes.push(real_node_record(index as u8, subnet)?);
            }
            realnode::images::copy_into_cluster(&tools.node_images_dir, &dir)?;
            Some(RealNodes {
                subnet,
                node_bin_dir: tools.node_bin_dir,
                watchdog_timeout: opts.real_node_watchdog,
                node_status_update_frequency: opts.node_status_update_frequency,
            })
        } else {
            None
        };
        let state = State {
            profile: opts.profile,
            bin_dir: tools.bin_dir,
            sim_exe: tools.sim_exe,
            attach_delay: opts.attach_delay,
            detach_delay: opts.detach_delay,
            ports,
            nodes,
            real_nodes,
            agents: opts.agents.clone(),
            redfish: None,
            processes: Default::default(),
        };
        state.save(&dir)?;
        // From here on an error drops `cluster`, which kills what was started.
        let cluster = Cluster {
            dir,
            state: Mutex::new(state),
            down_on_drop: true,
        };
        if opts.redfish_bmcs {
            // Before the nodes boot: each node's BMC reads its system from the start.
            cluster.start_redfish()?;
        }
        cluster.boot().await?;
        Ok(cluster)
    }
}

/// Where the binaries a cluster runs are, each checked before anything starts.
struct Tools {
    bin_dir: PathBuf,
    sim_exe: PathBuf,
    node_bin_dir: PathBuf,
    node_images_dir: PathBuf,
}

impl Tools {
    fn check(opts: &ClusterOptions) -> Result<Tools> {
        let bin_dir = opts.bin_dir.clone().unwrap_or_else(default_bin_dir);
        bins::check(&bin_dir)?;
        let sidecar_dir = crate::csi::sidecars::default_bin_dir();
        let missing = crate::csi::sidecars::missing(&sidecar_dir);
        if !missing.is_empty() {
            return Err(Error::MissingCsiSidecars {
                dir: sidecar_dir,
                missing,
            });
        }
        let sim_exe = resolve_sim_exe(opts.sim_exe.as_deref())?;
        let node_bin_dir = opts
            .node_bin_dir
            .clone()
            .unwrap_or_else(realnode::default_node_bin_dir);
        let node_images_dir = opts
            .node_images_dir
            .clone()
            .unwrap_or_else(|| realnode::images::default_dir(&sim_exe));
        Ok(Tools {
            bin_dir,
            sim_exe,
            node_bin_dir,
            node_images_dir,
        })
    }
}

/// The cluster directory, created or emptied of a previous cluster's files; refused while a
/// process recorded there still runs.
fn fresh_dir(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::io(format!("resolve {}", dir.display()), e))?;
    if let Some(old) = State::load(&dir)? {
        let alive = running(&old);
        if !alive.is_empty() {
            let running = alive
                .iter()
                .map(|(n, r)| format!("{n} pid {}", r.pid))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::DirInUse { dir, running });
        }
    }
    for stale in [
        "etcd",
        "pki",
        "logs",
        "kwok-home",
        "kubeconfig",
        "kwok-stages.yaml",
        "nodes",
        "images",
    ] {
        remove_path(&dir.join(stale))?;
    }
    remove_path(&state::path(&dir))?;
    for sub in ["logs", "kwok-home"] {
        std::fs::create_dir_all(dir.join(sub))
            .map_err(|e| Error::io(format!("create {}", dir.join(sub).display()), e))?;
    }
    Ok(dir)
}

/// The control plane's ports on 127.0.0.1: the API server's as asked (it must be free), the
/// others free ones.
fn allocate_ports(apiserver_port: Option<u16>) -> Result<Ports> {
    let localhost = Ipv4Addr::LOCALHOST;
    let apiserver = match apiserver_port {
        Some(p) if !ports::port_is_free(localhost, p) => {
            return Err(Error::PortTaken {
                ip: localhost,
                port: p,
            });
        }
        Some(p) => p,
        None => free_port(localhost)?,
    };
    Ok(Ports {
        etcd_client: free_port(localhost)?,
        etcd_peer: free_port(localhost)?,
        apiserver,
        controller_manager: free_port(localhost)?,
        scheduler: free_port(localhost)?,
    })
}

fn resolve_sim_exe(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(Error::SimExeNotFound(format!(
                "{} does not exist",
                p.display()
            )))
        };
    }
    if let Some(p) = std::env::var_os("PODHA_SIM_EXE").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::SimExeNotFound(format!(
                "PODHA_SIM_EXE={} does not exist",
                p.display()
            )))
        };
    }
    let me = std::env::current_exe().map_err(|e| Error::io("current_exe", e))?;
    if me.file_name().is_some_and(|n| n == "podha-sim") {
        return Ok(me);
    }
    let candidates: Vec<PathBuf> = me
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("podha-sim"))
        .collect();
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .ok_or_else(|| {
            Error::SimExeNotFound(format!(
                "looked for {}",
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

fn real_node_record(index: u8, subnet: u8) -> Result<NodeRecord> {
    if index == 0 || index > 250 {
        return Err(Error::Other(format!(
            "node index {index} out of range 1..=250"
        )));
    }
    Ok(NodeRecord {
        name: format!("node-{index}"),
        index,
        ip: realnode::net::node_ip(subnet, index),
        port: realnode::KUBELET_PORT,
        real: true,
        agent_port: None,
        agent_cut: false,
        boot_id: None,
        system_uuid: Some(super::pki::random_uuid()?),
    })
}

fn remove_path(p: &Path) -> Result<()> {
    let res = if p.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    };
    match res {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", p.display()), e)),
    }
}

/// Names of the recorded processes that still run.
fn running(state: &State) -> Vec<(String, ProcRecord)> {
    state
        .processes
        .iter()
        .filter(|(_, r)| process::is_alive(r))
        .map(|(n, r)| (n.clone(), *r))
        .collect()
}
