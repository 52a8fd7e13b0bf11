//! The `vmplane` binary: server (`vmplane serve`) and client, in kubectl's habits.

use std::process::ExitCode;

use clap::CommandFactory;
use vmplane_gateway::cli::{Cli, Command};
use vmplane_gateway::client::{self, Clients, Verb};

/// mimalloc (v3, transparent huge pages off) rather than the system allocator. Same-run A/B
/// (PERFORMANCE.md, "Allocator"): creates over gRPC at 64 clients 1.26x/s at 0.78x the
/// processor time per request, the command path filling 100,000 VMs 1.31x faster, at 1.17x the load
/// generator's peak resident memory and 1.07x the 100,000-VM process's. With huge pages on (the
/// library's default) the peak was ~2x: hence `no_thp`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::parse_args() {
        Ok(cli) => cli,
        // Help and version are what was asked for, printed as clap prints them.
        // A bare `vmplane` (or `vmplane admin`) prints the help, as clap does.
        Err(err)
            if !err.use_stderr()
                || err.kind()
                    == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            err.exit()
        }
        Err(err) => {
            eprintln!(
                "{}",
                vmplane_gateway::cli::usage_error_line(&err.render().to_string())
            );
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Serve(args) => vmplane_gateway::server::run(args).map(|()| ExitCode::SUCCESS),
        Command::Completion(args) => {
            // Written into memory first: clap_complete panics when its writer fails, as
            // a pipe whose reader stopped early does (`vmplane completion bash | head`).
            let mut cmd = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut cmd, "vmplane", &mut script);
            std::io::Write::write_all(&mut std::io::stdout().lock(), &script)
                .map_err(anyhow::Error::from)
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Admin(args) => vmplane_gateway::dr::run(&cli.global, args),
        command => run_client(&cli.global, command),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`vmplane get vms -o json | head`): nothing left to tell it.
        Err(err) if reader_gone(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // One clear line: the context chain, outermost first, each cause once.
            eprintln!(
                "vmplane: error: {}",
                vmplane_gateway::report::one_line(&err)
            );
            // `diff` reserves 1 for "different".
            ExitCode::from(2)
        }
    }
}

/// Whether `err` is a write to a closed pipe, as when the output is piped to `head`.
fn reader_gone(err: &anyhow::Error) -> bool {
    let broken = Some(std::io::ErrorKind::BrokenPipe);
    err.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == broken
            // serde_json keeps the write's error inside its own.
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == broken
    })
}

fn run_client(
    global: &vmplane_gateway::cli::GlobalArgs,
    command: Command,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut c = Clients::connect(global).await?;
        match &command {
            Command::Apply(a) => client::apply(&mut c, global, a, false).await?,
            Command::Import(a) => client::apply(&mut c, global, a, true).await?,
            Command::Get(a) => client::get(&mut c, global, a).await?,
            Command::Delete(a) => client::delete(&mut c, global, a).await?,
            Command::Patch(a) => client::patch(&mut c, global, a).await?,
            Command::Wait(a) => client::wait(&mut c, global, a).await?,
            Command::Label(a) => client::label(&mut c, global, a, client::Metadata::Labels).await?,
            Command::Annotate(a) => {
                client::label(&mut c, global, a, client::Metadata::Annotations).await?
            }
            Command::Start(a) => client::lifecycle(&mut c, global, a, Verb::Start).await?,
            Command::Stop(a) => client::lifecycle(&mut c, global, a, Verb::Stop).await?,
            Command::Restart(a) => client::lifecycle(&mut c, global, a, Verb::Restart).await?,
            Command::Expand(a) => client::expand(&mut c, global, a).await?,
            Command::Describe(a) => client::describe(&mut c, global, a).await?,
            Command::History(a) => client::history(&mut c, global, a).await?,
            Command::Diff(a) => {
                if client::diff(&mut c, global, a).await? {
                    return Ok(ExitCode::from(client::DIFF_DIFFERENT_EXIT));
                }
            }
            Command::Audit(a) => client::audit(&mut c, global, a).await?,
            Command::Watch(a) => client::watch(&mut c, global, a).await?,
            Command::Features(a) => client::features(&mut c, global, a).await?,
            Command::Snapshot(a) => client::snapshot(&mut c, global, a).await?,
            Command::Restore(a) => client::restore(&mut c, global, a).await?,
            Command::Clone(a) => client::clone_vm(&mut c, global, a).await?,
            Command::Serve(_) | Command::Completion(_) | Command::Admin(_) => {
                unreachable!("handled in main")
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
