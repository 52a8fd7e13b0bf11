//! The only way time and randomness reach core.
//!
//! [`Ctx`] carries the decision's "now" and a deterministic random generator (xoshiro256**)
//! seeded by the caller: the gateway seeds it from the operating system for each command, a
//! test or a replay seeds it with a fixed value and gets exactly the same ids again.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Time and randomness for one decision.
#[derive(Debug, Clone)]
pub struct Ctx {
    now: DateTime<Utc>,
    state: [u64; 4],
}

impl Ctx {
    /// A context at `now`, with randomness from a 256-bit seed (the gateway passes 32 bytes from
    /// the operating system's generator).
    pub fn new(now: DateTime<Utc>, seed: [u8; 32]) -> Self {
        let mut state = [0u64; 4];
        for (i, chunk) in seed.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            state[i] = u64::from_le_bytes(b);
        }
        if state == [0; 4] {
            // xoshiro's one forbidden state.
            state[0] = 0x9E37_79B9_7F4A_7C15;
        }
        Ctx { now, state }
    }

    /// A context for tests and replays: time `now`, randomness from a small seed.
    pub fn seeded(now: DateTime<Utc>, seed: u64) -> Self {
        let mut sm = seed;
        let mut bytes = [0u8; 32];
        for chunk in bytes.chunks_exact_mut(8) {
            chunk.copy_from_slice(&splitmix64(&mut sm).to_le_bytes());
        }
        Ctx::new(now, bytes)
    }

    /// A context at the Unix epoch plus `secs`, seeded with `seed` (handy in tests).
    pub fn at_secs(secs: i64, seed: u64) -> Self {
        let now = DateTime::<Utc>::from_timestamp(secs, 0).unwrap_or_default();
        Ctx::seeded(now, seed)
    }

    /// The decision's time.
    pub fn now(&self) -> DateTime<Utc> {
        self.now
    }

    /// The decision's time in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.now.timestamp_millis()
    }

    /// Moves the clock (tests driving a scenario over time).
    pub fn advance_secs(&mut self, secs: i64) {
        self.now += chrono::Duration::seconds(secs);
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        // xoshiro256** (Blackman & Vigna).
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A random number in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }

    /// A random (version 4) UUID: object uids, firmware UUIDs, VMI uids.
    pub fn new_uuid_v4(&mut self) -> Uuid {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }

    /// A random locally administered, unicast MAC address (`02:xx:xx:xx:xx:xx` form).
    pub fn new_mac(&mut self) -> String {
        let b = self.next_u64().to_le_bytes();
        let first = (b[0] & 0xfc) | 0x02;
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            first, b[1], b[2], b[3], b[4], b[5]
        )
    }
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_ids() {
        let mut a = Ctx::at_secs(0, 7);
        let mut b = Ctx::at_secs(0, 7);
        assert_eq!(a.new_uuid_v4(), b.new_uuid_v4());
        assert_eq!(a.new_mac(), b.new_mac());
        assert_ne!(a.new_uuid_v4(), Ctx::at_secs(0, 8).new_uuid_v4());
        assert_eq!(a.new_uuid_v4().get_version_num(), 4);
    }
}
