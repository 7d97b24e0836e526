//! The nearest a row can be in Jensen-Shannon divergence, from Canberra's
//! logarithmic codes (`ratios`): the first pass of js searches, run by
//! `floors::Grids`.
//!
//! js is `sum f(x_i, q_i)` with `f(x, q) = (x ln(2x / s) + q ln(2q / s)) / 2`,
//! `s = x + q`, over values at least 0. Each term grows with the values'
//! size (`f(cx, cq) = c f(x, q)`) and with their ratio: with `M` the larger
//! of the two and `ρ` the smaller over `M`, `f = M ψ(ρ)`, where
//! `ψ(ρ) = (1 + ρ) g(t) / 4`, `t = (1 - ρ) / (1 + ρ)` and
//! `g(t) = (1 + t) ln(1 + t) + (1 - t) ln(1 - t)` (`metric::jensen_shannon`).
//! `ψ` falls from `ln 2 / 2` at `ρ = 0` to 0 at `ρ = 1`: the derivative of
//! `f` in the smaller value `q` is `ln(2q / s) / 2 < 0`. A level gives both
//! at once: a lower edge for `M`, and with the other value's level an upper
//! bound on `ρ`.
//!
//! # Why a ruled-out row cannot belong in the answer
//! The codes are Canberra's: a row's scale `a` (a power of two not below
//! its largest value), and each value's level `L` on 32 levels an octave
//! (`ratios`: level `L >= 1` holds `v > a T(L - 256)`, level `L <= 254`
//! holds `v <= a T(L - 255)`, `T(s)` within 2^-49 of `2^(s / 32)`). The
//! query is coded on each scale the rows have. Take one dimension, the
//! larger level `Λ = max(L_x, L_q)` and `m = |L_x - L_q|`.
//! - `m <= 1` or `Λ = 0`: the term is at least 0.
//! - Otherwise, as for Canberra, the value of level `Λ` is the larger,
//!   `M > a T(Λ - 256)`, and `ρ < 2^(-(m - 1) / 32) (1 + 2^-48) =: ρ(m)`,
//!   so the term exceeds `a T(Λ - 256) J(m)`, `J(m) = ψ(ρ(m))`.
//!
//! In integers: `J(m) >= J⁺ 2^(-D(m) / 32)` for the byte
//! `D(m) = ⌈32 log2(J⁺ / J(m))⌉` (255 where that exceeds 254, and for
//! `m <= 1`), with `J⁺ = J(255) (1 - 2^-20)` just below the largest `J`,
//! so that `D(255) = 0`. Then with `e = Λ - D(m)`, floored at 0, each term
//! with `e >= 1` is above
//! `a T(Λ - 256) J⁺ 2^(-D(m) / 32) = u 255 x 64 x 2^((e - 255) / 32)`
//! (to within `T`'s rounding), where `u = a 2^(-1 / 32) J⁺ / (255 x 64)`.
//! That last factor, with `e = 32 o + r` (`r` below 32), is
//! `255 x 2^((r - 31) / 32)` times `2^(o - 1)`: `V(e)` is the mantissa
//! `M(r) = ⌊255 x 2^((r - 31) / 32) (1 - 2^-40)⌋` (`M(31) = 255`) times
//! `2^(o - 1)`, and 0 in the lowest octave (`o = 0`, terms below 2^-8 of
//! the largest), so that the two fit `vpdpbusd`'s unsigned and signed
//! bytes. The margins (`J` and the logarithms found in f64 within 2^-45,
//! `T`'s rounding) are covered by 2^-40 each. A row's `sum V(e_i)` is
//! found exactly, in integers, and `u` times it is at most the row's exact
//! js distance.
//!
//! js's f32 kernel (`metric::jensen_shannon`) sums non-negative terms
//! `s g(t) / 4` as l1's does (within `g` of their sum, `floors`). Each term
//! whose bound above is not 0 has `m >= 2`, so `t >= 0.0108`; there it is
//! at least `(1 - 2^-15)` times the exact term, less 2^-150 where it falls
//! among the subnormals:
//! - `t` is found within 4 roundings (`|x - q|`, `s`, the quotient; `1 + t`
//!   for the far lanes), so at least `t (1 - 2^-22)`; `g` grows, and
//!   loses at most `2^-22 t g'(t)` by it: at most `9 x 2^-24` of `g` for
//!   `t <= 1/2` (where `t g' <= 2.2 g`), and for `t > 1/2` at most
//!   `∫ ln((1 + τ) / (1 - τ))` over `[1 - 2^-22, 1]`, `65 x 2^-24`, against
//!   `g(t) >= g(1/2) = 0.26`: `250 x 2^-24`;
//! - for `t <= 1/2` the series, all of whose terms are positive, is within
//!   about 25 roundings of `g`; for `t > 1/2`, `(1 + t) ln(1 + t)` is at
//!   most 1.39 and `|(1 - t) ln(1 - t)|` at most `1 / e`, each within its
//!   logarithm's error (`wide`'s and the standard library's `ln`, tested
//!   on every input these lanes can give them: within 2 x 2^-24 of
//!   themselves) and two roundings: about `30 x 2^-24` of `g >= 0.26`;
//! - the product by `s` is one rounding of the sum's.
//!
//! That is at most `300 x 2^-24 < 2^-15` of each term. So the kernel's js
//! is at least `(1 - 2^-15)(1 - g)` times `u sum V(e_i)`, less
//! `n 2^-148`, and a row is ruled out when that is strictly above the
//! threshold.
//!
//! The first pass looks up `D(m)` 64 bytes at a time with AVX-512 VBMI's
//! `vpermi2b` (a table of 128 bytes in two registers: two lookups and a
//! blend for 256 entries), `M(r)` and `2^(o - 1)` with `vpermb` (64
//! entries: `e mod 64`, and the top 6 bits of `e`), and multiplies and
//! adds them with `vpdpbusd`: 12 instructions for 64 values. Where the CPU
//! lacks VBMI, AVX2 gathers `D` and `V` from tables of i32. For random
//! data in [0, 1) of 768 dimensions the bound is about 5% below the
//! distance, against distances spread over about 4%: a lone search of
//! 100,000 such rows, scoring rows in the order of their bounds
//! (`Index::search_in_order`), scores about 0.6% of them exactly.

use std::sync::LazyLock;

/// `V`'s unit: its largest value's bound, at `e = 255`: the largest
/// mantissa, 255, times the largest power, 2^6.
const VALUE_UNIT: f64 = 255.0 * 64.0;

/// Levels an octave, as `ratios` places them.
const PER_OCTAVE: f64 = 32.0;

/// `D(m)` and `V(e) = mantissa(e) x power(e)` (the module doc): `D` as
/// bytes for `vpermi2b`; the mantissas by `e mod 64` and the powers by
/// `e >> 2`, 64 bytes each for `vpermb`; and `D` and `V` as i32 for AVX2's
/// gathers.
#[derive(Debug)]
pub struct Table {
    pub steps: [u8; 256],
    pub mantissas: [u8; 64],
    pub powers: [u8; 64],
    pub steps32: [i32; 256],
    pub values32: [i32; 256],
}

/// `ψ(ρ)` (the module doc), in f64: `g` through `ln_1p`, whose two terms
/// cancel to `t²` at worst by a factor of about 100 at the `t` the table
/// takes (at least 0.0108).
fn psi(ratio: f64) -> f64 {
    let t = (1.0 - ratio) / (1.0 + ratio);
    (1.0 + ratio) * ((1.0 + t) * t.ln_1p() + (1.0 - t) * (-t).ln_1p()) / 4.0
}

/// `J(m)`, the least `ψ` the levels allow, for `m >= 2`.
fn least(m: u8) -> f64 {
    psi((-(f64::from(m) - 1.0) / PER_OCTAVE).exp2() * (1.0 + 2f64.powi(-48)))
}

/// `J⁺`.
fn top() -> f64 {
    least(255) * (1.0 - 2f64.powi(-20))
}

/// The one `Table` (the module doc).
pub static TABLE: LazyLock<Table> = LazyLock::new(|| {
    let top = top();
    let steps: [u8; 256] = std::array::from_fn(|m| {
        if m <= 1 {
            return 255;
        }
        let lowered = least(m as u8) * (1.0 - 2f64.powi(-40));
        let steps = (PER_OCTAVE * (top / lowered).log2() + 2f64.powi(-30)).ceil().max(0.0);
        if steps > 254.0 {
            255
        } else {
            steps as u8
        }
    });
    assert_eq!(steps[255], 0, "the largest J is the top");
    // `e = 32 o + r`: mantissa `⌊255 x 2^((r - 31) / 32)⌋` (255 itself
    // exactly, the others below their f64 rounding), power `2^(o - 1)`,
    // and 0 for the lowest octave.
    let mantissas: [u8; 64] = std::array::from_fn(|e| match e % 32 {
        31 => 255,
        r => (255.0 * ((r as f64 - 31.0) / PER_OCTAVE).exp2() * (1.0 - 2f64.powi(-40))).floor() as u8,
    });
    let powers: [u8; 64] = std::array::from_fn(|quarter| match quarter >> 3 {
        0 => 0,
        o => 1 << (o - 1),
    });
    let values: [i32; 256] = std::array::from_fn(|e| i32::from(mantissas[e % 64]) * i32::from(powers[e >> 2]));
    Table { steps, mantissas, powers, steps32: steps.map(i32::from), values32: values }
});

/// `u` for a row of scale `a` (the module doc).
#[inline(always)]
pub fn unit(scale: f64) -> f64 {
    static UNIT: LazyLock<f64> = LazyLock::new(|| (-1.0 / PER_OCTAVE).exp2() * top() / VALUE_UNIT);
    scale * *UNIT
}

/// `V(e)` of one value: its level and the query's.
#[cfg(test)]
fn value_of(table: &Table, x: u8, q: u8) -> u64 {
    let (larger, m) = (x.max(q), x.abs_diff(q));
    let e = usize::from(larger.saturating_sub(table.steps[usize::from(m)]));
    table.values32[e] as u64
}

/// `sum V(e_i)` of a query's levels and a row's over `width` values, one
/// at a time: the reference the kernels must agree with.
#[cfg(test)]
pub fn sums_scalar(query: &[u8], row: &[u8], width: usize) -> u64 {
    let table = &*TABLE;
    query[..width].iter().zip(&row[..width]).map(|(&q, &x)| value_of(table, x, q)).sum()
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    use super::super::x86::{look_up, pair_256, pair_512, registers, sum_of};
    use super::Table;

    /// Each row's `sum V(e_i)` (the module doc), of the levels at `starts`
    /// in `bytes` against `queries` (each at least `width` levels), on
    /// 64-byte blocks with AVX-512 VBMI's byte lookups and a last one of 32
    /// with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW, VBMI and VNNI and AVX2; `bytes` must
    /// hold `width` bytes from each start; `width` a multiple of 32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2")]
    pub unsafe fn sums_vbmi<const R: usize>(
        table: &Table,
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        width: usize,
    ) -> [u64; R] {
        let steps = registers(&table.steps);
        // SAFETY: 64 bytes each.
        let (mantissas, powers) = unsafe {
            (_mm512_loadu_si512(table.mantissas.as_ptr().cast()), _mm512_loadu_si512(table.powers.as_ptr().cast()))
        };
        let zero = _mm512_setzero_si512();
        let mut sums = [zero; R];
        let mut at = 0;
        while at + 64 <= width {
            for r in 0..R {
                let query = queries[r];
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe { pair_512(bytes, starts[r] + at, query, at) };
                let larger = _mm512_max_epu8(x, q);
                let m = _mm512_sub_epi8(larger, _mm512_min_epu8(x, q));
                let e = _mm512_subs_epu8(larger, look_up(&steps, m, _mm512_movepi8_mask(m)));
                // `vpermb` reads the low 6 bits of each index: `e mod 64`
                // for the mantissa, and of `e >> 2` shifted in 16-bit
                // lanes, the byte's own top 6 bits for the power.
                let mantissa = _mm512_permutexvar_epi8(e, mantissas);
                let power = _mm512_permutexvar_epi8(_mm512_srli_epi16::<2>(e), powers);
                sums[r] = _mm512_dpbusd_epi32(sums[r], mantissa, power);
            }
            at += 64;
        }
        // SAFETY: the same bounds, for the last 32 bytes if any.
        let tail = unsafe { sums_avx2::<R>(table, bytes, starts, queries, (at, width - at)) };
        // Each lane adds at most 4 x 255 x 64 per 64 values: below 2^31.
        std::array::from_fn(|r| _mm512_reduce_add_epi32(sums[r]) as u32 as u64 + tail[r])
    }

    /// `sums_vbmi` with AVX2's gathers, over the `len` levels from `at` (a
    /// multiple of 32).
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `sums_vbmi`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sums_avx2<const R: usize>(
        table: &Table,
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
    ) -> [u64; R] {
        let (steps, values) = (table.steps32.as_ptr(), table.values32.as_ptr());
        let zero = _mm256_setzero_si256();
        let mut sums = [zero; R];
        for step in (at..at + len).step_by(32) {
            for r in 0..R {
                let query = queries[r];
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe { pair_256(bytes, starts[r] + step, query, step) };
                let larger = _mm256_max_epu8(x, q);
                let m = _mm256_sub_epi8(larger, _mm256_min_epu8(x, q));
                let eighths = |v: __m256i| {
                    let (low, high) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
                    [low, _mm_srli_si128::<8>(low), high, _mm_srli_si128::<8>(high)].map(|v| _mm256_cvtepu8_epi32(v))
                };
                for (m, larger) in eighths(m).into_iter().zip(eighths(larger)) {
                    // SAFETY: every index is a byte, within the 256 entries.
                    let e = unsafe { _mm256_i32gather_epi32::<4>(steps, m) };
                    let e = _mm256_max_epi32(_mm256_sub_epi32(larger, e), zero);
                    // SAFETY: as above.
                    sums[r] = _mm256_add_epi32(sums[r], unsafe { _mm256_i32gather_epi32::<4>(values, e) });
                }
            }
        }
        // Each lane adds at most 255 x 64 per 8 values: below 2^31.
        sums.map(|sum| {
            let (low, high) = (_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
            sum_of(_mm256_add_epi64(_mm256_cvtepu32_epi64(low), _mm256_cvtepu32_epi64(high)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each `V(D)` step of the table lies below the least term `m` and the
    /// larger level allow, and not far below: for every `m` and every
    /// larger level, in units of the row's scale.
    #[test]
    fn the_table_stays_below_every_term() {
        let table = &*TABLE;
        let mut worst: f64 = 1.0;
        for larger in 1..=255u8 {
            for m in 0..=larger {
                let smaller = larger - m;
                let bound = value_of(table, larger, smaller) as f64 * unit(1.0);
                // The least term: the larger value at its level's lower
                // edge, the smaller at its upper edge (level 0's too: it
                // holds every value up to it), at most the larger.
                let edge = |level: u8| (f64::from(level) - 256.0) / PER_OCTAVE;
                let big = edge(larger).exp2();
                let small = (edge(smaller) + 1.0 / PER_OCTAVE).exp2().min(big);
                let term = big * psi(small / big);
                assert!(bound <= term * (1.0 - 2f64.powi(-30)), "level {larger}, m {m}: {bound} above {term}");
                if term >= top() / 16.0 {
                    worst = worst.min(bound / term);
                }
            }
        }
        // Where terms count (a sixteenth of the largest or more): within
        // a level of `D`'s rounding and one of `Λ`'s edge, 2^(-2/32), and
        // the units' rounding.
        assert!(worst >= 0.955, "{worst}");
    }
}
