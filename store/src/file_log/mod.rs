//! The log in one append-only file, with its indexes in memory: the backend that commits with
//! one `write` and one `fdatasync`, and decides and reads without touching a storage engine.
//!
//! - **Layout** (see [`record`]): a header naming the format, then one record per group commit:
//!   a frame (body length, CRC-32 of the body), the claim changes of the commit, and the
//!   commit's events as one batch value — the very value the sled backend stores
//!   ([`crate::batch`]), so each event is validated (rkyv's `bytecheck`) when it is read.
//! - **Durability**: a commit is one positioned write after the last record and one
//!   `fdatasync`, and only then acknowledged. The file and its directory are synced at creation.
//!   The committer keeps zeroed room ahead of the records (`commit::ROOM_BYTES`), so a commit
//!   usually overwrites bytes the file already has: its `fdatasync` then writes the data alone,
//!   without the journal commit that a file growing on every commit needs for its size.
//! - **Group commit**: appends, waited on or submitted, queue for the log's committer thread,
//!   which takes what has queued (bounded by events and bytes), decides every request against
//!   the in-memory indexes plus the effects of the requests before it in the group
//!   ([`crate::log::decide_append`], as every backend does), writes one record, syncs, and only
//!   then updates the indexes, publishes the new head and answers each appender.
//! - **Indexes**, all in memory and rebuilt from the file at open: where each commit's record
//!   lies (position → record by binary search; time → position the same way), each stream's
//!   runs of revisions, every event id's stream, position and revision, and the claims. Nothing
//!   but the events and claim changes is written, so a commit writes what it commits plus a
//!   few dozen bytes. The price: opening reads and validates the whole file, and the indexes
//!   take memory in proportion to the events (estimated at 60–100 bytes per event: an id entry
//!   plus a share of a stream run and of a record entry; not measured yet). The maps that gain
//!   an entry with nearly every append are spread over many small maps (`shards`), so none
//!   stalls a commit while it grows; each stream's last revision is kept apart as well
//!   (`tips`), so a command asking it never waits for a commit to reach the indexes.
//! - **Crash**: a record that was being written when the machine stopped (a short frame, a
//!   body shorter than its frame says, or a CRC that does not match, in the last record, which
//!   zeros alone may follow) was never acknowledged; opening cuts it off and says so
//!   ([`OpenReport::torn_tail`]). Zeros after the last record are room, not damage. Anything
//!   wrong before the last record is damage: opening refuses with [`Error::Corrupt`] naming
//!   the position.
//! - **Read-only** ([`FileLog::open_read_only`], what `admin verify` uses): the same reading
//!   and checks, but nothing on disk changes: a torn last record is reported and left in
//!   place, and nothing is appended, created or recorded.
//! - **Reads** stop at the durable head; the most recent records are kept in memory, so the
//!   projections catching up after a write read no disk.
//! - One process per directory: the file is locked (`flock`) while open (shared by read-only
//!   opens; a writer is refused while one is open).

mod commit;
pub mod import;
pub mod record;
mod tips;

use std::collections::VecDeque;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rkyv::util::AlignedVec;
use uuid::Uuid;

use crate::batch::BatchView;
use crate::error::{Error, Result};
use crate::group::{Committer, Slot, SlotFuture};
use crate::hash::GENESIS_PREV_HASH;
use crate::head_record::HeadRecord;
use crate::log::{
    DurableHead, EventLog, IdLocation, LocalFences, PayloadValidator, VerifyWalk, Visitor,
    check_request, read_all_by_scan,
};
use crate::sled_log::Clock;
use crate::submit::{PendingAppend, Submitted};
use crate::types::{
    AppendRequest, AppendResult, Direction, Fence, Limits, Position, RecordedEvent, Revision,
    Timestamp, VerifyReport,
};

use crate::shards::ShardedMap;
use record::{ClaimChange, FRAME_BYTES, HEADER};
use tips::Tips;

/// The log's file inside its directory.
pub const LOG_FILE: &str = "events.vpl";

/// How a [`FileLog`] is opened.
#[derive(Clone)]
pub struct FileOptions {
    /// The bounds enforced on requests and reads.
    pub limits: Limits,
    /// Where `recorded_at` comes from.
    pub clock: Clock,
    /// Events one group commit takes from the queue at most.
    pub group_commit_events_max: usize,
    /// Payload bytes one group commit takes from the queue at most (a single larger request
    /// still commits alone).
    pub group_commit_bytes_max: usize,
    /// How long the committer waits at most, after a group of 8 appends or more, until as many
    /// appends are queued again before it takes the next group
    /// ([`DEFAULT_GROUP_COMMIT_LINGER`](Self::DEFAULT_GROUP_COMMIT_LINGER) by default; zero
    /// never waits). Appenders who come together then keep sharing one write and one
    /// `fdatasync` instead of splitting into smaller groups that each pay for their own. A few
    /// appenders, whose groups are smaller, never wait.
    pub group_commit_linger: Duration,
    /// Bytes of the most recent records kept in memory for reads.
    pub recent_records_bytes_max: usize,
}

impl FileOptions {
    /// The committer's linger unless told otherwise: 150 µs. Through the gateway (medians of 9
    /// alternated pairs against no linger, same binary): 64 clients in a closed loop 1.11× the
    /// creates/s and 0.81× the p99 (every pair better in both), 16 clients 1.03× and 0.91×;
    /// fewer clients never make a group of 8, so they never wait. Unlike PostgreSQL's
    /// `commit_delay` and MySQL's `binlog_group_commit_sync_delay`, which sleep a set time and
    /// are off by default, this wait ends as soon as the last group's appenders are back, and
    /// only follows groups large enough to be worth keeping together.
    pub const DEFAULT_GROUP_COMMIT_LINGER: Duration = Duration::from_micros(150);
}

impl Default for FileOptions {
    fn default() -> FileOptions {
        FileOptions {
            limits: Limits::DEFAULT,
            clock: Arc::new(Timestamp::now),
            group_commit_events_max: 4_096,
            group_commit_bytes_max: 1 << 20,
            group_commit_linger: FileOptions::DEFAULT_GROUP_COMMIT_LINGER,
            recent_records_bytes_max: 16 << 20,
        }
    }
}

impl fmt::Debug for FileOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileOptions")
            .field("limits", &self.limits)
            .field("group_commit_events_max", &self.group_commit_events_max)
            .field("group_commit_bytes_max", &self.group_commit_bytes_max)
            .field("group_commit_linger", &self.group_commit_linger)
            .field("recent_records_bytes_max", &self.recent_records_bytes_max)
            .finish_non_exhaustive()
    }
}

/// What opening found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenReport {
    /// Events in the log (up to its last whole record).
    pub events: u64,
    /// Records (group commits) in the log.
    pub records: u64,
    /// Bytes of an unacknowledged, partly written last record cut off (0: none); opened
    /// [read-only](FileLog::open_read_only), the bytes of such a record left in place.
    pub torn_tail_bytes: u64,
    /// The torn last record found at open, if any: what it is, and whether it was cut off.
    pub torn_tail: Option<TornTail>,
}

/// A last record that fails its checks with only zeros after it: a commit that was being
/// written when the writer stopped (or damage to the last record that the head record cannot
/// tell from one). A writable open cuts it off; a [read-only](FileLog::open_read_only) one
/// leaves it and reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Where it starts in the log file (where the last whole record ends).
    pub offset: u64,
    /// Its bytes, up to the end of the file (zeros after it included).
    pub bytes: u64,
    /// What is wrong with it: "a short frame", "a frame with no valid length", "a body shorter
    /// than its frame says" or "a checksum that does not match".
    pub reason: &'static str,
    /// The positions it would have held, when its frame and body are whole enough to tell
    /// (read from its unverified bytes: a hint, not a fact). It always starts right after
    /// [`OpenReport::events`].
    pub positions: Option<(u64, u64)>,
    /// Whether opening cut it off (never on a read-only open).
    pub cut: bool,
}

/// The event log in one file. Open one per directory (the file is locked while open).
pub struct FileLog {
    inner: Arc<Inner>,
    committer: Option<JoinHandle<()>>,
    opened: OpenReport,
}

/// Appends waiting for the committer.
#[derive(Default)]
struct Queue {
    pending: VecDeque<commit::Pending>,
    /// The length a lingering committer waits for (0: it does not wait). The appender that
    /// brings the queue there sets it back to 0 and rings [`Inner::company`].
    awaited: usize,
    /// The log is closing: the committer does not linger any more.
    closed: bool,
}

/// What the committer thread shares with the log's handle.
struct Inner {
    path: PathBuf,
    file: File,
    options: FileOptions,
    index: RwLock<Index>,
    queue: Mutex<Queue>,
    /// Rung by the appender that brings the queue to the length a lingering committer waits for.
    company: Condvar,
    bell: Committer,
    /// The last durable position: the head every read stops at.
    durable: DurableHead,
    /// A recent durable head, so a log that lost acknowledged records is an error at open.
    head_record: HeadRecord,
    /// The current term of each leadership ([`FileLog::take_fence`]). A fenced append holds the
    /// read lock until its append is decided, so a new term cannot begin in the middle of one.
    fences: LocalFences,
    commits: AtomicU64,
    /// The file's length as the committer left it: the end of the zeroed room ahead of the
    /// records (see [`commit::ROOM_BYTES`]). Only the committer changes it.
    room_end: AtomicU64,
    /// Each stream's last revision, read without the indexes' lock (set under it, just after
    /// the head that includes it is published, so whoever is told a revision can read it).
    tips: Tips,
    /// Why appends are refused until the log is reopened (a failed sync leaves the file's state
    /// unknown): the first failure's reason.
    poisoned: OnceLock<String>,
}

/// One record of the file: one group commit.
#[derive(Clone, Copy, Debug)]
struct RecordAt {
    first_position: u64,
    last_position: u64,
    /// Where the record's frame starts in the file.
    offset: u64,
    /// The body's length (the frame's bytes follow `offset`).
    body_len: u32,
    recorded_at: i64,
}

/// Consecutive revisions of one stream at consecutive positions (one append).
#[derive(Clone, Copy, Debug)]
struct Run {
    first_revision: Revision,
    first_position: u64,
    count: u64,
}

impl Run {
    fn last_revision(&self) -> Revision {
        self.first_revision + self.count - 1
    }

    fn position_of(&self, revision: Revision) -> u64 {
        self.first_position + (revision - self.first_revision)
    }
}

/// Every index, as of the durable head.
struct Index {
    records: Vec<RecordAt>,
    streams: ShardedMap<Arc<str>, Vec<Run>>,
    ids: ShardedMap<Uuid, IdLocation>,
    claims: ShardedMap<String, String>,
    last_position: u64,
    last_hash: [u8; 32],
    last_recorded_at: i64,
    /// Where the next record goes.
    end_offset: u64,
    /// The bodies of the most recent records, oldest first, with their first positions.
    recent: VecDeque<(u64, Arc<AlignedVec<16>>)>,
    recent_bytes: usize,
}

impl Index {
    fn empty() -> Index {
        Index {
            records: Vec::new(),
            streams: ShardedMap::default(),
            ids: ShardedMap::default(),
            claims: ShardedMap::default(),
            last_position: 0,
            last_hash: GENESIS_PREV_HASH,
            last_recorded_at: i64::MIN,
            end_offset: HEADER.len() as u64,
            recent: VecDeque::new(),
            recent_bytes: 0,
        }
    }

    /// The index of the record holding `position`, if the log reaches it.
    fn record_of(&self, position: u64) -> Option<usize> {
        let at = self
            .records
            .partition_point(|record| record.last_position < position);
        (at < self.records.len() && self.records[at].first_position <= position).then_some(at)
    }

    /// The stream's key as the index holds it, shared by its id entries.
    fn stream_key(&mut self, stream: &str) -> Arc<str> {
        match self.streams.get_key_value(stream) {
            Some((key, _)) => Arc::clone(key),
            None => {
                let key: Arc<str> = Arc::from(stream);
                self.streams.insert(Arc::clone(&key), Vec::new());
                key
            }
        }
    }

    /// Adds one validated record: its events (already checked to follow the log) and claims.
    fn add_record(
        &mut self,
        record: RecordAt,
        view: &BatchView<'_>,
        claims: &[ClaimChange],
    ) -> Result<()> {
        let corrupt = |position: u64, reason: String| Error::Corrupt {
            position: Position(position),
            reason,
        };
        if record.first_position != self.last_position + 1 {
            return Err(corrupt(
                record.first_position,
                format!("the log jumps from position {}", self.last_position),
            ));
        }
        if record.recorded_at < self.last_recorded_at {
            return Err(corrupt(
                record.first_position,
                "recorded_at goes backwards".into(),
            ));
        }
        let mut current: Option<(Arc<str>, Run)> = None;
        for index in 0..view.len() {
            let event = view.event(index)?;
            let expected_revision = match &current {
                Some((stream, run)) if &**stream == event.stream => run.last_revision() + 1,
                _ => self
                    .streams
                    .get(event.stream)
                    .and_then(|runs| runs.last())
                    .map_or(1, |run| run.last_revision() + 1),
            };
            if event.revision != expected_revision {
                return Err(corrupt(
                    event.position.0,
                    format!(
                        "stream {} jumps to revision {} where {expected_revision} is next",
                        event.stream, event.revision
                    ),
                ));
            }
            if event.prev_hash != &self.last_hash {
                return Err(corrupt(
                    event.position.0,
                    "the previous hash does not match the chain".into(),
                ));
            }
            let extends = current.as_ref().is_some_and(|(stream, run)| {
                &**stream == event.stream
                    && run.last_revision() + 1 == event.revision
                    && run.first_position + run.count == event.position.0
            });
            if extends {
                if let Some((_, run)) = current.as_mut() {
                    run.count += 1;
                }
            } else {
                if let Some((stream, run)) = current.take() {
                    self.streams.entry(stream).or_default().push(run);
                }
                let stream = self.stream_key(event.stream);
                current = Some((
                    stream,
                    Run {
                        first_revision: event.revision,
                        first_position: event.position.0,
                        count: 1,
                    },
                ));
            }
            let stream = current
                .as_ref()
                .map(|(stream, _)| Arc::clone(stream))
                .unwrap_or_else(|| Arc::from(event.stream));
            self.ids.insert(
                event.id,
                IdLocation {
                    stream,
                    position: event.position.0,
                    revision: event.revision,
                },
            );
            self.last_hash = *event.hash;
        }
        if let Some((stream, run)) = current.take() {
            self.streams.entry(stream).or_default().push(run);
        }
        for change in claims {
            match &change.owner {
                Some(owner) => self.claims.insert(change.key.clone(), owner.clone()),
                None => self.claims.remove(&change.key),
            };
        }
        self.last_position = record.last_position;
        self.last_recorded_at = record.recorded_at;
        self.end_offset = record.offset + FRAME_BYTES as u64 + u64::from(record.body_len);
        self.records.push(record);
        Ok(())
    }

    fn remember(&mut self, first_position: u64, body: Arc<AlignedVec<16>>, bytes_max: usize) {
        self.recent_bytes += body.len();
        self.recent.push_back((first_position, body));
        while self.recent_bytes > bytes_max && self.recent.len() > 1 {
            if let Some((_, old)) = self.recent.pop_front() {
                self.recent_bytes -= old.len();
            }
        }
    }

    fn recent_body(&self, first_position: u64) -> Option<Arc<AlignedVec<16>>> {
        // Kept in position order: a binary search.
        let at = self
            .recent
            .binary_search_by_key(&first_position, |(first, _)| *first)
            .ok()?;
        self.recent.get(at).map(|(_, body)| Arc::clone(body))
    }
}

impl fmt::Debug for FileLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileLog")
            .field("path", &self.inner.path)
            .field("head", &self.inner.durable.get())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl FileLog {
    /// Opens (creating if needed) the log in directory `dir`, with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<FileLog> {
        FileLog::open_with(dir, FileOptions::default())
    }

    /// Opens (creating if needed) the log in directory `dir`: reads and validates every record,
    /// cuts off an unacknowledged torn last record, rebuilds the indexes, and starts the
    /// committer thread.
    pub fn open_with(dir: impl AsRef<Path>, options: FileOptions) -> Result<FileLog> {
        FileLog::open_mode(dir.as_ref(), options, Mode::Write)
    }

    /// Opens the existing log in directory `dir` to read and verify it, changing nothing on
    /// disk: the file is opened read-only under a shared lock (a writer holding it is refused,
    /// and none can open it meanwhile), every record is read and validated as
    /// [`open_with`](Self::open_with) does and the head record checked, but a torn last record
    /// is left in place and reported in [`OpenReport::torn_tail`] (the log then ends at the
    /// last whole record), no header is written to an empty file, no committer runs, appends
    /// and imports are refused with [`Error::Unavailable`], and closing writes no head record.
    /// What `vmplane admin verify` opens.
    pub fn open_read_only(dir: impl AsRef<Path>, options: FileOptions) -> Result<FileLog> {
        FileLog::open_mode(dir.as_ref(), options, Mode::ReadOnly)
    }

    fn open_mode(dir: &Path, options: FileOptions, mode: Mode) -> Result<FileLog> {
        let io = |context: &'static str| move |source| Error::Io { context, source };
        let path = dir.join(LOG_FILE);
        if mode == Mode::ReadOnly {
            let file = File::open(&path).map_err(io("opening the log file to read it"))?;
            lock_file(&file, &path, libc::LOCK_SH)?;
            return FileLog::open_file(dir, path, file, options, mode);
        }
        std::fs::create_dir_all(dir).map_err(io("creating the log's directory"))?;
        let created = !path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("opening the log file"))?;
        lock_file(&file, &path, libc::LOCK_EX)?;
        if created
            || file
                .metadata()
                .map_err(io("reading the log file's size"))?
                .len()
                == 0
        {
            file.write_all_at(HEADER, 0)
                .map_err(io("writing the log file's header"))?;
            file.sync_all().map_err(io("syncing the new log file"))?;
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io("syncing the log's directory"))?;
        }
        FileLog::open_file(dir, path, file, options, mode)
    }

    /// Reads the opened, locked `file` into the indexes; see [`FileLog::open_with`] and
    /// [`FileLog::open_read_only`].
    fn open_file(
        dir: &Path,
        path: PathBuf,
        file: File,
        options: FileOptions,
        mode: Mode,
    ) -> Result<FileLog> {
        let io = |context: &'static str| move |source| Error::Io { context, source };
        let mut index = Index::empty();
        let empty = file
            .metadata()
            .map_err(io("reading the log file's size"))?
            .len()
            == 0;
        let (mut opened, torn) = if empty && mode == Mode::ReadOnly {
            // A file created but never given its header: a new, empty log (a writable open
            // writes the header).
            (
                OpenReport {
                    events: 0,
                    records: 0,
                    torn_tail_bytes: 0,
                    torn_tail: None,
                },
                None,
            )
        } else {
            record::load(&file, &mut index)?
        };
        // Before anything is cut: a record the head record says was committed is never taken
        // for a torn write.
        let head_record = HeadRecord::new(dir);
        head_record.check(index.last_position, |position| {
            let Some(at) = index.record_of(position) else {
                return Ok(None);
            };
            let record = index.records[at];
            let body = record::read_body(&file, &record)?;
            let view = record::view(&body, &record)?;
            Ok(Some(
                *view
                    .event((position - record.first_position) as usize)?
                    .hash,
            ))
        })?;
        if let Some(torn) = &torn {
            let cut = mode == Mode::Write;
            if cut {
                record::cut_tail(&file, torn, opened.torn_tail_bytes)?;
                tracing::warn!(
                    path = %path.display(),
                    bytes = opened.torn_tail_bytes,
                    "cut off a partly written last record (a commit that was never acknowledged)"
                );
            }
            opened.torn_tail = Some(TornTail {
                offset: torn.offset,
                bytes: opened.torn_tail_bytes,
                reason: torn.reason,
                positions: torn.positions,
                cut,
            });
        }
        let room_end = file
            .metadata()
            .map_err(io("reading the log file's size"))?
            .len();
        let head = index.last_position;
        let tips = Tips::default();
        for (stream, runs) in index.streams.iter() {
            if let Some(run) = runs.last() {
                tips.set(stream, run.last_revision());
            }
        }
        let inner = Arc::new(Inner {
            path,
            file,
            options,
            index: RwLock::new(index),
            queue: Mutex::new(Queue::default()),
            company: Condvar::new(),
            bell: Committer::default(),
            durable: DurableHead::new(head),
            head_record,
            fences: LocalFences::default(),
            commits: AtomicU64::new(0),
            room_end: AtomicU64::new(room_end),
            tips,
            poisoned: OnceLock::new(),
        });
        if mode == Mode::ReadOnly {
            let _ = inner.poisoned.set(format!(
                "{} was opened read-only (to verify it): appends are refused",
                inner.path.display()
            ));
            return Ok(FileLog {
                inner,
                committer: None,
                opened,
            });
        }
        let committer = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("log committer".into())
                .spawn(move || {
                    // Woken by every append that finds it idle: it must not take the
                    // processor from the runtime worker that queued the append.
                    crate::threads::run_this_thread_under(crate::threads::Policy::Batch);
                    inner.run_committer();
                })
                .map_err(io("starting the log's committer thread"))?
        };
        Ok(FileLog {
            inner,
            committer: Some(committer),
            opened,
        })
    }

    /// What opening found: events, records, and a torn last record cut off.
    #[must_use]
    pub fn open_report(&self) -> OpenReport {
        self.opened
    }

    /// The log file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Durable commits (one `fdatasync` each) since open.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.inner.commits.load(Ordering::Relaxed)
    }

    /// Where the last durable record ends in the file: the file is longer when the committer
    /// has written zeroed room after it.
    #[must_use]
    pub fn records_end(&self) -> u64 {
        self.inner.index().end_offset
    }

    /// Bytes the log takes on disk.
    pub fn size_on_disk_bytes(&self) -> Result<u64> {
        self.inner
            .file
            .metadata()
            .map(|meta| meta.len())
            .map_err(|source| Error::Io {
                context: "reading the log file's size",
                source,
            })
    }

    /// Begins a new term of leadership `name` in this process and returns its fence; appends
    /// fenced by an earlier term of `name` fail with [`Error::Fenced`] from now on. One process
    /// holds a file log (the file is locked), so its leader is whoever asks here.
    pub fn take_fence(&self, name: &str) -> Fence {
        self.inner.fences.take(name)
    }
}

impl Drop for FileLog {
    fn drop(&mut self) {
        // The committer finishes what is queued, then ends; the file closes (and its lock goes)
        // with the last handle.
        {
            let mut queue = lock(&self.inner.queue);
            queue.closed = true;
            queue.awaited = 0;
        }
        self.inner.company.notify_one();
        self.inner.bell.close();
        if let Some(thread) = self.committer.take() {
            let _ = thread.join();
        }
        let (position, hash) = {
            let index = self.inner.index();
            (index.last_position, index.last_hash)
        };
        let poisoned = self.inner.poisoned.get().is_some();
        if !poisoned && let Err(err) = self.inner.head_record.write(position, hash) {
            tracing::warn!(%err, "could not record the head at close");
        }
    }
}

impl Inner {
    fn durable_head(&self) -> u64 {
        self.durable.get()
    }

    fn index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue_append(&self, request: AppendRequest) -> Result<Arc<Slot>> {
        check_request(&self.options.limits, &request)?;
        if let Some(reason) = self.poisoned.get() {
            return Err(Error::Unavailable {
                reason: reason.clone(),
            });
        }
        let slot = Arc::new(Slot::default());
        let (was_empty, company) = {
            let mut queue = lock(&self.queue);
            queue.pending.push_back(commit::Pending {
                request,
                slot: Arc::clone(&slot),
            });
            let len = queue.pending.len();
            let company = queue.awaited != 0 && len >= queue.awaited;
            if company {
                queue.awaited = 0;
            }
            (len == 1, company)
        };
        if was_empty {
            self.bell.want();
        }
        if company {
            self.company.notify_one();
        }
        Ok(slot)
    }

    fn append(&self, request: AppendRequest) -> Result<AppendResult> {
        let slot = self.queue_append(request)?;
        slot.wait().unwrap_or_else(|| {
            Err(Error::Unavailable {
                reason: "the committer asked an appender to lead".into(),
            })
        })
    }

    /// The body of the record at `record` (from memory if recent, else read and checked).
    fn body(&self, record: &RecordAt) -> Result<Arc<AlignedVec<16>>> {
        if let Some(body) = self.index().recent_body(record.first_position) {
            return Ok(body);
        }
        record::read_body(&self.file, record).map(Arc::new)
    }

    /// The records holding positions `after + 1 ..= last`.
    fn records_after(&self, after: u64, last: u64) -> Vec<RecordAt> {
        let index = self.index();
        let start = index
            .records
            .partition_point(|record| record.last_position <= after);
        index.records[start..]
            .iter()
            .take_while(|record| record.first_position <= last)
            .copied()
            .collect()
    }

    /// Visits every event after `after` up to `last`, in order; returns the last visited.
    fn visit_range(&self, after: u64, last: u64, visit: Visitor<'_>) -> Result<u64> {
        let mut visited = after;
        for record in self.records_after(after, last) {
            let body = self.body(&record)?;
            let view = record::view(&body, &record)?;
            let mut stopped = false;
            view.visit(after, last, &mut |event| {
                visited = event.position.0;
                let flow = visit(event);
                stopped = flow.is_break();
                flow
            })?;
            if stopped {
                break;
            }
        }
        Ok(visited)
    }

    fn read_stream(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>> {
        let max_count = max_count.min(self.options.limits.read_events_max);
        let mut events = Vec::new();
        if max_count == 0 {
            return Ok(events);
        }
        let head = self.durable_head();
        let positions: Vec<(u64, Revision)> = {
            let index = self.index();
            let Some(runs) = index.streams.get(stream) else {
                return Ok(events);
            };
            let mut positions = Vec::new();
            match direction {
                Direction::Forward => {
                    let from = from.max(1);
                    let start = runs.partition_point(|run| run.last_revision() < from);
                    'runs: for run in &runs[start..] {
                        for revision in run.first_revision.max(from)..=run.last_revision() {
                            positions.push((run.position_of(revision), revision));
                            if positions.len() >= max_count {
                                break 'runs;
                            }
                        }
                    }
                }
                Direction::Backward => {
                    let end = runs.partition_point(|run| run.first_revision <= from);
                    'runs: for run in runs[..end].iter().rev() {
                        for revision in (run.first_revision..=run.last_revision().min(from)).rev() {
                            positions.push((run.position_of(revision), revision));
                            if positions.len() >= max_count {
                                break 'runs;
                            }
                        }
                    }
                }
            }
            positions
        };
        let mut cached: Option<(RecordAt, Arc<AlignedVec<16>>)> = None;
        for (position, revision) in positions {
            if position > head {
                continue;
            }
            let held = cached.as_ref().is_some_and(|(record, _)| {
                record.first_position <= position && position <= record.last_position
            });
            if !held {
                let record = {
                    let index = self.index();
                    index.record_of(position).map(|at| index.records[at])
                };
                let Some(record) = record else {
                    return Err(Error::Corrupt {
                        position: Position(position),
                        reason: "the stream index points past every record".into(),
                    });
                };
                cached = Some((record, self.body(&record)?));
            }
            let Some((record, body)) = &cached else {
                continue;
            };
            let view = record::view(body, record)?;
            let event = view.event((position - record.first_position) as usize)?;
            if event.stream != stream || event.revision != revision {
                return Err(Error::Corrupt {
                    position: Position(position),
                    reason: format!(
                        "the stream index says {stream}@{revision}, the event is {}@{}",
                        event.stream, event.revision
                    ),
                });
            }
            events.push(event.to_owned_event());
        }
        Ok(events)
    }

    fn verify(&self, validate_payload: PayloadValidator<'_>) -> Result<VerifyReport> {
        let head = self.durable_head();
        let mut walk = VerifyWalk::new(validate_payload);
        for record in self.records_after(0, head) {
            if record.first_position != walk.next_position() {
                return Err(Error::Corrupt {
                    position: Position(walk.next_position()),
                    reason: format!(
                        "gap in the log: the next record starts at {}",
                        record.first_position
                    ),
                });
            }
            // From the file, not the recent records in memory: verify checks what is stored.
            let body = record::read_body(&self.file, &record)?;
            let view = record::view(&body, &record)?;
            for at in 0..view.len() {
                walk.check(&view.event(at)?)?;
            }
        }
        walk.finish(head)
    }
}

impl EventLog for FileLog {
    fn append(&self, request: AppendRequest) -> Result<AppendResult> {
        self.inner.append(request)
    }

    fn append_fenced(&self, request: AppendRequest, fence: &Fence) -> Result<AppendResult> {
        self.inner
            .fences
            .append(request, fence, |request| self.inner.append(request))
    }

    fn submit(&self, request: AppendRequest) -> Submitted {
        match self.inner.queue_append(request) {
            Ok(slot) => Submitted::Pending(PendingAppend::new(SlotFuture(slot))),
            Err(err) => Submitted::Pending(PendingAppend::new(std::future::ready(Err(err)))),
        }
    }

    fn submits(&self) -> bool {
        true
    }

    fn read_stream(
        &self,
        stream: &str,
        from: Revision,
        direction: Direction,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>> {
        self.inner.read_stream(stream, from, direction, max_count)
    }

    fn read_all(&self, after: Position, max_count: usize) -> Result<Vec<RecordedEvent>> {
        read_all_by_scan(&self.inner.options.limits, max_count, |visit| {
            self.inner
                .visit_range(after.0, self.inner.durable_head(), visit)
        })
    }

    fn scan(&self, after: Position, visit: Visitor<'_>) -> Result<Position> {
        self.inner
            .visit_range(after.0, self.inner.durable_head(), visit)
            .map(Position)
    }

    fn read_event(&self, position: Position) -> Result<Option<RecordedEvent>> {
        if position.0 == 0 || position.0 > self.inner.durable_head() {
            return Ok(None);
        }
        let record = {
            let index = self.inner.index();
            index.record_of(position.0).map(|at| index.records[at])
        };
        let Some(record) = record else {
            return Err(Error::Corrupt {
                position,
                reason: "no record holds it".into(),
            });
        };
        let body = self.inner.body(&record)?;
        let view = record::view(&body, &record)?;
        Ok(Some(
            view.event((position.0 - record.first_position) as usize)?
                .to_owned_event(),
        ))
    }

    fn position_at(&self, at: Timestamp) -> Result<Position> {
        let head = self.inner.durable_head();
        let index = self.inner.index();
        let before = index
            .records
            .partition_point(|record| record.recorded_at <= at.0);
        Ok(Position(match before {
            0 => 0,
            n => index.records[n - 1].last_position.min(head),
        }))
    }

    fn head(&self) -> Position {
        Position(self.inner.durable_head())
    }

    fn wait_for(&self, position: Position, timeout: Duration) -> Result<Position> {
        Ok(self.inner.durable.wait_for(position, timeout))
    }

    fn stream_revision(&self, stream: &str) -> Result<Option<Revision>> {
        Ok(self.inner.tips.get(stream))
    }

    fn claim_holder(&self, key: &str) -> Result<Option<String>> {
        Ok(self.inner.index().claims.get(key).cloned())
    }

    fn verify(&self, validate_payload: PayloadValidator<'_>) -> Result<VerifyReport> {
        self.inner.verify(validate_payload)
    }

    fn limits(&self) -> &Limits {
        &self.inner.options.limits
    }
}

/// How a [`FileLog`] is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// To append: creates what is missing, cuts a torn last record off, runs the committer.
    Write,
    /// To read and verify: changes nothing on disk ([`FileLog::open_read_only`]).
    ReadOnly,
}

/// Takes the file's lock (`LOCK_EX` to write, `LOCK_SH` to read only), or says who holds it.
fn lock_file(file: &File, path: &Path, how: libc::c_int) -> Result<()> {
    // SAFETY: flock on a descriptor this process owns; it changes no memory.
    let locked = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
    if locked == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.kind() == std::io::ErrorKind::WouldBlock {
        return Err(Error::Unavailable {
            reason: format!(
                "{} is in use by another process (a running `vmplane serve`?): stop it first, or \
                 work on a copy",
                path.display()
            ),
        });
    }
    Err(Error::Io {
        context: "locking the log file",
        source: err,
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
