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

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use bytemuck::Pod;
use memmap2::{MmapMut, MmapOptions, RemapOptions};

/// The granularity of a map's size; a map starts a page, so a line too.
const PAGE_BYTES: usize = 4096;

/// One cache line, the alignment the view promises without a map (empty).
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `len` values of `T` from the start of a page, zero past `len` to the
/// end of the map.
pub struct Aligned<T> {
    /// None until it holds something. Invariant: every byte of the map
    /// past the first `len` values is zero, and the map holds at least
    /// `len` values.
    map: Option<MmapMut>,
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
        Aligned { map: None, len: 0, kind: PhantomData }
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

    /// Bytes of room it has now.
    fn capacity_bytes(&self) -> usize {
        self.map.as_ref().map_or(0, |map| map.len())
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

    /// Room for `bytes` in all, in whole pages. The pages gained are
    /// zero, as the invariant asks.
    fn grow_to(&mut self, bytes: usize) {
        if bytes <= self.capacity_bytes() {
            return;
        }
        let size = bytes.next_multiple_of(PAGE_BYTES);
        match &mut self.map {
            None => {
                let map = MmapOptions::new().len(size).map_anon().expect("memory for an index's rows");
                self.map = Some(map);
            }
            Some(map) => {
                // SAFETY: `&mut self` holds the only access to the map: no
                // slice of it lives across this call, so its moving leaves
                // nothing pointing at the old address.
                let moved = unsafe { map.remap(size, RemapOptions::new().may_move(true)) };
                moved.expect("memory for an index's rows");
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

    /// The first value's address, to read through: the map's start, or a
    /// dangling line for no map (then `len` is zero).
    #[inline]
    fn start(&self) -> *const T {
        self.map.as_ref().map_or(NonNull::<Line>::dangling().as_ptr().cast(), |map| map.as_ptr().cast())
    }

    /// `start`, to write through: taken from the map mutably, as writes
    /// must be.
    #[inline]
    fn start_mut(&mut self) -> *mut T {
        self.map.as_mut().map_or(NonNull::<Line>::dangling().as_ptr().cast(), |map| map.as_mut_ptr().cast())
    }
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
        // SAFETY: the map holds at least `len` values of `T` (the
        // invariant), starts a page, so is aligned for `T` (a `T` divides
        // 64 bytes, `SIZE`), and every bit pattern is a `T` (`Pod`); a
        // map's pages are initialized, zero where never written. Without a
        // map `len` is 0 and the dangling start is aligned. The slice
        // borrows `self`, so the map neither moves nor is unmapped while it
        // lives.
        unsafe { std::slice::from_raw_parts(self.start(), self.len) }
    }
}

impl<T: Pod> DerefMut for Aligned<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the slice the only
        // access to those values, a map is private to its `Aligned`, and
        // the address was taken from the map mutably.
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
            assert_eq!(values.as_ptr() as usize % PAGE_BYTES, 0);
        }
        for (n, chunk) in values.chunks(771).enumerate() {
            assert_eq!(chunk[0], n as f32);
            assert_eq!(&chunk[1..], &row[1..]);
        }
        values.truncate(5);
        values.resize(3_000_000);
        assert_eq!(&values[..5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(values[5..].iter().all(|&x| x == 0.0));
        let zeroed = Aligned::<u8>::zeroed(5 << 20);
        assert!(zeroed.len() == 5 << 20 && zeroed.iter().all(|&b| b == 0));
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
    }
}
