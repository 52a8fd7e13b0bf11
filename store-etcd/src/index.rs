//! The log's indexes by event id and by stream, kept in this process's memory instead of in
//! etcd, and kept current by reading the batches other servers commit.
//!
//! etcd's cost is per operation in a transaction (about 20–25 µs per put across three members
//! on a 2-core machine, PERFORMANCE.md), so an index key per event id and per append made every
//! append cost two operations on top of its share of the batch. Every fact those keys held is in the
//! batches already (each event's id, stream, revision and position), and the committer must
//! read every batch anyway before it can decide on a head it did not write (another server's
//! commit). So each [`crate::EtcdLog`] keeps a [`LogIndex`]: complete for every position up to
//! its `head`, built once from the batches at open (in the background) and advanced by the
//! committer's own commits and by reading the batches after its head when the head moved.
//!
//! The argument that makes it correct with several servers: the index is complete at head H, so
//! an id it does not hold is not in the log at H, and a stream's latest revision at H is the one
//! it holds; a transaction decided on it commits only if `head == H` still holds in etcd.
//!
//! It costs memory: 41 bytes per hash-table slot per event (its id, position, revision and
//! stream number; the table is 44–87% full) and 24 bytes per run of a stream's consecutive
//! events within one batch (PERFORMANCE.md: measured per event).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use uuid::Uuid;
use vmplane_store::{Error, Position, Result, Revision};

use crate::codec;
use crate::etcd::Etcd;
use crate::keys::{Head, IdLocation, Keys, StreamEntry, key_after};

/// Batches read per etcd request while catching up.
const CATCH_UP_BATCHES_MAX: i64 = 64;

/// Where one event id is committed; its stream by number (see `LogIndex::names`).
#[derive(Clone, Copy, Debug)]
struct IdSlot {
    position: u64,
    revision: Revision,
    stream: u32,
}

/// The log's ids and streams up to `head`.
#[derive(Debug)]
pub(crate) struct LogIndex {
    head: Head,
    ids: HashMap<Uuid, IdSlot>,
    /// Stream names by number, and numbers by name.
    names: Vec<Arc<str>>,
    numbers: HashMap<Arc<str>, u32>,
    /// Each stream's runs of consecutive revisions at consecutive positions within one batch,
    /// oldest first (so a run's events are read with one batch).
    runs: Vec<Vec<StreamEntry>>,
    /// The first position of the batch being taken (one past the last `advance`).
    batch_first: u64,
}

impl LogIndex {
    /// The index of an empty log.
    pub(crate) fn new() -> LogIndex {
        LogIndex {
            head: Head::EMPTY,
            ids: HashMap::new(),
            names: Vec::new(),
            numbers: HashMap::new(),
            runs: Vec::new(),
            batch_first: 1,
        }
    }

    /// The last position it covers, with that event's hash and time.
    pub(crate) fn head(&self) -> Head {
        self.head
    }

    /// Events indexed.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The heap memory its tables hold (capacity, not length; the allocator's own overhead
    /// aside).
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        // hashbrown: a slot and one control byte per bucket.
        let ids = self.ids.capacity() * (size_of::<(Uuid, IdSlot)>() + 1);
        let numbers = self.numbers.capacity() * (size_of::<(Arc<str>, u32)>() + 1);
        let names: usize = self.names.iter().map(|n| n.len() + 16).sum::<usize>()
            + self.names.capacity() * size_of::<Arc<str>>();
        let runs: usize = self
            .runs
            .iter()
            .map(|r| r.capacity() * size_of::<StreamEntry>())
            .sum::<usize>()
            + self.runs.capacity() * size_of::<Vec<StreamEntry>>();
        ids + numbers + names + runs
    }

    /// Where `id` is committed, if it is (at `head`).
    pub(crate) fn id(&self, id: &Uuid) -> Option<IdLocation> {
        self.ids.get(id).map(|slot| IdLocation {
            position: slot.position,
            revision: slot.revision,
            stream: Arc::clone(&self.names[slot.stream as usize]),
        })
    }

    /// The stream's latest revision (at `head`).
    pub(crate) fn stream_revision(&self, stream: &str) -> Option<Revision> {
        let number = *self.numbers.get(stream)?;
        self.runs[number as usize]
            .last()
            .map(StreamEntry::last_revision)
    }

    /// The stream's runs that hold a revision in `[low, high]`, in revision order.
    pub(crate) fn runs(&self, stream: &str, low: Revision, high: Revision) -> Vec<StreamEntry> {
        let Some(number) = self.numbers.get(stream) else {
            return Vec::new();
        };
        let runs = &self.runs[*number as usize];
        let start = runs.partition_point(|run| run.last_revision() < low);
        runs[start..]
            .iter()
            .take_while(|run| run.first_revision <= high)
            .copied()
            .collect()
    }

    /// The stream's number, given one if it is new.
    fn number(&mut self, stream: &str) -> u32 {
        if let Some(number) = self.numbers.get(stream) {
            return *number;
        }
        let name: Arc<str> = Arc::from(stream);
        // Streams are far fewer than 2^32 (each has at least one event, and positions are u64
        // but memory is not).
        let number = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(Arc::clone(&name));
        self.numbers.insert(name, number);
        self.runs.push(Vec::new());
        number
    }

    /// Takes `count` events appended to `stream` from `first_revision` at `first_position`
    /// (the next position), with their ids in order.
    pub(crate) fn append(
        &mut self,
        stream: &str,
        first_revision: Revision,
        first_position: u64,
        ids: impl IntoIterator<Item = Uuid>,
    ) -> Result<()> {
        let expected = self
            .stream_revision(stream)
            .map_or(1, |revision| revision + 1);
        if first_revision != expected || first_position != self.head.position + 1 {
            return Err(Error::Corrupt {
                position: Position(first_position),
                reason: format!(
                    "{stream}@{first_revision} at {first_position} does not follow the indexed \
                     log (stream at {}, log at {})",
                    expected - 1,
                    self.head.position
                ),
            });
        }
        let number = self.number(stream);
        let mut count = 0u64;
        for (offset, id) in ids.into_iter().enumerate() {
            let offset = offset as u64;
            self.ids.insert(
                id,
                IdSlot {
                    position: first_position + offset,
                    revision: first_revision + offset,
                    stream: number,
                },
            );
            count += 1;
        }
        if count == 0 {
            return Ok(());
        }
        let runs = &mut self.runs[number as usize];
        match runs.last_mut() {
            Some(run)
                if run.first_position >= self.batch_first
                    && run.first_position + run.count == first_position =>
            {
                run.count += count;
            }
            _ => runs.push(StreamEntry {
                first_revision,
                first_position,
                count,
            }),
        }
        self.head.position = first_position + count - 1;
        Ok(())
    }

    /// Records that the appends taken so far end at `head` (its hash and time).
    pub(crate) fn advance(&mut self, head: Head) -> Result<()> {
        if head.position != self.head.position {
            return Err(Error::Corrupt {
                position: Position(head.position),
                reason: format!(
                    "the head is at {} but the batches before it end at {}",
                    head.position, self.head.position
                ),
            });
        }
        self.head = head;
        self.batch_first = head.position + 1;
        Ok(())
    }

    /// Reads the batches after its head up to `to` from etcd and takes them in, checking that
    /// they continue the chain and end exactly at `to`. Each page has `unavailable_after` to
    /// be read.
    pub(crate) async fn catch_up(
        &mut self,
        etcd: &Etcd,
        keys: &Keys,
        to: Head,
        unavailable_after: Duration,
    ) -> Result<()> {
        if to.position < self.head.position {
            return Err(Error::Corrupt {
                position: Position(to.position),
                reason: format!(
                    "the log's head went back from {} to {}",
                    self.head.position, to.position
                ),
            });
        }
        let end = key_after(&keys.log(to.position));
        while self.head.position < to.position {
            let deadline = Instant::now() + unavailable_after;
            let response = etcd
                .range(
                    "reading the log to index it",
                    deadline,
                    keys.log(self.head.position + 1),
                    end.clone(),
                    GetOptions::new().with_limit(CATCH_UP_BATCHES_MAX),
                )
                .await?;
            if response.kvs().is_empty() {
                return Err(Error::Corrupt {
                    position: Position(self.head.position + 1),
                    reason: format!(
                        "the log ends at {} but its head is {}",
                        self.head.position, to.position
                    ),
                });
            }
            for kv in response.kvs() {
                let last = keys.log_position(kv.key()).ok_or_else(|| Error::Corrupt {
                    position: Position(self.head.position + 1),
                    reason: "a malformed key under log/".into(),
                })?;
                let mut head = self.head;
                codec::visit_batch(last, kv.value(), |event| {
                    if *event.prev_hash != head.hash {
                        return Err(Error::Corrupt {
                            position: event.position,
                            reason: "the previous hash does not match the chain".into(),
                        });
                    }
                    self.append(event.stream, event.revision, event.position.0, [event.id])?;
                    head = Head {
                        position: event.position.0,
                        hash: *event.hash,
                        recorded_at: event.recorded_at.0,
                    };
                    Ok(())
                })?;
                self.advance(head)?;
            }
        }
        if self.head != to {
            return Err(Error::Corrupt {
                position: Position(to.position),
                reason: "the head key's hash or time is not the last event's".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_runs_follow_appends_and_consecutive_appends_share_a_run() {
        let mut index = LogIndex::new();
        let (a, b, c, d) = (
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
            Uuid::now_v7(),
        );
        index.append("s", 1, 1, [a, b]).unwrap();
        index.append("s", 3, 3, [c]).unwrap();
        index.append("t", 1, 4, [d]).unwrap();
        assert_eq!(index.len(), 4);
        assert_eq!(index.stream_revision("s"), Some(3));
        assert_eq!(index.stream_revision("t"), Some(1));
        assert_eq!(index.stream_revision("u"), None);
        let at = index.id(&c).unwrap();
        assert_eq!((at.position, at.revision, &*at.stream), (3, 3, "s"));
        assert_eq!(
            index.runs("s", 1, 9).len(),
            1,
            "consecutive appends in one batch merge"
        );
        assert_eq!(index.runs("s", 1, 9)[0].count, 3);
        index.append("s", 4, 5, [Uuid::now_v7()]).unwrap();
        let runs = index.runs("s", 1, 9);
        assert_eq!(
            runs.len(),
            2,
            "an append after another stream's starts a run"
        );
        assert_eq!(index.runs("s", 4, 4), vec![runs[1]]);
        assert_eq!(index.runs("s", 2, 2), vec![runs[0]]);
        assert!(index.runs("s", 5, 9).is_empty());
        index
            .advance(Head {
                position: 5,
                ..Head::EMPTY
            })
            .unwrap();
        index.append("s", 5, 6, [Uuid::now_v7()]).unwrap();
        assert_eq!(
            index.runs("s", 1, 9).len(),
            3,
            "a run never spans two batches"
        );
    }

    #[test]
    fn an_append_that_does_not_follow_is_refused_and_changes_nothing() {
        let mut index = LogIndex::new();
        index.append("s", 1, 1, [Uuid::now_v7()]).unwrap();
        assert!(index.append("s", 3, 2, [Uuid::now_v7()]).is_err());
        assert!(index.append("s", 2, 3, [Uuid::now_v7()]).is_err());
        assert_eq!(index.len(), 1);
        assert_eq!(index.head().position, 1);
        assert!(
            index
                .advance(Head {
                    position: 2,
                    ..Head::EMPTY
                })
                .is_err()
        );
    }
}
