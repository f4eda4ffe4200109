//! A real Redfish service for BMC tests: OpenStack's `sushy-tools` emulator (`make
//! sushy-tools`), over HTTPS with a certificate of its own CA and HTTP basic auth, with its fake
//! systems driver: systems from its configuration, their power state kept in its state
//! directory.
//!
//! The fake driver's behaviour, which tests must allow for: a reset is answered `204` at once
//! and applied 0–11 s later, and only when something reads the system after that time (its
//! `PowerState` changes on a read); a `ForceRestart` sets `Off` at once, then `On` later.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use podha::redfish::{Bmc, PowerState, ResetType};

use super::process::{self, ProcRecord};
use super::{Error, Result};

/// One system of the fake driver.
#[derive(Clone, Debug)]
pub struct FakeSystem {
    pub name: String,
    pub uuid: String,
    pub powered_on: bool,
}

impl FakeSystem {
    /// A system with a UUID of its own.
    pub fn new(name: &str, powered_on: bool) -> Result<Self> {
        Ok(Self::with_uuid(
            name,
            &super::pki::random_uuid()?,
            powered_on,
        ))
    }

    /// The system of a machine whose SMBIOS UUID is `uuid`.
    pub fn with_uuid(name: &str, uuid: &str, powered_on: bool) -> Self {
        Self {
            name: name.to_string(),
            uuid: uuid.to_string(),
            powered_on,
        }
    }
}

/// What an emulator serves, and to whom.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    pub systems: Vec<FakeSystem>,
    pub username: String,
    pub password: String,
    /// Refuse `ForceOff` and `GracefulShutdown` (`400`), as a BMC whose account may not power
    /// off does.
    pub power_off_disabled: bool,
    /// An address more for the serving certificate: the real nodes' bridge address, where
    /// they reach the emulator (`super::realnode::net`).
    pub also_at: Option<Ipv4Addr>,
}

/// A running emulator; killed on drop unless [`Emulator::detach`]ed.
pub struct Emulator {
    record: Option<ProcRecord>,
    systems: Vec<FakeSystem>,
    port: u16,
    ca_pem: String,
    log: PathBuf,
}

/// How long a node's system may take to say `On` when asked (the emulator: 11 s at most).
const POWER_ON_TIMEOUT: Duration = Duration::from_secs(40);

/// How long the emulator may take to listen (a Python start).
const START_TIMEOUT: Duration = Duration::from_secs(30);

impl Emulator {
    /// Starts an emulator in `dir` (emptied first).
    pub fn start(dir: &Path, config: &EmulatorConfig) -> Result<Self> {
        let exe = super::bins::sushy_emulator();
        if !exe.is_file() {
            return Err(Error::MissingSushyEmulator(exe));
        }
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("empty {}", dir.display()), e)),
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;

        let ca_pem = write_certificates(dir, config.also_at)?;
        write_file(
            &dir.join("htpasswd"),
            &format!("{}:{}\n", config.username, bcrypt(&exe, &config.password)?),
        )?;
        let port = super::ports::free_port(Ipv4Addr::LOCALHOST)
            .map_err(|e| Error::io("find a free port", e))?;
        let config_file = dir.join("emulator.conf");
        write_file(&config_file, &configuration(dir, port, config))?;

        let log = dir.join("emulator.log");
        let mut cmd = Command::new(&exe);
        cmd.arg("--config").arg(&config_file);
        let record = process::spawn("sushy-emulator", cmd, &log)?;
        let emulator = Self {
            record: Some(record),
            systems: config.systems.clone(),
            port,
            ca_pem,
            log,
        };
        emulator.wait_listening()?;
        Ok(emulator)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The port it listens on, on this host's loopback.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The system named `name`.
    ///
    /// # Panics
    /// When the emulator has no such system (a test's mistake).
    pub fn system(&self, name: &str) -> &FakeSystem {
        self.systems
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("the emulator has no system {name}"))
    }

    /// The CA that signs the emulator's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Every request the emulator served so far, as `METHOD path`, oldest first (from its
    /// log's request lines).
    pub fn requests(&self) -> Result<Vec<String>> {
        let log = std::fs::read_to_string(&self.log)
            .map_err(|e| Error::io(format!("read {}", self.log.display()), e))?;
        Ok(log
            .lines()
            .filter_map(|line| {
                let quoted = line.split('"').nth(1)?;
                let plain = strip_colours(quoted);
                let mut words = plain.split_whitespace();
                Some(format!("{} {}", words.next()?, words.next()?))
            })
            .collect())
    }

    /// The emulator's process, left running (a cluster's, killed by `down`).
    pub fn detach(mut self) -> Option<ProcRecord> {
        self.record.take()
    }

    fn wait_listening(&self) -> Result<()> {
        let started = Instant::now();
        loop {
            if !self.record.as_ref().is_some_and(process::is_alive) {
                return Err(Error::ProcessExited {
                    name: "sushy-emulator".to_string(),
                    log: self.log.clone(),
                    tail: process::log_tail(&self.log, 20),
                });
            }
            if std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::Timeout {
                    what: format!("sushy-emulator to listen on port {}", self.port),
                    secs: START_TIMEOUT.as_secs(),
                    logs: self.log.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(record) = self.record.take()
            && let Err(error) = process::kill("sushy-emulator", &record)
        {
            tracing::warn!(%error, "stopping sushy-emulator");
        }
    }
}

/// The process name of a cluster's Redfish service.
const REDFISH_PROC: &str = "redfish";

/// How a cluster's BMCs, and its tests, reach its Redfish service; each node is the system
/// named after it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RedfishAccess {
    /// Where this host reaches it: its loopback.
    pub address: String,
    /// The loopback port it listens on.
    pub port: u16,
    /// Where the real nodes and their pods reach it: the bridge's host address, forwarded to
    /// the loopback port (`super::realnode::net`). `None` in a cluster without real nodes.
    pub node_network_address: Option<String>,
    pub username: String,
    pub password: String,
    pub ca_file: PathBuf,
}

impl RedfishAccess {
    /// The same service as a pod on a real node reaches it (podha installed by its chart):
    /// its address on the nodes' network.
    pub fn from_nodes(&self) -> Result<Self> {
        let address = self.node_network_address.clone().ok_or_else(|| {
            Error::Other(
                "the cluster's Redfish service is reached from real nodes only in a cluster \
                 with real nodes"
                    .into(),
            )
        })?;
        Ok(Self {
            address,
            ..self.clone()
        })
    }

    /// A client of `node`'s system, each call bounded by [`SYSTEM_CALL_TIMEOUT`].
    pub fn system(&self, node: &str) -> Result<podha::redfish::Bmc> {
        let mut endpoint = self.endpoint(node)?;
        endpoint.timeout = SYSTEM_CALL_TIMEOUT;
        podha::redfish::Bmc::new(endpoint)
            .map_err(|e| Error::Other(format!("{node}'s Redfish system: {e}")))
    }

    /// The Secret podha finds `node`'s BMC by under `fencing.bmc.secretName: bmc-{node}`, in
    /// podha's `namespace`: this service's address, credentials and CA, `node`'s system,
    /// labelled as the BMC of node `bound_to` (`node` itself, but for a test of a Secret that
    /// leads elsewhere).
    pub fn secret(
        &self,
        node: &str,
        bound_to: &str,
        namespace: &str,
    ) -> Result<k8s_openapi::api::core::v1::Secret> {
        let ca = std::fs::read_to_string(&self.ca_file)
            .map_err(|e| Error::io(format!("read {}", self.ca_file.display()), e))?;
        let data: std::collections::BTreeMap<&str, &str> = [
            ("address", self.address.as_str()),
            ("username", self.username.as_str()),
            ("password", self.password.as_str()),
            ("systemId", node),
            ("ca.crt", ca.as_str()),
        ]
        .into();
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("bmc-{node}"),
                "namespace": namespace,
                "labels": { podha::api::BMC_NODE_LABEL: bound_to },
            },
            "stringData": data,
        }))
        .map_err(|e| Error::Other(format!("the BMC Secret of {node}: {e}")))
    }

    /// The endpoint of `node`'s system.
    pub fn endpoint(&self, node: &str) -> Result<podha::redfish::Endpoint> {
        let pem = std::fs::read(&self.ca_file)
            .map_err(|e| Error::io(format!("read {}", self.ca_file.display()), e))?;
        let redfish = |e: podha::redfish::Error| Error::Other(e.to_string());
        podha::redfish::Endpoint::new(
            &self.address,
            Some(node.to_string()),
            self.username.clone(),
            self.password.clone(),
            podha::redfish::Trust::from_ca_pem(&pem).map_err(redfish)?,
        )
        .map_err(redfish)
    }
}

impl super::Cluster {
    /// Starts the cluster's Redfish service, a system per node, each powered on: a real node's
    /// system has the machine's UUID (`realnode::prepare`), a kwok node's a new one.
    pub(in crate::cluster) fn start_redfish(&self) -> Result<()> {
        let mut st = self.lock();
        let systems = st
            .nodes
            .iter()
            .map(|n| match &n.system_uuid {
                Some(uuid) => Ok(FakeSystem::with_uuid(&n.name, uuid, true)),
                None => FakeSystem::new(&n.name, true),
            })
            .collect::<Result<Vec<_>>>()?;
        for (node, system) in st.nodes.iter_mut().zip(&systems) {
            node.system_uuid = Some(system.uuid.clone());
        }
        let bridge = st
            .real_nodes
            .as_ref()
            .map(|real| super::realnode::net::host_ip(real.subnet));
        let config = EmulatorConfig {
            systems,
            username: "podha".to_string(),
            password: super::pki::random_uuid()?,
            power_off_disabled: false,
            also_at: bridge,
        };
        let dir = self.dir.join("redfish");
        let emulator = Emulator::start(&dir, &config)?;
        let access = RedfishAccess {
            address: emulator.address(),
            port: emulator.port(),
            node_network_address: bridge.map(|ip| format!("https://{ip}:{}", emulator.port())),
            username: config.username,
            password: config.password,
            ca_file: dir.join("ca.crt"),
        };
        if let Some(record) = emulator.detach() {
            st.processes.insert(REDFISH_PROC.to_string(), record);
        }
        st.redfish = Some(access);
        st.save(&self.dir)
    }

    /// Under Redfish power, makes node `name`'s system say `On` before the node boots: a
    /// machine runs only while powered, and its BMC powers it off at the next `Off` it reads.
    pub(in crate::cluster) async fn power_system_on(&self, name: &str) -> Result<()> {
        let Some(access) = self.redfish() else {
            return Ok(());
        };
        let system = access.system(name)?;
        tokio::time::timeout(POWER_ON_TIMEOUT, bring_to(&system, name, ResetType::On))
            .await
            .map_err(|_| Error::Timeout {
                what: format!("{name}'s Redfish system to say On"),
                secs: POWER_ON_TIMEOUT.as_secs(),
                logs: self.dir.join("redfish"),
            })
    }

    /// How to reach the cluster's Redfish service, if its BMCs use one.
    pub fn redfish(&self) -> Option<RedfishAccess> {
        self.lock_reloaded().redfish.clone()
    }
}

/// The longest one call to a node's system may take: the emulator runs on this host.
const SYSTEM_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a system is read while waiting for it to change.
pub const READ_EVERY: Duration = Duration::from_millis(500);

/// How long after a reset the same reset is asked for again while the system does not read
/// as it should (the emulator applies one within 11 s; asking sooner would put the change off).
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(15);

/// Asks `system` for `reset` (again after [`ASK_AGAIN_AFTER`]) until a read says it took:
/// `Off` for `ForceOff`, `On` for `On`.
pub(in crate::cluster) async fn bring_to(system: &Bmc, node: &str, reset: ResetType) {
    let took = |state: &PowerState| match reset {
        ResetType::ForceOff => state.is_off(),
        ResetType::On => *state == PowerState::On,
    };
    let mut asked: Option<Instant> = None;
    loop {
        match system.power_state().await {
            Ok(state) if took(&state) => return,
            Ok(_) => {}
            Err(error) => tracing::warn!(node, %error, "reading the Redfish system's power state"),
        }
        if asked.is_none_or(|at| at.elapsed() > ASK_AGAIN_AFTER) {
            match system.reset(reset).await {
                Ok(()) => asked = Some(Instant::now()),
                Err(error) => {
                    tracing::warn!(node, %error, reset = reset.as_str(), "asking the Redfish system")
                }
            }
        }
        tokio::time::sleep(READ_EVERY).await;
    }
}

/// `text` without the ANSI colour sequences the emulator's web server writes around some
/// request lines.
fn strip_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The emulator's configuration file (Python, read by Flask's `from_pyfile`).
fn configuration(dir: &Path, port: u16, config: &EmulatorConfig) -> String {
    let systems: Vec<_> = config
        .systems
        .iter()
        .map(|s| {
            serde_json::json!({
                "uuid": s.uuid,
                "name": s.name,
                "power_state": if s.powered_on { "On" } else { "Off" },
                "nics": [],
            })
        })
        .collect();
    let path = |name: &str| serde_json::Value::from(dir.join(name).display().to_string());
    format!(
        "import json\n\
         SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
         SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
         SUSHY_EMULATOR_SSL_CERT = {cert}\n\
         SUSHY_EMULATOR_SSL_KEY = {key}\n\
         SUSHY_EMULATOR_AUTH_FILE = {auth}\n\
         SUSHY_EMULATOR_STATE_DIR = {state}\n\
         SUSHY_EMULATOR_FAKE_DRIVER = True\n\
         SUSHY_EMULATOR_FAKE_SYSTEMS = json.loads({systems})\n\
         SUSHY_EMULATOR_DISABLE_POWER_OFF = {power_off_disabled}\n",
        cert = path("tls.crt"),
        key = path("tls.key"),
        auth = path("htpasswd"),
        state = path("state"),
        systems = serde_json::Value::from(serde_json::Value::from(systems).to_string()),
        power_off_disabled = if config.power_off_disabled {
            "True"
        } else {
            "False"
        },
    )
}

/// A CA and a serving certificate for 127.0.0.1, localhost and `also_at`; returns the CA's PEM.
fn write_certificates(dir: &Path, also_at: Option<Ipv4Addr>) -> Result<String> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "podha-sim-bmc-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, &ca_key);

    let key = KeyPair::generate()?;
    let names = ["127.0.0.1".to_string(), "localhost".to_string()]
        .into_iter()
        .chain(also_at.map(|ip| ip.to_string()))
        .collect::<Vec<_>>();
    let mut serving = CertificateParams::new(names)?;
    serving.distinguished_name.push(DnType::CommonName, "bmc");
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = serving.signed_by(&key, &issuer)?;

    write_file(&dir.join("ca.crt"), &ca_cert.pem())?;
    write_file(&dir.join("tls.crt"), &cert.pem())?;
    write_file(&dir.join("tls.key"), &key.serialize_pem())?;
    Ok(ca_cert.pem())
}

/// `password`'s bcrypt digest, the one form the emulator's auth file takes, made by the
/// emulator's own Python (its venv holds `bcrypt`).
fn bcrypt(exe: &Path, password: &str) -> Result<String> {
    let python = exe.with_file_name("python3");
    let output = Command::new(&python)
        .args([
            "-c",
            "import bcrypt, sys; print(bcrypt.hashpw(sys.stdin.buffer.read(), bcrypt.gensalt(4)).decode())",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .map(|mut stdin| stdin.write_all(password.as_bytes()))
                .transpose()?;
            child.wait_with_output()
        })
        .map_err(|e| Error::io(format!("run {}", python.display()), e))?;
    if !output.status.success() {
        return Err(Error::Other(format!(
            "hashing a password with {}: {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(|e| Error::io(format!("write {}", path.display()), e))
}
