//! The log's record format: encoding a `Mutation`, decoding a record back.
//!
//! ```text
//! record  = length:u32  type:u8  zero:u8  check:u16  payload:[u8; length]  crc:u32
//! check   = the low 16 bits of CRC32C over the 6 bytes before it, so a damaged
//!           length is caught before it is trusted to say where a record ends
//! crc     = CRC32C over the 8 header bytes and the payload
//! name    = len:u8 bytes
//! create  (1) = name dims:u32 metric:u8 [p:f32]    (0 cosine, 1 l2, 2 ip, 3 l1, 4 linf,
//!                                                   5 lp (the only one with p), 6 canberra,
//!                                                   7 bc, 8 js)
//! drop    (2) = name
//! upsert  (3) = name dims:u32 count:u32 { id:i64 meta_len:u32 meta }*count  f32*(count*dims)
//! delete  (4) = name count:u32 id:i64*count
//! ```
//! All integers and floats are little-endian.

use std::fmt;

use crate::store::{Batch, Metric, Mutation};

pub const HEADER_BYTES: usize = 8;
pub const TRAILER_BYTES: usize = 4;

const CREATE: u8 = 1;
const DROP: u8 = 2;
const UPSERT: u8 = 3;
const DELETE: u8 = 4;

/// A decoded record, owning its data.
#[derive(Debug, PartialEq)]
pub enum Record {
    Create { name: String, dims: usize, metric: Metric },
    Drop { name: String },
    Upsert { name: String, batch: Batch },
    Delete { name: String, ids: Vec<i64> },
}

impl Record {
    /// The mutation this record replays as (every item of an upsert).
    pub fn with_mutation<T>(&self, items: &mut Vec<u32>, f: impl FnOnce(Mutation<'_>) -> T) -> T {
        match self {
            Record::Create { name, dims, metric } => f(Mutation::CreateIndex { name, dims: *dims, metric: *metric }),
            Record::Drop { name } => f(Mutation::DropIndex { name }),
            Record::Upsert { name, batch } => {
                items.clear();
                items.extend(0..batch.len() as u32);
                f(Mutation::Upsert { index: name, batch, items })
            }
            Record::Delete { name, ids } => f(Mutation::Delete { index: name, ids }),
        }
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    let len = u8::try_from(name.len()).expect("index names are at most 32 bytes");
    out.push(len);
    out.extend_from_slice(name.as_bytes());
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).expect("fits a record field").to_le_bytes());
}

/// Appends the record for `mutation` to `out`.
pub fn encode(mutation: &Mutation<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    let kind = match *mutation {
        Mutation::CreateIndex { name, dims, metric } => {
            put_name(out, name);
            put_u32(out, dims);
            out.push(metric.code());
            if let Some(p) = metric.power() {
                out.extend_from_slice(&p.to_le_bytes());
            }
            CREATE
        }
        Mutation::DropIndex { name } => {
            put_name(out, name);
            DROP
        }
        Mutation::Upsert { index, batch, items } => {
            put_name(out, index);
            let dims = items.first().map_or(0, |&item| batch.vector(item as usize).len());
            put_u32(out, dims);
            put_u32(out, items.len());
            for &item in items {
                let metadata = batch.metadata(item as usize);
                out.extend_from_slice(&batch.ids[item as usize].to_le_bytes());
                put_u32(out, metadata.len());
                out.extend_from_slice(metadata);
            }
            for &item in items {
                out.extend_from_slice(bytemuck::cast_slice(batch.vector(item as usize)));
            }
            UPSERT
        }
        Mutation::Delete { index, ids } => {
            put_name(out, index);
            put_u32(out, ids.len());
            for id in ids {
                out.extend_from_slice(&id.to_le_bytes());
            }
            DELETE
        }
    };
    let payload_len = out.len() - start - HEADER_BYTES;
    out[start..start + 4].copy_from_slice(&u32::try_from(payload_len).expect("record under 4 GiB").to_le_bytes());
    out[start + 4] = kind;
    let check = header_check(&out[start..start + 6]);
    out[start + 6..start + 8].copy_from_slice(&check.to_le_bytes());
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

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

/// Decodes the record at the start of `bytes`; returns it and its length.
pub fn decode(bytes: &[u8]) -> Result<(Record, usize), DecodeError> {
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
    let record =
        payload.record(bytes[4]).ok_or_else(|| DecodeError::Corrupt(format!("bad payload of type {}", bytes[4])))?;
    if !payload.bytes.is_empty() {
        return Err(DecodeError::Corrupt("payload longer than its contents".into()));
    }
    Ok((record, total))
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u32(&mut self) -> Option<usize> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
    }

    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn name(&mut self) -> Option<String> {
        let len = usize::from(self.u8()?);
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    fn record(&mut self, kind: u8) -> Option<Record> {
        Some(match kind {
            CREATE => {
                let name = self.name()?;
                let dims = self.u32()?;
                let code = self.u8()?;
                let p =
                    if Metric::code_has_power(code) { f32::from_le_bytes(self.take(4)?.try_into().ok()?) } else { 0.0 };
                let metric = Metric::from_code(code, p)?;
                if dims == 0 {
                    return None;
                }
                Record::Create { name, dims, metric }
            }
            DROP => Record::Drop { name: self.name()? },
            UPSERT => {
                let name = self.name()?;
                let dims = self.u32()?;
                let count = self.u32()?;
                // Every item needs at least 12 bytes: refuse counts the payload cannot hold.
                if count > self.bytes.len() / 12 {
                    return None;
                }
                let mut batch = Batch::default();
                for item in 0..count {
                    batch.ids.push(self.i64()?);
                    let len = self.u32()?;
                    let start = batch.metadata.len();
                    batch.metadata.extend_from_slice(self.take(len)?);
                    batch.metadata_spans.push((start as u32, len as u32));
                    batch.vector_spans.push(((item * dims) as u32, dims as u32));
                }
                let floats = self.take(count.checked_mul(dims)?.checked_mul(4)?)?;
                batch.values = floats.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
                Record::Upsert { name, batch }
            }
            DELETE => {
                let name = self.name()?;
                let count = self.u32()?;
                if count > self.bytes.len() / 8 {
                    return None;
                }
                let ids = (0..count).map(|_| self.i64()).collect::<Option<Vec<i64>>>()?;
                Record::Delete { name, ids }
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_log() -> (Vec<u8>, Vec<usize>) {
        let mut batch = Batch::default();
        for (i, id) in [5i64, -3, 9].into_iter().enumerate() {
            batch.ids.push(id);
            batch.vector_spans.push((batch.values.len() as u32, 2));
            batch.values.extend([id as f32, 0.5 + i as f32]);
            let meta = format!("{{\"k\":\"{i}\"}}");
            batch.metadata_spans.push((batch.metadata.len() as u32, meta.len() as u32));
            batch.metadata.extend_from_slice(meta.as_bytes());
        }
        let mutations = [
            Mutation::CreateIndex { name: "abc", dims: 2, metric: Metric::Ip },
            Mutation::Upsert { index: "abc", batch: &batch, items: &[0, 2] },
            Mutation::Delete { index: "abc", ids: &[5, 77] },
            Mutation::DropIndex { name: "abc" },
        ];
        let mut log = Vec::new();
        let mut ends = Vec::new();
        for m in &mutations {
            encode(m, &mut log);
            ends.push(log.len());
        }
        (log, ends)
    }

    #[test]
    fn records_round_trip() {
        let (log, _) = sample_log();
        let mut at = 0;
        let mut records = Vec::new();
        while at < log.len() {
            let (record, len) = decode(&log[at..]).unwrap();
            records.push(record);
            at += len;
        }
        assert_eq!(records.len(), 4);
        assert_eq!(records[0], Record::Create { name: "abc".into(), dims: 2, metric: Metric::Ip });
        let Record::Upsert { name, batch } = &records[1] else { panic!() };
        assert_eq!((name.as_str(), batch.ids.as_slice()), ("abc", &[5, 9][..]));
        assert_eq!((batch.vector(1), batch.metadata(1)), (&[9.0f32, 2.5][..], &b"{\"k\":\"2\"}"[..]));
        assert_eq!(records[2], Record::Delete { name: "abc".into(), ids: vec![5, 77] });
        assert_eq!(records[3], Record::Drop { name: "abc".into() });
    }

    #[test]
    fn every_cut_inside_a_record_is_truncated_and_every_flip_is_caught() {
        let (log, ends) = sample_log();
        let starts: Vec<usize> = std::iter::once(0).chain(ends.iter().copied()).collect();
        for (n, (&start, &end)) in starts.iter().zip(&ends).enumerate() {
            for cut in start + 1..end {
                assert_eq!(decode(&log[start..cut]).unwrap_err(), DecodeError::Truncated, "record {n} cut at {cut}");
            }
            for flip in start..end {
                let mut damaged = log.clone();
                damaged[flip] ^= 0x20;
                // A damaged length must never pass for a torn tail.
                match decode(&damaged[start..]) {
                    Err(DecodeError::Corrupt(_)) => {}
                    other => panic!("flip at {flip} of record {n}: {other:?}"),
                }
            }
        }
    }
}
