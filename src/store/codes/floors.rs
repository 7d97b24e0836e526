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

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{exponent_of, ratios, shannon, stored, Codes, Grid, Int8, Kernel, NormAbove, BLOCK};
use crate::store::kernels::{relative_error, BOUND_SURPLUS};

/// The distances this pass bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Floor {
    L1,
    Linf,
    BrayCurtis,
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
            return Some(Floor::L1);
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

/// The largest whole part of lp's `p` the first pass raises to.
const WHOLE_MAX: u32 = 8;

/// For p = 3, each `s_i` is lowered to this, whose square fits an i16
/// (the module doc).
const CUBED_MAX: u8 = 181;

/// For p = 2, each `s_i` is lowered to this, a signed byte's largest, as
/// `vpdpbusd` multiplies by (the module doc).
const SQUARED_MAX: u8 = 127;

/// lp's lookups lower each `s_i` to this, so that one `vpermi2b` of two
/// registers looks it up (the module doc).
const TABLE_MAX: u8 = 127;

/// `Floor` as the kernels' compile-time parameter.
const L1: u8 = 0;
const LINF: u8 = 1;
const BRAY_CURTIS: u8 = 2;

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

/// lp's `T(s) = ⌊s^p κ⌋` for every step `s` from 0 to 127 (a larger step
/// is looked up as 127), 24-bit integers as three tables of bytes (low,
/// middle, high) for AVX-512 VBMI's lookups, with `κ` such that `T(127)`
/// fits (the module doc).
#[derive(Debug)]
struct PowerTable {
    /// The `p` the tables are for (NaN: none yet).
    p: f32,
    bytes: [[u8; 128]; 3],
    kappa: f64,
}

impl PowerTable {
    fn new(p: f32) -> PowerTable {
        let p64 = f64::from(p);
        let top = f64::from(TABLE_MAX);
        let kappa = f64::from((1u32 << 24) - 1) / top.powf(p64) * (1.0 - 2f64.powi(-40));
        let powers: [u32; 128] =
            std::array::from_fn(|s| (f64::from(s as u32).powf(p64) * kappa * (1.0 - 2f64.powi(-40))).floor() as u32);
        assert!(powers[0] == 0 && powers[127] < 1 << 24, "24 bits");
        let bytes = [0, 8, 16].map(|shift| powers.map(|power| (power >> shift) as u8));
        PowerTable { p, bytes, kappa }
    }

    /// `T(s)`, with `s` lowered to 127.
    fn power(&self, s: u8) -> u64 {
        let s = usize::from(s.min(TABLE_MAX));
        u64::from(self.bytes[0][s]) | u64::from(self.bytes[1][s]) << 8 | u64::from(self.bytes[2][s]) << 16
    }
}

impl Default for Grids {
    fn default() -> Grids {
        Grids {
            floor: Floor::L1,
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
            table: PowerTable { p: f32::NAN, bytes: [[0; 128]; 3], kappa: 1.0 },
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
                if floor == Floor::BrayCurtis {
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
        if floor == Floor::Canberra {
            self.factor = (1.0 - 3.0 * 2f64.powi(-24)) * (1.0 - self.relative) * (1.0 - BOUND_SURPLUS);
            self.absolute = query.len() as f64 * 2f64.powi(-149);
            self.signed = codes.negatives() > 0 || query.iter().any(|&q| q < 0.0);
        }
        if floor == Floor::JensenShannon {
            self.factor = (1.0 - 2f64.powi(-15)) * (1.0 - self.relative) * (1.0 - BOUND_SURPLUS);
            self.absolute = query.len() as f64 * 2f64.powi(-148);
            self.vbmi = vbmi();
        }
        if let Floor::Lp(p) = floor {
            let quarters = (p * 4.0) as u32;
            (self.whole, self.quarters) = (quarters / 4, quarters % 4);
            self.vbmi = vbmi();
            if self.vbmi && self.table.p != p {
                self.table = PowerTable::new(p);
            }
            // Each term's loss (the module doc): for a multiple of 1/4, at
            // most 48 roundings of itself; for any other p, `(p + 1) 2^-23`
            // of itself and `1.34 x 2^-24`, at most that of the sum (at
            // least 1) for each of the `n` terms.
            let lost = if is_quarter(p) {
                48.0 * 2f64.powi(-24)
            } else {
                1.0 - (1.0 - 2f64.powi(-23)).powf(f64::from(p) + 1.0) + 1.34 * query.len() as f64 * 2f64.powi(-24)
            };
            let p = f64::from(p);
            let factor = ((1.0 - lost) * (1.0 - self.relative)).powf(1.0 / p) * (1.0 - 2f64.powi(-23));
            self.factor = factor * (1.0 - BOUND_SURPLUS);
        }
    }

    /// Whether lp's first pass finds `S` in integers: p = 2 or 3.
    fn integers(&self) -> bool {
        matches!(self.floor, Floor::Lp(p) if p == 2.0 || p == 3.0)
    }

    /// lp's `p` (NaN for the other floors).
    fn floor_p(&self) -> f32 {
        if let Floor::Lp(p) = self.floor {
            p
        } else {
            f32::NAN
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
        let nearest: [f64; R] = match self.floor {
            Floor::Lp(_) => unreachable!("lp's rule takes no root (`keys_of`)"),
            Floor::Canberra => {
                let sums = self.ratio_sums(kernel, codes, rows, slots);
                std::array::from_fn(|r| self.canberra_floor(sums[r]))
            }
            Floor::JensenShannon => {
                let sums = self.shannon_sums(kernel, codes, rows, slots);
                std::array::from_fn(|r| self.shannon_floor(sums[r], slots[r]))
            }
            _ => {
                let (spans, plus) = self.spans(kernel, codes, rows, slots);
                std::array::from_fn(|r| {
                    let (_, residual) = codes.scale_and_residual(rows[r]);
                    self.nearest(self.sides[slots[r]], f64::from(residual), spans[r], plus[r])
                })
            }
        };
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
        if self.floor == Floor::Canberra {
            let sums = self.ratio_sums(kernel, codes, rows, slots);
            return (0..R)
                .fold(0, |ruled, r| ruled | u32::from(self.canberra_floor(sums[r]) > f64::from(threshold)) << r);
        }
        if self.floor == Floor::JensenShannon {
            let sums = self.shannon_sums(kernel, codes, rows, slots);
            return (0..R).fold(0, |ruled, r| {
                ruled | u32::from(self.shannon_floor(sums[r], slots[r]) > f64::from(threshold)) << r
            });
        }
        let (spans, plus) = self.spans(kernel, codes, rows, slots);
        let mut ruled = 0;
        for r in 0..R {
            let (_, residual) = codes.scale_and_residual(rows[r]);
            let nearest = self.nearest(self.sides[slots[r]], f64::from(residual), spans[r], plus[r]);
            ruled |= u32::from(nearest > f64::from(threshold)) << r;
        }
        ruled
    }

    /// `rules_out` for lp: whether `(a S^(1/p) - E - H) L > threshold`
    /// (the module doc), for each row of the `slots`. With
    /// `t = threshold / L + H`, that is `S > (t / a)^p (1 + E / t)^p`; as
    /// `(1 + u)^p <= e^(p u) <= 1 / (1 - p u)` for `0 <= p u < 1`, a row
    /// is ruled out when `S (1 - p E / t) > (t / a)^p`, the power shared by
    /// every row of a scale (`limit_lp`).
    #[inline(always)]
    fn rules_out_lp<const R: usize>(
        &self,
        p: f64,
        kernel: Kernel,
        codes: &Codes,
        (rows, slots): ([usize; R], [usize; R]),
        threshold: f32,
    ) -> u32 {
        let (sums, slack) = self.powers(kernel, codes, rows, slots);
        (0..R).fold(0, |ruled, r| {
            ruled | u32::from(self.lp_beyond(p, codes, (rows[r], slots[r]), sums[r] / slack, threshold)) << r
        })
    }

    /// `rules_out_lp` for one row, of the scale in `slot`, whose `S` over
    /// its slack is `sum`.
    #[inline(always)]
    fn lp_beyond(&self, p: f64, codes: &Codes, (row, slot): (usize, usize), sum: f64, threshold: f32) -> bool {
        let (_, h, _) = self.sides[slot];
        let t = f64::from(threshold) / self.factor + h;
        let (_, residual) = codes.scale_and_residual(row);
        // Rounded up, as `1 - p u` is then rounded down: within the
        // surplus the limit carries. A NaN rules nothing out.
        let u = p * f64::from(residual) / t * (1.0 + BOUND_SURPLUS);
        u < 1.0 && sum * (1.0 - u) > self.limit_lp(p, slot, threshold, t)
    }

    /// `(t / a)^p` for the scale of `slot` and `t` as `rules_out_lp` finds
    /// it from `threshold`, with the surplus, rounded up (`limits`).
    #[inline(always)]
    fn limit_lp(&self, p: f64, slot: usize, threshold: f32, t: f64) -> f64 {
        let memo = &self.limits[slot];
        let last = memo.load(Ordering::Relaxed);
        if (last >> 32) as u32 == threshold.to_bits() {
            return f64::from(f32::from_bits(last as u32));
        }
        let (scale, _, _) = self.sides[slot];
        let limit = (t / scale).powf(p) * (1.0 + BOUND_SURPLUS);
        // Up to the next f32 at or above: never below the exact limit, so
        // it rules out no row the f64 one would not.
        let mut rounded = limit as f32;
        if f64::from(rounded) < limit {
            rounded = rounded.next_up();
        }
        memo.store(u64::from(threshold.to_bits()) << 32 | u64::from(rounded.to_bits()), Ordering::Relaxed);
        f64::from(rounded)
    }

    /// The least Canberra distance the kernel can find for a row whose
    /// codes give `sums` (`ratios`).
    #[inline(always)]
    fn canberra_floor(&self, sums: (u64, i64)) -> f64 {
        let bound = ratios::bound(sums, self.stride);
        bound * self.factor - self.absolute
    }

    /// The least js distance the kernel can find for a row of the scale in
    /// `slot` whose codes give `sum` (`shannon`).
    #[inline(always)]
    fn shannon_floor(&self, sum: u64, slot: usize) -> f64 {
        sum as f64 * shannon::unit(self.sides[slot].0) * self.factor - self.absolute
    }

    /// The most the first pass's lp sum exceeds the exact one by, as a
    /// factor (the module doc).
    pub fn sums_slack(&self) -> f64 {
        (1.0 + 2f64.powi(-10)) * (1.0 + self.relative) * (1.0 + BOUND_SURPLUS)
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
            Floor::BrayCurtis => 2 * self.stride,
            Floor::Canberra => self.stride + self.stride / 8,
            _ => self.stride,
        }
    }

    /// `S` (lp, the module doc) of `rows` against the query's codes in
    /// `slots`, as the first pass finds it, and the most it can exceed the
    /// exact `S` by, as a factor: exact in integers for p = 2 and 3.
    #[inline(always)]
    fn powers<const R: usize>(
        &self,
        kernel: Kernel,
        codes: &Codes,
        rows: [usize; R],
        slots: [usize; R],
    ) -> ([f64; R], f64) {
        let (bytes, stride) = (codes.bytes(), self.stride);
        let starts = rows.map(|row| row * stride);
        assert!(starts.iter().all(|&start| start + stride <= bytes.len()) && stride.is_multiple_of(BLOCK));
        assert!((1..=WHOLE_MAX).contains(&self.whole) && self.quarters < 4);
        let queries = slots.map(|slot| self.query_at(slot));
        if self.integers() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `spans`.
            let sums = unsafe {
                match (kernel.isa(), self.whole) {
                    (Int8::Vnni512, 2) => x86::whole_avx512::<2, R>(bytes, starts, queries, stride),
                    (Int8::Vnni512, _) => x86::whole_avx512::<3, R>(bytes, starts, queries, stride),
                    (_, 2) => x86::whole_avx2::<2, R>(bytes, starts, queries, (0, stride)),
                    _ => x86::whole_avx2::<3, R>(bytes, starts, queries, (0, stride)),
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            let sums: [u64; R] = unreachable!("no kernel is available off x86-64");
            // Exact: below 2^53 (at most 65,536 x 127^2 or 181^3).
            return (sums.map(|sum| sum as f64), 1.0);
        }
        if kernel.isa() == Int8::Vnni512 && self.vbmi {
            assert_eq!(self.table.p, self.floor_p(), "the table is the floor's");
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `spans`, VBMI asked for where it is used.
            let sums = unsafe { x86::table_avx512::<R>(&self.table, bytes, starts, queries, stride) };
            #[cfg(not(target_arch = "x86_64"))]
            let sums: [u64; R] = unreachable!("no kernel is available off x86-64");
            // Each `T(s)` is at most `s^p κ`: the sum over `κ`, exact but
            // for the quotient's rounding, is at most `S`.
            return (sums.map(|sum| sum as f64 / self.table.kappa), 1.0 + BOUND_SURPLUS);
        }
        assert!(is_quarter(self.floor_p()), "only the lookups raise to a p not a multiple of 1/4 (`Floor::runs_on`)");
        macro_rules! powers {
            ($($k:literal)*) => {
                match self.whole {
                    $($k => powers::<$k, R>(kernel, bytes, starts, queries, (stride, self.quarters)),)*
                    _ => unreachable!("a whole part from 1 to 8 (asserted)"),
                }
            };
        }
        (powers!(1 2 3 4 5 6 7 8).map(f64::from), self.sums_slack())
    }

    /// Canberra's sums of bases and slopes (`ratios`) of `rows` against the
    /// query's codes in `slots`.
    #[inline(always)]
    fn ratio_sums<const R: usize>(
        &self,
        kernel: Kernel,
        codes: &Codes,
        rows: [usize; R],
        slots: [usize; R],
    ) -> [(u64, i64); R] {
        let (codes, width) = ((codes.bytes(), codes.signs()), self.stride);
        let starts = rows.map(|row| row * width);
        assert!(width.is_multiple_of(BLOCK) && starts.iter().all(|&start| start + width <= codes.0.len()));
        assert!(!self.signed || starts.iter().all(|&start| (start + width) / 8 <= codes.1.len()));
        let queries = slots.map(|slot| self.query_at(slot));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `spans`; each query holds `width + width / 8` bytes
        // (sliced); the signs are read only where `signed` (asserted).
        unsafe {
            let table = &*ratios::TABLE;
            match (kernel.isa(), self.signed) {
                (Int8::Vnni512, true) => ratios::x86::sums_avx512::<true, R>(table, codes, starts, queries, width),
                (Int8::Vnni512, false) => ratios::x86::sums_avx512::<false, R>(table, codes, starts, queries, width),
                (_, true) => ratios::x86::sums_avx2::<true, R>(table, codes, starts, queries, (0, width), width),
                (_, false) => ratios::x86::sums_avx2::<false, R>(table, codes, starts, queries, (0, width), width),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (kernel, codes, starts, queries, width);
            unreachable!("no kernel is available off x86-64")
        }
    }

    /// js's sums of `V` (`shannon`) of `rows` against the query's codes in
    /// `slots`: with `vpermi2b` where the CPU has AVX-512 VBMI (and the
    /// widest kernel runs), else with AVX2's gathers.
    #[inline(always)]
    fn shannon_sums<const R: usize>(
        &self,
        kernel: Kernel,
        codes: &Codes,
        rows: [usize; R],
        slots: [usize; R],
    ) -> [u64; R] {
        let (bytes, width) = (codes.bytes(), self.stride);
        let starts = rows.map(|row| row * width);
        assert!(width.is_multiple_of(BLOCK) && starts.iter().all(|&start| start + width <= bytes.len()));
        let queries = slots.map(|slot| self.query_at(slot));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `spans`, VBMI asked for where it is used; each query
        // holds at least `width` bytes (sliced).
        unsafe {
            let table = &*shannon::TABLE;
            if kernel.isa() == Int8::Vnni512 && self.vbmi {
                shannon::x86::sums_vbmi::<R>(table, bytes, starts, queries, width)
            } else {
                shannon::x86::sums_avx2::<R>(table, bytes, starts, queries, (0, width))
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (kernel, bytes, starts, queries, width);
            unreachable!("no kernel is available off x86-64")
        }
    }

    /// `spans` of `rows` against the query's codes in `slots`.
    #[inline(always)]
    fn spans<const R: usize>(
        &self,
        kernel: Kernel,
        codes: &Codes,
        rows: [usize; R],
        slots: [usize; R],
    ) -> ([u32; R], [u32; R]) {
        let (bytes, stride) = (codes.bytes(), self.stride);
        let starts = rows.map(|row| row * stride);
        assert!(starts.iter().all(|&start| start + stride <= bytes.len()) && stride.is_multiple_of(BLOCK));
        let queries = slots.map(|slot| self.query_at(slot));
        match self.floor {
            Floor::L1 => spans(kernel, L1, bytes, starts, queries, stride),
            Floor::Linf => spans(kernel, LINF, bytes, starts, queries, stride),
            Floor::BrayCurtis => spans(kernel, BRAY_CURTIS, bytes, starts, queries, stride),
            Floor::Lp(_) => unreachable!("lp's pass sums powers (`powers`)"),
            Floor::Canberra => unreachable!("Canberra's pass sums bounds (`ratio_sums`)"),
            Floor::JensenShannon => unreachable!("js's pass sums bounds (`shannon_sums`)"),
        }
    }

    /// The nearest a row can be (the module doc), from its scale's side
    /// `(a, F, G)`, its residual bound `E` and its codes' `D` or `M`, and
    /// `P`.
    #[inline(always)]
    fn nearest(&self, (a, near, outer): (f64, f64, f64), residual: f64, span: u32, plus: u32) -> f64 {
        let (span, plus) = (a * f64::from(span), a * f64::from(plus));
        let apart = span - residual - near;
        let apart = apart - BOUND_SURPLUS * (span + residual + near.abs());
        match self.floor {
            Floor::L1 => apart * (1.0 - self.relative),
            Floor::Linf => (span - a) * (1.0 - 2f64.powi(-23)),
            Floor::BrayCurtis if apart <= 0.0 => 0.0,
            Floor::BrayCurtis => {
                let sums = (plus + residual + outer) * (1.0 + BOUND_SURPLUS);
                apart / sums * (1.0 - self.relative) / (1.0 + self.relative) * (1.0 - 2f64.powi(-23))
            }
            Floor::Lp(_) => unreachable!("lp's floor is `rules_out_lp`"),
            Floor::Canberra => unreachable!("Canberra's floor is `canberra_floor`"),
            Floor::JensenShannon => unreachable!("js's floor is `shannon_floor`"),
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

    /// Canberra's sums of row `row` with `kernel`, as the kernel finds them
    /// and as the scalar reference does; and the least distance the bound
    /// allows from them.
    pub fn ratio_sums_of(&self, kernel: Kernel, codes: &Codes, row: usize) -> ((u64, i64), (u64, i64), f64) {
        let slot = self.slot_of(codes, row);
        let [sums] = self.ratio_sums(kernel, codes, [row], [slot]);
        let width = codes.stride();
        let row_codes = (&codes.bytes()[row * width..], &codes.signs()[row * width / 8..]);
        let want = ratios::sums_scalar(self.query_at(slot), row_codes, width);
        (sums, want, self.canberra_floor(sums))
    }

    /// js's sum of row `row` with `kernel`, as the kernel finds it and as
    /// the scalar reference does; and the least distance the bound allows
    /// from it.
    pub fn shannon_sums_of(&self, kernel: Kernel, codes: &Codes, row: usize) -> (u64, u64, f64) {
        let slot = self.slot_of(codes, row);
        let [sum] = self.shannon_sums(kernel, codes, [row], [slot]);
        let width = codes.stride();
        let want = shannon::sums_scalar(self.query_at(slot), &codes.bytes()[row * width..], width);
        (sum, want, self.shannon_floor(sum, slot))
    }

    /// Whether Canberra's kernels compare signs for this query.
    pub fn signed(&self) -> bool {
        self.signed
    }

    /// `spans` of row `row` with `kernel`.
    pub fn spans_of(&self, kernel: Kernel, codes: &Codes, row: usize) -> (u32, u32) {
        let ([span], [plus]) = self.spans(kernel, codes, [row], [self.slot_of(codes, row)]);
        (span, plus)
    }

    /// lp's `S` of row `row` with `kernel` as the kernel finds it, the
    /// exact one, and the slack between them the bound allows; for p = 2
    /// and 3, the exact one of the lowered `s_i` (the module doc), which the
    /// kernel must find with no slack.
    pub fn powers_of(&self, kernel: Kernel, codes: &Codes, row: usize) -> (f64, f64, f64, f64) {
        let ([sum], slack) = self.powers(kernel, codes, [row], [self.slot_of(codes, row)]);
        let query = self.code_for(codes, row);
        let p = f64::from(self.floor_p());
        let integers = self.integers();
        let looked_up = !integers && kernel.isa() == Int8::Vnni512 && self.vbmi;
        let highest = match (integers, self.whole) {
            (true, 2) => u32::from(SQUARED_MAX),
            (true, _) => u32::from(CUBED_MAX),
            _ if looked_up => u32::from(TABLE_MAX),
            _ => u32::MAX,
        };
        let steps = || (query.iter().zip(codes.row(row))).map(|(&d, c)| (i32::from(c) - i32::from(d)).unsigned_abs());
        let exact = steps().map(|s| f64::from(s.min(highest)).powf(p)).sum::<f64>();
        if looked_up {
            // The table's sum, as the scalar reference finds it.
            let table = steps().map(|s| self.table.power(s as u8)).sum::<u64>() as f64 / self.table.kappa;
            assert_eq!(sum, table, "the table's sum");
            // Each `T(s)` within 1 of `s^p κ`, below it.
            let least = (exact - codes.dims() as f64 / self.table.kappa) / slack;
            return (sum, exact, slack, least);
        }
        (sum, exact, slack, if slack == 1.0 { exact } else { exact / slack })
    }
}

/// Each row's `D` (l1, Bray-Curtis) or `M` (linf), and `P` (Bray-Curtis,
/// else 0), of the stored codes at `starts` in `bytes` against `queries`
/// (a query code each, with its negation after `stride` bytes for
/// Bray-Curtis), over `stride` bytes.
#[inline(always)]
fn spans<const R: usize>(
    kernel: Kernel,
    what: u8,
    bytes: &[u8],
    starts: [usize; R],
    queries: [&[u8]; R],
    stride: usize,
) -> ([u32; R], [u32; R]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a `Kernel` exists only where the CPU has its instructions
    // (`Kernel::on_this_cpu`), and every kernel's features
    // include AVX2 (AVX-512 VNNI's include AVX-512BW); the loads stay inside
    // `bytes` (asserted by the caller) and the query codes (sliced).
    unsafe {
        match (kernel.isa(), what) {
            (Int8::Vnni512, L1) => x86::spans_avx512::<L1, R>(bytes, starts, queries, stride),
            (Int8::Vnni512, LINF) => x86::spans_avx512::<LINF, R>(bytes, starts, queries, stride),
            (Int8::Vnni512, _) => x86::spans_avx512::<BRAY_CURTIS, R>(bytes, starts, queries, stride),
            (_, L1) => x86::spans_avx2::<L1, R>(bytes, starts, queries, stride),
            (_, LINF) => x86::spans_avx2::<LINF, R>(bytes, starts, queries, stride),
            _ => x86::spans_avx2::<BRAY_CURTIS, R>(bytes, starts, queries, stride),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, what, bytes, starts, queries, stride);
        unreachable!("no kernel is available off x86-64")
    }
}

/// lp's `S` of the stored codes at `starts` in `bytes` against `queries`,
/// over `stride` bytes, for `p` of whole part `K` and `quarters` beyond.
#[inline(always)]
fn powers<const K: u32, const R: usize>(
    kernel: Kernel,
    bytes: &[u8],
    starts: [usize; R],
    queries: [&[u8]; R],
    (stride, quarters): (usize, u32),
) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `spans`.
    unsafe {
        match kernel.isa() {
            Int8::Vnni512 => x86::powers_avx512::<K, R>(bytes, starts, queries, (stride, quarters)),
            _ => x86::powers_avx2::<K, R>(bytes, starts, queries, (0, stride), quarters),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, bytes, starts, queries, stride, quarters);
        unreachable!("no kernel is available off x86-64")
    }
}

/// `D`, `M` and `P` of a query's codes and a row's, one value at a time:
/// the reference the kernels must agree with.
#[cfg(test)]
pub fn spans_scalar(query: &[i8], row: impl Iterator<Item = i8>) -> (u32, u32, u32) {
    query.iter().zip(row).fold((0, 0, 0), |(d, m, p), (&q, c)| {
        let (q, c) = (i32::from(q), i32::from(c));
        (d + (c - q).unsigned_abs(), m.max((c - q).unsigned_abs()), p + (c + q).unsigned_abs())
    })
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::super::x86::{pair_256, pair_512, sum_of};
    use super::{PowerTable, BRAY_CURTIS, CUBED_MAX, LINF, SQUARED_MAX, TABLE_MAX};

    /// `spans` on 64-byte blocks, and a last one of 32, with AVX-512BW.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BW; `bytes` must hold `stride` bytes
    /// from each start, and each query `stride` (twice that for
    /// Bray-Curtis); `stride` a multiple of 32.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn spans_avx512<const WHAT: u8, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> ([u32; R], [u32; R]) {
        let (mut wide, mut plus_wide) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe {
                    (
                        _mm512_loadu_si512(bytes.as_ptr().add(starts[r] + at).cast()),
                        _mm512_loadu_si512(queries[r].as_ptr().add(at).cast()),
                    )
                };
                wide[r] = if WHAT == LINF {
                    _mm512_max_epu8(wide[r], _mm512_or_si512(_mm512_subs_epu8(x, q), _mm512_subs_epu8(q, x)))
                } else {
                    _mm512_add_epi64(wide[r], _mm512_sad_epu8(x, q))
                };
                if WHAT == BRAY_CURTIS {
                    // SAFETY: in bounds, as the caller promises.
                    let n = unsafe { _mm512_loadu_si512(queries[r].as_ptr().add(stride + at).cast()) };
                    plus_wide[r] = _mm512_add_epi64(plus_wide[r], _mm512_sad_epu8(x, n));
                }
            }
            at += 64;
        }
        // The last 32 bytes, if any, in a half vector: as AVX2 does.
        let half = if at < stride { 32 } else { 0 };
        // SAFETY: the same bounds, from `at`; the CPU has AVX2.
        let (narrow, plus_narrow) =
            unsafe { blocks::<WHAT, R>(bytes, starts.map(|s| s + at), queries, (at, half), stride) };
        let mut spans = [0; R];
        let mut plus = [0; R];
        for r in 0..R {
            spans[r] = if WHAT == LINF {
                let halves = _mm256_max_epu8(_mm512_castsi512_si256(wide[r]), _mm512_extracti64x4_epi64::<1>(wide[r]));
                max_of(_mm256_max_epu8(halves, narrow[r]))
            } else {
                (_mm512_reduce_add_epi64(wide[r]) as u64 + sum_of(narrow[r])) as u32
            };
            plus[r] = (_mm512_reduce_add_epi64(plus_wide[r]) as u64 + sum_of(plus_narrow[r])) as u32;
        }
        (spans, plus)
    }

    /// `spans` on 32-byte blocks with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn spans_avx2<const WHAT: u8, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> ([u32; R], [u32; R]) {
        // SAFETY: as the caller promises.
        let (narrow, plus_narrow) = unsafe { blocks::<WHAT, R>(bytes, starts, queries, (0, stride), stride) };
        let spans = narrow.map(|v| if WHAT == LINF { max_of(v) } else { sum_of(v) as u32 });
        (spans, plus_narrow.map(|v| sum_of(v) as u32))
    }

    /// The running `D` (as four u64 lanes) or `M` (as 32 u8 lanes), and
    /// `P`, of the `len` bytes from each start against the queries from
    /// `at`.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`, `len` a multiple
    /// of 32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn blocks<const WHAT: u8, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
        stride: usize,
    ) -> ([__m256i; R], [__m256i; R]) {
        let (mut spans, mut plus) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
        for step in (0..len).step_by(32) {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let (x, q) = unsafe {
                    (
                        _mm256_loadu_si256(bytes.as_ptr().add(starts[r] + step).cast()),
                        _mm256_loadu_si256(queries[r].as_ptr().add(at + step).cast()),
                    )
                };
                spans[r] = if WHAT == LINF {
                    _mm256_max_epu8(spans[r], _mm256_or_si256(_mm256_subs_epu8(x, q), _mm256_subs_epu8(q, x)))
                } else {
                    _mm256_add_epi64(spans[r], _mm256_sad_epu8(x, q))
                };
                if WHAT == BRAY_CURTIS {
                    // SAFETY: in bounds, as the caller promises.
                    let n = unsafe { _mm256_loadu_si256(queries[r].as_ptr().add(stride + at + step).cast()) };
                    plus[r] = _mm256_add_epi64(plus[r], _mm256_sad_epu8(x, n));
                }
            }
        }
        (spans, plus)
    }

    /// lp's `S` on 64-byte blocks, and a last one of 32, with AVX-512: `s_i`
    /// in bytes, then 16 lanes of f32 at a time.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BW; bounds as `spans_avx512`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn powers_avx512<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (stride, quarters): (usize, u32),
    ) -> [f32; R] {
        let mut sums = [_mm512_setzero_ps(); R];
        // SAFETY: the CPU has AVX-512F.
        let mut add = |r: usize, apart: __m128i| unsafe {
            sums[r] = _mm512_add_ps(sums[r], power::<__m512, K>(apart, quarters));
        };
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_512(bytes, starts[r] + at, queries[r], at) };
                add(r, _mm512_castsi512_si128(apart));
                add(r, _mm512_extracti32x4_epi32::<1>(apart));
                add(r, _mm512_extracti32x4_epi32::<2>(apart));
                add(r, _mm512_extracti32x4_epi32::<3>(apart));
            }
            at += 64;
        }
        // SAFETY: the same bounds, for the last 32 bytes if any.
        let tail = unsafe { powers_avx2::<K, R>(bytes, starts, queries, (at, stride - at), quarters) };
        std::array::from_fn(|r| _mm512_reduce_add_ps(sums[r]) + tail[r])
    }

    /// `powers_avx512` with AVX2 over the `len` bytes from `at` (a
    /// multiple of 32), 8 lanes of f32 at a time.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn powers_avx2<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
        quarters: u32,
    ) -> [f32; R] {
        let mut sums = [_mm256_setzero_ps(); R];
        // SAFETY: the CPU has AVX2.
        let mut add = |r: usize, apart: __m128i| unsafe {
            sums[r] = _mm256_add_ps(sums[r], power::<__m256, K>(apart, quarters));
        };
        for step in (at..at + len).step_by(32) {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_256(bytes, starts[r] + step, queries[r], step) };
                let (apart, apart_high) = (_mm256_castsi256_si128(apart), _mm256_extracti128_si256::<1>(apart));
                add(r, apart);
                add(r, _mm_srli_si128::<8>(apart));
                add(r, apart_high);
                add(r, _mm_srli_si128::<8>(apart_high));
            }
        }
        sums.map(|v| {
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps::<1>(v, v)))
        })
    }

    /// lp's `s_i = |c_i - d_i|` (the module doc) of the 64 stored codes at
    /// `bytes[row..]` and the query's at `query[at..]`, with AVX-512BW.
    ///
    /// # Safety
    /// The CPU must have AVX-512BW; both must hold 64 bytes there.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn steps_512(bytes: &[u8], row: usize, query: &[u8], at: usize) -> __m512i {
        // SAFETY: in bounds, as the caller promises.
        let (x, q) = unsafe { pair_512(bytes, row, query, at) };
        _mm512_or_si512(_mm512_subs_epu8(x, q), _mm512_subs_epu8(q, x))
    }

    /// `steps_512` of 32 codes, with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2; both must hold 32 bytes there.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn steps_256(bytes: &[u8], row: usize, query: &[u8], at: usize) -> __m256i {
        // SAFETY: in bounds, as the caller promises.
        let (x, q) = unsafe { pair_256(bytes, row, query, at) };
        _mm256_or_si256(_mm256_subs_epu8(x, q), _mm256_subs_epu8(q, x))
    }

    /// lp's `S` for p = `K`, 2 or 3, in integers (the module doc), on
    /// 64-byte blocks and a last one of 32, with AVX-512BW and VNNI: for
    /// p = 2, `s_i^2` by `vpdpbusd` (a byte times a signed byte, so `s_i`
    /// at most 127); for p = 3, `s_i^2` by `vpmullw`, times `s_i` by
    /// `vpdpwssd`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW and VNNI; bounds as `spans_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn whole_avx512<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> [u64; R] {
        let highest = _mm512_set1_epi8(if K == 3 { CUBED_MAX as i8 } else { SQUARED_MAX as i8 });
        let zero = _mm512_setzero_si512();
        let (mut lanes, mut sums) = ([zero; R], [0u64; R]);
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_512(bytes, starts[r] + at, queries[r], at) };
                let low = _mm512_min_epu8(apart, highest);
                lanes[r] = if K == 3 {
                    // The bytes widened to 16 bits in another order, which
                    // a sum does not mind.
                    let mut lane = lanes[r];
                    for s in [_mm512_unpacklo_epi8(low, zero), _mm512_unpackhi_epi8(low, zero)] {
                        lane = _mm512_dpwssd_epi32(lane, _mm512_mullo_epi16(s, s), s);
                    }
                    lane
                } else {
                    _mm512_dpbusd_epi32(lanes[r], low, low)
                };
            }
            at += 64;
            // Each lane takes at most 4 x 181^3 (or 4 x 127^2) a block: 64
            // blocks stay below 2^31.
            if (at / 64).is_multiple_of(64) {
                for r in 0..R {
                    sums[r] += sum_lanes(lanes[r]);
                    lanes[r] = zero;
                }
            }
        }
        // SAFETY: the same bounds, for the last 32 bytes if any.
        let tail = unsafe { whole_avx2::<K, R>(bytes, starts, queries, (at, stride - at)) };
        std::array::from_fn(|r| sums[r] + sum_lanes(lanes[r]) + tail[r])
    }

    /// lp's `sum T(s_i)` (`PowerTable`) of each row against its query, on
    /// 64-byte blocks with AVX-512 VBMI's byte lookups (two `vpermi2b` and
    /// a blend for each of the three bytes of `T`), summed by `vpdpbusd`,
    /// and a last block of 32 one value at a time.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, BW, VBMI and VNNI; bounds as
    /// `spans_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    pub(super) unsafe fn table_avx512<const R: usize>(
        table: &PowerTable,
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        stride: usize,
    ) -> [u64; R] {
        // SAFETY: 2 x 64 bytes each.
        let tables = table.bytes.each_ref().map(|bytes| unsafe {
            [_mm512_loadu_si512(bytes.as_ptr().cast()), _mm512_loadu_si512(bytes.as_ptr().add(64).cast())]
        });
        let (one, zero, highest) = (_mm512_set1_epi8(1), _mm512_setzero_si512(), _mm512_set1_epi8(TABLE_MAX as i8));
        let mut sums = [[zero; 3]; R];
        let mut at = 0;
        while at + 64 <= stride {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_512(bytes, starts[r] + at, queries[r], at) };
                let low = _mm512_min_epu8(apart, highest);
                for (sum, [below, above]) in sums[r].iter_mut().zip(&tables) {
                    *sum = _mm512_dpbusd_epi32(*sum, _mm512_permutex2var_epi8(*below, low, *above), one);
                }
            }
            at += 64;
        }
        // Each lane adds at most 4 x 255 a block: below 2^31 for 65,536
        // values.
        std::array::from_fn(|r| {
            let [low, middle, high] = sums[r].map(|sum| _mm512_reduce_add_epi32(sum) as u32 as u64);
            let tail: u64 = (at..stride)
                .map(|i| {
                    // SAFETY: in bounds, as the caller promises.
                    let (x, q) = unsafe { (*bytes.get_unchecked(starts[r] + i), *queries[r].get_unchecked(i)) };
                    table.power(x.abs_diff(q))
                })
                .sum();
            low + (middle << 8) + (high << 16) + tail
        })
    }

    /// The sum of sixteen non-negative i32 lanes, in 64 bits.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum_lanes(v: __m512i) -> u64 {
        let low = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(v));
        let high = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(v));
        _mm512_reduce_add_epi64(_mm512_add_epi64(low, high)) as u64
    }

    /// `whole_avx512` with AVX2 over the `len` bytes from `at` (a multiple
    /// of 32).
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `spans_avx512`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn whole_avx2<const K: u32, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        queries: [&[u8]; R],
        (at, len): (usize, usize),
    ) -> [u64; R] {
        let highest = _mm256_set1_epi8(if K == 3 { CUBED_MAX as i8 } else { SQUARED_MAX as i8 });
        let zero = _mm256_setzero_si256();
        let (mut lanes, mut sums) = ([zero; R], [0u64; R]);
        for (n, step) in (at..at + len).step_by(32).enumerate() {
            for r in 0..R {
                // SAFETY: in bounds, as the caller promises.
                let apart = unsafe { steps_256(bytes, starts[r] + step, queries[r], step) };
                let low = _mm256_min_epu8(apart, highest);
                // The bytes widened to 16 bits in another order, which a
                // sum does not mind.
                for s in [_mm256_unpacklo_epi8(low, zero), _mm256_unpackhi_epi8(low, zero)] {
                    let terms =
                        if K == 3 { _mm256_madd_epi16(_mm256_mullo_epi16(s, s), s) } else { _mm256_madd_epi16(s, s) };
                    lanes[r] = _mm256_add_epi32(lanes[r], terms);
                }
            }
            // Each lane takes at most 4 x 181^3 (or 4 x 127^2) a block: 64
            // blocks stay below 2^31.
            if (n + 1).is_multiple_of(64) {
                for r in 0..R {
                    sums[r] += sum_lanes_avx2(lanes[r]);
                    lanes[r] = _mm256_setzero_si256();
                }
            }
        }
        std::array::from_fn(|r| sums[r] + sum_lanes_avx2(lanes[r]))
    }

    /// The sum of eight non-negative i32 lanes, in 64 bits.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum_lanes_avx2(v: __m256i) -> u64 {
        let low = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(v));
        let high = _mm256_cvtepu32_epi64(_mm256_extracti128_si256::<1>(v));
        sum_of(_mm256_add_epi64(low, high))
    }

    /// The f32 lanes lp's powers are raised in, on each instruction set.
    trait Floats: Copy {
        /// The first lanes' bytes of `bytes`, as f32.
        ///
        /// # Safety
        /// The CPU must have this type's instructions.
        unsafe fn of_bytes(bytes: __m128i) -> Self;
        /// # Safety
        /// The CPU must have this type's instructions.
        unsafe fn mul(self, other: Self) -> Self;
        /// `x / sqrt(x)` with the approximate reciprocal square root (the
        /// module doc), `max(x, 1)` under the root so that 0 stays 0.
        ///
        /// # Safety
        /// The CPU must have this type's instructions.
        unsafe fn root(self) -> Self;
    }

    impl Floats for __m512 {
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn of_bytes(bytes: __m128i) -> __m512 {
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes))
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn mul(self, other: __m512) -> __m512 {
            _mm512_mul_ps(self, other)
        }
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn root(self) -> __m512 {
            _mm512_mul_ps(self, _mm512_rsqrt14_ps(_mm512_max_ps(self, _mm512_set1_ps(1.0))))
        }
    }

    impl Floats for __m256 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn of_bytes(bytes: __m128i) -> __m256 {
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn mul(self, other: __m256) -> __m256 {
            _mm256_mul_ps(self, other)
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn root(self) -> __m256 {
            _mm256_mul_ps(self, _mm256_rsqrt_ps(_mm256_max_ps(self, _mm256_set1_ps(1.0))))
        }
    }

    /// `s^p` of the integers `s` in the first lanes' bytes of `apart`, for
    /// `p` of whole part `K` and `quarters` beyond: the whole power by
    /// products, then the square and fourth roots (`Floats::root`).
    ///
    /// # Safety
    /// The CPU must have `F`'s instructions.
    #[inline(always)]
    unsafe fn power<F: Floats, const K: u32>(apart: __m128i, quarters: u32) -> F {
        // SAFETY: as the caller promises.
        unsafe {
            let s = F::of_bytes(apart);
            let mut power = s;
            for _ in 1..K {
                power = power.mul(s);
            }
            if quarters != 0 {
                let square = s.root();
                if quarters & 2 != 0 {
                    power = power.mul(square);
                }
                if quarters & 1 != 0 {
                    power = power.mul(square.root());
                }
            }
            power
        }
    }

    /// The largest of 32 u8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn max_of(v: __m256i) -> u32 {
        let v = _mm_max_epu8(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<8>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<4>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<2>(v));
        let v = _mm_max_epu8(v, _mm_srli_si128::<1>(v));
        (_mm_cvtsi128_si32(v) & 0xff) as u32
    }
}
