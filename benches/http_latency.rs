//! End-to-end latency over HTTP against the release server: inserts of
//! 1,000 x 768 embeddings into a cosine index until it holds 10,000, then
//! k=10 searches of it; then a 100,000 x 768 index, whose search is set
//! beside the memory-read floor measured in the same run (one thread summing
//! a buffer of the same size with SIMD). Prints medians and 90th percentiles.
//!
//! Run with `make bench` (or `cargo bench --bench http_latency`).

#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use harness::{create_index, Rng, Server};

const DIMS: usize = 768;
const BATCH: usize = 1_000;
const BATCHES: usize = 10;
const SEARCHES: usize = 200;

fn vector_text(rng: &mut Rng, out: &mut String) {
    out.push('[');
    for d in 0..DIMS {
        if d > 0 {
            out.push(',');
        }
        out.push_str(&rng.float().to_string());
    }
    out.push(']');
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    // `cargo bench` passes flags such as `--bench`; this program takes none.
    let server = Server::start();
    create_index(&server, "bench", DIMS, "cosine");
    let mut client = server.connect();
    let mut rng = Rng(7);

    let mut inserts = Vec::new();
    let mut body_bytes = 0;
    for batch in 0..BATCHES {
        let mut body = String::from(r#"{"embeddings":["#);
        for i in 0..BATCH {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&format!(r#"{{"id":{},"metadata":{{"n":"{i}"}},"data":"#, batch * BATCH + i));
            vector_text(&mut rng, &mut body);
            body.push('}');
        }
        body.push_str("]}");
        body_bytes = body.len();
        let started = Instant::now();
        let r = client.call("PUT", "/api/v1/embeddings/bench/insert", Some(&body));
        inserts.push(started.elapsed());
        assert_eq!(r.status, 200, "{r:?}");
    }

    let mut searches = Vec::new();
    for _ in 0..SEARCHES {
        let mut body = String::from(r#"{"k":10,"queryVector":"#);
        vector_text(&mut rng, &mut body);
        body.push('}');
        let started = Instant::now();
        let r = client.call("POST", "/api/v1/embeddings/bench/search", Some(&body));
        searches.push(started.elapsed());
        assert_eq!(r.status, 200, "{r:?}");
    }

    let insert_p50 = percentile(&mut inserts, 0.5);
    println!("http_latency (release server, one keep-alive client, loopback)");
    println!(
        "  insert 1,000 x 768 ({:.1} MB JSON): median {}, p90 {} ({:.0} MB/s, {:.0} vectors/s) over {BATCHES} runs",
        body_bytes as f64 / 1e6,
        ms(insert_p50),
        ms(percentile(&mut inserts, 0.9)),
        body_bytes as f64 / 1e6 / insert_p50.as_secs_f64(),
        BATCH as f64 / insert_p50.as_secs_f64(),
    );
    println!(
        "  search 10,000 x 768 cosine, k=10: median {}, p90 {} over {SEARCHES} runs",
        ms(percentile(&mut searches, 0.5)),
        ms(percentile(&mut searches, 0.9)),
    );

    // 100,000 x 768: grow the index by another 90 batches.
    let texts: Vec<String> = (0..1000)
        .map(|_| {
            let mut t = String::new();
            vector_text(&mut rng, &mut t);
            t
        })
        .collect();
    for batch in BATCHES..100 {
        let items: Vec<String> =
            (0..BATCH).map(|i| format!(r#"{{"id":{},"data":{}}}"#, batch * BATCH + i, texts[i])).collect();
        let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
        assert_eq!(client.call("PUT", "/api/v1/embeddings/bench/insert", Some(&body)).status, 200);
    }
    let floor = memory_floor(100_000 * DIMS, 1);
    let floor_two = memory_floor(100_000 * DIMS, 2);
    let mut large = Vec::new();
    for _ in 0..30 {
        let mut body = String::from(r#"{"k":10,"queryVector":"#);
        vector_text(&mut rng, &mut body);
        body.push('}');
        let started = Instant::now();
        let r = client.call("POST", "/api/v1/embeddings/bench/search", Some(&body));
        large.push(started.elapsed());
        assert_eq!(r.status, 200, "{r:?}");
    }
    let large_p50 = percentile(&mut large, 0.5);
    println!(
        "  search 100,000 x 768 cosine (307 MB), k=10: median {}, p90 {}; memory-read floor one thread {}, two threads {} \
         (medians of 9); ratio to the one-thread floor {:.2}",
        ms(large_p50),
        ms(percentile(&mut large, 0.9)),
        ms(floor),
        ms(floor_two),
        large_p50.as_secs_f64() / floor.as_secs_f64()
    );

    // 32 clients searching at once, against one client, for the same time.
    let queries: Vec<String> = (0..32)
        .map(|_| {
            let mut body = String::from(r#"{"k":10,"queryVector":"#);
            vector_text(&mut rng, &mut body);
            body.push('}');
            body
        })
        .collect();
    let single = searches_per_second(server.addr, &queries[..1], Duration::from_secs(4));
    let concurrent = searches_per_second(server.addr, &queries, Duration::from_secs(4));
    println!(
        "  searches/s on 100,000 x 768 cosine, k=10: 1 client {single:.0}, 32 clients {concurrent:.0}; ratio {:.1}",
        concurrent / single
    );
}

/// Searches answered per second with one client per query, each repeating its
/// query on its own keep-alive connection for `duration`.
fn searches_per_second(addr: std::net::SocketAddr, queries: &[String], duration: Duration) -> f64 {
    let started = Instant::now();
    let threads: Vec<_> = queries
        .iter()
        .cloned()
        .map(|query| {
            std::thread::spawn(move || {
                let mut client = harness::Client::connect(addr);
                let mut answered = 0u64;
                while started.elapsed() < duration {
                    let r = client.call("POST", "/api/v1/embeddings/bench/search", Some(&query));
                    assert_eq!(r.status, 200);
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    let answered: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    answered as f64 / started.elapsed().as_secs_f64()
}

/// The time `threads` threads take to read `floats` f32 from memory with
/// SIMD, each summing its share: the floor a scan of that many vectors
/// cannot beat with that many threads.
fn memory_floor(floats: usize, threads: usize) -> Duration {
    use wide::f32x8;
    let buffer: Vec<f32> = (0..floats).map(|i| (i % 7) as f32).collect();
    let sum = |share: &[f32]| {
        let mut acc = [f32x8::ZERO; 4];
        for block in share.chunks_exact(32) {
            for (lane, total) in acc.iter_mut().enumerate() {
                let values: [f32; 8] = block[lane * 8..lane * 8 + 8].try_into().unwrap();
                *total += f32x8::new(values);
            }
        }
        std::hint::black_box(acc);
    };
    let mut runs = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        std::thread::scope(|scope| {
            for share in buffer.chunks(floats.div_ceil(threads)) {
                scope.spawn(move || sum(share));
            }
        });
        runs.push(started.elapsed());
    }
    percentile(&mut runs, 0.5)
}
