//! `podha agent` processes with no API server to reach: what every node's agent faces when a
//! whole cluster powers up with the control plane still down, and what an agent cut off from
//! everything faces (it cannot read its peer list either). This test plays podha's leader
//! itself, probing one agent on loopback as podha does, then falling silent.
//!
//! - The agents podha never heard since they started do not fence, however long they go
//!   unheard: podha cannot be counting their silence (no reboot storm at a cold start).
//! - The agent podha heard, then no longer hears, fences within what it advertises, though it
//!   never learnt its peers: a peer list it could not read is not "no other node".
//!
//! The agents trust the leader key an earlier agent of their boot kept (as one restarted during
//! the outage would), and the test signs its heartbeats with it.
//!
//! Fences are `write:` to a file per agent; nothing here opens a watchdog or reboots, and every
//! record the agents keep is in the test's own directory.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use podha::contract::{HeartbeatAnswer, HeartbeatQuery, Identity};
use podha_sim::failover::http_get;

const ISOLATION_TIMEOUT: Duration = Duration::from_secs(8);

struct Agent {
    name: String,
    addr: SocketAddr,
    fence_file: PathBuf,
    child: Child,
}

impl Agent {
    fn start(dir: &Path, name: &str, kubeconfig: &Path, leader: &Identity) -> Agent {
        let addr = free_loopback_addr();
        let fence_file = dir.join(format!("{name}.fenced"));
        let boot_id = dir.join(format!("{name}.boot_id"));
        std::fs::write(&boot_id, format!("boot-of-{name}\n")).expect("boot id");
        std::fs::write(
            dir.join(format!("{name}.leader-key")),
            format!("boot=boot-of-{name}\n{}\n", leader.public()),
        )
        .expect("leader key");
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_podha"))
            .arg("agent")
            .arg(format!("--node={name}"))
            .arg(format!("--fence=write:{}=fenced", fence_file.display()))
            .arg(format!("--listen={addr}"))
            .arg(format!(
                "--isolation-timeout={}s",
                ISOLATION_TIMEOUT.as_secs()
            ))
            .arg("--survey-timeout=1s")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--boot-id-file={}", boot_id.display()))
            .arg(format!(
                "--boot-history-file={}",
                dir.join(format!("{name}.boots")).display()
            ))
            .arg(format!(
                "--hearing-file={}",
                dir.join(format!("{name}.heard")).display()
            ))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("podha agent starts");
        Agent {
            name: name.to_string(),
            addr,
            fence_file,
            child,
        }
    }

    fn fenced(&self) -> bool {
        self.fence_file.exists()
    }

    fn log(&self, dir: &Path) -> String {
        std::fs::read_to_string(dir.join(format!("{}.log", self.name))).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SIGTERM: the supervisor stops its worker; SIGKILL after a while if it did not.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_loopback_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// A kubeconfig whose API server is a loopback port nothing listens on: every request is
/// refused, as when the control plane is down or the node is cut off from it.
fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
    let port = free_loopback_addr().port();
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: down\n  cluster:\n    server: \
         https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: \
         down\n  context:\n    cluster: down\n    user: nobody\ncurrent-context: down\nusers:\n- \
         name: nobody\n  user:\n    token: none\n"
    );
    std::fs::write(&path, text).expect("kubeconfig");
    path
}

/// Probes `agent` every second for `for_how_long`, as podha's leader `leader` does (each probe
/// says how long ago the last answer came, and signs the agent's last challenge); returns when
/// the last answered probe was sent.
fn probe(agent: &Agent, leader: &Identity, for_how_long: Duration) -> Option<Instant> {
    let started = Instant::now();
    let mut answered: Option<Instant> = None;
    let mut challenge = String::new();
    while started.elapsed() < for_how_long {
        let sent = Instant::now();
        let query = HeartbeatQuery::signed(
            leader,
            &agent.name,
            answered.map(|at| sent.duration_since(at)),
            &challenge,
        );
        if let Ok(body) = http_get(agent.addr, &query.path_and_query()) {
            answered = Some(sent);
            if let Ok(answer) = serde_json::from_str::<HeartbeatAnswer>(&body) {
                challenge = answer.challenge;
            }
        }
        std::thread::sleep(Duration::from_secs(1).saturating_sub(sent.elapsed()));
    }
    answered
}

#[test]
fn without_an_api_server_only_the_agent_podha_heard_and_lost_fences() {
    let dir = std::env::temp_dir().join(format!("podha-agent-alone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = unreachable_kubeconfig(&dir);
    let started = Instant::now();
    let leader = Identity::generate().expect("key");
    let agents: Vec<Agent> = ["node-1", "node-2", "node-3"]
        .iter()
        .map(|n| Agent::start(&dir, n, &kubeconfig, &leader))
        .collect();

    // podha hears node-1 for 4 s, then falls silent; nobody ever probes node-2 or node-3.
    let last_heard = probe(&agents[0], &leader, Duration::from_secs(4))
        .unwrap_or_else(|| panic!("node-1's agent never answered: {}", agents[0].log(&dir)));
    // Fenced within what an agent without a watchdog advertises: the timeout, two checks and
    // surveys (1 s each, and the 1 s survey's half-second asks), the 2 s confirmation.
    let latest = ISOLATION_TIMEOUT + Duration::from_secs(12);
    let fenced_at = loop {
        if agents[0].fenced() {
            break last_heard.elapsed();
        }
        assert!(
            last_heard.elapsed() < latest,
            "node-1's agent, unheard for {latest:?} with its peers unknown, did not fence:\n{}",
            agents[0].log(&dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        fenced_at >= ISOLATION_TIMEOUT,
        "node-1 fenced {fenced_at:?} after podha last heard it, before its isolation timeout"
    );
    // Recorded before it was carried out, for the agent of the next boot to report.
    let record = std::fs::read_to_string(dir.join("node-1.boots.fences")).unwrap_or_default();
    assert!(
        record.starts_with("boot=boot-of-node-1\n") && record.trim_end().ends_with(" isolation"),
        "node-1's fence record: {record:?}"
    );
    // node-2 and node-3 go unheard for longer than that since they started.
    std::thread::sleep(latest.saturating_sub(started.elapsed()));
    for agent in &agents[1..] {
        assert!(
            !agent.fenced(),
            "{} fenced though podha never heard it:\n{}",
            agent.name,
            agent.log(&dir)
        );
    }
    drop(agents);
    let _ = std::fs::remove_dir_all(&dir);
}
