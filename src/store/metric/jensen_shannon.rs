//! The Jensen-Shannon divergence ½Σ x·ln(x/m) + ½Σ q·ln(q/m), m = (x+q)/2,
//! of vectors without negative values (others are refused); smaller is
//! nearer.
//!
//! Written as Σ x·ln(2x/s) + q·ln(2q/s) with s = x + q, it cancels
//! catastrophically when x ≈ q: the two terms are ±x·t with
//! t = (x−q)/(x+q), their sum s·t²/2. So each term is computed as
//! (s/2)·g(t) with g(t) = (1+t)·ln(1+t) + (1−t)·ln(1−t), even in t and at
//! least 0: for |t| ≤ 1/2 by its series t²·Σ t^(2n−2)/(n(2n−1)), nine
//! terms (the rest is below 2^-24 of the sum), otherwise as written, where
//! the two logarithms cancel by at most a factor of 2.3. Every term of the
//! sum is then within a few roundings of its own value, and all are ≥ 0,
//! so the sum is too. Each value and each sum x + q is at most 2^63
//! (`kernels::lanes`), so nothing overflows.

use super::Kind;
use crate::store::codes::floors::Floor;
use crate::store::codes::Bound;
use crate::store::kernels::lanes::{fold, Lanes, Value};

#[derive(Clone, Copy)]
pub(super) struct JensenShannon;

impl Kind for JensenShannon {
    const NAME: &'static str = "js";
    const CODE: u8 = 8;
    const NON_NEGATIVE: bool = true;

    fn first_pass(self) -> Option<Bound> {
        Some(Bound::Floors(Floor::JensenShannon))
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        jensen_shannon(query, row)
    }
}

/// The Jensen-Shannon divergence ½Σ x·ln(x/m) + ½Σ q·ln(q/m), m = (x+q)/2,
/// of vectors without negative values: ¼ Σ s·g(t) (module doc).
fn jensen_shannon(query: &[f32], row: &[f32]) -> f32 {
    let (sum, query, row) = fold(query, row, Lanes::ZERO, |sum, q, r| {
        let s = q + r;
        let t = (q - r).abs() / s;
        // 0/0 where both are 0: a term that counts 0.
        let t = s.simd_eq(Lanes::ZERO).select(Lanes::ZERO, t);
        let far = t.simd_gt(Lanes::splat(0.5));
        let mut g = series(t * t);
        if far.any() {
            let (up, down) = (Lanes::ONE + t, Lanes::ONE - t);
            // 0 · ln 0 counts 0 (t = 1: one of the pair is 0).
            let direct = up.mul_add(up.ln(), down.simd_eq(Lanes::ZERO).select(Lanes::ZERO, down * down.ln()));
            g = far.select(direct, g);
        }
        s.mul_add(g, sum)
    });
    let term = |(&q, &r): (&f32, &f32)| {
        let s = q + r;
        if s == 0.0 {
            return 0.0;
        }
        let t = (q - r).abs() / s;
        let g = if t > 0.5 {
            let (up, down) = (1.0 + t, 1.0 - t);
            up * up.ln() + if down == 0.0 { 0.0 } else { down * down.ln() }
        } else {
            series(t * t)
        };
        s * g
    };
    (sum.reduce_add() + query.iter().zip(row).map(term).sum::<f32>()) * 0.25
}

/// g(t) = t²·(1 + t²/6 + t⁴/15 + ...) for u = t² ≤ 1/4: the first nine
/// terms Σ u^n / (n(2n−1)) by Horner's rule, the same steps for lanes and
/// for one value.
#[inline(always)]
fn series<T: Value>(u: T) -> T {
    // Innermost first: 1/(n(2n−1)) for n = 9 down to 1.
    const COEFFICIENTS: [f32; 9] =
        [1.0 / 153.0, 1.0 / 120.0, 1.0 / 91.0, 1.0 / 66.0, 1.0 / 45.0, 1.0 / 28.0, 1.0 / 15.0, 1.0 / 6.0, 1.0];
    let mut acc = T::splat(COEFFICIENTS[0]);
    for &c in &COEFFICIENTS[1..] {
        acc = acc * u + T::splat(c);
    }
    acc * u
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kernels::lanes::tests::{close, pairs, wide};
    use crate::store::kernels::lanes::LANES;
    use crate::store::kernels::tests::floats;

    /// As defined, with x·ln(x/m) in f64 (which cancels less than f32
    /// by 29 bits: enough at the ratios tested).
    fn reference(q: &[f32], r: &[f32]) -> f64 {
        let term = |x: f64, m: f64| if x == 0.0 { 0.0 } else { x * (x / m).ln() };
        wide(q, r).map(|(q, r)| 0.5 * term(q, (q + r) / 2.0) + 0.5 * term(r, (q + r) / 2.0)).sum()
    }

    #[test]
    fn js_matches_its_f64_definition() {
        for (dims, q, r) in pairs() {
            let (q, r): (Vec<f32>, Vec<f32>) =
                (q.iter().map(|x| x.abs()).collect(), r.iter().map(|x| x.abs()).collect());
            let want = reference(&q, &r);
            assert!(close(jensen_shannon(&q, &r), want, want, dims), "{dims}: {} vs {want}", jensen_shannon(&q, &r));
        }
        // A zero factor counts 0; disjoint supports reach ln 2 per unit of mass.
        let js = jensen_shannon(&[1.0, 0.0], &[0.0, 1.0]);
        assert!((f64::from(js) - std::f64::consts::LN_2).abs() < 1e-6, "{js}");
    }

    /// js of near-identical vectors: the distance is t²-small, and must be
    /// found to within a few roundings of itself, not of the vectors' size
    /// (what the series is for).
    #[test]
    fn js_keeps_its_precision_for_near_identical_vectors() {
        for dims in [1, 5, 16, 17, 100, 768] {
            let q: Vec<f32> = floats(7, dims).iter().map(|x| x.abs() + 0.01).collect();
            for relative in [1e-2f32, 1e-3, 1e-5] {
                let r: Vec<f32> = q.iter().zip(floats(8, dims)).map(|(x, e)| x * (1.0 + relative * e)).collect();
                let want = reference(&q, &r);
                let got = f64::from(jensen_shannon(&q, &r));
                assert!((got - want).abs() <= 1e-5 * want, "dims {dims}, {relative}: {got} vs {want}");
            }
            assert_eq!(jensen_shannon(&q, &q), 0.0);
        }
    }

    /// js's far lanes (`t > 1/2`) take the logarithm of `1 + t`, any f32
    /// in [1.5, 2], and of `1 - t`, a multiple of 2^-24 in (0, 1/2): on
    /// every one of them, `wide`'s `ln` (these lanes') and the standard
    /// library's (the tail's) are within 2 x 2^-24 of the logarithm, as
    /// the js first pass's proof takes them to be (`codes::shannon`).
    #[test]
    fn js_logarithms_are_within_two_roundings_on_every_far_input() {
        let ups = (0..=1u32 << 22).map(|k| 1.5 + k as f32 * 2f32.powi(-23));
        let downs = (1..1u32 << 23).map(|k| k as f32 * 2f32.powi(-24));
        let inputs: Vec<f32> = ups.chain(downs).collect();
        let error = |got: f32, v: f32| {
            let want = f64::from(v).ln();
            (f64::from(got) - want).abs() / want.abs() / 2f64.powi(-24)
        };
        let mut worst: f64 = 0.0;
        let (blocks, tail) = inputs.as_chunks::<LANES>();
        for block in blocks {
            let got = Lanes::new(*block).ln().to_array();
            for (&v, &got) in block.iter().zip(&got) {
                worst = worst.max(error(got, v)).max(error(v.ln(), v));
            }
        }
        for &v in tail {
            worst = worst.max(error(v.ln(), v));
        }
        assert!(worst <= 2.0, "{worst} roundings");
    }
}
