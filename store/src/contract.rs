//! The storage contract: one test suite every [`EventLog`] backend runs unchanged.
//!
//! A backend's test file provides a [`Fixture`] factory and expands [`crate::contract_tests!`]:
//!
//! ```text
//! fn fixture() -> Box<dyn vmplane_store::contract::Fixture> { /* a fresh, empty log */ }
//! vmplane_store::contract_tests!(fixture);
//! ```
//!
//! (`store/tests/contract_sled.rs` is the complete example.)
//!
//! Each contract is a public function taking the factory, so a failing one can also be run and
//! debugged alone. Every test names the behaviour it pins down.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use uuid::Uuid;

use crate::error::Error;
use crate::hash::{GENESIS_PREV_HASH, event_hash};
use crate::log::EventLog;
use crate::log::FencedLog;
use crate::types::{
    AppendRequest, AppendResult, Claim, Direction, ExpectedRevision, Fence, Position,
    ProposedEvent, RecordedEvent, Timestamp,
};

/// A log under test that can be closed and opened again on the same storage.
pub trait Fixture {
    /// The log. Callers drop their clones before [`Fixture::reopen`].
    fn log(&self) -> Arc<dyn EventLog>;
    /// Closes the log and opens the same storage again, as after a restart.
    fn reopen(&mut self) -> Arc<dyn EventLog>;
    /// Begins a new term of leadership `name` the way the backend's leaders do (sled: in
    /// process; etcd: a lease and the leader key), ending the term this fixture took before,
    /// and returns the new term's fence.
    fn take_fence(&mut self, name: &str) -> Fence;
}

/// Makes a fresh, empty log for one test.
pub type Factory<'a> = &'a dyn Fn() -> Box<dyn Fixture>;

/// Expands to one `#[test]` per contract, each calling `$factory()` for a fresh log.
#[macro_export]
macro_rules! contract_tests {
    ($factory:expr) => {
        $crate::contract_tests!(@tests $factory;
            appends_assign_gapless_positions_and_revisions_from_one,
            append_returns_durable_positions_visible_to_reads,
            expected_any_appends_whatever_the_revision,
            expected_no_stream_succeeds_only_on_an_empty_stream,
            expected_exact_succeeds_only_at_the_current_revision,
            expected_exact_zero_means_no_stream,
            conflict_reports_expected_and_actual_and_writes_nothing,
            multi_event_append_is_atomic,
            rejected_requests_do_not_fail_concurrent_ones,
            claims_are_acquired_released_and_reacquired,
            taken_claim_fails_the_whole_append,
            racing_claims_have_exactly_one_winner,
            retry_with_all_events_committed_returns_original_positions,
            retry_with_no_events_committed_appends_or_conflicts,
            retry_with_some_events_committed_is_refused,
            reused_event_ids_are_refused,
            invalid_requests_are_refused,
            limits_are_enforced_at_their_edge,
            read_stream_goes_forward_and_backward_from_a_revision,
            read_all_pages_in_position_order,
            scan_visits_every_event_and_stops_on_break,
            read_event_finds_one_position,
            events_are_hash_chained_and_timestamps_never_decrease,
            position_at_finds_the_last_event_at_or_before_a_time,
            subscription_catches_up_then_goes_live_without_gap_or_repeat,
            wait_for_returns_at_the_position_or_after_the_timeout,
            verify_accepts_an_intact_log_and_names_a_bad_payload,
            reopen_keeps_events_heads_claims_and_chain,
            concurrent_exact_appends_lose_no_update,
            a_stream_revision_seen_is_readable_at_once,
            log_matches_an_in_memory_model,
            fenced_append_with_a_stale_fence_is_rejected_and_writes_nothing,
        );
    };
    (@tests $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::contract::$name(&$factory);
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn event(n: u64) -> ProposedEvent {
    let id = Uuid::now_v7();
    let mut payload = n.to_le_bytes().to_vec();
    payload.extend_from_slice(id.as_bytes());
    ProposedEvent {
        id,
        event_type: "TestEvent".into(),
        schema_version: 1,
        payload,
        actor: "tester".into(),
        correlation_id: Uuid::now_v7(),
        causation_id: None,
    }
}

fn events(count: u64) -> Vec<ProposedEvent> {
    (0..count).map(event).collect()
}

fn append(
    log: &dyn EventLog,
    stream: &str,
    expected: ExpectedRevision,
    count: u64,
) -> Result<AppendResult, Error> {
    log.append(AppendRequest::new(stream, expected, events(count)))
}

fn must(result: Result<AppendResult, Error>) -> AppendResult {
    match result {
        Ok(result) => result,
        Err(err) => panic!("append failed: {err}"),
    }
}

fn all_events(log: &dyn EventLog) -> Vec<RecordedEvent> {
    let mut out = Vec::new();
    let mut after = Position(0);
    loop {
        let page = log.read_all(after, 1_000).expect("read_all");
        let Some(last) = page.last() else { return out };
        after = last.position;
        out.extend(page);
    }
}

fn accept_all(_: &str, _: u16, _: &[u8]) -> Result<(), String> {
    Ok(())
}

fn assert_gapless(events: &[RecordedEvent]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event.position,
            Position(index as u64 + 1),
            "positions are gapless from 1"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Appends, revisions, expected revision

/// Positions count from 1 across streams; revisions count from 1 per stream.
pub fn appends_assign_gapless_positions_and_revisions_from_one(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    assert_eq!(log.head(), Position(0));
    let a = must(append(&*log, "vm/a", ExpectedRevision::NoStream, 2));
    let b = must(append(&*log, "vm/b", ExpectedRevision::NoStream, 1));
    let a2 = must(append(&*log, "vm/a", ExpectedRevision::Exact(2), 1));
    assert_eq!(
        (a.first_position, a.last_position),
        (Position(1), Position(2))
    );
    assert_eq!((a.first_revision, a.last_revision), (1, 2));
    assert_eq!((b.first_position, b.first_revision), (Position(3), 1));
    assert_eq!(
        (a2.first_position, a2.first_revision, a2.last_revision),
        (Position(4), 3, 3)
    );
    assert!(!a.replayed && !b.replayed && !a2.replayed);
    assert_eq!(log.head(), Position(4));
    assert_eq!(log.stream_revision("vm/a").unwrap(), Some(3));
    assert_eq!(log.stream_revision("vm/b").unwrap(), Some(1));
    assert_eq!(log.stream_revision("vm/none").unwrap(), None);
}

/// An acknowledged append is readable at once, with every envelope field as proposed.
pub fn append_returns_durable_positions_visible_to_reads(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let mut proposed = event(7);
    proposed.causation_id = Some(Uuid::now_v7());
    proposed.schema_version = 3;
    let before = Timestamp::now();
    let result = must(log.append(AppendRequest::new(
        "vm/x",
        ExpectedRevision::Any,
        vec![proposed.clone()],
    )));
    let read = log
        .read_event(result.first_position)
        .unwrap()
        .expect("event is readable");
    assert_eq!(read.position, Position(1));
    assert_eq!(read.stream, "vm/x");
    assert_eq!(read.revision, 1);
    assert_eq!(read.id, proposed.id);
    assert_eq!(read.event_type, proposed.event_type);
    assert_eq!(read.schema_version, 3);
    assert_eq!(read.payload, proposed.payload);
    assert_eq!(read.actor, proposed.actor);
    assert_eq!(read.correlation_id, proposed.correlation_id);
    assert_eq!(read.causation_id, proposed.causation_id);
    assert!(
        read.recorded_at >= Timestamp(before.0 - 5_000_000_000),
        "recorded_at is now-ish"
    );
    assert_eq!(log.read_event(Position(2)).unwrap(), None);
    assert_eq!(log.read_event(Position(0)).unwrap(), None);
}

/// `Any` appends to a new stream and to an existing one.
pub fn expected_any_appends_whatever_the_revision(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    assert_eq!(
        must(append(&*log, "s", ExpectedRevision::Any, 1)).last_revision,
        1
    );
    assert_eq!(
        must(append(&*log, "s", ExpectedRevision::Any, 2)).last_revision,
        3
    );
}

/// `NoStream` succeeds on an empty stream and conflicts once it has events.
pub fn expected_no_stream_succeeds_only_on_an_empty_stream(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    must(append(&*log, "s", ExpectedRevision::NoStream, 1));
    match append(&*log, "s", ExpectedRevision::NoStream, 1) {
        Err(Error::Conflict {
            expected: ExpectedRevision::NoStream,
            actual: Some(1),
            ..
        }) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
}

/// `Exact(n)` succeeds at revision n only: below, above and on an empty stream it conflicts.
pub fn expected_exact_succeeds_only_at_the_current_revision(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    match append(&*log, "s", ExpectedRevision::Exact(1), 1) {
        Err(Error::Conflict { actual: None, .. }) => {}
        other => panic!("expected a conflict on an empty stream, got {other:?}"),
    }
    must(append(&*log, "s", ExpectedRevision::NoStream, 2));
    for wrong in [1, 3] {
        match append(&*log, "s", ExpectedRevision::Exact(wrong), 1) {
            Err(Error::Conflict {
                expected,
                actual: Some(2),
                ..
            }) => {
                assert_eq!(expected, ExpectedRevision::Exact(wrong));
            }
            other => panic!("expected a conflict for Exact({wrong}), got {other:?}"),
        }
    }
    assert_eq!(
        must(append(&*log, "s", ExpectedRevision::Exact(2), 1)).last_revision,
        3
    );
}

/// `Exact(0)` is "no events yet", so a fresh aggregate's revision 0 can be passed as is.
pub fn expected_exact_zero_means_no_stream(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    assert_eq!(
        must(append(&*log, "s", ExpectedRevision::Exact(0), 1)).first_revision,
        1
    );
    assert!(matches!(
        append(&*log, "s", ExpectedRevision::Exact(0), 1),
        Err(Error::Conflict {
            actual: Some(1),
            ..
        })
    ));
}

/// A conflict carries expected, actual and the unwritten ids, and changes nothing.
pub fn conflict_reports_expected_and_actual_and_writes_nothing(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    must(append(&*log, "s", ExpectedRevision::NoStream, 3));
    let request = AppendRequest::new("s", ExpectedRevision::Exact(1), events(2));
    let ids = request.event_ids();
    match log.append(request) {
        Err(err @ Error::Conflict { .. }) => {
            let Error::Conflict {
                ref stream,
                expected,
                actual,
                ref not_written,
            } = err
            else {
                unreachable!()
            };
            assert_eq!(stream, "s");
            assert_eq!(expected, ExpectedRevision::Exact(1));
            assert_eq!(actual, Some(3));
            assert_eq!(not_written, &ids);
            assert_eq!(err.not_written(), Some(&ids[..]));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(log.head(), Position(3));
    assert_eq!(log.stream_revision("s").unwrap(), Some(3));
}

/// All of an append's events land together, consecutively, or none do.
pub fn multi_event_append_is_atomic(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    must(append(&*log, "other", ExpectedRevision::Any, 1));
    let result = must(append(&*log, "s", ExpectedRevision::NoStream, 5));
    assert_eq!(
        (result.first_position, result.last_position),
        (Position(2), Position(6))
    );
    assert!(append(&*log, "s", ExpectedRevision::NoStream, 5).is_err());
    let stream = log.read_stream("s", 1, Direction::Forward, 100).unwrap();
    assert_eq!(stream.len(), 5);
    for (i, event) in stream.iter().enumerate() {
        assert_eq!(event.revision, i as u64 + 1);
        assert_eq!(event.position, Position(i as u64 + 2));
    }
    assert_eq!(log.head(), Position(6));
}

/// Under concurrency (one group commit), a conflicting append fails alone.
pub fn rejected_requests_do_not_fail_concurrent_ones(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    must(append(&*log, "taken", ExpectedRevision::NoStream, 1));
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let log = Arc::clone(&log);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                if i % 2 == 0 {
                    append(&*log, "taken", ExpectedRevision::NoStream, 1).is_err()
                } else {
                    append(&*log, &format!("free/{i}"), ExpectedRevision::NoStream, 2).is_ok()
                }
            })
        })
        .collect();
    for handle in handles {
        assert!(handle.join().unwrap(), "each append fares on its own");
    }
    let all = all_events(&*log);
    assert_eq!(all.len(), 1 + 2 * threads / 2);
    assert_gapless(&all);
}

// ---------------------------------------------------------------------------------------------
// Claims

fn acquire(key: &str, owner: &str) -> Claim {
    Claim::Acquire {
        key: key.into(),
        owner: owner.into(),
    }
}

fn release(key: &str, owner: &str) -> Claim {
    Claim::Release {
        key: key.into(),
        owner: owner.into(),
    }
}

/// Acquire, re-acquire by the holder (no-op), release by a stranger (no-op), release, acquire
/// by another.
pub fn claims_are_acquired_released_and_reacquired(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let claim = |stream: &str, claim: Claim| {
        log.append(AppendRequest::new(stream, ExpectedRevision::Any, events(1)).with_claim(claim))
    };
    assert_eq!(log.claim_holder("fw/1").unwrap(), None);
    must(claim("vm/a", acquire("fw/1", "a")));
    assert_eq!(log.claim_holder("fw/1").unwrap().as_deref(), Some("a"));
    must(claim("vm/a", acquire("fw/1", "a")));
    must(claim("vm/b", release("fw/1", "b")));
    assert_eq!(log.claim_holder("fw/1").unwrap().as_deref(), Some("a"));
    must(claim("vm/a", release("fw/1", "a")));
    assert_eq!(log.claim_holder("fw/1").unwrap(), None);
    must(claim("vm/b", acquire("fw/1", "b")));
    assert_eq!(log.claim_holder("fw/1").unwrap().as_deref(), Some("b"));
    // Release and acquire in one append hands a key over atomically.
    must(
        log.append(
            AppendRequest::new("vm/b", ExpectedRevision::Any, events(1))
                .with_claim(release("fw/1", "b"))
                .with_claim(acquire("fw/2", "b")),
        ),
    );
    assert_eq!(log.claim_holder("fw/1").unwrap(), None);
    assert_eq!(log.claim_holder("fw/2").unwrap().as_deref(), Some("b"));
}

/// A taken key fails the append (events and other claims too) and names the holder.
pub fn taken_claim_fails_the_whole_append(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    must(
        log.append(
            AppendRequest::new("vm/a", ExpectedRevision::NoStream, events(1))
                .with_claim(acquire("fw/1", "a")),
        ),
    );
    let request = AppendRequest::new("vm/b", ExpectedRevision::NoStream, events(2))
        .with_claim(acquire("fw/2", "b"))
        .with_claim(acquire("fw/1", "b"));
    let ids = request.event_ids();
    match log.append(request) {
        Err(Error::ClaimTaken {
            key,
            holder,
            not_written,
        }) => {
            assert_eq!((key.as_str(), holder.as_str()), ("fw/1", "a"));
            assert_eq!(not_written, ids);
        }
        other => panic!("expected ClaimTaken, got {other:?}"),
    }
    assert_eq!(log.claim_holder("fw/2").unwrap(), None, "no partial claim");
    assert_eq!(log.stream_revision("vm/b").unwrap(), None, "no events");
    assert_eq!(log.head(), Position(1));
}

/// Many appenders racing for one key: exactly one wins, every other one sees it taken.
pub fn racing_claims_have_exactly_one_winner(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    for round in 0..5 {
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let key = format!("fw/race-{round}");
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (log, barrier, key) = (Arc::clone(&log), Arc::clone(&barrier), key.clone());
                thread::spawn(move || {
                    let owner = format!("vm-{i}");
                    barrier.wait();
                    let request = AppendRequest::new(
                        format!("vm/{round}/{i}"),
                        ExpectedRevision::NoStream,
                        events(1),
                    )
                    .with_claim(acquire(&key, &owner));
                    match log.append(request) {
                        Ok(_) => Some(owner),
                        Err(Error::ClaimTaken { .. }) => None,
                        Err(err) => panic!("unexpected error: {err}"),
                    }
                })
            })
            .collect();
        let winners: Vec<String> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        assert_eq!(winners.len(), 1, "exactly one winner in round {round}");
        assert_eq!(log.claim_holder(&key).unwrap(), Some(winners[0].clone()));
    }
}

// ---------------------------------------------------------------------------------------------
// Idempotency (EventStoreDB's rule)

/// A retry whose events are all committed returns the original positions and writes nothing,
/// under `NoStream`, `Exact` and `Any`, even after other appends.
pub fn retry_with_all_events_committed_returns_original_positions(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    for expected in [
        ExpectedRevision::NoStream,
        ExpectedRevision::Exact(2),
        ExpectedRevision::Any,
    ] {
        let request = AppendRequest::new("s", expected, events(2));
        let original = must(log.append(request.clone()));
        must(append(&*log, "noise", ExpectedRevision::Any, 1));
        let head = log.head();
        let retried = must(log.append(request));
        assert!(retried.replayed, "{expected}: the retry is a replay");
        assert_eq!(
            (
                retried.first_position,
                retried.last_position,
                retried.first_revision,
                retried.last_revision
            ),
            (
                original.first_position,
                original.last_position,
                original.first_revision,
                original.last_revision
            ),
        );
        assert_eq!(log.head(), head, "a replay writes nothing");
    }
    assert_eq!(log.stream_revision("s").unwrap(), Some(6));
}

/// A retry none of whose events are committed is a normal append: it succeeds or conflicts.
pub fn retry_with_no_events_committed_appends_or_conflicts(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let request = AppendRequest::new("s", ExpectedRevision::NoStream, events(1));
    must(append(&*log, "s", ExpectedRevision::NoStream, 1));
    assert!(matches!(
        log.append(request.clone()),
        Err(Error::Conflict { .. })
    ));
    let mut retry = request;
    retry.expected = ExpectedRevision::Exact(1);
    assert!(!must(log.append(retry)).replayed);
}

/// A retry whose events are partly committed is refused, naming both halves.
pub fn retry_with_some_events_committed_is_refused(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let first = AppendRequest::new("s", ExpectedRevision::NoStream, events(2));
    must(log.append(first.clone()));
    let mut mixed = first.clone();
    let fresh = event(9);
    mixed.events.push(fresh.clone());
    match log.append(mixed) {
        Err(Error::PartiallyCommitted {
            committed,
            not_written,
            ..
        }) => {
            assert_eq!(committed, first.event_ids());
            assert_eq!(not_written, vec![fresh.id]);
        }
        other => panic!("expected PartiallyCommitted, got {other:?}"),
    }
    assert_eq!(log.head(), Position(2));
}

/// Committed ids proposed again elsewhere (another stream, another expected revision) are
/// refused instead of duplicated or silently replayed.
pub fn reused_event_ids_are_refused(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let original = AppendRequest::new("s", ExpectedRevision::NoStream, events(1));
    must(log.append(original.clone()));
    let mut other_stream = original.clone();
    other_stream.stream = "t".into();
    assert!(matches!(
        log.append(other_stream),
        Err(Error::EventIdReused { .. })
    ));
    let mut other_revision = original;
    other_revision.expected = ExpectedRevision::Exact(5);
    assert!(matches!(
        log.append(other_revision),
        Err(Error::EventIdReused {
            position: Position(1),
            ..
        })
    ));
    assert_eq!(log.head(), Position(1));
}

/// Requests that can never succeed are refused before anything is decided.
pub fn invalid_requests_are_refused(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let invalid = |request: AppendRequest| {
        assert!(
            matches!(log.append(request), Err(Error::InvalidRequest { .. })),
            "refused as invalid"
        );
    };
    invalid(AppendRequest::new("s", ExpectedRevision::Any, Vec::new()));
    invalid(AppendRequest::new("", ExpectedRevision::Any, events(1)));
    let twice = event(1);
    invalid(AppendRequest::new(
        "s",
        ExpectedRevision::Any,
        vec![twice.clone(), twice],
    ));
    let mut untyped = event(1);
    untyped.event_type.clear();
    invalid(AppendRequest::new(
        "s",
        ExpectedRevision::Any,
        vec![untyped],
    ));
    invalid(AppendRequest::new("s", ExpectedRevision::Any, events(1)).with_claim(acquire("", "a")));
    assert_eq!(log.head(), Position(0));
}

/// Every limit admits its maximum and refuses one more, naming itself.
pub fn limits_are_enforced_at_their_edge(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let limits = *log.limits();
    let refused = |request: AppendRequest, name: &str| match log.append(request) {
        Err(Error::LimitExceeded { limit, .. }) => assert_eq!(limit, name),
        other => panic!("expected {name} to be exceeded, got {other:?}"),
    };
    let n = limits.append_batch_events_max as u64;
    must(append(&*log, "batch", ExpectedRevision::Any, n));
    refused(
        AppendRequest::new("batch", ExpectedRevision::Any, events(n + 1)),
        "append_batch_events_max",
    );

    let mut big = event(0);
    big.payload = vec![7; limits.event_payload_bytes_max];
    must(log.append(AppendRequest::new(
        "big",
        ExpectedRevision::Any,
        vec![big.clone()],
    )));
    big.id = Uuid::now_v7();
    big.payload.push(7);
    refused(
        AppendRequest::new("big", ExpectedRevision::Any, vec![big]),
        "event_payload_bytes_max",
    );

    let per_event = limits
        .event_payload_bytes_max
        .min(limits.append_payload_bytes_max);
    let count = limits.append_payload_bytes_max.div_ceil(per_event) + 1;
    let heavy: Vec<ProposedEvent> = (0..count)
        .map(|i| {
            let mut e = event(i as u64);
            e.payload = vec![1; per_event];
            e
        })
        .collect();
    if count <= limits.append_batch_events_max {
        refused(
            AppendRequest::new("heavy", ExpectedRevision::Any, heavy),
            "append_payload_bytes_max",
        );
    }

    let name = "s".repeat(limits.stream_name_bytes_max);
    must(append(&*log, &name, ExpectedRevision::Any, 1));
    refused(
        AppendRequest::new(name + "s", ExpectedRevision::Any, events(1)),
        "stream_name_bytes_max",
    );

    let mut typed = event(0);
    typed.event_type = "t".repeat(limits.event_type_bytes_max);
    must(log.append(AppendRequest::new(
        "t",
        ExpectedRevision::Any,
        vec![typed.clone()],
    )));
    typed.id = Uuid::now_v7();
    typed.event_type.push('t');
    refused(
        AppendRequest::new("t", ExpectedRevision::Any, vec![typed]),
        "event_type_bytes_max",
    );

    let mut acted = event(0);
    acted.actor = "a".repeat(limits.actor_bytes_max);
    must(log.append(AppendRequest::new(
        "a",
        ExpectedRevision::Any,
        vec![acted.clone()],
    )));
    acted.id = Uuid::now_v7();
    acted.actor.push('a');
    refused(
        AppendRequest::new("a", ExpectedRevision::Any, vec![acted]),
        "actor_bytes_max",
    );

    let key = "k".repeat(limits.claim_bytes_max);
    must(log.append(
        AppendRequest::new("c", ExpectedRevision::Any, events(1)).with_claim(acquire(&key, "o")),
    ));
    refused(
        AppendRequest::new("c", ExpectedRevision::Any, events(1))
            .with_claim(acquire(&(key + "k"), "o")),
        "claim_bytes_max",
    );
    let claims = |count: usize| {
        (0..count).fold(
            AppendRequest::new("c", ExpectedRevision::Any, events(1)),
            |r, i| r.with_claim(acquire(&format!("many/{i}"), "o")),
        )
    };
    must(log.append(claims(limits.append_claims_max)));
    refused(claims(limits.append_claims_max + 1), "append_claims_max");

    let read_max = limits.read_events_max;
    assert_eq!(
        log.read_all(Position(0), read_max + 1).unwrap().len(),
        read_max.min(log.head().0 as usize)
    );
    assert_eq!(
        log.read_stream("batch", 1, Direction::Forward, usize::MAX)
            .unwrap()
            .len(),
        read_max.min(limits.append_batch_events_max)
    );
}

// ---------------------------------------------------------------------------------------------
// Reads

/// Stream reads start at any revision, in both directions, with a maximum count, and skip other
/// streams' events.
pub fn read_stream_goes_forward_and_backward_from_a_revision(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    for i in 0..4 {
        must(append(&*log, "s", ExpectedRevision::Any, 3));
        must(append(
            &*log,
            &format!("noise/{i}"),
            ExpectedRevision::Any,
            1,
        ));
    }
    let revisions = |events: Vec<RecordedEvent>| {
        assert!(events.iter().all(|e| e.stream == "s"));
        events.iter().map(|e| e.revision).collect::<Vec<_>>()
    };
    let forward =
        |from, max| revisions(log.read_stream("s", from, Direction::Forward, max).unwrap());
    let backward = |from, max| {
        revisions(
            log.read_stream("s", from, Direction::Backward, max)
                .unwrap(),
        )
    };
    assert_eq!(forward(1, 100), (1..=12).collect::<Vec<_>>());
    assert_eq!(forward(0, 2), vec![1, 2]);
    assert_eq!(forward(5, 4), vec![5, 6, 7, 8]);
    assert_eq!(forward(12, 10), vec![12]);
    assert_eq!(forward(13, 10), Vec::<u64>::new());
    assert_eq!(backward(u64::MAX, 3), vec![12, 11, 10]);
    assert_eq!(backward(5, 10), vec![5, 4, 3, 2, 1]);
    assert_eq!(backward(0, 10), Vec::<u64>::new());
    assert_eq!(forward(1, 0), Vec::<u64>::new());
    assert!(
        log.read_stream("missing", 1, Direction::Forward, 10)
            .unwrap()
            .is_empty()
    );
    assert!(
        log.read_stream("missing", u64::MAX, Direction::Backward, 10)
            .unwrap()
            .is_empty()
    );
    // A stream whose name is a prefix of another's does not see its events.
    must(append(&*log, "s2", ExpectedRevision::Any, 1));
    assert_eq!(forward(1, 100).len(), 12);
}

/// `read_all` pages through the log in position order from any position.
pub fn read_all_pages_in_position_order(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    for i in 0..10 {
        must(append(
            &*log,
            &format!("s/{}", i % 3),
            ExpectedRevision::Any,
            1 + i % 4,
        ));
    }
    let all = all_events(&*log);
    assert_eq!(all.len() as u64, log.head().0);
    assert_gapless(&all);
    let middle = log.read_all(Position(5), 3).unwrap();
    assert_eq!(
        middle.iter().map(|e| e.position.0).collect::<Vec<_>>(),
        vec![6, 7, 8]
    );
    assert!(log.read_all(log.head(), 10).unwrap().is_empty());
    assert!(log.read_all(Position(u64::MAX), 10).unwrap().is_empty());
}

/// `scan` visits every event after a position, borrowed, and stops when told.
pub fn scan_visits_every_event_and_stops_on_break(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    for _ in 0..5 {
        must(append(&*log, "s", ExpectedRevision::Any, 4));
    }
    let mut seen = Vec::new();
    let last = log
        .scan(Position(3), &mut |event| {
            seen.push((event.position.0, event.revision, event.payload.to_vec()));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(last, Position(20));
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        (4..=20).collect::<Vec<_>>()
    );
    let owned = all_events(&*log);
    for (position, revision, payload) in &seen {
        let e = &owned[*position as usize - 1];
        assert_eq!((&e.revision, &e.payload), (revision, payload));
    }
    let mut count = 0;
    let stopped = log
        .scan(Position(0), &mut |_| {
            count += 1;
            if count == 7 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!((count, stopped), (7, Position(7)));
    assert_eq!(
        log.scan(Position(20), &mut |_| ControlFlow::Continue(()))
            .unwrap(),
        Position(20)
    );
}

/// `read_event` returns the event at a position, `None` past the head.
pub fn read_event_finds_one_position(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    must(append(&*log, "a", ExpectedRevision::Any, 3));
    must(append(&*log, "b", ExpectedRevision::Any, 3));
    let all = all_events(&*log);
    for event in &all {
        assert_eq!(
            log.read_event(event.position).unwrap().as_ref(),
            Some(event)
        );
    }
    assert_eq!(log.read_event(Position(7)).unwrap(), None);
}

/// Each event's `prev_hash` is the previous event's `hash` (zeros first), `hash` is
/// [`event_hash`], and `recorded_at` never decreases.
pub fn events_are_hash_chained_and_timestamps_never_decrease(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    for i in 0..6 {
        must(append(
            &*log,
            &format!("s/{}", i % 2),
            ExpectedRevision::Any,
            2,
        ));
    }
    let mut prev = GENESIS_PREV_HASH;
    let mut time = Timestamp(i64::MIN);
    for event in all_events(&*log) {
        assert_eq!(event.prev_hash, prev);
        assert_eq!(event.hash, event_hash(&event.as_ref()));
        assert!(event.recorded_at >= time);
        prev = event.hash;
        time = event.recorded_at;
    }
    assert_eq!(log.verify(&accept_all).unwrap().head_hash, prev);
}

/// `position_at(t)` is the last position recorded at or before `t`.
pub fn position_at_finds_the_last_event_at_or_before_a_time(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    assert_eq!(log.position_at(Timestamp::now()).unwrap(), Position(0));
    let mut marks = Vec::new();
    for _ in 0..4 {
        must(append(&*log, "s", ExpectedRevision::Any, 2));
        thread::sleep(Duration::from_millis(2));
    }
    for event in all_events(&*log) {
        marks.push((event.position, event.recorded_at));
    }
    for (position, at) in &marks {
        let last_at_that_time = marks.iter().filter(|(_, t)| t <= at).map(|(p, _)| *p).max();
        assert_eq!(
            Some(log.position_at(*at).unwrap()),
            last_at_that_time,
            "at {position}"
        );
        assert!(log.position_at(Timestamp(at.0 - 1)).unwrap() < *position);
    }
    assert_eq!(
        log.position_at(Timestamp(marks[0].1.0 - 1)).unwrap(),
        Position(0)
    );
    assert_eq!(log.position_at(Timestamp(i64::MAX)).unwrap(), log.head());
    assert_eq!(log.position_at(Timestamp(i64::MIN)).unwrap(), Position(0));
}

// ---------------------------------------------------------------------------------------------
// Subscriptions and waiting

/// A subscription from a position delivers the backlog, then live events from concurrent
/// writers, each exactly once and in position order.
pub fn subscription_catches_up_then_goes_live_without_gap_or_repeat(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    for _ in 0..10 {
        must(append(&*log, "before", ExpectedRevision::Any, 3));
    }
    let writers = 4;
    let per_writer = 25;
    let total = 30 + writers * per_writer;
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let log = Arc::clone(&log);
            thread::spawn(move || {
                for i in 0..per_writer {
                    must(append(
                        &*log,
                        &format!("live/{w}"),
                        ExpectedRevision::Any,
                        1,
                    ));
                    if i % 5 == 0 {
                        thread::sleep(Duration::from_millis(1));
                    }
                }
            })
        })
        .collect();
    let mut subscription = Arc::clone(&log).subscribe(Position(5));
    let mut delivered = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while delivered.len() < total as usize - 5 && Instant::now() < deadline {
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
    assert_eq!(
        delivered,
        (6..=total).collect::<Vec<_>>(),
        "no gap, no repeat, in order"
    );
    assert_eq!(subscription.position(), Position(total));
    assert!(
        subscription
            .next_batch(10, Duration::from_millis(20))
            .unwrap()
            .is_empty()
    );
}

/// `wait_for` returns as soon as the head reaches the position, or with the old head after the
/// timeout.
pub fn wait_for_returns_at_the_position_or_after_the_timeout(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    must(append(&*log, "s", ExpectedRevision::Any, 1));
    assert_eq!(
        log.wait_for(Position(1), Duration::ZERO).unwrap(),
        Position(1)
    );
    let started = Instant::now();
    assert_eq!(
        log.wait_for(Position(2), Duration::from_millis(50))
            .unwrap(),
        Position(1)
    );
    assert!(started.elapsed() >= Duration::from_millis(45));
    let writer = {
        let log = Arc::clone(&log);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(30));
            must(append(&*log, "s", ExpectedRevision::Any, 2));
        })
    };
    let started = Instant::now();
    assert!(log.wait_for(Position(3), Duration::from_secs(10)).unwrap() >= Position(3));
    assert!(started.elapsed() < Duration::from_secs(5));
    writer.join().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Verify, restart, concurrency

/// `verify` walks an intact log; a payload its validator rejects is reported at its position.
pub fn verify_accepts_an_intact_log_and_names_a_bad_payload(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    assert_eq!(log.verify(&accept_all).unwrap().events, 0);
    for i in 0..5 {
        must(append(&*log, &format!("s/{i}"), ExpectedRevision::Any, 2));
    }
    let report = log.verify(&accept_all).unwrap();
    assert_eq!(report.events, 10);
    let bad = log.read_event(Position(7)).unwrap().unwrap().payload;
    let picky = move |event_type: &str, version: u16, payload: &[u8]| {
        assert_eq!((event_type, version), ("TestEvent", 1));
        if payload == bad.as_slice() {
            Err("not a TestEvent".to_owned())
        } else {
            Ok(())
        }
    };
    match log.verify(&picky) {
        Err(Error::Corrupt { position, reason }) => {
            assert_eq!(position, Position(7));
            assert!(reason.contains("not a TestEvent"), "{reason}");
        }
        other => panic!("expected Corrupt at 7, got {other:?}"),
    }
}

/// After a restart: every event, stream revision, claim, the chain and the idempotency index.
pub fn reopen_keeps_events_heads_claims_and_chain(factory: Factory<'_>) {
    let mut fixture = factory();
    let log = fixture.log();
    let first = AppendRequest::new("vm/a", ExpectedRevision::NoStream, events(3))
        .with_claim(acquire("fw/a", "a"));
    let first_result = must(log.append(first.clone()));
    for i in 0..20 {
        must(append(
            &*log,
            &format!("vm/{}", i % 4),
            ExpectedRevision::Any,
            1 + i % 3,
        ));
    }
    let before = all_events(&*log);
    let report = log.verify(&accept_all).unwrap();
    drop(log);
    let log = fixture.reopen();
    assert_eq!(all_events(&*log), before);
    assert_eq!(log.verify(&accept_all).unwrap(), report);
    assert_eq!(log.head(), Position(before.len() as u64));
    assert_eq!(log.claim_holder("fw/a").unwrap().as_deref(), Some("a"));
    for stream in ["vm/a", "vm/0", "vm/1", "vm/2", "vm/3"] {
        let last = before
            .iter()
            .filter(|e| e.stream == stream)
            .map(|e| e.revision)
            .max();
        assert_eq!(log.stream_revision(stream).unwrap(), last, "{stream}");
    }
    let replay = must(log.append(first));
    assert!(replay.replayed);
    assert_eq!(replay.first_position, first_result.first_position);
    let next = must(append(&*log, "vm/a", ExpectedRevision::Exact(3), 1));
    assert_eq!(next.first_position, Position(before.len() as u64 + 1));
    assert_eq!(
        log.read_event(next.first_position)
            .unwrap()
            .unwrap()
            .prev_hash,
        report.head_hash
    );
    drop(log);
    let log = fixture.reopen();
    assert_eq!(
        log.verify(&accept_all).unwrap().events,
        before.len() as u64 + 1
    );
}

/// Many threads doing read-decide-append with `Exact` on one stream: no update is lost, and
/// positions stay gapless.
pub fn concurrent_exact_appends_lose_no_update(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    let threads = 8u64;
    let per_thread = 15u64;
    let conflicts = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (log, conflicts) = (Arc::clone(&log), Arc::clone(&conflicts));
            thread::spawn(move || {
                let mut done = 0;
                while done < per_thread {
                    let revision = log.stream_revision("counter").unwrap().unwrap_or(0);
                    match append(&*log, "counter", ExpectedRevision::Exact(revision), 1) {
                        Ok(result) => {
                            assert_eq!(result.first_revision, revision + 1);
                            done += 1;
                        }
                        Err(Error::Conflict { .. }) => {
                            conflicts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => panic!("unexpected: {err}"),
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(
        log.stream_revision("counter").unwrap(),
        Some(threads * per_thread)
    );
    let all = all_events(&*log);
    assert_eq!(all.len() as u64, threads * per_thread);
    assert_gapless(&all);
    let revisions: Vec<u64> = all.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, (1..=threads * per_thread).collect::<Vec<_>>());
    log.verify(&accept_all).unwrap();
}

/// Whoever learns a stream's revision (`stream_revision`) can read the event at it at once
/// (`read_stream`), while appends to the stream go on: a revision is never announced before
/// the head that includes it. (Commands read the revision, then the state at it; the other
/// order answered a racing write NotFound.)
pub fn a_stream_revision_seen_is_readable_at_once(factory: Factory<'_>) {
    let fixture = factory();
    let log = fixture.log();
    // For a while rather than a count: a few thousand appends on the embedded logs, fewer on
    // a networked one. The window this looks for is narrow, so it wants many.
    let writers = 2u64;
    let until = Instant::now() + Duration::from_millis(1500);
    let appended = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let checked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (log, done, checked) = (Arc::clone(&log), Arc::clone(&done), Arc::clone(&checked));
            thread::spawn(move || {
                while done.load(Ordering::Acquire) < writers {
                    let Some(revision) = log.stream_revision("raced").unwrap() else {
                        continue;
                    };
                    let read = log
                        .read_stream("raced", revision, Direction::Backward, 1)
                        .unwrap();
                    let got: Vec<u64> = read.iter().map(|e| e.revision).collect();
                    assert_eq!(
                        got,
                        vec![revision],
                        "revision {revision} was announced but reading it gave {got:?}"
                    );
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let writing: Vec<_> = (0..writers)
        .map(|_| {
            let (log, done, appended) =
                (Arc::clone(&log), Arc::clone(&done), Arc::clone(&appended));
            thread::spawn(move || {
                while Instant::now() < until {
                    must(append(&*log, "raced", ExpectedRevision::Any, 1));
                    appended.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Release);
            })
        })
        .collect();
    for handle in writing.into_iter().chain(readers) {
        handle.join().unwrap();
    }
    assert_eq!(
        log.stream_revision("raced").unwrap(),
        Some(appended.load(Ordering::Relaxed))
    );
    assert!(
        checked.load(Ordering::Relaxed) > 0,
        "no read raced the writes"
    );
}

// ---------------------------------------------------------------------------------------------
// Model-based test

#[derive(Clone, Debug)]
enum Op {
    Append {
        stream: u8,
        expected: ModelExpected,
        count: u8,
        claim: Option<(u8, bool, u8)>,
    },
    /// Retry the `nth` earlier request (modulo how many there were), possibly with one extra
    /// fresh event.
    Retry {
        nth: u8,
        extra: bool,
    },
    Reopen,
}

#[derive(Clone, Copy, Debug)]
enum ModelExpected {
    Any,
    NoStream,
    /// The current revision plus this offset (−1, 0 or +1).
    Current(i8),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let expected = prop_oneof![
        Just(ModelExpected::Any),
        Just(ModelExpected::NoStream),
        (-1i8..=1).prop_map(ModelExpected::Current),
    ];
    prop_oneof![
        6 => (0u8..3, expected, 1u8..4, proptest::option::of((0u8..2, any::<bool>(), 0u8..3)))
            .prop_map(|(stream, expected, count, claim)| Op::Append { stream, expected, count, claim }),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(nth, extra)| Op::Retry { nth, extra }),
        1 => Just(Op::Reopen),
    ]
}

/// The in-memory model: the same rules, the obvious way.
#[derive(Default)]
struct Model {
    events: Vec<(String, u64, Uuid)>,
    heads: HashMap<String, u64>,
    claims: BTreeMap<String, String>,
    ids: HashMap<Uuid, usize>,
}

impl Model {
    fn append(&mut self, request: &AppendRequest) -> Result<AppendResult, &'static str> {
        let found: Vec<Option<usize>> = request
            .events
            .iter()
            .map(|e| self.ids.get(&e.id).copied())
            .collect();
        let committed = found.iter().flatten().count();
        if committed == request.events.len() {
            let first = found[0].unwrap_or(0);
            let (stream, revision, _) = &self.events[first];
            let in_place = found.iter().enumerate().all(|(i, at)| {
                *at == Some(first + i) && self.events[first + i].0 == request.stream
            }) && stream == &request.stream
                && request
                    .expected
                    .first_revision()
                    .is_none_or(|r| r == *revision);
            if !in_place {
                return Err("reused");
            }
            let n = request.events.len() as u64;
            return Ok(AppendResult {
                first_position: Position(first as u64 + 1),
                last_position: Position(first as u64 + n),
                first_revision: *revision,
                last_revision: revision + n - 1,
                replayed: true,
            });
        }
        if committed > 0 {
            return Err("partial");
        }
        let actual = self.heads.get(&request.stream).copied();
        if !request.expected.admits(actual) {
            return Err("conflict");
        }
        let mut claims = self.claims.clone();
        for claim in &request.claims {
            match claim {
                Claim::Acquire { key, owner } => match claims.get(key) {
                    Some(holder) if holder != owner => return Err("claim"),
                    _ => {
                        claims.insert(key.clone(), owner.clone());
                    }
                },
                Claim::Release { key, owner } => {
                    if claims.get(key) == Some(owner) {
                        claims.remove(key);
                    }
                }
            }
        }
        self.claims = claims;
        let first_revision = actual.unwrap_or(0) + 1;
        let first_position = self.events.len() as u64 + 1;
        for (i, event) in request.events.iter().enumerate() {
            self.ids.insert(event.id, self.events.len());
            self.events
                .push((request.stream.clone(), first_revision + i as u64, event.id));
        }
        let n = request.events.len() as u64;
        self.heads
            .insert(request.stream.clone(), first_revision + n - 1);
        Ok(AppendResult {
            first_position: Position(first_position),
            last_position: Position(first_position + n - 1),
            first_revision,
            last_revision: first_revision + n - 1,
            replayed: false,
        })
    }
}

fn error_kind(err: &Error) -> &'static str {
    match err {
        Error::Conflict { .. } => "conflict",
        Error::ClaimTaken { .. } => "claim",
        Error::PartiallyCommitted { .. } => "partial",
        Error::EventIdReused { .. } => "reused",
        _ => "other",
    }
}

fn run_model(factory: Factory<'_>, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut fixture = factory();
    let mut log = fixture.log();
    let mut model = Model::default();
    let mut sent: Vec<AppendRequest> = Vec::new();
    for op in ops {
        let request = match op {
            Op::Reopen => {
                drop(log);
                log = fixture.reopen();
                continue;
            }
            Op::Append {
                stream,
                expected,
                count,
                claim,
            } => {
                let stream = format!("s{stream}");
                let current = model.heads.get(&stream).copied().unwrap_or(0);
                let expected = match expected {
                    ModelExpected::Any => ExpectedRevision::Any,
                    ModelExpected::NoStream => ExpectedRevision::NoStream,
                    ModelExpected::Current(offset) => {
                        ExpectedRevision::Exact(current.saturating_add_signed(i64::from(*offset)))
                    }
                };
                let mut request = AppendRequest::new(stream, expected, events(u64::from(*count)));
                if let Some((key, take, owner)) = claim {
                    let (key, owner) = (format!("k{key}"), format!("o{owner}"));
                    request = request.with_claim(if *take {
                        Claim::Acquire { key, owner }
                    } else {
                        Claim::Release { key, owner }
                    });
                }
                request
            }
            Op::Retry { nth, extra } => {
                if sent.is_empty() {
                    continue;
                }
                let mut request = sent[usize::from(*nth) % sent.len()].clone();
                if *extra {
                    request.events.push(event(99));
                }
                request
            }
        };
        sent.push(request.clone());
        let expected = model.append(&request);
        let actual = log.append(request);
        match (&expected, &actual) {
            (Ok(want), Ok(got)) => prop_assert_eq!(want, got),
            (Err(want), Err(got)) => prop_assert_eq!(*want, error_kind(got), "{}", got),
            _ => prop_assert!(false, "model says {:?}, log says {:?}", expected, actual),
        }
    }
    let all = all_events(&*log);
    let got: Vec<(String, u64, Uuid)> = all
        .iter()
        .map(|e| (e.stream.clone(), e.revision, e.id))
        .collect();
    prop_assert_eq!(&got, &model.events);
    for (stream, revision) in &model.heads {
        prop_assert_eq!(log.stream_revision(stream).unwrap(), Some(*revision));
    }
    for key in ["k0", "k1"] {
        prop_assert_eq!(
            log.claim_holder(key).unwrap(),
            model.claims.get(key).cloned()
        );
    }
    let streams: HashSet<&String> = model.heads.keys().collect();
    for stream in streams {
        let read = log
            .read_stream(stream, 1, Direction::Forward, usize::MAX)
            .unwrap();
        let want: Vec<u64> = model
            .events
            .iter()
            .filter(|e| &e.0 == stream)
            .map(|e| e.1)
            .collect();
        prop_assert_eq!(read.iter().map(|e| e.revision).collect::<Vec<_>>(), want);
    }
    prop_assert_eq!(
        log.verify(&accept_all).unwrap().events,
        model.events.len() as u64
    );
    Ok(())
}

/// Random sequences of appends, retries and restarts give the same results and the same log as
/// an in-memory model of the rules.
pub fn log_matches_an_in_memory_model(factory: Factory<'_>) {
    let cases = std::env::var("VMPLANE_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(op_strategy(), 1..40), |ops| {
        run_model(factory, &ops)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}

/// An append fenced by a leadership term that is over fails with [`Error::Fenced`] naming the
/// fence and the current term, and writes nothing, while unfenced appends committed at the same
/// time succeed; the current term's fenced appends land.
pub fn fenced_append_with_a_stale_fence_is_rejected_and_writes_nothing(factory: Factory<'_>) {
    let mut fixture = factory();
    let old = fixture.take_fence("contract-leader");
    let log = fixture.log();
    let first = log
        .append_fenced(
            AppendRequest::new("fenced", ExpectedRevision::NoStream, events(1)),
            &old,
        )
        .expect("the current term's fenced append lands");
    assert_eq!(
        (first.first_position, first.last_revision),
        (Position(1), 1)
    );

    let new = fixture.take_fence("contract-leader");
    assert_eq!(new.name, old.name);
    assert_ne!(new.token, old.token, "a new term has a new token");

    // The deposed term tries again and again while other writers append unfenced, so that
    // (on a group-committing backend) its appends share batches with theirs.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let log = Arc::clone(&log);
            thread::spawn(move || {
                for _ in 0..10 {
                    append(log.as_ref(), &format!("free-{w}"), ExpectedRevision::Any, 1)
                        .expect("an unfenced append is not failed by a stale fence");
                }
            })
        })
        .collect();
    let mut refused_ids = Vec::new();
    for _ in 0..10 {
        let request = AppendRequest::new("fenced", ExpectedRevision::Exact(1), events(2));
        let ids = request.event_ids();
        match log.append_fenced(request, &old) {
            Err(Error::Fenced {
                fence,
                current,
                not_written,
            }) => {
                assert_eq!(fence, old);
                assert_eq!(current, Some(new.token), "the error names the current term");
                assert_eq!(not_written, ids);
            }
            other => panic!("a stale fence must be refused, got {other:?}"),
        }
        refused_ids.extend(ids);
    }
    // Through the adapter the command path uses, too.
    let stale = FencedLog::new(Arc::clone(&log), old.clone());
    let request = AppendRequest::new("fenced", ExpectedRevision::Any, events(1));
    refused_ids.extend(request.event_ids());
    let err = stale
        .append(request)
        .expect_err("a stale FencedLog refuses appends");
    assert!(
        matches!(err, Error::Fenced { .. }) && err.to_string().contains("fenced"),
        "{err}"
    );
    for writer in writers {
        writer.join().expect("writer");
    }

    // Nothing of the deposed term is in the log; everything else is.
    assert_eq!(log.stream_revision("fenced").expect("revision"), Some(1));
    let all = log.read_all(Position(0), 1_000).expect("read all");
    assert_eq!(all.len(), 1 + 4 * 10);
    assert!(all.iter().all(|e| !refused_ids.contains(&e.id)));

    // The current term writes; retrying its append with the same ids replays it.
    let request = AppendRequest::new("fenced", ExpectedRevision::Exact(1), events(1));
    let landed = log
        .append_fenced(request.clone(), &new)
        .expect("the new term's fenced append lands");
    assert_eq!(landed.last_revision, 2);
    let again = FencedLog::new(Arc::clone(&log), new.clone())
        .append(request)
        .expect("a retry replays");
    assert!(again.replayed);
    assert_eq!(again.first_position, landed.first_position);
    log.verify(&|_, _, _| Ok(())).expect("the chain is intact");
}
