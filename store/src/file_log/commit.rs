//! The committer thread: takes what has queued, decides each request, writes one record, syncs,
//! updates the indexes and answers every appender.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use rkyv::util::AlignedVec;

use super::record::{self, ClaimChange, FRAME_BYTES};
use super::{Index, Inner, RecordAt, lock, write};
use crate::batch::{BatchView, BatchWriter, StoredEvent};
use crate::error::{Error, Result};
// Fail points inject it only with the `failpoints` feature.
#[cfg_attr(not(feature = "failpoints"), allow(unused_imports))]
use crate::group::injected;
use crate::group::{
    Committed, Slot, commit_and_answer, company, decide_group, refuse_group, take_group,
};
// How one request was decided: the same outcomes on every backend.
use crate::log::AppendDecision as Decision;
use crate::log::{IdLocation, Overlay, decide_append};
use crate::types::{AppendRequest, AppendResult};

/// Zeros the committer keeps written ahead of the records. An `fdatasync` of a commit that
/// grows the file also commits the file system's journal (the new length); one that overwrites
/// bytes the file has does not. Here (ext4, 4 KiB records): 8 KiB written and synced took
/// 192 µs at the median into a growing file and 138 µs into zeros written before. Larger room
/// costs its one growing commit more: with 4 KiB commits, the 99th percentile of a commit was
/// 317 µs with no room, 246 µs with 64 KiB and 712 µs with 1 MiB.
pub(super) const ROOM_BYTES: u64 = 64 << 10;

/// One queued append.
pub(super) struct Pending {
    pub request: AppendRequest,
    pub slot: Arc<Slot>,
}

impl Inner {
    /// The committer thread's loop: until the log is dropped, and then until the queue is empty.
    pub(super) fn run_committer(&self) {
        // Appends in the last group: with company, the next group waits a little for more.
        let mut last_group = 0;
        loop {
            let open = self.bell.wait();
            loop {
                self.wait_for_company(last_group);
                let group = self.take_group();
                if group.is_empty() {
                    break;
                }
                last_group = group.len();
                self.commit(group);
            }
            if !open {
                return;
            }
        }
    }

    /// Lingers before the next group when [`company`] says to: until as many appends are queued
    /// as it names (the appender that brings the queue there rings [`Inner::company`]), or
    /// [`FileOptions::group_commit_linger`](super::FileOptions) has passed.
    fn wait_for_company(&self, last_group: usize) {
        let linger = self.options.group_commit_linger;
        let mut queue = lock(&self.queue);
        if queue.closed {
            return;
        }
        let Some(awaited) = company(last_group, queue.pending.len(), linger) else {
            return;
        };
        queue.awaited = awaited;
        // Until the appender that brings the company (or the log's closing) sets it back.
        let (mut queue, _) = self
            .company
            .wait_timeout_while(queue, linger, |queue| queue.awaited != 0)
            .unwrap_or_else(PoisonError::into_inner);
        queue.awaited = 0;
    }

    /// The front of the queue, bounded by events and payload bytes.
    fn take_group(&self) -> Vec<Pending> {
        take_group(
            &mut lock(&self.queue).pending,
            |pending| &pending.request,
            self.options.group_commit_events_max,
            self.options.group_commit_bytes_max,
        )
    }

    fn commit(&self, group: Vec<Pending>) {
        let slots: Vec<Arc<Slot>> = group.iter().map(|p| Arc::clone(&p.slot)).collect();
        commit_and_answer(
            &slots,
            || self.commit_group(group),
            |reason| self.poison(reason),
        );
        // After the answers: a commit's appenders never wait for it.
        self.keep_room();
    }

    /// Writes [`ROOM_BYTES`] of zeros after the file's end when less than half of that is left
    /// ahead of the last record. Not synced: the next commit's `fdatasync` writes the zeros and
    /// the new length with its record (one journal commit per `ROOM_BYTES`); the commits
    /// after it overwrite zeros the file already has. A crash before that leaves zeros, or
    /// nothing, after the last record: room either way. A failed write (a full disk) changes
    /// nothing a record depends on; the next commit grows the file as it writes.
    fn keep_room(&self) {
        if self.poisoned.get().is_some() {
            return;
        }
        let end = self.index().end_offset;
        let room_end = self.room_end.load(Ordering::Relaxed).max(end);
        if room_end - end >= ROOM_BYTES / 2 {
            return;
        }
        static ZEROS: [u8; ROOM_BYTES as usize] = [0; ROOM_BYTES as usize];
        match self.file.write_all_at(&ZEROS, room_end) {
            Ok(()) => self
                .room_end
                .store(room_end + ROOM_BYTES, Ordering::Relaxed),
            Err(error) => {
                tracing::debug!(%error, "no room written ahead of the log's records");
                let len = self.file.metadata().map_or(room_end, |m| m.len());
                self.room_end.store(len, Ordering::Relaxed);
            }
        }
    }

    /// Decides, writes and syncs one group; returns each request's result, in order, and the
    /// time recorded with the events written (`None` if none were).
    fn commit_group(&self, group: Vec<Pending>) -> Committed {
        // Only this thread changes the index, so what is decided on here stays true until the
        // write below is published.
        let (decisions, accepted, first_position, prev_hash, recorded_at) = {
            if let Some(reason) = self.poisoned.get() {
                return refuse_group(group.len(), reason);
            }
            let index = self.index();
            let mut overlay = Overlay::at(index.last_position + 1);
            let decisions = decide_group(
                &group,
                |pending| &pending.request,
                &mut overlay,
                |overlay, pending| decide(&index, overlay, &pending.request),
            );
            let accepted = overlay.next_position - index.last_position - 1;
            let recorded_at = (self.options.clock)().0.max(index.last_recorded_at);
            (
                decisions,
                accepted,
                index.last_position + 1,
                index.last_hash,
                recorded_at,
            )
        };
        if accepted == 0 {
            return (
                decisions.into_iter().map(Decision::into_result).collect(),
                None,
            );
        }
        let body = match encode(group, &decisions, first_position, prev_hash, recorded_at) {
            Ok(body) => body,
            Err(err) => {
                // Nothing reached the file: the group fails, the log stays usable.
                let reason = err.to_string();
                return (
                    refuse(decisions, |_| Error::InvalidRequest {
                        reason: reason.clone(),
                    }),
                    None,
                );
            }
        };
        let last_position = first_position + accepted - 1;
        match self.write_record(&body, first_position, last_position, recorded_at, true) {
            Ok(()) => {}
            Err(err) => {
                let reason =
                    format!("commit of positions {first_position}..={last_position} failed: {err}");
                tracing::error!(%reason, "the log refuses appends until it is reopened");
                self.poison(reason.clone());
                return (
                    refuse(decisions, |_| Error::Unavailable {
                        reason: reason.clone(),
                    }),
                    None,
                );
            }
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        (
            decisions.into_iter().map(Decision::into_result).collect(),
            Some(recorded_at),
        )
    }

    /// Writes the record at the end of the file, syncs it (when `sync`: an import syncs once at
    /// its end), then adds it to the indexes and publishes the new head.
    pub(super) fn write_record(
        &self,
        encoded: &(Vec<u8>, Vec<ClaimChange>),
        first_position: u64,
        last_position: u64,
        recorded_at: i64,
        sync: bool,
    ) -> Result<()> {
        let (bytes, claims) = encoded;
        let offset = self.index().end_offset;
        fail::fail_point!("store::file::before_write", |_| Err(injected(
            "store::file::before_write"
        )));
        self.file
            .write_all_at(bytes, offset)
            .map_err(|source| Error::Io {
                context: "writing a record to the log file",
                source,
            })?;
        fail::fail_point!("store::file::before_fdatasync", |_| Err(injected(
            "store::file::before_fdatasync"
        )));
        if sync {
            self.sync()?;
        }
        let record = RecordAt {
            first_position,
            last_position,
            offset,
            body_len: (bytes.len() - FRAME_BYTES) as u32,
            recorded_at,
        };
        let mut body = AlignedVec::<16>::with_capacity(bytes.len() - FRAME_BYTES);
        body.extend_from_slice(&bytes[FRAME_BYTES..]);
        let body = Arc::new(body);
        {
            let mut index = write(&self.index);
            let view = record::view(&body, &record)?;
            index.add_record(record, &view, claims)?;
            index.remember(
                first_position,
                Arc::clone(&body),
                self.options.recent_records_bytes_max,
            );
            fail::fail_point!("store::file::before_publish");
            // Under the index's lock: a reader that sees the new indexes sees the new head.
            self.durable.publish(last_position);
            // After the head: a reader that learns a stream's new revision can read it at once
            // (`read_stream` stops at the head). The other order let a racing command see
            // revision N, then fail to read it. A reader between the two sees the older
            // revision, which a command takes for a conflict and decides again.
            for event in (0..view.len()).filter_map(|i| view.event(i).ok()) {
                if let Some((stream, _)) = index.streams.get_key_value(event.stream) {
                    self.tips.set(stream, event.revision);
                }
            }
        }
        if sync {
            self.head_record
                .refresh(|| Some((last_position, self.index().last_hash)));
        }
        Ok(())
    }
}

impl Inner {
    /// Refuses appends from now on until the log is reopened, for `reason` (the first
    /// failure's is kept: what came after may follow from it).
    fn poison(&self, reason: String) {
        let _ = self.poisoned.set(reason);
    }

    /// `fdatasync` of the log file.
    pub(super) fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|source| Error::Io {
            context: "fdatasync of the log file",
            source,
        })
    }
}

/// How one request fares against the indexes plus the group's earlier effects.
fn decide(index: &Index, overlay: &Overlay, request: &AppendRequest) -> Decision {
    let locations: Vec<Option<IdLocation>> = request
        .events
        .iter()
        .map(|event| {
            overlay
                .ids
                .get(&event.id)
                .or_else(|| index.ids.get(&event.id))
                .cloned()
        })
        .collect();
    let stream_revision = || {
        overlay.heads.get(&request.stream).copied().or_else(|| {
            index
                .streams
                .get(request.stream.as_str())
                .and_then(|runs| runs.last())
                .map(|run| run.last_revision())
        })
    };
    let holder = |key: &str| {
        Ok(match overlay.claims.get(key) {
            Some(change) => change.clone(),
            None => index.claims.get(key).cloned(),
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

/// The record of the accepted requests: their events with their hashes, and their claim
/// changes in the order decided.
fn encode(
    group: Vec<Pending>,
    decisions: &[Decision],
    first_position: u64,
    mut prev_hash: [u8; 32],
    recorded_at: i64,
) -> Result<(Vec<u8>, Vec<ClaimChange>)> {
    let accepted: Vec<(AppendRequest, &Decision)> = group
        .into_iter()
        .zip(decisions)
        .filter(|(_, decision)| matches!(decision, Decision::Accept { .. }))
        .map(|(pending, decision)| (pending.request, decision))
        .collect();
    let count: usize = accepted.iter().map(|(r, _)| r.events.len()).sum();
    let bytes_hint: usize = accepted
        .iter()
        .flat_map(|(r, _)| r.events.iter())
        .map(|e| e.payload.len() + 256)
        .sum();
    let mut writer = BatchWriter::new(first_position, count, bytes_hint);
    let mut changes = Vec::new();
    let mut position = first_position;
    for (request, decision) in accepted {
        let Decision::Accept {
            first_revision,
            claims,
            ..
        } = decision
        else {
            continue;
        };
        let AppendRequest { stream, events, .. } = request;
        for (offset, proposed) in events.into_iter().enumerate() {
            let stored = StoredEvent::recorded(
                proposed,
                position,
                stream.clone(),
                first_revision + offset as u64,
                recorded_at,
                prev_hash,
            );
            writer.push(&stored)?;
            prev_hash = stored.hash;
            position += 1;
        }
        changes.extend(claims.iter().map(|(key, owner)| ClaimChange {
            key: key.clone(),
            owner: owner.clone(),
        }));
    }
    let batch = writer.finish()?;
    // A batch that does not read back is never written.
    BatchView::new(&batch, first_position)?;
    Ok((record::encode(&changes, &batch), changes))
}

/// Every accepted decision failed with `error`; rejections keep their own error.
fn refuse(
    decisions: Vec<Decision>,
    error: impl Fn(&Decision) -> Error,
) -> Vec<Result<AppendResult>> {
    decisions
        .into_iter()
        .map(|decision| match decision {
            Decision::Reject(err) => Err(err),
            other => Err(error(&other)),
        })
        .collect()
}
