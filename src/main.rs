use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use podha::leader::{DEFAULT_LEASE_NAME, LeaderConfig};
use podha::runtime::Options;

/// podha: fail stateful pods over when their node dies.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the PodHAPolicy CustomResourceDefinition as YAML.
    Crd,
    /// Run the operator.
    Run(RunArgs),
    /// Fault a workload's node N times and check that podha fails it over (see docs/install.md).
    Chaos(podha::chaos::ChaosArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Kubeconfig file; without it, in-cluster config or $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "PODHA_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "PODHA_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    leader_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    leader_lease: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else hostname and pid).
    #[arg(long)]
    identity: Option<String>,
    /// Lease duration, e.g. 15s.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    lease_duration: Duration,
    /// How long before expiry the leader renews, e.g. 5s.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    renew_grace: Duration,
    /// Log as JSON lines.
    #[arg(long, env = "PODHA_LOG_JSON")]
    log_json: bool,
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn client(kubeconfig: Option<PathBuf>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("invalid kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no Kubernetes configuration: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

async fn run(args: RunArgs) -> Result<(), String> {
    let client = client(args.kubeconfig).await?;
    let identity = args
        .identity
        .unwrap_or_else(podha::leader::default_identity);
    let mut leader = LeaderConfig::new(args.leader_namespace, identity);
    leader.lease_name = args.leader_lease;
    leader.lease_duration = args.lease_duration;
    leader.renew_grace = args.renew_grace;
    let opts = Options {
        http_addr: args.http_addr,
        leader,
        controller_name: "podha".to_string(),
    };
    podha::runtime::run(client, opts, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crd => match podha::api::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("podha: cannot render the CRD: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Chaos(args) => match tokio::runtime::Runtime::new() {
            Ok(runtime) => runtime.block_on(podha::chaos::cli(args)),
            Err(e) => {
                eprintln!("podha: cannot start the async runtime: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => {
            init_tracing(args.log_json);
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("podha: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "podha stopped");
                    eprintln!("podha: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
