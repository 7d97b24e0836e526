//! Bounded top-k selection: keeps the k nearest candidates seen so far.
//!
//! Candidates are ordered by `(distance, id)`, so equal distances are broken by
//! id ascending and the result is the same whatever order rows are scanned in.
//! The buffer is reused between searches; a search allocates nothing once it
//! has grown to the largest k asked for.

use std::cmp::Ordering;

/// One scored row. Smaller `distance` is nearer (similarities are negated).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub distance: f32,
    pub id: i64,
    pub row: u32,
}

impl Candidate {
    #[inline]
    fn cmp_key(&self, other: &Candidate) -> Ordering {
        self.distance.total_cmp(&other.distance).then(self.id.cmp(&other.id))
    }
}

/// A max-heap of at most `k` candidates; its root is the farthest kept.
#[derive(Default)]
pub struct TopK {
    heap: Vec<Candidate>,
    k: usize,
}

impl TopK {
    pub fn new() -> TopK {
        TopK::default()
    }

    /// Starts a new selection of at most `k` candidates, keeping the allocation.
    pub fn reset(&mut self, k: usize) {
        self.heap.clear();
        self.k = k;
        if self.heap.capacity() < k {
            self.heap.reserve(k);
        }
    }

    /// How many candidates it keeps at most.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The distance a candidate must beat to enter, once the heap is full.
    #[inline]
    pub fn threshold(&self) -> Option<f32> {
        if self.heap.len() == self.k {
            self.heap.first().map(|c| c.distance)
        } else {
            None
        }
    }

    #[inline]
    pub fn push(&mut self, candidate: Candidate) {
        // NaN (from inf - inf in extreme inputs) ranks as the farthest possible.
        let candidate =
            if candidate.distance.is_nan() { Candidate { distance: f32::INFINITY, ..candidate } } else { candidate };
        if self.heap.len() < self.k {
            self.heap.push(candidate);
            self.sift_up(self.heap.len() - 1);
        } else if self.k > 0 && candidate.cmp_key(&self.heap[0]) == Ordering::Less {
            self.heap[0] = candidate;
            self.sift_down(0);
        }
    }

    /// Sorts the kept candidates nearest first and returns them.
    pub fn sorted(&mut self) -> &[Candidate] {
        self.heap.sort_unstable_by(Candidate::cmp_key);
        // The heap property is gone; only `reset` may follow.
        self.k = 0;
        &self.heap
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[i].cmp_key(&self.heap[parent]) == Ordering::Greater {
                self.heap.swap(i, parent);
                i = parent;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let mut largest = left;
            if right < n && self.heap[right].cmp_key(&self.heap[left]) == Ordering::Greater {
                largest = right;
            }
            if self.heap[largest].cmp_key(&self.heap[i]) == Ordering::Greater {
                self.heap.swap(i, largest);
                i = largest;
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select(k: usize, items: &[(f32, i64)]) -> Vec<i64> {
        let mut top = TopK::new();
        top.reset(k);
        for (row, &(distance, id)) in items.iter().enumerate() {
            top.push(Candidate { distance, id, row: row as u32 });
        }
        top.sorted().iter().map(|c| c.id).collect()
    }

    #[test]
    fn keeps_the_k_smallest_in_order() {
        let items: Vec<(f32, i64)> = (0..100).map(|i| (((i * 37) % 100) as f32, i)).collect();
        let mut expected: Vec<(f32, i64)> = items.clone();
        expected.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for k in [0, 1, 2, 5, 99, 100, 150] {
            let want: Vec<i64> = expected.iter().take(k).map(|x| x.1).collect();
            assert_eq!(select(k, &items), want, "k={k}");
        }
    }

    #[test]
    fn ties_break_by_id_ascending_whatever_the_scan_order() {
        let items = [(1.0, 9), (1.0, 3), (0.5, 7), (1.0, 1), (1.0, 5)];
        assert_eq!(select(3, &items), vec![7, 1, 3]);
        let reversed: Vec<_> = items.iter().rev().copied().collect();
        assert_eq!(select(3, &reversed), vec![7, 1, 3]);
    }

    #[test]
    fn nan_ranks_last() {
        assert_eq!(select(2, &[(f32::NAN, 1), (5.0, 2), (f32::INFINITY, 0)]), vec![2, 0]);
    }
}
