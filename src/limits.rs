//! Every limit the server enforces, with the reason for its default.
//!
//! The ones a client can push against are flags (see `config.rs`); the rest are
//! internal budgets that keep one connection from starving the others.

/// Largest request body. A 1,000 x 768 insert is about 7 MiB of JSON; 256 MiB
/// leaves room for bulk loads while bounding what one client can make us hold.
pub const BODY_BYTES_MAX_DEFAULT: usize = 256 * 1024 * 1024;

/// The most `--body-bytes-max` may allow. A log record holds a request's
/// items with u32 lengths: a body of at most 1 GiB makes a record of at most
/// about 2 GiB (a 2-byte JSON number becomes a 4-byte f32), well inside them.
pub const BODY_BYTES_CEILING: usize = 1 << 30;

/// The most `--dimensions-max` may allow: log records and snapshots store
/// dimensions as u32, and one vector must fit in a body.
pub const DIMENSIONS_CEILING: usize = 1 << 20;

/// Largest request head (request line + headers). Clients of this API send a
/// handful of short headers; 16 KiB is what common proxies allow.
pub const HEAD_BYTES_MAX_DEFAULT: usize = 16 * 1024;

/// Most headers in one request; more is a 431, like an oversized head.
pub const HEADERS_COUNT_MAX_DEFAULT: usize = 64;

/// The most `--headers-max` may allow: the parser's header array lives on the stack.
pub const HEADERS_COUNT_CEILING: usize = 256;

/// Most chunks in one chunked body. A client streaming a full 256 MiB body in
/// 4 KiB chunks needs 65,536; each costs a little parsing.
pub const CHUNKS_MAX_DEFAULT: usize = 1 << 20;

/// Largest single chunk of a chunked body.
pub const CHUNK_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;

/// Ids (retrieve, delete) or embeddings (insert, upsert) in one request.
pub const ITEMS_PER_REQUEST_MAX_DEFAULT: usize = 100_000;

/// Entries in one embedding's metadata, and bytes of its JSON text.
pub const METADATA_ENTRIES_MAX_DEFAULT: usize = 64;
pub const METADATA_BYTES_MAX_DEFAULT: usize = 16 * 1024;

/// JSON nesting depth of a body. The deepest body the API takes nests 4
/// levels (object, array, object, metadata object); deeper is refused early.
pub const JSON_DEPTH_MAX: usize = 16;

/// Indexes one server holds.
pub const INDEXES_MAX_DEFAULT: usize = 1024;

/// Most connections open at once. An idle one holds a 16 KiB read buffer
/// (64 MiB for all of them); beyond this a new connection is answered 503
/// and closed.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;

/// A connection with no request in progress is closed after this long.
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;

/// A request whose bytes are not all in after this long (a slow or stalled
/// client) is answered 408 and its connection closed.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// Largest vector dimensionality. 65,536 f32 is 256 KiB a vector.
pub const DIMENSIONS_MAX_DEFAULT: usize = 65_536;

/// Largest `k` a search may ask for.
pub const K_MAX_DEFAULT: usize = 10_000;

/// Most searches in one `search-batch` request: a batch of 1,024 queries of
/// 768 dimensions is a body of about 10 MB, and one pass over the rows.
pub const SEARCH_BATCH_MAX_DEFAULT: usize = 1024;

/// Most levels of `$and`, `$or` and `$not` inside one another in a filter.
/// (A body's JSON nesting is bounded too, by `JSON_DEPTH_MAX`.)
pub const FILTER_DEPTH_MAX_DEFAULT: usize = 6;

/// Most terms in one filter: operators, metadata keys and the values of
/// `$in` and `$nin` together. Each costs a look-up in the metadata index.
pub const FILTER_TERMS_MAX_DEFAULT: usize = 10_000;

/// Most rows one `scroll` page may ask for.
pub const SCROLL_LIMIT_MAX: usize = 10_000;

/// Rows of a `scroll` page when the request names no `limit`.
pub const SCROLL_LIMIT_DEFAULT: usize = 100;

/// Largest Euclidean norm of a stored vector or a query: 2^62 (about
/// 4.6e18). Inside it no f32 product or sum of a search can overflow: a dot
/// product is at most |q||x| <= 2^124, a squared distance at most
/// (|q| + |x|)^2 <= 2^126, and their partial sums grow by rounding to at
/// most (1 + 2^-24)^n of that (under 1.01 for the largest dimensions), all
/// below f32's 2^128. Written as the squared norm, which is what is summed.
pub const SQUARED_NORM_MAX: f64 = (1u128 << 124) as f64;

/// Smallest Euclidean norm of a vector or a query in a cosine index: 2^-62
/// (about 2.2e-19). A cosine query is scaled to a norm in [1, 2) before the
/// scan, so a row's products with it sum to about |x| >= 2^-62, while each
/// product that underflows f32's normal range (2^-126) loses at most 2^-149:
/// relative to the score, under 2^-71 for the largest dimensions, far below
/// the score's own rounding. The inverse norm 1/|x| stays within f32 too.
pub const COSINE_SQUARED_NORM_MIN: f64 = 1.0 / SQUARED_NORM_MAX;

/// Largest reply one request may make the server build, in bytes (an
/// upper bound computed before it is written; more: 400 REPLY_TOO_LARGE,
/// naming how many items fit). A reply is built in one piece while the loop
/// waits, and held until the client takes it: formatting 32 MiB of vectors
/// takes about a tenth of a second. A retrieve of 2,000 x 768 fits; bigger
/// exports page (retrieve by ids in parts).
pub const REPLY_BYTES_MAX_DEFAULT: usize = 32 * 1024 * 1024;

/// The least `--reply-bytes-max` may be: every reply that names no
/// embedding (health, lists, errors) fits with room to spare.
pub const REPLY_BYTES_FLOOR: usize = 64 * 1024;

/// Index names: `^[a-z0-9-]{3,32}$`.
pub const INDEX_NAME_BYTES_MIN: usize = 3;
pub const INDEX_NAME_BYTES_MAX: usize = 32;

/// Bytes asked of the socket per `read` call.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Bytes read from one connection per tick before the others get a turn.
pub const READ_BYTES_PER_TICK_MAX: usize = 4 * 1024 * 1024;

/// Requests handled for one connection per tick before the others get a turn.
pub const REQUESTS_PER_TICK_MAX_DEFAULT: usize = 32;

/// A connection whose unsent replies exceed this is not read from until the
/// client has taken them: a pipelining client that never reads cannot make
/// us buffer without bound.
pub const WRITE_PENDING_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Encrypted bytes a TLS session holds for the socket, at most: it takes
/// no more of a connection's replies until the socket has taken them, so
/// that a slow reader is held back by its socket as on plain TCP. Eight
/// full records: a large reply goes out in few writes.
pub const TLS_PENDING_BYTES_MAX: usize = 128 * 1024;

/// How much a byte of TLS framing (a record's header, tag and type, 22
/// bytes in TLS 1.3) counts against `READ_BYTES_PER_TICK_MAX`: a record
/// costs a decryption whatever it holds, so a client sending one byte a
/// record would otherwise make a tick decrypt some 190,000 of them. At 48,
/// a record's framing counts about 1 KiB: 4,000 records a tick at most, and
/// a full 16 KiB record about 6% more than its plaintext.
pub const TLS_FRAMING_BYTE_WEIGHT: usize = 48;

/// A reused buffer grown past this by large requests is given back instead
/// of being kept at its largest for the life of its owner. A connection's
/// write buffer (once flushed) and a chunked body's de-chunked copy go once
/// their request is done. A connection's read buffer, the decoder's
/// buffers and the log's buffer of records go at the first sweep with no
/// large request since the one before (`memory::Linger`), so that a client
/// loading in batches reuses them.
pub const BUF_KEEP_BYTES_MAX: usize = 1024 * 1024;

/// Initial read buffer: enough for a head and a small body.
pub const READ_BUF_INITIAL_BYTES: usize = 16 * 1024;

/// Most time spent flushing replies at shutdown before giving up on a client.
pub const SHUTDOWN_DRAIN_MS: u64 = 5_000;

/// A snapshot is taken once the log has grown this much: replaying 512 MiB
/// at start-up takes about a second, and the log never holds more than
/// about twice this on disk.
pub const SNAPSHOT_LOG_BYTES_DEFAULT: u64 = 512 * 1024 * 1024;

/// How long a cluster's write may wait to be committed, and its read to be
/// confirmed: long enough for an election after a leader dies (about two
/// seconds, `cluster::replica::TIMING`) and the write after it.
pub const CLUSTER_TIMEOUT_MS_DEFAULT: u64 = 5000;

/// Bytes of a peer frame besides one command (at most twice a request body:
/// an upsert's decoded items): a Raft message's other fields and the
/// command's header, with room to spare. A frame holds one command at
/// most, or `cluster::node`'s 1 MiB of smaller entries.
pub const PEER_FRAME_OVERHEAD_BYTES: usize = 2 << 20;

/// How often the health figures are resampled at most.
pub const HEALTH_SAMPLE_INTERVAL_MS: u64 = 1_000;

/// How often idle and slow connections are looked for.
pub const TIMEOUT_SWEEP_INTERVAL_MS: u64 = 250;

const _: () = assert!(HEAD_BYTES_MAX_DEFAULT <= BODY_BYTES_MAX_DEFAULT);
const _: () = assert!(REPLY_BYTES_FLOOR <= REPLY_BYTES_MAX_DEFAULT);
// The largest vector's text (at most 16 bytes a value) fits in a default reply.
const _: () = assert!(DIMENSIONS_MAX_DEFAULT * 16 + METADATA_BYTES_MAX_DEFAULT < REPLY_BYTES_MAX_DEFAULT);
const _: () = assert!(BODY_BYTES_MAX_DEFAULT <= BODY_BYTES_CEILING);
const _: () = assert!(2 * BODY_BYTES_CEILING + (1 << 20) < u32::MAX as usize);
// A peer frame's length is a u32.
const _: () = assert!(2 * BODY_BYTES_CEILING + PEER_FRAME_OVERHEAD_BYTES < u32::MAX as usize);
const _: () = assert!(DIMENSIONS_MAX_DEFAULT <= DIMENSIONS_CEILING);
const _: () = assert!(DIMENSIONS_CEILING <= u32::MAX as usize);
const _: () = assert!(READ_BUF_INITIAL_BYTES >= HEAD_BYTES_MAX_DEFAULT);
const _: () = assert!(READ_CHUNK_BYTES <= READ_BYTES_PER_TICK_MAX);
const _: () = assert!(INDEX_NAME_BYTES_MIN <= INDEX_NAME_BYTES_MAX);
const _: () = assert!(HEADERS_COUNT_MAX_DEFAULT <= HEADERS_COUNT_CEILING);
const _: () = assert!(CHUNK_BYTES_MAX_DEFAULT <= BODY_BYTES_MAX_DEFAULT);
// A single vector of the largest dimensionality must fit in a body.
const _: () = assert!(DIMENSIONS_MAX_DEFAULT * 16 < BODY_BYTES_MAX_DEFAULT);

/// Synced log bytes are dropped from the page cache this many at a time
/// (`wal::Log::commit`). The kernel may have to drain every core's list of
/// pages just added before it can drop them, and waits for that core to
/// run its worker: once a commit, with both cores busy (a download), each
/// commit waited for the next scheduler tick, 4 ms. Once a megabyte, the
/// pages freed are still few enough to be the ones the next writes reuse.
pub const LOG_CACHE_DROP_BYTES: u64 = 1 << 20;

/// Snapshot downloads sent at once, each by a forked child: each holds the
/// pages the loop writes to while it runs (copy-on-write), so their number
/// bounds that memory. One more is answered 503 SNAPSHOT_UNAVAILABLE.
pub const SNAPSHOT_DOWNLOADS_MAX: usize = 4;

/// A snapshot download whose client takes no bytes for this long is cut
/// off: its child ends rather than hold its memory for a stalled reader.
pub const SNAPSHOT_SEND_STALL_MS: u64 = 60_000;

/// A snapshot download must average at least this many bytes a second (1
/// MB/s) beyond its first `SNAPSHOT_SEND_STALL_MS`, or it is cut off: a
/// client that takes a byte now and then cannot hold a child for ever.
pub const SNAPSHOT_SEND_RATE_MIN_BYTES: u64 = 1_000_000;

/// How fast a snapshot download is sent by default, in bytes a second
/// (`--snapshot-download-bytes-per-s`). Its child and the client copying
/// at full speed take a core each: on two cores a write's p99 was three
/// times what it is without a download; at 700 MB/s, 1.5 to 2.1 times
/// in the bench, and 1.24 to 1.35 once a download's fork left out the
/// arrays its child never reads (BENCHMARKS.md). That is faster than most
/// networks carry a download anyway.
pub const SNAPSHOT_DOWNLOAD_BYTES_PER_S_DEFAULT: u64 = 700_000_000;

/// The most a download's child hands the socket in one system call. A
/// kernel built without preemption copies one call's bytes to the end
/// before it lets anything else run on that core: one call of a whole
/// 300 MB index held a core for 20-30 ms, and the disk's completions
/// queued behind it (its softirq, its workers) held every commit waiting
/// as long. Between calls the child returns to user mode, where the
/// scheduler takes the core back for them.
pub const SNAPSHOT_SEND_CALL_BYTES: usize = 256 << 10;
