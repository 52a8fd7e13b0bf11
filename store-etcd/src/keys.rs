//! The key layout under one namespace, and the small text values stored at the index keys.
//!
//! ```text
//! <ns>/v1/head                                  "<pos:020>:<hash hex>:<recorded_at>"  the CAS word
//! <ns>/v1/log/<last pos:020>                    the events of one committed transaction, in
//!                                               position order (a batch, codec.rs); the key
//!                                               names its LAST position    immutable, create-only
//! <ns>/v1/claim/<key>                           owner                          put / deleted
//! <ns>/v1/time/<recorded_at:020>/<pos:020>      ""  one per committed batch (its first position)
//! <ns>/v1/leader/<name>                         holder  with the term's lease; create revision =
//!                                               the fence token of the term
//! ```
//!
//! Numbers are zero-padded so key order is numeric order. Every commit writes its events as one
//! batch under one key (etcd's cost is per operation in a transaction, not per byte), keyed by
//! its last position: batches are contiguous, so the batch holding position `p` is the first key
//! at or after `log/<p>`, one ascending `limit 1` range with no window to bound, and reading
//! the log after `p` is an ascending range from `log/<p + 1>` (its first batch may start before
//! `p + 1`; readers skip what they do not want). An append's events are always in one batch.
//! There is no key per event id or per stream: those indexes are kept in memory from the
//! batches (`index.rs`). Logs written before that change also hold `id/` and `stream/` keys;
//! nothing reads them. `recorded_at` (signed nanoseconds) is stored offset by 2^63 so it sorts
//! as unsigned.

use vmplane_store::{Error, Position, Result, Revision, Timestamp};

/// The keys of one log, all under `<namespace>/v1/`.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    root: String,
}

impl Keys {
    pub(crate) fn new(namespace: &str) -> Keys {
        Keys {
            root: format!("{}/v1/", namespace.trim_end_matches('/')),
        }
    }

    /// `<namespace>/v1/`: every key of this log is under it.
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    pub(crate) fn head(&self) -> Vec<u8> {
        format!("{}head", self.root).into_bytes()
    }

    /// The key of the batch whose last position is `position`; as a range start, the batch
    /// holding `position`.
    pub(crate) fn log(&self, position: u64) -> Vec<u8> {
        format!("{}log/{position:020}", self.root).into_bytes()
    }

    pub(crate) fn log_prefix(&self) -> Vec<u8> {
        format!("{}log/", self.root).into_bytes()
    }

    /// The (last) position a `log/` key names.
    pub(crate) fn log_position(&self, key: &[u8]) -> Option<u64> {
        let rest = key.strip_prefix(self.log_prefix().as_slice())?;
        parse_u64(rest)
    }

    pub(crate) fn claim(&self, key: &str) -> Vec<u8> {
        format!("{}claim/{key}", self.root).into_bytes()
    }

    /// The key of leadership `name`: created with a lease by the term that holds it
    /// ([`crate::Election`]); its create revision is the term's fence token.
    pub(crate) fn fence(&self, name: &str) -> Vec<u8> {
        format!("{}leader/{name}", self.root).into_bytes()
    }

    pub(crate) fn time(&self, at: Timestamp, first_position: u64) -> Vec<u8> {
        format!(
            "{}time/{:020}/{first_position:020}",
            self.root,
            time_order(at)
        )
        .into_bytes()
    }

    pub(crate) fn time_prefix(&self) -> Vec<u8> {
        format!("{}time/", self.root).into_bytes()
    }

    /// The first position a `time/` key names.
    pub(crate) fn time_position(&self, key: &[u8]) -> Option<u64> {
        let rest = key.strip_prefix(self.time_prefix().as_slice())?;
        if rest.len() != 41 || rest[20] != b'/' {
            return None;
        }
        parse_u64(&rest[21..])
    }
}

fn time_order(at: Timestamp) -> u64 {
    (at.0 as u64) ^ (1 << 63)
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The smallest key after `key`: makes an inclusive range end exclusive.
pub(crate) fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// The global head: the last position, its hash and its `recorded_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub position: u64,
    pub hash: [u8; 32],
    pub recorded_at: i64,
}

impl Head {
    pub(crate) const EMPTY: Head = Head {
        position: 0,
        hash: vmplane_store::hash::GENESIS_PREV_HASH,
        recorded_at: i64::MIN,
    };

    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{:020}:{}:{}",
            self.position,
            hex::encode(self.hash),
            self.recorded_at
        )
        .into_bytes()
    }

    pub(crate) fn decode(value: &[u8]) -> Result<Head> {
        let damaged = || Error::Damaged {
            reason: format!(
                "the etcd head key holds {:?}, not <position>:<hash>:<recorded_at>",
                String::from_utf8_lossy(&value[..value.len().min(200)])
            ),
        };
        let text = std::str::from_utf8(value).map_err(|_| damaged())?;
        let mut parts = text.splitn(3, ':');
        let (Some(position), Some(hash), Some(recorded_at)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(damaged());
        };
        let position = parse_u64(position.as_bytes()).ok_or_else(damaged)?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hash, &mut bytes).map_err(|_| damaged())?;
        let recorded_at = recorded_at.parse().map_err(|_| damaged())?;
        Ok(Head {
            position,
            hash: bytes,
            recorded_at,
        })
    }
}

/// Where an event id is committed (the store's shared form).
pub(crate) use vmplane_store::log::IdLocation;

/// A run of a stream's events in the index: revisions `first_revision..` at positions
/// `first_position..`, `count` of them (one append, or several that followed each other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamEntry {
    pub first_revision: Revision,
    pub first_position: u64,
    pub count: u64,
}

impl StreamEntry {
    pub(crate) fn last_revision(&self) -> Revision {
        self.first_revision + self.count - 1
    }

    pub(crate) fn position_of(&self, revision: Revision) -> Position {
        Position(self.first_position + (revision - self.first_revision))
    }
}

/// The end of a key range covering every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_numerically() {
        let keys = Keys::new("ns/");
        assert_eq!(keys.head(), b"ns/v1/head");
        assert!(keys.log(9) < keys.log(10));
        assert_eq!(keys.log_position(&keys.log(42)), Some(42));
        assert!(keys.time(Timestamp(-1), 5) < keys.time(Timestamp(0), 1));
        assert!(keys.time(Timestamp(i64::MIN), 0) < keys.time(Timestamp(i64::MAX), 0));
        assert_eq!(keys.time_position(&keys.time(Timestamp(7), 99)), Some(99));
        assert_eq!(prefix_end(b"a/"), b"a0");
    }

    #[test]
    fn values_round_trip() {
        let head = Head {
            position: 12,
            hash: [7; 32],
            recorded_at: -5,
        };
        assert_eq!(Head::decode(&head.encode()).unwrap(), head);
        assert!(Head::decode(b"12:zz:0").is_err());
    }
}
