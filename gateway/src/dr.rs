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
//! `admin restore --from FILE --data DIR` builds a new data directory, one restore at a time per
//! directory: it takes an advisory lock ([`RestoreLock`], `.DIR.restore-lock` beside `DIR`,
//! released by the kernel however the process ends), refuses a `DIR` that exists, builds
//! `DIR.tmp-<uuid>` and renames it to `DIR` only when complete; a failure removes it, and a
//! later restore removes the staging directories of one that crashed.
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

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;
use vmplane_core::Event;
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

/// Writes a backup file: `FILE.tmp`, fsynced, renamed to `FILE`, directory fsynced.
pub struct BackupWriter {
    path: PathBuf,
    tmp: PathBuf,
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
            tmp,
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

    /// Writes the trailer, syncs and renames. Refuses if the count differs from the header's.
    pub fn finish(mut self) -> anyhow::Result<u64> {
        if self.written != self.header.event_count || self.last.0 != self.header.last_position {
            let _ = fs::remove_file(&self.tmp);
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
        fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("renaming to {}", self.path.display()))?;
        sync_parent(&self.path);
        Ok(self.bytes)
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
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut sha = Sha256::new();
    let mut bytes = 0u64;
    let mut read = |buf: &mut [u8], sha: &mut Sha256| -> anyhow::Result<()> {
        input
            .read_exact(buf)
            .context("the backup file is truncated")?;
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
/// replay through the store's append path rebuilds the claim table as it was.
fn claims_of(
    event: &RecordedEvent,
    firmware: &mut std::collections::HashMap<String, Uuid>,
) -> anyhow::Result<Vec<Claim>> {
    let decoded = vmplane_core::decode(&event.event_type, event.schema_version, &event.payload)
        .map_err(|e| {
            anyhow!(
                "position {}: the payload does not decode: {e}",
                event.position
            )
        })?;
    let owner = event.stream.clone();
    let acquire = |uuid: &Uuid| Claim::Acquire {
        key: vmplane_core::firmware::claim_key(uuid),
        owner: owner.clone(),
    };
    let release = |uuid: &Uuid| Claim::Release {
        key: vmplane_core::firmware::claim_key(uuid),
        owner: owner.clone(),
    };
    Ok(match decoded {
        Event::VmCreated(p) => {
            firmware.insert(owner.clone(), p.firmware_uuid);
            vec![acquire(&p.firmware_uuid)]
        }
        Event::VmiCreated(p) => {
            firmware.insert(owner.clone(), p.firmware_uuid);
            vec![acquire(&p.firmware_uuid)]
        }
        Event::FirmwareUuidAssigned(p) => {
            let previous = firmware.insert(owner.clone(), p.uuid);
            match previous {
                Some(prev) if prev != p.uuid => vec![release(&prev), acquire(&p.uuid)],
                _ => Vec::new(),
            }
        }
        Event::VmDeleted(_) | Event::VmiDeleted(_) => match firmware.remove(&owner) {
            Some(uuid) => vec![release(&uuid)],
            None => Vec::new(),
        },
        _ => Vec::new(),
    })
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

/// The system stream holding the `LogPositionVoided` events of restore `epoch`. Not an object's
/// stream: the read models skip it.
#[must_use]
pub fn void_stream(epoch: &Uuid) -> String {
    format!("system/restore/{epoch}")
}

/// The actor of the events a restore writes.
pub const RESTORE_ACTOR: &str = "system:restore";

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

impl Drop for RestoreLock {
    fn drop(&mut self) {
        // Removed while still locked (the lock goes with the file handle, right after).
        let _ = fs::remove_file(&self.path);
        let _ = fs2::FileExt::unlock(&self.file);
    }
}

/// Builds a new data directory `data` from `from`, up to `cut`. Refuses a `data` that exists or
/// that another restore is building; nothing is left behind on failure.
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
    let _lock = RestoreLock::acquire(data)?;
    if fs::symlink_metadata(data).is_ok() {
        bail!(
            "--data {}: already exists; a restore only creates a new data directory (remove it \
             or choose another path)",
            data.display()
        );
    }
    // The header is read first only to refuse a cut past the end before any work; the whole
    // file is checked while it is imported.
    let header = read_header(from).with_context(|| format!("--from {}", from.display()))?;
    if let Cut::Position(p) = cut
        && p > header.last_position
    {
        bail!(
            "--to-position {p}: the backup ends at position {}",
            header.last_position
        );
    }
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

/// Reads the preamble and header record only (not trusted: the caller checks the whole file).
fn read_header(path: &Path) -> anyhow::Result<Header> {
    let mut input = BufReader::new(File::open(path).context("opening the backup")?);
    let mut preamble = [0u8; 15];
    input
        .read_exact(&mut preamble)
        .context("the backup file is truncated")?;
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
    input
        .read_exact(&mut body)
        .context("the backup file is truncated")?;
    serde_json::from_slice(&body).context("the header is damaged")
}

/// The `LogPositionVoided` event standing at `original`'s position in a log cut at `cut`.
fn void_event(
    original: &RecordedEvent,
    epoch: Uuid,
    cut: u64,
    revision: u64,
    recorded_at: Timestamp,
    prev_hash: [u8; 32],
) -> RecordedEvent {
    let payload = vmplane_core::encode(&Event::LogPositionVoided(
        vmplane_core::event::LogPositionVoided {
            restore_epoch: epoch,
            cut_position: cut,
            voided_position: original.position.0,
            original_id: original.id,
            original_hash: original.hash,
            original_stream: original.stream.clone(),
            original_event_type: original.event_type.clone(),
            original_schema_version: original.schema_version,
            original_actor: original.actor.clone(),
            original_recorded_at_unix_nanos: original.recorded_at.0,
        },
    ));
    let mut event = RecordedEvent {
        position: original.position,
        stream: void_stream(&epoch),
        revision,
        id: Uuid::now_v7(),
        recorded_at,
        actor: RESTORE_ACTOR.into(),
        correlation_id: epoch,
        causation_id: None,
        event_type: payload.type_name.into(),
        schema_version: payload.version,
        payload: payload.bytes,
        prev_hash,
        hash: [0; 32],
    };
    event.hash = event_hash(&event.as_ref());
    event
}

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
    let mut firmware = std::collections::HashMap::new();
    // The last kept position, its time and the chain hash so far.
    let mut kept = 0u64;
    let mut kept_time = Timestamp(i64::MIN);
    let mut prev_hash = GENESIS_PREV_HASH;
    let mut cut_at: Option<u64> = None;
    let mut voided = 0u64;
    let summary = read_backup(from, |e| {
        let keep = cut_at.is_none()
            && match cut {
                Cut::End => true,
                Cut::Position(p) => e.position.0 <= p,
                Cut::Time(t) => e.recorded_at <= t,
            };
        let hash = if keep {
            let claims = claims_of(e, &mut firmware)?;
            kept = e.position.0;
            kept_time = e.recorded_at;
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
    /// The projections' digest (equal to a rebuild's).
    pub digest: String,
    /// The restore marker, if any.
    pub marker: Option<RestoreMarker>,
}

/// Offline checks of a data directory: hash chain, gapless positions, every payload decodes,
/// and the projections opened from the checkpoint have the digest of a fresh rebuild.
pub fn verify(data: &Path) -> anyhow::Result<VerifyOutcome> {
    let cannot = || format!("--data {}: cannot open the log", data.display());
    let log: Arc<dyn EventLog> = match crate::server::embedded_backend_of(data) {
        Some(Backend::File) => Arc::new(FileLog::open(data).with_context(cannot)?),
        Some(_) => Arc::new(SledLog::open(data).with_context(cannot)?),
        None => bail!("--data {}: no vmplane log here", data.display()),
    };
    let report = log
        .verify(&|t, v, p| vmplane_core::validate_payload(t, v, p).map_err(|e| e.to_string()))
        .map_err(|e| anyhow!("{e}"))?;
    let options = vmplane_projections::ProjectionOptions {
        checkpoint_every_events: 0,
        ..Default::default()
    };
    // Opening with checkpoint_every_events 0 writes nothing to the directory.
    let opened = vmplane_projections::Projections::open(Arc::clone(&log), data, options)
        .context("opening the projections from their checkpoint")?;
    let rebuilt = vmplane_projections::Projections::in_memory(Arc::clone(&log), options)
        .context("rebuilding the projections")?;
    let (digest, fresh) = (opened.digest()?, rebuilt.digest()?);
    if digest != fresh {
        let (a, b) = (opened.canonical_content()?, rebuilt.canonical_content()?);
        let first = a
            .iter()
            .zip(&b)
            .find(|(x, y)| x != y)
            .map(|(x, y)| format!("checkpoint has {x}, rebuild has {y}"))
            .unwrap_or_else(|| format!("{} vs {} lines", a.len(), b.len()));
        bail!("projection digest {digest} differs from a rebuild's {fresh}: {first}");
    }
    Ok(VerifyOutcome {
        events: report.events,
        head_hash: report.head_hash,
        digest,
        marker: RestoreMarker::read(data)?,
    })
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
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(crate::client::status_error)?
    {
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
    let writer = writer.ok_or_else(|| anyhow!("the server sent no backup"))?;
    let (events, last) = (writer.written, writer.last);
    let bytes = writer.finish()?;
    if let Some(p) = &progress {
        p.finish();
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "backup written to {}: {events} events (positions 1..={}), {bytes} bytes, last hash {}, in {secs:.2}s",
        out.display(),
        last.0,
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
        AdminCommand::Verify { data } => {
            let v = verify(&data)?;
            println!(
                "ok: {} events, head position {}, head hash {}, projection digest {}{}",
                v.events,
                v.events,
                hex::encode(v.head_hash),
                v.digest,
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
