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

    /// The stream's last revision (`None` if it has no events). A revision answered here is
    /// readable at once by [`EventLog::read_stream`]: it is never announced before the head
    /// that includes it.
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
    let mut ids = HashSet::with_capacity_and_hasher(events, foldhash::fast::RandomState::default());
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

/// The log as an imported event finds it: the tip left by everything before it (the log plus
/// what this import has pushed so far).
pub(crate) struct ImportTip<'a> {
    /// The last position.
    pub last_position: u64,
    /// The chain hash at the last position.
    pub last_hash: [u8; 32],
    /// The last event's `recorded_at` (`i64::MIN` for an empty log).
    pub last_recorded_at: i64,
    /// The event's stream's last revision (0: no events yet).
    pub stream_revision: Revision,
    /// Whether the event's id is already in the log.
    pub id_seen: bool,
    /// Who holds a claim.
    pub holder: &'a dyn Fn(&str) -> Option<String>,
}

/// Checks an already-recorded event (a restore's) as the append path would have made it: the
/// limits, an unused id, the next position, the chain, its own hash, the stream's next revision,
/// time that does not go backwards, and the claims its append carried. Every backend's bulk
/// importer calls it, so an import is refused the same way everywhere. Returns the claim
/// changes to record.
pub(crate) fn check_import(
    limits: &Limits,
    event: &RecordedEvent,
    claims: &[Claim],
    tip: &ImportTip<'_>,
) -> Result<ClaimChanges> {
    check_import_limits(limits, event, claims)?;
    let position = event.position;
    let corrupt = |reason: String| Error::Corrupt { position, reason };
    if tip.id_seen {
        return Err(Error::InvalidRequest {
            reason: format!(
                "position {position}: event id {} is already in the log",
                event.id
            ),
        });
    }
    if event.position.0 != tip.last_position + 1 {
        return Err(corrupt(format!(
            "the import expected position {} next",
            tip.last_position + 1
        )));
    }
    if event.prev_hash != tip.last_hash {
        return Err(corrupt("the previous hash does not match the chain".into()));
    }
    if crate::hash::event_hash(&event.as_ref()) != event.hash {
        return Err(corrupt(
            "the event's hash does not match its content".into(),
        ));
    }
    if event.revision != tip.stream_revision + 1 {
        return Err(corrupt(format!(
            "stream {} jumps from revision {} to {}",
            event.stream, tip.stream_revision, event.revision
        )));
    }
    if event.recorded_at.0 < tip.last_recorded_at {
        return Err(corrupt("recorded_at goes backwards".into()));
    }
    decide_claims(claims, tip.holder).map_err(|(key, holder)| Error::ClaimTaken {
        key,
        holder,
        not_written: vec![event.id],
    })
}

fn check_import_limits(limits: &Limits, event: &RecordedEvent, claims: &[Claim]) -> Result<()> {
    let check = |limit: &'static str, max: usize, actual: usize| {
        if actual > max {
            Err(Error::LimitExceeded {
                limit,
                max: max as u64,
                actual: actual as u64,
            })
        } else {
            Ok(())
        }
    };
    if event.stream.is_empty() || event.event_type.is_empty() {
        return Err(Error::InvalidRequest {
            reason: format!(
                "position {}: an event needs a stream and an event type",
                event.position
            ),
        });
    }
    check(
        "stream_name_bytes_max",
        limits.stream_name_bytes_max,
        event.stream.len(),
    )?;
    check(
        "event_type_bytes_max",
        limits.event_type_bytes_max,
        event.event_type.len(),
    )?;
    check("actor_bytes_max", limits.actor_bytes_max, event.actor.len())?;
    check(
        "event_payload_bytes_max",
        limits.event_payload_bytes_max,
        event.payload.len(),
    )?;
    check("append_claims_max", limits.append_claims_max, claims.len())?;
    for claim in claims {
        if claim.key().is_empty() || claim.owner().is_empty() {
            return Err(Error::InvalidRequest {
                reason: "a claim needs a non-empty key and owner".into(),
            });
        }
        check("claim_bytes_max", limits.claim_bytes_max, claim.key().len())?;
        check(
            "claim_bytes_max",
            limits.claim_bytes_max,
            claim.owner().len(),
        )?;
    }
    Ok(())
}

/// Leadership terms kept in one process's memory: what an embedded backend (one process per
/// log) fences appends with. A fenced append holds the read lock until it is decided, so a new
/// term cannot begin in the middle of one.
#[derive(Default)]
pub struct LocalFences(std::sync::RwLock<std::collections::HashMap<String, u64>>);

impl LocalFences {
    /// Begins a new term of leadership `name` and returns its fence; appends fenced by an
    /// earlier term fail with [`Error::Fenced`] from now on.
    pub fn take(&self, name: &str) -> Fence {
        let mut terms = self.0.write().unwrap_or_else(|p| p.into_inner());
        let token = terms.get(name).map_or(1, |term| term + 1);
        terms.insert(name.to_owned(), token);
        Fence {
            name: name.to_owned(),
            token,
        }
    }

    /// `append(request)` if `fence` is the current term of its leadership, holding the term
    /// until it returns; otherwise [`Error::Fenced`], and nothing is appended.
    pub fn append(
        &self,
        request: AppendRequest,
        fence: &Fence,
        append: impl FnOnce(AppendRequest) -> Result<AppendResult>,
    ) -> Result<AppendResult> {
        let terms = self.0.read().unwrap_or_else(|p| p.into_inner());
        let current = terms.get(&fence.name).copied();
        if current != Some(fence.token) {
            return Err(Error::Fenced {
                fence: fence.clone(),
                current,
                not_written: request.event_ids(),
            });
        }
        let result = append(request);
        drop(terms);
        result
    }
}

/// A backend's durable head: the last durable position, raised by its committer, and the
/// condition [`EventLog::wait_for`] sleeps on. Shared by every backend so each publishes and
/// waits alike.
pub struct DurableHead {
    position: std::sync::atomic::AtomicU64,
    lock: std::sync::Mutex<()>,
    changed: std::sync::Condvar,
}

impl DurableHead {
    /// A head at `position`.
    #[must_use]
    pub fn new(position: u64) -> DurableHead {
        DurableHead {
            position: std::sync::atomic::AtomicU64::new(position),
            lock: std::sync::Mutex::new(()),
            changed: std::sync::Condvar::new(),
        }
    }

    /// The last durable position.
    #[must_use]
    pub fn get(&self) -> u64 {
        self.position.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Raises the head to `position` (never lowers it) and wakes every waiter.
    pub fn publish(&self, position: u64) {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.position
            .fetch_max(position, std::sync::atomic::Ordering::AcqRel);
        self.changed.notify_all();
    }

    /// Blocks until the head reaches `position` or `timeout` passes; returns the head then.
    pub fn wait_for(&self, position: Position, timeout: Duration) -> Position {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let head = self.get();
            if head >= position.0 {
                return Position(head);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Position(head);
            }
            guard = self
                .changed
                .wait_timeout(guard, left)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// Where an event id is committed, as a backend with its id index in memory holds it (the
/// stream's name shared by all its entries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdLocation {
    /// The event's position.
    pub position: u64,
    /// Its stream revision.
    pub revision: Revision,
    /// Its stream.
    pub stream: Arc<str>,
}

impl AsIdAt for IdLocation {
    fn at(&self) -> IdAt<'_> {
        IdAt {
            stream: &self.stream,
            position: self.position,
            revision: self.revision,
        }
    }
}

/// The effects of the requests accepted so far in a group commit, on top of a backend's own
/// indexes: what the next request of the group is decided against.
#[derive(Default)]
pub struct Overlay {
    /// Stream heads changed by the group.
    pub heads: std::collections::HashMap<String, Revision>,
    /// Claims taken (`Some`) or freed (`None`) by the group.
    pub claims: std::collections::HashMap<String, Option<String>>,
    /// Event ids the group committed.
    pub ids: std::collections::HashMap<uuid::Uuid, IdLocation>,
    /// The position the next accepted request starts at.
    pub next_position: u64,
}

impl Overlay {
    /// An empty overlay whose next request starts at `next_position`.
    #[must_use]
    pub fn at(next_position: u64) -> Overlay {
        Overlay {
            next_position,
            ..Overlay::default()
        }
    }

    /// Records an accepted request's effects.
    pub fn accept(
        &mut self,
        request: &AppendRequest,
        first_revision: Revision,
        first_position: u64,
        claims: &[(String, Option<String>)],
    ) {
        let count = request.events.len() as u64;
        let stream: Arc<str> = Arc::from(request.stream.as_str());
        for (offset, event) in request.events.iter().enumerate() {
            self.ids.insert(
                event.id,
                IdLocation {
                    position: first_position + offset as u64,
                    revision: first_revision + offset as u64,
                    stream: Arc::clone(&stream),
                },
            );
        }
        self.heads
            .insert(request.stream.clone(), first_revision + count - 1);
        for (key, owner) in claims {
            self.claims.insert(key.clone(), owner.clone());
        }
        self.next_position = first_position + count;
    }

    /// Takes the effects of `later`, a group decided after everything in this one.
    pub fn absorb(&mut self, later: Overlay) {
        self.heads.extend(later.heads);
        self.claims.extend(later.claims);
        self.ids.extend(later.ids);
        self.next_position = later.next_position;
    }
}

/// Walks a log from position 1 for [`EventLog::verify`]: each event must follow the one before
/// (position, chain, its own hash, its stream's next revision, time order) and its payload must
/// decode. Every backend's `verify` feeds it the events in order, so they check alike.
pub struct VerifyWalk<'a> {
    validate_payload: PayloadValidator<'a>,
    next: u64,
    prev_hash: [u8; 32],
    last_recorded_at: i64,
    revisions: std::collections::HashMap<String, Revision>,
}

impl<'a> VerifyWalk<'a> {
    /// A walk from the start of the log.
    #[must_use]
    pub fn new(validate_payload: PayloadValidator<'a>) -> VerifyWalk<'a> {
        VerifyWalk {
            validate_payload,
            next: 1,
            prev_hash: crate::hash::GENESIS_PREV_HASH,
            last_recorded_at: i64::MIN,
            revisions: std::collections::HashMap::new(),
        }
    }

    /// The position the next event must have.
    #[must_use]
    pub fn next_position(&self) -> u64 {
        self.next
    }

    /// Checks the next event.
    pub fn check(&mut self, event: &RecordedEventRef<'_>) -> Result<()> {
        let position = event.position;
        let corrupt = |reason: String| Error::Corrupt { position, reason };
        if position.0 != self.next {
            return Err(Error::Corrupt {
                position: Position(self.next),
                reason: format!("gap in the log: the next event is at {position}"),
            });
        }
        if event.prev_hash != &self.prev_hash {
            return Err(corrupt("the previous hash does not match the chain".into()));
        }
        if crate::hash::event_hash(event) != *event.hash {
            return Err(corrupt(
                "the event's hash does not match its content".into(),
            ));
        }
        let revision = self.revisions.entry(event.stream.to_owned()).or_insert(0);
        if event.revision != *revision + 1 {
            return Err(corrupt(format!(
                "stream {} jumps from revision {} to {}",
                event.stream, revision, event.revision
            )));
        }
        *revision = event.revision;
        if event.recorded_at.0 < self.last_recorded_at {
            return Err(corrupt("recorded_at goes backwards".into()));
        }
        self.last_recorded_at = event.recorded_at.0;
        (self.validate_payload)(event.event_type, event.schema_version, event.payload).map_err(
            |reason| {
                corrupt(format!(
                    "payload of {} v{} does not decode: {reason}",
                    event.event_type, event.schema_version
                ))
            },
        )?;
        self.prev_hash = *event.hash;
        self.next += 1;
        Ok(())
    }

    /// The report once every event up to `head` has been checked.
    pub fn finish(self, head: u64) -> Result<VerifyReport> {
        if self.next != head + 1 {
            return Err(Error::Corrupt {
                position: Position(self.next),
                reason: format!("the log ends at {} but its head is {head}", self.next - 1),
            });
        }
        Ok(VerifyReport {
            events: head,
            head_hash: self.prev_hash,
        })
    }
}

/// [`EventLog::read_all`] over a backend's scan: up to `max_count` events (capped by
/// `limits`), copied out of what `scan` visits in order. `scan` stops when its visitor breaks.
pub fn read_all_by_scan(
    limits: &Limits,
    max_count: usize,
    scan: impl FnOnce(Visitor<'_>) -> Result<u64>,
) -> Result<Vec<RecordedEvent>> {
    let max_count = max_count.min(limits.read_events_max);
    let mut events = Vec::with_capacity(max_count.min(1024));
    if max_count == 0 {
        return Ok(events);
    }
    scan(&mut |event| {
        events.push(event.to_owned_event());
        if events.len() >= max_count {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    Ok(events)
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

/// A backend's id-index entry, seen as an [`IdAt`]: what [`decide_append`] reads locations
/// through, so a backend hands over its own entries without converting them first.
pub trait AsIdAt {
    /// Where the id stands.
    fn at(&self) -> IdAt<'_>;
}

impl AsIdAt for IdAt<'_> {
    fn at(&self) -> IdAt<'_> {
        *self
    }
}

/// How one append fares against a backend's view of the log: the decision itself, written once.
/// Every backend's committer decides through it, so they decide identically by construction;
/// a backend supplies only its lookups, through whatever overlays, caches and indexes it keeps
/// (the effects of the requests before this one in its group included).
///
/// - `locations[i]`: where event `i`'s id is already committed, if it is.
/// - `stream_revision()`: the stream's current revision; asked only once the ids are known to
///   be new (a replay or a reuse never needs it).
/// - `holder(key)`: who holds a claim key now (`Ok(None)`: nobody). Every claim's holder is asked
///   in order before any claim is decided; an `Err` (a backend that cannot tell) refuses the
///   append with it.
/// - `next_position`: the position the append's first event would get.
///
/// In order: all ids committed → [`replay_or_reuse`]; some → [`Error::PartiallyCommitted`];
/// a revision `request.expected` does not admit → [`Error::Conflict`]; a claim held by another
/// owner → [`Error::ClaimTaken`] ([`decide_claims`]); else accepted at `actual + 1` and
/// `next_position`.
pub fn decide_append<L: AsIdAt>(
    request: &AppendRequest,
    locations: &[Option<L>],
    stream_revision: impl FnOnce() -> Option<Revision>,
    holder: &dyn Fn(&str) -> Result<Option<String>>,
    next_position: u64,
) -> AppendDecision {
    let committed = locations.iter().filter(|l| l.is_some()).count();
    if committed == request.events.len() {
        let at: Vec<_> = locations
            .iter()
            .map(|l| l.as_ref().map(AsIdAt::at))
            .collect();
        return match replay_or_reuse(request, &at) {
            Ok(replayed) => AppendDecision::Replay(replayed),
            Err(err) => AppendDecision::Reject(err),
        };
    }
    if committed > 0 {
        let (done, not_done): (Vec<_>, Vec<_>) = request
            .events
            .iter()
            .zip(locations)
            .partition(|(_, location)| location.is_some());
        return AppendDecision::Reject(Error::PartiallyCommitted {
            stream: request.stream.clone(),
            committed: done.into_iter().map(|(event, _)| event.id).collect(),
            not_written: not_done.into_iter().map(|(event, _)| event.id).collect(),
        });
    }
    let actual = stream_revision();
    if !request.expected.admits(actual) {
        return AppendDecision::Reject(Error::Conflict {
            stream: request.stream.clone(),
            expected: request.expected,
            actual,
            not_written: request.event_ids(),
        });
    }
    let mut holders: Vec<(&str, Option<String>)> = Vec::with_capacity(request.claims.len());
    for claim in &request.claims {
        match holder(claim.key()) {
            Ok(current) => holders.push((claim.key(), current)),
            Err(err) => return AppendDecision::Reject(err),
        }
    }
    let current = |key: &str| {
        holders
            .iter()
            .find(|(held, _)| *held == key)
            .and_then(|(_, current)| current.clone())
    };
    match decide_claims(&request.claims, &current) {
        Err((key, holder)) => AppendDecision::Reject(Error::ClaimTaken {
            key,
            holder,
            not_written: request.event_ids(),
        }),
        Ok(claims) => AppendDecision::Accept {
            first_revision: actual.unwrap_or(0) + 1,
            first_position: next_position,
            count: request.events.len() as u64,
            claims,
        },
    }
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

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::{AppendDecision, IdAt, VerifyWalk, decide_append};
    use crate::error::{Error, Result};
    use crate::types::{AppendRequest, Claim, ExpectedRevision, Position, ProposedEvent, Revision};

    fn event(n: u128) -> ProposedEvent {
        ProposedEvent {
            id: Uuid::from_u128(n),
            event_type: "Happened".into(),
            schema_version: 1,
            payload: vec![n as u8],
            actor: "test".into(),
            correlation_id: Uuid::from_u128(1000 + n),
            causation_id: None,
        }
    }

    /// Events 1..=count on `vm/a`.
    fn append(expected: ExpectedRevision, count: u128) -> AppendRequest {
        AppendRequest::new("vm/a", expected, (1..=count).map(event).collect())
    }

    fn at(stream: &str, position: u64, revision: Revision) -> Option<IdAt<'_>> {
        Some(IdAt {
            stream,
            position,
            revision,
        })
    }

    fn acquire(key: &str) -> Claim {
        Claim::Acquire {
            key: key.into(),
            owner: "me".into(),
        }
    }

    fn release(key: &str) -> Claim {
        Claim::Release {
            key: key.into(),
            owner: "me".into(),
        }
    }

    fn free(_: &str) -> Result<Option<String>> {
        Ok(None)
    }

    /// Fails the test if the stream's revision is asked for.
    fn never() -> Option<Revision> {
        panic!("the stream's revision was looked up")
    }

    #[test]
    fn a_retry_in_place_is_replayed_without_the_stream_revision() {
        let request = append(ExpectedRevision::Exact(4), 2);
        let locations = [at("vm/a", 10, 5), at("vm/a", 11, 6)];
        let decision = decide_append(&request, &locations, never, &free, 99);
        let AppendDecision::Replay(result) = decision else {
            panic!("expected a replay, got {decision:?}");
        };
        assert_eq!(result.first_position, Position(10));
        assert_eq!(result.last_position, Position(11));
        assert_eq!((result.first_revision, result.last_revision), (5, 6));
        assert!(result.replayed);
    }

    #[test]
    fn committed_ids_elsewhere_are_a_reuse() {
        let request = append(ExpectedRevision::Any, 2);
        let locations = [at("vm/a", 10, 5), at("vm/b", 11, 6)];
        let decision = decide_append(&request, &locations, never, &free, 99);
        assert!(
            matches!(
                decision,
                AppendDecision::Reject(Error::EventIdReused { ref id, position: Position(11), .. })
                    if *id == Uuid::from_u128(2)
            ),
            "{decision:?}"
        );
    }

    #[test]
    fn some_ids_committed_is_partially_committed() {
        let request = append(ExpectedRevision::Any, 3);
        let locations = [None, at("vm/a", 10, 5), None];
        let decision = decide_append(&request, &locations, never, &free, 99);
        let AppendDecision::Reject(Error::PartiallyCommitted {
            stream,
            committed,
            not_written,
        }) = decision
        else {
            panic!("expected partially committed, got {decision:?}");
        };
        assert_eq!(stream, "vm/a");
        assert_eq!(committed, vec![Uuid::from_u128(2)]);
        assert_eq!(not_written, vec![Uuid::from_u128(1), Uuid::from_u128(3)]);
    }

    #[test]
    fn an_unexpected_revision_is_a_conflict_before_any_claim() {
        let request = append(ExpectedRevision::Exact(3), 1).with_claim(acquire("k"));
        let unknown = |_: &str| -> Result<Option<String>> { panic!("a claim was looked up") };
        let decision = decide_append(&request, &[None::<IdAt<'_>>], || Some(4), &unknown, 99);
        let AppendDecision::Reject(Error::Conflict {
            stream,
            expected,
            actual,
            not_written,
        }) = decision
        else {
            panic!("expected a conflict, got {decision:?}");
        };
        assert_eq!(stream, "vm/a");
        assert_eq!(expected, ExpectedRevision::Exact(3));
        assert_eq!(actual, Some(4));
        assert_eq!(not_written, vec![Uuid::from_u128(1)]);

        let fresh = append(ExpectedRevision::NoStream, 1);
        let decision = decide_append(&fresh, &[None::<IdAt<'_>>], || Some(1), &free, 99);
        assert!(
            matches!(
                decision,
                AppendDecision::Reject(Error::Conflict {
                    actual: Some(1),
                    ..
                })
            ),
            "{decision:?}"
        );
    }

    #[test]
    fn a_claim_held_by_another_is_taken() {
        let request = append(ExpectedRevision::Any, 1)
            .with_claim(acquire("free"))
            .with_claim(acquire("held"));
        let holder = |key: &str| Ok((key == "held").then(|| "them".to_owned()));
        let decision = decide_append(&request, &[None::<IdAt<'_>>], || None, &holder, 99);
        let AppendDecision::Reject(Error::ClaimTaken {
            key,
            holder,
            not_written,
        }) = decision
        else {
            panic!("expected a taken claim, got {decision:?}");
        };
        assert_eq!((key.as_str(), holder.as_str()), ("held", "them"));
        assert_eq!(not_written, vec![Uuid::from_u128(1)]);
    }

    #[test]
    fn a_holder_that_cannot_be_told_refuses_before_claims_are_decided() {
        // The first claim is taken, but the second's holder is unknown: the lookup's error wins.
        let request = append(ExpectedRevision::Any, 1)
            .with_claim(acquire("held"))
            .with_claim(release("unknown"));
        let holder = |key: &str| match key {
            "held" => Ok(Some("them".to_owned())),
            _ => Err(Error::Storage {
                context: "test",
                reason: format!("{key} unknown"),
            }),
        };
        let decision = decide_append(&request, &[None::<IdAt<'_>>], || None, &holder, 99);
        assert!(
            matches!(decision, AppendDecision::Reject(Error::Storage { ref reason, .. }) if reason == "unknown unknown"),
            "{decision:?}"
        );
    }

    #[test]
    fn an_accepted_append_follows_the_stream_and_the_log() {
        let request = append(ExpectedRevision::Exact(7), 3)
            .with_claim(acquire("name"))
            .with_claim(release("old"))
            .with_claim(release("theirs"));
        let holder = |key: &str| {
            Ok(match key {
                "old" => Some("me".to_owned()),
                "theirs" => Some("them".to_owned()),
                _ => None,
            })
        };
        let locations = [None::<IdAt<'_>>, None, None];
        let decision = decide_append(&request, &locations, || Some(7), &holder, 42);
        let AppendDecision::Accept {
            first_revision,
            first_position,
            count,
            ref claims,
        } = decision
        else {
            panic!("expected an accept, got {decision:?}");
        };
        assert_eq!((first_revision, first_position, count), (8, 42, 3));
        assert_eq!(
            claims,
            &vec![
                ("name".to_owned(), Some("me".to_owned())),
                ("old".to_owned(), None)
            ]
        );
        let result = decision.into_result().unwrap();
        assert_eq!(
            (result.first_position, result.last_position),
            (Position(42), Position(44))
        );
        assert_eq!((result.first_revision, result.last_revision), (8, 10));
        assert!(!result.replayed);

        // A new stream starts at revision 1.
        let fresh = append(ExpectedRevision::NoStream, 1);
        let decision = decide_append(&fresh, &[None::<IdAt<'_>>], || None, &free, 1);
        assert!(
            matches!(
                decision,
                AppendDecision::Accept {
                    first_revision: 1,
                    first_position: 1,
                    count: 1,
                    ..
                }
            ),
            "{decision:?}"
        );
    }

    fn recorded(
        position: u64,
        stream: &str,
        revision: Revision,
        prev: [u8; 32],
    ) -> crate::RecordedEvent {
        let mut event = crate::RecordedEvent {
            position: Position(position),
            stream: stream.into(),
            revision,
            id: Uuid::from_u128(u128::from(position)),
            recorded_at: crate::Timestamp(10),
            actor: "a".into(),
            correlation_id: Uuid::from_u128(7),
            causation_id: None,
            event_type: "T".into(),
            schema_version: 1,
            payload: vec![1, 2, 3],
            prev_hash: prev,
            hash: [0; 32],
        };
        event.hash = crate::hash::event_hash(&event.as_ref());
        event
    }

    #[test]
    fn the_verify_walk_names_the_first_event_that_does_not_follow() {
        let ok = |_: &str, _: u16, _: &[u8]| Ok(());
        let first = recorded(1, "s", 1, [0; 32]);
        let second = recorded(2, "s", 2, first.hash);
        let mut walk = VerifyWalk::new(&ok);
        walk.check(&first.as_ref()).expect("first");
        walk.check(&second.as_ref()).expect("second");
        assert_eq!(walk.finish(2).expect("report").head_hash, second.hash);

        let cases = [
            (recorded(2, "s", 2, [9; 32]), "previous hash"),
            (
                recorded(2, "s", 3, first.hash),
                "jumps from revision 1 to 3",
            ),
            (recorded(3, "s", 2, first.hash), "gap in the log"),
        ];
        for (bad, reason) in cases {
            let mut walk = VerifyWalk::new(&ok);
            walk.check(&first.as_ref()).expect("first");
            match walk.check(&bad.as_ref()) {
                Err(Error::Corrupt {
                    position,
                    reason: got,
                }) => {
                    assert_eq!(position, Position(2), "{got}");
                    assert!(got.contains(reason), "{got}");
                }
                other => panic!("expected Corrupt ({reason}), got {other:?}"),
            }
        }
        let mut walk = VerifyWalk::new(&ok);
        walk.check(&first.as_ref()).expect("first");
        assert!(
            matches!(walk.finish(2), Err(Error::Corrupt { position, .. }) if position == Position(2))
        );
    }
}
