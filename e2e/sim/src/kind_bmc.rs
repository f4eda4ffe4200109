//! The kind kit's BMCs (`podha-sim kind-bmc`): what the sim's BMC (`cluster::bmc`) is to a
//! real sim node, for kind's nodes, which are containers on the host's kernel, where neither
//! the kernel's watchdog nor a reboot may be used (either would reset the host).
//!
//! One process on the host, outside every node's container (a paused node does not pause it),
//! reads each node's watchdog and power FIFOs (`crate::bmc_fifo`) in `DIR/<node>/`, which kind
//! mounts into the node at `/podha-bmc` (e2e/kind/kind-config.yaml). It powers a node off as a
//! machine loses its power, its network and its processes at once: `docker network
//! disconnect`, then `docker kill` (every process in the container, frozen or not), then the
//! network connected again for the next start; a node found not running is off already. A
//! power-off that fails is tried again every tick until it takes: podha's proof counts on the
//! reset. Each power-off is appended to `DIR/fences.log` (`<unix ms> <node> <what was done>:
//! <why>`, `crate::bmc_fifo::append_fence`, what the kit checks no healthy node appears in) and
//! logged. A node powered off waits, disarmed, for its next
//! boot's agent to write to its watchdog (`docker start`: the kit's restore). It runs until it
//! is killed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::process::Command;
use tracing::{error, info};

use crate::bmc_fifo::{Controls, append_fence};

/// How often the BMCs look at their FIFOs.
const TICK: Duration = Duration::from_millis(100);

/// How long one `docker` command may take.
const DOCKER_TIMEOUT: Duration = Duration::from_secs(30);

/// One node's BMC.
struct Bmc {
    node: String,
    controls: Controls,
    /// Why the node is to be powered off, while a power-off has not taken.
    due: Option<String>,
    /// The networks a power-off under way disconnected the node from, kept until it is
    /// connected to them again.
    networks: Option<Vec<String>>,
}

/// Runs the BMCs of `nodes` (kind's container names) from `dir` until killed.
pub async fn run(
    dir: &Path,
    watchdog_timeout: Duration,
    docker: &Path,
    nodes: &[String],
) -> anyhow::Result<()> {
    if nodes.is_empty() {
        bail!("no node: name the kind nodes' containers");
    }
    let mut bmcs = Vec::new();
    for node in nodes {
        let fifos = dir.join(node);
        Controls::create(&fifos)?;
        bmcs.push(Bmc {
            node: node.clone(),
            controls: Controls::open(&fifos, Some(watchdog_timeout))?,
            due: None,
            networks: None,
        });
    }
    info!(?nodes, ?watchdog_timeout, dir = %dir.display(), "kind BMCs up");
    let log = dir.join("fences.log");
    loop {
        tokio::time::sleep(TICK).await;
        for bmc in &mut bmcs {
            if let Some(why) = bmc.controls.look(&bmc.node, Instant::now())? {
                bmc.due = Some(why);
            }
            let Some(why) = bmc.due.clone() else {
                continue;
            };
            match power_off(docker, &bmc.node, &mut bmc.networks).await {
                Ok(done) => {
                    bmc.controls.powered_off();
                    bmc.due = None;
                    info!(node = bmc.node, why, done, "node powered off");
                    // The kit misses a line and fails; the nodes keep their BMC.
                    if let Err(e) = append_fence(&log, &bmc.node, &format!("{done}: {why}")) {
                        error!(
                            node = bmc.node,
                            error = format!("{e:#}"),
                            "cannot log the power-off"
                        );
                    }
                }
                Err(e) => {
                    error!(
                        node = bmc.node,
                        why,
                        error = format!("{e:#}"),
                        "cannot power the node off: trying again"
                    )
                }
            }
        }
    }
}

/// Powers node `node`'s container off: what was done. As a machine's power, its network goes
/// at the same instant as its processes: the container is disconnected from its networks
/// first, then killed, then connected again for its next start (`docker start`). A kill alone
/// would leave the node's address answering for a moment with refusals from a kernel whose
/// processes are gone, which podha takes for a host up without its agent (it then proves no
/// fence by the agent's silence). `networks` keeps what a power-off that failed part way
/// disconnected, so that the next try connects the node to them again.
async fn power_off(
    docker: &Path,
    node: &str,
    networks: &mut Option<Vec<String>>,
) -> anyhow::Result<&'static str> {
    let state = docker_output(
        docker,
        &[
            "inspect",
            "--format",
            "{{.State.Running}}{{range $net, $_ := .NetworkSettings.Networks}} {{$net}}{{end}}",
            node,
        ],
    )
    .await?;
    let mut words = state.split_whitespace();
    let running = words.next() == Some("true");
    let mut connected: Vec<String> = words.map(str::to_string).collect();
    let done = if running {
        networks.get_or_insert_with(|| connected.clone());
        for network in std::mem::take(&mut connected) {
            docker_output(
                docker,
                &["network", "disconnect", "--force", &network, node],
            )
            .await?;
        }
        docker_output(docker, &["kill", node]).await?;
        "powered off"
    } else if networks.is_some() {
        "powered off"
    } else {
        return Ok("off already");
    };
    for network in networks.iter().flatten() {
        if !connected.contains(network) {
            docker_output(docker, &["network", "connect", network, node]).await?;
        }
    }
    *networks = None;
    Ok(done)
}

async fn docker_output(docker: &Path, args: &[&str]) -> anyhow::Result<String> {
    let run = Command::new(docker).args(args).kill_on_drop(true).output();
    let out = tokio::time::timeout(DOCKER_TIMEOUT, run)
        .await
        .with_context(|| format!("docker {} took over {DOCKER_TIMEOUT:?}", args.join(" ")))?
        .with_context(|| format!("run {}", docker.display()))?;
    if !out.status.success() {
        bail!(
            "docker {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `docker` client the BMCs power nodes off with: `$DOCKER`, else `docker` on the PATH.
pub fn docker_client() -> PathBuf {
    std::env::var_os("DOCKER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("docker"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_running_node_is_killed_and_a_stopped_one_is_off_already() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("podha-kind-docker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let docker = dir.join("docker");
        // Node `up` runs on network `kind`, every other is stopped; every call is logged.
        std::fs::write(
            &docker,
            "#!/bin/sh\necho \"$1 $2 ${4:-}\" >> \"$0.calls\"\n\
             if [ \"$1\" = inspect ]; then [ \"$4\" = up ] && echo true kind || echo false; fi\n",
        )
        .expect("write");
        std::fs::set_permissions(&docker, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut networks = None;
        assert_eq!(
            power_off(&docker, "up", &mut networks).await.expect("up"),
            "powered off"
        );
        assert_eq!(networks, None, "connected again");
        assert_eq!(
            power_off(&docker, "down", &mut networks)
                .await
                .expect("down"),
            "off already"
        );
        // A power-off that disconnected the node and failed after: the next try finds it
        // stopped and connects it again.
        let mut networks = Some(vec!["kind".to_string()]);
        assert_eq!(
            power_off(&docker, "down", &mut networks)
                .await
                .expect("retry"),
            "powered off"
        );
        assert_eq!(networks, None);
        let calls = std::fs::read_to_string(dir.join("docker.calls")).expect("calls");
        assert_eq!(
            calls.lines().collect::<Vec<_>>(),
            [
                "inspect --format up",
                "network disconnect kind",
                "kill up ",
                "network connect up",
                "inspect --format down",
                "inspect --format down",
                "network connect down",
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_docker_that_fails_is_an_error_not_a_power_off() {
        let err = power_off(Path::new("/bin/false"), "n", &mut None)
            .await
            .unwrap_err();
        assert!(format!("{err:#}").contains("docker inspect"), "{err:#}");
        let err = power_off(Path::new("/nonexistent/docker"), "n", &mut None)
            .await
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("/nonexistent/docker"),
            "{err:#}"
        );
    }
}
