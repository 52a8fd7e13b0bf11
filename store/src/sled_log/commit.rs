//! Group commit.
//!
//! An appender checks its request, looks its event ids up on disk (in parallel with everyone
//! else), and queues it. If no commit is in progress it becomes the leader at once and commits on
//! its own thread, so an uncontended append pays no hand-off. Otherwise it sleeps on its own slot.
//!
//! The leader drains the queue (bounded by events and bytes), decides every request against the
//! in-memory state (stream heads, claims, recent ids) plus the effects of the requests before it
//! in the group, rejecting a conflicting request without failing the others; then one
//! `apply_batch`, one `flush`, one `fdatasync`; then it updates the state, publishes the new head
//! and wakes every appender with its own result. Finally it hands leadership to the first waiting
//! appender, if any.
//!
//! An append submitted without waiting ([`SledLog::submit_grouped`]) queues the same way with a
//! future instead of a sleeping thread, and never leads: the log's committer thread
//! ([`SledLog::start_committer`]) does, woken when such an append finds no commit in progress
//! or reaches the front of the queue. Its event ids are looked up by the leader. A thread
//! appender that leads hands over to the committer rather than committing others' submitted
//! appends on its own time.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use uuid::Uuid;

use super::keys::{self, IdLocation, StreamEntry};
use super::{SledLog, State, engine, lock};
use crate::batch::{BatchWriter, StoredEvent};
use crate::error::{Error, Result};
use crate::log::{Overlay, check_request, decide_append};
// How one request was decided: the same outcomes on every backend.
use crate::log::AppendDecision as Decision;
// Fail points inject it only with the `failpoints` feature.
#[cfg_attr(not(feature = "failpoints"), allow(unused_imports))]
use crate::group::injected;
use crate::group::{
    Committed, Committer, Slot, SlotFuture, SlotState, commit_and_answer, decide_group,
    refuse_group, take_group,
};
use crate::submit::{PendingAppend, Submitted};
use crate::types::{AppendRequest, AppendResult, Revision, Timestamp};

/// Appends waiting for a leader, and whether one is at work. Invariant: when no leader is
/// active, the queue is empty.
#[derive(Default)]
pub(super) struct Queue {
    pending: VecDeque<Pending>,
    leader_active: bool,
}

/// One queued append.
struct Pending {
    request: AppendRequest,
    /// Where each event id was found on disk before queueing (`None`: not found); `None` when
    /// not looked up (a submitted append): the leader looks them up.
    known: Option<Vec<Option<IdLocation>>>,
    /// The last applied position when `known` was looked up: ids committed after it are in
    /// `State::recent_ids`.
    checked_through: u64,
    slot: Arc<Slot>,
    /// A submitted append: a future waits on the slot, no thread; it is never made leader.
    submitted: bool,
}

impl SledLog {
    pub(super) fn append_grouped(&self, request: AppendRequest) -> Result<AppendResult> {
        check_request(&self.options.limits, &request)?;
        if let Some(reason) = &lock(&self.state).poisoned {
            return Err(Error::Unavailable {
                reason: reason.clone(),
            });
        }
        let checked_through = self.applied.load(Ordering::Acquire);
        let known = super::guarded("looking up event ids", || self.lookup_ids(&request))?;
        let slot = Arc::new(Slot::default());
        let leading = {
            let mut queue = lock(&self.queue);
            queue.pending.push_back(Pending {
                request,
                known: Some(known),
                checked_through,
                slot: Arc::clone(&slot),
                submitted: false,
            });
            !std::mem::replace(&mut queue.leader_active, true)
        };
        if !leading && let Some(result) = slot.wait() {
            return result;
        }
        self.lead(false);
        slot.wait().unwrap_or_else(|| {
            Err(Error::Unavailable {
                reason: "a leader finished without deciding its own append".into(),
            })
        })
    }

    /// Starts the committer thread that commits submitted appends; until it runs,
    /// [`EventLog::submit`](crate::EventLog::submit) gives requests back. The thread holds the
    /// log only while it commits and ends when the log is dropped. Calling it again does
    /// nothing.
    pub fn start_committer(self: &Arc<Self>) -> Result<()> {
        let committer = Arc::new(Committer::default());
        if self.committer.set(Arc::clone(&committer)).is_err() {
            return Ok(());
        }
        let log: Weak<SledLog> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("log committer".into())
            .spawn(move || {
                while committer.wait() {
                    let Some(log) = log.upgrade() else { return };
                    log.lead(true);
                }
            });
        match spawned {
            Ok(_) => Ok(()),
            Err(source) => Err(Error::Io {
                context: "starting the log's committer thread",
                source,
            }),
        }
    }

    /// Queues `request` for the group commit and returns at once; the future completes when
    /// the append is decided. See [`EventLog::submit`](crate::EventLog::submit).
    pub(super) fn submit_grouped(&self, request: AppendRequest) -> Submitted {
        let Some(committer) = self.committer.get() else {
            return Submitted::Unsupported(request);
        };
        if let Err(err) = check_request(&self.options.limits, &request) {
            return Submitted::Pending(PendingAppend::new(std::future::ready(Err(err))));
        }
        if let Some(reason) = &lock(&self.state).poisoned {
            let err = Error::Unavailable {
                reason: reason.clone(),
            };
            return Submitted::Pending(PendingAppend::new(std::future::ready(Err(err))));
        }
        let slot = Arc::new(Slot::default());
        let wake = {
            let mut queue = lock(&self.queue);
            queue.pending.push_back(Pending {
                request,
                known: None,
                checked_through: 0,
                slot: Arc::clone(&slot),
                submitted: true,
            });
            !std::mem::replace(&mut queue.leader_active, true)
        };
        if wake {
            committer.want();
        }
        Submitted::Pending(PendingAppend::new(SlotFuture(slot)))
    }

    fn lookup_ids(&self, request: &AppendRequest) -> Result<Vec<Option<IdLocation>>> {
        request
            .events
            .iter()
            .map(|event| {
                let found = self
                    .db
                    .get(keys::id(&event.id))
                    .map_err(engine("looking up an event id"))?;
                found
                    .map(|value| keys::parse_id_value(&event.id, &value))
                    .transpose()
            })
            .collect()
    }

    /// Commits groups from the front of the queue, then hands leadership on: to the thread
    /// appender at the front, or (from a thread appender) to the committer when a submitted
    /// append is at the front. The committer (`committer`) goes on while submitted appends are.
    fn lead(&self, committer: bool) {
        loop {
            self.lead_one();
            let mut queue = lock(&self.queue);
            match queue.pending.front() {
                None => {
                    queue.leader_active = false;
                    return;
                }
                Some(next) if !next.submitted => {
                    next.slot.set(SlotState::Lead);
                    return;
                }
                Some(_) if committer => {}
                Some(_) => {
                    drop(queue);
                    match self.committer.get() {
                        Some(c) => c.want(),
                        // Unreachable: appends are only submitted once the committer runs.
                        None => continue,
                    }
                    return;
                }
            }
        }
    }

    /// Commits one group from the front of the queue.
    fn lead_one(&self) {
        let group = take_group(
            &mut lock(&self.queue).pending,
            |pending| &pending.request,
            self.options.group_commit_events_max,
            self.options.group_commit_bytes_max,
        );
        let slots: Vec<Arc<Slot>> = group
            .iter()
            .map(|pending| Arc::clone(&pending.slot))
            .collect();
        if group.is_empty() {
            return;
        }
        commit_and_answer(
            &slots,
            || self.commit_group(group),
            |reason| lock(&self.state).poisoned = Some(reason),
        );
    }

    /// Decides, writes and syncs one group; returns each request's result, in order, and the
    /// time recorded with the events written (`None` if none were).
    fn commit_group(&self, group: Vec<Pending>) -> Committed {
        let mut state = lock(&self.state);
        if let Some(reason) = &state.poisoned {
            return refuse_group(group.len(), reason);
        }
        let mut overlay = Overlay::at(state.last_position + 1);
        let decisions = decide_group(
            &group,
            |pending| &pending.request,
            &mut overlay,
            |overlay, pending| self.decide(&state, overlay, pending),
        );
        let accepted_events = (overlay.next_position - state.last_position - 1) as usize;
        if accepted_events == 0 {
            drop(state);
            return (
                decisions.into_iter().map(Decision::into_result).collect(),
                None,
            );
        }

        let recorded_at = (self.options.clock)().0.max(state.last_recorded_at);
        let written = self.write_batch(&mut state, group, &decisions, accepted_events, recorded_at);
        let (batch, last_hash) = match written {
            Ok(written) => written,
            Err(err) => {
                // Nothing reached the engine: the group fails, the log stays usable.
                let reason = err.to_string();
                drop(state);
                let results = decisions
                    .into_iter()
                    .map(|decision| match decision {
                        Decision::Reject(err) => Err(err),
                        _ => Err(Error::InvalidRequest {
                            reason: reason.clone(),
                        }),
                    })
                    .collect();
                return (results, None);
            }
        };
        let first_position = state.last_position + 1;
        let last_position = overlay.next_position - 1;
        drop(state);

        if let Err(err) = self.make_durable(batch, last_position) {
            let reason =
                format!("commit of positions {first_position}..={last_position} failed: {err}");
            tracing::error!(%reason, "the log refuses appends until it is reopened");
            lock(&self.state).poisoned = Some(reason.clone());
            let results = decisions
                .into_iter()
                .map(|decision| match decision {
                    Decision::Reject(err) => Err(err),
                    _ => Err(Error::Unavailable {
                        reason: reason.clone(),
                    }),
                })
                .collect();
            return (results, None);
        }

        // Publish the durable head before the in-memory stream heads: a reader that learns a
        // stream's new revision (`stream_revision`) must be able to read it (`read_stream` stops
        // at the durable head). The other order let a racing reader see revision N and then
        // fail to read it. A reader between the two sees the older revision, which the command
        // path treats as a conflict and decides again.
        self.publish_head(last_position);
        let mut state = lock(&self.state);
        state.last_position = last_position;
        state.last_hash = last_hash;
        state.last_recorded_at = recorded_at;
        for (stream, revision) in overlay.heads {
            state.dirty_heads.insert(stream.clone());
            state.heads.insert(stream, revision);
        }
        for (key, owner) in overlay.claims {
            match owner {
                Some(owner) => state.claims.insert(key, owner),
                None => state.claims.remove(&key),
            };
        }
        let mut ids: Vec<(Uuid, IdLocation)> = overlay.ids.into_iter().collect();
        ids.sort_by_key(|(_, location)| location.position);
        for (id, location) in ids {
            state.recent_ids.insert(id, location);
        }
        drop(state);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.committed_events
            .fetch_add(last_position - first_position + 1, Ordering::Relaxed);
        self.maybe_record_head();
        (
            decisions.into_iter().map(Decision::into_result).collect(),
            Some(recorded_at),
        )
    }

    /// How one request fares against the state plus the group's earlier effects: this
    /// backend's lookups, decided by [`decide_append`] like on every backend.
    fn decide(&self, state: &State, overlay: &Overlay, pending: &Pending) -> Decision {
        let request = &pending.request;
        let locations = match self.locate_ids(state, overlay, pending) {
            Ok(locations) => locations,
            Err(err) => return Decision::Reject(err),
        };
        let stream_revision = || {
            overlay
                .heads
                .get(&request.stream)
                .or_else(|| state.heads.get(&request.stream))
                .copied()
        };
        let holder = |key: &str| {
            Ok(match overlay.claims.get(key) {
                Some(change) => change.clone(),
                None => state.claims.get(key).cloned(),
            })
        };
        decide_append(
            request,
            &locations,
            stream_revision,
            &holder,
            overlay.next_position,
        )
    }

    /// Where each of the request's ids is committed, if anywhere: this group, recent commits, or
    /// the disk lookup made before queueing (repeated here if recent commits no longer cover it).
    fn locate_ids(
        &self,
        state: &State,
        overlay: &Overlay,
        pending: &Pending,
    ) -> Result<Vec<Option<IdLocation>>> {
        // A submitted append's ids were not looked up before queueing: look them up now (the
        // disk holds every earlier commit; this group's are in the overlay).
        let recent_cover =
            pending.known.is_some() && state.recent_ids.covers(pending.checked_through);
        let on_disk = if recent_cover {
            None
        } else {
            Some(self.lookup_ids(&pending.request)?)
        };
        Ok(pending
            .request
            .events
            .iter()
            .enumerate()
            .map(|(index, event)| {
                overlay
                    .ids
                    .get(&event.id)
                    .or_else(|| state.recent_ids.by_id.get(&event.id))
                    .cloned()
                    .or_else(|| match (&on_disk, &pending.known) {
                        (Some(found), _) | (None, Some(found)) => found[index].clone(),
                        (None, None) => None,
                    })
            })
            .collect())
    }

    /// Encodes the accepted requests into one engine batch: the events with their hashes, the
    /// indexes, claims, and (every so often) the stream heads. Returns it with the last hash.
    fn write_batch(
        &self,
        state: &mut State,
        group: Vec<Pending>,
        decisions: &[Decision],
        accepted_events: usize,
        recorded_at: i64,
    ) -> Result<(sled::Batch, [u8; 32])> {
        fail::fail_point!("store::commit::before_write", |_| Err(injected(
            "store::commit::before_write"
        )));
        let first_position = state.last_position + 1;
        let payload_bytes: usize = group
            .iter()
            .zip(decisions)
            .filter(|(_, decision)| matches!(decision, Decision::Accept { .. }))
            .map(|(pending, _)| {
                pending
                    .request
                    .events
                    .iter()
                    .map(|e| e.payload.len() + 256)
                    .sum::<usize>()
            })
            .sum();
        let mut writer = BatchWriter::new(first_position, accepted_events, payload_bytes);
        let mut batch = sled::Batch::default();
        let mut prev_hash = state.last_hash;
        let mut position = first_position;
        let mut touched: HashMap<String, Revision> = HashMap::new();
        for (pending, decision) in group.into_iter().zip(decisions) {
            let Decision::Accept {
                first_revision,
                first_position: request_first,
                claims,
                ..
            } = decision
            else {
                continue;
            };
            debug_assert_eq!(*request_first, position, "accepted requests are contiguous");
            let AppendRequest { stream, events, .. } = pending.request;
            let count = events.len();
            for (offset, proposed) in events.into_iter().enumerate() {
                let revision = first_revision + offset as u64;
                let stored = StoredEvent::recorded(
                    proposed,
                    position,
                    stream.clone(),
                    revision,
                    recorded_at,
                    prev_hash,
                );
                writer.push(&stored)?;
                batch.insert(
                    &keys::id(&stored.id),
                    keys::id_value(position, revision, &stream),
                );
                prev_hash = stored.hash;
                position += 1;
            }
            let entry = StreamEntry {
                first_revision: *first_revision,
                first_position: *request_first,
                count: u32::try_from(count).unwrap_or(u32::MAX),
                batch_position: first_position,
            };
            batch.insert(
                keys::stream_entry(&stream, *first_revision),
                &keys::stream_value(&entry),
            );
            for (key, owner) in claims {
                match owner {
                    Some(owner) => batch.insert(keys::claim(key), owner.as_bytes()),
                    None => batch.remove(keys::claim(key)),
                }
            }
            touched.insert(stream, entry.last_revision());
        }
        let last_position = position - 1;
        batch.insert(&keys::time(Timestamp(recorded_at), last_position), &[]);
        batch.insert(&keys::batch(first_position), writer.finish()?.as_slice());

        state.batches_since_checkpoint += 1;
        if state.batches_since_checkpoint >= self.options.heads_checkpoint_batches {
            for stream in state.dirty_heads.drain().collect::<Vec<_>>() {
                if !touched.contains_key(&stream)
                    && let Some(revision) = state.heads.get(&stream)
                {
                    batch.insert(keys::head(&stream), &revision.to_be_bytes());
                }
            }
            for (stream, revision) in &touched {
                batch.insert(keys::head(stream), &revision.to_be_bytes());
            }
            batch.insert(keys::META_HEADS_AT, &last_position.to_be_bytes());
            state.batches_since_checkpoint = 0;
        }
        Ok((batch, prev_hash))
    }

    /// One `apply_batch`, one `flush`, one `fdatasync` (and new blob files, if sled made any).
    fn make_durable(&self, batch: sled::Batch, last_position: u64) -> Result<()> {
        super::guarded("committing", || {
            fail::fail_point!("store::commit::before_apply", |_| Err(injected(
                "store::commit::before_apply"
            )));
            self.db
                .apply_batch(batch)
                .map_err(engine("applying a batch"))?;
            self.applied.store(last_position, Ordering::Release);
            fail::fail_point!("store::commit::before_flush", |_| Err(injected(
                "store::commit::before_flush"
            )));
            self.db.flush().map_err(engine("flushing"))?;
            fail::fail_point!("store::commit::before_fdatasync", |_| Err(injected(
                "store::commit::before_fdatasync"
            )));
            self.data_file.sync_data().map_err(|source| Error::Io {
                context: "fdatasync of sled's data file",
                source,
            })?;
            lock(&self.blobs).sync().map_err(|source| Error::Io {
                context: "syncing sled's blob files",
                source,
            })?;
            fail::fail_point!("store::commit::before_ack", |_| Err(injected(
                "store::commit::before_ack"
            )));
            Ok(())
        })
    }

    fn publish_head(&self, position: u64) {
        self.durable.publish(position);
    }
}

/// Makes sled's blob files durable. sled writes values larger than a quarter segment to files
/// under `blobs/` without syncing them; a commit that created one syncs it and the directory.
/// The directory's change time tells whether anything is new; a recent one is rechecked every
/// time, since file-system timestamps are coarse.
pub(super) struct BlobSync {
    dir: PathBuf,
    settled: Option<(i64, i64)>,
    synced: HashSet<OsString>,
}

impl BlobSync {
    pub(super) fn new(dir: PathBuf) -> BlobSync {
        BlobSync {
            dir,
            settled: None,
            synced: HashSet::new(),
        }
    }

    pub(super) fn sync(&mut self) -> std::io::Result<()> {
        let meta = match std::fs::metadata(&self.dir) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(err),
        };
        let changed = (meta.ctime(), meta.ctime_nsec());
        if self.settled == Some(changed) {
            return Ok(());
        }
        let mut present = HashSet::new();
        let mut synced_any = false;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if !self.synced.contains(&name) {
                match File::open(entry.path()).and_then(|file| file.sync_all()) {
                    Ok(()) => synced_any = true,
                    // Garbage-collected between listing and opening.
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(err) => return Err(err),
                }
            }
            present.insert(name);
        }
        if synced_any {
            File::open(&self.dir)?.sync_all()?;
        }
        self.synced = present;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        // Trust the change time only once it is clearly in the past.
        self.settled = if now > changed.0 + 1 {
            Some(changed)
        } else {
            None
        };
        Ok(())
    }
}
