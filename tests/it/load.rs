//! Load on loopback: 2,000 connections at once, idle, trickling a byte at a
//! time, abusive, and normal; the normal ones all get their answers. Every
//! client stops by itself within seconds.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{create_index, request_bytes, Client, Server, KEY};

const IDLE: usize = 1_400;
const TRICKLING: usize = 300;
const ABUSIVE: usize = 200;
const NORMAL: usize = 100;
const REQUESTS_PER_NORMAL_CLIENT: usize = 20;

/// Lifts this process's soft limit on open files to its hard limit: the
/// test itself holds some 2,000 sockets.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on our own process with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[test]
fn two_thousand_mixed_connections_and_no_failed_normal_request() {
    raise_open_files_limit();
    // The request timeout is four times the trickling clients' second: on a
    // host loaded by the other tests, 2 s once let 13 of 300 finish past it.
    let server = Server::start_with(&["--request-timeout-ms", "4000", "--idle-timeout-ms", "6000"]);
    create_index(&server, "load", 16, "cosine");
    let seed: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"id":{i},"data":[{}]}}"#, vec![format!("{}.5", i % 7 + 1); 16].join(",")))
        .collect();
    let body = format!(r#"{{"embeddings":[{}]}}"#, seed.join(","));
    assert_eq!(server.call("PUT", "/api/v1/embeddings/load/insert", Some(&body)).status, 200);
    let addr = server.addr;
    let started = Instant::now();

    // Idle: connect and say nothing.
    let idle: Vec<TcpStream> = (0..IDLE).map(|_| TcpStream::connect(addr).unwrap()).collect();

    // Trickling: valid requests sent one byte at a time, round-robin, from one thread.
    let trickle = std::thread::spawn(move || {
        let request = request_bytes("GET", "/api/v1/health", &[], None);
        let mut sockets: Vec<TcpStream> = (0..TRICKLING).map(|_| TcpStream::connect(addr).unwrap()).collect();
        for socket in &sockets {
            socket.set_nodelay(true).unwrap();
        }
        for &byte in &request {
            for socket in &mut sockets {
                let _ = socket.write_all(&[byte]);
            }
            // 15 ms a byte: the whole request (about 60 bytes) in under a
            // second, well inside the 4 s request timeout even while the
            // other tests load both cores (at 25 ms, 1.5 s, a busy run let
            // some finish past it).
            std::thread::sleep(Duration::from_millis(15));
        }
        let mut answered = 0;
        for socket in &mut sockets {
            socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut start = [0u8; 12];
            if socket.read_exact(&mut start).is_ok() && &start == b"HTTP/1.1 200" {
                answered += 1;
            }
        }
        answered
    });

    // Abusive: garbage, endless heads, huge bodies, never-finished bodies.
    let abusive = std::thread::spawn(move || {
        let mut sockets = Vec::new();
        for n in 0..ABUSIVE {
            let mut socket = TcpStream::connect(addr).unwrap();
            socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let attack: Vec<u8> = match n % 4 {
                0 => b"\x00\x01\x02 garbage \xff\xfe\r\n\r\n".to_vec(),
                1 => format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000)).into_bytes(),
                2 => b"PUT /api/v1/embeddings/load/upsert HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n".to_vec(),
                _ => format!("PUT /api/v1/embeddings/load/upsert HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nContent-Length: 100\r\n\r\n{{").into_bytes(),
            };
            let _ = socket.write_all(&attack);
            sockets.push(socket);
        }
        // All at once: the never-finished bodies wait out one request timeout together.
        let mut refused = 0;
        for socket in &mut sockets {
            let mut start = [0u8; 12];
            if socket.read_exact(&mut start).is_ok() && start.starts_with(b"HTTP/1.1 4") {
                refused += 1;
            }
        }
        refused
    });

    // Normal: each makes its requests on one keep-alive connection.
    let failures = Arc::new(AtomicUsize::new(0));
    let normal: Vec<_> = (0..NORMAL)
        .map(|n| {
            let failures = Arc::clone(&failures);
            std::thread::spawn(move || {
                let mut client = Client::connect(addr);
                for r in 0..REQUESTS_PER_NORMAL_CLIENT {
                    let id = 1_000 + n * REQUESTS_PER_NORMAL_CLIENT + r;
                    let vector = vec![format!("{}.25", (n + r) % 5 + 1); 16].join(",");
                    let response = match r % 4 {
                        0 => client.call("GET", "/api/v1/health", None),
                        1 => client.call(
                            "POST",
                            "/api/v1/embeddings/load/search",
                            Some(&format!(r#"{{"queryVector":[{vector}],"k":5}}"#)),
                        ),
                        2 => client.call(
                            "PUT",
                            "/api/v1/embeddings/load/insert",
                            Some(&format!(r#"{{"embeddings":[{{"id":{id},"data":[{vector}]}}]}}"#)),
                        ),
                        _ => client.call("POST", "/api/v1/embeddings/load/retrieve", Some(r#"{"ids":[1,2,3]}"#)),
                    };
                    let ok = response.status == 200
                        && (r % 4 != 1
                            || response.body["data"]["nearest_neighbors"].as_object().map(|o| o.len()) == Some(5));
                    if !ok {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for thread in normal {
        thread.join().unwrap();
    }
    let normal_done = started.elapsed();
    let refused = abusive.join().unwrap();
    let trickled = trickle.join().unwrap();
    let peak_kib = server.status_kib("VmHWM");
    drop(idle);

    println!(
        "load: {} connections; normal clients done in {:.2} s; peak server RSS {} MiB",
        IDLE + TRICKLING + ABUSIVE + NORMAL,
        normal_done.as_secs_f64(),
        peak_kib / 1024
    );
    assert_eq!(failures.load(Ordering::Relaxed), 0, "normal requests failed under load");
    assert_eq!(trickled, TRICKLING, "byte-at-a-time clients were not all answered");
    assert_eq!(refused, ABUSIVE, "abusive clients were not all refused with a 4xx");
    assert!(peak_kib < 512 * 1024, "peak RSS {peak_kib} KiB");
    // All inserts of the normal clients are there.
    let stats = server.call("GET", "/api/v1/indexes/load/stats", None);
    assert_eq!(stats.body["data"]["count"], 200 + NORMAL * REQUESTS_PER_NORMAL_CLIENT / 4);
    assert_eq!(server.call("GET", "/api/v1/health", None).status, 200);
}
