//! The aggregate state cache: per stream, snapshots of its folded state at some revisions, so
//! that loading a stream at any revision folds a bounded number of events.
//!
//! Snapshots are kept at every multiple of [`CacheOptions::snapshot_every_revisions`] that a
//! fold crosses, plus the most recent revision loaded (the current state, for the command path
//! and current reads). Everything here is a cache: it is filled from the log on a miss, nothing
//! is ever only here, and a rebuild never reads it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use std::ops::ControlFlow;
use vmplane_core::types::Kind;

use vmplane_store::{Direction, EventLog, Position};

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
            snapshot_every_revisions: 8,
            streams_max: 4_096,
            snapshots_per_stream_max: 2048,
        }
    }
}

struct CachedStream {
    /// The stream's name, shared with the map's key and the use queue's entries.
    key: Arc<str>,
    kind: Kind,
    snapshots: BTreeMap<u64, Arc<Snapshot>>,
    /// The non-periodic snapshot (the latest loaded revision), if any.
    latest: Option<u64>,
    used: u64,
}

struct Inner {
    streams: HashMap<Arc<str>, CachedStream, foldhash::fast::RandomState>,
    tick: u64,
    /// Every use of a stream, oldest first: `(tick, stream)`. An entry is current while the
    /// stream's `used` is still its tick; a later use leaves it stale. Eviction pops from the
    /// front (the least recently used first) instead of going over every cached stream.
    uses: VecDeque<(u64, Arc<str>)>,
}

impl Inner {
    /// Marks `cached` as used now: a new tick, and an entry in the use queue.
    fn touch(tick: u64, cached: &mut CachedStream, uses: &mut VecDeque<(u64, Arc<str>)>) {
        cached.used = tick;
        uses.push_back((tick, Arc::clone(&cached.key)));
    }

    /// Drops the stale entries once they outnumber the current ones (one per stream): the
    /// queue stays within about twice the streams cached, at an amortized constant cost per
    /// use.
    fn compact_uses(&mut self) {
        if self.uses.len() <= 2 * self.streams.len() + USES_SLACK {
            return;
        }
        let streams = &self.streams;
        self.uses
            .retain(|(tick, key)| streams.get(key).is_some_and(|c| c.used == *tick));
    }
}

/// Use queue entries allowed beyond twice the streams cached before stale ones are dropped.
const USES_SLACK: usize = 64;

/// Cached `(state, revision)` per stream, shared by the read models and the command path.
pub struct StateCache {
    inner: Mutex<Inner>,
    /// Streams evicted and not freed yet: freeing a folded state is hundreds of deallocations,
    /// and the thread that evicts is usually answering a write (each new stream's put evicts
    /// once the cache is full), so [`StateCache::reap`] frees them later on a thread of its
    /// own. Bounded: past [`StateCache::evicted_max`], an eviction frees its streams itself.
    evicted: Mutex<Vec<CachedStream>>,
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
                streams: HashMap::default(),
                tick: 0,
                uses: VecDeque::new(),
            }),
            evicted: Mutex::new(Vec::new()),
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
        inner.uses.clear();
        drop(inner);
        self.reap();
    }

    /// Frees the streams evicted since the last call (see [`StateCache::put`]); returns how
    /// many.
    pub fn reap(&self) -> usize {
        self.take_evicted().len()
    }

    /// The streams evicted since the last call, freed when the result is dropped: the lock is
    /// held only to take them, so the thread that frees them need not be the one that takes
    /// them (the projection follower takes them, its idle-priority gate frees them).
    pub(crate) fn take_evicted(&self) -> Evicted {
        Evicted(std::mem::take(
            &mut *self.evicted.lock().unwrap_or_else(PoisonError::into_inner),
        ))
    }

    /// Evicted streams kept for [`StateCache::reap`] at most: a quarter of the cache, many
    /// evictions' worth (each drops 1/[`EVICT_FRACTION`] of it), so memory stays bounded when
    /// nothing reaps.
    fn evicted_max(&self) -> usize {
        self.options.streams_max / 4
    }

    /// Streams with cached snapshots.
    #[must_use]
    pub fn streams(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.streams.len()
    }

    /// The state of `stream` (of `kind`) after exactly `revision` events: from the nearest
    /// snapshot at or below it plus the events in between, read from the log. Fails with
    /// [`Error::RevisionNotFound`] if the stream has fewer events.
    pub fn state_at(
        &self,
        log: &dyn EventLog,
        stream: &str,
        kind: Kind,
        revision: u64,
    ) -> Result<Arc<Snapshot>> {
        self.state_at_located(log, stream, kind, revision, None)
    }

    /// [`StateCache::state_at`], given where the stream's revisions are in the log
    /// (`locate(r)`: the position of revision `r`, as the read model records them). When the
    /// events to fold sit close together in the log, they are visited in place with the log's
    /// zero-copy scan of that position range instead of being read one by one through the
    /// stream index; every event is still checked (stream, next revision) as it is folded.
    pub fn state_at_located(
        &self,
        log: &dyn EventLog,
        stream: &str,
        kind: Kind,
        revision: u64,
        locate: Option<&dyn Fn(u64) -> Option<Position>>,
    ) -> Result<Arc<Snapshot>> {
        self.fold(log, stream, kind, revision, locate, Admit::Always)
    }

    /// [`StateCache::state_at_located`] for a read passing over many streams (a long list):
    /// what it folds is kept only for streams the cache already holds, so one pass over more
    /// streams than the cache holds neither pays for filling it nor drops the streams in use.
    pub fn state_at_passing(
        &self,
        log: &dyn EventLog,
        stream: &str,
        kind: Kind,
        revision: u64,
        locate: Option<&dyn Fn(u64) -> Option<Position>>,
    ) -> Result<Arc<Snapshot>> {
        self.fold(log, stream, kind, revision, locate, Admit::IfCached)
    }

    fn fold(
        &self,
        log: &dyn EventLog,
        stream: &str,
        kind: Kind,
        revision: u64,
        locate: Option<&dyn Fn(u64) -> Option<Position>>,
        admit: Admit,
    ) -> Result<Arc<Snapshot>> {
        let base = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            inner.tick += 1;
            let tick = inner.tick;
            let Inner { streams, uses, .. } = &mut *inner;
            let base = match streams.get_mut(stream) {
                Some(cached) if cached.kind == kind => {
                    Inner::touch(tick, cached, uses);
                    cached
                        .snapshots
                        .range(..=revision)
                        .next_back()
                        .map(|(_, s)| Arc::clone(s))
                }
                _ => None,
            };
            inner.compact_uses();
            base
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
        let mut kept = Kept {
            every: self.options.snapshot_every_revisions,
            revision,
            snapshots: Vec::new(),
            changed: None,
        };
        let read_max = log.limits().read_events_max.max(1);
        if let Some(locate) = locate {
            fold_dense_range(log, stream, revision, locate, &mut snapshot, &mut kept)?;
        }
        while snapshot.state.revision() < revision {
            let from = snapshot.state.revision() + 1;
            let want = usize::try_from(revision - snapshot.state.revision())
                .unwrap_or(usize::MAX)
                .min(read_max);
            let events = log.read_stream(stream, from, Direction::Forward, want)?;
            if events.is_empty() {
                return Err(Error::RevisionNotFound {
                    stream: stream.to_string(),
                    revision,
                });
            }
            for event in &events {
                if snapshot.state.revision() >= revision {
                    break;
                }
                let object = snapshot.object_id();
                snapshot.apply(&event.as_ref())?;
                kept.folded(&snapshot, object);
            }
        }
        let result = Arc::new(snapshot);
        let periodic = kept.finish();
        self.insert(stream, kind, periodic, Arc::clone(&result), admit);
        Ok(result)
    }

    /// The state of `stream` (of `kind`) after exactly `revision` events if the cache holds it
    /// (nothing is read from the log).
    #[must_use]
    pub fn cached(&self, stream: &str, kind: Kind, revision: u64) -> Option<Arc<Snapshot>> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.tick += 1;
        let tick = inner.tick;
        let Inner { streams, uses, .. } = &mut *inner;
        let cached = streams.get_mut(stream)?;
        if cached.kind != kind {
            return None;
        }
        let snapshot = cached
            .snapshots
            .get(&revision)
            .filter(|s| s.state.revision() == revision)
            .map(Arc::clone)?;
        Inner::touch(tick, cached, uses);
        inner.compact_uses();
        Some(snapshot)
    }

    /// Keeps `snapshot` as `stream`'s state at its revision (the command path hands over the
    /// state it just wrote, folded from the log's own records of the write). Streams evicted
    /// to make room are freed by the next [`StateCache::reap`], not by this call, unless too
    /// many wait for it already.
    pub fn put(&self, stream: &str, kind: Kind, snapshot: Arc<Snapshot>) {
        self.insert(stream, kind, Vec::new(), snapshot, Admit::Always);
    }

    fn insert(
        &self,
        stream: &str,
        kind: Kind,
        periodic: Vec<Arc<Snapshot>>,
        last: Arc<Snapshot>,
        admit: Admit,
    ) {
        let every = self.options.snapshot_every_revisions;
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        // A put is a use: without its own tick, streams only ever put (each create's) would
        // share one, and eviction, which drops every stream used at or before its threshold,
        // would drop them all at once.
        inner.tick += 1;
        let tick = inner.tick;
        // Looked up first: the stream is usually cached already, and `entry` takes an owned key.
        if !inner.streams.contains_key(stream) {
            if admit == Admit::IfCached {
                return;
            }
            let key: Arc<str> = Arc::from(stream);
            inner.streams.insert(
                Arc::clone(&key),
                CachedStream {
                    key,
                    kind,
                    snapshots: BTreeMap::new(),
                    latest: None,
                    used: tick,
                },
            );
        }
        let Inner { streams, uses, .. } = &mut *inner;
        let Some(cached) = streams.get_mut(stream) else {
            return;
        };
        Inner::touch(tick, cached, uses);
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
        inner.compact_uses();
        if inner.streams.len() > self.options.streams_max {
            let mut dropped = evict(&mut inner, self.options.streams_max);
            // Never freed under the lock: dropping hundreds of folded states is not work the
            // other readers should wait for. Left to `reap` while it keeps up.
            drop(inner);
            let mut evicted = self.evicted.lock().unwrap_or_else(PoisonError::into_inner);
            if evicted.len() + dropped.len() <= self.evicted_max() {
                evicted.append(&mut dropped);
            }
            drop(evicted);
            drop(dropped);
        }
    }
}

/// Streams taken from the cache by [`StateCache::take_evicted`], freed when this is dropped.
pub(crate) struct Evicted(Vec<CachedStream>);

impl Evicted {
    /// Streams held.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Whether a fold's result may add a stream to the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admit {
    Always,
    /// Only refresh a stream already cached.
    IfCached,
}

/// Positions visited per event to fold, at most, for the scan of a position range to be used
/// (plus [`DENSE_SLACK`]): beyond it the stream's events are too spread out and are read
/// through the stream index instead.
const DENSE_FACTOR: u64 = 4;
/// Positions a dense range may hold beyond [`DENSE_FACTOR`] per folded event.
const DENSE_SLACK: u64 = 64;

/// Folds the events after `snapshot` up to `revision` by scanning the log's positions between
/// them, if they are dense enough (see [`DENSE_FACTOR`]); otherwise, or if the range ends
/// before `revision`, leaves the rest to the caller's reads by stream.
fn fold_dense_range(
    log: &dyn EventLog,
    stream: &str,
    revision: u64,
    locate: &dyn Fn(u64) -> Option<Position>,
    snapshot: &mut Snapshot,
    kept: &mut Kept,
) -> Result<()> {
    let from = snapshot.state.revision() + 1;
    if from > revision {
        return Ok(());
    }
    let (Some(first), Some(last)) = (locate(from), locate(revision)) else {
        return Ok(());
    };
    if first.0 == 0 || last < first {
        return Ok(());
    }
    let span = last.0 - first.0 + 1;
    if span > (revision - from + 1).saturating_mul(DENSE_FACTOR) + DENSE_SLACK {
        return Ok(());
    }
    let mut failure = None;
    log.scan(Position(first.0 - 1), &mut |event| {
        if event.position > last {
            return ControlFlow::Break(());
        }
        if event.stream != stream {
            return ControlFlow::Continue(());
        }
        let object = snapshot.object_id();
        if let Err(e) = snapshot.apply(event) {
            failure = Some(e);
            return ControlFlow::Break(());
        }
        kept.folded(snapshot, object);
        if snapshot.state.revision() >= revision {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    })?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The snapshots a fold leaves in the cache besides its result: one at every multiple of
/// `every`, and, within each such window, one just after the last change of the stored object
/// (a VM's serialized object and text template are shared by the states folded from a
/// snapshot: without it, every read between an edit and the window's end would fold from
/// before the edit and serialize the object again). At most two per window.
struct Kept {
    every: u64,
    /// The fold's target (cached as its result, not here).
    revision: u64,
    snapshots: Vec<Arc<Snapshot>>,
    /// The state just after the last object change since the last multiple of `every`.
    changed: Option<Snapshot>,
}

impl Kept {
    /// After folding one event into `snapshot`, whose object identity before it was `object`.
    fn folded(&mut self, snapshot: &Snapshot, object: usize) {
        let r = snapshot.state.revision();
        if r >= self.revision {
            return;
        }
        if r.is_multiple_of(self.every) {
            self.snapshots.extend(self.changed.take().map(Arc::new));
            self.snapshots.push(Arc::new(snapshot.clone()));
        } else if snapshot.object_id() != object {
            self.changed = Some(snapshot.clone());
        }
    }

    fn finish(mut self) -> Vec<Arc<Snapshot>> {
        self.snapshots.extend(self.changed.take().map(Arc::new));
        self.snapshots
    }
}

/// Streams dropped per eviction past the bound, at least: 1/64 of it, so that what one
/// eviction frees at once stays small (freeing a few thousand folded states in one go stalled
/// a request by ~20 ms).
const EVICT_FRACTION: usize = 64;

/// Drops the least recently used streams down to `max - max / 64`: the streams of the use
/// queue's current entries, from its front (stale entries are skipped and dropped).
fn evict(inner: &mut Inner, max: usize) -> Vec<CachedStream> {
    let keep = max - max / EVICT_FRACTION;
    let mut dropped = Vec::with_capacity(inner.streams.len().saturating_sub(keep));
    while inner.streams.len() > keep {
        let Some((tick, key)) = inner.uses.pop_front() else {
            break;
        };
        if inner.streams.get(&key).is_some_and(|c| c.used == tick) {
            dropped.extend(inner.streams.remove(&key));
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(streams_max: usize) -> StateCache {
        StateCache::new(CacheOptions {
            streams_max,
            ..CacheOptions::default()
        })
    }

    fn put(cache: &StateCache, name: &str) {
        let empty = Snapshot::empty(Kind::VirtualMachine);
        cache.put(
            &format!("vm/ns/{name}"),
            Kind::VirtualMachine,
            Arc::new(empty),
        );
    }

    fn cached(cache: &StateCache, name: &str) -> bool {
        let stream = format!("vm/ns/{name}");
        cache.cached(&stream, Kind::VirtualMachine, 0).is_some()
    }

    #[test]
    fn streams_only_put_are_evicted_oldest_first_not_all_at_once() {
        let cache = cache(640);
        for i in 0..=640 {
            put(&cache, &format!("vm-{i}"));
        }
        // One past the bound: the 11 least recently put go (640 / 64 = 10 below the bound).
        assert_eq!(cache.streams(), 630);
        assert!(!cached(&cache, "vm-0") && !cached(&cache, "vm-10"));
        for i in 11..=640 {
            assert!(cached(&cache, &format!("vm-{i}")), "vm-{i} was dropped");
        }
    }

    #[test]
    fn evicted_states_are_freed_by_reap_and_by_the_eviction_itself_past_the_bound() {
        let cache = cache(256);
        let first = Arc::new(Snapshot::empty(Kind::VirtualMachine));
        let weak = Arc::downgrade(&first);
        cache.put("vm/ns/first", Kind::VirtualMachine, first);
        for i in 0..256 {
            put(&cache, &format!("vm-{i}"));
        }
        // Evicted (the least recently put), not freed yet: `reap` frees it.
        assert!(!cached(&cache, "first"));
        assert!(weak.upgrade().is_some(), "freed by the put that evicted it");
        assert_eq!(cache.reap(), 5, "256 / 64 = 4 below the bound, plus one");
        assert!(weak.upgrade().is_none(), "still held after reap");
        assert_eq!(cache.reap(), 0);
        // Nobody reaps: at most a quarter of the cache waits; later evictions free their own.
        let late = Arc::new(Snapshot::empty(Kind::VirtualMachine));
        let late_weak = Arc::downgrade(&late);
        for i in 256..1024 {
            put(&cache, &format!("vm-{i}"));
        }
        cache.put("vm/ns/late", Kind::VirtualMachine, late);
        for i in 1024..2048 {
            put(&cache, &format!("vm-{i}"));
        }
        assert!(!cached(&cache, "late"));
        assert!(late_weak.upgrade().is_none(), "kept past the bound");
        let waiting = cache.reap();
        assert!(
            waiting > 0 && waiting <= 64,
            "{waiting} evicted streams waited"
        );
    }

    #[test]
    fn eviction_drops_exactly_the_least_recently_used_of_puts_and_reads() {
        // A reference: each stream's last use, and eviction by sorting them (what the cache
        // did before it kept a use queue).
        let max = 128;
        let cache = cache(max);
        let mut model: HashMap<String, u64> = HashMap::new();
        let (mut tick, mut hits) = (0u64, 0u32);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let name = format!("vm-{}", seed % 300);
            tick += 1;
            if (seed >> 32).is_multiple_of(3) {
                // A read: a use only if the stream is cached.
                let hit = cached(&cache, &name);
                assert_eq!(hit, model.contains_key(&name), "{name}");
                if hit {
                    hits += 1;
                    model.insert(name, tick);
                }
            } else {
                put(&cache, &name);
                model.insert(name, tick);
                if model.len() > max {
                    let mut by_use: Vec<(u64, String)> =
                        model.iter().map(|(n, t)| (*t, n.clone())).collect();
                    by_use.sort();
                    let keep = max - max / EVICT_FRACTION;
                    for (_, n) in by_use.iter().take(model.len() - keep) {
                        model.remove(n);
                    }
                }
            }
            assert_eq!(cache.streams(), model.len());
        }
        assert!(hits > 1_000, "{hits} reads hit");
        for name in model.keys() {
            assert!(cached(&cache, name), "{name} was dropped");
        }
    }

    #[test]
    fn the_use_queue_stays_within_twice_the_streams_under_repeated_reads() {
        let cache = cache(64);
        for i in 0..10 {
            put(&cache, &format!("vm-{i}"));
        }
        for n in 0..100_000 {
            assert!(cached(&cache, &format!("vm-{}", n % 10)));
        }
        let uses = cache.inner.lock().unwrap().uses.len();
        assert!(
            uses <= 2 * 10 + USES_SLACK + 1,
            "{uses} entries for 10 streams"
        );
    }

    #[test]
    fn a_stream_put_again_counts_as_recently_used() {
        let cache = cache(64);
        for i in 0..64 {
            put(&cache, &format!("vm-{i}"));
        }
        // The oldest is put again, then one more stream passes the bound.
        put(&cache, "vm-0");
        put(&cache, "vm-new");
        assert!(cached(&cache, "vm-0") && cached(&cache, "vm-new"));
        assert!(!cached(&cache, "vm-1"));
    }
}
