//! Load probe: append throughput of `EtcdLog` with 1, 16 and 64 writers on a real 3-member
//! cluster, beside raw etcd puts of the same size and concurrency in the same run (the baseline:
//! what etcd itself does per request on this machine).
//!
//! ```text
//! cargo run --release -p vmplane-store-etcd --features harness --example etcd_load_probe
//! VMPLANE_PROBE_SECS=5 VMPLANE_PROBE_PAYLOAD_BYTES=256 ... (defaults: 3 s per run, 256 bytes)
//! ```
//!
//! Starts its own cluster on free loopback ports (scripts/install-etcd.sh installs etcd) and
//! stops it at the end.

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

/// Raw etcd transactions shaped like one full group of 1-event appends (`events` × (log put of
/// `payload` + 150 bytes, id put, stream entry put, stream head put) + head + time index), with or
/// without the per-event id compares: the ceiling of the group committer on this machine.
fn raw_group_txns(
    endpoints: &[String],
    events: usize,
    payload: usize,
    compares: bool,
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
                        for _ in 0..events {
                            n += 1;
                            let id = Uuid::now_v7();
                            ops.push(TxnOp::put(
                                format!("{prefix}/log/{n:020}"),
                                vec![7u8; payload + 150],
                                None,
                            ));
                            ops.push(TxnOp::put(format!("{prefix}/id/{id}"), vec![1u8; 60], None));
                            ops.push(TxnOp::put(
                                format!("{prefix}/stream/{id}/1"),
                                vec![1u8; 25],
                                None,
                            ));
                            if compares {
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
    // The same log code with 1 (no pipelining) and 2 commit transactions in flight, each on its
    // own namespace, beside raw puts: every ratio is within this run.
    let depths: Vec<usize> = std::env::var("VMPLANE_PROBE_DEPTHS")
        .ok()
        .map(|v| v.split(',').filter_map(|d| d.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let logs: Vec<(usize, Arc<EtcdLog>)> = depths
        .iter()
        .map(|&depth| {
            let mut options = cluster.options(&format!("probe-depth-{depth}"));
            options.pipeline_depth = depth;
            (depth, Arc::new(EtcdLog::open(options).expect("open")))
        })
        .collect();
    for writers in [1, 16, 64] {
        let raw = raw_puts(&endpoints, writers, payload, run);
        print("raw etcd put", writers, &raw);
        for (depth, log) in &logs {
            let before = log.commit_stats();
            let f = appends(log, writers, payload, run);
            print(&format!("EtcdLog depth {depth}"), writers, &f);
            let after = log.commit_stats();
            let commits = (after.commits - before.commits).max(1);
            println!(
                "{:<36} {:.2}x raw puts; {:.1} events per transaction, {:.2} ms per transaction, {} guard failures",
                "",
                f.per_second / raw.per_second.max(1e-9),
                (after.events - before.events) as f64 / commits as f64,
                (after.commit_micros - before.commit_micros) as f64 / commits as f64 / 1e3,
                after.guard_failures - before.guard_failures
            );
        }
    }
    for (compares, in_flight) in [(false, 1), (true, 1), (true, 4)] {
        let f = raw_group_txns(&endpoints, 42, payload, compares, in_flight, run);
        print(
            if compares {
                "raw group txn +cmp"
            } else {
                "raw group txn"
            },
            in_flight,
            &f,
        );
        println!(
            "{:<36} = {:.0} events/s in transactions of 42 events × 3 puts",
            "",
            f.per_second * 42.0
        );
    }
    for (depth, log) in &logs {
        let verified = log
            .verify(&|_, _, _| Ok(()))
            .expect("the probe's log verifies");
        println!(
            "verified (depth {depth}): {} events, positions gapless, chain intact",
            verified.events
        );
    }
}
