//! The nearest a row can be in l1, linf, Bray-Curtis or lp distance (`p` a
//! multiple of 1/4 from 1 to 8), from its int8 code: the first pass of
//! those metrics' searches.
//!
//! As for the products (the parent module), a search first reads the codes,
//! a quarter of the rows' bytes, bounds each row's exact f32 distance from
//! below, and scores exactly (with the kernel every other search uses, so
//! the answer is the same bit for bit) only the rows whose bound does not
//! already put them farther than the k-th nearest kept. Here the scales
//! are powers of two (`Grid::PowersOfTwo`): one code of the query per scale
//! then serves every row of that scale, and the distance between two codes
//! is a sum of integers, which `vpsadbw` adds up 64 bytes at a time.
//! Canberra's pass goes through `Grids` too, on the logarithmic codes and
//! with the bound of `ratios`, and so does js's, on the same codes with the
//! bound of `shannon`.
//!
//! Each family's part of `Grids` is in its own file: `steps` (l1, linf,
//! Bray-Curtis), `powers` (lp) and `levels` (Canberra, js).
//!
//! # The codes
//! A row `x` of `n` values with largest magnitude `m` has scale `a = 2^k`,
//! the least power of two not below `m / 127` (and at least 2^-126), codes
//! `c_i = round(x_i / a)` (at most 127 in magnitude, `x_i / a` being exact)
//! and residuals `e_i = x_i - a c_i`, each at most `a / 2` in magnitude;
//! their norm `E >= sum |e_i|` is kept, rounded up (for lp, the norm of
//! its `p`, `E >= (sum |e_i|^p)^(1/p)`: `codes::NormAbove`).
//! For each scale `a` the index's rows have, the query `q` gets codes
//! `d_i = round(q_i / a)` clamped to [-127, 127] and residuals
//! `f_i = q_i - a d_i`.
//!
//! # Why a ruled-out row cannot belong in the answer
//! For every `i`, `|x_i - q_i| >= a |c_i - d_i| - |e_i| - φ_i`, where:
//! - `φ_i = |f_i|` (at most `a / 2`) if `d_i` was not clamped: the triangle
//!   inequality;
//! - `φ_i = -|f_i|` if it was, say to 127: then `q_i >= 127.5 a` while
//!   `x_i <= m <= 127 a`, so `q_i - x_i = a (127 - c_i) + f_i - e_i` with
//!   `127 - c_i >= 0` and `f_i >= 0`. The query's excess beyond the codes'
//!   range only adds distance.
//!
//! With the integers `D = sum |c_i - d_i|`, `M = max |c_i - d_i|` and
//! `P = sum |c_i + d_i|`, and `F = sum φ_i`, `G = sum |f_i|`:
//! - l1 `= sum |x_i - q_i| >= a D - E - F`;
//! - linf `= max |x_i - q_i| >= a M - max (|e_i| + φ_i) >= a (M - 1)`;
//! - `sum |x_i + q_i| <= a P + E + G`, so Bray-Curtis
//!   `>= (a D - E - F) / (a P + E + G)` where the numerator is positive;
//! - lp: `x - q = g + e - f'`, where `f'` keeps the `f_i` of the
//!   coordinates not clamped (0 elsewhere) and `g_i` is `a (c_i - d_i)`,
//!   less `f_i` where `d_i` was clamped: a term of the same sign (above),
//!   so `|g_i| >= a s_i` with the integer `s_i = |c_i - d_i|`. By
//!   Minkowski's inequality, lp is at least `|g|_p - |e|_p - |f'|_p`, so
//!   at least `a S^(1/p) - E - H`, where `S = sum s_i^p` and `H >= |f'|_p`
//!   (rounded up). The residuals' norms grow as `n^(1/p)`, as the
//!   distances do, from a random half step each: a bound value by value
//!   (`|x_i - q_i| >= a (s_i - 1)`) would lose a whole step in each.
//!
//! The f32 kernels (`metric::l1`, `linf`, `lp`, `bray_curtis`) add non-negative terms, each off
//! by at most 2^-24 of itself; among f32's subnormals those sums and
//! differences are exact. So by the kernels' error model their l1 and each
//! of Bray-Curtis's sums are within `g = kernels::relative_error(n)` of the
//! exact ones (at most `m = n / 4 + 64` roundings per term, argued there),
//! linf within 2^-24, and Bray-Curtis's quotient adds one rounding of 2^-24.
//!
//! lp's kernel scales each pair by its largest difference `w`, so its sum
//! is of ratios at most 1, one of them 1: each ratio is within three
//! roundings of `|x_i - q_i| / w`, and its power (at most three squarings,
//! four products and three square roots, each rounded once) within
//! `(3 p + 15) 2^-24 <= 48 x 2^-24` of the ratio's power; terms that
//! underflow lose less than 2^-140 of a sum of at least 1. `w` cancels
//! from `w (sum)^(1/p)`, which is rounded to f32 once more. So its lp is at
//! least `L = ((1 - 48 x 2^-24)(1 - g))^(1/p) (1 - 2^-23)` times the exact
//! one, and a row is ruled out when `(a (S / slack)^(1/p) - E - H) L` is
//! strictly above the threshold (`Grids::rules_out_lp` tests that without
//! a root for each row).
//!
//! Any other `p` from 1 to 8 has a first pass where the CPU has AVX-512
//! VBMI's lookups (below), which raise to any `p`. Its kernel raises each
//! ratio `r` (at least `ρ (1 - 2^-23)`, for the exact ratio `ρ`) as
//! `e^z`, `z` the product of `p` and `wide`'s `ln r` rounded: `ln` is
//! within `2.5 x 2^-24` of `|ln r|` for every normal `r` (a subnormal one
//! gives -inf, a term of 0 for one below 2^-126), and `exp` within
//! `2 x 2^-24` where `e^z` is normal, below 2^-126 elsewhere; both checked
//! on every input they can take (`metric::lp`'s tests). So `z` is
//! within `3.6 x 2^-24 p |ln r|` of `p ln r`, and the term is at least
//! `r^p (1 - 2^-23)` less `3.6 x 2^-24 r^p p |ln r| <= 1.33 x 2^-24` (as
//! `r^p p |ln r| <= 1 / e`), less 2^-126: at least
//! `ρ^p (1 - 2^-23)^(p + 1) - 1.34 x 2^-24`. With the sum at least 1,
//! the `n` terms lose at most `1 - (1 - 2^-23)^(p + 1) + 1.34 n 2^-24`
//! of it, which takes the place of `48 x 2^-24` in `L`. The codes' norms
//! `E` and `H` are found from the norms of the multiples of 1/4 either
//! side of `p` (Hölder's inequality, `codes::NormAbove`): each at least
//! the norm of `p`, and within a fraction of a percent of it.
//!
//! The first pass raises each `s_i` (at most 254)
//! in f32: the whole power by products (exact below 2^24, each later one
//! rounded), then `sqrt(s_i)` as `s_i / sqrt(s_i)` and the fourth root as
//! `sqrt(sqrt(s_i))` the same way, with the CPU's approximate reciprocal
//! square root (`vrsqrt14ps`, within 2^-14; `vrsqrtps`, within 1.5 x
//! 2^-12), so each term is at most `(1 + 2^-10)` times `s_i^p`; summed in
//! at most `m` roundings, `S` as found is at most `(1 + 2^-10)(1 + g)`
//! times the exact one, and is divided by that before use.
//!
//! Where the CPU has AVX-512 VBMI, the first pass looks each `s_i^p` up
//! instead (`PowerTable`): each `s_i` is first lowered to at most 127, and
//! `T(s) = ⌊s^p κ (1 - 2^-40)⌋` for every step `s` up to 127, with
//! `κ = (2^24 - 1) / 127^p (1 - 2^-40)` so that `T(127)` fits 24 bits,
//! as three tables of 128 bytes, each looked up 64 steps at a time by one
//! `vpermi2b` of two registers and summed exactly in integers. Each `T(s)`
//! is at most `s^p κ` (the margins cover `powf`'s rounding), so
//! `sum T(s_i) / κ` is at most `S` (of the lowered steps, so at most the
//! true one), and at least that `S` less `n / κ`: a few parts in a million
//! of distances of random data. Its only slack is the quotient's rounding.
//!
//! For p = 2 and p = 3 the first pass finds `S` exactly instead, in
//! integers: `s_i^2` and `s_i^3` by byte or 16-bit products summed into
//! 32-bit lanes (`vpdpbusd`; `vpmullw` and `vpdpwssd` or `vpmaddwd`),
//! spilled to 64 bits often enough that no lane overflows. Each `s_i` is
//! first lowered to at most 127 for p = 2, so that it fits a signed byte,
//! and to at most 181 for p = 3, so that its square fits an i16: a lower
//! `s_i` only lowers `S`, and the bound holds. Then `S` needs no slack.
//! (Differences that large arise only between values of opposite signs.)
//!
//! For random data of 768 dimensions `E + F` is about `n a / 2`, against l1
//! distances about `40 n a` spread over a few percent: only rows near the
//! k-th nearest are scored twice. For lp at p = 3 on values in [0, 1),
//! `E` and `H` are about `3 a` each against distances of about `270 a`:
//! 1.6% of 100,000 rows are scored twice (2.6% with the bound value by
//! value).

mod levels;
mod powers;
mod steps;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{exponent_of, ratios, stored, Codes, Grid, Int8, Kernel, NormAbove};
use crate::store::kernels::{relative_error, BOUND_SURPLUS};
use powers::PowerTable;
#[cfg(test)]
pub use steps::spans_scalar;
pub use steps::Step;

/// The distances this pass bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Floor {
    /// l1, linf or Bray-Curtis, on the steps between codes (`steps`).
    Steps(Step),
    /// lp with this `p` (`Floor::lp`).
    Lp(f32),
    /// Canberra, on its logarithmic codes (`ratios`).
    Canberra,
    /// Jensen-Shannon, on Canberra's codes (`shannon`).
    JensenShannon,
}

impl Floor {
    /// lp's floor, for `p` from 1 (Minkowski's inequality) to 8: any such
    /// `p` where this process's first pass looks powers up (`lookups`),
    /// else a multiple of 1/4, which the f32 first pass raises to by
    /// products and square roots.
    pub fn lp(p: f32) -> Option<Floor> {
        if p == 1.0 {
            // lp's kernel is then l1's.
            return Some(Floor::Steps(Step::L1));
        }
        ((1.0..=8.0).contains(&p) && (is_quarter(p) || lookups())).then_some(Floor::Lp(p))
    }

    /// Whether its first pass can run with the kernel of `isa`: any but lp
    /// with a `p` not a multiple of 1/4, which only the lookups raise to.
    pub fn runs_on(self, isa: Int8) -> bool {
        match self {
            Floor::Lp(p) if !is_quarter(p) => isa == Int8::Vnni512 && vbmi(),
            _ => true,
        }
    }
}

/// `x` rounded down to an f32.
fn rounded_down(x: f64) -> f32 {
    let rounded = x as f32;
    if f64::from(rounded) > x {
        rounded.next_down()
    } else {
        rounded
    }
}

/// Whether `p` is a multiple of 1/4 (lp's kernels raise to those by
/// products and square roots).
fn is_quarter(p: f32) -> bool {
    let quarters = p * 4.0;
    quarters == quarters.trunc()
}

/// Whether the CPU has AVX-512 VBMI's byte lookups.
fn vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512vbmi");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this process's first passes look powers up: the widest int8
/// kernel, and VBMI.
fn lookups() -> bool {
    crate::store::cpu::paths().int8().is_some_and(|kernel| kernel.isa() == Int8::Vnni512) && vbmi()
}

impl Floor {
    /// The grid its codes are on: Canberra's logarithmic; the others' on
    /// powers of two, keeping the residual's norm of lp's `p` (else of 1).
    pub fn grid(self) -> Grid {
        match self {
            Floor::Canberra => Grid::Logarithmic { signs: true },
            Floor::JensenShannon => Grid::Logarithmic { signs: false },
            Floor::Lp(p) => Grid::PowersOfTwo { p_bits: p.to_bits() },
            _ => Grid::PowersOfTwo { p_bits: 1f32.to_bits() },
        }
    }
}

/// No query code for a scale: the index has no row of it.
const NO_SLOT: u16 = u16::MAX;

/// No limit memoized yet (`Grids::limits`): a threshold of NaN's bits,
/// which no search holds rows against.
const NO_LIMIT: u64 = u64::MAX;

/// One query's side of the bound: its code for each scale the index's rows
/// have. Its buffers are kept from search to search.
#[derive(Debug)]
pub struct Grids {
    floor: Floor,
    stride: usize,
    /// Per exponent field of a scale, the slot of the query's code for it.
    slots: [u16; 256],
    /// Per slot: `d_i + 128` (`stored`) over the rows' stride, padded with
    /// code 0 as the rows are; for Bray-Curtis then `128 - d_i`, whose
    /// distance to a row's stored code is `|c_i + d_i|`.
    bytes: Vec<u8>,
    /// Per slot: `a`, `F` and `G`, the last two rounded up (for lp: `a`,
    /// `H` and 0).
    sides: Vec<(f64, f64, f64)>,
    /// lp, per slot: the last threshold a row of that scale was held
    /// against (its f32 bits, high) and `S`'s limit for it (`rules_out_lp`,
    /// rounded up to an f32, low), in one word, so that threads sharing
    /// these codes always read a pair that belongs together. The threshold
    /// seldom changes; the power it takes costs as much as a row's pass.
    limits: Vec<AtomicU64>,
    /// `g` of the kernels' sums.
    relative: f64,
    /// lp: `p`'s whole part, its quarters beyond, and `L`; Canberra: its
    /// kernel's least distance as a factor of the exact one, and the
    /// subnormals' loss (`ratios`).
    whole: u32,
    quarters: u32,
    factor: f64,
    absolute: f64,
    /// Canberra: whether the query or a row holds a negative value, so
    /// that the kernels must compare signs.
    signed: bool,
    /// js and lp: whether the CPU has AVX-512 VBMI's byte lookups.
    vbmi: bool,
    /// lp where `vbmi`, but for p = 2 and 3: the powers of every step.
    table: PowerTable,
}

impl Default for Grids {
    fn default() -> Grids {
        Grids {
            floor: Floor::Steps(Step::L1),
            stride: 0,
            slots: [NO_SLOT; 256],
            bytes: Vec::new(),
            sides: Vec::new(),
            limits: Vec::new(),
            relative: 0.0,
            whole: 0,
            quarters: 0,
            factor: 0.0,
            absolute: 0.0,
            signed: false,
            vbmi: false,
            table: PowerTable::NONE,
        }
    }
}

impl Grids {
    /// `query`'s codes for every scale of `codes`' rows, for `floor`.
    pub fn of(floor: Floor, codes: &Codes, query: &[f32]) -> Grids {
        let mut grids = Grids::default();
        grids.encode(floor, codes, query);
        grids
    }

    /// Makes these `query`'s codes for every scale of `codes`' rows (on
    /// powers of two, or logarithmic for Canberra), for `floor`, in the
    /// buffers they have.
    pub fn encode(&mut self, floor: Floor, codes: &Codes, query: &[f32]) {
        assert!(codes.grid() == floor.grid() && query.len() == codes.dims());
        let stride = codes.stride();
        self.floor = floor;
        self.stride = stride;
        let width = self.query_width();
        self.slots = [NO_SLOT; 256];
        self.bytes.clear();
        self.sides.clear();
        self.limits.clear();
        // lp's `p`, for `H`.
        let p = if let Floor::Lp(p) = floor { p } else { 1.0 };
        let present = codes.exponents().iter().enumerate().filter(|&(_, &rows)| rows > 0);
        for (slot, (exponent, _)) in present.enumerate() {
            self.slots[exponent] = slot as u16;
            let scale = f64::from(f32::from_bits((exponent as u32) << 23));
            let start = self.bytes.len();
            if matches!(floor, Floor::Canberra | Floor::JensenShannon) {
                self.bytes.resize(start + width, 0);
                let (levels, signs) = self.bytes[start..].split_at_mut(stride);
                ratios::encode_on(query, scale, levels, signs);
                self.sides.push((scale, 0.0, 0.0));
                continue;
            }
            self.bytes.resize(start + width, stored(0));
            let (mut near, mut far, mut all, mut powered) = (0.0f64, 0.0f64, 0.0f64, NormAbove::new(p));
            for (i, &q) in query.iter().enumerate() {
                let q = f64::from(q);
                let unclamped = (q / scale).round();
                let d = unclamped.clamp(-127.0, 127.0);
                let f = (q - scale * d).abs();
                if d == unclamped {
                    near += f;
                    powered.add(f);
                } else {
                    far += f;
                }
                all += f;
                self.bytes[start + i] = stored(d as i8);
                if floor == Floor::Steps(Step::BrayCurtis) {
                    self.bytes[start + stride + i] = stored(-(d as i8));
                }
            }
            let surplus = all * 2f64.powi(-30);
            if let Floor::Lp(_) = floor {
                // lp's `H`, rounded up as the rows' norms are
                // (`codes::encode`).
                self.sides.push((scale, powered.norm(), 0.0));
                self.limits.push(AtomicU64::new(NO_LIMIT));
            } else {
                self.sides.push((scale, near - far + surplus, all + surplus));
            }
        }
        self.relative = relative_error(query.len());
        match floor {
            Floor::Canberra | Floor::JensenShannon => self.prepare_levels(codes, query),
            Floor::Lp(p) => self.prepare_powers(p, query.len()),
            Floor::Steps(_) => {}
        }
    }

    /// Each of `R` rows' key, for a search that takes rows in the order of
    /// their keys (`Index::search_in_order`): the nearest the row can be
    /// (`nearest_of`); for lp, whose bound would take a root, `S` as the
    /// first pass finds it over its slack, rounded down, from which
    /// `beyond` tells the bound against any threshold without a root.
    #[inline(always)]
    pub fn keys_of<const R: usize>(&self, kernel: Kernel, codes: &Codes, rows: [usize; R]) -> [f32; R] {
        if let Floor::Lp(_) = self.floor {
            let slots = rows.map(|row| self.slot_of(codes, row));
            let (sums, slack) = self.powers(kernel, codes, rows, slots);
            return sums.map(|sum| rounded_down(sum / slack));
        }
        self.nearest_of(kernel, codes, rows)
    }

    /// Whether row `row`, whose key (`keys_of`) is `key`, is strictly
    /// farther than `threshold` whatever its exact distance.
    #[inline(always)]
    pub fn beyond(&self, codes: &Codes, row: usize, key: f32, threshold: f32) -> bool {
        match self.floor {
            Floor::Lp(p) => {
                let slot = self.slot_of(codes, row);
                self.lp_beyond(f64::from(p), codes, (row, slot), f64::from(key), threshold)
            }
            _ => key > threshold,
        }
    }

    /// Pushes onto `left` every row not `beyond` `threshold`, with its key
    /// (`keys[row]`, f32 bits; NaN for a row already scored, which is
    /// skipped): `beyond` for each row, with what lp's rule shares between
    /// the rows of a scale found once, not a division or two per row.
    pub fn left_of(&self, codes: &Codes, keys: &[AtomicU32], threshold: f32, left: &mut Vec<(f32, u32)>) {
        let rows = keys.iter().enumerate().filter_map(|(row, key)| {
            let key = f32::from_bits(key.load(Ordering::Relaxed));
            (!key.is_nan()).then_some((row, key))
        });
        let Floor::Lp(p) = self.floor else {
            left.extend(rows.filter(|&(_, key)| key <= threshold).map(|(row, key)| (key, row as u32)));
            return;
        };
        let p = f64::from(p);
        // For each scale, `p / t` with the surplus `lp_beyond` gives `u`
        // (and a few roundings more, which only let more rows stay), and
        // `limit_lp`.
        let mut shared = [(0.0f64, 0.0f64); 256];
        for (slot, &(_, h, _)) in self.sides.iter().enumerate() {
            let t = f64::from(threshold) / self.factor + h;
            shared[slot] =
                (p / t * (1.0 + BOUND_SURPLUS) * (1.0 + 2f64.powi(-50)), self.limit_lp(p, slot, threshold, t));
        }
        for (row, key) in rows {
            let (scale, residual) = codes.scale_and_residual(row);
            let (over, limit) = shared[usize::from(self.slots[exponent_of(scale)])];
            let u = f64::from(residual) * over;
            if !(u < 1.0 && f64::from(key) * (1.0 - u) > limit) {
                left.push((key, row as u32));
            }
        }
    }

    /// The nearest each of `R` rows of `codes` can be, rounded down to an
    /// f32 (-inf where the bound is NaN: it rules nothing out), for every
    /// floor but lp's.
    #[inline(always)]
    pub fn nearest_of<const R: usize>(&self, kernel: Kernel, codes: &Codes, rows: [usize; R]) -> [f32; R] {
        let slots = rows.map(|row| self.slot_of(codes, row));
        let nearest = self.nearest_unrounded(kernel, codes, (rows, slots));
        nearest.map(|nearest| if nearest.is_nan() { f32::NEG_INFINITY } else { rounded_down(nearest) })
    }

    /// Which of `R` rows of `codes` are strictly farther than `threshold`
    /// (infinite where the search keeps nothing yet) whatever their exact
    /// distances: bit `r` is set when `rows[r]` cannot enter.
    #[inline(always)]
    pub fn rules_out<const R: usize>(&self, kernel: Kernel, codes: &Codes, rows: [usize; R], threshold: f32) -> u32 {
        let slots = rows.map(|row| self.slot_of(codes, row));
        if let Floor::Lp(p) = self.floor {
            return self.rules_out_lp(f64::from(p), kernel, codes, (rows, slots), threshold);
        }
        let nearest = self.nearest_unrounded(kernel, codes, (rows, slots));
        (0..R).fold(0, |ruled, r| ruled | u32::from(nearest[r] > f64::from(threshold)) << r)
    }

    /// The nearest each of `R` rows (of the scales in `slots`) can be, in
    /// f64, for every floor but lp's.
    #[inline(always)]
    fn nearest_unrounded<const R: usize>(
        &self,
        kernel: Kernel,
        codes: &Codes,
        (rows, slots): ([usize; R], [usize; R]),
    ) -> [f64; R] {
        match self.floor {
            Floor::Lp(_) => unreachable!("lp's rule takes no root (`keys_of`, `rules_out_lp`)"),
            Floor::Canberra => {
                let sums = self.ratio_sums(kernel, codes, rows, slots);
                std::array::from_fn(|r| self.canberra_floor(sums[r]))
            }
            Floor::JensenShannon => {
                let sums = self.shannon_sums(kernel, codes, rows, slots);
                std::array::from_fn(|r| self.shannon_floor(sums[r], slots[r]))
            }
            Floor::Steps(step) => self.step_floors(step, kernel, codes, (rows, slots)),
        }
    }

    /// The slot of the query's code for row `row`'s scale.
    #[inline(always)]
    fn slot_of(&self, codes: &Codes, row: usize) -> usize {
        usize::from(self.slots[exponent_of(codes.scale_and_residual(row).0)])
    }

    /// The query's code in `slot` (with its negation, for Bray-Curtis).
    #[inline(always)]
    fn query_at(&self, slot: usize) -> &[u8] {
        let width = self.query_width();
        &self.bytes[slot * width..(slot + 1) * width]
    }

    /// Bytes of the query's code for each slot: the rows' stride, twice
    /// for Bray-Curtis (with its negation), and for Canberra its sign bits
    /// after its levels.
    fn query_width(&self) -> usize {
        match self.floor {
            Floor::Steps(Step::BrayCurtis) => 2 * self.stride,
            Floor::Canberra => self.stride + self.stride / 8,
            _ => self.stride,
        }
    }
}

#[cfg(test)]
impl Grids {
    /// The query's codes for row `row`'s scale.
    pub fn code_for(&self, codes: &Codes, row: usize) -> Vec<i8> {
        let query = self.query_at(self.slot_of(codes, row));
        query[..codes.dims()].iter().map(|&b| (b ^ 0x80) as i8).collect()
    }
}
