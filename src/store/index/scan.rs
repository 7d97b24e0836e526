//! Scanning an index: the exact f32 scan, tiled over queries and rows, the
//! bfloat16 first pass of batches (`screen`), and the split of a large scan
//! across threads. [`Scanner`] holds the policy (how many threads, their
//! scratch tops); callers say what to search and get the nearest rows.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use roaring::RoaringBitmap;

use super::{Index, Metric};
use crate::store::codes::floors::{Floor, Grids};
use crate::store::codes::{self, Codes, QueryCode};
use crate::store::cpu::{self, F32};
use crate::store::kernels::{self, distances};
use crate::store::screen::{self, Screen};
use crate::store::topk::{Candidate, TopK};

/// Below this many floats per thread, one thread scans alone: handing a
/// part to another thread (waking it, and merging its top) costs more than
/// it would save (4 Mi floats is 16 MiB, a few ms).
const PARALLEL_SCAN_FLOATS_MIN: usize = 4 << 20;

/// How far ahead of the tile of rows being scored `search_many` asks for
/// rows from memory, in tiles: far enough that they arrive in time, near
/// enough that they are still in cache when their turn comes.
const PREFETCH_TILES: usize = 4;

/// How far ahead of the rows being decided the int8 pass asks for codes.
const CODES_PREFETCH_ROWS: usize = 16;

/// Pairs a first pass could not rule out wait this many more such pairs
/// before they are scored (`Later`).
const RESCORE_LAG: usize = 8;

/// Rows a thread of a split scan takes at a time, in floats: 4 MiB, a few
/// hundred microseconds of scanning for one query, so that the threads
/// meet the chunk counter a few dozen times per scan of a large index.
const SCAN_CHUNK_FLOATS: usize = 1 << 20;

/// Queries scored together by one tile of `search_many`, and rows per tile
/// with them (`row_tile`): each load then feeds 4 multiply-adds instead of
/// one. With AVX-512's 32 registers the 4 x 4 sums stay in registers; with
/// 16, 4 x 3 do. (Chosen with the `kernels` bench: 4 x 2 up to 6 x 4 and
/// 12 x 1 were tried; the wider tiles gained nothing more, the narrower
/// lost.)
const QUERY_TILE: usize = 4;
const ROW_TILE_WIDE: usize = 4;
const ROW_TILE_NARROW: usize = 3;

/// Rows per tile of `search_many` on the process's path.
fn row_tile() -> usize {
    if cpu::paths().f32() == F32::Avx512 {
        ROW_TILE_WIDE
    } else {
        ROW_TILE_NARROW
    }
}

/// Batches of at least this many searches (of a cosine or inner-product
/// index without int8 codes, or with the int8 pass off) take a first pass
/// in bfloat16 where the CPU has it (`screen`). Fewer are bound by reading
/// the rows, which the pass does not shorten.
const SCREEN_QUERIES_MIN: usize = 4;

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
const SCREEN_OVER_CODES_QUERIES_MIN: usize = 13;
const SCREEN_OVER_CODES_DIMS_MAX: usize = 384;

/// Pairs of a tile left undecided by the bfloat16 pass above which the f32
/// tile scores all its pairs: that costs about what 4 pairs scored alone do.
const SCREEN_WHOLE_TILE_PAIRS: usize = 4;

/// Rows per tile of the bfloat16 pass: each tile of rows is converted once
/// and then scored against every query, `QUERY_TILE` at a time.
const SCREEN_ROW_TILE: usize = 4;

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

/// What `scan_coded_for` scans: queries, their scales, their int8 pass, a
/// mask if any, the rows and the queries' tops.
type CodedScan<'a, 'b> =
    (&'a [&'a [f32]], &'a [f32], &'a Coded<'a>, Option<&'a RoaringBitmap>, Range<usize>, &'b mut [TopK]);

/// The int8 first pass of a search or a batch: the kernel its codes are
/// read with, the queries' side, and each query's farthest kept as the
/// threads of a split scan share it.
struct Coded<'a> {
    kernel: cpu::Kernel,
    queries: CodedQueries<'a>,
    farthest: &'a [AtomicU32],
}

impl Coded<'_> {
    /// The distance query `q`'s rows must beat to enter: the farthest its
    /// `top` keeps, or any other thread's top for it, whichever is nearer
    /// (infinite while none keeps k). A row farther than another thread's
    /// farthest is farther than k rows that thread keeps, so it is not
    /// among the k nearest either.
    #[inline(always)]
    fn threshold(&self, q: usize, top: &TopK) -> f32 {
        threshold_of(&self.farthest[q], top)
    }

    /// Shares `top`'s farthest kept for query `q` (`share_in`).
    #[inline(always)]
    fn share(&self, q: usize, top: &TopK) {
        share_in(&self.farthest[q], top);
    }
}

/// The farthest `top` keeps, or the one `farthest` shares (f32 bits),
/// whichever is nearer.
#[inline(always)]
fn threshold_of(farthest: &AtomicU32, top: &TopK) -> f32 {
    let shared = f32::from_bits(farthest.load(Ordering::Relaxed));
    top.threshold().map_or(shared, |own| own.min(shared))
}

/// Shares `top`'s farthest kept in `farthest`, if nearer than the one
/// shared (the line is written only then). Kept distances are never NaN
/// (`TopK` ranks it as +inf).
#[inline(always)]
fn share_in(farthest: &AtomicU32, top: &TopK) {
    if let Some(own) = top.threshold() {
        let _ = farthest.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |shared| {
            (own < f32::from_bits(shared)).then_some(own.to_bits())
        });
    }
}

/// Runs `work` on `tops`, and on the first `tops.len()` tops of each of
/// `partials` (`reset` first), each with its part's number and how many
/// parts there are: the one way a scan goes onto threads.
///
/// The parts are offered to the threads of rayon's pool, which live as
/// long as the process (`server::run` makes the pool and runs the loop on
/// one of its threads): no thread is started per search, and nothing is
/// allocated (`rayon::join` keeps its jobs on the stack). A part no other
/// thread takes in time runs on the calling thread after its own: the
/// scans share their rows through counters, so a part that starts late
/// finds fewer rows left, and the answer is the same.
fn on_threads(
    tops: &mut [TopK],
    partials: &mut [Vec<TopK>],
    reset: impl Fn(&mut [TopK]) + Sync,
    work: impl Fn(&mut [TopK], usize, usize) + Sync,
) {
    let parts = partials.len() + 1;
    if parts == 1 {
        return work(tops, 0, 1);
    }
    let queries = tops.len();
    let (work, reset) = (&work, &reset);
    rayon::join(|| work(tops, 0, parts), || on_pool(partials, 1, (parts, queries), reset, work));
}

/// `on_threads`' parts `first..` on `partials`, halved until each is one.
fn on_pool(
    partials: &mut [Vec<TopK>],
    first: usize,
    (parts, queries): (usize, usize),
    reset: &(impl Fn(&mut [TopK]) + Sync),
    work: &(impl Fn(&mut [TopK], usize, usize) + Sync),
) {
    match partials {
        [] => {}
        [partial] => {
            let own = &mut partial[..queries];
            reset(own);
            work(own, first, parts);
        }
        _ => {
            let (low, high) = partials.split_at_mut(partials.len() / 2);
            let middle = first + low.len();
            rayon::join(
                || on_pool(low, first, (parts, queries), reset, work),
                || on_pool(high, middle, (parts, queries), reset, work),
            );
        }
    }
}

/// `on_threads` for a lone search: `work` on `top`, and on each of
/// `partials`' first `TopK`, reset to `k`.
fn in_parts(top: &mut TopK, partials: &mut [Vec<TopK>], k: usize, work: impl Fn(&mut TopK, usize, usize) + Sync) {
    let reset = |own: &mut [TopK]| own[0].reset(k);
    on_threads(std::slice::from_mut(top), partials, reset, |tops, part, parts| work(&mut tops[0], part, parts));
}

/// Offers what each of `partials`' first `TopK` kept (`in_parts`) to `top`.
fn merge_partials(top: &mut TopK, partials: &mut [Vec<TopK>]) {
    for partial in partials {
        for &candidate in partial[0].sorted() {
            top.push(candidate);
        }
    }
}

/// Farthest distances (f32 bits) shared by the threads of a split scan,
/// one per query, none kept yet.
fn farthest_for(queries: usize) -> Vec<AtomicU32> {
    (0..queries).map(|_| AtomicU32::new(f32::INFINITY.to_bits())).collect()
}

/// The queries' side of an int8 first pass.
enum CodedQueries<'a> {
    /// Cosine, ip, l2 (`codes`): each query's code, and the bounds of each
    /// tile of `kernel.query_tile()` queries.
    Products { codes: &'a [QueryCode], bounds: &'a [codes::Bounds] },
    /// l1, linf, Bray-Curtis, lp (`codes::floors`): each query's codes.
    Floors(&'a [Grids]),
}

/// Pairs (query, row) a first pass could not rule out, waiting to be
/// scored exactly: each row's f32 values are asked for when it is queued,
/// and scored only `RESCORE_LAG` such pairs later, so that they arrive
/// while the pass goes on instead of stalling the scoring. The answer is
/// the same in any order (`TopK` breaks ties by id); a threshold tightened
/// a few pairs later only scores a few more.
#[derive(Default)]
struct Later {
    pairs: [(usize, usize); RESCORE_LAG],
    /// Pairs queued in all; the next goes to `pairs[queued % RESCORE_LAG]`.
    queued: usize,
    /// Pairs scored or to be, for `FirstPass`.
    rescored: u64,
    /// A lone search's farthest as the threads share it, when last read
    /// (`lone_threshold`), and the tiles of rows since.
    lone_shared: f32,
    lone_tiles: u32,
}

/// A lone search reads the farthest the threads share once in this many
/// tiles of rows, not once a tile: with the atomic load in every tile a
/// search of 1,000,000 x 128 on one thread took 14% longer. A value read a
/// while ago is a distance k rows were within then, so it still rules out
/// only rows that cannot enter.
const SHARED_READ_TILES: u32 = 16;

impl Later {
    /// `Coded::threshold` for a lone search (query 0), the shared part read
    /// afresh every `SHARED_READ_TILES` calls.
    #[inline(always)]
    fn lone_threshold(&mut self, coded: &Coded, top: &TopK) -> f32 {
        // The first call reads it: `lone_tiles` starts at 0.
        if self.lone_tiles.is_multiple_of(SHARED_READ_TILES) {
            self.lone_shared = f32::from_bits(coded.farthest[0].load(Ordering::Relaxed));
        }
        self.lone_tiles = self.lone_tiles.wrapping_add(1);
        let shared = self.lone_shared;
        top.threshold().map_or(shared, |own| own.min(shared))
    }

    /// Queues `pair`; returns the pair queued `RESCORE_LAG` pairs before
    /// it, if any, to be scored now.
    #[inline(always)]
    fn queue(&mut self, pair: (usize, usize)) -> Option<(usize, usize)> {
        let slot = &mut self.pairs[self.queued % RESCORE_LAG];
        let oldest = (self.queued >= RESCORE_LAG).then_some(*slot);
        *slot = pair;
        self.queued += 1;
        oldest
    }

    /// The pairs still queued.
    fn drain(&mut self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let waiting = self.queued.min(RESCORE_LAG);
        (self.queued - waiting..self.queued).map(|n| self.pairs[n % RESCORE_LAG])
    }
}

/// Which int8 first pass an index's searches take.
#[derive(Clone, Copy)]
pub(super) enum Bound {
    Products(codes::Shape),
    Floors(Floor),
}

impl Bound {
    /// The first pass of `metric`'s searches, if a bound is proved for it.
    pub(super) fn of(metric: Metric) -> Option<Bound> {
        Some(match metric {
            Metric::Cosine => Bound::Products(codes::Shape::Cosine),
            Metric::Ip => Bound::Products(codes::Shape::Ip),
            Metric::L2 => Bound::Products(codes::Shape::L2),
            Metric::L1 => Bound::Floors(Floor::L1),
            Metric::Linf => Bound::Floors(Floor::Linf),
            Metric::BrayCurtis => Bound::Floors(Floor::BrayCurtis),
            Metric::Lp(p) => Bound::Floors(Floor::lp(p.get())?),
            Metric::Canberra => Bound::Floors(Floor::Canberra),
            Metric::JensenShannon => Bound::Floors(Floor::JensenShannon),
        })
    }

    /// The grid its codes are on.
    pub(super) fn grid(self) -> codes::Grid {
        match self {
            Bound::Products(_) => codes::Grid::Fitted,
            Bound::Floors(floor) => floor.grid(),
        }
    }
}

/// A lone search's query codes for either pass, their buffers kept from
/// search to search.
#[derive(Default)]
pub struct LoneCodes {
    products: QueryCode,
    floors: Grids,
    order: InOrder,
}

/// The buffers of a lone search that scores rows in the order of their
/// bounds (`Index::search_in_order`), kept from search to search.
#[derive(Default)]
struct InOrder {
    /// Each row's key (f32 bits, `Grids::keys_of`), written by whichever
    /// thread read its codes.
    keys: Vec<AtomicU32>,
    /// The rows of the least keys each thread found.
    least: Vec<usize>,
    /// The rows left to score, with their keys: a few in a thousand on
    /// random rows, every row where the bounds tell none apart (then let
    /// go after the search, past `LEFT_KEPT`).
    left: Vec<(f32, u32)>,
}

/// The most rows `InOrder::left` keeps room for between searches.
const LEFT_KEPT: usize = 1 << 16;

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
const EXACT_SCAN_SHARE: usize = 4;

/// Rows left to score in order from which the threads share them.
const THIRD_STEP_SPLIT_MIN: usize = 64;

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

    /// Searches `index` for each of `queries` at once (`Index::search_many`):
    /// `tops[q]` receives the `ks[q]` nearest to `queries[q]` among the rows
    /// in `mask` (all rows if `None`), exactly as a lone search would find
    /// them.
    pub fn search(
        &mut self,
        index: &Index,
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
        work.code_bytes += pass.rows * index.code_bytes_per_row() as u64;
        work.vector_bytes += (pass.rescored + pairs.saturating_sub(pass.rows)) * (index.dims * 4) as u64;
        if queries.len() > 1 {
            work.batches += 1;
            work.batched_searches += queries.len() as u64;
        }
    }
}

impl Index {
    /// Whether a scan of this index is large enough to be split across
    /// threads: one worth waiting a moment for other searches to join.
    pub fn is_large(&self) -> bool {
        self.vectors.len() >= PARALLEL_SCAN_FLOATS_MIN
    }

    /// Exact search: leaves the `k` nearest rows in `top`. The query must have
    /// passed `prepare_query`.
    pub fn search(&self, query: &[f32], k: usize, top: &mut TopK) {
        self.search_many_split(&[query], &[k], std::slice::from_mut(top), &mut []);
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
    fn search_many(
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
    fn chunk_rows(&self) -> usize {
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
    fn coded_pass(&self) -> Option<(Bound, cpu::Kernel)> {
        let (_, kernel) = (self.codes.as_ref()?, cpu::paths().int8()?);
        Some((Bound::of(self.metric)?, kernel))
    }

    /// `search_many_split`, the threads taking `chunk` rows at a time, of
    /// which only those in `mask` (if any) are scored; a lone query's code
    /// goes in `code`'s buffers.
    fn search_in_chunks(
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
                    let codes = self.codes.as_ref().expect("a coded pass has codes");
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
                    let codes = self.codes.as_ref().expect("a coded pass has codes");
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
    fn search_in_order(
        &self,
        (query, scales): (&[f32], &[f32]),
        (kernel, grids): (cpu::Kernel, &Grids),
        top: &mut TopK,
        (partials, chunk): (&mut [Vec<TopK>], usize),
        order: &mut InOrder,
    ) -> FirstPass {
        let codes = self.codes.as_ref().expect("a coded pass has codes");
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
        let read = |least: &mut TopK| loop {
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
        };
        in_parts(top, partials, k, |least, _, _| read(least));
        // 2. The rows of the least keys, scored.
        order.least.clear();
        order.least.extend(top.sorted().iter().map(|c| c.row as usize));
        for partial in partials.iter_mut() {
            order.least.extend(partial[0].sorted().iter().map(|c| c.row as usize));
        }
        top.reset(k);
        let score = |top: &mut TopK, row: usize| {
            self.scan_tile::<1, 1>(&[query], scales, row..row + 1, std::slice::from_mut(top), &[]);
        };
        // A scored row's key becomes NaN, which no key is (`keys_of`).
        for &row in &order.least {
            score(top, row);
            keys[row].store(f32::NAN.to_bits(), Ordering::Relaxed);
        }
        // 3. The rest not beyond the k-th nearest of those, least key first.
        let within = top.threshold().unwrap_or(f32::INFINITY);
        order.left.clear();
        grids.left_of(codes, keys, within, &mut order.left);
        if order.left.len() > rows / EXACT_SCAN_SHARE {
            // The bounds tell too few rows apart (rows alike): every row's
            // exact scan, in order and in tiles, costs less than scoring
            // these one at a time in the order of their keys.
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
            order.let_go();
            return FirstPass { rows: rows as u64, rescored: rows as u64 };
        }
        order.left.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        // Shared by the threads as `Coded::farthest` is: each takes every
        // `parts`-th row left, least key first.
        let (farthest, rescored) = (AtomicU32::new(within.to_bits()), AtomicUsize::new(order.least.len()));
        let left = &order.left;
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
                score(top, row as usize);
                scored += 1;
                share_in(&farthest, top);
            }
            rescored.fetch_add(scored, Ordering::Relaxed);
        };
        // Handing a part to another thread costs about as much as scoring a
        // few dozen rows.
        let helpers = if left.len() < THIRD_STEP_SPLIT_MIN { &mut [][..] } else { &mut *partials };
        in_parts(top, helpers, k, third);
        merge_partials(top, helpers);
        order.let_go();
        FirstPass { rows: rows as u64, rescored: rescored.into_inner() as u64 }
    }

    /// Asks for row `row`'s values to be brought into cache.
    #[inline(always)]
    fn prefetch_row(&self, row: usize) {
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
    fn scan_masked(
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

    /// `scan_screened`, which a `Screen` makes safe to call. Returns how
    /// many pairs the pass scored exactly.
    fn scan_through(
        &self,
        screen: &Screen,
        queries: &[&[f32]],
        scales: &[f32],
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> usize {
        // SAFETY: a `Screen` is only made where the CPU has both features.
        #[cfg(target_arch = "x86_64")]
        return unsafe { self.scan_screened(queries, scales, screen, rows, tops) };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (screen, queries, scales, rows, tops);
            unreachable!("a `Screen` is only made on x86-64")
        }
    }

    /// Offers every row of `rows` to the tops of the queries: a tile of rows
    /// at a time, each scored against the queries a tile of them at a time;
    /// with `coded`, through the int8 pass instead (`scan_coded`).
    fn scan_exact(
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
    fn scan_tiles<const R: usize>(&self, queries: &[&[f32]], scales: &[f32], rows: Range<usize>, tops: &mut [TopK]) {
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

    /// `scan_coded` or `scan_coded_masked` compiled for the
    /// instructions of `coded`'s kernel, so that what they inline (the
    /// bounds' f64 arithmetic among it) uses them too, in a build for any
    /// x86-64. The answers do not change: Rust neither fuses nor reorders
    /// float operations, so wider vectors compute the same values.
    fn scan_coded_for(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: &Coded,
        mask: Option<&RoaringBitmap>,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        let scan = (queries, scales, coded, mask, rows, tops);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Kernel` exists only where the CPU has its
        // instructions (`Kernel::on_this_cpu`).
        unsafe {
            match coded.kernel.isa() {
                cpu::Int8::Vnni512 => self.scan_coded_vnni512(scan),
                cpu::Int8::Vnni256 => self.scan_coded_vnni256(scan),
                cpu::Int8::Avx2 => self.scan_coded_avx2(scan),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.scan_coded_any(scan)
    }

    /// `scan_coded_any` compiled for `Kernel::Vnni512`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn scan_coded_vnni512(&self, scan: CodedScan) -> FirstPass {
        self.scan_coded_any(scan)
    }

    /// `scan_coded_any` compiled for `Kernel::Vnni256`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and AVX-VNNI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn scan_coded_vnni256(&self, scan: CodedScan) -> FirstPass {
        self.scan_coded_any(scan)
    }

    /// `scan_coded_any` compiled for `Kernel::Avx2`.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn scan_coded_avx2(&self, scan: CodedScan) -> FirstPass {
        self.scan_coded_any(scan)
    }

    /// `scan_coded`, or `scan_coded_masked` under a mask.
    #[inline(always)]
    fn scan_coded_any(&self, (queries, scales, coded, mask, rows, tops): CodedScan) -> FirstPass {
        match mask {
            Some(mask) => self.scan_coded_masked(queries, scales, coded, mask, rows, tops),
            None => self.scan_coded(queries, scales, coded, rows, tops),
        }
    }

    /// `rows` through the int8 pass (`codes`), for each query: the codes
    /// of `ROWS` rows at a time give each pair an interval holding its exact
    /// score, and only a pair whose interval can still beat the farthest
    /// its query's top keeps is scored exactly, as the f32 scan scores it
    /// (`scan_tile`), so the answer is the f32 scan's, bit for bit. A batch
    /// takes its queries a tile at a time over each tile of rows, whose codes stay
    /// in L1 meanwhile. Counts pairs: rows times queries.
    #[inline(always)]
    fn scan_coded(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: &Coded,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        let codes = self.codes.as_ref().expect("a coded scan is of an index with codes");
        let mut later = Later::default();
        let mut row = rows.start;
        while row + codes::ROWS <= rows.end {
            let ahead: [usize; codes::ROWS] = std::array::from_fn(|r| row + CODES_PREFETCH_ROWS + r);
            self.coded_rows::<{ codes::ROWS }>(
                queries,
                scales,
                coded,
                (codes, std::array::from_fn(|r| row + r), &ahead),
                tops,
                &mut later,
            );
            row += codes::ROWS;
        }
        for row in row..rows.end {
            self.coded_rows(queries, scales, coded, (codes, [row], &[]), tops, &mut later);
        }
        FirstPass {
            rows: (rows.len() * queries.len()) as u64,
            rescored: self.rescore_all((queries, scales), tops, coded, later),
        }
    }

    /// `scan_coded` of the rows of `mask` within `rows`, taken `ROWS` at a
    /// time wherever they are: a sparse mask costs what its rows cost, not
    /// a call per run of consecutive rows.
    #[inline(always)]
    fn scan_coded_masked(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: &Coded,
        mask: &RoaringBitmap,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        const BLOCK: usize = 64;
        let codes = self.codes.as_ref().expect("a coded scan is of an index with codes");
        let mut matching = mask.iter();
        matching.advance_to(rows.start as u32);
        let mut matching = matching.map(|row| row as usize).take_while(|&row| row < rows.end);
        let (mut block, mut passed, mut later) = ([0usize; BLOCK], 0, Later::default());
        loop {
            let taken = block.iter_mut().zip(&mut matching).map(|(slot, row)| *slot = row).count();
            let block = &block[..taken];
            for &row in block.iter().take(CODES_PREFETCH_ROWS) {
                codes.prefetch(row, 1);
            }
            let mut at = 0;
            while at + codes::ROWS <= block.len() {
                let ahead = block.get(at + CODES_PREFETCH_ROWS..).unwrap_or_default();
                self.coded_rows::<{ codes::ROWS }>(
                    queries,
                    scales,
                    coded,
                    (codes, std::array::from_fn(|r| block[at + r]), &ahead[..ahead.len().min(codes::ROWS)]),
                    tops,
                    &mut later,
                );
                at += codes::ROWS;
            }
            for &row in &block[at..] {
                self.coded_rows(queries, scales, coded, (codes, [row], &[]), tops, &mut later);
            }
            passed += block.len();
            if block.len() < BLOCK {
                break;
            }
        }
        FirstPass {
            rows: (passed * queries.len()) as u64,
            rescored: self.rescore_all((queries, scales), tops, coded, later),
        }
    }

    /// The int8 pass of `rows` (of `codes`) for every query: their integer
    /// products, a tile of queries at a time (`Kernel::query_tile`), their
    /// bounds against each query's farthest kept, and the pairs those cannot
    /// rule out scored exactly (`later`). The codes of the rows
    /// `ahead` are asked for meanwhile, one row per tile of queries (all at
    /// once stalls on the lines in flight) and the rest after the last.
    #[inline(always)]
    fn coded_rows<const R: usize>(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: &Coded,
        (codes, rows, ahead): (&Codes, [usize; R], &[usize]),
        tops: &mut [TopK],
        later: &mut Later,
    ) {
        let (query_codes, tile_bounds) = match coded.queries {
            CodedQueries::Products { codes, bounds } => (codes, bounds),
            CodedQueries::Floors(grids) => {
                // One query at a time: each row may want another of the
                // query's codes (one per scale).
                for &row in ahead {
                    codes.prefetch(row, 1);
                }
                for (q, grids) in grids.iter().enumerate() {
                    let ruled = grids.rules_out(coded.kernel, codes, rows, coded.threshold(q, &tops[q]));
                    self.rescore_later((queries, scales, q), rows, ruled, (tops, coded), later);
                }
                return;
            }
        };
        let norms = rows.map(|row| self.norms[row]);
        let row_scales = match self.metric {
            Metric::Cosine => rows.map(|row| self.inverse_norms[row]),
            _ => [1.0; R],
        };
        let rows = (codes, rows, norms, row_scales);
        if let ([_], [bounds]) = (&*tops, tile_bounds) {
            // A lone search takes its own straight path: inside the loop
            // that serves every tile shape below, searches of 1,000 x 128
            // took a third longer.
            for &row in ahead {
                codes.prefetch(row, 1);
            }
            let thresholds = [later.lone_threshold(coded, &tops[0])];
            let [ruled] = self.coded_tile::<1, R>(query_codes, (coded.kernel, bounds), rows, thresholds);
            self.rescore_later((queries, scales, 0), rows.1, ruled, (tops, coded), later);
            return;
        }
        let tile = coded.kernel.query_tile();
        let mut asked = 0;
        for (at, bounds) in tile_bounds.iter().enumerate() {
            if let Some(&row) = ahead.get(at) {
                codes.prefetch(row, 1);
                asked += 1;
            }
            let first = at * tile;
            let (codes_of, in_tile) = (&query_codes[first..], tile.min(tops.len() - first));
            let kernel = (coded.kernel, bounds);
            // A loop, not `array::from_fn`: that was called out of line
            // (leaving the kernel's instructions) once per tile, a tenth of
            // a batch's time.
            let mut t = [f32::INFINITY; codes::QUERIES_MAX];
            for (q, t) in t.iter_mut().enumerate().take(in_tile) {
                *t = coded.threshold(first + q, &tops[first + q]);
            }
            let mut ruled = [0u32; codes::QUERIES_MAX];
            match in_tile {
                4 => ruled[..4].copy_from_slice(&self.coded_tile::<4, R>(
                    codes_of,
                    kernel,
                    rows,
                    [t[0], t[1], t[2], t[3]],
                )),
                3 => ruled[..3].copy_from_slice(&self.coded_tile::<3, R>(codes_of, kernel, rows, [t[0], t[1], t[2]])),
                2 => ruled[..2].copy_from_slice(&self.coded_tile::<2, R>(codes_of, kernel, rows, [t[0], t[1]])),
                _ => ruled[..1].copy_from_slice(&self.coded_tile::<1, R>(codes_of, kernel, rows, [t[0]])),
            }
            for (q, &ruled) in (first..).zip(&ruled[..in_tile]) {
                self.rescore_later((queries, scales, q), rows.1, ruled, (tops, coded), later);
            }
        }
        for &row in ahead.get(asked..).unwrap_or_default() {
            codes.prefetch(row, 1);
        }
    }

    /// `coded_rows` for the `Q` queries whose codes start `query_codes`,
    /// with the `kernel` and their `bounds`, against the distances each
    /// must beat (`Coded::threshold`): for each query, which of `rows` it
    /// rules out (bit `r` for `rows[r]`).
    #[inline(always)]
    fn coded_tile<const Q: usize, const R: usize>(
        &self,
        query_codes: &[QueryCode],
        (kernel, bounds): (cpu::Kernel, &codes::Bounds),
        (codes, rows, norms, row_scales): (&Codes, [usize; R], [f32; R], [f32; R]),
        thresholds: [f32; Q],
    ) -> [u32; Q] {
        let tile: [&QueryCode; Q] = std::array::from_fn(|q| &query_codes[q]);
        let dots = kernel.dots_tile(tile, codes, rows);
        bounds.rules_out(codes, rows, dots, (norms, row_scales), thresholds)
    }

    /// Queues query `q` with each of `rows` a first pass could not rule out
    /// (bit `r` of `ruled` clear) to be scored exactly (`Later`), scoring
    /// the pairs queued longest ago to make room.
    #[inline(always)]
    fn rescore_later<const R: usize>(
        &self,
        (queries, scales, q): (&[&[f32]], &[f32], usize),
        rows: [usize; R],
        ruled: u32,
        (tops, coded): (&mut [TopK], &Coded),
        later: &mut Later,
    ) {
        let mut left = !ruled & ((1 << R) - 1);
        later.rescored += u64::from(left.count_ones());
        while left != 0 {
            let row = rows[left.trailing_zeros() as usize];
            left &= left - 1;
            self.prefetch_row(row);
            if let Some((q, row)) = later.queue((q, row)) {
                self.rescore((queries, scales), (q, row), tops, coded);
            }
        }
    }

    /// Scores every pair still queued in `later`; returns how many pairs it
    /// queued in all.
    fn rescore_all(&self, queries: (&[&[f32]], &[f32]), tops: &mut [TopK], coded: &Coded, mut later: Later) -> u64 {
        for pair in later.drain() {
            self.rescore(queries, pair, tops, coded);
        }
        later.rescored
    }

    /// Scores query `q` exactly against row `row`, offering it to its top,
    /// and shares the top's farthest kept (`Coded::share`).
    #[inline(always)]
    fn rescore(
        &self,
        (queries, scales): (&[&[f32]], &[f32]),
        (q, row): (usize, usize),
        tops: &mut [TopK],
        coded: &Coded,
    ) {
        let top = std::slice::from_mut(&mut tops[q]);
        self.scan_tile::<1, 1>(&queries[q..=q], &scales[q..=q], row..row + 1, top, &[]);
        coded.share(q, &tops[q]);
    }

    /// The rows of the tile `PREFETCH_TILES` ahead of the one of `tile_rows`
    /// rows at `row` (not past `end`), in one share per tile of `queries`
    /// queries: each query tile asks for its share, so that the prefetching
    /// overlaps their arithmetic instead of stalling all at once.
    fn prefetch_shares(&self, row: usize, tile_rows: usize, end: usize, queries: usize) -> std::slice::Chunks<'_, f32> {
        let ahead = (row + PREFETCH_TILES * tile_rows).min(end);
        let ahead = &self.vectors[ahead * self.dims..(ahead + tile_rows).min(end) * self.dims];
        let share = ahead.len().div_ceil(queries.div_ceil(QUERY_TILE)).next_multiple_of(kernels::LINE_FLOATS);
        ahead.chunks(share.max(1))
    }

    /// Cosine: 1/|query|, from the query's `squared_norm` (asked for only
    /// here). Scaling the query does not change the order; doing it once
    /// keeps the similarities comparable in magnitude to 1.
    fn query_scale(&self, squared_norm: impl FnOnce() -> f64) -> f32 {
        match self.metric {
            Metric::Cosine => kernels::inverse_norm_of(squared_norm()),
            _ => 1.0,
        }
    }

    /// Scores `Q` queries (with their `scales`) against `rows`, `R` rows at a
    /// time, and offers each row to each query's top; first asks for
    /// `prefetch` to be fetched meanwhile.
    fn scan_tile<const Q: usize, const R: usize>(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        rows: Range<usize>,
        tops: &mut [TopK],
        prefetch: &[f32],
    ) {
        let queries: &[&[f32]; Q] = queries.try_into().expect("a tile of Q queries");
        let scales: &[f32; Q] = scales.try_into().expect("a scale per query");
        match self.metric {
            Metric::Cosine => {
                self.scan_tile_with::<kernels::Dot, Q, R>(queries, rows, tops, prefetch, |score, row, q| {
                    screen::distance(score, self.inverse_norms[row], scales[q])
                })
            }
            Metric::Ip => {
                self.scan_tile_with::<kernels::Dot, Q, R>(queries, rows, tops, prefetch, |score, _, _| -score)
            }
            Metric::L2 => {
                self.scan_tile_with::<kernels::L2Squared, Q, R>(queries, rows, tops, prefetch, |score, _, _| score)
            }
            Metric::L1 => self.scan_pairs(queries, rows, tops, prefetch, distances::l1),
            Metric::Linf => self.scan_pairs(queries, rows, tops, prefetch, distances::linf),
            Metric::Lp(p) => self.scan_pairs(queries, rows, tops, prefetch, |q, r| distances::lp(q, r, p.get())),
            Metric::Canberra => self.scan_pairs(queries, rows, tops, prefetch, distances::canberra),
            Metric::BrayCurtis => self.scan_pairs(queries, rows, tops, prefetch, distances::bray_curtis),
            Metric::JensenShannon => self.scan_pairs(queries, rows, tops, prefetch, distances::jensen_shannon),
        }
    }

    /// `scan_tile` for the distances of `kernels::distances`, which score
    /// one pair at a time: a row is read from memory once, for the first
    /// query, and from L1 for the others; `prefetch` is asked for first,
    /// as `scan_tile_with` does.
    #[inline(always)]
    fn scan_pairs(
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

    /// `scan_exact` with the bfloat16 pass (`screen`'s doc): the rows are
    /// converted a tile at a time, each tile scored against every query in
    /// bfloat16, and a pair scored exactly (as `scan_exact` would) only where
    /// the bound cannot rule it out. Returns how many pairs were.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn scan_screened(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        screen: &Screen,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> usize {
        const R: usize = SCREEN_ROW_TILE;
        let dims = self.dims;
        let mut converted = vec![screen::Block::default(); R * screen.blocks()];
        let mut rescored = 0;
        let mut row = rows.start;
        while row + R <= rows.end {
            for (r, blocks) in converted.chunks_exact_mut(screen.blocks()).enumerate() {
                screen::convert(&self.vectors[(row + r) * dims..(row + r + 1) * dims], blocks);
            }
            let row_scales = match self.metric {
                Metric::Cosine => self.inverse_norms[row..row + R].try_into().expect("R rows"),
                Metric::Ip => [1.0; R],
                _ => unreachable!("the bfloat16 pass bounds dot products only"),
            };
            let mut prefetches = self.prefetch_shares(row, R, rows.end, queries.len());
            let tiles = (0..).step_by(QUERY_TILE).zip(tops.chunks_mut(QUERY_TILE));
            for (first, tops) in tiles {
                kernels::prefetch(prefetches.next().unwrap_or_default());
                let tile = ScreenTile { queries, screen, first, row, converted: &converted, row_scales: &row_scales };
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
    fn screen_tile<const Q: usize, const R: usize>(&self, tile: ScreenTile<R>, tops: &mut [TopK]) -> usize {
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

    /// `scan_tile` for one measure; `distance(score, row, q)` turns a score
    /// into the distance the tops order by (smaller is nearer). Runs the
    /// kernels of the process's path (`cpu`).
    #[inline(always)]
    fn scan_tile_with<M: kernels::Measure, const Q: usize, const R: usize>(
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
    unsafe fn scan_tile_avx512<M: kernels::Measure, const Q: usize, const R: usize>(
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
    unsafe fn scan_tile_avx2<M: kernels::Measure, const Q: usize, const R: usize>(
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
    unsafe fn scan_tile_in<
        L: kernels::Lanes<N>,
        const N: usize,
        M: kernels::Measure,
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

/// What `scan_tile_in` scores: `Q` queries against `rows`, into `tops`,
/// asking for `prefetch` first.
struct Tile<'a, const Q: usize> {
    queries: &'a [&'a [f32]; Q],
    rows: Range<usize>,
    tops: &'a mut [TopK],
    prefetch: &'a [f32],
}

/// What `screen_tile` scores: queries `first..` against the `R` rows from
/// `row`, which are `converted` to bfloat16 and scale their scores by
/// `row_scales` (see `screen::distance`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct ScreenTile<'a, const R: usize> {
    queries: &'a [&'a [f32]],
    screen: &'a Screen,
    first: usize,
    row: usize,
    converted: &'a [screen::Block],
    row_scales: &'a [f32; R],
}

#[inline(always)]
/// Each query's code for the int8 pass, and the bounds of each tile of
/// the kernel's queries, from their `squared_norms` and `scales`.
fn code_queries(
    (shape, kernel): (codes::Shape, cpu::Kernel),
    queries: &[&[f32]],
    squared_norms: &[f64],
    scales: &[f32],
) -> (Vec<QueryCode>, Vec<codes::Bounds>) {
    let codes: Vec<QueryCode> = queries.iter().map(|query| QueryCode::of(query)).collect();
    let tile = kernel.query_tile();
    let bounds = (codes.chunks(tile).zip(squared_norms.chunks(tile)).zip(scales.chunks(tile)))
        .map(|((codes, squared), scales)| codes::Bounds::new(shape, codes, squared, scales))
        .collect();
    (codes, bounds)
}

fn offer(top: &mut TopK, distance: f32, id: i64, row: usize) {
    if let Some(threshold) = top.threshold() {
        // Strictly farther than the farthest kept: cannot enter (ties still
        // go to `push`, which breaks them by id).
        if distance > threshold {
            return;
        }
    }
    top.push(Candidate { distance, id, row: row as u32 });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The ids of the `k` nearest to `query`, nearest first.
    pub(crate) fn ids_of(index: &Index, query: &[f32], k: usize) -> Vec<i64> {
        let mut top = TopK::new();
        index.search(query, k, &mut top);
        top.sorted().iter().map(|c| c.id).collect()
    }

    #[test]
    fn metrics_rank_as_documented() {
        let mut cosine = Index::new(2, Metric::Cosine);
        let mut ip = Index::new(2, Metric::Ip);
        let mut l2 = Index::new(2, Metric::L2);
        for (id, v) in [(1, [1.0, 0.0]), (2, [10.0, 1.0]), (3, [0.0, 1.0])] {
            cosine.upsert(id, &v, b"");
            ip.upsert(id, &v, b"");
            l2.upsert(id, &v, b"");
        }
        assert_eq!(ids_of(&cosine, &[1.0, 0.0], 3), vec![1, 2, 3]);
        assert_eq!(ids_of(&ip, &[1.0, 0.0], 3), vec![2, 1, 3]);
        assert_eq!(ids_of(&l2, &[1.0, 0.0], 3), vec![1, 3, 2]);
    }

    /// A masked scan finds, for each query, exactly the nearest rows among
    /// those in the mask (brute force over the mask's rows), lone and in a
    /// batch, on one thread and split across threads taking a few rows at
    /// a time, whatever the mask's runs look like.
    #[test]
    fn a_mask_keeps_exactly_its_rows() {
        for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
            let dims = 13;
            let mut index = Index::new(dims, metric);
            for id in 0..300i64 {
                let row: Vec<f32> = (0..dims as i64).map(|d| ((id * 37 + d * 11) % 29) as f32 - 14.0).collect();
                index.upsert(id * 3 - 100, &row, b"");
            }
            let queries: Vec<Vec<f32>> = (0..6)
                .map(|q| {
                    let mut query: Vec<f32> = (0..dims as i64).map(|d| ((q * 7 + d * 5) % 13) as f32 - 6.0).collect();
                    index.prepare_query(&mut query).unwrap();
                    query
                })
                .collect();
            let masks: [Vec<u32>; 4] = [
                vec![],
                vec![7],
                (0..300).filter(|r| r % 3 != 1).collect(),
                (20..60).chain(61..62).chain(200..299).collect(),
            ];
            for rows in &masks {
                let mask: RoaringBitmap = rows.iter().copied().collect();
                for k in [1, 5, 400] {
                    let mut alone = Vec::new();
                    for query in &queries {
                        // Brute force: each masked row scored alone.
                        let mut want = TopK::new();
                        want.reset(k.min(rows.len()));
                        for &row in rows {
                            index.scan_exact(
                                &[query],
                                &[index.query_scale(|| kernels::squared_norm(query))],
                                None,
                                row as usize..row as usize + 1,
                                std::slice::from_mut(&mut want),
                            );
                        }
                        let want: Vec<Candidate> = want.sorted().to_vec();
                        let mut top = TopK::new();
                        Scanner::with_threads(1).search(
                            &index,
                            &[query],
                            &[k],
                            std::slice::from_mut(&mut top),
                            Some(&mask),
                        );
                        assert_eq!(top.sorted(), &want[..], "{metric:?}, k {k}, {} rows", rows.len());
                        alone.push(want);
                    }
                    let refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                    let ks = vec![k; refs.len()];
                    for (threads, chunk) in [(1, 1000), (3, 7), (2, 1)] {
                        let mut tops: Vec<TopK> = refs.iter().map(|_| TopK::new()).collect();
                        let mut partials: Vec<Vec<TopK>> =
                            (1..threads).map(|_| refs.iter().map(|_| TopK::new()).collect()).collect();
                        index.search_in_chunks(
                            &refs,
                            &ks,
                            &mut tops,
                            (&mut partials, chunk),
                            Some(&mask),
                            &mut LoneCodes::default(),
                        );
                        for (top, want) in tops.iter_mut().zip(&alone) {
                            assert_eq!(top.sorted(), &want[..], "{metric:?}, k {k}, {threads} threads, chunk {chunk}");
                        }
                    }
                }
            }
        }
    }

    /// `count` patterned vectors of `dims`, each under two ids (`twins_of`).
    fn twins(dims: usize, count: i64, metric: Metric) -> Index {
        let vectors: Vec<Vec<f32>> =
            (0..count).map(|id| (0..dims as i64).map(|d| ((id * 31 + d * 17) % 23) as f32 - 11.5).collect()).collect();
        twins_of(&vectors, metric)
    }

    /// Searches `queries` at once, each for its `k` nearest, on
    /// `partials.len() + 1` threads taking `chunk` rows at a time, and
    /// asserts that each finds exactly what it finds alone.
    fn assert_split_finds_what_each_finds_alone(
        index: &Index,
        queries: &[&[f32]],
        k: usize,
        partials: &mut [Vec<TopK>],
        chunk: usize,
    ) {
        let ks = vec![k; queries.len()];
        let mut split: Vec<TopK> = queries.iter().map(|_| TopK::new()).collect();
        index.search_in_chunks(queries, &ks, &mut split, (partials, chunk), None, &mut LoneCodes::default());
        let mut alone = TopK::new();
        for (query, split) in queries.iter().zip(&mut split) {
            index.search(query, k, &mut alone);
            let what = format!("{:?}, {} threads, k {k}, chunk {chunk}", index.metric, partials.len() + 1);
            assert_eq!(split.sorted(), alone.sorted(), "{what}");
        }
    }

    #[test]
    fn a_split_scan_finds_exactly_what_one_thread_finds() {
        let queries = [[1.0, -2.0, 0.5, 3.0, -1.0], [0.0, 1.0, 2.0, -3.0, 4.0], [2.0, 2.0, -2.0, 0.5, 1.0]];
        let queries: Vec<&[f32]> = queries.iter().map(|q| q.as_slice()).collect();
        for metric in [Metric::Cosine, Metric::L2, Metric::Ip] {
            let index = twins(5, 997, metric);
            for threads in 2..=5 {
                let mut partials: Vec<Vec<TopK>> =
                    (1..threads).map(|_| (0..3).map(|_| TopK::new()).collect()).collect();
                // One query, then three at once; chunks of one row, of a few
                // tiles and a bit, and of more than the index holds.
                for (k, count) in [1, 10, 500, 5000].into_iter().flat_map(|k| [(k, 1), (k, 3)]) {
                    for chunk in [1, 4 * row_tile() + 1, 1 << 20] {
                        assert_split_finds_what_each_finds_alone(&index, &queries[..count], k, &mut partials, chunk);
                    }
                }
            }
        }
    }

    #[test]
    fn many_searches_at_once_find_exactly_what_each_finds_alone() {
        for metric in [Metric::Cosine, Metric::L2, Metric::Ip] {
            let index = twins(300, 700, metric);
            let queries: Vec<Vec<f32>> =
                (0..9).map(|q| (0..300).map(|d| ((q * 7 + d * 3) % 11) as f32 - 5.0).collect()).collect();
            let ks = [1, 10, 700, 2000, 3, 1, 5, 10, 64];
            // 2 to 9 queries: every mix of full and partial query tiles.
            for count in 2..=9 {
                let queries: Vec<&[f32]> = queries[..count].iter().map(Vec::as_slice).collect();
                for threads in 1..4 {
                    let mut tops: Vec<TopK> = (0..count).map(|_| TopK::new()).collect();
                    let mut partials: Vec<Vec<TopK>> =
                        (1..threads).map(|_| (0..count).map(|_| TopK::new()).collect()).collect();
                    index.search_many_split(&queries, &ks[..count], &mut tops, &mut partials);
                    let mut alone = TopK::new();
                    for (q, top) in tops.iter_mut().enumerate() {
                        index.search(queries[q], ks[q], &mut alone);
                        assert_eq!(top.sorted(), alone.sorted(), "{metric:?} query {q} of {count}, threads {threads}");
                    }
                }
            }
        }
    }

    /// `count` random vectors of `dims` in [-1, 1), from `seed`.
    #[cfg(target_arch = "x86_64")]
    fn random_vectors(seed: u64, dims: usize, count: usize) -> Vec<Vec<f32>> {
        kernels::tests::floats(seed, dims * count).chunks_exact(dims).map(<[f32]>::to_vec).collect()
    }

    /// Each of `vectors` under two ids (`i` and `i + len`), so that ties
    /// have to break the same way.
    fn twins_of(vectors: &[Vec<f32>], metric: Metric) -> Index {
        let mut index = Index::new(vectors[0].len(), metric);
        for (id, v) in (0..).zip(vectors) {
            index.upsert(id, v, b"");
            index.upsert(vectors.len() as i64 + id, v, b"");
        }
        index
    }

    /// A batch through the bfloat16 pass against each search alone, on
    /// random rows (where the pass rules most pairs out) and on a crowd of
    /// rows around one point (where bfloat16 cannot tell the nearest apart,
    /// so that the exact pass has to).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_bfloat16_pass_finds_exactly_what_each_search_finds_alone() {
        for metric in [Metric::Cosine, Metric::Ip] {
            for dims in [100, 768] {
                let random = random_vectors(1, dims, 1000);
                let center = &random[0];
                let crowd: Vec<Vec<f32>> = random_vectors(2, dims, 1000)
                    .iter()
                    .map(|noise| center.iter().zip(noise).map(|(c, n)| c + 0.001 * n).collect())
                    .collect();
                for (data, vectors) in [("random", random.clone()), ("crowd", crowd)] {
                    let index = twins_of(&vectors, metric);
                    // Stored rows (each tied with its twin) and blends of two.
                    let queries: Vec<Vec<f32>> = (0..9)
                        .map(|q| {
                            let (a, b) = (&random[q * 97], &random[q * 31 + 5]);
                            a.iter().zip(b).map(|(a, b)| if q % 3 == 0 { *a } else { a - 0.5 * b }).collect()
                        })
                        .collect();
                    let what = format!("{metric:?}, {dims} dims, {data}");
                    let Some(rescored) = assert_screened_finds_what_each_finds_alone(&index, &queries, &what) else {
                        return;
                    };
                    // Where rows are apart, the pass must rule most pairs
                    // out, or it only costs time.
                    let pairs = queries.len() * index.len();
                    if data == "random" {
                        assert!(rescored * 10 < pairs, "{what}: {rescored} of {pairs} pairs scored twice");
                    }
                }
            }
        }
    }

    /// Searches `queries` at once through the bfloat16 pass and asserts
    /// that each finds exactly what it finds alone. Returns how many pairs
    /// were scored exactly; `None`, recorded as a skip, where the CPU has
    /// no pass (and fails if it has one, but the pass was not made).
    #[cfg(target_arch = "x86_64")]
    fn assert_screened_finds_what_each_finds_alone(index: &Index, queries: &[Vec<f32>], what: &str) -> Option<usize> {
        let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
        let ks = [1, 10, 10, 5, 20, 10, 3, 10, 40];
        let squared_norms: Vec<f64> = queries.iter().map(|q| kernels::squared_norm(q)).collect();
        let scales: Vec<f32> = squared_norms.iter().map(|&squared| index.query_scale(|| squared)).collect();
        let Some(screen) = Screen::new(&queries, &squared_norms, &scales, index.dims()) else {
            assert!(!crate::testing::cpu_has_bf16(), "this CPU has AVX512-BF16, yet the pass was not made");
            crate::testing::skip(&format!("the bfloat16 pass, {what}"), "this CPU has no AVX512-BF16");
            return None;
        };
        let mut tops: Vec<TopK> = ks.iter().map(|_| TopK::new()).collect();
        for (top, &k) in tops.iter_mut().zip(&ks) {
            top.reset(k);
        }
        // SAFETY: `Screen::new` found the features.
        let rescored = unsafe { index.scan_screened(&queries, &scales, &screen, 0..index.len(), &mut tops) };
        let mut alone = TopK::new();
        for (q, top) in tops.iter_mut().enumerate() {
            index.search(queries[q], ks[q], &mut alone);
            assert_eq!(top.sorted(), alone.sorted(), "{what}, query {q}");
        }
        // In small chunks on one and two threads: chunks through the pass
        // and chunks straight to the exact scan, where the pass falls back.
        for threads in 1..=2 {
            for chunk in [8, 100] {
                let mut partials: Vec<Vec<TopK>> =
                    (1..threads).map(|_| queries.iter().map(|_| TopK::new()).collect()).collect();
                index.search_in_chunks(
                    &queries,
                    &ks,
                    &mut tops,
                    (&mut partials, chunk),
                    None,
                    &mut LoneCodes::default(),
                );
                for (q, top) in tops.iter_mut().enumerate() {
                    index.search(queries[q], ks[q], &mut alone);
                    assert_eq!(top.sorted(), alone.sorted(), "{what}, query {q}, {threads} threads, chunk {chunk}");
                }
            }
        }
        Some(rescored)
    }

    /// Rows and queries across the numeric domain: norms from 2^-62 to
    /// 2^62, tiny and huge components side by side, signs that cancel.
    fn extreme_vectors(seed: u64, dims: usize, count: usize, metric: Metric) -> Vec<Vec<f32>> {
        let scales = [3e-19f32, 1e-18, 1e-9, 1.0, 1e9, 1e17];
        let noise = kernels::tests::floats(seed, dims * count);
        noise
            .chunks_exact(dims)
            .enumerate()
            .map(|(n, v)| {
                let norm = scales[n % scales.len()];
                let scale = norm / (dims as f32).sqrt();
                let mut v: Vec<f32> =
                    v.iter().enumerate().map(|(i, x)| x * scale * if (i + n) % 3 == 0 { 1e-6 } else { 1.0 }).collect();
                v[n % dims] = norm;
                let [v] = fit_for(metric, vec![v]).try_into().expect("one vector");
                let index = Index::new(dims, metric);
                assert_eq!(index.check_vector(&v), Ok(()), "test data inside the domain");
                v
            })
            .collect()
    }

    #[test]
    fn prepared_queries_keep_every_cosine_distance_bit_for_bit() {
        let vectors = random_vectors(3, 37, 50);
        let index = twins_of(&vectors, Metric::Cosine);
        for (q, query) in random_vectors(4, 37, 6).into_iter().enumerate() {
            let mut prepared = query.iter().map(|x| x * 2f32.powi(q as i32 * 7 - 20)).collect::<Vec<f32>>();
            index.prepare_query(&mut prepared).unwrap();
            let norm = kernels::squared_norm(&prepared).sqrt();
            assert!((1.0..2.0).contains(&norm), "{norm}");
            let (mut plain, mut scaled) = (TopK::new(), TopK::new());
            index.search(&query, 100, &mut plain);
            index.search(&prepared, 100, &mut scaled);
            assert_eq!(plain.sorted(), scaled.sorted(), "query {q}");
        }
    }

    /// Batches of prepared queries at extreme magnitudes: split, tiled and
    /// (where the CPU has it) through the bfloat16 pass, each answer is the
    /// answer alone.
    #[test]
    fn batches_at_extreme_magnitudes_find_exactly_what_each_finds_alone() {
        for metric in [Metric::Cosine, Metric::L2, Metric::Ip] {
            for dims in [3, 64, 768] {
                let index = twins_of(&extreme_vectors(11, dims, 300, metric), metric);
                let mut queries = extreme_vectors(12, dims, 9, metric);
                for query in &mut queries {
                    index.prepare_query(query).unwrap();
                }
                let refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let mut partials: Vec<Vec<TopK>> = vec![(0..9).map(|_| TopK::new()).collect()];
                for k in [1, 10, 600] {
                    assert_split_finds_what_each_finds_alone(&index, &refs, k, &mut partials, 64);
                    assert_split_finds_what_each_finds_alone(&index, &refs, k, &mut [], 1 << 20);
                }
                #[cfg(target_arch = "x86_64")]
                if metric != Metric::L2 {
                    let what = format!("{metric:?}, {dims} dims, extreme magnitudes");
                    let _ = assert_screened_finds_what_each_finds_alone(&index, &queries, &what);
                }
            }
        }
    }

    /// Rows that make the int8 codes lose the most, for `metric`'s index of
    /// `dims`: random, a crowd around one point (where only the exact score
    /// tells rows apart), values all of one magnitude (every code ±127), one
    /// spike among small values (most codes 0), mixed magnitudes, and tiny
    /// values down to subnormals (where the index takes them).
    #[cfg(target_arch = "x86_64")]
    fn hard_for_codes(seed: u64, dims: usize, metric: Metric) -> Vec<Vec<f32>> {
        let random = random_vectors(seed, dims, 40);
        let center = &random[0];
        let mut rows: Vec<Vec<f32>> = random.clone();
        rows.extend(
            random_vectors(seed + 1, dims, 40)
                .iter()
                .map(|n| center.iter().zip(n).map(|(c, n)| c + 1e-3 * n).collect::<Vec<f32>>()),
        );
        rows.extend(random.iter().take(8).map(|v| v.iter().map(|x| if *x < 0.0 { -3.0 } else { 3.0 }).collect()));
        rows.extend(random.iter().take(8).enumerate().map(|(n, v)| {
            let mut v: Vec<f32> = v.iter().map(|x| x * 1e-4).collect();
            v[n % dims] = 7.0;
            v
        }));
        rows.extend(extreme_vectors(seed + 2, dims, 12, metric));
        rows.extend(random.iter().take(4).map(|v| v.iter().map(|x| x * 1e-38).collect()));
        rows.extend(random.iter().take(4).map(|v| v.iter().map(|x| x * 1e-44).collect()));
        let index = Index::new(dims, metric);
        let mut rows = fit_for(metric, rows);
        rows.retain(|v| index.check_vector(v).is_ok());
        rows
    }

    /// `rows` as `metric` takes them: their magnitudes for js, which
    /// refuses values below zero.
    fn fit_for(metric: Metric, mut rows: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
        if metric == Metric::JensenShannon {
            rows.iter_mut().flatten().for_each(|x| *x = x.abs());
        }
        rows
    }

    /// The int8 pass of `index` for `queries` with `kernel`: their codes
    /// and bounds (products) or grids (floors), and their scales.
    #[cfg(target_arch = "x86_64")]
    struct Pass {
        codes: Vec<QueryCode>,
        bounds: Vec<codes::Bounds>,
        grids: Vec<Grids>,
        scales: Vec<f32>,
        kernel: cpu::Kernel,
        farthest: Vec<AtomicU32>,
    }

    #[cfg(target_arch = "x86_64")]
    impl Pass {
        fn new(index: &Index, queries: &[&[f32]], kernel: cpu::Kernel) -> Pass {
            let squared: Vec<f64> = queries.iter().map(|query| kernels::squared_norm(query)).collect();
            let scales: Vec<f32> = squared.iter().map(|&squared| index.query_scale(|| squared)).collect();
            let (mut codes, mut bounds, mut grids) = (Vec::new(), Vec::new(), Vec::new());
            match index.coded_pass().expect("an index with codes") {
                (Bound::Products(shape), _) => {
                    (codes, bounds) = code_queries((shape, kernel), queries, &squared, &scales);
                }
                (Bound::Floors(floor), _) => {
                    let rows = index.codes.as_ref().expect("codes");
                    grids = queries.iter().map(|query| Grids::of(floor, rows, query)).collect();
                }
            }
            Pass { codes, bounds, grids, scales, kernel, farthest: farthest_for(queries.len()) }
        }

        fn coded(&self) -> Coded<'_> {
            let queries = if self.grids.is_empty() {
                CodedQueries::Products { codes: &self.codes, bounds: &self.bounds }
            } else {
                CodedQueries::Floors(&self.grids)
            };
            Coded { kernel: self.kernel, queries, farthest: &self.farthest }
        }
    }

    /// The index's codes; `None`, with a skip recorded, only where this CPU
    /// has no int8 kernel at all, asked of the CPU itself: an index that
    /// keeps no codes on a CPU that has one fails the test instead of
    /// passing as skipped.
    fn codes_or_skip<'a>(index: &'a Index, what: &str) -> Option<&'a Codes> {
        if cpu::Int8::ALL.iter().all(|isa| !isa.available()) {
            crate::testing::skip(what, "this CPU has no int8 kernel");
            return None;
        }
        let codes = index.codes.as_ref();
        Some(codes.unwrap_or_else(|| panic!("{what}: the index keeps no codes, though this CPU has an int8 kernel")))
    }

    /// The kernels this CPU has; a skip, recorded, for each it has not.
    #[cfg(target_arch = "x86_64")]
    fn int8_kernels(what: &str) -> Vec<cpu::Kernel> {
        let here = crate::testing::on_this_cpu(&cpu::Int8::ALL, what, cpu::Int8::name, cpu::Int8::available);
        here.into_iter().map(|isa| cpu::Kernel::on_this_cpu(isa).expect("a kernel this CPU has")).collect()
    }

    /// Every kernel's integer products against the scalar reference, and the
    /// bound against each pair's own exact distance: with the threshold at
    /// that distance, no row may be ruled out.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_int8_pass_never_rules_out_a_row_at_its_own_distance() {
        let kernels = int8_kernels("the int8 bound");
        for metric in [Metric::Cosine, Metric::Ip, Metric::L2] {
            for dims in (1..=64).chain([65, 127, 768, 1536]) {
                let rows = hard_for_codes(dims as u64, dims, metric);
                let index = twins_of(&rows, metric);
                let Some(codes) = codes_or_skip(&index, "the int8 bound") else { return };
                for (q, mut query) in
                    hard_for_codes(1000 + dims as u64, dims, metric).into_iter().step_by(3).enumerate()
                {
                    index.prepare_query(&mut query).unwrap();
                    let code = QueryCode::of(&query);
                    for &kernel in &kernels {
                        let pass = Pass::new(&index, &[&query], kernel);
                        let scale = pass.scales[0];
                        for row in 0..index.len() {
                            let mut top = TopK::new();
                            top.reset(1);
                            index.scan_exact(&[&query], &[scale], None, row..row + 1, std::slice::from_mut(&mut top));
                            let exact = top.sorted()[0].distance;
                            let [dot] = kernel.dots_of(&pass.codes[0], codes, [row]);
                            let want = codes::dot_scalar(code.signs(), codes.row(row));
                            assert_eq!(dot, want, "{metric:?}, {dims} dims, {}", kernel.name());
                            let row_scale = if metric == Metric::Cosine { index.inverse_norms[row] } else { 1.0 };
                            let rows = ([index.norms[row]], [row_scale]);
                            assert!(
                                pass.bounds[0].rules_out(codes, [row], [[dot]], rows, [exact]) == [0],
                                "{metric:?}, {dims} dims, query {q}, row {row} ruled out at its own distance {exact}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Searches through the int8 pass, with every kernel this CPU has,
    /// find exactly what the f32 scan finds: same ids, order and distances,
    /// whole and masked. On random rows the pass must rule most rows out.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_int8_pass_finds_exactly_what_the_f32_scan_finds() {
        let kernels = int8_kernels("the int8 pass");
        let lp = |p: f64| Metric::Lp(crate::store::Power::new(p).unwrap());
        let metrics = [
            Metric::Cosine,
            Metric::Ip,
            Metric::L2,
            Metric::L1,
            Metric::Linf,
            Metric::BrayCurtis,
            lp(1.5),
            lp(2.5),
            lp(3.0),
            Metric::Canberra,
            Metric::JensenShannon,
            lp(2.7),
        ];
        for metric in metrics {
            let Some(bound) = Bound::of(metric) else {
                crate::testing::skip("the int8 pass, lp with p = 2.7", "this CPU has no AVX-512 VBMI lookups");
                continue;
            };
            // lp with a p not a multiple of 1/4 on the lookups' kernel only.
            let kernels: Vec<cpu::Kernel> = (kernels.iter().copied())
                .filter(|&kernel| !matches!(bound, Bound::Floors(floor) if !floor.runs_on(kernel.isa())))
                .collect();
            for dims in [1, 3, 17, 64, 100, 768] {
                let mut rows = hard_for_codes(dims as u64, dims, metric);
                rows.extend(fit_for(metric, random_vectors(7, dims, 2000)));
                let index = twins_of(&rows, metric);
                if codes_or_skip(&index, "the int8 pass").is_none() {
                    return;
                }
                let mask: RoaringBitmap = (0..index.len() as u32).filter(|r| r % 3 != 0).collect();
                let mut queries = hard_for_codes(500 + dims as u64, dims, metric);
                queries.truncate(30);
                for query in &mut queries {
                    index.prepare_query(query).unwrap();
                }
                let (mut passed, mut rescored) = (0, 0);
                for (q, query) in queries.iter().enumerate() {
                    for k in [1, 10, 100] {
                        for mask in [None, Some(&mask)] {
                            let scale = index.query_scale(|| kernels::squared_norm(query));
                            let scan = |coded: Option<&Coded>, top: &mut TopK| {
                                top.reset(k);
                                let top = std::slice::from_mut(top);
                                match mask {
                                    Some(mask) => {
                                        index.scan_masked(&[query], &[scale], coded, mask, 0..index.len(), top)
                                    }
                                    None => index.scan_exact(&[query], &[scale], coded, 0..index.len(), top),
                                }
                            };
                            let mut want = TopK::new();
                            scan(None, &mut want);
                            for &kernel in &kernels {
                                let coded = Pass::new(&index, &[query], kernel);
                                let mut got = TopK::new();
                                let pass = scan(Some(&coded.coded()), &mut got);
                                let what = format!("{metric:?}, {dims} dims, query {q}, k {k}, {}", kernel.name());
                                assert_eq!(got.sorted(), want.sorted(), "{what}, masked {}", mask.is_some());
                                if (8..28).contains(&q) && k == 10 && mask.is_none() {
                                    (passed, rescored) = (passed + pass.rows, rescored + pass.rescored);
                                }
                            }
                        }
                    }
                }
                // The same queries as one batch, their ks mixed: each
                // answer as the f32 batch scan gives it.
                let batch: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                for mask in [None, Some(&mask)] {
                    let scan = |coded: Option<&Coded>, scales: &[f32]| {
                        let mut tops: Vec<TopK> = (0..batch.len()).map(|_| TopK::new()).collect();
                        for (q, top) in tops.iter_mut().enumerate() {
                            top.reset([1, 10, 100][q % 3]);
                        }
                        match mask {
                            Some(mask) => index.scan_masked(&batch, scales, coded, mask, 0..index.len(), &mut tops),
                            None => index.scan_exact(&batch, scales, coded, 0..index.len(), &mut tops),
                        };
                        tops
                    };
                    for &kernel in &kernels {
                        let pass = Pass::new(&index, &batch, kernel);
                        let (mut want, mut got) = (scan(None, &pass.scales), scan(Some(&pass.coded()), &pass.scales));
                        for (q, (got, want)) in got.iter_mut().zip(&mut want).enumerate() {
                            let what = format!("{metric:?}, {dims} dims, batch query {q}, {}", kernel.name());
                            assert_eq!(got.sorted(), want.sorted(), "{what}, masked {}", mask.is_some());
                        }
                    }
                }
                // The random queries against mostly random rows: most rows
                // ruled out (one or two dimensions cannot tell rows apart).
                // js's bound is further below its distances (4.5% at 768
                // dimensions, against distances spread over 4%: `shannon`),
                // and these 2,000 rows hold the k nearest less far out.
                let share = if metric == Metric::JensenShannon { 5 } else { 10 };
                if dims >= 64 {
                    assert!(rescored * share < passed, "{metric:?}, {dims} dims: {rescored} of {passed} rows rescored");
                }
            }
        }
    }

    /// Every kernel's integer distances between codes against the scalar
    /// reference, and the floors' bound against each pair's own exact
    /// distance: with the threshold at that distance, no row may be ruled
    /// out.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_floors_never_rule_out_a_row_at_its_own_distance() {
        let kernels = int8_kernels("the floors' bound");
        let mut floors = vec![
            (Metric::L1, Floor::L1),
            (Metric::Linf, Floor::Linf),
            (Metric::BrayCurtis, Floor::BrayCurtis),
            (Metric::Canberra, Floor::Canberra),
            (Metric::JensenShannon, Floor::JensenShannon),
        ];
        for p in [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 7.75, 8.0] {
            floors.push((Metric::Lp(crate::store::Power::new(p).unwrap()), Floor::lp(p as f32).unwrap()));
        }
        // Any other p where the powers are looked up.
        for p in [1.1, 2.7, 7.99] {
            if let Some(floor) = Floor::lp(p as f32) {
                floors.push((Metric::Lp(crate::store::Power::new(p).unwrap()), floor));
            }
        }
        for (metric, floor) in floors {
            for dims in (1..=64).chain([65, 127, 768, 1536]) {
                let rows = hard_for_codes(dims as u64, dims, metric);
                let index = twins_of(&rows, metric);
                let Some(codes) = codes_or_skip(&index, "the floors' bound") else { return };
                for (q, query) in hard_for_codes(1000 + dims as u64, dims, metric).iter().step_by(3).enumerate() {
                    let grids = Grids::of(floor, codes, query);
                    for row in 0..index.len() {
                        let mut top = TopK::new();
                        top.reset(1);
                        index.scan_exact(&[query], &[1.0], None, row..row + 1, std::slice::from_mut(&mut top));
                        let exact = top.sorted()[0].distance;
                        let (d, m, p) = codes::floors::spans_scalar(&grids.code_for(codes, row), codes.row(row));
                        for &kernel in kernels.iter().filter(|&&kernel| floor.runs_on(kernel.isa())) {
                            let what = format!("{metric:?}, {dims} dims, query {q}, row {row}, {}", kernel.name());
                            let want = match floor {
                                Floor::L1 => (d, 0),
                                Floor::Linf => (m, 0),
                                Floor::BrayCurtis => (d, p),
                                Floor::Lp(_) => {
                                    // The sum within the slack the bound
                                    // allows for (above) and as much below:
                                    // none for p = 2 and 3, in integers.
                                    let (sum, exact, slack, least) = grids.powers_of(kernel, codes, row);
                                    assert!(sum <= exact * slack && sum >= least, "{what}: {sum} for {exact}");
                                    (0, 0)
                                }
                                Floor::Canberra => {
                                    let (sums, want, nearest) = grids.ratio_sums_of(kernel, codes, row);
                                    assert_eq!(sums, want, "{what}");
                                    assert!(nearest <= f64::from(exact), "{what}: {nearest} above {exact}");
                                    (0, 0)
                                }
                                Floor::JensenShannon => {
                                    let (sum, want, nearest) = grids.shannon_sums_of(kernel, codes, row);
                                    assert_eq!(sum, want, "{what}");
                                    assert!(nearest <= f64::from(exact), "{what}: {nearest} above {exact}");
                                    (0, 0)
                                }
                            };
                            if !matches!(floor, Floor::Lp(_) | Floor::Canberra | Floor::JensenShannon) {
                                assert_eq!(grids.spans_of(kernel, codes, row), want, "{what}");
                            }
                            let ruled = grids.rules_out(kernel, codes, [row], exact);
                            assert_eq!(ruled, 0, "{what}: ruled out at its own distance {exact}");
                            // Nor beyond it by its key (searches in order).
                            let [key] = grids.keys_of(kernel, codes, [row]);
                            assert!(!grids.beyond(codes, row, key, exact), "{what}: key {key} beyond {exact}");
                        }
                    }
                }
            }
        }
    }

    /// A lone search that scores rows in the order of their keys
    /// (`search_in_order`) finds exactly what the f32 scan finds, on one
    /// thread and on three taking a few rows at a time: every k from 1 to
    /// more than the rows, rows in twins (ties broken by id), and rows at
    /// every magnitude.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn searches_in_the_order_of_their_bounds_find_what_the_f32_scan_finds() {
        let lp = |p: f64| Metric::Lp(crate::store::Power::new(p).unwrap());
        let mut metrics = vec![Metric::L1, Metric::Linf, Metric::BrayCurtis, Metric::Canberra, Metric::JensenShannon];
        metrics.extend([lp(1.5), lp(2.0), lp(3.0)]);
        // lp with a p not a multiple of 1/4, where the CPU looks powers up.
        if Floor::lp(2.7).is_some() {
            metrics.push(lp(2.7));
        }
        for metric in metrics {
            for dims in [3, 64, 100] {
                let mut rows = hard_for_codes(40 + dims as u64, dims, metric);
                rows.extend(fit_for(metric, random_vectors(8, dims, 300)));
                let index = twins_of(&rows, metric);
                if codes_or_skip(&index, "searches in the order of their bounds").is_none() {
                    return;
                }
                assert!(matches!(index.coded_pass(), Some((Bound::Floors(_), _))), "{metric:?}");
                let mut code = LoneCodes::default();
                for (q, query) in hard_for_codes(900 + dims as u64, dims, metric).iter().step_by(5).enumerate() {
                    let mut query = query.clone();
                    index.prepare_query(&mut query).unwrap();
                    for k in [1, 10, 100, index.len(), index.len() + 5] {
                        let mut want = TopK::new();
                        index.search_f32(&query, k, &mut want);
                        for (threads, chunk) in [(1, 1 << 20), (3, 7)] {
                            let mut partials: Vec<Vec<TopK>> = (1..threads).map(|_| vec![TopK::new()]).collect();
                            let mut got = [TopK::new()];
                            let ks = [k];
                            let pass = index.search_in_chunks(
                                &[&query],
                                &ks,
                                &mut got,
                                (&mut partials, chunk),
                                None,
                                &mut code,
                            );
                            let what = format!("{metric:?}, {dims} dims, query {q}, k {k}, {threads} threads");
                            assert_eq!(got[0].sorted(), want.sorted(), "{what}");
                            assert_eq!(pass.rows, index.len() as u64, "{what}");
                        }
                    }
                }
            }
        }
    }

    /// Where the bounds leave more than one row in `EXACT_SCAN_SHARE` (rows
    /// alike to within less than a code's step), a search in order scans
    /// every row exactly, on every thread, and finds what the f32 scan
    /// finds: the nearest rows lie in every chunk, so a thread's kept rows
    /// left out would show.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_search_in_order_of_rows_alike_scans_every_row_exactly() {
        let lp = |p: f64| Metric::Lp(crate::store::Power::new(p).unwrap());
        let mut metrics = vec![Metric::L1, Metric::JensenShannon, lp(3.0)];
        if Floor::lp(2.7).is_some() {
            metrics.push(lp(2.7));
        }
        let rows = 3_000;
        let near = |i: usize| [0.5 + (i * 7_919 % 1_000) as f32 * 6e-8, 1.0, 2.0];
        for metric in metrics {
            let mut index = Index::new(3, metric);
            if codes_or_skip(&index, "a search in order of rows alike").is_none() {
                return;
            }
            assert!(matches!(index.coded_pass(), Some((Bound::Floors(_), _))), "{metric:?}");
            for id in 0..rows {
                index.upsert(id as i64, &near(id), b"");
            }
            let mut query = [0.5 + 500.3 * 6e-8, 1.0, 2.0];
            index.prepare_query(&mut query).unwrap();
            let mut code = LoneCodes::default();
            for k in [1, 10, 100] {
                let mut want = TopK::new();
                index.search_f32(&query, k, &mut want);
                for (threads, chunk) in [(1, 1 << 20), (3, 7)] {
                    let mut partials: Vec<Vec<TopK>> = (1..threads).map(|_| vec![TopK::new()]).collect();
                    let mut got = [TopK::new()];
                    let pass =
                        index.search_in_chunks(&[&query], &[k], &mut got, (&mut partials, chunk), None, &mut code);
                    let what = format!("{metric:?}, k {k}, {threads} threads");
                    assert_eq!(got[0].sorted(), want.sorted(), "{what}");
                    assert_eq!(pass.rescored, rows as u64, "{what}: every row scored");
                }
            }
        }
    }

    /// Where the bounds tell no row apart (every row the same), a search
    /// in order scores every row, and lets go of the room it took for them
    /// past `LEFT_KEPT` rows: the scanner keeps only the rows' keys.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_search_in_order_lets_go_of_a_long_list_of_rows_left() {
        let rows = LEFT_KEPT + 4_000;
        let mut index = Index::new(3, Metric::L1);
        if codes_or_skip(&index, "a search in order's rows left").is_none() {
            return;
        }
        for id in 0..rows as i64 {
            index.upsert(id, &[0.5, -1.0, 2.0], b"");
        }
        let query = [0.25f32, -1.0, 2.5];
        let mut code = LoneCodes::default();
        let mut got = [TopK::new()];
        let pass = index.search_in_chunks(&[&query], &[1], &mut got, (&mut [], 1 << 20), None, &mut code);
        let mut want = TopK::new();
        index.search_f32(&query, 1, &mut want);
        assert_eq!(got[0].sorted(), want.sorted());
        assert_eq!(pass.rescored, rows as u64, "every row scored: none is beyond another");
        assert_eq!(code.order.left.capacity(), 0, "the list let go");
        assert!(code.order.keys.len() >= rows, "the keys kept");
    }

    /// The floors' codes follow upserts over rows of other magnitudes and
    /// deletes (which move the last row into the gap): every scale keeps
    /// its count of rows, so every row finds its query code, and searches
    /// still find exactly what the f32 scan finds.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_floors_follow_upserts_and_deletes() {
        for metric in [Metric::L1, Metric::Canberra, Metric::JensenShannon] {
            floors_follow_upserts_and_deletes(metric);
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn floors_follow_upserts_and_deletes(metric: Metric) {
        let (dims, magnitudes) = (40, [1e-30f32, 1e-3, 1.0, 7.0, 3e16]);
        let rows = fit_for(metric, random_vectors(11, dims, 300));
        let scaled = |n: usize, v: &[f32]| -> Vec<f32> { v.iter().map(|x| x * magnitudes[n % 5]).collect() };
        let mut index = Index::new(dims, metric);
        if codes_or_skip(&index, "the floors' codes").is_none() {
            return;
        }
        for (n, v) in rows.iter().enumerate() {
            index.upsert(n as i64, &scaled(n, v), b"");
        }
        for (n, v) in rows.iter().enumerate().step_by(3) {
            index.upsert(n as i64, &scaled(n + 1, v), b"");
        }
        for id in (0..300).step_by(7) {
            index.delete(id);
        }
        let codes = index.codes.as_ref().expect("codes");
        let mut counted = vec![0u32; 256];
        for row in 0..index.len() {
            counted[codes::exponent_of(codes.scale_and_residual(row).0)] += 1;
        }
        assert_eq!(codes.exponents(), &counted[..]);
        for (q, query) in fit_for(metric, random_vectors(12, dims, 10)).iter().enumerate() {
            let query = scaled(q, query);
            let (mut got, mut want) = (TopK::new(), TopK::new());
            index.search(&query, 10, &mut got);
            index.search_f32(&query, 10, &mut want);
            assert_eq!(got.sorted(), want.sorted(), "{metric:?}, query {q}");
        }
    }

    /// Canberra's codes count the rows that hold a negative value; while
    /// neither they nor the query hold one, the kernels skip the signs (all
    /// 0), and find the same sums and the same answers.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn canberra_skips_the_signs_only_where_none_is_negative() {
        let kernels = int8_kernels("Canberra's signs");
        let dims = 100;
        let positive = |v: &Vec<f32>| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
        let rows: Vec<Vec<f32>> = hard_for_codes(5, dims, Metric::Canberra).iter().map(positive).collect();
        let mut index = twins_of(&rows, Metric::Canberra);
        let Some(codes) = codes_or_skip(&index, "Canberra's signs") else { return };
        assert_eq!(codes.negatives(), 0);
        let queries = hard_for_codes(6, dims, Metric::Canberra);
        for query in [positive(&queries[3]), queries[3].clone()] {
            let grids = Grids::of(Floor::Canberra, codes, &query);
            assert_eq!(grids.signed(), query.iter().any(|&x| x < 0.0));
            for row in 0..index.len() {
                for &kernel in &kernels {
                    let (sums, want, _) = grids.ratio_sums_of(kernel, codes, row);
                    assert_eq!(sums, want, "{}, row {row}", kernel.name());
                }
            }
        }
        // A row with a negative value turns the signs on for every query,
        // and its delete (or its overwrite) off again.
        let negative = queries[3].clone();
        index.upsert(-1, &negative, b"");
        index.upsert(-2, &negative, b"");
        index.upsert(-2, &positive(&negative), b"");
        let codes = index.codes.as_ref().expect("codes");
        assert_eq!(codes.negatives(), 1);
        assert!(Grids::of(Floor::Canberra, codes, &positive(&queries[4])).signed());
        let (mut got, mut want) = (TopK::new(), TopK::new());
        index.search(&positive(&queries[4]), 5, &mut got);
        index.search_f32(&positive(&queries[4]), 5, &mut want);
        assert_eq!(got.sorted(), want.sorted());
        index.delete(-1);
        assert_eq!(index.codes.as_ref().expect("codes").negatives(), 0);
    }

    /// Every kernel's products of a tile of queries with a tile of rows, at
    /// every shape a scan uses (up to 4 x 4, where AVX-512 sums the 16 at
    /// once), against the scalar reference, pair by pair.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_tile_of_queries_gets_each_pair_exactly() {
        fn check<const Q: usize, const R: usize>(kernel: cpu::Kernel, queries: &[QueryCode], codes: &Codes, at: usize) {
            let tile: [&QueryCode; Q] = std::array::from_fn(|q| &queries[(at + q) % queries.len()]);
            let rows: [usize; R] = std::array::from_fn(|r| (at * 7 + r * 3) % codes.rows());
            let dots = kernel.dots_tile(tile, codes, rows);
            for (q, code) in tile.iter().enumerate() {
                for (r, &row) in rows.iter().enumerate() {
                    let want = codes::dot_scalar(code.signs(), codes.row(row));
                    assert_eq!(dots[q][r], want, "{}, {Q} x {R}, query {q}, row {row}", kernel.name());
                }
            }
        }
        let kernels = int8_kernels("tiles of int8 products");
        for dims in (1..=64).chain([65, 127, 768, 1536]) {
            let Some(codes) =
                Codes::of(dims, codes::Grid::Fitted, &hard_for_codes(dims as u64, dims, Metric::Ip).concat())
            else {
                continue;
            };
            let queries: Vec<QueryCode> =
                hard_for_codes(300 + dims as u64, dims, Metric::Ip).iter().map(|q| QueryCode::of(q)).collect();
            for &kernel in &kernels {
                for at in 0..5 {
                    check::<4, 4>(kernel, &queries, &codes, at);
                    check::<3, 4>(kernel, &queries, &codes, at);
                    check::<2, 4>(kernel, &queries, &codes, at);
                    check::<4, 1>(kernel, &queries, &codes, at);
                    check::<1, 1>(kernel, &queries, &codes, at);
                }
            }
        }
    }

    /// The most dimensions that keep codes: there the integer products of
    /// saturated codes (every value ±127, offset 255) reach 2,122,383,360,
    /// just inside an i32, and every kernel still sums them exactly, one
    /// pair or a tile of 4 x 4 at a time; one dimension more keeps none.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn codes_hold_exactly_up_to_their_dimension_limit() {
        let kernels = int8_kernels("the int8 dimension limit");
        let dims = codes::DIMS_MAX;
        let rows: Vec<f32> = [1.0, -1.0, -1.0, 1.0].iter().flat_map(|&x| vec![x; dims]).collect();
        let codes = codes::Codes::of(dims, codes::Grid::Fitted, &rows).expect("codes at the limit");
        assert!(codes::Codes::of(dims + 1, codes::Grid::Fitted, &[0.5; codes::DIMS_MAX + 1]).is_none());
        let queries = [1.0f32, -1.0, 1.0, -1.0].map(|x| QueryCode::of(&vec![x; dims]));
        for &kernel in &kernels {
            let tile = kernel.dots_tile(queries.each_ref(), &codes, [0, 1, 2, 3]);
            for (q, (code, tiled)) in queries.iter().zip(tile).enumerate() {
                for (row, tiled) in tiled.into_iter().enumerate() {
                    let [dot] = kernel.dots_of(code, &codes, [row]);
                    assert_eq!(dot, codes::dot_scalar(code.signs(), codes.row(row)), "{}", kernel.name());
                    assert_eq!(dot.unsigned_abs(), 127 * 127 * dims as u32, "{}", kernel.name());
                    assert_eq!(tiled, dot, "{}, query {q} of a tile", kernel.name());
                }
            }
        }
        if cpu::paths().int8().is_some() {
            assert!(Index::new(dims, Metric::Cosine).codes.is_some());
            assert!(Index::new(dims + 1, Metric::Cosine).codes.is_none());
        }
    }

    /// The floors' integer sums at 65,536 dimensions with every difference
    /// at its largest, 254 (codes of 127 against queries clamped to -127):
    /// `D` and `P` of 254 x 65,536 and lp's sum of 254^8 x 65,536 fit
    /// their u32 and f32, on every kernel.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_floors_hold_exactly_up_to_the_dimension_limit() {
        let kernels = int8_kernels("the floors' dimension limit");
        let dims = codes::DIMS_MAX;
        // 127 is on its own scale, 1, with codes of 127.
        let rows: Vec<f32> = [127.0f32, -127.0].iter().flat_map(|&x| vec![x; dims]).collect();
        let codes_of = |floor: Floor| Codes::of(dims, floor.grid(), &rows).expect("codes at the limit");
        let query = vec![-1e30f32; dims];
        let (l1_codes, lp8) = (codes_of(Floor::L1), Floor::lp(8.0).unwrap());
        let lp8_codes = codes_of(lp8);
        for &kernel in &kernels {
            let grids = Grids::of(Floor::BrayCurtis, &l1_codes, &query);
            assert_eq!(grids.spans_of(kernel, &l1_codes, 0), (254 * dims as u32, 0), "{}", kernel.name());
            assert_eq!(grids.spans_of(kernel, &l1_codes, 1), (0, 254 * dims as u32), "{}", kernel.name());
            let grids = Grids::of(Floor::Linf, &l1_codes, &query);
            assert_eq!(grids.spans_of(kernel, &l1_codes, 0), (254, 0), "{}", kernel.name());
            let grids = Grids::of(lp8, &lp8_codes, &query);
            let (sum, exact, slack, least) = grids.powers_of(kernel, &lp8_codes, 0);
            assert!(sum.is_finite() && sum <= exact * slack && sum >= least, "{}: {sum} for {exact}", kernel.name());
            // p = 2 and 3 sum in integers, spilled from 32-bit lanes: exact
            // at the limit, every difference at its largest (254, lowered to
            // 127 for p = 2 and 181 for p = 3).
            for (p, s) in [(2.0, 127u64), (3.0, 181)] {
                let floor = Floor::lp(p).unwrap();
                let codes = codes_of(floor);
                let grids = Grids::of(floor, &codes, &query);
                let (sum, exact, slack, _) = grids.powers_of(kernel, &codes, 0);
                assert_eq!((sum, slack), (exact, 1.0), "{}, p {p}", kernel.name());
                assert_eq!(sum, (dims as u64 * s.pow(p as u32)) as f64, "{}, p {p}", kernel.name());
            }
        }
        // Canberra: every sign apart, or every level 255 from level 0 (m =
        // 255 either way), sums each table entry at its largest.
        let codes = Codes::of(dims, Floor::Canberra.grid(), &vec![1.0f32; dims]).expect("codes at the limit");
        for query in [vec![-1.0f32; dims], vec![1e-30; dims]] {
            let grids = Grids::of(Floor::Canberra, &codes, &query);
            for &kernel in &kernels {
                let (sums, want, nearest) = grids.ratio_sums_of(kernel, &codes, 0);
                let what = format!("{}, {}: {nearest}", kernel.name(), query[0]);
                assert_eq!(sums, want, "{what}");
                assert!(nearest <= dims as f64 && nearest > 0.98 * dims as f64, "{what}");
            }
        }
        // js: every level 255 against level 0 (m = 255, every `V` at its
        // largest), each term `ln 2 / 2` to within 2^-100, the bound's
        // 0.945 of it (level 0 holds values up to 2^(-255/32)).
        let query = vec![1e-30f32; dims];
        let codes = Codes::of(dims, Floor::JensenShannon.grid(), &vec![1.0f32; dims]).expect("codes at the limit");
        let grids = Grids::of(Floor::JensenShannon, &codes, &query);
        for &kernel in &kernels {
            let (sum, want, nearest) = grids.shannon_sums_of(kernel, &codes, 0);
            let what = format!("{}, js: {nearest}", kernel.name());
            assert_eq!((sum, want), (dims as u64 * 255 * 64, dims as u64 * 255 * 64), "{what}");
            let exact = dims as f64 * std::f64::consts::LN_2 / 2.0;
            assert!(nearest <= exact && nearest > 0.94 * exact, "{what}");
        }
    }

    /// Which lp indexes take the floors' pass: p a multiple of 1/4 from 1
    /// to 8 (p = 1 on l1's floor), and any other p from 1 to 8 where the
    /// first pass looks powers up; any other p keeps the f32 scan and no
    /// codes.
    #[test]
    fn lp_takes_the_floors_pass_only_where_its_bound_is_proved() {
        assert_eq!(Floor::lp(1.0), Some(Floor::L1));
        for p in [1.25f32, 2.0, 2.5, 7.75, 8.0] {
            assert_eq!(Floor::lp(p), Some(Floor::Lp(p)));
        }
        let lookups = Floor::lp(2.7).is_some();
        for p in [1.1f32, 2.7, std::f32::consts::PI, 7.99] {
            assert_eq!(Floor::lp(p), lookups.then_some(Floor::Lp(p)));
            if lookups {
                assert!(Floor::Lp(p).runs_on(cpu::Int8::Vnni512) && !Floor::Lp(p).runs_on(cpu::Int8::Avx2));
            }
        }
        for p in [0.25f32, 0.75, 0.99, 8.25, 9.0] {
            assert_eq!(Floor::lp(p), None, "p = {p}");
            let index = Index::new(8, Metric::Lp(crate::store::Power::new(f64::from(p)).unwrap()));
            assert!(index.codes.is_none() && index.coded_pass().is_none(), "p = {p}");
        }
    }
}
