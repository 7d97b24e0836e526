//! quiver: a vector database server.
//!
//! It keeps named indexes of embeddings (an integer id, an `f32` vector, a
//! metadata map of strings, numbers, booleans and arrays of strings) and
//! answers exact k-nearest-neighbour
//! searches over HTTP/JSON (the interface is `docs/reference.md`).
//!
//! A request travels one way through the crate:
//!
//! ```text
//! socket -> connection (read buffer) -> http (head, body framing)
//!        -> api (route, API key, JSON decode) -> db -> store (flat f32 rows, SIMD scan)
//!                                                   -> wal (log, one sync per tick) -> disk
//! ```
//!
//! and its reply comes back the same way: the api writes the envelope straight
//! into the connection's write buffer, and the loop sends it once the turn's
//! writes are synced.
//!
//! - [`server`]: binding, signals, accepting; [`server::clients`] holds the
//!   connections and one turn of the loop over them (the same function the
//!   server and the tests run).
//! - [`connection`]: one socket's buffers and state; [`transport`]: its
//!   bytes on the wire, plain or TLS (rustls, driven by the same loop).
//! - [`http`]: resumable request parsing (httparse; heads in `head`, framing
//!   in `request`) and the response writer.
//! - [`api`]: routing (`route`), authentication, body decoding (simd-json),
//!   the endpoints, and search batching (`batch`: searches of one turn run
//!   together).
//! - [`endpoint`]: what a routed request asks for, shared by `api` and `metrics`.
//! - [`db`]: the durable store: apply, log, commit or undo, recovery; snapshots
//!   in `db::snapshots`.
//! - [`store`]: indexes (rows in `index`, scans and their threads in
//!   `scan`), distance kernels (SIMD for each instruction set and a
//!   scalar reference), the paths chosen for this CPU at start (`cpu`), the
//!   int8 codes and first pass of lone searches (`codes`), the bfloat16
//!   first pass of batched searches (`screen`), top-k.
//! - [`wal`]: the write-ahead log's records, segments, group commit and replay.
//! - [`cluster`]: replication by Raft (`raft`, tikv/raft-rs): the Raft log
//!   on disk, the node and the order a `Ready` is carried out in, the peer
//!   links, this node's turn. Its entries are the api's writes
//!   (`api::replicated`), applied on every node with the single node's code.
//! - [`snapshot`]: per-index snapshot files and the manifest.
//! - [`auth`]: the API key; [`files`]: files written whole, directories synced.
//! - [`metrics`]: Prometheus counters and histograms; [`log`]: operator logs;
//!   [`memory`]: freed memory given back to the system.
//! - [`limits`]: every limit, with why; [`config`]: the command line.
//! - [`tools`]: `quiver import` and `quiver export`, a client of the API
//!   for files of embeddings (.npy, .jsonl, .parquet); it shares nothing of
//!   the server but the JSON writer and the flags' environment names.
//!
//! Modules depend one way: `server` -> `connection` -> `api` -> `db` ->
//! `store`, `wal`, `snapshot`; `store` depends on nothing of the crate but
//! `limits`. `store`, `wal` and `snapshot` know nothing of HTTP or sockets,
//! and `http` nothing of the store. Every change to the store goes through
//! `Database::apply`, which logs it; nothing is answered before its sync.

pub mod api;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod db;
pub mod endpoint;
pub mod files;
pub mod http;
pub mod limits;
pub mod log;
pub mod memory;
pub mod metrics;
pub mod server;
pub mod snapshot;
pub mod store;
#[cfg(test)]
mod testing;
pub mod tools;
pub mod transport;
pub mod wal;
