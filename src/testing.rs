//! Support for unit tests that depend on the CPU.
//!
//! A test that cannot run on this machine must not pass quietly: `skip`
//! says so on the terminal (past the test harness's capture of output) and
//! adds a line to the file that `QUIVER_SKIPPED_TESTS` names, which `make
//! test` counts and lists at its end. A test that skips must first check,
//! asking the CPU itself, that the machine really lacks what it needs, so
//! that a path not taken on a machine that has it fails instead.

use std::io::Write;

/// Whether this CPU has AVX-512 F and BF16, asked of the CPU directly.
pub fn cpu_has_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Records that `test` did not run here, because of `why`.
pub fn skip(test: &str, why: &str) {
    let line = format!("skipped: {test} ({why})\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("QUIVER_SKIPPED_TESTS") {
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// Those of `all` this CPU `has`; a skip, recorded, for each other one
/// (`name` names it in the line, after `what`).
pub fn on_this_cpu<T: Copy>(
    all: &[T],
    what: &str,
    name: impl Fn(T) -> &'static str,
    has: impl Fn(T) -> bool,
) -> Vec<T> {
    all.iter()
        .copied()
        .filter(|&item| {
            has(item) || {
                skip(&format!("{what}, {}", name(item)), "this CPU lacks its instructions");
                false
            }
        })
        .collect()
}
