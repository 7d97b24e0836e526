//! One index: dense rows of vectors, ids and metadata, and an id -> row map.
//!
//! Row `r` owns `vectors[r*dims .. (r+1)*dims]`, `ids[r]`, `metadata[r]`,
//! `norms[r]` and, for cosine, `inverse_norms[r]`. Deleting swaps the last
//! row into the hole, so the arrays stay dense and a scan never skips
//! tombstones. How the rows are scanned is in `scan`.

mod meta;
mod rows;

use std::borrow::Cow;
use std::fmt;

use roaring::RoaringBitmap;
use smallvec::SmallVec;

use super::aligned::Aligned;
use super::codes::{Codes, Grid};
use super::filter::Filter;
use super::kernels;
pub use super::metric::{Metric, MetricError, Power, VectorError};
use super::scan::View;
use super::screen;
use super::topk::TopK;
use rows::RowMap;

/// One row's metadata text, kept in place when it is 16 bytes or shorter
/// (`{"n":"123456"}`): 24 bytes a row then, where a boxed text takes 16
/// and a heap block of at least 32.
pub type Text = SmallVec<[u8; 16]>;

/// One row taken out of an index: its vector and metadata text.
pub type Row = (Vec<f32>, Box<[u8]>);

/// An index's rows in order: ids, vectors (row after row), metadata texts.
pub type Parts<'a> = (&'a [i64], &'a [f32], &'a [Text]);

pub struct Index {
    dims: usize,
    metric: Metric,
    /// In whole cache lines (`Aligned`): where `dims` is a multiple of 16,
    /// every row starts a line.
    vectors: Aligned<f32>,
    /// Cosine only: 1/|v| per row, so the stored vector stays exactly as given.
    inverse_norms: Vec<f32>,
    /// An upper bound on |v| per row, for the first passes' error bounds.
    norms: Vec<f32>,
    /// Where the CPU has an int8 kernel, for cosine, ip, l2, l1, linf and
    /// bc: each row's code for the first pass of a search (`codes`).
    codes: Option<Codes>,
    ids: Vec<i64>,
    /// Each row's metadata as a JSON object text, ready to copy into a reply;
    /// empty for `{}`.
    metadata: Vec<Text>,
    rows: RowMap,
    /// Which rows hold which metadata values, for filters.
    meta: meta::MetaIndex,
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
            vectors: Aligned::new(),
            inverse_norms: Vec::new(),
            norms: Vec::new(),
            codes: Index::code_grid(dims, metric).and_then(|grid| Codes::new(dims, grid)),
            ids: Vec::new(),
            metadata: Vec::new(),
            rows: RowMap::new(),
            meta: meta::MetaIndex::default(),
        }
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    /// The grid of the int8 codes an index keeps of its rows, if it keeps
    /// any: those whose scores a first pass bounds (`codes` for products,
    /// `codes::floors` for coordinate distances), where this process runs
    /// the pass.
    fn code_grid(dims: usize, metric: Metric) -> Option<Grid> {
        let grid = metric.first_pass()?.grid();
        (dims <= super::codes::DIMS_MAX && super::cpu::paths().int8().is_some()).then_some(grid)
    }

    /// Bytes of int8 codes kept per row (0 without codes).
    pub fn code_bytes_per_row(&self) -> usize {
        self.codes.as_ref().map_or(0, Codes::bytes_per_row)
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
        self.rows.get(&self.ids, id).is_some()
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
        self.metric.check(vector)
    }

    /// Checks a query (`check_vector`) and makes it ready to scan: for
    /// cosine and the inner product, scales it by the power of two that
    /// brings its norm into [1, 2). Every product with a row is then about
    /// the row's own magnitude: none underflows because the query is tiny,
    /// and the ranking does not depend on the query's scale. A power of two
    /// changes no ranking, and no bit of any product or sum but the
    /// exponent, wherever nothing underflows or overflows (every distance
    /// of cosine, which divides the norm back out, is unchanged bit for
    /// bit). The distances (l2 and the rest) compare the query with each
    /// row value by value, and leave it as it is. Returns the power of two
    /// the query was divided by, for `score_of`.
    pub fn prepare_query(&self, query: &mut [f32]) -> Result<f64, VectorError> {
        let squared = self.checked_squared_norm(query)?;
        if !self.metric.is_similarity() {
            return Ok(1.0);
        }
        Ok(kernels::scale_to_unit_norm(query, squared))
    }

    /// The value a hit was ranked by, as a search reports it: the cosine
    /// similarity, the inner product with the query as it was given, or the
    /// distance (squared Euclidean for l2); from the hit's `distance` and the
    /// `divisor` that `prepare_query` returned. The inner product is scaled
    /// back by that power of two: exact, unless the product leaves f32's
    /// normal range, where it rounds once.
    pub fn score_of(&self, distance: f32, divisor: f64) -> f32 {
        self.metric.score(distance, divisor)
    }

    /// Stores or replaces the embedding `id`. The vector must have passed `check_vector`.
    pub fn upsert(&mut self, id: i64, vector: &[f32], metadata: &[u8]) {
        debug_assert_eq!(self.check_vector(vector), Ok(()));
        let squared_norm = kernels::squared_norm(vector);
        let inverse_norm = if self.metric.is_scaled() { kernels::inverse_norm_of(squared_norm) } else { 0.0 };
        let norm = screen::norm_bound_of(squared_norm);
        match self.rows.get(&self.ids, id) {
            Some(row) => {
                let row = row as usize;
                self.vectors[row * self.dims..(row + 1) * self.dims].copy_from_slice(vector);
                self.norms[row] = norm;
                if let Some(codes) = &mut self.codes {
                    codes.set(row, vector);
                }
                if self.metric.is_scaled() {
                    self.inverse_norms[row] = inverse_norm;
                }
                if *self.metadata[row] != *metadata {
                    self.meta.remove(row as u32, &self.metadata[row]);
                    self.meta.add(row as u32, metadata);
                    self.metadata[row] = Text::from_slice(metadata);
                }
            }
            None => {
                let row = u32::try_from(self.ids.len()).expect("an index holds at most 2^32 rows");
                self.vectors.extend_from_slice(vector);
                self.norms.push(norm);
                if let Some(codes) = &mut self.codes {
                    codes.push(vector);
                    if codes.wants_centre() {
                        codes.centre(&self.vectors);
                    }
                }
                if self.metric.is_scaled() {
                    self.inverse_norms.push(inverse_norm);
                }
                self.ids.push(id);
                self.metadata.push(Text::from_slice(metadata));
                self.meta.add(row, metadata);
                self.rows.insert(&self.ids, row);
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
        let Some(row) = self.rows.remove(&self.ids, id) else {
            return false;
        };
        let row = row as usize;
        let last = self.ids.len() - 1;
        let metadata = self.metadata.swap_remove(row);
        self.meta.remove(row as u32, &metadata);
        if row != last {
            self.meta.moved(last as u32, row as u32, &self.metadata[row]);
        }
        take(&self.vectors[row * self.dims..(row + 1) * self.dims], metadata.into_vec().into_boxed_slice());
        if row != last {
            let (dims, moved_id) = (self.dims, self.ids[last]);
            self.vectors.copy_within(last * dims..(last + 1) * dims, row * dims);
            self.rows.moved(moved_id, last as u32, row as u32);
        }
        self.vectors.truncate(last * self.dims);
        self.ids.swap_remove(row);
        self.norms.swap_remove(row);
        if let Some(codes) = &mut self.codes {
            codes.swap_remove(row);
        }
        if self.metric.is_scaled() {
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
        vectors: Aligned<f32>,
        metadata: Vec<Text>,
    ) -> Result<Index, String> {
        if dims == 0 || vectors.len() != ids.len() * dims || metadata.len() != ids.len() {
            return Err(format!(
                "{} ids, {} floats and {} metadata for {dims} dimensions",
                ids.len(),
                vectors.len(),
                metadata.len()
            ));
        }
        let rows = RowMap::of(&ids).map_err(|id| format!("id {id} appears twice"))?;
        let squared_norms: Vec<f64> = vectors.chunks_exact(dims).map(kernels::squared_norm).collect();
        let inverse_norms = if metric.is_scaled() {
            squared_norms.iter().map(|&s| kernels::inverse_norm_of(s)).collect()
        } else {
            Vec::new()
        };
        let norms = squared_norms.into_iter().map(screen::norm_bound_of).collect();
        let codes = Index::code_grid(dims, metric).and_then(|grid| Codes::of(dims, grid, &vectors));
        let mut meta = meta::MetaIndex::default();
        for (row, text) in metadata.iter().enumerate() {
            meta.add(row as u32, text);
        }
        Ok(Index { dims, metric, vectors, inverse_norms, norms, codes, ids, metadata, rows, meta })
    }

    /// Whether a child forked from now on gets this index's two large
    /// arrays, its vectors and its codes (`Aligned::inherit`). What
    /// `parts` gives stays readable in a child with `rows`.
    pub fn inherit(&self, rows: bool, codes: bool) {
        self.vectors.inherit(rows);
        if let Some(own) = &self.codes {
            own.inherit(codes);
        }
    }

    /// The rows, for writing a snapshot: ids, vectors (row after row), metadata texts.
    pub fn parts(&self) -> Parts<'_> {
        (&self.ids, &self.vectors, &self.metadata)
    }

    /// The stored vector and metadata text of `id`.
    pub fn get(&self, id: i64) -> Option<(&[f32], &[u8])> {
        let row = self.rows.get(&self.ids, id)?;
        Some((self.vector_of_row(row), &self.metadata[row as usize]))
    }

    /// The stored vector of row `row`.
    pub fn vector_of_row(&self, row: u32) -> &[f32] {
        let row = row as usize;
        &self.vectors[row * self.dims..(row + 1) * self.dims]
    }

    pub fn metadata_of_row(&self, row: u32) -> &[u8] {
        &self.metadata[row as usize]
    }

    pub fn id_of_row(&self, row: u32) -> i64 {
        self.ids[row as usize]
    }

    /// What a scan reads of this index, borrowed (`scan`).
    pub fn view(&self) -> View<'_> {
        View {
            dims: self.dims,
            metric: self.metric,
            vectors: &self.vectors,
            inverse_norms: &self.inverse_norms,
            norms: &self.norms,
            codes: self.codes.as_ref(),
            ids: &self.ids,
        }
    }

    /// Whether a scan of this index is large enough to be split across
    /// threads: one worth waiting a moment for other searches to join.
    pub fn is_large(&self) -> bool {
        self.view().is_large()
    }

    /// Exact search: leaves the `k` nearest rows in `top`. The query must have
    /// passed `prepare_query`.
    pub fn search(&self, query: &[f32], k: usize, top: &mut TopK) {
        self.view().search_many_split(&[query], &[k], std::slice::from_mut(top), &mut []);
    }

    /// `search` without the int8 first pass: every row scored in f32. The
    /// answer is the same; for measurements and tests.
    pub fn search_f32(&self, query: &[f32], k: usize, top: &mut TopK) {
        self.view().search_f32(query, k, top);
    }

    /// Several searches at once, split across `partials.len() + 1` threads
    /// (`View::search_many_split`).
    pub fn search_many_split(&self, queries: &[&[f32]], ks: &[usize], tops: &mut [TopK], partials: &mut [Vec<TopK>]) {
        self.view().search_many_split(queries, ks, tops, partials);
    }

    /// The rows `filter` matches, from the metadata index (which indexes
    /// the keys it names, if no filter has before); `None` when it matches
    /// every row, so that a scan needs no mask.
    pub fn matching(&mut self, filter: &Filter) -> Option<RoaringBitmap> {
        self.index_keys(filter);
        self.rows_matching(filter).map(Cow::into_owned)
    }

    /// Indexes the metadata keys `filter` names that no filter has named
    /// before, for `rows_matching`.
    pub fn index_keys(&mut self, filter: &Filter) {
        self.meta.index_keys(filter, &self.metadata);
    }

    /// `matching`, where the keys `filter` names have been indexed
    /// (`index_keys`): the rows borrowed from the metadata index where a
    /// condition names one set of them (an `Eq`, an `Exists`).
    pub fn rows_matching(&self, filter: &Filter) -> Option<Cow<'_, RoaringBitmap>> {
        if *filter == Filter::All {
            return None;
        }
        let rows = u32::try_from(self.len()).expect("an index holds at most 2^32 rows");
        let set = self.meta.matching(filter, rows);
        (set.len() < u64::from(rows)).then_some(set)
    }

    /// A page of a listing by id: into `page`, the rows of the ids after
    /// `after` (all if `None`) among `rows` (all if `None`), the `limit`
    /// smallest, ascending by id. Returns whether any row after the page
    /// would follow.
    pub fn scroll(&self, after: Option<i64>, limit: usize, rows: Option<&RoaringBitmap>, page: &mut Vec<u32>) -> bool {
        // The `limit + 1` smallest ids after `after`: a max-heap whose root
        // is the largest kept. The one beyond the page tells that more follow.
        // Without `after`, every id counts, `i64::MIN` too.
        let mut heap = std::collections::BinaryHeap::with_capacity(limit + 1);
        let mut offer = |row: u32| {
            let id = self.ids[row as usize];
            if after.is_some_and(|after| id <= after) {
                return;
            }
            if heap.len() <= limit {
                heap.push((id, row));
            } else if heap.peek().is_some_and(|&(largest, _)| id < largest) {
                heap.pop();
                heap.push((id, row));
            }
        };
        match rows {
            Some(rows) => rows.iter().for_each(&mut offer),
            None => (0..self.len() as u32).for_each(&mut offer),
        }
        let mut sorted = heap.into_sorted_vec();
        let more = sorted.len() > limit;
        sorted.truncate(limit);
        page.clear();
        page.extend(sorted.into_iter().map(|(_, row)| row));
        more
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::scan::tests::ids_of;

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
    fn prepare_query_refuses_what_check_vector_refuses() {
        let index = Index::new(2, Metric::Cosine);
        assert_eq!(index.prepare_query(&mut [1e20, 5e19]), Err(VectorError::NormTooLarge));
        assert_eq!(index.prepare_query(&mut [1e-23, 5e-24]), Err(VectorError::NormTooSmall));
        assert_eq!(index.prepare_query(&mut [0.0, 0.0]), Err(VectorError::ZeroForCosine));
        let mut tiny = [f32::from_bits(1 << 9), 0.0]; // 2^-140, a subnormal
        assert_eq!(Index::new(2, Metric::Ip).prepare_query(&mut tiny), Ok(2f64.powi(-140)));
        assert_eq!(tiny, [1.0, 0.0]);
        let mut l2 = [1e-40f32, 3.0];
        assert_eq!(Index::new(2, Metric::L2).prepare_query(&mut l2), Ok(1.0));
        assert_eq!(l2, [1e-40, 3.0], "l2 queries are left as given");
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
        let js = Index::new(3, Metric::JensenShannon);
        assert_eq!(js.check_vector(&[0.0, -0.0, 1.0]), Ok(()), "-0 is not below zero");
        assert_eq!(js.check_vector(&[0.5, -1e-45, 1.0]), Err(VectorError::Negative { position: 1 }));
        assert_eq!(Index::new(3, Metric::L1).check_vector(&[0.5, -1.0, 1.0]), Ok(()));
    }
}
