//! The durability figures, against the release server:
//!
//! 1. insert throughput of 1,000 x 768 batches from one client, with the log
//!    synced (the default) and with `--unsafe-no-sync`, side by side;
//! 2. the longest pause in answering health requests while a snapshot of a
//!    1,000,000 x 128 index is written (by the forked child);
//! 3. the start-up time with that index, from its snapshot.
//!
//! Run with `make bench` (or `cargo bench --bench durability`).

#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{batch_body, create_index, vector_texts, Client, Rng, Server, KEY};

fn insert_throughput(extra: &[&str], bodies: &[String]) -> f64 {
    let mut args = vec!["--api-key", KEY];
    args.extend_from_slice(extra);
    let server = Server::start_raw(&args, &[]);
    create_index(&server, "ingest", 768, "cosine");
    let mut client = server.connect();
    let started = Instant::now();
    for body in bodies {
        let r = client.call("PUT", "/api/v1/embeddings/ingest/insert", Some(body));
        assert_eq!(r.status, 200, "{r:?}");
    }
    (bodies.len() * 1000) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let mut rng = Rng(11);

    // 1. Insert throughput, synced vs not, same bodies, same run.
    let texts = vector_texts(&mut rng, 1000, 768);
    let bodies: Vec<String> = (0..20).map(|b| batch_body(b * 1000, 1000, &texts)).collect();
    let mut synced = Vec::new();
    let mut unsynced = Vec::new();
    for _ in 0..3 {
        synced.push(insert_throughput(&[], &bodies));
        unsynced.push(insert_throughput(&["--unsafe-no-sync"], &bodies));
    }
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    println!("durability (release server, loopback)");
    println!(
        "  insert 1,000 x 768, one client: synced {:.0} vectors/s, unsynced {:.0} vectors/s, ratio {:.2} (best of 3 runs of 20 batches)",
        best(&synced),
        best(&unsynced),
        best(&synced) / best(&unsynced)
    );

    // 2. A 1,000,000 x 128 index; the snapshot is set to start right after the last batch.
    let batches = 1000usize;
    let record_bytes = 8 + 1 + 5 + 4 + 4 + 1000 * (8 + 4 + 128 * 4) + 4;
    let log_bytes = 16 + batches * record_bytes;
    let threshold = (log_bytes - record_bytes / 2).to_string();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start_in(None, data_dir.clone(), &["--api-key", KEY, "--snapshot-log-bytes", &threshold], &[]);
    create_index(&server, "large", 128, "l2");
    let texts = vector_texts(&mut rng, 5000, 128);
    let mut client = server.connect();
    let load_started = Instant::now();
    let acknowledged_last = Arc::new(Mutex::new(None::<Instant>));
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let (acknowledged_last, done, addr) = (Arc::clone(&acknowledged_last), Arc::clone(&done), server.addr);
        std::thread::spawn(move || {
            let mut client = Client::connect(addr);
            let mut longest = Duration::ZERO;
            let mut previous = Instant::now();
            let mut answered = 0u64;
            while !done.load(Ordering::Relaxed) {
                let r = client.call("GET", "/api/v1/health", None);
                assert_eq!(r.status, 200);
                let now = Instant::now();
                if let Some(last) = *acknowledged_last.lock().unwrap() {
                    // Only gaps that reach past the last insert's answer count.
                    if now > last {
                        longest = longest.max(now - previous.max(last));
                        answered += 1;
                    }
                }
                previous = now;
            }
            (longest, answered)
        })
    };
    for b in 0..batches {
        let body = batch_body(b * 1000, 1000, &texts);
        let r = client.call("PUT", "/api/v1/embeddings/large/upsert", Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
    }
    *acknowledged_last.lock().unwrap() = Some(Instant::now());
    let load_seconds = load_started.elapsed().as_secs_f64();
    server.wait_for_log("snapshot generation 1 written", Duration::from_secs(120));
    done.store(true, Ordering::Relaxed);
    let (longest_pause, answered) = prober.join().unwrap();
    let snapshot_line =
        server.log().lines().find(|l| l.contains("snapshot generation 1 written")).unwrap_or("").to_owned();
    println!(
        "  load 1,000,000 x 128 by 1,000-vector upserts: {load_seconds:.1} s ({:.0} vectors/s)",
        1e6 / load_seconds
    );
    println!(
        "  longest pause answering health while the snapshot was written: {:.1} ms ({answered} health answers; {})",
        longest_pause.as_secs_f64() * 1e3,
        snapshot_line.trim_start_matches("quiver: ")
    );

    // 3. Start-up from that snapshot, after a crash.
    server.kill();
    let started = Instant::now();
    let server = Server::start_in(None, data_dir, &["--api-key", KEY], &[]);
    let startup = started.elapsed();
    let loaded = server.log().lines().find(|l| l.contains("loaded ")).unwrap_or("").to_owned();
    let r = server.call("GET", "/api/v1/indexes/large/stats", None);
    assert_eq!(r.body["data"]["count"], 1_000_000);
    println!(
        "  start-up with 1,000,000 x 128 (512 MB of vectors) from its snapshot: {:.0} ms to listening ({})",
        startup.as_secs_f64() * 1e3,
        loaded.trim_start_matches("quiver: ")
    );
}
