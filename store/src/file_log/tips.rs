//! The last revision of every stream, kept apart from the other indexes so that asking it
//! never waits for a commit: the committer holds the indexes' write lock while it adds a
//! record (and, now and then, while a map of every stream or event id grows), and a command
//! asks its stream's revision before it decides. Here a stream's revision sits in one of many
//! small maps, each with its own lock, held for one lookup or one update.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, PoisonError, RwLock};

use foldhash::fast::RandomState;

use crate::shards::SHARDS;
use crate::types::Revision;

/// One of the maps, with its lock.
type Shard = RwLock<HashMap<Arc<str>, Revision, RandomState>>;

/// Each stream's last durable revision.
pub(super) struct Tips {
    hasher: RandomState,
    shards: Box<[Shard]>,
}

impl Default for Tips {
    fn default() -> Self {
        Tips {
            hasher: RandomState::default(),
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }
}

impl Tips {
    fn shard(&self, stream: &str) -> &Shard {
        let at = self.hasher.hash_one(stream) as usize % SHARDS;
        &self.shards[at]
    }

    /// `stream`'s last revision, if it has events.
    pub(super) fn get(&self, stream: &str) -> Option<Revision> {
        self.shard(stream)
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(stream)
            .copied()
    }

    /// `stream` (the indexes' own key, shared) is at `revision` now.
    pub(super) fn set(&self, stream: &Arc<str>, revision: Revision) {
        let mut shard = self
            .shard(stream)
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match shard.get_mut(&**stream) {
            Some(tip) => *tip = revision,
            None => {
                shard.insert(Arc::clone(stream), revision);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_reads_the_last_revision_set_and_others_read_none() {
        let tips = Tips::default();
        let streams: Vec<Arc<str>> = (0..500).map(|i| Arc::from(format!("vm/ns/{i}"))).collect();
        for (i, s) in streams.iter().enumerate() {
            tips.set(s, 1);
            tips.set(s, i as Revision + 1);
        }
        for (i, s) in streams.iter().enumerate() {
            assert_eq!(tips.get(s), Some(i as Revision + 1), "{s}");
        }
        assert_eq!(tips.get("vm/ns/500"), None);
        // Spread over the maps, not all in one.
        let used = tips
            .shards
            .iter()
            .filter(|s| !s.read().unwrap().is_empty())
            .count();
        assert!(used > SHARDS / 2, "{used} of {SHARDS} maps used");
    }
}
