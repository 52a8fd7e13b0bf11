//! Reads: all of them go to etcd (linearizable by default), since another server may have
//! written. Everything is read from the immutable position-numbered batches, paged, never
//! through etcd's history; reads by stream first read the head, bring the in-memory index up to
//! it, and find the stream's positions there. The batch holding position `p` is the first
//! `log/` key at or after `log/<p>` (keys name a batch's last position).

use std::collections::{HashMap, HashSet};

use etcd_client::GetOptions;
use vmplane_store::hash::{GENESIS_PREV_HASH, event_hash};
use vmplane_store::{
    Direction, Error, PayloadValidator, Position, RecordedEvent, Result, Revision, Timestamp,
    VerifyReport, Visitor,
};

use crate::EtcdLog;
use crate::codec;
use crate::etcd::TXN_OPS_MAX;
use crate::index::LogIndex;
use crate::keys::{Head, StreamEntry, key_after, prefix_end};

/// Events visited per page by scans and verification.
const READ_PAGE_EVENTS_MAX: u64 = 256;
/// Batches fetched per etcd request (each at most about 1.2 MB, usually a few tens of KB).
const READ_PAGE_BATCHES_MAX: i64 = 64;

/// The error for a log whose next event after `expected - 1` is at `found`.
fn gap(expected: u64, found: Position) -> Error {
    Error::Corrupt {
        position: Position(expected),
        reason: format!("gap in the log: the next event is at {found}"),
    }
}

impl EtcdLog {
    /// The head key as etcd has it now.
    pub(crate) async fn read_head(&self) -> Result<Head> {
        match self
            .etcd
            .get("reading the log's head", self.deadline(), self.keys.head())
            .await?
        {
            Some(kv) => Head::decode(kv.value()),
            None => Ok(Head::EMPTY),
        }
    }

    /// Up to `count` events after `after`, in position order, checking they are gapless.
    ///
    /// One round trip per page: the batches whose last position lies in the wanted span, and
    /// (in the same read) the first batch after it, which holds the span's tail when the last
    /// wanted position is not the end of a batch.
    pub(crate) async fn read_range(&self, after: u64, count: u64) -> Result<Vec<RecordedEvent>> {
        let mut events = Vec::new();
        if after == u64::MAX {
            return Ok(events);
        }
        let mut next = after + 1;
        let log_end = prefix_end(&self.keys.log_prefix());
        while (events.len() as u64) < count {
            // A batch read before answers from memory: it cannot have changed.
            if let Some(batch) = self.batches.holding(next) {
                let from = next;
                for event in batch.iter().filter(|e| e.position.0 >= from) {
                    if (events.len() as u64) >= count {
                        break;
                    }
                    if event.position.0 != next {
                        return Err(gap(next, event.position));
                    }
                    events.push(event.clone());
                    next += 1;
                }
                continue;
            }
            let wanted_last = next.saturating_add(count - events.len() as u64 - 1);
            let span_end = key_after(&self.keys.log(wanted_last));
            let reads = vec![
                (
                    self.keys.log(next),
                    Some(
                        GetOptions::new()
                            .with_range(span_end.clone())
                            .with_limit(READ_PAGE_BATCHES_MAX),
                    ),
                ),
                (
                    span_end,
                    Some(GetOptions::new().with_range(log_end.clone()).with_limit(1)),
                ),
            ];
            let mut results = self
                .etcd
                .read_many("reading the log", self.deadline(), reads)
                .await?
                .into_iter();
            let within = results.next().unwrap_or_default();
            let beyond = results.next().unwrap_or_default();
            let page_full = within.len() as i64 >= READ_PAGE_BATCHES_MAX;
            let batches = within.iter().chain(beyond.iter().filter(|_| !page_full));
            let before = events.len();
            'batches: for kv in batches {
                let batch = self.batches.keep(self.decode_batch_at(next, kv)?);
                for event in batch.iter() {
                    if event.position.0 < next {
                        continue;
                    }
                    if (events.len() as u64) >= count {
                        break 'batches;
                    }
                    if event.position.0 != next {
                        return Err(gap(next, event.position));
                    }
                    events.push(event.clone());
                    next += 1;
                }
            }
            if events.len() == before {
                break;
            }
        }
        Ok(events)
    }

    /// The batch stored at `kv`, read while looking for position `wanted`.
    pub(crate) fn decode_batch_at(
        &self,
        wanted: u64,
        kv: &etcd_client::KeyValue,
    ) -> Result<Vec<RecordedEvent>> {
        let last = self
            .keys
            .log_position(kv.key())
            .ok_or_else(|| Error::Corrupt {
                position: Position(wanted),
                reason: format!(
                    "a malformed key under log/ (key {:?}, read while looking for position {wanted}): \
                     something other than this log wrote under its prefix (another installation's \
                     --etcd-prefix nested in this one's?)",
                    String::from_utf8_lossy(kv.key())
                ),
            })?;
        codec::decode_batch(last, kv.value())
    }

    pub(crate) async fn scan_inner(&self, after: u64, visit: Visitor<'_>) -> Result<Position> {
        // First up to the head this process already knows (committed, so readable, and mostly
        // in memory); etcd's head is read only when the visitor wants more than that.
        let mut head = self.shared.head();
        let mut asked_etcd = false;
        let mut visited = after;
        loop {
            while visited < head {
                let page = self
                    .read_range(visited, (head - visited).min(READ_PAGE_EVENTS_MAX))
                    .await?;
                if page.is_empty() {
                    return Err(Error::Corrupt {
                        position: Position(visited + 1),
                        reason: format!("the log ends at {visited} but its head is {head}"),
                    });
                }
                for event in &page {
                    visited = event.position.0;
                    if visit(&event.as_ref()).is_break() {
                        return Ok(Position(visited));
                    }
                }
            }
            if asked_etcd {
                return Ok(Position(visited));
            }
            head = self.read_head().await?.position;
            asked_etcd = true;
        }
    }

    /// The first batch recorded after `at` starts one past the answer; with none, the head is.
    /// Both are read in one transaction, so they agree.
    pub(crate) async fn position_at_inner(&self, at: Timestamp) -> Result<Position> {
        let from = key_after(&self.keys.time(at, u64::MAX));
        let end = prefix_end(&self.keys.time_prefix());
        let reads = vec![
            (
                from,
                Some(
                    GetOptions::new()
                        .with_range(end)
                        .with_limit(1)
                        .with_keys_only(),
                ),
            ),
            (self.keys.head(), None),
        ];
        let mut results = self
            .etcd
            .read_many("reading the time index", self.deadline(), reads)
            .await?
            .into_iter();
        let later = results.next().unwrap_or_default();
        let head = match results.next().unwrap_or_default().first() {
            Some(kv) => Head::decode(kv.value())?,
            None => Head::EMPTY,
        };
        match later.first() {
            None => Ok(Position(head.position)),
            Some(kv) => match self.keys.time_position(kv.key()) {
                Some(first) => Ok(Position(first.saturating_sub(1))),
                None => Err(Error::Damaged {
                    reason: format!(
                        "a malformed time index key {:?}",
                        String::from_utf8_lossy(kv.key())
                    ),
                }),
            },
        }
    }

    /// The index, brought up to the head etcd has now (or later: the committer or another
    /// reader may have moved it further, which a linearizable read allows).
    pub(crate) async fn index_now(&self) -> Result<tokio::sync::MutexGuard<'_, LogIndex>> {
        let head = self.read_head().await?;
        let mut index = self.index.lock().await;
        if index.head().position < head.position {
            index
                .catch_up(&self.etcd, &self.keys, head, self.options.unavailable_after)
                .await?;
        }
        Ok(index)
    }

    pub(crate) async fn stream_revision_inner(&self, stream: &str) -> Result<Option<Revision>> {
        if stream.len() > Self::LIMITS.stream_name_bytes_max {
            return Ok(None);
        }
        Ok(self.index_now().await?.stream_revision(stream))
    }

    pub(crate) async fn claim_holder_inner(&self, key: &str) -> Result<Option<String>> {
        match self
            .etcd
            .get("reading a claim", self.deadline(), self.keys.claim(key))
            .await?
        {
            Some(kv) => String::from_utf8(kv.value().to_vec())
                .map(Some)
                .map_err(|_| Error::Damaged {
                    reason: format!("claim {key} holds non-UTF-8 bytes"),
                }),
            None => Ok(None),
        }
    }

    pub(crate) async fn read_stream_inner(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let max_count = max_count.min(Self::LIMITS.read_events_max) as u64;
        if max_count == 0 || stream.len() > Self::LIMITS.stream_name_bytes_max {
            return Ok(Vec::new());
        }
        // (run, first revision wanted, last revision wanted), in the order they are returned.
        let mut wanted: Vec<(StreamEntry, Revision, Revision)> = Vec::new();
        let mut total = 0u64;
        // Events never change once committed: when the index already holds every revision
        // asked for, the answer is known without asking etcd where its head is now.
        let index = {
            let index = self.index.lock().await;
            let known = index.stream_revision(stream).unwrap_or(0);
            let covered = match direction {
                Direction::Forward => known >= from.max(1).saturating_add(max_count - 1),
                Direction::Backward => from != u64::MAX && from != 0 && known >= from,
            };
            if covered {
                index
            } else {
                drop(index);
                self.index_now().await?
            }
        };
        match direction {
            Direction::Forward => {
                let from = from.max(1);
                let high = from.saturating_add(max_count);
                for entry in index.runs(stream, from, high) {
                    if entry.last_revision() < from {
                        continue;
                    }
                    let first = entry.first_revision.max(from);
                    let last = entry.last_revision().min(first + (max_count - total) - 1);
                    wanted.push((entry, first, last));
                    total += last - first + 1;
                    if total >= max_count {
                        break;
                    }
                }
            }
            Direction::Backward => {
                if from == 0 {
                    return Ok(Vec::new());
                }
                let from = if from == u64::MAX {
                    match index.stream_revision(stream) {
                        Some(revision) => revision,
                        None => return Ok(Vec::new()),
                    }
                } else {
                    from
                };
                let low = from.saturating_sub(max_count).max(1);
                for entry in index.runs(stream, low, from).into_iter().rev() {
                    let last = entry.last_revision().min(from);
                    let first = entry
                        .first_revision
                        .max((last + 1).saturating_sub(max_count - total));
                    wanted.push((entry, first, last));
                    total += last - first + 1;
                    if total >= max_count {
                        break;
                    }
                }
            }
        }
        drop(index);
        let mut events = Vec::with_capacity(total as usize);
        // A run's events are all in one batch: the one holding its first position. Batches
        // read before come from memory; the others from etcd, up to TXN_OPS_MAX per request.
        let mut batches: Vec<Option<crate::batches::Batch>> = wanted
            .iter()
            .map(|(entry, first, _)| self.batches.holding(entry.position_of(*first).0))
            .collect();
        let missing: Vec<usize> = (0..wanted.len())
            .filter(|i| batches[*i].is_none())
            .collect();
        let log_end = prefix_end(&self.keys.log_prefix());
        for chunk in missing.chunks(TXN_OPS_MAX) {
            let reads = chunk
                .iter()
                .map(|i| {
                    let (entry, first, _) = &wanted[*i];
                    (
                        self.keys.log(entry.position_of(*first).0),
                        Some(GetOptions::new().with_range(log_end.clone()).with_limit(1)),
                    )
                })
                .collect();
            let results = self
                .etcd
                .read_many("reading a stream", self.deadline(), reads)
                .await?;
            for (i, kvs) in chunk.iter().zip(results) {
                let (entry, first, _) = &wanted[*i];
                let batch = match kvs.first() {
                    Some(kv) => self
                        .batches
                        .keep(self.decode_batch_at(entry.position_of(*first).0, kv)?),
                    None => std::sync::Arc::new(Vec::new()),
                };
                batches[*i] = Some(batch);
            }
        }
        for ((entry, first, last), batch) in wanted.iter().zip(batches) {
            let from = entry.position_of(*first);
            let mut found: Vec<RecordedEvent> = batch
                .iter()
                .flat_map(|b| b.iter())
                .filter(|e| e.position >= from && e.position <= entry.position_of(*last))
                .cloned()
                .collect();
            for (offset, revision) in (*first..=*last).enumerate() {
                let position = entry.position_of(revision);
                let event = found.get(offset).filter(|e| {
                    e.position == position && e.stream == stream && e.revision == revision
                });
                if event.is_none() {
                    return Err(Error::Corrupt {
                        position,
                        reason: format!(
                            "the stream index puts {stream}@{revision} here, the log disagrees"
                        ),
                    });
                }
            }
            match direction {
                Direction::Forward => events.append(&mut found),
                Direction::Backward => events.extend(found.into_iter().rev()),
            }
        }
        Ok(events)
    }

    pub(crate) async fn verify_inner(
        &self,
        validate_payload: PayloadValidator<'_>,
    ) -> Result<VerifyReport> {
        let head = self.read_head().await?;
        let mut prev_hash = GENESIS_PREV_HASH;
        let mut last_recorded_at = i64::MIN;
        let mut revisions: HashMap<String, Revision> = HashMap::new();
        let mut ids: HashSet<uuid::Uuid> = HashSet::new();
        let mut checked = 0u64;
        while checked < head.position {
            let page = self
                .read_range(checked, (head.position - checked).min(READ_PAGE_EVENTS_MAX))
                .await?;
            if page.is_empty() {
                break;
            }
            for event in &page {
                let position = event.position;
                let corrupt = |reason: String| Error::Corrupt { position, reason };
                if event.prev_hash != prev_hash {
                    return Err(corrupt("the previous hash does not match the chain".into()));
                }
                if event_hash(&event.as_ref()) != event.hash {
                    return Err(corrupt(
                        "the event's hash does not match its content".into(),
                    ));
                }
                let revision = revisions.entry(event.stream.clone()).or_insert(0);
                if event.revision != *revision + 1 {
                    return Err(corrupt(format!(
                        "stream {} jumps from revision {} to {}",
                        event.stream, revision, event.revision
                    )));
                }
                *revision = event.revision;
                if event.recorded_at.0 < last_recorded_at {
                    return Err(corrupt("recorded_at goes backwards".into()));
                }
                last_recorded_at = event.recorded_at.0;
                if !ids.insert(event.id) {
                    return Err(corrupt(format!(
                        "event id {} is in the log twice",
                        event.id
                    )));
                }
                validate_payload(&event.event_type, event.schema_version, &event.payload).map_err(
                    |reason| {
                        corrupt(format!(
                            "payload of {} v{} does not decode: {reason}",
                            event.event_type, event.schema_version
                        ))
                    },
                )?;
                prev_hash = event.hash;
                checked = position.0;
            }
        }
        if checked != head.position {
            return Err(Error::Corrupt {
                position: Position(checked + 1),
                reason: format!(
                    "the log ends at {checked} but its head is {}",
                    head.position
                ),
            });
        }
        if prev_hash != head.hash {
            return Err(Error::Corrupt {
                position: Position(checked),
                reason: "the head key's hash is not the last event's".into(),
            });
        }
        let beyond = self.read_range(head.position, 1).await?;
        if let Some(event) = beyond.first() {
            // An event and the head that covers it are written in one transaction, so an event
            // past the head read first is either a commit made since (the head has moved: the
            // log is live, or an append whose answer was lost landed late) or damage.
            let now = self.read_head().await?;
            if now.position < event.position.0 {
                return Err(Error::Corrupt {
                    position: event.position,
                    reason: format!("an event lies past the head {}", now.position),
                });
            }
        }
        Ok(VerifyReport {
            events: head.position,
            head_hash: head.hash,
        })
    }
}
