//! Appends submitted without waiting (`EventLog::submit`) on the sled log: the same results as
//! `append`, committed by the committer thread, sharing commits with thread appenders.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use uuid::Uuid;
use vmplane_store::{
    AppendRequest, Error, EventLog, ExpectedRevision, ProposedEvent, SledLog, Submitted,
};

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` on this thread (the store has no async runtime of its own).
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(output) => return output,
            Poll::Pending => std::thread::park(),
        }
    }
}

fn event(id: Uuid) -> ProposedEvent {
    ProposedEvent {
        id,
        event_type: "Tested".into(),
        schema_version: 1,
        payload: vec![1, 2, 3],
        actor: "tester".into(),
        correlation_id: id,
        causation_id: None,
    }
}

fn request(stream: &str, expected: ExpectedRevision, id: Uuid) -> AppendRequest {
    AppendRequest::new(stream.to_owned(), expected, vec![event(id)])
}

fn submitted(log: &SledLog, request: AppendRequest) -> vmplane_store::PendingAppend {
    match log.submit(request) {
        Submitted::Pending(pending) => pending,
        Submitted::Unsupported(_) => panic!("the committer runs: submit must queue"),
    }
}

#[test]
fn submit_needs_the_committer_and_then_matches_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(SledLog::open(dir.path().join("log")).expect("open"));
    assert!(!log.submits());
    let back = log.submit(request("a", ExpectedRevision::NoStream, Uuid::now_v7()));
    assert!(matches!(back, Submitted::Unsupported(_)));
    log.start_committer().expect("committer");
    assert!(log.submits());

    let first = Uuid::now_v7();
    let appended = block_on(submitted(
        &log,
        request("a", ExpectedRevision::NoStream, first),
    ))
    .expect("appended");
    assert_eq!(appended.result.first_revision, 1);
    assert_eq!(appended.result.first_position.0, 1);
    assert!(!appended.result.replayed);
    let recorded = log
        .read_event(appended.result.first_position)
        .expect("read")
        .expect("there");
    assert_eq!(appended.recorded_at, Some(recorded.recorded_at));
    assert_eq!(
        log.head(),
        appended.result.last_position,
        "durable when answered"
    );

    // A conflict, as append reports it; nothing written.
    let err = block_on(submitted(
        &log,
        request("a", ExpectedRevision::NoStream, Uuid::now_v7()),
    ))
    .expect_err("the stream exists");
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    assert_eq!(log.head().0, 1);

    // The same event again: a replay, found by the leader's lookup of its id.
    let again = block_on(submitted(
        &log,
        request("a", ExpectedRevision::NoStream, first),
    ))
    .expect("replayed");
    assert!(again.result.replayed);
    assert_eq!(again.result.first_position.0, 1);
    assert_eq!(again.recorded_at, None);
}

#[test]
fn submitted_and_thread_appends_interleave() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(SledLog::open(dir.path().join("log")).expect("open"));
    log.start_committer().expect("committer");
    let writers = 8;
    let each = 50;
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..each {
                    let stream = format!("s{w}");
                    let expected = if i == 0 {
                        ExpectedRevision::NoStream
                    } else {
                        ExpectedRevision::Exact(i)
                    };
                    let req = request(&stream, expected, Uuid::now_v7());
                    let result = if (w + i as usize).is_multiple_of(2) {
                        block_on(submitted(&log, req)).map(|a| a.result)
                    } else {
                        log.append(req)
                    };
                    let result = result.expect("appended");
                    assert_eq!(result.first_revision, i + 1);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("writer");
    }
    assert_eq!(log.head().0, (writers * each as usize) as u64);
    let report = log.verify(&|_, _, _| Ok(())).expect("verify");
    assert_eq!(report.events, (writers * each as usize) as u64);
}

#[test]
fn dropping_the_log_ends_the_committer_and_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("log");
    {
        let log = Arc::new(SledLog::open(&path).expect("open"));
        log.start_committer().expect("committer");
        block_on(submitted(
            &log,
            request("a", ExpectedRevision::NoStream, Uuid::now_v7()),
        ))
        .expect("appended");
    }
    // sled locks its directory while open: reopening shows the committer let go of the log
    // (it may hold it a moment longer, finishing its last commit).
    let mut reopened = SledLog::open(&path);
    for _ in 0..100 {
        if reopened.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        reopened = SledLog::open(&path);
    }
    let log = reopened.expect("reopen");
    assert_eq!(log.head().0, 1);
}
