//! Request bodies: parsed by simd-json into a reused tape, then read field by
//! field into reused buffers (vectors straight into flat `f32` arrays).
//!
//! Every structural problem becomes `ApiError::BadBody` with a `detail` naming
//! the exact place, e.g. `embeddings[3].data[7]: expected a number`.
//!
//! # Rounding a number once
//! A vector value is the f32 nearest to the number's decimal text, rounded
//! once (ties to even). simd-json gives the f64 nearest to the text, and
//! rounding that to f32 is the same as rounding the text, except where the
//! f64 lies exactly halfway between two f32s: the text may then lie on
//! either side of that halfway point (every halfway point is an f64, so
//! whenever the two roundings differ there is one between the text and its
//! f64, and the f64 nearest the text can only be that point itself). Those
//! numbers, rare in real data, are read again from their text
//! (`reread_numbers`). An integer is converted straight from its exact value;
//! simd-json keeps the sign of `-0` by giving it as a signed integer, and
//! gives integers beyond 64 bits as f64 (its `big-int-as-float`), which the
//! halfway check covers like any other.

use std::fmt;
use std::ops::{Bound, Range};

use simd_json::{Buffers, Node, StaticNode, Tape};

use super::error::ApiError;
use super::json;
use crate::store::filter::{Kind, Value};
use crate::store::{Batch, Filter};

/// What a search's `include` asks to add to each hit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Include {
    /// The value the hit was ranked by.
    pub score: bool,
    /// The stored vector.
    pub data: bool,
}

/// What one search body asks for besides its query.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Search {
    pub k: usize,
    pub include: Include,
    /// The rows it may find; `None` for every row.
    pub filter: Option<Filter>,
    /// Where its query lies in the decoded queries.
    pub query: Range<usize>,
}

/// What a create body asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Creation {
    pub dimensions: usize,
    pub metric: String,
    /// `p`, when the body gives a number for it.
    pub p: Option<f64>,
}

/// What a scroll body asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Scroll {
    /// Most rows in the page.
    pub limit: usize,
    /// Rows with ids after this one only.
    pub after: Option<i64>,
    pub filter: Option<Filter>,
    /// Whether each row shows its vector.
    pub data: bool,
}

impl Default for Scroll {
    fn default() -> Scroll {
        Scroll { limit: crate::limits::SCROLL_LIMIT_DEFAULT, after: None, filter: None, data: false }
    }
}

/// What a delete of embeddings names: ids (decoded into the caller's
/// buffer), or a filter.
#[derive(Clone, Debug, PartialEq)]
pub enum Deletion {
    Ids,
    Filter(Filter),
}

/// A tape node slice: the whole parsed document.
type Nodes<'t, 'i> = &'t [Node<'i>];

/// What one body may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    /// Ids or embeddings per request.
    pub items_max: usize,
    pub metadata_entries_max: usize,
    /// Bytes of one embedding's metadata as JSON text.
    pub metadata_bytes_max: usize,
    /// Levels of `$and`, `$or` and `$not` inside one another in a filter.
    pub filter_depth_max: usize,
    /// Terms of one filter (`filter_of`).
    pub filter_terms_max: usize,
}

impl BodyLimits {
    pub const DEFAULT: BodyLimits = BodyLimits {
        items_max: crate::limits::ITEMS_PER_REQUEST_MAX_DEFAULT,
        metadata_entries_max: crate::limits::METADATA_ENTRIES_MAX_DEFAULT,
        metadata_bytes_max: crate::limits::METADATA_BYTES_MAX_DEFAULT,
        filter_depth_max: crate::limits::FILTER_DEPTH_MAX_DEFAULT,
        filter_terms_max: crate::limits::FILTER_TERMS_MAX_DEFAULT,
    };
}

/// The parser's buffers, kept from request to request.
pub struct Decoder {
    buffers: Buffers,
    tape: Option<Tape<'static>>,
    scratch: Scratch,
}

/// What reading a tape collects besides its values.
#[derive(Default)]
struct Scratch {
    /// Metadata de-duplication: tape positions of keys.
    keys: Vec<u32>,
    /// Numbers to read again from their text (see the module doc): (tape
    /// position, place in the output vector).
    rereads: Vec<(usize, usize)>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            buffers: Buffers::with_max_depth(0, crate::limits::JSON_DEPTH_MAX),
            tape: Some(Tape::null()),
            scratch: Scratch::default(),
        }
    }
}

impl Decoder {
    /// Parses `body` and hands its tape to `read`.
    fn with_tape<T>(
        &mut self,
        body: &mut [u8],
        read: impl FnOnce(Nodes<'_, '_>, &mut Scratch) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_body("body: expected a JSON object, got an empty body"));
        }
        self.scratch.rereads.clear();
        let mut tape = self.tape.take().unwrap_or_else(Tape::null).reset();
        let result =
            simd_json::fill_tape(body, &mut self.buffers, &mut tape).map(|()| read(&tape.0, &mut self.scratch));
        self.tape = Some(tape.reset());
        result
            .unwrap_or_else(|error| Err(ApiError::bad_body(not_json(body, self.buffers.structural_indexes(), &error))))
    }

    /// Reads the numbers `numbers` left to their text, into `out`. The
    /// tape holds one node per value or key, in the order of the text, and
    /// simd-json's structural indexes mark where each starts (among the
    /// `,`, `:` and closing brackets): so node `n` starts at the `n`-th of
    /// those marks that opens something. Unescaping strings in place
    /// leaves every mark's byte as it was (a string's content is written
    /// after its opening quote), and numbers are not touched at all.
    fn reread_numbers(&mut self, body: &[u8], out: &mut [f32]) -> Result<(), ApiError> {
        let rereads = &mut self.scratch.rereads;
        if rereads.is_empty() {
            return Ok(());
        }
        rereads.sort_unstable();
        let mut starts = self
            .buffers
            .structural_indexes()
            .iter()
            .map(|&at| at as usize)
            .filter(|&at| at < body.len() && !matches!(body[at], b',' | b':' | b']' | b'}'));
        let mut passed = 0;
        for &(node, slot) in rereads.iter() {
            let start = starts.nth(node - passed);
            passed = node + 1;
            let text = start.map(|start| {
                let len = body[start..]
                    .iter()
                    .take_while(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .count();
                &body[start..start + len]
            });
            let value = text.and_then(|text| std::str::from_utf8(text).ok()?.parse::<f32>().ok());
            out[slot] =
                value.ok_or_else(|| ApiError::bad_body("body: a number could not be read again from its text"))?;
        }
        Ok(())
    }

    /// Checks a stored metadata text (a restored snapshot's): it must be
    /// exactly what `write_metadata` writes for it, within the limits, so
    /// that a row restored is a row an upsert could have stored. `copy`
    /// and `written` are scratch.
    pub fn stored_metadata(
        &mut self,
        text: &[u8],
        limits: BodyLimits,
        (copy, written): (&mut Vec<u8>, &mut Vec<u8>),
    ) -> Result<(), String> {
        if text.is_empty() {
            return Ok(());
        }
        if text.len() > limits.metadata_bytes_max {
            return Err(format!("metadata: at most {} bytes of JSON text", limits.metadata_bytes_max));
        }
        copy.clear();
        copy.extend_from_slice(text);
        written.clear();
        let entries_max = limits.metadata_entries_max;
        let read = self.with_tape(copy, |nodes, scratch| {
            if let Node::Object { len, .. } = nodes[0] {
                if len > entries_max {
                    return Err(ApiError::bad_body(format_args!("metadata: at most {entries_max} entries")));
                }
            }
            write_metadata(nodes, 0, 0, written, &mut scratch.keys)
        });
        match read {
            Err(ApiError::BadBody { detail }) => Err(detail.replace("embeddings[0].", "")),
            Err(error) => Err(error.to_string()),
            Ok(()) if written.as_slice() == text => Ok(()),
            Ok(()) => Err("metadata: not in the form this server stores".to_owned()),
        }
    }

    /// `{"dimensions": int, "metric": string, "p"?: number}`: the
    /// dimensions, the metric's name and `p` if it is a number (only `lp`
    /// reads it; `Metric::parse` says whether it fits).
    pub fn create(&mut self, body: &mut [u8], dimensions_max: usize) -> Result<Creation, ApiError> {
        self.with_tape(body, |nodes, _| {
            let (mut dimensions, mut metric, mut p) = (None, None, None);
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                match key {
                    "dimensions" => {
                        let n = integer(nodes, at).filter(|&n| (1..=dimensions_max as i64).contains(&n));
                        let n = n.ok_or_else(|| {
                            ApiError::bad_body(format_args!(
                                "dimensions: expected an integer from 1 to {dimensions_max}"
                            ))
                        })?;
                        dimensions = Some(n as usize);
                    }
                    "metric" => match nodes[at] {
                        Node::String(s) => metric = Some(s.to_owned()),
                        _ => return Err(ApiError::bad_body("metric: expected a string")),
                    },
                    "p" => p = number(nodes, at),
                    _ => return Err(unknown_field("", key, &["dimensions", "metric", "p"])),
                }
            }
            let dimensions = dimensions.ok_or_else(|| ApiError::bad_body("dimensions: required"))?;
            let metric = metric.ok_or_else(|| ApiError::bad_body("metric: required"))?;
            Ok(Creation { dimensions, metric, p })
        })
    }

    /// `{"queryVector": [number], "k": int, "include"?: ["score" | "data"],
    /// "filter"?: filter}`; the vector goes into `query`.
    pub fn search(
        &mut self,
        body: &mut [u8],
        k_max: usize,
        limits: BodyLimits,
        query: &mut Vec<f32>,
    ) -> Result<Search, ApiError> {
        query.clear();
        let found = self.with_tape(body, |nodes, scratch| {
            let object = object(nodes, 0).ok_or_else(not_an_object)?;
            search_fields(nodes, object, k_max, limits, query, &mut scratch.rereads)
        })?;
        self.reread_numbers(body, query)?;
        Ok(found)
    }

    /// `{"searches": [<search body>, ...]}`, 1 to `searches_max` of them:
    /// each query goes, one after another, into `queries`, and what the
    /// search asks for (with its query's place in `queries`) into `searches`.
    pub fn search_batch(
        &mut self,
        body: &mut [u8],
        (k_max, searches_max): (usize, usize),
        limits: BodyLimits,
        queries: &mut Vec<f32>,
        searches: &mut Vec<Search>,
    ) -> Result<(), ApiError> {
        queries.clear();
        searches.clear();
        self.with_tape(body, |nodes, scratch| {
            let mut found = false;
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                if key != "searches" {
                    return Err(unknown_field("", key, &["searches"]));
                }
                let Node::Array { len, .. } = nodes[at] else {
                    return Err(ApiError::bad_body("searches: expected an array of search bodies"));
                };
                if !(1..=searches_max).contains(&len) {
                    return Err(ApiError::bad_body(format_args!("searches: expected 1 to {searches_max} searches")));
                }
                queries.clear();
                searches.clear();
                scratch.rereads.clear();
                for (i, element) in elements(nodes, at).enumerate() {
                    let in_search = |error: ApiError| match error {
                        ApiError::BadBody { detail } => ApiError::BadBody { detail: format!("searches[{i}].{detail}") },
                        other => other,
                    };
                    let object = object(nodes, element)
                        .ok_or_else(|| ApiError::bad_body(format_args!("searches[{i}]: expected a JSON object")))?;
                    let search = search_fields(nodes, object, k_max, limits, queries, &mut scratch.rereads)
                        .map_err(in_search)?;
                    searches.push(search);
                }
                found = true;
            }
            if found {
                Ok(())
            } else {
                Err(ApiError::bad_body("searches: required"))
            }
        })?;
        self.reread_numbers(body, queries)
    }

    /// `{"ids": [int]}`.
    pub fn ids(&mut self, body: &mut [u8], limits: BodyLimits, ids: &mut Vec<i64>) -> Result<(), ApiError> {
        self.with_tape(body, |nodes, _| {
            let mut found = None;
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                if key != "ids" {
                    return Err(unknown_field("", key, &["ids"]));
                }
                // A repeated key: the last one counts.
                found = Some(at);
            }
            ids_of(nodes, found.ok_or_else(|| ApiError::bad_body("ids: required"))?, limits, ids)
        })
    }

    /// A delete's body: `{"ids": [int]}` (into `ids`) or `{"filter": filter}`,
    /// not both.
    pub fn deletion(&mut self, body: &mut [u8], limits: BodyLimits, ids: &mut Vec<i64>) -> Result<Deletion, ApiError> {
        self.with_tape(body, |nodes, _| {
            let (mut filter, mut ids_at) = (None, None);
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                match key {
                    "filter" => filter = filter_field(nodes, at, limits)?,
                    "ids" => ids_at = (!is_null(nodes, at)).then_some(at),
                    _ => return Err(unknown_field("", key, &["ids", "filter"])),
                }
            }
            match (ids_at, filter) {
                (Some(at), None) => ids_of(nodes, at, limits, ids).map(|()| Deletion::Ids),
                (None, Some(filter)) => Ok(Deletion::Filter(filter)),
                (Some(_), Some(_)) => Err(ApiError::bad_body("body: expected either ids or filter, not both")),
                (None, None) => Err(ApiError::bad_body(
                    "body: expected ids (an array of 64-bit integers) or filter (a filter object); neither was given",
                )),
            }
        })
    }

    /// `{"limit"?: int, "after"?: int, "filter"?: filter, "include"?: ["data"]}`,
    /// each `null` as if absent; an empty body lists from the start.
    pub fn scroll(&mut self, body: &mut [u8], limits: BodyLimits) -> Result<Scroll, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Scroll::default());
        }
        self.with_tape(body, |nodes, _| {
            let mut scroll = Scroll::default();
            let max = crate::limits::SCROLL_LIMIT_MAX;
            // A repeated key: the last one counts.
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                match key {
                    "limit" if is_null(nodes, at) => scroll.limit = crate::limits::SCROLL_LIMIT_DEFAULT,
                    "limit" => {
                        let n = integer(nodes, at).filter(|&n| (1..=max as i64).contains(&n));
                        let n = n.ok_or_else(|| {
                            ApiError::bad_body(format_args!("limit: expected an integer from 1 to {max}"))
                        })?;
                        scroll.limit = n as usize;
                    }
                    "after" if is_null(nodes, at) => scroll.after = None,
                    "after" => {
                        let after = integer(nodes, at);
                        scroll.after =
                            Some(after.ok_or_else(|| ApiError::bad_body("after: expected a 64-bit integer"))?);
                    }
                    "filter" => scroll.filter = filter_field(nodes, at, limits)?,
                    "include" => scroll.data = include_of(nodes, at, &["data"])?.data,
                    _ => return Err(unknown_field("", key, &["limit", "after", "filter", "include"])),
                }
            }
            Ok(scroll)
        })
    }

    /// `{"embeddings": [{"id": int, "data": [numbers], "metadata": {string: value}?}]}`,
    /// a value being a string, a number, a boolean or an array of strings.
    pub fn embeddings(&mut self, body: &mut [u8], limits: BodyLimits, batch: &mut Batch) -> Result<(), ApiError> {
        batch.clear();
        self.with_tape(body, |nodes, scratch| {
            let mut found = false;
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                if key != "embeddings" {
                    return Err(unknown_field("", key, &["embeddings"]));
                }
                let Node::Array { len, .. } = nodes[at] else {
                    return Err(ApiError::bad_body("embeddings: expected an array of embedding objects"));
                };
                if len > limits.items_max {
                    return Err(ApiError::bad_body(format_args!(
                        "embeddings: at most {} per request",
                        limits.items_max
                    )));
                }
                batch.clear();
                scratch.rereads.clear();
                for (i, element) in elements(nodes, at).enumerate() {
                    embedding(nodes, element, i, limits, batch, scratch)?;
                }
                found = true;
            }
            if found {
                Ok(())
            } else {
                Err(ApiError::bad_body("embeddings: required"))
            }
        })?;
        self.reread_numbers(body, &mut batch.values)
    }
}

fn embedding(
    nodes: Nodes<'_, '_>,
    at: usize,
    i: usize,
    limits: BodyLimits,
    batch: &mut Batch,
    scratch: &mut Scratch,
) -> Result<(), ApiError> {
    let (mut id, mut vector, mut metadata) = (None, None, None);
    let fields =
        object(nodes, at).ok_or_else(|| ApiError::bad_body(format_args!("embeddings[{i}]: expected a JSON object")))?;
    for (key, value) in fields {
        match key {
            "id" => {
                let n = integer(nodes, value)
                    .ok_or_else(|| ApiError::bad_body(format_args!("embeddings[{i}].id: expected a 64-bit integer")))?;
                id = Some(n);
            }
            "data" => vector = Some(value),
            "metadata" => metadata = Some(value),
            _ => return Err(unknown_field(&format!("embeddings[{i}]."), key, &["id", "data", "metadata"])),
        }
    }
    let id = id.ok_or_else(|| ApiError::bad_body(format_args!("embeddings[{i}].id: required")))?;
    let vector = vector.ok_or_else(|| ApiError::bad_body(format_args!("embeddings[{i}].data: required")))?;
    let start = batch.values.len();
    numbers(nodes, vector, &mut batch.values, &mut scratch.rereads, &|| format!("embeddings[{i}].data"))?;
    let metadata_start = batch.metadata.len();
    if let Some(at) = metadata {
        if let Node::Object { len, .. } = nodes[at] {
            if len > limits.metadata_entries_max {
                let max = limits.metadata_entries_max;
                return Err(ApiError::bad_body(format_args!("embeddings[{i}].metadata: at most {max} entries")));
            }
        }
        write_metadata(nodes, at, i, &mut batch.metadata, &mut scratch.keys)?;
        if batch.metadata.len() - metadata_start > limits.metadata_bytes_max {
            let max = limits.metadata_bytes_max;
            return Err(ApiError::bad_body(format_args!("embeddings[{i}].metadata: at most {max} bytes of JSON text")));
        }
    }
    batch.ids.push(id);
    batch.vector_spans.push((span(start)?, span(batch.values.len() - start)?));
    batch.metadata_spans.push((span(metadata_start)?, span(batch.metadata.len() - metadata_start)?));
    Ok(())
}

fn span(n: usize) -> Result<u32, ApiError> {
    u32::try_from(n).map_err(|_| ApiError::bad_body("embeddings: too much data in one request"))
}

/// The array of ids at `at`, read into `ids`.
fn ids_of(nodes: Nodes<'_, '_>, at: usize, limits: BodyLimits, ids: &mut Vec<i64>) -> Result<(), ApiError> {
    ids.clear();
    let Node::Array { len, .. } = nodes[at] else {
        return Err(ApiError::bad_body("ids: expected an array of integers"));
    };
    if len > limits.items_max {
        return Err(ApiError::bad_body(format_args!("ids: at most {} per request", limits.items_max)));
    }
    ids.reserve(len);
    for (i, element) in elements(nodes, at).enumerate() {
        let id = integer(nodes, element)
            .ok_or_else(|| ApiError::bad_body(format_args!("ids[{i}]: expected a 64-bit integer")))?;
        ids.push(id);
    }
    Ok(())
}

/// Validates a metadata object and writes it as canonical JSON text; `{}`
/// and `null` write nothing. A key given twice keeps its last value.
fn write_metadata(
    nodes: Nodes<'_, '_>,
    at: usize,
    i: usize,
    out: &mut Vec<u8>,
    keys: &mut Vec<u32>,
) -> Result<(), ApiError> {
    if let Node::Static(StaticNode::Null) = nodes[at] {
        return Ok(());
    }
    keys.clear();
    let fields = object(nodes, at)
        .ok_or_else(|| ApiError::bad_body(format_args!("embeddings[{i}].metadata: expected a JSON object")))?;
    for (key, value) in fields {
        check_metadata_value(nodes, value, &|| format!("embeddings[{i}].metadata.{key}"))?;
        keys.push((value - 1) as u32);
    }
    if keys.is_empty() {
        return Ok(());
    }
    let key_at = |k: u32| match nodes[k as usize] {
        Node::String(s) => s,
        _ => unreachable!("object keys are strings"),
    };
    // Drop all but the last of each repeated key, keeping the original order.
    // Repeats are rare: look for one without allocating, sort only if there is one.
    let repeats = if keys.len() <= 16 {
        keys.iter().enumerate().any(|(n, &a)| keys[n + 1..].iter().any(|&b| key_at(a) == key_at(b)))
    } else {
        true
    };
    let mut dropped: Vec<u32> = Vec::new();
    if repeats {
        let mut order: Vec<u32> = keys.clone();
        order.sort_by(|&a, &b| key_at(a).cmp(key_at(b)).then(a.cmp(&b)));
        dropped.extend(order.windows(2).filter(|w| key_at(w[0]) == key_at(w[1])).map(|w| w[0]));
        dropped.sort_unstable();
    }
    out.push(b'{');
    let mut first = true;
    for &k in keys.iter().filter(|k| dropped.binary_search(k).is_err()) {
        if !first {
            out.push(b',');
        }
        first = false;
        json::write_str(out, key_at(k));
        out.push(b':');
        write_metadata_value(nodes, k as usize + 1, out);
    }
    out.push(b'}');
    Ok(())
}

/// Checks that the value at `at` is one metadata may hold: a string, a
/// finite number, a boolean, or an array of strings. `path` names it.
fn check_metadata_value(nodes: Nodes<'_, '_>, at: usize, path: &dyn Fn() -> String) -> Result<(), ApiError> {
    match nodes[at] {
        Node::String(_) | Node::Static(StaticNode::I64(_) | StaticNode::U64(_) | StaticNode::Bool(_)) => Ok(()),
        // The parser refuses numbers beyond f64; a non-finite one never gets here.
        Node::Static(StaticNode::F64(x)) if x.is_finite() => Ok(()),
        Node::Static(StaticNode::F64(_)) => {
            Err(ApiError::bad_body(format_args!("{}: expected a finite number", path())))
        }
        Node::Static(StaticNode::Null) => Err(ApiError::bad_body(format_args!(
            "{}: null is not a metadata value (leave the key out instead)",
            path()
        ))),
        Node::Array { .. } => {
            for (j, element) in elements(nodes, at).enumerate() {
                if !matches!(nodes[element], Node::String(_)) {
                    return Err(ApiError::bad_body(format_args!("{}[{j}]: expected a string", path())));
                }
            }
            Ok(())
        }
        Node::Object { .. } => Err(ApiError::bad_body(format_args!(
            "{}: expected a string, number, boolean or array of strings (objects do not nest)",
            path()
        ))),
    }
}

/// Writes a value `check_metadata_value` passed as canonical JSON text:
/// strings and arrays as they are, an integer that fits i64 as that
/// integer, any other number as the shortest decimal that reads back to
/// the same f64.
fn write_metadata_value(nodes: Nodes<'_, '_>, at: usize, out: &mut Vec<u8>) {
    match nodes[at] {
        Node::String(value) => json::write_str(out, value),
        Node::Static(StaticNode::I64(n)) => json::write_i64(out, n),
        Node::Static(StaticNode::U64(n)) => match i64::try_from(n) {
            Ok(n) => json::write_i64(out, n),
            Err(_) => json::write_f64(out, n as f64),
        },
        Node::Static(StaticNode::F64(x)) => json::write_f64(out, x),
        Node::Static(StaticNode::Bool(b)) => out.extend_from_slice(if b { b"true" } else { b"false" }),
        Node::Array { .. } => {
            out.push(b'[');
            for (j, element) in elements(nodes, at).enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                if let Node::String(value) = nodes[element] {
                    json::write_str(out, value);
                }
            }
            out.push(b']');
        }
        Node::Static(StaticNode::Null) | Node::Object { .. } => unreachable!("refused by check_metadata_value"),
    }
}

/// Reads an array of numbers as f32, each rounded once (see the module
/// doc); the ones that need their text are noted in `rereads` and hold 0
/// until `reread_numbers`. Magnitudes beyond f32 become infinite and are
/// refused by the vector checks that follow.
fn numbers(
    nodes: Nodes<'_, '_>,
    at: usize,
    out: &mut Vec<f32>,
    rereads: &mut Vec<(usize, usize)>,
    path: &dyn Fn() -> String,
) -> Result<(), ApiError> {
    let Node::Array { len, count } = nodes[at] else {
        return Err(ApiError::bad_body(format_args!("{}: expected an array of numbers", path())));
    };
    if len == count {
        // No nested containers: every element is one node.
        out.reserve(len);
        for (j, node) in nodes[at + 1..at + 1 + len].iter().enumerate() {
            let value = match *node {
                Node::Static(StaticNode::F64(x)) => f32_once(x),
                Node::Static(StaticNode::I64(0)) => Some(-0.0),
                Node::Static(StaticNode::I64(n)) => Some(n as f32),
                Node::Static(StaticNode::U64(n)) => Some(n as f32),
                _ => return Err(ApiError::bad_body(format_args!("{}[{j}]: expected a number", path()))),
            };
            if value.is_none() {
                rereads.push((at + 1 + j, out.len()));
            }
            out.push(value.unwrap_or(0.0));
        }
        return Ok(());
    }
    let j = elements(nodes, at).position(|element| !matches!(nodes[element], Node::Static(_))).unwrap_or(0);
    Err(ApiError::bad_body(format_args!("{}[{j}]: expected a number", path())))
}

/// Halfway between f32's largest value and the next power of two, 2^128:
/// an f64 there rounds to infinity, a text just below it to f32::MAX.
const HALFWAY_TO_INFINITY: f64 = 340_282_356_779_733_661_637_539_395_458_142_568_448.0;

/// The f32 nearest to a number whose nearest f64 is `x`, or `None` where
/// only its text can tell: `x` halfway between two f32s (module doc).
#[inline]
fn f32_once(x: f64) -> Option<f32> {
    // Where f32 is normal (exponents -126 ..= 127), rounding drops the low
    // 29 of f64's 52 fraction bits, and `x` is halfway exactly when they
    // are 1 followed by 28 zeros: for nearly every number, one test.
    let bits = x.to_bits();
    let exponent = ((bits >> 52) & 0x7FF) as i64 - 1023;
    if (-126..=127).contains(&exponent) && bits & 0x1FFF_FFFF != 0x1000_0000 {
        return Some(x as f32);
    }
    let y = x as f32;
    if f64::from(y) == x {
        return Some(y);
    }
    if x.abs() == HALFWAY_TO_INFINITY {
        return None;
    }
    let other = if f64::from(y) < x { y.next_up() } else { y.next_down() };
    if y.is_infinite() || other.is_infinite() {
        return Some(y);
    }
    // Exact: two neighbouring f32s sum without rounding in f64.
    let halfway = (f64::from(y) + f64::from(other)) / 2.0;
    (halfway != x).then_some(y)
}

/// A JSON number, as the f64 nearest to it.
fn number(nodes: Nodes<'_, '_>, at: usize) -> Option<f64> {
    match nodes[at] {
        Node::Static(StaticNode::F64(x)) => Some(x),
        Node::Static(StaticNode::I64(n)) => Some(n as f64),
        Node::Static(StaticNode::U64(n)) => Some(n as f64),
        _ => None,
    }
}

/// A JSON integer that fits in i64 (floats such as `3.0` are not integers).
fn integer(nodes: Nodes<'_, '_>, at: usize) -> Option<i64> {
    match nodes[at] {
        Node::Static(StaticNode::I64(n)) => Some(n),
        Node::Static(StaticNode::U64(n)) => i64::try_from(n).ok(),
        _ => None,
    }
}

/// The position just past the value at `at`.
fn skip(nodes: Nodes<'_, '_>, at: usize) -> usize {
    match nodes[at] {
        Node::Object { count, .. } | Node::Array { count, .. } => at + 1 + count,
        _ => at + 1,
    }
}

/// The positions of an array's elements.
fn elements<'t>(nodes: Nodes<'t, '_>, at: usize) -> impl Iterator<Item = usize> + 't {
    let len = match nodes[at] {
        Node::Array { len, .. } => len,
        _ => 0,
    };
    let mut next = at + 1;
    (0..len).map(move |_| {
        let element = next;
        next = skip(nodes, element);
        element
    })
}

/// The fields of one search body, whose query is appended to `queries`.
fn search_fields<'i>(
    nodes: Nodes<'_, 'i>,
    fields: impl Iterator<Item = (&'i str, usize)>,
    k_max: usize,
    limits: BodyLimits,
    queries: &mut Vec<f32>,
    rereads: &mut Vec<(usize, usize)>,
) -> Result<Search, ApiError> {
    let start = queries.len();
    let (mut k, mut have_vector) = (None, false);
    let mut search = Search::default();
    for (key, at) in fields {
        match key {
            "k" => {
                let n = integer(nodes, at).filter(|&n| (1..=k_max as i64).contains(&n));
                let n =
                    n.ok_or_else(|| ApiError::bad_body(format_args!("k: expected an integer from 1 to {k_max}")))?;
                k = Some(n as usize);
            }
            "queryVector" => {
                // A repeated key: the last one counts.
                queries.truncate(start);
                rereads.retain(|&(_, slot)| slot < start);
                numbers(nodes, at, queries, rereads, &|| "queryVector".to_owned())?;
                have_vector = true;
            }
            "include" => search.include = include_of(nodes, at, &["score", "data"])?,
            "filter" => search.filter = filter_field(nodes, at, limits)?,
            _ => return Err(unknown_field("", key, &["queryVector", "k", "filter", "include"])),
        }
    }
    if !have_vector {
        return Err(ApiError::bad_body("queryVector: required"));
    }
    search.k = k.ok_or_else(|| ApiError::bad_body("k: required"))?;
    search.query = start..queries.len();
    Ok(search)
}

/// `include`: `null` (nothing), or an array of the values in `allowed`
/// (some of `"score"` and `"data"`).
fn include_of(nodes: Nodes<'_, '_>, at: usize, allowed: &[&str]) -> Result<Include, ApiError> {
    let mut include = Include::default();
    let listed =
        |separator: &str| allowed.iter().map(|value| format!("\"{value}\"")).collect::<Vec<_>>().join(separator);
    match nodes[at] {
        Node::Static(StaticNode::Null) => return Ok(include),
        Node::Array { .. } => {}
        _ => return Err(ApiError::bad_body(format_args!("include: expected an array of {}", listed(" and ")))),
    }
    for (i, element) in elements(nodes, at).enumerate() {
        match nodes[element] {
            Node::String(value) if allowed.contains(&value) => match value {
                "score" => include.score = true,
                _ => include.data = true,
            },
            Node::String(other) => {
                return Err(ApiError::bad_body(format_args!(
                    "include[{i}]: unknown value '{other}'; allowed: {}",
                    listed(", ")
                )))
            }
            _ => return Err(ApiError::bad_body(format_args!("include[{i}]: expected {}", listed(" or ")))),
        }
    }
    Ok(include)
}

fn is_null(nodes: Nodes<'_, '_>, at: usize) -> bool {
    matches!(nodes[at], Node::Static(StaticNode::Null))
}

/// A body's `filter` field: `None` for `null`.
fn filter_field(nodes: Nodes<'_, '_>, at: usize, limits: BodyLimits) -> Result<Option<Filter>, ApiError> {
    if is_null(nodes, at) {
        return Ok(None);
    }
    let mut reader = FilterReader { nodes, limits, terms: 0 };
    reader.filter(at, Place::Root, 0).map(Some)
}

/// Where in a filter a term stands, for its error: `filter.$and[1].year`.
/// Written out only when there is an error.
#[derive(Clone, Copy)]
enum Place<'a> {
    Root,
    Key(&'a Place<'a>, &'a str),
    Element(&'a Place<'a>, usize),
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Root => f.write_str("filter"),
            Place::Key(parent, key) => write!(f, "{parent}.{key}"),
            Place::Element(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Reads a filter (the wire format is in `openapi.yaml`) into a `Filter`,
/// counting its terms against the limits.
struct FilterReader<'t, 'i> {
    nodes: Nodes<'t, 'i>,
    limits: BodyLimits,
    terms: usize,
}

impl FilterReader<'_, '_> {
    /// Counts `n` more terms; fails past the limit.
    fn count(&mut self, n: usize, place: Place<'_>) -> Result<(), ApiError> {
        self.terms += n;
        let max = self.limits.filter_terms_max;
        if self.terms > max {
            return Err(ApiError::bad_body(format_args!("{place}: the filter has more than {max} terms")));
        }
        Ok(())
    }

    /// The filter object at `at`, `depth` levels of `$and`/`$or`/`$not` deep.
    fn filter(&mut self, at: usize, place: Place<'_>, depth: usize) -> Result<Filter, ApiError> {
        let nodes = self.nodes;
        let fields =
            object(nodes, at).ok_or_else(|| ApiError::bad_body(format_args!("{place}: expected a JSON object")))?;
        let max = self.limits.filter_depth_max;
        if depth > max {
            return Err(ApiError::bad_body(format_args!("{place}: filters nested deeper than {max} levels")));
        }
        let mut all = Vec::new();
        for (key, value) in fields {
            self.count(1, place)?;
            let here = Place::Key(&place, key);
            match key {
                "$and" | "$or" => {
                    let filters = self.list(value, here, depth)?;
                    all.push(if key == "$and" { Filter::And(filters) } else { Filter::Or(filters) });
                }
                "$not" => all.push(Filter::Not(Box::new(self.filter(value, here, depth + 1)?))),
                _ if key.starts_with('$') => {
                    return Err(ApiError::bad_body(format_args!("{place}: unknown operator '{key}'")));
                }
                _ => self.conditions(key, value, here, &mut all)?,
            }
        }
        Ok(match all.len() {
            0 => Filter::All,
            1 => all.pop().expect("one"),
            _ => Filter::And(all),
        })
    }

    /// The non-empty array of filters of `$and` or `$or`.
    fn list(&mut self, at: usize, place: Place<'_>, depth: usize) -> Result<Vec<Filter>, ApiError> {
        let nodes = self.nodes;
        match nodes[at] {
            Node::Array { len, .. } if len > 0 => {}
            _ => return Err(ApiError::bad_body(format_args!("{place}: expected a non-empty array of filters"))),
        }
        elements(nodes, at)
            .enumerate()
            .map(|(i, element)| self.filter(element, Place::Element(&place, i), depth + 1))
            .collect()
    }

    /// What a metadata key must satisfy: a string (`$eq`), or an object of
    /// operators, all of which must hold; each goes into `all`.
    fn conditions(&mut self, key: &str, at: usize, place: Place<'_>, all: &mut Vec<Filter>) -> Result<(), ApiError> {
        let nodes = self.nodes;
        if let Some(value) = scalar(nodes, at) {
            all.push(Filter::Eq(key.into(), value));
            return Ok(());
        }
        let operators = object(nodes, at).ok_or_else(|| {
            ApiError::bad_body(format_args!("{place}: expected a string, number, boolean or an object of operators"))
        })?;
        let before = all.len();
        for (operator, value) in operators {
            self.count(1, place)?;
            let here = Place::Key(&place, operator);
            let string = || match nodes[value] {
                Node::String(s) => Ok(Value::new(Kind::Str(s))),
                _ => Err(ApiError::bad_body(format_args!("{here}: expected a string"))),
            };
            let number =
                || number(nodes, value).ok_or_else(|| ApiError::bad_body(format_args!("{here}: expected a number")));
            let scalar = || {
                scalar(nodes, value)
                    .ok_or_else(|| ApiError::bad_body(format_args!("{here}: expected a string, number or boolean")))
            };
            let key = || Box::<str>::from(key);
            let condition = match operator {
                "$eq" => Filter::Eq(key(), scalar()?),
                "$ne" => Filter::Not(Box::new(Filter::Eq(key(), scalar()?))),
                "$in" => Filter::In(key(), self.scalars(value, here)?),
                "$nin" => Filter::Not(Box::new(Filter::In(key(), self.scalars(value, here)?))),
                "$contains" => Filter::Contains(key(), string()?),
                "$exists" => match nodes[value] {
                    Node::Static(StaticNode::Bool(true)) => Filter::Exists(key()),
                    Node::Static(StaticNode::Bool(false)) => Filter::Not(Box::new(Filter::Exists(key()))),
                    _ => return Err(ApiError::bad_body(format_args!("{here}: expected true or false"))),
                },
                "$gt" => Filter::Range(key(), Bound::Excluded(number()?), Bound::Unbounded),
                "$gte" => Filter::Range(key(), Bound::Included(number()?), Bound::Unbounded),
                "$lt" => Filter::Range(key(), Bound::Unbounded, Bound::Excluded(number()?)),
                "$lte" => Filter::Range(key(), Bound::Unbounded, Bound::Included(number()?)),
                _ => return Err(ApiError::bad_body(format_args!("{place}: unknown operator '{operator}'"))),
            };
            all.push(condition);
        }
        if all.len() == before {
            return Err(ApiError::bad_body(format_args!("{place}: expected at least one operator")));
        }
        Ok(())
    }

    /// The array of values of `$in` or `$nin`.
    fn scalars(&mut self, at: usize, place: Place<'_>) -> Result<Vec<Value>, ApiError> {
        let nodes = self.nodes;
        let Node::Array { len, .. } = nodes[at] else {
            return Err(ApiError::bad_body(format_args!("{place}: expected an array of strings, numbers or booleans")));
        };
        self.count(len, place)?;
        elements(nodes, at)
            .enumerate()
            .map(|(i, element)| {
                scalar(nodes, element).ok_or_else(|| {
                    ApiError::bad_body(format_args!("{place}[{i}]: expected a string, number or boolean"))
                })
            })
            .collect()
    }
}

/// The string, number or boolean at `at`, as a filter compares it.
fn scalar(nodes: Nodes<'_, '_>, at: usize) -> Option<Value> {
    let kind = match nodes[at] {
        Node::String(s) => Kind::Str(s),
        Node::Static(StaticNode::I64(n)) => Kind::Int(n),
        Node::Static(StaticNode::U64(n)) => Kind::unsigned(n),
        Node::Static(StaticNode::F64(x)) if x.is_finite() => Kind::number(x),
        Node::Static(StaticNode::Bool(b)) => Kind::Bool(b),
        _ => return None,
    };
    Some(Value::new(kind))
}

/// What is wrong with a body that is not JSON, for its `detail`. Two
/// mistakes get words of their own, where the parser's would mislead: a
/// `NaN` or infinity written as if it were a number, and text after a
/// complete value (the parser blames the value's last bracket). Either
/// is told from where the parser stopped, and only for the errors it
/// stops there with (inside a string it counts from the string, not the
/// body): a word where a value starts, or a closing bracket that closes
/// the outermost value, matching its opening, after a value (not a `:`
/// or `,`: `{"a":}` stops there too). `structurals` are the parser's marks
/// of where each token starts; strings unescaped in place keep those
/// bytes (see `reread_numbers`), and a mark past `at` is never read.
fn not_json(body: &[u8], structurals: &[u32], error: &simd_json::Error) -> String {
    use simd_json::ErrorType;
    let at = error.index();
    let rest = body.get(at..).unwrap_or_default();
    let where_a_value_starts =
        matches!(error.error(), ErrorType::InternalError | ErrorType::InvalidNumber | ErrorType::ExpectedNull);
    // The parser stops at the `I` of `-Infinity`, at the `N` of `NaN`.
    let word = rest.strip_prefix(b"-").unwrap_or(rest);
    let not_a_number = [b"nan", b"inf"].iter().any(|start| word.len() >= 3 && word[..3].eq_ignore_ascii_case(*start));
    if where_a_value_starts && not_a_number {
        let start = if at > 0 && body[at - 1] == b'-' { at - 1 } else { at };
        let len = body[start..].iter().take(16).take_while(|b| b.is_ascii_alphanumeric() || **b == b'-').count();
        let text = String::from_utf8_lossy(&body[start..start + len]);
        return format!("body: {text} is not a JSON number (at byte {start}); JSON has no NaN or infinity");
    }
    if matches!(error.error(), ErrorType::InternalError) && matches!(rest.first(), Some(b'}' | b']')) {
        let (mut open, mut before, mut matched) = (Vec::new(), None, true);
        let marks = structurals.iter().map(|&mark| mark as usize).take_while(|&mark| mark <= at);
        for mark in marks.filter(|&mark| mark < body.len()) {
            match body[mark] {
                byte @ (b'{' | b'[') => open.push(byte),
                b'}' => matched &= open.pop() == Some(b'{'),
                b']' => matched &= open.pop() == Some(b'['),
                _ => {}
            }
            if mark < at {
                before = Some(body[mark]);
            }
        }
        let after = rest[1..].iter().position(|b| !b.is_ascii_whitespace());
        if let (true, true, Some(after)) = (matched && open.is_empty(), !matches!(before, Some(b':' | b',')), after) {
            let at = at + 1 + after;
            return format!("body: unexpected text at byte {at}, after the end of the JSON value");
        }
    }
    format!("body: invalid JSON ({error})")
}

/// The error for a field the endpoint does not take, so that a typo never
/// quietly changes an answer: it names the field (its first
/// `FIELD_SHOWN_CHARS_MAX` characters) and the known field most like it by
/// Jaro-Winkler similarity, ignoring case, which weighs a shared start most:
/// `filters` points to `filter`, `meta` to `metadata` (not to `data`).
/// `place` goes before the name: `embeddings[3].`.
fn unknown_field(place: &str, key: &str, known: &[&str]) -> ApiError {
    let shown: String = key.chars().take(FIELD_SHOWN_CHARS_MAX).collect();
    let ellipsis = if shown.len() < key.len() { "…" } else { "" };
    let lower = shown.to_lowercase();
    let likeness = |field: &&str| strsim::jaro_winkler(&lower, &field.to_lowercase());
    // The first of the most alike, on a tie.
    let nearest = known.iter().min_by(|a, b| likeness(b).total_cmp(&likeness(a)));
    let nearest = nearest.expect("an endpoint knows at least one field");
    ApiError::bad_body(format_args!("{place}{shown}{ellipsis}: unknown field (did you mean '{nearest}'?)"))
}

/// The most characters of an unknown field's name that its error shows
/// (and compares with the known ones): a name is client input of any length.
const FIELD_SHOWN_CHARS_MAX: usize = 64;

fn not_an_object() -> ApiError {
    ApiError::bad_body("body: expected a JSON object")
}

/// The (key, value position) pairs of the object at `at`; `None` if it is not an object.
fn object<'t, 'i>(nodes: Nodes<'t, 'i>, at: usize) -> Option<impl Iterator<Item = (&'i str, usize)> + 't> {
    let Node::Object { len, .. } = nodes[at] else {
        return None;
    };
    let mut next = at + 1;
    Some((0..len).map(move |_| {
        let key = match nodes[next] {
            Node::String(key) => key,
            _ => unreachable!("object keys are strings"),
        };
        let value = next + 1;
        next = skip(nodes, value);
        (key, value)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(result: Result<impl std::fmt::Debug, ApiError>) -> String {
        match result {
            Err(ApiError::BadBody { detail }) => detail,
            other => panic!("expected a bad body, got {other:?}"),
        }
    }

    #[test]
    fn embeddings_decode_into_flat_buffers() {
        let mut decoder = Decoder::default();
        let mut batch = Batch::default();
        let mut body = br#"{"embeddings":[
            {"id":1,"data":[1,2.5,-3e2],"metadata":{"b":"x","a":"y\n","b":"z"}},
            {"id":-9,"data":[],"metadata":null},{"data":[0.1],"id":9223372036854775807}]}"#
            .to_vec();
        decoder.embeddings(&mut body, BodyLimits::DEFAULT, &mut batch).unwrap();
        assert_eq!(batch.ids, vec![1, -9, i64::MAX]);
        assert_eq!(batch.vector(0), &[1.0, 2.5, -300.0]);
        assert_eq!(batch.vector(1), &[] as &[f32]);
        assert_eq!(batch.vector(2), &[0.1f32]);
        assert_eq!(batch.metadata(0), br#"{"a":"y\n","b":"z"}"#);
        assert_eq!(batch.metadata(1), b"");
    }

    #[test]
    fn typed_metadata_is_written_as_canonical_text() {
        let mut decoder = Decoder::default();
        let mut batch = Batch::default();
        let mut body = br#"{"embeddings":[{"id":1,"data":[],"metadata":{"i":-0,"n":-7,"f":2.50,"g":3.0,
            "z":-0.0,"e":1E300,"u":18446744073709551615,"w":123456789012345678901234567890,"m":9223372036854775807,
            "t":true,"no":false,"a":["x","y\n"],"none":[],"s":"1"}}]}"#
            .to_vec();
        decoder.embeddings(&mut body, BodyLimits::DEFAULT, &mut batch).unwrap();
        let text = std::str::from_utf8(batch.metadata(0)).unwrap();
        assert_eq!(
            text,
            r#"{"i":0,"n":-7,"f":2.5,"g":3.0,"z":-0.0,"e":1e300,"u":1.8446744073709552e19,"w":1.2345678901234568e29,"m":9223372036854775807,"t":true,"no":false,"a":["x","y\n"],"none":[],"s":"1"}"#,
            "integers as integers, other numbers as the shortest text of their f64, the rest as sent"
        );
    }

    #[test]
    fn structural_errors_name_the_place() {
        let mut decoder = Decoder::default();
        let mut batch = Batch::default();
        let mut decode =
            |text: &str| detail(decoder.embeddings(&mut text.as_bytes().to_vec(), BodyLimits::DEFAULT, &mut batch));
        assert_eq!(decode(""), "body: expected a JSON object, got an empty body");
        assert!(decode("{").starts_with("body: invalid JSON"));
        assert_eq!(decode("[]"), "body: expected a JSON object");
        assert_eq!(decode("{}"), "embeddings: required");
        assert_eq!(decode(r#"{"embeddings":{}}"#), "embeddings: expected an array of embedding objects");
        assert_eq!(decode(r#"{"embeddings":[1]}"#), "embeddings[0]: expected a JSON object");
        assert_eq!(decode(r#"{"embeddings":[{"data":[]}]}"#), "embeddings[0].id: required");
        assert_eq!(decode(r#"{"embeddings":[{"id":1.5,"data":[]}]}"#), "embeddings[0].id: expected a 64-bit integer");
        assert_eq!(
            decode(r#"{"embeddings":[{"id":18446744073709551615,"data":[]}]}"#),
            "embeddings[0].id: expected a 64-bit integer"
        );
        assert_eq!(decode(r#"{"embeddings":[{"id":1}]}"#), "embeddings[0].data: required");
        assert_eq!(
            decode(r#"{"embeddings":[{"id":1,"data":"x"}]}"#),
            "embeddings[0].data: expected an array of numbers"
        );
        assert_eq!(decode(r#"{"embeddings":[{"id":1,"data":[1,"2"]}]}"#), "embeddings[0].data[1]: expected a number");
        assert_eq!(decode(r#"{"embeddings":[{"id":1,"data":[1,[2]]}]}"#), "embeddings[0].data[1]: expected a number");
        assert_eq!(
            decode(r#"{"embeddings":[{"id":1,"data":[],"metadata":{"k":null}}]}"#),
            "embeddings[0].metadata.k: null is not a metadata value (leave the key out instead)"
        );
        assert_eq!(
            decode(r#"{"embeddings":[{"id":1,"data":[],"metadata":{"a":"x","k":{"n":1}}}]}"#),
            "embeddings[0].metadata.k: expected a string, number, boolean or array of strings (objects do not nest)"
        );
        assert_eq!(
            decode(r#"{"embeddings":[{"id":1,"data":[],"metadata":{"k":["a",1]}}]}"#),
            "embeddings[0].metadata.k[1]: expected a string"
        );
        assert_eq!(
            decode(r#"{"embeddings":[{"id":1,"data":[],"metadata":{"k":[["a"]]}}]}"#),
            "embeddings[0].metadata.k[0]: expected a string"
        );
        assert!(
            decode(r#"{"embeddings":[{"id":1,"data":[],"metadata":{"k":1e400}}]}"#).starts_with("body: invalid JSON"),
            "the parser takes no number beyond f64"
        );
        assert_eq!(
            decode(r#"{"embeddings":[{"id":1,"data":[],"metadata":[]}]}"#),
            "embeddings[0].metadata: expected a JSON object"
        );
    }

    #[test]
    fn search_create_and_ids() {
        let mut decoder = Decoder::default();
        let mut query = Vec::new();
        let limits = BodyLimits::DEFAULT;
        let found = decoder.search(&mut br#"{"k":3,"queryVector":[1,0.5]}"#.to_vec(), 10, limits, &mut query).unwrap();
        let expected = Search { k: 3, include: Include::default(), filter: None, query: 0..2 };
        assert_eq!((found, query.as_slice()), (expected, &[1.0, 0.5][..]));
        let mut include =
            |text: &str| decoder.search(&mut text.as_bytes().to_vec(), 10, limits, &mut query).map(|s| s.include);
        let both = Include { score: true, data: true };
        assert_eq!(include(r#"{"k":1,"queryVector":[1],"include":["data","score"]}"#), Ok(both));
        assert!(!include(r#"{"k":1,"queryVector":[1],"include":["score"]}"#).unwrap().data);
        assert_eq!(include(r#"{"k":1,"queryVector":[1],"include":null}"#), Ok(Include::default()));
        assert_eq!(include(r#"{"k":1,"queryVector":[1],"include":[]}"#), Ok(Include::default()));
        assert_eq!(
            detail(include(r#"{"k":1,"queryVector":[1],"include":["score","vectors"]}"#)),
            r#"include[1]: unknown value 'vectors'; allowed: "score", "data""#
        );
        assert_eq!(
            detail(include(r#"{"k":1,"queryVector":[1],"include":"score"}"#)),
            r#"include: expected an array of "score" and "data""#
        );
        assert_eq!(
            detail(include(r#"{"k":1,"queryVector":[1],"include":[1]}"#)),
            r#"include[0]: expected "score" or "data""#
        );
        let mut bad = |text: &str| detail(decoder.search(&mut text.as_bytes().to_vec(), 10, limits, &mut query));
        assert_eq!(bad(r#"{"k":0,"queryVector":[1]}"#), "k: expected an integer from 1 to 10");
        assert_eq!(bad(r#"{"k":11,"queryVector":[1]}"#), "k: expected an integer from 1 to 10");
        assert_eq!(bad(r#"{"k":"3","queryVector":[1]}"#), "k: expected an integer from 1 to 10");
        assert_eq!(bad(r#"{"queryVector":[1]}"#), "k: required");
        assert_eq!(bad(r#"{"k":1}"#), "queryVector: required");
        assert_eq!(bad(r#"{"k":1,"queryVector":null}"#), "queryVector: expected an array of numbers");

        let mut decoder = Decoder::default();
        let mut creation = |text: &str| decoder.create(&mut text.as_bytes().to_vec(), 8).unwrap();
        assert_eq!(
            creation(r#"{"dimensions":3,"metric":"l2"}"#),
            Creation { dimensions: 3, metric: "l2".into(), p: None }
        );
        let lp = Creation { dimensions: 3, metric: "lp".into(), p: Some(2.5) };
        assert_eq!(creation(r#"{"dimensions":3,"metric":"lp","p":2.5}"#), lp);
        assert_eq!(creation(r#"{"dimensions":3,"metric":"lp","p":"2.5"}"#).p, None);
        assert_eq!(creation(r#"{"dimensions":3,"metric":"lp","p":3}"#).p, Some(3.0));
        let mut bad = |text: &str| detail(decoder.create(&mut text.as_bytes().to_vec(), 8));
        assert_eq!(bad(r#"{"dimensions":9,"metric":"l2"}"#), "dimensions: expected an integer from 1 to 8");
        assert_eq!(bad(r#"{"dimensions":3}"#), "metric: required");
        assert_eq!(bad(r#"{"dimensions":3,"metric":5}"#), "metric: expected a string");

        let mut ids = Vec::new();
        Decoder::default().ids(&mut br#"{"ids":[3,-1]}"#.to_vec(), BodyLimits::DEFAULT, &mut ids).unwrap();
        assert_eq!(ids, vec![3, -1]);
        let error = Decoder::default().ids(&mut br#"{"ids":[3,true]}"#.to_vec(), BodyLimits::DEFAULT, &mut ids);
        assert_eq!(detail(error), "ids[1]: expected a 64-bit integer");
    }

    /// Embeds `numbers` (JSON texts) as one vector, after metadata whose
    /// strings hold escapes, and decodes it.
    fn decode_vector(numbers: &[String]) -> Vec<f32> {
        let data = numbers.join(",");
        let mut body = format!(
            r#"{{"embeddings":[{{"id":2,"data":[],"metadata":{{"a":"a\"b\\5","k":"[1,\"2"}}}},{{"id":3,"metadata":{{"q\"":"x\\\"9\n"}},"data":[{data}]}}]}}"#
        )
        .into_bytes();
        let mut batch = Batch::default();
        Decoder::default().embeddings(&mut body, BodyLimits::DEFAULT, &mut batch).unwrap();
        assert_eq!(batch.metadata(1), br#"{"q\"":"x\\\"9\n"}"#);
        batch.vector(1).to_vec()
    }

    #[test]
    fn numbers_are_rounded_to_f32_once() {
        let cases: Vec<(&str, f32)> = vec![
            // Just above halfway between 1 and the next f32: rounding to
            // f64 first lands on halfway, and ties to even would give 1.
            ("1.0000000596046448", 1.000_000_1),
            ("1.00000005960464477539062501", 1.000_000_1),
            ("1.00000005960464477539062499", 1.0),
            ("1.000000059604644775390625", 1.0),
            ("18446744073709551616", 18_446_744_073_709_551_616.0),
            ("-18446744073709551617", -18_446_744_073_709_551_616.0),
            ("123456789012345678901234567890", 1.234_567_9e29),
            ("3.4028235677973366e38", f32::MAX),
            ("1e39", f32::INFINITY),
            ("-1e39", f32::NEG_INFINITY),
            ("1e-46", 0.0),
            ("16777217", 16_777_216.0),
            ("16777219", 16_777_220.0),
        ];
        let texts: Vec<String> = cases.iter().map(|(text, _)| text.to_string()).collect();
        let values = decode_vector(&texts);
        for ((text, want), got) in cases.iter().zip(&values) {
            assert_eq!(got.to_bits(), want.to_bits(), "{text}: {got:e}");
            assert_eq!(got.to_bits(), text.parse::<f32>().unwrap().to_bits(), "{text}");
        }
        let zeros = decode_vector(&["-0".into(), "0".into(), "-0.0".into(), "0e5".into(), "-0E-3".into()]);
        assert_eq!(bits(&zeros), [(-0.0f32).to_bits(), 0, (-0.0f32).to_bits(), 0, (-0.0f32).to_bits()]);
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|x| x.to_bits()).collect()
    }

    /// Halfway points between neighbouring f32s at every scale, and numbers
    /// a little above and below them, each as the decimal text that reads
    /// back as that f64 and with extra digits: every one must decode as the
    /// standard library's correctly rounded parse of its text does.
    #[test]
    fn numbers_near_halfway_points_round_as_their_text_does() {
        let mut texts = Vec::new();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..3000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Any finite f32 bit pattern, subnormals included.
            let low = f32::from_bits((state as u32) & 0x7F7F_FFFF);
            let high = low.next_up();
            let halfway = (f64::from(low) + f64::from(high)) / 2.0;
            let sign = if state >> 63 == 1 { "-" } else { "" };
            texts.push(format!("{sign}{halfway:e}"));
            texts.push(format!("{sign}{:e}", halfway.next_up()));
            texts.push(format!("{sign}{:e}", halfway.next_down()));
            texts.push(format!("{sign}{:.30e}", halfway));
            let digits = format!("{halfway:.40e}");
            texts.push(format!(
                "{sign}{}1{}",
                &digits[..digits.find('e').unwrap()],
                &digits[digits.find('e').unwrap()..]
            ));
        }
        texts.push("340282356779733661637539395458142568448".into());
        texts.push("340282356779733661637539395458142568447.9".into());
        texts.push("1.401298464324817e-45".into());
        texts.push("7.006492321624085e-46".into());
        texts.push("7.0064923216240854e-46".into());
        let values = decode_vector(&texts);
        for (text, got) in texts.iter().zip(&values) {
            assert_eq!(got.to_bits(), text.parse::<f32>().unwrap().to_bits(), "{text}: {got:e}");
        }
    }

    #[test]
    fn a_query_is_rounded_once_too() {
        let mut query = Vec::new();
        let mut body = br#"{"queryVector":[9,9],"k":1,"queryVector":["x\"y",1.0000000596046448,-0]}"#.to_vec();
        assert!(Decoder::default().search(&mut body, 10, BodyLimits::DEFAULT, &mut query).is_err());
        let mut body = br#"{"queryVector":[1.0000000596046448,-0, 2],"k":1,"filter":{"m":"\"1"}}"#.to_vec();
        Decoder::default().search(&mut body, 10, BodyLimits::DEFAULT, &mut query).unwrap();
        assert_eq!(bits(&query), vec![1.000_000_1f32.to_bits(), (-0.0f32).to_bits(), 2.0f32.to_bits()]);
        // A query given twice: the last one counts, and its numbers are the ones read again.
        let mut body = br#"{"queryVector":[1.0000000596046448,3],"k":1,"queryVector":[5,1.0000000596046448]}"#.to_vec();
        Decoder::default().search(&mut body, 10, BodyLimits::DEFAULT, &mut query).unwrap();
        assert_eq!(query, vec![5.0, 1.000_000_1]);
    }

    /// A field an endpoint does not take is a 400 naming it and the known
    /// field most like it, never a quiet change of the answer.
    #[test]
    fn unknown_fields_are_refused_naming_the_nearest_known_one() {
        let limits = BodyLimits::DEFAULT;
        let mut decoder = Decoder::default();
        let mut query = Vec::new();
        let mut search = |text: &str| detail(decoder.search(&mut text.as_bytes().to_vec(), 10, limits, &mut query));
        assert_eq!(
            search(r#"{"queryVector":[1],"k":2,"filters":{"n":"3"}}"#),
            "filters: unknown field (did you mean 'filter'?)"
        );
        assert_eq!(
            search(r#"{"queryVector":[1],"k":2,"includes":["score"]}"#),
            "includes: unknown field (did you mean 'include'?)"
        );
        assert_eq!(search(r#"{"queryvector":[1],"k":2}"#), "queryvector: unknown field (did you mean 'queryVector'?)");
        assert_eq!(search(r#"{"queryVector":[1],"K":2}"#), "K: unknown field (did you mean 'k'?)");
        let long = "x".repeat(100);
        let shown = format!("{}…: unknown field (did you mean", "x".repeat(64));
        assert!(search(&format!(r#"{{"queryVector":[1],"k":2,"{long}":1}}"#)).starts_with(&shown));

        let mut batch = Batch::default();
        let mut embeddings = |text: &str| detail(decoder.embeddings(&mut text.as_bytes().to_vec(), limits, &mut batch));
        assert_eq!(
            embeddings(r#"{"embeddings":[{"id":1,"data":[1]},{"id":77,"data":[1],"meta":{"a":"b"}}]}"#),
            "embeddings[1].meta: unknown field (did you mean 'metadata'?)"
        );
        assert_eq!(embeddings(r#"{"embedding":[]}"#), "embedding: unknown field (did you mean 'embeddings'?)");
        assert_eq!(
            embeddings(r#"{"embeddings":[{"ID":1,"data":[1]}]}"#),
            "embeddings[0].ID: unknown field (did you mean 'id'?)"
        );

        let mut scroll = |text: &str| detail(decoder.scroll(&mut text.as_bytes().to_vec(), limits));
        assert_eq!(scroll(r#"{"afterId":5}"#), "afterId: unknown field (did you mean 'after'?)");
        assert_eq!(scroll(r#"{"limits":5}"#), "limits: unknown field (did you mean 'limit'?)");

        let mut create = |text: &str| detail(decoder.create(&mut text.as_bytes().to_vec(), 8));
        assert_eq!(create(r#"{"dimensions":3,"metrik":"l2"}"#), "metrik: unknown field (did you mean 'metric'?)");
        assert_eq!(create(r#"{"dimension":3,"metric":"l2"}"#), "dimension: unknown field (did you mean 'dimensions'?)");

        let mut ids = Vec::new();
        let mut retrieve = |text: &str| detail(decoder.ids(&mut text.as_bytes().to_vec(), limits, &mut ids));
        assert_eq!(retrieve(r#"{"id":[1]}"#), "id: unknown field (did you mean 'ids'?)");
        let mut ids = Vec::new();
        let mut delete = |text: &str| detail(decoder.deletion(&mut text.as_bytes().to_vec(), limits, &mut ids));
        assert_eq!(delete(r#"{"ids":[1],"filer":{}}"#), "filer: unknown field (did you mean 'filter'?)");
        assert_eq!(
            delete(r#"{}"#),
            "body: expected ids (an array of 64-bit integers) or filter (a filter object); neither was given"
        );
        assert_eq!(
            delete(r#"{"ids":null,"filter":null}"#),
            "body: expected ids (an array of 64-bit integers) or filter (a filter object); neither was given"
        );
        let mut ids = Vec::new();
        assert_eq!(
            decoder.deletion(&mut br#"{"ids":[4],"filter":null}"#.to_vec(), limits, &mut ids),
            Ok(Deletion::Ids)
        );
        assert_eq!(ids, vec![4]);

        let (mut queries, mut searches) = (Vec::new(), Vec::new());
        let mut batch = |text: &str| {
            detail(decoder.search_batch(&mut text.as_bytes().to_vec(), (10, 10), limits, &mut queries, &mut searches))
        };
        assert_eq!(batch(r#"{"search":[]}"#), "search: unknown field (did you mean 'searches'?)");
        assert_eq!(
            batch(r#"{"searches":[{"queryVector":[1],"k":1},{"queryVector":[1],"k":1,"filters":{}}]}"#),
            "searches[1].filters: unknown field (did you mean 'filter'?)"
        );
    }

    /// A `NaN` or infinity written as a number, and text after a complete
    /// body, are told in words; other bad JSON keeps the parser's.
    #[test]
    fn bodies_that_are_not_json_say_why() {
        let mut decoder = Decoder::default();
        let mut query = Vec::new();
        let mut search =
            |text: &str| detail(decoder.search(&mut text.as_bytes().to_vec(), 10, BodyLimits::DEFAULT, &mut query));
        let nan = r#"{"k": 1, "queryVector": [1, 2, NaN]}"#;
        assert_eq!(search(nan), "body: NaN is not a JSON number (at byte 31); JSON has no NaN or infinity");
        assert!(search(r#"{"k":1,"queryVector":[Infinity]}"#).starts_with("body: Infinity is not a JSON number"));
        assert!(search(r#"{"k":1,"queryVector":[-Infinity]}"#).starts_with("body: -Infinity is not a JSON number"));
        assert!(search(r#"{"k":1,"queryVector":[1,nan]}"#).starts_with("body: nan is not a JSON number"));
        let after = "body: unexpected text at byte";
        assert_eq!(search(r#"{"k":1,"queryVector":[1]} x"#), format!("{after} 26, after the end of the JSON value"));
        assert_eq!(search(r#"{"k":1,"queryVector":[1]}}"#), format!("{after} 25, after the end of the JSON value"));
        assert_eq!(
            search("{\"k\":1,\"queryVector\":[1],\"filter\":{\"a\\\"\":\"\\\"{\"}}\n {}"),
            format!("{after} 50, after the end of the JSON value")
        );
        assert!(search(r#"{"k":1,"queryVector":[1]} [1]"#).starts_with(after));
        // Not text after the end: a value missing before a bracket.
        assert!(search(r#"{"k":1,"queryVector":} x"#).starts_with("body: invalid JSON"));
        assert!(search(r#"{"k":1,"queryVector":[1,]} x"#).starts_with("body: invalid JSON"));
        assert!(search(r#"{"k":1,"queryVector":[1]"#).starts_with("body: invalid JSON"));
        // Brackets that do not match end no value.
        assert!(search(r#"{"k":1,"queryVector":[1]]} x"#).starts_with("body: invalid JSON"));
        assert!(search(r#"{"a":1]}"#).starts_with("body: invalid JSON"), "{}", search(r#"{"a":1]}"#));
        // Inside a string the parser counts from the string: no words of ours.
        assert!(search(r#"{"k":1,"queryVector":[1],"filter":{"a":"\q NaN"}}"#).starts_with("body: invalid JSON"));
    }
}
