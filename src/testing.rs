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

/// Which of `path`'s pages are in the page cache.
pub fn cached_pages(path: &std::path::Path) -> Vec<bool> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a read-only mapping of a file nothing cuts while it is
    // mapped; mincore writes one byte a page into `pages`, which has
    // room for every page of it; the mapping is undone before return.
    unsafe {
        let page = crate::files::page_bytes() as usize;
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED);
        let mut pages = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(map, len, pages.as_mut_ptr()), 0);
        libc::munmap(map, len);
        pages.iter().map(|&p| p & 1 == 1).collect()
    }
}

/// A directory for `test` on the project's disk (`/tmp` may be a tmpfs,
/// whose pages stay) whose filesystem drops the pages it is advised to,
/// as a probe shows first. Where it keeps them (ZFS, tmpfs): none, and a
/// skip recorded.
pub fn dir_that_drops_pages(test: &str) -> Option<tempfile::TempDir> {
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).unwrap();
    let dir = tempfile::tempdir_in(target).unwrap();
    let probe = dir.path().join("probe");
    let file = std::fs::File::create(&probe).unwrap();
    (&file).write_all(&vec![1u8; 1 << 20]).unwrap();
    file.sync_data().unwrap();
    crate::files::forget_cached(&file, 0, 1 << 20);
    if cached_pages(&probe).iter().all(|&c| c) {
        skip(test, "this filesystem keeps pages it is advised to drop");
        return None;
    }
    Some(dir)
}
