//! Free capacity as a delta over the base rows: what the placer writes to.

use crate::capacity::node::{NodeId, ResourceId, Rows};

/// Free capacity seen through an overlay, as cluster-autoscaler's delta
/// snapshot: untouched nodes are read from the base rows in place, a node's
/// row is copied on its first write. A decision that places 250 pods copies
/// at most 250 rows, not 5,000.
pub(crate) struct Overlay<'c> {
    base: &'c Rows,
    /// Node → where its copied row starts in `rows`; `usize::MAX` if untouched.
    copied: Vec<usize>,
    rows: Vec<i128>,
}

impl<'c> Overlay<'c> {
    pub(crate) fn new(base: &'c Rows) -> Self {
        Overlay {
            base,
            copied: vec![usize::MAX; base.len()],
            rows: Vec::new(),
        }
    }

    /// What is free on node `n` now.
    pub(crate) fn get(&self, n: NodeId) -> &[i128] {
        match self.copied.get(n.index()) {
            Some(&at) if at != usize::MAX => &self.rows[at..at + self.base.width()],
            _ => self.base.free(n),
        }
    }

    /// `free[n][r] += x`. Ids past the base's width are resources no node
    /// has: nothing is ever taken from them, so nothing is given back.
    pub(crate) fn add(&mut self, n: NodeId, r: ResourceId, x: i128) {
        let (w, row, r) = (self.base.width(), n.index(), r.index());
        if r >= w || row >= self.copied.len() {
            return;
        }
        if self.copied[row] == usize::MAX {
            self.copied[row] = self.rows.len();
            self.rows.extend_from_slice(self.base.free(n));
        }
        let v = &mut self.rows[self.copied[row] + r];
        *v = v.saturating_add(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The overlay reads exactly as a full copy of the free rows that
        /// every write went to.
        #[test]
        fn the_overlay_reads_as_a_copy(
            ops in proptest::collection::vec((0..6usize, 0..5usize, -9i128..9), 0..40),
        ) {
            let mut rows = Rows::new(4, 6);
            for n in 0..6i128 {
                rows.push(&[10 + n, 8, 3, 0], &[1, 2 * n, 0, 0], 1);
            }
            let mut copy: Vec<Vec<i128>> = NodeId::all(6).map(|n| rows.free(n).to_vec()).collect();
            let mut o = Overlay::new(&rows);
            for (n, r, x) in ops {
                o.add(n.into(), r.into(), x);
                if r < 4 {
                    copy[n][r] += x;
                }
                for (m, row) in copy.iter().enumerate() {
                    proptest::prop_assert_eq!(o.get(m.into()), &row[..]);
                }
            }
        }
    }
}
