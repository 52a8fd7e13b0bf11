//! Bulk import (`SledLog::importer`) against its baseline, in one run: builds a log of
//! `EVENTS` (default 1,000,000) 256-byte events in appends of 100 per stream, reads it back, then
//!
//! - baseline: replays the same envelopes through the durable `append` path (one commit per
//!   original append), the way a restore used to;
//! - imports them with `ImportOptions` (env `SYNC_EVENTS`, `SYNC_BYTES`, `VALUE_EVENTS`,
//!   `VALUE_BYTES` override the defaults),
//!
//! and prints events/s and MB/s of each, and the ratio.
//!
//! `cargo run --release -p vmplane-store --example import_probe`

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use uuid::Uuid;
use vmplane_store::sled_log::ImportOptions;
use vmplane_store::{
    AppendRequest, EventLog, ExpectedRevision, Position, ProposedEvent, RecordedEvent, SledLog,
    SledOptions, Timestamp,
};

const PER_APPEND: usize = 100;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn proposed(i: usize) -> ProposedEvent {
    ProposedEvent {
        id: Uuid::now_v7(),
        event_type: "Noted".into(),
        schema_version: 1,
        payload: format!("{i:0256}").into_bytes(),
        actor: "probe".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let events = env("EVENTS", 1_000_000);
    let root = tempfile::tempdir()?;
    let source = SledLog::open(root.path().join("source"))?;
    let started = Instant::now();
    for a in 0..events / PER_APPEND {
        let batch = (0..PER_APPEND)
            .map(|i| proposed(a * PER_APPEND + i))
            .collect();
        source.append(AppendRequest::new(
            format!("thing/{a}"),
            ExpectedRevision::NoStream,
            batch,
        ))?;
    }
    let mut all: Vec<RecordedEvent> = Vec::with_capacity(events);
    loop {
        let after = all.last().map_or(Position(0), |e| e.position);
        let chunk = source.read_all(after, 10_000)?;
        if chunk.is_empty() {
            break;
        }
        all.extend(chunk);
    }
    drop(source);
    let bytes: usize = all.iter().map(|e| e.payload.len() + 200).sum();
    println!(
        "built and read {} events (~{:.1} MB of envelopes) in {:.1?}",
        all.len(),
        bytes as f64 / 1e6,
        started.elapsed()
    );

    let baseline = if env("BASELINE", 1) == 1 {
        let clock = Arc::new(AtomicI64::new(i64::MIN));
        let options = SledOptions {
            clock: {
                let clock = Arc::clone(&clock);
                Arc::new(move || Timestamp(clock.load(Ordering::SeqCst)))
            },
            ..SledOptions::default()
        };
        let log = SledLog::open_with(root.path().join("baseline"), options)?;
        let started = Instant::now();
        for chunk in all.chunks(PER_APPEND) {
            clock.store(chunk[0].recorded_at.0, Ordering::SeqCst);
            let request = AppendRequest::new(
                chunk[0].stream.clone(),
                ExpectedRevision::NoStream,
                chunk
                    .iter()
                    .map(|e| ProposedEvent {
                        id: e.id,
                        event_type: e.event_type.clone(),
                        schema_version: e.schema_version,
                        payload: e.payload.clone(),
                        actor: e.actor.clone(),
                        correlation_id: e.correlation_id,
                        causation_id: e.causation_id,
                    })
                    .collect(),
            );
            log.append(request)?;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "baseline, replay through append: {:.0} events/s, {:.1} MB/s ({secs:.2}s)",
            all.len() as f64 / secs,
            bytes as f64 / 1e6 / secs
        );
        Some(all.len() as f64 / secs)
    } else {
        None
    };

    let defaults = ImportOptions::default();
    let options = ImportOptions {
        sync_every_events: env("SYNC_EVENTS", defaults.sync_every_events),
        sync_every_bytes: env("SYNC_BYTES", defaults.sync_every_bytes),
        value_events_max: env("VALUE_EVENTS", defaults.value_events_max),
        value_bytes_max: env("VALUE_BYTES", defaults.value_bytes_max),
    };
    let mut log = SledLog::open(root.path().join("import"))?;
    let started = Instant::now();
    let mut importer = log.importer(options)?;
    for e in all {
        importer.push(e, &[])?;
    }
    let report = importer.finish()?;
    let secs = started.elapsed().as_secs_f64();
    let rate = report.events as f64 / secs;
    println!(
        "import {options:?}: {rate:.0} events/s, {:.1} MB/s ({secs:.2}s, {} syncs){}",
        bytes as f64 / 1e6 / secs,
        report.syncs,
        baseline
            .map(|b| format!("; import / baseline = {:.1}x", rate / b))
            .unwrap_or_default()
    );
    Ok(())
}
