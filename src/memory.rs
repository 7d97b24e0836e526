//! Giving freed memory back to the system.
//!
//! glibc's allocator keeps the free space of its heap for the next
//! allocation, and returns it only from the heap's top: after a large
//! request, its buffers' pages stay resident even once freed. `give_back`
//! asks it to return every free page (`malloc_trim`). Other allocators
//! return memory their own way, and this does nothing there.

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
