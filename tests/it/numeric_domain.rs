//! The numeric domain: every norm within 2^62 (and, for cosine, at least
//! 2^-62), numbers rounded once to f32, and search exact at every magnitude
//! inside the domain, checked by the f64 oracle with each score's f32 error.

use serde_json::json;

use crate::harness::{create_index, Client, Rng, Server};
use crate::search_oracle::{check_search, write_batch, Metric, Model};

const METRICS: [Metric; 3] = [Metric::Cosine, Metric::L2, Metric::Ip];

/// Stores `rows` (id, vector) in a new index of `metric` and checks every
/// query against the oracle, for k of 1, 3 and all.
fn check_all(server: &Server, name: &str, metric: Metric, rows: &[(i64, Vec<f32>)], queries: &[Vec<f32>]) {
    create_index(server, name, rows[0].1.len(), metric.name());
    let mut client = server.connect();
    let items: Vec<(i64, Vec<f32>, String)> = rows.iter().map(|(id, v)| (*id, v.clone(), format!("{id}"))).collect();
    write_batch(&mut client, name, "insert", &items);
    let model: Model = items.into_iter().map(|(id, v, tag)| (id, (v, tag))).collect();
    for query in queries {
        for k in [1, 3, model.len()] {
            check_search(&mut client, name, metric, &model, query, k);
        }
    }
}

fn call(client: &mut Client, method: &str, path: &str, body: &serde_json::Value) -> crate::harness::Response {
    client.call(method, path, Some(&body.to_string()))
}

#[test]
fn vectors_outside_the_domain_are_skipped_naming_the_bound() {
    let server = Server::start();
    let mut client = server.connect();
    for metric in METRICS {
        let name = format!("domain-{}", metric.name());
        create_index(&server, &name, 2, metric.name());
        // Norms: 1.1e20 (above 2^62), 4e18 (inside), 1.1e-23 and 3e-39 (below 2^-62).
        let embeddings = json!({"embeddings": [
            {"id": 1, "data": [1e20, 5e19]},
            {"id": 2, "data": [4e18, 0]},
            {"id": 3, "data": [1e-23, 5e-24]},
            {"id": 4, "data": [3e-39, 0]},
            {"id": 5, "data": [3.3e18, -3.3e18]},
        ]});
        let r = call(&mut client, "PUT", &format!("/api/v1/embeddings/{name}/insert"), &embeddings);
        assert_eq!(r.code(), "EMBEDDINGS_SKIPPED", "{r:?}");
        let reasons: Vec<String> =
            r.body["error"]["description"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_owned()).collect();
        let too_large = "its Euclidean norm is above 2^62 (about 4.6e18), the largest that is scored exactly";
        let too_small = "its Euclidean norm is below 2^-62 (about 2.2e-19), the smallest a cosine index scores exactly";
        let mut want = vec![format!("embedding with ID 1 was not inserted - {too_large}")];
        if metric == Metric::Cosine {
            want.push(format!("embedding with ID 3 was not inserted - {too_small}"));
            want.push(format!("embedding with ID 4 was not inserted - {too_small}"));
        }
        want.push(format!("embedding with ID 5 was not inserted - {too_large}"));
        assert_eq!(reasons, want, "{metric:?}");
        let kept = if metric == Metric::Cosine { vec![2] } else { vec![2, 3, 4] };
        assert_eq!(r.message(), format!("{}/5 embeddings successfully inserted.", kept.len()));

        // Nothing of a skipped item is stored.
        let r =
            call(&mut client, "POST", &format!("/api/v1/embeddings/{name}/retrieve"), &json!({"ids": [1, 2, 3, 4, 5]}));
        let found: Vec<i64> =
            r.body["data"]["embeddings"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect();
        assert_eq!(found, kept, "{metric:?}");

        // A query outside the domain: 400, naming the bound.
        let search = format!("/api/v1/embeddings/{name}/search");
        let r = call(&mut client, "POST", &search, &json!({"queryVector": [1e20, -1e20], "k": 1}));
        assert_eq!((r.status, r.code()), (400, "SIMILARITY_SEARCH_ERROR"), "{r:?}");
        assert_eq!(r.body["error"]["description"], format!("queryVector: {too_large}"));
        let r = call(&mut client, "POST", &search, &json!({"queryVector": [1e-23, 1e-23], "k": 1}));
        if metric == Metric::Cosine {
            assert_eq!(r.body["error"]["description"], format!("queryVector: {too_small}"), "{r:?}");
        } else {
            assert_eq!(r.status, 200, "{r:?}");
        }
    }
}

/// Reads a retrieved vector back as f32 bits.
fn retrieved_bits(client: &mut Client, name: &str, id: i64) -> Vec<u32> {
    let r = call(client, "POST", &format!("/api/v1/embeddings/{name}/retrieve"), &json!({"ids": [id]}));
    assert_eq!(r.status, 200, "{r:?}");
    let data = r.body["data"]["embeddings"][0]["data"].as_array().unwrap();
    // Shortest f32 texts read as f64 lie well inside their f32's rounding interval.
    data.iter().map(|x| (x.as_f64().unwrap() as f32).to_bits()).collect()
}

#[test]
fn numbers_are_rounded_once_to_the_nearest_f32() {
    let server = Server::start();
    create_index(&server, "rounding", 6, "l2");
    let mut client = server.connect();
    // As raw text: these must not pass through an f64 on the way.
    let body = r#"{"embeddings":[{"id":1,"metadata":{"note":"\"escaped\" \\ text"},"data":[
        1.0000000596046448, -0, 4611686018427387903, 1.00000005960464477539062499,
        -1e-45, 7.0064923216240862e-46]}, {"id":2,"data":[0,0,0,0,0,18446744073709551616]}]}"#;
    let r = client.call("PUT", "/api/v1/embeddings/rounding/insert", Some(body));
    // An integer beyond 64 bits is a number like any other: here, one whose
    // norm is outside the domain.
    assert_eq!(r.message(), "1/2 embeddings successfully inserted.", "{r:?}");
    assert!(r.body["error"]["description"][0].as_str().unwrap().contains("above 2^62"), "{r:?}");
    let want = [1.000_000_1f32, -0.0, 4_611_686_018_427_387_904.0, 1.0, -1.0e-45, 1.0e-45];
    assert_eq!(retrieved_bits(&mut client, "rounding", 1), want.map(f32::to_bits));

    // The same rounding for a query: 1.0000000596046448 is nearer 1.0000001 than 1.
    create_index(&server, "rounding-small", 2, "l2");
    write_batch(&mut client, "rounding-small", "insert", &[(1, vec![1.0, 0.0], String::new())]);
    write_batch(&mut client, "rounding-small", "insert", &[(2, vec![1.000_000_1, 0.0], String::new())]);
    let r = client.call(
        "POST",
        "/api/v1/embeddings/rounding-small/search",
        Some(r#"{"k":1,"queryVector":[1.0000000596046448,-0]}"#),
    );
    assert!(r.body["data"]["nearest_neighbors"].get("2").is_some(), "{r:?}");
}

/// Rows of several directions, each at scales across the whole domain;
/// queries at its edges. Cosine ranks them all as the unit vectors rank.
#[test]
fn cosine_is_scale_free_across_the_domain() {
    let server = Server::start();
    let scales = [2.3e-19f32, 1e-18, 3e-7, 1.0, 7e11, 1e18, 4.5e18];
    let directions = [[2.0f32, 1.0], [1.0, 2.0], [-1.0, 0.5], [0.2, -1.0], [1.0, 0.0]];
    let mut rows = Vec::new();
    for (d, direction) in directions.iter().enumerate() {
        for (s, scale) in scales.iter().enumerate() {
            let norm = (direction[0] * direction[0] + direction[1] * direction[1]).sqrt();
            rows.push(((d * 10 + s) as i64, direction.map(|x| x / norm * scale).to_vec()));
        }
    }
    // The contract's example, and twins that must tie and rank by id.
    rows.push((100, vec![1e18, 5e17]));
    rows.push((101, vec![1e-18, 5e-19]));
    rows.push((102, vec![2.0, 1.0]));
    rows.push((99, vec![2.0, 1.0]));
    let queries: Vec<Vec<f32>> = [3e-18f32, 1.0, 4.5e18]
        .iter()
        .flat_map(|scale| [[2.0f32, 1.0], [-1.0, 3.0], [0.3, -0.1]].map(|q| q.map(|x| x * scale / 3.2).to_vec()))
        .collect();
    check_all(&server, "scales", Metric::Cosine, &rows, &queries);
}

/// Components near 1e-18 beside components near 1e-24 (whose products
/// fall below f32's normal range unless the query is scaled), in 3 and 17
/// dimensions, every metric.
#[test]
fn mixed_magnitudes_rank_exactly_in_every_metric() {
    let server = Server::start();
    let mut rng = Rng(1414);
    for dims in [3, 17] {
        let mixed = |rng: &mut Rng| -> Vec<f32> {
            let mut v: Vec<f32> =
                (0..dims).map(|_| rng.float() * if rng.below(2) == 0 { 1e-18 } else { 1e-24 }).collect();
            v[rng.below(dims as u64) as usize] = 1e-18;
            v
        };
        let rows: Vec<(i64, Vec<f32>)> = (0..150).map(|id| (id, mixed(&mut rng))).collect();
        let queries: Vec<Vec<f32>> = (0..8).map(|_| mixed(&mut rng)).collect();
        for metric in METRICS {
            check_all(&server, &format!("mixed-{dims}-{}", metric.name()), metric, &rows, &queries);
        }
    }
}

/// Norms at the domain's top (whose products and squared distances come
/// within a factor 4 of f32's largest), tiny rows (ip and l2 only), twins,
/// signs that cancel: every metric against the oracle.
#[test]
fn extreme_norms_rank_exactly_in_every_metric() {
    let server = Server::start();
    let huge: [[f32; 2]; 8] = [
        [3.2e18, -3.2e18],
        [-3.2e18, 3.2e18],
        [4.6e18, 0.0],
        [2e18, 0.0],
        [1e18, 0.0],
        [-4e18, 1e18],
        [3.0, 1.0],
        [1e-18, 1e-19],
    ];
    let tiny: [[f32; 2]; 5] = [[1e-30, 2e-30], [2e-30, 1e-30], [-1e-30, 1e-30], [1e-40, 0.0], [3e-41, 3e-41]];
    for metric in METRICS {
        let mut rows: Vec<(i64, Vec<f32>)> = huge.iter().enumerate().map(|(id, v)| (id as i64, v.to_vec())).collect();
        rows.push((50, huge[0].to_vec()));
        rows.push((-50, huge[2].to_vec()));
        if metric != Metric::Cosine {
            rows.extend(tiny.iter().enumerate().map(|(id, v)| (20 + id as i64, v.to_vec())));
        }
        let mut queries: Vec<Vec<f32>> =
            vec![vec![4e18, -1e18], vec![-3.2e18, 3.2e18], vec![1.0, 1.0], vec![-2e18, 0.0], vec![3e-19, -1e-19]];
        if metric != Metric::Cosine {
            queries.extend([vec![1e-30, 1e-30], vec![1e-42, 0.0], vec![0.0, 0.0]]);
        }
        check_all(&server, &format!("extreme-{}", metric.name()), metric, &rows, &queries);
    }
}
