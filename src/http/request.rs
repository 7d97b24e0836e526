//! A resumable HTTP/1.x request parser.
//!
//! "Need more bytes" is a state, not an error: the parser keeps where it is
//! between calls, so a request split at any byte parses exactly as the whole.
//! Heads are parsed by httparse once their terminating blank line is in;
//! bodies are framed by `Content-Length` (left in the read buffer, so they can
//! be decoded in place) or `Transfer-Encoding: chunked` (de-chunked into a
//! reused buffer). The head's fields are read in `head`. This module knows
//! nothing of routes or of the store.

use super::buffer::ReadBuf;
use super::head::{find_head_end, read_head, Framing, Head, HttpError};
use crate::limits::HEADERS_COUNT_CEILING;

/// Chunk-size lines (with extensions) and trailer lines longer than this are refused.
const CHUNK_LINE_BYTES_MAX: usize = 4096;

/// What one request may be, in bytes and pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FramingLimits {
    pub head_bytes_max: usize,
    /// Most header fields (at most `HEADERS_COUNT_CEILING`).
    pub headers_max: usize,
    pub body_bytes_max: usize,
    /// Most chunks in a chunked body.
    pub chunks_max: usize,
    /// Largest single chunk.
    pub chunk_bytes_max: usize,
}

/// What `advance` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Nothing more can be done until more bytes arrive.
    NeedMore,
    /// A head was parsed into `head`; its body (if any) is not in yet.
    Head,
    /// The request is complete: `request` gives its head and body; call `finish` after.
    Request,
    Error(HttpError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Head {
        scanned: usize,
    },
    /// Content-Length body, left in the read buffer until it is all there.
    Length {
        len: usize,
    },
    /// Content-Length body being thrown away as it arrives.
    Discarding {
        remaining: usize,
    },
    ChunkSize,
    ChunkData {
        remaining: usize,
    },
    ChunkDataEnd,
    Trailers {
        bytes: usize,
    },
    /// Complete; `body_len` bytes at the front of the read buffer (Length) or in `chunked`.
    Complete {
        in_read_buf: usize,
    },
    Failed,
}

pub struct Parser {
    pub head: Head,
    state: State,
    /// De-chunked body of the current request.
    chunked: Vec<u8>,
    /// Bytes of a chunked body count even when discarded.
    chunked_len: usize,
    chunks: usize,
    discard: bool,
    limits: FramingLimits,
}

impl Parser {
    pub fn new(limits: FramingLimits) -> Parser {
        assert!(limits.headers_max <= HEADERS_COUNT_CEILING);
        Parser {
            head: Head::new(),
            state: State::Head { scanned: 0 },
            chunked: Vec::new(),
            chunked_len: 0,
            chunks: 0,
            discard: false,
            limits,
        }
    }

    pub fn limits(&self) -> FramingLimits {
        self.limits
    }

    /// True between requests, when no byte of a next request has been taken.
    pub fn is_idle(&self) -> bool {
        self.state == State::Head { scanned: 0 }
    }

    /// Throws the body of the current request away as it arrives (for a
    /// request refused at its head). Call right after `Event::Head`.
    pub fn discard_body(&mut self) {
        self.discard = true;
        if let State::Length { len } = self.state {
            self.state = State::Discarding { remaining: len };
        }
    }

    /// Moves the parse as far as the buffered bytes allow.
    pub fn advance(&mut self, buf: &mut ReadBuf) -> Event {
        loop {
            let step = match self.state {
                State::Head { scanned } => self.parse_head(buf, scanned),
                State::Length { len } => {
                    if buf.pending().len() >= len {
                        self.state = State::Complete { in_read_buf: len };
                        return Event::Request;
                    }
                    buf.reserve_pending(len);
                    return Event::NeedMore;
                }
                State::Discarding { remaining } => {
                    let n = remaining.min(buf.pending().len());
                    buf.consume(n);
                    if n == remaining {
                        self.state = State::Complete { in_read_buf: 0 };
                        return Event::Request;
                    }
                    self.state = State::Discarding { remaining: remaining - n };
                    return Event::NeedMore;
                }
                State::ChunkSize => self.parse_chunk_size(buf),
                State::ChunkData { remaining } => self.take_chunk_data(buf, remaining),
                State::ChunkDataEnd => match buf.pending() {
                    [b'\r', b'\n', ..] => {
                        buf.consume(2);
                        self.state = State::ChunkSize;
                        Ok(None)
                    }
                    [b'\n', ..] => {
                        buf.consume(1);
                        self.state = State::ChunkSize;
                        Ok(None)
                    }
                    [] | [b'\r'] => return Event::NeedMore,
                    _ => Err(HttpError::Malformed("chunk data not followed by CRLF")),
                },
                State::Trailers { bytes } => self.skip_trailer_line(buf, bytes),
                State::Complete { .. } => return Event::Request,
                State::Failed => return Event::Error(HttpError::Malformed("connection failed")),
            };
            match step {
                Ok(None) => continue,
                Ok(Some(event)) => return event,
                Err(error) => {
                    self.state = State::Failed;
                    return Event::Error(error);
                }
            }
        }
    }

    /// The complete request's head and body. Only valid after `Event::Request`.
    pub fn request<'a>(&'a mut self, buf: &'a mut ReadBuf) -> (&'a Head, &'a mut [u8]) {
        match self.state {
            State::Complete { in_read_buf } if self.head.framing == Framing::Chunked => {
                debug_assert_eq!(in_read_buf, 0);
                (&self.head, &mut self.chunked)
            }
            State::Complete { in_read_buf } => (&self.head, &mut buf.pending_mut()[..in_read_buf]),
            _ => panic!("request before it is complete"),
        }
    }

    /// Consumes the complete request and readies the parser for the next one.
    pub fn finish(&mut self, buf: &mut ReadBuf) {
        let State::Complete { in_read_buf } = self.state else {
            panic!("finish before the request is complete");
        };
        buf.consume(in_read_buf);
        self.chunked.clear();
        if self.chunked.capacity() > crate::limits::BUF_KEEP_BYTES_MAX {
            self.chunked = Vec::new();
        }
        self.chunked_len = 0;
        self.chunks = 0;
        self.discard = false;
        self.state = State::Head { scanned: 0 };
    }

    fn parse_head(&mut self, buf: &mut ReadBuf, scanned: usize) -> Result<Option<Event>, HttpError> {
        let pending = buf.pending();
        // Blank lines before a request line are allowed (RFC 9112 2.2).
        let leading = pending.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
        if leading > 0 {
            buf.consume(leading);
            return Ok(None);
        }
        let Some(head_len) = find_head_end(pending, scanned) else {
            if pending.len() > self.limits.head_bytes_max {
                return Err(HttpError::HeadTooLarge);
            }
            // Resume the search where it stopped, less a terminator's length.
            self.state = State::Head { scanned: pending.len().saturating_sub(3) };
            return Ok(Some(Event::NeedMore));
        };
        if head_len > self.limits.head_bytes_max {
            return Err(HttpError::HeadTooLarge);
        }
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_COUNT_CEILING];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&pending[..head_len]) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err(HttpError::Malformed("incomplete request head")),
            Err(httparse::Error::TooManyHeaders) => return Err(HttpError::TooManyHeaders),
            Err(_) => return Err(HttpError::Malformed("invalid request line or header")),
        }
        if request.headers.len() > self.limits.headers_max {
            return Err(HttpError::TooManyHeaders);
        }
        read_head(&request, &mut self.head, self.limits.body_bytes_max)?;
        buf.consume(head_len);
        self.state = match self.head.framing {
            Framing::None => State::Complete { in_read_buf: 0 },
            Framing::Length(len) => State::Length { len },
            Framing::Chunked => State::ChunkSize,
        };
        Ok(Some(Event::Head))
    }

    fn parse_chunk_size(&mut self, buf: &mut ReadBuf) -> Result<Option<Event>, HttpError> {
        let pending = buf.pending();
        match httparse::parse_chunk_size(pending) {
            // A complete line is held to the same length as an incomplete one.
            Ok(httparse::Status::Complete((consumed, _))) if consumed > CHUNK_LINE_BYTES_MAX => {
                Err(HttpError::Malformed("chunk size line too long"))
            }
            Ok(httparse::Status::Complete((consumed, size))) => {
                buf.consume(consumed);
                let size = usize::try_from(size).map_err(|_| HttpError::BodyTooLarge)?;
                if size == 0 {
                    self.state = State::Trailers { bytes: 0 };
                    return Ok(None);
                }
                if self.chunked_len.saturating_add(size) > self.limits.body_bytes_max {
                    return Err(HttpError::BodyTooLarge);
                }
                if size > self.limits.chunk_bytes_max {
                    return Err(HttpError::ChunkTooLarge);
                }
                self.chunks += 1;
                if self.chunks > self.limits.chunks_max {
                    return Err(HttpError::TooManyChunks);
                }
                self.state = State::ChunkData { remaining: size };
                Ok(None)
            }
            Ok(httparse::Status::Partial) if pending.len() >= CHUNK_LINE_BYTES_MAX => {
                Err(HttpError::Malformed("chunk size line too long"))
            }
            Ok(httparse::Status::Partial) => Ok(Some(Event::NeedMore)),
            Err(_) => Err(HttpError::Malformed("invalid chunk size")),
        }
    }

    fn take_chunk_data(&mut self, buf: &mut ReadBuf, remaining: usize) -> Result<Option<Event>, HttpError> {
        let available = buf.pending();
        let n = remaining.min(available.len());
        if n == 0 {
            return Ok(Some(Event::NeedMore));
        }
        if !self.discard {
            self.chunked.extend_from_slice(&available[..n]);
        }
        self.chunked_len += n;
        buf.consume(n);
        self.state = if n == remaining { State::ChunkDataEnd } else { State::ChunkData { remaining: remaining - n } };
        Ok(None)
    }

    /// Trailer fields are read and ignored, up to the blank line that ends them.
    fn skip_trailer_line(&mut self, buf: &mut ReadBuf, bytes: usize) -> Result<Option<Event>, HttpError> {
        // Every line counts against the limit, the blank one that ends the
        // trailers included, so the outcome is the same however the bytes arrive.
        let pending = buf.pending();
        let Some(newline) = pending.iter().position(|&b| b == b'\n') else {
            if bytes + pending.len() > self.limits.head_bytes_max {
                return Err(HttpError::HeadTooLarge);
            }
            return Ok(Some(Event::NeedMore));
        };
        let bytes = bytes + newline + 1;
        if bytes > self.limits.head_bytes_max {
            return Err(HttpError::HeadTooLarge);
        }
        let line = &pending[..newline];
        let blank = line.is_empty() || line == b"\r";
        buf.consume(newline + 1);
        if blank {
            self.state = State::Complete { in_read_buf: 0 };
            return Ok(Some(Event::Request));
        }
        self.state = State::Trailers { bytes };
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::pieces::{parse_in_pieces, Parsed};
    use crate::http::Method;

    const LIMITS: FramingLimits = FramingLimits {
        head_bytes_max: 1024,
        headers_max: 64,
        body_bytes_max: 1 << 20,
        chunks_max: 8,
        chunk_bytes_max: 4096,
    };

    fn parse_all(bytes: &[u8], step: usize) -> Vec<Parsed> {
        parse_in_pieces(bytes, step, LIMITS)
    }

    const PIPELINE: &[u8] = b"GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n\
        PUT /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
        POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
        3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n\
        DELETE /d HTTP/1.0\r\n\r\n";

    #[test]
    fn pipelined_requests_parse_the_same_at_every_split() {
        let whole = parse_all(PIPELINE, PIPELINE.len());
        assert_eq!(
            whole,
            vec![
                Ok((Method::Get, "/a".into(), vec![])),
                Ok((Method::Put, "/b".into(), b"hello".to_vec())),
                Ok((Method::Post, "/c".into(), b"abcde".to_vec())),
                Ok((Method::Delete, "/d".into(), vec![])),
            ]
        );
        for step in 1..PIPELINE.len() {
            assert_eq!(parse_all(PIPELINE, step), whole, "step {step}");
        }
    }

    #[test]
    fn limits_and_malformations_are_errors() {
        let big_head = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(2000));
        assert_eq!(parse_all(big_head.as_bytes(), 7), vec![Err(HttpError::HeadTooLarge)]);
        let big_body = b"PUT / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n";
        assert_eq!(parse_all(big_body, 100), vec![Err(HttpError::BodyTooLarge)]);
        let both = b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(parse_all(both, 100)[0], Err(HttpError::Malformed(_))));
        assert!(matches!(parse_all(b"\x00\x01garbage\r\n\r\n", 100)[0], Err(HttpError::Malformed(_))));
        let bad_chunk = b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(matches!(parse_all(bad_chunk, 100)[0], Err(HttpError::Malformed(_))));
        let many: String = (0..70).map(|i| format!("H{i}:v\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse_all(many.as_bytes(), 1000), vec![Err(HttpError::TooManyHeaders)]);
        let chunks: String = (0..9).map(|_| "1\r\nx\r\n").collect();
        let chunked = format!("PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}0\r\n\r\n");
        assert_eq!(parse_all(chunked.as_bytes(), 1000), vec![Err(HttpError::TooManyChunks)]);
        let big_chunk = "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1001\r\n";
        assert_eq!(parse_all(big_chunk.as_bytes(), 1000), vec![Err(HttpError::ChunkTooLarge)]);
    }

    /// Found by the http_request fuzzer: a blank line ending the trailers
    /// right at the limit passed whole but failed when fed byte by byte.
    #[test]
    fn trailer_and_chunk_line_limits_do_not_depend_on_the_split() {
        let limits = FramingLimits { head_bytes_max: 64, ..LIMITS };
        for trailer_bytes in 40..70 {
            let trailer = format!("X: {}\r\n", "t".repeat(trailer_bytes - 5));
            let request = format!("PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n{trailer}\r\n");
            let whole = parse_in_pieces(request.as_bytes(), request.len(), limits);
            for step in 1..8 {
                assert_eq!(
                    parse_in_pieces(request.as_bytes(), step, limits),
                    whole,
                    "trailer {trailer_bytes}, step {step}"
                );
            }
        }
        let long_extension =
            format!("PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(5000));
        let whole = parse_in_pieces(long_extension.as_bytes(), long_extension.len(), LIMITS);
        assert!(matches!(whole[..], [Err(HttpError::Malformed(_))]), "{whole:?}");
        assert_eq!(parse_in_pieces(long_extension.as_bytes(), 7, LIMITS), whole);
    }

    #[test]
    fn head_fields() {
        let mut parser = Parser::new(FramingLimits { body_bytes_max: 1024, ..tests::LIMITS });
        let mut buf = ReadBuf::with_capacity(64);
        buf.extend(b"PUT /x HTTP/1.0\r\nConnection: Keep-Alive\r\nexpect: 100-continue\r\nX-Service-Api-Key:  k1 \r\nContent-Length: 2\r\n\r\n");
        assert_eq!(parser.advance(&mut buf), Event::Head);
        assert!(parser.head.http10 && parser.head.keep_alive && parser.head.expect_continue);
        assert_eq!(parser.head.api_key, b"k1");
        assert_eq!(parser.head.framing, Framing::Length(2));
        assert_eq!(parser.advance(&mut buf), Event::NeedMore);
    }

    #[test]
    fn the_eigen_key_header_is_an_alias_that_yields_to_the_service_header() {
        let key_of = |headers: &str| {
            let mut parser = Parser::new(FramingLimits { body_bytes_max: 1024, ..tests::LIMITS });
            let mut buf = ReadBuf::with_capacity(64);
            buf.extend(format!("GET / HTTP/1.1\r\n{headers}\r\n").as_bytes());
            assert_eq!(parser.advance(&mut buf), Event::Head);
            String::from_utf8(parser.head.api_key.clone()).unwrap()
        };
        assert_eq!(key_of("X-Eigen-API-Key: e\r\n"), "e");
        assert_eq!(key_of("X-Eigen-API-Key: e\r\nX-Service-API-Key: s\r\n"), "s");
        assert_eq!(key_of("X-Service-API-Key: s\r\nx-eigen-api-key: e\r\n"), "s");
        assert_eq!(key_of(""), "");
    }

    #[test]
    fn discarded_bodies_are_skipped() {
        let mut parser = Parser::new(FramingLimits { body_bytes_max: 1024, ..tests::LIMITS });
        let mut buf = ReadBuf::with_capacity(64);
        buf.extend(b"PUT /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nab");
        assert_eq!(parser.advance(&mut buf), Event::Head);
        parser.discard_body();
        assert_eq!(parser.advance(&mut buf), Event::NeedMore);
        buf.extend(b"cGET /y HTTP/1.1\r\n\r\n");
        assert_eq!(parser.advance(&mut buf), Event::Request);
        assert!(parser.request(&mut buf).1.is_empty());
        parser.finish(&mut buf);
        assert_eq!(parser.advance(&mut buf), Event::Head);
        assert_eq!(parser.head.path, "/y");
    }
}
