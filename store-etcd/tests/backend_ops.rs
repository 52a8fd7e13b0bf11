//! What the etcd backend costs etcd, and how it says etcd's refusals: a log that does not move
//! is read again from memory (no etcd request), an out-of-space cluster is `StorageFull` (not an
//! append of unknown outcome), and an `https://` endpoint is refused in plain words. Real etcd
//! members on loopback ports, started by the harness.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::ops::ControlFlow;

use uuid::Uuid;
use vmplane_store::{AppendRequest, Direction, Error, EventLog, ExpectedRevision, ProposedEvent};
use vmplane_store::{Position, Revision};
use vmplane_store_etcd::harness::EtcdCluster;
use vmplane_store_etcd::{EtcdLog, EtcdOptions};

fn event(payload: Vec<u8>) -> ProposedEvent {
    ProposedEvent {
        id: Uuid::now_v7(),
        event_type: "OpsProbe".into(),
        schema_version: 1,
        payload,
        actor: "backend_ops".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

/// etcd's count of range and transaction requests, summed over `endpoints` (from /metrics).
fn etcd_requests(endpoints: &[String]) -> u64 {
    let mut total = 0;
    for endpoint in endpoints {
        let address = endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).expect("connect to etcd's metrics");
        write!(
            stream,
            "GET /metrics HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .expect("ask for metrics");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read metrics");
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if let (Some(name), Some(value)) = (words.next(), words.next())
                && matches!(
                    name,
                    "etcd_debugging_mvcc_range_total" | "etcd_debugging_mvcc_txn_total"
                )
            {
                total += value.parse::<f64>().expect("a number") as u64;
            }
        }
    }
    total
}

/// A reader that goes over the same streams again and again while nothing is written (the
/// reconciler's resync, folding every VM its projections' cache no longer holds) sends etcd
/// nothing after the first time: batches never change once committed.
#[test]
fn reading_an_idle_log_again_costs_etcd_nothing() {
    let cluster = EtcdCluster::start(1).expect("an etcd member (run scripts/install-etcd.sh)");
    let log = EtcdLog::open(cluster.options("idle")).expect("open");
    let streams: Vec<String> = (0..100).map(|i| format!("vm/default/idle-{i}")).collect();
    for stream in &streams {
        for revision in 0..3u64 {
            let expected = if revision == 0 {
                ExpectedRevision::NoStream
            } else {
                ExpectedRevision::Exact(revision)
            };
            log.append(AppendRequest::new(
                stream.clone(),
                expected,
                vec![event(vec![7; 300])],
            ))
            .expect("append");
        }
    }
    let pass = |log: &EtcdLog| {
        for stream in &streams {
            // As the projections ask: exactly the revisions the read model says there are.
            let events = log
                .read_stream(stream, 1, Direction::Forward, 3)
                .expect("read a stream");
            assert_eq!(events.len(), 3);
            let last: Revision = 3;
            let back = log
                .read_stream(stream, last, Direction::Backward, 2)
                .expect("read a stream backwards");
            assert_eq!(back.len(), 2);
        }
        let mut seen = 0;
        log.scan(Position(10), &mut |_| {
            seen += 1;
            if seen == 20 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .expect("scan");
        assert_eq!(log.read_all(Position(0), 300).expect("read all").len(), 300);
        assert!(log.read_event(Position(150)).expect("read").is_some());
    };
    pass(&log);
    let before = etcd_requests(&cluster.endpoints());
    for _ in 0..5 {
        pass(&log);
    }
    let sent = etcd_requests(&cluster.endpoints()) - before;
    let stats = log.batch_cache_stats();
    eprintln!("5 passes over 100 idle streams: {sent} etcd range/txn requests; {stats:?}");
    assert!(
        sent <= 2,
        "5 passes over an idle log sent etcd {sent} requests (expected none)"
    );
    // A write is still seen at once by the next read that asks past what is known.
    log.append(AppendRequest::new(
        streams[0].clone(),
        ExpectedRevision::Exact(3),
        vec![event(vec![1])],
    ))
    .expect("append");
    let events = log
        .read_stream(&streams[0], 1, Direction::Forward, 100)
        .expect("read");
    assert_eq!(events.len(), 4);
}

/// etcd out of space (NOSPACE alarm): the append is refused as `StorageFull`, whose message
/// says what to do and does not say the append may have been committed (etcd refuses before
/// committing).
#[test]
fn an_etcd_out_of_space_is_storage_full_not_an_unknown_outcome() {
    let cluster = EtcdCluster::start_with_flags(1, &["--quota-backend-bytes", "4194304"])
        .expect("an etcd member (run scripts/install-etcd.sh)");
    let log = EtcdLog::open(cluster.options("full")).expect("open");
    let mut revision = 0u64;
    let err = loop {
        let expected = if revision == 0 {
            ExpectedRevision::NoStream
        } else {
            ExpectedRevision::Exact(revision)
        };
        match log.append(AppendRequest::new(
            "vm/default/full",
            expected,
            vec![event(vec![3; 256 * 1024])],
        )) {
            Ok(_) => revision += 1,
            Err(err) => break err,
        }
        assert!(revision < 1000, "etcd never ran out of space");
    };
    eprintln!("after {revision} appends: {err}");
    match &err {
        Error::StorageFull { reason } => {
            assert!(reason.contains("out of space"), "{reason}");
            assert!(!reason.contains("may or may not"), "{reason}");
        }
        other => panic!("expected StorageFull, got {other:?}"),
    }
}

/// `https://` endpoints: this build has no TLS to etcd, and says so in an operator's words.
#[test]
fn an_https_endpoint_is_refused_saying_tls_is_not_supported() {
    let options = EtcdOptions::new(vec!["https://127.0.0.1:1".into()], "tls");
    match EtcdLog::open(options) {
        Err(Error::Misconfigured { reason }) => {
            assert!(
                reason.contains("TLS to etcd is not supported by this build")
                    && reason.contains("use http://"),
                "{reason}"
            );
            assert!(!reason.contains("feature"), "{reason}");
        }
        other => panic!("expected Misconfigured, got {other:?}"),
    }
}

/// etcd gone: the log says so (`backend_up` false, a WARN logged) once an operation has gone
/// unanswered for longer than a request's timeout, and up again at the next answer.
#[test]
fn an_unreachable_etcd_is_reported_down_and_then_up_again() {
    let mut cluster = EtcdCluster::start(1).expect("an etcd member (run scripts/install-etcd.sh)");
    let mut options = cluster.options("reach");
    options.request_timeout = std::time::Duration::from_millis(500);
    options.unavailable_after = std::time::Duration::from_secs(2);
    let log = EtcdLog::open(options).expect("open");
    log.append(AppendRequest::new(
        "vm/default/reach",
        ExpectedRevision::NoStream,
        vec![event(vec![1])],
    ))
    .expect("append");
    assert!(log.backend_up());
    cluster.kill(0);
    let err = log
        .stream_revision("vm/default/reach")
        .expect_err("no etcd to answer");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(!log.backend_up(), "still up after {err}");
    cluster.restart(0).expect("restart");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while log.stream_revision("vm/default/reach").is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "etcd never answered again"
        );
    }
    assert!(log.backend_up());
}

/// A prefix inside another log's `<prefix>/v1/` is refused at open, whichever opens second;
/// and a log that finds another's key among its batches names that key.
#[test]
fn a_namespace_nested_in_another_logs_keys_is_refused() {
    let cluster = EtcdCluster::start(1).expect("an etcd member (run scripts/install-etcd.sh)");
    let append_one = |log: &EtcdLog| {
        log.append(AppendRequest::new(
            "vm/default/nest",
            ExpectedRevision::Any,
            vec![event(vec![1])],
        ))
        .expect("append");
    };
    // The outer log first: the inner one is refused.
    let outer = EtcdLog::open(cluster.options("outer")).expect("open");
    append_one(&outer);
    match EtcdLog::open(cluster.options("outer/v1/log")) {
        Err(Error::Misconfigured { reason }) => {
            assert!(
                reason.contains("\"outer\"") && reason.contains("--etcd-prefix"),
                "{reason}"
            )
        }
        other => panic!("expected Misconfigured, got {other:?}"),
    }
    // The inner log first: the outer one is refused, naming the inner's key.
    let inner = EtcdLog::open(cluster.options("first/v1/log")).expect("open");
    append_one(&inner);
    match EtcdLog::open(cluster.options("first")) {
        Err(Error::Misconfigured { reason }) => {
            assert!(reason.contains("first/v1/log/v1/"), "{reason}")
        }
        other => panic!("expected Misconfigured, got {other:?}"),
    }
    // An outer log opened while empty, the inner one written after: the damage names the key.
    let empty = EtcdLog::open(cluster.options("late")).expect("open");
    let nested = EtcdLog::open(cluster.options("late/v1/log")).expect("open");
    append_one(&nested);
    let err = empty
        .read_all(Position(0), 10)
        .expect_err("another log's key under log/");
    let text = err.to_string();
    assert!(
        text.contains("malformed key under log/") && text.contains("late/v1/log/v1/"),
        "{text}"
    );
}
