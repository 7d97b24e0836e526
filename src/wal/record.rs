//! The single node's records: encoding a `Mutation`, decoding a record back.
//! Their framing (length, type, checks) is `frame`'s; their payloads:
//!
//! ```text
//! name    = len:u8 bytes
//! create  (1) = name dims:u32 metric:u8 [p:f32]    (0 cosine, 1 l2, 2 ip, 3 l1, 4 linf,
//!                                                   5 lp (the only one with p), 6 canberra,
//!                                                   7 bc, 8 js)
//! drop    (2) = name
//! upsert  (3) = name dims:u32 count:u32 { id:i64 meta_len:u32 meta }*count  f32*(count*dims)
//! delete  (4) = name count:u32 id:i64*count
//! restore (5) = name image                         (a whole index: its snapshot file's bytes,
//!                                                   `snapshot.rs`, CRC included)
//! ```
//! A restore is one record, so that a crash leaves the index restored
//! whole or not at all.
//! All integers and floats are little-endian.

use std::fmt;
use std::path::Path;

use super::frame::{self, DecodeError, Reader};
use crate::snapshot;
use crate::store::{Batch, Index, Metric, Mutation};

const CREATE: u8 = 1;
const DROP: u8 = 2;
const UPSERT: u8 = 3;
const DELETE: u8 = 4;
const RESTORE: u8 = 5;

/// A decoded record, owning its data.
#[derive(Debug, PartialEq)]
pub enum Record {
    Create { name: String, dims: usize, metric: Metric },
    Drop { name: String },
    Upsert { name: String, batch: Batch },
    Delete { name: String, ids: Vec<i64> },
    Restore { name: String, index: Restored },
}

/// A restored index, loaded from its record's image (and checked by its CRC).
pub struct Restored(pub Box<Index>);

impl fmt::Debug for Restored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Restored({} rows of {} dimensions)", self.0.len(), self.0.dims())
    }
}

impl PartialEq for Restored {
    fn eq(&self, other: &Restored) -> bool {
        let (a, b) = (&self.0, &other.0);
        a.dims() == b.dims() && a.metric() == b.metric() && a.parts() == b.parts()
    }
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
            Record::Restore { name, .. } => unreachable!("index {name}'s restore replays as a whole index"),
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
    let start = frame::begin(out);
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
    frame::end(out, start, kind);
}

/// Appends the record of a restore: index `name`, whose snapshot image
/// (checked, `snapshot::load_image`) is `image`.
pub fn encode_restore(name: &str, image: &[u8], out: &mut Vec<u8>) {
    let start = frame::begin(out);
    put_name(out, name);
    out.extend_from_slice(image);
    frame::end(out, start, RESTORE);
}

/// Decodes the record at the start of `bytes`; returns it and its length.
pub fn decode(bytes: &[u8]) -> Result<(Record, usize), DecodeError> {
    frame::decode(bytes, read)
}

/// The record of type `kind` whose payload `payload` holds.
fn read(kind: u8, payload: &mut Reader<'_>) -> Option<Record> {
    Some(match kind {
        CREATE => {
            let name = payload.name()?;
            let dims = payload.u32()?;
            let code = payload.u8()?;
            let p = if Metric::code_has_power(code) { payload.f32()? } else { 0.0 };
            let metric = Metric::from_code(code, p)?;
            if dims == 0 {
                return None;
            }
            Record::Create { name, dims, metric }
        }
        DROP => Record::Drop { name: payload.name()? },
        UPSERT => {
            let name = payload.name()?;
            let dims = payload.u32()?;
            let count = payload.u32()?;
            // Every item needs at least 12 bytes: refuse counts the payload cannot hold.
            if count > payload.left() / 12 {
                return None;
            }
            let mut batch = Batch::default();
            for item in 0..count {
                batch.ids.push(payload.i64()?);
                let len = payload.u32()?;
                let start = batch.metadata.len();
                batch.metadata.extend_from_slice(payload.take(len)?);
                batch.metadata_spans.push((start as u32, len as u32));
                batch.vector_spans.push(((item * dims) as u32, dims as u32));
            }
            let floats = payload.take(count.checked_mul(dims)?.checked_mul(4)?)?;
            batch.values = floats.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            Record::Upsert { name, batch }
        }
        RESTORE => {
            let name = payload.name()?;
            let image = payload.take(payload.left())?;
            let index = snapshot::load_image(image, Path::new("a restore record")).ok()?;
            Record::Restore { name, index: Restored(Box::new(index)) }
        }
        DELETE => {
            let name = payload.name()?;
            let count = payload.u32()?;
            if count > payload.left() / 8 {
                return None;
            }
            let ids = (0..count).map(|_| payload.i64()).collect::<Option<Vec<i64>>>()?;
            Record::Delete { name, ids }
        }
        _ => return None,
    })
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
    fn a_restore_is_one_record_of_its_image() {
        let mut aligned = crate::store::aligned::Aligned::<f32>::zeroed(4);
        aligned.copy_from_slice(&[1.0, 2.0, -3.0, 0.25]);
        let metadata = vec![crate::store::index::Text::from_slice(b"{\"a\":1}"), Default::default()];
        let index = Index::from_parts(2, Metric::L2, vec![4, -9], aligned, metadata).unwrap();
        let mut image = Vec::new();
        snapshot::write_image(&mut image, &index).unwrap();
        let mut log = Vec::new();
        encode_restore("kept", &image, &mut log);
        let (record, len) = decode(&log).unwrap();
        assert_eq!(len, log.len());
        let Record::Restore { name, index: restored } = &record else { panic!("{record:?}") };
        assert_eq!((name.as_str(), restored), ("kept", &Restored(Box::new(index))));
        // A frame whose checksum holds around an image that does not is damage.
        let mut bad_image = image.clone();
        bad_image[30] ^= 1;
        let mut log = Vec::new();
        encode_restore("kept", &bad_image, &mut log);
        assert!(matches!(decode(&log), Err(DecodeError::Corrupt(_))), "{:?}", decode(&log));
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
