//! Bulk import of already-recorded events (a restore from a backup).
//!
//! The ordinary append path makes every request durable on its own (one `fdatasync` per group
//! commit), which bounds a replay of a million events by the disk's sync rate. An [`Importer`]
//! instead takes envelopes that already carry their position, revision, time and hashes, checks
//! each one exactly as the log would have made it — the next position, the previous hash, its own
//! hash recomputed from its content, the stream's next revision, a non-decreasing `recorded_at`,
//! an id not in the log, the request limits, and its uniqueness claims decided in order — and
//! commits many of them per engine batch: batch values of up to
//! [`ImportOptions::value_events_max`] events / [`ImportOptions::value_bytes_max`] bytes, and one
//! `apply_batch` + `flush` + `fdatasync` per
//! [`ImportOptions::sync_every_events`] / [`ImportOptions::sync_every_bytes`], and one at
//! [`Importer::finish`]. The stored layout is the one group commit writes (batch values, stream
//! index entries per run of a stream inside a value, event-id index, time index, claims, stream
//! heads checkpointed with every sync), so the result is an ordinary log.
//!
//! The importer borrows the log mutably: no append can run beside it. Every durable sync leaves
//! a consistent log (a prefix of the import). After an error the handle refuses further appends
//! and imports (its in-memory state may include events that were never made durable): reopen
//! the directory, or throw it away.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::keys::{self, StreamEntry};
use super::{SledLog, engine, guarded, lock};
use crate::batch::{BatchWriter, StoredEvent};
use crate::error::{Error, Result};
use crate::log::{ImportTip, check_import};
use crate::types::{Claim, Position, RecordedEvent, Timestamp};

/// Events in one stored batch value at most.
pub const VALUE_EVENTS_MAX: usize = 4_096;
/// Payload bytes in one stored batch value at most (a single larger event is a value alone);
/// well under sled's blob threshold (a quarter of the 8 MiB segment).
pub const VALUE_BYTES_MAX: usize = 1 << 20;
/// The default payload bytes per stored batch value: about what one group commit stores
/// (`SledOptions::group_commit_bytes_max`). sled 0.34 rewrites a leaf with every change to it,
/// so leaves of big values make every insert beside them dearer: with 1 MiB values an import
/// ran at about 0.6× its speed with 64 KiB ones (`examples/import_probe.rs`, same machine).
pub const VALUE_BYTES_DEFAULT: usize = 64 << 10;

/// How an import groups events into stored batch values and durable syncs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportOptions {
    /// Events between two durable syncs.
    pub sync_every_events: usize,
    /// Payload bytes between two durable syncs.
    pub sync_every_bytes: usize,
    /// Events in one stored batch value at most (at most [`VALUE_EVENTS_MAX`]).
    pub value_events_max: usize,
    /// Payload bytes in one stored batch value at most (at most [`VALUE_BYTES_MAX`]; a single
    /// larger event is a value alone).
    pub value_bytes_max: usize,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        ImportOptions {
            sync_every_events: 65_536,
            sync_every_bytes: 16 << 20,
            value_events_max: VALUE_EVENTS_MAX,
            value_bytes_max: VALUE_BYTES_DEFAULT,
        }
    }
}

/// What [`Importer::finish`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportReport {
    /// Events imported.
    pub events: u64,
    /// The log's head after the import.
    pub head: Position,
    /// The chain hash at the head.
    pub head_hash: [u8; 32],
    /// Durable syncs (`apply_batch` + `flush` + `fdatasync`) made.
    pub syncs: u64,
}

/// A bulk import into a [`SledLog`]; see the [module documentation](self).
pub struct Importer<'a> {
    log: &'a mut SledLog,
    options: ImportOptions,
    /// Checked events not yet in an engine batch (one batch value's worth at most).
    value: Vec<StoredEvent>,
    value_bytes: usize,
    /// The engine batch being built, and what it holds.
    batch: sled::Batch,
    batch_events: usize,
    batch_bytes: usize,
    /// Streams whose head moved since the last sync.
    touched: HashSet<String>,
    /// The time of the run of equal `recorded_at` in progress, and its last position.
    time_run: Option<(i64, u64)>,
    /// Ids imported so far, when the log was empty at the start (otherwise each id is also
    /// looked up on disk).
    ids: HashSet<Uuid>,
    lookup_ids_on_disk: bool,
    imported: u64,
    syncs: u64,
    failed: bool,
}

impl SledLog {
    /// Starts a bulk import (see [`Importer`]). Fails if the log refuses appends.
    pub fn importer(&mut self, options: ImportOptions) -> Result<Importer<'_>> {
        let state = lock(&self.state);
        if let Some(reason) = &state.poisoned {
            return Err(Error::Unavailable {
                reason: reason.clone(),
            });
        }
        let fresh = state.last_position == 0;
        drop(state);
        Ok(Importer {
            log: self,
            options: ImportOptions {
                sync_every_events: options.sync_every_events.max(1),
                sync_every_bytes: options.sync_every_bytes.max(1),
                value_events_max: options.value_events_max.clamp(1, VALUE_EVENTS_MAX),
                value_bytes_max: options.value_bytes_max.clamp(1, VALUE_BYTES_MAX),
            },
            value: Vec::new(),
            value_bytes: 0,
            batch: sled::Batch::default(),
            batch_events: 0,
            batch_bytes: 0,
            touched: HashSet::new(),
            time_run: None,
            ids: HashSet::new(),
            lookup_ids_on_disk: !fresh,
            imported: 0,
            syncs: 0,
            failed: false,
        })
    }
}

impl Importer<'_> {
    /// Checks `event` (with the claims its append carried) against the log plus everything
    /// imported before it, and queues it. Becomes durable at the next sync or at
    /// [`finish`](Self::finish).
    pub fn push(&mut self, event: RecordedEvent, claims: &[Claim]) -> Result<()> {
        if self.failed {
            return Err(self.refused());
        }
        let result = guarded("importing", || self.push_inner(event, claims));
        if let Err(err) = &result {
            self.fail(err);
        }
        result
    }

    /// Makes everything pushed durable, checkpoints the stream heads and records the head.
    pub fn finish(mut self) -> Result<ImportReport> {
        if self.failed {
            return Err(self.refused());
        }
        if let Err(err) = guarded("importing", || self.sync()) {
            self.fail(&err);
            return Err(err);
        }
        let state = lock(&self.log.state);
        let (head, head_hash) = (state.last_position, state.last_hash);
        drop(state);
        self.log.record_head().map_err(|source| Error::Io {
            context: "recording the head after an import",
            source,
        })?;
        Ok(ImportReport {
            events: self.imported,
            head: Position(head),
            head_hash,
            syncs: self.syncs,
        })
    }

    fn refused(&self) -> Error {
        Error::Unavailable {
            reason: "an earlier error stopped this import".into(),
        }
    }

    fn fail(&mut self, err: &Error) {
        self.failed = true;
        let reason = format!("a bulk import failed ({err}); reopen the log");
        lock(&self.log.state).poisoned = Some(reason);
    }

    fn push_inner(&mut self, event: RecordedEvent, claims: &[Claim]) -> Result<()> {
        let seen_on_disk = if self.lookup_ids_on_disk {
            self.log
                .db
                .get(keys::id(&event.id))
                .map_err(engine("looking up an event id"))?
                .is_some()
        } else {
            false
        };
        let id_seen = seen_on_disk || self.ids.contains(&event.id);
        let mut state = lock(&self.log.state);
        let changes = {
            let holder = |key: &str| state.claims.get(key).cloned();
            let tip = ImportTip {
                last_position: state.last_position,
                last_hash: state.last_hash,
                last_recorded_at: state.last_recorded_at,
                stream_revision: state.heads.get(&event.stream).copied().unwrap_or(0),
                id_seen,
                holder: &holder,
            };
            check_import(&self.log.options.limits, &event, claims, &tip)?
        };
        self.ids.insert(event.id);
        for (key, owner) in changes {
            match owner {
                Some(owner) => {
                    self.batch.insert(keys::claim(&key), owner.as_bytes());
                    state.claims.insert(key, owner);
                }
                None => {
                    self.batch.remove(keys::claim(&key));
                    state.claims.remove(&key);
                }
            }
        }
        state.last_position = event.position.0;
        state.last_hash = event.hash;
        state.last_recorded_at = event.recorded_at.0;
        state.heads.insert(event.stream.clone(), event.revision);
        drop(state);

        match self.time_run {
            Some((at, _)) if at == event.recorded_at.0 => {}
            Some((at, last)) => {
                self.batch.insert(&keys::time(Timestamp(at), last), &[]);
            }
            None => {}
        }
        self.time_run = Some((event.recorded_at.0, event.position.0));
        self.batch.insert(
            &keys::id(&event.id),
            keys::id_value(event.position.0, event.revision, &event.stream),
        );
        if !self.touched.contains(&event.stream) {
            self.touched.insert(event.stream.clone());
        }
        let bytes = event.payload.len();
        if !self.value.is_empty()
            && (self.value.len() >= self.options.value_events_max
                || self.value_bytes + bytes > self.options.value_bytes_max)
        {
            self.close_value()?;
        }
        self.value_bytes += bytes;
        self.batch_bytes += bytes;
        self.value.push(StoredEvent::from(event));
        self.imported += 1;
        self.batch_events += 1;
        if self.batch_events >= self.options.sync_every_events
            || self.batch_bytes >= self.options.sync_every_bytes
        {
            self.sync()?;
        }
        Ok(())
    }

    /// Encodes the queued events as one batch value, with a stream-index entry per run of one
    /// stream's consecutive revisions.
    fn close_value(&mut self) -> Result<()> {
        let Some(first) = self.value.first() else {
            return Ok(());
        };
        let first_position = first.position;
        let bytes_hint = self.value_bytes + 256 * self.value.len();
        let mut writer = BatchWriter::new(first_position, self.value.len(), bytes_hint);
        let mut run: Option<(String, StreamEntry)> = None;
        for event in self.value.drain(..) {
            writer.push(&event)?;
            let continues = run.as_ref().is_some_and(|(stream, entry)| {
                *stream == event.stream
                    && entry.last_revision() + 1 == event.revision
                    && entry.count < u32::MAX
            });
            if continues {
                if let Some((_, entry)) = run.as_mut() {
                    entry.count += 1;
                }
            } else {
                if let Some((stream, entry)) = run.take() {
                    self.batch.insert(
                        keys::stream_entry(&stream, entry.first_revision),
                        &keys::stream_value(&entry),
                    );
                }
                run = Some((
                    event.stream,
                    StreamEntry {
                        first_revision: event.revision,
                        first_position: event.position,
                        count: 1,
                        batch_position: first_position,
                    },
                ));
            }
        }
        if let Some((stream, entry)) = run {
            self.batch.insert(
                keys::stream_entry(&stream, entry.first_revision),
                &keys::stream_value(&entry),
            );
        }
        self.batch
            .insert(&keys::batch(first_position), writer.finish()?.as_slice());
        self.value_bytes = 0;
        Ok(())
    }

    /// Writes what is queued, checkpoints the heads of the streams it touched, and makes it
    /// durable: one `apply_batch`, one `flush`, one `fdatasync`.
    fn sync(&mut self) -> Result<()> {
        self.close_value()?;
        if self.batch_events == 0 {
            return Ok(());
        }
        if let Some((at, last)) = self.time_run {
            self.batch.insert(&keys::time(Timestamp(at), last), &[]);
        }
        let last_position = {
            let mut state = lock(&self.log.state);
            // Heads moved before this import began and not yet checkpointed go with it, so the
            // checkpoint below is complete at `last_position`.
            let dirty: Vec<String> = state.dirty_heads.drain().collect();
            for stream in dirty.into_iter().chain(self.touched.drain()) {
                if let Some(revision) = state.heads.get(&stream) {
                    self.batch
                        .insert(keys::head(&stream), &revision.to_be_bytes());
                }
            }
            self.batch
                .insert(keys::META_HEADS_AT, &state.last_position.to_be_bytes());
            state.batches_since_checkpoint = 0;
            state.last_position
        };
        let log = &*self.log;
        log.db
            .apply_batch(std::mem::take(&mut self.batch))
            .map_err(engine("applying an import batch"))?;
        log.applied.store(last_position, Ordering::Release);
        log.db.flush().map_err(engine("flushing an import batch"))?;
        log.data_file.sync_data().map_err(|source| Error::Io {
            context: "fdatasync of sled's data file",
            source,
        })?;
        lock(&log.blobs).sync().map_err(|source| Error::Io {
            context: "syncing sled's blob files",
            source,
        })?;
        log.durable.publish(last_position);
        {
            // Ids imported are found on disk from now on; the recent-id cache only promises
            // what was committed after the import.
            let mut state = lock(&log.state);
            state.recent_ids.by_id.clear();
            state.recent_ids.order.clear();
            state.recent_ids.floor = last_position + 1;
        }
        log.commits.fetch_add(1, Ordering::Relaxed);
        log.committed_events
            .fetch_add(self.batch_events as u64, Ordering::Relaxed);
        self.syncs += 1;
        self.batch_events = 0;
        self.batch_bytes = 0;
        Ok(())
    }
}
