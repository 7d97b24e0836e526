//! Σ|x−q| / (|x|+|q|), a 0/0 term counting 0; smaller is nearer.

use super::Kind;
use crate::store::codes::floors::Floor;
use crate::store::codes::Bound;
use crate::store::kernels::lanes::{fold, Lanes};

#[derive(Clone, Copy)]
pub(super) struct Canberra;

impl Kind for Canberra {
    const NAME: &'static str = "canberra";
    const CODE: u8 = 6;

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Floors(Floor::Canberra))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        canberra(query, row)
    }
}

/// Σ|x−q| / (|x|+|q|) in lanes, each term at most 1. Each term rounds
/// three times (`codes::ratios` bounds them).
fn canberra(query: &[f32], row: &[f32]) -> f32 {
    let (sum, query, row) = fold(query, row, Lanes::ZERO, |sum, q, r| {
        let denominator = q.abs() + r.abs();
        sum + denominator.simd_eq(Lanes::ZERO).select(Lanes::ZERO, (q - r).abs() / denominator)
    });
    let term = |(q, r): (&f32, &f32)| {
        let denominator = q.abs() + r.abs();
        if denominator == 0.0 {
            0.0
        } else {
            (q - r).abs() / denominator
        }
    };
    sum.reduce_add() + query.iter().zip(row).map(term).sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kernels::lanes::tests::{close, pairs, wide};

    #[test]
    fn canberra_matches_its_f64_definition() {
        for (dims, q, r) in pairs() {
            let term =
                |(q, r): (f64, f64)| if q == 0.0 && r == 0.0 { 0.0 } else { (q - r).abs() / (q.abs() + r.abs()) };
            let want: f64 = wide(&q, &r).map(term).sum();
            assert!(close(canberra(&q, &r), want, dims as f64, dims), "{dims}");
        }
        // A 0/0 term counts 0.
        assert_eq!(canberra(&[0.0, 1.0], &[0.0, -1.0]), 1.0);
    }
}
