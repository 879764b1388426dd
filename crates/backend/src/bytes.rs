//! [`Bytes`]: shared, cheaply clonable, immutable bytes.
//!
//! Invariant: `range` lies inside the owner's bytes (checked at construction and by
//! [`Bytes::slice`]), so dereferencing never panics. Cloning copies an `Arc` and a range, never
//! the bytes, so a weight tensor can be sliced per expert or per tensor-parallel rank for free.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Shared, cheaply clonable immutable bytes: an owned `Vec` or a slice of a memory map.
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Bytes {
    /// Take ownership of a vector.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Self {
            owner: Arc::new(v),
            range: 0..len,
        }
    }

    /// A view of `range` of the owner's bytes (an `Arc<memmap2::Mmap>` works as owner).
    ///
    /// # Panics
    /// If `range` is not inside the owner's bytes: that is a bug of the caller, who has
    /// already validated offsets against the file (a GGUF reader checks them first).
    pub fn from_arc(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Self {
        let len = (*owner).as_ref().len();
        assert!(
            range.start <= range.end && range.end <= len,
            "Bytes::from_arc: range {range:?} outside 0..{len}"
        );
        Self { owner, range }
    }

    /// A sub-view: `r` is relative to this view.
    ///
    /// # Panics
    /// If `r` is not inside `0..self.len()`.
    pub fn slice(&self, r: Range<usize>) -> Self {
        assert!(
            r.start <= r.end && r.end <= self.range.len(),
            "Bytes::slice: range {r:?} outside 0..{}",
            self.range.len()
        );
        Self {
            owner: Arc::clone(&self.owner),
            range: self.range.start + r.start..self.range.start + r.end,
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Self::from_vec(v)
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bytes").field("range", &self.range).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_and_offset() {
        let b = Bytes::from_vec((0u8..100).collect());
        let s = b.slice(10..50);
        assert_eq!(s.len(), 40);
        assert_eq!(s[0], 10);
        let t = s.slice(5..7);
        assert_eq!(&*t, &[15, 16]);
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![1u8, 2, 3, 4]);
        let m = Bytes::from_arc(owner, 1..3);
        assert_eq!(&*m, &[2, 3]);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn slice_out_of_range_panics_with_message() {
        let b = Bytes::from_vec(vec![0; 4]);
        let _ = b.slice(2..5);
    }
}
