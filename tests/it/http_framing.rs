//! HTTP framing over a real socket: pipelining, requests split at every
//! byte, chunked bodies, 100-continue, limits, garbage, slow clients.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::harness::{create_index, request_bytes, Client, Server, KEY};

const AUTH: (&str, &str) = ("X-Service-API-Key", KEY);

/// A few requests of different framings, and the statuses they must get.
fn mixed_requests() -> (Vec<u8>, Vec<u16>) {
    let mut bytes = Vec::new();
    bytes.extend(request_bytes("GET", "/api/v1/health", &[], None));
    bytes.extend(request_bytes(
        "PUT",
        "/api/v1/embeddings/split/upsert",
        &[AUTH],
        Some(r#"{"embeddings":[{"id":1,"data":[1,2]},{"id":2,"data":[3,4]}]}"#),
    ));
    bytes.extend(
        format!(
            "POST /api/v1/embeddings/split/search HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n\
             5;name=value\r\n{{\"k\":\r\n11\r\n1,\"queryVector\":[\r\n4\r\n1,2]\r\n1\r\n}}\r\n0\r\nX-Trailer: yes\r\n\r\n"
        )
        .into_bytes(),
    );
    bytes.extend(request_bytes("GET", "/api/v1/nowhere", &[AUTH], None));
    bytes.extend(request_bytes("POST", "/api/v1/embeddings/split/retrieve", &[AUTH], Some(r#"{"ids":[2]}"#)));
    (bytes, vec![200, 200, 200, 404, 200])
}

fn read_all(client: &mut Client, n: usize) -> Vec<(u16, String)> {
    (0..n)
        .map(|_| {
            let r = client.read_response();
            (r.status, r.body.to_string())
        })
        .collect()
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let server = Server::start();
    create_index(&server, "split", 2, "l2");
    let (bytes, statuses) = mixed_requests();
    let mut client = server.connect();
    client.send(&bytes);
    let answers = read_all(&mut client, statuses.len());
    assert_eq!(answers.iter().map(|a| a.0).collect::<Vec<_>>(), statuses);
    assert!(answers[2].1.contains(r#""1":{"metadata":{},"rank":0}"#), "{}", answers[2].1);
    assert!(answers[4].1.contains(r#""data":[3.0,4.0]"#), "{}", answers[4].1);
    // Many small pipelined requests in one write (more than one tick's share).
    let many: Vec<u8> = (0..200).flat_map(|_| request_bytes("GET", "/api/v1/health", &[], None)).collect();
    client.send(&many);
    assert!(read_all(&mut client, 200).iter().all(|a| a.0 == 200));
}

#[test]
fn a_request_split_at_any_byte_is_answered_as_a_whole() {
    let server = Server::start();
    create_index(&server, "split", 2, "l2");
    let (bytes, statuses) = mixed_requests();
    let mut whole = server.connect();
    whole.send(&bytes);
    let expected = read_all(&mut whole, statuses.len());
    let normalise = |answers: Vec<(u16, String)>| -> Vec<(u16, String)> {
        // Health figures change between calls; compare its status only.
        answers.into_iter().map(|(s, b)| if b.contains("healthy") { (s, String::new()) } else { (s, b) }).collect()
    };
    let expected = normalise(expected);

    // One byte per write.
    let mut client = server.connect();
    for &b in &bytes {
        client.send(&[b]);
    }
    assert_eq!(normalise(read_all(&mut client, statuses.len())), expected, "byte by byte");

    // Split in two at every offset.
    for at in 1..bytes.len() {
        let mut client = server.connect();
        client.send(&bytes[..at]);
        client.stream.flush().unwrap();
        std::thread::sleep(Duration::from_micros(200));
        client.send(&bytes[at..]);
        assert_eq!(normalise(read_all(&mut client, statuses.len())), expected, "split at {at}");
    }
}

#[test]
fn expect_100_continue_is_answered_before_the_body() {
    let server = Server::start();
    create_index(&server, "cont", 1, "l2");
    let body = r#"{"embeddings":[{"id":1,"data":[1]}]}"#;
    let mut client = server.connect();
    client.send(
        format!(
            "PUT /api/v1/embeddings/cont/insert HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let mut interim = [0u8; 25];
    client.stream.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    client.send(body.as_bytes());
    let r = client.read_response();
    assert_eq!((r.status, r.message()), (200, "1/1 embeddings successfully inserted."));

    // A refused request gets its final answer at once instead, and the connection closes.
    let mut client = server.connect();
    client.send(b"PUT /api/v1/embeddings/cont/insert HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n");
    let r = client.read_response();
    assert_eq!((r.status, r.code()), (401, "NO_API_KEY_PROVIDED"));
    assert_eq!(r.header("connection"), Some("close"));
}

#[test]
fn keep_alive_http10_and_connection_close() {
    let server = Server::start();
    let health = |version: &str, connection: Option<&str>| {
        let mut client = server.connect();
        let extra = connection.map(|c| format!("Connection: {c}\r\n")).unwrap_or_default();
        client.send(format!("GET /api/v1/health {version}\r\n{extra}\r\n").as_bytes());
        let r = client.read_response();
        assert_eq!(r.status, 200);
        (r.header("connection").unwrap().to_owned(), client.is_closed())
    };
    assert_eq!(health("HTTP/1.1", None), ("keep-alive".into(), false));
    assert_eq!(health("HTTP/1.1", Some("close")), ("close".into(), true));
    assert_eq!(health("HTTP/1.0", None), ("close".into(), true));
    assert_eq!(health("HTTP/1.0", Some("keep-alive")), ("keep-alive".into(), false));

    // Several requests on one kept-alive connection.
    let mut client = server.connect();
    for _ in 0..5 {
        assert_eq!(client.call("GET", "/api/v1/indexes/list", None).status, 200);
    }
}

#[test]
fn oversized_head_and_body_get_431_and_413() {
    let server = Server::start_with(&["--head-bytes-max", "2048", "--body-bytes-max", "1000"]);
    create_index(&server, "lim", 1, "l2");

    let mut client = server.connect();
    let big_header = format!("GET /api/v1/health HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(3000));
    client.send(big_header.as_bytes());
    let r = client.read_response();
    r.check_envelope();
    assert_eq!((r.status, r.code()), (431, "HEADERS_TOO_LARGE"));
    assert!(client.is_closed());

    // A head that never ends is refused once it passes the limit.
    let mut client = server.connect();
    client.send(format!("GET /api/v1/health HTTP/1.1\r\nX-Endless: {}", "b".repeat(4000)).as_bytes());
    assert_eq!(client.read_response().status, 431);

    let mut client = server.connect();
    let body = format!(r#"{{"embeddings":[{{"id":1,"data":[{}1]}}]}}"#, "1,".repeat(600));
    client.send(&request_bytes("PUT", "/api/v1/embeddings/lim/upsert", &[AUTH], Some(&body)));
    let r = client.read_response();
    r.check_envelope();
    assert_eq!((r.status, r.code()), (413, "REQUEST_TOO_LARGE"));
    assert!(r.body["error"]["description"].as_str().unwrap().contains("1000 bytes"));

    // Chunked bodies count their decoded size.
    let mut client = server.connect();
    let chunk = "x".repeat(600);
    client.send(
        format!("PUT /api/v1/embeddings/lim/upsert HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n").as_bytes(),
    );
    assert_eq!(client.read_response().status, 413);
    // Nothing was stored, and the server still serves.
    let r = server.call("POST", "/api/v1/embeddings/lim/retrieve", Some(r#"{"ids":[1]}"#));
    assert_eq!(r.message(), "0/1 embeddings successfully retrieved.");
}

#[test]
fn garbage_gets_400_and_the_connection_is_closed() {
    let server = Server::start();
    for garbage in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"[..],
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /api/v1/health HTTP/9.9\r\n\r\n",
        b"GET /api/v1/health HTTP/1.1\r\nBad Header Line\r\n\r\n",
        b"PUT /api/v1/health HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        b"PUT /api/v1/health HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"PUT /api/v1/health HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"PUT /api/v1/health HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        b"PUT /api/v1/health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nnothex\r\n",
        b"PUT /api/v1/health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX",
    ] {
        let mut client = server.connect();
        client.send(garbage);
        let r = client.read_response();
        r.check_envelope();
        assert_eq!((r.status, r.code()), (400, "MALFORMED_HTTP_REQUEST"), "{:?}", String::from_utf8_lossy(garbage));
        assert!(client.is_closed(), "{:?}", String::from_utf8_lossy(garbage));
    }
    assert_eq!(server.call("GET", "/api/v1/health", None).status, 200);
}

#[test]
fn a_stalled_client_does_not_block_others() {
    let server = Server::start();
    create_index(&server, "slow", 1, "l2");
    let mut stalled = server.connect();
    stalled.send(format!("PUT /api/v1/embeddings/slow/upsert HTTP/1.1\r\nX-Service-API-Key: {KEY}\r\nContent-Length: 100\r\n\r\n{{\"embeddings\":[").as_bytes());
    let mut half_head = server.connect();
    half_head.send(b"GET /api/v1/hea");
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(server.call("GET", "/api/v1/indexes/list", None).status, 200);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    // The stalled client then finishes, and is answered.
    let rest = r#"{"id":1,"data":[1]}]}"#;
    let padding = " ".repeat(100 - 15 - rest.len());
    stalled.send(format!("{rest}{padding}").as_bytes());
    assert_eq!(stalled.read_response().status, 200);
}

#[test]
fn slow_and_idle_clients_are_timed_out() {
    let server = Server::start_with(&["--request-timeout-ms", "500", "--idle-timeout-ms", "800"]);
    let mut slow = server.connect();
    slow.send(b"PUT /api/v1/indexes/x/create HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"dim");
    let r = slow.read_response();
    r.check_envelope();
    assert_eq!((r.status, r.code()), (408, "REQUEST_TIMEOUT"));
    assert!(slow.is_closed());

    let mut idle = server.connect();
    assert_eq!(idle.call("GET", "/api/v1/health", None).status, 200);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(idle.is_closed(), "an idle connection is closed after the idle timeout");
}

#[test]
fn connections_beyond_the_limit_get_503() {
    let server = Server::start_with(&["--connections-max", "3"]);
    let mut held: Vec<Client> = (0..3).map(|_| server.connect()).collect();
    for client in &mut held {
        assert_eq!(client.call("GET", "/api/v1/health", None).status, 200);
    }
    let mut extra = server.connect();
    let r = extra.read_response();
    r.check_envelope();
    assert_eq!((r.status, r.code()), (503, "TOO_MANY_CONNECTIONS"));
    drop(held);
    // Slots are given back when clients leave.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut client = server.connect();
        client.send(&request_bytes("GET", "/api/v1/health", &[], None));
        if client.read_response().status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "slots were not given back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_large_batch_and_a_large_reply_cross_the_socket() {
    let server = Server::start();
    create_index(&server, "large", 768, "ip");
    let items: Vec<String> = (0..1000)
        .map(|id| {
            let data: Vec<String> = (0..768).map(|d| format!("{}", ((id * 768 + d) % 1000) as f32 / 997.0)).collect();
            format!(r#"{{"id":{id},"data":[{}]}}"#, data.join(","))
        })
        .collect();
    let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
    let mut client = server.connect();
    let r = client.call("PUT", "/api/v1/embeddings/large/insert", Some(&body));
    assert_eq!((r.status, r.message()), (200, "1000/1000 embeddings successfully inserted."));
    let ids: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
    let r =
        client.call("POST", "/api/v1/embeddings/large/retrieve", Some(&format!(r#"{{"ids":[{}]}}"#, ids.join(","))));
    assert_eq!(r.status, 200);
    let embeddings = r.body["data"]["embeddings"].as_array().unwrap();
    assert_eq!(embeddings.len(), 1000);
    assert_eq!(embeddings[999]["data"][767].as_f64().unwrap() as f32, ((999 * 768 + 767) % 1000) as f32 / 997.0);
    // The client reads slowly: the server must keep the rest for it.
    client.send(&request_bytes(
        "POST",
        "/api/v1/embeddings/large/retrieve",
        &[AUTH],
        Some(&format!(r#"{{"ids":[{}]}}"#, ids.join(","))),
    ));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(client.read_response().status, 200);
}

#[test]
fn a_client_that_vanishes_mid_body_is_forgotten() {
    let server = Server::start();
    for _ in 0..10 {
        let mut client = server.connect();
        client.send(b"PUT /api/v1/indexes/abc/create HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"dimen");
        drop(client);
    }
    let mut reset = std::net::TcpStream::connect(server.addr).unwrap();
    reset.write_all(b"GET /api/v1/health HTTP/1.1\r\n").unwrap();
    drop(reset);
    assert_eq!(server.call("GET", "/api/v1/health", None).status, 200);
}

#[test]
fn a_request_budget_of_one_per_turn_still_answers_every_pipelined_request_in_order() {
    let server = Server::start_with(&["--requests-per-tick-max", "1"]);
    create_index(&server, "budget", 1, "l2");
    let mut pipelined = server.connect();
    let mut bytes = Vec::new();
    for id in 0..50 {
        let body = format!(r#"{{"embeddings":[{{"id":{id},"data":[{id}]}}]}}"#);
        bytes.extend(request_bytes("PUT", "/api/v1/embeddings/budget/insert", &[AUTH], Some(&body)));
        bytes.extend(request_bytes(
            "POST",
            "/api/v1/embeddings/budget/retrieve",
            &[AUTH],
            Some(&format!(r#"{{"ids":[{id}]}}"#)),
        ));
    }
    pipelined.send(&bytes);
    // Another client is served while the pipeline is worked through.
    assert_eq!(server.call("GET", "/api/v1/health", None).status, 200);
    for id in 0..50 {
        assert_eq!(pipelined.read_response().message(), "1/1 embeddings successfully inserted.");
        let r = pipelined.read_response();
        assert_eq!(r.body["data"]["embeddings"][0]["id"], id, "answers come in request order");
    }
}

/// A client that pipelines requests with large answers and reads none of
/// them is not read from once 8 MiB of answers wait for it: the server's
/// memory stays bounded, others are served, and every answer still arrives.
#[test]
fn a_client_that_does_not_read_its_answers_is_held_back_not_buffered() {
    let server = Server::start();
    create_index(&server, "wide", 256, "ip");
    let mut loader = server.connect();
    for batch in 0..4 {
        let items: Vec<String> = (0..250)
            .map(|i| {
                let id = batch * 250 + i;
                format!(r#"{{"id":{id},"data":[{}]}}"#, vec![format!("0.{id:04}1234567"); 256].join(","))
            })
            .collect();
        let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
        assert_eq!(loader.call("PUT", "/api/v1/embeddings/wide/insert", Some(&body)).status, 200);
    }
    let ids: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
    let retrieve = request_bytes(
        "POST",
        "/api/v1/embeddings/wide/retrieve",
        &[AUTH],
        Some(&format!(r#"{{"ids":[{}]}}"#, ids.join(","))),
    );
    let rss_before = server.status_kib("VmRSS");
    let mut greedy = server.connect();
    let pipelined = 20;
    for _ in 0..pipelined {
        greedy.send(&retrieve);
    }
    std::thread::sleep(Duration::from_millis(500));
    // Each answer is about 3.3 MB: 66 MB would be waiting if all were answered.
    let grown_kib = server.status_kib("VmRSS").saturating_sub(rss_before);
    assert!(grown_kib < 32 * 1024, "the server grew by {grown_kib} KiB for answers nobody reads");
    assert_eq!(server.call("GET", "/api/v1/health", None).status, 200, "others are still served");
    for n in 0..pipelined {
        let r = greedy.read_response();
        assert_eq!((r.status, r.body["data"]["embeddings"].as_array().map(Vec::len)), (200, Some(1000)), "answer {n}");
    }
}

/// After large request bodies, the buffers they grew are given back: the
/// server's resident memory comes down to what it stores (vectors and
/// codes) and a little more, not the largest body's worth of buffers.
#[test]
fn large_requests_leave_no_buffers_resident() {
    let server = Server::start();
    create_index(&server, "bulk", 256, "cosine");
    let rss_before = server.status_kib("VmRSS");
    let mut loader = server.connect();
    let (rows, per_request) = (20_000, 5_000);
    for first in (0..rows).step_by(per_request) {
        let items: Vec<String> = (first..first + per_request)
            .map(|id| {
                let values: Vec<String> =
                    (0..256).map(|d| format!("0.{:07}", (id * 7919 + d * 104_729) % 10_000_000 + 1)).collect();
                format!(r#"{{"id":{id},"data":[{}]}}"#, values.join(","))
            })
            .collect();
        // About 13 MB of JSON each.
        let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
        assert_eq!(loader.call("PUT", "/api/v1/embeddings/bulk/insert", Some(&body)).status, 200);
    }
    drop(loader);
    // What it stores: 20,000 x (1,024 bytes of vector + 264 of code + about
    // 60 of id, map slot, norms): about 26 MiB.
    let stored_kib = rows as u64 * (1024 + 264 + 60) / 1024;
    // The loop gives memory back at the first of its sweeps (every 250
    // ms) with no large request since the one before: on a machine busy
    // with other tests a sweep may come late, so wait for it (at most
    // 3 s) rather than a fixed while.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    std::thread::sleep(Duration::from_millis(700));
    let mut grown_kib = server.status_kib("VmRSS").saturating_sub(rss_before);
    while grown_kib >= stored_kib + 12 * 1024 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        grown_kib = server.status_kib("VmRSS").saturating_sub(rss_before);
    }
    assert!(
        grown_kib < stored_kib + 12 * 1024,
        "resident memory grew by {grown_kib} KiB after the load, for {stored_kib} KiB stored"
    );
}
