//! What operators use: Prometheus metrics, the OpenAPI document, the logs.

use std::time::Duration;

use crate::harness::{create_index, request_bytes, Server, KEY};

fn metrics_text(server: &Server) -> String {
    let mut client = server.connect();
    client.send(&request_bytes("GET", "/metrics", &[("X-Service-API-Key", KEY)], None));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        std::io::Read::read_exact(&mut client.stream, &mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    let length: usize = head.lines().find_map(|l| l.strip_prefix("Content-Length:")).unwrap().trim().parse().unwrap();
    let mut body = vec![0u8; length];
    std::io::Read::read_exact(&mut client.stream, &mut body).unwrap();
    String::from_utf8(body).unwrap()
}

#[test]
fn metrics_count_requests_syncs_and_index_sizes() {
    let server = Server::start();
    create_index(&server, "metered", 4, "l2");
    let insert = r#"{"embeddings":[{"id":1,"data":[1,2,3,4]},{"id":2,"data":[0,0,0,1]}]}"#;
    assert_eq!(server.call("PUT", "/api/v1/embeddings/metered/insert", Some(insert)).status, 200);
    for _ in 0..3 {
        let r = server.call("POST", "/api/v1/embeddings/metered/search", Some(r#"{"queryVector":[1,1,1,1],"k":1}"#));
        assert_eq!(r.status, 200);
    }
    server.call("GET", "/api/v1/nowhere", None);
    server.connect().call_with("GET", "/api/v1/indexes/list", &[], None);

    let text = metrics_text(&server);
    for expected in [
        "quiver_requests_total{route=\"search\",status=\"200\"} 3\n",
        "quiver_requests_total{route=\"insert\",status=\"200\"} 1\n",
        "quiver_requests_total{route=\"create_index\",status=\"200\"} 1\n",
        "quiver_requests_total{route=\"none\",status=\"404\"} 1\n",
        "quiver_requests_total{route=\"none\",status=\"401\"} 1\n",
        "quiver_request_duration_seconds_count{route=\"search\"} 3\n",
        "quiver_wal_appends_total 2\n",
        "quiver_wal_sync_duration_seconds_count 2\n",
        "quiver_index_vectors{index=\"metered\"} 2\n",
        "quiver_index_vector_bytes{index=\"metered\"} 32\n",
        "# TYPE quiver_open_connections gauge\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // Every sample line is `name{labels} value` with a numeric value.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
}

/// The search counters say what searches read: the first pass's codes and
/// the f32 rows scored exactly, not every row's f32 bytes; a search-batch
/// is a batch.
#[test]
fn metrics_count_what_searches_read_and_batches() {
    const ROWS: usize = 3000;
    const DIMS: usize = 64;
    let server = Server::start();
    create_index(&server, "read", DIMS, "l2");
    let mut rng = crate::harness::Rng(31);
    let mut client = server.connect();
    for chunk in (0..ROWS).collect::<Vec<_>>().chunks(500) {
        let embeddings: Vec<serde_json::Value> = chunk
            .iter()
            .map(|&id| serde_json::json!({"id": id, "data": crate::search_oracle::vector(&mut rng, DIMS)}))
            .collect();
        let body = serde_json::json!({ "embeddings": embeddings }).to_string();
        assert_eq!(client.call("PUT", "/api/v1/embeddings/read/insert", Some(&body)).status, 200);
    }
    let search = |rng: &mut crate::harness::Rng| serde_json::json!({"queryVector": crate::search_oracle::vector(rng, DIMS), "k": 5});
    let r = client.call("POST", "/api/v1/embeddings/read/search", Some(&search(&mut rng).to_string()));
    assert_eq!(r.status, 200);
    let batch = serde_json::json!({"searches": [search(&mut rng), search(&mut rng), search(&mut rng)]});
    let r = client.call("POST", "/api/v1/embeddings/read/search-batch", Some(&batch.to_string()));
    assert_eq!(r.status, 200, "{r:?}");

    let text = metrics_text(&server);
    let value = |name: &str| -> u64 {
        let line = text.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("quiver_search_batches_total"), 1, "{text}");
    assert_eq!(value("quiver_searches_batched_total"), 3, "{text}");
    let (rows, rescored) = (value("quiver_search_first_pass_rows_total"), value("quiver_search_rescored_rows_total"));
    let code_bytes_per_row = value("quiver_index_code_bytes{index=\"read\"}") / ROWS as u64;
    let pairs = 4 * ROWS as u64;
    assert_eq!(value("quiver_search_code_bytes_total"), rows * code_bytes_per_row, "{text}");
    assert_eq!(value("quiver_search_vector_bytes_total"), (rescored + pairs - rows) * DIMS as u64 * 4, "{text}");
    assert_eq!(
        value("quiver_search_scanned_bytes_total"),
        value("quiver_search_code_bytes_total") + value("quiver_search_vector_bytes_total")
    );
    if code_bytes_per_row > 0 {
        // Where the CPU runs the first pass, it reads every row's codes
        // and leaves few rows to score: far fewer bytes than every f32 row.
        assert_eq!(rows, pairs, "{text}");
        assert!(value("quiver_search_scanned_bytes_total") < pairs * DIMS as u64 * 4 / 2, "{text}");
    }
}

#[test]
fn metrics_need_the_key_unless_public() {
    let server = Server::start();
    let r = server.connect().call_with("GET", "/metrics", &[], None);
    assert_eq!((r.status, r.code()), (401, "NO_API_KEY_PROVIDED"));
    let server = Server::start_with(&["--metrics-public"]);
    let mut client = server.connect();
    client.send(&request_bytes("GET", "/metrics", &[], None));
    let mut start = [0u8; 12];
    std::io::Read::read_exact(&mut client.stream, &mut start).unwrap();
    assert_eq!(&start, b"HTTP/1.1 200");
}

#[test]
fn the_openapi_document_is_served_without_a_key_and_covers_every_route() {
    let server = Server::start();
    let r = server.connect().call_with("GET", "/api/v1/openapi.json", &[], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.body["openapi"], "3.1.0");
    let paths = r.body["paths"].as_object().unwrap();
    for (path, method) in [
        ("/api/v1/health", "get"),
        ("/api/v1/test-auth", "get"),
        ("/api/v1/openapi.json", "get"),
        ("/metrics", "get"),
        ("/api/v1/indexes/list", "get"),
        ("/api/v1/indexes/{indexName}/create", "put"),
        ("/api/v1/indexes/{indexName}/stats", "get"),
        ("/api/v1/indexes/{indexName}/delete", "delete"),
        ("/api/v1/embeddings/{indexName}/search", "post"),
        ("/api/v1/embeddings/{indexName}/search-batch", "post"),
        ("/api/v1/embeddings/{indexName}/scroll", "post"),
        ("/api/v1/embeddings/{indexName}/insert", "put"),
        ("/api/v1/embeddings/{indexName}/upsert", "put"),
        ("/api/v1/embeddings/{indexName}/retrieve", "post"),
        ("/api/v1/embeddings/{indexName}/delete", "delete"),
        ("/api/v1/cluster", "get"),
        ("/api/v1/cluster/members", "post"),
        ("/api/v1/cluster/members/{id}", "delete"),
    ] {
        assert!(paths.get(path).and_then(|p| p.get(method)).is_some(), "{method} {path} is not documented");
    }
    assert_eq!(paths.len(), 18, "a documented path the server does not serve");
    // The served JSON is exactly the repository's openapi.yaml.
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    let source: serde_json::Value = yaml_serde::from_str(&yaml).unwrap();
    assert_eq!(r.body, source);
    let codes = r.body["components"]["schemas"]["ErrorCode"]["enum"].as_array().unwrap();
    for code in ["INVALID_REQUEST_BODY", "EMBEDDINGS_SKIPPED", "INDEX_NOT_CREATED", "READ_ONLY", "STORAGE_ERROR"] {
        assert!(codes.iter().any(|c| c == code), "{code}");
    }
}

#[test]
fn start_up_steps_are_logged_with_timings_and_levels_filter() {
    let server = Server::start();
    let log = server.log();
    for step in ["loaded 0 indexes", "replayed 0 log records", "listening on", "started in"] {
        assert!(log.contains(step), "no {step:?} in:\n{log}");
    }
    assert!(log.lines().filter(|l| l.contains(" ms")).count() >= 3, "{log}");

    let quiet = Server::start_with(&["--log-level", "warn"]);
    let log = quiet.log();
    assert!(log.contains("listening on"), "the banner is always printed: {log}");
    assert!(!log.contains("replayed"), "info lines are filtered at warn: {log}");
}

/// At debug, each request is logged (client, request line, status, bytes
/// in and out, time) and each commit of the log; at info, neither.
#[test]
fn debug_logs_each_request_and_commit() {
    let server = Server::start_with(&["--log-level", "debug"]);
    create_index(&server, "logged", 2, "l2");
    let insert = r#"{"embeddings":[{"id":1,"data":[1,2]}]}"#;
    assert_eq!(server.call("PUT", "/api/v1/embeddings/logged/insert", Some(insert)).status, 200);
    let search = r#"{"queryVector":[1,1],"k":1}"#;
    assert_eq!(server.call("POST", "/api/v1/embeddings/logged/search", Some(search)).status, 200);
    assert_eq!(server.call("GET", "/api/v1/nowhere", None).status, 404);
    server.wait_for_log("GET /api/v1/nowhere: 404", Duration::from_secs(5));
    let log = server.log();
    let line = |text: &str| log.lines().find(|line| line.contains(text)).unwrap_or_else(|| panic!("{text}:\n{log}"));
    let searched = line("POST /api/v1/embeddings/logged/search: 200, 27 bytes in, ");
    assert!(searched.starts_with("quiver: debug: 127.0.0.1:") && searched.ends_with(" µs"), "{searched}");
    assert!(line("PUT /api/v1/embeddings/logged/insert: 200, 38 bytes in, ").contains(" bytes out, "));
    assert!(line("commit: 1 log record synced in ").ends_with(" µs"));
    assert!(line("commit: ").contains("synced"));

    let quiet = Server::start();
    assert_eq!(quiet.call("GET", "/api/v1/nowhere", None).status, 404);
    create_index(&quiet, "logged", 2, "l2");
    std::thread::sleep(Duration::from_millis(200));
    let log = quiet.log();
    assert!(!log.contains("debug:") && !log.contains("/api/v1/nowhere"), "{log}");
}

#[test]
fn abuse_is_logged_but_cannot_flood_the_log() {
    let server = Server::start();
    for _ in 0..60 {
        let mut client = server.connect();
        client.send(b"THIS IS NOT HTTP\r\n\r\n");
        assert_eq!(client.read_response().status, 400);
    }
    std::thread::sleep(Duration::from_millis(1100));
    // One more, in a new second, releases the count of what was held back.
    let mut client = server.connect();
    client.send(b"NOR THIS\r\n\r\n");
    assert_eq!(client.read_response().status, 400);
    server.wait_for_log("were not logged", Duration::from_secs(5));
    let log = server.log();
    let warnings = log.lines().filter(|l| l.contains("MALFORMED_HTTP_REQUEST")).count();
    assert!((20..=21).contains(&warnings), "{warnings} warnings:\n{log}");
    assert!(log.contains("127.0.0.1:"), "warnings name the peer: {log}");
}
