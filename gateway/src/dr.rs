//! Disaster recovery: `vmplane admin backup`, `admin restore` and `admin verify`.
//!
//! # The backup file (format version 1)
//!
//! One file, self-verifying, written to `FILE.tmp`, fsynced, then renamed to `FILE`:
//!
//! ```text
//! magic            8 bytes  "VMPLBKUP"
//! format version   u16 BE   1
//! records          each:  tag u8 | length u32 BE | body (length bytes)
//!   tag 0x01  header   (first record)  JSON {"format_version", "event_count", "first_position",
//!                      "last_position", "created_at", "server_version"}
//!   tag 0x02  event    (event_count of them, positions first..=last, gapless, in order)
//!                      position u64 | revision u64 | recorded_at i64 (unix nanos) | id 16 |
//!                      correlation_id 16 | causation 0x00, or 0x01 then 16 bytes |
//!                      schema_version u16 | prev_hash 32 | hash 32 |
//!                      stream, actor, event_type: each u32 length + UTF-8 |
//!                      payload: u32 length + bytes          (all integers big-endian)
//!   tag 0x03  trailer  (last record, then end of file) JSON {"event_count", "last_hash" (hex,
//!                      the chain hash of the last event, zeros for an empty log),
//!                      "body_sha256" (hex SHA-256 of every byte of the file before the
//!                      trailer record)}
//! ```
//!
//! A reader checks the magic, refuses a version it does not know, checks that the body hashes to
//! `body_sha256`, that every event's hash is `store::hash::event_hash` of its envelope and chains
//! from the one before (the first from zeros), that positions are gapless from 1, and that the
//! count and last hash agree with header and trailer. Records with a tag ≥ 0x80 are optional
//! extensions: a reader that does not know them skips them (they are still covered by
//! `body_sha256`); an unknown tag below 0x80 is refused. Future versions keep this framing.
//!
//! # Restore
//!
//! `admin restore --from FILE --data DIR` builds a new data directory, or fills an existing
//! empty one (an empty mount point, say: semantics §7, "restore into an empty data
//! directory"), one restore at a time per directory: it takes an advisory lock
//! ([`RestoreLock`], `.DIR.restore-lock` beside `DIR`, released by the kernel however the
//! process ends) and refuses a `DIR` that holds anything, naming what is in it. A new `DIR` is
//! built as `DIR.tmp-<uuid>` beside it and renamed to `DIR` only when complete. An empty `DIR`
//! is built in `DIR/.vmplane-restore-<uuid>` (inside, so on the file system of a mount point's
//! contents), then its entries are moved in, the log's own file (`db` or `events.vpl`) last,
//! with their names recorded first in `DIR/.vmplane-restore-moving`; a failure moves back
//! what was moved. Either way a failure removes the staging directory and leaves `DIR` as it
//! was, and a later restore removes what one that crashed left (staging directories beside or
//! inside `DIR`, and the entries a crash in the middle of the moves left, as recorded, while
//! the log's own file is not there yet).
//!
//! A restore keeps each commit whole. The backup records no commit boundaries, but the events
//! of one append share their stream and the instant their group commit was recorded at, at
//! consecutive positions and revisions: `--to-position P` inside such a run is refused, naming
//! the run's first and last positions and both boundaries to use instead (two appends of one
//! stream in one group commit cannot be told apart from one: a cut between them is refused
//! too). `--to-time T` keeps the events recorded at or before `T`, and a commit's events share
//! one instant, so it never splits one.
//!
//! The events are imported with the store's bulk importer
//! ([`vmplane_store::sled_log::Importer`]): each envelope keeps its position, revision, id,
//! time, actor, correlation/causation ids and hashes, and is checked as the append path would
//! have made it (next position, previous hash, its own hash, the stream's next revision,
//! non-decreasing time, an unused id, the limits, and the firmware-UUID claims `core` attached
//! to it, re-derived from the events); many events share one durable sync. The file is checked
//! while it is read (chain, counts, body checksum, trailer); anything wrong removes the staging
//! directory. Then the projections are built and checkpointed and `DIR/restore.json` (a
//! [`RestoreMarker`]) is written.
//!
//! # Positions never go backwards for watchers
//!
//! A full restore reproduces the log exactly, so every position a client saw means the same
//! event. A point-in-time restore (`--to-position P` / `--to-time T`) of a backup ending at `L`
//! keeps positions `1..=P` as they were and fills `P+1..=L` with one `LogPositionVoided` event
//! each (core's event type, on the system stream `system/restore/<epoch>`, revisions from 1),
//! recording the restore epoch, the cut, and the original event's position, id, chain hash,
//! stream, type, version, actor and time: the log stays gapless and hash-chained, the audit
//! keeps a tamper-evident trace of what was undone, and the next position handed out is
//! `L + 1`, above every position the backed-up server could have shown. Read models skip the
//! system stream (it names no object). A watch from a voided position is refused with
//! `FAILED_PRECONDITION` naming the epoch and the cut (Kubernetes' "410 Gone": re-list, then
//! watch from the list's resourceVersion); a watch from a position ≤ `P` continues, and its
//! next event is above `L`. The void events are ordinary events: a backup of the restored log
//! carries them and restores them as they are. `restore.json` and `Admin.LogInfo`
//! (`restore_epoch`, `restore_cut_position`) still report the epoch and the cut.
//!
//! (Positions a server handed out after the backup was taken are beyond what a restore can
//! know: a client that watched past the backup's last position must re-list when
//! `restore_epoch` changes.)
//!
//! # Verify
//!
//! `admin verify --data DIR` checks and never repairs: it writes nothing to `DIR` (see
//! [`verify`]: a file log is opened read-only, a sled log on a copy of its files, since opening
//! sled writes to its directory). It reports, and exits non-zero on, a damaged log (the first
//! bad position), a file log's torn or damaged last record (where it starts, its bytes, the
//! positions it would hold, and that `serve` would cut it off), and a projection checkpoint
//! `serve` would discard (why, as `serve` says it). A missing checkpoint is not damage (a
//! cache not written yet: a server killed before its first checkpoint leaves none, and `serve`
//! rebuilds it): the `ok` line says there is none. On a terminal, each long phase shows its
//! progress on stderr (copying sled's files, opening the log, the walk of the chain, loading and
//! rebuilding the projections); on a pipe, nothing but the result.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;
use vmplane_projections::projections::READ_MODEL;
use vmplane_store::hash::{GENESIS_PREV_HASH, event_hash};
use vmplane_store::sled_log::ImportOptions;
use vmplane_store::{
    Claim, EventLog, FileLog, Position, RecordedEvent, RecordedEventRef, SledLog, Timestamp,
};

use crate::cli::Backend;

use crate::pb;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"VMPLBKUP";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
const TAG_HEADER: u8 = 0x01;
const TAG_EVENT: u8 = 0x02;
const TAG_TRAILER: u8 = 0x03;
/// Largest record accepted when reading (an event is bounded by the store's limits far below).
const RECORD_BYTES_MAX: u32 = 64 << 20;
/// The restore marker's file name inside a data directory.
pub const RESTORE_MARKER: &str = "restore.json";

/// The header record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The format version (also in the preamble).
    pub format_version: u16,
    /// Events in the file.
    pub event_count: u64,
    /// The first event's position (0 when empty).
    pub first_position: u64,
    /// The last event's position (0 when empty).
    pub last_position: u64,
    /// When the backup was taken (RFC 3339).
    pub created_at: String,
    /// The server version that served it.
    pub server_version: String,
}

/// The trailer record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    /// Events in the file.
    pub event_count: u64,
    /// The last event's chain hash (hex).
    pub last_hash: String,
    /// SHA-256 of every byte before the trailer record (hex).
    pub body_sha256: String,
}

/// What a restore leaves in the data directory (`restore.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreMarker {
    /// A fresh id per restore.
    pub epoch: String,
    /// The backup's last position.
    pub backup_last_position: u64,
    /// The last position kept, when the restore cut the log before the backup's end.
    pub cut_position: Option<u64>,
    /// The chain hash at the restored head (hex).
    pub head_hash: String,
    /// When the restore ran (RFC 3339).
    pub restored_at: String,
    /// The stream of the `LogPositionVoided` events filling the positions after the cut
    /// (`system/restore/<epoch>`), when there was a cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub void_stream: Option<String>,
}

impl RestoreMarker {
    /// The marker of `data`, if a restore made it.
    pub fn read(data: &Path) -> anyhow::Result<Option<RestoreMarker>> {
        let path = data.join(RESTORE_MARKER);
        match fs::read(&path) {
            Ok(bytes) => {
                Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                    format!("{}: not a restore marker", path.display())
                })?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}

/// A stored event as a protobuf message.
#[must_use]
pub fn to_pb(e: &RecordedEvent) -> pb::LogEvent {
    ref_to_pb(&e.as_ref())
}

/// A stored event, as a log's scan visits it in place, as a protobuf message.
#[must_use]
pub fn ref_to_pb(e: &RecordedEventRef<'_>) -> pb::LogEvent {
    pb::LogEvent {
        position: e.position.0,
        stream: e.stream.to_owned(),
        revision: e.revision,
        id: e.id.as_bytes().to_vec(),
        recorded_at_unix_nanos: e.recorded_at.0,
        actor: e.actor.to_owned(),
        correlation_id: e.correlation_id.as_bytes().to_vec(),
        causation_id: e
            .causation_id
            .map(|c| c.as_bytes().to_vec())
            .unwrap_or_default(),
        event_type: e.event_type.to_owned(),
        schema_version: u32::from(e.schema_version),
        payload: e.payload.to_vec(),
        prev_hash: e.prev_hash.to_vec(),
        hash: e.hash.to_vec(),
    }
}

/// The protobuf message back as a stored event (its hash is not checked here).
pub fn from_pb(e: pb::LogEvent) -> anyhow::Result<RecordedEvent> {
    let uuid = |b: &[u8], what: &str| {
        Uuid::from_slice(b).map_err(|_| anyhow!("position {}: bad {what}", e.position))
    };
    let hash = |b: &[u8], what: &str| {
        <[u8; 32]>::try_from(b).map_err(|_| anyhow!("position {}: bad {what}", e.position))
    };
    Ok(RecordedEvent {
        position: Position(e.position),
        revision: e.revision,
        id: uuid(&e.id, "id")?,
        recorded_at: Timestamp(e.recorded_at_unix_nanos),
        correlation_id: uuid(&e.correlation_id, "correlation id")?,
        causation_id: if e.causation_id.is_empty() {
            None
        } else {
            Some(uuid(&e.causation_id, "causation id")?)
        },
        schema_version: u16::try_from(e.schema_version)
            .map_err(|_| anyhow!("position {}: bad schema version", e.position))?,
        prev_hash: hash(&e.prev_hash, "previous hash")?,
        hash: hash(&e.hash, "hash")?,
        stream: e.stream,
        actor: e.actor,
        event_type: e.event_type,
        payload: e.payload,
    })
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(s);
}

/// Encodes an event record's body.
fn encode_event(e: &RecordedEvent, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&e.position.0.to_be_bytes());
    out.extend_from_slice(&e.revision.to_be_bytes());
    out.extend_from_slice(&e.recorded_at.0.to_be_bytes());
    out.extend_from_slice(e.id.as_bytes());
    out.extend_from_slice(e.correlation_id.as_bytes());
    match e.causation_id {
        None => out.push(0),
        Some(c) => {
            out.push(1);
            out.extend_from_slice(c.as_bytes());
        }
    }
    out.extend_from_slice(&e.schema_version.to_be_bytes());
    out.extend_from_slice(&e.prev_hash);
    out.extend_from_slice(&e.hash);
    put_str(out, e.stream.as_bytes());
    put_str(out, e.actor.as_bytes());
    put_str(out, e.event_type.as_bytes());
    put_str(out, &e.payload);
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        if self.0.len() < n {
            bail!("event record truncated");
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> anyhow::Result<[u8; N]> {
        Ok(<[u8; N]>::try_from(self.take(N)?).unwrap_or([0; N]))
    }
    fn bytes(&mut self) -> anyhow::Result<&'a [u8]> {
        let len = u32::from_be_bytes(self.array()?) as usize;
        self.take(len)
    }
    fn string(&mut self) -> anyhow::Result<String> {
        Ok(std::str::from_utf8(self.bytes()?)
            .context("event record: a string is not UTF-8")?
            .to_owned())
    }
}

/// Decodes an event record's body.
fn decode_event(body: &[u8]) -> anyhow::Result<RecordedEvent> {
    let mut c = Cursor(body);
    let position = Position(u64::from_be_bytes(c.array()?));
    let revision = u64::from_be_bytes(c.array()?);
    let recorded_at = Timestamp(i64::from_be_bytes(c.array()?));
    let id = Uuid::from_bytes(c.array()?);
    let correlation_id = Uuid::from_bytes(c.array()?);
    let causation_id = match c.array::<1>()?[0] {
        0 => None,
        1 => Some(Uuid::from_bytes(c.array()?)),
        other => bail!("event record: bad causation flag {other}"),
    };
    let schema_version = u16::from_be_bytes(c.array()?);
    let prev_hash = c.array()?;
    let hash = c.array()?;
    let stream = c.string()?;
    let actor = c.string()?;
    let event_type = c.string()?;
    let payload = c.bytes()?.to_vec();
    if !c.0.is_empty() {
        bail!("event record: {} trailing bytes", c.0.len());
    }
    Ok(RecordedEvent {
        position,
        stream,
        revision,
        id,
        recorded_at,
        actor,
        correlation_id,
        causation_id,
        event_type,
        schema_version,
        payload,
        prev_hash,
        hash,
    })
}

/// Checks `event` continues a chain whose last position and hash are `prev`.
fn check_link(prev: (u64, [u8; 32]), event: &RecordedEvent) -> anyhow::Result<()> {
    let p = event.position.0;
    if p != prev.0 + 1 {
        bail!(
            "expected position {} but found {p}: positions are not gapless",
            prev.0 + 1
        );
    }
    if event.prev_hash != prev.1 {
        bail!("position {p}: the previous hash does not match the chain");
    }
    if event_hash(&event.as_ref()) != event.hash {
        bail!("position {p}: the event's hash does not match its content");
    }
    Ok(())
}

/// Writes a backup file: `FILE.tmp`, fsynced, renamed to `FILE`, directory fsynced. Dropped
/// unfinished (an error, a server gone in the middle of the backup), it removes `FILE.tmp`:
/// `FILE` is only ever a whole backup.
pub struct BackupWriter {
    path: PathBuf,
    tmp: RemovedUnlessKept,
    out: BufWriter<File>,
    sha: Sha256,
    scratch: Vec<u8>,
    header: Header,
    written: u64,
    last: (u64, [u8; 32]),
    /// Bytes written so far.
    pub bytes: u64,
}

impl BackupWriter {
    /// Starts `path` (as `path.tmp`) with `header`.
    pub fn create(path: &Path, header: Header) -> anyhow::Result<BackupWriter> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = BackupWriter {
            path: path.to_path_buf(),
            tmp: RemovedUnlessKept(Some(tmp)),
            out: BufWriter::with_capacity(1 << 20, file),
            sha: Sha256::new(),
            scratch: Vec::new(),
            header: header.clone(),
            written: 0,
            last: (0, GENESIS_PREV_HASH),
            bytes: 0,
        };
        let mut preamble = MAGIC.to_vec();
        preamble.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
        w.raw(&preamble)?;
        w.record(TAG_HEADER, &serde_json::to_vec(&header)?)?;
        Ok(w)
    }

    fn raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.sha.update(bytes);
        self.bytes += bytes.len() as u64;
        self.out.write_all(bytes).context("writing the backup")
    }

    fn record(&mut self, tag: u8, body: &[u8]) -> anyhow::Result<()> {
        let len = u32::try_from(body.len()).context("record too large")?;
        let mut framing = [0u8; 5];
        framing[0] = tag;
        framing[1..].copy_from_slice(&len.to_be_bytes());
        self.raw(&framing)?;
        self.raw(body)
    }

    /// Appends the next event, checking it continues the chain.
    pub fn event(&mut self, e: &RecordedEvent) -> anyhow::Result<()> {
        check_link(self.last, e)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        encode_event(e, &mut scratch);
        self.record(TAG_EVENT, &scratch)?;
        self.scratch = scratch;
        self.last = (e.position.0, e.hash);
        self.written += 1;
        Ok(())
    }

    /// Events written so far.
    #[must_use]
    pub fn events(&self) -> u64 {
        self.written
    }

    /// Writes the trailer, syncs and renames. Refuses if the count differs from the header's
    /// (and removes `FILE.tmp`).
    pub fn finish(mut self) -> anyhow::Result<u64> {
        if self.written != self.header.event_count || self.last.0 != self.header.last_position {
            bail!(
                "the backup ended at position {} after {} events; expected {} events up to {}",
                self.last.0,
                self.written,
                self.header.event_count,
                self.header.last_position
            );
        }
        let trailer = Trailer {
            event_count: self.written,
            last_hash: hex::encode(self.last.1),
            body_sha256: hex::encode(self.sha.clone().finalize()),
        };
        self.record(TAG_TRAILER, &serde_json::to_vec(&trailer)?)?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all().context("fsync of the backup")?;
        drop(file);
        let tmp = self.tmp.path();
        fs::rename(&tmp, &self.path)
            .with_context(|| format!("renaming to {}", self.path.display()))?;
        self.tmp.keep();
        sync_parent(&self.path);
        Ok(self.bytes)
    }
}

/// A path removed (a file, or a directory with everything in it) when this is dropped, unless
/// [`keep`](Self::keep) was called: a backup's `FILE.tmp`, verify's scratch copy of a sled log.
struct RemovedUnlessKept(Option<PathBuf>);

impl RemovedUnlessKept {
    fn path(&self) -> PathBuf {
        self.0.clone().unwrap_or_default()
    }

    fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for RemovedUnlessKept {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let removed = match fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => fs::remove_dir_all(&path),
                Ok(_) => fs::remove_file(&path),
                Err(_) => Ok(()),
            };
            if let Err(err) = removed {
                tracing::warn!(path = %path.display(), %err, "could not remove a temporary file");
            }
        }
    }
}

fn sync_parent(path: &Path) {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let _ = File::open(parent).and_then(|d| d.sync_all());
}

/// What reading a backup found.
#[derive(Debug, Clone)]
pub struct FileSummary {
    /// The header.
    pub header: Header,
    /// The trailer.
    pub trailer: Trailer,
    /// File size.
    pub bytes: u64,
}

/// Reads and checks the whole file, calling `visit` on each event in order (after its chain
/// link is checked). The body checksum and trailer are checked at the end: a caller must not
/// trust what it was handed until this returns `Ok`.
pub fn read_backup(
    path: &Path,
    mut visit: impl FnMut(&RecordedEvent) -> anyhow::Result<()>,
) -> anyhow::Result<FileSummary> {
    let file = open_backup(path)?;
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut sha = Sha256::new();
    let mut bytes = 0u64;
    let mut read = |buf: &mut [u8], sha: &mut Sha256| -> anyhow::Result<()> {
        input.read_exact(buf).map_err(read_error)?;
        sha.update(&*buf);
        bytes += buf.len() as u64;
        Ok(())
    };
    let mut preamble = [0u8; 10];
    read(&mut preamble, &mut sha)?;
    if &preamble[..8] != MAGIC {
        bail!("{}: not a vmplane backup (bad magic)", path.display());
    }
    let version = u16::from_be_bytes([preamble[8], preamble[9]]);
    if version != FORMAT_VERSION {
        bail!(
            "{}: backup format version {version}, this vmplane reads {FORMAT_VERSION}",
            path.display()
        );
    }
    let mut header: Option<Header> = None;
    let mut last = (0u64, GENESIS_PREV_HASH);
    let mut count = 0u64;
    let mut body = Vec::new();
    loop {
        let body_sha = sha.clone();
        let mut framing = [0u8; 5];
        read(&mut framing, &mut sha)?;
        let tag = framing[0];
        let len = u32::from_be_bytes([framing[1], framing[2], framing[3], framing[4]]);
        if len > RECORD_BYTES_MAX {
            bail!("a record of {len} bytes: the file is damaged");
        }
        body.resize(len as usize, 0);
        read(&mut body, &mut sha)?;
        match tag {
            TAG_HEADER if header.is_none() => {
                header = Some(serde_json::from_slice(&body).context("the header is damaged")?);
            }
            TAG_EVENT if header.is_some() => {
                let event = decode_event(&body)
                    .with_context(|| format!("the event after position {} is damaged", last.0))?;
                check_link(last, &event).context("the backup's hash chain is broken")?;
                last = (event.position.0, event.hash);
                count += 1;
                visit(&event)?;
            }
            TAG_TRAILER if header.is_some() => {
                let trailer: Trailer =
                    serde_json::from_slice(&body).context("the trailer is damaged")?;
                let header = header.unwrap_or_else(|| unreachable!());
                let mut rest = [0u8; 1];
                if input.read(&mut rest)? != 0 {
                    bail!("bytes after the trailer: the file is damaged");
                }
                if hex::encode(body_sha.finalize()) != trailer.body_sha256 {
                    bail!("the file's checksum does not match: the backup is damaged");
                }
                if trailer.event_count != count
                    || header.event_count != count
                    || header.last_position != last.0
                    || trailer.last_hash != hex::encode(last.1)
                {
                    bail!(
                        "the backup holds {count} events up to position {}, but its header and \
                         trailer disagree",
                        last.0
                    );
                }
                return Ok(FileSummary {
                    header,
                    trailer,
                    bytes,
                });
            }
            tag if tag >= 0x80 => {} // an optional extension this version skips
            tag => bail!("unexpected record tag {tag:#04x}: the file is damaged"),
        }
    }
}

/// The claims `core` attached to `event` when it decided it (firmware-UUID uniqueness), so a
/// replay through the store's append path rebuilds the claim table as it was: derived by
/// [`vmplane_core::firmware::ClaimReplay`], which follows the deciders' rules.
fn claims_of(
    event: &RecordedEvent,
    replay: &mut vmplane_core::firmware::ClaimReplay,
) -> anyhow::Result<Vec<Claim>> {
    let decoded = vmplane_core::decode(&event.event_type, event.schema_version, &event.payload)
        .map_err(|e| {
            anyhow!(
                "position {}: the payload does not decode: {e}",
                event.position
            )
        })?;
    Ok(replay
        .claims(&event.stream, &decoded)
        .into_iter()
        .map(vmplane_projections::command::store_claim)
        .collect())
}

/// Where a restore stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Everything.
    End,
    /// The last position kept.
    Position(u64),
    /// The last position recorded at or before this instant.
    Time(Timestamp),
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// Events kept from the backup (positions 1..=events).
    pub events: u64,
    /// The backup's events.
    pub backup_events: u64,
    /// The restored log's head: the backup's last position (a cut fills the positions after it
    /// with `LogPositionVoided` events).
    pub head: u64,
    /// Positions voided (`head - events`).
    pub voided: u64,
    /// The marker written into the directory.
    pub marker: RestoreMarker,
    /// The backup file's size.
    pub bytes: u64,
    /// Durable syncs the import made.
    pub syncs: u64,
    /// Time spent reading, checking and importing the events (the rest of a restore builds and
    /// checkpoints the projections).
    pub import_time: std::time::Duration,
}

pub use vmplane_projections::{RESTORE_ACTOR, void_stream};

/// An exclusive claim on restoring into one data directory, held from the first check to the
/// final rename: an advisory lock (`flock`) on `.NAME.restore-lock` beside it. The kernel drops
/// it when the holder exits, however it exits; a restore that finds staging directories of a
/// crashed one (`NAME.tmp-…`) removes them while it holds the lock.
#[derive(Debug)]
pub struct RestoreLock {
    path: PathBuf,
    file: File,
}

impl RestoreLock {
    /// Takes the lock for `data`, or fails at once naming the process holding it.
    pub fn acquire(data: &Path) -> anyhow::Result<RestoreLock> {
        use fs2::FileExt;
        use std::os::unix::fs::MetadataExt;
        let name = data
            .file_name()
            .ok_or_else(|| anyhow!("--data {}: needs a directory name", data.display()))?;
        if let Some(parent) = data.parent()
            && !parent.as_os_str().is_empty()
        {
            fs::create_dir_all(parent)
                .with_context(|| format!("--data {}: creating its parent", data.display()))?;
        }
        let mut lock_name = std::ffi::OsString::from(".");
        lock_name.push(name);
        lock_name.push(".restore-lock");
        let path = data.with_file_name(lock_name);
        loop {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .with_context(|| {
                    format!("--data {}: creating {}", data.display(), path.display())
                })?;
            if let Err(err) = file.try_lock_exclusive() {
                if err.kind() != fs2::lock_contended_error().kind() {
                    return Err(err).with_context(|| format!("locking {}", path.display()));
                }
                let holder = fs::read_to_string(&path).unwrap_or_default();
                bail!(
                    "--data {}: another restore into it is running ({}); one restore at a time \
                     per data directory",
                    data.display(),
                    match holder.trim() {
                        "" => "its process id is not recorded yet".to_owned(),
                        pid => format!("process {pid}, lock {}", path.display()),
                    }
                );
            }
            // The holder before us may have finished and removed the file between our open and
            // our lock: then we locked a file nobody else will see. Start over.
            let ours = file.metadata()?.ino();
            match fs::metadata(&path) {
                Ok(meta) if meta.ino() == ours => {}
                _ => continue,
            }
            let mut lock = RestoreLock { path, file };
            lock.file.set_len(0)?;
            lock.file
                .write_all(std::process::id().to_string().as_bytes())?;
            lock.remove_stale_staging(data, name);
            lock.remove_interrupted_inside(data);
            return Ok(lock);
        }
    }

    /// Removes `NAME.tmp-<32 hex>` directories beside `data`: only a restore makes them, and none
    /// other runs while we hold the lock.
    fn remove_stale_staging(&self, data: &Path, name: &std::ffi::OsStr) {
        let parent = match data.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut prefix = name.to_owned();
        prefix.push(".tmp-");
        let prefix = prefix.to_string_lossy().into_owned();
        let Ok(entries) = fs::read_dir(parent) else {
            return;
        };
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let Some(suffix) = file_name.strip_prefix(&prefix) else {
                continue;
            };
            if suffix.len() == 32 && suffix.bytes().all(|b| b.is_ascii_hexdigit()) {
                tracing::warn!(path = %entry.path().display(), "removing a crashed restore's staging directory");
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

impl RestoreLock {
    /// Takes out of an existing `data` what a crashed restore into it left: its staging
    /// directories (`.vmplane-restore-<32 hex>`), and what it was moving in when it stopped
    /// (named in `.vmplane-restore-moving`) unless the log's own file is there (moved last, so
    /// the moves were done, or a server has made a log there since: then only the marker goes,
    /// and the directory, not empty, is refused). Nothing else is touched.
    fn remove_interrupted_inside(&self, data: &Path) {
        let marker = data.join(MOVING_MARKER);
        let has_log = ["db", vmplane_store::file_log::LOG_FILE]
            .iter()
            .any(|name| fs::symlink_metadata(data.join(name)).is_ok());
        if let Ok(listed) = fs::read_to_string(&marker) {
            for name in listed.lines().filter(|_| !has_log) {
                let plain = !name.is_empty()
                    && Path::new(name).components().count() == 1
                    && Path::new(name).file_name().is_some();
                if plain {
                    tracing::warn!(path = %data.join(name).display(), "removing what a crashed restore was moving in");
                    remove_path(&data.join(name));
                }
            }
            let _ = fs::remove_file(&marker);
        }
        let Ok(entries) = fs::read_dir(data) else {
            return;
        };
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let Some(suffix) = file_name.strip_prefix(INSIDE_STAGING_PREFIX) else {
                continue;
            };
            if suffix.len() == 32 && suffix.bytes().all(|b| b.is_ascii_hexdigit()) {
                tracing::warn!(path = %entry.path().display(), "removing a crashed restore's staging directory");
                let _ = fs::remove_dir_all(entry.path());
            }
        }
        let _ = File::open(data).and_then(|d| d.sync_all());
    }
}

impl Drop for RestoreLock {
    fn drop(&mut self) {
        // Removed while still locked (the lock goes with the file handle, right after).
        let _ = fs::remove_file(&self.path);
        let _ = fs2::FileExt::unlock(&self.file);
    }
}

/// Builds the data directory `data` from `from`, up to `cut`: a new directory, or an existing
/// empty one (an empty mount point, say). Refuses a `data` that holds anything, or that another
/// restore is building, and a `--to-position` inside one commit; nothing is left behind on
/// failure.
pub fn restore(
    from: &Path,
    data: &Path,
    cut: Cut,
    backend: Backend,
) -> anyhow::Result<RestoreReport> {
    if backend == Backend::Etcd {
        bail!(
            "--backend etcd: a restore builds an embedded log in --data (sled or file), not an \
             etcd one"
        );
    }
    // Before anything is created: `--from` must be a file.
    drop(open_backup(from).with_context(|| format!("--from {}", from.display()))?);
    let _lock = RestoreLock::acquire(data)?;
    let target = target_of(data)?;
    // The header is read first only to refuse a cut past the end before any work; the whole
    // file is checked while it is imported.
    let header = read_header(from).with_context(|| format!("--from {}", from.display()))?;
    if let Cut::Position(p) = cut {
        if p > header.last_position {
            bail!(
                "--to-position {p}: the backup ends at position {}",
                header.last_position
            );
        }
        if let Some(commit) = commit_holding(from, p)
            && commit.last > p
        {
            bail!(
                "--to-position {p}: position {p} is inside one commit, positions {}..={} \
                 (stream {}, recorded at {}), and a commit is restored whole or not at all: use \
                 --to-position {} to restore to just before it, or --to-position {} to keep it",
                commit.first,
                commit.last,
                commit.stream,
                rfc3339(commit.recorded_at),
                commit.first - 1,
                commit.last
            );
        }
    }
    match target {
        Target::New => {
            let name = data
                .file_name()
                .ok_or_else(|| anyhow!("--data {}: needs a directory name", data.display()))?;
            let mut tmp_name = name.to_owned();
            tmp_name.push(format!(".tmp-{}", Uuid::new_v4().simple()));
            let tmp = data.with_file_name(tmp_name);
            let report = match build(from, &tmp, cut, backend) {
                Ok(report) => report,
                Err(err) => {
                    let _ = fs::remove_dir_all(&tmp);
                    return Err(err);
                }
            };
            if let Err(err) = fs::rename(&tmp, data) {
                let _ = fs::remove_dir_all(&tmp);
                return Err(err).with_context(|| format!("renaming into {}", data.display()));
            }
            sync_parent(data);
            Ok(report)
        }
        Target::Empty => {
            // Built inside, on the file system the directory's contents live on (a mount
            // point's), then moved in.
            let staging = data.join(format!(
                "{INSIDE_STAGING_PREFIX}{}",
                Uuid::new_v4().simple()
            ));
            let report = match build(from, &staging, cut, backend) {
                Ok(report) => report,
                Err(err) => {
                    let _ = fs::remove_dir_all(&staging);
                    return Err(err);
                }
            };
            if let Err(err) = move_in(&staging, data) {
                let _ = fs::remove_dir_all(&staging);
                return Err(err);
            }
            Ok(report)
        }
    }
}

/// What `--data` is when a restore begins.
enum Target {
    /// Nothing there yet: built beside it, then renamed to it.
    New,
    /// An existing empty directory: built inside it, then moved in.
    Empty,
}

/// The staging directory (then a 32-digit hex id) a restore into an existing empty directory
/// builds inside it.
const INSIDE_STAGING_PREFIX: &str = ".vmplane-restore-";
/// While a restore moves what it built into an existing empty directory: the names it is
/// moving, one a line, so that a restore finding it after a crash takes them back out.
const MOVING_MARKER: &str = ".vmplane-restore-moving";

/// Says whether `data` is new or an empty directory; refuses anything else, naming what is in
/// the way.
fn target_of(data: &Path) -> anyhow::Result<Target> {
    match fs::symlink_metadata(data) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Target::New),
        Err(err) => return Err(err).with_context(|| format!("--data {}", data.display())),
        Ok(_) => {}
    }
    let meta = fs::metadata(data)
        .with_context(|| format!("--data {}: exists, but cannot be followed", data.display()))?;
    if !meta.is_dir() {
        bail!(
            "--data {}: already exists and is not a directory; a restore fills a new or an empty \
             data directory",
            data.display()
        );
    }
    let mut names: Vec<String> = fs::read_dir(data)
        .with_context(|| format!("--data {}: listing it", data.display()))?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("--data {}: listing it", data.display()))?;
    if names.is_empty() {
        return Ok(Target::Empty);
    }
    names.sort();
    let shown = names.len().min(5);
    let more = match names.len() - shown {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    bail!(
        "--data {}: already exists and is not empty (it holds {}{more}); a restore fills only a \
         new or an empty data directory: empty it, or choose another path",
        data.display(),
        names[..shown].join(", ")
    )
}

/// Whether `name` is a log's own file (`db` for sled, `events.vpl` for the file log): the
/// entry whose presence makes a directory a log.
fn is_log_file(name: &std::ffi::OsStr) -> bool {
    name == "db" || name == vmplane_store::file_log::LOG_FILE
}

/// Moves everything a restore built in `staging` (inside `data`) into `data`, the log's own
/// file last, so that until it is there nothing in `data` is a log. A failure moves back what
/// was moved (the caller removes `staging`): `data` is as empty as it was. A crash in the
/// middle leaves [`MOVING_MARKER`] naming what was being moved; the next restore takes it out.
fn move_in(staging: &Path, data: &Path) -> anyhow::Result<()> {
    let context = || format!("--data {}: moving the restored files in", data.display());
    let mut names: Vec<std::ffi::OsString> = fs::read_dir(staging)
        .and_then(|entries| entries.map(|e| e.map(|e| e.file_name())).collect())
        .with_context(context)?;
    names.sort_by_key(|name| (is_log_file(name), name.clone()));
    let marker = data.join(MOVING_MARKER);
    let listed: String = names
        .iter()
        .map(|name| format!("{}\n", name.to_string_lossy()))
        .collect();
    File::create(&marker)
        .and_then(|mut file| {
            file.write_all(listed.as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| File::open(data)?.sync_all())
        .with_context(context)?;
    let mut moved: Vec<&std::ffi::OsString> = Vec::new();
    for name in &names {
        let to = data.join(name);
        let result = if fs::symlink_metadata(&to).is_ok() {
            Err(anyhow!(
                "{} appeared while the restore was building (is a server using the directory?)",
                to.display()
            ))
        } else {
            fs::rename(staging.join(name), &to)
                .with_context(|| format!("renaming into {}", to.display()))
        };
        if let Err(err) = result {
            for name in moved.iter().rev() {
                let back = fs::rename(data.join(name), staging.join(name));
                if back.is_err() {
                    remove_path(&data.join(name));
                }
            }
            let _ = fs::remove_file(&marker);
            let _ = File::open(data).and_then(|d| d.sync_all());
            return Err(err).with_context(context);
        }
        moved.push(name);
    }
    File::open(data)
        .and_then(|d| d.sync_all())
        .and_then(|()| fs::remove_dir(staging))
        .and_then(|()| fs::remove_file(&marker))
        .and_then(|()| File::open(data)?.sync_all())
        .with_context(context)
}

/// Removes a file, or a directory and everything in it; best effort.
fn remove_path(path: &Path) {
    let _ = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(_) => Ok(()),
    };
}

/// One commit of a backed-up log, as far as the backup tells: the events of one append share
/// their stream and the instant their group commit recorded (both embedded backends and etcd
/// stamp a group commit once), at consecutive positions and revisions. Two appends of one
/// stream in one group commit cannot be told apart, and count as one (a cut between them is
/// refused; a cut inside an append never passes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Commit {
    first: u64,
    last: u64,
    stream: String,
    recorded_at: Timestamp,
}

impl Commit {
    fn of(e: &RecordedEvent) -> Commit {
        Commit {
            first: e.position.0,
            last: e.position.0,
            stream: e.stream.clone(),
            recorded_at: e.recorded_at,
        }
    }

    /// Whether `e` is the next event of this commit; `revision` is the revision of its last.
    fn continued_by(&self, revision: u64, e: &RecordedEvent) -> bool {
        e.position.0 == self.last + 1
            && e.stream == self.stream
            && e.recorded_at == self.recorded_at
            && e.revision == revision + 1
    }
}

/// The commit of the backup at `from` holding position `p`, read quickly (records decoded, the
/// hashes not checked: [`feed`] checks everything, and refuses a cut inside a commit too).
/// `None` when the file cannot tell (damaged: the import then says why).
fn commit_holding(from: &Path, p: u64) -> Option<Commit> {
    let mut input = BufReader::with_capacity(1 << 20, open_backup(from).ok()?);
    let mut preamble = [0u8; 10];
    input.read_exact(&mut preamble).ok()?;
    let mut current: Option<(Commit, u64)> = None;
    let mut body = Vec::new();
    loop {
        let mut framing = [0u8; 5];
        input.read_exact(&mut framing).ok()?;
        let len = u32::from_be_bytes([framing[1], framing[2], framing[3], framing[4]]);
        if len > RECORD_BYTES_MAX {
            return None;
        }
        body.resize(len as usize, 0);
        input.read_exact(&mut body).ok()?;
        match framing[0] {
            TAG_EVENT => {
                let e = decode_event(&body).ok()?;
                current = match current {
                    Some((mut commit, revision)) if commit.continued_by(revision, &e) => {
                        commit.last = e.position.0;
                        Some((commit, e.revision))
                    }
                    Some((commit, _)) if commit.last >= p => {
                        return (commit.first <= p).then_some(commit);
                    }
                    _ => Some((Commit::of(&e), e.revision)),
                };
            }
            TAG_TRAILER => {
                return current
                    .map(|(commit, _)| commit)
                    .filter(|c| c.first <= p && p <= c.last);
            }
            _ => {}
        }
    }
}

/// An instant as RFC 3339 with nanoseconds (what `--to-time` takes).
fn rfc3339(t: Timestamp) -> String {
    chrono::DateTime::from_timestamp_nanos(t.0).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Opens a backup file to read it, saying what `path` is when it is not a file.
fn open_backup(path: &Path) -> anyhow::Result<File> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => bail!(
            "is a directory, not a backup file: give the file `vmplane admin backup --out` wrote"
        ),
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!("no such file"),
        Err(err) => bail!("cannot read it: {err}"),
    }
    File::open(path).map_err(|err| anyhow!("cannot open it: {err}"))
}

/// What a failed read of a backup means: the file ends early, or the read itself failed.
fn read_error(err: std::io::Error) -> anyhow::Error {
    if err.kind() == std::io::ErrorKind::UnexpectedEof {
        anyhow!("the backup file is truncated")
    } else {
        anyhow!("reading the backup file: {err}")
    }
}

/// Reads the preamble and header record only (not trusted: the caller checks the whole file).
fn read_header(path: &Path) -> anyhow::Result<Header> {
    let mut input = BufReader::new(open_backup(path)?);
    let mut preamble = [0u8; 15];
    input.read_exact(&mut preamble).map_err(read_error)?;
    if &preamble[..8] != MAGIC {
        bail!("not a vmplane backup (bad magic)");
    }
    let version = u16::from_be_bytes([preamble[8], preamble[9]]);
    if version != FORMAT_VERSION {
        bail!("backup format version {version}, this vmplane reads {FORMAT_VERSION}");
    }
    let len = u32::from_be_bytes([preamble[11], preamble[12], preamble[13], preamble[14]]);
    if preamble[10] != TAG_HEADER || len > RECORD_BYTES_MAX {
        bail!("the header is damaged");
    }
    let mut body = vec![0u8; len as usize];
    input.read_exact(&mut body).map_err(read_error)?;
    serde_json::from_slice(&body).context("the header is damaged")
}

use vmplane_projections::void_event;

/// What feeding a backup to an importer did.
struct Fed {
    /// The last kept position.
    kept: u64,
    /// Positions voided after the cut.
    voided: u64,
    /// The cut, if one was made.
    cut_at: Option<u64>,
    summary: FileSummary,
}

/// One backend's importer's `push`: an event and the claims its append carried.
type Push<'a> = dyn FnMut(RecordedEvent, &[Claim]) -> Result<(), vmplane_store::Error> + 'a;

/// Feeds the backup's events to `push` — the events up to the cut as they are, one
/// `LogPositionVoided` per position after it — checking the file as it goes.
fn feed(
    from: &Path,
    cut: Cut,
    epoch: Uuid,
    restored_at: Timestamp,
    push: &mut Push<'_>,
) -> anyhow::Result<Fed> {
    let header_events = read_header(from).map(|h| h.event_count).unwrap_or(0);
    let progress = Progress::new(header_events, "restoring");
    let mut firmware = vmplane_core::firmware::ClaimReplay::default();
    // The last kept position, its time and the chain hash so far.
    let mut kept = 0u64;
    let mut kept_time = Timestamp(i64::MIN);
    let mut prev_hash = GENESIS_PREV_HASH;
    let mut cut_at: Option<u64> = None;
    let mut voided = 0u64;
    // The last kept event, as the commit it ends and its revision.
    let mut last_kept: Option<(Commit, u64)> = None;
    let summary = read_backup(from, |e| {
        let keep = cut_at.is_none()
            && match cut {
                Cut::End => true,
                Cut::Position(p) => e.position.0 <= p,
                Cut::Time(t) => e.recorded_at <= t,
            };
        if !keep
            && cut_at.is_none()
            && let Some((commit, revision)) = &last_kept
            && commit.continued_by(*revision, e)
        {
            // `restore` refuses such a cut before it begins; never keep half a commit.
            bail!(
                "the cut after position {} would split the commit of positions {} and {} \
                 (stream {}, recorded at {}): a commit is restored whole or not at all",
                commit.last,
                commit.last,
                e.position,
                commit.stream,
                rfc3339(commit.recorded_at)
            );
        }
        let hash = if keep {
            let claims = claims_of(e, &mut firmware)?;
            kept = e.position.0;
            kept_time = e.recorded_at;
            last_kept = Some((Commit::of(e), e.revision));
            push(e.clone(), &claims)
                .with_context(|| format!("importing position {}", e.position))?;
            e.hash
        } else {
            let at = *cut_at.get_or_insert(kept);
            voided += 1;
            let void = void_event(e, epoch, at, voided, restored_at.max(kept_time), prev_hash);
            let hash = void.hash;
            push(void, &[]).with_context(|| format!("voiding position {}", e.position))?;
            hash
        };
        prev_hash = hash;
        progress.inc(1);
        Ok(())
    })
    .with_context(|| format!("--from {}", from.display()))?;
    progress.finish();
    Ok(Fed {
        kept,
        voided,
        cut_at,
        summary,
    })
}

/// Imports the backup into a fresh log of `backend` in `tmp` (see [`feed`]), then builds and
/// checkpoints the projections and writes the marker.
fn build(from: &Path, tmp: &Path, cut: Cut, backend: Backend) -> anyhow::Result<RestoreReport> {
    let started = Instant::now();
    let epoch = Uuid::now_v7();
    let restored_at = Timestamp::now();
    let (dyn_log, imported, fed): (Arc<dyn EventLog>, _, _) = match backend {
        Backend::File => {
            let mut log = FileLog::open(tmp).context("creating the new log")?;
            let mut importer = log.importer().context("starting the import")?;
            let fed = feed(from, cut, epoch, restored_at, &mut |e, c| {
                importer.push(e, c)
            })?;
            let imported = importer.finish().context("finishing the import")?;
            (Arc::new(log), imported, fed)
        }
        Backend::Etcd => bail!(
            "--backend etcd: a restore builds an embedded log in --data (sled or file); to fill \
             an etcd log, restore into --backend sled and replay it through a server"
        ),
        Backend::Sled => {
            let mut log = SledLog::open(tmp).context("creating the new log")?;
            let mut importer = log
                .importer(ImportOptions::default())
                .context("starting the import")?;
            let fed = feed(from, cut, epoch, restored_at, &mut |e, c| {
                importer.push(e, c)
            })?;
            let imported = importer.finish().context("finishing the import")?;
            (Arc::new(log), imported, fed)
        }
    };
    let Fed {
        kept,
        voided,
        cut_at,
        summary,
    } = fed;
    let import_time = started.elapsed();
    let last = summary.header.last_position;
    if let Cut::Position(p) = cut
        && p > last
    {
        bail!("--to-position {p}: the backup ends at position {last}");
    }
    if imported.head.0 != last || imported.events != last {
        bail!(
            "the new log ends at {} after {} events, expected {last}",
            imported.head,
            imported.events
        );
    }
    let projections = vmplane_projections::Projections::open(
        Arc::clone(&dyn_log),
        tmp,
        vmplane_projections::ProjectionOptions {
            checkpoint_every_events: 0,
            ..Default::default()
        },
    )
    .context("building the projections")?;
    projections
        .checkpoint()
        .context("writing the projections' checkpoint")?;
    drop(projections);
    drop(dyn_log);
    let marker = RestoreMarker {
        epoch: epoch.to_string(),
        backup_last_position: last,
        cut_position: cut_at,
        head_hash: hex::encode(imported.head_hash),
        restored_at: chrono::Utc::now().to_rfc3339(),
        void_stream: cut_at.map(|_| void_stream(&epoch)),
    };
    let path = tmp.join(RESTORE_MARKER);
    let mut file = File::create(&path)?;
    file.write_all(&serde_json::to_vec_pretty(&marker)?)?;
    file.sync_all()?;
    File::open(tmp).and_then(|d| d.sync_all())?;
    Ok(RestoreReport {
        events: kept,
        backup_events: summary.header.event_count,
        head: imported.head.0,
        voided,
        marker,
        bytes: summary.bytes,
        syncs: imported.syncs,
        import_time,
    })
}

/// What `admin verify` found on a sound directory.
#[derive(Debug, Clone)]
pub struct VerifyOutcome {
    /// Events (= head position).
    pub events: u64,
    /// The head's chain hash.
    pub head_hash: [u8; 32],
    /// The projections' digest (a rebuild's; equal to the checkpoint's plus the tail, when
    /// there is a checkpoint).
    pub digest: String,
    /// The position of the projection checkpoint checked, `None` when the directory has none.
    pub checkpoint: Option<u64>,
    /// The restore marker, if any.
    pub marker: Option<RestoreMarker>,
}

/// Offline checks of a data directory, changing nothing in it: hash chain, gapless positions,
/// every payload decodes, the end of the log (a file log's torn or damaged last record, which
/// `serve` would cut off, is reported with its position), the projection checkpoint (one
/// `serve` would discard is reported with why), and the projections opened from the checkpoint
/// have the digest of a fresh rebuild. Every problem found makes it an error, named in one
/// message.
///
/// Nothing is written to `data`: a file log is opened read-only
/// ([`FileLog::open_read_only`]); a sled log is opened on a copy of its files in the
/// temporary directory (`$TMPDIR`), since opening sled 0.34 writes to its directory (its
/// recovery zeroes the rest of the last segment, writes a new snapshot file and removes the
/// old ones, and the log records its head at close), while the original's `db` is locked so
/// that no server opens it meanwhile; the projections are opened without checkpointing.
pub fn verify(data: &Path) -> anyhow::Result<VerifyOutcome> {
    let opened = match crate::server::embedded_backend_of(data) {
        Some(Backend::File) => open_file_log_to_verify(data)?,
        Some(_) => open_sled_copy_to_verify(data)?,
        None => bail!("--data {}: no vmplane log here", data.display()),
    };
    let log = Arc::clone(&opened.log);
    let head = log.head().0;
    let mut problems: Vec<String> = Vec::new();
    let torn = opened.torn.map(|torn| torn_problem(data, &torn, head));

    let progress = Progress::new(head, "verifying the log");
    let checked = log.verify(&|t, v, p| {
        progress.inc(1);
        vmplane_core::validate_payload(t, v, p).map_err(|e| e.to_string())
    });
    progress.finish();
    let report = match checked {
        Ok(report) => report,
        Err(err) => {
            problems.push(err.to_string());
            problems.extend(torn);
            bail!("--data {}: {}", data.display(), problems.join("; and "));
        }
    };

    let checkpoint_path = vmplane_projections::checkpoint::path(data, READ_MODEL);
    let checkpoint = match check_checkpoint(log.as_ref(), &checkpoint_path) {
        Ok(checkpoint) => checkpoint,
        Err(reason) => {
            problems.push(format!(
                "the projection checkpoint {} cannot be used: {reason} (`vmplane serve` would \
                 discard it and rebuild the projections from the log; a checkpoint is a cache: \
                 removing it is a repair)",
                checkpoint_path.display()
            ));
            None
        }
    };
    let options = vmplane_projections::ProjectionOptions {
        checkpoint_every_events: 0,
        ..Default::default()
    };
    let rebuild_log = Watched::new(&log, head, "rebuilding the projections");
    let rebuilt = vmplane_projections::Projections::in_memory(rebuild_log.as_log(), options)
        .context("rebuilding the projections")?;
    rebuild_log.progress.finish();
    let fresh = rebuilt.digest()?;
    if let Some(position) = checkpoint {
        // Opening with checkpoint_every_events 0 writes nothing to the directory.
        let tail = head.saturating_sub(position);
        let watched = Watched::new(&log, tail, "loading the projections' checkpoint");
        let opened_projections =
            vmplane_projections::Projections::open(watched.as_log(), data, options)
                .context("opening the projections from their checkpoint")?;
        watched.progress.finish();
        let scanned_from = *lock(&watched.first_scan);
        if scanned_from.is_some_and(|from| from != position) {
            problems.push(format!(
                "the projections did not start from their checkpoint {} at position {position} \
                 (they replayed the log from position {}): `vmplane serve` would discard it",
                checkpoint_path.display(),
                scanned_from.unwrap_or(0)
            ));
        }
        let digest = opened_projections.digest()?;
        if digest != fresh {
            let (a, b) = (
                opened_projections.canonical_content()?,
                rebuilt.canonical_content()?,
            );
            let first = a
                .iter()
                .zip(&b)
                .find(|(x, y)| x != y)
                .map(|(x, y)| format!("checkpoint has {x}, rebuild has {y}"))
                .unwrap_or_else(|| format!("{} vs {} lines", a.len(), b.len()));
            problems.push(format!(
                "projection digest {digest} (checkpoint {} plus the log after it) differs from \
                 a rebuild's {fresh}: {first}",
                checkpoint_path.display()
            ));
        }
    }
    // The torn tail first: it is about the log, the truth.
    if let Some(torn) = torn {
        problems.insert(0, torn);
    }
    if !problems.is_empty() {
        bail!("--data {}: {}", data.display(), problems.join("; and "));
    }
    Ok(VerifyOutcome {
        events: report.events,
        head_hash: report.head_hash,
        digest: fresh,
        checkpoint,
        marker: RestoreMarker::read(data)?,
    })
}

/// A log opened by `admin verify`, and what must outlive it.
struct OpenedToVerify {
    log: Arc<dyn EventLog>,
    /// A file log's torn last record, left in place.
    torn: Option<vmplane_store::file_log::TornTail>,
    /// A sled log's scratch copy (removed after the log is closed: fields drop in order) and
    /// the shared lock on the original's `db`.
    _copy: Option<(RemovedUnlessKept, File)>,
}

fn open_file_log_to_verify(data: &Path) -> anyhow::Result<OpenedToVerify> {
    let spinner = Progress::spinner(&format!(
        "opening the log (reading {})",
        data.join(vmplane_store::file_log::LOG_FILE).display()
    ));
    let log = FileLog::open_read_only(data, vmplane_store::FileOptions::default())
        .with_context(|| format!("--data {}: cannot open the log", data.display()));
    spinner.finish();
    let log = log?;
    let torn = log.open_report().torn_tail;
    Ok(OpenedToVerify {
        log: Arc::new(log),
        torn,
        _copy: None,
    })
}

/// What `serve` would do with a file log's torn last record, and why verify cannot tell
/// whether it was committed.
fn torn_problem(data: &Path, torn: &vmplane_store::file_log::TornTail, events: u64) -> String {
    let file = data.join(vmplane_store::file_log::LOG_FILE);
    let holds = match torn.positions {
        Some((first, last)) => {
            format!(", holding positions {first}..={last} by its unchecked bytes")
        }
        None => String::new(),
    };
    let head_file = data.join(vmplane_store::head_record::HEAD_RECORD_FILE);
    let vouched = match head_record_position(&head_file) {
        Some(position) => format!(
            "the head record {} vouches only for positions up to {position} (it is written at \
             most a second apart): a commit after those cannot be told from one never \
             acknowledged",
            head_file.display()
        ),
        None => format!(
            "there is no head record ({}) to tell whether it was committed",
            head_file.display()
        ),
    };
    format!(
        "{} ends in a torn record at byte {} ({} bytes to the end of the file: {}) after \
         position {events}{holds}; `vmplane serve` would cut those bytes off as a commit that \
         was never acknowledged, and {vouched}: keep a copy of the file before serving it, and \
         if that commit had been acknowledged, restore from a backup",
        file.display(),
        torn.offset,
        torn.bytes,
        torn.reason
    )
}

/// The position a head record file holds, if it is there and readable.
fn head_record_position(path: &Path) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    (lines.next()? == "vmplane-head v1").then_some(())?;
    lines.next()?.parse().ok()
}

/// Opens a sled log for `admin verify` on a copy of its files (see [`verify`]).
fn open_sled_copy_to_verify(data: &Path) -> anyhow::Result<OpenedToVerify> {
    let cannot = || format!("--data {}: cannot open the log", data.display());
    let db = data.join("db");
    let lock = File::open(&db)
        .with_context(|| format!("opening {}", db.display()))
        .with_context(cannot)?;
    if let Err(err) = fs2::FileExt::try_lock_shared(&lock) {
        if err.kind() == fs2::lock_contended_error().kind() {
            bail!(
                "--data {}: cannot open the log: {} is in use by another process (a running \
                 `vmplane serve`?): stop it first, or work on a copy",
                data.display(),
                data.display()
            );
        }
        return Err(err)
            .with_context(|| format!("locking {}", db.display()))
            .with_context(cannot);
    }
    let copy = copy_sled(data, true)?;
    let opened = {
        let spinner = Progress::spinner("opening the log (a copy of sled's files)");
        let opened = SledLog::open(copy.path());
        spinner.finish();
        opened
    };
    let log = match opened {
        Ok(log) => log,
        Err(err) => {
            let text = err.to_string().replace(
                copy.path().to_string_lossy().as_ref(),
                data.to_string_lossy().as_ref(),
            );
            drop(copy);
            if text.contains("Read corrupted data") {
                return Err(sled_damage(data, &text));
            }
            bail!("{}: {text}", cannot());
        }
    };
    Ok(OpenedToVerify {
        log: Arc::new(log),
        torn: None,
        _copy: Some((copy, lock)),
    })
}

/// Copies sled's files of `data` (everything but the projections and the restore marker;
/// sled's snapshot files `snap.*` only `with_snapshots`) into a new directory under `$TMPDIR`,
/// removed when the returned guard is dropped.
fn copy_sled(data: &Path, with_snapshots: bool) -> anyhow::Result<RemovedUnlessKept> {
    let scratch = std::env::temp_dir().join(format!("vmplane-verify-{}", Uuid::new_v4().simple()));
    let failed = |what: &str| {
        format!(
            "--data {}: {what} {} to verify it there (opening sled writes to its directory, so \
             verify never opens --data itself; set TMPDIR to a directory with room for a copy)",
            data.display(),
            scratch.display()
        )
    };
    fs::create_dir(&scratch).with_context(|| failed("creating"))?;
    let guard = RemovedUnlessKept(Some(scratch.clone()));
    let wanted = |name: &std::ffi::OsStr| {
        let name = name.to_string_lossy();
        name != vmplane_projections::checkpoint::CHECKPOINT_DIR
            && name != RESTORE_MARKER
            && (with_snapshots || !name.starts_with("snap."))
    };
    let mut files = Vec::new();
    let mut total = 0u64;
    let mut pending = vec![(data.to_path_buf(), scratch.clone())];
    while let Some((from, to)) = pending.pop() {
        for entry in fs::read_dir(&from).with_context(|| failed("listing the files to copy to"))? {
            let entry = entry.with_context(|| failed("listing the files to copy to"))?;
            if from == data && !wanted(&entry.file_name()) {
                continue;
            }
            let meta = entry
                .metadata()
                .with_context(|| failed("reading the files to copy to"))?;
            let target = to.join(entry.file_name());
            if meta.is_dir() {
                fs::create_dir(&target).with_context(|| failed("copying sled's files to"))?;
                pending.push((entry.path(), target));
            } else if meta.is_file() {
                total += meta.len();
                files.push((entry.path(), target, meta.len()));
            }
        }
    }
    let progress = Progress::bytes(total, "copying sled's files");
    for (from, to, len) in files {
        fs::copy(&from, &to)
            .with_context(|| format!("copying {}", from.display()))
            .with_context(|| failed("copying sled's files to"))?;
        progress.inc(len);
    }
    progress.finish();
    Ok(guard)
}

/// What to say of sled refusing `data` as corrupted (`text`, its error, which names no file):
/// which file, as far as a copy without sled's snapshot files tells, and that sled cannot name
/// a log position.
fn sled_damage(data: &Path, text: &str) -> anyhow::Error {
    let offset = text
        .split("file offset ")
        .nth(1)
        .map(|rest| {
            rest.split(" backtrace")
                .next()
                .unwrap_or(rest)
                .trim()
                .to_owned()
        })
        .filter(|offset| offset != "None");
    let mut snapshots: Vec<PathBuf> = fs::read_dir(data)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
                })
                .collect()
        })
        .unwrap_or_default();
    snapshots.sort();
    if offset.is_none() && !snapshots.is_empty() {
        // sled reads its newest snapshot file first and refuses the lot when that is damaged;
        // without one it reads its log file whole. A second copy tells which it was.
        let without = copy_sled(data, false).ok().and_then(|copy| {
            let log = SledLog::open(copy.path()).ok()?;
            let report = log
                .verify(&|t, v, p| {
                    vmplane_core::validate_payload(t, v, p).map_err(|e| e.to_string())
                })
                .ok()?;
            drop(log);
            drop(copy);
            Some(report.events)
        });
        let names = snapshots
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        if let Some(events) = without {
            return anyhow!(
                "--data {}: sled refuses its snapshot file {names} (\"Read corrupted data\", at \
                 no offset sled names); without it, sled reads {} whole: {events} events up to \
                 position {events}, hash chain and payloads verified. To repair: stop every \
                 server on the directory, move {names} out of it, and serve it (sled rebuilds \
                 its snapshot from db)",
                data.display(),
                data.join("db").display()
            );
        }
    }
    let where_ = match &offset {
        Some(offset) if offset.contains("Blob") => format!(
            "in a blob file under {} ({offset})",
            data.join("blobs").display()
        ),
        Some(offset) => format!("in {} ({offset})", data.join("db").display()),
        None => format!(
            "in one of its files ({}, {}, snap.*), at no offset sled names",
            data.join("db").display(),
            data.join("conf").display()
        ),
    };
    anyhow!(
        "--data {}: sled refuses its files as corrupted (\"Read corrupted data\") {where_}; sled \
         0.34 cannot say which log positions that damage holds, so vmplane cannot name one: \
         restore the directory from a backup (`vmplane admin restore`)",
        data.display()
    )
}

/// A projection checkpoint's header and body position (the entries are skipped).
#[derive(Deserialize)]
struct CheckpointProbe {
    applied: u64,
}

/// Checks the projection checkpoint at `path` as `Projections::open` would before using it:
/// its header, format, code version, body checksum and JSON, and that the log holds the event
/// it was taken at. `Ok(None)`: there is none. `Err(reason)`: why `serve` would discard it.
fn check_checkpoint(log: &dyn EventLog, path: &Path) -> Result<Option<u64>, String> {
    let Some(loaded) = vmplane_projections::checkpoint::read::<CheckpointProbe>(path, READ_MODEL)?
    else {
        return Ok(None);
    };
    loaded.check_against(log, loaded.body.applied)?;
    Ok(Some(loaded.position))
}

/// The log as `admin verify` lends it to the projections: the same reads, plus a progress bar
/// over the events they scan, and where their first scan began (from a checkpoint's position,
/// or from 0 when they discarded it).
struct Watched {
    inner: Arc<dyn EventLog>,
    first_scan: Mutex<Option<u64>>,
    progress: Progress,
}

impl Watched {
    fn new(inner: &Arc<dyn EventLog>, events: u64, what: &str) -> Arc<Watched> {
        Arc::new(Watched {
            inner: Arc::clone(inner),
            first_scan: Mutex::new(None),
            progress: Progress::new(events, what),
        })
    }

    fn as_log(self: &Arc<Self>) -> Arc<dyn EventLog> {
        Arc::clone(self) as Arc<dyn EventLog>
    }
}

impl EventLog for Watched {
    fn append(
        &self,
        request: vmplane_store::AppendRequest,
    ) -> vmplane_store::Result<vmplane_store::AppendResult> {
        self.inner.append(request)
    }

    fn read_stream(
        &self,
        stream: &str,
        from: vmplane_store::Revision,
        direction: vmplane_store::Direction,
        max_count: usize,
    ) -> vmplane_store::Result<Vec<RecordedEvent>> {
        self.inner.read_stream(stream, from, direction, max_count)
    }

    fn read_all(
        &self,
        after: Position,
        max_count: usize,
    ) -> vmplane_store::Result<Vec<RecordedEvent>> {
        self.inner.read_all(after, max_count)
    }

    fn scan(
        &self,
        after: Position,
        visit: vmplane_store::Visitor<'_>,
    ) -> vmplane_store::Result<Position> {
        lock(&self.first_scan).get_or_insert(after.0);
        self.inner.scan(after, &mut |event| {
            self.progress.inc(1);
            visit(event)
        })
    }

    fn read_event(&self, position: Position) -> vmplane_store::Result<Option<RecordedEvent>> {
        self.inner.read_event(position)
    }

    fn position_at(&self, at: Timestamp) -> vmplane_store::Result<Position> {
        self.inner.position_at(at)
    }

    fn head(&self) -> Position {
        self.inner.head()
    }

    fn wait_for(
        &self,
        position: Position,
        timeout: std::time::Duration,
    ) -> vmplane_store::Result<Position> {
        self.inner.wait_for(position, timeout)
    }

    fn stream_revision(
        &self,
        stream: &str,
    ) -> vmplane_store::Result<Option<vmplane_store::Revision>> {
        self.inner.stream_revision(stream)
    }

    fn claim_holder(&self, key: &str) -> vmplane_store::Result<Option<String>> {
        self.inner.claim_holder(key)
    }

    fn verify(
        &self,
        validate_payload: vmplane_store::PayloadValidator<'_>,
    ) -> vmplane_store::Result<vmplane_store::VerifyReport> {
        self.inner.verify(validate_payload)
    }

    fn limits(&self) -> &vmplane_store::Limits {
        self.inner.limits()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A progress bar on a terminal, nothing otherwise (the summary line says what happened).
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(total: u64, what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {pos}/{len} events ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(what.to_owned());
        Progress(Some(bar))
    }
    /// A bar over `total` bytes.
    fn bytes(total: u64, what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(what.to_owned());
        Progress(Some(bar))
    }

    /// A spinner for a phase whose progress cannot be counted.
    fn spinner(what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.set_message(what.to_owned());
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        Progress(Some(bar))
    }

    fn inc(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(n);
        }
    }
    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// `vmplane admin backup --out FILE`.
pub async fn backup(global: &crate::cli::GlobalArgs, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let channel = crate::client::connect_channel(global).await?;
    let token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> = match &global.token
    {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| anyhow!("--token: must be printable ASCII"))?,
        ),
        None => None,
    };
    let mut client = pb::admin_client::AdminClient::with_interceptor(
        channel,
        move |mut request: tonic::Request<()>| {
            if let Some(t) = &token {
                request.metadata_mut().insert("authorization", t.clone());
            }
            Ok(request)
        },
    )
    .max_decoding_message_size(crate::client::CLIENT_MESSAGE_BYTES_MAX);
    let mut stream = client
        .backup(pb::BackupRequest {})
        .await
        .map_err(crate::client::status_error)?
        .into_inner();
    let mut writer: Option<BackupWriter> = None;
    let mut progress: Option<Progress> = None;
    // What a backup that stops early says: whatever stopped it, `--out` is untouched and
    // `FILE.tmp` is gone (the writer removes it when dropped unfinished).
    let incomplete = |writer: Option<BackupWriter>, why: String| -> anyhow::Error {
        let told = match &writer {
            Some(w) => format!("after {} of {} events", w.events(), w.header.event_count),
            None => "before the first event".to_owned(),
        };
        drop(writer);
        anyhow!(
            "the backup is incomplete: the server stopped sending it {told} ({why}); nothing was \
             written to --out {}, and no {}.tmp is left; take the backup again",
            out.display(),
            out.display()
        )
    };
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(status) => {
                if let Some(p) = &progress {
                    p.finish();
                }
                let why = crate::client::status_error(status).to_string();
                return Err(incomplete(writer.take(), why));
            }
        };
        let w = match &mut writer {
            Some(w) => w,
            None => {
                let head = chunk.head_position;
                progress = Some(Progress::new(head, "backing up"));
                writer.insert(BackupWriter::create(
                    out,
                    Header {
                        format_version: FORMAT_VERSION,
                        event_count: head,
                        first_position: u64::from(head > 0),
                        last_position: head,
                        created_at: chrono::Utc::now().to_rfc3339(),
                        server_version: env!("CARGO_PKG_VERSION").into(),
                    },
                )?)
            }
        };
        let n = chunk.events.len() as u64;
        for e in chunk.events {
            w.event(&from_pb(e)?)?;
        }
        if let Some(p) = &progress {
            p.inc(n);
        }
    }
    if let Some(p) = &progress {
        p.finish();
    }
    let writer = writer.ok_or_else(|| anyhow!("the server sent no backup"))?;
    if writer.events() != writer.header.event_count {
        let why = "it ended the backup early".to_owned();
        return Err(incomplete(Some(writer), why));
    }
    let (events, last) = (writer.written, writer.last);
    let bytes = writer.finish()?;
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let held = match last.0 {
        0 => "an empty log".to_owned(),
        head => format!("positions 1..={head}"),
    };
    println!(
        "backup written to {}: {events} events ({held}), {bytes} bytes, last hash {}, in {secs:.2}s",
        out.display(),
        hex::encode(last.1)
    );
    Ok(())
}

/// Parses `--to-time`.
pub fn parse_time(text: &str) -> anyhow::Result<Timestamp> {
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| anyhow!("--to-time {text:?}: not an RFC 3339 time: {e}"))?;
    t.timestamp_nanos_opt()
        .map(Timestamp)
        .ok_or_else(|| anyhow!("--to-time {text:?}: out of range"))
}

/// `admin verify --backend etcd`: the store's own check of an etcd log (hash chain, gapless
/// positions and revisions, time order, no event id twice, every payload decodes), read-only, so
/// its servers may keep running. Projections are each server's cache and are not checked here.
fn verify_etcd(endpoints: Vec<String>, prefix: String) -> anyhow::Result<std::process::ExitCode> {
    let shown = endpoints.join(",");
    let log =
        vmplane_store_etcd::EtcdLog::open(vmplane_store_etcd::EtcdOptions::new(endpoints, &prefix))
            .with_context(|| {
                format!("--etcd-endpoints {shown} --etcd-prefix {prefix}: cannot open the log")
            })?;
    let head = log.head().0;
    let progress = Progress::new(head, "verifying the log");
    let checked = log.verify(&|t, v, p| {
        progress.inc(1);
        vmplane_core::validate_payload(t, v, p).map_err(|e| e.to_string())
    });
    progress.finish();
    let report =
        checked.with_context(|| format!("--etcd-endpoints {shown} --etcd-prefix {prefix}"))?;
    println!(
        "ok: {} events, head position {}, head hash {} (etcd log {prefix}; projections are each \
         server's cache, not checked here)",
        report.events,
        report.events,
        hex::encode(report.head_hash)
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// Runs `vmplane admin …`.
pub fn run(
    global: &crate::cli::GlobalArgs,
    args: crate::cli::AdminArgs,
) -> anyhow::Result<std::process::ExitCode> {
    use crate::cli::AdminCommand;
    match args.command {
        AdminCommand::Backup { out } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(backup(global, &out))?;
        }
        AdminCommand::Restore {
            from,
            data,
            to_position,
            to_time,
            backend,
        } => {
            let cut = match (to_position, to_time) {
                (Some(p), _) => Cut::Position(p),
                (None, Some(t)) => Cut::Time(parse_time(&t)?),
                (None, None) => Cut::End,
            };
            let started = Instant::now();
            let r = restore(&from, &data, cut, backend)?;
            let secs = started.elapsed().as_secs_f64();
            println!(
                "restored {} of {} events into {} ({} log, head {}, hash {}, epoch {}{}) in \
                 {secs:.2}s",
                r.events,
                r.backup_events,
                data.display(),
                backend.name(),
                r.head,
                r.marker.head_hash,
                r.marker.epoch,
                match r.marker.cut_position {
                    Some(p) => format!(
                        "; cut at position {p}: positions {}..={} voided on stream {}, new \
                         positions start after {}; clients holding a position in the voided \
                         range must re-list",
                        p + 1,
                        r.head,
                        r.marker.void_stream.as_deref().unwrap_or("?"),
                        r.head
                    ),
                    None => String::new(),
                },
            );
        }
        AdminCommand::Verify {
            data,
            backend,
            etcd_endpoints,
            etcd_prefix,
        } => {
            let data = match backend {
                Some(Backend::Etcd) => {
                    anyhow::ensure!(
                        data.is_none(),
                        "--data: an etcd log has no data directory to verify (each server's \
                         --data holds only its projection checkpoint, a cache); drop --data"
                    );
                    return verify_etcd(etcd_endpoints, etcd_prefix);
                }
                _ if !etcd_endpoints.is_empty() => {
                    bail!("--etcd-endpoints applies to --backend etcd only: add --backend etcd")
                }
                _ => data.context("--data: the data directory to verify")?,
            };
            let v = verify(&data)?;
            println!(
                "ok: {} events, head position {}, head hash {}, projection digest {}{}{}",
                v.events,
                v.events,
                hex::encode(v.head_hash),
                v.digest,
                match v.checkpoint {
                    Some(_) => "",
                    None => {
                        ", no projection checkpoint (a cache: `vmplane serve` rebuilds the \
                         projections from the log and writes one)"
                    }
                },
                match &v.marker {
                    Some(m) => format!(
                        ", restored (epoch {}{})",
                        m.epoch,
                        m.cut_position
                            .map(|p| format!(", cut at position {p}"))
                            .unwrap_or_default()
                    ),
                    None => String::new(),
                }
            );
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backup at `path` of events on (stream, recorded_at) in order, chained.
    fn backup_of(path: &Path, events: &[(&str, i64)]) {
        let count = events.len() as u64;
        let mut writer = BackupWriter::create(
            path,
            Header {
                format_version: FORMAT_VERSION,
                event_count: count,
                first_position: u64::from(count > 0),
                last_position: count,
                created_at: "2026-01-01T00:00:00Z".into(),
                server_version: "test".into(),
            },
        )
        .expect("create");
        let mut prev_hash = GENESIS_PREV_HASH;
        let mut revisions = std::collections::HashMap::new();
        for (at, (stream, time)) in events.iter().enumerate() {
            let revision = revisions.entry(*stream).or_insert(0u64);
            *revision += 1;
            let mut event = RecordedEvent {
                position: Position(at as u64 + 1),
                stream: (*stream).into(),
                revision: *revision,
                id: Uuid::now_v7(),
                recorded_at: Timestamp(*time),
                actor: "tester".into(),
                correlation_id: Uuid::now_v7(),
                causation_id: None,
                event_type: "Tested".into(),
                schema_version: 1,
                payload: vec![1, 2, 3],
                prev_hash,
                hash: [0; 32],
            };
            event.hash = event_hash(&event.as_ref());
            prev_hash = event.hash;
            writer.event(&event).expect("event");
        }
        writer.finish().expect("finish");
    }

    #[test]
    fn the_commit_holding_a_position_is_the_run_of_one_stream_at_one_instant() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("b");
        // 1 | 2 3 (one commit) | 4 (same instant, another stream) | 5 6 (one stream, two
        // instants: two commits) | 7 8 9 (one commit, the last)
        backup_of(
            &path,
            &[
                ("a", 10),
                ("b", 20),
                ("b", 20),
                ("c", 20),
                ("a", 30),
                ("a", 31),
                ("d", 40),
                ("d", 40),
                ("d", 40),
            ],
        );
        let span = |p| commit_holding(&path, p).map(|c| (c.first, c.last));
        assert_eq!(span(0), None, "position 0 is before every commit");
        assert_eq!(span(1), Some((1, 1)));
        assert_eq!(span(2), Some((2, 3)));
        assert_eq!(span(3), Some((2, 3)));
        assert_eq!(span(4), Some((4, 4)));
        assert_eq!(span(5), Some((5, 5)));
        assert_eq!(span(6), Some((6, 6)));
        assert_eq!(span(7), Some((7, 9)));
        assert_eq!(span(9), Some((7, 9)));
        assert_eq!(span(10), None, "past the end");
    }

    #[test]
    fn a_failed_move_into_an_empty_directory_moves_everything_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let staging = data.join(format!("{INSIDE_STAGING_PREFIX}{}", "0".repeat(32)));
        fs::create_dir_all(staging.join("projections")).expect("mkdir");
        for name in ["conf", "db", "restore.json", "projections/readmodel.ckpt"] {
            fs::write(staging.join(name), name).expect("write");
        }
        // Something (a server?) put a `restore.json` there meanwhile: the move stops at it.
        fs::write(data.join("restore.json"), b"not ours").expect("write");
        let err = move_in(&staging, &data).expect_err("a clash");
        assert!(format!("{err:#}").contains("appeared"), "{err:#}");
        let mut left: Vec<String> = fs::read_dir(&data)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let staging_name = staging.file_name().expect("name").to_string_lossy();
        assert_eq!(
            left,
            vec![staging_name.into_owned(), "restore.json".to_owned()]
        );
        assert_eq!(
            fs::read(data.join("restore.json")).expect("read"),
            b"not ours"
        );
        for name in ["conf", "db", "projections/readmodel.ckpt"] {
            assert!(staging.join(name).exists(), "{name} was not moved back");
        }

        // Without the clash, everything moves in, the log's file last, and nothing is left.
        fs::remove_file(data.join("restore.json")).expect("rm");
        move_in(&staging, &data).expect("move in");
        let mut moved: Vec<String> = fs::read_dir(&data)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        moved.sort();
        assert_eq!(moved, ["conf", "db", "projections", "restore.json"]);
    }

    #[test]
    fn a_crashed_move_is_taken_back_out_by_the_next_restore() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let staging = data.join(format!("{INSIDE_STAGING_PREFIX}{}", "a".repeat(32)));
        fs::create_dir_all(&staging).expect("mkdir");
        fs::write(staging.join("db"), b"log").expect("write");
        // As a crash after the first rename leaves it.
        fs::write(data.join("conf"), b"conf").expect("write");
        fs::write(data.join(MOVING_MARKER), "conf\ndb\n").expect("marker");
        let lock = RestoreLock::acquire(&data).expect("lock");
        assert_eq!(fs::read_dir(&data).expect("ls").count(), 0);
        assert!(matches!(target_of(&data), Ok(Target::Empty)));
        drop(lock);

        // A crash after the last move (the log's file is there): a whole log, kept, and
        // refused as a target.
        fs::write(data.join("conf"), b"conf").expect("write");
        fs::write(data.join("db"), b"log").expect("write");
        fs::write(data.join(MOVING_MARKER), "conf\ndb\n").expect("marker");
        let lock = RestoreLock::acquire(&data).expect("lock");
        assert!(!data.join(MOVING_MARKER).exists());
        assert_eq!(fs::read(data.join("db")).expect("kept"), b"log");
        assert!(target_of(&data).is_err());
        drop(lock);
    }
}
