//! The projections' errors: typed, so the gateway maps each to a status code.

use vmplane_store::Position;

/// The result type of projection reads.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a projection read failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The log refused or failed a read.
    #[error(transparent)]
    Store(#[from] vmplane_store::Error),

    /// An event in the log does not decode: the log is damaged or was written by newer code.
    #[error("event at position {position} does not decode: {reason}")]
    Corrupt {
        /// Where.
        position: Position,
        /// What the decoder said.
        reason: String,
    },

    /// A read asked to see position `wanted` but the projection had only reached `reached`
    /// when its timeout passed (read-your-writes).
    #[error("projection reached position {reached}, not {wanted}, before the timeout")]
    Timeout {
        /// The position the reader asked for.
        wanted: Position,
        /// Where the projection was.
        reached: Position,
    },

    /// The object, or the revision asked for, does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was asked for, e.g. `VirtualMachine default/demo revision 7`.
        what: String,
    },

    /// The object exists, but not at the stream revision asked for (0, or past its last).
    #[error("{stream} revision {revision} not found")]
    RevisionNotFound {
        /// The object's stream (`vm/default/demo`).
        stream: String,
        /// The revision asked for.
        revision: u64,
    },

    /// A request that cannot be answered as asked (a revision 0, a kind without objects, …).
    #[error("invalid request: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },

    /// Writing or reading a checkpoint failed (checkpoints are caches: a failed read only
    /// means a rebuild; a failed write is reported).
    #[error("checkpoint I/O while {context}: {source}")]
    CheckpointIo {
        /// What was being done.
        context: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
