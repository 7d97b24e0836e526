//! Which instructions this process scans with, chosen once, at start.
//!
//! One binary runs fast on every x86-64: the kernels are compiled for each
//! instruction set, and the widest this CPU has is picked here, not when
//! the binary was built. Every search of the process then takes the same
//! path, so lone, batched and filtered searches score every pair alike;
//! between paths only rounding may differ (a fused multiply-add or not).

use std::sync::OnceLock;

/// The f32 kernels' instructions, as asked for (`--simd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    /// The widest this CPU has.
    Auto,
    /// AVX-512F: 16 lanes, fused multiply-adds.
    Avx512,
    /// AVX2 and FMA: 8 lanes, fused multiply-adds.
    Avx2,
    /// What every x86-64 has (SSE2), or the target's baseline elsewhere.
    Baseline,
}

impl Simd {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Auto => "auto",
            Simd::Avx512 => "avx512",
            Simd::Avx2 => "avx2",
            Simd::Baseline => "baseline",
        }
    }
}

/// The f32 kernels a process runs: a name only. The functions that run
/// them are `unsafe` with the CPU's check their caller's promise, or take
/// them from `Paths`, which only `Paths::choose` makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F32 {
    Avx512,
    Avx2,
    Baseline,
}

impl F32 {
    pub fn name(self) -> &'static str {
        match self {
            F32::Avx512 => "AVX-512",
            F32::Avx2 => "AVX2+FMA",
            F32::Baseline => "baseline (SSE2 on x86-64)",
        }
    }

    /// Whether this CPU can run them.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                F32::Avx512 => has!("avx512f"),
                F32::Avx2 => has!("avx2") && has!("fma"),
                F32::Baseline => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == F32::Baseline
        }
    }
}

/// The instructions an int8 kernel is written for: a name only, which any
/// code may hold. What runs them is a `Kernel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8 {
    /// AVX-512 VNNI's `vpdpbusd` on 64 bytes at a time.
    Vnni512,
    /// AVX-VNNI's `vpdpbusd` on 32 bytes at a time.
    Vnni256,
    /// AVX2's `vpmaddubsw` and `vpmaddwd` on 32 bytes at a time.
    Avx2,
}

impl Int8 {
    /// Every kernel, widest first.
    pub const ALL: [Int8; 3] = [Int8::Vnni512, Int8::Vnni256, Int8::Avx2];

    pub fn name(self) -> &'static str {
        match self {
            Int8::Vnni512 => "AVX-512 VNNI",
            Int8::Vnni256 => "AVX-VNNI",
            Int8::Avx2 => "AVX2",
        }
    }

    /// Whether this CPU has the instructions, asked of the CPU itself.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                Int8::Vnni512 => has!("avx512f") && has!("avx512bw") && has!("avx512vnni"),
                Int8::Vnni256 => has!("avx2") && has!("avxvnni"),
                Int8::Avx2 => has!("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

/// An int8 kernel this CPU runs (`codes` defines what it computes,
/// `Kernel::dots_of`). Its field is private and `Kernel::on_this_cpu` is the only
/// way to make one, after asking the CPU, so that every safe function that
/// takes a `Kernel` (`codes`, its `floors`, and the scans) may run its
/// instructions: no safe code can hand it one the CPU lacks.
///
/// ```
/// use quiver::store::cpu::{Int8, Kernel};
/// for isa in Int8::ALL {
///     assert_eq!(Kernel::on_this_cpu(isa).map(Kernel::isa), isa.available().then_some(isa));
/// }
/// ```
///
/// ```compile_fail,E0603
/// // No kernel without the check: the field is private.
/// let kernel = quiver::store::cpu::Kernel(quiver::store::cpu::Int8::Vnni512);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel(Int8);

impl Kernel {
    /// The kernel of `isa`, if this CPU has its instructions.
    pub fn on_this_cpu(isa: Int8) -> Option<Kernel> {
        isa.available().then_some(Kernel(isa))
    }

    /// The instructions it runs.
    pub fn isa(self) -> Int8 {
        self.0
    }

    pub fn name(self) -> &'static str {
        self.0.name()
    }
}

/// The paths this process scans with. Its fields are private and only
/// `choose` makes one, from what the CPU has: the safe functions that run
/// a path's instructions (`kernels::tile_here`, the scans) rely on it, and
/// `set` cannot be handed paths the CPU lacks.
///
/// ```
/// use quiver::store::cpu::{Paths, Simd};
/// let paths = Paths::choose(Simd::Auto, true).unwrap();
/// assert!(paths.f32().available() && paths.int8().is_none_or(|kernel| kernel.isa().available()));
/// quiver::store::cpu::set(paths).unwrap();
/// ```
///
/// ```compile_fail,E0451
/// // No paths without the check: the fields are private.
/// use quiver::store::cpu::{Paths, F32};
/// quiver::store::cpu::set(Paths { f32: F32::Avx512, int8: None }).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paths {
    f32: F32,
    /// The int8 first pass's kernel (`codes`), if it runs.
    int8: Option<Kernel>,
}

impl Paths {
    /// The widest paths this CPU has within `simd`, the int8 pass only if
    /// `int8`; an error if the CPU lacks what `simd` names.
    pub fn choose(simd: Simd, int8: bool) -> Result<Paths, String> {
        let f32 = match simd {
            Simd::Auto => [F32::Avx512, F32::Avx2, F32::Baseline].into_iter().find(|f| f.available()),
            Simd::Avx512 => Some(F32::Avx512).filter(|f| f.available()),
            Simd::Avx2 => Some(F32::Avx2).filter(|f| f.available()),
            Simd::Baseline => Some(F32::Baseline),
        };
        let Some(f32) = f32 else {
            return Err(format!("--simd {}: this CPU lacks its instructions", simd.name()));
        };
        // The int8 kernels that fit within the f32 path's instructions.
        let allowed: &[Int8] = match f32 {
            F32::Avx512 => &Int8::ALL,
            F32::Avx2 => &[Int8::Vnni256, Int8::Avx2],
            F32::Baseline => &[],
        };
        let int8 = if int8 { allowed.iter().find_map(|&isa| Kernel::on_this_cpu(isa)) } else { None };
        Ok(Paths { f32, int8 })
    }

    /// The f32 kernels' instructions.
    pub fn f32(&self) -> F32 {
        self.f32
    }

    /// The int8 first pass's kernel, if it runs.
    pub fn int8(&self) -> Option<Kernel> {
        self.int8
    }

    /// How the log names them.
    pub fn describe(&self) -> String {
        let int8 = self.int8.map_or("off".to_string(), |k| k.name().to_string());
        format!("f32 kernels {}, int8 first pass {int8}", self.f32.name())
    }
}

static PATHS: OnceLock<Paths> = OnceLock::new();

/// Fixes the paths for this process; an error if they were already fixed
/// (by an earlier call or a search) to others.
pub fn set(paths: Paths) -> Result<(), String> {
    let fixed = *PATHS.get_or_init(|| paths);
    if fixed == paths {
        Ok(())
    } else {
        Err(format!("the scan paths were already fixed: {}", fixed.describe()))
    }
}

/// The paths this process scans with: those `set`, else the widest this
/// CPU has.
#[inline]
pub fn paths() -> Paths {
    *PATHS.get_or_init(|| Paths::choose(Simd::Auto, true).expect("the widest paths this CPU has"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_chosen_is_one_this_cpu_has() {
        for simd in [Simd::Auto, Simd::Avx512, Simd::Avx2, Simd::Baseline] {
            for int8 in [true, false] {
                match Paths::choose(simd, int8) {
                    Ok(paths) => {
                        assert!(paths.f32().available());
                        assert!(paths.int8().is_none_or(|k| k.isa().available()) && (int8 || paths.int8().is_none()));
                    }
                    Err(_) => assert!(matches!(simd, Simd::Avx512 | Simd::Avx2)),
                }
            }
        }
        assert_eq!(Paths::choose(Simd::Baseline, true).unwrap().int8(), None);
    }
}
