//! `QuotaSet`: some of a limit's quotas, by index.

use std::fmt;

use crate::limit::MAX_QUOTAS;

/// Some quotas of one [`Limit`](crate::Limit), by their index in
/// [`Limit::quotas`](crate::Limit::quotas); what
/// [`Decision::violated_quotas`](crate::Decision::violated_quotas) answers. Bit `i` of
/// [`bits`](Self::bits) is quota `i`: a limit has at most [`MAX_QUOTAS`] (8).
///
/// ```
/// use ratelimit_core::QuotaSet;
///
/// let set = QuotaSet::EMPTY.with(0).with(2);
/// assert!(set.contains(2) && !set.contains(1));
/// assert_eq!(set.iter().collect::<Vec<_>>(), [0, 2]);
/// assert_eq!(set.len(), 2);
/// assert_eq!(set, QuotaSet::from_bits(0b101));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QuotaSet(u8);

impl QuotaSet {
    /// No quota.
    pub const EMPTY: QuotaSet = QuotaSet(0);

    /// The quotas whose bits are set in `bits` (bit `i`: quota `i`).
    #[must_use]
    pub const fn from_bits(bits: u8) -> Self {
        QuotaSet(bits)
    }

    /// The set as bits (bit `i`: quota `i`).
    #[must_use]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The same set with quota `index` in it. An index of [`MAX_QUOTAS`] or more names no quota
    /// of any limit, and leaves the set as it is.
    #[must_use]
    pub const fn with(self, index: usize) -> Self {
        if index < MAX_QUOTAS {
            QuotaSet(self.0 | (1 << index))
        } else {
            self
        }
    }

    /// The quotas in `self` or in `other`.
    #[must_use]
    pub const fn union(self, other: QuotaSet) -> Self {
        QuotaSet(self.0 | other.0)
    }

    /// Whether quota `index` is in the set.
    #[must_use]
    pub const fn contains(self, index: usize) -> bool {
        index < MAX_QUOTAS && self.0 & (1 << index) != 0
    }

    /// How many quotas are in the set.
    #[must_use]
    pub const fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set holds no quota.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The indices in the set, in increasing order.
    #[must_use]
    pub const fn iter(self) -> QuotaSetIter {
        QuotaSetIter(self.0)
    }
}

impl fmt::Debug for QuotaSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl IntoIterator for QuotaSet {
    type Item = usize;
    type IntoIter = QuotaSetIter;

    fn into_iter(self) -> QuotaSetIter {
        self.iter()
    }
}

/// The indices of a [`QuotaSet`], in increasing order.
#[derive(Debug, Clone)]
pub struct QuotaSetIter(u8);

impl Iterator for QuotaSetIter {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(i)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for QuotaSetIter {}

impl std::iter::FusedIterator for QuotaSetIter {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_set_iterates_its_bits_in_order() {
        for bits in 0..=u8::MAX {
            let set = QuotaSet::from_bits(bits);
            let listed: Vec<usize> = set.iter().collect();
            let expected: Vec<usize> = (0..8).filter(|&i| bits & (1 << i) != 0).collect();
            assert_eq!(listed, expected);
            assert_eq!(set.len(), expected.len());
            assert_eq!(set.iter().len(), expected.len());
            assert_eq!(set.is_empty(), bits == 0);
            let rebuilt = expected.iter().fold(QuotaSet::EMPTY, |s, &i| s.with(i));
            assert_eq!(rebuilt, set);
            assert!((0..8).all(|i| set.contains(i) == expected.contains(&i)));
        }
    }

    #[test]
    fn indices_beyond_the_most_quotas_are_never_in_a_set() {
        let set = QuotaSet::from_bits(0b1);
        assert_eq!(set.with(MAX_QUOTAS), set);
        assert_eq!(set.with(usize::MAX), set);
        assert!(!QuotaSet::from_bits(u8::MAX).contains(MAX_QUOTAS));
        assert!(!QuotaSet::from_bits(u8::MAX).contains(usize::MAX));
        assert_eq!(format!("{:?}", QuotaSet::from_bits(0b1010)), "{1, 3}");
    }
}
