//! Measures `admin backup` (over gRPC from an in-process server), `admin restore` and `admin
//! verify` on a log of `DR_EVENTS` (default 1,000,000) events built directly through the store,
//! each against a baseline measured in the same run:
//!
//! - backup: the log's own full read (`read_all` in chunks, in process, no gRPC, no file);
//! - restore: the previous restore path — a replay of the same backup through the ordinary
//!   durable `append` (one group commit per append of a stream's run of events), set
//!   `DR_BASELINE=0` to skip it;
//! - verify: the store's `verify` alone (hash chain, ids, every payload decoded), without the
//!   projections' rebuild and digest comparison.
//!
//! `cargo run --release -p vmplane-gateway --example dr_throughput`

use std::time::{Duration, Instant};

use clap::Parser;
use uuid::Uuid;
use vmplane_core::event::{CreateOrigin, FirmwareOrigin, VmiPhase};
use vmplane_core::{Event, encode};
use vmplane_gateway::cli::{Cli, Command};
use vmplane_gateway::dr;
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, ProposedEvent, SledLog};

const EVENTS_PER_VM: u64 = 100;

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

fn fill(log: &dyn EventLog, vms: u64) {
    for v in 0..vms {
        let name = format!("vm-{v}");
        let vmi = Uuid::new_v4();
        let manifest = format!(
            r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}","namespace":"bench"}},"spec":{{"runStrategy":"Always","template":{{"spec":{{"domain":{{"memory":{{"guest":"128Mi"}}}}}}}}}}}}"#
        );
        let mut events = vec![proposed(&Event::VmCreated(
            vmplane_core::event::VmCreated {
                uid: Uuid::new_v4(),
                namespace: "bench".into(),
                name: name.clone(),
                origin: CreateOrigin::Apply,
                manifest_json: manifest,
                firmware_uuid: Uuid::new_v4(),
                firmware_serial: Some("bench".into()),
                firmware_origin: FirmwareOrigin::Generated,
            },
        ))];
        for i in 1..EVENTS_PER_VM {
            events.push(proposed(&Event::VmiPhaseObserved(
                vmplane_core::event::VmiPhaseObserved {
                    vmi_uid: vmi,
                    phase: VmiPhase::Running,
                    reason: None,
                    message: Some(format!("heartbeat {i}")),
                    at_ms: 1_700_000_000_000 + i as i64,
                },
            )));
        }
        log.append(AppendRequest::new(
            format!("vm/bench/{name}"),
            ExpectedRevision::NoStream,
            events,
        ))
        .expect("append");
    }
}

fn main() -> anyhow::Result<()> {
    let events: u64 = std::env::var("DR_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let root = tempfile::tempdir()?;
    let data = root.path().join("data");
    let started = Instant::now();
    {
        let log = SledLog::open(&data)?;
        fill(&log, events / EVENTS_PER_VM);
        println!("built {} events in {:.1?}", log.head(), started.elapsed());
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen = format!("127.0.0.1:{port}");
    let cli = Cli::parse_from([
        "vmplane",
        "serve",
        "--data",
        data.to_str().unwrap(),
        "--listen",
        &listen,
        "--hypervisor",
        "none",
    ]);
    let Command::Serve(args) = cli.command else {
        unreachable!()
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(vmplane_gateway::server::serve(args, async {
        let _ = stopped.await;
    }));
    let global = Cli::parse_from([
        "vmplane",
        "--server",
        &format!("http://{listen}"),
        "get",
        "vms",
    ])
    .global;
    let out = root.path().join("backup");
    // Wait for the server (it builds its projections first).
    let mut ready = false;
    for _ in 0..600 {
        if std::net::TcpStream::connect(&listen).is_ok() {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(ready, "the server did not come up");
    let started = Instant::now();
    runtime.block_on(dr::backup(&global, &out))?;
    let secs = started.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&out)?.len();
    println!(
        "backup:  {events} events, {:.1} MB in {secs:.2}s = {:.0} events/s, {:.1} MB/s",
        bytes as f64 / 1e6,
        events as f64 / secs,
        bytes as f64 / 1e6 / secs
    );
    let _ = stop.send(());
    runtime.block_on(server)??;

    // Baseline for backup: the log's own full read, same process, same run.
    {
        let log = SledLog::open(&data)?;
        let started = Instant::now();
        let mut after = vmplane_store::Position(0);
        let mut read = 0u64;
        loop {
            let chunk = log.read_all(after, 1_000)?;
            let Some(last) = chunk.last() else { break };
            after = last.position;
            read += chunk.len() as u64;
        }
        let base = started.elapsed().as_secs_f64();
        println!(
            "  baseline, the log's own full read: {read} events in {base:.2}s = {:.0} events/s; backup / baseline = {:.2}x",
            read as f64 / base,
            (events as f64 / secs) / (read as f64 / base)
        );
    }

    let started = Instant::now();
    let restored = root.path().join("restored");
    let report = dr::restore(
        &out,
        &restored,
        dr::Cut::End,
        vmplane_gateway::cli::Backend::Sled,
    )?;
    let secs = started.elapsed().as_secs_f64();
    let import = report.import_time.as_secs_f64();
    println!(
        "restore: {} events, {:.1} MB in {secs:.2}s = {:.0} events/s, {:.1} MB/s (whole restore: import, projections' build and checkpoint)",
        report.events,
        report.bytes as f64 / 1e6,
        report.events as f64 / secs,
        report.bytes as f64 / 1e6 / secs
    );
    println!(
        "  import alone (read, check, write, {} durable syncs): {import:.2}s = {:.0} events/s, {:.1} MB/s",
        report.syncs,
        report.events as f64 / import,
        report.bytes as f64 / 1e6 / import
    );
    if std::env::var("DR_BASELINE").as_deref() != Ok("0") {
        let started = Instant::now();
        let replayed = replay_through_append(&out, &root.path().join("baseline"))?;
        let base = started.elapsed().as_secs_f64();
        println!(
            "  baseline, replay through the durable append path: {replayed} events in {base:.2}s = {:.0} events/s; import / baseline = {:.1}x",
            replayed as f64 / base,
            (report.events as f64 / import) / (replayed as f64 / base)
        );
    }
    let started = Instant::now();
    let v = dr::verify(&restored)?;
    let verify_secs = started.elapsed().as_secs_f64();
    println!(
        "verify:  {} events in {verify_secs:.2}s = {:.0} events/s, digest {}",
        v.events,
        v.events as f64 / verify_secs,
        v.digest
    );
    {
        let log = SledLog::open(&restored)?;
        let started = Instant::now();
        let r = log.verify(&|t, v, p| {
            vmplane_core::validate_payload(t, v, p).map_err(|e| e.to_string())
        })?;
        let base = started.elapsed().as_secs_f64();
        println!(
            "  baseline, the store's verify alone: {} events in {base:.2}s = {:.0} events/s; admin verify / baseline = {:.2}x",
            r.events,
            r.events as f64 / base,
            (v.events as f64 / verify_secs) / (r.events as f64 / base)
        );
    }
    Ok(())
}

/// The previous restore path: every run of one stream's events with one recorded-at (one
/// original append) replayed through `EventLog::append`, each made durable on its own.
fn replay_through_append(from: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<u64> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};
    use vmplane_store::{RecordedEvent, SledOptions, Timestamp};
    let clock = Arc::new(AtomicI64::new(i64::MIN));
    let options = SledOptions {
        clock: {
            let clock = Arc::clone(&clock);
            Arc::new(move || Timestamp(clock.load(Ordering::SeqCst)))
        },
        ..SledOptions::default()
    };
    let log = SledLog::open_with(dir, options)?;
    let mut run: Vec<RecordedEvent> = Vec::new();
    let flush = |run: &mut Vec<RecordedEvent>| -> anyhow::Result<()> {
        let Some(first) = run.first() else {
            return Ok(());
        };
        clock.store(first.recorded_at.0, Ordering::SeqCst);
        let request = AppendRequest::new(
            first.stream.clone(),
            ExpectedRevision::Exact(first.revision - 1),
            run.drain(..)
                .map(|e| ProposedEvent {
                    id: e.id,
                    event_type: e.event_type,
                    schema_version: e.schema_version,
                    payload: e.payload,
                    actor: e.actor,
                    correlation_id: e.correlation_id,
                    causation_id: e.causation_id,
                })
                .collect(),
        );
        log.append(request)?;
        Ok(())
    };
    dr::read_backup(from, |e| {
        let joins = run.last().is_some_and(|prev| {
            prev.stream == e.stream && prev.recorded_at == e.recorded_at && run.len() < 1_000
        });
        if !joins {
            flush(&mut run)?;
        }
        run.push(e.clone());
        Ok(())
    })?;
    flush(&mut run)?;
    Ok(log.head().0)
}
