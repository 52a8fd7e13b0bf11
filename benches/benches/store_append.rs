//! Durable append: latency of one append beside a bare 4 KiB write + fdatasync, and throughput
//! with 1, 16 and 64 concurrent writers beside raw sled (insert + flush + fdatasync per writer,
//! the same durability) — all in the same run, so the figures read as ratios.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use uuid::Uuid;
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, ProposedEvent, SledLog};

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

fn single_append_latency(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut group = c.benchmark_group("durable_single_append");
    group
        .sample_size(60)
        .measurement_time(Duration::from_secs(6));

    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.path().join("bare"))
        .expect("bare file");
    let block = vec![0xa5u8; 4096];
    group.bench_function("baseline_bare_4KiB_write_fdatasync", |b| {
        b.iter(|| {
            file.write_all(&block).expect("write");
            file.sync_data().expect("fdatasync");
        })
    });

    let log = SledLog::open(dir.path().join("store")).expect("open");
    group.bench_function("store_append_1_event_256B", |b| {
        b.iter(|| {
            log.append(AppendRequest::new(
                "bench/single",
                ExpectedRevision::Any,
                vec![event()],
            ))
            .expect("append")
        })
    });
    group.finish();
}

/// Runs `iters` operations split over `writers` threads; returns the wall time.
fn concurrently(writers: u64, iters: u64, op: Arc<dyn Fn(u64, u64) + Send + Sync>) -> Duration {
    let barrier = Arc::new(Barrier::new(writers as usize + 1));
    let per_writer = iters.div_ceil(writers);
    let threads: Vec<_> = (0..writers)
        .map(|writer| {
            let (barrier, op) = (Arc::clone(&barrier), Arc::clone(&op));
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..per_writer {
                    op(writer, i);
                }
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    for thread in threads {
        thread.join().expect("writer");
    }
    // Report per requested iteration: scale for the rounding up of per_writer.
    started
        .elapsed()
        .mul_f64(iters as f64 / (per_writer * writers) as f64)
}

fn append_throughput(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path().join("store")).expect("open"));
    let raw = sled::open(dir.path().join("raw")).expect("raw sled");
    let raw_file = Arc::new(File::open(dir.path().join("raw").join("db")).expect("raw db file"));
    let raw = Arc::new(raw);
    let raw_key = Arc::new(AtomicU64::new(0));

    let mut group = c.benchmark_group("durable_append_throughput");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(1));
    for writers in [1u64, 16, 64] {
        let store_op: Arc<dyn Fn(u64, u64) + Send + Sync> = {
            let log = Arc::clone(&log);
            Arc::new(move |writer, _| {
                let stream = format!("bench/{writer}");
                log.append(AppendRequest::new(
                    stream,
                    ExpectedRevision::Any,
                    vec![event()],
                ))
                .expect("append");
            })
        };
        group.bench_function(format!("store_{writers}_writers"), |b| {
            b.iter_custom(|iters| concurrently(writers, iters, Arc::clone(&store_op)))
        });
        let raw_op: Arc<dyn Fn(u64, u64) + Send + Sync> = {
            let (raw, raw_file, raw_key) = (
                Arc::clone(&raw),
                Arc::clone(&raw_file),
                Arc::clone(&raw_key),
            );
            Arc::new(move |_, _| {
                let key = raw_key.fetch_add(1, Ordering::Relaxed).to_be_bytes();
                raw.insert(key, vec![0x5a; PAYLOAD_BYTES + 64])
                    .expect("insert");
                raw.flush().expect("flush");
                raw_file.sync_data().expect("fdatasync");
            })
        };
        group.bench_function(format!("baseline_raw_sled_{writers}_writers"), |b| {
            b.iter_custom(|iters| concurrently(writers, iters, Arc::clone(&raw_op)))
        });
    }
    group.finish();
}

criterion_group!(benches, single_append_latency, append_throughput);
criterion_main!(benches);
