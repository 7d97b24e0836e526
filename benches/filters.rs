//! The filters benchmark (issue 16's targets): filtered search against
//! unfiltered on the same index in the same run, with recall against brute
//! force; search-batch against the same searches sent one by one; scroll's
//! output rate; delete by filter of 10% of a million rows; lone search with
//! each of the six metrics beyond the interface's against l2. The table is
//! also written to `target/filters-bench.md`.
//!
//! Run with `make bench` (or `cargo bench --bench filters`; arguments
//! choose sections: `search`, `batch`, `scroll`, `delete`, `metrics`).

#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use harness::{create_index, Client, Rng, Server};
use serde_json::{json, Value};

const DIMS: usize = 768;
const ROWS: usize = 100_000;
const BATCH: usize = 1_000;

/// Row `id`'s metadata: `cat` (1,000 values, 0.1% each), `tier` (10),
/// `half` (2), `year` (1990-2024).
fn metadata(id: usize) -> String {
    format!(
        r#"{{"cat":"c{}","tier":"t{}","half":"h{}","year":"{}"}}"#,
        id % 1000,
        (id / 1000) % 10,
        id % 2,
        1990 + (id * 7) % 35
    )
}

fn vector(rng: &mut Rng, dims: usize) -> Vec<f32> {
    (0..dims).map(|_| rng.float() * 2.0 - 1.0).collect()
}

fn json_array(values: &[f32], out: &mut String) {
    out.push('[');
    for (d, x) in values.iter().enumerate() {
        if d > 0 {
            out.push(',');
        }
        write!(out, "{x}").unwrap();
    }
    out.push(']');
}

/// Loads `rows` random vectors of `dims` with `metadata`, returning them.
fn load(client: &mut Client, index: &str, rows: usize, dims: usize, rng: &mut Rng) -> Vec<Vec<f32>> {
    let vectors: Vec<Vec<f32>> = (0..rows).map(|_| vector(rng, dims)).collect();
    load_vectors(client, index, &vectors);
    vectors
}

/// Loads `vectors` as rows 0.. with `metadata`.
fn load_vectors(client: &mut Client, index: &str, vectors: &[Vec<f32>]) {
    let rows = vectors.len();
    for first in (0..rows).step_by(BATCH) {
        let mut body = String::from(r#"{"embeddings":["#);
        for (id, v) in vectors.iter().enumerate().skip(first).take(BATCH) {
            if id > first {
                body.push(',');
            }
            write!(body, r#"{{"id":{id},"metadata":{},"data":"#, metadata(id)).unwrap();
            json_array(v, &mut body);
            body.push('}');
        }
        body.push_str("]}");
        let r = client.call("PUT", &format!("/api/v1/embeddings/{index}/insert"), Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn search_body(query: &[f32], filter: &Value) -> String {
    let mut body = json!({"k": 10, "queryVector": query});
    if !filter.is_null() {
        body["filter"] = filter.clone();
    }
    body.to_string()
}

/// The median time of a search of `index` with `filter`, over `queries`.
fn timed(client: &mut Client, index: &str, queries: &[Vec<f32>], filter: &Value) -> Duration {
    let path = format!("/api/v1/embeddings/{index}/search");
    let bodies: Vec<String> = queries.iter().map(|q| search_body(q, filter)).collect();
    for body in bodies.iter().take(3) {
        client.call("POST", &path, Some(body));
    }
    median(
        bodies
            .iter()
            .map(|body| {
                let started = Instant::now();
                let r = client.call("POST", &path, Some(body));
                let took = started.elapsed();
                assert_eq!(r.status, 200, "{r:?}");
                took
            })
            .collect(),
    )
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Of `queries` searched with `filter` (matching the rows `matches` says),
/// the share of the true 10 nearest among the matching rows (by f64 brute
/// force) that the server returned, and whether every answer held
/// min(10, matches) hits.
fn recall(
    client: &mut Client,
    vectors: &[Vec<f32>],
    queries: &[Vec<f32>],
    filter: &Value,
    matches: &dyn Fn(usize) -> bool,
) -> (f64, bool) {
    let (mut found, mut wanted, mut counts_right) = (0, 0, true);
    for query in queries {
        let r = client.call("POST", "/api/v1/embeddings/wide/search", Some(&search_body(query, filter)));
        let hits: Vec<usize> =
            r.body["data"]["nearest_neighbors"].as_object().unwrap().keys().map(|id| id.parse().unwrap()).collect();
        let mut scored: Vec<(f64, usize)> =
            (0..vectors.len()).filter(|&id| matches(id)).map(|id| (cosine(query, &vectors[id]), id)).collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let truth: Vec<usize> = scored.iter().take(10).map(|&(_, id)| id).collect();
        counts_right &= hits.len() == truth.len();
        found += truth.iter().filter(|id| hits.contains(id)).count();
        wanted += truth.len();
    }
    (if wanted == 0 { 1.0 } else { found as f64 / wanted as f64 }, counts_right)
}

#[derive(Default)]
struct Table(String);

impl Table {
    fn add(&mut self, target: &str, ours: String, reference: String, ratio: f64, goal: &str) {
        println!("  {target}: {ours} | reference {reference} | ratio {ratio:.2} (goal {goal})");
        writeln!(self.0, "| {target} | {ours} | {reference} | {ratio:.2} | {goal} |").unwrap();
    }
}

fn main() {
    let chosen: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let run = |section: &str| chosen.is_empty() || chosen.iter().any(|c| section.contains(c.as_str()));
    let mut table = Table::default();
    println!("filters (release server, loopback, one client; ratios are ours / reference)");
    if run("search batch scroll") {
        let server = Server::start();
        create_index(&server, "wide", DIMS, "cosine");
        let mut client = server.connect();
        let mut rng = Rng(16);
        let vectors = load(&mut client, "wide", ROWS, DIMS, &mut rng);
        let queries: Vec<Vec<f32>> = (0..32).map(|_| vector(&mut rng, DIMS)).collect();
        if run("search") {
            filtered_search(&mut client, &vectors, &queries, &mut table);
        }
        if run("batch") {
            batch(&mut client, &queries, &mut table);
        }
        if run("scroll") {
            scroll(&mut client, &mut table);
        }
    }
    if run("delete") {
        delete_by_filter(&mut table);
    }
    if run("metrics") {
        metrics(&mut table);
    }
    let out = std::path::Path::new("target/filters-bench.md");
    let text = format!("| target | ours | reference, same run | ratio | goal |\n|---|---|---|---|---|\n{}", table.0);
    std::fs::write(out, text).expect("write target/filters-bench.md");
    println!("table written to {}", out.display());
}

/// Rounds of a filtered search against the unfiltered one (`filtered_search`),
/// and of a batch against its searches one by one (`batch`).
const ROUNDS: usize = 5;

/// Targets 1 and 2: each selectivity against the unfiltered search. The
/// host's noise comes in spells of seconds, so each case is timed in
/// `ROUNDS` rounds, each the unfiltered searches' median and then the
/// filtered ones', and the round of the median ratio is the one reported.
fn filtered_search(client: &mut Client, vectors: &[Vec<f32>], queries: &[Vec<f32>], table: &mut Table) {
    type Case = (&'static str, Value, f64, fn(usize) -> bool);
    let cases: [Case; 7] = [
        ("0.1% (cat)", json!({"cat": "c7"}), 0.001, |id| id % 1000 == 7),
        (
            "1% (cat $in 10)",
            json!({"cat": {"$in": (0..10).map(|c| format!("c{c}")).collect::<Vec<_>>()}}),
            0.01,
            |id| id % 1000 < 10,
        ),
        ("10% (tier)", json!({"tier": "t3"}), 0.1, |id| (id / 1000) % 10 == 3),
        ("50% (half)", json!({"half": "h1"}), 0.5, |id| id % 2 == 1),
        // The same share in runs of 5,000 rows instead of every other row:
        // what the scan reads, not the rows it scores, sets the time.
        ("50% in runs (tier $in 5)", json!({"tier": {"$in": ["t0", "t1", "t2", "t3", "t4"]}}), 0.5, |id| {
            (id / 1000) % 10 < 5
        }),
        ("20% (year range)", json!({"year": {"$gte": 2000, "$lt": 2007}}), 0.2, |id| {
            (2000..2007).contains(&(1990 + (id * 7) % 35))
        }),
        ("100% ($exists)", json!({"half": {"$exists": true}}), 1.0, |_| true),
    ];
    for (name, filter, selectivity, matches) in cases {
        let bound = |unfiltered: Duration| {
            if selectivity < 1.0 {
                unfiltered.mul_f64(1.5 * selectivity) + Duration::from_micros(300)
            } else {
                unfiltered
            }
        };
        let mut rounds: Vec<(f64, Duration, Duration)> = (0..ROUNDS)
            .map(|_| {
                let unfiltered = timed(client, "wide", queries, &Value::Null);
                let took = timed(client, "wide", queries, &filter);
                (took.as_secs_f64() / bound(unfiltered).as_secs_f64(), took, unfiltered)
            })
            .collect();
        rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (ratio, took, unfiltered) = rounds[ROUNDS / 2];
        let (recall, counts) = recall(client, vectors, &queries[..3], &filter, &matches);
        let (reference, goal) = if selectivity < 1.0 {
            let reference =
                format!("1.5 x {selectivity} x unfiltered {} + 0.3 ms = {}", ms(unfiltered), ms(bound(unfiltered)));
            (reference, "<= 1")
        } else {
            (format!("unfiltered {}", ms(unfiltered)), "<= 1.1")
        };
        table.add(
            &format!(
                "1, 2. filtered search {name}, 100,000 x 768 cosine, k=10 (median of 32, median of {ROUNDS} rounds)"
            ),
            format!("{}; recall {recall:.2}, always min(k, matches) hits: {counts}", ms(took)),
            reference,
            ratio,
            goal,
        );
    }
}

/// Target 3: a search-batch of 32 against the same 32 sent one by one.
fn batch(client: &mut Client, queries: &[Vec<f32>], table: &mut Table) {
    let searches: Vec<Value> = queries.iter().map(|q| json!({"k": 10, "queryVector": q})).collect();
    let body = json!({ "searches": searches }).to_string();
    let bodies: Vec<String> = searches.iter().map(Value::to_string).collect();
    // Each round a batch, then the same 32 alone; the round of the median
    // ratio is reported (the host's noise comes in spells of seconds).
    let mut rounds: Vec<(f64, Duration, Duration)> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            let r = client.call("POST", "/api/v1/embeddings/wide/search-batch", Some(&body));
            let batched = started.elapsed();
            assert_eq!(r.status, 200);
            let started = Instant::now();
            for body in &bodies {
                assert_eq!(client.call("POST", "/api/v1/embeddings/wide/search", Some(body)).status, 200);
            }
            let alone = started.elapsed();
            (alone.as_secs_f64() / batched.as_secs_f64(), batched, alone)
        })
        .collect();
    rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (ratio, batched, alone) = rounds[ROUNDS / 2];
    table.add(
        &format!("3. search-batch of 32, 100,000 x 768 cosine, k=10, throughput (median of {ROUNDS} rounds)"),
        format!("{} a batch", ms(batched)),
        format!("the 32 one by one on one connection: {}", ms(alone)),
        ratio,
        ">= 10",
    );
}

/// Target 4: scroll through the whole index with vectors. The client
/// reads each page's bytes and finds `next` at its end, without parsing the
/// rest: the figure is the server's rate, not a JSON parser's.
fn scroll(client: &mut Client, table: &mut Table) {
    let started = Instant::now();
    let (mut bytes, mut pages, mut body) = (0usize, 0usize, json!({"limit": 10_000, "include": ["data"]}));
    loop {
        let (status, page) = client.raw_call("POST", "/api/v1/embeddings/wide/scroll", Some(&body.to_string()));
        assert_eq!(status, 200);
        bytes += page.len();
        pages += 1;
        let tail = String::from_utf8_lossy(&page[page.len().saturating_sub(64)..]).into_owned();
        let next = tail.rsplit("\"next\":").next().unwrap().trim_end_matches('}');
        if next == "null" {
            break;
        }
        body["after"] = json!(next.parse::<i64>().unwrap());
    }
    let took = started.elapsed();
    let mb_per_s = bytes as f64 / 1e6 / took.as_secs_f64();
    table.add(
        "4. scroll of 100,000 x 768 with vectors, JSON out",
        format!("{mb_per_s:.0} MB/s ({:.0} MB in {pages} pages, {})", bytes as f64 / 1e6, ms(took)),
        "200 MB/s".into(),
        mb_per_s / 200.0,
        ">= 1",
    );
}

/// Target 5: delete by filter of 10% of 1,000,000 x 128, then stats and a
/// search agree with the model.
fn delete_by_filter(table: &mut Table) {
    const BIG: usize = 1_000_000;
    let server = Server::start();
    create_index(&server, "big", 128, "l2");
    let mut client = server.connect();
    let mut rng = Rng(17);
    let vectors = load(&mut client, "big", BIG, 128, &mut rng);
    drop(vectors);
    let started = Instant::now();
    let r = client.call("DELETE", "/api/v1/embeddings/big/delete", Some(r#"{"filter":{"tier":"t3"}}"#));
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{r:?}");
    let deleted = r.body["data"]["deleted"].as_u64().unwrap() as usize;
    assert_eq!(deleted, BIG / 10);
    let stats = client.call("GET", "/api/v1/indexes/big/stats", None);
    let count = stats.body["data"]["count"].as_u64().unwrap() as usize;
    let query = vector(&mut rng, 128);
    let r = client.call(
        "POST",
        "/api/v1/embeddings/big/search",
        Some(&json!({"k": 100, "queryVector": query}).to_string()),
    );
    let hits = r.body["data"]["nearest_neighbors"].as_object().unwrap();
    let agrees =
        count == BIG - deleted && hits.len() == 100 && hits.values().all(|hit| hit["metadata"]["tier"] != "t3");
    table.add(
        "5. delete by filter of 10% of 1,000,000 x 128, sync included",
        format!("{} for {deleted} rows; stats and a search agree with the model: {agrees}", ms(took)),
        "1 s".into(),
        took.as_secs_f64(),
        "< 1",
    );
}

/// Target 6: lone search with each of the six metrics beyond the
/// interface's against l2 on the same rows (random values in [0, 1),
/// which js needs non-negative), each query searched with l2 right before
/// (`paired`), so that each ratio is of two neighbouring measurements.
fn metrics(table: &mut Table) {
    // Nine indexes of 100,000 rows log about 2.8 GB: with the default
    // threshold the last snapshot, written by a forked process for
    // seconds, took a core from whichever metrics were timed first.
    let server = Server::start_with(&["--snapshot-log-bytes", "1099511627776"]);
    let mut client = server.connect();
    let mut rng = Rng(18);
    let vectors: Vec<Vec<f32>> = (0..ROWS).map(|_| (0..DIMS).map(|_| rng.float().abs()).collect()).collect();
    let queries: Vec<Vec<f32>> = (0..32).map(|_| (0..DIMS).map(|_| rng.float().abs()).collect()).collect();
    let metrics: [(&str, Value); 9] = [
        ("m-l2", json!({"metric": "l2"})),
        ("m-l1", json!({"metric": "l1"})),
        ("m-linf", json!({"metric": "linf"})),
        ("m-lp-3", json!({"metric": "lp", "p": 3})),
        ("m-lp-2-5", json!({"metric": "lp", "p": 2.5})),
        ("m-lp-2-7", json!({"metric": "lp", "p": 2.7})),
        ("m-canberra", json!({"metric": "canberra"})),
        ("m-bc", json!({"metric": "bc"})),
        ("m-js", json!({"metric": "js"})),
    ];
    for (name, body) in &metrics {
        let mut body = body.clone();
        body["dimensions"] = json!(DIMS);
        let r = client.call("PUT", &format!("/api/v1/indexes/{name}/create"), Some(&body.to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        load_vectors(&mut client, name, &vectors);
    }
    for (name, body) in &metrics[1..] {
        let (l2, took, ratio) = paired(&mut client, ("m-l2", name), &queries);
        let p = body.get("p").map_or(String::new(), |p| format!(" (p = {p})"));
        table.add(
            &format!("6. lone search, {}{p}, 100,000 x 768, k=10 (median of 64)", body["metric"].as_str().unwrap()),
            ms(took),
            format!("l2, each query right before: {} (ratio: the median pair's); goal 1.5 x", ms(l2)),
            ratio,
            "<= 1.5",
        );
    }
}

/// Each of `queries` searched twice in `reference`, then in `index`, one
/// right after the other: the median times of each, and the median of the
/// 64 ratios of pairs. A pair's two searches are milliseconds apart, where
/// the host's slow spells last seconds.
fn paired(client: &mut Client, (reference, index): (&str, &str), queries: &[Vec<f32>]) -> (Duration, Duration, f64) {
    let bodies: Vec<String> = queries.iter().map(|q| search_body(q, &Value::Null)).collect();
    let mut search = |index: &str, body: &str| {
        let started = Instant::now();
        let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(body));
        assert_eq!(r.status, 200, "{r:?}");
        started.elapsed()
    };
    for body in bodies.iter().take(3) {
        search(reference, body);
        search(index, body);
    }
    let pairs: Vec<(Duration, Duration)> =
        bodies.iter().chain(&bodies).map(|body| (search(reference, body), search(index, body))).collect();
    let mut ratios: Vec<f64> = pairs.iter().map(|(a, b)| b.as_secs_f64() / a.as_secs_f64()).collect();
    ratios.sort_by(f64::total_cmp);
    let (a, b): (Vec<Duration>, Vec<Duration>) = pairs.into_iter().unzip();
    (median(a), median(b), ratios[ratios.len() / 2])
}
