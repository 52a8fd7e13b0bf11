//! The log's vocabulary: positions, revisions, timestamps, proposed and recorded events, append
//! requests and their results, claims, and the limits every backend enforces.

use std::fmt;

use uuid::Uuid;

/// A global, gapless position in the log. The first event is at position 1; `Position(0)` means
/// "before everything" and is what a reader passes to start from the beginning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub u64);

impl Position {
    /// Before the first event: `read_all(Position::START, ..)` reads from position 1.
    pub const START: Position = Position(0);

    /// The position right after this one.
    #[must_use]
    pub fn next(self) -> Position {
        Position(self.0 + 1)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A stream's revision: its first event has revision 1 (an object's `generation`), each further
/// event adds one. A stream with no events has no revision (`None`), never revision 0.
pub type Revision = u64;

/// The time the store recorded an event, in nanoseconds since the Unix epoch (UTC).
///
/// The store assigns it, never the caller, and it never decreases along the log: an event at a
/// higher position has a `recorded_at` greater than or equal to every event before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The wall clock now. Times before 1970 or after 2262 saturate.
    #[must_use]
    pub fn now() -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(i64::try_from(since_epoch.as_nanos()).unwrap_or(i64::MAX))
    }

    /// Nanoseconds since the Unix epoch.
    #[must_use]
    pub fn unix_nanos(self) -> i64 {
        self.0
    }
}

/// What the stream must look like for an append to go ahead (optimistic concurrency).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpectedRevision {
    /// Append whatever the stream's revision is.
    Any,
    /// The stream must have no events.
    NoStream,
    /// The stream's last event must have this revision. `Exact(0)` means the same as `NoStream`,
    /// so a caller holding "revision 0" for a fresh aggregate can pass it unchanged.
    Exact(Revision),
}

impl ExpectedRevision {
    /// Whether a stream whose current revision is `actual` satisfies this expectation.
    #[must_use]
    pub fn admits(self, actual: Option<Revision>) -> bool {
        match self {
            ExpectedRevision::Any => true,
            ExpectedRevision::NoStream | ExpectedRevision::Exact(0) => actual.is_none(),
            ExpectedRevision::Exact(n) => actual == Some(n),
        }
    }

    /// The revision the first appended event would get if this expectation holds, when that is
    /// known without looking at the stream (`None` for `Any`).
    #[must_use]
    pub fn first_revision(self) -> Option<Revision> {
        match self {
            ExpectedRevision::Any => None,
            ExpectedRevision::NoStream => Some(1),
            ExpectedRevision::Exact(n) => Some(n + 1),
        }
    }
}

impl fmt::Display for ExpectedRevision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpectedRevision::Any => write!(f, "any"),
            ExpectedRevision::NoStream => write!(f, "no stream"),
            ExpectedRevision::Exact(n) => write!(f, "{n}"),
        }
    }
}

/// An event the caller wants appended. The store treats `payload` as opaque bytes, tagged by
/// `event_type` and `schema_version`; it never decodes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProposedEvent {
    /// Made by the caller (UUID v7) and kept across retries: it is what makes an append
    /// idempotent.
    pub id: Uuid,
    /// A frozen type tag such as `VmCreated`.
    pub event_type: String,
    /// The layout version of `payload` for this `event_type`.
    pub schema_version: u16,
    /// The encoded event (an rkyv archive in vmplane, but the store does not care).
    pub payload: Vec<u8>,
    /// Who caused it: a principal such as `alice`, or `system:reconciler`.
    pub actor: String,
    /// Shared by every event caused by one request.
    pub correlation_id: Uuid,
    /// The event (or command) that caused this one, if any.
    pub causation_id: Option<Uuid>,
}

/// A cross-stream uniqueness claim decided atomically with an append, e.g. "firmware UUID X is held
/// by VM uid Y". Keys and owners are opaque strings to the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    /// Take `key` for `owner`. Fails the whole append with [`crate::Error::ClaimTaken`] if another
    /// owner holds it; taking a key you already hold is a no-op.
    Acquire {
        /// The claimed value, e.g. `firmware-uuid/6a1f…`.
        key: String,
        /// Who holds it, e.g. a VM uid.
        owner: String,
    },
    /// Free `key` if `owner` holds it; a no-op otherwise.
    Release {
        /// The claimed value.
        key: String,
        /// The holder that frees it.
        owner: String,
    },
}

impl Claim {
    /// The claimed key.
    #[must_use]
    pub fn key(&self) -> &str {
        match self {
            Claim::Acquire { key, .. } | Claim::Release { key, .. } => key,
        }
    }

    /// The owner named by the claim.
    #[must_use]
    pub fn owner(&self) -> &str {
        match self {
            Claim::Acquire { owner, .. } | Claim::Release { owner, .. } => owner,
        }
    }
}

/// One atomic append: all `events` go to `stream` at consecutive revisions and consecutive
/// positions, together with every claim change, or nothing is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    /// The stream, e.g. `vm/default/demo`.
    pub stream: String,
    /// What the stream's revision must be for the append to go ahead.
    pub expected: ExpectedRevision,
    /// At least one event, at most [`Limits::append_batch_events_max`].
    pub events: Vec<ProposedEvent>,
    /// Uniqueness claims taken or released with these events.
    pub claims: Vec<Claim>,
}

impl AppendRequest {
    /// An append of `events` to `stream` with no claims.
    #[must_use]
    pub fn new(
        stream: impl Into<String>,
        expected: ExpectedRevision,
        events: Vec<ProposedEvent>,
    ) -> AppendRequest {
        AppendRequest {
            stream: stream.into(),
            expected,
            events,
            claims: Vec::new(),
        }
    }

    /// The same request with `claim` added.
    #[must_use]
    pub fn with_claim(mut self, claim: Claim) -> AppendRequest {
        self.claims.push(claim);
        self
    }

    /// The ids of the request's events, in order.
    #[must_use]
    pub fn event_ids(&self) -> Vec<Uuid> {
        self.events.iter().map(|event| event.id).collect()
    }
}

/// A leadership an append must still hold when it commits (fencing): the append is written only
/// if leadership `name` is, at that moment and in the same atomic step, held by the term `token`
/// names. A deposed leader's appends then fail with [`crate::Error::Fenced`] instead of landing.
///
/// Where leadership lives is the backend's business: on etcd `name` is a key under the log's
/// namespace and `token` that key's create revision (a new term re-creates the key, so a stale
/// token never matches again); the sled backend, one process per data directory, keeps the
/// current term of each name in memory ([`crate::SledLog::take_fence`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The leadership, e.g. `reconciler`.
    pub name: String,
    /// The term that must still hold it.
    pub token: u64,
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.token)
    }
}

/// Where an append's events are in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AppendResult {
    /// The position of the first event.
    pub first_position: Position,
    /// The position of the last event (`first_position` + events − 1).
    pub last_position: Position,
    /// The stream revision of the first event.
    pub first_revision: Revision,
    /// The stream revision of the last event: the stream's revision after the append.
    pub last_revision: Revision,
    /// True when every event was already in the log (an idempotent retry): nothing was written and
    /// the positions are the original ones.
    pub replayed: bool,
}

/// An event as the log holds it: the caller's proposal plus what the store assigned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEvent {
    /// Global, gapless position.
    pub position: Position,
    /// The stream it belongs to.
    pub stream: String,
    /// Its revision in that stream.
    pub revision: Revision,
    /// The caller's event id.
    pub id: Uuid,
    /// When the store recorded it.
    pub recorded_at: Timestamp,
    /// Who caused it.
    pub actor: String,
    /// Shared by every event of one request.
    pub correlation_id: Uuid,
    /// The cause, if any.
    pub causation_id: Option<Uuid>,
    /// The type tag.
    pub event_type: String,
    /// The payload's layout version.
    pub schema_version: u16,
    /// The opaque payload.
    pub payload: Vec<u8>,
    /// The previous event's `hash`, or zeros for position 1.
    pub prev_hash: [u8; 32],
    /// SHA-256 over the canonical encoding of every field above (see [`crate::hash`]).
    pub hash: [u8; 32],
}

impl RecordedEvent {
    /// A borrowed view of this event.
    #[must_use]
    pub fn as_ref(&self) -> RecordedEventRef<'_> {
        RecordedEventRef {
            position: self.position,
            stream: &self.stream,
            revision: self.revision,
            id: self.id,
            recorded_at: self.recorded_at,
            actor: &self.actor,
            correlation_id: self.correlation_id,
            causation_id: self.causation_id,
            event_type: &self.event_type,
            schema_version: self.schema_version,
            payload: &self.payload,
            prev_hash: &self.prev_hash,
            hash: &self.hash,
        }
    }
}

/// A recorded event borrowed from the log's storage: what [`crate::EventLog::scan`] hands to its
/// visitor without copying. Its bytes have already been validated.
///
/// `payload` has no alignment promise: a reader that needs an aligned buffer (rkyv) checks the
/// pointer and copies only when it is misaligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedEventRef<'a> {
    /// Global, gapless position.
    pub position: Position,
    /// The stream it belongs to.
    pub stream: &'a str,
    /// Its revision in that stream.
    pub revision: Revision,
    /// The caller's event id.
    pub id: Uuid,
    /// When the store recorded it.
    pub recorded_at: Timestamp,
    /// Who caused it.
    pub actor: &'a str,
    /// Shared by every event of one request.
    pub correlation_id: Uuid,
    /// The cause, if any.
    pub causation_id: Option<Uuid>,
    /// The type tag.
    pub event_type: &'a str,
    /// The payload's layout version.
    pub schema_version: u16,
    /// The opaque payload.
    pub payload: &'a [u8],
    /// The previous event's hash.
    pub prev_hash: &'a [u8; 32],
    /// This event's hash.
    pub hash: &'a [u8; 32],
}

impl RecordedEventRef<'_> {
    /// An owned copy.
    #[must_use]
    pub fn to_owned_event(&self) -> RecordedEvent {
        RecordedEvent {
            position: self.position,
            stream: self.stream.to_owned(),
            revision: self.revision,
            id: self.id,
            recorded_at: self.recorded_at,
            actor: self.actor.to_owned(),
            correlation_id: self.correlation_id,
            causation_id: self.causation_id,
            event_type: self.event_type.to_owned(),
            schema_version: self.schema_version,
            payload: self.payload.to_vec(),
            prev_hash: *self.prev_hash,
            hash: *self.hash,
        }
    }
}

/// Which way a stream read goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Increasing revisions, starting at the given one.
    Forward,
    /// Decreasing revisions, starting at the given one (`u64::MAX` = from the last event).
    Backward,
}

/// What [`crate::EventLog::verify`] walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    /// Events checked (= the last position, since positions are gapless from 1).
    pub events: u64,
    /// The last event's hash, or zeros for an empty log.
    pub head_hash: [u8; 32],
}

/// Every bound the log enforces, with its unit in its name. A backend reports its own through
/// [`crate::EventLog::limits`]; the contract tests probe each edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Events in one append request.
    pub append_batch_events_max: usize,
    /// Claims in one append request.
    pub append_claims_max: usize,
    /// Bytes in one event's payload.
    pub event_payload_bytes_max: usize,
    /// Bytes of payload in one append request, all events together.
    pub append_payload_bytes_max: usize,
    /// Bytes in a stream name.
    pub stream_name_bytes_max: usize,
    /// Bytes in an event type.
    pub event_type_bytes_max: usize,
    /// Bytes in an actor.
    pub actor_bytes_max: usize,
    /// Bytes in a claim key, and in a claim owner.
    pub claim_bytes_max: usize,
    /// Events one read returns at most, whatever `max_count` asks for.
    pub read_events_max: usize,
}

impl Limits {
    /// The limits of the embedded (sled) backend.
    pub const DEFAULT: Limits = Limits {
        append_batch_events_max: 1_000,
        append_claims_max: 16,
        event_payload_bytes_max: 1 << 20,
        append_payload_bytes_max: 4 << 20,
        stream_name_bytes_max: 512,
        event_type_bytes_max: 128,
        actor_bytes_max: 256,
        claim_bytes_max: 512,
        read_events_max: 10_000,
    };
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}
