//! podha-csi: serve the CSI plugin, run the writer workload, check a volume's write log.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use podha_csi::controller::ControllerService;
use podha_csi::identity::IdentityService;
use podha_csi::node::NodeService;
use podha_csi::registration::RegistrationService;
use podha_csi::store::{Store, Volume};
use podha_csi::writer::Writer;
use podha_csi::{checker, server};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Fencing {
    On,
    Off,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Identity, and the Controller and/or Node service, on a unix socket.
    Serve(ServeArgs),
    /// Floods an address with connections that never finish their request, reopening each
    /// as soon as it is closed, and prints what happened as JSON: what any pod can do to the
    /// podha agent's port.
    Flood {
        #[arg(long)]
        target: std::net::SocketAddr,
        #[arg(long, default_value_t = 1500)]
        connections: usize,
        #[arg(long = "for", default_value = "60s", value_parser = humantime::parse_duration)]
        duration: Duration,
    },
    /// The writer workload: numbered writes to a volume through this node until killed.
    Write {
        /// The volume's directory as this pod sees it (its mount path).
        #[arg(long)]
        volume_dir: PathBuf,
        #[arg(long, env = "NODE_NAME")]
        node: String,
        #[arg(long, env = "POD_UID")]
        pod_uid: String,
        /// Acknowledged writes are appended here (keep it off the volume).
        #[arg(long)]
        acks: PathBuf,
        #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Stop after this many writes.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Report split-brain and lost acknowledged writes of a volume, as JSON.
    Check {
        #[arg(long)]
        volume_dir: PathBuf,
        /// Acknowledgement files of the volume's writers.
        #[arg(long, required_unless_present = "acks_dir")]
        acks: Vec<PathBuf>,
        /// A directory of `<pod uid>.acks` files: those of the pods the volume's log names are
        /// read (writers of other volumes are not this volume's).
        #[arg(long, conflicts_with = "acks")]
        acks_dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    driver: String,
    /// The shared directory holding every volume.
    #[arg(long)]
    store: PathBuf,
    /// Serve the Controller service.
    #[arg(long)]
    controller: bool,
    /// Serve the Node service as this node.
    #[arg(long)]
    node_id: Option<String>,
    /// Simulated ControllerPublishVolume time.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    attach_delay: Duration,
    /// Simulated ControllerUnpublishVolume time.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    detach_delay: Duration,
    /// Whether unpublish revokes a node's access to new volumes (StorageClass parameter
    /// `fencing: "on"|"off"` overrides it per volume).
    #[arg(long, value_enum, default_value = "on")]
    fencing: Fencing,
    /// Register the driver with the kubelet through this socket in its `plugins_registry`
    /// (what node-driver-registrar does elsewhere); needs --node-id.
    #[arg(long, requires = "node_id")]
    registration_socket: Option<PathBuf>,
    /// The CSI socket as the kubelet sees it, for the registration (default: --socket).
    #[arg(long, requires = "registration_socket")]
    kubelet_endpoint: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Colours only on a terminal: in a container, stdout is the node's log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    match Cli::parse().command {
        Command::Serve(args) => serve(args).await,
        Command::Flood {
            target,
            connections,
            duration,
        } => {
            let flooded = podha_csi::flood::flood(target, connections, duration).await;
            println!("{}", serde_json::to_string(&flooded)?);
            Ok(())
        }
        Command::Write {
            volume_dir,
            node,
            pod_uid,
            acks,
            interval,
            count,
        } => {
            let volume = Volume::at(&volume_dir)?;
            let writer = Writer {
                volume,
                node,
                pod_uid,
                acks,
                interval,
            };
            let stop = async {
                let _ = termination().await;
            };
            let stats = writer.run(count, stop).await?;
            println!(
                "acknowledged {} refused {}",
                stats.acknowledged, stats.refused
            );
            Ok(())
        }
        Command::Check {
            volume_dir,
            acks,
            acks_dir,
        } => {
            let volume = Volume::at(&volume_dir)?;
            let from = match &acks_dir {
                Some(dir) => checker::AcksFrom::Dir(dir),
                None => checker::AcksFrom::Files(&acks),
            };
            let report = checker::check_volume(&volume, from)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
    }
}

/// How long `serve` lets the answer to a refused registration go out before it stops.
const REFUSAL_ANSWERED_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// `podha-csi serve`: the CSI services (and the kubelet registration) until a termination
/// signal, a refused registration or a server's end.
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let (identity, controller, node) = services(&args)?;
    let ServeArgs {
        socket,
        registration_socket,
        kubelet_endpoint,
        ..
    } = args;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let (refused, mut refusals) = tokio::sync::mpsc::unbounded_channel();
    let registration_path = registration_socket.clone();
    let registration = registration_socket.map(|path| {
        let service = RegistrationService {
            driver: identity.driver.clone(),
            endpoint: kubelet_endpoint.unwrap_or_else(|| socket.clone()),
            refused,
        };
        (path, service)
    });
    let csi = server::serve(
        &socket,
        identity,
        controller,
        node,
        until_stopped(stopped.clone()),
    );
    let registration = async {
        match registration {
            Some((path, service)) => {
                server::serve_registration(&path, service, until_stopped(stopped.clone())).await
            }
            None => Ok(()),
        }
    };
    let servers = async { tokio::try_join!(csi, registration) };
    tokio::pin!(servers);
    let outcome = tokio::select! {
        served = &mut servers => {
            served?;
            anyhow::bail!("the servers stopped");
        }
        signal = termination() => signal,
        Some(error) = refusals.recv() => {
            // The refusal is told from inside the kubelet's call: let its answer go out before
            // the servers stop (stopping at once could drop it with the connection).
            tokio::time::sleep(REFUSAL_ANSWERED_WITHIN).await;
            Err(anyhow::anyhow!("the kubelet refused the registration: {error}"))
        }
    };
    let _ = stop.send(true);
    // A graceful stop waits for open connections (the kubelet keeps one); give them a
    // moment, then go anyway.
    match tokio::time::timeout(std::time::Duration::from_secs(2), &mut servers).await {
        Ok(served) => served.map(drop)?,
        Err(_) => tracing::info!("connections still open; stopping anyway"),
    }
    server::remove_socket(&socket);
    if let Some(path) = &registration_path {
        server::remove_socket(path);
    }
    outcome
}

/// The Identity service, and the Controller and Node services asked for (at least one).
fn services(
    args: &ServeArgs,
) -> anyhow::Result<(
    IdentityService,
    Option<ControllerService>,
    Option<NodeService>,
)> {
    let store = Store::new(args.store.clone())?;
    let controller = args.controller.then(|| ControllerService {
        store: store.clone(),
        driver: args.driver.clone(),
        attach_delay: args.attach_delay,
        detach_delay: args.detach_delay,
        fencing: matches!(args.fencing, Fencing::On),
    });
    let node = args.node_id.clone().map(|node_id| NodeService {
        store,
        driver: args.driver.clone(),
        node_id,
    });
    anyhow::ensure!(
        controller.is_some() || node.is_some(),
        "serve needs --controller and/or --node-id"
    );
    let identity = IdentityService {
        driver: args.driver.clone(),
        controller: controller.is_some(),
    };
    Ok((identity, controller, node))
}

/// SIGTERM (how a container is stopped) or SIGINT.
async fn termination() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("stopping");
    Ok(())
}
