//! max|x−q| (Chebyshev), smaller is nearer.

use super::Kind;
use crate::store::codes::floors::{Floor, Step};
use crate::store::codes::Bound;
use crate::store::kernels::lanes::{fold, Lanes};

#[derive(Clone, Copy)]
pub(super) struct Linf;

impl Kind for Linf {
    const NAME: &'static str = "linf";
    const CODE: u8 = 4;

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Floors(Floor::Steps(Step::Linf)))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        linf(query, row)
    }
}

/// max|x−q|, in lanes: exact, as no maximum rounds.
pub(super) fn linf(query: &[f32], row: &[f32]) -> f32 {
    let (max, query, row) = fold(query, row, Lanes::ZERO, |max, q, r| max.max((q - r).abs()));
    let lanes = max.to_array().into_iter();
    lanes.chain(query.iter().zip(row).map(|(q, r)| (q - r).abs())).fold(0.0, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kernels::lanes::tests::{largest, pairs};

    #[test]
    fn linf_matches_its_f64_definition() {
        for (dims, q, r) in pairs() {
            let want = largest(&q, &r);
            assert!((f64::from(linf(&q, &r)) - want).abs() <= want * f64::from(f32::EPSILON), "{dims}");
        }
        assert_eq!(linf(&[1.0, -7.0, 2.0], &[1.0, 2.0, 3.0]), 9.0);
    }
}
