//! The embedded backend: the log in one sled 0.34 tree, made durable by an explicit `fdatasync`.
//!
//! - **Layout** (see [`keys`]): each group commit is one value holding all its events (one
//!   engine lookup per batch on a full read), plus a stream index (one entry per append), an
//!   event-id index, a time index (one entry per batch), claims and checkpointed stream heads.
//! - **Durability**: sled's `flush()` ends in `sync_file_range`, which is not durable; a commit is
//!   `apply_batch` + `flush` + `fdatasync` of `<dir>/db` (plus any new file under `blobs/`), and
//!   only then acknowledged. The directory is synced once at creation.
//! - **Group commit** ([`commit`]): the first appender that finds no commit in progress commits
//!   on its own thread; others queue and sleep until a leader has made them durable. Appends
//!   submitted without waiting (`EventLog::submit`) queue the same way and are committed by
//!   the log's committer thread ([`SledLog::start_committer`]), which wakes their futures.
//! - **Reads** stop at the durable head, so no reader sees an event a crash could take back.
//! - **Damage**: sled can panic on damaged files; every entry into the engine is wrapped so a
//!   panic becomes [`Error::Damaged`], and every stored byte is validated when read.

mod commit;
pub mod import;
mod keys;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::fs::File;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::batch::{BatchView, needs_realign, realigned};
use crate::error::{Error, Result};
use crate::hash::GENESIS_PREV_HASH;
use crate::head_record::HeadRecord;
use crate::log::{
    DurableHead, EventLog, LocalFences, PayloadValidator, VerifyWalk, Visitor, read_all_by_scan,
};
use crate::submit::Submitted;
use crate::types::{
    AppendRequest, AppendResult, Direction, Fence, Limits, Position, RecordedEvent,
    RecordedEventRef, Revision, Timestamp, VerifyReport,
};

use commit::{BlobSync, Queue};
pub use import::{ImportOptions, ImportReport, Importer};
use keys::IdLocation;

/// sled's segment size for vmplane's trees. Values larger than a quarter of a segment go to
/// separate blob files; 8 MiB keeps every group-commit batch, and the leaf nodes holding them,
/// in the main `db` file that the commit fsyncs. Fixed at creation and checked by sled at reopen.
const SEGMENT_BYTES: usize = 8 << 20;

/// The source of `recorded_at`. Tests pass a fake one; it may go backwards (the store keeps
/// `recorded_at` non-decreasing regardless).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// How a [`SledLog`] is opened.
#[derive(Clone)]
pub struct SledOptions {
    /// The bounds enforced on requests and reads.
    pub limits: Limits,
    /// Where `recorded_at` comes from.
    pub clock: Clock,
    /// sled's page cache, in bytes ([`SledOptions::DEFAULT_CACHE_MIB`] MiB by default). sled
    /// counts it loosely: what a full read leaves resident can exceed it.
    pub cache_capacity_bytes: u64,
    /// Events one group commit takes from the queue at most.
    pub group_commit_events_max: usize,
    /// Payload bytes one group commit takes from the queue at most (a single larger request
    /// still commits alone).
    pub group_commit_bytes_max: usize,
    /// Batches between two checkpoints of the stream heads; opening replays at most this many.
    pub heads_checkpoint_batches: u32,
    /// Recently committed event ids kept in memory, so an append racing a commit needs no second
    /// disk lookup.
    pub recent_ids_max: usize,
}

impl Default for SledOptions {
    fn default() -> SledOptions {
        SledOptions {
            limits: Limits::DEFAULT,
            clock: Arc::new(Timestamp::now),
            cache_capacity_bytes: SledOptions::DEFAULT_CACHE_MIB << 20,
            group_commit_events_max: 4_096,
            group_commit_bytes_max: 96 << 10,
            heads_checkpoint_batches: 1_024,
            recent_ids_max: 65_536,
        }
    }
}

impl SledOptions {
    /// The page cache's default size, in MiB. Reads of current state come from the
    /// projections' own memory, not from here; sled's default (1 GiB) kept the whole log of a
    /// large installation resident for little gain (`memory_100k`, 100,000 VMs: 356 MiB
    /// resident with 1 GiB, 184–191 MiB with this; the rebuild and gateway benches measured
    /// the same within their noise).
    pub const DEFAULT_CACHE_MIB: u64 = 32;
}

impl fmt::Debug for SledOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledOptions")
            .field("limits", &self.limits)
            .field("cache_capacity_bytes", &self.cache_capacity_bytes)
            .field("group_commit_events_max", &self.group_commit_events_max)
            .field("group_commit_bytes_max", &self.group_commit_bytes_max)
            .field("heads_checkpoint_batches", &self.heads_checkpoint_batches)
            .field("recent_ids_max", &self.recent_ids_max)
            .finish_non_exhaustive()
    }
}

/// The event log on sled. Open one per directory per process.
pub struct SledLog {
    dir: PathBuf,
    db: sled::Db,
    /// `<dir>/db`, opened once: the file a commit fdatasyncs.
    data_file: File,
    blobs: Mutex<BlobSync>,
    options: SledOptions,
    state: Mutex<State>,
    queue: Mutex<Queue>,
    /// The last position written into sled (maybe not yet durable).
    applied: AtomicU64,
    /// The last durable position: the head every read stops at.
    durable: DurableHead,
    /// sled 0.34 recovers a damaged file by silently dropping everything after the damage;
    /// comparing with this record at open turns that into an error instead of a shorter log.
    head_record: HeadRecord,
    commits: AtomicU64,
    committed_events: AtomicU64,
    /// The current term of each leadership ([`SledLog::take_fence`]). A fenced append holds the
    /// read lock across its commit, so a new term cannot begin in the middle of one.
    fences: LocalFences,
    /// The thread that commits submitted appends ([`SledLog::start_committer`]), once started.
    committer: OnceLock<Arc<crate::group::Committer>>,
}

/// Counters of the group commit since open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitStats {
    /// Durable commits (one fdatasync each).
    pub commits: u64,
    /// Events they made durable.
    pub events: u64,
}

/// What validation needs, kept in memory so the hot path reads no disk.
struct State {
    heads: HashMap<String, Revision>,
    claims: HashMap<String, String>,
    last_position: u64,
    last_hash: [u8; 32],
    last_recorded_at: i64,
    recent_ids: RecentIds,
    batches_since_checkpoint: u32,
    dirty_heads: HashSet<String>,
    poisoned: Option<String>,
}

/// Ids committed at positions `floor..`, bounded in size.
struct RecentIds {
    by_id: HashMap<Uuid, IdLocation>,
    order: VecDeque<(u64, Uuid)>,
    floor: u64,
    len_max: usize,
}

impl RecentIds {
    fn insert(&mut self, id: Uuid, location: IdLocation) {
        self.order.push_back((location.position, id));
        self.by_id.insert(id, location);
        while self.order.len() > self.len_max {
            if let Some((position, id)) = self.order.pop_front() {
                self.by_id.remove(&id);
                self.floor = position + 1;
            }
        }
    }

    /// Whether every id committed after `checked_through` is still here.
    fn covers(&self, checked_through: u64) -> bool {
        self.floor <= checked_through + 1
    }
}

impl fmt::Debug for SledLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledLog")
            .field("dir", &self.dir)
            .field("head", &self.head())
            .finish_non_exhaustive()
    }
}

impl SledLog {
    /// Opens (or creates) the log in `dir` with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<SledLog> {
        SledLog::open_with(dir, SledOptions::default())
    }

    /// Opens (or creates) the log in `dir`. A damaged store gives [`Error::Damaged`] or
    /// [`Error::Corrupt`], never a panic.
    pub fn open_with(dir: impl AsRef<Path>, options: SledOptions) -> Result<SledLog> {
        let dir = dir.as_ref().to_path_buf();
        let head_record = HeadRecord::new(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            context: "creating the log directory",
            source,
        })?;
        let config = sled::Config::new()
            .path(&dir)
            .segment_size(SEGMENT_BYTES)
            .cache_capacity(options.cache_capacity_bytes);
        let db = guarded("opening sled", || open_sled(&config))?;
        let data_file = File::open(dir.join("db")).map_err(|source| Error::Io {
            context: "opening sled's data file",
            source,
        })?;
        let blobs = BlobSync::new(dir.join("blobs"));
        let log = SledLog {
            dir,
            db,
            data_file,
            blobs: Mutex::new(blobs),
            state: Mutex::new(State {
                heads: HashMap::new(),
                claims: HashMap::new(),
                last_position: 0,
                last_hash: GENESIS_PREV_HASH,
                last_recorded_at: i64::MIN,
                recent_ids: RecentIds {
                    by_id: HashMap::new(),
                    order: VecDeque::new(),
                    floor: 1,
                    len_max: options.recent_ids_max.max(1),
                },
                batches_since_checkpoint: 0,
                dirty_heads: HashSet::new(),
                poisoned: None,
            }),
            options,
            queue: Mutex::new(Queue::default()),
            applied: AtomicU64::new(0),
            durable: DurableHead::new(0),
            head_record,
            commits: AtomicU64::new(0),
            committed_events: AtomicU64::new(0),
            fences: LocalFences::default(),
            committer: OnceLock::new(),
        };
        guarded("loading the log", || log.initialize_or_load())?;
        guarded("checking the recorded head", || log.check_head_record())?;
        Ok(log)
    }

    /// The directory the log lives in.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many commits and events since open: events per commit is the group-commit batch size.
    #[must_use]
    pub fn commit_stats(&self) -> CommitStats {
        CommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            events: self.committed_events.load(Ordering::Relaxed),
        }
    }

    /// Bytes sled's files take on disk.
    pub fn size_on_disk_bytes(&self) -> Result<u64> {
        self.db
            .size_on_disk()
            .map_err(engine("measuring the store"))
    }

    fn initialize_or_load(&self) -> Result<()> {
        match self
            .db
            .get(keys::META_FORMAT)
            .map_err(engine("reading the format marker"))?
        {
            Some(format) if format.as_ref() == keys::FORMAT => self.load(),
            Some(format) => Err(Error::Damaged {
                reason: format!(
                    "unknown format {:?}, expected {:?}",
                    String::from_utf8_lossy(&format),
                    String::from_utf8_lossy(keys::FORMAT)
                ),
            }),
            None => {
                if self
                    .db
                    .first()
                    .map_err(engine("reading the store"))?
                    .is_some()
                {
                    return Err(Error::Damaged {
                        reason: "the store has data but no format marker".into(),
                    });
                }
                self.initialize()
            }
        }
    }

    /// A new store: write the format marker and make the directory entries durable.
    fn initialize(&self) -> Result<()> {
        self.db
            .insert(keys::META_FORMAT, keys::FORMAT)
            .map_err(engine("writing the format"))?;
        self.db.flush().map_err(engine("flushing the new store"))?;
        let io = |context| move |source| Error::Io { context, source };
        self.data_file
            .sync_all()
            .map_err(io("syncing the new data file"))?;
        for path in [
            self.dir.join("conf"),
            self.dir.clone(),
            self.dir.join("blobs"),
        ] {
            if path.exists() {
                File::open(&path)
                    .and_then(|file| file.sync_all())
                    .map_err(io("syncing the new store's files"))?;
            }
        }
        if let Some(parent) = self.dir.parent() {
            // The directory entry of the store itself; best effort when the parent is not ours.
            let _ = File::open(parent).and_then(|file| file.sync_all());
        }
        Ok(())
    }

    /// Rebuilds the in-memory state from disk: head and hash from the last batch, claims, and
    /// stream heads from their checkpoint plus the batches after it.
    fn load(&self) -> Result<()> {
        let mut state = lock(&self.state);
        if let Some(item) = self.db.scan_prefix([keys::BATCH]).next_back() {
            let (key, value) = item.map_err(engine("reading the last batch"))?;
            let first = keys::batch_position(&key)?;
            with_view(&value, first, |view| {
                let last = view.event(view.len() - 1)?;
                state.last_position = last.position.0;
                state.last_hash = *last.hash;
                state.last_recorded_at = last.recorded_at.0;
                Ok(())
            })?;
        }
        for item in self.db.scan_prefix([keys::CLAIM]) {
            let (key, owner) = item.map_err(engine("reading claims"))?;
            let key = utf8(&key[1..], "claim key")?;
            let owner = utf8(&owner, "claim owner")?;
            state.claims.insert(key, owner);
        }
        for item in self.db.scan_prefix([keys::HEAD]) {
            let (key, revision) = item.map_err(engine("reading stream heads"))?;
            if revision.len() != 8 {
                return Err(Error::Damaged {
                    reason: "a stream head checkpoint is malformed".into(),
                });
            }
            state
                .heads
                .insert(utf8(&key[1..], "stream name")?, keys::be_u64(&revision));
        }
        let heads_at = match self
            .db
            .get(keys::META_HEADS_AT)
            .map_err(engine("reading heads"))?
        {
            Some(value) if value.len() == 8 => keys::be_u64(&value),
            Some(_) => {
                return Err(Error::Damaged {
                    reason: "heads checkpoint is malformed".into(),
                });
            }
            None => 0,
        };
        if heads_at > state.last_position {
            return Err(Error::Damaged {
                reason: format!(
                    "stream heads are checkpointed at {heads_at}, past the log's end {}",
                    state.last_position
                ),
            });
        }
        let mut tail_batches = 0u32;
        for item in self
            .db
            .range(keys::batch(heads_at + 1)..=keys::batch(u64::MAX))
        {
            let (key, value) = item.map_err(engine("replaying the log's tail"))?;
            let first = keys::batch_position(&key)?;
            tail_batches += 1;
            with_view(&value, first, |view| {
                for index in 0..view.len() {
                    let event = view.event(index)?;
                    state.heads.insert(event.stream.to_owned(), event.revision);
                    state.dirty_heads.insert(event.stream.to_owned());
                }
                Ok(())
            })?;
        }
        state.batches_since_checkpoint = tail_batches;
        state.recent_ids.floor = state.last_position + 1;
        let head = state.last_position;
        drop(state);
        self.applied.store(head, Ordering::Release);
        self.durable.publish(head);
        Ok(())
    }

    /// Fails if the log is shorter than a head it once made durable, or differs there.
    fn check_head_record(&self) -> Result<()> {
        self.head_record.check(self.durable_head(), |position| {
            Ok(self.read_event(Position(position))?.map(|event| event.hash))
        })
    }

    /// Writes the durable head to the head record.
    fn record_head(&self) -> std::io::Result<()> {
        match self.durable_state() {
            Some((position, hash)) => self.head_record.write(position, hash),
            None => Ok(()),
        }
    }

    /// The last position and its hash, if durable.
    fn durable_state(&self) -> Option<(u64, [u8; 32])> {
        let (position, hash) = {
            let state = lock(&self.state);
            (state.last_position, state.last_hash)
        };
        (position <= self.durable_head()).then_some((position, hash))
    }

    /// Refreshes the head record if it is older than [`HeadRecord::INTERVAL`].
    fn maybe_record_head(&self) {
        self.head_record.refresh(|| self.durable_state());
    }

    fn durable_head(&self) -> u64 {
        self.durable.get()
    }

    /// The batch holding `position`: its first position and value.
    fn batch_containing(&self, position: u64) -> Result<Option<(u64, sled::IVec)>> {
        let found = self
            .db
            .range(keys::batch(0)..=keys::batch(position))
            .next_back();
        let Some(item) = found else { return Ok(None) };
        let (key, value) = item.map_err(engine("reading a batch"))?;
        Ok(Some((keys::batch_position(&key)?, value)))
    }

    fn batch_at(&self, first_position: u64) -> Result<sled::IVec> {
        self.db
            .get(keys::batch(first_position))
            .map_err(engine("reading a batch"))?
            .ok_or_else(|| Error::Corrupt {
                position: Position(first_position),
                reason: "the stream index points at a batch that is missing".into(),
            })
    }

    /// Visits events after `after` up to `last` (inclusive). Returns the last visited position.
    fn visit_range(&self, after: u64, last: u64, visit: Visitor<'_>) -> Result<u64> {
        if after >= last {
            return Ok(after);
        }
        let start = match self.batch_containing(after + 1)? {
            Some((first, _)) => first,
            None => 1,
        };
        let mut visited = after;
        let mut expected_first = None;
        for item in self.db.range(keys::batch(start)..=keys::batch(last)) {
            let (key, value) = item.map_err(engine("reading the log"))?;
            let first = keys::batch_position(&key)?;
            if let Some(expected) = expected_first
                && first != expected
            {
                return Err(Error::Corrupt {
                    position: Position(expected),
                    reason: format!("gap in the log: the next batch starts at {first}"),
                });
            }
            let stopped = with_view(&value, first, |view| {
                expected_first = Some(view.last_position() + 1);
                view.visit(after, last, &mut |event| {
                    visited = event.position.0;
                    visit(event)
                })
            })?;
            if stopped {
                break;
            }
        }
        Ok(visited)
    }

    fn read_stream_inner(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let max_count = max_count.min(self.options.limits.read_events_max);
        let mut events = Vec::new();
        if max_count == 0 || stream.len() > self.options.limits.stream_name_bytes_max {
            return Ok(events);
        }
        let head = self.durable_head();
        let mut cache: Option<(u64, sled::IVec)> = None;
        let mut fetch = |entry: &keys::StreamEntry,
                         revision: Revision|
         -> Result<Option<RecordedEvent>> {
            let position = entry.position_of(revision);
            if position.0 > head {
                return Ok(None);
            }
            if cache
                .as_ref()
                .is_none_or(|(first, _)| *first != entry.batch_position)
            {
                cache = Some((entry.batch_position, self.batch_at(entry.batch_position)?));
            }
            let Some((first, value)) = &cache else {
                return Ok(None);
            };
            let event = with_view(value, *first, |view| {
                let index = position.0.checked_sub(*first).map(|i| i as usize);
                match index {
                    Some(index) if index < view.len() => Ok(view.event(index)?.to_owned_event()),
                    _ => Err(Error::Corrupt {
                        position,
                        reason: format!(
                            "the stream index puts it in batch {first}, which lacks it"
                        ),
                    }),
                }
            })?;
            if event.stream != stream || event.revision != revision {
                return Err(Error::Corrupt {
                    position,
                    reason: format!(
                        "the stream index says {stream}@{revision}, the event is {}@{}",
                        event.stream, event.revision
                    ),
                });
            }
            Ok(Some(event))
        };
        let lowest = keys::stream_entry(stream, 0);
        let highest = keys::stream_entry(stream, u64::MAX);
        match direction {
            Direction::Forward => {
                let from = from.max(1);
                // The entry holding `from` may start below it.
                let start = match self
                    .db
                    .range(lowest.clone()..=keys::stream_entry(stream, from))
                    .next_back()
                {
                    Some(item) => item.map_err(engine("reading the stream index"))?.0.to_vec(),
                    None => keys::stream_entry(stream, from),
                };
                'entries: for item in self.db.range(start..=highest) {
                    let (key, value) = item.map_err(engine("reading the stream index"))?;
                    let entry = keys::parse_stream_entry(stream, &key, &value)?;
                    for revision in entry.first_revision.max(from)..=entry.last_revision() {
                        let Some(event) = fetch(&entry, revision)? else {
                            break 'entries;
                        };
                        events.push(event);
                        if events.len() >= max_count {
                            break 'entries;
                        }
                    }
                }
            }
            Direction::Backward => {
                if from == 0 {
                    return Ok(events);
                }
                'entries: for item in self
                    .db
                    .range(lowest..=keys::stream_entry(stream, from))
                    .rev()
                {
                    let (key, value) = item.map_err(engine("reading the stream index"))?;
                    let entry = keys::parse_stream_entry(stream, &key, &value)?;
                    for revision in (entry.first_revision..=entry.last_revision().min(from)).rev() {
                        // Events past the durable head are skipped, not an end: older ones follow.
                        if entry.position_of(revision).0 > head {
                            continue;
                        }
                        events.extend(fetch(&entry, revision)?);
                        if events.len() >= max_count {
                            break 'entries;
                        }
                    }
                }
            }
        }
        Ok(events)
    }

    fn verify_inner(&self, validate_payload: PayloadValidator<'_>) -> Result<VerifyReport> {
        let head = self.durable_head();
        let mut walk = VerifyWalk::new(validate_payload);
        for item in self.db.range(keys::batch(0)..=keys::batch(head)) {
            let (key, value) = item.map_err(engine("reading the log"))?;
            let first = keys::batch_position(&key)?;
            if first != walk.next_position() {
                return Err(Error::Corrupt {
                    position: Position(walk.next_position()),
                    reason: format!("gap in the log: the next batch starts at {first}"),
                });
            }
            with_view(&value, first, |view| {
                for index in 0..view.len() {
                    let event = view.event(index)?;
                    walk.check(&event)?;
                    self.verify_id_index(&event)?;
                }
                Ok(())
            })?;
        }
        walk.finish(head)
    }

    /// Pair check: the event-id index points back at the event.
    fn verify_id_index(&self, event: &RecordedEventRef<'_>) -> Result<()> {
        let found = self
            .db
            .get(keys::id(&event.id))
            .map_err(engine("reading the id index"))?;
        let location = match found {
            Some(value) => keys::parse_id_value(&event.id, &value).ok(),
            None => None,
        };
        let expected = IdLocation {
            position: event.position.0,
            revision: event.revision,
            stream: Arc::from(event.stream),
        };
        if location.as_ref() != Some(&expected) {
            return Err(Error::Corrupt {
                position: event.position,
                reason: format!(
                    "the event-id index entry of {} is missing or wrong",
                    event.id
                ),
            });
        }
        Ok(())
    }
}

impl Drop for SledLog {
    fn drop(&mut self) {
        if let Some(committer) = self.committer.get() {
            committer.close();
        }
        if lock(&self.state).poisoned.is_none()
            && let Err(err) = self.record_head()
        {
            tracing::warn!(%err, "could not record the head at close");
        }
    }
}

impl SledLog {
    /// Begins a new term of leadership `name` in this process and returns its fence; appends
    /// fenced by an earlier term of `name` fail with [`Error::Fenced`] from now on. One process
    /// holds a sled log (sled locks its directory), so its leader is whoever asks here.
    pub fn take_fence(&self, name: &str) -> Fence {
        self.fences.take(name)
    }
}

impl EventLog for SledLog {
    fn append(&self, request: AppendRequest) -> Result<AppendResult> {
        self.append_grouped(request)
    }

    fn submit(&self, request: AppendRequest) -> Submitted {
        self.submit_grouped(request)
    }

    fn submits(&self) -> bool {
        self.committer.get().is_some()
    }

    fn append_fenced(&self, request: AppendRequest, fence: &Fence) -> Result<AppendResult> {
        self.fences
            .append(request, fence, |request| self.append_grouped(request))
    }

    fn read_stream(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>> {
        guarded("reading a stream", || {
            self.read_stream_inner(stream, from, direction, max_count)
        })
    }

    fn read_all(&self, after: Position, max_count: usize) -> Result<Vec<RecordedEvent>> {
        read_all_by_scan(&self.options.limits, max_count, |visit| {
            guarded("reading the log", || {
                self.visit_range(after.0, self.durable_head(), visit)
            })
        })
    }

    fn scan(&self, after: Position, visit: Visitor<'_>) -> Result<Position> {
        guarded("scanning the log", || {
            self.visit_range(after.0, self.durable_head(), visit)
        })
        .map(Position)
    }

    fn read_event(&self, position: Position) -> Result<Option<RecordedEvent>> {
        if position.0 == 0 || position.0 > self.durable_head() {
            return Ok(None);
        }
        guarded("reading an event", || {
            let Some((first, value)) = self.batch_containing(position.0)? else {
                return Err(Error::Corrupt {
                    position,
                    reason: "no batch holds it".into(),
                });
            };
            with_view(&value, first, |view| {
                if position.0 > view.last_position() {
                    return Err(Error::Corrupt {
                        position,
                        reason: "no batch holds it".into(),
                    });
                }
                Ok(Some(
                    view.event((position.0 - first) as usize)?.to_owned_event(),
                ))
            })
        })
    }

    fn position_at(&self, at: Timestamp) -> Result<Position> {
        let head = self.durable_head();
        guarded("reading the time index", || {
            let upper = keys::time(at, u64::MAX);
            match self
                .db
                .range(keys::time(Timestamp(i64::MIN), 0)..=upper)
                .next_back()
            {
                None => Ok(Position(0)),
                Some(item) => {
                    let (key, _) = item.map_err(engine("reading the time index"))?;
                    // A batch being committed now has the latest time, so everything durable
                    // is at or before it.
                    Ok(Position(keys::time_position(&key)?.min(head)))
                }
            }
        })
    }

    fn head(&self) -> Position {
        Position(self.durable_head())
    }

    fn wait_for(&self, position: Position, timeout: Duration) -> Result<Position> {
        Ok(self.durable.wait_for(position, timeout))
    }

    fn stream_revision(&self, stream: &str) -> Result<Option<Revision>> {
        Ok(lock(&self.state).heads.get(stream).copied())
    }

    fn claim_holder(&self, key: &str) -> Result<Option<String>> {
        Ok(lock(&self.state).claims.get(key).cloned())
    }

    fn verify(&self, validate_payload: PayloadValidator<'_>) -> Result<VerifyReport> {
        guarded("verifying the log", || self.verify_inner(validate_payload))
    }

    fn limits(&self) -> &Limits {
        &self.options.limits
    }
}

/// Opens sled, waiting a little if this process's previous handle on the same directory is still
/// being torn down: sled 0.34 releases its file lock through deferred (epoch-based) cleanup, so a
/// reopen right after a drop can briefly find the lock held. Public for tools and tests that open
/// a log's sled database directly. Held by another process (as `/proc/locks` tells), it is
/// [`Error::Unavailable`] at once; where that cannot be told, after 5 s of waiting.
pub fn open_sled(config: &sled::Config) -> Result<sled::Db> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match config.open() {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(err)) if err.to_string().contains("could not acquire lock") => {
                let elsewhere = flock_held_by_another_process(&config.path.join("db"));
                if elsewhere == Some(true) || Instant::now() >= deadline {
                    // Another process holds the directory (sled locks its `db` file).
                    return Err(Error::Unavailable {
                        reason: format!(
                            "{} is in use by another process (a running `vmplane serve`?): \
                             stop it first, or work on a copy",
                            config.path.display()
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(err) => return Err(engine("opening sled")(err)),
        }
    }
}

/// Whether a `flock` on `path` is held by a process other than this one, as the kernel lists
/// it in `/proc/locks` (`N: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF`, device
/// numbers in hex). `None` when that cannot be told (no `/proc`, the file gone).
pub(crate) fn flock_held_by_another_process(path: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let dev = meta.dev();
    let id = format!(
        "{:02x}:{:02x}:{}",
        libc::major(dev),
        libc::minor(dev),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let me = std::process::id().to_string();
    Some(locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A waiter's line reads `N: -> FLOCK ...`; only holders count.
        matches!(fields.as_slice(), [_, "FLOCK", _, _, pid, file, ..] if *file == id && *pid != me)
    }))
}

/// Runs `body` against the batch value `value` stored under `first`, realigning it if needed.
fn with_view<R>(
    value: &sled::IVec,
    first: u64,
    body: impl FnOnce(BatchView<'_>) -> Result<R>,
) -> Result<R> {
    if needs_realign(value) {
        let copy = realigned(value);
        body(BatchView::new(&copy, first)?)
    } else {
        body(BatchView::new(value, first)?)
    }
}

/// Runs `body`, turning a panic inside the engine into [`Error::Damaged`].
fn guarded<T>(context: &'static str, body: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(Error::Damaged {
                reason: format!("storage engine panicked while {context}: {message}"),
            })
        }
    }
}

fn engine(context: &'static str) -> impl Fn(sled::Error) -> Error {
    move |err| match err {
        sled::Error::Io(source) => Error::Io { context, source },
        sled::Error::Corruption { .. } => Error::Damaged {
            reason: format!("{context}: {err}"),
        },
        other => Error::Storage {
            context,
            reason: other.to_string(),
        },
    }
}

fn utf8(bytes: &[u8], what: &str) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| Error::Damaged {
        reason: format!("a stored {what} is not UTF-8"),
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    use super::*;

    /// A child process holding `path`'s flock (util-linux `flock`), killed on drop.
    struct Holder(Child);

    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn hold_in_another_process(path: &Path) -> Holder {
        let child = Command::new("flock")
            .arg("--exclusive")
            .arg(path)
            .args(["sleep", "60"])
            .spawn()
            .expect("util-linux flock runs");
        let holder = Holder(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while flock_held_by_another_process(path) != Some(true) {
            assert!(Instant::now() < deadline, "the child never took the lock");
            std::thread::sleep(Duration::from_millis(10));
        }
        holder
    }

    #[test]
    fn a_lock_this_process_holds_is_not_another_process_lock() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = open_sled(&sled::Config::new().path(dir.path())).expect("open");
        assert_eq!(
            flock_held_by_another_process(&dir.path().join("db")),
            Some(false)
        );
        drop(db);
    }

    #[test]
    fn a_sled_directory_another_process_holds_is_refused_at_once_naming_why() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(open_sled(&sled::Config::new().path(dir.path())).expect("create"));
        let _holder = hold_in_another_process(&dir.path().join("db"));
        assert_eq!(
            flock_held_by_another_process(&dir.path().join("db")),
            Some(true)
        );
        match open_sled(&sled::Config::new().path(dir.path())) {
            Err(Error::Unavailable { reason }) => {
                assert!(reason.contains("in use by another process"), "{reason}");
            }
            Err(other) => panic!("expected Unavailable, got {other:?}"),
            Ok(_) => panic!("opened a directory another process holds"),
        }
    }
}
