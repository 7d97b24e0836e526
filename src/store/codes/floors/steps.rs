//! Steps: the first pass of l1, linf and Bray-Curtis, from the integer
//! distances between a row's codes and the query's (`D`, `M`, `P`: the
//! parent module's doc derives the bounds from them).
//!
//! The f32 kernels (`metric::l1`, `linf`, `bray_curtis`) add non-negative terms,
//! each off by at most 2^-24 of itself; among f32's subnormals those sums and
//! differences are exact. So by the kernels' error model their l1 and each
//! of Bray-Curtis's sums are within `g = kernels::relative_error(n)` of the
//! exact ones (at most `m = n / 4 + 64` roundings per term, argued there),
//! linf within 2^-24, and Bray-Curtis's quotient adds one rounding of 2^-24.

#[cfg(test)]
use super::Floor;
use super::Grids;
use crate::store::codes::{Codes, Int8, Kernel, BLOCK};
use crate::store::kernels::BOUND_SURPLUS;

/// `Floor` as the kernels' compile-time parameter.
const L1: u8 = 0;
const LINF: u8 = 1;
const BRAY_CURTIS: u8 = 2;

/// Which distance of the steps (`Floor::Steps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    L1,
    Linf,
    BrayCurtis,
}

impl Grids {
    /// The nearest each of `R` rows (of the scales in `slots`) can be in
    /// `step`'s distance.
    #[inline(always)]
    pub(super) fn step_floors<const R: usize>(
        &self,
        step: Step,
        kernel: Kernel,
        codes: &Codes,
        (rows, slots): ([usize; R], [usize; R]),
    ) -> [f64; R] {
        let (spans, plus) = self.spans(step, kernel, codes, rows, slots);
        // A loop, not `array::from_fn`, which with this body inside was
        // not inlined: a fifth of a lone linf search's time.
        let mut nearest_rows = [0.0; R];
        for (r, nearest_row) in nearest_rows.iter_mut().enumerate() {
            let (_, residual) = codes.scale_and_residual(rows[r]);
            *nearest_row = nearest(step, self.relative, self.sides[slots[r]], f64::from(residual), (spans[r], plus[r]));
        }
        nearest_rows
    }

    /// `spans` of `rows` against the query's codes in `slots`.
    #[inline(always)]
    pub(super) fn spans<const R: usize>(
        &self,
        step: Step,
        kernel: Kernel,
        codes: &Codes,
        rows: [usize; R],
        slots: [usize; R],
    ) -> ([u32; R], [u32; R]) {
        let (bytes, stride) = (codes.bytes(), self.stride);
        let starts = rows.map(|row| row * stride);
        assert!(starts.iter().all(|&start| start + stride <= bytes.len()) && stride.is_multiple_of(BLOCK));
        let queries = slots.map(|slot| self.query_at(slot));
        match step {
            Step::L1 => spans(kernel, L1, bytes, starts, queries, stride),
            Step::Linf => spans(kernel, LINF, bytes, starts, queries, stride),
            Step::BrayCurtis => spans(kernel, BRAY_CURTIS, bytes, starts, queries, stride),
        }
    }
}

/// The nearest a row can be in `step`'s distance (the parent module's
/// doc), with `relative` the kernels' `g`, from its scale's side
/// `(a, F, G)`, its residual bound `E`, its codes' `D` or `M`, and `P`.
#[inline(always)]
fn nearest(
    step: Step,
    relative: f64,
    (a, near, outer): (f64, f64, f64),
    residual: f64,
    (span, plus): (u32, u32),
) -> f64 {
    let (span, plus) = (a * f64::from(span), a * f64::from(plus));
    let apart = span - residual - near;
    let apart = apart - BOUND_SURPLUS * (span + residual + near.abs());
    match step {
        Step::L1 => apart * (1.0 - relative),
        Step::Linf => (span - a) * (1.0 - 2f64.powi(-23)),
        Step::BrayCurtis if apart <= 0.0 => 0.0,
        Step::BrayCurtis => {
            let sums = (plus + residual + outer) * (1.0 + BOUND_SURPLUS);
            apart / sums * (1.0 - relative) / (1.0 + relative) * (1.0 - 2f64.powi(-23))
        }
    }
}

#[cfg(test)]
impl Grids {
    /// `spans` of row `row` with `kernel`.
    pub fn spans_of(&self, kernel: Kernel, codes: &Codes, row: usize) -> (u32, u32) {
        let Floor::Steps(step) = self.floor else {
            panic!("the steps of a floor of steps");
        };
        let ([span], [plus]) = self.spans(step, kernel, codes, [row], [self.slot_of(codes, row)]);
        (span, plus)
    }
}

/// Each row's `D` (l1, Bray-Curtis) or `M` (linf), and `P` (Bray-Curtis,
/// else 0), of the stored codes at `starts` in `bytes` against `queries`
/// (a query code each, with its negation after `stride` bytes for
/// Bray-Curtis), over `stride` bytes.
#[inline(always)]
fn spans<const R: usize>(
    kernel: Kernel,
    what: u8,
    bytes: &[u8],
    starts: [usize; R],
    queries: [&[u8]; R],
    stride: usize,
) -> ([u32; R], [u32; R]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a `Kernel` exists only where the CPU has its instructions
    // (`Kernel::on_this_cpu`), and every kernel's features
    // include AVX2 (AVX-512 VNNI's include AVX-512BW); the loads stay inside
    // `bytes` (asserted by the caller) and the query codes (sliced).
    unsafe {
        match (kernel.isa(), what) {
            (Int8::Vnni512, L1) => x86::spans_avx512::<L1, R>(bytes, starts, queries, stride),
            (Int8::Vnni512, LINF) => x86::spans_avx512::<LINF, R>(bytes, starts, queries, stride),
            (Int8::Vnni512, _) => x86::spans_avx512::<BRAY_CURTIS, R>(bytes, starts, queries, stride),
            (_, L1) => x86::spans_avx2::<L1, R>(bytes, starts, queries, stride),
            (_, LINF) => x86::spans_avx2::<LINF, R>(bytes, starts, queries, stride),
            _ => x86::spans_avx2::<BRAY_CURTIS, R>(bytes, starts, queries, stride),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, what, bytes, starts, queries, stride);
        unreachable!("no kernel is available off x86-64")
    }
}

/// `D`, `M` and `P` of a query's codes and a row's, one value at a time:
/// the reference the kernels must agree with.
#[cfg(test)]
pub fn spans_scalar(query: &[i8], row: impl Iterator<Item = i8>) -> (u32, u32, u32) {
    query.iter().zip(row).fold((0, 0, 0), |(d, m, p), (&q, c)| {
        let (q, c) = (i32::from(q), i32::from(c));
        (d + (c - q).unsigned_abs(), m.max((c - q).unsigned_abs()), p + (c + q).unsigned_abs())
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BRAY_CURTIS, LINF};
    use crate::store::codes::x86::sum_of;

    /// `spans` on 64-byte blocks, and a last one of 32, with AVX-512BW.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BW; `bytes` must hold `stride` bytes
    /// from each start, and each query `stride` (twice that for
    /// Bray-Curtis); `stride` a multiple of 32.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn spans_avx512<const WHAT: u8, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> ([u32; R], [u32; R]) {
        let (mut wide, mut plus_wide) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe {
                    (
                        _mm512_loadu_si512(bytes.as_ptr().add(starts[r] + at).cast()),
                        _mm512_loadu_si512(queries[r].as_ptr().add(at).cast()),
                    )
                };
                wide[r] = if WHAT == LINF {
                    _mm512_max_epu8(wide[r], _mm512_or_si512(_mm512_subs_epu8(x, q), _mm512_subs_epu8(q, x)))
                } else {
                    _mm512_add_epi64(wide[r], _mm512_sad_epu8(x, q))
                };
                if WHAT == BRAY_CURTIS {
                    // SAFETY: in bounds, as the caller promises.
                    let n = unsafe { _mm512_loadu_si512(queries[r].as_ptr().add(stride + at).cast()) };
                    plus_wide[r] = _mm512_add_epi64(plus_wide[r], _mm512_sad_epu8(x, n));
                }
            }
            at += 64;
        }
        // The last 32 bytes, if any, in a half vector: as AVX2 does.
        let half = if at < stride { 32 } else { 0 };
        // SAFETY: the same bounds, from `at`; the CPU has AVX2.
        let (narrow, plus_narrow) =
            unsafe { blocks::<WHAT, R>(bytes, starts.map(|s| s + at), queries, (at, half), stride) };
        let mut spans = [0; R];
        let mut plus = [0; R];
        for r in 0..R {
            spans[r] = if WHAT == LINF {
                let halves = _mm256_max_epu8(_mm512_castsi512_si256(wide[r]), _mm512_extracti64x4_epi64::<1>(wide[r]));
                max_of(_mm256_max_epu8(halves, narrow[r]))
            } else {
                (_mm512_reduce_add_epi64(wide[r]) as u64 + sum_of(narrow[r])) as u32
            };
            plus[r] = (_mm512_reduce_add_epi64(plus_wide[r]) as u64 + sum_of(plus_narrow[r])) as u32;
        }
        (spans, plus)
    }

    /// `spans` on 32-byte blocks with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn spans_avx2<const WHAT: u8, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> ([u32; R], [u32; R]) {
        // SAFETY: as the caller promises.
        let (narrow, plus_narrow) = unsafe { blocks::<WHAT, R>(bytes, starts, queries, (0, stride), stride) };
        let spans = narrow.map(|v| if WHAT == LINF { max_of(v) } else { sum_of(v) as u32 });
        (spans, plus_narrow.map(|v| sum_of(v) as u32))
    }

    /// The running `D` (as four u64 lanes) or `M` (as 32 u8 lanes), and
    /// `P`, of the `len` bytes from each start against the queries from
    /// `at`.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`, `len` a multiple
    /// of 32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn blocks<const WHAT: u8, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
        stride: usize,
    ) -> ([__m256i; R], [__m256i; R]) {
        let (mut spans, mut plus) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
        for step in (0..len).step_by(32) {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe {
                    (
                        _mm256_loadu_si256(bytes.as_ptr().add(starts[r] + step).cast()),
                        _mm256_loadu_si256(queries[r].as_ptr().add(at + step).cast()),
                    )
                };
                spans[r] = if WHAT == LINF {
                    _mm256_max_epu8(spans[r], _mm256_or_si256(_mm256_subs_epu8(x, q), _mm256_subs_epu8(q, x)))
                } else {
                    _mm256_add_epi64(spans[r], _mm256_sad_epu8(x, q))
                };
                if WHAT == BRAY_CURTIS {
                    // SAFETY: in bounds, as the caller promises.
                    let n = unsafe { _mm256_loadu_si256(queries[r].as_ptr().add(stride + at + step).cast()) };
                    plus[r] = _mm256_add_epi64(plus[r], _mm256_sad_epu8(x, n));
                }
            }
        }
        (spans, plus)
    }

    /// The largest of 32 u8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn max_of(v: __m256i) -> u32 {
        let v = _mm_max_epu8(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<8>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<4>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<2>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<1>(v));
        (_mm_cvtsi128_si32(v) & 0xff) as u32
    }
}
