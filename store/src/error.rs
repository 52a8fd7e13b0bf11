//! The log's errors: typed, so callers match on the kind (a conflict becomes gRPC `Aborted` with
//! the actual revision, a taken claim `AlreadyExists`, damage an alarm).

use uuid::Uuid;

use crate::types::{ExpectedRevision, Position, Revision};

/// The result type of every log operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a log operation failed. A failed append wrote nothing; where it helps a retry, the error
/// carries the ids of the events it did not write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The stream's revision is not what the append expected.
    #[error("stream {stream}: expected revision {expected}, actual {}", show_revision(*.actual))]
    Conflict {
        /// The stream.
        stream: String,
        /// What the append expected.
        expected: ExpectedRevision,
        /// The stream's revision when the append was decided (`None`: no events).
        actual: Option<Revision>,
        /// The request's event ids, none of which were written.
        not_written: Vec<Uuid>,
    },

    /// A [`crate::Claim::Acquire`] named a key another owner holds.
    #[error("claim {key} is held by {holder}")]
    ClaimTaken {
        /// The claimed key.
        key: String,
        /// Its current holder.
        holder: String,
        /// The request's event ids, none of which were written.
        not_written: Vec<Uuid>,
    },

    /// A retry whose events are partly in the log already: some ids were committed, others not.
    /// Appending the rest would split what the caller meant to be atomic.
    #[error(
        "stream {stream}: {} of the append's events are already committed, {} are not",
        .committed.len(),
        .not_written.len()
    )]
    PartiallyCommitted {
        /// The stream.
        stream: String,
        /// Ids already in the log.
        committed: Vec<Uuid>,
        /// Ids not in the log (and not written now).
        not_written: Vec<Uuid>,
    },

    /// Every event id is already in the log, but not as this append would have written them
    /// (another stream, other revisions, or split over several appends): the ids were reused.
    #[error(
        "stream {stream}: event id {id} is already committed at position {position}, elsewhere"
    )]
    EventIdReused {
        /// The stream of the rejected append.
        stream: String,
        /// The first reused id.
        id: Uuid,
        /// Where that id is committed.
        position: Position,
        /// The request's event ids, none of which were written.
        not_written: Vec<Uuid>,
    },

    /// A fenced append whose leadership term is over: another term holds `fence.name` now (or
    /// nobody does). Nothing was written; the caller has been deposed and must stop acting.
    #[error(
        "fenced: leadership {} is no longer held by term {} (current term: {}); the append was not written",
        .fence.name,
        .fence.token,
        show_term(*.current)
    )]
    Fenced {
        /// The fence the append carried.
        fence: crate::types::Fence,
        /// The term holding the leadership when the append was refused (`None`: nobody).
        current: Option<u64>,
        /// The request's event ids, none of which were written.
        not_written: Vec<Uuid>,
    },

    /// A request exceeded one of [`crate::Limits`].
    #[error("{limit} is {max}, got {actual}")]
    LimitExceeded {
        /// The limit's name, e.g. `append_batch_events_max`.
        limit: &'static str,
        /// Its value.
        max: u64,
        /// What the request had.
        actual: u64,
    },

    /// A request that can never succeed (no events, an empty stream name, a duplicated id, …).
    #[error("invalid append: {reason}")]
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },

    /// Stored bytes at a position are damaged or inconsistent: a broken hash chain, a gap, an
    /// undecodable batch, a payload its validator rejects.
    #[error("log damaged at position {position}: {reason}")]
    Corrupt {
        /// The first position found damaged.
        position: Position,
        /// What is wrong there.
        reason: String,
    },

    /// The store as a whole cannot be read (the engine refused or panicked at open, metadata is
    /// missing or from another format).
    #[error("store damaged: {reason}")]
    Damaged {
        /// What is wrong.
        reason: String,
    },

    /// An operating-system I/O call failed.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What the store was doing.
        context: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The storage engine reported an error.
    #[error("storage engine error while {context}: {reason}")]
    Storage {
        /// What the store was doing.
        context: &'static str,
        /// The engine's message.
        reason: String,
    },

    /// The storage behind the log is out of space (etcd's NOSPACE alarm): nothing was written,
    /// and writes keep failing until an operator frees space. Reads still work.
    #[error("log storage full: {reason}")]
    StorageFull {
        /// What the storage said, and what to do.
        reason: String,
    },

    /// The log is configured in a way its storage refuses (e.g. more operations per etcd
    /// transaction than the members allow): nothing was written, and a retry fails the same way
    /// until the configuration changes.
    #[error("log misconfigured: {reason}")]
    Misconfigured {
        /// What the storage refused, and which setting to change.
        reason: String,
    },

    /// A commit failed half-way (written but not made durable); the log refuses further appends
    /// until it is reopened, because its in-memory view can no longer be trusted.
    #[error("log unavailable: {reason}")]
    Unavailable {
        /// The failure that made it unavailable.
        reason: String,
    },
}

impl Error {
    /// The ids of the events an append did not write, when the error knows them.
    #[must_use]
    pub fn not_written(&self) -> Option<&[Uuid]> {
        match self {
            Error::Conflict { not_written, .. }
            | Error::ClaimTaken { not_written, .. }
            | Error::PartiallyCommitted { not_written, .. }
            | Error::EventIdReused { not_written, .. }
            | Error::Fenced { not_written, .. } => Some(not_written),
            _ => None,
        }
    }
}

fn show_revision(revision: Option<Revision>) -> String {
    match revision {
        Some(revision) => revision.to_string(),
        None => "no stream".to_owned(),
    }
}

fn show_term(term: Option<u64>) -> String {
    match term {
        Some(term) => term.to_string(),
        None => "none".to_owned(),
    }
}
