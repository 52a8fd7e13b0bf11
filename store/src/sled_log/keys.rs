//! The key layout of the one sled tree the log lives in. One tree, so that a group commit is one
//! `apply_batch`, which sled recovers all-or-nothing. Numbers are big-endian so key order is
//! numeric order; a one-byte prefix separates the kinds.
//!
//! ```text
//! B pos(8)                         -> batch value (crate::batch), keyed by its first position
//! C claim-key                      -> owner
//! H stream                         -> revision(8)                      checkpointed stream heads
//! I id(16)                         -> position(8) revision(8) stream   event-id index
//! M name                           -> metadata (format, heads checkpoint position)
//! S len(4) stream first-rev(8)     -> first-pos(8) count(4) batch-pos(8)   one entry per append
//! T time(8) last-pos(8)            -> ()                               one entry per batch
//! ```

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::types::{Position, Revision, Timestamp};

pub(super) const BATCH: u8 = b'B';
pub(super) const CLAIM: u8 = b'C';
pub(super) const HEAD: u8 = b'H';
pub(super) const ID: u8 = b'I';
pub(super) const STREAM: u8 = b'S';
pub(super) const TIME: u8 = b'T';

/// The format marker stored under `M format` (metadata keys start with `M`).
pub(super) const FORMAT: &[u8] = b"vmplane-sled-v1 rkyv-0.8 little-endian";
pub(super) const META_FORMAT: &[u8] = b"Mformat";
pub(super) const META_HEADS_AT: &[u8] = b"Mheads_at";

pub(super) fn batch(first_position: u64) -> [u8; 9] {
    let mut key = [BATCH; 9];
    key[1..].copy_from_slice(&first_position.to_be_bytes());
    key
}

pub(super) fn batch_position(key: &[u8]) -> Result<u64> {
    if key.len() != 9 || key[0] != BATCH {
        return Err(Error::Damaged {
            reason: format!("malformed batch key {key:02x?}"),
        });
    }
    Ok(be_u64(&key[1..9]))
}

pub(super) fn claim(key: &str) -> Vec<u8> {
    prefixed(CLAIM, key.as_bytes())
}

pub(super) fn head(stream: &str) -> Vec<u8> {
    prefixed(HEAD, stream.as_bytes())
}

pub(super) fn id(id: &Uuid) -> [u8; 17] {
    let mut key = [ID; 17];
    key[1..].copy_from_slice(id.as_bytes());
    key
}

/// Where an event id is committed (the store's shared form).
pub(super) use crate::log::IdLocation;

/// The id index's value: where the event is (position, revision, stream).
pub(super) fn id_value(position: u64, revision: Revision, stream: &str) -> Vec<u8> {
    let mut value = Vec::with_capacity(16 + stream.len());
    value.extend_from_slice(&position.to_be_bytes());
    value.extend_from_slice(&revision.to_be_bytes());
    value.extend_from_slice(stream.as_bytes());
    value
}

pub(super) fn parse_id_value(id: &Uuid, value: &[u8]) -> Result<IdLocation> {
    let damaged = || Error::Damaged {
        reason: format!("event-id index entry of {id} is malformed"),
    };
    if value.len() < 16 {
        return Err(damaged());
    }
    let stream = std::str::from_utf8(&value[16..]).map_err(|_| damaged())?;
    Ok(IdLocation {
        position: be_u64(&value[0..8]),
        revision: be_u64(&value[8..16]),
        stream: std::sync::Arc::from(stream),
    })
}

/// `S len stream` — every key of the stream starts with it.
pub(super) fn stream_prefix(stream: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 4 + stream.len() + 8);
    key.push(STREAM);
    key.extend_from_slice(&(stream.len() as u32).to_be_bytes());
    key.extend_from_slice(stream.as_bytes());
    key
}

pub(super) fn stream_entry(stream: &str, first_revision: Revision) -> Vec<u8> {
    let mut key = stream_prefix(stream);
    key.extend_from_slice(&first_revision.to_be_bytes());
    key
}

/// One append's events in one stream: revisions `first_revision..first_revision + count` at
/// positions `first_position..`, all in the batch keyed by `batch_position`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StreamEntry {
    pub first_revision: Revision,
    pub first_position: u64,
    pub count: u32,
    pub batch_position: u64,
}

impl StreamEntry {
    pub fn last_revision(&self) -> Revision {
        self.first_revision + u64::from(self.count) - 1
    }

    pub fn position_of(&self, revision: Revision) -> Position {
        Position(self.first_position + (revision - self.first_revision))
    }
}

pub(super) fn stream_value(entry: &StreamEntry) -> [u8; 20] {
    let mut value = [0u8; 20];
    value[0..8].copy_from_slice(&entry.first_position.to_be_bytes());
    value[8..12].copy_from_slice(&entry.count.to_be_bytes());
    value[12..20].copy_from_slice(&entry.batch_position.to_be_bytes());
    value
}

pub(super) fn parse_stream_entry(stream: &str, key: &[u8], value: &[u8]) -> Result<StreamEntry> {
    let prefix_len = 1 + 4 + stream.len();
    let damaged = || Error::Damaged {
        reason: format!("stream index entry of {stream} is malformed"),
    };
    if key.len() != prefix_len + 8 || value.len() != 20 {
        return Err(damaged());
    }
    let entry = StreamEntry {
        first_revision: be_u64(&key[prefix_len..]),
        first_position: be_u64(&value[0..8]),
        count: u32::from_be_bytes([value[8], value[9], value[10], value[11]]),
        batch_position: be_u64(&value[12..20]),
    };
    if entry.count == 0 || entry.first_revision == 0 || entry.batch_position > entry.first_position
    {
        return Err(damaged());
    }
    Ok(entry)
}

/// Time keys sort by time: the sign bit is flipped so negative nanos sort first.
pub(super) fn time(at: Timestamp, last_position: u64) -> [u8; 17] {
    let mut key = [TIME; 17];
    key[1..9].copy_from_slice(&((at.0 as u64) ^ (1 << 63)).to_be_bytes());
    key[9..17].copy_from_slice(&last_position.to_be_bytes());
    key
}

pub(super) fn time_position(key: &[u8]) -> Result<u64> {
    if key.len() != 17 || key[0] != TIME {
        return Err(Error::Damaged {
            reason: format!("malformed time index key {key:02x?}"),
        });
    }
    Ok(be_u64(&key[9..17]))
}

pub(super) fn be_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(word)
}

fn prefixed(prefix: u8, rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + rest.len());
    key.push(prefix);
    key.extend_from_slice(rest);
    key
}
