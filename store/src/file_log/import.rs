//! Bulk import into a [`FileLog`]: already-recorded envelopes (a restore's), each checked as the
//! append path would have made it ([`crate::log::check_import`], as on every backend), written as
//! records of the events that share a `recorded_at` (the original commits, as far as their
//! times tell them apart), and synced once at the end.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::FileLog;
use super::record::ClaimChange;
use crate::batch::{BatchView, BatchWriter, StoredEvent};
use crate::error::{Error, Result};
use crate::log::{ImportTip, check_import};
use crate::sled_log::ImportReport;
use crate::types::{Claim, Position, RecordedEvent, Revision};

/// Events one record holds at most.
const RECORD_EVENTS_MAX: usize = 4_096;
/// Payload bytes one record holds at most (a single larger event still gets one of its own).
const RECORD_BYTES_MAX: usize = 1 << 20;

/// A bulk import into a [`FileLog`]; see the [module documentation](self). Holds the log
/// exclusively, so nothing else appends meanwhile.
pub struct FileImporter<'a> {
    log: &'a mut FileLog,
    /// Events pushed and checked, not yet written.
    pending: Vec<RecordedEvent>,
    pending_bytes: usize,
    changes: Vec<ClaimChange>,
    /// The tip after everything pushed (written or pending).
    last_position: u64,
    last_hash: [u8; 32],
    last_recorded_at: i64,
    heads: HashMap<String, Revision>,
    claims: HashMap<String, Option<String>>,
    ids: HashSet<Uuid>,
    imported: u64,
    failed: bool,
}

impl FileLog {
    /// Starts a bulk import of already-recorded events, after what the log holds.
    pub fn importer(&mut self) -> Result<FileImporter<'_>> {
        let (last_position, last_hash, last_recorded_at) = {
            if let Some(reason) = self.inner.poisoned.get() {
                return Err(Error::Unavailable {
                    reason: reason.clone(),
                });
            }
            let index = self.inner.index();
            (index.last_position, index.last_hash, index.last_recorded_at)
        };
        Ok(FileImporter {
            log: self,
            pending: Vec::new(),
            pending_bytes: 0,
            changes: Vec::new(),
            last_position,
            last_hash,
            last_recorded_at,
            heads: HashMap::new(),
            claims: HashMap::new(),
            ids: HashSet::new(),
            imported: 0,
            failed: false,
        })
    }
}

impl FileImporter<'_> {
    /// Checks `event` (with the claims its append carried) against the log plus everything
    /// pushed before it, and queues it. Durable once [`finish`](Self::finish) returns.
    pub fn push(&mut self, event: RecordedEvent, claims: &[Claim]) -> Result<()> {
        if self.failed {
            return Err(refused());
        }
        let result = self.push_inner(event, claims);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Writes what is pending, syncs once, and reports.
    pub fn finish(mut self) -> Result<ImportReport> {
        if self.failed {
            return Err(refused());
        }
        self.write_pending()?;
        self.log.inner.sync()?;
        self.log
            .inner
            .head_record
            .write(self.last_position, self.last_hash)
            .map_err(|source| Error::Io {
                context: "recording the head after an import",
                source,
            })?;
        Ok(ImportReport {
            events: self.imported,
            head: Position(self.last_position),
            head_hash: self.last_hash,
            syncs: 1,
        })
    }

    fn push_inner(&mut self, event: RecordedEvent, claims: &[Claim]) -> Result<()> {
        let changes = {
            let index = self.log.inner.index();
            let holder = |key: &str| match self.claims.get(key) {
                Some(change) => change.clone(),
                None => index.claims.get(key).cloned(),
            };
            let stream_revision = self.heads.get(&event.stream).copied().or_else(|| {
                index
                    .streams
                    .get(event.stream.as_str())
                    .and_then(|runs| runs.last())
                    .map(|run| run.last_revision())
            });
            let tip = ImportTip {
                last_position: self.last_position,
                last_hash: self.last_hash,
                last_recorded_at: self.last_recorded_at,
                stream_revision: stream_revision.unwrap_or(0),
                id_seen: self.ids.contains(&event.id) || index.ids.contains_key(&event.id),
                holder: &holder,
            };
            check_import(&self.log.inner.options.limits, &event, claims, &tip)?
        };
        // A record holds one commit time: a new time, or a full record, starts the next.
        let full = self.pending.len() >= RECORD_EVENTS_MAX
            || self.pending_bytes + event.payload.len() > RECORD_BYTES_MAX;
        let new_time = self
            .pending
            .last()
            .is_some_and(|last| last.recorded_at != event.recorded_at);
        if !self.pending.is_empty() && (full || new_time) {
            self.write_pending()?;
        }
        self.ids.insert(event.id);
        self.heads.insert(event.stream.clone(), event.revision);
        for (key, owner) in changes {
            self.claims.insert(key.clone(), owner.clone());
            self.changes.push(ClaimChange { key, owner });
        }
        self.last_position = event.position.0;
        self.last_hash = event.hash;
        self.last_recorded_at = event.recorded_at.0;
        self.pending_bytes += event.payload.len();
        self.pending.push(event);
        self.imported += 1;
        Ok(())
    }

    /// Writes the pending events as one record (not synced).
    fn write_pending(&mut self) -> Result<()> {
        let Some(first) = self.pending.first() else {
            return Ok(());
        };
        let (first_position, recorded_at) = (first.position.0, first.recorded_at.0);
        let events = std::mem::take(&mut self.pending);
        let last_position = first_position + events.len() as u64 - 1;
        let mut writer = BatchWriter::new(first_position, events.len(), self.pending_bytes);
        for event in events {
            writer.push(&StoredEvent::from(event))?;
        }
        let batch = writer.finish()?;
        BatchView::new(&batch, first_position)?;
        let changes = std::mem::take(&mut self.changes);
        let encoded = (super::record::encode(&changes, &batch), changes);
        self.pending_bytes = 0;
        let written = self.log.inner.write_record(
            &encoded,
            first_position,
            last_position,
            recorded_at,
            false,
        );
        if written.is_err() {
            self.failed = true;
        }
        written
    }
}

fn refused() -> Error {
    Error::Unavailable {
        reason: "an earlier error stopped this import".into(),
    }
}
