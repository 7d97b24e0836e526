//! Scanning an index: the exact f32 scan, tiled over queries and rows
//! (`exact`), the int8 first pass and its rescoring (`coded`), lone searches
//! in the order of their bounds (`in_order`), the bfloat16 first pass of
//! batches (`screened`), and the split of a large scan across the threads
//! of a pool (`threads`). [`Scanner`] holds the policy (how many threads,
//! their scratch tops); callers say what to search and get the nearest rows.
//!
//! A scan reads an index through a [`View`]: the index's arrays, borrowed.
//!
//! Which pass a search takes (`View::search_in_chunks`):
//!
//! | search | index keeps codes (`coded_pass`) | pass |
//! |---|---|---|
//! | lone, no mask, a floors' bound (l1, linf, lp, bc, canberra, js) | yes | `in_order`: keys of every row, then rows in the order of their keys |
//! | lone, no mask, a products' bound, at most `ORDERED_PRODUCTS_ROWS_MAX` rows or at least `ORDERED_PRODUCTS_DIMS_MIN` dimensions, a kernel with lanes | yes | `in_order`, the keys from `codes::Lanes`, the rows left keyed by a second look |
//! | lone or batch, a products' bound (cosine, ip, l2), or a mask | yes | `coded`: int8 bounds per tile, undecided pairs rescored unless a second look rules them out |
//! | batch of cosine or ip, no mask, at least `SCREEN_QUERIES_MIN` queries (`SCREEN_OVER_CODES_QUERIES_MIN` and under `SCREEN_OVER_CODES_DIMS_MAX` dimensions where codes are kept), CPU with AVX-512 BF16 | either | `screened`: bfloat16 bounds, undecided pairs rescored |
//! | anything else | no | `exact`: every pair in f32 |
//!
//! A chunk whose first pass had to rescore more than half its pairs sends
//! the next chunks (one, then twice as many each time it fails again) to
//! the exact scan. Every pass finds what the exact scan finds, bit for bit.

mod coded;
mod exact;
mod in_order;
mod screened;
#[cfg(test)]
pub(crate) mod tests;
mod threads;

use std::mem::take;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use roaring::RoaringBitmap;

use super::codes::floors::Grids;
use super::codes::{self, Bound, Codes, QueryCode};
use super::cpu;
use super::kernels;
use super::metric::Metric;
use super::screen::Screen;
use super::topk::TopK;
use coded::{code_queries, Coded, CodedQueries};
use exact::row_tile;
use in_order::{InOrder, Keyed};
use screened::{SCREEN_OVER_CODES_DIMS_MAX, SCREEN_OVER_CODES_QUERIES_MIN, SCREEN_QUERIES_MIN};
use threads::{merge_each, on_threads};

/// The queries' side of a scan (their squares, scales, codes, shared
/// farthest), its buffers kept from search to search in the `Scanner`, so
/// that a steady load allocates nothing, lone searches and batches alike.
#[derive(Default)]
pub struct Buffers {
    squared_norms: Vec<f64>,
    scales: Vec<f32>,
    farthest: Vec<AtomicU32>,
    codes: Vec<QueryCode>,
    bounds: Vec<codes::Bounds>,
    grids: Vec<Grids>,
    screen: Option<Screen>,
    order: InOrder,
}

/// A scan's queries made ready (`View::prepare`): each query's scale, and
/// the first pass it takes, if any.
struct Side<'a> {
    scales: &'a [f32],
    coded: Option<Coded<'a>>,
    screen: Option<&'a Screen>,
}

/// What a scan reads of an index, borrowed (`Index::view`): its rows'
/// vectors, ids, norms and codes.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub(super) dims: usize,
    pub(super) metric: Metric,
    /// Row after row, `dims` floats each.
    pub(super) vectors: &'a [f32],
    /// Cosine only: 1/|v| per row.
    pub(super) inverse_norms: &'a [f32],
    /// An upper bound on |v| per row.
    pub(super) norms: &'a [f32],
    pub(super) codes: Option<&'a Codes>,
    pub(super) ids: &'a [i64],
}

impl View<'_> {
    fn len(&self) -> usize {
        self.ids.len()
    }

    /// The stored vector of row `row`.
    fn vector_of_row(&self, row: u32) -> &[f32] {
        let row = row as usize;
        &self.vectors[row * self.dims..(row + 1) * self.dims]
    }
}

/// Below this many floats per thread, one thread scans alone: handing a
/// part to another thread (waking it, and merging its top) costs more than
/// it would save (4 Mi floats is 16 MiB, a few ms).
const PARALLEL_SCAN_FLOATS_MIN: usize = 4 << 20;

/// Rows a thread of a split scan takes at a time, in floats: 4 MiB, a few
/// hundred microseconds of scanning for one query, so that the threads
/// meet the chunk counter a few dozen times per scan of a large index.
const SCAN_CHUNK_FLOATS: usize = 1 << 20;

/// A lone search of an index of at most this many rows through the
/// products' first pass (on a kernel with lanes) scores its rows in the
/// order of their bounds (`in_order`). A scan in the rows' order must score
/// the rows nearest so far, about `k (1 + ln(n / k))` of them, before its
/// threshold is good: 70 of 4,096 rows for k = 10, 1.7%, where the
/// ordered search scores only those its bounds cannot tell from the k
/// nearest. On larger indexes that share is small and writing and reading
/// back each row's key costs more than it saves, unless the rows are long
/// (`ORDERED_PRODUCTS_DIMS_MIN`).
const ORDERED_PRODUCTS_ROWS_MAX: usize = 4096;

/// A lone search through the products' first pass (on a kernel with lanes)
/// of rows of at least this many dimensions scores its rows in the order
/// of their bounds whatever their number: a key is a few bytes written and
/// read back against the row's codes' hundreds. On image patches (32,390
/// x 192) the rows rescored went from 6.6% to 3.0% (cosine) and from 0.59%
/// to 0.05% (ip), where a scan in the rows' order spends most of them
/// before its threshold is good. On GloVe's 399,000 x 50 the keys made a
/// lone search 65% slower.
const ORDERED_PRODUCTS_DIMS_MIN: usize = 128;

/// The most threads one scan uses.
const SCAN_THREADS_MAX: usize = 8;

/// How searches scan: the threads a large scan may use (the machine's
/// cores, at most `SCAN_THREADS_MAX`), and each extra thread's tops, kept
/// from search to search so that a steady load allocates nothing.
pub struct Scanner {
    /// Per extra thread, a `TopK` per search of a batch.
    partials: Vec<Vec<TopK>>,
    /// What searches did since `take_work`.
    work: Work,
    /// The queries' side of a scan, their buffers kept.
    buffers: Buffers,
    /// The searches run together (`search_together`), their buffers kept.
    together: Together,
}

/// The buffers of `Scanner::search_together`, empty between calls: they
/// hold borrows only while it runs (`recycle`).
#[derive(Default)]
struct Together {
    queries: Vec<&'static [f32]>,
    ks: Vec<usize>,
    tops: Vec<TopK>,
    places: Vec<&'static mut TopK>,
}

/// An empty `Vec` with `v`'s allocation, of another element type of the
/// same layout: here, references of another lifetime, so that a buffer of
/// borrows is kept from search to search without holding any borrow
/// between them. Collecting from a `Vec`'s own iterator reuses its
/// allocation in place (the standard library's in-place collect); the
/// allocation tests would see it if it did not.
fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter().map(|_| unreachable!("the vector is empty")).collect()
}

/// Rows the int8 first pass read the codes of, and rows of those it scored
/// exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FirstPass {
    pub rows: u64,
    pub rescored: u64,
}

/// What searches read and how they ran, for the metrics: counted per search
/// (a batch counts each of its searches, though it reads a row once for
/// all of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    pub first_pass: FirstPass,
    /// Bytes of int8 codes the first pass read.
    pub code_bytes: u64,
    /// Bytes of f32 vectors scored exactly: the rows the first pass left,
    /// and the rows scanned without one (no codes, a chunk it gave up on,
    /// the bfloat16 pass).
    pub vector_bytes: u64,
    /// Scans of several searches at once (a search-batch's, or searches
    /// gathered from several clients), and the searches in them.
    pub batches: u64,
    pub batched_searches: u64,
}

impl std::ops::AddAssign for Work {
    fn add_assign(&mut self, other: Work) {
        self.first_pass += other.first_pass;
        self.code_bytes += other.code_bytes;
        self.vector_bytes += other.vector_bytes;
        self.batches += other.batches;
        self.batched_searches += other.batched_searches;
    }
}

impl std::ops::AddAssign for FirstPass {
    fn add_assign(&mut self, other: FirstPass) {
        self.rows += other.rows;
        self.rescored += other.rescored;
    }
}

impl Default for Scanner {
    /// As many parts as the pool it runs in has threads (`on_threads`), at
    /// most `SCAN_THREADS_MAX`.
    fn default() -> Scanner {
        let threads = rayon::current_num_threads().min(SCAN_THREADS_MAX);
        Scanner::with_threads(threads)
    }
}

impl Scanner {
    /// A scanner that splits a large scan across at most `threads` threads.
    pub fn with_threads(threads: usize) -> Scanner {
        Scanner {
            partials: (1..threads.max(1)).map(|_| Vec::new()).collect(),
            work: Work::default(),
            buffers: Buffers::default(),
            together: Together::default(),
        }
    }

    /// Runs `searches` (each a query, its k, and the top to leave its
    /// nearest in) together, in one pass over the rows of `index` in
    /// `mask` (all if `None`), as `search` does: the one way several
    /// searches are run at once, those of a search-batch and those parked
    /// by several connections alike. Allocates nothing once its buffers
    /// have grown.
    pub fn search_together<'a>(
        &mut self,
        index: View<'_>,
        mask: Option<&RoaringBitmap>,
        searches: impl Iterator<Item = (&'a [f32], usize, &'a mut TopK)>,
    ) {
        let together = &mut self.together;
        let (mut queries, mut places) = (recycle(take(&mut together.queries)), recycle(take(&mut together.places)));
        together.ks.clear();
        for (query, k, top) in searches {
            queries.push(query);
            together.ks.push(k);
            places.push(top);
        }
        if together.tops.len() < places.len() {
            together.tops.resize_with(places.len(), TopK::new);
        }
        // The tops trade places (their buffers with them), so that the scan
        // gets them as one slice.
        let (mut tops, ks) = (take(&mut together.tops), take(&mut together.ks));
        let swap = |tops: &mut [TopK], places: &mut [&mut TopK]| {
            tops.iter_mut().zip(places).for_each(|(top, place)| std::mem::swap(top, *place));
        };
        swap(&mut tops, &mut places);
        self.search(index, &queries, &ks, &mut tops[..places.len()], mask);
        swap(&mut tops, &mut places);
        self.together = Together { queries: recycle(queries), ks, tops, places: recycle(places) };
    }

    /// Lets the queries' buffers go, grown as a large batch needed them: the
    /// next search grows them again to what it needs.
    pub fn let_go(&mut self) {
        self.buffers = Buffers::default();
        self.together = Together::default();
    }

    /// What searches did since the last call.
    pub fn take_work(&mut self) -> Work {
        std::mem::take(&mut self.work)
    }

    /// Searches `index` for each of `queries` at once (`View::search_many`):
    /// `tops[q]` receives the `ks[q]` nearest to `queries[q]` among the rows
    /// in `mask` (all rows if `None`), exactly as a lone search would find
    /// them.
    pub fn search(
        &mut self,
        index: View<'_>,
        queries: &[&[f32]],
        ks: &[usize],
        tops: &mut [TopK],
        mask: Option<&RoaringBitmap>,
    ) {
        for partial in &mut self.partials {
            if partial.len() < queries.len() {
                partial.resize_with(queries.len(), TopK::new);
            }
        }
        let pass = index.search_many(queries, ks, tops, &mut self.partials, mask, &mut self.buffers);
        let pairs = (mask.map_or(index.len() as u64, RoaringBitmap::len)) * queries.len() as u64;
        let work = &mut self.work;
        work.first_pass += pass;
        work.code_bytes += pass.rows * index.codes.map_or(0, Codes::bytes_per_row) as u64;
        work.vector_bytes += (pass.rescored + pairs.saturating_sub(pass.rows)) * (index.dims * 4) as u64;
        if queries.len() > 1 {
            work.batches += 1;
            work.batched_searches += queries.len() as u64;
        }
    }
}

impl View<'_> {
    /// Whether a scan of this index is large enough to be split across
    /// threads: one worth waiting a moment for other searches to join.
    pub fn is_large(&self) -> bool {
        self.vectors.len() >= PARALLEL_SCAN_FLOATS_MIN
    }

    /// `search` without the int8 first pass: every row scored in f32. The
    /// answer is the same; for measurements and tests.
    pub fn search_f32(&self, query: &[f32], k: usize, top: &mut TopK) {
        top.reset(k.min(self.len()));
        let scale = self.metric.query_scale(|| kernels::squared_norm(query));
        self.scan_exact(&[query], &[scale], None, 0..self.len(), std::slice::from_mut(top));
    }

    /// Several searches of this index at once: the rows are read once, a
    /// tile at a time, and every query is scored against a tile before the
    /// next is read (see `scan_exact`). `tops[q]` receives the
    /// `ks[q]` nearest to `queries[q]`, exactly as `search` would give them.
    /// A large index is split across up to `partials.len() + 1` threads (the
    /// caller waits anyway; memory bandwidth is what one thread cannot use up
    /// alone); each `partials[t]` must hold a `TopK` per query. With a
    /// `mask`, only its rows are read and scored (see `scan_masked`), and
    /// the threads are as many as the rows it holds call for.
    pub(super) fn search_many(
        &self,
        queries: &[&[f32]],
        ks: &[usize],
        tops: &mut [TopK],
        partials: &mut [Vec<TopK>],
        mask: Option<&RoaringBitmap>,
        buffers: &mut Buffers,
    ) -> FirstPass {
        let rows = mask.map_or(self.len(), |mask| mask.len() as usize);
        let by_size = rows * self.dims / PARALLEL_SCAN_FLOATS_MIN;
        let threads = (partials.len() + 1).min(by_size.max(1));
        let chunk = self.chunk_rows();
        self.search_in_chunks(queries, ks, tops, (&mut partials[..threads - 1], chunk), mask, buffers)
    }

    /// Rows a thread of a split scan takes at a time (`SCAN_CHUNK_FLOATS`).
    pub(super) fn chunk_rows(&self) -> usize {
        (SCAN_CHUNK_FLOATS / self.dims).max(1).next_multiple_of(row_tile())
    }

    /// `search_many` on `partials.len() + 1` threads, their nearest merged
    /// into `tops`. The threads take the rows a chunk at a time, each the
    /// next chunk no thread has taken, so that a thread slowed down (by the
    /// host, or by another process on its core) takes fewer chunks instead
    /// of holding up the others. Exact: each of the k nearest rows is among
    /// the k nearest of the rows its thread scanned.
    pub fn search_many_split(&self, queries: &[&[f32]], ks: &[usize], tops: &mut [TopK], partials: &mut [Vec<TopK>]) {
        self.search_in_chunks(queries, ks, tops, (partials, self.chunk_rows()), None, &mut Buffers::default());
    }

    /// The int8 first pass's bound and kernel, where the index keeps codes
    /// and the process runs the pass.
    pub(super) fn coded_pass(&self) -> Option<(Bound, cpu::Kernel)> {
        let (_, kernel) = (self.codes?, cpu::paths().int8()?);
        Some((self.metric.first_pass()?, kernel))
    }

    /// `search_many_split`, the threads taking `chunk` rows at a time, of
    /// which only those in `mask` (if any) are scored; the queries' side
    /// is made in `buffers`.
    pub(super) fn search_in_chunks(
        &self,
        queries: &[&[f32]],
        ks: &[usize],
        tops: &mut [TopK],
        (partials, chunk): (&mut [Vec<TopK>], usize),
        mask: Option<&RoaringBitmap>,
        buffers: &mut Buffers,
    ) -> FirstPass {
        assert!(queries.len() == ks.len() && ks.len() == tops.len() && chunk > 0);
        let rows = self.len();
        // A mask of every row (which holds rows of this index only) is no
        // mask: the scan need not consult it.
        let mask = mask.filter(|mask| mask.len() as usize != rows);
        let matching = mask.map_or(rows, |mask| mask.len() as usize);
        let reset = |tops: &mut [TopK]| {
            for (top, &k) in tops.iter_mut().zip(ks) {
                top.reset(k.min(matching));
            }
        };
        reset(tops);
        let (side, order) = self.prepare(queries, mask.is_some(), buffers);
        if let (Some(coded), [query], [top], None) = (&side.coded, queries, &mut *tops, mask) {
            match coded.queries {
                CodedQueries::Floors([grids]) => {
                    let lone = ((*query, side.scales), top, (partials, chunk), order);
                    return self.search_in_order(Keyed::Floors(coded.kernel, grids), lone);
                }
                CodedQueries::Products { codes: [code], bounds: [bounds, ..] }
                    if rows >= codes::LANES
                        && (rows <= ORDERED_PRODUCTS_ROWS_MAX || self.dims >= ORDERED_PRODUCTS_DIMS_MIN) =>
                {
                    if let Some(lanes) = self.lanes(coded.kernel) {
                        let lane_query = lanes.query(code, bounds, 0);
                        let lone = ((*query, side.scales), top, (partials, chunk), order);
                        let second = (coded.kernel, code, bounds);
                        return self.search_in_order(Keyed::Products(&lanes, &lane_query, second), lone);
                    }
                }
                _ => {}
            }
        }
        self.scan_chunks(queries, &side, mask, tops, (partials, chunk, &reset))
    }

    /// Makes `queries` ready to scan, in `buffers`: each one's scale, and
    /// its side of a first pass (`SCREEN_QUERIES_MIN`,
    /// `SCREEN_OVER_CODES_QUERIES_MIN`). The squares are summed only where
    /// something needs them: a products' bound, or a similarity's scale
    /// or bfloat16 pass. Also hands out the ordered search's buffers.
    fn prepare<'b>(&self, queries: &[&[f32]], masked: bool, buffers: &'b mut Buffers) -> (Side<'b>, &'b mut InOrder) {
        let Buffers { squared_norms, scales, farthest, codes, bounds, grids, screen, order } = buffers;
        let (n, pass) = (queries.len(), self.coded_pass());
        squared_norms.clear();
        if self.metric.is_similarity() || matches!(pass, Some((Bound::Products(_), _))) {
            squared_norms.extend(queries.iter().map(|query| kernels::squared_norm(query)));
        }
        scales.clear();
        scales.extend((0..n).map(|q| self.metric.query_scale(|| squared_norms[q])));
        if farthest.len() < n {
            farthest.resize_with(n, || AtomicU32::new(0));
        }
        for farthest in &mut farthest[..n] {
            *farthest.get_mut() = f32::INFINITY.to_bits();
        }
        let screen_min = match pass {
            Some(_) if self.dims < SCREEN_OVER_CODES_DIMS_MAX => SCREEN_OVER_CODES_QUERIES_MIN,
            Some(_) => usize::MAX,
            None => SCREEN_QUERIES_MIN,
        };
        // No bfloat16 pass under a mask: the rows it leaves are rarely in
        // tiles worth converting.
        let screened = !masked
            && n >= screen_min
            && self.metric.is_similarity()
            && Screen::fill(screen, queries, squared_norms, scales, self.dims);
        let (farthest, scales) = (&farthest[..n], &scales[..]);
        let coded = match (screened, pass) {
            (false, Some((Bound::Products(shape), kernel))) => {
                let rows = self.codes.expect("a coded pass has codes");
                code_queries((shape, kernel, rows), queries, (squared_norms, scales), (codes, bounds));
                let queries = CodedQueries::Products { codes: &codes[..n], bounds };
                Some(Coded { kernel, queries, farthest })
            }
            (false, Some((Bound::Floors(floor), kernel))) => {
                let rows = self.codes.expect("a coded pass has codes");
                if grids.len() < n {
                    grids.resize_with(n, Grids::default);
                }
                for (grids, query) in grids.iter_mut().zip(queries) {
                    grids.encode(floor, rows, query);
                }
                Some(Coded { kernel, queries: CodedQueries::Floors(&grids[..n]), farthest })
            }
            _ => None,
        };
        (Side { scales, coded, screen: screen.as_ref().filter(|_| screened) }, order)
    }

    /// Scans the rows a chunk at a time on `partials.len() + 1` threads,
    /// each taking the next chunk no thread has taken, through the side's
    /// first pass; their nearest merged into `tops` (each part's tops
    /// `reset` first).
    fn scan_chunks(
        &self,
        queries: &[&[f32]],
        side: &Side,
        mask: Option<&RoaringBitmap>,
        tops: &mut [TopK],
        (partials, chunk, reset): (&mut [Vec<TopK>], usize, &(impl Fn(&mut [TopK]) + Sync)),
    ) -> FirstPass {
        let (rows, scales, coded, screen) = (self.len(), side.scales, side.coded.as_ref(), side.screen);
        let (passed, rescored) = (AtomicU64::new(0), AtomicU64::new(0));
        // The exact scan of some rows, through the int8 pass if `coded`:
        // those of the mask among them, if any.
        let scan_rows = |range: Range<usize>, coded: Option<&Coded>, tops: &mut [TopK]| {
            let pass = match mask {
                Some(mask) => self.scan_masked(queries, scales, coded, mask, range, tops),
                None => self.scan_exact(queries, scales, coded, range, tops),
            };
            passed.fetch_add(pass.rows, Ordering::Relaxed);
            rescored.fetch_add(pass.rescored, Ordering::Relaxed);
            pass
        };
        if partials.is_empty() && screen.is_none() && coded.is_none() {
            scan_rows(0..rows, None, tops);
        } else {
            let taken = AtomicUsize::new(0);
            let scan = |tops: &mut [TopK]| {
                // After a chunk where a first pass had to score most pairs
                // exactly anyway (rows it cannot tell apart), the next go
                // straight to the exact scan: one, then twice as many after
                // each chunk the pass fails again, so that on rows it cannot
                // thin out the pass is tried on a few chunks only.
                let mut backoff = Backoff::default();
                loop {
                    let start = taken.fetch_add(chunk, Ordering::Relaxed);
                    if start >= rows {
                        break;
                    }
                    let range = start..(start + chunk).min(rows);
                    let failed = match (screen, coded) {
                        _ if backoff.skips() => {
                            scan_rows(range, None, tops);
                            continue;
                        }
                        (Some(screen), _) => {
                            let pairs = range.len() * queries.len();
                            self.scan_through(screen, queries, scales, range, tops) * 2 > pairs
                        }
                        (None, Some(coded)) => {
                            let pass = scan_rows(range, Some(coded), tops);
                            pass.rescored * 2 > pass.rows
                        }
                        (None, None) => {
                            scan_rows(range, None, tops);
                            continue;
                        }
                    };
                    backoff.after(failed);
                }
            };
            on_threads(tops, partials, reset, |tops, _, _| scan(tops));
            merge_each(tops, partials);
        }
        FirstPass { rows: passed.into_inner(), rescored: rescored.into_inner() }
    }
}

/// How many chunks a thread sends straight to the exact scan after its
/// first pass failed: one, then twice as many each time it fails again.
struct Backoff {
    /// Chunks still to skip the first pass.
    exact_chunks: usize,
    /// How many the next failure skips.
    next: usize,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { exact_chunks: 0, next: 1 }
    }
}

impl Backoff {
    /// Whether this chunk skips the first pass (counting it down).
    fn skips(&mut self) -> bool {
        let skips = self.exact_chunks > 0;
        self.exact_chunks = self.exact_chunks.saturating_sub(1);
        skips
    }

    /// After a chunk through the first pass, which `failed` or not.
    fn after(&mut self, failed: bool) {
        if failed {
            (self.exact_chunks, self.next) = (self.next, self.next * 2);
        } else {
            self.next = 1;
        }
    }
}
