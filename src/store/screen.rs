//! A first pass in bfloat16 that rules rows out before their exact score.
//!
//! A batch of searches is bound by arithmetic, not by memory: each row is
//! read once for all the queries, but each (query, row) pair still costs
//! `dims` multiply-adds. AVX512-BF16's `vdpbf16ps` does 32 products per
//! instruction where an f32 multiply-add does 16. So a batch first scores
//! every pair in bfloat16 (8-bit significands, summed in f32), and only the
//! pairs that this score cannot rule out are scored again by the f32 kernel
//! the lone search uses. The answers stay exact, bit for bit.
//!
//! # Why a ruled-out row cannot belong in the answer
//! For a query `q` and a row `x` of `n` dimensions, let `s` be the true inner
//! product, `s_f` the f32 kernel's and `s_b` the bfloat16 pass's. Let
//! `u = 2^-8` (rounding an f32 to bfloat16's 8-bit significand, to nearest),
//! `t = 2^-126` (the smallest normal f32: the most that flushing a tiny
//! value or result to zero loses), and `g = kernels::relative_error(n)`,
//! the f32 kernels' error model (`m 2^-24 / (1 - m 2^-24)` for
//! `m = n / 4 + 64` roundings, argued there), which covers `vdpbf16ps` too:
//! it takes at most two roundings per 32 values, fewer than the kernels'.
//! - Converting: `|bf(v) - v| <= u |v| + t` for each value (rounding, or a
//!   tiny value flushed to zero). So each product of the pass is within
//!   `(2u + u^2) |q_i x_i| + t (1 + u) (|q_i| + |x_i|) + t^2` of the true one.
//!   A product of two bfloat16 values is exact in f32.
//! - Summing: each of `vdpbf16ps`' roundings in f32 (at most two per lane per
//!   instruction), and the reduction's, is off by at most `2^-24` of the
//!   partial sum, plus `t` where a result or an input is flushed to zero.
//!   So the sum is off by at most `g` times the sum of the products'
//!   magnitudes, plus `t` per flush: at most three per instruction on a lane
//!   that holds values (lanes of padding stay exactly zero) and one per add
//!   of the reduction, fewer than `2n + 32` in all.
//! - The f32 kernel, by the same reasoning, is within `g sum|q_i x_i|` (plus
//!   underflow, far below `t` per operation) of `s`.
//!
//! With `sum|q_i x_i| <= |q| |x|` and `sum|v_i| <= sqrt(n) |v|` (Cauchy-
//! Schwarz), `|s_b - s_f| <= C0 |q||x| + K0 (|q| + |x|) + A0`, where
//! `C0 = 2u + u^2 + 2g (1 + u)^2`, `K0 = (1 + g)(1 + u) t sqrt(n)` and
//! `A0 = (2n + 34) t`. The bound used is `C = C0 + 2^-20`, `K = 2 K0` and
//! `A = 2 A0`: the surplus covers the roundings of computing the bound
//! itself in f32 (a handful of relative `2^-24`) and of adding it to `s_b`.
//! The norms are upper bounds (f64 sums, rounded up), and norms above 2^60
//! count as infinite, so that no sum of either pass can overflow where the
//! bound is finite; an infinite or NaN bound or score rules nothing out.
//!
//! A row is ruled out for a query when even `s_b + bound`, turned into a
//! distance the way the exact score would be (a monotone map: products
//! with the positive norms' inverses, then a negation), is strictly farther
//! than the farthest the query keeps. The exact distance is at least as far,
//! so the row could not have entered; every other row is scored exactly.
//!
//! For random 768-dimension data the cosine bound is about 0.008, against
//! similarities spread over about 0.036: only rows near the k-th nearest
//! are scored twice.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m512, __m512bh, __m512i, _mm512_add_ps, _mm512_cvtne2ps_pbh, _mm512_dpbf16_ps, _mm512_loadu_ps,
    _mm512_mask_cmp_ps_mask, _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_permutexvar_ps, _mm512_setzero_ps,
    _CMP_NLT_UQ,
};

use super::cpu;
use super::kernels;

/// Values in one block: one 512-bit vector of bfloat16.
pub const BLOCK_VALUES: usize = 32;

/// 32 bfloat16 values (their bits), one cache line, so that a load never
/// straddles two.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C, align(64))]
pub struct Block([u16; BLOCK_VALUES]);

/// Norms above this count as infinite (see the module doc): products of two
/// are then at most 2^120, and no sum of them comes near f32's 2^128.
const NORM_FINITE_MAX: f64 = (1u64 << 60) as f64;

/// Whether this CPU has the instructions the pass needs.
#[cfg(target_arch = "x86_64")]
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// Whether this CPU has the instructions the pass needs: only x86-64's do.
#[cfg(not(target_arch = "x86_64"))]
pub fn available() -> bool {
    false
}

/// Blocks that hold a vector of `dims` values, zeros after them.
pub fn blocks_for(dims: usize) -> usize {
    dims.div_ceil(BLOCK_VALUES)
}

/// An upper bound on a vector's Euclidean norm, from its `squared_norm`;
/// infinite above `NORM_FINITE_MAX`.
pub fn norm_bound_of(squared: f64) -> f32 {
    let norm = squared.sqrt();
    if norm > NORM_FINITE_MAX {
        f32::INFINITY
    } else {
        kernels::f32_at_least(norm)
    }
}

/// How far apart the two passes' scores of a pair can be, as a function of
/// the norms: `C |q||x| + K (|q| + |x|) + A` (see the module doc).
#[derive(Clone, Copy, Debug)]
struct Bound {
    relative: f64,
    per_norm: f64,
    absolute: f64,
}

impl Bound {
    fn new(dims: usize) -> Bound {
        let (u, t, n) = (2f64.powi(-8), 2f64.powi(-126), dims as f64);
        let g = kernels::relative_error(dims);
        Bound {
            relative: 2.0 * u + u * u + 2.0 * g * (1.0 + u) * (1.0 + u) + 2f64.powi(-20),
            per_norm: 2.0 * (1.0 + g) * (1.0 + u) * t * n.sqrt(),
            absolute: 2.0 * (2.0 * n + 34.0) * t,
        }
    }

    /// For a query of norm (bound) `norm`: the slope and offset of the bound
    /// as a function of the row's norm, both rounded up.
    fn for_query(&self, norm: f32) -> (f32, f32) {
        if norm.is_infinite() {
            return (f32::INFINITY, f32::INFINITY);
        }
        let norm = f64::from(norm);
        (
            kernels::f32_at_least(self.relative * norm + self.per_norm),
            kernels::f32_at_least(self.per_norm * norm + self.absolute),
        )
    }
}

/// The distance that pairs are ranked by, from their dot product `score`:
/// `-((score x row_scale) x query_scale)`, the scales being the inverse norms
/// for cosine and ones for the inner product (which leave `-score` as it
/// is, bit for bit). Never nearer for a larger score.
#[inline(always)]
pub fn distance(score: f32, row_scale: f32, query_scale: f32) -> f32 {
    -((score * row_scale) * query_scale)
}

/// A batch's queries in bfloat16, with each one's scale (`distance`) and
/// bound.
#[derive(Debug)]
pub struct Screen {
    blocks: usize,
    queries: Vec<Block>,
    scales: Vec<f32>,
    slopes: Vec<f32>,
    offsets: Vec<f32>,
}

impl Screen {
    /// The pass for `queries` of `dims` values, with their `squared_norms`
    /// (`kernels::squared_norm`), whose distances are scaled by `scales`;
    /// `None` where the CPU cannot run it.
    pub fn new(queries: &[&[f32]], squared_norms: &[f64], scales: &[f32], dims: usize) -> Option<Screen> {
        let mut screen = None;
        Screen::fill(&mut screen, queries, squared_norms, scales, dims);
        screen
    }

    /// `new`, into `slot`, whose screen's buffers (if it holds one) are
    /// kept: whether the CPU runs the pass (then `slot` holds it).
    #[cfg(target_arch = "x86_64")]
    pub fn fill(
        slot: &mut Option<Screen>,
        queries: &[&[f32]],
        squared_norms: &[f64],
        scales: &[f32],
        dims: usize,
    ) -> bool {
        assert!(queries.len() == squared_norms.len() && queries.len() == scales.len());
        // The exact pass that follows must score as every other search of
        // the process does: in AVX-512's lanes.
        if !available() || cpu::paths().f32() != cpu::F32::Avx512 {
            return false;
        }
        let screen = slot.get_or_insert_with(|| Screen {
            blocks: 0,
            queries: Vec::new(),
            scales: Vec::new(),
            slopes: Vec::new(),
            offsets: Vec::new(),
        });
        let blocks = blocks_for(dims);
        screen.blocks = blocks;
        screen.queries.clear();
        screen.queries.resize(queries.len() * blocks, Block::default());
        for (query, out) in queries.iter().zip(screen.queries.chunks_exact_mut(blocks)) {
            // SAFETY: `available` found both features on this CPU.
            unsafe { convert(query, out) };
        }
        let bound = Bound::new(dims);
        screen.scales.clear();
        screen.scales.extend_from_slice(scales);
        screen.slopes.clear();
        screen.offsets.clear();
        for &squared in squared_norms {
            let (slope, offset) = bound.for_query(norm_bound_of(squared));
            screen.slopes.push(slope);
            screen.offsets.push(offset);
        }
        true
    }

    /// The pass is x86-64's alone.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn fill(_slot: &mut Option<Screen>, _: &[&[f32]], _: &[f64], _: &[f32], _dims: usize) -> bool {
        false
    }

    /// Blocks per vector.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Query `q` in bfloat16.
    pub fn query(&self, q: usize) -> &[Block] {
        &self.queries[q * self.blocks..(q + 1) * self.blocks]
    }

    /// Query `q`'s scale of its distances.
    pub fn scale(&self, q: usize) -> f32 {
        self.scales[q]
    }

    /// Which pairs of a tile of `Q` queries (from `first`) and `R` rows
    /// (norm bounds `row_norms`, scales `row_scales`) the bound cannot rule
    /// out, given each query's farthest kept distance in `thresholds`: bit
    /// `lane` stands for the pair `pair_of_lane(lane, R)`. A pair is ruled
    /// out when even the highest its exact score can be, `score + |x|
    /// slope + offset`, gives a distance strictly farther than its query's
    /// threshold; an infinite or NaN bound rules nothing out.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX512-BF16, as it has where a
    /// `Screen` exists.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    pub fn undecided<const Q: usize, const R: usize>(
        &self,
        scores: Scores,
        first: usize,
        row_norms: &[f32; R],
        row_scales: &[f32; R],
        thresholds: [f32; Q],
    ) -> u16 {
        let queries = first..first + Q;
        let slope = by_query::<R>(&self.slopes[queries.clone()]);
        let offset = by_query::<R>(&self.offsets[queries.clone()]);
        let query_scale = by_query::<R>(&self.scales[queries]);
        let threshold = by_query::<R>(&thresholds.map(|t| -t));
        let (norm, row_scale) = (by_row::<R>(row_norms), by_row::<R>(row_scales));
        let ceiling = _mm512_add_ps(scores.0, _mm512_add_ps(_mm512_mul_ps(norm, slope), offset));
        // `distance` without its negation: the pair is ruled out when this
        // is below the negated threshold.
        let scaled = _mm512_mul_ps(_mm512_mul_ps(ceiling, row_scale), query_scale);
        let pairs = (0..16).filter(|&lane| pair_of_lane(lane, R).0 < Q).fold(0, |mask, lane| mask | 1 << lane);
        _mm512_mask_cmp_ps_mask::<_CMP_NLT_UQ>(pairs, scaled, threshold)
    }
}

/// The pair (query, row) of a tile of `rows` rows whose score lane `lane`
/// of `Scores` holds (the order `kernels::reduce16` leaves them in).
pub const fn pair_of_lane(lane: usize, rows: usize) -> (usize, usize) {
    let pair = kernels::transposed(lane);
    (pair / rows, pair % rows)
}

/// The bfloat16 scores of a tile, lane by lane as `pair_of_lane` says.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub struct Scores(__m512);

/// Each lane of a tile of `R` rows given its query's value of `values`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn by_query<const R: usize>(values: &[f32]) -> __m512 {
    spread(values, std::array::from_fn(|lane| pair_of_lane(lane, R).0))
}

/// Each lane of a tile of `R` rows given its row's value of `values`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn by_row<const R: usize>(values: &[f32; R]) -> __m512 {
    spread(values, std::array::from_fn(|lane| pair_of_lane(lane, R).1))
}

/// Lane `l` given `values[picks[l]]` (or the last value, where there is
/// none: such lanes are padding).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn spread(values: &[f32], picks: [usize; 16]) -> __m512 {
    assert!(!values.is_empty() && values.len() <= 16);
    let picks = picks.map(|pick| pick.min(values.len() - 1) as i32);
    let present = (1u32 << values.len()).wrapping_sub(1) as u16;
    // SAFETY: the mask lets the load read only the `values.len()` floats there are.
    let values = unsafe { _mm512_maskz_loadu_ps(present, values.as_ptr()) };
    // SAFETY: 16 i32s are a vector of 16 i32s.
    _mm512_permutexvar_ps(unsafe { std::mem::transmute::<[i32; 16], __m512i>(picks) }, values)
}

/// Converts `v` to bfloat16 into `out`, zeros after its last value.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512-BF16: `available` says so, and a
/// `Screen` exists only where it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub fn convert(v: &[f32], out: &mut [Block]) {
    assert_eq!(out.len(), blocks_for(v.len()));
    let (whole, tail) = v.as_chunks::<BLOCK_VALUES>();
    for (values, block) in whole.iter().zip(out.iter_mut()) {
        *block = convert_block(values);
    }
    if !tail.is_empty() {
        let mut padded = [0.0; BLOCK_VALUES];
        padded[..tail.len()].copy_from_slice(tail);
        out[whole.len()] = convert_block(&padded);
    }
}

/// 32 f32 values rounded to bfloat16 (to nearest, tiny ones to zero).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
fn convert_block(values: &[f32; BLOCK_VALUES]) -> Block {
    let (low, high) = values.split_at(BLOCK_VALUES / 2);
    // SAFETY: each load reads the 16 floats of its half of the array.
    let (low, high) = unsafe { (_mm512_loadu_ps(low.as_ptr()), _mm512_loadu_ps(high.as_ptr())) };
    // SAFETY: a vector of 32 bfloat16 is 32 u16 bit patterns; the second
    // operand's values come first.
    Block(unsafe { std::mem::transmute::<__m512bh, [u16; BLOCK_VALUES]>(_mm512_cvtne2ps_pbh(high, low)) })
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn values(block: &Block) -> __m512bh {
    // SAFETY: any 32 u16 bit patterns are a vector of 32 bfloat16.
    unsafe { std::mem::transmute::<[u16; BLOCK_VALUES], __m512bh>(block.0) }
}

/// The bfloat16 scores of `Q` queries against the `R` rows of `rows`, each
/// converted by `convert`. Registers are reused the way `kernels::tile`
/// reuses them.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512-BF16: `available` says so, and a
/// `Screen` exists only where it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
pub fn tile<const Q: usize, const R: usize>(queries: [&[Block]; Q], rows: &[Block]) -> Scores {
    let blocks = rows.len() / R;
    assert!(rows.len() == R * blocks && queries.iter().all(|q| q.len() == blocks));
    let rows: [&[Block]; R] = std::array::from_fn(|r| &rows[r * blocks..(r + 1) * blocks]);
    let mut sums = [[_mm512_setzero_ps(); R]; Q];
    for block in 0..blocks {
        let row_values: [__m512bh; R] = std::array::from_fn(|r| values(&rows[r][block]));
        for (sums, query) in sums.iter_mut().zip(&queries) {
            let query = values(&query[block]);
            for (sum, &row) in sums.iter_mut().zip(&row_values) {
                *sum = _mm512_dpbf16_ps(*sum, query, row);
            }
        }
    }
    let mut all = [_mm512_setzero_ps(); 16];
    for (all, sum) in all.iter_mut().zip(sums.iter().flatten()) {
        *all = *sum;
    }
    Scores(kernels::reduce16(all))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::store::kernels::tests::floats;
    use crate::testing;

    /// Checks, for every pair of `queries` x `rows` (multiples of 4 each),
    /// that the pass cannot rule the pair out when its query's threshold is
    /// the pair's own exact distance: so it never rules out a row that
    /// belongs. Cosine's scales and the inner product's ones both.
    /// Returns false where the CPU has no pass.
    fn assert_never_rules_out_what_belongs(queries: &[Vec<f32>], rows: &[Vec<f32>], what: &str) -> bool {
        let dims = rows[0].len();
        let query_refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
        for cosine in [true, false] {
            let scale = |v: &[f32]| if cosine { kernels::inverse_norm(v) } else { 1.0 };
            let scales: Vec<f32> = queries.iter().map(|q| scale(q)).collect();
            let squared_norms: Vec<f64> = queries.iter().map(|q| kernels::squared_norm(q)).collect();
            let Some(screen) = Screen::new(&query_refs, &squared_norms, &scales, dims) else {
                assert!(!testing::cpu_has_bf16(), "this CPU has AVX512-BF16, yet the pass was not made");
                testing::skip(&format!("the bfloat16 pass's bound, {what}"), "this CPU has no AVX512-BF16");
                return false;
            };
            let mut converted = vec![Block::default(); 4 * screen.blocks()];
            for (row_tile, rows) in rows.chunks_exact(4).enumerate() {
                for (row, blocks) in rows.iter().zip(converted.chunks_exact_mut(screen.blocks())) {
                    // SAFETY: `Screen::new` found the features.
                    unsafe { convert(row, blocks) };
                }
                let rows: &[Vec<f32>; 4] = rows.try_into().expect("4 rows");
                for first in (0..queries.len()).step_by(4) {
                    let what = format!("{what}, cosine {cosine}, rows from {}", row_tile * 4);
                    let (screen, converted) = (&screen, converted.as_slice());
                    assert_tile_keeps_each_pair_at_its_own_distance(
                        screen, cosine, first, queries, rows, converted, &what,
                    );
                }
            }
        }
        true
    }

    /// The 4 x 4 tile of queries `first..` and `rows` (`converted` to
    /// bfloat16), with cosine's scales or the inner product's: with each
    /// query's threshold set to its distance to row `r`, no pair of row `r`
    /// may be ruled out.
    fn assert_tile_keeps_each_pair_at_its_own_distance(
        screen: &Screen,
        cosine: bool,
        first: usize,
        queries: &[Vec<f32>],
        rows: &[Vec<f32>; 4],
        converted: &[Block],
        what: &str,
    ) {
        let row_scales = rows.each_ref().map(|row| if cosine { kernels::inverse_norm(row) } else { 1.0 });
        let row_norms = rows.each_ref().map(|row| norm_bound_of(kernels::squared_norm(row)));
        let exact: [[f32; 4]; 4] = std::array::from_fn(|q| {
            let dots = rows.each_ref().map(|row| kernels::dot(&queries[first + q], row));
            std::array::from_fn(|r| distance(dots[r], row_scales[r], screen.scale(first + q)))
        });
        for r in 0..4 {
            // SAFETY: the `Screen` found the features.
            let undecided = unsafe {
                let scores = tile::<4, 4>(std::array::from_fn(|q| screen.query(first + q)), converted);
                screen.undecided::<4, 4>(scores, first, &row_norms, &row_scales, exact.map(|d| d[r]))
            };
            for lane in (0..16).filter(|&lane| pair_of_lane(lane, 4).1 == r) {
                let q = pair_of_lane(lane, 4).0;
                let at = exact[q][r];
                assert!(
                    undecided & 1 << lane != 0,
                    "{what}: query {}, row +{r} ruled out at its own distance {at}",
                    first + q
                );
            }
        }
    }

    #[test]
    fn the_pass_never_rules_out_what_belongs_for_random_vectors() {
        for dims in [1, 7, 31, 32, 33, 100, 768, 1536, 4099] {
            let queries: Vec<Vec<f32>> = (0..8).map(|q| floats(q, dims)).collect();
            let rows: Vec<Vec<f32>> = (0..16).map(|r| floats(100 + r, dims)).collect();
            if !assert_never_rules_out_what_belongs(&queries, &rows, &format!("dims {dims}")) {
                return;
            }
        }
    }

    /// Values chosen to make bfloat16 lose the most: just past halfway
    /// between two bfloat16 values, all of one sign (no cancelling), tiny
    /// (flushed to zero), huge, and mixed scales in one vector.
    #[test]
    fn the_pass_never_rules_out_what_belongs_where_bfloat16_rounds_worst() {
        let halfway = f32::from_bits(0x3F80_8001); // 1 + 2^-8 + 2^-23: rounds up by nearly 2^-8
        let dims = 768;
        let shapes: Vec<Vec<f32>> = vec![
            vec![halfway; dims],
            vec![-halfway; dims],
            vec![1.0e-39; dims],
            vec![1.0e17; dims],
            (0..dims).map(|i| [halfway, 1.0e-39, -3.0e12, 7.0e-20][i % 4]).collect(),
            vec![1.0e18; dims], // past the finite norm
            floats(5, dims),
            floats(6, dims).iter().map(|x| x * 1.0e-30).collect(),
        ];
        assert_never_rules_out_what_belongs(&shapes, &shapes, "worst cases");
    }

    #[test]
    fn norm_bounds_are_upper_bounds() {
        for v in [vec![3.0, 4.0], vec![0.1; 768], floats(9, 1536), vec![0.0; 4]] {
            let exact: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
            let bound = norm_bound_of(kernels::squared_norm(&v));
            assert!(f64::from(bound) >= exact && f64::from(bound) <= exact * (1.0 + 2f64.powi(-22)), "{bound} {exact}");
        }
        assert_eq!(norm_bound_of(2f64.powi(122)), f32::INFINITY);
        assert_eq!(norm_bound_of(2f64.powi(120)), 2f32.powi(60));
    }

    #[test]
    fn the_bound_is_tight_enough_to_rule_rows_out() {
        // About 0.008 of |q||x| for 768 dimensions: cosines of random data
        // spread over about 0.036, so most rows fall far outside it.
        let bound = Bound::new(768);
        assert!(bound.relative < 0.0079 && bound.relative > 0.0078, "{}", bound.relative);
        let (slope, offset) = bound.for_query(1.0);
        assert!(slope < 0.0079 && offset < 1.0e-30);
        assert_eq!(bound.for_query(f32::INFINITY), (f32::INFINITY, f32::INFINITY));
    }
}
