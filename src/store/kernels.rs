//! Distance kernels: `wide` SIMD versions and the scalar reference they are
//! tested against.
//!
//! The SIMD kernels keep four independent 8-lane accumulators so that the
//! floating-point adds of consecutive blocks do not wait on each other; a
//! remainder shorter than 8 is summed by plain scalar code, which is cheaper
//! than building a zero-padded lane block for it.

use wide::f32x8;

const LANES: usize = 8;
const BLOCK: usize = 4 * LANES;

#[inline(always)]
fn load(chunk: &[f32]) -> f32x8 {
    let lanes: [f32; LANES] = chunk.try_into().expect("chunk of LANES floats");
    f32x8::new(lanes)
}

/// Inner product of two equally long vectors.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut acc = [f32x8::ZERO; 4];
    let blocks = a.len() / BLOCK * BLOCK;
    let (a_blocks, a_rest) = a.split_at(blocks);
    let (b_blocks, b_rest) = b.split_at(blocks);
    for (x, y) in a_blocks.chunks_exact(BLOCK).zip(b_blocks.chunks_exact(BLOCK)) {
        for (lane, sum) in acc.iter_mut().enumerate() {
            let range = lane * LANES..(lane + 1) * LANES;
            *sum = load(&x[range.clone()]).mul_add(load(&y[range]), *sum);
        }
    }
    let mut x_chunks = a_rest.chunks_exact(LANES);
    let mut y_chunks = b_rest.chunks_exact(LANES);
    for (x, y) in (&mut x_chunks).zip(&mut y_chunks) {
        acc[0] = load(x).mul_add(load(y), acc[0]);
    }
    let tail = scalar::dot(x_chunks.remainder(), y_chunks.remainder());
    ((acc[0] + acc[1]) + (acc[2] + acc[3])).reduce_add() + tail
}

/// Squared Euclidean distance of two equally long vectors.
#[inline]
pub fn l2_squared(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut acc = [f32x8::ZERO; 4];
    let blocks = a.len() / BLOCK * BLOCK;
    let (a_blocks, a_rest) = a.split_at(blocks);
    let (b_blocks, b_rest) = b.split_at(blocks);
    for (x, y) in a_blocks.chunks_exact(BLOCK).zip(b_blocks.chunks_exact(BLOCK)) {
        for (lane, sum) in acc.iter_mut().enumerate() {
            let range = lane * LANES..(lane + 1) * LANES;
            let d = load(&x[range.clone()]) - load(&y[range]);
            *sum = d.mul_add(d, *sum);
        }
    }
    let mut x_chunks = a_rest.chunks_exact(LANES);
    let mut y_chunks = b_rest.chunks_exact(LANES);
    for (x, y) in (&mut x_chunks).zip(&mut y_chunks) {
        let d = load(x) - load(y);
        acc[0] = d.mul_add(d, acc[0]);
    }
    let tail = scalar::l2_squared(x_chunks.remainder(), y_chunks.remainder());
    ((acc[0] + acc[1]) + (acc[2] + acc[3])).reduce_add() + tail
}

/// The reciprocal of a vector's Euclidean norm, computed in f64 so that the
/// cosine of a vector with itself is as close to 1 as f32 allows.
/// Returns 0 for the zero vector (which cosine indexes refuse anyway).
pub fn inverse_norm(v: &[f32]) -> f32 {
    let sum: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    if sum == 0.0 {
        0.0
    } else {
        (1.0 / sum.sqrt()) as f32
    }
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
mod tests {
    use super::*;

    /// splitmix64: a tiny deterministic generator, enough for test data.
    fn floats(seed: u64, n: usize) -> Vec<f32> {
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

    #[test]
    fn exact_small_cases() {
        assert_eq!(dot(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
        assert_eq!(l2_squared(&[1.0, 2.0, 3.0], &[4.0, 6.0, 3.0]), 25.0);
        assert_eq!(dot(&[], &[]), 0.0);
        assert_eq!(inverse_norm(&[3.0, 4.0]), 0.2);
        assert_eq!(inverse_norm(&[0.0, 0.0]), 0.0);
    }
}
