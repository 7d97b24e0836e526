//! What operators use: Prometheus metrics, the OpenAPI document, the logs.

use std::time::Duration;

use crate::harness::{create_index, request_bytes, start_fails, Server, KEY};

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
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/api/v1/indexes/{indexName}/snapshot", "get"),
        ("/api/v1/indexes/{indexName}/restore", "put"),
    ] {
        assert!(paths.get(path).and_then(|p| p.get(method)).is_some(), "{method} {path} is not documented");
    }
    assert_eq!(paths.len(), 22, "a documented path the server does not serve");
    // The served JSON is exactly the repository's openapi.yaml.
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap();
    let source: serde_json::Value = yaml_serde::from_str(&yaml).unwrap();
    assert_eq!(r.body, source);
    let codes = r.body["components"]["schemas"]["ErrorCode"]["enum"].as_array().unwrap();
    for code in [
        "INVALID_REQUEST_BODY",
        "EMBEDDINGS_SKIPPED",
        "INDEX_NOT_CREATED",
        "READ_ONLY",
        "STORAGE_ERROR",
        "READ_ONLY_API_KEY",
        "NOT_READY",
        "SNAPSHOT_UNAVAILABLE",
    ] {
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

/// The probes answer without a key and read no body; a single node is
/// ready as soon as it answers (its data is loaded before it listens).
#[test]
fn probes_answer_without_a_key() {
    let server = Server::start();
    for (path, message) in [("/healthz", "live"), ("/readyz", "ready")] {
        let r = server.connect().call_with("GET", path, &[], None);
        assert_eq!((r.status, &r.body), (200, &serde_json::json!({"status": 200, "message": message})), "{path}");
        let r = server.connect().call_with("POST", path, &[], Some("{}"));
        assert_eq!((r.status, r.code(), r.header("Allow")), (405, "METHOD_NOT_ALLOWED", Some("GET")), "{path}");
    }
    assert_eq!(server.connect().call_with("GET", "/healthz/x", &[], None).status, 404);
}

/// The status line of a GET of `path` (whose body need not be JSON).
fn status_line(server: &Server, path: &str, headers: &[(&str, &str)]) -> String {
    let mut client = server.connect();
    client.send(&request_bytes("GET", path, headers, None));
    let mut start = [0u8; 12];
    std::io::Read::read_exact(&mut client.stream, &mut start).unwrap();
    String::from_utf8_lossy(&start).into_owned()
}

const READ_ONLY_KEY: &str = "read-only-key-0123456789abcdef";

/// The read-only key may read everything and change nothing; the full key
/// still does both, and any other key is refused as before.
#[test]
fn the_read_only_key_reads_and_is_refused_writes() {
    let server = Server::start_with(&["--read-only-api-key", READ_ONLY_KEY]);
    create_index(&server, "kept", 2, "l2");
    let insert = r#"{"embeddings":[{"id":1,"data":[1,2]},{"id":2,"data":[3,4]}]}"#;
    assert_eq!(server.call("PUT", "/api/v1/embeddings/kept/insert", Some(insert)).status, 200);
    let as_reader = |method: &str, path: &str, body: Option<&str>| {
        server.connect().call_with(method, path, &[("X-Service-API-Key", READ_ONLY_KEY)], body)
    };
    for (method, path, body) in [
        ("GET", "/api/v1/test-auth", None),
        ("GET", "/api/v1/indexes/list", None),
        ("GET", "/api/v1/indexes/kept/stats", None),
        ("POST", "/api/v1/embeddings/kept/search", Some(r#"{"queryVector":[1,1],"k":1}"#)),
        ("POST", "/api/v1/embeddings/kept/search-batch", Some(r#"{"searches":[{"queryVector":[1,1],"k":1}]}"#)),
        ("POST", "/api/v1/embeddings/kept/retrieve", Some(r#"{"ids":[1]}"#)),
        ("POST", "/api/v1/embeddings/kept/scroll", Some("{}")),
        ("GET", "/api/v1/cluster", None),
    ] {
        let r = as_reader(method, path, body);
        assert_eq!(r.status, 200, "{method} {path}: {r:?}");
    }
    assert_eq!(status_line(&server, "/metrics", &[("X-Service-API-Key", READ_ONLY_KEY)]), "HTTP/1.1 200");
    let hit = as_reader("POST", "/api/v1/embeddings/kept/search", Some(r#"{"queryVector":[3,4],"k":1}"#));
    assert_eq!(hit.body["data"]["nearest_neighbors"]["2"]["rank"], 0, "{hit:?}");
    for (method, path, body, what) in [
        ("PUT", "/api/v1/indexes/more/create", Some(r#"{"dimensions":2,"metric":"l2"}"#), "create an index"),
        ("DELETE", "/api/v1/indexes/kept/delete", None, "delete an index"),
        (
            "PUT",
            "/api/v1/embeddings/kept/insert",
            Some(r#"{"embeddings":[{"id":3,"data":[0,1]}]}"#),
            "insert embeddings",
        ),
        (
            "PUT",
            "/api/v1/embeddings/kept/upsert",
            Some(r#"{"embeddings":[{"id":1,"data":[0,1]}]}"#),
            "upsert embeddings",
        ),
        ("DELETE", "/api/v1/embeddings/kept/delete", Some(r#"{"ids":[1]}"#), "delete embeddings"),
        ("POST", "/api/v1/cluster/members", Some(r#"{"id":2,"address":"127.0.0.9:1"}"#), "add a member to the cluster"),
        ("DELETE", "/api/v1/cluster/members/2", None, "remove a member from the cluster"),
    ] {
        let r = as_reader(method, path, body);
        assert_eq!((r.status, r.code(), &r.body["message"]), (403, "READ_ONLY_API_KEY", &"Forbidden".into()), "{path}");
        let description = r.body["error"]["description"].as_str().unwrap();
        assert!(description.starts_with(&format!("the read-only API key may not {what}: ")), "{description}");
    }
    // Nothing was changed; the full key still writes; a wrong key is 401.
    let stats = server.call("GET", "/api/v1/indexes/kept/stats", None);
    assert_eq!(stats.body["data"]["count"], 2, "{stats:?}");
    let list = server.call("GET", "/api/v1/indexes/list", None);
    assert_eq!(list.body["data"], serde_json::json!({"indexes": ["kept"]}));
    let upsert = r#"{"embeddings":[{"id":1,"data":[0,1]}]}"#;
    assert_eq!(server.call("PUT", "/api/v1/embeddings/kept/upsert", Some(upsert)).status, 200);
    let r = server.connect().call_with("GET", "/api/v1/indexes/list", &[("X-Service-API-Key", "read-only-key")], None);
    assert_eq!((r.status, r.code()), (401, "INVALID_API_KEY"));
    assert!(server.log().contains("read-only API key read… (30 characters)"), "{}", server.log());

    // From the environment too; and never the key itself.
    let server = Server::start_raw(&["--api-key", KEY], &[("QUIVER_READ_ONLY_API_KEY", READ_ONLY_KEY)]);
    let r =
        server.connect().call_with("PUT", "/api/v1/indexes/abc/create", &[("X-Service-API-Key", READ_ONLY_KEY)], None);
    assert_eq!((r.status, r.code()), (403, "READ_ONLY_API_KEY"));
    let dir = tempfile::tempdir().unwrap();
    let said = start_fails(dir.path(), "0", &["--api-key", KEY, "--read-only-api-key", KEY]);
    assert!(said.contains("--read-only-api-key: it is the API key itself"), "{said}");
}

/// Each setting from a flag, the environment (`QUIVER_` and the flag's
/// name) or a TOML file (`--config`): the flag beats the environment,
/// which beats the file, which beats the default. `k-max` shows which won.
#[test]
fn settings_come_from_flags_then_the_environment_then_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quiver.toml");
    std::fs::write(&file, "k-max = 5\nmetrics_public = true\nlog-format = \"json\"\nreply-bytes-max = 70000\n")
        .unwrap();
    let file = file.to_str().unwrap();
    let k_max = |server: &Server| {
        create_index(server, "limits", 2, "l2");
        let r = server.call("POST", "/api/v1/embeddings/limits/search", Some(r#"{"queryVector":[1,1],"k":100000}"#));
        let detail = r.body["error"]["detail"].as_str().unwrap_or_default().to_owned();
        detail.rsplit(' ').next().unwrap().parse::<u64>().unwrap_or_else(|_| panic!("{r:?}"))
    };
    let from_file = Server::start_raw(&["--api-key", KEY, "--config", file], &[]);
    assert_eq!(k_max(&from_file), 5);
    assert_eq!(status_line(&from_file, "/metrics", &[]), "HTTP/1.1 200", "metrics-public from the file");
    let listening = from_file.log().lines().find(|l| l.contains("\"event\":\"listening\"")).map(str::to_owned);
    let listening: serde_json::Value = serde_json::from_str(&listening.expect("a JSON listening line")).unwrap();
    assert_eq!(listening["level"], "info");
    assert_eq!(listening["address"], from_file.addr.to_string());

    let env = [("QUIVER_K_MAX", "7"), ("QUIVER_LOG_FORMAT", "text")];
    let from_env = Server::start_raw(&["--api-key", KEY, "--config", file], &env);
    assert_eq!(k_max(&from_env), 7);
    assert!(from_env.log().contains("quiver: listening on "), "the environment's text format beats the file's");
    let from_flag = Server::start_raw(&["--api-key", KEY, "--config", file, "--k-max", "9"], &env);
    assert_eq!(k_max(&from_flag), 9);
    // With the file named by the environment.
    let named = Server::start_raw(&["--api-key", KEY], &[("QUIVER_CONFIG", file)]);
    assert_eq!(k_max(&named), 5);

    // A file that is wrong says where and how, and the server does not start.
    for (text, said) in [
        ("prot = 1\n", "'prot': no such setting (did you mean 'port'?)"),
        ("k-max = \"many\"\n", "invalid value 'many' for '--k-max <K_MAX>'"),
        ("metrics-public = \"yes\"\n", "'metrics-public': expected true or false"),
        ("k-max = [\n", "not TOML"),
    ] {
        std::fs::write(dir.path().join("bad.toml"), text).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["--port", "0", "--config"])
            .arg(dir.path().join("bad.toml"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains("--config ") && stderr.contains(said), "{text}: {stderr}");
    }
    assert!(!dir.path().join("data").exists(), "nothing was written");

    // `--help` names each flag's variable.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_quiver")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for variable in ["QUIVER_PORT", "QUIVER_DATA_DIR", "QUIVER_K_MAX", "QUIVER_READ_ONLY_API_KEY", "QUIVER_CONFIG"] {
        assert!(help.contains(&format!("[env: {variable}")), "{variable} in:\n{help}");
    }
}

/// The Grafana dashboard in `docs/` asks only for metrics the server
/// serves, and shows every one of them.
#[test]
fn the_grafana_dashboard_covers_the_metrics_the_server_serves() {
    let server = Server::start();
    create_index(&server, "watched", 2, "l2");
    let insert = r#"{"embeddings":[{"id":1,"data":[1,2]}]}"#;
    assert_eq!(server.call("PUT", "/api/v1/embeddings/watched/insert", Some(insert)).status, 200);
    let search = r#"{"queryVector":[1,1],"k":1}"#;
    assert_eq!(server.call("POST", "/api/v1/embeddings/watched/search", Some(search)).status, 200);
    let served = metrics_text(&server);
    let families: std::collections::BTreeSet<&str> =
        served.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    assert!(families.len() >= 15, "{families:?}");

    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut asked = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(at) = rest.find("quiver_") {
                let name: String = rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                rest = &rest[at + name.len()..];
                let family = name.strip_suffix("_bucket").unwrap_or(&name).to_owned();
                assert!(families.contains(family.as_str()), "the dashboard asks for {name}, which is not served");
                asked.insert(family);
            }
        }
    }
    let unshown: Vec<_> = families.iter().filter(|family| !asked.contains(**family)).collect();
    assert!(unshown.is_empty(), "served but not on the dashboard: {unshown:?}");
}
