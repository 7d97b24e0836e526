//! Distance kernels: SIMD versions for each instruction set, and the scalar
//! reference they are tested against.
//!
//! Everything is built on one register-tiled kernel, `tile`, which scores
//! `Q` queries against `R` rows at once: each block of lanes of a row is
//! loaded once for all `Q` queries, and each block of a query once for all
//! `R` rows, the way a GEMM micro-kernel reuses its registers. Every
//! (query, row) pair is summed in the same order whatever the tile's shape
//! (one accumulator of lanes, block after block, reduced, then the scalar
//! tail added), so a search batched with others finds exactly the scores it
//! would find alone.
//!
//! `tile` is written once over [`Lanes`], a vector of one instruction set:
//! AVX-512's 16 lanes, AVX2's 8 with fused multiply-adds, or `wide`'s 8 as
//! the build's baseline compiles them (SSE2 on any x86-64). Which one runs
//! is chosen once per process, at start (`cpu`), not when the binary was
//! built, and the entry points here (`dot`, `l2_squared`, and the scans of
//! `scan`) call the kernels compiled for it.

pub mod lanes;

use super::cpu::{self, F32};

/// The f32 kernels' error model, on which every first pass's proof rests
/// (`screen`, `codes`, `codes::floors`): a sum of `n` terms as `tile` and
/// the pairwise distances (`metric`) compute it is within `relative_error(n)` of the sum of the
/// terms' magnitudes of the exact sum. Each term passes through at most
/// `m = n / 4 + 64` roundings, each off by at most 2^-24 of the partial
/// sum: two per 8 values in lanes of at least 8 where the build has no
/// fused multiply-add, a reduction tree of at most 4 levels, a tail of at
/// most 15, and the term's own. So the error is at most
/// `g = m 2^-24 / (1 - m 2^-24)` of the magnitudes. Results among f32's
/// subnormals add an absolute part, which each proof states for its sums.
pub fn relative_error(dims: usize) -> f64 {
    let m = (dims / 4 + 64) as f64 * 2f64.powi(-24);
    m / (1.0 - m)
}

/// What a first pass's bound, evaluated in f64, adds to cover its own
/// arithmetic: each step is off by at most a few 2^-53 of the magnitudes
/// it sums, and 2^-40 of those covers every step of a bound.
pub const BOUND_SURPLUS: f64 = 1.0 / (1u64 << 40) as f64;

/// The least f32 not below `x`, infinite above f32's range: a bound
/// computed in f64, kept in f32 without lowering it.
pub fn f32_at_least(x: f64) -> f32 {
    let y = x as f32;
    if f64::from(y) < x {
        y.next_up()
    } else {
        y
    }
}

/// A vector of `N` f32 lanes of one instruction set.
///
/// # Safety
/// Every method may use the instruction set's instructions: call them only
/// where the CPU has them (`cpu::paths` says which path the process takes,
/// and only that path's lanes are used).
pub unsafe trait Lanes<const N: usize>: Copy {
    /// # Safety
    /// The CPU must have this type's instructions.
    unsafe fn zero() -> Self;
    /// # Safety
    /// The CPU must have this type's instructions.
    unsafe fn load(values: &[f32; N]) -> Self;
    /// `self * b + c`, fused where the instruction set has it.
    ///
    /// # Safety
    /// The CPU must have this type's instructions.
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    /// # Safety
    /// The CPU must have this type's instructions.
    unsafe fn sub(self, b: Self) -> Self;
    /// The lanes of each of the `Q` x `R` accumulators summed, each in one
    /// order whatever `Q` and `R`: what makes a batched score bit-identical
    /// to the lone one.
    ///
    /// # Safety
    /// The CPU must have this type's instructions.
    unsafe fn reduce<const Q: usize, const R: usize>(sums: [[Self; R]; Q]) -> [[f32; R]; Q];
}

/// `wide`'s 8 lanes, as the build's target compiles them: the path every
/// CPU of the target can take.
pub type Baseline = wide::f32x8;

// SAFETY: `wide` uses only what the build's target guarantees.
unsafe impl Lanes<8> for Baseline {
    #[inline(always)]
    unsafe fn zero() -> Self {
        Baseline::ZERO
    }
    #[inline(always)]
    unsafe fn load(values: &[f32; 8]) -> Self {
        Baseline::new(*values)
    }
    #[inline(always)]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        wide::f32x8::mul_add(self, b, c)
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        self - b
    }
    #[inline(always)]
    unsafe fn reduce<const Q: usize, const R: usize>(sums: [[Self; R]; Q]) -> [[f32; R]; Q] {
        sums.map(|sums| sums.map(Baseline::reduce_add))
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

/// How a (query, row) pair is scored: a per-lane step and its scalar form for
/// the tail shorter than the lanes.
pub trait Measure {
    /// # Safety
    /// The CPU must have `L`'s instructions.
    unsafe fn step<L: Lanes<N>, const N: usize>(query: L, row: L, sum: L) -> L;
    fn tail(query: &[f32], row: &[f32]) -> f32;
}

/// Inner product.
pub struct Dot;

/// Squared Euclidean distance.
pub struct L2Squared;

impl Measure for Dot {
    #[inline(always)]
    unsafe fn step<L: Lanes<N>, const N: usize>(query: L, row: L, sum: L) -> L {
        // SAFETY: the caller's promise.
        unsafe { query.mul_add(row, sum) }
    }

    #[inline(always)]
    fn tail(query: &[f32], row: &[f32]) -> f32 {
        scalar::dot(query, row)
    }
}

impl Measure for L2Squared {
    #[inline(always)]
    unsafe fn step<L: Lanes<N>, const N: usize>(query: L, row: L, sum: L) -> L {
        // SAFETY: the caller's promise.
        unsafe {
            let d = query.sub(row);
            d.mul_add(d, sum)
        }
    }

    #[inline(always)]
    fn tail(query: &[f32], row: &[f32]) -> f32 {
        scalar::l2_squared(query, row)
    }
}

/// Scores each of `Q` queries against each of `R` consecutive rows of
/// `rows` (which holds exactly `R` rows of the queries' length) with the
/// lanes `L`: `scores[q][r]`.
///
/// # Safety
/// The CPU must have `L`'s instructions.
#[inline(always)]
pub unsafe fn tile<L: Lanes<N>, const N: usize, M: Measure, const Q: usize, const R: usize>(
    queries: &[&[f32]; Q],
    rows: &[f32],
) -> [[f32; R]; Q] {
    let dims = rows.len() / R;
    assert!(rows.len() == R * dims && queries.iter().all(|q| q.len() == dims));
    let whole = dims / N * N;
    let query_blocks: [&[[f32; N]]; Q] = std::array::from_fn(|q| queries[q][..whole].as_chunks().0);
    let row_blocks: [&[[f32; N]]; R] = std::array::from_fn(|r| rows[r * dims..r * dims + whole].as_chunks().0);
    // SAFETY: the caller's promise, for every use of `L` below.
    let mut sums = [[unsafe { L::zero() }; R]; Q];
    for block in 0..whole / N {
        // SAFETY: as above.
        let row_lanes: [L; R] = std::array::from_fn(|r| unsafe { L::load(&row_blocks[r][block]) });
        for (sums, query) in sums.iter_mut().zip(&query_blocks) {
            // SAFETY: as above.
            let query_lanes = unsafe { L::load(&query[block]) };
            for (sum, &row_lanes) in sums.iter_mut().zip(&row_lanes) {
                // SAFETY: as above.
                *sum = unsafe { M::step(query_lanes, row_lanes, *sum) };
            }
        }
    }
    // SAFETY: as above.
    let mut scores = unsafe { L::reduce(sums) };
    if whole < dims {
        for (q, scores) in scores.iter_mut().enumerate() {
            for (r, score) in scores.iter_mut().enumerate() {
                *score += M::tail(&queries[q][whole..], &rows[r * dims + whole..(r + 1) * dims]);
            }
        }
    }
    scores
}

/// `tile` with the lanes of the process's path (`cpu::paths`): what every
/// search of the process scores with.
#[inline]
pub fn tile_here<M: Measure, const Q: usize, const R: usize>(queries: &[&[f32]; Q], rows: &[f32]) -> [[f32; R]; Q] {
    // SAFETY: `cpu::Paths` are only made where the CPU has them (`choose`).
    unsafe { tile_on::<M, Q, R>(cpu::paths().f32(), queries, rows) }
}

/// `tile` with the lanes of `path`.
///
/// # Safety
/// The CPU must have `path`'s instructions (`F32::available`).
#[inline]
pub unsafe fn tile_on<M: Measure, const Q: usize, const R: usize>(
    path: F32,
    queries: &[&[f32]; Q],
    rows: &[f32],
) -> [[f32; R]; Q] {
    match path {
        // SAFETY: the caller's promise.
        #[cfg(target_arch = "x86_64")]
        F32::Avx512 => unsafe { x86::tile_avx512::<M, Q, R>(queries, rows) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        F32::Avx2 => unsafe { x86::tile_avx2::<M, Q, R>(queries, rows) },
        // SAFETY: the baseline is the build's own target.
        _ => unsafe { tile::<Baseline, 8, M, Q, R>(queries, rows) },
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{tile, Lanes, Measure};

    /// AVX-512F's 16 lanes.
    #[derive(Clone, Copy, Debug)]
    pub struct Avx512(__m512);

    /// AVX2's 8 lanes, with FMA's fused multiply-adds.
    #[derive(Clone, Copy, Debug)]
    pub struct Avx2(__m256);

    // SAFETY: every method is used only where the CPU has AVX-512F (the
    // trait's contract).
    unsafe impl Lanes<16> for Avx512 {
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx512(_mm512_setzero_ps())
        }
        #[inline(always)]
        unsafe fn load(values: &[f32; 16]) -> Self {
            // SAFETY: 16 floats are there to read.
            Avx512(unsafe { _mm512_loadu_ps(values.as_ptr()) })
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            Avx512(_mm512_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            Avx512(_mm512_sub_ps(self.0, b.0))
        }
        /// All `Q` x `R` accumulators (at most 16) in one tree (`reduce16`).
        #[inline(always)]
        unsafe fn reduce<const Q: usize, const R: usize>(sums: [[Self; R]; Q]) -> [[f32; R]; Q] {
            let mut v = [_mm512_setzero_ps(); 16];
            for (v, sum) in v.iter_mut().zip(sums.iter().flatten()) {
                *v = sum.0;
            }
            // SAFETY: the trait's contract: the CPU has AVX-512F.
            let last = unsafe { super::reduce16(v) };
            // SAFETY: a vector of 16 f32 is 16 f32.
            let lanes = unsafe { std::mem::transmute::<__m512, [f32; 16]>(last) };
            super::unpack16(lanes)
        }
    }

    // SAFETY: every method is used only where the CPU has AVX2 and FMA (the
    // trait's contract).
    unsafe impl Lanes<8> for Avx2 {
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx2(_mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn load(values: &[f32; 8]) -> Self {
            // SAFETY: 8 floats are there to read.
            Avx2(unsafe { _mm256_loadu_ps(values.as_ptr()) })
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            Avx2(_mm256_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            Avx2(_mm256_sub_ps(self.0, b.0))
        }
        /// Each accumulator alone: lane `i` with `i + 4`, then with `i + 2`,
        /// then 0 with 1.
        #[inline(always)]
        unsafe fn reduce<const Q: usize, const R: usize>(sums: [[Self; R]; Q]) -> [[f32; R]; Q] {
            let mut out = [[0.0; R]; Q];
            for (out, sums) in out.iter_mut().zip(sums) {
                for (out, sum) in out.iter_mut().zip(sums) {
                    let v = _mm_add_ps(_mm256_castps256_ps128(sum.0), _mm256_extractf128_ps::<1>(sum.0));
                    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                    *out = _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps::<0b01>(v, v)));
                }
            }
            out
        }
    }

    /// `tile` in AVX-512's lanes.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_avx512<M: Measure, const Q: usize, const R: usize>(
        queries: &[&[f32]; Q],
        rows: &[f32],
    ) -> [[f32; R]; Q] {
        // SAFETY: the caller's promise.
        unsafe { tile::<Avx512, 16, M, Q, R>(queries, rows) }
    }

    /// `tile` in AVX2's lanes.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_avx2<M: Measure, const Q: usize, const R: usize>(
        queries: &[&[f32]; Q],
        rows: &[f32],
    ) -> [[f32; R]; Q] {
        // SAFETY: the caller's promise.
        unsafe { tile::<Avx2, 8, M, Q, R>(queries, rows) }
    }
}

/// Sums the lanes of each of 16 accumulators, all in one tree, as a 16 x 16
/// transpose does: each step halves the lanes every accumulator spans and
/// packs two vectors into one, so that the accumulators share every shuffle
/// and add (45 instructions for 16, against 8 each alone). Each is summed in
/// one order (lane `i` with `i + 8`, then with `i + 4`, `i + 2` and `i + 1`).
/// Accumulator `a` ends in lane `transposed(a)`.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub fn reduce16(v: [std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::{
        __m512, _mm512_add_ps, _mm512_castpd_ps, _mm512_castps_pd, _mm512_shuffle_f32x4, _mm512_shuffle_ps,
        _mm512_unpackhi_pd, _mm512_unpacklo_pd,
    };
    // 16 lanes -> 8: vector j holds accumulators 2j and 2j + 1, 8 lanes each.
    let halves =
        |x: __m512, y: __m512| _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y));
    let v: [__m512; 8] = std::array::from_fn(|j| halves(v[2 * j], v[2 * j + 1]));
    // 8 -> 4: vector k holds accumulator 4k + b in its 128-bit block b.
    let quarters =
        |x: __m512, y: __m512| _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y));
    let v: [__m512; 4] = std::array::from_fn(|k| quarters(v[2 * k], v[2 * k + 1]));
    // 4 -> 2: vector m holds accumulators 8m + b and 8m + 4 + b in block b.
    let pairs = |x: __m512, y: __m512| {
        let (x, y) = (_mm512_castps_pd(x), _mm512_castps_pd(y));
        _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)))
    };
    let v: [__m512; 2] = std::array::from_fn(|m| pairs(v[2 * m], v[2 * m + 1]));
    // 2 -> 1: lane 4b + c holds accumulator 4c + b.
    _mm512_add_ps(_mm512_shuffle_ps::<0x88>(v[0], v[1]), _mm512_shuffle_ps::<0xDD>(v[0], v[1]))
}

/// Where `reduce16` leaves accumulator `i`: the lanes hold the sums as a
/// 4 x 4 transpose, so this also gives the accumulator of lane `i`.
pub const fn transposed(i: usize) -> usize {
    i % 4 * 4 + i / 4
}

/// The `Q` x `R` sums that `reduce16` leaves in its lanes, accumulator
/// `q * R + r` as `[q][r]`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn unpack16<const Q: usize, const R: usize>(lanes: [f32; 16]) -> [[f32; R]; Q] {
    const { assert!(Q * R <= 16, "a tile of at most 16 accumulators") };
    std::array::from_fn(|q| std::array::from_fn(|r| lanes[transposed(q * R + r)]))
}

/// Floats in one cache line.
pub const LINE_FLOATS: usize = 16;

/// Asks the CPU to bring `floats` into its L2 cache ahead of use, one
/// prefetch per cache line, without waiting for them.
#[inline(always)]
pub fn prefetch(floats: &[f32]) {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    for line in floats.iter().step_by(LINE_FLOATS) {
        safe_arch::prefetch_t1(line);
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
    let _ = floats;
}

/// Inner product of two equally long vectors, as the process's path
/// computes it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    tile_here::<Dot, 1, 1>(&[a], b)[0][0]
}

/// Squared Euclidean distance of two equally long vectors, as the process's
/// path computes it.
#[inline]
pub fn l2_squared(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    tile_here::<L2Squared, 1, 1>(&[a], b)[0][0]
}

/// The sum of a vector's squares, in f64: each square is exact, the sum
/// off by at most `dims` x 2^-53 of itself (under 2^-33 for the dimensions
/// an index allows), and it cannot overflow (f32's largest square is 2^256).
pub fn squared_norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}

/// The reciprocal of a vector's Euclidean norm, computed in f64 so that the
/// cosine of a vector with itself is as close to 1 as f32 allows.
/// Returns 0 for the zero vector (which cosine indexes refuse anyway).
pub fn inverse_norm(v: &[f32]) -> f32 {
    inverse_norm_of(squared_norm(v))
}

/// `inverse_norm` from the vector's `squared_norm`.
pub fn inverse_norm_of(squared: f64) -> f32 {
    if squared == 0.0 {
        0.0
    } else {
        (1.0 / squared.sqrt()) as f32
    }
}

/// Scales `v`, whose `squared_norm` is `squared`, by the power of two that
/// brings its Euclidean norm into [1, 2); leaves a zero vector as it is.
/// Exact for every value that stays a normal f32 (a value below 2^-126 of
/// the new norm rounds to f32's subnormals, off by at most 2^-150). Returns
/// the power of two `v` was divided by (1 for a zero vector).
pub fn scale_to_unit_norm(v: &mut [f32], squared: f64) -> f64 {
    if squared == 0.0 {
        return 1.0;
    }
    // The norm's binary exponent; the norm is a normal f64 (at least the
    // smallest f32, 2^-149).
    let exponent = ((squared.sqrt().to_bits() >> 52) & 0x7FF) as i64 - 1023;
    let factor = f64::from_bits(((1023 - exponent) as u64) << 52);
    for x in v {
        *x = (f64::from(*x) * factor) as f32;
    }
    1.0 / factor
}

/// Plain loops, one element at a time: the reference the SIMD kernels must agree with.
pub mod scalar {
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    pub fn l2_squared(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// splitmix64, as floats in [-1, 1): a tiny deterministic generator,
    /// enough for test data.
    pub(crate) fn floats(seed: u64, n: usize) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn close(simd: f32, reference: f32, magnitude: f32) -> bool {
        (simd - reference).abs() <= 1e-5 * magnitude.max(1.0)
    }

    /// The paths this CPU has; a skip, recorded, for each it has not.
    pub(crate) fn paths_here(what: &str) -> Vec<F32> {
        crate::testing::on_this_cpu(&[F32::Avx512, F32::Avx2, F32::Baseline], what, F32::name, F32::available)
    }

    /// The error model the first passes' proofs rest on
    /// (`relative_error`): every path's dot products and squared distances
    /// stay within it, at lengths on either side of every lane, block and
    /// tail size, on random values and on sums that nearly cancel.
    #[test]
    fn every_path_stays_within_the_error_model() {
        for path in paths_here("the error model") {
            for n in [1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 255, 768, 1000, 4099] {
                for seed in 0..6u64 {
                    let q = floats(seed, n);
                    let mut x = floats(seed + 1000, n);
                    if seed % 2 == 1 {
                        // Pairs of terms that cancel but for a little.
                        for i in (1..n).step_by(2) {
                            x[i] = -x[i - 1] * q[i - 1] / q[i] * (1.0 + 2f32.powi(-12));
                        }
                    }
                    let subnormals = (2 * n + 64) as f64 * 2f64.powi(-149);
                    let (q64, x64) = (q.iter().map(|&v| f64::from(v)), x.iter().map(|&v| f64::from(v)));
                    let products: Vec<f64> = q64.clone().zip(x64.clone()).map(|(a, b)| a * b).collect();
                    let squares: Vec<f64> = q64.zip(x64).map(|(a, b)| (a - b) * (a - b)).collect();
                    // SAFETY: `paths_here` keeps the paths this CPU has.
                    let (dot, l2) = unsafe {
                        (tile_on::<Dot, 1, 1>(path, &[&q], &x)[0][0], tile_on::<L2Squared, 1, 1>(path, &[&q], &x)[0][0])
                    };
                    for (what, got, terms) in [("dot", dot, &products), ("l2", l2, &squares)] {
                        let exact: f64 = terms.iter().sum();
                        let magnitudes: f64 = terms.iter().map(|t| t.abs()).sum();
                        // The squares' differences round once more each (the module doc of `codes`).
                        let model = relative_error(n) + 3.0 * 2f64.powi(-24);
                        let off = (f64::from(got) - exact).abs();
                        assert!(
                            off <= model * magnitudes + subnormals,
                            "{}: {what} of {n}, seed {seed}: off by {off:e} of {magnitudes:e}",
                            path.name()
                        );
                    }
                }
            }
        }
    }

    /// Scores every pair of `queries` x `rows` through a `Q` x `R` tile on
    /// `path` and checks each against the same pair scored alone, bit for
    /// bit, and against the scalar reference.
    fn tile_matches_pairs<const Q: usize, const R: usize>(path: F32, queries: &[Vec<f32>], rows: &[f32]) {
        let dims = queries[0].len();
        let queries: [&[f32]; Q] = std::array::from_fn(|q| queries[q].as_slice());
        // SAFETY: `paths_here` gives only paths this CPU has.
        let (dots, l2s) =
            unsafe { (tile_on::<Dot, Q, R>(path, &queries, rows), tile_on::<L2Squared, Q, R>(path, &queries, rows)) };
        for q in 0..Q {
            for r in 0..R {
                let row = &rows[r * dims..(r + 1) * dims];
                // SAFETY: as above.
                let (dot, l2) = unsafe {
                    let dot = tile_on::<Dot, 1, 1>(path, &[queries[q]], row)[0][0];
                    (dot, tile_on::<L2Squared, 1, 1>(path, &[queries[q]], row)[0][0])
                };
                let what = format!("{} {Q}x{R} dims {dims}", path.name());
                assert_eq!(dots[q][r].to_bits(), dot.to_bits(), "dot {what}");
                assert_eq!(l2s[q][r].to_bits(), l2.to_bits(), "l2 {what}");
                let magnitude = queries[q].iter().zip(row).map(|(x, y)| (x * y).abs()).sum::<f32>();
                assert!(close(dot, scalar::dot(queries[q], row), magnitude), "dot {what}");
                let magnitude = scalar::l2_squared(queries[q], row);
                assert!(close(l2, magnitude, magnitude), "l2 {what}");
            }
        }
    }

    #[test]
    fn every_tile_shape_scores_exactly_as_pairs_do_on_every_path() {
        for path in paths_here("tiles against pairs") {
            for dims in [1, 7, 8, 15, 16, 17, 33, 128, 300, 768] {
                let queries: Vec<Vec<f32>> = (0..4).map(|q| floats(50 + q, dims)).collect();
                let rows = floats(99, 8 * dims);
                tile_matches_pairs::<1, 1>(path, &queries, &rows[..dims]);
                tile_matches_pairs::<1, 8>(path, &queries, &rows);
                tile_matches_pairs::<2, 3>(path, &queries, &rows[..3 * dims]);
                tile_matches_pairs::<3, 3>(path, &queries, &rows[..3 * dims]);
                tile_matches_pairs::<4, 3>(path, &queries, &rows[..3 * dims]);
                tile_matches_pairs::<4, 4>(path, &queries, &rows[..4 * dims]);
                tile_matches_pairs::<4, 1>(path, &queries, &rows[..dims]);
            }
        }
    }

    #[test]
    fn every_path_matches_the_scalar_reference_for_every_length_up_to_300_and_large_dims() {
        for path in paths_here("the scalar reference") {
            for n in (0..300).chain([768, 1536, 4099]) {
                let queries = vec![floats(n as u64, n)];
                let rows = floats(1000 + n as u64, n);
                if n > 0 {
                    tile_matches_pairs::<1, 1>(path, &queries, &rows);
                }
            }
        }
    }

    #[test]
    fn exact_small_cases() {
        assert_eq!(dot(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
        assert_eq!(l2_squared(&[1.0, 2.0, 3.0], &[4.0, 6.0, 3.0]), 25.0);
        assert_eq!(dot(&[], &[]), 0.0);
        assert_eq!(inverse_norm(&[3.0, 4.0]), 0.2);
        assert_eq!(inverse_norm(&[0.0, 0.0]), 0.0);
    }
}
