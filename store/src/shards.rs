//! A hash map in many parts, for the indexes that gain an entry with nearly every append (each
//! stream, event id and claim): a single map that outgrows its table moves every entry to a
//! new one at once, and the committer does that under the indexes' write lock, stalling every
//! commit and every reader for milliseconds (10–27 ms at 60,000–120,000 entries were seen).
//! Spread over [`SHARDS`] maps, each grows on its own, at a sixty-fourth of the size. The
//! file log's indexes use it, and so do the projections' read model indexes (one entry per
//! stream, grown by the projection follower under the read model's lock).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, Hash};

use foldhash::fast::RandomState;

/// Maps an index is spread over (a power of two).
pub const SHARDS: usize = 64;

// `shard_of` takes the top log2(SHARDS) bits of a hash: only a power of two covers every shard.
const _: () = assert!(SHARDS.is_power_of_two());

/// A `HashMap<K, V>` spread over [`SHARDS`] maps by a hash of its own (each map hashes with
/// another key, so the keys of one map still spread over its table).
pub struct ShardedMap<K, V> {
    hasher: RandomState,
    shards: Box<[HashMap<K, V, RandomState>]>,
}

impl<K: Hash + Eq, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        ShardedMap {
            hasher: RandomState::default(),
            shards: (0..SHARDS)
                .map(|_| HashMap::with_hasher(RandomState::default()))
                .collect(),
        }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for ShardedMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.shards.iter().flat_map(HashMap::iter))
            .finish()
    }
}

impl<K: Hash + Eq, V> ShardedMap<K, V> {
    /// The shard of `key` (a borrowed form hashes as the key does): the top bits of its hash
    /// after a Fibonacci multiply. foldhash's fast hash of consecutive integers is, for some
    /// seeds, unevenly spread in its low and its high bits alike (over 400 processes, the
    /// largest of 64 shards of 64,000 consecutive keys took up to 2,784 of them by the low
    /// bits and 1,308 by the high bits; 1,160 at most after the multiply, which is what chance
    /// gives). The multiply moves every bit of the hash into the top ones taken here.
    pub fn shard_of<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        let spread = self
            .hasher
            .hash_one(key)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (spread >> (u64::BITS - SHARDS.trailing_zeros())) as usize
    }

    /// The value of `key`, if any.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[self.shard_of(key)].get(key)
    }

    /// The key as stored and the value of `key`, if any.
    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[self.shard_of(key)].get_key_value(key)
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[self.shard_of(key)].contains_key(key)
    }

    /// Sets `key`'s value; returns the one it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let at = self.shard_of(&key);
        self.shards[at].insert(key, value)
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let at = self.shard_of(key);
        self.shards[at].remove(key)
    }

    /// `key`'s entry in its shard.
    pub fn entry(&mut self, key: K) -> Entry<'_, K, V> {
        let at = self.shard_of(&key);
        self.shards[at].entry(key)
    }

    /// Every entry, shard by shard (in no useful order).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(HashMap::iter)
    }

    /// Entries in all shards.
    pub fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Whether no shard holds an entry.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(HashMap::is_empty)
    }

    /// Room for `additional` more entries, spread as the keys are.
    pub fn reserve(&mut self, additional: usize) {
        let each = additional.div_ceil(SHARDS);
        for shard in self.shards.iter_mut() {
            shard.reserve(each);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_what_a_hash_map_keeps() {
        let mut sharded = ShardedMap::<String, u64>::default();
        let mut plain = HashMap::<String, u64>::new();
        for i in 0..5_000u64 {
            let key = format!("vm/ns/{}", i % 3_000);
            assert_eq!(sharded.insert(key.clone(), i), plain.insert(key, i));
            if i % 7 == 0 {
                let gone = format!("vm/ns/{}", i / 2);
                assert_eq!(sharded.remove(gone.as_str()), plain.remove(gone.as_str()));
            }
            *sharded.entry(format!("count/{}", i % 10)).or_default() += 1;
            *plain.entry(format!("count/{}", i % 10)).or_default() += 1;
        }
        assert_eq!(sharded.len(), plain.len());
        for (k, v) in &plain {
            assert_eq!(sharded.get(k.as_str()), Some(v));
            assert_eq!(sharded.get_key_value(k.as_str()), Some((k, v)));
            assert!(sharded.contains_key(k.as_str()));
        }
        assert_eq!(sharded.get("vm/ns/3000"), None);
        let mut all: Vec<(&String, &u64)> = sharded.iter().collect();
        let mut expected: Vec<(&String, &u64)> = plain.iter().collect();
        all.sort();
        expected.sort();
        assert_eq!(all, expected);
    }

    #[test]
    fn the_entries_spread_over_the_shards() {
        // Consecutive keys, the indexes' usual ones, under several seeds: no shard grows much
        // past its share, so none outgrows its table with the others (a seed that spread them
        // badly made this test fail now and then).
        for _ in 0..8 {
            let mut sharded = ShardedMap::<u64, ()>::default();
            for i in 0..64_000u64 {
                sharded.insert(i, ());
            }
            let largest = sharded.shards.iter().map(HashMap::len).max().unwrap_or(0);
            assert!(largest < 1_250, "largest shard {largest} of 64,000 entries");
        }
    }
}
