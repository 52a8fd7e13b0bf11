//! The aggregate state cache: per stream, snapshots of its folded state at some revisions, so
//! that loading a stream at any revision folds a bounded number of events.
//!
//! Snapshots are kept at every multiple of [`CacheOptions::snapshot_every_revisions`] that a
//! fold crosses, plus the most recent revision loaded (the current state, for the command path
//! and current reads). Everything here is a cache: it is filled from the log on a miss, nothing
//! is ever only here, and a rebuild never reads it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use vmplane_core::types::Kind;
use vmplane_store::{Direction, EventLog};

use crate::error::{Error, Result};
use crate::model::Snapshot;

/// Bounds of the [`StateCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// A snapshot is kept every this many revisions of a stream (time travel folds at most this
    /// many events after one snapshot).
    pub snapshot_every_revisions: u64,
    /// Streams with cached snapshots; the least recently used are dropped beyond it.
    pub streams_max: usize,
    /// Snapshots kept per stream; the oldest periodic ones are dropped beyond it.
    pub snapshots_per_stream_max: usize,
}

impl Default for CacheOptions {
    fn default() -> CacheOptions {
        CacheOptions {
            snapshot_every_revisions: 32,
            streams_max: 10_000,
            snapshots_per_stream_max: 512,
        }
    }
}

struct CachedStream {
    kind: Kind,
    snapshots: BTreeMap<u64, Arc<Snapshot>>,
    /// The non-periodic snapshot (the latest loaded revision), if any.
    latest: Option<u64>,
    used: u64,
}

struct Inner {
    streams: HashMap<String, CachedStream>,
    tick: u64,
}

/// Cached `(state, revision)` per stream, shared by the read models and the command path.
pub struct StateCache {
    inner: Mutex<Inner>,
    options: CacheOptions,
}

impl std::fmt::Debug for StateCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateCache")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl StateCache {
    /// An empty cache.
    #[must_use]
    pub fn new(options: CacheOptions) -> StateCache {
        StateCache {
            inner: Mutex::new(Inner {
                streams: HashMap::new(),
                tick: 0,
            }),
            options: CacheOptions {
                snapshot_every_revisions: options.snapshot_every_revisions.max(1),
                streams_max: options.streams_max.max(1),
                snapshots_per_stream_max: options.snapshots_per_stream_max.max(2),
            },
        }
    }

    /// Its bounds.
    #[must_use]
    pub fn options(&self) -> CacheOptions {
        self.options
    }

    /// Forgets everything.
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.streams.clear();
    }

    /// Streams with cached snapshots.
    #[must_use]
    pub fn streams(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.streams.len()
    }

    /// The state of `stream` (of `kind`) after exactly `revision` events: from the nearest
    /// snapshot at or below it plus the events in between, read from the log. Fails with
    /// [`Error::NotFound`] if the stream has fewer events.
    pub fn state_at(
        &self,
        log: &dyn EventLog,
        stream: &str,
        kind: Kind,
        revision: u64,
    ) -> Result<Arc<Snapshot>> {
        let base = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            inner.tick += 1;
            let tick = inner.tick;
            match inner.streams.get_mut(stream) {
                Some(cached) if cached.kind == kind => {
                    cached.used = tick;
                    cached
                        .snapshots
                        .range(..=revision)
                        .next_back()
                        .map(|(_, s)| Arc::clone(s))
                }
                _ => None,
            }
        };
        if let Some(base) = &base
            && base.state.revision() == revision
        {
            return Ok(Arc::clone(base));
        }
        let mut snapshot = match base {
            Some(base) => (*base).clone(),
            None => Snapshot::empty(kind),
        };
        let every = self.options.snapshot_every_revisions;
        let mut periodic = Vec::new();
        let read_max = log.limits().read_events_max.max(1);
        while snapshot.state.revision() < revision {
            let from = snapshot.state.revision() + 1;
            let want = usize::try_from(revision - snapshot.state.revision())
                .unwrap_or(usize::MAX)
                .min(read_max);
            let events = log.read_stream(stream, from, Direction::Forward, want)?;
            if events.is_empty() {
                return Err(Error::NotFound {
                    what: format!("{stream} revision {revision}"),
                });
            }
            for event in &events {
                if snapshot.state.revision() >= revision {
                    break;
                }
                snapshot.apply(&event.as_ref())?;
                let r = snapshot.state.revision();
                if r.is_multiple_of(every) && r != revision {
                    periodic.push(Arc::new(snapshot.clone()));
                }
            }
        }
        let result = Arc::new(snapshot);
        self.insert(stream, kind, periodic, Arc::clone(&result));
        Ok(result)
    }

    fn insert(&self, stream: &str, kind: Kind, periodic: Vec<Arc<Snapshot>>, last: Arc<Snapshot>) {
        let every = self.options.snapshot_every_revisions;
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let tick = inner.tick;
        let cached = inner
            .streams
            .entry(stream.to_owned())
            .or_insert_with(|| CachedStream {
                kind,
                snapshots: BTreeMap::new(),
                latest: None,
                used: tick,
            });
        if cached.kind != kind {
            cached.kind = kind;
            cached.snapshots.clear();
            cached.latest = None;
        }
        for s in periodic {
            cached.snapshots.insert(s.state.revision(), s);
        }
        let r = last.state.revision();
        if !r.is_multiple_of(every) {
            // Keep one non-periodic snapshot: the highest revision loaded so far.
            match cached.latest {
                Some(old) if old > r => {}
                old => {
                    if let Some(old) = old {
                        cached.snapshots.remove(&old);
                    }
                    cached.latest = Some(r);
                    cached.snapshots.insert(r, last);
                }
            }
        } else {
            cached.snapshots.insert(r, last);
        }
        while cached.snapshots.len() > self.options.snapshots_per_stream_max {
            let Some((&oldest, _)) = cached.snapshots.iter().next() else {
                break;
            };
            cached.snapshots.remove(&oldest);
            if cached.latest == Some(oldest) {
                cached.latest = None;
            }
        }
        if inner.streams.len() > self.options.streams_max {
            evict(&mut inner.streams, self.options.streams_max);
        }
    }
}

/// Drops the least recently used streams down to 7/8 of `max`, so eviction runs rarely.
fn evict(streams: &mut HashMap<String, CachedStream>, max: usize) {
    let keep = max - max / 8;
    let mut used: Vec<u64> = streams.values().map(|c| c.used).collect();
    used.sort_unstable();
    let drop = streams.len().saturating_sub(keep);
    if drop == 0 {
        return;
    }
    let threshold = used[drop - 1];
    streams.retain(|_, c| c.used > threshold);
}
