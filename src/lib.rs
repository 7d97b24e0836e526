//! quiver: a vector database server.
//!
//! It keeps named indexes of embeddings (an integer id, an `f32` vector, a
//! string-to-string metadata map) and answers exact k-nearest-neighbour
//! searches over HTTP/JSON (the interface is `shared/spec/interface.md`).
//!
//! A request travels one way through the crate:
//!
//! ```text
//! socket -> connection (read buffer) -> http (head, body framing)
//!        -> api (route, API key, JSON decode) -> store (flat f32 rows, SIMD scan)
//! ```
//!
//! and its reply comes back the same way: the api writes the envelope straight
//! into the connection's write buffer, and the loop sends it.
//!
//! - [`server`]: the single-threaded mio loop; accept, readiness, the tick, timeouts.
//! - [`connection`]: one socket's buffers and state.
//! - [`http`]: resumable request parsing (httparse) and the response writer.
//! - [`api`]: routing, authentication, body decoding (simd-json) and the endpoints.
//! - [`store`]: indexes, distance kernels (`wide` SIMD and a scalar reference), top-k.
//! - [`auth`]: the API key.
//! - [`limits`]: every limit, with why; [`config`]: the command line.
//!
//! `store` knows nothing of HTTP or sockets, and `http` nothing of the store.
//! Every change to the store goes through `Store::apply`, the one place a
//! write-ahead log sits in front of.

pub mod api;
pub mod auth;
pub mod config;
pub mod connection;
pub mod db;
pub mod http;
pub mod limits;
pub mod server;
pub mod snapshot;
pub mod store;
pub mod wal;
