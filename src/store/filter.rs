//! A filter over the metadata of rows: which rows a search, a scroll or a
//! delete may touch. The API decodes a request's `filter` into a
//! [`Filter`]; an [`Index`](super::Index) answers which of its rows match
//! from its metadata index, without reading any row's metadata text.
//!
//! The operators of the wire format reduce to these few: `$ne` is `Not(Eq)`,
//! `$nin` is `Not(In)`, `$exists: false` is `Not(Exists)`, and each of
//! `$gt`, `$gte`, `$lt`, `$lte` is a `Range` open on one side.
//!
//! # Values compare by type
//! A metadata value is a string, a number, a boolean or an array of
//! strings. `Eq` and `In` compare a [`Value`] with values of its own type
//! only: the number 1 matches `1` and `1.0`, never the string `"1"`.
//! Numbers compare exactly: every integer of i64 is itself, so
//! 9007199254740993 and 9007199254740992 (one f64) stay apart, and a float
//! with an integral value in i64's range is that integer. `Range` reads
//! numbers, and strings that read as decimals ([`number_of`]), as f64.
//! `Contains` matches an array that holds the string, or the string itself.

use std::fmt::Write;
use std::ops::Bound;

/// Which rows match, by their metadata.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    /// Every row (`{}`).
    All,
    /// Rows whose value for the key is this value (of its type).
    Eq(Box<str>, Value),
    /// Rows whose value for the key is one of these values (none if empty).
    In(Box<str>, Vec<Value>),
    /// Rows whose value for the key is an array holding this string (a
    /// `Kind::Str`), or this string.
    Contains(Box<str>, Value),
    /// Rows that have the key.
    Exists(Box<str>),
    /// Rows whose value for the key is a number, or a string that reads as
    /// a decimal number ([`number_of`]), within the bounds.
    Range(Box<str>, Bound<f64>, Bound<f64>),
    /// Rows the filter does not match.
    Not(Box<Filter>),
    /// Rows every filter matches.
    And(Vec<Filter>),
    /// Rows some filter matches.
    Or(Vec<Filter>),
}

impl Filter {
    /// Calls `each` with every metadata key the filter names.
    pub fn each_key<'a>(&'a self, each: &mut impl FnMut(&'a str)) {
        match self {
            Filter::All => {}
            Filter::Eq(key, _)
            | Filter::In(key, _)
            | Filter::Contains(key, _)
            | Filter::Exists(key)
            | Filter::Range(key, ..) => each(key),
            Filter::Not(inner) => inner.each_key(each),
            Filter::And(filters) | Filter::Or(filters) => filters.iter().for_each(|filter| filter.each_key(each)),
        }
    }
}

/// One metadata value that is not an array, as filters compare it (module
/// doc), borrowed: a number is an `Int` whenever its value is an integer
/// of i64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind<'a> {
    Str(&'a str),
    Int(i64),
    /// A finite number that is not an integer of i64 (never `-0`).
    Float(f64),
    Bool(bool),
}

impl Kind<'_> {
    /// The number `x` (finite).
    pub fn number(x: f64) -> Kind<'static> {
        debug_assert!(x.is_finite());
        // 2^63 is an f64; every integral f64 in [-2^63, 2^63) is an i64.
        const TWO_63: f64 = 9_223_372_036_854_775_808.0;
        if x.fract() == 0.0 && (-TWO_63..TWO_63).contains(&x) {
            Kind::Int(x as i64)
        } else {
            Kind::Float(x + 0.0)
        }
    }

    /// The number `n`.
    pub fn unsigned(n: u64) -> Kind<'static> {
        i64::try_from(n).map_or(Kind::Float(n as f64), Kind::Int)
    }

    /// Writes into `key` the text the metadata index files this value
    /// under: a tag for the type, then the value, so that values of
    /// different types never share a set, and equal values always do.
    pub fn write_key(self, key: &mut String) {
        key.clear();
        match self {
            Kind::Str(s) => {
                key.push('s');
                key.push_str(s);
            }
            Kind::Int(n) => {
                key.push('i');
                key.push_str(itoa::Buffer::new().format(n));
            }
            Kind::Float(x) => {
                key.push('f');
                // The bits, not a decimal: equal floats, equal keys.
                write!(key, "{:016x}", x.to_bits()).expect("writing to a String cannot fail");
            }
            Kind::Bool(b) => key.push_str(if b { "b1" } else { "b0" }),
        }
    }

    /// The length of the text `write_key` writes.
    fn key_len(self) -> usize {
        1 + match self {
            Kind::Str(s) => s.len(),
            Kind::Int(n) => itoa::Buffer::new().format(n).len(),
            Kind::Float(_) => 16,
            Kind::Bool(_) => 1,
        }
    }
}

/// A value a filter compares with, held as its key in the metadata index
/// (`Kind::write_key`), made once when the filter is decoded: matching
/// looks it up without making anything.
#[derive(Clone, Debug, PartialEq)]
pub struct Value(Box<str>);

impl Value {
    pub fn new(kind: Kind<'_>) -> Value {
        // Exactly the key's length: one allocation, none to shrink it.
        let mut key = String::with_capacity(kind.key_len());
        kind.write_key(&mut key);
        debug_assert_eq!(key.len(), key.capacity());
        Value(key.into_boxed_str())
    }

    /// Its key in the metadata index.
    pub fn key(&self) -> &str {
        &self.0
    }

    /// The value again, read from its key.
    pub fn kind(&self) -> Kind<'_> {
        let (tag, rest) = self.0.split_at(1);
        match tag {
            "s" => Kind::Str(rest),
            "i" => Kind::Int(rest.parse().expect("written by write_key")),
            "f" => Kind::Float(f64::from_bits(u64::from_str_radix(rest, 16).expect("written by write_key"))),
            _ => Kind::Bool(rest == "1"),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::new(Kind::Str(s))
    }
}

/// A metadata value read as a number, as the range operators read it: the
/// whole string a decimal number (an optional sign, digits with an optional
/// fraction, an optional exponent), as the nearest f64. `None` for anything
/// else, `inf` and `nan` among them. `-0` reads as `0`: they compare equal.
pub fn number_of(value: &str) -> Option<f64> {
    let decimal = value.bytes().all(|b| matches!(b, b'0'..=b'9' | b'+' | b'-' | b'.' | b'e' | b'E'))
        && value.bytes().any(|b| b.is_ascii_digit());
    if !decimal {
        return None;
    }
    // The characters are those of a decimal number; the parse checks their order.
    value.parse::<f64>().ok().map(|x| x + 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_whole_decimal_strings() {
        for (text, number) in
            [("2024", 2024.0), ("-3.5", -3.5), ("+7", 7.0), ("1e3", 1000.0), ("1.", 1.0), (".5", 0.5), ("-0", 0.0)]
        {
            assert_eq!(number_of(text), Some(number), "{text}");
        }
        assert_eq!(number_of("-0").map(f64::to_bits), Some(0), "-0 reads as 0");
        assert_eq!(number_of("1e400"), Some(f64::INFINITY), "a decimal beyond f64 is infinite, still a number");
        for text in
            ["", "inf", "-inf", "nan", "NaN", "infinity", "1e", ".", "e5", "1-2", " 1", "1 ", "0x10", "1_000", "--1"]
        {
            assert_eq!(number_of(text), None, "{text:?}");
        }
    }

    #[test]
    fn numbers_are_one_value_whatever_their_form() {
        assert_eq!(Kind::number(1.0), Kind::Int(1), "an integral float is its integer");
        assert_eq!(Kind::number(-0.0), Kind::Int(0));
        assert_eq!(Kind::number(-9_223_372_036_854_775_808.0), Kind::Int(i64::MIN));
        assert_eq!(Kind::number(9_223_372_036_854_775_808.0), Kind::Float(9_223_372_036_854_775_808.0));
        assert_eq!(Kind::unsigned(u64::MAX), Kind::Float(18_446_744_073_709_551_615.0));
        assert_eq!(Kind::unsigned(7), Kind::Int(7));
        assert_ne!(Value::new(Kind::Int(9_007_199_254_740_993)), Value::new(Kind::number(9_007_199_254_740_992.0)));
        let all = [
            Kind::Str("1"),
            Kind::Str(""),
            Kind::Str("b1"),
            Kind::Int(1),
            Kind::Int(i64::MIN),
            Kind::Float(1.5),
            Kind::Float(-1e300),
            Kind::Bool(true),
            Kind::Bool(false),
        ];
        let values: Vec<Value> = all.iter().map(|&kind| Value::new(kind)).collect();
        for (value, kind) in values.iter().zip(all) {
            assert_eq!(value.kind(), kind, "read back from its key");
        }
        let keys: std::collections::HashSet<&str> = values.iter().map(Value::key).collect();
        assert_eq!(keys.len(), all.len(), "no two values share a key");
    }
}
