//! /api/v1/indexes: create, stats, list, delete.

use super::decode::Creation;
use super::envelope::Envelope;
use super::error::{ApiError, IndexOp};
use super::{find, json, ApiLimits, Reply, Scratch};
use std::path::Path;

use crate::db::Database;
use crate::limits::{INDEX_NAME_BYTES_MAX, INDEX_NAME_BYTES_MIN};
use crate::snapshot::{self, LoadError};
use crate::store::{Metric, MetricError, Mutation, Store};

/// `^[a-z0-9-]{3,32}$`, the upper bound lowered by `--index-name-bytes-max`.
pub fn is_valid_name(name: &str, bytes_max: usize) -> bool {
    (INDEX_NAME_BYTES_MIN..=bytes_max.min(INDEX_NAME_BYTES_MAX)).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether a new index may be made under `name` (create, restore): none
/// holds it, and another fits under `--indexes-max`.
fn room_for(store: &Store, limits: ApiLimits, name: &str) -> Result<(), ApiError> {
    if store.index(name).is_some() {
        return Err(ApiError::IndexExists { name: name.to_owned() });
    }
    if store.len() >= limits.indexes_max {
        return Err(ApiError::TooManyIndexes { max: limits.indexes_max });
    }
    Ok(())
}

pub fn create(
    db: &mut Database,
    scratch: &mut Scratch,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let Reply { out, keep_alive } = reply;
    let Creation { dimensions: dims, metric, p } = scratch.decoder.create(body, limits.dimensions_max)?;
    if !is_valid_name(name, limits.index_name_bytes_max) {
        return Err(ApiError::IndexNameInvalid { name: name.to_owned(), bytes_max: limits.index_name_bytes_max });
    }
    let metric = Metric::parse(&metric, p).map_err(|error| match error {
        MetricError::Unknown => ApiError::InvalidMetric { metric },
        MetricError::LpNeedsP => ApiError::bad_body("p: the lp metric needs a number above 0 and finite"),
    })?;
    room_for(db.store(), limits, name)?;
    db.apply(&Mutation::CreateIndex { name, dims, metric }).map_err(ApiError::Storage)?;
    Ok(Envelope::start(out, 200, keep_alive, format_args!("Index '{name}' created successfully.")).finish())
}

/// `PUT /api/v1/indexes/{name}/restore`: index `name`, new, from a snapshot
/// image (a download's body). Every row is checked as an upsert would
/// check it, so that nothing restored could not have been stored; then the
/// whole index is one log record.
pub fn restore(
    db: &mut Database,
    scratch: &mut Scratch,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let Reply { out, keep_alive } = reply;
    if !is_valid_name(name, limits.index_name_bytes_max) {
        return Err(ApiError::IndexNameInvalid { name: name.to_owned(), bytes_max: limits.index_name_bytes_max });
    }
    room_for(db.store(), limits, name)?;
    let index = snapshot::load_image(body, Path::new("the body")).map_err(|error| match error {
        LoadError::Damaged { why, .. } => ApiError::bad_body(format_args!("body: not a quiver index snapshot ({why})")),
        LoadError::Io { source, .. } => ApiError::bad_body(format_args!("body: {source}")),
    })?;
    if index.dims() > limits.dimensions_max {
        let (dims, max) = (index.dims(), limits.dimensions_max);
        return Err(ApiError::bad_body(format_args!("body: {dims} dimensions, more than --dimensions-max {max}")));
    }
    let (ids, vectors, metadata) = index.parts();
    let (mut copy, mut written) = (Vec::new(), Vec::new());
    for (row, (&id, text)) in ids.iter().zip(metadata).enumerate() {
        let vector = &vectors[row * index.dims()..(row + 1) * index.dims()];
        let checked = index.check_vector(vector).map_err(|error| error.to_string());
        let checked =
            checked.and_then(|()| scratch.decoder.stored_metadata(text, limits.body, (&mut copy, &mut written)));
        if let Err(why) = checked {
            return Err(ApiError::bad_body(format_args!("body: row {row} (id {id}): {why}")));
        }
    }
    let count = index.len();
    db.restore(name, body, index).map_err(ApiError::Storage)?;
    let message = format_args!("Index '{name}' restored with {count} embeddings.");
    Ok(Envelope::start(out, 200, keep_alive, message).finish())
}

pub fn stats(store: &Store, name: &str, reply: Reply<'_>) -> Result<u16, ApiError> {
    let Reply { out, keep_alive } = reply;
    let index = find(store, name, IndexOp::Fetch)?;
    let mut envelope = Envelope::start(out, 200, keep_alive, format_args!("Index '{name}' fetched successfully."));
    let out = envelope.data();
    out.extend_from_slice(b"{\"index_name\":");
    json::write_str(out, name);
    out.extend_from_slice(b",\"dimensions\":");
    json::write_u64(out, index.dims() as u64);
    out.extend_from_slice(b",\"metric\":");
    json::write_str(out, index.metric().name());
    if let Some(p) = index.metric().power() {
        out.extend_from_slice(b",\"p\":");
        json::write_f32(out, p);
    }
    out.extend_from_slice(b",\"count\":");
    json::write_u64(out, index.len() as u64);
    out.push(b'}');
    Ok(envelope.finish())
}

pub fn list(store: &Store, reply: Reply<'_>) -> u16 {
    let Reply { out, keep_alive } = reply;
    let mut envelope = Envelope::start(out, 200, keep_alive, format_args!("Indexes listed successfully."));
    let out = envelope.data();
    out.extend_from_slice(b"{\"indexes\":[");
    for (i, name) in store.names().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json::write_str(out, name);
    }
    out.extend_from_slice(b"]}");
    envelope.finish()
}

pub fn delete(db: &mut Database, name: &str, reply: Reply<'_>) -> Result<u16, ApiError> {
    let Reply { out, keep_alive } = reply;
    find(db.store(), name, IndexOp::Delete)?;
    db.apply(&Mutation::DropIndex { name }).map_err(ApiError::Storage)?;
    Ok(Envelope::start(out, 200, keep_alive, format_args!("Index '{name}' successfully deleted.")).finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_rule() {
        for good in ["abc", "a-1", "0123456789abcdefghij0123456789ab"] {
            assert!(is_valid_name(good, 32), "{good}");
        }
        for bad in ["ab", "ABC", "a_b", "a b", "abc/", "0123456789abcdefghij0123456789abc", "ä-bc"] {
            assert!(!is_valid_name(bad, 32), "{bad}");
        }
        assert!(is_valid_name("abcd", 4));
        assert!(!is_valid_name("abcde", 4));
    }
}
