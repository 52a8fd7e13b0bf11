//! The stored form of one committed batch: every event of one group commit in one value, so a
//! full-log read costs one engine lookup per batch instead of one per event.
//!
//! ```text
//! 0..4     magic "vmb1"
//! 4..8     event count n, u32 LE (n ≥ 1)
//! 8..16    first position, u64 LE (equals the batch's key: a pair check)
//! 16..     n + 1 offsets, u32 LE: event i lies at offsets[i]..offsets[i+1]
//! …        each event: zero padding to 16, then an rkyv archive of `StoredEvent` (its root last,
//!          ending at the next offset), the payload bytes 16-aligned
//! ```
//!
//! Each event is its own archive so a point read validates one event, not the batch. Every
//! read validates the bytes (rkyv's `bytecheck`) and the position; damage is an
//! [`Error::Corrupt`] naming the position, never a panic. This module knows no engine: an etcd
//! backend can store the same values.

use rkyv::rancor::Fallible;
use rkyv::ser::{Writer, WriterExt};
use rkyv::util::AlignedVec;
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::with::{ArchiveWith, SerializeWith};
use rkyv::{Archive, Place, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::types::{Position, RecordedEventRef, Timestamp};

const MAGIC: &[u8; 4] = b"vmb1";
const HEADER_BYTES: usize = 16;
/// Where events (and payloads) start, relative to the value's first byte.
const EVENT_ALIGN_BYTES: usize = 16;

/// One event as archived inside a batch.
#[derive(Archive, Serialize)]
pub(crate) struct StoredEvent {
    pub position: u64,
    pub stream: String,
    pub revision: u64,
    pub id: Uuid,
    pub recorded_at: i64,
    pub actor: String,
    pub correlation_id: Uuid,
    pub causation_id: Option<Uuid>,
    pub event_type: String,
    pub schema_version: u16,
    #[rkyv(with = Align16)]
    pub payload: Vec<u8>,
    pub prev_hash: [u8; 32],
    pub hash: [u8; 32],
}

impl From<crate::types::RecordedEvent> for StoredEvent {
    fn from(event: crate::types::RecordedEvent) -> StoredEvent {
        StoredEvent {
            position: event.position.0,
            stream: event.stream,
            revision: event.revision,
            id: event.id,
            recorded_at: event.recorded_at.0,
            actor: event.actor,
            correlation_id: event.correlation_id,
            causation_id: event.causation_id,
            event_type: event.event_type,
            schema_version: event.schema_version,
            payload: event.payload,
            prev_hash: event.prev_hash,
            hash: event.hash,
        }
    }
}

impl StoredEvent {
    /// What the log records for `proposed` at `position` as revision `revision` of `stream`,
    /// chained to `prev_hash`, with its own hash computed.
    pub fn recorded(
        proposed: crate::types::ProposedEvent,
        position: u64,
        stream: String,
        revision: u64,
        recorded_at: i64,
        prev_hash: [u8; 32],
    ) -> StoredEvent {
        let mut stored = StoredEvent {
            position,
            stream,
            revision,
            id: proposed.id,
            recorded_at,
            actor: proposed.actor,
            correlation_id: proposed.correlation_id,
            causation_id: proposed.causation_id,
            event_type: proposed.event_type,
            schema_version: proposed.schema_version,
            payload: proposed.payload,
            prev_hash,
            hash: [0; 32],
        };
        stored.hash = crate::hash::event_hash(&stored.as_event_ref());
        stored
    }

    /// This event as the log hands it out (to hash it before it is written).
    pub fn as_event_ref(&self) -> RecordedEventRef<'_> {
        RecordedEventRef {
            position: Position(self.position),
            stream: &self.stream,
            revision: self.revision,
            id: self.id,
            recorded_at: Timestamp(self.recorded_at),
            actor: &self.actor,
            correlation_id: self.correlation_id,
            causation_id: self.causation_id,
            event_type: &self.event_type,
            schema_version: self.schema_version,
            payload: &self.payload,
            prev_hash: &self.prev_hash,
            hash: &self.hash,
        }
    }
}

/// Archives a byte vector with its bytes 16-aligned, so a payload that is itself an rkyv archive
/// can usually be read in place.
pub(crate) struct Align16;

impl ArchiveWith<Vec<u8>> for Align16 {
    type Archived = ArchivedVec<u8>;
    type Resolver = VecResolver;

    fn resolve_with(field: &Vec<u8>, resolver: VecResolver, out: Place<ArchivedVec<u8>>) {
        ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<S: Fallible + Writer<S::Error> + ?Sized> SerializeWith<Vec<u8>, S> for Align16 {
    fn serialize_with(field: &Vec<u8>, serializer: &mut S) -> Result<VecResolver, S::Error> {
        let pos = serializer.align(EVENT_ALIGN_BYTES)?;
        serializer.write(field)?;
        Ok(VecResolver::from_pos(pos))
    }
}

/// Builds one batch value.
pub(crate) struct BatchWriter {
    buf: AlignedVec<16>,
    offsets: Vec<u32>,
    count: usize,
    first_position: u64,
}

impl BatchWriter {
    /// A batch of exactly `count` events starting at `first_position`.
    pub fn new(first_position: u64, count: usize, bytes_hint: usize) -> BatchWriter {
        assert!(count > 0, "a batch holds at least one event");
        let mut buf = AlignedVec::<16>::with_capacity(bytes_hint + 64 * count + 64);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&u32::try_from(count).unwrap_or(u32::MAX).to_le_bytes());
        buf.extend_from_slice(&first_position.to_le_bytes());
        buf.resize(HEADER_BYTES + 4 * (count + 1), 0);
        BatchWriter {
            buf,
            offsets: Vec::with_capacity(count + 1),
            count,
            first_position,
        }
    }

    /// Appends the next event; its position must follow the previous one.
    pub fn push(&mut self, event: &StoredEvent) -> Result<()> {
        assert_eq!(
            event.position,
            self.first_position + self.offsets.len() as u64,
            "batch positions are consecutive"
        );
        // Event i spans offsets[i]..offsets[i + 1] and its archive's root ends exactly there;
        // the alignment padding sits at the front of the span, where rkyv never looks.
        self.offsets.push(offset_u32(self.buf.len())?);
        pad_to(&mut self.buf, EVENT_ALIGN_BYTES);
        let buf = std::mem::take(&mut self.buf);
        self.buf =
            rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(event, buf).map_err(|err| {
                Error::InvalidRequest {
                    reason: format!("event cannot be encoded: {err}"),
                }
            })?;
        Ok(())
    }

    /// The finished value.
    pub fn finish(mut self) -> Result<AlignedVec<16>> {
        assert_eq!(
            self.offsets.len(),
            self.count,
            "every announced event was pushed"
        );
        self.offsets.push(offset_u32(self.buf.len())?);
        for (i, offset) in self.offsets.iter().enumerate() {
            let at = HEADER_BYTES + 4 * i;
            self.buf[at..at + 4].copy_from_slice(&offset.to_le_bytes());
        }
        Ok(self.buf)
    }
}

fn pad_to(buf: &mut AlignedVec<16>, align: usize) {
    let padded = buf.len().div_ceil(align) * align;
    buf.resize(padded, 0);
}

fn offset_u32(offset: usize) -> Result<u32> {
    u32::try_from(offset).map_err(|_| Error::InvalidRequest {
        reason: "a committed batch would exceed 4 GiB".into(),
    })
}

/// A validated view of one batch value. Construction checks the frame; each event is validated
/// when it is read.
#[derive(Clone, Copy)]
pub(crate) struct BatchView<'a> {
    bytes: &'a [u8],
    first_position: u64,
    count: usize,
}

impl<'a> BatchView<'a> {
    /// Checks the frame of a batch stored under key `key_position`. `bytes` must start 8-aligned
    /// (see [`needs_realign`]).
    pub fn new(bytes: &'a [u8], key_position: u64) -> Result<BatchView<'a>> {
        let corrupt = |reason: String| Error::Corrupt {
            position: Position(key_position),
            reason,
        };
        if bytes.len() < HEADER_BYTES || &bytes[0..4] != MAGIC {
            return Err(corrupt(format!(
                "batch header is missing ({} bytes)",
                bytes.len()
            )));
        }
        let count = read_u32(bytes, 4) as usize;
        let first_position = read_u64(bytes, 8);
        if first_position != key_position {
            return Err(corrupt(format!(
                "batch header says it starts at {first_position}"
            )));
        }
        if count == 0 {
            return Err(corrupt("batch has no events".into()));
        }
        let table_end = HEADER_BYTES + 4 * (count + 1);
        if table_end > bytes.len() {
            return Err(corrupt(format!(
                "batch of {count} events has a truncated offset table"
            )));
        }
        let mut previous = table_end;
        for i in 0..=count {
            let offset = read_u32(bytes, HEADER_BYTES + 4 * i) as usize;
            if offset < previous || offset > bytes.len() {
                return Err(corrupt(format!(
                    "the batch's offset table is damaged: offset {i} is {offset}"
                )));
            }
            previous = offset;
        }
        Ok(BatchView {
            bytes,
            first_position,
            count,
        })
    }

    /// The last event's position.
    pub fn last_position(&self) -> u64 {
        self.first_position + self.count as u64 - 1
    }

    /// How many events the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Event `index` (0-based), validated.
    pub fn event(&self, index: usize) -> Result<RecordedEventRef<'a>> {
        assert!(index < self.count, "event index within the batch");
        let position = self.first_position + index as u64;
        let start = read_u32(self.bytes, HEADER_BYTES + 4 * index) as usize;
        let end = read_u32(self.bytes, HEADER_BYTES + 4 * (index + 1)) as usize;
        let corrupt = |reason: String| Error::Corrupt {
            position: Position(position),
            reason,
        };
        let slice = &self.bytes[start..end];
        let archived = rkyv::access::<ArchivedStoredEvent, rkyv::rancor::Error>(slice)
            .map_err(|err| corrupt(format!("event bytes do not validate: {err}")))?;
        let stored_position = archived.position.to_native();
        if stored_position != position {
            return Err(corrupt(format!(
                "event says it is at position {stored_position}"
            )));
        }
        Ok(RecordedEventRef {
            position: Position(position),
            stream: archived.stream.as_str(),
            revision: archived.revision.to_native(),
            id: archived.id,
            recorded_at: Timestamp(archived.recorded_at.to_native()),
            actor: archived.actor.as_str(),
            correlation_id: archived.correlation_id,
            causation_id: archived.causation_id.as_ref().copied(),
            event_type: archived.event_type.as_str(),
            schema_version: archived.schema_version.to_native(),
            payload: archived.payload.as_slice(),
            prev_hash: &archived.prev_hash,
            hash: &archived.hash,
        })
    }

    /// Every event after position `after`, in order, to `visit`; stops early on `Break`, or at
    /// `last` (inclusive). Returns whether it stopped early.
    pub fn visit(
        &self,
        after: u64,
        last: u64,
        visit: &mut dyn FnMut(&RecordedEventRef<'_>) -> std::ops::ControlFlow<()>,
    ) -> Result<bool> {
        let start = after
            .saturating_add(1)
            .saturating_sub(self.first_position)
            .min(self.count as u64) as usize;
        for index in start..self.count {
            if self.first_position + index as u64 > last {
                return Ok(true);
            }
            let event = self.event(index)?;
            if visit(&event).is_break() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Whether `bytes` must be copied into an aligned buffer before [`BatchView::new`]: archived
/// events need 8-byte alignment (sled's inline values ≤ 22 bytes have less; larger ones are
/// 8-aligned in practice, not by promise).
pub(crate) fn needs_realign(bytes: &[u8]) -> bool {
    !(bytes.as_ptr() as usize).is_multiple_of(8)
}

/// `bytes` in a 16-aligned copy.
pub(crate) fn realigned(bytes: &[u8]) -> AlignedVec<16> {
    let mut copy = AlignedVec::<16>::with_capacity(bytes.len());
    copy.extend_from_slice(bytes);
    copy
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}
