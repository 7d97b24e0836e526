//! Malformed bodies: every one gets 400 INVALID_REQUEST_BODY with a precise
//! detail, and changes nothing.

use serde_json::json;

use crate::harness::{create_index, Server};

/// Bodies no endpoint accepts, whatever it expects.
const NOT_AN_OBJECT: &[(&str, &str)] = &[
    ("", "body: expected a JSON object, got an empty body"),
    ("   \n", "body: expected a JSON object, got an empty body"),
    ("[]", "body: expected a JSON object"),
    ("42", "body: expected a JSON object"),
    ("\"text\"", "body: expected a JSON object"),
    ("null", "body: expected a JSON object"),
];

/// Bodies that are not JSON, and how their detail starts.
const INVALID_JSON: &[(&str, &str)] = &[
    ("{", "body: invalid JSON"),
    ("{\"embeddings\":[}", "body: invalid JSON"),
    ("{\"a\":1,}", "body: invalid JSON"),
    ("{'single':'quotes'}", "body: invalid JSON"),
    ("{\"k\":NaN}", "body: NaN is not a JSON number (at byte 5)"),
    ("{\"k\":1} trailing", "body: unexpected text at byte 8, after the end of the JSON value"),
    ("\u{0}\u{1}\u{2}", "body: invalid JSON"),
    ("{\"k\":1e999}", "body: invalid JSON"),
    ("{\"ids\":[1,2", "body: invalid JSON"),
];

fn assert_bad(server: &Server, method: &str, path: &str, body: &str, detail: Option<&str>) {
    let r = server.call(method, path, Some(body));
    r.check_envelope();
    assert_eq!(
        (r.status, r.code(), r.message()),
        (400, "INVALID_REQUEST_BODY", "Bad request"),
        "{path} {body:?}: {r:?}"
    );
    assert_eq!(r.body["error"]["description"], "The body you provided in your request is invalid.");
    match detail {
        Some(detail) => assert_eq!(r.detail(), detail, "{path} {body:?}"),
        None => assert!(!r.detail().is_empty(), "{path} {body:?}"),
    }
}

#[test]
fn every_endpoint_refuses_what_is_not_a_json_object() {
    let server = Server::start();
    create_index(&server, "target", 2, "l2");
    let endpoints = [
        ("PUT", "/api/v1/indexes/other/create"),
        ("POST", "/api/v1/embeddings/target/search"),
        ("PUT", "/api/v1/embeddings/target/insert"),
        ("PUT", "/api/v1/embeddings/target/upsert"),
        ("POST", "/api/v1/embeddings/target/retrieve"),
        ("DELETE", "/api/v1/embeddings/target/delete"),
    ];
    for (method, path) in endpoints {
        for &(body, detail) in NOT_AN_OBJECT {
            assert_bad(&server, method, path, body, Some(detail));
        }
        for &(body, detail) in INVALID_JSON {
            let r = server.call(method, path, Some(body));
            assert_eq!((r.status, r.code()), (400, "INVALID_REQUEST_BODY"), "{path} {body:?}");
            assert!(r.detail().starts_with(detail), "{path} {body:?}: {}", r.detail());
        }
        // Bytes that are not UTF-8.
        let mut client = server.connect();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nX-Service-API-Key: {}\r\nContent-Length: 4\r\n\r\n",
            crate::harness::KEY
        )
        .into_bytes();
        request.extend_from_slice(b"\"\xff\xfe\"");
        client.send(&request);
        let r = client.read_response();
        assert_eq!((r.status, r.code()), (400, "INVALID_REQUEST_BODY"), "{path} non-UTF-8");
    }
    let r = server.call("GET", "/api/v1/indexes/list", None);
    assert_eq!(r.body["data"]["indexes"], json!(["target"]));
}

#[test]
fn embedding_bodies_name_the_bad_field_and_apply_nothing() {
    let server = Server::start();
    create_index(&server, "target", 2, "l2");
    let cases: &[(&str, &str)] = &[
        ("{}", "embeddings: required"),
        (r#"{"embedding":[]}"#, "embedding: unknown field (did you mean 'embeddings'?)"),
        (
            r#"{"embeddings":[{"id":1,"data":[1,2]},{"id":77,"data":[1,2],"meta":{"a":"b"}}]}"#,
            "embeddings[1].meta: unknown field (did you mean 'metadata'?)",
        ),
        (r#"{"embeddings":null}"#, "embeddings: expected an array of embedding objects"),
        (r#"{"embeddings":{"id":1}}"#, "embeddings: expected an array of embedding objects"),
        (r#"{"embeddings":[{"id":1,"data":[1,2]},7]}"#, "embeddings[1]: expected a JSON object"),
        (r#"{"embeddings":[{"id":1,"data":[1,2]},{"data":[1,2]}]}"#, "embeddings[1].id: required"),
        (r#"{"embeddings":[{"id":"1","data":[1,2]}]}"#, "embeddings[0].id: expected a 64-bit integer"),
        (r#"{"embeddings":[{"id":1.0,"data":[1,2]}]}"#, "embeddings[0].id: expected a 64-bit integer"),
        (r#"{"embeddings":[{"id":9223372036854775808,"data":[1,2]}]}"#, "embeddings[0].id: expected a 64-bit integer"),
        (r#"{"embeddings":[{"id":null,"data":[1,2]}]}"#, "embeddings[0].id: expected a 64-bit integer"),
        (r#"{"embeddings":[{"id":1}]}"#, "embeddings[0].data: required"),
        (r#"{"embeddings":[{"id":1,"data":null}]}"#, "embeddings[0].data: expected an array of numbers"),
        (r#"{"embeddings":[{"id":1,"data":{"0":1}}]}"#, "embeddings[0].data: expected an array of numbers"),
        (r#"{"embeddings":[{"id":1,"data":[1,"2"]}]}"#, "embeddings[0].data[1]: expected a number"),
        (r#"{"embeddings":[{"id":1,"data":[1,null]}]}"#, "embeddings[0].data[1]: expected a number"),
        (r#"{"embeddings":[{"id":1,"data":[true,1]}]}"#, "embeddings[0].data[0]: expected a number"),
        (r#"{"embeddings":[{"id":1,"data":[[1],2]}]}"#, "embeddings[0].data[0]: expected a number"),
        (r#"{"embeddings":[{"id":1,"data":[1,2],"metadata":"x"}]}"#, "embeddings[0].metadata: expected a JSON object"),
        (r#"{"embeddings":[{"id":1,"data":[1,2],"metadata":[]}]}"#, "embeddings[0].metadata: expected a JSON object"),
        (
            r#"{"embeddings":[{"id":1,"data":[1,2],"metadata":{"n":[1]}}]}"#,
            "embeddings[0].metadata.n[0]: expected a string",
        ),
        (
            r#"{"embeddings":[{"id":1,"data":[1,2],"metadata":{"a":"b","c":{"d":"e"}}}]}"#,
            "embeddings[0].metadata.c: expected a string, number, boolean or array of strings (objects do not nest)",
        ),
        (
            r#"{"embeddings":[{"id":1,"data":[1,2],"metadata":{"n":null}}]}"#,
            "embeddings[0].metadata.n: null is not a metadata value (leave the key out instead)",
        ),
    ];
    for endpoint in ["insert", "upsert"] {
        let path = format!("/api/v1/embeddings/target/{endpoint}");
        for &(body, detail) in cases {
            assert_bad(&server, "PUT", &path, body, Some(detail));
        }
    }
    let r = server.call("POST", "/api/v1/embeddings/target/retrieve", Some(r#"{"ids":[1]}"#));
    assert_eq!(
        r.message(),
        "0/1 embeddings successfully retrieved.",
        "a refused body applies nothing, not even its valid items"
    );
}

#[test]
fn id_list_and_search_bodies() {
    let server = Server::start();
    create_index(&server, "target", 2, "l2");
    server.call("PUT", "/api/v1/embeddings/target/insert", Some(r#"{"embeddings":[{"id":1,"data":[1,2]}]}"#));
    let ids_cases: &[(&str, &str)] = &[
        ("{}", "ids: required"),
        (r#"{"ids":1}"#, "ids: expected an array of integers"),
        (r#"{"ids":"1"}"#, "ids: expected an array of integers"),
        (r#"{"ids":[1,"2"]}"#, "ids[1]: expected a 64-bit integer"),
        (r#"{"ids":[1,2.5]}"#, "ids[1]: expected a 64-bit integer"),
        (r#"{"ids":[18446744073709551615]}"#, "ids[0]: expected a 64-bit integer"),
        (r#"{"ids":[[1]]}"#, "ids[0]: expected a 64-bit integer"),
    ];
    for &(body, detail) in ids_cases {
        assert_bad(&server, "POST", "/api/v1/embeddings/target/retrieve", body, Some(detail));
        // A delete takes a filter instead, and says so when it has neither.
        let neither = "body: expected ids (an array of 64-bit integers) or filter (a filter object); neither was given";
        let detail = if body == "{}" { neither } else { detail };
        assert_bad(&server, "DELETE", "/api/v1/embeddings/target/delete", body, Some(detail));
    }
    // A refused delete deleted nothing.
    let r = server.call("POST", "/api/v1/embeddings/target/retrieve", Some(r#"{"ids":[1]}"#));
    assert_eq!(r.status, 200);

    let search_cases: &[(&str, &str)] = &[
        (r#"{"k":1}"#, "queryVector: required"),
        (r#"{"queryVector":[1,2]}"#, "k: required"),
        (r#"{"queryVector":"1,2","k":1}"#, "queryVector: expected an array of numbers"),
        (r#"{"queryVector":[1,"2"],"k":1}"#, "queryVector[1]: expected a number"),
        (r#"{"queryVector":[1,2],"k":"1"}"#, "k: expected an integer from 1 to 10000"),
        (r#"{"queryVector":[1,2],"k":1.5}"#, "k: expected an integer from 1 to 10000"),
        (r#"{"queryVector":[1,2],"k":null}"#, "k: expected an integer from 1 to 10000"),
    ];
    for &(body, detail) in search_cases {
        assert_bad(&server, "POST", "/api/v1/embeddings/target/search", body, Some(detail));
    }
    // Beyond 64 bits the JSON parser itself refuses the number.
    assert_bad(
        &server,
        "POST",
        "/api/v1/embeddings/target/search",
        r#"{"queryVector":[1,2],"k":99999999999999999999}"#,
        None,
    );
}
