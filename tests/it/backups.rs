//! Backups while serving: `GET /api/v1/indexes/{name}/snapshot` streams an
//! index's consistent snapshot image while writes go on, and `PUT
//! /api/v1/indexes/{name}/restore` makes a new index of one, durably and
//! bit for bit; a damaged or foreign image is refused whole.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{create_index, Server, KEY};

/// The key header, for `call_bytes`.
const WITH_KEY: &[(&str, &str)] = &[("X-Service-API-Key", KEY)];

fn download(server: &Server, name: &str) -> (u16, String, Vec<u8>) {
    server.connect().call_bytes("GET", &format!("/api/v1/indexes/{name}/snapshot"), WITH_KEY, b"")
}

fn restore(server: &Server, name: &str, image: &[u8]) -> (u16, Value) {
    let (status, _, body) =
        server.connect().call_bytes("PUT", &format!("/api/v1/indexes/{name}/restore"), WITH_KEY, image);
    (status, serde_json::from_slice(&body).unwrap())
}

/// Every row of an index, by id, as scroll gives it (vector and metadata).
fn rows(server: &Server, name: &str) -> BTreeMap<i64, Value> {
    let mut all = BTreeMap::new();
    let mut after: Option<i64> = None;
    loop {
        let body = match after {
            Some(id) => format!(r#"{{"include":["data"],"limit":1000,"after":{id}}}"#),
            None => r#"{"include":["data"],"limit":1000}"#.to_owned(),
        };
        let r = server.call("POST", &format!("/api/v1/embeddings/{name}/scroll"), Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
        let page = r.body["data"]["embeddings"].as_array().unwrap().clone();
        for row in &page {
            all.insert(row["id"].as_i64().unwrap(), row.clone());
        }
        match r.body["data"]["next"].as_i64() {
            Some(next) if !page.is_empty() => after = Some(next),
            _ => return all,
        }
    }
}

/// A snapshot image built by hand (`snapshot.rs`'s layout), for attacks
/// with a good checksum.
fn image(dims: u32, metric: u8, rows: &[(i64, Vec<f32>, &str)]) -> Vec<u8> {
    let mut out = b"QUIVSNP1".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&dims.to_le_bytes());
    out.extend_from_slice(&[metric, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    for (id, _, _) in rows {
        out.extend_from_slice(&id.to_le_bytes());
    }
    for (_, vector, _) in rows {
        for x in vector {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    for (_, _, metadata) in rows {
        out.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
        out.extend_from_slice(metadata.as_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn a_download_restores_bit_for_bit_and_survives_kill_nine() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start_in(None, data_dir.clone(), &["--api-key", KEY], &[]);
    for (name, metric) in [("cos", "cosine"), ("euclid", "l2"), ("dot", "ip")] {
        create_index(&server, name, 5, metric);
        let embeddings: Vec<String> = (0..300)
            .map(|i: i64| {
                let id = i * 7919 - 1000;
                let data: Vec<String> =
                    (0..5).map(|d| format!("{}", ((i * 31 + d * 17) % 23) as f32 * 0.37 - 3.1)).collect();
                let metadata = match i % 3 {
                    0 => format!(r#","metadata":{{"tag":"t{}","n":{},"ok":true,"list":["a","b"]}}"#, i % 5, i),
                    1 => r#","metadata":{"é":"\"quoted\"\n"}"#.to_owned(),
                    _ => String::new(),
                };
                format!(r#"{{"id":{id},"data":[{}]{metadata}}}"#, data.join(","))
            })
            .collect();
        let body = format!(r#"{{"embeddings":[{}]}}"#, embeddings.join(","));
        let r = server.call("PUT", &format!("/api/v1/embeddings/{name}/insert"), Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
    }
    for name in ["cos", "euclid", "dot"] {
        let (status, head, first) = download(&server, name);
        assert_eq!(status, 200, "{head}");
        assert!(
            head.contains("Content-Type: application/octet-stream") && head.contains("Connection: close"),
            "{head}"
        );
        let copy = format!("{name}-copy");
        let (status, body) = restore(&server, &copy, &first);
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["message"], format!("Index '{copy}' restored with 300 embeddings."));
        let (_, _, second) = download(&server, &copy);
        assert!(first == second, "the restored index's image differs from the original's");
        assert_eq!(rows(&server, name), rows(&server, &copy));
        let stats = |n: &str| server.call("GET", &format!("/api/v1/indexes/{n}/stats"), None).body["data"].clone();
        let (mut original, mut restored) = (stats(name), stats(&copy));
        original["index_name"] = Value::Null;
        restored["index_name"] = Value::Null;
        assert_eq!(original, restored);
        // Searches answer the same, each checked against the oracle by the
        // search tests; here the two indexes agree hit for hit.
        for query in ["[1,2,3,4,5]", "[-3,0.5,0,2,1]"] {
            let search = format!(r#"{{"queryVector":{query},"k":25}}"#);
            let a = server.call("POST", &format!("/api/v1/embeddings/{name}/search"), Some(&search));
            let b = server.call("POST", &format!("/api/v1/embeddings/{copy}/search"), Some(&search));
            assert_eq!((a.status, &a.body["data"]), (200, &b.body["data"]));
        }
    }
    // Acknowledged, so durable: a kill -9 and a restart keep it whole.
    let (_, _, before) = download(&server, "cos-copy");
    server.kill();
    let again = Server::start_in(None, data_dir, &["--api-key", KEY], &[]);
    let (status, _, after) = download(&again, "cos-copy");
    assert_eq!(status, 200);
    assert!(before == after, "the restore did not survive kill -9 whole");
}

/// Rows inserted one request at a time while downloads run: each image
/// holds exactly the rows of one moment (a prefix of the ids, every
/// vector as written), and the writes go on meanwhile.
#[test]
fn downloads_are_consistent_while_writes_go_on() {
    let server = Server::start();
    const DIMS: usize = 64;
    create_index(&server, "moving", DIMS, "l2");
    let vector = |id: usize| -> Vec<f32> { (0..DIMS).map(|d| (id * DIMS + d) as f32 * 0.5).collect() };
    let insert = |server: &Server, ids: std::ops::Range<usize>| {
        let items: Vec<String> = ids
            .map(|id| {
                let data: Vec<String> = vector(id).iter().map(f32::to_string).collect();
                format!(r#"{{"id":{id},"data":[{}]}}"#, data.join(","))
            })
            .collect();
        let r = server.call(
            "PUT",
            "/api/v1/embeddings/moving/insert",
            Some(&format!(r#"{{"embeddings":[{}]}}"#, items.join(","))),
        );
        assert_eq!(r.status, 200, "{r:?}");
    };
    insert(&server, 0..4000);
    let deadline = Instant::now() + Duration::from_secs(60);
    let images = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for id in 4000..4400 {
                insert(&server, id..id + 1);
            }
        });
        let mut images = Vec::new();
        while !writer.is_finished() && images.len() < 20 && Instant::now() < deadline {
            let (status, head, image) = download(&server, "moving");
            assert_eq!(status, 200, "{head}");
            images.push(image);
        }
        writer.join().unwrap();
        images
    });
    assert!(!images.is_empty());
    for (n, image) in images.iter().enumerate() {
        let name = format!("moment-{n}");
        let (status, body) = restore(&server, &name, image);
        assert_eq!(status, 200, "{body}");
        let restored = rows(&server, &name);
        let count = restored.len();
        assert!((4000..=4400).contains(&count), "{count}");
        for (expected, (&id, row)) in restored.iter().enumerate() {
            assert_eq!(id, expected as i64, "image {n} is not one moment's rows: id {id} without {expected}");
            let data: Vec<f32> = row["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            assert_eq!(data, vector(expected), "image {n}, id {id}");
        }
    }
    assert_eq!(rows(&server, "moving").len(), 4400);
}

/// A damaged, cut, foreign or doctored image is refused whole with a clear
/// detail, and nothing is created; names and keys are checked as for
/// create.
#[test]
fn restores_refuse_what_an_upsert_would_refuse() {
    let server = Server::start_with(&["--read-only-api-key", "reader-key-0123456789"]);
    create_index(&server, "kept", 2, "cosine");
    let r = server.call(
        "PUT",
        "/api/v1/embeddings/kept/insert",
        Some(r#"{"embeddings":[{"id":1,"data":[1,2],"metadata":{"a":"b"}}]}"#),
    );
    assert_eq!(r.status, 200);
    let (_, _, good) = download(&server, "kept");
    let mut flipped = good.clone();
    flipped[40] ^= 1;
    let good_metadata = r#"{"a":"b"}"#;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("flipped", flipped, "checksum mismatch"),
        ("cut", good[..good.len() - 9].to_vec(), "cut short"),
        ("empty", Vec::new(), "not a quiver index snapshot"),
        ("foreign", b"{\"embeddings\":[]}".to_vec(), "not a quiver index snapshot"),
        ("nan", image(2, 1, &[(1, vec![f32::NAN, 1.0], "")]), "row 0 (id 1): "),
        ("zero", image(2, 0, &[(5, vec![1.0, 1.0], ""), (6, vec![0.0, 0.0], "")]), "row 1 (id 6): "),
        ("huge", image(2, 1, &[(1, vec![f32::MAX, f32::MAX], "")]), "row 0 (id 1): "),
        ("twice", image(2, 1, &[(3, vec![1.0, 1.0], ""), (3, vec![2.0, 1.0], "")]), "id 3 appears twice"),
        ("badmeta", image(2, 1, &[(1, vec![1.0, 1.0], "{\"a\":")]), "row 0 (id 1): "),
        ("objmeta", image(2, 1, &[(1, vec![1.0, 1.0], r#"{"a":{"b":1}}"#)]), "row 0 (id 1): metadata.a"),
        ("spaced", image(2, 1, &[(1, vec![1.0, 1.0], r#"{ "a":"b"}"#)]), "not in the form this server stores"),
        ("metric", image(2, 99, &[(1, vec![1.0, 1.0], good_metadata)]), "unknown metric"),
        ("trailing", [good.clone(), b"junk".to_vec()].concat(), "4 bytes follow its checksum"),
    ];
    for (name, bytes, said) in &cases {
        let name = format!("bad-{name}");
        let (status, body) = restore(&server, &name, bytes);
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("INVALID_REQUEST_BODY")), "{name}: {body}");
        let detail = body["error"]["detail"].as_str().unwrap();
        assert!(detail.contains(said), "{name}: {detail}");
    }
    let list = server.call("GET", "/api/v1/indexes/list", None);
    assert_eq!(list.body["data"]["indexes"], serde_json::json!(["kept"]), "nothing half-restored");
    // A good hand-made image is taken, so the attacks failed on their one fault.
    let (status, body) = restore(&server, "handmade", &image(2, 1, &[(1, vec![1.0, 1.0], good_metadata)]));
    assert_eq!(status, 200, "{body}");

    let (status, body) = restore(&server, "kept", &good);
    assert_eq!((status, body["error"]["description"].as_str()), (500, Some("index 'kept' already exists")));
    let (status, body) = restore(&server, "No_Such", &good);
    assert_eq!((status, body["error"]["code"].as_str()), (500, Some("INDEX_NOT_CREATED")));
    let (status, _, body) = download(&server, "nowhere");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (500, Some("INDEX_NOT_FETCHED")));
    // The read-only key may download, not restore; no key, neither.
    let reader = &[("X-Service-API-Key", "reader-key-0123456789")];
    let (status, _, image) = server.connect().call_bytes("GET", "/api/v1/indexes/kept/snapshot", reader, b"");
    assert_eq!((status, &image), (200, &good));
    let (status, _, body) = server.connect().call_bytes("PUT", "/api/v1/indexes/other/restore", reader, &good);
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
    let (status, _, _) = server.connect().call_bytes("GET", "/api/v1/indexes/kept/snapshot", &[], b"");
    assert_eq!(status, 401);
}

/// Replies owed on the connection leave first, in order; downloads that do
/// not drain hold their children, and past the limit a download is 503.
#[test]
fn pipelined_replies_come_first_and_downloads_are_bounded() {
    let server = Server::start();
    create_index(&server, "large", 1024, "l2");
    for chunk in 0..4 {
        let items: Vec<String> = (chunk * 500..chunk * 500 + 500)
            .map(|id| format!(r#"{{"id":{id},"data":[{}]}}"#, vec![format!("{}.5", id % 97); 1024].join(",")))
            .collect();
        let r = server.call(
            "PUT",
            "/api/v1/embeddings/large/insert",
            Some(&format!(r#"{{"embeddings":[{}]}}"#, items.join(","))),
        );
        assert_eq!(r.status, 200);
    }
    // Stats, then the download, on one connection: the stats answer first.
    let mut client = server.connect();
    let mut pipelined = crate::harness::request_bytes("GET", "/api/v1/indexes/large/stats", WITH_KEY, None);
    pipelined.extend(crate::harness::request_bytes("GET", "/api/v1/indexes/large/snapshot", WITH_KEY, None));
    client.send(&pipelined);
    let stats = client.read_response();
    assert_eq!(stats.body["data"]["count"], 2000);
    let (status, head, image) = client.read_frame();
    assert_eq!(status, 200, "{head}");
    assert_eq!(image.len(), 8 + 4 + 4 + 8 + 8 + 2000 * (8 + 4 * 1024 + 4) + 4);
    assert!(client.is_closed(), "a download ends its connection");

    // Four downloads nobody reads (8 MB each, more than the socket buffers) hold their children.
    let stalled: Vec<_> = (0..4)
        .map(|_| {
            let mut client = server.connect();
            client.send(&crate::harness::request_bytes("GET", "/api/v1/indexes/large/snapshot", WITH_KEY, None));
            client
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (status, _, body) = download(&server, "large");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("SNAPSHOT_UNAVAILABLE")), "{body}");
    drop(stalled);
    // Their children see the clients gone and end; downloads work again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, image) = download(&server, "large");
        if status == 200 {
            assert_eq!(image.len(), 8 + 4 + 4 + 8 + 8 + 2000 * (8 + 4 * 1024 + 4) + 4);
            break;
        }
        assert_eq!(status, 503);
        assert!(Instant::now() < deadline, "the stalled downloads' children did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `--snapshot-download-bytes-per-s` paces a download: it takes at least
/// its bytes over the rate, and what arrives restores the same rows.
/// A rate a download would be cut off below is refused at start.
#[test]
fn a_download_keeps_to_its_rate() {
    let rate = 2_000_000u64;
    let server = Server::start_with(&["--snapshot-download-bytes-per-s", &rate.to_string()]);
    create_index(&server, "paced", 768, "l2");
    let embeddings: Vec<String> = (0..400)
        .map(|i: i64| {
            let data: Vec<String> = (0..768).map(|d| format!("{}", ((i * 7 + d) % 97) as f32 * 0.25)).collect();
            format!(r#"{{"id":{i},"data":[{}]}}"#, data.join(","))
        })
        .collect();
    let body = format!(r#"{{"embeddings":[{}]}}"#, embeddings.join(","));
    assert_eq!(server.call("PUT", "/api/v1/embeddings/paced/insert", Some(&body)).status, 200);
    let started = Instant::now();
    let (status, head, image) = download(&server, "paced");
    let took = started.elapsed().as_secs_f64();
    assert_eq!(status, 200, "{head}");
    assert!(image.len() > 1_200_000, "{} bytes", image.len());
    // Only a floor: a slow machine may take longer, never less. The last
    // call's bytes arrive before the child's pause after them.
    let paced = image.len() - quiver::limits::SNAPSHOT_SEND_CALL_BYTES;
    let floor = paced as f64 / rate as f64 * 0.95;
    assert!(took >= floor, "{} bytes in {took:.3} s, faster than {rate} bytes a second", image.len());
    let (status, restored) = restore(&server, "paced-copy", &image);
    assert_eq!(status, 200, "{restored}");
    assert_eq!(rows(&server, "paced"), rows(&server, "paced-copy"));

    let dir = tempfile::tempdir().unwrap();
    for value in ["1999999", "1", "fast"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_quiver"))
            .args(["--port", "0", "--snapshot-download-bytes-per-s", value, "--data-dir"])
            .arg(dir.path().join("data"))
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{value}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains("--snapshot-download-bytes-per-s"), "{message}");
    }
    assert!(!dir.path().join("data").exists(), "nothing was written");
}

/// A fork leaves out of its child the large arrays the child never reads
/// (every index's codes; for a download, the other indexes' rows) and
/// gives them back to later forks: a download of each index after the
/// other's restores the same rows, and a snapshot after a download, which
/// reads every index's rows, is written.
#[test]
fn forks_leave_out_what_their_children_never_read_and_give_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    // Arrays of over a megabyte each, so each is a map of its own (vectors
    // 4.9 MB, codes 1.2 MB), and a snapshot every 6 MB of log.
    const DIMS: usize = 512;
    const ROWS: usize = 2400;
    let args = ["--api-key", KEY, "--snapshot-log-bytes", "6000000"];
    let server = Server::start_in(None, data_dir.clone(), &args, &[]);
    let write = |name: &str, salt: usize| {
        for first in (0..ROWS).step_by(400) {
            let items: Vec<String> = (first..first + 400)
                .map(|id| {
                    let data: Vec<String> = (0..DIMS)
                        .map(|d| (((id * 31 + d * 7 + salt) % 1009) as f32 * 0.25 - 100.0).to_string())
                        .collect();
                    format!(r#"{{"id":{id},"data":[{}],"metadata":{{"n":"{id}"}}}}"#, data.join(","))
                })
                .collect();
            let body = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
            let r = server.call("PUT", &format!("/api/v1/embeddings/{name}/upsert"), Some(&body));
            assert_eq!(r.status, 200, "{r:?}");
        }
    };
    create_index(&server, "cos", DIMS, "cosine");
    create_index(&server, "euclid", DIMS, "l2");
    write("cos", 0);
    write("euclid", 1);
    server.wait_for_log("snapshot generation 1 written", Duration::from_secs(60));
    // An index downloaded and restored as `{name}-copy`.
    let copy = |name: &str| {
        let (status, head, image) = download(&server, name);
        assert_eq!(status, 200, "{head}");
        assert_eq!(restore(&server, &format!("{name}-copy"), &image).0, 200);
    };

    copy("cos");
    assert_eq!(rows(&server, "cos-copy"), rows(&server, "cos"));
    // The next snapshot's child reads both indexes' rows.
    write("euclid", 2);
    write("cos", 3);
    server.wait_for_log("snapshot generation 2 written", Duration::from_secs(60));
    copy("euclid");
    let before: Vec<_> = ["cos", "euclid", "cos-copy", "euclid-copy"].map(|name| rows(&server, name)).into();
    assert_eq!((before[0].len(), before[1].len()), (ROWS, ROWS));
    assert_eq!(before[1], before[3]);

    // The searches still use the codes the forks left out: the nearest
    // rows, as a brute force in f64 ranks them.
    let query: Vec<f64> = (0..DIMS).map(|d| ((d * 13) % 101) as f64 - 50.0).collect();
    let mut oracle: Vec<(f64, i64)> = before[1]
        .iter()
        .map(|(&id, row)| {
            let data = row["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap());
            (data.zip(&query).map(|(x, q)| (x - q) * (x - q)).sum(), id)
        })
        .collect();
    oracle.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let search = format!(r#"{{"queryVector":{query:?},"k":5}}"#);
    let r = server.call("POST", "/api/v1/embeddings/euclid/search", Some(&search));
    assert_eq!(r.status, 200, "{r:?}");
    let hits = r.body["data"]["nearest_neighbors"].as_object().unwrap();
    for (rank, (_, id)) in oracle[..5].iter().enumerate() {
        assert_eq!(hits[&id.to_string()]["rank"], rank, "{hits:?}");
    }

    server.kill();
    let server = Server::start_in(None, data_dir, &args, &[]);
    let after: Vec<_> = ["cos", "euclid", "cos-copy", "euclid-copy"].map(|name| rows(&server, name)).into();
    assert_eq!(after, before);
}
