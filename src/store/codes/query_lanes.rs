//! A group of queries decided together, a query in each lane: `Lanes`
//! with the roles of rows and queries swapped, for batches of rows under
//! `DIMS_MAX` dimensions on AVX2.
//!
//! `Lanes` puts 8 rows in a register: each row's products are summed across
//! the lanes of its own register (`x86::sum8`), and the rows are read as
//! whole 32-byte blocks, so that 50 dimensions take the products of 64.
//! Here each row's codes are broadcast 4 at a time (one `vpbroadcastd`
//! from the row as it lies in memory) and multiplied by the same 4
//! dimensions of 8 queries, which lie side by side in one register (their
//! codes interleaved once for the scan): each lane sums one query's
//! products, nothing is summed across lanes, and 50 dimensions take the
//! products of 52. The rows' terms are broadcast, a row at a time; the
//! queries' stay in lanes for the whole scan.
//!
//! The bound is `Bounds::nearest`, operation for operation in the same
//! order, a query in each lane, so a pair is ruled out here exactly when it
//! is pair by pair: what the tests check, with `Lanes`'s own. The products
//! are exact for the same reason as in `x86::dots_avx2`: a stored byte is
//! at most 255 and a query's code at most 63 in magnitude
//! (`Kernel::query_levels`), so `vpmaddubsw`'s two products to an i16 sum
//! to at most 32,130.
//!
//! # A first look for the group
//! Of the bound's operations on a pair (the module doc of `codes`), about
//! half go to its error terms and its margin, `o = (P r_x + R n_x) + G |x|`
//! and `m = (|p| + |o_x| + o) 2^-19`, where only `P`, `R` and `G` are the
//! query's. So each row first takes a looser bound, its first look, whose
//! error terms are the row's alone for the whole group: with `P*`, `R*`,
//! `G*` and `Λ*` the greatest of the group's `P`, `R`, `G` and `|λ|`,
//! - `o* = (P* r_x + R* n_x) + G* |x|`, at least each query's `o`;
//! - `m* = ((P* (n_x + r_x) + Λ* |t_x|) + o*) 2^-19`. Here `P* (n_x +
//!   r_x)` stands for `|p|`: `|abC| = |ac . bd| <= |ac| |bd|`, with `|ac| =
//!   |(x - κμ) - e| <= n_x + r_x` and `|bd| <= n_q + r_q <= P`, and `p` is
//!   within `3.01 u` of `abC`; `Λ* |t_x|` is at least `|o_x| = |λ t_x|`. So
//!   `m*`, its four roundings and `p`'s `3.01 u` taken off, is still at
//!   least `31.9 u (|p| + |o_x| + o)`.
//!
//! Both are worked out for 8 rows at once, rows in lanes, as the side `o* +
//! m*` of each. A pair then takes `ceiling = (((p + c) + o_x) + side) +
//! A_q`, `p`, `c` and `o_x` as the bound takes them, and the bound's own
//! last step from `ceiling` to a distance (`x86::nearest_of_ceiling`).
//! Each of `p`, `c`, `o_x` and `o*` passes through as many roundings as it
//! does in the bound, give or take one (`o*` three within it, one into the
//! side, two more; `p` its own three and four more): at most `7.1 u` of
//! `|p| + |o_x| + o` in all, and `5 u |c|`, which `A_q` pays for as it does
//! in the bound. `m*` leaves more than `24 u` of those magnitudes over,
//! as `m` does. So the first look's ceiling, as computed, is at least `S`
//! for every query of the group (for l2, at least `T`), as the bound's is,
//! with the terms of the query itself no greater than the group's; and a
//! pair its first look rules out could not have entered the answer. NaN
//! anywhere, or an infinite term, rules nothing out.
//!
//! Where a row's first look rules out every pair of the group, as it does
//! for nearly every row once each query keeps k, that is the row's
//! decision. Where it leaves any, the row's bound decides all its pairs,
//! as it would without the first look. Queries alike in norm (cosine's,
//! all 1) are alike in `P`, `R`, `G` and `|λ|`, so the first look leaves
//! few rows the bound would rule out.

use std::ops::Range;

use super::{Bounds, Lanes, QueryCode, QueryTerms, LANES, QUERIES_MAX, SLACK};

/// Queries a group decides at once: one f32 register's lanes.
pub const QUERY_LANES: usize = LANES;

/// Rows of at least this many dimensions are not taken with queries in
/// lanes: a group's codes are 32 bytes for each 4 dimensions, and longer
/// rows go through `Lanes` a row at a time, where the sums across lanes
/// are a small part of a row's work.
pub const DIMS_MAX: usize = 256;

/// Dimensions a broadcast takes: one i32 of a row's bytes.
const STEP: usize = 4;

/// Bytes of a group's interleaved codes: `STEP` codes of each of
/// `QUERY_LANES` queries for each step of the longest row.
const CODES_BYTES: usize = DIMS_MAX / STEP * STEP * QUERY_LANES;

/// Up to `QUERY_LANES` queries of one scan, made ready once to decide runs
/// of rows together (`Lanes::ready_group`).
#[repr(C, align(32))]
pub struct QueryGroup {
    /// Step `s` holds the codes of dimensions `4s` to `4s + 3` of each
    /// query, query `j`'s at `32s + 4j`; zero past the last dimension and
    /// in lanes past the last query.
    codes: [i8; CODES_BYTES],
    /// The steps of the rows the group was made ready for.
    steps: usize,
    /// The number of queries, from lane 0.
    queries: usize,
    /// Each query's `128 sum(d)` (the rows' bytes are their codes plus 128).
    offsets: [i32; QUERY_LANES],
    /// Each query's side of the bound, query `j`'s in lane `j`.
    terms: [QueryTerms; QUERY_LANES],
    first_look: FirstLook,
}

/// The queries' side of a group's first look (the module doc): the
/// greatest of the group's `P`, `R`, `G` and `|λ|`.
#[derive(Clone, Copy, Default)]
struct FirstLook {
    per_residual: f32,
    per_centred: f32,
    per_norm: f32,
    offset_scale: f32,
}

impl Default for QueryGroup {
    fn default() -> QueryGroup {
        QueryGroup {
            codes: [0; CODES_BYTES],
            steps: 0,
            queries: 0,
            offsets: [0; QUERY_LANES],
            terms: [QueryTerms::default(); QUERY_LANES],
            first_look: FirstLook::default(),
        }
    }
}

impl QueryGroup {
    /// The number of queries in the group.
    pub fn len(&self) -> usize {
        self.queries
    }

    /// Whether the group has no query.
    pub fn is_empty(&self) -> bool {
        self.queries == 0
    }
}

impl Lanes<'_> {
    /// Whether these rows can be taken with queries in lanes
    /// (`Lanes::ready_group`): under `DIMS_MAX` dimensions.
    pub fn takes_query_groups(&self) -> bool {
        self.dims < DIMS_MAX
    }

    /// Makes `group` ready to decide rows for `queries`, each given as its
    /// code, its tile of `Bounds` and its place in the tile: query `j` in
    /// lane `j`.
    pub fn ready_group<'q>(
        &self,
        queries: impl ExactSizeIterator<Item = (&'q QueryCode, &'q Bounds, usize)>,
        group: &mut QueryGroup,
    ) {
        assert!(self.takes_query_groups(), "rows under {DIMS_MAX} dimensions");
        assert!(queries.len() <= QUERY_LANES, "at most a register's lanes of queries");
        let steps = self.dims.div_ceil(STEP);
        group.codes[..steps * STEP * QUERY_LANES].fill(0);
        (group.steps, group.queries, group.offsets) = (steps, queries.len(), [0; QUERY_LANES]);
        let mut shape = None;
        for (j, (code, bounds, q)) in queries.enumerate() {
            assert!(q < QUERIES_MAX, "a query of the tile");
            assert!(code.dims == self.dims && code.signs.len() == self.dims.next_multiple_of(SLACK));
            assert!(code.levels <= self.kernel.query_levels(), "a query code this kernel multiplies");
            assert!(shape.is_none_or(|s| s == bounds.shape), "one index's queries");
            shape = Some(bounds.shape);
            for (d, &c) in code.signs[..self.dims].iter().enumerate() {
                group.codes[(d / STEP) * STEP * QUERY_LANES + j * STEP + d % STEP] = c;
            }
            group.offsets[j] = 128 * code.sum;
            group.terms[j] = bounds.of_query(q);
        }
        let live = &group.terms[..group.queries];
        // NaN where any is: it rules nothing out.
        let greatest = |term: fn(&QueryTerms) -> f32| {
            live.iter().map(|t| term(t).abs()).fold(0f32, |m, x| if x > m || x.is_nan() { x } else { m })
        };
        group.first_look = FirstLook {
            per_residual: greatest(|t| t.per_residual),
            per_centred: greatest(|t| t.per_centred),
            per_norm: greatest(|t| t.per_norm),
            offset_scale: greatest(|t| t.offset_scale),
        };
    }

    /// Decides each row of `rows` for each query of `group`. A row's first
    /// look (the module doc) rules out the pairs where it is above their
    /// query's threshold, `thresholds[j]` for query `j` at first; where it
    /// leaves any, the row's bound (`Bounds::nearest`) decides all its
    /// pairs the same way. `undecided(j, row)` hears of each pair that is
    /// not ruled out, and answers query `j`'s threshold from then on (a
    /// row scored since may have brought it nearer). `ahead(row)` is called
    /// before the `LANES` rows from `row` are read, as in
    /// `Lanes::rules_out_run`.
    #[inline(always)]
    pub fn rules_out_group_run(
        &self,
        group: &QueryGroup,
        rows: Range<usize>,
        thresholds: [f32; QUERY_LANES],
        (ahead, undecided): (impl FnMut(usize), impl FnMut(usize, usize) -> f32),
    ) {
        self.check_group_run(group, &rows);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only `Int8::Avx2` has lanes, and a `Kernel` exists only
        // where the CPU has its instructions (`Kernel::on_this_cpu`); the
        // group was made ready for rows of these dimensions (its steps end
        // within its codes) and every row of `rows` is a row of these
        // codes, with `SLACK` bytes after the last and a value of each
        // term (`check_group_run`, `Kernel::lanes`).
        unsafe {
            let live = (1u32 << group.queries) - 1;
            let rule = x86::Rule { thresholds, live, undecided };
            x86::run_avx2((self.bytes, rows, self.dims, self.multiples), group, self.terms, (ahead, rule))
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("no kernel is available off x86-64")
    }

    /// The bound of `row` for each query of `group`, as
    /// `rules_out_group_run` finds it, and its first look's: query `j`'s
    /// in lane `j`.
    #[cfg(test)]
    pub fn group_keys(&self, group: &QueryGroup, row: usize) -> [[f32; QUERY_LANES]; 2] {
        let first = row / LANES * LANES;
        self.check_group_run(group, &(first..first + LANES));
        let mut found = [[f32::NAN; QUERY_LANES]; 2];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `rules_out_group_run`.
        unsafe {
            let keys = |r, keys| {
                if r == row {
                    found = keys
                }
            };
            x86::keys_avx2((self.bytes, first..first + LANES, self.dims, self.multiples), group, self.terms, keys)
        }
        found
    }

    /// What `x86::run_avx2` relies on beyond `Kernel::lanes`'s checks.
    fn check_group_run(&self, group: &QueryGroup, rows: &Range<usize>) {
        assert!(rows.end <= self.rows && rows.len().is_multiple_of(LANES), "whole lanes of rows");
        assert!(self.takes_query_groups() && group.steps == self.dims.div_ceil(STEP), "a group ready for these rows");
        assert!(group.steps * STEP * QUERY_LANES <= CODES_BYTES && group.queries <= QUERY_LANES);
        // A row's last step reads at most 3 bytes past it: within the slack.
        assert!(group.steps * STEP < self.dims + SLACK);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::super::x86::{nearest_in_lanes, nearest_of_ceiling, QueryLanes, COSINE, IP, L2};
    use super::super::{Shape, LANES, MARGIN, ROW_TERMS};
    use super::{QueryGroup, QUERY_LANES, STEP};

    /// What `run_avx2` does with each row's bounds, a query in each lane.
    pub(super) trait Decide {
        /// Whether a row's first look's bounds (the module doc), query `j`'s
        /// in lane `j`, settle it: then `decide` is not called.
        ///
        /// # Safety
        /// The CPU must have AVX2.
        unsafe fn settled(&mut self, first: __m256) -> bool;

        /// `nearest` holds the bounds of `row`, query `j`'s in lane `j`.
        ///
        /// # Safety
        /// The CPU must have AVX2.
        unsafe fn decide(&mut self, row: usize, nearest: __m256);
    }

    /// `rules_out_group_run`'s: the pairs whose bound is above their
    /// query's threshold are ruled out, and `undecided` hears of the rest
    /// of the `live` lanes.
    pub(super) struct Rule<U> {
        pub thresholds: [f32; QUERY_LANES],
        pub live: u32,
        pub undecided: U,
    }

    impl<U> Rule<U> {
        /// The lanes whose bound in `keys` is above their threshold.
        ///
        /// # Safety
        /// The CPU must have AVX2.
        #[inline(always)]
        unsafe fn above(&self, keys: __m256) -> u32 {
            // SAFETY: the CPU has AVX2, as the caller promises; 8 f32s from 8.
            unsafe {
                let thresholds = _mm256_loadu_ps(self.thresholds.as_ptr());
                _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(keys, thresholds)) as u32
            }
        }
    }

    impl<U: FnMut(usize, usize) -> f32> Decide for Rule<U> {
        /// Where the first look rules out every live pair.
        #[inline(always)]
        unsafe fn settled(&mut self, first: __m256) -> bool {
            // SAFETY: as the caller promises.
            !unsafe { self.above(first) } & self.live == 0
        }

        #[inline(always)]
        unsafe fn decide(&mut self, row: usize, nearest: __m256) {
            // SAFETY: as the caller promises.
            unsafe {
                let mut left = !self.above(nearest) & self.live;
                while left != 0 {
                    let j = left.trailing_zeros() as usize;
                    left &= left - 1;
                    self.thresholds[j] = (self.undecided)(j, row);
                }
            }
        }
    }

    /// `group_keys`'s: each row's bounds and its first look's handed to
    /// the closure.
    #[cfg(test)]
    struct Keys<K> {
        keys: K,
        first: [f32; QUERY_LANES],
    }

    #[cfg(test)]
    impl<K: FnMut(usize, [[f32; QUERY_LANES]; 2])> Decide for Keys<K> {
        /// Never: so every row's bounds are worked out too.
        #[inline(always)]
        unsafe fn settled(&mut self, first: __m256) -> bool {
            // SAFETY: 8 f32s into 8; the CPU has AVX2, as the caller promises.
            unsafe { _mm256_storeu_ps(self.first.as_mut_ptr(), first) };
            false
        }

        #[inline(always)]
        unsafe fn decide(&mut self, row: usize, nearest: __m256) {
            let mut bounds = [0f32; QUERY_LANES];
            // SAFETY: 8 f32s into 8; the CPU has AVX2, as the caller promises.
            unsafe { _mm256_storeu_ps(bounds.as_mut_ptr(), nearest) };
            (self.keys)(row, [bounds, self.first]);
        }
    }

    /// `run_avx2` handing each row's bounds to `keys(row, bounds)`,
    /// compiled for AVX2 so that the kernel's intrinsics are inlined into
    /// it (the tests' caller is compiled for any x86-64).
    ///
    /// # Safety
    /// As `run_avx2`.
    #[cfg(test)]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn keys_avx2(
        rows: Rows<'_>,
        group: &QueryGroup,
        terms: [&[f32]; ROW_TERMS],
        keys: impl FnMut(usize, [[f32; QUERY_LANES]; 2]),
    ) {
        // SAFETY: as the caller promises.
        unsafe { run_avx2(rows, group, terms, (|_| {}, Keys { keys, first: [0.0; QUERY_LANES] })) }
    }

    /// What `run_avx2` takes besides the group: the rows' codes, the rows
    /// to decide, their dimensions and whether they have multiples of the
    /// offset; the rows' terms; and what to call ahead of each `LANES`
    /// rows and with each row's bounds.
    type Rows<'a> = (&'a [u8], Range<usize>, usize, bool);

    /// The bound of each row of `rows` for each query of `group`, handed
    /// to `decide(row, bounds)`, for the queries' shape and whether the
    /// rows have multiples: a loop compiled for each.
    ///
    /// # Safety
    /// The CPU must have AVX2; `group` must be ready for rows of `dims`
    /// dimensions (its steps within its codes), every row of `rows` must
    /// lie in `bytes` with 3 bytes after it, and every term must have a
    /// value for each row (the multiples, `terms[4]`, where the rows have
    /// them).
    #[inline(always)]
    pub(super) unsafe fn run_avx2(
        rows: Rows<'_>,
        group: &QueryGroup,
        terms: [&[f32]; ROW_TERMS],
        run: (impl FnMut(usize), impl Decide),
    ) {
        let multiples = rows.3;
        // SAFETY: as the caller promises.
        unsafe {
            match (group.terms[0].shape, multiples) {
                (Shape::Cosine, false) => shaped::<COSINE, false>(rows, group, terms, run),
                (Shape::Cosine, true) => shaped::<COSINE, true>(rows, group, terms, run),
                (Shape::Ip, false) => shaped::<IP, false>(rows, group, terms, run),
                (Shape::Ip, true) => shaped::<IP, true>(rows, group, terms, run),
                (Shape::L2, false) => shaped::<L2, false>(rows, group, terms, run),
                (Shape::L2, true) => shaped::<L2, true>(rows, group, terms, run),
            }
        }
    }

    /// `run_avx2` of one shape: the rows' side of the first look for
    /// `LANES` rows and their products first, each row's in two sums (the
    /// even and the odd steps: two chains of additions half as long), then
    /// their first looks in order, and a row's bound where its first look
    /// leaves a pair, so that the products of the next rows fill the wait
    /// of each first look on its sums.
    ///
    /// # Safety
    /// As `run_avx2`.
    #[inline(always)]
    unsafe fn shaped<const SHAPE: u8, const MULTIPLES: bool>(
        (bytes, rows, dims, _): Rows<'_>,
        group: &QueryGroup,
        terms: [&[f32]; ROW_TERMS],
        (mut ahead, mut decide): (impl FnMut(usize), impl Decide),
    ) {
        // SAFETY: the CPU has AVX2, as the caller promises; the loads stay
        // within the group's codes, the rows' bytes and the terms, as the
        // caller promises.
        unsafe {
            let all = _mm256_set1_ps;
            let ones = _mm256_set1_epi16(1);
            let offsets = _mm256_loadu_si256(group.offsets.as_ptr().cast());
            let query_lanes = QueryLanes::of(&group.terms);
            let magnitude = |x| _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
            let f = &group.first_look;
            let greatest = [f.per_residual, f.per_centred, f.per_norm, f.offset_scale].map(|x| all(x));
            let codes = group.codes.as_ptr();
            let steps = group.steps;
            let [scales, residuals, centred, row_offsets, multiples, norms, row_scales] = terms;
            for first in rows.step_by(LANES) {
                ahead(first);
                // The rows' side of the first look for `LANES` rows at once
                // (8 values of each term, as the caller promises): `o* + m*`.
                let sides = {
                    let load = |terms: &[f32]| _mm256_loadu_ps(terms.as_ptr().add(first));
                    let [per_residual, per_centred, per_norm, offset_scale] = greatest;
                    let (residual, centred) = (load(residuals), load(centred));
                    let off = _mm256_add_ps(
                        _mm256_add_ps(_mm256_mul_ps(per_residual, residual), _mm256_mul_ps(per_centred, centred)),
                        _mm256_mul_ps(per_norm, load(norms)),
                    );
                    let spread = _mm256_add_ps(
                        _mm256_add_ps(
                            _mm256_mul_ps(per_residual, _mm256_add_ps(centred, residual)),
                            _mm256_mul_ps(offset_scale, magnitude(load(row_offsets))),
                        ),
                        off,
                    );
                    let mut sides = [0f32; LANES];
                    _mm256_storeu_ps(sides.as_mut_ptr(), _mm256_add_ps(off, _mm256_mul_ps(spread, all(MARGIN))));
                    sides
                };
                let mut dots = [_mm256_setzero_si256(); LANES];
                for (r, dots) in dots.iter_mut().enumerate() {
                    let row = bytes.as_ptr().add((first + r) * dims);
                    let product = |s: usize| {
                        let x = _mm256_set1_epi32(row.add(s * STEP).cast::<i32>().read_unaligned());
                        let q = _mm256_load_si256(codes.add(s * STEP * QUERY_LANES).cast());
                        _mm256_madd_epi16(_mm256_maddubs_epi16(x, q), ones)
                    };
                    // Named, not an array indexed by the step: so indexed,
                    // the sums were kept in memory, each addition waiting on
                    // the store of the one before.
                    let (mut even, mut odd) = (product(0), _mm256_setzero_si256());
                    let mut s = 1;
                    while s + 1 < steps {
                        odd = _mm256_add_epi32(odd, product(s));
                        even = _mm256_add_epi32(even, product(s + 1));
                        s += 2;
                    }
                    if s < steps {
                        odd = _mm256_add_epi32(odd, product(s));
                    }
                    *dots = _mm256_sub_epi32(_mm256_add_epi32(even, odd), offsets);
                }
                for (r, &dots) in dots.iter().enumerate() {
                    let row = first + r;
                    // One value each, as the caller promises.
                    let load = |terms: &[f32]| all(*terms.get_unchecked(row));
                    let multiple = MULTIPLES.then(|| load(multiples));
                    let (scale, row_scale, row_offset) = (load(scales), load(row_scales), load(row_offsets));
                    let norm = if SHAPE == L2 { load(norms) } else { _mm256_setzero_ps() };
                    // The first look: `Bounds::nearest_of` with the row's
                    // side, `o* + m*`, in place of `o` and `m`, summed in
                    // the order the module doc takes.
                    let product = _mm256_mul_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(dots)), query_lanes.scale);
                    let centre = multiple.map_or(query_lanes.offset_product, |multiple| {
                        _mm256_mul_ps(query_lanes.offset_product, multiple)
                    });
                    let offset = _mm256_mul_ps(row_offset, query_lanes.offset_scale);
                    let estimate = _mm256_add_ps(_mm256_add_ps(product, centre), offset);
                    let ceiling = _mm256_add_ps(_mm256_add_ps(estimate, all(sides[r])), query_lanes.absolute);
                    let first_look = nearest_of_ceiling::<SHAPE>(ceiling, (norm, row_scale), &query_lanes);
                    if !decide.settled(first_look) {
                        let rows = [scales, residuals, centred, row_offsets, norms, row_scales].map(load);
                        decide.decide(row, nearest_in_lanes::<SHAPE>(dots, (rows, multiple), &query_lanes));
                    }
                }
            }
        }
    }
}
