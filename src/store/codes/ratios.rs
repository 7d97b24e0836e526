//! Canberra's codes: one byte per value for where its magnitude lies on a
//! logarithmic scale, and one bit for its sign; and the nearest a row can
//! be in Canberra distance from them (the first pass of Canberra searches,
//! run by `floors::Grids`).
//!
//! Canberra's terms `|x - q| / (|x| + |q|)` do not depend on the values'
//! size, only on their ratio: two values of one sign whose magnitudes are
//! `τ` octaves apart give `H(τ) = (1 - 2^-τ) / (1 + 2^-τ)`, two of opposite
//! signs 1. A linear code (as l1's) is coarse where values are small,
//! where these terms are as large as anywhere; a logarithmic one is as
//! fine everywhere.
//!
//! # The codes
//! A row `x` with largest magnitude `m` has scale `a`, the least power of
//! two not below `m` (at least 2^-126, as `floors`), so that each
//! `v_i = |x_i| / a` is at most 1 and exact in f64. The edges of the levels
//! are `T(s) = 2^⌊s/32⌋ M[s mod 32]` for every integer `s`, where `M[r]` is
//! `2^(r/32)` in f64 (`M[0] = 1`): they increase with `s`, 32 levels an
//! octave. A value's level is `ℓ(v) = s + 256` clamped to [0, 255], where
//! `s` is the largest integer with `v > T(s)` (`level_of`); so a level
//! `L >= 1` holds `v > T(L - 256)`, a level `L <= 254` holds
//! `v <= T(L - 255)`, and level 0 holds every value down to 0. Its sign bit
//! is set where `x_i < 0`. For each scale `a` the index's rows have, the
//! query `q` is coded the same way on that scale (`v_i = |q_i| / a`, which
//! may exceed 1: its level is then 255, and `v > T(-1)` still holds).
//!
//! # Why a ruled-out row cannot belong in the answer
//! Take one dimension, the row's level `L_x` and sign, the query's `L_q`
//! and sign, and `m = |L_x - L_q|`, or `m = 255` where the signs differ.
//! - Signs that differ: one value is negative, the other at least 0, so
//!   the term is exactly 1.
//! - Signs alike, say `L_x > L_q` (the other way round is the same with
//!   the roles swapped): `|x| > a T(L_x - 256)` and `|q| <= a T(L_q - 255)`,
//!   so the ratio `ρ = |q| / |x|` is below `T(L_q - 255) / T(L_x - 256)`,
//!   which is `2^(-(m-1)/32)` to within the tables' rounding (each `M[r]`
//!   within 2^-50 of itself: their quotient within 2^-48). The term
//!   `(1 - ρ) / (1 + ρ)` falls with `ρ`, by at most 2 per unit of `ρ`, so
//!   it is at least `G(m) - 2^-47`, where `G(m) = H((m - 1) / 32)`. With
//!   `m = 0` it is at least 0.
//!
//! `G` is concave from `m = 1` on. The bound `B(m)` of a term is a line
//! for each 16 values of `m` that share `h = m >> 4`:
//! `B(m) = base[h] / 65,535 + m slope[h] / 11,800 - OFFSET / 65,535`, with
//! integers `slope[h]` (one byte: the slope of `G`'s chord over the
//! segment, from `m = 1` for the first, less 2^-40, rounded down) and
//! `base[h]` (two bytes: the least of `G(m) - m slope[h] / 11,800` over the
//! segment's `m`, with 0 for `m = 0`, less 2^-40, in units of 1/65,535
//! rounded down, plus `OFFSET`, which keeps the first segment's, a little
//! below 0, above 0). So `B(m) <= G(m) - 2^-40` for every `m >= 1`, and
//! `B(0) <= 0`, `G` evaluated in f64 within 2^-50: each row's
//! `sum B(m_i)`, found exactly in integers, is at most its exact Canberra
//! distance. The slope's rounding costs at most 15/11,800 in a segment,
//! where the least is taken; the chord's bend, at most 0.003.
//!
//! Canberra's f32 kernel (`metric::canberra`) rounds each term three
//! times (the difference, the sum of magnitudes, the quotient: each within
//! 2^-24 of itself, or exact among the subnormals, but the quotient, then
//! within 2^-150) and adds the terms as `floors` says, within `g` of their
//! sum. So the kernel's distance is at least `(1 - 3 x 2^-24)(1 - g)` times
//! the exact one, less `n 2^-149`, and a row is ruled out when that floor
//! of `sum B(m_i)` is strictly above the threshold.
//!
//! For random data in [0, 1) of 768 dimensions the bound is about 3% below
//! the distance (10 of about 300), against distances spread over about 2%
//! (6.6): a search on one thread scores 1.7% of 100,000 rows exactly, most
//! of them before its k nearest settle.

use std::sync::LazyLock;

use super::{power_of_two_at_least, BLOCK};

/// Levels an octave.
const PER_OCTAVE: i32 = 32;

/// The units of `Table`'s bases and slopes, and the bases' offset (the
/// module doc).
pub const BASE_UNIT: f64 = 65_535.0;
pub const SLOPE_UNIT: f64 = 11_800.0;
pub const OFFSET: u64 = 1_024;

/// `M[r] = 2^(r/32)`: the edges of the levels within an octave.
static EDGES: LazyLock<[f64; PER_OCTAVE as usize]> =
    LazyLock::new(|| std::array::from_fn(|r| 2f64.powf(r as f64 / f64::from(PER_OCTAVE))));

/// For each of 64 equal parts `[1 + j/64, 1 + (j+1)/64)` of an octave, how
/// many edges lie below its start. Edges are more than 1/64 apart
/// (`M[1] - M[0] > 0.0219`), so a part holds at most one, the next.
static BELOW: LazyLock<[u8; 64]> = LazyLock::new(|| {
    assert!(EDGES.windows(2).all(|pair| pair[1] - pair[0] > 1.0 / 64.0), "at most one edge a part");
    std::array::from_fn(|j| EDGES.partition_point(|&edge| edge < 1.0 + j as f64 / 64.0) as u8)
});

/// `B(m)` as the kernels look it up, by `h = m >> 4`: the base's low and
/// high bytes, and the slope.
#[derive(Debug)]
pub struct Table {
    pub low: [u8; 16],
    pub high: [u8; 16],
    pub slopes: [i8; 16],
}

/// The one `Table` (the module doc).
pub static TABLE: LazyLock<Table> = LazyLock::new(|| {
    // G(m), and 0 for m = 0.
    let floor_of = |m: u32| {
        let ratio = (-(f64::from(m.max(1)) - 1.0) / f64::from(PER_OCTAVE)).exp2();
        (1.0 - ratio) / (1.0 + ratio)
    };
    let margin = 2f64.powi(-40);
    let segment = |h: u32| 16 * h..16 * h + 16;
    let slopes: [i8; 16] = std::array::from_fn(|h| {
        let (from, to) = ((16 * h as u32).max(1), 16 * h as u32 + 16);
        let chord = (floor_of(to) - floor_of(from)) / f64::from(to - from);
        let slope = (SLOPE_UNIT * (chord - margin)).floor();
        assert!((0.0..=127.0).contains(&slope), "a slope fits a signed byte");
        slope as i8
    });
    // AVX2 adds two products `m slope[h]` in an i16 (`vpmaddubsw`).
    assert!((0..=255u32).all(|m| m * slopes[m as usize >> 4] as u32 <= 16_383), "a pair of products fits an i16");
    let bases: [u16; 16] = std::array::from_fn(|h| {
        let least = segment(h as u32)
            .map(|m| floor_of(m) - f64::from(m) * f64::from(slopes[h]) / SLOPE_UNIT)
            .fold(f64::INFINITY, f64::min);
        let base = (BASE_UNIT * (least - margin)).floor() + OFFSET as f64;
        assert!((0.0..=65_535.0).contains(&base), "a base fits two bytes");
        base as u16
    });
    Table { low: bases.map(|b| b as u8), high: bases.map(|b| (b >> 8) as u8), slopes }
});

/// The level of `v = |value| / a` (at least 0, finite): the module doc's
/// `ℓ(v)`.
#[inline]
pub fn level_of(v: f64) -> u8 {
    if v == 0.0 {
        return 0;
    }
    // v = 2^e m with m in [1, 2): v is a quotient of f32s, so normal in f64.
    let bits = v.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i32 - 1023;
    let mantissa = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
    // How many edges of the octave lie below m: v > T(32 e + r) for exactly
    // those r in 0..32, and for every s below 32 e.
    let below = usize::from(BELOW[(bits >> 46) as usize & 63]);
    let below = (below + usize::from(EDGES.get(below).is_some_and(|&edge| edge < mantissa))) as i32;
    let largest = PER_OCTAVE * exponent + below - 1;
    (largest + 256).clamp(0, 255) as u8
}

/// Codes `v` into `levels` (padded with level 0, a whole number of
/// blocks) and its sign bits into `signs`, one for each level (none where
/// `signs` is empty: js's codes). Returns its scale.
pub fn encode(v: &[f32], levels: &mut [u8], signs: &mut [u8]) -> f32 {
    let largest = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = power_of_two_at_least(largest);
    encode_on(v, f64::from(scale), levels, signs);
    scale
}

/// Codes `v` (as `encode`) on the scale `scale`, a power of two.
pub fn encode_on(v: &[f32], scale: f64, levels: &mut [u8], signs: &mut [u8]) {
    let width = levels.len();
    assert!(width.is_multiple_of(BLOCK) && v.len() <= width && (signs.is_empty() || signs.len() == width / 8));
    levels.fill(0);
    signs.fill(0);
    for (i, &x) in v.iter().enumerate() {
        levels[i] = level_of(f64::from(x.abs()) / scale);
        if let Some(bits) = signs.get_mut(i / 8) {
            *bits |= u8::from(x < 0.0) << (i % 8);
        }
    }
}

/// The least Canberra distance `B` allows from a row's sums of bases and
/// slopes over `width` values (the module doc).
#[inline(always)]
pub fn bound((bases, slopes): (u64, i64), width: usize) -> f64 {
    (bases as f64 - (width as u64 * OFFSET) as f64) / BASE_UNIT + slopes as f64 / SLOPE_UNIT
}

/// `sum base[h]` and `sum m slope[h]` of a query's code (its `width`
/// levels, then their sign bits) and a row's levels and sign bits, one
/// value at a time: the reference the kernels must agree with.
#[cfg(test)]
pub fn sums_scalar(query: &[u8], (row, row_signs): (&[u8], &[u8]), width: usize) -> (u64, i64) {
    let table = &*TABLE;
    (0..width).fold((0, 0), |(base, slope), i| {
        let differ = (query[width + i / 8] ^ row_signs[i / 8]) >> (i % 8) & 1 == 1;
        let m = if differ { 255 } else { query[i].abs_diff(row[i]) };
        let h = usize::from(m >> 4);
        let b = u64::from(table.low[h]) + 256 * u64::from(table.high[h]);
        (base + b, slope + i64::from(m) * i64::from(table.slopes[h]))
    })
}

/// `B(m)`, for the tests of the table.
#[cfg(test)]
pub fn bound_of(m: u8) -> f64 {
    let table = &*TABLE;
    let h = usize::from(m >> 4);
    let base = u64::from(table.low[h]) + 256 * u64::from(table.high[h]);
    bound((base, i64::from(m) * i64::from(table.slopes[h])), 1)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    use super::super::x86::{pair_256, pair_512, sum256, sum_of};
    use super::Table;

    /// Each row's `sum base[h]` and `sum m slope[h]` (the module doc), of
    /// the levels at `starts` in `bytes` and their sign bits from
    /// `starts / 8` in `signs`, against `queries` (each `width` levels,
    /// then their sign bits), on 64-byte blocks and a last one of 32, with
    /// AVX-512BW and VNNI's `vpdpbusd` to add up bytes and their products.
    /// Without `SIGNS` (no value of the query or of any row is negative:
    /// every sign bit is 0) the signs are not read.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI; `bytes` must hold `width`
    /// bytes from each start, `signs` `width / 8` from each start's eighth,
    /// each query `width + width / 8`; `width` a multiple of 32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn sums_avx512<const SIGNS: bool, const R: usize>(
        table: &Table,
        (bytes, signs): (&[u8], &[u8]),
        starts: [usize; R],
        queries: [&[u8]; R],
        width: usize,
    ) -> [(u64, i64); R] {
        let lanes = |t: &[u8; 16]| {
            // SAFETY: 16 bytes.
            _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
        };
        let (low, high) = (lanes(&table.low), lanes(&table.high));
        let slopes = lanes(&table.slopes.map(|s| s as u8));
        let (one, nibble, zero) = (_mm512_set1_epi8(1), _mm512_set1_epi8(15), _mm512_setzero_si512());
        // `one`: the ones `vpdpbusd` adds bytes with.
        let mut bases = [(zero, zero); R];
        let mut sloped = [zero; R];
        let mut at = 0;
        while at + 64 <= width {
            for r in 0..R {
                let query = queries[r];
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe { pair_512(bytes, starts[r] + at, query, at) };
                let mut m = _mm512_or_si512(_mm512_subs_epu8(x, q), _mm512_subs_epu8(q, x));
                if SIGNS {
                    // SAFETY: in bounds, as the caller promises.
                    let differ = unsafe {
                        let x_signs = signs.as_ptr().add((starts[r] + at) / 8).cast::<u64>().read_unaligned();
                        x_signs ^ query.as_ptr().add(width + at / 8).cast::<u64>().read_unaligned()
                    };
                    m = _mm512_mask_mov_epi8(m, differ, _mm512_set1_epi8(-1));
                }
                let h = _mm512_and_si512(_mm512_srli_epi16::<4>(m), nibble);
                bases[r].0 = _mm512_dpbusd_epi32(bases[r].0, _mm512_shuffle_epi8(low, h), one);
                bases[r].1 = _mm512_dpbusd_epi32(bases[r].1, _mm512_shuffle_epi8(high, h), one);
                sloped[r] = _mm512_dpbusd_epi32(sloped[r], m, _mm512_shuffle_epi8(slopes, h));
            }
            at += 64;
        }
        // SAFETY: the same bounds, for the last 32 bytes if any.
        let tail = unsafe { sums_avx2::<SIGNS, R>(table, (bytes, signs), starts, queries, (at, width - at), width) };
        std::array::from_fn(|r| {
            let base = _mm512_reduce_add_epi32(bases[r].0) as u32 as u64
                + 256 * _mm512_reduce_add_epi32(bases[r].1) as u32 as u64;
            (base + tail[r].0, i64::from(_mm512_reduce_add_epi32(sloped[r])) + tail[r].1)
        })
    }

    /// `sums_avx512` with AVX2, over the `len` levels from `at` (a multiple
    /// of 32).
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `sums_avx512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sums_avx2<const SIGNS: bool, const R: usize>(
        table: &Table,
        (bytes, signs): (&[u8], &[u8]),
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
        width: usize,
    ) -> [(u64, i64); R] {
        let lanes = |t: &[u8; 16]| {
            // SAFETY: 16 bytes.
            _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t.as_ptr().cast()) })
        };
        let (low, high) = (lanes(&table.low), lanes(&table.high));
        let slopes = lanes(&table.slopes.map(|s| s as u8));
        let (nibble, zero, pairs) = (_mm256_set1_epi8(15), _mm256_setzero_si256(), _mm256_set1_epi16(1));
        // A sign bit's byte to each of its 8 values' bytes, and the bit each
        // value tests.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let mut bases = [(zero, zero); R];
        let mut sloped = [zero; R];
        for step in (at..at + len).step_by(32) {
            for r in 0..R {
                let query = queries[r];
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe { pair_256(bytes, starts[r] + step, query, step) };
                let mut m = _mm256_or_si256(_mm256_subs_epu8(x, q), _mm256_subs_epu8(q, x));
                if SIGNS {
                    // SAFETY: in bounds, as the caller promises.
                    let differ = unsafe {
                        let x_signs = signs.as_ptr().add((starts[r] + step) / 8).cast::<u32>().read_unaligned();
                        x_signs ^ query.as_ptr().add(width + step / 8).cast::<u32>().read_unaligned()
                    };
                    let differ = _mm256_shuffle_epi8(_mm256_set1_epi32(differ as i32), spread);
                    m = _mm256_or_si256(m, _mm256_cmpeq_epi8(_mm256_and_si256(differ, bits), bits));
                }
                let h = _mm256_and_si256(_mm256_srli_epi16::<4>(m), nibble);
                bases[r].0 = _mm256_add_epi64(bases[r].0, _mm256_sad_epu8(_mm256_shuffle_epi8(low, h), zero));
                bases[r].1 = _mm256_add_epi64(bases[r].1, _mm256_sad_epu8(_mm256_shuffle_epi8(high, h), zero));
                // Each m slope[h] is at most 16,383 (`TABLE`): a pair's sum
                // fits an i16.
                let products = _mm256_maddubs_epi16(m, _mm256_shuffle_epi8(slopes, h));
                sloped[r] = _mm256_add_epi32(sloped[r], _mm256_madd_epi16(products, pairs));
            }
        }
        std::array::from_fn(|r| (sum_of(bases[r].0) + 256 * sum_of(bases[r].1), i64::from(sum256(sloped[r]))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The levels' edges as the module doc defines them: `T(s)` in f64.
    fn edge(s: i32) -> f64 {
        2f64.powi(s.div_euclid(PER_OCTAVE)) * EDGES[s.rem_euclid(PER_OCTAVE) as usize]
    }

    /// Each level holds what the module doc says: `v > T(L - 256)` from
    /// level 1, `v <= T(L - 255)` up to level 254, at and around every edge,
    /// and from 0 to above 1.
    #[test]
    fn levels_hold_what_the_doc_says() {
        let mut values = vec![0.0, 1.0, 1.5, 2.0, 1e30, f64::from(f32::from_bits(1)) / 2f64.powi(127)];
        for s in -300..=40 {
            let t = edge(s);
            values.extend([t, t.next_up(), t.next_down(), t * 1.01]);
        }
        for v in values {
            let level = i32::from(level_of(v));
            if level >= 1 {
                assert!(v > edge(level - 256), "{v}: level {level}");
            }
            if level <= 254 {
                assert!(v <= edge(level - 255), "{v}: level {level}");
            }
        }
        assert_eq!(level_of(1.0), 255);
        assert_eq!(level_of(0.5), 255 - 32);
        assert_eq!(level_of(2f64.powi(-9)), 0);
    }

    /// `B(m)` lies below the smallest term `m` allows, for every `m`: the
    /// ratio `2^(-(m-1)/32)` less the tables' rounding (0 for `m = 0`).
    #[test]
    fn the_table_stays_below_every_term() {
        for m in 0..=255u8 {
            let ratio = (-(f64::from(m.max(1)) - 1.0) / 32.0).exp2() * (1.0 + 2f64.powi(-48));
            let term = ((1.0 - ratio) / (1.0 + ratio)).max(0.0);
            assert!(bound_of(m) <= term, "m {m}: {} above {term}", bound_of(m));
            // Close below: a chord of 16 steps gives up at most 0.003 where
            // the curve bends most, the units' rounding 0.0013; the first
            // segment's line crosses 0 at m = 1, so is below it at m = 0.
            let close = if m == 0 { 0.011 } else { 0.0045 };
            assert!(bound_of(m) >= term - close, "m {m}: {} far below {term}", bound_of(m));
        }
    }
}
