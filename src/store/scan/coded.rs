//! The int8 first pass of a scan (`codes` for products, `codes::floors`
//! for coordinate distances): each pair's bound from the codes, and the
//! pairs the bounds cannot rule out scored exactly a few pairs later.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use roaring::RoaringBitmap;

use super::threads::{share_in, threshold_of};
use super::{FirstPass, View};
use crate::store::codes::floors::Grids;
use crate::store::codes::query_lanes::{QueryGroup, QUERY_LANES};
use crate::store::codes::{self, Codes, QueryCode, LANES};
use crate::store::cpu;
use crate::store::topk::TopK;

/// How far ahead of the rows being decided the int8 pass asks for codes.
pub(super) const CODES_PREFETCH_ROWS: usize = 16;

/// Pairs a first pass could not rule out wait this many more such pairs
/// before they are scored (`Later`).
pub(super) const RESCORE_LAG: usize = 8;

/// What `scan_coded_for` scans: queries, their scales, their int8 pass, a
/// mask if any, the rows and the queries' tops.
pub(super) type CodedScan<'a, 'b> =
    (&'a [&'a [f32]], &'a [f32], &'a Coded<'a>, Option<&'a RoaringBitmap>, Range<usize>, &'b mut [TopK]);

/// Queries a scan on a kernel with lanes takes as a group
/// (`scan_coded_lanes`): the rows of a chunk (`SCAN_CHUNK_FLOATS`) are read
/// from memory once per this many queries.
const LANE_QUERIES: usize = 32;

/// Of the queries of a group on rows under `query_lanes::DIMS_MAX`
/// dimensions, how many `scan_coded_lanes` decides in groups of queries in
/// lanes (`codes::query_lanes`), from the first: every whole group of
/// `QUERY_LANES`, and the rest too where they are at least
/// `GROUPED_QUERIES_MIN`; the others one at a time.
fn in_query_groups(queries: usize) -> usize {
    let whole = queries / QUERY_LANES * QUERY_LANES;
    let rest = queries - whole;
    whole + if rest >= GROUPED_QUERIES_MIN { rest } else { 0 }
}

/// Queries that fill fewer lanes than this are decided one at a time: a
/// group of queries in lanes costs what a full one does. On GloVe's shape
/// (400,000 x 50, one thread, AVX2) a batch of 4 took 0.88 to 1.08 ms a
/// query in lanes against 0.63 to 0.71 one at a time; one of 6 0.60 to
/// 0.73 against 0.63 to 0.71; one of 8 0.48 to 0.60 against 0.63 to 0.73.
const GROUPED_QUERIES_MIN: usize = 6;

/// The codes and terms of a run of rows that a scan on a kernel with lanes
/// decides for each query of a group in turn (`scan_coded_lanes`): a run
/// stays in L1 while the group's queries take it, and each query's terms
/// stay in registers across the run. A run is at least `LANES` rows: above
/// about 2,000 dimensions those are more than this, and come from L2.
const RUN_BYTES: usize = 16 << 10;

/// The bytes of each row's terms that `Lanes` reads besides its codes, at
/// most: 24, and 4 more where the rows have multiples of the offset.
const RUN_TERM_BYTES: usize = 28;

/// Rows a lone search's int8 pass takes at a time where the kernel's
/// registers are 256 bits wide: the eight rows' products are summed in one
/// go (`codes::x86::sum8`), and their bounds fill one register.
pub(super) const LONE_ROWS: usize = 8;

/// Rows the int8 pass takes at a time: `LONE_ROWS` for a lone search on a
/// kernel of 256-bit registers (16 of them: a batch's tile of 2 x 8 sums
/// would not fit), `codes::ROWS` otherwise.
/// The floors keep `codes::ROWS`.
pub(super) fn rows_at_a_time(coded: &Coded, queries: usize) -> usize {
    match (&coded.queries, coded.kernel.isa()) {
        (CodedQueries::Products { .. }, cpu::Int8::Avx2 | cpu::Int8::Vnni256) if queries == 1 => LONE_ROWS,
        _ => codes::ROWS,
    }
}

/// The int8 first pass of a search or a batch: the kernel its codes are
/// read with, the queries' side, and each query's farthest kept as the
/// threads of a split scan share it.
pub(super) struct Coded<'a> {
    pub(super) kernel: cpu::Kernel,
    pub(super) queries: CodedQueries<'a>,
    pub(super) farthest: &'a [AtomicU32],
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

/// The queries' side of an int8 first pass.
pub(super) enum CodedQueries<'a> {
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
pub(super) struct Later {
    pub(super) pairs: [(usize, usize); RESCORE_LAG],
    /// Pairs queued in all; the next goes to `pairs[queued % RESCORE_LAG]`.
    pub(super) queued: usize,
    /// Pairs scored or to be, for `FirstPass`.
    pub(super) rescored: u64,
    /// A lone search's farthest as the threads share it, when last read
    /// (`lone_threshold`), and the tiles of rows since.
    pub(super) lone_shared: f32,
    pub(super) lone_tiles: u32,
}

/// A lone search reads the farthest the threads share once in this many
/// tiles of rows, not once a tile: with the atomic load in every tile a
/// search of 1,000,000 x 128 on one thread took 14% longer. A value read a
/// while ago is a distance k rows were within then, so it still rules out
/// only rows that cannot enter.
pub(super) const SHARED_READ_TILES: u32 = 16;

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

    /// `threshold` at the start of a run of rows (`scan_coded_lanes`): a
    /// lone search reads the farthest the threads share afresh, one load a
    /// run (the calls within a run, after rows it could not rule out, count
    /// towards `SHARED_READ_TILES` as tiles do).
    #[inline(always)]
    fn run_threshold(&mut self, coded: &Coded, q: usize, tops: &[TopK]) -> f32 {
        if let [_] = tops {
            self.lone_tiles = 0;
        }
        self.threshold(coded, q, tops)
    }

    /// `Coded::threshold` of query `q` of `tops`, through `lone_threshold`
    /// for a lone search.
    #[inline(always)]
    fn threshold(&mut self, coded: &Coded, q: usize, tops: &[TopK]) -> f32 {
        match tops {
            [top] => self.lone_threshold(coded, top),
            _ => coded.threshold(q, &tops[q]),
        }
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

/// Each query's code for the int8 pass into `codes`, and the bounds of
/// each tile of the kernel's queries into `bounds`, from their
/// `squared_norms` and `scales` and the `rows`' offset; the buffers' own
/// kept.
pub(super) fn code_queries(
    (shape, kernel, rows): (codes::Shape, cpu::Kernel, &Codes),
    queries: &[&[f32]],
    (squared_norms, scales): (&[f64], &[f32]),
    (codes, bounds): (&mut Vec<QueryCode>, &mut Vec<codes::Bounds>),
) {
    if codes.len() < queries.len() {
        codes.resize_with(queries.len(), QueryCode::default);
    }
    for (code, query) in codes.iter_mut().zip(queries) {
        code.encode(query, kernel, rows);
    }
    let tile = kernel.query_tile();
    bounds.clear();
    let tiles = codes[..queries.len()].chunks(tile).zip(squared_norms.chunks(tile)).zip(scales.chunks(tile));
    bounds.extend(
        tiles.map(|((codes, squared), scales)| codes::Bounds::new(shape, codes, (squared, scales), rows.offset_norm())),
    );
}

impl View<'_> {
    /// `scan_coded` or `scan_coded_masked` compiled for the
    /// instructions of `coded`'s kernel, so that what they inline (the
    /// bounds' f64 arithmetic among it) uses them too, in a build for any
    /// x86-64. The answers do not change: Rust neither fuses nor reorders
    /// float operations, so wider vectors compute the same values.
    pub(super) fn scan_coded_for(
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
    pub(super) unsafe fn scan_coded_vnni512(&self, scan: CodedScan) -> FirstPass {
        self.scan_coded_any(scan)
    }

    /// `scan_coded_any` compiled for `Kernel::Vnni256`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and AVX-VNNI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    pub(super) unsafe fn scan_coded_vnni256(&self, scan: CodedScan) -> FirstPass {
        self.scan_coded_any(scan)
    }

    /// `scan_coded_any` compiled for `Kernel::Avx2`.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scan_coded_avx2(&self, scan: CodedScan) -> FirstPass {
        self.scan_coded_any(scan)
    }

    /// `scan_coded`, or `scan_coded_masked` under a mask, `rows_at_a_time`.
    #[inline(always)]
    pub(super) fn scan_coded_any(&self, (queries, scales, coded, mask, rows, tops): CodedScan) -> FirstPass {
        if let (None, CodedQueries::Products { codes, bounds }) = (mask, &coded.queries) {
            if coded.kernel.has_lanes() {
                return self.scan_coded_lanes(queries, scales, coded, (codes, bounds), rows, tops);
            }
        }
        match (mask, rows_at_a_time(coded, queries.len())) {
            (Some(mask), LONE_ROWS) => self.scan_coded_masked::<LONE_ROWS>(queries, scales, coded, mask, rows, tops),
            (Some(mask), _) => self.scan_coded_masked::<{ codes::ROWS }>(queries, scales, coded, mask, rows, tops),
            (None, LONE_ROWS) => self.scan_coded::<LONE_ROWS>(queries, scales, coded, rows, tops),
            (None, _) => self.scan_coded::<{ codes::ROWS }>(queries, scales, coded, rows, tops),
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
    pub(super) fn scan_coded<const R: usize>(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: &Coded,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        let codes = self.codes.expect("a coded scan is of an index with codes");
        let mut later = Later::default();
        let mut row = rows.start;
        while row + R <= rows.end {
            let ahead: [usize; R] = std::array::from_fn(|r| row + CODES_PREFETCH_ROWS + r);
            self.coded_rows::<R>(
                queries,
                scales,
                coded,
                (codes, std::array::from_fn(|r| row + r), &ahead),
                tops,
                &mut later,
            );
            row += R;
        }
        for row in row..rows.end {
            self.coded_rows(queries, scales, coded, (codes, [row], &[]), tops, &mut later);
        }
        FirstPass {
            rows: (rows.len() * queries.len()) as u64,
            rescored: self.rescore_all((queries, scales), tops, coded, later),
        }
    }

    /// `kernel`'s lanes over this index's codes and terms, if it has lanes.
    pub(super) fn lanes(&self, kernel: cpu::Kernel) -> Option<codes::Lanes<'_>> {
        let codes = self.codes.expect("a coded pass is of an index with codes");
        // Only cosine's bound reads the rows' scales.
        let row_scales = if self.metric.is_scaled() { self.inverse_norms } else { self.norms };
        kernel.lanes(codes, (self.norms, row_scales))
    }

    /// `scan_coded` through the products' bound on a kernel with lanes
    /// (`codes::Lanes`): a run of rows (`RUN_BYTES`) at a time, which each
    /// query of a group decides in turn, `LANES` rows at a time in
    /// registers, while the run stays in L1; the rows after the last whole
    /// `LANES` through `coded_rows`.
    ///
    /// A query's threshold is read at the start of each run and again after
    /// each `LANES` rows it could not all rule out.
    ///
    /// Under `query_lanes::DIMS_MAX` dimensions, the group's first queries
    /// (`in_query_groups`) decide each run 8 at a time instead, a query in
    /// each lane (`codes::query_lanes`), each query's threshold read at
    /// the run's start and after each row it could not rule out.
    ///
    /// The codes of the run after each are asked for while a group of
    /// queries decides this one, a share before each `LANES` rows of each
    /// query. Asked for by the group's first query alone, 16 rows ahead, a
    /// group of 32 at 768 dimensions waited for each run in that query's
    /// few hundred cycles: spread over the group, 32 clients on 100,000 x
    /// 768 answered 984 to 1,008 searches/s against 880 (the load bench's
    /// wide section, builds taken in turn). A lone query leaves the next
    /// run to the hardware's prefetcher: its shares were half a run each
    /// at 768 dimensions (96 lines at once), and without them a lone
    /// search of 100,000 x 768 took 1.97 and 2.26 ms over HTTP where it
    /// took 2.70 and 2.85 (AVX2, the load bench, two runs each), and one
    /// of GloVe's 399,000 x 50 0.57 and 0.67 ms where it took 0.66 and
    /// 0.70, while 32 clients kept their 1,488 to 1,504 searches/s. (An
    /// earlier machine had measured the 400,000 x 50 search slower left to
    /// the hardware.)
    #[inline(always)]
    pub(super) fn scan_coded_lanes(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: &Coded,
        (query_codes, bounds): (&[QueryCode], &[codes::Bounds]),
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        let codes = self.codes.expect("a coded scan is of an index with codes");
        let lanes = self.lanes(coded.kernel).expect("a kernel with lanes");
        let tile = coded.kernel.query_tile();
        // The queries made ready once, in a tile's worth at a time: a scan
        // allocates nothing.
        let mut ready: [Option<codes::LaneQuery>; LANE_QUERIES] = Default::default();
        // Groups of queries in lanes, where they are taken (`GROUPED_QUERIES_MIN`).
        let mut in_lanes: Option<[QueryGroup; LANE_QUERIES / QUERY_LANES]> = None;
        let mut later = Later::default();
        let whole = rows.start..rows.start + (rows.len() / LANES) * LANES;
        let run_rows = (RUN_BYTES / (codes.dims() + RUN_TERM_BYTES)).max(LANES) / LANES * LANES;
        for first in (0..queries.len()).step_by(LANE_QUERIES) {
            let group = first..(first + LANE_QUERIES).min(queries.len());
            // The group's first queries in groups of queries in lanes, the
            // rest one at a time.
            let in_groups = if lanes.takes_query_groups() { in_query_groups(group.len()) } else { 0 };
            let (grouped, singles) = (first..first + in_groups, first + in_groups..group.end);
            if !grouped.is_empty() {
                let groups = in_lanes.get_or_insert_with(Default::default);
                for (g, lanes_group) in grouped.clone().step_by(QUERY_LANES).zip(groups.iter_mut()) {
                    let members = g..(g + QUERY_LANES).min(grouped.end);
                    let of = |q: usize| (&query_codes[q], &bounds[q / tile], q % tile);
                    lanes.ready_group(members.map(of), lanes_group);
                }
            }
            for q in singles.clone() {
                ready[q - first] = Some(lanes.query(&query_codes[q], &bounds[q / tile], q % tile));
            }
            // The calls of `ahead` a run takes: one a `LANES` rows for each
            // group of queries in lanes and each query alone.
            let deciders = grouped.len().div_ceil(QUERY_LANES) + singles.len();
            for run in whole.clone().step_by(run_rows) {
                let run = run..(run + run_rows).min(whole.end);
                // The run after this one (after the last, the next group's
                // first) is asked for from memory in a share per query and
                // `LANES` rows of this one, so that its fetching overlaps
                // the whole group's sums here, not the first query's alone;
                // a lone query leaves it to the hardware (see above).
                let next = match run.end < whole.end {
                    _ if group.len() == 1 => run.end..run.end,
                    true => run.end..(run.end + run_rows).min(whole.end),
                    false if group.end < queries.len() => whole.start..(whole.start + run_rows).min(whole.end),
                    false => run.end..run.end,
                };
                let mut shares = codes.shares(next, deciders * (run.len() / LANES));
                let groups = in_lanes.iter().flatten();
                for (g, lanes_group) in grouped.clone().step_by(QUERY_LANES).zip(groups) {
                    let thresholds = std::array::from_fn(|j| match j < lanes_group.len() {
                        true => later.run_threshold(coded, g + j, tops),
                        false => f32::INFINITY,
                    });
                    let undecided = |j, row| {
                        let q = g + j;
                        self.rescore_later((queries, scales, q), [row], 0, (tops, coded), &mut later);
                        later.threshold(coded, q, tops)
                    };
                    let ahead = |_| codes::prefetch_lines(shares.next().unwrap_or_default());
                    lanes.rules_out_group_run(lanes_group, run.clone(), thresholds, (ahead, undecided));
                }
                for q in singles.clone() {
                    let query = ready[q - first].as_ref().expect("made ready");
                    let threshold = later.run_threshold(coded, q, tops);
                    let undecided = |row, ruled| {
                        let lanes: [usize; LANES] = std::array::from_fn(|r| row + r);
                        self.rescore_later((queries, scales, q), lanes, ruled, (tops, coded), &mut later);
                        later.threshold(coded, q, tops)
                    };
                    let ahead = |_| codes::prefetch_lines(shares.next().unwrap_or_default());
                    lanes.rules_out_run(query, run.clone(), threshold, (ahead, undecided));
                }
            }
        }
        for row in whole.end..rows.end {
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
    pub(super) fn scan_coded_masked<const R: usize>(
        &self,
        queries: &[&[f32]],
        scales: &[f32],
        coded: &Coded,
        mask: &RoaringBitmap,
        rows: Range<usize>,
        tops: &mut [TopK],
    ) -> FirstPass {
        const BLOCK: usize = 64;
        let codes = self.codes.expect("a coded scan is of an index with codes");
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
            while at + R <= block.len() {
                let ahead = block.get(at + CODES_PREFETCH_ROWS..).unwrap_or_default();
                self.coded_rows::<R>(
                    queries,
                    scales,
                    coded,
                    (codes, std::array::from_fn(|r| block[at + r]), &ahead[..ahead.len().min(R)]),
                    tops,
                    &mut later,
                );
                at += R;
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

    /// `coded_rows` through the floors: one query at a time, as each row
    /// may want another of the query's codes (one per scale, in `grids`).
    #[inline(always)]
    fn floor_rows<const R: usize>(
        &self,
        (queries, scales, grids): (&[&[f32]], &[f32], &[Grids]),
        coded: &Coded,
        (codes, rows, ahead): (&Codes, [usize; R], &[usize]),
        tops: &mut [TopK],
        later: &mut Later,
    ) {
        for &row in ahead {
            codes.prefetch(row, 1);
        }
        for (q, grids) in grids.iter().enumerate() {
            let ruled = grids.rules_out(coded.kernel, codes, rows, coded.threshold(q, &tops[q]));
            self.rescore_later((queries, scales, q), rows, ruled, (tops, coded), later);
        }
    }

    /// The int8 pass of `rows` (of `codes`) for every query: their integer
    /// products, a tile of queries at a time (`Kernel::query_tile`), their
    /// bounds against each query's farthest kept, and the pairs those cannot
    /// rule out scored exactly (`later`). The codes of the rows
    /// `ahead` are asked for meanwhile, one row per tile of queries (all at
    /// once stalls on the lines in flight) and the rest after the last.
    #[inline(always)]
    pub(super) fn coded_rows<const R: usize>(
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
                return self.floor_rows((queries, scales, grids), coded, (codes, rows, ahead), tops, later);
            }
        };
        let norms = rows.map(|row| self.norms[row]);
        let row_scales = if self.metric.is_scaled() { rows.map(|row| self.inverse_norms[row]) } else { [1.0; R] };
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
    pub(super) fn coded_tile<const Q: usize, const R: usize>(
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
    pub(super) fn rescore_later<const R: usize>(
        &self,
        (queries, scales, q): (&[&[f32]], &[f32], usize),
        rows: [usize; R],
        ruled: u32,
        (tops, coded): (&mut [TopK], &Coded),
        later: &mut Later,
    ) {
        let mut left = !ruled & ((1 << R) - 1);
        while left != 0 {
            let row = rows[left.trailing_zeros() as usize];
            left &= left - 1;
            self.prefetch_row(row);
            if let Some((q, row)) = later.queue((q, row)) {
                later.rescored += u64::from(self.rescore((queries, scales), (q, row), tops, coded));
            }
        }
    }

    /// Scores every pair still queued in `later`; returns how many pairs it
    /// scored exactly in all.
    pub(super) fn rescore_all(
        &self,
        queries: (&[&[f32]], &[f32]),
        tops: &mut [TopK],
        coded: &Coded,
        mut later: Later,
    ) -> u64 {
        let mut rescored = later.rescored;
        for pair in later.drain() {
            rescored += u64::from(self.rescore(queries, pair, tops, coded));
        }
        rescored
    }

    /// Scores query `q` exactly against row `row`, offering it to its top,
    /// and shares the top's farthest kept (`Coded::share`), unless a second
    /// look rules the row out (`finely_beyond`); returns whether it scored
    /// it.
    #[inline(always)]
    pub(super) fn rescore(
        &self,
        (queries, scales): (&[&[f32]], &[f32]),
        (q, row): (usize, usize),
        tops: &mut [TopK],
        coded: &Coded,
    ) -> bool {
        if let CodedQueries::Products { codes, bounds } = coded.queries {
            let tile = coded.kernel.query_tile();
            let query = (coded.kernel, &codes[q], &bounds[q / tile], q % tile);
            if self.finely_beyond(query, row, coded.threshold(q, &tops[q])) {
                return false;
            }
        }
        let top = std::slice::from_mut(&mut tops[q]);
        self.scan_tile::<1, 1>(&queries[q..=q], &scales[q..=q], row..row + 1, top, &[]);
        coded.share(q, &tops[q]);
        true
    }

    /// Whether a second look (`codes::Bounds::rules_out_finely`) puts row
    /// `row` strictly farther than `threshold` from query `q` of `bounds`,
    /// whose code is `code`. Its products cost a fraction of the row's
    /// exact score (a byte a value, from codes just read), and where the
    /// first pass is loose (rows alike, image patches) it rules out most of
    /// the rows that pass could not.
    #[inline(always)]
    pub(super) fn finely_beyond(
        &self,
        (kernel, code, bounds, q): (cpu::Kernel, &QueryCode, &codes::Bounds, usize),
        row: usize,
        threshold: f32,
    ) -> bool {
        let codes = self.codes.expect("a coded pass has codes");
        bounds.rules_out_finely((kernel, code, q), codes, self.row_terms(row), threshold)
    }

    /// Row `row` as a second look takes it: the row, its norm bound and
    /// (cosine) scale.
    #[inline(always)]
    pub(super) fn row_terms(&self, row: usize) -> (usize, f32, f32) {
        let row_scale = if self.metric.is_scaled() { self.inverse_norms[row] } else { 1.0 };
        (row, self.norms[row], row_scale)
    }
}
