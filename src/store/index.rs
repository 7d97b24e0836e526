//! One index: dense rows of vectors, ids and metadata, and an id -> row map.
//!
//! Row `r` owns `vectors[r*dims .. (r+1)*dims]`, `ids[r]`, `metadata[r]` and,
//! for cosine, `inverse_norms[r]`. Deleting swaps the last row into the hole,
//! so the arrays stay dense and a scan never skips tombstones.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use ahash::AHashMap;

use super::kernels;
use super::topk::{Candidate, TopK};

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
    WrongDimensions { expected: usize, got: usize },
    NotFinite { position: usize },
    ZeroForCosine,
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

    /// Checks a vector against this index: length, finiteness, and (cosine) a direction.
    pub fn check_vector(&self, vector: &[f32]) -> Result<(), VectorError> {
        if vector.len() != self.dims {
            return Err(VectorError::WrongDimensions { expected: self.dims, got: vector.len() });
        }
        if let Some(position) = vector.iter().position(|x| !x.is_finite()) {
            return Err(VectorError::NotFinite { position });
        }
        if self.metric == Metric::Cosine && vector.iter().all(|&x| x == 0.0) {
            return Err(VectorError::ZeroForCosine);
        }
        Ok(())
    }

    /// Stores or replaces the embedding `id`. The vector must have passed `check_vector`.
    pub fn upsert(&mut self, id: i64, vector: &[f32], metadata: &[u8]) {
        debug_assert_eq!(self.check_vector(vector), Ok(()));
        let inverse_norm = match self.metric {
            Metric::Cosine => kernels::inverse_norm(vector),
            Metric::L2 | Metric::Ip => 0.0,
        };
        match self.rows.get(&id) {
            Some(&row) => {
                let row = row as usize;
                self.vectors[row * self.dims..(row + 1) * self.dims].copy_from_slice(vector);
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
        let inverse_norms = match metric {
            Metric::Cosine => vectors.chunks_exact(dims).map(kernels::inverse_norm).collect(),
            Metric::L2 | Metric::Ip => Vec::new(),
        };
        Ok(Index { dims, metric, vectors, inverse_norms, ids, metadata, rows })
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
    /// passed `check_vector`.
    pub fn search(&self, query: &[f32], k: usize, top: &mut TopK) {
        self.search_many_split(&[query], &[k], std::slice::from_mut(top), &mut []);
    }

    /// Several searches of this index at once: the rows are read once, a
    /// tile at a time, and every query is scored against a tile before the
    /// next is read (see `scan_many`). `tops[q]` receives the
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
        let (one, many): ([f32; 1], Vec<f32>);
        let scales: &[f32] = if let [query] = queries {
            one = [self.query_scale(query)];
            &one
        } else {
            many = queries.iter().map(|query| self.query_scale(query)).collect();
            &many
        };
        let reset = |tops: &mut [TopK]| {
            for (top, &k) in tops.iter_mut().zip(ks) {
                top.reset(k.min(rows));
            }
        };
        reset(tops);
        if partials.is_empty() {
            return self.scan_many(queries, scales, 0..rows, tops);
        }
        let taken = AtomicUsize::new(0);
        let scan = |tops: &mut [TopK]| loop {
            let start = taken.fetch_add(chunk, Ordering::Relaxed);
            if start >= rows {
                break;
            }
            self.scan_many(queries, scales, start..(start + chunk).min(rows), tops);
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

    /// Offers every row of `rows` to the tops of the queries: a tile of rows
    /// at a time, each scored against the queries a tile of them at a time.
    fn scan_many(&self, queries: &[&[f32]], scales: &[f32], rows: Range<usize>, tops: &mut [TopK]) {
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
        let query_tiles = queries.len().div_ceil(QUERY_TILE);
        let mut start = rows.start;
        while start < rows.end {
            let tile = start..(start + ROW_TILE).min(rows.end);
            let ahead = (tile.start + PREFETCH_TILES * ROW_TILE).min(rows.end);
            let ahead = &self.vectors[ahead * self.dims..(ahead + ROW_TILE).min(rows.end) * self.dims];
            let share = ahead.len().div_ceil(query_tiles).next_multiple_of(kernels::LINE_FLOATS);
            let mut prefetches = ahead.chunks(share.max(1));
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

    /// Cosine: 1/|query|. Scaling the query does not change the order; doing
    /// it once keeps the similarities comparable in magnitude to 1.
    fn query_scale(&self, query: &[f32]) -> f32 {
        match self.metric {
            Metric::Cosine => kernels::inverse_norm(query),
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
                    -((score * self.inverse_norms[row]) * scales[q])
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

    /// `count` vectors of `dims` under ids `0..count`, each twice (again
    /// under id + 10,000), so that ties have to break the same way.
    fn twins(dims: usize, count: i64, metric: Metric) -> Index {
        let mut index = Index::new(dims, metric);
        for id in 0..count {
            let v: Vec<f32> = (0..dims as i64).map(|d| ((id * 31 + d * 17) % 23) as f32 - 11.5).collect();
            index.upsert(id, &v, b"");
            index.upsert(10_000 + id, &v, b"");
        }
        index
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
    }
}
