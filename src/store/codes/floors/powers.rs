//! Powers: the first pass of lp, from `S`, the sum of the steps between a
//! row's codes and the query's raised to `p` (the parent module's doc
//! derives the bound from it).
//!
//! lp's kernel scales each pair by its largest difference `w`, so its sum
//! is of ratios at most 1, one of them 1: each ratio is within three
//! roundings of `|x_i - q_i| / w`, and its power (at most three squarings,
//! four products and three square roots, each rounded once) within
//! `(3 p + 15) 2^-24 <= 48 x 2^-24` of the ratio's power; terms that
//! underflow lose less than 2^-140 of a sum of at least 1. `w` cancels
//! from `w (sum)^(1/p)`, which is rounded to f32 once more. So its lp is at
//! least `L = ((1 - 48 x 2^-24)(1 - g))^(1/p) (1 - 2^-23)` times the exact
//! one, and a row is ruled out when `(a (S / slack)^(1/p) - E - H) L` is
//! strictly above the threshold (`Grids::rules_out_lp` tests that without
//! a root for each row).
//!
//! Any other `p` from 1 to 8 has a first pass where the CPU has AVX-512
//! VBMI's lookups (below), which raise to any `p`. Its kernel raises each
//! ratio `r` (at least `ρ (1 - 2^-23)`, for the exact ratio `ρ`) as
//! `e^z`, `z` the product of `p` and `wide`'s `ln r` rounded: `ln` is
//! within `2.5 x 2^-24` of `|ln r|` for every normal `r` (a subnormal one
//! gives -inf, a term of 0 for one below 2^-126), and `exp` within
//! `2 x 2^-24` where `e^z` is normal, below 2^-126 elsewhere; both checked
//! on every input they can take (`metric::lp`'s tests). So `z` is
//! within `3.6 x 2^-24 p |ln r|` of `p ln r`, and the term is at least
//! `r^p (1 - 2^-23)` less `3.6 x 2^-24 r^p p |ln r| <= 1.33 x 2^-24` (as
//! `r^p p |ln r| <= 1 / e`), less 2^-126: at least
//! `ρ^p (1 - 2^-23)^(p + 1) - 1.34 x 2^-24`. With the sum at least 1,
//! the `n` terms lose at most `1 - (1 - 2^-23)^(p + 1) + 1.34 n 2^-24`
//! of it, which takes the place of `48 x 2^-24` in `L`. The codes' norms
//! `E` and `H` are found from the norms of the multiples of 1/4 either
//! side of `p` (Hölder's inequality, `codes::NormAbove`): each at least
//! the norm of `p`, and within a fraction of a percent of it.
//!
//! The first pass raises each `s_i` (at most 254)
//! in f32: the whole power by products (exact below 2^24, each later one
//! rounded), then `sqrt(s_i)` as `s_i / sqrt(s_i)` and the fourth root as
//! `sqrt(sqrt(s_i))` the same way, with the CPU's approximate reciprocal
//! square root (`vrsqrt14ps`, within 2^-14; `vrsqrtps`, within 1.5 x
//! 2^-12), so each term is at most `(1 + 2^-10)` times `s_i^p`; summed in
//! at most `m` roundings, `S` as found is at most `(1 + 2^-10)(1 + g)`
//! times the exact one, and is divided by that before use.
//!
//! Where the CPU has AVX-512 VBMI, the first pass looks each `s_i^p` up
//! instead (`PowerTable`): each `s_i` is first lowered to at most 127, and
//! `T(s) = ⌊s^p κ (1 - 2^-40)⌋` for every step `s` up to 127, with
//! `κ = (2^24 - 1) / 127^p (1 - 2^-40)` so that `T(127)` fits 24 bits,
//! as three tables of 128 bytes, each looked up 64 steps at a time by one
//! `vpermi2b` of two registers and summed exactly in integers. Each `T(s)`
//! is at most `s^p κ` (the margins cover `powf`'s rounding), so
//! `sum T(s_i) / κ` is at most `S` (of the lowered steps, so at most the
//! true one), and at least that `S` less `n / κ`: a few parts in a million
//! of distances of random data. Its only slack is the quotient's rounding.
//!
//! For p = 2 and p = 3 the first pass finds `S` exactly instead, in
//! integers: `s_i^2` and `s_i^3` by byte or 16-bit products summed into
//! 32-bit lanes (`vpdpbusd`; `vpmullw` and `vpdpwssd` or `vpmaddwd`),
//! spilled to 64 bits often enough that no lane overflows. Each `s_i` is
//! first lowered to at most 127 for p = 2, so that it fits a signed byte,
//! and to at most 181 for p = 3, so that its square fits an i16: a lower
//! `s_i` only lowers `S`, and the bound holds. Then `S` needs no slack.
//! (Differences that large arise only between values of opposite signs.)
//!
//! For random data of 768 dimensions `E + F` is about `n a / 2`, against l1
//! distances about `40 n a` spread over a few percent: only rows near the
//! k-th nearest are scored twice. For lp at p = 3 on values in [0, 1),
//! `E` and `H` are about `3 a` each against distances of about `270 a`:
//! 1.6% of 100,000 rows are scored twice (2.6% with the bound value by
//! value).

use std::sync::atomic::Ordering;

use super::{is_quarter, vbmi, Floor, Grids};
use crate::store::codes::{Codes, Int8, Kernel, BLOCK};
use crate::store::kernels::BOUND_SURPLUS;

/// The largest whole part of lp's `p` the first pass raises to.
const WHOLE_MAX: u32 = 8;

/// For p = 3, each `s_i` is lowered to this, whose square fits an i16
/// (the module doc).
const CUBED_MAX: u8 = 181;

/// For p = 2, each `s_i` is lowered to this, a signed byte's largest, as
/// `vpdpbusd` multiplies by (the module doc).
const SQUARED_MAX: u8 = 127;

/// lp's lookups lower each `s_i` to this, so that one `vpermi2b` of two
/// registers looks it up (the module doc).
const TABLE_MAX: u8 = 127;

/// lp's `T(s) = ⌊s^p κ⌋` for every step `s` from 0 to 127 (a larger step
/// is looked up as 127), 24-bit integers as three tables of bytes (low,
/// middle, high) for AVX-512 VBMI's lookups, with `κ` such that `T(127)`
/// fits (the module doc).
#[derive(Debug)]
pub(super) struct PowerTable {
    /// The `p` the tables are for (NaN: none yet).
    pub(super) p: f32,
    bytes: [[u8; 128]; 3],
    kappa: f64,
}

impl PowerTable {
    /// No table yet.
    pub(super) const NONE: PowerTable = PowerTable { p: f32::NAN, bytes: [[0; 128]; 3], kappa: 1.0 };

    pub(super) fn new(p: f32) -> PowerTable {
        let p64 = f64::from(p);
        let top = f64::from(TABLE_MAX);
        let kappa = f64::from((1u32 << 24) - 1) / top.powf(p64) * (1.0 - 2f64.powi(-40));
        let powers: [u32; 128] =
            std::array::from_fn(|s| (f64::from(s as u32).powf(p64) * kappa * (1.0 - 2f64.powi(-40))).floor() as u32);
        assert!(powers[0] == 0 && powers[127] < 1 << 24, "24 bits");
        let bytes = [0, 8, 16].map(|shift| powers.map(|power| (power >> shift) as u8));
        PowerTable { p, bytes, kappa }
    }

    /// `T(s)`, with `s` lowered to 127.
    fn power(&self, s: u8) -> u64 {
        let s = usize::from(s.min(TABLE_MAX));
        u64::from(self.bytes[0][s]) | u64::from(self.bytes[1][s]) << 8 | u64::from(self.bytes[2][s]) << 16
    }
}

impl Grids {
    /// lp's constants for `p` and `dims` dimensions (`Grids::encode`): its
    /// whole part and quarters, its table where the CPU looks powers up,
    /// and `L` (the module doc).
    pub(super) fn prepare_powers(&mut self, p: f32, dims: usize) {
        let quarters = (p * 4.0) as u32;
        (self.whole, self.quarters) = (quarters / 4, quarters % 4);
        self.vbmi = vbmi();
        if self.vbmi && self.table.p != p {
            self.table = PowerTable::new(p);
        }
        // Each term's loss (the module doc): for a multiple of 1/4, at
        // most 48 roundings of itself; for any other p, `(p + 1) 2^-23`
        // of itself and `1.34 x 2^-24`, at most that of the sum (at
        // least 1) for each of the `n` terms.
        let lost = if is_quarter(p) {
            48.0 * 2f64.powi(-24)
        } else {
            1.0 - (1.0 - 2f64.powi(-23)).powf(f64::from(p) + 1.0) + 1.34 * dims as f64 * 2f64.powi(-24)
        };
        let p = f64::from(p);
        let factor = ((1.0 - lost) * (1.0 - self.relative)).powf(1.0 / p) * (1.0 - 2f64.powi(-23));
        self.factor = factor * (1.0 - BOUND_SURPLUS);
    }

    /// Whether lp's first pass finds `S` in integers: p = 2 or 3.
    pub(super) fn integers(&self) -> bool {
        matches!(self.floor, Floor::Lp(p) if p == 2.0 || p == 3.0)
    }

    /// lp's `p` (NaN for the other floors).
    pub(super) fn floor_p(&self) -> f32 {
        if let Floor::Lp(p) = self.floor {
            p
        } else {
            f32::NAN
        }
    }

    /// `S` (lp, the module doc) of `rows` against the query's codes in
    /// `slots`, as the first pass finds it, and the most it can exceed the
    /// exact `S` by, as a factor: exact in integers for p = 2 and 3.
    #[inline(always)]
    pub(super) fn powers<const R: usize>(
        &self,
        kernel: Kernel,
        codes: &Codes,
        rows: [usize; R],
        slots: [usize; R],
    ) -> ([f64; R], f64) {
        let (bytes, stride) = (codes.bytes(), self.stride);
        let starts = rows.map(|row| row * stride);
        assert!(starts.iter().all(|&start| start + stride <= bytes.len()) && stride.is_multiple_of(BLOCK));
        assert!((1..=WHOLE_MAX).contains(&self.whole) && self.quarters < 4);
        let queries = slots.map(|slot| self.query_at(slot));
        if self.integers() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `spans`.
            let sums = unsafe {
                match (kernel.isa(), self.whole) {
                    (Int8::Vnni512, 2) => x86::whole_avx512::<2, R>(bytes, starts, queries, stride),
                    (Int8::Vnni512, _) => x86::whole_avx512::<3, R>(bytes, starts, queries, stride),
                    (_, 2) => x86::whole_avx2::<2, R>(bytes, starts, queries, (0, stride)),
                    _ => x86::whole_avx2::<3, R>(bytes, starts, queries, (0, stride)),
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            let sums: [u64; R] = unreachable!("no kernel is available off x86-64");
            // Exact: below 2^53 (at most 65,536 x 127^2 or 181^3).
            return (sums.map(|sum| sum as f64), 1.0);
        }
        if kernel.isa() == Int8::Vnni512 && self.vbmi {
            assert_eq!(self.table.p, self.floor_p(), "the table is the floor's");
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `spans`, VBMI asked for where it is used.
            let sums = unsafe { x86::table_avx512::<R>(&self.table, bytes, starts, queries, stride) };
            #[cfg(not(target_arch = "x86_64"))]
            let sums: [u64; R] = unreachable!("no kernel is available off x86-64");
            // Each `T(s)` is at most `s^p κ`: the sum over `κ`, exact but
            // for the quotient's rounding, is at most `S`.
            return (sums.map(|sum| sum as f64 / self.table.kappa), 1.0 + BOUND_SURPLUS);
        }
        assert!(is_quarter(self.floor_p()), "only the lookups raise to a p not a multiple of 1/4 (`Floor::runs_on`)");
        macro_rules! powers {
            ($($k:literal)*) => {
                match self.whole {
                    $($k => powers::<$k, R>(kernel, bytes, starts, queries, (stride, self.quarters)),)*
                    _ => unreachable!("a whole part from 1 to 8 (asserted)"),
                }
            };
        }
        (powers!(1 2 3 4 5 6 7 8).map(f64::from), self.sums_slack())
    }

    /// `rules_out` for lp: whether `(a S^(1/p) - E - H) L > threshold`
    /// (the module doc), for each row of the `slots`. With
    /// `t = threshold / L + H`, that is `S > (t / a)^p (1 + E / t)^p`; as
    /// `(1 + u)^p <= e^(p u) <= 1 / (1 - p u)` for `0 <= p u < 1`, a row
    /// is ruled out when `S (1 - p E / t) > (t / a)^p`, the power shared by
    /// every row of a scale (`limit_lp`).
    #[inline(always)]
    pub(super) fn rules_out_lp<const R: usize>(
        &self,
        p: f64,
        kernel: Kernel,
        codes: &Codes,
        (rows, slots): ([usize; R], [usize; R]),
        threshold: f32,
    ) -> u32 {
        let (sums, slack) = self.powers(kernel, codes, rows, slots);
        (0..R).fold(0, |ruled, r| {
            ruled | u32::from(self.lp_beyond(p, codes, (rows[r], slots[r]), sums[r] / slack, threshold)) << r
        })
    }

    /// `rules_out_lp` for one row, of the scale in `slot`, whose `S` over
    /// its slack is `sum`.
    #[inline(always)]
    pub(super) fn lp_beyond(
        &self,
        p: f64,
        codes: &Codes,
        (row, slot): (usize, usize),
        sum: f64,
        threshold: f32,
    ) -> bool {
        let (_, h, _) = self.sides[slot];
        let t = f64::from(threshold) / self.factor + h;
        let (_, residual) = codes.scale_and_residual(row);
        // Rounded up, as `1 - p u` is then rounded down: within the
        // surplus the limit carries. A NaN rules nothing out.
        let u = p * f64::from(residual) / t * (1.0 + BOUND_SURPLUS);
        u < 1.0 && sum * (1.0 - u) > self.limit_lp(p, slot, threshold, t)
    }

    /// `(t / a)^p` for the scale of `slot` and `t` as `rules_out_lp` finds
    /// it from `threshold`, with the surplus, rounded up (`limits`).
    #[inline(always)]
    pub(super) fn limit_lp(&self, p: f64, slot: usize, threshold: f32, t: f64) -> f64 {
        let memo = &self.limits[slot];
        let last = memo.load(Ordering::Relaxed);
        if (last >> 32) as u32 == threshold.to_bits() {
            return f64::from(f32::from_bits(last as u32));
        }
        let (scale, _, _) = self.sides[slot];
        let limit = (t / scale).powf(p) * (1.0 + BOUND_SURPLUS);
        // Up to the next f32 at or above: never below the exact limit, so
        // it rules out no row the f64 one would not.
        let mut rounded = limit as f32;
        if f64::from(rounded) < limit {
            rounded = rounded.next_up();
        }
        memo.store(u64::from(threshold.to_bits()) << 32 | u64::from(rounded.to_bits()), Ordering::Relaxed);
        f64::from(rounded)
    }

    /// The most the first pass's lp sum exceeds the exact one by, as a
    /// factor (the module doc).
    pub fn sums_slack(&self) -> f64 {
        (1.0 + 2f64.powi(-10)) * (1.0 + self.relative) * (1.0 + BOUND_SURPLUS)
    }
}

#[cfg(test)]
impl Grids {
    /// lp's `S` of row `row` with `kernel` as the kernel finds it, the
    /// exact one, and the slack between them the bound allows; for p = 2
    /// and 3, the exact one of the lowered `s_i` (the module doc), which the
    /// kernel must find with no slack.
    pub fn powers_of(&self, kernel: Kernel, codes: &Codes, row: usize) -> (f64, f64, f64, f64) {
        let ([sum], slack) = self.powers(kernel, codes, [row], [self.slot_of(codes, row)]);
        let query = self.code_for(codes, row);
        let p = f64::from(self.floor_p());
        let integers = self.integers();
        let looked_up = !integers && kernel.isa() == Int8::Vnni512 && self.vbmi;
        let highest = match (integers, self.whole) {
            (true, 2) => u32::from(SQUARED_MAX),
            (true, _) => u32::from(CUBED_MAX),
            _ if looked_up => u32::from(TABLE_MAX),
            _ => u32::MAX,
        };
        let steps = || (query.iter().zip(codes.row(row))).map(|(&d, c)| (i32::from(c) - i32::from(d)).unsigned_abs());
        let exact = steps().map(|s| f64::from(s.min(highest)).powf(p)).sum::<f64>();
        if looked_up {
            // The table's sum, as the scalar reference finds it.
            let table = steps().map(|s| self.table.power(s as u8)).sum::<u64>() as f64 / self.table.kappa;
            assert_eq!(sum, table, "the table's sum");
            // Each `T(s)` within 1 of `s^p κ`, below it.
            let least = (exact - codes.dims() as f64 / self.table.kappa) / slack;
            return (sum, exact, slack, least);
        }
        (sum, exact, slack, if slack == 1.0 { exact } else { exact / slack })
    }
}

/// lp's `S` of the stored codes at `starts` in `bytes` against `queries`,
/// over `stride` bytes, for `p` of whole part `K` and `quarters` beyond.
#[inline(always)]
fn powers<const K: u32, const R: usize>(
    kernel: Kernel,
    bytes: &[u8],
    starts: [usize; R],
    queries: [&[u8]; R],
    (stride, quarters): (usize, u32),
) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `spans`.
    unsafe {
        match kernel.isa() {
            Int8::Vnni512 => x86::powers_avx512::<K, R>(bytes, starts, queries, (stride, quarters)),
            _ => x86::powers_avx2::<K, R>(bytes, starts, queries, (0, stride), quarters),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, bytes, starts, queries, stride, quarters);
        unreachable!("no kernel is available off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{PowerTable, CUBED_MAX, SQUARED_MAX, TABLE_MAX};
    use crate::store::codes::x86::{pair_256, pair_512, sum_of};

    /// lp's `S` on 64-byte blocks, and a last one of 32, with AVX-512: `s_i`
    /// in bytes, then 16 lanes of f32 at a time.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BW; bounds as `spans_avx512`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn powers_avx512<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (stride, quarters): (usize, u32),
    ) -> [f32; R] {
        let mut sums = [_mm512_setzero_ps(); R];
        // SAFETY: the CPU has AVX-512F.
        let mut add = |r: usize, apart: __m128i| unsafe {
            sums[r] = _mm512_add_ps(sums[r], power::<__m512, K>(apart, quarters));
        };
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_512(bytes, starts[r] + at, queries[r], at) };
                add(r, _mm512_castsi512_si128(apart));
                add(r, _mm512_extracti32x4_epi32::<1>(apart));
                add(r, _mm512_extracti32x4_epi32::<2>(apart));
                add(r, _mm512_extracti32x4_epi32::<3>(apart));
            }
            at += 64;
        }
        // SAFETY: the same bounds, for the last 32 bytes if any.
        let tail = unsafe { powers_avx2::<K, R>(bytes, starts, queries, (at, stride - at), quarters) };
        std::array::from_fn(|r| _mm512_reduce_add_ps(sums[r]) + tail[r])
    }

    /// `powers_avx512` with AVX2 over the `len` bytes from `at` (a
    /// multiple of 32), 8 lanes of f32 at a time.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn powers_avx2<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
        quarters: u32,
    ) -> [f32; R] {
        let mut sums = [_mm256_setzero_ps(); R];
        // SAFETY: the CPU has AVX2.
        let mut add = |r: usize, apart: __m128i| unsafe {
            sums[r] = _mm256_add_ps(sums[r], power::<__m256, K>(apart, quarters));
        };
        for step in (at..at + len).step_by(32) {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_256(bytes, starts[r] + step, queries[r], step) };
                let (apart, apart_high) = (_mm256_castsi256_si128(apart), _mm256_extracti128_si256::<1>(apart));
                add(r, apart);
                add(r, _mm_srli_si128::<8>(apart));
                add(r, apart_high);
                add(r, _mm_srli_si128::<8>(apart_high));
            }
        }
        sums.map(|v| {
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps::<1>(v, v)))
        })
    }

    /// lp's `s_i = |c_i - d_i|` (the module doc) of the 64 stored codes at
    /// `bytes[row..]` and the query's at `query[at..]`, with AVX-512BW.
    ///
    /// # Safety
    /// The CPU must have AVX-512BW; both must hold 64 bytes there.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn steps_512(bytes: &[u8], row: usize, query: &[u8], at: usize) -> __m512i {
        // SAFETY: in bounds, as the caller promises.
        let (x, q) = unsafe { pair_512(bytes, row, query, at) };
        _mm512_or_si512(_mm512_subs_epu8(x, q), _mm512_subs_epu8(q, x))
    }

    /// `steps_512` of 32 codes, with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2; both must hold 32 bytes there.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn steps_256(bytes: &[u8], row: usize, query: &[u8], at: usize) -> __m256i {
        // SAFETY: in bounds, as the caller promises.
        let (x, q) = unsafe { pair_256(bytes, row, query, at) };
        _mm256_or_si256(_mm256_subs_epu8(x, q), _mm256_subs_epu8(q, x))
    }

    /// lp's `S` for p = `K`, 2 or 3, in integers (the module doc), on
    /// 64-byte blocks and a last one of 32, with AVX-512BW and VNNI: for
    /// p = 2, `s_i^2` by `vpdpbusd` (a byte times a signed byte, so `s_i`
    /// at most 127); for p = 3, `s_i^2` by `vpmullw`, times `s_i` by
    /// `vpdpwssd`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI; bounds as `spans_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn whole_avx512<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> [u64; R] {
        let highest = _mm512_set1_epi8(if K == 3 { CUBED_MAX as i8 } else { SQUARED_MAX as i8 });
        let zero = _mm512_setzero_si512();
        let (mut lanes, mut sums) = ([zero; R], [0u64; R]);
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_512(bytes, starts[r] + at, queries[r], at) };
                let low = _mm512_min_epu8(apart, highest);
                lanes[r] = if K == 3 {
                    // The bytes widened to 16 bits in another order, which
                    // a sum does not mind.
                    let mut lane = lanes[r];
                    for s in [_mm512_unpacklo_epi8(low, zero), _mm512_unpackhi_epi8(low, zero)] {
                        lane = _mm512_dpwssd_epi32(lane, _mm512_mullo_epi16(s, s), s);
                    }
                    lane
                } else {
                    _mm512_dpbusd_epi32(lanes[r], low, low)
                };
            }
            at += 64;
            // Each lane takes at most 4 x 181^3 (or 4 x 127^2) a block: 64
            // blocks stay below 2^31.
            if (at / 64).is_multiple_of(64) {
                for r in 0..R {
                    sums[r] += sum_lanes(lanes[r]);
                    lanes[r] = zero;
                }
            }
        }
        // SAFETY: the same bounds, for the last 32 bytes if any.
        let tail = unsafe { whole_avx2::<K, R>(bytes, starts, queries, (at, stride - at)) };
        std::array::from_fn(|r| sums[r] + sum_lanes(lanes[r]) + tail[r])
    }

    /// lp's `sum T(s_i)` (`PowerTable`) of each row against its query, on
    /// 64-byte blocks with AVX-512 VBMI's byte lookups (two `vpermi2b` and
    /// a blend for each of the three bytes of `T`), summed by `vpdpbusd`,
    /// and a last block of 32 one value at a time.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW, VBMI and VNNI; bounds as
    /// `spans_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    pub(super) unsafe fn table_avx512<const R: usize>(
        table: &PowerTable,
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> [u64; R] {
        // SAFETY: 2 x 64 bytes each.
        let tables = table.bytes.each_ref().map(|bytes| unsafe {
            [_mm512_loadu_si512(bytes.as_ptr().cast()), _mm512_loadu_si512(bytes.as_ptr().add(64).cast())]
        });
        let (one, zero, highest) = (_mm512_set1_epi8(1), _mm512_setzero_si512(), _mm512_set1_epi8(TABLE_MAX as i8));
        let mut sums = [[zero; 3]; R];
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_512(bytes, starts[r] + at, queries[r], at) };
                let low = _mm512_min_epu8(apart, highest);
                for (sum, [below, above]) in sums[r].iter_mut().zip(&tables) {
                    *sum = _mm512_dpbusd_epi32(*sum, _mm512_permutex2var_epi8(*below, low, *above), one);
                }
            }
            at += 64;
        }
        // Each lane adds at most 4 x 255 a block: below 2^31 for 65,536
        // values.
        std::array::from_fn(|r| {
            let [low, middle, high] = sums[r].map(|sum| _mm512_reduce_add_epi32(sum) as u32 as u64);
            let tail: u64 = (at..stride)
                .map(|i| {
                    // SAFETY: in bounds, as the caller promises.
                    let (x, q) = unsafe { (*bytes.get_unchecked(starts[r] + i), *queries[r].get_unchecked(i)) };
                    table.power(x.abs_diff(q))
                })
                .sum();
            low + (middle << 8) + (high << 16) + tail
        })
    }

    /// The sum of sixteen non-negative i32 lanes, in 64 bits.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum_lanes(v: __m512i) -> u64 {
        let low = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(v));
        let high = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(v));
        _mm512_reduce_add_epi64(_mm512_add_epi64(low, high)) as u64
    }

    /// `whole_avx512` with AVX2 over the `len` bytes from `at` (a multiple
    /// of 32).
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn whole_avx2<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
    ) -> [u64; R] {
        let highest = _mm256_set1_epi8(if K == 3 { CUBED_MAX as i8 } else { SQUARED_MAX as i8 });
        let zero = _mm256_setzero_si256();
        let (mut lanes, mut sums) = ([zero; R], [0u64; R]);
        for (n, step) in (at..at + len).step_by(32).enumerate() {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_256(bytes, starts[r] + step, queries[r], step) };
                let low = _mm256_min_epu8(apart, highest);
                // The bytes widened to 16 bits in another order, which a
                // sum does not mind.
                for s in [_mm256_unpacklo_epi8(low, zero), _mm256_unpackhi_epi8(low, zero)] {
                    let terms =
                        if K == 3 { _mm256_madd_epi16(_mm256_mullo_epi16(s, s), s) } else { _mm256_madd_epi16(s, s) };
                    lanes[r] = _mm256_add_epi32(lanes[r], terms);
                }
            }
            // Each lane takes at most 4 x 181^3 (or 4 x 127^2) a block: 64
            // blocks stay below 2^31.
            if (n + 1).is_multiple_of(64) {
                for r in 0..R {
                    sums[r] += sum_lanes_avx2(lanes[r]);
                    lanes[r] = _mm256_setzero_si256();
                }
            }
        }
        std::array::from_fn(|r| sums[r] + sum_lanes_avx2(lanes[r]))
    }

    /// The sum of eight non-negative i32 lanes, in 64 bits.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum_lanes_avx2(v: __m256i) -> u64 {
        let low = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(v));
        let high = _mm256_cvtepu32_epi64(_mm256_extracti128_si256::<1>(v));
        sum_of(_mm256_add_epi64(low, high))
    }

    /// The f32 lanes lp's powers are raised in, on each instruction set.
    trait Floats: Copy {
        /// The first lanes' bytes of `bytes`, as f32.
        ///
        /// # Safety
        /// The CPU must have this type's instructions.
        unsafe fn of_bytes(bytes: __m128i) -> Self;
        /// # Safety
        /// The CPU must have this type's instructions.
        unsafe fn mul(self, other: Self) -> Self;
        /// `x / sqrt(x)` with the approximate reciprocal square root (the
        /// module doc), `max(x, 1)` under the root so that 0 stays 0.
        ///
        /// # Safety
        /// The CPU must have this type's instructions.
        unsafe fn root(self) -> Self;
    }

    impl Floats for __m512 {
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn of_bytes(bytes: __m128i) -> __m512 {
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes))
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn mul(self, other: __m512) -> __m512 {
            _mm512_mul_ps(self, other)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn root(self) -> __m512 {
            _mm512_mul_ps(self, _mm512_rsqrt14_ps(_mm512_max_ps(self, _mm512_set1_ps(1.0))))
        }
    }

    impl Floats for __m256 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn of_bytes(bytes: __m128i) -> __m256 {
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn mul(self, other: __m256) -> __m256 {
            _mm256_mul_ps(self, other)
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn root(self) -> __m256 {
            _mm256_mul_ps(self, _mm256_rsqrt_ps(_mm256_max_ps(self, _mm256_set1_ps(1.0))))
        }
    }

    /// `s^p` of the integers `s` in the first lanes' bytes of `apart`, for
    /// `p` of whole part `K` and `quarters` beyond: the whole power by
    /// products, then the square and fourth roots (`Floats::root`).
    ///
    /// # Safety
    /// The CPU must have `F`'s instructions.
    #[inline(always)]
    unsafe fn power<F: Floats, const K: u32>(apart: __m128i, quarters: u32) -> F {
        // SAFETY: as the caller promises.
        unsafe {
            let s = F::of_bytes(apart);
            let mut power = s;
            for _ in 1..K {
                power = power.mul(s);
            }
            if quarters != 0 {
                let square = s.root();
                if quarters & 2 != 0 {
                    power = power.mul(square);
                }
                if quarters & 1 != 0 {
                    power = power.mul(square.root());
                }
            }
            power
        }
    }
}
