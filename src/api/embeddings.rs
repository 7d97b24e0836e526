//! /api/v1/embeddings: search, insert, upsert, retrieve, delete.

use std::fmt;

use super::decode::{Deletion, Include, Scroll, Search};
use super::envelope::Envelope;
use super::error::{ApiError, IndexOp};
use super::group::{self, Ask, Slot};
use super::{find, json, ApiLimits, Reply, Scratch};
use crate::db::Database;
use crate::store::topk::Candidate;
use crate::store::{Filter, Index, Mutation, Scanner, Store, VectorError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    Insert,
    Upsert,
}

impl Write {
    fn verb(self) -> &'static str {
        match self {
            Write::Insert => "inserted",
            Write::Upsert => "upserted",
        }
    }
}

/// Why one item of an insert or upsert was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    Vector(VectorError),
    AlreadyExists,
    RepeatedInRequest,
}

struct SkipReason(i64, Skip);

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let SkipReason(id, skip) = self;
        match skip {
            Skip::Vector(error) => write!(f, "{error}"),
            Skip::AlreadyExists => write!(f, "embedding with ID {id} already exists"),
            Skip::RepeatedInRequest => write!(f, "embedding with ID {id} appears more than once in this request"),
        }
    }
}

/// Decodes and checks a search body: its query goes into `query`, made
/// ready to scan (`Index::prepare_query`); returns what the search asks
/// for and the rows it may find.
pub fn prepare_search(
    store: &Store,
    decoder: &mut super::decode::Decoder,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    query: &mut Vec<f32>,
) -> Result<(Ask, Option<Filter>), ApiError> {
    let Search { k, include, filter, .. } = decoder.search(body, limits.k_max, limits.body, query)?;
    let index = find(store, name, IndexOp::Fetch)?;
    let divisor = prepare_query(index, query, String::new)?;
    Ok((Ask { k, include, divisor }, filter))
}

/// `Index::prepare_query`, its refusal the search's error, the query named
/// after `place` (`searches[3].` in a batch).
fn prepare_query(index: &Index, query: &mut [f32], place: impl FnOnce() -> String) -> Result<f64, ApiError> {
    index
        .prepare_query(query)
        .map_err(|error| ApiError::SearchFailed { reason: format!("{}queryVector: {error}", place()) })
}

/// Bytes of a reply besides its items: the head, the envelope, its message.
const REPLY_FRAME_BYTES: usize = 512;

/// Most bytes one hit adds to a search reply besides its metadata text and
/// what `include` adds: `"<id>":{"metadata":,"rank":<rank>},`.
const HIT_BYTES_MAX: usize = 64;

/// Fewest bytes one hit adds to a search reply: `"0":{"metadata":{},"rank":0}`
/// and a comma.
const HIT_BYTES_MIN: usize = 28;

/// Most bytes `include` adds to a hit besides its values: `,"score":` and
/// `,"data":[]`.
const INCLUDE_BYTES_MAX: usize = 24;

/// Most bytes one embedding adds to a retrieve reply besides its metadata
/// text and values: `{"id":<id>,"data":[],"metadata":{}},`.
const EMBEDDING_BYTES_MAX: usize = 64;

/// Most bytes one value takes in a reply: the longest shortest form of an
/// f32 (`-1.17549435e-38`, 15) and its comma.
const VALUE_BYTES_MAX: usize = 16;

/// Most bytes one missing id's reason adds to a reply.
const MISSING_BYTES_MAX: usize = 160;

/// Fails with `ReplyTooLarge` if `items` of `per_item` bytes each (on
/// average), `bytes` in all, exceed `max`.
fn check_reply(bytes: usize, items: usize, max: usize, what: &'static str) -> Result<(), ApiError> {
    if bytes <= max {
        return Ok(());
    }
    let per_item = (bytes - REPLY_FRAME_BYTES).div_ceil(items.max(1)).max(1);
    let fit = max.saturating_sub(REPLY_FRAME_BYTES) / per_item;
    Err(ApiError::ReplyTooLarge { bytes, max, fit, what })
}

/// Writes the answer to a search whose hits are `hits`, nearest first, with what `ask`
/// includes, if it fits in `reply_bytes_max`.
pub fn write_hits(
    index: &Index,
    hits: &[Candidate],
    ask: Ask,
    reply_bytes_max: usize,
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let bytes = REPLY_FRAME_BYTES + hits_bytes(index, hits, ask);
    check_reply(bytes, hits.len(), reply_bytes_max, "hits (a smaller k)")?;
    let Reply { out, keep_alive } = reply;
    let mut envelope = Envelope::start(out, 200, keep_alive, format_args!("Similarity search performed successfully."));
    write_neighbors(envelope.data(), index, hits, ask);
    Ok(envelope.finish())
}

/// Most bytes the hits of `{"nearest_neighbors": ...}` take (its braces
/// and key are in `REPLY_FRAME_BYTES`, or in `HIT_BYTES_MAX` for each
/// search of a batch).
fn hits_bytes(index: &Index, hits: &[Candidate], ask: Ask) -> usize {
    let Include { score, data } = ask.include;
    let included = if score || data { INCLUDE_BYTES_MAX } else { 0 }
        + usize::from(score) * VALUE_BYTES_MAX
        + usize::from(data) * index.dims() * VALUE_BYTES_MAX;
    hits.iter().map(|hit| HIT_BYTES_MAX + included + index.metadata_of_row(hit.row).len().max(2)).sum::<usize>()
}

/// Writes `{"nearest_neighbors":{...}}` for `hits`, nearest first.
fn write_neighbors(out: &mut Vec<u8>, index: &Index, hits: &[Candidate], ask: Ask) {
    let Include { score, data } = ask.include;
    out.extend_from_slice(b"{\"nearest_neighbors\":{");
    for (rank, hit) in hits.iter().enumerate() {
        if rank > 0 {
            out.push(b',');
        }
        out.push(b'"');
        json::write_i64(out, hit.id);
        out.extend_from_slice(b"\":{\"metadata\":");
        json::write_metadata(out, index.metadata_of_row(hit.row));
        out.extend_from_slice(b",\"rank\":");
        json::write_u64(out, rank as u64);
        if score {
            out.extend_from_slice(b",\"score\":");
            // Infinite only for bc's Σ|x+q| = 0 and the largest lp with
            // p < 1: JSON has no infinity, so `null`.
            match index.score_of(hit.distance, ask.divisor) {
                score if score.is_finite() => json::write_f32(out, score),
                _ => out.extend_from_slice(b"null"),
            }
        }
        if data {
            out.extend_from_slice(b",\"data\":");
            json::write_f32_array(out, index.vector_of_row(hit.row));
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"}}");
}

/// Many searches of one index in one request, run together in one pass
/// over its rows; `data.results` holds each answer, in request order, as
/// the search alone would give it. A bad search fails the whole request.
pub fn search_batch(
    db: &mut Database,
    scratch: &mut Scratch,
    scanner: &mut Scanner,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let Scratch { decoder, queries, searches, slots, .. } = scratch;
    decoder.search_batch(body, (limits.k_max, limits.search_batch_max), limits.body, queries, searches)?;
    let index = find(db.store(), name, IndexOp::Fetch)?;
    slots.resize_with(searches.len().max(slots.len()), Slot::default);
    let slots = &mut slots[..searches.len()];
    for (i, (search, slot)) in searches.iter_mut().zip(slots.iter_mut()).enumerate() {
        let query = slot.query();
        query.clear();
        query.extend_from_slice(&queries[search.query.clone()]);
        let divisor = prepare_query(index, query, || format!("searches[{i}]."))?;
        slot.take(name, Ask { k: search.k, include: search.include, divisor }, search.filter.take());
    }
    // Before the scan, the fewest bytes the hits can take: a batch that
    // cannot fit is refused without scanning, or keeping tops for it.
    let most_hits: usize = slots.iter().map(|slot| slot.ask().k.min(index.len())).sum();
    let what = "hits in all (a smaller k, or fewer searches)";
    check_reply(REPLY_FRAME_BYTES + HIT_BYTES_MIN * most_hits, most_hits, limits.reply_bytes_max, what)?;
    for filter in slots.iter().filter_map(Slot::filter) {
        db.index_keys(name, filter);
    }
    group::run_together(scanner, db.store(), slots, |_, _| ());
    let index = find(db.store(), name, IndexOp::Fetch)?;
    let mut bytes = REPLY_FRAME_BYTES;
    let mut hits = 0;
    for slot in slots.iter_mut() {
        let ask = slot.ask();
        let sorted = slot.hits();
        bytes += HIT_BYTES_MAX + hits_bytes(index, sorted, ask);
        hits += sorted.len();
    }
    check_reply(bytes, hits, limits.reply_bytes_max, what)?;
    let Reply { out, keep_alive } = reply;
    let mut envelope = Envelope::start(
        out,
        200,
        keep_alive,
        format_args!("{} similarity {} performed successfully.", slots.len(), noun(slots.len(), "search", "searches")),
    );
    let out = envelope.data();
    out.extend_from_slice(b"{\"results\":[");
    for (n, slot) in slots.iter_mut().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let ask = slot.ask();
        write_neighbors(out, index, slot.hits(), ask);
    }
    out.extend_from_slice(b"]}");
    Ok(envelope.finish())
}

/// Insert or upsert: every item that passes its checks is applied; the rest
/// are listed, each with its reason.
pub fn write(
    db: &mut Database,
    scratch: &mut Scratch,
    limits: ApiLimits,
    mode: Write,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    scratch.decoder.embeddings(body, limits.body, &mut scratch.batch)?;
    write_batch(db, scratch, mode, name, reply)
}

/// `write` of a body already decoded into `scratch.batch` (a cluster's
/// nodes apply the batch its asking node decoded).
pub fn write_batch(
    db: &mut Database,
    scratch: &mut Scratch,
    mode: Write,
    name: &str,
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let Reply { out, keep_alive } = reply;
    let Scratch { batch, items, skipped, seen, .. } = scratch;
    let index = find(db.store(), name, IndexOp::Fetch)?;
    items.clear();
    skipped.clear();
    seen.clear();
    for item in 0..batch.len() {
        let id = batch.ids[item];
        let item = item as u32;
        if let Err(error) = index.check_vector(batch.vector(item as usize)) {
            skipped.push((item, Skip::Vector(error)));
        } else if mode == Write::Insert && index.contains(id) {
            skipped.push((item, Skip::AlreadyExists));
        } else if mode == Write::Insert && !seen.insert(id) {
            skipped.push((item, Skip::RepeatedInRequest));
        } else {
            // Upserts of a repeated id apply in order, so the last one wins.
            items.push(item);
        }
    }
    if !items.is_empty() {
        db.apply(&Mutation::Upsert { index: name, batch, items }).map_err(ApiError::Storage)?;
    }

    let (done, total, verb) = (items.len(), batch.len(), mode.verb());
    let message = format_args!("{done}/{total} embeddings successfully {verb}.");
    if skipped.is_empty() {
        return Ok(Envelope::start(out, 200, keep_alive, message).finish());
    }
    let mut envelope = Envelope::start(out, 500, keep_alive, message);
    let out = envelope.error("EMBEDDINGS_SKIPPED");
    out.push(b'[');
    for (n, &(item, skip)) in skipped.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let id = batch.ids[item as usize];
        json::write_fmt_str(out, format_args!("embedding with ID {id} was not {verb} - {}", SkipReason(id, skip)));
    }
    out.push(b']');
    envelope.end_error();
    Ok(envelope.finish())
}

pub fn retrieve(
    store: &Store,
    scratch: &mut Scratch,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let Reply { out, keep_alive } = reply;
    let ids = &mut scratch.ids;
    scratch.decoder.ids(body, limits.body, ids)?;
    let index = find(store, name, IndexOp::Fetch)?;
    // One look-up per id: how many are found, and a bound on the reply.
    let row_bytes = EMBEDDING_BYTES_MAX + index.dims() * VALUE_BYTES_MAX;
    let (mut found, mut bytes) = (0, REPLY_FRAME_BYTES);
    for &id in ids.iter() {
        match index.get(id) {
            Some((_, metadata)) => (found, bytes) = (found + 1, bytes + row_bytes + metadata.len()),
            None => bytes += MISSING_BYTES_MAX,
        }
    }
    check_reply(bytes, ids.len(), limits.reply_bytes_max, "ids")?;
    let (status, total) = (if found == ids.len() { 200 } else { 500 }, ids.len());
    let mut envelope =
        Envelope::start(out, status, keep_alive, format_args!("{found}/{total} embeddings successfully retrieved."));
    let data = envelope.data();
    data.extend_from_slice(b"{\"embeddings\":[");
    let mut first = true;
    for &id in ids.iter() {
        let Some((vector, metadata)) = index.get(id) else { continue };
        if !first {
            data.push(b',');
        }
        first = false;
        data.extend_from_slice(b"{\"id\":");
        json::write_i64(data, id);
        data.extend_from_slice(b",\"data\":");
        json::write_f32_array(data, vector);
        data.extend_from_slice(b",\"metadata\":");
        json::write_metadata(data, metadata);
        data.push(b'}');
    }
    data.extend_from_slice(b"]}");
    if status != 200 {
        write_missing(&mut envelope, ids.iter().copied().filter(|&id| !index.contains(id)), "retrieved");
    }
    Ok(envelope.finish())
}

pub fn delete(
    db: &mut Database,
    scratch: &mut Scratch,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let Reply { out, keep_alive } = reply;
    let Scratch { decoder, ids, seen, batch, .. } = scratch;
    let deletion = decoder.deletion(body, limits.body, ids)?;
    let rows = match &deletion {
        Deletion::Filter(filter) => db.matching(name, filter),
        Deletion::Ids => None,
    };
    let index = find(db.store(), name, IndexOp::Fetch)?;
    // `batch.ids` is free scratch here: it collects the ids to delete, in order.
    let deletable = &mut batch.ids;
    deletable.clear();
    if let Deletion::Filter(_) = deletion {
        match rows {
            Some(rows) => deletable.extend(rows.iter().map(|row| index.id_of_row(row))),
            None => deletable.extend((0..index.len() as u32).map(|row| index.id_of_row(row))),
        }
        // One record in the log, however many rows match.
        if !deletable.is_empty() {
            db.apply(&Mutation::Delete { index: name, ids: deletable }).map_err(ApiError::Storage)?;
        }
        let n = deletable.len();
        let mut envelope =
            Envelope::start(out, 200, keep_alive, format_args!("{n}/{n} embeddings successfully deleted."));
        let data = envelope.data();
        data.extend_from_slice(b"{\"deleted\":");
        json::write_u64(data, n as u64);
        data.push(b'}');
        return Ok(envelope.finish());
    }
    seen.clear();
    for &id in ids.iter() {
        if index.contains(id) && seen.insert(id) {
            deletable.push(id);
        }
    }
    if !deletable.is_empty() {
        db.apply(&Mutation::Delete { index: name, ids: deletable }).map_err(ApiError::Storage)?;
    }
    let (done, total) = (deletable.len(), ids.len());
    let message = format_args!("{done}/{total} embeddings successfully deleted.");
    if done == total {
        return Ok(Envelope::start(out, 200, keep_alive, message).finish());
    }
    let mut envelope = Envelope::start(out, 500, keep_alive, message);
    // Missing: ids that were not deleted by this request (absent, or repeated).
    let mut deleted = deletable.iter().peekable();
    let missing = ids.iter().copied().filter(move |&id| {
        if deleted.peek() == Some(&&id) {
            deleted.next();
            false
        } else {
            true
        }
    });
    write_missing(&mut envelope, missing, "deleted");
    Ok(envelope.finish())
}

/// A page of the rows of an index in order of id: those after `after`
/// that the filter matches, at most `limit`, and fewer if the reply would
/// pass its bound. `data.next` is the last id listed when more may follow,
/// for the next page's `after`.
pub fn scroll(
    db: &mut Database,
    scratch: &mut Scratch,
    limits: ApiLimits,
    name: &str,
    body: &mut [u8],
    reply: Reply<'_>,
) -> Result<u16, ApiError> {
    let Scroll { limit, after, filter, data } = scratch.decoder.scroll(body, limits.body)?;
    let mask = filter.as_ref().and_then(|filter| db.matching(name, filter));
    let index = find(db.store(), name, IndexOp::Fetch)?;
    let page = &mut scratch.items;
    let mut more = index.scroll(after, limit, mask.as_ref(), page);
    // The rows that fit in the reply; the rest are for the next page.
    let row_bytes = EMBEDDING_BYTES_MAX + usize::from(data) * index.dims() * VALUE_BYTES_MAX;
    let mut bytes = REPLY_FRAME_BYTES;
    let fit = page
        .iter()
        .take_while(|&&row| {
            bytes += row_bytes + index.metadata_of_row(row).len();
            bytes <= limits.reply_bytes_max
        })
        .count();
    if fit == 0 && !page.is_empty() {
        check_reply(bytes, 1, limits.reply_bytes_max, "rows with their vectors")?;
    }
    if fit < page.len() {
        page.truncate(fit);
        more = true;
    }
    let Reply { out, keep_alive } = reply;
    let listed = format_args!("{} {} listed.", page.len(), noun(page.len(), "embedding", "embeddings"));
    let mut envelope = Envelope::start(out, 200, keep_alive, listed);
    let out = envelope.data();
    out.extend_from_slice(b"{\"embeddings\":[");
    for (n, &row) in page.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        json::write_i64(out, index.id_of_row(row));
        out.extend_from_slice(b",\"metadata\":");
        json::write_metadata(out, index.metadata_of_row(row));
        if data {
            out.extend_from_slice(b",\"data\":");
            json::write_f32_array(out, index.vector_of_row(row));
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"next\":");
    match page.last() {
        Some(&row) if more => json::write_i64(out, index.id_of_row(row)),
        _ => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
    Ok(envelope.finish())
}

/// A count's noun in our own messages: `1 embedding listed.`, `2
/// embeddings listed.` (those of the original interface keep its form,
/// `1/1 embeddings successfully deleted.`).
fn noun(count: usize, one: &'static str, many: &'static str) -> &'static str {
    if count == 1 {
        one
    } else {
        many
    }
}

/// `"error":{"code":"EMBEDDINGS_SKIPPED","description":["embedding with ID 7 was not <verb> - ..."]}`.
fn write_missing(envelope: &mut Envelope<'_>, missing: impl Iterator<Item = i64>, verb: &str) {
    let out = envelope.error("EMBEDDINGS_SKIPPED");
    out.push(b'[');
    for (n, id) in missing.enumerate() {
        if n > 0 {
            out.push(b',');
        }
        json::write_fmt_str(
            out,
            format_args!("embedding with ID {id} was not {verb} - embedding with ID {id} does not exist"),
        );
    }
    out.push(b']');
    envelope.end_error();
}
