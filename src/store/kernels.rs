//! Distance kernels: `wide` SIMD versions and the scalar reference they are
//! tested against.
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
//! The lanes are 16 wide where the CPU has AVX-512 and 8 wide otherwise.

pub mod distances;

#[cfg(target_feature = "avx512f")]
pub type Lanes = wide::f32x16;
#[cfg(not(target_feature = "avx512f"))]
pub type Lanes = wide::f32x8;

/// Floats in one `Lanes`.
pub const LANES: usize = std::mem::size_of::<Lanes>() / 4;

/// How a (query, row) pair is scored: a per-lane step and its scalar form for
/// the tail shorter than `LANES`.
pub trait Measure {
    fn step(query: Lanes, row: Lanes, sum: Lanes) -> Lanes;
    fn tail(query: &[f32], row: &[f32]) -> f32;
}

/// Inner product.
pub struct Dot;

/// Squared Euclidean distance.
pub struct L2Squared;

impl Measure for Dot {
    #[inline(always)]
    fn step(query: Lanes, row: Lanes, sum: Lanes) -> Lanes {
        query.mul_add(row, sum)
    }

    #[inline(always)]
    fn tail(query: &[f32], row: &[f32]) -> f32 {
        scalar::dot(query, row)
    }
}

impl Measure for L2Squared {
    #[inline(always)]
    fn step(query: Lanes, row: Lanes, sum: Lanes) -> Lanes {
        let d = query - row;
        d.mul_add(d, sum)
    }

    #[inline(always)]
    fn tail(query: &[f32], row: &[f32]) -> f32 {
        scalar::l2_squared(query, row)
    }
}

/// Scores each of `Q` queries against each of `R` consecutive rows of
/// `rows` (which holds exactly `R` rows of the queries' length):
/// `scores[q][r]`.
#[inline(always)]
pub fn tile<M: Measure, const Q: usize, const R: usize>(queries: &[&[f32]; Q], rows: &[f32]) -> [[f32; R]; Q] {
    let dims = rows.len() / R;
    assert!(rows.len() == R * dims && queries.iter().all(|q| q.len() == dims));
    let whole = dims / LANES * LANES;
    let query_blocks: [&[[f32; LANES]]; Q] = std::array::from_fn(|q| queries[q][..whole].as_chunks().0);
    let row_blocks: [&[[f32; LANES]]; R] = std::array::from_fn(|r| rows[r * dims..r * dims + whole].as_chunks().0);
    let mut sums = [[Lanes::ZERO; R]; Q];
    for block in 0..whole / LANES {
        let row_lanes: [Lanes; R] = std::array::from_fn(|r| Lanes::new(row_blocks[r][block]));
        for (sums, query) in sums.iter_mut().zip(&query_blocks) {
            let query_lanes = Lanes::new(query[block]);
            for (sum, &row_lanes) in sums.iter_mut().zip(&row_lanes) {
                *sum = M::step(query_lanes, row_lanes, *sum);
            }
        }
    }
    let mut scores = reduce(sums);
    if whole < dims {
        for (q, scores) in scores.iter_mut().enumerate() {
            for (r, score) in scores.iter_mut().enumerate() {
                *score += M::tail(&queries[q][whole..], &rows[r * dims + whole..(r + 1) * dims]);
            }
        }
    }
    scores
}

/// Sums the lanes of each of the `Q` x `R` accumulators. Every accumulator
/// is summed in one order whatever the tile: what makes a batched score
/// bit-identical to the lone one.
#[cfg(not(target_feature = "avx512f"))]
#[inline(always)]
fn reduce<const Q: usize, const R: usize>(sums: [[Lanes; R]; Q]) -> [[f32; R]; Q] {
    sums.map(|sums| sums.map(Lanes::reduce_add))
}

/// Sums the lanes of each of the `Q` x `R` accumulators (at most 16) in
/// one tree (`reduce16`). Every accumulator is summed in one order whatever
/// the tile: what makes a batched score bit-identical to the lone one.
#[cfg(target_feature = "avx512f")]
#[inline(always)]
fn reduce<const Q: usize, const R: usize>(sums: [[Lanes; R]; Q]) -> [[f32; R]; Q] {
    let mut v = [bytemuck::cast::<Lanes, safe_arch::m512>(Lanes::ZERO).0; 16];
    for (v, sum) in v.iter_mut().zip(sums.iter().flatten()) {
        *v = bytemuck::cast::<Lanes, safe_arch::m512>(*sum).0;
    }
    // SAFETY: compiled only where the build enables avx512f (`cfg` above),
    // so the CPU that runs it has it.
    let last = unsafe { reduce16(v) };
    let lanes = bytemuck::cast::<safe_arch::m512, Lanes>(safe_arch::m512(last)).to_array();
    unpack16(lanes)
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
#[cfg(target_feature = "avx512f")]
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

/// Inner product of two equally long vectors.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    tile::<Dot, 1, 1>(&[a], b)[0][0]
}

/// Squared Euclidean distance of two equally long vectors.
#[inline]
pub fn l2_squared(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    tile::<L2Squared, 1, 1>(&[a], b)[0][0]
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

    #[test]
    fn simd_matches_scalar_for_every_length_up_to_300() {
        for n in 0..300 {
            let a = floats(n as u64, n);
            let b = floats(1000 + n as u64, n);
            let magnitude = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum::<f32>();
            assert!(close(dot(&a, &b), scalar::dot(&a, &b), magnitude), "dot n={n}");
            let magnitude = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>();
            assert!(close(l2_squared(&a, &b), scalar::l2_squared(&a, &b), magnitude), "l2 n={n}");
        }
    }

    #[test]
    fn simd_matches_scalar_for_large_dims() {
        for n in [768, 1536, 4099] {
            let a = floats(7, n);
            let b = floats(8, n);
            let magnitude = n as f32;
            assert!(close(dot(&a, &b), scalar::dot(&a, &b), magnitude));
            assert!(close(l2_squared(&a, &b), scalar::l2_squared(&a, &b), magnitude));
        }
    }

    /// Scores every pair of `queries` x `rows` through a `Q` x `R` tile and
    /// checks each against the same pair scored alone, bit for bit.
    fn tile_matches_pairs<const Q: usize, const R: usize>(queries: &[Vec<f32>], rows: &[f32]) {
        let dims = queries[0].len();
        let queries: [&[f32]; Q] = std::array::from_fn(|q| queries[q].as_slice());
        let dots = tile::<Dot, Q, R>(&queries, rows);
        let l2s = tile::<L2Squared, Q, R>(&queries, rows);
        for q in 0..Q {
            for r in 0..R {
                let row = &rows[r * dims..(r + 1) * dims];
                assert_eq!(dots[q][r].to_bits(), dot(queries[q], row).to_bits(), "dot {Q}x{R} dims {dims}");
                assert_eq!(l2s[q][r].to_bits(), l2_squared(queries[q], row).to_bits(), "l2 {Q}x{R} dims {dims}");
            }
        }
    }

    #[test]
    fn every_tile_shape_scores_exactly_as_pairs_do() {
        for dims in [1, 7, 8, 15, 16, 17, 33, 128, 300, 768] {
            let queries: Vec<Vec<f32>> = (0..4).map(|q| floats(50 + q, dims)).collect();
            let rows = floats(99, 8 * dims);
            tile_matches_pairs::<1, 1>(&queries, &rows[..dims]);
            tile_matches_pairs::<1, 8>(&queries, &rows);
            tile_matches_pairs::<2, 3>(&queries, &rows[..3 * dims]);
            tile_matches_pairs::<3, 3>(&queries, &rows[..3 * dims]);
            tile_matches_pairs::<4, 3>(&queries, &rows[..3 * dims]);
            tile_matches_pairs::<4, 1>(&queries, &rows[..dims]);
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
