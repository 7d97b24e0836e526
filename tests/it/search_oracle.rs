//! Every search checked against a brute-force oracle computed here in f64:
//! random data, all nine metrics, many dimensions, with deletes and upserts
//! in between, and k from 1 to more than the count.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::harness::{create_index, Client, Rng, Server};

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Metric {
    Cosine,
    L2,
    Ip,
    L1,
    Linf,
    Lp(f64),
    Canberra,
    Bc,
    Js,
}

/// f32's unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// The smallest f32 subnormal: the most an underflowing product loses.
const TINY: f64 = 1.401_298_464_324_817e-45;

impl Metric {
    /// Every metric; `lp` with an integer `p` and a half-integer one (which
    /// the server raises to by multiplying and square roots) and one it
    /// raises to by logarithms.
    pub const ALL: [Metric; 11] = [
        Metric::Cosine,
        Metric::L2,
        Metric::Ip,
        Metric::L1,
        Metric::Linf,
        Metric::Lp(3.0),
        Metric::Lp(0.7),
        Metric::Lp(2.5),
        Metric::Canberra,
        Metric::Bc,
        Metric::Js,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::L2 => "l2",
            Metric::Ip => "ip",
            Metric::L1 => "l1",
            Metric::Linf => "linf",
            Metric::Lp(_) => "lp",
            Metric::Canberra => "canberra",
            Metric::Bc => "bc",
            Metric::Js => "js",
        }
    }

    /// A name for an index of this metric (`lp` with its `p`).
    pub fn label(self) -> String {
        match self {
            Metric::Lp(p) => format!("m-lp{}", p.to_string().replace('.', "-")),
            _ => format!("m-{}", self.name()),
        }
    }

    /// Creates `index` with this metric.
    pub fn create(self, server: &Server, index: &str, dims: usize) {
        let mut body = serde_json::json!({"dimensions": dims, "metric": self.name()});
        if let Metric::Lp(p) = self {
            body["p"] = p.into();
        }
        let r = server.call("PUT", &format!("/api/v1/indexes/{index}/create"), Some(&body.to_string()));
        assert_eq!(r.status, 200, "{r:?}");
    }

    /// Whether the metric scores only vectors without negative values.
    pub fn needs_non_negative(self) -> bool {
        self == Metric::Js
    }

    /// Whether a larger score is nearer.
    fn is_similarity(self) -> bool {
        matches!(self, Metric::Cosine | Metric::Ip)
    }

    /// Nearness: larger is nearer for every metric (a distance negated).
    fn nearness(self, q: &[f32], v: &[f32]) -> f64 {
        let pairs = || q.iter().zip(v).map(|(a, b)| (f64::from(*a), f64::from(*b)));
        let dot: f64 = pairs().map(|(a, b)| a * b).sum();
        let l1 = || pairs().map(|(a, b)| (a - b).abs()).sum::<f64>();
        let linf = || pairs().map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        match self {
            Metric::Ip => dot,
            Metric::L2 => -pairs().map(|(a, b)| (a - b).powi(2)).sum::<f64>(),
            Metric::Cosine => dot / (norm(q) * norm(v)),
            Metric::L1 => -l1(),
            Metric::Linf => -linf(),
            Metric::Lp(p) => {
                let m = linf();
                if m == 0.0 {
                    return 0.0;
                }
                -m * pairs().map(|(a, b)| ((a - b).abs() / m).powf(p)).sum::<f64>().powf(1.0 / p)
            }
            Metric::Canberra => -pairs()
                .map(|(a, b)| if a == 0.0 && b == 0.0 { 0.0 } else { (a - b).abs() / (a.abs() + b.abs()) })
                .sum::<f64>(),
            Metric::Bc => {
                let sums = pairs().map(|(a, b)| (a + b).abs()).sum::<f64>();
                match l1() {
                    0.0 => 0.0,
                    d => -d / sums,
                }
            }
            Metric::Js => {
                let term = |x: f64, m: f64| if x == 0.0 { 0.0 } else { x * (x / m).ln() };
                -pairs().map(|(a, b)| 0.5 * term(a, (a + b) / 2.0) + 0.5 * term(b, (a + b) / 2.0)).sum::<f64>()
            }
        }
    }

    /// The most the server's f32 score of `v` can be off from `nearness`
    /// (docs/reference.md, "Numbers and exactness": the true order except between
    /// rows closer than this): `m` roundings of at most `U` of the sum of the
    /// terms' magnitudes (each product or square, each add of a lane, the
    /// reduction tree and the scalar tail: fewer than `n / 4 + 40`), plus a
    /// subnormal's worth per term where a product underflows. The server
    /// scales cosine and ip queries by a power of two to a norm in [1, 2),
    /// so their underflow is counted in that scale, `|q|` of the query's.
    fn tolerance(self, q: &[f32], v: &[f32]) -> f64 {
        let n = q.len() as f64;
        let m = n / 4.0 + 40.0;
        let gamma = m * U / (1.0 - m * U);
        let magnitudes: f64 = q.iter().zip(v).map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs()).sum();
        let underflow = (n + n.sqrt() * norm(v)) * TINY * norm(q);
        match self {
            Metric::Ip => gamma * magnitudes + underflow,
            Metric::Cosine => {
                (gamma * magnitudes + underflow) / (norm(q) * norm(v)) + 5.0 * U * self.nearness(q, v).abs()
            }
            Metric::L2 => (gamma + 3.0 * U) * -self.nearness(q, v) + n * TINY,
            // Each term rounded a few times, the largest difference once.
            Metric::L1 | Metric::Linf => (gamma + 2.0 * U) * -self.nearness(q, v) + n * TINY,
            // The ratios' roundings raised to the power p, and (not an
            // integer p) the error of the logarithm and exponential; the
            // root's (in f64) is negligible.
            Metric::Lp(p) => (gamma + (8.0 + 4.0 * p) * U) * -self.nearness(q, v) + n * TINY,
            // Terms of at most 1, each within a few roundings.
            Metric::Canberra => (gamma + 4.0 * U) * -self.nearness(q, v) + n * TINY,
            Metric::Bc => (2.0 * gamma + 4.0 * U) * -self.nearness(q, v) + n * TINY,
            // Terms of at least 0, each within a dozen roundings (series or
            // two logarithms); and a term with a subnormal factor loses its
            // relative precision.
            Metric::Js => (gamma + 16.0 * U) * -self.nearness(q, v) + 4.0 * n * TINY,
        }
    }
}

fn norm(x: &[f32]) -> f64 {
    x.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt()
}

/// The model: id -> (vector, metadata value).
pub type Model = BTreeMap<i64, (Vec<f32>, String)>;

pub fn vector(rng: &mut Rng, dims: usize) -> Vec<f32> {
    loop {
        let v: Vec<f32> = (0..dims).map(|_| rng.float()).collect();
        if v.iter().any(|&x| x != 0.0) {
            return v;
        }
    }
}

pub fn write_batch(client: &mut Client, index: &str, endpoint: &str, items: &[(i64, Vec<f32>, String)]) {
    let embeddings: Vec<Value> =
        items.iter().map(|(id, v, tag)| serde_json::json!({"id": id, "data": v, "metadata": {"tag": tag}})).collect();
    let body = serde_json::json!({ "embeddings": embeddings }).to_string();
    let r = client.call("PUT", &format!("/api/v1/embeddings/{index}/{endpoint}"), Some(&body));
    assert_eq!(r.status, 200, "{r:?}");
}

/// Asserts that the server's hits are the true k nearest, in order, as the
/// contract defines exact: no two hits out of order and no row left out
/// that is nearer than a hit, by more than their scores' f32 error
/// (`tolerance`); rows with identical vectors in id order.
pub fn check_search(client: &mut Client, index: &str, metric: Metric, model: &Model, query: &[f32], k: usize) {
    check_filtered(client, index, metric, model, query, k, None);
}

/// `check_search` with `filter` sent along, where `model` holds exactly the
/// rows the filter matches: the hits are the true k nearest among them.
pub fn check_filtered(
    client: &mut Client,
    index: &str,
    metric: Metric,
    model: &Model,
    query: &[f32],
    k: usize,
    filter: Option<&Value>,
) {
    let mut body = serde_json::json!({"queryVector": query, "k": k});
    if let Some(filter) = filter {
        body["filter"] = filter.clone();
    }
    let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(&body.to_string()));
    assert_eq!(r.status, 200, "{r:?}");
    let hits = r.body["data"]["nearest_neighbors"].as_object().unwrap();
    let expected_len = k.min(model.len());
    assert_eq!(hits.len(), expected_len, "k={k} n={}", model.len());

    let mut by_rank = vec![None; hits.len()];
    for (id, hit) in hits {
        let id: i64 = id.parse().unwrap();
        let rank = hit["rank"].as_u64().unwrap() as usize;
        assert!(by_rank[rank].is_none(), "rank {rank} given twice");
        by_rank[rank] = Some(id);
        let (_, tag) = model.get(&id).unwrap_or_else(|| panic!("id {id} is not live"));
        assert_eq!(hit["metadata"]["tag"].as_str(), Some(tag.as_str()));
    }
    let ranked: Vec<i64> = by_rank.into_iter().map(Option::unwrap).collect();
    let score = |id: i64| {
        let v = &model[&id].0;
        (metric.nearness(query, v), metric.tolerance(query, v))
    };
    let what = |id: i64| format!("{metric:?} k={k}: id {id} {:?}, query {query:?}", model[&id].0);
    for pair in ranked.windows(2) {
        let ((a, a_error), (b, b_error)) = (score(pair[0]), score(pair[1]));
        assert!(a >= b - (a_error + b_error), "{} ({a}) ranked before {} ({b})", what(pair[0]), what(pair[1]));
    }
    if let Some(&last) = ranked.last() {
        let (worst, worst_error) = score(last);
        for &id in model.keys().filter(|id| !ranked.contains(id)) {
            let (left_out, error) = score(id);
            assert!(
                left_out <= worst + worst_error + error,
                "{} ({left_out}) left out, {} ({worst}) ranked",
                what(id),
                what(last)
            );
        }
    }
    // Identical vectors score identically: they rank by id, and a hit's
    // twin with a smaller id is a hit before it.
    for (rank, &id) in ranked.iter().enumerate() {
        let bits = |id: i64| model[&id].0.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        for &twin in model.keys().filter(|&&twin| twin < id && bits(twin) == bits(id)) {
            let twin_rank = ranked.iter().position(|&r| r == twin);
            assert!(
                twin_rank.is_some_and(|r| r < rank),
                "{} ranked {rank}, its twin {twin} at {twin_rank:?}",
                what(id)
            );
        }
    }
    body["include"] = serde_json::json!(["score", "data"]);
    check_included(client, index, metric, model, query, &body, &ranked);
}

/// The same search with `include: ["score", "data"]`: the same hits in the
/// same ranks, each with the stored vector exactly and the value it was
/// ranked by, within the oracle's bound of the exact one (cosine
/// similarity, inner product with the query as sent, squared distance).
fn check_included(
    client: &mut Client,
    index: &str,
    metric: Metric,
    model: &Model,
    query: &[f32],
    body: &Value,
    ranked: &[i64],
) {
    let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(&body.to_string()));
    assert_eq!(r.status, 200, "{r:?}");
    let hits = r.body["data"]["nearest_neighbors"].as_object().unwrap();
    assert_eq!(hits.len(), ranked.len());
    for (rank, id) in ranked.iter().enumerate() {
        let hit = &hits[&id.to_string()];
        assert_eq!(hit.as_object().unwrap().len(), 4, "metadata, rank, score, data: {hit}");
        assert_eq!(hit["rank"], rank, "{hit}");
        let (vector, tag) = &model[id];
        assert_eq!(hit["metadata"]["tag"].as_str(), Some(tag.as_str()));
        let data: Vec<u32> =
            hit["data"].as_array().unwrap().iter().map(|x| (x.as_f64().unwrap() as f32).to_bits()).collect();
        assert_eq!(data, vector.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(), "id {id}: data as stored");
        let score = hit["score"].as_f64().unwrap();
        let exact =
            if metric.is_similarity() { metric.nearness(query, vector) } else { -metric.nearness(query, vector) };
        // Besides the ranking's own error, the score is rounded to f32 once
        // more: relatively, or by half a subnormal where it underflows.
        let bound = metric.tolerance(query, vector) + exact.abs() * U + TINY;
        assert!((score - exact).abs() <= bound, "{metric:?} id {id}: score {score}, exact {exact}, bound {bound}");
    }
}

/// A random vector for `metric`: without negative values for js.
pub fn vector_for(metric: Metric, rng: &mut Rng, dims: usize) -> Vec<f32> {
    let v = vector(rng, dims);
    if metric.needs_non_negative() {
        v.into_iter().map(f32::abs).collect()
    } else {
        v
    }
}

fn run_oracle(metric: Metric, dims: usize, count: usize, seed: u64) {
    let server = Server::start();
    let index = format!("{}-{dims}", metric.label());
    metric.create(&server, &index, dims);
    let mut client = server.connect();
    let mut rng = Rng(seed);
    let mut model = Model::new();
    let vector = |rng: &mut Rng, dims| vector_for(metric, rng, dims);

    let items: Vec<(i64, Vec<f32>, String)> =
        (0..count as i64).map(|id| (id * 3 - 50, vector(&mut rng, dims), format!("t{id}"))).collect();
    for chunk in items.chunks(97) {
        write_batch(&mut client, &index, "insert", chunk);
    }
    for (id, v, tag) in items {
        model.insert(id, (v, tag));
    }
    let ks = [1, 2, 5, 10, count / 2, count, count + 7];
    for round in 0..3 {
        for &k in &ks {
            let query = vector(&mut rng, dims);
            check_search(&mut client, &index, metric, &model, &query, k.max(1));
        }
        // A query equal to a stored vector finds it first (under every
        // distance; not under ip, where a longer vector can be nearer, nor
        // cosine in one dimension, where every vector of the same sign has
        // similarity 1).
        if !metric.is_similarity() || (metric == Metric::Cosine && dims >= 3) {
            let (&id, (v, _)) = model.iter().nth(rng.below(model.len() as u64) as usize).unwrap();
            let v = v.clone();
            check_search(&mut client, &index, metric, &model, &v, 3);
            let body = serde_json::json!({"queryVector": v, "k": 1}).to_string();
            let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(&body));
            assert_eq!(r.body["data"]["nearest_neighbors"][id.to_string()]["rank"], 0, "round {round}");
        }
        // Deletes (some of them absent ids), upserts of existing and new ids.
        let live: Vec<i64> = model.keys().copied().collect();
        let doomed: Vec<i64> = (0..count / 5).map(|_| live[rng.below(live.len() as u64) as usize]).collect();
        let body = serde_json::json!({ "ids": doomed }).to_string();
        client.call("DELETE", &format!("/api/v1/embeddings/{index}/delete"), Some(&body));
        for id in &doomed {
            model.remove(id);
        }
        let changes: Vec<(i64, Vec<f32>, String)> = (0..count / 4)
            .map(|n| {
                let id = if n % 2 == 0 {
                    live[rng.below(live.len() as u64) as usize]
                } else {
                    100_000 + round * 1000 + n as i64
                };
                (id, vector(&mut rng, dims), format!("u{round}-{n}"))
            })
            .collect();
        write_batch(&mut client, &index, "upsert", &changes);
        for (id, v, tag) in changes {
            model.insert(id, (v, tag));
        }
    }
    // Finally delete everything: an empty index answers with no neighbours.
    let all: Vec<i64> = model.keys().copied().collect();
    let r = client.call(
        "DELETE",
        &format!("/api/v1/embeddings/{index}/delete"),
        Some(&serde_json::json!({"ids": all}).to_string()),
    );
    assert_eq!(r.status, 200);
    model.clear();
    check_search(&mut client, &index, metric, &model, &vector(&mut rng, dims), 5);
}

#[test]
fn cosine_matches_the_oracle() {
    for (n, dims) in [1, 3, 7, 8, 9, 31].into_iter().enumerate() {
        run_oracle(Metric::Cosine, dims, 120, 10 + n as u64);
    }
}

#[test]
fn l2_matches_the_oracle() {
    for (n, dims) in [1, 3, 7, 8, 9, 31].into_iter().enumerate() {
        run_oracle(Metric::L2, dims, 120, 20 + n as u64);
    }
}

#[test]
fn ip_matches_the_oracle() {
    for (n, dims) in [1, 3, 7, 8, 9, 31].into_iter().enumerate() {
        run_oracle(Metric::Ip, dims, 120, 30 + n as u64);
    }
}

/// The six distances beyond the interface's three, at awkward dimensions
/// (below, at and past a block of lanes, with a tail).
#[test]
fn the_other_metrics_match_the_oracle() {
    for (n, metric) in Metric::ALL[3..].iter().enumerate() {
        for (m, dims) in [1, 5, 16, 17, 33].into_iter().enumerate() {
            run_oracle(*metric, dims, 80, 100 + 10 * n as u64 + m as u64);
        }
    }
}

#[test]
fn dims_768_match_the_oracle_in_every_metric() {
    for (n, metric) in Metric::ALL.into_iter().enumerate() {
        run_oracle(metric, 768, 300, 40 + n as u64);
    }
}

#[test]
fn equal_scores_rank_by_id_ascending() {
    let server = Server::start();
    for metric in Metric::ALL {
        let index = format!("ties-{}", metric.label());
        metric.create(&server, &index, 3);
        let mut client = server.connect();
        // Identical vectors under shuffled ids, plus one clearly nearer.
        let items: Vec<(i64, Vec<f32>, String)> = [42, -7, 13, 8, 1000, 0]
            .into_iter()
            .map(|id| (id, vec![0.5, 0.25, if metric.needs_non_negative() { 0.0 } else { -1.0 }], format!("{id}")))
            .chain([(99, vec![1.0, 1.0, 1.0], "near".to_owned())])
            .collect();
        write_batch(&mut client, &index, "insert", &items);
        let body = r#"{"queryVector":[1.0,1.0,1.0],"k":5}"#;
        let r = client.call("POST", &format!("/api/v1/embeddings/{index}/search"), Some(body));
        let hits = r.body["data"]["nearest_neighbors"].as_object().unwrap();
        let mut ranked: Vec<(u64, i64)> =
            hits.iter().map(|(id, h)| (h["rank"].as_u64().unwrap(), id.parse().unwrap())).collect();
        ranked.sort();
        let ids: Vec<i64> = ranked.into_iter().map(|(_, id)| id).collect();
        assert_eq!(ids, vec![99, -7, 0, 8, 13], "{metric:?}");
    }
}

/// Searches that arrive together are run as one batch (one pass over the
/// rows for all of them); each answer is exactly the answer it gets alone.
#[test]
fn searches_batched_in_one_turn_answer_exactly_as_alone() {
    let server = Server::start();
    create_index(&server, "batch", 64, "cosine");
    let mut rng = Rng(77);
    let mut client = server.connect();
    let items: Vec<(i64, Vec<f32>, String)> =
        (0..2000).map(|id| (id, vector(&mut rng, 64), format!("t{id}"))).collect();
    for chunk in items.chunks(500) {
        write_batch(&mut client, "batch", "insert", chunk);
    }
    let queries: Vec<String> =
        (0..16).map(|n| serde_json::json!({"queryVector": vector(&mut rng, 64), "k": 5 + n}).to_string()).collect();
    let alone: Vec<Value> =
        queries.iter().map(|q| client.call("POST", "/api/v1/embeddings/batch/search", Some(q)).body).collect();

    let mut batched_total = 0.0;
    for _round in 0..20 {
        let mut clients: Vec<Client> = queries.iter().map(|_| server.connect()).collect();
        // All requests on the wire before any answer is read.
        for (client, query) in clients.iter_mut().zip(&queries) {
            client.send(&crate::harness::request_bytes(
                "POST",
                "/api/v1/embeddings/batch/search",
                &[("X-Service-API-Key", crate::harness::KEY)],
                Some(query),
            ));
        }
        for (n, client) in clients.iter_mut().enumerate() {
            assert_eq!(client.read_response().body, alone[n], "query {n}");
        }
        batched_total = server.metric("quiver_searches_batched_total");
        if batched_total > 0.0 {
            break;
        }
    }
    assert!(batched_total > 0.0, "no two searches ever ran in one batch");
}

/// A server with an index just large enough for the loop to gather
/// searches into batches (4,100 x 1,024 floats), eight queries for it, and
/// the answer each gets alone.
fn gathering_index(seed: u64) -> (Server, Vec<String>, Vec<Value>) {
    const DIMS: usize = 1024;
    let server = Server::start();
    create_index(&server, "gather", DIMS, "l2");
    let mut rng = Rng(seed);
    let mut client = server.connect();
    for chunk in 0..41 {
        let items: Vec<(i64, Vec<f32>, String)> =
            (chunk * 100..chunk * 100 + 100).map(|id| (id, vector(&mut rng, DIMS), String::new())).collect();
        write_batch(&mut client, "gather", "insert", &items);
    }
    let queries: Vec<String> =
        (0..8).map(|n| serde_json::json!({"queryVector": vector(&mut rng, DIMS), "k": 3 + n}).to_string()).collect();
    let alone = queries.iter().map(|q| client.call("POST", "/api/v1/embeddings/gather/search", Some(q)).body).collect();
    (server, queries, alone)
}

fn gather_search(query: &str) -> Vec<u8> {
    crate::harness::request_bytes(
        "POST",
        "/api/v1/embeddings/gather/search",
        &[("X-Service-API-Key", crate::harness::KEY)],
        Some(query),
    )
}

/// On a large index the loop waits a moment for more searches when fewer
/// are waiting than ran last turn. Clients that pipeline a second search
/// while the loop waits still get their answers in order, each exactly the
/// answer it gets alone.
#[test]
fn searches_gathered_into_batches_keep_their_order() {
    let (server, queries, alone) = gathering_index(78);
    let mut clients: Vec<Client> = queries.iter().map(|_| server.connect()).collect();
    for round in 0..10 {
        // All eight at once, so that the next turn expects several...
        for (client, query) in clients.iter_mut().zip(&queries) {
            client.send(&gather_search(query));
        }
        for (n, client) in clients.iter_mut().enumerate() {
            assert_eq!(client.read_response().body, alone[n], "round {round}, query {n}");
        }
        // ...then two on one connection, the second sent a little later,
        // while the loop may be waiting for others.
        let (first, second) = (round % 8, (round + 3) % 8);
        clients[0].send(&gather_search(&queries[first]));
        std::thread::sleep(std::time::Duration::from_micros(200 * round as u64));
        clients[0].send(&gather_search(&queries[second]));
        assert_eq!(clients[0].read_response().body, alone[first], "round {round}, first");
        assert_eq!(clients[0].read_response().body, alone[second], "round {round}, second");
    }
    assert!(server.metric("quiver_search_gathers_total") > 0.0, "the loop never waited for a batch");
    assert!(server.metric("quiver_searches_batched_total") > 0.0, "no two searches ever ran in one batch");
}

/// Clients answered in a batch that search again while the loop waits for
/// them join the next batch, although the loop looked at their connections,
/// still empty, at the start of that turn.
#[test]
fn clients_back_while_the_loop_waits_join_the_batch() {
    let (server, queries, alone) = gathering_index(79);
    let mut clients: Vec<Client> = queries.iter().map(|_| server.connect()).collect();
    let batched = || server.metric("quiver_searches_batched_total");
    let mut joined = 0;
    for round in 0..10 {
        let before = batched();
        // All eight at once; the first sends its next search at once too, so
        // that it is waiting when the batch is answered and the loop waits
        // for the other seven, which ask again only once answered.
        for (client, query) in clients.iter_mut().zip(&queries) {
            client.send(&gather_search(query));
        }
        let next = (round + 1) % 8;
        clients[0].send(&gather_search(&queries[next]));
        for (n, client) in clients.iter_mut().enumerate() {
            assert_eq!(client.read_response().body, alone[n], "round {round}, query {n}");
        }
        for (client, query) in clients.iter_mut().zip(&queries).skip(1) {
            client.send(&gather_search(query));
        }
        assert_eq!(clients[0].read_response().body, alone[next], "round {round}, next");
        for (n, client) in clients.iter_mut().enumerate().skip(1) {
            assert_eq!(client.read_response().body, alone[n], "round {round}, query {n} again");
        }
        // Two batches of eight: none of the seven was put off to a batch of its own.
        if batched() - before == 16.0 {
            joined += 1;
        }
    }
    assert!(joined >= 3, "the clients that came back while the loop waited joined its batch in {joined} of 10 rounds");
}

/// A turn with a write not yet synced opens no gather window: a search
/// parked before the write has already run (the write runs it first), none
/// could join (reads wait for the sync), and the sync and every answer of
/// the turn would wait for nothing. Driven through `App` as the loop
/// drives it, each search from a client not answered before.
#[test]
fn a_turn_with_a_write_awaiting_its_sync_waits_for_no_search() {
    use quiver::api::{App, Caller, Gate, Handled, Seat};
    use quiver::http::{Framing, Head, Method};

    let dir = tempfile::tempdir().unwrap();
    let mut app = crate::harness::app_in(dir.path());
    let handle = |app: &mut App, method: Method, path: &str, body: &str| {
        let head = Head {
            method,
            path: path.to_owned(),
            query: String::new(),
            http10: false,
            keep_alive: true,
            expect_continue: false,
            api_key: crate::harness::KEY.as_bytes().to_vec(),
            api_key_header: quiver::http::head::SERVICE_KEY_HEADER,
            framing: Framing::None,
        };
        let target = app.admit(&head).unwrap();
        let (mut gate, mut seat) = (Gate::default(), Seat::default());
        let caller = Caller { conn: 0, gate: &mut gate, seat: &mut seat, now: std::time::Instant::now() };
        app.handle(&target, &head, &mut body.as_bytes().to_vec(), caller, &mut Vec::new())
    };
    // An index large enough for the loop to gather searches (4,100 x 1,024).
    handle(&mut app, Method::Put, "/api/v1/indexes/gather/create", r#"{"dimensions":1024,"metric":"l2"}"#);
    let row = vec!["1"; 1024].join(",");
    let items: Vec<String> = (0..4100).map(|id| format!(r#"{{"id":{id},"data":[{row}]}}"#)).collect();
    let insert = format!(r#"{{"embeddings":[{}]}}"#, items.join(","));
    assert_eq!(handle(&mut app, Method::Put, "/api/v1/embeddings/gather/insert", &insert), Handled::Mutated(200));
    app.commit().unwrap();
    app.end_turn();
    let search = format!(r#"{{"queryVector":[{row}],"k":3}}"#);
    let park = |app: &mut App| {
        let handled = handle(app, Method::Post, "/api/v1/embeddings/gather/search", &search);
        assert_eq!(handled, Handled::Parked);
    };
    // A turn of two searches; the next turn, with one, expects the other.
    park(&mut app);
    park(&mut app);
    app.run_parked();
    app.end_turn();
    park(&mut app);
    assert!(app.gather_window().is_some(), "a search alone on a large index waits for the one expected");
    app.run_parked();
    app.end_turn();
    // A search, then a write in the same turn: nothing to wait for.
    park(&mut app);
    let upsert = format!(r#"{{"embeddings":[{{"id":1,"data":[{row}]}}]}}"#);
    assert_eq!(handle(&mut app, Method::Put, "/api/v1/embeddings/gather/upsert", &upsert), Handled::Mutated(200));
    assert_eq!(app.gather_window(), None, "the turn's write awaits its sync: no search can join");
    app.commit().unwrap();
}
