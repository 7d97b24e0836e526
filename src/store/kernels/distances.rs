//! The six distances beyond cosine, ip and l2 (EigenDB's full list): `l1`,
//! `linf`, `lp`, `canberra`, `bc` and `js`, each over `wide` lanes, and the
//! f64 reference they are tested against.
//!
//! Each scores one (query, row) pair by one function, whether the search is
//! lone, batched or filtered: the same lanes in the same order, so every
//! path finds the same bits. Smaller is nearer for all six.
//!
//! ## The numeric domain
//! Every vector's Euclidean norm is at most 2^62, so each value and each
//! |x−q| is at most 2^63, and |x|+|q| too; a sum of 2^16 of them is at most
//! 2^79. None of `l1`, `linf`, `canberra` (each term at most 1) or `bc`
//! can overflow. Two need more care:
//! - **`lp`** would overflow (|x−q|^p with p = 3 reaches 2^189) or underflow
//!   (the distances of tiny vectors to the power p) if summed as written.
//!   So each pair is scaled by its largest difference m = max|x−q| first:
//!   lp = m · (Σ (|x−q|/m)^p)^(1/p). Every term is then at most 1, one of them
//!   exactly 1, so the sum lies in [1, dims] and a term too small for f32 is
//!   below the sum's own rounding. The root is taken in f64. A p that is a
//!   multiple of 1/4 up to 8 raises by multiplying and square roots; any
//!   other by `wide`'s e^(p·ln r), ten times the arithmetic. For p ≥ 1 the
//!   result is at most l1's, so finite; for p < 1 it can exceed f32's range
//!   (all differences near 2^63 and p below about 0.13), and is then +inf.
//! - **`js`**, written as Σ x·ln(2x/s) + q·ln(2q/s) with s = x + q, cancels
//!   catastrophically when x ≈ q: the two terms are ±x·t with
//!   t = (x−q)/(x+q), their sum s·t²/2. So each term is computed as
//!   (s/2)·g(t) with g(t) = (1+t)·ln(1+t) + (1−t)·ln(1−t), even in t and at
//!   least 0: for |t| ≤ 1/2 by its series t²·Σ t^(2n−2)/(n(2n−1)), nine
//!   terms (the rest is below 2^-24 of the sum), otherwise as written, where
//!   the two logarithms cancel by at most a factor of 2.3. Every term of the
//!   sum is then within a few roundings of its own value, and all are ≥ 0,
//!   so the sum is too.

/// `wide`'s lanes as the build compiles them: these kernels are not chosen
/// at run time (`cpu`); each is exact to its own bound on every CPU.
#[cfg(target_feature = "avx512f")]
type Lanes = wide::f32x16;
#[cfg(not(target_feature = "avx512f"))]
type Lanes = wide::f32x8;

/// Floats in one `Lanes`.
const LANES: usize = std::mem::size_of::<Lanes>() / 4;

/// Walks a (query, row) pair a block of lanes at a time, folding each block
/// into `acc`; returns it and the tails shorter than a block.
#[inline(always)]
fn fold<'a, A>(
    query: &'a [f32],
    row: &'a [f32],
    mut acc: A,
    mut step: impl FnMut(A, Lanes, Lanes) -> A,
) -> (A, &'a [f32], &'a [f32]) {
    assert_eq!(query.len(), row.len());
    let (query_blocks, query_tail) = query.as_chunks::<LANES>();
    let (row_blocks, row_tail) = row.as_chunks::<LANES>();
    for (q, r) in query_blocks.iter().zip(row_blocks) {
        acc = step(acc, Lanes::new(*q), Lanes::new(*r));
    }
    (acc, query_tail, row_tail)
}

/// Σ|x−q|.
pub fn l1(query: &[f32], row: &[f32]) -> f32 {
    let (sum, query, row) = fold(query, row, Lanes::ZERO, |sum, q, r| sum + (q - r).abs());
    sum.reduce_add() + query.iter().zip(row).map(|(q, r)| (q - r).abs()).sum::<f32>()
}

/// max|x−q|.
pub fn linf(query: &[f32], row: &[f32]) -> f32 {
    let (max, query, row) = fold(query, row, Lanes::ZERO, |max, q, r| max.max((q - r).abs()));
    let lanes = max.to_array().into_iter();
    lanes.chain(query.iter().zip(row).map(|(q, r)| (q - r).abs())).fold(0.0, f32::max)
}

/// Σ|x−q| / (|x|+|q|), a term with 0/0 counting 0.
pub fn canberra(query: &[f32], row: &[f32]) -> f32 {
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

/// Σ|x−q| / Σ|x+q|: 0 when both sums are 0, +inf when only the second is.
pub fn bray_curtis(query: &[f32], row: &[f32]) -> f32 {
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

/// (Σ|x−q|^p)^(1/p), scaled by the largest difference (module doc).
pub fn lp(query: &[f32], row: &[f32], p: f32) -> f32 {
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

/// The Jensen-Shannon divergence ½Σ x·ln(x/m) + ½Σ q·ln(q/m), m = (x+q)/2,
/// of vectors without negative values: ¼ Σ s·g(t) (module doc).
pub fn jensen_shannon(query: &[f32], row: &[f32]) -> f32 {
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

/// What `series` and `quarter_power` compute with: lanes, or one value.
trait Value: Copy + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> {
    fn splat(x: f32) -> Self;
    fn sqrt(self) -> Self;
}

impl Value for f32 {
    fn splat(x: f32) -> f32 {
        x
    }

    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
}

impl Value for Lanes {
    fn splat(x: f32) -> Lanes {
        Lanes::splat(x)
    }

    fn sqrt(self) -> Lanes {
        Lanes::sqrt(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kernels::tests::floats;

    /// The definitions as written, in f64: the oracle.
    mod reference {
        fn pairs<'a>(q: &'a [f32], r: &'a [f32]) -> impl Iterator<Item = (f64, f64)> + 'a {
            q.iter().zip(r).map(|(&q, &r)| (f64::from(q), f64::from(r)))
        }

        pub fn l1(q: &[f32], r: &[f32]) -> f64 {
            pairs(q, r).map(|(q, r)| (q - r).abs()).sum()
        }

        pub fn linf(q: &[f32], r: &[f32]) -> f64 {
            pairs(q, r).map(|(q, r)| (q - r).abs()).fold(0.0, f64::max)
        }

        /// In f64 the terms cannot overflow or vanish for the dimensions
        /// tested, except at the extremes, which scale by the largest.
        pub fn lp(q: &[f32], r: &[f32], p: f64) -> f64 {
            let m = linf(q, r);
            if m == 0.0 {
                return 0.0;
            }
            m * pairs(q, r).map(|(q, r)| ((q - r).abs() / m).powf(p)).sum::<f64>().powf(1.0 / p)
        }

        pub fn canberra(q: &[f32], r: &[f32]) -> f64 {
            pairs(q, r).map(|(q, r)| if q == 0.0 && r == 0.0 { 0.0 } else { (q - r).abs() / (q.abs() + r.abs()) }).sum()
        }

        pub fn bray_curtis(q: &[f32], r: &[f32]) -> f64 {
            let d: f64 = pairs(q, r).map(|(q, r)| (q - r).abs()).sum();
            let s: f64 = pairs(q, r).map(|(q, r)| (q + r).abs()).sum();
            if d == 0.0 {
                0.0
            } else {
                d / s
            }
        }

        /// As defined, with x·ln(x/m) in f64 (which cancels less than f32
        /// by 29 bits: enough at the ratios tested).
        pub fn jensen_shannon(q: &[f32], r: &[f32]) -> f64 {
            let term = |x: f64, m: f64| if x == 0.0 { 0.0 } else { x * (x / m).ln() };
            pairs(q, r).map(|(q, r)| 0.5 * term(q, (q + r) / 2.0) + 0.5 * term(r, (q + r) / 2.0)).sum()
        }
    }

    /// Whether `got` is `want` to within f32's rounding of a sum of `dims`
    /// terms, each off by a few units in the last place of `scale`.
    fn close(got: f32, want: f64, scale: f64, dims: usize) -> bool {
        (f64::from(got) - want).abs() <= 8.0 * f64::from(f32::EPSILON) * scale * (dims as f64).sqrt().max(1.0)
    }

    /// Every distance against its f64 definition: every length 0..=70 and
    /// 768, 1536, values of both signs (non-negative for js), at scales from
    /// 2^-60 to 2^55 (inside the numeric domain: norm at most 2^62).
    #[test]
    fn each_distance_matches_its_f64_definition() {
        for dims in (0..=70).chain([768, 1536]) {
            for (seed, scale) in [(1u64, 1.0f32), (2, 2f32.powi(55)), (3, 2f32.powi(-60)), (4, 3.0e-3)] {
                let scale = scale / (dims.max(1) as f32).sqrt();
                let q: Vec<f32> = floats(seed, dims).iter().map(|x| x * scale).collect();
                let r: Vec<f32> = floats(seed + 100, dims).iter().map(|x| x * scale).collect();
                let m = reference::linf(&q, &r);
                assert!(close(l1(&q, &r), reference::l1(&q, &r), reference::l1(&q, &r), dims), "l1 {dims}");
                assert!((f64::from(linf(&q, &r)) - m).abs() <= m * f64::from(f32::EPSILON), "linf {dims}");
                for p in [0.5f32, 0.75, 1.0, 1.5, 2.0, 2.5, 2.7, 3.0, 4.0, 7.25, 8.0, 8.25, 0.3] {
                    let want = reference::lp(&q, &r, f64::from(p));
                    assert!(close(lp(&q, &r, p), want, want, dims), "lp {p} {dims}: {} vs {want}", lp(&q, &r, p));
                }
                assert!(close(canberra(&q, &r), reference::canberra(&q, &r), dims as f64, dims), "canberra {dims}");
                let want = reference::bray_curtis(&q, &r);
                assert!(close(bray_curtis(&q, &r), want, want, dims), "bc {dims}: {} vs {want}", bray_curtis(&q, &r));
                let (q, r): (Vec<f32>, Vec<f32>) =
                    (q.iter().map(|x| x.abs()).collect(), r.iter().map(|x| x.abs()).collect());
                let want = reference::jensen_shannon(&q, &r);
                assert!(
                    close(jensen_shannon(&q, &r), want, want, dims),
                    "js {dims}: {} vs {want}",
                    jensen_shannon(&q, &r)
                );
            }
        }
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
                let want = reference::jensen_shannon(&q, &r);
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

    #[test]
    fn the_edges_the_definitions_name() {
        // canberra: a 0/0 term counts 0.
        assert_eq!(canberra(&[0.0, 1.0], &[0.0, -1.0]), 1.0);
        // bc: 0 when both sums are 0, +inf when only the second is.
        assert_eq!(bray_curtis(&[0.0; 20], &[0.0; 20]), 0.0);
        assert_eq!(bray_curtis(&[1.0; 20], &[-1.0; 20]), f32::INFINITY);
        assert_eq!(bray_curtis(&[1.0, 2.0], &[3.0, 2.0]), 2.0 / 8.0);
        // js: a zero factor counts 0; disjoint supports reach ln 2 per unit of mass.
        let js = jensen_shannon(&[1.0, 0.0], &[0.0, 1.0]);
        assert!((f64::from(js) - std::f64::consts::LN_2).abs() < 1e-6, "{js}");
        // lp: the largest differences of the domain neither overflow nor
        // vanish, for p >= 1.
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
        assert_eq!(linf(&[1.0, -7.0, 2.0], &[1.0, 2.0, 3.0]), 9.0);
        assert_eq!(l1(&[1.0, -7.0, 2.0], &[1.0, 2.0, 3.0]), 10.0);
    }
}
