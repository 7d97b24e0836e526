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
