//! A vector that never moves its elements as it grows: the read model's entries (one per
//! stream). A `Vec` that outgrows its allocation copies every element to a new one at once;
//! the projection follower grows the entries under the read model's write lock, so each
//! doubling stalls every read for as long as the copy takes (tens of milliseconds at a
//! million streams). Here the elements live in chunks of [`CHUNK`]: past the first, a chunk is
//! allocated at its full size and never grows, so a push copies at most one chunk's worth (the
//! first, while it grows). Serialized as a plain sequence, as the `Vec` it replaces was.
//!
//! Chunks are shared, copied on write: a clone costs one reference count per chunk, and the
//! original copies a chunk only when it first changes it while a clone still holds it. A
//! checkpoint serializes such a clone on a thread of its own, without the read model's lock,
//! while the follower goes on changing the model.

use std::fmt;
use std::ops::{Index, IndexMut};
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
use serde::ser::{Serialize, Serializer};

/// Elements per chunk (a power of two: the index splits with a shift and a mask).
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A growable sequence of `T` whose elements stay where they were put.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ChunkedVec<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T> Default for ChunkedVec<T> {
    fn default() -> Self {
        ChunkedVec {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> ChunkedVec<T> {
    /// Elements held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The element at `index`, if there is one.
    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        self.chunks
            .get(index >> CHUNK_BITS)?
            .get(index & (CHUNK - 1))
    }

    /// Every element, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }

    /// Room for `additional` more elements' chunks in the list of chunks (the chunks
    /// themselves are allocated as they fill).
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.chunks.reserve(additional.div_ceil(CHUNK));
    }
}

impl<T: Clone> ChunkedVec<T> {
    /// Chunk `i` (the first if 0), to change: copied first if a clone still shares it (a copy
    /// past the first chunk gets its full size at once, so it never moves again).
    fn own(chunk: &mut Arc<Vec<T>>, i: usize) -> &mut Vec<T> {
        let chunk = Arc::make_mut(chunk);
        if i > 0 && chunk.capacity() < CHUNK {
            chunk.reserve_exact(CHUNK - chunk.len());
        }
        chunk
    }

    /// Appends `value`.
    pub(crate) fn push(&mut self, value: T) {
        let last = self.chunks.len().checked_sub(1);
        match last.filter(|&i| self.chunks[i].len() < CHUNK) {
            Some(i) => Self::own(&mut self.chunks[i], i).push(value),
            None => {
                // The first chunk grows as a `Vec` does (a small model stays small); every
                // later one starts at its full size.
                let mut chunk = if self.chunks.is_empty() {
                    Vec::new()
                } else {
                    Vec::with_capacity(CHUNK)
                };
                chunk.push(value);
                self.chunks.push(Arc::new(chunk));
            }
        }
        self.len += 1;
    }

    /// The element at `index`, if there is one, to change (its chunk is copied first if a
    /// clone still shares it).
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        if index >= self.len {
            return None;
        }
        let i = index >> CHUNK_BITS;
        Self::own(self.chunks.get_mut(i)?, i).get_mut(index & (CHUNK - 1))
    }
}

impl<T> Index<usize> for ChunkedVec<T> {
    type Output = T;

    /// Panics past the end, as a slice does.
    fn index(&self, index: usize) -> &T {
        match self.get(index) {
            Some(value) => value,
            None => panic!("index {index} out of {} elements", self.len),
        }
    }
}

impl<T: Clone> IndexMut<usize> for ChunkedVec<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        let len = self.len;
        match self.get_mut(index) {
            Some(value) => value,
            None => panic!("index {index} out of {len} elements"),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for ChunkedVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: Serialize> Serialize for ChunkedVec<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // With its length, as a slice gives it (formats that are not self-describing need it).
        let mut seq = serializer.serialize_seq(Some(self.len))?;
        for value in self.iter() {
            seq.serialize_element(value)?;
        }
        seq.end()
    }
}

impl<'de, T: Deserialize<'de> + Clone> Deserialize<'de> for ChunkedVec<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Elements<T>(std::marker::PhantomData<T>);

        impl<'de, T: Deserialize<'de> + Clone> Visitor<'de> for Elements<T> {
            type Value = ChunkedVec<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = ChunkedVec::default();
                while let Some(value) = seq.next_element()? {
                    out.push(value);
                }
                Ok(out)
            }
        }

        deserializer.deserialize_seq(Elements(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_what_a_vec_keeps_across_chunks() {
        let mut chunked = ChunkedVec::default();
        let mut plain = Vec::new();
        for i in 0..(3 * CHUNK + 5) {
            chunked.push(i.to_string());
            plain.push(i.to_string());
        }
        assert_eq!(chunked.len(), plain.len());
        assert!(chunked.iter().eq(plain.iter()));
        for i in [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 7, plain.len() - 1] {
            assert_eq!(chunked[i], plain[i]);
            assert_eq!(chunked.get(i), plain.get(i));
        }
        assert_eq!(chunked.get(plain.len()), None);
        chunked[CHUNK] = "changed".into();
        assert_eq!(chunked[CHUNK], "changed");
        // Serialized as the `Vec` was, and read back the same.
        plain[CHUNK] = "changed".into();
        let json = serde_json::to_string(&chunked).expect("serializes");
        assert_eq!(json, serde_json::to_string(&plain).expect("serializes"));
        let back: ChunkedVec<String> = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, chunked);
    }

    #[test]
    fn growing_never_moves_an_element_past_the_first_chunk() {
        let mut chunked = ChunkedVec::default();
        for i in 0..(CHUNK + 1) {
            chunked.push(i);
        }
        let second: *const usize = &chunked[CHUNK];
        let first_full: *const usize = &chunked[0];
        for i in 0..(8 * CHUNK) {
            chunked.push(i);
        }
        assert_eq!(second, &chunked[CHUNK] as *const usize, "moved as it grew");
        assert_eq!(
            first_full, &chunked[0] as *const usize,
            "a full first chunk moved"
        );
    }

    #[test]
    fn a_clone_shares_every_chunk_and_keeps_its_elements_while_the_original_changes() {
        let mut original = ChunkedVec::default();
        for i in 0..(2 * CHUNK + 10) {
            original.push(i);
        }
        let clone = original.clone();
        assert!(
            original
                .chunks
                .iter()
                .zip(&clone.chunks)
                .all(|(a, b)| Arc::ptr_eq(a, b)),
            "a clone copied a chunk"
        );
        // The original changes one element and grows the last chunk: those two chunks are
        // copied, the middle one is still shared.
        original[5] = 1_000_000;
        original.push(7);
        assert_eq!(clone[5], 5);
        assert_eq!(clone.len(), 2 * CHUNK + 10);
        assert_eq!(clone.get(2 * CHUNK + 10), None);
        assert!(clone.iter().copied().eq(0..(2 * CHUNK + 10)));
        assert_eq!((original[5], original[2 * CHUNK + 10]), (1_000_000, 7));
        assert!(!Arc::ptr_eq(&original.chunks[0], &clone.chunks[0]));
        assert!(Arc::ptr_eq(&original.chunks[1], &clone.chunks[1]));
        assert!(!Arc::ptr_eq(&original.chunks[2], &clone.chunks[2]));
        // The copied last chunk got its full size: it does not move as it fills.
        let at: *const usize = &original[2 * CHUNK];
        for i in 0..(CHUNK - 11) {
            original.push(i);
        }
        assert_eq!(at, &original[2 * CHUNK] as *const usize, "moved as it grew");
        assert_eq!(original.chunks.len(), 3);
    }
}
