//! # vmplane-projections
//!
//! **Owns** everything vmplane derives from the log — the read models — and the command path
//! that writes to it:
//!
//! - current state of VMs, VMIs, instancetypes/preferences, snapshots/restores/clones and the
//!   cluster config, in KubeVirt's JSON shape, with status computed from events by core's
//!   pure lifecycle functions (never stored);
//! - indexes: by namespace and name, by firmware UUID (who holds it), by requested feature,
//!   by captured instancetype/preference revision;
//! - checkpoints (state + last applied position, written atomically, keyed by format and code
//!   version) so a restart replays only the tail; `rebuild` and a digest proving both agree;
//! - read-your-writes (`min_position`), list-and-watch without gap or repeat;
//! - time travel (at a revision, a global position, an instant), history, spec diff, audit;
//! - the command path ([`command`]): load `(state, revision)`, decide, append with optimistic
//!   concurrency, retry on conflict.
//!
//! ## Main types, in reading order
//!
//! - [`Projections`]: opened over an `Arc<dyn EventLog>` and a data dir; [`Projections::get`],
//!   [`Projections::list`] ([`ListResult`] carries its position), [`Projections::get_at`] with
//!   [`At`], [`Projections::history`], [`Projections::diff`], [`Projections::audit`],
//!   [`Projections::watch`] ([`Watch`]), the index queries, [`Projections::digest`],
//!   [`Projections::rebuild`], [`Projections::checkpoint`].
//! - [`Rendered`]: one object as a reader sees it (kind, names, uid, generation,
//!   resourceVersion, the object): [`ObjectView`] with the object's JSON tree, [`ObjectJson`]
//!   with its JSON text, what [`Projections::get_json`] and [`Projections::get_at_json`] give
//!   the gateway without building the tree.
//! - [`StateCache`] and [`Snapshot`]: folded aggregate states ([`AggState`]) at some
//!   revisions, filled from the log on demand — specs are parsed when read, not when replayed.
//! - [`CommandHandler`], [`Command`], [`CommandMeta`] → [`Executed`] or [`CommandError`].
//!
//! ## Must never
//!
//! - append events except through [`command`];
//! - hold a truth the log does not have: checkpoints and caches can be deleted at any time and
//!   are rebuilt by replay to the same digest;
//! - read a clock or randomness outside [`command`] (decision context) and status rendering
//!   (`now` for time-dependent status).
//!
//! ## Example
//!
//! ```
//! use std::sync::Arc;
//! use vmplane_core::types::{Kind, parse_manifest};
//! use vmplane_projections::{Command, CommandHandler, CommandMeta, ProjectionOptions, Projections};
//! use vmplane_store::{EventLog, SledLog};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let log: Arc<dyn EventLog> = Arc::new(SledLog::open(dir.path().join("log"))?);
//! let projections = Projections::open(Arc::clone(&log), dir.path(), ProjectionOptions::default())?;
//! let commands = CommandHandler::new(Arc::clone(&log), Arc::clone(projections.cache()), Default::default());
//! let manifest = parse_manifest(br#"
//! apiVersion: kubevirt.io/v1
//! kind: VirtualMachine
//! metadata: {name: demo, namespace: default}
//! spec: {runStrategy: Halted, template: {spec: {domain: {memory: {guest: 128Mi}, devices: {}}}}}
//! "#)?;
//! let meta = CommandMeta { actor: "alice".into(), ..CommandMeta::default() };
//! let done = commands.execute(&meta, Command::apply(manifest))?;
//! let vm = projections.get(Kind::VirtualMachine, "default", "demo", Some(done.position))?.expect("just created");
//! assert_eq!(vm.generation, 1);
//! assert_eq!(vm.object["status"]["printableStatus"], "Stopped");
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod cache;
pub mod checkpoint;
mod chunked;
pub mod command;
pub mod error;
pub mod features;
pub mod history;
pub mod model;
pub mod projections;
mod readmodel;
pub mod render;
pub mod watch;

pub use cache::{CacheOptions, StateCache};
pub use command::{
    AsyncExecuted, Command, CommandError, CommandHandler, CommandMeta, CommandOptions, Executed,
    Preconditions,
};
pub use error::{Error, Result};
pub use features::{features_requested, state_features};
pub use history::{Audit, AuditQuery, AuditRecord, HistoryEntry, SpecDiff};
pub use model::{AggState, Snapshot};
pub use projections::{
    At, ListPage, ListResult, ObjectRef, PageEnd, ProjectionOptions, Projections,
};
pub use readmodel::{RESTORE_ACTOR, RevisionRef, void_event, void_stream};
pub use render::{ObjectJson, ObjectView, Rendered};
pub use watch::{Watch, WatchEvent, WatchFilter};
