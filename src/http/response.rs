//! Writes responses straight into a connection's write buffer.
//!
//! The head is written with a fixed-width `Content-Length` field whose digits
//! are filled in once the body has been written behind it, so a body is never
//! built elsewhere and copied.

/// Width of the Content-Length value: bodies up to 10^12 - 1 bytes.
const LENGTH_DIGITS: usize = 12;

/// Where a response's length field and body start in the write buffer.
#[must_use = "a response must be finished"]
pub struct Pending {
    status: u16,
    length_at: usize,
    body_at: usize,
}

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Starts a JSON response; the caller writes the body, then calls `finish`.
pub fn start(out: &mut Vec<u8>, status: u16, keep_alive: bool, allow: Option<&str>) -> Pending {
    start_typed(out, status, keep_alive, allow, "application/json")
}

/// Starts a response with the given content type.
pub fn start_typed(
    out: &mut Vec<u8>,
    status: u16,
    keep_alive: bool,
    allow: Option<&str>,
    content_type: &str,
) -> Pending {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(if keep_alive { b"Connection: keep-alive\r\n" } else { b"Connection: close\r\n" as &[u8] });
    if let Some(allow) = allow {
        out.extend_from_slice(b"Allow: ");
        out.extend_from_slice(allow.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Content-Length: ");
    let length_at = out.len();
    out.extend_from_slice(&[b' '; LENGTH_DIGITS]);
    out.extend_from_slice(b"\r\n\r\n");
    Pending { status, length_at, body_at: out.len() }
}

/// Fills in the length of the body written since `start`. The value is
/// right-aligned behind spaces, which HTTP reads as optional whitespace.
/// Returns the response's status.
pub fn finish(out: &mut [u8], pending: Pending) -> u16 {
    let body_bytes = (out.len() - pending.body_at) as u64;
    finish_sent_apart(out, pending, body_bytes)
}

/// Fills in the length of a body of `body_bytes` that is sent apart from
/// the buffer (a snapshot download's). Returns the response's status.
pub fn finish_sent_apart(out: &mut [u8], pending: Pending, body_bytes: u64) -> u16 {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(body_bytes).as_bytes();
    assert!(digits.len() <= LENGTH_DIGITS, "response body too large for its length field");
    let field = &mut out[pending.length_at..pending.length_at + LENGTH_DIGITS];
    field[LENGTH_DIGITS - digits.len()..].copy_from_slice(digits);
    pending.status
}

/// The interim answer to `Expect: 100-continue`.
pub fn write_continue(out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_is_patched_in() {
        let mut out = b"earlier".to_vec();
        let pending = start(&mut out, 405, false, Some("GET"));
        out.extend_from_slice(b"{\"a\":1}");
        assert_eq!(finish(&mut out, pending), 405);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("earlierHTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(text.contains("\r\nAllow: GET\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n"));
        assert!(text.contains("Content-Length:            7\r\n\r\n{\"a\":1}"));
    }
}
