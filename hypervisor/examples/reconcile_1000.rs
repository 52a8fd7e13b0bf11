//! Measures the reconciler: COUNT VMs (runStrategy Always) started, then stopped, on a private
//! libvirt test-driver node, with the real log (sled) and core behind the tests' control plane.
//! Prints the time until all are Running and until all are Stopped, the passes it took, and
//! the libvirt calls and events per VM.
//!
//! `cargo run -p vmplane-hypervisor --release --example reconcile_1000 [-- COUNT]`

#[path = "../tests/libvirt/log_control_plane.rs"]
mod log_control_plane;

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log_control_plane::LogControlPlane;
use vmplane_core::event::VmiPhase;
use vmplane_core::{VmCommand, VmState};
use vmplane_hypervisor::{
    CallCounts, ControlPlane, LibvirtHypervisor, Nodes, Reconciler, ReconcilerOptions,
};

fn vm_yaml(i: usize) -> String {
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\n\
         metadata: {{name: vm{i}, namespace: bench}}\n\
         spec:\n  runStrategy: Always\n  template:\n    spec:\n      domain:\n        \
         cpu: {{sockets: 1}}\n        memory: {{guest: 64Mi}}\n        devices: {{}}\n"
    )
}

fn count(cp: &LogControlPlane, pred: impl Fn(&VmState) -> bool) -> usize {
    cp.vms()
        .map(|vms| vms.iter().filter(|s| pred(s)).count())
        .unwrap_or(0)
}

/// Passes until `done` holds (at most `passes_max`); returns the time and the passes.
fn run_until(
    reconciler: &mut Reconciler,
    passes_max: usize,
    done: impl Fn() -> bool,
) -> Result<(Duration, usize), Box<dyn Error>> {
    let start = Instant::now();
    for pass in 1..=passes_max {
        let report = reconciler.run_once();
        if let Some(e) = report.errors.first() {
            return Err(format!("pass {pass}: {e}").into());
        }
        if done() {
            return Ok((start.elapsed(), pass));
        }
    }
    Err(format!("not done after {passes_max} passes").into())
}

fn per_vm(calls: CallCounts, n: usize) -> String {
    let n = n as f64;
    format!(
        "{:.2} calls/VM ({:.2} changing: define {:.2}, start {:.2}, shutdown {:.2}, destroy {:.2}, undefine {:.2}; state {:.2}; list {} in all)",
        calls.total() as f64 / n,
        calls.mutating() as f64 / n,
        calls.define as f64 / n,
        calls.start as f64 / n,
        calls.shutdown as f64 / n,
        calls.destroy as f64 / n,
        calls.undefine as f64 / n,
        calls.state as f64 / n,
        calls.list,
    )
}

fn main() -> Result<(), Box<dyn Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1000);
    let dir = tempfile::tempdir()?;
    // Room for every VM: one vCPU and 64 MiB each, with headroom.
    let node_file = dir.path().join("node.xml");
    let cpus = n + 16;
    let memory_kib = (n as u64 + 16) * 64 * 1024;
    std::fs::write(
        &node_file,
        format!(
            "<node><cpu><mhz>2000</mhz><model>i686</model><active>{cpus}</active><nodes>1</nodes>\
             <sockets>1</sockets><cores>{cpus}</cores><threads>1</threads></cpu>\
             <memory>{memory_kib}</memory></node>\n"
        ),
    )?;
    let hv = Arc::new(LibvirtHypervisor::open(&format!(
        "test://{}",
        node_file.display()
    ))?);
    let mut nodes = Nodes::default();
    nodes.add("node1".into(), hv)?;
    let log_dir = dir.path().join("log");
    std::fs::create_dir_all(&log_dir)?;
    let cp = LogControlPlane::open(&log_dir);

    let applied = Instant::now();
    for i in 0..n {
        cp.apply_vm(&vm_yaml(i));
    }
    println!(
        "{n} VMs applied (1 event each, durable appends, not counted below) in {:.2?}",
        applied.elapsed()
    );

    let dyn_cp: Arc<dyn ControlPlane> = cp.clone();
    let mut reconciler = Reconciler::new(dyn_cp, nodes, ReconcilerOptions::default());
    let head = cp.head();
    let (took, passes) = run_until(&mut reconciler, 10, || {
        count(&cp, |s| {
            s.run
                .vmi
                .as_ref()
                .is_some_and(|v| v.phase == VmiPhase::Running)
        }) == n
    })?;
    let start_calls = reconciler.calls();
    println!(
        "all {n} Running after {:.3} s ({passes} passes, {} events appended = {:.1}/VM); {}",
        took.as_secs_f64(),
        cp.head() - head,
        (cp.head() - head) as f64 / n as f64,
        per_vm(start_calls, n)
    );
    let idle = reconciler.run_once();
    println!(
        "an idle pass over {n} running VMs: {} events, {} changing calls, {} calls in all",
        idle.events_appended,
        idle.calls.mutating(),
        idle.calls.total()
    );

    let stopped_at = Instant::now();
    for i in 0..n {
        cp.user_vm("bench", &format!("vm{i}"), VmCommand::Stop);
    }
    println!(
        "{n} stop requests recorded in {:.2?} (not counted below)",
        stopped_at.elapsed()
    );
    let head = cp.head();
    let before = reconciler.calls();
    let (took, passes) = run_until(&mut reconciler, 10, || {
        count(&cp, |s| s.run.vmi.is_none()) == n
    })?;
    let after = reconciler.calls();
    let stop_calls = CallCounts {
        list: after.list - before.list,
        state: after.state - before.state,
        define: after.define - before.define,
        start: after.start - before.start,
        shutdown: after.shutdown - before.shutdown,
        destroy: after.destroy - before.destroy,
        undefine: after.undefine - before.undefine,
    };
    println!(
        "all {n} Stopped (domain shut off and undefined) after {:.3} s ({passes} passes, {} events = {:.1}/VM); {}",
        took.as_secs_f64(),
        cp.head() - head,
        (cp.head() - head) as f64 / n as f64,
        per_vm(stop_calls, n)
    );
    Ok(())
}
