//! etcd faults under load (issue 11 §3): members killed by PID during continuous appends, a lost
//! quorum, restarts, several servers on one log, compaction, no etcd at all; and the watch-based
//! subscription, also across those faults.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vmplane_store::{AppendRequest, Error, EventLog, ExpectedRevision, Position, ProposedEvent};
use vmplane_store_etcd::harness::EtcdCluster;
use vmplane_store_etcd::{EtcdLog, EtcdOptions};

fn event(payload: &[u8]) -> ProposedEvent {
    ProposedEvent {
        id: Uuid::now_v7(),
        event_type: "FaultProbe".into(),
        schema_version: 1,
        payload: payload.to_vec(),
        actor: "faults".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

fn accept_all(_: &str, _: u16, _: &[u8]) -> Result<(), String> {
    Ok(())
}

/// What the writers saw, with times relative to the test's start.
#[derive(Default)]
struct Record {
    /// Acknowledged: event id, position, when.
    acked: Vec<(Uuid, Position, Instant)>,
    /// Every id ever sent.
    sent: HashSet<Uuid>,
    /// `Unavailable` errors: when, message.
    unavailable: Vec<(Instant, String)>,
    /// Any other error.
    other: Vec<String>,
}

/// Writers append one event at a time to their own stream; a failed append is retried with the
/// same event id (the idempotency rule makes that safe) until it is acknowledged.
fn start_writers(
    log: &Arc<EtcdLog>,
    writers: usize,
    stop: &Arc<AtomicBool>,
    record: &Arc<Mutex<Record>>,
) -> Vec<thread::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (log, stop, record) = (Arc::clone(log), Arc::clone(stop), Arc::clone(record));
            thread::spawn(move || {
                let mut retry: Option<AppendRequest> = None;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) || retry.is_some() {
                    let request = retry.take().unwrap_or_else(|| {
                        n += 1;
                        AppendRequest::new(
                            format!("writer/{w}"),
                            ExpectedRevision::Any,
                            vec![event(&n.to_be_bytes())],
                        )
                    });
                    let id = request.events[0].id;
                    record.lock().unwrap().sent.insert(id);
                    match log.append(request.clone()) {
                        Ok(result) => record.lock().unwrap().acked.push((
                            id,
                            result.first_position,
                            Instant::now(),
                        )),
                        Err(Error::Unavailable { reason }) => {
                            record
                                .lock()
                                .unwrap()
                                .unavailable
                                .push((Instant::now(), reason));
                            retry = Some(request);
                            if stop.load(Ordering::Relaxed) {
                                // Give up on an unreachable cluster at the very end.
                                return;
                            }
                            thread::sleep(Duration::from_millis(50));
                        }
                        Err(err) => {
                            record.lock().unwrap().other.push(err.to_string());
                            return;
                        }
                    }
                }
            })
        })
        .collect()
}

fn acked_between(record: &Mutex<Record>, from: Instant, to: Instant) -> usize {
    let record = record.lock().unwrap();
    record
        .acked
        .iter()
        .filter(|(_, _, at)| *at >= from && *at < to)
        .count()
}

/// Every acknowledged event is in the log at its position, no id is there twice, nothing that
/// was never sent is there, and the chain verifies (up to the head it read; a late commit of an
/// append whose answer was lost may follow).
fn check_nothing_lost(log: &EtcdLog, record: &Record) {
    let report = log.verify(&accept_all).expect("the chain verifies");
    let mut at: HashMap<Uuid, Position> = HashMap::new();
    let mut after = Position(0);
    loop {
        let page = log.read_all(after, 5_000).expect("read_all");
        let Some(last) = page.last() else { break };
        after = last.position;
        for event in page {
            assert!(record.sent.contains(&event.id), "an event nobody sent");
            assert!(
                at.insert(event.id, event.position).is_none(),
                "event {} is in the log twice",
                event.id
            );
        }
    }
    // An append whose answer was lost (Unavailable as the writers stopped, not retried) may
    // commit after verify read the head: read_all then reads past it, never short of it.
    assert!(
        after.0 >= report.events,
        "read_all reaches the verified head {}: {}",
        report.events,
        after.0
    );
    for (id, position, _) in &record.acked {
        assert_eq!(
            at.get(id),
            Some(position),
            "acknowledged event {id} is at its position"
        );
    }
}

/// Kill one member during continuous appends: appends go on. Kill a second: appends fail with
/// `Unavailable` naming etcd within a bounded time. Restart both: appends resume. Nothing
/// acknowledged is lost and the chain verifies.
#[test]
fn appends_survive_one_member_fail_clearly_without_quorum_and_resume() {
    let mut cluster = EtcdCluster::start(3).expect("etcd cluster (run scripts/install-etcd.sh)");
    let mut options = cluster.options("faults/quorum");
    options.request_timeout = Duration::from_millis(1500);
    options.unavailable_after = Duration::from_secs(4);
    let log = Arc::new(EtcdLog::open(options.clone()).expect("open"));
    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::default()));
    let writers = start_writers(&log, 4, &stop, &record);
    // A watch subscription follows the log through every fault below. It reads until it has
    // reached the head the log reports once every writer is done (`reach`), or until it has
    // made no progress for 30 s: a subscription that stalls fails the comparison below. (It
    // used to end after 2 s of quiet once the writers were told to stop, which races their
    // last appends: each may take up to the queue deadline plus a request timeout.)
    let reach = Arc::new(AtomicU64::new(0));
    let watched = {
        let (log, reach) = (Arc::clone(&log), Arc::clone(&reach));
        thread::spawn(move || {
            let mut subscription = log.watch_from(Position(0)).expect("watch");
            let mut positions = Vec::new();
            let mut progress_at = Instant::now();
            loop {
                let batch = subscription
                    .next_batch(1_000, Duration::from_millis(200))
                    .expect("subscription");
                if !batch.is_empty() {
                    progress_at = Instant::now();
                }
                positions.extend(batch.iter().map(|e| e.position.0));
                let target = reach.load(Ordering::Acquire);
                if target == 0 {
                    continue;
                }
                if subscription.position().0 >= target
                    || progress_at.elapsed() > Duration::from_secs(30)
                {
                    return positions;
                }
            }
        })
    };

    thread::sleep(Duration::from_millis(1500));
    let kill_one = Instant::now();
    cluster.kill(0);
    thread::sleep(Duration::from_secs(5));
    let after_one = acked_between(&record, kill_one + Duration::from_secs(3), Instant::now());
    println!(
        "one member down: {after_one} appends acknowledged 3-5 s after the kill ({} before)",
        acked_between(&record, kill_one - Duration::from_secs(10), kill_one)
    );
    assert!(after_one > 0, "appends continue with one member down");

    let kill_two = Instant::now();
    cluster.kill(1);
    // Bounded: the queue deadline (4 s) plus one request timeout, plus slack for a loaded box.
    let bound = options.unavailable_after + options.request_timeout + Duration::from_secs(3);
    let first_unavailable = loop {
        let seen = record
            .lock()
            .unwrap()
            .unavailable
            .iter()
            .find(|(at, _)| *at > kill_two)
            .cloned();
        if let Some(seen) = seen {
            break seen;
        }
        assert!(
            kill_two.elapsed() < bound + Duration::from_secs(5),
            "no Unavailable within {bound:?} of losing the quorum"
        );
        thread::sleep(Duration::from_millis(50));
    };
    let took = first_unavailable.0 - kill_two;
    println!(
        "quorum lost: first Unavailable after {} ms: {}",
        took.as_millis(),
        first_unavailable.1
    );
    assert!(took <= bound, "Unavailable within {bound:?}, took {took:?}");
    assert!(
        first_unavailable.1.contains("etcd"),
        "the error names etcd: {}",
        first_unavailable.1
    );
    thread::sleep(Duration::from_secs(1));
    // Appends acknowledged long after the quorum is gone would be a lie.
    let late = acked_between(&record, kill_two + Duration::from_secs(3), Instant::now());
    assert_eq!(late, 0, "nothing is acknowledged without a quorum");

    let restart = Instant::now();
    cluster.restart(0).expect("restart e1");
    cluster.restart(1).expect("restart e2");
    cluster
        .wait_healthy(Duration::from_secs(30))
        .expect("the cluster recovers");
    let resumed = loop {
        let first = record
            .lock()
            .unwrap()
            .acked
            .iter()
            .find(|(_, _, at)| *at > restart)
            .map(|(_, _, at)| *at);
        if let Some(at) = first {
            break at - restart;
        }
        assert!(
            restart.elapsed() < Duration::from_secs(30),
            "appends resume after the restart"
        );
        thread::sleep(Duration::from_millis(50));
    };
    println!(
        "restarted: appends resumed after {} ms",
        resumed.as_millis()
    );
    thread::sleep(Duration::from_secs(1));
    let stopped = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().expect("writer");
    }
    let record = record.lock().unwrap();
    assert!(record.other.is_empty(), "other errors: {:?}", record.other);
    println!(
        "{} appends acknowledged, {} Unavailable answers (retried with the same ids)",
        record.acked.len(),
        record.unavailable.len()
    );
    check_nothing_lost(&log, &record);
    let head = log.head().0;
    let last_ack = record.acked.iter().map(|(_, _, at)| *at).max();
    println!(
        "the last append was acknowledged {} ms after the writers were told to stop",
        last_ack.map_or(0, |at| at.saturating_duration_since(stopped).as_millis())
    );
    let head_read = Instant::now();
    reach.store(head.max(1), Ordering::Release);
    let watched = watched.join().expect("subscriber");
    println!(
        "the subscription ended {} ms after the head was read",
        head_read.elapsed().as_millis()
    );
    // An append given up on at the very end may still land after `head` was read: the
    // subscription may deliver past it, never short of it.
    let delivered = watched.len() as u64;
    assert!(
        delivered >= head,
        "the watch subscription stalled at {:?} of {head}",
        watched.last()
    );
    assert_eq!(
        watched,
        (1..=delivered).collect::<Vec<_>>(),
        "the watch subscription delivered every event once, in order, across the faults"
    );
    // A server started afresh sees the same log.
    drop(log);
    let reopened = EtcdLog::open(options).expect("reopen");
    check_nothing_lost(&reopened, &record);
}

/// Two servers, each with its own `EtcdLog` on one namespace, appending at once: every append
/// succeeds exactly once, positions stay gapless, the chain verifies, and each server's head
/// follows the other's commits through the watch.
#[test]
fn two_servers_share_one_log() {
    let options = support::cluster().options(&support::namespace("two-servers"));
    let a = Arc::new(EtcdLog::open(options.clone()).expect("open a"));
    let b = Arc::new(EtcdLog::open(options).expect("open b"));
    let per_writer = 40;
    let handles: Vec<_> = (0..8)
        .map(|w| {
            let log = Arc::clone(if w % 2 == 0 { &a } else { &b });
            thread::spawn(move || {
                for i in 0..per_writer {
                    let stream = format!("server/{w}");
                    let result = log
                        .append(AppendRequest::new(
                            stream,
                            ExpectedRevision::Exact(i),
                            vec![event(b"x")],
                        ))
                        .expect("append");
                    assert_eq!(result.first_revision, i + 1);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("writer");
    }
    let total = 8 * per_writer;
    for log in [&a, &b] {
        assert_eq!(
            log.wait_for(Position(total), Duration::from_secs(10))
                .unwrap(),
            Position(total),
            "each server's head reaches the other's commits"
        );
        assert_eq!(log.verify(&accept_all).unwrap().events, total);
    }
    let all = a.read_all(Position(0), 10_000).unwrap();
    assert_eq!(all.len() as u64, total);
    let ids: HashSet<Uuid> = all.iter().map(|e| e.id).collect();
    assert_eq!(ids.len() as u64, total, "no event twice");
}

/// One stream written in turns through two servers, each turn expecting the revision the other
/// server just wrote: every server decides on the other's commits (its index reads the batches
/// it did not write), reads them by stream, and a stale expectation is a conflict naming the
/// actual revision.
#[test]
fn a_stream_continued_in_turns_through_two_servers_reads_and_decides_on_both() {
    let options = support::cluster().options(&support::namespace("stream-turns"));
    let servers = [
        EtcdLog::open(options.clone()).expect("open a"),
        EtcdLog::open(options).expect("open b"),
    ];
    for turn in 0..20u64 {
        let (this, other) = (
            &servers[(turn % 2) as usize],
            &servers[((turn + 1) % 2) as usize],
        );
        let before = 2 * turn;
        assert_eq!(
            this.stream_revision("turns").unwrap(),
            Some(before).filter(|r| *r > 0),
            "turn {turn}: the revision the other server wrote"
        );
        // An event on another stream through the other server, so the stream's runs interleave.
        other
            .append(AppendRequest::new(
                format!("noise/{turn}"),
                ExpectedRevision::NoStream,
                vec![event(b"n")],
            ))
            .expect("noise");
        let written = this
            .append(AppendRequest::new(
                "turns",
                ExpectedRevision::Exact(before),
                vec![event(b"t"), event(b"t")],
            ))
            .expect("append on the other server's revision");
        assert_eq!(written.last_revision, before + 2);
        // Read through the other server before it appends anything: its reads catch its
        // index up themselves.
        assert_eq!(other.stream_revision("turns").unwrap(), Some(before + 2));
        let read = other
            .read_stream("turns", 1, vmplane_store::Direction::Forward, 1_000)
            .unwrap();
        let revisions: Vec<u64> = read.iter().map(|e| e.revision).collect();
        assert_eq!(
            revisions,
            (1..=before + 2).collect::<Vec<_>>(),
            "turn {turn}"
        );
        let back = other
            .read_stream("turns", u64::MAX, vmplane_store::Direction::Backward, 3)
            .unwrap();
        let revisions: Vec<u64> = back.iter().map(|e| e.revision).collect();
        assert_eq!(
            revisions,
            ((before + 2).saturating_sub(2).max(1)..=before + 2)
                .rev()
                .collect::<Vec<_>>()
        );
        match other.append(AppendRequest::new(
            "turns",
            ExpectedRevision::Exact(before),
            vec![event(b"late")],
        )) {
            Err(Error::Conflict { actual, .. }) => {
                assert_eq!(actual, Some(before + 2), "turn {turn}")
            }
            answer => panic!("turn {turn}: a stale expectation conflicts, got {answer:?}"),
        }
    }
}

/// An append committed through one server and retried through another (as a client does after
/// a lost answer and a failover) is replayed with its original positions, and its ids proposed
/// on another stream are refused, while both committers are busy with groups of their own: no
/// transaction compares event ids, each committer reads them before deciding, and that read is
/// trusted only at a head of its own commits.
#[test]
fn ids_committed_through_one_server_are_replayed_or_refused_by_another() {
    let options = support::cluster().options(&support::namespace("ids-two-servers"));
    let servers = [
        Arc::new(EtcdLog::open(options.clone()).expect("open a")),
        Arc::new(EtcdLog::open(options).expect("open b")),
    ];
    let rounds = 30u64;
    let writers = 8u64;
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let servers = servers.clone();
            thread::spawn(move || {
                let stream = format!("ids/{w}");
                for i in 0..rounds {
                    let first = &servers[((w + i) % 2) as usize];
                    let other = &servers[((w + i + 1) % 2) as usize];
                    let request = AppendRequest::new(
                        stream.clone(),
                        ExpectedRevision::Any,
                        vec![event(b"x")],
                    );
                    let original = first.append(request.clone()).expect("append");
                    assert!(!original.replayed);
                    let retried = other.append(request.clone()).expect("retry");
                    assert!(retried.replayed, "writer {w} round {i}: a replay");
                    assert_eq!(
                        (retried.first_position, retried.first_revision),
                        (original.first_position, original.first_revision)
                    );
                    let mut elsewhere = request;
                    elsewhere.stream = format!("ids/{w}/elsewhere");
                    assert!(
                        matches!(other.append(elsewhere), Err(Error::EventIdReused { .. })),
                        "writer {w} round {i}: the reused id is refused"
                    );
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("writer");
    }
    let total = writers * rounds;
    let log = &servers[0];
    assert_eq!(
        log.wait_for(Position(total), Duration::from_secs(10))
            .unwrap(),
        Position(total)
    );
    assert_eq!(log.verify(&accept_all).unwrap().events, total);
    let all = log.read_all(Position(0), 10_000).unwrap();
    let ids: HashSet<Uuid> = all.iter().map(|e| e.id).collect();
    assert_eq!(ids.len() as u64, total, "no event twice");
}

/// `verify` of a log being written to (another server appending, or an append whose answer
/// was lost committing late) checks everything up to the head it read first: the events that
/// commit meanwhile, each with the head that covers it, are not damage.
#[test]
fn verify_while_appends_commit_checks_up_to_the_head_it_read() {
    let cluster = support::cluster();
    let options = cluster.options(&support::namespace("verify-live"));
    let log = Arc::new(EtcdLog::open(options).expect("open"));
    let before = 200u64;
    for i in 0..before {
        log.append(AppendRequest::new(
            format!("s/{}", i % 7),
            ExpectedRevision::Any,
            vec![event(b"before")],
        ))
        .expect("append");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (log, stop) = (Arc::clone(&log), Arc::clone(&stop));
        thread::spawn(move || {
            let mut appended = 0u64;
            while !stop.load(Ordering::Relaxed) {
                log.append(AppendRequest::new(
                    "live",
                    ExpectedRevision::Any,
                    vec![event(b"during")],
                ))
                .expect("append while verifying");
                appended += 1;
            }
            appended
        })
    };
    for _ in 0..5 {
        let report = log.verify(&accept_all).expect("a live log verifies");
        assert!(report.events >= before, "{report:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let during = writer.join().expect("writer");
    assert!(during > 0, "appends went on while verifying");
    assert_eq!(
        log.verify(&accept_all).expect("verify").events,
        before + during
    );
}

/// Compacting etcd's history (as Kubernetes' apiserver does every 5 minutes) removes nothing
/// the log needs: reads, verify, a new server's open and its head watch all still work.
#[test]
fn compaction_removes_nothing_the_log_needs() {
    let cluster = support::cluster();
    let options = cluster.options(&support::namespace("compaction"));
    let log = Arc::new(EtcdLog::open(options.clone()).expect("open"));
    for i in 0..30u64 {
        log.append(AppendRequest::new(
            format!("s/{}", i % 3),
            ExpectedRevision::Any,
            vec![event(b"before")],
        ))
        .expect("append");
    }
    let before = log.verify(&accept_all).expect("verify");
    cluster.compact().expect("compact");
    let reopened = Arc::new(EtcdLog::open(options).expect("open after compaction"));
    assert_eq!(reopened.verify(&accept_all).expect("verify"), before);
    assert_eq!(
        reopened
            .read_stream("s/1", 1, vmplane_store::Direction::Forward, 100)
            .unwrap()
            .len(),
        10
    );
    log.append(AppendRequest::new(
        "s/0",
        ExpectedRevision::Exact(10),
        vec![event(b"after")],
    ))
    .expect("append after compaction");
    assert_eq!(
        reopened
            .wait_for(Position(31), Duration::from_secs(10))
            .unwrap(),
        Position(31),
        "the other server's head watch sees the append"
    );
    let mut subscription = (Arc::clone(&reopened) as Arc<dyn EventLog>).subscribe(Position(25));
    let events = subscription
        .next_batch(100, Duration::from_secs(5))
        .unwrap();
    assert_eq!(
        events.iter().map(|e| e.position.0).collect::<Vec<_>>(),
        (26..=31).collect::<Vec<_>>()
    );
}

/// With no etcd listening, opening fails within `unavailable_after` with `Unavailable` naming
/// etcd and the endpoint, instead of hanging or panicking.
#[test]
fn unreachable_etcd_fails_clearly_and_in_bounded_time() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut options = EtcdOptions::new(vec![endpoint.clone()], "nowhere");
    options.request_timeout = Duration::from_millis(300);
    options.unavailable_after = Duration::from_secs(1);
    let started = Instant::now();
    match EtcdLog::open(options) {
        Err(Error::Unavailable { reason }) => {
            assert!(
                reason.contains("etcd") && reason.contains(&endpoint),
                "{reason}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// The watch subscription delivers the backlog, then live events from concurrent writers, each
/// exactly once and in order, with no gap or repeat at the switch from list to watch.
#[test]
fn watch_subscription_catches_up_then_goes_live_without_gap_or_repeat() {
    let options = support::cluster().options(&support::namespace("watch"));
    let log = Arc::new(EtcdLog::open(options).expect("open"));
    for _ in 0..10 {
        log.append(AppendRequest::new(
            "before",
            ExpectedRevision::Any,
            vec![event(b"1"), event(b"2"), event(b"3")],
        ))
        .expect("append");
    }
    let writers = 4u64;
    let per_writer = 50u64;
    let total = 30 + writers * per_writer;
    let mut subscription = log.watch_from(Position(5)).expect("watch");
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let log = Arc::clone(&log);
            thread::spawn(move || {
                for i in 0..per_writer {
                    log.append(AppendRequest::new(
                        format!("live/{w}"),
                        ExpectedRevision::Any,
                        vec![event(&i.to_be_bytes())],
                    ))
                    .expect("append");
                }
            })
        })
        .collect();
    let mut delivered = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (delivered.len() as u64) < total - 5 && Instant::now() < deadline {
        for event in subscription
            .next_batch(7, Duration::from_millis(200))
            .unwrap()
        {
            delivered.push(event.position.0);
        }
    }
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(delivered, (6..=total).collect::<Vec<_>>());
    assert_eq!(subscription.position(), Position(total));
    assert!(
        subscription
            .next_batch(10, Duration::from_millis(100))
            .unwrap()
            .is_empty()
    );
    // Events arrive whole: the same as read_all.
    let read = log.read_all(Position(5), 1_000).unwrap();
    let mut again = log.watch_from(Position(5)).expect("watch");
    let mut watched = Vec::new();
    while watched.len() < read.len() {
        let batch = again.next_batch(1_000, Duration::from_secs(5)).unwrap();
        assert!(!batch.is_empty(), "the backlog arrives");
        watched.extend(batch);
    }
    assert_eq!(watched, read);
}

/// The largest append the limits admit — 50 events carrying 1 MiB of payload, 16 claims, every
/// name at its maximum — fits one etcd transaction (128 operations, 1.5 MiB), alone and next to
/// concurrent appends that the committer might pack with it.
#[test]
fn largest_append_fits_one_transaction() {
    let limits = EtcdLog::LIMITS;
    let options = support::cluster().options(&support::namespace("largest"));
    let log = Arc::new(EtcdLog::open(options).expect("open"));
    let largest = |tag: char| {
        let stream: String = std::iter::once(tag)
            .chain(std::iter::repeat_n('s', limits.stream_name_bytes_max - 1))
            .collect();
        let per_event = limits.append_payload_bytes_max / limits.append_batch_events_max;
        let events = (0..limits.append_batch_events_max)
            .map(|_| {
                let mut e = event(&vec![9u8; per_event]);
                e.actor = "a".repeat(limits.actor_bytes_max);
                e.event_type = "t".repeat(limits.event_type_bytes_max);
                e
            })
            .collect();
        (0..limits.append_claims_max).fold(
            AppendRequest::new(stream, ExpectedRevision::NoStream, events),
            |request, i| {
                let key = format!("{tag}{i:03}");
                request.with_claim(vmplane_store::Claim::Acquire {
                    key: format!("{key}{}", "k".repeat(limits.claim_bytes_max - key.len())),
                    owner: "o".repeat(limits.claim_bytes_max),
                })
            },
        )
    };
    let first = log.append(largest('a')).expect("the largest append");
    assert_eq!(first.last_revision, limits.append_batch_events_max as u64);
    let handles: Vec<_> = ['b', 'c', 'd']
        .into_iter()
        .map(|tag| {
            let (log, request) = (Arc::clone(&log), largest(tag));
            thread::spawn(move || log.append(request).map(|r| r.last_revision))
        })
        .collect();
    for handle in handles {
        assert_eq!(
            handle.join().unwrap().expect("concurrent largest appends"),
            limits.append_batch_events_max as u64
        );
    }
    assert_eq!(
        log.verify(&accept_all).unwrap().events,
        4 * limits.append_batch_events_max as u64
    );
}
