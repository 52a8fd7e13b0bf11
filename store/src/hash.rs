//! The hash chain: SHA-256 over a canonical, length-prefixed, big-endian encoding of an event's
//! envelope, payload and the previous event's hash. Every backend uses this one function, so a
//! log exported from one verifies under another.
//!
//! The encoding, in order:
//!
//! ```text
//! "vmplane.event.v1"            16 bytes, domain separation
//! position                      u64 BE
//! stream                        u32 BE length, UTF-8 bytes
//! revision                      u64 BE
//! id                            16 bytes
//! recorded_at                   i64 BE (unix nanos)
//! actor                         u32 BE length, UTF-8 bytes
//! correlation_id                16 bytes
//! causation_id                  0x00, or 0x01 then 16 bytes
//! event_type                    u32 BE length, UTF-8 bytes
//! schema_version                u16 BE
//! payload                       u64 BE length, bytes
//! prev_hash                     32 bytes
//! ```

use sha2::{Digest, Sha256};

use crate::types::RecordedEventRef;

/// The hash the genesis event chains from.
pub const GENESIS_PREV_HASH: [u8; 32] = [0; 32];

const DOMAIN: &[u8; 16] = b"vmplane.event.v1";

/// The hash of `event`, computed over every field except `event.hash` itself.
#[must_use]
pub fn event_hash(event: &RecordedEventRef<'_>) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(DOMAIN);
    hasher.update(event.position.0.to_be_bytes());
    update_str(&mut hasher, event.stream);
    hasher.update(event.revision.to_be_bytes());
    hasher.update(event.id.as_bytes());
    hasher.update(event.recorded_at.0.to_be_bytes());
    update_str(&mut hasher, event.actor);
    hasher.update(event.correlation_id.as_bytes());
    match event.causation_id {
        None => hasher.update([0u8]),
        Some(causation_id) => {
            hasher.update([1u8]);
            hasher.update(causation_id.as_bytes());
        }
    }
    update_str(&mut hasher, event.event_type);
    hasher.update(event.schema_version.to_be_bytes());
    hasher.update((event.payload.len() as u64).to_be_bytes());
    hasher.update(event.payload);
    hasher.update(event.prev_hash);
    hasher.finalize().into()
}

fn update_str(hasher: &mut Sha256, text: &str) {
    // Every string is bounded by `Limits` far below 4 GiB; saturating keeps the function total.
    let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
    hasher.update(len.to_be_bytes());
    hasher.update(text.as_bytes());
}
