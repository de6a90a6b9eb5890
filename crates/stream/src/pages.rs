//! A set of page indexes of one file, as a bitmap: the run loop keeps
//! several per file (used, prefetched, asked for, read by the application)
//! and multi-GB files have hundreds of thousands of pages, which a tree set
//! holds at tens of bytes each.

#[derive(Debug, Clone, Default)]
pub(crate) struct PageSet {
    words: Vec<u64>,
    len: u64,
}

impl PageSet {
    /// Adds `page`; returns whether it was new.
    pub(crate) fn insert(&mut self, page: u64) -> bool {
        let (w, bit) = ((page / 64) as usize, 1u64 << (page % 64));
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        let new = self.words[w] & bit == 0;
        self.words[w] |= bit;
        self.len += new as u64;
        new
    }

    /// Removes `page`; returns whether it was there.
    pub(crate) fn remove(&mut self, page: u64) -> bool {
        let (w, bit) = ((page / 64) as usize, 1u64 << (page % 64));
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        let was = *word & bit != 0;
        *word &= !bit;
        self.len -= was as u64;
        was
    }

    pub(crate) fn contains(&self, page: u64) -> bool {
        self.words
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1u64 << (page % 64)) != 0)
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_and_contains() {
        let mut s = PageSet::default();
        assert!(s.insert(3));
        assert!(!s.insert(3));
        assert!(s.insert(200));
        for p in 10..14 {
            s.insert(p);
        }
        assert_eq!(s.len(), 6);
        assert!(s.contains(200) && !s.contains(199) && !s.contains(100_000));
        assert!(s.remove(3));
        assert!(!s.remove(3));
        assert!(!s.remove(1 << 40));
        assert_eq!(s.len(), 5);
    }
}
