//! A reply's size is a limit: a retrieve or search that would build more
//! than `--reply-bytes-max` is refused before anything is built, saying how
//! many ids or hits fit; asking for that many works, and fits.

use serde_json::json;

use crate::harness::{create_index, Client, Response, Server};

const REPLY_BYTES_MAX: usize = 65_536;
const DIMS: usize = 64;

/// Bytes on the wire: the head and the body.
fn reply_bytes(r: &Response) -> usize {
    r.head.len() + r.header("Content-Length").unwrap().trim().parse::<usize>().unwrap()
}

/// The count in "ask for at most N <what> per request".
fn fit(r: &Response) -> usize {
    let description = r.body["error"]["description"].as_str().unwrap();
    let (_, rest) = description.split_once("ask for at most ").unwrap_or_else(|| panic!("{description}"));
    rest.split(' ').next().unwrap().parse().unwrap()
}

/// An index of rows whose values take the longest text an f32 can, and
/// whose metadata is long, so that the bound is tested where it is tightest.
fn server_with_rows(rows: i64) -> (Server, Client) {
    let server = Server::start_with(&["--reply-bytes-max", &REPLY_BYTES_MAX.to_string()]);
    create_index(&server, "wide", DIMS, "l2");
    let mut client = server.connect();
    let longest = -1.175_494_4e-38_f32; // -1.17549435e-38
    let embeddings: Vec<_> = (0..rows)
        .map(|id| json!({"id": -9_000_000_000_000_000_000 - id, "data": vec![longest; DIMS], "metadata": {"note": "x".repeat(300)}}))
        .collect();
    let r = client.call("PUT", "/api/v1/embeddings/wide/insert", Some(&json!({"embeddings": embeddings}).to_string()));
    assert_eq!(r.status, 200, "{r:?}");
    (server, client)
}

#[test]
fn a_retrieve_past_the_limit_is_refused_saying_how_many_ids_fit() {
    let (_server, mut client) = server_with_rows(200);
    let ids: Vec<i64> = (0..200).map(|id| -9_000_000_000_000_000_000 - id).collect();
    let r = client.call("POST", "/api/v1/embeddings/wide/retrieve", Some(&json!({"ids": ids}).to_string()));
    assert_eq!((r.status, r.code(), r.message()), (400, "REPLY_TOO_LARGE", "Reply too large"), "{r:?}");
    assert!(r.body["error"]["description"].as_str().unwrap().contains("--reply-bytes-max"), "{r:?}");
    let fit = fit(&r);
    assert!(fit > 10 && fit < 200, "{r:?}");
    // That many fit, within the limit; and the pages together give every row.
    let mut seen = 0;
    for page in ids.chunks(fit) {
        let r = client.call("POST", "/api/v1/embeddings/wide/retrieve", Some(&json!({"ids": page}).to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        assert!(reply_bytes(&r) <= REPLY_BYTES_MAX, "{} bytes", reply_bytes(&r));
        seen += r.body["data"]["embeddings"].as_array().unwrap().len();
    }
    assert_eq!(seen, 200);
}

#[test]
fn a_search_past_the_limit_is_refused_saying_how_many_hits_fit() {
    let (_server, mut client) = server_with_rows(400);
    // Plain hits, then hits with their scores and vectors: fewer fit.
    let mut fits = Vec::new();
    for include in [json!(null), json!(["score", "data"])] {
        let search = |client: &mut Client, k: usize| {
            let body = json!({"queryVector": vec![0.5; DIMS], "k": k, "include": include}).to_string();
            client.call("POST", "/api/v1/embeddings/wide/search", Some(&body))
        };
        let r = search(&mut client, 400);
        assert_eq!((r.status, r.code()), (400, "REPLY_TOO_LARGE"), "{r:?}");
        let fit = fit(&r);
        assert!(fit > 10 && fit < 400, "{r:?}");
        let r = search(&mut client, fit);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body["data"]["nearest_neighbors"].as_object().unwrap().len(), fit);
        assert!(reply_bytes(&r) <= REPLY_BYTES_MAX, "{include}: {} bytes", reply_bytes(&r));
        fits.push(fit);
    }
    assert!(fits[1] < fits[0], "{fits:?}");
    // Other clients are answered as usual meanwhile.
    assert_eq!(client.call("GET", "/api/v1/health", None).status, 200);
}

/// A search batch is bounded by all its hits together: refused before the
/// scan when even the shortest hits could not fit, after it otherwise; the
/// count the error gives, shared among the searches, fits.
#[test]
fn a_search_batch_past_the_limit_is_refused_saying_how_many_hits_fit() {
    let (_server, mut client) = server_with_rows(400);
    let batch = |client: &mut Client, ks: &[usize]| {
        let searches: Vec<_> = ks.iter().map(|&k| json!({"queryVector": vec![0.5; DIMS], "k": k})).collect();
        let body = json!({ "searches": searches }).to_string();
        client.call("POST", "/api/v1/embeddings/wide/search-batch", Some(&body))
    };
    // 64 x 400 hits of at least 28 bytes each: refused before any scan.
    let r = batch(&mut client, &[400; 64]);
    assert_eq!((r.status, r.code()), (400, "REPLY_TOO_LARGE"), "{r:?}");
    assert!(r.body["error"]["description"].as_str().unwrap().contains("hits in all"), "{r:?}");
    // Two searches of 400 long hits: refused once their hits are known.
    let r = batch(&mut client, &[400, 400]);
    assert_eq!((r.status, r.code()), (400, "REPLY_TOO_LARGE"), "{r:?}");
    let fit = fit(&r);
    assert!(fit > 10 && fit < 800, "{r:?}");
    let r = batch(&mut client, &[fit / 2, fit - fit / 2]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(reply_bytes(&r) <= REPLY_BYTES_MAX, "{} bytes", reply_bytes(&r));
}

/// A scroll page stops short of the limit instead: fewer rows than asked
/// for, `next` set, and every row still listed once page after page. A row
/// that cannot fit alone is refused, saying so.
#[test]
fn a_scroll_page_stops_short_of_the_limit_and_paging_lists_every_row() {
    let (server, mut client) = server_with_rows(200);
    let mut body = json!({"limit": 10_000, "include": ["data"]});
    let (mut listed, mut pages) = (Vec::new(), 0);
    loop {
        let r = client.call("POST", "/api/v1/embeddings/wide/scroll", Some(&body.to_string()));
        assert_eq!(r.status, 200, "{r:?}");
        assert!(reply_bytes(&r) <= REPLY_BYTES_MAX, "{} bytes", reply_bytes(&r));
        let page = r.body["data"]["embeddings"].as_array().unwrap();
        assert!(!page.is_empty() && page.len() < 200, "{} rows", page.len());
        listed.extend(page.iter().map(|row| row["id"].as_i64().unwrap()));
        pages += 1;
        if r.body["data"]["next"].is_null() {
            break;
        }
        body["after"] = r.body["data"]["next"].clone();
    }
    assert!(pages > 1);
    let want: Vec<i64> = (0..200).rev().map(|id| -9_000_000_000_000_000_000 - id).collect();
    assert_eq!(listed, want, "every row once, ascending");
    drop(client);
    drop(server);

    let server = Server::start_with(&["--reply-bytes-max", &REPLY_BYTES_MAX.to_string()]);
    create_index(&server, "huge", 5000, "l2");
    let mut client = server.connect();
    let row = json!({"embeddings": [{"id": 1, "data": vec![0.5; 5000]}]}).to_string();
    assert_eq!(client.call("PUT", "/api/v1/embeddings/huge/insert", Some(&row)).status, 200);
    let r = client.call("POST", "/api/v1/embeddings/huge/scroll", Some(r#"{"include":["data"]}"#));
    assert_eq!((r.status, r.code()), (400, "REPLY_TOO_LARGE"), "{r:?}");
    let description = r.body["error"]["description"].as_str().unwrap();
    assert!(description.ends_with("not even one of the rows with their vectors fits"), "{description}");
    let r = client.call("POST", "/api/v1/embeddings/huge/scroll", Some("{}"));
    assert_eq!(
        r.body["data"],
        json!({"embeddings": [{"id": 1, "metadata": {}}], "next": null}),
        "without data it fits"
    );
}
