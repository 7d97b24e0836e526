//! Typed metadata on the real binary: numbers, booleans and arrays of
//! strings come back as sent (in canonical form), and filters compare them
//! by type, on search, scroll and delete, against a model of the rows;
//! through upserts that change a value's type, deletes, `kill -9` and a
//! restart from the snapshot.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::harness::{Client, Rng, Server, KEY};
use crate::search_oracle::{check_filtered, vector_for, Metric, Model};

const DIMS: usize = 16;

/// id -> (vector, metadata as the server returns it).
type Rows = BTreeMap<i64, (Vec<f32>, Map<String, Value>)>;

/// Row `id`'s metadata, of every type, varied by `salt`.
fn metadata_of(id: i64, salt: i64) -> Map<String, Value> {
    let v = (id + salt).rem_euclid(20);
    let mut m = Map::new();
    m.insert("tag".into(), json!(format!("t{id}")));
    match (id + salt).rem_euclid(7) {
        0 => drop(m.insert("n".into(), json!(v))),
        1 => drop(m.insert("n".into(), json!(v as f64 + 0.5))),
        2 => drop(m.insert("n".into(), json!(v.to_string()))),
        3 => drop(m.insert("n".into(), json!(v as f64))),
        4 => drop(m.insert("n".into(), json!(v % 2 == 0))),
        5 => {}
        _ => drop(m.insert("n".into(), json!([v.to_string()]))),
    }
    m.insert("flag".into(), [json!(true), json!(false), json!("true")][(id / 3 + salt).rem_euclid(3) as usize].clone());
    let tags = [json!(["red", "blue"]), json!(["blue", "blue"]), json!([]), json!("red"), json!(["green", "red"])];
    m.insert("tags".into(), tags[(id * 3 + salt).rem_euclid(5) as usize].clone());
    m.insert("big".into(), json!(if id % 10 == 0 { 9_007_199_254_740_993i64 } else { 9_007_199_254_740_992 }));
    m
}

fn number(m: &Map<String, Value>, key: &str) -> Option<f64> {
    match m.get(key)? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok().filter(|x| x.is_finite()),
        _ => None,
    }
}

/// The number `x` itself, as `Eq` compares: a number of the same value.
fn is_number(m: &Map<String, Value>, key: &str, x: f64) -> bool {
    matches!(m.get(key), Some(Value::Number(n)) if n.as_f64() == Some(x))
}

fn contains(m: &Map<String, Value>, key: &str, s: &str) -> bool {
    match m.get(key) {
        Some(Value::Array(elements)) => elements.iter().any(|e| e == s),
        Some(Value::String(value)) => value == s,
        _ => false,
    }
}

struct Case {
    filter: Value,
    matches: fn(&Map<String, Value>) -> bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case { filter: json!({"n": 3}), matches: |m| is_number(m, "n", 3.0) },
        Case { filter: json!({"n": 3.0}), matches: |m| is_number(m, "n", 3.0) },
        Case { filter: json!({"n": 3.5}), matches: |m| is_number(m, "n", 3.5) },
        Case { filter: json!({"n": "3"}), matches: |m| m.get("n") == Some(&json!("3")) },
        Case { filter: json!({"n": {"$eq": true}}), matches: |m| m.get("n") == Some(&json!(true)) },
        Case {
            filter: json!({"n": {"$in": [3, "4", true, 5.5]}}),
            matches: |m| {
                is_number(m, "n", 3.0)
                    || is_number(m, "n", 5.5)
                    || m.get("n") == Some(&json!("4"))
                    || m.get("n") == Some(&json!(true))
            },
        },
        Case { filter: json!({"n": {"$ne": 3}}), matches: |m| !is_number(m, "n", 3.0) },
        Case {
            filter: json!({"n": {"$nin": [7.5, false]}}),
            matches: |m| !is_number(m, "n", 7.5) && m.get("n") != Some(&json!(false)),
        },
        Case {
            filter: json!({"n": {"$gte": 5, "$lt": 10.5}}),
            matches: |m| number(m, "n").is_some_and(|x| (5.0..10.5).contains(&x)),
        },
        Case { filter: json!({"flag": true}), matches: |m| m.get("flag") == Some(&json!(true)) },
        Case { filter: json!({"flag": "true"}), matches: |m| m.get("flag") == Some(&json!("true")) },
        Case { filter: json!({"flag": {"$ne": false}}), matches: |m| m.get("flag") != Some(&json!(false)) },
        Case { filter: json!({"tags": {"$contains": "red"}}), matches: |m| contains(m, "tags", "red") },
        Case { filter: json!({"tags": {"$contains": "blue"}}), matches: |m| contains(m, "tags", "blue") },
        Case { filter: json!({"tags": {"$contains": "nope"}}), matches: |_| false },
        Case { filter: json!({"tags": "red"}), matches: |m| m.get("tags") == Some(&json!("red")) },
        Case { filter: json!({"n": {"$contains": "4"}}), matches: |m| contains(m, "n", "4") },
        Case { filter: json!({"n": {"$exists": false}}), matches: |m| !m.contains_key("n") },
        Case {
            filter: json!({"big": 9_007_199_254_740_993i64}),
            matches: |m| m.get("big") == Some(&json!(9_007_199_254_740_993i64)),
        },
        Case {
            filter: json!({"$or": [{"tags": {"$contains": "green"}}, {"n": {"$gt": 15}}]}),
            matches: |m| contains(m, "tags", "green") || number(m, "n").is_some_and(|x| x > 15.0),
        },
        Case {
            filter: json!({"$and": [{"flag": true}, {"$not": {"tags": {"$contains": "blue"}}}]}),
            matches: |m| m.get("flag") == Some(&json!(true)) && !contains(m, "tags", "blue"),
        },
    ]
}

fn put(client: &mut Client, endpoint: &str, rows: &[(i64, Vec<f32>, Map<String, Value>)]) {
    let embeddings: Vec<Value> =
        rows.iter().map(|(id, v, metadata)| json!({"id": id, "data": v, "metadata": metadata})).collect();
    let body = json!({ "embeddings": embeddings }).to_string();
    let r = client.call("PUT", &format!("/api/v1/embeddings/docs/{endpoint}"), Some(&body));
    assert_eq!(r.status, 200, "{r:?}");
}

/// Every row, listed through scroll with `filter`.
fn scroll(client: &mut Client, filter: &Value) -> Vec<Value> {
    let (mut listed, mut after) = (Vec::new(), Value::Null);
    loop {
        let body = json!({"limit": 97, "filter": filter, "after": after});
        let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(&body.to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        listed.extend(r.body["data"]["embeddings"].as_array().unwrap().iter().cloned());
        after = r.body["data"]["next"].clone();
        if after.is_null() {
            return listed;
        }
    }
}

/// Every case's scroll lists exactly the rows it matches, with their
/// metadata as the model holds it, and its searches are exact among them.
fn check(client: &mut Client, rows: &Rows, rng: &mut Rng) {
    let listed = scroll(client, &json!({}));
    assert_eq!(listed.len(), rows.len());
    for row in &listed {
        let (_, metadata) = &rows[&row["id"].as_i64().unwrap()];
        assert_eq!(row["metadata"], Value::Object(metadata.clone()), "returned as sent");
    }
    for case in cases() {
        let want: Vec<i64> = rows.iter().filter(|(_, (_, m))| (case.matches)(m)).map(|(&id, _)| id).collect();
        let ids: Vec<i64> = scroll(client, &case.filter).iter().map(|row| row["id"].as_i64().unwrap()).collect();
        assert_eq!(ids, want, "filter {}", case.filter);
        let model: Model = rows
            .iter()
            .filter(|(_, (_, m))| (case.matches)(m))
            .map(|(&id, (v, m))| (id, (v.clone(), m["tag"].as_str().unwrap().to_owned())))
            .collect();
        let query = vector_for(Metric::Cosine, rng, DIMS);
        for k in [1, 10, rows.len() + 1] {
            check_filtered(client, "docs", Metric::Cosine, &model, &query, k, Some(&case.filter));
        }
    }
}

fn start(data_dir: &Path) -> Server {
    Server::start_in(None, data_dir.to_owned(), &["--api-key", KEY], &[])
}

#[test]
fn typed_values_are_filtered_by_type_through_changes_and_restarts() {
    let mut rng = Rng(3500);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = start(&data_dir);
    Metric::Cosine.create(&server, "docs", DIMS);
    let mut client = server.connect();
    let items: Vec<_> = (0..700)
        .map(|id| (id * 3 - 900, vector_for(Metric::Cosine, &mut rng, DIMS), metadata_of(id * 3 - 900, 0)))
        .collect();
    for chunk in items.chunks(200) {
        put(&mut client, "insert", chunk);
    }
    let mut rows: Rows = items.into_iter().map(|(id, v, m)| (id, (v, m))).collect();
    for (case, count) in cases().iter().map(|case| (case, rows.values().filter(|(_, m)| (case.matches)(m)).count())) {
        assert!(count > 0 || case.filter == json!({"tags": {"$contains": "nope"}}), "{} matches no row", case.filter);
    }
    check(&mut client, &rows, &mut rng);

    // Upserts that change values and their types; deletes that move rows.
    let ids: Vec<i64> = rows.keys().copied().collect();
    let changed: Vec<_> =
        ids.iter().step_by(4).map(|&id| (id, vector_for(Metric::Cosine, &mut rng, DIMS), metadata_of(id, 3))).collect();
    put(&mut client, "upsert", &changed);
    for (id, v, m) in changed {
        rows.insert(id, (v, m));
    }
    let gone: Vec<i64> = ids.iter().copied().filter(|id| id.rem_euclid(9) == 0).collect();
    let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(&json!({ "ids": gone }).to_string()));
    assert_eq!(r.status, 200, "{r:?}");
    rows.retain(|id, _| !gone.contains(id));
    check(&mut client, &rows, &mut rng);

    // Delete by a typed filter: one durable write, then kill -9.
    let filter = json!({"$or": [{"n": {"$in": [1, 2.5]}}, {"tags": {"$contains": "green"}}]});
    let matches =
        |m: &Map<String, Value>| is_number(m, "n", 1.0) || is_number(m, "n", 2.5) || contains(m, "tags", "green");
    let n = rows.values().filter(|(_, m)| matches(m)).count();
    assert!(n > 10, "{n}");
    let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(&json!({ "filter": filter }).to_string()));
    assert_eq!((r.status, &r.body["data"]), (200, &json!({ "deleted": n })), "{r:?}");
    rows.retain(|_, (_, m)| !matches(m));
    server.kill();
    let server = start(&data_dir);
    let mut client = server.connect();
    check(&mut client, &rows, &mut rng);
    // A clean stop writes a snapshot; the start loads it.
    assert!(server.terminate().success());
    let server = start(&data_dir);
    let mut client = server.connect();
    check(&mut client, &rows, &mut rng);
}

#[test]
fn values_come_back_in_canonical_form_on_every_endpoint() {
    let server = Server::start();
    Metric::L2.create(&server, "docs", 2);
    let mut client = server.connect();
    let sent = r#"{"embeddings":[{"id":1,"data":[1,2],"metadata":{"i":-0,"f":2.50,"g":3.0,"e":1E300,
        "u":18446744073709551615,"t":true,"a":["x","y\n",""],"none":[],"s":"1","é":"ü"}}]}"#;
    let r = client.call("PUT", "/api/v1/embeddings/docs/insert", Some(sent));
    assert_eq!(r.status, 200, "{r:?}");
    let canonical = r#"{"i":0,"f":2.5,"g":3.0,"e":1e300,"u":1.8446744073709552e19,"t":true,"a":["x","y\n",""],"none":[],"s":"1","é":"ü"}"#;
    for (method, path, body) in [
        ("POST", "retrieve", r#"{"ids":[1]}"#),
        ("POST", "scroll", "{}"),
        ("POST", "search", r#"{"queryVector":[1,2],"k":1}"#),
        ("POST", "search-batch", r#"{"searches":[{"queryVector":[1,2],"k":1}]}"#),
    ] {
        let (status, bytes) = client.raw_call(method, &format!("/api/v1/embeddings/docs/{path}"), Some(body));
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(status, 200, "{text}");
        assert!(text.contains(&format!(r#""metadata":{canonical}"#)), "{path}: {text}");
    }
    // Filters read the same values back by type.
    let count = |client: &mut Client, filter: Value| {
        let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(&json!({ "filter": filter }).to_string()));
        r.body["data"]["embeddings"].as_array().unwrap().len()
    };
    for filter in [
        json!({"i": 0}),
        json!({"i": -0.0}),
        json!({"f": 2.5}),
        json!({"g": 3}),
        json!({"e": 1e300}),
        json!({"u": 18446744073709551615u64}),
        json!({"t": true}),
        json!({"a": {"$contains": ""}}),
        json!({"s": "1"}),
        json!({"é": "ü"}),
        json!({"u": {"$gt": 1e19}}),
    ] {
        assert_eq!(count(&mut client, filter.clone()), 1, "{filter}");
    }
    for filter in [json!({"s": 1}), json!({"t": "true"}), json!({"a": "x"}), json!({"none": {"$contains": "x"}})] {
        assert_eq!(count(&mut client, filter.clone()), 0, "{filter}");
    }
}

/// A data directory written by quiver before metadata had types (a
/// snapshot, and a log after it ending in a `kill -9`), checked in: it
/// loads unchanged, its strings stay strings.
#[test]
fn data_written_before_typed_metadata_loads_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data-before-typed-metadata");
    for sub in ["", "snapshots", "wal"] {
        std::fs::create_dir_all(data_dir.join(sub)).unwrap();
        for entry in std::fs::read_dir(fixture.join(sub)).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), data_dir.join(sub).join(entry.file_name())).unwrap();
            }
        }
    }
    let server = start(&data_dir);
    let mut client = server.connect();
    // Rows 0..20 were written (0..12 before the snapshot), 3 and 15 deleted.
    let ids: Vec<i64> = (0..20).filter(|id| ![3, 15].contains(id)).collect();
    let listed = scroll(&mut client, &json!({}));
    assert_eq!(listed.iter().map(|row| row["id"].as_i64().unwrap()).collect::<Vec<_>>(), ids);
    for (row, id) in listed.iter().zip(&ids) {
        let n = if id % 2 == 1 { "1" } else { "x" };
        assert_eq!(row["metadata"], json!({"tag": format!("t{id}"), "year": (1990 + id).to_string(), "n": n}));
    }
    let count = |client: &mut Client, filter: Value| scroll(client, &filter).len();
    assert_eq!(count(&mut client, json!({"n": "1"})), ids.iter().filter(|id| *id % 2 == 1).count());
    assert_eq!(count(&mut client, json!({"n": 1})), 0, "a string stays a string");
    assert_eq!(count(&mut client, json!({"year": {"$gte": 2005}})), 4, "decimal strings still range");
    let r = client.call("POST", "/api/v1/embeddings/docs/retrieve", Some(r#"{"ids":[19]}"#));
    assert_eq!(r.body["data"]["embeddings"][0]["data"], json!([20.0, 9.5, -1.25]));
}
