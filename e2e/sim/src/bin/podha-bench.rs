//! `podha-bench`: benchmarks on the sim cluster (`survey`: without one). They print figures;
//! they assert nothing.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use podha_sim::bench::failover::FailoverArgs;
use podha_sim::bench::postgres::PostgresArgs;
use podha_sim::bench::scale::ScaleArgs;
use podha_sim::bench::survey::SurveyArgs;

#[derive(Parser)]
#[command(
    name = "podha-bench",
    version,
    about = "podha benchmarks on the sim cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Failover time per mode (none, iomesh-like, default, fast), several trials each.
    Failover(FailoverArgs),
    /// PostgreSQL on real nodes through every fault (kill, freeze, isolation, API cut) and a
    /// control without a proof, each checked by PostgreSQL itself.
    Postgres(PostgresArgs),
    /// The operator at 1,000+ nodes: memory, CPU, request rate, a 50-node failure.
    Scale(ScaleArgs),
    /// One agent's peer survey while podha's leader is down, against thousands of fake peers
    /// on 127.0.0.1 (no cluster): time to decide, asks at once, memory.
    Survey(SurveyArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client=off")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match Cli::parse().command {
        Cmd::Failover(args) => podha_sim::bench::failover::run(args).await,
        Cmd::Postgres(args) => podha_sim::bench::postgres::run(args).await,
        Cmd::Scale(args) => podha_sim::bench::scale::run(args).await,
        Cmd::Survey(args) => podha_sim::bench::survey::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podha-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
