//! A connection's read buffer: bytes received but not yet consumed.

use std::io::{self, Read};

/// Invariant: `start <= end <= data.len()`. `data[start..end]` holds the bytes
/// received and not yet consumed; `data[end..]` is free space to read into.
/// `data.len()` is the allocated and initialised size, kept between requests.
pub struct ReadBuf {
    data: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    pub fn with_capacity(bytes: usize) -> ReadBuf {
        ReadBuf { data: vec![0; bytes], start: 0, end: 0 }
    }

    #[inline]
    fn check(&self) {
        debug_assert!(self.start <= self.end && self.end <= self.data.len());
    }

    /// The received, unconsumed bytes.
    pub fn pending(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }

    pub fn pending_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.start..self.end]
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Marks `n` pending bytes as consumed.
    pub fn consume(&mut self, n: usize) {
        assert!(n <= self.end - self.start);
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        self.check();
    }

    /// Makes room for at least `total` pending bytes in one contiguous run,
    /// moving the pending bytes to the front or growing as needed.
    pub fn reserve_pending(&mut self, total: usize) {
        if self.data.len() - self.start >= total {
            return;
        }
        self.compact();
        if self.data.len() < total {
            let grown = total.max(self.data.len() * 2);
            self.data.resize(grown, 0);
        }
        self.check();
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.data.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Reads once from `source` into the free space (making at least
    /// `chunk_bytes` of it). Returns what `read` returned.
    pub fn read_from(&mut self, source: &mut impl Read, chunk_bytes: usize) -> io::Result<usize> {
        if self.data.len() - self.end < chunk_bytes {
            self.reserve_pending(self.end - self.start + chunk_bytes);
        }
        let n = source.read(&mut self.data[self.end..])?;
        self.end += n;
        self.check();
        Ok(n)
    }

    /// Appends bytes as if received (tests and fuzzing feed the parser this way).
    pub fn extend(&mut self, bytes: &[u8]) {
        self.reserve_pending(self.end - self.start + bytes.len());
        self.data[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
        self.check();
    }

    /// The bytes it holds room for.
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    /// Gives back memory a large body made us take, once nothing is pending.
    pub fn shrink_when_idle(&mut self, keep_bytes_max: usize, initial_bytes: usize) {
        if self.is_empty() && self.data.len() > keep_bytes_max {
            self.data = vec![0; initial_bytes];
            self.start = 0;
            self.end = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consume_and_reserve_keep_pending_bytes() {
        let mut buf = ReadBuf::with_capacity(8);
        buf.extend(b"abcdef");
        buf.consume(4);
        assert_eq!(buf.pending(), b"ef");
        buf.reserve_pending(20);
        assert_eq!(buf.pending(), b"ef");
        buf.extend(b"0123456789");
        assert_eq!(buf.pending(), b"ef0123456789");
        buf.consume(12);
        assert!(buf.is_empty());
    }
}
