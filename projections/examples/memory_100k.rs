//! Resident memory of a process that has loaded 100,000 VMs (issue 5's memory target:
//! ≤ 300 MiB), the whole process, measured in a process of its own.
//!
//! ```sh
//! cargo run --release -p vmplane-projections --example memory_100k [-- VMS]
//! cargo run --release -p vmplane-projections --example memory_100k -- fill DIR [VMS]
//! cargo run --release -p vmplane-projections --example memory_100k -- measure DIR
//! ```
//!
//! Phase 1 (`fill`) creates a log and applies `VMS` (default 100,000) VirtualMachines through
//! the real command path, from several threads: manifests shaped like `examples/vm.yaml` (CPU,
//! memory, a disk, an interface, a network, a container disk), each with its own name and
//! labels; the command path defaults them, assigns firmware UUIDs and appends durably, as the
//! server does. Phase 2 (`measure`, a child process; give it a copy of a filled directory to
//! measure the same log again) opens the log and the projections the way `vmplane serve` does
//! (default options; no checkpoint yet, so the whole log is replayed and a checkpoint written),
//! settles the feature index (every VM's state folded through the bounded state cache) and
//! reads `VmRSS` from `/proc/self/status`: the figure. It then reads the whole log again and
//! renders every VM with its status one at a time (as a paged list does), and reports the
//! memory after each.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use vmplane_core::types::{Kind, parse_manifest};
use vmplane_projections::{Command, CommandHandler, CommandMeta, ProjectionOptions, Projections};
use vmplane_store::{EventLog, SledLog};

/// The `vmplane` binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WRITERS: u64 = 16;

fn manifest(i: u64) -> String {
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: vm-{i}
  namespace: team-{ns}
  labels:
    app: demo-{i}
spec:
  runStrategy: Manual
  template:
    metadata:
      labels:
        app: demo-{i}
    spec:
      domain:
        cpu:
          cores: 1
        memory:
          guest: 256Mi
        devices:
          disks:
            - name: rootdisk
              disk:
                bus: virtio
          interfaces:
            - name: default
              masquerade: {{}}
      networks:
        - name: default
          pod: {{}}
      terminationGracePeriodSeconds: 5
      volumes:
        - name: rootdisk
          containerDisk:
            image: quay.io/containerdisks/fedora:latest
"#,
        ns = i % 100
    )
}

/// `VmRSS` of this process, in KiB.
fn rss_kib() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("/proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "/proc/self/status has no VmRSS".to_owned())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn fill(dir: &Path, vms: u64) -> Result<(), Box<dyn std::error::Error>> {
    let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.join("log"))?);
    let projections = Projections::open(
        Arc::clone(&log),
        dir,
        ProjectionOptions {
            checkpoint_every_events: 0,
            ..ProjectionOptions::default()
        },
    )?;
    let commands = Arc::new(CommandHandler::new(
        Arc::clone(&log),
        Arc::clone(projections.cache()),
        Default::default(),
    ));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            let commands = Arc::clone(&commands);
            let next = Arc::clone(&next);
            std::thread::spawn(move || -> Result<(), String> {
                let meta = CommandMeta {
                    actor: "alice".into(),
                    ..CommandMeta::default()
                };
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= vms {
                        return Ok(());
                    }
                    let m = parse_manifest(manifest(i).as_bytes())
                        .map_err(|e| format!("manifest {i}: {e}"))?;
                    commands
                        .execute(&meta, Command::apply(m))
                        .map_err(|e| format!("apply vm-{i}: {e}"))?;
                }
            })
        })
        .collect();
    for w in writers {
        w.join().map_err(|_| "a writer panicked")??;
    }
    println!(
        "filled: {vms} VMs applied through the command path in {:.1} s ({} events)",
        started.elapsed().as_secs_f64(),
        log.head().0
    );
    Ok(())
}

fn measure(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let at_start = rss_kib()?;
    // As `vmplane serve` opens them (gateway/src/server.rs `open_log`, `open_projections`):
    // the log with its default options, then the projections (no checkpoint yet, so the whole
    // log is replayed and a checkpoint written) and a command handler over the same cache.
    let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.join("log"))?);
    let log_opened = rss_kib()?;
    let started = Instant::now();
    let projections = Projections::open(Arc::clone(&log), dir, ProjectionOptions::default())?;
    let _commands = CommandHandler::new(
        Arc::clone(&log),
        Arc::clone(projections.cache()),
        Default::default(),
    );
    let opened_in = started.elapsed();
    let opened = rss_kib()?;
    let usage = projections.feature_usage()?;
    let settled = rss_kib()?;
    // A second pass over every VM's state, as a reader of all of them would make.
    let mut events = 0u64;
    log.scan(vmplane_store::Position(0), &mut |_| {
        events += 1;
        std::ops::ControlFlow::Continue(())
    })?;
    projections.feature_usage()?;
    let read_through = rss_kib()?;
    let mut items = 0usize;
    let mut stopped = 0usize;
    let mut json_bytes = 0usize;
    projections.visit(Kind::VirtualMachine, None, None, |v| {
        items += 1;
        if v.object["status"]["printableStatus"] == "Stopped" {
            stopped += 1;
        }
        json_bytes += v.into_json().object.len();
    })?;
    let visited = rss_kib()?;
    if std::env::var("XSTOP").is_ok() {
        eprintln!("visited {:.1}", mib(visited));
        std::process::exit(0);
    }
    println!(
        "process start {:.1} MiB; log opened: {:.1} MiB",
        mib(at_start),
        mib(log_opened)
    );
    println!(
        "projections opened (replay of {} events, {:.0} ms): {:.1} MiB",
        projections.position().0,
        opened_in.as_secs_f64() * 1e3,
        mib(opened)
    );
    println!(
        "feature index settled ({} features in use, {} cached streams): {:.1} MiB",
        usage.len(),
        projections.cache().streams(),
        mib(settled)
    );
    println!(
        "after reading the whole log again ({events} events) and settling again: {:.1} MiB",
        mib(read_through)
    );
    println!(
        "after rendering all {items} VMs with status one at a time ({stopped} Stopped, {:.1} MiB of JSON): {:.1} MiB",
        json_bytes as f64 / (1u64 << 20) as f64,
        mib(visited)
    );
    println!(
        "memory_100k_vms: {:.1} MiB resident (the whole process) after loading {items} VMs (target ≤ 300 MiB); at most {:.1} MiB over the reads after it",
        mib(settled),
        mib(settled.max(read_through).max(visited))
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("measure") => {
            let dir = args.get(2).ok_or("measure DIR")?;
            return measure(Path::new(dir));
        }
        // `fill DIR [VMS]`: phase 1 only, into DIR, to measure it again and again.
        Some("fill") => {
            let dir = args.get(2).ok_or("fill DIR [VMS]")?;
            let vms = match args.get(3) {
                Some(n) => n.parse().map_err(|e| format!("VMS {n:?}: {e}"))?,
                None => 100_000,
            };
            std::fs::create_dir_all(dir)?;
            return fill(Path::new(dir), vms);
        }
        _ => {}
    }
    let vms: u64 = match args.get(1) {
        Some(n) => n.parse().map_err(|e| format!("VMS {n:?}: {e}"))?,
        None => 100_000,
    };
    let dir = tempfile::tempdir()?;
    fill(dir.path(), vms)?;
    let status = std::process::Command::new(std::env::current_exe()?)
        .arg("measure")
        .arg(dir.path())
        .status()?;
    if !status.success() {
        return Err(format!("the measuring process failed: {status}").into());
    }
    Ok(())
}
