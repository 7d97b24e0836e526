//! The framing every log record shares, whatever its payload:
//!
//! ```text
//! record  = length:u32  type:u8  zero:u8  check:u16  payload:[u8; length]  crc:u32
//! check   = the low 16 bits of CRC32C over the 6 bytes before it, so a damaged
//!           length is caught before it is trusted to say where a record ends
//! crc     = CRC32C over the 8 header bytes and the payload
//! ```
//! All integers are little-endian. The single node's mutations
//! (`record`) and a cluster node's Raft log (`cluster::log`) are payloads
//! in this framing, each with its own types.

use std::fmt;

pub const HEADER_BYTES: usize = 8;
pub const TRAILER_BYTES: usize = 4;

/// Why the bytes at some offset are not a record.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes end before the record does: a torn append.
    Truncated,
    /// A complete record whose checksum or contents are wrong.
    Corrupt(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("record cut short"),
            DecodeError::Corrupt(why) => f.write_str(why),
        }
    }
}

fn header_check(first_six: &[u8]) -> u16 {
    crc32c::crc32c(first_six) as u16
}

/// Starts a record at the end of `out`: write its payload after this, then
/// `end` it. Returns where it starts.
pub fn begin(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    start
}

/// Ends the record begun at `start` (`begin`) as one of type `kind`.
pub fn end(out: &mut Vec<u8>, start: usize, kind: u8) {
    let payload_len = out.len() - start - HEADER_BYTES;
    out[start..start + 4].copy_from_slice(&u32::try_from(payload_len).expect("record under 4 GiB").to_le_bytes());
    out[start + 4] = kind;
    let check = header_check(&out[start..start + 6]);
    out[start + 6..start + 8].copy_from_slice(&check.to_le_bytes());
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Decodes the record at the start of `bytes`, its payload read by `read`
/// (given the record's type), which must read all of it; returns what
/// `read` made and the record's length.
pub fn decode<R>(bytes: &[u8], read: impl FnOnce(u8, &mut Reader<'_>) -> Option<R>) -> Result<(R, usize), DecodeError> {
    if bytes.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated);
    }
    if header_check(&bytes[..6]) != u16::from_le_bytes([bytes[6], bytes[7]]) || bytes[5] != 0 {
        return Err(DecodeError::Corrupt("header checksum mismatch".into()));
    }
    let payload_len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
    let total = HEADER_BYTES + payload_len + TRAILER_BYTES;
    if bytes.len() < total {
        return Err(DecodeError::Truncated);
    }
    let stored = u32::from_le_bytes(bytes[total - 4..total].try_into().unwrap());
    if crc32c::crc32c(&bytes[..total - 4]) != stored {
        return Err(DecodeError::Corrupt("checksum mismatch".into()));
    }
    let mut payload = Reader { bytes: &bytes[HEADER_BYTES..total - 4] };
    let made = read(bytes[4], &mut payload)
        .ok_or_else(|| DecodeError::Corrupt(format!("bad payload of type {}", bytes[4])))?;
    if !payload.bytes.is_empty() {
        return Err(DecodeError::Corrupt("payload longer than its contents".into()));
    }
    Ok((made, total))
}

/// A payload's fields, read in order; `None` where the payload ends first.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// The payload's bytes not read yet.
    pub fn left(&self) -> usize {
        self.bytes.len()
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Option<usize> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    pub fn f32(&mut self) -> Option<f32> {
        Some(f32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    /// A name: its length in a byte, then its UTF-8.
    pub fn name(&mut self) -> Option<String> {
        let len = usize::from(self.u8()?);
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}
