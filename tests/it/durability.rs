//! Durability: every answered write survives `kill -9`; restarts bring back
//! every index and embedding; torn and damaged logs are handled as promised.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{create_index, start_fails, Client, Rng, Server, KEY};

const DIMS: usize = 8;

fn start(data_dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--api-key", KEY];
    args.extend_from_slice(extra);
    Server::start_in(None, data_dir.to_owned(), &args, &[])
}

/// Every embedding of `index` among `ids`, as id -> (vector bits, metadata).
fn retrieve_all(
    client: &mut Client,
    index: &str,
    ids: impl IntoIterator<Item = i64>,
) -> BTreeMap<i64, (Vec<u32>, Value)> {
    let ids: Vec<i64> = ids.into_iter().collect();
    let r =
        client.call("POST", &format!("/api/v1/embeddings/{index}/retrieve"), Some(&json!({ "ids": ids }).to_string()));
    assert!(r.status == 200 || r.code() == "EMBEDDINGS_SKIPPED", "{r:?}");
    r.body["data"]["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let bits = e["data"].as_array().unwrap().iter().map(|x| (x.as_f64().unwrap() as f32).to_bits()).collect();
            (e["id"].as_i64().unwrap(), (bits, e["metadata"].clone()))
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn list(server: &Server) -> Value {
    server.call("GET", "/api/v1/indexes/list", None).body["data"]["indexes"].clone()
}

/// An embedding as the client wrote it: vector bits and metadata tag; `None` once deleted.
type Written = Option<(Vec<u32>, String)>;

/// The state the client knows: id -> what it last wrote there.
type Known = BTreeMap<i64, Written>;

/// One write the crash-loop client sends; `changes` is what it does if applied.
struct Op {
    body: String,
    endpoint: &'static str,
    changes: Vec<(i64, Written)>,
}

fn next_op(rng: &mut Rng, known: &Known, next_id: &mut i64, round: usize, n: usize) -> Op {
    let live: Vec<i64> = known.iter().filter(|(_, v)| v.is_some()).map(|(&id, _)| id).collect();
    match n % 3 {
        2 if live.len() > 10 => {
            let ids: Vec<i64> = (0..3)
                .map(|_| live[rng.below(live.len() as u64) as usize])
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            Op {
                body: json!({ "ids": ids }).to_string(),
                endpoint: "delete",
                changes: ids.iter().map(|&id| (id, None)).collect(),
            }
        }
        1 if !live.is_empty() => {
            let ids: Vec<i64> = (0..5)
                .map(|_| live[rng.below(live.len() as u64) as usize])
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            upsert_op(rng, &ids, round, n, "upsert")
        }
        _ => {
            let ids: Vec<i64> = (0..20)
                .map(|_| {
                    *next_id += 1;
                    *next_id
                })
                .collect();
            upsert_op(rng, &ids, round, n, "insert")
        }
    }
}

fn upsert_op(rng: &mut Rng, ids: &[i64], round: usize, n: usize, endpoint: &'static str) -> Op {
    let mut embeddings = Vec::new();
    let mut changes = Vec::new();
    for &id in ids {
        let vector: Vec<f32> = (0..DIMS).map(|_| rng.float()).collect();
        let tag = format!("r{round}-n{n}-{id}");
        embeddings.push(json!({"id": id, "data": vector, "metadata": {"tag": tag}}));
        changes.push((id, Some((bits(&vector), tag))));
    }
    Op { body: json!({ "embeddings": embeddings }).to_string(), endpoint, changes }
}

fn matches_state(got: Option<&(Vec<u32>, Value)>, want: &Written) -> bool {
    match (got, want) {
        (None, None) => true,
        (Some((vector, metadata)), Some((want_vector, tag))) => {
            vector == want_vector && metadata == &json!({ "tag": tag })
        }
        _ => false,
    }
}

#[test]
fn kill_9_at_random_moments_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut rng = Rng(99);
    let mut known = Known::new();
    let mut next_id = 0i64;
    // A small snapshot threshold, so crashes also land around snapshots.
    let flags = ["--snapshot-log-bytes", "60000"];
    {
        let server = start(&data_dir, &flags);
        create_index(&server, "crash", DIMS, "l2");
    }
    for round in 0..24 {
        let server = start(&data_dir, &flags);
        let mut client = server.connect();

        // Everything acknowledged before is there, exactly.
        let state = retrieve_all(&mut client, "crash", known.keys().copied());
        for (id, want) in &known {
            assert!(
                matches_state(state.get(id), want),
                "round {round}: id {id} is {:?}, expected {want:?}",
                state.get(id)
            );
        }

        // Write until killed, from another thread; the last write may be unacknowledged.
        let shared = Arc::new(Mutex::new((known.clone(), None::<Op>, rng.next_u64(), next_id)));
        let writer = {
            let shared = Arc::clone(&shared);
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut client = Client::connect(addr);
                for n in 0.. {
                    let op = {
                        let mut guard = shared.lock().unwrap();
                        let (known, pending, seed, next_id) = &mut *guard;
                        let mut rng = Rng(*seed + n as u64);
                        let op = next_op(&mut rng, known, next_id, round, n);
                        *pending =
                            Some(Op { body: op.body.clone(), endpoint: op.endpoint, changes: op.changes.clone() });
                        op
                    };
                    let method = if op.endpoint == "delete" { "DELETE" } else { "PUT" };
                    let request = crate::harness::request_bytes(
                        method,
                        &format!("/api/v1/embeddings/crash/{}", op.endpoint),
                        &[("X-Service-API-Key", KEY)],
                        Some(&op.body),
                    );
                    if std::io::Write::write_all(&mut client.stream, &request).is_err() {
                        return;
                    }
                    let Ok(response) =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| client.read_response()))
                    else {
                        return;
                    };
                    assert_eq!(response.status, 200, "{response:?}");
                    let mut guard = shared.lock().unwrap();
                    let (known, pending, _, _) = &mut *guard;
                    for (id, change) in op.changes {
                        known.insert(id, change);
                    }
                    *pending = None;
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20 + rng.below(150)));
        server.kill();
        let _ = writer.join();
        let (acknowledged, pending, _, last_id) = Arc::try_unwrap(shared).ok().unwrap().into_inner().unwrap();
        next_id = last_id;

        // The unacknowledged write is there whole or not at all.
        let server = start(&data_dir, &flags);
        let mut client = server.connect();
        known = acknowledged;
        if let Some(op) = pending {
            let ids: Vec<i64> = op.changes.iter().map(|(id, _)| *id).collect();
            let state = retrieve_all(&mut client, "crash", ids.iter().copied());
            let applied = op.changes.iter().all(|(id, new)| matches_state(state.get(id), new));
            let absent = op.changes.iter().all(|(id, _)| matches_state(state.get(id), known.get(id).unwrap_or(&None)));
            assert!(applied || absent, "round {round}: an unacknowledged write is half there: {state:?}");
            if applied {
                for (id, change) in op.changes {
                    known.insert(id, change);
                }
            }
        }
        server.kill();
    }
    assert!(known.values().filter(|v| v.is_some()).count() > 100, "the crash loop wrote too little to prove anything");
}

/// The only log segment with records in it, and its length.
fn segment_with_records(data_dir: &Path) -> (PathBuf, u64) {
    let mut found: Vec<(PathBuf, u64)> = fs::read_dir(data_dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let len = fs::metadata(&p).unwrap().len();
            (p, len)
        })
        .filter(|(_, len)| *len > 16)
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A data directory holding: index `torn`, then three single-item inserts.
/// Returns the segment path and where each record ends.
fn three_inserts(data_dir: &Path) -> (PathBuf, Vec<u64>) {
    let server = start(data_dir, &[]);
    create_index(&server, "torn", 2, "ip");
    let mut ends = vec![segment_with_records(data_dir).1];
    for id in 1..=3 {
        let body = format!(r#"{{"embeddings":[{{"id":{id},"data":[{id},0.5],"metadata":{{"n":"{id}"}}}}]}}"#);
        assert_eq!(server.call("PUT", "/api/v1/embeddings/torn/insert", Some(&body)).status, 200);
        // The answer came after the sync: the file already holds the record.
        ends.push(segment_with_records(data_dir).1);
    }
    server.kill();
    (segment_with_records(data_dir).0, ends)
}

#[test]
fn a_log_cut_anywhere_inside_its_last_record_recovers_the_records_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    let (segment, ends) = three_inserts(&original);
    let (last_start, last_end) = (ends[2], ends[3]);
    for cut in last_start..last_end {
        let copy = dir.path().join(format!("cut-{cut}"));
        copy_dir(&original, &copy);
        let copied_segment = copy.join("wal").join(segment.file_name().unwrap());
        fs::OpenOptions::new().write(true).open(&copied_segment).unwrap().set_len(cut).unwrap();
        let server = start(&copy, &[]);
        let state = retrieve_all(&mut server.connect(), "torn", [1, 2, 3]);
        assert_eq!(state.keys().copied().collect::<Vec<_>>(), vec![1, 2], "cut at {cut}");
        assert_eq!(state[&2].1, json!({"n": "2"}));
        if cut > last_start {
            assert!(server.log().contains("cut a torn record"), "cut at {cut}: {}", server.log());
        }
        server.kill();
        fs::remove_dir_all(&copy).unwrap();
    }
}

#[test]
fn damage_before_the_end_stops_the_start_unless_repair_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (segment, ends) = three_inserts(&data_dir);
    // Flip a byte inside the second record (the first insert).
    let offset = (ends[0] + ends[1]) / 2;
    let mut bytes = fs::read(&segment).unwrap();
    bytes[offset as usize] ^= 0x10;
    fs::write(&segment, &bytes).unwrap();

    let message = start_fails(&data_dir, "0", &[]);
    assert!(message.contains(&segment.display().to_string()), "{message}");
    assert!(message.contains(&format!("offset {}", ends[0])), "{message}");
    assert!(message.contains("--repair-log"), "{message}");

    let server = start(&data_dir, &["--repair-log"]);
    assert!(server.log().contains("--repair-log cut the log"), "{}", server.log());
    assert_eq!(list(&server), json!(["torn"]));
    assert!(retrieve_all(&mut server.connect(), "torn", [1, 2, 3]).is_empty());
}

#[test]
fn snapshot_then_more_writes_then_crash_restores_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = start(&data_dir, &["--snapshot-log-bytes", "20000"]);
    create_index(&server, "snap", DIMS, "cosine");
    create_index(&server, "other", 3, "l2");
    let mut rng = Rng(5);
    let mut client = server.connect();
    let mut write = |client: &mut Client, from: i64, to: i64| {
        let embeddings: Vec<Value> = (from..to)
            .map(|id| json!({"id": id, "data": (0..DIMS).map(|_| rng.float()).collect::<Vec<f32>>(), "metadata": {"i": id.to_string()}}))
            .collect();
        let r = client.call(
            "PUT",
            "/api/v1/embeddings/snap/upsert",
            Some(&json!({ "embeddings": embeddings }).to_string()),
        );
        assert_eq!(r.status, 200);
    };
    for batch in 0..10 {
        write(&mut client, batch * 50, batch * 50 + 50);
    }
    server.wait_for_log("snapshot generation 1 written", Duration::from_secs(20));
    // More writes after the snapshot: updates, deletes, new rows, a new index.
    write(&mut client, 100, 700);
    let r = client.call("DELETE", "/api/v1/embeddings/snap/delete", Some(r#"{"ids":[0,1,2,650,651]}"#));
    assert_eq!(r.status, 200);
    create_index(&server, "late", 2, "ip");
    let before = retrieve_all(&mut client, "snap", 0..800);
    assert_eq!(before.len(), 695);
    server.kill();

    let server = start(&data_dir, &[]);
    assert_eq!(list(&server), json!(["late", "other", "snap"]));
    let after = retrieve_all(&mut server.connect(), "snap", 0..800);
    assert_eq!(after, before);
    let stats = server.call("GET", "/api/v1/indexes/other/stats", None);
    assert_eq!(
        (stats.body["data"]["dimensions"].as_u64(), stats.body["data"]["metric"].as_str()),
        (Some(3), Some("l2"))
    );
    // A graceful stop writes a final snapshot; the next start loads it whole.
    assert_eq!(server.terminate().code(), Some(0));
    let server = start(&data_dir, &[]);
    assert!(server.log().contains("replayed 0 log records"), "{}", server.log());
    assert_eq!(retrieve_all(&mut server.connect(), "snap", 0..800), before);
}

#[test]
fn a_deleted_index_stays_deleted_and_leaves_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = start(&data_dir, &[]);
    create_index(&server, "keep", 2, "l2");
    create_index(&server, "doomed", 2, "l2");
    server.call("PUT", "/api/v1/embeddings/doomed/insert", Some(r#"{"embeddings":[{"id":1,"data":[1,2]}]}"#));
    server.terminate();
    let snapshots = || -> Vec<String> {
        fs::read_dir(data_dir.join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert!(snapshots().iter().any(|f| f.contains("doomed")));

    let server = start(&data_dir, &[]);
    assert_eq!(server.call("DELETE", "/api/v1/indexes/doomed/delete", None).status, 200);
    // The snapshot goes in the same turn of the loop, just after the answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while snapshots().iter().any(|f| f.contains("doomed")) {
        assert!(std::time::Instant::now() < deadline, "{:?}", snapshots());
        std::thread::sleep(Duration::from_millis(10));
    }
    server.kill();

    let server = start(&data_dir, &[]);
    assert_eq!(list(&server), json!(["keep"]));
    // The name can be used again, from scratch.
    create_index(&server, "doomed", 3, "ip");
    server.kill();
    let server = start(&data_dir, &[]);
    let r = server.call("GET", "/api/v1/indexes/doomed/stats", None);
    assert_eq!((r.body["data"]["dimensions"].as_u64(), r.body["data"]["count"].as_u64()), (Some(3), Some(0)));
}

#[test]
fn a_second_process_on_the_same_directory_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = start(&data_dir, &[]);
    let message = start_fails(&data_dir, "0", &[]);
    assert!(message.contains("in use by another quiver process"), "{message}");
    assert!(message.contains(&server.child.id().to_string()), "{message}");
    // The first one is unharmed.
    assert_eq!(server.call("GET", "/api/v1/indexes/list", None).status, 200);
}

/// A second process on a busy port stops before it writes anything: no
/// data directory, no key file.
#[test]
fn a_second_process_on_a_busy_port_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("first"), &[]);
    let second = dir.path().join("second");
    let message = start_fails(&second, &server.addr.port().to_string(), &[]);
    assert!(message.contains("cannot listen on"), "{message}");
    assert!(!second.exists(), "the second process created {}", second.display());
    assert_eq!(server.call("GET", "/api/v1/indexes/list", None).status, 200);
}

#[test]
fn a_failed_sync_answers_500_applies_nothing_and_turns_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    // Syncs after the first two fail.
    let server =
        Server::start_in(None, data_dir.clone(), &["--api-key", KEY], &[("QUIVER_FAULT_SYNC_FAIL_AFTER", "2")]);
    create_index(&server, "fragile", 1, "l2");
    let ok = server.call("PUT", "/api/v1/embeddings/fragile/insert", Some(r#"{"embeddings":[{"id":1,"data":[1]}]}"#));
    assert_eq!(ok.status, 200);

    let r = server.call(
        "PUT",
        "/api/v1/embeddings/fragile/upsert",
        Some(r#"{"embeddings":[{"id":1,"data":[5]},{"id":2,"data":[2]}]}"#),
    );
    r.check_envelope();
    assert_eq!((r.status, r.code()), (500, "STORAGE_ERROR"), "{r:?}");
    assert!(r.body["error"]["description"].as_str().unwrap().contains("injected sync failure"));
    // Counted with the status the client got, not the one before the sync.
    assert_eq!(server.metric("quiver_requests_total{route=\"upsert\",status=\"500\"}"), 1.0);
    assert_eq!(server.metric("quiver_requests_total{route=\"upsert\",status=\"200\"}"), 0.0);
    // Not applied: id 1 keeps its old vector, id 2 does not exist.
    let state = retrieve_all(&mut server.connect(), "fragile", [1, 2]);
    assert_eq!(state.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(state[&1].0, bits(&[1.0]));

    // Further writes are refused; reads go on.
    for (method, path, body) in [
        ("PUT", "/api/v1/embeddings/fragile/insert", Some(r#"{"embeddings":[{"id":3,"data":[3]}]}"#)),
        ("DELETE", "/api/v1/embeddings/fragile/delete", Some(r#"{"ids":[1]}"#)),
        ("PUT", "/api/v1/indexes/another/create", Some(r#"{"dimensions":1,"metric":"l2"}"#)),
        ("DELETE", "/api/v1/indexes/fragile/delete", None),
    ] {
        let r = server.call(method, path, body);
        r.check_envelope();
        assert_eq!((r.status, r.code()), (503, "READ_ONLY"), "{method} {path}");
    }
    let r = server.call("POST", "/api/v1/embeddings/fragile/search", Some(r#"{"queryVector":[1],"k":5}"#));
    assert_eq!(r.status, 200);
    assert_eq!(list(&server), json!(["fragile"]));
    server.kill();

    // A restart (without the fault) has exactly the acknowledged writes.
    let server = start(&data_dir, &[]);
    let state = retrieve_all(&mut server.connect(), "fragile", [1, 2, 3]);
    assert_eq!(state.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(state[&1].0, bits(&[1.0]));
}
