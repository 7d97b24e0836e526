//! Levels: the first pass of Canberra and js, on the logarithmic codes,
//! through `Grids` with the bounds their own modules prove (`codes::ratios`,
//! `codes::shannon`).

use super::{vbmi, Floor, Grids};
use crate::store::codes::{ratios, shannon, Codes, Int8, Kernel, BLOCK};
use crate::store::kernels::BOUND_SURPLUS;

impl Grids {
    /// Canberra's and js's constants for `query` (`Grids::encode`): their
    /// kernels' least distance as a factor of the exact one and the
    /// subnormals' loss; for Canberra whether signs must be compared, for
    /// js whether the CPU has the lookups.
    pub(super) fn prepare_levels(&mut self, codes: &Codes, query: &[f32]) {
        let n = query.len() as f64;
        if self.floor == Floor::Canberra {
            self.factor = (1.0 - 3.0 * 2f64.powi(-24)) * (1.0 - self.relative) * (1.0 - BOUND_SURPLUS);
            self.absolute = n * 2f64.powi(-149);
            self.signed = codes.negatives() > 0 || query.iter().any(|&q| q < 0.0);
        } else {
            self.factor = (1.0 - 2f64.powi(-15)) * (1.0 - self.relative) * (1.0 - BOUND_SURPLUS);
            self.absolute = n * 2f64.powi(-148);
            self.vbmi = vbmi();
        }
    }

    /// Canberra's sums of bases and slopes (`ratios`) of `rows` against the
    /// query's codes in `slots`.
    #[inline(always)]
    pub(super) fn ratio_sums<const R: usize>(
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
    pub(super) fn shannon_sums<const R: usize>(
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

    /// The least Canberra distance the kernel can find for a row whose
    /// codes give `sums` (`ratios`).
    #[inline(always)]
    pub(super) fn canberra_floor(&self, sums: (u64, i64)) -> f64 {
        let bound = ratios::bound(sums, self.stride);
        bound * self.factor - self.absolute
    }

    /// The least js distance the kernel can find for a row of the scale in
    /// `slot` whose codes give `sum` (`shannon`).
    #[inline(always)]
    pub(super) fn shannon_floor(&self, sum: u64, slot: usize) -> f64 {
        sum as f64 * shannon::unit(self.sides[slot].0) * self.factor - self.absolute
    }
}

#[cfg(test)]
impl Grids {
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
}
