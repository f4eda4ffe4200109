use clap::{Parser, Subcommand};

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
}

fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Command::Crd => match podha::api::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("podha: cannot render the CRD: {e}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}
