//! (Σ|x−q|^p)^(1/p) (Minkowski), smaller is nearer, for a `p` above 0.
//!
//! Summed as written, it would overflow (|x−q|^p with p = 3 reaches 2^189)
//! or underflow (the distances of tiny vectors to the power p). So each
//! pair is scaled by its largest difference m = max|x−q| first:
//! lp = m · (Σ (|x−q|/m)^p)^(1/p). Every term is then at most 1, one of them
//! exactly 1, so the sum lies in [1, dims] and a term too small for f32 is
//! below the sum's own rounding. The root is taken in f64. A p that is a
//! multiple of 1/4 up to 8 raises by multiplying and square roots; any
//! other by `wide`'s e^(p·ln r), ten times the arithmetic. For p ≥ 1 the
//! result is at most l1's, so finite; for p < 1 it can exceed f32's range
//! (all differences near 2^63 and p below about 0.13), and is then +inf.

use super::l1::l1;
use super::linf::linf;
use super::Kind;
use crate::store::codes::floors::Floor;
use crate::store::codes::Bound;
use crate::store::kernels::lanes::{fold, Lanes, Value};

/// The `p` of an `lp` index: a positive, finite f32 (rounded once from the
/// number a client gave, as vector values are).
#[derive(Clone, Copy, Debug)]
pub struct Power(f32);

impl Power {
    /// p = 1: the `p` of `Metric::EVERY`'s lp, which `parse` replaces.
    pub(super) const ONE: Power = Power(1.0);

    /// `p`, if it is positive and finite once rounded to f32.
    pub fn new(p: f64) -> Option<Power> {
        let p = p as f32;
        (p > 0.0 && p.is_finite()).then_some(Power(p))
    }

    pub fn get(self) -> f32 {
        self.0
    }
}

/// Bit for bit: every `Power` is a positive finite f32, so no NaN to mind.
impl PartialEq for Power {
    fn eq(&self, other: &Power) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Power {}

#[derive(Clone, Copy)]
pub(super) struct Lp(pub(super) Power);

impl Kind for Lp {
    const NAME: &'static str = "lp";
    const CODE: u8 = 5;

    /// The floor of lp's `p`, where one is proved (`Floor::lp`).
    fn first_pass(self) -> Option<Bound> {
        Floor::lp(self.0.get()).map(Bound::Floors)
    }

    fn distance(self, query: &[f32], row: &[f32]) -> f32 {
        lp(query, row, self.0.get())
    }
}

/// (Σ|x−q|^p)^(1/p), scaled by the largest difference (module doc).
fn lp(query: &[f32], row: &[f32], p: f32) -> f32 {
    let quarters = p * 4.0;
    if p == 1.0 {
        l1(query, row)
    } else if quarters == quarters.trunc() && quarters <= QUARTERS_MAX as f32 {
        // A multiple of 1/4 (2, 3, 0.5, 2.5, ...): multiplications and square
        // roots, each correctly rounded, at a tenth of the cost of e^(p·ln r).
        // One instance per p, so that each is straight-line code.
        macro_rules! quarters {
            ($($q:literal)*) => {
                match quarters as u32 {
                    $($q => lp_scaled(query, row, p, quarter_power::<Lanes, $q>, quarter_power::<f32, $q>),)*
                    _ => unreachable!("a multiple of 1/4 from 1/4 to 8"),
                }
            };
        }
        quarters!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32)
    } else {
        // `wide`'s logarithm and exponential, for the tail's values too (in
        // a lane each), so that every term has the error `floors` proves
        // from them: a ratio of 0 gives e^(-inf) = 0, one too small for
        // f32's normal range a term of 0.
        let power = |r: Lanes| (r.ln() * Lanes::splat(p)).exp();
        lp_scaled(query, row, p, power, |r| power(Lanes::splat(r)).to_array()[0])
    }
}

/// The largest p, in quarters, that `quarter_power` raises to: 8, at most
/// three squarings and four multiplications.
const QUARTERS_MAX: u32 = 32;

/// r^(quarters / 4) for r in [0, 1 + 2^-22]: the whole power by squaring,
/// then times √r and ⁴√r as the quarters ask. A term that underflows is
/// below the rounding of `lp`'s sum, whose largest term is 1.
#[inline(always)]
fn quarter_power<T: Value, const QUARTERS: u32>(r: T) -> T {
    let (mut power, mut square, mut whole) = (T::splat(1.0), r, QUARTERS >> 2);
    while whole > 0 {
        if whole & 1 == 1 {
            power = power * square;
        }
        square = square * square;
        whole >>= 1;
    }
    if QUARTERS & 2 != 0 {
        power = power * r.sqrt();
    }
    if QUARTERS & 1 != 0 {
        power = power * r.sqrt().sqrt();
    }
    power
}

/// `lp` with `r^p` of a ratio r in [0, 1] as `power` (lanes) and
/// `power_one` (one value).
#[inline(always)]
fn lp_scaled(
    query: &[f32],
    row: &[f32],
    p: f32,
    power: impl Fn(Lanes) -> Lanes,
    power_one: impl Fn(f32) -> f32,
) -> f32 {
    let largest = linf(query, row);
    if largest == 0.0 {
        return 0.0;
    }
    // Each ratio |x−q|/m as |x−q| times 1/m (a multiply, where a divide
    // costs several): within two roundings of the quotient, so at most
    // 1 + 2^-23. Below 2^-100, 1/m would overflow: the differences are then
    // first scaled up by 2^100, which is exact.
    let (before, after) = if largest < 2f32.powi(-100) {
        (2f32.powi(100), 1.0 / (largest * 2f32.powi(100)))
    } else {
        (1.0, 1.0 / largest)
    };
    let (before_lanes, after_lanes) = (Lanes::splat(before), Lanes::splat(after));
    let (sum, query, row) =
        fold(query, row, Lanes::ZERO, |sum, q, r| sum + power((q - r).abs() * before_lanes * after_lanes));
    let ratio = |(q, r): (&f32, &f32)| power_one((q - r).abs() * before * after);
    let sum = sum.reduce_add() + query.iter().zip(row).map(ratio).sum::<f32>();
    (f64::from(largest) * f64::from(sum).powf(1.0 / f64::from(p))) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kernels::lanes::tests::{close, largest, pairs, wide};
    use crate::store::kernels::lanes::LANES;

    /// In f64 the terms cannot overflow or vanish for the dimensions
    /// tested, except at the extremes, which scale by the largest.
    fn reference(q: &[f32], r: &[f32], p: f64) -> f64 {
        let m = largest(q, r);
        if m == 0.0 {
            return 0.0;
        }
        m * wide(q, r).map(|(q, r)| ((q - r).abs() / m).powf(p)).sum::<f64>().powf(1.0 / p)
    }

    #[test]
    fn lp_matches_its_f64_definition() {
        for (dims, q, r) in pairs() {
            for p in [0.5f32, 0.75, 1.0, 1.5, 2.0, 2.5, 2.7, 3.0, 4.0, 7.25, 8.0, 8.25, 0.3] {
                let want = reference(&q, &r, f64::from(p));
                assert!(close(lp(&q, &r, p), want, want, dims), "lp {p} {dims}: {} vs {want}", lp(&q, &r, p));
            }
        }
    }

    #[test]
    fn lp_neither_overflows_nor_vanishes_at_the_domain_s_edges() {
        // The largest differences of the domain, for p >= 1.
        let big = [2f32.powi(62); 40];
        let opposite = [-(2f32.powi(62)); 40];
        for p in [1.0, 2.0, 3.0, 9.5, 2.7, 1.25] {
            let want = 2f64.powi(63) * 40f64.powf(1.0 / f64::from(p));
            let got = f64::from(lp(&big, &opposite, p));
            assert!((got - want).abs() <= 1e-6 * want, "p {p}: {got} vs {want}");
        }
        // Tiny differences, subnormal ones included (whose 1/m overflows f32).
        for tiny in [1e-30f32, 3e-39, 1e-44] {
            for p in [0.5, 2.0, 3.0, 9.5, 2.7] {
                let want = f64::from(tiny) * 33f64.powf(1.0 / f64::from(p));
                let got = f64::from(lp(&[tiny; 33], &[0.0; 33], p));
                // A subnormal distance is rounded to f32's subnormal steps.
                let step = f64::from(f32::from_bits(1));
                assert!((got - want).abs() <= 1e-6 * want + step, "{tiny} p {p}: {got} vs {want}");
            }
        }
        assert_eq!(lp(&[1.0, 2.0], &[1.0, 2.0], 3.0), 0.0);
    }

    /// lp with a `p` not a multiple of 1/4 raises each ratio `r` in
    /// [0, 1 + 2^-22] as `e^(p ln r)` in lanes; `floors` bounds its error
    /// from these, checked on every f32 input they can take (`p` from 1 to
    /// 8): `ln` within 2.5 x 2^-24 of `|ln r|` for every normal `r` (and
    /// -inf for a subnormal one, whose power is below 2^-126), `exp` within
    /// 2 x 2^-24 of itself wherever `e^z` is normal (`z` down to -87.33),
    /// and at most 2^-126 below that (down to -700).
    #[test]
    fn lp_logarithms_and_exponentials_are_within_their_bounds_on_every_input() {
        let u = 2f64.powi(-24);
        // Every f32 from `from` to `to` (bits, of one sign) through `lanes`,
        // each result against `ok`, on two threads.
        fn every(from: f32, to: f32, lanes: fn(Lanes) -> Lanes, ok: &(dyn Fn(f32, f32) -> bool + Sync)) {
            let (low, high) = (from.to_bits().min(to.to_bits()), from.to_bits().max(to.to_bits()));
            let half = low + (high - low) / 2;
            std::thread::scope(|scope| {
                for (start, end) in [(low, half), (half + 1, high)] {
                    scope.spawn(move || {
                        let mut bits = start;
                        while bits <= end {
                            let block: [f32; LANES] =
                                std::array::from_fn(|i| f32::from_bits((bits + i as u32).min(end)));
                            for (&v, &got) in block.iter().zip(&lanes(Lanes::new(block)).to_array()) {
                                assert!(ok(v, got), "{v:e}: {got:e}");
                            }
                            bits = bits.saturating_add(LANES as u32);
                        }
                    });
                }
            });
        }
        let ln_ok = |v: f32, got: f32| {
            let want = f64::from(v).ln();
            if v < f32::MIN_POSITIVE {
                return got == f32::NEG_INFINITY || f64::from(got) <= f64::from(f32::MIN_POSITIVE).ln();
            }
            (f64::from(got) - want).abs() <= 2.5 * u * want.abs()
        };
        every(f32::from_bits(1), 1.0 + 2f32.powi(-22), Lanes::ln, &ln_ok);
        let exp_ok = |z: f32, got: f32| {
            let want = f64::from(z).exp();
            if want >= f64::from(f32::MIN_POSITIVE) {
                (f64::from(got) - want).abs() <= 2.0 * u * want
            } else {
                (0.0..=f64::from(f32::MIN_POSITIVE)).contains(&f64::from(got))
            }
        };
        every(-0.0, -700.0, Lanes::exp, &exp_ok);
        every(0.0, 8.0 * 2f32.powi(-21), Lanes::exp, &exp_ok);
    }
}
