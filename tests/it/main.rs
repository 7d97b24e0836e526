//! quiver's integration tests: the real binary, a real socket, a real data
//! directory. Each module covers one concern.

/// Starting the server and a raw-TCP client.
mod harness;
/// Starting, killing and asking the nodes of a cluster.
mod nodes;

/// Counts each thread's allocations, for the zero-allocation test.
#[global_allocator]
static ALLOCATOR: allocations::Counting = allocations::Counting;

/// Backups while serving: snapshot downloads and restores.
mod backups;

/// `quiver import` and `quiver export`: files in and out, every format.
mod import_export;

/// No allocation on the steady-state path of health, search and retrieve.
mod allocations;

/// Three nodes, one database: answers as one node's, kill -9, pauses.
mod cluster;
/// EigenDB client compatibility: X-Eigen-API-Key and /test-auth.
mod compat;
/// Every row of the reference: statuses, codes and messages.
mod contract;
/// The six metrics beyond the interface's: create, stats, durability, edges.
mod distances;
/// Answered writes survive kill -9; torn and damaged logs; snapshots; the lock.
mod durability;
/// Filters: every operator on search, batch, scroll and delete, against a model.
mod filters;
/// The fuzz targets' corpora, replayed through their properties.
mod fuzz_corpus;
/// Hostile requests: every limit, framing error and bad value, answered exactly.
mod hostile;
/// HTTP framing: pipelining, splits, chunked, 100-continue, limits, slow clients.
mod http_framing;
/// The modules depend on each other one way.
mod layers;
/// The process: API key sources, start-up log, --help, shutdown.
mod lifecycle;
/// A linearizability checker (Wing–Gong) for the cluster's histories.
mod linearizable;
/// 2,000 concurrent connections of every kind; normal clients still served.
mod load;
/// Malformed bodies: 400 with a precise detail, nothing applied.
mod malformed;
/// The numeric domain: norm bounds, one rounding, exact search at extreme magnitudes.
mod numeric_domain;
/// Metrics, the OpenAPI document, operator logs.
mod operations;
/// The README's curl examples, as written.
mod readme;
/// A reply's size is bounded; the error says how to page.
mod replies;
/// Every SIMD path, with and without the int8 first pass, against the oracle.
mod scan_paths;
/// search-batch: each search answered as alone; a bad one fails the batch.
mod search_batch;
/// Search results checked against a brute-force oracle.
mod search_oracle;
/// TLS: real clients, downloads, plain HTTP and broken handshakes refused.
mod tls;
/// Typed metadata: numbers, booleans, arrays; returned as sent, filtered by type.
mod typed_metadata;
