//! `search-batch`: many searches in one request, each answered exactly as
//! it would be alone, in request order; any bad search fails the whole
//! request, naming it.

use serde_json::{json, Value};

use crate::harness::{create_index, Client, Rng, Server};

const DIMS: usize = 37;

fn vector(rng: &mut Rng) -> Vec<f32> {
    (0..DIMS).map(|_| rng.float() * 2.0 - 1.0).collect()
}

/// A server with an index of each metric holding the same 600 rows (some
/// repeated, so that ties must break alike).
fn server_with_rows(rng: &mut Rng, extra: &[&str]) -> (Server, Client) {
    let server = Server::start_with(extra);
    let mut client = server.connect();
    let rows: Vec<Value> = (0..600)
        .map(|id| {
            let data = if id % 7 == 0 { vec![0.25; DIMS] } else { vector(rng) };
            json!({"id": id, "data": data, "metadata": {"n": id.to_string()}})
        })
        .collect();
    for metric in ["cosine", "l2", "ip"] {
        create_index(&server, &format!("by-{metric}"), DIMS, metric);
        let body = json!({ "embeddings": rows }).to_string();
        let r = client.call("PUT", &format!("/api/v1/embeddings/by-{metric}/insert"), Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
    }
    (server, client)
}

#[test]
fn every_search_of_a_batch_is_answered_as_it_is_alone() {
    let mut rng = Rng(41);
    let (_server, mut client) = server_with_rows(&mut rng, &[]);
    let includes = [json!(null), json!(["score"]), json!(["data", "score"])];
    for metric in ["cosine", "l2", "ip"] {
        let searches: Vec<Value> = (0..40)
            .map(|n| {
                let query = if n % 5 == 0 { vec![0.25; DIMS] } else { vector(&mut rng) };
                let (k, include) = ([1, 3, 10, 700][n % 4], &includes[n % 3]);
                json!({"queryVector": query, "k": k, "include": include})
            })
            .collect();
        let body = json!({ "searches": searches }).to_string();
        let r = client.call("POST", &format!("/api/v1/embeddings/by-{metric}/search-batch"), Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.message(), "40 similarity searches performed successfully.");
        let results = r.body["data"]["results"].as_array().unwrap();
        assert_eq!(results.len(), searches.len());
        for (n, (search, result)) in searches.iter().zip(results).enumerate() {
            let alone =
                client.call("POST", &format!("/api/v1/embeddings/by-{metric}/search"), Some(&search.to_string()));
            assert_eq!(alone.status, 200);
            assert_eq!(result, &alone.body["data"], "{metric} search {n}");
        }
        let one = json!({ "searches": [searches[0]] }).to_string();
        let r = client.call("POST", &format!("/api/v1/embeddings/by-{metric}/search-batch"), Some(&one));
        assert_eq!(r.message(), "1 similarity search performed successfully.");
    }
}

#[test]
fn a_bad_search_fails_the_whole_batch_naming_it() {
    let mut rng = Rng(42);
    let (_server, mut client) = server_with_rows(&mut rng, &["--search-batch-max", "4"]);
    let good = json!({"queryVector": vector(&mut rng), "k": 2});
    let mut batch = |searches: Value| {
        let body = json!({ "searches": searches }).to_string();
        client.call("POST", "/api/v1/embeddings/by-cosine/search-batch", Some(&body))
    };
    let cases = [
        (
            json!([good, {"queryVector": [1.0], "k": 2}]),
            400,
            "SIMILARITY_SEARCH_ERROR",
            "searches[1].queryVector: expected 37 dimensions, got 1",
        ),
        (
            json!([good, good, {"queryVector": vector(&mut rng), "k": 0}]),
            400,
            "INVALID_REQUEST_BODY",
            "searches[2].k: expected an integer from 1 to 10000",
        ),
        (json!([good, {"k": 2}]), 400, "INVALID_REQUEST_BODY", "searches[1].queryVector: required"),
        (
            json!([good, {"queryVector": vector(&mut rng), "k": 1, "include": ["rank"]}]),
            400,
            "INVALID_REQUEST_BODY",
            "searches[1].include[0]: unknown value 'rank'",
        ),
        (json!([good, 7]), 400, "INVALID_REQUEST_BODY", "searches[1]: expected a JSON object"),
        (json!([]), 400, "INVALID_REQUEST_BODY", "searches: expected 1 to 4 searches"),
        (json!([good, good, good, good, good]), 400, "INVALID_REQUEST_BODY", "searches: expected 1 to 4 searches"),
        (json!({"queryVector": [1.0]}), 400, "INVALID_REQUEST_BODY", "searches: expected an array"),
    ];
    for (searches, status, code, detail) in cases {
        let r = batch(searches.clone());
        assert_eq!((r.status, r.code()), (status, code), "{searches}: {r:?}");
        let said = format!("{} {}", r.detail(), r.body["error"]["description"]);
        assert!(said.contains(detail), "{searches}: {said}");
        assert!(r.body.get("data").is_none(), "a 400 carries no data: {r:?}");
    }
    let r = client.call("POST", "/api/v1/embeddings/by-cosine/search-batch", Some(r#"{"searchez":[]}"#));
    assert_eq!(r.detail(), "searchez: unknown field (did you mean 'searches'?)");
    let r = client.call("POST", "/api/v1/embeddings/by-cosine/search-batch", Some("{}"));
    assert_eq!(r.detail(), "searches: required");
    let body = json!({ "searches": [good] }).to_string();
    let r = client.call("POST", "/api/v1/embeddings/none-such/search-batch", Some(&body));
    let alone = client.call("POST", "/api/v1/embeddings/none-such/search", Some(&good.to_string()));
    assert_eq!((r.status, r.code()), (alone.status, alone.code()), "{r:?}");
    let r = client.call("GET", "/api/v1/embeddings/by-cosine/search-batch", None);
    assert_eq!(r.status, 405);
}
