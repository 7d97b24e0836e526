//! Every row of docs/reference.md: statuses, codes and message forms of each endpoint.

use serde_json::json;

use crate::harness::{create_index, Server, KEY};

#[test]
fn index_lifecycle() {
    let server = Server::start();
    let r = server.call("PUT", "/api/v1/indexes/docs-1/create", Some(r#"{"dimensions":3,"metric":"cosine"}"#));
    r.check_envelope();
    assert_eq!((r.status, r.message()), (200, "Index 'docs-1' created successfully."));
    assert!(r.body.get("error").is_none());

    let r = server.call("GET", "/api/v1/indexes/docs-1/stats", None);
    r.check_envelope();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["data"]["index_name"], "docs-1");
    assert_eq!(r.body["data"]["dimensions"], 3);
    assert_eq!(r.body["data"]["metric"], "cosine");

    create_index(&server, "b-index", 2, "l2");
    create_index(&server, "a-index", 2, "ip");
    let r = server.call("GET", "/api/v1/indexes/list", None);
    r.check_envelope();
    assert_eq!(r.body["data"]["indexes"], json!(["a-index", "b-index", "docs-1"]));

    let r = server.call("DELETE", "/api/v1/indexes/docs-1/delete", None);
    r.check_envelope();
    assert_eq!((r.status, r.message()), (200, "Index 'docs-1' successfully deleted."));
    let r = server.call("GET", "/api/v1/indexes/list", None);
    assert_eq!(r.body["data"]["indexes"], json!(["a-index", "b-index"]));
    let r = server.call("GET", "/api/v1/indexes/docs-1/stats", None);
    assert_eq!((r.status, r.code()), (500, "INDEX_NOT_FETCHED"));
}

#[test]
fn create_refusals() {
    let server = Server::start();
    create_index(&server, "taken", 4, "l2");
    let create = |name: &str, body: &str| server.call("PUT", &format!("/api/v1/indexes/{name}/create"), Some(body));

    let r = create("taken", r#"{"dimensions":8,"metric":"ip"}"#);
    r.check_envelope();
    assert_eq!((r.status, r.code()), (500, "INDEX_NOT_CREATED"));
    assert_eq!(r.message(), "An error occurred while creating the index.");
    assert_eq!(r.body["error"]["description"], "index 'taken' already exists");
    let stats = server.call("GET", "/api/v1/indexes/taken/stats", None);
    assert_eq!(
        (stats.body["data"]["dimensions"].as_u64(), stats.body["data"]["metric"].as_str()),
        (Some(4), Some("l2"))
    );

    for bad_name in ["ab", "UPPER", "under_score", "a.b", "0123456789abcdefghij0123456789abc", "%C3%A4bc"] {
        let r = create(bad_name, r#"{"dimensions":3,"metric":"l2"}"#);
        r.check_envelope();
        assert_eq!((r.status, r.code()), (500, "INDEX_NOT_CREATED"), "{bad_name}");
        assert!(r.body["error"]["description"].as_str().unwrap().contains("3 to 32 characters"), "{r:?}");
    }

    let r = create("metric", r#"{"dimensions":3,"metric":"hamming"}"#);
    r.check_envelope();
    assert_eq!((r.status, r.code()), (500, "INVALID_SIMILARITY_METRIC"));
    let description = r.body["error"]["description"].as_str().unwrap();
    assert!(description.contains("cosine") && description.contains("l2") && description.contains("ip"), "{r:?}");

    for (body, detail) in [
        (r#"{"metric":"l2"}"#, "dimensions: required"),
        (r#"{"dimensions":0,"metric":"l2"}"#, "dimensions: expected an integer from 1 to 65536"),
        (r#"{"dimensions":65537,"metric":"l2"}"#, "dimensions: expected an integer from 1 to 65536"),
        (r#"{"dimensions":3.5,"metric":"l2"}"#, "dimensions: expected an integer from 1 to 65536"),
        (r#"{"dimensions":"3","metric":"l2"}"#, "dimensions: expected an integer from 1 to 65536"),
        (r#"{"dimensions":3}"#, "metric: required"),
        (r#"{"dimensions":3,"metric":null}"#, "metric: expected a string"),
    ] {
        let r = create("fresh", body);
        r.check_envelope();
        assert_eq!((r.status, r.code(), r.message(), r.detail()), (400, "INVALID_REQUEST_BODY", "Bad request", detail));
        assert_eq!(r.body["error"]["description"], "The body you provided in your request is invalid.");
    }
    let r = server.call("GET", "/api/v1/indexes/list", None);
    assert_eq!(r.body["data"]["indexes"], json!(["taken"]), "nothing of a refused create is applied");
}

#[test]
fn dimensions_limit_is_a_flag() {
    let server = Server::start_with(&["--dimensions-max", "16"]);
    let r = server.call("PUT", "/api/v1/indexes/big/create", Some(r#"{"dimensions":17,"metric":"l2"}"#));
    assert_eq!((r.status, r.detail()), (400, "dimensions: expected an integer from 1 to 16"));
    create_index(&server, "big", 16, "l2");
}

#[test]
fn unknown_index_on_every_endpoint() {
    let server = Server::start();
    let cases = [
        ("GET", "/api/v1/indexes/nope/stats", None, "INDEX_NOT_FETCHED", "An error occurred while fetching the index."),
        (
            "DELETE",
            "/api/v1/indexes/nope/delete",
            None,
            "INDEX_NOT_DELETED",
            "An error occurred while deleting the index.",
        ),
        ("POST", "/api/v1/embeddings/nope/search", Some(r#"{"queryVector":[1],"k":1}"#), "INDEX_NOT_FETCHED", ""),
        ("PUT", "/api/v1/embeddings/nope/insert", Some(r#"{"embeddings":[]}"#), "INDEX_NOT_FETCHED", ""),
        ("PUT", "/api/v1/embeddings/nope/upsert", Some(r#"{"embeddings":[]}"#), "INDEX_NOT_FETCHED", ""),
        ("POST", "/api/v1/embeddings/nope/retrieve", Some(r#"{"ids":[1]}"#), "INDEX_NOT_FETCHED", ""),
        ("DELETE", "/api/v1/embeddings/nope/delete", Some(r#"{"ids":[1]}"#), "INDEX_NOT_FETCHED", ""),
        // An invalid name is an index that does not exist.
        ("GET", "/api/v1/indexes/NOPE_/stats", None, "INDEX_NOT_FETCHED", ""),
    ];
    for (method, path, body, code, message) in cases {
        let r = server.call(method, path, body);
        r.check_envelope();
        assert_eq!((r.status, r.code()), (500, code), "{method} {path}");
        if !message.is_empty() {
            assert_eq!(r.message(), message);
        }
        let name = path.split('/').nth(4).unwrap();
        assert_eq!(r.body["error"]["description"], format!("index '{name}' does not exist"));
    }
}

#[test]
fn insert_upsert_and_partial_failures() {
    let server = Server::start();
    create_index(&server, "vecs", 2, "cosine");
    let insert = |body: &str| server.call("PUT", "/api/v1/embeddings/vecs/insert", Some(body));
    let upsert = |body: &str| server.call("PUT", "/api/v1/embeddings/vecs/upsert", Some(body));

    let r = insert(r#"{"embeddings":[{"id":1,"data":[1,0],"metadata":{"k":"v"}},{"id":2,"data":[0,1]}]}"#);
    r.check_envelope();
    assert_eq!((r.status, r.message()), (200, "2/2 embeddings successfully inserted."));
    assert!(r.body.get("data").is_none());

    let r = insert(
        r#"{"embeddings":[
        {"id":1,"data":[1,1]},
        {"id":3,"data":[1,2,3]},
        {"id":4,"data":[0,0]},
        {"id":5,"data":[1e39,1]},
        {"id":6,"data":[2,2]},
        {"id":6,"data":[3,3]},
        {"id":7,"data":[0.5,0.5]}]}"#,
    );
    r.check_envelope();
    assert_eq!((r.status, r.code()), (500, "EMBEDDINGS_SKIPPED"));
    assert_eq!(r.message(), "2/7 embeddings successfully inserted.");
    let description: Vec<&str> =
        r.body["error"]["description"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert_eq!(
        description,
        [
            "embedding with ID 1 was not inserted - embedding with ID 1 already exists",
            "embedding with ID 3 was not inserted - expected 2 dimensions, got 3",
            "embedding with ID 4 was not inserted - an all-zero vector has no direction in a cosine index",
            "embedding with ID 5 was not inserted - value at position 0 is not a finite 32-bit float",
            "embedding with ID 6 was not inserted - embedding with ID 6 appears more than once in this request",
        ]
    );
    // The applied items are stored; the skipped ones are not.
    let r = server.call("POST", "/api/v1/embeddings/vecs/retrieve", Some(r#"{"ids":[1,6,7,3,4,5]}"#));
    assert_eq!(r.message(), "3/6 embeddings successfully retrieved.");
    let got = &r.body["data"]["embeddings"];
    assert_eq!(got[0], json!({"id":1,"data":[1.0,0.0],"metadata":{"k":"v"}}), "existing item untouched by insert");
    assert_eq!(got[1], json!({"id":6,"data":[2.0,2.0],"metadata":{}}), "the first of a repeated id is inserted");
    assert_eq!(got[2]["id"], 7);

    let r = upsert(
        r#"{"embeddings":[{"id":1,"data":[0,2],"metadata":{"a":"b"}},{"id":9,"data":[1,1]},{"id":9,"data":[3,4]}]}"#,
    );
    assert_eq!((r.status, r.message()), (200, "3/3 embeddings successfully upserted."));
    let r = upsert(r#"{"embeddings":[{"id":10,"data":[1]},{"id":11,"data":[1,1]}]}"#);
    r.check_envelope();
    assert_eq!((r.status, r.code(), r.message()), (500, "EMBEDDINGS_SKIPPED", "1/2 embeddings successfully upserted."));
    assert_eq!(
        r.body["error"]["description"],
        json!(["embedding with ID 10 was not upserted - expected 2 dimensions, got 1"])
    );
    let r = server.call("POST", "/api/v1/embeddings/vecs/retrieve", Some(r#"{"ids":[9,1,11]}"#));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body["data"]["embeddings"],
        json!([
            {"id":9,"data":[3.0,4.0],"metadata":{}},
            {"id":1,"data":[0.0,2.0],"metadata":{"a":"b"}},
            {"id":11,"data":[1.0,1.0],"metadata":{}}
        ]),
        "upsert replaces, the last of a repeated id wins, retrieve keeps the requested order"
    );

    for (endpoint, verb) in [("insert", "inserted"), ("upsert", "upserted")] {
        let r = server.call("PUT", &format!("/api/v1/embeddings/vecs/{endpoint}"), Some(r#"{"embeddings":[]}"#));
        assert_eq!((r.status, r.message().to_owned()), (200, format!("0/0 embeddings successfully {verb}.")));
    }
}

#[test]
fn retrieve_and_delete_embeddings() {
    let server = Server::start();
    create_index(&server, "vecs", 1, "l2");
    server.call(
        "PUT",
        "/api/v1/embeddings/vecs/insert",
        Some(r#"{"embeddings":[{"id":1,"data":[1]},{"id":2,"data":[2]},{"id":3,"data":[3]}]}"#),
    );

    let r = server.call("POST", "/api/v1/embeddings/vecs/retrieve", Some(r#"{"ids":[3,1]}"#));
    r.check_envelope();
    assert_eq!((r.status, r.message()), (200, "2/2 embeddings successfully retrieved."));
    let r = server.call("POST", "/api/v1/embeddings/vecs/retrieve", Some(r#"{"ids":[8,2,-4]}"#));
    r.check_envelope();
    assert_eq!(
        (r.status, r.code(), r.message()),
        (500, "EMBEDDINGS_SKIPPED", "1/3 embeddings successfully retrieved.")
    );
    assert_eq!(r.body["data"]["embeddings"], json!([{"id":2,"data":[2.0],"metadata":{}}]));
    assert_eq!(
        r.body["error"]["description"],
        json!([
            "embedding with ID 8 was not retrieved - embedding with ID 8 does not exist",
            "embedding with ID -4 was not retrieved - embedding with ID -4 does not exist"
        ])
    );

    let r = server.call("DELETE", "/api/v1/embeddings/vecs/delete", Some(r#"{"ids":[1,7]}"#));
    r.check_envelope();
    assert_eq!((r.status, r.code(), r.message()), (500, "EMBEDDINGS_SKIPPED", "1/2 embeddings successfully deleted."));
    assert_eq!(
        r.body["error"]["description"],
        json!(["embedding with ID 7 was not deleted - embedding with ID 7 does not exist"])
    );
    let r = server.call("DELETE", "/api/v1/embeddings/vecs/delete", Some(r#"{"ids":[2,3]}"#));
    assert_eq!((r.status, r.message()), (200, "2/2 embeddings successfully deleted."));
    let r = server.call("POST", "/api/v1/embeddings/vecs/retrieve", Some(r#"{"ids":[1,2,3]}"#));
    assert_eq!(r.message(), "0/3 embeddings successfully retrieved.");
    let r = server.call("DELETE", "/api/v1/embeddings/vecs/delete", Some(r#"{"ids":[]}"#));
    assert_eq!((r.status, r.message()), (200, "0/0 embeddings successfully deleted."));
    let r = server.call("POST", "/api/v1/embeddings/vecs/retrieve", Some(r#"{"ids":[]}"#));
    assert_eq!((r.status, r.message()), (200, "0/0 embeddings successfully retrieved."));
    assert_eq!(r.body["data"]["embeddings"], json!([]));
}

#[test]
fn search_answers_and_refusals() {
    let server = Server::start();
    create_index(&server, "cos", 2, "cosine");
    let search = |body: &str| server.call("POST", "/api/v1/embeddings/cos/search", Some(body));

    let r = search(r#"{"queryVector":[1,0],"k":3}"#);
    r.check_envelope();
    assert_eq!(r.status, 200);
    assert_eq!(r.body["data"]["nearest_neighbors"], json!({}), "an empty index has no neighbours");

    server.call(
        "PUT",
        "/api/v1/embeddings/cos/insert",
        Some(r#"{"embeddings":[{"id":1,"data":[1,0],"metadata":{"n":"one"}},{"id":2,"data":[1,1]},{"id":3,"data":[0,1]}]}"#),
    );
    let r = search(r#"{"queryVector":[2,0.1],"k":2}"#);
    assert_eq!(r.message(), "Similarity search performed successfully.");
    assert_eq!(
        r.body["data"]["nearest_neighbors"],
        json!({"1":{"metadata":{"n":"one"},"rank":0},"2":{"metadata":{},"rank":1}})
    );

    for (body, why) in [
        (r#"{"queryVector":[1,0,0],"k":1}"#, "queryVector: expected 2 dimensions, got 3"),
        (r#"{"queryVector":[0,0],"k":1}"#, "queryVector: an all-zero vector has no direction in a cosine index"),
        (r#"{"queryVector":[1e39,0],"k":1}"#, "queryVector: value at position 0 is not a finite 32-bit float"),
    ] {
        let r = search(body);
        r.check_envelope();
        assert_eq!((r.status, r.code()), (400, "SIMILARITY_SEARCH_ERROR"), "{body}");
        assert_eq!(r.message(), "An error occurred during the similarity search.");
        assert_eq!(r.body["error"]["description"], why);
        assert!(r.body.get("data").is_none());
    }
    for body in
        [r#"{"queryVector":[1,0],"k":0}"#, r#"{"queryVector":[1,0],"k":10001}"#, r#"{"queryVector":[1,0],"k":-1}"#]
    {
        let r = search(body);
        assert_eq!(
            (r.status, r.code(), r.detail()),
            (400, "INVALID_REQUEST_BODY", "k: expected an integer from 1 to 10000")
        );
    }
}

#[test]
fn k_limit_is_a_flag() {
    let server = Server::start_with(&["--k-max", "5"]);
    create_index(&server, "small", 1, "l2");
    let r = server.call("POST", "/api/v1/embeddings/small/search", Some(r#"{"queryVector":[1],"k":6}"#));
    assert_eq!((r.status, r.detail()), (400, "k: expected an integer from 1 to 5"));
    let r = server.call("POST", "/api/v1/embeddings/small/search", Some(r#"{"queryVector":[1],"k":5}"#));
    assert_eq!(r.status, 200);
}

#[test]
fn retrieve_gives_back_the_exact_bits() {
    let server = Server::start();
    create_index(&server, "bits", 8, "cosine");
    // Awkward values: near the numeric domain's largest norm, a subnormal,
    // thirds, integers past 2^24, negative zero.
    let values: [f32; 8] =
        [0.1, -4.0e18, f32::from_bits(1), f32::MIN_POSITIVE, 1.0 / 3.0, 16_777_216.0 + 2.0, -0.0, 2.5e-7];
    let text: Vec<String> = values.iter().map(|v| format!("{v:e}")).collect();
    let body = format!(r#"{{"embeddings":[{{"id":1,"data":[{}]}}]}}"#, text.join(","));
    assert_eq!(server.call("PUT", "/api/v1/embeddings/bits/insert", Some(&body)).status, 200);
    let r = server.call("POST", "/api/v1/embeddings/bits/retrieve", Some(r#"{"ids":[1]}"#));
    let got: Vec<f32> = r.body["data"]["embeddings"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&values));
}

#[test]
fn metadata_round_trips_with_escapes() {
    let server = Server::start();
    create_index(&server, "meta", 1, "ip");
    let body = r#"{"embeddings":[{"id":1,"data":[1],"metadata":{"quote\"key":"line\nbreak","uni":"é😀","dup":"a","dup":"b"}},{"id":2,"data":[2],"metadata":null}]}"#;
    assert_eq!(server.call("PUT", "/api/v1/embeddings/meta/insert", Some(body)).status, 200);
    let r = server.call("POST", "/api/v1/embeddings/meta/retrieve", Some(r#"{"ids":[1,2]}"#));
    assert_eq!(r.body["data"]["embeddings"][0]["metadata"], json!({"quote\"key":"line\nbreak","uni":"é😀","dup":"b"}));
    assert_eq!(r.body["data"]["embeddings"][1]["metadata"], json!({}));
}

#[test]
fn authentication_on_every_endpoint_but_health() {
    let server = Server::start();
    create_index(&server, "guarded", 1, "l2");
    let endpoints = [
        ("GET", "/api/v1/indexes/list", None),
        ("PUT", "/api/v1/indexes/other/create", Some(r#"{"dimensions":1,"metric":"l2"}"#)),
        ("GET", "/api/v1/indexes/guarded/stats", None),
        ("DELETE", "/api/v1/indexes/guarded/delete", None),
        ("POST", "/api/v1/embeddings/guarded/search", Some(r#"{"queryVector":[1],"k":1}"#)),
        ("PUT", "/api/v1/embeddings/guarded/insert", Some(r#"{"embeddings":[{"id":1,"data":[1]}]}"#)),
        ("PUT", "/api/v1/embeddings/guarded/upsert", Some(r#"{"embeddings":[{"id":1,"data":[1]}]}"#)),
        ("POST", "/api/v1/embeddings/guarded/retrieve", Some(r#"{"ids":[1]}"#)),
        ("DELETE", "/api/v1/embeddings/guarded/delete", Some(r#"{"ids":[1]}"#)),
    ];
    for (method, path, body) in endpoints {
        for (headers, code, message) in [
            (vec![], "NO_API_KEY_PROVIDED", "No API key provided."),
            (vec![("X-Service-API-Key", "")], "NO_API_KEY_PROVIDED", "No API key provided."),
            (vec![("X-Service-API-Key", "wrong")], "INVALID_API_KEY", "Invalid API key."),
            (vec![("x-service-api-key", "test-key-012345678")], "INVALID_API_KEY", "Invalid API key."),
        ] {
            let r = server.connect().call_with(method, path, &headers, body);
            r.check_envelope();
            assert_eq!((r.status, r.code(), r.message()), (401, code, message), "{method} {path} {headers:?}");
        }
        // Auth comes before the body is looked at: a malformed body still gets 401.
        let r = server.connect().call_with(method, path, &[("X-Service-API-Key", "wrong")], Some("{not json"));
        assert_eq!(r.status, 401);
    }
    // Nothing a refused request sent was applied.
    let r = server.call("GET", "/api/v1/indexes/list", None);
    assert_eq!(r.body["data"]["indexes"], json!(["guarded"]));
    let r = server.call("POST", "/api/v1/embeddings/guarded/retrieve", Some(r#"{"ids":[1]}"#));
    assert_eq!(r.message(), "0/1 embeddings successfully retrieved.");
    // Header names are case-insensitive.
    let r = server.connect().call_with("GET", "/api/v1/indexes/list", &[("x-SERVICE-api-KEY", KEY)], None);
    assert_eq!(r.status, 200);
    // Health needs no key, and ignores a wrong one.
    let r = server.connect().call_with("GET", "/api/v1/health", &[("X-Service-API-Key", "wrong")], None);
    assert_eq!(r.status, 200);
}

#[test]
fn health_reports_figures_without_a_key() {
    let server = Server::start();
    let r = server.connect().call_with("GET", "/api/v1/health", &[], None);
    r.check_envelope();
    assert_eq!((r.status, r.message()), (200, "healthy"));
    let data = &r.body["data"];
    assert!(data["cpu_usage_percent"].as_f64().unwrap() >= 0.0);
    let memory = data["mem_usage_percent"].as_f64().unwrap();
    assert!(memory > 0.0 && memory < 100.0, "{memory}");
    let uptime = data["uptime"].as_str().unwrap();
    let valid = uptime.ends_with("ms") || uptime.ends_with("µs") || uptime.ends_with('s');
    assert!(valid && uptime.chars().next().unwrap().is_ascii_digit(), "{uptime}");
}

#[test]
fn unknown_paths_and_wrong_methods() {
    let server = Server::start();
    for path in ["/", "/api/v1", "/api/v2/health", "/api/v1/indexes/x/rename", "/api/v1/health/extra"] {
        let r = server.call("GET", path, None);
        r.check_envelope();
        assert_eq!((r.status, r.code()), (404, "NOT_FOUND"), "{path}");
    }
    for (method, path, allow) in [
        ("POST", "/api/v1/health", "GET"),
        ("GET", "/api/v1/indexes/x/create", "PUT"),
        ("PUT", "/api/v1/embeddings/x/search", "POST"),
        ("GET", "/api/v1/embeddings/x/delete", "DELETE"),
        ("PATCH", "/api/v1/indexes/list", "GET"),
    ] {
        let r = server.call(method, path, None);
        r.check_envelope();
        assert_eq!(
            (r.status, r.code(), r.header("allow")),
            (405, "METHOD_NOT_ALLOWED", Some(allow)),
            "{method} {path}"
        );
    }
    // The query string is not part of the route.
    assert_eq!(server.call("GET", "/api/v1/indexes/list?verbose=1", None).status, 200);
}
