//! Request bodies: parsed by simd-json into a reused tape, then read field by
//! field into reused buffers (vectors straight into flat `f32` arrays).
//!
//! Every structural problem becomes `ApiError::BadBody` with a `detail` naming
//! the exact place, e.g. `embeddings[3].data[7]: expected a number`.

use simd_json::{Buffers, Node, StaticNode, Tape};

use super::error::ApiError;
use super::json;
use crate::store::Batch;

/// A tape node slice: the whole parsed document.
type Nodes<'t, 'i> = &'t [Node<'i>];

/// What one body may hold.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Ids or embeddings per request.
    pub items_max: usize,
    pub metadata_entries_max: usize,
    /// Bytes of one embedding's metadata as JSON text.
    pub metadata_bytes_max: usize,
}

impl BodyLimits {
    pub const DEFAULT: BodyLimits = BodyLimits {
        items_max: crate::limits::ITEMS_PER_REQUEST_MAX_DEFAULT,
        metadata_entries_max: crate::limits::METADATA_ENTRIES_MAX_DEFAULT,
        metadata_bytes_max: crate::limits::METADATA_BYTES_MAX_DEFAULT,
    };
}

/// The parser's buffers, kept from request to request.
pub struct Decoder {
    buffers: Buffers,
    tape: Option<Tape<'static>>,
    /// Scratch for metadata de-duplication: tape positions of keys.
    keys: Vec<u32>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            buffers: Buffers::with_max_depth(0, crate::limits::JSON_DEPTH_MAX),
            tape: Some(Tape::null()),
            keys: Vec::new(),
        }
    }
}

impl Decoder {
    /// Parses `body` and hands its tape to `read`.
    fn with_tape<T>(
        &mut self,
        body: &mut [u8],
        read: impl FnOnce(Nodes<'_, '_>, &mut Vec<u32>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_body("body: expected a JSON object, got an empty body"));
        }
        let mut tape = self.tape.take().unwrap_or_else(Tape::null).reset();
        let result = match simd_json::fill_tape(body, &mut self.buffers, &mut tape) {
            Ok(()) => read(&tape.0, &mut self.keys),
            Err(error) => Err(ApiError::bad_body(format_args!("body: invalid JSON ({error})"))),
        };
        self.tape = Some(tape.reset());
        result
    }

    /// `{"dimensions": int, "metric": string}`.
    pub fn create(&mut self, body: &mut [u8], dimensions_max: usize) -> Result<(usize, String), ApiError> {
        self.with_tape(body, |nodes, _| {
            let (mut dimensions, mut metric) = (None, None);
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
                    _ => {}
                }
            }
            let dimensions = dimensions.ok_or_else(|| ApiError::bad_body("dimensions: required"))?;
            let metric = metric.ok_or_else(|| ApiError::bad_body("metric: required"))?;
            Ok((dimensions, metric))
        })
    }

    /// `{"queryVector": [numbers], "k": int}`; the vector goes into `query`.
    pub fn search(&mut self, body: &mut [u8], k_max: usize, query: &mut Vec<f32>) -> Result<usize, ApiError> {
        query.clear();
        self.with_tape(body, |nodes, _| {
            let (mut k, mut have_vector) = (None, false);
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                match key {
                    "k" => {
                        let n = integer(nodes, at).filter(|&n| (1..=k_max as i64).contains(&n));
                        let n = n.ok_or_else(|| {
                            ApiError::bad_body(format_args!("k: expected an integer from 1 to {k_max}"))
                        })?;
                        k = Some(n as usize);
                    }
                    "queryVector" => {
                        query.clear();
                        numbers(nodes, at, query, &|| "queryVector".to_owned())?;
                        have_vector = true;
                    }
                    _ => {}
                }
            }
            if !have_vector {
                return Err(ApiError::bad_body("queryVector: required"));
            }
            k.ok_or_else(|| ApiError::bad_body("k: required"))
        })
    }

    /// `{"ids": [int]}`.
    pub fn ids(&mut self, body: &mut [u8], limits: BodyLimits, ids: &mut Vec<i64>) -> Result<(), ApiError> {
        ids.clear();
        self.with_tape(body, |nodes, _| {
            let mut found = false;
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                if key != "ids" {
                    continue;
                }
                let Node::Array { len, .. } = nodes[at] else {
                    return Err(ApiError::bad_body("ids: expected an array of integers"));
                };
                if len > limits.items_max {
                    return Err(ApiError::bad_body(format_args!("ids: at most {} per request", limits.items_max)));
                }
                ids.clear();
                ids.reserve(len);
                for (i, element) in elements(nodes, at).enumerate() {
                    let id = integer(nodes, element)
                        .ok_or_else(|| ApiError::bad_body(format_args!("ids[{i}]: expected a 64-bit integer")))?;
                    ids.push(id);
                }
                found = true;
            }
            if found {
                Ok(())
            } else {
                Err(ApiError::bad_body("ids: required"))
            }
        })
    }

    /// `{"embeddings": [{"id": int, "data": [numbers], "metadata": {string: string}?}]}`.
    pub fn embeddings(&mut self, body: &mut [u8], limits: BodyLimits, batch: &mut Batch) -> Result<(), ApiError> {
        batch.clear();
        self.with_tape(body, |nodes, keys| {
            let mut found = false;
            for (key, at) in object(nodes, 0).ok_or_else(not_an_object)? {
                if key != "embeddings" {
                    continue;
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
                for (i, element) in elements(nodes, at).enumerate() {
                    embedding(nodes, element, i, limits, batch, keys)?;
                }
                found = true;
            }
            if found {
                Ok(())
            } else {
                Err(ApiError::bad_body("embeddings: required"))
            }
        })
    }
}

fn embedding(
    nodes: Nodes<'_, '_>,
    at: usize,
    i: usize,
    limits: BodyLimits,
    batch: &mut Batch,
    keys: &mut Vec<u32>,
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
            _ => {}
        }
    }
    let id = id.ok_or_else(|| ApiError::bad_body(format_args!("embeddings[{i}].id: required")))?;
    let vector = vector.ok_or_else(|| ApiError::bad_body(format_args!("embeddings[{i}].data: required")))?;
    let start = batch.values.len();
    numbers(nodes, vector, &mut batch.values, &|| format!("embeddings[{i}].data"))?;
    let metadata_start = batch.metadata.len();
    if let Some(at) = metadata {
        if let Node::Object { len, .. } = nodes[at] {
            if len > limits.metadata_entries_max {
                let max = limits.metadata_entries_max;
                return Err(ApiError::bad_body(format_args!("embeddings[{i}].metadata: at most {max} entries")));
            }
        }
        write_metadata(nodes, at, i, &mut batch.metadata, keys)?;
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
        if !matches!(nodes[value], Node::String(_)) {
            return Err(ApiError::bad_body(format_args!("embeddings[{i}].metadata.{key}: expected a string")));
        }
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
        let Node::String(value) = nodes[k as usize + 1] else { unreachable!("checked above") };
        json::write_str(out, value);
    }
    out.push(b'}');
    Ok(())
}

/// Reads an array of numbers as f32 (out-of-range magnitudes become infinite
/// and are refused by the vector checks that follow).
fn numbers(nodes: Nodes<'_, '_>, at: usize, out: &mut Vec<f32>, path: &dyn Fn() -> String) -> Result<(), ApiError> {
    let Node::Array { len, count } = nodes[at] else {
        return Err(ApiError::bad_body(format_args!("{}: expected an array of numbers", path())));
    };
    if len == count {
        // No nested containers: every element is one node.
        out.reserve(len);
        for (j, node) in nodes[at + 1..at + 1 + len].iter().enumerate() {
            out.push(
                number(node).ok_or_else(|| ApiError::bad_body(format_args!("{}[{j}]: expected a number", path())))?,
            );
        }
        return Ok(());
    }
    let j = elements(nodes, at).position(|element| !matches!(nodes[element], Node::Static(_))).unwrap_or(0);
    Err(ApiError::bad_body(format_args!("{}[{j}]: expected a number", path())))
}

#[inline]
fn number(node: &Node<'_>) -> Option<f32> {
    match *node {
        Node::Static(StaticNode::F64(x)) => Some(x as f32),
        Node::Static(StaticNode::I64(n)) => Some(n as f32),
        Node::Static(StaticNode::U64(n)) => Some(n as f32),
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
        let mut body = br#"{"extra":[{"x":1}],"embeddings":[
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
            decode(r#"{"embeddings":[{"id":1,"data":[],"metadata":{"k":1}}]}"#),
            "embeddings[0].metadata.k: expected a string"
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
        let k = decoder.search(&mut br#"{"k":3,"queryVector":[1,0.5]}"#.to_vec(), 10, &mut query).unwrap();
        assert_eq!((k, query.as_slice()), (3, &[1.0, 0.5][..]));
        let mut bad = |text: &str| detail(decoder.search(&mut text.as_bytes().to_vec(), 10, &mut query));
        assert_eq!(bad(r#"{"k":0,"queryVector":[1]}"#), "k: expected an integer from 1 to 10");
        assert_eq!(bad(r#"{"k":11,"queryVector":[1]}"#), "k: expected an integer from 1 to 10");
        assert_eq!(bad(r#"{"k":"3","queryVector":[1]}"#), "k: expected an integer from 1 to 10");
        assert_eq!(bad(r#"{"queryVector":[1]}"#), "k: required");
        assert_eq!(bad(r#"{"k":1}"#), "queryVector: required");
        assert_eq!(bad(r#"{"k":1,"queryVector":null}"#), "queryVector: expected an array of numbers");

        let mut decoder = Decoder::default();
        assert_eq!(decoder.create(&mut br#"{"dimensions":3,"metric":"l2"}"#.to_vec(), 8).unwrap(), (3, "l2".into()));
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
}
