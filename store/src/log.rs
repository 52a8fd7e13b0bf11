//! The storage trait every backend implements (sled now, etcd later), and what is built on it
//! alone: request checks against [`Limits`] and catch-up-then-live [`Subscription`]s.
//!
//! Nothing here names an engine type: like TiKV's `engine_traits`, the trait crate never depends
//! on an implementation's API.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::submit::Submitted;
use crate::types::{
    AppendRequest, AppendResult, Claim, Direction, Fence, Limits, Position, RecordedEvent,
    RecordedEventRef, Revision, Timestamp, VerifyReport,
};

/// Checks a payload during [`EventLog::verify`]: `(event_type, schema_version, payload)` →
/// `Err(reason)` if the bytes do not decode. `core` passes its decoder; the store never looks
/// inside a payload itself.
pub type PayloadValidator<'a> = &'a dyn Fn(&str, u16, &[u8]) -> std::result::Result<(), String>;

/// Visits events during [`EventLog::scan`]; `ControlFlow::Break` stops the scan after this event.
pub type Visitor<'a> = &'a mut dyn FnMut(&RecordedEventRef<'_>) -> ControlFlow<()>;

/// The append-only, hash-chained event log.
///
/// Blocking: async callers use `spawn_blocking`, or [`EventLog::submit`] where the backend
/// [`EventLog::submits`]. Object safe: use it as `Arc<dyn EventLog>`.
///
/// Every read sees only durable events: nothing past [`EventLog::head`], so a reader never sees an
/// event that a crash could take back.
pub trait EventLog: Send + Sync {
    /// Appends `request.events` to `request.stream` atomically, with its claims, and returns once
    /// they are durable. Concurrent appends share one durable flush (group commit).
    ///
    /// Idempotent by event id: if every event is already in the log exactly where this append
    /// would have put it, returns the original positions with `replayed: true` and writes nothing.
    fn append(&self, request: AppendRequest) -> Result<AppendResult>;

    /// [`EventLog::append`], written only if `fence` still holds leadership when the append
    /// commits, checked in the same atomic step as the write. A stale fence fails with
    /// [`Error::Fenced`] and writes nothing; other appends committed alongside are not affected.
    ///
    /// The default refuses every fenced append: a backend that cannot check a fence atomically
    /// must not pretend to.
    fn append_fenced(&self, request: AppendRequest, fence: &Fence) -> Result<AppendResult> {
        let _ = request;
        Err(Error::InvalidRequest {
            reason: format!("this log cannot check fence {fence}: fenced appends are refused"),
        })
    }

    /// [`EventLog::append`] without waiting: the append is queued for the group commit and the
    /// returned future completes once it is durable (or refused), with the same result and the
    /// same guarantees. Appends submitted and appended concurrently share commits.
    ///
    /// The default has no such path and gives the request back
    /// ([`Submitted::Unsupported`]). A backend that implements it says so in
    /// [`EventLog::submits`].
    fn submit(&self, request: AppendRequest) -> Submitted {
        Submitted::Unsupported(request)
    }

    /// True when [`EventLog::submit`] queues appends, and [`EventLog::stream_revision`] and
    /// [`EventLog::claim_holder`] answer from memory: an async caller may then decide and
    /// submit on its own thread, with no blocking thread per append.
    fn submits(&self) -> bool {
        false
    }

    /// Up to `max_count` events of `stream` (capped by [`Limits::read_events_max`]), starting at
    /// revision `from` (inclusive) and going in `direction`. `Backward` from `u64::MAX` starts at
    /// the stream's last event. A stream with no events gives an empty list.
    fn read_stream(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>>;

    /// Up to `max_count` events of the whole log (capped by [`Limits::read_events_max`]) with
    /// positions after `after`, in position order.
    fn read_all(&self, after: Position, max_count: usize) -> Result<Vec<RecordedEvent>>;

    /// Visits every event after `after` up to the head as of the call, in position order, without
    /// copying: the replay path for projections. Returns the last visited position (`after` if
    /// none).
    fn scan(&self, after: Position, visit: Visitor<'_>) -> Result<Position>;

    /// The event at `position`, if the log reaches it.
    fn read_event(&self, position: Position) -> Result<Option<RecordedEvent>>;

    /// The last position recorded at or before `at` (`Position(0)` if none was).
    fn position_at(&self, at: Timestamp) -> Result<Position>;

    /// The last durable position (`Position(0)` for an empty log).
    fn head(&self) -> Position;

    /// Blocks until [`EventLog::head`] reaches `position` or `timeout` passes; returns the head
    /// then. Read-your-writes waits here with the position an append returned.
    fn wait_for(&self, position: Position, timeout: Duration) -> Result<Position>;

    /// The stream's last revision (`None` if it has no events).
    fn stream_revision(&self, stream: &str) -> Result<Option<Revision>>;

    /// Who holds claim `key`, if anyone.
    fn claim_holder(&self, key: &str) -> Result<Option<String>>;

    /// Walks the whole log from position 1: positions gapless, revisions continuous per stream,
    /// every hash and the chain, and each payload through `validate_payload`. The first damage
    /// found is reported as [`Error::Corrupt`] naming its position.
    fn verify(&self, validate_payload: PayloadValidator<'_>) -> Result<VerifyReport>;

    /// The bounds this backend enforces.
    fn limits(&self) -> &Limits;
}

impl dyn EventLog {
    /// A subscription delivering every event after `after`: first the ones already in the log,
    /// then new ones as they become durable, with no gap and no repeat between the two.
    pub fn subscribe(self: Arc<Self>, after: Position) -> Subscription {
        Subscription::new(self, after)
    }
}

/// Catch-up-then-live reading of the whole log, built only on [`EventLog::read_all`] and
/// [`EventLog::wait_for`]. Because positions are gapless and reads stop at the durable head,
/// resuming from the last delivered position can neither skip nor repeat an event.
pub struct Subscription {
    log: Arc<dyn EventLog>,
    delivered: Position,
}

impl Subscription {
    /// Starts after `after` (`Position(0)` = from the first event).
    pub fn new(log: Arc<dyn EventLog>, after: Position) -> Subscription {
        Subscription {
            log,
            delivered: after,
        }
    }

    /// The last position delivered (or the starting point).
    #[must_use]
    pub fn position(&self) -> Position {
        self.delivered
    }

    /// The next events, at most `max_count`: immediately if some are in the log, otherwise as
    /// soon as one is appended, or an empty list once `timeout` has passed.
    pub fn next_batch(
        &mut self,
        max_count: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            let events = self.log.read_all(self.delivered, max_count)?;
            if let Some(last) = events.last() {
                self.delivered = last.position;
                return Ok(events);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            self.log.wait_for(self.delivered.next(), left)?;
        }
    }
}

/// A log whose every append is fenced by one leadership term: what a leader (the reconciler)
/// writes through, so the command path above it needs no notion of fencing. Reads pass through.
pub struct FencedLog {
    inner: Arc<dyn EventLog>,
    fence: Fence,
}

impl FencedLog {
    /// Appends to `inner` go through [`EventLog::append_fenced`] with `fence`.
    #[must_use]
    pub fn new(inner: Arc<dyn EventLog>, fence: Fence) -> FencedLog {
        FencedLog { inner, fence }
    }

    /// The fence every append carries.
    #[must_use]
    pub fn fence(&self) -> &Fence {
        &self.fence
    }
}

impl std::fmt::Debug for FencedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedLog")
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl EventLog for FencedLog {
    fn append(&self, request: AppendRequest) -> Result<AppendResult> {
        self.inner.append_fenced(request, &self.fence)
    }

    fn append_fenced(&self, request: AppendRequest, fence: &Fence) -> Result<AppendResult> {
        if *fence != self.fence {
            return Err(Error::InvalidRequest {
                reason: format!(
                    "an append fenced by {fence} through a log fenced by {}",
                    self.fence
                ),
            });
        }
        self.inner.append_fenced(request, fence)
    }

    fn read_stream(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>> {
        self.inner.read_stream(stream, from, direction, max_count)
    }

    fn read_all(&self, after: Position, max_count: usize) -> Result<Vec<RecordedEvent>> {
        self.inner.read_all(after, max_count)
    }

    fn scan(&self, after: Position, visit: Visitor<'_>) -> Result<Position> {
        self.inner.scan(after, visit)
    }

    fn read_event(&self, position: Position) -> Result<Option<RecordedEvent>> {
        self.inner.read_event(position)
    }

    fn position_at(&self, at: Timestamp) -> Result<Position> {
        self.inner.position_at(at)
    }

    fn head(&self) -> Position {
        self.inner.head()
    }

    fn wait_for(&self, position: Position, timeout: Duration) -> Result<Position> {
        self.inner.wait_for(position, timeout)
    }

    fn stream_revision(&self, stream: &str) -> Result<Option<Revision>> {
        self.inner.stream_revision(stream)
    }

    fn claim_holder(&self, key: &str) -> Result<Option<String>> {
        self.inner.claim_holder(key)
    }

    fn verify(&self, validate_payload: PayloadValidator<'_>) -> Result<VerifyReport> {
        self.inner.verify(validate_payload)
    }

    fn limits(&self) -> &Limits {
        self.inner.limits()
    }
}

/// Checks `request` against `limits` and the rules that need no log state. Every backend calls it
/// before anything else, so a request is refused the same way everywhere.
pub fn check_request(limits: &Limits, request: &AppendRequest) -> Result<()> {
    let events = request.events.len();
    if events == 0 {
        return Err(Error::InvalidRequest {
            reason: "an append needs at least one event".into(),
        });
    }
    check_limit(
        "append_batch_events_max",
        limits.append_batch_events_max,
        events,
    )?;
    check_limit(
        "append_claims_max",
        limits.append_claims_max,
        request.claims.len(),
    )?;
    if request.stream.is_empty() {
        return Err(Error::InvalidRequest {
            reason: "the stream name is empty".into(),
        });
    }
    check_limit(
        "stream_name_bytes_max",
        limits.stream_name_bytes_max,
        request.stream.len(),
    )?;
    let mut payload_bytes = 0usize;
    let mut ids = HashSet::with_capacity(events);
    for event in &request.events {
        if event.event_type.is_empty() {
            return Err(Error::InvalidRequest {
                reason: format!("event {} has an empty event type", event.id),
            });
        }
        check_limit(
            "event_type_bytes_max",
            limits.event_type_bytes_max,
            event.event_type.len(),
        )?;
        check_limit("actor_bytes_max", limits.actor_bytes_max, event.actor.len())?;
        check_limit(
            "event_payload_bytes_max",
            limits.event_payload_bytes_max,
            event.payload.len(),
        )?;
        payload_bytes += event.payload.len();
        if !ids.insert(event.id) {
            return Err(Error::InvalidRequest {
                reason: format!("event id {} appears twice in one append", event.id),
            });
        }
    }
    check_limit(
        "append_payload_bytes_max",
        limits.append_payload_bytes_max,
        payload_bytes,
    )?;
    for claim in &request.claims {
        if claim.key().is_empty() || claim.owner().is_empty() {
            return Err(Error::InvalidRequest {
                reason: "a claim needs a non-empty key and owner".into(),
            });
        }
        check_limit("claim_bytes_max", limits.claim_bytes_max, claim.key().len())?;
        check_limit(
            "claim_bytes_max",
            limits.claim_bytes_max,
            claim.owner().len(),
        )?;
    }
    Ok(())
}

fn check_limit(limit: &'static str, max: usize, actual: usize) -> Result<()> {
    if actual > max {
        return Err(Error::LimitExceeded {
            limit,
            max: max as u64,
            actual: actual as u64,
        });
    }
    Ok(())
}

/// How a backend's committer decided one append within a group: the same three outcomes on
/// every backend.
#[derive(Debug)]
pub enum AppendDecision {
    /// Refused; nothing of it is written.
    Reject(Error),
    /// Every event was already in the log: answered with the original positions.
    Replay(AppendResult),
    /// Written at these positions and revisions, with these claim changes.
    Accept {
        /// The stream revision of the first event.
        first_revision: Revision,
        /// The position of the first event.
        first_position: u64,
        /// How many events.
        count: u64,
        /// The claims taken (`Some(owner)`) or freed (`None`).
        claims: ClaimChanges,
    },
}

impl AppendDecision {
    /// What the appender is answered once the group is durable.
    pub fn into_result(self) -> Result<AppendResult> {
        match self {
            AppendDecision::Reject(err) => Err(err),
            AppendDecision::Replay(result) => Ok(result),
            AppendDecision::Accept {
                first_revision,
                first_position,
                count,
                ..
            } => Ok(AppendResult {
                first_position: Position(first_position),
                last_position: Position(first_position + count - 1),
                first_revision,
                last_revision: first_revision + count - 1,
                replayed: false,
            }),
        }
    }
}

/// Where an event id already stands in the log: a backend's id-index entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdAt<'a> {
    /// The stream the event is in.
    pub stream: &'a str,
    /// Its global position.
    pub position: u64,
    /// Its stream revision.
    pub revision: Revision,
}

/// The decision for an append all of whose event ids are already in the log (`locations[i]` is
/// where event `i` stands): a retry of this very append — same stream, consecutive positions and
/// revisions, where its expectation puts it — is answered with the original positions
/// (`replayed: true`); anything else is a reuse of ids. Every backend decides it this way.
pub fn replay_or_reuse(
    request: &AppendRequest,
    locations: &[Option<IdAt<'_>>],
) -> Result<AppendResult> {
    let Some(Some(first)) = locations.first() else {
        return Err(Error::InvalidRequest {
            reason: "an append needs events".into(),
        });
    };
    let starts_right = request
        .expected
        .first_revision()
        .is_none_or(|r| r == first.revision);
    for (offset, (event, location)) in request.events.iter().zip(locations).enumerate() {
        let Some(location) = location else { continue };
        let in_place = location.stream == request.stream
            && location.position == first.position + offset as u64
            && location.revision == first.revision + offset as u64;
        if !(in_place && starts_right) {
            return Err(Error::EventIdReused {
                stream: request.stream.clone(),
                id: event.id,
                position: Position(location.position),
                not_written: request.event_ids(),
            });
        }
    }
    let count = request.events.len() as u64;
    Ok(AppendResult {
        first_position: Position(first.position),
        last_position: Position(first.position + count - 1),
        first_revision: first.revision,
        last_revision: first.revision + count - 1,
        replayed: true,
    })
}

/// Claim changes decided for one append: `(key, Some(owner))` taken, `(key, None)` freed.
pub type ClaimChanges = Vec<(String, Option<String>)>;

/// Applies `claims` in order to a view of the holders: `holder(key)` reads the current holder,
/// the returned list holds the changes (`Some(owner)` = taken, `None` = freed). Fails with the
/// first taken key's holder.
pub fn decide_claims(
    claims: &[Claim],
    holder: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<ClaimChanges, (String, String)> {
    let mut changes: Vec<(String, Option<String>)> = Vec::new();
    for claim in claims {
        let current = match changes.iter().rev().find(|(key, _)| key == claim.key()) {
            Some((_, change)) => change.clone(),
            None => holder(claim.key()),
        };
        match claim {
            Claim::Acquire { key, owner } => match current {
                Some(current) if &current != owner => return Err((key.clone(), current)),
                Some(_) => {}
                None => changes.push((key.clone(), Some(owner.clone()))),
            },
            Claim::Release { key, owner } => {
                if current.as_deref() == Some(owner.as_str()) {
                    changes.push((key.clone(), None));
                }
            }
        }
    }
    Ok(changes)
}
