//! A growable buffer whose first element starts a page, in pages of its own.
//!
//! The kernels read rows 64 bytes at a time. A `Vec` from the allocator
//! starts 16 bytes past a line (glibc's large blocks), so every such load
//! of a row whose stride is a multiple of 64 bytes would straddle two
//! lines and cost two. The rows' vectors and their int8 codes are kept in
//! an `Aligned` instead: an anonymous map of whole pages, viewed as a
//! slice of `T`.
//!
//! It grows in place or is moved by its page tables (`mremap`), never
//! copied. An over-aligned `Vec` is copied to fresh memory at each
//! doubling, every page of it faulted in and cleared once more: on a
//! virtual machine that was the larger part of applying a stream of
//! inserts (a follower catching up stalled 1.3 s at 65,536 rows of 768
//! values). Dropped, its pages go straight back to the system.
//!
//! A small one (under `MAPPED_BYTES_MIN`) is whole lines from the
//! allocator instead: a map per empty index would spend the system's
//! limit on maps (`vm.max_map_count`, 65,530 by default) at a few tens of
//! thousands of indexes, and an index created past it would fail.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use memmap2::{Advice, MmapMut, MmapOptions, RemapOptions};
use rayon::prelude::*;

/// The granularity of a map's size; a map starts a page, so a line too.
const PAGE_BYTES: usize = 4096;

/// From this size on, the values live in a map of their own.
const MAPPED_BYTES_MIN: usize = 1 << 20;

/// The pages `fault_in` asks for at a time, on one thread.
const FAULT_IN_CHUNK_BYTES: usize = 8 << 20;

/// One cache line, the unit a small one holds.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: 64 bytes at an alignment of 64: no padding, and every bit
// pattern is a `Line`.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `Copy` and 'static.
unsafe impl Pod for Line {}

/// Where the values live. Every byte of either is initialized.
enum Room {
    /// Whole lines, every one of them in use or zero (its length is the
    /// room, not what is used).
    Heap(Vec<Line>),
    Mapped(MmapMut),
}

/// `len` values of `T` from the start of a page, zero past `len` to the
/// end of the map.
pub struct Aligned<T> {
    /// Invariant: every byte of the room past the first `len` values is
    /// zero, and the room holds at least `len` values.
    room: Room,
    len: usize,
    kind: PhantomData<T>,
}

impl<T: Pod> Aligned<T> {
    /// `T` must divide a line evenly: values then never straddle the
    /// map's end, and a `T` is never aligned past a page.
    const SIZE: usize = {
        assert!(size_of::<T>() > 0 && 64 % size_of::<T>() == 0);
        size_of::<T>()
    };

    pub fn new() -> Aligned<T> {
        Aligned { room: Room::Heap(Vec::new()), len: 0, kind: PhantomData }
    }

    /// `len` zero values, from pages the system gives zeroed: they are
    /// written once, by what fills them (a snapshot loaded), not first
    /// with zeros.
    pub fn zeroed(len: usize) -> Aligned<T> {
        let mut aligned = Aligned::new();
        aligned.reserve_exact(len);
        aligned.len = len;
        aligned
    }

    /// A copy of `values`.
    pub fn from_slice(values: &[T]) -> Aligned<T> {
        let mut aligned = Aligned::new();
        aligned.reserve_exact(values.len());
        aligned.extend_from_slice(values);
        aligned
    }

    /// Faults in the room's pages now, on the threads of the pool it is
    /// called from at once: for one about to be filled whole (a state
    /// loaded), whose fresh pages a single thread writing it would fault
    /// in and clear one after another. Only advice: where the system
    /// cannot, the pages come in as they are written.
    pub fn fault_in(&self) {
        self.fault_in_bytes(0..usize::MAX);
    }

    /// `fault_in` for the room's bytes in `range` (cut to the room).
    pub fn fault_in_bytes(&self, range: std::ops::Range<usize>) {
        let Room::Mapped(map) = &self.room else { return };
        let (start, end) = (range.start.min(map.len()), range.end.min(map.len()));
        let chunks = (end - start).div_ceil(FAULT_IN_CHUNK_BYTES);
        (0..chunks).into_par_iter().for_each(|chunk| {
            let offset = start + chunk * FAULT_IN_CHUNK_BYTES;
            let len = FAULT_IN_CHUNK_BYTES.min(end - offset);
            let _ = map.advise_range(Advice::PopulateWrite, offset, len);
        });
    }

    /// Bytes of room it has now.
    fn capacity_bytes(&self) -> usize {
        match &self.room {
            Room::Heap(lines) => lines.len() * size_of::<Line>(),
            Room::Mapped(map) => map.len(),
        }
    }

    /// Room for `len` values in all, allocated now.
    pub fn reserve_exact(&mut self, len: usize) {
        self.grow_to(Self::bytes(len));
    }

    /// Room for `len` values in all: at least double what it had when it
    /// must grow, so a stream of appends moves it a logarithmic number
    /// of times.
    fn reserve(&mut self, len: usize) {
        let bytes = Self::bytes(len);
        if bytes > self.capacity_bytes() {
            self.grow_to(bytes.max(2 * self.capacity_bytes()));
        }
    }

    /// `len` values' size in bytes, which must fit the address space.
    fn bytes(len: usize) -> usize {
        len.checked_mul(Self::SIZE).expect("an index's size in bytes fits a usize")
    }

    /// Room for `bytes` in all: whole lines while small, whole pages of a
    /// map from `MAPPED_BYTES_MIN` on. What is gained is zero, as the
    /// invariant asks.
    fn grow_to(&mut self, bytes: usize) {
        if bytes <= self.capacity_bytes() {
            return;
        }
        match &mut self.room {
            Room::Heap(lines) if bytes < MAPPED_BYTES_MIN => {
                lines.resize(bytes.div_ceil(size_of::<Line>()), Line([0; 64]));
            }
            Room::Heap(lines) => {
                let size = bytes.next_multiple_of(PAGE_BYTES);
                let mut map = MmapOptions::new().len(size).map_anon().expect("memory for an index's rows");
                huge_pages(&map);
                let held: &[u8] = bytemuck::cast_slice(lines);
                map[..held.len()].copy_from_slice(held);
                self.room = Room::Mapped(map);
            }
            Room::Mapped(map) => {
                let size = bytes.next_multiple_of(PAGE_BYTES);
                // SAFETY: `&mut self` holds the only access to the map: no
                // slice of it lives across this call, so its moving leaves
                // nothing pointing at the old address.
                let moved = unsafe { map.remap(size, RemapOptions::new().may_move(true)) };
                moved.expect("memory for an index's rows");
                huge_pages(map);
            }
        }
    }

    /// Makes it `len` values long: those added are zero.
    pub fn resize(&mut self, len: usize) {
        let old = self.len;
        if len < old {
            // What is cut off goes back to zero, as past `len` must be.
            bytemuck::fill_zeroes(&mut self[len..old]);
        } else {
            self.reserve(len);
        }
        self.len = len;
    }

    /// Drops the values from `len` on.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.resize(len);
        }
    }

    pub fn extend_from_slice(&mut self, values: &[T]) {
        let start = self.len;
        self.resize(start + values.len());
        self[start..].copy_from_slice(values);
    }

    /// The first value's address, to read through: the room's start (an
    /// empty `Vec`'s is dangling, aligned for a line).
    #[inline]
    fn start(&self) -> *const T {
        match &self.room {
            Room::Heap(lines) => lines.as_ptr().cast(),
            Room::Mapped(map) => map.as_ptr().cast(),
        }
    }

    /// `start`, to write through: taken from the room mutably, as writes
    /// must be.
    #[inline]
    fn start_mut(&mut self) -> *mut T {
        match &mut self.room {
            Room::Heap(lines) => lines.as_mut_ptr().cast(),
            Room::Mapped(map) => map.as_mut_ptr().cast(),
        }
    }
}

impl<T> Aligned<T> {
    /// Whether a child forked from now on gets the values: with `false` a
    /// map is left out of the child's address space (`MADV_DONTFORK`), so
    /// the fork copies none of its page tables and the parent's writes to
    /// it fault no copies while the child lives; `true` gives it back to
    /// later forks. A small one, in the allocator's heap, is always
    /// inherited. Only advice: where the system refuses, the child gets the
    /// map as before.
    pub fn inherit(&self, inherited: bool) {
        #[cfg(target_os = "linux")]
        if let Room::Mapped(map) = &self.room {
            let _ = map.advise(if inherited { Advice::DoFork } else { Advice::DontFork });
        }
        #[cfg(not(target_os = "linux"))]
        let _ = inherited;
    }
}

/// Asks for the map in huge pages (where the system gives them on request):
/// a fork (a snapshot, a download) then copies a 2 MiB page's one entry
/// rather than 512, so the loop it stops waits that much less, and scans
/// miss the TLB less. Only advice: without it the map works the same.
fn huge_pages(map: &MmapMut) {
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

impl<T: Pod> Default for Aligned<T> {
    fn default() -> Aligned<T> {
        Aligned::new()
    }
}

/// The view is taken once per row in the scans' inner loops: a pointer and
/// a length, no checks to repeat.
impl<T: Pod> Deref for Aligned<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the room holds at least `len` values of `T` (the
        // invariant), starts a line (a `Vec<Line>`, or a map, which starts
        // a page), so is aligned for `T` (a `T` divides 64 bytes, `SIZE`),
        // and every bit pattern is a `T` (`Pod`); every byte of the room
        // is initialized (lines written, a map's pages zero where never
        // written). Empty, `len` is 0 and the dangling start is aligned.
        // The slice borrows `self`, so the room neither moves nor is freed
        // while it lives.
        unsafe { std::slice::from_raw_parts(self.start(), self.len) }
    }
}

impl<T: Pod> AsRef<[T]> for Aligned<T> {
    fn as_ref(&self) -> &[T] {
        self
    }
}

impl<T: Pod> DerefMut for Aligned<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the slice the only
        // access to those values, the room is private to its `Aligned`,
        // and the address was taken from it mutably.
        unsafe { std::slice::from_raw_parts_mut(self.start_mut(), self.len) }
    }
}

/// Length only: these hold whole indexes.
impl<T> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} values", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grown row by row past many pages (moved by `mremap` on the way),
    /// it keeps its values and its alignment, and zeros past its end when
    /// cut and grown again.
    #[test]
    fn grows_without_losing_values_and_keeps_zeros_past_its_end() {
        let mut values = Aligned::<f32>::new();
        assert!(values.is_empty());
        let row: Vec<f32> = (0..771).map(|i| i as f32).collect();
        for n in 0..2000 {
            values.extend_from_slice(&row);
            values[n * 771] = n as f32;
            let mapped = matches!(values.room, Room::Mapped(_));
            assert_eq!(values.as_ptr() as usize % if mapped { PAGE_BYTES } else { 64 }, 0);
        }
        for (n, chunk) in values.chunks(771).enumerate() {
            assert_eq!(chunk[0], n as f32);
            assert_eq!(&chunk[1..], &row[1..]);
        }
        values.truncate(5);
        values.resize(3_000_000);
        assert_eq!(&values[..5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(values[5..].iter().all(|&x| x == 0.0));
        assert!(matches!(values.room, Room::Mapped(_)));
        let zeroed = Aligned::<u8>::zeroed(5 << 20);
        zeroed.fault_in();
        assert!(zeroed.len() == 5 << 20 && zeroed.iter().all(|&b| b == 0));
        // Faulting pages in changes no value, nor the zeros past the end.
        values.fault_in_bytes(8..5_000_000);
        values.fault_in_bytes(usize::MAX - 1..usize::MAX);
        values.fault_in();
        assert_eq!(&values[..5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(values[5..].iter().all(|&x| x == 0.0));
        assert!(matches!(zeroed.room, Room::Mapped(_)));
    }

    #[test]
    fn small_ones_start_a_line_and_keep_zeros_past_their_end() {
        let mut values = Aligned::<f32>::new();
        for n in 0..100 {
            values.extend_from_slice(&[n as f32; 7]);
            assert_eq!(values.as_ptr() as usize % 64, 0);
        }
        assert_eq!(values.len(), 700);
        assert!(values.chunks(7).enumerate().all(|(n, chunk)| chunk == [n as f32; 7]));
        values.truncate(10);
        values.resize(20);
        assert_eq!(&values[..], &[[0.0; 7].as_slice(), &[1.0; 3], &[0.0; 10]].concat()[..]);
        let mut bytes = Aligned::<u8>::zeroed(3);
        bytes.copy_from_slice(&[1, 2, 3]);
        bytes.resize(1);
        bytes.resize(64);
        assert_eq!(&bytes[..], &[[1u8].as_slice(), &[0; 63]].concat()[..]);
        assert_eq!(&Aligned::<u64>::from_slice(&[7, 8])[..], &[7, 8]);
        // Small ones take no map of their own (the system limits maps).
        assert!(matches!(values.room, Room::Heap(_)) && matches!(bytes.room, Room::Heap(_)));
    }
}
