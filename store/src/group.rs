//! What every backend's group commit shares, whatever the engine: the [`Slot`] an appender (a
//! sleeping thread or a submitted append's future) waits on until its append is decided, and the
//! bell ([`Committer`]) that wakes a log's committer thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::error::Result;
use crate::submit::Appended;
use crate::types::{AppendResult, Timestamp};

/// Where an appender sleeps until its append is decided, or until it is made leader.
#[derive(Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    ready: Condvar,
    /// The task awaiting a submitted append (taken under `state`'s lock).
    waker: Mutex<Option<Waker>>,
}

#[derive(Default)]
pub(crate) enum SlotState {
    #[default]
    Waiting,
    Lead,
    /// The result, and the time recorded with the commit's events (`None`: nothing written).
    Done(Result<AppendResult>, Option<i64>),
}

impl Slot {
    pub(crate) fn set(&self, value: SlotState) {
        let waker = {
            let mut state = lock(&self.state);
            *state = value;
            lock(&self.waker).take()
        };
        // A slot with a waker belongs to a submitted append's future: no thread sleeps on
        // `ready`, and a notify would still cost a futex call (one per append of the group).
        match waker {
            Some(waker) => waker.wake(),
            None => self.ready.notify_one(),
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(*lock(&self.state), SlotState::Done(..))
    }

    /// Sleeps until the slot is `Lead` (returns `None`) or `Done` (returns the result).
    pub(crate) fn wait(&self) -> Option<Result<AppendResult>> {
        let mut state = lock(&self.state);
        loop {
            match std::mem::take(&mut *state) {
                SlotState::Waiting => {
                    state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
                }
                SlotState::Lead => return None,
                SlotState::Done(result, _) => return Some(result),
            }
        }
    }
}

/// A submitted append's future: ready once the leader has set its slot `Done`.
pub(crate) struct SlotFuture(pub(crate) std::sync::Arc<Slot>);

impl Future for SlotFuture {
    type Output = Result<Appended>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = lock(&self.0.state);
        match std::mem::take(&mut *state) {
            SlotState::Done(result, recorded_at) => Poll::Ready(result.map(|result| Appended {
                recorded_at: recorded_at.filter(|_| !result.replayed).map(Timestamp),
                result,
            })),
            other => {
                *state = other;
                *lock(&self.0.waker) = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// The committer thread's bell: rung when a submitted append needs a leader.
#[derive(Default)]
pub(crate) struct Committer {
    state: Mutex<CommitterState>,
    rung: Condvar,
}

#[derive(Default)]
struct CommitterState {
    wanted: bool,
    closed: bool,
    /// Whether the committer thread sleeps on `rung` (set and cleared under the lock).
    sleeping: bool,
}

impl Committer {
    /// Rings the bell. The condition variable is notified only when the committer sleeps on
    /// it: a notify is a futex system call even with no waiter, and a busy committer, which
    /// looks at `wanted` before it sleeps, would pay one per queued append for nothing.
    pub(crate) fn want(&self) {
        let mut state = lock(&self.state);
        state.wanted = true;
        if state.sleeping {
            drop(state);
            self.rung.notify_one();
        }
    }

    /// Ends the thread (the log is closing).
    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
        self.rung.notify_one();
    }

    /// Sleeps until wanted (`true`) or closed (`false`).
    pub(crate) fn wait(&self) -> bool {
        let mut state = lock(&self.state);
        loop {
            if state.closed {
                return false;
            }
            if std::mem::take(&mut state.wanted) {
                return true;
            }
            state.sleeping = true;
            state = self.rung.wait(state).unwrap_or_else(|p| p.into_inner());
            state.sleeping = false;
        }
    }
}

/// The smallest group after which a lingering committer waits for company. Smaller groups come
/// from a few writers, each waiting for its own answer before it writes again: a wait adds to
/// every round trip and saves little (through the gateway, 4 clients lost 7% of their creates/s
/// when the committer lingered after groups of 2 and more; with this bound they never wait, and
/// 16 clients measured 1.03× instead of 0.95×).
pub(crate) const COMPANY_MIN: usize = 8;

/// How many queued appends the committer waits for before it takes its next group (`None`: it
/// takes what is queued now). With lingering on, after a group of at least [`COMPANY_MIN`]
/// appends, it waits until as many are queued as that group held: appenders who come together
/// keep sharing one write and one `fdatasync` while they come back, instead of splitting into
/// smaller groups that each pay for their own. A lone appender or a few never wait; nor does a
/// committer that already has the company it would wait for.
pub(crate) fn company(
    last_group: usize,
    queued: usize,
    linger: std::time::Duration,
) -> Option<usize> {
    (!linger.is_zero() && last_group >= COMPANY_MIN && queued < last_group).then_some(last_group)
}

/// Takes the next group from the front of `queue`: requests in order until adding one would pass
/// `events_max` events or `bytes_max` payload bytes (a larger single request still goes alone).
pub(crate) fn take_group<T>(
    queue: &mut std::collections::VecDeque<T>,
    request: impl Fn(&T) -> &crate::types::AppendRequest,
    events_max: usize,
    bytes_max: usize,
) -> Vec<T> {
    let (mut events, mut bytes) = (0usize, 0usize);
    let mut group = Vec::new();
    while let Some(next) = queue.front() {
        let next = request(next);
        let next_events = next.events.len();
        let next_bytes: usize = next.events.iter().map(|e| e.payload.len()).sum();
        if !group.is_empty()
            && (events + next_events > events_max || bytes + next_bytes > bytes_max)
        {
            break;
        }
        events += next_events;
        bytes += next_bytes;
        group.extend(queue.pop_front());
    }
    group
}

/// Decides each append of a group (`items`, whose requests `request` gives) in order with
/// `decide`, against `overlay` holding the effects of those accepted before it (recorded here as
/// each is accepted).
pub(crate) fn decide_group<T>(
    items: &[T],
    request: impl Fn(&T) -> &crate::types::AppendRequest,
    overlay: &mut crate::log::Overlay,
    mut decide: impl FnMut(&crate::log::Overlay, &T) -> crate::log::AppendDecision,
) -> Vec<crate::log::AppendDecision> {
    items
        .iter()
        .map(|item| {
            let decision = decide(overlay, item);
            if let crate::log::AppendDecision::Accept {
                first_revision,
                first_position,
                claims,
                ..
            } = &decision
            {
                overlay.accept(request(item), *first_revision, *first_position, claims);
            }
            decision
        })
        .collect()
}

/// Every request of a group of `count` refused as `Unavailable` for `reason` (a poisoned log).
pub(crate) fn refuse_group(count: usize, reason: &str) -> Committed {
    let results = (0..count)
        .map(|_| {
            Err(crate::error::Error::Unavailable {
                reason: reason.to_owned(),
            })
        })
        .collect();
    (results, None)
}

/// What a group commit returns: each request's result, in order, and the time recorded with the
/// events written (`None` if none were).
pub(crate) type Committed = (Vec<Result<AppendResult>>, Option<i64>);

/// Runs a group's commit and answers its appenders (`slots`, in the group's order) with what it
/// returned. A panic in `commit` is caught: `poison` is told why (the backend refuses appends
/// from then on) and every appender not yet answered gets that reason as `Unavailable`.
pub(crate) fn commit_and_answer(
    slots: &[std::sync::Arc<Slot>],
    commit: impl FnOnce() -> Committed,
    poison: impl FnOnce(String),
) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(commit)) {
        Ok((results, recorded_at)) => {
            for (slot, result) in slots.iter().zip(results) {
                slot.set(SlotState::Done(result, recorded_at));
            }
        }
        Err(_) => {
            let reason = "the group commit panicked".to_owned();
            poison(reason.clone());
            for slot in slots.iter().filter(|slot| !slot.is_done()) {
                slot.set(SlotState::Done(
                    Err(crate::error::Error::Unavailable {
                        reason: reason.clone(),
                    }),
                    None,
                ));
            }
        }
    }
}

/// The error a `return` fail point injects (see `store/tests/failpoints.rs`).
// Used only where `fail/failpoints` is on (this crate's `failpoints`, or another crate's, since
// cargo unifies `fail`'s features).
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) fn injected(point: &'static str) -> crate::error::Error {
    crate::error::Error::Io {
        context: point,
        source: std::io::Error::other("injected by a fail point"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_bell_wakes_a_sleeping_committer_and_is_kept_for_a_busy_one() {
        let bell = Arc::new(Committer::default());
        // Rung while nobody sleeps: the next wait returns at once.
        bell.want();
        assert!(bell.wait());
        // Rung while the committer sleeps: it wakes.
        let sleeper = {
            let bell = Arc::clone(&bell);
            std::thread::spawn(move || bell.wait())
        };
        while !lock(&bell.state).sleeping {
            std::thread::sleep(Duration::from_millis(1));
        }
        bell.want();
        assert!(sleeper.join().expect("committer"));
        assert!(!lock(&bell.state).sleeping);
        // Closed: the wait ends with false, whether or not it was rung.
        bell.want();
        bell.close();
        assert!(!bell.wait());
    }

    #[test]
    fn a_committer_waits_for_as_many_as_its_last_group_held_and_only_after_company() {
        let wait = Duration::from_micros(150);
        // A lone appender, or a few: the last group was smaller than the bound.
        assert_eq!(company(0, 0, wait), None);
        assert_eq!(company(1, 0, wait), None);
        assert_eq!(company(COMPANY_MIN - 1, 0, wait), None);
        // Many appended with the last one: wait until as many are queued again.
        assert_eq!(company(COMPANY_MIN, 1, wait), Some(COMPANY_MIN));
        assert_eq!(company(40, 0, wait), Some(40));
        assert_eq!(company(40, 39, wait), Some(40));
        // The company is here already, or lingering is turned off.
        assert_eq!(company(40, 40, wait), None);
        assert_eq!(company(40, 100, wait), None);
        assert_eq!(company(40, 1, Duration::ZERO), None);
    }
}
