//! # vmplane-store
//!
//! The append-only, hash-chained event log that is vmplane's source of truth. It owns positions,
//! stream revisions, optimistic concurrency, idempotent appends, cross-stream uniqueness claims,
//! group commit, durability, subscriptions, the time index and `verify`.
//!
//! It **never interprets payloads**: an event's payload is bytes tagged with an `event_type` and a
//! `schema_version`; decoding is `core`'s business, and `verify` takes `core`'s decoder as a
//! callback. Nor does it know what a VM is: streams and claim keys are opaque strings.
//!
//! ## Main types, in reading order
//!
//! - [`EventLog`]: the storage trait (blocking, object safe, `Arc<dyn EventLog>`). No engine type
//!   appears in it, so a second backend (etcd) implements the same trait and passes the same
//!   [`contract`] tests (feature `contract`).
//! - [`AppendRequest`] → [`AppendResult`]: events ([`ProposedEvent`]) for one stream with an
//!   [`ExpectedRevision`] and [`Claim`]s, atomically; [`Position`]s are global and gapless from 1,
//!   revisions count from 1 per stream.
//! - [`RecordedEvent`] / [`RecordedEventRef`]: the envelope as stored (position, stream, revision,
//!   id, recorded-at, actor, correlation and causation ids, type, version, payload, previous hash,
//!   hash — see [`hash`]); the `Ref` form is what [`EventLog::scan`] lends without copying.
//! - [`Subscription`]: catch up from a position, then follow live, no gap and no repeat.
//! - [`Error`]: typed failures; a conflict carries expected and actual revisions, damage names the
//!   position ([`Error::Corrupt`]).
//! - [`Limits`]: every bound, unit in its name.
//! - [`SledLog`]: the default embedded backend (sled 0.34 + explicit `fdatasync`, group commit,
//!   each committed batch stored as one value).
//! - [`FileLog`]: the other embedded backend: one append-only file, one `write` and one
//!   `fdatasync` per group commit, the indexes in memory (rebuilt at open).
//!
//! ## Guarantees
//!
//! - An append returns only after its events are durable (fdatasync completed).
//! - Reads never see past the durable head.
//! - Damaged storage gives an error naming the problem, never a panic and never a shorter log
//!   presented as whole.
//!
//! ## Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, Position, ProposedEvent, SledLog};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path())?);
//! let event = ProposedEvent {
//!     id: uuid::Uuid::now_v7(),
//!     event_type: "VmCreated".into(),
//!     schema_version: 1,
//!     payload: b"opaque bytes".to_vec(),
//!     actor: "alice".into(),
//!     correlation_id: uuid::Uuid::now_v7(),
//!     causation_id: None,
//! };
//! let written = log.append(AppendRequest::new("vm/default/demo", ExpectedRevision::NoStream, vec![event]))?;
//! assert_eq!((written.first_position, written.last_revision), (Position(1), 1));
//!
//! let mut watch = Arc::clone(&log).subscribe(Position(0));
//! let events = watch.next_batch(100, Duration::from_secs(1))?;
//! assert_eq!(events[0].event_type, "VmCreated");
//! log.verify(&|_type, _version, _payload| Ok(()))?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod batch;
pub mod error;
pub mod file_log;
mod group;
pub mod hash;
pub mod head_record;
pub mod log;
pub mod shards;
pub mod sled_log;
pub mod submit;
pub mod threads;
pub mod types;

#[cfg(feature = "contract")]
pub mod contract;

pub use error::{Error, Result};
pub use file_log::{FileLog, FileOptions};
pub use log::{EventLog, FencedLog, PayloadValidator, Subscription, Visitor, check_request};
pub use shards::ShardedMap;
pub use sled_log::{Clock, CommitStats, SledLog, SledOptions};
pub use submit::{Appended, PendingAppend, Submitted};
pub use types::{
    AppendRequest, AppendResult, Claim, Direction, ExpectedRevision, Fence, Limits, Position,
    ProposedEvent, RecordedEvent, RecordedEventRef, Revision, Timestamp, VerifyReport,
};
