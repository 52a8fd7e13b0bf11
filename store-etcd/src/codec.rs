//! The stored form of one committed transaction's events at `log/<last pos>` (a *batch*), and of
//! each event in it: flat, length-prefixed, big-endian encodings of the envelopes. Decoding
//! checks every length, the UTF-8 of every string, that positions are consecutive and end at
//! the key's position, and that the bytes end where the batch does; damage is an
//! [`Error::Corrupt`] naming the position, never a panic.
//!
//! A batch:
//!
//! ```text
//! "vmb1"                         magic
//! count                          u32 BE (at least 1)
//! count × (u32 BE length, event) the events in position order
//! ```
//!
//! An event:
//!
//! ```text
//! "vme1"                         magic
//! position, revision             u64 BE each
//! id, correlation_id             16 bytes each
//! recorded_at                    i64 BE
//! causation_id                   0x00, or 0x01 then 16 bytes
//! schema_version                 u16 BE
//! prev_hash, hash                32 bytes each
//! stream, actor, event_type      u32 BE length, UTF-8 bytes each
//! payload                        u32 BE length, bytes
//! ```

use uuid::Uuid;
use vmplane_store::{Error, Position, RecordedEvent, RecordedEventRef, Result, Timestamp};

const MAGIC: &[u8; 4] = b"vme1";
const BATCH_MAGIC: &[u8; 4] = b"vmb1";

/// A batch being built: events are appended in position order.
pub(crate) struct BatchWriter {
    out: Vec<u8>,
    count: u32,
}

impl BatchWriter {
    pub(crate) fn new() -> BatchWriter {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(BATCH_MAGIC);
        out.extend_from_slice(&0u32.to_be_bytes());
        BatchWriter { out, count: 0 }
    }

    /// Appends `event` (the next position).
    pub(crate) fn push(&mut self, event: &RecordedEventRef<'_>) {
        let at = self.out.len();
        self.out.extend_from_slice(&0u32.to_be_bytes());
        encode_into(event, &mut self.out);
        // A batch stays below etcd's 1.5 MiB request limit, far below 4 GiB.
        let len = u32::try_from(self.out.len() - at - 4).unwrap_or(u32::MAX);
        self.out[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self.count += 1;
    }

    /// The batch's bytes, for its `log/<last pos>` key.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out[4..8].copy_from_slice(&self.count.to_be_bytes());
        self.out
    }
}

/// Decodes the batch stored at `log/<last_position>`: its events, in position order, ending at
/// `last_position`.
pub(crate) fn decode_batch(last_position: u64, bytes: &[u8]) -> Result<Vec<RecordedEvent>> {
    let mut events = Vec::new();
    visit_batch(last_position, bytes, |event| {
        events.push(event.to_owned_event());
        Ok(())
    })?;
    Ok(events)
}

/// Visits the events of the batch stored at `log/<last_position>` in position order, borrowed
/// from `bytes` (nothing copied), with every check [`decode_batch`] makes. Returns the count.
pub(crate) fn visit_batch(
    last_position: u64,
    bytes: &[u8],
    mut visit: impl FnMut(RecordedEventRef<'_>) -> Result<()>,
) -> Result<u64> {
    let corrupt = |reason: String| Error::Corrupt {
        position: Position(last_position),
        reason: format!("the stored batch ending here does not decode: {reason}"),
    };
    let mut reader = Reader { bytes };
    if reader.take(4).ok_or_else(|| corrupt("truncated".into()))? != BATCH_MAGIC {
        return Err(corrupt("wrong magic".into()));
    }
    let count = u64::from(u32::from_be_bytes(
        reader.array().ok_or_else(|| corrupt("truncated".into()))?,
    ));
    if count == 0 || count > last_position {
        return Err(corrupt(format!("it claims {count} events")));
    }
    let first = last_position - count + 1;
    for position in first..=last_position {
        let chunk = reader
            .chunk()
            .ok_or_else(|| corrupt(format!("truncated before the event at {position}")))?;
        visit(decode_ref(position, chunk)?)?;
    }
    if !reader.bytes.is_empty() {
        return Err(corrupt("trailing bytes".into()));
    }
    Ok(count)
}

/// The hash of the last event of the batch stored in `bytes`, if they hold one (cheap: walks
/// the length words, decodes nothing else). The hash covers the event's content, its time and
/// the chain before it, so two batches with the same last hash are the same batch.
pub(crate) fn batch_last_hash(bytes: &[u8]) -> Option<[u8; 32]> {
    let mut reader = Reader { bytes };
    if reader.take(4)? != BATCH_MAGIC {
        return None;
    }
    let count = u32::from_be_bytes(reader.array()?);
    let mut last = None;
    for _ in 0..count {
        last = Some(reader.chunk()?);
    }
    stored_hash(last?)
}

/// Encodes one event (test helper; batches use [`BatchWriter`]).
#[cfg(test)]
pub(crate) fn encode(event: &RecordedEventRef<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(event, &mut out);
    out
}

/// Appends the encoding of `event` to `out`.
fn encode_into(event: &RecordedEventRef<'_>, out: &mut Vec<u8>) {
    out.reserve(
        200 + event.stream.len() + event.actor.len() + event.event_type.len() + event.payload.len(),
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&event.position.0.to_be_bytes());
    out.extend_from_slice(&event.revision.to_be_bytes());
    out.extend_from_slice(event.id.as_bytes());
    out.extend_from_slice(event.correlation_id.as_bytes());
    out.extend_from_slice(&event.recorded_at.0.to_be_bytes());
    match event.causation_id {
        None => out.push(0),
        Some(causation) => {
            out.push(1);
            out.extend_from_slice(causation.as_bytes());
        }
    }
    out.extend_from_slice(&event.schema_version.to_be_bytes());
    out.extend_from_slice(event.prev_hash);
    out.extend_from_slice(event.hash);
    for bytes in [
        event.stream.as_bytes(),
        event.actor.as_bytes(),
        event.event_type.as_bytes(),
        event.payload,
    ] {
        // Every field is bounded by `Limits` far below 4 GiB.
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(bytes);
    }
}

/// Decodes the event at `position` (one event of a batch).
#[cfg(test)]
fn decode(position: u64, bytes: &[u8]) -> Result<RecordedEvent> {
    decode_ref(position, bytes).map(|event| event.to_owned_event())
}

/// The event at `position` (one event of a batch), borrowed from `bytes`.
fn decode_ref(position: u64, bytes: &[u8]) -> Result<RecordedEventRef<'_>> {
    let corrupt = |reason: &str| Error::Corrupt {
        position: Position(position),
        reason: format!("the stored event does not decode: {reason}"),
    };
    let mut reader = Reader { bytes };
    if reader.take(4).ok_or_else(|| corrupt("truncated"))? != MAGIC {
        return Err(corrupt("wrong magic"));
    }
    let truncated = || corrupt("truncated");
    let stored_position = reader.u64().ok_or_else(truncated)?;
    let revision = reader.u64().ok_or_else(truncated)?;
    let id = reader.uuid().ok_or_else(truncated)?;
    let correlation_id = reader.uuid().ok_or_else(truncated)?;
    let recorded_at = reader.u64().ok_or_else(truncated)? as i64;
    let causation_id = match reader.take(1).ok_or_else(truncated)?[0] {
        0 => None,
        1 => Some(reader.uuid().ok_or_else(truncated)?),
        _ => return Err(corrupt("bad causation flag")),
    };
    let schema_version = u16::from_be_bytes(reader.array().ok_or_else(truncated)?);
    let prev_hash = reader.hash().ok_or_else(truncated)?;
    let hash = reader.hash().ok_or_else(truncated)?;
    let stream = reader.str().ok_or_else(|| corrupt("bad stream"))?;
    let actor = reader.str().ok_or_else(|| corrupt("bad actor"))?;
    let event_type = reader.str().ok_or_else(|| corrupt("bad event type"))?;
    let payload = reader.chunk().ok_or_else(truncated)?;
    if !reader.bytes.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    if stored_position != position {
        return Err(Error::Corrupt {
            position: Position(position),
            reason: format!("the event stored at {position} says it is at {stored_position}"),
        });
    }
    Ok(RecordedEventRef {
        position: Position(position),
        stream,
        revision,
        id,
        recorded_at: Timestamp(recorded_at),
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

/// The hash field of one stored event.
fn stored_hash(bytes: &[u8]) -> Option<[u8; 32]> {
    let mut reader = Reader { bytes };
    if reader.take(4)? != MAGIC {
        return None;
    }
    // position, revision, id, correlation id, recorded_at
    reader.take(8 + 8 + 16 + 16 + 8)?;
    if reader.take(1)?[0] == 1 {
        reader.take(16)?;
    }
    // schema version, previous hash
    reader.take(2 + 32)?;
    reader.array()
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }

    fn uuid(&mut self) -> Option<Uuid> {
        Some(Uuid::from_bytes(self.array()?))
    }

    fn chunk(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_be_bytes(self.array()?) as usize;
        self.take(len)
    }

    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.chunk()?).ok()
    }

    fn hash(&mut self) -> Option<&'a [u8; 32]> {
        self.take(32)?.try_into().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RecordedEvent {
        let mut event = RecordedEvent {
            position: Position(5),
            stream: "vm/default/a".into(),
            revision: 2,
            id: Uuid::now_v7(),
            recorded_at: Timestamp(-17),
            actor: "alice".into(),
            correlation_id: Uuid::now_v7(),
            causation_id: Some(Uuid::now_v7()),
            event_type: "VmCreated".into(),
            schema_version: 3,
            payload: vec![1, 2, 3],
            prev_hash: [9; 32],
            hash: [0; 32],
        };
        event.hash = vmplane_store::hash::event_hash(&event.as_ref());
        event
    }

    #[test]
    fn events_round_trip_and_damage_is_named() {
        let event = sample();
        let bytes = encode(&event.as_ref());
        assert_eq!(decode(5, &bytes).unwrap(), event);
        assert_eq!(stored_hash(&bytes), Some(event.hash));
        for cut in [0, 3, 10, bytes.len() - 1] {
            assert!(matches!(
                decode(5, &bytes[..cut]),
                Err(Error::Corrupt {
                    position: Position(5),
                    ..
                })
            ));
        }
        assert!(decode(6, &bytes).is_err(), "position pair check");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(5, &longer).is_err());
    }

    #[test]
    fn batches_round_trip_and_damage_is_named() {
        let mut events = vec![sample()];
        let mut second = sample();
        second.position = Position(6);
        second.prev_hash = events[0].hash;
        second.hash = vmplane_store::hash::event_hash(&second.as_ref());
        events.push(second);
        let mut writer = BatchWriter::new();
        for event in &events {
            writer.push(&event.as_ref());
        }
        let bytes = writer.finish();
        assert_eq!(decode_batch(6, &bytes).unwrap(), events);
        assert_eq!(batch_last_hash(&bytes), Some(events[1].hash));
        assert_eq!(batch_last_hash(&bytes[..bytes.len() - 1]), None);
        assert!(
            decode_batch(7, &bytes).is_err(),
            "the key names another last position"
        );
        for cut in [0, 3, 9, 20, bytes.len() - 1] {
            assert!(matches!(
                decode_batch(6, &bytes[..cut]),
                Err(Error::Corrupt { .. })
            ));
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_batch(6, &longer).is_err());
        let mut huge = bytes.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_batch(6, &huge).is_err());
        assert!(decode_batch(u64::MAX, &huge).is_err());
    }
}
