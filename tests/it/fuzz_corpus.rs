//! Replays every fuzz target's committed corpus through the same property
//! functions the fuzzers run, so CI keeps every finding fixed.

#[allow(dead_code)]
#[path = "../../fuzz/targets.rs"]
mod targets;

fn replay(target: &str, property: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut entries: Vec<_> =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    assert!(!entries.is_empty(), "{target} has no corpus");
    for entry in entries {
        let input = std::fs::read(entry.path()).unwrap();
        let outcome = std::panic::catch_unwind(|| property(&input));
        assert!(outcome.is_ok(), "{target}: corpus entry {} fails its property", entry.path().display());
    }
}

#[test]
fn http_request_corpus() {
    replay("http_request", targets::http_request);
}

#[test]
fn json_bodies_corpus() {
    replay("json_bodies", targets::json_bodies);
}

#[test]
fn wal_record_corpus() {
    replay("wal_record", targets::wal_record);
}

#[test]
fn store_ops_corpus() {
    replay("store_ops", targets::store_ops);
}
