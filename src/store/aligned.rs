//! A growable buffer whose first element starts a cache line.
//!
//! The kernels read rows 64 bytes at a time. A `Vec` from the allocator
//! starts 16 bytes past a line (glibc's large blocks), so every such load
//! of a row whose stride is a multiple of 64 bytes straddles two lines and
//! costs two. The rows' vectors and their int8 codes are kept in an
//! `Aligned` instead: held as whole lines, viewed as a slice of `T`.

use std::ops::{Deref, DerefMut};

use bytemuck::Pod;

/// One cache line of bytes, the unit an `Aligned` holds.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: 64 bytes at an alignment of 64: no padding, and every bit
// pattern is a `Line`.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `Copy` and 'static.
unsafe impl Pod for Line {}

/// `len` values of `T` from the start of a line, zero past `len` to the
/// end of the last line.
pub struct Aligned<T> {
    lines: Vec<Line>,
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
        Aligned { lines: Vec::new(), len: 0, kind: std::marker::PhantomData }
    }

    /// `len` zero values, cleared by the allocator in one pass (not a
    /// line at a time, as `resize` would).
    pub fn zeroed(len: usize) -> Aligned<T> {
        Aligned {
            lines: bytemuck::allocation::zeroed_vec(len.div_ceil(Self::PER_LINE)),
            len,
            kind: std::marker::PhantomData,
        }
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
        let lines = len.div_ceil(Self::PER_LINE);
        self.lines.reserve_exact(lines.saturating_sub(self.lines.len()));
    }

    /// Makes it `len` values long: those added are zero.
    pub fn resize(&mut self, len: usize) {
        let old = self.len;
        if len < old {
            // What is cut off goes back to zero, as past `len` must be.
            bytemuck::fill_zeroes(&mut self.all_mut()[len..old]);
        }
        self.lines.resize(len.div_ceil(Self::PER_LINE), Line([0; 64]));
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
        bytemuck::cast_slice_mut(&mut self.lines)
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
        &bytemuck::cast_slice(&self.lines)[..self.len]
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
