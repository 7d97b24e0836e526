//! The six metrics beyond the interface's three: what `create` takes, what
//! stats shows, `p` kept through kill -9 and snapshots, js's refusal of
//! negative values, and bc's infinite distance.

use serde_json::{json, Value};

use crate::harness::{Rng, Server, KEY};
use crate::search_oracle::{vector_for, Metric};

const DIMS: usize = 6;

fn create(server: &Server, name: &str, body: Value) -> crate::harness::Response {
    server.call("PUT", &format!("/api/v1/indexes/{name}/create"), Some(&body.to_string()))
}

#[test]
fn lp_needs_a_positive_finite_p_and_stats_show_it() {
    let server = Server::start();
    for p in [json!(null), json!(0), json!(-1.5), json!("2"), json!(1e39), json!(1e-50), json!([2])] {
        let r = create(&server, "minkowski", json!({"dimensions": 3, "metric": "lp", "p": p}));
        assert_eq!((r.status, r.code()), (400, "INVALID_REQUEST_BODY"), "p = {p}: {r:?}");
        assert!(r.detail().contains("p: the lp metric needs a number above 0 and finite"), "{r:?}");
    }
    let r = create(&server, "minkowski", json!({"dimensions": 3, "metric": "lp"}));
    assert_eq!(r.status, 400, "no p: {r:?}");
    assert_eq!(server.call("GET", "/api/v1/indexes/list", None).body["data"]["indexes"], json!([]), "nothing created");

    let r = create(&server, "nope", json!({"dimensions": 3, "metric": "hamming"}));
    assert_eq!((r.status, r.code()), (500, "INVALID_SIMILARITY_METRIC"), "{r:?}");
    assert!(
        r.body["error"]["description"].as_str().unwrap().contains("cosine, l2, ip, l1, linf, lp, canberra, bc, js"),
        "{r:?}"
    );

    assert_eq!(create(&server, "minkowski", json!({"dimensions": 3, "metric": "lp", "p": 2.5})).status, 200);
    // p beside any other metric is not read.
    assert_eq!(create(&server, "manhattan", json!({"dimensions": 3, "metric": "l1", "p": "x"})).status, 200);
    let stats = server.call("GET", "/api/v1/indexes/minkowski/stats", None);
    assert_eq!(
        stats.body["data"],
        json!({"index_name": "minkowski", "dimensions": 3, "metric": "lp", "p": 2.5, "count": 0})
    );
    let stats = server.call("GET", "/api/v1/indexes/manhattan/stats", None);
    assert_eq!(stats.body["data"], json!({"index_name": "manhattan", "dimensions": 3, "metric": "l1", "count": 0}));
}

/// The answers of a fixed set of searches, scores included.
fn answers(server: &Server, metric: Metric, index: &str) -> Vec<Value> {
    let mut rng = Rng(77);
    let mut client = server.connect();
    (0..5)
        .map(|_| {
            let body = json!({"queryVector": vector_for(metric, &mut rng, DIMS), "k": 7, "include": ["score"]});
            let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(&body.to_string()));
            assert_eq!(r.status, 200, "{r:?}");
            r.body["data"].clone()
        })
        .collect()
}

/// Every metric (lp with its p) comes back from the log after kill -9 and
/// from a snapshot after a clean stop: the same stats, the same answers.
#[test]
fn every_metric_and_its_p_survive_kill_and_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let start = || Server::start_in(None, data_dir.clone(), &["--api-key", KEY], &[]);
    let server = start();
    let mut rng = Rng(3);
    for metric in Metric::ALL {
        let index = metric.label();
        metric.create(&server, &index, DIMS);
        let embeddings: Vec<Value> =
            (0..40).map(|id| json!({"id": id, "data": vector_for(metric, &mut rng, DIMS), "metadata": {}})).collect();
        let body = json!({ "embeddings": embeddings }).to_string();
        assert_eq!(server.call("PUT", &format!("/api/v1/embeddings/{index}/insert"), Some(&body)).status, 200);
    }
    let state = |server: &Server| -> Vec<(Value, Vec<Value>)> {
        Metric::ALL
            .into_iter()
            .map(|metric| {
                let stats = server.call("GET", &format!("/api/v1/indexes/{}/stats", metric.label()), None);
                assert_eq!(stats.body["data"]["metric"], metric.name());
                (stats.body["data"].clone(), answers(server, metric, &metric.label()))
            })
            .collect()
    };
    let before = state(&server);
    assert_eq!(before[5].0["p"], 3.0);
    assert_eq!(before[6].0["p"], 0.7);
    assert_eq!(before[7].0["p"], 2.5);
    server.kill();
    let server = start();
    assert_eq!(state(&server), before, "replayed from the log");
    assert_eq!(server.terminate().code(), Some(0));
    let server = start();
    assert!(server.log().contains("replayed 0 log records"), "{}", server.log());
    assert_eq!(state(&server), before, "loaded from snapshots");
}

#[test]
fn js_skips_rows_with_negative_values_and_refuses_such_queries() {
    let server = Server::start();
    Metric::Js.create(&server, "jensen", 3);
    let body = json!({"embeddings": [
        {"id": 1, "data": [0.5, 0.25, 0.25], "metadata": {}},
        {"id": 2, "data": [0.5, -0.25, 0.25], "metadata": {}},
        {"id": 3, "data": [0.0, -0.0, 1.0], "metadata": {}},
    ]});
    let r = server.call("PUT", "/api/v1/embeddings/jensen/insert", Some(&body.to_string()));
    assert_eq!((r.status, r.code()), (500, "EMBEDDINGS_SKIPPED"), "{r:?}");
    assert_eq!(r.body["message"], "2/3 embeddings successfully inserted.");
    assert_eq!(
        r.body["error"]["description"],
        json!(["embedding with ID 2 was not inserted - value at position 1 is negative, and a js index scores only vectors without negative values"])
    );
    assert_eq!(server.call("GET", "/api/v1/indexes/jensen/stats", None).body["data"]["count"], 2);

    let r = server.call("POST", "/api/v1/embeddings/jensen/search", Some(r#"{"queryVector":[1,-0.5,0],"k":2}"#));
    assert_eq!((r.status, r.code()), (400, "SIMILARITY_SEARCH_ERROR"), "{r:?}");
    assert!(r.body.to_string().contains("value at position 1 is negative"), "{r:?}");
    assert!(r.body.get("data").is_none(), "a 400 carries no data: {r:?}");
    // The divergence of a distribution from itself is 0, and it is first.
    let r = server.call(
        "POST",
        "/api/v1/embeddings/jensen/search",
        Some(r#"{"queryVector":[0.5,0.25,0.25],"k":2,"include":["score"]}"#),
    );
    assert_eq!(r.body["data"]["nearest_neighbors"]["1"], json!({"metadata": {}, "rank": 0, "score": 0.0}), "{r:?}");
}

/// bc's Σ|x+q| = 0 with Σ|x−q| > 0 is +inf: ranked after every finite
/// distance, by id among themselves, its score `null`.
#[test]
fn bc_ranks_an_infinite_distance_last_with_a_null_score() {
    let server = Server::start();
    Metric::Bc.create(&server, "bray", 2);
    let body = json!({"embeddings": [
        {"id": 9, "data": [-1.0, -2.0], "metadata": {}},
        {"id": 4, "data": [-1.0, -2.0], "metadata": {}},
        {"id": 5, "data": [3.0, 3.0], "metadata": {}},
        {"id": 6, "data": [1.0, 2.0], "metadata": {}},
    ]});
    assert_eq!(server.call("PUT", "/api/v1/embeddings/bray/insert", Some(&body.to_string())).status, 200);
    let r = server.call(
        "POST",
        "/api/v1/embeddings/bray/search",
        Some(r#"{"queryVector":[1,2],"k":4,"include":["score"]}"#),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.body["data"]["nearest_neighbors"],
        json!({
            "6": {"metadata": {}, "rank": 0, "score": 0.0},
            "5": {"metadata": {}, "rank": 1, "score": 0.33333334},
            "4": {"metadata": {}, "rank": 2, "score": null},
            "9": {"metadata": {}, "rank": 3, "score": null},
        })
    );
}

/// Each of the six distances scales with its vectors (l1, linf, lp, js) or
/// not at all (canberra, bc), and a power of two changes no bit of f32
/// arithmetic but the exponent while nothing overflows or underflows: so at
/// the numeric domain's extremes (norms near 2^61 and values near 2^-60),
/// a search ranks exactly as at scale 1, with each score scaled exactly.
/// Summing |x−q|^p as written would overflow (p = 3 at 2^60) or vanish.
#[test]
fn the_distances_rank_alike_at_every_scale_of_the_domain() {
    let server = Server::start();
    let mut client = server.connect();
    let mut rng = Rng(11);
    let rows: Vec<Vec<f32>> = (0..60).map(|_| vector_for(Metric::Js, &mut rng, DIMS)).collect();
    let query = vector_for(Metric::Js, &mut rng, DIMS);
    for metric in &Metric::ALL[3..] {
        let answer = |client: &mut crate::harness::Client, scale: i32| {
            let index = format!("{}-{}", metric.label(), scale + 100);
            metric.create(&server, &index, DIMS);
            let factor = 2f32.powi(scale);
            let embeddings: Vec<Value> = rows
                .iter()
                .enumerate()
                .map(|(id, v)| json!({"id": id, "data": v.iter().map(|x| x * factor).collect::<Vec<f32>>()}))
                .collect();
            let body = json!({ "embeddings": embeddings }).to_string();
            assert_eq!(client.call("PUT", &format!("/api/v1/embeddings/{index}/insert"), Some(&body)).status, 200);
            let q: Vec<f32> = query.iter().map(|x| x * factor).collect();
            let body = json!({"queryVector": q, "k": 60, "include": ["score"]}).to_string();
            let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(&body));
            assert_eq!(r.status, 200, "{r:?}");
            let hits = r.body["data"]["nearest_neighbors"].as_object().unwrap().clone();
            let mut ranked: Vec<(u64, String, f64)> = hits
                .into_iter()
                .map(|(id, hit)| (hit["rank"].as_u64().unwrap(), id, hit["score"].as_f64().unwrap()))
                .collect();
            ranked.sort_by_key(|(rank, _, _)| *rank);
            ranked
        };
        let base = answer(&mut client, 0);
        for scale in [60, -60] {
            let scaled = answer(&mut client, scale);
            let factor = match metric {
                Metric::Canberra | Metric::Bc => 1.0,
                _ => 2f32.powi(scale),
            };
            for ((_, id, score), (_, scaled_id, scaled_score)) in base.iter().zip(&scaled) {
                assert_eq!(id, scaled_id, "{metric:?} at 2^{scale}");
                // Each score reads back to its f32 exactly.
                assert_eq!(*score as f32 * factor, *scaled_score as f32, "{metric:?} at 2^{scale}, id {id}");
            }
        }
    }
}
