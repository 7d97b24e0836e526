//! A lone search through a floors' first pass, or through the products'
//! on a small index, scoring rows in the order of their bounds
//! (`View::search_in_order`).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use super::coded::{CODES_PREFETCH_ROWS, RESCORE_LAG};
use super::exact::offer;
use super::threads::{in_parts, merge_partials, share_in, threshold_of};
use super::{FirstPass, View};
use crate::store::codes::{self, floors::Grids, Bounds, Codes, LaneQuery, Lanes, QueryCode, LANES};
use crate::store::cpu;
use crate::store::topk::TopK;

/// The buffers of a lone search that scores rows in the order of their
/// bounds (`View::search_in_order`), kept from search to search.
#[derive(Default)]
pub(super) struct InOrder {
    /// Each row's key (f32 bits, `Keyed::keys_of`), written by whichever
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

/// A lone search's query and scales, its top, the threads' tops and the
/// rows they take at a time, and the ordered search's buffers.
pub(super) type Lone<'a, 'b> = ((&'a [f32], &'a [f32]), &'b mut TopK, (&'b mut [Vec<TopK>], usize), &'b mut InOrder);

/// Where an ordered search's keys come from.
#[derive(Clone, Copy)]
pub(super) enum Keyed<'a> {
    /// A floors' (`Grids::keys_of`).
    Floors(cpu::Kernel, &'a Grids),
    /// The products' bound, in lanes (`Lanes::keys_run`), on an index of
    /// at least `LANES` rows; with the query's code and bounds, whose
    /// second look (`codes::Bounds::nearest_finely_of`) keys the rows left
    /// after step 2 of `View::search_in_order`.
    Products(&'a Lanes<'a>, &'a LaneQuery<'a>, (cpu::Kernel, &'a QueryCode, &'a Bounds)),
}

impl Keyed<'_> {
    /// Each row of `rows`' key, handed to `note(row, key)` in turn.
    #[inline(always)]
    fn keys_of(self, codes: &Codes, rows: Range<usize>, mut note: impl FnMut(usize, f32)) {
        match self {
            Keyed::Floors(kernel, grids) => {
                let mut row = rows.start;
                while row + codes::ROWS <= rows.end {
                    codes.prefetch(row + CODES_PREFETCH_ROWS, codes::ROWS);
                    let found = grids.keys_of::<{ codes::ROWS }>(kernel, codes, std::array::from_fn(|r| row + r));
                    for (r, key) in found.into_iter().enumerate() {
                        note(row + r, key);
                    }
                    row += codes::ROWS;
                }
                for row in row..rows.end {
                    let [key] = grids.keys_of(kernel, codes, [row]);
                    note(row, key);
                }
            }
            Keyed::Products(lanes, query, _) => {
                let whole = rows.start + rows.len() / LANES * LANES;
                // The codes ahead are left to the hardware, as a lone scan
                // in the rows' order leaves them (`scan_coded_lanes`). Asked
                // for `LANES` rows at a time, lone searches of 100,000 x 768
                // random rows in the order of their bounds answered 248 to
                // 298 a second against 326 to 360 in the rows' order (over
                // HTTP, the builds in turn); left to the hardware, 284 and
                // 363 against 318 and 256, within the host's noise.
                let ahead = |_| {};
                // Those of `mine` among the `LANES` rows from `row`.
                let mut emit = |row: usize, keys: [f32; LANES], mine: &Range<usize>| {
                    for (r, key) in keys.into_iter().enumerate().filter(|&(r, _)| mine.contains(&(row + r))) {
                        // A NaN bound rules nothing out (`rules_out`): its
                        // row is kept, first. NaN marks the rows scored.
                        note(row + r, if key.is_nan() { f32::NEG_INFINITY } else { key });
                    }
                };
                lanes.keys_run(query, rows.start..whole, (ahead, |row, keys| emit(row, keys, &rows)));
                if whole < rows.end {
                    // The last rows, of whole lanes that hold them (the
                    // index has at least `LANES` rows); the others there
                    // are another step's.
                    let start = rows.end.max(LANES) - LANES;
                    let last = whole..rows.end;
                    lanes.keys_run(query, start..start + LANES, (|_| {}, |row, keys| emit(row, keys, &last)));
                }
            }
        }
    }

    /// Pushes onto `left` every row not `beyond` `threshold`, with its key
    /// (`keys[row]`, f32 bits; NaN for a row already scored, which is
    /// skipped).
    fn left_of(self, codes: &Codes, keys: &[AtomicU32], threshold: f32, left: &mut Vec<(f32, u32)>) {
        match self {
            Keyed::Floors(_, grids) => grids.left_of(codes, keys, threshold, left),
            Keyed::Products(..) => left.extend(keys.iter().enumerate().filter_map(|(row, key)| {
                let key = f32::from_bits(key.load(Ordering::Relaxed));
                (key <= threshold).then_some((key, row as u32))
            })),
        }
    }

    /// Whether row `row`, whose key is `key`, is strictly farther than
    /// `threshold` whatever its exact distance: the products' rule
    /// (`Lanes::rules_out`) as the floors'.
    #[inline(always)]
    fn beyond(self, codes: &Codes, row: usize, key: f32, threshold: f32) -> bool {
        match self {
            Keyed::Floors(_, grids) => grids.beyond(codes, row, key, threshold),
            Keyed::Products(..) => key > threshold,
        }
    }
}

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
    /// A lone search through a floors' first pass, or the products' on a
    /// small index (`Keyed`), in three steps instead of one, so that it
    /// scores exactly only the rows whose bound is within its final k-th
    /// distance, not those within the k-th of the rows read so far (about a
    /// third as many, on random data):
    /// 1. the threads read every row's codes, taking `chunk` rows at a
    ///    time, and note each row's key (`Keyed::keys_of`: its bound, or
    ///    for lp what its bound follows from without a root), and each the
    ///    k least keys it found;
    /// 2. the rows of those least keys are scored exactly: the k-th nearest
    ///    of them is at least as near as the answer's k-th;
    /// 3. the other rows not beyond it (`Keyed::beyond`) are scored in the
    ///    order of their keys, each unless it is beyond the k-th nearest
    ///    kept by then. Through the products' bound, each of these rows'
    ///    keys is first its second look's (`codes`' module doc), which is
    ///    nearly always tighter: they are sorted and ruled out by that.
    ///
    /// A row is ruled out only when its bound is strictly above a distance
    /// that k scored rows are within, so the answer is the one-step scan's,
    /// bit for bit.
    pub(super) fn search_in_order(
        &self,
        keyed: Keyed,
        ((query, scales), top, (partials, chunk), order): Lone<'_, '_>,
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
        in_parts(top, partials, k, |least, _, _| self.note_keys((keyed, codes), (keys, &taken, chunk), least));
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
        keyed.left_of(codes, keys, within, &mut order.left);
        let pass = if order.left.len() > rows / EXACT_SCAN_SHARE {
            // The bounds tell too few rows apart (rows alike): every row's
            // exact scan, in order and in tiles, costs less than scoring
            // these one at a time in the order of their keys.
            self.scan_every_row((query, scales), top, (partials, chunk))
        } else {
            if let Keyed::Products(_, _, (kernel, code, bounds)) = keyed {
                // A second look at each row left: its key from then on.
                for (key, row) in &mut order.left {
                    let nearest = bounds.nearest_finely_of((kernel, code, 0), codes, self.row_terms(*row as usize));
                    *key = if nearest.is_nan() { f32::NEG_INFINITY } else { nearest };
                }
            }
            order.left.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
            let left = (&order.left[..], within);
            let rescored = self.score_left((query, scales), (keyed, codes), left, top, partials);
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
        (keyed, codes): (Keyed, &Codes),
        (keys, taken, chunk): (&[AtomicU32], &AtomicUsize, usize),
        least: &mut TopK,
    ) {
        let rows = keys.len();
        loop {
            let start = taken.fetch_add(chunk, Ordering::Relaxed);
            if start >= rows {
                break;
            }
            keyed.keys_of(codes, start..(start + chunk).min(rows), |row, key| {
                keys[row].store(key.to_bits(), Ordering::Relaxed);
                offer(least, key, self.ids[row], row);
            });
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
        (keyed, codes): (Keyed, &Codes),
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
                if keyed.beyond(codes, row as usize, key, threshold_of(&farthest, top)) {
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
