//! Σ|x−q| / Σ|x+q| (Bray-Curtis), smaller is nearer: 0 when both sums
//! are 0, +inf when only the second is.

use super::Kind;
use crate::store::codes::floors::{Floor, Step};
use crate::store::codes::Bound;
use crate::store::kernels::lanes::{fold, Lanes};

#[derive(Clone, Copy)]
pub(super) struct BrayCurtis;

impl Kind for BrayCurtis {
    const NAME: &'static str = "bc";
    const CODE: u8 = 7;

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Floors(Floor::Steps(Step::BrayCurtis)))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        bray_curtis(query, row)
    }
}

/// Both sums in lanes at once, then their quotient.
fn bray_curtis(query: &[f32], row: &[f32]) -> f32 {
    let ((differences, sums), query, row) =
        fold(query, row, (Lanes::ZERO, Lanes::ZERO), |(d, s), q, r| (d + (q - r).abs(), s + (q + r).abs()));
    let differences = differences.reduce_add() + query.iter().zip(row).map(|(q, r)| (q - r).abs()).sum::<f32>();
    let sums = sums.reduce_add() + query.iter().zip(row).map(|(q, r)| (q + r).abs()).sum::<f32>();
    if differences == 0.0 {
        0.0
    } else {
        differences / sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kernels::lanes::tests::{close, pairs, wide};

    #[test]
    fn bray_curtis_matches_its_f64_definition() {
        for (dims, q, r) in pairs() {
            let d: f64 = wide(&q, &r).map(|(q, r)| (q - r).abs()).sum();
            let s: f64 = wide(&q, &r).map(|(q, r)| (q + r).abs()).sum();
            let want = if d == 0.0 { 0.0 } else { d / s };
            assert!(close(bray_curtis(&q, &r), want, want, dims), "{dims}: {} vs {want}", bray_curtis(&q, &r));
        }
        assert_eq!(bray_curtis(&[0.0; 20], &[0.0; 20]), 0.0);
        assert_eq!(bray_curtis(&[1.0; 20], &[-1.0; 20]), f32::INFINITY);
        assert_eq!(bray_curtis(&[1.0, 2.0], &[3.0, 2.0]), 2.0 / 8.0);
    }
}
