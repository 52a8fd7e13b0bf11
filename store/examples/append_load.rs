//! A load generator: `cargo run --release -p vmplane-store --example append_load -- WRITERS SECONDS`
//! appends 256-byte events from WRITERS threads for SECONDS and prints events/s, the group-commit
//! batch size and per-append latency percentiles.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use uuid::Uuid;
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, ProposedEvent, SledLog};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let writers: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let log = Arc::new(SledLog::open(dir.path()).expect("open"));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|writer| {
            let (log, stop) = (Arc::clone(&log), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let event = ProposedEvent {
                        id: Uuid::now_v7(),
                        event_type: "LoadEvent".into(),
                        schema_version: 1,
                        payload: vec![0x5a; 256],
                        actor: "load".into(),
                        correlation_id: Uuid::now_v7(),
                        causation_id: None,
                    };
                    let t = Instant::now();
                    log.append(AppendRequest::new(
                        format!("load/{writer}"),
                        ExpectedRevision::Any,
                        vec![event],
                    ))
                    .expect("append");
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("writer"))
        .collect();
    let elapsed = started.elapsed();
    latencies.sort();
    let stats = log.commit_stats();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "{writers} writers: {:.0} events/s, {:.1} events/commit, p50 {:?}, p99 {:?}",
        latencies.len() as f64 / elapsed.as_secs_f64(),
        stats.events as f64 / stats.commits.max(1) as f64,
        pct(0.5),
        pct(0.99)
    );
}
