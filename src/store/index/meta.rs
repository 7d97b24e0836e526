//! The metadata index: for every key a filter has named, the rows that
//! hold it, the rows of each of its values (filed by type: `Value::write_key`),
//! the rows of each string its arrays hold, and the rows of each value that
//! is or reads as a number, in order of that number. Each set is a
//! compressed bitmap of row numbers (`roaring`), so a filter is answered by
//! set algebra over them (`matching`), in time and memory about
//! proportional to what it matches.
//!
//! A key is indexed the first time a filter names it (`index_keys`: one
//! pass over the rows' metadata), and from then on follows the rows: `add`
//! when a row is stored, `remove` when it goes, `moved` when a delete swaps
//! the last row into a hole. Keys no filter names cost nothing: an index of
//! a million rows each with a unique `"id"` would otherwise hold a million
//! bitmaps nobody asks for. Each change reads the row's metadata text again
//! (our own canonical JSON, parsed by simd-json into reused buffers) rather
//! than keeping a second copy of it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Bound;

use ahash::{AHashMap, AHashSet};
use roaring::RoaringBitmap;
use simd_json::{Buffers, Node, StaticNode, Tape};

use super::Text;
use crate::store::filter::{number_of, Filter, Kind};

/// The rows of one metadata key.
#[derive(Default)]
struct Key {
    /// Every row that holds the key.
    present: RoaringBitmap,
    /// The rows of each value that is not an array, by `Value::write_key`.
    values: AHashMap<Box<str>, RoaringBitmap>,
    /// The rows of each string an array value holds.
    elements: AHashMap<Box<str>, RoaringBitmap>,
    /// The rows of each value that is, or reads as, a number, by `order_of`
    /// it (values that read as the same number share a set).
    numbers: BTreeMap<u64, RoaringBitmap>,
}

impl Key {
    /// Applies `change` to the sets of a row whose value of this key is
    /// `value`; `scratch` holds the value's key meanwhile.
    fn apply(&mut self, value: &Met<'_>, change: Change, scratch: &mut String) {
        change.apply(&mut self.present);
        let number = match value {
            Met::Strings(elements) => {
                for element in *elements {
                    if let Node::String(element) = element {
                        apply_to(&mut self.elements, element, change);
                    }
                }
                return;
            }
            Met::Value(kind) => {
                kind.write_key(scratch);
                apply_to(&mut self.values, scratch, change);
                match *kind {
                    Kind::Str(s) => number_of(s),
                    Kind::Int(n) => Some(n as f64),
                    Kind::Float(x) => Some(x),
                    Kind::Bool(_) => None,
                }
            }
        };
        if let Some(number) = number {
            let set = self.numbers.entry(order_of(number)).or_default();
            change.apply(set);
            if set.is_empty() {
                self.numbers.remove(&order_of(number));
            }
        }
    }
}

/// An index's metadata index (module doc).
pub(super) struct MetaIndex {
    keys: AHashMap<Box<str>, Key>,
    reader: Reader,
    /// A value's key in `Key::values`, written here (no allocation per value).
    scratch: String,
}

impl Default for MetaIndex {
    fn default() -> MetaIndex {
        MetaIndex { keys: AHashMap::new(), reader: Reader::default(), scratch: String::new() }
    }
}

/// How one row's pairs change the sets they are in.
#[derive(Clone, Copy)]
enum Change {
    Add(u32),
    Remove(u32),
    Move { from: u32, to: u32 },
}

impl Change {
    fn apply(self, set: &mut RoaringBitmap) {
        match self {
            Change::Add(row) => {
                set.insert(row);
            }
            Change::Remove(row) => {
                set.remove(row);
            }
            Change::Move { from, to } => {
                set.remove(from);
                set.insert(to);
            }
        }
    }
}

impl MetaIndex {
    /// Notes the pairs of `metadata`, the text of row `row`.
    pub fn add(&mut self, row: u32, metadata: &[u8]) {
        self.change(metadata, Change::Add(row));
    }

    /// Forgets row `row`, whose text is `metadata`.
    pub fn remove(&mut self, row: u32, metadata: &[u8]) {
        self.change(metadata, Change::Remove(row));
    }

    /// Row `from`, whose text is `metadata`, is now row `to`.
    pub fn moved(&mut self, from: u32, to: u32, metadata: &[u8]) {
        self.change(metadata, Change::Move { from, to });
    }

    fn change(&mut self, metadata: &[u8], change: Change) {
        if metadata.is_empty() {
            return;
        }
        if self.keys.is_empty() {
            return;
        }
        let (keys, scratch) = (&mut self.keys, &mut self.scratch);
        self.reader.pairs(metadata, |key, value| {
            if let Some(entry) = keys.get_mut(key) {
                entry.apply(&value, change, scratch);
            }
        });
    }

    /// Indexes every key `filter` names that is not yet indexed, from
    /// `texts`, the metadata text of each row in order. A key no row holds
    /// is not kept: a filter naming it matches no row through it, and
    /// filters naming made-up keys leave nothing behind (they cost a pass
    /// each instead).
    pub fn index_keys(&mut self, filter: &Filter, texts: &[Text]) {
        let mut new: AHashSet<&str> = AHashSet::new();
        filter.each_key(&mut |key| {
            if !self.keys.contains_key(key) {
                new.insert(key);
            }
        });
        if new.is_empty() {
            return;
        }
        for &key in &new {
            self.keys.insert(key.into(), Key::default());
        }
        let (keys, scratch) = (&mut self.keys, &mut self.scratch);
        for (row, text) in texts.iter().enumerate() {
            if text.is_empty() {
                continue;
            }
            self.reader.pairs(text, |key, value| {
                if new.contains(key) {
                    keys.get_mut(key).expect("inserted above").apply(&value, Change::Add(row as u32), scratch);
                }
            });
        }
        keys.retain(|key, entry| !(new.contains(&**key) && entry.present.is_empty()));
    }

    /// The rows among `0..rows` that `filter` matches; every key it names
    /// must have been through `index_keys` (a key not kept there is held
    /// by no row).
    pub fn matching(&self, filter: &Filter, rows: u32) -> Cow<'_, RoaringBitmap> {
        let none = || Cow::Owned(RoaringBitmap::new());
        let all = || {
            let mut set = RoaringBitmap::new();
            set.insert_range(0..rows);
            set
        };
        match filter {
            Filter::All => Cow::Owned(all()),
            Filter::Eq(key, value) => match self.key(key).and_then(|k| k.values.get(value.key())) {
                Some(set) => Cow::Borrowed(set),
                None => none(),
            },
            Filter::In(key, values) => {
                let Some(key) = self.key(key) else { return none() };
                let mut sets = values.iter().filter_map(|value| key.values.get(value.key()));
                union(&mut sets)
            }
            Filter::Contains(key, value) => {
                let Some(key) = self.key(key) else { return none() };
                let Kind::Str(element) = value.kind() else { return none() };
                let mut sets = [key.values.get(value.key()), key.elements.get(element)].into_iter().flatten();
                union(&mut sets)
            }
            Filter::Exists(key) => match self.key(key) {
                Some(key) => Cow::Borrowed(&key.present),
                None => none(),
            },
            Filter::Range(key, low, high) => {
                let Some(key) = self.key(key) else { return none() };
                match order_range(*low, *high) {
                    Some(range) => union(&mut key.numbers.range(range).map(|(_, set)| set)),
                    None => none(),
                }
            }
            Filter::Not(inner) => {
                let mut set = all();
                set -= &*self.matching(inner, rows);
                Cow::Owned(set)
            }
            Filter::And(filters) => {
                let mut filters = filters.iter();
                let Some(first) = filters.next() else { return Cow::Owned(all()) };
                let mut set = self.matching(first, rows);
                for filter in filters {
                    if set.is_empty() {
                        break;
                    }
                    *set.to_mut() &= &*self.matching(filter, rows);
                }
                set
            }
            Filter::Or(filters) => {
                let mut set = RoaringBitmap::new();
                for filter in filters {
                    set |= &*self.matching(filter, rows);
                }
                Cow::Owned(set)
            }
        }
    }

    /// How many keys are indexed, and how many (key, value) pairs, array
    /// elements included.
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        (self.keys.len(), self.keys.values().map(|key| key.values.len() + key.elements.len()).sum())
    }

    /// The key `key`'s sets; `None` if no row holds it.
    fn key(&self, key: &str) -> Option<&Key> {
        self.keys.get(key)
    }
}

/// Applies `change` to the set of `value` in `values`, creating it on an
/// add and dropping it once empty.
fn apply_to(values: &mut AHashMap<Box<str>, RoaringBitmap>, value: &str, change: Change) {
    let set = match values.get_mut(value) {
        Some(set) => set,
        None => values.entry(value.into()).or_default(),
    };
    change.apply(set);
    if set.is_empty() {
        values.remove(value);
    }
}

/// The union of `sets`, borrowing the set when there is only one.
fn union<'a>(sets: &mut dyn Iterator<Item = &'a RoaringBitmap>) -> Cow<'a, RoaringBitmap> {
    let Some(first) = sets.next() else { return Cow::Owned(RoaringBitmap::new()) };
    let mut union = Cow::Borrowed(first);
    for set in sets {
        *union.to_mut() |= set;
    }
    union
}

/// A key that orders f64s as `<` does (no NaN ever reaches it; `-0` is
/// read as `0`): the sign bit flipped for positives, every bit for negatives.
fn order_of(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// The keys of the numbers within `low..high`, or `None` if no number is
/// (a `BTreeMap` range must not be empty-and-reversed).
fn order_range(low: Bound<f64>, high: Bound<f64>) -> Option<(Bound<u64>, Bound<u64>)> {
    let map = |bound: Bound<f64>| match bound {
        Bound::Included(x) => Bound::Included(order_of(x + 0.0)),
        Bound::Excluded(x) => Bound::Excluded(order_of(x + 0.0)),
        Bound::Unbounded => Bound::Unbounded,
    };
    let (low, high) = (map(low), map(high));
    let empty = match (low, high) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => a >= b,
        _ => false,
    };
    (!empty).then_some((low, high))
}

/// One metadata value as the reader meets it: a value, or an array's
/// elements (strings: the decoder takes no other).
enum Met<'a> {
    Value(Kind<'a>),
    Strings(&'a [Node<'a>]),
}

/// Reads the (key, value) pairs of a row's metadata text.
struct Reader {
    buffers: Buffers,
    tape: Option<Tape<'static>>,
    text: Vec<u8>,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader { buffers: Buffers::default(), tape: Some(Tape::null()), text: Vec::new() }
    }
}

impl Reader {
    /// Calls `each` with every (key, value) pair of `metadata`, a JSON
    /// object as the decoder writes it.
    fn pairs(&mut self, metadata: &[u8], mut each: impl FnMut(&str, Met<'_>)) {
        self.text.clear();
        self.text.extend_from_slice(metadata);
        let mut tape = self.tape.take().unwrap_or_else(Tape::null).reset();
        let parsed = simd_json::fill_tape(&mut self.text, &mut self.buffers, &mut tape);
        debug_assert!(parsed.is_ok(), "stored metadata is valid JSON");
        if parsed.is_ok() {
            let nodes = &tape.0[..];
            let mut at = 1;
            while at + 1 < nodes.len() {
                let Node::String(key) = nodes[at] else {
                    debug_assert!(false, "stored metadata is an object of values");
                    break;
                };
                let value = at + 1;
                let (met, next) = match nodes[value] {
                    Node::String(s) => (Some(Met::Value(Kind::Str(s))), value + 1),
                    Node::Static(StaticNode::I64(n)) => (Some(Met::Value(Kind::Int(n))), value + 1),
                    Node::Static(StaticNode::U64(n)) => (Some(Met::Value(Kind::unsigned(n))), value + 1),
                    Node::Static(StaticNode::F64(x)) => (Some(Met::Value(Kind::number(x))), value + 1),
                    Node::Static(StaticNode::Bool(b)) => (Some(Met::Value(Kind::Bool(b))), value + 1),
                    Node::Array { count, .. } => {
                        (Some(Met::Strings(&nodes[value + 1..value + 1 + count])), value + 1 + count)
                    }
                    Node::Object { count, .. } => (None, value + 1 + count),
                    Node::Static(StaticNode::Null) => (None, value + 1),
                };
                if let Some(met) = met {
                    each(key, met);
                }
                at = next;
            }
        }
        self.tape = Some(tape.reset());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::filter::Value;

    fn rows(set: &RoaringBitmap) -> Vec<u32> {
        set.iter().collect()
    }

    fn eq(key: &str, value: &str) -> Filter {
        Filter::Eq(key.into(), value.into())
    }

    /// A metadata index of `texts`, every key of `keys` indexed.
    fn indexed(texts: &[&str], keys: &[&str]) -> (MetaIndex, Vec<Text>) {
        let texts: Vec<Text> = texts.iter().map(|text| Text::from_slice(text.as_bytes())).collect();
        let mut meta = MetaIndex::default();
        let filter = Filter::And(keys.iter().map(|&key| Filter::Exists(key.into())).collect());
        meta.index_keys(&filter, &texts);
        (meta, texts)
    }

    #[test]
    fn follows_adds_moves_and_removes() {
        let (mut meta, _) = indexed(&[r#"{"lang":"en","year":"2001"}"#], &["lang", "year"]);
        meta.add(1, br#"{"lang":"fr","year":"2001.0"}"#);
        meta.add(2, br#"{"lang":"en","q\"uote":"a\\b\n"}"#);
        let texts = [
            r#"{"lang":"en","year":"2001"}"#,
            r#"{"lang":"fr","year":"2001.0"}"#,
            r#"{"lang":"en","q\"uote":"a\\b\n"}"#,
        ];
        let texts: Vec<Text> = texts.iter().map(|text| Text::from_slice(text.as_bytes())).collect();
        meta.index_keys(&Filter::Exists("q\"uote".into()), &texts);
        assert_eq!(rows(&meta.matching(&eq("lang", "en"), 3)), [0, 2]);
        assert_eq!(rows(&meta.matching(&eq("q\"uote", "a\\b\n"), 3)), [2], "escapes are read");
        let year = Filter::Range("year".into(), Bound::Included(2001.0), Bound::Included(2001.0));
        assert_eq!(rows(&meta.matching(&year, 3)), [0, 1], "2001 and 2001.0 are one number");
        // Row 0 goes; row 2 moves into its place.
        meta.remove(0, br#"{"lang":"en","year":"2001"}"#);
        meta.moved(2, 0, br#"{"lang":"en","q\"uote":"a\\b\n"}"#);
        assert_eq!(rows(&meta.matching(&eq("lang", "en"), 2)), [0]);
        assert_eq!(rows(&meta.matching(&year, 2)), [1]);
        meta.remove(1, br#"{"lang":"fr","year":"2001.0"}"#);
        meta.remove(0, br#"{"lang":"en","q\"uote":"a\\b\n"}"#);
        assert_eq!(meta.sizes(), (3, 0), "nothing is kept for rows that are gone");
    }

    #[test]
    fn a_key_is_indexed_when_a_filter_first_names_it() {
        let (mut meta, texts) = indexed(&[r#"{"a":"1","b":"x"}"#, "", r#"{"b":"y"}"#], &[]);
        assert_eq!(meta.sizes(), (0, 0), "no key indexed before a filter names it");
        meta.add(3, br#"{"a":"2"}"#);
        let filter = Filter::Or(vec![eq("b", "y"), Filter::Not(Box::new(Filter::Exists("a".into())))]);
        meta.index_keys(&filter, &texts);
        assert_eq!(meta.sizes(), (2, 3), "a and b, from the texts: 1, x and y");
        meta.index_keys(&eq("nobody", "x"), &texts);
        assert_eq!(meta.sizes(), (2, 3), "a key no row holds is not kept");
        assert_eq!(rows(&meta.matching(&filter, 3)), [1, 2]);
        meta.add(3, br#"{"a":"2"}"#);
        assert_eq!(rows(&meta.matching(&Filter::Exists("a".into()), 4)), [0, 3], "then follows the rows");
    }

    #[test]
    fn operators_combine_as_sets() {
        let texts = [r#"{"t":"a","n":"1"}"#, r#"{"t":"b","n":"-2.5"}"#, r#"{"t":"c","n":"x"}"#, ""];
        let (meta, _) = indexed(&texts, &["t", "n", "missing"]);
        let m = |filter: Filter| rows(&meta.matching(&filter, 4));
        let range = |low, high| Filter::Range("n".into(), low, high);
        assert_eq!(m(Filter::All), [0, 1, 2, 3]);
        assert_eq!(m(Filter::Not(Box::new(eq("t", "a")))), [1, 2, 3], "$ne matches rows without the key");
        assert_eq!(m(Filter::In("t".into(), vec!["c".into(), "a".into(), "z".into()])), [0, 2]);
        assert_eq!(m(Filter::In("t".into(), vec![])), [] as [u32; 0]);
        assert_eq!(m(Filter::Exists("n".into())), [0, 1, 2]);
        assert_eq!(m(range(Bound::Excluded(-2.5), Bound::Unbounded)), [0]);
        assert_eq!(m(range(Bound::Included(-2.5), Bound::Unbounded)), [0, 1]);
        assert_eq!(m(range(Bound::Unbounded, Bound::Excluded(1.0))), [1]);
        assert_eq!(m(range(Bound::Included(5.0), Bound::Included(1.0))), [] as [u32; 0], "reversed bounds");
        assert_eq!(m(range(Bound::Excluded(1.0), Bound::Excluded(1.0))), [] as [u32; 0]);
        assert_eq!(m(range(Bound::Included(-0.0), Bound::Included(0.0))), [] as [u32; 0]);
        assert_eq!(m(Filter::And(vec![Filter::Exists("n".into()), Filter::Not(Box::new(eq("t", "b")))])), [0, 2]);
        assert_eq!(m(Filter::Or(vec![eq("t", "b"), eq("missing", "x"), eq("t", "c")])), [1, 2]);
        assert_eq!(m(Filter::And(vec![])), [0, 1, 2, 3]);
        assert_eq!(m(Filter::Or(vec![])), [] as [u32; 0]);
    }

    #[test]
    fn values_match_by_type_and_arrays_by_element() {
        let texts = [
            r#"{"n":1,"b":true,"tags":["x","y","x"],"s":"1"}"#,
            r#"{"n":1.5,"b":false,"tags":[],"s":"x"}"#,
            r#"{"n":"1","tags":"x"}"#,
            r#"{"n":9007199254740993,"b":"true","tags":["y"]}"#,
            r#"{"n":-0.0,"tags":["1"]}"#,
            r#"{"n":1.8446744073709552e19}"#,
        ];
        let (mut meta, _) = indexed(&texts, &["n", "b", "tags", "s"]);
        let m = |meta: &MetaIndex, filter: Filter| rows(&meta.matching(&filter, 6));
        let eq = |key: &str, kind: Kind<'_>| Filter::Eq(key.into(), Value::new(kind));
        let contains = |key: &str, value: &str| Filter::Contains(key.into(), value.into());
        assert_eq!(m(&meta, eq("n", Kind::Int(1))), [0], "the number 1, not the string \"1\"");
        assert_eq!(m(&meta, eq("n", Kind::number(1.0))), [0], "1.0 is the number 1");
        assert_eq!(m(&meta, eq("n", Kind::Str("1"))), [2]);
        assert_eq!(m(&meta, eq("n", Kind::number(1.5))), [1]);
        assert_eq!(m(&meta, eq("n", Kind::Int(0))), [4], "-0.0 is 0");
        assert_eq!(m(&meta, eq("n", Kind::Int(9_007_199_254_740_993))), [3]);
        assert_eq!(m(&meta, eq("n", Kind::Int(9_007_199_254_740_992))), [] as [u32; 0], "integers are exact");
        assert_eq!(m(&meta, eq("n", Kind::unsigned(u64::MAX))), [5]);
        assert_eq!(m(&meta, eq("b", Kind::Bool(true))), [0], "not the string \"true\"");
        assert_eq!(m(&meta, eq("b", Kind::Bool(false))), [1]);
        assert_eq!(
            m(&meta, Filter::In("n".into(), [Kind::Int(1), Kind::Str("1"), Kind::Bool(true)].map(Value::new).to_vec())),
            [0, 2]
        );
        assert_eq!(m(&meta, eq("tags", Kind::Str("x"))), [2], "an array equals no string");
        assert_eq!(m(&meta, contains("tags", "x")), [0, 2], "an array holding it, or the string");
        assert_eq!(m(&meta, contains("tags", "y")), [0, 3]);
        assert_eq!(m(&meta, contains("tags", "1")), [4]);
        assert_eq!(m(&meta, contains("s", "1")), [0]);
        assert_eq!(m(&meta, contains("n", "1")), [2], "a number holds no string");
        assert_eq!(m(&meta, Filter::Exists("tags".into())), [0, 1, 2, 3, 4], "an empty array is a value");
        let range = |low, high| Filter::Range("n".into(), low, high);
        assert_eq!(m(&meta, range(Bound::Included(1.0), Bound::Included(1.5))), [0, 1, 2], "numbers and decimals");
        assert_eq!(m(&meta, range(Bound::Excluded(1e19), Bound::Unbounded)), [5]);
        // Rows go and move: every set follows, repeated elements included.
        meta.remove(0, texts[0].as_bytes());
        meta.moved(5, 0, texts[5].as_bytes());
        meta.moved(3, 5, texts[3].as_bytes());
        assert_eq!(m(&meta, contains("tags", "x")), [2]);
        assert_eq!(m(&meta, contains("tags", "y")), [5]);
        assert_eq!(m(&meta, eq("n", Kind::unsigned(u64::MAX))), [0]);
        for (row, text) in [(0, 5), (1, 1), (2, 2), (4, 4), (5, 3)] {
            meta.remove(row, texts[text].as_bytes());
        }
        assert_eq!(meta.sizes(), (4, 0), "nothing is kept for rows that are gone");
    }

    #[test]
    fn number_order_is_numeric_order() {
        let xs = [f64::NEG_INFINITY, -1e300, -2.5, -1e-300, 0.0, 1e-300, 1.0, 2.5, 1e300, f64::INFINITY];
        for pair in xs.windows(2) {
            assert!(order_of(pair[0]) < order_of(pair[1]), "{pair:?}");
        }
    }
}
