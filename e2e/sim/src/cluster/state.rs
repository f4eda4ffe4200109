//! `DIR/state.json`: what runs, on which ports, so that another `podha-sim` process (`down`,
//! `node kill`, `status`) can act on a cluster it did not start.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::process::ProcRecord;
use super::{Error, Profile, Result};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub apiserver: u16,
    pub controller_manager: u16,
    pub scheduler: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub index: u8,
    pub ip: Ipv4Addr,
    /// kwok's server port on `ip`, reported as the kubelet endpoint port.
    pub port: u16,
    /// A real node (kubelet and containerd in a network namespace, see `realnode`) rather than
    /// a kwok one.
    #[serde(default)]
    pub real: bool,
    /// The podha agent's port on `ip`, when the cluster runs agents (chosen free at the first
    /// start, kept across reboots while free).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_port: Option<u16>,
    /// podha is cut off from the agent's port ([`super::Cluster::cut_agent_off`]): a cut of
    /// the network, not of the machine, so it outlives the node's reboots.
    #[serde(default)]
    pub agent_cut: bool,
    /// The boot ID the sim gave the node's current boot (`status.nodeInfo.bootID`), which its
    /// podha agent is told as its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The machine's SMBIOS UUID, the one its BMC reports for its system and the node as its
    /// `status.nodeInfo.systemUUID`: every real node has one (`realnode::prepare` shows it to
    /// its kubelet); a kwok node has one under Redfish power (the sim writes it on the Node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_uuid: Option<String>,
}

/// The podha agents the cluster runs beside its kwok nodes (see [`super::agents`]; a real
/// node's agent is a pod of podha's chart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agents {
    /// The podha executable.
    pub exe: PathBuf,
    #[serde(with = "humantime_serde_compat")]
    pub isolation_timeout: Duration,
    /// The agents' `--survey-timeout`; `None`: the agent's default.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde_compat::option"
    )]
    pub survey_timeout: Option<Duration>,
    /// With a timeout, every kwok node also has a BMC (`super::bmc`) whose watchdog of that
    /// timeout its agent pets, as the chart's agent on a real node; `None`: no watchdog.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde_compat::option"
    )]
    pub watchdog_timeout: Option<Duration>,
}

/// What the cluster's real nodes share.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RealNodes {
    /// The third octet of their subnet, 172.31.<subnet>.0/24.
    pub subnet: u8,
    /// Where the kubelet is.
    pub node_bin_dir: PathBuf,
    /// The timeout of the watchdog each node's BMC keeps (see `super::bmc`); `None`: the BMCs
    /// have no watchdog.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde_compat::option"
    )]
    pub watchdog_timeout: Option<Duration>,
    /// The kubelets' `nodeStatusUpdateFrequency`; `None`: the kubelet's default.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde_compat::option"
    )]
    pub node_status_update_frequency: Option<Duration>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub profile: Profile,
    pub bin_dir: PathBuf,
    pub sim_exe: PathBuf,
    #[serde(with = "humantime_serde_compat")]
    pub attach_delay: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub detach_delay: Duration,
    pub ports: Ports,
    pub nodes: Vec<NodeRecord>,
    /// Set when the cluster has real nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub real_nodes: Option<RealNodes>,
    /// Set when the cluster runs podha agents on its kwok nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Agents>,
    /// Set when the nodes' BMCs get their power from the cluster's Redfish service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redfish: Option<super::redfish::RedfishAccess>,
    /// Running (or last started) processes by name; removed when killed on purpose.
    pub processes: BTreeMap<String, ProcRecord>,
}

impl State {
    /// Records the boot ID the sim gave `node`.
    pub(in crate::cluster) fn record_boot_id(&mut self, node: &str, boot_id: Option<String>) {
        if let Some(rec) = self.nodes.iter_mut().find(|n| n.name == node) {
            rec.boot_id = boot_id;
        }
    }
}

/// Durations as humantime strings ("1s 500ms") so the file stays readable.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }

    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

impl State {
    /// Reads `DIR/state.json`; `Ok(None)` when there is none.
    pub fn load(dir: &Path) -> Result<Option<State>> {
        let p = path(dir);
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("read {}", p.display()), e)),
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            Error::Other(format!(
                "{} is not a podha-sim state file: {e}",
                p.display()
            ))
        })
    }

    /// Writes `DIR/state.json` atomically (temp file + rename).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let p = path(dir);
        let tmp = dir.join(format!(".state.json.{}", std::process::id()));
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Other(format!("serialize state: {e}")))?;
        std::fs::write(&tmp, text).map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &p).map_err(|e| Error::io(format!("write {}", p.display()), e))
    }

    pub fn node(&self, name: &str) -> Result<&NodeRecord> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| Error::UnknownNode {
                name: name.to_string(),
                known: self.nodes.iter().map(|n| n.name.clone()).collect(),
            })
    }
}
