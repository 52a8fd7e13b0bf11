//! Leader election and fencing on a real 3-member etcd cluster, and the pipelined committer
//! under several servers: what `vmplane serve` relies on for "exactly one reconciler acts".

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use uuid::Uuid;
use vmplane_store::{
    AppendRequest, Error, EventLog, ExpectedRevision, FencedLog, Position, ProposedEvent,
};
use vmplane_store_etcd::EtcdLog;

const TTL: Duration = Duration::from_secs(2);

fn event() -> ProposedEvent {
    ProposedEvent {
        id: Uuid::now_v7(),
        event_type: "TestEvent".into(),
        schema_version: 1,
        payload: vec![7; 64],
        actor: "tester".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

fn open(namespace: &str) -> Arc<EtcdLog> {
    Arc::new(EtcdLog::open(support::cluster().options(namespace)).expect("open"))
}

#[test]
fn one_leader_at_a_time_and_a_standby_takes_over_when_the_lease_expires() {
    let namespace = support::namespace("leader-takeover");
    let (a, b) = (open(&namespace), open(&namespace));
    let term_a = a
        .election("reconciler", TTL, "a")
        .expect("election")
        .campaign(&|| false)
        .expect("campaign")
        .expect("a leads");
    // While A renews its lease, B's campaign does not succeed.
    let election_b = b.election("reconciler", TTL, "b").expect("election");
    let tried_until = Instant::now() + 3 * TTL;
    let refused = election_b
        .campaign(&|| Instant::now() >= tried_until)
        .expect("campaign");
    assert!(refused.is_none(), "B must not lead while A's lease lives");
    assert!(
        term_a.lost().is_none(),
        "A still leads: {:?}",
        term_a.lost()
    );

    // A stops renewing (as if it crashed, keeping nothing): B leads within the TTL plus a poll.
    let stale_fence = term_a.fence().clone();
    let stopped = Instant::now();
    drop(term_a);
    let term_b = election_b
        .campaign(&|| false)
        .expect("campaign")
        .expect("b leads");
    let takeover = stopped.elapsed();
    assert!(
        takeover <= TTL + Duration::from_millis(1500),
        "takeover took {takeover:?} with a {TTL:?} lease"
    );
    assert!(term_b.fence().token > stale_fence.token);

    // A, not knowing, appends with its old fence: refused, nothing written; B's append lands.
    let stale = FencedLog::new(a.clone(), stale_fence.clone());
    let request = AppendRequest::new("vm/x", ExpectedRevision::NoStream, vec![event()]);
    match stale.append(request) {
        Err(Error::Fenced { fence, current, .. }) => {
            assert_eq!(fence, stale_fence);
            assert_eq!(current, Some(term_b.fence().token));
        }
        other => panic!("a deposed leader's append must be fenced, got {other:?}"),
    }
    assert_eq!(a.stream_revision("vm/x").expect("revision"), None);
    let leader = FencedLog::new(b.clone(), term_b.fence().clone());
    leader
        .append(AppendRequest::new(
            "vm/x",
            ExpectedRevision::NoStream,
            vec![event()],
        ))
        .expect("the leader writes");

    // Resigning hands over at once, not after the TTL.
    let election_a = a.election("reconciler", TTL, "a").expect("election");
    let resigned = Instant::now();
    term_b.resign();
    let term_a2 = election_a
        .campaign(&|| false)
        .expect("campaign")
        .expect("a leads again");
    assert!(
        resigned.elapsed() < TTL,
        "handover after resign took {:?}",
        resigned.elapsed()
    );
    // B's fence is stale now too.
    let err = leader
        .append(AppendRequest::new(
            "vm/x",
            ExpectedRevision::Any,
            vec![event()],
        ))
        .expect_err("fenced");
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    term_a2.resign();
}

#[test]
fn a_term_renews_its_lease_and_knows_when_its_key_is_gone() {
    let namespace = support::namespace("leader-lost");
    let log = open(&namespace);
    let term = log
        .election("reconciler", TTL, "a")
        .expect("election")
        .campaign(&|| false)
        .expect("campaign")
        .expect("leads");
    assert_eq!(
        term.wait_lost(TTL * 2),
        None,
        "renewed past its TTL while alive"
    );
    // The key disappears (an operator deletes it): the term is over within a poll or two.
    let endpoints = support::cluster().endpoints();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect(&endpoints, None)
            .await
            .expect("connect");
        client
            .delete(format!("{namespace}/v1/leader/reconciler"), None)
            .await
            .expect("delete the leader key");
    });
    let reason = term
        .wait_lost(Duration::from_secs(2))
        .expect("the term is over");
    assert!(reason.contains("gone"), "{reason}");
    assert!(term.lost().is_some());
}

/// Two servers (two `EtcdLog`s on one namespace) with pipelined committers and writers on both:
/// their transactions break each other's pipelines all the time. Every acknowledged append is in
/// the log exactly where its result says, positions are gapless and the chain verifies.
#[test]
fn pipelined_committers_of_two_servers_keep_positions_gapless_and_lose_nothing() {
    let namespace = support::namespace("pipeline");
    let mut options = support::cluster().options(&namespace);
    options.pipeline_depth = 4;
    let servers: Vec<Arc<EtcdLog>> = (0..2)
        .map(|_| Arc::new(EtcdLog::open(options.clone()).expect("open")))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let log = Arc::clone(&servers[w % 2]);
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let stream = format!("s{w}");
                let mut acked = Vec::new();
                let mut revision = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let event = event();
                    let id = event.id;
                    let request = AppendRequest::new(
                        stream.clone(),
                        ExpectedRevision::Exact(revision),
                        vec![event],
                    );
                    match log.append(request) {
                        Ok(result) => {
                            assert_eq!(result.first_revision, revision + 1);
                            revision = result.last_revision;
                            acked.push((id, result.first_position, result.first_revision));
                        }
                        Err(Error::Unavailable { .. }) => {
                            // Contention can exhaust the guard retries; the next loop rereads.
                            revision = log.stream_revision(&stream).expect("rev").unwrap_or(0);
                        }
                        Err(err) => panic!("writer {w}: {err}"),
                    }
                }
                (stream, acked)
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let mut acked: HashMap<String, Vec<(Uuid, Position, u64)>> = HashMap::new();
    for writer in writers {
        let (stream, list) = writer.join().expect("writer");
        acked.insert(stream, list);
    }
    let log = &servers[0];
    let report = log.verify(&|_, _, _| Ok(())).expect("verifies");
    let total: usize = acked.values().map(Vec::len).sum();
    assert!(total > 100, "the run appended something: {total}");
    let all = {
        let mut all = Vec::new();
        let mut after = Position(0);
        loop {
            let page = log.read_all(after, 5_000).expect("read");
            let Some(last) = page.last() else { break };
            after = last.position;
            all.extend(page);
        }
        all
    };
    assert_eq!(all.len() as u64, report.events);
    for (i, event) in all.iter().enumerate() {
        assert_eq!(event.position, Position(i as u64 + 1), "gapless");
    }
    for (stream, list) in &acked {
        for (id, position, revision) in list {
            let event = &all[(position.0 - 1) as usize];
            assert_eq!(
                (&event.id, &event.stream, event.revision),
                (id, stream, *revision)
            );
        }
    }
    let stats: Vec<_> = servers.iter().map(|s| s.commit_stats()).collect();
    eprintln!("commit stats of the two servers: {stats:?}");
}
