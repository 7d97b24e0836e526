//! A filter over the string metadata of rows: which rows a search, a scroll
//! or a delete may touch. The API decodes a request's `filter` into a
//! [`Filter`]; an [`Index`](super::Index) answers which of its rows match
//! from its metadata index, without reading any row's metadata text.
//!
//! The operators of the wire format reduce to these few: `$ne` is `Not(Eq)`,
//! `$nin` is `Not(In)`, `$exists: false` is `Not(Exists)`, and each of
//! `$gt`, `$gte`, `$lt`, `$lte` is a `Range` open on one side.

use std::ops::Bound;

/// Which rows match, by their metadata.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    /// Every row (`{}`).
    All,
    /// Rows whose value for the key is this string.
    Eq(Box<str>, Box<str>),
    /// Rows whose value for the key is one of these strings (none if empty).
    In(Box<str>, Vec<Box<str>>),
    /// Rows that have the key.
    Exists(Box<str>),
    /// Rows whose value for the key, read as a decimal number
    /// ([`number_of`]), lies within the bounds.
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
            Filter::Eq(key, _) | Filter::In(key, _) | Filter::Exists(key) | Filter::Range(key, ..) => each(key),
            Filter::Not(inner) => inner.each_key(each),
            Filter::And(filters) | Filter::Or(filters) => filters.iter().for_each(|filter| filter.each_key(each)),
        }
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
}
