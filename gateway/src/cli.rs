//! The `vmplane` command line. Every command has `--help` with an example.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// vmplane: a control plane for virtual machines whose event log is the source of truth.
#[derive(Debug, Parser)]
#[command(name = "vmplane", version, propagate_version = true)]
#[command(
    after_help = "Examples:\n  vmplane serve                      # serve ./vmplane-data on 127.0.0.1:50051\n  vmplane serve --data /var/lib/vmplane --listen 127.0.0.1:6443"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the vmplane server: open the log and serve the gRPC API.
    #[command(
        after_help = "Examples:\n  vmplane serve\n  vmplane serve --data ./vmplane-data --listen 127.0.0.1:50051\n  vmplane serve --listen 127.0.0.1:0   # any free port; the ready line says which"
    )]
    Serve(ServeArgs),
}

/// Storage backends for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The embedded log on sled, in `--data`.
    Sled,
}

impl Backend {
    /// The backend's name as the CLI and the API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sled => "sled",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Directory holding the log (created if missing).
    #[arg(long, value_name = "DIR", default_value = "./vmplane-data")]
    pub data: PathBuf,

    /// Address to serve gRPC on. Without authentication only loopback addresses are allowed.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Storage backend of the log.
    #[arg(long, value_enum, default_value_t = Backend::Sled)]
    pub backend: Backend,
}
