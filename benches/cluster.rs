//! The cluster's figures: a three-node cluster on loopback against one
//! node, same run, same release binary.
//!
//! 1. Durable ingest of 1,000 x 768 batches from one client (to the
//!    leader): MB/s of vector data, cluster / single.
//! 2. One-row upsert latency, p50 of 1,000, to the leader: cluster / single.
//! 3. A linearizable search on a follower, 100,000 x 768, one client:
//!    latency p50, cluster / single.
//! 4. Failover: from `kill -9` of the leader to the next write answered
//!    200 through a survivor (a client retrying at once), 20 kills: p50, max.
//! 5. Catch-up: a follower down while 100,000 x 768 rows are written, then
//!    restarted: MB/s of vector data from its start to its applying the
//!    leader's commit index (its log is not cut meanwhile: the entries).
//!    Then a fifth figure's other half: a node added to the cluster, which
//!    is sent the whole state: MB/s of the state's vector data from the
//!    request to the answer that it votes.
//!
//! Run with `make bench` (or `cargo bench --bench cluster`).

#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "../tests/it/nodes.rs"]
mod nodes;

use std::time::{Duration, Instant};

use harness::{batch_body, create_index, vector_texts, Client, Rng, Server};
use nodes::{try_call, Cluster};

const DIMS: usize = 768;
const BATCH: usize = 1000;

/// MB/s of vector data, inserting `bodies` one after another through `client`.
fn ingest(client: &mut Client, index: &str, bodies: &[String]) -> f64 {
    let started = Instant::now();
    for body in bodies {
        let r = client.call("PUT", &format!("/api/v1/embeddings/{index}/insert"), Some(body));
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    (bodies.len() * BATCH * DIMS * 4) as f64 / 1e6 / started.elapsed().as_secs_f64()
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

/// p50 in ms of `count` one-row upserts through `client`.
fn upsert_p50(client: &mut Client, index: &str, count: usize, rng: &mut Rng) -> f64 {
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let values: Vec<String> = (0..DIMS).map(|_| rng.float().to_string()).collect();
        let body = format!(r#"{{"embeddings":[{{"id":{},"data":[{}]}}]}}"#, 10_000_000 + i, values.join(","));
        let started = Instant::now();
        let r = client.call("PUT", &format!("/api/v1/embeddings/{index}/upsert"), Some(&body));
        samples.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    percentile(&mut samples, 0.5)
}

/// p50 in ms of `count` searches (k = 10) through `client`.
fn search_p50(client: &mut Client, path: &str, count: usize, rng: &mut Rng) -> f64 {
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let values: Vec<String> = (0..DIMS).map(|_| rng.float().to_string()).collect();
        let body = format!(r#"{{"queryVector":[{}],"k":10}}"#, values.join(","));
        let started = Instant::now();
        let r = client.call("POST", path, Some(&body));
        samples.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    percentile(&mut samples, 0.5)
}

/// The median of `samples`.
fn median(mut samples: Vec<f64>) -> f64 {
    percentile(&mut samples, 0.5)
}

fn main() {
    let mut rng = Rng(34);
    let texts = vector_texts(&mut rng, BATCH, DIMS);
    println!("cluster (release server, three nodes on loopback vs one node, same run)");
    let single = Server::start();
    // No state snapshot in this run but the one a node added is sent: the
    // catch-up of 5 goes through the log.
    let mut cluster = Cluster::start_with(3, false, &["--snapshot-log-bytes", "17179869184"]);
    let leader = cluster.wait_for_leader(Duration::from_secs(30));

    // 1 and 2, in turns (single, cluster, single, ...), three rounds each:
    // a noisy machine weighs on both.
    let bodies: Vec<String> = (0..10).map(|b| batch_body(b * BATCH, BATCH, &texts)).collect();
    let (mut ingest_single, mut ingest_cluster, mut upsert_single, mut upsert_cluster) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let index = format!("ingest-{round}");
        for (server, ingests, upserts) in [
            (&single, &mut ingest_single, &mut upsert_single),
            (cluster.node(leader), &mut ingest_cluster, &mut upsert_cluster),
        ] {
            create_index(server, &index, DIMS, "cosine");
            let mut client = server.connect();
            ingests.push(ingest(&mut client, &index, &bodies));
            upserts.push(upsert_p50(&mut client, &index, 300, &mut rng));
        }
    }
    let (ingest_single, ingest_cluster) = (median(ingest_single), median(ingest_cluster));
    let (upsert_single, upsert_cluster) = (median(upsert_single), median(upsert_cluster));
    println!(
        "  1. ingest 1,000 x 768, one client, durable: cluster {ingest_cluster:.0} MB/s, single {ingest_single:.0} MB/s, \
         ratio {:.2} (target >= 0.5; medians of 3 rounds of 10 batches, in turns)",
        ingest_cluster / ingest_single
    );
    println!(
        "  2. one-row upsert p50: cluster {upsert_cluster:.2} ms, single {upsert_single:.2} ms, ratio {:.2} (target <= 3; \
         medians of 3 rounds of 300, in turns)",
        upsert_cluster / upsert_single
    );

    // 3. Search on 100,000 x 768, in turns.
    let big: Vec<String> = (0..100).map(|b| batch_body(b * BATCH, BATCH, &texts)).collect();
    for server in [&single, cluster.node(leader)] {
        create_index(server, "search", DIMS, "l2");
        ingest(&mut server.connect(), "search", &big);
    }
    let follower = (leader + 1) % 3;
    let (mut search_single, mut search_cluster) = (Vec::new(), Vec::new());
    let path = "/api/v1/embeddings/search/search";
    for _ in 0..3 {
        search_single.push(search_p50(&mut single.connect(), path, 100, &mut rng));
        search_cluster.push(search_p50(&mut cluster.node(follower).connect(), path, 100, &mut rng));
    }
    let (search_single, search_cluster) = (median(search_single), median(search_cluster));
    println!(
        "  3. search 100,000 x 768, k 10, linearizable on a follower: p50 {search_cluster:.2} ms, single \
         {search_single:.2} ms, ratio {:.2} (target <= 1.2; medians of 3 rounds of 100, in turns)",
        search_cluster / search_single
    );
    drop(single);

    // 5. Catch-up: a follower misses 100,000 x 768 rows. Its restart first
    // applies its own log again (no state snapshot taken), timed apart.
    let leader = cluster.wait_for_leader(Duration::from_secs(30));
    let behind = (leader + 1) % 3;
    cluster.wait_until_converged(Duration::from_secs(60));
    let had = cluster.status(behind).unwrap()["applied_index"].as_u64().unwrap();
    cluster.kill(behind);
    create_index(cluster.node(leader), "missed", DIMS, "l2");
    ingest(&mut cluster.node(leader).connect(), "missed", &big);
    let commit = cluster.status(leader).unwrap()["commit_index"].as_u64().unwrap();
    let started = Instant::now();
    cluster.start_node(behind);
    let mut replayed = None;
    loop {
        let applied = cluster.status(behind).map_or(0, |s| s["applied_index"].as_u64().unwrap());
        if applied >= had && replayed.is_none() {
            replayed = Some(started.elapsed());
        }
        if applied >= commit {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "the follower did not catch up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let replayed = replayed.expect("set before catching up");
    let caught_up = started.elapsed() - replayed;
    let catch_up = (100 * BATCH * DIMS * 4) as f64 / 1e6 / caught_up.as_secs_f64();
    println!(
        "  5. catch-up of 100,000 x 768 rows missed: {catch_up:.0} MB/s (target >= 100), after {:.1} s applying its \
         own log of {had} entries again",
        replayed.as_secs_f64()
    );
    // 5, by the state: a node added is sent all of it (every index of this
    // run, the 100,000 rows missed above among them).
    let leader = cluster.wait_for_leader(Duration::from_secs(30));
    cluster.wait_until_converged(Duration::from_secs(60));
    let rows: u64 = ["ingest-0", "ingest-1", "ingest-2", "search", "missed"]
        .iter()
        .map(|name| {
            let r = cluster.node(leader).call("GET", &format!("/api/v1/indexes/{name}/stats"), None);
            r.body["data"]["count"].as_u64().expect("a count")
        })
        .sum();
    let added = cluster.start_joining();
    let body = format!(r#"{{"id":{},"address":"{}"}}"#, added + 1, cluster.peers[added]);
    let started = Instant::now();
    let r = cluster.node(leader).call("POST", "/api/v1/cluster/members", Some(&body));
    assert_eq!(r.status, 200, "{r:?}");
    let joined = started.elapsed();
    let state_mb = (rows as usize * DIMS * 4) as f64 / 1e6;
    println!(
        "  5. a node added, sent the whole state ({rows} rows, {state_mb:.0} MB of vectors): voting after {:.1} s, \
         {:.0} MB/s (target >= 100)",
        joined.as_secs_f64(),
        state_mb / joined.as_secs_f64()
    );
    cluster.kill(added);
    let r = cluster.node(leader).call("DELETE", &format!("/api/v1/cluster/members/{}", added + 1), None);
    assert_eq!(r.status, 200, "{r:?}");
    // 4. Failover, 20 kills of the leader.
    let mut failovers = Vec::new();
    let body = r#"{"embeddings":[{"id":1,"data":[1.0]}]}"#;
    create_index(cluster.node(cluster.wait_for_leader(Duration::from_secs(30))), "failover", 1, "l2");
    for _ in 0..20 {
        let leader = cluster.wait_for_leader(Duration::from_secs(30));
        cluster.wait_until_converged(Duration::from_secs(60));
        let survivor = cluster.node((leader + 1) % 3).addr;
        let killed = Instant::now();
        cluster.kill(leader);
        loop {
            let r = try_call(survivor, "PUT", "/api/v1/embeddings/failover/upsert", Some(body));
            if r.is_some_and(|r| r.status == 200) {
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(60), "no write went through after a leader's death");
        }
        failovers.push(killed.elapsed().as_secs_f64());
        cluster.start_node(leader);
    }
    let max = failovers.iter().cloned().fold(0.0, f64::max);
    println!(
        "  4. failover, kill -9 of the leader to the next answered write, 20 kills: p50 {:.2} s, max {max:.2} s \
         (target <= 3)",
        percentile(&mut failovers, 0.5)
    );
}
