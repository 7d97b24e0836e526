//! Request heads: the method, the target, and what the header fields say
//! of framing, the connection and the API key. httparse splits the head;
//! this module reads its fields.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
    Post,
    Delete,
    Other,
}

impl Method {
    /// Its name, for the log (`OTHER` for a method no endpoint takes).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Other => "OTHER",
        }
    }

    fn parse(name: &str) -> Method {
        match name {
            "GET" => Method::Get,
            "PUT" => Method::Put,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            _ => Method::Other,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(usize),
    Chunked,
}

/// The header that carries the API key.
pub const SERVICE_KEY_HEADER: &str = "X-Service-API-Key";
/// The header EigenDB's published client carries it in, taken when
/// `SERVICE_KEY_HEADER` is absent.
pub const EIGEN_KEY_HEADER: &str = "X-Eigen-API-Key";

/// What the parser knows of the current request once its head is in.
/// The strings are reused from request to request.
#[derive(Debug)]
pub struct Head {
    pub method: Method,
    /// The request target without its query string.
    pub path: String,
    /// The query string, without its `?` (empty when there is none).
    pub query: String,
    pub http10: bool,
    /// Whether the connection stays open after this request's answer.
    pub keep_alive: bool,
    pub expect_continue: bool,
    /// The `X-Service-API-Key` value (or, without it, `X-Eigen-API-Key`); empty when absent.
    pub api_key: Vec<u8>,
    /// The header `api_key` came from (`SERVICE_KEY_HEADER` when neither
    /// was sent), for the error that names it.
    pub api_key_header: &'static str,
    pub framing: Framing,
}

impl Head {
    pub(super) fn new() -> Head {
        Head {
            method: Method::Other,
            path: String::new(),
            query: String::new(),
            http10: false,
            keep_alive: true,
            expect_continue: false,
            api_key: Vec::new(),
            api_key_header: SERVICE_KEY_HEADER,
            framing: Framing::None,
        }
    }
}

/// Why the bytes on a connection cannot be taken as a request. After any of
/// these the connection is answered once and closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpError {
    Malformed(&'static str),
    HeadTooLarge,
    TooManyHeaders,
    BodyTooLarge,
    TooManyChunks,
    ChunkTooLarge,
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Malformed(why) => write!(f, "malformed HTTP request: {why}"),
            HttpError::HeadTooLarge => f.write_str("request head too large"),
            HttpError::TooManyHeaders => f.write_str("too many header fields"),
            HttpError::BodyTooLarge => f.write_str("request body too large"),
            HttpError::TooManyChunks => f.write_str("too many chunks in a chunked body"),
            HttpError::ChunkTooLarge => f.write_str("a chunk of a chunked body is too large"),
        }
    }
}

/// Where the head ends (just past its blank line), searching from `from`.
/// Accepts CRLF and bare LF line ends, as httparse does.
pub(super) fn find_head_end(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(offset) = bytes.get(i..)?.iter().position(|&b| b == b'\n') {
        let newline = i + offset;
        match bytes.get(newline + 1..) {
            Some([b'\n', ..]) => return Some(newline + 2),
            Some([b'\r', b'\n', ..]) => return Some(newline + 3),
            _ => i = newline + 1,
        }
    }
    None
}

pub(super) fn read_head(
    request: &httparse::Request<'_, '_>,
    head: &mut Head,
    body_bytes_max: usize,
) -> Result<(), HttpError> {
    let method = request.method.ok_or(HttpError::Malformed("no method"))?;
    let target = request.path.ok_or(HttpError::Malformed("no request target"))?;
    let version = request.version.ok_or(HttpError::Malformed("no HTTP version"))?;
    head.method = Method::parse(method);
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    head.path.clear();
    head.path.push_str(path);
    head.query.clear();
    head.query.push_str(query);
    head.http10 = version == 0;
    head.api_key.clear();
    head.api_key_header = SERVICE_KEY_HEADER;
    head.expect_continue = false;

    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    let mut service_key = false;
    for header in request.headers.iter() {
        let name = header.name;
        let value = header.value;
        if name.eq_ignore_ascii_case("content-length") {
            let parsed = parse_content_length(value)?;
            if length.is_some_and(|l| l != parsed) {
                return Err(HttpError::Malformed("conflicting Content-Length headers"));
            }
            length = Some(parsed);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let codings = std::str::from_utf8(value).map_err(|_| HttpError::Malformed("invalid Transfer-Encoding"))?;
            for coding in codings.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                if chunked || !coding.eq_ignore_ascii_case("chunked") {
                    return Err(HttpError::Malformed("unsupported Transfer-Encoding (only chunked is accepted)"));
                }
                chunked = true;
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                connection_close |= token.eq_ignore_ascii_case(b"close");
                connection_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("expect") {
            head.expect_continue = value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case("x-service-api-key") {
            head.api_key.clear();
            head.api_key.extend_from_slice(value.trim_ascii());
            head.api_key_header = SERVICE_KEY_HEADER;
            service_key = true;
        } else if name.eq_ignore_ascii_case("x-eigen-api-key") && !service_key {
            // The header EigenDB's published client sends: an alias, used
            // only when X-Service-API-Key is absent.
            head.api_key.clear();
            head.api_key.extend_from_slice(value.trim_ascii());
            head.api_key_header = EIGEN_KEY_HEADER;
        }
    }
    if chunked && length.is_some() {
        // Both framings at once is how requests are smuggled past proxies.
        return Err(HttpError::Malformed("both Content-Length and Transfer-Encoding"));
    }
    head.framing = match (chunked, length) {
        (true, _) => Framing::Chunked,
        (false, Some(0) | None) => Framing::None,
        (false, Some(len)) if len > body_bytes_max => return Err(HttpError::BodyTooLarge),
        (false, Some(len)) => Framing::Length(len),
    };
    head.keep_alive = if head.http10 { connection_keep_alive && !connection_close } else { !connection_close };
    Ok(())
}

fn parse_content_length(value: &[u8]) -> Result<usize, HttpError> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(HttpError::Malformed("invalid Content-Length"));
    }
    Ok(digits.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0')))
}
