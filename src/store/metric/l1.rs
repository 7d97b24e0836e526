//! Σ|x−q| (Manhattan), smaller is nearer.

use super::Kind;
use crate::store::codes::floors::{Floor, Step};
use crate::store::codes::Bound;
use crate::store::kernels::lanes::{fold, Lanes};

#[derive(Clone, Copy)]
pub(super) struct L1;

impl Kind for L1 {
    const NAME: &'static str = "l1";
    const CODE: u8 = 3;

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Floors(Floor::Steps(Step::L1)))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        l1(query, row)
    }
}

/// Σ|x−q|, in lanes.
pub(super) fn l1(query: &[f32], row: &[f32]) -> f32 {
    let (sum, query, row) = fold(query, row, Lanes::ZERO, |sum, q, r| sum + (q - r).abs());
    sum.reduce_add() + query.iter().zip(row).map(|(q, r)| (q - r).abs()).sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kernels::lanes::tests::{close, pairs, wide};

    #[test]
    fn l1_matches_its_f64_definition() {
        for (dims, q, r) in pairs() {
            let want: f64 = wide(&q, &r).map(|(q, r)| (q - r).abs()).sum();
            assert!(close(l1(&q, &r), want, want, dims), "{dims}");
        }
        assert_eq!(l1(&[1.0, -7.0, 2.0], &[1.0, 2.0, 3.0]), 10.0);
    }
}
