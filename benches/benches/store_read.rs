//! Full-log read: `scan` (validated, zero-copy) and `read_all` (owned copies) over 1M events,
//! beside raw sled iteration of the same events stored one per key — in the same run.

use std::hint::black_box;
use std::ops::ControlFlow;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use uuid::Uuid;
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, Position, ProposedEvent, SledLog};

const EVENTS: u64 = 1_000_000;
/// Events per append while filling the log: about what one group commit holds under load.
const EVENTS_PER_APPEND: u64 = 50;
const PAYLOAD_BYTES: usize = 256;

fn event() -> ProposedEvent {
    ProposedEvent {
        id: Uuid::now_v7(),
        event_type: "BenchEvent".into(),
        schema_version: 1,
        payload: vec![0x5a; PAYLOAD_BYTES],
        actor: "bench".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

fn full_log_read(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store_dir = dir.path().join("store");
    {
        let log = SledLog::open(&store_dir).expect("open");
        for append in 0..EVENTS / EVENTS_PER_APPEND {
            let events = (0..EVENTS_PER_APPEND).map(|_| event()).collect();
            log.append(AppendRequest::new(
                format!("bench/{}", append % 1000),
                ExpectedRevision::Any,
                events,
            ))
            .expect("append");
        }
    }
    // The same events, one per key, as raw sled would hold them.
    let raw = sled::open(dir.path().join("raw")).expect("raw sled");
    {
        let log = SledLog::open(&store_dir).expect("reopen");
        let mut batch = sled::Batch::default();
        let mut pending = 0;
        log.scan(Position(0), &mut |e| {
            let mut value = Vec::with_capacity(e.payload.len() + 96);
            value.extend_from_slice(e.stream.as_bytes());
            value.extend_from_slice(e.id.as_bytes());
            value.extend_from_slice(e.hash);
            value.extend_from_slice(e.payload);
            batch.insert(&e.position.0.to_be_bytes(), value);
            pending += 1;
            if pending == 10_000 {
                raw.apply_batch(std::mem::take(&mut batch))
                    .expect("raw batch");
                pending = 0;
            }
            ControlFlow::Continue(())
        })
        .expect("scan");
        raw.apply_batch(batch).expect("raw batch");
        raw.flush().expect("raw flush");
    }
    let log = SledLog::open(&store_dir).expect("reopen");
    assert_eq!(log.head(), Position(EVENTS));

    let mut group = c.benchmark_group("full_log_read_1M");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(EVENTS));
    group.bench_function("store_scan_validated", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            let last = log
                .scan(Position(0), &mut |e| {
                    sum = sum.wrapping_add(
                        e.revision ^ e.payload.len() as u64 ^ u64::from(e.payload[0]),
                    );
                    ControlFlow::Continue(())
                })
                .expect("scan");
            assert_eq!(last, Position(EVENTS));
            black_box(sum)
        })
    });
    group.bench_function("store_read_all_owned_pages_10k", |b| {
        b.iter(|| {
            let mut after = Position(0);
            let mut count = 0u64;
            loop {
                let page = log.read_all(after, 10_000).expect("read_all");
                let Some(last) = page.last() else { break };
                after = last.position;
                count += page.len() as u64;
                black_box(&page);
            }
            assert_eq!(count, EVENTS);
        })
    });
    group.bench_function("baseline_raw_sled_iter_one_key_per_event", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            let mut count = 0u64;
            for item in raw.iter() {
                let (key, value) = item.expect("raw iter");
                sum = sum.wrapping_add(key.len() as u64 ^ value.len() as u64 ^ u64::from(value[0]));
                count += 1;
            }
            assert_eq!(count, EVENTS);
            black_box(sum)
        })
    });
    group.finish();
    let store_bytes = log.size_on_disk_bytes().unwrap_or(0);
    let raw_bytes = raw.size_on_disk().unwrap_or(0);
    eprintln!(
        "on disk: store {} MB ({:.2}x payload), raw sled {} MB",
        store_bytes >> 20,
        store_bytes as f64 / (EVENTS as f64 * PAYLOAD_BYTES as f64),
        raw_bytes >> 20
    );
}

criterion_group!(benches, full_log_read);
criterion_main!(benches);
