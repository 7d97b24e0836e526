//! Arbitrary bytes into the request framing. Property: never panics, and
//! feeding the bytes in pieces of any size parses to the same requests and
//! errors as feeding them whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiver::http::request::parse_in_pieces;

fuzz_target!(|input: &[u8]| {
    let Some((&piece, bytes)) = input.split_first() else { return };
    let (head_bytes_max, body_bytes_max) = (512, 4096);
    let whole = parse_in_pieces(bytes, bytes.len().max(1), head_bytes_max, body_bytes_max);
    let pieces = parse_in_pieces(bytes, usize::from(piece % 16) + 1, head_bytes_max, body_bytes_max);
    assert_eq!(whole, pieces);
});
