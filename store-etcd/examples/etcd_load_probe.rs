//! Load probe: append throughput of `EtcdLog` with 1, 16, 64 and 256 writers on a real 3-member
//! cluster, beside raw etcd puts of the same size and concurrency in the same run (the baseline:
//! what etcd itself does per request on this machine), then raw group transactions of the
//! former and the current layout's shape (the ceiling of the committer). The headline is the
//! first section: etcd's default `--max-txn-ops` 128. An optional second section starts another cluster
//! with a raised `--max-txn-ops` (and tells the log through `EtcdOptions::txn_ops_max`), clearly
//! labelled: not the default deployment.
//!
//! ```text
//! cargo run --release -p vmplane-store-etcd --features harness --example etcd_load_probe
//! VMPLANE_PROBE_SECS=5 VMPLANE_PROBE_PAYLOAD_BYTES=256 ... (defaults: 3 s per run, 256 bytes)
//! VMPLANE_PROBE_DEPTHS=1,2 VMPLANE_PROBE_WRITERS=1,16,64,256 (the defaults)
//! VMPLANE_PROBE_RAISED_TXN_OPS=1024 (default 0: skipped; only claims take operations per append)
//! ```
//!
//! Starts its own clusters on free loopback ports (scripts/install-etcd.sh installs etcd) and
//! stops them at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, ProposedEvent};
use vmplane_store_etcd::EtcdLog;
use vmplane_store_etcd::harness::EtcdCluster;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Figures {
    ops: usize,
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

fn figures(mut latencies: Vec<Duration>, elapsed: Duration, errors: usize) -> Figures {
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Figures {
        ops: latencies.len(),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        errors,
    }
}

/// Raw etcd: each writer does one put of `payload` bytes to its own new key per request.
fn raw_puts(endpoints: &[String], writers: usize, payload: usize, run: Duration) -> Figures {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = etcd_client::Client::connect(endpoints, None)
            .await
            .expect("connect");
        let prefix = format!("probe/raw/{}", Uuid::now_v7().simple());
        let started = Instant::now();
        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let mut kv = client.kv_client();
                let prefix = prefix.clone();
                tokio::spawn(async move {
                    let value = vec![7u8; payload];
                    let mut latencies = Vec::new();
                    let mut errors = 0;
                    let mut n = 0u64;
                    while started.elapsed() < run {
                        let at = Instant::now();
                        n += 1;
                        match kv
                            .put(format!("{prefix}/{w}/{n:020}"), value.clone(), None)
                            .await
                        {
                            Ok(_) => latencies.push(at.elapsed()),
                            Err(_) => errors += 1,
                        }
                    }
                    (latencies, errors)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut errors = 0;
        for task in tasks {
            let (l, e) = task.await.expect("task");
            latencies.extend(l);
            errors += e;
        }
        figures(latencies, started.elapsed(), errors)
    })
}

/// The shape of a raw group transaction.
#[derive(Clone, Copy)]
enum Shape {
    /// The former layout: per event a log put, an id put, a stream entry put and (optionally)
    /// an id compare.
    PerEvent { compares: bool },
    /// One put holding every event's body; `indexed`: per event an id put and a stream entry
    /// put too (the layout before ids and streams were indexed in memory), else nothing per
    /// event (today's layout).
    Batch { indexed: bool },
}

/// Raw etcd transactions shaped like one full group of `events` 1-event appends (event bodies
/// of `payload` + 150 bytes) plus head and time index: the ceiling of the group committer on
/// this machine, for the layout `shape`.
fn raw_group_txns(
    endpoints: &[String],
    events: usize,
    payload: usize,
    shape: Shape,
    in_flight: usize,
    run: Duration,
) -> Figures {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = etcd_client::Client::connect(endpoints, None)
            .await
            .expect("connect");
        let prefix = format!("probe/txn/{}", Uuid::now_v7().simple());
        let started = Instant::now();
        let tasks: Vec<_> = (0..in_flight)
            .map(|t| {
                let mut kv = client.kv_client();
                let prefix = format!("{prefix}/{t}");
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut errors = 0;
                    let mut n = 0u64;
                    while started.elapsed() < run {
                        let mut ops = Vec::new();
                        let mut checks = Vec::new();
                        if let Shape::Batch { .. } = shape {
                            ops.push(TxnOp::put(
                                format!("{prefix}/log/{:020}", n + events as u64),
                                vec![7u8; events * (payload + 154)],
                                None,
                            ));
                        }
                        for _ in 0..events {
                            n += 1;
                            let id = Uuid::now_v7();
                            if let Shape::PerEvent { .. } = shape {
                                ops.push(TxnOp::put(
                                    format!("{prefix}/log/{n:020}"),
                                    vec![7u8; payload + 150],
                                    None,
                                ));
                            }
                            if !matches!(shape, Shape::Batch { indexed: false }) {
                                ops.push(TxnOp::put(
                                    format!("{prefix}/id/{id}"),
                                    vec![1u8; 60],
                                    None,
                                ));
                                ops.push(TxnOp::put(
                                    format!("{prefix}/stream/{id}/1"),
                                    vec![1u8; 25],
                                    None,
                                ));
                            }
                            if let Shape::PerEvent { compares: true } = shape {
                                checks.push(Compare::create_revision(
                                    format!("{prefix}/id/{id}"),
                                    CompareOp::Equal,
                                    0,
                                ));
                            }
                        }
                        ops.push(TxnOp::put(format!("{prefix}/head"), vec![1u8; 100], None));
                        ops.push(TxnOp::put(format!("{prefix}/time/{n:020}"), vec![], None));
                        let at = Instant::now();
                        match kv.txn(Txn::new().when(checks).and_then(ops)).await {
                            Ok(_) => latencies.push(at.elapsed()),
                            Err(_) => errors += 1,
                        }
                    }
                    (latencies, errors)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut errors = 0;
        for task in tasks {
            let (l, e) = task.await.expect("task");
            latencies.extend(l);
            errors += e;
        }
        figures(latencies, started.elapsed(), errors)
    })
}

/// `EtcdLog`: each writer appends one event of `payload` bytes to its own stream at a time.
fn appends(log: &Arc<EtcdLog>, writers: usize, payload: usize, run: Duration) -> Figures {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (log, stop) = (Arc::clone(log), Arc::clone(&stop));
            thread::spawn(move || {
                let stream = format!("probe/{}/{w}", Uuid::now_v7().simple());
                let mut latencies = Vec::new();
                let mut errors = 0;
                while !stop.load(Ordering::Relaxed) {
                    let event = ProposedEvent {
                        id: Uuid::now_v7(),
                        event_type: "ProbeEvent".into(),
                        schema_version: 1,
                        payload: vec![7u8; payload],
                        actor: "probe".into(),
                        correlation_id: Uuid::now_v7(),
                        causation_id: None,
                    };
                    let at = Instant::now();
                    match log.append(AppendRequest::new(
                        stream.clone(),
                        ExpectedRevision::Any,
                        vec![event],
                    )) {
                        Ok(_) => latencies.push(at.elapsed()),
                        Err(_) => errors += 1,
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut errors = 0;
    for handle in handles {
        let (l, e) = handle.join().expect("writer");
        latencies.extend(l);
        errors += e;
    }
    figures(latencies, started.elapsed(), errors)
}

fn print(what: &str, writers: usize, f: &Figures) {
    println!(
        "{what:<22} {writers:>3} writers: {:>8.0} /s   p50 {:>6.2} ms   p99 {:>7.2} ms   ({} ops, {} errors)",
        f.per_second, f.p50_ms, f.p99_ms, f.ops, f.errors
    );
}

/// Each log's appends with `writers` writers beside raw puts with as many, in this run.
fn compare(
    endpoints: &[String],
    logs: &[(String, Arc<EtcdLog>)],
    writers: usize,
    payload: usize,
    run: Duration,
) {
    let raw = raw_puts(endpoints, writers, payload, run);
    print("raw etcd put", writers, &raw);
    for (label, log) in logs {
        let before = log.commit_stats();
        let f = appends(log, writers, payload, run);
        print(label, writers, &f);
        let after = log.commit_stats();
        let commits = (after.commits - before.commits).max(1);
        println!(
            "{:<36} {:.2}x raw puts; {:.1} events per transaction, {:.2} ms per transaction, {} guard failures, {} overtaken and resent",
            "",
            f.per_second / raw.per_second.max(1e-9),
            (after.events - before.events) as f64 / commits as f64,
            (after.commit_micros - before.commit_micros) as f64 / commits as f64 / 1e3,
            after.guard_failures - before.guard_failures,
            after.resent - before.resent
        );
    }
}

fn list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|d| d.parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// Verifies each log, then opens it again as a new server would and times how long that server
/// takes to index the log (its first stream read waits for the index).
fn verify(logs: &[(String, Arc<EtcdLog>)]) {
    for (label, log) in logs {
        let started = Instant::now();
        let verified = log
            .verify(&|_, _, _| Ok(()))
            .expect("the probe's log verifies");
        println!(
            "verified ({}): {} events, positions gapless, chain intact, in {:.2} s",
            label.trim(),
            verified.events,
            started.elapsed().as_secs_f64()
        );
        let rss_before = resident_bytes();
        let started = Instant::now();
        let reopened = EtcdLog::open(log.options().clone()).expect("open again");
        reopened
            .stream_revision("probe/none")
            .expect("a stream read after open");
        let took = started.elapsed().as_secs_f64();
        let grew = resident_bytes().saturating_sub(rss_before);
        let index = reopened.index_stats().expect("index stats");
        assert_eq!(
            index.events, verified.events,
            "the new server indexed every event"
        );
        println!(
            "a new server opened and indexed ({}): {} events in {took:.2} s ({:.0} events/s); \
             index tables {:.1} MiB ({:.0} bytes per event), process resident memory +{:.1} MiB",
            label.trim(),
            verified.events,
            verified.events as f64 / took,
            index.heap_bytes as f64 / (1 << 20) as f64,
            index.heap_bytes as f64 / verified.events.max(1) as f64,
            grew as f64 / (1 << 20) as f64,
        );
    }
}

/// This process's resident memory (Linux `/proc/self/statm`), 0 where unknown.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn main() {
    let run = Duration::from_secs(env_u64("VMPLANE_PROBE_SECS", 3));
    let payload = env_u64("VMPLANE_PROBE_PAYLOAD_BYTES", 256) as usize;
    let cluster = match EtcdCluster::start(3) {
        Ok(cluster) => cluster,
        Err(err) => {
            eprintln!("etcd_load_probe: {err}");
            std::process::exit(1);
        }
    };
    let endpoints = cluster.endpoints();
    println!(
        "3-member etcd on loopback ({}), {payload}-byte payloads, {} s per run, {} cores",
        endpoints.join(","),
        run.as_secs(),
        thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("== etcd's default --max-txn-ops 128 (the deployment default) ==");
    // The same log code with 1 (no pipelining) and 2 commit transactions in flight, each on its
    // own namespace, beside raw puts: every ratio is within this run.
    let logs: Vec<(String, Arc<EtcdLog>)> = list("VMPLANE_PROBE_DEPTHS", &[1, 2])
        .into_iter()
        .map(|depth| {
            let mut options = cluster.options(&format!("probe-depth-{depth}"));
            options.pipeline_depth = depth;
            (
                format!("EtcdLog depth {depth}"),
                Arc::new(EtcdLog::open(options).expect("open")),
            )
        })
        .collect();
    let writer_counts = list("VMPLANE_PROBE_WRITERS", &[1, 16, 64, 256]);
    for &writers in &writer_counts {
        compare(&endpoints, &logs, writers, payload, run);
    }
    // Former layouts' shapes (42 events × 3 puts + compares; 62 events × 2 index puts + one
    // batch put: what fits etcd's default 128 operations), then today's (one batch put of the
    // 64 events 64 writers leave waiting, and head and time index), 1 and 2 in flight.
    let shapes = [
        (
            "raw per-event txn +cmp",
            42,
            Shape::PerEvent { compares: true },
            1,
        ),
        (
            "raw indexed batch txn",
            62,
            Shape::Batch { indexed: true },
            1,
        ),
        ("raw batch txn", 64, Shape::Batch { indexed: false }, 1),
        ("raw batch txn", 64, Shape::Batch { indexed: false }, 2),
    ];
    for (what, events, shape, in_flight) in shapes {
        let f = raw_group_txns(&endpoints, events, payload, shape, in_flight, run);
        print(what, in_flight, &f);
        let layout = match shape {
            Shape::PerEvent { compares: true } => "× 3 puts + 1 compare",
            Shape::PerEvent { compares: false } => "× 3 puts",
            Shape::Batch { indexed: true } => "× 2 puts + 1 batch put",
            Shape::Batch { indexed: false } => "in 1 batch put",
        };
        println!(
            "{:<36} = {:.0} events/s in transactions of {events} events {layout} ({what}, {in_flight} in flight)",
            "",
            f.per_second * events as f64
        );
    }
    verify(&logs);
    drop(logs);
    drop(cluster);
    // A second cluster whose members run with a raised --max-txn-ops, and a log told so: NOT
    // the default deployment (the servers' flag and the log's option must be raised together).
    let raised = env_u64("VMPLANE_PROBE_RAISED_TXN_OPS", 0) as usize;
    if raised == 0 {
        return;
    }
    let limit = raised.to_string();
    let cluster = match EtcdCluster::start_with_flags(3, &["--max-txn-ops", &limit]) {
        Ok(cluster) => cluster,
        Err(err) => {
            eprintln!("etcd_load_probe: {err}");
            std::process::exit(1);
        }
    };
    println!("== etcd started with --max-txn-ops {raised}, EtcdOptions::txn_ops_max {raised} ==");
    let endpoints = cluster.endpoints();
    let mut options = cluster.options("probe-raised");
    options.txn_ops_max = raised;
    let logs = vec![(
        format!("EtcdLog ops {raised}"),
        Arc::new(EtcdLog::open(options).expect("open")),
    )];
    for &writers in writer_counts.iter().filter(|&&w| w >= 64) {
        compare(&endpoints, &logs, writers, payload, run);
    }
    verify(&logs);
}
