//! The `vmplane` binary: server (`vmplane serve`) and client, in kubectl's habits.

use clap::Parser;
use vmplane_gateway::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => vmplane_gateway::server::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One clear line: the context chain, outermost first.
            eprintln!("vmplane: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
