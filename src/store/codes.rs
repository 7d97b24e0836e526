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
//! `a` is the least f32 not below `m / 127` (at least f32's smallest
//! positive value), and the code `c_i` is `v_i / a` rounded to the nearest
//! integer, clamped to [-127, 127]. The residual `e = v - a c` is computed
//! exactly in f64 (a value minus a product of 24 and 8 significant bits,
//! both within 2^9 of each other's exponent, fits in f64's 53), and `r`, an
//! upper bound on its Euclidean norm, is kept rounded up. A zero vector has
//! scale 0, codes 0 and `r = 0`.
//!
//! # Why a ruled-out row cannot belong in the answer
//! Let `q` be the query with scale `b`, code `d` and residual `f = q - b d`
//! (norm at most `r_q`), and `x` a row with `a`, `c`, `e` (norm at most
//! `r_x`). `C = sum c_i d_i` is computed exactly, in integers (the kernels
//! sum `(c_i + 128) d_i`, at most 255 x 127 x 65,536 < 2^31 in magnitude:
//! indexes of more dimensions keep no codes).
//! Exactly, in real numbers,
//!
//! `s = q . x = a b C + b (d . e) + f . x`,
//!
//! and by Cauchy-Schwarz, with `|b d| <= |q| + |f|`,
//! `|s - a b C| <= (|q| + r_q) r_x + |x| r_q =: E`, where `|q|`, `|x|` are
//! the norms' upper bounds the bfloat16 pass also uses (infinite above
//! 2^60, which makes every bound infinite and rules nothing out).
//!
//! The f32 kernel's score `s_f` is within `g sum|q_i x_i| + A`, at most
//! `g |q||x| + A`, of `s`, where `g = kernels::relative_error(n)` (the
//! kernels' error model, stated and argued there: `m 2^-24 / (1 - m 2^-24)`
//! for at most `m = n / 4 + 64` roundings), and `A = (2n + 64) 2^-149`
//! covers results that fall among f32's subnormals. For l2 the kernel sums `(q_i - x_i)^2`, non-negative terms
//! each off by at most `3 x 2^-24` of itself, so that
//! `d_f >= d (1 - g - 2^-20) - A` with `d = |q|^2 + |x|^2 - 2 s`.
//!
//! The bounds are evaluated in f64, where nothing overflows or underflows
//! for f32 inputs, each off by at most a few 2^-53 of the magnitudes summed;
//! a surplus of `2^-40` of those magnitudes (`kernels::BOUND_SURPLUS`)
//! covers it. So:
//! - cosine and ip: `s_f <= S = a b C + E + g |q||x| + A` (plus the
//!   surplus); `S` is rounded up to f32 and mapped to a distance exactly as
//!   `s_f` is (`screen::distance`, or a negation): the map is monotone, so
//!   the result is no farther than the row's exact distance;
//! - l2: `d_f >= (|q|^2 + |x|^2 - 2 (a b C + E)) (1 - g - 2^-20) - A`, less
//!   the surplus, with the squared norms rounded down.
//!
//! A row is ruled out only when that nearest possible distance is strictly
//! farther than the farthest its search keeps: its exact distance is at
//! least as far, so it could not have entered (a tie could, being broken by
//! id). Every other row is scored exactly. A NaN anywhere rules nothing out.
//!
//! For random data of 768 dimensions `E` is about 0.008 of `|q||x|`, against
//! cosines spread over about 0.036: only rows near the k-th nearest are
//! scored twice.

use super::aligned::Aligned;
use super::cpu::{Int8, Kernel};
use super::kernels::{f32_at_least, relative_error, BOUND_SURPLUS};
use super::screen;

pub mod floors;
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
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Kernel` exists only where the CPU has its
        // instructions (`Kernel::on_this_cpu`); the loads stay inside
        // `bytes` and the queries' padded buffers (asserted).
        unsafe {
            let signs = queries.map(|code| &code.signs[..]);
            let raw: [[i32; R]; Q] = match self.isa() {
                Int8::Vnni512 => x86::dots_vnni512(bytes, starts, signs, dims),
                Int8::Vnni256 => x86::dots_vnni256(bytes, starts, signs, dims),
                Int8::Avx2 => {
                    let magnitudes = queries.map(|code| &code.magnitude[..]);
                    return x86::dots_avx2(bytes, starts, magnitudes, signs, dims);
                }
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
    let (scale, mut sum) = (f64::from(scale), 0);
    let mut codes = [0i8; CHUNK];
    let mut residuals = [0.0f64; CHUNK];
    for (c, chunk) in v.chunks(CHUNK).enumerate() {
        for ((&x, code), residual) in chunk.iter().zip(&mut codes).zip(&mut residuals) {
            let rounded = round_half_away((f64::from(x) / scale).clamp(-127.0, 127.0));
            *residual = f64::from(x) - scale * rounded;
            *code = integer_of(rounded);
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

/// `x` (at most 127 in magnitude) rounded to the nearest integer, halves
/// away from zero, exactly as `f64::round` (a library call in a build for
/// any x86-64, which keeps the loop out of vector registers): adding and
/// taking away 2^52 rounds `|x|` to the nearest, halves to even, exactly;
/// an even neighbour taken at a half is then one short.
#[inline(always)]
fn round_half_away(x: f64) -> f64 {
    const TWO_52: f64 = 4_503_599_627_370_496.0;
    let magnitude = x.abs();
    let even = (magnitude + TWO_52) - TWO_52;
    let rounded = even + if magnitude - even == 0.5 { 1.0 } else { 0.0 };
    rounded.copysign(x)
}

/// The integer `x` (from -127 to 127) is: adding 1.5 x 2^52 puts it, in
/// two's complement, in the low bits of the sum's mantissa.
#[inline(always)]
fn integer_of(x: f64) -> i8 {
    (x + 6_755_399_441_055_744.0).to_bits() as i8
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

/// An f32 not below `x`, without a branch: `x` nudged up by 2^-23 of
/// itself and 2^-148, then rounded to nearest (off by at most 2^-24 of
/// itself, or 2^-150 among the subnormals), so never below `x`; infinite
/// above f32's range.
#[inline(always)]
fn f32_above(x: f64) -> f32 {
    (x + x.abs() * 2f64.powi(-23) + 2f64.powi(-148)) as f32
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
    /// Powers of two and logarithmic only: how many rows have each exponent
    /// field (`exponent_of`), so that a search codes its query only for
    /// those.
    exponents: Vec<u32>,
    /// Logarithmic only: how many rows hold a negative value (a sign bit),
    /// so that searches of indexes without one skip the signs.
    negatives: u32,
}

impl Codes {
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
        for v in vectors.chunks_exact(dims) {
            codes.push(v);
        }
        Some(codes)
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
    }

    /// Asks for the codes of `rows` rows from `row` (those there are) to
    /// be brought into cache, without waiting for them.
    #[inline(always)]
    pub fn prefetch(&self, row: usize, rows: usize) {
        let start = (row * self.stride).min(self.bytes.len());
        let end = ((row + rows) * self.stride).min(self.bytes.len());
        // The logarithmic grid's sign bits are left to the hardware's
        // prefetcher: the scans read them in order, and only where a value
        // is negative; a test here costs every scan of every grid.
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        for line in self.bytes[start..end].iter().step_by(64) {
            safe_arch::prefetch_t0(line);
        }
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
        let _ = (start, end);
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
        self.stride + signs + 8
    }
}

/// A query's code: its codes `d` as the kernels want them (zero after the
/// last, to a whole block), their sum, its scale and its residual bound.
/// Its buffers are kept from search to search.
#[derive(Debug, Default)]
pub struct QueryCode {
    dims: usize,
    /// `d_i`: `vpdpbusd`'s signed operand, and AVX2's `vpsignb`'s.
    signs: Vec<i8>,
    /// `|d_i|`, for AVX2's `vpmaddubsw`.
    magnitude: Vec<u8>,
    sum: i32,
    scale: f32,
    residual: f32,
}

impl QueryCode {
    /// The code of `query`.
    pub fn of(query: &[f32]) -> QueryCode {
        let mut code = QueryCode::default();
        code.encode(query);
        code
    }

    /// Makes this the code of `query`, in the buffers it has.
    pub fn encode(&mut self, query: &[f32]) {
        let padded = query.len().next_multiple_of(SLACK);
        self.signs.clear();
        self.signs.resize(padded, 0);
        let signs = &mut self.signs;
        let Encoded { scale, sum, residual } =
            encode(query, Grid::Fitted, |at, d| signs[at..at + d.len()].copy_from_slice(d));
        self.magnitude.clear();
        self.magnitude.extend(self.signs.iter().map(|d| d.unsigned_abs()));
        (self.dims, self.sum, self.scale, self.residual) = (query.len(), sum, scale, residual);
    }

    /// The query's codes.
    #[cfg(test)]
    pub fn signs(&self) -> &[i8] {
        &self.signs[..self.dims]
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
/// field of its queries in one load.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    shape: Shape,
    /// `b`, as f64.
    scale: [f64; QUERIES_MAX],
    /// `|q| + r_q` and `r_q` (upper bounds).
    query_plus: [f64; QUERIES_MAX],
    query_residual: [f64; QUERIES_MAX],
    /// `g |q|`, with `|q|` an upper bound.
    relative_norm: [f64; QUERIES_MAX],
    /// `|q|^2`, rounded down (l2).
    query_squared: [f64; QUERIES_MAX],
    /// The query's scale in cosine's distance.
    query_scale: [f32; QUERIES_MAX],
    /// `g`, and `A`: the index's dimensions fix them.
    relative: f64,
    absolute: f64,
}

impl Bounds {
    /// For `queries` (at most `QUERIES_MAX`, their `squared_norms` from
    /// `kernels::squared_norm`, `query_scales` their scales in cosine's
    /// distance).
    pub fn new(shape: Shape, queries: &[QueryCode], squared_norms: &[f64], query_scales: &[f32]) -> Bounds {
        assert!(queries.len() <= QUERIES_MAX);
        assert!(queries.len() == squared_norms.len() && queries.len() == query_scales.len());
        let dims = queries.first().map_or(0, |code| code.dims);
        let relative = relative_error(dims);
        let mut bounds = Bounds {
            shape,
            scale: [0.0; QUERIES_MAX],
            query_plus: [0.0; QUERIES_MAX],
            query_residual: [0.0; QUERIES_MAX],
            relative_norm: [0.0; QUERIES_MAX],
            query_squared: [0.0; QUERIES_MAX],
            query_scale: [0.0; QUERIES_MAX],
            relative,
            absolute: (2 * dims + 64) as f64 * 2f64.powi(-149),
        };
        for (q, ((code, &squared_norm), &query_scale)) in
            queries.iter().zip(squared_norms).zip(query_scales).enumerate()
        {
            assert_eq!(code.dims, dims, "one index's queries");
            let norm = f64::from(screen::norm_bound_of(squared_norm));
            let residual = f64::from(code.residual);
            bounds.scale[q] = f64::from(code.scale);
            bounds.query_plus[q] = norm + residual;
            bounds.query_residual[q] = residual;
            bounds.relative_norm[q] = relative * norm;
            bounds.query_squared[q] = squared_norm * (1.0 - BOUND_SURPLUS);
            bounds.query_scale[q] = query_scale;
        }
        bounds
    }

    /// Which of `R` rows of `codes`, with norm bounds `norms` and (cosine)
    /// scales `row_scales`, are strictly farther than `thresholds[q]`
    /// (infinite where query `q` keeps nothing yet) from the first `Q`
    /// queries whatever their exact scores, given the integer products
    /// `dots[q]` (`C`): bit `r` of the `q`-th answer is set when `rows[r]`
    /// cannot enter query `q`'s nearest. The arithmetic goes pair by pair
    /// without a branch, so that the compiler can do the pairs at once.
    #[inline(always)]
    pub fn rules_out<const Q: usize, const R: usize>(
        &self,
        codes: &Codes,
        rows: [usize; R],
        dots: [[i32; R]; Q],
        (norms, row_scales): ([f32; R], [f32; R]),
        thresholds: [f32; Q],
    ) -> [u32; Q] {
        const { assert!(Q <= QUERIES_MAX) };
        let (scales, residuals) = (rows.map(|row| codes.scales[row]), rows.map(|row| codes.residuals[row]));
        let rows = (scales, residuals, norms, row_scales);
        // Each shape's pairs in a loop of their own: no branch inside.
        match self.shape {
            Shape::Cosine => self.pairs(Shape::Cosine, dots, rows, thresholds),
            Shape::Ip => self.pairs(Shape::Ip, dots, rows, thresholds),
            Shape::L2 => self.pairs(Shape::L2, dots, rows, thresholds),
        }
    }

    /// `rules_out` for `shape`, each row given as its code's scale, its
    /// residual bound, its norm bound and its scale.
    #[inline(always)]
    fn pairs<const Q: usize, const R: usize>(
        &self,
        shape: Shape,
        dots: [[i32; R]; Q],
        (scales, residuals, norms, row_scales): ([f32; R], [f32; R], [f32; R], [f32; R]),
        thresholds: [f32; Q],
    ) -> [u32; Q] {
        let mut ruled = [0; Q];
        for q in 0..Q {
            for r in 0..R {
                let row = (scales[r], residuals[r], norms[r], row_scales[r]);
                let out = self.rules_out_by(shape, q, row, dots[q][r], thresholds[q]);
                ruled[q] |= u32::from(out) << r;
            }
        }
        ruled
    }

    /// Whether one row is ruled out (`rules_out`) for query `q`, of
    /// `shape`, the row's code having scale `row_code_scale` and residual
    /// bound `residual`.
    #[inline(always)]
    fn rules_out_by(
        &self,
        shape: Shape,
        q: usize,
        (row_code_scale, residual, norm, row_scale): (f32, f32, f32, f32),
        dot: i32,
        threshold: f32,
    ) -> bool {
        let estimate = f64::from(row_code_scale) * self.scale[q] * f64::from(dot);
        let norm = f64::from(norm);
        let off = self.query_plus[q] * f64::from(residual) + norm * self.query_residual[q];
        match shape {
            Shape::Cosine | Shape::Ip => {
                let ceiling = estimate + off + self.relative_norm[q] * norm + self.absolute;
                let ceiling = ceiling + BOUND_SURPLUS * (estimate.abs() + ceiling.abs());
                let ceiling = f32_above(ceiling);
                let nearest = match shape {
                    Shape::Cosine => screen::distance(ceiling, row_scale, self.query_scale[q]),
                    _ => -ceiling,
                };
                nearest > threshold
            }
            Shape::L2 => {
                let row_squared = norm * norm * (1.0 - 2f64.powi(-20));
                let query_squared = self.query_squared[q];
                let sum = query_squared + row_squared - 2.0 * (estimate + off);
                let sum = sum - BOUND_SURPLUS * (query_squared + row_squared + 2.0 * (estimate.abs() + off));
                let nearest = sum * (1.0 - self.relative - 2f64.powi(-20)) - self.absolute;
                nearest > f64::from(threshold)
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
        sums.map(|sums| sums.map(|sum| sum256(sum)))
    }

    /// `C = sum c_i d_i` without VNNI: each row byte loses its offset
    /// (`c_i`, never -128), `vpsignb` moves the query's sign onto it, and
    /// `vpmaddubsw` multiplies `|d_i|` (at most 127) by `±c_i`, two products
    /// per i16 (at most 32,258, short of saturating), widened by `vpmaddwd`.
    ///
    /// # Safety
    /// The CPU must have AVX2; bounds as `dots_vnni512`, for `magnitudes`
    /// as for `signs`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dots_avx2<const Q: usize, const R: usize>(
        bytes: &[u8],
        starts: [usize; R],
        magnitudes: [&[u8]; Q],
        signs: [&[i8]; Q],
        dims: usize,
    ) -> [[i32; R]; Q] {
        let (ones, offset) = (_mm256_set1_epi16(1), _mm256_set1_epi8(i8::MIN));
        let mut sums = [[_mm256_setzero_si256(); R]; Q];
        for at in (0..dims).step_by(32) {
            let mut x = [_mm256_setzero_si256(); R];
            for (x, start) in x.iter_mut().zip(starts) {
                // SAFETY: in bounds, as the caller promises.
                let stored = unsafe { _mm256_loadu_si256(bytes.as_ptr().add(start + at).cast()) };
                *x = _mm256_xor_si256(stored, offset);
            }
            for ((sums, magnitude), sign) in sums.iter_mut().zip(magnitudes).zip(signs) {
                // SAFETY: in bounds, as the caller promises.
                let (m, s) = unsafe {
                    (
                        _mm256_loadu_si256(magnitude.as_ptr().add(at).cast()),
                        _mm256_loadu_si256(sign.as_ptr().add(at).cast()),
                    )
                };
                for (sum, &code) in sums.iter_mut().zip(&x) {
                    let pairs = _mm256_maddubs_epi16(m, _mm256_sign_epi8(code, s));
                    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        sums.map(|sums| sums.map(|sum| sum256(sum)))
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
    use super::{encode, integer_of, round_half_away, Grid, NormAbove, CHUNK};

    /// The rounding without a library call is `f64::round` at every half
    /// and beside it, and its integer is the one `as` gives.
    #[test]
    fn rounding_is_the_library_s_at_halves_and_beside_them() {
        for twice in -254i32..=254 {
            let half = f64::from(twice) / 2.0;
            for x in [half, half.next_up(), half.next_down(), half + 1e-9, half - 1e-9] {
                if x.abs() <= 127.0 {
                    assert_eq!(round_half_away(x).to_bits(), x.round().to_bits(), "{x}");
                    assert_eq!(integer_of(round_half_away(x)), x.round() as i8, "{x}");
                }
            }
        }
    }

    /// Each code is its value over the scale rounded, and the residual
    /// bound is not below the residuals' norm, for lengths across chunks.
    #[test]
    fn codes_are_values_over_the_scale_rounded_and_the_bound_holds() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for n in [1usize, 7, 8, 9, CHUNK - 1, CHUNK, CHUNK + 1, 768, 1000] {
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
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

    /// `NormAbove` of `p` is never below the norm of `p` itself, and is
    /// close to it where the values are alike.
    #[test]
    fn norms_of_any_p_are_never_below_the_norm_of_p() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
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
