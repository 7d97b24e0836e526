//! `wide`'s lanes for the kernels that score one (query, row) pair at a
//! time: the distances beyond cosine, ip and l2 (`metric::l1`, `linf`,
//! `lp`, `canberra`, `bray_curtis`, `jensen_shannon`). Each scores a pair by
//! one function, whether the search is lone, batched or filtered: the same
//! lanes in the same order, so every path finds the same bits.
//!
//! These kernels are not chosen at run time (`cpu`): the build's lanes are
//! exact to each metric's own bound on every CPU.
//!
//! ## The numeric domain
//! Every vector's Euclidean norm is at most 2^62, so each value and each
//! |x−q| is at most 2^63, and |x|+|q| too; a sum of 2^16 of them is at most
//! 2^79. None of `l1`, `linf`, `canberra` (each term at most 1) or `bc`
//! can overflow; `lp` and `js` say in their own files how they stay in
//! range.

/// `wide`'s lanes as the build compiles them.
#[cfg(target_feature = "avx512f")]
pub type Lanes = wide::f32x16;
#[cfg(not(target_feature = "avx512f"))]
pub type Lanes = wide::f32x8;

/// Floats in one `Lanes`.
pub const LANES: usize = std::mem::size_of::<Lanes>() / 4;

/// Walks a (query, row) pair a block of lanes at a time, folding each block
/// into `acc`; returns it and the tails shorter than a block.
#[inline(always)]
pub fn fold<'a, A>(
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

/// What a computation written once runs on: lanes, or one value (a tail's).
pub trait Value: Copy + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> {
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

/// What the pairwise distances' tests share: the pairs they are tried on,
/// and how near their f64 definitions they must come.
#[cfg(test)]
pub mod tests {
    use crate::store::kernels::tests::floats;

    /// A pair as f64 values, for the definitions as written.
    pub fn wide<'a>(q: &'a [f32], r: &'a [f32]) -> impl Iterator<Item = (f64, f64)> + 'a {
        q.iter().zip(r).map(|(&q, &r)| (f64::from(q), f64::from(r)))
    }

    /// The largest |x−q| of a pair, in f64.
    pub fn largest(q: &[f32], r: &[f32]) -> f64 {
        wide(q, r).map(|(q, r)| (q - r).abs()).fold(0.0, f64::max)
    }

    /// Pairs of every length 0..=70 and 768, 1536, values of both signs, at
    /// scales from 2^-60 to 2^55 (inside the numeric domain: norm at most
    /// 2^62).
    pub fn pairs() -> impl Iterator<Item = (usize, Vec<f32>, Vec<f32>)> {
        let scales = [(1u64, 1.0f32), (2, 2f32.powi(55)), (3, 2f32.powi(-60)), (4, 3.0e-3)];
        (0..=70).chain([768, 1536]).flat_map(move |dims| {
            scales.into_iter().map(move |(seed, scale)| {
                let scale = scale / (dims.max(1) as f32).sqrt();
                let q: Vec<f32> = floats(seed, dims).iter().map(|x| x * scale).collect();
                let r: Vec<f32> = floats(seed + 100, dims).iter().map(|x| x * scale).collect();
                (dims, q, r)
            })
        })
    }

    /// Whether `got` is `want` to within f32's rounding of a sum of `dims`
    /// terms, each off by a few units in the last place of `scale`.
    pub fn close(got: f32, want: f64, scale: f64, dims: usize) -> bool {
        (f64::from(got) - want).abs() <= 8.0 * f64::from(f32::EPSILON) * scale * (dims as f64).sqrt().max(1.0)
    }
}
