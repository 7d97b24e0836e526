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
//! | lone or batch, a products' bound (cosine, ip, l2), or a mask | yes | `coded`: int8 bounds per tile, undecided pairs rescored |
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

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use roaring::RoaringBitmap;

use super::codes::floors::Grids;
use super::codes::{self, Codes, QueryCode};
use super::cpu;
use super::kernels;
use super::metric::Metric;
use super::screen::Screen;
use super::topk::TopK;
pub(super) use coded::Bound;
use coded::{code_queries, Coded, CodedQueries};
use exact::row_tile;
use in_order::InOrder;
use screened::{SCREEN_OVER_CODES_DIMS_MAX, SCREEN_OVER_CODES_QUERIES_MIN, SCREEN_QUERIES_MIN};
use threads::{farthest_for, on_threads};

/// A lone search's query codes for either pass, their buffers kept from
/// search to search.
#[derive(Default)]
pub struct LoneCodes {
    products: QueryCode,
    floors: Grids,
    order: InOrder,
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
    /// A lone search's query codes, their buffers kept.
    code: LoneCodes,
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
            code: LoneCodes::default(),
        }
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
        let pass = index.search_many(queries, ks, tops, &mut self.partials, mask, &mut self.code);
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
        let scale = self.query_scale(|| kernels::squared_norm(query));
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
        code: &mut LoneCodes,
    ) -> FirstPass {
        let rows = mask.map_or(self.len(), |mask| mask.len() as usize);
        let by_size = rows * self.dims / PARALLEL_SCAN_FLOATS_MIN;
        let threads = (partials.len() + 1).min(by_size.max(1));
        let chunk = self.chunk_rows();
        self.search_in_chunks(queries, ks, tops, (&mut partials[..threads - 1], chunk), mask, code)
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
        self.search_in_chunks(queries, ks, tops, (partials, self.chunk_rows()), None, &mut LoneCodes::default());
    }

    /// The int8 first pass's bound and kernel, where the index keeps codes
    /// and the process runs the pass.
    pub(super) fn coded_pass(&self) -> Option<(Bound, cpu::Kernel)> {
        let (_, kernel) = (self.codes?, cpu::paths().int8()?);
        Some((Bound::of(self.metric)?, kernel))
    }

    /// `search_many_split`, the threads taking `chunk` rows at a time, of
    /// which only those in `mask` (if any) are scored; a lone query's code
    /// goes in `code`'s buffers.
    pub(super) fn search_in_chunks(
        &self,
        queries: &[&[f32]],
        ks: &[usize],
        tops: &mut [TopK],
        (partials, chunk): (&mut [Vec<TopK>], usize),
        mask: Option<&RoaringBitmap>,
        code: &mut LoneCodes,
    ) -> FirstPass {
        assert!(queries.len() == ks.len() && ks.len() == tops.len() && chunk > 0);
        let rows = self.len();
        // A mask of every row (which holds rows of this index only) is no
        // mask: the scan need not consult it.
        let mask = mask.filter(|mask| mask.len() as usize != rows);
        let matching = mask.map_or(rows, |mask| mask.len() as usize);
        // A lone search keeps its scale on the stack, and codes its query
        // for the int8 pass in `code`'s buffers. A batch sums each query's
        // squares once, for its scale and for a first pass's bound, and
        // codes its queries for the int8 pass or takes the bfloat16 pass
        // (`SCREEN_QUERIES_MIN`, `SCREEN_OVER_CODES_QUERIES_MIN`).
        let (one, many): ([f32; 1], Vec<f32>);
        let (one_bound, many_bounds, many_codes): ([codes::Bounds; 1], Vec<codes::Bounds>, Vec<QueryCode>);
        let many_grids: Vec<Grids>;
        // Lone: on the stack, so that a lone search allocates nothing.
        let (farthest_one, farthest_many): ([AtomicU32; 1], Vec<AtomicU32>);
        let (mut coded, mut screen) = (None, None);
        let pass = self.coded_pass();
        let scales: &[f32] = if let [query] = queries {
            // The squares are summed only where something needs them: the
            // int8 pass's bound, or cosine's scale.
            let squared = std::cell::OnceCell::new();
            let squared_norm = || *squared.get_or_init(|| kernels::squared_norm(query));
            one = [self.query_scale(squared_norm)];
            farthest_one = [AtomicU32::new(f32::INFINITY.to_bits())];
            let farthest = &farthest_one;
            match pass {
                Some((Bound::Products(shape), kernel)) => {
                    let code = &mut code.products;
                    code.encode(query);
                    one_bound = [codes::Bounds::new(shape, std::slice::from_ref(code), &[squared_norm()], &one)];
                    let queries = CodedQueries::Products { codes: std::slice::from_ref(code), bounds: &one_bound };
                    coded = Some(Coded { kernel, queries, farthest });
                }
                Some((Bound::Floors(floor), kernel)) => {
                    let codes = self.codes.expect("a coded pass has codes");
                    code.floors.encode(floor, codes, query);
                    let queries = CodedQueries::Floors(std::slice::from_ref(&code.floors));
                    coded = Some(Coded { kernel, queries, farthest });
                }
                None => {}
            }
            &one
        } else {
            let squared_norms: Vec<f64> = queries.iter().map(|query| kernels::squared_norm(query)).collect();
            many = squared_norms.iter().map(|&squared| self.query_scale(|| squared)).collect();
            farthest_many = farthest_for(queries.len());
            let farthest = &farthest_many;
            let screen_min = match pass {
                Some(_) if self.dims < SCREEN_OVER_CODES_DIMS_MAX => SCREEN_OVER_CODES_QUERIES_MIN,
                Some(_) => usize::MAX,
                None => SCREEN_QUERIES_MIN,
            };
            // No bfloat16 pass under a mask: the rows it leaves are rarely
            // in tiles worth converting.
            if mask.is_none() && queries.len() >= screen_min && self.metric.is_similarity() {
                screen = Screen::new(queries, &squared_norms, &many, self.dims);
            }
            match (&screen, pass) {
                (None, Some((Bound::Products(shape), kernel))) => {
                    (many_codes, many_bounds) = code_queries((shape, kernel), queries, &squared_norms, &many);
                    coded = Some(Coded {
                        kernel,
                        queries: CodedQueries::Products { codes: &many_codes, bounds: &many_bounds },
                        farthest,
                    });
                }
                (None, Some((Bound::Floors(floor), kernel))) => {
                    let codes = self.codes.expect("a coded pass has codes");
                    many_grids = queries.iter().map(|query| Grids::of(floor, codes, query)).collect();
                    coded = Some(Coded { kernel, queries: CodedQueries::Floors(&many_grids), farthest });
                }
                _ => {}
            }
            &many
        };
        let reset = |tops: &mut [TopK]| {
            for (top, &k) in tops.iter_mut().zip(ks) {
                top.reset(k.min(matching));
            }
        };
        reset(tops);
        let screen = screen.as_ref();
        if let (Some(coded), [query], [top], None, None) = (&coded, queries, &mut *tops, mask, screen) {
            if let CodedQueries::Floors([grids]) = coded.queries {
                let pass = (coded.kernel, grids);
                return self.search_in_order((query, scales), pass, top, (partials, chunk), &mut code.order);
            }
        }
        let (coded, passed, rescored) = (coded.as_ref(), AtomicU64::new(0), AtomicU64::new(0));
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
        let first_pass =
            || FirstPass { rows: passed.load(Ordering::Relaxed), rescored: rescored.load(Ordering::Relaxed) };
        if partials.is_empty() && screen.is_none() && coded.is_none() {
            scan_rows(0..rows, None, tops);
            return first_pass();
        }
        let taken = AtomicUsize::new(0);
        let scan = |tops: &mut [TopK]| {
            // After a chunk where a first pass had to score most pairs
            // exactly anyway (rows it cannot tell apart), the next go
            // straight to the exact scan: one, then twice as many after each
            // chunk the pass fails again, so that on rows it cannot thin out
            // the pass is tried on a few chunks only.
            let (mut exact_chunks, mut backoff) = (0usize, 1);
            loop {
                let start = taken.fetch_add(chunk, Ordering::Relaxed);
                if start >= rows {
                    break;
                }
                let range = start..(start + chunk).min(rows);
                let failed = match (screen, coded) {
                    (Some(screen), _) if exact_chunks == 0 => {
                        let pairs = range.len() * queries.len();
                        self.scan_through(screen, queries, scales, range, tops) * 2 > pairs
                    }
                    (None, Some(coded)) if exact_chunks == 0 => {
                        let pass = scan_rows(range, Some(coded), tops);
                        pass.rescored * 2 > pass.rows
                    }
                    _ => {
                        exact_chunks = exact_chunks.saturating_sub(1);
                        scan_rows(range, None, tops);
                        continue;
                    }
                };
                if failed {
                    (exact_chunks, backoff) = (backoff, backoff * 2);
                } else {
                    backoff = 1;
                }
            }
        };
        on_threads(tops, partials, reset, |tops, _, _| scan(tops));
        for partial in partials {
            for (top, partial) in tops.iter_mut().zip(partial.iter_mut()) {
                for &candidate in partial.sorted() {
                    top.push(candidate);
                }
            }
        }
        first_pass()
    }
}
