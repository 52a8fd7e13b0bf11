//! Times the read paths on a log of N events (default 200k, 50 per append):
//! `cargo run --release -p vmplane-store --example read_probe -- N`.

use std::ops::ControlFlow;
use std::time::Instant;

use uuid::Uuid;
use vmplane_store::{
    AppendRequest, Direction, EventLog, ExpectedRevision, Position, ProposedEvent, SledLog,
};

fn main() {
    let events: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let log = SledLog::open(dir.path()).expect("open");
    for append in 0..events / 50 {
        let batch = (0..50)
            .map(|_| ProposedEvent {
                id: Uuid::now_v7(),
                event_type: "ProbeEvent".into(),
                schema_version: 1,
                payload: vec![0x5a; 256],
                actor: "probe".into(),
                correlation_id: Uuid::now_v7(),
                causation_id: None,
            })
            .collect();
        log.append(AppendRequest::new(
            format!("probe/{}", append % 100),
            ExpectedRevision::Any,
            batch,
        ))
        .expect("append");
    }
    let t = Instant::now();
    let mut n = 0u64;
    log.scan(Position(0), &mut |_| {
        n += 1;
        ControlFlow::Continue(())
    })
    .expect("scan");
    println!("scan: {n} events in {:?}", t.elapsed());
    let t = Instant::now();
    let mut owned = Vec::new();
    log.scan(Position(0), &mut |e| {
        owned.push(e.to_owned_event());
        if owned.len() == 10_000 {
            owned.clear();
        }
        ControlFlow::Continue(())
    })
    .expect("scan");
    println!("scan + to_owned: {:?}", t.elapsed());
    for p in [0u64, events / 2, events - 20_000] {
        let t = Instant::now();
        log.read_all(Position(p), 10_000).expect("read_all");
        println!("read_all({p}, 10k): {:?}", t.elapsed());
    }
    let t = Instant::now();
    let mut after = Position(0);
    let mut pages = 0;
    while let Some(last) = log.read_all(after, 10_000).expect("read_all").last() {
        after = last.position;
        pages += 1;
    }
    println!("read_all 10k pages: {pages} pages in {:?}", t.elapsed());
    let t = Instant::now();
    for i in 0..1_000u64 {
        log.read_all(Position(i * (events / 1_000)), 10)
            .expect("read_all");
    }
    println!("read_all(p, 10) x1000: {:?} each", t.elapsed() / 1_000);
    let t = Instant::now();
    for i in 1..=1_000u64 {
        log.read_event(Position(i * (events / 1_000)))
            .expect("read_event");
    }
    println!("read_event x1000: {:?} each", t.elapsed() / 1_000);
    let t = Instant::now();
    for s in 0..100 {
        log.read_stream(&format!("probe/{s}"), 1, Direction::Forward, 100)
            .expect("read_stream");
    }
    println!("read_stream 100 events x100: {:?} each", t.elapsed() / 100);
    let t = Instant::now();
    log.verify(&|_, _, _| Ok(())).expect("verify");
    println!("verify: {:?}", t.elapsed());
}
