//! Batches already read from etcd, kept decoded in memory and bounded by bytes.
//!
//! A batch key `log/<last pos>` is created once, by the transaction that commits it, and never
//! changed afterwards, so a kept batch is never stale: whoever reads a position it holds gets
//! the same events etcd would send. Without it a reader that goes over the same streams again
//! and again (the reconciler's resync folds every VM whose state the projections' bounded
//! cache no longer holds) sends etcd the same reads every time, with the log not moving.
//! Batches are dropped oldest-kept first once the bound is passed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use vmplane_store::RecordedEvent;

/// The bytes kept by default: well above the logs of tens of thousands of VMs, which a server
/// reading them from etcd would otherwise fetch once per resync.
pub const DEFAULT_BATCH_CACHE_BYTES: usize = 256 << 20;

/// Bytes counted for an event besides its variable-length fields.
const EVENT_OVERHEAD_BYTES: usize = 192;

/// One batch: its events, in position order.
pub(crate) type Batch = Arc<Vec<RecordedEvent>>;

pub(crate) struct BatchCache {
    bytes_max: usize,
    inner: Mutex<Inner>,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// By the batch's last position.
    by_last: BTreeMap<u64, (Batch, usize)>,
    /// Last positions, oldest kept first.
    order: VecDeque<u64>,
    bytes: usize,
}

fn cost(events: &[RecordedEvent]) -> usize {
    events
        .iter()
        .map(|e| {
            EVENT_OVERHEAD_BYTES
                + e.payload.len()
                + e.stream.len()
                + e.actor.len()
                + e.event_type.len()
        })
        .sum()
}

impl BatchCache {
    pub(crate) fn new(bytes_max: usize) -> BatchCache {
        BatchCache {
            bytes_max,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The kept batch holding `position`, if any.
    pub(crate) fn holding(&self, position: u64) -> Option<Batch> {
        let found = {
            let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            inner
                .by_last
                .range(position..)
                .next()
                .map(|(_, (batch, _))| Arc::clone(batch))
                .filter(|batch| batch.first().is_some_and(|e| e.position.0 <= position))
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keeps `events`, a whole batch as etcd holds it (position order), and returns it shared.
    pub(crate) fn keep(&self, events: Vec<RecordedEvent>) -> Batch {
        let batch = Arc::new(events);
        let Some(last) = batch.last().map(|e| e.position.0) else {
            return batch;
        };
        let bytes = cost(&batch);
        if bytes > self.bytes_max {
            return batch;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((kept, _)) = inner.by_last.get(&last) {
            return Arc::clone(kept);
        }
        inner.by_last.insert(last, (Arc::clone(&batch), bytes));
        inner.order.push_back(last);
        inner.bytes += bytes;
        while inner.bytes > self.bytes_max {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, freed)) = inner.by_last.remove(&oldest) {
                inner.bytes -= freed;
            }
        }
        batch
    }

    /// Bytes kept now.
    pub(crate) fn bytes(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmplane_store::{Position, Timestamp};

    fn event(position: u64, payload: usize) -> RecordedEvent {
        RecordedEvent {
            position: Position(position),
            stream: "s".into(),
            revision: position,
            id: uuid::Uuid::nil(),
            recorded_at: Timestamp(0),
            actor: String::new(),
            correlation_id: uuid::Uuid::nil(),
            causation_id: None,
            event_type: "t".into(),
            schema_version: 1,
            payload: vec![0; payload],
            prev_hash: [0; 32],
            hash: [0; 32],
        }
    }

    #[test]
    fn a_kept_batch_answers_each_of_its_positions_and_no_other() {
        let cache = BatchCache::new(1 << 20);
        cache.keep(vec![event(3, 1), event(4, 1), event(5, 1)]);
        for p in 3..=5 {
            assert_eq!(cache.holding(p).expect("kept").len(), 3);
        }
        assert!(cache.holding(2).is_none());
        assert!(cache.holding(6).is_none());
    }

    #[test]
    fn the_oldest_batches_go_once_the_bound_is_passed() {
        let one = cost(&[event(1, 1000)]);
        let cache = BatchCache::new(2 * one);
        for p in 1..=3 {
            cache.keep(vec![event(p, 1000)]);
        }
        assert!(cache.holding(1).is_none());
        assert!(cache.holding(2).is_some() && cache.holding(3).is_some());
        assert!(cache.bytes() <= 2 * one);
    }
}
