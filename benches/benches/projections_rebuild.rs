//! Projections: rebuild throughput over 1M events beside the raw log scan of the same log (same
//! run; also as the median ratio of interleaved pairs), time travel to a random revision among
//! 10,000 (the object's JSON text, as the gateway answers it) beside one `read_event` of the
//! same log, and restart from a checkpoint. Resident memory after loading 100,000 VMs is
//! measured in a process of its own (an allocator keeps what earlier benches freed):
//! `cargo run --release -p vmplane-projections --example memory_100k`.
//!
//! The log is filled directly with core-encoded events (VmCreated with a real manifest, then
//! VMI lifecycle observations), as the command path would write them.

use std::hint::black_box;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::Rng;
use uuid::Uuid;
use vmplane_core::event::{CreateOrigin, FirmwareOrigin, VmiPhase};
use vmplane_core::types::Kind;
use vmplane_core::{Event, encode};
use vmplane_projections::{At, ProjectionOptions, Projections};
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, Position, ProposedEvent, SledLog};

/// The `vmplane` binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const EVENTS: u64 = 1_000_000;
/// `VMPLANE_BENCH_QUICK=1`: a fifth of the events and shorter measurements (the same shapes,
/// so same-run ratios stay comparable), for a quick look while changing the code.
const QUICK_EVENTS: u64 = 200_000;
const EVENTS_PER_VM: u64 = 100;

fn quick() -> bool {
    std::env::var_os("VMPLANE_BENCH_QUICK").is_some_and(|v| v != "0")
}
const TIME_TRAVEL_REVISIONS: u64 = 10_000;

fn manifest(ns: &str, name: &str, memory: u64) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}","namespace":"{ns}","labels":{{"app":"bench"}}}},"spec":{{"runStrategy":"Always","template":{{"metadata":{{"labels":{{"app":"bench"}}}},"spec":{{"domain":{{"memory":{{"guest":"{memory}Mi"}},"devices":{{"disks":[{{"name":"root","disk":{{"bus":"virtio"}}}}]}},"firmware":{{"uuid":"{}","serial":"bench"}}}},"volumes":[{{"name":"root","containerDisk":{{"image":"quay.io/containerdisks/fedora:40"}}}}]}}}}}}}}"#,
        Uuid::new_v4()
    )
}

fn proposed(event: &Event) -> ProposedEvent {
    let e = encode(event);
    ProposedEvent {
        id: Uuid::now_v7(),
        event_type: e.type_name.to_owned(),
        schema_version: e.version,
        payload: e.bytes,
        actor: "bench".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

fn created(ns: &str, name: &str) -> Event {
    Event::VmCreated(vmplane_core::event::VmCreated {
        uid: Uuid::new_v4(),
        namespace: ns.into(),
        name: name.into(),
        origin: CreateOrigin::Apply,
        manifest_json: manifest(ns, name, 128),
        firmware_uuid: Uuid::new_v4(),
        firmware_serial: Some("bench".into()),
        firmware_origin: FirmwareOrigin::Generated,
    })
}

fn observed(vmi: Uuid, i: u64) -> Event {
    Event::VmiPhaseObserved(vmplane_core::event::VmiPhaseObserved {
        vmi_uid: vmi,
        phase: VmiPhase::Running,
        reason: None,
        message: Some(format!("heartbeat {i}")),
        at_ms: 1_700_000_000_000 + i as i64,
    })
}

/// `vms` VMs of `per_vm` events each: VmCreated, VmiLaunched, then observations.
fn fill(log: &dyn EventLog, vms: u64, per_vm: u64) {
    for v in 0..vms {
        let name = format!("vm-{v}");
        let vmi = Uuid::new_v4();
        let mut events = vec![proposed(&created("bench", &name))];
        if per_vm > 1 {
            events.push(proposed(&Event::VmiLaunched(
                vmplane_core::event::VmiLaunched {
                    vmi_uid: vmi,
                    vm_generation: 1,
                    paused: false,
                    at_ms: 1_700_000_000_000,
                },
            )));
        }
        for i in 2..per_vm {
            events.push(proposed(&observed(vmi, i)));
        }
        log.append(AppendRequest::new(
            format!("vm/bench/{name}"),
            ExpectedRevision::NoStream,
            events,
        ))
        .expect("append");
    }
}

/// User + system processor time of the calling thread, in seconds.
fn thread_cpu() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn no_checkpoints() -> ProjectionOptions {
    ProjectionOptions {
        checkpoint_every_events: 0,
        ..ProjectionOptions::default()
    }
}

fn rebuild(c: &mut Criterion) {
    let events = if quick() { QUICK_EVENTS } else { EVENTS };
    let dir = tempfile::tempdir().expect("temp dir");
    let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path().join("log")).expect("open"));
    fill(log.as_ref(), events / EVENTS_PER_VM, EVENTS_PER_VM);
    assert_eq!(log.head(), Position(events));
    let projections =
        Projections::open(Arc::clone(&log), dir.path(), no_checkpoints()).expect("open");

    let mut group = c.benchmark_group(if quick() {
        "projections_rebuild_200k_quick"
    } else {
        "projections_rebuild_1M"
    });
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(if quick() { 3 } else { 10 }))
        .warm_up_time(Duration::from_secs(if quick() { 1 } else { 2 }));
    group.throughput(Throughput::Elements(events));
    group.bench_function("baseline_store_scan", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            log.scan(Position(0), &mut |e| {
                sum += e.payload.len() as u64 + e.revision;
                ControlFlow::Continue(())
            })
            .expect("scan");
            black_box(sum)
        });
    });
    group.bench_function("rebuild_read_model", |b| {
        b.iter(|| black_box(projections.rebuild().expect("rebuild")));
    });
    group.finish();

    // The same two, one right after the other, pair by pair: a shared machine's speed drifts
    // between criterion's two measurements above, and the ratio of each pair does not see it.
    // Also the calling thread's processor time for each (the scan and the fold run on it; the
    // replaced model is freed on a thread of its own, outside both): the ratio that holds still
    // when other work shares the machine, as wall time does not.
    let pairs = if quick() { 21 } else { 11 };
    let (mut ratios, mut cpu_ratios) = (Vec::with_capacity(pairs), Vec::with_capacity(pairs));
    let (mut scans, mut rebuilds) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let (started, cpu) = (Instant::now(), thread_cpu());
        let mut sum = 0u64;
        log.scan(Position(0), &mut |e| {
            sum += e.payload.len() as u64 + e.revision;
            ControlFlow::Continue(())
        })
        .expect("scan");
        black_box(sum);
        let (scan, scan_cpu) = (started.elapsed().as_secs_f64(), thread_cpu() - cpu);
        let (started, cpu) = (Instant::now(), thread_cpu());
        black_box(projections.rebuild().expect("rebuild"));
        let (rebuild, rebuild_cpu) = (started.elapsed().as_secs_f64(), thread_cpu() - cpu);
        ratios.push(scan / rebuild);
        cpu_ratios.push(scan_cpu / rebuild_cpu);
        scans.push(scan);
        rebuilds.push(rebuild);
    }
    for v in [&mut ratios, &mut cpu_ratios, &mut scans, &mut rebuilds] {
        v.sort_by(f64::total_cmp);
    }
    let median = |v: &[f64]| v[v.len() / 2];
    println!(
        "rebuild_vs_scan_interleaved: {pairs} pairs: rebuild throughput / scan throughput median \
         {:.2} (min {:.2}, max {:.2}); by the thread's processor time median {:.2} (min {:.2}, \
         max {:.2}); medians: scan {:.2}M events/s, rebuild {:.2}M events/s",
        median(&ratios),
        ratios[0],
        ratios[pairs - 1],
        median(&cpu_ratios),
        cpu_ratios[0],
        cpu_ratios[pairs - 1],
        events as f64 / median(&scans) / 1e6,
        events as f64 / median(&rebuilds) / 1e6,
    );

    // Restart with a checkpoint: open (load + tail of 0) and serve one read.
    projections.checkpoint().expect("checkpoint");
    drop(projections);
    let started = Instant::now();
    let reopened =
        Projections::open(Arc::clone(&log), dir.path(), no_checkpoints()).expect("reopen");
    let view = reopened
        .get(Kind::VirtualMachine, "bench", "vm-42", None)
        .expect("get")
        .expect("exists");
    let restart = started.elapsed();
    black_box(view);
    println!(
        "restart_with_checkpoint: {} streams, {} events: open + first read {:.1} ms",
        events / EVENTS_PER_VM,
        events,
        restart.as_secs_f64() * 1e3
    );
}

fn time_travel(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path().join("log")).expect("open"));
    fill(log.as_ref(), 1, TIME_TRAVEL_REVISIONS.min(1_000));
    let vmi = Uuid::new_v4();
    let mut revision = TIME_TRAVEL_REVISIONS.min(1_000);
    while revision < TIME_TRAVEL_REVISIONS {
        let mut events = Vec::new();
        for i in 0..500 {
            // Every 50th revision is a spec edit (JSON re-parsed by the fold), the rest heartbeats.
            if (revision + i).is_multiple_of(50) {
                events.push(proposed(&Event::VmSpecEdited(
                    vmplane_core::event::VmSpecEdited {
                        manifest_json: manifest("bench", "vm-0", 128 + revision + i),
                    },
                )));
            } else {
                events.push(proposed(&observed(vmi, revision + i)));
            }
        }
        log.append(AppendRequest::new(
            "vm/bench/vm-0",
            ExpectedRevision::Exact(revision),
            events,
        ))
        .expect("append");
        revision += 500;
    }
    let projections =
        Projections::open(Arc::clone(&log), dir.path(), no_checkpoints()).expect("open");
    let mut rng = rand::thread_rng();
    let mut group = c.benchmark_group("projections_time_travel");
    if quick() {
        group
            .measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_secs(1));
    }
    // What the gateway's GetObject at a revision asks for: the object's JSON text.
    group.bench_function("vm_at_random_revision_of_10000_warm", |b| {
        b.iter(|| {
            let r = rng.gen_range(1..=TIME_TRAVEL_REVISIONS);
            black_box(
                projections
                    .get_at_json(Kind::VirtualMachine, "bench", "vm-0", At::Revision(r))
                    .expect("get_at_json"),
            )
        });
    });
    // The same answer through the JSON tree (`get_at`, then the text the gateway sends).
    group.bench_function("vm_at_random_revision_of_10000_warm_via_tree", |b| {
        b.iter(|| {
            let r = rng.gen_range(1..=TIME_TRAVEL_REVISIONS);
            let view = projections
                .get_at(Kind::VirtualMachine, "bench", "vm-0", At::Revision(r))
                .expect("get_at");
            black_box(view.map(|v| v.object.to_string()))
        });
    });
    group.bench_function("vm_at_random_revision_of_10000_cold_cache", |b| {
        b.iter(|| {
            projections.cache().clear();
            let r = rng.gen_range(1..=TIME_TRAVEL_REVISIONS);
            black_box(
                projections
                    .state_at("vm/bench/vm-0", Kind::VirtualMachine, r)
                    .expect("state_at"),
            )
        });
    });
    group.bench_function("baseline_read_one_event", |b| {
        b.iter(|| {
            let p = rng.gen_range(1..=TIME_TRAVEL_REVISIONS);
            black_box(log.read_event(Position(p)).expect("read"))
        });
    });
    group.finish();
}

criterion_group!(benches, rebuild, time_travel);
criterion_main!(benches);
