//! The stored form of one event at `log/<pos>`: a flat, length-prefixed, big-endian encoding of
//! the envelope. Decoding checks every length, the UTF-8 of every string and that the bytes end
//! where the event does; damage is an [`Error::Corrupt`] naming the position, never a panic.
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

/// Encodes `event` for its `log/` key.
pub(crate) fn encode(event: &RecordedEventRef<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
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
    out
}

/// Decodes the event stored at `position`.
pub(crate) fn decode(position: u64, bytes: &[u8]) -> Result<RecordedEvent> {
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
    let prev_hash: [u8; 32] = reader.array().ok_or_else(truncated)?;
    let hash: [u8; 32] = reader.array().ok_or_else(truncated)?;
    let stream = reader.string().ok_or_else(|| corrupt("bad stream"))?;
    let actor = reader.string().ok_or_else(|| corrupt("bad actor"))?;
    let event_type = reader.string().ok_or_else(|| corrupt("bad event type"))?;
    let payload = reader.chunk().ok_or_else(truncated)?.to_vec();
    if !reader.bytes.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    if stored_position != position {
        return Err(Error::Corrupt {
            position: Position(position),
            reason: format!("the event stored at {position} says it is at {stored_position}"),
        });
    }
    Ok(RecordedEvent {
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

/// The id of the event stored in `bytes`, if they hold one (cheap: no full decode).
pub(crate) fn stored_id(bytes: &[u8]) -> Option<Uuid> {
    if bytes.get(..4)? != MAGIC {
        return None;
    }
    Uuid::from_slice(bytes.get(20..36)?).ok()
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

    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.chunk()?.to_vec()).ok()
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
        assert_eq!(stored_id(&bytes), Some(event.id));
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
}
