//! HTTP/1.x framing: request heads and bodies in, response heads out.
//! Knows nothing of the API's routes or of the store.

pub mod buffer;
pub mod head;
pub mod pieces;
pub mod request;
pub mod response;

pub use buffer::ReadBuf;
pub use head::{Framing, Head, HttpError, Method};
pub use request::{Event, FramingLimits, Parser};
