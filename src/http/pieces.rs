//! Parsing a byte stream delivered in pieces: what the parser's unit tests
//! and the `http_request` fuzz target run, to check that how the bytes are
//! split never changes what is parsed.

use super::buffer::ReadBuf;
use super::request::{Event, FramingLimits, Parser};
use super::{HttpError, Method};

/// One request as `parse_in_pieces` reports it: method, path and body, or the
/// error that ended the connection.
pub type Parsed = Result<(Method, String, Vec<u8>), HttpError>;

/// Feeds `bytes` to a parser `piece_bytes` at a time, as a socket might
/// deliver them, and lists what it parsed. The split must not matter: this is
/// the property the unit tests and the `http_request` fuzz target check.
pub fn parse_in_pieces(bytes: &[u8], piece_bytes: usize, limits: FramingLimits) -> Vec<Parsed> {
    let mut parser = Parser::new(limits);
    let mut buf = ReadBuf::with_capacity(16);
    let mut out = Vec::new();
    for piece in bytes.chunks(piece_bytes.max(1)) {
        buf.extend(piece);
        loop {
            match parser.advance(&mut buf) {
                Event::NeedMore => break,
                Event::Head => continue,
                Event::Request => {
                    let (head, body) = parser.request(&mut buf);
                    out.push(Ok((head.method, head.path.clone(), body.to_vec())));
                    parser.finish(&mut buf);
                }
                Event::Error(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }
    out
}
