//! No allocation on the steady-state request path: once buffers have grown
//! to fit, health, search and retrieve requests allocate nothing. A counting
//! global allocator (per thread) proves it, with a real connection over a
//! loopback socket driven in-process by the server's own turn of the loop.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use quiver::http::FramingLimits;
use quiver::server::clients::{Clients, ConnectionLimits};

use crate::harness::{app_in, request_bytes, KEY};

/// Counts allocations made by the current thread.
pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's guarantees for `alloc`, passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: `ptr` came from `System` with `layout`; the caller's guarantees for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// A real connection over a loopback socket to an `App`, driven in-process
/// by the server's own turn of the loop.
struct Exchange {
    poll: mio::Poll,
    events: mio::Events,
    clients: Clients,
    client: std::net::TcpStream,
}

impl Exchange {
    fn new(app: quiver::api::App) -> Exchange {
        let poll = mio::Poll::new().unwrap();
        let limits = ConnectionLimits {
            framing: FramingLimits {
                head_bytes_max: 16384,
                headers_max: 64,
                body_bytes_max: 1 << 20,
                chunks_max: 1024,
                chunk_bytes_max: 1 << 20,
            },
            requests_per_tick_max: 32,
        };
        let mut clients = Clients::new(&poll, app, limits, 4).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (server_side, peer) = listener.accept().unwrap();
        server_side.set_nonblocking(true).unwrap();
        clients.add(mio::net::TcpStream::from_std(server_side), peer, Instant::now()).unwrap();
        Exchange { poll, events: mio::Events::with_capacity(64), clients, client }
    }

    /// Whether the first bytes of an answer wait to be read.
    fn answer_arrived(&mut self) -> bool {
        self.client.set_nonblocking(true).unwrap();
        let arrived = self.client.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0);
        self.client.set_nonblocking(false).unwrap();
        arrived
    }

    /// One request through the connection: send, then poll and run turns
    /// as the server does until the connection has been serviced; read the
    /// answer (which must be a 200). Returns what the turns allocated.
    fn call(&mut self, bytes: &[u8]) -> u64 {
        self.client.write_all(bytes).unwrap();
        let before = allocations();
        let deadline = Instant::now() + Duration::from_secs(10);
        // Until the answer is on its way: a large body arrives over several turns.
        while self.clients.has_work() || !self.answer_arrived() {
            assert!(
                Instant::now() < deadline,
                "no answer to {}",
                String::from_utf8_lossy(&bytes[..80.min(bytes.len())])
            );
            let wait = if self.clients.has_work() { Duration::ZERO } else { Duration::from_millis(10) };
            self.poll.poll(&mut self.events, Some(wait)).unwrap();
            let now = Instant::now();
            self.clients.take_events(&self.events);
            self.clients.turn(&mut self.poll, &mut self.events, now);
        }
        let allocated = allocations() - before;
        let mut head = [0u8; 12];
        self.client.read_exact(&mut head).unwrap();
        assert_eq!(&head[9..12], b"200", "{}", String::from_utf8_lossy(bytes));
        let mut rest = vec![0u8; 1 << 16];
        let mut got = Vec::new();
        loop {
            let n = self.client.read(&mut rest).unwrap();
            got.extend_from_slice(&rest[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize =
                    head.lines().find_map(|l| l.strip_prefix("Content-Length:")).unwrap().trim().parse().unwrap();
                if body.len() >= length {
                    break;
                }
            }
        }
        allocated
    }
}

#[test]
fn health_search_and_retrieve_allocate_nothing_in_steady_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut exchange = Exchange::new(app_in(dir.path()));
    let mut exchange = |bytes: &[u8]| exchange.call(bytes);

    let auth = [("X-Service-API-Key", KEY)];
    let create =
        request_bytes("PUT", "/api/v1/indexes/steady/create", &auth, Some(r#"{"dimensions":8,"metric":"cosine"}"#));
    exchange(&create);
    let items: Vec<String> = (0..500)
        .map(|i| {
            format!(
                r#"{{"id":{i},"data":[{}],"metadata":{{"n":"{i}","longer":"than sixteen bytes"}}}}"#,
                vec![format!("{}.5", i % 9 + 1); 8].join(",")
            )
        })
        .collect();
    let insert = request_bytes(
        "PUT",
        "/api/v1/embeddings/steady/insert",
        &auth,
        Some(&format!(r#"{{"embeddings":[{}]}}"#, items.join(","))),
    );
    // The counter counts: storing 500 rows with metadata too long to be
    // kept in place must allocate.
    assert!(exchange(&insert) > 500);

    let health = request_bytes("GET", "/api/v1/health", &[], None);
    let search = request_bytes(
        "POST",
        "/api/v1/embeddings/steady/search",
        &auth,
        Some(r#"{"queryVector":[1,2,3,4,5,6,7,8],"k":20}"#),
    );
    let retrieve =
        request_bytes("POST", "/api/v1/embeddings/steady/retrieve", &auth, Some(r#"{"ids":[1,2,3,4,5,6,7,8,9,10]}"#));
    // Warm-up: buffers grow to fit, health takes its first sample.
    for _ in 0..3 {
        for request in [&health, &search, &retrieve] {
            exchange(request);
        }
    }
    for (name, request) in [("health", &health), ("search", &search), ("retrieve", &retrieve)] {
        let allocated: u64 = (0..20).map(|_| exchange(request)).sum();
        assert_eq!(allocated, 0, "{name} allocated {allocated} times in 20 requests");
    }
}

/// A search large enough to be split across the scan threads starts no
/// thread: its parts go to the pool the loop runs in, and the loop's thread
/// allocates nothing for them (starting a thread would).
#[test]
fn a_search_split_across_threads_allocates_nothing() {
    const DIMS: usize = 1024;
    const ROWS: usize = 8_400;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    pool.install(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut exchange = Exchange::new(app_in(dir.path()));
        let auth = [("X-Service-API-Key", KEY)];
        let create = format!(r#"{{"dimensions":{DIMS},"metric":"l2"}}"#);
        exchange.call(&request_bytes("PUT", "/api/v1/indexes/wide/create", &auth, Some(&create)));
        for first in (0..ROWS).step_by(100) {
            let items: Vec<String> = (first..first + 100)
                .map(|id| format!(r#"{{"id":{id},"data":[{}]}}"#, vec![format!("{}", id % 97); DIMS].join(",")))
                .collect();
            let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
            exchange.call(&request_bytes("PUT", "/api/v1/embeddings/wide/insert", &auth, Some(&body)));
        }
        let query = format!(r#"{{"queryVector":[{}],"k":10}}"#, vec!["3.5"; DIMS].join(","));
        let search = request_bytes("POST", "/api/v1/embeddings/wide/search", &auth, Some(&query));
        for _ in 0..3 {
            exchange.call(&search);
        }
        let allocated: u64 = (0..20).map(|_| exchange.call(&search)).sum();
        assert_eq!(allocated, 0, "a split search allocated {allocated} times in 20 requests");
    });
}

/// An index of `rows` rows of `dims` values under `metric` (JSON that
/// follows `"metric":`), with metadata
/// `{"n":"<id mod 5>"}`, made through `exchange`.
fn index_for(exchange: &mut Exchange, name: &str, metric: &str, (rows, dims): (usize, usize)) {
    let auth = [("X-Service-API-Key", KEY)];
    let create = format!(r#"{{"dimensions":{dims},"metric":{metric}}}"#);
    exchange.call(&request_bytes("PUT", &format!("/api/v1/indexes/{name}/create"), &auth, Some(&create)));
    let items: Vec<String> = (0..rows)
        .map(|i| {
            let values: Vec<String> = (0..dims).map(|d| format!("{}.25", (i * 7 + d * 3) % 11 + 1)).collect();
            format!(r#"{{"id":{i},"data":[{}],"metadata":{{"n":"{}"}}}}"#, values.join(","), i % 5)
        })
        .collect();
    let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
    exchange.call(&request_bytes("PUT", &format!("/api/v1/embeddings/{name}/insert"), &auth, Some(&body)));
}

/// A search-batch body of `count` searches of `dims` values, each with
/// `extra` fields.
fn batch_body(count: usize, dims: usize, extra: &str) -> String {
    let searches: Vec<String> = (0..count)
        .map(|s| {
            let values: Vec<String> = (0..dims).map(|d| format!("{}.5", (s + d) % 7)).collect();
            format!(r#"{{"queryVector":[{}],"k":{}{extra}}}"#, values.join(","), 3 + s % 5)
        })
        .collect();
    format!(r#"{{"searches":[{}]}}"#, searches.join(","))
}

/// Search-batches allocate nothing in steady state, through every first
/// pass a batch can take here: the int8 products (cosine, l2), the
/// floors (l1, js), the bfloat16 pass where the CPU has it (16 cosine
/// searches), and the exact scan (lp's p out of its floors' range); lone
/// searches of the same indexes too (l1's and js's in the order of their
/// bounds).
#[test]
fn search_batches_allocate_nothing_in_steady_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut exchange = Exchange::new(app_in(dir.path()));
    let auth = [("X-Service-API-Key", KEY)];
    let dims = 24;
    let indexes = [
        ("b-cosine", r#""cosine""#),
        ("b-l2", r#""l2""#),
        ("b-l1", r#""l1""#),
        ("b-js", r#""js""#),
        ("b-canberra", r#""canberra""#),
        ("b-lp3", r#""lp","p":3"#),
        ("b-lp", r#""lp","p":11.5"#),
    ];
    for (name, metric) in indexes {
        index_for(&mut exchange, name, metric, (600, dims));
    }
    let mut requests = Vec::new();
    for (name, _) in indexes {
        for count in [1, 2, 5, 16] {
            let body = batch_body(count, dims, "");
            let path = format!("/api/v1/embeddings/{name}/search-batch");
            requests.push((format!("{name}: a batch of {count}"), request_bytes("POST", &path, &auth, Some(&body))));
        }
        let lone = format!(r#"{{"queryVector":[{}],"k":7}}"#, vec!["2.5"; dims].join(","));
        let path = format!("/api/v1/embeddings/{name}/search");
        requests.push((format!("{name}: a lone search"), request_bytes("POST", &path, &auth, Some(&lone))));
    }
    for _ in 0..3 {
        for (_, request) in &requests {
            exchange.call(request);
        }
    }
    for (what, request) in &requests {
        let allocated: u64 = (0..10).map(|_| exchange.call(request)).sum();
        assert_eq!(allocated, 0, "{what} allocated {allocated} times in 10 requests");
    }
}

/// A filtered search, lone or in a batch, allocates for its decoded filter
/// alone (a condition's key and value, and the list of its conditions: 3
/// for `{"n":"3"}` or `{"n":3.5}`), the same on an index ten times as large: its rows are
/// borrowed from the metadata index, not copied, and the scan allocates
/// nothing.
#[test]
fn filtered_searches_allocate_only_their_decoded_filter() {
    const PER_FILTER: u64 = 3;
    let dir = tempfile::tempdir().unwrap();
    let mut exchange = Exchange::new(app_in(dir.path()));
    let auth = [("X-Service-API-Key", KEY)];
    let dims = 24;
    for rows in [600, 6000] {
        let name = format!("filtered-{rows}");
        index_for(&mut exchange, &name, r#""l2""#, (rows, dims));
        let query = vec!["2.5"; dims].join(",");
        let lone = format!(r#"{{"queryVector":[{query}],"k":7,"filter":{{"n":"3"}}}}"#);
        let number = format!(r#"{{"queryVector":[{query}],"k":7,"filter":{{"n":3.5}}}}"#);
        let batch = batch_body(4, dims, r#","filter":{"n":"2"}"#);
        for (what, path, body, filters) in [
            ("lone", "search", lone, 1),
            ("lone on a number", "search", number, 1),
            ("batch", "search-batch", batch, 4),
        ] {
            let request = request_bytes("POST", &format!("/api/v1/embeddings/{name}/{path}"), &auth, Some(&body));
            for _ in 0..3 {
                exchange.call(&request);
            }
            let allocated: u64 = (0..10).map(|_| exchange.call(&request)).sum();
            let most = 10 * filters * PER_FILTER;
            assert!(allocated <= most, "{what} of {rows} rows allocated {allocated} times in 10 requests");
        }
    }
}
