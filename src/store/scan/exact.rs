//! The exact f32 scan: rows read once a tile at a time, each tile scored
//! against the queries a tile of them at a time, with the kernels of the
//! process's path (`cpu`); and its form under a mask.

use std::ops::Range;

use roaring::RoaringBitmap;

use super::coded::Coded;
use super::{FirstPass, View};
use crate::store::cpu::{self, F32};
use crate::store::kernels::{self, Measure};
use crate::store::metric::ExactTile;
use crate::store::topk::{Candidate, TopK};

/// How far ahead of the tile of rows being scored `search_many` asks for
/// rows from memory, in tiles: far enough that they arrive in time, near
/// enough that they are still in cache when their turn comes.
pub(super) const PREFETCH_TILES: usize = 4;

/// Queries scored together by one tile of `search_many`, and rows per tile
/// with them (`row_tile`): each load then feeds 4 multiply-adds instead of
/// one. With AVX-512's 32 registers the 4 x 4 sums stay in registers; with
/// 16, 4 x 3 do. (Chosen with the `kernels` bench: 4 x 2 up to 6 x 4 and
/// 12 x 1 were tried; the wider tiles gained nothing more, the narrower
/// lost.)
pub(super) const QUERY_TILE: usize = 4;

pub(super) const ROW_TILE_WIDE: usize = 4;

pub(super) const ROW_TILE_NARROW: usize = 3;

/// Rows per tile of `search_many` on the process's path.
pub(super) fn row_tile() -> usize {
    if cpu::paths().f32() == F32::Avx512 {
        ROW_TILE_WIDE
    } else {
        ROW_TILE_NARROW
    }
}

/// What `scan_tile_in` scores: `Q` queries against `rows`, into `tops`,
/// asking for `prefetch` first.
pub(super) struct Tile<'a, const Q: usize> {
    pub(super) queries: &'a [&'a [f32]; Q],
    pub(super) rows: Range<usize>,
    pub(super) tops: &'a mut [TopK],
    pub(super) prefetch: &'a [f32],
}

/// A tile of `scan_tile` as the metric scores it (`ExactTile`): `Q`
/// queries with their `scales` against `rows`, `R` at a time.
struct MetricTile<'a, 'v, const Q: usize, const R: usize> {
    view: &'a View<'v>,
    queries: &'a [&'a [f32]; Q],
    scales: &'a [f32; Q],
    rows: Range<usize>,
    tops: &'a mut [TopK],
    prefetch: &'a [f32],
}

impl<const Q: usize, const R: usize> ExactTile for MetricTile<'_, '_, Q, R> {
    #[inline(always)]
    fn products<M: Measure, const SCALED: bool>(self, distance: impl Fn(f32, f32, f32) -> f32) {
        let MetricTile { view, queries, scales, rows, tops, prefetch } = self;
        view.scan_tile_with::<M, Q, R>(queries, rows, tops, prefetch, |score, row, q| {
            if SCALED {
                distance(score, view.inverse_norms[row], scales[q])
            } else {
                distance(score, 1.0, 1.0)
            }
        });
    }

    #[inline(always)]
    fn pairs(self, distance: impl Fn(&[f32], &[f32]) -> f32) {
        let MetricTile { view, queries, rows, tops, prefetch, .. } = self;
        view.scan_pairs(queries, rows, tops, prefetch, distance);
    }
}

pub(super) fn offer(top: &mut TopK, distance: f32, id: i64, row: usize) {
    if let Some(threshold) = top.threshold() {
        // Strictly farther than the farthest kept: cannot enter (ties still
        // go to `push`, which breaks them by id).
        if distance > threshold {
            return;
        }
    }
    top.push(Candidate { distance, id, row: row as u32 });
}

impl View<'_> {
    /// Asks for row `row`'s values to be brought into cache.
    #[inline(always)]
    pub(super) fn prefetch_row(&self, row: usize) {
        for line in self.vectors[row * self.dims..(row + 1) * self.dims].iter().step_by(kernels::LINE_FLOATS) {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            safe_arch::prefetch_t0(line);
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            let _ = line;
        }
    }

    /// `scan_exact` over the rows of `mask` within `rows`: each run of
    /// consecutive rows in the mask is scanned as an unmasked scan would
    /// scan it, so every pair is scored as it would be without the mask.
    /// The first row of the next run is asked for from memory meanwhile:
    /// across a gap the hardware's prefetcher loses the stream.
    pub(super) fn scan_masked(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: Option<&Coded>,
        mask: &RoaringBitmap,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        if let Some(coded) = coded {
            return self.scan_coded_for(queries, scales, coded, Some(mask), rows, tops);
        }
        let mut runs = mask.iter();
        runs.advance_to(rows.start as u32);
        let end = rows.end;
        let mut next_run = || {
            let run = runs.next_range()?;
            let start = *run.start() as usize;
            (start < end).then(|| start..(*run.end() as usize + 1).min(end))
        };
        let mut next = next_run();
        let mut pass = FirstPass::default();
        while let Some(run) = next {
            next = next_run();
            if let Some(ahead) = &next {
                kernels::prefetch(self.vector_of_row(ahead.start as u32));
            }
            pass += self.scan_exact(queries, scales, coded, run, tops);
        }
        pass
    }

    /// Offers every row of `rows` to the tops of the queries: a tile of rows
    /// at a time, each scored against the queries a tile of them at a time;
    /// with `coded`, through the int8 pass instead (`scan_coded`).
    pub(super) fn scan_exact(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: Option<&Coded>,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        if let Some(coded) = coded {
            return self.scan_coded_for(queries, scales, coded, None, rows, tops);
        }
        if let ([query], [scale], [top]) = (queries, scales, &mut *tops) {
            // A lone query reads the rows from memory one at a time: one
            // stream of rows is read faster than several interleaved (the
            // `kernels` bench: 8 rows at a time took 1.7 times as long).
            let top = std::slice::from_mut(top);
            self.scan_tile::<1, 1>(&[query], &[*scale], rows, top, &[]);
            return FirstPass::default();
        }
        match row_tile() {
            ROW_TILE_WIDE => self.scan_tiles::<ROW_TILE_WIDE>(queries, scales, rows, tops),
            _ => self.scan_tiles::<ROW_TILE_NARROW>(queries, scales, rows, tops),
        }
        FirstPass::default()
    }

    /// `scan_exact` of several queries, `R` rows at a time.
    pub(super) fn scan_tiles<const R: usize>(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        rows: Range<usize>,
        tops: &mut [TopK],
    ) {
        // Each tile of rows is scored against every tile of queries before
        // the next is read, so the rows are read from memory once, in order,
        // and stay in L1 meanwhile; the queries (a few KiB each) come from
        // L2. The query tiles share out the prefetching of a tile ahead.
        let mut start = rows.start;
        while start < rows.end {
            let tile = start..(start + R).min(rows.end);
            let mut prefetches = self.prefetch_shares(tile.start, R, rows.end, queries.len());
            let tiles = queries.chunks(QUERY_TILE).zip(scales.chunks(QUERY_TILE)).zip(tops.chunks_mut(QUERY_TILE));
            for ((queries, scales), tops) in tiles {
                let (rows, prefetch) = (tile.clone(), prefetches.next().unwrap_or_default());
                match queries.len() {
                    QUERY_TILE => self.scan_tile::<QUERY_TILE, R>(queries, scales, rows, tops, prefetch),
                    3 => self.scan_tile::<3, R>(queries, scales, rows, tops, prefetch),
                    2 => self.scan_tile::<2, R>(queries, scales, rows, tops, prefetch),
                    _ => self.scan_tile::<1, R>(queries, scales, rows, tops, prefetch),
                }
            }
            start = tile.end;
        }
    }

    /// The rows of the tile `PREFETCH_TILES` ahead of the one of `tile_rows`
    /// rows at `row` (not past `end`), in one share per tile of `queries`
    /// queries: each query tile asks for its share, so that the prefetching
    /// overlaps their arithmetic instead of stalling all at once.
    pub(super) fn prefetch_shares(
        &self,
        row: usize,
        tile_rows: usize,
        end: usize,
        queries: usize,
    ) -> std::slice::Chunks<'_, f32> {
        let ahead = (row + PREFETCH_TILES * tile_rows).min(end);
        let ahead = &self.vectors[ahead * self.dims..(ahead + tile_rows).min(end) * self.dims];
        let share = ahead.len().div_ceil(queries.div_ceil(QUERY_TILE)).next_multiple_of(kernels::LINE_FLOATS);
        ahead.chunks(share.max(1))
    }

    /// Scores `Q` queries (with their `scales`) against `rows`, `R` rows at a
    /// time, with the metric's kernel (`Metric::scan_tile`), and offers each
    /// row to each query's top; first asks for `prefetch` to be fetched
    /// meanwhile.
    #[inline(always)]
    pub(super) fn scan_tile<const Q: usize, const R: usize>(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        rows: Range<usize>,
        tops: &mut [TopK],
        prefetch: &[f32],
    ) {
        let queries: &[&[f32]; Q] = queries.try_into().expect("a tile of Q queries");
        let scales: &[f32; Q] = scales.try_into().expect("a scale per query");
        self.metric.scan_tile(MetricTile::<Q, R> { view: self, queries, scales, rows, tops, prefetch });
    }

    /// `scan_tile` for the distances that score one pair at a time: a row
    /// is read from memory once, for the first query, and from L1 for the
    /// others; `prefetch` is asked for first, as `scan_tile_with` does.
    #[inline(always)]
    pub(super) fn scan_pairs(
        &self,
        queries: &[&[f32]],
        rows: Range<usize>,
        tops: &mut [TopK],
        prefetch: &[f32],
        distance: impl Fn(&[f32], &[f32]) -> f32,
    ) {
        kernels::prefetch(prefetch);
        for row in rows {
            let vector = self.vector_of_row(row as u32);
            for (query, top) in queries.iter().zip(tops.iter_mut()) {
                offer(top, distance(query, vector), self.ids[row], row);
            }
        }
    }

    /// `scan_tile` for one measure; `distance(score, row, q)` turns a score
    /// into the distance the tops order by (smaller is nearer). Runs the
    /// kernels of the process's path (`cpu`).
    #[inline(always)]
    pub(super) fn scan_tile_with<M: Measure, const Q: usize, const R: usize>(
        &self,
        queries: &[&[f32]; Q],
        rows: Range<usize>,
        tops: &mut [TopK],
        prefetch: &[f32],
        distance: impl Fn(f32, usize, usize) -> f32,
    ) {
        let tile = Tile { queries, rows, tops, prefetch };
        match cpu::paths().f32() {
            // SAFETY: `cpu::Paths` are only made where the CPU has them (`choose`).
            #[cfg(target_arch = "x86_64")]
            F32::Avx512 => unsafe { self.scan_tile_avx512::<M, Q, R>(tile, &distance) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            F32::Avx2 => unsafe { self.scan_tile_avx2::<M, Q, R>(tile, &distance) },
            // SAFETY: the baseline is the build's own target.
            _ => unsafe { self.scan_tile_in::<kernels::Baseline, 8, M, Q, R>(tile, &distance) },
        }
    }

    /// `scan_tile_in` compiled for AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scan_tile_avx512<M: Measure, const Q: usize, const R: usize>(
        &self,
        tile: Tile<'_, Q>,
        distance: &impl Fn(f32, usize, usize) -> f32,
    ) {
        // SAFETY: the caller's promise.
        unsafe { self.scan_tile_in::<kernels::Avx512, 16, M, Q, R>(tile, distance) }
    }

    /// `scan_tile_in` compiled for AVX2 and FMA.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scan_tile_avx2<M: Measure, const Q: usize, const R: usize>(
        &self,
        tile: Tile<'_, Q>,
        distance: &impl Fn(f32, usize, usize) -> f32,
    ) {
        // SAFETY: the caller's promise.
        unsafe { self.scan_tile_in::<kernels::Avx2, 8, M, Q, R>(tile, distance) }
    }

    /// Scores the tile's queries against its rows, `R` at a time, in the
    /// lanes `L`, and offers each row to each query's top.
    ///
    /// # Safety
    /// The CPU must have `L`'s instructions.
    #[inline(always)]
    pub(super) unsafe fn scan_tile_in<
        L: kernels::Lanes<N>,
        const N: usize,
        M: Measure,
        const Q: usize,
        const R: usize,
    >(
        &self,
        tile: Tile<'_, Q>,
        distance: &impl Fn(f32, usize, usize) -> f32,
    ) {
        let Tile { queries, rows, tops, prefetch } = tile;
        let dims = self.dims;
        kernels::prefetch(prefetch);
        let mut row = rows.start;
        while row + R <= rows.end {
            // SAFETY: the caller's promise.
            let scores =
                unsafe { kernels::tile::<L, N, M, Q, R>(queries, &self.vectors[row * dims..(row + R) * dims]) };
            // One test for the whole tile, without branches: whether every
            // row is strictly farther than the farthest each query keeps, so
            // that none can enter (a NaN is not farther; a top not yet full
            // takes anything).
            let mut distances = [[0.0; R]; Q];
            let mut far = true;
            for (q, top) in tops.iter().enumerate() {
                let threshold = top.threshold().unwrap_or(f32::INFINITY);
                for r in 0..R {
                    distances[q][r] = distance(scores[q][r], row + r, q);
                    far &= distances[q][r] > threshold;
                }
            }
            if !far {
                for (q, top) in tops.iter_mut().enumerate() {
                    for (r, &d) in distances[q].iter().enumerate() {
                        offer(top, d, self.ids[row + r], row + r);
                    }
                }
            }
            row += R;
        }
        // The last rows, fewer than a tile: one at a time (`offer` tests each).
        for row in row..rows.end {
            // SAFETY: the caller's promise.
            let scores =
                unsafe { kernels::tile::<L, N, M, Q, 1>(queries, &self.vectors[row * dims..(row + 1) * dims]) };
            for (q, (scores, top)) in scores.iter().zip(tops.iter_mut()).enumerate() {
                offer(top, distance(scores[0], row, q), self.ids[row], row);
            }
        }
    }
}
