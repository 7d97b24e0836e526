//! A growable buffer whose first element starts a cache line.
//!
//! The kernels read rows 64 bytes at a time. A `Vec` from the allocator
//! starts 16 bytes past a line (glibc's large blocks), so every such load
//! of a row whose stride is a multiple of 64 bytes straddles two lines and
//! costs two. The rows' vectors and their int8 codes are kept in an
//! `Aligned` instead: held as whole lines, viewed as a slice of `T`.
//!
//! A large one lives in pages of its own (an anonymous map): it grows in
//! place or is moved by its page tables (`mremap`), where an over-aligned
//! `Vec` is copied to fresh memory at each doubling, every page of it
//! faulted in and cleared once more (on a virtual machine, the larger part
//! of applying a stream of inserts).

use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use memmap2::{MmapMut, MmapOptions, RemapOptions};

/// One cache line of bytes, the unit an `Aligned` holds.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: 64 bytes at an alignment of 64: no padding, and every bit
// pattern is a `Line`.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `Copy` and 'static.
unsafe impl Pod for Line {}

/// From this size on, lines live in a map of their own.
const MAPPED_BYTES_MIN: usize = 1 << 20;

/// The granularity of a map's size.
const PAGE_BYTES: usize = 4096;

/// Where the lines live. Invariant (mapped): every byte of the map past
/// the `used` lines is zero.
enum Lines {
    Heap(Vec<Line>),
    Mapped { map: MmapMut, used: usize },
}

impl Lines {
    fn as_slice(&self) -> &[Line] {
        match self {
            Lines::Heap(lines) => lines,
            Lines::Mapped { map, used } => &bytemuck::cast_slice(map)[..*used],
        }
    }

    fn as_mut_slice(&mut self) -> &mut [Line] {
        match self {
            Lines::Heap(lines) => lines,
            Lines::Mapped { map, used } => &mut bytemuck::cast_slice_mut(map)[..*used],
        }
    }

    /// Room for `lines` in all; `exact`, or at least double what there was.
    fn reserve(&mut self, lines: usize, exact: bool) {
        let bytes = lines.checked_mul(size_of::<Line>()).expect("an index's size in bytes fits a usize");
        match self {
            Lines::Heap(heap) if bytes < MAPPED_BYTES_MIN => {
                let more = lines.saturating_sub(heap.len());
                if exact {
                    heap.reserve_exact(more);
                } else {
                    heap.reserve(more);
                }
            }
            Lines::Heap(heap) => {
                let size = if exact { bytes } else { bytes.max(2 * heap.capacity() * size_of::<Line>()) };
                // Fresh anonymous pages are zero: the invariant holds.
                let mut map = MmapOptions::new()
                    .len(size.next_multiple_of(PAGE_BYTES))
                    .map_anon()
                    .expect("memory for an index's rows");
                let used = heap.len();
                bytemuck::cast_slice_mut(&mut map)[..used].copy_from_slice(heap);
                *self = Lines::Mapped { map, used };
            }
            Lines::Mapped { map, .. } if bytes > map.len() => {
                let size = if exact { bytes } else { bytes.max(2 * map.len()) };
                // SAFETY: `&mut self` holds the only access to the map:
                // no slice of it lives across this call, so its moving
                // leaves nothing pointing at the old address. The pages
                // it gains are zero, as the invariant asks.
                unsafe { map.remap(size.next_multiple_of(PAGE_BYTES), RemapOptions::new().may_move(true)) }
                    .expect("memory for an index's rows");
            }
            Lines::Mapped { .. } => {}
        }
    }

    /// Makes it `lines` long; lines added are zero. Lines cut off must be
    /// zero already (the invariant).
    fn resize(&mut self, lines: usize) {
        self.reserve(lines, false);
        match self {
            Lines::Heap(heap) => heap.resize(lines, Line([0; 64])),
            Lines::Mapped { used, .. } => *used = lines,
        }
    }
}

/// `len` values of `T` from the start of a line, zero past `len` to the
/// end of the last line.
pub struct Aligned<T> {
    lines: Lines,
    len: usize,
    kind: std::marker::PhantomData<T>,
}

impl<T: Pod> Aligned<T> {
    /// Values of `T` a line holds (`T` must divide 64 bytes evenly).
    const PER_LINE: usize = {
        assert!(size_of::<T>() > 0 && 64 % size_of::<T>() == 0);
        64 / size_of::<T>()
    };

    pub fn new() -> Aligned<T> {
        Aligned { lines: Lines::Heap(Vec::new()), len: 0, kind: std::marker::PhantomData }
    }

    /// `len` zero values, from memory the system gives zeroed: its pages
    /// are written once, by what fills them (a snapshot loaded), not first
    /// with zeros. Huge pages are asked for where it is mapped
    /// (`memory::advise_huge`): filling it then takes a 512th of the page
    /// faults, and a scan misses the TLB as much less. (Not for one grown
    /// row by row: its last huge page would be cleared whole for a row.)
    pub fn zeroed(len: usize) -> Aligned<T> {
        let mut aligned = Aligned::new();
        aligned.lines.reserve(len.div_ceil(Self::PER_LINE), true);
        if let Lines::Mapped { map, .. } = &aligned.lines {
            crate::memory::advise_huge(map.as_ptr() as usize, map.len());
        }
        aligned.resize(len);
        aligned
    }

    /// A copy of `values`.
    pub fn from_slice(values: &[T]) -> Aligned<T> {
        let mut aligned = Aligned::new();
        aligned.reserve_exact(values.len());
        aligned.extend_from_slice(values);
        aligned
    }

    /// Room for `len` values in all, allocated now.
    pub fn reserve_exact(&mut self, len: usize) {
        self.lines.reserve(len.div_ceil(Self::PER_LINE), true);
    }

    /// Makes it `len` values long: those added are zero.
    pub fn resize(&mut self, len: usize) {
        let old = self.len;
        if len < old {
            // What is cut off goes back to zero, as past `len` must be.
            bytemuck::fill_zeroes(&mut self.all_mut()[len..old]);
        }
        self.lines.resize(len.div_ceil(Self::PER_LINE));
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

    /// Every value the lines hold, `len` and the zeros after.
    fn all_mut(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(self.lines.as_mut_slice())
    }
}

impl<T: Pod> Default for Aligned<T> {
    fn default() -> Aligned<T> {
        Aligned::new()
    }
}

impl<T: Pod> Deref for Aligned<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(self.lines.as_slice())[..self.len]
    }
}

impl<T: Pod> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let len = self.len;
        &mut self.all_mut()[..len]
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

    /// Past `MAPPED_BYTES_MIN` it moves to a map of its own and grows
    /// there, values kept, zeros past the end, cut and grown again.
    #[test]
    fn grows_into_a_map_of_its_own_and_keeps_its_values() {
        let mut values = Aligned::<f32>::new();
        let row: Vec<f32> = (0..771).map(|i| i as f32).collect();
        for n in 0..2000 {
            values.extend_from_slice(&row);
            values[n * 771] = n as f32;
        }
        assert!(matches!(values.lines, Lines::Mapped { .. }));
        assert_eq!(values.as_ptr() as usize % 64, 0);
        for (n, chunk) in values.chunks(771).enumerate() {
            assert_eq!(chunk[0], n as f32);
            assert_eq!(&chunk[1..], &row[1..]);
        }
        values.truncate(5);
        values.resize(3_000_000);
        assert_eq!(&values[..5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(values[5..].iter().all(|&x| x == 0.0));
        let zeroed = Aligned::<u8>::zeroed(5 << 20);
        assert!(matches!(zeroed.lines, Lines::Mapped { .. }) && zeroed.iter().all(|&b| b == 0));
    }

    #[test]
    fn starts_a_line_and_keeps_zeros_past_its_end() {
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
    }
}
