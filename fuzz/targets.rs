//! The fuzz targets' properties, shared by the cargo-fuzz binaries in
//! `fuzz_targets/` and by the integration tests, which replay the committed
//! corpus through these same functions. Each asserts a property, not only
//! "no crash".

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

use quiver::api::decode::{BodyLimits, Decoder, Deletion};
use quiver::api::json;
use quiver::http::pieces::parse_in_pieces;
use quiver::http::FramingLimits;
use quiver::store::filter::{Kind, Value};
use quiver::store::topk::TopK;
use quiver::store::{Batch, Filter, Index, Metric, Mutation, Scanner, Store};
use quiver::wal::record::{self, Record};
use quiver::wal::{scan, ScanEnd};

/// Bytes fed to the request framing parse to the same requests and errors
/// whole as in pieces of any size.
pub fn http_request(input: &[u8]) {
    let Some((&piece, bytes)) = input.split_first() else { return };
    let limits = FramingLimits {
        head_bytes_max: 512,
        headers_max: 16,
        body_bytes_max: 4096,
        chunks_max: 8,
        chunk_bytes_max: 1024,
    };
    let whole = parse_in_pieces(bytes, bytes.len().max(1), limits);
    let pieces = parse_in_pieces(bytes, usize::from(piece % 16) + 1, limits);
    assert_eq!(whole, pieces);
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|x| x.to_bits()).collect()
}

fn write_f32s(out: &mut Vec<u8>, values: &[f32]) -> bool {
    if values.iter().any(|x| !x.is_finite()) {
        return false;
    }
    json::write_f32_array(out, values);
    true
}

/// Any bytes into each endpoint's body decoder: no panic, and whatever is
/// accepted encodes back to JSON that decodes to the same value (floats to
/// the same bits).
pub fn json_bodies(input: &[u8]) {
    let Some((&which, body)) = input.split_first() else { return };
    let mut decoder = Decoder::default();
    let limits = BodyLimits::DEFAULT;
    match which % 6 {
        0 => {
            if let Ok(creation) = decoder.create(&mut body.to_vec(), 65536) {
                let mut again = Vec::new();
                again.extend_from_slice(format!("{{\"dimensions\":{},\"metric\":", creation.dimensions).as_bytes());
                json::write_str(&mut again, &creation.metric);
                if let Some(p) = creation.p {
                    again.extend_from_slice(b",\"p\":");
                    json::write_f64(&mut again, p);
                }
                again.push(b'}');
                let again = decoder.create(&mut again, 65536).unwrap();
                assert_eq!(again.p.map(f64::to_bits), creation.p.map(f64::to_bits));
                assert_eq!((again.dimensions, again.metric), (creation.dimensions, creation.metric));
            }
        }
        1 => {
            let mut query = Vec::new();
            if let Ok(search) = decoder.search(&mut body.to_vec(), 10_000, limits, &mut query) {
                let include = search.include;
                let included: Vec<&str> = [("\"score\"", include.score), ("\"data\"", include.data)]
                    .into_iter()
                    .filter_map(|(name, on)| on.then_some(name))
                    .collect();
                let mut again = format!("{{\"k\":{},\"include\":[{}],", search.k, included.join(",")).into_bytes();
                if let Some(filter) = &search.filter {
                    again.extend_from_slice(b"\"filter\":");
                    if !write_filter(&mut again, filter) {
                        return;
                    }
                    again.push(b',');
                }
                again.extend_from_slice(b"\"queryVector\":");
                if !write_f32s(&mut again, &query) {
                    return;
                }
                again.push(b'}');
                let mut query_again = Vec::new();
                assert_eq!(decoder.search(&mut again, 10_000, limits, &mut query_again).unwrap(), search);
                assert_eq!(bits(&query_again), bits(&query));
            }
        }
        2 => {
            let mut ids = Vec::new();
            if decoder.ids(&mut body.to_vec(), limits, &mut ids).is_ok() {
                let mut again = b"{\"ids\":[".to_vec();
                for (i, id) in ids.iter().enumerate() {
                    if i > 0 {
                        again.push(b',');
                    }
                    json::write_i64(&mut again, *id);
                }
                again.extend_from_slice(b"]}");
                let mut ids_again = Vec::new();
                decoder.ids(&mut again, limits, &mut ids_again).unwrap();
                assert_eq!(ids_again, ids);
            }
        }
        3 => {
            if let Ok(scroll) = decoder.scroll(&mut body.to_vec(), limits) {
                let mut again = format!("{{\"limit\":{},", scroll.limit).into_bytes();
                if let Some(after) = scroll.after {
                    again.extend_from_slice(format!("\"after\":{after},").as_bytes());
                }
                if let Some(filter) = &scroll.filter {
                    again.extend_from_slice(b"\"filter\":");
                    if !write_filter(&mut again, filter) {
                        return;
                    }
                    again.push(b',');
                }
                again.extend_from_slice(if scroll.data { b"\"include\":[\"data\"]}" } else { b"\"include\":[]}" });
                assert_eq!(decoder.scroll(&mut again, limits).unwrap(), scroll);
            }
        }
        4 => {
            let mut ids = Vec::new();
            if let Ok(Deletion::Filter(filter)) = decoder.deletion(&mut body.to_vec(), limits, &mut ids) {
                let mut again = b"{\"filter\":".to_vec();
                if !write_filter(&mut again, &filter) {
                    return;
                }
                again.push(b'}');
                assert_eq!(decoder.deletion(&mut again, limits, &mut ids).unwrap(), Deletion::Filter(filter));
            }
        }
        _ => {
            let mut batch = Batch::default();
            if decoder.embeddings(&mut body.to_vec(), limits, &mut batch).is_ok() {
                let mut again = b"{\"embeddings\":[".to_vec();
                for item in 0..batch.len() {
                    if item > 0 {
                        again.push(b',');
                    }
                    again.extend_from_slice(b"{\"id\":");
                    json::write_i64(&mut again, batch.ids[item]);
                    again.extend_from_slice(b",\"data\":");
                    if !write_f32s(&mut again, batch.vector(item)) {
                        return;
                    }
                    again.extend_from_slice(b",\"metadata\":");
                    json::write_metadata(&mut again, batch.metadata(item));
                    again.push(b'}');
                }
                again.extend_from_slice(b"]}");
                let mut batch_again = Batch::default();
                decoder.embeddings(&mut again, limits, &mut batch_again).unwrap();
                assert_eq!(batch_again.ids, batch.ids);
                assert_eq!(bits(&batch_again.values), bits(&batch.values));
                for item in 0..batch.len() {
                    assert_eq!(batch_again.metadata(item), batch.metadata(item));
                }
            }
        }
    }
}

/// Writes `filter` as JSON that decodes to it, nested no deeper than the
/// text it was decoded from (so that it passes the same depth limits): the
/// members of an `And` side by side in one object, `Not` of a key's test as
/// `$ne`, `$nin` or `$exists: false`. False if it holds a number JSON
/// cannot carry.
pub fn write_filter(out: &mut Vec<u8>, filter: &Filter) -> bool {
    out.push(b'{');
    let written = match filter {
        Filter::All => true,
        Filter::And(filters) if filters.len() >= 2 && !filters.contains(&Filter::All) => {
            filters.iter().enumerate().all(|(i, filter)| {
                if i > 0 {
                    out.push(b',');
                }
                write_member(out, filter)
            })
        }
        _ => write_member(out, filter),
    };
    out.push(b'}');
    written
}

/// Writes one member of a filter object that decodes to `filter` (not `All`).
fn write_member(out: &mut Vec<u8>, filter: &Filter) -> bool {
    let test = |out: &mut Vec<u8>, key: &str, operator: &str| {
        json::write_str(out, key);
        out.extend_from_slice(b":{");
        json::write_str(out, operator);
        out.push(b':');
    };
    let values = |out: &mut Vec<u8>, values: &[Value]| {
        out.push(b'[');
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_value(out, value);
        }
        out.extend_from_slice(b"]}");
    };
    match filter {
        Filter::All => unreachable!("`All` is the empty object, not a member"),
        Filter::Eq(key, value) => {
            json::write_str(out, key);
            out.push(b':');
            write_value(out, value);
        }
        Filter::In(key, list) => {
            test(out, key, "$in");
            values(out, list);
        }
        Filter::Contains(key, element) => {
            test(out, key, "$contains");
            write_value(out, element);
            out.push(b'}');
        }
        Filter::Exists(key) => {
            test(out, key, "$exists");
            out.extend_from_slice(b"true}");
        }
        Filter::Range(key, low, high) => {
            let (operator, x) = match (low, high) {
                (Bound::Excluded(x), Bound::Unbounded) => ("$gt", x),
                (Bound::Included(x), Bound::Unbounded) => ("$gte", x),
                (Bound::Unbounded, Bound::Excluded(x)) => ("$lt", x),
                (Bound::Unbounded, Bound::Included(x)) => ("$lte", x),
                _ => unreachable!("a decoded range is open on one side"),
            };
            if !x.is_finite() {
                return false;
            }
            test(out, key, operator);
            json::write_f64(out, *x);
            out.push(b'}');
        }
        Filter::Not(inner) => match &**inner {
            Filter::Eq(key, value) => {
                test(out, key, "$ne");
                write_value(out, value);
                out.push(b'}');
            }
            Filter::In(key, list) => {
                test(out, key, "$nin");
                values(out, list);
            }
            Filter::Exists(key) => {
                test(out, key, "$exists");
                out.extend_from_slice(b"false}");
            }
            inner => {
                out.extend_from_slice(b"\"$not\":");
                return write_filter(out, inner);
            }
        },
        Filter::And(filters) | Filter::Or(filters) => {
            let operator: &[u8] = if matches!(filter, Filter::And(_)) { b"\"$and\":[" } else { b"\"$or\":[" };
            out.extend_from_slice(operator);
            for (i, filter) in filters.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if !write_filter(out, filter) {
                    return false;
                }
            }
            out.push(b']');
        }
    }
    true
}

/// Writes a filter's value as JSON that decodes to it.
fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value.kind() {
        Kind::Str(s) => json::write_str(out, s),
        Kind::Int(n) => json::write_i64(out, n),
        Kind::Float(x) => json::write_f64(out, x),
        Kind::Bool(b) => out.extend_from_slice(if b { b"true" } else { b"false" }),
    }
}

/// Reads fuzz bytes as small structured choices.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        first
    }

    fn below(&mut self, n: u8) -> u8 {
        self.byte() % n.max(1)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Any of the nine metrics; `lp` with one of a few `p`, integer or not.
fn metric_of(choice: u8) -> Metric {
    let p = [0.5, 1.0, 2.0, 2.7, 2.5][usize::from(choice / 9 % 5)];
    let metrics = [Metric::Cosine, Metric::L2, Metric::Ip, Metric::L1, Metric::Linf];
    let metrics = metrics.into_iter().chain([Metric::Canberra, Metric::BrayCurtis, Metric::JensenShannon]);
    metrics.chain(Metric::parse("lp", Some(p))).nth(usize::from(choice % 9)).expect("nine metrics")
}

/// A batch of `count` items with small ids (so they collide), small vectors and tags.
fn batch_from(choices: &mut Choices<'_>, dims: usize, count: usize) -> Batch {
    let mut batch = Batch::default();
    for _ in 0..count {
        let id = i64::from(choices.below(16)) - 4;
        batch.ids.push(id);
        batch.vector_spans.push((batch.values.len() as u32, dims as u32));
        for _ in 0..dims {
            batch.values.push(f32::from(choices.byte() as i8) / 4.0);
        }
        let tag = choices.byte();
        let metadata = match tag % 6 {
            0 | 1 => String::new(),
            2 => format!("{{\"t\":\"{tag}\"}}"),
            3 => format!("{{\"t\":{}}}", tag / 6),
            4 => format!("{{\"t\":{}}}", ["true", "false", "2.5", "-0.5"][usize::from(tag / 6 % 4)]),
            _ => format!("{{\"t\":[\"{}\",\"{}\"]}}", tag / 6, tag / 36),
        };
        batch.metadata_spans.push((batch.metadata.len() as u32, metadata.len() as u32));
        batch.metadata.extend_from_slice(metadata.as_bytes());
    }
    batch
}

/// Log records: any bytes scanned as a log never panic; records encoded
/// from structured choices decode to themselves; and a log cut anywhere
/// scans to a prefix of its records, ending clean or torn, never damaged.
pub fn wal_record(input: &[u8]) {
    scan(input, record::decode, |_, _| {});

    let mut choices = Choices(input);
    let mut log = Vec::new();
    let mut ends = Vec::new();
    let mut expected = Vec::new();
    let names = ["abc", "de-f", "g00"];
    while !choices.is_empty() && expected.len() < 16 {
        let name = names[usize::from(choices.below(3))];
        let dims = usize::from(choices.below(4)) + 1;
        match choices.below(4) {
            0 => {
                let metric = metric_of(choices.byte());
                record::encode(&Mutation::CreateIndex { name, dims, metric }, &mut log);
                expected.push(Record::Create { name: name.into(), dims, metric });
            }
            1 => {
                record::encode(&Mutation::DropIndex { name }, &mut log);
                expected.push(Record::Drop { name: name.into() });
            }
            2 => {
                let count = usize::from(choices.below(4)) + 1;
                let batch = batch_from(&mut choices, dims, count);
                let items: Vec<u32> = (0..count as u32).collect();
                record::encode(&Mutation::Upsert { index: name, batch: &batch, items: &items }, &mut log);
                expected.push(Record::Upsert { name: name.into(), batch });
            }
            _ => {
                let ids: Vec<i64> = (0..choices.below(5)).map(|_| i64::from(choices.byte() as i8)).collect();
                record::encode(&Mutation::Delete { index: name, ids: &ids }, &mut log);
                expected.push(Record::Delete { name: name.into(), ids });
            }
        }
        ends.push(log.len());
    }
    let mut decoded = Vec::new();
    assert_eq!(scan(&log, record::decode, |record, _| decoded.push(record)), ScanEnd::Clean);
    assert_eq!(decoded, expected);

    let cut = if log.is_empty() { 0 } else { usize::from(input[0]) * 257 % (log.len() + 1) };
    let mut prefix = Vec::new();
    let end = scan(&log[..cut], record::decode, |record, _| prefix.push(record));
    let whole_records = ends.iter().filter(|&&e| e <= cut).count();
    assert_eq!(prefix.len(), whole_records);
    assert_eq!(&expected[..whole_records], &prefix[..]);
    match end {
        ScanEnd::Clean => assert!(cut == 0 || ends.contains(&cut)),
        ScanEnd::Torn { offset } => assert_eq!(offset, if whole_records == 0 { 0 } else { ends[whole_records - 1] }),
        ScanEnd::Damaged { offset, error } => panic!("a clean cut at {cut} read as damage at {offset}: {error}"),
    }
}

/// The model of one index: id -> (vector, metadata text).
struct ModelIndex {
    dims: usize,
    metric: Metric,
    rows: BTreeMap<i64, (Vec<f32>, Vec<u8>)>,
}

/// The distance an index ranks by, computed the way `Index::search` does.
fn model_distance(metric: Metric, query: &[f32], vector: &[f32]) -> f32 {
    let distance = metric.distance(query, vector);
    if distance.is_nan() {
        f32::INFINITY
    } else {
        distance
    }
}

/// A small filter over the tag `t` that `batch_from` gives rows (and the
/// key `u` that no row has), nested at most three deep.
fn filter_from(choices: &mut Choices<'_>, depth: usize) -> Filter {
    let value = |choices: &mut Choices<'_>| -> Value {
        let byte = choices.byte();
        let text = byte.to_string();
        Value::new(match byte % 4 {
            0 => Kind::Str(&text),
            1 => Kind::number(f64::from(byte / 6)),
            2 => Kind::number([2.5, -0.5][usize::from(byte / 4 % 2)]),
            _ => Kind::Bool((byte / 4).is_multiple_of(2)),
        })
    };
    let x = |choices: &mut Choices<'_>| f64::from(choices.byte()) - 8.5 * f64::from(choices.below(2));
    let many = |choices: &mut Choices<'_>| (0..choices.below(3) + 1).map(|_| filter_from(choices, depth + 1)).collect();
    match choices.below(if depth < 3 { 10 } else { 7 }) {
        0 => Filter::All,
        1 => Filter::Eq("t".into(), value(choices)),
        2 => Filter::In("t".into(), (0..choices.below(4)).map(|_| value(choices)).collect()),
        3 => Filter::Exists(["t", "u"][usize::from(choices.below(2))].into()),
        4 => {
            let bound = |choices: &mut Choices<'_>| match choices.below(3) {
                0 => Bound::Included(x(choices)),
                1 => Bound::Excluded(x(choices)),
                _ => Bound::Unbounded,
            };
            Filter::Range("t".into(), bound(choices), bound(choices))
        }
        5 => Filter::Eq("u".into(), value(choices)),
        6 => Filter::Contains("t".into(), (*(choices.byte() / 6).to_string()).into()),
        7 => Filter::Not(Box::new(filter_from(choices, depth + 1))),
        8 => Filter::And(many(choices)),
        _ => Filter::Or(many(choices)),
    }
}

/// The value of a row's tag `t`, as the model holds it.
#[derive(Debug, PartialEq)]
enum Tag {
    Str(String),
    Number(f64),
    Bool(bool),
    Strings(Vec<String>),
}

/// Whether a filter's `value` equals `tag`, by the contract: of one type,
/// and numbers by their value.
fn model_equal(tag: &Tag, value: &Value) -> bool {
    match (tag, value.kind()) {
        (Tag::Str(t), Kind::Str(v)) => t == v,
        (Tag::Number(t), Kind::Int(v)) => *t == v as f64,
        (Tag::Number(t), Kind::Float(v)) => *t == v,
        (Tag::Bool(t), Kind::Bool(v)) => *t == v,
        _ => false,
    }
}

/// Whether `filter` matches a row whose tag `t` is `tag`, by the contract's
/// definitions (the model of the metadata index).
fn model_matches(filter: &Filter, tag: Option<&Tag>) -> bool {
    let value_of = |key: &str| if key == "t" { tag } else { None };
    match filter {
        Filter::All => true,
        Filter::Eq(key, value) => value_of(key).is_some_and(|t| model_equal(t, value)),
        Filter::In(key, values) => value_of(key).is_some_and(|t| values.iter().any(|value| model_equal(t, value))),
        Filter::Contains(key, element) => match (value_of(key), element.kind()) {
            (Some(Tag::Str(t)), Kind::Str(element)) => t == element,
            (Some(Tag::Strings(ts)), Kind::Str(element)) => ts.iter().any(|t| t == element),
            _ => false,
        },
        Filter::Exists(key) => value_of(key).is_some(),
        Filter::Range(key, low, high) => {
            let number = match value_of(key) {
                Some(Tag::Number(x)) => Some(*x),
                Some(Tag::Str(t)) => t.parse::<f64>().ok(),
                _ => None,
            };
            number.is_some_and(|n| (*low, *high).contains(&n))
        }
        Filter::Not(inner) => !model_matches(inner, tag),
        Filter::And(filters) => filters.iter().all(|f| model_matches(f, tag)),
        Filter::Or(filters) => filters.iter().any(|f| model_matches(f, tag)),
    }
}

/// The tag of a metadata text `batch_from` wrote.
fn tag_of(metadata: &[u8]) -> Option<Tag> {
    let value = std::str::from_utf8(metadata).ok()?.strip_prefix("{\"t\":")?.strip_suffix('}')?;
    let unquote = |s: &str| s.trim_matches('"').to_owned();
    Some(match value {
        "true" | "false" => Tag::Bool(value == "true"),
        _ if value.starts_with('"') => Tag::Str(unquote(value)),
        _ if value.starts_with('[') => Tag::Strings(value[1..value.len() - 1].split(',').map(unquote).collect()),
        _ => Tag::Number(value.parse().expect("batch_from writes numbers")),
    })
}

/// A sequence of index and embedding operations against the store and a
/// simple model (a map and a brute-force scan): every read agrees exactly,
/// filtered searches, scrolls and deletes by filter among them.
pub fn store_ops(input: &[u8]) {
    let mut choices = Choices(input);
    let mut store = Store::new();
    let mut model: BTreeMap<&str, ModelIndex> = BTreeMap::new();
    let mut top = TopK::new();
    let names = ["abc", "xyz"];
    while !choices.is_empty() {
        let name = names[usize::from(choices.below(2))];
        match choices.below(8) {
            0 => {
                if model.contains_key(name) {
                    continue;
                }
                let (dims, metric) = (usize::from(choices.below(9)) + 1, metric_of(choices.byte()));
                store.apply(&Mutation::CreateIndex { name, dims, metric });
                model.insert(name, ModelIndex { dims, metric, rows: BTreeMap::new() });
            }
            1 => {
                if model.remove(name).is_some() {
                    store.apply(&Mutation::DropIndex { name });
                }
            }
            2 | 3 => {
                let Some(entry) = model.get_mut(name) else { continue };
                let count = usize::from(choices.below(5));
                let batch = batch_from(&mut choices, entry.dims, count);
                let index = store.index(name).unwrap();
                // Validated the way the API does: a bad vector is skipped.
                let items: Vec<u32> =
                    (0..count as u32).filter(|&item| index.check_vector(batch.vector(item as usize)).is_ok()).collect();
                store.apply(&Mutation::Upsert { index: name, batch: &batch, items: &items });
                for &item in &items {
                    let item = item as usize;
                    entry.rows.insert(batch.ids[item], (batch.vector(item).to_vec(), batch.metadata(item).to_vec()));
                }
            }
            4 => {
                let Some(entry) = model.get_mut(name) else { continue };
                let mut ids: Vec<i64> = (0..choices.below(4)).map(|_| i64::from(choices.below(16)) - 4).collect();
                ids.sort_unstable();
                ids.dedup();
                ids.retain(|id| entry.rows.contains_key(id));
                store.apply(&Mutation::Delete { index: name, ids: &ids });
                for id in &ids {
                    entry.rows.remove(id);
                }
            }
            5 => {
                // Delete by filter: the rows the metadata index names.
                let Some(entry) = model.get_mut(name) else { continue };
                let filter = filter_from(&mut choices, 0);
                let rows = store.index_mut(name).unwrap().matching(&filter);
                let index = store.index(name).unwrap();
                let ids: Vec<i64> = match rows {
                    Some(rows) => rows.iter().map(|row| index.id_of_row(row)).collect(),
                    None => (0..index.len() as u32).map(|row| index.id_of_row(row)).collect(),
                };
                store.apply(&Mutation::Delete { index: name, ids: &ids });
                entry.rows.retain(|_, (_, metadata)| !model_matches(&filter, tag_of(metadata).as_ref()));
            }
            6 => {
                // A page of a scroll.
                let Some(entry) = model.get(name) else { continue };
                let filter = filter_from(&mut choices, 0);
                let (after, limit) = (i64::from(choices.below(20)) - 6, usize::from(choices.below(6)) + 1);
                let mask = store.index_mut(name).unwrap().matching(&filter);
                let index = store.index(name).unwrap();
                let mut page = Vec::new();
                let more = index.scroll(Some(after), limit, mask.as_ref(), &mut page);
                let got: Vec<i64> = page.iter().map(|&row| index.id_of_row(row)).collect();
                let matching: Vec<i64> = entry
                    .rows
                    .range(after + 1..)
                    .filter(|(_, (_, metadata))| model_matches(&filter, tag_of(metadata).as_ref()))
                    .map(|(&id, _)| id)
                    .collect();
                assert_eq!(got, &matching[..matching.len().min(limit)], "{filter:?}");
                assert_eq!(more, matching.len() > limit);
            }
            _ => {
                let Some(entry) = model.get(name) else { continue };
                let mut query: Vec<f32> = (0..entry.dims).map(|_| f32::from(choices.byte() as i8) / 4.0).collect();
                // Prepared the way the API does; the model scores the prepared query.
                if store.index(name).unwrap().prepare_query(&mut query).is_err() {
                    continue;
                }
                let k = usize::from(choices.below(20)) + 1;
                let filter = if choices.below(2) == 0 { None } else { Some(filter_from(&mut choices, 0)) };
                let mask = filter.as_ref().and_then(|filter| store.index_mut(name).unwrap().matching(filter));
                let index: &Index = store.index(name).unwrap();
                Scanner::with_threads(1).search(
                    index.view(),
                    &[&query],
                    &[k],
                    std::slice::from_mut(&mut top),
                    mask.as_ref(),
                );
                let got: Vec<(i64, u32)> = top.sorted().iter().map(|c| (c.id, c.distance.to_bits())).collect();
                let mut want: Vec<(f32, i64)> = entry
                    .rows
                    .iter()
                    .filter(|(_, (_, metadata))| {
                        filter.as_ref().is_none_or(|f| model_matches(f, tag_of(metadata).as_ref()))
                    })
                    .map(|(&id, (v, _))| (model_distance(entry.metric, &query, v), id))
                    .collect();
                want.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let want: Vec<(i64, u32)> = want.into_iter().take(k).map(|(d, id)| (id, d.to_bits())).collect();
                assert_eq!(got, want, "{filter:?}");
            }
        }
        // Every stored row reads back exactly.
        for (name, entry) in &model {
            let index = store.index(name).unwrap();
            assert_eq!(index.len(), entry.rows.len());
            for (id, (vector, metadata)) in &entry.rows {
                let (stored, stored_metadata) = index.get(*id).unwrap();
                assert_eq!(bits(stored), bits(vector));
                assert_eq!(stored_metadata, &metadata[..]);
            }
        }
    }
    assert_eq!(store.names().collect::<Vec<_>>(), model.keys().copied().collect::<Vec<_>>());
}
