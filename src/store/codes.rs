//! int8 codes of the rows, and a first pass over them that rules rows out
//! before their exact score.
//!
//! A lone search reads every f32 of the index, and memory cannot deliver
//! them faster. Each row of a cosine, inner-product or l2 index therefore
//! also keeps a code a quarter its size: one signed byte per value and a
//! scale. A search first reads the codes, computes for every row an interval
//! that provably holds the row's exact f32 score, and scores exactly (with
//! the f32 kernel every other search uses, so the answer is the same bit for
//! bit) only the rows whose interval can still beat the k-th nearest kept.
//! The codes are derived state: never logged, rebuilt from the rows.
//!
//! # The codes
//! For a vector `v` of `n` values with largest magnitude `m > 0`, the scale
//! `a` is the least f32 not below `m / L` (at least f32's smallest
//! positive value), and the code `c_i` is `v_i / a` rounded to the nearest
//! integer, clamped to [-L, L]. Rows take `L = 127`; queries the most their
//! kernel multiplies exactly (`Kernel::query_levels`): 127, or 63 for
//! AVX2's `vpmaddubsw`, whose pairs of products must stay below 2^15. A
//! query's residual `f = v - b d` is computed exactly in f64 (a value minus
//! a product of 24 and 8 significant bits, both within 2^9 of each other's
//! exponent, fits in f64's 53), and `r_q`, an upper bound on its Euclidean
//! norm, is kept rounded up. A zero vector has scale 0, codes 0 and `r = 0`.
//!
//! # Centred codes
//! Rows that share a large common part (image patches, all positive and
//! alike) would spend their 8 bits on it, and rows that share it at
//! different magnitudes (patches dark and bright) on their multiple of it.
//! So a row `x` is coded as `y = x - κμ`, for an offset `μ` (f32 values)
//! the index keeps, each dimension's median over its rows (`Codes::centre`),
//! and a multiple `κ` (an f32) the row keeps: `x . μ / |μ|^2`, the multiple
//! nearest `x`, within `±K` for `K = 8` (`offset_multiple`). Each `κ μ_i` is
//! exact in f64 (two f32s' 24 significant bits), and each `y_i` computed in
//! f64, off `x_i - κ μ_i` by at most 2^-53 of itself; the residual
//! `e = (x - κμ) - a c` is bounded by `r_x`, from the residuals computed in
//! f64 plus 2^-50 of `|y|` for those roundings, and `|x - κμ|` by `n_x`,
//! both rounded up. Each row also keeps `t_x`, `μ . y` rounded to nearest
//! f32: within `2^-24 |t_x| + 2^-150` of itself (the second term where it
//! is subnormal, as it is for a row that is nearly its multiple of `μ`) and
//! `(n + 4) 2^-52 |μ| n_x` of `μ . (x - κμ)`. Any `μ` and any `κ` within
//! `±K` are sound, zeros among them (an index not yet centred). An index
//! whose rows would not be coded much tighter from their own multiples
//! (`multiples_pay`) codes each from `κ = 1`, and keeps no multiples.
//!
//! A query is coded the same way from its own multiple `λ` of `μ`, `t_q /
//! |μ|^2` (`t_q` about `q . μ`, below) rounded to an f32, without bounds (0
//! where it is not finite): the multiple of `μ` nearest the query, so that
//! a query scaled to unit norm (cosine, ip) is centred as well as one drawn
//! like the rows. Its code `d`, scale `b`, residual bound `r_q` and `n_q >=
//! |q - λμ|` come as a row's do.
//!
//! # Why a ruled-out row cannot belong in the answer
//! Let `q` be the query, and `x` a row, with their codes as above. `C = sum
//! c_i d_i` is computed exactly, in integers (the kernels sum `(c_i + 128)
//! d_i`, at most 255 x 127 x 65,536 < 2^31 in magnitude, and take away `128
//! sum d_i`: indexes of more dimensions keep no codes). Exactly, in real
//! numbers, with `f = (q - λμ) - b d`,
//!
//! `s = q . x = κ q . μ + λ μ . (x - κμ) + a b C + b (d . e) + f . (x - κμ)`,
//!
//! and by Cauchy-Schwarz, with `|b d| <= n_q + r_q`,
//! `|s - κ q . μ - λ t_x - a b C| <= (n_q + r_q) r_x + R n_x =: E`, where
//! `R = r_q + |λ| (n + 4) 2^-52 |μ|` (the second term for `t_x`; its
//! `2^-24` is the margin's, below). `q . μ` is summed in f64 from exact
//! products, rounded to an f32 `t_q`, and `ε_q` bounds how far `t_q` is from
//! it (`Codes::offset_product`), so that `κ t_q` is within `K ε_q` of `κ q .
//! μ`. `|q|` and `|x|` below are the norms' upper
//! bounds the bfloat16 pass also uses (infinite above 2^60, which makes
//! every bound infinite and rules nothing out).
//!
//! The f32 kernel's score `s_f` is within `g sum|q_i x_i| + A`, at most
//! `g |q||x| + A`, of `s`, where `g = kernels::relative_error(n)` (the
//! kernels' error model, stated and argued there: `m 2^-24 / (1 - m 2^-24)`
//! for at most `m = n / 4 + 64` roundings), and `A = (2n + 64) 2^-149`
//! covers results that fall among f32's subnormals. For l2 the kernel sums
//! `(q_i - x_i)^2`, non-negative terms each off by at most `3 x 2^-24` of
//! itself, so that `d_f >= d (1 - g - 2^-20) - A` with `d = |q|^2 + |x|^2 -
//! 2 s`.
//!
//! So, with `T = κ t_q + K ε_q + λ t_x + a b C + E`:
//! - cosine and ip: `s_f <= S = T + g |q||x| + A`; `S` is mapped to a
//!   distance exactly as `s_f` is (`screen::distance`, or a negation): the
//!   map is monotone, so the result is no farther than the row's exact
//!   distance;
//! - l2: `d_f >= (|q|^2 + |x|^2 - 2 T) (1 - g - 2^-20) - A`, and `d_f >= 0`
//!   (a sum of squares).
//!
//! # Evaluated in f32, a vector of rows at a time
//! The bound is computed for every pair, so it must cost a few vector
//! instructions, not the kernel's products: it is evaluated in f32, eight
//! rows to a register, each operation rounded once (Rust neither fuses nor
//! reorders them). The query's terms are kept rounded the safe way: `b` and
//! `λ` exactly, `P = n_q + r_q`, `R` and `G` (`g |q|` for cosine and ip, 0
//! for l2) rounded up, `|q|^2` down. With `u = 2^-24`, per pair:
//! - `o_x = λ t_x` passes through one rounding, within `u |o_x|`; `c = t_q
//!   κ` through one, within `u |κ t_q|`; `p = (a C)
//!   b` through three (`C` to f32 among them): within `3.01 u |abC|` of
//!   `abC`; `e = (p + c) + o_x` two more, within `2.01 u (|p| + |c| +
//!   |o_x|)`; `o = (P r_x + R n_x) + G |x|` five, all of non-negative terms:
//!   within `4.01 u o`; `s = e + o` one more. With `t_x`'s own `u |o_x|`,
//!   `s >= abC + κ t_q + λ μ . y + (true o) - 6.1 u (|p| + |o_x| + o) - 4.1
//!   u |c|`.
//! - The margin `m = (|p| + |o_x| + o) 2^-19` is at least `31.99 u (|p| +
//!   |o_x| + o)`, and `s + m` loses at most `1.0001 u (|p| + |c| + |o_x| +
//!   o)` to its rounding: the sum stays above the exact one less `5.2 u |c|`
//!   by `24 u (|p| + |o_x| + o)`, which also pays for the rounding of the
//!   last addition, of `A_q = 2 A + 2^-140 + K (2 ε_q + 2^-21 |t_q|) + 2^-148
//!   |λ|` (rounded up). Its third term pays for the `K ε_q` between `κ t_q`
//!   and `κ q . μ` and for the `5.2 u |c| <= 5.3 u K |t_q|`; its last for the
//!   `2^-150 |λ|` a subnormal `t_x` may be off in `o_x`. (`|c|` is left out
//!   of the margin so that each pair's bound is no longer a chain of
//!   operations than it was before rows had multiples.)
//! - Subnormal results are off by at most 2^-150 each, absolutely, in a
//!   dozen or so operations: far less than the `A + 2^-140` that `A_q` adds
//!   beyond `A`. So the ceiling `e + o + m + A_q`, as computed, is at least
//!   `S` (for l2, at least `T`).
//! - l2 takes `|x|^2 >= X (1 - 2^-19)` for `X = |x| |x|` rounded (the norm
//!   bound is within 2^-22 of `|x|`), and subtracts `(|q|^2 + X + 2
//!   |ceiling|) 2^-17` from `|q|^2 + X - 2 ceiling`: 128 u of those
//!   magnitudes pay for `X`'s 32 u and the four roundings. The result, at
//!   most `d`, times `1 - g - 2^-17` (rounded down), less `A_q`, rounded, is
//!   at most `d (1 - g - 2^-20) - A` when non-negative, and otherwise below
//!   `d_f >= 0`.
//! - An overflow gives an infinite ceiling (nothing ruled out) or an
//!   infinity less an infinity, or an infinity times 0: NaN, which rules
//!   nothing out either; norm bounds are infinite above 2^60, and below that
//!   no product overflows.
//!
//! A row is ruled out only when that nearest possible distance is strictly
//! farther than the farthest its search keeps: its exact distance is at
//! least as far, so it could not have entered (a tie could, being broken by
//! id). Every other row is scored exactly. A NaN anywhere rules nothing out.
//!
//! For random data of 768 dimensions `E` is about 0.008 of `|q||x|`, against
//! cosines spread over about 0.036: only rows near the k-th nearest are
//! scored twice.
//!
//! # A second look
//! Most of what `E` cannot tell is the query's rounding: `r_q n_x`, where
//! AVX2 codes the query on 63 levels against a row's 127. So before a row
//! the first pass could not rule out is scored exactly, its products are
//! taken once more, with the query's code and with a code of its residual
//! (`Bounds::rules_out_finely`, a byte a value against the exact score's
//! four). `f = (q - λμ) - b d` is computed in f64 from `y = q - λμ` as
//! computed above, in one more rounding, and coded as a vector is, on the
//! same levels: scale `b'`, codes `d'`. `f_i - b' d'_i` is computed in
//! one rounding more, and `r'_q` is its norm, rounded up, plus `2^-50
//! n_q`: each of the three roundings is within `2^-53` of a magnitude at
//! most `|y_i|` (a value rounded to its nearest step is no farther from
//! the step than from 0). With `f'' = f - b' d'`, `|f''| <= r'_q`, and `C'
//! = sum c_i d'_i` (in integers, as `C`):
//!
//! `s = κ q . μ + λ μ . (x - κμ) + a b C + a b' C' + (b d + b' d') . e + f'' . (x - κμ)`,
//!
//! and `|b d + b' d'| = |(q - λμ) - f''| <= n_q + r'_q`. So the bound above
//! holds with `abC + ab'C'` in place of `abC` and `r'_q` in place of `r_q`
//! (in `P` and `R`). `r'_q` is about a sixtieth of `r_q`: `E` keeps the
//! rows' part. In f32, `p' = (a C') b'` is within `3.01 u |ab'C'|` as `p`
//! is, and `p + p'` one rounding more: within `4.02 u (|p| + |p'|)` of the
//! exact sum, where `p` alone was within `3.01 u |p|`. The margin takes
//! `|p| + |p'|` (rounded) where it took `|p|`: of its `32 u` of the
//! magnitudes, the sum still keeps more than `22 u`, which pays for the
//! last rounding as before.
//!
//! # Along the rows' main directions
//! What a second look leaves is mostly the rows' own rounding: `(b d + b'
//! d') . e`, bounded by `|z| r_x` with `z = b d + b' d'`. Cauchy-Schwarz is
//! loose there unless `z` and `e` point the same way; but where the rows
//! vary mostly along a few directions (image patches: four hold 61 to 89%
//! of their squares about their multiples of `μ`, each row scaled to norm
//! 1), so do the queries, and most of `z` lies in those directions. So an
//! index whose rows have such directions keeps them (`directions_of`, at
//! each power of two rows as the offset: `u_1` to `u_4`, f32 values, each
//! `|u_j|` at most `U_j`, rounded up) and each row's products with them,
//! `w_j`, about `u_j . e` (`Centred::along`). Any directions are sound. For
//! any `β_j`, exactly,
//!
//! `z . e = sum β_j (u_j . e) + h . e`, with `h = z - sum β_j u_j`,
//!
//! and `|h . e| <= |h| r_x`. A query takes `β_j` as `z . u_j` rounded to f32,
//! and `H >= |h| + B 2^-23`, `B = sum |β_j| U_j` (`Codes::along_of`: each
//! `h_i` is off by at most `5 2^-53` of `|z_i| + sum |β_j u_ji|`, covered by
//! `2^-49 (n_q + r'_q + B)`). For `H` less than `P'` (else the second look
//! stays as above), the second look takes `sum β_j w_j` into its estimate
//! and `H` in place of `P'`:
//! - each `w_j` is the sum in f64 of `u_ji e_i` over the residuals `e_i` as
//!   computed (within `2^-50 n_x` of `e`, above), within `(n + 16) 2^-53
//!   U_j r_x` of its exact value, then rounded to f32 (`2^-24 |w_j|`, or
//!   `2^-150` among the subnormals): `|w_j - u_j . e| <= U_j (2^-23 r_x +
//!   2^-50 n_x) + 2^-150`;
//! - so `|z . e - sum β_j w_j| <= H r_x + B 2^-50 n_x + 2^-150 sum |β_j|`;
//!   `B 2^-50` is added to `R'` and `2^-150 sum |β_j|` to `A_q` (both
//!   rounded up), for the second look alone.
//!
//! In f32, `p'' = sum β_j w_j` is four products summed in pairs: within
//! `3.01 u` of `M = sum |β_j w_j|`, which is summed the same way. `(p + p')
//! + p''` is then within `5.03 u (|p| + |p'| + M)` of the exact sum, and
//! the margin takes `|p| + |p'| + M` (rounded): of its `32 u`, more than
//! `21 u` are left, still more than the last rounding needs. On the image
//! patches this left 0.2% of a lone cosine search's rows to score, from
//! 1.2 to 2.2%; what remains is mostly the f32 kernel's own error, `g |q||x|`.

use std::ops::Range;

use wide::f64x4;

use super::aligned::Aligned;
use super::cpu::{Int8, Kernel};
use super::kernels::{f32_at_least, relative_error, BOUND_SURPLUS};

use super::screen;

pub mod floors;
pub mod query_lanes;
pub mod ratios;
pub mod shannon;

/// Indexes of more dimensions keep no codes: a sum of `255 x 127` per
/// dimension must fit an i32 (see the module doc).
pub const DIMS_MAX: usize = 65_536;

/// Bytes kept after the last code, so that a kernel may read whole blocks
/// past the end of a row: the query's code is zero there, which makes the
/// extra bytes count for nothing.
const SLACK: usize = 64;

/// The powers-of-two grid pads each row to whole blocks of this many bytes,
/// the narrowest kernel's (`floors`).
pub const BLOCK: usize = 32;

/// Rows a kernel scores at a time: each load of the query feeds four rows.
pub const ROWS: usize = 4;

/// Rows `Lanes::rules_out` decides at a time: one f32 register's
/// lanes of bounds, one i32 register's of products.
pub const LANES: usize = 8;

/// What a `Kernel` computes: `C`, the products of the codes.
impl Kernel {
    /// Queries a batch scores together against each `ROWS` rows
    /// (`dots_tile`): with AVX-512's 32 registers the 4 x 4 sums stay in
    /// registers beside the rows and queries; with 16, 2 x 4 do.
    pub fn query_tile(self) -> usize {
        match self.isa() {
            Int8::Vnni512 => 4,
            Int8::Vnni256 | Int8::Avx2 => 2,
        }
    }

    /// The largest query code this kernel multiplies exactly: `vpdpbusd`
    /// sums each product in 32 bits; AVX2's `vpmaddubsw` sums pairs of
    /// products of a row's stored byte (up to 255) and the query's code in
    /// 16 bits, saturating: `2 x 255 x 63 = 32,130` fits, `2 x 255 x 127`
    /// would not.
    pub fn query_levels(self) -> i8 {
        match self.isa() {
            Int8::Vnni512 | Int8::Vnni256 => 127,
            Int8::Avx2 => 63,
        }
    }

    /// Whether this kernel decides `LANES` consecutive rows at once, their
    /// products and bounds in registers (`Lanes`): AVX2's.
    pub fn has_lanes(self) -> bool {
        self.isa() == Int8::Avx2
    }

    /// This kernel's lanes over `codes`, whose rows have norm bounds `norms`
    /// and (cosine) scales `row_scales`, if it has lanes (`has_lanes`).
    pub fn lanes<'a>(self, codes: &'a Codes, (norms, row_scales): (&'a [f32], &'a [f32])) -> Option<Lanes<'a>> {
        if !self.has_lanes() {
            return None;
        }
        assert_eq!(codes.grid, Grid::Fitted, "products of fitted codes");
        let rows = codes.len();
        // Every row, and whole blocks past the last: within the slack.
        assert!(rows * codes.dims + SLACK <= codes.bytes.len() && SLACK >= 32);
        let terms = [
            &codes.scales[..],
            &codes.residuals,
            &codes.centred_norms,
            &codes.offset_products,
            &codes.offset_multiples,
            norms,
            row_scales,
        ];
        // Each row's multiple only where the rows have them (`Codes::multiples`).
        let multiples = codes.multiples;
        let kept = |(t, terms): (usize, &&[f32])| terms.len() == rows || (t == MULTIPLES_TERM && !multiples);
        assert!(terms.iter().enumerate().all(kept), "a term per row");
        Some(Lanes { kernel: self, bytes: &codes.bytes, dims: codes.dims, rows, terms, multiples })
    }

    /// `C` of the query `code` with each of `rows` of `codes`, wherever
    /// they are.
    #[inline(always)]
    pub fn dots_of<const R: usize>(self, code: &QueryCode, codes: &Codes, rows: [usize; R]) -> [i32; R] {
        let [dots] = self.dots_tile([code], codes, rows);
        dots
    }

    /// `C` of each of `queries` with each of `rows` of `codes`: each load
    /// of a row's block feeds every query, each load of a query's every
    /// row.
    #[inline(always)]
    pub fn dots_tile<const Q: usize, const R: usize>(
        self,
        queries: [&QueryCode; Q],
        codes: &Codes,
        rows: [usize; R],
    ) -> [[i32; R]; Q] {
        let (dims, bytes) = (codes.dims, codes.bytes());
        assert_eq!(codes.grid, Grid::Fitted, "products of fitted codes");
        let starts = rows.map(|row| row * dims);
        // Each row and whole blocks past it: within the slack every row has.
        let read = dims.next_multiple_of(SLACK);
        assert!(starts.iter().all(|&start| start + read <= bytes.len()));
        assert!(queries.iter().all(|code| code.dims == dims && code.signs.len() == read));
        assert!(queries.iter().all(|code| code.levels <= self.query_levels()), "a query code this kernel multiplies");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Kernel` exists only where the CPU has its
        // instructions (`Kernel::on_this_cpu`); the loads stay inside
        // `bytes` and the queries' padded buffers (asserted).
        unsafe {
            let signs = queries.map(|code| &code.signs[..]);
            let raw: [[i32; R]; Q] = match self.isa() {
                Int8::Vnni512 => x86::dots_vnni512(bytes, starts, signs, dims),
                Int8::Vnni256 => x86::dots_vnni256(bytes, starts, signs, dims),
                Int8::Avx2 => x86::dots_avx2(bytes, starts, signs, dims),
            };
            // The rows' offset of 128 added 128 sum(d).
            let mut out = raw;
            for (out, code) in out.iter_mut().zip(queries) {
                *out = out.map(|raw| raw - 128 * code.sum);
            }
            out
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("no kernel is available off x86-64")
    }
}

/// A kernel's lanes over one index's codes (`Kernel::lanes`): the rows'
/// codes and terms, checked once for a scan, so that deciding `LANES` rows
/// costs one check.
pub struct Lanes<'a> {
    kernel: Kernel,
    bytes: &'a [u8],
    dims: usize,
    rows: usize,
    /// Per row: its code's scale, residual bound, `|x - κμ|`, `μ . (x -
    /// κμ)`, `κ` (none where `multiples` is not set), norm bound and
    /// (cosine) scale.
    terms: [&'a [f32]; ROW_TERMS],
    /// Whether the rows have multiples of the offset (`Codes::multiples`):
    /// where they have not, each is 1, and the kernel reads none.
    multiples: bool,
}

/// One query's side of `Lanes::rules_out`, checked once (`Lanes::query`).
pub struct LaneQuery<'a> {
    signs: &'a [i8],
    sum: i32,
    terms: QueryTerms,
}

impl<'a> Lanes<'a> {
    /// Query `q` of `bounds`, whose code is `code`, made ready.
    pub fn query(&self, code: &'a QueryCode, bounds: &Bounds, q: usize) -> LaneQuery<'a> {
        assert!(q < QUERIES_MAX, "a query of the tile");
        assert!(code.dims == self.dims && code.signs.len() == self.dims.next_multiple_of(SLACK));
        assert!(code.levels <= self.kernel.query_levels(), "a query code this kernel multiplies");
        LaneQuery { signs: &code.signs, sum: code.sum, terms: bounds.of_query(q) }
    }

    /// Which of the `LANES` rows from `row` `query` rules out against
    /// `threshold`, bit `r` for row `row + r`: `dots_tile` and
    /// `Bounds::rules_out` in one pass, the products summed in one go and
    /// the bounds in lanes, the same operations in the same order as
    /// `Bounds::rules_out`, so the same answer.
    #[inline(always)]
    pub fn rules_out(&self, query: &LaneQuery, row: usize, threshold: f32) -> u32 {
        let mut ruled = (1 << LANES) - 1;
        let decided = |_, lanes| {
            ruled = lanes;
            threshold
        };
        self.rules_out_run(query, row..row + LANES, threshold, (|_| {}, decided));
        ruled
    }

    /// `rules_out` of each `LANES` rows of `rows` in turn, for one query
    /// whose terms are made ready once for them all: `ahead(row)` is called
    /// before the `LANES` rows from `row` are read (to prefetch what comes
    /// later), and `undecided(row, ruled)` hears of each `LANES` rows from
    /// `row` not all ruled out, and answers the threshold from then on (a
    /// row scored since may have brought it nearer).
    #[inline(always)]
    pub fn rules_out_run(
        &self,
        query: &LaneQuery,
        rows: Range<usize>,
        threshold: f32,
        (ahead, undecided): (impl FnMut(usize), impl FnMut(usize, u32) -> f32),
    ) {
        assert!(rows.end <= self.rows && rows.len().is_multiple_of(LANES), "whole lanes of rows");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only `Int8::Avx2` has lanes, and a `Kernel` exists only
        // where the CPU has its instructions (`Kernel::on_this_cpu`); every
        // row's code and whole blocks past it lie in `bytes`, the query's
        // code is padded to whole blocks, and every term has a value per
        // row, the multiples where `multiples` is set (asserted in
        // `Kernel::lanes` and `Lanes::query`), so the loads of the rows of
        // `rows` stay inside them.
        unsafe {
            x86::rules_out_run_avx2(
                (self.bytes, rows, self.dims, self.multiples),
                (query.signs, query.sum),
                self.terms,
                query.terms,
                threshold,
                (ahead, undecided),
            )
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("no kernel is available off x86-64")
    }

    /// The bound of each row of `rows` for `query` (`Bounds::nearest`, as
    /// `rules_out_run` finds it: a row is ruled out against a threshold
    /// exactly when its bound is above it), `LANES` rows at a time:
    /// `ahead(row)` as `rules_out_run`'s, then `keys(row, bounds)` with
    /// the bound of row `row + r` in `bounds[r]`.
    #[inline(always)]
    pub fn keys_run(
        &self,
        query: &LaneQuery,
        rows: Range<usize>,
        (ahead, keys): (impl FnMut(usize), impl FnMut(usize, [f32; LANES])),
    ) {
        assert!(rows.end <= self.rows && rows.len().is_multiple_of(LANES), "whole lanes of rows");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `rules_out_run`.
        unsafe {
            x86::keys_run_avx2(
                (self.bytes, rows, self.dims, self.multiples),
                (query.signs, query.sum),
                self.terms,
                query.terms,
                (ahead, keys),
            )
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("no kernel is available off x86-64")
    }

    /// `keys_run` of the `LANES` rows from `row`.
    #[cfg(test)]
    pub fn keys(&self, query: &LaneQuery, row: usize) -> [f32; LANES] {
        let mut found = [f32::NAN; LANES];
        self.keys_run(query, row..row + LANES, (|_| {}, |_, keys| found = keys));
        found
    }
}

/// Asks for the cache lines of `bytes` to be brought into L1, without
/// waiting for them.
#[inline(always)]
pub fn prefetch_lines(bytes: &[u8]) {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    for line in bytes.iter().step_by(64) {
        safe_arch::prefetch_t0(line);
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
    let _ = bytes;
}

/// How a row's scale is chosen: the products' bound (this module) wants
/// the finest scale; the coordinate distances' (`floors`) a power of two,
/// so that one code of the query serves every row of that scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// The least f32 not below `m / 127`; residual bound: `|e|`.
    Fitted,
    /// The least power of two not below `m / 127`, and at least 2^-126 (a
    /// zero vector's too); residual bound: the norm `(sum |e_i|^p)^(1/p)`
    /// or above (`NormAbove`) for the `p` whose f32 bits these are (lp's
    /// `p`; 1, `sum |e_i|`, for the other metrics).
    PowersOfTwo { p_bits: u32 },
    /// Canberra's (`ratios`): a level on a logarithmic scale and, with
    /// `signs`, a sign bit per value, under the least power of two not
    /// below `m`. js's values are never negative: it keeps no signs.
    Logarithmic { signs: bool },
}

/// A vector's code: scale, sum of the codes, residual bound (the codes
/// themselves go where `encode` puts them).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Encoded {
    scale: f32,
    sum: i32,
    residual: f32,
}

/// Values `encode` codes at a time: the arithmetic of one chunk runs in
/// vector registers, and its codes go to `put` together.
const CHUNK: usize = 64;

/// Codes `v` on `grid`, handing the codes of each `CHUNK` values to `put`
/// with the first one's position.
fn encode(v: &[f32], grid: Grid, mut put: impl FnMut(usize, &[i8])) -> Encoded {
    // The largest magnitude by the bits: for values that are not NaN the
    // order of `|x|`'s bits as integers is the order of `|x|`.
    let largest = f32::from_bits(v.iter().fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff)));
    let scale = match grid {
        Grid::Fitted if largest == 0.0 => {
            v.chunks(CHUNK).enumerate().for_each(|(c, chunk)| put(c * CHUNK, &[0; CHUNK][..chunk.len()]));
            return Encoded { scale: 0.0, sum: 0, residual: 0.0 };
        }
        Grid::Fitted => f32_at_least(f64::from(largest) / 127.0).max(f32::from_bits(1)),
        Grid::PowersOfTwo { .. } => power_of_two_at_least(f32_at_least(f64::from(largest) / 127.0)),
        Grid::Logarithmic { .. } => unreachable!("levels are coded by `ratios::encode`"),
    };
    let mut norm = NormAbove::new(match grid {
        Grid::PowersOfTwo { p_bits } => f32::from_bits(p_bits),
        _ => 2.0,
    });
    let euclidean = norm.quarters == [8, 8];
    // Eight partial sums of `e_i^2`: each sum of `n` terms is still off by
    // at most `n 2^-53` of itself, whatever their order (`NormAbove::norm`).
    let mut squares = [0.0f64; 8];
    let (step, top, mut sum) = (f64x4::splat(f64::from(scale)), f64x4::splat(127.0), 0);
    let mut codes = [0i8; CHUNK];
    let mut residuals = [0.0f64; CHUNK];
    for (c, chunk) in v.chunks(CHUNK).enumerate() {
        // A short last group fills codes and residuals past the chunk's
        // end, unread.
        for ((values, codes), residuals) in chunk.chunks(8).zip(codes.chunks_mut(8)).zip(residuals.chunks_mut(8)) {
            let e = code_eight(widened(values), step, top, codes);
            residuals[..4].copy_from_slice(&e[0].to_array());
            residuals[4..].copy_from_slice(&e[1].to_array());
        }
        let n = chunk.len();
        sum += codes[..n].iter().map(|&code| i32::from(code)).sum::<i32>();
        if euclidean {
            let groups = residuals[..n].chunks_exact(8);
            groups.remainder().iter().for_each(|e| squares[0] += e * e);
            for group in groups {
                squares.iter_mut().zip(group).for_each(|(square, e)| *square += e * e);
            }
        } else {
            residuals[..n].iter().for_each(|e| norm.add(e.abs()));
        }
        put(c * CHUNK, &codes[..n]);
    }
    if euclidean {
        norm.sums = [squares.iter().sum(); 2];
    }
    Encoded { scale: scale as f32, sum, residual: f32_at_least(norm.norm()) }
}

/// The fewest rows an index is centred at (`Codes::wants_centre`): below, a
/// median says little, and recoding costs as much as the rows.
const CENTRE_ROWS_MIN: usize = 64;

/// The most: past it the offset of the rows so far stands, so that no insert
/// ever recodes more than this many rows (about a tenth of a second at 768
/// dimensions, once in the index's life).
const CENTRE_ROWS_MAX: usize = 1 << 16;

/// How much nearer a new offset must bring the rows for `Codes::centre` to
/// recode them: rows' mean square about an offset is less by about the
/// square of its shift from the one they are coded from (exactly so for
/// the mean), so the shift's square must be more than this part of the
/// rows' mean square about the old one. A smaller shift would narrow the
/// codes by under about 1.6% (`1 - sqrt(31/32)`), not worth coding every
/// row again.
const RECENTRE_SHIFT_MIN: f64 = 1.0 / 32.0;

/// Rows an offset is taken from at most (`offset_of`): evenly spread over
/// the index.
const OFFSET_SAMPLE_ROWS: usize = 1 << 12;

/// Rows `Codes::centre` first looks at, to see whether the median has moved
/// enough to take it from `OFFSET_SAMPLE_ROWS`: a quarter of the work, and
/// a median of 1,024 rows is within a few hundredths of a standard
/// deviation of the rows' own, far less than the move that counts.
const OFFSET_GLANCE_ROWS: usize = 1 << 10;

/// The offset the codes of `vectors` (row after row, `dims` each) are
/// taken from: each dimension's median, over at most `sample_rows` rows
/// spread evenly; zero without rows. Any offset keeps the bound
/// sound. The median moves rows that share a common part (image patches)
/// to around zero, as the mean would, but a few rows of huge values do not
/// drag it away from all the others, as they would the mean.
fn offset_of(dims: usize, vectors: &[f32], sample_rows: usize) -> Vec<f32> {
    let rows = vectors.len() / dims;
    if rows == 0 {
        return vec![0.0; dims];
    }
    let sample: Vec<usize> = (0..rows).step_by(rows.div_ceil(sample_rows)).collect();
    // A tile of the sample's columns side by side, as integers in
    // `f32::total_cmp`'s order, filled `OFFSET_TILE` dimensions of a row at
    // a time: the rows are read in memory order, not once for each
    // dimension, and the columns written to stay in cache. A column's
    // stride, 16 times an odd number, is not a power of two, so that the
    // columns' ends do not all fall in the same cache set.
    let n = sample.len();
    let stride = n.next_multiple_of(32) + 16;
    let mut columns = vec![0i32; OFFSET_TILE.min(dims) * stride];
    let mut offset = Vec::with_capacity(dims);
    for first in (0..dims).step_by(OFFSET_TILE) {
        let tile = first..dims.min(first + OFFSET_TILE);
        for (s, &row) in sample.iter().enumerate() {
            let values = &vectors[row * dims..(row + 1) * dims][tile.clone()];
            let ends = columns[s..].iter_mut().step_by(stride);
            ends.zip(values).for_each(|(c, &x)| *c = total_order(x.to_bits() as i32));
        }
        let medians = columns.chunks_exact_mut(stride).take(tile.len());
        offset.extend(
            medians.map(|column| f32::from_bits(total_order(*column[..n].select_nth_unstable(n / 2).1) as u32)),
        );
    }
    offset
}

/// Dimensions `offset_of` gathers at a time.
const OFFSET_TILE: usize = 256;

/// An f32's bits as an integer whose order is `f32::total_cmp`'s (negative
/// values' magnitude bits flipped), and back again.
fn total_order(bits: i32) -> i32 {
    bits ^ (((bits >> 31) as u32) >> 1) as i32
}

/// The most a row's multiple of the offset may be, either way
/// (`offset_multiple`): each query's bound allows for its `q . μ`, and
/// its error, taken this many times (`Bounds::absolute`).
const OFFSET_MULTIPLE_MAX: f64 = 8.0;

/// The multiple `κ` of the `offset` `μ` (`|μ|^2` about `squared`) a row
/// `v` is coded from (the module doc, "Centred codes"): `v . μ / |μ|^2`,
/// the multiple nearest `v`, so that rows of one pattern at different
/// magnitudes (image patches bright and dark) are all centred, within
/// `OFFSET_MULTIPLE_MAX` either way; 0 where there is no offset or it
/// overflows. Any `κ` is sound: only how tight the codes are depends on it.
fn offset_multiple(v: &[f32], offset: &[f32], squared: f64) -> f32 {
    let product: f64 = v.iter().zip(offset).map(|(&x, &m)| f64::from(x) * f64::from(m)).sum();
    let multiple = (product / squared).clamp(-OFFSET_MULTIPLE_MAX, OFFSET_MULTIPLE_MAX);
    if multiple.is_finite() {
        multiple as f32
    } else {
        0.0
    }
}

/// Rows coded from their own multiples of the offset must have squares
/// about them at most this part of those about the offset itself, on
/// average over the rows (`multiples_pay`).
const MULTIPLES_SPREAD_MAX: f64 = 0.75;

/// Whether the rows of `vectors` (`dims` each) are told apart enough better
/// coded from their own multiples of `offset` (`|offset|^2` about
/// `squared`) than from the offset itself to pay for each pair's bound
/// reading each row's multiple: each row's square about its multiple at
/// most `MULTIPLES_SPREAD_MAX` of its square about the offset, on average
/// over at most `OFFSET_GLANCE_ROWS` rows spread evenly (each row counts
/// alike, as each row's bound is as tight as its own code). Image patches,
/// bright and dark, have it; GloVe's words have not, and searches of
/// 400,000 x 50 took 5 to 15% longer reading multiples for no row fewer
/// scored.
fn multiples_pay(dims: usize, vectors: &[f32], offset: &[f32], squared: f64) -> bool {
    let rows = vectors.len() / dims;
    if rows == 0 || squared == 0.0 {
        return false;
    }
    let (mut parts, mut counted) = (0.0f64, 0.0f64);
    for row in (0..rows).step_by(rows.div_ceil(OFFSET_GLANCE_ROWS)) {
        let v = &vectors[row * dims..(row + 1) * dims];
        let multiple = f64::from(offset_multiple(v, offset, squared));
        let (mut about_offset, mut about_multiple) = (0.0f64, 0.0f64);
        for (&x, &m) in v.iter().zip(offset) {
            let (x, m) = (f64::from(x), f64::from(m));
            about_offset += (x - m) * (x - m);
            about_multiple += (x - multiple * m) * (x - multiple * m);
        }
        // A row on the offset gains nothing; one of values beyond f64's
        // squares (NaN) leaves the sum NaN, and so no multiples.
        parts += if about_offset > 0.0 { about_multiple / about_offset } else { 1.0 };
        counted += 1.0;
    }
    parts <= counted * MULTIPLES_SPREAD_MAX
}

/// A vector's centred code on the fitted grid (`Centred`): the code, with
/// codes from `-levels` to `levels`, of `y = x - κμ` for the `offset` `μ`
/// and its `multiple` `κ` (the module doc's "Centred codes"), each `κ μ_i`
/// exact in f64 (two f32s' 24 significant bits each) and each `y_i` so
/// rounded at most once, with a residual bound that covers that rounding;
/// `|x - κμ|`, rounded up; and `μ . y`, rounded to nearest. Hands the codes
/// to `put` as `encode` does.
fn encode_centred(
    v: &[f32],
    (offset, multiple): (&[f32], f32),
    (levels, directions): (i8, &[f32]),
    mut put: impl FnMut(usize, &[i8]),
) -> Centred {
    let top = f64::from(levels);
    let kappa = f64::from(multiple);
    let centred = |(&x, &m): (&f32, &f32)| f64::from(x) - kappa * f64::from(m);
    let largest = v.iter().zip(offset).map(centred).fold(0.0f64, |m, y| m.max(y.abs()));
    if largest == 0.0 {
        v.chunks(CHUNK).enumerate().for_each(|(c, chunk)| put(c * CHUNK, &[0; CHUNK][..chunk.len()]));
        let code = Encoded { scale: 0.0, sum: 0, residual: 0.0 };
        return Centred { code, norm: 0.0, offset_product: 0.0, along: [0.0; DIRECTIONS] };
    }
    let scale = f32_at_least(largest / top).max(f32::from_bits(1));
    let (step, top, kappa) = (f64x4::splat(f64::from(scale)), f64x4::splat(top), f64x4::splat(kappa));
    // Eight partial sums each of `e_i^2`, `y_i^2` and `μ_i y_i`, value `i`
    // in sum `i % 8`, four to a register.
    let (mut squares, mut centred_squares, mut products) = ([f64x4::ZERO; 2], [f64x4::ZERO; 2], [f64x4::ZERO; 2]);
    // And where `directions` are given, of `u_ji e_i` for each.
    let mut along = [[f64x4::ZERO; 2]; DIRECTIONS];
    let (mut sum, mut codes) = (0, [0i8; CHUNK]);
    for (c, (chunk, offsets)) in v.chunks(CHUNK).zip(offset.chunks(CHUNK)).enumerate() {
        let groups = chunk.chunks(8).zip(offsets.chunks(8)).zip(codes.chunks_mut(8));
        for (g, ((values, offsets), codes)) in groups.enumerate() {
            // A short last group is padded with zeros: `y = 0`, code 0, and
            // nothing added to any sum.
            let (x, m) = (widened(values), widened(offsets));
            let y = [x[0] - kappa * m[0], x[1] - kappa * m[1]];
            let e = code_eight(y, step, top, codes);
            for half in 0..2 {
                squares[half] += e[half] * e[half];
                centred_squares[half] += y[half] * y[half];
                products[half] += m[half] * y[half];
            }
            let at = c * CHUNK + g * 8;
            for (direction, sums) in directions.chunks_exact(v.len()).zip(&mut along) {
                let u = widened(&direction[at..at + values.len()]);
                sums[0] += e[0] * u[0];
                sums[1] += e[1] * u[1];
            }
        }
        let n = chunk.len();
        sum += codes[..n].iter().map(|&code| i32::from(code)).sum::<i32>();
        put(c * CHUNK, &codes[..n]);
    }
    let total = |sums: [f64x4; 2]| sums.iter().flat_map(|s| s.to_array()).sum::<f64>();
    let (squares, centred_squares, product) = (total(squares), total(centred_squares), total(products));
    // A sum of n squares is off by at most n 2^-53 of itself (n <= 2^16),
    // its root by half that: 2^-30 more covers both.
    let margin = 1.0 + 2f64.powi(-30);
    let residual = squares.sqrt() * margin;
    let norm = centred_squares.sqrt() * margin;
    // `y_i` is off `x_i - κ μ_i` by at most 2^-53 of itself, and `e_i` off
    // `y_i - a c_i` by 2^-53 of itself: 2^-50 of `|y|` covers both.
    let code = Encoded { scale, sum, residual: f32_at_least(residual + norm * 2f64.powi(-50)) };
    let along = along.map(|sums| total(sums) as f32);
    Centred { code, norm: f32_at_least(norm), offset_product: product as f32, along }
}

/// What `encode_centred` finds of a vector besides its codes.
#[derive(Clone, Copy, Debug)]
struct Centred {
    code: Encoded,
    /// `|x - κμ|`, rounded up.
    norm: f32,
    /// `μ . y`, rounded to nearest: within `2^-24` of itself (and `2^-150`
    /// where subnormal) and `(n + 4)
    /// 2^-52 |μ||x - κμ|` of `μ . (x - κμ)` (each product and sum off by at
    /// most 2^-53 of the magnitudes, and `y` off `x - κμ` by 2^-52 of `|y|`).
    offset_product: f32,
    /// `w_j`, each direction's product with the residual `e` (the module
    /// doc, "Along the rows' main directions"), rounded to nearest; zeros
    /// where no directions were given.
    along: [f32; DIRECTIONS],
}

/// Directions along which a second look takes the rows' residuals apart
/// (the module doc, "Along the rows' main directions").
pub const DIRECTIONS: usize = 4;

/// The rows' main directions are kept only where they hold at least this
/// share of the rows' squares about their multiples of the offset, each
/// row scaled to norm 1 (`directions_of`: each row counts alike, as each
/// row's bound is as tight as its own code): image patches' four hold
/// from 0.61 to 0.89 of them (by which rows are sampled: one image's
/// patches, the other's, or both), scikit-learn's digits' 0.46, GloVe's
/// 0.19, random rows' 0.04. Below, a second look gains too little by them
/// to pay for their 16 bytes a row (digits: 0.67% of the rows scored in
/// place of 0.69%, in a model).
const DIRECTIONS_SHARE_MIN: f64 = 0.55;

/// New main directions replace those the rows are coded with
/// (`Codes::centre`) where they leave at most this part of the squares the
/// old leave out (or where one pays and the other did not): a fifth less,
/// far more than a power iteration's noise between samples of one kind of
/// rows.
const DIRECTIONS_LEFT_RATIO: f64 = 0.8;

/// Indexes of fewer dimensions keep no main directions: four of eight
/// random dimensions hold more than half the squares.
const DIRECTIONS_DIMS_MIN: usize = 16;

/// Rounds of the power iteration that finds the directions.
const DIRECTIONS_ROUNDS: usize = 8;

/// Values of the sampled rows the power iteration reads, at most: about
/// ten million operations each time `Codes::centre` looks (a few
/// milliseconds, at each power of two rows up to `CENTRE_ROWS_MAX`), beside
/// the recoding of every row where the offset moves.
const DIRECTIONS_SAMPLE_VALUES: usize = 1 << 17;

/// The main directions of the rows of `vectors` (`dims` each) about their
/// multiples of `offset` (`|offset|^2` about `squared`; each row's own
/// multiple where `multiples`, else 1): `DIRECTIONS` orthonormal vectors of
/// `dims` values one after the other, found by a power iteration over rows
/// spread evenly, each scaled to norm 1, if they hold at least
/// `DIRECTIONS_SHARE_MIN` of those rows' squares; else none. And whether
/// they are better than `old` (the directions the rows are coded with, or
/// none) by `DIRECTIONS_LEFT_RATIO` on those rows. Any directions keep the
/// bound sound, and how near these come to the exact principal ones only
/// makes it tighter or looser.
fn directions_of(
    dims: usize,
    vectors: &[f32],
    (offset, squared): (&[f32], f64),
    (multiples, old): (bool, &[f32]),
) -> (Vec<f32>, bool) {
    // Below `DIRECTIONS_DIMS_MIN` dimensions, rows drawn at random hold
    // the share in their first directions by chance.
    let rows = vectors.len() / dims;
    if rows < 4 * DIRECTIONS || dims < DIRECTIONS_DIMS_MIN {
        return (Vec::new(), !old.is_empty());
    }
    let sample_rows = (DIRECTIONS_SAMPLE_VALUES / dims).clamp(4 * DIRECTIONS, OFFSET_SAMPLE_ROWS);
    let mut y = Vec::with_capacity(sample_rows.min(rows) * dims);
    for v in vectors.chunks_exact(dims).step_by(rows.div_ceil(sample_rows)) {
        let kappa = if multiples { f64::from(offset_multiple(v, offset, squared)) } else { 1.0 };
        let start = y.len();
        y.extend(v.iter().zip(offset).map(|(&x, &m)| f64::from(x) - kappa * f64::from(m)));
        let norm = y[start..].iter().map(|y| y * y).sum::<f64>().sqrt();
        if norm > 0.0 && norm.is_finite() {
            y[start..].iter_mut().for_each(|y| *y /= norm);
        } else {
            // On its multiple of the offset, or past f64's squares: left out.
            y.truncate(start);
        }
    }
    let total: f64 = y.iter().map(|y| y * y).sum();
    if !(total.is_finite() && total > 0.0) {
        return (Vec::new(), !old.is_empty());
    }
    // A start that no rows are orthogonal to but by chance: values of a
    // fixed xorshift sequence.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut u: Vec<f64> = (0..DIRECTIONS * dims)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        })
        .collect();
    for _ in 0..DIRECTIONS_ROUNDS {
        orthonormal(&mut u, dims);
        // The next directions: `Y^T Y u_j`.
        let mut next = vec![0.0f64; DIRECTIONS * dims];
        for y in y.chunks_exact(dims) {
            for (u, next) in u.chunks_exact(dims).zip(next.chunks_exact_mut(dims)) {
                let product: f64 = y.iter().zip(u).map(|(y, u)| y * u).sum();
                next.iter_mut().zip(y).for_each(|(next, y)| *next += product * y);
            }
        }
        u = next;
    }
    orthonormal(&mut u, dims);
    let found: Vec<f32> = u.iter().map(|&u| u as f32).collect();
    // The squares the sampled rows have along each set of directions
    // (orthonormal, or nearly so in f32).
    let held = |directions: &[f32]| -> f64 {
        let along = |(y, u): (&[f64], &[f32])| y.iter().zip(u).map(|(y, &u)| y * f64::from(u)).sum::<f64>().powi(2);
        y.chunks_exact(dims).flat_map(|y| directions.chunks_exact(dims).map(move |u| along((y, u)))).sum()
    };
    let (held, held_before) = (held(&found), held(old));
    if held < total * DIRECTIONS_SHARE_MIN {
        return (Vec::new(), !old.is_empty());
    }
    let better = old.is_empty() || total - held <= (total - held_before) * DIRECTIONS_LEFT_RATIO;
    (found, better)
}

/// Makes `u`'s `DIRECTIONS` vectors of `dims` values orthonormal, in place
/// (Gram-Schmidt); one in the span of those before it becomes zero.
fn orthonormal(u: &mut [f64], dims: usize) {
    for j in 0..DIRECTIONS {
        let (before, rest) = u.split_at_mut(j * dims);
        let this = &mut rest[..dims];
        for other in before.chunks_exact(dims) {
            let product: f64 = this.iter().zip(other).map(|(a, b)| a * b).sum();
            this.iter_mut().zip(other).for_each(|(a, b)| *a -= product * b);
        }
        let norm = this.iter().map(|a| a * a).sum::<f64>().sqrt();
        let scale = if norm > 0.0 && norm.is_finite() { 1.0 / norm } else { 0.0 };
        this.iter_mut().for_each(|a| *a *= scale);
    }
}

/// Codes up to 8 values `y` (in f64, zeros past the last) on the grid of
/// `step` (an f32's value) within `top` (at most 127): each `y_i / step`
/// rounded to the nearest integer, halves away from zero, and clamped to
/// `[-top, top]`, into `codes`. Returns the residuals `y_i - step c_i`, each
/// rounded once (`step c_i`, of 24 and 7 significant bits, is exact).
///
/// The rounding is `f64::round`'s (a library call in a build for any
/// x86-64, which would keep the loop out of vector registers): adding and
/// taking away 2^52 rounds `|x|` to the nearest, halves to even, exactly;
/// an even neighbour taken at a half is then one short. Adding 1.5 x 2^52
/// to the integer puts it, in two's complement, in the low bits of the
/// sum's mantissa.
#[inline(always)]
fn code_eight(y: [f64x4; 2], step: f64x4, top: f64x4, codes: &mut [i8]) -> [f64x4; 2] {
    const TWO_52: f64 = 4_503_599_627_370_496.0;
    let mut residuals = [f64x4::ZERO; 2];
    for (half, (y, residual)) in y.into_iter().zip(&mut residuals).enumerate() {
        let x = (y / step).clamp(-top, top);
        let (magnitude, two_52) = (x.abs(), f64x4::splat(TWO_52));
        let even = (magnitude + two_52) - two_52;
        let away = even + (magnitude - even).simd_eq(f64x4::HALF).select(f64x4::ONE, f64x4::ZERO);
        // `away` is not negative: the sign's bit is `x`'s alone.
        let rounded = away | (x & f64x4::splat(-0.0));
        *residual = y - step * rounded;
        let integers = (rounded + f64x4::splat(1.5 * TWO_52)).to_array();
        let out = codes.iter_mut().skip(half * 4);
        out.zip(integers).for_each(|(code, integer)| *code = integer.to_bits() as i8);
    }
    residuals
}

/// Up to 8 values in f64, the rest zeros, in two registers.
#[inline(always)]
fn widened(values: &[f32]) -> [f64x4; 2] {
    let mut wide = [0.0f64; 8];
    wide.iter_mut().zip(values).for_each(|(w, &x)| *w = f64::from(x));
    [f64x4::from([wide[0], wide[1], wide[2], wide[3]]), f64x4::from([wide[4], wide[5], wide[6], wide[7]])]
}

/// Adds up values' powers for a norm of `p` at least the exact
/// `(sum |e_i|^p)^(1/p)`. For `p` a multiple of 1/4 it is that norm, from
/// `power_of`. For any other, between `p0 = ⌊4 p⌋ / 4` and `p1 = p0 + 1/4`,
/// both norms are found, and `|e|_p <= |e|_p0^(1 - θ) |e|_p1^θ` where `1 / p
/// = (1 - θ) / p0 + θ / p1` (Hölder's inequality: norms are log-convex in
/// `1 / p`), which is within a fraction of a percent of `|e|_p` for values
/// alike.
#[derive(Clone, Copy, Debug)]
pub struct NormAbove {
    p: f64,
    quarters: [u32; 2],
    sums: [f64; 2],
}

impl NormAbove {
    pub fn new(p: f32) -> NormAbove {
        let below = (p * 4.0).floor() as u32;
        let above = (p * 4.0).ceil() as u32;
        NormAbove { p: f64::from(p), quarters: [below, above], sums: [0.0; 2] }
    }

    #[inline(always)]
    pub fn add(&mut self, e: f64) {
        self.sums[0] += power_of(e, self.quarters[0]);
        if self.quarters[1] != self.quarters[0] {
            self.sums[1] += power_of(e, self.quarters[1]);
        }
    }

    /// The norm, rounded up.
    pub fn norm(&self) -> f64 {
        let [below, above] = self.quarters;
        // Each sum is off by at most n 2^-53 of itself, each power by at
        // most 12 roundings of 2^-53 (`power_of`), the roots and their
        // product by a few more.
        let margin = 1.0 + 2f64.powi(-30);
        if below == above {
            return norm_of(self.sums[0], below) * margin;
        }
        let (p0, p1) = (f64::from(below) / 4.0, f64::from(above) / 4.0);
        let theta = (1.0 / p0 - 1.0 / self.p) / (1.0 / p0 - 1.0 / p1);
        let (n0, n1) = (norm_of(self.sums[0], below), norm_of(self.sums[1], above));
        n0.powf(1.0 - theta) * n1.powf(theta) * margin
    }
}

/// `x^(quarters / 4)` for `x >= 0`, `quarters` from 1 to 32: the whole
/// power by products, then times `sqrt(x)` and `sqrt(sqrt(x))` as the
/// quarters ask; each of at most 11 operations is correctly rounded.
pub fn power_of(x: f64, quarters: u32) -> f64 {
    let (mut power, mut square, mut whole) = (1.0, x, quarters / 4);
    while whole > 0 {
        if whole & 1 == 1 {
            power *= square;
        }
        square *= square;
        whole >>= 1;
    }
    if quarters & 2 != 0 {
        power *= x.sqrt();
    }
    if quarters & 1 != 0 {
        power *= x.sqrt().sqrt();
    }
    power
}

/// `sum^(4 / quarters)`: the norm whose `power_of` terms `sum` adds up.
pub fn norm_of(sum: f64, quarters: u32) -> f64 {
    match quarters {
        4 => sum,
        8 => sum.sqrt(),
        _ => sum.powf(4.0 / f64::from(quarters)),
    }
}

/// The least power of two not below `x` (a finite f32 at least 0), and at
/// least 2^-126, so that its exponent field alone names it.
fn power_of_two_at_least(x: f32) -> f32 {
    let x = x.max(f32::MIN_POSITIVE);
    let bits = x.to_bits();
    let mantissa = bits & ((1 << 23) - 1);
    if mantissa == 0 {
        x
    } else {
        f32::from_bits((bits & !((1 << 23) - 1)) + (1 << 23))
    }
}

/// A power-of-two scale's exponent field: which of `Codes::exponents`
/// counts it.
pub fn exponent_of(scale: f32) -> usize {
    (scale.to_bits() >> 23) as usize & 0xff
}

/// A row's code as stored: offset by 128, so that `vpdpbusd` can take it as
/// its unsigned operand.
pub fn stored(code: i8) -> u8 {
    (code as u8) ^ 0x80
}

/// The codes of an index's rows, row `r` at `bytes[r * stride..]` (each
/// offset by 128, `stored`), with its scale and residual bound.
#[derive(Debug)]
pub struct Codes {
    grid: Grid,
    dims: usize,
    /// Bytes from one row's codes to the next: `dims` on the fitted grid;
    /// on powers of two, whole 32-byte blocks, padded with code 0, which
    /// every query code also has there; on the logarithmic grid as many
    /// levels (padded with level 0).
    stride: usize,
    /// In whole cache lines (`Aligned`): with a stride of whole blocks,
    /// a 64-byte load of a row reads one line.
    bytes: Aligned<u8>,
    /// Logarithmic only: each row's sign bits, one per level, row `r`'s
    /// from `r * stride / 8`. Apart from the levels, so that a search of
    /// an index without negative values (most) streams only the levels.
    signs: Vec<u8>,
    scales: Vec<f32>,
    residuals: Vec<f32>,
    /// Fitted only: the offset `μ` the rows' codes are taken from (the
    /// module doc, "Centred codes"), zero until a `centre` first moves it;
    /// each row's multiple `κ` of it (`offset_multiple`), and its `|x -
    /// κμ|`, rounded up.
    offset: Vec<f32>,
    offset_multiples: Vec<f32>,
    centred_norms: Vec<f32>,
    /// Fitted only: whether rows are coded from their own multiples of
    /// the offset (`multiples_pay`); where they are not, each row's `κ` is
    /// 1 and `offset_multiples` is empty.
    multiples: bool,
    /// Fitted only: each row's `μ . (x - κμ)`, rounded to nearest (`Centred`).
    offset_products: Vec<f32>,
    /// Fitted only, where they pay (`directions_of`; else empty): the rows'
    /// main directions `u_j`, `DIRECTIONS` of `dims` values one after the
    /// other, an upper bound on each one's norm, and each row's products
    /// `w_j` with them (`Centred::along`).
    directions: Vec<f32>,
    direction_norms: [f64; DIRECTIONS],
    along: Vec<[f32; DIRECTIONS]>,
    /// `|μ|^2`, summed in f64 once per offset (`set_offset`), for
    /// `offset_norm` and each query's `offset_scale_for`.
    offset_squared: f64,
    /// Powers of two and logarithmic only: how many rows have each exponent
    /// field (`exponent_of`), so that a search codes its query only for
    /// those.
    exponents: Vec<u32>,
    /// Logarithmic only: how many rows hold a negative value (a sign bit),
    /// so that searches of indexes without one skip the signs.
    negatives: u32,
}

impl Codes {
    /// Whether a child forked from now on gets the codes' bytes
    /// (`Aligned::inherit`); the rest is small.
    pub fn inherit(&self, inherited: bool) {
        self.bytes.inherit(inherited);
    }

    /// Codes on `grid` for rows of `dims` values, if an index of that many
    /// keeps them.
    pub fn new(dims: usize, grid: Grid) -> Option<Codes> {
        let (stride, exponents) = match grid {
            Grid::Fitted => (dims, Vec::new()),
            Grid::PowersOfTwo { .. } => (dims.next_multiple_of(BLOCK), vec![0; 256]),
            Grid::Logarithmic { .. } => (dims.next_multiple_of(BLOCK), vec![0; 256]),
        };
        (dims <= DIMS_MAX).then(|| Codes {
            grid,
            dims,
            stride,
            bytes: Aligned::zeroed(SLACK),
            signs: Vec::new(),
            scales: Vec::new(),
            residuals: Vec::new(),
            offset: if grid == Grid::Fitted { vec![0.0; dims] } else { Vec::new() },
            offset_multiples: Vec::new(),
            centred_norms: Vec::new(),
            multiples: false,
            offset_products: Vec::new(),
            directions: Vec::new(),
            direction_norms: [0.0; DIRECTIONS],
            along: Vec::new(),
            offset_squared: 0.0,
            exponents,
            negatives: 0,
        })
    }

    /// The codes of `vectors` (row after row).
    pub fn of(dims: usize, grid: Grid, vectors: &[f32]) -> Option<Codes> {
        let mut codes = Codes::new(dims, grid)?;
        let rows = vectors.len() / dims;
        // The buffer starts with the `SLACK` bytes `push` keeps past the
        // last row, so this is all it will need.
        codes.bytes.reserve_exact(rows * codes.stride + SLACK);
        codes.bytes.fault_in();
        if grid == (Grid::Logarithmic { signs: true }) {
            codes.signs.reserve_exact(rows * codes.stride / 8);
        }
        codes.scales.reserve_exact(rows);
        codes.residuals.reserve_exact(rows);
        if grid == Grid::Fitted {
            codes.centred_norms.reserve_exact(rows);
            codes.offset_products.reserve_exact(rows);
            codes.set_offset(offset_of(dims, vectors, OFFSET_SAMPLE_ROWS));
            codes.set_multiples(multiples_pay(dims, vectors, &codes.offset, codes.offset_squared));
            if codes.multiples {
                codes.offset_multiples.reserve_exact(rows);
            }
            let offset = (&codes.offset[..], codes.offset_squared);
            codes.set_directions(directions_of(dims, vectors, offset, (codes.multiples, &[])).0);
            if codes.has_directions() {
                codes.along.reserve_exact(rows);
            }
        }
        for v in vectors.chunks_exact(dims) {
            codes.push(v);
        }
        Some(codes)
    }

    /// Whether the rows' median should be looked at again (`centre`), now
    /// that there are as many rows as there are: at every power of two from
    /// `CENTRE_ROWS_MIN` to `CENTRE_ROWS_MAX` rows, so that an index filled
    /// a batch at a time is coded from the median of its first rows, and
    /// from a newer one wherever the rows move it.
    pub fn wants_centre(&self) -> bool {
        let rows = self.len();
        self.grid == Grid::Fitted && rows.is_power_of_two() && (CENTRE_ROWS_MIN..=CENTRE_ROWS_MAX).contains(&rows)
    }

    /// Takes the rows' median (`offset_of`) as the offset and codes every
    /// row (`vectors`, row after row, as coded so far) afresh from it, if it
    /// centres them enough better than the offset they are coded from
    /// (`RECENTRE_SHIFT_MIN`, judged from `OFFSET_GLANCE_ROWS` rows); or
    /// codes them afresh with their main directions as they are now
    /// (`directions_of`), if those leave out enough less of the rows than
    /// the ones they are coded with (`DIRECTIONS_LEFT_RATIO`): rows that
    /// come in batches of one kind and then another (patches of one image,
    /// then of the next) would otherwise keep the first kind's. Returns
    /// whether it did.
    pub fn centre(&mut self, vectors: &[f32]) -> bool {
        assert_eq!(self.grid, Grid::Fitted, "only products' codes are centred");
        assert_eq!(vectors.len(), self.len() * self.dims, "a vector per row");
        let glance = offset_of(self.dims, vectors, OFFSET_GLANCE_ROWS);
        let shift: f64 =
            glance.iter().zip(&self.offset).map(|(&new, &old)| (f64::from(new) - f64::from(old)).powi(2)).sum();
        let spread = self.centred_norms.iter().map(|&norm| f64::from(norm).powi(2)).sum::<f64>() / self.len() as f64;
        let moved = shift > spread * RECENTRE_SHIFT_MIN;
        if moved {
            let whole = self.len() <= OFFSET_GLANCE_ROWS;
            self.set_offset(if whole { glance } else { offset_of(self.dims, vectors, OFFSET_SAMPLE_ROWS) });
            self.set_multiples(multiples_pay(self.dims, vectors, &self.offset, self.offset_squared));
        }
        let offset = (&self.offset[..], self.offset_squared);
        let (directions, better) = directions_of(self.dims, vectors, offset, (self.multiples, &self.directions));
        if !moved && !better {
            return false;
        }
        self.set_directions(directions);
        for (row, v) in vectors.chunks_exact(self.dims).enumerate() {
            self.set(row, v);
        }
        true
    }

    /// `λ` for a query whose `q . μ` is about `product` (the module doc,
    /// "Centred codes"): `q . μ / |μ|^2`, the multiple of `μ` nearest the
    /// query, so that a query scaled to unit norm (cosine, ip) centres as
    /// well as one from the rows' own distribution; 0 where it is not
    /// finite in f32 (no offset yet, or one far smaller than the query).
    fn offset_scale_for(&self, product: f32) -> f32 {
        let scale = (f64::from(product) / self.offset_squared) as f32;
        if scale.is_finite() {
            scale
        } else {
            0.0
        }
    }

    /// Codes rows from here on from their own multiples of the offset, or
    /// not (`multiples`), with room for each row's multiple where they are.
    fn set_multiples(&mut self, multiples: bool) {
        self.multiples = multiples;
        self.offset_multiples = if multiples { vec![0.0; self.len()] } else { Vec::new() };
    }

    /// Codes rows from here on with their products with `directions`
    /// (`directions_of`: none, or `DIRECTIONS` of `dims` values each), with
    /// room for each row's: each direction's norm is summed in f64 from
    /// exact squares, off by at most `n 2^-53` of itself, its root by half
    /// that more, and kept rounded up.
    fn set_directions(&mut self, directions: Vec<f32>) {
        self.direction_norms = [0.0; DIRECTIONS];
        for (norm, u) in self.direction_norms.iter_mut().zip(directions.chunks_exact(self.dims)) {
            let squares: f64 = u.iter().map(|&u| f64::from(u) * f64::from(u)).sum();
            *norm = squares.sqrt() * (1.0 + 2f64.powi(-30));
        }
        self.along = if directions.is_empty() { Vec::new() } else { vec![[0.0; DIRECTIONS]; self.len()] };
        self.directions = directions;
    }

    /// Whether rows keep their products with the rows' main directions.
    pub fn has_directions(&self) -> bool {
        !self.directions.is_empty()
    }

    /// Row `row`'s multiple of the offset, `κ` (1 where rows have none).
    #[inline(always)]
    fn multiple(&self, row: usize) -> f32 {
        if self.multiples {
            self.offset_multiples[row]
        } else {
            1.0
        }
    }

    /// Whether rows are coded from their own multiples of the offset.
    #[cfg(test)]
    pub fn has_multiples(&self) -> bool {
        self.multiples
    }

    fn set_offset(&mut self, offset: Vec<f32>) {
        self.offset_squared = offset.iter().map(|&m| f64::from(m) * f64::from(m)).sum();
        self.offset = offset;
    }

    /// `|μ|`, rounded up.
    pub fn offset_norm(&self) -> f32 {
        f32_at_least(self.offset_squared.sqrt() * (1.0 + BOUND_SURPLUS))
    }

    /// `q . μ` rounded to the nearest f32, and a bound on how far that is
    /// from the exact product, rounded up (the module doc, "Centred
    /// codes"): each product of two f32s is exact in f64, and a sum of `n`
    /// of them is off by at most `n 2^-53` of their magnitudes.
    pub fn offset_product(&self, query: &[f32]) -> (f32, f32) {
        let (mut sum, mut magnitudes) = (0.0f64, 0.0f64);
        for (&q, &m) in query.iter().zip(&self.offset) {
            let product = f64::from(q) * f64::from(m);
            sum += product;
            magnitudes += product.abs();
        }
        let rounded = sum as f32;
        let off = (self.dims + 2) as f64 * 2f64.powi(-53) * magnitudes + (f64::from(rounded) - sum).abs();
        (rounded, f32_at_least(off * (1.0 + BOUND_SURPLUS)))
    }

    fn len(&self) -> usize {
        self.scales.len()
    }

    pub fn grid(&self) -> Grid {
        self.grid
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    pub fn stride(&self) -> usize {
        self.stride
    }

    /// How many rows have each exponent field (powers of two and
    /// logarithmic only).
    pub fn exponents(&self) -> &[u32] {
        &self.exponents
    }

    /// Row `row`'s scale and residual bound.
    #[inline(always)]
    pub fn scale_and_residual(&self, row: usize) -> (f32, f32) {
        (self.scales[row], self.residuals[row])
    }

    /// The query's side of a second look along these rows' main
    /// directions (`Along`, the module doc), for a query's `code` against
    /// these rows, its `fine` code made: `z = b d + b' d'`, each `z_i`
    /// rounded once in f64 (both products are exact), `β_j` its products
    /// with the directions rounded to f32 (any `β` is sound), and `h_i =
    /// z_i - sum β_j u_ji` in four roundings more, each `β_j u_ji` exact:
    /// each within `2^-53` of a magnitude at most `|z_i| + sum |β_j u_ji|`.
    /// Not kept where the rows keep no directions, or where it would not
    /// bound tighter than `P'`.
    fn along_of(&self, code: &QueryCode) -> Along {
        let Some(fine) = code.fine.as_deref().filter(|_| self.has_directions()) else {
            return Along::default();
        };
        let dims = self.dims;
        let (b, fine_b) = (f64::from(code.scale), f64::from(fine.scale));
        let z = |i: usize| b * f64::from(code.signs[i]) + fine_b * f64::from(fine.signs[i]);
        let mut weights = [0.0f32; DIRECTIONS];
        for (weight, u) in weights.iter_mut().zip(self.directions.chunks_exact(dims)) {
            *weight = u.iter().enumerate().map(|(i, &u)| z(i) * f64::from(u)).sum::<f64>() as f32;
        }
        let mut squares = 0.0f64;
        for i in 0..dims {
            let mut h = z(i);
            for (&weight, u) in weights.iter().zip(self.directions.chunks_exact(dims)) {
                h -= f64::from(weight) * f64::from(u[i]);
            }
            squares += h * h;
        }
        let weight: f64 = weights.iter().zip(&self.direction_norms).map(|(&w, &norm)| f64::from(w).abs() * norm).sum();
        let weights_sum: f64 = weights.iter().map(|&w| f64::from(w).abs()).sum();
        // `|z| <= n_q + r'_q`, as `P'` takes it; the five roundings of each
        // `h_i` are within `5 2^-53 (1 + 2^-50)` of its magnitudes, whose
        // vector's norm is at most `|z| + sum |β_j| U_j`: 2^-49 of those
        // covers them; and 2^-30 the sum of squares' and root's roundings.
        let z_norm = f64::from(code.centred_norm) + f64::from(fine.residual);
        let h = squares.sqrt() * (1.0 + 2f64.powi(-30)) + (z_norm + weight) * 2f64.powi(-49);
        let per_residual = h + weight * 2f64.powi(-23);
        // NaN and infinities (of queries past f32's squares) are not less.
        let tighter = per_residual < z_norm;
        if !tighter {
            return Along::default();
        }
        Along {
            kept: true,
            weights,
            per_residual,
            per_centred: weight * 2f64.powi(-50),
            absolute: weights_sum * 2f64.powi(-150),
        }
    }

    /// The stored codes, row `r` from `r * stride`.
    #[inline(always)]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The logarithmic grid's sign bits, row `r`'s from `r * stride / 8`.
    #[inline(always)]
    pub fn signs(&self) -> &[u8] {
        &self.signs
    }

    /// Adds a row's code at the end.
    pub fn push(&mut self, v: &[f32]) {
        let start = self.len() * self.stride;
        self.bytes.resize(start + self.stride + SLACK);
        if self.grid == (Grid::Logarithmic { signs: true }) {
            self.signs.resize(self.signs.len() + self.stride / 8, 0);
        }
        // A scale of 0 counts in no exponent, so that `set` has none to
        // take back.
        self.scales.push(0.0);
        self.residuals.push(0.0);
        if self.multiples {
            self.offset_multiples.push(0.0);
        }
        if self.grid == Grid::Fitted {
            self.centred_norms.push(0.0);
            self.offset_products.push(0.0);
        }
        if self.has_directions() {
            self.along.push([0.0; DIRECTIONS]);
        }
        self.set(self.len() - 1, v);
    }

    /// Replaces row `row`'s code.
    pub fn set(&mut self, row: usize, v: &[f32]) {
        let (dims, stride) = (self.dims, self.stride);
        self.count(row, false);
        let out = &mut self.bytes[row * stride..(row + 1) * stride];
        let encoded = if let Grid::Logarithmic { signs } = self.grid {
            let signs = if signs { &mut self.signs[row * stride / 8..(row + 1) * stride / 8] } else { &mut [][..] };
            Encoded { scale: ratios::encode(v, out, signs), sum: 0, residual: 0.0 }
        } else if self.grid == Grid::Fitted {
            let multiple = if self.multiples { offset_multiple(v, &self.offset, self.offset_squared) } else { 1.0 };
            let centred = encode_centred(v, (&self.offset, multiple), (127, &self.directions), |at, codes| {
                out[at..at + codes.len()].iter_mut().zip(codes).for_each(|(o, &code)| *o = stored(code))
            });
            if self.multiples {
                self.offset_multiples[row] = multiple;
            }
            self.centred_norms[row] = centred.norm;
            self.offset_products[row] = centred.offset_product;
            if let Some(along) = self.along.get_mut(row) {
                *along = centred.along;
            }
            centred.code
        } else {
            out[dims..].fill(stored(0));
            encode(v, self.grid, |at, codes| {
                out[at..at + codes.len()].iter_mut().zip(codes).for_each(|(o, &code)| *o = stored(code))
            })
        };
        self.scales[row] = encoded.scale;
        self.residuals[row] = encoded.residual;
        self.count(row, true);
    }

    /// Counts row `row`'s exponent in (or out of) `exponents`, and on the
    /// logarithmic grid its negative values in `negatives`.
    fn count(&mut self, row: usize, add: bool) {
        let scale = self.scales[row];
        if self.grid != Grid::Fitted && scale > 0.0 {
            let count = &mut self.exponents[exponent_of(scale)];
            *count = if add { *count + 1 } else { *count - 1 };
        }
        let signs = self.signs.get(row * self.stride / 8..(row + 1) * self.stride / 8).unwrap_or_default();
        if signs.iter().any(|&bits| bits != 0) {
            self.negatives = if add { self.negatives + 1 } else { self.negatives - 1 };
        }
    }

    /// How many rows hold a negative value (logarithmic grid only).
    pub fn negatives(&self) -> u32 {
        self.negatives
    }

    /// Moves the last row's code into `row` and drops the last.
    pub fn swap_remove(&mut self, row: usize) {
        let (stride, last) = (self.stride, self.len() - 1);
        self.count(row, false);
        self.bytes.copy_within(last * stride..(last + 1) * stride, row * stride);
        self.bytes.truncate(last * stride);
        self.bytes.resize(last * stride + SLACK);
        if self.grid == (Grid::Logarithmic { signs: true }) {
            let bits = stride / 8;
            self.signs.copy_within(last * bits..(last + 1) * bits, row * bits);
            self.signs.truncate(last * bits);
        }
        self.scales.swap_remove(row);
        self.residuals.swap_remove(row);
        if self.grid == Grid::Fitted {
            if self.multiples {
                self.offset_multiples.swap_remove(row);
            }
            self.centred_norms.swap_remove(row);
            self.offset_products.swap_remove(row);
            if self.has_directions() {
                self.along.swap_remove(row);
            }
        }
    }

    /// Asks for the codes of `rows` rows from `row` (those there are) to
    /// be brought into cache, without waiting for them.
    #[inline(always)]
    pub fn prefetch(&self, row: usize, rows: usize) {
        prefetch_lines(self.codes_of(row..row + rows));
    }

    /// The codes of `rows` (those there are) in `shares` parts of whole
    /// cache lines, each for `prefetch_lines`: a scan that asks for a part
    /// at a time, between its sums, fetches the rows while it works.
    pub fn shares(&self, rows: Range<usize>, shares: usize) -> std::slice::Chunks<'_, u8> {
        let bytes = self.codes_of(rows);
        bytes.chunks(bytes.len().div_ceil(shares.max(1)).next_multiple_of(64).max(64))
    }

    /// The stored codes of `rows`, those there are. The logarithmic grid's
    /// sign bits are not among them: they are left to the hardware's
    /// prefetcher, as the scans read them in order, and only where a value
    /// is negative; a test in `prefetch` would cost every scan of every
    /// grid.
    #[inline(always)]
    fn codes_of(&self, rows: Range<usize>) -> &[u8] {
        let start = (rows.start * self.stride).min(self.bytes.len());
        let end = (rows.end * self.stride).clamp(start, self.bytes.len());
        &self.bytes[start..end]
    }

    /// How many rows have codes.
    #[cfg(test)]
    pub fn rows(&self) -> usize {
        self.len()
    }

    /// Row `row`'s codes.
    #[cfg(test)]
    pub fn row(&self, row: usize) -> impl Iterator<Item = i8> + '_ {
        self.bytes[row * self.stride..row * self.stride + self.dims].iter().map(|&b| (b ^ 0x80) as i8)
    }

    /// Bytes held per row, for the memory formula.
    pub fn bytes_per_row(&self) -> usize {
        let signs = if self.grid == (Grid::Logarithmic { signs: true }) { self.stride / 8 } else { 0 };
        let centred = match (self.grid, self.multiples) {
            (Grid::Fitted, true) => 12,
            (Grid::Fitted, false) => 8,
            _ => 0,
        };
        let along = if self.has_directions() { 4 * DIRECTIONS } else { 0 };
        self.stride + signs + 8 + centred + along
    }
}

/// A query's code: its codes `d` as the kernels want them (zero after the
/// last, to a whole block), their sum, its scale and its residual bound.
/// Its buffers are kept from search to search.
#[derive(Debug, Default)]
pub struct QueryCode {
    dims: usize,
    /// `d_i`: the signed operand of `vpdpbusd` and `vpmaddubsw`.
    signs: Vec<i8>,
    /// The most `|d_i|` may be (`Kernel::query_levels`).
    levels: i8,
    sum: i32,
    scale: f32,
    residual: f32,
    /// `|q - λμ|`, rounded up.
    centred_norm: f32,
    /// `λ`: the multiple of the rows' offset this code is taken from.
    offset_scale: f32,
    /// `t_q`, `q . μ` rounded, and `ε_q` (`Codes::offset_product`).
    offset_product: (f32, f32),
    /// The code `d'` of this code's residual `f = (q - λμ) - b d`, on the
    /// same levels, with its scale `b'` and residual bound `r'_q` (the
    /// module doc, "A second look"); its own `fine` is `None`. Kept, with
    /// its buffers, from search to search.
    fine: Option<Box<QueryCode>>,
    /// Where the rows keep their products with their main directions, the
    /// query's side of them (`Codes::along_of`).
    along: Along,
}

/// A query's side of a second look along the rows' main directions (the
/// module doc, "Along the rows' main directions"), in f64 but `β`.
#[derive(Clone, Copy, Debug, Default)]
struct Along {
    /// Whether the second look takes the rows' products with the
    /// directions: where the rows keep them and the bound is tighter so.
    kept: bool,
    /// `β_j`.
    weights: [f32; DIRECTIONS],
    /// `H = |h| + B 2^-23`, rounded up, with `B = sum |β_j| U_j`: it
    /// multiplies the row's residual bound in place of `P'`.
    per_residual: f64,
    /// `B 2^-50`, which multiplies the row's `|x - κμ|` besides `R'`.
    per_centred: f64,
    /// `2^-150 sum |β_j|`, for the rows' `w_j` rounded among f32's
    /// subnormals.
    absolute: f64,
}

impl QueryCode {
    /// The code of `query` for `kernel`, against the offset of `rows`.
    pub fn of(query: &[f32], kernel: Kernel, rows: &Codes) -> QueryCode {
        let mut code = QueryCode::default();
        code.encode(query, kernel, rows);
        code
    }

    /// Makes this the code of `query - λμ` for `kernel`, `μ` the offset of
    /// `rows` (the module doc, "Centred codes"), in the buffers it has.
    pub fn encode(&mut self, query: &[f32], kernel: Kernel, rows: &Codes) {
        self.encode_on(query, kernel.query_levels(), rows);
    }

    /// `encode` on `levels`, a kernel's `query_levels`.
    fn encode_on(&mut self, query: &[f32], levels: i8, rows: &Codes) {
        assert_eq!(query.len(), rows.offset.len(), "an offset value per dimension");
        self.offset_product = rows.offset_product(query);
        self.offset_scale = rows.offset_scale_for(self.offset_product.0);
        let padded = query.len().next_multiple_of(SLACK);
        self.signs.clear();
        self.signs.resize(padded, 0);
        let signs = &mut self.signs;
        let offset = (&rows.offset[..], self.offset_scale);
        let put = |at: usize, d: &[i8]| signs[at..at + d.len()].copy_from_slice(d);
        let centred = encode_centred(query, offset, (levels, &[]), put);
        let Encoded { scale, sum, residual } = centred.code;
        (self.dims, self.levels, self.sum, self.scale, self.residual) = (query.len(), levels, sum, scale, residual);
        self.centred_norm = centred.norm;
        let fine = self.fine.get_or_insert_with(Box::default);
        fine.encode_residual(query, offset, (scale, &self.signs[..query.len()], centred.norm), levels);
        self.along = rows.along_of(self);
    }

    /// Makes this the code of the residual `f = (q - λμ) - b d` of a
    /// query's code (`encode`), `offset` being `(μ, λ)`, `b` `scale`, `d`
    /// `signs` and `|q - λμ|` at most `norm`: each `f_i` computed in f64 as
    /// `encode_centred` computes it (two roundings, each within 2^-53 of
    /// what it rounds), then coded as a vector would be, on `levels`.
    fn encode_residual(
        &mut self,
        query: &[f32],
        (offset, multiple): (&[f32], f32),
        code: (f32, &[i8], f32),
        levels: i8,
    ) {
        let (scale, signs, norm) = code;
        let (kappa, step) = (f64::from(multiple), f64::from(scale));
        let residual_of = |i: usize| {
            let y = f64::from(query[i]) - kappa * f64::from(offset[i]);
            y - step * f64::from(signs[i])
        };
        let largest = (0..query.len()).fold(0.0f64, |m, i| m.max(residual_of(i).abs()));
        self.dims = query.len();
        self.levels = levels;
        self.signs.clear();
        self.signs.resize(query.len().next_multiple_of(SLACK), 0);
        (self.centred_norm, self.offset_scale, self.offset_product) = (0.0, 0.0, (0.0, 0.0));
        // `f_i` is off `(q_i - λ μ_i) - b d_i` by at most 2^-53 of `|y_i|`
        // and of `|f_i|`, and `f_i - b' d'_i` off `f_i` less the exact
        // product by 2^-53 of itself: all three are at most `|y_i|`, so
        // 2^-50 of `|y|` covers them.
        let slack = f64::from(norm) * 2f64.powi(-50);
        if largest == 0.0 {
            (self.sum, self.scale, self.residual) = (0, 0.0, f32_at_least(slack));
            return;
        }
        let top = f64::from(levels);
        let fine = f32_at_least(largest / top).max(f32::from_bits(1));
        let (step, top) = (f64x4::splat(f64::from(fine)), f64x4::splat(top));
        let (mut squares, mut sum, mut values) = ([f64x4::ZERO; 2], 0, [0.0f64; 8]);
        for (at, group) in (0..query.len()).step_by(8).zip(self.signs.chunks_mut(8)) {
            // A short last group is padded with zeros: code 0, nothing
            // added to the sums.
            values.fill(0.0);
            for (v, i) in values.iter_mut().zip(at..query.len()) {
                *v = residual_of(i);
            }
            let f = [
                f64x4::from([values[0], values[1], values[2], values[3]]),
                f64x4::from([values[4], values[5], values[6], values[7]]),
            ];
            let e = code_eight(f, step, top, group);
            for half in 0..2 {
                squares[half] += e[half] * e[half];
            }
            sum += group.iter().map(|&d| i32::from(d)).sum::<i32>();
        }
        let squares: f64 = squares.iter().flat_map(|s| s.to_array()).sum();
        // As `encode_centred`'s: 2^-30 covers the sum's and the root's
        // roundings.
        let residual = squares.sqrt() * (1.0 + 2f64.powi(-30));
        (self.sum, self.scale, self.residual) = (sum, fine, f32_at_least(residual + slack));
    }

    /// The query's codes.
    #[cfg(test)]
    pub fn signs(&self) -> &[i8] {
        &self.signs[..self.dims]
    }

    /// Whether a second look takes the rows' products with their main
    /// directions (`Along`).
    #[cfg(test)]
    pub fn looks_along(&self) -> bool {
        self.along.kept
    }
}

/// Which int8 first pass a metric's searches take: a bound on products
/// (this module) or a floor under coordinate distances (`floors`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    Products(Shape),
    Floors(floors::Floor),
}

impl Bound {
    /// The grid its codes are on.
    pub fn grid(self) -> Grid {
        match self {
            Bound::Products(_) => Grid::Fitted,
            Bound::Floors(floor) => floor.grid(),
        }
    }
}

/// How the bound treats a metric's score (the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `-((s x row_scale) x query_scale)` (`screen::distance`).
    Cosine,
    /// `-s`.
    Ip,
    /// `sum (q_i - x_i)^2`.
    L2,
}

/// Most queries one `Bounds` holds: the widest `Kernel::query_tile`.
pub const QUERIES_MAX: usize = 4;

/// The queries' side of the bound for a tile of up to `QUERIES_MAX`
/// queries of one index, field by field, so that a tile's pairs take each
/// field of its queries in one load; in f32, rounded the safe way (the
/// module doc, "Evaluated in f32").
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    shape: Shape,
    /// `b`.
    scale: [f32; QUERIES_MAX],
    /// `P = |q| + r_q`, rounded up: it multiplies the row's residual bound.
    per_residual: [f32; QUERIES_MAX],
    /// `R = r_q + |λ| (n + 4) 2^-52 |μ|`, rounded up: it multiplies the
    /// row's `|x - κμ|` (the second term for the row's `μ . (x - κμ)`).
    per_centred: [f32; QUERIES_MAX],
    /// `G`, rounded up: it multiplies the row's norm bound. `g |q|` for
    /// cosine and ip; 0 for l2, whose kernel error is a factor.
    per_norm: [f32; QUERIES_MAX],
    /// `q . μ`, rounded to nearest (`Codes::offset_product`), which the
    /// row's `κ` multiplies.
    offset_product: [f32; QUERIES_MAX],
    /// `λ`, which multiplies the row's `μ . (x - κμ)`.
    offset_scale: [f32; QUERIES_MAX],
    /// `|q|^2`, rounded down (l2).
    query_squared: [f32; QUERIES_MAX],
    /// The query's scale in cosine's distance.
    query_scale: [f32; QUERIES_MAX],
    /// l2: `1 - g - 2^-17`, rounded down.
    shrink: f32,
    /// `A_q = 2 A + 2^-140 + K (2 ε_q + 2^-21 |q . μ|) + 2^-148 |λ|`, rounded
    /// up.
    absolute: [f32; QUERIES_MAX],
    /// The second look's (the module doc): `b'`, `P' = |q - λμ| + r'_q`
    /// and `R' = r'_q + |λ| (n + 4) 2^-52 |μ|`, rounded up; where a query
    /// has no code of its residual, `0`, `P` and `R`. Where it looks along
    /// the rows' main directions (`Along`), `H` in place of `P'`, and `R'`
    /// and `A_q` each with that look's term added (`fine_absolute`).
    fine_scale: [f32; QUERIES_MAX],
    fine_per_residual: [f32; QUERIES_MAX],
    fine_per_centred: [f32; QUERIES_MAX],
    fine_absolute: [f32; QUERIES_MAX],
}

/// One query's side of `Bounds`, as `Lanes::rules_out` takes it; zeros by
/// default (a lane no query takes).
#[derive(Clone, Copy, Debug)]
struct QueryTerms {
    shape: Shape,
    scale: f32,
    per_residual: f32,
    per_centred: f32,
    per_norm: f32,
    offset_product: f32,
    offset_scale: f32,
    query_squared: f32,
    query_scale: f32,
    shrink: f32,
    absolute: f32,
}

impl Default for QueryTerms {
    fn default() -> QueryTerms {
        let zero = 0.0;
        QueryTerms {
            shape: Shape::Ip,
            scale: zero,
            per_residual: zero,
            per_centred: zero,
            per_norm: zero,
            offset_product: zero,
            offset_scale: zero,
            query_squared: zero,
            query_scale: zero,
            shrink: zero,
            absolute: zero,
        }
    }
}

/// The terms the bound reads of each row (`Bounds::rules_out_of`), and
/// where among them its multiple of the offset is.
const ROW_TERMS: usize = 7;
const MULTIPLES_TERM: usize = 4;

/// The bound's margin for its own roundings (the module doc): `2^-19` of
/// the magnitudes it sums, and l2's `2^-17`.
const MARGIN: f32 = 1.0 / (1u32 << 19) as f32;
const L2_MARGIN: f32 = 1.0 / (1u32 << 17) as f32;

/// The greatest f32 not above `x`.
fn f32_at_most(x: f64) -> f32 {
    -f32_at_least(-x)
}

impl Bounds {
    /// For `queries` (at most `QUERIES_MAX`, their `squared_norms` from
    /// `kernels::squared_norm`, `query_scales` their scales in cosine's
    /// distance, and the rows' `|μ|` at most `offset_norm`).
    pub fn new(
        shape: Shape,
        queries: &[QueryCode],
        (squared_norms, query_scales): (&[f64], &[f32]),
        offset_norm: f32,
    ) -> Bounds {
        assert!(queries.len() <= QUERIES_MAX);
        assert!(queries.len() == squared_norms.len() && queries.len() == query_scales.len());
        let dims = queries.first().map_or(0, |code| code.dims);
        let relative = relative_error(dims);
        let absolute = 2.0 * (2 * dims + 64) as f64 * 2f64.powi(-149) + 2f64.powi(-140);
        let mut bounds = Bounds {
            shape,
            scale: [0.0; QUERIES_MAX],
            per_residual: [0.0; QUERIES_MAX],
            per_centred: [0.0; QUERIES_MAX],
            per_norm: [0.0; QUERIES_MAX],
            offset_product: [0.0; QUERIES_MAX],
            offset_scale: [0.0; QUERIES_MAX],
            query_squared: [0.0; QUERIES_MAX],
            query_scale: [0.0; QUERIES_MAX],
            shrink: f32_at_most(1.0 - relative - 2f64.powi(-17)),
            absolute: [f32_at_least(absolute); QUERIES_MAX],
            fine_scale: [0.0; QUERIES_MAX],
            fine_per_residual: [0.0; QUERIES_MAX],
            fine_per_centred: [0.0; QUERIES_MAX],
            fine_absolute: [0.0; QUERIES_MAX],
        };
        for (q, ((code, &squared_norm), &query_scale)) in
            queries.iter().zip(squared_norms).zip(query_scales).enumerate()
        {
            let (product, off) = code.offset_product;
            assert_eq!(code.dims, dims, "one index's queries");
            let norm = f64::from(screen::norm_bound_of(squared_norm));
            let residual = f64::from(code.residual);
            // Each sum of two f64s is off by at most 2^-53 of itself: the
            // surplus covers it before the rounding up.
            let up = |x: f64| f32_at_least(x * (1.0 + BOUND_SURPLUS));
            bounds.scale[q] = code.scale;
            bounds.per_residual[q] = up(f64::from(code.centred_norm) + residual);
            let lambda = f64::from(code.offset_scale);
            let rows_offset = lambda * (dims + 4) as f64 * 2f64.powi(-52) * f64::from(offset_norm);
            bounds.offset_scale[q] = code.offset_scale;
            bounds.per_centred[q] = up(residual + rows_offset);
            let (fine_scale, fine_residual) =
                code.fine.as_deref().map_or((0.0, residual), |fine| (fine.scale, f64::from(fine.residual)));
            bounds.fine_scale[q] = fine_scale;
            let along = code.along;
            bounds.fine_per_residual[q] =
                if along.kept { up(along.per_residual) } else { up(f64::from(code.centred_norm) + fine_residual) };
            bounds.fine_per_centred[q] = up(fine_residual + rows_offset + along.per_centred);
            bounds.per_norm[q] = match shape {
                Shape::Cosine | Shape::Ip => up(relative * norm),
                Shape::L2 => 0.0,
            };
            bounds.offset_product[q] = product;
            let rows_offsets = 2.0 * f64::from(off) + f64::from(product.abs()) * 2f64.powi(-21);
            let offsets = OFFSET_MULTIPLE_MAX * rows_offsets + lambda.abs() * 2f64.powi(-148);
            bounds.absolute[q] = up(absolute + offsets);
            bounds.fine_absolute[q] = up(absolute + offsets + code.along.absolute);
            bounds.query_squared[q] = f32_at_most(squared_norm * (1.0 - BOUND_SURPLUS));
            bounds.query_scale[q] = query_scale;
        }
        bounds
    }

    /// Query `q`'s terms alone, for `Lanes::rules_out`.
    fn of_query(&self, q: usize) -> QueryTerms {
        QueryTerms {
            shape: self.shape,
            scale: self.scale[q],
            per_residual: self.per_residual[q],
            per_centred: self.per_centred[q],
            per_norm: self.per_norm[q],
            offset_product: self.offset_product[q],
            offset_scale: self.offset_scale[q],
            query_squared: self.query_squared[q],
            query_scale: self.query_scale[q],
            shrink: self.shrink,
            absolute: self.absolute[q],
        }
    }

    /// Which of `R` rows of `codes`, with norm bounds `norms` and (cosine)
    /// scales `row_scales`, are strictly farther than `thresholds[q]`
    /// (infinite where query `q` keeps nothing yet) from the first `Q`
    /// queries whatever their exact scores, given the integer products
    /// `dots[q]` (`C`): bit `r` of the `q`-th answer is set when `rows[r]`
    /// cannot enter query `q`'s nearest.
    #[inline(always)]
    pub fn rules_out<const Q: usize, const R: usize>(
        &self,
        codes: &Codes,
        rows: [usize; R],
        dots: [[i32; R]; Q],
        (norms, row_scales): ([f32; R], [f32; R]),
        thresholds: [f32; Q],
    ) -> [u32; Q] {
        let (scales, residuals) = (rows.map(|row| codes.scales[row]), rows.map(|row| codes.residuals[row]));
        let (centred, offsets) = (rows.map(|row| codes.centred_norms[row]), rows.map(|row| codes.offset_products[row]));
        let multiples = rows.map(|row| codes.multiple(row));
        self.rules_out_of(dots, [scales, residuals, centred, offsets, multiples, norms, row_scales], thresholds)
    }

    /// `rules_out` of the rows given as their codes' scales, their
    /// residual bounds, their `|x - κμ|`, their `μ . (x - κμ)`, their `κ`,
    /// their norm bounds and their scales.
    #[inline(always)]
    pub fn rules_out_of<const Q: usize, const R: usize>(
        &self,
        dots: [[i32; R]; Q],
        rows: [[f32; R]; ROW_TERMS],
        thresholds: [f32; Q],
    ) -> [u32; Q] {
        const { assert!(Q <= QUERIES_MAX) };
        // Each shape's pairs in a loop of their own: no branch inside.
        match self.shape {
            Shape::Cosine => self.pairs(Shape::Cosine, dots, rows, thresholds),
            Shape::Ip => self.pairs(Shape::Ip, dots, rows, thresholds),
            Shape::L2 => self.pairs(Shape::L2, dots, rows, thresholds),
        }
    }

    /// Whether a second look rules row `row` of `codes` out for query `q`
    /// (whose code is `code`): its bound (`nearest_finely`) is strictly
    /// farther than `threshold`. For a row the first pass could not rule
    /// out, just before it would be scored exactly.
    #[inline]
    pub fn rules_out_finely(
        &self,
        query: (Kernel, &QueryCode, usize),
        codes: &Codes,
        row: (usize, f32, f32),
        threshold: f32,
    ) -> bool {
        self.nearest_finely_of(query, codes, row) > threshold
    }

    /// The nearest query `q` (whose code is `code`) can be to row `row` of
    /// `codes` (norm bound `norm`, scale `row_scale`) by a second look:
    /// the bound of its products with the query's code and with the code
    /// of its residual (`QueryCode::fine`), `kernel`'s; NaN where the
    /// arithmetic overflowed. A query without a code of its residual gets
    /// the first pass's bound.
    #[inline]
    pub fn nearest_finely_of(
        &self,
        (kernel, code, q): (Kernel, &QueryCode, usize),
        codes: &Codes,
        (row, norm, row_scale): (usize, f32, f32),
    ) -> f32 {
        let (scale, residual) = (codes.scales[row], codes.residuals[row]);
        let terms = [
            scale,
            residual,
            codes.centred_norms[row],
            codes.offset_products[row],
            codes.multiple(row),
            norm,
            row_scale,
        ];
        let dots = match code.fine.as_deref() {
            Some(fine) => {
                let [[dot], [fine]] = kernel.dots_tile([code, fine], codes, [row]);
                [dot, fine]
            }
            None => [kernel.dots_of(code, codes, [row])[0], 0],
        };
        // `sum β_j w_j` and its magnitude, in f32: each product rounded
        // once, then summed in pairs.
        let along = if code.along.kept {
            let [p0, p1, p2, p3] = std::array::from_fn(|j| code.along.weights[j] * codes.along[row][j]);
            ((p0 + p1) + (p2 + p3), (p0.abs() + p1.abs()) + (p2.abs() + p3.abs()))
        } else {
            (0.0, 0.0)
        };
        match self.shape {
            Shape::Cosine => self.nearest_finely(Shape::Cosine, q, terms, dots, along),
            Shape::Ip => self.nearest_finely(Shape::Ip, q, terms, dots, along),
            Shape::L2 => self.nearest_finely(Shape::L2, q, terms, dots, along),
        }
    }

    /// `rules_out_of` for `shape`: a query at a time, its `R` rows in
    /// lanes, without a branch.
    #[inline(always)]
    fn pairs<const Q: usize, const R: usize>(
        &self,
        shape: Shape,
        dots: [[i32; R]; Q],
        [scales, residuals, centred, offsets, multiples, norms, row_scales]: [[f32; R]; ROW_TERMS],
        thresholds: [f32; Q],
    ) -> [u32; Q] {
        let mut ruled = [0; Q];
        for q in 0..Q {
            let mut nearest = [0.0f32; R];
            for r in 0..R {
                let row = [scales[r], residuals[r], centred[r], offsets[r], multiples[r], norms[r], row_scales[r]];
                nearest[r] = self.nearest(shape, q, row, dots[q][r]);
            }
            for (r, &nearest) in nearest.iter().enumerate() {
                ruled[q] |= u32::from(nearest > thresholds[q]) << r;
            }
        }
        ruled
    }

    /// The nearest query `q`'s distance to a row can be (`rules_out`), of
    /// `shape`, the row's code having scale `row_code_scale`, residual
    /// bound `residual`, `|x - κμ|` at most `centred`, `μ . (x - κμ)`
    /// about `offset` and `κ` `multiple`: NaN where the arithmetic
    /// overflowed, which rules nothing out.
    #[inline(always)]
    fn nearest(&self, shape: Shape, q: usize, row: [f32; ROW_TERMS], dot: i32) -> f32 {
        let product = (row[0] * dot as f32) * self.scale[q];
        let per = [self.per_residual[q], self.per_centred[q], self.absolute[q]];
        self.nearest_of(shape, q, row, (product, product.abs()), per)
    }

    /// `nearest` of a second look (the module doc): from the row's
    /// products with the query's code and with its residual's, `abC +
    /// ab'C'`, and the terms of `r'_q` in place of `r_q`'s; and, looking
    /// along the rows' main directions, `sum β_j w_j` and its magnitude
    /// (`along`, zeros otherwise) and `H`'s terms.
    #[inline(always)]
    fn nearest_finely(
        &self,
        shape: Shape,
        q: usize,
        row: [f32; ROW_TERMS],
        [dot, fine]: [i32; 2],
        (along, along_magnitude): (f32, f32),
    ) -> f32 {
        let coarse = (row[0] * dot as f32) * self.scale[q];
        let fine = (row[0] * fine as f32) * self.fine_scale[q];
        let per = [self.fine_per_residual[q], self.fine_per_centred[q], self.fine_absolute[q]];
        let magnitude = (coarse.abs() + fine.abs()) + along_magnitude;
        self.nearest_of(shape, q, row, ((coarse + fine) + along, magnitude), per)
    }

    /// `nearest` given `p` (`product`) and what its margin takes of its
    /// magnitude (`|p|`, or `|p| + |p'|` for a second look, and `sum |β_j
    /// w_j|` along the main directions), the terms that multiply the row's
    /// residual bound and `|x - κμ|`, and `A_q`.
    #[inline(always)]
    fn nearest_of(
        &self,
        shape: Shape,
        q: usize,
        row: [f32; ROW_TERMS],
        (product, magnitude): (f32, f32),
        [per_residual, per_centred, absolute]: [f32; 3],
    ) -> f32 {
        let [_, residual, centred, offset, multiple, norm, row_scale] = row;
        let offset = offset * self.offset_scale[q];
        let centre = self.offset_product[q] * multiple;
        let estimate = (product + centre) + offset;
        let off = (per_residual * residual + per_centred * centred) + self.per_norm[q] * norm;
        let margin = ((magnitude + offset.abs()) + off) * MARGIN;
        let ceiling = ((estimate + off) + margin) + absolute;
        match shape {
            Shape::Cosine => screen::distance(ceiling, row_scale, self.query_scale[q]),
            Shape::Ip => -ceiling,
            Shape::L2 => {
                let squares = self.query_squared[q] + norm * norm;
                let sum = squares - 2.0 * ceiling;
                let floor = sum - (squares + 2.0 * ceiling.abs()) * L2_MARGIN;
                floor * self.shrink - absolute
            }
        }
    }
}

/// The integer product of two codes, one value at a time: the reference the
/// kernels must agree with.
#[cfg(test)]
pub fn dot_scalar(query: &[i8], row: impl Iterator<Item = i8>) -> i32 {
    query.iter().zip(row).map(|(&d, c)| i32::from(d) * i32::from(c)).sum()
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Sums `vpdpbusd(row, query)` over whole 64-byte blocks of each of `R`
    /// rows, row `r` at `bytes[starts[r]..]` (stored codes, offset by 128;
    /// the queries are zero past their end, so the bytes read past a row
    /// count for nothing), for each of `Q` queries: `sum (c_i + 128) d_i`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI; every query must hold `dims`
    /// rounded up to 64 values, and `bytes` as many from each start.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dots_vnni512<const Q: usize, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[i8]; Q],
        dims: usize,
    ) -> [[i32; R]; Q] {
        let mut sums = [[_mm512_setzero_si512(); R]; Q];
        for at in (0..dims).step_by(64) {
            let mut x = [_mm512_setzero_si512(); R];
            for (x, start) in x.iter_mut().zip(starts) {
                // SAFETY: in bounds, as the caller promises.
                *x = unsafe { _mm512_loadu_si512(bytes.as_ptr().add(start + at).cast()) };
            }
            for (sums, query) in sums.iter_mut().zip(queries) {
                // SAFETY: in bounds, as the caller promises.
                let q = unsafe { _mm512_loadu_si512(query.as_ptr().add(at).cast()) };
                for (sum, &x) in sums.iter_mut().zip(&x) {
                    *sum = _mm512_dpbusd_epi32(*sum, x, q);
                }
            }
        }
        if Q * R == 16 {
            // The 16 sums at once: a tree of 45 instructions where one sum
            // at a time takes about 9 each.
            let lanes = sum16(std::array::from_fn(|i| sums[i / R][i % R]));
            return std::array::from_fn(|q| std::array::from_fn(|r| lanes[q * R + r]));
        }
        sums.map(|sums| sums.map(|sum| _mm512_reduce_add_epi32(sum)))
    }

    /// The sum of each of 16 vectors' 16 lanes: halves added to halves,
    /// two vectors' at a time, until each 128-bit lane holds four partial
    /// sums of one vector, which two in-lane transposes add up.
    #[target_feature(enable = "avx512f")]
    fn sum16(v: [__m512i; 16]) -> [i32; 16] {
        // Lanes (128 bits) 0, 1 of `a` with 2, 3, and of `b`: [a, a, b, b].
        let halves = |a, b| {
            _mm512_add_epi32(_mm512_shuffle_i64x2::<0b01_00_01_00>(a, b), _mm512_shuffle_i64x2::<0b11_10_11_10>(a, b))
        };
        // Of [a, a, b, b] and [c, c, d, d]: [a, b, c, d], whole.
        let quarters = |x, y| {
            _mm512_add_epi32(_mm512_shuffle_i64x2::<0b10_00_10_00>(x, y), _mm512_shuffle_i64x2::<0b11_01_11_01>(x, y))
        };
        // Lane j of `x[i]` holds four partial sums of `v[4i + j]`.
        let x: [__m512i; 4] =
            std::array::from_fn(|i| quarters(halves(v[4 * i], v[4 * i + 1]), halves(v[4 * i + 2], v[4 * i + 3])));
        let pairs = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        let (low, high) = (pairs(x[0], x[1]), pairs(x[2], x[3]));
        // Element i of lane j: the sum of `v[4i + j]`.
        let sums = _mm512_add_epi32(_mm512_unpacklo_epi64(low, high), _mm512_unpackhi_epi64(low, high));
        let mut lanes = [0i32; 16];
        // SAFETY: 64 bytes into 16 i32s.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), sums) };
        std::array::from_fn(|i| lanes[4 * (i % 4) + i / 4])
    }

    /// `dots_vnni512` on 32-byte blocks with AVX-VNNI.
    ///
    /// # Safety
    /// The CPU must have AVX2 and AVX-VNNI; bounds as `dots_vnni512`.
    #[target_feature(enable = "avx2,avxvnni")]
    pub unsafe fn dots_vnni256<const Q: usize, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[i8]; Q],
        dims: usize,
    ) -> [[i32; R]; Q] {
        let mut sums = [[_mm256_setzero_si256(); R]; Q];
        for at in (0..dims).step_by(32) {
            let mut x = [_mm256_setzero_si256(); R];
            for (x, start) in x.iter_mut().zip(starts) {
                // SAFETY: in bounds, as the caller promises.
                *x = unsafe { _mm256_loadu_si256(bytes.as_ptr().add(start + at).cast()) };
            }
            for (sums, query) in sums.iter_mut().zip(queries) {
                // SAFETY: in bounds, as the caller promises.
                let q = unsafe { _mm256_loadu_si256(query.as_ptr().add(at).cast()) };
                for (sum, &x) in sums.iter_mut().zip(&x) {
                    *sum = _mm256_dpbusd_avx_epi32(*sum, x, q);
                }
            }
        }
        sums_of(sums)
    }

    /// Each of the sums' eight lanes added up: eight at once where there
    /// are eight (`sum8`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sums_of<const Q: usize, const R: usize>(sums: [[__m256i; R]; Q]) -> [[i32; R]; Q] {
        if Q * R == 8 {
            let lanes = sum8(std::array::from_fn(|i| sums[i / R][i % R]));
            return std::array::from_fn(|q| std::array::from_fn(|r| lanes[q * R + r]));
        }
        sums.map(|sums| sums.map(|sum| sum256(sum)))
    }

    /// The sum of each of 8 vectors' 8 lanes: two levels of interleaving
    /// pairs of vectors and adding the two interleavings leave each
    /// vector's two halves' sums side by side in the two 128-bit lanes,
    /// which one addition of the lanes swapped finishes: 15 instructions
    /// of one micro-operation each, where one sum at a time takes 6 each.
    /// (Two levels of `vphaddd`, 9 instructions, decode to about as many
    /// micro-operations, all on the shuffle units: batches on GloVe's
    /// 399,000 x 50 took 0 to 6% longer with them, one thread, AVX2.)
    #[target_feature(enable = "avx2")]
    pub(super) fn sum8(v: [__m256i; 8]) -> [i32; 8] {
        let mut lanes = [0i32; 8];
        // SAFETY: 32 bytes into 8 i32s; the CPU has AVX2 (this function's
        // own promise).
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum8_lanes(v)) };
        lanes
    }

    /// `sum8`, left in a register: lane `i` the sum of `v[i]`. Inlined
    /// where AVX2 is enabled (`run_avx2`).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    unsafe fn sum8_lanes(v: [__m256i; 8]) -> __m256i {
        // SAFETY: the CPU has AVX2, as the caller promises.
        unsafe {
            // Of vectors `i` and `i + 1`, in each half: `i`'s lanes 0 + 2,
            // `i + 1`'s 0 + 2, `i`'s 1 + 3, `i + 1`'s 1 + 3.
            let pairs = |i: usize| {
                let (x, y) = (v[i], v[i + 1]);
                _mm256_add_epi32(_mm256_unpacklo_epi32(x, y), _mm256_unpackhi_epi32(x, y))
            };
            // Of vectors `i` to `i + 3`, in each half: each one's sum over
            // the half, in order.
            let quads =
                |a: __m256i, b: __m256i| _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
            let (a, b) = (quads(pairs(0), pairs(2)), quads(pairs(4), pairs(6)));
            let low = _mm256_permute2x128_si256::<0x20>(a, b);
            let high = _mm256_permute2x128_si256::<0x31>(a, b);
            _mm256_add_epi32(low, high)
        }
    }

    /// `Lanes::rules_out_run` on AVX2: for each `LANES` rows of `rows`, the
    /// products of the rows (`dims` codes each, row `r` from
    /// `bytes[r * dims..]`) with the query's `signs` (its codes' sum
    /// `sum`), as `dots_avx2` sums them, then the bound of
    /// `Bounds::nearest`, operation for operation, a row in each lane;
    /// `terms` are the rows' terms (`Lanes::terms`).
    ///
    /// # Safety
    /// The CPU must have AVX2; rows must have at least one value (`dims`),
    /// the query must hold `dims` rounded up to 32 values and `bytes` as
    /// many from each of the rows' starts; every term
    /// must have a value for each of the rows (the multiples, `terms[4]`,
    /// where `multiples` is set: they are read only then).
    ///
    /// Always inlined, into the scan compiled for AVX2
    /// (`View::scan_coded_for`), whose instructions the intrinsics then
    /// take. A call covers a run of rows, not `LANES` of them: called per
    /// `LANES` rows, with the query's terms broadcast afresh each time and
    /// the metric's shape matched, the bound cost more than the products.
    #[inline(always)]
    pub(super) unsafe fn rules_out_run_avx2(
        (bytes, rows, dims, multiples): (&[u8], Range<usize>, usize, bool),
        (signs, sum): (&[i8], i32),
        terms: [&[f32]; super::ROW_TERMS],
        query: super::QueryTerms,
        threshold: f32,
        (ahead, undecided): (impl FnMut(usize), impl FnMut(usize, u32) -> f32),
    ) {
        // SAFETY: the CPU has AVX2, as the caller promises.
        let decide = Rule { threshold: unsafe { _mm256_set1_ps(threshold) }, undecided };
        // SAFETY: as the caller promises.
        unsafe { nearest_run_avx2(((bytes, rows, dims, multiples), (signs, sum), terms, query, (ahead, decide))) }
    }

    /// What `run_avx2` does with each `LANES` rows' bounds: a trait's
    /// method, always inlined into the loop, where a closure was called out
    /// of line for every 8 rows (a quarter of a lone search's samples of
    /// 400,000 x 50 fell in it).
    trait Decide {
        /// `nearest` holds the bounds of the `LANES` rows from `row`.
        ///
        /// # Safety
        /// The CPU must have AVX2.
        unsafe fn decide(&mut self, row: usize, nearest: __m256);
    }

    /// `rules_out_run_avx2`'s: the rows whose bound is above `threshold`
    /// (in every lane) are ruled out, and `undecided` hears of the rest.
    struct Rule<U> {
        threshold: __m256,
        undecided: U,
    }

    impl<U: FnMut(usize, u32) -> f32> Decide for Rule<U> {
        #[inline(always)]
        unsafe fn decide(&mut self, row: usize, nearest: __m256) {
            // SAFETY: the CPU has AVX2, as the caller promises.
            unsafe {
                let ruled = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(nearest, self.threshold)) as u32;
                if ruled != (1 << super::LANES) - 1 {
                    self.threshold = _mm256_set1_ps((self.undecided)(row, ruled));
                }
            }
        }
    }

    /// `keys_run_avx2`'s: each row's bound handed to the closure.
    struct Keys<K>(K);

    impl<K: FnMut(usize, [f32; super::LANES])> Decide for Keys<K> {
        #[inline(always)]
        unsafe fn decide(&mut self, row: usize, nearest: __m256) {
            let mut lanes = [0f32; super::LANES];
            // SAFETY: 8 f32s into 8; the CPU has AVX2, as the caller promises.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), nearest) };
            (self.0)(row, lanes);
        }
    }

    /// `Lanes::keys_run` on AVX2: `rules_out_run_avx2`'s bound of each
    /// `LANES` rows, handed to `keys(row, bounds)` (the bound of row
    /// `row + r` in `bounds[r]`) instead of compared with a threshold.
    ///
    /// # Safety
    /// As `rules_out_run_avx2`.
    ///
    /// Compiled for AVX2 itself, not only inlined into a caller that is:
    /// the ordered search (`View::search_in_order`) that calls it is
    /// compiled for any x86-64, and there, inlined, every intrinsic was a
    /// call of its own: a lone search of scikit-learn's digits (1,597 x
    /// 64) took 0.22 to 0.31 ms over HTTP, where it takes 0.08 to 0.19.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn keys_run_avx2(
        (bytes, rows, dims, multiples): (&[u8], Range<usize>, usize, bool),
        (signs, sum): (&[i8], i32),
        terms: [&[f32]; super::ROW_TERMS],
        query: super::QueryTerms,
        (ahead, keys): (impl FnMut(usize), impl FnMut(usize, [f32; super::LANES])),
    ) {
        let decide = Keys(keys);
        // SAFETY: as the caller promises.
        unsafe { nearest_run_avx2(((bytes, rows, dims, multiples), (signs, sum), terms, query, (ahead, decide))) }
    }

    /// `run_avx2` for the query's shape (`shaped_run_avx2` for the rest).
    ///
    /// # Safety
    /// As `rules_out_run_avx2`.
    #[inline(always)]
    unsafe fn nearest_run_avx2(run: Run<'_, impl FnMut(usize), impl Decide>) {
        let (_, _, _, query, _) = run;
        // SAFETY: as the caller promises.
        unsafe {
            match query.shape {
                super::Shape::Cosine => shaped_run_avx2::<COSINE>(run),
                super::Shape::Ip => shaped_run_avx2::<IP>(run),
                super::Shape::L2 => shaped_run_avx2::<L2>(run),
            }
        }
    }

    /// `run_avx2` of `SHAPE` for the rows' length and whether they have
    /// multiples of the offset.
    ///
    /// # Safety
    /// As `rules_out_run_avx2`.
    #[inline(always)]
    unsafe fn shaped_run_avx2<const SHAPE: u8>(run: Run<'_, impl FnMut(usize), impl Decide>) {
        let ((_, _, dims, multiples), ..) = run;
        // SAFETY: as the caller promises.
        unsafe {
            match (dims >= ROW_BY_ROW_DIMS_MIN, multiples) {
                (false, false) => run_avx2::<SHAPE, false, false>(run),
                (true, false) => run_avx2::<SHAPE, true, false>(run),
                (false, true) => run_avx2::<SHAPE, false, true>(run),
                (true, true) => run_avx2::<SHAPE, true, true>(run),
            }
        }
    }

    /// Rows of at least this many dimensions are multiplied a row at a time
    /// (`run_avx2`'s `ROW_BY_ROW`), each one's blocks in the order they lie
    /// in memory; shorter ones a block of each of the `LANES` rows at a
    /// time, each block of the query loaded once for all of them. A lone
    /// search of 100,000 x 768 on one thread took 5.2 to 5.8 ms row by row
    /// and 6.7 to 9.2 ms block by block (eight streams through memory, not
    /// one); one of 400,000 x 50 took 1.7 to 1.9 ms block by block and 2.1
    /// to 2.3 row by row, and a batch of 32 0.87 to 1.02 ms a query
    /// against 1.04 to 1.15 (`cargo bench --bench exact`, in one run).
    const ROW_BY_ROW_DIMS_MIN: usize = 256;

    /// Groups of `LANES` rows whose products `run_avx2` sums before it
    /// bounds any of them. Each group's bound waits on its products through
    /// a chain of some twenty dependent instructions (the sums' additions
    /// across lanes, the conversion, the bound's arithmetic, the compare):
    /// taken apart, the products of the groups ahead fill that wait. On
    /// GloVe's 400,000 x 50 on one thread (AVX2), batches of 8 took 0.594
    /// ms a query where they took 0.663, and of 32 0.556 where 0.635;
    /// lone searches 0.83 and 0.81, within noise (a bench of
    /// `Scanner::search`, builds taken in turn).
    const GROUPS_AHEAD: usize = 16;

    /// `Shape`s as `run_avx2`'s parameter: one loop compiled for each.
    pub(super) const COSINE: u8 = 0;
    pub(super) const IP: u8 = 1;
    pub(super) const L2: u8 = 2;

    /// What `run_avx2` takes: `rules_out_run_avx2`'s arguments but the
    /// threshold, and what to do with each `LANES` rows' bounds.
    type Run<'a, A, D> = (
        (&'a [u8], Range<usize>, usize, bool),
        (&'a [i8], i32),
        [&'a [f32]; super::ROW_TERMS],
        super::QueryTerms,
        (A, D),
    );

    /// The bound of each `LANES` rows of the run, for the query's shape
    /// `SHAPE`, handed to `decide(row, bounds)`: the rows' products summed
    /// `ROW_BY_ROW` or a block of every row at a time
    /// (`ROW_BY_ROW_DIMS_MIN`), each row's multiple of the offset read
    /// where the rows have `MULTIPLES` (else 1: `t_q` as it is); the
    /// products of `GROUPS_AHEAD` groups first, then their bounds in order.
    ///
    /// # Safety
    /// As `rules_out_run_avx2`.
    #[inline(always)]
    unsafe fn run_avx2<const SHAPE: u8, const ROW_BY_ROW: bool, const MULTIPLES: bool>(
        ((bytes, rows, dims, _), (signs, sum), terms, query, (mut ahead, mut decide)): Run<
            '_,
            impl FnMut(usize),
            impl Decide,
        >,
    ) {
        // SAFETY: the CPU has AVX2, as the caller promises.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            // The rows' offset of 128 added 128 sum(d).
            let offset = _mm256_set1_epi32(128 * sum);
            let query_lanes = QueryLanes::of(&[query; super::LANES]);
            for first in rows.clone().step_by(super::LANES * GROUPS_AHEAD) {
                let groups = (first..(first + super::LANES * GROUPS_AHEAD).min(rows.end)).step_by(super::LANES);
                let mut dots = [_mm256_setzero_si256(); GROUPS_AHEAD];
                for (dots, row) in dots.iter_mut().zip(groups.clone()) {
                    ahead(row);
                    let start = row * dims;
                    let mut sums = [_mm256_setzero_si256(); super::LANES];
                    // Both in bounds, as the caller promises.
                    let query_at = |at: usize| _mm256_loadu_si256(signs.as_ptr().add(at).cast());
                    let product = |at: usize, r: usize, q| {
                        let x = _mm256_loadu_si256(bytes.as_ptr().add(start + r * dims + at).cast());
                        _mm256_madd_epi16(_mm256_maddubs_epi16(x, q), ones)
                    };
                    if ROW_BY_ROW {
                        // A row's blocks in two sums, of the even and the
                        // odd ones: two chains of additions half as long.
                        for (r, sum) in sums.iter_mut().enumerate() {
                            let mut halves = [_mm256_setzero_si256(); 2];
                            for at in (0..dims).step_by(64) {
                                halves[0] = _mm256_add_epi32(halves[0], product(at, r, query_at(at)));
                                if at + 32 < dims {
                                    halves[1] = _mm256_add_epi32(halves[1], product(at + 32, r, query_at(at + 32)));
                                }
                            }
                            *sum = _mm256_add_epi32(halves[0], halves[1]);
                        }
                    } else {
                        // The first block's products start the sums: an
                        // addition to zero a row fewer (rows have at least
                        // one value).
                        let q = query_at(0);
                        for (r, sum) in sums.iter_mut().enumerate() {
                            *sum = product(0, r, q);
                        }
                        for at in (32..dims).step_by(32) {
                            let q = query_at(at);
                            for (r, sum) in sums.iter_mut().enumerate() {
                                *sum = _mm256_add_epi32(*sum, product(at, r, q));
                            }
                        }
                    }
                    *dots = _mm256_sub_epi32(sum8_lanes(sums), offset);
                }
                for (&dots, row) in dots.iter().zip(groups) {
                    // 8 f32s each, as the caller promises.
                    let load = |terms: &[f32]| _mm256_loadu_ps(terms.as_ptr().add(row));
                    let [scales, residuals, centred, offsets, multiples, norms, row_scales] = terms;
                    let rows = [scales, residuals, centred, offsets, norms, row_scales].map(load);
                    let multiples = MULTIPLES.then(|| load(multiples));
                    decide.decide(row, nearest_in_lanes::<SHAPE>(dots, (rows, multiples), &query_lanes));
                }
            }
        }
    }

    /// The queries' side of the bound in lanes (`nearest_in_lanes`): one
    /// query's terms in every lane (`run_avx2`), or a query in each lane
    /// (`query_lanes`).
    pub(super) struct QueryLanes {
        pub scale: __m256,
        pub offset_scale: __m256,
        pub offset_product: __m256,
        pub per_residual: __m256,
        pub per_centred: __m256,
        pub per_norm: __m256,
        pub absolute: __m256,
        pub query_scale: __m256,
        pub query_squared: __m256,
        pub shrink: __m256,
    }

    impl QueryLanes {
        /// The terms of query `j` of `terms` in lane `j` of each field.
        ///
        /// # Safety
        /// The CPU must have AVX.
        #[inline(always)]
        pub(super) unsafe fn of(terms: &[super::QueryTerms; super::LANES]) -> QueryLanes {
            let lanes = |term: fn(&super::QueryTerms) -> f32| -> [f32; super::LANES] {
                std::array::from_fn(|j| term(&terms[j]))
            };
            // SAFETY: 8 f32s from 8 each; the CPU has AVX, as the caller
            // promises.
            unsafe {
                QueryLanes {
                    scale: _mm256_loadu_ps(lanes(|t| t.scale).as_ptr()),
                    offset_scale: _mm256_loadu_ps(lanes(|t| t.offset_scale).as_ptr()),
                    offset_product: _mm256_loadu_ps(lanes(|t| t.offset_product).as_ptr()),
                    per_residual: _mm256_loadu_ps(lanes(|t| t.per_residual).as_ptr()),
                    per_centred: _mm256_loadu_ps(lanes(|t| t.per_centred).as_ptr()),
                    per_norm: _mm256_loadu_ps(lanes(|t| t.per_norm).as_ptr()),
                    absolute: _mm256_loadu_ps(lanes(|t| t.absolute).as_ptr()),
                    query_scale: _mm256_loadu_ps(lanes(|t| t.query_scale).as_ptr()),
                    query_squared: _mm256_loadu_ps(lanes(|t| t.query_squared).as_ptr()),
                    shrink: _mm256_loadu_ps(lanes(|t| t.shrink).as_ptr()),
                }
            }
        }
    }

    /// `Bounds::nearest_of` of `SHAPE` in lanes, operation for operation in
    /// the same order, so each lane's is the pair's bound bit for bit:
    /// from the products `dots`, the rows' scales, residual bounds, `|x -
    /// κμ|`, `μ . (x - κμ)`, norm bounds and (cosine) scales, their
    /// multiples of the offset where they have them (1 otherwise: the
    /// query's `q . μ` as it is), and the queries' terms. Both kernels with
    /// lanes take it: a row in each lane (`run_avx2`) and a query in each
    /// (`query_lanes`).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    pub(super) unsafe fn nearest_in_lanes<const SHAPE: u8>(
        dots: __m256i,
        ([scales, residuals, centred, offsets, norms, row_scales], multiples): ([__m256; 6], Option<__m256>),
        q: &QueryLanes,
    ) -> __m256 {
        // SAFETY: the CPU has AVX2, as the caller promises.
        unsafe {
            let all = _mm256_set1_ps;
            let magnitude = |x| _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
            let offsets = _mm256_mul_ps(offsets, q.offset_scale);
            let centre = multiples.map_or(q.offset_product, |multiples| _mm256_mul_ps(q.offset_product, multiples));
            let product = _mm256_mul_ps(_mm256_mul_ps(scales, _mm256_cvtepi32_ps(dots)), q.scale);
            let estimate = _mm256_add_ps(_mm256_add_ps(product, centre), offsets);
            let off = _mm256_add_ps(
                _mm256_add_ps(_mm256_mul_ps(q.per_residual, residuals), _mm256_mul_ps(q.per_centred, centred)),
                _mm256_mul_ps(q.per_norm, norms),
            );
            let spread = _mm256_add_ps(_mm256_add_ps(magnitude(product), magnitude(offsets)), off);
            let margin = _mm256_mul_ps(spread, all(super::MARGIN));
            let ceiling = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(estimate, off), margin), q.absolute);
            nearest_of_ceiling::<SHAPE>(ceiling, (norms, row_scales), q)
        }
    }

    /// The end of `Bounds::nearest_of` in lanes: the nearest distance a
    /// `ceiling` on the product allows, for `SHAPE`, the rows' norm bounds
    /// (l2) and scales (cosine), and the queries' terms.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    pub(super) unsafe fn nearest_of_ceiling<const SHAPE: u8>(
        ceiling: __m256,
        (norms, row_scales): (__m256, __m256),
        q: &QueryLanes,
    ) -> __m256 {
        // SAFETY: the CPU has AVX2, as the caller promises.
        unsafe {
            let all = _mm256_set1_ps;
            let magnitude = |x| _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
            let negated = |x| _mm256_xor_ps(x, all(-0.0));
            match SHAPE {
                COSINE => negated(_mm256_mul_ps(_mm256_mul_ps(ceiling, row_scales), q.query_scale)),
                IP => negated(ceiling),
                _ => {
                    let squares = _mm256_add_ps(q.query_squared, _mm256_mul_ps(norms, norms));
                    let sum = _mm256_sub_ps(squares, _mm256_mul_ps(all(2.0), ceiling));
                    let spread = _mm256_add_ps(squares, _mm256_mul_ps(all(2.0), magnitude(ceiling)));
                    let floor = _mm256_sub_ps(sum, _mm256_mul_ps(spread, all(super::L2_MARGIN)));
                    _mm256_sub_ps(_mm256_mul_ps(floor, q.shrink), q.absolute)
                }
            }
        }
    }

    /// `dots_vnni512` on 32-byte blocks without VNNI: `vpmaddubsw` multiplies
    /// each stored byte (`c_i + 128`, at most 255) by the query's code (at
    /// most 63 in magnitude, `Kernel::query_levels`), two products to an
    /// i16 (at most 32,130, short of saturating), widened by `vpmaddwd`.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `dots_vnni512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dots_avx2<const Q: usize, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[i8]; Q],
        dims: usize,
    ) -> [[i32; R]; Q] {
        let ones = _mm256_set1_epi16(1);
        let mut sums = [[_mm256_setzero_si256(); R]; Q];
        for at in (0..dims).step_by(32) {
            let mut x = [_mm256_setzero_si256(); R];
            for (x, start) in x.iter_mut().zip(starts) {
                // SAFETY: in bounds, as the caller promises.
                *x = unsafe { _mm256_loadu_si256(bytes.as_ptr().add(start + at).cast()) };
            }
            for (sums, query) in sums.iter_mut().zip(queries) {
                // SAFETY: in bounds, as the caller promises.
                let q = unsafe { _mm256_loadu_si256(query.as_ptr().add(at).cast()) };
                for (sum, &x) in sums.iter_mut().zip(&x) {
                    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(_mm256_maddubs_epi16(x, q), ones));
                }
            }
        }
        sums_of(sums)
    }

    /// The sum of four u64 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn sum_of(v: __m256i) -> u64 {
        let v = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        (_mm_cvtsi128_si64(v) + _mm_extract_epi64::<1>(v)) as u64
    }

    /// The sum of a vector's eight i32 lanes.
    #[target_feature(enable = "avx2")]
    pub(super) fn sum256(v: __m256i) -> i32 {
        let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
        _mm_cvtsi128_si32(v)
    }

    /// The 64 stored codes at `bytes[row..]` and the query's at
    /// `query[at..]`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; both must hold 64 bytes there.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pair_512(bytes: &[u8], row: usize, query: &[u8], at: usize) -> (__m512i, __m512i) {
        // SAFETY: in bounds, as the caller promises.
        unsafe {
            (_mm512_loadu_si512(bytes.as_ptr().add(row).cast()), _mm512_loadu_si512(query.as_ptr().add(at).cast()))
        }
    }

    /// `pair_512` of 32 codes.
    ///
    /// # Safety
    /// The CPU must have AVX2; both must hold 32 bytes there.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pair_256(bytes: &[u8], row: usize, query: &[u8], at: usize) -> (__m256i, __m256i) {
        // SAFETY: in bounds, as the caller promises.
        unsafe {
            (_mm256_loadu_si256(bytes.as_ptr().add(row).cast()), _mm256_loadu_si256(query.as_ptr().add(at).cast()))
        }
    }

    /// A table of 256 bytes as four registers, for `look_up`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn registers(table: &[u8; 256]) -> [__m512i; 4] {
        // SAFETY: 4 x 64 bytes.
        std::array::from_fn(|i| unsafe { _mm512_loadu_si512(table.as_ptr().add(64 * i).cast()) })
    }

    /// `table`'s byte for each byte of `index`: `vpermi2b` looks up the low
    /// 7 bits in each half of the table, and `high` (the indexes' top bits)
    /// picks the half.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) fn look_up(table: &[__m512i; 4], index: __m512i, high: __mmask64) -> __m512i {
        let below = _mm512_permutex2var_epi8(table[0], index, table[1]);
        let above = _mm512_permutex2var_epi8(table[2], index, table[3]);
        _mm512_mask_blend_epi8(high, below, above)
    }
}

#[cfg(test)]
mod tests {
    use wide::f64x4;

    use super::{
        code_eight, encode, encode_centred, offset_multiple, offset_of, stored, Codes, Grid, NormAbove, QueryCode,
        CHUNK, DIRECTIONS, DIRECTIONS_DIMS_MIN, OFFSET_MULTIPLE_MAX, OFFSET_SAMPLE_ROWS, OFFSET_TILE,
    };

    /// The next of Marsaglia's xorshift numbers, in `seed`.
    fn xorshift(seed: &mut u64) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
    }

    /// Values from -0.5 to 0.5 in steps of 2^-24, from xorshift numbers
    /// seeded with `seed`.
    fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            xorshift(&mut seed);
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        }
    }

    /// A run's shares to prefetch are its rows' codes in order, whole cache
    /// lines each but the last, at most as many as asked for; rows past
    /// the last give none.
    #[test]
    fn shares_are_the_rows_codes_in_whole_lines() {
        let dims = 100;
        let vectors: Vec<f32> = (0..37 * dims).map(|i| (i % 17) as f32 - 8.0).collect();
        let codes = Codes::of(dims, Grid::Fitted, &vectors).unwrap();
        let stride = codes.stride();
        for shares in 1..70 {
            let parts: Vec<&[u8]> = codes.shares(5..29, shares).collect();
            assert!(parts.len() <= shares, "{} parts for {shares}", parts.len());
            assert!(parts.iter().rev().skip(1).all(|part| part.len() % 64 == 0), "{shares}");
            assert_eq!(parts.concat(), &codes.bytes()[5 * stride..29 * stride], "{shares}");
        }
        let past = codes.bytes().len().div_ceil(stride);
        assert_eq!(codes.shares(past..past + 8, 4).count(), 0);
    }

    /// The rounding without a library call is `f64::round` at every half
    /// and beside it, in every lane, its integer is the one `as` gives, and
    /// its residual is exact; values beyond the levels are clamped.
    #[test]
    fn rounding_is_the_library_s_at_halves_and_beside_them() {
        let (one, top) = (f64x4::splat(1.0), f64x4::splat(127.0));
        let eight = |x: [f64; 8]| [f64x4::from([x[0], x[1], x[2], x[3]]), f64x4::from([x[4], x[5], x[6], x[7]])];
        for twice in -254i32..=254 {
            let half = f64::from(twice) / 2.0;
            for x in [half, half.next_up(), half.next_down(), half + 1e-9, half - 1e-9] {
                if x.abs() <= 127.0 {
                    let values = [x, -x, 0.0, x, -x, x, -0.0, -x];
                    let mut codes = [0i8; 8];
                    let residuals = code_eight(eight(values), one, top, &mut codes);
                    let residuals = residuals.map(|r| r.to_array()).concat();
                    assert_eq!(codes, values.map(|x| x.round() as i8), "{x}");
                    assert_eq!(residuals, values.map(|x| x - x.round()), "{x}");
                }
            }
        }
        let mut codes = [0i8; 8];
        code_eight(eight([127.4, -127.6, 300.0, -1e9, 126.5, -126.5, 0.49, -0.5]), one, top, &mut codes);
        assert_eq!(codes, [127, -127, 127, -127, 127, -127, 0, -1]);
        // AVX2's queries take 63 levels.
        code_eight(eight([63.4, -63.6, 64.0, -1e9, 62.5, -62.5, 62.49, -0.5]), one, f64x4::splat(63.0), &mut codes);
        assert_eq!(codes, [63, -63, 63, -63, 63, -63, 62, -1]);
    }

    /// Each code is its value over the scale rounded, and the residual
    /// bound is not below the residuals' norm, for lengths across chunks.
    #[test]
    fn codes_are_values_over_the_scale_rounded_and_the_bound_holds() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for n in [1usize, 7, 8, 9, CHUNK - 1, CHUNK, CHUNK + 1, 768, 1000] {
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    xorshift(&mut seed);
                    (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .collect();
            let mut codes = vec![0i8; n];
            let encoded = encode(&v, Grid::Fitted, |at, c| codes[at..at + c.len()].copy_from_slice(c));
            let scale = f64::from(encoded.scale);
            let mut squares = 0.0;
            for (&x, &code) in v.iter().zip(&codes) {
                assert_eq!(code, (f64::from(x) / scale).round().clamp(-127.0, 127.0) as i8, "{x} of {n}");
                squares += (f64::from(x) - scale * f64::from(code)).powi(2);
            }
            assert_eq!(encoded.sum, codes.iter().map(|&c| i32::from(c)).sum::<i32>());
            assert!(f64::from(encoded.residual) >= squares.sqrt(), "{n} values");
        }
    }

    /// Each centred code is its value's difference from the offset's
    /// multiple over the scale rounded, the residual bound is not below the
    /// exact residual's norm, worked out without rounding (each difference
    /// and its error kept apart), and `μ . y` is within its stated bound of
    /// `μ . (x - κμ)`, whatever the offset's magnitude against the values',
    /// for the multiple `offset_multiple` chooses and others.
    #[test]
    fn centred_residual_bounds_hold_for_offsets_of_any_magnitude() {
        let mut next = uniform(0x853c_49e6_748f_ea9bu64);
        let cases =
            [(1.0f32, 0.0f32, 0.0f32), (1.0, 3.0, 0.0), (1e-30, 1.0, 0.0), (1e30, 1e-30, 0.0), (1e-3, 1e3, 0.0)];
        // Rows along the offset, at magnitudes from 0 to past `OFFSET_MULTIPLE_MAX`.
        let along = [(0.1, 1.0, 2.5), (1e-3, 3.0, 0.3), (1.0, 1.0, -1.5), (0.5, 1e30, 7.9), (1.0, 1e-3, 20.0)];
        for n in [1usize, 50, 64, 65, 768] {
            for (value, offset, times) in cases.into_iter().chain(along) {
                let mu: Vec<f32> = (0..n).map(|_| offset * next()).collect();
                let v: Vec<f32> = mu.iter().map(|&m| value * next() + times * m).collect();
                let squared = mu.iter().map(|&m| f64::from(m) * f64::from(m)).sum();
                for multiple in [offset_multiple(&v, &mu, squared), 1.0, 0.0, -2.5, OFFSET_MULTIPLE_MAX as f32] {
                    centred_code_holds(
                        &v,
                        (&mu, multiple),
                        format!("{n} values of {value} + {times} x an offset of {offset}, from {multiple} x it"),
                    );
                }
            }
        }
        // The multiple chosen is the nearest, clamped.
        let mu = [3.0f32, -4.0];
        let multiple = |v: [f32; 2]| offset_multiple(&v, &mu, 25.0);
        assert_eq!(multiple([6.0, -8.0]), 2.0);
        assert_eq!(multiple([4.0, 3.0]), 0.0);
        assert_eq!(multiple([-300.0, 400.0]), -OFFSET_MULTIPLE_MAX as f32);
        assert_eq!(multiple([f32::MAX, -f32::MAX]), OFFSET_MULTIPLE_MAX as f32);
        assert_eq!(offset_multiple(&[1.0, 2.0], &[0.0, 0.0], 0.0), 0.0);
    }

    /// `a - b` as the rounded difference and what the rounding lost.
    fn two_difference(a: f64, b: f64) -> (f64, f64) {
        let d = a - b;
        let bv = a - d;
        (d, (a - (d + bv)) + (bv - b))
    }

    /// The code of a query's residual (`QueryCode::encode_residual`): each
    /// code is the residual over its scale rounded, the codes' sum is
    /// theirs, and `r'_q` is not below `|(q - λμ) - b d - b' d'|` worked
    /// out without rounding (each difference and its error kept apart), on
    /// both kernels' levels, for offsets and multiples of any magnitude,
    /// residuals of zero among them.
    #[test]
    fn the_code_of_a_query_s_residual_bounds_what_is_left() {
        let mut next = uniform(0x9e37_79b9_7f4a_7c15u64);
        let cases = [(1.0f32, 0.0f32, 0.0f32), (1.0, 3.0, 0.0), (1e-30, 1.0, 0.0), (1e30, 1e-30, 0.0), (0.1, 1.0, 2.5)];
        for n in [1usize, 7, 8, 9, 50, 64, 65, 768] {
            for (value, offset, times) in cases {
                let mu: Vec<f32> = (0..n).map(|_| offset * next()).collect();
                let mut v: Vec<f32> = mu.iter().map(|&m| value * next() + times * m).collect();
                if offset == 0.0 && value == 1.0 {
                    // Integers up to 63, 63 among them: on AVX2's levels
                    // the first code leaves nothing.
                    v.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 127) as f32 - 63.0);
                    v[0] = 63.0;
                }
                let squared = mu.iter().map(|&m| f64::from(m) * f64::from(m)).sum();
                for multiple in [offset_multiple(&v, &mu, squared), 0.0, -2.5] {
                    for levels in [63i8, 127] {
                        let what = format!(
                            "{n} values of {value} + {times} x {offset}, from {multiple} x it, {levels} levels"
                        );
                        let mut d = vec![0i8; n];
                        let centred = encode_centred(&v, (&mu, multiple), (levels, &[]), |at, c| {
                            d[at..at + c.len()].copy_from_slice(c)
                        });
                        let mut fine = QueryCode::default();
                        fine.encode_residual(&v, (&mu, multiple), (centred.code.scale, &d, centred.norm), levels);
                        let (b, b2) = (f64::from(centred.code.scale), f64::from(fine.scale));
                        let mut squares = 0.0f64;
                        for (i, (&x, &m)) in v.iter().zip(&mu).enumerate() {
                            let (y, lost) = two_difference(f64::from(x), f64::from(multiple) * f64::from(m));
                            let (f, lost_f) = two_difference(y, b * f64::from(d[i]));
                            let code = if b2 == 0.0 {
                                0.0
                            } else {
                                (f / b2).round().clamp(-f64::from(levels), f64::from(levels))
                            };
                            assert_eq!(fine.signs[i], code as i8, "{what}: {f} on {b2}");
                            let (e, lost_e) = two_difference(f, b2 * code);
                            squares += (e + (lost + lost_f + lost_e)).powi(2);
                        }
                        assert!(fine.signs[n..].iter().all(|&d| d == 0), "{what}: zeros past the last");
                        assert_eq!(fine.sum, fine.signs.iter().map(|&d| i32::from(d)).sum::<i32>(), "{what}");
                        assert!(f64::from(fine.residual) >= squares.sqrt(), "{what}");
                        // What is left is at most what the first code left
                        // (each rounded up once).
                        let first = f64::from(centred.code.residual) * (1.0 + 2f64.powi(-20));
                        assert!(f64::from(fine.residual) <= first, "{what}");
                        if levels == 63 && offset == 0.0 && value == 1.0 && multiple == 0.0 {
                            assert_eq!((fine.scale, fine.sum), (0.0, 0), "{what}: nothing left to code");
                        }
                    }
                }
            }
        }
    }

    /// `a + b` as the rounded sum and what the rounding lost.
    fn two_sum(a: f64, b: f64) -> (f64, f64) {
        let s = a + b;
        let bv = s - a;
        (s, (a - (s - bv)) + (b - bv))
    }

    /// Rows about a common part that vary mostly along three directions
    /// keep their main directions (orthonormal), random rows none; and for
    /// every row and query, at magnitudes from 1e-40 to 1e30 and on both
    /// kernels' levels, `z . e` (the query's codes times the row's
    /// residual, worked out without rounding: each difference, sum and
    /// product's error kept apart) is within `H r_x + B 2^-50 n_x + 2^-150
    /// sum |β_j|` of `sum β_j w_j`, as the second look along them takes it.
    #[test]
    fn the_rows_products_with_their_main_directions_bound_what_they_take_apart() {
        let mut next = uniform(0xbb67_ae85_84ca_a73bu64);
        for dims in [16usize, 17, 50, 192, 768] {
            let common: Vec<f32> = (0..dims).map(|_| 3.0 + next()).collect();
            let shape: Vec<Vec<f32>> = (0..3).map(|_| (0..dims).map(|_| next()).collect()).collect();
            let random: Vec<f32> = (0..200 * dims).map(|_| next()).collect();
            let mut drawn = |t: f32, by: f32| -> Vec<f32> {
                let w: Vec<f32> = (0..3).map(|_| 2.0 * next()).collect();
                (0..dims)
                    .map(|i| t * (common[i] + (0..3).map(|j| w[j] * shape[j][i]).sum::<f32>()) + by * next())
                    .collect()
            };
            let times = [1.0f32, 0.5, 2.0, 0.7, 1e-30, 1e30, 1e-40, 1.5, 0.0, 3.0];
            let rows: Vec<f32> =
                (0..200).flat_map(|n| drawn(times[n % times.len()], [0.0, 1e-3, 0.03][n % 3])).collect();
            let codes = Codes::of(dims, Grid::Fitted, &rows).expect("codes");
            assert!(codes.has_directions(), "{dims} dims: rows in three directions keep them");
            for (j, u) in codes.directions.chunks_exact(dims).enumerate() {
                for (k, v) in codes.directions.chunks_exact(dims).enumerate() {
                    let product: f64 = u.iter().zip(v).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                    let want = if j == k { 1.0 } else { 0.0 };
                    assert!((product - want).abs() < 1e-5, "{dims} dims: directions {j} and {k}: {product}");
                }
            }
            assert!(!Codes::of(dims, Grid::Fitted, &random).expect("codes").has_directions(), "{dims} dims: random");
            if dims == DIRECTIONS_DIMS_MIN {
                // One dimension fewer keeps none, however the rows lie.
                let fewer: Vec<f32> = rows.chunks_exact(dims).flat_map(|row| row[1..].to_vec()).collect();
                let codes = Codes::of(dims - 1, Grid::Fitted, &fewer).expect("codes");
                assert!(!codes.has_directions(), "{} dims: fewer than the least", dims - 1);
            }
            let mut looked = 0;
            for (q, t) in [1.0f32, 0.3, 1e-30, 1e30, 2.0, 1e-40].into_iter().enumerate() {
                let query = drawn(t, 1e-3);
                for levels in [63i8, 127] {
                    let mut code = QueryCode::default();
                    code.encode_on(&query, levels, &codes);
                    let along = code.along;
                    if !along.kept {
                        continue;
                    }
                    looked += 1;
                    let fine = code.fine.as_deref().expect("a code of the residual");
                    let (b, fine_b) = (f64::from(code.scale), f64::from(fine.scale));
                    for row in 0..200 {
                        let (a, kappa) = (f64::from(codes.scales[row]), f64::from(codes.multiple(row)));
                        let x = &rows[row * dims..(row + 1) * dims];
                        let (mut exact, mut lost) = (0.0f64, 0.0f64);
                        for ((i, c), &x) in codes.row(row).enumerate().zip(x) {
                            let (y, y_lost) = two_difference(f64::from(x), kappa * f64::from(codes.offset[i]));
                            let (e, e_lost) = two_difference(y, a * f64::from(c));
                            let (g, g_lost) = two_sum(b * f64::from(code.signs[i]), fine_b * f64::from(fine.signs[i]));
                            let product = g * e;
                            let (sum, sum_lost) = two_sum(exact, product);
                            exact = sum;
                            lost += sum_lost + g.mul_add(e, -product) + g * (y_lost + e_lost) + g_lost * e;
                        }
                        let exact = exact + lost;
                        let taken: f64 =
                            (0..DIRECTIONS).map(|j| f64::from(along.weights[j]) * f64::from(codes.along[row][j])).sum();
                        let (r, n) = (f64::from(codes.residuals[row]), f64::from(codes.centred_norms[row]));
                        let bound = along.per_residual * r + along.per_centred * n + along.absolute;
                        assert!(
                            (exact - taken).abs() <= bound,
                            "{dims} dims, query {q} on {levels} levels, row {row}: z . e = {exact}, taken {taken}, \
                             within {bound}"
                        );
                    }
                }
            }
            assert!(looked >= 6, "{dims} dims: {looked} queries looked along the directions");
        }
    }

    /// Where rows of another kind come after the first 64, the main
    /// directions turn to theirs at a later power of two (`Codes::centre`,
    /// the offset left where it is), and every row's products are then
    /// with the directions kept, as coding it afresh gives them.
    #[test]
    fn the_main_directions_follow_the_rows_and_every_row_is_coded_with_them() {
        let mut next = uniform(0x3c6e_f372_fe94_f82bu64);
        let dims = 48;
        let common: Vec<f32> = (0..dims).map(|_| 3.0 + next()).collect();
        let kinds: Vec<Vec<f32>> = (0..6).map(|_| (0..dims).map(|_| next()).collect()).collect();
        let mut codes = Codes::new(dims, Grid::Fitted).expect("codes");
        let (mut vectors, mut first) = (Vec::new(), Vec::new());
        for n in 0..512 {
            let kind = if n < 64 { &kinds[..3] } else { &kinds[3..] };
            let w: Vec<f32> = (0..3).map(|_| 2.0 * next()).collect();
            let v: Vec<f32> =
                (0..dims).map(|i| common[i] + (0..3).map(|j| w[j] * kind[j][i]).sum::<f32>() + 1e-3 * next()).collect();
            vectors.extend_from_slice(&v);
            codes.push(&v);
            if codes.wants_centre() {
                codes.centre(&vectors);
            }
            if n == 63 {
                assert!(codes.has_directions(), "the first kind's directions, at 64 rows");
                first = codes.directions.clone();
            }
        }
        let mut overlap = 0.0f64;
        for u in first.chunks_exact(dims) {
            for v in codes.directions.chunks_exact(dims) {
                overlap += u.iter().zip(v).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>().powi(2);
            }
        }
        // 4 where they span the same space; one of the first kind's at most.
        assert!(codes.has_directions() && overlap < 2.0, "the directions turned to the second kind's: {overlap}");
        for (row, v) in vectors.chunks_exact(dims).enumerate() {
            let directions = (127, &codes.directions[..]);
            let centred = encode_centred(v, (&codes.offset, codes.multiple(row)), directions, |_, _| {});
            assert_eq!(codes.along[row], centred.along, "row {row}");
        }
    }

    /// `centred_residual_bounds_hold_for_offsets_of_any_magnitude` for one
    /// vector `v`, its offset `mu` and multiple of it.
    fn centred_code_holds(v: &[f32], (mu, multiple): (&[f32], f32), what: String) {
        let n = v.len();
        // `κ μ_i`, exact in f64.
        let centre: Vec<f64> = mu.iter().map(|&m| f64::from(multiple) * f64::from(m)).collect();
        let mut codes = vec![0i8; n];
        let centred = encode_centred(v, (mu, multiple), (127, &[]), |at, c| codes[at..at + c.len()].copy_from_slice(c));
        let (encoded, norm, offset_product) = (centred.code, centred.norm, centred.offset_product);
        let (mut squares, mut centred) = (0.0f64, 0.0f64);
        for ((&x, &m), &c) in v.iter().zip(&centre).zip(&codes) {
            let (y, lost) = two_difference(f64::from(x), m);
            let (e, lost_e) = two_difference(y, f64::from(encoded.scale) * f64::from(c));
            squares += (e + (lost + lost_e)).powi(2);
            centred += (y + lost).powi(2);
        }
        let scale = f64::from(encoded.scale);
        for ((&x, &m), &c) in v.iter().zip(&centre).zip(&codes) {
            let nearest = ((f64::from(x) - m) / scale).round().clamp(-127.0, 127.0);
            assert_eq!(c, nearest as i8, "{what}: {x} from {m}");
        }
        assert_eq!(encoded.sum, codes.iter().map(|&c| i32::from(c)).sum::<i32>(), "{what}");
        assert!(f64::from(encoded.residual) >= squares.sqrt(), "{what}");
        assert!(f64::from(norm) >= centred.sqrt(), "{what}");
        // `μ . (x - κμ)` from exact products (`mul_add` finds each
        // rounding's error), summed with compensation: off by about
        // 2^-53 of itself, far inside the bound's 2^-24.
        let (mut exact, mut compensation, mut magnitude) = (0.0f64, 0.0f64, 0.0f64);
        for ((&x, &m), &centre) in v.iter().zip(mu).zip(&centre) {
            let (y, lost) = two_difference(f64::from(x), centre);
            let product = f64::from(m) * y;
            for term in [product, f64::from(m).mul_add(y, -product), f64::from(m) * lost] {
                let sum = exact + term;
                compensation += if exact.abs() >= term.abs() { (exact - sum) + term } else { (term - sum) + exact };
                exact = sum;
            }
            magnitude += f64::from(m) * f64::from(m);
        }
        let exact = exact + compensation;
        let t = f64::from(offset_product);
        let bound = t.abs() * 2f64.powi(-24)
            + 2f64.powi(-150)
            + (n + 4) as f64 * 2f64.powi(-52) * magnitude.sqrt() * f64::from(norm)
            + exact.abs() * 2f64.powi(-50);
        assert!((t - exact).abs() <= bound, "{what}: {t} against {exact}");
    }

    /// The offset is each dimension's median over the sampled rows, in
    /// `f32::total_cmp`'s order (-0 below +0), for dimensions across tiles.
    #[test]
    fn the_offset_is_each_dimension_s_median() {
        let mut seed = 0x6a09_e667_f3bc_c909u64;
        for (rows, dims) in [(1usize, 3usize), (7, 1), (OFFSET_SAMPLE_ROWS + 5, OFFSET_TILE + 43)] {
            let vectors: Vec<f32> = (0..rows * dims)
                .map(|i| {
                    xorshift(&mut seed);
                    match i % 5 {
                        0 => 0.0,
                        1 => -0.0,
                        _ => (seed >> 40) as f32 / (1u64 << 20) as f32 - 8.0,
                    }
                })
                .collect();
            let step = rows.div_ceil(OFFSET_SAMPLE_ROWS);
            let offset = offset_of(dims, &vectors, OFFSET_SAMPLE_ROWS);
            for (i, &found) in offset.iter().enumerate() {
                let mut column: Vec<f32> = vectors.chunks(dims).step_by(step).map(|row| row[i]).collect();
                column.sort_by(f32::total_cmp);
                let median = column[column.len() / 2];
                assert_eq!(found.to_bits(), median.to_bits(), "{rows} x {dims}, dimension {i}");
            }
        }
    }

    /// Codes are centred afresh where the rows' median moves them nearer,
    /// and not where it does not: rows near 3 are centred at their first
    /// 64, the same 64 again (the same median) leave the offset as it was,
    /// and three times as many near -5, or then near 20, move it. Every
    /// row's code is then the one its vector has from the offset.
    #[test]
    fn codes_are_centred_again_only_where_the_median_moves_enough() {
        let dims = 50;
        let mut seed = 0x510e_527f_ade6_82d1u64;
        let mut near = |centre: f32| -> Vec<f32> {
            (0..dims)
                .map(|_| {
                    xorshift(&mut seed);
                    centre + (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .collect()
        };
        let mut codes = Codes::new(dims, Grid::Fitted).unwrap();
        let mut vectors = Vec::new();
        let coded_from_the_offset = |codes: &Codes, vectors: &[f32]| {
            for (row, v) in vectors.chunks(dims).enumerate() {
                let mut want = vec![0u8; dims];
                let multiple =
                    if codes.multiples { offset_multiple(v, &codes.offset, codes.offset_squared) } else { 1.0 };
                let centred = encode_centred(v, (&codes.offset, multiple), (127, &codes.directions), |at, c| {
                    want[at..at + c.len()].iter_mut().zip(c).for_each(|(w, &c)| *w = stored(c))
                });
                assert_eq!(codes.multiple(row), multiple, "row {row}");
                assert_eq!(&codes.bytes()[row * codes.stride()..][..dims], &want[..], "row {row}");
                assert_eq!(codes.scale_and_residual(row), (centred.code.scale, centred.code.residual), "row {row}");
                assert_eq!(codes.centred_norms[row], centred.norm, "row {row}");
                assert_eq!(codes.offset_products[row], centred.offset_product, "row {row}");
            }
        };
        let mut grow = |codes: &mut Codes, vectors: &mut Vec<f32>, rows: usize, centre: f32| {
            for _ in 0..rows {
                let v = near(centre);
                codes.push(&v);
                vectors.extend_from_slice(&v);
            }
            assert!(codes.wants_centre(), "{} rows", codes.len());
            let moved = codes.centre(vectors);
            coded_from_the_offset(codes, vectors);
            moved
        };
        assert!(grow(&mut codes, &mut vectors, 64, 3.0), "64 rows near 3, from an offset of 0");
        assert!(codes.offset.iter().all(|&m| (m - 3.0).abs() < 0.25), "{:?}", codes.offset);
        let before = codes.offset.clone();
        for row in 0..64 {
            let v = vectors[row * dims..(row + 1) * dims].to_vec();
            codes.push(&v);
            vectors.extend_from_slice(&v);
        }
        assert!(!codes.centre(&vectors), "the same 64 rows again");
        assert_eq!(codes.offset, before);
        coded_from_the_offset(&codes, &vectors);
        assert!(grow(&mut codes, &mut vectors, 384, -5.0), "three rows in four near -5");
        assert_ne!(codes.offset, before);
        // Past `OFFSET_GLANCE_ROWS`, the offset is taken from the larger sample.
        assert!(grow(&mut codes, &mut vectors, 1536, 20.0), "three rows in four near 20");
        assert!(codes.offset.iter().all(|&m| (m - 20.0).abs() < 0.25), "{:?}", codes.offset);
        assert_eq!(codes.offset, offset_of(dims, &vectors, OFFSET_SAMPLE_ROWS));
        assert_eq!(codes.offset_squared, codes.offset.iter().map(|&m| f64::from(m).powi(2)).sum::<f64>());
    }

    /// `NormAbove` of `p` is never below the norm of `p` itself, and is
    /// close to it where the values are alike.
    #[test]
    fn norms_of_any_p_are_never_below_the_norm_of_p() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            xorshift(&mut seed);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for p in [1.0f32, 1.1, 1.3, 2.5, 2.7, 2.75, 3.0, 4.9, 7.99, 8.0] {
            for n in [1usize, 2, 7, 768, 4096] {
                let alike: Vec<f64> = (0..n).map(|_| next() * 0.5).collect();
                let one: Vec<f64> = (0..n).map(|i| if i == n / 2 { 0.3 } else { 0.0 }).collect();
                let tiny: Vec<f64> = (0..n).map(|_| next() * 1e-30).collect();
                for (values, close) in [(alike, true), (one, false), (tiny, true)] {
                    let exact = values.iter().map(|e| e.powf(f64::from(p))).sum::<f64>().powf(1.0 / f64::from(p));
                    let mut norm = NormAbove::new(p);
                    values.iter().for_each(|&e| norm.add(e));
                    let found = norm.norm();
                    assert!(found >= exact, "p {p}, {n} values: {found} < {exact}");
                    if close && n >= 768 {
                        assert!(found <= exact * 1.005, "p {p}, {n} values alike: {found} against {exact}");
                    }
                }
            }
        }
    }
}
