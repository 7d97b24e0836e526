//! A lone search through a floors' first pass, scoring rows in the order
//! of their bounds (`View::search_in_order`).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use super::coded::{CODES_PREFETCH_ROWS, RESCORE_LAG};
use super::exact::offer;
use super::threads::{in_parts, merge_partials, share_in, threshold_of};
use super::{FirstPass, View};
use crate::store::codes::{self, floors::Grids, Codes};
use crate::store::cpu;
use crate::store::topk::TopK;

/// The buffers of a lone search that scores rows in the order of their
/// bounds (`View::search_in_order`), kept from search to search.
#[derive(Default)]
pub(super) struct InOrder {
    /// Each row's key (f32 bits, `Grids::keys_of`), written by whichever
    /// thread read its codes.
    pub(super) keys: Vec<AtomicU32>,
    /// The rows of the least keys each thread found.
    pub(super) least: Vec<usize>,
    /// The rows left to score, with their keys: a few in a thousand on
    /// random rows, every row where the bounds tell none apart (then let
    /// go after the search, past `LEFT_KEPT`).
    pub(super) left: Vec<(f32, u32)>,
}

/// The most rows `InOrder::left` keeps room for between searches.
pub(super) const LEFT_KEPT: usize = 1 << 16;

impl InOrder {
    /// Lets a list of rows left longer than `LEFT_KEPT` go.
    fn let_go(&mut self) {
        if self.left.capacity() > LEFT_KEPT {
            self.left = Vec::new();
        }
    }
}

/// An ordered search with more than this share of its rows left after its
/// second step (one in `EXACT_SCAN_SHARE`) scans every row exactly
/// instead: scoring rows one at a time in the order of their keys costs
/// about twice as much a row as the exact scan in tiles.
pub(super) const EXACT_SCAN_SHARE: usize = 4;

/// Rows left to score in order from which the threads share them.
pub(super) const THIRD_STEP_SPLIT_MIN: usize = 64;

impl View<'_> {
    /// A lone search through a floors' first pass, in three steps instead
    /// of one, so that it scores exactly only the rows whose bound is
    /// within its final k-th distance, not those within the k-th of the
    /// rows read so far (about a third as many, on random data):
    /// 1. the threads read every row's codes, taking `chunk` rows at a
    ///    time, and note each row's key (`Grids::keys_of`: its bound, or
    ///    for lp what its bound follows from without a root), and each the
    ///    k least keys it found;
    /// 2. the rows of those least keys are scored exactly: the k-th nearest
    ///    of them is at least as near as the answer's k-th;
    /// 3. the other rows not beyond it (`Grids::beyond`) are scored in the
    ///    order of their keys, each unless it is beyond the k-th nearest
    ///    kept by then.
    ///
    /// A row is ruled out only when its bound is strictly above a distance
    /// that k scored rows are within, so the answer is the one-step scan's,
    /// bit for bit.
    pub(super) fn search_in_order(
        &self,
        (query, scales): (&[f32], &[f32]),
        (kernel, grids): (cpu::Kernel, &Grids),
        top: &mut TopK,
        (partials, chunk): (&mut [Vec<TopK>], usize),
        order: &mut InOrder,
    ) -> FirstPass {
        let codes = self.codes.expect("a coded pass has codes");
        let (rows, k) = (self.len(), top.k());
        if k == 0 {
            return FirstPass::default();
        }
        if order.keys.len() < rows {
            order.keys.resize_with(rows, || AtomicU32::new(0));
        }
        let keys = &order.keys[..rows];
        // 1. Every row's key; each thread's k least in its `TopK`.
        let taken = AtomicUsize::new(0);
        in_parts(top, partials, k, |least, _, _| self.note_keys((kernel, grids, codes), (keys, &taken, chunk), least));
        // 2. The rows of the least keys, scored.
        order.least.clear();
        order.least.extend(top.sorted().iter().map(|c| c.row as usize));
        for partial in partials.iter_mut() {
            order.least.extend(partial[0].sorted().iter().map(|c| c.row as usize));
        }
        top.reset(k);
        // A scored row's key becomes NaN, which no key is (`keys_of`).
        for &row in &order.least {
            self.score_row((query, scales), top, row);
            keys[row].store(f32::NAN.to_bits(), Ordering::Relaxed);
        }
        // 3. The rest not beyond the k-th nearest of those, least key first.
        let within = top.threshold().unwrap_or(f32::INFINITY);
        order.left.clear();
        grids.left_of(codes, keys, within, &mut order.left);
        let pass = if order.left.len() > rows / EXACT_SCAN_SHARE {
            // The bounds tell too few rows apart (rows alike): every row's
            // exact scan, in order and in tiles, costs less than scoring
            // these one at a time in the order of their keys.
            self.scan_every_row((query, scales), top, (partials, chunk))
        } else {
            order.left.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
            let left = (&order.left[..], within);
            let rescored = self.score_left((query, scales), (grids, codes), left, top, partials);
            FirstPass { rows: rows as u64, rescored: (order.least.len() + rescored) as u64 }
        };
        order.let_go();
        pass
    }

    /// Step 1 of `search_in_order`, on one thread: takes `chunk` rows at a
    /// time (from `taken`) until none are left, noting each row's key in
    /// `keys` and offering it to `least`.
    fn note_keys(
        &self,
        (kernel, grids, codes): (cpu::Kernel, &Grids, &Codes),
        (keys, taken, chunk): (&[AtomicU32], &AtomicUsize, usize),
        least: &mut TopK,
    ) {
        let rows = keys.len();
        loop {
            let start = taken.fetch_add(chunk, Ordering::Relaxed);
            if start >= rows {
                break;
            }
            let end = (start + chunk).min(rows);
            let mut note = |row: usize, key: f32| {
                keys[row].store(key.to_bits(), Ordering::Relaxed);
                offer(least, key, self.ids[row], row);
            };
            let mut row = start;
            while row + codes::ROWS <= end {
                codes.prefetch(row + CODES_PREFETCH_ROWS, codes::ROWS);
                let found = grids.keys_of::<{ codes::ROWS }>(kernel, codes, std::array::from_fn(|r| row + r));
                for (r, key) in found.into_iter().enumerate() {
                    note(row + r, key);
                }
                row += codes::ROWS;
            }
            for row in row..end {
                let [key] = grids.keys_of(kernel, codes, [row]);
                note(row, key);
            }
        }
    }

    /// Scores row `row` exactly against the lone query, into `top`.
    #[inline(always)]
    fn score_row(&self, (query, scales): (&[f32], &[f32]), top: &mut TopK, row: usize) {
        self.scan_tile::<1, 1>(&[query], scales, row..row + 1, std::slice::from_mut(top), &[]);
    }

    /// `search_in_order` where its bounds tell too few rows apart: every
    /// row scored exactly into `top` (reset), the threads taking `chunk`
    /// rows at a time.
    fn scan_every_row(
        &self,
        (query, scales): (&[f32], &[f32]),
        top: &mut TopK,
        (partials, chunk): (&mut [Vec<TopK>], usize),
    ) -> FirstPass {
        let (rows, k) = (self.len(), top.k());
        top.reset(k);
        let taken = AtomicUsize::new(0);
        in_parts(top, partials, k, |top, _, _| loop {
            let start = taken.fetch_add(chunk, Ordering::Relaxed);
            if start >= rows {
                break;
            }
            let range = start..(start + chunk).min(rows);
            self.scan_exact(&[query], scales, None, range, std::slice::from_mut(top));
        });
        merge_partials(top, partials);
        FirstPass { rows: rows as u64, rescored: rows as u64 }
    }

    /// Step 3 of `search_in_order`: each row of `left` (least key first)
    /// not beyond the k-th nearest kept by then, starting `within`, scored
    /// into `top`; returns how many were.
    fn score_left(
        &self,
        (query, scales): (&[f32], &[f32]),
        (grids, codes): (&Grids, &Codes),
        (left, within): (&[(f32, u32)], f32),
        top: &mut TopK,
        partials: &mut [Vec<TopK>],
    ) -> usize {
        // Shared by the threads as `Coded::farthest` is: each takes every
        // `parts`-th row left, least key first.
        let (farthest, rescored) = (AtomicU32::new(within.to_bits()), AtomicUsize::new(0));
        let third = |top: &mut TopK, part: usize, parts: usize| {
            let mut scored = 0;
            for (n, &(key, row)) in left.iter().enumerate().skip(part).step_by(parts) {
                if grids.beyond(codes, row as usize, key, threshold_of(&farthest, top)) {
                    continue;
                }
                // The thread's rows a few places on, asked for meanwhile.
                if let Some(&(_, ahead)) = left.get(n + RESCORE_LAG * parts) {
                    self.prefetch_row(ahead as usize);
                }
                self.score_row((query, scales), top, row as usize);
                scored += 1;
                share_in(&farthest, top);
            }
            rescored.fetch_add(scored, Ordering::Relaxed);
        };
        // Handing a part to another thread costs about as much as scoring a
        // few dozen rows.
        let helpers = if left.len() < THIRD_STEP_SPLIT_MIN { &mut [][..] } else { partials };
        in_parts(top, helpers, top.k(), third);
        merge_partials(top, helpers);
        rescored.into_inner()
    }
}
