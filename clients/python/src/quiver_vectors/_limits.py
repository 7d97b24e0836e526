"""Every default and bound of the client in one place, each with why.

The server has limits of its own (`quiver --help`); the client's defaults stay
well under the server's defaults, so that a client left at its defaults never
meets a server limit in normal use, and a server started with smaller limits
is handled by splitting (413) rather than by failing.
"""

# -- Uploads (insert, upsert) ---------------------------------------------------

#: Rows in one insert/upsert request. The server takes up to 100,000
#: (`--items-max`); a few thousand keep each request short, so progress moves,
#: memory stays small, and an error loses (re-sends) little.
UPLOAD_BATCH_ROWS_MAX = 4_000

#: Bytes of JSON in one insert/upsert request. The server takes 256 MiB
#: (`--body-bytes-max`); 8 MiB is about 1,000 rows of 768 dimensions, large
#: enough that per-request costs (one fsync, one round trip) are small beside
#: the parsing, small enough that several requests fit in flight at once.
UPLOAD_BATCH_BYTES_MAX = 8 * 1024 * 1024

#: Requests of one upload in flight at once. The server parses one request at
#: a time per connection and fsyncs once per turn of its loop for all of them,
#: so a few connections let it parse one batch while the client encodes the
#: next and share fsyncs; more than a few only queue.
UPLOAD_PARALLEL = 4

#: Most rows encoded by one call to the JSON encoder while building a body.
#: The encoder holds the GIL for the whole call; pieces of this size let the
#: threads (or the event loop) that send earlier bodies run in between.
UPLOAD_PIECE_ROWS_MAX = 256

# -- Reads ------------------------------------------------------------------------

#: Ids in one retrieve request. Replies are bounded by the server's
#: `--reply-bytes-max` (32 MiB by default): 1,000 rows of 768 dimensions are
#: about 9 MB. Longer rows answer 400 REPLY_TOO_LARGE, naming how many ids
#: fit, and the client asks for that many at a time.
RETRIEVE_BATCH_IDS_MAX = 1_000

#: Ids in one delete request: bodies of ids are small, and the server takes
#: 100,000 (`--items-max`); 10,000 keeps each durable write short.
DELETE_BATCH_IDS_MAX = 10_000

#: Rows of one scroll page by default; the server allows 1 to 10,000 and stops
#: a page short by itself when it would pass `--reply-bytes-max`.
SCROLL_PAGE_ROWS = 1_000

#: Searches in one search-batch request: the server's default
#: `--search-batch-max`. Longer batches are sent as several requests.
SEARCH_BATCH_MAX = 1_024

# -- Connections, timeouts, retries ------------------------------------------------

#: Timeout of one request, from sending it to the last byte of its answer.
#: Large uploads and searches over big indexes take seconds, not minutes; a
#: request stuck longer than this is better failed.
TIMEOUT_S = 60.0

#: Connecting to a server on a working network takes milliseconds; a server
#: that does not accept within this is down, and retrying (when allowed) says so
#: sooner than waiting for the whole-request timeout.
CONNECT_TIMEOUT_S = 10.0

#: Kept-alive connections are dropped by the client after this long idle: below
#: the server's `--idle-timeout-ms` (60 s), so the client closes first and never
#: sends on a connection the server is closing.
KEEPALIVE_EXPIRY_S = 30.0

#: Retries after the first attempt, for idempotent calls only.
RETRIES_MAX = 4

#: First backoff before a retry; each next one doubles, with full jitter.
RETRY_BACKOFF_S = 0.1

#: Longest single backoff: a server restarting takes about a second.
RETRY_BACKOFF_MAX_S = 2.0

#: Total time spent retrying one call (backoffs and failed attempts) before the
#: last error is raised: retries must never turn a dead server into a hang.
RETRY_TIME_MAX_S = 15.0

#: Cached request URLs (one per method and path). Bounded so a program that
#: touches very many indexes does not grow the cache without end.
URL_CACHE_ENTRIES_MAX = 256
