//! The bfloat16 first pass of batches of cosine or ip searches (`screen`'s
//! doc holds its proof), on CPUs with AVX-512 BF16.

use std::ops::Range;

use super::exact::{offer, QUERY_TILE};
use super::View;
use crate::store::kernels;
use crate::store::screen::{self, Screen};
use crate::store::topk::TopK;

/// Batches of at least this many searches (of a cosine or inner-product
/// index without int8 codes, or with the int8 pass off) take a first pass
/// in bfloat16 where the CPU has it (`screen`). Fewer are bound by reading
/// the rows, which the pass does not shorten.
pub(super) const SCREEN_QUERIES_MIN: usize = 4;

/// Where the index has int8 codes, batches take the int8 pass, except
/// batches of at least `SCREEN_OVER_CODES_QUERIES_MIN` searches of an index
/// of fewer than `SCREEN_OVER_CODES_DIMS_MAX` dimensions, which take the
/// bfloat16 pass where the CPU has it. The int8 pass scores 64 products
/// per instruction against bfloat16's 32, but its bound costs more per
/// pair, so bfloat16 gains as the dimensions fall. On 20,000 rows (one
/// thread, native, both passes side by side), 64 searches took 3.8 ms in
/// bfloat16 against 6.9 in int8 at 128 dimensions, 5.6 against 6.7 at
/// 256, 7.6 against 8.0 at 384 (where 16 searches took 2.4 against 2.1),
/// 9.6 against 9.6 at 512; at 768 int8 was faster at 4 to 64 searches.
pub(super) const SCREEN_OVER_CODES_QUERIES_MIN: usize = 13;

pub(super) const SCREEN_OVER_CODES_DIMS_MAX: usize = 384;

/// Pairs of a tile left undecided by the bfloat16 pass above which the f32
/// tile scores all its pairs: that costs about what 4 pairs scored alone do.
pub(super) const SCREEN_WHOLE_TILE_PAIRS: usize = 4;

/// Rows per tile of the bfloat16 pass: each tile of rows is converted once
/// and then scored against every query, `QUERY_TILE` at a time.
pub(super) const SCREEN_ROW_TILE: usize = 4;

/// What `screen_tile` scores: queries `first..` against the `R` rows from
/// `row`, which are `converted` to bfloat16 and scale their scores by
/// `row_scales` (see `screen::distance`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct ScreenTile<'a, const R: usize> {
    pub(super) queries: &'a [&'a [f32]],
    pub(super) screen: &'a Screen,
    pub(super) first: usize,
    pub(super) row: usize,
    pub(super) converted: &'a [screen::Block],
    pub(super) row_scales: &'a [f32; R],
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Each thread's tile of rows in bfloat16 (`scan_screened`), kept from
    /// chunk to chunk and search to search: the pool's threads live as long
    /// as the process, so a steady load allocates nothing for it.
    static CONVERTED: std::cell::RefCell<Vec<screen::Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl View<'_> {
    /// `scan_screened`, which a `Screen` makes safe to call. Returns how
    /// many pairs the pass scored exactly.
    pub(super) fn scan_through(
        &self,
        screen: &Screen,
        queries: &[&[f32]],
        scales: &[f32],
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> usize {
        // SAFETY: a `Screen` is only made where the CPU has both features.
        #[cfg(target_arch = "x86_64")]
        return CONVERTED.with_borrow_mut(|converted| unsafe {
            self.scan_screened(queries, scales, (screen, converted), rows, tops)
        });
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (screen, queries, scales, rows, tops);
            unreachable!("a `Screen` is only made on x86-64")
        }
    }

    /// `scan_exact` with the bfloat16 pass (`screen`'s doc): the rows are
    /// converted a tile at a time, each tile scored against every query in
    /// bfloat16, and a pair scored exactly (as `scan_exact` would) only where
    /// the bound cannot rule it out. Returns how many pairs were. The
    /// rows are converted into `converted`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn scan_screened(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        (screen, converted): (&Screen, &mut Vec<screen::Block>),
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> usize {
        const R: usize = SCREEN_ROW_TILE;
        let dims = self.dims;
        converted.clear();
        converted.resize(R * screen.blocks(), screen::Block::default());
        let mut rescored = 0;
        let mut row = rows.start;
        while row + R <= rows.end {
            for (r, blocks) in converted.chunks_exact_mut(screen.blocks()).enumerate() {
                screen::convert(&self.vectors[(row + r) * dims..(row + r + 1) * dims], blocks);
            }
            // The bfloat16 pass bounds products only: cosine's, scaled,
            // and the inner product's.
            let row_scales = if self.metric.is_scaled() {
                self.inverse_norms[row..row + R].try_into().expect("R rows")
            } else {
                [1.0; R]
            };
            let mut prefetches = self.prefetch_shares(row, R, rows.end, queries.len());
            let tiles = (0..).step_by(QUERY_TILE).zip(tops.chunks_mut(QUERY_TILE));
            for (first, tops) in tiles {
                kernels::prefetch(prefetches.next().unwrap_or_default());
                let tile = ScreenTile { queries, screen, first, row, converted, row_scales: &row_scales };
                rescored += match tops.len() {
                    QUERY_TILE => self.screen_tile::<QUERY_TILE, R>(tile, tops),
                    3 => self.screen_tile::<3, R>(tile, tops),
                    2 => self.screen_tile::<2, R>(tile, tops),
                    _ => self.screen_tile::<1, R>(tile, tops),
                };
            }
            row += R;
        }
        // The last rows, fewer than a tile: exactly.
        self.scan_exact(queries, scales, None, row..rows.end, tops);
        rescored
    }

    /// Scores `Q` queries against `R` converted rows in bfloat16, and offers
    /// each pair the bound cannot rule out to its query's top, scored
    /// exactly. Returns how many pairs were.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    pub(super) fn screen_tile<const Q: usize, const R: usize>(&self, tile: ScreenTile<R>, tops: &mut [TopK]) -> usize {
        let ScreenTile { queries, screen, first, row, converted, row_scales } = tile;
        let dims = self.dims;
        let scores = screen::tile::<Q, R>(std::array::from_fn(|q| screen.query(first + q)), converted);
        let thresholds = std::array::from_fn(|q| tops[q].threshold().unwrap_or(f32::INFINITY));
        let norms = self.norms[row..row + R].try_into().expect("R rows");
        let mut undecided = screen.undecided::<Q, R>(scores, first, norms, row_scales, thresholds);
        let rescored = undecided.count_ones() as usize;
        if rescored > SCREEN_WHOLE_TILE_PAIRS {
            let tile_queries = queries[first..first + Q].try_into().expect("Q queries");
            // SAFETY: a `Screen` is only made where the process scans with
            // AVX-512 (and this function's features include it).
            let exact = unsafe {
                kernels::tile::<kernels::Avx512, 16, kernels::Dot, Q, R>(
                    tile_queries,
                    &self.vectors[row * dims..(row + R) * dims],
                )
            };
            for (q, (top, exact)) in tops.iter_mut().zip(exact).enumerate() {
                for (r, exact) in exact.into_iter().enumerate() {
                    let distance = screen::distance(exact, row_scales[r], screen.scale(first + q));
                    offer(top, distance, self.ids[row + r], row + r);
                }
            }
            return rescored;
        }
        while undecided != 0 {
            let (q, r) = screen::pair_of_lane(undecided.trailing_zeros() as usize, R);
            undecided &= undecided - 1;
            let row = row + r;
            let exact = kernels::dot(queries[first + q], &self.vectors[row * dims..(row + 1) * dims]);
            let distance = screen::distance(exact, row_scales[r], screen.scale(first + q));
            offer(&mut tops[q], distance, self.ids[row], row);
        }
        rescored
    }
}
