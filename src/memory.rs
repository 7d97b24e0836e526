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
