//! Filters on the real binary: every operator, on search (lone and in a
//! batch), scroll and delete, checked against a model of the rows; through
//! upserts that change metadata, deletes, a restart from the snapshot and a
//! `kill -9`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::harness::{Client, Rng, Server, KEY};
use crate::search_oracle::{check_filtered, vector, vector_for, Metric, Model};

const DIMS: usize = 24;

/// One row of the model: its vector and its metadata.
type Rows = BTreeMap<i64, (Vec<f32>, BTreeMap<String, String>)>;

/// Row `id`'s metadata: `tag` names it; `cat` (50 values), `tier` (7),
/// `half` (2); `year` a number from 1990 to 2024, missing on every 11th row
/// and not a number on every 13th.
fn metadata_of(id: i64, salt: i64) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    metadata.insert("tag".to_owned(), format!("t{id}"));
    metadata.insert("cat".to_owned(), format!("c{}", (id + salt).rem_euclid(50)));
    metadata.insert("tier".to_owned(), format!("t{}", (id * 3 + salt).rem_euclid(7)));
    metadata.insert("half".to_owned(), format!("h{}", id.rem_euclid(2)));
    if id % 13 == 0 {
        metadata.insert("year".to_owned(), "unknown".to_owned());
    } else if id % 11 != 0 {
        metadata.insert("year".to_owned(), (1990 + (id + salt).rem_euclid(35)).to_string());
    }
    metadata
}

fn put(client: &mut Client, index: &str, endpoint: &str, rows: &[(i64, Vec<f32>, BTreeMap<String, String>)]) {
    let embeddings: Vec<Value> =
        rows.iter().map(|(id, v, metadata)| json!({"id": id, "data": v, "metadata": metadata})).collect();
    let body = json!({ "embeddings": embeddings }).to_string();
    let r = client.call("PUT", &format!("/api/v1/embeddings/{index}/{endpoint}"), Some(&body));
    assert_eq!(r.status, 200, "{r:?}");
}

/// A filter and the rows it matches, as the contract defines each operator.
struct Case {
    filter: Value,
    matches: fn(&BTreeMap<String, String>) -> bool,
}

fn number(metadata: &BTreeMap<String, String>, key: &str) -> Option<f64> {
    metadata.get(key).and_then(|v| v.parse::<f64>().ok()).filter(|x| x.is_finite())
}

fn is(metadata: &BTreeMap<String, String>, key: &str, value: &str) -> bool {
    metadata.get(key).map(String::as_str) == Some(value)
}

fn cases() -> Vec<Case> {
    vec![
        Case { filter: json!({}), matches: |_| true },
        Case { filter: json!({"cat": "c3"}), matches: |m| is(m, "cat", "c3") },
        Case { filter: json!({"cat": {"$eq": "c3"}}), matches: |m| is(m, "cat", "c3") },
        Case { filter: json!({"cat": {"$ne": "c3"}}), matches: |m| !is(m, "cat", "c3") },
        Case { filter: json!({"year": {"$ne": "2001"}}), matches: |m| !is(m, "year", "2001") },
        Case {
            filter: json!({"cat": {"$in": ["c1", "c2", "zz"]}}),
            matches: |m| is(m, "cat", "c1") || is(m, "cat", "c2"),
        },
        Case {
            filter: json!({"cat": {"$nin": ["c1", "c2"]}}),
            matches: |m| !is(m, "cat", "c1") && !is(m, "cat", "c2"),
        },
        Case { filter: json!({"year": {"$nin": ["2001"]}}), matches: |m| !is(m, "year", "2001") },
        Case { filter: json!({"cat": {"$in": []}}), matches: |_| false },
        Case { filter: json!({"cat": {"$nin": []}}), matches: |_| true },
        Case { filter: json!({"year": {"$exists": true}}), matches: |m| m.contains_key("year") },
        Case { filter: json!({"year": {"$exists": false}}), matches: |m| !m.contains_key("year") },
        Case {
            filter: json!({"year": {"$gte": 2000, "$lt": 2010}}),
            matches: |m| number(m, "year").is_some_and(|y| (2000.0..2010.0).contains(&y)),
        },
        Case { filter: json!({"year": {"$gt": 2020.5}}), matches: |m| number(m, "year").is_some_and(|y| y > 2020.5) },
        Case { filter: json!({"year": {"$lte": 1990}}), matches: |m| number(m, "year").is_some_and(|y| y <= 1990.0) },
        Case { filter: json!({"year": {"$lt": -1e300}}), matches: |_| false },
        Case {
            filter: json!({"$and": [{"tier": "t1"}, {"half": "h0"}]}),
            matches: |m| is(m, "tier", "t1") && is(m, "half", "h0"),
        },
        Case { filter: json!({"tier": "t2", "half": "h1"}), matches: |m| is(m, "tier", "t2") && is(m, "half", "h1") },
        Case {
            filter: json!({"$or": [{"cat": "c1"}, {"year": {"$gt": 2022}}]}),
            matches: |m| is(m, "cat", "c1") || number(m, "year").is_some_and(|y| y > 2022.0),
        },
        Case { filter: json!({"$not": {"half": "h1"}}), matches: |m| !is(m, "half", "h1") },
        Case { filter: json!({"cat": "nope"}), matches: |_| false },
        Case { filter: json!({"nokey": {"$ne": "x"}}), matches: |_| true },
        Case {
            filter: json!({"$and": [
                {"$or": [{"tier": "t1"}, {"tier": "t2"}]},
                {"$not": {"cat": {"$in": ["c1", "c8"]}}},
            ]}),
            matches: |m| (is(m, "tier", "t1") || is(m, "tier", "t2")) && !is(m, "cat", "c1") && !is(m, "cat", "c8"),
        },
    ]
}

/// The rows of `rows` that `matches`, as the oracle's model.
fn model_of(rows: &Rows, matches: fn(&BTreeMap<String, String>) -> bool) -> Model {
    rows.iter()
        .filter(|(_, (_, metadata))| matches(metadata))
        .map(|(&id, (v, metadata))| (id, (v.clone(), metadata["tag"].clone())))
        .collect()
}

/// Every case's filtered searches agree with the oracle over the rows it
/// matches, for `queries` queries and k of 1, 10 and more than all rows.
fn check_cases(client: &mut Client, index: &str, metric: Metric, rows: &Rows, rng: &mut Rng, queries: usize) {
    for case in cases() {
        let model = model_of(rows, case.matches);
        for _ in 0..queries {
            let query = vector_for(metric, rng, DIMS);
            for k in [1, 10, rows.len() + 5] {
                check_filtered(client, index, metric, &model, &query, k, Some(&case.filter));
            }
        }
    }
}

/// A server with one index of `metric` holding `count` rows.
fn server_with_rows(metric: Metric, count: i64, rng: &mut Rng, extra: &[&str]) -> (Server, Client, Rows) {
    rows_into(Server::start_with(extra), metric, count, rng)
}

/// `server` with one index of `metric` holding `count` rows.
fn rows_into(server: Server, metric: Metric, count: i64, rng: &mut Rng) -> (Server, Client, Rows) {
    metric.create(&server, "docs", DIMS);
    let mut client = server.connect();
    let mut rows = Rows::new();
    let items: Vec<_> =
        (0..count).map(|id| (id * 2 - 300, vector_for(metric, rng, DIMS), metadata_of(id * 2 - 300, 0))).collect();
    for chunk in items.chunks(250) {
        put(&mut client, "docs", "insert", chunk);
    }
    for (id, v, metadata) in items {
        rows.insert(id, (v, metadata));
    }
    (server, client, rows)
}

#[test]
fn filtered_search_is_exact_among_the_matching_rows() {
    for (n, metric) in Metric::ALL.into_iter().enumerate() {
        let mut rng = Rng(500 + n as u64);
        let (_server, mut client, mut rows) = server_with_rows(metric, 1200, &mut rng, &[]);
        check_cases(&mut client, "docs", metric, &rows, &mut rng, 2);
        // Upserts that change rows' metadata (and vectors), and deletes that
        // move rows about: the metadata index follows.
        let ids: Vec<i64> = rows.keys().copied().collect();
        let changed: Vec<_> =
            ids.iter().step_by(3).map(|&id| (id, vector_for(metric, &mut rng, DIMS), metadata_of(id, 17))).collect();
        put(&mut client, "docs", "upsert", &changed);
        for (id, v, metadata) in changed {
            rows.insert(id, (v, metadata));
        }
        let gone: Vec<i64> = ids.iter().copied().filter(|id| id % 5 == 0).collect();
        let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(&json!({ "ids": gone }).to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        for id in gone {
            rows.remove(&id);
        }
        check_cases(&mut client, "docs", metric, &rows, &mut rng, 1);
    }
}

/// In every metric.
#[test]
fn a_batch_answers_filtered_searches_as_each_alone() {
    for (n, metric) in Metric::ALL.into_iter().enumerate() {
        batch_answers_as_alone(metric, 600 + n as u64);
    }
}

fn batch_answers_as_alone(metric: Metric, seed: u64) {
    let mut rng = Rng(seed);
    let (_server, mut client, _) = server_with_rows(metric, 700, &mut rng, &[]);
    let filters = [json!(null), json!({"cat": "c4"}), json!({"year": {"$gte": 2010}}), json!({"half": "h0"})];
    let searches: Vec<Value> = (0..24)
        .map(|n| {
            let include = if n % 2 == 0 { json!(["score"]) } else { json!(null) };
            let k = [3, 40][n % 2];
            json!({"queryVector": vector_for(metric, &mut rng, DIMS), "k": k, "filter": filters[n % 4], "include": include})
        })
        .collect();
    let r =
        client.call("POST", "/api/v1/embeddings/docs/search-batch", Some(&json!({ "searches": searches }).to_string()));
    assert_eq!(r.status, 200, "{r:?}");
    let results = r.body["data"]["results"].as_array().unwrap();
    for (n, (search, result)) in searches.iter().zip(results).enumerate() {
        let alone = client.call("POST", "/api/v1/embeddings/docs/search", Some(&search.to_string()));
        assert_eq!(alone.status, 200, "{alone:?}");
        assert_eq!(result, &alone.body["data"], "{metric:?} search {n}");
    }
}

/// Every row, listed page by page through scroll.
fn scroll_all(client: &mut Client, body: Value) -> Vec<Value> {
    let mut listed = Vec::new();
    let mut body = body;
    loop {
        let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(&body.to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        let page = r.body["data"]["embeddings"].as_array().unwrap().clone();
        let noun = if page.len() == 1 { "embedding" } else { "embeddings" };
        assert_eq!(r.message(), format!("{} {noun} listed.", page.len()));
        let next = r.body["data"]["next"].clone();
        listed.extend(page);
        if next.is_null() {
            return listed;
        }
        assert_eq!(next, listed.last().unwrap()["id"], "next is the last id listed");
        body["after"] = next;
    }
}

#[test]
fn scroll_lists_each_matching_row_once_in_id_order() {
    let mut rng = Rng(700);
    let (_server, mut client, rows) = server_with_rows(Metric::L2, 500, &mut rng, &[]);
    for case in cases() {
        for limit in [1, 7, 10_000] {
            let listed = scroll_all(&mut client, json!({"limit": limit, "filter": case.filter}));
            let ids: Vec<i64> = listed.iter().map(|row| row["id"].as_i64().unwrap()).collect();
            let want: Vec<i64> = model_of(&rows, case.matches).keys().copied().collect();
            assert_eq!(ids, want, "filter {} limit {limit}", case.filter);
        }
    }
    // With vectors, exactly as stored; without, id and metadata only.
    let listed = scroll_all(&mut client, json!({"limit": 33, "include": ["data"], "after": -101}));
    assert_eq!(listed.len(), rows.range(-100..).count());
    for row in &listed {
        let (vector, metadata) = &rows[&row["id"].as_i64().unwrap()];
        let data: Vec<f32> = row["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(&data, vector);
        assert_eq!(row["metadata"], json!(metadata));
    }
    let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some("{}"));
    assert_eq!(r.body["data"]["embeddings"].as_array().unwrap().len(), 100, "100 rows by default");
    assert_eq!(r.body["data"]["embeddings"][0].as_object().unwrap().len(), 2, "id and metadata");
    let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(r#"{"limit":null,"after":null,"filter":null}"#));
    assert_eq!(r.body["data"]["embeddings"].as_array().unwrap().len(), 100, "null is absent");
    let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(r#"{"after":9223372036854775807}"#));
    assert_eq!(r.body["data"], json!({"embeddings": [], "next": null}));
}

#[test]
fn scroll_under_concurrent_writes_lists_the_rows_that_stay_exactly_once() {
    let mut rng = Rng(710);
    let (server, mut client, rows) = server_with_rows(Metric::Ip, 400, &mut rng, &[]);
    let mut writer = server.connect();
    let stays: Vec<i64> = rows.keys().copied().filter(|id| id % 3 != 0).collect();
    let mut body = json!({"limit": 25, "filter": {"half": "h0"}});
    let mut listed: Vec<i64> = Vec::new();
    let mut round = 0;
    loop {
        let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(&body.to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        listed.extend(r.body["data"]["embeddings"].as_array().unwrap().iter().map(|row| row["id"].as_i64().unwrap()));
        let next = r.body["data"]["next"].clone();
        // Between pages: new rows everywhere in the id range, and deletes of
        // rows (id divisible by 3) before or after the cursor.
        round += 1;
        let new: Vec<_> = (0..5)
            .map(|n| (10_000 * round + n * 194 + 1 - 20_000, vector(&mut rng, DIMS), metadata_of(n * 2, 0)))
            .collect();
        put(&mut writer, "docs", "insert", &new);
        let gone: Vec<i64> = rows.keys().copied().filter(|id| id % 3 == 0 && (id / 3) % 8 == round % 8).collect();
        let r = writer.call("DELETE", "/api/v1/embeddings/docs/delete", Some(&json!({ "ids": gone }).to_string()));
        assert!(r.status == 200 || r.status == 500, "{r:?}");
        if next.is_null() {
            break;
        }
        body["after"] = next;
    }
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "ascending, each once");
    for id in stays.iter().filter(|id| rows[id].1["half"] == "h0") {
        assert!(listed.contains(id), "row {id} stayed throughout and was not listed");
    }
}

/// The ids at both ends of the range are listed like any other: a scroll
/// without `after` starts at `i64::MIN` itself, and one that reaches
/// `i64::MAX` ends there; with a filter, and with rows written at both
/// ends between pages.
#[test]
fn scroll_lists_the_first_and_last_ids_of_the_range() {
    let mut rng = Rng(720);
    let server = Server::start();
    crate::harness::create_index(&server, "docs", DIMS, "l2");
    let mut client = server.connect();
    let ends = [i64::MIN, i64::MIN + 1, i64::MIN + 2, -1, 0, 1, i64::MAX - 2, i64::MAX - 1, i64::MAX];
    // `half` by the id's parity, which `rem_euclid(1000)` keeps.
    let rows: Vec<_> =
        ends.iter().map(|&id| (id, vector(&mut rng, DIMS), metadata_of(id.rem_euclid(1000), 0))).collect();
    put(&mut client, "docs", "insert", &rows);
    let odd: Vec<i64> = ends.iter().copied().filter(|id| id.rem_euclid(2) == 1).collect();
    for limit in [1, 2, 4, 100] {
        let listed = scroll_all(&mut client, json!({ "limit": limit }));
        let ids: Vec<i64> = listed.iter().map(|row| row["id"].as_i64().unwrap()).collect();
        assert_eq!(ids, ends, "limit {limit}");
        let listed = scroll_all(&mut client, json!({"limit": limit, "filter": {"half": "h1"}}));
        let ids: Vec<i64> = listed.iter().map(|row| row["id"].as_i64().unwrap()).collect();
        assert_eq!(ids, odd, "limit {limit}, filtered");
    }
    let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(r#"{"limit":1}"#));
    assert_eq!(r.body["data"]["embeddings"][0]["id"], i64::MIN, "{r:?}");
    assert_eq!(r.message(), "1 embedding listed.");
    let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(r#"{"after":-9223372036854775808}"#));
    assert_eq!(r.body["data"]["embeddings"][0]["id"], i64::MIN + 1, "after excludes its own id: {r:?}");

    // Between pages, the row before the cursor at the low end goes and
    // comes back; rows after it at the high end come and go: every row
    // that stays throughout is listed once, in order.
    let mut writer = server.connect();
    let mut body = json!({"limit": 2});
    let mut listed: Vec<i64> = Vec::new();
    for round in 0..30 {
        let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(&body.to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        listed.extend(r.body["data"]["embeddings"].as_array().unwrap().iter().map(|row| row["id"].as_i64().unwrap()));
        let d = writer.call("DELETE", "/api/v1/embeddings/docs/delete", Some(r#"{"ids":[-9223372036854775808]}"#));
        assert_eq!(d.status, 200, "{d:?}");
        put(&mut writer, "docs", "insert", &[(i64::MIN, vector(&mut rng, DIMS), metadata_of(0, 0))]);
        put(&mut writer, "docs", "upsert", &[(i64::MAX - 3 - round, vector(&mut rng, DIMS), metadata_of(1, 0))]);
        match r.body["data"]["next"].as_i64() {
            Some(next) => body["after"] = json!(next),
            None => break,
        }
        assert!(round < 29, "the scroll ends");
    }
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "ascending, each once: {listed:?}");
    assert_eq!(listed.first(), Some(&i64::MIN));
    for id in ends {
        assert!(listed.contains(&id), "row {id} stayed throughout and was not listed: {listed:?}");
    }
}

fn restart(data_dir: &Path) -> Server {
    Server::start_in(None, data_dir.to_owned(), &["--api-key", KEY], &[])
}

#[test]
fn delete_by_filter_is_one_durable_write() {
    let mut rng = Rng(800);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (server, mut client, mut rows) = rows_into(restart(&data_dir), Metric::Cosine, 600, &mut rng);
    let filter = json!({"$or": [{"cat": {"$in": ["c1", "c2"]}}, {"year": {"$lt": 1995}}]});
    let matches = |m: &BTreeMap<String, String>| {
        is(m, "cat", "c1") || is(m, "cat", "c2") || number(m, "year").is_some_and(|y| y < 1995.0)
    };
    let n = rows.values().filter(|(_, m)| matches(m)).count();
    assert!(n > 20);
    let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(&json!({ "filter": filter }).to_string()));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.message(), format!("{n}/{n} embeddings successfully deleted."));
    assert_eq!(r.body["data"], json!({ "deleted": n }));
    rows.retain(|_, (_, m)| !matches(m));
    let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(&json!({ "filter": filter }).to_string()));
    assert_eq!((r.message(), &r.body["data"]), ("0/0 embeddings successfully deleted.", &json!({"deleted": 0})));
    // Answered, so it survives kill -9: the log replays it.
    server.kill();
    let server = restart(&data_dir);
    let mut client = server.connect();
    let stats = client.call("GET", "/api/v1/indexes/docs/stats", None);
    assert_eq!(stats.body["data"]["count"], rows.len(), "{stats:?}");
    check_cases(&mut client, "docs", Metric::Cosine, &rows, &mut rng, 1);
    // Through a snapshot too: a clean stop writes one, the start loads it.
    assert!(server.terminate().success());
    let server = restart(&data_dir);
    let mut client = server.connect();
    check_cases(&mut client, "docs", Metric::Cosine, &rows, &mut rng, 1);
    // `{}` deletes every row.
    let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(r#"{"filter":{}}"#));
    assert_eq!(r.body["data"]["deleted"], rows.len());
    let stats = client.call("GET", "/api/v1/indexes/docs/stats", None);
    assert_eq!(stats.body["data"]["count"], 0);
}

#[test]
fn bad_filters_are_refused_naming_the_place() {
    let mut rng = Rng(900);
    let (_server, mut client, _) = server_with_rows(Metric::L2, 10, &mut rng, &["--filter-terms-max", "8"]);
    let query = vector(&mut rng, DIMS);
    let cases = [
        (json!([]), "filter: expected a JSON object"),
        (json!("en"), "filter: expected a JSON object"),
        (json!({"year": {"$gtt": 1}}), "filter.year: unknown operator '$gtt'"),
        (json!({"$and": [{"a": "b"}, {"year": {"$gtt": 1}}]}), "filter.$and[1].year: unknown operator '$gtt'"),
        (json!({"$nor": []}), "filter: unknown operator '$nor'"),
        (json!({"$and": []}), "filter.$and: expected a non-empty array of filters"),
        (json!({"$or": {"a": "b"}}), "filter.$or: expected a non-empty array of filters"),
        (json!({"$or": ["a"]}), "filter.$or[0]: expected a JSON object"),
        (json!({"$not": "a"}), "filter.$not: expected a JSON object"),
        (json!({"year": {}}), "filter.year: expected at least one operator"),
        (json!({"year": null}), "filter.year: expected a string, number, boolean or an object of operators"),
        (json!({"year": ["2001"]}), "filter.year: expected a string, number, boolean or an object of operators"),
        (json!({"year": {"$gt": "2001"}}), "filter.year.$gt: expected a number"),
        (json!({"year": {"$eq": null}}), "filter.year.$eq: expected a string, number or boolean"),
        (json!({"year": {"$ne": [2001]}}), "filter.year.$ne: expected a string, number or boolean"),
        (json!({"year": {"$in": "2001"}}), "filter.year.$in: expected an array of strings, numbers or booleans"),
        (json!({"year": {"$nin": ["a", {}]}}), "filter.year.$nin[1]: expected a string, number or boolean"),
        (json!({"tags": {"$contains": 1}}), "filter.tags.$contains: expected a string"),
        (json!({"year": {"$exists": 1}}), "filter.year.$exists: expected true or false"),
        (
            json!({"cat": {"$in": ["1", "2", "3", "4", "5", "6", "7", "8"]}}),
            "filter.cat.$in: the filter has more than 8 terms",
        ),
        (
            json!({"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"a": "b"}}}}}}}}),
            "filter.$not.$not.$not.$not.$not.$not.$not: filters nested deeper than 6 levels",
        ),
    ];
    for (filter, detail) in cases {
        let body = json!({"queryVector": query, "k": 3, "filter": filter}).to_string();
        let r = client.call("POST", "/api/v1/embeddings/docs/search", Some(&body));
        assert_eq!((r.status, r.code(), r.detail()), (400, "INVALID_REQUEST_BODY", detail), "{filter}");
        assert!(r.body.get("data").is_none(), "a 400 carries no data");
        // The same in a batch, scroll and delete, and nothing deleted.
        let body =
            json!({"searches": [{"queryVector": query, "k": 1}, {"queryVector": query, "k": 3, "filter": filter}]});
        let r = client.call("POST", "/api/v1/embeddings/docs/search-batch", Some(&body.to_string()));
        assert_eq!((r.status, r.detail()), (400, format!("searches[1].{detail}").as_str()));
        let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(&json!({ "filter": filter }).to_string()));
        assert_eq!((r.status, r.detail()), (400, detail));
        let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(&json!({ "filter": filter }).to_string()));
        assert_eq!((r.status, r.detail()), (400, detail));
    }
    const NEITHER: &str =
        "body: expected ids (an array of 64-bit integers) or filter (a filter object); neither was given";
    let bodies = [
        (r#"{"ids":[1],"filter":{}}"#, "body: expected either ids or filter, not both"),
        (r#"{"ids":null,"filter":null}"#, NEITHER),
        ("{}", NEITHER),
        (r#"{"ids":[1],"filters":{}}"#, "filters: unknown field (did you mean 'filter'?)"),
    ];
    for (body, detail) in bodies {
        let r = client.call("DELETE", "/api/v1/embeddings/docs/delete", Some(body));
        assert_eq!((r.status, r.detail()), (400, detail), "{body}");
    }
    let scrolls = [
        (r#"{"limit":0}"#, "limit: expected an integer from 1 to 10000"),
        (r#"{"limit":10001}"#, "limit: expected an integer from 1 to 10000"),
        (r#"{"limit":"5"}"#, "limit: expected an integer from 1 to 10000"),
        (r#"{"after":1.5}"#, "after: expected a 64-bit integer"),
        (r#"{"after":9223372036854775808}"#, "after: expected a 64-bit integer"),
        (r#"{"include":["score"]}"#, r#"include[0]: unknown value 'score'; allowed: "data""#),
        (r#"{"include":"data"}"#, r#"include: expected an array of "data""#),
        ("[]", "body: expected a JSON object"),
    ];
    for (body, detail) in scrolls {
        let r = client.call("POST", "/api/v1/embeddings/docs/scroll", Some(body));
        assert_eq!((r.status, r.detail()), (400, detail), "{body}");
    }
    let stats = client.call("GET", "/api/v1/indexes/docs/stats", None);
    assert_eq!(stats.body["data"]["count"], 10, "nothing deleted");
    let r = client.call("POST", "/api/v1/embeddings/nothere/scroll", Some("{}"));
    assert_eq!((r.status, r.code()), (500, "INDEX_NOT_FETCHED"));
}
