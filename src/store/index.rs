//! One index: dense rows of vectors, ids and metadata, and an id -> row map.
//!
//! Row `r` owns `vectors[r*dims .. (r+1)*dims]`, `ids[r]`, `metadata[r]`,
//! `norms[r]` and, for cosine, `inverse_norms[r]`. Deleting swaps the last
//! row into the hole, so the arrays stay dense and a scan never skips
//! tombstones.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use ahash::AHashMap;

use super::kernels;
use super::screen::{self, Screen};
use super::topk::{Candidate, TopK};
use crate::limits::{COSINE_SQUARED_NORM_MIN, SQUARED_NORM_MAX};

/// How nearness is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Cosine similarity, larger is nearer.
    Cosine,
    /// Squared Euclidean distance, smaller is nearer.
    L2,
    /// Inner product, larger is nearer.
    Ip,
}

impl Metric {
    pub const ALLOWED: &'static str = "cosine, l2, ip";

    pub fn parse(name: &str) -> Option<Metric> {
        match name {
            "cosine" => Some(Metric::Cosine),
            "l2" => Some(Metric::L2),
            "ip" => Some(Metric::Ip),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::L2 => "l2",
            Metric::Ip => "ip",
        }
    }
}

/// Why one vector cannot be stored in (or searched against) an index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorError {
    WrongDimensions {
        expected: usize,
        got: usize,
    },
    NotFinite {
        position: usize,
    },
    ZeroForCosine,
    /// Euclidean norm above 2^62 (`limits::SQUARED_NORM_MAX`).
    NormTooLarge,
    /// Cosine only: a Euclidean norm below 2^-62 (`limits::COSINE_SQUARED_NORM_MIN`).
    NormTooSmall,
}

impl fmt::Display for VectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VectorError::WrongDimensions { expected, got } => {
                write!(f, "expected {expected} dimensions, got {got}")
            }
            VectorError::NotFinite { position } => {
                write!(f, "value at position {position} is not a finite 32-bit float")
            }
            VectorError::ZeroForCosine => {
                write!(f, "an all-zero vector has no direction in a cosine index")
            }
            VectorError::NormTooLarge => {
                write!(f, "its Euclidean norm is above 2^62 (about 4.6e18), the largest that is scored exactly")
            }
            VectorError::NormTooSmall => write!(
                f,
                "its Euclidean norm is below 2^-62 (about 2.2e-19), the smallest a cosine index scores exactly"
            ),
        }
    }
}

/// Below this many floats per thread, one thread scans alone: starting a
/// thread costs more than it would save (4 Mi floats is 16 MiB, a few ms).
pub const PARALLEL_SCAN_FLOATS_MIN: usize = 4 << 20;

/// How far ahead of the tile of rows being scored `search_many` asks for
/// rows from memory, in tiles: far enough that they arrive in time, near
/// enough that they are still in cache when their turn comes.
const PREFETCH_TILES: usize = 4;

/// Rows a thread of a split scan takes at a time, in floats: 4 MiB, a few
/// hundred microseconds of scanning for one query, so that the threads
/// meet the chunk counter a few dozen times per scan of a large index.
const SCAN_CHUNK_FLOATS: usize = 1 << 20;

/// Queries scored together by one tile of `search_many`, and rows per tile
/// with them: each load then feeds 4 multiply-adds instead of one. With
/// AVX-512's 32 registers the 4 x 4 sums stay in registers; with 16, 4 x 3
/// do. (Chosen with the `kernels` bench: 4 x 2 up to 6 x 4 and 12 x 1 were
/// tried; the wider tiles gained nothing more, the narrower lost.)
const QUERY_TILE: usize = 4;
#[cfg(target_feature = "avx512f")]
const ROW_TILE: usize = 4;
#[cfg(not(target_feature = "avx512f"))]
const ROW_TILE: usize = 3;

/// Batches of at least this many searches (of a cosine or inner-product
/// index) take a first pass in bfloat16 where the CPU has it (`screen`).
/// Fewer are bound by reading the rows, which the pass does not shorten.
const SCREEN_QUERIES_MIN: usize = 4;

/// Pairs of a tile left undecided by the bfloat16 pass above which the f32
/// tile scores all its pairs: that costs about what 4 pairs scored alone do.
const SCREEN_WHOLE_TILE_PAIRS: usize = 4;

/// Rows per tile of the bfloat16 pass: each tile of rows is converted once
/// and then scored against every query, `QUERY_TILE` at a time.
const SCREEN_ROW_TILE: usize = 4;

/// One row taken out of an index: its vector and metadata text.
pub type Row = (Vec<f32>, Box<[u8]>);

/// An index's rows in order: ids, vectors (row after row), metadata texts.
pub type Parts<'a> = (&'a [i64], &'a [f32], &'a [Box<[u8]>]);

pub struct Index {
    dims: usize,
    metric: Metric,
    vectors: Vec<f32>,
    /// Cosine only: 1/|v| per row, so the stored vector stays exactly as given.
    inverse_norms: Vec<f32>,
    /// An upper bound on |v| per row, for the bfloat16 pass's error bound.
    norms: Vec<f32>,
    ids: Vec<i64>,
    /// Each row's metadata as a JSON object text, ready to copy into a reply;
    /// empty for `{}`.
    metadata: Vec<Box<[u8]>>,
    rows: AHashMap<i64, u32>,
}

/// Shape only: an index may hold millions of vectors.
impl fmt::Debug for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Index")
            .field("dims", &self.dims)
            .field("metric", &self.metric)
            .field("len", &self.len())
            .finish()
    }
}

impl Index {
    pub fn new(dims: usize, metric: Metric) -> Index {
        assert!(dims > 0);
        Index {
            dims,
            metric,
            vectors: Vec::new(),
            inverse_norms: Vec::new(),
            norms: Vec::new(),
            ids: Vec::new(),
            metadata: Vec::new(),
            rows: AHashMap::new(),
        }
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    pub fn metric(&self) -> Metric {
        self.metric
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn contains(&self, id: i64) -> bool {
        self.rows.contains_key(&id)
    }

    /// Checks a vector against this index: length, finiteness, (cosine) a
    /// direction, and a norm inside the numeric domain (`limits`).
    pub fn check_vector(&self, vector: &[f32]) -> Result<(), VectorError> {
        self.checked_squared_norm(vector).map(|_| ())
    }

    /// `check_vector`, giving the vector's `kernels::squared_norm`.
    fn checked_squared_norm(&self, vector: &[f32]) -> Result<f64, VectorError> {
        if vector.len() != self.dims {
            return Err(VectorError::WrongDimensions { expected: self.dims, got: vector.len() });
        }
        if let Some(position) = vector.iter().position(|x| !x.is_finite()) {
            return Err(VectorError::NotFinite { position });
        }
        // Zero only for the zero vector: the square of any other f32 is a
        // normal f64.
        let squared = kernels::squared_norm(vector);
        if self.metric == Metric::Cosine && squared == 0.0 {
            return Err(VectorError::ZeroForCosine);
        }
        if squared > SQUARED_NORM_MAX {
            return Err(VectorError::NormTooLarge);
        }
        if self.metric == Metric::Cosine && squared < COSINE_SQUARED_NORM_MIN {
            return Err(VectorError::NormTooSmall);
        }
        Ok(squared)
    }

    /// Checks a query (`check_vector`) and makes it ready to scan: for
    /// cosine and the inner product, scales it by the power of two that
    /// brings its norm into [1, 2). Every product with a row is then about
    /// the row's own magnitude: none underflows because the query is tiny,
    /// and the ranking does not depend on the query's scale. A power of two
    /// changes no ranking, and no bit of any product or sum but the
    /// exponent, wherever nothing underflows or overflows (every distance
    /// of cosine, which divides the norm back out, is unchanged bit for
    /// bit). l2 subtracts the query from each row and is left as it is.
    pub fn prepare_query(&self, query: &mut [f32]) -> Result<(), VectorError> {
        let squared = self.checked_squared_norm(query)?;
        if self.metric != Metric::L2 {
            kernels::scale_to_unit_norm(query, squared);
        }
        Ok(())
    }

    /// Stores or replaces the embedding `id`. The vector must have passed `check_vector`.
    pub fn upsert(&mut self, id: i64, vector: &[f32], metadata: &[u8]) {
        debug_assert_eq!(self.check_vector(vector), Ok(()));
        let squared_norm = kernels::squared_norm(vector);
        let inverse_norm = match self.metric {
            Metric::Cosine => kernels::inverse_norm_of(squared_norm),
            Metric::L2 | Metric::Ip => 0.0,
        };
        let norm = screen::norm_bound_of(squared_norm);
        match self.rows.get(&id) {
            Some(&row) => {
                let row = row as usize;
                self.vectors[row * self.dims..(row + 1) * self.dims].copy_from_slice(vector);
                self.norms[row] = norm;
                if self.metric == Metric::Cosine {
                    self.inverse_norms[row] = inverse_norm;
                }
                if *self.metadata[row] != *metadata {
                    self.metadata[row] = metadata.into();
                }
            }
            None => {
                let row = u32::try_from(self.ids.len()).expect("an index holds at most 2^32 rows");
                self.vectors.extend_from_slice(vector);
                self.norms.push(norm);
                if self.metric == Metric::Cosine {
                    self.inverse_norms.push(inverse_norm);
                }
                self.ids.push(id);
                self.metadata.push(metadata.into());
                self.rows.insert(id, row);
            }
        }
    }

    /// Removes the embedding `id`; false if there was none.
    pub fn delete(&mut self, id: i64) -> bool {
        self.remove_row(id, |_, _| ())
    }

    /// Removes the embedding `id` and returns its vector and metadata.
    pub fn remove(&mut self, id: i64) -> Option<Row> {
        let mut removed = None;
        self.remove_row(id, |vector, metadata| removed = Some((vector.to_vec(), metadata)));
        removed
    }

    /// Swaps the last row into `id`'s row, handing the removed row to `take` first.
    fn remove_row(&mut self, id: i64, take: impl FnOnce(&[f32], Box<[u8]>)) -> bool {
        let Some(row) = self.rows.remove(&id) else {
            return false;
        };
        let row = row as usize;
        let last = self.ids.len() - 1;
        let metadata = self.metadata.swap_remove(row);
        take(&self.vectors[row * self.dims..(row + 1) * self.dims], metadata);
        if row != last {
            let (dims, moved_id) = (self.dims, self.ids[last]);
            self.vectors.copy_within(last * dims..(last + 1) * dims, row * dims);
            self.rows.insert(moved_id, row as u32);
        }
        self.vectors.truncate(last * self.dims);
        self.ids.swap_remove(row);
        self.norms.swap_remove(row);
        if self.metric == Metric::Cosine {
            self.inverse_norms.swap_remove(row);
        }
        true
    }

    /// Builds an index from loaded rows (a snapshot). Fails if the parts do
    /// not fit together or an id repeats.
    pub fn from_parts(
        dims: usize,
        metric: Metric,
        ids: Vec<i64>,
        vectors: Vec<f32>,
        metadata: Vec<Box<[u8]>>,
    ) -> Result<Index, String> {
        if dims == 0 || vectors.len() != ids.len() * dims || metadata.len() != ids.len() {
            return Err(format!(
                "{} ids, {} floats and {} metadata for {dims} dimensions",
                ids.len(),
                vectors.len(),
                metadata.len()
            ));
        }
        let mut rows = AHashMap::with_capacity(ids.len());
        for (row, &id) in ids.iter().enumerate() {
            if rows.insert(id, row as u32).is_some() {
                return Err(format!("id {id} appears twice"));
            }
        }
        let squared_norms: Vec<f64> = vectors.chunks_exact(dims).map(kernels::squared_norm).collect();
        let inverse_norms = match metric {
            Metric::Cosine => squared_norms.iter().map(|&s| kernels::inverse_norm_of(s)).collect(),
            Metric::L2 | Metric::Ip => Vec::new(),
        };
        let norms = squared_norms.into_iter().map(screen::norm_bound_of).collect();
        Ok(Index { dims, metric, vectors, inverse_norms, norms, ids, metadata, rows })
    }

    /// The rows, for writing a snapshot: ids, vectors (row after row), metadata texts.
    pub fn parts(&self) -> Parts<'_> {
        (&self.ids, &self.vectors, &self.metadata)
    }

    /// The stored vector and metadata text of `id`.
    pub fn get(&self, id: i64) -> Option<(&[f32], &[u8])> {
        let row = *self.rows.get(&id)? as usize;
        Some((&self.vectors[row * self.dims..(row + 1) * self.dims], &self.metadata[row]))
    }

    pub fn metadata_of_row(&self, row: u32) -> &[u8] {
        &self.metadata[row as usize]
    }

    /// Exact search: leaves the `k` nearest rows in `top`. The query must have
    /// passed `prepare_query`.
    pub fn search(&self, query: &[f32], k: usize, top: &mut TopK) {
        self.search_many_split(&[query], &[k], std::slice::from_mut(top), &mut []);
    }

    /// Several searches of this index at once: the rows are read once, a
    /// tile at a time, and every query is scored against a tile before the
    /// next is read (see `scan_exact`). `tops[q]` receives the
    /// `ks[q]` nearest to `queries[q]`, exactly as `search` would give them.
    /// A large index is split across up to `partials.len() + 1` threads (the
    /// caller waits anyway; memory bandwidth is what one thread cannot use up
    /// alone); each `partials[t]` must hold a `TopK` per query.
    pub fn search_many(&self, queries: &[&[f32]], ks: &[usize], tops: &mut [TopK], partials: &mut [Vec<TopK>]) {
        let by_size = self.vectors.len() / PARALLEL_SCAN_FLOATS_MIN;
        let threads = (partials.len() + 1).min(by_size.max(1));
        self.search_many_split(queries, ks, tops, &mut partials[..threads - 1]);
    }

    /// `search_many` on `partials.len() + 1` threads, their nearest merged
    /// into `tops`. The threads take the rows a chunk at a time, each the
    /// next chunk no thread has taken, so that a thread slowed down (by the
    /// host, or by another process on its core) takes fewer chunks instead
    /// of holding up the others. Exact: each of the k nearest rows is among
    /// the k nearest of the rows its thread scanned.
    pub fn search_many_split(&self, queries: &[&[f32]], ks: &[usize], tops: &mut [TopK], partials: &mut [Vec<TopK>]) {
        let chunk = (SCAN_CHUNK_FLOATS / self.dims).max(1).next_multiple_of(ROW_TILE);
        self.search_in_chunks(queries, ks, tops, partials, chunk);
    }

    /// `search_many_split`, the threads taking `chunk` rows at a time.
    fn search_in_chunks(
        &self,
        queries: &[&[f32]],
        ks: &[usize],
        tops: &mut [TopK],
        partials: &mut [Vec<TopK>],
        chunk: usize,
    ) {
        assert!(queries.len() == ks.len() && ks.len() == tops.len() && chunk > 0);
        let rows = self.len();
        // A lone search keeps its scale on the stack: it allocates nothing.
        // A batch sums each query's squares once, for its scale and for the
        // bfloat16 pass's bound.
        let (one, squared_norms, many): ([f32; 1], Vec<f64>, Vec<f32>);
        let scales: &[f32] = if let [query] = queries {
            squared_norms = Vec::new();
            one = [self.query_scale(|| kernels::squared_norm(query))];
            &one
        } else {
            squared_norms = queries.iter().map(|query| kernels::squared_norm(query)).collect();
            many = squared_norms.iter().map(|&squared| self.query_scale(|| squared)).collect();
            &many
        };
        let reset = |tops: &mut [TopK]| {
            for (top, &k) in tops.iter_mut().zip(ks) {
                top.reset(k.min(rows));
            }
        };
        reset(tops);
        let screen = if queries.len() >= SCREEN_QUERIES_MIN && self.metric != Metric::L2 {
            Screen::new(queries, &squared_norms, scales, self.dims)
        } else {
            None
        };
        let screen = screen.as_ref();
        if partials.is_empty() && screen.is_none() {
            return self.scan_exact(queries, scales, 0..rows, tops);
        }
        let taken = AtomicUsize::new(0);
        let scan = |tops: &mut [TopK]| {
            // After a chunk where the pass had to score most pairs exactly
            // anyway (rows it cannot tell apart), the next go straight to
            // the exact scan: one, then twice as many after each chunk the
            // pass fails again, so that on rows it cannot thin out the pass
            // is tried on a few chunks only.
            let (mut exact_chunks, mut backoff) = (0usize, 1);
            loop {
                let start = taken.fetch_add(chunk, Ordering::Relaxed);
                if start >= rows {
                    break;
                }
                let range = start..(start + chunk).min(rows);
                match screen {
                    Some(screen) if exact_chunks == 0 => {
                        let pairs = range.len() * queries.len();
                        if self.scan_through(screen, queries, scales, range, tops) * 2 > pairs {
                            (exact_chunks, backoff) = (backoff, backoff * 2);
                        } else {
                            backoff = 1;
                        }
                    }
                    _ => {
                        exact_chunks = exact_chunks.saturating_sub(1);
                        self.scan_exact(queries, scales, range, tops);
                    }
                }
            }
        };
        std::thread::scope(|scope| {
            for partial in partials.iter_mut() {
                let partial = &mut partial[..queries.len()];
                reset(partial);
                scope.spawn(|| scan(partial));
            }
            scan(tops);
        });
        for partial in partials {
            for (top, partial) in tops.iter_mut().zip(partial.iter_mut()) {
                for &candidate in partial.sorted() {
                    top.push(candidate);
                }
            }
        }
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
    /// at a time, each scored against the queries a tile of them at a time.
    fn scan_exact(&self, queries: &[&[f32]], scales: &[f32], rows: Range<usize>, tops: &mut [TopK]) {
        if let ([query], [scale], [top]) = (queries, scales, &mut *tops) {
            // A lone query reads the rows from memory one at a time: one
            // stream of rows is read faster than several interleaved (the
            // `kernels` bench: 8 rows at a time took 1.7 times as long).
            let top = std::slice::from_mut(top);
            return self.scan_tile::<1, 1>(&[query], &[*scale], rows, top, &[]);
        }
        // Each tile of rows is scored against every tile of queries before
        // the next is read, so the rows are read from memory once, in order,
        // and stay in L1 meanwhile; the queries (a few KiB each) come from
        // L2. The query tiles share out the prefetching of a tile ahead.
        let mut start = rows.start;
        while start < rows.end {
            let tile = start..(start + ROW_TILE).min(rows.end);
            let mut prefetches = self.prefetch_shares(tile.start, ROW_TILE, rows.end, queries.len());
            let tiles = queries.chunks(QUERY_TILE).zip(scales.chunks(QUERY_TILE)).zip(tops.chunks_mut(QUERY_TILE));
            for ((queries, scales), tops) in tiles {
                let (rows, prefetch) = (tile.clone(), prefetches.next().unwrap_or_default());
                match queries.len() {
                    QUERY_TILE => self.scan_tile::<QUERY_TILE, ROW_TILE>(queries, scales, rows, tops, prefetch),
                    3 => self.scan_tile::<3, ROW_TILE>(queries, scales, rows, tops, prefetch),
                    2 => self.scan_tile::<2, ROW_TILE>(queries, scales, rows, tops, prefetch),
                    _ => self.scan_tile::<1, ROW_TILE>(queries, scales, rows, tops, prefetch),
                }
            }
            start = tile.end;
        }
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
            Metric::L2 | Metric::Ip => 1.0,
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
                Metric::L2 => unreachable!("the bfloat16 pass bounds dot products only"),
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
        self.scan_exact(queries, scales, row..rows.end, tops);
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
            let exact = kernels::tile::<kernels::Dot, Q, R>(tile_queries, &self.vectors[row * dims..(row + R) * dims]);
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
    /// into the distance the tops order by (smaller is nearer).
    #[inline(always)]
    fn scan_tile_with<M: kernels::Measure, const Q: usize, const R: usize>(
        &self,
        queries: &[&[f32]; Q],
        rows: Range<usize>,
        tops: &mut [TopK],
        prefetch: &[f32],
        distance: impl Fn(f32, usize, usize) -> f32,
    ) {
        let dims = self.dims;
        kernels::prefetch(prefetch);
        let mut row = rows.start;
        while row + R <= rows.end {
            let scores = kernels::tile::<M, Q, R>(queries, &self.vectors[row * dims..(row + R) * dims]);
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
            let scores = kernels::tile::<M, Q, 1>(queries, &self.vectors[row * dims..(row + 1) * dims]);
            for (q, (scores, top)) in scores.iter().zip(tops.iter_mut()).enumerate() {
                offer(top, distance(scores[0], row, q), self.ids[row], row);
            }
        }
    }
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
mod tests {
    use super::*;

    fn ids_of(index: &Index, query: &[f32], k: usize) -> Vec<i64> {
        let mut top = TopK::new();
        index.search(query, k, &mut top);
        top.sorted().iter().map(|c| c.id).collect()
    }

    #[test]
    fn swap_remove_keeps_rows_consistent() {
        let mut index = Index::new(2, Metric::L2);
        for id in 0..5 {
            index.upsert(id, &[id as f32, 0.0], format!("{{\"n\":\"{id}\"}}").as_bytes());
        }
        assert!(index.delete(1));
        assert!(!index.delete(1));
        assert_eq!(index.len(), 4);
        for id in [0, 2, 3, 4] {
            let (vector, metadata) = index.get(id).unwrap();
            assert_eq!(vector, &[id as f32, 0.0]);
            assert_eq!(metadata, format!("{{\"n\":\"{id}\"}}").as_bytes());
        }
        assert_eq!(ids_of(&index, &[1.0, 0.0], 2), vec![0, 2]);
    }

    #[test]
    fn upsert_replaces_in_place() {
        let mut index = Index::new(1, Metric::Ip);
        index.upsert(7, &[1.0], b"");
        index.upsert(7, &[3.0], b"{\"a\":\"b\"}");
        assert_eq!(index.len(), 1);
        assert_eq!(index.get(7).unwrap(), (&[3.0f32][..], &b"{\"a\":\"b\"}"[..]));
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
        index.search_in_chunks(queries, &ks, &mut split, partials, chunk);
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
                    for chunk in [1, 4 * ROW_TILE + 1, 1 << 20] {
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
                        eprintln!("this CPU has no AVX512-BF16: the bfloat16 pass is not tested here");
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
    /// were scored exactly; `None` where the CPU has no pass.
    #[cfg(target_arch = "x86_64")]
    fn assert_screened_finds_what_each_finds_alone(index: &Index, queries: &[Vec<f32>], what: &str) -> Option<usize> {
        let queries: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
        let ks = [1, 10, 10, 5, 20, 10, 3, 10, 40];
        let squared_norms: Vec<f64> = queries.iter().map(|q| kernels::squared_norm(q)).collect();
        let scales: Vec<f32> = squared_norms.iter().map(|&squared| index.query_scale(|| squared)).collect();
        let screen = Screen::new(&queries, &squared_norms, &scales, index.dims())?;
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
                index.search_in_chunks(&queries, &ks, &mut tops, &mut partials, chunk);
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

    #[test]
    fn prepare_query_refuses_what_check_vector_refuses() {
        let index = Index::new(2, Metric::Cosine);
        assert_eq!(index.prepare_query(&mut [1e20, 5e19]), Err(VectorError::NormTooLarge));
        assert_eq!(index.prepare_query(&mut [1e-23, 5e-24]), Err(VectorError::NormTooSmall));
        assert_eq!(index.prepare_query(&mut [0.0, 0.0]), Err(VectorError::ZeroForCosine));
        let mut tiny = [f32::from_bits(1 << 9), 0.0]; // 2^-140, a subnormal
        assert_eq!(Index::new(2, Metric::Ip).prepare_query(&mut tiny), Ok(()));
        assert_eq!(tiny, [1.0, 0.0]);
        let mut l2 = [1e-40f32, 3.0];
        assert_eq!(Index::new(2, Metric::L2).prepare_query(&mut l2), Ok(()));
        assert_eq!(l2, [1e-40, 3.0], "l2 queries are left as given");
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

    #[test]
    fn cosine_keeps_the_stored_vector_exact() {
        let mut index = Index::new(3, Metric::Cosine);
        let v = [0.1f32, 3.0e-7, 12345.678];
        index.upsert(1, &v, b"");
        assert_eq!(index.get(1).unwrap().0, &v);
    }

    #[test]
    fn check_vector_reports_each_problem() {
        let index = Index::new(2, Metric::Cosine);
        assert_eq!(index.check_vector(&[1.0]), Err(VectorError::WrongDimensions { expected: 2, got: 1 }));
        assert_eq!(index.check_vector(&[1.0, f32::INFINITY]), Err(VectorError::NotFinite { position: 1 }));
        assert_eq!(index.check_vector(&[0.0, -0.0]), Err(VectorError::ZeroForCosine));
        assert_eq!(Index::new(2, Metric::L2).check_vector(&[0.0, 0.0]), Ok(()));
        // The numeric domain's edges: norms 2^62 and 2^-62 are inside it.
        let (top, bottom) = (2f32.powi(62), 2f32.powi(-62));
        assert_eq!(index.check_vector(&[top, 0.0]), Ok(()));
        assert_eq!(index.check_vector(&[top.next_up(), 0.0]), Err(VectorError::NormTooLarge));
        assert_eq!(index.check_vector(&[bottom, 0.0]), Ok(()));
        assert_eq!(index.check_vector(&[0.0, bottom.next_down()]), Err(VectorError::NormTooSmall));
        assert_eq!(Index::new(2, Metric::Ip).check_vector(&[bottom.next_down(), 0.0]), Ok(()));
        assert_eq!(Index::new(2, Metric::L2).check_vector(&[top.next_up(), 0.0]), Err(VectorError::NormTooLarge));
    }
}
