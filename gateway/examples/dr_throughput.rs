//! Measures `admin backup` (over gRPC from an in-process server) and `admin restore` on a log of
//! `DR_EVENTS` (default 1,000,000) events built directly through the store.
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

    let started = Instant::now();
    let restored = root.path().join("restored");
    let report = dr::restore(&out, &restored, dr::Cut::End)?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "restore: {} events, {:.1} MB in {secs:.2}s = {:.0} events/s, {:.1} MB/s (including the projections' build and checkpoint)",
        report.events,
        report.bytes as f64 / 1e6,
        report.events as f64 / secs,
        report.bytes as f64 / 1e6 / secs
    );
    let started = Instant::now();
    let v = dr::verify(&restored)?;
    println!(
        "verify:  {} events in {:.2}s, digest {}",
        v.events,
        started.elapsed().as_secs_f64(),
        v.digest
    );
    Ok(())
}
