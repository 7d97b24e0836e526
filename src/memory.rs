//! Giving freed memory back to the system.
//!
//! glibc's allocator keeps the free space of its heap for the next
//! allocation, and returns it only from the heap's top: after a large
//! request, its buffers' pages stay resident even once freed. `give_back`
//! asks it to return every free page (`malloc_trim`). Other allocators
//! return memory their own way, and this does nothing there.
//!
//! glibc gives threads arenas of their own, and `malloc_trim` returns the
//! free top of the main arena only: the event loop runs on a thread of the
//! scan pool, so what a large request freed there could stay resident for
//! good (one or two 13 MB bodies of an ingest, in about one load in five,
//! in `large_requests_leave_no_buffers_resident`). `one_arena`
//! keeps every thread on the main arena; the loop is the one thread that
//! allocates much, and the scans allocate next to nothing, so they contend
//! for little.

/// When to give back a reused buffer that large requests grew: not while
/// they keep coming, for the next would fault the same tens of megabytes
/// in afresh, but at the first sweep after one with none.
#[derive(Debug, Default)]
pub struct Linger {
    /// Whether a large request used the buffer since the last sweep.
    used: bool,
    /// Whether the buffer may still be as large requests grew it.
    kept: bool,
}

impl Linger {
    /// A large request used the buffer.
    pub fn used(&mut self) {
        self.used = true;
    }

    /// At a sweep: whether to give the buffer back now.
    pub fn quiet(&mut self) -> bool {
        if std::mem::take(&mut self.used) {
            self.kept = true;
            false
        } else {
            std::mem::take(&mut self.kept)
        }
    }
}

/// Returns the allocator's free pages to the system, where the allocator
/// is glibc's.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory; it takes no pointer
    // and is safe to call at any time from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps every thread's allocations in glibc's main arena, which
/// `give_back` returns in full. Called before any thread starts.
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` takes no pointer; called before other threads
    // exist, it changes only how later allocations choose their arena.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The most glibc lets `M_MMAP_THRESHOLD` be on 64 bits: allocations up to
/// it can come from the heap.
const HEAP_ALLOCATION_BYTES_MAX: libc::c_int = 32 << 20;

/// For a batch tool rather than a server: keeps freed memory for the next
/// allocation instead of returning it. A tool that makes a buffer of tens
/// of MB for each batch (Parquet's levels and pages, an export's arrays)
/// would otherwise have it mapped afresh and faulted in, page by page,
/// every time: a fifth of an export's time. Called before any thread starts.
pub fn keep_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` takes no pointer; called before other threads
    // exist, it changes only where later allocations come from and when
    // free memory is returned.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_ALLOCATION_BYTES_MAX);
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::Linger;

    #[test]
    fn a_buffer_lingers_while_large_requests_keep_coming() {
        let mut linger = Linger::default();
        // Never used: nothing to give back.
        assert!(!linger.quiet());
        linger.used();
        // Used since the last sweep: kept.
        assert!(!linger.quiet());
        linger.used();
        assert!(!linger.quiet());
        // A whole interval without one: given back, once.
        assert!(linger.quiet());
        assert!(!linger.quiet());
    }
}
