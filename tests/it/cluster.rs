//! Three real processes on loopback, one database: every answer a single
//! node's, nothing acknowledged lost through kill -9 and pauses, and the
//! copies identical and exact at the end.
//!
//! Every loop here is bounded in count and time.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::KEY;
use crate::harness::{Rng, Server};
use crate::linearizable::{self, Event, Op};
use crate::nodes::{free_port, try_call, Cluster};

/// The register ids of the kill test (upserted and deleted by every
/// writer, read by every reader), from this id on.
const REGISTER_BASE: u64 = 50_000_000;
const REGISTERS: usize = 6;

/// Each register's recorded operations, at most `cap` each: an operation
/// takes its place when invoked (`reserve`) and is recorded when it completes.
struct Histories {
    events: Vec<Vec<Event>>,
    reserved: Vec<usize>,
    cap: usize,
}

impl Histories {
    fn new(registers: usize, cap: usize) -> Histories {
        Histories { events: vec![Vec::new(); registers], reserved: vec![0; registers], cap }
    }

    fn reserve(&mut self, register: usize) -> bool {
        let room = self.reserved[register] < self.cap;
        self.reserved[register] += usize::from(room);
        room
    }

    fn release(&mut self, register: usize) {
        self.reserved[register] -= 1;
    }

    fn record(&mut self, register: usize, event: Event) {
        self.events[register].push(event);
    }
}

fn vector_of(id: u64, dims: usize) -> Vec<f32> {
    let mut rng = Rng(id);
    (0..dims).map(|_| rng.float()).collect()
}

fn upsert_body(ids: &[u64], dims: usize) -> String {
    let items: Vec<String> = ids
        .iter()
        .map(|&id| {
            let data: Vec<String> = vector_of(id, dims).iter().map(|x| x.to_string()).collect();
            format!(r#"{{"id":{id},"data":[{}],"metadata":{{"n":"{id}"}}}}"#, data.join(","))
        })
        .collect();
    format!(r#"{{"embeddings":[{}]}}"#, items.join(","))
}

/// Every row of index `name` on node `server`, from its own copy: id to vector.
fn all_rows(server: &Server, name: &str) -> BTreeMap<i64, Vec<f32>> {
    let mut rows = BTreeMap::new();
    let mut after = Value::Null;
    loop {
        let body = format!(r#"{{"limit":1000,"after":{after},"include":["data"]}}"#);
        let r = server.call("POST", &format!("/api/v1/embeddings/{name}/scroll?consistency=local"), Some(&body));
        assert_eq!(r.status, 200, "{r:?}");
        for row in r.body["data"]["embeddings"].as_array().unwrap() {
            let data = row["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            rows.insert(row["id"].as_i64().unwrap(), data);
        }
        after = r.body["data"]["next"].clone();
        if after.is_null() {
            return rows;
        }
    }
}

/// The same requests to one node and to a cluster (each to the next node
/// in turn) get the same answers, byte for byte in their bodies.
#[test]
fn a_cluster_answers_every_request_as_one_node_would() {
    let single = Server::start();
    let cluster = Cluster::start(3, false);
    cluster.wait_for_leader(Duration::from_secs(20));
    let requests: &[(&str, &str, Option<&str>)] = &[
        ("PUT", "/api/v1/indexes/docs/create", Some(r#"{"dimensions":3,"metric":"l2"}"#)),
        ("PUT", "/api/v1/indexes/docs/create", Some(r#"{"dimensions":3,"metric":"l2"}"#)),
        ("PUT", "/api/v1/indexes/x/create", Some(r#"{"dimensions":3,"metric":"l2"}"#)),
        ("PUT", "/api/v1/indexes/bad/create", Some(r#"{"dimension":3}"#)),
        (
            "PUT",
            "/api/v1/embeddings/docs/insert",
            Some(
                r#"{"embeddings":[{"id":1,"data":[1,0,0],"metadata":{"k":"a"}},{"id":2,"data":[0,1,0]},
                {"id":1,"data":[0,0,1]},{"id":3,"data":[1,1]}]}"#,
            ),
        ),
        ("PUT", "/api/v1/embeddings/docs/insert", Some(r#"{"embeddings":[{"id":2,"data":[0,1,0]}]}"#)),
        (
            "PUT",
            "/api/v1/embeddings/docs/upsert",
            Some(r#"{"embeddings":[{"id":2,"data":[0,2,0],"metadata":{"k":"b"}},{"id":4,"data":[3,3,3]}]}"#),
        ),
        ("PUT", "/api/v1/embeddings/none/upsert", Some(r#"{"embeddings":[{"id":2,"data":[0,2,0]}]}"#)),
        ("PUT", "/api/v1/embeddings/docs/upsert", Some(r#"{"embeddings":[{"id":"two"}]}"#)),
        ("POST", "/api/v1/embeddings/docs/search", Some(r#"{"queryVector":[1,0,0],"k":3}"#)),
        ("POST", "/api/v1/embeddings/docs/retrieve", Some(r#"{"ids":[1,2,9]}"#)),
        ("DELETE", "/api/v1/embeddings/docs/delete", Some(r#"{"ids":[4,4,8]}"#)),
        ("POST", "/api/v1/embeddings/docs/scroll", Some(r#"{"include":["data"]}"#)),
        ("DELETE", "/api/v1/embeddings/docs/delete", Some(r#"{"filter":{"k":"b"}}"#)),
        ("GET", "/api/v1/indexes/docs/stats", None),
        ("GET", "/api/v1/indexes/list", None),
        ("DELETE", "/api/v1/indexes/none/delete", None),
        ("DELETE", "/api/v1/indexes/docs/delete", None),
        ("GET", "/api/v1/indexes/list", None),
    ];
    for (n, &(method, path, body)) in requests.iter().enumerate() {
        let alone = single.call(method, path, body);
        let together = cluster.node(n % 3).call(method, path, body);
        assert_eq!((together.status, &together.body), (alone.status, &alone.body), "{method} {path} {body:?}");
    }

    // Each node's view: one leader, three voters, the same term.
    let statuses: Vec<Value> = (0..3).map(|i| cluster.status(i).unwrap()).collect();
    assert_eq!(statuses.iter().filter(|s| s["role"] == "leader").count(), 1, "{statuses:?}");
    for (i, status) in statuses.iter().enumerate() {
        assert_eq!(status["node_id"], (i + 1) as u64);
        assert_eq!(status["term"], statuses[0]["term"]);
        let members = status["members"].as_array().unwrap();
        assert_eq!(members.len(), 3, "{status:?}");
        assert!(members.iter().all(|m| m["voter"] == true && m["address"].is_string()), "{status:?}");
    }
    let r = single.call("GET", "/api/v1/cluster", None);
    assert_eq!((r.status, &r.body["data"]["role"]), (200, &Value::from("single")));
    let r = cluster.node(0).call("GET", "/api/v1/indexes/list?consistency=sometimes", None);
    assert_eq!((r.status, r.code()), (400, "INVALID_CONSISTENCY"), "{r:?}");

    // A restore is a write like the others: every node holds the index, bit for bit.
    crate::harness::create_index(&single, "orig", 3, "cosine");
    let rows = r#"{"embeddings":[{"id":1,"data":[1,0,0],"metadata":{"k":"a"}},{"id":2,"data":[0,1,0.5]}]}"#;
    assert_eq!(single.call("PUT", "/api/v1/embeddings/orig/insert", Some(rows)).status, 200);
    let key = &[("X-Service-API-Key", KEY)];
    let (status, _, image) = single.connect().call_bytes("GET", "/api/v1/indexes/orig/snapshot", key, b"");
    assert_eq!(status, 200);
    let (status, _, body) = cluster.node(1).connect().call_bytes("PUT", "/api/v1/indexes/copy/restore", key, &image);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    cluster.wait_until_converged(Duration::from_secs(20));
    for i in 0..3 {
        let (status, _, copy) = cluster.node(i).connect().call_bytes("GET", "/api/v1/indexes/copy/snapshot", key, b"");
        assert!(status == 200 && copy == image, "node {} holds another image", i + 1);
    }
}

/// A node refuses to start without the shared key or the secret; a peer
/// that does not know the secret is refused and logged, and strangers
/// that say nothing are bounded.
#[test]
fn a_cluster_node_needs_the_key_and_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let peer = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let cluster = ["--node-id", "1", "--peer-addr", &peer, "--cluster-secret", "s"];
    let said = crate::harness::start_fails(&dir.path().join("a"), "0", &cluster);
    assert!(said.contains("needs the API key"), "{said}");
    let said = crate::harness::start_fails(&dir.path().join("b"), "0", &["--api-key", KEY, "--node-id", "1"]);
    assert!(said.contains("--node-id and --peer-addr"), "{said}");
    let said = crate::harness::start_fails(
        &dir.path().join("c"),
        "0",
        &["--api-key", KEY, "--node-id", "1", "--peer-addr", &peer],
    );
    assert!(said.contains("--cluster-secret"), "{said}");

    let good = Cluster::start(1, false);
    good.wait_for_leader(Duration::from_secs(20));
    // A node with another secret, naming the good node as a peer, dials it.
    let (id, peer) = ("2", format!("127.0.0.2:{}", free_port("127.0.0.2")));
    let initial = format!("1={},2={peer}", good.peers[0]);
    let args = ["--api-key", KEY, "--node-id", id, "--peer-addr", &peer, "--initial-peers", &initial];
    let intruder = Server::start_in(None, dir.path().join("d"), &args, &[("QUIVER_CLUSTER_SECRET", "not-the-secret")]);
    good.node(0).wait_for_log("did not prove it knows the cluster secret", Duration::from_secs(20));
    intruder.kill();
    // Strangers holding the peer port open without a word are bounded: past
    // 64 waiting, new ones are closed at once, and the node serves on.
    let strangers: Vec<_> = (0..80).filter_map(|_| std::net::TcpStream::connect(good.peers[0]).ok()).collect();
    good.node(0).wait_for_log("others are proving themselves", Duration::from_secs(20));
    drop(strangers);
    // The good node still answers writes by itself (it is a cluster of one).
    crate::harness::create_index(good.node(0), "still", 2, "l2");
}

/// The workload of the fault tests: on every node a writer and a reader.
/// Each writer upserts new ids in batches of 5 to its own node and, after
/// each, upserts (a new version) or deletes one of the register ids; each
/// reader retrieves register ids from its own node. Every call is recorded.
struct Workload {
    addresses: Arc<Mutex<Vec<Option<SocketAddr>>>>,
    stop: Arc<AtomicBool>,
    histories: Arc<Mutex<Histories>>,
    writers: Vec<std::thread::JoinHandle<Written>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// A writer's ids answered 200, and its batches answered otherwise.
type Written = (BTreeSet<u64>, Vec<Vec<u64>>);

/// What the workload's calls were answered.
struct Outcome {
    acked: BTreeSet<u64>,
    /// Batches answered 503, or cut off: each may or may not have taken effect.
    maybe_batches: Vec<Vec<u64>>,
    histories: Histories,
}

const DIMS: usize = 8;

impl Workload {
    /// Creates the index `kvs` and starts the writers and readers.
    fn start(cluster: &Cluster) -> Workload {
        let leader = cluster.wait_for_leader(Duration::from_secs(20));
        crate::harness::create_index(cluster.node(leader), "kvs", DIMS, "l2");
        let addresses: Arc<Mutex<Vec<Option<SocketAddr>>>> =
            Arc::new(Mutex::new((0..3).map(|i| Some(cluster.node(i).addr)).collect()));
        let stop = Arc::new(AtomicBool::new(false));
        let histories = Arc::new(Mutex::new(Histories::new(REGISTERS, 100)));
        // Each writer: upserts of new ids, in batches of 5, to its own node;
        // after each, an upsert (of a new version) or a delete of one of the
        // register ids, whose histories are checked at the end.
        let writers: Vec<_> = (0..3u64)
            .map(|w| {
                let (addresses, stop, histories) = (Arc::clone(&addresses), Arc::clone(&stop), Arc::clone(&histories));
                std::thread::spawn(move || {
                    let (mut acked, mut maybe) = (BTreeSet::new(), Vec::new());
                    let mut next = w * 1_000_000;
                    let mut rng = Rng(w + 100);
                    let deadline = Instant::now() + Duration::from_secs(240);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let Some(addr) = addresses.lock().unwrap()[w as usize] else {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        };
                        let ids: Vec<u64> = (next..next + 5).collect();
                        next += 5;
                        match try_call(addr, "PUT", "/api/v1/embeddings/kvs/upsert", Some(&upsert_body(&ids, DIMS))) {
                            Some(r) if r.status == 200 => acked.extend(ids),
                            Some(r) => {
                                assert_eq!((r.status, r.code()), (503, "CLUSTER_UNAVAILABLE"), "{r:?}");
                                maybe.push(ids);
                            }
                            None => {
                                maybe.push(ids);
                                std::thread::sleep(Duration::from_millis(20));
                            }
                        }
                        let register = rng.below(REGISTERS as u64) as usize;
                        if !histories.lock().unwrap().reserve(register) {
                            continue;
                        }
                        let id = REGISTER_BASE + register as u64;
                        let invoked = Instant::now();
                        let event = if rng.below(5) == 0 {
                            let r = try_call(
                                addr,
                                "DELETE",
                                "/api/v1/embeddings/kvs/delete",
                                Some(&format!(r#"{{"ids":[{id}]}}"#)),
                            );
                            let (op, completed) = match r {
                                Some(r) if r.status == 200 => (Op::Delete { existed: true }, Some(Instant::now())),
                                Some(r) if r.code() == "EMBEDDINGS_SKIPPED" => {
                                    (Op::Delete { existed: false }, Some(Instant::now()))
                                }
                                _ => (Op::DeleteMaybe, None),
                            };
                            Event { op, invoked, completed }
                        } else {
                            let version = w * 1_000_000_000 + next;
                            let body = format!(
                                r#"{{"embeddings":[{{"id":{id},"data":[{}],"metadata":{{"v":"{version}"}}}}]}}"#,
                                ["0.5"; DIMS].join(",")
                            );
                            let r = try_call(addr, "PUT", "/api/v1/embeddings/kvs/upsert", Some(&body));
                            let completed = r.filter(|r| r.status == 200).map(|_| Instant::now());
                            Event { op: Op::Write(version), invoked, completed }
                        };
                        histories.lock().unwrap().record(register, event);
                    }
                    (acked, maybe)
                })
            })
            .collect();
        // Each reader: retrieves of the register ids, linearizable, on its own node.
        let readers: Vec<_> = (0..3u64)
            .map(|n| {
                let (addresses, stop, histories) = (Arc::clone(&addresses), Arc::clone(&stop), Arc::clone(&histories));
                std::thread::spawn(move || {
                    let mut rng = Rng(n + 200);
                    let deadline = Instant::now() + Duration::from_secs(240);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                        let Some(addr) = addresses.lock().unwrap()[n as usize] else { continue };
                        let register = rng.below(REGISTERS as u64) as usize;
                        if !histories.lock().unwrap().reserve(register) {
                            continue;
                        }
                        let id = REGISTER_BASE + register as u64;
                        let invoked = Instant::now();
                        let r = try_call(
                            addr,
                            "POST",
                            "/api/v1/embeddings/kvs/retrieve",
                            Some(&format!(r#"{{"ids":[{id}]}}"#)),
                        );
                        let seen = match r {
                            Some(r) if r.status == 200 => {
                                let v =
                                    r.body["data"]["embeddings"][0]["metadata"]["v"].as_str().unwrap().parse().unwrap();
                                Some(Some(v))
                            }
                            Some(r) if r.code() == "EMBEDDINGS_SKIPPED" => Some(None),
                            // A read that failed saw nothing: it is left out.
                            _ => None,
                        };
                        let mut histories = histories.lock().unwrap();
                        match seen {
                            Some(seen) => histories.record(
                                register,
                                Event { op: Op::Read(seen), invoked, completed: Some(Instant::now()) },
                            ),
                            None => histories.release(register),
                        }
                    }
                })
            })
            .collect();

        Workload { addresses, stop, histories, writers, readers }
    }

    /// Where the clients of node `i` find it (none while it is down).
    fn set_address(&self, i: usize, address: Option<SocketAddr>) {
        self.addresses.lock().unwrap()[i] = address;
    }

    fn finish(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        let (mut acked, mut maybe_batches) = (BTreeSet::new(), Vec::new());
        for writer in self.writers {
            let (a, m) = writer.join().unwrap();
            acked.extend(a);
            maybe_batches.extend(m);
        }
        for reader in self.readers {
            reader.join().unwrap();
        }
        let histories = std::mem::replace(&mut *self.histories.lock().unwrap(), Histories::new(0, 0));
        Outcome { acked, maybe_batches, histories }
    }
}

/// The checks after healing: every acknowledged write on every node, the
/// copies identical, no write answered 503 half applied, every register's
/// history linearizable, every node's searches the brute force's. Returns
/// how many register operations were checked.
fn check_outcome(cluster: &Cluster, outcome: &Outcome) -> usize {
    let Outcome { acked, maybe_batches, histories } = outcome;
    assert!(acked.len() > 100, "too few writes were answered: {}", acked.len());
    let maybe: BTreeSet<u64> = maybe_batches.iter().flatten().copied().collect();
    cluster.wait_for_leader(Duration::from_secs(30));
    // A write after healing makes every node's commit index current.
    crate::harness::create_index(cluster.node(0), "after", 2, "l2");
    cluster.wait_until_converged(Duration::from_secs(30));
    let copies: Vec<BTreeMap<i64, Vec<f32>>> = (0..3).map(|i| all_rows(cluster.node(i), "kvs")).collect();
    for (i, copy) in copies.iter().enumerate() {
        assert!(copy == &copies[0], "node {} holds other rows than node 1", i + 1);
        for id in acked {
            assert_eq!(copy.get(&(*id as i64)), Some(&vector_of(*id, DIMS)), "node {}: acknowledged id {id}", i + 1);
        }
        for id in copy.keys().map(|&id| id as u64).filter(|&id| id < REGISTER_BASE) {
            assert!(acked.contains(&id) || maybe.contains(&id), "id {id} was never written");
        }
        // A write answered 503 took effect whole, or not at all.
        for batch in maybe_batches {
            let present = batch.iter().filter(|&&id| copy.contains_key(&(id as i64))).count();
            assert!(present == 0 || present == batch.len(), "node {}: a batch half applied: {batch:?}", i + 1);
        }
    }
    // Every register's history: linearizable.
    let mut operations = 0;
    for (register, history) in histories.events.iter().enumerate() {
        operations += history.len();
        assert_eq!(linearizable::check(history, 5_000_000), Ok(true), "register {register}: {history:#?}");
    }
    assert!(operations > 50, "too few register operations: {operations}");
    // Searches on every node: the brute force's ids, in its order.
    let rows: BTreeMap<i64, Vec<f32>> =
        copies[0].iter().filter(|&(&id, _)| (id as u64) < REGISTER_BASE).map(|(&id, v)| (id, v.clone())).collect();
    let rows = &rows;
    let mut rng = Rng(7);
    for i in 0..3 {
        for _ in 0..3 {
            let query: Vec<f32> = (0..DIMS).map(|_| rng.float()).collect();
            let mut by_distance: Vec<(f64, i64)> = rows
                .iter()
                .map(|(&id, v)| (v.iter().zip(&query).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>(), id))
                .collect();
            by_distance.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let body = format!(r#"{{"queryVector":{query:?},"k":10}}"#);
            let body = body.replace("}", r#","filter":{"$not":{"v":{"$exists":true}}}}"#);
            let r = cluster.node(i).call("POST", "/api/v1/embeddings/kvs/search", Some(&body));
            assert_eq!(r.status, 200, "{r:?}");
            let hits = r.body["data"]["nearest_neighbors"].as_object().unwrap();
            let mut found: Vec<(u64, i64)> =
                hits.iter().map(|(id, hit)| (hit["rank"].as_u64().unwrap(), id.parse().unwrap())).collect();
            found.sort();
            let expected: Vec<i64> = by_distance.iter().take(10).map(|&(_, id)| id).collect();
            assert_eq!(found.iter().map(|&(_, id)| id).collect::<Vec<_>>(), expected, "node {}", i + 1);
        }
    }
    operations
}

/// Writers on every node while nodes are killed with SIGKILL (the leader,
/// then a random one, in turn) and restarted, 20 times, each kill losing
/// what a power loss would (the log's seam); then the checks of
/// `check_outcome`.
#[test]
fn acknowledged_writes_survive_kill_nine_of_any_node() {
    const KILLS: usize = 20;
    // Snapshots every 256 KiB of log: kills land while they are written,
    // restarts load them, and a node back from a kill may be sent one.
    let mut cluster = Cluster::start_with(3, true, &["--snapshot-log-bytes", "262144"]);
    let workload = Workload::start(&cluster);
    let mut rng = Rng(34);
    let started = Instant::now();
    // At least KILLS kills, and more (up to twice as many) until one has
    // landed between a write and its sync.
    let mut kill = 0;
    while kill < KILLS || (cluster.count_in_logs("cut to its") == 0 && kill < 2 * KILLS) {
        kill += 1;
        let victim =
            if kill % 2 == 0 { cluster.wait_for_leader(Duration::from_secs(30)) } else { rng.below(3) as usize };
        workload.set_address(victim, None);
        cluster.kill(victim);
        std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
        cluster.start_node(victim);
        workload.set_address(victim, Some(cluster.node(victim).addr));
        std::thread::sleep(Duration::from_millis(200 + rng.below(500)));
        assert!(started.elapsed() < Duration::from_secs(200), "the kill loop ran too long");
    }
    let kills = kill;
    std::thread::sleep(Duration::from_secs(1));
    let outcome = workload.finish();
    let operations = check_outcome(&cluster, &outcome);
    // The seam did cut unsynced bytes: the syncs were put to the test.
    let cuts = cluster.count_in_logs("cut to its");
    assert!(cuts > 0, "no kill landed between a write and its sync");
    eprintln!(
        "cluster: {kills} kills survived ({cuts} losing unsynced bytes), {} writes answered, {} maybe, \
         {operations} register operations linearizable",
        outcome.acked.len(),
        outcome.maybe_batches.len() * 5
    );
}

/// Every node takes state snapshots and cuts its log after them; a node
/// that was down while the others cut theirs past what it has is sent the
/// leader's state, and every node restarts from its own snapshot.
#[test]
fn a_node_behind_the_cut_log_is_sent_the_state() {
    let mut cluster = Cluster::start_with(3, false, &["--snapshot-log-bytes", "65536"]);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    crate::harness::create_index(cluster.node(leader), "kvs", DIMS, "l2");
    crate::harness::create_index(cluster.node(leader), "other", 2, "cosine");
    let behind = (leader + 1) % 3;
    let upsert = |cluster: &Cluster, ids: std::ops::Range<u64>| {
        let alive: Vec<usize> = (0..3).filter(|&i| cluster.is_running(i)).collect();
        for (n, chunk) in ids.collect::<Vec<u64>>().chunks(50).enumerate() {
            let node = cluster.node(alive[n % alive.len()]);
            let r = node.call("PUT", "/api/v1/embeddings/kvs/upsert", Some(&upsert_body(chunk, DIMS)));
            assert_eq!(r.status, 200, "{r:?}");
        }
    };
    upsert(&cluster, 0..500);
    cluster.wait_until_converged(Duration::from_secs(30));
    cluster.kill(behind);
    // Past several snapshots' worth of log, deletes and an index's end among it.
    upsert(&cluster, 500..3000);
    let survivor = (behind + 1) % 3;
    let r = cluster.node(survivor).call("DELETE", "/api/v1/embeddings/kvs/delete", Some(r#"{"ids":[3,4,600]}"#));
    assert_eq!(r.status, 200, "{r:?}");
    let r = cluster.node(survivor).call("DELETE", "/api/v1/indexes/other/delete", None);
    assert_eq!(r.status, 200, "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    upsert(&cluster, 3000..3100);
    while cluster.count_in_logs("the Raft log now starts after entry") < 4 {
        assert!(Instant::now() < deadline, "the nodes up did not cut their logs after a snapshot");
        upsert(&cluster, 3000..3100);
        std::thread::sleep(Duration::from_millis(200));
    }
    cluster.start_node(behind);
    cluster.wait_for_leader(Duration::from_secs(20));
    crate::harness::create_index(cluster.node(survivor), "after", 2, "l2");
    cluster.wait_until_converged(Duration::from_secs(60));
    let sent = "the node was not sent the state";
    cluster.wait_for_in_logs("sent by the leader is in place", 1, Duration::from_secs(10), sent);
    let expected: BTreeMap<i64, Vec<f32>> =
        (0..3100).filter(|id| ![3, 4, 600].contains(id)).map(|id| (id as i64, vector_of(id, DIMS))).collect();
    for i in 0..3 {
        assert!(all_rows(cluster.node(i), "kvs") == expected, "node {} holds other rows", i + 1);
        let r = cluster.node(i).call("GET", "/api/v1/indexes/list?consistency=local", None);
        assert_eq!(r.body["data"]["indexes"], serde_json::json!(["after", "kvs"]), "node {}: {r:?}", i + 1);
    }
    // Each node's log is cut: far less than what went through it.
    let raft_bytes = |i: usize| -> u64 {
        std::fs::read_dir(cluster.data_dir(i).join("raft"))
            .unwrap()
            .map(|entry| entry.unwrap().metadata().unwrap().len())
            .sum()
    };
    for i in 0..3 {
        assert!(raft_bytes(i) < 4 << 20, "node {}: its Raft log holds {} bytes", i + 1, raft_bytes(i));
    }
    // Every node starts again from its own state snapshot and log.
    for i in 0..3 {
        cluster.kill(i);
    }
    for i in 0..3 {
        cluster.start_node(i);
    }
    cluster.wait_for_leader(Duration::from_secs(20));
    cluster.wait_until_converged(Duration::from_secs(30));
    for i in 0..3 {
        assert!(all_rows(cluster.node(i), "kvs") == expected, "node {} after a restart", i + 1);
    }
    cluster.wait_for_in_logs("from state snapshot generation", 3, Duration::from_secs(10), "restarts from snapshots");
}

/// A node waiting on an empty data directory is added (a learner sent the
/// state, then a voter), the leader is removed (it hands over first), a
/// node that lost its disk rejoins under a new id, and the changes' bad
/// requests are refused with their codes.
#[test]
fn members_are_added_and_removed_while_serving() {
    let mut cluster = Cluster::start_with(3, false, &["--snapshot-log-bytes", "65536"]);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    crate::harness::create_index(cluster.node(leader), "kvs", DIMS, "l2");
    let mut written = 0u64;
    let mut upsert = |cluster: &Cluster, n: u64| {
        let alive: Vec<usize> = (0..cluster.peers.len()).filter(|&i| cluster.is_running(i)).collect();
        for (k, chunk) in (written..written + n).collect::<Vec<u64>>().chunks(50).enumerate() {
            let r = cluster.node(alive[k % alive.len()]).call(
                "PUT",
                "/api/v1/embeddings/kvs/upsert",
                Some(&upsert_body(chunk, DIMS)),
            );
            assert_eq!(r.status, 200, "{r:?}");
        }
        written += n;
    };
    upsert(&cluster, 1500);
    let members = |cluster: &Cluster, i: usize| -> Vec<(u64, bool)> {
        let status = cluster.status(i).unwrap();
        status["members"].as_array().unwrap().iter().map(|m| (m["id"].as_u64().unwrap(), m["voter"] == true)).collect()
    };

    // Node 4 waits, alone; then it is added through a follower.
    let fourth = cluster.start_joining();
    let status = cluster.status(fourth).unwrap();
    assert_eq!((status["leader_id"].clone(), status["members"].clone()), (Value::Null, serde_json::json!([])));
    // Live, but not ready: it knows no leader. The members are ready.
    let probe = |cluster: &Cluster, i: usize, path: &str| cluster.node(i).connect().call_with("GET", path, &[], None);
    assert_eq!(probe(&cluster, fourth, "/healthz").status, 200);
    let r = probe(&cluster, fourth, "/readyz");
    assert_eq!((r.status, r.code()), (503, "NOT_READY"), "{r:?}");
    assert_eq!(r.body["error"]["description"], "node 4 knows no leader of the cluster yet", "{r:?}");
    assert_eq!(probe(&cluster, leader, "/readyz").status, 200);
    let follower = (leader + 1) % 3;
    let add = |cluster: &Cluster, at: usize, id: usize| {
        let body = format!(r#"{{"id":{},"address":"{}"}}"#, id + 1, cluster.peers[id]);
        cluster.node(at).call("POST", "/api/v1/cluster/members", Some(&body))
    };
    let r = add(&cluster, follower, fourth);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["message"], "Member added.");
    assert_eq!(
        r.body["data"],
        serde_json::json!({"id": 4, "address": cluster.peers[fourth].to_string(), "voter": true})
    );
    assert_eq!(add(&cluster, leader, fourth).status, 200, "adding a voter again answers as done");
    upsert(&cluster, 200);
    cluster.wait_until_converged(Duration::from_secs(30));
    assert!(members(&cluster, fourth).contains(&(4, true)), "{:?}", members(&cluster, fourth));
    let r = probe(&cluster, fourth, "/readyz");
    assert_eq!((r.status, &r.body["message"]), (200, &Value::from("ready")), "{r:?}");
    let sent = "node 4 was not sent the state";
    cluster.wait_for_in_logs("sent by the leader is in place", 1, Duration::from_secs(10), sent);

    // Bad requests, each with its code; a single node has no members.
    let bad: &[(&str, &str, Option<&str>, u16, &str)] = &[
        ("POST", "/api/v1/cluster/members", Some(r#"{"id":5}"#), 400, "INVALID_REQUEST_BODY"),
        ("POST", "/api/v1/cluster/members", Some(r#"{"id":0,"address":"127.0.0.9:1"}"#), 400, "INVALID_REQUEST_BODY"),
        ("POST", "/api/v1/cluster/members", Some(r#"{"id":5,"adress":"127.0.0.9:1"}"#), 400, "INVALID_REQUEST_BODY"),
        ("POST", "/api/v1/cluster/members", Some(r#"{"id":5,"address":"nowhere"}"#), 400, "INVALID_REQUEST_BODY"),
        ("POST", "/api/v1/cluster/members", Some(r#"{"id":2,"address":"127.0.0.9:1"}"#), 409, "MEMBER_EXISTS"),
        ("DELETE", "/api/v1/cluster/members/9", None, 404, "MEMBER_NOT_FOUND"),
        ("DELETE", "/api/v1/cluster/members/x", None, 404, "MEMBER_NOT_FOUND"),
        ("GET", "/api/v1/cluster/members", None, 405, "METHOD_NOT_ALLOWED"),
    ];
    for &(method, path, body, status, code) in bad {
        let r = cluster.node(fourth).call(method, path, body);
        assert_eq!((r.status, r.code()), (status, code), "{method} {path} {body:?}: {r:?}");
    }
    let single = Server::start();
    let r = single.call("POST", "/api/v1/cluster/members", Some(r#"{"id":2,"address":"127.0.0.9:1"}"#));
    assert_eq!((r.status, r.code()), (400, "NOT_A_CLUSTER"), "{r:?}");

    // The leader is removed, asked of another node: it hands over first.
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    let asked = (leader + 1) % 3;
    let r = cluster.node(asked).call("DELETE", &format!("/api/v1/cluster/members/{}", leader + 1), None);
    assert_eq!((r.status, &r.body["message"]), (200, &Value::from("Member removed.")), "{r:?}");
    cluster.kill(leader);
    let next = cluster.wait_for_leader(Duration::from_secs(20));
    assert_ne!(next, leader);
    upsert(&cluster, 300);

    // Node 3 loses its disk: removed, it comes back empty as node 5.
    let lost = (0..3).find(|&i| i != leader && cluster.is_running(i) && i != next).unwrap_or(fourth);
    let r = cluster.node(next).call("DELETE", &format!("/api/v1/cluster/members/{}", lost + 1), None);
    assert_eq!(r.status, 200, "{r:?}");
    cluster.kill(lost);
    let fifth = cluster.start_joining();
    let r = add(&cluster, next, fifth);
    assert_eq!(r.status, 200, "{r:?}");
    upsert(&cluster, 300);
    cluster.wait_until_converged(Duration::from_secs(30));
    let running: Vec<usize> = (0..cluster.peers.len()).filter(|&i| cluster.is_running(i)).collect();
    assert_eq!(running.len(), 3);
    let expected: BTreeMap<i64, Vec<f32>> = (0..written).map(|id| (id as i64, vector_of(id, DIMS))).collect();
    for &i in &running {
        let mut ids: Vec<u64> =
            members(&cluster, i).into_iter().filter(|&(_, voter)| voter).map(|(id, _)| id).collect();
        ids.sort();
        let mut want: Vec<u64> = running.iter().map(|&i| i as u64 + 1).collect();
        want.sort();
        assert_eq!(ids, want, "node {}'s voters", i + 1);
        assert!(all_rows(cluster.node(i), "kvs") == expected, "node {} holds other rows", i + 1);
    }
}

/// A peer port link that proves it knows the secret (from a node id
/// that is no member), as a peer would: the challenge, then its hello.
fn proven_link(peer_port: SocketAddr, from: u64, to: u64) -> std::net::TcpStream {
    use hmac::{Hmac, Mac};
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(peer_port).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut challenge = [0u8; 37];
    stream.read_exact(&mut challenge).unwrap();
    assert_eq!(&challenge[..5], b"QVRC\x02");
    let port: u16 = 9;
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(crate::nodes::SECRET.as_bytes()).unwrap();
    for part in [&b"quiver peer"[..], &challenge[5..], &from.to_le_bytes(), &to.to_le_bytes(), &port.to_le_bytes()] {
        mac.update(part);
    }
    let mut hello = b"QVRH\x02".to_vec();
    hello.extend_from_slice(&from.to_le_bytes());
    hello.extend_from_slice(&to.to_le_bytes());
    hello.extend_from_slice(&port.to_le_bytes());
    hello.extend_from_slice(&mac.finalize().into_bytes());
    stream.write_all(&hello).unwrap();
    stream
}

/// A peer that proved the secret is still held to the frame rules: a
/// frame of an unknown kind, one over its limit, a snapshot's data not
/// followed by its message (or a snapshot message without its data),
/// bytes that are no Raft message: each closes its link, and the node
/// goes on serving.
#[test]
fn a_proven_peer_is_still_held_to_the_frame_rules() {
    use protobuf::Message as _;
    use std::io::{Read, Write};
    let cluster = Cluster::start(1, false);
    cluster.wait_for_leader(Duration::from_secs(20));
    let frame = |kind: u8, body: &[u8]| {
        let mut bytes = vec![kind];
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    };
    let mut snapshot = raft::eraftpb::Message::default();
    snapshot.set_msg_type(raft::eraftpb::MessageType::MsgSnapshot);
    (snapshot.from, snapshot.to, snapshot.term) = (2, 1, 1);
    let snapshot = snapshot.write_to_bytes().unwrap();
    let mut heartbeat = raft::eraftpb::Message::default();
    heartbeat.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
    (heartbeat.from, heartbeat.to) = (2, 1);
    let heartbeat = heartbeat.write_to_bytes().unwrap();
    let mut over = vec![1u8];
    over.extend_from_slice(&u64::MAX.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown kind", frame(9, b"")),
        ("over its limit", over),
        ("data, then a message", [frame(3, b"state"), frame(1, &heartbeat)].concat()),
        ("a snapshot without data", frame(2, &snapshot)),
        ("a snapshot in a message frame", frame(1, &snapshot)),
        ("no Raft message", frame(1, b"\xff\xff\xff\xff")),
    ];
    for (what, bytes) in &cases {
        let mut link = proven_link(cluster.peers[0], 2, 1);
        link.write_all(bytes).unwrap();
        let mut rest = Vec::new();
        // The node closes the link: the read ends (it never sends on it),
        // not timed out.
        let closed = match link.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "{what}: the link was not closed");
        let r = cluster.node(0).call("GET", "/api/v1/cluster", None);
        assert_eq!(r.status, 200, "{what}: {r:?}");
    }
    cluster.wait_for_in_logs("closing", cases.len(), Duration::from_secs(10), "the links closed");
    crate::harness::create_index(cluster.node(0), "still", 2, "l2");
}

/// A leader paused past an election comes back a follower: it answers no
/// write and no read from the leadership it lost, and catches up.
#[test]
fn a_paused_leader_comes_back_a_follower() {
    let cluster = Cluster::start(3, false);
    let leader = cluster.wait_for_leader(Duration::from_secs(20));
    crate::harness::create_index(cluster.node(leader), "paused", 2, "l2");
    let old = cluster.node(leader).addr;
    // SAFETY: signals our own child process.
    unsafe { libc::kill(cluster.pid(leader), libc::SIGSTOP) };
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    // A write on another node, while the leader is paused, goes through
    // once a new leader is elected.
    let body = r#"{"embeddings":[{"id":1,"data":[1,1]}]}"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = cluster.node(others[0]).call("PUT", "/api/v1/embeddings/paused/upsert", Some(body));
        if r.status == 200 {
            break;
        }
        assert_eq!(r.code(), "CLUSTER_UNAVAILABLE", "{r:?}");
        assert!(Instant::now() < deadline, "no write went through while the leader was paused");
    }
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: as above.
    unsafe { libc::kill(cluster.pid(leader), libc::SIGCONT) };
    // Its first answers already come from a follower: the read sees the
    // write made without it, the write goes to the new leader.
    let r = try_call(old, "POST", "/api/v1/embeddings/paused/retrieve", Some(r#"{"ids":[1]}"#)).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let body = r#"{"embeddings":[{"id":2,"data":[2,2]}]}"#;
    let r = try_call(old, "PUT", "/api/v1/embeddings/paused/upsert", Some(body)).unwrap();
    assert!(r.status == 200 || r.code() == "CLUSTER_UNAVAILABLE", "{r:?}");
    let status = cluster.status(leader).unwrap();
    assert_ne!(status["leader_id"], (leader + 1) as u64, "{status:?}");
    cluster.wait_until_converged(Duration::from_secs(20));
    let r = cluster.node(others[1]).call(
        "POST",
        "/api/v1/embeddings/paused/retrieve?consistency=local",
        Some(r#"{"ids":[1]}"#),
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// A network namespace of the test's own, entered by the calling thread:
/// the nodes and clients it starts afterwards live in it, on its loopback,
/// and iptables rules there cut links between them and nothing else.
/// Removed when dropped.
struct Namespace {
    name: String,
}

impl Namespace {
    /// Makes and enters one; why not, if this machine cannot (not root,
    /// no `ip` or `iptables`, no namespaces).
    fn enter() -> Result<Namespace, String> {
        use std::os::fd::AsRawFd;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".to_owned());
        }
        let name = format!("quiver-test-{}", std::process::id());
        run("ip", &["netns", "add", &name])?;
        let namespace = Namespace { name };
        namespace.run(&["ip", "link", "set", "lo", "up"])?;
        namespace.run(&["iptables", "-F", "INPUT"])?;
        let file = std::fs::File::open(format!("/var/run/netns/{}", namespace.name)).map_err(|e| e.to_string())?;
        // SAFETY: a valid namespace descriptor; only this thread moves.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        Ok(namespace)
    }

    fn run(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Drops the peer traffic between `a` and `b`, both ways.
    fn cut(&self, a: SocketAddr, b: SocketAddr) {
        for (from, to) in [(a, b), (b, a)] {
            let (source, destination, port) = (from.ip().to_string(), to.ip().to_string(), to.port().to_string());
            let rule = ["-s", &source, "-d", &destination, "-p", "tcp", "--dport", &port, "-j", "DROP"];
            self.run(&[&["iptables", "-A", "INPUT"][..], &rule[..]].concat()).unwrap();
        }
    }

    fn heal(&self) {
        self.run(&["iptables", "-F", "INPUT"]).unwrap();
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = std::process::Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()));
    }
    Ok(())
}

/// Partitions inside a namespace of the test's own (as root, with
/// iptables): the leader alone, a follower alone, and a bridge (two nodes
/// cut from each other, both still reaching the third), each for longer
/// than an election, under the workload; after healing, the checks of
/// `check_outcome`. Where it cannot run, it is skipped, and counted.
#[test]
fn partitions_lose_nothing_answered() {
    let namespace = match Namespace::enter() {
        Ok(namespace) => namespace,
        Err(why) => return crate::harness::skip("cluster partitions", &why),
    };
    let cluster = Cluster::start(3, false);
    let workload = Workload::start(&cluster);
    let peers = cluster.peers.clone();
    let mut partitions = 0;
    for scenario in ["the leader alone", "a follower alone", "a bridge"] {
        let leader = cluster.wait_for_leader(Duration::from_secs(30));
        let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
        match scenario {
            "the leader alone" => {
                namespace.cut(peers[leader], peers[a]);
                namespace.cut(peers[leader], peers[b]);
            }
            "a follower alone" => {
                namespace.cut(peers[a], peers[leader]);
                namespace.cut(peers[a], peers[b]);
            }
            _ => namespace.cut(peers[leader], peers[a]),
        }
        std::thread::sleep(Duration::from_secs(4));
        // The majority side elects, or keeps, a leader and takes writes.
        let status: Vec<_> = (0..3).filter_map(|i| cluster.status(i)).collect();
        let leads = |i: usize| status[i]["role"] == "leader";
        assert!(leads(leader) || leads(a) || leads(b), "{scenario}: no leader: {status:?}");
        if scenario == "the leader alone" {
            // Cut off from a majority, it stepped down; the others elected one.
            assert!(!leads(leader) && (leads(a) || leads(b)), "{scenario}: {status:?}");
        }
        namespace.heal();
        partitions += 1;
        cluster.wait_for_leader(Duration::from_secs(30));
        std::thread::sleep(Duration::from_secs(1));
    }
    let outcome = workload.finish();
    let operations = check_outcome(&cluster, &outcome);
    eprintln!(
        "cluster: {partitions} partitions survived, {} writes answered, {operations} register operations linearizable",
        outcome.acked.len()
    );
}
