//! Writing JSON values straight into an output buffer.

use std::fmt;

/// Writes `s` as a JSON string, quotes included.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    write_escaped(out, s);
    out.push(b'"');
}

/// Writes the inside of a JSON string: `"` and `\` escaped, control characters as `\u00XX`.
pub fn write_escaped(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut clean_from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[clean_from..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        } else {
            out.extend_from_slice(escape);
        }
        clean_from = i + 1;
    }
    out.extend_from_slice(&bytes[clean_from..]);
}

/// A `fmt::Write` that escapes what is formatted into it as JSON string content,
/// so messages can be formatted in place without an intermediate `String`.
pub struct Escaped<'a>(pub &'a mut Vec<u8>);

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_escaped(self.0, s);
        Ok(())
    }
}

/// Writes `"..."` with formatted, escaped content.
pub fn write_fmt_str(out: &mut Vec<u8>, args: fmt::Arguments<'_>) {
    out.push(b'"');
    fmt::Write::write_fmt(&mut Escaped(out), args).expect("writing to a Vec cannot fail");
    out.push(b'"');
}

pub fn write_i64(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

pub fn write_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Writes a finite f32 in the shortest form that reads back to the same f32.
pub fn write_f32(out: &mut Vec<u8>, x: f32) {
    debug_assert!(x.is_finite());
    out.extend_from_slice(ryu::Buffer::new().format_finite(x).as_bytes());
}

/// Writes a float as JSON (non-finite values, which JSON cannot hold, as 0).
pub fn write_f64(out: &mut Vec<u8>, x: f64) {
    let x = if x.is_finite() { x } else { 0.0 };
    out.extend_from_slice(ryu::Buffer::new().format_finite(x).as_bytes());
}

pub fn write_f32_array(out: &mut Vec<u8>, values: &[f32]) {
    out.push(b'[');
    for (i, &x) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_f32(out, x);
    }
    out.push(b']');
}

/// Writes a stored metadata text (empty means `{}`).
pub fn write_metadata(out: &mut Vec<u8>, metadata: &[u8]) {
    if metadata.is_empty() {
        out.extend_from_slice(b"{}");
    } else {
        out.extend_from_slice(metadata);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_quotes_backslashes_and_controls() {
        let mut out = Vec::new();
        write_str(&mut out, "a\"b\\c\nd\u{1}é");
        assert_eq!(String::from_utf8(out).unwrap(), r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn floats_are_shortest_round_trip() {
        let mut state = 0x1234_5678u32;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let x = f32::from_bits(state);
            if !x.is_finite() {
                continue;
            }
            let mut out = Vec::new();
            write_f32(&mut out, x);
            let text = std::str::from_utf8(&out).unwrap();
            assert_eq!(text.parse::<f32>().unwrap().to_bits(), x.to_bits(), "{text}");
        }
    }
}
