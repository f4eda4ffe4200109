use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use podha::leader::{DEFAULT_LEASE_NAME, LeaderConfig};
use podha::runtime::Options;

/// podha: fail stateful pods over when their node dies.
#[derive(Parser)]
#[command(version = podha::build_info::LONG_VERSION, about)]
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
    /// Why podha would, or would not, fail a pod over: a pod, a node or a policy, read live
    /// (see docs/troubleshooting.md). Exit code 0 protected, 1 not, 2 no answer.
    Explain(podha::explain::ExplainArgs),
    /// Run the node agent: heartbeats for podha, fencing of its own node (see docs/agent.md).
    Agent(podha::agent::AgentArgs),
}

/// Every flag also reads a `PODHA_*` environment variable (a flag given wins).
#[derive(clap::Args)]
struct RunArgs {
    /// Kubeconfig file; without it, in-cluster config or $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "PODHA_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz. `[::]` listens on both families (on IPv4
    /// alone where the host has no IPv6).
    #[arg(long, env = "PODHA_HTTP_ADDR", default_value = "[::]:8080")]
    http_addr: SocketAddr,
    /// Namespace of the leader-election Lease (default: $POD_NAMESPACE, else "default").
    #[arg(long, env = "PODHA_LEADER_NAMESPACE")]
    leader_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, env = "PODHA_LEADER_LEASE", default_value = DEFAULT_LEASE_NAME)]
    leader_lease: String,
    /// This replica's identity in the Lease (default: $POD_NAME, else hostname and pid).
    #[arg(long, env = "PODHA_IDENTITY")]
    identity: Option<String>,
    /// Lease duration, e.g. 15s.
    #[arg(long, env = "PODHA_LEASE_DURATION", value_parser = humantime::parse_duration, default_value = "15s")]
    lease_duration: Duration,
    /// How long before expiry the leader renews, e.g. 5s.
    #[arg(long, env = "PODHA_RENEW_GRACE", value_parser = humantime::parse_duration, default_value = "5s")]
    renew_grace: Duration,
    /// Log as JSON lines.
    #[arg(long, env = "PODHA_LOG_JSON")]
    log_json: bool,
    /// Log filter, e.g. "info" or "podha=debug,info" (RUST_LOG syntax). Without it, $RUST_LOG,
    /// else "info".
    #[arg(long, env = "PODHA_LOG_LEVEL")]
    log_level: Option<String>,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("invalid --log-level {level:?}: {source}")]
    LogLevel {
        level: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error(transparent)]
    Kubeconfig(#[from] podha::kubeconfig::Error),
    #[error(transparent)]
    Operator(#[from] podha::runtime::Error),
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// The log filter: `--log-level`, else `RUST_LOG`, else `info`.
fn log_filter(level: Option<&str>) -> Result<tracing_subscriber::EnvFilter> {
    match level {
        Some(level) => {
            tracing_subscriber::EnvFilter::try_new(level).map_err(|source| Error::LogLevel {
                level: level.to_string(),
                source,
            })
        }
        None => Ok(tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))),
    }
}

/// Logs to stdout; colours only when stdout is a terminal (never in a container's log file).
fn init_tracing(json: bool, level: Option<&str>) -> Result<()> {
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(log_filter(level)?)
        .with_ansi(std::io::stdout().is_terminal());
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
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

async fn run(args: RunArgs) -> Result<()> {
    let client = podha::kubeconfig::client(args.kubeconfig.as_deref()).await?;
    let identity = args
        .identity
        .unwrap_or_else(podha::leader::default_identity);
    let namespace = args
        .leader_namespace
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| "default".to_string());
    let mut leader = LeaderConfig::new(namespace, identity);
    leader.lease_name = args.leader_lease;
    leader.lease_duration = args.lease_duration;
    leader.renew_grace = args.renew_grace;
    let opts = Options {
        http_addr: args.http_addr,
        leader,
        controller_name: "podha".to_string(),
    };
    podha::runtime::run(client, opts, shutdown_signal()).await?;
    Ok(())
}

/// Runs `command` on `runtime`, or says why the runtime could not start.
fn block_on(
    runtime: std::io::Result<tokio::runtime::Runtime>,
    command: impl std::future::Future<Output = ExitCode>,
) -> ExitCode {
    match runtime {
        Ok(runtime) => runtime.block_on(command),
        Err(e) => {
            eprintln!("podha: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
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
        Command::Chaos(args) => block_on(tokio::runtime::Runtime::new(), podha::chaos::cli(args)),
        Command::Explain(args) => {
            block_on(tokio::runtime::Runtime::new(), podha::explain::cli(args))
        }
        Command::Agent(args) => {
            if cfg!(not(target_os = "linux")) {
                eprintln!("podha agent: runs on Linux nodes only (it fences its node's kernel)");
                return ExitCode::FAILURE;
            }
            if let Err(e) = init_tracing(false, None) {
                eprintln!("podha: {e}");
                return ExitCode::FAILURE;
            }
            match args.worker_of {
                // The supervisor: one thread, the one its worker's parent-death signal is
                // tied to.
                None => block_on(
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build(),
                    podha::agent::supervisor_cli(args),
                ),
                Some(supervisor) => {
                    if let Err(e) = podha::agent::supervisor::die_with_supervisor(supervisor) {
                        eprintln!("podha agent: {e}");
                        return ExitCode::FAILURE;
                    }
                    block_on(tokio::runtime::Runtime::new(), podha::agent::cli(args))
                }
            }
        }
        Command::Run(args) => {
            if let Err(e) = init_tracing(args.log_json, args.log_level.as_deref()) {
                eprintln!("podha: {e}");
                return ExitCode::FAILURE;
            }
            block_on(tokio::runtime::Runtime::new(), async {
                match run(args).await {
                    Ok(()) => ExitCode::SUCCESS,
                    // Once, through the log (stdout), where the rest of the run is.
                    Err(e) => {
                        tracing::error!(error = %e, "podha stopped");
                        ExitCode::FAILURE
                    }
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn every_run_flag_has_a_podha_environment_variable() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("run subcommand");
        let mut flags = 0;
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            flags += 1;
            let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
            assert!(env.starts_with("PODHA_"), "--{id} has no PODHA_* variable");
        }
        assert_eq!(flags, 9);
    }

    #[test]
    fn version_names_the_commit_and_the_build_date() {
        let err = Cli::try_parse_from(["podha", "--version"])
            .err()
            .expect("--version ends parsing");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayVersion);
        let printed = err.to_string();
        assert_eq!(
            printed.trim_end(),
            format!("podha {}", podha::build_info::LONG_VERSION)
        );
        assert!(printed.contains(podha::build_info::GIT_COMMIT), "{printed}");
    }

    #[test]
    fn log_level_is_a_filter_and_a_bad_one_is_refused() {
        assert!(log_filter(Some("podha=debug,info")).is_ok());
        let err = log_filter(Some("podha=loud")).expect_err("invalid filter");
        assert!(err.to_string().contains("--log-level"), "{err}");
    }
}
